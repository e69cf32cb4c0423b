/* Training on the interpreter: find the gradient of every parameter in a joint graph, apply plain SGD,
 * and release a step's intermediates. Used by `evtc run` and by the Python tests (through libevt.so).
 *
 * Contract
 * - A joint graph (evt_graph_build_joint, or its printed text read back) has, for every floating-point param
 *   %p, an output named %grad.p of p's type (integer and bool params get none and are never updated).
 *   evt_graph_grad_outputs finds them by that name, so a graph that went through passes keeps working as long
 *   as the output names survive (passes keep output names).
 * - evt_train_ensure_joint builds the joint graph when the graph has a loss and no gradient outputs; a graph
 *   where only some params have one is an error (EVT_ERR_INVALID), as is a graph without a loss.
 * - evt_train_sgd_update: p -= lr * dp for every param, elementwise, each result rounded to p's dtype
 *   (so f16/bf16 params stay representable) unless flags has EVT_RUN_FP64 (then kept in double, as the
 *   interpreter keeps every float). Needs the gradient slots filled by evt_interp_run.
 * - evt_train_release frees every slot that is not an input or a param, so the next evt_interp_run starts
 *   from the caller-filled slots only (the interpreter never sees stale outputs). */
#include "ir/ir.h"

#include <stdlib.h>
#include <string.h>

static bool is_source_slot(const evt_node *n) { return n->op == EVT_OP_INPUT || n->op == EVT_OP_PARAM; }

/* The first floating-point param without a %grad.<name> output in grad_of, or -1. */
static int missing_grad(const evt_graph *g, const int *grad_of) {
  for (int i = 0; i < g->nnodes; i++)
    if (g->nodes[i].op == EVT_OP_PARAM && evt_dtype_is_float(g->nodes[i].type.dtype) && grad_of[i] < 0) return i;
  return -1;
}

evt_status evt_train_ensure_joint(evt_graph *g, bool *built) {
  if (built) *built = false;
  if (g->loss < 0)
    return evt_graph_errorf_at(g, (evt_origin){0}, EVT_ERR_INVALID,
                               "graph %s has no loss: mark one with `loss %%name`", g->name);
  int *grad_of = malloc(sizeof(int) * (size_t)(g->nnodes ? g->nnodes : 1));
  if (!grad_of) evt_fatal(__FILE__, __LINE__, "out of memory");
  int have = evt_graph_grad_outputs(g, grad_of), nparams = evt_graph_float_param_count(g);
  evt_status st = EVT_OK;
  if (have == 0 && nparams > 0) {
    st = evt_graph_build_joint(g, 0);
    if (st == EVT_OK) {
      if (built) *built = true;
      free(grad_of);
      grad_of = malloc(sizeof(int) * (size_t)g->nnodes);
      if (!grad_of) evt_fatal(__FILE__, __LINE__, "out of memory");
      evt_graph_grad_outputs(g, grad_of);
      int p = missing_grad(g, grad_of);
      if (p >= 0) st = evt_graph_errorf(g, p, EVT_ERR_INTERNAL, "the joint graph has no output %%grad.%s", g->nodes[p].name);
    }
  } else if (have != nparams) {
    int p = missing_grad(g, grad_of);
    if (p >= 0)
      st = evt_graph_errorf(g, p, EVT_ERR_INVALID, "the graph has gradient outputs for %d of %d params but none named %%grad.%s",
                            have, nparams, g->nodes[p].name);
  }
  free(grad_of);
  return st;
}

evt_status evt_train_sgd_update(evt_graph *g, evt_tensor *values, double lr, unsigned flags) {
  int *grad_of = malloc(sizeof(int) * (size_t)(g->nnodes ? g->nnodes : 1));
  if (!grad_of) evt_fatal(__FILE__, __LINE__, "out of memory");
  evt_graph_grad_outputs(g, grad_of);
  evt_status st = EVT_OK;
  for (int i = 0; i < g->nnodes && st == EVT_OK; i++) {
    if (grad_of[i] < 0) continue;
    evt_tensor *p = &values[i];
    const evt_tensor *d = &values[grad_of[i]];
    if (!p->data || !d->data || p->numel != d->numel) {
      st = evt_graph_errorf(g, i, EVT_ERR_INVALID, "sgd: the param or its gradient has no value (run the graph first)");
      break;
    }
    if (!evt_dtype_is_float(p->dtype)) continue;
    if (flags & EVT_RUN_FP64)
      for (int64_t j = 0; j < p->numel; j++) p->data[j] -= lr * d->data[j];
    else
      for (int64_t j = 0; j < p->numel; j++) p->data[j] = evt_round_to_dtype(p->data[j] - lr * d->data[j], p->dtype);
  }
  free(grad_of);
  return st;
}

void evt_train_release(const evt_graph *g, evt_tensor *values) {
  for (int i = 0; i < g->nnodes; i++)
    if (!is_source_slot(&g->nodes[i]) && values[i].data) {
      evt_tensor_free(&values[i]);
      memset(&values[i], 0, sizeof values[i]);
    }
}
