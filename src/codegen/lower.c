/* lower.c — partition groups → kernel specs (contract in lower.h).
 *
 * A GEMM group is lowered in graph id order (inputs before users), so visitor ids come out topological:
 * the nucleus becomes `acc` (addmm adds its bias as one more operand); each member becomes a compute, an
 * identity (views, casts to f32), or a row/col sum; each operand that is not a member's value becomes a
 * load whose kind follows from its strides broadcast over the member's output shape, split into an M part
 * (leading dims, product M) and an N part (trailing dims, product N). Stores come last: every member value
 * that leaves the group; the latest is D. Strides of an operand look through views of sources (the
 * partitioner puts permutes/reshapes/expands of inputs and params in no group: nobody materializes them),
 * so a bias reached through `expand` is a row broadcast and a transposed input is refused as a tile.
 */
#include "codegen/lower.h"

#include <stdlib.h>
#include <string.h>

#include "evt_row_config.h"
#include "partition/partition.h"

const char *evt_lower_kind_name(evt_lower_kind k) {
  static const char *names[EVT_LK_COUNT] = {"gemm+evt", "row", "pointwise", "unfused"};
  return (unsigned)k < EVT_LK_COUNT ? names[k] : "?";
}

typedef struct lctx {
  const evt_graph *g;
  const int *group;   /* NULL: judging one node (evt_lower_can_fuse) */
  int gi, nu;
  int64_t m, n;
  evt_kspec *s;
  int *vid;           /* graph node -> visitor node of its tile value, or -1 */
  int *vt;            /* visitor node -> graph node of its memory, or -1 */
  int nload[5];       /* per visitor kind, for names: a (aux), r (row), c (col), k (scalar, unnamed), h (one_hot) */
  int nstore, nrsum, ncsum;
  char *why;
  size_t whylen;
  int bad;
  /* row kernels: the nucleus's M x N inputs (graph nodes) are read as acc(IN0/IN1), not loaded again */
  int row, nrin, rin[2];
  evt_row_value accsel[EVT_KSPEC_MAX_NODES];
  /* batched GEMM (bmm nucleus): the tile is the nucleus's shape [batch..., M, N] (m = L*M, n = N) */
  int nbd;                 /* batch dims (nucleus rank - 2); 0 for every other kernel */
  const evt_type *bt;      /* the nucleus's type */
  int *alias;              /* graph node -> the tile value a member view (permute / reshape ...) shows, or -1 */
  int64_t vst[EVT_KSPEC_MAX_NODES][EVT_MAX_RANK]; /* loads: strides of node i's memory over bt's dims */
} lctx;

/* A scalar / full operand's value as the interpreter holds it: rounded to the node's dtype (a bf16 0.1 is
 * 0.10009765625, the threshold PyTorch compares a bf16 tensor with); visitor scalars are float constants,
 * which would otherwise keep the unrounded value. */
static double scalar_value(const evt_node *bn) { return evt_round_to_dtype(bn->attr.value, bn->type.dtype); }

static bool refuse(lctx *c, int node, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool refuse(lctx *c, int node, const char *fmt, ...) {
  if (c->bad >= 0) return false; /* keep the first reason */
  c->bad = node;
  char msg[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (c->why && c->whylen) {
    const evt_node *nd = &c->g->nodes[node];
    if (c->group) snprintf(c->why, c->whylen, "group %d: %%%s (%s): %s", c->gi, nd->name, evt_op_table[nd->op].name, msg);
    else snprintf(c->why, c->whylen, "%%%s (%s): %s", nd->name, evt_op_table[nd->op].name, msg);
  }
  return false;
}

static int64_t prod(const int64_t *d, int a, int b) {
  int64_t p = 1;
  for (int i = a; i < b; i++) p *= d[i];
  return p;
}


static bool is_view_op(evt_op op) {
  return op == EVT_OP_RESHAPE || op == EVT_OP_SQUEEZE || op == EVT_OP_UNSQUEEZE || op == EVT_OP_EXPAND ||
         op == EVT_OP_PERMUTE || op == EVT_OP_TRANSPOSE;
}

/* A view (chain) of an input/param/constant: the partitioner puts it in no group. */
static bool source_view(const evt_graph *g, int x) {
  if (!is_view_op(g->nodes[x].op)) return evt_op_table[g->nodes[x].op].cls == EVT_CLASS_SOURCE;
  return source_view(g, g->nodes[x].inputs[0]);
}

/* Strides (in elements of *base) of x's elements in the memory of *base: x itself, or, through views in
 * group `through` (-1: views of sources), the tensor they alias. false if a view cannot be expressed with
 * strides (a reshape that regroups a non-contiguous tensor). */
static bool mem_strides(const evt_graph *g, const int *group, int through, int x, int64_t *st, int *base) {
  const evt_node *nd = &g->nodes[x];
  int r = nd->type.rank;
  bool look = is_view_op(nd->op) && (group ? group[x] == through || (group[x] < 0 && source_view(g, x))
                                            : through == -1 && source_view(g, x));
  if (!look) {
    *base = x;
    for (int i = 0; i < r; i++) st[i] = nd->type.stride[i];
    return true;
  }
  int in = nd->inputs[0];
  const evt_type *it = &g->nodes[in].type;
  int64_t ist[EVT_MAX_RANK];
  if (!mem_strides(g, group, through, in, ist, base)) return false;
  switch (nd->op) {
  case EVT_OP_PERMUTE:
    for (int i = 0; i < r; i++) st[i] = ist[nd->attr.dims.v[i] < 0 ? nd->attr.dims.v[i] + r : nd->attr.dims.v[i]];
    return true;
  case EVT_OP_TRANSPOSE: {
    for (int i = 0; i < r; i++) st[i] = ist[i];
    int64_t a = nd->attr.dims.v[0], b = nd->attr.dims.v[1];
    if (a < 0) a += r;
    if (b < 0) b += r;
    int64_t t = st[a];
    st[a] = st[b];
    st[b] = t;
    return true;
  }
  case EVT_OP_EXPAND:
    for (int i = 0; i < r; i++) {
      int j = i - (r - it->rank);
      st[i] = (j < 0 || it->shape[j] != nd->type.shape[i] || it->shape[j] == 1) ? 0 : ist[j];
    }
    return true;
  default: { /* reshape / squeeze / unsqueeze: carry strides if only unit dims move, else need contiguity */
    int i = 0, j = 0;
    bool same = true;
    for (;;) {
      while (i < it->rank && it->shape[i] == 1) i++;
      while (j < r && nd->type.shape[j] == 1) j++;
      if (i == it->rank || j == r) {
        same = i == it->rank && j == r;
        break;
      }
      if (it->shape[i] != nd->type.shape[j]) {
        same = false;
        break;
      }
      i++, j++;
    }
    if (same) {
      i = 0;
      for (j = 0; j < r; j++) {
        if (nd->type.shape[j] == 1) {
          st[j] = 0;
          continue;
        }
        while (it->shape[i] == 1) i++;
        st[j] = ist[i++];
      }
      return true;
    }
    int64_t want = 1;
    for (int d = it->rank - 1; d >= 0; d--) {
      if (it->shape[d] != 1 && ist[d] != want) return false;
      want *= it->shape[d];
    }
    want = 1;
    for (int d = r - 1; d >= 0; d--) st[d] = want, want *= nd->type.shape[d];
    return true;
  }
  }
}

/* The split of shape (rank r, numel M*N) into the M dims [0, s) and the N dims [s, r); -1 if none. */
static int tile_split(const evt_type *t, int64_t m, int64_t n) {
  if (evt_type_numel(t) != m * n) return -1;
  for (int s = 0; s <= t->rank; s++)
    if (prod(t->shape, 0, s) == m) return s;
  return -1;
}

/* Are the strides over dims [a, b) of shape the contiguous strides of that sub-shape times `step`
 * (step 0: all zero)? Unit dims are ignored. */
static bool dense(const int64_t *shape, const int64_t *st, int a, int b, int64_t step) {
  int64_t want = step;
  for (int d = b - 1; d >= a; d--) {
    if (shape[d] == 1) continue;
    if (st[d] != want) return false;
    want *= shape[d];
  }
  return true;
}

static bool float_dtype(evt_dtype dt) { return dt == EVT_F32 || dt == EVT_F16 || dt == EVT_BF16; }

static int add_node(lctx *c, int v, evt_vop op, int in0, int in1, evt_dtype dt, const char *name, int tensor) {
  int id = evt_kspec_add(c->s, op, in0, in1, dt, name);
  if (id < 0) {
    refuse(c, v, "the epilogue needs more than %d visitor nodes", EVT_KSPEC_MAX_NODES);
    return -1;
  }
  c->vt[id] = tensor;
  return id;
}

/* A visitor node for operand x of member v, whose output shape is `out`: x's tile value, or a load
 * chosen from x's strides broadcast over `out`. -1 with the reason on failure. */
static int operand_batched(lctx *c, int v, int x, const evt_type *out);

/* A widening cast (to f32, from a float dtype) of a value that is no tile value of this kernel, in this
 * group (or judging one node): a broadcast operand such as canonicalize's cast(bias, f32) of a 16-bit addmm.
 * Loads widen to f32 anyway, so the kernel loads the cast's input instead (member() gives the cast itself no
 * visitor node). */
static bool widening_operand_cast(const lctx *c, int x) {
  const evt_node *xn = &c->g->nodes[x];
  if (c->nbd || xn->op != EVT_OP_CAST || xn->type.dtype != EVT_F32 || c->vid[x] >= 0) return false;
  if (c->group && c->group[x] != c->gi) return false;
  int in = xn->inputs[0];
  return float_dtype(c->g->nodes[in].type.dtype) && c->vid[in] < 0;
}

static int operand(lctx *c, int v, int x, const evt_type *out) {
  while (widening_operand_cast(c, x)) x = c->g->nodes[x].inputs[0];
  if (c->nbd && c->vid[x] >= 0 && c->alias && c->alias[x] >= 0) {
    refuse(c, v, "reads %%%s, a view of the batched tile in another element order (only stores take views)",
           c->g->nodes[x].name);
    return -1;
  }
  if (c->vid[x] >= 0) return c->vid[x];
  if (c->nbd) return operand_batched(c, v, x, out);
  const evt_graph *g = c->g;
  const evt_node *xn = &g->nodes[x];
  bool one = evt_type_numel(out) == 1; /* a value computed alike for every element (rank 0 in a larger space) */
  int s = one ? out->rank : tile_split(out, c->m, c->n);
  if (s < 0) {
    char tb[96];
    refuse(c, v, "shape %s is not a split of the %lldx%lld %s", evt_type_str(out, tb, sizeof tb), (long long)c->m,
           (long long)c->n, c->row ? "row space" : "tile");
    return -1;
  }
  int64_t xs[EVT_MAX_RANK], bs[EVT_MAX_RANK];
  int base = x;
  if (!mem_strides(g, c->group, -1, x, xs, &base)) {
    refuse(c, v, "operand %%%s: a reshape of a non-contiguous view", xn->name);
    return -1;
  }
  const evt_node *bn = &g->nodes[base];
  /* numpy broadcast of x over out */
  for (int i = 0; i < out->rank; i++) {
    int j = i - (out->rank - xn->type.rank);
    bs[i] = (j < 0 || xn->type.shape[j] == 1) ? 0 : xs[j];
  }
  bool m0 = dense(out->shape, bs, 0, s, 0), n0 = dense(out->shape, bs, s, out->rank, 0);
  bool mv = dense(out->shape, bs, 0, s, 1), mt = dense(out->shape, bs, 0, s, c->n);
  bool nd = dense(out->shape, bs, s, out->rank, 1);
  evt_vop op;
  int64_t extent;
  if (m0 && n0 && bn->op != EVT_OP_SCALAR && bn->op != EVT_OP_FULL) {
    /* a run-time scalar: one element of memory (another kernel's rank-0 result), read by every element */
    if (evt_type_numel(&bn->type) != 1) {
      refuse(c, v, "operand %%%s broadcasts one element of a larger tensor", xn->name);
      return -1;
    }
    if (!evt_vop_storage_ok(EVT_V_SCALAR_LOAD, bn->type.dtype, !c->row)) {
      refuse(c, v, "operand %%%s: a run-time scalar of dtype %s (scalar loads take bf16, f16, f32%s)", xn->name,
             evt_dtype_name(bn->type.dtype), c->row ? ", bool" : "");
      return -1;
    }
    if (bn->op == EVT_OP_RAND) {
      refuse(c, v, "operand %%%s: rand is generated in-kernel and the visitor has no RNG node", xn->name);
      return -1;
    }
    for (int i = 0; i < c->s->nnodes; i++)
      if (c->s->nodes[i].op == EVT_V_SCALAR_LOAD && c->vt[i] == base) return i;
    char name[24];
    snprintf(name, sizeof name, "k%d", c->nload[3]++);
    return add_node(c, v, EVT_V_SCALAR_LOAD, -1, -1, bn->type.dtype, name, base);
  }
  if (one && !(m0 && n0)) {
    refuse(c, v, "operand %%%s of a rank-0 value is not a scalar", xn->name);
    return -1;
  }
  if (m0 && n0) {
    const double sv = scalar_value(bn);
    for (int i = 0; i < c->s->nnodes; i++)
      if (c->s->nodes[i].op == EVT_V_SCALAR && c->s->nodes[i].value == sv) return i;
    int id = evt_kspec_scalar(c->s, sv);
    if (id < 0) refuse(c, v, "the epilogue needs more than %d visitor nodes", EVT_KSPEC_MAX_NODES);
    else c->vt[id] = -1;
    return id;
  }
  if (!c->group && mt && nd && bn->op != EVT_OP_INPUT && bn->op != EVT_OP_PARAM && bn->op != EVT_OP_RAND) {
    op = EVT_V_AUX_LOAD; /* judging one node: a tile value, fused or loaded */
    extent = c->n;
  } else if (mt && nd) op = EVT_V_AUX_LOAD, extent = c->n;
  else if (m0 && nd) op = EVT_V_ROW_BCAST, extent = c->n;
  else if (mv && n0) op = EVT_V_COL_BCAST, extent = c->m;
  else {
    refuse(c, v, "operand %%%s is not a broadcast of the %lldx%lld tile (strides do not match a tile, row or column)",
           xn->name, (long long)c->m, (long long)c->n);
    return -1;
  }
  if (bn->op == EVT_OP_RAND) { /* drawn in the kernel: element (i, j) of a dense M x N rand is Philox counter i*N+j */
    if (!c->row) {
      refuse(c, v, "operand %%%s: rand in a GEMM epilogue (a row kernel draws it)", xn->name);
      return -1;
    }
    if (op != EVT_V_AUX_LOAD || !float_dtype(bn->type.dtype)) {
      refuse(c, v, "operand %%%s: a rand that is not a dense %lldx%lld float tile", xn->name, (long long)c->m, (long long)c->n);
      return -1;
    }
    for (int i = 0; i < c->s->nnodes; i++) {
      const evt_vnode *r = &c->s->nodes[i];
      if (r->op == EVT_V_RAND && r->seed == (uint64_t)bn->attr.seed && r->offset == (uint64_t)bn->attr.offset &&
          r->dtype == bn->type.dtype)
        return i;
    }
    int id = add_node(c, v, EVT_V_RAND, -1, -1, bn->type.dtype, NULL, -1); /* no memory */
    if (id >= 0) {
      c->s->nodes[id].seed = (uint64_t)bn->attr.seed;
      c->s->nodes[id].offset = (uint64_t)bn->attr.offset;
    }
    return id;
  }
  if (!evt_vop_storage_ok(op, bn->type.dtype, !c->row)) {
    refuse(c, v, "operand %%%s has dtype %s (loads take bf16, f16, f32%s)", xn->name, evt_dtype_name(bn->type.dtype),
           c->row ? " or bool" : "");
    return -1;
  }
  size_t es = evt_dtype_size(bn->type.dtype);
  if (!c->row && (extent * (int64_t)es) % 16) { /* TMA; row kernels fall back to element accesses */
    refuse(c, v, "operand %%%s: %lld-byte rows are not 16-byte aligned", xn->name, (long long)(extent * (int64_t)es));
    return -1;
  }
  for (int k = 0; op == EVT_V_AUX_LOAD && c->row && k < c->nrin; k++) {
    if (c->rin[k] != base) continue;
    evt_row_value sel = k == 0 ? EVT_RV_IN0 : EVT_RV_IN1;
    for (int i = 0; i < c->s->nnodes; i++)
      if (c->s->nodes[i].op == EVT_V_ACC && c->accsel[i] == sel) return i;
    int id = add_node(c, v, EVT_V_ACC, -1, -1, EVT_F32, NULL, -1);
    if (id >= 0) c->accsel[id] = sel;
    return id;
  }
  for (int i = 0; i < c->s->nnodes; i++)
    if (c->s->nodes[i].op == op && c->vt[i] == base) return i;
  char name[24];
  int kind = op == EVT_V_AUX_LOAD ? 0 : op == EVT_V_ROW_BCAST ? 1 : 2;
  snprintf(name, sizeof name, "%c%d", "arc"[kind], c->nload[kind]++);
  return add_node(c, v, op, -1, -1, bn->type.dtype, name, base);
}

/* ---- batched GEMM (bmm nucleus) --------------------------------------------------------------------
 * Every epilogue value has the nucleus's shape [batch..., M, N]. A node with memory is described by its
 * strides over those dims (vst): M and N strides pick the load kind as for a GEMM (aux tile: N stride 1,
 * M stride = leading dim; row / col broadcast; scalar), the batch strides say per batch or shared (all 0).
 * Member views (permute, reshape, ...) of a tile value only change where a store writes it: their strides
 * are mapped back onto the tile's dims. The batch dims are then collapsed (lower_bmm) into at most two
 * strided levels common to A, B, D and every per-batch tensor. */

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

static bool same_shape(const evt_type *a, const evt_type *b) {
  if (a->rank != b->rank) return false;
  for (int d = 0; d < a->rank; d++)
    if (a->shape[d] != b->shape[d]) return false;
  return true;
}

static int64_t bmm_batch(const evt_type *t) { return prod(t->shape, 0, t->rank - 2); }

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
static int operand_batched(lctx *c, int v, int x, const evt_type *out) {
  const evt_graph *g = c->g;
  const evt_node *xn = &g->nodes[x];
  const evt_type *bt = c->bt;
  int r = bt->rank, nbd = c->nbd;
  if (!same_shape(out, bt)) {
    char tb[96], bb[96];
    refuse(c, v, "shape %s is not the batched tile %s", evt_type_str(out, tb, sizeof tb), evt_type_str(bt, bb, sizeof bb));
    return -1;
  }
  int64_t xs[EVT_MAX_RANK], bs[EVT_MAX_RANK];
  int base = x;
  if (!mem_strides(g, c->group, -1, x, xs, &base)) {
    refuse(c, v, "operand %%%s: a reshape of a non-contiguous view", xn->name);
    return -1;
  }
  const evt_node *bn = &g->nodes[base];
  for (int i = 0; i < r; i++) {
    int j = i - (r - xn->type.rank);
    bs[i] = (j < 0 || xn->type.shape[j] == 1 || bt->shape[i] == 1) ? 0 : xs[j];
  }
  if (!c->group && evt_type_numel(&xn->type) == evt_type_numel(bt) && bn->op != EVT_OP_INPUT && bn->op != EVT_OP_PARAM &&
      bn->op != EVT_OP_RAND && !is_view_op(xn->op))
    contiguous(bt, bs); /* judging one node: a tile value, fused or loaded */
  int64_t sm = bs[nbd], sn = bs[nbd + 1], M = bt->shape[nbd], N = bt->shape[nbd + 1];
  bool shared = batch_zero(c, bs, false);
  if (!shared && batch_zero(c, bs, true)) {
    refuse(c, v, "operand %%%s is broadcast over some batch dims but not all (a per-batch tensor or one shared by every batch)",
           xn->name);
    return -1;
  }
  evt_vop op;
  int64_t extent;
  if (sm == 0 && sn == 0) {
    if (!shared) {
      refuse(c, v, "operand %%%s is a per-batch scalar (visitor scalars are compile-time constants)", xn->name);
      return -1;
    }
    if (bn->op != EVT_OP_SCALAR && bn->op != EVT_OP_FULL) {
      refuse(c, v, "operand %%%s is a run-time scalar (%s); visitor scalars are compile-time constants", xn->name,
             evt_op_table[bn->op].name);
      return -1;
    }
    const double sv = scalar_value(bn);
    for (int i = 0; i < c->s->nnodes; i++)
      if (c->s->nodes[i].op == EVT_V_SCALAR && c->s->nodes[i].value == sv) return i;
    int id = evt_kspec_scalar(c->s, sv);
    if (id < 0) refuse(c, v, "the epilogue needs more than %d visitor nodes", EVT_KSPEC_MAX_NODES);
    else c->vt[id] = -1;
    return id;
  }
  if ((sn == 1 || N == 1) && sm != 0 && (sm >= N || M == 1)) op = EVT_V_AUX_LOAD, extent = M == 1 ? N : sm;
  else if (sm == 0 && (sn == 1 || N == 1)) op = EVT_V_ROW_BCAST, extent = N;
  else if (sn == 0 && (sm == 1 || M == 1)) op = EVT_V_COL_BCAST, extent = M;
  else {
    refuse(c, v, "operand %%%s is not a broadcast of the batched tile (M, N strides %lld, %lld)", xn->name, (long long)sm,
           (long long)sn);
    return -1;
  }
  if (bn->op == EVT_OP_RAND) {
    refuse(c, v, "operand %%%s: rand is generated in-kernel and the visitor has no RNG node", xn->name);
    return -1;
  }
  if (!float_dtype(bn->type.dtype)) {
    refuse(c, v, "operand %%%s has dtype %s (loads take bf16, f16 or f32)", xn->name, evt_dtype_name(bn->type.dtype));
    return -1;
  }
  int64_t es = (int64_t)evt_dtype_size(bn->type.dtype);
  if ((extent * es) % 16) {
    refuse(c, v, "operand %%%s: %lld-byte rows are not 16-byte aligned", xn->name, (long long)(extent * es));
    return -1;
  }
  for (int i = 0; i < c->s->nnodes; i++)
    if (c->s->nodes[i].op == op && c->vt[i] == base && !memcmp(c->vst[i], bs, sizeof(int64_t) * (size_t)r)) return i;
  char name[24];
  int kind = op == EVT_V_AUX_LOAD ? 0 : op == EVT_V_ROW_BCAST ? 1 : 2;
  snprintf(name, sizeof name, "%c%d", "arc"[kind], c->nload[kind]++);
  int id = add_node(c, v, op, -1, -1, bn->type.dtype, name, base);
  if (id < 0) return -1;
  c->s->nodes[id].shared = shared;
  memcpy(c->vst[id], bs, sizeof(int64_t) * (size_t)r);
  return id;
}

/* A sum in a batched epilogue: over M (row_sum) or N (col_sum), per batch (no batch dim reduced) or over
 * every batch too (shared). */
static bool sum_batched(lctx *c, int v) {
  const evt_graph *g = c->g;
  const evt_node *nd = &g->nodes[v];
  int x = nd->inputs[0];
  const evt_type *xt = &g->nodes[x].type;
  if (!same_shape(xt, c->bt)) return refuse(c, v, "sum of a tensor that is not shaped like the batched tile");
  int xv = operand(c, v, x, xt);
  if (xv < 0) return false;
  int r = xt->rank, nbd = c->nbd;
  bool rd[EVT_MAX_RANK] = {0};
  if (nd->attr.dims.n == 0)
    for (int i = 0; i < r; i++) rd[i] = true;
  for (int i = 0; i < nd->attr.dims.n; i++) rd[nd->attr.dims.v[i] < 0 ? nd->attr.dims.v[i] + r : nd->attr.dims.v[i]] = true;
  int nb = 0, nbr = 0;
  for (int d = 0; d < nbd; d++)
    if (xt->shape[d] != 1) nb++, nbr += rd[d];
  bool m1 = xt->shape[nbd] == 1, n1 = xt->shape[nbd + 1] == 1;
  bool over_m = (rd[nbd] || m1) && !rd[nbd + 1], over_n = (rd[nbd + 1] || n1) && !rd[nbd];
  if (over_m && over_n) over_n = false;
  if (nbr != 0 && nbr != nb)
    return refuse(c, v, "sum over some batch dims but not all (per-batch sums or sums over every batch only)");
  if (!over_m && !over_n)
    return refuse(c, v, "sum over dims that are neither M nor N of the batched tile (visitor has row and column sums only)");
  if (nd->type.dtype != EVT_F32)
    return refuse(c, v, "sum into %s (row/column sums are written in f32)", evt_dtype_name(nd->type.dtype));
  char name[24];
  if (over_m) snprintf(name, sizeof name, "rs%d", c->nrsum++);
  else snprintf(name, sizeof name, "cs%d", c->ncsum++);
  int id = add_node(c, v, over_m ? EVT_V_ROW_SUM : EVT_V_COL_SUM, xv, -1, EVT_F32, name, v);
  if (id < 0) return false;
  c->s->nodes[id].shared = nbr > 0;
  c->vid[v] = -1;
  return true;
}

/* Is member v read outside its group, or a graph output? (false when judging one node: the partitioner
 * decides that.) */
static bool leaves_group(const lctx *c, int v) {
  if (!c->group) return false;
  if (c->g->nodes[v].flags & EVT_NODE_OUTPUT) return true;
  for (int w = v + 1; w < c->g->nnodes; w++)
    if (c->group[w] != c->gi)
      for (int k = 0; k < c->g->nodes[w].ninputs; k++)
        if (c->g->nodes[w].inputs[k] == v) return true;
  return false;
}

static bool member_uses_in_group(const lctx *c, int v) {
  if (!c->group) return false;
  for (int w = v + 1; w < c->g->nnodes; w++)
    if (c->group[w] == c->gi)
      for (int k = 0; k < c->g->nodes[w].ninputs; k++)
        if (c->g->nodes[w].inputs[k] == v) return true;
  return false;
}

/* Lowers member v (not the nucleus, not an operand permute). Sets c->vid[v] for tile values; a sum
 * becomes a row/col sum store whose vt is set by the caller. Returns false with the reason. */
static bool member(lctx *c, int v) {
  const evt_graph *g = c->g;
  const evt_node *nd = &g->nodes[v];
  const evt_type *t = &nd->type;
  bool int_ok = c->row && (nd->op == EVT_OP_WHERE || nd->op == EVT_OP_ADD || nd->op == EVT_OP_SUB || nd->op == EVT_OP_MUL ||
                            nd->op == EVT_OP_NEG || nd->op == EVT_OP_ABS || nd->op == EVT_OP_MAXIMUM ||
                            nd->op == EVT_OP_MINIMUM || is_view_op(nd->op));
  if (!float_dtype(t->dtype) && t->dtype != EVT_BOOL && !((t->dtype == EVT_I64 || t->dtype == EVT_I32) && int_ok))
    return refuse(c, v, "dtype %s (the epilogue computes bf16/f16/f32 values and bools as 0/1%s)", evt_dtype_name(t->dtype),
                  c->row ? "; integers only through where / add / sub / mul / neg / abs / maximum / minimum" : "");
  if (c->nbd && c->alias) {
    if (is_view_op(nd->op)) {
      int x = nd->inputs[0];
      if (c->vid[x] < 0) return refuse(c, v, "view of a value that is not a tile value of this kernel");
      c->vid[v] = c->vid[x];
      c->alias[v] = x; /* the same values; only a store of v writes them in v's order */
      return true;
    }
    for (int k = 0; k < nd->ninputs; k++)
      if (c->vid[nd->inputs[k]] >= 0 && c->alias[nd->inputs[k]] >= 0)
        return refuse(c, v, "reads %%%s, a view of the batched tile in another element order (only stores take views)",
                      g->nodes[nd->inputs[k]].name);
    if (nd->op != EVT_OP_SUM && !same_shape(t, c->bt)) {
      char tb[96], bb[96];
      return refuse(c, v, "shape %s is not the batched tile %s", evt_type_str(t, tb, sizeof tb), evt_type_str(c->bt, bb, sizeof bb));
    }
  }
  int in[3] = {-1, -1, -1};
  evt_vop op = EVT_V_COUNT;
  switch (nd->op) {
  case EVT_OP_ADD: op = EVT_V_ADD; break;
  case EVT_OP_SUB: op = EVT_V_SUB; break;
  case EVT_OP_MUL: op = EVT_V_MUL; break;
  case EVT_OP_DIV: op = EVT_V_DIV; break;
  case EVT_OP_RELU: op = EVT_V_RELU; break;
  case EVT_OP_SIGMOID: op = EVT_V_SIGMOID; break;
  case EVT_OP_NEG: op = EVT_V_NEG; break;
  case EVT_OP_EXP: op = EVT_V_EXP; break;
  case EVT_OP_LOG: op = EVT_V_LOG; break;
  case EVT_OP_ERF: op = EVT_V_ERF; break;
  case EVT_OP_TANH: op = EVT_V_TANH; break;
  case EVT_OP_SQRT: op = EVT_V_SQRT; break;
  case EVT_OP_RSQRT: op = EVT_V_RSQRT; break;
  case EVT_OP_RECIPROCAL: op = EVT_V_RECIPROCAL; break;
  case EVT_OP_ABS: op = EVT_V_ABS; break;
  case EVT_OP_SIGN: op = EVT_V_SIGN; break;
  case EVT_OP_MAXIMUM: op = EVT_V_MAXIMUM; break;
  case EVT_OP_MINIMUM: op = EVT_V_MINIMUM; break;
  case EVT_OP_EQ: op = EVT_V_EQ; break;
  case EVT_OP_NE: op = EVT_V_NE; break;
  case EVT_OP_LT: op = EVT_V_LT; break;
  case EVT_OP_LE: op = EVT_V_LE; break;
  case EVT_OP_GT: op = EVT_V_GT; break;
  case EVT_OP_GE: op = EVT_V_GE; break;
  case EVT_OP_WHERE: op = EVT_V_WHERE; break;
  case EVT_OP_ONE_HOT: {
    /* one_hot(idx [...]) -> [..., C]: the row space is [numel(idx), C]; idx is a dense M-vector of classes */
    int x = nd->inputs[0];
    const evt_type *xt = &g->nodes[x].type;
    int64_t st[EVT_MAX_RANK];
    int base;
    if (!c->row) return refuse(c, v, "one_hot in a GEMM epilogue (a row-kernel visitor only)");
    if (t->rank < 1 || t->shape[t->rank - 1] != c->n || evt_type_numel(xt) != c->m)
      return refuse(c, v, "one_hot over %lld classes is not the %lldx%lld row space", (long long)(t->rank ? t->shape[t->rank - 1] : 0),
                    (long long)c->m, (long long)c->n);
    if (!mem_strides(g, c->group, -1, x, st, &base) || !dense(xt->shape, st, 0, xt->rank, 1))
      return refuse(c, v, "one_hot of %%%s: the class indices are not a dense vector in memory", g->nodes[x].name);
    if (c->vid[x] >= 0 || !evt_vop_storage_ok(EVT_V_ONE_HOT, g->nodes[base].type.dtype, 0))
      return refuse(c, v, "one_hot of %%%s: class indices must be an i64/i32 tensor in memory", g->nodes[x].name);
    for (int i = 0; i < c->s->nnodes; i++)
      if (c->s->nodes[i].op == EVT_V_ONE_HOT && c->vt[i] == base) return (c->vid[v] = i), true;
    char name[24];
    snprintf(name, sizeof name, "h%d", c->nload[4]++);
    c->vid[v] = add_node(c, v, EVT_V_ONE_HOT, -1, -1, g->nodes[base].type.dtype, name, base);
    return c->vid[v] >= 0;
  }
  case EVT_OP_GELU: op = nd->attr.approximate == EVT_APPROXIMATE_TANH ? EVT_V_GELU_TANH : EVT_V_GELU_ERF; break;
  case EVT_OP_GELU_BACKWARD:
    op = nd->attr.approximate == EVT_APPROXIMATE_TANH ? EVT_V_GELU_TANH_GRAD : EVT_V_GELU_ERF_GRAD;
    break;
  case EVT_OP_THRESHOLD_BACKWARD:
    if (nd->attr.value != 0) return refuse(c, v, "threshold %g (relu_grad thresholds at 0)", nd->attr.value);
    op = EVT_V_RELU_GRAD;
    break;
  case EVT_OP_CAST: {
    evt_dtype from = g->nodes[nd->inputs[0]].type.dtype;
    bool from_int = from == EVT_I64 || from == EVT_I32;
    if (!float_dtype(from) && from != EVT_BOOL && !(from_int && c->row)) return refuse(c, v, "cast from %s", evt_dtype_name(from));
    if (t->dtype == EVT_BOOL && from != EVT_BOOL) { /* x != 0 as 0/1 */
      op = EVT_V_NE;
      in[0] = operand(c, v, nd->inputs[0], t);
      if (in[0] < 0) return false;
      in[1] = -1;
      for (int i = 0; i < c->s->nnodes && in[1] < 0; i++)
        if (c->s->nodes[i].op == EVT_V_SCALAR && c->s->nodes[i].value == 0) in[1] = i;
      if (in[1] < 0 && (in[1] = evt_kspec_scalar(c->s, 0.0)) < 0)
        return refuse(c, v, "the epilogue needs more than %d visitor nodes", EVT_KSPEC_MAX_NODES);
      c->vt[in[1]] = -1;
      int id = add_node(c, v, op, in[0], in[1], EVT_F32, NULL, -1);
      c->vid[v] = id;
      return id >= 0;
    }
    /* a broadcast operand widened to f32 (not tile-shaped): its users load the cast's input */
    if (widening_operand_cast(c, v) && !c->nbd && evt_type_numel(t) != 1 && tile_split(t, c->m, c->n) < 0) {
      if (leaves_group(c, v))
        return refuse(c, v, "a widened broadcast operand leaves the kernel (stores write whole tiles)");
      return true;
    }
    /* a bool's 0/1 is exact in every float type; a cast to 16 bits whose value is used inside the group
     * rounds there (round_bf16 / round_f16, still f32); one only stored is rounded by its store */
    if ((t->dtype == EVT_BF16 || t->dtype == EVT_F16) && from != EVT_BOOL && !from_int && from != t->dtype &&
        member_uses_in_group(c, v)) {
      int xi = operand(c, v, nd->inputs[0], t);
      if (xi < 0) return false;
      c->vid[v] = add_node(c, v, t->dtype == EVT_BF16 ? EVT_V_ROUND_BF16 : EVT_V_ROUND_F16, xi, -1, EVT_F32, NULL, -1);
      return c->vid[v] >= 0;
    }
  }
    /* an identity on the f32 value */
    /* fallthrough */
  case EVT_OP_RESHAPE: case EVT_OP_SQUEEZE: case EVT_OP_UNSQUEEZE: {
    int x = nd->inputs[0];
    if (c->vid[x] < 0) {
      const evt_node *xn = &g->nodes[x];
      /* (a mean is a sum of scaled values here: a batch norm's [1,1,1,C] mean leaves as the saved [C] mean) */
      if (nd->op != EVT_OP_CAST && c->group && c->group[x] == c->gi &&
          (xn->op == EVT_OP_SUM || xn->op == EVT_OP_MEAN || xn->op == EVT_OP_AMAX) && !member_uses_in_group(c, v))
        return true; /* the reduction's output seen through a view that leaves: add_stores binds its store there */
      if (nd->op != EVT_OP_CAST) return refuse(c, v, "view of a value that is not a tile value of this kernel");
      c->vid[v] = operand(c, v, x, t);
      return c->vid[v] >= 0;
    }
    if (evt_type_numel(t) != c->m * c->n || tile_split(t, c->m, c->n) < 0)
      return refuse(c, v, "view changes the tile's element order");
    c->vid[v] = c->vid[x];
    return true;
  }
  case EVT_OP_SUM:
  case EVT_OP_MEAN:
  case EVT_OP_AMAX: {
    bool mx = nd->op == EVT_OP_AMAX;
    if (c->nbd && mx) return refuse(c, v, "amax in a batched GEMM epilogue (row kernels take a max within rows)");
    if (c->nbd && nd->op == EVT_OP_MEAN) return refuse(c, v, "mean in a batched GEMM epilogue");
    if (c->nbd) return sum_batched(c, v);
    int x = nd->inputs[0];
    const evt_type *xt = &g->nodes[x].type;
    int s = tile_split(xt, c->m, c->n);
    if (s < 0) return refuse(c, v, "input is not a split of the tile");
    int xv = operand(c, v, x, xt); /* a member's value, or a tile loaded from memory */
    if (xv < 0) return false;
    bool rd[EVT_MAX_RANK] = {0};
    if (nd->attr.dims.n == 0)
      for (int i = 0; i < xt->rank; i++) rd[i] = true;
    for (int i = 0; i < nd->attr.dims.n; i++) rd[nd->attr.dims.v[i] < 0 ? nd->attr.dims.v[i] + xt->rank : nd->attr.dims.v[i]] = true;
    if (nd->op == EVT_OP_MEAN) { /* Σ (x · 1/count): the visitor's sums are stores, so the scale goes first */
      int64_t cnt = 1;
      for (int i = 0; i < xt->rank; i++)
        if (rd[i]) cnt *= xt->shape[i];
      if (cnt <= 0) return refuse(c, v, "mean over an empty dim");
      int sc = evt_kspec_scalar(c->s, 1.0 / (double)cnt);
      if (sc < 0) return refuse(c, v, "the epilogue needs more than %d visitor nodes", EVT_KSPEC_MAX_NODES);
      c->vt[sc] = -1;
      xv = add_node(c, v, EVT_V_MUL, xv, sc, EVT_F32, NULL, -1);
      if (xv < 0) return false;
    }
    bool over_m = true, over_n = true; /* reduces exactly the (non-unit) M dims / N dims */
    for (int i = 0; i < xt->rank; i++) {
      if (xt->shape[i] == 1) continue;
      if ((i < s) != rd[i]) over_m = false;
      if ((i >= s) != rd[i]) over_n = false;
    }
    if (over_m && over_n) over_n = mx; /* a 1xN or Mx1 tile: prefer Σ over M (max: over N, within rows) */
    if (over_m && over_n) over_m = false;
    if (!over_m && !over_n)
      return refuse(c, v, "%s over dims that are neither the %s's M dims nor its N dims (visitor has row and column %s only)",
                    mx ? "amax" : "sum", c->row ? "row space" : "tile", mx ? "maxima" : "sums");
    if (mx && !c->row) return refuse(c, v, "amax in a GEMM epilogue (row kernels take a max within rows)");
    if (mx && over_m) return refuse(c, v, "amax over rows (row kernels take a max within rows, over the last dim)");
    if (!c->row && t->dtype != EVT_F32)
      return refuse(c, v, "sum into %s: CTAs of a GEMM add partial sums with f32 atomics, so the sum's tensor must be "
                    "f32 (row kernels round once at the store)", evt_dtype_name(t->dtype));
    if (!float_dtype(t->dtype)) return refuse(c, v, "%s into %s", mx ? "amax" : "sum", evt_dtype_name(t->dtype));
    char name[24];
    if (mx) snprintf(name, sizeof name, "cm%d", c->ncsum++);
    else if (over_m) snprintf(name, sizeof name, "rs%d", c->nrsum++);
    else snprintf(name, sizeof name, "cs%d", c->ncsum++);
    int id = add_node(c, v, mx ? EVT_V_COL_MAX : over_m ? EVT_V_ROW_SUM : EVT_V_COL_SUM, xv, -1, t->dtype, name, v);
    if (id < 0) return false;
    c->vid[v] = -1;
    return true;
  }
  default:
    return refuse(c, v, "no visitor node for %s", evt_op_table[nd->op].name);
  }
  int ar = evt_vop_arity(op);
  for (int k = 0; k < nd->ninputs && k < ar; k++) {
    in[k] = operand(c, v, nd->inputs[k], t);
    if (in[k] < 0) return false;
  }
  int id = evt_kspec_add3(c->s, op, in[0], ar > 1 ? in[1] : -1, ar > 2 ? in[2] : -1, EVT_F32, NULL);
  if (id < 0) return refuse(c, v, "the epilogue needs more than %d visitor nodes", EVT_KSPEC_MAX_NODES);
  c->vt[id] = -1;
  if (id < 0) return false;
  c->vid[v] = id;
  return true;
}

/* A transposed 2-D operand: +1 if x's memory holds x^T (strides (1, rows)), 0 if row-major, -1 otherwise. */
static int operand_layout(const evt_graph *g, const int *group, int gi, int x, int *base) {
  int64_t st[EVT_MAX_RANK];
  const evt_type *t = &g->nodes[x].type;
  int through = group[x] == gi ? gi : -1;
  if (t->rank != 2 || !mem_strides(g, group, through, x, st, base)) return -1;
  if ((st[1] == 1 || t->shape[1] == 1) && (st[0] == t->shape[1] || t->shape[0] == 1)) return 0;
  if ((st[0] == 1 || t->shape[0] == 1) && (st[1] == t->shape[0] || t->shape[1] == 1)) return 1;
  return -1;
}

/* Members of group gi, in id order, except the nucleus and GEMM operand permutes (skip1, skip2). */
static void members(lctx *c, int skip1, int skip2) {
  const evt_graph *g = c->g;
  for (int v = 0; v < g->nnodes && c->bad < 0; v++) {
    if (c->group[v] != c->gi || v == c->nu || v == skip1 || v == skip2) continue;
    const evt_node *vn = &g->nodes[v];
    if ((vn->op == EVT_OP_PERMUTE || vn->op == EVT_OP_TRANSPOSE) && !c->nbd) {
      refuse(c, v, "a permute inside an epilogue (only GEMM operands absorb permutes, as layouts)");
      break;
    }
    member(c, v);
  }
}

/* Stores for every member value read outside the group (or a graph output): sums are bound to their
 * tensor (or to the view of it that leaves); with want_d, the latest tile value is D (*dmem), the others
 * aux stores; without, every one is an aux store. */
static void add_stores(lctx *c, evt_lowered *L, bool want_d, int *dmem) {
  const evt_graph *g = c->g;
  const int *group = c->group;
  int gi = c->gi, n = g->nnodes;
  *dmem = -1;
  unsigned char *leaves = calloc((size_t)n + 1, 1);
  EVT_ASSERT(leaves);
  for (int v = 0; v < n; v++)
    if (group[v] == gi && (g->nodes[v].flags & EVT_NODE_OUTPUT)) leaves[v] = 1;
  for (int w = 0; w < n; w++)
    for (int k = 0; k < g->nodes[w].ninputs; k++) {
      int u = g->nodes[w].inputs[k];
      if (group[u] == gi && group[w] != gi) leaves[u] = 1;
    }
  /* A leaving reshape / squeeze / unsqueeze of another leaving member is the same bytes (stores write row-major
   * tiles): it is not stored again but shares its base's memory (a cast that is both a step output and, through
   * a reshape, a GEMM operand: bert's layer norms and fc1 stored their bf16 result twice). Not for a graph output
   * (the caller gives it memory of its own). */
  for (int v = 0; v < n; v++) {
    if (group[v] != gi || leaves[v] != 1 || c->vid[v] < 0 || (g->nodes[v].flags & EVT_NODE_OUTPUT)) continue;
    int u = v;
    while (group[u] == gi && g->nodes[u].ninputs == 1 &&
           (g->nodes[u].op == EVT_OP_RESHAPE || g->nodes[u].op == EVT_OP_SQUEEZE || g->nodes[u].op == EVT_OP_UNSQUEEZE))
      u = g->nodes[u].inputs[0];
    if (u == v || group[u] != gi || leaves[u] != 1 || c->vid[u] != c->vid[v] ||
        g->nodes[u].type.dtype != g->nodes[v].type.dtype || L->nalias >= EVT_LOWER_MAX_ALIAS)
      continue;
    L->alias_view[L->nalias] = v;
    L->alias_base[L->nalias++] = u;
    leaves[v] = 3; /* shares u's memory */
  }
  for (int v = n - 1; v >= 0 && want_d && *dmem < 0; v--)
    if (group[v] == gi && leaves[v] == 1 && c->vid[v] >= 0) *dmem = v;
  for (int i = 0; i < c->s->nnodes; i++) {
    evt_vop op = c->s->nodes[i].op;
    if (op != EVT_V_ROW_SUM && op != EVT_V_COL_SUM && op != EVT_V_COL_MAX) continue;
    int v = L->vtensor[i];
    if (leaves[v]) continue;
    for (int w = v + 1; w < n; w++)
      if (group[w] == gi && leaves[w] && g->nodes[w].ninputs == 1 && g->nodes[w].inputs[0] == v && is_view_op(g->nodes[w].op)) {
        L->vtensor[i] = w;
        leaves[w] = 2; /* bound */
        break;
      }
  }
  for (int v = 0; v < n && c->bad < 0; v++) {
    if (group[v] != gi || leaves[v] != 1 || c->vid[v] < 0 || v == *dmem) continue;
    if (evt_type_numel(&g->nodes[v].type) != c->m * c->n) {
      refuse(c, v, "a value with %lld elements leaves a kernel over %lldx%lld (stores write whole tiles)",
             (long long)evt_type_numel(&g->nodes[v].type), (long long)c->m, (long long)c->n);
      break;
    }
    char name[24];
    snprintf(name, sizeof name, "s%d", c->nstore++);
    add_node(c, v, EVT_V_AUX_STORE, c->vid[v], -1, g->nodes[v].type.dtype, name, v);
  }
  for (int v = 0; v < n && c->bad < 0; v++) /* a view of a sum that leaves beside the sum itself */
    if (group[v] == gi && leaves[v] == 1 && c->vid[v] < 0 && g->nodes[v].op != EVT_OP_SUM && g->nodes[v].op != EVT_OP_MEAN &&
        g->nodes[v].op != EVT_OP_AMAX) {
      bool bound = false;
      for (int i = 0; i < c->s->nnodes; i++) bound |= L->vtensor[i] == v;
      if (bound) continue;
      /* a second view of a reduction (log-softmax's row max, read as [M] and as [M, 1]): the same
       * reduction once more into the view's tensor (a view holds the reduction's values in its order) */
      int r = -1, src = v;
      while (src >= 0 && is_view_op(g->nodes[src].op) && g->nodes[src].ninputs == 1) src = g->nodes[src].inputs[0];
      for (int i = 0; src >= 0 && i < c->s->nnodes && r < 0; i++) {
        evt_vop op = c->s->nodes[i].op;
        if ((op == EVT_V_ROW_SUM || op == EVT_V_COL_SUM || op == EVT_V_COL_MAX) && c->vt[i] >= 0 &&
            (c->vt[i] == src || (is_view_op(g->nodes[c->vt[i]].op) && g->nodes[c->vt[i]].inputs[0] == src)))
          r = i;
      }
      if (r < 0 || evt_type_numel(&g->nodes[v].type) != evt_type_numel(&g->nodes[c->vt[r]].type) ||
          g->nodes[v].type.dtype != c->s->nodes[r].dtype) {
        refuse(c, v, "a second view of a reduction leaves the group");
        break;
      }
      const evt_vnode rn = c->s->nodes[r];
      char name[24];
      if (rn.op == EVT_V_COL_MAX) snprintf(name, sizeof name, "cm%d", c->ncsum++);
      else if (rn.op == EVT_V_ROW_SUM) snprintf(name, sizeof name, "rs%d", c->nrsum++);
      else snprintf(name, sizeof name, "cs%d", c->ncsum++);
      add_node(c, v, rn.op, rn.in[0], -1, rn.dtype, name, v);
    }
  free(leaves);
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
  if (L->d_tensor >= 0) t[nt++] = (reach){"D", L->d_tensor, touched(lo, L->os_d, l, L->bs_d ? L->bs_d : M * ldd, M, ldd, N)};
  for (int i = 0; i < s->nnodes; i++) {
    const evt_vnode *vn = &s->nodes[i];
    if (!evt_vop_has_memory(vn->op)) continue;
    bool tile = vn->op == EVT_V_AUX_LOAD || vn->op == EVT_V_AUX_STORE;
    int64_t rows = tile ? M : 1, cols = evt_vnode_numel(s, i, M, N) / rows, ld = tile && L->ld_ptrs[i] ? L->ld_ptrs[i] : cols;
    int64_t need = vn->shared ? rows * ld - ld + cols
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

/* The bmm group gi -> a batched kernel spec (see the batched section above) and its launch layout. */
static void lower_bmm(const evt_graph *g, const int *group, int gi, int nu, evt_lowered *L, int *vid) {
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
  int a = nn->inputs[0], b = nn->inputs[1];
  int64_t M = nn->type.shape[nbd], N = nn->type.shape[nbd + 1], K = g->nodes[a].type.shape[nbd + 1];
  L->m = M, L->n = N, L->k = K;
  c->m = bmm_batch(&nn->type) * M, c->n = N;
  int64_t sa[EVT_MAX_RANK], sb[EVT_MAX_RANK], sd[EVT_MAX_RANK];
  int64_t lda = 0, ldb = 0, ldd = 0;
  int ta = -1, tb = -1;
  if (!mem_strides(g, group, group[a] == gi ? gi : -1, a, sa, &L->a_node) ||
      (ta = bmm_matrix(M, K, sa[nbd], sa[nbd + 1], &lda)) < 0)
    refuse(c, nu, "operand %%%s: per batch neither row-major nor transposed in memory", g->nodes[a].name);
  else if (!mem_strides(g, group, group[b] == gi ? gi : -1, b, sb, &L->b_node) ||
           (tb = bmm_matrix(K, N, sb[nbd], sb[nbd + 1], &ldb)) < 0)
    refuse(c, nu, "operand %%%s: per batch neither row-major nor transposed in memory", g->nodes[b].name);
  else if (ta && tb)
    refuse(c, nu, "both operands transposed (layout TT is not in the kernel spec)");
  evt_dtype adt = L->a_node >= 0 ? g->nodes[L->a_node].type.dtype : EVT_F32;
  evt_dtype bdt = L->b_node >= 0 ? g->nodes[L->b_node].type.dtype : EVT_F32;
  if (c->bad < 0 && (adt != bdt || (adt != EVT_BF16 && adt != EVT_F16)))
    refuse(c, nu, "operands %s x %s (the kernel spec takes bf16 or f16 operands)", evt_dtype_name(adt), evt_dtype_name(bdt));
  else if (c->bad < 0 && (M % 8 || N % 8 || K % 8))
    refuse(c, nu, "M=%lld N=%lld K=%lld: each must be a multiple of 8 (16-byte aligned rows)", (long long)M, (long long)N,
           (long long)K);
  if (c->bad < 0) {
    /* batched GEMMs are not tuned (src/tune/tune.c): a 128x64 tile when N <= 64 (attention's context and
     * dQ/dK with head dim 64) spends no MMA work on a padded half tile */
    evt_tile_config cfg = {128, N <= 64 ? 64 : 128, 64, 1, 1, EVT_SCHED_COOPERATIVE};
    evt_kspec_init(&L->spec, ta ? EVT_LAYOUT_TN : tb ? EVT_LAYOUT_NT : EVT_LAYOUT_NN, adt, EVT_BF16, cfg);
    L->spec.batched = 1;
    vid[nu] = add_node(c, nu, EVT_V_ACC, -1, -1, EVT_F32, NULL, -1);
    members(c, group[a] == gi ? a : -1, group[b] == gi ? b : -1);
  }
  int dmem = -1;
  if (c->bad < 0) add_stores(c, L, true, &dmem);
  if (c->bad < 0) {
    if (dmem >= 0) {
      L->d_tensor = dmem;
      L->spec.d_node = vid[dmem];
      L->spec.d_dtype = g->nodes[dmem].type.dtype;
      if (!store_strides(c, dmem, sd)) refuse(c, dmem, "D: the view chain to %%%s cannot be written with strides", g->nodes[dmem].name);
    } else {
      int last = -1;
      for (int v = n - 1; v >= 0 && last < 0; v--)
        if (group[v] == gi && vid[v] >= 0) last = v;
      L->d_tensor = -1;
      L->spec.d_node = vid[last];
      L->spec.d_dtype = L->spec.ab_dtype;
      contiguous(&nn->type, sd);
    }
  }
  int td = c->bad < 0 ? bmm_matrix(M, N, sd[nbd], sd[nbd + 1], &ldd) : 0;
  bool tiles = false;
  for (int i = 0; i < L->spec.nnodes; i++)
    tiles |= L->spec.nodes[i].op == EVT_V_AUX_LOAD || L->spec.nodes[i].op == EVT_V_AUX_STORE;
  if (td == 1 && !tiles) {
    /* D stored transposed (a permute swapped the last two dims): compute D^T = B^T A^T instead. Row and
     * column broadcasts / sums trade places; M x N aux tiles would need column-major visitor tiles. */
    int64_t t[EVT_MAX_RANK];
    int ta2 = bmm_matrix(N, K, sb[nbd + 1], sb[nbd], &lda), tb2 = bmm_matrix(K, M, sa[nbd + 1], sa[nbd], &ldb);
    if (ta2 < 0 || tb2 < 0 || (ta2 && tb2)) {
      refuse(c, dmem >= 0 ? dmem : nu, "D is stored transposed and B^T A^T needs layout TT");
    } else {
      memcpy(t, sa, sizeof t), memcpy(sa, sb, sizeof t), memcpy(sb, t, sizeof t);
      int tn = L->a_node;
      L->a_node = L->b_node, L->b_node = tn;
      evt_dtype tdt = adt;
      adt = bdt, bdt = tdt;
      L->m = N, L->n = M, M = L->m, N = L->n;
      L->spec.layout = ta2 ? EVT_LAYOUT_TN : tb2 ? EVT_LAYOUT_NT : EVT_LAYOUT_NN;
      int64_t x = sd[nbd];
      sd[nbd] = sd[nbd + 1], sd[nbd + 1] = x;
      for (int i = 0; i < L->spec.nnodes; i++) {
        evt_vnode *vn = &L->spec.nodes[i];
        switch (vn->op) {
        case EVT_V_ROW_BCAST: vn->op = EVT_V_COL_BCAST; break;
        case EVT_V_COL_BCAST: vn->op = EVT_V_ROW_BCAST; break;
        case EVT_V_ROW_SUM: vn->op = EVT_V_COL_SUM; break;
        case EVT_V_COL_SUM: vn->op = EVT_V_ROW_SUM; break;
        default: break;
        }
        x = c->vst[i][nbd], c->vst[i][nbd] = c->vst[i][nbd + 1], c->vst[i][nbd + 1] = x;
      }
      td = bmm_matrix(M, N, sd[nbd], sd[nbd + 1], &ldd);
    }
  }
  if (c->bad < 0 && td)
    refuse(c, dmem >= 0 ? dmem : nu, "D %s (D is written row-major per batch)",
           td > 0 ? "is stored transposed and the epilogue has M x N tiles" : "is neither row-major nor transposed");
  /* stores: strides of their memory over the tile's dims */
  for (int i = 0; i < L->spec.nnodes && c->bad < 0; i++) {
    evt_vnode *vn = &L->spec.nodes[i];
    int64_t ld = 0;
    if (vn->op == EVT_V_AUX_STORE) {
      if (!store_strides(c, L->vtensor[i], c->vst[i]) || bmm_matrix(M, N, c->vst[i][nbd], c->vst[i][nbd + 1], &ld))
        refuse(c, L->vtensor[i], "a store whose memory is not row-major per batch");
    } else if (vn->op == EVT_V_ROW_SUM || vn->op == EVT_V_COL_SUM) {
      int64_t w = vn->op == EVT_V_ROW_SUM ? N : M; /* per batch: [batch..., len] packed */
      for (int d = nbd - 1; d >= 0; d--) c->vst[i][d] = vn->shared ? 0 : w, w *= nn->type.shape[d];
    }
  }
  /* batch levels: runs of batch dims that every per-batch tensor steps through with one stride */
  const int64_t *bsh = nn->type.shape;
  const int64_t *part[EVT_KSPEC_MAX_NODES + 3];
  const char *pname[EVT_KSPEC_MAX_NODES + 3];
  int64_t pes[EVT_KSPEC_MAX_NODES + 3];
  int np = 0;
  if (c->bad < 0) {
    part[np] = sa, pname[np] = "A", pes[np++] = (int64_t)evt_dtype_size(adt);
    part[np] = sb, pname[np] = "B", pes[np++] = (int64_t)evt_dtype_size(bdt);
    part[np] = sd, pname[np] = "D", pes[np++] = (int64_t)evt_dtype_size(L->spec.d_dtype);
    for (int i = 0; i < L->spec.nnodes; i++)
      if (evt_vop_has_memory(L->spec.nodes[i].op) && !L->spec.nodes[i].shared)
        part[np] = c->vst[i], pname[np] = L->spec.nodes[i].name, pes[np++] = (int64_t)evt_dtype_size(L->spec.nodes[i].dtype);
    for (int p = 0; p < np && c->bad < 0; p++)
      if (batch_zero(c, part[p], true))
        refuse(c, nu, "%s is broadcast over a batch dim (every batch needs its own %s)", pname[p], pname[p]);
  }
  int lev_last[EVT_MAX_RANK], nlev = 0;
  int64_t lev_ext[EVT_MAX_RANK];
  for (int d = 0; d < nbd && c->bad < 0; d++) {
    if (bsh[d] == 1) continue;
    bool merge = nlev > 0;
    for (int p = 0; p < np && merge; p++) merge = part[p][lev_last[nlev - 1]] == part[p][d] * bsh[d];
    if (merge) lev_ext[nlev - 1] *= bsh[d], lev_last[nlev - 1] = d;
    else lev_ext[nlev] = bsh[d], lev_last[nlev++] = d;
  }
  if (c->bad < 0 && nlev > 2)
    refuse(c, nu, "batch dims need %d strided levels (the launcher has an inner batch and an outer loop)", nlev);
  for (int k = 0; k < nlev && c->bad < 0; k++)
    if (lev_ext[k] > 2147483647) refuse(c, nu, "batch of %lld exceeds the launcher's int", (long long)lev_ext[k]);
  for (int p = 0; p < np && c->bad < 0; p++)
    for (int k = 0; k < nlev; k++)
      if ((part[p][lev_last[k]] * pes[p]) % 16) {
        refuse(c, nu, "%s: batch stride %lld x %lld bytes is not 16-byte aligned", pname[p], (long long)part[p][lev_last[k]],
               (long long)pes[p]);
        break;
      }
  if (c->bad < 0 && ((M > 1 && (ta ? K : M) > 1 && (lda * pes[0]) % 16) || (ldb * pes[1]) % 16 || (ldd * pes[2]) % 16))
    refuse(c, nu, "a leading dim (A %lld, B %lld, D %lld elements) is not 16-byte aligned", (long long)lda, (long long)ldb,
           (long long)ldd);
  if (c->bad < 0) {
    int in = nlev == 2 && lev_ext[0] > lev_ext[1] ? 0 : nlev - 1, out = nlev == 2 ? 1 - in : -1;
    L->l = nlev ? (int)lev_ext[in] : 1;
    L->l_outer = out >= 0 ? (int)lev_ext[out] : 1;
    L->lda = lda, L->ldb = ldb, L->ldd = ldd;
    if (nlev) L->bs_a = sa[lev_last[in]], L->bs_b = sb[lev_last[in]], L->bs_d = sd[lev_last[in]];
    if (out >= 0) L->os_a = sa[lev_last[out]], L->os_b = sb[lev_last[out]], L->os_d = sd[lev_last[out]];
    for (int i = 0; i < L->spec.nnodes; i++) {
      const evt_vnode *vn = &L->spec.nodes[i];
      if (!evt_vop_has_memory(vn->op)) continue;
      if (vn->op == EVT_V_AUX_LOAD || vn->op == EVT_V_AUX_STORE) L->ld_ptrs[i] = c->vst[i][nbd];
      if (vn->shared) continue;
      if (nlev) L->bs_ptrs[i] = c->vst[i][lev_last[in]];
      if (out >= 0) L->os_ptrs[i] = c->vst[i][lev_last[out]];
    }
    for (int i = 0; i < L->spec.nnodes && L->l_outer > 1; i++)
      if (L->spec.nodes[i].shared && evt_vop_class(L->spec.nodes[i].op) == 'S')
        refuse(c, L->vtensor[i] >= 0 ? L->vtensor[i] : nu,
               "a sum over every batch with two batch levels (each outer launch would restart it)");
    char err[256];
    evt_vtree *tree = malloc(sizeof *tree);
    EVT_ASSERT(tree);
    evt_status st = c->bad < 0 ? evt_kspec_check(&L->spec, err, sizeof err) : EVT_OK;
    if (st == EVT_OK && c->bad < 0) st = evt_vtree_build(&L->spec, tree, err, sizeof err);
    free(tree);
    if (st != EVT_OK) refuse(c, nu, "%s", err);
  }
  if (c->bad < 0) {
    L->kind = EVT_LK_GEMM_EVT;
    L->ok = 1;
    char why[200];
    if (!evt_lower_batched_check(g, L, why, sizeof why)) { /* a lowering bug: never launch out of bounds */
      L->kind = EVT_LK_UNFUSED;
      L->ok = 0;
      refuse(c, nu, "internal: launch layout out of bounds: %s", why);
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
}

static void lower_gemm(const evt_graph *g, const int *group, int gi, int nu, evt_lowered *L, int *vid) {
  const evt_node *nn = &g->nodes[nu];
  lctx c = {.g = g, .group = group, .gi = gi, .nu = nu, .s = &L->spec, .vid = vid, .vt = L->vtensor,
            .why = L->reason, .whylen = sizeof L->reason, .bad = -1};
  L->kind = EVT_LK_UNFUSED;
  if (nn->op == EVT_OP_BMM) {
    lower_bmm(g, group, gi, nu, L, vid);
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
  if (ta < 0 || tb < 0) refuse(&c, nu, "operand %%%s is neither row-major nor transposed in memory", g->nodes[ta < 0 ? a : b].name);
  else if (ta && tb) refuse(&c, nu, "both operands transposed (layout TT is not in the kernel spec)");
  else if (adt != bdt || (adt != EVT_BF16 && adt != EVT_F16))
    refuse(&c, nu, "operands %s x %s (the kernel spec takes bf16 or f16 operands)", evt_dtype_name(adt), evt_dtype_name(bdt));
  else if (L->m % 8 || L->n % 8 || L->k % 8)
    refuse(&c, nu, "M=%lld N=%lld K=%lld: each must be a multiple of 8 (16-byte aligned rows)", (long long)L->m,
           (long long)L->n, (long long)L->k);
  if (c.bad >= 0) {
    L->bad_node = c.bad;
    return;
  }
  /* the untuned mainloop (evt_lower_untuned_config) is set once the epilogue is known, below */
  evt_tile_config cfg = {128, L->n >= 256 ? 256 : 128, 64, 1, 1, EVT_SCHED_COOPERATIVE};
  evt_kspec_init(&L->spec, ta ? EVT_LAYOUT_TN : tb ? EVT_LAYOUT_NT : EVT_LAYOUT_NN, adt, EVT_BF16, cfg);
  int acc = add_node(&c, nu, EVT_V_ACC, -1, -1, EVT_F32, NULL, -1);
  vid[nu] = acc;
  if (nn->op == EVT_OP_ADDMM) {
    vid[nu] = -1;
    int bias = operand(&c, nu, nn->inputs[0], &nn->type);
    vid[nu] = bias >= 0 ? add_node(&c, nu, EVT_V_ADD, acc, bias, EVT_F32, NULL, -1) : -1;
  }
  /* operand permutes fused as layouts are members too; they are not epilogue nodes */
  members(&c, group[a] == gi ? a : -1, group[b] == gi ? b : -1);
  int dmem = -1;
  if (c.bad < 0) add_stores(&c, L, true, &dmem);
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
      L->spec.d_dtype = L->spec.ab_dtype;
    }
  }
  if (c.bad >= 0) {
    L->bad_node = c.bad;
    return;
  }
  L->spec.cfg = evt_lower_untuned_config(&L->spec, L->m, L->n, L->k);
  char err[256];
  evt_vtree *tree = malloc(sizeof *tree);
  EVT_ASSERT(tree);
  evt_status st = evt_kspec_check(&L->spec, err, sizeof err);
  if (st == EVT_OK) st = evt_vtree_build(&L->spec, tree, err, sizeof err);
  free(tree);
  if (st != EVT_OK) {
    refuse(&c, nu, "%s", err);
    L->bad_node = c.bad;
    return;
  }
  L->kind = EVT_LK_GEMM_EVT;
  L->ok = 1;
  L->reason[0] = 0;
  evt_kspec_kernel_name(&L->spec, L->kernel);
}

evt_tile_config evt_lower_untuned_config(const evt_kspec *s, int64_t m, int64_t n, int64_t k) {
  /* 128x256 cooperative once N fills it (the tuner's winner on every unbatched H200 shape of
   * bench/results/h200-2026-11-29/W3/tune.log, up to 2x faster than 128x128 with a bias-gradient sum), else
   * 128x128. 128x128 ping-pong for an epilogue without row/column sums over K <= 4096: one consumer warp
   * group's epilogue runs while the other's mainloop keeps the tensor cores busy, so aux loads and stores and
   * elementwise math cost little (bench/results/h200-2026-11-29/S15W1, 16384x4096x1024: bias + aux store
   * 1.055x cuBLAS's plain GEMM vs 1.15x cooperative, acc * aux 1.04x vs 1.26x). A row sum (Σ over M) of an
   * unbatched kernel runs on the project's node (kernels/evt_visitor_nodes.h), which costs ping-pong little:
   * 8192x4096x1024 bias + ReLU + Σ_M 0.0977 ms ping-pong vs 0.1100 128x256 cooperative (S20W3); CUTLASS's
   * nodes (column sums, batched sums) keep their sums in local memory in a ping-pong kernel (1.7x slower,
   * S20W1), so those stay cooperative. At K = 8192 ping-pong's mainloop is ~20% slower than 128x256
   * cooperative (h200-run4). A tune record (src/tune/tune.c) replaces it. */
  evt_tile_config cfg = {128, n >= 256 ? 256 : 128, 64, 1, 1, EVT_SCHED_COOPERATIVE};
  evt_kspec pp = *s;
  pp.cfg = (evt_tile_config){128, 128, 64, 1, 1, EVT_SCHED_PINGPONG};
  if (!evt_emit_cutlass_sums(&pp) && k <= 4096 && m >= 128 && n >= 128) cfg = pp.cfg;
  return cfg;
}

int evt_lowered_alias_base(const evt_lowered *L, int v) {
  for (int i = 0; L && i < L->nalias; i++)
    if (L->alias_view[i] == v) return L->alias_base[i];
  return -1;
}

/* A dense M x N (mn = 1) or N-vector (mn = 0) operand of a row nucleus: its memory node, or -1. */
static int row_input(lctx *c, int x, bool mn) {
  int64_t st[EVT_MAX_RANK];
  int base;
  const evt_type *t = &c->g->nodes[x].type;
  if (!mem_strides(c->g, c->group, -1, x, st, &base)) return -1;
  if (mn ? evt_type_numel(t) != c->m * c->n : evt_type_numel(t) != c->n) return -1;
  return dense(t->shape, st, 0, t->rank, 1) ? base : -1;
}

/* A reduce-apply group (nu >= 0) or a nucleus-free group (nu = -1) → evt_rspec. The [M, N] space is the
 * nucleus's output with N its last (row) dim, or, without a nucleus, the largest tensor a member writes or
 * reads (N = its last dim). The epilogue is built exactly as for a GEMM into a scratch kspec (acc nodes
 * carry which nucleus value they read) and then copied; every member value that leaves is an aux store. */
static void lower_rows(const evt_graph *g, const int *group, int gi, int nu, evt_lowered *L, int *vid) {
  evt_kspec *scratch = calloc(1, sizeof *scratch);
  EVT_ASSERT(scratch);
  lctx c = {.g = g, .group = group, .gi = gi, .nu = nu, .s = scratch, .vid = vid, .vt = L->vtensor,
            .why = L->reason, .whylen = sizeof L->reason, .bad = -1, .row = 1};
  L->kind = nu >= 0 ? EVT_LK_ROW : EVT_LK_POINTWISE;
  const evt_type *space = NULL;
  evt_row_nucleus rn = EVT_ROWN_NONE;
  if (nu >= 0) {
    const evt_node *nn = &g->nodes[nu];
    space = &nn->type;
    switch (nn->op) {
    case EVT_OP_SOFTMAX: rn = EVT_ROWN_SOFTMAX; break;
    case EVT_OP_SOFTMAX_BACKWARD: rn = EVT_ROWN_SOFTMAX_BWD; break;
    case EVT_OP_LAYER_NORM: rn = EVT_ROWN_LAYERNORM; break;
    case EVT_OP_LAYER_NORM_BACKWARD_INPUT: rn = EVT_ROWN_LAYERNORM_BWD; break;
    default: refuse(&c, nu, "no row nucleus for %s", evt_op_table[nn->op].name); break;
    }
    if (rn == EVT_ROWN_SOFTMAX || rn == EVT_ROWN_SOFTMAX_BWD) {
      int64_t d = nn->attr.dim < 0 ? nn->attr.dim + space->rank : nn->attr.dim;
      if (d != space->rank - 1) refuse(&c, nu, "softmax over dim %lld (row kernels reduce the last dim)", (long long)d);
    }
    if (space->rank == 0) refuse(&c, nu, "a rank-0 row");
  } else {
    int64_t best = -1;
    for (int v = 0; v < g->nnodes; v++) {
      if (group[v] != gi) continue;
      if (evt_type_numel(&g->nodes[v].type) > best) best = evt_type_numel(&g->nodes[v].type), space = &g->nodes[v].type;
      for (int k = 0; k < g->nodes[v].ninputs; k++) {
        const evt_type *t = &g->nodes[g->nodes[v].inputs[k]].type;
        if (evt_type_numel(t) > best) best = evt_type_numel(t), space = t;
      }
    }
  }
  /* widening casts fused as the nucleus's loads (partition rules: CONVERT): the kernel reads their 16-bit inputs */
  int nmn = rn == EVT_ROWN_SOFTMAX || rn == EVT_ROWN_LAYERNORM ? 1 : 2, conv[2] = {-1, -1}, xin[2] = {-1, -1};
  for (int k = 0; nu >= 0 && rn != EVT_ROWN_NONE && k < nmn && k < g->nodes[nu].ninputs; k++) {
    int x = xin[k] = g->nodes[nu].inputs[k];
    const evt_node *xn = &g->nodes[x];
    if (group[x] == gi && xn->op == EVT_OP_CAST && xn->ninputs == 1 && xn->type.dtype == EVT_F32) {
      evt_dtype from = g->nodes[xn->inputs[0]].type.dtype;
      if (from == EVT_BF16 || from == EVT_F16) conv[k] = x, xin[k] = xn->inputs[0];
    }
  }
  if (c.bad < 0) {
    L->n = space->rank ? space->shape[space->rank - 1] : 1;
    L->m = L->n ? evt_type_numel(space) / L->n : 0;
    c.m = L->m, c.n = L->n;
    evt_rspec_init(&L->rspec, rn, xin[0] >= 0 ? g->nodes[xin[0]].type.dtype : EVT_F32);
    if (xin[1] >= 0 && g->nodes[xin[1]].type.dtype != L->rspec.in_dtype) {
      L->rspec.in1_mixed = 1;
      L->rspec.in1_dtype = g->nodes[xin[1]].type.dtype;
    }
  }
  if (c.bad < 0 && nu >= 0) {
    const evt_node *nn = &g->nodes[nu];
    for (int k = 0; k < nn->ninputs && c.bad < 0; k++) {
      bool mn = k < nmn;
      int x = mn ? xin[k] : nn->inputs[k];
      int base = row_input(&c, x, mn);
      evt_dtype dt = g->nodes[x].type.dtype;
      if (base < 0) refuse(&c, nu, "input %%%s is not a dense %s", g->nodes[x].name, mn ? "M x N tile" : "N-vector");
      else if (!float_dtype(dt)) refuse(&c, nu, "input dtype %s", evt_dtype_name(dt));
      if (c.bad >= 0) break;
      L->rin[k] = base;
      if (mn) c.rin[c.nrin++] = base;
      else {
        L->rspec.w_dtype = dt;
        if (k == nmn) L->rspec.has_w = 1;
        else L->rspec.has_b = 1;
      }
    }
    if (rn == EVT_ROWN_LAYERNORM || rn == EVT_ROWN_LAYERNORM_BWD) L->rspec.eps = nn->attr.eps;
    if (c.bad < 0) {
      int acc = add_node(&c, nu, EVT_V_ACC, -1, -1, EVT_F32, NULL, -1);
      if (acc >= 0) c.accsel[acc] = EVT_RV_OUT;
      vid[nu] = acc;
    }
  }
  if (c.bad < 0) members(&c, conv[0], conv[1]);
  int dmem;
  if (c.bad < 0) add_stores(&c, L, false, &dmem);
  /* copy the scratch DAG into the row spec (same ids) */
  for (int i = 0; i < scratch->nnodes && c.bad < 0; i++) {
    const evt_vnode *v = &scratch->nodes[i];
    int id = v->op == EVT_V_ACC      ? evt_rspec_acc(&L->rspec, c.accsel[i])
             : v->op == EVT_V_SCALAR ? evt_rspec_scalar(&L->rspec, v->value)
             : v->op == EVT_V_RAND   ? evt_rspec_rand(&L->rspec, v->seed, v->offset, v->dtype)
                                     : evt_rspec_add3(&L->rspec, v->op, v->in[0], v->in[1], v->in[2], v->dtype, v->name);
    if (id != i) refuse(&c, nu >= 0 ? nu : c.bad, "row spec rejected node %d", i);
  }
  free(scratch);
  char err[256];
  if (c.bad < 0 && evt_rspec_check(&L->rspec, err, sizeof err) != EVT_OK) {
    int first = nu;
    for (int v = 0; v < g->nnodes && first < 0; v++)
      if (group[v] == gi) first = v;
    refuse(&c, first, "%s", err);
  }
  if (c.bad >= 0) {
    L->bad_node = c.bad;
    L->kind = EVT_LK_UNFUSED;
    return;
  }
  L->ok = 1;
  L->reason[0] = 0;
  evt_rspec_kernel_name(&L->rspec, L->kernel);
}

evt_status evt_lower_plan(const evt_graph *g, const evt_part_plan *plan, evt_lower_result *out) {
  memset(out, 0, sizeof *out);
  if (!plan || !plan->group || plan->ngroups < 0) return EVT_ERR_INVALID;
  int n = g->nnodes;
  out->n = plan->ngroups;
  out->k = calloc((size_t)plan->ngroups + 1, sizeof *out->k);
  int *vid = malloc(((size_t)n + 1) * sizeof *vid);
  EVT_ASSERT(out->k && vid);
  for (int gi = 0; gi < plan->ngroups; gi++) {
    evt_lowered *L = &out->k[gi];
    L->group = gi;
    L->nucleus = plan->nucleus[gi];
    L->bad_node = -1;
    L->a_node = L->b_node = L->d_tensor = -1;
    L->rin[0] = L->rin[1] = L->rin[2] = -1;
    for (int i = 0; i < EVT_KSPEC_MAX_NODES; i++) L->vtensor[i] = -1;
    for (int v = 0; v < n; v++) vid[v] = -1;
    int nu = L->nucleus;
    if (nu >= n) {
      free(vid);
      return EVT_ERR_INVALID;
    }
    /* singletons (pool, embedding, sdpa, conv wgrad, ...) are groups without a NUCLEUS flag */
    int single = -1;
    for (int v = 0; v < n && single < 0; v++) {
      if (plan->group[v] != gi) continue;
      unsigned f = evt_part_op_flags(g, v);
      if ((f & EVT_PN_CUT_IN) && (f & EVT_PN_CUT_OUT)) single = v;
    }
    evt_op_class cls = nu >= 0 ? evt_op_table[g->nodes[nu].op].cls : EVT_CLASS_COUNT;
    if (single >= 0) {
      L->kind = EVT_LK_UNFUSED;
      L->bad_node = single;
      evt_op sop = g->nodes[single].op;
      evt_dtype sdt = g->nodes[single].type.dtype;
      bool attn = evt_op_table[sop].cls == EVT_CLASS_ATTENTION;
      snprintf(L->reason, sizeof L->reason, "group %d: %%%s (%s): a library kernel of its own%s; no kernel spec", gi,
               g->nodes[single].name, evt_op_table[sop].name,
               !attn ? "" : sdt == EVT_BF16 || sdt == EVT_F16 ? " (on CUDA: cuDNN's fused flash attention)"
                                                             : " (on CUDA: the reference kernel; cuDNN takes bf16/f16)");
    } else if (nu >= 0 && cls == EVT_CLASS_GEMM) {
      lower_gemm(g, plan->group, gi, nu, L, vid);
    } else if (nu < 0 || cls == EVT_CLASS_ROW) {
      lower_rows(g, plan->group, gi, nu, L, vid);
    } else {
      L->kind = EVT_LK_UNFUSED;
      L->bad_node = nu;
      snprintf(L->reason, sizeof L->reason, "group %d: %%%s (%s): no kernel spec for a %s nucleus", gi, g->nodes[nu].name,
               evt_op_table[g->nodes[nu].op].name, evt_op_class_names[cls]);
    }
    out->count[L->kind]++;
    out->lowered += L->ok;
  }
  free(vid);
  return EVT_OK;
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

void evt_lower_free(evt_lower_result *r) {
  free(r->k);
  r->k = NULL;
  r->n = 0;
}

bool evt_lower_can_fuse(const evt_graph *g, int nucleus, int node, char *why, size_t whylen) {
  if (why && whylen) why[0] = 0;
  if (nucleus < 0 || nucleus >= g->nnodes || node < 0 || node >= g->nnodes) {
    if (why && whylen) snprintf(why, whylen, "bad node id");
    return false;
  }
  const evt_node *nn = &g->nodes[nucleus];
  evt_kspec *s = malloc(sizeof *s);
  int *vid = malloc(((size_t)g->nnodes + 1) * sizeof *vid);
  EVT_ASSERT(s && vid);
  for (int v = 0; v < g->nnodes; v++) vid[v] = -1;
  int vt[EVT_KSPEC_MAX_NODES];
  for (int i = 0; i < EVT_KSPEC_MAX_NODES; i++) vt[i] = -1;
  lctx c = {.g = g, .group = NULL, .gi = -1, .nu = nucleus, .s = s, .vid = vid, .vt = vt, .why = why, .whylen = whylen, .bad = -1};
  evt_kspec_init(s, EVT_LAYOUT_NN, EVT_BF16, EVT_BF16, (evt_tile_config){128, 128, 64, 1, 1, EVT_SCHED_COOPERATIVE});
  int *alias = NULL;
  if (nn->op == EVT_OP_BMM && nn->type.rank >= 3) { /* batched: members judged over the nucleus's [batch..., M, N] */
    alias = malloc(((size_t)g->nnodes + 1) * sizeof *alias);
    EVT_ASSERT(alias);
    for (int v = 0; v < g->nnodes; v++) alias[v] = -1;
    c.nbd = nn->type.rank - 2, c.bt = &nn->type, c.alias = alias;
    s->batched = 1;
  }
  if (nn->op != EVT_OP_MM && nn->op != EVT_OP_ADDMM && !c.nbd) {
    refuse(&c, nucleus, "not a GEMM nucleus the kernel spec takes (mm, addmm, bmm)");
  } else {
    c.m = c.nbd ? bmm_batch(&nn->type) * nn->type.shape[c.nbd] : nn->type.shape[0];
    c.n = nn->type.shape[c.nbd + 1];
    vid[nucleus] = evt_kspec_add(s, EVT_V_ACC, -1, -1, EVT_F32, NULL);
    if (node != nucleus) {
      const evt_node *vn = &g->nodes[node];
      /* inputs that are tile values of some kernel: fused members or aux loads, either is fine here */
      for (int k = 0; k < vn->ninputs; k++) {
        int x = vn->inputs[k];
        const evt_node *xn = &g->nodes[x];
        if (x == nucleus || vid[x] >= 0 || evt_op_table[xn->op].cls == EVT_CLASS_SOURCE || xn->op == EVT_OP_RAND ||
            source_view(g, x))
          continue; /* (rand: generated in-kernel, judged as an operand) */
        if (evt_type_numel(&xn->type) != c.m * c.n || (!float_dtype(xn->type.dtype) && xn->type.dtype != EVT_BOOL)) continue;
        char name[24];
        snprintf(name, sizeof name, "p%d", k);
        vid[x] = add_node(&c, x, EVT_V_AUX_LOAD, -1, -1, xn->type.dtype, name, x);
      }
      if ((vn->op == EVT_OP_PERMUTE || vn->op == EVT_OP_TRANSPOSE) && !c.nbd)
        refuse(&c, node, "a permute inside an epilogue (only GEMM operands absorb permutes, as layouts)");
      else member(&c, node);
      /* stores: a tile value leaving the kernel is written with 16-byte aligned rows */
      if (c.bad < 0 && vid[node] >= 0 && (c.n * (int64_t)evt_dtype_size(vn->type.dtype)) % 16)
        refuse(&c, node, "%lld-byte rows are not 16-byte aligned", (long long)(c.n * (int64_t)evt_dtype_size(vn->type.dtype)));
    }
  }
  bool ok = c.bad < 0;
  free(s);
  free(vid);
  free(alias);
  return ok;
}

/* Every f32 tensor becomes `dt`: source types, cast/one_hot targets and mm out_dtype, then types are re-inferred. */
evt_status evt_lower_retype(evt_graph *g, evt_dtype dt) {
  for (int i = 0; i < g->nnodes; i++) {
    evt_node *n = &g->nodes[i];
    bool typed = evt_op_table[n->op].flags & EVT_OPF_TYPED;
    bool has_dtype = (evt_op_table[n->op].attrs >> EVT_ATTR_DTYPE) & 1u;
    if ((typed || has_dtype) && n->attr.dtype == EVT_F32 && (typed ? n->type.dtype == EVT_F32 : true)) n->attr.dtype = dt;
    if (n->op == EVT_OP_CAST && n->attr.dtype == EVT_F32) n->attr.dtype = dt;
    if (n->attr.out_dtype == EVT_F32) n->attr.out_dtype = dt; /* mm's f32 output too (infer drops it as the default) */
    evt_status st = evt_infer_node(g, n, i);
    if (st != EVT_OK) return st;
  }
  return EVT_OK;
}

/* A sum (or mean) over the leading dims of a tensor whose rows are longer than a register-resident row kernel takes:
 * in a row nucleus's group it would be a Σ-over-M row sum, which the long-row kernel has none of (the group would
 * run node by node); on its own it runs as the fallback's column reduction while the nucleus keeps its kernel. */
static bool long_row_sum_over_m(const evt_graph *eg, int nucleus, int member) {
  const evt_node *nn = &eg->nodes[nucleus], *m = &eg->nodes[member];
  if (nn->op != EVT_OP_SOFTMAX && nn->op != EVT_OP_SOFTMAX_BACKWARD && nn->op != EVT_OP_LAYER_NORM &&
      nn->op != EVT_OP_LAYER_NORM_BACKWARD_INPUT)
    return false;
  if (nn->type.rank < 1 || nn->type.shape[nn->type.rank - 1] <= EVT_ROW_MAX_N) return false;
  if ((m->op != EVT_OP_SUM && m->op != EVT_OP_MEAN) || m->ninputs < 1) return false;
  const evt_type *xt = &eg->nodes[m->inputs[0]].type;
  if (xt->rank < 2) return false;
  if (m->attr.dims.n == 0) return true; /* every dim: the M dims too */
  for (int i = 0; i < m->attr.dims.n; i++) {
    int d = (int)(m->attr.dims.v[i] < 0 ? m->attr.dims.v[i] + xt->rank : m->attr.dims.v[i]);
    if (d < xt->rank - 1 && xt->shape[d] > 1) return true;
  }
  return false;
}

bool evt_lower_compat(const evt_pgraph *g, int nucleus, int member) { /* contract in lower.h */
  if (!evt_part_compat_evt(g, nucleus, member)) return false;
  const evt_graph *eg = g->src;
  if (!eg || member == nucleus) return true;
  if (long_row_sum_over_m(eg, nucleus, member)) return false;
  const evt_node *nn = &eg->nodes[nucleus];
  bool bmm = nn->op == EVT_OP_BMM && nn->type.rank >= 3;
  if (nn->op != EVT_OP_MM && nn->op != EVT_OP_ADDMM && !bmm) return true;
  /* a GEMM that cannot lower anyway (operand dtypes, alignment) gains nothing from smaller groups */
  int ai = nn->op == EVT_OP_ADDMM ? 1 : 0, md = bmm ? nn->type.rank - 2 : 0;
  const evt_type *ta = &eg->nodes[nn->inputs[ai]].type, *tb = &eg->nodes[nn->inputs[ai + 1]].type;
  if (ta->dtype != tb->dtype || (ta->dtype != EVT_BF16 && ta->dtype != EVT_F16) || nn->type.shape[md] % 8 ||
      nn->type.shape[md + 1] % 8 || ta->shape[md + 1] % 8)
    return true;
  const evt_node *m = &eg->nodes[member];
  if ((g->nodes[member].flags & EVT_PN_VIEW) && m->ninputs == 1 && evt_pgraph_kernel(g, m->inputs[0]))
    return evt_lower_compat(g, nucleus, m->inputs[0]); /* a view is its producer's tensor */
  return evt_lower_can_fuse(eg, nucleus, member, NULL, 0);
}

evt_status evt_lower_partition(evt_graph *eg, const evt_part_options *opt, double lambda, evt_part_plan *plan) {
  return evt_part_plan_build_compat(eg, opt, lambda, evt_lower_compat, plan);
}

void evt_lower_print(const evt_graph *g, const evt_lower_result *r, FILE *out) {
  static const char *lay[] = {"NN", "NT", "TN"};
  for (int i = 0; i < r->n; i++) {
    const evt_lowered *L = &r->k[i];
    if (L->ok && L->kind == EVT_LK_GEMM_EVT)
      fprintf(out, "group %d %s %s: %%%s %s %s->%s M=%lld N=%lld K=%lld, %d visitor nodes\n", i, evt_lower_kind_name(L->kind),
              L->kernel, g->nodes[L->nucleus].name, lay[L->spec.layout], evt_dtype_name(L->spec.ab_dtype),
              evt_dtype_name(L->spec.d_dtype), (long long)L->m, (long long)L->n, (long long)L->k, L->spec.nnodes);
    if (L->ok && L->kind == EVT_LK_GEMM_EVT && L->spec.batched)
      fprintf(out, "  batched: %d x %d (outer launches x batches per launch), lda %lld ldb %lld ldd %lld, batch strides "
                   "A %lld B %lld D %lld, outer A %lld B %lld D %lld\n",
              L->l_outer, L->l, (long long)L->lda, (long long)L->ldb, (long long)L->ldd, (long long)L->bs_a,
              (long long)L->bs_b, (long long)L->bs_d, (long long)L->os_a, (long long)L->os_b, (long long)L->os_d);
    else if (L->ok)
      fprintf(out, "group %d %s %s: %s%s%s M=%lld N=%lld, %d nodes\n", i, evt_lower_kind_name(L->kind), L->kernel,
              L->nucleus >= 0 ? "%" : "", L->nucleus >= 0 ? g->nodes[L->nucleus].name : "nucleus-free",
              L->nucleus >= 0 ? "" : "", (long long)L->m, (long long)L->n, L->rspec.nnodes);
    else fprintf(out, "group %d %s: %s\n", i, evt_lower_kind_name(L->kind), L->reason);
  }
}
