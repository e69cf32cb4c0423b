/* Attention: sdpa and sdpa_backward_{q,k,v}.
 * With bf16 / f16 q, k, v, dout and output, no broadcast batch dims, 16-byte aligned buffers and a shape cuDNN
 * supports, they run through cuDNN's fused flash attention (kernels/evt_cudnn_sdpa.h); anything else (f32, no
 * cuDNN) on k_sdpa, the reference kernel in double (one thread per query row).
 * [..., H, S, D] maps to cuDNN's [B, H, S, D] with B the product of the leading dims; contiguous strides. A
 * forward whose gradients the graph has (attrs.sdpa_siblings) keeps its out and statistics for the backward
 * (ctx->saved); a backward without them recomputes the forward into the context's scratch. cuDNN's backward
 * writes all three gradients: the node's own into its output, the other two into scratch, where its siblings
 * (the graph's other gradients of the same (dout, q, k, v)) copy theirs from (ctx->memo) unless they already
 * took one since (then the scratch is another step's: compute again). Under CUDA-graph capture the same
 * decisions are recorded, so replays do the same. */
#include "internal.h"

/* ---- the reference kernel: one thread per (batch, query row); P and dP rows in scratch W (2 * Skv doubles) -- */

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

int fb_sdpa_reference(evt_fb_ctx *ctx, const evt_fb_node *nd, double *S, char *err, size_t errlen) {
  const evt_fb_tensor *in = nd->in;
  int base = nd->op == EVT_FB_OP_SDPA ? 0 : 1;
  const evt_fb_tensor &q = in[base], &k = in[base + 1], &v = in[base + 2];
  int r = q.rank;
  if (r < 2 || k.rank != r || v.rank != r) UNSUPPORTED("q, k, v must have the same rank >= 2");
  ll Sq = q.shape[r - 2], D = q.shape[r - 1], Skv = k.shape[r - 2], Dv = v.shape[r - 1];
  ll B = prod(q.shape, 0, r - 2);
  double scale = nd->a.scale != 0 ? nd->a.scale : 1.0 / sqrt((double)D);
  k_sdpa<<<blocks(B * Sq), 256, 0, ST>>>(S, ctx->s2, nd->op, base ? view(in[0]) : NO_TENSOR, view(q), view(k), view(v),
                                         B, Sq, Skv, D, Dv, scale, nd->a.causal);
  return 0;
}

/* ---- cuDNN ---------------------------------------------------------------------------------------------- */

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* Whether nd runs on cuDNN; its descriptor in *d. */
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
    if (!said++) fprintf(stderr, "evt: attention (node %d) runs on the reference kernel: %s\n", nd->id, why);
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

/* (cuDNN's plans are built and their workspaces allocated by attn_cudnn, here, before any capture) */
int fb_attention_reserve(evt_fb_ctx *c, const evt_fb_node *nd, char *err, size_t errlen) {
  evt_cudnn_sdpa_desc ad;
  if (!attn_cudnn(nd, &ad)) return -1;
  size_t need = attn_scratch_layout(nd->op, &ad, NULL, NULL);
  if (need > c->attn_bytes) {
    c->memo.valid = false;
    cudaFree(c->attn);
    c->attn = NULL;
    c->attn_bytes = 0;
    CK(cudaMalloc(&c->attn, need));
    c->attn_bytes = need;
  }
  if (nd->op != EVT_FB_OP_SDPA || !nd->a.sdpa_siblings) return 0;
  /* a forward with gradients: its out and statistics, for the backward */
  for (int i = 0; i < c->nsaved; i++)
    if (c->saved[i].node == nd->id) return 0;
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
  return 0;
}

static int attn_forward(evt_fb_ctx *ctx, const evt_fb_node *nd, const evt_cudnn_sdpa_desc &d, float *stats, char *err,
                        size_t errlen) {
  const evt_fb_tensor *in = nd->in;
  char e[400];
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

/* The forward's saved out and statistics for a backward on these inputs: the latest run on these very q, k, v (an
 * earlier forward on the same addresses had its inputs die before this one's were written there); NULL if none. */
static const evt_fb_ctx::attn_saved *attn_saved_for(const evt_fb_ctx *ctx, const evt_fb_node *nd,
                                                    const evt_cudnn_sdpa_desc &d) {
  const evt_fb_tensor *in = nd->in;
  const evt_fb_ctx::attn_saved *sv = NULL;
  for (int i = 0; i < ctx->nsaved; i++) {
    const evt_fb_ctx::attn_saved *c = &ctx->saved[i];
    if (c->stamp && c->qkv[0] == in[1].ptr && c->qkv[1] == in[2].ptr && c->qkv[2] == in[3].ptr &&
        !memcmp(&c->d, &d, sizeof d) && (!sv || c->stamp > sv->stamp))
      sv = c;
  }
  return sv;
}

static int attn_backward(evt_fb_ctx *ctx, const evt_fb_node *nd, const evt_cudnn_sdpa_desc &d, const attn_scratch &sc,
                         char *err, size_t errlen) {
  const evt_fb_tensor *in = nd->in;
  int op = nd->op;
  void *o = sc.o, *g[3] = {sc.g[0], sc.g[1], sc.g[2]};
  float *stats = sc.stats;
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
  const evt_fb_ctx::attn_saved *sv = attn_saved_for(ctx, nd, d);
  if (sv) o = sv->o, stats = sv->stats;
  ctx->launches += sv ? 1 : 2;
  char e[400];
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

int fb_attention_cudnn(evt_fb_ctx *ctx, const evt_fb_node *nd, char *err, size_t errlen) {
  evt_cudnn_sdpa_desc d;
  if (!attn_cudnn(nd, &d)) return -1;
  if (evt_fb_reserve(ctx, nd, err, errlen)) return 2;
  attn_scratch sc;
  attn_scratch_layout(nd->op, &d, ctx->attn, &sc);
  if (nd->op == EVT_FB_OP_SDPA) return attn_forward(ctx, nd, d, sc.stats, err, errlen);
  return attn_backward(ctx, nd, d, sc, err, errlen);
}
