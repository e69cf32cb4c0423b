/* Pass: split widening casts for the row nuclei that read them (runs last, after CSE and DCE).
 *
 * Contract: requires a well-formed graph; preserves every output value exactly (a cast is duplicated, nothing
 * is computed differently). A widening cast of a 16-bit tensor to f32 (exact) that a row nucleus (softmax,
 * layer_norm, softmax_backward, layer_norm_backward_input) reads as an M x N input, and that other nodes read
 * too, gets a copy of its own for each such nucleus: the partitioner fuses a cast with a single reader into
 * the nucleus's load (rules.c: CONVERT), so the kernel reads the 16-bit tensor and no f32 copy is written for
 * it. CSE merged the copies autocast and the decompositions made (bert's layer-norm backward: one cast of
 * the bf16 dy read by the nucleus, by the weight gradient's product and by the bias gradient's sum); this
 * undoes that for the nuclei only. Ends with a compaction. */
#include "passes/passes.h"

#include <stdlib.h>

static bool widening_cast(const evt_graph *g, int x) {
  const evt_node *n = &g->nodes[x];
  if (n->op != EVT_OP_CAST || n->ninputs != 1 || n->type.dtype != EVT_F32 || (n->flags & EVT_NODE_OUTPUT)) return false;
  evt_dtype from = g->nodes[n->inputs[0]].type.dtype;
  return from == EVT_BF16 || from == EVT_F16;
}

static int row_inputs(evt_op op) {
  switch (op) {
  case EVT_OP_SOFTMAX: case EVT_OP_LAYER_NORM: return 1;
  case EVT_OP_SOFTMAX_BACKWARD: case EVT_OP_LAYER_NORM_BACKWARD_INPUT: return 2;
  default: return 0;
  }
}

evt_status evt_pass_split_casts(evt_graph *g, evt_pass_stats *st) {
  int n = g->nnodes, *readers = calloc((size_t)n + 1, sizeof(int));
  EVT_ASSERT(readers);
  for (int v = 0; v < n; v++)
    for (int k = 0; k < g->nodes[v].ninputs; k++) readers[g->nodes[v].inputs[k]]++;
  int split = 0;
  for (int v = 0; v < n; v++) {
    int mn = row_inputs(g->nodes[v].op);
    for (int k = 0; k < mn && k < g->nodes[v].ninputs; k++) {
      int c = g->nodes[v].inputs[k];
      if (!widening_cast(g, c) || readers[c] < 2) continue;
      int copy = evt_rw_cast(g, v, g->nodes[c].inputs[0], EVT_F32);
      if (copy < 0) continue;
      g->nodes[v].inputs[k] = copy; /* (node arrays may have moved: index again) */
      evt_graph_note_use(g, v, copy);
      readers[c]--;
      split++;
    }
  }
  free(readers);
  if (st) st->rewrites += split;
  return split ? evt_graph_compact(g, st ? &st->removed : NULL) : EVT_OK;
}
