/* Reductions (sum, mean, amax), the softmax family, layer and batch norm with their backwards. */
#include "internal.h"

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
static __device__ __forceinline__ double reduce_combine(int op, double a, double v) {
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

/* ---- host side -------------------------------------------------------------------------------------- */

int fb_reduce(evt_fb_ctx *ctx, const evt_fb_node *nd, double *S, char *err, size_t errlen) {
  const evt_fb_tensor &x = nd->in[0];
  const evt_fb_attrs &a = nd->a;
  int op = nd->op;
  ll n = nd->out.numel;
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
    k_reduce<<<blocks(n), 256, 0, ST>>>(S, n, op, view(x), kept, kst, rs, rst, count);
  return 0;
}

int fb_softmax(evt_fb_ctx *ctx, const evt_fb_node *nd, double *S, char *err, size_t errlen) {
  const evt_fb_tensor &x = nd->in[0];
  int d = x.rank == 0 ? 0 : normdim(nd->a.dim, x.rank);
  if (d < 0) UNSUPPORTED("dim out of range");
  ll outer = x.rank ? prod(x.shape, 0, d) : 1, len = x.rank ? x.shape[d] : 1;
  ll inner = x.rank ? prod(x.shape, d + 1, x.rank) : 1;
  k_softmax<<<blocks(outer * inner), 256, 0, ST>>>(S, nd->op, view(nd->in[0]),
                                                   nd->ninputs > 1 ? view(nd->in[1]) : NO_TENSOR, outer, len, inner);
  return 0;
}

int fb_norm(evt_fb_ctx *ctx, const evt_fb_node *nd, double *S, char *err, size_t errlen) {
  const evt_fb_tensor *in = nd->in;
  int op = nd->op;
  bool layer = op == EVT_FB_OP_LAYER_NORM || op == EVT_FB_OP_LAYER_NORM_BACKWARD_INPUT ||
               op == EVT_FB_OP_LAYER_NORM_BACKWARD_WEIGHT;
  bool fwd = op == EVT_FB_OP_LAYER_NORM || op == EVT_FB_OP_BATCH_NORM;
  const evt_fb_tensor &x = fwd ? in[0] : in[1];
  tv dy = fwd ? NO_TENSOR : view(in[0]), w = NO_TENSOR, b = NO_TENSOR;
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
  k_norm<<<blocks(groups), 256, 0, ST>>>(S, op, nd->a.eps, view(x), dy, w, b, layer, groups, outer, inner, len, count);
  return 0;
}
