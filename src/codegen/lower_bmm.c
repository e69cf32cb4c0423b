/* Batched GEMM groups (bmm nucleus; contract in lower.h, docs/codegen.md "Batched GEMM"). Every epilogue value has
 * the nucleus's shape [batch..., M, N]. A node with memory is described by its strides over those dims (vst): M and
 * N strides pick the load kind as for a GEMM, the batch strides say per batch or shared (all 0). Member views of a
 * tile value only change where a store writes it: their strides are mapped back onto the tile's dims. The batch
 * dims are then collapsed into at most two strided levels common to A, B, D and every per-batch tensor. */
#include <stdlib.h>
#include <string.h>

#include "codegen/lower_internal.h"

/* Strides of a tensor of shape `fs` (rank fr, strides fst) re-viewed as shape `ts` (rank tr, same element
 * order); false if the memory cannot be described with strides (a merged run that is not contiguous). */
static bool reshape_strides(const int64_t *fs, const int64_t *fst, int fr, const int64_t *ts, int tr, int64_t *tst) {
  int i = 0, j = 0;
  for (int d = 0; d < tr; d++) tst[d] = 0;
  for (;;) {
    while (i < fr && fs[i] == 1) i++;
    while (j < tr && ts[j] == 1) j++;
    if (i == fr || j == tr) return i == fr && j == tr;
    int i0 = i, j0 = j;
    int64_t pf = fs[i++], pt = ts[j++];
    while (pf != pt) {
      if (pf < pt) {
        if (i == fr) return false;
        pf *= fs[i++];
      } else {
        if (j == tr) return false;
        pt *= ts[j++];
      }
    }
    /* from-dims [i0, i) hold one contiguous run (unit dims skipped) */
    int last = -1;
    for (int d = i0; d < i; d++) {
      if (fs[d] == 1) continue;
      if (last >= 0 && fst[last] != fst[d] * fs[d]) return false;
      last = d;
    }
    int64_t st = fst[last];
    for (int d = j - 1; d >= j0; d--) {
      if (ts[d] == 1) continue;
      tst[d] = st;
      st *= ts[d];
    }
  }
}

static void contiguous(const evt_type *t, int64_t *st) {
  int64_t w = 1;
  for (int d = t->rank - 1; d >= 0; d--) st[d] = w, w *= t->shape[d];
}

/* Strides over the tile's dims of the memory a store of member value v writes: v's own (contiguous) memory,
 * or, for a member view, its memory mapped back through the view chain to the tile value it shows. */
static bool store_strides(const lctx *c, int v, int64_t *st) {
  const evt_graph *g = c->g;
  int64_t cur[EVT_MAX_RANK];
  contiguous(&g->nodes[v].type, cur);
  while (c->alias[v] >= 0) {
    const evt_node *nd = &g->nodes[v];
    int x = nd->inputs[0];
    const evt_type *xt = &g->nodes[x].type;
    int64_t nx[EVT_MAX_RANK];
    int r = nd->type.rank;
    switch (nd->op) {
    case EVT_OP_PERMUTE:
      for (int j = 0; j < r; j++) nx[nd->attr.dims.v[j] < 0 ? nd->attr.dims.v[j] + r : nd->attr.dims.v[j]] = cur[j];
      break;
    case EVT_OP_TRANSPOSE: {
      for (int j = 0; j < r; j++) nx[j] = cur[j];
      int64_t a = nd->attr.dims.v[0] < 0 ? nd->attr.dims.v[0] + r : nd->attr.dims.v[0];
      int64_t b = nd->attr.dims.v[1] < 0 ? nd->attr.dims.v[1] + r : nd->attr.dims.v[1];
      nx[a] = cur[b], nx[b] = cur[a];
      break;
    }
    case EVT_OP_EXPAND: return false;
    default:
      if (!reshape_strides(nd->type.shape, cur, r, xt->shape, xt->rank, nx)) return false;
      break;
    }
    for (int d = 0; d < xt->rank; d++) cur[d] = nx[d];
    v = x;
  }
  if (!same_shape(&g->nodes[v].type, c->bt)) return false;
  for (int d = 0; d < c->bt->rank; d++) st[d] = cur[d];
  return true;
}

/* Is every batch stride 0 (extent-1 dims ignored)? any: is some batch stride 0? */
static bool batch_zero(const lctx *c, const int64_t *st, bool any) {
  bool all = true, some = false;
  for (int d = 0; d < c->nbd; d++) {
    if (c->bt->shape[d] == 1) continue;
    all &= st[d] == 0;
    some |= st[d] == 0;
  }
  return any ? some : all;
}

/* A load for operand x of batched member v (out: v's shape, the tile's). */
int evt_lower_operand_batched(lctx *c, int v, int x, const evt_type *out) {
  const evt_graph *g = c->g;
  const evt_node *xn = &g->nodes[x];
  const evt_type *bt = c->bt;
  int r = bt->rank, nbd = c->nbd;
  if (!same_shape(out, bt)) {
    char tb[96], bb[96];
    evt_lower_refuse(c, v, "shape %s is not the batched tile %s", evt_type_str(out, tb, sizeof tb),
                     evt_type_str(bt, bb, sizeof bb));
    return -1;
  }
  int64_t xs[EVT_MAX_RANK], bs[EVT_MAX_RANK];
  int base = x;
  if (!evt_lower_mem_strides(g, c->group, -1, x, xs, &base)) {
    evt_lower_refuse(c, v, "operand %%%s: a reshape of a non-contiguous view", xn->name);
    return -1;
  }
  const evt_node *bn = &g->nodes[base];
  for (int i = 0; i < r; i++) {
    int j = i - (r - xn->type.rank);
    bs[i] = (j < 0 || xn->type.shape[j] == 1 || bt->shape[i] == 1) ? 0 : xs[j];
  }
  if (!c->group && evt_type_numel(&xn->type) == evt_type_numel(bt) && bn->op != EVT_OP_INPUT &&
      bn->op != EVT_OP_PARAM && bn->op != EVT_OP_RAND && !is_view_op(xn->op))
    contiguous(bt, bs); /* judging one node: a tile value, fused or loaded */
  int64_t sm = bs[nbd], sn = bs[nbd + 1], M = bt->shape[nbd], N = bt->shape[nbd + 1];
  bool shared = batch_zero(c, bs, false);
  if (!shared && batch_zero(c, bs, true)) {
    evt_lower_refuse(
        c, v,
        "operand %%%s is broadcast over some batch dims but not all (a per-batch tensor or one shared by every batch)",
        xn->name);
    return -1;
  }
  evt_vop op;
  int64_t extent;
  if (sm == 0 && sn == 0) {
    if (!shared) {
      evt_lower_refuse(c, v, "operand %%%s is a per-batch scalar (visitor scalars are compile-time constants)",
                       xn->name);
      return -1;
    }
    if (bn->op != EVT_OP_SCALAR && bn->op != EVT_OP_FULL) {
      evt_lower_refuse(c, v, "operand %%%s is a run-time scalar (%s); visitor scalars are compile-time constants",
                       xn->name, evt_op_table[bn->op].name);
      return -1;
    }
    return evt_lower_scalar(c, v, bn);
  }
  if ((sn == 1 || N == 1) && sm != 0 && (sm >= N || M == 1)) op = EVT_V_AUX_LOAD, extent = M == 1 ? N : sm;
  else if (sm == 0 && (sn == 1 || N == 1)) op = EVT_V_ROW_BCAST, extent = N;
  else if (sn == 0 && (sm == 1 || M == 1)) op = EVT_V_COL_BCAST, extent = M;
  else {
    evt_lower_refuse(c, v, "operand %%%s is not a broadcast of the batched tile (M, N strides %lld, %lld)", xn->name,
                     (long long)sm, (long long)sn);
    return -1;
  }
  if (bn->op == EVT_OP_RAND) {
    evt_lower_refuse(c, v, "operand %%%s: rand is generated in-kernel and the visitor has no RNG node", xn->name);
    return -1;
  }
  if (!float_dtype(bn->type.dtype)) {
    evt_lower_refuse(c, v, "operand %%%s has dtype %s (loads take bf16, f16 or f32)", xn->name,
                     evt_dtype_name(bn->type.dtype));
    return -1;
  }
  int64_t es = (int64_t)evt_dtype_size(bn->type.dtype);
  if ((extent * es) % 16) {
    evt_lower_refuse(c, v, "operand %%%s: %lld-byte rows are not 16-byte aligned", xn->name, (long long)(extent * es));
    return -1;
  }
  for (int i = 0; i < c->s->nnodes; i++)
    if (c->s->nodes[i].op == op && c->vt[i] == base && !memcmp(c->vst[i], bs, sizeof(int64_t) * (size_t)r)) return i;
  char name[24];
  int kind = op == EVT_V_AUX_LOAD ? 0 : op == EVT_V_ROW_BCAST ? 1 : 2;
  snprintf(name, sizeof name, "%c%d", "arc"[kind], c->nload[kind]++);
  int id = evt_lower_add_node(c, v, op, -1, -1, bn->type.dtype, name, base);
  if (id < 0) return -1;
  c->s->nodes[id].shared = shared;
  memcpy(c->vst[id], bs, sizeof(int64_t) * (size_t)r);
  return id;
}

/* A sum in a batched epilogue: over M (row_sum) or N (col_sum), per batch (no batch dim reduced) or over
 * every batch too (shared). */
bool evt_lower_sum_batched(lctx *c, int v) {
  const evt_graph *g = c->g;
  const evt_node *nd = &g->nodes[v];
  int x = nd->inputs[0];
  const evt_type *xt = &g->nodes[x].type;
  if (!same_shape(xt, c->bt)) return evt_lower_refuse(c, v, "sum of a tensor that is not shaped like the batched tile");
  int xv = evt_lower_operand(c, v, x, xt);
  if (xv < 0) return false;
  int r = xt->rank, nbd = c->nbd;
  bool rd[EVT_MAX_RANK] = {0};
  if (nd->attr.dims.n == 0)
    for (int i = 0; i < r; i++) rd[i] = true;
  for (int i = 0; i < nd->attr.dims.n; i++)
    rd[nd->attr.dims.v[i] < 0 ? nd->attr.dims.v[i] + r : nd->attr.dims.v[i]] = true;
  int nb = 0, nbr = 0;
  for (int d = 0; d < nbd; d++)
    if (xt->shape[d] != 1) nb++, nbr += rd[d];
  bool m1 = xt->shape[nbd] == 1, n1 = xt->shape[nbd + 1] == 1;
  bool over_m = (rd[nbd] || m1) && !rd[nbd + 1], over_n = (rd[nbd + 1] || n1) && !rd[nbd];
  if (over_m && over_n) over_n = false;
  if (nbr != 0 && nbr != nb)
    return evt_lower_refuse(c, v,
                            "sum over some batch dims but not all (per-batch sums or sums over every batch only)");
  if (!over_m && !over_n)
    return evt_lower_refuse(
        c, v, "sum over dims that are neither M nor N of the batched tile (visitor has row and column sums only)");
  if (nd->type.dtype != EVT_F32)
    return evt_lower_refuse(c, v, "sum into %s (row/column sums are written in f32)", evt_dtype_name(nd->type.dtype));
  char name[24];
  if (over_m) snprintf(name, sizeof name, "rs%d", c->nrsum++);
  else snprintf(name, sizeof name, "cs%d", c->ncsum++);
  int id = evt_lower_add_node(c, v, over_m ? EVT_V_ROW_SUM : EVT_V_COL_SUM, xv, -1, EVT_F32, name, v);
  if (id < 0) return false;
  c->s->nodes[id].shared = nbr > 0;
  c->vid[v] = -1;
  return true;
}

/* A stored operand of a batched GEMM: strides (rs, cs) of its rows x cols matrix -> 0 row-major with
 * leading dim *ld, 1 stored transposed, -1 neither. */
static int bmm_matrix(int64_t rows, int64_t cols, int64_t rs, int64_t cs, int64_t *ld) {
  if ((cs == 1 || cols == 1) && (rows == 1 || rs >= cols)) return *ld = rows == 1 ? cols : rs, 0;
  if ((rs == 1 || rows == 1) && (cols == 1 || cs >= rows)) return *ld = cols == 1 ? rows : cs, 1;
  return -1;
}

/* Highest element index + 1 that a launch touches in one stored matrix (rows x cols, leading dim ld, inner
 * batch stride bs over l, outer stride os over lo); strides already resolved (no 0 = packed). */
static int64_t touched(int64_t lo, int64_t os, int64_t l, int64_t bs, int64_t rows, int64_t ld, int64_t cols) {
  return (lo - 1) * os + (l - 1) * bs + (rows - 1) * ld + cols;
}

bool evt_lower_batched_check(const evt_graph *g, const evt_lowered *L, char *why, size_t whylen) {
  const evt_kspec *s = &L->spec;
  if (!L->ok || L->kind != EVT_LK_GEMM_EVT || !s->batched) {
    if (why && whylen) snprintf(why, whylen, "not a lowered batched GEMM");
    return false;
  }
  int64_t M = L->m, N = L->n, K = L->k, l = L->l > 0 ? L->l : 1, lo = L->l_outer > 1 ? L->l_outer : 1;
  int at = s->layout == EVT_LAYOUT_TN, bt = s->layout == EVT_LAYOUT_NT;
  int64_t ar = at ? K : M, ac = at ? M : K, br = bt ? N : K, bc = bt ? K : N;
  int64_t lda = L->lda ? L->lda : ac, ldb = L->ldb ? L->ldb : bc, ldd = L->ldd ? L->ldd : N;
  typedef struct {
    const char *what;
    int node;
    int64_t need;
  } reach;
  reach t[EVT_KSPEC_MAX_NODES + 3];
  int nt = 0;
  t[nt++] = (reach){"A", L->a_node, touched(lo, L->os_a, l, L->bs_a ? L->bs_a : ar * lda, ar, lda, ac)};
  t[nt++] = (reach){"B", L->b_node, touched(lo, L->os_b, l, L->bs_b ? L->bs_b : br * ldb, br, ldb, bc)};
  if (L->d_tensor >= 0)
    t[nt++] = (reach){"D", L->d_tensor, touched(lo, L->os_d, l, L->bs_d ? L->bs_d : M * ldd, M, ldd, N)};
  for (int i = 0; i < s->nnodes; i++) {
    const evt_vnode *vn = &s->nodes[i];
    if (!evt_vop_has_memory(vn->op)) continue;
    bool tile = vn->op == EVT_V_AUX_LOAD || vn->op == EVT_V_AUX_STORE;
    int64_t rows = tile ? M : 1, cols = evt_vnode_numel(s, i, M, N) / rows,
            ld = tile && L->ld_ptrs[i] ? L->ld_ptrs[i] : cols;
    int64_t need = vn->shared
                       ? rows * ld - ld + cols
                       : touched(lo, L->os_ptrs[i], l, L->bs_ptrs[i] ? L->bs_ptrs[i] : rows * ld, rows, ld, cols);
    t[nt++] = (reach){vn->name, L->vtensor[i], need};
  }
  for (int k = 0; k < nt; k++) {
    int v = t[k].node;
    if (v < 0 || v >= g->nnodes) {
      if (why && whylen) snprintf(why, whylen, "%s is not bound to a tensor", t[k].what);
      return false;
    }
    int64_t have = evt_type_numel(&g->nodes[v].type);
    if (t[k].need > have) {
      if (why && whylen)
        snprintf(why, whylen, "%s (%%%s) has %lld elements, the launch reaches element %lld", t[k].what,
                 g->nodes[v].name, (long long)have, (long long)t[k].need);
      return false;
    }
  }
  if (why && whylen) why[0] = 0;
  return true;
}


/* One bmm group's layout while it is lowered: A, B and D as strided matrices per batch, the batch levels. */
typedef struct bmm_layout {
  const evt_node *nn;
  int nbd;                       /* batch dims */
  int a, b;                      /* the operands (graph nodes) */
  int64_t M, N, K;
  int64_t sa[EVT_MAX_RANK], sb[EVT_MAX_RANK], sd[EVT_MAX_RANK]; /* strides of A, B, D over their dims */
  int64_t lda, ldb, ldd;
  int ta, tb, td;                /* bmm_matrix: 0 row-major, 1 transposed, -1 neither */
  evt_dtype adt, bdt;
  bool tf32;                     /* EVT_LOWER_TF32: f32 x f32 operands lower (kspec.h "TF32 operands") */
  int dmem;                      /* the member stored as D, or -1 */
  /* per-batch tensors (A, B, D, then every node with memory of its own): strides, names, element sizes */
  int np;
  const int64_t *part[EVT_KSPEC_MAX_NODES + 3];
  const char *pname[EVT_KSPEC_MAX_NODES + 3];
  int64_t pes[EVT_KSPEC_MAX_NODES + 3];
  /* batch levels: runs of batch dims that every per-batch tensor steps through with one stride */
  int nlev, lev_last[EVT_MAX_RANK];
  int64_t lev_ext[EVT_MAX_RANK];
} bmm_layout;

/* The operands: per batch row-major or transposed matrices of bf16 / f16 with M, N, K multiples of 8. */
static void bmm_operands(bmm_layout *q, lctx *c, evt_lowered *L) {
  const evt_graph *g = c->g;
  const int *group = c->group;
  int gi = c->gi, nu = c->nu;
  q->a = q->nn->inputs[0], q->b = q->nn->inputs[1];
  q->M = q->nn->type.shape[q->nbd], q->N = q->nn->type.shape[q->nbd + 1], q->K = g->nodes[q->a].type.shape[q->nbd + 1];
  L->m = q->M, L->n = q->N, L->k = q->K;
  c->m = bmm_batch(&q->nn->type) * q->M, c->n = q->N;
  if (!evt_lower_mem_strides(g, group, group[q->a] == gi ? gi : -1, q->a, q->sa, &L->a_node) ||
      (q->ta = bmm_matrix(q->M, q->K, q->sa[q->nbd], q->sa[q->nbd + 1], &q->lda)) < 0)
    evt_lower_refuse(c, nu, "operand %%%s: per batch neither row-major nor transposed in memory", g->nodes[q->a].name);
  else if (!evt_lower_mem_strides(g, group, group[q->b] == gi ? gi : -1, q->b, q->sb, &L->b_node) ||
           (q->tb = bmm_matrix(q->K, q->N, q->sb[q->nbd], q->sb[q->nbd + 1], &q->ldb)) < 0)
    evt_lower_refuse(c, nu, "operand %%%s: per batch neither row-major nor transposed in memory", g->nodes[q->b].name);
  else if (q->ta && q->tb)
    evt_lower_refuse(c, nu, "both operands transposed (layout TT is not in the kernel spec)");
  q->adt = L->a_node >= 0 ? g->nodes[L->a_node].type.dtype : EVT_F32;
  q->bdt = L->b_node >= 0 ? g->nodes[L->b_node].type.dtype : EVT_F32;
  bool ab32 = q->tf32 && q->adt == EVT_F32 && q->bdt == EVT_F32; /* the layout rule: evt_kspec_check */
  if (c->bad < 0 && !ab32 && (q->adt != q->bdt || (q->adt != EVT_BF16 && q->adt != EVT_F16)))
    evt_lower_refuse(c, nu, "operands %s x %s (the kernel spec takes bf16 or f16 operands%s)", evt_dtype_name(q->adt),
                     evt_dtype_name(q->bdt),
                     q->adt == EVT_F32 && q->bdt == EVT_F32 ? "; f32 ones with evt_options.tf32 / --tf32" : "");
  else if (c->bad < 0 && (q->M % 8 || q->N % 8 || q->K % 8))
    evt_lower_refuse(c, nu, "M=%lld N=%lld K=%lld: each must be a multiple of 8 (16-byte aligned rows)",
                     (long long)q->M, (long long)q->N, (long long)q->K);
}

/* The epilogue: acc, the members, the stores; D a leaving member (its strides through its view chain) or a scratch
 * tile. */
static void bmm_epilogue(bmm_layout *q, lctx *c, evt_lowered *L) {
  const evt_graph *g = c->g;
  const int *group = c->group;
  int gi = c->gi, nu = c->nu, n = g->nnodes;
  int *vid = c->vid;
  if (c->bad < 0) {
    /* batched GEMMs are not tuned (src/tune/tune.c): a 128x64 tile when N <= 64 (attention's context and
     * dQ/dK with head dim 64) spends no MMA work on a padded half tile */
    evt_tile_config cfg = {128, q->N <= 64 ? 64 : 128, q->adt == EVT_F32 ? 32 : 64, 1, 1, EVT_SCHED_COOPERATIVE};
    evt_kspec_init(&L->spec, q->ta ? EVT_LAYOUT_TN : q->tb ? EVT_LAYOUT_NT : EVT_LAYOUT_NN, q->adt, EVT_BF16, cfg);
    L->spec.batched = 1;
    vid[nu] = evt_lower_add_node(c, nu, EVT_V_ACC, -1, -1, EVT_F32, NULL, -1);
    evt_lower_members(c, group[q->a] == gi ? q->a : -1, group[q->b] == gi ? q->b : -1);
  }
  if (c->bad < 0) evt_lower_add_stores(c, L, true, &q->dmem);
  if (c->bad < 0) {
    if (q->dmem >= 0) {
      L->d_tensor = q->dmem;
      L->spec.d_node = vid[q->dmem];
      L->spec.d_dtype = g->nodes[q->dmem].type.dtype;
      if (!store_strides(c, q->dmem, q->sd))
        evt_lower_refuse(c, q->dmem, "D: the view chain to %%%s cannot be written with strides",
                         g->nodes[q->dmem].name);
    } else {
      int last = -1;
      for (int v = n - 1; v >= 0 && last < 0; v--)
        if (group[v] == gi && vid[v] >= 0) last = v;
      L->d_tensor = -1;
      L->spec.d_node = vid[last];
      L->spec.d_dtype = L->spec.ab_dtype;
      contiguous(&q->nn->type, q->sd);
    }
  }
}

/* D stored transposed (a permute swapped the last two dims) and no M x N tiles: compute D^T = B^T A^T instead. */
static void bmm_transposed_d(bmm_layout *q, lctx *c, evt_lowered *L) {
  int nu = c->nu;
  q->td = c->bad < 0 ? bmm_matrix(q->M, q->N, q->sd[q->nbd], q->sd[q->nbd + 1], &q->ldd) : 0;
  bool tiles = false;
  for (int i = 0; i < L->spec.nnodes; i++)
    tiles |= L->spec.nodes[i].op == EVT_V_AUX_LOAD || L->spec.nodes[i].op == EVT_V_AUX_STORE;
  if (q->td == 1 && !tiles) {
    /* D stored transposed (a permute swapped the last two dims): compute D^T = B^T A^T instead. Row and
     * column broadcasts / sums trade places; M x N aux tiles would need column-major visitor tiles. */
    int64_t t[EVT_MAX_RANK];
    int ta2 = bmm_matrix(q->N, q->K, q->sb[q->nbd + 1], q->sb[q->nbd], &q->lda),
        tb2 = bmm_matrix(q->K, q->M, q->sa[q->nbd + 1], q->sa[q->nbd], &q->ldb);
    if (ta2 < 0 || tb2 < 0 || (ta2 && tb2)) {
      evt_lower_refuse(c, q->dmem >= 0 ? q->dmem : nu, "D is stored transposed and B^T A^T needs layout TT");
    } else {
      memcpy(t, q->sa, sizeof t), memcpy(q->sa, q->sb, sizeof t), memcpy(q->sb, t, sizeof t);
      int tn = L->a_node;
      L->a_node = L->b_node, L->b_node = tn;
      evt_dtype tdt = q->adt;
      q->adt = q->bdt, q->bdt = tdt;
      L->m = q->N, L->n = q->M, q->M = L->m, q->N = L->n;
      L->spec.layout = ta2 ? EVT_LAYOUT_TN : tb2 ? EVT_LAYOUT_NT : EVT_LAYOUT_NN;
      int64_t x = q->sd[q->nbd];
      q->sd[q->nbd] = q->sd[q->nbd + 1], q->sd[q->nbd + 1] = x;
      for (int i = 0; i < L->spec.nnodes; i++) {
        evt_vnode *vn = &L->spec.nodes[i];
        switch (vn->op) {
        case EVT_V_ROW_BCAST: vn->op = EVT_V_COL_BCAST; break;
        case EVT_V_COL_BCAST: vn->op = EVT_V_ROW_BCAST; break;
        case EVT_V_ROW_SUM: vn->op = EVT_V_COL_SUM; break;
        case EVT_V_COL_SUM: vn->op = EVT_V_ROW_SUM; break;
        default: break;
        }
        x = c->vst[i][q->nbd], c->vst[i][q->nbd] = c->vst[i][q->nbd + 1], c->vst[i][q->nbd + 1] = x;
      }
      q->td = bmm_matrix(q->M, q->N, q->sd[q->nbd], q->sd[q->nbd + 1], &q->ldd);
    }
  }
}

/* D and the stores must be row-major per batch; the sums' strides over the batch dims. */
static void bmm_store_strides(bmm_layout *q, lctx *c, evt_lowered *L) {
  int nu = c->nu;
  if (c->bad < 0 && q->td)
    evt_lower_refuse(c, q->dmem >= 0 ? q->dmem : nu, "D %s (D is written row-major per batch)",
           q->td > 0 ? "is stored transposed and the epilogue has M x N tiles" : "is neither row-major nor transposed");
  /* stores: strides of their memory over the tile's dims */
  for (int i = 0; i < L->spec.nnodes && c->bad < 0; i++) {
    evt_vnode *vn = &L->spec.nodes[i];
    int64_t ld = 0;
    if (vn->op == EVT_V_AUX_STORE) {
      if (!store_strides(c, L->vtensor[i], c->vst[i]) ||
          bmm_matrix(q->M, q->N, c->vst[i][q->nbd], c->vst[i][q->nbd + 1], &ld))
        evt_lower_refuse(c, L->vtensor[i], "a store whose memory is not row-major per batch");
    } else if (vn->op == EVT_V_ROW_SUM || vn->op == EVT_V_COL_SUM) {
      int64_t w = vn->op == EVT_V_ROW_SUM ? q->N : q->M; /* per batch: [batch..., len] packed */
      for (int d = q->nbd - 1; d >= 0; d--) c->vst[i][d] = vn->shared ? 0 : w, w *= q->nn->type.shape[d];
    }
  }
}

/* Batch levels common to every per-batch tensor (at most two), their strides 16-byte aligned. */
static void bmm_levels(bmm_layout *q, lctx *c, evt_lowered *L) {
  int nu = c->nu;
  /* batch levels: runs of batch dims that every per-batch tensor steps through with one stride */
  const int64_t *bsh = q->nn->type.shape;
  if (c->bad < 0) {
    q->part[q->np] = q->sa, q->pname[q->np] = "A", q->pes[q->np++] = (int64_t)evt_dtype_size(q->adt);
    q->part[q->np] = q->sb, q->pname[q->np] = "B", q->pes[q->np++] = (int64_t)evt_dtype_size(q->bdt);
    q->part[q->np] = q->sd, q->pname[q->np] = "D", q->pes[q->np++] = (int64_t)evt_dtype_size(L->spec.d_dtype);
    for (int i = 0; i < L->spec.nnodes; i++)
      if (evt_vop_has_memory(L->spec.nodes[i].op) && !L->spec.nodes[i].shared)
        q->part[q->np] = c->vst[i], q->pname[q->np] = L->spec.nodes[i].name,
        q->pes[q->np++] = (int64_t)evt_dtype_size(L->spec.nodes[i].dtype);
    for (int p = 0; p < q->np && c->bad < 0; p++)
      if (batch_zero(c, q->part[p], true))
        evt_lower_refuse(c, nu, "%s is broadcast over a batch dim (every batch needs its own %s)", q->pname[p],
                         q->pname[p]);
  }
  for (int d = 0; d < q->nbd && c->bad < 0; d++) {
    if (bsh[d] == 1) continue;
    bool merge = q->nlev > 0;
    for (int p = 0; p < q->np && merge; p++) merge = q->part[p][q->lev_last[q->nlev - 1]] == q->part[p][d] * bsh[d];
    if (merge) q->lev_ext[q->nlev - 1] *= bsh[d], q->lev_last[q->nlev - 1] = d;
    else q->lev_ext[q->nlev] = bsh[d], q->lev_last[q->nlev++] = d;
  }
  if (c->bad < 0 && q->nlev > 2)
    evt_lower_refuse(c, nu, "batch dims need %d strided levels (the launcher has an inner batch and an outer loop)",
                     q->nlev);
  for (int k = 0; k < q->nlev && c->bad < 0; k++)
    if (q->lev_ext[k] > 2147483647)
      evt_lower_refuse(c, nu, "batch of %lld exceeds the launcher's int", (long long)q->lev_ext[k]);
  for (int p = 0; p < q->np && c->bad < 0; p++)
    for (int k = 0; k < q->nlev; k++)
      if ((q->part[p][q->lev_last[k]] * q->pes[p]) % 16) {
        evt_lower_refuse(c, nu, "%s: batch stride %lld x %lld bytes is not 16-byte aligned", q->pname[p],
                         (long long)q->part[p][q->lev_last[k]], (long long)q->pes[p]);
        break;
      }
  if (c->bad < 0 && ((q->M > 1 && (q->ta ? q->K : q->M) > 1 && (q->lda * q->pes[0]) % 16) ||
                     (q->ldb * q->pes[1]) % 16 || (q->ldd * q->pes[2]) % 16))
    evt_lower_refuse(c, nu, "a leading dim (A %lld, B %lld, D %lld elements) is not 16-byte aligned", (long long)q->lda,
                     (long long)q->ldb, (long long)q->ldd);
}

/* The launch's batch fields (inner level l, outer l_outer), then the finished spec's checks. */
static void bmm_launch_fields(bmm_layout *q, lctx *c, evt_lowered *L) {
  int nu = c->nu;
  if (c->bad < 0) {
    int in = q->nlev == 2 && q->lev_ext[0] > q->lev_ext[1] ? 0 : q->nlev - 1, out = q->nlev == 2 ? 1 - in : -1;
    L->l = q->nlev ? (int)q->lev_ext[in] : 1;
    L->l_outer = out >= 0 ? (int)q->lev_ext[out] : 1;
    L->lda = q->lda, L->ldb = q->ldb, L->ldd = q->ldd;
    if (q->nlev) L->bs_a = q->sa[q->lev_last[in]], L->bs_b = q->sb[q->lev_last[in]], L->bs_d = q->sd[q->lev_last[in]];
    if (out >= 0)
      L->os_a = q->sa[q->lev_last[out]], L->os_b = q->sb[q->lev_last[out]], L->os_d = q->sd[q->lev_last[out]];
    for (int i = 0; i < L->spec.nnodes; i++) {
      const evt_vnode *vn = &L->spec.nodes[i];
      if (!evt_vop_has_memory(vn->op)) continue;
      if (vn->op == EVT_V_AUX_LOAD || vn->op == EVT_V_AUX_STORE) L->ld_ptrs[i] = c->vst[i][q->nbd];
      if (vn->shared) continue;
      if (q->nlev) L->bs_ptrs[i] = c->vst[i][q->lev_last[in]];
      if (out >= 0) L->os_ptrs[i] = c->vst[i][q->lev_last[out]];
    }
    for (int i = 0; i < L->spec.nnodes && L->l_outer > 1; i++)
      if (L->spec.nodes[i].shared && evt_vop_class(L->spec.nodes[i].op) == 'S')
        evt_lower_refuse(c, L->vtensor[i] >= 0 ? L->vtensor[i] : nu,
               "a sum over every batch with two batch levels (each outer launch would restart it)");
    char err[256];
    if (c->bad < 0) evt_lower_canonical_spec(&L->spec);
    evt_vtree *tree = malloc(sizeof *tree);
    EVT_ASSERT(tree);
    evt_status st = c->bad < 0 ? evt_kspec_check(&L->spec, err, sizeof err) : EVT_OK;
    if (st == EVT_OK && c->bad < 0) st = evt_vtree_build(&L->spec, tree, err, sizeof err);
    free(tree);
    if (st != EVT_OK) evt_lower_refuse(c, nu, "%s", err);
  }
}

void evt_lower_bmm(const evt_graph *g, const int *group, int gi, int nu, unsigned flags, evt_lowered *L, int *vid) {
  const evt_node *nn = &g->nodes[nu];
  int n = g->nnodes, r = nn->type.rank, nbd = r - 2;
  int *alias = malloc(((size_t)n + 1) * sizeof *alias);
  lctx *cp = calloc(1, sizeof *cp);
  EVT_ASSERT(alias && cp);
  for (int v = 0; v < n; v++) alias[v] = -1;
  lctx *c = cp;
  *c = (lctx){.g = g, .group = group, .gi = gi, .nu = nu, .s = &L->spec, .vid = vid, .vt = L->vtensor,
              .why = L->reason, .whylen = sizeof L->reason, .bad = -1, .nbd = nbd, .bt = &nn->type, .alias = alias};
  L->kind = EVT_LK_UNFUSED;
  bmm_layout *q = calloc(1, sizeof *q);
  EVT_ASSERT(q);
  q->nn = nn, q->nbd = nbd, q->ta = q->tb = -1, q->dmem = -1, q->tf32 = flags & EVT_LOWER_TF32;
  bmm_operands(q, c, L);
  bmm_epilogue(q, c, L);
  bmm_transposed_d(q, c, L);
  bmm_store_strides(q, c, L);
  bmm_levels(q, c, L);
  bmm_launch_fields(q, c, L);
  if (c->bad < 0) {
    L->kind = EVT_LK_GEMM_EVT;
    L->ok = 1;
    char why[200];
    if (!evt_lower_batched_check(g, L, why, sizeof why)) { /* a lowering bug: never launch out of bounds */
      L->kind = EVT_LK_UNFUSED;
      L->ok = 0;
      evt_lower_refuse(c, nu, "internal: launch layout out of bounds: %s", why);
    }
  }
  if (c->bad >= 0) {
    L->bad_node = c->bad;
    L->l = L->l_outer = 0;
  } else {
    L->reason[0] = 0;
    evt_kspec_kernel_name(&L->spec, L->kernel);
  }
  free(alias);
  free(cp);
  free(q);
}

void evt_lower_launch_batch(const evt_lowered *L, evt_launch_args *a) {
  a->l = L->l, a->l_outer = L->l_outer;
  a->lda = L->lda, a->ldb = L->ldb, a->ldd = L->ldd;
  a->bs_a = L->bs_a, a->bs_b = L->bs_b, a->bs_d = L->bs_d;
  a->os_a = L->os_a, a->os_b = L->os_b, a->os_d = L->os_d;
  for (int i = 0; i < EVT_LAUNCH_MAX_PTRS; i++) {
    int ok = i < EVT_KSPEC_MAX_NODES;
    a->ld_ptrs[i] = ok ? L->ld_ptrs[i] : 0;
    a->bs_ptrs[i] = ok ? L->bs_ptrs[i] : 0;
    a->os_ptrs[i] = ok ? L->os_ptrs[i] : 0;
  }
}

/* Gathers / scatters one stored rows x cols matrix (leading dim ld) at `off` to / from packed p. */
static void mat_io(double *mem, int64_t off, int64_t ld, int64_t rows, int64_t cols, double *p, bool load) {
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = 0; j < cols; j++) {
      if (load) p[i * cols + j] = mem[off + i * ld + j];
      else mem[off + i * ld + j] = p[i * cols + j];
    }
}

void evt_lower_gemm_reference(const evt_lowered *L, const double *a, const double *b, double *const *mem, double *d,
                              uint64_t rng_step) {
  const evt_kspec *s = &L->spec;
  if (s->conv.kind != EVT_CONV_NONE) { /* the convolution's tile, then the epilogue */
    double *acc = malloc(sizeof(double) * (size_t)(L->m * L->n));
    EVT_ASSERT(acc);
    evt_conv_accumulate(&s->conv, a, b, acc);
    evt_kspec_reference_acc(s, L->m, L->n, acc, mem, d, rng_step);
    free(acc);
    return;
  }
  if (!s->batched) {
    evt_kspec_reference_batched_at(s, 1, L->m, L->n, L->k, a, b, mem, d, rng_step);
    return;
  }
  int64_t M = L->m, N = L->n, K = L->k, l = L->l > 0 ? L->l : 1, lo = L->l_outer > 1 ? L->l_outer : 1;
  int at = s->layout == EVT_LAYOUT_TN, bt = s->layout == EVT_LAYOUT_NT;
  int64_t ar = at ? K : M, ac = at ? M : K, br = bt ? N : K, bc = bt ? K : N;
  /* the launcher's defaults (kernels/evt_launch.h: 0 = packed) */
  int64_t lda = L->lda ? L->lda : ac, ldb = L->ldb ? L->ldb : bc, ldd = L->ldd ? L->ldd : N;
  int64_t bsa = L->bs_a ? L->bs_a : ar * lda, bsb = L->bs_b ? L->bs_b : br * ldb, bsd = L->bs_d ? L->bs_d : M * ldd;
  double *pa = malloc(sizeof(double) * (size_t)(ar * ac)), *pb = malloc(sizeof(double) * (size_t)(br * bc));
  double *pd = malloc(sizeof(double) * (size_t)(M * N));
  double *pt[EVT_KSPEC_MAX_NODES] = {0};
  EVT_ASSERT(pa && pb && pd);
  for (int v = 0; v < s->nnodes; v++) {
    int64_t ne = evt_vnode_numel(s, v, M, N);
    if (!ne) continue;
    pt[v] = malloc(sizeof(double) * (size_t)ne);
    EVT_ASSERT(pt[v]);
    if ((s->nodes[v].op == EVT_V_ROW_SUM || s->nodes[v].op == EVT_V_COL_SUM) && s->nodes[v].shared)
      memset(mem[v], 0, sizeof(double) * (size_t)ne);
  }
  for (int64_t o = 0; o < lo; o++)
    for (int64_t i = 0; i < l; i++) {
      mat_io((double *)a, o * L->os_a + i * bsa, lda, ar, ac, pa, true);
      mat_io((double *)b, o * L->os_b + i * bsb, ldb, br, bc, pb, true);
      for (int v = 0; v < s->nnodes; v++) {
        if (!pt[v]) continue;
        const evt_vnode *vn = &s->nodes[v];
        bool tile = vn->op == EVT_V_AUX_LOAD || vn->op == EVT_V_AUX_STORE;
        int64_t rows = tile ? M : 1, cols = evt_vnode_numel(s, v, M, N) / rows;
        int64_t ld = tile && L->ld_ptrs[v] ? L->ld_ptrs[v] : cols;
        int64_t off = vn->shared ? 0 : o * L->os_ptrs[v] + i * (L->bs_ptrs[v] ? L->bs_ptrs[v] : rows * ld);
        if (evt_vop_class(vn->op) == 'L') mat_io(mem[v], off, ld, rows, cols, pt[v], true);
      }
      evt_kspec_reference_batched(s, 1, M, N, K, pa, pb, pt, pd);
      mat_io(d, o * L->os_d + i * bsd, ldd, M, N, pd, false);
      for (int v = 0; v < s->nnodes; v++) {
        if (!pt[v] || evt_vop_class(s->nodes[v].op) != 'S') continue;
        const evt_vnode *vn = &s->nodes[v];
        bool tile = vn->op == EVT_V_AUX_STORE;
        int64_t rows = tile ? M : 1, cols = evt_vnode_numel(s, v, M, N) / rows;
        int64_t ld = tile && L->ld_ptrs[v] ? L->ld_ptrs[v] : cols;
        if (vn->shared) {
          for (int64_t j = 0; j < cols; j++) mem[v][j] += pt[v][j];
          continue;
        }
        int64_t off = o * L->os_ptrs[v] + i * (L->bs_ptrs[v] ? L->bs_ptrs[v] : rows * ld);
        mat_io(mem[v], off, ld, rows, cols, pt[v], false);
      }
    }
  for (int v = 0; v < s->nnodes; v++) free(pt[v]);
  free(pa), free(pb), free(pd);
}
