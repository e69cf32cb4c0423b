/* Elementwise ops with numpy broadcasting, sources (full, scalar, rand, dropout), and the in-place updates of a
 * training step (SGD, the RNG step). */
#include "internal.h"

#include "philox.h"

#define GELU_K 0.7978845608028654
#define GELU_C 0.044715

static __device__ double gelu(double x, int tanh_) {
  if (tanh_) return 0.5 * x * (1.0 + tanh(GELU_K * (x + GELU_C * x * x * x)));
  return 0.5 * x * (1.0 + erf(x * M_SQRT1_2));
}

static __device__ double gelu_grad(double x, int tanh_) {
  if (tanh_) {
    double t = tanh(GELU_K * (x + GELU_C * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_K * (1.0 + 3.0 * GELU_C * x * x);
  }
  double cdf = 0.5 * (1.0 + erf(x * M_SQRT1_2));
  double pdf = exp(-0.5 * x * x) * (0.5 * M_2_SQRTPI * M_SQRT1_2);
  return cdf + x * pdf;
}

static __device__ double ew(int op, const evt_fb_attrs &a, double x, double y, double z) {
  switch (op) {
  case EVT_FB_OP_NEG: return -x;
  case EVT_FB_OP_EXP: return exp(x);
  case EVT_FB_OP_LOG: return log(x);
  case EVT_FB_OP_SQRT: return sqrt(x);
  case EVT_FB_OP_RSQRT: return 1.0 / sqrt(x);
  case EVT_FB_OP_RECIPROCAL: return 1.0 / x;
  case EVT_FB_OP_ABS: return fabs(x);
  case EVT_FB_OP_SIGN: return isnan(x) ? x : x > 0 ? 1.0 : x < 0 ? -1.0 : 0.0;
  case EVT_FB_OP_TANH: return tanh(x);
  case EVT_FB_OP_SIGMOID: return x >= 0 ? 1.0 / (1.0 + exp(-x)) : exp(x) / (1.0 + exp(x));
  case EVT_FB_OP_RELU: return x > 0 || isnan(x) ? x : 0.0;
  case EVT_FB_OP_GELU: return gelu(x, a.approx_tanh);
  case EVT_FB_OP_ERF: return erf(x);
  case EVT_FB_OP_CAST: return x;
  case EVT_FB_OP_POW: return pow(x, a.value);
  case EVT_FB_OP_ADD: return x + y;
  case EVT_FB_OP_SUB: return x - y;
  case EVT_FB_OP_MUL: return x * y;
  case EVT_FB_OP_DIV: return x / y;
  case EVT_FB_OP_MAXIMUM: return isnan(x) || isnan(y) ? (double)NAN : x > y ? x : y;
  case EVT_FB_OP_MINIMUM: return isnan(x) || isnan(y) ? (double)NAN : x < y ? x : y;
  case EVT_FB_OP_EQ: return x == y;
  case EVT_FB_OP_NE: return x != y;
  case EVT_FB_OP_LT: return x < y;
  case EVT_FB_OP_LE: return x <= y;
  case EVT_FB_OP_GT: return x > y;
  case EVT_FB_OP_GE: return x >= y;
  case EVT_FB_OP_GELU_BACKWARD: return x * gelu_grad(y, a.approx_tanh);
  case EVT_FB_OP_THRESHOLD_BACKWARD: return y > a.value ? x : 0.0;
  case EVT_FB_OP_WHERE: return x != 0 ? y : z;
  default: return NAN;
  }
}

/* Operand offsets: the element's index is decomposed once for all operands (64-bit divisions dominate
 * this kernel); `dense` bit k: operand k is laid out like the output (offset e, no division). */
__global__ void k_elementwise(double *S, ll n, int op, evt_fb_attrs a, shape_t sh, int nin, tv x0, tv x1, tv x2,
                              strides s0, strides s1, strides s2, int dense) {
  GRID_FOR(e, n) {
    ll o0 = e, o1 = e, o2 = e;
    if (dense != (1 << nin) - 1) {
      ll r = e, q0 = 0, q1 = 0, q2 = 0;
      for (int d = sh.rank - 1; d >= 0; d--) {
        ll i = r % sh.d[d];
        r /= sh.d[d];
        q0 += i * s0.s[d], q1 += i * s1.s[d], q2 += i * s2.s[d];
      }
      if (!(dense & 1)) o0 = q0;
      if (!(dense & 2)) o1 = q1;
      if (!(dense & 4)) o2 = q2;
    }
    double x = ld(x0.p, x0.dt, o0);
    double y = nin > 1 ? ld(x1.p, x1.dt, o1) : 0;
    double z = nin > 2 ? ld(x2.p, x2.dt, o2) : 0;
    S[e] = ew(op, a, x, y, z);
  }
}

__global__ void k_fill(double *S, ll n, double v) {
  GRID_FOR(e, n) S[e] = v;
}

/* full / scalar stored in the output's dtype directly: the same st() of the same value as k_fill + k_finish, without
 * the double scratch (HF BERT's safe-softmax zeros: 100M elements a layer) */
__global__ void k_fill_native(void *out, int dt, ll n, double v) {
  GRID_FOR(e, n) st(out, dt, e, v);
}

int fb_fill_native(evt_fb_ctx *ctx, const evt_fb_node *nd, char *err, size_t errlen) {
  if (nd->op != EVT_FB_OP_FULL && nd->op != EVT_FB_OP_SCALAR) return -1;
  if (nd->out.numel == 0) return 0;
  k_fill_native<<<blocks(nd->out.numel), 256, 0, ST>>>(nd->out.ptr, nd->out.dtype, nd->out.numel, nd->a.value);
  CK(cudaGetLastError());
  return 0;
}

__global__ void k_rand(double *S, ll n, evt_fb_attrs a, tv x, int dropout) {
  double scale = a.p < 1 ? 1.0 / (1.0 - a.p) : 0.0;
  const uint64_t step = a.rng_step ? *a.rng_step : 0;
  GRID_FOR(e, n) {
    double u = (double)evt_philox_uniform((uint64_t)a.seed, (uint64_t)a.offset, step, (uint64_t)e);
    if (!dropout) S[e] = u;
    else S[e] = ld(x.p, x.dt, e) * (a.p < 1 && u >= a.p ? 1.0 : 0.0) * scale;
  }
}

/* p -= lr * g in double, rounded to p's dtype (evt_train_sgd_update's arithmetic) */
__global__ void k_sgd(void *p, int pdt, tv g, double lr, ll n) {
  GRID_FOR(e, n) st(p, pdt, e, ld(p, pdt, e) - lr * ld(g.p, g.dt, e));
}

__global__ void k_rng_step(unsigned long long *step, unsigned long long value, int set) {
  *step = set ? value : *step + 1;
}

int fb_source(evt_fb_ctx *ctx, const evt_fb_node *nd, double *S, char *err, size_t errlen) {
  const evt_fb_attrs &a = nd->a;
  ll n = nd->out.numel;
  if (nd->op == EVT_FB_OP_FULL || nd->op == EVT_FB_OP_SCALAR) {
    k_fill<<<blocks(n), 256, 0, ST>>>(S, n, a.value);
    return 0;
  }
  bool dropout = nd->op == EVT_FB_OP_DROPOUT;
  if (dropout && !(a.p >= 0 && a.p <= 1)) UNSUPPORTED("dropout p is not in [0, 1]");
  k_rand<<<blocks(n), 256, 0, ST>>>(S, n, a, dropout ? view(nd->in[0]) : NO_TENSOR, dropout);
  return 0;
}

int fb_elementwise(evt_fb_ctx *ctx, const evt_fb_node *nd, double *S, char *err, size_t errlen) {
  const evt_fb_tensor &out = nd->out;
  const evt_fb_tensor *in = nd->in;
  strides s[3];
  memset(s, 0, sizeof s);
  for (int k = 0; k < nd->ninputs; k++)
    if (!bcast(in[k], out, &s[k])) UNSUPPORTED("the operands do not broadcast to the output shape");
  int dense = 0;
  for (int k = 0; k < nd->ninputs; k++) {
    bool same = true;
    ll cs = 1;
    for (int d = out.rank - 1; d >= 0; d--) {
      if (out.shape[d] > 1 && s[k].s[d] != cs) same = false;
      cs *= out.shape[d];
    }
    if (same) dense |= 1 << k;
  }
  k_elementwise<<<blocks(out.numel), 256, 0, ST>>>(S, out.numel, nd->op, nd->a, shape_of(out), nd->ninputs,
                                                   view(in[0]), nd->ninputs > 1 ? view(in[1]) : NO_TENSOR,
                                                   nd->ninputs > 2 ? view(in[2]) : NO_TENSOR, s[0], s[1], s[2], dense);
  return 0;
}

extern "C" int evt_fb_sgd(const evt_fb_tensor *p, const evt_fb_tensor *g, double lr, void *stream, char *err,
                          size_t errlen) {
  if (p->numel != g->numel) {
    snprintf(err, errlen, "sgd: the param has %lld elements, its gradient %lld", (long long)p->numel,
             (long long)g->numel);
    return 1;
  }
  if (!is_float_dtype(p->dtype)) return 0; /* (not trained) */
  if (p->numel > 0) {
    k_sgd<<<blocks(p->numel), 256, 0, (cudaStream_t)stream>>>(p->ptr, p->dtype, view(*g), lr, p->numel);
    CK(cudaGetLastError());
  }
  return 0;
}

extern "C" int evt_fb_rng_step(unsigned long long *step, unsigned long long value, int set, void *stream, char *err,
                               size_t errlen) {
  k_rng_step<<<1, 1, 0, (cudaStream_t)stream>>>(step, value, set);
  CK(cudaGetLastError());
  return 0;
}
