/* The unfused CUDA path: one kernel (or a few) per graph node, the semantics of the CPU interpreter
 * (src/runtime/interp*.c) on the GPU. Built once by nvcc into build/libevt_fallback.so (`make cuda`) and
 * loaded by src/runtime/gpu/cuda.c with dlopen, so libevt never links CUDA.
 *
 * Contract
 * - A tensor lives on the device in its node's dtype (f32, f16, bf16, i64, i32, bool as one byte, f8e4m3 / f8e5m2
 *   as one-byte codes of src/ir/fp8.c), contiguous row-major. Every node computes in double into a double scratch
 *   (zeroed unless its kernel assigns every element) and rounds to its dtype exactly as evt_round_to_dtype does
 *   (f16/bf16/fp8 through float, fp8 saturating, ints truncated, bool != 0), so with the library compiled with
 *   --fmad=false most ops give the interpreter's bits; transcendental functions (exp, log, tanh, erf) differ from
 *   glibc by an ulp of double, below any dtype's rounding.
 * - Summation orders follow the interpreter where a thread owns an output element (reductions, softmax,
 *   norms, mm, conv forward / weight gradient); scatter ops (embedding/index_select/pool/conv input
 *   backward, spmm_t node by node, sdpa_backward_k/v, layer_norm_backward_weight) add with double atomics.
 * - Streams: every launch of a node goes to the caller's stream (evt_fb_run); nothing inside a node
 *   synchronizes, copies to the host or allocates (scratch is reserved per context beforehand), so a
 *   whole step can be captured as a CUDA graph.
 * - Run-time index errors (an index or a coo_perm / coo_rowptr key out of range, a CSR row pointer not monotone)
 *   do not stop the kernel (the element is skipped); they set a device flag with the node id; evt_fb_sync reports
 *   the first one.
 * - Every entry returns 0 on success; otherwise non-zero with a message in err (a CUDA error string, or
 *   "op X is not supported" for an op this library does not cover).
 * The op numbers are those of src/ir/ops.def (EVT_FB_OP_<NAME> == EVT_OP_<NAME>). */
#ifndef EVT_FALLBACK_H
#define EVT_FALLBACK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
#define X(U, name, mn, mx, cls, attrs, flags) EVT_FB_OP_##U,
#include "ir/ops.def"
#undef X
  EVT_FB_OP_COUNT
};

/* dtypes: the numbering of evt_dtype */
enum { EVT_FB_F32 = 0, EVT_FB_F16, EVT_FB_BF16, EVT_FB_I64, EVT_FB_I32, EVT_FB_BOOL, EVT_FB_F8E4M3, EVT_FB_F8E5M2 };

#define EVT_FB_MAX_RANK 6
#define EVT_FB_MAX_IN 8

typedef struct evt_fb_tensor {
  void *ptr; /* device memory */
  int dtype, rank;
  int64_t shape[EVT_FB_MAX_RANK];
  int64_t numel;
} evt_fb_tensor;

typedef struct evt_fb_attrs {
  int ndims;
  int64_t dims[EVT_FB_MAX_RANK];
  int64_t dim, keepdim, start, end, step;
  double value, eps, p, scale;
  int64_t seed, offset, ignore_index;
  const unsigned long long *rng_step; /* rand / dropout: device memory holding the run's RNG step (NULL: 0) */
  int reduction;          /* 0 none, 1 mean, 2 sum */
  int approx_tanh, nhwc, causal;
  int sdpa_siblings;      /* sdpa_backward_{q,k,v}: which of the three (bits 1 q, 2 k, 4 v) the graph has with
                           * this node's inputs (the library computes all three once and serves the others);
                           * sdpa: the gradients of its q, k, v in the graph (nonzero: it keeps out and the
                           * statistics for them) */
  int64_t stride[2], padding[2], dilation[2], kernel[2], groups;
  int64_t rows;           /* coo_perm / coo_rowptr: keys lie in [0, rows) */
} evt_fb_attrs;

typedef struct evt_fb_node {
  int id, op, ninputs;
  evt_fb_tensor in[EVT_FB_MAX_IN];
  evt_fb_tensor out;
  evt_fb_attrs a;
} evt_fb_node;

/* Per-runtime state: cuBLAS handle and workspace, node scratch, staging for host conversions, launch
 * counter. One per evt_program; a context enqueues on one stream at a time (not thread-safe). */
typedef struct evt_fb_ctx evt_fb_ctx;

/* Streams, events and graph executables cross this ABI as void * (cudaStream_t / cudaEvent_t /
 * cudaGraphExec_t); stream NULL is the legacy default stream. */
int evt_fb_init(char *err, size_t errlen);                 /* picks device 0; fails if there is none */
int evt_fb_device_arch(void);  /* device 0's compute capability as major * 10 + minor (80, 86, 89, 90, ...), 0 on error */
evt_fb_ctx *evt_fb_ctx_new(char *err, size_t errlen);      /* NULL on failure */
void evt_fb_ctx_free(evt_fb_ctx *c);
void *evt_fb_alloc(int64_t bytes, char *err, size_t errlen); /* NULL on failure */
void evt_fb_free(void *p);
/* Sizes the context's scratch for node n (allocates; call before a step / a capture, never inside one). With
 * bound scratch (evt_fb_bind_scratch) it only checks that the scratch is large enough. */
int evt_fb_reserve(evt_fb_ctx *c, const evt_fb_node *n, char *err, size_t errlen);
/* Reserves what node n keeps in the context (attention plans, COO scratch) and sets *n1, *n2 to the doubles of
 * the two scratch buffers its run needs (0: none), for a caller that provides them (evt_fb_bind_scratch). */
int evt_fb_scratch_need(evt_fb_ctx *c, const evt_fb_node *n, int64_t *n1, int64_t *n2, char *err, size_t errlen);
/* The context's two scratch buffers become the caller's memory (n1, n2 doubles, 8-byte aligned), used by the
 * following runs until bound again; s1 NULL returns to scratch of its own (allocated by evt_fb_reserve). The
 * context's own scratch is freed at the first bind (it waits for the device: bind outside a capture). */
void evt_fb_bind_scratch(evt_fb_ctx *c, void *s1, int64_t n1, void *s2, int64_t n2);
/* Enqueues the node's kernels on stream: no synchronization, no host copies, no allocation once the node
 * was reserved. Graph-capturable. */
int evt_fb_run(evt_fb_ctx *c, const evt_fb_node *n, void *stream, char *err, size_t errlen);
long evt_fb_launches(const evt_fb_ctx *c);                  /* kernel launches enqueued so far (cuBLAS: 1) */
/* Host doubles <-> device tensor in its dtype, through the context's staging buffer; both wait for the
 * stream (the host buffer is free / filled on return). */
int evt_fb_upload(evt_fb_ctx *c, const evt_fb_tensor *t, const double *host, void *stream, char *err, size_t errlen);
int evt_fb_download(evt_fb_ctx *c, const evt_fb_tensor *t, double *host, void *stream, char *err, size_t errlen);
int evt_fb_copy(void *dst, const void *src, int64_t bytes, void *stream, char *err, size_t errlen); /* async */
/* One SGD step in place, enqueued on stream (no synchronization; graph-capturable): p -= lr * g elementwise,
 * computed in double and rounded to p's dtype as evt_round_to_dtype does (evt_train_sgd_update's arithmetic,
 * so a GPU training loop follows the host update's bits). p not floating (f32, f16, bf16, fp8): nothing. */
int evt_fb_sgd(const evt_fb_tensor *p, const evt_fb_tensor *g, double lr, void *stream, char *err, size_t errlen);
/* The RNG step a program's kernels read (kernels/philox.h), enqueued on stream (graph-capturable): set: *step =
 * value; else *step += 1 (a captured run advances its own step at every replay). */
int evt_fb_rng_step(unsigned long long *step, unsigned long long value, int set, void *stream, char *err,
                    size_t errlen);
/* Waits for the stream; *bad_node = node id of the first run-time index error since the last call (else
 * -1). The index flag is one per process. */
int evt_fb_sync(void *stream, int *bad_node, char *err, size_t errlen);
/* The device address of that flag (node id + 1 of the first error, 0: none), for generated kernels that check
 * indices the same way (the spmm row kernels' csr.err, kernels/evt_row_launch.h). */
int evt_fb_index_flag(int **flag, char *err, size_t errlen);
/* A^T's CSR on the device, the operand of spmm_t's generated row kernel (kernels/evt_row_launch.h csr with perm), built
 * from A's rowptr / col at every run (kernels/fallback/csr.cu): colptr [k + 1], rowidx [nnz] (the row of A of each
 * entry) and perm [nnz] (its position in A: values read as val[perm[t]]), in the order of the host's
 * evt_csr_transpose (src/codegen/csr.c: by column, each column's entries in increasing position in A), bit for bit
 * on a valid CSR; only the first colptr[k] entries belong to A^T. A rowptr entry outside [0, nnz] or decreasing, or
 * an entry of A (a position in rowptr[0] .. rowptr[m] - 1) with a column outside [0, k), sets the run-time index flag
 * with `node` (evt_fb_sync reports it); entries with a bad column are left out. The arrays live in the context's scratch (the same addresses at every call, overwritten by
 * the next transpose: the caller's row kernel is enqueued before it); reserve sizes that scratch for t's sizes and
 * dtype (allocates: before a step or a capture, never inside one). transpose enqueues its kernels on stream (no
 * synchronization, no allocation; graph-capturable) and sets t->colptr, rowidx, perm. Returns 1 for indices neither
 * i64 nor i32, sizes over i32 with i32 indices, or a scratch not reserved. */
typedef struct evt_fb_csr_transpose_args {
  int node;                      /* the spmm_t node (its id) */
  int idx_dtype;                 /* EVT_FB_I64 or EVT_FB_I32: rowptr, col and the arrays built */
  int64_t m, k, nnz;             /* A [m, k]: rowptr [m + 1], col [nnz] */
  const void *rowptr, *col;      /* device memory */
  void *colptr, *rowidx, *perm;  /* set by evt_fb_csr_transpose */
} evt_fb_csr_transpose_args;
int evt_fb_csr_reserve(evt_fb_ctx *c, const evt_fb_csr_transpose_args *t, char *err, size_t errlen);
int evt_fb_csr_transpose(evt_fb_ctx *c, evt_fb_csr_transpose_args *t, void *stream, char *err, size_t errlen);
int evt_fb_stream_new(void **stream, char *err, size_t errlen); /* a non-blocking stream */
void evt_fb_stream_free(void *stream);
/* CUDA graphs: begin (relaxed capture mode), end + instantiate (discard != 0: abandon a failed capture),
 * replay, free. */
int evt_fb_capture_begin(void *stream, char *err, size_t errlen);
int evt_fb_capture_end(void *stream, int discard, void **exec, char *err, size_t errlen);
int evt_fb_graph_launch(void *exec, void *stream, char *err, size_t errlen);
void evt_fb_graph_free(void *exec);
int evt_fb_event_new(void **ev, char *err, size_t errlen);
int evt_fb_event_record(void *ev, void *stream, char *err, size_t errlen);
int evt_fb_event_ms(void *from, void *to, double *ms, char *err, size_t errlen); /* waits for `to` */
void evt_fb_event_free(void *ev);
int evt_fb_stream_capturing(void *stream); /* 1: being captured (or unknown), 0: not */
int evt_fb_dtype_bytes(int dtype);

#ifdef __cplusplus
}
#endif

#endif
