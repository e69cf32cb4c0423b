/* Lowering of partition groups to kernel specs (src/codegen/lower*.c) and the runtime plan (src/compile/launch_plan.c). */
#include <glob.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/lower.h"
#include "codegen/rspec.h"
#include "partition/partition.h"
#include "passes/passes.h"
#include "compile/launch_plan.h"
#include "test.h"
#include "compile/train.h"

typedef struct lowered_graph {
  evt_graph *g;
  evt_part_plan part;
  evt_lower_result low;
} lowered_graph;

/* text's graph partitioned (rules: with the lowering's rules, evt_lower_partition: a group takes only what its kernel
 * holds) and lowered; false (a failed check) if it does not parse or partition */
static bool lower_text_flags(const char *text, lowered_graph *lg, bool rules, unsigned flags) {
  char *err = NULL;
  memset(lg, 0, sizeof *lg);
  lg->g = evt_parse(text, "lower", &err);
  CHECK_MSG(lg->g, "parse: %s", err ? err : "?");
  free(err);
  if (!lg->g) return false;
  evt_part_options o = evt_part_options_default();
  o.use_cache = 0;
  evt_status st = rules ? evt_lower_partition_flags(lg->g, &o, EVT_PART_LAMBDA_DEFAULT, flags, &lg->part)
                        : evt_part_plan_build(lg->g, &o, EVT_PART_LAMBDA_DEFAULT, &lg->part);
  CHECK(st == EVT_OK);
  if (st != EVT_OK) return false;
  CHECK(evt_lower_plan_flags(lg->g, &lg->part, flags, &lg->low) == EVT_OK);
  return true;
}

static bool lower_text_with(const char *text, lowered_graph *lg, bool rules) { return lower_text_flags(text, lg, rules, 0); }

static bool lower_text(const char *text, lowered_graph *lg) { return lower_text_with(text, lg, false); }
static bool lower_text_rules(const char *text, lowered_graph *lg) { return lower_text_with(text, lg, true); }

static void lowered_free(lowered_graph *lg) {
  evt_lower_free(&lg->low);
  evt_part_plan_free(&lg->part);
  evt_graph_free(lg->g);
}

static const evt_lowered *group_of(const lowered_graph *lg, const char *node) {
  int id = evt_graph_find(lg->g, node);
  CHECK_MSG(id >= 0 && lg->part.group[id] >= 0, "node %s has no group", node);
  return id >= 0 && lg->part.group[id] >= 0 ? &lg->low.k[lg->part.group[id]] : NULL;
}

TEST(lower_bias_gelu_gemm) {
  lowered_graph lg;
  if (!lower_text("graph t {\n"
                  "  %x: bf16[32,64] = input()\n  %w: bf16[64,128] = param()\n  %b: bf16[128] = param()\n"
                  "  %m = mm(%x, %w)\n  %h = add(%m, %b)\n  %y = gelu(%h)\n  output %y\n}\n",
                  &lg))
    return;
  CHECK(lg.low.n == 1);
  const evt_lowered *L = &lg.low.k[0];
  CHECK_MSG(L->ok && L->kind == EVT_LK_GEMM_EVT, "%s", L->reason);
  const evt_kspec *s = &L->spec;
  CHECK(s->layout == EVT_LAYOUT_NN && s->ab_dtype == EVT_BF16 && s->d_dtype == EVT_BF16);
  CHECK(s->nnodes == 4);
  CHECK(s->nodes[0].op == EVT_V_ACC);
  CHECK(s->nodes[1].op == EVT_V_ROW_BCAST && L->vtensor[1] == evt_graph_find(lg.g, "b"));
  CHECK(s->nodes[2].op == EVT_V_ADD && s->nodes[2].in[0] == 0 && s->nodes[2].in[1] == 1);
  CHECK(s->nodes[3].op == EVT_V_GELU_ERF && s->nodes[3].in[0] == 2);
  CHECK(s->d_node == 3 && L->d_tensor == evt_graph_find(lg.g, "y"));
  CHECK(L->m == 32 && L->n == 128 && L->k == 64);
  CHECK(s->cfg.tile_m == 128 && s->cfg.tile_n == 128 && s->cfg.schedule == EVT_SCHED_COOPERATIVE);
  CHECK(!strncmp(L->kernel, "evt_kernel_", 11));
  lowered_free(&lg);
}

TEST(lower_gemm_amax_within_rows) {
  /* an fp8 quantization's amax(|y|) of an fp8 GEMM's f32 output, over N: a col_max (atomic max into an M-vector) */
  lowered_graph lg;
  if (!lower_text("graph t {\n"
                  "  %x: f8e4m3[256,64] = input()\n  %wt: f8e4m3[128,64] = param()\n  %w = permute(%wt, dims=[1,0])\n"
                  "  %y = mm(%x, %w, out_dtype=f32)\n  %a = abs(%y)\n  %mx = amax(%a, dims=[1])\n"
                  "  output %y\n  output %mx\n}\n",
                  &lg))
    return;
  const evt_lowered *L = group_of(&lg, "mx");
  CHECK_MSG(L && L->ok && L->kind == EVT_LK_GEMM_EVT, "%s", L ? L->reason : "?");
  int mx = -1;
  for (int i = 0; L && i < L->spec.nnodes; i++)
    if (L->spec.nodes[i].op == EVT_V_COL_MAX) mx = i;
  CHECK(mx >= 0 && L->vtensor[mx] == evt_graph_find(lg.g, "mx") && L->spec.nodes[mx].dtype == EVT_F32);
  CHECK(mx >= 0 && L->spec.nodes[L->spec.nodes[mx].in[0]].op == EVT_V_ABS);
  CHECK(L && evt_kspec_has_sums(&L->spec) && L->spec.cfg.schedule == EVT_SCHED_COOPERATIVE);
  lowered_free(&lg);
  /* a max over M (per column) has no GEMM visitor */
  if (!lower_text("graph t {\n"
                  "  %x: f8e4m3[256,64] = input()\n  %wt: f8e4m3[128,64] = param()\n  %w = permute(%wt, dims=[1,0])\n"
                  "  %y = mm(%x, %w, out_dtype=f32)\n  %mx = amax(%y, dims=[0])\n"
                  "  output %y\n  output %mx\n}\n",
                  &lg))
    return;
  L = group_of(&lg, "mx");
  CHECK(L && (L->kind != EVT_LK_GEMM_EVT || !L->ok || strstr(L->reason, "amax over rows")));
  lowered_free(&lg);
  /* a 16-bit GEMM takes the row amax of its output in its epilogue too (check_evt's bias_relu_amax on the GPU) */
  if (!lower_text("graph t {\n"
                  "  %x: bf16[256,64] = input()\n  %w: bf16[64,128] = param()\n"
                  "  %m = mm(%x, %w)\n  %y = cast(%m, dtype=f32)\n  %a = abs(%y)\n  %mx = amax(%a, dims=[1])\n"
                  "  output %y\n  output %mx\n}\n",
                  &lg))
    return;
  L = group_of(&lg, "mx");
  CHECK(L && L->kind == EVT_LK_GEMM_EVT && L->ok && group_of(&lg, "m") == L);
  lowered_free(&lg);
}

TEST(lower_f32_gemm_on_tf32_only_when_asked) {
  /* an f32 linear layer, x·Wᵀ (W stored N x K: layout NT, both operands K-major), bias and ReLU in the epilogue */
  static const char *nt = "graph t {\n"
                          "  %x: f32[256,64] = input()\n  %wt: f32[128,64] = param()\n  %w = permute(%wt, dims=[1,0])\n"
                          "  %b: f32[128] = param()\n  %m = mm(%x, %w)\n  %h = add(%m, %b)\n  %y = relu(%h)\n  output %y\n}\n";
  lowered_graph lg;
  if (!lower_text_flags(nt, &lg, true, 0)) return;
  const evt_lowered *L = group_of(&lg, "m"); /* exact f32 (the default): unfused, the reason names the option */
  CHECK_MSG(L && !L->ok && strstr(L->reason, "%m") && strstr(L->reason, "f32 x f32") && strstr(L->reason, "tf32"), "%s",
            L ? L->reason : "?");
  lowered_free(&lg);
  if (!lower_text_flags(nt, &lg, true, EVT_LOWER_TF32)) return;
  L = group_of(&lg, "y");
  CHECK_MSG(L && L->ok && L->kind == EVT_LK_GEMM_EVT && group_of(&lg, "m") == L, "%s", L ? L->reason : "?");
  if (L && L->ok) {
    CHECK(L->spec.ab_dtype == EVT_F32 && !L->spec.b_mixed && L->spec.layout == EVT_LAYOUT_NT);
    CHECK(L->spec.d_dtype == EVT_F32 && L->spec.cfg.tile_k == 32 && L->d_tensor == evt_graph_find(lg.g, "y"));
    CHECK(L->b_node == evt_graph_find(lg.g, "wt"));
    char *src = evt_emit_cutlass(&L->spec, NULL, 0);
    CHECK(src && strstr(src, "using ElementA = float;") && strstr(src, "Shape<_128, _128, _32>"));
    free(src);
  }
  lowered_free(&lg);
  /* W stored K x N (layout NN): TF32 wgmma needs B K-major, refused by name; W stored N x K (NT) over 1001 rows
   * (M takes any size) lowers */
  if (!lower_text_flags("graph t {\n"
                        "  %x: f32[1001,64] = input()\n  %w: f32[64,128] = param()\n  %m = mm(%x, %w)\n"
                        "  %y = relu(%m)\n  %v: f32[128,64] = param()\n  %vt = permute(%v, dims=[1,0])\n"
                        "  %n = mm(%x, %vt)\n  %h: f32[] = scalar(value=0.5)\n  %ns = mul(%n, %h)\n  output %y\n  output %ns\n}\n",
                        &lg, true, EVT_LOWER_TF32))
    return;
  L = group_of(&lg, "m");
  CHECK_MSG(L && !L->ok && L->bad_node == evt_graph_find(lg.g, "m") && strstr(L->reason, "%m") &&
                strstr(L->reason, "layout NN") && strstr(L->reason, "K-major"),
            "%s", L ? L->reason : "?");
  L = group_of(&lg, "n");
  CHECK_MSG(L && L->ok && L->spec.layout == EVT_LAYOUT_NT && L->m == 1001 && L->spec.ab_dtype == EVT_F32, "%s",
            L ? L->reason : "?");
  lowered_free(&lg);
  /* a row of A in memory of 1001 elements (layout TN, M = 1001) is refused by name */
  if (!lower_text_flags("graph t {\n"
                        "  %x: bf16[64,1001] = input()\n  %xt = permute(%x, dims=[1,0])\n  %w: bf16[64,128] = param()\n"
                        "  %m = mm(%xt, %w)\n  output %m\n}\n",
                        &lg, true, 0))
    return;
  L = group_of(&lg, "m");
  CHECK_MSG(L && !L->ok && L->bad_node == evt_graph_find(lg.g, "m") && strstr(L->reason, "M=1001") &&
                strstr(L->reason, "layout TN") && strstr(L->reason, "rows of A (M)"),
            "%s", L ? L->reason : "?");
  lowered_free(&lg);
  /* sm_8x: refused when retargeted (evt's Sm80 GEMMs take 16-bit operands) */
  if (!lower_text_flags(nt, &lg, true, EVT_LOWER_TF32)) return;
  evt_lower_retarget(lg.g, lg.part.group, &lg.low, 80);
  L = group_of(&lg, "m");
  CHECK_MSG(L && !L->ok && strstr(L->reason, "sm_80") && strstr(L->reason, "TF32"), "%s", L ? L->reason : "?");
  lowered_free(&lg);
}

TEST(lower_wide_gemm_gets_the_wide_tile) {
  /* a column sum (Σ over N, CUTLASS's Sm90ColReduction): 128x256 cooperative once N >= 256; a bias-gradient
   * row sum (Σ over M, the project's RowSum node) over K <= 4096: 128x128 ping-pong */
  for (int dim = 1; dim >= 0; dim--) {
    lowered_graph lg;
    char text[512];
    snprintf(text, sizeof text,
             "graph t {\n"
             "  %%x: bf16[256,64] = input()\n  %%w: bf16[64,512] = param()\n"
             "  %%m = mm(%%x, %%w)\n  %%y = cast(%%m, dtype=f32)\n  %%db = sum(%%y, dims=[%d])\n"
             "  output %%y\n  output %%db\n}\n",
             dim);
    if (!lower_text(text, &lg)) return;
    CHECK(lg.low.n == 1);
    const evt_lowered *L = &lg.low.k[0];
    CHECK_MSG(L->ok && L->kind == EVT_LK_GEMM_EVT, "%s", L->reason);
    CHECK(evt_kspec_has_sums(&L->spec));
    if (dim == 1)
      CHECK(L->spec.cfg.tile_m == 128 && L->spec.cfg.tile_n == 256 && L->spec.cfg.cluster_m == 1 &&
            L->spec.cfg.schedule == EVT_SCHED_COOPERATIVE);
    else
      CHECK(L->spec.cfg.tile_m == 128 && L->spec.cfg.tile_n == 128 && L->spec.cfg.schedule == EVT_SCHED_PINGPONG);
    char err[256];
    CHECK_MSG(evt_tile_config_check(&L->spec, &L->spec.cfg, err, sizeof err) == EVT_OK, "%s", err);
    lowered_free(&lg);
  }
}

TEST(lower_gemm_without_sums_gets_ping_pong) {
  /* no row/column sum and K <= 4096: 128x128 ping-pong (the epilogue overlaps the other warp group's
   * mainloop); K = 8192: the cooperative 128x256 tile */
  const char *ks[] = {"64", "8192"};
  for (int i = 0; i < 2; i++) {
    char text[512];
    snprintf(text, sizeof text,
             "graph t {\n  %%x: bf16[256,%s] = input()\n  %%w: bf16[%s,512] = param()\n"
             "  %%m = mm(%%x, %%w)\n  %%y = relu(%%m)\n  output %%y\n}\n", ks[i], ks[i]);
    lowered_graph lg;
    if (!lower_text(text, &lg)) return;
    const evt_lowered *L = &lg.low.k[0];
    CHECK_MSG(L->ok && L->kind == EVT_LK_GEMM_EVT, "%s", L->reason);
    if (i == 0)
      CHECK(L->spec.cfg.tile_m == 128 && L->spec.cfg.tile_n == 128 && L->spec.cfg.schedule == EVT_SCHED_PINGPONG);
    else
      CHECK(L->spec.cfg.tile_m == 128 && L->spec.cfg.tile_n == 256 && L->spec.cfg.schedule == EVT_SCHED_COOPERATIVE);
    char err[256];
    CHECK_MSG(evt_tile_config_check(&L->spec, &L->spec.cfg, err, sizeof err) == EVT_OK, "%s", err);
    lowered_free(&lg);
  }
}

TEST(lower_aux_store_and_bias_through_expand) {
  /* %h leaves the group too: an aux store threaded before D; the bias reaches the add through an expand of a
   * param (a source view): its strides (0, 1) make it a row broadcast */
  lowered_graph lg;
  if (!lower_text("graph t {\n"
                  "  %x: f16[32,64] = input()\n  %w: f16[64,128] = param()\n  %b: f16[128] = param()\n"
                  "  %be = expand(%b, shape=[32,128])\n"
                  "  %m = mm(%x, %w)\n  %h = add(%m, %be)\n  %y = relu(%h)\n  output %y\n  output %h\n}\n",
                  &lg))
    return;
  const evt_lowered *L = &lg.low.k[0];
  CHECK_MSG(L->ok, "%s", L->reason);
  int stores = 0, rows = 0;
  for (int i = 0; i < L->spec.nnodes; i++) {
    if (L->spec.nodes[i].op == EVT_V_AUX_STORE) {
      stores++;
      CHECK(L->vtensor[i] == evt_graph_find(lg.g, "h"));
    }
    if (L->spec.nodes[i].op == EVT_V_ROW_BCAST) {
      rows++;
      CHECK(L->vtensor[i] == evt_graph_find(lg.g, "b"));
    }
  }
  CHECK(stores == 1 && rows == 1);
  CHECK(L->spec.ab_dtype == EVT_F16 && L->spec.nodes[L->spec.d_node].op == EVT_V_RELU);
  lowered_free(&lg);
}

TEST(lower_bias_gradient_is_row_sum) {
  /* dW-style GEMM whose output's column sums (over M) are the bias gradient, and a sum over N */
  lowered_graph lg;
  if (!lower_text("graph t {\n"
                  "  %a: bf16[32,64] = input()\n  %w: bf16[64,128] = param()\n"
                  "  %m = mm(%a, %w)\n  %c = cast(%m, dtype=f32)\n  %db = sum(%c, dims=[0])\n  output %c\n  output %db\n}\n",
                  &lg))
    return;
  const evt_lowered *L = &lg.low.k[0];
  CHECK_MSG(L->ok, "%s", L->reason);
  int rs = -1;
  for (int i = 0; i < L->spec.nnodes; i++)
    if (L->spec.nodes[i].op == EVT_V_ROW_SUM) rs = i;
  CHECK(rs >= 0 && L->vtensor[rs] == evt_graph_find(lg.g, "db") && L->spec.nodes[rs].dtype == EVT_F32);
  CHECK(L->d_tensor == evt_graph_find(lg.g, "c") && L->spec.d_dtype == EVT_F32);
  lowered_free(&lg);
  /* Σ over N (dims=[1], kept as [M,1]) is a column sum; no tile value leaves: D is a scratch tile */
  if (!lower_text("graph t {\n"
                  "  %a: bf16[32,64] = input()\n  %w: bf16[64,128] = param()\n"
                  "  %m = mm(%a, %w)\n  %c = cast(%m, dtype=f32)\n  %s = sum(%c, dims=[1], keepdim=1)\n  output %s\n}\n",
                  &lg))
    return;
  L = &lg.low.k[0];
  CHECK_MSG(L->ok, "%s", L->reason);
  int cs = -1;
  for (int i = 0; i < L->spec.nnodes; i++)
    if (L->spec.nodes[i].op == EVT_V_COL_SUM) cs = i;
  CHECK(cs >= 0 && L->vtensor[cs] == evt_graph_find(lg.g, "s"));
  CHECK(L->d_tensor == -1);
  lowered_free(&lg);
}

TEST(lower_permute_operands_become_layouts) {
  lowered_graph lg;
  /* A stored as K x M (a permute of an input: a source view), B stored as N x K (a permute in the group) */
  if (!lower_text("graph t {\n"
                  "  %at: bf16[64,32] = input()\n  %w: bf16[64,128] = param()\n  %x: bf16[32,64] = input()\n"
                  "  %wt: bf16[128,64] = param()\n  %u: bf16[128,64] = input()\n"
                  "  %a = permute(%at, dims=[1,0])\n  %m1 = mm(%a, %w)\n"
                  "  %ru = relu(%u)\n  %p = permute(%ru, dims=[1,0])\n  %m2 = mm(%x, %p)\n"
                  "  %m3 = mm(%a, %p)\n"
                  "  output %m1\n  output %m2\n  output %m3\n}\n",
                  &lg))
    return;
  const evt_lowered *L1 = group_of(&lg, "m1"), *L2 = group_of(&lg, "m2"), *L3 = group_of(&lg, "m3");
  if (!L1 || !L2 || !L3) return;
  CHECK_MSG(L1->ok && L1->spec.layout == EVT_LAYOUT_TN, "%s", L1->reason);
  CHECK(L1->a_node == evt_graph_find(lg.g, "at") && L1->b_node == evt_graph_find(lg.g, "w"));
  CHECK(L1->m == 32 && L1->n == 128 && L1->k == 64);
  /* %p has two GEMM consumers: it is materialized by its own kernel (a permute is not a pointwise spec),
   * or fused as a layout; either way a B of N x K memory read as B^T is NT, or the plain buffer is NN */
  CHECK_MSG(L2->ok, "%s", L2->reason);
  if (lg.part.group[evt_graph_find(lg.g, "p")] == lg.part.group[evt_graph_find(lg.g, "m2")])
    CHECK(L2->spec.layout == EVT_LAYOUT_NT && L2->b_node == evt_graph_find(lg.g, "ru"));
  lowered_free(&lg);
  /* both transposed: refused with a reason naming the GEMM */
  if (!lower_text("graph t {\n"
                  "  %at: bf16[64,32] = input()\n  %bt: bf16[128,64] = param()\n"
                  "  %a = permute(%at, dims=[1,0])\n  %b = transpose(%bt, dims=[0,1])\n  %m = mm(%a, %b)\n  output %m\n}\n",
                  &lg))
    return;
  CHECK(!lg.low.k[0].ok && lg.low.k[0].kind == EVT_LK_UNFUSED);
  CHECK_MSG(strstr(lg.low.k[0].reason, "%m (mm)") && strstr(lg.low.k[0].reason, "TT"), "%s", lg.low.k[0].reason);
  lowered_free(&lg);
}

TEST(lower_unsupported_nodes_give_reasons) {
  struct {
    const char *body, *want1, *want2;
  } cases[] = {
      {"  %x: bf16[32,64] = input()\n  %w: bf16[64,128] = param()\n  %m = mm(%x, %w)\n  %e = pow(%m, value=3)\n  output %e\n",
       "%e (pow)", "no visitor node for pow"},
      {"  %x: f32[32,64] = input()\n  %w: f32[64,128] = param()\n  %m = mm(%x, %w)\n  output %m\n", "%m (mm)",
       "operands f32 x f32"},
      {"  %x: bf16[16,64] = input()\n  %w: bf16[64,10] = param()\n  %m = mm(%x, %w)\n  output %m\n", "%m (mm)",
       "multiples of 8 elements"},
      /* a tile operand stored transposed (a permute of an input) is not a broadcast of the tile */
      {"  %x: bf16[32,64] = input()\n  %w: bf16[64,128] = param()\n  %t: bf16[128,32] = input()\n"
       "  %tt = permute(%t, dims=[1,0])\n  %m = mm(%x, %w)\n  %o = add(%m, %tt)\n  output %o\n",
       "%o (add)", "not a broadcast of the"},
      /* a run-time scalar of an integer dtype (float ones are scalar_load nodes) */
      {"  %x: bf16[32,64] = input()\n  %w: bf16[64,128] = param()\n  %v: i64[] = input()\n  %c = cast(%v, dtype=bf16)\n"
       "  %m = mm(%x, %w)\n  %o = mul(%m, %c)\n  output %o\n",
       "(cast)", "cast from i64"},
      /* amax in a GEMM epilogue into bf16: CTAs meet in f32 atomic maxima */
      {"  %x: bf16[32,64] = input()\n  %w: bf16[64,128] = param()\n  %m = mm(%x, %w)\n  %a = amax(%m, dims=[1])\n"
       "  output %m\n  output %a\n",
       "%a (amax)", "GEMM"},
      /* a bias gradient summed into bf16: the visitor's sums are f32 atomics */
      {"  %x: bf16[32,64] = input()\n  %w: bf16[64,128] = param()\n  %m = mm(%x, %w)\n  %s = sum(%m, dims=[0])\n"
       "  output %m\n  output %s\n",
       "%s (sum)", "f32"},
      /* a bmm operand shared by every batch (an expanded matrix): each batch needs its own B */
      {"  %q: bf16[2,32,64] = input()\n  %k: bf16[64,32] = input()\n  %ke = expand(%k, shape=[2,64,32])\n"
       "  %m = bmm(%q, %ke)\n  output %m\n", "%m (bmm)", "broadcast over a batch dim"},
  };
  for (int i = 0; i < EVT_ARRAY_LEN(cases); i++) {
    char text[1024];
    snprintf(text, sizeof text, "graph t {\n%s}\n", cases[i].body);
    lowered_graph lg;
    if (!lower_text(text, &lg)) continue;
    bool found = false;
    for (int k = 0; k < lg.low.n; k++) {
      const evt_lowered *L = &lg.low.k[k];
      if (L->ok) continue;
      if (strstr(L->reason, cases[i].want1) && strstr(L->reason, cases[i].want2) && L->bad_node >= 0 &&
          strstr(L->reason, "group ")) {
        found = true;
        CHECK(L->kind == EVT_LK_UNFUSED);
      }
    }
    CHECK_MSG(found, "case %d: no reason with '%s' and '%s' (first: %s)", i, cases[i].want1, cases[i].want2,
              lg.low.n ? lg.low.k[0].reason : "");
    lowered_free(&lg);
  }
}

TEST(lower_can_fuse_one_node) {
  char *err = NULL;
  evt_graph *g = evt_parse("graph t {\n"
                           "  %x: bf16[32,64] = input()\n  %w: bf16[64,128] = param()\n  %b: bf16[128] = param()\n"
                           "  %c: bf16[32,1] = input()\n  %t: bf16[128,32] = input()\n  %i: i64[32,128] = input()\n"
                           "  %m = mm(%x, %w)\n  %h = add(%m, %b)\n  %hc = mul(%h, %c)\n  %e = exp(%hc)\n"
                           "  %tt = permute(%t, dims=[1,0])\n  %bad = add(%hc, %tt)\n  %ci = cast(%i, dtype=bf16)\n"
                           "  output %e\n  output %bad\n  output %ci\n}\n",
                           "t", &err);
  CHECK_MSG(g, "%s", err ? err : "");
  free(err);
  if (!g) return;
  int m = evt_graph_find(g, "m");
  char why[256];
  CHECK(evt_lower_can_fuse(g, m, evt_graph_find(g, "h"), why, sizeof why));
  CHECK(evt_lower_can_fuse(g, m, evt_graph_find(g, "hc"), why, sizeof why)); /* [M,1]: a column broadcast */
  CHECK(evt_lower_can_fuse(g, m, evt_graph_find(g, "e"), why, sizeof why)); /* exp: an evt_ops functor */
  CHECK(!evt_lower_can_fuse(g, m, evt_graph_find(g, "bad"), why, sizeof why) && strstr(why, "%tt"));
  CHECK(!evt_lower_can_fuse(g, m, evt_graph_find(g, "ci"), why, sizeof why) && strstr(why, "cast from i64"));
  CHECK(!evt_lower_can_fuse(g, evt_graph_find(g, "h"), evt_graph_find(g, "hc"), why, sizeof why) && strstr(why, "GEMM"));
  evt_graph_free(g);
}

TEST(lower_equal_epilogues_share_a_kernel) {
  lowered_graph lg;
  if (!lower_text("graph t {\n"
                  "  %x: bf16[32,64] = input()\n  %w1: bf16[64,64] = param()\n  %b1: bf16[64] = param()\n"
                  "  %w2: bf16[64,64] = param()\n  %b2: bf16[64] = param()\n"
                  "  %m1 = mm(%x, %w1)\n  %h1 = add(%m1, %b1)\n  %y1 = relu(%h1)\n"
                  "  %m2 = mm(%y1, %w2)\n  %h2 = add(%m2, %b2)\n  %y2 = relu(%h2)\n  output %y2\n}\n",
                  &lg))
    return;
  CHECK(lg.low.n == 2 && lg.low.k[0].ok && lg.low.k[1].ok);
  CHECK(!strcmp(lg.low.k[0].kernel, lg.low.k[1].kernel));
  lowered_free(&lg);
}

/* The whole pipeline on one example, as evtc compile runs it (greedy partition: fast). */
static bool compile_example(const char *path, lowered_graph *lg, evt_plan *plan) {
  char *err = NULL;
  memset(lg, 0, sizeof *lg);
  lg->g = evt_parse_file(path, &err);
  CHECK_MSG(lg->g, "%s: %s", path, err ? err : "");
  free(err);
  if (!lg->g) return false;
  CHECK(evt_train_ensure_joint(lg->g, NULL) == EVT_OK);
  CHECK_MSG(evt_passes_run_all(lg->g, 0, 0) == EVT_OK, "%s", evt_graph_error(lg->g));
  evt_part_options o = evt_part_options_default();
  o.use_ilp = 0;
  o.use_cache = 0;
  CHECK(evt_part_plan_build(lg->g, &o, EVT_PART_LAMBDA_DEFAULT, &lg->part) == EVT_OK);
  CHECK(evt_lower_plan(lg->g, &lg->part, &lg->low) == EVT_OK);
  CHECK(evt_plan_build(lg->g, &lg->part, &lg->low, plan) == EVT_OK);
  return true;
}

TEST(plan_invariants_on_every_example) {
  glob_t gl;
  if (glob("examples/*.evt", 0, NULL, &gl) != 0) {
    CHECK_MSG(0, "no examples/*.evt (run from the repository root)");
    return;
  }
  for (size_t e = 0; e < gl.gl_pathc; e++) {
    lowered_graph lg;
    evt_plan plan;
    if (!compile_example(gl.gl_pathv[e], &lg, &plan)) continue;
    char err[512] = "";
    CHECK_MSG(evt_plan_check(lg.g, &plan, err, sizeof err) == EVT_OK, "%s: %s", gl.gl_pathv[e], err);
    CHECK_MSG(plan.arena_bytes < plan.naive_bytes, "%s: arena %lld, sum %lld", gl.gl_pathv[e], (long long)plan.arena_bytes,
              (long long)plan.naive_bytes);
    /* every group is accounted for: lowered, or a reason naming its group */
    CHECK(lg.low.n == lg.part.ngroups && plan.nlaunches == lg.part.ngroups);
    int sum = 0;
    for (int k = 0; k < EVT_LK_COUNT; k++) sum += lg.low.count[k];
    CHECK(sum == lg.low.n);
    for (int i = 0; i < lg.low.n; i++)
      CHECK_MSG(lg.low.k[i].ok || strstr(lg.low.k[i].reason, "group "), "%s group %d: '%s'", gl.gl_pathv[e], i, lg.low.k[i].reason);
    /* every graph output has a buffer, every tensor read across groups has one */
    for (int i = 0; i < lg.g->noutputs; i++) CHECK(plan.buffer_of[lg.g->outputs[i]] >= 0);
    for (int w = 0; w < lg.g->nnodes; w++)
      for (int k = 0; k < lg.g->nodes[w].ninputs; k++) {
        int u = lg.g->nodes[w].inputs[k];
        if (lg.part.group[w] >= 0 && lg.part.group[u] >= 0 && lg.part.group[u] != lg.part.group[w])
          CHECK_MSG(plan.buffer_of[u] >= 0, "%s: %%%s crosses groups without a buffer", gl.gl_pathv[e], lg.g->nodes[u].name);
      }
    printf("  %s: %d groups: gemm+evt %d (lowered %d), row %d, pointwise %d, unfused %d; arena %lld of %lld bytes\n",
           gl.gl_pathv[e], lg.low.n, lg.low.count[EVT_LK_GEMM_EVT], lg.low.lowered, lg.low.count[EVT_LK_ROW],
           lg.low.count[EVT_LK_POINTWISE], lg.low.count[EVT_LK_UNFUSED], (long long)plan.arena_bytes, (long long)plan.naive_bytes);
    evt_plan_free(&plan);
    lowered_free(&lg);
  }
  globfree(&gl);
}

TEST(plan_check_catches_overlap_and_dead_reads) {
  lowered_graph lg;
  evt_plan plan;
  if (!compile_example("examples/mlp.evt", &lg, &plan)) return;
  char err[512];
  CHECK(evt_plan_check(lg.g, &plan, err, sizeof err) == EVT_OK);
  /* two arena buffers whose lifetimes intersect, moved onto each other: the check must object */
  int a = -1, b = -1;
  for (int i = 0; i < plan.nbuffers && b < 0; i++)
    for (int j = i + 1; j < plan.nbuffers && b < 0; j++) {
      evt_plan_buffer *x = &plan.buffers[i], *y = &plan.buffers[j];
      if (x->offset >= 0 && y->offset >= 0 && x->first <= y->last && y->first <= x->last) a = i, b = j;
    }
  CHECK(b >= 0);
  if (b >= 0) {
    int64_t save = plan.buffers[b].offset;
    plan.buffers[b].offset = plan.buffers[a].offset;
    CHECK(evt_plan_check(lg.g, &plan, err, sizeof err) == EVT_ERR_INTERNAL && strstr(err, "overlap"));
    plan.buffers[b].offset = save;
  }
  /* a read after the buffer's last use */
  int l = -1, buf = -1;
  for (int i = 0; i < plan.nlaunches && buf < 0; i++)
    for (int j = 0; j < plan.launches[i].nreads && buf < 0; j++)
      if (plan.buffers[plan.launches[i].reads[j]].offset >= 0) l = i, buf = plan.launches[i].reads[j];
  CHECK(buf >= 0);
  if (buf >= 0) {
    int save = plan.buffers[buf].last;
    plan.buffers[buf].last = l - 1;
    plan.buffers[buf].first = plan.buffers[buf].first < l - 1 ? plan.buffers[buf].first : l - 1;
    CHECK(evt_plan_check(lg.g, &plan, err, sizeof err) == EVT_ERR_INTERNAL);
    plan.buffers[buf].last = save;
  }
  evt_plan_free(&plan);
  lowered_free(&lg);
}

/* The relative error check_lowered_against_interp_rules allows (bf16 graphs: the spec rounds once where the
 * interpreter rounds per node); f32-only tests tighten it. */
static double g_lower_tol = 3e-2;

/* max |ref - want| / max(max |want|, 1e-3) over n values */
static double rel_err(const double *ref, const double *want, int64_t n) {
  double diff = 0, scale = 1e-3;
  for (int64_t i = 0; i < n; i++) {
    double d = fabs(ref[i] - want[i]);
    if (!(d <= diff)) diff = d; /* NaN counts as worst */
    if (fabs(want[i]) > scale) scale = fabs(want[i]);
  }
  return diff / scale;
}

/* Runs g (already joint/optimized) on the interpreter, partitions (greedy) and lowers it, and checks every
 * lowered kernel's spec reference against the interpreter's values. Returns the number of kernels checked. */
static int check_lowered_against_interp_rules(evt_graph *g, const char *what, int *tensors_checked, bool lower_rules,
                                              int *gemm_lowered) {
  evt_part_options o = evt_part_options_default();
  o.use_ilp = 0;
  o.use_cache = 0;
  evt_part_plan part;
  evt_lower_result low;
  int checked = 0;
  if (lower_rules) CHECK(evt_lower_partition(g, &o, EVT_PART_LAMBDA_DEFAULT, &part) == EVT_OK);
  else CHECK(evt_part_plan_build(g, &o, EVT_PART_LAMBDA_DEFAULT, &part) == EVT_OK);
  CHECK(evt_lower_plan(g, &part, &low) == EVT_OK);
  int n = g->nnodes;
  evt_tensor *val = calloc((size_t)n, sizeof *val);
  CHECK(evt_interp_init_inputs(g, val, 7) == EVT_OK);
  CHECK(evt_interp_run(g, val, 0, 1) == EVT_OK);
  for (int gi = 0; gi < low.n; gi++) {
    const evt_lowered *L = &low.k[gi];
    if (!L->ok) continue;
    int nn = L->kind == EVT_LK_GEMM_EVT ? L->spec.nnodes : L->rspec.nnodes;
    double *mem[EVT_KSPEC_MAX_NODES] = {0};
    bool bad = false;
    for (int i = 0; i < nn && !bad; i++) {
      evt_vop op = L->kind == EVT_LK_GEMM_EVT ? L->spec.nodes[i].op : L->rspec.nodes[i].op;
      if (L->vtensor[i] < 0) continue;
      const evt_tensor *t = &val[L->vtensor[i]];
      int64_t want = evt_vop_elems(op, L->m, L->n);
      if (L->kind == EVT_LK_GEMM_EVT && L->spec.batched) want = t->numel; /* whole tensors, placed by the launch strides */
      CHECK_MSG(t->numel == want, "%s group %d node %d: %lld elements, want %lld", what, gi, i, (long long)t->numel, (long long)want);
      bad = t->numel != want;
      mem[i] = evt_vop_class(op) == 'S' ? calloc((size_t)want, sizeof(double)) : t->data;
    }
    double *d = NULL;
    if (!bad && L->kind == EVT_LK_GEMM_EVT) {
      int64_t dn = L->spec.batched ? evt_type_numel(&g->nodes[L->nucleus].type) : L->m * L->n;
      d = calloc((size_t)dn, sizeof *d);
      evt_lower_gemm_reference(L, val[L->a_node].data, val[L->b_node].data, mem, d, 0);
      if (L->d_tensor >= 0) {
        double r = rel_err(d, val[L->d_tensor].data, dn);
        CHECK_MSG(r < g_lower_tol, "%s group %d (%s): D vs %%%s: relative error %g", what, gi, L->kernel, g->nodes[L->d_tensor].name, r);
        (*tensors_checked)++;
      }
    } else if (!bad) {
      const double *in[4] = {NULL, NULL, NULL, NULL};
      for (int k = 0; k < 4; k++)
        if (L->rin[k] >= 0) in[k] = val[L->rin[k]].data;
      CHECK_MSG(evt_lower_rows_reference(g, L, in, mem, 0) == EVT_OK, "%s group %d: reference refused its inputs", what, gi);
    }
    for (int i = 0; i < nn; i++) {
      evt_vop op = L->kind == EVT_LK_GEMM_EVT ? L->spec.nodes[i].op : L->rspec.nodes[i].op;
      if (L->vtensor[i] < 0 || evt_vop_class(op) != 'S') continue;
      if (!bad) {
        const evt_tensor *t = &val[L->vtensor[i]];
        double r = rel_err(mem[i], t->data, t->numel);
        CHECK_MSG(r < g_lower_tol, "%s group %d (%s): store %d vs %%%s: relative error %g", what, gi, L->kernel, i,
                  g->nodes[L->vtensor[i]].name, r);
        (*tensors_checked)++;
      }
      free(mem[i]);
    }
    free(d);
    checked += !bad;
    if (gemm_lowered) *gemm_lowered += L->kind == EVT_LK_GEMM_EVT;
  }
  for (int i = 0; i < n; i++) evt_tensor_free(&val[i]);
  free(val);
  evt_lower_free(&low);
  evt_part_plan_free(&part);
  return checked;
}

static int check_lowered_against_interp(evt_graph *g, const char *what, int *tensors_checked) {
  return check_lowered_against_interp_rules(g, what, tensors_checked, false, NULL);
}

/* Every lowered kernel of every example (as bf16; partitioned with the partitioner's rules and with the
 * lowering's), run through its spec's CPU reference on the values
 * the interpreter computed for the whole graph, reproduces the group's outputs: the memory bindings
 * (A/B layouts, loads, row/col broadcasts, stores, sums, nucleus inputs) mean what the graph means. */
TEST(lower_specs_reproduce_the_interpreter) {
  glob_t gl;
  if (glob("examples/*.evt", 0, NULL, &gl) != 0) {
    CHECK_MSG(0, "no examples/*.evt (run from the repository root)");
    return;
  }
  int checked = 0, tensors_checked = 0;
  for (size_t e = 0; e < gl.gl_pathc; e++) {
    char *err = NULL;
    evt_graph *g = evt_parse_file(gl.gl_pathv[e], &err);
    free(err);
    if (!g) continue;
    CHECK(evt_lower_retype(g, EVT_BF16) == EVT_OK);
    CHECK(evt_train_ensure_joint(g, NULL) == EVT_OK);
    CHECK(evt_passes_run_all(g, 0, 0) == EVT_OK);
    checked += check_lowered_against_interp(g, gl.gl_pathv[e], &tensors_checked);
    checked += check_lowered_against_interp_rules(g, gl.gl_pathv[e], &tensors_checked, true, NULL); /* --fuse-rules=lower */
    evt_graph_free(g);
  }
  globfree(&gl);
  printf("  %d lowered kernels, %d output tensors checked against the interpreter\n", checked, tensors_checked);
  CHECK(checked >= 20);
}

/* Row groups whose epilogues read the nucleus inputs (acc IN0 / IN1), w/b vectors, broadcasts and sums. */
TEST(lower_row_groups_reproduce_the_interpreter) {
  const char *text =
      "graph rows {\n"
      "  %x: f32[16,24] = input()\n  %dy: f32[16,24] = input()\n  %w: f32[24] = param()\n  %b: f32[24] = param()\n"
      "  %c: f32[16,1] = input()\n"
      "  %dx = layer_norm_backward_input(%dy, %x, %w)\n  %o1 = add(%dx, %dy)\n  %o2 = mul(%o1, %x)\n"
      "  %s1 = sum(%o2, dims=[0])\n"
      "  %y = layer_norm(%x, %w, %b)\n  %o3 = sub(%y, %x)\n  %o4 = mul(%o3, %c)\n"
      "  %p = softmax(%o4, dim=1)\n  %sb = softmax_backward(%dy, %p, dim=1)\n  %o5 = add(%sb, %p)\n  %o6 = relu(%o5)\n"
      "  %s2 = sum(%o6, dims=[1])\n"
      "  output %o2\n  output %s1\n  output %o6\n  output %s2\n}\n";
  char *err = NULL;
  evt_graph *g = evt_parse(text, "rows", &err);
  CHECK_MSG(g, "%s", err ? err : "");
  free(err);
  if (!g) return;
  int tensors = 0;
  int checked = check_lowered_against_interp(g, "rows", &tensors);
  CHECK_MSG(checked >= 3 && tensors >= 4, "%d kernels, %d tensors", checked, tensors);
  evt_graph_free(g);
}

/* Partitioning with the lowering's rules (evt_lower_compat) keeps members the GEMM spec cannot hold out of
 * GEMM groups: more GEMM groups lower (mlp as bf16: 4 -> 8 with the greedy partition here, 11 exact), no GEMM group is
 * refused for an epilogue member, and every lowered kernel still reproduces the interpreter. */
TEST(lower_fuse_rules_lower_more_gemms) {
  int base = 0, more = 0, tensors = 0;
  for (int pass = 0; pass < 2; pass++) {
    char *err = NULL;
    evt_graph *g = evt_parse_file("examples/mlp.evt", &err);
    CHECK_MSG(g, "%s", err ? err : "");
    free(err);
    if (!g) return;
    CHECK(evt_lower_retype(g, EVT_BF16) == EVT_OK);
    CHECK(evt_train_ensure_joint(g, NULL) == EVT_OK);
    CHECK(evt_passes_run_all(g, 0, 0) == EVT_OK);
    check_lowered_against_interp_rules(g, pass ? "mlp (lower rules)" : "mlp", &tensors, pass == 1, pass ? &more : &base);
    if (pass == 1) {
      evt_part_options o = evt_part_options_default();
      o.use_ilp = 0;
      o.use_cache = 0;
      evt_part_plan part;
      evt_lower_result low;
      CHECK(evt_lower_partition(g, &o, EVT_PART_LAMBDA_DEFAULT, &part) == EVT_OK);
      CHECK(evt_lower_plan(g, &part, &low) == EVT_OK);
      for (int i = 0; i < low.n; i++) {
        const evt_lowered *L = &low.k[i];
        if (L->nucleus >= 0 && g->nodes[L->nucleus].op == EVT_OP_MM && !L->ok)
          CHECK_MSG(L->bad_node == L->nucleus, "GEMM group refused for a member: %s", L->reason);
      }
      evt_lower_free(&low);
      evt_part_plan_free(&part);
    }
    evt_graph_free(g);
  }
  CHECK_MSG(more > base, "gemm+evt lowered: %d with the lowering's rules, %d without", more, base);
  printf("  mlp (bf16, greedy): gemm+evt lowered %d with the partitioner's rules, %d with the lowering's\n", base, more);
}

/* Does the lowered spec of group L hold a node of kind op? */
static bool spec_has(const evt_lowered *L, evt_vop op) {
  int nn = L->kind == EVT_LK_GEMM_EVT ? L->spec.nnodes : L->rspec.nnodes;
  for (int i = 0; i < nn; i++)
    if ((L->kind == EVT_LK_GEMM_EVT ? L->spec.nodes[i].op : L->rspec.nodes[i].op) == op) return true;
  return false;
}

/* Every visitor node type added for the examples' loss / activation / mask groups, one graph each: the
 * group holding the op lowers (row kernel, or GEMM epilogue where the kind exists there), the spec has the
 * node, and its CPU reference (evt_vop_visit / evt_vop_apply3) reproduces the interpreter on random inputs
 * (check_lowered_against_interp_rules: every store and D). */
TEST(lower_new_visitor_nodes_match_the_interpreter) {
  const char *rows_head =
      "  %x: f32[8,24] = input(init=uniform, lo=-2, hi=2)\n  %p: f32[8,24] = input(init=uniform, lo=0.1, hi=2)\n"
      "  %r: f32[24] = input(init=uniform, lo=-1, hi=1)\n  %q: f32[8,1] = input(init=uniform, lo=-1, hi=1)\n"
      "  %t: i64[8] = input(init=randint, lo=0, hi=24)\n  %v: f32[4] = input(init=uniform, lo=0.5, hi=1)\n"
      "  %k = sum(%v)\n  %u: f32[8,24] = rand(seed=7, offset=11)\n";
  const char *gemm_head =
      "  %a: bf16[16,32] = input(init=uniform, lo=-1, hi=1)\n  %w: bf16[32,16] = param(init=uniform, lo=-1, hi=1)\n"
      "  %b: bf16[16] = param(init=uniform, lo=-1, hi=1)\n  %v: bf16[4] = input(init=uniform, lo=0.5, hi=1)\n"
      "  %k = sum(%v)\n  %m = mm(%a, %w)\n  %x = add(%m, %b)\n  %ax = abs(%x)\n";
  struct {
    const char *body;
    evt_vop op;
    bool gemm;
  } cases[] = {
      {"  %y = neg(%x)\n", EVT_V_NEG, false},
      {"  %y = exp(%x)\n", EVT_V_EXP, false},
      {"  %y = log(%p)\n", EVT_V_LOG, false},
      {"  %y = erf(%x)\n", EVT_V_ERF, false},
      {"  %y = tanh(%x)\n", EVT_V_TANH, false},
      {"  %y = sqrt(%p)\n", EVT_V_SQRT, false},
      {"  %y = rsqrt(%p)\n", EVT_V_RSQRT, false},
      {"  %y = reciprocal(%p)\n", EVT_V_RECIPROCAL, false},
      {"  %y = abs(%x)\n", EVT_V_ABS, false},
      {"  %y = sign(%x)\n", EVT_V_SIGN, false},
      /* a cast to bf16 used inside the group rounds there (bf16 addmm semantics: round, then add in f32) */
      {"  %h = cast(%x, dtype=bf16)\n  %hf = cast(%h, dtype=f32)\n  %y = add(%hf, %r)\n", EVT_V_ROUND_BF16, false},
      {"  %h = cast(%x, dtype=f16)\n  %hf = cast(%h, dtype=f32)\n  %y = mul(%hf, %x)\n", EVT_V_ROUND_F16, false},
      {"  %y = maximum(%x, %r)\n", EVT_V_MAXIMUM, false},
      {"  %y = minimum(%x, %q)\n", EVT_V_MINIMUM, false},
      {"  %y = eq(%x, %x)\n", EVT_V_EQ, false},
      {"  %y = ne(%x, %r)\n", EVT_V_NE, false},
      {"  %y = lt(%x, %r)\n", EVT_V_LT, false},
      {"  %y = le(%x, %q)\n", EVT_V_LE, false},
      {"  %y = gt(%x, %r)\n", EVT_V_GT, false},
      {"  %y = ge(%x, %q)\n", EVT_V_GE, false},
      {"  %c = gt(%x, %r)\n  %y = where(%c, %x, %p)\n", EVT_V_WHERE, false},
      {"  %c = lt(%x, %r)\n  %y = cast(%c, dtype=f32)\n  %z = mul(%y, %x)\n  output %z\n", EVT_V_LT, false},
      {"  %y = mul(%x, %k)\n", EVT_V_SCALAR_LOAD, false},
      /* integer labels (the loss's ignore mask): values ride in doubles, stored as i64 */
      {"  %ig: i64[] = scalar(value=5)\n  %z0: i64[] = scalar(value=0)\n  %c = ne(%t, %ig)\n  %y = where(%c, %t, %z0)\n"
       "  %f = cast(%c, dtype=f32)\n  %s = sum(%f)\n  output %s\n", EVT_V_WHERE, false},
      {"  %c = ge(%u, %p)\n  %y = cast(%c, dtype=f32)\n", EVT_V_RAND, false},
      {"  %y = one_hot(%t, num_classes=24)\n  %z = mul(%y, %x)\n  output %z\n", EVT_V_ONE_HOT, false},
      {"  %y = amax(%x, dims=[1])\n", EVT_V_COL_MAX, false},
      {"  %e = exp(%x)\n  %y = sum(%e, dims=[1])\n", EVT_V_COL_SUM, false},
      /* a reduction seen through a view that leaves (a bias gradient reshaped): the store binds to the view */
      {"  %e = exp(%x)\n  %s0 = sum(%e, dims=[0], keepdim=true)\n  %y = reshape(%s0, shape=[24])\n", EVT_V_ROW_SUM, false},
      {"  %y = exp(%ax)\n", EVT_V_EXP, true},
      {"  %y = log(%ax)\n", EVT_V_LOG, true},
      {"  %y = erf(%x)\n", EVT_V_ERF, true},
      {"  %y = tanh(%x)\n", EVT_V_TANH, true},
      {"  %y = rsqrt(%ax)\n", EVT_V_RSQRT, true},
      {"  %y = maximum(%x, %b)\n", EVT_V_MAXIMUM, true},
      {"  %c = gt(%x, %b)\n  %n = neg(%x)\n  %y = where(%c, %x, %n)\n", EVT_V_WHERE, true},
      {"  %c = ge(%x, %b)\n  %y = cast(%c, dtype=bf16)\n", EVT_V_GE, true},
      {"  %y = mul(%x, %k)\n", EVT_V_SCALAR_LOAD, true},
      {"  %xf = cast(%x, dtype=f32)\n  %e = exp(%xf)\n  %h = cast(%e, dtype=bf16)\n  %y = add(%h, %x)\n", EVT_V_ROUND_BF16, true},
      /* a side output D does not depend on: tied into the tree by keep (tree.c) */
      {"  %y = sigmoid(%x)\n  %z = tanh(%m)\n  output %z\n", EVT_V_TANH, true},
  };
  for (int i = 0; i < EVT_ARRAY_LEN(cases); i++) {
    char text[2048];
    snprintf(text, sizeof text, "graph t {\n%s%s  output %%y\n}\n", cases[i].gemm ? gemm_head : rows_head, cases[i].body);
    lowered_graph lg;
    if (!lower_text_rules(text, &lg)) continue;
    evt_graph *g = lg.g;
    const evt_lowered *L = &lg.low.k[lg.part.group[evt_graph_find(g, "y")]];
    CHECK_MSG(L->ok && (cases[i].gemm ? L->kind == EVT_LK_GEMM_EVT : L->kind != EVT_LK_GEMM_EVT) && spec_has(L, cases[i].op),
              "case %d (%s): group of %%y: %s %s", i, evt_vop_name(cases[i].op), evt_lower_kind_name(L->kind), L->reason);
    evt_lower_free(&lg.low);
    evt_part_plan_free(&lg.part);
    int tensors = 0;
    int checked = check_lowered_against_interp_rules(g, evt_vop_name(cases[i].op), &tensors, true, NULL);
    CHECK_MSG(checked >= 1 && tensors >= 1, "case %d: %d kernels, %d tensors checked", i, checked, tensors);
    evt_graph_free(g);
  }
}

/* A 16-bit scalar operand is the interpreter's value, rounded to its dtype: a bf16 0.1 threshold is
 * 0.10009765625 in the generated constant (the GPU compared with 0.1f, the interpreter and PyTorch with the
 * bf16 value: x = 0.10009765625 > 0.1 kept on the GPU only), in a GEMM epilogue and in a row kernel. */
TEST(lower_16bit_scalars_are_rounded_to_their_dtype) {
  const char *texts[] = {
      "graph t {\n  %a: bf16[64,32] = input()\n  %b: bf16[32,48] = param()\n  %m: bf16[64,48] = mm(%a, %b)\n"
      "  %t: bf16[] = scalar(value=0.1)\n  %c: bool[64,48] = gt(%m, %t)\n  %z: bf16[] = scalar(value=0)\n"
      "  %y: bf16[64,48] = where(%c, %m, %z)\n  output %y\n}\n",
      "graph t {\n  %x: bf16[64,48] = input()\n  %s: bf16[64,48] = softmax(%x, dim=1)\n  %t: bf16[] = scalar(value=0.1)\n"
      "  %c: bool[64,48] = gt(%s, %t)\n  %z: bf16[] = scalar(value=0)\n  %y: bf16[64,48] = where(%c, %s, %z)\n"
      "  output %y\n}\n"};
  for (int k = 0; k < EVT_ARRAY_LEN(texts); k++) {
    lowered_graph lg;
    if (!lower_text_rules(texts[k], &lg)) continue;
    evt_graph *g = lg.g;
    const evt_lowered *L = &lg.low.k[lg.part.group[evt_graph_find(g, "y")]];
    CHECK_MSG(L->ok && (k == 0) == (L->kind == EVT_LK_GEMM_EVT), "text %d: %s %s", k, evt_lower_kind_name(L->kind), L->reason);
    int rounded = 0, raw = 0;
    int nn = L->kind == EVT_LK_GEMM_EVT ? L->spec.nnodes : L->rspec.nnodes;
    for (int i = 0; i < nn; i++) {
      bool sc = L->kind == EVT_LK_GEMM_EVT ? L->spec.nodes[i].op == EVT_V_SCALAR : L->rspec.nodes[i].op == EVT_V_SCALAR;
      double v = L->kind == EVT_LK_GEMM_EVT ? L->spec.nodes[i].value : L->rspec.nodes[i].value;
      rounded += sc && v == 0.10009765625;
      raw += sc && v == 0.1;
    }
    CHECK_MSG(rounded == 1 && raw == 0, "text %d: %d rounded, %d unrounded threshold constants", k, rounded, raw);
    evt_lower_free(&lg.low);
    evt_part_plan_free(&lg.part);
    int tensors = 0;
    CHECK(check_lowered_against_interp_rules(g, "bf16 threshold", &tensors, true, NULL) >= 1 && tensors >= 1);
    evt_graph_free(g);
  }
}

/* A cast to bf16 / f16 whose value the group uses again rounds there (round_bf16 / round_f16) and the
 * mean of a row is a sum of x / count: on f32 graphs the spec reference matches the interpreter to 1e-5
 * (a round left out would be ~4e-3 off). */
TEST(lower_mid_tree_rounding_and_mean_are_exact) {
  const char *bodies[] = {
      "  %h = cast(%x, dtype=bf16)\n  %hf = cast(%h, dtype=f32)\n  %y = add(%hf, %r)\n",
      "  %h = cast(%x, dtype=f16)\n  %hf = cast(%h, dtype=f32)\n  %y = mul(%hf, %x)\n",
      "  %y = mean(%x, dims=[1], keepdim=1)\n",
      "  %d = sub(%x, %r)\n  %y = mean(%d, dims=[1])\n",
  };
  const evt_vop ops[] = {EVT_V_ROUND_BF16, EVT_V_ROUND_F16, EVT_V_COL_SUM, EVT_V_COL_SUM};
  for (int i = 0; i < EVT_ARRAY_LEN(bodies); i++) {
    char text[1024];
    snprintf(text, sizeof text,
             "graph t {\n  %%x: f32[8,24] = input(init=uniform, lo=-2, hi=2)\n"
             "  %%r: f32[24] = input(init=uniform, lo=-1, hi=1)\n%s  output %%y\n}\n", bodies[i]);
    char *err = NULL;
    evt_graph *g = evt_parse(text, "t", &err);
    CHECK_MSG(g, "case %d: %s", i, err ? err : "");
    free(err);
    if (!g) continue;
    lowered_graph lg = {0};
    int y = evt_graph_find(g, "y");
    evt_part_options o = evt_part_options_default();
    o.use_cache = 0;
    CHECK(evt_lower_partition(g, &o, EVT_PART_LAMBDA_DEFAULT, &lg.part) == EVT_OK);
    CHECK(evt_lower_plan(g, &lg.part, &lg.low) == EVT_OK);
    const evt_lowered *L = &lg.low.k[lg.part.group[y]];
    CHECK_MSG(L->ok && spec_has(L, ops[i]), "case %d: %s", i, L->reason);
    evt_lower_free(&lg.low);
    evt_part_plan_free(&lg.part);
    int tensors = 0;
    g_lower_tol = 1e-5;
    CHECK(check_lowered_against_interp_rules(g, "rounding", &tensors, true, NULL) >= 1 && tensors >= 1);
    g_lower_tol = 3e-2;
    evt_graph_free(g);
  }
}

/* Sums into bf16: a row kernel rounds once at the store (one owner per row, or the finalize pass); a GEMM's
 * CTAs add with f32 atomics, so there the sum stays out of the epilogue and the reason says why. */
TEST(lower_bf16_sums_rows_yes_gemm_no) {
  lowered_graph lg;
  if (!lower_text("graph t {\n  %x: bf16[16,32] = input()\n  %e = exp(%x)\n  %s = sum(%e, dims=[1])\n"
                  "  %c = sum(%e, dims=[0])\n  output %s\n  output %c\n}\n", &lg))
    return;
  const evt_lowered *L = group_of(&lg, "s");
  CHECK_MSG(L && L->ok && spec_has(L, EVT_V_COL_SUM) && spec_has(L, EVT_V_ROW_SUM), "%s", L ? L->reason : "");
  for (int i = 0; L && i < L->rspec.nnodes; i++)
    if (evt_vop_class(L->rspec.nodes[i].op) == 'S') CHECK(L->rspec.nodes[i].dtype == EVT_BF16);
  lowered_free(&lg);
  char why[256];
  char *err = NULL;
  evt_graph *g = evt_parse("graph t {\n  %x: bf16[32,64] = input()\n  %w: bf16[64,128] = param()\n  %m = mm(%x, %w)\n"
                           "  %s = sum(%m, dims=[0])\n  output %m\n  output %s\n}\n", "t", &err);
  CHECK_MSG(g, "%s", err ? err : "");
  free(err);
  if (!g) return;
  CHECK(!evt_lower_can_fuse(g, evt_graph_find(g, "m"), evt_graph_find(g, "s"), why, sizeof why));
  CHECK_MSG(strstr(why, "atomics") && strstr(why, "bf16"), "%s", why);
  evt_graph_free(g);
}

/* A widening cast (bf16 -> f32) read only by a softmax or a layer norm as its input fuses into the row nucleus's
 * load (partition rules: CONVERT / CONVERT_IN): one row group reads the bf16 tensor (rspec in_dtype bf16) and
 * the f32 copy is never written; the spec reproduces the interpreter. So does a layer-norm backward's bf16 dy
 * next to its f32 x (mixed input dtypes: in_dtype bf16, in1 f32) and a softmax backward's dy. A cast that is
 * also read elsewhere or is a graph output stays a value of its own. */
TEST(lower_widening_cast_fuses_into_row_nucleus_load) {
  lowered_graph lg;
  if (!lower_text("graph t {\n  %x: bf16[16,64] = input()\n  %w: f32[64] = param()\n  %b: f32[64] = param()\n"
                  "  %xf = cast(%x, dtype=f32)\n  %p = softmax(%xf, dim=1)\n  %l = log(%p)\n  %s = sum(%l, dims=[1])\n"
                  "  %y: bf16[16,64] = input()\n  %yf = cast(%y, dtype=f32)\n  %n = layer_norm(%yf, %w, %b)\n"
                  "  %r = relu(%n)\n  output %s\n  output %r\n}\n", &lg))
    return;
  for (int k = 0; k < 2; k++) {
    const char *cast = k ? "yf" : "xf", *nuc = k ? "n" : "p";
    int c = evt_graph_find(lg.g, cast), nu = evt_graph_find(lg.g, nuc);
    CHECK_MSG(lg.part.group[c] >= 0 && lg.part.group[c] == lg.part.group[nu], "%s not in %s's group", cast, nuc);
    const evt_lowered *L = group_of(&lg, nuc);
    CHECK_MSG(L && L->ok && L->kind == EVT_LK_ROW, "%s", L ? L->reason : "");
    if (L) CHECK(L->rspec.in_dtype == EVT_BF16 && L->rin[0] == evt_graph_find(lg.g, k ? "y" : "x"));
    for (int i = 0; L && i < L->rspec.nnodes; i++) CHECK(L->vtensor[i] != c); /* (the f32 copy is no store) */
  }
  int tensors = 0;
  CHECK(check_lowered_against_interp(lg.g, "widening cast", &tensors) >= 2 && tensors >= 2);
  lowered_free(&lg);
  /* two-input nuclei: the cast fuses into one input's load, the other keeps its dtype */
  if (lower_text("graph t {\n  %dy: bf16[16,64] = input()\n  %x: f32[16,64] = input()\n  %w: f32[64] = param()\n"
                 "  %dyf = cast(%dy, dtype=f32)\n  %dx = layer_norm_backward_input(%dyf, %x, %w)\n  %r = relu(%dx)\n"
                 "  %p: f32[16,64] = input()\n  %g: bf16[16,64] = input()\n  %gf = cast(%g, dtype=f32)\n"
                 "  %d = softmax_backward(%gf, %p, dim=1)\n  output %r\n  output %d\n}\n", &lg)) {
    for (int k = 0; k < 2; k++) {
      const char *cast = k ? "gf" : "dyf", *nuc = k ? "d" : "dx";
      int c = evt_graph_find(lg.g, cast), nu = evt_graph_find(lg.g, nuc);
      CHECK_MSG(lg.part.group[c] == lg.part.group[nu], "%s not in %s's group", cast, nuc);
      const evt_lowered *L = group_of(&lg, nuc);
      CHECK_MSG(L && L->ok, "%s", L ? L->reason : "");
      if (L) CHECK(L->rspec.in_dtype == EVT_BF16 && L->rspec.in1_mixed && L->rspec.in1_dtype == EVT_F32);
      char text[2048];
      if (L) evt_rspec_text(&L->rspec, text, sizeof text);
      CHECK_MSG(!L || strstr(text, "in:bf16,f32"), "%s", text);
    }
    tensors = 0;
    CHECK(check_lowered_against_interp(lg.g, "mixed inputs", &tensors) >= 2 && tensors >= 2);
    lowered_free(&lg);
  }
  /* read elsewhere / an output: the cast is not a prologue */
  const char *other[] = {
      "graph t {\n  %x: bf16[16,64] = input()\n  %xf = cast(%x, dtype=f32)\n  %p = softmax(%xf, dim=1)\n"
      "  %q = mul(%xf, %p)\n  output %q\n}\n",
      "graph t {\n  %x: bf16[16,64] = input()\n  %xf = cast(%x, dtype=f32)\n  %p = softmax(%xf, dim=1)\n"
      "  output %p\n  output %xf\n}\n"};
  for (int t = 0; t < 2; t++) {
    if (!lower_text(other[t], &lg)) continue;
    int c = evt_graph_find(lg.g, "xf");
    int nu = evt_graph_find(lg.g, "p");
    const evt_lowered *L = group_of(&lg, "p");
    CHECK_MSG(L && L->rspec.in_dtype == EVT_F32, "case %d: %s", t, L ? evt_dtype_name(L->rspec.in_dtype) : "?");
    CHECK_MSG(lg.part.group[c] != lg.part.group[nu], "case %d: the cast joined the nucleus", t);
    lowered_free(&lg);
  }
}

/* one_hot is a row-kernel visitor only: the partitioner keeps it out of GEMM groups (the lowering refused such a
 * group, which then ran node by node or had to be split and partitioned again), and every group lowers. */
TEST(partition_keeps_one_hot_out_of_gemm_groups) {
  lowered_graph lg;
  if (!lower_text("graph t {\n  %x: bf16[16,32] = input()\n  %w: bf16[32,64] = param()\n  %m = mm(%x, %w)\n"
                  "  %t: i64[16] = input(init=randint, lo=0, hi=64)\n  %oh = one_hot(%t, num_classes=64)\n"
                  "  %mf = cast(%m, dtype=f32)\n  %p = mul(%oh, %mf)\n  %s = sum(%p, dims=[1])\n  output %m\n  output %s\n}\n", &lg))
    return;
  int m = evt_graph_find(lg.g, "m"), oh = evt_graph_find(lg.g, "oh");
  CHECK(lg.part.group[m] >= 0 && lg.part.group[oh] >= 0 && lg.part.group[m] != lg.part.group[oh]);
  for (int i = 0; i < lg.low.n; i++) CHECK_MSG(lg.low.k[i].ok, "group %d: %s", i, lg.low.k[i].reason);
  lowered_free(&lg);
}

/* An attention node is a singleton group; its reason says what runs it on CUDA (cuDNN for bf16/f16). */
TEST(lower_attention_singleton_names_its_cuda_path) {
  const char *dt[2] = {"bf16", "f32"};
  for (int i = 0; i < 2; i++) {
    char text[400];
    snprintf(text, sizeof text,
             "graph t {\n  %%q: %s[2,4,16,64] = input()\n  %%o = sdpa(%%q, %%q, %%q, causal=1)\n  output %%o\n}\n", dt[i]);
    lowered_graph lg;
    if (!lower_text(text, &lg)) continue;
    const evt_lowered *L = group_of(&lg, "o");
    if (L) {
      CHECK(L->kind == EVT_LK_UNFUSED);
      CHECK_MSG(strstr(L->reason, i == 0 ? "cuDNN's fused flash attention" : "the reference kernel; cuDNN takes bf16/f16"),
                "%s", L->reason);
    }
    lowered_free(&lg);
  }
}

/* fp8 (kspec.h "FP8 operands"): the recipe's cast, K-major GEMM and rescale lower; other layouts, an fp8 result, a
 * cast to fp8 read inside its kernel and sm_8x targets are refused by node with the reason */
static const char *fp8_graph(const char *w, const char *mm) {
  static char text[1024];
  snprintf(text, sizeof text,
           "graph t {\n  %%x: bf16[64,128] = input()\n  %%s: f32[] = input()\n  %%inv: f32[] = input()\n%s"
           "  %%x32 = cast(%%x, dtype=f32)\n  %%xs = mul(%%x32, %%s)\n  %%xq = cast(%%xs, dtype=f8e4m3)\n%s"
           "  %%y = mul(%%acc, %%inv)\n  %%yb = cast(%%y, dtype=bf16)\n  output %%yb\n}\n",
           w, mm);
  return text;
}

TEST(lower_fp8_gemm_nt_lowers) {
  lowered_graph lg;
  if (!lower_text(fp8_graph("  %wt: f8e5m2[32,128] = input()\n  %w = permute(%wt, dims=[1,0])\n",
                            "  %acc = mm(%xq, %w, out_dtype=f32)\n"),
                  &lg))
    return;
  const evt_lowered *L = group_of(&lg, "acc"), *Q = group_of(&lg, "xq");
  if (!L || !Q) return;
  CHECK_MSG(L->ok && L->kind == EVT_LK_GEMM_EVT, "%s", L->reason);
  const evt_kspec *s = &L->spec;
  CHECK(s->layout == EVT_LAYOUT_NT && s->ab_dtype == EVT_F8E4M3 && s->b_mixed && s->b_dtype == EVT_F8E5M2);
  CHECK(s->d_dtype == EVT_BF16 && s->cfg.tile_k == 128 && evt_kspec_b_dtype(s) == EVT_F8E5M2);
  CHECK(s->nnodes == 3 && s->nodes[1].op == EVT_V_SCALAR_LOAD && s->nodes[2].op == EVT_V_MUL && s->d_node == 2);
  CHECK_MSG(Q->ok && Q->kind == EVT_LK_POINTWISE, "%s", Q->reason);
  int st = -1;
  for (int i = 0; i < Q->rspec.nnodes; i++)
    if (Q->rspec.nodes[i].op == EVT_V_AUX_STORE) st = i;
  CHECK(st >= 0 && Q->rspec.nodes[st].dtype == EVT_F8E4M3);
  char text[2048];
  evt_kspec_text(s, text, sizeof text);
  CHECK_MSG(!strncmp(text, "gemm NT f8e4m3xf8e5m2->bf16 tile 128x128x128", 44), "%s", text);
  evt_kspec bad = *s;
  bad.cfg.tile_k = 64;
  char err[256];
  CHECK(evt_kspec_check(&bad, err, sizeof err) == EVT_ERR_UNSUPPORTED && strstr(err, "fp8"));
  evt_lower_retarget(lg.g, lg.part.group, &lg.low, 80);
  CHECK_MSG(!L->ok && strstr(L->reason, "%acc (mm): sm_80: fp8 operands (no FP8 tensor cores"), "%s", L->reason);
  CHECK(Q->ok); /* row kernels keep their fp8 stores on sm_80 */
  lowered_free(&lg);
}

TEST(lower_fp8_refusals_name_the_node) {
  lowered_graph lg;
  if (lower_text(fp8_graph("  %w: f8e4m3[128,32] = input()\n", "  %acc = mm(%xq, %w, out_dtype=f32)\n"), &lg)) {
    const evt_lowered *L = group_of(&lg, "acc");
    CHECK(L && !L->ok && strstr(L->reason, "%acc (mm): fp8 operands in layout NN") &&
          strstr(L->reason, "transposed copy of B"));
    lowered_free(&lg);
  }
  if (lower_text(fp8_graph("  %wt: f8e4m3[32,128] = input()\n  %w = permute(%wt, dims=[1,0])\n",
                           "  %acc8 = mm(%xq, %w)\n  %acc = cast(%acc8, dtype=f32)\n"),
                 &lg)) {
    const evt_lowered *L = group_of(&lg, "acc8");
    CHECK(L && !L->ok && strstr(L->reason, "%acc8 (mm): fp8 operands with a f8e4m3 result"));
    lowered_free(&lg);
  }
  if (lower_text("graph t {\n  %x: f32[64,128] = input()\n  %q = cast(%x, dtype=f8e4m3)\n"
                 "  %y = cast(%q, dtype=f32)\n  %z = mul(%y, %x)\n  output %z\n}\n",
                 &lg)) {
    const evt_lowered *L = group_of(&lg, "q");
    CHECK(L && !L->ok && strstr(L->reason, "%q (cast): a cast to f8e4m3 read inside the kernel"));
    lowered_free(&lg);
  }
}
