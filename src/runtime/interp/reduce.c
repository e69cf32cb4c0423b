/* Interpreter: reductions and reduce-apply row ops.
 * - sum/mean/amax over `dims` (empty: all dims; negative dims count from the end), keepdim or not. The
 *   input is read once in row-major order and accumulated into its output element, so the order of
 *   summation is fixed. amax propagates NaN; mean of zero elements is NaN (0/0). An integer partial sum past
 *   2^53 is an error (interp_int_inexact).
 * - softmax/log_softmax and their backward along `dim` (max-subtracted, so large logits are safe).
 * - layer_norm over the last dim and batch_norm (training mode: statistics over every dim but 1), both with
 *   the biased variance; their input/weight backward ops are the exact gradients. */
#include "runtime/interp/internal.h"

#include <stdlib.h>
#include <string.h>

/* ---- sum / mean / amax ----------------------------------------------------------------------------- */

static evt_status reduce_dims(evt_interp_ctx *ctx) {
  const evt_tensor *x = ctx->in[0];
  evt_tensor *out = ctx->out;
  const evt_ilist *dims = &ctx->n->attr.dims;
  bool reduced[EVT_MAX_RANK] = {0};
  if (dims->n == 0)
    for (int d = 0; d < x->rank; d++) reduced[d] = true;
  for (int k = 0; k < dims->n; k++) {
    int d = interp_norm_dim(dims->v[k], x->rank);
    if (d < 0) return interp_fail(ctx, "reduction dim %lld out of range", (long long)dims->v[k]);
    reduced[d] = true;
  }
  /* output stride of each input dim: 0 where reduced */
  int64_t ostride[EVT_MAX_RANK], s = 1, count = 1;
  for (int d = x->rank - 1; d >= 0; d--) {
    if (reduced[d]) {
      ostride[d] = 0;
      count *= x->shape[d];
    } else {
      ostride[d] = s;
      s *= x->shape[d];
    }
  }
  if (s != out->numel) return interp_fail(ctx, "output size %lld does not match the reduction", (long long)out->numel);
  bool is_max = ctx->n->op == EVT_OP_AMAX;
  if (is_max) {
    if (count == 0) return interp_fail(ctx, "amax over zero elements");
    for (int64_t i = 0; i < out->numel; i++) out->data[i] = -INFINITY;
  }
  int64_t idx[EVT_MAX_RANK] = {0}, o = 0;
  bool ints = interp_is_int(out->dtype);
  for (int64_t i = 0; i < x->numel; i++) {
    double v = x->data[i];
    if (is_max) {
      double *m = &out->data[o];
      if (isnan(v) || v > *m) *m = isnan(*m) ? *m : v;
    } else {
      out->data[o] += v;
      if (ints && !(fabs(out->data[o]) <= EVT_INT_EXACT_MAX)) return interp_int_inexact(ctx, out->data[o], o);
    }
    for (int d = x->rank - 1; d >= 0; d--) {
      o += ostride[d];
      if (++idx[d] < x->shape[d]) break;
      o -= ostride[d] * idx[d];
      idx[d] = 0;
    }
  }
  if (ctx->n->op == EVT_OP_MEAN)
    for (int64_t i = 0; i < out->numel; i++) out->data[i] /= (double)count;
  return EVT_OK;
}

/* ---- rows along a dim: outer x len x inner, element (o, k, i) at (o * len + k) * inner + i ------------ */

typedef struct rows {
  int64_t outer, len, inner;
} rows;

static bool rows_along(evt_interp_ctx *ctx, const evt_tensor *x, int64_t dim, rows *r) {
  int d = x->rank == 0 ? 0 : interp_norm_dim(dim, x->rank);
  if (d < 0) {
    interp_fail(ctx, "dim %lld out of range for rank %d", (long long)dim, x->rank);
    return false;
  }
  r->outer = x->rank ? interp_prod(x->shape, 0, d) : 1;
  r->len = x->rank ? x->shape[d] : 1;
  r->inner = x->rank ? interp_prod(x->shape, d + 1, x->rank) : 1;
  return true;
}

static evt_status softmax_rows(evt_interp_ctx *ctx) {
  const evt_node *n = ctx->n;
  const evt_tensor *x = ctx->in[0];
  rows r;
  if (!rows_along(ctx, x, n->attr.dim, &r)) return EVT_ERR_INVALID;
  if (!interp_numel_is(ctx, ctx->out, x->numel, "the output") ||
      (n->ninputs > 1 && !interp_numel_is(ctx, ctx->in[1], x->numel, "y")))
    return EVT_ERR_INVALID;
  double *y = ctx->out->data;
  const double *a = x->data, *b = n->ninputs > 1 ? ctx->in[1]->data : NULL;
  for (int64_t o = 0; o < r.outer; o++)
    for (int64_t i = 0; i < r.inner; i++) {
      int64_t base = o * r.len * r.inner + i, st = r.inner;
      switch (n->op) {
      case EVT_OP_SOFTMAX:
      case EVT_OP_LOG_SOFTMAX: {
        double m = -INFINITY;
        for (int64_t k = 0; k < r.len; k++) {
          double v = a[base + k * st];
          if (isnan(v) || v > m) m = isnan(m) ? m : v;
        }
        double sum = 0;
        for (int64_t k = 0; k < r.len; k++) sum += exp(a[base + k * st] - m);
        if (n->op == EVT_OP_SOFTMAX) {
          for (int64_t k = 0; k < r.len; k++) y[base + k * st] = exp(a[base + k * st] - m) / sum;
        } else {
          double lse = m + log(sum);
          for (int64_t k = 0; k < r.len; k++) y[base + k * st] = a[base + k * st] - lse;
        }
        break;
      }
      case EVT_OP_SOFTMAX_BACKWARD: { /* (dy, y): y * (dy - sum(dy * y)) */
        double dot = 0;
        for (int64_t k = 0; k < r.len; k++) dot += a[base + k * st] * b[base + k * st];
        for (int64_t k = 0; k < r.len; k++) y[base + k * st] = b[base + k * st] * (a[base + k * st] - dot);
        break;
      }
      case EVT_OP_LOG_SOFTMAX_BACKWARD: { /* (dy, y): dy - exp(y) * sum(dy) */
        double sum = 0;
        for (int64_t k = 0; k < r.len; k++) sum += a[base + k * st];
        for (int64_t k = 0; k < r.len; k++) y[base + k * st] = a[base + k * st] - exp(b[base + k * st]) * sum;
        break;
      }
      default: EVT_UNREACHABLE();
      }
    }
  return EVT_OK;
}

/* ---- normalisation --------------------------------------------------------------------------------- *
 * Both norms are "groups of elements sharing statistics". Layer norm: group = one row of the last dim,
 * the affine weight indexed by position in the row. Batch norm: group = one channel (dim 1) across
 * batch and spatial dims, the weight indexed by channel. norm_plan describes the element set of group g:
 * elements (o, g, i) for o < outer, i < inner at ((o * groups + g) * inner + i) for batch norm, or the
 * contiguous row g * len .. for layer norm. */

typedef struct norm_plan {
  bool per_row;   /* layer norm */
  int64_t groups, outer, inner, len;   /* batch norm: groups = C; layer norm: groups = rows, len = D */
  int64_t count;  /* elements per group */
} norm_plan;

static bool norm_plan_for(evt_interp_ctx *ctx, const evt_tensor *x, bool layer, norm_plan *p) {
  memset(p, 0, sizeof *p);
  p->per_row = layer;
  if (layer) {
    if (x->rank < 1) return interp_fail(ctx, "layer_norm needs rank >= 1"), false;
    p->len = x->shape[x->rank - 1];
    p->groups = p->len ? x->numel / p->len : 0;
    p->count = p->len;
  } else {
    if (x->rank < 2) return interp_fail(ctx, "batch_norm needs rank >= 2 ([N, C, ...])"), false;
    p->outer = x->shape[0];
    p->groups = x->shape[1];
    p->inner = interp_prod(x->shape, 2, x->rank);
    p->count = p->outer * p->inner;
  }
  return true;
}

/* Calls the body for every element offset `e` of group g, in increasing offset order. */
#define NORM_FOR(p, g, BODY)                                                                   \
  do {                                                                                        \
    if ((p)->per_row) {                                                                       \
      for (int64_t k_ = 0; k_ < (p)->len; k_++) {                                             \
        int64_t e = (g) * (p)->len + k_, wi = k_;                                             \
        (void)wi;                                                                             \
        BODY;                                                                                 \
      }                                                                                       \
    } else {                                                                                  \
      for (int64_t o_ = 0; o_ < (p)->outer; o_++)                                             \
        for (int64_t i_ = 0; i_ < (p)->inner; i_++) {                                        \
          int64_t e = (o_ * (p)->groups + (g)) * (p)->inner + i_, wi = (g);                   \
          (void)wi;                                                                           \
          BODY;                                                                               \
        }                                                                                     \
    }                                                                                         \
  } while (0)

static evt_status norm(evt_interp_ctx *ctx) {
  const evt_node *n = ctx->n;
  evt_op op = n->op;
  bool layer = op == EVT_OP_LAYER_NORM || op == EVT_OP_LAYER_NORM_BACKWARD_INPUT || op == EVT_OP_LAYER_NORM_BACKWARD_WEIGHT;
  bool forward = op == EVT_OP_LAYER_NORM || op == EVT_OP_BATCH_NORM;
  const evt_tensor *x = forward ? ctx->in[0] : ctx->in[1];
  const double *xd = x->data, *dy = forward ? NULL : ctx->in[0]->data;
  const double *w = NULL, *b = NULL;
  if (forward) {
    w = n->ninputs > 1 ? ctx->in[1]->data : NULL;
    b = n->ninputs > 2 ? ctx->in[2]->data : NULL;
  } else if (n->ninputs > 2) {
    w = ctx->in[2]->data;
  }
  norm_plan p;
  if (!norm_plan_for(ctx, x, layer, &p)) return EVT_ERR_INVALID;
  int64_t wlen = layer ? p.len : p.groups;
  for (int k = forward ? 1 : 2; k < n->ninputs; k++)
    if (ctx->in[k]->numel != wlen)
      return interp_fail(ctx, "affine input %d has %lld elements, expected %lld", k, (long long)ctx->in[k]->numel,
                         (long long)wlen);
  bool weight_grad = op == EVT_OP_LAYER_NORM_BACKWARD_WEIGHT || op == EVT_OP_BATCH_NORM_BACKWARD_WEIGHT;
  if ((!forward && !interp_numel_is(ctx, ctx->in[0], x->numel, "dy")) ||
      (!weight_grad && !interp_numel_is(ctx, ctx->out, x->numel, "the output")))
    return EVT_ERR_INVALID;
  double *y = ctx->out->data;
  if (weight_grad && ctx->out->numel != wlen)
    return interp_fail(ctx, "output has %lld elements, expected %lld", (long long)ctx->out->numel, (long long)wlen);
  double inv_count = p.count ? 1.0 / (double)p.count : NAN;
  for (int64_t g = 0; g < p.groups; g++) {
    double mean = 0, var = 0;
    NORM_FOR(&p, g, mean += xd[e]);
    mean *= inv_count;
    NORM_FOR(&p, g, var += (xd[e] - mean) * (xd[e] - mean));
    var *= inv_count;
    double rstd = 1.0 / sqrt(var + n->attr.eps);
    if (forward) {
      NORM_FOR(&p, g, y[e] = (xd[e] - mean) * rstd * (w ? w[wi] : 1.0) + (b ? b[wi] : 0.0));
    } else if (weight_grad) {
      /* layer norm sums over rows into [D]; batch norm over the channel's elements into [C] */
      NORM_FOR(&p, g, y[wi] += dy[e] * (xd[e] - mean) * rstd);
    } else {
      /* dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w */
      double mg = 0, mgx = 0;
      NORM_FOR(&p, g, {
        double gv = dy[e] * (w ? w[wi] : 1.0);
        mg += gv;
        mgx += gv * (xd[e] - mean) * rstd;
      });
      mg *= inv_count;
      mgx *= inv_count;
      NORM_FOR(&p, g, y[e] = rstd * (dy[e] * (w ? w[wi] : 1.0) - mg - (xd[e] - mean) * rstd * mgx));
    }
  }
  return EVT_OK;
}

evt_status evt_interp_reduce(evt_interp_ctx *ctx) {
  switch (ctx->n->op) {
  case EVT_OP_SUM:
  case EVT_OP_MEAN:
  case EVT_OP_AMAX: return reduce_dims(ctx);
  case EVT_OP_SOFTMAX:
  case EVT_OP_LOG_SOFTMAX:
  case EVT_OP_SOFTMAX_BACKWARD:
  case EVT_OP_LOG_SOFTMAX_BACKWARD: return softmax_rows(ctx);
  default: return norm(ctx);
  }
}
