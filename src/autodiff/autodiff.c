/* Reverse-mode autodiff: evt_graph_build_joint appends the backward of g->loss to g (ggml style, one
 * graph) and makes the outputs: loss, d loss / d p for every param in id order (named "grad.<p>"), then,
 * with EVT_GRAD_INPUTS, every floating input likewise.
 *
 * Design.
 *  1. Targets: params (and floating inputs with EVT_GRAD_INPUTS).
 *  2. requires[i]: node i is floating and a target, or has a differentiable input that requires a
 *     gradient (evt_vjp_differentiable_input: integer/bool tensors, targets of classification losses,
 *     indices, CSR arrays and the `where` condition never carry one).
 *  3. needs[i]: requires[i] and node i reaches the loss through differentiable edges. A needed node whose
 *     op has no rule (no F_DIFF in ops.def) is an error (EVT_ERR_UNSUPPORTED) before anything is emitted.
 *  4. Seed: full(1) of the loss type. Walk the forward nodes from the loss down in id order (inputs have
 *     smaller ids than users, so a node's gradient is complete when it is reached) and apply each needed
 *     node's vector-Jacobian rule (vjp.c); contributions are summed with `add`.
 *  5. A target that gets no gradient (unused, or reached only through non-differentiable operands) gets a
 *     zeros `full`. The gradient node is renamed "grad.<name>"; where one node is the gradient of two
 *     targets (or is not a fresh node) a `reshape` to the same shape gives the second name its own node.
 * Emitted nodes carry the origin label "grad of %<forward node>". On any error g is restored to its forward
 * nodes and outputs, and the message names the offending node. */
#include "autodiff/ad.h"

#include <stdlib.h>
#include <string.h>

int evt_ad_emit(evt_ad *c, evt_op op, const int *inputs, int ninputs, const evt_attrs *attrs, uint64_t given) {
  if (c->st != EVT_OK) return -1;
  for (int i = 0; i < ninputs; i++)
    if (inputs[i] < 0) return -1; /* an earlier emit of this expression failed */
  int id = evt_graph_add_node(c->g, op, inputs, ninputs, attrs ? attrs : &evt_attrs_default, given, NULL, NULL,
                              c->origin);
  if (id < 0) c->st = EVT_ERR_INTERNAL; /* the forward graph type-checked, so a bad gradient node is our bug */
  return id;
}

static bool is_target(const evt_node *n, unsigned flags) {
  if (!evt_dtype_is_float(n->type.dtype)) return false;
  return n->op == EVT_OP_PARAM || (n->op == EVT_OP_INPUT && (flags & EVT_GRAD_INPUTS));
}

static bool is_source(evt_op op) {
  return evt_op_table[op].cls == EVT_CLASS_SOURCE || op == EVT_OP_RAND;
}

/* Steps 2 and 3: which forward nodes need a gradient. */
static evt_status mark_needed(evt_graph *g, unsigned flags, bool *req, bool *needs) {
  for (int i = 0; i < g->nnodes; i++) {
    const evt_node *n = &g->nodes[i];
    if (!evt_dtype_is_float(n->type.dtype)) continue;
    if (is_target(n, flags)) req[i] = true;
    bool rule = evt_op_table[n->op].flags & EVT_OPF_DIFF;
    for (int k = 0; k < n->ninputs && !req[i]; k++) {
      bool diff = rule ? evt_vjp_differentiable_input(g, n, k) : evt_dtype_is_float(g->nodes[n->inputs[k]].type.dtype);
      if (diff && req[n->inputs[k]]) req[i] = true;
    }
  }
  needs[g->loss] = req[g->loss];
  for (int i = g->loss; i >= 0; i--) {
    if (!needs[i]) continue;
    const evt_node *n = &g->nodes[i];
    if (is_source(n->op)) continue;
    if (!(evt_op_table[n->op].flags & EVT_OPF_DIFF))
      return evt_graph_errorf(g, i, EVT_ERR_UNSUPPORTED,
                              "no gradient rule for %s, which lies on a path from a parameter to the loss",
                              evt_op_table[n->op].name);
    for (int k = 0; k < n->ninputs; k++)
      if (req[n->inputs[k]] && evt_vjp_differentiable_input(g, n, k)) needs[n->inputs[k]] = true;
  }
  return EVT_OK;
}

static evt_origin grad_origin(evt_graph *g, int id) {
  char buf[300];
  snprintf(buf, sizeof buf, "grad of %%%s", g->nodes[id].name ? g->nodes[id].name : "?");
  return (evt_origin){.label = evt_arena_strdup(&g->arena, buf)};
}

/* Step 5: the gradient of target p as a node named grad.<p>. */
static int name_gradient(evt_ad *c, int p, bool *named) {
  evt_graph *g = c->g;
  char name[300];
  snprintf(name, sizeof name, "grad.%s", g->nodes[p].name);
  int taken = evt_graph_find(g, name);
  if (taken >= 0) {
    evt_graph_errorf(g, taken, EVT_ERR_INVALID,
                     "the name %%%s is reserved for the gradient of %%%s (is this already a joint graph?)", name,
                     g->nodes[p].name);
    c->st = EVT_ERR_INVALID;
    return -1;
  }
  c->origin = grad_origin(g, p);
  int gid = c->grad[p];
  evt_type t = g->nodes[p].type;
  evt_attrs a = evt_attrs_default;
  a.shape.n = t.rank;
  for (int i = 0; i < t.rank; i++) a.shape.v[i] = t.shape[i];
  uint64_t shape_bit = 1ull << EVT_ATTR_SHAPE;
  int id;
  if (gid < 0) {
    a.dtype = t.dtype;
    a.value = 0.0;
    id = evt_graph_add_node(g, EVT_OP_FULL, NULL, 0, &a, shape_bit | (1ull << EVT_ATTR_DTYPE) | (1ull << EVT_ATTR_VALUE),
                            NULL, name, c->origin);
  } else if (gid < c->nforward || named[gid - c->nforward]) {
    id = evt_graph_add_node(g, EVT_OP_RESHAPE, &gid, 1, &a, shape_bit, NULL, name, c->origin);
  } else {
    if (evt_graph_set_name(g, gid, name) != EVT_OK) c->st = EVT_ERR_INTERNAL;
    id = c->st == EVT_OK ? gid : -1;
  }
  if (id < 0) {
    if (c->st == EVT_OK) c->st = EVT_ERR_INTERNAL;
    return -1;
  }
  named[id - c->nforward] = true;
  return id;
}

static void set_outputs(evt_graph *g, const int *outs, int n) {
  for (int i = 0; i < g->noutputs; i++) g->nodes[g->outputs[i]].flags &= ~EVT_NODE_OUTPUT;
  g->noutputs = 0;
  for (int i = 0; i < n; i++) {
    evt_status st = evt_graph_add_output(g, outs[i]);
    EVT_ASSERT(st == EVT_OK);
  }
}

evt_status evt_graph_build_joint(evt_graph *g, unsigned flags) {
  if (!g) return EVT_ERR_INVALID;
  if (flags & ~EVT_GRAD_INPUTS)
    return evt_graph_errorf_at(g, (evt_origin){0}, EVT_ERR_INVALID, "build_joint: unknown flags 0x%x", flags);
  if (g->loss < 0 || g->loss >= g->nnodes)
    return evt_graph_errorf_at(g, (evt_origin){0}, EVT_ERR_INVALID,
                               "graph %s has no loss to differentiate (mark one with `loss %%name`)", g->name);
  const evt_node *ln = &g->nodes[g->loss];
  if (evt_type_numel(&ln->type) != 1 || !evt_dtype_is_float(ln->type.dtype)) {
    char buf[128];
    return evt_graph_errorf(g, g->loss, EVT_ERR_INVALID, "the loss must be a floating-point scalar, got %s",
                            evt_type_str(&ln->type, buf, sizeof buf));
  }

  int nf = g->nnodes, nout0 = g->noutputs;
  int *grad = malloc(sizeof(int) * (size_t)nf), *transposed = malloc(sizeof(int) * (size_t)nf);
  bool *req = calloc((size_t)nf, sizeof(bool)), *needs = calloc((size_t)nf, sizeof(bool));
  int *outs = malloc(sizeof(int) * (size_t)(nf + 1));
  int *old_outs = malloc(sizeof(int) * (size_t)(nout0 + 1));
  if (!grad || !transposed || !req || !needs || !outs || !old_outs) evt_fatal(__FILE__, __LINE__, "out of memory");
  for (int i = 0; i < nf; i++) grad[i] = transposed[i] = -1;
  if (nout0) memcpy(old_outs, g->outputs, sizeof(int) * (size_t)nout0);

  evt_ad c = {.g = g, .nforward = nf, .grad = grad, .needs = needs, .transposed = transposed, .st = EVT_OK};
  bool *named = NULL;
  evt_status st = mark_needed(g, flags, req, needs);
  if (st == EVT_OK && needs[g->loss]) {
    c.origin = grad_origin(g, g->loss);
    evt_attrs a = evt_attrs_default;
    a.shape.n = ln->type.rank;
    for (int i = 0; i < ln->type.rank; i++) a.shape.v[i] = ln->type.shape[i];
    a.dtype = ln->type.dtype;
    a.value = 1.0;
    grad[g->loss] = evt_ad_emit(&c, EVT_OP_FULL, NULL, 0, &a,
                                (1ull << EVT_ATTR_SHAPE) | (1ull << EVT_ATTR_DTYPE) | (1ull << EVT_ATTR_VALUE));
    st = c.st;
  }
  for (int i = g->loss; st == EVT_OK && i >= 0; i--) {
    if (grad[i] < 0 || is_source(g->nodes[i].op)) continue;
    c.origin = grad_origin(g, i);
    st = evt_vjp_apply(&c, i, grad[i]);
    if (st == EVT_OK) st = c.st;
  }

  /* outputs: loss, then one gradient per target */
  int nouts = 0;
  outs[nouts++] = g->loss;
  if (st == EVT_OK) {
    named = calloc((size_t)(2 * nf + 8), sizeof(bool)); /* indexed by id - nf; grows below if needed */
    int named_cap = 2 * nf + 8;
    for (int pass = 0; pass < 2 && st == EVT_OK; pass++)
      for (int i = 0; i < nf && st == EVT_OK; i++) {
        const evt_node *n = &g->nodes[i];
        bool want = pass == 0 ? n->op == EVT_OP_PARAM && evt_dtype_is_float(n->type.dtype)
                              : n->op == EVT_OP_INPUT && (flags & EVT_GRAD_INPUTS) && evt_dtype_is_float(n->type.dtype);
        if (!want) continue;
        if (g->nnodes + 1 - nf > named_cap) {
          int cap = 2 * (g->nnodes + 1 - nf);
          bool *nn = realloc(named, sizeof(bool) * (size_t)cap);
          if (!nn) evt_fatal(__FILE__, __LINE__, "out of memory");
          memset(nn + named_cap, 0, sizeof(bool) * (size_t)(cap - named_cap));
          named = nn;
          named_cap = cap;
        }
        int id = name_gradient(&c, i, named);
        if (id < 0) st = c.st != EVT_OK ? c.st : EVT_ERR_INTERNAL;
        else outs[nouts++] = id;
      }
  }

  if (st == EVT_OK) {
    set_outputs(g, outs, nouts);
  } else {
    /* restore the forward graph; the message is already on g */
    g->nnodes = nf;
    set_outputs(g, old_outs, nout0);
  }
  free(named);
  free(grad);
  free(transposed);
  free(req);
  free(needs);
  free(outs);
  free(old_outs);
  return st;
}
