/* DAG → tree for epilogue visitor specs (contract in kspec.h, evt_vtree_build).
 *
 * CUTLASS evaluates an epilogue as a tree rooted at D: Sm90EVT<node, children...>. A spec is a DAG with
 * possibly several sinks (D plus side stores). Two rewrites make it a tree:
 *
 * 1. Store threading. A store (aux store, row/col sum) passes its input through unchanged. A store s of
 *    x that nobody reads becomes part of x's chain: every other user of x reads s instead (and D = s if
 *    D was x). Several stores of one x chain up in id order. A store whose input does not reach D (a side
 *    output, e.g. the GELU derivative saved beside the activation) is tied into D's tree by a new node
 *    D' = keep(D, s) appended to the copy: keep returns D and only makes CUTLASS visit s (and its stores).
 *    EVT_ERR_UNSUPPORTED only when the spec has no room for that node.
 * 2. Shared subexpressions. If some node still has several users, the region from the shared nodes to
 *    their common post-dominator R (all nodes that descend from a shared node and reach R) becomes one
 *    Sm90TopologicalVisitor rooted at R: the region's nodes are bare ops in it, and each input that
 *    enters the region from outside is a whole subtree op. Outside inputs are plain trees: a node with
 *    a shared ancestor is in the region by construction. One region per kernel, not one per shared node:
 *    simpler and always valid, at the cost of keeping more fragments in registers in big DAGs.
 *
 * Ids never change; nodes that do not reach D (dead computes, unused loads) are left out of the tree.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "codegen/kspec.h"
#include "ir/ir.h"

static evt_status tree_fail(char *err, size_t errlen, evt_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (err && errlen) vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return st;
}

static void mark_live(const evt_kspec *s, int v, int *live) {
  if (live[v]) return;
  live[v] = 1;
  for (int j = 0; j < evt_vop_arity(s->nodes[v].op); j++) mark_live(s, s->nodes[v].in[j], live);
}

static void compute_live(evt_vtree *t) {
  memset(t->live, 0, sizeof t->live);
  mark_live(&t->spec, t->spec.d_node, t->live);
  memset(t->nusers, 0, sizeof t->nusers);
  for (int v = 0; v < t->spec.nnodes; v++)
    if (t->live[v])
      for (int j = 0; j < evt_vop_arity(t->spec.nodes[v].op); j++) t->nusers[t->spec.nodes[v].in[j]]++;
}

/* Post-order DFS from D: a topological order of the live nodes (inputs first). */
static void topo_visit(const evt_kspec *s, int v, int *seen, int *order, int *n) {
  if (seen[v]) return;
  seen[v] = 1;
  for (int j = 0; j < evt_vop_arity(s->nodes[v].op); j++) topo_visit(s, s->nodes[v].in[j], seen, order, n);
  order[(*n)++] = v;
}

static int popcount32(uint32_t x) {
  int c = 0;
  for (; x; x &= x - 1) c++;
  return c;
}

evt_status evt_vtree_build(const evt_kspec *s, evt_vtree *t, char *err, size_t errlen) {
  evt_status st = evt_kspec_check(s, err, errlen);
  if (st != EVT_OK) return st;
  memset(t, 0, sizeof *t);
  t->spec = *s;
  t->topo_root = -1;
  evt_kspec *ts = &t->spec;

  /* 1. store threading */
  for (int sidx = 0; sidx < ts->nnodes; sidx++) {
    compute_live(t);
    if (evt_vop_class(ts->nodes[sidx].op) != 'S' || t->live[sidx]) continue;
    int x = ts->nodes[sidx].in[0];
    if (!t->live[x]) {
      int k = evt_kspec_add(ts, EVT_V_KEEP, ts->d_node, sidx, EVT_F32, NULL);
      if (k < 0)
        return tree_fail(err, errlen, EVT_ERR_UNSUPPORTED,
                         "kernel spec: node %d (%s %s) stores a value that D does not depend on, and tying it into "
                         "D's tree needs more than %d visitor nodes",
                         sidx, evt_vop_name(ts->nodes[sidx].op), ts->nodes[sidx].name, EVT_KSPEC_MAX_NODES);
      ts->d_node = k;
      continue;
    }
    for (int u = 0; u < ts->nnodes; u++) {
      if (u == sidx || !t->live[u]) continue;
      for (int j = 0; j < evt_vop_arity(ts->nodes[u].op); j++)
        if (ts->nodes[u].in[j] == x) ts->nodes[u].in[j] = sidx;
    }
    if (ts->d_node == x) ts->d_node = sidx;
  }
  compute_live(t);

  /* 2. shared subexpressions → one topological-visitor region */
  int order[EVT_KSPEC_MAX_NODES], n = 0, seen[EVT_KSPEC_MAX_NODES] = {0};
  topo_visit(ts, ts->d_node, seen, order, &n);
  uint32_t shared = 0;
  for (int i = 0; i < n; i++)
    if (t->nusers[order[i]] > 1) shared |= 1u << order[i];
  if (!shared) return EVT_OK;

  uint32_t pdom[EVT_KSPEC_MAX_NODES] = {0};
  for (int i = n - 1; i >= 0; i--) { /* users come later in `order` */
    int v = order[i];
    uint32_t acc = ~0u;
    int any = 0;
    for (int k = i + 1; k < n; k++) {
      int u = order[k];
      for (int j = 0; j < evt_vop_arity(ts->nodes[u].op); j++)
        if (ts->nodes[u].in[j] == v) {
          acc &= pdom[u];
          any = 1;
        }
    }
    pdom[v] = (any ? acc : 0) | (1u << v);
  }
  uint32_t common = ~0u;
  for (int v = 0; v < ts->nnodes; v++)
    if (shared >> v & 1) common &= pdom[v] & ~(1u << v);
  EVT_ASSERT(common & (1u << ts->d_node));
  int root = -1;
  for (int v = 0; v < ts->nnodes; v++)
    if ((common >> v & 1) && (root < 0 || popcount32(pdom[v]) > popcount32(pdom[root]))) root = v;
  t->topo_root = root;

  /* region = descendants of shared nodes ∩ ancestors of root */
  uint32_t desc = shared;
  for (int i = 0; i < n; i++) {
    int v = order[i];
    for (int j = 0; j < evt_vop_arity(ts->nodes[v].op); j++)
      if (desc >> ts->nodes[v].in[j] & 1) desc |= 1u << v;
  }
  int anc[EVT_KSPEC_MAX_NODES] = {0};
  mark_live(ts, root, anc);
  for (int v = 0; v < ts->nnodes; v++) t->in_region[v] = (desc >> v & 1) && anc[v];
  return EVT_OK;
}
