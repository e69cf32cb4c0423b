/* A bf16/f16 addmm rounds once: canonicalize writes it as cast(add(mm(a, b, out_dtype=f32), cast(c, f32)), dt)
 * (src/passes/canonicalize.c), the semantics of PyTorch's addmm (f32 accumulator + bias, one rounding), not a
 * 16-bit mm followed by a 16-bit add. Also mm's out_dtype attribute (infer, print/parse, gradient) and the
 * lowering of the canonical form to one GEMM epilogue (accumulator, row-broadcast bias, 16-bit store). */
#include "test.h"

#include "codegen/lower.h"
#include "partition/partition.h"
#include "passes/passes.h"
#include "compile/compile.h"
#include "runtime/gpu/exec_plan.h"
#include "compile/train.h"

#include <stdlib.h>
#include <string.h>


/* y = addmm(b, x, w) over [2,2] x [2,2] in dtype dt with e = 2^-p (one ulp at 1; p = 7 bf16, 10 f16):
 * y[0][0] = (1+e)^2 + e/2 = 1 + 2e + e^2 + e/2. Rounded once that is 1 + 3e; rounding the product first
 * (1 + 2e, the e^2 dropped) leaves 1 + 2e + e/2, a tie that goes to the even 1 + 2e. */
static void addmm_case(evt_dtype dt, int p) {
  const char *dn = evt_dtype_name(dt);
  char text[512];
  snprintf(text, sizeof text,
           "graph t {\n  %%x: %s[2,2] = input()\n  %%w: %s[2,2] = param()\n  %%b: %s[2] = param()\n"
           "  %%y: %s[2,2] = addmm(%%b, %%x, %%w)\n  output %%y\n}\n",
           dn, dn, dn, dn);
  double e = ldexp(1.0, -p);
  const double x[4] = {1 + e, 0, 1, 1}, w[4] = {1 + e, 1, 0, 0.5}, b[2] = {e / 2, 3};
  double ref[4], twice[4];
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 2; j++) {
      double prod = x[i * 2] * w[j] + x[i * 2 + 1] * w[2 + j]; /* exact in double for these values */
      ref[i * 2 + j] = evt_round_to_dtype(prod + b[j], dt);
      twice[i * 2 + j] = evt_round_to_dtype(evt_round_to_dtype(prod, dt) + b[j], dt);
    }
  CHECK_MSG(ref[0] == 1 + 3 * e && twice[0] == 1 + 2 * e, "%s: the case does not separate one rounding from two", dn);
  for (int opt = 0; opt < 2; opt++) {
    evt_graph *g = evt_test_parse_ok(text);
    if (!g) return;
    if (opt) {
      CHECK_MSG(evt_passes_run_all(g, 0, 1) == EVT_OK, "passes: %s", evt_graph_error(g));
      /* the canonical form: mm to f32, the bias widened, one cast back */
      CHECK(evt_test_count_op(g, EVT_OP_ADDMM) == 0 && evt_test_count_op(g, EVT_OP_MM) == 1);
      for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i].op == EVT_OP_MM)
          CHECK(g->nodes[i].type.dtype == EVT_F32 && g->nodes[i].attr.out_dtype == EVT_F32 &&
                g->nodes[g->nodes[i].inputs[0]].type.dtype == dt);
      const evt_node *y = &g->nodes[g->outputs[0]];
      CHECK(y->op == EVT_OP_CAST && y->type.dtype == dt && !strcmp(y->name, "y"));
      CHECK(g->nodes[y->inputs[0]].op == EVT_OP_ADD && g->nodes[y->inputs[0]].type.dtype == EVT_F32);
    }
    evt_tensor *v = calloc((size_t)g->nnodes, sizeof *v);
    CHECK(evt_interp_init_inputs(g, v, 1) == EVT_OK);
    memcpy(v[evt_graph_find(g, "x")].data, x, sizeof x);
    memcpy(v[evt_graph_find(g, "w")].data, w, sizeof w);
    memcpy(v[evt_graph_find(g, "b")].data, b, sizeof b);
    CHECK_MSG(evt_interp_run(g, v, 0, 0) == EVT_OK, "run: %s", evt_graph_error(g));
    const evt_tensor *out = &v[g->outputs[0]];
    for (int i = 0; i < 4 && out->numel == 4; i++)
      CHECK_MSG(out->data[i] == ref[i], "%s %s y[%d] = %.10g, one rounding gives %.10g (two: %.10g)", dn,
                opt ? "optimized" : "as written", i, out->data[i], ref[i], twice[i]);
    for (int i = 0; i < g->nnodes; i++) evt_tensor_free(&v[i]);
    free(v);
    evt_graph_free(g);
  }
}

TEST(canonicalize_16bit_addmm_rounds_once) {
  addmm_case(EVT_BF16, 7);
  addmm_case(EVT_F16, 10);
}

TEST(canonicalize_f32_addmm_stays_mm_add) {
  evt_graph *g = evt_test_parse_ok("graph t {\n  %x: f32[4,8] = input()\n  %w: f32[8,6] = param()\n  %b: f32[6] = param()\n"
                          "  %y: f32[4,6] = addmm(%b, %x, %w)\n  output %y\n}\n");
  if (!g) return;
  evt_pass_stats st = {0};
  CHECK(evt_pass_canonicalize(g, &st) == EVT_OK);
  CHECK(evt_test_count_op(g, EVT_OP_MM) == 1 && evt_test_count_op(g, EVT_OP_ADD) == 1 && evt_test_count_op(g, EVT_OP_CAST) == 0);
  for (int i = 0; i < g->nnodes; i++)
    if (g->nodes[i].op == EVT_OP_MM) CHECK(g->nodes[i].attr.out_dtype == -1);
  evt_graph_free(g);
}

TEST(mm_out_dtype_infer_print_parse) {
  evt_graph *g = evt_test_parse_ok("graph t {\n  %a: bf16[4,8] = input()\n  %b: bf16[8,6] = input()\n"
                          "  %m: f32[4,6] = mm(%a, %b, out_dtype=f32)\n  %n: bf16[4,6] = mm(%a, %b, out_dtype=bf16)\n"
                          "  output %m, %n\n}\n");
  if (!g) return;
  int m = evt_graph_find(g, "m"), n = evt_graph_find(g, "n");
  CHECK(g->nodes[m].type.dtype == EVT_F32 && g->nodes[n].type.dtype == EVT_BF16);
  CHECK(g->nodes[n].attr.out_dtype == -1); /* the operands' dtype is the canonical default */
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  CHECK(evt_graph_print(g, f) == EVT_OK);
  fclose(f);
  CHECK(strstr(text, "%m: f32[4,6] = mm(%a, %b, out_dtype=f32)") != NULL);
  CHECK(strstr(text, "%n: bf16[4,6] = mm(%a, %b)") != NULL);
  evt_graph *g2 = evt_test_parse_ok(text);
  if (g2) CHECK(g2->nodes[evt_graph_find(g2, "m")].type.dtype == EVT_F32);
  evt_graph_free(g2);
  free(text);
  evt_graph_free(g);
  char *err = NULL;
  evt_graph *bad = evt_parse("graph t {\n  %a: bf16[4,8] = input()\n  %b: bf16[8,6] = input()\n"
                             "  %m: f16[4,6] = mm(%a, %b, out_dtype=f16)\n  output %m\n}\n",
                             "t.evt", &err);
  CHECK(bad == NULL && err && strstr(err, "out_dtype=f16") && strstr(err, "node %m"));
  free(err);
  evt_graph_free(bad);
}

/* The gradient of mm(out_dtype=f32) runs on the operands' dtype: dy cast to bf16, then the usual GEMMs. */
TEST(mm_out_dtype_gradient) {
  evt_graph *g = evt_test_parse_ok("graph t {\n  %x: bf16[4,8] = input()\n  %w: bf16[8,6] = param()\n"
                          "  %m: f32[4,6] = mm(%x, %w, out_dtype=f32)\n  %l: f32[] = sum(%m)\n  loss %l\n}\n");
  if (!g) return;
  CHECK_MSG(evt_graph_build_joint(g, 0) == EVT_OK, "joint: %s", evt_graph_error(g));
  CHECK(evt_graph_verify(g) == EVT_OK);
  int gw = evt_graph_find(g, "grad.w");
  CHECK(gw >= 0 && g->nodes[gw].type.dtype == EVT_BF16);
  evt_tensor *v = calloc((size_t)g->nnodes, sizeof *v);
  CHECK(evt_interp_init_inputs(g, v, 3) == EVT_OK);
  CHECK(evt_interp_run(g, v, 0, 1) == EVT_OK);
  const evt_tensor *x = &v[evt_graph_find(g, "x")];
  for (int k = 0; k < 8 && gw >= 0; k++) { /* d sum(x w) / d w[k][j] = sum_i x[i][k], rounded to bf16 */
    double s = 0;
    for (int i = 0; i < 4; i++) s += x->data[i * 8 + k];
    for (int j = 0; j < 6; j++) CHECK_NEAR(v[gw].data[k * 6 + j], evt_round_to_dtype(s, EVT_BF16), 1e-12);
  }
  for (int i = 0; i < g->nnodes; i++) evt_tensor_free(&v[i]);
  free(v);
  evt_graph_free(g);
}

/* Linear + gelu as PyTorch traces it in bf16 (addmm): after the passes one GEMM+EVT kernel (acc, row-broadcast
 * bias, add, the addmm's rounding, gelu, bf16 D); the widened bias is no kernel of its own. */
TEST(lower_bf16_addmm_is_one_gemm_epilogue) {
  evt_graph *g = evt_test_parse_ok("graph t {\n  %x: bf16[32,64] = input()\n  %w: bf16[64,128] = param()\n"
                          "  %b: bf16[128] = param()\n  %h: bf16[32,128] = addmm(%b, %x, %w)\n"
                          "  %y: bf16[32,128] = gelu(%h)\n  output %y\n}\n");
  if (!g) return;
  CHECK(evt_passes_run_all(g, 0, 1) == EVT_OK);
  for (int rules = 0; rules < 2; rules++) {
    evt_part_options o = evt_part_options_default();
    o.use_cache = 0;
    evt_part_plan part;
    evt_lower_result low;
    if (rules) CHECK(evt_lower_partition(g, &o, EVT_PART_LAMBDA_DEFAULT, &part) == EVT_OK);
    else CHECK(evt_part_plan_build(g, &o, EVT_PART_LAMBDA_DEFAULT, &part) == EVT_OK);
    CHECK(evt_lower_plan(g, &part, &low) == EVT_OK);
    CHECK_MSG(low.n == 1, "%d groups", low.n);
    const evt_lowered *L = &low.k[0];
    CHECK_MSG(L->ok && L->kind == EVT_LK_GEMM_EVT, "%s", L->reason);
    const evt_kspec *s = &L->spec;
    CHECK(s->ab_dtype == EVT_BF16 && s->d_dtype == EVT_BF16 && s->nnodes == 5);
    CHECK(s->nodes[0].op == EVT_V_ACC);
    CHECK(s->nodes[1].op == EVT_V_ROW_BCAST && s->nodes[1].dtype == EVT_BF16 && L->vtensor[1] == evt_graph_find(g, "b"));
    CHECK(s->nodes[2].op == EVT_V_ADD && s->nodes[2].in[0] == 0 && s->nodes[2].in[1] == 1);
    /* the addmm's one rounding happens before gelu, as in eager (PyTorch's addmm output is bf16) */
    CHECK(s->nodes[3].op == EVT_V_ROUND_BF16 && s->nodes[3].in[0] == 2);
    CHECK(s->nodes[4].op == EVT_V_GELU_ERF && s->nodes[4].in[0] == 3 && s->d_node == 4);
    CHECK(L->d_tensor == evt_graph_find(g, "y"));
    evt_lower_free(&low);
    evt_part_plan_free(&part);
  }
  evt_graph_free(g);
}

/* Every add(mm(a, b), c) whose mm has no other use becomes addmm(c, a, b): the graph PyTorch traces for a
 * Linear layer. Returns the number rewritten. */
static int to_addmm(evt_graph *g) {
  int n0 = g->nnodes, made = 0;
  int *uses = calloc((size_t)n0 + 1, sizeof *uses);
  evt_graph_count_uses(g, uses);
  for (int v = 0; v < n0; v++) {
    const evt_node *add = &g->nodes[v];
    if (add->op != EVT_OP_ADD) continue;
    int m = add->inputs[0], c = add->inputs[1];
    const evt_node *mm = &g->nodes[m];
    if (mm->op != EVT_OP_MM || uses[m] != 1 || !evt_type_equal(&mm->type, &add->type) || g->nodes[c].type.rank > 2) continue;
    int in[3] = {c, mm->inputs[0], mm->inputs[1]};
    int r = evt_rw_op(g, v, EVT_OP_ADDMM, in, 3, NULL, 0);
    CHECK_MSG(r >= 0, "addmm: %s", evt_graph_error(g));
    if (r < 0) break;
    evt_graph_replace_uses(g, v, r);
    made++;
  }
  free(uses);
  int removed = 0;
  CHECK(evt_graph_compact(g, &removed) == EVT_OK);
  return made;
}

static evt_graph *load_bf16(const char *path, bool addmm, int *made) {
  char *err = NULL;
  evt_graph *g = evt_parse_file(path, &err);
  CHECK_MSG(g, "%s: %s", path, err ? err : "");
  free(err);
  if (!g) return NULL;
  CHECK(evt_lower_retype(g, EVT_BF16) == EVT_OK);
  if (addmm) *made = to_addmm(g);
  CHECK(evt_train_ensure_joint(g, NULL) == EVT_OK);
  CHECK_MSG(evt_passes_run_all(g, 0, 1) == EVT_OK, "%s", evt_graph_error(g));
  return g;
}

static int lowered_gemms(evt_graph *g) {
  evt_part_options o = evt_part_options_default();
  o.use_ilp = 0;
  o.use_cache = 0;
  evt_part_plan part;
  evt_lower_result low;
  int n = 0;
  CHECK(evt_lower_partition(g, &o, EVT_PART_LAMBDA_DEFAULT, &part) == EVT_OK);
  CHECK(evt_lower_plan(g, &part, &low) == EVT_OK);
  for (int i = 0; i < low.n; i++) n += low.k[i].ok && low.k[i].kind == EVT_LK_GEMM_EVT;
  evt_lower_free(&low);
  evt_part_plan_free(&part);
  return n;
}

/* The examples with their Linear layers written as addmm (as PyTorch traces them), in bf16: as many GEMM+EVT
 * kernels lower as from mm + add, and the CPU model of the fused step (every binding, the widened bias read
 * as a bf16 row broadcast) reproduces the interpreter as closely as for the mm + add graphs. */
TEST(addmm_examples_lower_and_run_like_mm_add) {
  const char *files[] = {"examples/mlp.evt", "examples/bert_layer.evt", "examples/vit.evt", "examples/gcn.evt"};
  for (int f = 0; f < EVT_ARRAY_LEN(files); f++) {
    int made = 0;
    evt_graph *ref = load_bf16(files[f], false, NULL), *g = load_bf16(files[f], true, &made);
    if (!ref || !g) {
      evt_graph_free(ref), evt_graph_free(g);
      continue;
    }
    CHECK_MSG(made > 0 || strstr(files[f], "gcn"), "%s: no mm + add to rewrite", files[f]);
    printf("  %s: %d addmm, %d GEMM+EVT kernels\n", files[f], made, lowered_gemms(g));
    CHECK_MSG(lowered_gemms(g) == lowered_gemms(ref), "%s: %d GEMM+EVT kernels with addmm, %d with mm + add", files[f],
              lowered_gemms(g), lowered_gemms(ref));
    evt_tensor *v = calloc((size_t)g->nnodes, sizeof *v), *w = calloc((size_t)g->nnodes, sizeof *w);
    CHECK(evt_interp_init_inputs(g, v, 0) == EVT_OK);
    evt_exec_plan p;
    CHECK(evt_exec_plan_build(g, NULL, &p) == EVT_OK);
    for (int i = 0; i < g->nnodes; i++)
      if (g->nodes[i].op == EVT_OP_INPUT || g->nodes[i].op == EVT_OP_PARAM) {
        CHECK(evt_tensor_alloc(&w[i], v[i].dtype, v[i].rank, v[i].shape) == EVT_OK);
        memcpy(w[i].data, v[i].data, sizeof(double) * (size_t)v[i].numel);
      }
    CHECK_MSG(evt_exec_plan_run_cpu(g, &p, w) == EVT_OK, "%s", evt_graph_error(g));
    CHECK(evt_interp_run(g, v, 0, 0) == EVT_OK);
    double scale = evt_test_output_scale(g, v);
    /* test_exec_plan's bf16 rule: within 1.5e-2 of the interpreter, or no further from the exact (fp64) answer
     * than max(the interpreter's distance, 1e-2) + 1e-2 */
    evt_tensor *x = calloc((size_t)g->nnodes, sizeof *x);
    bool exact = false;
    for (int k = 0; k < g->noutputs; k++) {
      int id = g->outputs[k];
      double e = evt_cuda_rel_error(&w[id], &v[id], 0.1 * scale), ef = 0, ei = 0;
      if (e > 1.5e-2 && !exact) {
        CHECK(evt_interp_init_inputs(g, x, 0) == EVT_OK);
        exact = evt_interp_run(g, x, EVT_RUN_FP64, 0) == EVT_OK;
      }
      if (e > 1.5e-2 && exact) {
        double sc = evt_test_output_scale(g, x);
        ef = evt_cuda_rel_error(&w[id], &x[id], 0.1 * sc), ei = evt_cuda_rel_error(&v[id], &x[id], 0.1 * sc);
      }
      CHECK_MSG(e <= 1.5e-2 || (exact && evt_test_near_exact(ef, ei)), "%s: %%%s rel error %g (from fp64 %g, the "
                "interpreter %g)", files[f], g->nodes[id].name, e, ef, ei);
    }
    for (int i = 0; i < g->nnodes; i++) evt_tensor_free(&v[i]), evt_tensor_free(&w[i]), evt_tensor_free(&x[i]);
    free(v), free(w), free(x);
    evt_exec_plan_free(&p);
    evt_graph_free(g);
    evt_graph_free(ref);
  }
}
