/* Lowering: from the partitioner's groups to kernel specs (operator compiler, pipeline stage 5).
 *
 * Input: an optimized joint graph and its partition plan (src/partition/partition.h). Output: one
 * evt_lowered per group, in group order (a topological order of the contracted graph):
 *
 *   GEMM+EVT   a group whose nucleus is mm / addmm: an evt_kspec (src/codegen/kspec.h). Operand permutes that
 *              swap the two dims of a matrix (members fused as operand layouts, or views of sources) are
 *              absorbed as layouts NN / NT / TN. The epilogue visitor DAG is built from the other members:
 *              the accumulator; every external operand becomes a load chosen from its *strides* relative
 *              to the [M,N] tile (aux_load for a dense tile, row_bcast for an N-vector broadcast over rows,
 *              col_bcast for an M-vector broadcast over columns, scalar for a compile-time constant); every
 *              supported elementwise op a compute; every tile value that leaves the group a store (the
 *              latest one is D, the others aux_store); sum over the M dims a row_sum, over the N dims a
 *              col_sum. The finished spec must pass evt_kspec_check and evt_vtree_build (a side output
 *              outside D's tree is refused there, with its message).
 *   ROW        a group whose nucleus is softmax, softmax_backward, layer_norm or layer_norm_backward_input:
 *              an evt_rspec (src/codegen/rspec.h) over [M, N] = [rows, last dim]; its M x N inputs (x; dy, y;
 *              dy, x) are read once by the nucleus and reused as acc(IN0/IN1) by the epilogue; w / b are
 *              N-vectors. The epilogue is built with the same rules as a GEMM's, all outputs are aux stores.
              An spmm / spmm_t nucleus (CSR A, i64 / i32 indices, bf16 / f16 / f32 values and x; rows of at most
              EVT_ROW_MAX_N) is a row nucleus too: [M, N] is its output, rin its rowptr, col, val and dense x (all
              outside the group), acc(OUT) the gathered row; spmm_t reads A^T through perm (csr.h, docs/codegen.md
              "SpMM"). The runtime binds both; for spmm_t it builds A^T's CSR on the device every run
              (evt_fb_csr_transpose) before the kernel.
 *   POINTWISE  a nucleus-free group: an evt_rspec without nucleus over the largest tensor the group writes
 *              or reads ([M, N] = [rest, last dim]); sums over rows / within rows are row_sum / col_sum.
 *              Row kernels need no 16-byte alignment (they fall back to element accesses).
 *   GEMM+EVT, batched: a bmm nucleus: a batched evt_kspec over [batch..., M, N] (lower_bmm.c and
 *              docs/codegen.md "Batched GEMM"): operand layouts and leading dims from strides, loads per batch
 *              or shared by every batch, stores through member views (heads merge), per-batch or all-batch
 *              sums, batch dims collapsed into at most two strided levels (l per launch, l_outer launches).
 *   CONV+EVT   a group whose nucleus is conv2d with layout=nhwc (lower_conv.c, docs/codegen.md "Convolution"): an
 *              evt_kspec with conv geometry (kspec.h "Convolution kernel specs") whose tile is [N*P*Q, O], the NHWC
 *              output seen as a row-major matrix, so its epilogue is built exactly as a GEMM's (a bias is a
 *              row_bcast of an O-vector, a sum over N, P, Q a row_sum). a_node / b_node are x and w, m n k the GEMM
 *              view (N*P*Q, O, kh*kw*C). Likewise conv2d_backward_input with stride 1 (dgrad: dy and w, tile dx
 *              [N*H*W, C]) and the singleton conv2d_backward_weight (wgrad: dy and x, tile dw [O, kh*kw*C], D only). The runtime binds and launches them like unbatched GEMM+EVT
 *              kernels (runtime/gpu/exec_plan.h); never cuBLAS, the unfused pair or the tuner.
 *   UNFUSED    anything that cannot be expressed: a conv (nchw, grouped, dilated, f32, ...) nucleus, a library singleton
 *              (pool, embedding, sdpa, ...), or a group with a member its spec cannot hold. fp8 tensors
 *              (f8e4m3 / f8e5m2) lower in two places only: as a row / pointwise kernel's aux loads and the
 *              stores of casts to fp8, and as an mm's operands (both fp8, layout NT: K-major, f32 accumulator,
 *              sm_90a); any other fp8 use is refused by node. The
 *              reason names the group and the node ("group 3: %erf.118 (erf): no visitor compute for erf").
 *
 * Rules for one epilogue node (evt_lower_can_fuse answers them for one node, so the partitioner's rules
 * can ask later): dtype bf16 / f16 / f32 (integers and bools are refused); a tensor with memory in the
 * kernel needs 16-byte aligned rows (contiguous extent × element size % 16 == 0, which also covers M and N
 * multiples of 8 for 16-bit types); an operand must be a broadcast of the tile (strides, not just shapes,
 * decide: a transposed view of a tile is refused); a scalar must be a constant (scalar / full source);
 * row/col sums accumulate in f32, so the sum's tensor must be f32.
 *
 * Visitor names are by role and index (a0 b0 r0 c0 s0 ...), not by graph name, so equal epilogues of
 * different layers get equal specs, equal hashes and one compiled kernel.
 */
#ifndef EVT_LOWER_H
#define EVT_LOWER_H

#include "codegen/kspec.h"
#include "codegen/rspec.h"
#include "ir/ir.h"
#include "evt_launch.h"

struct evt_part_plan;
struct evt_part_options;
struct evt_pgraph;

typedef enum evt_lower_kind { EVT_LK_GEMM_EVT = 0, EVT_LK_ROW, EVT_LK_POINTWISE, EVT_LK_UNFUSED, EVT_LK_CONV_EVT, EVT_LK_COUNT } evt_lower_kind;
const char *evt_lower_kind_name(evt_lower_kind k);   /* "gemm+evt", "row", "pointwise", "unfused", "conv+evt" */


#define EVT_LOWER_MAX_ALIAS 8

typedef struct evt_lowered {
  int group;
  evt_lower_kind kind;
  int ok;                 /* 1: a complete kernel spec (spec for GEMM+EVT, rspec for ROW / POINTWISE) */
  int nucleus;            /* graph node or -1 */
  int bad_node;           /* node named by the reason, or -1 */
  char reason[320];       /* why not lowered ("" when ok) */
  /* GEMM+EVT only */
  evt_kspec spec;
  char kernel[40];        /* evt_kernel_<hash> (GEMM+EVT) or evt_rowkernel_<hash> (ROW / POINTWISE) */
  int64_t m, n, k;
  int a_node, b_node;     /* graph nodes holding A and B in memory (permutes resolved to their input) */
  int d_tensor;           /* graph node stored as D, or -1: D is a scratch tile nobody reads */
  int vtensor[EVT_KSPEC_MAX_NODES]; /* per visitor/row node with memory: the graph node it reads/writes; else -1 */
  /* Members that leave the group as a reshape / squeeze / unsqueeze (the same bytes) of another leaving member
   * the kernel stores: no store of their own; while the group runs fused they share their base's memory
   * (evt_exec_alias). Both kinds of kernel. */
  int nalias;
  int alias_view[EVT_LOWER_MAX_ALIAS], alias_base[EVT_LOWER_MAX_ALIAS];
  /* GEMM+EVT of a bmm nucleus (spec.batched): the launch's batch fields, same names and meaning as in
   * evt_launch_args (kernels/evt_launch.h); all 0 for an unbatched GEMM. evt_lower_launch_batch copies them.
   * m, n, k are per batch; a_node / b_node / d_tensor / vtensor are whole tensors (l_outer * l batches,
   * placed by these strides); a scratch D (d_tensor -1) is packed: l_outer * l * m * n elements. */
  int l, l_outer;
  int64_t lda, ldb, ldd, bs_a, bs_b, bs_d, os_a, os_b, os_d;
  int64_t ld_ptrs[EVT_KSPEC_MAX_NODES], bs_ptrs[EVT_KSPEC_MAX_NODES], os_ptrs[EVT_KSPEC_MAX_NODES];
  /* ROW / POINTWISE only (m, n: the [M, N] iteration space; kernel: evt_rowkernel_<hash>) */
  evt_rspec rspec;
  int rin[4];             /* graph nodes read as the nucleus inputs in[0..2] (x / dy, y / x, w, b), or -1; an spmm
                           * nucleus: rowptr, col, val, x (A's, also for spmm_t) */
} evt_lowered;

/* Is L's kernel a CUTLASS one (evt_emit_cutlass of L->spec: GEMM+EVT or CONV+EVT), not a row kernel? */
static inline int evt_lowered_cutlass(const evt_lowered *L) { return L->kind == EVT_LK_GEMM_EVT || L->kind == EVT_LK_CONV_EVT; }

typedef struct evt_lower_result {
  int n;                  /* = plan->ngroups */
  evt_lowered *k;
  int count[EVT_LK_COUNT];/* groups per kind */
  int lowered;            /* groups with ok = 1 */
} evt_lower_result;

/* Lowers every group of `plan` (built on g). Never fails on an unsupported group (it is listed with its
 * reason); returns EVT_ERR_INVALID only for a plan that does not belong to g. */
evt_status evt_lower_plan(const evt_graph *g, const struct evt_part_plan *plan, evt_lower_result *out);
/* What the lowering may do beyond its default rules (evt_options fields): EVT_LOWER_TF32 (evt_options.tf32): an mm /
 * addmm / bmm of two f32 operands lowers to a TF32 GEMM (kspec.h "TF32 operands"); without it such a group is
 * unfused ("operands f32 x f32"). */
#define EVT_LOWER_TF32 1u
unsigned evt_lower_flags(const evt_options *o);
/* evt_lower_plan with flags (EVT_LOWER_*). */
evt_status evt_lower_plan_flags(const evt_graph *g, const struct evt_part_plan *plan, unsigned flags, evt_lower_result *out);
void evt_lower_free(evt_lower_result *r);
/* The mainloop config an unbatched GEMM+EVT group with epilogue s over M x N x K runs without a tune record
 * (the lowering's choice; the tuner's first candidate, so a record's default_ms is this kernel's time). */
evt_tile_config evt_lower_untuned_config(const evt_kspec *s, int64_t m, int64_t n, int64_t k);
/* Retargets every lowered group of r (built on g with partition `group`) to `arch` (0 / 90: sm_90a, else 80, 86,
 * 89): GEMM+EVT specs get the target's untuned config (evt_kspec_retarget) or, when the target cannot hold their
 * epilogue, become unfused groups whose reason names the member (a rand / dropout: no Sm80 Philox visitor); row and
 * pointwise specs record the target (their kernels then leave out programmatic dependent launches). Kernel names
 * follow. */
void evt_lower_retarget(const evt_graph *g, const int *group, evt_lower_result *r, int arch);
/* The stored member whose memory leaving member v of L shares (alias_view / alias_base), or -1. */
int evt_lowered_alias_base(const evt_lowered *L, int v);
/* Copies L's batch fields (l, l_outer, ld*, bs*, os*) into a's; the runtime calls it for every GEMM+EVT
 * launch after filling m/n/k/a/b/d/ptrs (a no-op apart from zeroing them for an unbatched GEMM). */
void evt_lower_launch_batch(const evt_lowered *L, evt_launch_args *a);
/* For the runtime's binding of a lowered batched GEMM: does every tensor (A, B, D, each visitor node's)
 * hold every element the launch reaches through L's leading dims and batch / outer strides? false with the
 * tensor named in why. The lowering itself refuses a bmm group that fails it. */
bool evt_lower_batched_check(const evt_graph *g, const evt_lowered *L, char *why, size_t whylen);
/* CPU reference of a lowered GEMM+EVT group on whole tensors, laid out as the launch puts them: a, b the
 * memory of a_node / b_node, mem[i] the memory of vtensor[i] (loads read, stores write; sums from 0), d the
 * memory of D (d_tensor, or an L*M*N scratch). Unbatched: evt_kspec_reference. Batched: per batch through
 * the lowered leading dims, batch and outer strides (0 = packed, as the launcher reads them). A CONV+EVT group:
 * a, b its operands' NHWC memory (a_node, b_node), the tile from evt_conv_accumulate, then evt_kspec_reference_acc. */
void evt_lower_gemm_reference(const evt_lowered *L, const double *a, const double *b, double *const *mem, double *d,
                              uint64_t rng_step);

/* CPU reference of a lowered ROW / POINTWISE group on whole tensors: rin[k] the memory of L->rin[k] (NULL where -1),
 * mem[i] as for evt_lower_gemm_reference. An spmm nucleus reads its CSR operand from rin (spmm_t: A^T's CSR built from
 * A's with evt_csr_transpose, as the runtime would); EVT_ERR_INVALID for an index out of range (nothing written). */
evt_status evt_lower_rows_reference(const evt_graph *g, const evt_lowered *L, const double *const rin[4], double *const *mem,
                                    uint64_t rng_step);

/* Can node `node` be part of the epilogue of GEMM nucleus `nucleus` (mm/addmm/bmm; a conv2d, whose NHWC output is the
 * tile [N*P*Q, O])? Judges the node alone:
 * its op, dtype, and each operand (a tile value, or a load chosen from its strides and alignment);
 * operands that are themselves tile-shaped count as tile values (fused or aux-loaded). false with the
 * reason in why (may be NULL). */
bool evt_lower_can_fuse(const evt_graph *g, int nucleus, int node, char *why, size_t whylen);

/* The partitioner's epilogue-implementability hook (evt_part_compat_fn) with the lowering's rules: the
 * partitioner's own shape rule (evt_part_compat_evt), and for an mm/addmm nucleus that can lower (16-bit, fp8 or
 * TF32 operands, 16-byte rows: evt_lower_gemm_dims_ok with the operands' layouts through their transposes) or a
 * conv2d that can lower (evt_lower_conv_geometry) evt_lower_can_fuse (a view is judged as its producer). Other nuclei: the
 * shape rule, and no sum over the leading (M) dims in a row nucleus's group when its rows are longer than 32768
 * (the long-row kernel has no Σ-over-M row sums). */
bool evt_lower_compat(const struct evt_pgraph *g, int nucleus, int member);
/* The same for a lowering with EVT_LOWER_TF32: an f32 x f32 GEMM can lower too. */
bool evt_lower_compat_tf32(const struct evt_pgraph *g, int nucleus, int member);
/* The hook of a lowering with these flags: evt_lower_compat or evt_lower_compat_tf32. */
bool (*evt_lower_compat_for(unsigned flags))(const struct evt_pgraph *, int, int);
/* evt_part_plan_build with evt_lower_compat as the hook: GEMM groups then only take members their kernel
 * spec can hold (evtc compile --fuse-rules=lower). */
evt_status evt_lower_partition(evt_graph *eg, const struct evt_part_options *opt, double lambda, struct evt_part_plan *plan);
/* The same with the hook of a lowering with flags (evt_lower_compat_for). */
evt_status evt_lower_partition_flags(evt_graph *eg, const struct evt_part_options *opt, double lambda, unsigned flags,
                                     struct evt_part_plan *plan);

/* Every f32 tensor of g becomes dt (bf16/f16): source types and cast targets, then every type is
 * re-inferred. The examples are f32 and GEMM kernel specs take 16-bit operands (evtc compile --dtype). */
evt_status evt_lower_retype(evt_graph *g, evt_dtype dt);

/* One line per group: "group 3 gemm+evt evt_kernel_...: NT bf16->bf16, 7 visitor nodes" or the reason. */
void evt_lower_print(const evt_graph *g, const evt_lower_result *r, FILE *out);

#endif
