/* Pass: decomposition of composite ops into row nuclei, reductions and elementwise ops (to a fixpoint).
 *
 * Contract: requires a well-formed graph (after canonicalize and loss elimination); preserves every output
 * value up to floating-point reassociation; dropout masks stay bit-identical (the `rand` node uses the same
 * Philox seed and offset, and the threshold p is moved up to the next multiple of 2^-24, the grid the
 * uniform numbers lie on, so `u >= p` keeps the same elements after p is stored as f32). Rules:
 *   log_softmax(x)                      -> log(softmax(x))
 *   log_softmax_backward(g, y)          -> g - sum(g, dim, keepdim) * S     S = softmax(x) when y is
 *                                          log_softmax(x) (or log(softmax(x))), else exp(y)
 *   nll_loss_backward(dy, lp, t)        -> -(one_hot(t') * w)     w = dy * mask [/ max(count, 1)] as [N, 1]
 *   dropout(x)                          -> x * cast(rand >= p) * 1/(1-p)   (its backward is a dropout of dy,
 *                                          so it becomes the same two multiplies with the same mask)
 *   layer_norm(x, w[, b])               -> layer_norm(x) * w [+ b]
 *   layer_norm_backward_input(dy, x, w) -> layer_norm_backward_input(dy * w, x)   (unless dy is a widening cast:
 *                                          then w stays, the row kernel loads the 16-bit dy and multiplies)
 *   layer_norm_backward_weight(dy, x)   -> sum(dy * layer_norm(x), all dims but the last)       (sum dy x^)
 *   batch_norm(x[, w[, b]])             -> (x - mean) * rstd [* w + b]   with mean over all dims but 1 and
 *                                          rstd = rsqrt(mean((x - mean)^2) + eps) (two passes: no cancellation)
 *   batch_norm_backward_input(dy, x[, w]) -> (g - mean(g) - x^ * mean(g * x^)) * rstd,  g = dy [* w]
 *   batch_norm_backward_weight(dy, x)   -> sum(dy * x^, all dims but 1)
 *   (gelu_backward stays whole: one visitor functor, gelu_erf_grad / gelu_tanh_grad, where its 15
 *   primitives would hold 15 fragments live in a GEMM epilogue's topological visitor)
 *   threshold_backward(dy, y)           -> where(y > value, dy, 0)
 *   pow(x, e) of a float x, e in {1, 2, 3, -1, -2, 0.5, -0.5}
 *                                       -> x, x*x, x*x*x, reciprocal(x), reciprocal(x*x), sqrt(x), rsqrt(x)
 *                                          (RMSNorm's square and its gradient's pow(x, 1); the visitor has no
 *                                          pow: other exponents stay)
 *   sum / mean / amax(x) over all dims of a float x of rank >= 2
 *                                       -> the same reduction of op(x, last dim): a row reduction, then a
 *                                          vector's (a GEMM epilogue and a row kernel have row reductions,
 *                                          no reduction to a scalar over both dims)
 *   conv2d / conv2d_backward_input / conv2d_backward_weight / max_pool2d / max_pool2d_backward /
 *   avg_pool2d / avg_pool2d_backward / adaptive_max_pool2d / its backward (layout nchw)
 *                                       -> permute(op(permute(a, [0,2,3,1]), ..., layout=nhwc), [0,3,1,2])
 *                                          the paper's channels-last forms (a shape attribute is permuted too;
 *                                          weights [O,C/g,kh,kw] become [O,kh,kw,C/g] by the same permute);
 *                                          the layout pass then cancels the permutes between stages
 * Each rewritten node is replaced by its decomposition; sweeps repeat until none applies. Duplicates (the
 * forward's and the backward's normalization statistics) are left for CSE. Ends with a compaction. */
#include "passes/passes.h"

#include <math.h>

static int scalar_like(evt_graph *g, int at, int x, double v) { return evt_rw_scalar(g, at, g->nodes[x].type.dtype, v); }

/* True when x is a widening cast of a 16-bit tensor to f32 (exact) */
static bool widened(const evt_graph *g, int x) {
  const evt_node *n = &g->nodes[x];
  if (n->op != EVT_OP_CAST || n->ninputs != 1 || n->type.dtype != EVT_F32) return false;
  evt_dtype from = g->nodes[n->inputs[0]].type.dtype;
  return from == EVT_BF16 || from == EVT_F16;
}

/* a per-channel [C] tensor reshaped to broadcast against an [N, C, ...] tensor of rank r */
static int channel(evt_graph *g, int at, int w, int r) {
  if (w < 0) return -1;
  int64_t shape[EVT_MAX_RANK];
  shape[0] = g->nodes[w].type.shape[0];
  for (int i = 1; i < r - 1; i++) shape[i] = 1;
  return evt_rw_reshape(g, at, w, r - 1, shape);
}

/* batch-norm statistics of x [N, C, ...]: x^ and rstd (keepdim shapes). The variance is the mean of the
 * centered squares (two passes over x, as PyTorch's kernels), not E[x^2] - mean^2: a channel whose mean is
 * large against its spread (few elements per channel: a ResNet's last stage at batch 2) loses most of its
 * digits to that cancellation when E[x^2] and mean^2 are rounded to the tensor's dtype. */
static int bn_normalize(evt_graph *g, int at, int x, double eps, int *rstd) {
  int r = g->nodes[x].type.rank, dims[EVT_MAX_RANK], nd = 0;
  for (int i = 0; i < r; i++)
    if (i != 1) dims[nd++] = i;
  int mean = evt_rw_reduce(g, at, EVT_OP_MEAN, x, dims, nd, 1);
  int centered = evt_rw_binary(g, at, EVT_OP_SUB, x, mean);
  int var = evt_rw_reduce(g, at, EVT_OP_MEAN, evt_rw_binary(g, at, EVT_OP_MUL, centered, centered), dims, nd, 1);
  int e = evt_rw_factor(g, at, g->nodes[x].type.dtype, eps);
  *rstd = evt_rw_unary(g, at, EVT_OP_RSQRT, evt_rw_binary(g, at, EVT_OP_ADD, var, e));
  return evt_rw_binary(g, at, EVT_OP_MUL, centered, *rstd);
}

static int layer_norm_plain(evt_graph *g, int at, int x, double eps) {
  evt_attrs a = evt_attrs_default;
  a.eps = eps;
  return evt_rw_op(g, at, EVT_OP_LAYER_NORM, &x, 1, &a, 1ull << EVT_ATTR_EPS);
}

static const evt_ilist to_nhwc = {4, {0, 2, 3, 1}}, to_nchw = {4, {0, 3, 1, 2}};

static int permute4(evt_graph *g, int at, int x, const evt_ilist *p) {
  evt_attrs a = evt_attrs_default;
  a.dims = *p;
  return evt_rw_op(g, at, EVT_OP_PERMUTE, &x, 1, &a, 1ull << EVT_ATTR_DIMS);
}

/* A conv/pool op in NCHW -> its channels-last form between permutes (every operand and the result rank 4). */
static int channels_last(evt_graph *g, int id) {
  const evt_node *n = &g->nodes[id];
  if (n->attr.layout != EVT_LAYOUT_NCHW || n->type.rank != 4) return id;
  int in[EVT_MAX_INPUTS], nin = n->ninputs;
  for (int k = 0; k < nin; k++)
    if (g->nodes[n->inputs[k]].type.rank != 4) return id;
  evt_attrs a = n->attr;
  uint64_t given = n->attr_given | (1ull << EVT_ATTR_LAYOUT);
  evt_op op = n->op;
  a.layout = EVT_LAYOUT_NHWC;
  bool adaptive = op == EVT_OP_ADAPTIVE_MAX_POOL2D || op == EVT_OP_ADAPTIVE_MAX_POOL2D_BACKWARD; /* shape=[Ho,Wo] */
  if (((evt_op_table[op].attrs >> EVT_ATTR_SHAPE) & 1u) && !adaptive) {
    if (a.shape.n != 4) return id;
    for (int i = 0; i < 4; i++) a.shape.v[i] = n->attr.shape.v[to_nhwc.v[i]];
  }
  for (int k = 0; k < nin; k++) in[k] = permute4(g, id, g->nodes[id].inputs[k], &to_nhwc);
  return permute4(g, id, evt_rw_op(g, id, op, in, nin, &a, given), &to_nchw);
}

/* sum / mean / amax over every dim of a float tensor of rank >= 2 -> the same reduction of its last-dim
 * reduction: the inner one is a row reduction (a row kernel's, or a GEMM epilogue's row sum, which have no
 * reduction to a scalar over both tile dims), the outer one a short vector's. (mean: rows are equally long.) */
static int split_full_reduction(evt_graph *g, int id) {
  const evt_node *n = &g->nodes[id];
  evt_op op = n->op;
  evt_type out = n->type;
  int x = n->inputs[0];
  const evt_type *t = &g->nodes[x].type;
  int r = t->rank, last = r - 1;
  if (r < 2 || !evt_dtype_is_float(t->dtype) || t->shape[last] < 2 || evt_type_numel(t) / t->shape[last] < 2) return id;
  unsigned mask = 0;
  if (n->attr.dims.n == 0) mask = (1u << r) - 1;
  for (int i = 0; i < n->attr.dims.n; i++) mask |= 1u << evt_norm_dim(n->attr.dims.v[i], r);
  if (mask != (1u << r) - 1) return id;
  int inner = evt_rw_reduce(g, id, op, x, &last, 1, 0);
  int outer = evt_rw_reduce(g, id, op, inner, NULL, 0, 0);
  return evt_rw_reshape(g, id, outer, out.rank, out.shape); /* (keepdim: [1, ..., 1]) */
}

/* pow(x, e) by the elementwise ops above; id itself for other exponents (and non-float x) */
static int pow_by_scalar(evt_graph *g, int id, int x, double e) {
  if (!evt_dtype_is_float(g->nodes[x].type.dtype)) return id;
  if (e == 1) return x;
  if (e == 2 || e == 3 || e == -2) {
    int sq = evt_rw_binary(g, id, EVT_OP_MUL, x, x);
    if (e == 3) return evt_rw_binary(g, id, EVT_OP_MUL, sq, x);
    return e == 2 ? sq : evt_rw_unary(g, id, EVT_OP_RECIPROCAL, sq);
  }
  if (e == -1) return evt_rw_unary(g, id, EVT_OP_RECIPROCAL, x);
  if (e == 0.5) return evt_rw_unary(g, id, EVT_OP_SQRT, x);
  if (e == -0.5) return evt_rw_unary(g, id, EVT_OP_RSQRT, x);
  return id;
}

static int decompose(evt_graph *g, int id) {
  const evt_node *n = &g->nodes[id];
  int a = n->ninputs > 0 ? n->inputs[0] : -1, b = n->ninputs > 1 ? n->inputs[1] : -1;
  int c = n->ninputs > 2 ? n->inputs[2] : -1;
  double eps = n->attr.eps;
  int r = g->nodes[a >= 0 ? a : id].type.rank;
  switch (n->op) {
  case EVT_OP_LOG_SOFTMAX: {
    evt_attrs sa = evt_attrs_default;
    sa.dim = n->attr.dim;
    return evt_rw_unary(g, id, EVT_OP_LOG, evt_rw_op(g, id, EVT_OP_SOFTMAX, &a, 1, &sa, 1ull << EVT_ATTR_DIM));
  }
  case EVT_OP_LOG_SOFTMAX_BACKWARD: {
    int dim = evt_norm_dim(n->attr.dim, r);
    if (dim < 0) return id;
    const evt_node *y = &g->nodes[b];
    int s = -1;
    if (y->op == EVT_OP_LOG_SOFTMAX && evt_norm_dim(y->attr.dim, r) == dim) {
      evt_attrs sa = evt_attrs_default;
      sa.dim = dim;
      int x = y->inputs[0];
      s = evt_rw_op(g, id, EVT_OP_SOFTMAX, &x, 1, &sa, 1ull << EVT_ATTR_DIM);
    } else if (y->op == EVT_OP_LOG && g->nodes[y->inputs[0]].op == EVT_OP_SOFTMAX &&
               evt_norm_dim(g->nodes[y->inputs[0]].attr.dim, r) == dim) {
      s = y->inputs[0];
    } else {
      s = evt_rw_unary(g, id, EVT_OP_EXP, b);
    }
    int sum = evt_rw_reduce(g, id, EVT_OP_SUM, a, &dim, 1, 1);
    return evt_rw_binary(g, id, EVT_OP_SUB, a, evt_rw_binary(g, id, EVT_OP_MUL, sum, s));
  }
  case EVT_OP_NLL_LOSS_BACKWARD: { /* (dy, lp, t) */
    const evt_type *tl = &g->nodes[b].type;
    if (tl->rank != 2) return id;
    int64_t classes = tl->shape[1];
    evt_dtype dt = tl->dtype;
    int mask, safe;
    int w = evt_ce_parts(g, id, c, a, dt, &mask, &safe);
    int oh = evt_rw_one_hot(g, id, safe, classes, dt);
    return evt_rw_unary(g, id, EVT_OP_NEG, evt_rw_binary(g, id, EVT_OP_MUL, oh, w));
  }
  case EVT_OP_DROPOUT: {
    double p = n->attr.p;
    if (!(p >= 0 && p < 1)) return id;
    evt_attrs ra = evt_attrs_default;
    const evt_type *tx = &g->nodes[a].type;
    ra.shape.n = tx->rank;
    for (int i = 0; i < tx->rank; i++) ra.shape.v[i] = tx->shape[i];
    ra.dtype = EVT_F32;
    ra.seed = n->attr.seed;
    ra.offset = n->attr.offset;
    evt_dtype dt = tx->dtype;
    int u = evt_rw_op(g, id, EVT_OP_RAND, NULL, 0, &ra,
                      (1ull << EVT_ATTR_SHAPE) | (1ull << EVT_ATTR_DTYPE) | (1ull << EVT_ATTR_SEED) | (1ull << EVT_ATTR_OFFSET));
    double thr = ceil(p * 16777216.0) / 16777216.0;
    int keep = evt_rw_cast(g, id, evt_rw_binary(g, id, EVT_OP_GE, u, evt_rw_scalar(g, id, EVT_F32, thr)), dt);
    return evt_rw_binary(g, id, EVT_OP_MUL, evt_rw_binary(g, id, EVT_OP_MUL, a, keep),
                         evt_rw_factor(g, id, dt, 1.0 / (1.0 - p)));
  }
  case EVT_OP_LAYER_NORM: {
    if (n->ninputs == 1) return id;
    int y = evt_rw_binary(g, id, EVT_OP_MUL, layer_norm_plain(g, id, a, eps), b);
    return c >= 0 ? evt_rw_binary(g, id, EVT_OP_ADD, y, c) : y;
  }
  case EVT_OP_LAYER_NORM_BACKWARD_INPUT: {
    /* w stays in the nucleus (the row kernel multiplies dy by it as it loads) where dy is a widening cast: its
     * 16-bit tensor is then read by the kernel (partition rules: CONVERT), where dy * w would be an f32 [M, N]
     * value written by another kernel (bert_large: 64 MB per layer norm) */
    if (n->ninputs < 3 || widened(g, a)) return id;
    int in[2] = {evt_rw_binary(g, id, EVT_OP_MUL, a, c), b};
    evt_attrs at = evt_attrs_default;
    at.eps = eps;
    return evt_rw_op(g, id, EVT_OP_LAYER_NORM_BACKWARD_INPUT, in, 2, &at, 1ull << EVT_ATTR_EPS);
  }
  case EVT_OP_LAYER_NORM_BACKWARD_WEIGHT: {
    int dims[EVT_MAX_RANK];
    for (int i = 0; i < r - 1; i++) dims[i] = i;
    if (r < 2) return id;
    return evt_rw_reduce(g, id, EVT_OP_SUM, evt_rw_binary(g, id, EVT_OP_MUL, a, layer_norm_plain(g, id, b, eps)), dims, r - 1, 0);
  }
  case EVT_OP_BATCH_NORM: {
    if (r < 2) return id;
    int rstd, y = bn_normalize(g, id, a, eps, &rstd);
    if (b >= 0) y = evt_rw_binary(g, id, EVT_OP_MUL, y, channel(g, id, b, r));
    if (c >= 0) y = evt_rw_binary(g, id, EVT_OP_ADD, y, channel(g, id, c, r));
    return y;
  }
  case EVT_OP_BATCH_NORM_BACKWARD_INPUT: { /* (dy, x[, w]) */
    if (r < 2) return id;
    int dims[EVT_MAX_RANK], nd = 0;
    for (int i = 0; i < r; i++)
      if (i != 1) dims[nd++] = i;
    int rstd, xhat = bn_normalize(g, id, b, eps, &rstd);
    int gw = c >= 0 ? evt_rw_binary(g, id, EVT_OP_MUL, a, channel(g, id, c, r)) : a;
    int m1 = evt_rw_reduce(g, id, EVT_OP_MEAN, gw, dims, nd, 1);
    int m2 = evt_rw_reduce(g, id, EVT_OP_MEAN, evt_rw_binary(g, id, EVT_OP_MUL, gw, xhat), dims, nd, 1);
    int centered = evt_rw_binary(g, id, EVT_OP_SUB, evt_rw_binary(g, id, EVT_OP_SUB, gw, m1), evt_rw_binary(g, id, EVT_OP_MUL, xhat, m2));
    return evt_rw_binary(g, id, EVT_OP_MUL, centered, rstd);
  }
  case EVT_OP_BATCH_NORM_BACKWARD_WEIGHT: {
    if (r < 2) return id;
    int dims[EVT_MAX_RANK], nd = 0;
    for (int i = 0; i < r; i++)
      if (i != 1) dims[nd++] = i;
    int rstd, xhat = bn_normalize(g, id, b, eps, &rstd);
    return evt_rw_reduce(g, id, EVT_OP_SUM, evt_rw_binary(g, id, EVT_OP_MUL, a, xhat), dims, nd, 0);
  }
  case EVT_OP_CONV2D:
  case EVT_OP_CONV2D_BACKWARD_INPUT:
  case EVT_OP_CONV2D_BACKWARD_WEIGHT:
  case EVT_OP_MAX_POOL2D:
  case EVT_OP_MAX_POOL2D_BACKWARD:
  case EVT_OP_AVG_POOL2D:
  case EVT_OP_AVG_POOL2D_BACKWARD:
  case EVT_OP_ADAPTIVE_MAX_POOL2D:
  case EVT_OP_ADAPTIVE_MAX_POOL2D_BACKWARD:
    return channels_last(g, id);
  case EVT_OP_SUM:
  case EVT_OP_MEAN:
  case EVT_OP_AMAX:
    return split_full_reduction(g, id);
  case EVT_OP_POW:
    return pow_by_scalar(g, id, a, n->attr.value);
  case EVT_OP_THRESHOLD_BACKWARD: {
    double v = n->attr.value;
    return evt_rw_where(g, id, evt_rw_binary(g, id, EVT_OP_GT, b, scalar_like(g, id, b, v)), a, scalar_like(g, id, a, 0.0));
  }
  default:
    return id;
  }
}

evt_status evt_pass_decompose(evt_graph *g, evt_pass_stats *st) {
  for (int sweep = 0; sweep < 16; sweep++) {
    int changed = 0, n0 = g->nnodes;
    for (int id = 0; id < n0; id++) {
      int r = decompose(g, id);
      if (r < 0) return EVT_ERR_INTERNAL;
      if (r == id) continue;
      if (!evt_type_equal(&g->nodes[r].type, &g->nodes[id].type))
        return evt_graph_errorf(g, id, EVT_ERR_INTERNAL, "decomposition changed the type");
      evt_graph_replace_uses(g, id, r);
      changed++;
    }
    st->rewrites += changed;
    int removed = 0;
    evt_status s = evt_graph_compact(g, &removed);
    st->removed += removed;
    if (s != EVT_OK || !changed) return s;
  }
  return EVT_OK;
}
