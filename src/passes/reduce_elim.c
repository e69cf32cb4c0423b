/* Pass: reduction elimination, with reassociation and common-factor extraction.
 *
 * Contract: requires a well-formed graph (after decomposition); preserves every output value up to
 * floating-point reassociation. It first runs CSE so equal factors have equal ids. Then:
 *
 * 1. For each sum/mean over dims D of a product: linearize the product through mul and neg into a sign and
 *    a list of factors (LLVM-Reassociate style), rank them (one_hot first, then by id) and split them into
 *    outer factors, broadcast along every dim of D (size 1 there, or absent), and inner factors. Then
 *        sum(sign * inner * outer, D) -> sign * outer' * sum(inner, D)
 *    where outer' is outer reshaped to the reduced shape (keepdim=0). Special inner products:
 *        none (all factors outer)                           -> the number of reduced elements (mean: 1)
 *        a single one_hot(t, C) reduced over its class dim  -> 1  (mean: 1/C): exactly one 1 per row, since
 *                                                               one_hot only accepts indices in [0, C).
 * 2. For each add/sub of two products that share factors: A*B + A*C -> A*(B + C) (signs through neg and sub
 *    kept), only when both remainders are non-empty, so the rewrite saves a multiply.
 *
 * 3. Last, a sum/mean that repeats sum(x, D) (same x and dims, keepdim 0) becomes a reshape of it (times 1/count
 *    for a mean): the batch-norm backward's mean(dy) and the bias gradient sum(dy) are one reduction.
 *
 * Together 1 and 2 remove the row reduction from the softmax-cross-entropy backward:
 *   g - sum(g, 1) * softmax(x), g = -(one_hot(t) * w)   ->   w * (softmax(x) - one_hot(t)).
 * Sweeps repeat until nothing changes; ends with a compaction. */
#include "passes/passes.h"

#include <stdlib.h>
#include <string.h>

#define MAX_FACTORS 16

typedef struct product {
  int sign;               /* +1 / -1 */
  int n;
  int f[MAX_FACTORS];     /* node ids */
} product;

/* Linearizes node v (times sign) into p; false if too many factors. */
static bool linearize(const evt_graph *g, int v, int sign, product *p) {
  p->sign = sign;
  p->n = 0;
  int stack[MAX_FACTORS * 2], sp = 0;
  stack[sp++] = v;
  while (sp > 0) {
    int x = stack[--sp];
    const evt_node *n = &g->nodes[x];
    if (n->op == EVT_OP_NEG && evt_dtype_is_float(n->type.dtype)) {
      p->sign = -p->sign;
      stack[sp++] = n->inputs[0];
    } else if (n->op == EVT_OP_MUL && evt_dtype_is_float(n->type.dtype) && sp + 2 <= EVT_ARRAY_LEN(stack)) {
      stack[sp++] = n->inputs[1];
      stack[sp++] = n->inputs[0];
    } else {
      if (p->n == MAX_FACTORS) return false;
      p->f[p->n++] = x;
    }
  }
  return true;
}

static int factor_rank(const evt_graph *g, int id) { return g->nodes[id].op == EVT_OP_ONE_HOT ? -1 : id; }

static int cmp_ctx_rank(const evt_graph *g, int a, int b) {
  int ra = factor_rank(g, a), rb = factor_rank(g, b);
  return ra < rb ? -1 : ra > rb;
}

static void rank_factors(const evt_graph *g, int *f, int n) {
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && cmp_ctx_rank(g, f[j - 1], f[j]) > 0; j--) {
      int t = f[j];
      f[j] = f[j - 1], f[j - 1] = t;
    }
}

/* product of factors f[0..n) (in order); -1 when n == 0 */
static int build_product(evt_graph *g, int at, const int *f, int n) {
  if (n == 0) return -1;
  int acc = f[0];
  for (int i = 1; i < n; i++) acc = evt_rw_binary(g, at, EVT_OP_MUL, acc, f[i]);
  return acc;
}

/* true if factor x (right-aligned against rank r) has size 1 (or is absent) in every dim of red[] */
static bool is_outer(const evt_graph *g, int x, int r, const bool *red) {
  const evt_type *t = &g->nodes[x].type;
  for (int d = 0; d < r; d++) {
    int i = d - (r - t->rank);
    if (red[d] && i >= 0 && t->shape[i] != 1) return false;
  }
  return true;
}

/* rewrites sum/mean node id; returns the replacement or id */
static int reduce(evt_graph *g, int id) {
  const evt_node *s = &g->nodes[id];
  evt_op op = s->op;
  int x = s->inputs[0], keepdim = (int)s->attr.keepdim;
  evt_type out = s->type, tx = g->nodes[x].type;
  int r = tx.rank;
  bool red[EVT_MAX_RANK] = {0};
  int dims[EVT_MAX_RANK], nd = 0;
  if (s->attr.dims.n == 0)
    for (int d = 0; d < r; d++) red[d] = true;
  for (int i = 0; i < s->attr.dims.n; i++) {
    int d = evt_norm_dim(s->attr.dims.v[i], r);
    if (d < 0) return id;
    red[d] = true;
  }
  int64_t count = 1;
  for (int d = 0; d < r; d++)
    if (red[d]) dims[nd++] = d, count *= tx.shape[d];
  if (r == 0 || !evt_dtype_is_float(tx.dtype)) return id;

  product p;
  if (!linearize(g, x, 1, &p) || (p.n == 1 && p.sign == 1 && p.f[0] == x && g->nodes[x].op != EVT_OP_ONE_HOT)) return id;
  int inner[MAX_FACTORS], ni = 0, outer[MAX_FACTORS], no = 0;
  for (int i = 0; i < p.n; i++) {
    if (is_outer(g, p.f[i], r, red)) outer[no++] = p.f[i];
    else inner[ni++] = p.f[i];
  }
  rank_factors(g, inner, ni);
  rank_factors(g, outer, no);
  bool one_hot_rule = false;
  if (ni == 1 && g->nodes[inner[0]].op == EVT_OP_ONE_HOT) {
    const evt_type *to = &g->nodes[inner[0]].type;
    one_hot_rule = nd == 1 && dims[0] == r - 1 && to->rank >= 1 && to->shape[to->rank - 1] == tx.shape[r - 1];
  }
  if (no == 0 && !one_hot_rule) return id;
  if (ni > 0 && !one_hot_rule) { /* D indexes x's dims: the inner product must keep rank r */
    int maxr = 0;
    for (int i = 0; i < ni; i++)
      if (g->nodes[inner[i]].type.rank > maxr) maxr = g->nodes[inner[i]].type.rank;
    if (maxr != r) return id;
  }

  /* the reduced inner product */
  int core = -1; /* -1: the constant `unit` */
  evt_dtype dt = out.dtype;
  double unit = 1.0;
  if (ni == 0) unit = op == EVT_OP_SUM ? (double)count : 1.0;
  else if (one_hot_rule) unit = op == EVT_OP_SUM ? 1.0 : 1.0 / (double)tx.shape[r - 1];
  else core = evt_rw_reduce(g, id, op, build_product(g, id, inner, ni), dims, nd, keepdim);
  if (core < 0 && (unit != 1.0 || no == 0)) core = evt_rw_scalar(g, id, dt, unit);

  /* outer factors, reshaped to the reduced shape when the reduced dims disappear */
  int acc = core;
  for (int i = 0; i < no; i++) {
    int f = outer[i];
    if (!keepdim && g->nodes[f].type.rank > 0) {
      const evt_type *tf = &g->nodes[f].type;
      int64_t shape[EVT_MAX_RANK];
      int k = 0;
      for (int d = 0; d < r; d++) {
        int j = d - (r - tf->rank);
        if (!red[d] && (k > 0 || (j >= 0 && tf->shape[j] != 1))) shape[k++] = j >= 0 ? tf->shape[j] : 1;
      }
      f = evt_rw_reshape(g, id, f, k, shape); /* leading 1s dropped: broadcasting adds them back */
    }
    acc = acc < 0 ? f : evt_rw_binary(g, id, EVT_OP_MUL, acc, f);
  }
  if (p.sign < 0) acc = evt_rw_unary(g, id, EVT_OP_NEG, acc);
  if (acc < 0) return -1;
  if (!evt_type_equal(&g->nodes[acc].type, &out)) {
    if (g->nodes[acc].type.dtype != out.dtype) return id;
    acc = evt_rw_expand(g, id, acc, &out);
  }
  return acc >= 0 && evt_type_equal(&g->nodes[acc].type, &out) ? acc : id;
}

/* A*B +- A*C -> A*(B +- C) at add/sub node id */
static int extract_common(evt_graph *g, int id) {
  const evt_node *n = &g->nodes[id];
  if (!evt_dtype_is_float(n->type.dtype)) return id;
  evt_type out = n->type;
  product p[2];
  if (!linearize(g, n->inputs[0], 1, &p[0]) || !linearize(g, n->inputs[1], n->op == EVT_OP_SUB ? -1 : 1, &p[1])) return id;
  if (p[0].n < 2 || p[1].n < 2) return id;
  int common[MAX_FACTORS], nc = 0;
  bool used[MAX_FACTORS] = {0};
  int rest0[MAX_FACTORS], n0 = 0;
  for (int i = 0; i < p[0].n; i++) {
    int hit = -1;
    for (int j = 0; j < p[1].n && hit < 0; j++)
      if (!used[j] && p[1].f[j] == p[0].f[i]) hit = j;
    if (hit >= 0) used[hit] = true, common[nc++] = p[0].f[i];
    else rest0[n0++] = p[0].f[i];
  }
  int rest1[MAX_FACTORS], n1 = 0;
  for (int j = 0; j < p[1].n; j++)
    if (!used[j]) rest1[n1++] = p[1].f[j];
  if (nc == 0 || n0 == 0 || n1 == 0) return id;
  rank_factors(g, common, nc);
  rank_factors(g, rest0, n0);
  rank_factors(g, rest1, n1);
  int a = build_product(g, id, rest0, n0), b = build_product(g, id, rest1, n1), inner;
  if (p[0].sign > 0 && p[1].sign > 0) inner = evt_rw_binary(g, id, EVT_OP_ADD, a, b);
  else if (p[0].sign > 0) inner = evt_rw_binary(g, id, EVT_OP_SUB, a, b);
  else if (p[1].sign > 0) inner = evt_rw_binary(g, id, EVT_OP_SUB, b, a);
  else inner = evt_rw_unary(g, id, EVT_OP_NEG, evt_rw_binary(g, id, EVT_OP_ADD, a, b));
  int res = evt_rw_binary(g, id, EVT_OP_MUL, build_product(g, id, common, nc), inner);
  if (res < 0) return -1;
  return evt_type_equal(&g->nodes[res].type, &out) ? res : id;
}

/* reduced-dim mask of a sum/mean node (empty dims: all) */
static unsigned reduced_mask(const evt_graph *g, int id) {
  const evt_node *n = &g->nodes[id];
  int r = g->nodes[n->inputs[0]].type.rank;
  if (n->attr.dims.n == 0) return (1u << r) - 1;
  unsigned m = 0;
  for (int i = 0; i < n->attr.dims.n; i++) m |= 1u << evt_norm_dim(n->attr.dims.v[i], r);
  return m;
}

/* sum(x, D, keepdim) / mean(x, D, keepdim) -> reshape(S [* 1/count]) when S = sum(x, D) (keepdim 0) exists:
 * the batch-norm backward's mean(dy) and its bias gradient sum(dy) become one reduction. */
static int share_reduction(evt_graph *g, int id, int n0) {
  const evt_node *r = &g->nodes[id];
  if (r->op == EVT_OP_SUM && !r->attr.keepdim) return id;
  int x = r->inputs[0];
  unsigned mask = reduced_mask(g, id);
  for (int s = 0; s < n0; s++) {
    const evt_node *c = &g->nodes[s];
    if (s == id || c->op != EVT_OP_SUM || c->attr.keepdim || c->inputs[0] != x || reduced_mask(g, s) != mask) continue;
    evt_type out = g->nodes[id].type;
    int v = s;
    if (g->nodes[id].op == EVT_OP_MEAN) {
      int64_t count = evt_type_numel(&g->nodes[x].type) / (evt_type_numel(&out) ? evt_type_numel(&out) : 1);
      v = evt_rw_binary(g, id, EVT_OP_MUL, s, evt_rw_factor(g, id, out.dtype, 1.0 / (double)count));
    }
    return evt_rw_reshape(g, id, v, out.rank, out.shape);
  }
  return id;
}

evt_status evt_pass_reduce_elim(evt_graph *g, evt_pass_stats *st) {
  evt_pass_stats inner = {0};
  evt_status s = evt_pass_cse(g, &inner);
  if (s != EVT_OK) return s;
  st->removed += inner.removed;
  for (int sweep = 0; sweep < 16; sweep++) {
    int changed = 0, n0 = g->nnodes;
    for (int id = 0; id < n0; id++) {
      evt_op op = g->nodes[id].op;
      int r = id;
      if (op == EVT_OP_SUM || op == EVT_OP_MEAN) r = reduce(g, id);
      else if (op == EVT_OP_ADD || op == EVT_OP_SUB) r = extract_common(g, id);
      if (r < 0) return EVT_ERR_INTERNAL;
      if (r == id) continue;
      evt_graph_replace_uses(g, id, r);
      changed++;
    }
    st->rewrites += changed;
    int removed = 0;
    s = evt_graph_compact(g, &removed);
    st->removed += removed;
    if (s != EVT_OK) return s;
    if (changed) continue;
    /* last: reductions that repeat another one (CSE first, so equal inputs have equal ids) */
    s = evt_pass_cse(g, &inner);
    if (s != EVT_OK) return s;
    int n1 = g->nnodes;
    for (int id = 0; id < n1; id++) {
      if (g->nodes[id].op != EVT_OP_SUM && g->nodes[id].op != EVT_OP_MEAN) continue;
      int r = share_reduction(g, id, n1);
      if (r < 0) return EVT_ERR_INTERNAL;
      if (r == id) continue;
      evt_graph_replace_uses(g, id, r);
      st->rewrites++;
    }
    s = evt_graph_compact(g, &removed);
    st->removed += removed;
    return s;
  }
  return EVT_OK;
}
