/* Pass: layout folding and permute propagation (to a fixpoint).
 *
 * Contract: requires a well-formed graph; preserves every output value exactly (only data movement changes).
 * Local rules (local_sweeps, to a fixpoint):
 *   squeeze(x), unsqueeze(x)              -> reshape(x)       (one view op for the chains below)
 *   reshape(reshape(x)), expand(expand(x))-> one reshape / one expand of x
 *   permute(permute(x, p), q)             -> permute(x, p o q);  permute by the identity -> x
 *   reshape / expand to x's own shape     -> x
 *   permute moving only size-1 dims       -> reshape
 *   a chain of <= 4 permutes/reshapes keeping every element at its linear position -> reshape of its root
 *   permute(expand(u)), expand used once  -> expand(permute of u padded to the rank; often a reshape)
 *   permute(reshape(permute(y))), the reshape only adding/removing size-1 dims and used once
 *                                         -> reshape(permute(y)) (the two permutes then fold)
 *   elementwise op whose non-scalar operands are permute(x_i, p), all x_i of one shape, each permute used
 *   only here, plus broadcast operands whose order p does not change (a per-channel bias)
 *                                         -> permute(op(x_1, ..., reshaped broadcasts), p)
 * Permute propagation (propagate_all; the paper's NCHW <-> NHWC cancellation): for a permutation p undone
 * by some permute of a tensor, the region of elementwise ops and sum/mean/amax reachable from such permutes
 * is rebuilt in the p order (dims remapped; per-channel broadcasts reshaped), users outside read a permute
 * back, and the attempt is kept only if, after the local rules, fewer permutes remain (else undone). The
 * permute may read an input: a channels-last activation declared in memory order and permuted
 * to NCHW carries its batch-norm statistics along, mean over N, H, W becoming a sum over the leading dims of
 * the memory order (a Σ over M of the row kernels).
 * Last (the only rules that add permutes):
 *   permute(y) used by several nodes, some of them GEMMs (mm, bmm), y not an input/param
 *                                         -> one copy per GEMM user, so each GEMM absorbs its own copy as an
 *                                            operand layout (the partitioner fuses a permute into one consumer)
 *   mm of fp8 operands whose B is computed and not a permute
 *                                         -> mm(A, permute(permute(B))): the inner permute a K-major copy of B
 *                                            (one per B), the outer the GEMM's layout NT (fp8 GEMMs read K-major)
 * Ends with a compaction. */
#include "passes/passes.h"

#include <stdlib.h>
#include <string.h>

static bool identity(const evt_ilist *p) {
  for (int i = 0; i < p->n; i++)
    if (p->v[i] != i) return false;
  return true;
}

static int permute(evt_graph *g, int at, int x, const evt_ilist *p) {
  if (x < 0) return -1;
  if (identity(p)) return x;
  evt_attrs a = evt_attrs_default;
  a.dims = *p;
  return evt_rw_op(g, at, EVT_OP_PERMUTE, &x, 1, &a, 1ull << EVT_ATTR_DIMS);
}

static bool pure_permute(const int64_t *s, const evt_ilist *p);

/* permute(reshape(permute(y, q)), p) where the reshape only inserts or removes dims of size 1
 * -> reshape(permute(y, q'), ...): the reshape is moved below the permute (p restricted to the dims of size
 * > 1, the size-1 dims of the inner tensor last) so the two permutes meet and fold. */
static int permute_unit_reshape(evt_graph *g, int id) {
  const evt_node *n = &g->nodes[id], *rs = &g->nodes[n->inputs[0]];
  int y = rs->inputs[0];
  const evt_type *ty = &g->nodes[y].type, *tr = &rs->type;
  if (g->nodes[y].op != EVT_OP_PERMUTE) return id;
  int ay[EVT_MAX_RANK], ar[EVT_MAX_RANK], ky = 0, kr = 0; /* the dims of size > 1, in order */
  for (int i = 0; i < ty->rank; i++)
    if (ty->shape[i] != 1) ay[ky++] = i;
  for (int i = 0; i < tr->rank; i++)
    if (tr->shape[i] != 1) ar[kr++] = i;
  if (ky != kr) return id;
  for (int i = 0; i < ky; i++)
    if (ty->shape[ay[i]] != tr->shape[ar[i]]) return id;
  int where[EVT_MAX_RANK]; /* reshape-output dim -> index among the dims of size > 1 */
  for (int i = 0; i < tr->rank; i++) where[i] = -1;
  for (int i = 0; i < kr; i++) where[ar[i]] = i;
  evt_ilist q = {.n = ty->rank};
  int m = 0;
  for (int i = 0; i < n->attr.dims.n; i++)
    if (where[n->attr.dims.v[i]] >= 0) q.v[m++] = ay[where[n->attr.dims.v[i]]];
  for (int i = 0; i < ty->rank; i++)
    if (ty->shape[i] == 1) q.v[m++] = i;
  evt_type t = n->type;
  return evt_rw_reshape(g, id, permute(g, id, y, &q), t.rank, t.shape);
}

/* push permutes below elementwise node id; uses[] counts uses. Also permute(expand(u), p) with the expand
 * used only there -> expand(permute(u', p)), u' = u padded to the rank with leading 1s (the permute moves to
 * the smaller tensor, where it is often a reshape). */
static int push_permute(evt_graph *g, int id, const int *uses, int nuses) {
  const evt_node *n = &g->nodes[id];
  if (n->op == EVT_OP_PERMUTE) {
    int e = n->inputs[0];
    const evt_node *en = &g->nodes[e];
    if (en->op == EVT_OP_RESHAPE && e < nuses && uses[e] == 1) return permute_unit_reshape(g, id);
    if (en->op != EVT_OP_EXPAND || e >= nuses || uses[e] != 1) return id;
    int u = en->inputs[0], r = n->type.rank, pad = r - g->nodes[u].type.rank;
    int64_t s[EVT_MAX_RANK];
    for (int i = 0; i < r; i++) s[i] = i < pad ? 1 : g->nodes[u].type.shape[i - pad];
    evt_ilist p = n->attr.dims;
    evt_type to = n->type;
    return evt_rw_expand(g, id, permute(g, id, evt_rw_reshape(g, id, u, r, s), &p), &to);
  }
  if (!evt_op_is_elementwise(n->op)) return id;
  int ins[EVT_MAX_INPUTS], nin = n->ninputs, found = 0;
  bool other[EVT_MAX_INPUTS] = {0};
  evt_ilist perm = {0};
  const evt_type *shape = NULL;
  for (int k = 0; k < nin; k++) {
    int x = n->inputs[k];
    const evt_node *in = &g->nodes[x];
    ins[k] = x;
    if (in->type.rank == 0) continue;
    const evt_type *ts = in->op == EVT_OP_PERMUTE ? &g->nodes[in->inputs[0]].type : NULL;
    if (x >= nuses || in->op != EVT_OP_PERMUTE || uses[x] != 1 ||
        (found && (perm.n != in->attr.dims.n || memcmp(perm.v, in->attr.dims.v, sizeof(int64_t) * (size_t)perm.n) ||
                   ts->rank != shape->rank || memcmp(ts->shape, shape->shape, sizeof(int64_t) * (size_t)ts->rank)))) {
      other[k] = true;
      continue;
    }
    perm = in->attr.dims;
    shape = ts;
    ins[k] = in->inputs[0];
    found++;
  }
  if (!found) return id;
  /* other operands must be broadcasts whose order the permute does not change (a per-channel bias) */
  int r = n->type.rank;
  evt_ilist inv = {.n = perm.n};
  for (int i = 0; i < perm.n; i++) inv.v[perm.v[i]] = i;
  for (int k = 0; k < nin; k++) {
    if (!other[k]) continue;
    const evt_type *tb = &g->nodes[n->inputs[k]].type;
    if (tb->rank > r || perm.n != r) return id;
    int64_t s[EVT_MAX_RANK];
    for (int i = 0; i < r; i++) s[i] = i < r - tb->rank ? 1 : tb->shape[i - (r - tb->rank)];
    if (!pure_permute(s, &inv)) return id;
  }
  for (int k = 0; k < nin; k++) {
    if (!other[k]) continue;
    const evt_type *tb = &g->nodes[n->inputs[k]].type;
    int64_t s[EVT_MAX_RANK], sp[EVT_MAX_RANK];
    for (int i = 0; i < r; i++) s[i] = i < r - tb->rank ? 1 : tb->shape[i - (r - tb->rank)];
    for (int i = 0; i < r; i++) sp[i] = s[inv.v[i]];
    ins[k] = evt_rw_reshape(g, id, g->nodes[id].inputs[k], r, sp);
  }
  n = &g->nodes[id];
  evt_attrs attrs = n->attr;
  uint64_t given = n->attr_given;
  evt_op op = n->op;
  return permute(g, id, evt_rw_op(g, id, op, ins, nin, &attrs, given), &perm);
}

/* Strides (in elements of the chain's root) of a reshape to ns (rank rn) of a strided view os/ost (rank ro),
 * or false when the reshape cannot be a strided view. The old dims are cut into chunks that are contiguous
 * among themselves (size-1 dims join any chunk); the new dims must cover each chunk exactly, innermost first,
 * and get contiguous strides on top of the chunk's innermost stride. */
static bool reshape_strides(int ro, const int64_t *os, const int64_t *ost, int rn, const int64_t *ns, int64_t *nst) {
  int j = rn - 1;
  int64_t base = ro ? ost[ro - 1] : 1, oprod = 1, nprod = 1;
  for (int i = ro - 1; i >= 0; i--) {
    oprod *= os[i];
    bool chunk_end = i == 0 || (os[i - 1] != 1 && ost[i - 1] != oprod * base);
    if (!chunk_end) continue;
    while (j >= 0 && (nprod < oprod || ns[j] == 1)) {
      nst[j] = nprod * base;
      nprod *= ns[j--];
    }
    if (nprod != oprod) return false;
    if (i > 0) base = ost[i - 1], oprod = nprod = 1;
  }
  for (; j >= 0; j--) {
    if (ns[j] != 1) return false;
    nst[j] = base;
  }
  return true;
}

/* A chain of up to 4 permutes/reshapes (at least one permute) below node id that, composed, keeps every
 * element at its linear position is a reshape of the chain's root (vit's conv in NHWC -> [B,C,HW] ->
 * [B,HW,C] tokens is a reshape of the conv). Decided exactly on strides: the root is viewed through the
 * chain (permutes reorder shape and strides; reshapes recompute strides or give up), and the result must
 * be contiguous. Returns the root, or -1. */
static int identity_chain_root(const evt_graph *g, int id) {
  int chain[4], len = 0, permutes = 0;
  for (int v = id; len < 4; v = g->nodes[v].inputs[0]) {
    const evt_node *n = &g->nodes[v];
    if (n->op != EVT_OP_PERMUTE && n->op != EVT_OP_RESHAPE) break;
    chain[len++] = v;
  }
  for (int l = 1; l <= len; l++) {
    permutes += g->nodes[chain[l - 1]].op == EVT_OP_PERMUTE;
    if (l < 2 || !permutes) continue;
    int root = g->nodes[chain[l - 1]].inputs[0];
    const evt_type *tr = &g->nodes[root].type;
    int rank = tr->rank;
    int64_t shape[EVT_MAX_RANK], st[EVT_MAX_RANK], numel = 1;
    for (int d = rank - 1; d >= 0; d--) shape[d] = tr->shape[d], st[d] = numel, numel *= tr->shape[d];
    if (numel == 0) return -1;
    bool ok = true;
    for (int k = l - 1; k >= 0 && ok; k--) {
      const evt_node *n = &g->nodes[chain[k]];
      int64_t s2[EVT_MAX_RANK], st2[EVT_MAX_RANK];
      if (n->op == EVT_OP_PERMUTE) {
        for (int d = 0; d < n->type.rank; d++) s2[d] = shape[n->attr.dims.v[d]], st2[d] = st[n->attr.dims.v[d]];
      } else {
        ok = reshape_strides(rank, shape, st, n->type.rank, n->type.shape, st2);
        for (int d = 0; d < n->type.rank; d++) s2[d] = n->type.shape[d];
      }
      rank = n->type.rank;
      memcpy(shape, s2, sizeof(int64_t) * (size_t)rank);
      memcpy(st, st2, sizeof(int64_t) * (size_t)rank);
    }
    int64_t want = 1;
    for (int d = rank - 1; d >= 0 && ok; d--) {
      if (shape[d] != 1 && st[d] != want) ok = false;
      want *= shape[d];
    }
    if (ok) return root;
  }
  return -1;
}

static int fold(evt_graph *g, int id) {
  const evt_node *n = &g->nodes[id];
  if (n->ninputs == 0) return id;
  int x = n->inputs[0];
  const evt_node *in = &g->nodes[x];
  evt_type t = n->type;
  switch (n->op) {
  case EVT_OP_SQUEEZE:
  case EVT_OP_UNSQUEEZE:
    return evt_rw_reshape(g, id, x, t.rank, t.shape);
  case EVT_OP_RESHAPE: {
    if (in->op == EVT_OP_RESHAPE || in->op == EVT_OP_SQUEEZE || in->op == EVT_OP_UNSQUEEZE)
      return evt_rw_reshape(g, id, in->inputs[0], t.rank, t.shape);
    if (evt_type_equal(&t, &in->type)) return x;
    int root = identity_chain_root(g, id);
    return root >= 0 ? evt_rw_reshape(g, id, root, t.rank, t.shape) : id;
  }
  case EVT_OP_EXPAND:
    if (in->op == EVT_OP_EXPAND) return evt_rw_expand(g, id, in->inputs[0], &t);
    return evt_type_equal(&t, &in->type) ? x : id;
  case EVT_OP_PERMUTE: {
    if (identity(&n->attr.dims)) return x;
    if (pure_permute(in->type.shape, &n->attr.dims)) return evt_rw_reshape(g, id, x, t.rank, t.shape);
    int root = identity_chain_root(g, id);
    if (root >= 0) return evt_rw_reshape(g, id, root, t.rank, t.shape);
    if (in->op != EVT_OP_PERMUTE || in->attr.dims.n != n->attr.dims.n) return id;
    evt_ilist q = n->attr.dims;
    for (int i = 0; i < q.n; i++) q.v[i] = in->attr.dims.v[n->attr.dims.v[i]];
    return permute(g, id, in->inputs[0], &q);
  }
  default:
    return id;
  }
}

/* ---- permute propagation across the graph ---------------------------------------------------------- */

/* True if permuting a tensor of shape s (rank r) by p moves no two dims of size > 1 past each other: the
 * permute is then a reshape (the data order does not change). */
static bool pure_permute(const int64_t *s, const evt_ilist *p) {
  int64_t last = -1;
  for (int i = 0; i < p->n; i++) {
    if (s[p->v[i]] == 1) continue;
    if (p->v[i] < last) return false;
    last = p->v[i];
  }
  return true;
}

static bool is_reduction(evt_op op) { return op == EVT_OP_SUM || op == EVT_OP_MEAN || op == EVT_OP_AMAX; }

/* State of one propagation attempt for the permutation p (rank r); arrays indexed by node ids < n0. */
typedef struct prop {
  evt_graph *g;
  int n0, r;
  evt_ilist p, inv;
  int *pv;       /* pv[v]: a node computing permute(v, p), or -1 */
  int *lift;     /* lift[u]: permute(u, p) (or the reshape it is) built or found for a node u outside S */
  int *absorbed; /* absorbed[v]: the same value as v read from the permuted input (keepdim=0 reductions) */
  char *seed;    /* seed[v]: v = permute(x, inverse(p)) of a computed x, pv[v] = x */
  bool strict;   /* an elementwise op joins only if every operand of its own shape is already permuted */
  int new_permutes;
} prop;

/* u in the permuted order, for an operand of a node in S: broadcast operands of lower rank are padded with
 * leading 1s first (numpy broadcasting), so a per-channel [C,1,1] becomes [1,1,1,C]. */
static int lifted(prop *P, int u, int at) {
  evt_graph *g = P->g;
  if (P->pv[u] >= 0) return P->pv[u];
  const evt_type *t = &g->nodes[u].type;
  if (t->rank == 0) return u;
  if (P->lift[u] >= 0) return P->lift[u];
  int64_t s[EVT_MAX_RANK], ps[EVT_MAX_RANK];
  int pad = P->r - t->rank;
  for (int i = 0; i < P->r; i++) s[i] = i < pad ? 1 : t->shape[i - pad];
  for (int i = 0; i < P->r; i++) ps[i] = s[P->p.v[i]];
  int res;
  if (pure_permute(s, &P->p)) {
    res = evt_rw_reshape(g, at, u, P->r, ps);
  } else {
    res = permute(g, at, evt_rw_reshape(g, at, u, P->r, s), &P->p);
    P->new_permutes++;
  }
  P->lift[u] = res;
  return res;
}

/* Decides and builds the permuted form of node v (pv[v]) or its absorbed replacement, in id order. */
static int prop_node(prop *P, int v) {
  evt_graph *g = P->g;
  const evt_node *n = &g->nodes[v];
  int r = P->r;
  if (P->seed[v]) {
    if (P->pv[n->inputs[0]] < 0) {
      P->pv[v] = n->inputs[0];
      return 0;
    }
    P->seed[v] = 0; /* p is an involution and v permutes a node of S: v is a permute user, it cancels */
  }
  if (is_reduction(n->op)) {
    int u = n->inputs[0];
    if (P->pv[u] < 0 || g->nodes[u].type.rank != r) return 0;
    bool red[EVT_MAX_RANK] = {0};
    for (int i = 0; i < n->attr.dims.n; i++) {
      int d = evt_norm_dim(n->attr.dims.v[i], r);
      if (d < 0) return 0;
      red[d] = true;
    }
    if (n->attr.dims.n == 0)
      for (int d = 0; d < r; d++) red[d] = true;
    int dims[EVT_MAX_RANK], nd = 0;
    for (int i = 0; i < r; i++)
      if (red[P->p.v[i]]) dims[nd++] = i; /* dim i of the permuted tensor is dim p[i] of u */
    if (n->attr.keepdim) {
      P->pv[v] = evt_rw_reduce(g, v, n->op, P->pv[u], dims, nd, 1);
      return P->pv[v] < 0 ? -1 : 0;
    }
    /* keepdim=0: the kept dims must stay in their order, then the result is v itself */
    int last = -1;
    for (int i = 0; i < r; i++) {
      if (red[P->p.v[i]]) continue;
      if (P->p.v[i] < last) return 0;
      last = (int)P->p.v[i];
    }
    P->absorbed[v] = evt_rw_reduce(g, v, n->op, P->pv[u], dims, nd, 0);
    return P->absorbed[v] < 0 ? -1 : 0;
  }
  if (!evt_op_is_elementwise(n->op) || n->type.rank != r) return 0;
  bool full = false;
  for (int k = 0; k < n->ninputs; k++) {
    const evt_type *t = &g->nodes[n->inputs[k]].type;
    if (t->rank > r) return 0;
    bool own = t->rank == r && !memcmp(t->shape, n->type.shape, sizeof(int64_t) * (size_t)r);
    if (own && P->strict && P->pv[n->inputs[k]] < 0) return 0;
    full = full || (own && P->pv[n->inputs[k]] >= 0);
  }
  if (!full) return 0; /* follow the activations: some operand of v's own shape is already permuted */
  int ins[EVT_MAX_INPUTS];
  for (int k = 0; k < n->ninputs; k++) ins[k] = lifted(P, g->nodes[v].inputs[k], v);
  n = &g->nodes[v];
  evt_attrs attrs = n->attr;
  P->pv[v] = evt_rw_op(g, v, n->op, ins, n->ninputs, &attrs, n->attr_given);
  return P->pv[v] < 0 ? -1 : 0;
}

/* One attempt: builds the permuted forms and rewires the graph (the caller measures the result and may undo
 * it). Returns 1 if something moved, 0 if not, -1 on a builder failure. */
static int propagate(evt_graph *g, const evt_ilist *p, bool strict) {
  int n0 = g->nnodes, res = 0;
  prop P = {.g = g, .n0 = n0, .r = p->n, .p = *p, .inv = *p, .strict = strict};
  for (int i = 0; i < p->n; i++) P.inv.v[p->v[i]] = i;
  size_t sz = (size_t)(n0 ? n0 : 1);
  P.pv = malloc(sizeof(int) * sz), P.lift = malloc(sizeof(int) * sz), P.absorbed = malloc(sizeof(int) * sz);
  P.seed = calloc(sz, 1);
  int *uses = malloc(sizeof(int) * sz);
  if (!P.pv || !P.lift || !P.absorbed || !P.seed || !uses) evt_fatal(__FILE__, __LINE__, "out of memory");
  for (int i = 0; i < n0; i++) P.pv[i] = P.lift[i] = P.absorbed[i] = -1;
  evt_graph_count_uses(g, uses);
  for (int i = 0; i < n0; i++) {
    const evt_node *n = &g->nodes[i];
    if (n->op != EVT_OP_PERMUTE || n->attr.dims.n != p->n) continue;
    int x = n->inputs[0];
    if (!memcmp(n->attr.dims.v, P.inv.v, sizeof(int64_t) * (size_t)p->n)) P.seed[i] = 1;
    if (!memcmp(n->attr.dims.v, p->v, sizeof(int64_t) * (size_t)p->n) && P.lift[x] < 0) P.lift[x] = i; /* reuse */
  }
  int moved = 0;
  for (int v = 0; v < n0 && res == 0; v++) {
    res = prop_node(&P, v);
    moved += (P.pv[v] >= 0 && !P.seed[v]) || P.absorbed[v] >= 0;
  }
  if (res < 0 || !moved) goto done;

  /* seeds all of whose users moved go away: their names move to what they permuted (below) */
  for (int v = 0; v < n0; v++) {
    if (!P.seed[v] || (g->nodes[v].flags & EVT_NODE_OUTPUT) || !uses[v]) continue;
    bool all_moved = true;
    for (int w = v + 1; w < n0 && all_moved; w++)
      for (int k = 0; k < g->nodes[w].ninputs; k++)
        if (g->nodes[w].inputs[k] == v) all_moved = all_moved && ((P.pv[w] >= 0 && !P.seed[w]) || P.absorbed[w] >= 0);
    if (all_moved) P.seed[v] = 2;
  }

  for (int v = 0; v < n0 && res == 0; v++) {
    if (P.absorbed[v] >= 0) {
      evt_graph_replace_uses(g, v, P.absorbed[v]);
      continue;
    }
    evt_node *x = P.seed[v] == 2 ? &g->nodes[P.pv[v]] : NULL;
    if (x && (x->flags & EVT_NODE_FRESH_NAME) && !(g->nodes[v].flags & EVT_NODE_FRESH_NAME)) {
      const char *name = x->name; /* a seed that goes away leaves its name (%b0.c1.conv) to what it permuted */
      x->name = g->nodes[v].name;
      g->nodes[v].name = name;
      x->flags &= ~(unsigned)EVT_NODE_FRESH_NAME;
      g->nodes[v].flags |= EVT_NODE_FRESH_NAME;
    }
    if (P.pv[v] < 0 || P.seed[v]) continue;
    int back = permute(g, v, P.pv[v], &P.inv);
    if (back < 0) {
      res = -1;
      break;
    }
    const char *name = g->nodes[v].name;
    evt_graph_replace_uses(g, v, back);
    evt_node *b = &g->nodes[back], *pn = &g->nodes[P.pv[v]];
    if (b->name == name && !(b->flags & EVT_NODE_OUTPUT) && (pn->flags & EVT_NODE_FRESH_NAME)) {
      /* the permuted node carries v's name; the permute back gets a fresh one */
      b->name = pn->name;
      pn->name = name;
      pn->flags &= ~(unsigned)EVT_NODE_FRESH_NAME;
      b->flags |= EVT_NODE_FRESH_NAME;
    }
  }
  if (res == 0) res = 1;
done:
  free(P.pv), free(P.lift), free(P.absorbed), free(P.seed), free(uses);
  return res;
}

static int count_permutes(const evt_graph *g) {
  int c = 0;
  for (int i = 0; i < g->nnodes; i++) c += g->nodes[i].op == EVT_OP_PERMUTE;
  return c;
}

static evt_status local_sweeps(evt_graph *g, evt_pass_stats *st);

/* Tries propagation once for each permutation that some permute of a computed tensor undoes. Each attempt is
 * measured: the rewired graph is folded (local_sweeps) and kept only if fewer permutes remain; otherwise
 * the node array, outputs and loss saved before the attempt come back (compaction never shrinks the
 * array's capacity, and names stay valid in the arena). Returns the number of kept attempts, -1 on failure. */
static int propagate_all(evt_graph *g, evt_pass_stats *st) {
  evt_ilist tried[8];
  int ntried = 0, done = 0;
  for (int i = 0; i < g->nnodes && ntried < 8; i++) {
    const evt_node *n = &g->nodes[i];
    if (n->op != EVT_OP_PERMUTE || identity(&n->attr.dims)) continue;
    evt_ilist p = n->attr.dims;
    for (int k = 0; k < p.n; k++) p.v[n->attr.dims.v[k]] = k; /* p = inverse(dims) */
    bool seen = false;
    for (int t = 0; t < ntried && !seen; t++)
      seen = tried[t].n == p.n && !memcmp(tried[t].v, p.v, sizeof(int64_t) * (size_t)p.n);
    if (seen) continue;
    tried[ntried++] = p;
  }
  for (int t = 0; t < 2 * ntried; t++) { /* each permutation: the whole forward region, then a strict one */
    int n0 = g->nnodes, no = g->noutputs, loss = g->loss, before = count_permutes(g);
    evt_node *nodes = malloc(sizeof(evt_node) * (size_t)(n0 ? n0 : 1));
    int *outs = malloc(sizeof(int) * (size_t)(no ? no : 1));
    if (!nodes || !outs) evt_fatal(__FILE__, __LINE__, "out of memory");
    memcpy(nodes, g->nodes, sizeof(evt_node) * (size_t)n0);
    memcpy(outs, g->outputs, sizeof(int) * (size_t)no);
    evt_pass_stats trial = *st;
    int r = propagate(g, &tried[t / 2], t % 2 == 1);
    evt_status s = r > 0 ? local_sweeps(g, &trial) : EVT_OK;
    if (r < 0 || s != EVT_OK) {
      free(nodes), free(outs);
      return -1;
    }
    if (r > 0 && count_permutes(g) < before) {
      *st = trial;
      done++;
    } else if (r > 0) {
      EVT_ASSERT(g->cap >= n0);
      memcpy(g->nodes, nodes, sizeof(evt_node) * (size_t)n0);
      g->nnodes = n0;
      evt_graph_drop_uses(g);   /* the restored inputs are not in the index */
      memcpy(g->outputs, outs, sizeof(int) * (size_t)no);
      g->noutputs = no;
      g->loss = loss;
    } else {
      g->nnodes = n0; /* nothing rewired: drop what the attempt appended */
      evt_graph_drop_uses(g);
    }
    free(nodes), free(outs);
  }
  return done;
}

static bool is_gemm(evt_op op) { return op == EVT_OP_MM || op == EVT_OP_BMM; }

/* A permute of a computed tensor with several users, some of them GEMMs, gets one copy per GEMM user (the
 * first GEMM keeps the original when only GEMMs use it), so each GEMM can take its copy as an operand
 * layout: the partitioner fuses a permute only into a single consumer. Permutes of inputs/params are
 * sources for the partitioner and stay shared. Returns the number of copies made, -1 on failure. */
static int duplicate_gemm_permutes(evt_graph *g) {
  int n0 = g->nnodes, made = 0;
  int *uses = malloc(sizeof(int) * (size_t)(n0 ? n0 : 1)), *gemms = calloc((size_t)(n0 ? n0 : 1), sizeof(int));
  if (!uses || !gemms) evt_fatal(__FILE__, __LINE__, "out of memory");
  evt_graph_count_uses(g, uses);
  for (int i = 0; i < n0; i++)
    if (is_gemm(g->nodes[i].op))
      for (int k = 0; k < g->nodes[i].ninputs; k++) gemms[g->nodes[i].inputs[k]]++;
  for (int u = 0; u < n0 && made >= 0; u++) {
    const evt_node *gu = &g->nodes[u];
    if (!is_gemm(gu->op)) continue;
    for (int k = 0; k < gu->ninputs && made >= 0; k++) {
      int p = g->nodes[u].inputs[k];
      const evt_node *pn = &g->nodes[p];
      evt_op src = g->nodes[pn->inputs[0]].op;
      if (pn->op != EVT_OP_PERMUTE || uses[p] < 2 || src == EVT_OP_INPUT || src == EVT_OP_PARAM) continue;
      if (gemms[p] == uses[p] && gemms[p] > 0) { /* only GEMMs: this one keeps the original */
        gemms[p] = -1;
        continue;
      }
      evt_ilist perm = pn->attr.dims;
      int copy = permute(g, p, pn->inputs[0], &perm);
      if (copy < 0) {
        made = -1;
        break;
      }
      g->nodes[u].inputs[k] = copy;
      evt_graph_note_use(g, u, copy);
      uses[p]--, gemms[p]--;
      made++;
    }
  }
  free(uses);
  free(gemms);
  return made;
}

static bool fp8_mm(const evt_graph *g, const evt_node *n) {
  return n->op == EVT_OP_MM && evt_dtype_is_fp8(g->nodes[n->inputs[0]].type.dtype) &&
         evt_dtype_is_fp8(g->nodes[n->inputs[1]].type.dtype);
}

/* An mm of fp8 operands reads both K-major (Hopper's 8-bit wgmma, layout NT). Its B, when not a permute and
 * computed (not an input / param), is read through permute(copy), copy = permute(B): a K-major copy, one per
 * tensor, shared by the GEMMs that read it. A permuted A is left as it is: the partitioner materializes it
 * (partition/rules.c). Returns the number of copies made, -1 on failure. */
static int fp8_kmajor_copies(evt_graph *g) {
  int n0 = g->nnodes, made = 0;
  int *copy = malloc(sizeof(int) * (size_t)(n0 ? n0 : 1));
  if (!copy) evt_fatal(__FILE__, __LINE__, "out of memory");
  for (int i = 0; i < n0; i++) copy[i] = -1;
  evt_ilist t = {.n = 2, .v = {1, 0}};
  for (int u = 0; u < n0 && made >= 0; u++) {
    int b = g->nodes[u].inputs[1];
    evt_op op = g->nodes[b].op;
    if (!fp8_mm(g, &g->nodes[u]) || op == EVT_OP_PERMUTE || op == EVT_OP_INPUT || op == EVT_OP_PARAM) continue;
    if (copy[b] < 0) copy[b] = permute(g, b, b, &t), made++;
    int view = permute(g, u, copy[b], &t);
    if (copy[b] < 0 || view < 0) made = -1;
    else g->nodes[u].inputs[1] = view, evt_graph_note_use(g, u, view);
  }
  free(copy);
  return made;
}

/* A permute that no longer has users (it folded away) leaves its name to the node it permuted when that
 * one was made by a pass (so %b0.c2.conv names the channels-last convolution once its permutes cancel). */
static void inherit_names(evt_graph *g) {
  int n = g->nnodes, sp = 0;
  int *stack = malloc(sizeof(int) * (size_t)(n ? n : 1));
  char *live = calloc((size_t)(n ? n : 1), 1);
  if (!stack || !live) evt_fatal(__FILE__, __LINE__, "out of memory");
  for (int i = 0; i < g->noutputs; i++)
    if (!live[g->outputs[i]]) live[g->outputs[i]] = 1, stack[sp++] = g->outputs[i];
  while (sp > 0) { /* ids are not in topological order in the middle of a pass */
    const evt_node *x = &g->nodes[stack[--sp]];
    for (int k = 0; k < x->ninputs; k++)
      if (!live[x->inputs[k]]) live[x->inputs[k]] = 1, stack[sp++] = x->inputs[k];
  }
  for (int i = 0; i < n; i++) {
    evt_node *p = &g->nodes[i];
    if (p->op != EVT_OP_PERMUTE || live[i] || (p->flags & (EVT_NODE_FRESH_NAME | EVT_NODE_OUTPUT))) continue;
    evt_node *x = &g->nodes[p->inputs[0]];
    if (!live[p->inputs[0]] || !(x->flags & EVT_NODE_FRESH_NAME) || (x->flags & EVT_NODE_OUTPUT)) continue;
    const char *name = x->name;
    x->name = p->name;
    p->name = name;
    x->flags &= ~(unsigned)EVT_NODE_FRESH_NAME;
    p->flags |= EVT_NODE_FRESH_NAME;
  }
  free(stack);
  free(live);
}

/* The local rules (fold, push_permute) over every node, to a fixpoint, each sweep ending with a compaction. */
static evt_status local_sweeps(evt_graph *g, evt_pass_stats *st) {
  for (int sweep = 0; sweep < 32; sweep++) {
    int changed = 0, n0 = g->nnodes;
    int *uses = malloc(sizeof(int) * (size_t)(n0 ? n0 : 1));
    if (!uses) evt_fatal(__FILE__, __LINE__, "out of memory");
    evt_graph_count_uses(g, uses);
    for (int id = 0; id < n0; id++) {
      int r = fold(g, id);
      if (r == id) r = push_permute(g, id, uses, n0);
      if (r < 0) {
        free(uses);
        return EVT_ERR_INTERNAL;
      }
      if (r == id) continue;
      evt_graph_replace_uses(g, id, r);
      changed++;
    }
    free(uses);
    st->rewrites += changed;
    inherit_names(g);
    int removed = 0;
    evt_status s = evt_graph_compact(g, &removed);
    st->removed += removed;
    if (s != EVT_OK || !changed) return s;
  }
  return EVT_OK;
}

evt_status evt_pass_layout(evt_graph *g, evt_pass_stats *st) {
  evt_status s = local_sweeps(g, st);
  for (int round = 0; round < 8 && s == EVT_OK; round++) { /* each kept round removes permutes */
    int moved = propagate_all(g, st);
    if (moved < 0) return EVT_ERR_INTERNAL;
    if (!moved) break;
  }
  if (s != EVT_OK) return s;
  int copies = duplicate_gemm_permutes(g), fp8 = copies < 0 ? -1 : fp8_kmajor_copies(g);
  if (fp8 < 0) return EVT_ERR_INTERNAL;
  st->rewrites += copies + fp8;
  return evt_graph_compact(g, NULL);
}
