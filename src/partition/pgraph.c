/* pgraph.c — building the partitioner's labelled DAG and its reachability bitsets.
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

static void bits_alloc(evt_bits *b, int n) {
  b->n = n;
  b->words = (n + 63) / 64;
  if (b->words == 0) b->words = 1;
  b->w = calloc((size_t)n * (size_t)b->words + 1, sizeof(uint64_t));
  EVT_ASSERT(b->w);
}

void evt_bits_free(evt_bits *b) {
  free(b->w);
  b->w = NULL;
}

void evt_pgraph_reach(const evt_pgraph *g, evt_bits *desc, evt_bits *anc) {
  if (desc) {
    bits_alloc(desc, g->n);
    for (int u = g->n - 1; u >= 0; u--) {
      uint64_t *r = evt_bits_row(desc, u);
      const evt_pnode *p = &g->nodes[u];
      for (int k = 0; k < p->nout; k++) {
        int v = g->edges[g->out_edges[p->out0 + k]].v;
        const uint64_t *rv = evt_bits_row(desc, v);
        for (int w = 0; w < desc->words; w++) r[w] |= rv[w];
        r[v >> 6] |= 1ull << (v & 63);
      }
    }
  }
  if (anc) {
    bits_alloc(anc, g->n);
    for (int v = 0; v < g->n; v++) {
      uint64_t *r = evt_bits_row(anc, v);
      const evt_pnode *p = &g->nodes[v];
      for (int k = 0; k < p->nin; k++) {
        int u = g->edges[g->in_edges[p->in0 + k]].u;
        const uint64_t *ru = evt_bits_row(anc, u);
        for (int w = 0; w < anc->words; w++) r[w] |= ru[w];
        r[u >> 6] |= 1ull << (u & 63);
      }
    }
  }
}
