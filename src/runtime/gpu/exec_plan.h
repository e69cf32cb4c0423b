/* The fused execution plan: which path every partition group takes on the GPU, and how a generated kernel's
 * pointers bind to tensors. Built by the compile driver (src/compile/fused_plan.c, evt_exec_plan_build);
 * changed at run time only by the demotions and the in-step A/B below (src/runtime/gpu/exec_plan.c).
 *
 * Built from an (optimized) graph: evt_lower_partition (the partitioner with the lowering's rules, as
 * `evtc compile --fuse-rules=lower`: a GEMM group only takes members its kernel spec can hold; no
 * partition cache), evt_lower_plan, then per group:
 *   ROW / POINTWISE lowered groups whose binding checks pass run as a generated row kernel
 *     (src/codegen/emit_rows.c, ABI kernels/evt_row_launch.h): in_node[k] = the graph node read as nucleus input
 *     k, ptr_node[i] = the graph node read / written by spec node i (loads: the memory source the lowering
 *     resolved through views; stores: the member, or the view of a sum the lowering bound). Checks: every
 *     such node exists, its dtype equals the spec's memory dtype (stores are in the spec's dtypes, sums f32),
 *     its element count equals evt_rspec_node_elems (M×N, N or M), N ≤ 32768 (register-resident rows) unless the spec has no row sums (the long-row kernel).
 *   GEMM+EVT lowered groups whose binding checks pass run as a generated CUTLASS kernel (src/codegen/emit_cutlass.c,
 *     ABI kernels/evt_launch.h, launched by src/runtime/gpu/gemm_launch.c): a_node / b_node = the graph nodes
 *     holding A and B in the spec's layout, d_node = D's tensor or -1 (D is a tile nobody reads: it goes to
 *     the plan's scratch buffer, scratch_bytes), ptr_node[i] = visitor node i's tensor. Checks: 1 ≤ M, N, K
 *     < 2^31; A, B in the spec's operand dtype with M·K and K·N elements; D in d_dtype with M·N; each
 *     visitor tensor in its node's dtype with M·N (aux), N (row broadcast / row sum) or M (column broadcast
 *     / column sum) elements; 16-byte alignment: every row of A, B (K or M / N elements), of D and of each
 *     aux tensor (N elements), and each vector, is a multiple of 16 bytes (base pointers are 256-byte
 *     aligned in the runtime's arena; gemm_launch.c checks them again at launch).
 *     Batched GEMMs (spec.batched, a bmm nucleus; m, n, k per batch, l x l_outer batches placed by the lowered
 *     leading dims and inner / outer batch strides, copied into the launch by evt_lower_launch_batch):
 *     dtypes as above; every tensor holds every element the launch reaches (evt_lower_batched_check: A, B,
 *     D, each visitor tensor through its strides); leading dims and batch strides are 16-byte multiples;
 *     every store (D, aux store, per-batch or all-batch sum) covers exactly its tensor; a sum shared by
 *     every batch only with one launch level (l_outer 1); a scratch D is packed (l_outer·l·m·n elements).
 *   CONV+EVT lowered groups (src/codegen/lower_conv.c: fprop, stride-1 dgrad, wgrad over NHWC) run as their
 *     generated CUTLASS implicit-GEMM kernel (src/codegen/emit_cutlass_conv.c), launched like a GEMM's (gemm_launch.c):
 *     m, n, k = the geometry's GEMM view (the launcher refuses any other), a_node / b_node = the operands as the
 *     geometry reads them (fprop x, w; dgrad dy, w; wgrad dy, x), each exactly its NHWC / OHWC tensor in the spec's
 *     operand dtype with 16-byte channel rows; D and the visitor tensors as an unbatched GEMM's over the [m, n]
 *     tile (the NHWC output). Never cuBLAS, the unfused pair, a tuned config or the in-step A/B (GEMM-only).
 *   Both kinds: a load (and A, B) never reads a member of its own group (members are not materialized
 *     before the kernel), and every member read outside the group or a graph output is written by a store
 *     of the spec (D included).
 *   GEMM+EVT groups with a plain epilogue (evt_exec_plain_blas) run as one cuBLAS call (blas) unless
 *     tuning measured their kernel faster; with an epilogue that tuning measured faster unfused, cuBLAS(Lt)
 *     into T + a generated row kernel (unf); with an epilogue and too few output tiles for a long K, that
 *     pair by default (evt_exec_split_k_starved).
 *   everything else runs node by node through the fallback library: groups that did not lower (reason of
 *     the lowering), groups failing a check above, groups whose kernel failed to compile or load
 *     (evt_exec_plan_demote), and GEMM / conv groups whose launcher refused (evt_exec_plan_demote_group).
 * Execution order: `sources` (partition group -1 nodes other than inputs/params: views of sources,
 * constants, rand) in id order, then groups in group order (a topological order of the contracted graph),
 * a fallback group's members in id order. Members of a fused group that no one outside reads are never
 * written (not materialized). Pure host code; no GPU. */
#ifndef EVT_RUNTIME_GPU_EXEC_PLAN_H
#define EVT_RUNTIME_GPU_EXEC_PLAN_H

#include <stdio.h>

#include "codegen/lower.h"
#include "evt_row_launch.h"
#include "partition/partition.h"

typedef struct evt_group_exec {
  int group;
  evt_lower_kind kind;
  int fused;              /* 1: the generated kernel kernels[kernel] runs this group */
  int kernel;             /* index into evt_exec_plan.kname, or -1 */
  char why[400];          /* fallback: the reason (lowering, check, compile failure) */
  int64_t m, n, k;                         /* k: GEMM only */
  int in_node[4];                          /* ROW: nucleus inputs, -1 unused (spmm: rowptr, col, val, x) */
  int a_node, b_node, d_node;              /* GEMM: A, B, D's tensor (-1: D goes to the scratch buffer) */
  int ptr_node[EVT_ROW_LAUNCH_MAX_PTRS];   /* per spec / visitor node with memory, else -1 */
  int *members, nmembers;                  /* graph nodes in id order */
  /* GEMM: the tuning record (src/tune/tune.h; evt_tune_apply_lowered at build): FUSED → the spec was
   * given the tuned config and these launch-time scheduler values; UNFUSED → the group falls back (why). */
  int blas;     /* GEMM, fused: 1 = the group is one cuBLAS call (plain epilogue; evt_exec_plain_blas), kernel -1 */
  /* GEMM, fused, unf = 1: the measured unfused pair. cuBLAS (cuBLASLt adding the
   * bias node unf_bias when >= 0) writes T = the accumulator (+ bias) rounded to the operand dtype, M x N in
   * the plan's scratch at t_offset; then the row kernel `kernel` (spec urs[group]) applies the rest of the
   * epilogue: rptr[i] = the graph node row-spec node i reads or writes, EVT_EXEC_PTR_T for T, -1 none. */
  int unf, unf_bias;
  int rptr[EVT_ROW_LAUNCH_MAX_PTRS];
  int tuned;                               /* evt_tune_choice */
  int swizzle, raster;
  char tune_desc[240];                     /* evt_tune_describe's line ("not tuned (default config ...)") */
  /* 1: the other implementation of this GEMM group (fused kernel <-> measured unfused pair) is bound too, in
   * evt_exec_plan.alt[group]: the program times its whole run both ways at the first run and keeps the faster
   * (fusion_ab in src/runtime/gpu/program.c); evt_exec_swap_alt exchanges the two */
  int ab;
  double rec_fused_ms, rec_unfused_ms;     /* the tuning record's isolated times (ms; 0: no record) */
} evt_group_exec;

typedef struct evt_exec_plan {
  evt_part_plan part;
  evt_lower_result low;
  int ngroups;
  evt_group_exec *groups;
  int *sources, nsources;
  int nkernels;             /* distinct generated kernels of fused groups */
  char (*kname)[40];
  const evt_rspec **kspec;  /* row / pointwise kernel k: its spec (owned by low), NULL for a GEMM kernel */
  const evt_kspec **gspec;  /* GEMM+EVT kernel k: its spec (owned by low), NULL for a row kernel */
  int64_t scratch_bytes;    /* device bytes for D tiles nobody reads (largest such D) and T (at t_offset) */
  int64_t t_offset;         /* where an unfused GEMM group's T starts in the scratch (256-aligned) */
  evt_rspec *urs;           /* per group: the row spec of an unf group's epilogue (owned) */
  evt_group_exec *alt;      /* per group: with groups[gi].ab, the other implementation (members shared) */
  int nab;                  /* groups with ab */
  int arch, ptx;            /* the GPU target its kernels are lowered and compiled for (evt_compile_target) */
  unsigned lower_flags;     /* EVT_LOWER_* its groups are lowered with (evt_lower_flags: evt_options.tf32) */
} evt_exec_plan;

/* Does x run as a CUTLASS kernel's launch (GEMM+EVT or CONV+EVT: a_node, b_node, d_node, ptr_node), when fused and
 * neither cuBLAS nor the unfused pair (both GEMM-only)? */
static inline int evt_group_exec_cutlass(const evt_group_exec *x) {
  return x->kind == EVT_LK_GEMM_EVT || x->kind == EVT_LK_CONV_EVT;
}

#define EVT_EXEC_PTR_T (-2) /* evt_group_exec.rptr: the unfused GEMM's T */
#define EVT_EXEC_PTR_RNG (-3) /* node id asked of evt_node_ptr_fn for a GEMM rand node's pointer: the run's RNG step */

/* The node whose memory node v shares while its group runs fused (a leaving reshape of a value the kernel
 * stores: evt_lowered.alias_view), or -1. */
int evt_exec_alias(const evt_exec_plan *p, int v);
/* Exchanges group gi's implementation with its alternative (gi must have ab). */
void evt_exec_swap_alt(evt_exec_plan *p, int gi);
/* Kernel k failed to compile or load: every group using it falls back, with `why` (a group with an alternative
 * implementation whose kernel is not k switches to that instead; an alternative using k is dropped). */
void evt_exec_plan_demote(evt_exec_plan *p, int k, const char *why);
/* Group gi alone falls back (its launcher refused the problem), with `why`. */
void evt_exec_plan_demote_group(evt_exec_plan *p, int gi, const char *why);
void evt_exec_plan_free(evt_exec_plan *p);
/* Groups per path: *fused, *fallback. */
void evt_exec_plan_counts(const evt_exec_plan *p, int *fused, int *fallback);
/* One line per group: "group 3 row evt_rowkernel_... fused [m x n]", "group 5 gemm+evt evt_kernel_... fused
 * [m x n x k]", "group 0 conv+evt evt_kernel_... fused [m x n x k] conv fprop n 4 h 8 ... out 8x8" or "group 4
 * unfused fallback, 3 nodes: reason" (a conv+evt group refused at binding or demoted: "group 0 conv+evt fallback
 * (%conv), 5 nodes: reason"). */
void evt_exec_plan_print(const evt_graph *g, const evt_exec_plan *p, FILE *out);

#endif
