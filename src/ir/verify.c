/* The graph verifier: a full re-check of a graph that passes may have rewritten.
 *
 * evt_graph_verify(g) checks, in order, and returns EVT_OK or the first violation (a message naming the
 * node, EVT_ERR_TYPE for type/shape/attribute problems, EVT_ERR_INVALID for structural ones):
 *   - every node has a valid op, an input count in its op's range, and inputs that precede it (topological
 *     order: input ids smaller than the node's id);
 *   - every name is non-empty and unique;
 *   - re-inference on a copy of each node (evt_infer_node) succeeds, gives the stored type (dtype, rank,
 *     shape, contiguous strides) and leaves the attributes unchanged (they are canonical);
 *   - outputs are valid node ids without repeats, and carry EVT_NODE_OUTPUT;
 *   - the loss, if any, is a floating-point scalar (one element) and outputs[0]; no other node carries
 *     EVT_NODE_LOSS.
 * The graph itself is not modified (the error message aside). */
#include "ir/ir.h"

#include <stdlib.h>
#include <string.h>

static bool attrs_equal(evt_op op, const evt_attrs *a, const evt_attrs *b) {
  for (int i = 0; i < EVT_ATTR_COUNT; i++) {
    if (!(evt_op_table[op].attrs & (1ull << i))) continue;
    const evt_attr_info *ai = &evt_attr_table[i];
    const char *pa = (const char *)a + ai->offset, *pb = (const char *)b + ai->offset;
    switch (ai->kind) {
    case EVT_AK_INT:
    case EVT_AK_ENUM:
      if (memcmp(pa, pb, sizeof(int64_t)) != 0) return false;
      break;
    case EVT_AK_FLOAT: {
      double x, y;
      memcpy(&x, pa, sizeof x);
      memcpy(&y, pb, sizeof y);
      if (!(x == y) && !(x != x && y != y)) return false;
      break;
    }
    case EVT_AK_LIST: {
      evt_ilist x, y;
      memcpy(&x, pa, sizeof x);
      memcpy(&y, pb, sizeof y);
      if (x.n != y.n) return false;
      for (int k = 0; k < x.n && k < EVT_MAX_RANK; k++)
        if (x.v[k] != y.v[k]) return false;
      break;
    }
    }
  }
  return true;
}

static bool strides_contiguous(const evt_type *t) {
  int64_t s = 1;
  for (int i = t->rank - 1; i >= 0; i--) {
    if (t->stride[i] != s) return false;
    s *= t->shape[i];
  }
  return true;
}

static int cmp_name(const void *a, const void *b) {
  const evt_node *x = *(const evt_node *const *)a, *y = *(const evt_node *const *)b;
  return strcmp(x->name, y->name);
}

static evt_status check_names(evt_graph *g) {
  for (int i = 0; i < g->nnodes; i++)
    if (!g->nodes[i].name || !g->nodes[i].name[0]) return evt_graph_errorf(g, i, EVT_ERR_INVALID, "the node has no name");
  if (g->nnodes < 2) return EVT_OK;
  const evt_node **sorted = malloc(sizeof *sorted * (size_t)g->nnodes);
  if (!sorted) evt_fatal(__FILE__, __LINE__, "out of memory");
  for (int i = 0; i < g->nnodes; i++) sorted[i] = &g->nodes[i];
  qsort(sorted, (size_t)g->nnodes, sizeof *sorted, cmp_name);
  evt_status st = EVT_OK;
  for (int i = 1; i < g->nnodes && st == EVT_OK; i++)
    if (strcmp(sorted[i - 1]->name, sorted[i]->name) == 0) {
      int a = (int)(sorted[i - 1] - g->nodes), b = (int)(sorted[i] - g->nodes);
      st = evt_graph_errorf(g, a > b ? a : b, EVT_ERR_INVALID, "the name %%%s is also used by node %d",
                            sorted[i]->name, a < b ? a : b);
    }
  free(sorted);
  return st;
}

static evt_status check_node(evt_graph *g, int id) {
  const evt_node *n = &g->nodes[id];
  if ((unsigned)n->op >= EVT_OP_COUNT) return evt_graph_errorf_at(g, n->origin, EVT_ERR_INVALID, "node %d has a bad op", id);
  const evt_op_info *info = &evt_op_table[n->op];
  if (n->ninputs < info->min_inputs || n->ninputs > info->max_inputs)
    return evt_graph_errorf(g, id, EVT_ERR_INVALID, "takes %d to %d inputs, has %d", info->min_inputs, info->max_inputs,
                            n->ninputs);
  for (int k = 0; k < n->ninputs; k++)
    if (n->inputs[k] < 0 || n->inputs[k] >= id)
      return evt_graph_errorf(g, id, EVT_ERR_INVALID, "input %d (node %d) does not precede the node", k, n->inputs[k]);
  evt_node copy = *n;
  evt_status st = evt_infer_node(g, &copy, id);
  if (st != EVT_OK) return st;
  char a[128], b[128];
  if (!evt_type_equal(&copy.type, &n->type))
    return evt_graph_errorf(g, id, EVT_ERR_TYPE, "stored type %s but the op gives %s", evt_type_str(&n->type, a, sizeof a),
                            evt_type_str(&copy.type, b, sizeof b));
  if (!strides_contiguous(&n->type)) return evt_graph_errorf(g, id, EVT_ERR_TYPE, "the strides are not contiguous");
  if (!attrs_equal(n->op, &copy.attr, &n->attr))
    return evt_graph_errorf(g, id, EVT_ERR_TYPE, "the attributes are not in canonical form");
  return EVT_OK;
}

static evt_status check_outputs(evt_graph *g) {
  for (int i = 0; i < g->noutputs; i++) {
    int o = g->outputs[i];
    if (o < 0 || o >= g->nnodes)
      return evt_graph_errorf_at(g, (evt_origin){0}, EVT_ERR_INVALID, "output %d is not a node (id %d)", i, o);
    for (int j = 0; j < i; j++)
      if (g->outputs[j] == o) return evt_graph_errorf(g, o, EVT_ERR_INVALID, "is listed twice as an output (%d and %d)", j, i);
    if (!(g->nodes[o].flags & EVT_NODE_OUTPUT)) return evt_graph_errorf(g, o, EVT_ERR_INVALID, "an output lacks its output flag");
  }
  if (g->loss >= g->nnodes) return evt_graph_errorf_at(g, (evt_origin){0}, EVT_ERR_INVALID, "the loss is not a node (id %d)", g->loss);
  if (g->loss >= 0) {
    const evt_type *t = &g->nodes[g->loss].type;
    if (!evt_dtype_is_float(t->dtype) || evt_type_numel(t) != 1) {
      char b[128];
      return evt_graph_errorf(g, g->loss, EVT_ERR_TYPE, "the loss must be a floating-point scalar, got %s",
                              evt_type_str(t, b, sizeof b));
    }
    if (g->noutputs == 0 || g->outputs[0] != g->loss)
      return evt_graph_errorf(g, g->loss, EVT_ERR_INVALID, "the loss must be the first output");
  }
  for (int i = 0; i < g->nnodes; i++)
    if ((g->nodes[i].flags & EVT_NODE_LOSS) && i != g->loss)
      return evt_graph_errorf(g, i, EVT_ERR_INVALID, "carries the loss flag but the loss is %s",
                              g->loss >= 0 && g->loss < g->nnodes ? g->nodes[g->loss].name : "unset");
  return EVT_OK;
}

evt_status evt_graph_verify(evt_graph *g) {
  if (!g) return EVT_ERR_INVALID;
  for (int i = 0; i < g->nnodes; i++) {
    const evt_node *n = &g->nodes[i];
    if ((unsigned)n->op >= EVT_OP_COUNT) return evt_graph_errorf_at(g, n->origin, EVT_ERR_INVALID, "node %d has a bad op", i);
  }
  evt_status st = check_names(g);
  if (st != EVT_OK) return st;
  for (int i = 0; i < g->nnodes; i++)
    if ((st = check_node(g, i)) != EVT_OK) return st;
  return check_outputs(g);
}
