/* Row-kernel specs: reduce-apply row groups and nucleus-free elementwise groups (operator compiler,
 * pipeline stage 5). Emitted by src/codegen/emit_rows.c into CUDA C++ that includes kernels/evt_rows.cuh;
 * launched through kernels/evt_row_launch.h.
 *
 * Iteration space: an [M, N] tensor, one row (length N) per CTA row-group, the row held in registers.
 *
 * (a) A reduce-apply group has a row *nucleus* that reduces each row and then produces per-element values:
 *   softmax        in {x}:       y = exp(x − max) / Σ exp(x − max)
 *   softmax_bwd    in {dy, y}:   dx = y · (dy − Σ dy·y)
 *   layernorm      in {x, w?, b?}: mean, rstd = 1/sqrt(var + eps) (biased var); x̂ = (x − mean)·rstd;
 *                  y = x̂ (· w) (+ b); optionally stores mean and rstd (f32 M-vectors)
 *   layernorm_bwd  in {dy, x, w?}: mean/rstd recomputed from x (same eps); g = dy (· w);
 *                  dx = rstd · (g − mean_N(g) − x̂ · mean_N(g·x̂))
 *   spmm           CSR A [M, K] (rowptr[M+1], col[nnz], val[nnz]; indices i64 / i32) and a dense x [K, N]:
 *                  out row i = Σ_{q = rowptr[i]}^{rowptr[i+1]−1} val[q] · x[col[q], :], accumulated in f32 in q
 *                  order (has_perm: val[perm[q]] — spmm_t as A^T's CSR, colptr / rowidx / perm, csr.h).
 *                  Index checks: a bad rowptr entry or col / perm index sets the launch's error flag and
 *                  contributes nothing (the row's other entries still count).
 * followed by an elementwise epilogue DAG per element. (b) A nucleus-free group has only the DAG.
 *
 * Epilogue nodes reuse the visitor kinds of kspec.h (evt_vop) with the same meaning per element (i, j):
 *   acc        a nucleus value, chosen by `sel`: OUT (y / dx), XHAT (layer norms), IN0, IN1 (the nucleus's
 *              first / second M×N input as loaded, e.g. dy and x of layernorm_bwd). Not in nucleus-free specs.
 *   aux_load   M×N tensor; row_bcast: N-vector (indexed by j); col_bcast: M-vector (indexed by i);
 *   scalar     constant `value` (f32); scalar_load: a rank-0 tensor read from memory (another kernel's result);
 *   one_hot    an M-vector of integer class indices t (i64 / i32): 1 where j == t[i], else 0;
 *   rand       Philox uniform of element e = i·N + j with the rand op's seed / offset (kernels/philox.h,
 *              bit-identical to the interpreter), rounded to dtype: dropout masks drawn in the kernel;
 *   computes: f32, semantics of evt_vop_apply3 (vref.c); bool values are 0/1 (comparisons give them);
 *   aux_store  stores its input rounded to dtype (M×N; bool: u8 0/1, nonzero → 1) and passes the value on;
 *              aux_load of a bool tensor reads u8 0/1;
 *   row_sum    Σ over M (over rows) → N-vector, e.g. dγ/dβ (the name follows CUTLASS's Sm90RowReduction);
 *   col_sum    Σ over N (within a row) → M-vector; col_max: max over N (NaN wins) → M-vector.
 *              Sums and maxima accumulate in f32 and are rounded to their dtype (bf16 / f16 / f32) at the one
 *              store (row_sum: by the finalize kernel; col_sum / col_max: by the row's owner).
 * Stores are the outputs: a spec needs at least one (or layer-norm statistics). There is no "D".
 * M and N are run-time arguments; N is limited by the register-resident row (see emit_rows.c).
 * Storage dtypes bf16 / f16 / f32 (and bool as u8, one_hot indices i64 / i32); all arithmetic in f32.
 */
#ifndef EVT_RSPEC_H
#define EVT_RSPEC_H

#include <stddef.h>
#include <stdint.h>

#include "codegen/kspec.h"

#define EVT_RSPEC_MAX_NODES 32

typedef enum evt_row_nucleus {
  EVT_ROWN_NONE = 0,
  EVT_ROWN_SOFTMAX,
  EVT_ROWN_SOFTMAX_BWD,
  EVT_ROWN_LAYERNORM,
  EVT_ROWN_LAYERNORM_BWD,
  EVT_ROWN_SPMM,
  EVT_ROWN_COUNT
} evt_row_nucleus;

typedef enum evt_row_value { EVT_RV_OUT = 0, EVT_RV_XHAT, EVT_RV_IN0, EVT_RV_IN1, EVT_RV_COUNT } evt_row_value;

typedef struct evt_rnode {
  evt_vop op;
  int in[3];          /* input node ids (smaller than this node's id), -1 if unused */
  evt_dtype dtype;    /* memory dtype of loads / stores; EVT_F32 for the rest */
  double value;       /* EVT_V_SCALAR */
  uint64_t seed, offset; /* EVT_V_RAND (see kspec.h): launch arguments (evt_rspec_launch_rng) */
  evt_row_value sel;  /* EVT_V_ACC: which nucleus value */
  char name[24];      /* argument name in the generated source and in messages */
} evt_rnode;

typedef struct evt_rspec {
  evt_row_nucleus nucleus;
  evt_dtype in_dtype;  /* dtype of the nucleus's M×N inputs (the first one's when in1_mixed) */
  int in1_mixed;       /* two-input nuclei: the second M×N input has its own dtype in1_dtype (a 16-bit dy and an
                        * f32 x: a widening cast fused into the load, partition rules CONVERT) */
  evt_dtype in1_dtype;
  evt_dtype w_dtype;   /* dtype of layer-norm w / b */
  int has_w, has_b;    /* layer norm: weight (both), bias (forward only) */
  int store_stats;     /* layernorm: write mean / rstd */
  double eps;          /* layer norms */
  evt_dtype val_dtype; /* spmm: dtype of val (bf16 / f16 / f32; x's is in_dtype) */
  evt_dtype idx_dtype; /* spmm: dtype of rowptr / col / perm (i64 / i32) */
  int has_perm;        /* spmm: values gathered through perm (A^T from A's CSR, csr.h) */
  int nnodes;
  evt_rnode nodes[EVT_RSPEC_MAX_NODES];
  int arch;            /* GPU target: 0 = sm_90a; 80, 86, 89 = sm_8x (no programmatic dependent launches) */
} evt_rspec;

/* ---- src/codegen/rspec.c: building, checking, naming, CPU reference (named examples: examples.h) ------- */
void evt_rspec_init(evt_rspec *s, evt_row_nucleus nucleus, evt_dtype in_dtype);
/* Appends a node (same rules as evt_kspec_add); returns its id or -1. */
int evt_rspec_add(evt_rspec *s, evt_vop op, int in0, int in1, evt_dtype dtype, const char *name);
int evt_rspec_add3(evt_rspec *s, evt_vop op, int in0, int in1, int in2, evt_dtype dtype, const char *name);
int evt_rspec_acc(evt_rspec *s, evt_row_value sel);  /* an acc node reading nucleus value `sel` */
int evt_rspec_scalar(evt_rspec *s, double value);
int evt_rspec_rand(evt_rspec *s, uint64_t seed, uint64_t offset, evt_dtype dtype); /* a rand node */
evt_status evt_rspec_check(const evt_rspec *s, char *err, size_t errlen);
const char *evt_row_nucleus_name(evt_row_nucleus n);
const char *evt_row_value_name(evt_row_value v);
int evt_row_nucleus_ninputs(const evt_rspec *s); /* number of in[] pointers the launcher reads */
/* Does the generated kernel take rows longer than EVT_ROW_MAX_N (kernels/evt_row_config.h)? 2: the column-block
 * kernel (nucleus-free, Σ-over-M row sums, no per-row reduction), 1: the long-row kernel (no row sums), 0: no. */
int evt_rspec_long_rows(const evt_rspec *s);
evt_dtype evt_rspec_in_dtype(const evt_rspec *s, int k); /* dtype of M×N input k (0 or 1) */
int evt_rspec_text(const evt_rspec *s, char *buf, size_t len);
uint64_t evt_rspec_hash(const evt_rspec *s);
void evt_rspec_kernel_name(const evt_rspec *s, char out[40]); /* "evt_rowkernel_<16 hex>" */
void evt_rspec_canonicalize(evt_rspec *s); /* evt_kspec_canonicalize's rule (an acc's key has its nucleus value) */
struct evt_row_launch_args;
/* evt_kspec_launch_rng for a row kernel's launch (kernels/evt_row_launch.h) */
void evt_rspec_launch_rng(const evt_rspec *s, struct evt_row_launch_args *a);
/* Number of elements of node i's memory (0 if none) for an M×N problem. */
int64_t evt_rspec_node_elems(const evt_rspec *s, int i, int64_t m, int64_t n);

/* CPU reference in double: in[k] are the nucleus inputs (as values already in their dtype), tensors[i]
 * node i's memory (loads read it; stores write it, rounded to dtype; sums are computed from 0 and rounded
 * to f32), mean/rstd (M-vectors, may be NULL) receive the layer-norm statistics when the spec stores them. */
void evt_rspec_reference(const evt_rspec *s, int64_t m, int64_t n, const double *const in[3], double *const *tensors,
                         double *mean, double *rstd);
/* The CSR operand of an spmm spec's reference: A [m, k] whose entries are col / val [nnz] positions rowptr[0] ..
 * rowptr[m] - 1 (the interpreter's rule: rowptr in [0, nnz], never decreasing), x [k, n]; perm [nnz] only with
 * has_perm. Indices as exact doubles (the interpreter's tensors). */
typedef struct evt_rspec_csr {
  int64_t k, nnz;
  const double *rowptr, *col, *perm, *val, *x;
} evt_rspec_csr;
/* evt_rspec_reference_at for an spmm spec. EVT_ERR_INVALID (and nothing written) for an index out of range
 * (rowptr not monotone within [0, nnz], a referenced col outside [0, k) or perm outside [0, nnz)). */
evt_status evt_rspec_reference_csr(const evt_rspec *s, int64_t m, int64_t n, const evt_rspec_csr *a, double *const *tensors,
                                   uint64_t rng_step);
/* The same in a run with RNG step rng_step (rand nodes; evt_rspec_reference: step 0). */
void evt_rspec_reference_at(const evt_rspec *s, int64_t m, int64_t n, const double *const in[3], double *const *tensors,
                            double *mean, double *rstd, uint64_t rng_step);

/* ---- src/codegen/emit_rows.c ---------------------------------------------------------------------------- */
/* CUDA C++ source of the row kernel and its launcher `extern "C" int evt_rowkernel_<hash>(const
 * evt_row_launch_args *)`. Returns a malloc'd string, or NULL with err set. */
char *evt_emit_rows(const evt_rspec *s, char *err, size_t errlen);

#endif
