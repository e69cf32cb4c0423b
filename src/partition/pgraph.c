/* pgraph.c — building the partitioner's labelled DAG.
 * Contract: edges go from a smaller to a larger id (the evt_graph order); duplicates are merged. After
 * evt_pgraph_finish the CSR arrays in_edges/out_edges list edge ids by node, and every edge has a rule
 * status (rules.c). */
#include "partition/partition.h"

#include <stdlib.h>
#include <string.h>

evt_pgraph *evt_pgraph_new(int n) {
  evt_pgraph *g = calloc(1, sizeof *g);
  EVT_ASSERT(g);
  g->n = n;
  g->nodes = calloc((size_t)(n > 0 ? n : 1), sizeof *g->nodes);
  EVT_ASSERT(g->nodes);
  g->lambda = EVT_PART_LAMBDA_DEFAULT;
  return g;
}

void evt_pgraph_free(evt_pgraph *g) {
  if (!g) return;
  free(g->nodes);
  free(g->edges);
  free(g->in_edges);
  free(g->out_edges);
  free(g->names);
  free(g);
}

void evt_pgraph_add_edge(evt_pgraph *g, int u, int v) {
  EVT_ASSERT(u >= 0 && u < v && v < g->n);
  for (int i = g->m - 1; i >= 0 && i >= g->m - 16; i--)   /* inputs of one node are added together */
    if (g->edges[i].u == u && g->edges[i].v == v) return;
  if (g->m == g->cap_m) {
    g->cap_m = g->cap_m ? 2 * g->cap_m : 64;
    g->edges = realloc(g->edges, (size_t)g->cap_m * sizeof *g->edges);
    EVT_ASSERT(g->edges);
  }
  g->edges[g->m++] = (evt_pedge){u, v, EVT_PE_FREE};
}

void evt_pgraph_finish(evt_pgraph *g) {
  free(g->in_edges);
  free(g->out_edges);
  g->in_edges = malloc((size_t)(g->m + 1) * sizeof(int));
  g->out_edges = malloc((size_t)(g->m + 1) * sizeof(int));
  EVT_ASSERT(g->in_edges && g->out_edges);
  for (int v = 0; v < g->n; v++) g->nodes[v].nin = g->nodes[v].nout = 0;
  for (int e = 0; e < g->m; e++) {
    g->nodes[g->edges[e].v].nin++;
    g->nodes[g->edges[e].u].nout++;
  }
  int a = 0, b = 0;
  for (int v = 0; v < g->n; v++) {
    g->nodes[v].in0 = a;
    g->nodes[v].out0 = b;
    a += g->nodes[v].nin;
    b += g->nodes[v].nout;
    g->nodes[v].nin = g->nodes[v].nout = 0;
  }
  for (int e = 0; e < g->m; e++) {
    evt_pnode *u = &g->nodes[g->edges[e].u], *v = &g->nodes[g->edges[e].v];
    g->in_edges[v->in0 + v->nin++] = e;
    g->out_edges[u->out0 + u->nout++] = e;
  }
  evt_part_derive_rules(g);
}

const char *evt_pgraph_name(const evt_pgraph *g, int v, char *buf, size_t n) {
  if (g->names && g->names[v]) snprintf(buf, n, "%%%s", g->names[v]);
  else snprintf(buf, n, "node %d", v);
  return buf;
}
