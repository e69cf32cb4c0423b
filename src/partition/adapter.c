/* adapter.c — an evt_graph as the partitioner's labelled DAG (same node ids).
 * Roles come from rules.c. Nodes that only rearrange sources (a view or a permute whose inputs are all
 * sources) become sources too: reading a parameter transposed is an operand layout, not a kernel. rand is
 * a source of 0 bytes (counter-based: every kernel that reads it regenerates it). Edge bytes are the
 * producer's numel x dtype size; the label is (op, dtype, shape). */
#include "partition/partition.h"

#include <stdlib.h>

static uint64_t mix(uint64_t h, uint64_t x) {
  h ^= x + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h * 0xff51afd7ed558ccdull;
}

evt_pgraph *evt_part_from_graph(const evt_graph *eg, double lambda) {
  int n = eg->nnodes;
  evt_pgraph *g = evt_pgraph_new(n);
  g->lambda = lambda;
  g->src = eg;
  g->compat = evt_part_compat_evt;
  g->names = calloc((size_t)n + 1, sizeof(char *));
  EVT_ASSERT(g->names);
  for (int v = 0; v < n; v++) {
    const evt_node *nd = &eg->nodes[v];
    evt_pnode *p = &g->nodes[v];
    g->names[v] = nd->name;
    p->flags = evt_part_op_flags(eg, v);
    if ((p->flags & (EVT_PN_VIEW | EVT_PN_OPERAND)) && nd->ninputs > 0) {
      bool all_src = true;
      for (int k = 0; k < nd->ninputs; k++)
        if (!(g->nodes[nd->inputs[k]].flags & EVT_PN_SOURCE)) all_src = false;
      if (all_src) p->flags = EVT_PN_SOURCE;
    }
    if (nd->flags & EVT_NODE_OUTPUT) p->flags |= EVT_PN_OUTPUT;
    p->bytes = nd->op == EVT_OP_RAND ? 0 : (double)evt_type_numel(&nd->type) * (double)evt_dtype_size(nd->type.dtype);
    uint64_t h = mix((uint64_t)nd->op, (uint64_t)nd->type.dtype);
    for (int i = 0; i < nd->type.rank; i++) h = mix(h, (uint64_t)nd->type.shape[i]);
    p->label = mix(h, (uint64_t)nd->type.rank);
    for (int k = 0; k < nd->ninputs; k++) evt_pgraph_add_edge(g, nd->inputs[k], v);
  }
  evt_pgraph_finish(g);
  return g;
}
