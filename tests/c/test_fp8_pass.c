/* The fp8 pass (src/passes/fp8.c): which mm it rewrites (formats per operand, the loss layer and small GEMMs
 * left alone, graphs without an eligible mm unchanged) and the interpreter's result of a rewritten mm against
 * the recipe computed here by hand. */
#include "test.h"

#include "codegen/lower.h"
#include "partition/partition.h"
#include "passes/passes.h"

#include <stdlib.h>
#include <string.h>

static evt_graph *joint_canonical(const char *path) {
  char *err = NULL;
  evt_graph *g = evt_parse_file(path, &err);
  CHECK_MSG(g != NULL, "%s", err ? err : "parse failed");
  free(err);
  if (!g) return NULL;
  evt_pass_stats st = {0};
  CHECK(evt_graph_build_joint(g, 0) == EVT_OK && evt_pass_canonicalize(g, &st) == EVT_OK);
  return g;
}

static int count_casts_to(const evt_graph *g, evt_dtype dt) {
  int c = 0;
  for (int i = 0; i < g->nnodes; i++) c += g->nodes[i].op == EVT_OP_CAST && g->nodes[i].type.dtype == dt;
  return c;
}

static bool fp8_operands(const evt_graph *g, int id) {
  const evt_node *n = &g->nodes[id];
  return evt_dtype_is_fp8(g->nodes[n->inputs[0]].type.dtype) && evt_dtype_is_fp8(g->nodes[n->inputs[1]].type.dtype);
}

/* Two hidden layers of 256 and a 256-class head: the hidden layers' 2 forward and 3 backward GEMMs go to fp8
 * (the backward ones with the gradient in e5m2), the head's forward and two backward GEMMs stay f32. */
TEST(fp8_pass_rewrites_exactly_the_eligible_mm) {
  evt_graph *g = joint_canonical("tests/graphs/fp8_mlp.evt");
  if (!g) return;
  CHECK(evt_test_count_op(g, EVT_OP_MM) == 8);
  evt_pass_stats st = {.flags = EVT_PASS_FP8};
  CHECK_MSG(evt_pass_fp8(g, &st) == EVT_OK && evt_graph_verify(g) == EVT_OK, "%s", evt_graph_error(g));
  CHECK(st.rewrites == 5 && evt_test_count_op(g, EVT_OP_MM) == 8);
  CHECK(count_casts_to(g, EVT_F8E4M3) == 7 && count_casts_to(g, EVT_F8E5M2) == 3);
  CHECK(evt_test_count_op(g, EVT_OP_AMAX) == 10);
  int fp8_mm = 0;
  for (int i = 0; i < g->nnodes; i++) fp8_mm += g->nodes[i].op == EVT_OP_MM && fp8_operands(g, i);
  CHECK(fp8_mm == 5);
  int head = evt_graph_find(g, "logits"), dhead = evt_graph_find(g, "grad.head.w");
  CHECK(head >= 0 && g->nodes[head].op == EVT_OP_MM && !fp8_operands(g, head));
  CHECK(dhead >= 0 && g->nodes[dhead].op == EVT_OP_MM && !fp8_operands(g, dhead));
  /* the rewritten forward GEMM keeps its name on the rescaled f32 result */
  int h1 = evt_graph_find(g, "h1.mm");
  CHECK(h1 >= 0 && g->nodes[h1].op == EVT_OP_MUL && g->nodes[h1].type.dtype == EVT_F32);
  /* the whole pipeline with the flag keeps the five fp8 GEMMs; CSE shares the e5m2 copy of the second layer's
   * gradient between its two backward GEMMs */
  evt_graph_free(g);
  g = joint_canonical("tests/graphs/fp8_mlp.evt");
  CHECK(g && evt_passes_run_all(g, EVT_PASS_FP8, 1) == EVT_OK && count_casts_to(g, EVT_F8E5M2) == 2);
  fp8_mm = 0;
  for (int i = 0; g && i < g->nnodes; i++) fp8_mm += g->nodes[i].op == EVT_OP_MM && fp8_operands(g, i);
  CHECK(fp8_mm == 5);
  evt_graph_free(g);
}

/* After the whole pipeline every fp8 GEMM of the training step reads its operands K-major: partitioned with the
 * default rules, each lowers to a generated GEMM+EVT kernel of layout NT (the next layer's amax in its epilogue,
 * the shared rank-0 scales in kernels of their own), and every quantizing cast to a row kernel. */
TEST(fp8_pass_gemms_lower_k_major) {
  evt_graph *g = joint_canonical("tests/graphs/fp8_mlp.evt");
  if (!g || evt_passes_run_all(g, EVT_PASS_FP8, 1) != EVT_OK) {
    CHECK(!"pipeline");
    evt_graph_free(g);
    return;
  }
  evt_part_options o = evt_part_options_default();
  o.use_cache = 0;
  evt_part_plan part = {0};
  evt_lower_result low = {0};
  CHECK(evt_part_plan_build(g, &o, EVT_PART_LAMBDA_DEFAULT, &part) == EVT_OK);
  CHECK(evt_lower_plan(g, &part, &low) == EVT_OK);
  int nt = 0, casts = 0;
  for (int i = 0; i < g->nnodes; i++) {
    const evt_lowered *L = &low.k[part.group[i]];
    if (g->nodes[i].op == EVT_OP_CAST && evt_dtype_is_fp8(g->nodes[i].type.dtype)) {
      bool row = L->kind == EVT_LK_ROW || L->kind == EVT_LK_POINTWISE; /* a row-kernel spec, with or without nucleus */
      CHECK_MSG(L->ok && row, "%%%s: %s", g->nodes[i].name, L->reason);
      casts += L->ok && row;
    }
    if (g->nodes[i].op != EVT_OP_MM || !fp8_operands(g, i)) continue;
    CHECK_MSG(L->ok && L->kind == EVT_LK_GEMM_EVT && L->spec.layout == EVT_LAYOUT_NT, "%%%s: %s", g->nodes[i].name,
              L->reason);
    nt += L->ok && L->spec.layout == EVT_LAYOUT_NT;
  }
  CHECK(nt == 5 && casts >= 5);
  evt_lower_free(&low);
  evt_part_plan_free(&part);
  evt_graph_free(g);
}

/* The fused plan a program runs binds every fp8 GEMM group (B's own format, the rescale's scalar as one value):
 * each is a generated kernel in evt_plan_report, none node by node. */
TEST(fp8_pass_gemms_bind_in_the_program_plan) {
  evt_graph *g = joint_canonical("tests/graphs/fp8_mlp.evt");
  if (!g) return;
  evt_options o;
  evt_options_init(&o);
  o.fp8 = EVT_FP8_TENSORWISE;
  char *rep = evt_plan_report(g, &o);
  CHECK_MSG(rep != NULL, "%s", evt_graph_error(g));
  int generated = 0;
  for (const char *p = rep; p && (p = strstr(p, "\"kind\": \"gemm+evt\", \"path\": \"generated\"")); p++) generated++;
  CHECK_MSG(generated == 5, "%d generated GEMM groups:\n%s", generated, rep ? rep : "");
  free(rep);
  evt_graph_free(g);
}

/* Small GEMMs (examples/mlp.evt: 16 rows), a K that is no multiple of 16: the graph is left as it was. */
TEST(fp8_pass_leaves_graphs_without_eligible_mm) {
  evt_graph *g = joint_canonical("examples/mlp.evt");
  if (!g) return;
  char *before = evt_graph_to_string(g);
  evt_pass_stats st = {.flags = EVT_PASS_FP8};
  CHECK(evt_pass_fp8(g, &st) == EVT_OK && st.rewrites == 0);
  char *after = evt_graph_to_string(g);
  CHECK(before && after && !strcmp(before, after));
  free(before), free(after);
  evt_graph_free(g);
  g = evt_test_parse_ok("graph k {\n  %a: f32[256,264] = input()\n  %b: f32[264,256] = input()\n"
                        "  %y = mm(%a, %b)\n  output %y\n}\n");
  st = (evt_pass_stats){.flags = EVT_PASS_FP8};
  CHECK(g && evt_pass_fp8(g, &st) == EVT_OK && st.rewrites == 0 && g->nnodes == 3);
  evt_graph_free(g);
}

/* ---- the recipe by hand ------------------------------------------------------------------------------ */

enum { D = 256 };

/* Deterministic values of a few binades (an LCG), zero when `zero`. */
static void fill(double *v, int n, uint32_t seed, bool zero) {
  for (int i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    v[i] = zero ? 0.0 : ((double)(seed >> 8) / 16777216.0 - 0.5) * ((i % 7) + 1) * 0.01;
  }
}

/* The f32 scale max / amax(|x|) (1 when amax is 0) and x * scale rounded to fmt, as the rewritten graph does. */
static float quantize_by_hand(const double *x, int n, evt_dtype fmt, double *q) {
  double amax = 0;
  for (int i = 0; i < n; i++) amax = fmax(amax, fabs(x[i]));
  float fmax_ = fmt == EVT_F8E5M2 ? 57344.0f : 448.0f;
  float scale = amax == 0 ? 1.0f : fmax_ / (float)amax;
  for (int i = 0; i < n; i++) q[i] = evt_round_fp8((float)(x[i] * scale), fmt);
  return scale;
}

/* y = a @ b by the recipe: fp8 products are exact and their sums too (44 bits at most), so the order does not
 * matter; the accumulator is rounded to f32, then times the f32 1 / (sa * sb). */
static void mm_by_hand(const double *a, const double *b, evt_dtype fa, evt_dtype fb, double *y) {
  double *qa = malloc(sizeof(double) * D * D), *qb = malloc(sizeof(double) * D * D);
  float sa = quantize_by_hand(a, D * D, fa, qa), sb = quantize_by_hand(b, D * D, fb, qb);
  float inv = 1.0f / (sa * sb);
  for (int i = 0; i < D; i++)
    for (int j = 0; j < D; j++) {
      double acc = 0;
      for (int k = 0; k < D; k++) acc += qa[i * D + k] * qb[k * D + j];
      y[i * D + j] = (float)((float)acc * inv);
    }
  free(qa), free(qb);
}

static void transpose(double *v) {
  for (int i = 0; i < D; i++)
    for (int j = i + 1; j < D; j++) {
      double t = v[i * D + j];
      v[i * D + j] = v[j * D + i], v[j * D + i] = t;
    }
}

/* Runs text's graph (inputs %a and b_name of [D,D]) after the fp8 and layout passes (the quantized operands read
 * K-major) on the given values; compares output 0 with the hand computation bit for bit. trans: bit 0, %a holds
 * the mm's A transposed; bit 1, b_name holds B transposed. */
static void check_against_hand(const char *text, const char *b_name, evt_dtype fa, evt_dtype fb, bool zero_a,
                               int trans) {
  evt_graph *g = evt_test_parse_ok(text);
  if (!g) return;
  evt_pass_stats st = {.flags = EVT_PASS_FP8}, lst = {0};
  CHECK(evt_pass_fp8(g, &st) == EVT_OK && st.rewrites == 1);
  CHECK(evt_pass_layout(g, &lst) == EVT_OK && evt_graph_verify(g) == EVT_OK);
  CHECK(fa == fb ? count_casts_to(g, fa) == 2 : count_casts_to(g, fa) == 1 && count_casts_to(g, fb) == 1);
  evt_tensor *v = calloc((size_t)g->nnodes, sizeof *v);
  double *want = malloc(sizeof(double) * D * D);
  CHECK(evt_interp_init_inputs(g, v, 0) == EVT_OK);
  int ia = evt_graph_find(g, "a"), ib = evt_graph_find(g, b_name);
  fill(v[ia].data, D * D, 1, zero_a);
  fill(v[ib].data, D * D, 2, false);
  double *a = malloc(sizeof(double) * D * D), *b = malloc(sizeof(double) * D * D);
  memcpy(a, v[ia].data, sizeof(double) * D * D), memcpy(b, v[ib].data, sizeof(double) * D * D);
  if (trans & 1) transpose(a);
  if (trans & 2) transpose(b);
  mm_by_hand(a, b, fa, fb, want);
  free(a), free(b);
  CHECK_MSG(evt_interp_run(g, v, 0, 0) == EVT_OK, "%s", evt_graph_error(g));
  const evt_tensor *y = &v[evt_graph_output(g, 0)];
  int bad = 0;
  for (int i = 0; i < D * D && y->data; i++) bad += y->data[i] != want[i];
  CHECK_MSG(bad == 0, "%d of %d elements differ from the hand computation", bad, D * D);
  for (int i = 0; i < g->nnodes; i++) evt_tensor_free(&v[i]);
  free(v), free(want);
  evt_graph_free(g);
}

TEST(fp8_pass_result_matches_hand_computation) {
  /* no loss, no gradient: both operands e4m3 */
  check_against_hand("graph f {\n  %a: f32[256,256] = input()\n  %b: f32[256,256] = input()\n"
                     "  %y = mm(%a, %b)\n  output %y\n}\n", "b", EVT_F8E4M3, EVT_F8E4M3, false, 0);
  /* b depends on PyTorch's incoming gradient: e5m2 */
  check_against_hand("graph f {\n  %a: f32[256,256] = input()\n  %in.tangents_1: f32[256,256] = input()\n"
                     "  %y = mm(%a, %in.tangents_1)\n  output %y\n}\n", "in.tangents_1", EVT_F8E4M3, EVT_F8E5M2, false, 0);
  /* an all-zero operand: scale 1, a zero product, no NaN */
  check_against_hand("graph f {\n  %a: f32[256,256] = input()\n  %b: f32[256,256] = input()\n"
                     "  %y = mm(%a, %b)\n  output %y\n}\n", "b", EVT_F8E4M3, EVT_F8E4M3, true, 0);
  /* operands given transposed (a weight stored N x K, an activation read as x^T): the tensor under the permute
   * is quantized, the fp8 result permuted; the same values */
  check_against_hand("graph f {\n  %a: f32[256,256] = input()\n  %bt: f32[256,256] = input()\n"
                     "  %b = permute(%bt, dims=[1,0])\n  %y = mm(%a, %b)\n  output %y\n}\n", "bt", EVT_F8E4M3,
                     EVT_F8E4M3, false, 2);
  check_against_hand("graph f {\n  %a: f32[256,256] = input()\n  %in.tangents_1: f32[256,256] = input()\n"
                     "  %at = permute(%a, dims=[1,0])\n  %y = mm(%at, %in.tangents_1)\n  output %y\n}\n",
                     "in.tangents_1", EVT_F8E4M3, EVT_F8E5M2, false, 1);
}
