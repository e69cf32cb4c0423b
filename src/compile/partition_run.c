/* exec.c — run a partitioned graph on the CPU interpreter, group by group.
 * Sources (inputs and params from the caller; constants, rand and views of sources computed first) stay
 * alive for the whole run. Groups run in number order (a topological order of the contracted graph);
 * inside a group, members run in id order with evt_interp_node. At the end of a group every member
 * tensor that no later group reads and that is not an output is freed, and every boundary tensor whose
 * last consuming group has run is freed: between groups only tensors crossing group boundaries live.
 * Reading a value that is not alive is an internal error (a broken schedule), never a silent result. */
#include "partition/partition.h"
#include "runtime/interp/interp.h"

#include <stdlib.h>
#include <string.h>

static bool caller_slot(const evt_node *n) { return n->op == EVT_OP_INPUT || n->op == EVT_OP_PARAM; }

evt_status evt_part_exec(evt_graph *eg, const evt_part_plan *plan, evt_tensor *values, unsigned flags, int *peak_live) {
  int n = eg->nnodes, k = plan->ngroups;
  int *last = malloc((size_t)(n + 1) * sizeof(int)), *first = malloc((size_t)(k + 1) * sizeof(int));
  int *next = malloc((size_t)(n + 1) * sizeof(int)), *tail = malloc((size_t)(k + 1) * sizeof(int));
  EVT_ASSERT(last && first && next && tail);
  for (int v = 0; v < n; v++) last[v] = -1;
  for (int v = 0; v < n; v++)
    for (int j = 0; j < eg->nodes[v].ninputs; j++) {
      int u = eg->nodes[v].inputs[j], gv = plan->group[v];
      if (gv > last[u]) last[u] = gv;
    }
  for (int i = 0; i < k; i++) first[i] = tail[i] = -1;
  for (int v = 0; v < n; v++) {   /* members of each group in id order */
    int gi = plan->group[v];
    next[v] = -1;
    if (gi < 0) continue;
    if (tail[gi] < 0) first[gi] = v;
    else next[tail[gi]] = v;
    tail[gi] = v;
  }
  evt_status st = EVT_OK;
  int peak = 0;
  for (int v = 0; v < n && st == EVT_OK; v++) {   /* sources */
    const evt_node *nd = &eg->nodes[v];
    if (plan->group[v] >= 0 || caller_slot(nd)) continue;
    const evt_tensor *ins[EVT_MAX_INPUTS];
    for (int j = 0; j < nd->ninputs; j++) ins[j] = &values[nd->inputs[j]];
    evt_tensor_free(&values[v]);
    st = evt_interp_node(eg, v, ins, &values[v], flags);
  }
  for (int gi = 0; gi < k && st == EVT_OK; gi++) {
    for (int v = first[gi]; v >= 0 && st == EVT_OK; v = next[v]) {
      const evt_node *nd = &eg->nodes[v];
      const evt_tensor *ins[EVT_MAX_INPUTS];
      for (int j = 0; j < nd->ninputs; j++) {
        ins[j] = &values[nd->inputs[j]];
        if (!ins[j]->data) {
          st = evt_graph_errorf(eg, v, EVT_ERR_INTERNAL, "partitioned run: input %%%s is not alive in group %d",
                                eg->nodes[nd->inputs[j]].name, gi);
          break;
        }
      }
      if (st != EVT_OK) break;
      evt_tensor_free(&values[v]);
      st = evt_interp_node(eg, v, ins, &values[v], flags);
    }
    if (st != EVT_OK) break;
    int live = 0;
    for (int v = 0; v < n; v++) {
      if (plan->group[v] < 0 || plan->group[v] > gi || !values[v].data) continue;
      if (!(eg->nodes[v].flags & EVT_NODE_OUTPUT) && last[v] <= gi) evt_tensor_free(&values[v]);
      else live++;
    }
    if (live > peak) peak = live;
  }
  for (int v = 0; v < n; v++) {
    const evt_node *nd = &eg->nodes[v];
    if (caller_slot(nd)) continue;
    if (st != EVT_OK || (plan->group[v] < 0 && !(nd->flags & EVT_NODE_OUTPUT))) evt_tensor_free(&values[v]);
  }
  if (peak_live) *peak_live = peak;
  free(last); free(first); free(next); free(tail);
  return st;
}
