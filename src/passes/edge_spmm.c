/* Pass: message passing over an edge list as a sparse-dense product.
 *
 * Contract: requires a compact graph in its final form for gathers and scatters (after CSE); preserves every
 * output up to floating-point rounding (the products are no longer rounded to the dtype one by one).
 * The scatter-add of gathered, edge-weighted rows (torch_geometric's propagate, `index_add_(0, dst, x[src] * w)`)
 *
 *   index_select_backward([cast] mul(index_select(x [K,F], src [E], dim=0), w [E,1] or expand of it), dst [E],
 *                         dim=0, shape=[n,F])                (no mul: unweighted)
 *
 * is A x with A [n, K], A[dst[e], src[e]] += w[e]: evt's spmm once the edges are sorted by dst. It becomes
 *
 *   P = coo_perm(dst, rows=n)
 *   spmm(coo_rowptr(dst, rows=n), index_select(src, P, 0), index_select(w, P, 0) (unweighted: ones), x)
 *
 * with x and the values cast to the wider of the product's and the scatter's dtypes (spmm's operands share one
 * dtype; a narrowing cast of the product then rounds the sums, not every product) and the indices to i64.
 * coo_perm is stable, so every output row sums its edges in increasing e, index_select_backward's order. The
 * gather, the product and the cast must have no other reader (else the graph is left as it is: they would be
 * computed anyway). The backward of a GCN layer has the same pattern with src and dst swapped. Nodes this pass
 * makes are shared when equal (one coo_perm per dst for all layers and both directions' uses), since CSE ran. */
#include "passes/passes.h"

#include <stdlib.h>

#define A(U) (1ull << EVT_ATTR_##U)

/* One matched scatter: out[n, F] = sum over e of w[e] * x[src[e]] into row dst[e]. */
typedef struct edge_match {
  int scatter, x, src, dst, w; /* w: [E,1] weights, -1 when unweighted */
  evt_dtype dt;                /* spmm's dtype: the wider of the product's and the scatter's */
} edge_match;

/* id if it is an op node with exactly one reader, else -1. */
static int only_use(const evt_graph *g, const int *uses, int id, evt_op op) {
  return g->nodes[id].op == op && uses[id] == 1 ? id : -1;
}

/* The gather index_select(x [K,F], src, dim=0) behind id, with one reader; -1 if none. */
static int row_gather(const evt_graph *g, const int *uses, int id) {
  if (only_use(g, uses, id, EVT_OP_INDEX_SELECT) < 0 || g->nodes[id].attr.dim != 0) return -1;
  return g->nodes[g->nodes[id].inputs[0]].type.rank == 2 ? id : -1;
}

/* w if it is a per-edge weight [E,1] of a gathered [E,F] product (looking through an expand to [E,F]); else -1. */
static int edge_weight(const evt_graph *g, int w, int64_t E) {
  if (g->nodes[w].op == EVT_OP_EXPAND) w = g->nodes[w].inputs[0];
  const evt_type *t = &g->nodes[w].type;
  return t->rank == 2 && t->shape[0] == E && t->shape[1] == 1 && evt_dtype_is_float(t->dtype) ? w : -1;
}

/* Fills m for the scatter node s when it has the pattern of the top comment. */
static bool match_scatter(const evt_graph *g, const int *uses, int s, edge_match *m) {
  const evt_node *n = &g->nodes[s];
  if (n->op != EVT_OP_INDEX_SELECT_BACKWARD || n->attr.dim != 0 || n->type.rank != 2) return false;
  if (!evt_dtype_is_float(n->type.dtype)) return false;
  int p = n->inputs[0], gather = -1;
  if (only_use(g, uses, p, EVT_OP_CAST) >= 0) p = g->nodes[p].inputs[0];
  int64_t E = g->nodes[p].type.rank == 2 ? g->nodes[p].type.shape[0] : -1;
  m->w = -1;
  if (only_use(g, uses, p, EVT_OP_MUL) >= 0) {
    const evt_node *mul = &g->nodes[p];
    for (int k = 0; k < 2 && gather < 0; k++) {
      int gk = row_gather(g, uses, mul->inputs[k]), wk = edge_weight(g, mul->inputs[1 - k], E);
      if (gk >= 0 && wk >= 0 && evt_type_equal(&g->nodes[gk].type, &mul->type)) gather = gk, m->w = wk;
    }
  } else {
    gather = row_gather(g, uses, p);
  }
  if (gather < 0) return false;
  evt_dtype pd = g->nodes[p].type.dtype;
  m->dt = evt_dtype_size(pd) > evt_dtype_size(n->type.dtype) ? pd : n->type.dtype;
  m->scatter = s;
  m->x = g->nodes[gather].inputs[0];
  m->src = g->nodes[gather].inputs[1];
  m->dst = n->inputs[1];
  return true;
}

/* id, or an equal node this pass made before it (ids from `first` on): the pass's own CSE. */
static int shared(const evt_graph *g, int first, int id) {
  if (id < 0) return -1;
  for (int j = first; j < id; j++)
    if (evt_node_same_value(g, j, id)) return j;
  return id;
}

static int coo_op(evt_graph *g, int first, int at, evt_op op, int key, int64_t rows) {
  evt_attrs a = evt_attrs_default;
  a.rows = rows;
  return shared(g, first, evt_rw_op(g, at, op, &key, 1, &a, A(ROWS)));
}

/* v [E] in edge order, permuted into dst order: index_select(v, perm, 0). */
static int permuted(evt_graph *g, int first, int at, int v, int perm) {
  evt_attrs a = evt_attrs_default;
  a.dim = 0;
  int in[2] = {v, perm};
  return shared(g, first, evt_rw_op(g, at, EVT_OP_INDEX_SELECT, in, 2, &a, A(DIM)));
}

/* The spmm replacing m->scatter, cast to its dtype (the id; -1 on a builder failure, message on the graph). */
static int build_spmm(evt_graph *g, int first, const edge_match *m) {
  const int at = m->scatter;
  const evt_dtype dt = m->dt;
  const int64_t rows = g->nodes[at].type.shape[0], E = g->nodes[m->dst].type.shape[0];
  const evt_dtype out = g->nodes[at].type.dtype; /* (copies: adding nodes may move g->nodes) */
  int perm = coo_op(g, first, at, EVT_OP_COO_PERM, m->dst, rows);
  int rowptr = coo_op(g, first, at, EVT_OP_COO_ROWPTR, m->dst, rows);
  int col = permuted(g, first, at, shared(g, first, evt_rw_cast(g, at, m->src, EVT_I64)), perm);
  int val;
  if (m->w >= 0) {
    int w = shared(g, first, evt_rw_reshape(g, at, m->w, 1, &E));
    val = permuted(g, first, at, shared(g, first, evt_rw_cast(g, at, w, dt)), perm);
  } else {
    val = shared(g, first, evt_rw_full(g, at, &(evt_type){.dtype = dt, .rank = 1, .shape = {E}}, 1.0));
  }
  int in[4] = {rowptr, col, val, shared(g, first, evt_rw_cast(g, at, m->x, dt))};
  return evt_rw_cast(g, at, evt_rw_op(g, at, EVT_OP_SPMM, in, 4, NULL, 0), out);
}

evt_status evt_pass_edge_spmm(evt_graph *g, evt_pass_stats *st) {
  int n0 = g->nnodes;
  int *uses = calloc((size_t)(n0 ? n0 : 1), sizeof *uses);
  if (!uses) evt_fatal(__FILE__, __LINE__, "out of memory");
  evt_graph_count_uses(g, uses);
  for (int s = 0; s < n0; s++) {
    edge_match m;
    if (!match_scatter(g, uses, s, &m)) continue;
    int y = build_spmm(g, n0, &m);
    if (y < 0) {
      free(uses);
      return EVT_ERR_INTERNAL;
    }
    evt_graph_replace_uses(g, s, y);
    st->rewrites++;
  }
  free(uses);
  return evt_graph_compact(g, &st->removed);
}
