/* The graph: an arena-owned array of nodes (a node's id is its index; inputs always have smaller ids),
 * the output list, error messages that point at a node's origin, and the public builder calls. */
#include "ir/ir.h"

#include <stdlib.h>
#include <string.h>

evt_graph *evt_graph_new(const char *name) {
  evt_graph *g = calloc(1, sizeof *g);
  if (!g) return NULL;
  g->name = evt_arena_strdup(&g->arena, name ? name : "main");
  g->loss = -1;
  return g;
}

void evt_graph_free(evt_graph *g) {
  if (!g) return;
  free(g->nodes);
  free(g->outputs);
  free(g->name_index.names);
  free(g->name_index.ids);
  evt_graph_drop_uses(g);
  evt_arena_free(&g->arena);
  free(g);
}

const char *evt_graph_error(const evt_graph *g) { return g ? g->error : "no graph"; }
int evt_graph_node_count(const evt_graph *g) { return g->nnodes; }
int evt_graph_output_count(const evt_graph *g) { return g->noutputs; }
int evt_graph_output(const evt_graph *g, int i) { return i >= 0 && i < g->noutputs ? g->outputs[i] : -1; }

static size_t format_origin(char *buf, size_t n, evt_origin o) {
  if (o.file && o.line > 0) return (size_t)snprintf(buf, n, "%s:%d:%d: ", o.file, o.line, o.col);
  if (o.label) return (size_t)snprintf(buf, n, "%s: ", o.label);
  return 0;
}

static evt_status verrorf(evt_graph *g, const evt_node *n, evt_origin o, evt_status st, const char *fmt, va_list ap) {
  size_t len = format_origin(g->error, sizeof g->error, o);
  if (len >= sizeof g->error) len = sizeof g->error - 1;
  if (n) {
    len += (size_t)snprintf(g->error + len, sizeof g->error - len, "node %%%s (%s): ", n->name ? n->name : "?",
                            evt_op_table[n->op].name);
    if (len >= sizeof g->error) len = sizeof g->error - 1;
  }
  vsnprintf(g->error + len, sizeof g->error - len, fmt, ap);
  return st;
}

evt_status evt_graph_errorf(evt_graph *g, int node, evt_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  const evt_node *n = node >= 0 && node < g->nnodes ? &g->nodes[node] : NULL;
  evt_status r = verrorf(g, n, n ? n->origin : (evt_origin){0}, st, fmt, ap);
  va_end(ap);
  return r;
}

evt_status evt_graph_errorf_at(evt_graph *g, evt_origin origin, evt_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  evt_status r = verrorf(g, NULL, origin, st, fmt, ap);
  va_end(ap);
  return r;
}

void evt_type_set_contiguous(evt_type *t) {
  int64_t s = 1;
  for (int i = t->rank - 1; i >= 0; i--) {
    t->stride[i] = s;
    s *= t->shape[i];
  }
}

int64_t evt_type_numel(const evt_type *t) {
  int64_t n = 1;
  for (int i = 0; i < t->rank; i++) n *= t->shape[i];
  return n;
}

bool evt_type_equal(const evt_type *a, const evt_type *b) {
  if (a->dtype != b->dtype || a->rank != b->rank) return false;
  for (int i = 0; i < a->rank; i++)
    if (a->shape[i] != b->shape[i]) return false;
  return true;
}

const char *evt_type_str(const evt_type *t, char *buf, size_t n) {
  size_t len = (size_t)snprintf(buf, n, "%s[", evt_dtype_name(t->dtype));
  for (int i = 0; i < t->rank && len < n; i++)
    len += (size_t)snprintf(buf + len, n - len, "%s%lld", i ? "," : "", (long long)t->shape[i]);
  if (len < n) snprintf(buf + len, n - len, "]");
  return buf;
}

/* ---- name index: open addressing over (name, id); a cache, so it may be stale but never wrong ---- */

static uint64_t hash_name(const char *s) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

static void index_put(evt_graph *g, const char *name, int id);

static void index_rebuild(evt_graph *g) {
  free(g->name_index.names);
  free(g->name_index.ids);
  int cap = 64;
  while (cap < 2 * g->nnodes + 16) cap *= 2;
  g->name_index.names = calloc((size_t)cap, sizeof(char *));
  g->name_index.ids = calloc((size_t)cap, sizeof(int));
  if (!g->name_index.names || !g->name_index.ids) evt_fatal(__FILE__, __LINE__, "out of memory");
  g->name_index.cap = cap;
  g->name_index.count = 0;
  g->name_index.indexed = 0;
  for (int i = 0; i < g->nnodes; i++)
    if (g->nodes[i].name) index_put(g, g->nodes[i].name, i);
  g->name_index.indexed = g->nnodes;
}

/* Enters or updates name → id. */
static void index_put(evt_graph *g, const char *name, int id) {
  if (2 * (g->name_index.count + 1) > g->name_index.cap) {
    const char **names = g->name_index.names;
    int *ids = g->name_index.ids, cap = g->name_index.cap;
    int cap2 = cap ? cap * 2 : 64;
    g->name_index.names = calloc((size_t)cap2, sizeof(char *));
    g->name_index.ids = calloc((size_t)cap2, sizeof(int));
    if (!g->name_index.names || !g->name_index.ids) evt_fatal(__FILE__, __LINE__, "out of memory");
    g->name_index.cap = cap2;
    g->name_index.count = 0;
    for (int i = 0; i < cap; i++)
      if (names[i]) index_put(g, names[i], ids[i]);
    free(names);
    free(ids);
  }
  uint64_t mask = (uint64_t)g->name_index.cap - 1;
  for (uint64_t h = hash_name(name) & mask;; h = (h + 1) & mask) {
    if (!g->name_index.names[h]) {
      g->name_index.names[h] = name;
      g->name_index.ids[h] = id;
      g->name_index.count++;
      return;
    }
    if (strcmp(g->name_index.names[h], name) == 0) {
      g->name_index.ids[h] = id;
      return;
    }
  }
}

int evt_graph_find(const evt_graph *cg, const char *name) {
  evt_graph *g = (evt_graph *)cg; /* the index is a cache; lookups may refresh it */
  if (g->name_index.indexed < g->nnodes || !g->name_index.cap) index_rebuild(g);
  uint64_t mask = (uint64_t)g->name_index.cap - 1;
  for (uint64_t h = hash_name(name) & mask; g->name_index.names[h]; h = (h + 1) & mask) {
    if (strcmp(g->name_index.names[h], name) != 0) continue;
    int id = g->name_index.ids[h];
    if (id < g->nnodes && g->nodes[id].name && strcmp(g->nodes[id].name, name) == 0) return id;
    /* stale (a pass renamed or renumbered nodes): look it up the slow way and refresh */
    for (int i = 0; i < g->nnodes; i++)
      if (g->nodes[i].name && strcmp(g->nodes[i].name, name) == 0) {
        g->name_index.ids[h] = i;
        return i;
      }
    return -1;
  }
  return -1; /* every name a node holds was entered, so a miss is final */
}

const char *evt_graph_fresh_name(evt_graph *g, const char *base) {
  char buf[256];
  for (;;) {
    snprintf(buf, sizeof buf, "%s.%d", base, g->name_counter++);
    if (evt_graph_find(g, buf) < 0) return evt_arena_strdup(&g->arena, buf);
  }
}

int evt_graph_add_node(evt_graph *g, evt_op op, const int *inputs, int ninputs, const evt_attrs *attrs,
                       uint64_t given, const evt_type *declared, const char *name, evt_origin origin) {
  EVT_ASSERT((unsigned)op < EVT_OP_COUNT);
  const evt_op_info *info = &evt_op_table[op];
  if (g->nnodes == g->cap) {
    int cap = g->cap ? g->cap * 2 : 64;
    evt_node *nodes = realloc(g->nodes, (size_t)cap * sizeof *nodes);
    if (!nodes) evt_fatal(__FILE__, __LINE__, "out of memory");
    g->nodes = nodes;
    g->cap = cap;
  }
  int id = g->nnodes;
  evt_node *n = &g->nodes[id];
  memset(n, 0, sizeof *n);
  n->op = op;
  n->attr = attrs ? *attrs : evt_attrs_default;
  n->attr_given = given & info->attrs;
  n->origin = origin;
  if (name && evt_graph_find(g, name) >= 0) {
    evt_graph_errorf_at(g, origin, EVT_ERR_TYPE, "%%%s is defined twice", name);
    return -1;
  }
  n->name = name ? evt_arena_strdup(&g->arena, name) : evt_graph_fresh_name(g, info->name);
  if (ninputs < info->min_inputs || ninputs > info->max_inputs) {
    evt_graph_errorf_at(g, origin, EVT_ERR_TYPE, "node %%%s (%s): takes %d to %d inputs, got %d", n->name,
                        info->name, info->min_inputs, info->max_inputs, ninputs);
    return -1;
  }
  for (int i = 0; i < ninputs; i++) {
    if (inputs[i] < 0 || inputs[i] >= id) {
      evt_graph_errorf_at(g, origin, EVT_ERR_INVALID, "node %%%s (%s): input %d is not an existing node", n->name,
                          info->name, i);
      return -1;
    }
    n->inputs[i] = inputs[i];
  }
  n->ninputs = ninputs;
  if ((info->flags & EVT_OPF_TYPED) && declared) {
    /* a typed source takes its type from the declaration */
    n->attr.dtype = declared->dtype;
    n->attr.shape.n = declared->rank;
    for (int i = 0; i < declared->rank; i++) n->attr.shape.v[i] = declared->shape[i];
  }
  g->nnodes++; /* visible to evt_infer_node for messages; undone on error */
  g->name_index.indexed++;
  if (evt_infer_node(g, n, id) != EVT_OK) {
    g->nnodes--;
    g->name_index.indexed--;
    return -1;
  }
  if (declared && !evt_type_equal(declared, &n->type)) {
    char a[128], b[128];
    evt_graph_errorf(g, id, EVT_ERR_TYPE, "declared type %s but the op gives %s", evt_type_str(declared, a, sizeof a),
                     evt_type_str(&n->type, b, sizeof b));
    g->nnodes--;
    g->name_index.indexed--;
    return -1;
  }
  if (g->name_index.cap) index_put(g, n->name, id);
  if (g->use_index.indexed > id) g->use_index.indexed = id;   /* the node array was cut back: enter this one again */
  return id;
}

/* ---- use index ------------------------------------------------------------------------------------- */

void evt_graph_drop_uses(evt_graph *g) {
  free(g->use_index.head);
  free(g->use_index.next);
  free(g->use_index.user);
  free(g->use_index.outpos);
  memset(&g->use_index, 0, sizeof g->use_index);
}

static void use_push(evt_graph *g, int user, int used) {
  if (g->use_index.nent == g->use_index.capent) {
    int cap = g->use_index.capent ? 2 * g->use_index.capent : 1024;
    g->use_index.next = realloc(g->use_index.next, sizeof(int) * (size_t)cap);
    g->use_index.user = realloc(g->use_index.user, sizeof(int) * (size_t)cap);
    if (!g->use_index.next || !g->use_index.user) evt_fatal(__FILE__, __LINE__, "out of memory");
    g->use_index.capent = cap;
  }
  int e = g->use_index.nent++;
  g->use_index.user[e] = user;
  g->use_index.next[e] = g->use_index.head[used];
  g->use_index.head[used] = e;
}

static void use_grow(evt_graph *g, int n) {
  if (g->use_index.head && g->use_index.capnodes >= n) return;
  int cap = g->use_index.capnodes > 64 ? g->use_index.capnodes : 64;
  while (cap < n) cap *= 2;
  int *head = realloc(g->use_index.head, sizeof(int) * (size_t)cap);
  int *outpos = realloc(g->use_index.outpos, sizeof(int) * (size_t)cap);
  if (!head || !outpos) evt_fatal(__FILE__, __LINE__, "out of memory");
  bool fresh = !g->use_index.head;
  for (int i = fresh ? 0 : g->use_index.capnodes; i < cap; i++) head[i] = outpos[i] = -1;
  if (fresh)
    for (int i = 0; i < g->noutputs; i++) outpos[g->outputs[i]] = i;
  g->use_index.head = head;
  g->use_index.outpos = outpos;
  g->use_index.capnodes = cap;
}

void evt_graph_sync_uses(evt_graph *g) {
  use_grow(g, g->nnodes);
  if (g->use_index.indexed > g->nnodes) g->use_index.indexed = g->nnodes;
  for (int i = g->use_index.indexed; i < g->nnodes; i++)
    for (int k = 0; k < g->nodes[i].ninputs; k++) use_push(g, i, g->nodes[i].inputs[k]);
  g->use_index.indexed = g->nnodes;
}

void evt_graph_note_use(evt_graph *g, int user, int used) {
  if (!g->use_index.head || user >= g->use_index.indexed) return;   /* not built, or entered when synced */
  use_grow(g, used + 1);
  use_push(g, user, used);
}

/* ---- public builder -------------------------------------------------------------------------------- */

static evt_status attrs_from_public(evt_graph *g, evt_op op, const evt_attr *in, int nin, evt_attrs *out,
                                    uint64_t *given) {
  *out = evt_attrs_default;
  *given = 0;
  for (int i = 0; i < nin; i++) {
    int id = in[i].name ? evt_attr_from_name(in[i].name, strlen(in[i].name)) : -1;
    if (id < 0 || !(evt_op_table[op].attrs & (1ull << id)))
      return evt_graph_errorf_at(g, (evt_origin){0}, EVT_ERR_INVALID, "%s: no attribute '%s'", evt_op_table[op].name,
                                 in[i].name ? in[i].name : "(null)");
    const evt_attr_info *ai = &evt_attr_table[id];
    char *field = (char *)out + ai->offset;
    switch (ai->kind) {
    case EVT_AK_INT:
    case EVT_AK_ENUM: memcpy(field, &in[i].i, sizeof(int64_t)); break;
    case EVT_AK_FLOAT: memcpy(field, &in[i].f, sizeof(double)); break;
    case EVT_AK_LIST: {
      evt_ilist l = {0};
      if (in[i].n < 0 || in[i].n > EVT_MAX_RANK)
        return evt_graph_errorf_at(g, (evt_origin){0}, EVT_ERR_INVALID, "%s: list attribute '%s' needs 0..%d values",
                                   evt_op_table[op].name, ai->name, EVT_MAX_RANK);
      l.n = in[i].n;
      memcpy(l.v, in[i].list, sizeof(int64_t) * (size_t)l.n);
      memcpy(field, &l, sizeof l);
      break;
    }
    }
    *given |= 1ull << id;
  }
  return EVT_OK;
}

int evt_add_op(evt_graph *g, const char *op, const int *inputs, int ninputs, const evt_attr *attrs, int nattrs) {
  int o = op ? evt_op_from_name(op, strlen(op)) : -1;
  if (o < 0) {
    evt_graph_errorf_at(g, (evt_origin){0}, EVT_ERR_INVALID, "unknown op '%s'", op ? op : "(null)");
    return -1;
  }
  evt_attrs a;
  uint64_t given;
  if (attrs_from_public(g, (evt_op)o, attrs, nattrs, &a, &given) != EVT_OK) return -1;
  return evt_graph_add_node(g, (evt_op)o, inputs, ninputs, &a, given, NULL, NULL, (evt_origin){0});
}

static int add_source(evt_graph *g, evt_op op, const char *name, evt_dtype dt, int rank, const int64_t *shape) {
  if (rank < 0 || rank > EVT_MAX_RANK) {
    evt_graph_errorf_at(g, (evt_origin){0}, EVT_ERR_INVALID, "%s: rank %d out of range", name ? name : "?", rank);
    return -1;
  }
  evt_type t = {.dtype = dt, .rank = rank};
  for (int i = 0; i < rank; i++) t.shape[i] = shape[i];
  return evt_graph_add_node(g, op, NULL, 0, NULL, 0, &t, name, (evt_origin){0});
}

int evt_input(evt_graph *g, const char *name, evt_dtype dt, int rank, const int64_t *shape) {
  return add_source(g, EVT_OP_INPUT, name, dt, rank, shape);
}

int evt_param(evt_graph *g, const char *name, evt_dtype dt, int rank, const int64_t *shape) {
  return add_source(g, EVT_OP_PARAM, name, dt, rank, shape);
}

void evt_graph_set_rng_step(evt_graph *g, uint64_t step) {
  if (g) g->rng_step = step;
}

uint64_t evt_graph_rng_step(const evt_graph *g) { return g ? g->rng_step : 0; }

evt_status evt_graph_set_name(evt_graph *g, int node, const char *name) {
  if (node < 0 || node >= g->nnodes) return evt_graph_errorf_at(g, (evt_origin){0}, EVT_ERR_INVALID, "no node %d", node);
  int other = evt_graph_find(g, name);
  if (other >= 0 && other != node) return evt_graph_errorf(g, node, EVT_ERR_INVALID, "name %%%s is taken", name);
  g->nodes[node].name = evt_arena_strdup(&g->arena, name);
  if (g->name_index.cap) index_put(g, g->nodes[node].name, node);
  return EVT_OK;
}

evt_status evt_graph_add_output(evt_graph *g, int node) {
  if (node < 0 || node >= g->nnodes) return evt_graph_errorf_at(g, (evt_origin){0}, EVT_ERR_INVALID, "no node %d", node);
  if (g->noutputs == g->outcap) {
    int cap = g->outcap ? g->outcap * 2 : 16;
    int *o = realloc(g->outputs, (size_t)cap * sizeof *o);
    if (!o) evt_fatal(__FILE__, __LINE__, "out of memory");
    g->outputs = o;
    g->outcap = cap;
  }
  g->outputs[g->noutputs++] = node;
  g->nodes[node].flags |= EVT_NODE_OUTPUT;
  evt_graph_drop_uses(g);
  return EVT_OK;
}

evt_status evt_graph_set_loss(evt_graph *g, int node) {
  if (node < 0 || node >= g->nnodes) return evt_graph_errorf_at(g, (evt_origin){0}, EVT_ERR_INVALID, "no node %d", node);
  const evt_node *n = &g->nodes[node];
  if (evt_type_numel(&n->type) != 1 || !evt_dtype_is_float(n->type.dtype))
    return evt_graph_errorf(g, node, EVT_ERR_TYPE, "the loss must be a floating-point scalar");
  if (g->loss >= 0) g->nodes[g->loss].flags &= ~EVT_NODE_LOSS;
  g->loss = node;
  g->nodes[node].flags |= EVT_NODE_LOSS;
  evt_graph_drop_uses(g);
  /* the loss is the first output */
  for (int i = 0; i < g->noutputs; i++)
    if (g->outputs[i] == node) {
      memmove(g->outputs + 1, g->outputs, sizeof(int) * (size_t)i);
      g->outputs[0] = node;
      return EVT_OK;
    }
  evt_status st = evt_graph_add_output(g, node);
  if (st != EVT_OK) return st;
  memmove(g->outputs + 1, g->outputs, sizeof(int) * (size_t)(g->noutputs - 1));
  g->outputs[0] = node;
  return EVT_OK;
}

/* ---- the joint graph's gradient outputs, by name: %grad.<param> ---- */

int evt_graph_grad_outputs(const evt_graph *g, int *grad_of) {
  int found = 0;
  for (int i = 0; i < g->nnodes; i++) grad_of[i] = -1;
  for (int i = 0; i < g->nnodes; i++) {
    const evt_node *p = &g->nodes[i];
    if (p->op != EVT_OP_PARAM || !p->name) continue;
    for (int k = 0; k < g->noutputs; k++) {
      const evt_node *o = &g->nodes[g->outputs[k]];
      if (o->name && !strncmp(o->name, "grad.", 5) && !strcmp(o->name + 5, p->name) &&
          evt_type_equal(&o->type, &p->type)) {
        grad_of[i] = g->outputs[k];
        found++;
        break;
      }
    }
  }
  return found;
}

int evt_graph_float_param_count(const evt_graph *g) {
  int n = 0;
  for (int i = 0; i < g->nnodes; i++) n += g->nodes[i].op == EVT_OP_PARAM && evt_dtype_is_float(g->nodes[i].type.dtype);
  return n;
}
