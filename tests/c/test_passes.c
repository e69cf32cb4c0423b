/* Graph passes: the rewrite infrastructure (use replacement, compaction, builders) on graphs built with the
 * C builder, and each pass's rules on small parsed graphs; value preservation is checked with the
 * interpreter in test_passes_values (same file, below). */
#include "test.h"

#include "passes/passes.h"

#include <stdlib.h>
#include <string.h>


static void check_verifies(evt_graph *g) {
  evt_status st = evt_graph_verify(g);
  CHECK_MSG(st == EVT_OK, "verify: %s", evt_graph_error(g));
  st = evt_graph_check(g);
  CHECK_MSG(st == EVT_OK, "check: %s", evt_graph_error(g));
}

static evt_status run_pass(evt_graph *g, evt_status (*pass)(evt_graph *, evt_pass_stats *), evt_pass_stats *st) {
  evt_status s = pass(g, st);
  CHECK_MSG(s == EVT_OK, "pass failed: %s", evt_graph_error(g));
  if (s == EVT_OK) check_verifies(g);
  return s;
}

/* ---- rewrite infrastructure ------------------------------------------------------------------------- */

TEST(rewrite_replace_then_compact_resorts) {
  evt_graph *g = evt_graph_new("t");
  int64_t s[] = {4, 8};
  int x = evt_input(g, "x", EVT_F32, 2, s);
  int y = evt_add_op(g, "relu", &x, 1, NULL, 0);
  int z = evt_add_op(g, "exp", &y, 1, NULL, 0);
  evt_graph_set_name(g, z, "z");
  CHECK(evt_graph_add_output(g, z) == EVT_OK);
  /* a later node replaces an earlier one: z (id 2) now uses node 3 */
  int n = evt_rw_unary(g, y, EVT_OP_NEG, x);
  CHECK(n == 3);
  evt_graph_replace_uses(g, y, n);
  CHECK(g->nodes[z].inputs[0] == n);
  int removed = -1;
  CHECK(evt_graph_compact(g, &removed) == EVT_OK);
  CHECK(removed == 1);
  CHECK(g->nnodes == 3);
  CHECK(g->nodes[0].op == EVT_OP_INPUT);
  CHECK(g->nodes[1].op == EVT_OP_NEG && g->nodes[1].inputs[0] == 0);
  CHECK(g->nodes[2].op == EVT_OP_EXP && g->nodes[2].inputs[0] == 1);
  CHECK(g->outputs[0] == 2 && strcmp(g->nodes[2].name, "z") == 0);
  check_verifies(g);
  evt_graph_free(g);
}

TEST(rewrite_output_name_and_loss_move) {
  evt_graph *g = evt_graph_new("t");
  int64_t s[] = {3};
  int x = evt_input(g, "x", EVT_F32, 1, s);
  int w = evt_param(g, "w", EVT_F32, 1, s);
  int m = evt_add_op(g, "mul", (int[]){x, w}, 2, NULL, 0);
  int l = evt_add_op(g, "sum", &m, 1, NULL, 0);
  evt_graph_set_name(g, l, "loss");
  CHECK(evt_graph_set_loss(g, l) == EVT_OK);
  int gw = evt_add_op(g, "relu", &x, 1, NULL, 0);
  evt_graph_set_name(g, gw, "grad.w");
  CHECK(evt_graph_add_output(g, gw) == EVT_OK);
  int nl = evt_rw_reduce(g, l, EVT_OP_SUM, evt_rw_binary(g, l, EVT_OP_MUL, w, x), NULL, 0, 0);
  int ng = evt_rw_unary(g, gw, EVT_OP_ABS, x);
  evt_graph_replace_uses(g, l, nl);
  evt_graph_replace_uses(g, gw, ng);
  CHECK(evt_graph_compact(g, NULL) == EVT_OK);
  CHECK(g->noutputs == 2);
  CHECK(g->loss == g->outputs[0]);
  CHECK(strcmp(g->nodes[g->outputs[0]].name, "loss") == 0);
  CHECK(g->nodes[g->outputs[0]].flags & EVT_NODE_LOSS);
  CHECK(strcmp(g->nodes[g->outputs[1]].name, "grad.w") == 0);
  CHECK(g->nodes[g->outputs[1]].op == EVT_OP_ABS);
  CHECK(evt_test_count_op(g, EVT_OP_RELU) == 0);
  check_verifies(g);
  evt_graph_free(g);
}

TEST(rewrite_keeps_dead_inputs_and_outputs_never_repeat) {
  evt_graph *g = evt_graph_new("t");
  int64_t s[] = {2};
  int x = evt_input(g, "x", EVT_F32, 1, s);
  evt_param(g, "unused", EVT_F32, 1, s);
  int a = evt_add_op(g, "exp", &x, 1, NULL, 0);
  int b = evt_add_op(g, "exp", &x, 1, NULL, 0);
  evt_graph_add_output(g, a);
  evt_graph_add_output(g, b);
  evt_pass_stats st = {0};
  run_pass(g, evt_pass_cse, &st);
  /* both outputs compute the same value; the list keeps two distinct nodes */
  CHECK(g->noutputs == 2 && g->outputs[0] != g->outputs[1]);
  CHECK(evt_graph_find(g, "unused") >= 0);
  evt_graph_free(g);
}

TEST(rewrite_cycle_is_an_internal_error) {
  evt_graph *g = evt_graph_new("t");
  int64_t s[] = {2};
  int x = evt_input(g, "x", EVT_F32, 1, s);
  int a = evt_add_op(g, "exp", &x, 1, NULL, 0);
  int b = evt_add_op(g, "neg", &a, 1, NULL, 0);
  evt_graph_add_output(g, b);
  g->nodes[a].inputs[0] = b; /* a bad rewrite */
  CHECK(evt_graph_compact(g, NULL) == EVT_ERR_INTERNAL);
  CHECK(strstr(evt_graph_error(g), "cycle") != NULL);
  evt_graph_free(g);
}

TEST(rewrite_builders_sticky_errors) {
  evt_graph *g = evt_graph_new("t");
  int64_t s[] = {2, 3};
  int x = evt_input(g, "x", EVT_F32, 2, s);
  CHECK(evt_rw_unary(g, x, EVT_OP_EXP, -1) == -1);
  CHECK(evt_rw_binary(g, x, EVT_OP_ADD, x, -1) == -1);
  CHECK(evt_rw_cast(g, x, x, EVT_F32) == x);
  CHECK(evt_rw_reshape(g, x, x, 2, s) == x);
  int64_t r[] = {6};
  int y = evt_rw_reshape(g, x, x, 1, r);
  CHECK(y > x && g->nodes[y].type.shape[0] == 6);
  int sc = evt_rw_scalar(g, x, EVT_BF16, 0.1);
  CHECK(g->nodes[sc].type.dtype == EVT_BF16 && g->nodes[sc].attr.value == 0.1); /* rounded when stored */
  evt_graph_free(g);
}

/* ---- canonicalize ----------------------------------------------------------------------------------- */

TEST(canonicalize_rules) {
  evt_graph *g = evt_test_parse_ok("graph t {\n"
                          "  %x: f32[4,8] = input()\n"
                          "  %w: f32[8,6] = param()\n"
                          "  %b: f32[6] = param()\n"
                          "  %h: f32[4,6] = addmm(%b, %x, %w)\n"
                          "  %t: f32[6,4] = transpose(%h, dims=[0,1])\n"
                          "  %r: f32[6,4] = reshape(%t, shape=[6,4])\n"
                          "  %c: f32[6,4] = cast(%r, dtype=f32)\n"
                          "  %k: f32[6,4] = full(value=2)\n"
                          "  %m: f32[6,4] = mul(%c, %k)\n"
                          "  output %m\n"
                          "}\n");
  evt_pass_stats st = {0};
  run_pass(g, evt_pass_canonicalize, &st);
  CHECK(evt_test_count_op(g, EVT_OP_ADDMM) == 0 && evt_test_count_op(g, EVT_OP_MM) == 1 && evt_test_count_op(g, EVT_OP_ADD) == 1);
  CHECK(evt_test_count_op(g, EVT_OP_TRANSPOSE) == 0 && evt_test_count_op(g, EVT_OP_PERMUTE) == 1);
  CHECK(evt_test_count_op(g, EVT_OP_RESHAPE) == 0 && evt_test_count_op(g, EVT_OP_CAST) == 0);
  CHECK(evt_test_count_op(g, EVT_OP_FULL) == 0 && evt_test_count_op(g, EVT_OP_SCALAR) == 1);
  const evt_node *m = &g->nodes[g->outputs[0]];
  CHECK(strcmp(m->name, "m") == 0 && g->nodes[m->inputs[0]].op == EVT_OP_PERMUTE);
  CHECK(st.rewrites >= 5);
  evt_graph_free(g);
}

TEST(canonicalize_cross_entropy_to_nll_log_softmax) {
  evt_graph *g = evt_test_parse_ok("graph t {\n"
                          "  %x: f32[4,5] = input()\n"
                          "  %y: i64[4] = input(init=randint, lo=0, hi=5)\n"
                          "  %l: f32[] = cross_entropy(%x, %y, reduction=sum, ignore_index=2)\n"
                          "  loss %l\n"
                          "}\n");
  evt_pass_stats st = {0};
  run_pass(g, evt_pass_canonicalize, &st);
  CHECK(evt_test_count_op(g, EVT_OP_CROSS_ENTROPY) == 0 && evt_test_count_op(g, EVT_OP_LOG_SOFTMAX) == 1);
  const evt_node *l = &g->nodes[g->loss];
  CHECK(l->op == EVT_OP_NLL_LOSS && l->attr.reduction == EVT_REDUCTION_SUM && l->attr.ignore_index == 2);
  CHECK(strcmp(l->name, "l") == 0);
  evt_graph_free(g);
}

/* ---- CSE, constant propagation ---------------------------------------------------------------------- */

TEST(cse_merges_commutative_duplicates) {
  evt_graph *g = evt_test_parse_ok("graph t {\n"
                          "  %x: f32[4] = input()\n"
                          "  %y: f32[4] = input()\n"
                          "  %a: f32[4] = add(%x, %y)\n"
                          "  %b: f32[4] = add(%y, %x)\n"
                          "  %c: f32[4] = mul(%a, %b)\n"
                          "  %d: f32[4] = exp(%a)\n"
                          "  %e: f32[4] = exp(%b)\n"
                          "  %f: f32[4] = sub(%d, %e)\n"
                          "  %s1: f32[4] = softmax(%c, dim=0)\n"
                          "  %s2: f32[4] = softmax(%c, dim=-1)\n"
                          "  %o: f32[4] = add(%f, %s1)\n"
                          "  %o2: f32[4] = add(%o, %s2)\n"
                          "  output %o2\n"
                          "}\n");
  evt_pass_stats st = {0};
  run_pass(g, evt_pass_cse, &st);
  CHECK(evt_test_count_op(g, EVT_OP_EXP) == 1);
  CHECK(evt_test_count_op(g, EVT_OP_SOFTMAX) == 1);
  CHECK(evt_test_count_op(g, EVT_OP_ADD) == 3);
  CHECK(evt_test_count_op(g, EVT_OP_INPUT) == 2);
  CHECK(st.rewrites == 3);
  evt_graph_free(g);
}

TEST(constprop_folds_and_simplifies) {
  evt_graph *g = evt_test_parse_ok("graph t {\n"
                          "  %x: f32[4] = input()\n"
                          "  %two: f32[] = scalar(value=2)\n"
                          "  %three: f32[] = scalar(value=3)\n"
                          "  %six: f32[] = mul(%two, %three)\n"
                          "  %a: f32[4] = div(%x, %six)\n"
                          "  %one: f32[] = scalar(value=1)\n"
                          "  %b: f32[4] = mul(%a, %one)\n"
                          "  %z: f32[] = sub(%two, %two)\n"
                          "  %c: f32[4] = add(%b, %z)\n"
                          "  %n: f32[4] = neg(%c)\n"
                          "  %d: f32[4] = neg(%n)\n"
                          "  %k: f32[4] = full(value=0.5)\n"
                          "  %s: f32[] = sum(%k)\n"
                          "  %e: f32[4] = mul(%d, %s)\n"
                          "  output %e\n"
                          "}\n");
  evt_pass_stats st = {0};
  run_pass(g, evt_pass_constprop, &st);
  /* e = x * (1/6) * 2 -> one multiply by a folded scalar */
  CHECK(evt_test_count_op(g, EVT_OP_DIV) == 0);
  CHECK(evt_test_count_op(g, EVT_OP_NEG) == 0);
  CHECK(evt_test_count_op(g, EVT_OP_ADD) == 0);
  CHECK(evt_test_count_op(g, EVT_OP_SUM) == 0);
  CHECK(evt_test_count_op(g, EVT_OP_MUL) == 1);
  const evt_node *e = &g->nodes[g->outputs[0]];
  CHECK(e->op == EVT_OP_MUL);
  double v = 0;
  CHECK(evt_node_is_const(g, e->inputs[1], &v) || evt_node_is_const(g, e->inputs[0], &v));
  CHECK_NEAR(v, 2.0 / 6.0, 1e-7);
  evt_graph_free(g);
}

/* ---- reduction elimination, loss elimination, decomposition, layout ---------------------------------- */

TEST(reduce_elim_pulls_broadcast_factors_and_one_hot) {
  evt_graph *g = evt_test_parse_ok("graph t {\n"
                          "  %a: f32[4,5] = input()\n"
                          "  %w: f32[4,1] = input()\n"
                          "  %t: i64[4] = input(init=randint, lo=0, hi=5)\n"
                          "  %m: f32[4,5] = mul(%a, %w)\n"
                          "  %s: f32[4] = sum(%m, dims=[1])\n"
                          "  %oh: f32[4,5] = one_hot(%t, num_classes=5)\n"
                          "  %g: f32[4,5] = mul(%w, %oh)\n"
                          "  %ng: f32[4,5] = neg(%g)\n"
                          "  %s2: f32[4,1] = sum(%ng, dims=[1], keepdim=true)\n"
                          "  output %s, %s2\n"
                          "}\n");
  evt_pass_stats st = {0};
  run_pass(g, evt_pass_reduce_elim, &st);
  /* s = reshape(w) * sum(a); s2 = -w: one sum left, no one_hot */
  CHECK(evt_test_count_op(g, EVT_OP_SUM) == 1);
  CHECK(evt_test_count_op(g, EVT_OP_ONE_HOT) == 0);
  const evt_node *s2 = &g->nodes[g->outputs[1]];
  CHECK(s2->op == EVT_OP_NEG && strcmp(g->nodes[s2->inputs[0]].name, "w") == 0);
  evt_graph_free(g);
}

TEST(reduce_elim_extracts_common_factor) {
  evt_graph *g = evt_test_parse_ok("graph t {\n"
                          "  %a: f32[4] = input()\n"
                          "  %b: f32[4] = input()\n"
                          "  %c: f32[4] = input()\n"
                          "  %ab: f32[4] = mul(%a, %b)\n"
                          "  %ca: f32[4] = mul(%c, %a)\n"
                          "  %s: f32[4] = sub(%ab, %ca)\n"
                          "  output %s\n"
                          "}\n");
  evt_pass_stats st = {0};
  run_pass(g, evt_pass_reduce_elim, &st);
  CHECK(evt_test_count_op(g, EVT_OP_MUL) == 1 && evt_test_count_op(g, EVT_OP_SUB) == 1);
  const evt_node *s = &g->nodes[g->outputs[0]];
  CHECK(s->op == EVT_OP_MUL && strcmp(g->nodes[s->inputs[0]].name, "a") == 0);
  evt_graph_free(g);
}

static const char *kCeJoint =
    "graph ce {\n"
    "  %x: f32[6,5] = input()\n"
    "  %t: i64[6] = input(init=randint, lo=0, hi=5)\n"
    "  %lp: f32[6,5] = log_softmax(%x, dim=1)\n"
    "  %loss: f32[] = nll_loss(%lp, %t, ignore_index=1)\n"
    "  %dy: f32[] = scalar(value=1)\n"
    "  %lp2: f32[6,5] = log_softmax(%x, dim=1)\n"
    "  %g0: f32[6,5] = nll_loss_backward(%dy, %lp2, %t, ignore_index=1)\n"
    "  %grad.x: f32[6,5] = log_softmax_backward(%g0, %lp2, dim=1)\n"
    "  loss %loss\n"
    "  output %grad.x\n"
    "}\n";

/* true if some sum reduces over the class dim of an [N, C] tensor reaching grad.x */
static bool grad_has_row_sum(const evt_graph *g) {
  int out = g->outputs[1];
  char *reach = calloc((size_t)g->nnodes, 1);
  reach[out] = 1;
  bool found = false;
  for (int i = g->nnodes - 1; i >= 0; i--) {
    if (!reach[i]) continue;
    const evt_node *n = &g->nodes[i];
    if ((n->op == EVT_OP_SUM || n->op == EVT_OP_MEAN || n->op == EVT_OP_LOG_SOFTMAX_BACKWARD) &&
        g->nodes[n->inputs[0]].type.rank == 2 && (n->attr.dims.n == 0 || n->attr.dims.v[n->attr.dims.n - 1] == 1 ||
                                                  n->op == EVT_OP_LOG_SOFTMAX_BACKWARD))
      found = true;
    for (int k = 0; k < n->ninputs; k++) reach[n->inputs[k]] = 1;
  }
  free(reach);
  return found;
}

TEST(loss_elim_softmax_cross_entropy) {
  evt_graph *g = evt_test_parse_ok(kCeJoint);
  evt_pass_stats st = {0};
  run_pass(g, evt_pass_loss_elim, &st);
  CHECK(evt_test_count_op(g, EVT_OP_LOG_SOFTMAX) == 0);
  CHECK(evt_test_count_op(g, EVT_OP_NLL_LOSS) == 0 && evt_test_count_op(g, EVT_OP_NLL_LOSS_BACKWARD) == 0);
  CHECK(evt_test_count_op(g, EVT_OP_SOFTMAX) == 1);
  CHECK(!grad_has_row_sum(g));
  CHECK(g->loss >= 0 && strcmp(g->nodes[g->loss].name, "loss") == 0);
  CHECK(strcmp(g->nodes[g->outputs[1]].name, "grad.x") == 0);
  evt_graph_free(g);
}

TEST(loss_elim_drop_loss_option) {
  evt_graph *g = evt_test_parse_ok(kCeJoint);
  evt_pass_stats st = {.flags = EVT_PASS_DROP_LOSS};
  run_pass(g, evt_pass_loss_elim, &st);
  double v = -1;
  CHECK(evt_node_is_const(g, g->loss, &v) && v == 0.0);
  CHECK(evt_test_count_op(g, EVT_OP_AMAX) == 0); /* no side reduction left */
  evt_graph_free(g);
}

TEST(decompose_then_reduce_elim_removes_ce_row_sum) {
  evt_graph *g = evt_test_parse_ok(kCeJoint);
  evt_pass_stats st = {0};
  run_pass(g, evt_pass_decompose, &st);
  CHECK(evt_test_count_op(g, EVT_OP_LOG_SOFTMAX) == 0 && evt_test_count_op(g, EVT_OP_LOG_SOFTMAX_BACKWARD) == 0);
  CHECK(evt_test_count_op(g, EVT_OP_NLL_LOSS_BACKWARD) == 0);
  CHECK(grad_has_row_sum(g));
  run_pass(g, evt_pass_reduce_elim, &st);
  CHECK(!grad_has_row_sum(g));
  evt_graph_free(g);
}

TEST(layout_folds_and_cancels_permutes) {
  evt_graph *g = evt_test_parse_ok("graph t {\n"
                          "  %x: f32[2,3,4,5] = input()\n"
                          "  %p: f32[2,4,5,3] = permute(%x, dims=[0,2,3,1])\n"
                          "  %r: f32[2,4,5,3] = relu(%p)\n"
                          "  %s: f32[] = scalar(value=2)\n"
                          "  %m: f32[2,4,5,3] = mul(%r, %s)\n"
                          "  %q: f32[2,3,4,5] = permute(%m, dims=[0,3,1,2])\n"
                          "  %u: f32[2,3,1,4,5] = unsqueeze(%q, dim=2)\n"
                          "  %v: f32[6,20] = reshape(%u, shape=[6,20])\n"
                          "  output %v\n"
                          "}\n");
  evt_pass_stats st = {0};
  run_pass(g, evt_pass_layout, &st);
  CHECK(evt_test_count_op(g, EVT_OP_PERMUTE) == 0);
  CHECK(evt_test_count_op(g, EVT_OP_UNSQUEEZE) == 0 && evt_test_count_op(g, EVT_OP_RESHAPE) == 1);
  evt_graph_free(g);
}

/* ---- value preservation (the interpreter, fp64, before and after a pass) ----------------------------- */

/* The largest |value| over the finite elements of outputs (`from` on) of g in v. */
static double finite_scale(const evt_graph *g, const evt_tensor *v, int from) {
  double m = 0;
  for (int o = from; o < g->noutputs; o++)
    for (int64_t i = 0; i < v[g->outputs[o]].numel; i++)
      if (isfinite(v[g->outputs[o]].data[i])) m = fmax(m, fabs(v[g->outputs[o]].data[i]));
  return m;
}

/* Output o keeps its values: inf and NaN where they were, finite elements within rtol * max(max |a|, floor *
 * the largest finite magnitude over all outputs). */
static void check_output_kept(const evt_graph *g, int o, const evt_tensor *a, const evt_tensor *b, double rtol,
                              double floor_scale) {
  CHECK(a->numel == b->numel);
  double scale = fmax(1e-12, floor_scale), diff = 0;
  for (int64_t i = 0; i < a->numel && a->numel == b->numel; i++) {
    double x = a->data[i], y = b->data[i];
    if (!isfinite(x) || !isfinite(y)) {
      bool same = (isnan(x) && isnan(y)) || x == y;
      CHECK_MSG(same, "output %d (%%%s) element %lld: %g before, %g after", o, g->nodes[g->outputs[o]].name, (long long)i, x, y);
      if (!same) return;
      continue;
    }
    scale = fmax(scale, fabs(x));
    diff = fmax(diff, fabs(x - y));
  }
  CHECK_MSG(diff <= rtol * scale, "output %d (%%%s): max diff %g at scale %g", o, g->nodes[g->outputs[o]].name, diff, scale);
}

/* Runs pass on text's graph and compares every output before and after on the same inputs: runs with run_flags
 * (EVT_RUN_FP64: values unrounded; 0: each node rounded to its dtype), max |diff| <= rtol * max(max |before|,
 * floor * the largest over all outputs), inf and NaN kept. Returns the graph after the pass (caller frees). */
static evt_graph *check_preserves_floor(const char *text, evt_status (*pass)(evt_graph *, evt_pass_stats *),
                                        unsigned flags, bool skip_loss, unsigned run_flags, double rtol, double floor) {
  evt_graph *g = evt_test_parse_ok(text);
  if (!g) return NULL;
  if (g->loss >= 0 && g->noutputs == 1) CHECK(evt_graph_build_joint(g, 0) == EVT_OK);
  int n0 = g->nnodes, no = g->noutputs;
  evt_tensor *v0 = calloc((size_t)n0, sizeof *v0);
  CHECK(evt_interp_init_inputs(g, v0, 42) == EVT_OK);
  CHECK_MSG(evt_interp_run(g, v0, run_flags, 1) == EVT_OK, "run before: %s", evt_graph_error(g));
  const char **names = malloc(sizeof(char *) * (size_t)(n0 + 1));
  int *outs = malloc(sizeof(int) * (size_t)(no + 1));
  for (int i = 0; i < n0; i++) names[i] = g->nodes[i].name;
  if (no > 0) memcpy(outs, g->outputs, sizeof(int) * (size_t)no);
  double global = finite_scale(g, v0, skip_loss ? 1 : 0);
  evt_pass_stats st = {.flags = flags};
  run_pass(g, pass, &st);
  evt_tensor *v1 = calloc((size_t)g->nnodes, sizeof *v1);
  CHECK(evt_interp_init_inputs(g, v1, 42) == EVT_OK);
  for (int i = 0; i < g->nnodes; i++) {
    if (g->nodes[i].op != EVT_OP_INPUT && g->nodes[i].op != EVT_OP_PARAM) continue;
    for (int j = 0; j < n0; j++)
      if (!strcmp(names[j], g->nodes[i].name)) memcpy(v1[i].data, v0[j].data, sizeof(double) * (size_t)v1[i].numel);
  }
  CHECK_MSG(evt_interp_run(g, v1, run_flags, 0) == EVT_OK, "run after: %s", evt_graph_error(g));
  CHECK(g->noutputs == no);
  for (int o = skip_loss ? 1 : 0; o < no && o < g->noutputs; o++)
    check_output_kept(g, o, &v0[outs[o]], &v1[g->outputs[o]], rtol, floor * global);
  for (int i = 0; i < n0; i++) evt_tensor_free(&v0[i]);
  for (int i = 0; i < g->nnodes; i++) evt_tensor_free(&v1[i]);
  free(v0), free(v1), free(names), free(outs);
  return g;
}

static evt_graph *check_preserves_at(const char *text, evt_status (*pass)(evt_graph *, evt_pass_stats *), unsigned flags,
                                     bool skip_loss, unsigned run_flags, double rtol) {
  return check_preserves_floor(text, pass, flags, skip_loss, run_flags, rtol, 0.0);
}

/* 8 units in the last place of the narrowest float dtype in text's graph, at least 1e-5 (evtc opt --verify). */
static double rounded_rtol(const char *text) {
  return strstr(text, "bf16") ? 8 * 0x1p-7 : strstr(text, "f16") ? 8 * 0x1p-10 : 1e-5;
}

/* Runs `pass` on the graph of `text` and checks every output keeps its value: relative 1e-9 in fp64, and
 * with every node rounded to its dtype within rounded_rtol (of the output's magnitude, floored at 0.1 of the
 * largest output), inf and NaN kept, as evtc opt --verify. Returns the graph after the pass (caller frees). */
static evt_graph *check_preserves(const char *text, evt_status (*pass)(evt_graph *, evt_pass_stats *), unsigned flags,
                                  bool skip_loss) {
  evt_graph_free(check_preserves_floor(text, pass, flags, skip_loss, 0, rounded_rtol(text), 0.1));
  return check_preserves_at(text, pass, flags, skip_loss, EVT_RUN_FP64, 1e-9);
}

TEST(values_canonicalize_cse_constprop_layout) {
  const char *texts[] = {
      "graph t {\n  %x: f32[4,8] = input()\n  %w: f32[8,6] = param()\n  %b: f32[6] = param()\n"
      "  %h: f32[4,6] = addmm(%b, %x, %w)\n  %t: f32[6,4] = transpose(%h, dims=[0,1])\n"
      "  %k: f32[6,4] = full(value=2)\n  %m: f32[6,4] = mul(%t, %k)\n  %e: f32[6,4] = expand(%m, shape=[6,4])\n"
      "  %d: f32[6,4] = div(%e, %k)\n  %a: f32[6,4] = add(%d, %t)\n  %c: f32[6,4] = add(%t, %d)\n"
      "  %r: f32[6,4] = mul(%a, %c)\n  output %r\n}\n",
      "graph t {\n  %x: f32[2,3,4,5] = input()\n  %p: f32[2,4,5,3] = permute(%x, dims=[0,2,3,1])\n"
      "  %r: f32[2,4,5,3] = relu(%p)\n  %y: f32[2,3,4,5] = input()\n  %py: f32[2,4,5,3] = permute(%y, dims=[0,2,3,1])\n"
      "  %m: f32[2,4,5,3] = mul(%r, %py)\n  %q: f32[2,3,4,5] = permute(%m, dims=[0,3,1,2])\n"
      "  %u: f32[2,3,1,4,5] = unsqueeze(%q, dim=2)\n  %v: f32[6,20] = reshape(%u, shape=[6,20])\n  output %v\n}\n",
  };
  evt_status (*passes[])(evt_graph *, evt_pass_stats *) = {evt_pass_canonicalize, evt_pass_cse, evt_pass_constprop,
                                                            evt_pass_layout, evt_pass_reduce_elim, evt_pass_dce};
  for (int t = 0; t < EVT_ARRAY_LEN(texts); t++)
    for (int p = 0; p < EVT_ARRAY_LEN(passes); p++) evt_graph_free(check_preserves(texts[t], passes[p], 0, false));
}

static const char *kLosses[] = {
    /* softmax cross-entropy, mean / sum / none, with ignored rows */
    "graph t {\n  %x: f32[8,5] = input()\n  %w: f32[5,5] = param()\n  %h: f32[8,5] = mm(%x, %w)\n"
    "  %y: i64[8] = input(init=randint, lo=-1, hi=5)\n"
    "  %l: f32[] = cross_entropy(%h, %y, ignore_index=-1)\n  loss %l\n}\n",
    "graph t {\n  %x: f32[8,5] = input()\n  %w: f32[5,5] = param()\n  %h: f32[8,5] = mm(%x, %w)\n"
    "  %y: i64[8] = input(init=randint, lo=0, hi=5)\n"
    "  %l: f32[] = cross_entropy(%h, %y, reduction=sum, ignore_index=3)\n  loss %l\n}\n",
    "graph t {\n  %x: f32[8,5] = input()\n  %w: f32[5,5] = param()\n  %h: f32[8,5] = mm(%x, %w)\n"
    "  %y: i64[8] = input(init=randint, lo=0, hi=5)\n"
    "  %lp: f32[8,5] = log_softmax(%h, dim=1)\n  %r: f32[8] = nll_loss(%lp, %y, reduction=none)\n"
    "  %l: f32[] = sum(%r)\n  loss %l\n}\n",
    "graph t {\n  %x: f32[8,5] = input()\n  %w: f32[5,5] = param()\n  %h: f32[8,5] = mm(%x, %w)\n"
    "  %y: f32[8,5] = input(init=uniform)\n  %l: f32[] = bce_with_logits(%h, %y)\n  loss %l\n}\n",
    "graph t {\n  %x: f32[8,5] = input()\n  %w: f32[5,5] = param()\n  %h: f32[8,5] = mm(%x, %w)\n"
    "  %y: f32[8,5] = input()\n  %l: f32[] = mse_loss(%h, %y, reduction=sum)\n  loss %l\n}\n",
};

TEST(values_loss_elim_every_loss) {
  for (int t = 0; t < EVT_ARRAY_LEN(kLosses); t++) {
    evt_graph *g = check_preserves(kLosses[t], evt_pass_loss_elim, 0, false);
    if (!g) continue;
    CHECK_MSG(evt_test_count_op(g, EVT_OP_NLL_LOSS_BACKWARD) + evt_test_count_op(g, EVT_OP_BCE_WITH_LOGITS_BACKWARD) +
                      evt_test_count_op(g, EVT_OP_MSE_LOSS_BACKWARD) + evt_test_count_op(g, EVT_OP_LOG_SOFTMAX_BACKWARD) == 0,
              "loss %d: a loss backward op is left", t);
    CHECK(evt_test_count_op(g, EVT_OP_LOG_SOFTMAX) == 0);
    evt_graph_free(g);
  }
}

/* Runs loss elimination on each text (values preserved) and checks the loss form it chose: no nll_loss left,
 * and the logsumexp form (one amax, over x; no softmax) or the one-pass form (a softmax, two amax: of x and of
 * the probabilities; a where-select) per text (want_one_pass[t]). */
static void check_loss_forms(const char *const *texts, int n, const int *want_one_pass) {
  for (int t = 0; t < n; t++) {
    evt_graph *g = check_preserves(texts[t], evt_pass_loss_elim, 0, false);
    if (!g) continue;
    int nll = evt_test_count_op(g, EVT_OP_NLL_LOSS), amax = evt_test_count_op(g, EVT_OP_AMAX);
    bool one_pass = amax == 2 && evt_test_count_op(g, EVT_OP_SOFTMAX) >= 1 && evt_test_count_op(g, EVT_OP_WHERE) >= 1;
    CHECK_MSG(nll == 0 && (want_one_pass[t] ? one_pass : amax == 1), "text %d: nll %d amax %d (want the %s form)", t,
              nll, amax, want_one_pass[t] ? "one-pass" : "logsumexp");
    evt_graph_free(g);
  }
}

/* nll_loss over log-probabilities the graph also returns (a PyTorch forward segment whose log-softmax is saved
 * for the backward): the one-pass form (row reductions beside the softmax kernel) instead of a second
 * logsumexp pass over the logits; values preserved (mean with ignored rows, and none). */
TEST(loss_elim_nll_over_returned_log_probs) {
  static const char *texts[] = {
      "graph t {\n  %x: f32[8,5] = input()\n  %w: f32[5,5] = param()\n  %h: f32[8,5] = mm(%x, %w)\n"
      "  %y: i64[8] = input(init=randint, lo=-1, hi=5)\n  %lp: f32[8,5] = log_softmax(%h, dim=1)\n"
      "  %l: f32[] = nll_loss(%lp, %y, ignore_index=-1)\n  loss %l\n  output %lp\n}\n",
      "graph t {\n  %x: f32[8,5] = input()\n  %w: f32[5,5] = param()\n  %h: f32[8,5] = mm(%x, %w)\n"
      "  %y: i64[8] = input(init=randint, lo=0, hi=5)\n  %lp: f32[8,5] = log_softmax(%h, dim=1)\n"
      "  %r: f32[8] = nll_loss(%lp, %y, reduction=none)\n  %l: f32[] = sum(%r)\n  loss %l\n  output %lp\n}\n",
  };
  static const int one_pass[] = {1, 1};
  check_loss_forms(texts, EVT_ARRAY_LEN(texts), one_pass);
}

/* nll_loss over the log-softmax of the f32 widening of bf16 logits (rows a row kernel holds), not returned:
 * the one-pass form too (its row kernels load the bf16 logits; the logsumexp form's max would end its group
 * and its second pass read a materialized f32 copy), also over 40000 classes (the row kernel's long-row form);
 * values preserved. f32 logits, or rows of more than 2^30 classes: the logsumexp form. */
TEST(loss_elim_nll_over_widened_16bit_logits) {
  static const char *texts[] = {
      "graph t {\n  %x: bf16[8,16] = input()\n  %xf: f32[8,16] = cast(%x, dtype=f32)\n"
      "  %y: i64[8] = input(init=randint, lo=-1, hi=16)\n  %lp: f32[8,16] = log_softmax(%xf, dim=1)\n"
      "  %l: f32[] = nll_loss(%lp, %y, ignore_index=-1)\n  loss %l\n}\n",
      "graph t {\n  %x: f32[8,16] = input()\n"
      "  %y: i64[8] = input(init=randint, lo=-1, hi=16)\n  %lp: f32[8,16] = log_softmax(%x, dim=1)\n"
      "  %l: f32[] = nll_loss(%lp, %y, ignore_index=-1)\n  loss %l\n}\n",
      "graph t {\n  %x: bf16[2,40000] = input()\n  %xf: f32[2,40000] = cast(%x, dtype=f32)\n"
      "  %y: i64[2] = input(init=randint, lo=0, hi=40000)\n  %lp: f32[2,40000] = log_softmax(%xf, dim=1)\n"
      "  %l: f32[] = nll_loss(%lp, %y)\n  loss %l\n}\n",
  };
  static const int one_pass[] = {1, 0, 1};
  check_loss_forms(texts, EVT_ARRAY_LEN(texts), one_pass);
}

/* The one-pass loss stays finite and exact where a target's probability underflows f32 (logits up to ~600 apart:
 * log(softmax(x))[t] is -inf there; the loss is (max(x) - x[t]) - log(max(softmax(x)))), for returned
 * log-probabilities and for widened 16-bit logits; values preserved (check_preserves: NaN or inf never pass). */
TEST(loss_elim_one_pass_form_is_finite_for_far_logits) {
  static const char *texts[] = {
      "graph t {\n  %x0: f32[8,16] = input()\n  %k: f32[] = scalar(value=300)\n  %x: f32[8,16] = mul(%x0, %k)\n"
      "  %y: i64[8] = input(init=randint, lo=0, hi=16)\n  %lp: f32[8,16] = log_softmax(%x, dim=1)\n"
      "  %l: f32[] = nll_loss(%lp, %y)\n  loss %l\n  output %lp\n}\n",
      "graph t {\n  %x0: bf16[8,16] = input()\n  %k: bf16[] = scalar(value=300)\n  %xb: bf16[8,16] = mul(%x0, %k)\n"
      "  %x: f32[8,16] = cast(%xb, dtype=f32)\n  %y: i64[8] = input(init=randint, lo=0, hi=16)\n"
      "  %lp: f32[8,16] = log_softmax(%x, dim=1)\n  %l: f32[] = nll_loss(%lp, %y)\n  loss %l\n}\n",
  };
  static const int one_pass[] = {1, 1};
  check_loss_forms(texts, EVT_ARRAY_LEN(texts), one_pass);
}

/* A layer-norm backward whose dy is the f32 widening of a bf16 tensor keeps w in the nucleus (decompose), and
 * split-casts gives the nucleus its own copy of the cast that CSE shared with the weight gradient's product and
 * the bias gradient's sum (the partitioner then fuses it into the kernel's load); values preserved. An f32 dy:
 * w is multiplied in first, as before. */
TEST(layer_norm_backward_keeps_w_and_gets_its_own_cast) {
  const char *text =
      "graph t {\n  %dy: bf16[8,16] = input()\n  %x: f32[8,16] = input()\n  %w: f32[16] = param()\n"
      "  %dyf: f32[8,16] = cast(%dy, dtype=f32)\n  %dx: f32[8,16] = layer_norm_backward_input(%dyf, %x, %w)\n"
      "  %dw: f32[16] = layer_norm_backward_weight(%dyf, %x)\n  %db: f32[16] = sum(%dyf, dims=[0])\n"
      "  output %dx\n  output %dw\n  output %db\n}\n";
  evt_graph *g = check_preserves(text, evt_pass_decompose, 0, false);
  if (!g) return;
  int nu = -1;
  for (int i = 0; i < g->nnodes; i++)
    if (g->nodes[i].op == EVT_OP_LAYER_NORM_BACKWARD_INPUT) nu = i;
  CHECK(nu >= 0 && g->nodes[nu].ninputs == 3);
  evt_graph_free(g);
  g = check_preserves(text, evt_pass_split_casts, 0, false);
  if (!g) return;
  CHECK(evt_test_count_op(g, EVT_OP_CAST) == 2);
  int readers = 0, c = -1;
  for (int i = 0; i < g->nnodes; i++)
    if (g->nodes[i].op == EVT_OP_LAYER_NORM_BACKWARD_INPUT) c = g->nodes[i].inputs[0];
  for (int i = 0; c >= 0 && i < g->nnodes; i++)
    for (int k = 0; k < g->nodes[i].ninputs; k++) readers += g->nodes[i].inputs[k] == c;
  CHECK(c >= 0 && g->nodes[c].op == EVT_OP_CAST && readers == 1);
  evt_graph_free(g);
  g = check_preserves("graph t {\n  %dy: f32[8,16] = input()\n  %x: f32[8,16] = input()\n  %w: f32[16] = param()\n"
                      "  %dx: f32[8,16] = layer_norm_backward_input(%dy, %x, %w)\n  output %dx\n}\n",
                      evt_pass_decompose, 0, false);
  for (int i = 0; g && i < g->nnodes; i++)
    if (g->nodes[i].op == EVT_OP_LAYER_NORM_BACKWARD_INPUT) CHECK(g->nodes[i].ninputs == 2);
  evt_graph_free(g);
}

TEST(values_decompose_then_reduce_elim_every_loss) {
  for (int t = 0; t < EVT_ARRAY_LEN(kLosses); t++) {
    evt_graph *g = check_preserves(kLosses[t], evt_pass_decompose, 0, false);
    evt_graph_free(g);
  }
}

TEST(values_decompose_rules) {
  const char *text =
      "graph t {\n  %x0: f32[4,3,2,2] = input()\n  %k: f32[4,3,2,2] = param()\n  %x: f32[4,3,2,2] = mul(%x0, %k)\n"
      "  %w: f32[3] = param(init=ones)\n  %b: f32[3] = param(init=zeros)\n"
      "  %bn: f32[4,3,2,2] = batch_norm(%x, %w, %b)\n  %r: f32[4,3,2,2] = relu(%bn)\n"
      "  %f: f32[4,12] = reshape(%r, shape=[4,12])\n  %lw: f32[12] = param()\n  %lb: f32[12] = param()\n"
      "  %ln: f32[4,12] = layer_norm(%f, %lw, %lb)\n  %gl: f32[4,12] = gelu(%ln)\n"
      "  %gt: f32[4,12] = gelu(%gl, approximate=tanh)\n  %d: f32[4,12] = dropout(%gt, p=0.3, seed=5, offset=7)\n"
      "  %l: f32[] = sum(%d)\n  loss %l\n}\n";
  evt_graph *g = check_preserves(text, evt_pass_decompose, 0, false);
  if (!g) return;
  CHECK(evt_test_count_op(g, EVT_OP_DROPOUT) == 0 && evt_test_count_op(g, EVT_OP_RAND) == 2);
  CHECK(evt_test_count_op(g, EVT_OP_BATCH_NORM) == 0 && evt_test_count_op(g, EVT_OP_BATCH_NORM_BACKWARD_INPUT) == 0);
  CHECK(evt_test_count_op(g, EVT_OP_GELU_BACKWARD) == 2 && evt_test_count_op(g, EVT_OP_THRESHOLD_BACKWARD) == 0); /* gelu_backward stays whole */
  for (int i = 0; i < g->nnodes; i++) {
    const evt_node *n = &g->nodes[i];
    CHECK(!(n->op == EVT_OP_LAYER_NORM && n->ninputs > 1));
    CHECK(!(n->op == EVT_OP_LAYER_NORM_BACKWARD_INPUT && n->ninputs > 2));
  }
  CHECK(evt_test_count_op(g, EVT_OP_LAYER_NORM_BACKWARD_WEIGHT) == 0);
  evt_pass_stats st = {0};
  run_pass(g, evt_pass_cse, &st);
  CHECK(evt_test_count_op(g, EVT_OP_RAND) == 1); /* the forward's and the backward's masks are one */
  CHECK(evt_test_count_op(g, EVT_OP_LAYER_NORM) == 1);
  evt_graph_free(g);
}

/* pow by the exponents RMSNorm and its gradient use (and a few more) becomes the visitor's elementwise ops; other
 * exponents stay pow. Values as before, gradients included (the loss makes the backward's pow(x, 1) too). */
TEST(values_decompose_pow) {
  const char *text =
      "graph t {\n  %x0: f32[4,6] = param(init=uniform)\n  %h: f32[] = scalar(value=0.5)\n  %x: f32[4,6] = add(%x0, %h)\n"
      "  %a: f32[4,6] = pow(%x, value=2)\n  %b: f32[4,6] = pow(%x, value=3)\n  %c: f32[4,6] = pow(%x, value=-1)\n"
      "  %d: f32[4,6] = pow(%x, value=-2)\n  %e: f32[4,6] = pow(%x, value=0.5)\n  %f: f32[4,6] = pow(%x, value=-0.5)\n"
      "  %k: f32[4,6] = pow(%x, value=1)\n  %o: f32[4,6] = pow(%x, value=1.7)\n"
      "  %s1: f32[4,6] = add(%a, %b)\n  %s2: f32[4,6] = add(%c, %d)\n  %s3: f32[4,6] = add(%e, %f)\n"
      "  %s4: f32[4,6] = add(%k, %o)\n  %s5: f32[4,6] = add(%s1, %s2)\n  %s6: f32[4,6] = add(%s3, %s4)\n"
      "  %y: f32[4,6] = add(%s5, %s6)\n  %l: f32[] = sum(%y)\n  loss %l\n}\n";
  evt_graph *g = check_preserves(text, evt_pass_decompose, 0, false);
  if (!g) return;
  int pows = 0; /* left: value=1.7, and the gradients' pow(x, e - 1) of 1.7, -0.5 and -2 */
  for (int i = 0; i < g->nnodes; i++)
    if (g->nodes[i].op == EVT_OP_POW) {
      double e = g->nodes[i].attr.value;
      CHECK_MSG(fabs(e - 1.7) < 1e-12 || fabs(e - 0.7) < 1e-12 || e == -1.5 || e == -3, "pow(x, %g) left", e);
      pows++;
    }
  CHECK(pows >= 1 && evt_test_count_op(g, EVT_OP_SQRT) >= 1 && evt_test_count_op(g, EVT_OP_RSQRT) >= 1);
  evt_graph_free(g);
}

/* A 16-bit dropout decomposes into the same bits: its mask as before, and its 1/(1-p) an f32 factor (a bf16 scalar
 * rounded it to 1.109375: a quarter of the elements one bf16 step off). Compared with every node rounded. */
TEST(values_decomposed_16bit_dropout_is_bit_identical) {
  const char *texts[] = {
      "graph t {\n  %x: bf16[16,64] = input()\n  %d: bf16[16,64] = dropout(%x, p=0.1, seed=5, offset=7)\n  output %d\n}\n",
      "graph t {\n  %x: f16[16,64] = input()\n  %d: f16[16,64] = dropout(%x, p=0.3, seed=2)\n  output %d\n}\n"};
  for (int t = 0; t < EVT_ARRAY_LEN(texts); t++) {
    evt_graph *g = check_preserves_at(texts[t], evt_pass_decompose, 0, false, 0, 0.0);
    if (g) CHECK(evt_test_count_op(g, EVT_OP_DROPOUT) == 0 && evt_test_count_op(g, EVT_OP_RAND) == 1);
    evt_graph_free(g);
  }
}

/* Constant propagation folds (x * a) * b and -(x * a) of 16-bit x with f32 factors (evt_rw_factor) into one f32
 * factor: a bf16 one would round 1/0.9 * 1/3 to 0.37109375. */
TEST(constprop_keeps_f32_factors_of_16bit_math) {
  const char *text = "graph t {\n  %x: bf16[8,16] = input()\n  %a: f32[] = scalar(value=1.1111111111111112)\n"
                     "  %b: f32[] = scalar(value=0.33333333333333331)\n  %y: bf16[8,16] = mul(%x, %a)\n"
                     "  %z: bf16[8,16] = mul(%y, %b)\n  %n: bf16[8,16] = neg(%y)\n  output %z, %n\n}\n";
  evt_graph *g = check_preserves_at(text, evt_pass_constprop, 0, false, 0, 4e-3);
  if (!g) return;
  const double want[2] = {1.1111111111111112 * 0.33333333333333331, -1.1111111111111112};
  for (int o = 0; o < 2; o++) { /* z = x * (a·b), n = x * -a */
    const evt_node *m = &g->nodes[g->outputs[o]];
    int k = m->ninputs == 2 && g->nodes[m->inputs[0]].op == EVT_OP_SCALAR ? 0 : 1;
    const evt_node *sc = m->ninputs == 2 ? &g->nodes[m->inputs[k]] : NULL;
    CHECK_MSG(m->op == EVT_OP_MUL && sc && sc->op == EVT_OP_SCALAR && g->nodes[m->inputs[1 - k]].op == EVT_OP_INPUT,
              "output %d: %s", o, evt_op_table[m->op].name);
    if (sc && sc->op == EVT_OP_SCALAR)
      CHECK_MSG(sc->type.dtype == EVT_F32 && sc->attr.value == want[o], "output %d: folded scalar %s %.17g", o,
                evt_dtype_name(sc->type.dtype), sc->attr.value);
  }
  evt_graph_free(g);
}

TEST(values_whole_pipeline_keeps_loss) {
  for (int t = 0; t < EVT_ARRAY_LEN(kLosses); t++) {
    evt_graph *g = check_preserves(kLosses[t], evt_pass_canonicalize, 0, false);
    if (!g) continue;
    char *text = evt_graph_to_string(g);
    evt_graph_free(g);
    evt_status (*passes[])(evt_graph *, evt_pass_stats *) = {evt_pass_loss_elim, evt_pass_decompose, evt_pass_reduce_elim,
                                                              evt_pass_constprop, evt_pass_cse, evt_pass_layout};
    for (int p = 0; p < EVT_ARRAY_LEN(passes) && text; p++) {
      g = check_preserves(text, passes[p], 0, false);
      free(text);
      text = g ? evt_graph_to_string(g) : NULL;
      if (g) CHECK(g->loss >= 0 && g->loss == g->outputs[0]);
      evt_graph_free(g);
    }
    free(text);
  }
}

/* ---- the examples: the softmax-cross-entropy backward keeps no row reduction ------------------------ */

/* Runs the given passes on examples/<name>.evt (joint graph) and checks that no node a gradient needs
 * reduces the class dim of a tensor shaped like the cross-entropy logits (and that no log_softmax or
 * nll_loss backward op is left). Returns false if the file has no cross_entropy. */
static bool ce_backward_row_free(const char *name, evt_status (*const *passes)(evt_graph *, evt_pass_stats *), int np) {
  char path[256], *err = NULL;
  snprintf(path, sizeof path, "examples/%s.evt", name);
  evt_graph *g = evt_parse_file(path, &err);
  CHECK_MSG(g != NULL, "%s: %s", path, err ? err : "?");
  free(err);
  if (!g) return false;
  evt_type logits = {0};
  bool found = false;
  for (int i = 0; i < g->nnodes; i++)
    if (g->nodes[i].op == EVT_OP_CROSS_ENTROPY) logits = g->nodes[g->nodes[i].inputs[0]].type, found = true;
  if (!found) {
    evt_graph_free(g);
    return false;
  }
  CHECK(evt_graph_build_joint(g, 0) == EVT_OK);
  for (int p = 0; p < np; p++) {
    evt_pass_stats st = {0};
    run_pass(g, passes[p], &st);
  }
  char *need = calloc((size_t)g->nnodes, 1);
  for (int o = 1; o < g->noutputs; o++) need[g->outputs[o]] = 1;
  for (int i = g->nnodes - 1; i >= 0; i--) {
    if (!need[i]) continue;
    const evt_node *n = &g->nodes[i];
    for (int k = 0; k < n->ninputs; k++) need[n->inputs[k]] = 1;
    CHECK_MSG(n->op != EVT_OP_LOG_SOFTMAX_BACKWARD && n->op != EVT_OP_NLL_LOSS_BACKWARD,
              "%s: %%%s (%s) left in the backward", name, n->name, evt_op_table[n->op].name);
    if (n->op != EVT_OP_SUM && n->op != EVT_OP_MEAN && n->op != EVT_OP_AMAX) continue;
    if (!evt_type_equal(&g->nodes[n->inputs[0]].type, &logits)) continue;
    bool class_dim = n->attr.dims.n == 0;
    for (int d = 0; d < n->attr.dims.n; d++) class_dim = class_dim || n->attr.dims.v[d] == 1;
    CHECK_MSG(!class_dim, "%s: row reduction %%%s left in the cross-entropy backward", name, n->name);
  }
  free(need);
  CHECK(g->loss >= 0 && g->outputs[0] == g->loss);
  evt_graph_free(g);
  return true;
}

TEST(examples_ce_backward_has_no_row_reduction) {
  static const char *names[] = {"mlp", "bert_layer", "bert_layer_sdpa", "vit", "gcn", "xmlcnn", "resnet_block"};
  evt_status (*const full[])(evt_graph *, evt_pass_stats *) = {evt_pass_canonicalize, evt_pass_loss_elim, evt_pass_decompose,
                                                               evt_pass_reduce_elim, evt_pass_constprop, evt_pass_cse,
                                                               evt_pass_layout, evt_pass_dce};
  /* the paper's route: no loss elimination; decomposition + reduction elimination remove the row sum */
  evt_status (*const paper[])(evt_graph *, evt_pass_stats *) = {evt_pass_canonicalize, evt_pass_decompose,
                                                                evt_pass_reduce_elim, evt_pass_constprop, evt_pass_cse};
  int ce = 0;
  for (int i = 0; i < EVT_ARRAY_LEN(names); i++) {
    ce += ce_backward_row_free(names[i], full, EVT_ARRAY_LEN(full));
    ce_backward_row_free(names[i], paper, EVT_ARRAY_LEN(paper));
  }
  CHECK(ce >= 5); /* every cross-entropy example was checked */
}

TEST(pipeline_order_and_run_all) {
  static const char *order[] = {"canonicalize", "fp8", "loss-elim", "decompose", "reduce-elim", "constprop", "cse", "edge-spmm",
                                "layout", "dce", "split-casts"};
  CHECK(evt_npasses == EVT_ARRAY_LEN(order));
  for (int i = 0; i < evt_npasses && i < EVT_ARRAY_LEN(order); i++) CHECK(strcmp(evt_passes[i].name, order[i]) == 0);
  for (int i = 0; i < evt_npasses; i++) CHECK(evt_passes[i].needs == (i == 1 ? EVT_PASS_FP8 : 0u)); /* fp8: opt-in */
  CHECK(evt_pass_find("cse", 3) == &evt_passes[6] && evt_pass_find("cs", 2) == NULL);
  evt_graph *g = evt_test_parse_ok(kCeJoint);
  CHECK(evt_passes_run_all(g, 0, 1) == EVT_OK);
  CHECK(evt_test_count_op(g, EVT_OP_LOG_SOFTMAX) == 0 && evt_test_count_op(g, EVT_OP_NLL_LOSS) == 0);
  CHECK(g->loss == g->outputs[0] && g->noutputs == 2);
  evt_graph_free(g);
  /* a graph with nothing to do, and an empty one */
  g = evt_test_parse_ok("graph t {\n  %x: f32[2] = input()\n  output %x\n}\n");
  CHECK(evt_passes_run_all(g, EVT_PASS_DROP_LOSS, 1) == EVT_OK && g->nnodes == 1);
  evt_graph_free(g);
  g = evt_graph_new("empty");
  CHECK(evt_passes_run_all(g, 0, 1) == EVT_OK && g->nnodes == 0);
  evt_graph_free(g);
}

/* ---- randomized: every pass keeps the values of random DAGs ------------------------------------------ */

static uint64_t rng_next(uint64_t *s) {
  *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
  return *s;
}

/* A random DAG of broadcasting elementwise ops, reductions, layout ops, constants and one_hot over
 * f32 shapes drawn from [4,5], [4,1], [1,5] and what the ops make of them. */
static evt_graph *random_graph(uint64_t seed) {
  uint64_t s = seed * 2654435761u + 1;
  evt_graph *g = evt_graph_new("rnd");
  static const int64_t shapes[][2] = {{4, 5}, {4, 1}, {1, 5}};
  int nodes[64], n = 0;
  for (int i = 0; i < 3; i++) {
    char name[16];
    snprintf(name, sizeof name, "in%d", i);
    nodes[n++] = evt_input(g, name, EVT_F32, 2, shapes[i]);
  }
  int64_t ts[] = {4};
  int t = evt_input(g, "t", EVT_I64, 1, ts);
  g->nodes[t].attr.init = EVT_INIT_RANDINT, g->nodes[t].attr.hi = 5;
  g->nodes[t].attr_given |= (1ull << EVT_ATTR_INIT) | (1ull << EVT_ATTR_HI);
  evt_attr oh[] = {EVT_ATTR_INT("num_classes", 5)};
  nodes[n++] = evt_add_op(g, "one_hot", &t, 1, oh, 1);
  static const char *bin[] = {"add", "sub", "mul", "mul", "maximum"};
  static const char *un[] = {"neg", "tanh", "relu", "sigmoid"};
  for (int tries = 0; n < 24 && tries < 400; tries++) {
    int a = nodes[rng_next(&s) % (uint64_t)n], b = nodes[rng_next(&s) % (uint64_t)n], id = -1;
    switch (rng_next(&s) % 9) {
    case 0: case 1: case 2: id = evt_add_op(g, bin[rng_next(&s) % 5], (int[]){a, b}, 2, NULL, 0); break;
    case 3: id = evt_add_op(g, un[rng_next(&s) % 4], &a, 1, NULL, 0); break;
    case 4: { /* reduction over one dim or all */
      int rank = g->nodes[a].type.rank;
      evt_attr at[2] = {{.name = "dims", .n = rank ? 1 : 0, .list = {(int64_t)(rng_next(&s) % (uint64_t)(rank ? rank : 1))}},
                        EVT_ATTR_INT("keepdim", (int64_t)(rng_next(&s) % 2))};
      id = evt_add_op(g, rng_next(&s) % 2 ? "sum" : "mean", &a, 1, at, 2);
      break;
    }
    case 5: { /* a constant operand: scalar or full */
      double v = (double)(rng_next(&s) % 5) - 1.0; /* -1, 0, 1, 2, 3 */
      evt_attr va[] = {EVT_ATTR_FLOAT("value", v)};
      int c = evt_add_op(g, "scalar", NULL, 0, va, 1);
      if (c >= 0) g->nodes[c].type.dtype = EVT_F32;
      id = c < 0 ? -1 : evt_add_op(g, rng_next(&s) % 3 ? "mul" : "add", (int[]){a, c}, 2, NULL, 0);
      break;
    }
    case 6: { /* permute there and back, or a reshape round trip */
      if (g->nodes[a].type.rank != 2) break;
      evt_attr p[] = {{.name = "dims", .n = 2, .list = {1, 0}}};
      int q = evt_add_op(g, "permute", &a, 1, p, 1);
      int r = q < 0 ? -1 : evt_add_op(g, "relu", &q, 1, NULL, 0);
      id = r < 0 ? -1 : evt_add_op(g, "permute", &r, 1, p, 1);
      break;
    }
    case 7: { /* expand to [4,5] */
      evt_attr e[] = {{.name = "shape", .n = 2, .list = {4, 5}}};
      id = evt_add_op(g, "expand", &a, 1, e, 1);
      break;
    }
    case 8: { /* divide by a nonzero constant */
      evt_attr va[] = {EVT_ATTR_FLOAT("value", (double)(rng_next(&s) % 3) + 2.0)};
      int c = evt_add_op(g, "scalar", NULL, 0, va, 1);
      id = c < 0 ? -1 : evt_add_op(g, "div", (int[]){a, c}, 2, NULL, 0);
      break;
    }
    }
    if (id >= 0 && evt_dtype_is_float(g->nodes[id].type.dtype)) nodes[n++] = id;
  }
  /* every float node nobody uses is an output, so the whole DAG is live */
  int *uses = calloc((size_t)g->nnodes, sizeof(int));
  for (int i = 0; i < g->nnodes; i++)
    for (int k = 0; k < g->nodes[i].ninputs; k++) uses[g->nodes[i].inputs[k]]++;
  for (int i = 0; i < g->nnodes; i++)
    if (!uses[i] && g->nodes[i].op != EVT_OP_INPUT && evt_dtype_is_float(g->nodes[i].type.dtype)) evt_graph_add_output(g, i);
  free(uses);
  return g;
}

TEST(random_graphs_every_pass_keeps_values) {
  evt_status (*passes[])(evt_graph *, evt_pass_stats *) = {evt_pass_canonicalize, evt_pass_loss_elim, evt_pass_decompose,
                                                           evt_pass_reduce_elim, evt_pass_constprop, evt_pass_cse,
                                                           evt_pass_layout, evt_pass_dce};
  for (uint64_t seed = 1; seed <= 150; seed++) {
    evt_graph *g = random_graph(seed);
    CHECK_MSG(evt_graph_verify(g) == EVT_OK, "seed %llu: %s", (unsigned long long)seed, evt_graph_error(g));
    char *text = evt_graph_to_string(g);
    evt_graph_free(g);
    for (int p = 0; p < EVT_ARRAY_LEN(passes) && text; p++) {
      g = check_preserves(text, passes[p], 0, false);
      free(text);
      text = g ? evt_graph_to_string(g) : NULL;
      evt_graph_free(g);
    }
    free(text);
  }
}

/* ---- channels-last (decompose) and permute propagation (layout) -------------------------------------- */

static evt_status decompose_then_layout(evt_graph *g, evt_pass_stats *st) {
  evt_status s = evt_pass_decompose(g, st);
  return s == EVT_OK ? evt_pass_layout(g, st) : s;
}

static int count_layout(const evt_graph *g, int64_t layout) {
  int c = 0;
  for (int i = 0; i < g->nnodes; i++) {
    evt_op op = g->nodes[i].op;
    bool conv_pool = evt_op_table[op].cls == EVT_CLASS_CONV || evt_op_table[op].cls == EVT_CLASS_POOL;
    c += conv_pool && ((evt_op_table[op].attrs >> EVT_ATTR_LAYOUT) & 1u) && g->nodes[i].attr.layout == layout;
  }
  return c;
}

static const char *kConvPoolOps =
    "graph t {\n"
    "  %x: f32[2,4,5,6] = input()\n"
    "  %w: f32[6,2,3,3] = param()\n"
    "  %dy: f32[2,6,3,6] = input()\n"
    "  %dp: f32[2,4,3,4] = input()\n"
    "  %y: f32[2,6,3,6] = conv2d(%x, %w, stride=[2,1], padding=[1,1], groups=2)\n"
    "  %dx: f32[2,4,5,6] = conv2d_backward_input(%dy, %w, shape=[2,4,5,6], stride=[2,1], padding=[1,1], groups=2)\n"
    "  %dw: f32[6,2,3,3] = conv2d_backward_weight(%x, %dy, shape=[6,2,3,3], stride=[2,1], padding=[1,1], groups=2)\n"
    "  %p: f32[2,4,3,4] = max_pool2d(%x, kernel=[3,2], stride=[2,2], padding=[1,1])\n"
    "  %pb: f32[2,4,5,6] = max_pool2d_backward(%dp, %x, kernel=[3,2], stride=[2,2], padding=[1,1])\n"
    "  %a: f32[2,4,3,4] = avg_pool2d(%x, kernel=[3,2], stride=[2,2], padding=[1,1])\n"
    "  %ab: f32[2,4,5,6] = avg_pool2d_backward(%dp, shape=[2,4,5,6], kernel=[3,2], stride=[2,2], padding=[1,1])\n"
    "  %m: f32[2,4,2,3] = adaptive_max_pool2d(%x, shape=[2,3])\n"
    "  %dm: f32[2,4,2,3] = input()\n"
    "  %mb: f32[2,4,5,6] = adaptive_max_pool2d_backward(%dm, %x, shape=[2,3])\n"
    "  output %y, %dx, %dw, %p, %pb, %a, %ab, %m, %mb\n"
    "}\n";

TEST(decompose_conv_pool_channels_last) {
  evt_graph *g = check_preserves(kConvPoolOps, evt_pass_decompose, 0, false);
  if (!g) return;
  CHECK(count_layout(g, EVT_LAYOUT_NHWC) == 9 && count_layout(g, EVT_LAYOUT_NCHW) == 0);
  /* x, w, dy, dp, dm in (after CSE they would be shared; decompose alone makes one per use), 9 results out */
  CHECK(evt_test_count_op(g, EVT_OP_PERMUTE) == 2 + 2 + 2 + 1 + 2 + 1 + 1 + 1 + 2 + 9);
  for (int i = 0; i < g->nnodes; i++)
    if (g->nodes[i].op == EVT_OP_CONV2D_BACKWARD_WEIGHT) /* weights [O,kh,kw,C/g] */
      CHECK(g->nodes[i].type.shape[0] == 6 && g->nodes[i].type.shape[1] == 3 && g->nodes[i].type.shape[3] == 2);
  evt_graph_free(g);
}

TEST(layout_cancels_channels_last_permutes) {
  static const char *text = "graph t {\n"
                            "  %x: f32[2,3,6,5] = input()\n"
                            "  %w1: f32[4,3,3,3] = param()\n"
                            "  %c1: f32[2,4,6,5] = conv2d(%x, %w1, padding=[1,1])\n"
                            "  %b: f32[4] = param()\n"
                            "  %b3: f32[4,1,1] = reshape(%b, shape=[4,1,1])\n"
                            "  %a: f32[2,4,6,5] = add(%c1, %b3)\n"
                            "  %m: f32[1,4,1,1] = mean(%a, dims=[0,2,3], keepdim=1)\n"
                            "  %s: f32[2,4,6,5] = sub(%a, %m)\n"
                            "  %r: f32[2,4,6,5] = relu(%s)\n"
                            "  %w2: f32[4,4,3,3] = param()\n"
                            "  %c2: f32[2,4,6,5] = conv2d(%r, %w2, padding=[1,1])\n"
                            "  %p: f32[2,4,3,2] = max_pool2d(%c2, kernel=[2,2], stride=[2,2])\n"
                            "  %g: f32[2,4] = mean(%p, dims=[2,3])\n"
                            "  %cs: f32[4] = sum(%r, dims=[0,2,3])\n"
                            "  %am: f32[4,6,5] = amax(%r, dims=[0], keepdim=0)\n"
                            "  output %g, %cs, %am\n"
                            "}\n";
  evt_graph *g = check_preserves(text, decompose_then_layout, 0, false);
  if (!g) return;
  /* left: x, w1, w2 into the convs, and %am: amax over N keeps [C,H,W], which is not the NHWC order */
  CHECK_MSG(evt_test_count_op(g, EVT_OP_PERMUTE) == 4, "%d permutes", evt_test_count_op(g, EVT_OP_PERMUTE));
  int r = evt_graph_find(g, "r"), cs = evt_graph_find(g, "cs");
  CHECK(r >= 0 && g->nodes[r].type.shape[3] == 4 && g->nodes[r].type.shape[1] == 6);  /* %r is NHWC now */
  CHECK(cs >= 0 && g->nodes[cs].inputs[0] == r && g->nodes[cs].attr.dims.n == 3 && g->nodes[cs].attr.dims.v[2] == 2);
  evt_graph_free(g);
}

/* Propagation is committed only when it removes permutes: a permuted value added to a plain input and
 * returned would need the input permuted and the sum permuted back (2 for 1), so nothing moves. */
TEST(layout_propagation_never_adds_permutes) {
  static const char *text = "graph t {\n"
                            "  %x: f32[2,4,5,3] = input()\n"
                            "  %a: f32[2,4,5,3] = relu(%x)\n"
                            "  %p: f32[2,3,4,5] = permute(%a, dims=[0,3,1,2])\n"
                            "  %z: f32[2,3,4,5] = input()\n"
                            "  %s: f32[2,3,4,5] = add(%p, %z)\n"
                            "  %e: f32[2,3,4,5] = exp(%s)\n"
                            "  output %e\n"
                            "}\n";
  evt_graph *g = check_preserves(text, evt_pass_layout, 0, false);
  if (!g) return;
  CHECK(evt_test_count_op(g, EVT_OP_PERMUTE) == 1 && g->nodes[evt_graph_find(g, "s")].inputs[0] == evt_graph_find(g, "p"));
  evt_graph_free(g);
}

/* permute(expand(u)) -> expand of a reshape when the permute only moves size-1 dims of u; a permute around
 * a reshape that only adds size-1 dims meets the inner permute (xmlcnn's embedding -> image) */
TEST(layout_permute_through_expand_and_unit_reshape) {
  static const char *text = "graph t {\n"
                            "  %u: f32[2,3,1,1] = input()\n"
                            "  %e: f32[2,3,4,5] = expand(%u, shape=[2,3,4,5])\n"
                            "  %pe: f32[2,4,5,3] = permute(%e, dims=[0,2,3,1])\n"
                            "  %emb: f32[2,7,3] = input()\n"
                            "  %chw: f32[2,3,7] = permute(%emb, dims=[0,2,1])\n"
                            "  %img: f32[2,3,1,7] = reshape(%chw, shape=[2,3,1,7])\n"
                            "  %hwc: f32[2,1,7,3] = permute(%img, dims=[0,2,3,1])\n"
                            "  output %pe, %hwc\n"
                            "}\n";
  evt_graph *g = check_preserves(text, evt_pass_layout, 0, false);
  if (!g) return;
  CHECK_MSG(evt_test_count_op(g, EVT_OP_PERMUTE) == 0, "%d permutes", evt_test_count_op(g, EVT_OP_PERMUTE));
  CHECK(evt_test_count_op(g, EVT_OP_EXPAND) == 1);
  evt_graph_free(g);
}

/* The examples through the whole pipeline: resnet_block keeps only the permutes at its boundaries (x, the
 * two weights, the two weight gradients, the head's two transposes), and values stay (fp64). */
TEST(layout_resnet_block_permutes_cancel) {
  char *err = NULL;
  evt_graph *g = evt_parse_file("examples/resnet_block.evt", &err);
  CHECK_MSG(g != NULL, "%s", err ? err : "");
  free(err);
  if (!g) return;
  CHECK(evt_graph_build_joint(g, 0) == EVT_OK);
  CHECK(evt_passes_run_all(g, 0, 1) == EVT_OK);
  CHECK_MSG(evt_test_count_op(g, EVT_OP_PERMUTE) == 7, "%d permutes", evt_test_count_op(g, EVT_OP_PERMUTE));
  CHECK(count_layout(g, EVT_LAYOUT_NHWC) == 7 && count_layout(g, EVT_LAYOUT_NCHW) == 0);
  for (int i = 0; i < g->nnodes; i++) {
    const evt_node *n = &g->nodes[i];
    if (n->op != EVT_OP_PERMUTE) continue;
    evt_op src = g->nodes[n->inputs[0]].op;
    bool boundary = src == EVT_OP_INPUT || src == EVT_OP_PARAM || (n->flags & EVT_NODE_OUTPUT) || n->type.rank == 2;
    CHECK_MSG(boundary, "permute %%%s of %%%s inside the graph", n->name, g->nodes[n->inputs[0]].name);
  }
  evt_graph_free(g);
}

/* vit's patch embedding: conv -> + per-channel bias -> [B,C,HW] -> permute to [B,HW,C] tokens. In NHWC the
 * bias add moves below the conv's permute (the [C,1,1] bias as a [1,1,1,C] reshape) and permute(reshape(
 * permute(y))) keeps every element in place, so the tokens are a reshape of the channels-last conv. */
TEST(layout_patch_embedding_tokens_are_a_reshape) {
  static const char *text = "graph t {\n"
                            "  %img: f32[2,3,8,8] = input()\n"
                            "  %w: f32[6,3,4,4] = param()\n"
                            "  %c: f32[2,6,2,2] = conv2d(%img, %w, stride=[4,4])\n"
                            "  %b: f32[6] = param()\n"
                            "  %b3: f32[6,1,1] = reshape(%b, shape=[6,1,1])\n"
                            "  %o: f32[2,6,2,2] = add(%c, %b3)\n"
                            "  %f: f32[2,6,4] = reshape(%o, shape=[2,6,4])\n"
                            "  %t: f32[2,4,6] = permute(%f, dims=[0,2,1])\n"
                            "  output %t\n"
                            "}\n";
  evt_graph *g = check_preserves(text, decompose_then_layout, 0, false);
  if (!g) return;
  CHECK_MSG(evt_test_count_op(g, EVT_OP_PERMUTE) == 2, "%d permutes", evt_test_count_op(g, EVT_OP_PERMUTE)); /* img, w */
  int t = evt_graph_find(g, "t");
  CHECK(t >= 0 && g->nodes[t].op == EVT_OP_RESHAPE && g->nodes[g->nodes[t].inputs[0]].op == EVT_OP_ADD);
  evt_graph_free(g);
}

/* An involution (a transpose): the permute back of a node already moved to the transposed order is a
 * permute user that cancels, not a new seed; both transposes go. */
TEST(layout_propagation_involution) {
  static const char *text = "graph t {\n"
                            "  %x: f32[3,4] = input()\n"
                            "  %a: f32[3,4] = exp(%x)\n"
                            "  %t: f32[4,3] = permute(%a, dims=[1,0])\n"
                            "  %b: f32[4,3] = relu(%t)\n"
                            "  %c: f32[3,4] = permute(%b, dims=[1,0])\n"
                            "  %d: f32[3,4] = sigmoid(%c)\n"
                            "  %s: f32[4] = sum(%b, dims=[1])\n"
                            "  output %d, %s\n"
                            "}\n";
  evt_graph *g = check_preserves(text, evt_pass_layout, 0, false);
  if (!g) return;
  CHECK_MSG(evt_test_count_op(g, EVT_OP_PERMUTE) == 0, "%d permutes", evt_test_count_op(g, EVT_OP_PERMUTE));
  evt_graph_free(g);
}

/* Random NCHW DAGs: elementwise ops over activations [2,3,4,5] and per-channel / per-sample broadcasts,
 * keepdim reductions over random dims (keepdim=0 ones are outputs), conv2d and shape-keeping max/avg pools.
 * Decompose (channels-last), CSE, then layout keep every value, and layout never leaves more permutes than it
 * got. */
static evt_graph *random_nchw_graph(uint64_t seed) {
  uint64_t s = seed * 2654435761u + 7;
  evt_graph *g = evt_graph_new("rnd4");
  int nodes[64], n = 0, full[64], nf = 0;
  int64_t xs[] = {2, 3, 4, 5}, bs[] = {3}, ws[] = {3, 3, 3, 3};
  full[nf++] = nodes[n++] = evt_input(g, "x", EVT_F32, 4, xs);
  full[nf++] = nodes[n++] = evt_input(g, "y", EVT_F32, 4, xs);
  int b = evt_param(g, "b", EVT_F32, 1, bs), w = evt_param(g, "w", EVT_F32, 4, ws);
  evt_attr c3[] = {{.name = "shape", .n = 3, .list = {3, 1, 1}}};
  nodes[n++] = evt_add_op(g, "reshape", &b, 1, c3, 1);
  static const char *bin[] = {"add", "sub", "mul", "maximum"};
  static const char *un[] = {"neg", "tanh", "relu", "exp"};
  for (int tries = 0; n < 28 && tries < 400; tries++) {
    int a = nodes[rng_next(&s) % (uint64_t)n], c = nodes[rng_next(&s) % (uint64_t)n], f = full[rng_next(&s) % (uint64_t)nf];
    int id = -1;
    bool is_full = false;
    switch (rng_next(&s) % 8) {
    case 0: case 1: id = evt_add_op(g, bin[rng_next(&s) % 4], (int[]){f, c}, 2, NULL, 0), is_full = true; break;
    case 2: id = evt_add_op(g, bin[rng_next(&s) % 4], (int[]){a, c}, 2, NULL, 0); break;
    case 3: id = evt_add_op(g, un[rng_next(&s) % 4], &a, 1, NULL, 0), is_full = a == f; break;
    case 4: { /* reduction over a random non-empty subset of dims */
      evt_attr at[2] = {{.name = "dims"}, EVT_ATTR_INT("keepdim", (int64_t)(rng_next(&s) % 3 != 0))};
      uint64_t mask = 1 + rng_next(&s) % 15;
      for (int d = 0; d < 4; d++)
        if (mask >> d & 1) at[0].list[at[0].n++] = d;
      id = evt_add_op(g, rng_next(&s) % 2 ? "sum" : "mean", &f, 1, at, 2);
      if (id >= 0 && g->nodes[id].type.rank != 4) {
        evt_graph_add_output(g, id);
        id = -1;
      }
      break;
    }
    case 5: {
      evt_attr pa[] = {{.name = "padding", .n = 2, .list = {1, 1}}};
      id = evt_add_op(g, "conv2d", (int[]){f, w}, 2, pa, 1), is_full = true;
      break;
    }
    case 6: case 7: {
      evt_attr pa[] = {{.name = "kernel", .n = 2, .list = {3, 3}}, {.name = "padding", .n = 2, .list = {1, 1}}};
      id = evt_add_op(g, rng_next(&s) % 2 ? "max_pool2d" : "avg_pool2d", &f, 1, pa, 2), is_full = true;
      break;
    }
    }
    if (id < 0) continue;
    nodes[n++] = id;
    if (is_full && g->nodes[id].type.shape[0] == 2 && g->nodes[id].type.shape[2] == 4) full[nf++] = id;
  }
  int *uses = calloc((size_t)g->nnodes, sizeof(int));
  for (int i = 0; i < g->nnodes; i++)
    for (int k = 0; k < g->nodes[i].ninputs; k++) uses[g->nodes[i].inputs[k]]++;
  for (int i = 0; i < g->noutputs; i++) uses[g->outputs[i]]++;
  for (int i = 0; i < g->nnodes; i++)
    if (!uses[i] && g->nodes[i].op != EVT_OP_INPUT && g->nodes[i].op != EVT_OP_PARAM) evt_graph_add_output(g, i);
  free(uses);
  return g;
}

TEST(random_nchw_graphs_channels_last) {
  int before = 0, after = 0;
  for (uint64_t seed = 1; seed <= 60; seed++) {
    evt_graph *g = random_nchw_graph(seed);
    CHECK_MSG(evt_graph_verify(g) == EVT_OK, "seed %llu: %s", (unsigned long long)seed, evt_graph_error(g));
    char *text = evt_graph_to_string(g);
    evt_graph_free(g);
    g = text ? check_preserves(text, evt_pass_decompose, 0, false) : NULL;
    free(text);
    if (!g) continue;
    evt_pass_stats st = {0};
    run_pass(g, evt_pass_cse, &st); /* the pipeline merges the permutes of a shared input before layout */
    int p1 = evt_test_count_op(g, EVT_OP_PERMUTE);
    text = evt_graph_to_string(g);
    evt_graph_free(g);
    g = text ? check_preserves(text, evt_pass_layout, 0, false) : NULL;
    free(text);
    if (!g) continue;
    int p2 = evt_test_count_op(g, EVT_OP_PERMUTE);
    CHECK_MSG(p2 <= p1, "seed %llu: %d permutes after decompose, %d after layout", (unsigned long long)seed, p1, p2);
    before += p1, after += p2;
    evt_graph_free(g);
  }
  /* every intermediate is an output here (NCHW at the boundary), so only part of the permutes can go */
  CHECK_MSG(after < before, "layout left %d of %d permutes", after, before);
}

/* Random chains of permutes and reshapes (merge two adjacent dims, split one, insert a size-1 dim) on a
 * [2,3,4] or [4,6] input: the layout pass (chain folding, identity chains as reshapes, unit-reshape and
 * expand rules) keeps every value, and never leaves more permutes than the chain had. */
TEST(random_view_chains_keep_values) {
  int folded = 0;
  for (uint64_t seed = 1; seed <= 300; seed++) {
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 3;
    evt_graph *g = evt_graph_new("chain");
    int64_t a[] = {2, 3, 4}, b[] = {4, 6};
    int x = seed % 2 ? evt_input(g, "x", EVT_F32, 3, a) : evt_input(g, "x", EVT_F32, 2, b);
    int steps = 2 + (int)(rng_next(&s) % 4), permutes = 0;
    for (int k = 0; k < steps && x >= 0; k++) {
      const evt_type *t = &g->nodes[x].type;
      evt_attr at = {.name = "shape"};
      int r = t->rank;
      uint64_t kind = rng_next(&s) % 4;
      if (kind <= 1 && r >= 2) { /* a random permutation */
        at.name = "dims", at.n = r;
        for (int i = 0; i < r; i++) at.list[i] = i;
        for (int i = r - 1; i > 0; i--) {
          int j = (int)(rng_next(&s) % (uint64_t)(i + 1));
          int64_t tmp = at.list[i];
          at.list[i] = at.list[j], at.list[j] = tmp;
        }
        x = evt_add_op(g, "permute", &x, 1, &at, 1);
        permutes++;
        continue;
      }
      int d = (int)(rng_next(&s) % (uint64_t)r);
      if (kind == 2 && r >= 2 && d + 1 < r) { /* merge d and d+1 */
        for (int i = 0, o = 0; i < r; i++) at.list[o++] = i == d ? t->shape[i] * t->shape[i + 1] : t->shape[i], i += i == d;
        at.n = r - 1;
      } else if (r < 5) { /* split d into (f, size/f) for its smallest factor f, or insert a 1 before d */
        int64_t n = t->shape[d], f = 2;
        while (f < n && n % f) f++;
        for (int i = 0; i < r; i++) {
          if (i == d) {
            at.list[at.n++] = f < n ? f : 1;
            at.list[at.n++] = f < n ? n / f : n;
          } else {
            at.list[at.n++] = t->shape[i];
          }
        }
      } else {
        continue;
      }
      x = evt_add_op(g, "reshape", &x, 1, &at, 1);
    }
    CHECK_MSG(x >= 0, "seed %llu: %s", (unsigned long long)seed, evt_graph_error(g));
    if (x < 0) {
      evt_graph_free(g);
      continue;
    }
    evt_graph_add_output(g, x);
    char *text = evt_graph_to_string(g);
    evt_graph_free(g);
    g = check_preserves(text, evt_pass_layout, 0, false);
    free(text);
    if (!g) continue;
    int left = evt_test_count_op(g, EVT_OP_PERMUTE);
    CHECK_MSG(left <= permutes, "seed %llu: %d permutes -> %d", (unsigned long long)seed, permutes, left);
    folded += left < permutes;
    evt_graph_free(g);
  }
  CHECK(folded > 0);
}
