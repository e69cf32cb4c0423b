/* Graph rewriting infrastructure shared by every pass: use replacement, compaction (stable topological
 * re-sort + dead-code elimination + renumbering), a structural check, and node builders.
 *
 * Design: passes never delete or reorder nodes themselves. They append new nodes (which may be used by
 * older nodes for a while, breaking the id order) and redirect uses; evt_graph_compact() then rebuilds the
 * node array in a topological order that keeps the original relative order wherever it can (a depth-first
 * post-order visiting nodes by old id, so an appended node moves up to just before its first user). That
 * keeps printed graphs readable and diffs between passes small. Inputs and params are never dropped: they
 * are how callers bind data. */
#include "passes/passes.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define A(U) (1ull << EVT_ATTR_##U)

/* ---- small facts ------------------------------------------------------------------------------------ */

int evt_norm_dim(int64_t d, int rank) {
  if (d < 0) d += rank;
  return d >= 0 && d < rank ? (int)d : -1;
}

bool evt_op_is_elementwise(evt_op op) { return evt_op_table[op].cls == EVT_CLASS_ELEMENTWISE; }

bool evt_node_is_const(const evt_graph *g, int id, double *value) {
  const evt_node *n = &g->nodes[id];
  if (n->op != EVT_OP_FULL && n->op != EVT_OP_SCALAR) return false;
  if (value) *value = evt_dtype_is_float(n->type.dtype) ? n->attr.value : evt_round_to_dtype(n->attr.value, n->type.dtype);
  return true;
}

bool evt_node_attrs_equal(const evt_node *a, const evt_node *b) {
  if (a->op != b->op) return false;
  uint64_t mask = evt_op_table[a->op].attrs;
  for (int i = 0; i < EVT_ATTR_COUNT; i++) {
    if (!(mask & (1ull << i))) continue;
    const evt_attr_info *ai = &evt_attr_table[i];
    const char *pa = (const char *)&a->attr + ai->offset, *pb = (const char *)&b->attr + ai->offset;
    if (ai->kind == EVT_AK_LIST) {
      const evt_ilist *la = (const evt_ilist *)pa, *lb = (const evt_ilist *)pb;
      if (la->n != lb->n || memcmp(la->v, lb->v, sizeof(int64_t) * (size_t)la->n)) return false;
    } else if (memcmp(pa, pb, 8)) {
      return false; /* int64 / double / enum: all 8 bytes */
    }
  }
  return true;
}

bool evt_node_same_value(const evt_graph *g, int a, int b) {
  if (a == b) return true;
  const evt_node *x = &g->nodes[a], *y = &g->nodes[b];
  if (x->op != y->op || x->op == EVT_OP_INPUT || x->op == EVT_OP_PARAM) return false;
  if (x->ninputs != y->ninputs || !evt_type_equal(&x->type, &y->type)) return false;
  for (int i = 0; i < x->ninputs; i++)
    if (x->inputs[i] != y->inputs[i]) return false;
  return evt_node_attrs_equal(x, y);
}

void evt_graph_count_uses(const evt_graph *g, int *uses) {
  memset(uses, 0, sizeof(int) * (size_t)g->nnodes);
  for (int i = 0; i < g->nnodes; i++)
    for (int k = 0; k < g->nodes[i].ninputs; k++) uses[g->nodes[i].inputs[k]]++;
  for (int i = 0; i < g->noutputs; i++) uses[g->outputs[i]]++;
}

/* true if n's name looks like evt_graph_fresh_name(<its op>): "<op>.<digits>" */
static bool generated_name(const evt_node *n) {
  const char *op = evt_op_table[n->op].name;
  size_t len = strlen(op);
  if (strncmp(n->name, op, len) || n->name[len] != '.' || !n->name[len + 1]) return false;
  for (const char *c = n->name + len + 1; *c; c++)
    if (*c < '0' || *c > '9') return false;
  return true;
}

/* ---- replacing uses --------------------------------------------------------------------------------- */

void evt_graph_replace_uses(evt_graph *g, int old, int nw) {
  EVT_ASSERT(old >= 0 && old < g->nnodes && nw >= 0 && nw < g->nnodes);
  if (old == nw) return;
  EVT_ASSERT(evt_type_equal(&g->nodes[old].type, &g->nodes[nw].type));
  /* the users of old, from the graph's use index: each entry is re-checked; those rewired move to nw's list,
   * nw's own entry (nw reading old) stays */
  evt_graph_sync_uses(g);
  int *head = g->use_index.head, *next = g->use_index.next, *user = g->use_index.user;
  int e = head[old], keep = -1;
  head[old] = -1;
  while (e >= 0) {
    int after = next[e], i = user[e];
    bool moved = false;
    if (i != nw && i < g->nnodes) {
      evt_node *n = &g->nodes[i];
      for (int k = 0; k < n->ninputs; k++)
        if (n->inputs[k] == old) n->inputs[k] = nw, moved = true;
    }
    if (moved) next[e] = head[nw], head[nw] = e;
    else if (i == nw && keep < 0) next[e] = -1, keep = head[old] = e;
    e = after;
  }
  /* outputs never repeat: if nw already is one, old stays an output (it still computes the same value) */
  int *outpos = g->use_index.outpos, at = outpos[old];
  bool was_output = at >= 0 && outpos[nw] < 0;
  if (was_output) g->outputs[at] = nw, outpos[nw] = at, outpos[old] = -1;
  evt_node *o = &g->nodes[old], *n = &g->nodes[nw];
  if (was_output) {
    n->flags |= EVT_NODE_OUTPUT;
    o->flags &= ~(unsigned)EVT_NODE_OUTPUT;
    if (g->loss == old) {
      g->loss = nw;
      o->flags &= ~(unsigned)EVT_NODE_LOSS;
      n->flags |= EVT_NODE_LOSS;
    }
  }
  /* names: an output keeps its name (`grad.w` stays `grad.w`, whatever node now computes it, unless that
   * node is an input/param); a node a pass just made takes the name of the node it replaces (so `%h` keeps
   * its name) unless that name was itself generated from old's op ("gelu_backward.18" would mislabel a mul) */
  bool source = n->op == EVT_OP_INPUT || n->op == EVT_OP_PARAM;
  bool swap = was_output ? !source
                         : (n->flags & EVT_NODE_FRESH_NAME) && !(o->flags & EVT_NODE_OUTPUT) && !generated_name(o);
  if (swap) {
    const char *name = o->name;
    o->name = n->name;
    n->name = name;
    unsigned fresh = n->flags & EVT_NODE_FRESH_NAME;
    n->flags = (n->flags & ~(unsigned)EVT_NODE_FRESH_NAME) | (o->flags & EVT_NODE_FRESH_NAME);
    o->flags = (o->flags & ~(unsigned)EVT_NODE_FRESH_NAME) | fresh;
  }
}

/* ---- compaction ------------------------------------------------------------------------------------- */

evt_status evt_graph_compact(evt_graph *g, int *removed) {
  int n = g->nnodes;
  if (removed) *removed = 0;
  evt_graph_drop_uses(g);   /* ids change (and a pass ends here) */
  if (n == 0) return EVT_OK;
  char *state = calloc((size_t)n, 1); /* 0 dead, 1 live, 2 on the DFS stack, 3 emitted */
  int *order = malloc(sizeof(int) * (size_t)n), *newid = malloc(sizeof(int) * (size_t)n);
  int *stack = malloc(sizeof(int) * (size_t)n), *next = malloc(sizeof(int) * (size_t)n);
  if (!state || !order || !newid || !stack || !next) evt_fatal(__FILE__, __LINE__, "out of memory");
  evt_status st = EVT_OK;

  /* liveness: from the outputs, the loss, and every input/param */
  int sp = 0;
  for (int i = 0; i < g->noutputs; i++) stack[sp++] = g->outputs[i], state[g->outputs[i]] = 1;
  if (g->loss >= 0 && !state[g->loss]) stack[sp++] = g->loss, state[g->loss] = 1;
  for (int i = 0; i < n; i++)
    if ((g->nodes[i].op == EVT_OP_INPUT || g->nodes[i].op == EVT_OP_PARAM) && !state[i]) stack[sp++] = i, state[i] = 1;
  while (sp > 0) {
    const evt_node *x = &g->nodes[stack[--sp]];
    for (int k = 0; k < x->ninputs; k++)
      if (!state[x->inputs[k]]) state[x->inputs[k]] = 1, stack[sp++] = x->inputs[k];
  }

  /* stable topological order: depth-first post-order, roots taken by increasing old id */
  int count = 0;
  for (int r = 0; r < n && st == EVT_OK; r++) {
    if (state[r] != 1) continue;
    sp = 0;
    stack[sp++] = r, next[r] = 0, state[r] = 2;
    while (sp > 0) {
      int v = stack[sp - 1];
      const evt_node *x = &g->nodes[v];
      if (next[v] < x->ninputs) {
        int u = x->inputs[next[v]++];
        if (state[u] == 2) {
          st = evt_graph_errorf(g, v, EVT_ERR_INTERNAL, "a rewrite made a cycle through %%%s", g->nodes[u].name);
          break;
        }
        if (state[u] == 1) stack[sp++] = u, next[u] = 0, state[u] = 2;
        continue;
      }
      state[v] = 3;
      newid[v] = count;
      order[count++] = v;
      sp--;
    }
  }
  if (st == EVT_OK) {
    evt_node *nodes = malloc(sizeof(evt_node) * (size_t)(g->cap > count ? g->cap : count));
    if (!nodes) evt_fatal(__FILE__, __LINE__, "out of memory");
    for (int k = 0; k < count; k++) {
      nodes[k] = g->nodes[order[k]];
      for (int j = 0; j < nodes[k].ninputs; j++) nodes[k].inputs[j] = newid[nodes[k].inputs[j]];
      nodes[k].flags &= ~(unsigned)(EVT_NODE_OUTPUT | EVT_NODE_LOSS);
    }
    for (int i = 0; i < g->noutputs; i++) {
      g->outputs[i] = newid[g->outputs[i]];
      nodes[g->outputs[i]].flags |= EVT_NODE_OUTPUT;
    }
    if (g->loss >= 0) {
      g->loss = newid[g->loss];
      nodes[g->loss].flags |= EVT_NODE_LOSS;
    }
    free(g->nodes);
    g->nodes = nodes;
    if (g->cap < count) g->cap = count;
    if (removed) *removed = n - count;
    g->nnodes = count;
  }
  free(state), free(order), free(newid), free(stack), free(next);
  return st;
}

/* ---- structural check ------------------------------------------------------------------------------- */

evt_status evt_graph_check(evt_graph *g) {
  for (int i = 0; i < g->nnodes; i++) {
    evt_node *n = &g->nodes[i];
    const evt_op_info *info = &evt_op_table[n->op];
    if (n->ninputs < info->min_inputs || n->ninputs > info->max_inputs)
      return evt_graph_errorf(g, i, EVT_ERR_INTERNAL, "has %d inputs", n->ninputs);
    for (int k = 0; k < n->ninputs; k++)
      if (n->inputs[k] < 0 || n->inputs[k] >= i)
        return evt_graph_errorf(g, i, EVT_ERR_INTERNAL, "input %d (id %d) does not come before the node (id %d)", k,
                                n->inputs[k], i);
    evt_node copy = *n;
    evt_status st = evt_infer_node(g, &copy, i);
    if (st != EVT_OK) return st;
    if (!evt_type_equal(&copy.type, &n->type)) {
      char a[128], b[128];
      return evt_graph_errorf(g, i, EVT_ERR_INTERNAL, "stored type %s but the op gives %s",
                              evt_type_str(&n->type, a, sizeof a), evt_type_str(&copy.type, b, sizeof b));
    }
  }
  for (int i = 0; i < g->noutputs; i++)
    if (g->outputs[i] < 0 || g->outputs[i] >= g->nnodes)
      return evt_graph_errorf_at(g, (evt_origin){0}, EVT_ERR_INTERNAL, "output %d is not a node", i);
  if (g->loss >= 0 && (g->noutputs == 0 || g->outputs[0] != g->loss))
    return evt_graph_errorf(g, g->loss, EVT_ERR_INTERNAL, "the loss is not the first output");
  return EVT_OK;
}

/* ---- operand folding ---------------------------------------------------------------------------------- */

/* Sets input k of node id to nw if that leaves the node's type unchanged; true if done. */
static bool try_substitute(evt_graph *g, int id, int k, int nw) {
  evt_node copy = g->nodes[id];
  copy.inputs[k] = nw;
  char saved[sizeof g->error];
  memcpy(saved, g->error, sizeof saved);
  evt_status st = evt_infer_node(g, &copy, g->nnodes); /* as if appended: its inputs may be later nodes */
  memcpy(g->error, saved, sizeof saved);
  if (st != EVT_OK || !evt_type_equal(&copy.type, &g->nodes[id].type)) return false;
  g->nodes[id].inputs[k] = nw;
  evt_graph_note_use(g, id, nw);
  return true;
}

int evt_rw_fold_operands(evt_graph *g, int id) {
  int done = 0;
  if (!evt_op_is_elementwise(g->nodes[id].op) || g->nodes[id].ninputs < 2) return 0;
  for (int k = 0; k < g->nodes[id].ninputs; k++) {
    int x = g->nodes[id].inputs[k];
    const evt_node *in = &g->nodes[x];
    bool full = in->op == EVT_OP_FULL && in->type.rank > 0;
    int nw = -1;
    if (in->op == EVT_OP_EXPAND) nw = in->inputs[0];
    else if (full) nw = evt_rw_scalar(g, x, in->type.dtype, in->attr.value);
    if (nw < 0) {
      if (full) return -1;
      continue;
    }
    if (try_substitute(g, id, k, nw)) done++;
  }
  return done;
}

/* ---- node builders ---------------------------------------------------------------------------------- */

int evt_rw_op(evt_graph *g, int at, evt_op op, const int *in, int nin, const evt_attrs *attrs, uint64_t given) {
  for (int i = 0; i < nin; i++)
    if (in[i] < 0) return -1;
  evt_origin origin = at >= 0 && at < g->nnodes ? g->nodes[at].origin : (evt_origin){0};
  int id = evt_graph_add_node(g, op, in, nin, attrs, given, NULL, NULL, origin);
  if (id >= 0) g->nodes[id].flags |= EVT_NODE_FRESH_NAME;
  return id;
}

int evt_rw_unary(evt_graph *g, int at, evt_op op, int x) { return evt_rw_op(g, at, op, &x, 1, NULL, 0); }

int evt_rw_binary(evt_graph *g, int at, evt_op op, int a, int b) {
  int in[2] = {a, b};
  return evt_rw_op(g, at, op, in, 2, NULL, 0);
}

int evt_rw_where(evt_graph *g, int at, int cond, int a, int b) {
  int in[3] = {cond, a, b};
  return evt_rw_op(g, at, EVT_OP_WHERE, in, 3, NULL, 0);
}

int evt_rw_scalar(evt_graph *g, int at, evt_dtype dt, double v) {
  evt_attrs a = evt_attrs_default;
  a.dtype = dt;
  a.shape.n = 0;
  a.value = v; /* unrounded: the interpreter rounds to dt when it stores, fp64 runs keep it exact */
  return evt_rw_op(g, at, EVT_OP_SCALAR, NULL, 0, &a, A(VALUE) | A(DTYPE) | A(SHAPE));
}

/* A constant factor or addend of arithmetic in dtype dt (x * 1/(1-p), var + eps, dy * 1/N): the scalar of evt_rw_scalar,
 * but f32 when dt is 16-bit or fp8. It adopts the other operand's dtype all the same (infer.c), so x_bf16 * s stays bf16,
 * computed as x * (float)v and rounded once: PyTorch's opmath with a Python number, and what generated kernels
 * compute (visitor scalars are float constants). A bf16 scalar would round v itself first (a decomposed bf16 dropout
 * scaled by 1.109375 instead of 1/0.9). Comparison thresholds keep evt_rw_scalar (PyTorch rounds those to the
 * tensor's dtype). */
int evt_rw_factor(evt_graph *g, int at, evt_dtype dt, double v) {
  return evt_rw_scalar(g, at, evt_dtype_is_float(dt) ? EVT_F32 : dt, v);
}

int evt_rw_full(evt_graph *g, int at, const evt_type *t, double v) {
  if (t->rank == 0) return evt_rw_scalar(g, at, t->dtype, v);
  evt_attrs a = evt_attrs_default;
  a.dtype = t->dtype;
  a.shape.n = t->rank;
  for (int i = 0; i < t->rank; i++) a.shape.v[i] = t->shape[i];
  a.value = v;
  return evt_rw_op(g, at, EVT_OP_FULL, NULL, 0, &a, A(VALUE) | A(DTYPE) | A(SHAPE));
}

int evt_rw_cast(evt_graph *g, int at, int x, evt_dtype dt) {
  if (x < 0) return -1;
  if (g->nodes[x].type.dtype == dt) return x;
  evt_attrs a = evt_attrs_default;
  a.dtype = dt;
  return evt_rw_op(g, at, EVT_OP_CAST, &x, 1, &a, A(DTYPE));
}

int evt_rw_reduce(evt_graph *g, int at, evt_op op, int x, const int *dims, int ndims, int keepdim) {
  evt_attrs a = evt_attrs_default;
  a.dims.n = ndims;
  for (int i = 0; i < ndims; i++) a.dims.v[i] = dims[i];
  a.keepdim = keepdim;
  return evt_rw_op(g, at, op, &x, 1, &a, A(DIMS) | A(KEEPDIM));
}

int evt_rw_reshape(evt_graph *g, int at, int x, int rank, const int64_t *shape) {
  if (x < 0) return -1;
  const evt_type *t = &g->nodes[x].type;
  bool same = t->rank == rank;
  for (int i = 0; same && i < rank; i++) same = t->shape[i] == shape[i];
  if (same) return x;
  evt_attrs a = evt_attrs_default;
  a.shape.n = rank;
  for (int i = 0; i < rank; i++) a.shape.v[i] = shape[i];
  return evt_rw_op(g, at, EVT_OP_RESHAPE, &x, 1, &a, A(SHAPE));
}

int evt_rw_expand(evt_graph *g, int at, int x, const evt_type *to) {
  if (x < 0) return -1;
  const evt_type *t = &g->nodes[x].type;
  bool same = t->rank == to->rank;
  for (int i = 0; same && i < to->rank; i++) same = t->shape[i] == to->shape[i];
  if (same) return x;
  evt_attrs a = evt_attrs_default;
  a.shape.n = to->rank;
  for (int i = 0; i < to->rank; i++) a.shape.v[i] = to->shape[i];
  return evt_rw_op(g, at, EVT_OP_EXPAND, &x, 1, &a, A(SHAPE));
}

int evt_rw_one_hot(evt_graph *g, int at, int idx, int64_t classes, evt_dtype dt) {
  evt_attrs a = evt_attrs_default;
  a.num_classes = classes;
  a.dtype = dt;
  return evt_rw_op(g, at, EVT_OP_ONE_HOT, &idx, 1, &a, A(NUM_CLASSES) | A(DTYPE));
}
