/* The fused execution plan of `evtc run --device cuda --fused` (src/runtime/exec_plan.c): which path
 * every partition group takes on the GPU, and how a generated kernel's pointers bind to tensors.
 *
 * Built from an (optimized) graph: evt_lower_partition (the partitioner with the lowering's rules, as
 * `evtc compile --fuse-rules=lower`: a GEMM group only takes members its kernel spec can hold; no
 * partition cache), evt_lower_plan, then per group:
 *   ROW / POINTWISE lowered groups whose binding checks pass run as a generated row kernel
 *     (src/evt/emit_rows.c, ABI kernels/evt_row_launch.h): in_node[k] = the graph node read as nucleus input
 *     k, ptr_node[i] = the graph node read / written by spec node i (loads: the memory source the lowering
 *     resolved through views; stores: the member, or the view of a sum the lowering bound). Checks: every
 *     such node exists, its dtype equals the spec's memory dtype (stores are in the spec's dtypes, sums f32),
 *     its element count equals evt_rspec_node_elems (M×N, N or M), N ≤ 32768 (register-resident rows) unless the spec has no row sums (the long-row kernel).
 *   GEMM+EVT lowered groups whose binding checks pass run as a generated CUTLASS kernel (src/evt/emit_cutlass.c,
 *     ABI kernels/evt_launch.h, launched by src/runtime/gemm_launch.c): a_node / b_node = the graph nodes
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
 *   Both kinds: a load (and A, B) never reads a member of its own group (members are not materialized
 *     before the kernel), and every member read outside the group or a graph output is written by a store
 *     of the spec (D included).
 *   GEMM+EVT groups with a plain epilogue (evt_exec_plain_blas, below) run as one cuBLAS call (blas) unless
 *     tuning measured their kernel faster; with an epilogue that tuning measured faster unfused, optionally
 *     cuBLAS(Lt) into T + a generated row kernel (unf; evt_exec_unfused_epilogue); with an epilogue and too
 *     few output tiles for a long K, that pair by default (evt_exec_split_k_starved).
 *   everything else runs node by node through the fallback library: groups that did not lower (reason of
 *     the lowering), groups failing a check above, groups whose kernel failed to compile or load
 *     (evt_exec_plan_demote), and GEMM groups whose launcher refused (evt_exec_plan_demote_group).
 * Execution order: `sources` (partition group -1 nodes other than inputs/params: views of sources,
 * constants, rand) in id order, then groups in group order (a topological order of the contracted graph),
 * a fallback group's members in id order. Members of a fused group that no one outside reads are never
 * written (not materialized). Pure host code; no GPU. */
#ifndef EVT_RUNTIME_EXEC_PLAN_H
#define EVT_RUNTIME_EXEC_PLAN_H

#include <stdio.h>

#include "evt/lower.h"
#include "evt_row_launch.h"
#include "partition/partition.h"

typedef struct evt_group_exec {
  int group;
  evt_lower_kind kind;
  int fused;              /* 1: the generated kernel kernels[kernel] runs this group */
  int kernel;             /* index into evt_exec_plan.kname, or -1 */
  char why[400];          /* fallback: the reason (lowering, check, compile failure) */
  int64_t m, n, k;                         /* k: GEMM only */
  int in_node[3];                          /* ROW: nucleus inputs, -1 unused */
  int a_node, b_node, d_node;              /* GEMM: A, B, D's tensor (-1: D goes to the scratch buffer) */
  int ptr_node[EVT_ROW_LAUNCH_MAX_PTRS];   /* per spec / visitor node with memory, else -1 */
  int *members, nmembers;                  /* graph nodes in id order */
  /* GEMM: the tuning record (src/runtime/tune.h; evt_tune_apply_lowered at build): FUSED → the spec was
   * given the tuned config and these launch-time scheduler values; UNFUSED → the group falls back (why). */
  int blas;     /* GEMM, fused: 1 = the group is one cuBLAS call (plain epilogue; evt_exec_plain_blas), kernel -1 */
  /* GEMM, fused, unf = 1 (evt_exec_unfused_epilogue): the measured unfused pair. cuBLAS (cuBLASLt adding the
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
   * (evt_exec_fusion_ab, src/runtime/program.c); evt_exec_swap_alt exchanges the two */
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
} evt_exec_plan;

#define EVT_EXEC_PTR_T (-2) /* evt_group_exec.rptr: the unfused GEMM's T */
#define EVT_EXEC_PTR_RNG (-3) /* node id asked of evt_node_ptr_fn for a GEMM rand node's pointer: the run's RNG step */

/* The node whose memory node v shares while its group runs fused (a leaving reshape of a value the kernel
 * stores: evt_lowered.alias_view), or -1. */
int evt_exec_alias(const evt_exec_plan *p, int v);
/* Partitions, lowers and decides as above. EVT_OK, or the partitioner's error (message in g's error). */
evt_status evt_exec_plan_build(evt_graph *g, evt_exec_plan *p);
/* The binding checks of one lowered group (also used by build; ROW / POINTWISE and GEMM+EVT): fills
 * x->m/n/k, in_node, a/b/d_node, ptr_node; true if it can run as its generated kernel, else false with the
 * reason in x->why (naming the group and the tensor). */
bool evt_exec_bind(const evt_graph *g, const int *group, const evt_lowered *L, evt_group_exec *x);
/* A GEMM+EVT group whose epilogue is plain (the spec is D = acc: no visitor node but the accumulator, D
 * stored to a tensor) has nothing to fuse: it runs as one cuBLAS call (evt_fb_gemm_run: the layouts'
 * transposes become cuBLAS operand ops, no copies) unless a tuning record measured its CUTLASS kernel
 * faster (tuned == EVT_TUNE_FUSED: on the H200 the tuned 128x256 kernels beat cuBLAS on the paper MLP's
 * plain GEMMs, 1.53 vs 1.61 ms at 8192x4096x16384, bench/results/h200-2026-11-29/S10W2). Untuned, cuBLAS:
 * its kernel choice is as fast at the BERT shapes and its host overhead per call is far lower (BERT-large
 * batch 8, 700 launches a step: 42.7 ms/step with cuBLAS for the plain GEMMs, 73.7 with CUTLASS launchers
 * that built their TMA descriptors every launch; S10W1 / S10W3). EVT_PLAIN_GEMM=cutlass keeps CUTLASS
 * (tests and benchmarks of the generated kernels), =cublas forces cuBLAS. Two-level batches (l_outer > 1)
 * always keep CUTLASS. */
bool evt_exec_plain_blas(const evt_lowered *L, int tuned);
/* A GEMM group with an epilogue that a tuning record measured faster unfused (cuBLASLt, with its bias
 * epilogue when that variant won, into T, then the rest of the epilogue as one generated row kernel: the
 * tuner's evt_tune_unfused_rspec) runs that pair when the record measured it at least EVT_EXEC_UNFUSED_MIN_GAIN
 * faster than the best fused config (evt_exec_unfused_wanted), or always with EVT_UNFUSED_EPILOGUE=1; otherwise
 * the fastest fused config measured: the starting choice, which the in-step A/B below then confirms or changes.
 * Not for batched GEMMs, a D nobody reads, rows over 32768 elements, or a bias whose dtype is not T's. */
bool evt_exec_unfused_epilogue(void);
/* The margin: the tuner times each kernel alone, back to back, and there a fused kernel can read slower than
 * the same kernel inside the training step while the pair reads the same: the paper MLP's fc1 forward (bias +
 * GELU + aux) measured 1.71-1.72 ms fused against 1.62-1.64 for cuBLASLt + the row kernel in every tuner run of
 * session 19 (also with L2 flushed before each call, and with unit-variance operands), yet 1.47-1.53 ms fused
 * inside the step, and running the pair made the step 1.5-2.7% slower (S19W1: 42.13-42.29 vs 41.16-41.50 ms;
 * S19W3: 42.68 vs 41.94 with every UNFUSED record honoured; S11 likewise). Gains of 10% and more (XML-CNN's
 * 1024x512x3072 bias + epilogue: 40%) are larger than that error. */
#define EVT_EXEC_UNFUSED_MIN_GAIN 0.10
/* Whether a group with an UNFUSED record runs the pair: EVT_UNFUSED_EPILOGUE=1, or the record measured the pair
 * at least a fraction f faster than the best fused config: f = EVT_UNFUSED_MIN_GAIN (0 <= f <= 1; 1: never),
 * else EVT_EXEC_UNFUSED_MIN_GAIN. With the in-step A/B (below, on by default) this is only the starting choice. */
bool evt_exec_unfused_wanted(double fused_ms, double unfused_ms);
/* The in-step A/B of fusion (EVT_FUSION_AB): because isolated timings can mislead (the margin above), a GEMM
 * group whose tuning record measured the unfused pair faster (by any margin), or slower by less than
 * EVT_EXEC_UNFUSED_MIN_GAIN, gets both implementations bound (ab, alt); a device program times its whole run
 * with each (src/runtime/program.c) and keeps the faster.
 * EVT_FUSION_AB=0: off (the margin decides alone); =all: also every other GEMM+EVT group with an epilogue
 * the unfused pair can run (diagnosis and tests); unset or 1: records only. Not with EVT_UNFUSED_EPILOGUE=1. */
int evt_exec_fusion_ab_mode(void); /* 0 off, 1 records, 2 all */
/* Exchanges group gi's implementation with its alternative (gi must have ab). */
void evt_exec_swap_alt(evt_exec_plan *p, int gi);
/* A GEMM+EVT group with an epilogue whose output has at most a quarter as many tiles (of its config) as the
 * H200 has SMs while K is at least 32x its larger output dim runs the unfused pair above by default (no tuning
 * record needed; a FUSED record keeps the kernel): the generated mainloop has no split-K, so a handful of CTAs
 * would walk all of K (XML-CNN's input gradient 256 x 512 x 670208: 4 CTAs, 6.0 ms; S11W5), where cuBLAS splits
 * K. EVT_SPLIT_K_UNFUSED=0 turns the rule off. */
#define EVT_EXEC_SMS 132
/* The tile-scheduler swizzle of a GEMM+EVT group without a tuning record: $EVT_DEFAULT_SWIZZLE=2|4|8 (opt-in;
 * CUTLASS max_swizzle_size, tiles visited in groups for L2 reuse) when the output is at least 4096 x 4096 and
 * at least 8 tiles each way, else 0 (CUTLASS's default, no swizzle). Not the default: tuning records measured
 * swizzle 8 18-22% faster for the paper MLP's 8192 x 16384 x 4096 and 8192 x 4096 x 16384 GEMMs, but on
 * bert_large (paper size) it made one 24-launch GEMM 33% slower (3.80 -> 5.05 ms) and the others ~2%
 * (evt_cg 96.76 vs 95.45 ms/step; H200, S12W3): per-shape choices belong to the tuner. */
int evt_exec_default_swizzle(const evt_lowered *L, int64_t m, int64_t n);
int64_t evt_exec_output_tiles(const evt_lowered *L, int64_t m, int64_t n);
bool evt_exec_split_k_starved(const evt_lowered *L, int64_t m, int64_t n, int64_t k);
/* An untuned GEMM+EVT group over a long K (K >= 8192 and K >= max(M, N)), whose CUTLASS mainloop trails cuBLAS's
 * by ~15% there (8192^3: 1.64 vs 1.36 ms; cuBLASLt + a row kernel 1.47, tune-h200-w2.md): run the unfused pair.
 * Opt-in while unmeasured end to end: EVT_LONG_K_UNFUSED=1. */
bool evt_exec_long_k_unfused(const evt_lowered *L, int64_t m, int64_t n, int64_t k);
/* Kernel k failed to compile: every group using it falls back, with `why` (a group with an alternative
 * implementation whose kernel is not k switches to that instead; an alternative using k is dropped). */
void evt_exec_plan_demote(evt_exec_plan *p, int k, const char *why);
/* Group gi alone falls back (its launcher refused the problem), with `why`. */
void evt_exec_plan_demote_group(evt_exec_plan *p, int gi, const char *why);
void evt_exec_plan_free(evt_exec_plan *p);
/* Groups per path: *fused, *fallback. */
void evt_exec_plan_counts(const evt_exec_plan *p, int *fused, int *fallback);
/* One line per group: "group 3 row evt_rowkernel_... fused [m x n]", "group 5 gemm+evt evt_kernel_... fused
 * [m x n x k]" or "group 4 unfused fallback, 3 nodes: reason". */
void evt_exec_plan_print(const evt_graph *g, const evt_exec_plan *p, FILE *out);
/* CPU model of one fused step (what the GPU runs, in the same order): inputs / params already in values;
 * sources and fallback groups through the interpreter node by node, fused groups through their spec's CPU
 * reference (row: evt_rspec_reference; GEMM: evt_lower_gemm_reference, batched through the launch's strides;
 * both f32-or-better inside the group, rounding only at stores), reading and writing exactly the bound tensors (a scratch D in a host buffer);
 * members a kernel does not store are left empty. Checks the bindings without a GPU. */
evt_status evt_exec_plan_run_cpu(evt_graph *g, const evt_exec_plan *p, evt_tensor *values);

#endif
