/* Kernel specs, DAG → tree, the CUTLASS emitter, the CPU reference and the JIT driver (no GPU needed;
 * the JIT tests use a fake nvcc script, so they also run where no CUDA is installed). */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "codegen/examples.h"
#include "codegen/kspec.h"
#include "runtime/jit/jit.h"
#include "test.h"

static const evt_tile_config cfg128 = {128, 128, 64, 1, 1, EVT_SCHED_COOPERATIVE};

TEST(kspec_add_rejects_bad_inputs) {
  evt_kspec s;
  evt_kspec_init(&s, EVT_LAYOUT_NN, EVT_BF16, EVT_BF16, cfg128);
  int acc = evt_kspec_add(&s, EVT_V_ACC, -1, -1, EVT_F32, NULL);
  CHECK(acc == 0);
  CHECK(evt_kspec_add(&s, EVT_V_ADD, acc, 5, EVT_F32, NULL) == -1);   /* forward reference */
  CHECK(evt_kspec_add(&s, EVT_V_RELU, acc, acc, EVT_F32, NULL) == -1); /* unary with two inputs */
  CHECK(evt_kspec_add(&s, EVT_V_ADD, acc, -1, EVT_F32, NULL) == -1);  /* binary with one */
  CHECK(evt_kspec_add(&s, EVT_V_RELU, acc, -1, EVT_F32, NULL) == 1);
}

TEST(kspec_check_messages) {
  evt_kspec s;
  char err[256];
  evt_kspec_init(&s, EVT_LAYOUT_NN, EVT_BF16, EVT_BF16, cfg128);
  evt_kspec_add(&s, EVT_V_ACC, -1, -1, EVT_F32, NULL);
  CHECK(evt_kspec_check(&s, err, sizeof err) == EVT_ERR_INVALID && strstr(err, "D is not set"));
  s.d_node = 0;
  CHECK(evt_kspec_check(&s, err, sizeof err) == EVT_OK);
  evt_kspec_add(&s, EVT_V_ACC, -1, -1, EVT_F32, NULL);
  CHECK(evt_kspec_check(&s, err, sizeof err) == EVT_ERR_INVALID && strstr(err, "exactly once"));
  s.nnodes = 1;
  s.cfg.tile_m = 64;
  CHECK(evt_kspec_check(&s, err, sizeof err) == EVT_ERR_UNSUPPORTED && strstr(err, "cooperative"));
  s.cfg = cfg128;
  s.ab_dtype = EVT_I32;
  CHECK(evt_kspec_check(&s, err, sizeof err) == EVT_ERR_UNSUPPORTED && strstr(err, "bf16, f16, fp8 or f32"));
  s.ab_dtype = EVT_F32; /* TF32: K-major operands (layout NT) and a 32-deep K tile */
  CHECK(evt_kspec_check(&s, err, sizeof err) == EVT_ERR_UNSUPPORTED && strstr(err, "layout NN") && strstr(err, "K-major"));
  s.layout = EVT_LAYOUT_NT;
  CHECK(evt_kspec_check(&s, err, sizeof err) == EVT_ERR_UNSUPPORTED && strstr(err, "tile_k 64 with f32 (TF32)"));
  s.cfg.tile_k = 32;
  CHECK(evt_kspec_check(&s, err, sizeof err) == EVT_OK);
  s.arch = 80;
  CHECK(evt_kspec_check(&s, err, sizeof err) == EVT_ERR_UNSUPPORTED && strstr(err, "sm_80"));
  s.arch = 0, s.cfg = cfg128, s.layout = EVT_LAYOUT_NN, s.ab_dtype = EVT_BF16;
  int b1 = evt_kspec_add(&s, EVT_V_ROW_BCAST, -1, -1, EVT_BF16, "bias");
  int b2 = evt_kspec_add(&s, EVT_V_COL_BCAST, -1, -1, EVT_BF16, "bias");
  s.d_node = evt_kspec_add(&s, EVT_V_ADD, b1, b2, EVT_F32, NULL);
  CHECK(evt_kspec_check(&s, err, sizeof err) == EVT_ERR_INVALID && strstr(err, "used twice"));
}

TEST(kspec_hash_depends_on_config_and_is_stable) {
  evt_kspec a, b;
  CHECK(evt_kspec_example(&a, "bias_gelu_aux", cfg128) == EVT_OK);
  CHECK(evt_kspec_example(&b, "bias_gelu_aux", cfg128) == EVT_OK);
  CHECK(evt_kspec_hash(&a) == evt_kspec_hash(&b));
  b.cfg.schedule = EVT_SCHED_PINGPONG;
  CHECK(evt_kspec_hash(&a) != evt_kspec_hash(&b));
  b = a;
  b.layout = EVT_LAYOUT_TN;
  CHECK(evt_kspec_hash(&a) != evt_kspec_hash(&b));
  char name[40];
  evt_kspec_kernel_name(&a, name);
  CHECK(strlen(name) == strlen("evt_kernel_") + 16 && !strncmp(name, "evt_kernel_", 11));
  CHECK(evt_kspec_example(&a, "no_such_epilogue", cfg128) == EVT_ERR_INVALID);
}

TEST(vtree_threads_side_stores) {
  evt_kspec s;
  evt_vtree t;
  char err[256];
  CHECK(evt_kspec_example(&s, "bias_gelu_aux", cfg128) == EVT_OK);
  CHECK(evt_vtree_build(&s, &t, err, sizeof err) == EVT_OK);
  CHECK(t.topo_root == -1);
  CHECK(t.spec.nodes[4].in[0] == 3); /* gelu now reads the aux store, which passes z through */
  CHECK(t.spec.d_node == 4);
  for (int v = 0; v < 5; v++) CHECK(t.live[v] && t.nusers[v] <= 1);

  CHECK(evt_kspec_example(&s, "bias_relu_dbias", cfg128) == EVT_OK);
  CHECK(evt_vtree_build(&s, &t, err, sizeof err) == EVT_OK);
  CHECK(t.spec.d_node == 4); /* D = row_sum(y), which passes y through */
  CHECK(t.topo_root == -1);

  /* two stores of one value chain up */
  evt_kspec_init(&s, EVT_LAYOUT_NN, EVT_BF16, EVT_BF16, cfg128);
  int acc = evt_kspec_add(&s, EVT_V_ACC, -1, -1, EVT_F32, NULL);
  int st1 = evt_kspec_add(&s, EVT_V_AUX_STORE, acc, -1, EVT_BF16, "s1");
  int st2 = evt_kspec_add(&s, EVT_V_COL_SUM, acc, -1, EVT_F32, "s2");
  s.d_node = evt_kspec_add(&s, EVT_V_RELU, acc, -1, EVT_F32, NULL);
  CHECK(evt_vtree_build(&s, &t, err, sizeof err) == EVT_OK);
  CHECK(t.spec.nodes[st2].in[0] == acc && t.spec.nodes[st1].in[0] == st2 && t.spec.nodes[s.d_node].in[0] == st1);
  CHECK(t.topo_root == -1);
}

/* A store whose value D does not depend on is tied into D's tree by keep(D, store); with no room left for
 * that node the spec is refused. */
TEST(vtree_ties_detached_store_with_keep) {
  evt_kspec s;
  evt_vtree t;
  char err[256];
  evt_kspec_init(&s, EVT_LAYOUT_NN, EVT_BF16, EVT_BF16, cfg128);
  int acc = evt_kspec_add(&s, EVT_V_ACC, -1, -1, EVT_F32, NULL);
  int r = evt_kspec_add(&s, EVT_V_RELU, acc, -1, EVT_F32, NULL);
  int st = evt_kspec_add(&s, EVT_V_AUX_STORE, r, -1, EVT_BF16, "aux1");
  int sg = evt_kspec_add(&s, EVT_V_SIGMOID, acc, -1, EVT_F32, NULL);
  s.d_node = sg;
  CHECK_MSG(evt_vtree_build(&s, &t, err, sizeof err) == EVT_OK, "%s", err);
  int k = t.spec.d_node;
  CHECK(k == s.nnodes && t.spec.nnodes == s.nnodes + 1);
  CHECK(t.spec.nodes[k].op == EVT_V_KEEP && t.spec.nodes[k].in[0] == sg && t.spec.nodes[k].in[1] == st);
  CHECK(t.live[st] && t.live[r] && t.topo_root >= 0); /* acc is shared by both branches */
  char *src = evt_emit_cutlass(&s, err, sizeof err);
  CHECK_MSG(src && strstr(src, "evt_ops::Keep"), "%s", err);
  free(src);
  while (s.nnodes < EVT_KSPEC_MAX_NODES) evt_kspec_add(&s, EVT_V_RELU, acc, -1, EVT_F32, NULL);
  CHECK(evt_vtree_build(&s, &t, err, sizeof err) == EVT_ERR_UNSUPPORTED);
  CHECK(strstr(err, "aux1") != NULL && strstr(err, "does not depend") != NULL);
}

TEST(vtree_shared_value_becomes_topological_region) {
  evt_kspec s;
  evt_vtree t;
  char err[256];
  CHECK(evt_kspec_example(&s, "bias_silu", cfg128) == EVT_OK); /* 0 acc, 1 bias, 2 z, 3 sigmoid, 4 mul */
  CHECK(evt_vtree_build(&s, &t, err, sizeof err) == EVT_OK);
  CHECK(t.topo_root == 4);
  CHECK(!t.in_region[0] && !t.in_region[1] && t.in_region[2] && t.in_region[3] && t.in_region[4]);

  /* two shared values whose regions overlap end in one region at the common post-dominator */
  evt_kspec_init(&s, EVT_LAYOUT_NN, EVT_BF16, EVT_F32, cfg128);
  int acc = evt_kspec_add(&s, EVT_V_ACC, -1, -1, EVT_F32, NULL);
  int x = evt_kspec_add(&s, EVT_V_AUX_LOAD, -1, -1, EVT_BF16, "x");
  int a = evt_kspec_add(&s, EVT_V_MUL, acc, acc, EVT_F32, NULL);
  int b = evt_kspec_add(&s, EVT_V_ADD, a, x, EVT_F32, NULL);
  int c = evt_kspec_add(&s, EVT_V_MUL, x, b, EVT_F32, NULL);
  int d = evt_kspec_add(&s, EVT_V_SUB, c, a, EVT_F32, NULL);
  s.d_node = evt_kspec_add(&s, EVT_V_RELU, d, -1, EVT_F32, NULL);
  CHECK(evt_vtree_build(&s, &t, err, sizeof err) == EVT_OK);
  CHECK(t.topo_root == d);
  CHECK(t.in_region[acc] && t.in_region[x] && t.in_region[a] && t.in_region[b] && t.in_region[c] && t.in_region[d]);
  CHECK(!t.in_region[s.d_node]);
}

static int count_char(const char *s, char c) {
  int n = 0;
  for (; *s; s++) n += *s == c;
  return n;
}

TEST(emit_cutlass_structure) {
  char err[256];
  for (int i = 0; evt_kspec_example_names[i]; i++) {
    evt_kspec s;
    CHECK(evt_kspec_example(&s, evt_kspec_example_names[i], cfg128) == EVT_OK);
    char *src = evt_emit_cutlass(&s, err, sizeof err);
    CHECK_MSG(src != NULL, "%s: %s", evt_kspec_example_names[i], err);
    if (!src) continue;
    char *again = evt_emit_cutlass(&s, err, sizeof err);
    CHECK(again && !strcmp(src, again)); /* deterministic */
    free(again);
    char name[40], want[128];
    evt_kspec_kernel_name(&s, name);
    snprintf(want, sizeof want, "extern \"C\" int %s(const evt_launch_args *a)", name);
    CHECK(strstr(src, want) != NULL);
    CHECK(strstr(src, "// GENERATED by evt") == src);
    CHECK(strstr(src, "GemmUniversalAdapter<GemmKernel>") && strstr(src, "can_implement(args)") &&
          strstr(src, "gemm.initialize(args, g_workspace, stream)") && strstr(src, "gemm.run(stream, nullptr, EVT_GEMM_PDL != 0 && evt_pdl_enabled())"));
    /* a programmatic dependent launch (CUTLASS's producers wait in griddepcontrol.wait), guarded at compile time */
    CHECK(strstr(src, "#define EVT_GEMM_PDL 1 ") && strstr(src, "#define CUTLASS_ENABLE_GDC_FOR_SM90 1") &&
          strstr(src, "!defined(CUTLASS_GDC_ENABLED)\n#error"));
    CHECK(count_char(src, '{') == count_char(src, '}'));
    CHECK(count_char(src, '(') == count_char(src, ')'));
    free(src);
  }
  evt_kspec s;
  evt_kspec_example(&s, "bias_silu", cfg128);
  char *src = evt_emit_cutlass(&s, err, sizeof err);
  CHECK(src && strstr(src, "Sm90TopologicalVisitor<float,\n    cute::tuple<cute::seq<>, cute::seq<>, cute::seq<0, 1>, "
                           "cute::seq<2>, cute::seq<2, 3>>"));
  free(src);
  evt_kspec_example(&s, "bias_relu_dbias", cfg128);
  src = evt_emit_cutlass(&s, err, sizeof err);
  /* an atomic row sum runs on the project's node; relu(bias) is not 0 in rows past M: those are skipped */
  CHECK(src && strstr(src, "using N4 = evt_nodes::RowSum<TileShape, true>;"));
  CHECK(src && strstr(src, "#include \"evt_visitor_nodes.h\""));
  CHECK(src && strstr(src, "{a->ptrs[4]}  // %4 row_sum dbias"));
  CHECK(src && !strstr(src, "Sm90RowReduction"));
  free(src);
  /* gelu'(x)·acc is 0 there (acc and the TMA-loaded x are): no per-row check */
  evt_kspec_example(&s, "gelu_bwd_dbias", cfg128);
  src = evt_emit_cutlass(&s, err, sizeof err);
  CHECK(src && strstr(src, "using N3 = evt_nodes::RowSum<TileShape, false>;"));
  free(src);
  /* the bounds rule per input: 0 past the edges only when built from the accumulator and TMA loads by
   * computes with f(0, ..., 0) = 0 */
  {
    struct {
      evt_vop op;
      int with_bias; /* second operand: a row broadcast (not 0 past M) instead of the aux load */
      const char *want;
    } cases[] = {{EVT_V_MUL, 0, "RowSum<TileShape, false>"}, {EVT_V_MUL, 1, "RowSum<TileShape, true>"},
                 {EVT_V_DIV, 0, "RowSum<TileShape, true>"},  {EVT_V_MAXIMUM, 0, "RowSum<TileShape, false>"},
                 {EVT_V_GT, 0, "RowSum<TileShape, true>"},   {EVT_V_SUB, 1, "RowSum<TileShape, true>"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
      evt_kspec_init(&s, EVT_LAYOUT_NN, EVT_BF16, EVT_BF16, cfg128);
      int a = evt_kspec_add(&s, EVT_V_ACC, -1, -1, EVT_F32, "acc");
      int x = evt_kspec_add(&s, cases[i].with_bias ? EVT_V_ROW_BCAST : EVT_V_AUX_LOAD, -1, -1, EVT_BF16, "x");
      int v = evt_kspec_add(&s, cases[i].op, a, x, EVT_F32, NULL);
      evt_kspec_add(&s, EVT_V_ROW_SUM, v, -1, EVT_F32, "sum");
      s.d_node = v;
      src = evt_emit_cutlass(&s, err, sizeof err);
      CHECK_MSG(src && strstr(src, cases[i].want), "case %zu: %s", i, src ? "wrong bounds rule" : err);
      free(src);
    }
    /* where(c, acc, x): 0 when both branches are, whatever c is */
    evt_kspec_init(&s, EVT_LAYOUT_NN, EVT_BF16, EVT_BF16, cfg128);
    int a = evt_kspec_add(&s, EVT_V_ACC, -1, -1, EVT_F32, "acc");
    int x = evt_kspec_add(&s, EVT_V_AUX_LOAD, -1, -1, EVT_BF16, "x");
    int c = evt_kspec_add(&s, EVT_V_GT, x, evt_kspec_scalar(&s, 0.5), EVT_F32, NULL);
    int w = evt_kspec_add3(&s, EVT_V_WHERE, c, a, x, EVT_F32, NULL);
    evt_kspec_add(&s, EVT_V_ROW_SUM, w, -1, EVT_F32, "sum");
    s.d_node = w;
    src = evt_emit_cutlass(&s, err, sizeof err);
    CHECK_MSG(src && strstr(src, "RowSum<TileShape, false>"), "%s", src ? "where: wrong bounds rule" : err);
    free(src);
  }
  /* the deterministic workspace reduction keeps CUTLASS's node, with the same bounds rule */
  evt_tile_config ws = cfg128;
  ws.reduction = EVT_RED_WORKSPACE;
  evt_kspec_example(&s, "bias_relu_dbias", ws);
  src = evt_emit_cutlass(&s, err, sizeof err);
  CHECK(src && strstr(src, "Sm90RowReduction<cutlass::plus, cutlass::plus, cutlass::plus, 0, TileShape, float, float, RN, "
                           "Stride<_0, _1, _0>, 4, true, true, true>"));
  CHECK(src && strstr(src, "{a->ptrs[4], 0.0f, {}}  // %4 row_sum dbias") && !strstr(src, "evt_visitor_nodes.h"));
  free(src);
  evt_kspec_example(&s, "gelu_bwd_dbias", ws);
  src = evt_emit_cutlass(&s, err, sizeof err);
  CHECK(src && strstr(src, "Stride<_0, _1, _0>, 4, true, true, false>"));
  free(src);
  evt_kspec_example(&s, "gelu_bwd", (evt_tile_config){64, 256, 64, 2, 1, EVT_SCHED_PINGPONG, 0, EVT_RED_ATOMIC});
  src = evt_emit_cutlass(&s, err, sizeof err);
  CHECK(src && strstr(src, "Sm90AuxLoad<Aux1Desc::Stages") && strstr(src, "evt_ops::GeluErfGrad, ElementD") &&
        strstr(src, "Shape<_64, _256, _64>") && strstr(src, "Shape<_2, _1, _1>") &&
        strstr(src, "KernelTmaWarpSpecializedPingpong"));
  free(src);
  s.layout = EVT_LAYOUT_TN;
  src = evt_emit_cutlass(&s, err, sizeof err);
  CHECK(src && strstr(src, "using LayoutA = cutlass::layout::ColumnMajor") &&
        strstr(src, "using LayoutB = cutlass::layout::RowMajor"));
  free(src);
  s.nnodes = 0;
  CHECK(evt_emit_cutlass(&s, err, sizeof err) == NULL && strstr(err, "empty"));
}

static double gelu_ref(double x) { return evt_vop_apply(EVT_V_GELU_ERF, x, 0); }
static double gelu_tanh_ref(double x) { return evt_vop_apply(EVT_V_GELU_TANH, x, 0); }

TEST(vop_gelu_gradients_match_finite_differences) {
  for (double x = -4; x <= 4; x += 0.37) {
    double h = 1e-5;
    CHECK_NEAR(evt_vop_apply(EVT_V_GELU_ERF_GRAD, 1.5, x), 1.5 * (gelu_ref(x + h) - gelu_ref(x - h)) / (2 * h), 1e-6);
    CHECK_NEAR(evt_vop_apply(EVT_V_GELU_TANH_GRAD, -0.5, x),
               -0.5 * (gelu_tanh_ref(x + h) - gelu_tanh_ref(x - h)) / (2 * h), 1e-6);
  }
  CHECK(evt_vop_apply(EVT_V_RELU_GRAD, 2.0, -1.0) == 0.0 && evt_vop_apply(EVT_V_RELU_GRAD, 2.0, 0.5) == 2.0);
  CHECK(isnan(evt_vop_apply(EVT_V_RELU, NAN, 0)));
}

TEST(reference_bias_relu_dbias_small) {
  evt_kspec s;
  CHECK(evt_kspec_example(&s, "bias_relu_dbias", cfg128) == EVT_OK);
  s.layout = EVT_LAYOUT_NT; /* B stored N×K */
  /* M=2, N=3, K=2: A = [[1,2],[3,-4]], B^T rows = [[1,0],[0,1],[1,1]] → acc = [[1,2,3],[3,-4,-1]] */
  double a[] = {1, 2, 3, -4}, b[] = {1, 0, 0, 1, 1, 1};
  double bias[] = {0.5, 1, -3.5}, dbias[3], d[6];
  double *tens[EVT_KSPEC_MAX_NODES] = {0};
  tens[1] = bias;
  tens[4] = dbias;
  evt_kspec_reference(&s, 2, 3, 2, a, b, tens, d);
  double want[] = {1.5, 3, 0, 3.5, 0, 0};
  for (int i = 0; i < 6; i++) CHECK_NEAR(d[i], want[i], 0);
  CHECK_NEAR(dbias[0], 5, 0);
  CHECK_NEAR(dbias[1], 3, 0);
  CHECK_NEAR(dbias[2], 0, 0);
}

TEST(reference_aux_store_rounds_but_passes_through) {
  evt_kspec s;
  CHECK(evt_kspec_example(&s, "bias_gelu_aux", cfg128) == EVT_OK);
  s.d_dtype = EVT_F32;
  double a[] = {1.0}, b[] = {1.0 / 3.0}, bias[] = {0}, z[1], d[1];
  double *tens[EVT_KSPEC_MAX_NODES] = {0};
  tens[1] = bias;
  tens[3] = z;
  evt_kspec_reference(&s, 1, 1, 1, a, b, tens, d);
  CHECK(z[0] == evt_round_to_dtype(1.0 / 3.0, EVT_BF16) && z[0] != (double)(float)(1.0 / 3.0));
  CHECK_NEAR(d[0], evt_round_to_dtype(gelu_ref((double)(float)(1.0 / 3.0)), EVT_F32), 1e-7);
}

/* ---- JIT driver, with a fake nvcc ------------------------------------------------------------------ */
static char jit_dir[256];

static void jit_setup(void) {
  snprintf(jit_dir, sizeof jit_dir, "/tmp/evt-jit-test-%ld", (long)getpid());
  char cmd[2048];
  snprintf(cmd, sizeof cmd,
           "rm -rf %s && mkdir -p %s/cutlass/include/cutlass %s/cutlass/tools/util/include %s/cache && "
           "touch %s/cutlass/include/cutlass/cutlass.h",
           jit_dir, jit_dir, jit_dir, jit_dir, jit_dir);
  CHECK(system(cmd) == 0);
  /* fake nvcc: --version succeeds; a source containing FAIL fails with an error line; else the output
   * file gets the source's bytes; every compile appends a line to calls.txt */
  char path[300];
  snprintf(path, sizeof path, "%s/nvcc", jit_dir);
  FILE *f = fopen(path, "w");
  CHECK(f != NULL);
  if (!f) return;
  fprintf(f,
          "#!/bin/sh\n"
          "[ \"$1\" = --version ] && exit 0\n"
          "out=''; src=''\n"
          "while [ $# -gt 0 ]; do case \"$1\" in -o) out=$2; shift;; *.cu) src=$1;; esac; shift; done\n"
          "echo \"$src\" >> %s/calls.txt\n"
          "if grep -q FAIL \"$src\"; then echo \"$src(3): error: identifier FAIL is undefined\"; exit 2; fi\n"
          "cp \"$src\" \"$out\"\n",
          jit_dir);
  fclose(f);
  chmod(path, 0755);
}

static int count_lines(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  int n = 0, c;
  while ((c = fgetc(f)) != EOF) n += c == '\n';
  fclose(f);
  return n;
}

TEST(jit_parallel_cache_and_errors) {
  jit_setup();
  char nvcc[300], cutlass[300], cache[300], calls[300], msg[2048];
  snprintf(nvcc, sizeof nvcc, "%s/nvcc", jit_dir);
  snprintf(cutlass, sizeof cutlass, "%s/cutlass", jit_dir);
  snprintf(cache, sizeof cache, "%s/cache", jit_dir);
  snprintf(calls, sizeof calls, "%s/calls.txt", jit_dir);
  evt_jit_options o = {.nvcc = nvcc, .cache_dir = cache, .cutlass_path = cutlass, .kernels_dir = "kernels",
                       .jobs = 3, .quiet = 1};
  evt_jit_job jobs[4];
  memset(jobs, 0, sizeof jobs);
  const char *names[] = {"evt_kernel_a", "evt_kernel_b", "evt_kernel_c", "evt_kernel_d"};
  const char *srcs[] = {"int a;\n", "int b;\n", "int c;\n", "int d;\n"};
  for (int i = 0; i < 4; i++) jobs[i].name = names[i], jobs[i].source = srcs[i];
  CHECK(evt_jit_compile(jobs, 4, &o, msg, sizeof msg) == EVT_OK);
  for (int i = 0; i < 4; i++) {
    CHECK(jobs[i].ok && !jobs[i].cached && strstr(jobs[i].so_path, names[i]));
    FILE *f = fopen(jobs[i].so_path, "r");
    char buf[16] = "";
    CHECK(f && fgets(buf, sizeof buf, f) && !strcmp(buf, srcs[i]));
    if (f) fclose(f);
  }
  CHECK(count_lines(calls) == 4);
  for (int i = 0; i < 4; i++) { /* the path a benchmark looks up without compiling */
    char path[1024];
    CHECK(evt_jit_cache_path(&o, names[i], srcs[i], path, sizeof path) == EVT_OK && !strcmp(path, jobs[i].so_path));
  }
  /* same sources and flags: all cached, nvcc not run again */
  CHECK(evt_jit_compile(jobs, 4, &o, msg, sizeof msg) == EVT_OK);
  for (int i = 0; i < 4; i++) CHECK(jobs[i].ok && jobs[i].cached);
  CHECK(count_lines(calls) == 4);
  /* other flags: a different cache entry */
  o.extra_flags = "-lineinfo";
  CHECK(evt_jit_compile(jobs, 1, &o, msg, sizeof msg) == EVT_OK && !jobs[0].cached);
  CHECK(count_lines(calls) == 5);
  /* a changed header of the kernels directory that a source includes (directly or through another header):
   * a different cache entry for that source; a source that does not include it keeps its entry */
  char kdir[300], hdr[320], hdr2[320];
  snprintf(kdir, sizeof kdir, "%s/kernels", jit_dir);
  snprintf(hdr, sizeof hdr, "%s/evt_test.h", kdir);
  snprintf(hdr2, sizeof hdr2, "%s/evt_test_inner.h", kdir);
  CHECK(mkdir(kdir, 0755) == 0);
  FILE *hf = fopen(hdr, "w");
  CHECK(hf != NULL);
  if (hf) fputs("// v1\n#include \"evt_test_inner.h\"\n", hf), fclose(hf);
  hf = fopen(hdr2, "w");
  if (hf) fputs("// inner v1\n", hf), fclose(hf);
  o.kernels_dir = kdir;
  jobs[0].source = "#include \"evt_test.h\"\nint a;\n";
  CHECK(evt_jit_compile(jobs, 2, &o, msg, sizeof msg) == EVT_OK && !jobs[0].cached && !jobs[1].cached);
  CHECK(evt_jit_compile(jobs, 2, &o, msg, sizeof msg) == EVT_OK && jobs[0].cached && jobs[1].cached);
  hf = fopen(hdr, "w");
  if (hf) fputs("// v2\n#include \"evt_test_inner.h\"\n", hf), fclose(hf);
  CHECK(evt_jit_compile(jobs, 2, &o, msg, sizeof msg) == EVT_OK && !jobs[0].cached && jobs[1].cached);
  hf = fopen(hdr2, "w");
  if (hf) fputs("// inner v2\n", hf), fclose(hf);
  CHECK(evt_jit_compile(jobs, 2, &o, msg, sizeof msg) == EVT_OK && !jobs[0].cached && jobs[1].cached);
  CHECK(count_lines(calls) == 9);
  jobs[0].source = srcs[0];
  o.kernels_dir = "kernels";
  /* a failing kernel names itself and quotes nvcc's error; the others still compile */
  jobs[1].source = "FAIL here\n";
  jobs[2].source = "int c2;\n";
  CHECK(evt_jit_compile(jobs, 3, &o, msg, sizeof msg) == EVT_ERR_INVALID);
  CHECK(!jobs[1].ok && strstr(jobs[1].error, "kernel evt_kernel_b failed to compile (nvcc exit 2)"));
  CHECK(strstr(jobs[1].error, "identifier FAIL is undefined") != NULL);
  CHECK(strstr(msg, "evt_kernel_b") != NULL);
  CHECK(jobs[0].ok && jobs[2].ok);
  /* no compiler, no CUTLASS */
  o.nvcc = "/nonexistent/nvcc";
  CHECK(evt_jit_compile(jobs, 1, &o, msg, sizeof msg) == EVT_ERR_UNSUPPORTED && strstr(msg, "cannot run nvcc"));
  o.nvcc = nvcc;
  o.cutlass_path = "/nonexistent";
  CHECK(evt_jit_compile(jobs, 1, &o, msg, sizeof msg) == EVT_ERR_UNSUPPORTED && strstr(msg, "CUTLASS not found"));
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", jit_dir);
  CHECK(system(cmd) == 0);
}

/* CI check of generated CUDA C++ (no GPU there): run nvcc's front end (-cuda: parsing and every template
 * instantiation of host and device code, no code generation) over one GEMM group's kernel — bias + GELU +
 * aux store, what an MLP forward layer fuses. Catches everything the emitter can get wrong in C++ short of
 * ptxas resource limits (those are exercised on a GPU by tests/gpu/run.sh). Cached by source hash like any
 * JIT result, so it compiles once per emitter change. Needs nvcc and CUTLASS 4.2 headers
 * (CUTLASS_PATH, ./.cutlass from scripts/setup.sh, or the nvidia-cutlass package); without them it says so
 * and checks nothing. */
TEST(ci_nvcc_frontend_accepts_generated_kernel) {
  evt_kspec s;
  CHECK(evt_kspec_example(&s, "bias_gelu_aux", cfg128) == EVT_OK);
  evt_test_nvcc_frontend("ci_nvcc_frontend_accepts_generated_kernel", &s);
}

/* The same over a ping-pong kernel whose bias-gradient row sum runs on the project's own visitor node
 * (kernels/evt_visitor_nodes.h: RowSum) — the header's templates instantiated in a real kernel. */
TEST(ci_nvcc_frontend_accepts_own_row_sum_node) {
  evt_kspec s;
  CHECK(evt_kspec_example(&s, "gelu_bwd_dbias", (evt_tile_config){128, 128, 64, 1, 1, EVT_SCHED_PINGPONG}) == EVT_OK);
  s.layout = EVT_LAYOUT_NT;
  evt_test_nvcc_frontend("ci_nvcc_frontend_accepts_own_row_sum_node", &s);
}

/* The project's Philox node (kernels/evt_visitor_nodes.h) in a real kernel: bias + dropout drawn in the epilogue,
 * its mask stored as bool (the bias_dropout example; EVT_GEMM_RAND=1 lowers dropout this way). */
TEST(ci_nvcc_frontend_accepts_philox_node) {
  evt_kspec s;
  CHECK(evt_kspec_example(&s, "bias_dropout", cfg128) == EVT_OK);
  evt_test_nvcc_frontend("ci_nvcc_frontend_accepts_philox_node", &s);
}

/* Every remaining node kind once (the mixed_f32 example: col broadcast, aux load, scalars, div, the tanh GELU and
 * its derivative on the project's functors, relu_grad, a column sum, f32 D). */
TEST(ci_nvcc_frontend_accepts_every_node_kind) {
  evt_kspec s;
  CHECK(evt_kspec_example(&s, "mixed_f32", cfg128) == EVT_OK);
  evt_test_nvcc_frontend("ci_nvcc_frontend_accepts_every_node_kind", &s);
}

/* The epilogue subtile (evt_kspec_epilogue_n): the paper MLP's fc2 forward (bias, f32 residual aux load,
 * f32 D) on a cooperative 128x256x64 tile would leave the mainloop 2 stages with CUTLASS's 128x32 subtiles
 * (much slower than the plain GEMM): 16-wide subtiles, and the emitted kernel says so; a
 * plain bf16 epilogue, an explicit epi_n and explicit stages keep theirs. */
TEST(kspec_epilogue_subtile_keeps_mainloop_stages) {
  evt_tile_config cfg = {128, 256, 64, 1, 1, EVT_SCHED_COOPERATIVE};
  evt_kspec s;
  evt_kspec_init(&s, EVT_LAYOUT_NT, EVT_BF16, EVT_F32, cfg);
  int acc = evt_kspec_add(&s, EVT_V_ACC, -1, -1, EVT_F32, NULL);
  int bias = evt_kspec_add(&s, EVT_V_ROW_BCAST, -1, -1, EVT_BF16, "bias");
  int h = evt_kspec_add(&s, EVT_V_ADD, acc, bias, EVT_F32, NULL);
  int res = evt_kspec_add(&s, EVT_V_AUX_LOAD, -1, -1, EVT_F32, "res");
  s.d_node = evt_kspec_add(&s, EVT_V_ADD, h, res, EVT_F32, NULL);
  CHECK(evt_kspec_check(&s, NULL, 0) == EVT_OK);
  CHECK(evt_kspec_epilogue_n(&s) == 16);
  char msg[256];
  char *src = evt_emit_cutlass(&s, msg, sizeof msg);
  CHECK_MSG(src && strstr(src, "using EpilogueTileType = Shape<_128, _16>;"), "%s", src ? "no 128x16 subtile" : msg);
  free(src);
  s.cfg.epi_n = 32;
  CHECK(evt_kspec_epilogue_n(&s) == 32);
  s.cfg.epi_n = 0;
  s.cfg.stages = 2;
  CHECK(evt_kspec_epilogue_n(&s) == 0);
  evt_kspec p;
  evt_kspec_init(&p, EVT_LAYOUT_NT, EVT_BF16, EVT_BF16, cfg);
  p.d_node = evt_kspec_add(&p, EVT_V_ACC, -1, -1, EVT_F32, NULL);
  CHECK(evt_kspec_epilogue_n(&p) == 0);
  src = evt_emit_cutlass(&p, msg, sizeof msg);
  CHECK(src && strstr(src, "EpilogueTileAuto"));
  free(src);
  /* the GELU backward with its bias-gradient sum (bf16 aux load, bf16 D, a column sum): 3 stages at 32, which
   * measured faster than 16 with 4: CUTLASS's own subtile */
  evt_kspec g;
  evt_kspec_init(&g, EVT_LAYOUT_NN, EVT_BF16, EVT_BF16, cfg);
  int gacc = evt_kspec_add(&g, EVT_V_ACC, -1, -1, EVT_F32, NULL);
  int pre = evt_kspec_add(&g, EVT_V_AUX_LOAD, -1, -1, EVT_BF16, "pre");
  int dh = evt_kspec_add(&g, EVT_V_MUL, gacc, pre, EVT_F32, NULL);
  evt_kspec_add(&g, EVT_V_ROW_SUM, dh, -1, EVT_F32, "db");
  g.d_node = dh;
  CHECK(evt_kspec_check(&g, NULL, 0) == EVT_OK);
  CHECK(evt_kspec_epilogue_n(&g) == 0);
  src = evt_emit_cutlass(&g, msg, sizeof msg);
  CHECK_MSG(src && strstr(src, "EpilogueTileAuto"), "%s", src ? "not CUTLASS's subtile" : msg);
  free(src);
}

/* The launcher's launch cache (initialized kernels reused for byte-identical arguments) is emitted for
 * epilogues without sums only: initialize() resets a sum's output, so those launch in full every time. */
TEST(emit_cutlass_col_max) {
  /* max within rows: CUTLASS's column reduction with NaN-propagating maxima, an atomic max into an output filled
   * with -inf; the Sm80 emitter and batched specs refuse it */
  evt_kspec s;
  evt_kspec_init(&s, EVT_LAYOUT_NT, EVT_BF16, EVT_F32, cfg128);
  int acc = evt_kspec_add(&s, EVT_V_ACC, -1, -1, EVT_F32, NULL);
  int ab = evt_kspec_add(&s, EVT_V_ABS, acc, -1, EVT_F32, NULL);
  evt_kspec_add(&s, EVT_V_COL_MAX, ab, -1, EVT_F32, "amax");
  s.d_node = acc;
  char msg[256];
  CHECK_MSG(evt_kspec_check(&s, msg, sizeof msg) == EVT_OK, "%s", msg);
  char *src = evt_emit_cutlass(&s, msg, sizeof msg);
  CHECK_MSG(src && strstr(src, "Sm90ColReduction<cutlass::maximum_with_nan_propagation") &&
                strstr(src, "cutlass::atomic_maximum, 0, TileShape") &&
                strstr(src, "-cutlass::platform::numeric_limits<float>::infinity()") && !strstr(src, "kLaunchCache"),
            "%s", src ? "no col_max reduction" : msg);
  free(src);
  evt_kspec b = s;
  b.batched = 1;
  CHECK(evt_kspec_check(&b, msg, sizeof msg) == EVT_ERR_UNSUPPORTED && strstr(msg, "unbatched"));
  s.nodes[2].dtype = EVT_BF16;
  CHECK(evt_kspec_check(&s, msg, sizeof msg) == EVT_ERR_UNSUPPORTED);
}

TEST(reference_col_max_starts_at_minus_infinity) {
  evt_kspec s;
  evt_kspec_init(&s, EVT_LAYOUT_NN, EVT_BF16, EVT_F32, cfg128);
  int acc = evt_kspec_add(&s, EVT_V_ACC, -1, -1, EVT_F32, NULL);
  evt_kspec_add(&s, EVT_V_COL_MAX, acc, -1, EVT_F32, "mx");
  s.d_node = acc;
  /* M=2, N=2, K=1: acc = [[-1, -3], [2, NaN]] */
  double a[] = {1, 1}, b[] = {-1, -3}, mx[2] = {0, 0}, d[4];
  double *tens[EVT_KSPEC_MAX_NODES] = {0};
  tens[1] = mx;
  evt_kspec_reference(&s, 2, 2, 1, a, b, tens, d);
  CHECK_NEAR(mx[0], -1, 0); /* not the initial 0 */
  double a2[] = {1, 0.0 / 0.0};
  evt_kspec_reference(&s, 2, 2, 1, a2, b, tens, d);
  CHECK(mx[1] != mx[1]); /* NaN wins */
}

TEST(launch_cache_only_without_sums) {
  evt_tile_config cfg = {128, 256, 64, 1, 1, EVT_SCHED_COOPERATIVE};
  evt_kspec s;
  evt_kspec_init(&s, EVT_LAYOUT_NN, EVT_BF16, EVT_BF16, cfg);
  int acc = evt_kspec_add(&s, EVT_V_ACC, -1, -1, EVT_F32, NULL);
  s.d_node = evt_kspec_add(&s, EVT_V_RELU, acc, -1, EVT_F32, NULL);
  char msg[256];
  char *src = evt_emit_cutlass(&s, msg, sizeof msg);
  CHECK_MSG(src && strstr(src, "kLaunchCache") && strstr(src, "!memcmp(&g_cache_key[c], &key, sizeof key)") &&
                strstr(src, "if (ws == 0) {"),
            "%s", src ? "no launch cache" : msg);
  free(src);
  evt_kspec_add(&s, EVT_V_ROW_SUM, s.d_node, -1, EVT_F32, "db");
  src = evt_emit_cutlass(&s, msg, sizeof msg);
  CHECK_MSG(src && !strstr(src, "kLaunchCache"), "%s", src ? "a cache with a sum" : msg);
  free(src);
}
