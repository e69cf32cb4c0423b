/* Interpreter: elementwise ops. Unary maps (neg ... pow, cast), the two elementwise backward helpers
 * (gelu_backward, threshold_backward), binary arithmetic/comparisons and where. Operands broadcast
 * numpy-style to the node's output shape. NaN propagates (maximum/minimum/relu/sign of NaN give NaN);
 * comparisons with NaN are false except ne. Integer arithmetic is exact: i64 operands are within 2^53, so
 * add/sub/mul give the exact result or one past 2^53 (the dispatcher reports it); i32 wraps as two's
 * complement (products in int64). A float cast to an integer dtype must fit in it. */
#include "runtime/interp/internal.h"

#include <string.h>

#define GELU_K 0.7978845608028654 /* sqrt(2/pi) */
#define GELU_C 0.044715

static double gelu(double x, int64_t approx) {
  if (approx == EVT_APPROXIMATE_TANH) return 0.5 * x * (1.0 + tanh(GELU_K * (x + GELU_C * x * x * x)));
  return 0.5 * x * (1.0 + erf(x * M_SQRT1_2));
}

static double gelu_grad(double x, int64_t approx) {
  if (approx == EVT_APPROXIMATE_TANH) {
    double t = tanh(GELU_K * (x + GELU_C * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_K * (1.0 + 3.0 * GELU_C * x * x);
  }
  double cdf = 0.5 * (1.0 + erf(x * M_SQRT1_2));
  double pdf = exp(-0.5 * x * x) * (0.5 * M_2_SQRTPI * M_SQRT1_2); /* 1/sqrt(2 pi) */
  return cdf + x * pdf;
}

static double sign(double x) {
  if (isnan(x)) return x;
  return x > 0 ? 1.0 : x < 0 ? -1.0 : 0.0;
}

static double unary(evt_op op, const evt_attrs *a, double x) {
  switch (op) {
  case EVT_OP_NEG: return -x;
  case EVT_OP_EXP: return exp(x);
  case EVT_OP_LOG: return log(x);
  case EVT_OP_SQRT: return sqrt(x);
  case EVT_OP_RSQRT: return 1.0 / sqrt(x);
  case EVT_OP_RECIPROCAL: return 1.0 / x;
  case EVT_OP_ABS: return fabs(x);
  case EVT_OP_SIGN: return sign(x);
  case EVT_OP_TANH: return tanh(x);
  case EVT_OP_SIGMOID: return x >= 0 ? 1.0 / (1.0 + exp(-x)) : exp(x) / (1.0 + exp(x));
  case EVT_OP_RELU: return x > 0 || isnan(x) ? x : 0.0;
  case EVT_OP_GELU: return gelu(x, a->approximate);
  case EVT_OP_ERF: return erf(x);
  case EVT_OP_CAST: return x; /* the dispatcher rounds to the target dtype */
  case EVT_OP_POW: return pow(x, a->value);
  default: EVT_UNREACHABLE();
  }
}

static double binary(evt_op op, const evt_attrs *a, double x, double y) {
  switch (op) {
  case EVT_OP_ADD: return x + y;
  case EVT_OP_SUB: return x - y;
  case EVT_OP_MUL: return x * y;
  case EVT_OP_DIV: return x / y;
  case EVT_OP_MAXIMUM: return isnan(x) || isnan(y) ? NAN : x > y ? x : y;
  case EVT_OP_MINIMUM: return isnan(x) || isnan(y) ? NAN : x < y ? x : y;
  case EVT_OP_EQ: return x == y;
  case EVT_OP_NE: return x != y;
  case EVT_OP_LT: return x < y;
  case EVT_OP_LE: return x <= y;
  case EVT_OP_GT: return x > y;
  case EVT_OP_GE: return x >= y;
  case EVT_OP_GELU_BACKWARD: return x * gelu_grad(y, a->approximate);       /* (dy, x) */
  case EVT_OP_THRESHOLD_BACKWARD: return y > a->value ? x : 0.0;            /* (dy, y) */
  default: EVT_UNREACHABLE();
  }
}

/* Visits every output element with the broadcast offsets of up to three operands; the innermost dimension
 * is a plain loop so the common same-shape case costs one pass. */
typedef struct bcast_iter {
  int rank;
  int64_t shape[EVT_MAX_RANK];
  int64_t stride[3][EVT_MAX_RANK];
  int nops;
} bcast_iter;

static bool bcast_init(bcast_iter *it, const evt_tensor *out, const evt_tensor *const *ops, int nops) {
  memset(it, 0, sizeof *it);
  it->rank = out->rank;
  it->nops = nops;
  memcpy(it->shape, out->shape, sizeof it->shape);
  for (int k = 0; k < nops; k++)
    if (!evt_interp_bcast_strides(ops[k], out->rank, out->shape, it->stride[k])) return false;
  return true;
}

/* Runs BODY for every output element e, with a0/a1/a2 the element's offsets in the three operands. */
#define BCAST_FOR(it, out, BODY)                                                                        \
  do {                                                                                                 \
    int64_t idx_[EVT_MAX_RANK] = {0};                                                                  \
    int64_t o0 = 0, o1 = 0, o2 = 0;                                                                    \
    int r_ = (it)->rank;                                                                               \
    int64_t inner_ = r_ ? (it)->shape[r_ - 1] : 1;                                                     \
    int64_t s0_ = r_ ? (it)->stride[0][r_ - 1] : 0, s1_ = r_ ? (it)->stride[1][r_ - 1] : 0;            \
    int64_t s2_ = r_ ? (it)->stride[2][r_ - 1] : 0;                                                    \
    if ((out)->numel == 0) break;                                                                      \
    for (int64_t i_ = 0; i_ < (out)->numel; i_ += inner_) {                                            \
      for (int64_t j_ = 0; j_ < inner_; j_++) {                                                        \
        int64_t e = i_ + j_, a0 = o0 + j_ * s0_, a1 = o1 + j_ * s1_, a2 = o2 + j_ * s2_;               \
        (void)a0; (void)a1; (void)a2;                                                                  \
        BODY;                                                                                          \
      }                                                                                                \
      for (int d_ = r_ - 2; d_ >= 0; d_--) {                                                           \
        idx_[d_]++;                                                                                    \
        o0 += (it)->stride[0][d_]; o1 += (it)->stride[1][d_]; o2 += (it)->stride[2][d_];               \
        if (idx_[d_] < (it)->shape[d_]) break;                                                         \
        o0 -= (it)->stride[0][d_] * idx_[d_]; o1 -= (it)->stride[1][d_] * idx_[d_];                    \
        o2 -= (it)->stride[2][d_] * idx_[d_];                                                          \
        idx_[d_] = 0;                                                                                  \
      }                                                                                                \
    }                                                                                                  \
  } while (0)

/* i32 products: exact in int64 (|x|, |y| <= 2^31), wrapped to 32 bits, which the double of the product may
 * not hold. */
static double mul_i32(double x, double y) { return (double)(int32_t)(uint32_t)(uint64_t)((int64_t)x * (int64_t)y); }

/* A float cast to an integer dtype: the truncated value must fit (PyTorch leaves the rest undefined). */
static evt_status check_int_cast(evt_interp_ctx *ctx) {
  evt_dtype to = ctx->n->type.dtype;
  const evt_tensor *x = ctx->in[0];
  double lo = to == EVT_I32 ? -2147483648.0 : -EVT_INT_EXACT_MAX, hi = to == EVT_I32 ? 2147483647.0 : EVT_INT_EXACT_MAX;
  for (int64_t i = 0; i < x->numel; i++) {
    double v = trunc(x->data[i]);
    if (!(v >= lo && v <= hi))
      return evt_graph_errorf(ctx->g, ctx->id, EVT_ERR_UNSUPPORTED,
                              "%s value %g at element %lld does not fit in %s%s (PyTorch leaves such a cast undefined)",
                              evt_dtype_name(x->dtype), x->data[i], (long long)i, evt_dtype_name(to),
                              to == EVT_I64 ? " exactly as the interpreter holds it, within +-(2^53 - 1)" : "");
  }
  return EVT_OK;
}

evt_status evt_interp_elementwise(evt_interp_ctx *ctx) {
  const evt_node *n = ctx->n;
  evt_tensor *out = ctx->out;
  double *y = out->data;
  bcast_iter it;
  if (!bcast_init(&it, out, ctx->in, n->ninputs)) return interp_fail(ctx, "the operands do not broadcast to the output shape");
  const double *x0 = ctx->in[0]->data;
  const double *x1 = n->ninputs > 1 ? ctx->in[1]->data : NULL;
  const double *x2 = n->ninputs > 2 ? ctx->in[2]->data : NULL;
  if (n->op == EVT_OP_CAST && interp_is_int(out->dtype) && evt_dtype_is_float(ctx->in[0]->dtype)) {
    evt_status st = check_int_cast(ctx);
    if (st != EVT_OK) return st;
  }
  switch (n->op) {
  case EVT_OP_MUL:
    if (out->dtype != EVT_I32) break;
    BCAST_FOR(&it, out, y[e] = mul_i32(x0[a0], x1[a1]));
    return EVT_OK;
  default: break;
  }
/* The cheap ops get a loop of their own (no per-element dispatch); the values are those of unary()/binary(). */
#define EW1(OP, EXPR)                                                  \
  case OP:                                                             \
    BCAST_FOR(&it, out, { double x = x0[a0]; y[e] = (EXPR); });        \
    return EVT_OK;
#define EW2(OP, EXPR)                                                  \
  case OP:                                                             \
    BCAST_FOR(&it, out, { double x = x0[a0]; double z = x1[a1]; y[e] = (EXPR); }); \
    return EVT_OK;
  switch (n->op) {
  EW1(EVT_OP_NEG, -x)
  EW1(EVT_OP_RELU, x > 0 || isnan(x) ? x : 0.0)
  EW2(EVT_OP_ADD, x + z)
  EW2(EVT_OP_SUB, x - z)
  EW2(EVT_OP_MUL, x * z)
  EW2(EVT_OP_DIV, x / z)
  EW2(EVT_OP_GT, x > z)
  EW2(EVT_OP_LT, x < z)
  EW2(EVT_OP_GE, x >= z)
  EW2(EVT_OP_LE, x <= z)
  case EVT_OP_EXP: case EVT_OP_LOG: case EVT_OP_SQRT: case EVT_OP_RSQRT:
  case EVT_OP_RECIPROCAL: case EVT_OP_ABS: case EVT_OP_SIGN: case EVT_OP_TANH: case EVT_OP_SIGMOID:
  case EVT_OP_GELU: case EVT_OP_ERF: case EVT_OP_CAST: case EVT_OP_POW:
    BCAST_FOR(&it, out, y[e] = unary(n->op, &n->attr, x0[a0]));
    return EVT_OK;
  case EVT_OP_WHERE:
    BCAST_FOR(&it, out, y[e] = x0[a0] != 0 ? x1[a1] : x2[a2]);
    return EVT_OK;
  default:
    BCAST_FOR(&it, out, y[e] = binary(n->op, &n->attr, x0[a0], x1[a1]));
    return EVT_OK;
  }
#undef EW1
#undef EW2
}
