/* cost.c — the cost of a grouping: bytes through global memory plus lambda per kernel start.
 * This is exactly the objective the MIP (ilp.c) minimizes and the brute force in the tests enumerates;
 * see partition.h for the definition. A measured kernel-time model can replace it through
 * evt_part_kernel_time_fn (per group), which evt_part_evaluate_model applies: the total is then the sum of
 * the model's time over the groups. (The MIP still optimizes the byte model; a per-group model needs group
 * identity variables the edge formulation does not have — see docs/partition.md.) */
#include "partition/partition.h"

#include <stdlib.h>

evt_part_cost evt_part_evaluate(const evt_pgraph *g, const int *group) {
  evt_part_cost c = {0};
  unsigned char *seen = calloc((size_t)g->n + 1, 1);
  EVT_ASSERT(seen);
  for (int v = 0; v < g->n; v++) {
    if (!evt_pgraph_kernel(g, v)) continue;
    const evt_pnode *p = &g->nodes[v];
    EVT_ASSERT(group[v] >= 0 && group[v] < g->n);
    if (!seen[group[v]]) seen[group[v]] = 1, c.groups++;
    bool written = p->flags & EVT_PN_OUTPUT, start = true;
    for (int k = 0; k < p->nout; k++) {
      int w = g->edges[g->out_edges[p->out0 + k]].v;
      if (evt_pgraph_kernel(g, w) && group[w] != group[v]) written = true;
    }
    for (int k = 0; k < p->nin; k++) {
      const evt_pedge *e = &g->edges[g->in_edges[p->in0 + k]];
      if (!evt_pgraph_kernel(g, e->u)) c.read += g->nodes[e->u].bytes;
      else if (group[e->u] != group[v]) c.read += g->nodes[e->u].bytes;
      else start = false;
    }
    if (written) c.written += p->bytes;
    if (start) c.starts++;
  }
  free(seen);
  c.total = c.written + c.read + g->lambda * c.starts;
  return c;
}

double evt_part_evaluate_model(const evt_pgraph *g, const int *group, evt_part_kernel_time_fn fn, void *ctx) {
  int n = g->n;
  int *members = malloc((size_t)(n + 1) * sizeof(int));
  unsigned char *done = calloc((size_t)n + 1, 1);
  EVT_ASSERT(members && done);
  double total = 0;
  for (int v = 0; v < n; v++) {
    if (!evt_pgraph_kernel(g, v) || done[group[v]]) continue;
    int k = 0;
    for (int w = v; w < n; w++)
      if (evt_pgraph_kernel(g, w) && group[w] == group[v]) members[k++] = w;
    done[group[v]] = 1;
    total += fn(g, members, k, ctx);
  }
  free(members);
  free(done);
  return total;
}
