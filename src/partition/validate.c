/* validate.c — the final check of every grouping the partitioner returns.
 * A grouping is valid when every kernel node has a group, CUT edges join different groups, FUSE edges
 * stay inside one, a group holds at most one nucleus and only members the compat hook accepts for it,
 * and the *contracted* graph is acyclic. Convexity of each group is not enough (two convex groups can
 * have edges both ways), so acyclicity is checked by a topological sort of the contracted graph. A
 * failure is an internal error with a message naming the rule and the nodes. */
#include "partition/partition.h"

#include <stdlib.h>
#include <string.h>

/* A binary min-heap of group indices keyed by key[]. */
static void heap_push(int *h, int *n, const int *key, int x) {
  int i = (*n)++;
  while (i > 0 && key[h[(i - 1) / 2]] > key[x]) h[i] = h[(i - 1) / 2], i = (i - 1) / 2;
  h[i] = x;
}

static int heap_pop(int *h, int *n, const int *key) {
  int top = h[0], x = h[--*n], i = 0;
  for (;;) {
    int c = 2 * i + 1;
    if (c >= *n) break;
    if (c + 1 < *n && key[h[c + 1]] < key[h[c]]) c++;
    if (key[h[c]] >= key[x]) break;
    h[i] = h[c], i = c;
  }
  if (*n > 0) h[i] = x;
  return top;
}

int evt_part_normalize(const evt_pgraph *g, int *group) {
  int n = g->n, k = 0;
  int *dense = malloc((size_t)(n + 1) * sizeof(int)), *indeg = calloc((size_t)n + 1, sizeof(int));
  int *order = malloc((size_t)(n + 1) * sizeof(int)), *newid = malloc((size_t)(n + 1) * sizeof(int));
  int *first = malloc((size_t)(n + 1) * sizeof(int)), *head = malloc((size_t)(n + 1) * sizeof(int));
  int *next = malloc((size_t)(n + 1) * sizeof(int));
  EVT_ASSERT(dense && indeg && order && newid && first && head && next);
  for (int i = 0; i < n; i++) dense[i] = -1;
  for (int v = 0; v < n; v++) {
    if (!evt_pgraph_kernel(g, v)) continue;
    EVT_ASSERT(group[v] >= 0 && group[v] < n);
    if (dense[group[v]] < 0) first[k] = v, dense[group[v]] = k++;
  }
  /* contracted edges, counted with multiplicity; members listed per group */
  for (int i = 0; i < k; i++) head[i] = -1;
  for (int v = n - 1; v >= 0; v--)
    if (evt_pgraph_kernel(g, v)) next[v] = head[dense[group[v]]], head[dense[group[v]]] = v;
  for (int e = 0; e < g->m; e++) {
    const evt_pedge *ed = &g->edges[e];
    if (!evt_pgraph_kernel(g, ed->u)) continue;
    int a = dense[group[ed->u]], b = dense[group[ed->v]];
    if (a != b) indeg[b]++;
  }
  /* Kahn; ready groups taken in order of their first node (deterministic), from a min-heap */
  int done = 0, nready = 0;
  int *ready = malloc((size_t)(k + 1) * sizeof(int));
  EVT_ASSERT(ready);
  for (int i = 0; i < k; i++)
    if (indeg[i] == 0) heap_push(ready, &nready, first, i);
  while (nready > 0) {
    int gi = heap_pop(ready, &nready, first);
    newid[gi] = done;
    order[done++] = gi;
    for (int v = head[gi]; v >= 0; v = next[v]) {
      const evt_pnode *p = &g->nodes[v];
      for (int j = 0; j < p->nout; j++) {
        int w = g->edges[g->out_edges[p->out0 + j]].v;
        int b = dense[group[w]];
        if (b != gi && --indeg[b] == 0) heap_push(ready, &nready, first, b);
      }
    }
  }
  int result = done == k ? k : -1;
  if (result >= 0)
    for (int v = 0; v < n; v++) group[v] = evt_pgraph_kernel(g, v) ? newid[dense[group[v]]] : -1;
  free(dense); free(indeg); free(order); free(newid); free(first); free(head); free(next); free(ready);
  return result;
}

static evt_status fail(evt_pgraph *g, const char *fmt, int a, int b) {
  char na[128], nb[128];
  evt_pgraph_name(g, a, na, sizeof na);
  if (b >= 0) evt_pgraph_name(g, b, nb, sizeof nb);
  char msg[256];
  snprintf(msg, sizeof msg, fmt, na, b >= 0 ? nb : "");
  snprintf(g->error, sizeof g->error, "internal error: invalid partition: %s", msg);
  return EVT_ERR_INTERNAL;
}

evt_status evt_part_validate(evt_pgraph *g, const int *group) {
  int n = g->n;
  for (int v = 0; v < n; v++)
    if (evt_pgraph_kernel(g, v) && (group[v] < 0 || group[v] >= n)) return fail(g, "%s has no group%s", v, -1);
  for (int e = 0; e < g->m; e++) {
    const evt_pedge *ed = &g->edges[e];
    if (ed->status == EVT_PE_CUT && group[ed->u] == group[ed->v])
      return fail(g, "edge %s -> %s must cross groups", ed->u, ed->v);
    if (ed->status == EVT_PE_FUSE && group[ed->u] != group[ed->v])
      return fail(g, "edge %s -> %s must stay inside one group", ed->u, ed->v);
  }
  int *nuc = malloc((size_t)(n + 1) * sizeof(int));
  EVT_ASSERT(nuc);
  for (int i = 0; i < n; i++) nuc[i] = -1;
  evt_status st = EVT_OK;
  for (int v = 0; v < n && st == EVT_OK; v++) {
    if (!evt_pgraph_kernel(g, v) || !(g->nodes[v].flags & EVT_PN_NUCLEUS)) continue;
    if (nuc[group[v]] >= 0) st = fail(g, "nuclei %s and %s share a group", nuc[group[v]], v);
    nuc[group[v]] = v;
  }
  for (int v = 0; v < n && st == EVT_OK; v++)
    if (evt_pgraph_kernel(g, v) && nuc[group[v]] >= 0 && !evt_part_pair_ok(g, nuc[group[v]], v))
      st = fail(g, "%s cannot be fused into the epilogue of nucleus %s", v, nuc[group[v]]);
  free(nuc);
  if (st != EVT_OK) return st;
  int *tmp = malloc((size_t)(n + 1) * sizeof(int));
  EVT_ASSERT(tmp);
  memcpy(tmp, group, (size_t)n * sizeof(int));
  int k = evt_part_normalize(g, tmp);
  free(tmp);
  if (k < 0) {
    snprintf(g->error, sizeof g->error, "internal error: invalid partition: the contracted graph has a cycle");
    return EVT_ERR_INTERNAL;
  }
  return EVT_OK;
}
