/* Hostile inputs (issue 46, "no wrong answers, no crash"): values at the edges of their dtype, batches where
 * every target is ignored or no row exists, rounding that a pass must keep. Each case is checked against
 * PyTorch's answer (eager CPU, torch 2.11), written next to it. */
#include "test.h"

#include "passes/passes.h"

/* ---- cross-entropy where no target counts ----------------------------------------------------------- */

/* Runs the joint graph of text (after the whole pass pipeline when opt) on its init values; returns the
 * values (caller frees with free_values) or NULL after a test failure. */
static evt_tensor *run_joint(evt_graph *g, bool opt) {
  if (g->loss >= 0 && g->noutputs == 1) CHECK_MSG(evt_graph_build_joint(g, 0) == EVT_OK, "%s", evt_graph_error(g));
  if (opt) CHECK_MSG(evt_passes_run_all(g, 0, 0) == EVT_OK, "passes: %s", evt_graph_error(g));
  evt_tensor *v = calloc((size_t)g->nnodes, sizeof *v);
  CHECK(evt_interp_init_inputs(g, v, 3) == EVT_OK);
  if (evt_interp_run(g, v, 0, 0) == EVT_OK) return v;
  CHECK_MSG(false, "run: %s", evt_graph_error(g));
  for (int i = 0; i < g->nnodes; i++) evt_tensor_free(&v[i]);
  free(v);
  return NULL;
}

static void free_values(evt_graph *g, evt_tensor *v) {
  for (int i = 0; v && i < g->nnodes; i++) evt_tensor_free(&v[i]);
  free(v);
}

/* Every gradient output is exactly 0 and the loss is NaN (want_nan) or 0: PyTorch's answer when no target
 * counts (its mean divides 0 by 0; the gradient of every ignored row is 0). */
static void check_no_target_counts(const char *what, const char *text, bool want_nan) {
  for (int opt = 0; opt < 2; opt++) {
    evt_graph *g = evt_test_parse_ok(text);
    if (!g) return;
    evt_tensor *v = run_joint(g, opt);
    for (int o = 0; v && o < g->noutputs; o++) {
      const evt_tensor *t = &v[g->outputs[o]];
      for (int64_t i = 0; i < t->numel; i++) {
        double x = t->data[i];
        bool ok = g->outputs[o] == g->loss ? (want_nan ? isnan(x) : x == 0) : x == 0;
        CHECK_MSG(ok, "%s%s: output %d (%%%s) element %lld is %g", what, opt ? " (optimized)" : "", o,
                  g->nodes[g->outputs[o]].name, (long long)i, x);
        if (!ok) break;
      }
    }
    free_values(g, v);
    evt_graph_free(g);
  }
}

static const char *kCeHead = "graph t {\n  %x: f32[4,5] = input()\n  %w: f32[5,5] = param()\n  %h: f32[4,5] = mm(%x, %w)\n"
                             "  %y: i64[4] = input(init=zeros)\n";

/* torch: F.cross_entropy(x, full(-100)) is nan (mean) / 0 (sum), x.grad is 0 */
TEST(hostile_ce_every_target_ignored) {
  const char *red[] = {"mean", "sum"};
  for (int r = 0; r < 2; r++) {
    char text[1024];
    snprintf(text, sizeof text, "%s  %%l: f32[] = cross_entropy(%%h, %%y, ignore_index=0, reduction=%s)\n  loss %%l\n}\n",
             kCeHead, red[r]);
    check_no_target_counts(red[r], text, r == 0);
    snprintf(text, sizeof text,
             "%s  %%lp: f32[4,5] = log_softmax(%%h, dim=1)\n  %%l: f32[] = nll_loss(%%lp, %%y, ignore_index=0, reduction=%s)\n"
             "  loss %%l\n}\n", kCeHead, red[r]);
    check_no_target_counts(red[r], text, r == 0);
  }
}

/* Label smoothing as PyTorch computes it (aten cross_entropy_loss_label_smoothing, reduction=mean, 5 classes,
 * 0.1): 0.9 * nll + 0.1/5 * sum(where(t == ignore, 0, -sum(lp, 1))) / count(t != ignore). torch: loss nan,
 * x.grad 0. */
TEST(hostile_ce_label_smoothing_every_target_ignored) {
  char text[2048];
  snprintf(text, sizeof text,
           "%s  %%lp: f32[4,5] = log_softmax(%%h, dim=1)\n  %%nll: f32[] = nll_loss(%%lp, %%y, ignore_index=0)\n"
           "  %%s: f32[4] = sum(%%lp, dims=[1])\n  %%ns: f32[4] = neg(%%s)\n  %%zi: i64[] = scalar(value=0)\n"
           "  %%ign: bool[4] = eq(%%y, %%zi)\n  %%zf: f32[] = scalar(value=0)\n  %%m: f32[4] = where(%%ign, %%zf, %%ns)\n"
           "  %%ms: f32[] = sum(%%m)\n  %%keep: bool[4] = ne(%%y, %%zi)\n  %%kf: f32[4] = cast(%%keep, dtype=f32)\n"
           "  %%cnt: f32[] = sum(%%kf)\n  %%sm: f32[] = div(%%ms, %%cnt)\n  %%a: f32[] = scalar(value=0.9)\n"
           "  %%b: f32[] = scalar(value=0.02)\n  %%l1: f32[] = mul(%%nll, %%a)\n  %%l2: f32[] = mul(%%sm, %%b)\n"
           "  %%l: f32[] = add(%%l1, %%l2)\n  loss %%l\n}\n",
           kCeHead);
  check_no_target_counts("label smoothing", text, true);
}

/* An empty batch (N = 0). torch: loss nan (mean) / 0 (sum), x.grad of shape [0, 5]; the weight gradient is 0. */
TEST(hostile_ce_empty_batch) {
  const char *red[] = {"mean", "sum"};
  for (int r = 0; r < 2; r++) {
    char text[1024];
    snprintf(text, sizeof text,
             "graph t {\n  %%x: f32[0,5] = input()\n  %%w: f32[5,5] = param()\n  %%h: f32[0,5] = mm(%%x, %%w)\n"
             "  %%y: i64[0] = input(init=zeros)\n  %%l: f32[] = cross_entropy(%%h, %%y, reduction=%s)\n  loss %%l\n}\n",
             red[r]);
    check_no_target_counts(red[r], text, r == 0);
  }
}

/* ---- constant propagation keeps each dtype's rounding ------------------------------------------------ */

/* Same value, bit for bit (NaN equal to NaN). */
static bool same_value(double a, double b) { return (isnan(a) && isnan(b)) || a == b; }

/* Runs text's graph before and after constprop on the same inputs, with every node rounded to its dtype and in
 * fp64, and checks that every output keeps every bit in both. */
static void check_constprop_exact(const char *text) {
  for (int mode = 0; mode < 2; mode++) {
    unsigned flags = mode ? EVT_RUN_FP64 : 0;
    evt_graph *g = evt_test_parse_ok(text), *h = evt_test_parse_ok(text);
    if (!g || !h) return;
    evt_pass_stats st = {0};
    CHECK(evt_pass_constprop(h, &st) == EVT_OK);
    evt_tensor *a = calloc((size_t)g->nnodes, sizeof *a), *b = calloc((size_t)h->nnodes, sizeof *b);
    CHECK(evt_interp_init_inputs(g, a, 7) == EVT_OK && evt_interp_init_inputs(h, b, 7) == EVT_OK);
    CHECK_MSG(evt_interp_run(g, a, flags, 0) == EVT_OK, "%s", evt_graph_error(g));
    CHECK_MSG(evt_interp_run(h, b, flags, 0) == EVT_OK, "%s", evt_graph_error(h));
    for (int o = 0; o < g->noutputs && o < h->noutputs; o++) {
      const evt_tensor *x = &a[g->outputs[o]], *y = &b[h->outputs[o]];
      for (int64_t i = 0; i < x->numel && x->numel == y->numel; i++)
        if (!same_value(x->data[i], y->data[i])) {
          CHECK_MSG(false, "%s: output %%%s element %lld: %.17g before constprop, %.17g after", mode ? "fp64" : "rounded",
                    g->nodes[g->outputs[o]].name, (long long)i, x->data[i], y->data[i]);
          break;
        }
    }
    free_values(g, a);
    free_values(h, b);
    evt_graph_free(g);
    evt_graph_free(h);
  }
}

/* torch: c = full(60000, f16); (c + c) - c is inf; full(0.2, f16).float() is 0.199951171875 */
TEST(hostile_constprop_keeps_f16_rounding) {
  check_constprop_exact("graph t {\n  %x: f16[4] = input()\n  %c: f16[4] = full(value=60000)\n  %d: f16[4] = add(%c, %c)\n"
                        "  %e: f16[4] = sub(%d, %c)\n  %y: f16[4] = add(%x, %e)\n  %p: f16[4] = full(value=0.2)\n"
                        "  %q: f32[4] = cast(%p, dtype=f32)\n  %xf: f32[4] = cast(%x, dtype=f32)\n  %z: f32[4] = mul(%xf, %q)\n"
                        "  %s: f16[] = scalar(value=0.1)\n  %n: f16[] = neg(%s)\n  %m: f32[] = cast(%n, dtype=f32)\n"
                        "  %b: bf16[2] = full(value=3.3)\n  %r: bf16[2] = mul(%b, %b)\n  %rf: f32[2] = cast(%r, dtype=f32)\n"
                        "  %k: f32[3] = full(value=16777217)\n  %kk: f32[3] = sub(%k, %k)\n  output %y, %z, %m, %rf, %kk\n}\n");
}

/* ---- integers: exact within +-(2^53 - 1), i32 wraps as two's complement ------------------------------- */

/* Runs text's graph with input %a set to vals (n values); returns the status and leaves output 0's values in
 * out (n of them) when it ran. */
static evt_status run_int_graph(const char *text, const double *vals, int n, double *out, char *msg, size_t msglen) {
  evt_graph *g = evt_test_parse_ok(text);
  if (!g) return EVT_ERR_PARSE;
  evt_tensor *v = calloc((size_t)g->nnodes, sizeof *v);
  CHECK(evt_interp_init_inputs(g, v, 1) == EVT_OK);
  int a = evt_graph_find(g, "a");
  for (int i = 0; i < n && a >= 0 && i < v[a].numel; i++) v[a].data[i] = vals[i];
  evt_status st = evt_interp_run(g, v, 0, 0);
  snprintf(msg, msglen, "%s", evt_graph_error(g));
  const evt_tensor *o = &v[g->outputs[0]];
  for (int i = 0; st == EVT_OK && i < n && i < o->numel; i++) out[i] = o->data[i];
  free_values(g, v);
  evt_graph_free(g);
  return st;
}

static const char *kPlusOneMinus = "graph t {\n  %a: i64[2] = input()\n  %one: i64[] = scalar(value=1)\n"
                                   "  %b: i64[2] = add(%a, %one)\n  %c: i64[2] = sub(%b, %a)\n  output %c\n}\n";

/* torch: a = [2^53, 2^60] (i64): (a + 1) - a is [1, 1]. The interpreter holds integers in doubles, exact within
 * +-(2^53 - 1): beyond, an error naming the node, never a silent [0, 0]. */
TEST(hostile_i64_beyond_2p53_is_an_error) {
  char msg[512];
  double out[2] = {0, 0};
  const double big[2] = {9007199254740992.0, 1152921504606846976.0};
  evt_status st = run_int_graph(kPlusOneMinus, big, 2, out, msg, sizeof msg);
  CHECK_MSG(st == EVT_ERR_UNSUPPORTED && strstr(msg, "node %a (input)") && strstr(msg, "2^53"), "status %d: %s (out %g %g)",
            (int)st, msg, out[0], out[1]);
  const double edge[2] = {9007199254740991.0, 0};
  st = run_int_graph(kPlusOneMinus, edge, 2, out, msg, sizeof msg);
  CHECK_MSG(st == EVT_ERR_UNSUPPORTED && strstr(msg, "node %b (add)"), "status %d: %s", (int)st, msg);
  const double ok[2] = {9007199254740990.0, -9007199254740991.0};
  st = run_int_graph(kPlusOneMinus, ok, 2, out, msg, sizeof msg);
  CHECK_MSG(st == EVT_OK && out[0] == 1 && out[1] == 1, "status %d: %s, out %g %g", (int)st, msg, out[0], out[1]);
}

/* torch: sum([2^53 - 1, 2, -(2^53 - 1)]) is 2; a partial sum past 2^53 is an error, never a silent 1. */
TEST(hostile_i64_sum_past_2p53_is_an_error) {
  char msg[512];
  double out[1] = {0};
  const double v[3] = {9007199254740991.0, 2, -9007199254740991.0};
  evt_status st = run_int_graph("graph t {\n  %a: i64[3] = input()\n  %s: i64[] = sum(%a)\n  output %s\n}\n", v, 3, out, msg,
                                sizeof msg);
  CHECK_MSG(st == EVT_ERR_UNSUPPORTED && strstr(msg, "node %s (sum)"), "status %d: %s (out %.17g)", (int)st, msg, out[0]);
}

/* torch (int32): (2^31 - 1) + 1 = -2^31, (2^31 - 1)^2 = 1, -(-2^31) = -2^31, abs(-2^31) = -2^31; int64 2^40 + 3
 * cast to int32 is 3; sum([2^31 - 1, 1]) with dtype=int32 is -2^31. */
TEST(hostile_i32_wraps_as_twos_complement) {
  char msg[512];
  double out[2] = {0, 0};
  const double m[2] = {2147483647.0, -2147483648.0};
  struct { const char *body; double want0, want1; } cases[] = {
      {"  %one: i32[] = scalar(value=1)\n  %r: i32[2] = add(%a, %one)\n", -2147483648.0, -2147483647.0},
      {"  %r: i32[2] = mul(%a, %a)\n", 1, 0},
      {"  %r: i32[2] = neg(%a)\n", -2147483647.0, -2147483648.0},
      {"  %r: i32[2] = abs(%a)\n", 2147483647.0, -2147483648.0},
      {"  %one: i32[] = scalar(value=1)\n  %s: i32[2] = sub(%a, %one)\n  %r: i32[2] = sub(%s, %one)\n", 2147483645.0, 2147483646.0},
  };
  for (int c = 0; c < EVT_ARRAY_LEN(cases); c++) {
    char text[512];
    snprintf(text, sizeof text, "graph t {\n  %%a: i32[2] = input()\n%s  output %%r\n}\n", cases[c].body);
    evt_status st = run_int_graph(text, m, 2, out, msg, sizeof msg);
    CHECK_MSG(st == EVT_OK && out[0] == cases[c].want0 && out[1] == cases[c].want1, "case %d: status %d %s: %.17g %.17g", c,
              (int)st, msg, out[0], out[1]);
  }
  const double w[2] = {1099511627779.0, -1.0};
  evt_status st = run_int_graph("graph t {\n  %a: i64[2] = input()\n  %r: i32[2] = cast(%a, dtype=i32)\n  output %r\n}\n", w, 2,
                                out, msg, sizeof msg);
  CHECK_MSG(st == EVT_OK && out[0] == 3 && out[1] == -1, "cast: status %d %s: %.17g %.17g", (int)st, msg, out[0], out[1]);
  const double s[2] = {2147483647.0, 1};
  st = run_int_graph("graph t {\n  %a: i32[2] = input()\n  %r: i32[] = sum(%a)\n  output %r\n}\n", s, 2, out, msg, sizeof msg);
  CHECK_MSG(st == EVT_OK && out[0] == -2147483648.0, "sum: status %d %s: %.17g", (int)st, msg, out[0]);
}

/* A float cast to an integer dtype that cannot hold it (PyTorch leaves the result undefined), or a caller's
 * integer value that is not one: errors naming the node. */
TEST(hostile_int_values_out_of_range_are_errors) {
  char msg[512];
  double out[2];
  const double f[2] = {3e9, 1};
  evt_status st = run_int_graph("graph t {\n  %a: f32[2] = input()\n  %r: i32[2] = cast(%a, dtype=i32)\n  output %r\n}\n", f, 2,
                                out, msg, sizeof msg);
  CHECK_MSG(st == EVT_ERR_UNSUPPORTED && strstr(msg, "node %r (cast)"), "status %d: %s", (int)st, msg);
  const double frac[2] = {0.5, 1};
  st = run_int_graph("graph t {\n  %a: i64[2] = input()\n  %r: i64[2] = neg(%a)\n  output %r\n}\n", frac, 2, out, msg, sizeof msg);
  CHECK_MSG(st == EVT_ERR_INVALID && strstr(msg, "node %a (input)"), "status %d: %s", (int)st, msg);
}

/* Folding integer constants: i32 wraps as the interpreter does; i64 beyond 2^53 is left to the run. */
TEST(hostile_constprop_integer_folds) {
  check_constprop_exact("graph t {\n  %c: i32[2] = full(value=2147483647)\n  %one: i32[] = scalar(value=1)\n"
                        "  %d: i32[2] = add(%c, %one)\n  %e: i32[2] = mul(%c, %c)\n  output %d, %e\n}\n");
}
