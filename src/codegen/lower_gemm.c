/* mm / addmm groups → GEMM+EVT kernel specs (contract in lower.h). The nucleus becomes `acc` (addmm adds its bias
 * as one more operand); operand permutes that swap a matrix's two dims (members fused as layouts, or views of
 * sources) become layouts NN / NT / TN; the epilogue is built by lower_epilogue.c. bmm nuclei: lower_bmm.c. */
#include <stdlib.h>
#include <string.h>

#include "codegen/lower_internal.h"

/* A transposed 2-D operand: +1 if x's memory holds x^T (strides (1, rows)), 0 if row-major, -1 otherwise. */
static int operand_layout(const evt_graph *g, const int *group, int gi, int x, int *base) {
  int64_t st[EVT_MAX_RANK];
  const evt_type *t = &g->nodes[x].type;
  int through = group[x] == gi ? gi : -1;
  if (t->rank != 2 || !evt_lower_mem_strides(g, group, through, x, st, base)) return -1;
  if ((st[1] == 1 || t->shape[1] == 1) && (st[0] == t->shape[1] || t->shape[0] == 1)) return 0;
  if ((st[0] == 1 || t->shape[0] == 1) && (st[1] == t->shape[0] || t->shape[1] == 1)) return 1;
  return -1;
}

/* An mm of fp8 operands (kspec.h "FP8 operands"): an f32 result, layout NT (K-major A and B), K % 16 == 0. */
static void fp8_rules(lctx *c, const evt_node *nn, int ta, int tb, int64_t k) {
  if (nn->op != EVT_OP_MM)
    evt_lower_refuse(c, c->nu, "fp8 operands of %s (the kernel spec's fp8 GEMMs are mm)", evt_op_table[nn->op].name);
  else if (nn->type.dtype != EVT_F32)
    evt_lower_refuse(c, c->nu, "fp8 operands with a %s result (fp8 GEMMs accumulate in f32: out_dtype=f32)",
                     evt_dtype_name(nn->type.dtype));
  else if (ta || !tb)
    evt_lower_refuse(c, c->nu,
                     "fp8 operands in layout %s: Hopper's 8-bit wgmma reads both operands K-major, so A must be "
                     "row-major M x K and B stored N x K (layout NT); a transposed copy of %s would be needed",
                     ta ? "TN" : "NN", ta ? "A and B" : "B");
  else if (k % 16)
    evt_lower_refuse(c, c->nu, "fp8 operands with K=%lld: K must be a multiple of 16 (16-byte rows)", (long long)k);
}

/* An mm / addmm of f32 operands with EVT_LOWER_TF32 (kspec.h "TF32 operands"): layout NT (K-major A and B). */
static void tf32_rules(lctx *c, int ta, int tb) {
  if (ta || !tb)
    evt_lower_refuse(c, c->nu,
                     "f32 operands (TF32) in layout %s: Hopper's TF32 wgmma reads both operands K-major from shared "
                     "memory, so A must be row-major M x K and B stored N x K (layout NT); a transposed copy of %s "
                     "would be needed", ta ? "TN" : "NN", ta ? "A" : "B");
}

bool evt_lower_gemm_dims_ok(int64_t m, int64_t n, int64_t k, int ta, int tb) {
  return n % 8 == 0 && (ta ? m % 8 == 0 : k % 8 == 0) && (!tb || k % 8 == 0);
}

int evt_lower_transposed_operand(const evt_graph *g, int x) {
  int flip = 0;
  for (;;) {
    const evt_node *nd = &g->nodes[x];
    if (nd->type.rank != 2) return flip;
    const evt_ilist *d = &nd->attr.dims;
    bool swap = d->n == 2 && ((nd->op == EVT_OP_TRANSPOSE && d->v[0] != d->v[1]) ||
                              (nd->op == EVT_OP_PERMUTE && (d->v[0] == 1 || d->v[0] == -1)));
    const int64_t *st = nd->type.stride, *sh = nd->type.shape;
    if (!swap) return flip ^ (st[0] == 1 && sh[1] > 1 && st[1] == sh[0]);
    flip ^= 1;
    x = nd->inputs[0];
  }
}

void evt_lower_gemm(const evt_graph *g, const int *group, int gi, int nu, unsigned flags, evt_lowered *L, int *vid) {
  const evt_node *nn = &g->nodes[nu];
  lctx c = {.g = g, .group = group, .gi = gi, .nu = nu, .s = &L->spec, .vid = vid, .vt = L->vtensor,
            .why = L->reason, .whylen = sizeof L->reason, .bad = -1};
  L->kind = EVT_LK_UNFUSED;
  if (nn->op == EVT_OP_BMM) {
    evt_lower_bmm(g, group, gi, nu, flags, L, vid);
    return;
  }
  int ai = nn->op == EVT_OP_ADDMM ? 1 : 0;
  int a = nn->inputs[ai], b = nn->inputs[ai + 1];
  L->m = nn->type.shape[0];
  L->n = nn->type.shape[1];
  L->k = g->nodes[a].type.shape[1];
  c.m = L->m, c.n = L->n;
  int ta = operand_layout(g, group, gi, a, &L->a_node), tb = operand_layout(g, group, gi, b, &L->b_node);
  evt_dtype adt = g->nodes[L->a_node].type.dtype, bdt = g->nodes[L->b_node].type.dtype;
  bool fp8 = evt_dtype_is_fp8(adt) && evt_dtype_is_fp8(bdt);
  bool tf32 = (flags & EVT_LOWER_TF32) && adt == EVT_F32 && bdt == EVT_F32;
  if (ta < 0 || tb < 0)
    evt_lower_refuse(&c, nu, "operand %%%s is neither row-major nor transposed in memory",
                     g->nodes[ta < 0 ? a : b].name);
  else if (ta && tb) evt_lower_refuse(&c, nu, "both operands transposed (layout TT is not in the kernel spec)");
  else if (fp8) fp8_rules(&c, nn, ta, tb, L->k);
  else if (tf32) tf32_rules(&c, ta, tb);
  else if (adt != bdt || (adt != EVT_BF16 && adt != EVT_F16))
    evt_lower_refuse(&c, nu, "operands %s x %s (the kernel spec takes bf16 or f16 operands, or fp8 ones%s)",
                     evt_dtype_name(adt), evt_dtype_name(bdt),
                     adt == EVT_F32 && bdt == EVT_F32 ? "; f32 ones with evt_options.tf32 / --tf32" : "");
  if (c.bad < 0 && !evt_lower_gemm_dims_ok(L->m, L->n, L->k, ta, tb))
    evt_lower_refuse(&c, nu,
                     "M=%lld N=%lld K=%lld in layout %s: the rows of A (%s), B (%s) and D (N) in memory must be "
                     "multiples of 8 elements (16-byte TMA rows)", (long long)L->m, (long long)L->n, (long long)L->k,
                     ta ? "TN" : tb ? "NT" : "NN", ta ? "M" : "K", tb ? "K" : "N");
  if (c.bad >= 0) {
    L->bad_node = c.bad;
    return;
  }
  /* the untuned mainloop (evt_lower_untuned_config) is set once the epilogue is known, below */
  evt_tile_config cfg = {128, L->n >= 256 ? 256 : 128, tf32 ? 32 : 64, 1, 1, EVT_SCHED_COOPERATIVE};
  evt_kspec_init(&L->spec, ta ? EVT_LAYOUT_TN : tb ? EVT_LAYOUT_NT : EVT_LAYOUT_NN, adt, EVT_BF16, cfg);
  L->spec.b_mixed = adt != bdt;
  L->spec.b_dtype = bdt;
  int acc = evt_lower_add_node(&c, nu, EVT_V_ACC, -1, -1, EVT_F32, NULL, -1);
  vid[nu] = acc;
  if (nn->op == EVT_OP_ADDMM) {
    vid[nu] = -1;
    int bias = evt_lower_operand(&c, nu, nn->inputs[0], &nn->type);
    vid[nu] = bias >= 0 ? evt_lower_add_node(&c, nu, EVT_V_ADD, acc, bias, EVT_F32, NULL, -1) : -1;
  }
  /* operand permutes fused as layouts are members too; they are not epilogue nodes */
  evt_lower_members(&c, group[a] == gi ? a : -1, group[b] == gi ? b : -1);
  int dmem = -1;
  if (c.bad < 0) evt_lower_add_stores(&c, L, true, &dmem);
  if (c.bad < 0) {
    if (dmem >= 0) {
      L->d_tensor = dmem;
      L->spec.d_node = vid[dmem];
      L->spec.d_dtype = g->nodes[dmem].type.dtype;
    } else {
      int last = -1;
      for (int v = g->nnodes - 1; v >= 0 && last < 0; v--)
        if (group[v] == gi && vid[v] >= 0) last = v;
      L->d_tensor = -1;
      L->spec.d_node = vid[last];
      L->spec.d_dtype = fp8 ? EVT_BF16 : L->spec.ab_dtype;
    }
  }
  if (c.bad >= 0) {
    L->bad_node = c.bad;
    return;
  }
  L->spec.cfg = evt_lower_untuned_config(&L->spec, L->m, L->n, L->k);
  evt_lower_finish_spec(&c, L, EVT_LK_GEMM_EVT);
  L->bad_node = c.bad;
}

/* Does s pass the spec check and build a visitor tree? */
static evt_status spec_builds(const evt_kspec *s, char *err, size_t errlen) {
  evt_vtree *tree = malloc(sizeof *tree);
  EVT_ASSERT(tree);
  evt_status st = evt_kspec_check(s, err, errlen);
  if (st == EVT_OK) st = evt_vtree_build(s, tree, err, errlen);
  free(tree);
  return st;
}

void evt_lower_canonical_spec(evt_kspec *s) {
  char err[256];
  evt_kspec *canon = malloc(sizeof *canon);
  EVT_ASSERT(canon);
  *canon = *s;
  evt_kspec_canonicalize(canon);
  if (spec_builds(canon, err, sizeof err) == EVT_OK) *s = *canon; /* (else the order as lowered: its checks decide) */
  free(canon);
}

void evt_lower_finish_spec(lctx *c, evt_lowered *L, evt_lower_kind kind) {
  char err[256];
  evt_lower_canonical_spec(&L->spec);
  evt_status st = spec_builds(&L->spec, err, sizeof err);
  if (st != EVT_OK) {
    evt_lower_refuse(c, c->nu, "%s", err);
    return;
  }
  L->kind = kind;
  L->ok = 1;
  L->reason[0] = 0;
  evt_kspec_kernel_name(&L->spec, L->kernel);
}

/* 128x256 cooperative once N fills it (the tuner's usual winner on unbatched shapes), else 128x128. 128x128
 * ping-pong for an epilogue without CUTLASS row/column sums over K <= 4096: one consumer warp group's epilogue runs
 * while the other's mainloop keeps the tensor cores busy, so aux loads, stores and elementwise math cost little.
 * CUTLASS's sum nodes keep their sums in local memory in a ping-pong kernel, so those stay cooperative; at long K
 * ping-pong's mainloop is slower. Fewer 128x256 tiles than SMs over K >= 2048 (weight gradients: vit_p14's
 * 1280x1280 over K = 32896 fills 50 of 132 SMs): 128x256 with the stream-K scheduler. The K tile is 64, 128 for fp8 operands, 32 for f32 (TF32) ones: one 128-byte row. A tune record (src/tune/tune.c) replaces it (measurements: bench/RESULTS.md). */
evt_tile_config evt_lower_untuned_config(const evt_kspec *s, int64_t m, int64_t n, int64_t k) {
  if (evt_arch_sm8x(s->arch)) return evt_arch_untuned_config(s->arch, n);
  int tk = evt_kspec_tile_k(s);
  evt_tile_config cfg = {128, n >= 256 ? 256 : 128, tk, 1, 1, EVT_SCHED_COOPERATIVE};
  evt_kspec pp = *s;
  pp.cfg = (evt_tile_config){128, 128, tk, 1, 1, EVT_SCHED_PINGPONG};
  if (!evt_emit_cutlass_sums(&pp) && k <= 4096 && m >= 128 && n >= 128) cfg = pp.cfg;
  bool sixteen = s->ab_dtype == EVT_BF16 || s->ab_dtype == EVT_F16; /* fp8 / TF32 kept at their checked configs */
  if (sixteen && !s->batched && k >= 2048 && ((m + 127) / 128) * ((n + 255) / 256) < EVT_HOPPER_SMS) {
    cfg = (evt_tile_config){128, 256, tk, 1, 1, EVT_SCHED_COOPERATIVE};
    cfg.stream_k = 1;
  }
  return cfg;
}
