/* Interpreter: 2-D convolution and pooling, NCHW (layout=nhwc: the same kernels on NCHW copies, below).
 * - conv2d(x[N,C,H,W], w[O,C/groups,kh,kw]) -> y[N,O,Ho,Wo] with stride, padding (zeros), dilation and
 *   groups; no bias (a separate add). conv2d_backward_input(dy, w) -> dx[shape] and
 *   conv2d_backward_weight(x, dy) -> dw[shape] are the exact adjoints. Per image and group each is one product
 *   over the im2col matrix through the BLAS (dgemm) when the product has >= EVT_INTERP_BLAS_MIN multiply-adds,
 *   summed in the BLAS's fixed order; smaller ones share one direct loop nest: for every (n, o, c, ki, kj, oh)
 *   a contiguous run of ow, only the role of the three tensors changes, so each sums its terms in one fixed
 *   order.
 * - Pools treat every dim before the last two as "planes" (so [N,C,H,W] and [C,H,W] both work).
 *   max_pool2d: padding counts as -inf; the chosen element of a window is its first maximum in row-major
 *   order (a NaN wins); max_pool2d_backward routes dy there. adaptive_max_pool2d: window i of Ho covers
 *   rows [floor(i*H/Ho), ceil((i+1)*H/Ho)). avg_pool2d divides by kh*kw (count_include_pad). */
#include "runtime/interp/internal.h"

#include <cblas.h>
#include <stdlib.h>
#include <string.h>

enum conv_mode { CONV_FWD, CONV_BWD_INPUT, CONV_BWD_WEIGHT };

/* ---- layouts ---------------------------------------------------------------------------------------- */

/* nhwc: every tensor of the node is viewed as NCHW: rank-4 operands are copied to NCHW order, the NCHW
 * kernel runs into a zeroed NCHW buffer, and the result is copied back. The kernels then see exactly the
 * numbers the nchw op sees, in the same order, so the two layouts give bit-identical values. Activations
 * [N,H,W,C] and nhwc weights [O,kh,kw,C/g] both map to NCHW by dims [0,3,1,2]. */
static evt_status to_nchw(const evt_tensor *t, evt_tensor *out) {
  if (t->rank != 4) { /* the kernels reject it with their own message */
    evt_status st = evt_tensor_alloc(out, t->dtype, t->rank, t->shape);
    if (st == EVT_OK && t->numel) memcpy(out->data, t->data, sizeof(double) * (size_t)t->numel);
    return st;
  }
  int64_t N = t->shape[0], H = t->shape[1], W = t->shape[2], C = t->shape[3];
  evt_status st = evt_tensor_alloc(out, t->dtype, 4, (int64_t[]){N, C, H, W});
  if (st != EVT_OK) return st;
  for (int64_t n = 0; n < N; n++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t w = 0; w < W; w++)
        for (int64_t c = 0; c < C; c++) out->data[((n * C + c) * H + h) * W + w] = t->data[((n * H + h) * W + w) * C + c];
  return EVT_OK;
}

/* adds NCHW tensor t into the NHWC tensor out */
static void from_nchw(const evt_tensor *t, evt_tensor *out) {
  int64_t N = t->shape[0], C = t->shape[1], H = t->shape[2], W = t->shape[3];
  for (int64_t n = 0; n < N; n++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t w = 0; w < W; w++)
        for (int64_t c = 0; c < C; c++) out->data[((n * H + h) * W + w) * C + c] += t->data[((n * C + c) * H + h) * W + w];
}

/* Runs `kernel` on NCHW views of the node's tensors (see above). */
static evt_status via_nchw(evt_interp_ctx *ctx, evt_status (*kernel)(evt_interp_ctx *)) {
  int nin = ctx->n->ninputs;
  evt_tensor tin[EVT_MAX_INPUTS] = {{0}}, tout = {0};
  const evt_tensor *pin[EVT_MAX_INPUTS];
  evt_status st = EVT_OK;
  for (int k = 0; k < nin && st == EVT_OK; k++) {
    st = to_nchw(ctx->in[k], &tin[k]);
    pin[k] = &tin[k];
  }
  if (st == EVT_OK && ctx->out->rank != 4) st = interp_fail(ctx, "layout=nhwc tensors must have rank 4");
  if (st == EVT_OK) st = to_nchw(ctx->out, &tout); /* the zeroed output, reordered: still zero */
  if (st == EVT_OK) {
    evt_interp_ctx sub = *ctx;
    sub.in = pin;
    sub.out = &tout;
    st = kernel(&sub);
    if (st == EVT_OK) from_nchw(&tout, ctx->out);
  }
  for (int k = 0; k < nin; k++) evt_tensor_free(&tin[k]);
  evt_tensor_free(&tout);
  return st;
}

/* ---- convolution as products: im2col + BLAS ------------------------------------------------------- */

typedef struct conv_geom {
  int64_t C, H, W, Cg, KH, KW, Ho, Wo, sh, sw, ph, pw, dh, dw;
} conv_geom;

/* col[(c*KH + ki)*KW + kj][oh*Wo + ow] = xg[c, oh*sh - ph + ki*dh, ow*sw - pw + kj*dw] (0 outside) for the Cg
 * channels at xg; with `back` the adjoint: col is added into xg. */
static void im2col(const conv_geom *q, double *xg, double *col, bool back) {
  int64_t P = q->Ho * q->Wo;
  for (int64_t c = 0; c < q->Cg; c++)
    for (int64_t ki = 0; ki < q->KH; ki++)
      for (int64_t kj = 0; kj < q->KW; kj++) {
        double *row = col + ((c * q->KH + ki) * q->KW + kj) * P, *xc = xg + c * q->H * q->W;
        for (int64_t oh = 0; oh < q->Ho; oh++) {
          int64_t ih = oh * q->sh - q->ph + ki * q->dh;
          for (int64_t ow = 0; ow < q->Wo; ow++) {
            int64_t iw = ow * q->sw - q->pw + kj * q->dw;
            bool in = ih >= 0 && ih < q->H && iw >= 0 && iw < q->W;
            if (back) {
              if (in) xc[ih * q->W + iw] += row[oh * q->Wo + ow];
            } else {
              row[oh * q->Wo + ow] = in ? xc[ih * q->W + iw] : 0.0;
            }
          }
        }
      }
}

/* The three convolutions per image and group as one product each over the im2col matrix (Cg*KH*KW x Ho*Wo):
 * y_g += w_g col, col = w_g^T dy_g (then added back into dx), dw_g += dy_g col^T. Each element is one dot
 * product in double, in the BLAS's order. False (nothing done) when the column buffer cannot be allocated. */
static bool conv_blas(enum conv_mode mode, const conv_geom *q, int64_t N, int64_t O, int64_t G, double *X, double *Wt,
                      double *Y) {
  int64_t Og = O / G, R = q->Cg * q->KH * q->KW, P = q->Ho * q->Wo;
  double *col = malloc(sizeof(double) * (size_t)(R * P));
  if (!col) return false;
  evt_interp_blas_ready();
  for (int64_t n = 0; n < N; n++)
    for (int64_t g = 0; g < G; g++) {
      double *xg = X + (n * q->C + g * q->Cg) * q->H * q->W, *wg = Wt + g * Og * R, *yg = Y + (n * O + g * Og) * P;
      if (mode != CONV_BWD_INPUT) im2col(q, xg, col, false);
      if (mode == CONV_FWD)
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)Og, (blasint)P, (blasint)R, 1.0, wg, (blasint)R,
                    col, (blasint)P, 1.0, yg, (blasint)P);
      else if (mode == CONV_BWD_WEIGHT)
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)Og, (blasint)R, (blasint)P, 1.0, yg, (blasint)P,
                    col, (blasint)P, 1.0, wg, (blasint)R);
      else {
        cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (blasint)R, (blasint)P, (blasint)Og, 1.0, wg, (blasint)R,
                    yg, (blasint)P, 0.0, col, (blasint)P);
        im2col(q, xg, col, true);
      }
    }
  free(col);
  return true;
}

static evt_status conv(evt_interp_ctx *ctx) {
  const evt_attrs *a = &ctx->n->attr;
  enum conv_mode mode = ctx->n->op == EVT_OP_CONV2D ? CONV_FWD
                        : ctx->n->op == EVT_OP_CONV2D_BACKWARD_INPUT ? CONV_BWD_INPUT : CONV_BWD_WEIGHT;
  const evt_tensor *x = mode == CONV_BWD_INPUT ? ctx->out : ctx->in[0];
  const evt_tensor *w = mode == CONV_BWD_WEIGHT ? ctx->out : ctx->in[1];
  const evt_tensor *y = mode == CONV_FWD ? ctx->out : mode == CONV_BWD_INPUT ? ctx->in[0] : ctx->in[1];
  if (x->rank != 4 || w->rank != 4 || y->rank != 4) return interp_fail(ctx, "conv2d tensors must have rank 4");
  if (a->stride.n != 2 || a->padding.n != 2 || a->dilation.n != 2)
    return interp_fail(ctx, "stride, padding and dilation need two values");
  int64_t N = x->shape[0], C = x->shape[1], H = x->shape[2], W = x->shape[3];
  int64_t O = w->shape[0], Cg = w->shape[1], KH = w->shape[2], KW = w->shape[3];
  int64_t Ho = y->shape[2], Wo = y->shape[3], G = a->groups;
  if (G < 1 || Cg * G != C || O % G != 0 || y->shape[0] != N || y->shape[1] != O)
    return interp_fail(ctx, "input, weight and output shapes do not agree (groups=%lld)", (long long)G);
  int64_t sh = a->stride.v[0], sw = a->stride.v[1], ph = a->padding.v[0], pw = a->padding.v[1];
  int64_t dh = a->dilation.v[0], dw = a->dilation.v[1], Og = O / G;
  if (sh < 1 || sw < 1 || dh < 1 || dw < 1 || ph < 0 || pw < 0)
    return interp_fail(ctx, "stride and dilation must be positive, padding non-negative");
  double *X = x->data, *Wt = w->data, *Y = y->data;
  conv_geom geo = {C, H, W, Cg, KH, KW, Ho, Wo, sh, sw, ph, pw, dh, dw};
  if (evt_interp_use_blas(Og, Ho * Wo, Cg * KH * KW) && conv_blas(mode, &geo, N, O, G, X, Wt, Y)) return EVT_OK;
  for (int64_t n = 0; n < N; n++)
    for (int64_t o = 0; o < O; o++) {
      int64_t g = o / Og;
      for (int64_t cg = 0; cg < Cg; cg++) {
        int64_t c = g * Cg + cg;
        double *xp = X + (n * C + c) * H * W, *yp = Y + (n * O + o) * Ho * Wo;
        for (int64_t ki = 0; ki < KH; ki++)
          for (int64_t kj = 0; kj < KW; kj++) {
            double *wp = Wt + ((o * Cg + cg) * KH + ki) * KW + kj;
            /* ow range with 0 <= ow*sw - pw + kj*dw < W */
            int64_t off = kj * dw - pw, ow0 = 0, ow1 = Wo;
            while (ow0 < Wo && ow0 * sw + off < 0) ow0++;
            while (ow1 > ow0 && (ow1 - 1) * sw + off >= W) ow1--;
            for (int64_t oh = 0; oh < Ho; oh++) {
              int64_t ih = oh * sh - ph + ki * dh;
              if (ih < 0 || ih >= H) continue;
              double *yr = yp + oh * Wo;
              int64_t xb = ih * W + off;
              switch (mode) {
              case CONV_FWD: {
                double wv = *wp;
                for (int64_t ow = ow0; ow < ow1; ow++) yr[ow] += wv * xp[xb + ow * sw];
                break;
              }
              case CONV_BWD_INPUT: {
                double wv = *wp;
                for (int64_t ow = ow0; ow < ow1; ow++) xp[xb + ow * sw] += yr[ow] * wv;
                break;
              }
              case CONV_BWD_WEIGHT: {
                double s = 0;
                for (int64_t ow = ow0; ow < ow1; ow++) s += yr[ow] * xp[xb + ow * sw];
                *wp += s;
                break;
              }
              }
            }
          }
      }
    }
  return EVT_OK;
}

/* ---- pooling --------------------------------------------------------------------------------------- */

typedef struct pool_geom {
  int64_t planes, H, W, Ho, Wo;
} pool_geom;

static bool pool_geom_of(evt_interp_ctx *ctx, const evt_tensor *x, const evt_tensor *y, pool_geom *p) {
  if (x->rank < 2 || y->rank != x->rank) return interp_fail(ctx, "pooling needs rank >= 2 and equal ranks"), false;
  int r = x->rank;
  p->planes = interp_prod(x->shape, 0, r - 2);
  if (interp_prod(y->shape, 0, r - 2) != p->planes) return interp_fail(ctx, "leading dims differ"), false;
  p->H = x->shape[r - 2];
  p->W = x->shape[r - 1];
  p->Ho = y->shape[r - 2];
  p->Wo = y->shape[r - 1];
  return true;
}

/* Window [h0,h1) x [w0,w1) of output element (oh, ow), already clipped to the input. */
static void window(const evt_attrs *a, bool adaptive, const pool_geom *p, int64_t oh, int64_t ow, int64_t *h0,
                   int64_t *h1, int64_t *w0, int64_t *w1) {
  if (adaptive) {
    *h0 = oh * p->H / p->Ho;
    *h1 = ((oh + 1) * p->H + p->Ho - 1) / p->Ho;
    *w0 = ow * p->W / p->Wo;
    *w1 = ((ow + 1) * p->W + p->Wo - 1) / p->Wo;
    return;
  }
  *h0 = oh * a->stride.v[0] - a->padding.v[0];
  *w0 = ow * a->stride.v[1] - a->padding.v[1];
  *h1 = *h0 + a->kernel.v[0];
  *w1 = *w0 + a->kernel.v[1];
  if (*h0 < 0) *h0 = 0;
  if (*w0 < 0) *w0 = 0;
  if (*h1 > p->H) *h1 = p->H;
  if (*w1 > p->W) *w1 = p->W;
}

/* Offset (within the plane) of the window's first maximum, or -1 for an empty window. */
static int64_t window_argmax(const double *plane, int64_t W, int64_t h0, int64_t h1, int64_t w0, int64_t w1) {
  int64_t best = -1;
  double m = -INFINITY;
  for (int64_t h = h0; h < h1; h++)
    for (int64_t w = w0; w < w1; w++) {
      double v = plane[h * W + w];
      if (best < 0 || (!isnan(m) && (v > m || isnan(v)))) {
        best = h * W + w;
        m = v;
      }
    }
  return best;
}

static evt_status pool(evt_interp_ctx *ctx) {
  evt_op op = ctx->n->op;
  const evt_attrs *a = &ctx->n->attr;
  bool adaptive = op == EVT_OP_ADAPTIVE_MAX_POOL2D || op == EVT_OP_ADAPTIVE_MAX_POOL2D_BACKWARD;
  bool backward = op == EVT_OP_MAX_POOL2D_BACKWARD || op == EVT_OP_ADAPTIVE_MAX_POOL2D_BACKWARD ||
                  op == EVT_OP_AVG_POOL2D_BACKWARD;
  bool avg = op == EVT_OP_AVG_POOL2D || op == EVT_OP_AVG_POOL2D_BACKWARD;
  /* x: the tensor windows are taken from; y: the pooled one */
  const evt_tensor *x = op == EVT_OP_AVG_POOL2D_BACKWARD ? ctx->out : backward ? ctx->in[1] : ctx->in[0];
  const evt_tensor *y = backward ? ctx->in[0] : ctx->out;
  pool_geom p;
  if (!pool_geom_of(ctx, x, y, &p)) return EVT_ERR_INVALID;
  if (!adaptive) {
    if (a->kernel.n != 2 || a->stride.n != 2 || a->padding.n != 2)
      return interp_fail(ctx, "kernel, stride and padding need two values");
    if (a->kernel.v[0] < 1 || a->kernel.v[1] < 1 || a->stride.v[0] < 1 || a->stride.v[1] < 1)
      return interp_fail(ctx, "kernel and stride must be positive");
  } else if (p.Ho < 1 || p.Wo < 1) {
    return interp_fail(ctx, "adaptive pool output must be at least 1x1");
  }
  double inv_area = avg ? 1.0 / (double)(a->kernel.v[0] * a->kernel.v[1]) : 0;
  double *out = ctx->out->data;
  for (int64_t pl = 0; pl < p.planes; pl++) {
    const double *xp = x->data + pl * p.H * p.W;
    const double *yp = y->data + pl * p.Ho * p.Wo;
    double *op_ = out + pl * (backward ? p.H * p.W : p.Ho * p.Wo);
    for (int64_t oh = 0; oh < p.Ho; oh++)
      for (int64_t ow = 0; ow < p.Wo; ow++) {
        int64_t h0, h1, w0, w1;
        window(a, adaptive, &p, oh, ow, &h0, &h1, &w0, &w1);
        int64_t o = oh * p.Wo + ow;
        if (avg) {
          if (!backward) {
            double s = 0;
            for (int64_t h = h0; h < h1; h++)
              for (int64_t w = w0; w < w1; w++) s += xp[h * p.W + w];
            op_[o] = s * inv_area;
          } else {
            double g = yp[o] * inv_area;
            for (int64_t h = h0; h < h1; h++)
              for (int64_t w = w0; w < w1; w++) op_[h * p.W + w] += g;
          }
          continue;
        }
        int64_t best = window_argmax(xp, p.W, h0, h1, w0, w1);
        if (!backward) op_[o] = best >= 0 ? xp[best] : -INFINITY;
        else if (best >= 0) op_[best] += yp[o];
      }
  }
  return EVT_OK;
}

evt_status evt_interp_conv(evt_interp_ctx *ctx) {
  if (ctx->n->attr.layout == EVT_LAYOUT_NHWC) {
    bool is_conv = ctx->n->op == EVT_OP_CONV2D || ctx->n->op == EVT_OP_CONV2D_BACKWARD_INPUT ||
                   ctx->n->op == EVT_OP_CONV2D_BACKWARD_WEIGHT;
    return via_nchw(ctx, is_conv ? conv : pool);
  }
  switch (ctx->n->op) {
  case EVT_OP_CONV2D:
  case EVT_OP_CONV2D_BACKWARD_INPUT:
  case EVT_OP_CONV2D_BACKWARD_WEIGHT: return conv(ctx);
  default: return pool(ctx);
  }
}
