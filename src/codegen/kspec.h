/* Kernel specs for GEMM + epilogue-visitor-tree kernels (operator compiler, pipeline stage 5).
 *
 * A kernel spec is everything the CUTLASS emitter needs and nothing else; its hash names the kernel
 * (`evt_kernel_<hash>`) and, together with the compiler flags, keys the JIT cache. It describes
 *
 *   acc[M,N] = A[M,K] · B[K,N]          (bf16 or f16 operands, f32 accumulation)
 *   D[M,N]   = epilogue(acc, ...)       (row-major, bf16 / f16 / f32)
 *
 * where the epilogue is a visitor DAG: nodes in topological order (inputs have smaller ids). Loads:
 * the accumulator, a per-column N-vector (CUTLASS Sm90RowBroadcast), a per-row M-vector (Sm90ColBroadcast),
 * a scalar constant, a rank-0 tensor read at run time (scalar_load: Sm90ScalarBroadcast's pointer), a full
 * M×N aux tensor. Computes: elementwise f32 (comparisons give 0/1, where selects). Stores pass their input through:
 * an aux M×N tensor, Σ over M into an N-vector (Sm90RowReduction, e.g. a bias gradient), Σ over N into
 * an M-vector (Sm90ColReduction). One node is D. M, N, K are run-time arguments of the generated kernel;
 * they are not part of the spec. Every M×N/N/M tensor is dense and row-major; M and N must be multiples
 * of 8 (16-byte TMA alignment) — the launcher's can_implement rejects others.
 *
 * Operand layouts, in row-major terms: first letter A, second B; N = stored as in the formula
 * (A as M×K, B as K×N), T = stored transposed (A as K×M, B as N×K).
 *
 * FP8 operands (sm_90a only; the fp8 pass's GEMMs): A and B f8e4m3 or f8e5m2 (e4m3 x e4m3, e4m3 x e5m2, e5m2 x
 * e4m3: b_mixed), f32 accumulation (CUTLASS's FP8 mainloop, which promotes wgmma partial sums into f32 registers),
 * layout NT only: Hopper's 8-bit wgmma reads both operands K-major (A row-major M×K, B stored N×K; CUTLASS's "TN"),
 * K a multiple of 16 (16-byte TMA rows) and tile_k 128 (one 128-byte swizzle row per K tile). The epilogue is as
 * for 16-bit operands (the fp8 recipe's rescale: a scalar_load of 1/(sA·sB) times acc; D bf16 / f16 / f32).
 *
 * TF32 operands (sm_90a only; evt_options.tf32): A and B f32, read by Hopper's TF32 wgmma (CUTLASS's collective builder
 * maps float operands to tfloat32_t: each operand's mantissa is cut to 10 bits in the tensor core, f32 accumulation),
 * layout NT only (TF32 wgmma reads both operands K-major from shared memory; CUTLASS sends the other float layouts
 * to its register-sourced mainloop, whose NN and TN kernels gave wrong results on an H100), 16-byte TMA rows
 * (lower_gemm.c's leading-dim rule) and tile_k 32 (one 128-byte swizzle row). The epilogue and D are as for 16-bit
 * operands.
 *
 * Batch mode (`batched` = 1, a bmm nucleus): the kernel computes L independent GEMMs + epilogues over
 * [L, M, N], L a run-time argument like M, N, K. A, B and D are per batch; each node with memory is per
 * batch (its own M×N tile / N-vector / M-vector in every batch, summed per batch for row/col sums) or,
 * with `shared` = 1, one tensor for every batch (a bias broadcast to all heads; a row/col sum accumulated
 * over all batches too). An aux store cannot be shared (batches would race). Where the batches lie in
 * memory (batch strides, leading dims, an outer batch level) is a launch argument (kernels/evt_launch.h),
 * not part of the spec; the layout letters hold per batch. `shared` is ignored (must be 0) unbatched.
 *
 * Lowering (tree.c): stores whose value is otherwise unused are threaded into the chain of their input
 * (users of x read store(x) instead, which passes x through), so the DAG has the single sink D; nodes
 * that still have several users are folded into one Sm90TopologicalVisitor spanning from the first
 * shared node to the common post-dominator of all shared nodes; everything else is a Sm90EVT tree.
 */
#ifndef EVT_KSPEC_H
#define EVT_KSPEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "evt.h"

#define EVT_KSPEC_MAX_NODES 32

/* Visitor node kinds. X(enum, text name, arity, class) with class L = load, C = compute, S = store. */
#define EVT_VOP_LIST(X)                                                                       \
  X(ACC, "acc", 0, 'L')                 /* the f32 accumulator */                                \
  X(ROW_BCAST, "row_bcast", 0, 'L')     /* N-vector broadcast over rows (per-column bias) */     \
  X(COL_BCAST, "col_bcast", 0, 'L')     /* M-vector broadcast over columns */                    \
  X(SCALAR, "scalar", 0, 'L')           /* compile-time constant `value` */                      \
  X(AUX_LOAD, "aux_load", 0, 'L')       /* M×N tensor */                                         \
  X(ADD, "add", 2, 'C')                                                                         \
  X(SUB, "sub", 2, 'C')                                                                         \
  X(MUL, "mul", 2, 'C')                                                                         \
  X(DIV, "div", 2, 'C')                                                                         \
  X(RELU, "relu", 1, 'C')                                                                       \
  X(SIGMOID, "sigmoid", 1, 'C')                                                                 \
  X(GELU_ERF, "gelu_erf", 1, 'C')       /* x·Φ(x) */                                             \
  X(GELU_TANH, "gelu_tanh", 1, 'C')     /* tanh approximation */                                 \
  X(GELU_ERF_GRAD, "gelu_erf_grad", 2, 'C')   /* (dy, x) → dy·gelu_erf'(x) */                    \
  X(GELU_TANH_GRAD, "gelu_tanh_grad", 2, 'C') /* (dy, x) → dy·gelu_tanh'(x) */                   \
  X(RELU_GRAD, "relu_grad", 2, 'C')     /* (dy, x) → x > 0 ? dy : 0 */                           \
  X(NEG, "neg", 1, 'C')                                                                         \
  X(EXP, "exp", 1, 'C')                                                                         \
  X(LOG, "log", 1, 'C')                                                                         \
  X(ERF, "erf", 1, 'C')                                                                         \
  X(TANH, "tanh", 1, 'C')                                                                       \
  X(SQRT, "sqrt", 1, 'C')                                                                       \
  X(RSQRT, "rsqrt", 1, 'C')                                                                     \
  X(RECIPROCAL, "reciprocal", 1, 'C')                                                           \
  X(ABS, "abs", 1, 'C')                                                                         \
  X(SIGN, "sign", 1, 'C')               /* -1, 0, 1; NaN stays NaN */                            \
  X(ROUND_BF16, "round_bf16", 1, 'C')   /* x rounded to bf16 (RNE), kept as f32: a cast mid-tree */ \
  X(ROUND_F16, "round_f16", 1, 'C')     /* x rounded to f16 (RNE), kept as f32 */                \
  X(MAXIMUM, "maximum", 2, 'C')         /* NaN if either is NaN */                               \
  X(MINIMUM, "minimum", 2, 'C')                                                                 \
  X(EQ, "eq", 2, 'C')                   /* comparisons give 1 or 0 (bool values are 0/1 floats) */ \
  X(NE, "ne", 2, 'C')                                                                           \
  X(LT, "lt", 2, 'C')                                                                           \
  X(LE, "le", 2, 'C')                                                                           \
  X(GT, "gt", 2, 'C')                                                                           \
  X(GE, "ge", 2, 'C')                                                                           \
  X(WHERE, "where", 3, 'C')             /* (c, a, b) → c != 0 ? a : b */                         \
  X(KEEP, "keep", 2, 'C')               /* (a, b) → a; b is visited for its stores (tree.c) */   \
  X(SCALAR_LOAD, "scalar_load", 0, 'L') /* a rank-0 tensor read from memory at run time */       \
  X(ONE_HOT, "one_hot", 0, 'L')         /* M-vector of class indices t (i64/i32): j == t[i] */   \
  X(RAND, "rand", 0, 'L')               /* Philox uniform of element i·N + j (seed, offset) */   \
  X(AUX_STORE, "aux_store", 1, 'S')     /* stores its input (rounded to dtype) to an M×N tensor */ \
  X(ROW_SUM, "row_sum", 1, 'S')         /* Σ over M → N-vector (f32, atomic) */                  \
  X(COL_SUM, "col_sum", 1, 'S')         /* Σ over N → M-vector (f32, atomic) */                  \
  X(COL_MAX, "col_max", 1, 'S')         /* max over N → M-vector (GEMM: f32, atomic max; NaN wins) */

typedef enum evt_vop {
#define X(e, s, a, c) EVT_V_##e,
  EVT_VOP_LIST(X)
#undef X
  EVT_V_COUNT
} evt_vop;

typedef enum evt_gemm_layout { EVT_LAYOUT_NN = 0, EVT_LAYOUT_NT, EVT_LAYOUT_TN } evt_gemm_layout;
typedef enum evt_schedule { EVT_SCHED_COOPERATIVE = 0, EVT_SCHED_PINGPONG } evt_schedule;

typedef struct evt_vnode {
  evt_vop op;
  int in[3];        /* input node ids (smaller than this node's id), -1 if unused */
  evt_dtype dtype;  /* element type in memory of loads/stores; EVT_F32 for computes */
  double value;     /* EVT_V_SCALAR */
  uint64_t seed, offset; /* EVT_V_RAND: the rand op's Philox key and counter offset (dtype: its rounding); launch
                          * arguments (evt_kspec_launch_rng), not in the text, hash or source */
  int shared;       /* batched specs: 1 = one tensor for every batch (see batch mode above) */
  char name[24];    /* argument name in the generated launcher and in messages */
} evt_vnode;

/* Row / column sum (Sm90RowReduction / Sm90ColReduction) strategy: ATOMIC adds each CTA's partial sums
 * into the f32 output with atomics (output zeroed by Gemm::initialize; order, hence the last bits, vary
 * from run to run); WORKSPACE writes the partials to a CUTLASS workspace and the last CTA of each
 * column (row) tile adds them in a fixed order (deterministic; no atomics). */
typedef enum evt_reduce_strategy { EVT_RED_ATOMIC = 0, EVT_RED_WORKSPACE } evt_reduce_strategy;

/* The mainloop configuration of a GEMM kernel (part of the spec, its canonical text and its hash).
 * The zero of the trailing fields is the default, so `{128, 128, 64, 1, 1, EVT_SCHED_COOPERATIVE}`
 * (EVT_TILE_CONFIG_DEFAULT) is the base configuration (the lowering widens tile_n to 256 when N >= 256). Legal combinations: evt_tile_config_check. */
typedef struct evt_tile_config {
  int tile_m, tile_n, tile_k;
  int cluster_m, cluster_n;
  evt_schedule schedule;
  int stages;                     /* mainloop pipeline stages; 0 = as many as fit (StageCountAutoCarveout) */
  evt_reduce_strategy reduction;  /* row/col sums only; must stay ATOMIC for an epilogue without sums */
  int epi_n;                      /* epilogue subtile N (32, 64, 128); 0 = CUTLASS's EpilogueTileAuto (32) */
  int stream_k;                   /* 1: CUTLASS's stream-K tile scheduler (cooperative, unbatched, atomic sums):
                                   * CTAs share the K loop of a tile when there are fewer tiles than SMs, the
                                   * last one reduces the partial accumulators and runs the epilogue once.
                                   * Proposed for few tiles over a long K: by the untuned config (evt_lower_untuned_config)
                                   * and the tuner (evt_tune_candidates) */
  int epi_stages;                 /* shared-memory buffers of D and of each aux store (the epilogue's StagesD: TMA
                                   * stores in flight per subtile); 0 = CUTLASS's builder, min(subtiles, 2) */
} evt_tile_config;

#define EVT_TILE_CONFIG_DEFAULT ((evt_tile_config){128, 128, 64, 1, 1, EVT_SCHED_COOPERATIVE, 0, EVT_RED_ATOMIC, 0})

/* Convolution kernel specs (conv = EVT_CONV_FPROP; src/codegen/kspec_conv.c, docs/codegen.md "Convolution"): the
 * nucleus is CUTLASS's Sm90 implicit GEMM over NHWC tensors, x [N,H,W,C] and w [O,kh,kw,C] (groups 1, dilation 1,
 * cross-correlation, zero padding pad_h / pad_w on both sides), whose accumulator tile is
 *   acc[M = N*P*Q, N = O]   (row-major over N, P, Q: the NHWC output y [N,P,Q,O]),  K = kh*kw*C,
 * so the epilogue is a GEMM's (a bias is a row broadcast of an O-vector, batch-norm statistics are row sums over
 * N*P*Q). The geometry is compiled into the kernel, so it is part of the spec, its text and its hash; the launcher
 * checks that the launch's m, n, k agree. Layout NT (x as the M x K im2col matrix, w stored N x K); operands bf16 /
 * f16; tile_k (16, 32 or 64) divides C: one TMA im2col box of channels per filter tap, wgmma steps of 16 over K.
 * CUTLASS 4.2's Sm90 conv kernels are not persistent: one consumer warp group per CTA, so a conv spec's schedule is
 * EVT_SCHED_PINGPONG's rules (a warp group owns the tile; the emitter names KernelImplicitTmaWarpSpecializedSm90),
 * cluster 1x1, no stream-K, atomic sums.
 * EVT_CONV_DGRAD (conv2d_backward_input, stride 1): the same geometry (x's dims n, h, w, c; y's p, q), operands dy
 * [N,P,Q,O] and w, tile acc[M = N*H*W, N = C] (the NHWC dx), K = kh*kw*O: tile_k divides O, C a multiple of 8. A
 * strided dgrad is refused: CUTLASS runs it as stride_h*stride_w phases (its L mode), not one [N*H*W, C] tile.
 * EVT_CONV_WGRAD (conv2d_backward_weight): operands dy and x, tile acc[M = O, N = kh*kw*C] (dw [O,kh,kw,C]), K =
 * N*P*Q; tile_n (16, 32 or 64) divides C. CUTLASS's wgrad epilogue sees N as the filter's modes (C, kw, kh), so the
 * epilogue stores D only: acc and computes, no node with memory. */
typedef enum evt_conv_kind { EVT_CONV_NONE = 0, EVT_CONV_FPROP, EVT_CONV_DGRAD, EVT_CONV_WGRAD } evt_conv_kind;
typedef struct evt_conv_geom {
  evt_conv_kind kind;
  int n, h, w, c, o, kh, kw;
  int stride_h, stride_w, pad_h, pad_w;
  int p, q;                           /* output height and width: (h + 2 pad_h - kh) / stride_h + 1, likewise q */
} evt_conv_geom;

typedef struct evt_kspec {
  evt_gemm_layout layout;
  evt_dtype ab_dtype;  /* EVT_BF16 or EVT_F16; sm_90a also EVT_F8E4M3 / EVT_F8E5M2 ("FP8 operands") or EVT_F32 ("TF32") */
  int b_mixed;         /* fp8 only: 1 = B has its own dtype b_dtype (f8e4m3 x f8e5m2 either way); 0 = B is ab_dtype */
  evt_dtype b_dtype;
  evt_dtype d_dtype;   /* EVT_BF16, EVT_F16 or EVT_F32 */
  evt_tile_config cfg;
  int nnodes;
  evt_vnode nodes[EVT_KSPEC_MAX_NODES];
  int d_node;          /* node whose value is D; -1 until set */
  int batched;         /* 1: batch mode (L GEMMs over [L, M, N]); 0: one GEMM */
  int arch;            /* GPU target (arch.c): 0 = sm_90a (CUTLASS 3.x Sm90 collectives, emit_cutlass.c); 80, 86, 89 =
                        * sm_80 / sm_86 / sm_89 (CUTLASS 2.x GEMM with Sm80 visitor nodes, emit_cutlass_sm80.c) */
  evt_conv_geom conv;  /* kind EVT_CONV_NONE: a GEMM; else a convolution nucleus (above) */
} evt_kspec;

/* ---- src/codegen/kspec.c: building, checking, naming ------------------------------------------------- */
void evt_kspec_init(evt_kspec *s, evt_gemm_layout layout, evt_dtype ab, evt_dtype d, evt_tile_config cfg);
/* Appends a node; returns its id or -1 (too many nodes, bad input id, wrong arity). Loads and stores
 * take `dtype` and `name`; computes ignore them (pass EVT_F32, NULL). */
int evt_kspec_add(evt_kspec *s, evt_vop op, int in0, int in1, evt_dtype dtype, const char *name);
int evt_kspec_add3(evt_kspec *s, evt_vop op, int in0, int in1, int in2, evt_dtype dtype, const char *name);
int evt_kspec_scalar(evt_kspec *s, double value);
/* The K tile of one 128-byte K-major row of s's operands: 128 for fp8, 32 for f32 (TF32), else 64. */
int evt_kspec_tile_k(const evt_kspec *s);
/* B's dtype (ab_dtype unless b_mixed). */
evt_dtype evt_kspec_b_dtype(const evt_kspec *s);
/* Checks the whole spec (including evt_tile_config_check); EVT_OK or a status with a message in err
 * naming the node. */
evt_status evt_kspec_check(const evt_kspec *s, char *err, size_t errlen);
/* Is `c` a legal mainloop for spec s (its dtypes and whether its epilogue has sums)? EVT_OK, or
 * EVT_ERR_UNSUPPORTED with the reason in err ("kernel spec: config 128x256x64 c1x1 pingpong: ..."). Rules
 * (CUTLASS 4.2 Sm90 TMA warp-specialized kernels, 128 threads per consumer warp group, f32 accumulators):
 *   tile_m, tile_n in {64, 128, 256}; tile_k in {32, 64, 128} (fp8 operands: 128; f32: 32); cluster_m, cluster_n in
 *     {1, 2, 4}, product <= 4;
 *   cooperative: two consumer warp groups split the tile's M, so tile_m % 128 == 0, and each holds
 *     tile_m*tile_n/256 accumulators per thread <= 128 (tile_m*tile_n <= 128*256);
 *   ping-pong: each consumer warp group owns a whole tile, tile_m*tile_n/128 <= 128 accumulators per thread
 *     (64x128, 64x256, 128x128, 128x64, 64x64);
 *   stages 0 or 2..8, and stages x (tile_m + tile_n) x tile_k x operand bytes <= 227 KiB - 32 KiB (the
 *     epilogue's shared memory; CUTLASS's static_assert is the final word, a candidate that still fails to
 *     compile is dropped by the tuner);
 *   reduction WORKSPACE only when the epilogue has a row_sum / col_sum;
 *   epi_n 0 or 32, 64, 128 dividing tile_n (the epilogue subtile is min(tile_m, 128) x epi_n cooperative,
 *     64 x epi_n ping-pong, as CUTLASS's auto choice with N = 32);
 *   epi_stages 0 or 2..8, at most the number of epilogue subtiles of the tile (more buffers than subtiles
 *     would never be used). */
evt_status evt_tile_config_check(const evt_kspec *s, const evt_tile_config *c, char *err, size_t errlen);
/* Short label, e.g. "128x256x64 c2x1 coop", "128x128x64 c1x1 pingpong s4 red=workspace e64 d4" (non-default
 * stages / reduction / epilogue subtile / epilogue store stages only). Returns out. */
char *evt_tile_config_label(const evt_tile_config *c, char *out, size_t len);
/* Parses what evt_tile_config_label writes; EVT_OK or EVT_ERR_INVALID. */
evt_status evt_tile_config_parse(const char *text, evt_tile_config *c);
/* Has the epilogue a row_sum, col_sum or col_max node (an output initialize() resets)? */
int evt_kspec_has_sums(const evt_kspec *s);
/* Hash of the spec without its mainloop configuration (the key of tuning results: every config of one
 * epilogue, layout and dtypes shares it). */
uint64_t evt_kspec_epilogue_hash(const evt_kspec *s);
/* A scalar as C++ source for generated host and device code: "%.17g", or -__builtin_huge_val() / __builtin_nan("")
 * for infinities and NaN (printf's "inf" is no C++ literal). Returns out. */
const char *evt_cxx_double(double v, char out[32]);
const char *evt_vop_name(evt_vop op);
int evt_vop_arity(evt_vop op);
char evt_vop_class(evt_vop op);          /* 'L', 'C' or 'S' */
int evt_vop_has_memory(evt_vop op);      /* node reads or writes a tensor given at launch */
/* Canonical one-line-per-node text of the spec (what the hash covers). Returns bytes written (like
 * snprintf). */
int evt_kspec_text(const evt_kspec *s, char *buf, size_t len);
/* The epilogue subtile width the emitter uses (0: CUTLASS's EpilogueTileAuto, 128 x 32 for a cooperative
 * 128 x 256 tile): cfg.epi_n when set; else, for a cooperative schedule with automatic stages, 16 when the
 * epilogue's TMA buffers at 32 would leave the mainloop fewer than 3 stages and 16 leaves it more (aux loads keep
 * 4 subtiles in flight); at 3 stages 32 stays, which measured faster (bench/RESULTS.md). */
int evt_kspec_epilogue_n(const evt_kspec *s);
uint64_t evt_kspec_hash(const evt_kspec *s);
void evt_kspec_kernel_name(const evt_kspec *s, char out[40]);     /* "evt_kernel_<16 hex>" */
/* Orders the operands of s's commutative nodes (mul, eq, ne; add when one side is a read value, not a product an
 * fma could take) by op, then a structural key of their subtrees, the smaller first (equal: the smaller id), so that
 * epilogues equal up to such operand order have one text, hash and kernel. Results are unchanged bit for bit.
 * The lowering calls it before naming a spec. */
void evt_kspec_canonicalize(evt_kspec *s);
/* Copies the rand nodes' seeds and offsets of s into a->rng (entry v for rand node v; kernels/evt_launch.h). They
 * are launch arguments, not part of the kernel (its text, name and source), so a kernel shared by groups whose
 * dropouts differ only in seed draws each group's own mask: every launch passes the spec its group was lowered to. */
struct evt_launch_args;
void evt_kspec_launch_rng(const evt_kspec *s, struct evt_launch_args *a);
/* The rule on n nodes with ops op[] and inputs in[] (changed in place; inputs before users): leaf[v] is node v's
 * own key (op, dtype, value, name: not its inputs), key[v] receives its subtree's (src/codegen/canon.c). */
void evt_vop_canonical_order(int n, const evt_vop *op, int (*in)[3], const uint64_t *leaf, uint64_t *key);
/* A node's own key: op, dtype, a scalar's value, a memory node's name, and `extra` (a shared flag, an acc's
 * nucleus value); never a rand's seed or offset (launch arguments). */
uint64_t evt_vop_leaf_key(evt_vop op, evt_dtype dtype, double value, const char *name, int extra);

/* The SMs of the Hopper GPUs evt targets (H100 SXM, H200): one wave of output tiles. */
#define EVT_HOPPER_SMS 132

/* ---- src/codegen/kspec_conv.c: convolution specs ---------------------------------------------------------- */
/* The rules of a conv spec (above) beyond a GEMM spec's: geometry consistent (p, q from h, w, kh, kw, stride, pad),
 * the reduced channels (fprop C, dgrad O) a multiple of 16 and of tile_k, the output's (fprop O, dgrad C) of 8, dgrad
 * stride 1; wgrad: C a multiple of 16 and of tile_n, O of 8, no epilogue node with memory; sm_90a, layout NT, bf16 / f16 operands, unbatched, cluster 1x1, the
 * ping-pong schedule value, no stream-K, atomic sums. EVT_OK for a GEMM spec. */
evt_status evt_kspec_conv_check(const evt_kspec *s, char *err, size_t errlen);
/* The GEMM view of a conv geometry: fprop M = n*p*q, N = o, K = kh*kw*c; dgrad M = n*h*w, N = c, K = kh*kw*o; wgrad
 * M = o, N = kh*kw*c, K = n*p*q. */
void evt_conv_gemm_shape(const evt_conv_geom *g, int64_t *m, int64_t *n, int64_t *k);
/* The GEMM view's accumulator tile of a convolution in double, acc [M x N] row-major (evt_conv_gemm_shape), from
 * its operands as NHWC / OHWC memory: fprop a = x [N,H,W,C], b = w [O,kh,kw,C] -> y [N,P,Q,O]; dgrad a = dy
 * [N,P,Q,O], b = w -> dx [N,H,W,C]; wgrad a = dy, b = x -> dw [O,kh,kw,C]. Zero padding; any stride. */
void evt_conv_accumulate(const evt_conv_geom *g, const double *a, const double *b, double *acc);
/* "fprop", "dgrad", "wgrad" ("none" for a GEMM). */
const char *evt_conv_kind_name(evt_conv_kind k);
/* The largest K tile (64, 32, 16) dividing c, or 0 when c is not a multiple of 16 (wgrad: its N tile). */
int evt_conv_tile_k(int c);
/* Output extent of one spatial dim: (in + 2 pad - k) / stride + 1 (floor), or 0 when the kernel does not fit. */
int evt_conv_out_extent(int in, int k, int stride, int pad);
/* Canonical text of the geometry ("conv fprop n 8 h 56 ...", "conv dgrad ...", "conv wgrad ..."), appended to the spec's text when kind is set. Returns
 * bytes written like snprintf. */
int evt_conv_text(const evt_conv_geom *g, char *buf, size_t len);

/* ---- src/codegen/arch.c: GPU targets -------------------------------------------------------------------- */
/* A spec's or options' arch: 0 or 90 = sm_90a (Hopper), 80 / 86 / 89 = Ampere / Ada. */
bool evt_arch_valid(int arch);
bool evt_arch_sm8x(int arch);
/* "sm_90a", "sm_80", ... */
const char *evt_arch_name(int arch);
/* Largest shared memory one CTA may use on an sm_8x target, in bytes (sm_80: 163 KiB, sm_86 / sm_89: 99 KiB). */
long evt_arch_smem_bytes(int arch);
/* The Sm80 rules of a mainloop config (evt_tile_config_check calls it for sm_8x specs). CUTLASS 2.x multistage
 * tensor-op GEMM, 16x8x16 bf16/f16 instructions, warp tiles min(64, tile/2) per dim (at most 8 warps):
 *   tile_m, tile_n in {64, 128, 256}, tile_m*tile_n <= 256*128; tile_k in {32, 64}; stages 0 (= 3) or 3..6, and
 *   stages x (tile_m + tile_n) x tile_k x 2 bytes within evt_arch_smem_bytes; cluster 1x1, the cooperative value of
 *   `schedule`, no stream-K, no epilogue subtile or store stages (Hopper-only), atomic sums. */
evt_status evt_tile_config_check_sm80(const evt_kspec *s, const evt_tile_config *c, char *err, size_t errlen);
/* The mainloop config an sm_8x kernel of an M x N x K problem runs untuned: 128x128x32 (128x64x32 for N <= 64),
 * 4 stages on sm_80, 3 on sm_86 / sm_89. */
evt_tile_config evt_arch_untuned_config(int arch, int64_t n);
/* Makes s a spec for `arch` (its config: evt_arch_untuned_config for sm_8x, unchanged for sm_90a). EVT_OK, or
 * EVT_ERR_UNSUPPORTED with the reason when a node has no Sm80 visitor (rand: the Philox visitor is Sm90's);
 * *bad (may be NULL) gets that node's id. */
evt_status evt_kspec_retarget(evt_kspec *s, int arch, int64_t n, int *bad, char *err, size_t errlen);
/* CUTLASS 2.x warp tile of a config: min(64, tile / 2) per dim. */
void evt_arch_warp_shape(const evt_tile_config *c, int *wm, int *wn);

/* ---- src/codegen/tree.c: DAG → tree ------------------------------------------------------------------ */
typedef struct evt_vtree {
  evt_kspec spec;                    /* the spec with side stores threaded (same ids, rewired inputs) */
  int nusers[EVT_KSPEC_MAX_NODES];   /* users after threading */
  int live[EVT_KSPEC_MAX_NODES];     /* reaches D */
  int topo_root;                     /* node that roots the topological visitor, -1 if a plain tree */
  int in_region[EVT_KSPEC_MAX_NODES];/* node is a bare op inside the topological visitor */
} evt_vtree;
evt_status evt_vtree_build(const evt_kspec *s, evt_vtree *t, char *err, size_t errlen);

/* ---- src/codegen/emit_cutlass.c ---------------------------------------------------------------------- */
/* CUDA C++ source of the kernel and its launcher `extern "C" int evt_kernel_<hash>(const
 * evt_launch_args *)` (kernels/evt_launch.h). Returns a malloc'd string, or NULL with err set. */
char *evt_emit_cutlass(const evt_kspec *s, char *err, size_t errlen);
/* ---- src/codegen/emit_cutlass_sm80.c: the same for an sm_8x spec (evt_emit_cutlass dispatches on s->arch) */
char *evt_emit_cutlass_sm80(const evt_kspec *s, char *err, size_t errlen);
/* How many of s's row/column sums and col_max nodes the emitter gives to CUTLASS's reduction nodes under s->cfg (the others run on
 * the project's RowSum, kernels/evt_visitor_nodes.h). CUTLASS's keep their sums in local memory in a ping-pong
 * kernel, so a spec with any stays cooperative untuned (evt_lower_untuned_config). */
int evt_emit_cutlass_sums(const evt_kspec *s);

/* ---- src/codegen/vref.c: CPU reference --------------------------------------------------------------- */
/* Evaluates the spec on the CPU in double precision, rounding each stored value to its dtype as the
 * kernel does. a: M×K (or K×M for layout T) values, b likewise; tensors[i] holds node i's memory
 * (loads read it, stores write it; row/col sums are accumulated from 0, col_max from -inf); d: M×N output. All as double. */
void evt_kspec_reference(const evt_kspec *s, int64_t m, int64_t n, int64_t k, const double *a, const double *b,
                         double *const *tensors, double *d);
/* Batched reference (s->batched; an unbatched spec is the l = 1 case): every per-batch array holds l
 * packed batches one after another (a: l × M×K or l × K×M, b likewise, d: l × M×N, per-batch node
 * tensors l × (M×N | N | M)); shared node tensors (nodes[v].shared) hold one batch's worth, and shared
 * row/col sums accumulate over every batch. */
void evt_kspec_reference_batched(const evt_kspec *s, int64_t l, int64_t m, int64_t n, int64_t k, const double *a,
                                 const double *b, double *const *tensors, double *d);
/* The same in a run with RNG step rng_step (rand nodes: evt_vop_rand of element i·N + j; the two above: step 0). */
void evt_kspec_reference_batched_at(const evt_kspec *s, int64_t l, int64_t m, int64_t n, int64_t k, const double *a,
                                    const double *b, double *const *tensors, double *d, uint64_t rng_step);
/* The epilogue alone, unbatched: acc holds the M×N accumulator (double; each value is rounded to f32 as the
 * kernel's accumulator is), tensors and d as evt_kspec_reference. A convolution's CPU reference
 * (evt_lower_gemm_reference of a CONV+EVT group) computes its tile with evt_conv_accumulate, then this. */
void evt_kspec_reference_acc(const evt_kspec *s, int64_t m, int64_t n, const double *acc, double *const *tensors, double *d,
                             uint64_t rng_step);
/* Elements of node v's tensor for one batch of an m×n problem: evt_vop_elems of its op (m*n aux, n row
 * bcast / row sum, m col bcast / col sum / col_max / one_hot, 1 scalar_load, 0 for nodes without memory). */
int64_t evt_vnode_numel(const evt_kspec *s, int v, int64_t m, int64_t n);
/* Elementwise semantics of a compute node (shared by the reference and tests); evt_vop_apply3 also takes
 * the third operand of where. Comparisons give 1.0 / 0.0 (false when an operand is NaN, except ne). */
double evt_vop_apply(evt_vop op, double x, double y);
double evt_vop_apply3(evt_vop op, double x, double y, double z);
/* Rules shared by kspec and rspec when a node is added: its inputs are exactly its arity's earlier nodes
 * (unused ones -1), and the dtype it carries (memory dtype for loads/stores, f32 for computes and sums). */
bool evt_vop_inputs_ok(evt_vop op, const int in[3], int id);
evt_dtype evt_vop_node_dtype(evt_vop op, evt_dtype dtype);
/* May node `op` keep `dtype` in memory? gemm = 1: the GEMM epilogue (bf16/f16/f32 loads and stores, u8 bool
 * aux tiles; row/col sums f32 because CTAs add into them with atomics), 0: row kernels (also bool loads/stores
 * as u8 0/1; sums and col_max rounded to bf16/f16 at their single store; i64 / i32 aux loads / stores, column
 * broadcasts and scalar loads, whose values ride in doubles: exact; f8e4m3 / f8e5m2 aux loads / stores: exact
 * loads, saturating round-to-nearest-even stores as src/ir/fp8.c). one_hot reads i64 or i32 class indices. */
int evt_vop_storage_ok(evt_vop op, evt_dtype dtype, int gemm);
/* Element (i, j) of an M×N epilogue through one node other than EVT_V_ACC, for the CPU references of
 * kspec and rspec: broadcasts, aux/scalar loads and one_hot read tensors[v], aux stores (rounded to dtype)
 * and row/column sums / col_max write it (col_max starts at -inf), computes apply evt_vop_apply3 to the
 * inputs' values in[0..2]. Returns the node's value. */
double evt_vop_visit(evt_vop op, evt_dtype dtype, double value, double *const *tensors, int v, int64_t i,
                     int64_t j, int64_t n, const double in[3]);
/* EVT_V_RAND's value for element e = i·N + j in a run with RNG step `step`: evt_philox_uniform(seed, offset,
 * step, e) rounded to dtype. */
double evt_vop_rand(uint64_t seed, uint64_t offset, uint64_t step, evt_dtype dtype, int64_t e);
/* Number of elements of a node's memory for an M×N problem (0 for nodes without memory). */
int64_t evt_vop_elems(evt_vop op, int64_t m, int64_t n);

#endif
