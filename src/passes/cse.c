/* Pass: common-subexpression elimination (global value numbering over the whole DAG).
 *
 * Contract: requires a well-formed (compact) graph; preserves every output value exactly.
 * Two nodes are the same value when they have the same op, attributes, type and inputs (after the inputs
 * themselves were merged). Commutative binary ops (F_COMM: add, mul, maximum, minimum, eq, ne) are keyed
 * with their operands sorted, and are rewritten to that order. Inputs and params are never merged; `rand`
 * and `dropout` are (the same seed and offset give the same numbers). The later duplicate is replaced by the
 * earlier node; compaction then drops it. */
#include "passes/passes.h"

#include <stdlib.h>
#include <string.h>

static uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h * 0xff51afd7ed558ccdull;
}

static uint64_t node_hash(const evt_node *n) {
  uint64_t h = mix(0, (uint64_t)n->op);
  for (int i = 0; i < n->ninputs; i++) h = mix(h, (uint64_t)n->inputs[i]);
  h = mix(h, (uint64_t)n->type.dtype);
  for (int i = 0; i < n->type.rank; i++) h = mix(h, (uint64_t)n->type.shape[i]);
  uint64_t mask = evt_op_table[n->op].attrs;
  for (int a = 0; a < EVT_ATTR_COUNT; a++) {
    if (!(mask & (1ull << a))) continue;
    const evt_attr_info *ai = &evt_attr_table[a];
    const char *p = (const char *)&n->attr + ai->offset;
    if (ai->kind == EVT_AK_LIST) {
      const evt_ilist *l = (const evt_ilist *)p;
      h = mix(h, (uint64_t)l->n);
      for (int i = 0; i < l->n; i++) h = mix(h, (uint64_t)l->v[i]);
    } else {
      uint64_t v;
      memcpy(&v, p, 8);
      h = mix(h, v);
    }
  }
  return h;
}

evt_status evt_pass_cse(evt_graph *g, evt_pass_stats *st) {
  int n = g->nnodes;
  int cap = 16;
  while (cap < 2 * n) cap *= 2;
  int *table = malloc(sizeof(int) * (size_t)cap), *rep = malloc(sizeof(int) * (size_t)n);
  if (!table || !rep) evt_fatal(__FILE__, __LINE__, "out of memory");
  for (int i = 0; i < cap; i++) table[i] = -1;
  for (int id = 0; id < n; id++) {
    evt_node *x = &g->nodes[id];
    rep[id] = id;
    for (int k = 0; k < x->ninputs; k++)
      if (rep[x->inputs[k]] != x->inputs[k]) x->inputs[k] = rep[x->inputs[k]], evt_graph_note_use(g, id, x->inputs[k]);
    if ((evt_op_table[x->op].flags & EVT_OPF_COMM) && x->ninputs == 2 && x->inputs[0] > x->inputs[1]) {
      int t = x->inputs[0];
      x->inputs[0] = x->inputs[1], x->inputs[1] = t;
    }
    if (x->op == EVT_OP_INPUT || x->op == EVT_OP_PARAM) continue;
    uint64_t h = node_hash(x);
    int slot = (int)(h & (uint64_t)(cap - 1));
    for (;;) {
      int other = table[slot];
      if (other < 0) {
        table[slot] = id;
        break;
      }
      if (evt_node_same_value(g, other, id)) {
        rep[id] = other;
        st->rewrites++;
        break;
      }
      slot = (slot + 1) & (cap - 1);
    }
  }
  /* outputs (and the names they carry) move to the kept node */
  for (int id = 0; id < n; id++)
    if (rep[id] != id) evt_graph_replace_uses(g, id, rep[id]);
  free(table);
  free(rep);
  return evt_graph_compact(g, &st->removed);
}
