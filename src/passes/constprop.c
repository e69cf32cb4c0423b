/* Pass: constant propagation and algebraic simplification (to a fixpoint).
 *
 * Contract: requires a well-formed graph; preserves every output value up to one rounding per rewritten
 * node (x / c becomes x * (1/c), which differs from the division by at most one rounding). Folding is exact
 * at every dtype and in fp64: it only reads constants that hold a value of their dtype (an f16 constant 0.2
 * is not folded: the interpreter stores it as 0.199951171875, an fp64 run reads 0.2), computes as the
 * interpreter does, in double, and stores the result unrounded, which a run rounds to the node's dtype as it
 * stores it (f16 60000 + 60000 stays inf, and inf - 60000 is not folded into 60000). Integer results beyond
 * ±(2^53 - 1), which a double does not hold exactly, are not folded.
 * Constants are `full` and `scalar` nodes. Rules (each only when the result keeps the node's exact type):
 *   op(constants...)                 -> constant       elementwise ops, casts, comparisons, where
 *   sum/mean/amax(constant)          -> constant       (sum: value times the number of reduced elements)
 *   reshape/permute/expand/squeeze/unsqueeze/slice(constant) -> constant
 *   x + 0, 0 + x, x - 0, x * 1, 1 * x, x / 1, neg(neg(x)), cast to own dtype  -> x
 *   x / c                            -> x * (1/c)      c a nonzero float constant
 *   c1 * (c2 * x), c * neg(x), neg(c * x) -> (c1*c2) * x, (-c) * x    scalar constants merge
 *   sum/mean/amax over dims that all have size 1  -> reshape (or x itself with keepdim)
 *   a constant `full` operand of an elementwise op -> `scalar` (as in canonicalize, for constants folded here)
 * Then a compaction drops what became dead. */
#include "passes/passes.h"

#include <math.h>

static bool scalar_const(const evt_graph *g, int id, double *v) {
  return evt_node_is_const(g, id, v) && g->nodes[id].type.rank == 0;
}

/* A constant's value when it is exactly a value of its dtype (what both the rounded and the fp64 run read). */
static bool exact_const(const evt_graph *g, int id, double *v) {
  if (!evt_node_is_const(g, id, v)) return false;
  double r = evt_round_to_dtype(*v, g->nodes[id].type.dtype);
  return r == *v || (isnan(r) && isnan(*v));
}

/* A folded result the node can hold: integers within ±(2^53 - 1), exact in a double. */
static bool foldable(const evt_type *t, double r) {
  return evt_dtype_is_float(t->dtype) || t->dtype == EVT_BOOL || fabs(r) <= EVT_INT_EXACT_MAX;
}

/* The constant of a fold: floats unrounded (see the contract), integers as the node holds them (i32 wraps). */
static int fold_to(evt_graph *g, int id, const evt_type *t, double r) {
  return evt_rw_full(g, id, t, evt_dtype_is_float(t->dtype) ? r : evt_round_to_dtype(r, t->dtype));
}

static bool int_ok(evt_op op) {
  switch (op) {
  case EVT_OP_ADD: case EVT_OP_SUB: case EVT_OP_MUL: case EVT_OP_NEG: case EVT_OP_MAXIMUM: case EVT_OP_MINIMUM:
  case EVT_OP_ABS: case EVT_OP_CAST: case EVT_OP_WHERE: return true;
  default: return false;
  }
}

/* Value of an elementwise op on constant operands, by the interpreter's formulas
 * (src/runtime/interp/elementwise.c); false if this op is not folded. */
static bool apply(const evt_node *n, const double *v, double *out) {
  double a = v[0], b = n->ninputs > 1 ? v[1] : 0;
  switch (n->op) {
  case EVT_OP_NEG: *out = -a; break;
  case EVT_OP_EXP: *out = exp(a); break;
  case EVT_OP_LOG: *out = log(a); break;
  case EVT_OP_SQRT: *out = sqrt(a); break;
  case EVT_OP_RSQRT: *out = 1.0 / sqrt(a); break;
  case EVT_OP_RECIPROCAL: *out = 1.0 / a; break;
  case EVT_OP_ABS: *out = fabs(a); break;
  case EVT_OP_SIGN: *out = isnan(a) ? a : (a > 0) - (a < 0); break;
  case EVT_OP_TANH: *out = tanh(a); break;
  case EVT_OP_SIGMOID: *out = a >= 0 ? 1.0 / (1.0 + exp(-a)) : exp(a) / (1.0 + exp(a)); break;
  case EVT_OP_RELU: *out = a > 0 || isnan(a) ? a : 0; break;
  case EVT_OP_ERF: *out = erf(a); break;
  case EVT_OP_CAST: *out = a; break;
  case EVT_OP_POW: *out = pow(a, n->attr.value); break;
  case EVT_OP_ADD: *out = a + b; break;
  case EVT_OP_SUB: *out = a - b; break;
  case EVT_OP_MUL: *out = a * b; break;
  case EVT_OP_DIV: *out = a / b; break;
  case EVT_OP_MAXIMUM: *out = isnan(a) || isnan(b) ? NAN : a > b ? a : b; break;
  case EVT_OP_MINIMUM: *out = isnan(a) || isnan(b) ? NAN : a < b ? a : b; break;
  case EVT_OP_EQ: *out = a == b; break;
  case EVT_OP_NE: *out = a != b; break;
  case EVT_OP_LT: *out = a < b; break;
  case EVT_OP_LE: *out = a <= b; break;
  case EVT_OP_GT: *out = a > b; break;
  case EVT_OP_GE: *out = a >= b; break;
  case EVT_OP_WHERE: *out = a != 0 ? b : v[2]; break;
  default: return false;
  }
  return true;
}

static bool is_value(const evt_graph *g, int id, double want) {
  double v;
  return evt_node_is_const(g, id, &v) && v == want;
}

/* x stands for node id when x already has id's exact type */
static int same_type_or(const evt_graph *g, int id, int x) {
  return evt_type_equal(&g->nodes[id].type, &g->nodes[x].type) ? x : id;
}

/* The scalar v folded from the constants s1, s2 (-1: none) of dtype-dt arithmetic: an evt_rw_factor when one of them
 * is f32 (a factor of 16-bit math keeps its value unrounded; a dt scalar would round it), else a dt scalar */
static int fold_scalar(evt_graph *g, int at, evt_dtype dt, int s1, int s2, double v) {
  bool f32 = (s1 >= 0 && g->nodes[s1].type.dtype == EVT_F32) || (s2 >= 0 && g->nodes[s2].type.dtype == EVT_F32);
  return f32 ? evt_rw_factor(g, at, dt, v) : evt_rw_scalar(g, at, dt, v);
}

static int simplify(evt_graph *g, int id) {
  const evt_node *n = &g->nodes[id];
  const evt_type *t = &n->type;
  double vals[EVT_MAX_INPUTS];
  bool all_const = n->ninputs > 0;
  for (int k = 0; k < n->ninputs; k++) all_const = all_const && exact_const(g, n->inputs[k], &vals[k]);
  evt_op_class cls = evt_op_table[n->op].cls;

  if (all_const && cls == EVT_CLASS_ELEMENTWISE) {
    double r;
    bool ints = !evt_dtype_is_float(t->dtype) && t->dtype != EVT_BOOL;
    if ((!ints || int_ok(n->op)) && apply(n, vals, &r) && foldable(t, r)) return fold_to(g, id, t, r);
  }
  if (all_const && (n->op == EVT_OP_SUM || n->op == EVT_OP_MEAN || n->op == EVT_OP_AMAX)) {
    double r = vals[0];
    if (n->op == EVT_OP_SUM) r *= (double)(evt_type_numel(&g->nodes[n->inputs[0]].type) / (evt_type_numel(t) ? evt_type_numel(t) : 1));
    if ((evt_dtype_is_float(t->dtype) || n->op != EVT_OP_MEAN) && foldable(t, r)) return fold_to(g, id, t, r);
  }
  if (all_const && cls == EVT_CLASS_LAYOUT && n->op != EVT_OP_CONCAT && n->op != EVT_OP_SLICE_BACKWARD)
    return evt_rw_full(g, id, t, vals[0]);

  int a = n->ninputs > 0 ? n->inputs[0] : -1, b = n->ninputs > 1 ? n->inputs[1] : -1;
  double c;
  switch (n->op) {
  case EVT_OP_ADD:
    if (is_value(g, b, 0)) return same_type_or(g, id, a);
    if (is_value(g, a, 0)) return same_type_or(g, id, b);
    return id;
  case EVT_OP_SUB:
    return is_value(g, b, 0) ? same_type_or(g, id, a) : id;
  case EVT_OP_MUL: {
    if (is_value(g, b, 1)) return same_type_or(g, id, a);
    if (is_value(g, a, 1)) return same_type_or(g, id, b);
    int cs = scalar_const(g, a, &c) ? a : scalar_const(g, b, &c) ? b : -1;
    if (cs < 0 || !evt_dtype_is_float(t->dtype)) return id;
    int x = cs == a ? b : a;
    const evt_node *xn = &g->nodes[x];
    evt_op xop = xn->op;
    int x0 = xn->ninputs > 0 ? xn->inputs[0] : -1, x1 = xn->ninputs > 1 ? xn->inputs[1] : -1;
    evt_dtype dt = t->dtype;
    double c2;
    if (xop == EVT_OP_NEG) {
      int s = fold_scalar(g, id, dt, cs, -1, -c);
      return same_type_or(g, id, evt_rw_binary(g, id, EVT_OP_MUL, x0, s));
    }
    if (xop == EVT_OP_MUL && (scalar_const(g, x0, &c2) || scalar_const(g, x1, &c2))) {
      int y = scalar_const(g, x0, NULL) ? x1 : x0;
      int s = fold_scalar(g, id, dt, cs, y == x0 ? x1 : x0, c * c2);
      return same_type_or(g, id, evt_rw_binary(g, id, EVT_OP_MUL, y, s));
    }
    return id;
  }
  case EVT_OP_DIV:
    if (is_value(g, b, 1)) return same_type_or(g, id, a);
    if (evt_node_is_const(g, b, &c) && c != 0 && evt_dtype_is_float(t->dtype)) {
      evt_type tb = g->nodes[b].type;
      return evt_rw_binary(g, id, EVT_OP_MUL, a, evt_rw_full(g, id, &tb, 1.0 / c));
    }
    return id;
  case EVT_OP_NEG: {
    const evt_node *x = &g->nodes[a];
    if (x->op == EVT_OP_NEG) return x->inputs[0];
    if (x->op == EVT_OP_MUL && evt_dtype_is_float(t->dtype)) {
      int x0 = x->inputs[0], x1 = x->inputs[1];
      evt_dtype dt = t->dtype;
      for (int k = 0; k < 2; k++)
        if (scalar_const(g, k ? x1 : x0, &c)) {
          int s = fold_scalar(g, id, dt, k ? x1 : x0, -1, -c);
          return same_type_or(g, id, evt_rw_binary(g, id, EVT_OP_MUL, k ? x0 : x1, s));
        }
    }
    return id;
  }
  case EVT_OP_CAST:
    return g->nodes[a].type.dtype == t->dtype ? a : id;
  case EVT_OP_SUM:
  case EVT_OP_MEAN:
  case EVT_OP_AMAX: {
    const evt_type *tx = &g->nodes[a].type;
    if (n->attr.dims.n == 0 && tx->rank > 0) return id; /* all dims: not all size 1 in general */
    for (int i = 0; i < n->attr.dims.n; i++) {
      int d = evt_norm_dim(n->attr.dims.v[i], tx->rank);
      if (d < 0 || tx->shape[d] != 1) return id;
    }
    if (evt_type_numel(tx) == 0) return id;
    return evt_rw_reshape(g, id, a, t->rank, t->shape);
  }
  default:
    return id;
  }
}

evt_status evt_pass_constprop(evt_graph *g, evt_pass_stats *st) {
  for (int sweep = 0; sweep < 16; sweep++) {
    int changed = 0;
    for (int id = 0; id < g->nnodes; id++) {
      int folded = evt_rw_fold_operands(g, id);
      if (folded < 0) return EVT_ERR_INTERNAL;
      changed += folded;
      int r = simplify(g, id);
      if (r < 0) return EVT_ERR_INTERNAL;
      if (r == id) continue;
      evt_graph_replace_uses(g, id, r);
      changed++;
    }
    st->rewrites += changed;
    int removed = 0;
    evt_status s = evt_graph_compact(g, &removed);
    st->removed += removed;
    if (s != EVT_OK || !changed) return s;
  }
  return EVT_OK;
}
