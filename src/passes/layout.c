/* Pass: layout folding and permute propagation (to a fixpoint).
 *
 * Contract: requires a well-formed graph; preserves every output value exactly (only data movement changes).
 * Rules:
 *   squeeze(x), unsqueeze(x)              -> reshape(x)       (one view op for the chains below)
 *   reshape(reshape(x)), expand(expand(x))-> one reshape / one expand of x
 *   permute(permute(x, p), q)             -> permute(x, p o q);  permute by the identity -> x
 *   reshape / expand to x's own shape     -> x
 *   elementwise op whose every non-scalar operand is permute(x_i, p), all x_i of one shape, each permute
 *   used only here                        -> permute(op(x_1, ...), p)
 * Pushing permutes down through elementwise chains makes NCHW -> NHWC -> NCHW pairs meet and cancel,
 * without ever adding nodes. Last (the only rule that adds nodes):
 *   permute(y) used by several nodes, some of them GEMMs (mm, bmm), y not an input/param
 *                                         -> one copy per GEMM user, so each GEMM absorbs its own copy as an
 *                                            operand layout (the partitioner fuses a permute into one consumer)
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

/* push permutes below elementwise node id; uses[] counts uses */
static int push_permute(evt_graph *g, int id, const int *uses, int nuses) {
  const evt_node *n = &g->nodes[id];
  if (!evt_op_is_elementwise(n->op)) return id;
  int ins[EVT_MAX_INPUTS], nin = n->ninputs, found = 0;
  evt_ilist perm = {0};
  const evt_type *shape = NULL;
  for (int k = 0; k < nin; k++) {
    int x = n->inputs[k];
    const evt_node *in = &g->nodes[x];
    ins[k] = x;
    if (in->type.rank == 0) continue;
    if (x >= nuses || in->op != EVT_OP_PERMUTE || uses[x] != 1) return id;
    const evt_type *ts = &g->nodes[in->inputs[0]].type;
    if (found && (perm.n != in->attr.dims.n || memcmp(perm.v, in->attr.dims.v, sizeof(int64_t) * (size_t)perm.n) ||
                  ts->rank != shape->rank || memcmp(ts->shape, shape->shape, sizeof(int64_t) * (size_t)ts->rank)))
      return id;
    perm = in->attr.dims;
    shape = ts;
    ins[k] = in->inputs[0];
    found++;
  }
  if (!found) return id;
  evt_attrs attrs = n->attr;
  uint64_t given = n->attr_given;
  evt_op op = n->op;
  return permute(g, id, evt_rw_op(g, id, op, ins, nin, &attrs, given), &perm);
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
  case EVT_OP_RESHAPE:
    if (in->op == EVT_OP_RESHAPE || in->op == EVT_OP_SQUEEZE || in->op == EVT_OP_UNSQUEEZE)
      return evt_rw_reshape(g, id, in->inputs[0], t.rank, t.shape);
    return evt_type_equal(&t, &in->type) ? x : id;
  case EVT_OP_EXPAND:
    if (in->op == EVT_OP_EXPAND) return evt_rw_expand(g, id, in->inputs[0], &t);
    return evt_type_equal(&t, &in->type) ? x : id;
  case EVT_OP_PERMUTE: {
    if (identity(&n->attr.dims)) return x;
    if (in->op != EVT_OP_PERMUTE || in->attr.dims.n != n->attr.dims.n) return id;
    evt_ilist q = n->attr.dims;
    for (int i = 0; i < q.n; i++) q.v[i] = in->attr.dims.v[n->attr.dims.v[i]];
    return permute(g, id, in->inputs[0], &q);
  }
  default:
    return id;
  }
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
      uses[p]--, gemms[p]--;
      made++;
    }
  }
  free(uses);
  free(gemms);
  return made;
}

evt_status evt_pass_layout(evt_graph *g, evt_pass_stats *st) {
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
    int removed = 0;
    evt_status s = evt_graph_compact(g, &removed);
    st->removed += removed;
    if (s != EVT_OK) return s;
    if (!changed) break;
  }
  int copies = duplicate_gemm_permutes(g);
  if (copies < 0) return EVT_ERR_INTERNAL;
  st->rewrites += copies;
  return evt_graph_compact(g, NULL);
}
