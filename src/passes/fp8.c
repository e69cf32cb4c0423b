/* Pass: fp8 (opt-in: evt_options.fp8 = EVT_FP8_TENSORWISE, pass flag EVT_PASS_FP8, `evtc --fp8`). Runs the
 * eligible GEMMs of a training step in FP8 with dynamic per-tensor ("current") scaling.
 *
 * Contract: requires canonicalize's forms (no addmm: its mm is what this pass sees) and the loss ops of the
 * step (it runs before loss elimination). Changes values on purpose (the FP8 recipe); everything that is not
 * an eligible mm keeps its dtype and its math, and a graph without an eligible mm is left unchanged. Rule:
 *   C = mm(A, B)  ->  sA = max(fA) / amax(|A|)   (f32; an amax of 0 gives sA = 1)
 *                     A8 = cast(A * sA, fA), the same for B,
 *                     C  = cast(mm(A8, B8, out_dtype=f32) * (1 / (sA * sB)), C's dtype)
 *   fX = f8e5m2 (max 57344) when operand X is a gradient, else f8e4m3 (max 448).
 * Gradient: a node that depends on a gradient root: a loss op's backward (nll_loss_backward, mse_loss_backward,
 *   bce_with_logits_backward: what autodiff emits for every loss op), an input named tangents_<k> or
 *   in.tangents_<k> (the incoming gradients of PyTorch's backward graph), or autodiff's seed (a constant 1 that
 *   the loss does not depend on).
 * Eligible: a rank-2 mm whose operands have one 16-bit or f32 dtype, whose M, N and K are all >= EVT_FP8_MIN_DIM
 *   and multiples of 16 (FP8 tensor-core tiles; smaller GEMMs gain less than the scaling costs), and that is not
 *   part of the loss layer (the LM head / classifier): its output does not reach the loss or a loss op through
 *   non-product ops only, and neither operand is reached from a loss op or from such a head GEMM through
 *   non-product ops only (the head's backward GEMMs). Product ops: the GEMM, convolution and sparse classes. */
#include "passes/passes.h"

#include <stdlib.h>
#include <string.h>

#define EVT_FP8_MIN_DIM 256
#define EVT_FP8_DIM_MULTIPLE 16

static bool is_product(evt_op op) {
  evt_op_class c = evt_op_table[op].cls;
  return c == EVT_CLASS_GEMM || c == EVT_CLASS_CONV || c == EVT_CLASS_SPARSE;
}

static bool is_loss_backward(evt_op op) {
  return op == EVT_OP_NLL_LOSS_BACKWARD || op == EVT_OP_MSE_LOSS_BACKWARD || op == EVT_OP_BCE_WITH_LOGITS_BACKWARD;
}

/* anc[i]: the loss depends on node i (all false without a loss). */
static void mark_loss_ancestors(const evt_graph *g, bool *anc) {
  if (g->loss < 0) return;
  anc[g->loss] = true;
  for (int i = g->loss; i >= 0; i--)
    for (int k = 0; anc[i] && k < g->nodes[i].ninputs; k++) anc[g->nodes[i].inputs[k]] = true;
}

/* PyTorch's incoming gradients: tangents_<k>, which the torch backend declares as in.tangents_<k>. */
static bool is_tangent(const evt_node *n) {
  const char *s = n->name ? n->name : "";
  if (!strncmp(s, "in.", 3)) s += 3;
  return n->op == EVT_OP_INPUT && !strncmp(s, "tangents_", 9);
}

static bool is_grad_root(const evt_graph *g, int i, const bool *loss_anc) {
  const evt_node *n = &g->nodes[i];
  double v;
  if (is_loss_backward(n->op) || is_tangent(n)) return true;
  return g->loss >= 0 && !loss_anc[i] && evt_node_is_const(g, i, &v) && v == 1.0;
}

/* grad[i]: node i depends on a gradient root (through any op). */
static void mark_gradients(const evt_graph *g, bool *grad) {
  bool *anc = calloc((size_t)g->nnodes + 1, 1);
  if (!anc) evt_fatal(__FILE__, __LINE__, "out of memory");
  mark_loss_ancestors(g, anc);
  for (int i = 0; i < g->nnodes; i++) {
    grad[i] = is_grad_root(g, i, anc);
    for (int k = 0; !grad[i] && k < g->nodes[i].ninputs; k++) grad[i] = grad[g->nodes[i].inputs[k]];
  }
  free(anc);
}

/* head[i]: node i's value reaches the loss or a loss op through non-product ops only (for an mm: the loss
 * layer's forward GEMM). Then near[i]: node i is a loss op, such a GEMM, or computed from one through
 * non-product ops (the operands of the loss layer's backward GEMMs). */
static void mark_loss_layer(const evt_graph *g, bool *head, bool *near) {
  for (int i = g->nnodes - 1; i >= 0; i--) {
    const evt_node *n = &g->nodes[i];
    head[i] = head[i] || i == g->loss || evt_op_table[n->op].cls == EVT_CLASS_LOSS;
    for (int k = 0; head[i] && !is_product(n->op) && k < n->ninputs; k++) head[n->inputs[k]] = true;
  }
  for (int i = 0; i < g->nnodes; i++) {
    const evt_node *n = &g->nodes[i];
    near[i] = evt_op_table[n->op].cls == EVT_CLASS_LOSS || (n->op == EVT_OP_MM && head[i]);
    for (int k = 0; !near[i] && !is_product(n->op) && k < n->ninputs; k++) near[i] = near[n->inputs[k]];
  }
}

static bool dim_ok(int64_t d) { return d >= EVT_FP8_MIN_DIM && d % EVT_FP8_DIM_MULTIPLE == 0; }

static bool eligible(const evt_graph *g, int id, const bool *head, const bool *near) {
  const evt_node *n = &g->nodes[id];
  if (n->op != EVT_OP_MM || head[id]) return false;
  const evt_node *a = &g->nodes[n->inputs[0]], *b = &g->nodes[n->inputs[1]];
  evt_dtype dt = a->type.dtype;
  if (dt != b->type.dtype || !(dt == EVT_F32 || dt == EVT_BF16 || dt == EVT_F16)) return false;
  if (near[n->inputs[0]] || near[n->inputs[1]]) return false;
  return dim_ok(a->type.shape[0]) && dim_ok(a->type.shape[1]) && dim_ok(b->type.shape[1]);
}

/* x scaled into fmt's range and cast to fmt; *scale gets the f32 scale max(fmt) / amax(|x|) (1 if amax is 0). */
static int quantize(evt_graph *g, int at, int x, evt_dtype fmt, int *scale) {
  double max = fmt == EVT_F8E5M2 ? 57344.0 : 448.0;
  int amax = evt_rw_cast(g, at, evt_rw_reduce(g, at, EVT_OP_AMAX, evt_rw_unary(g, at, EVT_OP_ABS, x), NULL, 0, 0),
                         EVT_F32);
  int fmax = evt_rw_scalar(g, at, EVT_F32, max);
  int zero = evt_rw_binary(g, at, EVT_OP_EQ, amax, evt_rw_scalar(g, at, EVT_F32, 0.0));
  *scale = evt_rw_binary(g, at, EVT_OP_DIV, fmax, evt_rw_where(g, at, zero, fmax, amax));
  return evt_rw_cast(g, at, evt_rw_binary(g, at, EVT_OP_MUL, evt_rw_cast(g, at, x, EVT_F32), *scale), fmt);
}

static bool is_transpose(const evt_node *n) {
  return n->op == EVT_OP_PERMUTE && n->type.rank == 2 && n->attr.dims.v[0] == 1 && n->attr.dims.v[1] == 0;
}

/* Operand x quantized: its chain of 2-D transposes peeled, the tensor under them quantized, the fp8 result
 * transposed back when the chain had an odd length (exact: the cast commutes with the permute, the amax is
 * the same), so an operand that is a transposed view stays one and the GEMM reads it as its layout. */
static int quantize_operand(evt_graph *g, int at, int x, evt_dtype fmt, int *scale) {
  bool flip = false;
  for (; is_transpose(&g->nodes[x]); x = g->nodes[x].inputs[0]) flip = !flip;
  int q = quantize(g, at, x, fmt, scale);
  if (q < 0 || !flip) return q;
  evt_attrs t = evt_attrs_default;
  t.dims = (evt_ilist){.n = 2, .v = {1, 0}};
  return evt_rw_op(g, at, EVT_OP_PERMUTE, &q, 1, &t, 1ull << EVT_ATTR_DIMS);
}

/* Node id (an mm) rebuilt in fp8 with formats fa, fb; returns the replacement or -1. */
static int rewrite_mm(evt_graph *g, int id, evt_dtype fa, evt_dtype fb) {
  int a = g->nodes[id].inputs[0], b = g->nodes[id].inputs[1], sa, sb;
  evt_dtype out = g->nodes[id].type.dtype;
  int in[2] = {quantize_operand(g, id, a, fa, &sa), quantize_operand(g, id, b, fb, &sb)};
  evt_attrs at = evt_attrs_default;
  at.out_dtype = EVT_F32;
  int acc = evt_rw_op(g, id, EVT_OP_MM, in, 2, &at, 1ull << EVT_ATTR_OUT_DTYPE);
  int inv = evt_rw_unary(g, id, EVT_OP_RECIPROCAL, evt_rw_binary(g, id, EVT_OP_MUL, sa, sb));
  return evt_rw_cast(g, id, evt_rw_binary(g, id, EVT_OP_MUL, acc, inv), out);
}

/* Which mm's are rewritten, with their operand formats, is decided on the graph as given: a rewrite replaces an
 * mm's uses with nodes the marks do not cover (a later mm may read them). */
typedef struct fp8_job {
  int id;
  evt_dtype fa, fb;
} fp8_job;

static int plan_jobs(const evt_graph *g, fp8_job *jobs) {
  int n0 = g->nnodes, nj = 0;
  bool *m = calloc(3 * ((size_t)n0 + 1), 1);
  if (!m) evt_fatal(__FILE__, __LINE__, "out of memory");
  bool *grad = m, *head = m + n0 + 1, *near = m + 2 * (n0 + 1);
  mark_gradients(g, grad);
  mark_loss_layer(g, head, near);
  for (int id = 0; id < n0; id++) {
    if (!eligible(g, id, head, near)) continue;
    const int *in = g->nodes[id].inputs;
    jobs[nj++] = (fp8_job){id, grad[in[0]] ? EVT_F8E5M2 : EVT_F8E4M3, grad[in[1]] ? EVT_F8E5M2 : EVT_F8E4M3};
  }
  free(m);
  return nj;
}

evt_status evt_pass_fp8(evt_graph *g, evt_pass_stats *st) {
  fp8_job *jobs = malloc(sizeof *jobs * ((size_t)g->nnodes + 1));
  if (!jobs) evt_fatal(__FILE__, __LINE__, "out of memory");
  int nj = plan_jobs(g, jobs), done = 0;
  for (int j = 0; j < nj && done >= 0; j++) {
    int r = rewrite_mm(g, jobs[j].id, jobs[j].fa, jobs[j].fb);
    if (r < 0) done = -1;
    else evt_graph_replace_uses(g, jobs[j].id, r), done++;
  }
  free(jobs);
  if (done < 0) return EVT_ERR_INTERNAL;
  st->rewrites += done;
  return done ? evt_graph_compact(g, &st->removed) : EVT_OK;
}
