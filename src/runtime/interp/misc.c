/* Interpreter: sources, randomness, losses, gathers/scatters and layout ops.
 * - full/scalar fill `value` (an integer dtype truncates it; one it cannot hold is an error, as in PyTorch); rand stores u = evt_philox_uniform(seed, offset, step, i) for row-major element i
 *   (step: the graph's RNG step, evt_graph_set_rng_step);
 *   dropout keeps x[i] iff that u >= p, compared in double ((double)u >= p, p the attribute's double),
 *   and scales kept elements by 1/(1-p) (p >= 1: all dropped). A kernel that must reproduce the mask bit
 *   for bit has to make the same comparison (u has 24 bits, so it is exact in float).
 * - Losses take logits/log-probs [N, C, d...] (or [C] with a scalar target), class dim 1, integer targets
 *   [N, d...]; targets equal to ignore_index contribute 0 and are not counted: reduction=mean divides by
 *   the number of counted targets (0/0 = NaN when none, as PyTorch). cross_entropy also takes class
 *   probabilities (a floating target of the logits' shape; mean divides by N*d...). bce_with_logits uses
 *   max(x,0) - x*y + log1p(exp(-|x|)); mse is (a-b)^2; mean divides by the element count. A backward op's
 *   dy is a scalar for mean/sum and has the loss's unreduced shape for none.
 * - one_hot / embedding / index_select and their scatter-add backward ops; every index is checked.
 * - Layout ops copy: reshape/squeeze/unsqueeze keep the row-major order, permute/transpose/expand/slice read
 *   through strides, slice_backward writes dy into zeros, concat appends along dim. Slice bounds follow
 *   Python: negative start/end count from the end, then clamp to [0, size]. */
#include "runtime/interp/internal.h"

#include "philox.h"

#include <stdlib.h>
#include <string.h>

/* ---- sources and randomness ------------------------------------------------------------------------ */

/* The uniforms of elements i, i + 1, ... of the stream (seed, offset), at most 4 and not past n, into q: four
 * from one Philox call when the stream index offset + i is a multiple of 4 and four are left, else one. Returns
 * how many. */
static int philox_block(uint64_t seed, uint64_t offset, uint64_t step, int64_t i, int64_t n, float q[4]) {
  if (((offset + (uint64_t)i) & 3) == 0 && i + 4 <= n) {
    evt_philox_uniform4(seed, offset, step, (uint64_t)i, q);
    return 4;
  }
  q[0] = evt_philox_uniform(seed, offset, step, (uint64_t)i);
  return 1;
}

static evt_status source_or_rng(evt_interp_ctx *ctx) {
  const evt_attrs *a = &ctx->n->attr;
  evt_tensor *out = ctx->out;
  switch (ctx->n->op) {
  case EVT_OP_FULL:
  case EVT_OP_SCALAR:
    if (interp_is_int(out->dtype)) {
      double v = trunc(a->value);
      if (!(out->dtype == EVT_I32 ? v >= -2147483648.0 && v <= 2147483647.0 : isfinite(v)))
        return interp_fail(ctx, "value %g does not fit in %s", a->value, evt_dtype_name(out->dtype));
    }
    for (int64_t i = 0; i < out->numel; i++) out->data[i] = a->value;
    return EVT_OK;
  case EVT_OP_RAND:
    for (int64_t i = 0; i < out->numel;) {
      float q[4];
      int c = philox_block((uint64_t)a->seed, (uint64_t)a->offset, ctx->g->rng_step, i, out->numel, q);
      for (int k = 0; k < c; k++) out->data[i++] = q[k];
    }
    return EVT_OK;
  case EVT_OP_DROPOUT: {
    const evt_tensor *x = ctx->in[0];
    if (!interp_numel_is(ctx, out, x->numel, "the output")) return EVT_ERR_INVALID;
    if (!(a->p >= 0 && a->p <= 1)) return interp_fail(ctx, "dropout p=%g is not in [0, 1]", a->p);
    double scale = a->p < 1 ? 1.0 / (1.0 - a->p) : 0.0;
    for (int64_t i = 0; i < out->numel;) {
      float q[4];
      int c = philox_block((uint64_t)a->seed, (uint64_t)a->offset, ctx->g->rng_step, i, out->numel, q);
      for (int k = 0; k < c; k++, i++) out->data[i] = x->data[i] * (a->p < 1 && (double)q[k] >= a->p ? 1.0 : 0.0) * scale;
    }
    return EVT_OK;
  }
  default: EVT_UNREACHABLE();
  }
}

/* ---- losses ---------------------------------------------------------------------------------------- */

typedef struct class_geom {
  int64_t N, C, inner; /* logits element (n, c, i) at (n * C + c) * inner + i; target (n, i) at n * inner + i */
} class_geom;

static bool class_geom_of(evt_interp_ctx *ctx, const evt_tensor *logits, const evt_tensor *target, bool soft,
                          class_geom *cg) {
  if (logits->rank == 1) {
    cg->N = 1;
    cg->C = logits->shape[0];
    cg->inner = 1;
  } else if (logits->rank >= 2) {
    cg->N = logits->shape[0];
    cg->C = logits->shape[1];
    cg->inner = interp_prod(logits->shape, 2, logits->rank);
  } else {
    return interp_fail(ctx, "the input needs a class dimension"), false;
  }
  int64_t want = soft ? logits->numel : cg->N * cg->inner;
  if (target->numel != want)
    return interp_fail(ctx, "target has %lld elements, expected %lld", (long long)target->numel, (long long)want), false;
  return true;
}

/* Loss value of a reduction over terms[0..m) that each count `counted` (mean divides by it). */
static void reduce_loss(int64_t reduction, const double *terms, int64_t m, double counted, evt_tensor *out) {
  if (reduction == EVT_REDUCTION_NONE) {
    memcpy(out->data, terms, sizeof(double) * (size_t)m);
    return;
  }
  double s = 0;
  for (int64_t i = 0; i < m; i++) s += terms[i];
  out->data[0] = reduction == EVT_REDUCTION_MEAN ? s / counted : s;
}

/* Checks a loss output/dy against the reduction: a scalar for mean/sum, m elements for none. */
static bool check_reduced(evt_interp_ctx *ctx, const evt_tensor *t, int64_t m, const char *what) {
  int64_t want = ctx->n->attr.reduction == EVT_REDUCTION_NONE ? m : 1;
  if (t->numel != want)
    return interp_fail(ctx, "%s has %lld elements, expected %lld", what, (long long)t->numel, (long long)want), false;
  return true;
}

static evt_status class_loss(evt_interp_ctx *ctx) {
  evt_op op = ctx->n->op;
  const evt_attrs *a = &ctx->n->attr;
  bool backward = op == EVT_OP_NLL_LOSS_BACKWARD;
  const evt_tensor *x = ctx->in[backward ? 1 : 0], *t = ctx->in[backward ? 2 : 1];
  bool soft = op == EVT_OP_CROSS_ENTROPY && evt_dtype_is_float(t->dtype);
  class_geom g;
  if (!class_geom_of(ctx, x, t, soft, &g)) return EVT_ERR_INVALID;
  int64_t m = g.N * g.inner;
  const double *logp = x->data;
  double *tmp = NULL;
  if (op == EVT_OP_CROSS_ENTROPY) { /* log_softmax over the class dim */
    tmp = malloc(sizeof(double) * (size_t)(x->numel ? x->numel : 1));
    if (!tmp) return interp_fail(ctx, "out of memory");
    for (int64_t n = 0; n < g.N; n++)
      for (int64_t i = 0; i < g.inner; i++) {
        const double *row = x->data + n * g.C * g.inner + i;
        double mx = -INFINITY, s = 0;
        for (int64_t c = 0; c < g.C; c++) {
          double v = row[c * g.inner];
          if (isnan(v) || v > mx) mx = isnan(mx) ? mx : v;
        }
        for (int64_t c = 0; c < g.C; c++) s += exp(row[c * g.inner] - mx);
        double lse = mx + log(s);
        for (int64_t c = 0; c < g.C; c++) tmp[(n * g.C + c) * g.inner + i] = row[c * g.inner] - lse;
      }
    logp = tmp;
  }
  double *terms = malloc(sizeof(double) * (size_t)(m ? m : 1));
  if (!terms) {
    free(tmp);
    return interp_fail(ctx, "out of memory");
  }
  if (backward && !interp_numel_is(ctx, ctx->out, x->numel, "the output")) {
    free(tmp);
    free(terms);
    return EVT_ERR_INVALID;
  }
  evt_status st = EVT_OK;
  double counted = 0;
  for (int64_t n = 0; n < g.N && st == EVT_OK; n++)
    for (int64_t i = 0; i < g.inner; i++) {
      int64_t k = n * g.inner + i;
      if (soft) {
        double s = 0;
        for (int64_t c = 0; c < g.C; c++) s -= t->data[(n * g.C + c) * g.inner + i] * logp[(n * g.C + c) * g.inner + i];
        terms[k] = s;
        counted += 1;
        continue;
      }
      double tv = t->data[k];
      if (tv == (double)a->ignore_index) {
        terms[k] = 0;
        continue;
      }
      int64_t c = evt_interp_index(ctx, t, k, g.C, "target");
      if (c < 0) {
        st = EVT_ERR_INVALID;
        break;
      }
      terms[k] = -logp[(n * g.C + c) * g.inner + i];
      counted += 1;
    }
  if (st == EVT_OK && !backward) {
    if (check_reduced(ctx, ctx->out, m, "output")) reduce_loss(a->reduction, terms, m, counted, ctx->out);
    else st = EVT_ERR_INVALID;
  }
  if (st == EVT_OK && backward) {
    const evt_tensor *dy = ctx->in[0];
    if (!check_reduced(ctx, dy, m, "dy")) {
      st = EVT_ERR_INVALID;
    } else {
      for (int64_t n = 0; n < g.N; n++)
        for (int64_t i = 0; i < g.inner; i++) {
          int64_t k = n * g.inner + i;
          if (t->data[k] == (double)a->ignore_index) continue;
          int64_t c = (int64_t)t->data[k];
          double d = a->reduction == EVT_REDUCTION_NONE ? dy->data[k]
                     : a->reduction == EVT_REDUCTION_MEAN ? dy->data[0] / counted : dy->data[0];
          ctx->out->data[(n * g.C + c) * g.inner + i] = -d;
        }
    }
  }
  free(terms);
  free(tmp);
  return st;
}

static evt_status pointwise_loss(evt_interp_ctx *ctx) {
  evt_op op = ctx->n->op;
  const evt_attrs *a = &ctx->n->attr;
  bool backward = op == EVT_OP_BCE_WITH_LOGITS_BACKWARD || op == EVT_OP_MSE_LOSS_BACKWARD;
  bool bce = op == EVT_OP_BCE_WITH_LOGITS || op == EVT_OP_BCE_WITH_LOGITS_BACKWARD;
  const evt_tensor *x = ctx->in[backward ? 1 : 0], *y = ctx->in[backward ? 2 : 1];
  int64_t m = x->numel;
  if (y->numel != m) return interp_fail(ctx, "operands have %lld and %lld elements", (long long)m, (long long)y->numel);
  if (!backward) {
    if (!check_reduced(ctx, ctx->out, m, "output")) return EVT_ERR_INVALID;
    double *terms = ctx->out->data, s = 0;
    bool none = a->reduction == EVT_REDUCTION_NONE;
    for (int64_t i = 0; i < m; i++) {
      double xv = x->data[i], yv = y->data[i];
      double l = bce ? fmax(xv, 0.0) - xv * yv + log1p(exp(-fabs(xv))) : (xv - yv) * (xv - yv);
      if (none) terms[i] = l;
      else s += l;
    }
    if (!none) ctx->out->data[0] = a->reduction == EVT_REDUCTION_MEAN ? s / (double)m : s;
    return EVT_OK;
  }
  const evt_tensor *dy = ctx->in[0];
  if (!check_reduced(ctx, dy, m, "dy") || !interp_numel_is(ctx, ctx->out, m, "the output")) return EVT_ERR_INVALID;
  for (int64_t i = 0; i < m; i++) {
    double xv = x->data[i], yv = y->data[i];
    double d = a->reduction == EVT_REDUCTION_NONE ? dy->data[i]
               : a->reduction == EVT_REDUCTION_MEAN ? dy->data[0] / (double)m : dy->data[0];
    double sig = xv >= 0 ? 1.0 / (1.0 + exp(-xv)) : exp(xv) / (1.0 + exp(xv));
    ctx->out->data[i] = bce ? (sig - yv) * d : 2.0 * (xv - yv) * d;
  }
  return EVT_OK;
}

/* ---- gathers and scatters -------------------------------------------------------------------------- */

static evt_status gather(evt_interp_ctx *ctx) {
  evt_op op = ctx->n->op;
  evt_tensor *out = ctx->out;
  switch (op) {
  case EVT_OP_ONE_HOT: {
    const evt_tensor *idx = ctx->in[0];
    int64_t C = out->rank ? out->shape[out->rank - 1] : 0;
    if (idx->numel * C != out->numel) return interp_fail(ctx, "output shape does not match the indices");
    for (int64_t i = 0; i < idx->numel; i++) {
      int64_t c = evt_interp_index(ctx, idx, i, C, "class index");
      if (c < 0) return EVT_ERR_INVALID;
      out->data[i * C + c] = 1;
    }
    return EVT_OK;
  }
  case EVT_OP_EMBEDDING:
  case EVT_OP_EMBEDDING_BACKWARD: {
    bool fwd = op == EVT_OP_EMBEDDING;
    const evt_tensor *table = fwd ? ctx->in[0] : out, *idx = ctx->in[1], *rows = fwd ? out : ctx->in[0];
    if (table->rank != 2) return interp_fail(ctx, "the embedding table must be [V, D]");
    int64_t V = table->shape[0], D = table->shape[1];
    if (rows->numel != idx->numel * D) return interp_fail(ctx, "shapes of table, indices and rows do not agree");
    for (int64_t i = 0; i < idx->numel; i++) {
      int64_t r = evt_interp_index(ctx, idx, i, V, "index");
      if (r < 0) return EVT_ERR_INVALID;
      if (fwd) memcpy(out->data + i * D, table->data + r * D, sizeof(double) * (size_t)D);
      else
        for (int64_t d = 0; d < D; d++) out->data[r * D + d] += rows->data[i * D + d];
    }
    return EVT_OK;
  }
  case EVT_OP_INDEX_SELECT:
  case EVT_OP_INDEX_SELECT_BACKWARD: {
    bool fwd = op == EVT_OP_INDEX_SELECT;
    const evt_tensor *full = fwd ? ctx->in[0] : out, *idx = ctx->in[1], *sel = fwd ? out : ctx->in[0];
    int d = interp_norm_dim(ctx->n->attr.dim, full->rank);
    if (d < 0 || sel->rank != full->rank) return interp_fail(ctx, "dim %lld out of range", (long long)ctx->n->attr.dim);
    int64_t outer = interp_prod(full->shape, 0, d), len = full->shape[d], inner = interp_prod(full->shape, d + 1, full->rank);
    int64_t n = idx->numel;
    if (sel->numel != outer * n * inner) return interp_fail(ctx, "shapes do not agree with %lld indices", (long long)n);
    for (int64_t j = 0; j < n; j++)
      if (evt_interp_index(ctx, idx, j, len, "index") < 0) return EVT_ERR_INVALID;
    for (int64_t o = 0; o < outer; o++)
      for (int64_t j = 0; j < n; j++) {
        int64_t r = (int64_t)idx->data[j];
        double *f = full->data + (o * len + r) * inner, *s = sel->data + (o * n + j) * inner;
        if (fwd) memcpy(s, f, sizeof(double) * (size_t)inner);
        else
          for (int64_t i = 0; i < inner; i++) {
            f[i] += s[i];
            if (interp_is_int(out->dtype) && !(fabs(f[i]) <= EVT_INT_EXACT_MAX)) return interp_int_inexact(ctx, f[i], (f - full->data) + i);
          }
      }
    return EVT_OK;
  }
  default: EVT_UNREACHABLE();
  }
}

/* coo_perm / coo_rowptr: a counting sort of the keys. counts[r + 1] = entries with key r, prefix-summed into
 * rowptr; coo_perm then places each entry at its row's next free slot, in increasing position (stable). */
static evt_status coo_index(evt_interp_ctx *ctx) {
  const evt_tensor *key = ctx->in[0];
  int64_t rows = ctx->n->attr.rows, E = key->numel;
  int64_t *next = calloc((size_t)rows + 1, sizeof *next);
  if (!next) return interp_fail(ctx, "out of memory");
  for (int64_t e = 0; e < E; e++) {
    int64_t r = evt_interp_index(ctx, key, e, rows, "key");
    if (r < 0) {
      free(next);
      return EVT_ERR_INVALID;
    }
    next[r + 1]++;
  }
  for (int64_t r = 0; r < rows; r++) next[r + 1] += next[r];
  if (ctx->n->op == EVT_OP_COO_ROWPTR)
    for (int64_t r = 0; r <= rows; r++) ctx->out->data[r] = (double)next[r];
  else
    for (int64_t e = 0; e < E; e++) ctx->out->data[next[(int64_t)key->data[e]]++] = (double)e;
  free(next);
  return EVT_OK;
}

/* ---- layout ---------------------------------------------------------------------------------------- */

/* dst (contiguous, shape `shape`) element e <-> src[base + sum idx_k * stride_k]; scatter adds into src. */
static void strided_walk(double *contig, double *strided, int rank, const int64_t *shape, int64_t base,
                         const int64_t *stride, bool scatter, int64_t numel) {
  int64_t idx[EVT_MAX_RANK] = {0}, o = base;
  for (int64_t e = 0; e < numel; e++) {
    if (scatter) strided[o] += contig[e];
    else contig[e] = strided[o];
    for (int d = rank - 1; d >= 0; d--) {
      o += stride[d];
      if (++idx[d] < shape[d]) break;
      o -= stride[d] * idx[d];
      idx[d] = 0;
    }
  }
}

/* perm keeps every dim but swaps the last two. */
static bool swaps_last_two(const int *perm, int rank) {
  if (rank < 2 || perm[rank - 2] != rank - 1 || perm[rank - 1] != rank - 2) return false;
  for (int d = 0; d < rank - 2; d++)
    if (perm[d] != d) return false;
  return true;
}

/* dst[C,R] = src[R,C]^T in 8 x 8 tiles (both sides stay in cache; larger tiles measured slower on power-of-two
 * rows, whose columns share cache sets). */
static void transpose(const double *src, double *dst, int64_t R, int64_t C) {
  enum { T = 8 };
  for (int64_t i0 = 0; i0 < R; i0 += T)
    for (int64_t j0 = 0; j0 < C; j0 += T) {
      int64_t i1 = i0 + T < R ? i0 + T : R, j1 = j0 + T < C ? j0 + T : C;
      for (int64_t j = j0; j < j1; j++)
        for (int64_t i = i0; i < i1; i++) dst[j * R + i] = src[i * C + j];
    }
}

static void contiguous_strides(const evt_tensor *t, int64_t *stride) {
  int64_t s = 1;
  for (int d = t->rank - 1; d >= 0; d--) {
    stride[d] = s;
    s *= t->shape[d];
  }
}

/* Python slice bounds of dim size `size`: the first index. */
static int64_t slice_start(int64_t start, int64_t size) {
  if (start < 0) start += size;
  return start < 0 ? 0 : start > size ? size : start;
}

static evt_status layout(evt_interp_ctx *ctx) {
  const evt_attrs *a = &ctx->n->attr;
  const evt_tensor *x = ctx->in[0];
  evt_tensor *out = ctx->out;
  int64_t xs[EVT_MAX_RANK], st[EVT_MAX_RANK];
  contiguous_strides(x, xs);
  switch (ctx->n->op) {
  case EVT_OP_RESHAPE:
  case EVT_OP_SQUEEZE:
  case EVT_OP_UNSQUEEZE:
    if (x->numel != out->numel) return interp_fail(ctx, "element counts differ");
    memcpy(out->data, x->data, sizeof(double) * (size_t)out->numel);
    return EVT_OK;
  case EVT_OP_PERMUTE:
  case EVT_OP_TRANSPOSE: {
    int perm[EVT_MAX_RANK];
    for (int d = 0; d < x->rank; d++) perm[d] = d;
    if (ctx->n->op == EVT_OP_PERMUTE) {
      if (a->dims.n != x->rank) return interp_fail(ctx, "permute needs %d dims", x->rank);
      bool seen[EVT_MAX_RANK] = {0};
      for (int d = 0; d < x->rank; d++) {
        perm[d] = interp_norm_dim(a->dims.v[d], x->rank);
        if (perm[d] >= 0 && seen[perm[d]]) return interp_fail(ctx, "permute dims repeat %d", perm[d]);
        if (perm[d] >= 0) seen[perm[d]] = true;
      }
    } else if (x->rank > 0) {
      int p0 = a->dims.n == 2 ? interp_norm_dim(a->dims.v[0], x->rank) : -1;
      int p1 = a->dims.n == 2 ? interp_norm_dim(a->dims.v[1], x->rank) : -1;
      if (p0 < 0 || p1 < 0) return interp_fail(ctx, "transpose needs dims=[a,b] within rank %d", x->rank);
      perm[p0] = p1;
      perm[p1] = p0;
    }
    for (int d = 0; d < x->rank; d++) {
      if (perm[d] < 0 || out->shape[d] != x->shape[perm[d]]) return interp_fail(ctx, "bad permutation");
      st[d] = xs[perm[d]];
    }
    int64_t R = x->rank >= 2 ? x->shape[x->rank - 2] : 0, C = x->rank >= 2 ? x->shape[x->rank - 1] : 0;
    if (swaps_last_two(perm, x->rank) && R * C > 0) { /* a batch of matrix transposes */
      for (int64_t b = 0; b < x->numel / (R * C); b++) transpose(x->data + b * R * C, out->data + b * R * C, R, C);
      return EVT_OK;
    }
    strided_walk(out->data, x->data, out->rank, out->shape, 0, st, false, out->numel);
    return EVT_OK;
  }
  case EVT_OP_EXPAND:
    if (!evt_interp_bcast_strides(x, out->rank, out->shape, st)) return interp_fail(ctx, "cannot expand to this shape");
    strided_walk(out->data, x->data, out->rank, out->shape, 0, st, false, out->numel);
    return EVT_OK;
  case EVT_OP_SLICE:
  case EVT_OP_SLICE_BACKWARD: {
    bool fwd = ctx->n->op == EVT_OP_SLICE;
    const evt_tensor *full = fwd ? x : out, *part = fwd ? out : x;
    int d = interp_norm_dim(a->dim, full->rank);
    if (d < 0 || part->rank != full->rank || a->step < 1) return interp_fail(ctx, "bad slice dim or step");
    for (int k = 0; k < full->rank; k++)
      if (k != d && part->shape[k] != full->shape[k]) return interp_fail(ctx, "slice shapes differ outside dim %d", d);
    int64_t fs[EVT_MAX_RANK];
    contiguous_strides(full, fs);
    int64_t s0 = slice_start(a->start, full->shape[d]), e0 = slice_start(a->end, full->shape[d]);
    int64_t len = e0 > s0 ? (e0 - s0 + a->step - 1) / a->step : 0;
    if (part->shape[d] != len)
      return interp_fail(ctx, "slice [%lld:%lld:%lld] of %lld has %lld elements, not %lld", (long long)a->start,
                         (long long)a->end, (long long)a->step, (long long)full->shape[d], (long long)len,
                         (long long)part->shape[d]);
    for (int k = 0; k < full->rank; k++) st[k] = k == d ? fs[k] * a->step : fs[k];
    strided_walk(part->data, full->data, part->rank, part->shape, s0 * fs[d], st, !fwd, part->numel);
    return EVT_OK;
  }
  case EVT_OP_CONCAT: {
    int d = interp_norm_dim(a->dim, out->rank);
    if (d < 0) return interp_fail(ctx, "dim %lld out of range", (long long)a->dim);
    int64_t outer = interp_prod(out->shape, 0, d), inner = interp_prod(out->shape, d + 1, out->rank);
    int64_t row = out->shape[d] * inner, at = 0;
    for (int k = 0; k < ctx->n->ninputs; k++) {
      const evt_tensor *in = ctx->in[k];
      int64_t chunk = in->rank == out->rank ? in->shape[d] * inner : -1;
      if (chunk < 0 || at + chunk > row || in->numel != outer * chunk) return interp_fail(ctx, "input %d does not fit", k);
      for (int64_t o = 0; o < outer; o++)
        memcpy(out->data + o * row + at, in->data + o * chunk, sizeof(double) * (size_t)chunk);
      at += chunk;
    }
    if (at != row) return interp_fail(ctx, "inputs do not fill the output");
    return EVT_OK;
  }
  default: EVT_UNREACHABLE();
  }
}

evt_status evt_interp_misc(evt_interp_ctx *ctx) {
  switch (ctx->n->op) {
  case EVT_OP_FULL: case EVT_OP_SCALAR: case EVT_OP_RAND: case EVT_OP_DROPOUT:
    return source_or_rng(ctx);
  case EVT_OP_NLL_LOSS: case EVT_OP_NLL_LOSS_BACKWARD: case EVT_OP_CROSS_ENTROPY:
    return class_loss(ctx);
  case EVT_OP_BCE_WITH_LOGITS: case EVT_OP_BCE_WITH_LOGITS_BACKWARD: case EVT_OP_MSE_LOSS:
  case EVT_OP_MSE_LOSS_BACKWARD:
    return pointwise_loss(ctx);
  case EVT_OP_ONE_HOT: case EVT_OP_EMBEDDING: case EVT_OP_EMBEDDING_BACKWARD: case EVT_OP_INDEX_SELECT:
  case EVT_OP_INDEX_SELECT_BACKWARD:
    return gather(ctx);
  case EVT_OP_COO_PERM: case EVT_OP_COO_ROWPTR:
    return coo_index(ctx);
  default:
    return layout(ctx);
  }
}
