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
