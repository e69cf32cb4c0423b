/* The unfused CUDA path: per-node kernels with the CPU interpreter's semantics. Contract: evt_fallback.h.
 * Design: every node computes in double into a scratch S (numel doubles; zeroed first unless its kernel
 * assigns every element, writes_every_element), then `finish` rounds S to the output dtype. Kernels are
 * one thread per output element (or per row / group) with grid-stride loops, mirroring the interpreter's
 * loops so that sums run in the same order. Exception: pure data movement (permute, transpose, expand,
 * reshape, slice and its gradient, concat, embedding / index_select gathers) whose data operands have the
 * output's dtype copies elements in that dtype (move_native: the same bits, no scratch, no rounding pass).
 * Build: `make cuda` (nvcc, sm_90, --fmad=false).
 * (evt_fallback.h is one of the kernels/ headers hashed into every JIT cache key (src/runtime/jit.c):
 * editing it, even a comment, recompiles every generated kernel; document changes here instead.) */
#include "evt_fallback.h"
#include "evt_cudnn_sdpa.h"
#include "evt_fb_gemm.h"
#include "philox.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#define R EVT_FB_MAX_RANK
typedef long long ll;

/* ---- device helpers -------------------------------------------------------------------------------- */

__device__ int g_bad_node; /* 0, or node id + 1 of the first run-time index error */

__device__ __forceinline__ double ld(const void *p, int dt, ll i) {
  switch (dt) {
  case EVT_FB_F32: return (double)((const float *)p)[i];
  case EVT_FB_F16: return (double)__half2float(((const __half *)p)[i]);
  case EVT_FB_BF16: return (double)__bfloat162float(((const __nv_bfloat16 *)p)[i]);
  case EVT_FB_I64: return (double)((const ll *)p)[i];
  case EVT_FB_I32: return (double)((const int *)p)[i];
  default: return (double)((const unsigned char *)p)[i];
  }
}

__device__ __forceinline__ void st(void *p, int dt, ll i, double v) {
  switch (dt) {
  case EVT_FB_F32: ((float *)p)[i] = (float)v; break;
  case EVT_FB_F16: ((__half *)p)[i] = __float2half_rn((float)v); break;
  case EVT_FB_BF16: ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn((float)v); break;
  case EVT_FB_I64: ((ll *)p)[i] = isfinite(v) ? (ll)trunc(v) : 0; break;
  case EVT_FB_I32: ((int *)p)[i] = isfinite(v) ? (int)fmax(fmin(trunc(v), 2147483647.0), -2147483648.0) : 0; break;
  default: ((unsigned char *)p)[i] = v != 0.0; break;
  }
}

__device__ void flag_bad(int node) { atomicCAS(&g_bad_node, 0, node + 1); }

/* index value v in [0, limit) and integral, else flags the node and returns -1 */
__device__ __forceinline__ ll as_index(double v, ll limit, int node) {
  if (!(v >= 0 && v < (double)limit) || v != floor(v)) {
    flag_bad(node);
    return -1;
  }
  return (ll)v;
}

#define GRID_FOR(i, n) for (ll i = blockIdx.x * (ll)blockDim.x + threadIdx.x; i < (n); i += (ll)gridDim.x * blockDim.x)

typedef struct tv { /* a tensor view passed by value */
  const void *p;
  int dt;
} tv;

typedef struct strides {
  ll s[R];
} strides;

typedef struct shape_t {
  int rank;
  ll d[R];
} shape_t;

/* offset of the row-major element e of shape sh under strides st */
__device__ __forceinline__ ll strided_off(ll e, const shape_t &sh, const strides &stv) {
  ll o = 0;
  for (int d = sh.rank - 1; d >= 0; d--) {
    ll i = e % sh.d[d];
    e /= sh.d[d];
    o += i * stv.s[d];
  }
  return o;
}

/* ---- elementwise ----------------------------------------------------------------------------------- */

#define GELU_K 0.7978845608028654
#define GELU_C 0.044715

__device__ double gelu(double x, int tanh_) {
  if (tanh_) return 0.5 * x * (1.0 + tanh(GELU_K * (x + GELU_C * x * x * x)));
  return 0.5 * x * (1.0 + erf(x * M_SQRT1_2));
}

__device__ double gelu_grad(double x, int tanh_) {
  if (tanh_) {
    double t = tanh(GELU_K * (x + GELU_C * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_K * (1.0 + 3.0 * GELU_C * x * x);
  }
  double cdf = 0.5 * (1.0 + erf(x * M_SQRT1_2));
  double pdf = exp(-0.5 * x * x) * (0.5 * M_2_SQRTPI * M_SQRT1_2);
  return cdf + x * pdf;
}

__device__ double ew(int op, const evt_fb_attrs &a, double x, double y, double z) {
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

/* ---- sources, rng ---------------------------------------------------------------------------------- */

__global__ void k_fill(double *S, ll n, double v) {
  GRID_FOR(e, n) S[e] = v;
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

/* ---- reductions: one thread per output element, reduced dims visited row-major -------------------- */

__global__ void k_reduce(double *S, ll nout, int op, tv x, shape_t kept, strides kst, shape_t red, strides rst,
                         ll count) {
  GRID_FOR(o, nout) {
    ll base = strided_off(o, kept, kst);
    double acc = op == EVT_FB_OP_AMAX ? -INFINITY : 0.0;
    for (ll r = 0; r < count; r++) {
      double v = ld(x.p, x.dt, base + strided_off(r, red, rst));
      if (op == EVT_FB_OP_AMAX) {
        if (isnan(v) || v > acc) acc = isnan(acc) ? acc : v;
      } else {
        acc += v;
      }
    }
    S[o] = op == EVT_FB_OP_MEAN ? acc / (double)count : acc;
  }
}

/* Long reductions (few outputs, many terms each: a bias gradient over all tokens): one block of 256 threads
 * per output, each thread a strided share of the terms, then a fixed tree in shared memory (deterministic;
 * the sum differs from the sequential order by double rounding only). */
__device__ __forceinline__ double reduce_combine(int op, double a, double v) {
  if (op == EVT_FB_OP_AMAX) return (isnan(v) || v > a) ? (isnan(a) ? a : v) : a;
  return a + v;
}

__global__ void k_reduce_wide(double *S, ll nout, int op, tv x, shape_t kept, strides kst, shape_t red, strides rst,
                              ll count) {
  __shared__ double part[256];
  for (ll o = blockIdx.x; o < nout; o += gridDim.x) {
    ll base = strided_off(o, kept, kst);
    double acc = op == EVT_FB_OP_AMAX ? -INFINITY : 0.0;
    for (ll r = threadIdx.x; r < count; r += blockDim.x) acc = reduce_combine(op, acc, ld(x.p, x.dt, base + strided_off(r, red, rst)));
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w /= 2) {
      if ((int)threadIdx.x < w) part[threadIdx.x] = reduce_combine(op, part[threadIdx.x], part[threadIdx.x + w]);
      __syncthreads();
    }
    if (threadIdx.x == 0) S[o] = op == EVT_FB_OP_MEAN ? part[0] / (double)count : part[0];
    __syncthreads();
  }
}

/* ---- softmax family: one thread per row ------------------------------------------------------------ */

__global__ void k_softmax(double *S, int op, tv a_, tv b_, ll outer, ll len, ll inner) {
  GRID_FOR(r, outer * inner) {
    ll o = r / inner, i = r % inner, base = o * len * inner + i, sd = inner;
#define A(k) ld(a_.p, a_.dt, base + (k) * sd)
#define B(k) ld(b_.p, b_.dt, base + (k) * sd)
    if (op == EVT_FB_OP_SOFTMAX || op == EVT_FB_OP_LOG_SOFTMAX) {
      double m = -INFINITY, sum = 0;
      for (ll k = 0; k < len; k++) {
        double v = A(k);
        if (isnan(v) || v > m) m = isnan(m) ? m : v;
      }
      for (ll k = 0; k < len; k++) sum += exp(A(k) - m);
      if (op == EVT_FB_OP_SOFTMAX) {
        for (ll k = 0; k < len; k++) S[base + k * sd] = exp(A(k) - m) / sum;
      } else {
        double lse = m + log(sum);
        for (ll k = 0; k < len; k++) S[base + k * sd] = A(k) - lse;
      }
    } else if (op == EVT_FB_OP_SOFTMAX_BACKWARD) {
      double dot = 0;
      for (ll k = 0; k < len; k++) dot += A(k) * B(k);
      for (ll k = 0; k < len; k++) S[base + k * sd] = B(k) * (A(k) - dot);
    } else {
      double sum = 0;
      for (ll k = 0; k < len; k++) sum += A(k);
      for (ll k = 0; k < len; k++) S[base + k * sd] = A(k) - exp(B(k)) * sum;
    }
#undef A
#undef B
  }
}

/* ---- norms: one thread per group (layer: a row of the last dim; batch: a channel) ------------------ */

__global__ void k_norm(double *S, int op, double eps, tv x, tv dy, tv w, tv b, int per_row, ll groups, ll outer,
                       ll inner, ll len, ll count) {
  bool forward = op == EVT_FB_OP_LAYER_NORM || op == EVT_FB_OP_BATCH_NORM;
  bool wgrad = op == EVT_FB_OP_LAYER_NORM_BACKWARD_WEIGHT || op == EVT_FB_OP_BATCH_NORM_BACKWARD_WEIGHT;
  double inv_count = count ? 1.0 / (double)count : (double)NAN;
  GRID_FOR(g, groups) {
    ll n_ = per_row ? len : outer * inner;
#define ELEM(k) (per_row ? g * len + (k) : (((k) / inner) * groups + g) * inner + (k) % inner)
#define WI(k) (per_row ? (k) : g)
    double mean = 0, var = 0;
    for (ll k = 0; k < n_; k++) mean += ld(x.p, x.dt, ELEM(k));
    mean *= inv_count;
    for (ll k = 0; k < n_; k++) {
      double d = ld(x.p, x.dt, ELEM(k)) - mean;
      var += d * d;
    }
    var *= inv_count;
    double rstd = 1.0 / sqrt(var + eps);
    if (forward) {
      for (ll k = 0; k < n_; k++) {
        ll e = ELEM(k);
        S[e] = (ld(x.p, x.dt, e) - mean) * rstd * (w.p ? ld(w.p, w.dt, WI(k)) : 1.0) + (b.p ? ld(b.p, b.dt, WI(k)) : 0.0);
      }
    } else if (wgrad) {
      if (per_row) {
        for (ll k = 0; k < n_; k++) {
          ll e = ELEM(k);
          atomicAdd(&S[k], ld(dy.p, dy.dt, e) * (ld(x.p, x.dt, e) - mean) * rstd);
        }
      } else {
        double s = 0;
        for (ll k = 0; k < n_; k++) {
          ll e = ELEM(k);
          s += ld(dy.p, dy.dt, e) * (ld(x.p, x.dt, e) - mean) * rstd;
        }
        S[g] = s;
      }
    } else {
      double mg = 0, mgx = 0;
      for (ll k = 0; k < n_; k++) {
        ll e = ELEM(k);
        double gv = ld(dy.p, dy.dt, e) * (w.p ? ld(w.p, w.dt, WI(k)) : 1.0);
        mg += gv;
        mgx += gv * (ld(x.p, x.dt, e) - mean) * rstd;
      }
      mg *= inv_count;
      mgx *= inv_count;
      for (ll k = 0; k < n_; k++) {
        ll e = ELEM(k);
        double xe = ld(x.p, x.dt, e);
        S[e] = rstd * (ld(dy.p, dy.dt, e) * (w.p ? ld(w.p, w.dt, WI(k)) : 1.0) - mg - (xe - mean) * rstd * mgx);
      }
    }
#undef ELEM
#undef WI
  }
}

/* ---- losses ---------------------------------------------------------------------------------------- */

/* Class losses, per (n, i) position: term and counted flag into T[2*k], T[2*k+1]. */
__global__ void k_class_terms(double *T, int op, ll ignore, tv x, tv t, int soft, ll N, ll C, ll inner, int node) {
  GRID_FOR(k, N * inner) {
    ll n = k / inner, i = k % inner;
    ll rb = n * C * inner + i;
    double lse = 0;
    if (op == EVT_FB_OP_CROSS_ENTROPY) {
      double mx = -INFINITY, s = 0;
      for (ll c = 0; c < C; c++) {
        double v = ld(x.p, x.dt, rb + c * inner);
        if (isnan(v) || v > mx) mx = isnan(mx) ? mx : v;
      }
      for (ll c = 0; c < C; c++) s += exp(ld(x.p, x.dt, rb + c * inner) - mx);
      lse = mx + log(s);
    }
    if (soft) {
      double s = 0;
      for (ll c = 0; c < C; c++) s -= ld(t.p, t.dt, rb + c * inner) * (ld(x.p, x.dt, rb + c * inner) - lse);
      T[2 * k] = s;
      T[2 * k + 1] = 1;
      continue;
    }
    double tv_ = ld(t.p, t.dt, k);
    if (tv_ == (double)ignore) {
      T[2 * k] = 0;
      T[2 * k + 1] = 0;
      continue;
    }
    ll c = as_index(tv_, C, node);
    if (c < 0) {
      T[2 * k] = NAN;
      T[2 * k + 1] = 0;
      continue;
    }
    T[2 * k] = -(ld(x.p, x.dt, rb + c * inner) - lse);
    T[2 * k + 1] = 1;
  }
}

/* One thread: sums the terms in order (reduction mean/sum) into S[0], or copies them (none). Also used
 * by the backward op to get the counted total into *counted. */
__global__ void k_class_reduce(double *S, const double *T, ll m, int reduction, double *counted) {
  if (blockIdx.x || threadIdx.x) return;
  double s = 0, c = 0;
  for (ll k = 0; k < m; k++) {
    if (reduction == 0 && S) S[k] = T[2 * k];
    s += T[2 * k];
    c += T[2 * k + 1];
  }
  if (S && reduction != 0) S[0] = reduction == 1 ? s / c : s;
  if (counted) *counted = c;
}

__global__ void k_nll_backward(double *S, const double *counted, ll ignore, int reduction, tv dy, tv t, ll N, ll C,
                               ll inner) {
  GRID_FOR(k, N * inner) {
    ll n = k / inner, i = k % inner;
    double tv_ = ld(t.p, t.dt, k);
    if (tv_ == (double)ignore) continue;
    ll c = (ll)tv_;
    if (c < 0 || c >= C) continue; /* flagged by k_class_terms */
    double d = reduction == 0 ? ld(dy.p, dy.dt, k) : reduction == 1 ? ld(dy.p, dy.dt, 0) / *counted : ld(dy.p, dy.dt, 0);
    S[(n * C + c) * inner + i] = -d;
  }
}

__global__ void k_pointwise_loss(double *T, int bce, tv x, tv y, ll m) {
  GRID_FOR(i, m) {
    double xv = ld(x.p, x.dt, i), yv = ld(y.p, y.dt, i);
    T[2 * i] = bce ? fmax(xv, 0.0) - xv * yv + log1p(exp(-fabs(xv))) : (xv - yv) * (xv - yv);
    T[2 * i + 1] = 1;
  }
}

__global__ void k_pointwise_loss_bwd(double *S, int bce, int reduction, tv dy, tv x, tv y, ll m) {
  GRID_FOR(i, m) {
    double xv = ld(x.p, x.dt, i), yv = ld(y.p, y.dt, i);
    double d = reduction == 0 ? ld(dy.p, dy.dt, i) : reduction == 1 ? ld(dy.p, dy.dt, 0) / (double)m : ld(dy.p, dy.dt, 0);
    double sig = xv >= 0 ? 1.0 / (1.0 + exp(-xv)) : exp(xv) / (1.0 + exp(xv));
    S[i] = bce ? (sig - yv) * d : 2.0 * (xv - yv) * d;
  }
}

/* ---- gathers / scatters ---------------------------------------------------------------------------- */

__global__ void k_one_hot(double *S, tv idx, ll n, ll C, int node) {
  GRID_FOR(i, n) {
    ll c = as_index(ld(idx.p, idx.dt, i), C, node);
    if (c >= 0) S[i * C + c] = 1;
  }
}

/* index_select over (outer, len, inner) with n indices; embedding is outer=1, dim 0. fwd gathers,
 * bwd scatter-adds. */
__global__ void k_index_select(double *S, int fwd, tv src, tv idx, ll outer, ll len, ll inner, ll n, int node) {
  GRID_FOR(e, outer * n * inner) {
    ll i = e % inner, j = (e / inner) % n, o = e / (inner * n);
    ll r = as_index(ld(idx.p, idx.dt, j), len, node);
    if (r < 0) continue;
    ll f = (o * len + r) * inner + i;
    if (fwd) S[e] = ld(src.p, src.dt, f);
    else atomicAdd(&S[f], ld(src.p, src.dt, e));
  }
}

/* ---- layout ---------------------------------------------------------------------------------------- */

/* S[e] = x[base + strided(e)] (gather); or S[base + strided(e)] = x[e] (scatter, distinct targets) */
__global__ void k_strided(double *S, tv x, ll n, shape_t sh, strides stv, ll base, int scatter) {
  GRID_FOR(e, n) {
    ll o = base + strided_off(e, sh, stv);
    if (scatter) S[o] = ld(x.p, x.dt, e);
    else S[e] = ld(x.p, x.dt, o);
  }
}

__global__ void k_concat_part(double *S, tv x, ll outer, ll chunk, ll row, ll at) {
  GRID_FOR(e, outer * chunk) {
    ll o = e / chunk, c = e % chunk;
    S[o * row + at + c] = ld(x.p, x.dt, e);
  }
}

/* ---- data movement in the tensors' own dtype -------------------------------------------------------- */
/* Ops that only move elements (layout changes, slices, concat, gathers by index) give the same bits with
 * or without the double round trip (every dtype converts to double and back exactly), so when the moved
 * operand has the output's dtype they copy elements of that size directly: no scratch, no zeroing of the
 * whole scratch, no rounding pass (move_native). T is an unsigned integer of the element's size. */
template <class T>
__global__ void k_move_gather(T *out, const T *x, ll n, shape_t sh, strides stv, ll base) {
  GRID_FOR(e, n) out[e] = x[base + strided_off(e, sh, stv)];
}

template <class T>
__global__ void k_move_scatter(T *out, const T *x, ll n, shape_t sh, strides stv, ll base) {
  GRID_FOR(e, n) out[base + strided_off(e, sh, stv)] = x[e];
}

template <class T>
__global__ void k_move_concat(T *out, const T *x, ll outer, ll chunk, ll row, ll at) {
  GRID_FOR(e, outer * chunk) out[(e / chunk) * row + at + e % chunk] = x[e];
}

/* out[b][x][y] = in[b][y][x] for in [nb, Y, X]: a batched transpose through a 32 x 33 shared tile, so that
 * reads and writes are both coalesced (the strided gather reads one element per 32-byte sector when the
 * innermost dim moves: 1 ms for XML-CNN's [256, 512, 304] embedding transpose on the H200). Blocks of
 * 32 x 8 threads; grid (ceil(X/32), ceil(Y/32), nb). */
template <class T>
__global__ void k_move_transpose(T *out, const T *in, ll Y, ll X) {
  __shared__ T tile[32][33];
  ll b = blockIdx.z, x0 = (ll)blockIdx.x * 32, y0 = (ll)blockIdx.y * 32;
  const T *src = in + b * Y * X;
  T *dst = out + b * Y * X;
  for (int j = threadIdx.y; j < 32; j += 8) {
    ll y = y0 + j, x = x0 + threadIdx.x;
    if (y < Y && x < X) tile[j][threadIdx.x] = src[y * X + x];
  }
  __syncthreads();
  for (int j = threadIdx.y; j < 32; j += 8) {
    ll x = x0 + j, y = y0 + threadIdx.x;
    if (x < X && y < Y) dst[x * Y + y] = tile[threadIdx.x][j];
  }
}

/* gather of index_select / embedding over (outer, len, inner); an index out of range writes zero (the
 * double path leaves its zeroed scratch) and sets the error flag */
template <class T>
__global__ void k_move_index(T *out, const T *src, tv idx, ll outer, ll len, ll inner, ll n, int node) {
  GRID_FOR(e, outer * n * inner) {
    ll i = e % inner, j = (e / inner) % n, o = e / (inner * n);
    ll r = as_index(ld(idx.p, idx.dt, j), len, node);
    out[e] = r < 0 ? T(0) : src[(o * len + r) * inner + i];
  }
}

/* ---- gemm: out[b] = a[b] @ b[b], double, k increasing; 16x16 tiles ---------------------------------- */

#define TILE 16
__global__ void k_gemm(double *S, tv A, tv B, ll M, ll K, ll N, shape_t bsh, strides sa, strides sb) {
  __shared__ double ta[TILE][TILE], tb[TILE][TILE];
  ll b = blockIdx.z;
  ll oa = strided_off(b, bsh, sa), ob = strided_off(b, bsh, sb);
  ll i = blockIdx.y * TILE + threadIdx.y, j = blockIdx.x * TILE + threadIdx.x;
  double acc = 0;
  for (ll k0 = 0; k0 < K; k0 += TILE) {
    ll ka = k0 + threadIdx.x, kb = k0 + threadIdx.y;
    ta[threadIdx.y][threadIdx.x] = i < M && ka < K ? ld(A.p, A.dt, oa + i * K + ka) : 0.0;
    tb[threadIdx.y][threadIdx.x] = kb < K && j < N ? ld(B.p, B.dt, ob + kb * N + j) : 0.0;
    __syncthreads();
    ll kend = K - k0 < TILE ? K - k0 : TILE;
    for (ll k = 0; k < kend; k++) acc += ta[threadIdx.y][k] * tb[k][threadIdx.x];
    __syncthreads();
  }
  if (i < M && j < N) S[(b * M + i) * N + j] = acc;
}

__global__ void k_float_to_double(double *S, const float *F, ll n) {
  GRID_FOR(e, n) S[e] = (double)F[e];
}

__global__ void k_addmm_bias(double *S, tv c, ll M, ll N, ll cs0, ll cs1) {
  GRID_FOR(e, M * N) S[e] += ld(c.p, c.dt, (e / N) * cs0 + (e % N) * cs1);
}

/* ---- CSR spmm -------------------------------------------------------------------------------------- */

__global__ void k_csr_check(tv rowptr, tv col, ll M, ll nnz, ll K, int node) {
  GRID_FOR(i, M + 1 > nnz ? M + 1 : nnz) {
    if (i <= M) {
      ll r = as_index(ld(rowptr.p, rowptr.dt, i), nnz + 1, node);
      if (r >= 0 && i > 0 && r < ld(rowptr.p, rowptr.dt, i - 1)) flag_bad(node);
      if (i == 0 && r < 0) flag_bad(node);
    }
    if (i < nnz) as_index(ld(col.p, col.dt, i), K, node);
  }
}

__global__ void k_spmm(double *S, int transposed, tv rowptr, tv col, tv val, tv x, ll M, ll N, ll K, ll nnz) {
  GRID_FOR(e, M * N) {
    ll i = e / N, j = e % N;
    double p0 = ld(rowptr.p, rowptr.dt, i), p1 = ld(rowptr.p, rowptr.dt, i + 1);
    if (!(p0 >= 0 && p1 <= (double)nnz)) continue;
    double acc = 0;
    for (ll p = (ll)p0; p < (ll)p1; p++) {
      double cv = ld(col.p, col.dt, p);
      if (!(cv >= 0 && cv < (double)K)) continue;
      ll c = (ll)cv;
      double v = ld(val.p, val.dt, p);
      if (!transposed) acc += v * ld(x.p, x.dt, c * N + j);
      else atomicAdd(&S[c * N + j], v * ld(x.p, x.dt, i * N + j));
    }
    if (!transposed) S[e] = acc;
  }
}

/* ---- conv2d (any layout) --------------------------------------------------------------------------- */

typedef struct conv_geom {
  ll N, C, H, W, O, Cg, KH, KW, Ho, Wo, G, sh, sw, ph, pw, dh, dw;
  int nhwc;
} conv_geom;

__device__ __forceinline__ ll xoff(const conv_geom &g, ll n, ll c, ll h, ll w) {
  return g.nhwc ? ((n * g.H + h) * g.W + w) * g.C + c : ((n * g.C + c) * g.H + h) * g.W + w;
}
__device__ __forceinline__ ll yoff(const conv_geom &g, ll n, ll o, ll h, ll w) {
  return g.nhwc ? ((n * g.Ho + h) * g.Wo + w) * g.O + o : ((n * g.O + o) * g.Ho + h) * g.Wo + w;
}
__device__ __forceinline__ ll woff(const conv_geom &g, ll o, ll cg, ll ki, ll kj) {
  return g.nhwc ? ((o * g.KH + ki) * g.KW + kj) * g.Cg + cg : ((o * g.Cg + cg) * g.KH + ki) * g.KW + kj;
}

/* fwd: thread per y element, terms in (cg, ki, kj) order; bwd_input: same walk, scatter into dx */
__global__ void k_conv_fwd_or_dx(double *S, int fwd, tv a, tv wt, conv_geom g) {
  GRID_FOR(e, g.N * g.O * g.Ho * g.Wo) {
    ll ow = e % g.Wo, oh = (e / g.Wo) % g.Ho, o = (e / (g.Wo * g.Ho)) % g.O, n = e / (g.Wo * g.Ho * g.O);
    ll grp = o / (g.O / g.G);
    double acc = 0, dyv = fwd ? 0 : ld(a.p, a.dt, yoff(g, n, o, oh, ow));
    for (ll cg = 0; cg < g.Cg; cg++) {
      ll c = grp * g.Cg + cg;
      for (ll ki = 0; ki < g.KH; ki++) {
        ll ih = oh * g.sh - g.ph + ki * g.dh;
        if (ih < 0 || ih >= g.H) continue;
        for (ll kj = 0; kj < g.KW; kj++) {
          ll iw = ow * g.sw - g.pw + kj * g.dw;
          if (iw < 0 || iw >= g.W) continue;
          double wv = ld(wt.p, wt.dt, woff(g, o, cg, ki, kj));
          if (fwd) acc += wv * ld(a.p, a.dt, xoff(g, n, c, ih, iw));
          else atomicAdd(&S[xoff(g, n, c, ih, iw)], dyv * wv);
        }
      }
    }
    if (fwd) S[yoff(g, n, o, oh, ow)] = acc;
  }
}

/* dw: thread per weight element, terms in (n, oh, ow) order */
__global__ void k_conv_dw(double *S, tv x, tv dy, conv_geom g) {
  GRID_FOR(e, g.O * g.Cg * g.KH * g.KW) {
    ll kj = e % g.KW, ki = (e / g.KW) % g.KH, cg = (e / (g.KW * g.KH)) % g.Cg, o = e / (g.KW * g.KH * g.Cg);
    ll c = (o / (g.O / g.G)) * g.Cg + cg;
    double acc = 0;
    for (ll n = 0; n < g.N; n++)
      for (ll oh = 0; oh < g.Ho; oh++) {
        ll ih = oh * g.sh - g.ph + ki * g.dh;
        if (ih < 0 || ih >= g.H) continue;
        double s = 0;
        for (ll ow = 0; ow < g.Wo; ow++) {
          ll iw = ow * g.sw - g.pw + kj * g.dw;
          if (iw < 0 || iw >= g.W) continue;
          s += ld(dy.p, dy.dt, yoff(g, n, o, oh, ow)) * ld(x.p, x.dt, xoff(g, n, c, ih, iw));
        }
        acc += s;
      }
    S[woff(g, o, cg, ki, kj)] = acc;
  }
}

/* ---- pools ----------------------------------------------------------------------------------------- */

typedef struct pool_geom {
  ll planes, C, H, W, Ho, Wo;
  int nhwc, adaptive, avg;
  ll kh, kw, sh, sw, ph, pw;
} pool_geom;

__device__ __forceinline__ ll poff(const pool_geom &p, ll pl, ll h, ll w, ll HH, ll WW) {
  if (!p.nhwc) return (pl * HH + h) * WW + w;
  ll n = pl / p.C, c = pl % p.C;
  return ((n * HH + h) * WW + w) * p.C + c;
}

/* mode 0 forward, 1 backward (dy = a, x = b for max; dy = a for avg) */
__global__ void k_pool(double *S, int backward, tv a, tv b, pool_geom p) {
  double inv_area = p.avg ? 1.0 / (double)(p.kh * p.kw) : 0;
  GRID_FOR(e, p.planes * p.Ho * p.Wo) {
    ll ow = e % p.Wo, oh = (e / p.Wo) % p.Ho, pl = e / (p.Wo * p.Ho);
    ll h0, h1, w0, w1;
    if (p.adaptive) {
      h0 = oh * p.H / p.Ho;
      h1 = ((oh + 1) * p.H + p.Ho - 1) / p.Ho;
      w0 = ow * p.W / p.Wo;
      w1 = ((ow + 1) * p.W + p.Wo - 1) / p.Wo;
    } else {
      h0 = oh * p.sh - p.ph;
      w0 = ow * p.sw - p.pw;
      h1 = h0 + p.kh;
      w1 = w0 + p.kw;
      if (h0 < 0) h0 = 0;
      if (w0 < 0) w0 = 0;
      if (h1 > p.H) h1 = p.H;
      if (w1 > p.W) w1 = p.W;
    }
    ll yo = poff(p, pl, oh, ow, p.Ho, p.Wo);
    const tv &x = backward ? b : a;
    if (p.avg) {
      if (!backward) {
        double s = 0;
        for (ll h = h0; h < h1; h++)
          for (ll w = w0; w < w1; w++) s += ld(a.p, a.dt, poff(p, pl, h, w, p.H, p.W));
        S[yo] = s * inv_area;
      } else {
        double gv = ld(a.p, a.dt, yo) * inv_area;
        for (ll h = h0; h < h1; h++)
          for (ll w = w0; w < w1; w++) atomicAdd(&S[poff(p, pl, h, w, p.H, p.W)], gv);
      }
      continue;
    }
    ll best = -1;
    double m = -INFINITY;
    for (ll h = h0; h < h1; h++)
      for (ll w = w0; w < w1; w++) {
        ll off = poff(p, pl, h, w, p.H, p.W);
        double v = ld(x.p, x.dt, off);
        if (best < 0 || (!isnan(m) && (v > m || isnan(v)))) {
          best = off;
          m = v;
        }
      }
    if (!backward) S[yo] = best >= 0 ? m : -INFINITY;
    else if (best >= 0) atomicAdd(&S[best], ld(a.p, a.dt, yo));
  }
}

/* ---- sdpa: one thread per (batch, query row); P and dP rows in scratch W (2 * Skv doubles each) ----- */

__global__ void k_sdpa(double *S, double *Wk, int op, tv dout, tv q, tv k, tv v, ll B, ll Sq, ll Skv, ll D, ll Dv,
                       double scale, int causal) {
  GRID_FOR(r, B * Sq) {
    ll b = r / Sq, i = r % Sq;
    double *p = Wk + r * 2 * Skv, *dp = p + Skv;
    ll qb = b * Sq * D, kb = b * Skv * D, vb = b * Skv * Dv, db = b * Sq * Dv;
    ll nk = causal ? (i + 1 < Skv ? i + 1 : Skv) : Skv;
    double m = -INFINITY;
    for (ll j = 0; j < nk; j++) {
      double s = 0;
      for (ll d = 0; d < D; d++) s += ld(q.p, q.dt, qb + i * D + d) * ld(k.p, k.dt, kb + j * D + d);
      p[j] = s * scale;
      if (isnan(p[j]) || p[j] > m) m = isnan(m) ? m : p[j];
    }
    double sum = 0;
    for (ll j = 0; j < nk; j++) sum += (p[j] = exp(p[j] - m));
    for (ll j = 0; j < nk; j++) p[j] /= sum;
    if (op == EVT_FB_OP_SDPA) {
      for (ll d = 0; d < Dv; d++) {
        double acc = 0;
        for (ll j = 0; j < nk; j++) acc += p[j] * ld(v.p, v.dt, vb + j * Dv + d);
        S[(b * Sq + i) * Dv + d] = acc;
      }
      continue;
    }
    if (op == EVT_FB_OP_SDPA_BACKWARD_V) {
      for (ll j = 0; j < nk; j++)
        for (ll d = 0; d < Dv; d++) atomicAdd(&S[(b * Skv + j) * Dv + d], p[j] * ld(dout.p, dout.dt, db + i * Dv + d));
      continue;
    }
    double dot = 0;
    for (ll j = 0; j < nk; j++) {
      double s = 0;
      for (ll d = 0; d < Dv; d++) s += ld(dout.p, dout.dt, db + i * Dv + d) * ld(v.p, v.dt, vb + j * Dv + d);
      dp[j] = s;
      dot += p[j] * s;
    }
    for (ll j = 0; j < nk; j++) dp[j] = p[j] * (dp[j] - dot) * scale;
    if (op == EVT_FB_OP_SDPA_BACKWARD_Q) {
      for (ll d = 0; d < D; d++) {
        double acc = 0;
        for (ll j = 0; j < nk; j++) acc += dp[j] * ld(k.p, k.dt, kb + j * D + d);
        S[(b * Sq + i) * D + d] = acc;
      }
    } else {
      for (ll j = 0; j < nk; j++)
        for (ll d = 0; d < D; d++) atomicAdd(&S[(b * Skv + j) * D + d], dp[j] * ld(q.p, q.dt, qb + i * D + d));
    }
  }
}

/* ---- finish: round the scratch to the output dtype ------------------------------------------------- */

__global__ void k_finish(void *out, int dt, const double *S, ll n) {
  GRID_FOR(e, n) st(out, dt, e, S[e]);
}

__global__ void k_to_double(double *S, tv x, ll n) {
  GRID_FOR(e, n) S[e] = ld(x.p, x.dt, e);
}

/* ---- SGD: p -= lr * g in double, rounded to p's dtype (evt_train_sgd_update's arithmetic) ------------- */

__global__ void k_sgd(void *p, int pdt, tv g, double lr, ll n) {
  GRID_FOR(e, n) st(p, pdt, e, ld(p, pdt, e) - lr * ld(g.p, g.dt, e));
}

/* ---- host side ------------------------------------------------------------------------------------- */

/* Per-runtime state (one per evt_program): the stream of the node being enqueued, a cuBLAS handle with its
 * own workspace (cuBLAS under CUDA-graph capture must not allocate), the double scratch S of every node,
 * the second scratch S2 (loss terms, cuBLAS f32 product, sdpa rows) and a staging buffer for host
 * conversions (never read by a captured step, so growing it cannot invalidate a CUDA graph). */
/* A cuBLASLt GEMM with a bias epilogue (evt_fb_gemm_run with a bias): descriptor, layouts and the
 * heuristic's algorithm, kept per problem (the heuristic costs more host time than the launch). */
struct lt_plan {
  int used, m, n, k, ta, tb, ab, d;
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, lc;
  cublasLtMatmulAlgo_t algo;
};
enum { LT_PLANS = 32 };

struct evt_fb_ctx {
  cudaStream_t stream;
  cublasHandle_t cublas;
  void *cublas_ws;
  size_t cublas_ws_bytes;
  double *s1, *s2, *stage;
  size_t n1, n2, nstage;
  long launches;
  cublasLtHandle_t lt;         /* created on the first bias GEMM */
  lt_plan plans[LT_PLANS];     /* ring of cuBLASLt plans */
  int next_plan;
  void *attn;                  /* attention through cuDNN: stats, and the backward's out / other gradients */
  size_t attn_bytes;
  struct {                     /* the gradients the last attention backward left in attn, for its siblings */
    bool valid;
    const void *in[4];         /* dout, q, k, v */
    evt_cudnn_sdpa_desc d;
    int served, siblings;      /* bits 1 q, 2 k, 4 v */
  } memo;
  struct attn_saved {          /* per attention forward node: its out and statistics, for the backward */
    int node;
    const void *qkv[3];        /* the inputs of the last run (keys for the backward) */
    evt_cudnn_sdpa_desc d;
    void *o;
    float *stats;
    long stamp;                /* 0: never run; else the order of the runs */
  } *saved;
  int nsaved;
  long stamps;
};

/* the stream argument of every launch in evt_fb_run: counts the launch */
#define ST (ctx->launches++, ctx->stream)

#define CK(call)                                                                                           \
  do {                                                                                                     \
    cudaError_t e_ = (call);                                                                               \
    if (e_ != cudaSuccess) {                                                                               \
      snprintf(err, errlen, "%s: %s", #call, cudaGetErrorString(e_));                                      \
      return 2;                                                                                            \
    }                                                                                                      \
  } while (0)

static int blocks(ll n) {
  ll b = (n + 255) / 256;
  return (int)(b < 1 ? 1 : b > 65535 * 4 ? 65535 * 4 : b);
}

/* Grows *buf to n doubles. Growing frees the old buffer (cudaFree waits for the device): runs reserve
 * every node's scratch before the first step, so a step never grows it (see evt_fb_reserve). */
static int ensure(double **buf, size_t *cap, size_t n, char *err, size_t errlen) {
  if (n <= *cap) return 0;
  if (*buf) cudaFree(*buf);
  *buf = NULL;
  *cap = 0;
  CK(cudaMalloc((void **)buf, n * sizeof(double)));
  *cap = n;
  return 0;
}

static tv view(const evt_fb_tensor &t) { return tv{t.ptr, t.dtype}; }

static shape_t shape_of(const evt_fb_tensor &t) {
  shape_t s;
  s.rank = t.rank;
  for (int i = 0; i < R; i++) s.d[i] = i < t.rank ? t.shape[i] : 1;
  return s;
}

static void contig(const evt_fb_tensor &t, ll *stv) {
  ll s = 1;
  for (int d = t.rank - 1; d >= 0; d--) {
    stv[d] = s;
    s *= t.shape[d];
  }
}

/* numpy broadcast strides of t read at out's shape; false if it does not broadcast */
static bool bcast(const evt_fb_tensor &t, const evt_fb_tensor &out, strides *st_) {
  memset(st_, 0, sizeof *st_);
  if (t.rank > out.rank) return false;
  ll s = 1;
  for (int i = out.rank - 1; i >= 0; i--) {
    int j = i - (out.rank - t.rank);
    if (j < 0) continue;
    if (t.shape[j] != out.shape[i] && t.shape[j] != 1) return false;
    st_->s[i] = (t.shape[j] == 1 && out.shape[i] != 1) ? 0 : s;
    s *= t.shape[j];
  }
  return true;
}

/* true if batch b (row-major over bsh) sits at b * (*u) elements for a constant *u: batch dims contiguous,
 * or every batch dim broadcast (u = 0) */
static bool uniform_stride(const shape_t &bsh, const strides &st_, ll *u) {
  *u = 0;
  int last = -1;
  for (int i = 0; i < bsh.rank; i++)
    if (bsh.d[i] != 1) last = i;
  if (last < 0) return true;
  *u = st_.s[last];
  ll inner = 1;
  for (int i = bsh.rank - 1; i >= 0; i--) {
    if (bsh.d[i] != 1 && st_.s[i] != *u * inner) return false;
    inner *= bsh.d[i];
  }
  return true;
}

static int normdim(ll d, int rank) {
  if (d < 0) d += rank;
  return d >= 0 && d < rank ? (int)d : -1;
}

static ll prod(const int64_t *s, int lo, int hi) {
  ll p = 1;
  for (int i = lo; i < hi; i++) p *= s[i];
  return p;
}

/* Doubles of S2 node nd needs (0: none); mirrors the uses in evt_fb_run. */
static ll scratch2_need(const evt_fb_node *nd) {
  const evt_fb_tensor *in = nd->in;
  switch (nd->op) {
  case EVT_FB_OP_NLL_LOSS: case EVT_FB_OP_NLL_LOSS_BACKWARD: case EVT_FB_OP_CROSS_ENTROPY: {
    const evt_fb_tensor &x = in[nd->op == EVT_FB_OP_NLL_LOSS_BACKWARD ? 1 : 0];
    ll m = x.rank == 1 ? 1 : x.rank >= 2 ? x.shape[0] * prod(x.shape, 2, x.rank) : 0;
    return 2 * m + 1;
  }
  case EVT_FB_OP_BCE_WITH_LOGITS: case EVT_FB_OP_MSE_LOSS: return 2 * in[0].numel + 1;
  case EVT_FB_OP_MM: case EVT_FB_OP_BMM: case EVT_FB_OP_ADDMM: return (nd->out.numel + 1) / 2 + 1;
  case EVT_FB_OP_SDPA: case EVT_FB_OP_SDPA_BACKWARD_Q: case EVT_FB_OP_SDPA_BACKWARD_K: case EVT_FB_OP_SDPA_BACKWARD_V: {
    const evt_fb_tensor &q = in[nd->op == EVT_FB_OP_SDPA ? 0 : 1], &k = in[nd->op == EVT_FB_OP_SDPA ? 1 : 2];
    if (q.rank < 2 || k.rank != q.rank) return 0;
    return prod(q.shape, 0, q.rank - 2) * q.shape[q.rank - 2] * 2 * k.shape[k.rank - 2] + 1;
  }
  default: return 0;
  }
}

/* Ops whose kernels assign every element of S (one thread per output element, grid-stride): no zeroing
 * memset needed. Scatters, atomics and partial writes (one_hot, backward gathers, losses) are not listed. */
static bool writes_every_element(int op) {
  switch (op) {
  case EVT_FB_OP_FULL: case EVT_FB_OP_SCALAR: case EVT_FB_OP_RAND: case EVT_FB_OP_DROPOUT:
  case EVT_FB_OP_NEG: case EVT_FB_OP_EXP: case EVT_FB_OP_LOG: case EVT_FB_OP_SQRT: case EVT_FB_OP_RSQRT:
  case EVT_FB_OP_RECIPROCAL: case EVT_FB_OP_ABS: case EVT_FB_OP_SIGN: case EVT_FB_OP_TANH: case EVT_FB_OP_SIGMOID:
  case EVT_FB_OP_RELU: case EVT_FB_OP_GELU: case EVT_FB_OP_ERF: case EVT_FB_OP_CAST: case EVT_FB_OP_POW:
  case EVT_FB_OP_GELU_BACKWARD: case EVT_FB_OP_THRESHOLD_BACKWARD:
  case EVT_FB_OP_ADD: case EVT_FB_OP_SUB: case EVT_FB_OP_MUL: case EVT_FB_OP_DIV: case EVT_FB_OP_MAXIMUM:
  case EVT_FB_OP_MINIMUM: case EVT_FB_OP_EQ: case EVT_FB_OP_NE: case EVT_FB_OP_LT: case EVT_FB_OP_LE:
  case EVT_FB_OP_GT: case EVT_FB_OP_GE: case EVT_FB_OP_WHERE:
  case EVT_FB_OP_SUM: case EVT_FB_OP_MEAN: case EVT_FB_OP_AMAX:
  case EVT_FB_OP_SOFTMAX: case EVT_FB_OP_LOG_SOFTMAX: case EVT_FB_OP_SOFTMAX_BACKWARD: case EVT_FB_OP_LOG_SOFTMAX_BACKWARD:
  case EVT_FB_OP_RESHAPE: case EVT_FB_OP_SQUEEZE: case EVT_FB_OP_UNSQUEEZE: case EVT_FB_OP_PERMUTE:
  case EVT_FB_OP_TRANSPOSE: case EVT_FB_OP_EXPAND:
  case EVT_FB_OP_MM: case EVT_FB_OP_BMM: case EVT_FB_OP_ADDMM:
    return true;
  default:
    return false;
  }
}

extern "C" int evt_fb_dtype_bytes(int dt) {
  switch (dt) {
  case EVT_FB_F32: case EVT_FB_I32: return 4;
  case EVT_FB_F16: case EVT_FB_BF16: return 2;
  case EVT_FB_I64: return 8;
  default: return 1;
  }
}

extern "C" int evt_fb_init(char *err, size_t errlen) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    snprintf(err, errlen, "%s", e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount found 0 devices");
    return 1;
  }
  CK(cudaSetDevice(0));
  return 0;
}

static void lt_plan_free(lt_plan *p) {
  if (!p->used) return;
  if (p->la) cublasLtMatrixLayoutDestroy(p->la);
  if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
  if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
  if (p->op) cublasLtMatmulDescDestroy(p->op);
  memset(p, 0, sizeof *p);
}

extern "C" void evt_fb_ctx_free(evt_fb_ctx *c) {
  if (!c) return;
  for (int i = 0; i < LT_PLANS; i++) lt_plan_free(&c->plans[i]);
  if (c->lt) cublasLtDestroy(c->lt);
  if (c->cublas) cublasDestroy(c->cublas);
  cudaFree(c->cublas_ws);
  cudaFree(c->s1);
  cudaFree(c->s2);
  cudaFree(c->stage);
  cudaFree(c->attn);
  for (int i = 0; i < c->nsaved; i++) cudaFree(c->saved[i].o), cudaFree(c->saved[i].stats);
  free(c->saved);
  free(c);
}

extern "C" evt_fb_ctx *evt_fb_ctx_new(char *err, size_t errlen) {
  evt_fb_ctx *c = (evt_fb_ctx *)calloc(1, sizeof *c);
  if (!c) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  cublasStatus_t cs = cublasCreate(&c->cublas);
  if (cs != CUBLAS_STATUS_SUCCESS) {
    snprintf(err, errlen, "cublasCreate failed (status %d)", (int)cs);
    c->cublas = NULL;
    evt_fb_ctx_free(c);
    return NULL;
  }
  /* Tensor cores on (with PEDANTIC_MATH the paper MLP's GEMMs ran at ~47 TFLOPS, CUDA-core
   * speed), but no TF32 for f32 operands (DEFAULT_MATH never uses it) and no reduced-precision
   * (bf16/f16) split-K reductions: products and sums stay f32, as the interpreter models them. */
  cublasSetMathMode(c->cublas, (cublasMath_t)(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
  c->cublas_ws_bytes = (size_t)32 << 20;
  cudaError_t e = cudaMalloc(&c->cublas_ws, c->cublas_ws_bytes);
  if (e != cudaSuccess) {
    snprintf(err, errlen, "cudaMalloc(cuBLAS workspace): %s", cudaGetErrorString(e));
    c->cublas_ws = NULL;
    evt_fb_ctx_free(c);
    return NULL;
  }
  return c;
}

extern "C" long evt_fb_launches(const evt_fb_ctx *c) { return c ? c->launches : 0; }

static bool attn_cudnn(const evt_fb_node *nd, evt_cudnn_sdpa_desc *d);
static size_t attn_scratch_bytes(int op, const evt_cudnn_sdpa_desc *d);

extern "C" int evt_fb_reserve(evt_fb_ctx *c, const evt_fb_node *nd, char *err, size_t errlen) {
  evt_cudnn_sdpa_desc ad;
  if (attn_cudnn(nd, &ad)) { /* (plans built and their workspaces allocated here, before any capture) */
    size_t need = attn_scratch_bytes(nd->op, &ad);
    if (need > c->attn_bytes) {
      c->memo.valid = false;
      cudaFree(c->attn);
      c->attn = NULL;
      c->attn_bytes = 0;
      CK(cudaMalloc(&c->attn, need));
      c->attn_bytes = need;
    }
    if (nd->op == EVT_FB_OP_SDPA && nd->a.sdpa_siblings) { /* its out and statistics, for the backward */
      int i = 0;
      while (i < c->nsaved && c->saved[i].node != nd->id) i++;
      if (i == c->nsaved) {
        void *grown = realloc(c->saved, sizeof *c->saved * (size_t)(c->nsaved + 1));
        if (!grown) {
          snprintf(err, errlen, "out of host memory");
          return 2;
        }
        c->saved = (evt_fb_ctx::attn_saved *)grown;
        evt_fb_ctx::attn_saved *e = &c->saved[c->nsaved];
        memset(e, 0, sizeof *e);
        e->node = nd->id;
        size_t bh = (size_t)(ad.b * ad.h);
        CK(cudaMalloc(&e->o, bh * (size_t)(ad.sq * ad.dv) * 2));
        CK(cudaMalloc((void **)&e->stats, bh * (size_t)ad.sq * 4));
        c->nsaved++;
      }
    }
    return 0;
  }
  ll n = nd->out.numel, n2 = scratch2_need(nd);
  if (ensure(&c->s1, &c->n1, (size_t)(n > 0 ? n : 1), err, errlen)) return 2;
  if (n2 > 0 && ensure(&c->s2, &c->n2, (size_t)n2, err, errlen)) return 2;
  return 0;
}

extern "C" void *evt_fb_alloc(int64_t bytes, char *err, size_t errlen) {
  void *p = NULL;
  cudaError_t e = cudaMalloc(&p, (size_t)(bytes > 0 ? bytes : 1));
  if (e != cudaSuccess) {
    snprintf(err, errlen, "cudaMalloc(%lld): %s", (long long)bytes, cudaGetErrorString(e));
    return NULL;
  }
  return p;
}

extern "C" void evt_fb_free(void *p) {
  if (p) cudaFree(p);
}

extern "C" int evt_fb_upload(evt_fb_ctx *ctx, const evt_fb_tensor *t, const double *host, void *stream, char *err,
                             size_t errlen) {
  cudaStream_t s = (cudaStream_t)stream;
  if (ensure(&ctx->stage, &ctx->nstage, (size_t)(t->numel ? t->numel : 1), err, errlen)) return 2;
  CK(cudaMemcpyAsync(ctx->stage, host, sizeof(double) * (size_t)t->numel, cudaMemcpyHostToDevice, s));
  k_finish<<<blocks(t->numel), 256, 0, s>>>(t->ptr, t->dtype, ctx->stage, t->numel);
  CK(cudaGetLastError());
  CK(cudaStreamSynchronize(s)); /* the staging buffer is reused by the next upload */
  return 0;
}

extern "C" int evt_fb_download(evt_fb_ctx *ctx, const evt_fb_tensor *t, double *host, void *stream, char *err,
                               size_t errlen) {
  cudaStream_t s = (cudaStream_t)stream;
  if (ensure(&ctx->stage, &ctx->nstage, (size_t)(t->numel ? t->numel : 1), err, errlen)) return 2;
  k_to_double<<<blocks(t->numel), 256, 0, s>>>(ctx->stage, view(*t), t->numel);
  CK(cudaGetLastError());
  CK(cudaMemcpyAsync(host, ctx->stage, sizeof(double) * (size_t)t->numel, cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  return 0;
}

extern "C" int evt_fb_sgd(const evt_fb_tensor *p, const evt_fb_tensor *g, double lr, void *stream, char *err,
                          size_t errlen) {
  if (p->numel != g->numel) {
    snprintf(err, errlen, "sgd: the param has %lld elements, its gradient %lld", (long long)p->numel,
             (long long)g->numel);
    return 1;
  }
  if (p->dtype != EVT_FB_F32 && p->dtype != EVT_FB_F16 && p->dtype != EVT_FB_BF16) return 0; /* (not trained) */
  if (p->numel > 0) {
    k_sgd<<<blocks(p->numel), 256, 0, (cudaStream_t)stream>>>(p->ptr, p->dtype, view(*g), lr, p->numel);
    CK(cudaGetLastError());
  }
  return 0;
}

__global__ void k_rng_step(unsigned long long *step, unsigned long long value, int set) {
  *step = set ? value : *step + 1;
}

extern "C" int evt_fb_rng_step(unsigned long long *step, unsigned long long value, int set, void *stream, char *err,
                               size_t errlen) {
  k_rng_step<<<1, 1, 0, (cudaStream_t)stream>>>(step, value, set);
  CK(cudaGetLastError());
  return 0;
}

extern "C" int evt_fb_copy(void *dst, const void *src, int64_t bytes, void *stream, char *err, size_t errlen) {
  if (bytes > 0) CK(cudaMemcpyAsync(dst, src, (size_t)bytes, cudaMemcpyDeviceToDevice, (cudaStream_t)stream));
  return 0;
}

extern "C" int evt_fb_sync(void *stream, int *bad_node, char *err, size_t errlen) {
  CK(cudaStreamSynchronize((cudaStream_t)stream));
  int b = 0;
  CK(cudaMemcpyFromSymbol(&b, g_bad_node, sizeof b));
  *bad_node = b - 1;
  if (b) {
    int zero = 0;
    CK(cudaMemcpyToSymbol(g_bad_node, &zero, sizeof zero));
  }
  return 0;
}

extern "C" int evt_fb_stream_new(void **stream, char *err, size_t errlen) {
  cudaStream_t s = NULL;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  *stream = (void *)s;
  return 0;
}

extern "C" void evt_fb_stream_free(void *stream) {
  if (stream) cudaStreamDestroy((cudaStream_t)stream);
}

/* ---- CUDA graphs: capture a step enqueued on a stream, replay it ----------------------------------- */

extern "C" int evt_fb_capture_begin(void *stream, char *err, size_t errlen) {
  /* relaxed: a generated launcher may cudaMalloc its workspace on first use while being captured */
  CK(cudaStreamBeginCapture((cudaStream_t)stream, cudaStreamCaptureModeRelaxed));
  return 0;
}

/* Ends the capture; instantiates the graph into *exec unless discard (a failed step: capture abandoned). */
extern "C" int evt_fb_capture_end(void *stream, int discard, void **exec, char *err, size_t errlen) {
  cudaGraph_t graph = NULL;
  *exec = NULL;
  cudaError_t e = cudaStreamEndCapture((cudaStream_t)stream, &graph);
  if (discard) {
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    return 0;
  }
  if (e != cudaSuccess) {
    if (graph) cudaGraphDestroy(graph);
    snprintf(err, errlen, "cudaStreamEndCapture: %s", cudaGetErrorString(e));
    return 2;
  }
  cudaGraphExec_t x = NULL;
  e = cudaGraphInstantiate(&x, graph, 0);
  cudaGraphDestroy(graph);
  if (e != cudaSuccess) {
    snprintf(err, errlen, "cudaGraphInstantiate: %s", cudaGetErrorString(e));
    return 2;
  }
  *exec = (void *)x;
  return 0;
}

extern "C" int evt_fb_graph_launch(void *exec, void *stream, char *err, size_t errlen) {
  CK(cudaGraphLaunch((cudaGraphExec_t)exec, (cudaStream_t)stream));
  return 0;
}

extern "C" void evt_fb_graph_free(void *exec) {
  if (exec) cudaGraphExecDestroy((cudaGraphExec_t)exec);
}

/* ---- events (evt_cuda_step's step time) ------------------------------------------------------------ */

/* D = op(A).op(B) + bias (an N-vector in D's dtype, broadcast over the rows) through cuBLASLt's BIAS
 * epilogue: f32 accumulation, the bias added in f32, one rounding to D's dtype. Unbatched, packed or
 * strided by the leading dims of g. */
static int lt_gemm_bias(evt_fb_ctx *c, const evt_fb_gemm *g, cudaDataType_t ab, cudaDataType_t dt, void *stream,
                        char *err, size_t errlen) {
  if (g->batch != 1) {
    snprintf(err, errlen, "cuBLASLt bias GEMM: batched (%lld) is not supported", (long long)g->batch);
    return 1;
  }
#define LTK(x)                                                                     \
  do {                                                                             \
    cublasStatus_t s_ = (x);                                                       \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                             \
      snprintf(err, errlen, "%s failed (cuBLAS status %d)", #x, (int)s_);          \
      return 2;                                                                    \
    }                                                                              \
  } while (0)
  if (!c->lt) LTK(cublasLtCreate(&c->lt));
  lt_plan *p = NULL;
  for (int i = 0; i < LT_PLANS && !p; i++) {
    lt_plan *q = &c->plans[i];
    if (q->used && q->m == g->m && q->n == g->n && q->k == g->k && q->ta == g->ta && q->tb == g->tb &&
        q->ab == g->ab_dtype && q->d == g->d_dtype)
      p = q;
  }
  if (!p) {
    p = &c->plans[c->next_plan];
    c->next_plan = (c->next_plan + 1) % LT_PLANS;
    lt_plan_free(p);
    p->used = 1, p->m = (int)g->m, p->n = (int)g->n, p->k = (int)g->k, p->ta = g->ta, p->tb = g->tb;
    p->ab = g->ab_dtype, p->d = g->d_dtype;
    LTK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    /* column-major D^T[N,M] = B^T A^T, as in evt_fb_gemm_run */
    cublasOperation_t opb = g->tb ? CUBLAS_OP_T : CUBLAS_OP_N, opa = g->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    LTK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &opb, sizeof opb));
    LTK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &opa, sizeof opa));
    cublasLtEpilogue_t e = CUBLASLT_EPILOGUE_BIAS;
    LTK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e));
    const void *b0 = g->bias;
    LTK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &b0, sizeof b0));
    if (opb == CUBLAS_OP_N) LTK(cublasLtMatrixLayoutCreate(&p->la, ab, (uint64_t)g->n, (uint64_t)g->k, g->ldb));
    else LTK(cublasLtMatrixLayoutCreate(&p->la, ab, (uint64_t)g->k, (uint64_t)g->n, g->ldb));
    if (opa == CUBLAS_OP_N) LTK(cublasLtMatrixLayoutCreate(&p->lb, ab, (uint64_t)g->k, (uint64_t)g->m, g->lda));
    else LTK(cublasLtMatrixLayoutCreate(&p->lb, ab, (uint64_t)g->m, (uint64_t)g->k, g->lda));
    LTK(cublasLtMatrixLayoutCreate(&p->lc, dt, (uint64_t)g->n, (uint64_t)g->m, g->ldd));
    cublasLtMatmulPreference_t pref;
    LTK(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = c->cublas_ws_bytes;
    cublasStatus_t ps = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    cublasLtMatmulHeuristicResult_t res;
    int nres = 0;
    cublasStatus_t hs = ps == CUBLAS_STATUS_SUCCESS
                            ? cublasLtMatmulAlgoGetHeuristic(c->lt, p->op, p->la, p->lb, p->lc, p->lc, pref, 1, &res, &nres)
                            : ps;
    cublasLtMatmulPreferenceDestroy(pref);
    if (hs != CUBLAS_STATUS_SUCCESS || nres < 1) {
      lt_plan_free(p);
      snprintf(err, errlen, "cuBLASLt has no algorithm for the bias GEMM %lldx%lldx%lld (status %d)", (long long)g->m,
               (long long)g->n, (long long)g->k, (int)hs);
      return 1;
    }
    p->algo = res.algo;
  }
  const void *bias = g->bias;
  LTK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  float alpha = 1.0f, beta = 0.0f;
  c->launches++;
  LTK(cublasLtMatmul(c->lt, p->op, &alpha, g->b, p->la, g->a, p->lb, &beta, g->d, p->lc, g->d, p->lc, &p->algo,
                     c->cublas_ws, c->cublas_ws_bytes, (cudaStream_t)stream));
#undef LTK
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    snprintf(err, errlen, "cuBLASLt bias GEMM: %s", cudaGetErrorString(e));
    return 2;
  }
  return 0;
}

extern "C" int evt_fb_gemm_run(evt_fb_ctx *c, const evt_fb_gemm *g, void *stream, char *err, size_t errlen) {
  const int dts[3] = {EVT_FB_F32, EVT_FB_F16, EVT_FB_BF16};
  const cudaDataType_t cts[3] = {CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF};
  int ia = -1, id = -1;
  for (int i = 0; i < 3; i++) {
    if (g->ab_dtype == dts[i]) ia = i;
    if (g->d_dtype == dts[i]) id = i;
  }
  if (ia < 0 || id < 0 || (g->d_dtype != g->ab_dtype && g->d_dtype != EVT_FB_F32)) {
    snprintf(err, errlen, "cuBLAS GEMM: operands %d, result %d: unsupported dtypes", g->ab_dtype, g->d_dtype);
    return 1;
  }
  const int64_t lim = INT32_MAX;
  if (g->m < 1 || g->n < 1 || g->k < 1 || g->batch < 1 || g->m > lim || g->n > lim || g->k > lim || g->batch > lim ||
      g->lda > lim || g->ldb > lim || g->ldd > lim) {
    snprintf(err, errlen, "cuBLAS GEMM: sizes %lld x %lld x %lld (batch %lld) out of range", (long long)g->m,
             (long long)g->n, (long long)g->k, (long long)g->batch);
    return 1;
  }
  if (g->bias) return lt_gemm_bias(c, g, cts[ia], cts[id], stream, err, errlen);
  cublasSetStream(c->cublas, (cudaStream_t)stream);
  cublasSetWorkspace(c->cublas, c->cublas_ws, c->cublas_ws_bytes); /* after SetStream, which resets it */
  c->launches++;
  float alpha = 1.0f, beta = 0.0f;
  /* row-major D[M,N] = A B  <=>  column-major D^T[N,M] = B^T A^T: B is cuBLAS's first operand; a row-major
   * K x N B is a column-major N x K matrix (no transpose), a row-major N x K B needs one; A likewise */
  cublasStatus_t cs = cublasGemmStridedBatchedEx(
      c->cublas, g->tb ? CUBLAS_OP_T : CUBLAS_OP_N, g->ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)g->n, (int)g->m, (int)g->k,
      &alpha, g->b, cts[ia], (int)g->ldb, g->sb, g->a, cts[ia], (int)g->lda, g->sa, &beta, g->d, cts[id], (int)g->ldd,
      g->sd, (int)g->batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (cs != CUBLAS_STATUS_SUCCESS) {
    snprintf(err, errlen, "cublasGemmStridedBatchedEx failed (status %d)", (int)cs);
    return 2;
  }
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    snprintf(err, errlen, "cuBLAS GEMM: %s", cudaGetErrorString(e));
    return 2;
  }
  return 0;
}

extern "C" int evt_fb_event_new(void **ev, char *err, size_t errlen) {
  cudaEvent_t e = NULL;
  CK(cudaEventCreate(&e));
  *ev = (void *)e;
  return 0;
}

extern "C" int evt_fb_event_record(void *ev, void *stream, char *err, size_t errlen) {
  CK(cudaEventRecord((cudaEvent_t)ev, (cudaStream_t)stream));
  return 0;
}

/* Waits for `to`; milliseconds between the two events. */
extern "C" int evt_fb_event_ms(void *from, void *to, double *ms, char *err, size_t errlen) {
  float f = 0;
  CK(cudaEventSynchronize((cudaEvent_t)to));
  CK(cudaEventElapsedTime(&f, (cudaEvent_t)from, (cudaEvent_t)to));
  *ms = f;
  return 0;
}

extern "C" void evt_fb_event_free(void *ev) {
  if (ev) cudaEventDestroy((cudaEvent_t)ev);
}

/* 1 when `stream` is being captured into a CUDA graph (or the query fails: treat as capturing), else 0. */
extern "C" int evt_fb_stream_capturing(void *stream) {
  cudaStreamCaptureStatus s = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing((cudaStream_t)stream, &s) != cudaSuccess) {
    (void)cudaGetLastError();
    return 1;
  }
  return s != cudaStreamCaptureStatusNone;
}

#define UNSUPPORTED(msg)                                                                                   \
  do {                                                                                                     \
    snprintf(err, errlen, "%s", msg);                                                                      \
    return 1;                                                                                              \
  } while (0)

/* One launch of a move kernel for elements of `bytes` bytes (1, 2, 4 or 8): out_ and in_ become T *. */
#define MOVE_CASE(T, KERNEL, grid, out_, in_, ...)                                                         \
  KERNEL<T><<<grid, 256, 0, ST>>>(static_cast<T *>(out_), static_cast<const T *>(in_), __VA_ARGS__)
#define MOVE_DISPATCH(bytes, KERNEL, grid, out_, in_, ...)                                                 \
  do {                                                                                                     \
    switch (bytes) {                                                                                       \
    case 1: MOVE_CASE(uint8_t, KERNEL, grid, out_, in_, __VA_ARGS__); break;                               \
    case 2: MOVE_CASE(uint16_t, KERNEL, grid, out_, in_, __VA_ARGS__); break;                              \
    case 4: MOVE_CASE(uint32_t, KERNEL, grid, out_, in_, __VA_ARGS__); break;                              \
    default: MOVE_CASE(uint64_t, KERNEL, grid, out_, in_, __VA_ARGS__); break;                             \
    }                                                                                                      \
  } while (0)

/* A permute / transpose node: its permutation (out dim d reads input dim perm[d]) and the gather strides of
 * its input at the output's shape. Returns NULL, or why the node is malformed. */
static const char *permute_plan(const evt_fb_node *nd, int *perm, strides *s1) {
  const evt_fb_tensor &x = nd->in[0], &out = nd->out;
  const evt_fb_attrs &a = nd->a;
  for (int d = 0; d < x.rank; d++) perm[d] = d;
  if (nd->op == EVT_FB_OP_PERMUTE) {
    if (a.ndims != x.rank) return "permute needs one dim per input dim";
    for (int d = 0; d < x.rank; d++) perm[d] = normdim(a.dims[d], x.rank);
  } else if (x.rank > 0) {
    int p0 = a.ndims == 2 ? normdim(a.dims[0], x.rank) : -1, p1 = a.ndims == 2 ? normdim(a.dims[1], x.rank) : -1;
    if (p0 < 0 || p1 < 0) return "transpose needs dims=[a,b]";
    perm[p0] = p1;
    perm[p1] = p0;
  }
  ll xs[R];
  contig(x, xs);
  memset(s1, 0, sizeof *s1);
  for (int d = 0; d < x.rank; d++) {
    if (perm[d] < 0 || out.shape[d] != x.shape[perm[d]]) return "bad permutation";
    s1->s[d] = xs[perm[d]];
  }
  return NULL;
}

/* A slice / slice_backward node: the strides and base offset of the part (the slice) within the full tensor
 * (contiguous), indexed row-major over the part's shape. Returns NULL, or why the node is malformed. */
static const char *slice_plan(const evt_fb_node *nd, strides *s1, ll *base) {
  bool fwd = nd->op == EVT_FB_OP_SLICE;
  const evt_fb_tensor &full = fwd ? nd->in[0] : nd->out, &part = fwd ? nd->out : nd->in[0];
  const evt_fb_attrs &a = nd->a;
  int d = normdim(a.dim, full.rank);
  if (d < 0 || part.rank != full.rank || a.step < 1) return "bad slice dim or step";
  ll fs[R];
  contig(full, fs);
  ll size = full.shape[d];
  ll s0 = a.start < 0 ? a.start + size : a.start;
  s0 = s0 < 0 ? 0 : s0 > size ? size : s0;
  memset(s1, 0, sizeof *s1);
  for (int k = 0; k < full.rank; k++) s1->s[k] = k == d ? fs[k] * a.step : fs[k];
  *base = s0 * fs[d];
  return NULL;
}

/* ---- attention through cuDNN's fused flash attention (kernels/evt_cudnn_sdpa.h) ------------------------
 * sdpa and sdpa_backward_{q,k,v} with bf16 / f16 q, k, v, dout and output, no broadcast batch dims, 16-byte
 * aligned buffers, and a shape cuDNN supports run through cuDNN; anything else (f32, no cuDNN) on k_sdpa, the
 * reference kernel in double (one thread per query row).
 * [..., H, S, D] maps to cuDNN's [B, H, S, D] with B the product of the leading dims; contiguous strides. A
 * backward node recomputes the forward (out and the log-sum-exp stats, into the context's scratch) and runs
 * cuDNN's backward, which writes all three gradients: its own into the output, the other two into scratch,
 * where its siblings (the graph's other gradients of the same (dout, q, k, v): attrs.sdpa_siblings) copy theirs
 * from (ctx->memo) unless they already took one since (then the scratch is another step's: compute again).
 * Under CUDA-graph capture the same decisions are recorded, so replays do the same. */
static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

static bool attn_cudnn(const evt_fb_node *nd, evt_cudnn_sdpa_desc *d) {
  int op = nd->op;
  if (op != EVT_FB_OP_SDPA && op != EVT_FB_OP_SDPA_BACKWARD_Q && op != EVT_FB_OP_SDPA_BACKWARD_K &&
      op != EVT_FB_OP_SDPA_BACKWARD_V)
    return false;
  int base = op == EVT_FB_OP_SDPA ? 0 : 1, dt = nd->out.dtype;
  if (dt != EVT_FB_BF16 && dt != EVT_FB_F16) return false;
  for (int i = 0; i < base + 3; i++)
    if (nd->in[i].dtype != dt || !aligned16(nd->in[i].ptr)) return false;
  if (!aligned16(nd->out.ptr)) return false;
  const evt_fb_tensor &q = nd->in[base], &k = nd->in[base + 1], &v = nd->in[base + 2];
  int r = q.rank;
  if (r < 2 || k.rank != r || v.rank != r) return false;
  for (int i = 0; i < r - 2; i++)
    if (k.shape[i] != q.shape[i] || v.shape[i] != q.shape[i]) return false;
  if (v.shape[r - 2] != k.shape[r - 2]) return false;
  memset(d, 0, sizeof *d);
  d->h = r >= 3 ? q.shape[r - 3] : 1;
  d->b = r >= 4 ? prod(q.shape, 0, r - 3) : 1;
  d->sq = q.shape[r - 2], d->d = q.shape[r - 1], d->skv = k.shape[r - 2], d->dv = v.shape[r - 1];
  d->dtype = dt == EVT_FB_BF16 ? EVT_CUDNN_SDPA_BF16 : EVT_CUDNN_SDPA_F16;
  d->causal = nd->a.causal != 0;
  d->scale = (float)(nd->a.scale != 0 ? nd->a.scale : 1.0 / sqrt((double)d->d));
  evt_cudnn_sdpa_set_strides(d, 0);
  char why[400];
  if (!evt_cudnn_sdpa_supported(d, why, sizeof why)) {
    static int said; /* once per process */
    if (!said++)
      fprintf(stderr, "evt: attention (node %d) runs on the reference kernel: %s\n", nd->id, why);
    return false;
  }
  return true;
}

static size_t round256(size_t b) { return (b + 255) / 256 * 256; }

/* The scratch of an attention node on cuDNN, from base: the stats; for a backward also out and the three
 * gradients (q, k, v). Returns its bytes; with base NULL only the size. */
struct attn_scratch {
  float *stats;
  void *o, *g[3];
};
static size_t attn_scratch_layout(int op, const evt_cudnn_sdpa_desc *d, void *base, attn_scratch *sc) {
  size_t bh = (size_t)(d->b * d->h);
  size_t part[5] = {bh * (size_t)d->sq * 4, bh * (size_t)(d->sq * d->dv) * 2, bh * (size_t)(d->sq * d->d) * 2,
                    bh * (size_t)(d->skv * d->d) * 2, bh * (size_t)(d->skv * d->dv) * 2};
  int np = op == EVT_FB_OP_SDPA ? 1 : 5;
  size_t off[5], total = 0;
  for (int i = 0; i < np; i++) off[i] = total, total += round256(part[i]);
  if (base && sc) {
    char *b = (char *)base;
    sc->stats = (float *)b;
    sc->o = np > 1 ? b + off[1] : NULL;
    for (int i = 0; i < 3; i++) sc->g[i] = np > 1 ? b + off[2 + i] : NULL;
  }
  return total;
}
static size_t attn_scratch_bytes(int op, const evt_cudnn_sdpa_desc *d) { return attn_scratch_layout(op, d, NULL, NULL); }

/* -1: not on cuDNN (evt_fb_run takes the reference path); else evt_fb_run's result. */
static int attn_run(evt_fb_ctx *ctx, const evt_fb_node *nd, char *err, size_t errlen) {
  evt_cudnn_sdpa_desc d;
  if (!attn_cudnn(nd, &d)) return -1;
  if (evt_fb_reserve(ctx, nd, err, errlen)) return 2;
  attn_scratch sc;
  attn_scratch_layout(nd->op, &d, ctx->attn, &sc);
  float *stats = sc.stats;
  char e[400];
  int op = nd->op;
  const evt_fb_tensor *in = nd->in;
  if (op == EVT_FB_OP_SDPA) {
    evt_fb_ctx::attn_saved *sv = NULL;
    for (int i = 0; i < ctx->nsaved && !sv; i++)
      if (ctx->saved[i].node == nd->id) sv = &ctx->saved[i];
    if (!sv) ctx->memo.valid = false; /* (its statistics go to the scratch, over what a backward left there) */
    ctx->launches++;
    if (evt_cudnn_sdpa_fwd(ctx->stream, &d, in[0].ptr, in[1].ptr, in[2].ptr, nd->out.ptr, sv ? sv->stats : stats, e,
                           sizeof e)) {
      snprintf(err, errlen, "attention forward (cuDNN): %s", e);
      return 1;
    }
    if (sv) { /* out for the backward too (the arena may reuse the output's memory before then) */
      ctx->launches++;
      CK(cudaMemcpyAsync(sv->o, nd->out.ptr, (size_t)nd->out.numel * 2, cudaMemcpyDeviceToDevice, ctx->stream));
      for (int i = 0; i < 3; i++) sv->qkv[i] = in[i].ptr;
      sv->d = d;
      sv->stamp = ++ctx->stamps;
    }
    return 0;
  }
  void *o = sc.o, *g[3] = {sc.g[0], sc.g[1], sc.g[2]};
  int which = op == EVT_FB_OP_SDPA_BACKWARD_Q ? 0 : op == EVT_FB_OP_SDPA_BACKWARD_K ? 1 : 2, bit = 1 << which;
  int siblings = nd->a.sdpa_siblings | bit;
  auto &m = ctx->memo;
  bool hit = m.valid && !(m.served & bit) && !memcmp(&m.d, &d, sizeof d);
  for (int i = 0; i < 4 && hit; i++) hit = m.in[i] == in[i].ptr;
  if (hit) { /* a sibling computed this gradient into the scratch */
    ctx->launches++;
    CK(cudaMemcpyAsync(nd->out.ptr, g[which], (size_t)nd->out.numel * 2, cudaMemcpyDeviceToDevice, ctx->stream));
    m.served |= bit;
    if ((m.served & m.siblings) == m.siblings) m.valid = false;
    return 0;
  }
  g[which] = nd->out.ptr;
  m.valid = false;
  /* the forward's out and statistics when this program ran it: the latest run on these very q, k, v (an earlier
   * forward on the same addresses had its inputs die before this one's were written there) */
  const evt_fb_ctx::attn_saved *sv = NULL;
  for (int i = 0; i < ctx->nsaved; i++) {
    const evt_fb_ctx::attn_saved *c = &ctx->saved[i];
    if (c->stamp && c->qkv[0] == in[1].ptr && c->qkv[1] == in[2].ptr && c->qkv[2] == in[3].ptr &&
        !memcmp(&c->d, &d, sizeof d) && (!sv || c->stamp > sv->stamp))
      sv = c;
  }
  if (sv) o = sv->o, stats = sv->stats;
  ctx->launches += sv ? 1 : 2;
  if ((!sv && evt_cudnn_sdpa_fwd(ctx->stream, &d, in[1].ptr, in[2].ptr, in[3].ptr, o, stats, e, sizeof e)) ||
      evt_cudnn_sdpa_bwd(ctx->stream, &d, in[1].ptr, in[2].ptr, in[3].ptr, o, stats, in[0].ptr, g[0], g[1], g[2], e,
                         sizeof e)) {
    snprintf(err, errlen, "attention backward (cuDNN): %s", e);
    return 1;
  }
  if (siblings != bit) {
    m.valid = true;
    for (int i = 0; i < 4; i++) m.in[i] = in[i].ptr;
    m.d = d;
    m.served = bit;
    m.siblings = siblings;
  }
  return 0;
}

/* Permutes, expands, reshapes, slices, slice gradients, concats and index / embedding gathers whose data
 * operand has the output's dtype, in that dtype (see k_move_gather). Returns -1 when the node is not one of
 * them (evt_fb_run then takes the double path), else evt_fb_run's result. */
static int move_native(evt_fb_ctx *ctx, const evt_fb_node *nd, char *err, size_t errlen) {
  const evt_fb_tensor &out = nd->out;
  const evt_fb_tensor *in = nd->in;
  const evt_fb_attrs &a = nd->a;
  int op = nd->op, ndata = 1;
  switch (op) {
  case EVT_FB_OP_RESHAPE: case EVT_FB_OP_SQUEEZE: case EVT_FB_OP_UNSQUEEZE: case EVT_FB_OP_PERMUTE:
  case EVT_FB_OP_TRANSPOSE: case EVT_FB_OP_EXPAND: case EVT_FB_OP_SLICE: case EVT_FB_OP_SLICE_BACKWARD:
  case EVT_FB_OP_EMBEDDING: case EVT_FB_OP_INDEX_SELECT: break;
  case EVT_FB_OP_CONCAT: ndata = nd->ninputs; break;
  default: return -1;
  }
  if (nd->ninputs < 1) return -1;
  for (int k = 0; k < ndata; k++)
    if (in[k].dtype != out.dtype) return -1;
  int bytes = evt_fb_dtype_bytes(out.dtype);
  if (bytes != 1 && bytes != 2 && bytes != 4 && bytes != 8) return -1;
  ll n = out.numel;
  if (n == 0) return 0;
  /* the double path reads every operand before it writes: keep it for an output that overlaps one */
  const char *ob = static_cast<const char *>(out.ptr), *oe = ob + (size_t)n * bytes;
  for (int k = 0; k < ndata; k++) {
    const char *ib = static_cast<const char *>(in[k].ptr), *ie = ib + (size_t)in[k].numel * bytes;
    if (ib < oe && ob < ie) return -1;
  }
  void *o = out.ptr;
  const void *x = in[0].ptr;
  strides s1;
  memset(&s1, 0, sizeof s1);
  ll base = 0;
  shape_t sh = shape_of(out);
  switch (op) {
  case EVT_FB_OP_RESHAPE: case EVT_FB_OP_SQUEEZE: case EVT_FB_OP_UNSQUEEZE:
    if (in[0].numel != n) return -1;
    CK(cudaMemcpyAsync(o, x, (size_t)n * bytes, cudaMemcpyDeviceToDevice, ST));
    return 0;
  case EVT_FB_OP_PERMUTE: case EVT_FB_OP_TRANSPOSE: {
    const evt_fb_tensor &t = in[0];
    int perm[R];
    if (permute_plan(nd, perm, &s1)) return -1; /* (the double path reports it) */
    /* a batched transpose: perm = [0 .. b-1, then the dims b+k .. r-1, then b .. b+k-1] */
    int r = t.rank, b0 = 0;
    while (b0 < r && perm[b0] == b0) b0++;
    if (b0 < r - 1) {
      int k = perm[b0] - b0; /* the first moved output dim starts the input's second block */
      bool two_blocks = k > 0 && k < r - b0;
      for (int j = 0; two_blocks && j < r - b0; j++)
        two_blocks = perm[b0 + j] == (j < r - b0 - k ? b0 + k + j : b0 + j - (r - b0 - k));
      if (two_blocks) {
        ll nb = prod(t.shape, 0, b0), Y = prod(t.shape, b0, b0 + k), X = prod(t.shape, b0 + k, r);
        if (nb <= 65535 && (Y + 31) / 32 <= 65535) {
          dim3 grid((unsigned)((X + 31) / 32), (unsigned)((Y + 31) / 32), (unsigned)nb), block(32, 8);
          switch (bytes) {
          case 1: k_move_transpose<uint8_t><<<grid, block, 0, ST>>>(static_cast<uint8_t *>(o), static_cast<const uint8_t *>(x), Y, X); break;
          case 2: k_move_transpose<uint16_t><<<grid, block, 0, ST>>>(static_cast<uint16_t *>(o), static_cast<const uint16_t *>(x), Y, X); break;
          case 4: k_move_transpose<uint32_t><<<grid, block, 0, ST>>>(static_cast<uint32_t *>(o), static_cast<const uint32_t *>(x), Y, X); break;
          default: k_move_transpose<uint64_t><<<grid, block, 0, ST>>>(static_cast<uint64_t *>(o), static_cast<const uint64_t *>(x), Y, X); break;
          }
          CK(cudaGetLastError());
          return 0;
        }
      }
    }
    break;
  }
  case EVT_FB_OP_EXPAND:
    if (!bcast(in[0], out, &s1)) return -1;
    break;
  case EVT_FB_OP_SLICE: case EVT_FB_OP_SLICE_BACKWARD: {
    bool fwd = op == EVT_FB_OP_SLICE;
    const evt_fb_tensor &part = fwd ? out : in[0];
    if (slice_plan(nd, &s1, &base)) return -1;
    if (!fwd) {
      CK(cudaMemsetAsync(o, 0, (size_t)n * bytes, ST));
      if (part.numel) MOVE_DISPATCH(bytes, k_move_scatter, blocks(part.numel), o, x, part.numel, shape_of(part), s1, base);
      CK(cudaGetLastError());
      return 0;
    }
    break;
  }
  case EVT_FB_OP_CONCAT: {
    int d = normdim(a.dim, out.rank);
    if (d < 0) return -1;
    ll outer = prod(out.shape, 0, d), inner = prod(out.shape, d + 1, out.rank), row = out.shape[d] * inner, at = 0;
    for (int k = 0; k < nd->ninputs; k++)
      if ((at += in[k].shape[d] * inner) > row) return -1;
    at = 0;
    for (int k = 0; k < nd->ninputs; k++) {
      ll chunk = in[k].shape[d] * inner;
      if (outer * chunk) MOVE_DISPATCH(bytes, k_move_concat, blocks(outer * chunk), o, in[k].ptr, outer, chunk, row, at);
      at += chunk;
    }
    CK(cudaGetLastError());
    return 0;
  }
  case EVT_FB_OP_EMBEDDING: case EVT_FB_OP_INDEX_SELECT: {
    const evt_fb_tensor &src = in[0], &idx = in[1];
    if (nd->ninputs < 2) return -1;
    ll outer, len, inner;
    if (op == EVT_FB_OP_EMBEDDING) {
      if (src.rank != 2) return -1;
      outer = 1, len = src.shape[0], inner = src.shape[1];
    } else {
      int d = normdim(a.dim, src.rank);
      if (d < 0) return -1;
      outer = prod(src.shape, 0, d), len = src.shape[d], inner = prod(src.shape, d + 1, src.rank);
    }
    if (outer * idx.numel * inner != n) return -1;
    MOVE_DISPATCH(bytes, k_move_index, blocks(n), o, x, view(idx), outer, len, inner, idx.numel, nd->id);
    CK(cudaGetLastError());
    return 0;
  }
  }
  MOVE_DISPATCH(bytes, k_move_gather, blocks(n), o, x, n, sh, s1, base);
  CK(cudaGetLastError());
  return 0;
}

extern "C" int evt_fb_run(evt_fb_ctx *ctx, const evt_fb_node *nd, void *stream, char *err, size_t errlen) {
  const evt_fb_tensor &out = nd->out;
  const evt_fb_tensor *in = nd->in;
  const evt_fb_attrs &a = nd->a;
  ll n = out.numel;
  int op = nd->op;
  ctx->stream = (cudaStream_t)stream;
  int moved = move_native(ctx, nd, err, errlen);
  if (moved >= 0) return moved;
  int attn = attn_run(ctx, nd, err, errlen);
  if (attn >= 0) return attn;
  if (evt_fb_reserve(ctx, nd, err, errlen)) return 2; /* no-op when reserved before the step */
  double *S = ctx->s1;
  if (!writes_every_element(op)) CK(cudaMemsetAsync(S, 0, sizeof(double) * (size_t)(n ? n : 1), ctx->stream));
  int nb = blocks(n);
  tv none = {NULL, 0};
  switch (op) {
  case EVT_FB_OP_INPUT: case EVT_FB_OP_PARAM:
    UNSUPPORTED("an input or parameter has no computation");
  case EVT_FB_OP_FULL: case EVT_FB_OP_SCALAR:
    k_fill<<<nb, 256, 0, ST>>>(S, n, a.value);
    break;
  case EVT_FB_OP_RAND: case EVT_FB_OP_DROPOUT:
    if (op == EVT_FB_OP_DROPOUT && !(a.p >= 0 && a.p <= 1)) UNSUPPORTED("dropout p is not in [0, 1]");
    k_rand<<<nb, 256, 0, ST>>>(S, n, a, op == EVT_FB_OP_DROPOUT ? view(in[0]) : none, op == EVT_FB_OP_DROPOUT);
    break;
  case EVT_FB_OP_NEG: case EVT_FB_OP_EXP: case EVT_FB_OP_LOG: case EVT_FB_OP_SQRT: case EVT_FB_OP_RSQRT:
  case EVT_FB_OP_RECIPROCAL: case EVT_FB_OP_ABS: case EVT_FB_OP_SIGN: case EVT_FB_OP_TANH: case EVT_FB_OP_SIGMOID:
  case EVT_FB_OP_RELU: case EVT_FB_OP_GELU: case EVT_FB_OP_ERF: case EVT_FB_OP_CAST: case EVT_FB_OP_POW:
  case EVT_FB_OP_GELU_BACKWARD: case EVT_FB_OP_THRESHOLD_BACKWARD:
  case EVT_FB_OP_ADD: case EVT_FB_OP_SUB: case EVT_FB_OP_MUL: case EVT_FB_OP_DIV: case EVT_FB_OP_MAXIMUM:
  case EVT_FB_OP_MINIMUM: case EVT_FB_OP_EQ: case EVT_FB_OP_NE: case EVT_FB_OP_LT: case EVT_FB_OP_LE:
  case EVT_FB_OP_GT: case EVT_FB_OP_GE: case EVT_FB_OP_WHERE: {
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
    k_elementwise<<<nb, 256, 0, ST>>>(S, n, op, a, shape_of(out), nd->ninputs, view(in[0]),
                               nd->ninputs > 1 ? view(in[1]) : none, nd->ninputs > 2 ? view(in[2]) : none, s[0],
                               s[1], s[2], dense);
    break;
  }
  case EVT_FB_OP_SUM: case EVT_FB_OP_MEAN: case EVT_FB_OP_AMAX: {
    const evt_fb_tensor &x = in[0];
    bool red[R] = {0};
    if (a.ndims == 0)
      for (int d = 0; d < x.rank; d++) red[d] = true;
    for (int k = 0; k < a.ndims; k++) {
      int d = normdim(a.dims[k], x.rank);
      if (d < 0) UNSUPPORTED("reduction dim out of range");
      red[d] = true;
    }
    ll xs[R];
    contig(x, xs);
    shape_t kept = {0, {1, 1, 1, 1, 1, 1}}, rs = {0, {1, 1, 1, 1, 1, 1}};
    strides kst, rst;
    memset(&kst, 0, sizeof kst);
    memset(&rst, 0, sizeof rst);
    ll count = 1;
    for (int d = 0; d < x.rank; d++) {
      if (red[d]) {
        rst.s[rs.rank] = xs[d];
        rs.d[rs.rank++] = x.shape[d];
        count *= x.shape[d];
      } else {
        kst.s[kept.rank] = xs[d];
        kept.d[kept.rank++] = x.shape[d];
      }
    }
    if (op == EVT_FB_OP_AMAX && count == 0) UNSUPPORTED("amax over zero elements");
    if (count >= 512 && n <= (ll)1 << 20) /* few long reductions: a block each */
      k_reduce_wide<<<(unsigned)(n < 65535 * 4 ? (n > 0 ? n : 1) : 65535 * 4), 256, 0, ST>>>(S, n, op, view(x), kept, kst, rs, rst, count);
    else
      k_reduce<<<nb, 256, 0, ST>>>(S, n, op, view(x), kept, kst, rs, rst, count);
    break;
  }
  case EVT_FB_OP_SOFTMAX: case EVT_FB_OP_LOG_SOFTMAX: case EVT_FB_OP_SOFTMAX_BACKWARD:
  case EVT_FB_OP_LOG_SOFTMAX_BACKWARD: {
    const evt_fb_tensor &x = in[0];
    int d = x.rank == 0 ? 0 : normdim(a.dim, x.rank);
    if (d < 0) UNSUPPORTED("dim out of range");
    ll outer = x.rank ? prod(x.shape, 0, d) : 1, len = x.rank ? x.shape[d] : 1;
    ll inner = x.rank ? prod(x.shape, d + 1, x.rank) : 1;
    k_softmax<<<blocks(outer * inner), 256, 0, ST>>>(S, op, view(in[0]), nd->ninputs > 1 ? view(in[1]) : none, outer, len,
                                              inner);
    break;
  }
  case EVT_FB_OP_LAYER_NORM: case EVT_FB_OP_LAYER_NORM_BACKWARD_INPUT: case EVT_FB_OP_LAYER_NORM_BACKWARD_WEIGHT:
  case EVT_FB_OP_BATCH_NORM: case EVT_FB_OP_BATCH_NORM_BACKWARD_INPUT: case EVT_FB_OP_BATCH_NORM_BACKWARD_WEIGHT: {
    bool layer = op == EVT_FB_OP_LAYER_NORM || op == EVT_FB_OP_LAYER_NORM_BACKWARD_INPUT ||
                 op == EVT_FB_OP_LAYER_NORM_BACKWARD_WEIGHT;
    bool fwd = op == EVT_FB_OP_LAYER_NORM || op == EVT_FB_OP_BATCH_NORM;
    const evt_fb_tensor &x = fwd ? in[0] : in[1];
    tv dy = fwd ? none : view(in[0]), w = none, b = none;
    if (fwd) {
      if (nd->ninputs > 1) w = view(in[1]);
      if (nd->ninputs > 2) b = view(in[2]);
    } else if (nd->ninputs > 2) {
      w = view(in[2]);
    }
    ll groups, outer = 0, inner = 0, len = 0, count;
    if (layer) {
      if (x.rank < 1) UNSUPPORTED("layer_norm needs rank >= 1");
      len = x.shape[x.rank - 1];
      groups = len ? x.numel / len : 0;
      count = len;
    } else {
      if (x.rank < 2) UNSUPPORTED("batch_norm needs rank >= 2");
      outer = x.shape[0];
      groups = x.shape[1];
      inner = prod(x.shape, 2, x.rank);
      count = outer * inner;
    }
    k_norm<<<blocks(groups), 256, 0, ST>>>(S, op, a.eps, view(x), dy, w, b, layer, groups, outer, inner, len, count);
    break;
  }
  case EVT_FB_OP_NLL_LOSS: case EVT_FB_OP_NLL_LOSS_BACKWARD: case EVT_FB_OP_CROSS_ENTROPY: {
    bool bwd = op == EVT_FB_OP_NLL_LOSS_BACKWARD;
    const evt_fb_tensor &x = in[bwd ? 1 : 0], &t = in[bwd ? 2 : 1];
    bool soft = op == EVT_FB_OP_CROSS_ENTROPY && (t.dtype == EVT_FB_F32 || t.dtype == EVT_FB_F16 || t.dtype == EVT_FB_BF16);
    ll N, C, inner;
    if (x.rank == 1) { N = 1; C = x.shape[0]; inner = 1; }
    else if (x.rank >= 2) { N = x.shape[0]; C = x.shape[1]; inner = prod(x.shape, 2, x.rank); }
    else UNSUPPORTED("the input needs a class dimension");
    ll m = N * inner;
    double *T = ctx->s2, *counted = ctx->s2 + 2 * m;
    k_class_terms<<<blocks(m), 256, 0, ST>>>(T, bwd ? EVT_FB_OP_NLL_LOSS : op, a.ignore_index, view(x), view(t), soft, N, C,
                                      inner, nd->id);
    if (!bwd) {
      k_class_reduce<<<1, 1, 0, ST>>>(S, T, m, a.reduction, NULL);
    } else {
      k_class_reduce<<<1, 1, 0, ST>>>(NULL, T, m, a.reduction, counted);
      k_nll_backward<<<blocks(m), 256, 0, ST>>>(S, counted, a.ignore_index, a.reduction, view(in[0]), view(t), N, C, inner);
    }
    break;
  }
  case EVT_FB_OP_BCE_WITH_LOGITS: case EVT_FB_OP_MSE_LOSS: {
    ll m = in[0].numel;
    k_pointwise_loss<<<blocks(m), 256, 0, ST>>>(ctx->s2, op == EVT_FB_OP_BCE_WITH_LOGITS, view(in[0]), view(in[1]), m);
    k_class_reduce<<<1, 1, 0, ST>>>(S, ctx->s2, m, a.reduction, NULL); /* every term counts: mean divides by m */
    break;
  }
  case EVT_FB_OP_BCE_WITH_LOGITS_BACKWARD: case EVT_FB_OP_MSE_LOSS_BACKWARD:
    k_pointwise_loss_bwd<<<nb, 256, 0, ST>>>(S, op == EVT_FB_OP_BCE_WITH_LOGITS_BACKWARD, a.reduction, view(in[0]),
                                       view(in[1]), view(in[2]), n);
    break;
  case EVT_FB_OP_ONE_HOT: {
    ll C = out.rank ? out.shape[out.rank - 1] : 0;
    k_one_hot<<<blocks(in[0].numel), 256, 0, ST>>>(S, view(in[0]), in[0].numel, C, nd->id);
    break;
  }
  case EVT_FB_OP_EMBEDDING: case EVT_FB_OP_EMBEDDING_BACKWARD: {
    bool fwd = op == EVT_FB_OP_EMBEDDING;
    const evt_fb_tensor &table = fwd ? in[0] : out, &idx = in[1];
    if (table.rank != 2) UNSUPPORTED("the embedding table must be [V, D]");
    ll V = table.shape[0], D = table.shape[1];
    k_index_select<<<blocks(idx.numel * D), 256, 0, ST>>>(S, fwd, view(in[0]), view(idx), 1, V, D, idx.numel, nd->id);
    break;
  }
  case EVT_FB_OP_INDEX_SELECT: case EVT_FB_OP_INDEX_SELECT_BACKWARD: {
    bool fwd = op == EVT_FB_OP_INDEX_SELECT;
    const evt_fb_tensor &full = fwd ? in[0] : out;
    int d = normdim(a.dim, full.rank);
    if (d < 0) UNSUPPORTED("dim out of range");
    ll outer = prod(full.shape, 0, d), len = full.shape[d], inner = prod(full.shape, d + 1, full.rank);
    ll ni = in[1].numel;
    k_index_select<<<blocks(outer * ni * inner), 256, 0, ST>>>(S, fwd, view(in[0]), view(in[1]), outer, len, inner, ni,
                                                         nd->id);
    break;
  }
  case EVT_FB_OP_RESHAPE: case EVT_FB_OP_SQUEEZE: case EVT_FB_OP_UNSQUEEZE: {
    if (in[0].numel != n) UNSUPPORTED("element counts differ");
    shape_t sh = {1, {n, 1, 1, 1, 1, 1}};
    strides s1;
    memset(&s1, 0, sizeof s1);
    s1.s[0] = 1;
    k_strided<<<nb, 256, 0, ST>>>(S, view(in[0]), n, sh, s1, 0, 0);
    break;
  }
  case EVT_FB_OP_PERMUTE: case EVT_FB_OP_TRANSPOSE: {
    int perm[R];
    strides s1;
    if (const char *why = permute_plan(nd, perm, &s1)) UNSUPPORTED(why);
    k_strided<<<nb, 256, 0, ST>>>(S, view(in[0]), n, shape_of(out), s1, 0, 0);
    break;
  }
  case EVT_FB_OP_EXPAND: {
    strides s1;
    if (!bcast(in[0], out, &s1)) UNSUPPORTED("cannot expand to this shape");
    k_strided<<<nb, 256, 0, ST>>>(S, view(in[0]), n, shape_of(out), s1, 0, 0);
    break;
  }
  case EVT_FB_OP_SLICE: case EVT_FB_OP_SLICE_BACKWARD: {
    bool fwd = op == EVT_FB_OP_SLICE;
    const evt_fb_tensor &part = fwd ? out : in[0];
    strides s1;
    ll base = 0;
    if (const char *why = slice_plan(nd, &s1, &base)) UNSUPPORTED(why);
    k_strided<<<blocks(part.numel), 256, 0, ST>>>(S, view(in[0]), part.numel, shape_of(part), s1, base, !fwd);
    break;
  }
  case EVT_FB_OP_CONCAT: {
    int d = normdim(a.dim, out.rank);
    if (d < 0) UNSUPPORTED("dim out of range");
    ll outer = prod(out.shape, 0, d), inner = prod(out.shape, d + 1, out.rank), row = out.shape[d] * inner, at = 0;
    for (int k = 0; k < nd->ninputs; k++) {
      ll chunk = in[k].shape[d] * inner;
      if (at + chunk > row) UNSUPPORTED("concat input does not fit");
      k_concat_part<<<blocks(outer * chunk), 256, 0, ST>>>(S, view(in[k]), outer, chunk, row, at);
      at += chunk;
    }
    break;
  }
  case EVT_FB_OP_MM: case EVT_FB_OP_BMM: case EVT_FB_OP_ADDMM: {
    const evt_fb_tensor &A = in[op == EVT_FB_OP_ADDMM ? 1 : 0], &B = in[op == EVT_FB_OP_ADDMM ? 2 : 1];
    if (A.rank < 2 || B.rank < 2 || out.rank < 2) UNSUPPORTED("operands must have rank >= 2");
    ll M = A.shape[A.rank - 2], K = A.shape[A.rank - 1], N = B.shape[B.rank - 1];
    if (B.shape[B.rank - 2] != K || out.shape[out.rank - 2] != M || out.shape[out.rank - 1] != N)
      UNSUPPORTED("operand shapes do not match the output");
    /* batch strides (in matrices, scaled to elements) with numpy broadcast over batch dims */
    int rb = out.rank - 2;
    shape_t bsh = {rb, {1, 1, 1, 1, 1, 1}};
    for (int i = 0; i < rb; i++) bsh.d[i] = out.shape[i];
    strides sa, sb;
    const evt_fb_tensor *ops2[2] = {&A, &B};
    strides *ss[2] = {&sa, &sb};
    for (int q = 0; q < 2; q++) {
      const evt_fb_tensor &t = *ops2[q];
      memset(ss[q], 0, sizeof(strides));
      int tb = t.rank - 2;
      if (tb > rb) UNSUPPORTED("batch dims of the operands do not match the output");
      ll s = t.shape[t.rank - 2] * t.shape[t.rank - 1];
      for (int i = rb - 1; i >= 0; i--) {
        int j = i - (rb - tb);
        if (j < 0) continue;
        if (t.shape[j] != out.shape[i] && t.shape[j] != 1) UNSUPPORTED("batch dims of the operands do not match");
        ss[q]->s[i] = (t.shape[j] == 1 && out.shape[i] != 1) ? 0 : s;
        s *= t.shape[j];
      }
    }
    ll nbat = prod(out.shape, 0, rb);
    /* cuBLAS (f32 compute, pedantic math: no TF32) when both operands share a floating dtype and each
     * operand's batch matrices sit at a constant stride; else the f64 tiled kernel */
    ll ua = 0, ub = 0;
    bool uniform = uniform_stride(bsh, sa, &ua) && uniform_stride(bsh, sb, &ub);
    cudaDataType_t ct = A.dtype == EVT_FB_F32 ? CUDA_R_32F : A.dtype == EVT_FB_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    bool floating = A.dtype == B.dtype && (A.dtype == EVT_FB_F32 || A.dtype == EVT_FB_BF16 || A.dtype == EVT_FB_F16);
    if (uniform && floating && nbat && M && N && K && nbat <= INT32_MAX && M <= INT32_MAX &&
        N <= INT32_MAX && K <= INT32_MAX) {
      float *F = (float *)ctx->s2, alpha = 1.0f, beta = 0.0f;
      cublasSetStream(ctx->cublas, ctx->stream);
      cublasSetWorkspace(ctx->cublas, ctx->cublas_ws, ctx->cublas_ws_bytes); /* after SetStream, which resets it */
      ctx->launches++;
      /* row-major C[M,N] = A B  <=>  column-major C^T[N,M] = B^T A^T */
      cublasStatus_t cs = cublasGemmStridedBatchedEx(
          ctx->cublas, CUBLAS_OP_N, CUBLAS_OP_N, (int)N, (int)M, (int)K, &alpha, B.ptr, ct, (int)N, ub, A.ptr, ct,
          (int)K, ua, &beta, F, CUDA_R_32F, (int)N, M * N, (int)nbat, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      if (cs != CUBLAS_STATUS_SUCCESS) {
        snprintf(err, errlen, "cublasGemmStridedBatchedEx failed (status %d)", (int)cs);
        return 2;
      }
      k_float_to_double<<<nb, 256, 0, ST>>>(S, F, n);
    } else {
      if (nbat > 65535) UNSUPPORTED("more than 65535 batch matrices with broadcast batch dims");
      dim3 grid((unsigned)((N + TILE - 1) / TILE), (unsigned)((M + TILE - 1) / TILE), (unsigned)(nbat ? nbat : 1));
      if (nbat && M && N) k_gemm<<<grid, dim3(TILE, TILE), 0, ST>>>(S, view(A), view(B), M, K, N, bsh, sa, sb);
    }
    if (op == EVT_FB_OP_ADDMM) {
      strides cs;
      if (out.rank != 2 || !bcast(in[0], out, &cs)) UNSUPPORTED("addmm bias does not broadcast to the product");
      k_addmm_bias<<<nb, 256, 0, ST>>>(S, view(in[0]), M, N, cs.s[0], cs.s[1]);
    }
    break;
  }
  case EVT_FB_OP_SPMM: case EVT_FB_OP_SPMM_T: {
    bool tr = op == EVT_FB_OP_SPMM_T;
    const evt_fb_tensor &x = in[3];
    if (x.rank != 2 || out.rank != 2 || in[0].rank != 1 || in[1].numel != in[2].numel)
      UNSUPPORTED("expects rowptr[M+1], col[nnz], val[nnz] and a rank-2 dense operand");
    ll M = in[0].numel - 1, N = x.shape[1], nnz = in[1].numel, K = tr ? out.shape[0] : x.shape[0];
    if (M < 0 || (tr ? x.shape[0] : out.shape[0]) != M || out.shape[1] != N)
      UNSUPPORTED("rowptr does not match the dense shapes");
    k_csr_check<<<blocks(M + 1 > nnz ? M + 1 : nnz), 256, 0, ST>>>(view(in[0]), view(in[1]), M, nnz, K, nd->id);
    k_spmm<<<blocks(M * N), 256, 0, ST>>>(S, tr, view(in[0]), view(in[1]), view(in[2]), view(x), M, N, K, nnz);
    break;
  }
  case EVT_FB_OP_CONV2D: case EVT_FB_OP_CONV2D_BACKWARD_INPUT: case EVT_FB_OP_CONV2D_BACKWARD_WEIGHT: {
    int mode = op == EVT_FB_OP_CONV2D ? 0 : op == EVT_FB_OP_CONV2D_BACKWARD_INPUT ? 1 : 2;
    const evt_fb_tensor &x = mode == 1 ? out : in[0], &w = mode == 2 ? out : in[1];
    const evt_fb_tensor &y = mode == 0 ? out : mode == 1 ? in[0] : in[1];
    if (x.rank != 4 || w.rank != 4 || y.rank != 4) UNSUPPORTED("conv2d tensors must have rank 4");
    conv_geom g;
    g.nhwc = a.nhwc;
    g.N = x.shape[0];
    g.C = a.nhwc ? x.shape[3] : x.shape[1];
    g.H = a.nhwc ? x.shape[1] : x.shape[2];
    g.W = a.nhwc ? x.shape[2] : x.shape[3];
    g.O = w.shape[0];
    g.Cg = a.nhwc ? w.shape[3] : w.shape[1];
    g.KH = a.nhwc ? w.shape[1] : w.shape[2];
    g.KW = a.nhwc ? w.shape[2] : w.shape[3];
    g.Ho = a.nhwc ? y.shape[1] : y.shape[2];
    g.Wo = a.nhwc ? y.shape[2] : y.shape[3];
    g.G = a.groups;
    g.sh = a.stride[0]; g.sw = a.stride[1]; g.ph = a.padding[0]; g.pw = a.padding[1];
    g.dh = a.dilation[0]; g.dw = a.dilation[1];
    if (g.G < 1 || g.Cg * g.G != g.C || g.O % g.G != 0) UNSUPPORTED("input, weight and output shapes do not agree");
    if (mode == 2) k_conv_dw<<<blocks(w.numel), 256, 0, ST>>>(S, view(in[0]), view(in[1]), g);
    else k_conv_fwd_or_dx<<<blocks(y.numel), 256, 0, ST>>>(S, mode == 0, view(in[0]), view(in[1]), g);
    break;
  }
  case EVT_FB_OP_MAX_POOL2D: case EVT_FB_OP_MAX_POOL2D_BACKWARD: case EVT_FB_OP_ADAPTIVE_MAX_POOL2D:
  case EVT_FB_OP_ADAPTIVE_MAX_POOL2D_BACKWARD: case EVT_FB_OP_AVG_POOL2D: case EVT_FB_OP_AVG_POOL2D_BACKWARD: {
    bool bwd = op == EVT_FB_OP_MAX_POOL2D_BACKWARD || op == EVT_FB_OP_ADAPTIVE_MAX_POOL2D_BACKWARD ||
               op == EVT_FB_OP_AVG_POOL2D_BACKWARD;
    pool_geom p;
    memset(&p, 0, sizeof p);
    p.adaptive = op == EVT_FB_OP_ADAPTIVE_MAX_POOL2D || op == EVT_FB_OP_ADAPTIVE_MAX_POOL2D_BACKWARD;
    p.avg = op == EVT_FB_OP_AVG_POOL2D || op == EVT_FB_OP_AVG_POOL2D_BACKWARD;
    const evt_fb_tensor &x = op == EVT_FB_OP_AVG_POOL2D_BACKWARD ? out : bwd ? in[1] : in[0];
    const evt_fb_tensor &y = bwd ? in[0] : out;
    p.nhwc = a.nhwc;
    int r = x.rank;
    if (r < 2 || y.rank != r || (a.nhwc && r != 4)) UNSUPPORTED("pooling needs rank >= 2 (rank 4 for nhwc)");
    if (a.nhwc) {
      p.C = x.shape[3]; p.planes = x.shape[0] * p.C;
      p.H = x.shape[1]; p.W = x.shape[2]; p.Ho = y.shape[1]; p.Wo = y.shape[2];
    } else {
      p.planes = prod(x.shape, 0, r - 2);
      p.H = x.shape[r - 2]; p.W = x.shape[r - 1]; p.Ho = y.shape[r - 2]; p.Wo = y.shape[r - 1];
    }
    p.kh = a.kernel[0]; p.kw = a.kernel[1]; p.sh = a.stride[0]; p.sw = a.stride[1];
    p.ph = a.padding[0]; p.pw = a.padding[1];
    if (!p.adaptive && (p.kh < 1 || p.kw < 1 || p.sh < 1 || p.sw < 1)) UNSUPPORTED("kernel and stride must be positive");
    if (p.adaptive && (p.Ho < 1 || p.Wo < 1)) UNSUPPORTED("adaptive pool output must be at least 1x1");
    k_pool<<<blocks(p.planes * p.Ho * p.Wo), 256, 0, ST>>>(S, bwd, view(in[0]), nd->ninputs > 1 ? view(in[1]) : none, p);
    break;
  }
  case EVT_FB_OP_SDPA: case EVT_FB_OP_SDPA_BACKWARD_Q: case EVT_FB_OP_SDPA_BACKWARD_K:
  case EVT_FB_OP_SDPA_BACKWARD_V: {
    int base = op == EVT_FB_OP_SDPA ? 0 : 1;
    const evt_fb_tensor &q = in[base], &k = in[base + 1], &v = in[base + 2];
    int r = q.rank;
    if (r < 2 || k.rank != r || v.rank != r) UNSUPPORTED("q, k, v must have the same rank >= 2");
    ll Sq = q.shape[r - 2], D = q.shape[r - 1], Skv = k.shape[r - 2], Dv = v.shape[r - 1];
    ll B = prod(q.shape, 0, r - 2);
    double scale = a.scale != 0 ? a.scale : 1.0 / sqrt((double)D);
    k_sdpa<<<blocks(B * Sq), 256, 0, ST>>>(S, ctx->s2, op, base ? view(in[0]) : none, view(q), view(k), view(v), B, Sq,
                                    Skv, D, Dv, scale, a.causal);
    break;
  }
  default:
    snprintf(err, errlen, "op %d is not supported by the CUDA fallback library", op);
    return 1;
  }
  CK(cudaGetLastError());
  k_finish<<<nb, 256, 0, ST>>>(out.ptr, out.dtype, S, n);
  CK(cudaGetLastError());
  return 0;
}
