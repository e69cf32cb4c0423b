/* A group's members as visitor nodes (contract in lower_internal.h). Members are lowered in graph id order
 * (inputs before users), so visitor ids come out topological: each member becomes a compute, an identity (views,
 * casts to f32), or a row/col sum; each operand that is not a member's value becomes a load whose kind follows from
 * its strides broadcast over the member's output shape, split into an M part (leading dims, product M) and an N part
 * (trailing dims, product N). Stores come last: every member value that leaves the group; the latest is D. */
#include <stdlib.h>
#include <string.h>

#include "codegen/lower_internal.h"

int evt_lower_add_node(lctx *c, int v, evt_vop op, int in0, int in1, evt_dtype dt, const char *name, int tensor) {
  int id = evt_kspec_add(c->s, op, in0, in1, dt, name);
  if (id < 0) {
    evt_lower_refuse(c, v, "the epilogue needs more than %d visitor nodes", EVT_KSPEC_MAX_NODES);
    return -1;
  }
  c->vt[id] = tensor;
  return id;
}

/* A widening cast (to f32, from a float dtype) of a value that is no tile value of this kernel, in this
 * group (or judging one node): a broadcast operand such as canonicalize's cast(bias, f32) of a 16-bit addmm.
 * Loads widen to f32 anyway, so the kernel loads the cast's input instead (evt_lower_member() gives the cast itself no
 * visitor node). */
static bool widening_operand_cast(const lctx *c, int x) {
  const evt_node *xn = &c->g->nodes[x];
  if (c->nbd || xn->op != EVT_OP_CAST || xn->type.dtype != EVT_F32 || c->vid[x] >= 0) return false;
  if (c->group && c->group[x] != c->gi) return false;
  int in = xn->inputs[0];
  return float_dtype(c->g->nodes[in].type.dtype) && c->vid[in] < 0;
}

/* A compile-time scalar: the visitor scalar holding bn's value (one per value). */
int evt_lower_scalar(lctx *c, int v, const evt_node *bn) {
  const double sv = scalar_value(bn);
  for (int i = 0; i < c->s->nnodes; i++)
    if (c->s->nodes[i].op == EVT_V_SCALAR && c->s->nodes[i].value == sv) return i;
  int id = evt_kspec_scalar(c->s, sv);
  if (id < 0) evt_lower_refuse(c, v, "the epilogue needs more than %d visitor nodes", EVT_KSPEC_MAX_NODES);
  else c->vt[id] = -1;
  return id;
}

/* A run-time scalar: one element of memory (another kernel's rank-0 result), read by every element. */
static int scalar_load(lctx *c, int v, const evt_node *xn, const evt_node *bn, int base) {
  if (evt_type_numel(&bn->type) != 1) {
    evt_lower_refuse(c, v, "operand %%%s broadcasts one element of a larger tensor", xn->name);
    return -1;
  }
  if (!evt_vop_storage_ok(EVT_V_SCALAR_LOAD, bn->type.dtype, !c->row)) {
    evt_lower_refuse(c, v, "operand %%%s: a run-time scalar of dtype %s (scalar loads take bf16, f16, f32%s)", xn->name,
           evt_dtype_name(bn->type.dtype), c->row ? ", bool" : "");
    return -1;
  }
  if (bn->op == EVT_OP_RAND) {
    evt_lower_refuse(c, v, "operand %%%s: rand is generated in-kernel and the visitor has no RNG node", xn->name);
    return -1;
  }
  for (int i = 0; i < c->s->nnodes; i++)
    if (c->s->nodes[i].op == EVT_V_SCALAR_LOAD && c->vt[i] == base) return i;
  char name[24];
  snprintf(name, sizeof name, "k%d", c->nload[3]++);
  return evt_lower_add_node(c, v, EVT_V_SCALAR_LOAD, -1, -1, bn->type.dtype, name, base);
}

/* A rand operand, drawn in the kernel: element (i, j) of a dense M x N rand is Philox counter i*N+j. */
static int rand_operand(lctx *c, int v, const evt_node *xn, const evt_node *bn, evt_vop op) {
  if (!c->row) {
    evt_lower_refuse(c, v, "operand %%%s: rand in a GEMM epilogue (a row kernel draws it)", xn->name);
    return -1;
  }
  if (op != EVT_V_AUX_LOAD || !float_dtype(bn->type.dtype)) {
    evt_lower_refuse(c, v, "operand %%%s: a rand that is not a dense %lldx%lld float tile", xn->name, (long long)c->m,
                     (long long)c->n);
    return -1;
  }
  for (int i = 0; i < c->s->nnodes; i++) {
    const evt_vnode *r = &c->s->nodes[i];
    if (r->op == EVT_V_RAND && r->seed == (uint64_t)bn->attr.seed && r->offset == (uint64_t)bn->attr.offset &&
        r->dtype == bn->type.dtype)
      return i;
  }
  int id = evt_lower_add_node(c, v, EVT_V_RAND, -1, -1, bn->type.dtype, NULL, -1); /* no memory */
  if (id >= 0) {
    c->s->nodes[id].seed = (uint64_t)bn->attr.seed;
    c->s->nodes[id].offset = (uint64_t)bn->attr.offset;
  }
  return id;
}

/* A load of kind op (aux tile, row or column broadcast) of base's memory, or the row nucleus's own input. */
static int load(lctx *c, int v, const evt_node *xn, const evt_node *bn, int base, evt_vop op, int64_t extent) {
  if (!evt_vop_storage_ok(op, bn->type.dtype, !c->row)) {
    evt_lower_refuse(c, v, "operand %%%s has dtype %s (loads take bf16, f16, f32%s)", xn->name,
                     evt_dtype_name(bn->type.dtype), c->row ? " or bool" : "");
    return -1;
  }
  size_t es = evt_dtype_size(bn->type.dtype);
  if (!c->row && (extent * (int64_t)es) % 16) { /* TMA; row kernels fall back to element accesses */
    evt_lower_refuse(c, v, "operand %%%s: %lld-byte rows are not 16-byte aligned", xn->name,
                     (long long)(extent * (int64_t)es));
    return -1;
  }
  for (int k = 0; op == EVT_V_AUX_LOAD && c->row && k < c->nrin; k++) {
    if (c->rin[k] != base) continue;
    evt_row_value sel = k == 0 ? EVT_RV_IN0 : EVT_RV_IN1;
    for (int i = 0; i < c->s->nnodes; i++)
      if (c->s->nodes[i].op == EVT_V_ACC && c->accsel[i] == sel) return i;
    int id = evt_lower_add_node(c, v, EVT_V_ACC, -1, -1, EVT_F32, NULL, -1);
    if (id >= 0) c->accsel[id] = sel;
    return id;
  }
  for (int i = 0; i < c->s->nnodes; i++)
    if (c->s->nodes[i].op == op && c->vt[i] == base) return i;
  char name[24];
  int kind = op == EVT_V_AUX_LOAD ? 0 : op == EVT_V_ROW_BCAST ? 1 : 2;
  snprintf(name, sizeof name, "%c%d", "arc"[kind], c->nload[kind]++);
  return evt_lower_add_node(c, v, op, -1, -1, bn->type.dtype, name, base);
}

int evt_lower_operand(lctx *c, int v, int x, const evt_type *out) {
  while (widening_operand_cast(c, x)) x = c->g->nodes[x].inputs[0];
  if (c->nbd && c->vid[x] >= 0 && c->alias && c->alias[x] >= 0) {
    evt_lower_refuse(c, v, "reads %%%s, a view of the batched tile in another element order (only stores take views)",
           c->g->nodes[x].name);
    return -1;
  }
  if (c->vid[x] >= 0) return c->vid[x];
  if (c->nbd) return evt_lower_operand_batched(c, v, x, out);
  const evt_graph *g = c->g;
  const evt_node *xn = &g->nodes[x];
  bool one = evt_type_numel(out) == 1; /* a value computed alike for every element (rank 0 in a larger space) */
  int s = one ? out->rank : tile_split(out, c->m, c->n);
  if (s < 0) {
    char tb[96];
    evt_lower_refuse(c, v, "shape %s is not a split of the %lldx%lld %s", evt_type_str(out, tb, sizeof tb),
                     (long long)c->m, (long long)c->n, c->row ? "row space" : "tile");
    return -1;
  }
  int64_t xs[EVT_MAX_RANK], bs[EVT_MAX_RANK];
  int base = x;
  if (!evt_lower_mem_strides(g, c->group, -1, x, xs, &base)) {
    evt_lower_refuse(c, v, "operand %%%s: a reshape of a non-contiguous view", xn->name);
    return -1;
  }
  const evt_node *bn = &g->nodes[base];
  /* numpy broadcast of x over out */
  for (int i = 0; i < out->rank; i++) {
    int j = i - (out->rank - xn->type.rank);
    bs[i] = (j < 0 || xn->type.shape[j] == 1) ? 0 : xs[j];
  }
  bool m0 = dense(out->shape, bs, 0, s, 0), n0 = dense(out->shape, bs, s, out->rank, 0);
  bool mv = dense(out->shape, bs, 0, s, 1), mt = dense(out->shape, bs, 0, s, c->n);
  bool nd = dense(out->shape, bs, s, out->rank, 1);
  evt_vop op;
  int64_t extent;
  if (m0 && n0 && bn->op != EVT_OP_SCALAR && bn->op != EVT_OP_FULL) return scalar_load(c, v, xn, bn, base);
  if (one && !(m0 && n0)) {
    evt_lower_refuse(c, v, "operand %%%s of a rank-0 value is not a scalar", xn->name);
    return -1;
  }
  if (m0 && n0) return evt_lower_scalar(c, v, bn);
  if (!c->group && mt && nd && bn->op != EVT_OP_INPUT && bn->op != EVT_OP_PARAM && bn->op != EVT_OP_RAND) {
    op = EVT_V_AUX_LOAD; /* judging one node: a tile value, fused or loaded */
    extent = c->n;
  } else if (mt && nd) op = EVT_V_AUX_LOAD, extent = c->n;
  else if (m0 && nd) op = EVT_V_ROW_BCAST, extent = c->n;
  else if (mv && n0) op = EVT_V_COL_BCAST, extent = c->m;
  else {
    evt_lower_refuse(
        c, v, "operand %%%s is not a broadcast of the %lldx%lld tile (strides do not match a tile, row or column)",
        xn->name, (long long)c->m, (long long)c->n);
    return -1;
  }
  if (bn->op == EVT_OP_RAND) return rand_operand(c, v, xn, bn, op);
  return load(c, v, xn, bn, base, op, extent);
}

/* Is member v read outside its group, or a graph output? (false when judging one node: the partitioner
 * decides that.) */
static bool leaves_group(const lctx *c, int v) {
  if (!c->group) return false;
  if (c->g->nodes[v].flags & EVT_NODE_OUTPUT) return true;
  for (int w = v + 1; w < c->g->nnodes; w++)
    if (c->group[w] != c->gi)
      for (int k = 0; k < c->g->nodes[w].ninputs; k++)
        if (c->g->nodes[w].inputs[k] == v) return true;
  return false;
}

static bool member_uses_in_group(const lctx *c, int v) {
  if (!c->group) return false;
  for (int w = v + 1; w < c->g->nnodes; w++)
    if (c->group[w] == c->gi)
      for (int k = 0; k < c->g->nodes[w].ninputs; k++)
        if (c->g->nodes[w].inputs[k] == v) return true;
  return false;
}

/* The member's dtype: floats and bools; integers only in row kernels, through a few exact ops. */
static bool member_dtype_ok(lctx *c, int v) {
  const evt_node *nd = &c->g->nodes[v];
  const evt_type *t = &nd->type;
  bool int_ok = c->row && (nd->op == EVT_OP_WHERE || nd->op == EVT_OP_ADD || nd->op == EVT_OP_SUB ||
                           nd->op == EVT_OP_MUL || nd->op == EVT_OP_NEG || nd->op == EVT_OP_ABS ||
                           nd->op == EVT_OP_MAXIMUM || nd->op == EVT_OP_MINIMUM || is_view_op(nd->op));
  bool fp8_ok = c->row && nd->op == EVT_OP_CAST; /* row kernels store fp8 casts (saturating RNE) */
  if (!float_dtype(t->dtype) && t->dtype != EVT_BOOL && !((t->dtype == EVT_I64 || t->dtype == EVT_I32) && int_ok) &&
      !(evt_dtype_is_fp8(t->dtype) && fp8_ok))
    return evt_lower_refuse(
        c, v, "dtype %s (the epilogue computes bf16/f16/f32 values and bools as 0/1%s)", evt_dtype_name(t->dtype),
        c->row ? "; integers only through where / add / sub / mul / neg / abs / maximum / minimum; fp8 only as a "
                 "cast's stored value"
               : "; fp8 values only in row kernels and as GEMM operands");
  return true;
}

/* Batched epilogues: a member view only changes where a store writes the tile (c->alias); nothing else may read
 * it, and every other member has the tile's shape. 1: v is a view (done), 0: refused, -1: go on. */
static int batched_view(lctx *c, int v) {
  const evt_graph *g = c->g;
  const evt_node *nd = &g->nodes[v];
  const evt_type *t = &nd->type;
  if (is_view_op(nd->op)) {
    int x = nd->inputs[0];
    if (c->vid[x] < 0) return evt_lower_refuse(c, v, "view of a value that is not a tile value of this kernel");
    c->vid[v] = c->vid[x];
    c->alias[v] = x; /* the same values; only a store of v writes them in v's order */
    return true;
  }
  for (int k = 0; k < nd->ninputs; k++)
    if (c->vid[nd->inputs[k]] >= 0 && c->alias[nd->inputs[k]] >= 0)
      return evt_lower_refuse(
          c, v, "reads %%%s, a view of the batched tile in another element order (only stores take views)",
          g->nodes[nd->inputs[k]].name);
  if (nd->op != EVT_OP_SUM && !same_shape(t, c->bt)) {
    char tb[96], bb[96];
    return evt_lower_refuse(c, v, "shape %s is not the batched tile %s", evt_type_str(t, tb, sizeof tb),
                            evt_type_str(c->bt, bb, sizeof bb));
  }
  return -1;
}

/* The visitor compute of an elementwise op, or EVT_V_COUNT. */
static evt_vop compute_op(const evt_node *nd) {
  switch (nd->op) {
  case EVT_OP_ADD: return EVT_V_ADD;
  case EVT_OP_SUB: return EVT_V_SUB;
  case EVT_OP_MUL: return EVT_V_MUL;
  case EVT_OP_DIV: return EVT_V_DIV;
  case EVT_OP_RELU: return EVT_V_RELU;
  case EVT_OP_SIGMOID: return EVT_V_SIGMOID;
  case EVT_OP_NEG: return EVT_V_NEG;
  case EVT_OP_EXP: return EVT_V_EXP;
  case EVT_OP_LOG: return EVT_V_LOG;
  case EVT_OP_ERF: return EVT_V_ERF;
  case EVT_OP_TANH: return EVT_V_TANH;
  case EVT_OP_SQRT: return EVT_V_SQRT;
  case EVT_OP_RSQRT: return EVT_V_RSQRT;
  case EVT_OP_RECIPROCAL: return EVT_V_RECIPROCAL;
  case EVT_OP_ABS: return EVT_V_ABS;
  case EVT_OP_SIGN: return EVT_V_SIGN;
  case EVT_OP_MAXIMUM: return EVT_V_MAXIMUM;
  case EVT_OP_MINIMUM: return EVT_V_MINIMUM;
  case EVT_OP_EQ: return EVT_V_EQ;
  case EVT_OP_NE: return EVT_V_NE;
  case EVT_OP_LT: return EVT_V_LT;
  case EVT_OP_LE: return EVT_V_LE;
  case EVT_OP_GT: return EVT_V_GT;
  case EVT_OP_GE: return EVT_V_GE;
  case EVT_OP_WHERE: return EVT_V_WHERE;
  case EVT_OP_GELU: return nd->attr.approximate == EVT_APPROXIMATE_TANH ? EVT_V_GELU_TANH : EVT_V_GELU_ERF;
  case EVT_OP_GELU_BACKWARD:
    return nd->attr.approximate == EVT_APPROXIMATE_TANH ? EVT_V_GELU_TANH_GRAD : EVT_V_GELU_ERF_GRAD;
  default: return EVT_V_COUNT;
  }
}

static bool member_one_hot(lctx *c, int v) {
  const evt_graph *g = c->g;
  const evt_node *nd = &g->nodes[v];
  const evt_type *t = &nd->type;
  /* one_hot(idx [...]) -> [..., C]: the row space is [numel(idx), C]; idx is a dense M-vector of classes */
  int x = nd->inputs[0];
  const evt_type *xt = &g->nodes[x].type;
  int64_t st[EVT_MAX_RANK];
  int base;
  if (!c->row) return evt_lower_refuse(c, v, "one_hot in a GEMM epilogue (a row-kernel visitor only)");
  if (t->rank < 1 || t->shape[t->rank - 1] != c->n || evt_type_numel(xt) != c->m)
    return evt_lower_refuse(c, v, "one_hot over %lld classes is not the %lldx%lld row space",
                            (long long)(t->rank ? t->shape[t->rank - 1] : 0), (long long)c->m, (long long)c->n);
  if (!evt_lower_mem_strides(g, c->group, -1, x, st, &base) || !dense(xt->shape, st, 0, xt->rank, 1))
    return evt_lower_refuse(c, v, "one_hot of %%%s: the class indices are not a dense vector in memory",
                            g->nodes[x].name);
  if (c->vid[x] >= 0 || !evt_vop_storage_ok(EVT_V_ONE_HOT, g->nodes[base].type.dtype, 0))
    return evt_lower_refuse(c, v, "one_hot of %%%s: class indices must be an i64/i32 tensor in memory",
                            g->nodes[x].name);
  for (int i = 0; i < c->s->nnodes; i++)
    if (c->s->nodes[i].op == EVT_V_ONE_HOT && c->vt[i] == base) return (c->vid[v] = i), true;
  char name[24];
  snprintf(name, sizeof name, "h%d", c->nload[4]++);
  c->vid[v] = evt_lower_add_node(c, v, EVT_V_ONE_HOT, -1, -1, g->nodes[base].type.dtype, name, base);
  return c->vid[v] >= 0;
}

/* A cast: to bool as x != 0, a widened broadcast operand (its users load its input), a rounding to 16 bits used
 * in the group. 1 / 0: done (true / false); -1: an identity on the f32 value. */
static int member_cast(lctx *c, int v) {
  const evt_graph *g = c->g;
  const evt_node *nd = &g->nodes[v];
  const evt_type *t = &nd->type;
  int in[3] = {-1, -1, -1};
  evt_dtype from = g->nodes[nd->inputs[0]].type.dtype;
  bool from_int = from == EVT_I64 || from == EVT_I32;
  if (!float_dtype(from) && from != EVT_BOOL && !((from_int || evt_dtype_is_fp8(from)) && c->row))
    return evt_lower_refuse(c, v, "cast from %s", evt_dtype_name(from));
  if (evt_dtype_is_fp8(t->dtype) && member_uses_in_group(c, v))
    return evt_lower_refuse(c, v, "a cast to %s read inside the kernel (only a store rounds to fp8)",
                            evt_dtype_name(t->dtype));
  if (t->dtype == EVT_BOOL && from != EVT_BOOL) { /* x != 0 as 0/1 */
    evt_vop op = EVT_V_NE;
    in[0] = evt_lower_operand(c, v, nd->inputs[0], t);
    if (in[0] < 0) return false;
    in[1] = -1;
    for (int i = 0; i < c->s->nnodes && in[1] < 0; i++)
      if (c->s->nodes[i].op == EVT_V_SCALAR && c->s->nodes[i].value == 0) in[1] = i;
    if (in[1] < 0 && (in[1] = evt_kspec_scalar(c->s, 0.0)) < 0)
      return evt_lower_refuse(c, v, "the epilogue needs more than %d visitor nodes", EVT_KSPEC_MAX_NODES);
    c->vt[in[1]] = -1;
    int id = evt_lower_add_node(c, v, op, in[0], in[1], EVT_F32, NULL, -1);
    c->vid[v] = id;
    return id >= 0;
  }
  /* a broadcast operand widened to f32 (not tile-shaped): its users load the cast's input */
  if (widening_operand_cast(c, v) && !c->nbd && evt_type_numel(t) != 1 && tile_split(t, c->m, c->n) < 0) {
    if (leaves_group(c, v))
      return evt_lower_refuse(c, v, "a widened broadcast operand leaves the kernel (stores write whole tiles)");
    return true;
  }
  /* a bool's 0/1 is exact in every float type; a cast to 16 bits whose value is used inside the group
   * rounds there (round_bf16 / round_f16, still f32); one only stored is rounded by its store */
  if ((t->dtype == EVT_BF16 || t->dtype == EVT_F16) && from != EVT_BOOL && !from_int && from != t->dtype &&
      member_uses_in_group(c, v)) {
    int xi = evt_lower_operand(c, v, nd->inputs[0], t);
    if (xi < 0) return false;
    c->vid[v] =
        evt_lower_add_node(c, v, t->dtype == EVT_BF16 ? EVT_V_ROUND_BF16 : EVT_V_ROUND_F16, xi, -1, EVT_F32, NULL, -1);
    return c->vid[v] >= 0;
  }
  return -1;
}

/* A view (or a cast that is an identity on the f32 value): the tile value of its input, or its input loaded. */
static bool member_identity(lctx *c, int v) {
  const evt_graph *g = c->g;
  const evt_node *nd = &g->nodes[v];
  const evt_type *t = &nd->type;
  int x = nd->inputs[0];
  if (c->vid[x] < 0) {
    const evt_node *xn = &g->nodes[x];
    /* (a mean is a sum of scaled values here: a batch norm's [1,1,1,C] mean leaves as the saved [C] mean) */
    if (nd->op != EVT_OP_CAST && c->group && c->group[x] == c->gi &&
        (xn->op == EVT_OP_SUM || xn->op == EVT_OP_MEAN || xn->op == EVT_OP_AMAX) && !member_uses_in_group(c, v))
      return true; /* the reduction's output seen through a view that leaves: add_stores binds its store there */
    if (nd->op != EVT_OP_CAST) return evt_lower_refuse(c, v, "view of a value that is not a tile value of this kernel");
    c->vid[v] = evt_lower_operand(c, v, x, t);
    return c->vid[v] >= 0;
  }
  if (evt_type_numel(t) != c->m * c->n || tile_split(t, c->m, c->n) < 0)
    return evt_lower_refuse(c, v, "view changes the tile's element order");
  c->vid[v] = c->vid[x];
  return true;
}

/* A sum / mean / amax over the tile's M dims (row_sum) or N dims (col_sum, col_max). An amax is a max within
 * rows only (col_max: row kernels, and unbatched GEMM epilogues, whose CTAs meet in f32 atomic maxima); a
 * whole-tensor amax reaches the lowering split by the decomposition into a max within rows and a max of the
 * resulting M-vector (a kernel of its own). */
static bool member_reduce(lctx *c, int v) {
  const evt_graph *g = c->g;
  const evt_node *nd = &g->nodes[v];
  const evt_type *t = &nd->type;
  bool mx = nd->op == EVT_OP_AMAX;
  if (c->nbd && mx)
    return evt_lower_refuse(c, v, "amax in a batched GEMM epilogue (row kernels take a max within rows)");
  if (c->nbd && nd->op == EVT_OP_MEAN) return evt_lower_refuse(c, v, "mean in a batched GEMM epilogue");
  if (c->nbd) return evt_lower_sum_batched(c, v);
  int x = nd->inputs[0];
  const evt_type *xt = &g->nodes[x].type;
  int s = tile_split(xt, c->m, c->n);
  if (s < 0) return evt_lower_refuse(c, v, "input is not a split of the tile");
  int xv = evt_lower_operand(c, v, x, xt); /* a member's value, or a tile loaded from memory */
  if (xv < 0) return false;
  bool rd[EVT_MAX_RANK] = {0};
  if (nd->attr.dims.n == 0)
    for (int i = 0; i < xt->rank; i++) rd[i] = true;
  for (int i = 0; i < nd->attr.dims.n; i++)
    rd[nd->attr.dims.v[i] < 0 ? nd->attr.dims.v[i] + xt->rank : nd->attr.dims.v[i]] = true;
  if (nd->op == EVT_OP_MEAN) { /* Σ (x · 1/count): the visitor's sums are stores, so the scale goes first */
    int64_t cnt = 1;
    for (int i = 0; i < xt->rank; i++)
      if (rd[i]) cnt *= xt->shape[i];
    if (cnt <= 0) return evt_lower_refuse(c, v, "mean over an empty dim");
    int sc = evt_kspec_scalar(c->s, 1.0 / (double)cnt);
    if (sc < 0) return evt_lower_refuse(c, v, "the epilogue needs more than %d visitor nodes", EVT_KSPEC_MAX_NODES);
    c->vt[sc] = -1;
    xv = evt_lower_add_node(c, v, EVT_V_MUL, xv, sc, EVT_F32, NULL, -1);
    if (xv < 0) return false;
  }
  bool over_m = true, over_n = true; /* reduces exactly the (non-unit) M dims / N dims */
  for (int i = 0; i < xt->rank; i++) {
    if (xt->shape[i] == 1) continue;
    if ((i < s) != rd[i]) over_m = false;
    if ((i >= s) != rd[i]) over_n = false;
  }
  if (over_m && over_n) over_n = mx; /* a 1xN or Mx1 tile: prefer Σ over M (max: over N, within rows) */
  if (over_m && over_n) over_m = false;
  if (!over_m && !over_n)
    return evt_lower_refuse(
        c, v, "%s over dims that are neither the %s's M dims nor its N dims (visitor has row and column %s only)",
        mx ? "amax" : "sum", c->row ? "row space" : "tile", mx ? "maxima" : "sums");
  if (mx && over_m)
    return evt_lower_refuse(c, v, "amax over rows (the visitor takes a max within rows, over the last dim)");
  if (!c->row && t->dtype != EVT_F32)
    return evt_lower_refuse(
        c, v,
        "%s into %s: CTAs of a GEMM %s with f32 atomics, so the %s's tensor must be f32 (row kernels round "
        "once at the store)",
        mx ? "amax" : "sum", evt_dtype_name(t->dtype), mx ? "take the max of partial maxima" : "add partial sums",
        mx ? "amax" : "sum");
  if (!float_dtype(t->dtype))
    return evt_lower_refuse(c, v, "%s into %s", mx ? "amax" : "sum", evt_dtype_name(t->dtype));
  char name[24];
  if (mx) snprintf(name, sizeof name, "cm%d", c->ncsum++);
  else if (over_m) snprintf(name, sizeof name, "rs%d", c->nrsum++);
  else snprintf(name, sizeof name, "cs%d", c->ncsum++);
  int id = evt_lower_add_node(c, v,
                              mx       ? EVT_V_COL_MAX
                              : over_m ? EVT_V_ROW_SUM
                                       : EVT_V_COL_SUM,
                              xv, -1, t->dtype, name, v);
  if (id < 0) return false;
  c->vid[v] = -1;
  return true;
}

/* An elementwise compute over the member's operands. */
static bool member_compute(lctx *c, int v, evt_vop op) {
  const evt_node *nd = &c->g->nodes[v];
  const evt_type *t = &nd->type;
  int in[3] = {-1, -1, -1};
  int ar = evt_vop_arity(op);
  for (int k = 0; k < nd->ninputs && k < ar; k++) {
    in[k] = evt_lower_operand(c, v, nd->inputs[k], t);
    if (in[k] < 0) return false;
  }
  int id = evt_kspec_add3(c->s, op, in[0], ar > 1 ? in[1] : -1, ar > 2 ? in[2] : -1, EVT_F32, NULL);
  if (id < 0) return evt_lower_refuse(c, v, "the epilogue needs more than %d visitor nodes", EVT_KSPEC_MAX_NODES);
  c->vt[id] = -1;
  c->vid[v] = id;
  return true;
}

bool evt_lower_member(lctx *c, int v) {
  const evt_node *nd = &c->g->nodes[v];
  if (!member_dtype_ok(c, v)) return false;
  if (c->nbd && c->alias) {
    int r = batched_view(c, v);
    if (r >= 0) return r;
  }
  switch (nd->op) {
  case EVT_OP_ONE_HOT: return member_one_hot(c, v);
  case EVT_OP_THRESHOLD_BACKWARD:
    if (nd->attr.value != 0) return evt_lower_refuse(c, v, "threshold %g (relu_grad thresholds at 0)", nd->attr.value);
    return member_compute(c, v, EVT_V_RELU_GRAD);
  case EVT_OP_CAST: {
    int r = member_cast(c, v);
    return r >= 0 ? r : member_identity(c, v);
  }
  case EVT_OP_RESHAPE: case EVT_OP_SQUEEZE: case EVT_OP_UNSQUEEZE: return member_identity(c, v);
  case EVT_OP_SUM: case EVT_OP_MEAN: case EVT_OP_AMAX: return member_reduce(c, v);
  default: {
    evt_vop op = compute_op(nd);
    if (op == EVT_V_COUNT) return evt_lower_refuse(c, v, "no visitor node for %s", evt_op_table[nd->op].name);
    return member_compute(c, v, op);
  }
  }
}

void evt_lower_members(lctx *c, int skip1, int skip2) {
  const evt_graph *g = c->g;
  for (int v = 0; v < g->nnodes && c->bad < 0; v++) {
    if (c->group[v] != c->gi || v == c->nu || v == skip1 || v == skip2) continue;
    const evt_node *vn = &g->nodes[v];
    if ((vn->op == EVT_OP_PERMUTE || vn->op == EVT_OP_TRANSPOSE) && !c->nbd) {
      evt_lower_refuse(c, v, "a permute inside an epilogue (only GEMM operands absorb permutes, as layouts)");
      break;
    }
    evt_lower_member(c, v);
  }
}

/* The members that leave group gi (read outside it, or graph outputs): leaves[v] = 1. */
static unsigned char *leaving(const lctx *c) {
  const evt_graph *g = c->g;
  const int *group = c->group;
  int gi = c->gi, n = g->nnodes;
  unsigned char *leaves = calloc((size_t)n + 1, 1);
  EVT_ASSERT(leaves);
  for (int v = 0; v < n; v++)
    if (group[v] == gi && (g->nodes[v].flags & EVT_NODE_OUTPUT)) leaves[v] = 1;
  for (int w = 0; w < n; w++)
    for (int k = 0; k < g->nodes[w].ninputs; k++) {
      int u = g->nodes[w].inputs[k];
      if (group[u] == gi && group[w] != gi) leaves[u] = 1;
    }
  return leaves;
}

/* A leaving reshape / squeeze / unsqueeze of another leaving member is the same bytes (stores write row-major
 * tiles): it is not stored again but shares its base's memory (leaves[v] = 3). Not for a graph output (the caller
 * gives it memory of its own). */
static void share_view_memory(const lctx *c, evt_lowered *L, unsigned char *leaves) {
  const evt_graph *g = c->g;
  const int *group = c->group;
  int gi = c->gi, n = g->nnodes;
  for (int v = 0; v < n; v++) {
    if (group[v] != gi || leaves[v] != 1 || c->vid[v] < 0 || (g->nodes[v].flags & EVT_NODE_OUTPUT)) continue;
    int u = v;
    while (group[u] == gi && g->nodes[u].ninputs == 1 &&
           (g->nodes[u].op == EVT_OP_RESHAPE || g->nodes[u].op == EVT_OP_SQUEEZE || g->nodes[u].op == EVT_OP_UNSQUEEZE))
      u = g->nodes[u].inputs[0];
    if (u == v || group[u] != gi || leaves[u] != 1 || c->vid[u] != c->vid[v] ||
        g->nodes[u].type.dtype != g->nodes[v].type.dtype || L->nalias >= EVT_LOWER_MAX_ALIAS)
      continue;
    L->alias_view[L->nalias] = v;
    L->alias_base[L->nalias++] = u;
    leaves[v] = 3; /* shares u's memory */
  }
}

/* A sum that does not leave itself is bound to the leaving view of it (leaves[w] = 2). */
static void bind_sum_views(const lctx *c, evt_lowered *L, unsigned char *leaves) {
  const evt_graph *g = c->g;
  const int *group = c->group;
  int gi = c->gi, n = g->nnodes;
  for (int i = 0; i < c->s->nnodes; i++) {
    evt_vop op = c->s->nodes[i].op;
    if (op != EVT_V_ROW_SUM && op != EVT_V_COL_SUM && op != EVT_V_COL_MAX) continue;
    int v = L->vtensor[i];
    if (leaves[v]) continue;
    for (int w = v + 1; w < n; w++)
      if (group[w] == gi && leaves[w] && g->nodes[w].ninputs == 1 && g->nodes[w].inputs[0] == v &&
          is_view_op(g->nodes[w].op)) {
        L->vtensor[i] = w;
        leaves[w] = 2; /* bound */
        break;
      }
  }
}

/* A second view of a reduction (log-softmax's row max, read as [M] and as [M, 1]) that leaves beside the
 * reduction: the same reduction once more into the view's tensor (a view holds the reduction's values in its
 * order). false when refused. */
static bool second_reduction_view(lctx *c, evt_lowered *L, int v) {
  const evt_graph *g = c->g;
  bool bound = false;
  for (int i = 0; i < c->s->nnodes; i++) bound |= L->vtensor[i] == v;
  if (bound) return true;
  int r = -1, src = v;
  while (src >= 0 && is_view_op(g->nodes[src].op) && g->nodes[src].ninputs == 1) src = g->nodes[src].inputs[0];
  for (int i = 0; src >= 0 && i < c->s->nnodes && r < 0; i++) {
    evt_vop op = c->s->nodes[i].op;
    if ((op == EVT_V_ROW_SUM || op == EVT_V_COL_SUM || op == EVT_V_COL_MAX) && c->vt[i] >= 0 &&
        (c->vt[i] == src || (is_view_op(g->nodes[c->vt[i]].op) && g->nodes[c->vt[i]].inputs[0] == src)))
      r = i;
  }
  if (r < 0 || evt_type_numel(&g->nodes[v].type) != evt_type_numel(&g->nodes[c->vt[r]].type) ||
      g->nodes[v].type.dtype != c->s->nodes[r].dtype) {
    evt_lower_refuse(c, v, "a second view of a reduction leaves the group");
    return false;
  }
  const evt_vnode rn = c->s->nodes[r];
  char name[24];
  if (rn.op == EVT_V_COL_MAX) snprintf(name, sizeof name, "cm%d", c->ncsum++);
  else if (rn.op == EVT_V_ROW_SUM) snprintf(name, sizeof name, "rs%d", c->nrsum++);
  else snprintf(name, sizeof name, "cs%d", c->ncsum++);
  evt_lower_add_node(c, v, rn.op, rn.in[0], -1, rn.dtype, name, v);
  return true;
}

static bool d_dtype(evt_dtype dt) { return dt == EVT_BF16 || dt == EVT_F16 || dt == EVT_F32; }

/* D: the last value leaving the group whose dtype D can have (bf16, f16, f32), else the last one (the spec check
 * names it); the other leaving values are aux stores (a bool mask, an fp8 cast). -1 when none leaves. */
static int pick_d(const lctx *c, const unsigned char *leaves) {
  int last = -1;
  for (int v = c->g->nnodes - 1; v >= 0; v--) {
    if (c->group[v] != c->gi || leaves[v] != 1 || c->vid[v] < 0) continue;
    if (d_dtype(c->g->nodes[v].type.dtype)) return v;
    if (last < 0) last = v;
  }
  return last;
}

void evt_lower_add_stores(lctx *c, evt_lowered *L, bool want_d, int *dmem) {
  const evt_graph *g = c->g;
  const int *group = c->group;
  int gi = c->gi, n = g->nnodes;
  unsigned char *leaves = leaving(c);
  share_view_memory(c, L, leaves);
  *dmem = want_d ? pick_d(c, leaves) : -1;
  bind_sum_views(c, L, leaves);
  for (int v = 0; v < n && c->bad < 0; v++) {
    if (group[v] != gi || leaves[v] != 1 || c->vid[v] < 0 || v == *dmem) continue;
    if (evt_type_numel(&g->nodes[v].type) != c->m * c->n) {
      evt_lower_refuse(c, v, "a value with %lld elements leaves a kernel over %lldx%lld (stores write whole tiles)",
             (long long)evt_type_numel(&g->nodes[v].type), (long long)c->m, (long long)c->n);
      break;
    }
    char name[24];
    snprintf(name, sizeof name, "s%d", c->nstore++);
    evt_lower_add_node(c, v, EVT_V_AUX_STORE, c->vid[v], -1, g->nodes[v].type.dtype, name, v);
  }
  for (int v = 0; v < n && c->bad < 0; v++) /* a view of a sum that leaves beside the sum itself */
    if (group[v] == gi && leaves[v] == 1 && c->vid[v] < 0 && g->nodes[v].op != EVT_OP_SUM &&
        g->nodes[v].op != EVT_OP_MEAN && g->nodes[v].op != EVT_OP_AMAX) {
      if (!second_reduction_view(c, L, v)) break;
    }
  free(leaves);
}

bool evt_lower_can_fuse(const evt_graph *g, int nucleus, int node, char *why, size_t whylen) {
  if (why && whylen) why[0] = 0;
  if (nucleus < 0 || nucleus >= g->nnodes || node < 0 || node >= g->nnodes) {
    if (why && whylen) snprintf(why, whylen, "bad node id");
    return false;
  }
  const evt_node *nn = &g->nodes[nucleus];
  evt_kspec *s = malloc(sizeof *s);
  int *vid = malloc(((size_t)g->nnodes + 1) * sizeof *vid);
  EVT_ASSERT(s && vid);
  for (int v = 0; v < g->nnodes; v++) vid[v] = -1;
  int vt[EVT_KSPEC_MAX_NODES];
  for (int i = 0; i < EVT_KSPEC_MAX_NODES; i++) vt[i] = -1;
  lctx c = {.g = g,
            .group = NULL,
            .gi = -1,
            .nu = nucleus,
            .s = s,
            .vid = vid,
            .vt = vt,
            .why = why,
            .whylen = whylen,
            .bad = -1};
  evt_kspec_init(s, EVT_LAYOUT_NN, EVT_BF16, EVT_BF16, (evt_tile_config){128, 128, 64, 1, 1, EVT_SCHED_COOPERATIVE});
  int *alias = NULL;
  if (nn->op == EVT_OP_BMM && nn->type.rank >= 3) { /* batched: members judged over the nucleus's [batch..., M, N] */
    alias = malloc(((size_t)g->nnodes + 1) * sizeof *alias);
    EVT_ASSERT(alias);
    for (int v = 0; v < g->nnodes; v++) alias[v] = -1;
    c.nbd = nn->type.rank - 2, c.bt = &nn->type, c.alias = alias;
    s->batched = 1;
  }
  /* a conv's NHWC output is the tile [N*P*Q, O] (dgrad: [N*H*W, C]) */
  bool conv = (nn->op == EVT_OP_CONV2D || nn->op == EVT_OP_CONV2D_BACKWARD_INPUT) && nn->type.rank == 4;
  if (nn->op != EVT_OP_MM && nn->op != EVT_OP_ADDMM && !c.nbd && !conv) {
    evt_lower_refuse(&c, nucleus, "not a GEMM nucleus the kernel spec takes (mm, addmm, bmm, conv2d, its dgrad)");
  } else {
    c.m = conv ? prod(nn->type.shape, 0, 3) : c.nbd ? bmm_batch(&nn->type) * nn->type.shape[c.nbd] : nn->type.shape[0];
    c.n = nn->type.shape[conv ? 3 : c.nbd + 1];
    vid[nucleus] = evt_kspec_add(s, EVT_V_ACC, -1, -1, EVT_F32, NULL);
    if (node != nucleus) {
      const evt_node *vn = &g->nodes[node];
      /* inputs that are tile values of some kernel: fused members or aux loads, either is fine here */
      for (int k = 0; k < vn->ninputs; k++) {
        int x = vn->inputs[k];
        const evt_node *xn = &g->nodes[x];
        if (x == nucleus || vid[x] >= 0 || evt_op_table[xn->op].cls == EVT_CLASS_SOURCE || xn->op == EVT_OP_RAND ||
            source_view(g, x))
          continue; /* (rand: generated in-kernel, judged as an operand) */
        if (evt_type_numel(&xn->type) != c.m * c.n || (!float_dtype(xn->type.dtype) && xn->type.dtype != EVT_BOOL))
          continue;
        char name[24];
        snprintf(name, sizeof name, "p%d", k);
        vid[x] = evt_lower_add_node(&c, x, EVT_V_AUX_LOAD, -1, -1, xn->type.dtype, name, x);
      }
      if ((vn->op == EVT_OP_PERMUTE || vn->op == EVT_OP_TRANSPOSE) && !c.nbd)
        evt_lower_refuse(&c, node, "a permute inside an epilogue (only GEMM operands absorb permutes, as layouts)");
      else evt_lower_member(&c, node);
      /* stores: a tile value leaving the kernel is written with 16-byte aligned rows */
      if (c.bad < 0 && vid[node] >= 0 && (c.n * (int64_t)evt_dtype_size(vn->type.dtype)) % 16)
        evt_lower_refuse(&c, node, "%lld-byte rows are not 16-byte aligned",
                         (long long)(c.n * (int64_t)evt_dtype_size(vn->type.dtype)));
    }
  }
  bool ok = c.bad < 0;
  free(s);
  free(vid);
  free(alias);
  return ok;
}
