/* GPU targets: the Sm80 emitter's text (src/codegen/emit_cutlass_sm80*.c), the sm_8x config rules and retargeting
 * (src/codegen/arch.c, lower_arch.c), the JIT's -gencode per target, evt_arch_parse, and row kernels without
 * programmatic dependent launches on sm_8x. The nvcc compile of every example's kernels per target is
 * test_arch_ci.c. */
#include "test.h"

#include "codegen/examples.h"
#include "codegen/lower.h"
#include "codegen/rspec.h"
#include "compile/compile.h"
#include "tune/tune.h"

static char *emit_sm80(const char *example, int arch) {
  evt_kspec s;
  CHECK(evt_kspec_example(&s, example, EVT_TILE_CONFIG_DEFAULT) == EVT_OK);
  char err[256];
  CHECK(evt_kspec_retarget(&s, arch, 128, NULL, err, sizeof err) == EVT_OK);
  char *src = evt_emit_cutlass(&s, err, sizeof err);
  CHECK_MSG(src != NULL, "%s: %s", example, err);
  return src;
}

TEST(arch_sm80_emits_cutlass2x_gemm_with_sm80_visitors) {
  char *src = emit_sm80("bias_gelu_aux", 80);
  if (!src) return;
  CHECK(strstr(src, "CUTLASS 2.x GEMM for sm_80") != NULL);
  CHECK(strstr(src, "cutlass/gemm/kernel/default_gemm_universal_with_visitor.h") != NULL);
  CHECK(strstr(src, "using N0 = cutlass::epilogue::threadblock::VisitorAccFetch;") != NULL);
  CHECK(strstr(src, "VisitorRowBroadcast<OutputTileThreadMap, cutlass::bfloat16_t, Stride<_0, _1, int64_t>>") != NULL);
  CHECK(strstr(src, "VisitorAuxStore<OutputTileThreadMap, cutlass::bfloat16_t, RN, Stride<int64_t, _1, int64_t>>") != NULL);
  CHECK(strstr(src, "VisitorCompute<evt_ops::GeluErf, float, float, RN>") != NULL);
  CHECK(strstr(src, "using EVT = cutlass::epilogue::threadblock::Sm80EVT<DStore, T4>;") != NULL);
  CHECK(strstr(src, "cutlass::gemm::GemmShape<128, 128, 32>") && strstr(src, "GemmShape<64, 64, 32>;  // 4 warps"));
  CHECK(strstr(src, "constexpr int Stages = 4;") != NULL); /* sm_80: 4 stages of 16 KiB */
  CHECK(strstr(src, "cutlass::arch::Sm80") && strstr(src, "DefaultGemmWithVisitor<"));
  /* nothing of Hopper's: no TMA, warp specialization, clusters or grid dependency control */
  CHECK(!strstr(src, "Sm90") && !strstr(src, "Tma") && !strstr(src, "Cluster") && !strstr(src, "PDL") &&
        !strstr(src, "griddep"));
  CHECK(strstr(src, "{static_cast<ElementD *>(a->d) + o * os_d, {ldd, _1{}, bsd}}  // D") != NULL);
  CHECK(strstr(src, "gemm.run(stream)") != NULL);
  free(src);
}

TEST(arch_sm80_sums_are_zeroed_by_the_launcher) {
  char *src = emit_sm80("gelu_bwd_dbias", 89);
  if (!src) return;
  CHECK(strstr(src, "VisitorRowReduction<cutlass::plus, cutlass::atomic_add, OutputTileThreadMap, float, float, RN,\n"
                    "    Stride<_0, _1, int64_t>>") != NULL);
  CHECK(strstr(src, "cudaMemset2DAsync(static_cast<float *>(a->ptrs[") != NULL);
  CHECK(strstr(src, "constexpr int Stages = 3;") != NULL); /* sm_89: 99 KiB of shared memory */
  free(src);
  src = emit_sm80("mixed_f32", 86); /* column broadcast, aux load, scalars, column sum, f32 D */
  if (!src) return;
  CHECK(strstr(src, "VisitorColBroadcast<OutputTileThreadMap") && strstr(src, "VisitorAuxLoad<OutputTileThreadMap"));
  CHECK(strstr(src, "VisitorColReduction<cutlass::plus, cutlass::atomic_add") != NULL);
  CHECK(strstr(src, "VisitorScalarBroadcast<float>") != NULL);
  free(src);
}

TEST(arch_sm80_shared_values_use_the_topological_visitor) {
  char *src = emit_sm80("bias_silu", 80); /* x · sigmoid(x): x has two users */
  if (!src) return;
  CHECK(strstr(src, "Sm80TopologicalVisitor<float,") != NULL);
  free(src);
}

TEST(arch_sm80_batched_kernel_takes_strides_from_the_launch) {
  char *src = emit_sm80("bmm_scale_mask_stats", 80);
  if (!src) return;
  CHECK(strstr(src, "int L = a->l > 0 ? a->l : 1, LO = a->l_outer > 1 ? a->l_outer : 1;") != NULL);
  CHECK(strstr(src, "GemmUniversalMode::kBatched") != NULL);
  CHECK(strstr(src, "a->bs_ptrs[") && strstr(src, "a->os_ptrs["));
  free(src);
}

TEST(arch_sm80_refuses_rand_and_hopper_configs) {
  evt_kspec s;
  char err[256];
  CHECK(evt_kspec_example(&s, "bias_dropout", EVT_TILE_CONFIG_DEFAULT) == EVT_OK);
  int bad = -2;
  CHECK(evt_kspec_retarget(&s, 80, 128, &bad, err, sizeof err) == EVT_ERR_UNSUPPORTED);
  CHECK(bad >= 0 && s.nodes[bad].op == EVT_V_RAND && strstr(err, "no Sm80 visitor for rand"));
  CHECK(evt_kspec_example(&s, "plain", EVT_TILE_CONFIG_DEFAULT) == EVT_OK);
  CHECK(evt_kspec_retarget(&s, 89, 512, NULL, err, sizeof err) == EVT_OK && s.arch == 89);
  evt_tile_config c = s.cfg;
  c.cluster_m = 2;
  CHECK(evt_tile_config_check(&s, &c, err, sizeof err) == EVT_ERR_UNSUPPORTED && strstr(err, "clusters"));
  c = s.cfg;
  c.schedule = EVT_SCHED_PINGPONG;
  CHECK(evt_tile_config_check(&s, &c, err, sizeof err) == EVT_ERR_UNSUPPORTED && strstr(err, "ping-pong"));
  c = s.cfg;
  c.tile_k = 64, c.stages = 4; /* 4 x 32 KiB > sm_89's 99 KiB */
  CHECK(evt_tile_config_check(&s, &c, err, sizeof err) == EVT_ERR_UNSUPPORTED && strstr(err, "99 KiB"));
  s.arch = 80; /* the same fits sm_80's 163 KiB */
  CHECK(evt_tile_config_check(&s, &c, err, sizeof err) == EVT_OK);
  c.tile_m = c.tile_n = 256;
  CHECK(evt_tile_config_check(&s, &c, err, sizeof err) == EVT_ERR_UNSUPPORTED);
}

TEST(arch_spec_text_names_the_target_and_keeps_sm90_hashes) {
  evt_kspec s, t;
  CHECK(evt_kspec_example(&s, "bias_gelu_aux", EVT_TILE_CONFIG_DEFAULT) == EVT_OK);
  t = s;
  char text[4096];
  evt_kspec_text(&s, text, sizeof text);
  CHECK(!strstr(text, "arch"));
  CHECK(evt_kspec_retarget(&t, 0, 128, NULL, NULL, 0) == EVT_OK && evt_kspec_hash(&t) == evt_kspec_hash(&s));
  CHECK(evt_kspec_retarget(&t, 80, 128, NULL, NULL, 0) == EVT_OK);
  evt_kspec_text(&t, text, sizeof text);
  CHECK(strstr(text, "\narch sm_80\n") != NULL);
  uint64_t h80 = evt_kspec_hash(&t);
  t.arch = 86;
  CHECK(h80 != evt_kspec_hash(&s) && h80 != evt_kspec_hash(&t));
  CHECK(evt_kspec_epilogue_hash(&t) != evt_kspec_epilogue_hash(&s)); /* tuning records per target */
}

TEST(arch_row_kernels_leave_out_pdl_on_sm8x) {
  evt_rspec s;
  evt_rspec_example(&s, "softmax", EVT_BF16);
  char err[256], k90[40], k80[40];
  evt_rspec_kernel_name(&s, k90);
  char *src = evt_emit_rows(&s, err, sizeof err);
  CHECK(src && !strstr(src, "#define EVT_ROWS_PDL 0"));
  free(src);
  s.arch = 80;
  evt_rspec_kernel_name(&s, k80);
  CHECK(strcmp(k80, k90) != 0);
  src = evt_emit_rows(&s, err, sizeof err);
  CHECK(src && strstr(src, "#define EVT_ROWS_PDL 0") && strstr(src, "#define EVT_ROWS_PDL_MAIN 0"));
  CHECK(src && strstr(src, "#define EVT_ROWS_PDL 0") < strstr(src, "#include \"evt_rows.cuh\""));
  free(src);
}

TEST(arch_jit_gencode_and_parse) {
  char g[96];
  evt_jit_gencode(0, 0, g, sizeof g);
  CHECK(!strcmp(g, "-gencode=arch=compute_90a,code=sm_90a"));
  evt_jit_gencode(80, 0, g, sizeof g);
  CHECK(!strcmp(g, "-gencode=arch=compute_80,code=sm_80"));
  evt_jit_gencode(80, 1, g, sizeof g);
  CHECK(!strcmp(g, "-gencode=arch=compute_80,code=compute_80"));
  int a = -1, p = -1;
  CHECK(evt_arch_parse("sm_89", &a, &p) == EVT_OK && a == 89 && p == 0);
  CHECK(evt_arch_parse("compute_80", &a, &p) == EVT_OK && a == 80 && p == 1);
  CHECK(evt_arch_parse("sm_90a", &a, &p) == EVT_OK && a == 90 && p == 0);
  CHECK(evt_arch_parse("auto", &a, &p) == EVT_OK && a == 0);
  CHECK(evt_arch_parse("sm_75", &a, &p) == EVT_ERR_INVALID && evt_arch_parse(NULL, &a, &p) == EVT_ERR_INVALID);
  evt_options o;
  evt_options_init(&o);
  o.arch = 86;
  evt_compile_target(&o, &a, &p);
  CHECK(a == 86);
}

/* The lowering on sm_8x: GEMM groups get Sm80 specs and configs, row groups sm_8x row specs, each kernel named by its
 * retargeted spec. */
TEST(arch_lowering_retargets_every_group) {
  evt_graph *g = evt_test_parse_ok("graph t {\n  %x: bf16[64,32] = input()\n  %w: bf16[32,128] = param()\n"
                                   "  %b: bf16[128] = param()\n  %m: bf16[64,128] = mm(%x, %w)\n"
                                   "  %h: bf16[64,128] = add(%m, %b)\n  %s: bf16[64,128] = softmax(%h, dim=1)\n  output %s\n}\n");
  if (!g) return;
  evt_options o;
  evt_options_init(&o);
  o.arch = 80;
  o.flags = EVT_PROGRAM_FUSED | EVT_PROGRAM_NO_OPT;
  evt_exec_plan xp;
  CHECK(evt_exec_plan_build(g, &o, &xp) == EVT_OK);
  CHECK(xp.arch == 80);
  int gemm = 0, rows = 0;
  for (int i = 0; i < xp.low.n; i++) {
    const evt_lowered *L = &xp.low.k[i];
    char name[40];
    if (!L->ok) continue;
    if (L->kind == EVT_LK_GEMM_EVT) {
      CHECK(L->spec.arch == 80 && L->spec.cfg.tile_k == 32 && L->spec.cfg.stages == 4);
      evt_kspec_kernel_name(&L->spec, name);
      CHECK(!strcmp(name, L->kernel));
      gemm++;
    } else if (L->kind == EVT_LK_ROW || L->kind == EVT_LK_POINTWISE) {
      CHECK(L->rspec.arch == 80);
      evt_rspec_kernel_name(&L->rspec, name);
      CHECK(!strcmp(name, L->kernel));
      rows++;
    }
  }
  CHECK(gemm == 1 && rows == 1);
  evt_exec_plan_free(&xp);
  evt_graph_free(g);
}

TEST(arch_tuner_candidates_per_target) {
  evt_kspec s;
  CHECK(evt_kspec_example(&s, "bias_gelu_aux", EVT_TILE_CONFIG_DEFAULT) == EVT_OK);
  CHECK(evt_kspec_retarget(&s, 89, 4096, NULL, NULL, 0) == EVT_OK);
  evt_tile_config c[32];
  int n = evt_tune_candidates(&s, 4096, 4096, 4096, c, 32);
  CHECK(n >= 6 && c[0].tile_k == 32 && c[0].stages == 3);
  for (int i = 0; i < n; i++) {
    CHECK(evt_tile_config_check(&s, &c[i], NULL, 0) == EVT_OK);
    CHECK(c[i].cluster_m == 1 && c[i].schedule == EVT_SCHED_COOPERATIVE && !c[i].stream_k);
    CHECK((long)c[i].stages * (c[i].tile_m + c[i].tile_n) * c[i].tile_k * 2 <= 99L * 1024);
  }
  s.arch = 80; /* sm_80's larger shared memory admits 128x256x64 at 3 stages (144 KiB) */
  int n80 = evt_tune_candidates(&s, 4096, 4096, 4096, c, 32);
  CHECK(n80 > n);
}
