/* Vector-Jacobian rules, one case per op (ggml style: one switch).
 *
 * Contract: evt_vjp_apply(c, id, dy) is called once per forward node that has a gradient, with dy of the
 * node's own type. For every input k that needs a gradient (c->needs) it emits nodes of existing ops only
 * and passes a contribution to evt_ad_accumulate; contributions may have the broadcast (user's) shape and
 * the user's dtype, the accumulator reduces and casts. Inputs that do not need a gradient cost nothing.
 * Never hold an evt_node pointer across an emit (the node array may move): rules copy the forward node.
 *
 * Which operands carry gradients (evt_vjp_differentiable_input): floating inputs only, minus the condition
 * of `where`, targets of nll_loss / cross_entropy, indices of embedding / index_select and the CSR
 * arrays of spmm. The float targets of mse_loss and bce_with_logits are differentiated (PyTorch does so).
 * spmm's values operand would need a sampled dense-dense product, which no op expresses: a graph that
 * needs that gradient is rejected (EVT_ERR_UNSUPPORTED) instead of getting a silently wrong zero. */
#include "autodiff/ad.h"

#include <math.h>
#include <string.h>

#define A_BIT(name) (1ull << EVT_ATTR_##name)
#define TRY(v)                   \
  do {                           \
    if ((v) < 0) return c->st;   \
  } while (0)
#define TRY_ST(e)                 \
  do {                            \
    evt_status st_ = (e);         \
    if (st_ != EVT_OK) return st_; \
  } while (0)

/* ---- small builders ---------------------------------------------------------------------------------- */

static const evt_type *type_of(evt_ad *c, int id) { return &c->g->nodes[id].type; }

static int un(evt_ad *c, evt_op op, int x) { return evt_ad_emit(c, op, &x, 1, NULL, 0); }

static int bin(evt_ad *c, evt_op op, int a, int b) {
  if (a < 0 || b < 0) return -1;
  int in[2] = {a, b};
  return evt_ad_emit(c, op, in, 2, NULL, 0);
}

static int scalar(evt_ad *c, evt_dtype dt, double v) {
  evt_attrs a = evt_attrs_default;
  a.shape.n = 0;
  a.dtype = dt;
  a.value = v;
  return evt_ad_emit(c, EVT_OP_SCALAR, NULL, 0, &a, A_BIT(SHAPE) | A_BIT(DTYPE) | A_BIT(VALUE));
}

/* x * v for a constant v (a rank-0 `scalar` of x's dtype). */
static int mul_const(evt_ad *c, int x, double v) {
  if (x < 0) return -1;
  int s = scalar(c, type_of(c, x)->dtype, v);
  return s < 0 ? -1 : bin(c, EVT_OP_MUL, x, s);
}

/* A node copying attributes from `fwd` (those `op` takes), optionally with shape = `shape_of`. */
static int with_attrs(evt_ad *c, evt_op op, const int *in, int nin, const evt_node *fwd, const evt_type *shape_of) {
  evt_attrs a = fwd->attr;
  uint64_t given = fwd->attr_given & evt_op_table[op].attrs;
  if (shape_of) {
    a.shape.n = shape_of->rank;
    for (int i = 0; i < shape_of->rank; i++) a.shape.v[i] = shape_of->shape[i];
    given |= A_BIT(SHAPE);
  }
  return evt_ad_emit(c, op, in, nin, &a, given);
}

static bool same_shape(const evt_type *a, const evt_type *b) {
  if (a->rank != b->rank) return false;
  for (int i = 0; i < a->rank; i++)
    if (a->shape[i] != b->shape[i]) return false;
  return true;
}

static int reshape_to(evt_ad *c, int x, const evt_type *t) {
  if (x < 0) return -1;
  if (same_shape(type_of(c, x), t)) return x;
  evt_attrs a = evt_attrs_default;
  a.shape.n = t->rank;
  for (int i = 0; i < t->rank; i++) a.shape.v[i] = t->shape[i];
  return evt_ad_emit(c, EVT_OP_RESHAPE, &x, 1, &a, A_BIT(SHAPE));
}

static int expand_to(evt_ad *c, int x, const evt_type *t) {
  if (x < 0) return -1;
  if (same_shape(type_of(c, x), t)) return x;
  evt_attrs a = evt_attrs_default;
  a.shape.n = t->rank;
  for (int i = 0; i < t->rank; i++) a.shape.v[i] = t->shape[i];
  return evt_ad_emit(c, EVT_OP_EXPAND, &x, 1, &a, A_BIT(SHAPE));
}

static int cast_to(evt_ad *c, int x, evt_dtype dt) {
  if (x < 0) return -1;
  if (type_of(c, x)->dtype == dt) return x;
  evt_attrs a = evt_attrs_default;
  a.dtype = dt;
  return evt_ad_emit(c, EVT_OP_CAST, &x, 1, &a, A_BIT(DTYPE));
}

static int sum_dims(evt_ad *c, int x, const bool *red, int keepdim) {
  if (x < 0) return -1;
  evt_attrs a = evt_attrs_default;
  const evt_type *t = type_of(c, x);
  a.dims.n = 0;
  for (int i = 0; i < t->rank; i++)
    if (red[i]) a.dims.v[a.dims.n++] = i;
  a.keepdim = keepdim;
  return evt_ad_emit(c, EVT_OP_SUM, &x, 1, &a, A_BIT(DIMS) | (keepdim ? A_BIT(KEEPDIM) : 0));
}

/* Swaps the last two dims; a forward node's transpose is emitted once and shared by all rules. */
static int transpose_last2(evt_ad *c, int x) {
  if (x < 0) return -1;
  if (x < c->nforward && c->transposed[x] >= 0) return c->transposed[x];
  int r = type_of(c, x)->rank;
  evt_attrs a = evt_attrs_default;
  a.dims.n = 2;
  a.dims.v[0] = r - 2;
  a.dims.v[1] = r - 1;
  int t = evt_ad_emit(c, EVT_OP_TRANSPOSE, &x, 1, &a, A_BIT(DIMS));
  if (x < c->nforward) c->transposed[x] = t;
  return t;
}

/* The reduced dims of a sum/mean/amax node over input rank r (empty dims: all; negative: from the end). */
static void reduced_dims(const evt_node *n, int r, bool *red) {
  for (int i = 0; i < r; i++) red[i] = n->attr.dims.n == 0;
  for (int i = 0; i < n->attr.dims.n; i++) {
    int64_t d = n->attr.dims.v[i];
    if (d < 0) d += r;
    if (d >= 0 && d < r) red[d] = true;
  }
}

/* The shape of a reduction's output with keepdim=1. */
static evt_type keepdim_type(const evt_type *x, const bool *red, evt_dtype dt) {
  evt_type k = *x;
  k.dtype = dt;
  for (int i = 0; i < x->rank; i++)
    if (red[i]) k.shape[i] = 1;
  evt_type_set_contiguous(&k);
  return k;
}

/* ---- broadcasting and accumulation -------------------------------------------------------------------- */

/* Reduces d (the user's shape) to the operand type t: sums leading dims and dims where t has size 1, then
 * reshapes and casts. */
static int reduce_to(evt_ad *c, int d, const evt_type *t) {
  const evt_type *dt = type_of(c, d);
  int R = dt->rank, off = R - t->rank;
  EVT_ASSERT(off >= 0);
  bool red[EVT_MAX_RANK] = {0};
  bool lead = false, ones = false;
  for (int i = 0; i < R; i++) {
    if (i < off) red[i] = lead = true;
    else if (t->shape[i - off] == 1 && dt->shape[i] != 1) red[i] = ones = true;
  }
  int r = d;
  if (lead || ones) r = sum_dims(c, d, red, ones ? 1 : 0);
  r = reshape_to(c, r, t);
  return cast_to(c, r, t->dtype);
}

evt_status evt_ad_accumulate(evt_ad *c, int operand, int contrib) {
  if (contrib < 0) return c->st;
  if (!c->needs[operand]) return EVT_OK;
  evt_type t = *type_of(c, operand);
  int r = reduce_to(c, contrib, &t);
  TRY(r);
  if (c->grad[operand] < 0) {
    c->grad[operand] = r;
    return EVT_OK;
  }
  int s = bin(c, EVT_OP_ADD, c->grad[operand], r);
  TRY(s);
  c->grad[operand] = s;
  return EVT_OK;
}

/* ---- which operands carry gradients ------------------------------------------------------------------ */

bool evt_vjp_differentiable_input(const evt_graph *g, const evt_node *n, int k) {
  if (!evt_dtype_is_float(g->nodes[n->inputs[k]].type.dtype)) return false;
  switch (n->op) {
  case EVT_OP_WHERE: return k != 0;
  case EVT_OP_NLL_LOSS:
  case EVT_OP_CROSS_ENTROPY:
  case EVT_OP_EMBEDDING:
  case EVT_OP_INDEX_SELECT:
  case EVT_OP_INDEX_SELECT_BACKWARD: return k == 0;
  case EVT_OP_SPMM: return k >= 2;
  default: return true;
  }
}

/* ---- the rules ---------------------------------------------------------------------------------------- */

#define NEED(k) (c->needs[n.inputs[k]])
#define IN(k) (n.inputs[k])
#define ACC(k, v) TRY_ST(NEED(k) ? evt_ad_accumulate(c, IN(k), (v)) : EVT_OK)

static evt_status vjp_reduce(evt_ad *c, const evt_node *np, int id, int dy) {
  evt_node n = *np;
  const evt_type x = *type_of(c, IN(0));
  bool red[EVT_MAX_RANK];
  reduced_dims(&n, x.rank, red);
  evt_type kt = keepdim_type(&x, red, type_of(c, dy)->dtype);
  /* dy broadcasts against x as it is when the reduced dims are leading (or kept); else restore them as 1s */
  bool prefix = true;
  for (int i = 1; i < x.rank; i++)
    if (red[i] && !red[i - 1]) prefix = false;
  int dyk = n.attr.keepdim || prefix ? dy : reshape_to(c, dy, &kt);
  TRY(dyk);
  switch (n.op) {
  case EVT_OP_SUM: ACC(0, expand_to(c, dyk, &x)); break;
  case EVT_OP_MEAN: {
    int64_t cnt = 1;
    for (int i = 0; i < x.rank; i++)
      if (red[i]) cnt *= x.shape[i];
    ACC(0, expand_to(c, mul_const(c, dyk, 1.0 / (double)(cnt ? cnt : 1)), &x));
    break;
  }
  case EVT_OP_AMAX: {
    /* d x = dy * mask / count(mask): the gradient is split evenly among the maxima */
    int yk = n.attr.keepdim || prefix ? id : reshape_to(c, id, &kt);
    int mask = cast_to(c, bin(c, EVT_OP_EQ, IN(0), yk), x.dtype);
    TRY(mask);
    int cnt = sum_dims(c, mask, red, 1);
    ACC(0, bin(c, EVT_OP_DIV, bin(c, EVT_OP_MUL, mask, dyk), cnt));
    break;
  }
  default: EVT_UNREACHABLE();
  }
  return EVT_OK;
}

/* maximum / minimum: the winner takes dy; on ties each operand takes dy / 2 (as PyTorch). */
static evt_status vjp_minmax(evt_ad *c, const evt_node *np, int dy) {
  evt_node n = *np;
  evt_dtype dt = type_of(c, dy)->dtype;
  int zero = scalar(c, dt, 0.0);
  TRY(zero);
  int eq = bin(c, EVT_OP_EQ, IN(0), IN(1));
  int half = mul_const(c, dy, 0.5);
  TRY(eq);
  TRY(half);
  int in_eq[3] = {eq, half, zero};
  int split = evt_ad_emit(c, EVT_OP_WHERE, in_eq, 3, NULL, 0);
  TRY(split);
  evt_op win0 = n.op == EVT_OP_MAXIMUM ? EVT_OP_GT : EVT_OP_LT;
  evt_op win1 = n.op == EVT_OP_MAXIMUM ? EVT_OP_LT : EVT_OP_GT;
  for (int k = 0; k < 2; k++) {
    if (!NEED(k)) continue;
    int cmp = bin(c, k == 0 ? win0 : win1, IN(0), IN(1));
    TRY(cmp);
    int in_w[3] = {cmp, dy, zero};
    int w = evt_ad_emit(c, EVT_OP_WHERE, in_w, 3, NULL, 0);
    ACC(k, bin(c, EVT_OP_ADD, w, split));
  }
  return EVT_OK;
}

/* layer_norm / batch_norm: (x, [w, [b]]). */
static evt_status vjp_norm(evt_ad *c, const evt_node *np, int dy) {
  evt_node n = *np;
  bool layer = n.op == EVT_OP_LAYER_NORM;
  if (NEED(0)) {
    int in[3] = {dy, IN(0), n.ninputs > 1 ? IN(1) : -1};
    evt_op op = layer ? EVT_OP_LAYER_NORM_BACKWARD_INPUT : EVT_OP_BATCH_NORM_BACKWARD_INPUT;
    ACC(0, with_attrs(c, op, in, n.ninputs > 1 ? 3 : 2, &n, NULL));
  }
  if (n.ninputs > 1 && NEED(1)) {
    int in[2] = {dy, IN(0)};
    evt_op op = layer ? EVT_OP_LAYER_NORM_BACKWARD_WEIGHT : EVT_OP_BATCH_NORM_BACKWARD_WEIGHT;
    ACC(1, with_attrs(c, op, in, 2, &n, NULL));
  }
  if (n.ninputs > 2 && NEED(2)) {
    const evt_type *x = type_of(c, IN(0));
    bool red[EVT_MAX_RANK];
    for (int i = 0; i < x->rank; i++) red[i] = layer ? i != x->rank - 1 : i != 1;
    ACC(2, sum_dims(c, dy, red, 0));
  }
  return EVT_OK;
}

static evt_status vjp_loss(evt_ad *c, const evt_node *np, int dy) {
  evt_node n = *np;
  switch (n.op) {
  case EVT_OP_NLL_LOSS: {
    int in[3] = {dy, IN(0), IN(1)};
    ACC(0, with_attrs(c, EVT_OP_NLL_LOSS_BACKWARD, in, 3, &n, NULL));
    break;
  }
  case EVT_OP_CROSS_ENTROPY: {
    /* log_softmax over the class dim, then nll_loss */
    if (!NEED(0)) break;
    evt_attrs a = evt_attrs_default;
    a.dim = type_of(c, IN(0))->rank == 1 ? 0 : 1;
    int ls = evt_ad_emit(c, EVT_OP_LOG_SOFTMAX, &IN(0), 1, &a, A_BIT(DIM));
    TRY(ls);
    int in[3] = {dy, ls, IN(1)};
    int dls = with_attrs(c, EVT_OP_NLL_LOSS_BACKWARD, in, 3, &n, NULL);
    TRY(dls);
    int in2[2] = {dls, ls};
    ACC(0, evt_ad_emit(c, EVT_OP_LOG_SOFTMAX_BACKWARD, in2, 2, &a, A_BIT(DIM)));
    break;
  }
  case EVT_OP_BCE_WITH_LOGITS: {
    int in[3] = {dy, IN(0), IN(1)};
    ACC(0, with_attrs(c, EVT_OP_BCE_WITH_LOGITS_BACKWARD, in, 3, &n, NULL));
    if (NEED(1)) {
      /* d/dy of x - x*y + log(1 + exp(-x)) is -x, times the reduction's scale */
      int t = un(c, EVT_OP_NEG, bin(c, EVT_OP_MUL, IN(0), dy));
      if (n.attr.reduction == EVT_REDUCTION_MEAN) {
        evt_type b;
        if (!evt_broadcast_shapes(type_of(c, IN(0)), type_of(c, IN(1)), &b)) EVT_UNREACHABLE();
        int64_t cnt = evt_type_numel(&b);
        t = mul_const(c, t, 1.0 / (double)(cnt ? cnt : 1));
      }
      ACC(1, t);
    }
    break;
  }
  case EVT_OP_MSE_LOSS: {
    int in[3] = {dy, IN(0), IN(1)};
    int da = with_attrs(c, EVT_OP_MSE_LOSS_BACKWARD, in, 3, &n, NULL);
    TRY(da);
    ACC(0, da);
    ACC(1, un(c, EVT_OP_NEG, da));
    break;
  }
  default: EVT_UNREACHABLE();
  }
  return EVT_OK;
}

/* One switch over every op, a line or two each (longer rules are the functions above): -Werror=switch keeps it
 * complete when ops.def grows, which a dispatch through per-family functions would not. */
evt_status evt_vjp_apply(evt_ad *c, int id, int dy) {
  const evt_node n = c->g->nodes[id];
  const evt_type x = n.ninputs > 0 ? *type_of(c, IN(0)) : n.type;
  switch (n.op) {
  /* ---- elementwise unary */
  case EVT_OP_NEG: ACC(0, un(c, EVT_OP_NEG, dy)); break;
  case EVT_OP_EXP: ACC(0, bin(c, EVT_OP_MUL, dy, id)); break;
  case EVT_OP_LOG: ACC(0, bin(c, EVT_OP_DIV, dy, IN(0))); break;
  case EVT_OP_SQRT: ACC(0, bin(c, EVT_OP_DIV, mul_const(c, dy, 0.5), id)); break;
  case EVT_OP_RSQRT: { /* d x^-1/2 = -1/2 y^3 */
    evt_attrs a = evt_attrs_default;
    a.value = 3.0;
    int y3 = evt_ad_emit(c, EVT_OP_POW, &id, 1, &a, A_BIT(VALUE));
    ACC(0, bin(c, EVT_OP_MUL, dy, mul_const(c, y3, -0.5)));
    break;
  }
  case EVT_OP_RECIPROCAL: ACC(0, un(c, EVT_OP_NEG, bin(c, EVT_OP_MUL, dy, bin(c, EVT_OP_MUL, id, id)))); break;
  case EVT_OP_ABS: ACC(0, bin(c, EVT_OP_MUL, dy, un(c, EVT_OP_SIGN, IN(0)))); break;
  case EVT_OP_SIGN: break; /* zero almost everywhere: no contribution */
  case EVT_OP_TANH: {
    int one = scalar(c, n.type.dtype, 1.0);
    ACC(0, bin(c, EVT_OP_MUL, dy, bin(c, EVT_OP_SUB, one, bin(c, EVT_OP_MUL, id, id))));
    break;
  }
  case EVT_OP_SIGMOID: {
    int one = scalar(c, n.type.dtype, 1.0);
    ACC(0, bin(c, EVT_OP_MUL, dy, bin(c, EVT_OP_MUL, id, bin(c, EVT_OP_SUB, one, id))));
    break;
  }
  case EVT_OP_RELU: {
    int in[2] = {dy, id};
    evt_attrs a = evt_attrs_default;
    a.value = 0.0;
    ACC(0, evt_ad_emit(c, EVT_OP_THRESHOLD_BACKWARD, in, 2, &a, A_BIT(VALUE)));
    break;
  }
  case EVT_OP_GELU: {
    int in[2] = {dy, IN(0)};
    ACC(0, with_attrs(c, EVT_OP_GELU_BACKWARD, in, 2, &n, NULL));
    break;
  }
  case EVT_OP_ERF: { /* 2/sqrt(pi) exp(-x^2) */
    int e = un(c, EVT_OP_EXP, un(c, EVT_OP_NEG, bin(c, EVT_OP_MUL, IN(0), IN(0))));
    ACC(0, bin(c, EVT_OP_MUL, dy, mul_const(c, e, 2.0 / sqrt(M_PI))));
    break;
  }
  case EVT_OP_CAST: ACC(0, cast_to(c, dy, x.dtype)); break;
  case EVT_OP_POW: {
    double p = n.attr.value;
    if (p == 0.0) break;
    if (p == 1.0) {
      ACC(0, dy);
      break;
    }
    int xp = IN(0);
    if (p != 2.0) {
      evt_attrs a = evt_attrs_default;
      a.value = p - 1.0;
      xp = evt_ad_emit(c, EVT_OP_POW, &IN(0), 1, &a, A_BIT(VALUE));
    }
    ACC(0, bin(c, EVT_OP_MUL, dy, mul_const(c, xp, p)));
    break;
  }

  /* ---- elementwise binary and select */
  case EVT_OP_ADD:
    ACC(0, dy);
    ACC(1, dy);
    break;
  case EVT_OP_SUB:
    ACC(0, dy);
    ACC(1, un(c, EVT_OP_NEG, dy));
    break;
  case EVT_OP_MUL:
    ACC(0, bin(c, EVT_OP_MUL, dy, IN(1)));
    ACC(1, bin(c, EVT_OP_MUL, dy, IN(0)));
    break;
  case EVT_OP_DIV: /* y = a / b: da = dy / b, db = -dy * y / b */
    ACC(0, bin(c, EVT_OP_DIV, dy, IN(1)));
    ACC(1, un(c, EVT_OP_NEG, bin(c, EVT_OP_DIV, bin(c, EVT_OP_MUL, dy, id), IN(1))));
    break;
  case EVT_OP_MAXIMUM:
  case EVT_OP_MINIMUM: return vjp_minmax(c, &n, dy);
  case EVT_OP_WHERE: {
    int zero = scalar(c, type_of(c, dy)->dtype, 0.0);
    TRY(zero);
    if (NEED(1)) {
      int in[3] = {IN(0), dy, zero};
      ACC(1, evt_ad_emit(c, EVT_OP_WHERE, in, 3, NULL, 0));
    }
    if (NEED(2)) {
      int in[3] = {IN(0), zero, dy};
      ACC(2, evt_ad_emit(c, EVT_OP_WHERE, in, 3, NULL, 0));
    }
    break;
  }

  /* ---- reductions */
  case EVT_OP_SUM:
  case EVT_OP_MEAN:
  case EVT_OP_AMAX: return vjp_reduce(c, &n, id, dy);

  /* ---- matrix products */
  case EVT_OP_MM:
  case EVT_OP_BMM: {
    evt_op op = n.op;
    /* out_dtype=f32 on 16-bit operands: the gradient GEMMs run on the operands' dtype (what PyTorch's
     * autocast backward does: the cotangent of a 16-bit product is 16-bit) */
    dy = cast_to(c, dy, type_of(c, IN(0))->dtype);
    ACC(0, bin(c, op, dy, transpose_last2(c, IN(1))));
    ACC(1, bin(c, op, transpose_last2(c, IN(0)), dy));
    break;
  }
  case EVT_OP_ADDMM:
    ACC(0, dy);
    ACC(1, bin(c, EVT_OP_MM, dy, transpose_last2(c, IN(2))));
    ACC(2, bin(c, EVT_OP_MM, transpose_last2(c, IN(1)), dy));
    break;
  case EVT_OP_SPMM:
    if (NEED(2))
      return evt_graph_errorf(c->g, id, EVT_ERR_UNSUPPORTED,
                              "the gradient with respect to the sparse values %%%s is not supported",
                              c->g->nodes[IN(2)].name);
    if (NEED(3)) {
      int in[4] = {IN(0), IN(1), IN(2), dy};
      ACC(3, with_attrs(c, EVT_OP_SPMM_T, in, 4, &n, type_of(c, IN(3))));
    }
    break;

  /* ---- convolution and pooling */
  case EVT_OP_CONV2D:
    if (NEED(0)) {
      int in[2] = {dy, IN(1)};
      ACC(0, with_attrs(c, EVT_OP_CONV2D_BACKWARD_INPUT, in, 2, &n, type_of(c, IN(0))));
    }
    if (NEED(1)) {
      int in[2] = {IN(0), dy};
      ACC(1, with_attrs(c, EVT_OP_CONV2D_BACKWARD_WEIGHT, in, 2, &n, type_of(c, IN(1))));
    }
    break;
  case EVT_OP_MAX_POOL2D: {
    int in[2] = {dy, IN(0)};
    ACC(0, with_attrs(c, EVT_OP_MAX_POOL2D_BACKWARD, in, 2, &n, NULL));
    break;
  }
  case EVT_OP_ADAPTIVE_MAX_POOL2D: {
    int in[2] = {dy, IN(0)};
    ACC(0, with_attrs(c, EVT_OP_ADAPTIVE_MAX_POOL2D_BACKWARD, in, 2, &n, NULL));
    break;
  }
  case EVT_OP_AVG_POOL2D: ACC(0, with_attrs(c, EVT_OP_AVG_POOL2D_BACKWARD, &dy, 1, &n, &x)); break;

  /* ---- row ops */
  case EVT_OP_SOFTMAX:
  case EVT_OP_LOG_SOFTMAX: {
    int in[2] = {dy, id};
    evt_op op = n.op == EVT_OP_SOFTMAX ? EVT_OP_SOFTMAX_BACKWARD : EVT_OP_LOG_SOFTMAX_BACKWARD;
    ACC(0, with_attrs(c, op, in, 2, &n, NULL));
    break;
  }
  case EVT_OP_LAYER_NORM:
  case EVT_OP_BATCH_NORM: return vjp_norm(c, &n, dy);

  /* ---- randomness: the same mask, the same scale */
  case EVT_OP_DROPOUT: ACC(0, with_attrs(c, EVT_OP_DROPOUT, &dy, 1, &n, NULL)); break;

  /* ---- losses */
  case EVT_OP_NLL_LOSS:
  case EVT_OP_CROSS_ENTROPY:
  case EVT_OP_BCE_WITH_LOGITS:
  case EVT_OP_MSE_LOSS: return vjp_loss(c, &n, dy);

  /* ---- gathers */
  case EVT_OP_EMBEDDING: {
    int in[2] = {dy, IN(1)};
    ACC(0, with_attrs(c, EVT_OP_EMBEDDING_BACKWARD, in, 2, &n, &x));
    break;
  }
  case EVT_OP_INDEX_SELECT: {
    int in[2] = {dy, IN(1)};
    ACC(0, with_attrs(c, EVT_OP_INDEX_SELECT_BACKWARD, in, 2, &n, &x));
    break;
  }
  case EVT_OP_INDEX_SELECT_BACKWARD: { /* a scatter-add (message passing's aggregation): its VJP gathers */
    int in[2] = {dy, IN(1)};
    ACC(0, with_attrs(c, EVT_OP_INDEX_SELECT, in, 2, &n, NULL));
    break;
  }

  /* ---- layout */
  case EVT_OP_RESHAPE:
  case EVT_OP_SQUEEZE:
  case EVT_OP_UNSQUEEZE: ACC(0, reshape_to(c, dy, &x)); break;
  case EVT_OP_PERMUTE: {
    evt_attrs a = evt_attrs_default;
    a.dims.n = n.attr.dims.n;
    for (int i = 0; i < n.attr.dims.n; i++) {
      int64_t d = n.attr.dims.v[i];
      if (d < 0) d += x.rank;
      EVT_ASSERT(d >= 0 && d < n.attr.dims.n);
      a.dims.v[d] = i;
    }
    ACC(0, evt_ad_emit(c, EVT_OP_PERMUTE, &dy, 1, &a, A_BIT(DIMS)));
    break;
  }
  case EVT_OP_TRANSPOSE: ACC(0, with_attrs(c, EVT_OP_TRANSPOSE, &dy, 1, &n, NULL)); break;
  case EVT_OP_EXPAND: ACC(0, dy); break; /* the accumulator sums the expanded dims */
  case EVT_OP_SLICE: ACC(0, with_attrs(c, EVT_OP_SLICE_BACKWARD, &dy, 1, &n, &x)); break;
  case EVT_OP_CONCAT: {
    int64_t d = n.attr.dim < 0 ? n.attr.dim + x.rank : n.attr.dim, off = 0;
    for (int k = 0; k < n.ninputs; k++) {
      int64_t size = type_of(c, IN(k))->shape[d];
      if (NEED(k)) {
        evt_attrs a = evt_attrs_default;
        a.dim = d;
        a.start = off;
        a.end = off + size;
        ACC(k, evt_ad_emit(c, EVT_OP_SLICE, &dy, 1, &a, A_BIT(DIM) | A_BIT(START) | A_BIT(END)));
      }
      off += size;
    }
    break;
  }

  /* ---- attention */
  case EVT_OP_SDPA: {
    /* The backward ops take the forward's mask; a bool mask has no gradient (not differentiable), a float one
     * that depends on a parameter is refused: evt has no op for the mask's gradient (dS summed over its
     * broadcast dims). */
    if (n.ninputs > 3 && NEED(3))
      return evt_graph_errorf(c->g, id, EVT_ERR_UNSUPPORTED,
                              "sdpa: no gradient for a float mask that depends on a parameter; the mask must be constant");
    int in[5] = {dy, IN(0), IN(1), IN(2), n.ninputs > 3 ? IN(3) : -1};
    int nin = n.ninputs + 1;
    ACC(0, with_attrs(c, EVT_OP_SDPA_BACKWARD_Q, in, nin, &n, NULL));
    ACC(1, with_attrs(c, EVT_OP_SDPA_BACKWARD_K, in, nin, &n, NULL));
    ACC(2, with_attrs(c, EVT_OP_SDPA_BACKWARD_V, in, nin, &n, NULL));
    break;
  }

  /* ---- no rule: sources end the walk, the rest is rejected by the driver before any rule runs */
  case EVT_OP_INPUT:
  case EVT_OP_PARAM:
  case EVT_OP_FULL:
  case EVT_OP_SCALAR:
  case EVT_OP_RAND: break;
  case EVT_OP_GELU_BACKWARD:
  case EVT_OP_THRESHOLD_BACKWARD:
  case EVT_OP_EQ:
  case EVT_OP_NE:
  case EVT_OP_LT:
  case EVT_OP_LE:
  case EVT_OP_GT:
  case EVT_OP_GE:
  case EVT_OP_SPMM_T:
  case EVT_OP_CONV2D_BACKWARD_INPUT:
  case EVT_OP_CONV2D_BACKWARD_WEIGHT:
  case EVT_OP_MAX_POOL2D_BACKWARD:
  case EVT_OP_ADAPTIVE_MAX_POOL2D_BACKWARD:
  case EVT_OP_AVG_POOL2D_BACKWARD:
  case EVT_OP_SOFTMAX_BACKWARD:
  case EVT_OP_LOG_SOFTMAX_BACKWARD:
  case EVT_OP_LAYER_NORM_BACKWARD_INPUT:
  case EVT_OP_LAYER_NORM_BACKWARD_WEIGHT:
  case EVT_OP_BATCH_NORM_BACKWARD_INPUT:
  case EVT_OP_BATCH_NORM_BACKWARD_WEIGHT:
  case EVT_OP_NLL_LOSS_BACKWARD:
  case EVT_OP_BCE_WITH_LOGITS_BACKWARD:
  case EVT_OP_MSE_LOSS_BACKWARD:
  case EVT_OP_ONE_HOT:
  case EVT_OP_EMBEDDING_BACKWARD:
  case EVT_OP_COO_PERM:
  case EVT_OP_COO_ROWPTR:
  case EVT_OP_SLICE_BACKWARD:
  case EVT_OP_SDPA_BACKWARD_Q:
  case EVT_OP_SDPA_BACKWARD_K:
  case EVT_OP_SDPA_BACKWARD_V:
  case EVT_OP_COUNT:
    return evt_graph_errorf(c->g, id, EVT_ERR_UNSUPPORTED, "no gradient rule for %s", evt_op_table[n.op].name);
  }
  return EVT_OK;
}
