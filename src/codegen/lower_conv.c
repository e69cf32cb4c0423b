/* conv2d / conv2d_backward_input / conv2d_backward_weight groups → CONV+EVT kernel specs (contract in lower.h; the
 * spec in kspec.h "Convolution kernel specs"). The nucleus's output, y [N,P,Q,O] (fprop), dx [N,H,W,C] (dgrad) or dw
 * [O,kh,kw,C] (wgrad, a group of its own: D only), layout=nhwc, is dense and row-major, so as a tile it is the
 * matrix [N*P*Q, O] / [N*H*W, C] / [O, kh*kw*C]: the epilogue builder (lower_epilogue.c) takes it unchanged — a bias
 * [O] reached through an expand is a row broadcast, a sum over dims [0,1,2] (batch-norm statistics) a row sum, a
 * residual [N,P,Q,O] an aux load. What the implicit-GEMM mainloop cannot read is refused by the conv node's name. */
#include <stdlib.h>
#include <string.h>

#include "codegen/lower_internal.h"

#define WHY(...) (snprintf(why, whylen, __VA_ARGS__), false)

bool evt_lower_conv_geometry(const evt_graph *g, int nu, evt_conv_geom *geo, char *why, size_t whylen) {
  const evt_node *nn = &g->nodes[nu];
  /* conv2d (x, w) -> y; dgrad (dy, w) -> dx; wgrad (x, dy) -> dw */
  bool dgrad = nn->op == EVT_OP_CONV2D_BACKWARD_INPUT, wgrad = nn->op == EVT_OP_CONV2D_BACKWARD_WEIGHT;
  const evt_type *at = &g->nodes[nn->inputs[0]].type, *bt = &g->nodes[nn->inputs[1]].type;
  const evt_type *xt = dgrad ? &nn->type : at, *yt = dgrad ? at : wgrad ? bt : &nn->type;
  const evt_type *wt = wgrad ? &nn->type : bt;
  const evt_attrs *a = &nn->attr;
  if (nn->op != EVT_OP_CONV2D && !dgrad && !wgrad) return WHY("not a conv2d or one of its backwards");
  if (a->layout != EVT_LAYOUT_NHWC)
    return WHY("layout nchw (the conv kernels read channels-last tensors: layout=nhwc, x [N,H,W,C], w [O,kh,kw,C])");
  if (a->groups != 1) return WHY("groups=%lld (the conv kernels take groups=1)", (long long)a->groups);
  if (a->dilation.n != 2 || a->dilation.v[0] != 1 || a->dilation.v[1] != 1)
    return WHY("dilation (the conv kernels take dilation 1)");
  if (at->dtype != bt->dtype || (at->dtype != EVT_BF16 && at->dtype != EVT_F16))
    return WHY("operands %s x %s (the conv kernels take bf16 or f16 operands)", evt_dtype_name(at->dtype),
               evt_dtype_name(bt->dtype));
  if (xt->rank != 4 || wt->rank != 4 || yt->rank != 4 || a->stride.n != 2 || a->padding.n != 2)
    return WHY("not a 2-D convolution of rank-4 tensors");
  *geo = (evt_conv_geom){dgrad ? EVT_CONV_DGRAD : wgrad ? EVT_CONV_WGRAD : EVT_CONV_FPROP,
                         (int)xt->shape[0], (int)xt->shape[1], (int)xt->shape[2], (int)xt->shape[3], (int)wt->shape[0],
                         (int)wt->shape[1], (int)wt->shape[2], (int)a->stride.v[0], (int)a->stride.v[1],
                         (int)a->padding.v[0], (int)a->padding.v[1], (int)yt->shape[1], (int)yt->shape[2]};
  if (dgrad && (geo->stride_h != 1 || geo->stride_w != 1))
    return WHY("stride %dx%d (the dgrad kernels take stride 1: CUTLASS runs a strided dgrad as stride_h*stride_w "
               "phases, not one [N*H*W, C] tile)", geo->stride_h, geo->stride_w);
  if (wgrad && (geo->c % 16 || geo->o % 8))
    return WHY("C=%d, O=%d: the wgrad kernels need C a multiple of 16 (an N tile of 16, 32 or 64 channels per filter "
               "tap) and O of 8 (16-byte rows of dy)", geo->c, geo->o);
  int kc = dgrad ? geo->o : geo->c, nc = dgrad ? geo->c : geo->o; /* reduced channels, output channels */
  if (!wgrad && kc % 16)
    return WHY("%s=%d: the conv kernels need the reduced channels a multiple of 16 (a K tile of 16, 32 or 64 channels "
               "per filter tap: wgmma steps 16 channels; pad the channels)", dgrad ? "O" : "C", kc);
  if (!wgrad && nc % 8)
    return WHY("%s=%d: the conv kernels need the output channels a multiple of 8 (16-byte output rows)", dgrad ? "C" : "O",
               nc);
  return true;
}

/* Graph node holding x's memory (itself, or the source a view of it reads) when that memory is dense and
 * row-major; -1 otherwise. */
static int dense_operand(const evt_graph *g, const int *group, int x) {
  int64_t st[EVT_MAX_RANK];
  int base;
  const evt_type *t = &g->nodes[x].type;
  if (!evt_lower_mem_strides(g, group, -1, x, st, &base) || !dense(t->shape, st, 0, t->rank, 1)) return -1;
  return base;
}

/* D: the leaving tile value the kernel stores as its output (else a scratch tile of the operands' dtype). */
static void set_d(lctx *c, evt_lowered *L, int dmem) {
  if (dmem >= 0) {
    L->d_tensor = dmem;
    L->spec.d_node = c->vid[dmem];
    L->spec.d_dtype = c->g->nodes[dmem].type.dtype;
    return;
  }
  int last = -1;
  for (int v = c->g->nnodes - 1; v >= 0 && last < 0; v--)
    if (c->group[v] == c->gi && c->vid[v] >= 0) last = v;
  L->d_tensor = -1;
  L->spec.d_node = c->vid[last];
  L->spec.d_dtype = L->spec.ab_dtype;
}

void evt_lower_conv(const evt_graph *g, const int *group, int gi, int nu, evt_lowered *L, int *vid) {
  const evt_node *nn = &g->nodes[nu];
  lctx c = {.g = g, .group = group, .gi = gi, .nu = nu, .s = &L->spec, .vid = vid, .vt = L->vtensor,
            .why = L->reason, .whylen = sizeof L->reason, .bad = -1};
  L->kind = EVT_LK_UNFUSED;
  evt_conv_geom geo;
  char why[200];
  if (!evt_lower_conv_geometry(g, nu, &geo, why, sizeof why)) {
    evt_lower_refuse(&c, nu, "%s", why);
    L->bad_node = c.bad;
    return;
  }
  int ai = geo.kind == EVT_CONV_WGRAD; /* CUTLASS's wgrad reads dy as A, x as B: the node's (x, dy) swapped */
  L->a_node = dense_operand(g, group, nn->inputs[ai]);
  L->b_node = dense_operand(g, group, nn->inputs[1 - ai]);
  if (L->a_node < 0 || L->b_node < 0) {
    evt_lower_refuse(&c, nu, "operand %%%s is not dense NHWC in memory", g->nodes[nn->inputs[L->a_node < 0 ? ai : 1 - ai]].name);
    L->bad_node = c.bad;
    return;
  }
  evt_conv_gemm_shape(&geo, &L->m, &L->n, &L->k);
  c.m = L->m, c.n = L->n;
  /* one consumer warp group per CTA (CUTLASS's Sm90 conv kernels are not persistent): the ping-pong rules */
  int kc = geo.kind == EVT_CONV_DGRAD ? geo.o : geo.c;
  evt_tile_config cfg = {128, L->n <= 64 ? 64 : 128, evt_conv_tile_k(kc), 1, 1, EVT_SCHED_PINGPONG};
  if (geo.kind == EVT_CONV_WGRAD) /* N tiles the filter's (C, kw, kh) modes: it divides C; K = N*P*Q is linear */
    cfg.tile_n = evt_conv_tile_k(geo.c), cfg.tile_k = 64;
  evt_kspec_init(&L->spec, EVT_LAYOUT_NT, g->nodes[nn->inputs[0]].type.dtype, EVT_BF16, cfg);
  L->spec.conv = geo;
  vid[nu] = evt_lower_add_node(&c, nu, EVT_V_ACC, -1, -1, EVT_F32, NULL, -1);
  evt_lower_members(&c, -1, -1);
  int dmem = -1;
  if (c.bad < 0) evt_lower_add_stores(&c, L, true, &dmem);
  if (c.bad < 0) set_d(&c, L, dmem);
  if (c.bad < 0) evt_lower_finish_spec(&c, L, EVT_LK_CONV_EVT);
  L->bad_node = c.bad;
}
