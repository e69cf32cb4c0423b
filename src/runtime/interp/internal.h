/* Internals of the CPU interpreter, shared by the files of src/runtime/interp. Not part of any other module's API.
 * (The dispatcher calls the families and they call its helpers back: one module, one header, on purpose.)
 *
 * Each op family lives in one file and exposes one entry, `evt_interp_<family>(ctx)`, that computes the
 * node's output values in double into ctx->out (already allocated with the node's shape and dtype, zero-
 * filled). The dispatcher in interp.c rounds the stored values to the node's dtype afterwards (unless
 * EVT_RUN_FP64 leaves floats in double), so the family code never rounds, except where an op's meaning
 * needs a value at the dtype mid-way (i32 products, which a double does not hold: elementwise.c).
 *
 * Run-time errors (an index out of range, a CSR row pointer not monotone) are user errors: the family
 * returns EVT_ERR_INVALID through interp_fail(), whose message names the node. */
#ifndef EVT_INTERP_IMPL_H
#define EVT_INTERP_IMPL_H

#include "ir/ir.h"
#include "runtime/interp/interp.h"

#include <math.h>

typedef struct evt_interp_ctx {
  evt_graph *g;
  int id;                          /* the node being run */
  const evt_node *n;
  const evt_tensor *const *in;     /* n->ninputs tensors, shapes checked against the input nodes' types */
  evt_tensor *out;                 /* allocated and zeroed by the dispatcher */
  unsigned flags;                  /* EVT_RUN_* */
  const evt_fp8_noise *noise;      /* NULL, or the perturbed reference's noise on fp8 GEMMs (interp.h) */
} evt_interp_ctx;

#define interp_fail(ctx, ...) evt_graph_errorf((ctx)->g, (ctx)->id, EVT_ERR_INVALID, __VA_ARGS__)

/* A dim attribute that may be negative (Python style) as an index in [0, rank); -1 if out of range. */
static inline int interp_norm_dim(int64_t d, int rank) {
  if (d < 0) d += rank;
  return d >= 0 && d < rank ? (int)d : -1;
}

/* Product of shape[lo..hi). */
static inline int64_t interp_prod(const int64_t *shape, int lo, int hi) {
  int64_t p = 1;
  for (int i = lo; i < hi; i++) p *= shape[i];
  return p;
}

/* Strides (in elements) with which `in` is read when broadcast numpy-style to a tensor of rank `rank`
 * and shape `shape`: 0 along broadcast dimensions. False (strides unset) if `in` does not broadcast to it. */
bool evt_interp_bcast_strides(const evt_tensor *in, int rank, const int64_t *shape, int64_t *stride);

/* Fails unless t has exactly `numel` elements (guards against a node whose type disagrees with its inputs,
 * so that a malformed graph gives a message instead of an out-of-bounds access). */
static inline bool interp_numel_is(evt_interp_ctx *ctx, const evt_tensor *t, int64_t numel, const char *what) {
  if (t->numel == numel) return true;
  evt_graph_errorf(ctx->g, ctx->id, EVT_ERR_INVALID, "%s has %lld elements, expected %lld", what,
                   (long long)t->numel, (long long)numel);
  return false;
}

/* Integer tensors hold exact integers (|v| <= EVT_INT_EXACT_MAX, include/evt.h): an integer value a family
 * computes past that is reported with interp_int_inexact (EVT_ERR_UNSUPPORTED, naming the node and element),
 * never rounded. Sums check each partial sum: the exact addends then keep every partial sum exact. */
static inline bool interp_is_int(evt_dtype dt) { return dt == EVT_I64 || dt == EVT_I32; }
evt_status interp_int_inexact(evt_interp_ctx *ctx, double v, int64_t i);

/* Reads an index tensor's element i as an integer in [0, limit); on failure sets the message (naming
 * `what`) and returns -1. Integral floats are accepted; NaN or fractions are not. */
int64_t evt_interp_index(evt_interp_ctx *ctx, const evt_tensor *t, int64_t i, int64_t limit, const char *what);

/* Products of at least this many multiply-adds (M x N x K) go through the BLAS (gemm.c, conv.c); smaller ones
 * run the plain loops, as fast at that size. Dimensions must also fit the BLAS's int. */
#define EVT_INTERP_BLAS_MIN 32768
static inline bool evt_interp_use_blas(int64_t m, int64_t n, int64_t k) {
  return m > 0 && n > 0 && k > 0 && m < INT32_MAX && n < INT32_MAX && k < INT32_MAX && (double)m * (double)n * (double)k >= EVT_INTERP_BLAS_MIN;
}

/* Uniform in [0, 1) with 53 bits from the counter-based stream (key, i, lane) (interp.c). */
double evt_interp_counter_uniform(uint64_t key, uint64_t i, uint64_t lane);

/* Call before any BLAS routine (gemm.c): sets up the BLAS once (one thread). */
void evt_interp_blas_ready(void);

/* The op families. Each handles the ops of its file; see the file's top comment. */
evt_status evt_interp_elementwise(evt_interp_ctx *ctx);   /* interp_elementwise.c: unary, binary, where */
evt_status evt_interp_reduce(evt_interp_ctx *ctx);        /* interp_reduce.c: sum/mean/amax, row ops, norms */
evt_status evt_interp_gemm(evt_interp_ctx *ctx);          /* interp_gemm.c: mm, bmm, addmm, spmm, sdpa */
evt_status evt_interp_conv(evt_interp_ctx *ctx);          /* interp_conv.c: conv2d and pools, with backwards */
evt_status evt_interp_misc(evt_interp_ctx *ctx);          /* interp_misc.c: sources, rng, losses, gathers, layout */

#endif
