/* 2-d convolution (forward, input and weight gradients) and pooling (max, adaptive max, average; their
 * backwards), NCHW or NHWC. */
#include "internal.h"

/* ---- conv2d (any layout) --------------------------------------------------------------------------- */

typedef struct conv_geom {
  ll N, C, H, W, O, Cg, KH, KW, Ho, Wo, G, sh, sw, ph, pw, dh, dw;
  int nhwc;
} conv_geom;

static __device__ __forceinline__ ll xoff(const conv_geom &g, ll n, ll c, ll h, ll w) {
  return g.nhwc ? ((n * g.H + h) * g.W + w) * g.C + c : ((n * g.C + c) * g.H + h) * g.W + w;
}
static __device__ __forceinline__ ll yoff(const conv_geom &g, ll n, ll o, ll h, ll w) {
  return g.nhwc ? ((n * g.Ho + h) * g.Wo + w) * g.O + o : ((n * g.O + o) * g.Ho + h) * g.Wo + w;
}
static __device__ __forceinline__ ll woff(const conv_geom &g, ll o, ll cg, ll ki, ll kj) {
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

static __device__ __forceinline__ ll poff(const pool_geom &p, ll pl, ll h, ll w, ll HH, ll WW) {
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

/* ---- host side -------------------------------------------------------------------------------------- */

int fb_conv(evt_fb_ctx *ctx, const evt_fb_node *nd, double *S, char *err, size_t errlen) {
  const evt_fb_tensor *in = nd->in;
  const evt_fb_attrs &a = nd->a;
  int mode = nd->op == EVT_FB_OP_CONV2D ? 0 : nd->op == EVT_FB_OP_CONV2D_BACKWARD_INPUT ? 1 : 2;
  const evt_fb_tensor &x = mode == 1 ? nd->out : in[0], &w = mode == 2 ? nd->out : in[1];
  const evt_fb_tensor &y = mode == 0 ? nd->out : mode == 1 ? in[0] : in[1];
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
  return 0;
}

int fb_pool(evt_fb_ctx *ctx, const evt_fb_node *nd, double *S, char *err, size_t errlen) {
  const evt_fb_tensor *in = nd->in;
  const evt_fb_attrs &a = nd->a;
  int op = nd->op;
  bool bwd = op == EVT_FB_OP_MAX_POOL2D_BACKWARD || op == EVT_FB_OP_ADAPTIVE_MAX_POOL2D_BACKWARD ||
             op == EVT_FB_OP_AVG_POOL2D_BACKWARD;
  pool_geom p;
  memset(&p, 0, sizeof p);
  p.adaptive = op == EVT_FB_OP_ADAPTIVE_MAX_POOL2D || op == EVT_FB_OP_ADAPTIVE_MAX_POOL2D_BACKWARD;
  p.avg = op == EVT_FB_OP_AVG_POOL2D || op == EVT_FB_OP_AVG_POOL2D_BACKWARD;
  const evt_fb_tensor &x = op == EVT_FB_OP_AVG_POOL2D_BACKWARD ? nd->out : bwd ? in[1] : in[0];
  const evt_fb_tensor &y = bwd ? in[0] : nd->out;
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
  k_pool<<<blocks(p.planes * p.Ho * p.Wo), 256, 0, ST>>>(S, bwd, view(in[0]), nd->ninputs > 1 ? view(in[1]) : NO_TENSOR, p);
  return 0;
}
