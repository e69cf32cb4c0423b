/* kspec_conv.c — the rules and canonical text of convolution kernel specs (contract in kspec.h, "Convolution kernel
 * specs"). A conv spec is a GEMM spec whose operands are read by CUTLASS's Sm90 implicit-GEMM mainloop, so only the
 * mainloop's constraints live here; the epilogue is checked by evt_kspec_check like a GEMM's. */
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "codegen/kspec.h"
#include "ir/ir.h"

static evt_status fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static evt_status fail(char *err, size_t errlen, const char *fmt, ...) {
  if (err && errlen) {
    int w = snprintf(err, errlen, "kernel spec: conv: ");
    va_list ap;
    va_start(ap, fmt);
    if (w >= 0 && (size_t)w < errlen) vsnprintf(err + w, errlen - (size_t)w, fmt, ap);
    va_end(ap);
  }
  return EVT_ERR_UNSUPPORTED;
}

void evt_conv_gemm_shape(const evt_conv_geom *g, int64_t *m, int64_t *n, int64_t *k) {
  if (g->kind == EVT_CONV_WGRAD) { /* the tile is dw [O, kh*kw*C], the reduction over (Q, P, N) */
    *m = g->o;
    *n = (int64_t)g->kh * g->kw * g->c;
    *k = (int64_t)g->n * g->p * g->q;
    return;
  }
  bool dgrad = g->kind == EVT_CONV_DGRAD; /* the tile is dx [N,H,W,C], the reduction over (O, kw, kh) */
  *m = (int64_t)g->n * (dgrad ? (int64_t)g->h * g->w : (int64_t)g->p * g->q);
  *n = dgrad ? g->c : g->o;
  *k = (int64_t)g->kh * g->kw * (dgrad ? g->o : g->c);
}

/* One filter tap (r, s) of output pixel yi (offset of y / dy's row) over input pixel xi (of x / dx's row): every
 * (o, c) product, into the operator's output. */
static void accumulate_tap(const evt_conv_geom *g, const double *a, const double *b, double *acc, int64_t xi, int64_t yi,
                           int64_t tap) {
  int64_t wstep = (int64_t)g->kh * g->kw * g->c, wi = tap * g->c; /* w / dw [O,kh,kw,C]: o * wstep + wi + c */
  for (int64_t o = 0; o < g->o; o++)
    for (int64_t c = 0; c < g->c; c++) {
      if (g->kind == EVT_CONV_FPROP) acc[yi + o] += a[xi + c] * b[o * wstep + wi + c];
      else if (g->kind == EVT_CONV_DGRAD) acc[xi + c] += a[yi + o] * b[o * wstep + wi + c];
      else acc[o * wstep + wi + c] += a[yi + o] * b[xi + c];
    }
}

void evt_conv_accumulate(const evt_conv_geom *g, const double *a, const double *b, double *acc) {
  int64_t m, n, k;
  evt_conv_gemm_shape(g, &m, &n, &k);
  memset(acc, 0, sizeof(double) * (size_t)(m * n));
  for (int64_t b0 = 0; b0 < g->n; b0++)
    for (int64_t p = 0; p < g->p; p++)
      for (int64_t q = 0; q < g->q; q++)
        for (int64_t r = 0; r < g->kh; r++)
          for (int64_t t = 0; t < g->kw; t++) {
            int64_t h = p * g->stride_h - g->pad_h + r, w = q * g->stride_w - g->pad_w + t;
            if (h < 0 || h >= g->h || w < 0 || w >= g->w) continue; /* zero padding */
            int64_t xi = ((b0 * g->h + h) * g->w + w) * g->c, yi = ((b0 * g->p + p) * g->q + q) * g->o;
            accumulate_tap(g, a, b, acc, xi, yi, r * g->kw + t);
          }
}

const char *evt_conv_kind_name(evt_conv_kind k) {
  return k == EVT_CONV_FPROP ? "fprop" : k == EVT_CONV_DGRAD ? "dgrad" : k == EVT_CONV_WGRAD ? "wgrad" : "none";
}

int evt_conv_tile_k(int c) { return c % 64 == 0 ? 64 : c % 32 == 0 ? 32 : c % 16 == 0 ? 16 : 0; }

int evt_conv_out_extent(int in, int k, int stride, int pad) {
  if (stride < 1 || in + 2 * pad < k) return 0;
  return (in + 2 * pad - k) / stride + 1;
}

int evt_conv_text(const evt_conv_geom *g, char *buf, size_t len) {
  return snprintf(buf, len, "conv %s n %d h %d w %d c %d o %d kernel %dx%d stride %dx%d pad %dx%d out %dx%d\n",
                  evt_conv_kind_name(g->kind), g->n, g->h, g->w, g->c, g->o, g->kh, g->kw, g->stride_h,
                  g->stride_w, g->pad_h, g->pad_w, g->p, g->q);
}

/* The geometry alone: positive extents, outputs that follow from the inputs, TMA im2col's limits. */
static evt_status check_geometry(const evt_conv_geom *g, char *err, size_t errlen) {
  if (g->n < 1 || g->h < 1 || g->w < 1 || g->c < 1 || g->o < 1 || g->kh < 1 || g->kw < 1 || g->stride_h < 1 ||
      g->stride_w < 1 || g->pad_h < 0 || g->pad_w < 0)
    return fail(err, errlen, "extents, kernel and strides must be positive, padding non-negative");
  if (g->p != evt_conv_out_extent(g->h, g->kh, g->stride_h, g->pad_h) ||
      g->q != evt_conv_out_extent(g->w, g->kw, g->stride_w, g->pad_w) || g->p < 1 || g->q < 1)
    return fail(err, errlen, "output %dx%d does not follow from input %dx%d, kernel %dx%d, stride %dx%d, pad %dx%d", g->p,
                g->q, g->h, g->w, g->kh, g->kw, g->stride_h, g->stride_w, g->pad_h, g->pad_w);
  /* TMA im2col (2-D): filter offsets below 256, paddings within a signed 8-bit corner */
  if (g->kh > 256 || g->kw > 256 || g->pad_h > 127 || g->pad_w > 127)
    return fail(err, errlen, "kernel %dx%d / pad %dx%d past TMA im2col's limits (kernel <= 256, pad <= 127)", g->kh,
                g->kw, g->pad_h, g->pad_w);
  if ((int64_t)g->n * g->p * g->q > 2147483647) return fail(err, errlen, "N*P*Q past 2^31 - 1");
  return EVT_OK;
}

/* wgrad: the N tile over the filter's (C, kw, kh) modes divides C; the epilogue has no node with memory (its N is
 * those modes, which the visitor's loads and sums do not index). */
static evt_status check_wgrad(const evt_kspec *s, char *err, size_t errlen) {
  if (s->conv.c % 16 || s->conv.c % s->cfg.tile_n)
    return fail(err, errlen, "wgrad C=%d with tile_n %d: a multiple of 16 and of tile_n (one TMA im2col box of channels "
                "per filter tap)", s->conv.c, s->cfg.tile_n);
  for (int v = 0; v < s->nnodes; v++)
    if (evt_vop_has_memory(s->nodes[v].op))
      return fail(err, errlen, "wgrad epilogue node %d (%s): the wgrad epilogue's N is the filter's (C, kw, kh) modes; "
                  "it stores D only", v, evt_vop_name(s->nodes[v].op));
  return EVT_OK;
}

evt_status evt_kspec_conv_check(const evt_kspec *s, char *err, size_t errlen) {
  const evt_conv_geom *g = &s->conv;
  if (g->kind == EVT_CONV_NONE) return EVT_OK;
  if (g->kind != EVT_CONV_FPROP && g->kind != EVT_CONV_DGRAD && g->kind != EVT_CONV_WGRAD)
    return fail(err, errlen, "unknown kind %d", (int)g->kind);
  evt_status st = check_geometry(g, err, errlen);
  if (st != EVT_OK) return st;
  if (s->arch) return fail(err, errlen, "%s (the conv kernels are CUTLASS's Sm90 implicit GEMMs)", evt_arch_name(s->arch));
  if (s->ab_dtype != EVT_BF16 && s->ab_dtype != EVT_F16)
    return fail(err, errlen, "operands %s (bf16 or f16)", evt_dtype_name(s->ab_dtype));
  if (s->layout != EVT_LAYOUT_NT || s->batched || s->b_mixed)
    return fail(err, errlen, "layout NT, unbatched, one operand dtype (x is the im2col A, w is B stored N x K)");
  if (g->kind == EVT_CONV_WGRAD) {
    st = check_wgrad(s, err, errlen);
    if (st != EVT_OK) return st;
  }
  bool dgrad = g->kind == EVT_CONV_DGRAD;
  int kc = dgrad ? g->o : g->c, nc = dgrad ? g->c : g->o; /* reduced channels, output channels */
  if (g->kind != EVT_CONV_WGRAD && (kc % 16 || kc % s->cfg.tile_k))
    return fail(err, errlen, "%s=%d with tile_k %d: a multiple of 16 and of tile_k (one TMA im2col box of channels per "
                "filter tap; wgmma steps 16 channels)", dgrad ? "O" : "C", kc, s->cfg.tile_k);
  if (nc % 8) return fail(err, errlen, "%s=%d: a multiple of 8 (16-byte rows of the output)", dgrad ? "C" : "O", nc);
  if (dgrad && (g->stride_h != 1 || g->stride_w != 1))
    return fail(err, errlen, "dgrad with stride %dx%d (CUTLASS runs a strided dgrad as stride_h*stride_w phases)",
                g->stride_h, g->stride_w);
  const evt_tile_config *c = &s->cfg;
  if (c->schedule != EVT_SCHED_PINGPONG || c->cluster_m != 1 || c->cluster_n != 1 || c->stream_k ||
      c->reduction != EVT_RED_ATOMIC)
    return fail(err, errlen, "config: one consumer warp group (the ping-pong schedule's value), cluster 1x1, no stream-K, "
                "atomic sums (CUTLASS 4.2's Sm90 conv kernels are not persistent)");
  return EVT_OK;
}
