/* Pass: loss elimination. Runs after canonicalize (cross_entropy is nll_loss(log_softmax) by then) and
 * before decomposition.
 *
 * Contract: requires a well-formed graph; preserves every output value up to floating-point reassociation,
 * except with EVT_PASS_DROP_LOSS (below). The backward of a loss never needs the loss value, yet in the joint
 * graph it hangs off the forward's full [N, C] log-probabilities. This pass rewrites, for x: [N, C] logits,
 * t: [N] targets, w: [N, 1] the per-row weight dy * (t != ignore_index) (divided by the count of such rows,
 * at least 1, for reduction=mean: a batch where every target is ignored gets gradient 0, as in PyTorch, and
 * loss 0/0 = NaN; dy is per-row for reduction=none):
 *
 *   log_softmax_backward(nll_loss_backward(dy, log_softmax(x), t), log_softmax(x))
 *       -> (softmax(x) - one_hot(t')) * w           t' = where(t != ignore_index, t, 0)
 *   nll_loss(log_softmax(x), t)          (the loss value, kept as a cheap side reduction of x:)
 *       -> sum((logsumexp(x) - sum(one_hot(t') * x, dim 1)) * mask) [/ count]
 *       (when log_softmax(x) is a graph output, materialized anyway, or x is the f32 widening of 16-bit logits
 *       whose rows a row kernel holds: sum(((max(x) - x[t']) - log(max(softmax(x)))) * mask) [/ count], three
 *       row reductions in the softmax kernel's epilogue, ce_loss_one_pass)
 *   bce_with_logits_backward(dy, x, y)   -> (sigmoid(x) - y) * dy [/ numel]
 *   bce_with_logits(x, y)                -> reduce(relu(x) - x*y + log(1 + exp(-|x|)))
 *   mse_loss_backward(dy, x, y)          -> (x - y) * (2 * dy [/ numel])
 *   mse_loss(x, y)                       -> reduce((x - y) * (x - y))
 *
 * So the gradient has no row reduction left (it fuses into the softmax kernel's epilogue) and the log-softmax
 * tensor is no longer materialized. With EVT_PASS_DROP_LOSS (`evtc opt --no-loss`) the graph's loss output
 * is instead replaced by the constant 0 (what the EVT artifact does): the step then no longer reports
 * its loss, and the forward loss reduction is deleted. Ends with a compaction. */
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"

/* x if node lp is log_softmax(x) (or log(softmax(x))) over dim 1 of a rank-2 x; else -1. */
int evt_match_log_softmax(const evt_graph *g, int lp) {
  const evt_node *n = &g->nodes[lp];
  if (n->op == EVT_OP_LOG && g->nodes[n->inputs[0]].op == EVT_OP_SOFTMAX) n = &g->nodes[n->inputs[0]];
  else if (n->op != EVT_OP_LOG_SOFTMAX) return -1;
  const evt_type *t = &g->nodes[n->inputs[0]].type;
  return t->rank == 2 && evt_norm_dim(n->attr.dim, 2) == 1 ? n->inputs[0] : -1;
}

/* The per-row weight w [N,1] and mask (as x's float dtype, [N]) of a softmax cross-entropy, and the safe
 * target t' (ignored rows point at class 0; the mask zeroes them). `node` gives reduction and ignore_index.
 * With reduction=mean w = mask * dy / max(count, 1): 0 when no target counts, as PyTorch's gradient. */
int evt_ce_parts(evt_graph *g, int node, int t, int dy, evt_dtype dt, int *mask, int *safe_target) {
  const evt_node *n = &g->nodes[node];
  int64_t red = n->attr.reduction, ii = n->attr.ignore_index;
  evt_dtype tdt = g->nodes[t].type.dtype;
  int64_t rows = g->nodes[t].type.shape[0];
  int m = evt_rw_binary(g, node, EVT_OP_NE, t, evt_rw_scalar(g, node, tdt, (double)ii));
  *safe_target = evt_rw_where(g, node, m, t, evt_rw_scalar(g, node, tdt, 0));
  int mf = evt_rw_cast(g, node, m, dt);
  *mask = mf;
  if (dy < 0) return -1;
  int w;
  if (red == EVT_REDUCTION_MEAN) { /* count floored at 1: with no target counted every mask is 0, so w = 0, not 0 * inf */
    int count = evt_rw_binary(g, node, EVT_OP_MAXIMUM, evt_rw_reduce(g, node, EVT_OP_SUM, mf, NULL, 0, 0),
                              evt_rw_scalar(g, node, dt, 1.0));
    w = evt_rw_binary(g, node, EVT_OP_MUL, mf, evt_rw_binary(g, node, EVT_OP_DIV, dy, count));
  } else
    w = evt_rw_binary(g, node, EVT_OP_MUL, mf, dy);
  int64_t shape[2] = {rows, 1};
  return evt_rw_reshape(g, node, w, 2, shape);
}

static int ce_grad(evt_graph *g, int id, int x, int t, int dy) {
  const evt_type *tx = &g->nodes[x].type;
  evt_dtype dt = tx->dtype;
  int64_t classes = tx->shape[1];
  int mask, safe;
  int w = evt_ce_parts(g, g->nodes[id].inputs[0], t, dy, dt, &mask, &safe);
  evt_attrs sa = evt_attrs_default;
  sa.dim = 1;
  int sm = evt_rw_op(g, id, EVT_OP_SOFTMAX, &x, 1, &sa, 1ull << EVT_ATTR_DIM);
  int oh = evt_rw_one_hot(g, id, safe, classes, dt);
  return evt_rw_binary(g, id, EVT_OP_MUL, evt_rw_binary(g, id, EVT_OP_SUB, sm, oh), w);
}

/* per-row cross-entropy losses `row` (masked) reduced per the node's reduction: mean over unmasked rows, sum, none */
static int reduce_rows(evt_graph *g, int id, int row, int mask) {
  switch (g->nodes[id].attr.reduction) {
  case EVT_REDUCTION_MEAN:
    return evt_rw_binary(g, id, EVT_OP_DIV, evt_rw_reduce(g, id, EVT_OP_SUM, row, NULL, 0, 0),
                         evt_rw_reduce(g, id, EVT_OP_SUM, mask, NULL, 0, 0));
  case EVT_REDUCTION_SUM: return evt_rw_reduce(g, id, EVT_OP_SUM, row, NULL, 0, 0);
  default: return row;
  }
}

static int ce_loss(evt_graph *g, int id, int x, int t) {
  const evt_type *tx = &g->nodes[x].type;
  evt_dtype dt = tx->dtype;
  int64_t rows = tx->shape[0], classes = tx->shape[1];
  int mask, safe;
  evt_ce_parts(g, id, t, -1, dt, &mask, &safe);
  int one = 1;
  int64_t col[2] = {rows, 1};
  int mx = evt_rw_reduce(g, id, EVT_OP_AMAX, x, &one, 1, 0);
  int e = evt_rw_unary(g, id, EVT_OP_EXP, evt_rw_binary(g, id, EVT_OP_SUB, x, evt_rw_reshape(g, id, mx, 2, col)));
  int lse = evt_rw_binary(g, id, EVT_OP_ADD, evt_rw_unary(g, id, EVT_OP_LOG, evt_rw_reduce(g, id, EVT_OP_SUM, e, &one, 1, 0)), mx);
  int oh = evt_rw_one_hot(g, id, safe, classes, dt);
  int picked = evt_rw_reduce(g, id, EVT_OP_SUM, evt_rw_binary(g, id, EVT_OP_MUL, oh, x), &one, 1, 0);
  return reduce_rows(g, id, evt_rw_binary(g, id, EVT_OP_MUL, evt_rw_binary(g, id, EVT_OP_SUB, lse, picked), mask), mask);
}

/* nll_loss(log_softmax(x), t) in one pass of the softmax kernel (its log-probabilities are materialized
 * anyway, or x is widened from 16 bits: see rewrite): per row, lse(x) - x[t] = (max(x) - x[t]) - log(max(p)),
 * p = softmax(x), all three row reductions of the softmax kernel's epilogue (max(p) = 1 / sum(exp(x - max)) is
 * at least 1/C, so its log is finite, where log(p[t]) underflows to -inf once x[t] is ~88 below the row's max:
 * the loss was inf where PyTorch's is finite). x[t] is a `where` pick, not a product with the one-hot (a padded
 * class has x = the dtype's lowest value). */
static int ce_loss_one_pass(evt_graph *g, int id, int x, int t) {
  const evt_type *tx = &g->nodes[x].type;
  evt_dtype dt = tx->dtype;
  int64_t classes = tx->shape[1];
  int mask, safe;
  evt_ce_parts(g, id, t, -1, dt, &mask, &safe);
  int one = 1;
  evt_attrs sa = evt_attrs_default;
  sa.dim = 1;
  int p = evt_rw_op(g, id, EVT_OP_SOFTMAX, &x, 1, &sa, 1ull << EVT_ATTR_DIM);
  int oh = evt_rw_one_hot(g, id, safe, classes, dt);
  int hit = evt_rw_binary(g, id, EVT_OP_NE, oh, evt_rw_scalar(g, id, dt, 0.0));
  int xt = evt_rw_reduce(g, id, EVT_OP_SUM, evt_rw_where(g, id, hit, x, evt_rw_scalar(g, id, dt, 0.0)), &one, 1, 0);
  int mx = evt_rw_reduce(g, id, EVT_OP_AMAX, x, &one, 1, 0);
  int pm = evt_rw_reduce(g, id, EVT_OP_AMAX, p, &one, 1, 0);
  int row = evt_rw_binary(g, id, EVT_OP_SUB, evt_rw_binary(g, id, EVT_OP_SUB, mx, xt), evt_rw_unary(g, id, EVT_OP_LOG, pm));
  return reduce_rows(g, id, evt_rw_binary(g, id, EVT_OP_MUL, row, mask), mask);
}

/* True when x is the f32 widening of 16-bit logits with rows a row kernel takes (any up to 2^30 classes: past 32768
 * the generated kernel's long-row form, src/codegen/emit_rows.c): the softmax kernel then loads the 16-bit logits once (partition rules: the cast
 * fuses into its load) and the loss is a row sum in its epilogue, where the logsumexp form's max is a
 * reduction that ends its group and its second pass reads a materialized f32 copy of x (bert_large's MLM head
 * after the joint graph moved the log-softmax's recomputation into the backward: 2 GB written and read). */
static bool widened_row(const evt_graph *g, int x) {
  const evt_node *n = &g->nodes[x];
  if (n->op != EVT_OP_CAST || n->ninputs != 1 || n->type.dtype != EVT_F32 || n->type.rank != 2) return false;
  evt_dtype from = g->nodes[n->inputs[0]].type.dtype;
  return (from == EVT_BF16 || from == EVT_F16) && n->type.shape[1] <= ((int64_t)1 << 30);
}

static bool is_output(const evt_graph *g, int id) {
  for (int i = 0; i < g->noutputs; i++)
    if (g->outputs[i] == id) return true;
  return false;
}

/* reduction of an elementwise loss l (shape of x) per the node's reduction attribute */
static int reduce_loss(evt_graph *g, int id, int l) {
  switch (g->nodes[id].attr.reduction) {
  case EVT_REDUCTION_MEAN: return evt_rw_reduce(g, id, EVT_OP_MEAN, l, NULL, 0, 0);
  case EVT_REDUCTION_SUM: return evt_rw_reduce(g, id, EVT_OP_SUM, l, NULL, 0, 0);
  default: return l;
  }
}

/* dy times the 1/numel of a mean reduction (times `factor`) */
static int grad_scale(evt_graph *g, int id, int dy, int x, double factor) {
  evt_dtype dt = g->nodes[x].type.dtype;
  if (g->nodes[id].attr.reduction == EVT_REDUCTION_MEAN) factor /= (double)evt_type_numel(&g->nodes[x].type);
  if (factor == 1.0) return dy;
  return evt_rw_binary(g, id, EVT_OP_MUL, dy, evt_rw_factor(g, id, dt, factor));
}

static int rewrite(evt_graph *g, int id) {
  const evt_node *n = &g->nodes[id];
  int a = n->ninputs > 0 ? n->inputs[0] : -1, b = n->ninputs > 1 ? n->inputs[1] : -1;
  int c = n->ninputs > 2 ? n->inputs[2] : -1;
  switch (n->op) {
  case EVT_OP_LOG_SOFTMAX_BACKWARD: {
    const evt_node *gin = &g->nodes[a];
    if (gin->op != EVT_OP_NLL_LOSS_BACKWARD) return id;
    int x = evt_match_log_softmax(g, b);
    if (x < 0 || evt_norm_dim(n->attr.dim, 2) != 1 || evt_match_log_softmax(g, gin->inputs[1]) != x) return id;
    return ce_grad(g, id, x, gin->inputs[2], gin->inputs[0]);
  }
  case EVT_OP_NLL_LOSS: {
    int x = evt_match_log_softmax(g, a);
    if (x < 0) return id;
    bool from_lp = is_output(g, a) || widened_row(g, x);
    return from_lp ? ce_loss_one_pass(g, id, x, b) : ce_loss(g, id, x, b);
  }
  case EVT_OP_BCE_WITH_LOGITS_BACKWARD: /* (dy, x, y) */
    return evt_rw_binary(g, id, EVT_OP_MUL,
                         evt_rw_binary(g, id, EVT_OP_SUB, evt_rw_unary(g, id, EVT_OP_SIGMOID, b), c),
                         grad_scale(g, id, a, b, 1.0));
  case EVT_OP_BCE_WITH_LOGITS: { /* (x, y) */
    evt_dtype dt = g->nodes[a].type.dtype;
    int sp = evt_rw_unary(g, id, EVT_OP_LOG,
                          evt_rw_binary(g, id, EVT_OP_ADD,
                                        evt_rw_unary(g, id, EVT_OP_EXP, evt_rw_unary(g, id, EVT_OP_NEG, evt_rw_unary(g, id, EVT_OP_ABS, a))),
                                        evt_rw_scalar(g, id, dt, 1.0)));
    int l = evt_rw_binary(g, id, EVT_OP_ADD,
                          evt_rw_binary(g, id, EVT_OP_SUB, evt_rw_unary(g, id, EVT_OP_RELU, a), evt_rw_binary(g, id, EVT_OP_MUL, a, b)), sp);
    return reduce_loss(g, id, l);
  }
  case EVT_OP_MSE_LOSS_BACKWARD: /* (dy, x, y) */
    return evt_rw_binary(g, id, EVT_OP_MUL, evt_rw_binary(g, id, EVT_OP_SUB, b, c), grad_scale(g, id, a, b, 2.0));
  case EVT_OP_MSE_LOSS: {
    int d = evt_rw_binary(g, id, EVT_OP_SUB, a, b);
    return reduce_loss(g, id, evt_rw_binary(g, id, EVT_OP_MUL, d, d));
  }
  default:
    return id;
  }
}

evt_status evt_pass_loss_elim(evt_graph *g, evt_pass_stats *st) {
  int n0 = g->nnodes;
  for (int id = 0; id < n0; id++) {
    int r = rewrite(g, id);
    if (r < 0) return EVT_ERR_INTERNAL;
    if (r == id) continue;
    if (!evt_type_equal(&g->nodes[r].type, &g->nodes[id].type))
      return evt_graph_errorf(g, id, EVT_ERR_INTERNAL, "loss elimination changed the type");
    evt_graph_replace_uses(g, id, r);
    st->rewrites++;
  }
  if ((st->flags & EVT_PASS_DROP_LOSS) && g->loss >= 0) {
    int zero = evt_rw_full(g, g->loss, &g->nodes[g->loss].type, 0.0);
    if (zero < 0) return EVT_ERR_INTERNAL;
    evt_graph_replace_uses(g, g->loss, zero);
    st->rewrites++;
  }
  return evt_graph_compact(g, &st->removed);
}
