/* cost.c — the cost of a grouping: bytes through global memory plus lambda per kernel (group).
 * This is exactly the objective the MIP (ilp.c) minimizes and the brute force in the tests enumerates;
 * see partition.h for the definition. A measured kernel-time model can replace it through
 * evt_part_kernel_time_fn (per group), which evt_part_evaluate_model applies: the total is then the sum of
 * the model's time over the groups. (The MIP still optimizes the byte model; a per-group model needs group
 * identity variables the edge formulation does not have — see docs/partition.md.) */
#include "partition/partition.h"

#include <stdlib.h>

static int find(int *p, int x) {
  while (p[x] != x) x = p[x] = p[p[x]];
  return x;
}

/* comp[v]: the connected piece of v's group (union of internal edges); sources -1. */
static void pieces(const evt_pgraph *g, const int *group, int *comp) {
  for (int v = 0; v < g->n; v++) comp[v] = v;
  for (int e = 0; e < g->m; e++) {
    const evt_pedge *ed = &g->edges[e];
    if (!evt_pgraph_kernel(g, ed->u) || group[ed->u] != group[ed->v]) continue;
    int a = find(comp, ed->u), b = find(comp, ed->v);
    if (a != b) comp[b] = a;
  }
  for (int v = 0; v < g->n; v++) comp[v] = evt_pgraph_kernel(g, v) ? find(comp, v) : -1;
}

evt_part_cost evt_part_evaluate(const evt_pgraph *g, const int *group) {
  evt_part_cost c = {0};
  int n = g->n;
  int *comp = malloc((size_t)(n + 1) * sizeof(int)), *stamp = malloc((size_t)(n + 1) * sizeof(int));
  EVT_ASSERT(comp && stamp);
  for (int v = 0; v < n; v++) {
    if (evt_pgraph_kernel(g, v)) EVT_ASSERT(group[v] >= 0 && group[v] < n);
    stamp[v] = -1;
  }
  pieces(g, group, comp);
  for (int v = 0; v < n; v++) {
    const evt_pnode *p = &g->nodes[v];
    if (evt_pgraph_kernel(g, v) && comp[v] == v) c.groups++;
    bool written = evt_pgraph_kernel(g, v) && (p->flags & EVT_PN_OUTPUT);
    for (int k = 0; k < p->nout; k++) {   /* one read per consuming piece other than v's own */
      int w = g->edges[g->out_edges[p->out0 + k]].v;
      if (!evt_pgraph_kernel(g, w) || comp[w] == comp[v] || stamp[comp[w]] == v) continue;
      stamp[comp[w]] = v;
      c.read += p->bytes;
      written = evt_pgraph_kernel(g, v);
    }
    if (written) c.written += p->bytes;
  }
  free(comp);
  free(stamp);
  c.total = c.written + c.read + g->lambda * c.groups;
  return c;
}

double evt_part_evaluate_model(const evt_pgraph *g, const int *group, evt_part_kernel_time_fn fn, void *ctx) {
  int n = g->n;
  /* members of each group in id order: a linked list per group, built backwards */
  int *members = malloc((size_t)(n + 1) * sizeof(int)), *head = malloc((size_t)(n + 1) * sizeof(int));
  int *next = malloc((size_t)(n + 1) * sizeof(int));
  EVT_ASSERT(members && head && next);
  for (int v = 0; v < n; v++) head[v] = -1;
  for (int v = n - 1; v >= 0; v--)
    if (evt_pgraph_kernel(g, v)) next[v] = head[group[v]], head[group[v]] = v;
  double total = 0;
  for (int v = 0; v < n; v++) {
    if (!evt_pgraph_kernel(g, v) || head[group[v]] != v) continue;
    int k = 0;
    for (int w = v; w >= 0; w = next[w]) members[k++] = w;
    total += fn(g, members, k, ctx);
  }
  free(members);
  free(head);
  free(next);
  return total;
}
