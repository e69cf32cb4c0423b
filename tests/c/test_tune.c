/* Mainloop configurations (kspec.c, emit_cutlass.c) and the tuning host code (src/tune/tune.c): config
 * checks and emission, candidate lists, the unfused alternative's row spec, the sampled CPU check, and
 * the tune record files. No GPU needed. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codegen/examples.h"
#include "codegen/kspec.h"
#include "codegen/rspec.h"
#include "passes/passes.h"
#include "compile/compile.h"
#include "tune/tune.h"
#include "test.h"
#include "compile/train.h"

TEST(tune_default_config_keeps_its_text) {
  evt_kspec s;
  CHECK(evt_kspec_example(&s, "plain", EVT_TILE_CONFIG_DEFAULT) == EVT_OK);
  char text[1024];
  evt_kspec_text(&s, text, sizeof text);
  CHECK(strstr(text, "tile 128x128x64 cluster 1x1 cooperative\n"));
  CHECK(!strstr(text, "stages") && !strstr(text, "reduction"));
  char *src = evt_emit_cutlass(&s, NULL, 0);
  CHECK(src && strstr(src, "StageCountAutoCarveout") && strstr(src, "args.scheduler.max_swizzle_size = a->swizzle"));
  free(src);
}

/* A spec whose default is already one of the list's configs (the lowering's 128x256 for N >= 256) gets each
 * candidate once: a cap of 3 then measures three different mainloops. */
TEST(tune_candidates_are_distinct_when_the_default_is_listed) {
  evt_tile_config wide = EVT_TILE_CONFIG_DEFAULT;
  wide.tile_n = 256;
  evt_kspec s;
  CHECK(evt_kspec_example(&s, "bias_gelu_aux", wide) == EVT_OK);
  evt_tile_config c[EVT_TUNE_MAX_CAND];
  int n = evt_tune_candidates(&s, 8192, 8192, 8192, c, EVT_TUNE_MAX_CAND);
  CHECK(n >= 3 && c[0].tile_n == 256);
  for (int i = 0; i < n; i++)
    for (int j = 0; j < i; j++) {
      char a[80], b[80];
      evt_tile_config_label(&c[i], a, sizeof a);
      evt_tile_config_label(&c[j], b, sizeof b);
      CHECK_MSG(strcmp(a, b), "candidates %d and %d are both %s", j, i, a);
    }
}

TEST(tune_each_config_emits_different_source_and_hash) {
  evt_kspec base;
  CHECK(evt_kspec_example(&base, "bias_relu_dbias", EVT_TILE_CONFIG_DEFAULT) == EVT_OK);
  evt_tile_config c[EVT_TUNE_MAX_CAND];
  int n = evt_tune_candidates(&base, 8192, 8192, 8192, c, EVT_TUNE_MAX_CAND);
  CHECK(n >= 8);
  evt_tile_config dflt = EVT_TILE_CONFIG_DEFAULT;
  CHECK(!memcmp(&c[0], &dflt, sizeof c[0]));
  /* plus a fixed stage count */
  c[n] = c[1];
  c[n].stages = 3;
  n++;
  char *srcs[EVT_TUNE_MAX_CAND + 1];
  uint64_t h[EVT_TUNE_MAX_CAND + 1];
  for (int i = 0; i < n; i++) {
    evt_kspec s = base;
    s.cfg = c[i];
    char err[256];
    CHECK_MSG(evt_kspec_check(&s, err, sizeof err) == EVT_OK, "config %d: %s", i, err);
    srcs[i] = evt_emit_cutlass(&s, err, sizeof err);
    CHECK(srcs[i] != NULL);
    h[i] = evt_kspec_hash(&s);
    CHECK(evt_kspec_epilogue_hash(&s) == evt_kspec_epilogue_hash(&base));
    for (int j = 0; j < i; j++) {
      CHECK_MSG(h[i] != h[j], "configs %d and %d share a hash", i, j);
      CHECK_MSG(srcs[i] && srcs[j] && strcmp(srcs[i], srcs[j]), "configs %d and %d emit the same source", i, j);
    }
    if (!srcs[i]) continue;
    char want[64];
    snprintf(want, sizeof want, "Shape<_%d, _%d, _%d>", c[i].tile_m, c[i].tile_n, c[i].tile_k);
    CHECK(strstr(srcs[i], want));
    snprintf(want, sizeof want, "Shape<_%d, _%d, _1>", c[i].cluster_m, c[i].cluster_n);
    CHECK(strstr(srcs[i], want));
    CHECK(strstr(srcs[i], c[i].schedule == EVT_SCHED_PINGPONG ? "KernelTmaWarpSpecializedPingpong"
                                                                : "KernelTmaWarpSpecializedCooperative"));
    CHECK(strstr(srcs[i], c[i].reduction == EVT_RED_WORKSPACE ? "Sm90RowReduction<cutlass::plus, cutlass::plus, cutlass::plus"
                          : c[i].stream_k ? "Sm90RowReduction<cutlass::plus, cutlass::plus, cutlass::atomic_add"
                                          : "evt_nodes::RowSum<TileShape"));
    if (c[i].epi_n) {
      /* 128 x epi_n for a cooperative kernel (its two warp groups), 64 x epi_n for ping-pong (one) */
      snprintf(want, sizeof want, "using EpilogueTileType = Shape<_%d, _%d>;",
               c[i].schedule == EVT_SCHED_PINGPONG ? 64 : 128, c[i].epi_n);
      CHECK(strstr(srcs[i], want));
    } else {
      CHECK(strstr(srcs[i], "using EpilogueTileType = cutlass::epilogue::collective::EpilogueTileAuto;"));
    }
    if (c[i].stages) CHECK(strstr(srcs[i], "cutlass::gemm::collective::StageCount<3>"));
    else CHECK(strstr(srcs[i], "StageCountAutoCarveout"));
  }
  for (int i = 0; i < n; i++) free(srcs[i]);
  /* epilogues without sums get no workspace variant */
  evt_kspec g;
  CHECK(evt_kspec_example(&g, "bias_gelu_aux", EVT_TILE_CONFIG_DEFAULT) == EVT_OK);
  int ng = evt_tune_candidates(&g, 8192, 8192, 8192, c, EVT_TUNE_MAX_CAND);
  CHECK(ng >= 6 && ng < n);
  for (int i = 0; i < ng; i++) CHECK(c[i].reduction == EVT_RED_ATOMIC);
  /* a small problem drops tiles larger than itself; the cap holds */
  CHECK(evt_tune_candidates(&g, 128, 128, 64, c, EVT_TUNE_MAX_CAND) < ng);
  CHECK(evt_tune_candidates(&g, 8192, 8192, 8192, c, 3) == 3);
}

TEST(tune_invalid_configs_are_refused_with_a_reason) {
  evt_kspec s;
  CHECK(evt_kspec_example(&s, "bias_gelu_aux", EVT_TILE_CONFIG_DEFAULT) == EVT_OK);
  struct {
    evt_tile_config c;
    const char *why;
  } bad[] = {
      {{128, 256, 64, 1, 1, EVT_SCHED_PINGPONG, 0, EVT_RED_ATOMIC}, "accumulators per thread"},
      {{256, 256, 64, 1, 1, EVT_SCHED_COOPERATIVE, 0, EVT_RED_ATOMIC}, "accumulators per thread"},
      {{64, 128, 64, 1, 1, EVT_SCHED_COOPERATIVE, 0, EVT_RED_ATOMIC}, "cooperative schedule needs tile_m"},
      {{128, 96, 64, 1, 1, EVT_SCHED_COOPERATIVE, 0, EVT_RED_ATOMIC}, "unsupported tile"},
      {{128, 128, 48, 1, 1, EVT_SCHED_COOPERATIVE, 0, EVT_RED_ATOMIC}, "tile_k"},
      {{128, 128, 64, 3, 1, EVT_SCHED_COOPERATIVE, 0, EVT_RED_ATOMIC}, "cluster"},
      {{128, 128, 64, 4, 2, EVT_SCHED_COOPERATIVE, 0, EVT_RED_ATOMIC}, "cluster"},
      {{128, 128, 64, 1, 1, EVT_SCHED_COOPERATIVE, 9, EVT_RED_ATOMIC}, "stages 9"},
      {{128, 256, 64, 1, 1, EVT_SCHED_COOPERATIVE, 5, EVT_RED_ATOMIC}, "exceed the shared memory"},
      {{128, 128, 64, 1, 1, EVT_SCHED_COOPERATIVE, 0, EVT_RED_WORKSPACE}, "no row_sum / col_sum"},
      {{128, 128, 64, 1, 1, EVT_SCHED_COOPERATIVE, 0, EVT_RED_ATOMIC, 48}, "epilogue subtile N 48"},
      {{128, 64, 64, 1, 1, EVT_SCHED_COOPERATIVE, 0, EVT_RED_ATOMIC, 128}, "epilogue subtile N 128"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char err[300] = "";
    s.cfg = bad[i].c;
    CHECK_MSG(evt_kspec_check(&s, err, sizeof err) == EVT_ERR_UNSUPPORTED && strstr(err, bad[i].why) &&
                  strstr(err, "config "),
              "case %zu: '%s'", i, err);
    CHECK(evt_emit_cutlass(&s, err, sizeof err) == NULL);
  }
  s.cfg = (evt_tile_config){128, 256, 64, 1, 1, EVT_SCHED_COOPERATIVE, 4, EVT_RED_ATOMIC};
  CHECK(evt_kspec_check(&s, NULL, 0) == EVT_OK);
}

TEST(tune_config_label_round_trip) {
  evt_tile_config cs[] = {EVT_TILE_CONFIG_DEFAULT,
                          {64, 256, 64, 2, 1, EVT_SCHED_PINGPONG, 4, EVT_RED_WORKSPACE, 64, 0},
                          {256, 128, 32, 1, 2, EVT_SCHED_COOPERATIVE, 0, EVT_RED_WORKSPACE, 0, 0},
                          {128, 256, 64, 1, 1, EVT_SCHED_COOPERATIVE, 3, EVT_RED_ATOMIC, 32, 1},
                          {128, 128, 64, 1, 1, EVT_SCHED_PINGPONG, 4, EVT_RED_WORKSPACE, 64, 0, 4}};
  for (size_t i = 0; i < 5; i++) {
    char lab[96];
    evt_tile_config back;
    evt_tile_config_label(&cs[i], lab, sizeof lab);
    CHECK_MSG(evt_tile_config_parse(lab, &back) == EVT_OK && !memcmp(&back, &cs[i], sizeof back), "'%s'", lab);
  }
  evt_tile_config x;
  CHECK(evt_tile_config_parse("128x128x64 c1x1 fast", &x) == EVT_ERR_INVALID);
  CHECK(evt_tile_config_parse("128x128 c1x1 coop", &x) == EVT_ERR_INVALID);
  CHECK(evt_tile_config_parse("128x128x64 c1x1 coop s4 extra", &x) == EVT_ERR_INVALID);
}

/* Epilogue store stages (StagesD): label "dN", its own spec text and kernel, 2..8 and at most the tile's
 * subtiles; emitted through CUTLASS's builder implementation with a project-written dispatch policy, and the
 * default config's source unchanged (no descriptor of its own). */
TEST(tune_epilogue_store_stages) {
  evt_kspec s;
  evt_kspec_init(&s, EVT_LAYOUT_NN, EVT_BF16, EVT_BF16,
                 (evt_tile_config){128, 128, 64, 1, 1, EVT_SCHED_PINGPONG, 0, EVT_RED_ATOMIC, 0, 0, 0});
  int acc = evt_kspec_add(&s, EVT_V_ACC, -1, -1, EVT_F32, NULL);
  int bias = evt_kspec_add(&s, EVT_V_ROW_BCAST, -1, -1, EVT_BF16, "bias");
  int z = evt_kspec_add(&s, EVT_V_ADD, acc, bias, EVT_F32, NULL);
  int aux = evt_kspec_add(&s, EVT_V_AUX_STORE, z, -1, EVT_BF16, "pre");
  s.d_node = evt_kspec_add(&s, EVT_V_GELU_ERF, aux, -1, EVT_F32, NULL);
  CHECK(evt_kspec_check(&s, NULL, 0) == EVT_OK);
  char msg[256], text[4096];
  char *base = evt_emit_cutlass(&s, msg, sizeof msg);
  CHECK(base && strstr(base, "detail::EpilogueDescriptor<TileShape") && !strstr(base, "Sm90TmaBuilderImpl"));
  evt_kspec d = s;
  d.cfg.epi_stages = 4;
  CHECK(evt_kspec_check(&d, NULL, 0) == EVT_OK);
  CHECK(evt_kspec_hash(&d) != evt_kspec_hash(&s) && evt_kspec_epilogue_hash(&d) == evt_kspec_epilogue_hash(&s));
  evt_kspec_text(&d, text, sizeof text);
  CHECK(strstr(text, " epilogue_stages 4\n") != NULL);
  char *src = evt_emit_cutlass(&d, msg, sizeof msg);
  CHECK_MSG(src && strstr(src, "static constexpr int StagesD = 4;") && strstr(src, "detail::Sm90TmaBuilderImpl<") &&
                strstr(src, "EVT, EpiDesc::DispatchPolicy>::CollectiveOp;") &&
                strstr(src, "AuxStoreDescriptor<EpiDesc, ") && !strstr(src, "CollectiveBuilder<\n    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape, EpilogueTileType"),
            "%s", src ? "unexpected source" : msg);
  free(src);
  free(base);
  /* ping-pong 128x128 with 64x32 subtiles: 8 subtiles, so 8 is the most; 1, 9 and more than the subtiles refused */
  const int bad[] = {1, 9};
  for (size_t i = 0; i < 2; i++) {
    d.cfg.epi_stages = bad[i];
    CHECK(evt_kspec_check(&d, msg, sizeof msg) == EVT_ERR_UNSUPPORTED && strstr(msg, "epilogue store stages"));
  }
  d.cfg.epi_stages = 8;
  CHECK(evt_kspec_check(&d, NULL, 0) == EVT_OK);
  d.cfg.epi_n = 128; /* 64x128 subtiles: 2 */
  CHECK(evt_kspec_check(&d, msg, sizeof msg) == EVT_ERR_UNSUPPORTED && strstr(msg, "at most the 2 epilogue subtiles"));
  d.cfg.epi_stages = 2;
  CHECK(evt_kspec_check(&d, NULL, 0) == EVT_OK);
}

/* The stream-K tile scheduler: a config flag ("sk") for the cooperative schedule, its own spec text and
 * kernel, emitted as GemmUniversal's tile scheduler; the tuner proposes it right after the default for few
 * output tiles over a long K, nowhere else. */
TEST(tune_stream_k_config_kernel_and_candidates) {
  evt_kspec s;
  CHECK(evt_kspec_example(&s, "bias_relu_dbias", EVT_TILE_CONFIG_DEFAULT) == EVT_OK);
  evt_tile_config c = s.cfg;
  c.tile_n = 256, c.stream_k = 1;
  char lab[96], err[256];
  CHECK(!strcmp(evt_tile_config_label(&c, lab, sizeof lab), "128x256x64 c1x1 coop sk"));
  CHECK(evt_tile_config_check(&s, &c, err, sizeof err) == EVT_OK);
  evt_tile_config bad = c;
  bad.schedule = EVT_SCHED_PINGPONG, bad.tile_n = 128;
  CHECK(evt_tile_config_check(&s, &bad, err, sizeof err) != EVT_OK && strstr(err, "cooperative"));
  bad = c;
  bad.reduction = EVT_RED_WORKSPACE;
  CHECK(evt_tile_config_check(&s, &bad, err, sizeof err) != EVT_OK && strstr(err, "workspace"));
  evt_kspec sb = s;
  sb.batched = 1;
  CHECK(evt_tile_config_check(&sb, &c, err, sizeof err) != EVT_OK && strstr(err, "batched"));
  /* its own text and kernel name; the plain config keeps its text */
  evt_kspec k = s;
  k.cfg = c;
  char t0[2048], t1[2048], n0[40], n1[40];
  evt_kspec t = s;
  t.cfg.tile_n = 256;
  evt_kspec_text(&t, t0, sizeof t0);
  evt_kspec_text(&k, t1, sizeof t1);
  CHECK(!strstr(t0, "stream_k") && strstr(t1, "cooperative stream_k\n"));
  evt_kspec_kernel_name(&t, n0);
  evt_kspec_kernel_name(&k, n1);
  CHECK(strcmp(n0, n1) != 0);
  CHECK(evt_kspec_epilogue_hash(&t) == evt_kspec_epilogue_hash(&k)); /* one tuning problem */
  char *a = evt_emit_cutlass(&t, err, sizeof err), *b = evt_emit_cutlass(&k, err, sizeof err);
  CHECK(a && b);
  if (a && b) {
    CHECK(!strstr(a, "StreamKScheduler") && strstr(a, "if (g_workspace) cudaFree(g_workspace);"));
    CHECK(strstr(b, "CollectiveEpilogue, cutlass::gemm::StreamKScheduler>;") && !strstr(b, "cudaFree(g_workspace)"));
  }
  free(a), free(b);
  /* candidates: stream-K right after the default for 768 x 768 over K = 32896 (18 tiles of 128x256) */
  evt_tile_config cf[EVT_TUNE_MAX_CAND];
  int nc = evt_tune_candidates(&t, 768, 768, 32896, cf, EVT_TUNE_MAX_CAND);
  CHECK(nc >= 3 && !cf[0].stream_k && cf[1].stream_k && cf[2].stream_k);
  CHECK(cf[1].tile_n == 256 && cf[2].tile_n == 128 && cf[1].schedule == EVT_SCHED_COOPERATIVE);
  int nsk = 0;
  for (int i = 0; i < nc; i++) nsk += cf[i].stream_k;
  CHECK(nsk == 2);
  /* not for many tiles, nor for a short K */
  nc = evt_tune_candidates(&t, 8192, 8192, 8192, cf, EVT_TUNE_MAX_CAND);
  for (int i = 0; i < nc; i++) CHECK(!cf[i].stream_k);
  nc = evt_tune_candidates(&t, 768, 768, 1024, cf, EVT_TUNE_MAX_CAND);
  for (int i = 0; i < nc; i++) CHECK(!cf[i].stream_k);
}

/* The untuned config takes stream-K 128x256 where data-parallel tiles would leave SMs idle over a long K (a
 * weight gradient of 1280x1280 over K = 32896: 50 tiles), for bf16 / f16 unbatched specs only. */
TEST(untuned_config_stream_k_for_starved_long_k) {
  evt_kspec s;
  CHECK(evt_kspec_example(&s, "bias_relu_dbias", EVT_TILE_CONFIG_DEFAULT) == EVT_OK);
  evt_tile_config c = evt_lower_untuned_config(&s, 1280, 1280, 32896);
  char err[256];
  CHECK(c.stream_k && c.tile_n == 256 && c.schedule == EVT_SCHED_COOPERATIVE);
  CHECK(evt_tile_config_check(&s, &c, err, sizeof err) == EVT_OK);
  CHECK(!evt_lower_untuned_config(&s, 1280, 1280, 1024).stream_k);     /* short K */
  CHECK(!evt_lower_untuned_config(&s, 32896, 1280, 1280).stream_k);    /* 257 x 5 tiles fill the SMs */
  CHECK(!evt_lower_untuned_config(&s, 2048, 16384, 4096).stream_k);    /* 16 x 64 tiles */
  evt_kspec b = s;
  b.batched = 1;
  CHECK(!evt_lower_untuned_config(&b, 1280, 1280, 32896).stream_k);
  evt_kspec f = s;
  f.ab_dtype = f.b_dtype = EVT_F8E4M3;
  CHECK(!evt_lower_untuned_config(&f, 1280, 1280, 32896).stream_k);
}

static void tmpdir(char *out, size_t len) { evt_test_tmpdir(out, len, "tune-test"); }

TEST(tune_record_round_trip_and_apply) {
  char dir[128];
  tmpdir(dir, sizeof dir);
  evt_kspec s;
  CHECK(evt_kspec_example(&s, "bias_relu_dbias", EVT_TILE_CONFIG_DEFAULT) == EVT_OK);
  evt_tune_record r;
  memset(&r, 0, sizeof r);
  r.spec_hash = evt_kspec_epilogue_hash(&s);
  r.m = 8192, r.n = 4096, r.k = 1024;
  snprintf(r.gpu, sizeof r.gpu, "NVIDIA H200");
  r.choice = EVT_TUNE_FUSED;
  r.cfg = (evt_tile_config){128, 256, 64, 2, 1, EVT_SCHED_COOPERATIVE, 0, EVT_RED_WORKSPACE};
  r.swizzle = 8, r.raster = 2;
  r.fused_ms = 0.118, r.unfused_ms = 0.150, r.default_ms = 0.240, r.check_err = 3e-3;
  snprintf(r.unfused_how, sizeof r.unfused_how, "cublasLt(bias) + row kernel");
  r.ncand = 2;
  r.cand[0].cfg = EVT_TILE_CONFIG_DEFAULT, r.cand[0].ms = 0.24, r.cand[0].swizzle = 1;
  r.cand[1].cfg = r.cfg, r.cand[1].ms = -1, r.cand[1].swizzle = 4, r.cand[1].raster = 1;
  snprintf(r.cand[1].note, sizeof r.cand[1].note, "compile failed");
  char msg[256];
  r.source_hash = evt_tune_sources_hash(&s, &r); /* measured on the kernels generated now */
  CHECK(evt_tune_record_write(dir, &r, msg, sizeof msg) == EVT_OK);
  evt_tune_record q;
  CHECK(evt_tune_record_read(dir, r.spec_hash, 8192, 4096, 1024, "NVIDIA H200", &q) == EVT_OK);
  CHECK(q.choice == EVT_TUNE_FUSED && !memcmp(&q.cfg, &r.cfg, sizeof q.cfg) && q.swizzle == 8 && q.raster == 2);
  CHECK_NEAR(q.fused_ms, 0.118, 1e-9);
  CHECK_NEAR(q.unfused_ms, 0.150, 1e-9);
  CHECK(!strcmp(q.unfused_how, r.unfused_how) && !strcmp(q.gpu, "NVIDIA H200"));
  CHECK(q.ncand == 2 && !strcmp(q.cand[1].note, "compile failed") && q.cand[1].ms < 0 && q.cand[1].raster == 1);
  /* any GPU; another shape or GPU has no record */
  CHECK(evt_tune_record_read(dir, r.spec_hash, 8192, 4096, 1024, NULL, &q) == EVT_OK && q.swizzle == 8);
  CHECK(evt_tune_record_read(dir, r.spec_hash, 8192, 4096, 1025, NULL, &q) == EVT_ERR_IO);
  CHECK(evt_tune_record_read(dir, r.spec_hash, 8192, 4096, 1024, "NVIDIA A100", &q) == EVT_ERR_IO);
  /* apply: the spec gets the tuned config (and a new kernel name); launch args the scheduler */
  evt_kspec t = s;
  char before[40], after[40];
  evt_kspec_kernel_name(&t, before);
  CHECK(evt_tune_apply(&t, 8192, 4096, 1024, dir, NULL, &q) == EVT_TUNE_FUSED);
  evt_kspec_kernel_name(&t, after);
  CHECK(!memcmp(&t.cfg, &r.cfg, sizeof t.cfg) && strcmp(before, after));
  evt_launch_args a;
  memset(&a, 0, sizeof a);
  evt_tune_launch_apply(&q, &a);
  CHECK(a.swizzle == 8 && a.raster == 2);
  char line[300];
  evt_tune_describe(&q, EVT_TUNE_FUSED, &t, line, sizeof line);
  CHECK(strstr(line, "fused 128x256x64 c2x1 coop red=workspace swizzle 8 along-N") && strstr(line, "0.1180 ms"));
  /* a record timed on kernels the emitter now generates differently (or older, without the line) is stale:
   * not applied, and measured again */
  {
    evt_tune_record st = r;
    st.source_hash ^= 1;
    st.m = 4096;
    CHECK(evt_tune_record_write(dir, &st, msg, sizeof msg) == EVT_OK);
    evt_kspec u = s;
    CHECK(evt_tune_apply(&u, 4096, 4096, 1024, dir, NULL, &q) == EVT_TUNE_NONE && !memcmp(&u.cfg, &s.cfg, sizeof u.cfg));
    CHECK(evt_tune_record_reusable(dir, &s, 4096, 4096, 1024, 2, &q) == EVT_ERR_IO);
    st.source_hash = 0;
    CHECK(evt_tune_record_write(dir, &st, msg, sizeof msg) == EVT_OK);
    CHECK(evt_tune_apply(&u, 4096, 4096, 1024, dir, NULL, &q) == EVT_TUNE_NONE);
  }
  /* unfused record */
  r.choice = EVT_TUNE_UNFUSED;
  r.m = 64;
  CHECK(evt_tune_record_write(dir, &r, msg, sizeof msg) == EVT_OK);
  t = s;
  CHECK(evt_tune_apply(&t, 64, 4096, 1024, dir, "NVIDIA H200", &q) == EVT_TUNE_UNFUSED);
  CHECK(!memcmp(&t.cfg, &r.cfg, sizeof t.cfg)); /* the fastest fused config, for a runtime that stays fused */
  evt_tune_describe(&q, EVT_TUNE_UNFUSED, &t, line, sizeof line);
  CHECK(strstr(line, "unfused (measured 0.1500 ms") && strstr(line, "vs fused 0.1180 ms"));
  t = s;
  /* no record: not tuned, default config */
  CHECK(evt_tune_apply(&t, 1, 2, 3, dir, NULL, &q) == EVT_TUNE_NONE);
  evt_tune_describe(NULL, EVT_TUNE_NONE, &t, line, sizeof line);
  CHECK(strstr(line, "not tuned (default config 128x128x64 c1x1 coop)"));
  /* a corrupt record does not parse; a record with a config illegal for the spec is ignored */
  char name[200], path[400];
  evt_tune_record_name(r.spec_hash, 7, 7, 7, "g", name, sizeof name);
  snprintf(path, sizeof path, "%s/tune/%s", dir, name);
  FILE *f = fopen(path, "w");
  CHECK(f != NULL);
  if (f) {
    fputs("evt-tune 1\nshape 7 7 7\nchoice maybe\n", f);
    fclose(f);
  }
  CHECK(evt_tune_record_read(dir, r.spec_hash, 7, 7, 7, "g", &q) == EVT_ERR_INVALID);
  r.choice = EVT_TUNE_FUSED, r.m = 32;
  r.cfg.reduction = EVT_RED_WORKSPACE;
  evt_kspec g;
  evt_kspec_example(&g, "bias_gelu_aux", EVT_TILE_CONFIG_DEFAULT);
  r.spec_hash = evt_kspec_epilogue_hash(&g);
  CHECK(evt_tune_record_write(dir, &r, msg, sizeof msg) == EVT_OK);
  CHECK(evt_tune_apply(&g, 32, 4096, 1024, dir, NULL, &q) == EVT_TUNE_NONE);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  CHECK(system(cmd) == 0);
}

TEST(tune_record_of_fewer_configs_is_measured_again) {
  /* The default tuning (one config: the untuned one, at its scheduler variants) leaves a record of one
   * candidate; a later run asking for more configs must not take it as done, one asking for as many or
   * fewer reuses it. */
  char dir[128];
  tmpdir(dir, sizeof dir);
  evt_kspec s;
  CHECK(evt_kspec_example(&s, "bias_relu_dbias", EVT_TILE_CONFIG_DEFAULT) == EVT_OK);
  evt_tile_config c[EVT_TUNE_MAX_CAND];
  int avail = evt_tune_candidates(&s, 8192, 4096, 1024, c, EVT_TUNE_MAX_CAND);
  CHECK(avail > 3);
  evt_tune_record r, q;
  memset(&r, 0, sizeof r);
  r.spec_hash = evt_kspec_epilogue_hash(&s);
  r.m = 8192, r.n = 4096, r.k = 1024;
  snprintf(r.gpu, sizeof r.gpu, "NVIDIA H200");
  r.choice = EVT_TUNE_FUSED;
  r.cfg = s.cfg;
  r.fused_ms = r.default_ms = 0.2, r.unfused_ms = 0.3, r.check_err = 1e-3;
  r.ncand = 1;
  r.cand[0].cfg = s.cfg, r.cand[0].ms = 0.2, r.cand[0].swizzle = 4;
  char msg[256];
  CHECK(evt_tune_record_reusable(dir, &s, 8192, 4096, 1024, 1, &q) == EVT_ERR_IO); /* none yet */
  r.source_hash = evt_tune_sources_hash(&s, &r); /* measured on the kernels generated now */
  CHECK(evt_tune_record_write(dir, &r, msg, sizeof msg) == EVT_OK);
  CHECK(evt_tune_record_reusable(dir, &s, 8192, 4096, 1024, 1, &q) == EVT_OK && q.ncand == 1);
  CHECK(evt_tune_record_reusable(dir, &s, 8192, 4096, 1024, 3, &q) == EVT_ERR_IO);
  CHECK(evt_tune_record_reusable(dir, &s, 8192, 4096, 1024, 0, &q) == EVT_ERR_IO); /* 0: all candidates */
  /* a record of three configs serves one and three, not all of them */
  r.ncand = 3;
  for (int i = 1; i < 3; i++) r.cand[i].cfg = c[i], r.cand[i].ms = 0.25;
  r.source_hash = evt_tune_sources_hash(&s, &r); /* measured on the kernels generated now */
  CHECK(evt_tune_record_write(dir, &r, msg, sizeof msg) == EVT_OK);
  CHECK(evt_tune_record_reusable(dir, &s, 8192, 4096, 1024, 1, &q) == EVT_OK);
  CHECK(evt_tune_record_reusable(dir, &s, 8192, 4096, 1024, 3, &q) == EVT_OK && q.ncand == 3);
  CHECK(evt_tune_record_reusable(dir, &s, 8192, 4096, 1024, 4, &q) == EVT_ERR_IO);
  /* a problem with fewer candidates than asked for: a record of all of them serves any request */
  int few = evt_tune_candidates(&s, 128, 128, 64, c, EVT_TUNE_MAX_CAND);
  r.m = 128, r.n = 128, r.k = 64, r.ncand = few;
  for (int i = 0; i < few; i++) r.cand[i].cfg = c[i], r.cand[i].ms = 0.01;
  r.source_hash = evt_tune_sources_hash(&s, &r); /* measured on the kernels generated now */
  CHECK(evt_tune_record_write(dir, &r, msg, sizeof msg) == EVT_OK);
  CHECK(evt_tune_record_reusable(dir, &s, 128, 128, 64, 0, &q) == EVT_OK);
  CHECK(evt_tune_record_reusable(dir, &s, 128, 128, 64, few + 5, &q) == EVT_OK);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  CHECK(system(cmd) == 0);
}

TEST(tune_random_data_depends_on_the_seed_alone) {
  /* the tuner's operands: values in [-1, 1), the same for a seed whatever the number of threads (chunks of
   * 2^20 seeded from (seed, chunk)); another seed, other values */
  const int64_t n = (3 << 20) + 12345;
  evt_dtype dts[3] = {EVT_F32, EVT_BF16, EVT_F16};
  for (int d = 0; d < 3; d++) {
    size_t es = dts[d] == EVT_F32 ? 4 : 2;
    evt_tune_set_threads(1);
    unsigned char *one = evt_tune_random_data(dts[d], n, 7);
    evt_tune_set_threads(3);
    unsigned char *three = evt_tune_random_data(dts[d], n, 7), *other = evt_tune_random_data(dts[d], n, 8);
    CHECK(!memcmp(one, three, (size_t)n * es));
    CHECK(memcmp(one, other, (size_t)n * es));
    double lo = 1, hi = -1, sum = 0;
    int distinct_ok = 0;
    for (int64_t i = 0; i < n; i++) {
      double v;
      if (es == 4) {
        float f;
        memcpy(&f, one + 4 * i, 4);
        v = f;
      } else {
        uint16_t h;
        memcpy(&h, one + 2 * i, 2);
        if (dts[d] == EVT_BF16) {
          uint32_t u = (uint32_t)h << 16;
          float f;
          memcpy(&f, &u, 4);
          v = f;
        } else {
          int e = (h >> 10) & 31, mant = h & 1023;
          v = (h & 0x8000 ? -1 : 1) * (e ? ldexp(mant + 1024, e - 25) : ldexp(mant, -24));
        }
      }
      lo = v < lo ? v : lo, hi = v > hi ? v : hi, sum += v;
      if (i > 0 && i % (1 << 20) == 0 && memcmp(one + es * (size_t)i, one, es)) distinct_ok++;
    }
    CHECK_MSG(lo >= -1 && hi <= 1 && lo < -0.99 && hi > 0.99, "range [%g, %g]", lo, hi);
    CHECK_MSG(fabs(sum / (double)n) < 0.01, "mean %g", sum / (double)n);
    CHECK(distinct_ok == 3); /* the chunks do not repeat the first */
    free(one), free(three), free(other);
  }
  evt_tune_set_threads(0);
}

static uint16_t bf16_bits(double v) {
  float f = (float)evt_round_to_dtype(v, EVT_BF16);
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)(u >> 16);
}

static double lcg(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return (double)((*s >> 11) & 0xFFFF) / 32768.0 - 1.0;
}

/* The unfused row spec computes what the fused spec computes, given T = the accumulator (f32). */
TEST(tune_unfused_rspec_matches_fused_reference) {
  const char *names[] = {"bias_gelu_aux", "bias_relu_dbias", "gelu_bwd", "bias_silu", "mixed_f32"};
  for (int ni = 0; ni < 5; ni++)
    for (int absorb = 0; absorb < 2; absorb++) {
      evt_kspec s;
      CHECK(evt_kspec_example(&s, names[ni], EVT_TILE_CONFIG_DEFAULT) == EVT_OK);
      evt_rspec r;
      int map[EVT_RSPEC_MAX_NODES], tn, dn, bn;
      char err[256];
      evt_dtype tdt = absorb ? EVT_BF16 : EVT_F32;
      evt_status st = evt_tune_unfused_rspec(&s, tdt, absorb, &r, map, &tn, &dn, &bn, err, sizeof err);
      CHECK_MSG(st == EVT_OK, "%s: %s", names[ni], err);
      if (st != EVT_OK) continue;
      int64_t m = 6, n = 8, k = 5;
      double a[30], b[40], d[48], t[48], dref[48];
      uint64_t sd = 7 + ni;
      for (int i = 0; i < 30; i++) a[i] = evt_round_to_dtype(lcg(&sd), EVT_BF16);
      for (int i = 0; i < 40; i++) b[i] = evt_round_to_dtype(lcg(&sd), EVT_BF16);
      double store[EVT_KSPEC_MAX_NODES][48];
      double *tens[EVT_KSPEC_MAX_NODES] = {0};
      for (int v = 0; v < s.nnodes; v++) {
        tens[v] = store[v];
        for (int i = 0; i < 48; i++) store[v][i] = evt_round_to_dtype(lcg(&sd) + 1.5, s.nodes[v].dtype);
      }
      evt_kspec_reference(&s, m, n, k, a, b, tens, dref);
      double fused_mem[EVT_KSPEC_MAX_NODES][48];
      memcpy(fused_mem, store, sizeof fused_mem);
      /* T: acc in f32 (plus the bias, rounded to bf16, when cuBLASLt adds it) */
      for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
          double acc = 0;
          for (int64_t kk = 0; kk < k; kk++) acc += a[i * k + kk] * b[kk * n + j];
          acc = (double)(float)acc;
          t[i * n + j] = bn >= 0 ? evt_round_to_dtype(acc + store[bn][j], EVT_BF16) : acc;
        }
      CHECK(absorb ? bn >= 0 || !strcmp(names[ni], "gelu_bwd") || !strcmp(names[ni], "mixed_f32") : bn < 0);
      double rmem[EVT_RSPEC_MAX_NODES][48];
      double *rt[EVT_RSPEC_MAX_NODES] = {0};
      for (int i = 0; i < r.nnodes; i++) {
        rt[i] = rmem[i];
        if (i == tn) memcpy(rmem[i], t, sizeof t);
        else if (map[i] >= 0) memcpy(rmem[i], store[map[i]], sizeof rmem[i]);
      }
      const double *noin[3] = {NULL, NULL, NULL};
      evt_rspec_reference(&r, m, n, noin, rt, NULL, NULL);
      memcpy(d, rmem[dn], sizeof d);
      /* compare D and every stored output */
      double tol = absorb ? 0.02 : 1e-6;
      for (int i = 0; i < 48; i++) CHECK_NEAR(d[i], dref[i], tol * (1 + fabs(dref[i])));
      for (int i = 0; i < r.nnodes; i++)
        if (map[i] >= 0 && evt_vop_class(r.nodes[i].op) == 'S') {
          int64_t cnt = evt_rspec_node_elems(&r, i, m, n);
          for (int64_t e = 0; e < cnt; e++) CHECK_NEAR(rmem[i][e], tens[map[i]][e], tol * 4 * (1 + fabs(tens[map[i]][e])));
        }
    }
  evt_kspec p;
  evt_kspec_example(&p, "plain", EVT_TILE_CONFIG_DEFAULT);
  evt_rspec r;
  int map[EVT_RSPEC_MAX_NODES], tn, dn, bn;
  char err[256];
  CHECK(evt_tune_unfused_rspec(&p, EVT_BF16, 0, &r, map, &tn, &dn, &bn, err, sizeof err) == EVT_ERR_UNSUPPORTED &&
        dn == -1 && strstr(err, "no row kernel"));
}

TEST(tune_check_sampled_finds_a_wrong_element) {
  evt_kspec s;
  CHECK(evt_kspec_example(&s, "bias_relu_dbias", EVT_TILE_CONFIG_DEFAULT) == EVT_OK);
  for (int lay = 0; lay < 3; lay++) {
    s.layout = (evt_gemm_layout)lay;
    int64_t m = 16, n = 24, k = 8;
    double a[128], b[192], d[384], bias[24], y[384], db[24];
    uint16_t ra[128], rb[192], rd[384], rbias[24], ry[384];
    float rdb[24];
    uint64_t sd = 99 + lay;
    for (int i = 0; i < 128; i++) a[i] = evt_round_to_dtype(lcg(&sd), EVT_BF16), ra[i] = bf16_bits(a[i]);
    for (int i = 0; i < 192; i++) b[i] = evt_round_to_dtype(lcg(&sd), EVT_BF16), rb[i] = bf16_bits(b[i]);
    for (int i = 0; i < 24; i++) bias[i] = evt_round_to_dtype(lcg(&sd), EVT_BF16), rbias[i] = bf16_bits(bias[i]);
    double *tens[EVT_KSPEC_MAX_NODES] = {0};
    /* nodes: acc, bias, add, relu (aux? no: D), row_sum dbias — find them by op */
    for (int v = 0; v < s.nnodes; v++) {
      if (s.nodes[v].op == EVT_V_ROW_BCAST) tens[v] = bias;
      if (s.nodes[v].op == EVT_V_ROW_SUM) tens[v] = db;
      if (s.nodes[v].op == EVT_V_AUX_STORE) tens[v] = y;
    }
    evt_kspec_reference(&s, m, n, k, a, b, tens, d);
    for (int i = 0; i < 384; i++) rd[i] = bf16_bits(d[i]), ry[i] = bf16_bits(y[i]);
    for (int i = 0; i < 24; i++) rdb[i] = (float)db[i];
    const void *mem[EVT_KSPEC_MAX_NODES] = {0};
    for (int v = 0; v < s.nnodes; v++) {
      if (s.nodes[v].op == EVT_V_ROW_BCAST) mem[v] = rbias;
      if (s.nodes[v].op == EVT_V_ROW_SUM) mem[v] = rdb;
      if (s.nodes[v].op == EVT_V_AUX_STORE) mem[v] = ry;
    }
    int64_t rows[2] = {3, 15}, cols[2] = {0, 17};
    CHECK(evt_tune_check_sampled(&s, m, n, k, ra, rb, mem, rd, rows, 2, cols, 2) < 1e-6);
    uint16_t keep = rd[3 * 24 + 5];
    rd[3 * 24 + 5] = bf16_bits(d[3 * 24 + 5] + 3.0); /* a sampled row */
    double multi = evt_tune_check_sampled(&s, m, n, k, ra, rb, mem, rd, rows, 2, cols, 2);
    CHECK(multi > 0.05);
    { /* the samples are independent jobs: one thread finds the same error as several */
      evt_tune_set_threads(1);
      CHECK(evt_tune_check_sampled(&s, m, n, k, ra, rb, mem, rd, rows, 2, cols, 2) == multi);
      evt_tune_set_threads(3);
      CHECK(evt_tune_check_sampled(&s, m, n, k, ra, rb, mem, rd, rows, 2, cols, 2) == multi);
      evt_tune_set_threads(0);
    }
    rd[3 * 24 + 5] = keep;
    rdb[17] += 5.0f; /* a sampled column's sum */
    CHECK(evt_tune_check_sampled(&s, m, n, k, ra, rb, mem, rd, rows, 2, cols, 2) > 0.05);
    rdb[17] -= 5.0f;
    rd[7 * 24 + 9] = 0x7fc0; /* NaN outside the samples is not seen; inside it is */
    CHECK(evt_tune_check_sampled(&s, m, n, k, ra, rb, mem, rd, rows, 2, cols, 2) < 1e-6);
    rd[15 * 24 + 9] = 0x7fc0;
    CHECK(isinf(evt_tune_check_sampled(&s, m, n, k, ra, rb, mem, rd, rows, 2, cols, 2)));
  }
}

/* The fused runtime's plan reads the records (EVT_CACHE_DIR/tune): no record → default config, "not tuned";
 * FUSED → the group's kernel gets the tuned config (new name) and launch-time scheduler; UNFUSED → one cuBLAS
 * call for a plain epilogue, else the fastest fused config with the measured times in its description. */
TEST(tune_records_steer_the_fused_plan) {
  char dir[128];
  tmpdir(dir, sizeof dir);
  const char *old = getenv("EVT_CACHE_DIR");
  char *saved = old ? strdup(old) : NULL;
  setenv("EVT_CACHE_DIR", dir, 1);
  evt_options opts;
  evt_options_init(&opts);
  char *err = NULL;
  evt_graph *g = evt_parse_file("bench/graphs/mlp_bf16.evt", &err);
  CHECK_MSG(g, "%s", err ? err : "");
  free(err);
  if (g) {
    CHECK(evt_train_ensure_joint(g, NULL) == EVT_OK);
    CHECK(evt_passes_run_all(g, 0, 0) == EVT_OK);
    evt_exec_plan p;
    CHECK(evt_exec_plan_build(g, &opts, &p) == EVT_OK);
    int gi = -1;
    for (int i = 0; i < p.ngroups && gi < 0; i++)
      if (p.groups[i].fused && p.groups[i].kind == EVT_LK_GEMM_EVT) gi = i;
    CHECK(gi >= 0);
    if (gi >= 0) {
      char before[40];
      snprintf(before, sizeof before, "%s", p.kname[p.groups[gi].kernel]);
      /* a tuned tile other than the untuned default (128x256 once N >= 256, lower_gemm.c): the kernel must change */
      int tn = p.gspec[p.groups[gi].kernel]->cfg.tile_n == 256 ? 128 : 256;
      CHECK(p.groups[gi].tuned == EVT_TUNE_NONE && strstr(p.groups[gi].tune_desc, "not tuned (default config"));
      evt_tune_record r;
      memset(&r, 0, sizeof r);
      r.spec_hash = evt_kspec_epilogue_hash(&p.low.k[gi].spec);
      r.m = p.groups[gi].m, r.n = p.groups[gi].n, r.k = p.groups[gi].k;
      snprintf(r.gpu, sizeof r.gpu, "Test GPU");
      r.choice = EVT_TUNE_UNFUSED;
      r.cfg = EVT_TILE_CONFIG_DEFAULT;
      r.fused_ms = 0.2, r.unfused_ms = 0.19; /* the pair 5% faster: under the runtime's margin */
      snprintf(r.unfused_how, sizeof r.unfused_how, "cublasLt + row kernel");
      char msg[256];
      r.source_hash = evt_tune_sources_hash(&p.low.k[gi].spec, &r);
      CHECK(evt_tune_record_write(NULL, &r, msg, sizeof msg) == EVT_OK);
      evt_exec_plan_free(&p);
      CHECK(evt_exec_plan_build(g, &opts, &p) == EVT_OK);
      /* UNFUSED: a plain epilogue runs as one cuBLAS call; an epilogue whose pair measured less than
       * EVT_EXEC_UNFUSED_MIN_GAIN faster keeps its kernel (in the record's config), and says so */
      const evt_group_exec *u = &p.groups[gi];
      const evt_kspec *us = &p.low.k[gi].spec;
      CHECK(u->fused && u->tuned == EVT_TUNE_UNFUSED &&
            strstr(u->tune_desc, "unfused (measured 0.1900 ms via cublasLt + row kernel vs fused 0.2000 ms)"));
      const int epi_nodes = us->nnodes; /* (us points into p, which is rebuilt below) */
      if (epi_nodes == 1) CHECK(u->blas && u->kernel < 0);
      if (epi_nodes > 1) {
        /* the in-step A/B (default): the kernel first (the pair measured < EVT_EXEC_UNFUSED_MIN_GAIN faster), the
         * pair bound too as the alternative (its row kernel compiled, T in the scratch); swapping exchanges them */
        const evt_group_exec *a = &p.alt[gi];
        int has_t = 0, uk = u->kernel;
        for (int i = 0; i < EVT_ROW_LAUNCH_MAX_PTRS; i++) has_t += a->rptr[i] == EVT_EXEC_PTR_T;
        CHECK_MSG(!u->blas && !u->unf && u->kernel >= 0 && u->ab && p.nab >= 1 && strstr(u->tune_desc, "runs fused") &&
                      strstr(u->tune_desc, "(in-step A/B)"),
                  "%s", u->tune_desc);
        CHECK_MSG(a->ab && a->fused && a->unf && a->kernel >= 0 && a->kernel != uk && p.kspec[a->kernel] == &p.urs[gi] &&
                      has_t == 1 && p.scratch_bytes >= p.t_offset + a->m * a->n * 2 && a->members == u->members &&
                      strstr(a->tune_desc, "runs unfused (in-step A/B)"),
                  "%s", a->tune_desc);
        const int ak = a->kernel;
        evt_exec_swap_alt(&p, gi);
        CHECK(p.groups[gi].unf && p.groups[gi].kernel == ak && !p.alt[gi].unf && p.alt[gi].kernel == uk);
        evt_exec_swap_alt(&p, gi);
        /* a kernel that fails to compile: the alternative's is dropped; the running one's hands over to it */
        evt_exec_plan_demote(&p, ak, "test");
        CHECK(!p.groups[gi].ab && p.groups[gi].fused && p.groups[gi].kernel == uk && p.nab == 0 &&
              strstr(p.groups[gi].tune_desc, "[no A/B"));
        evt_exec_plan_free(&p);
        CHECK(evt_exec_plan_build(g, &opts, &p) == EVT_OK);
        evt_exec_plan_demote(&p, uk, "test");
        CHECK(!p.groups[gi].ab && p.groups[gi].fused && p.groups[gi].unf && p.groups[gi].kernel == ak);
        /* fusion_ab 0: the margin alone decides: the kernel, and says why */
        opts.fusion_ab = 0;
        evt_exec_plan_free(&p);
        CHECK(evt_exec_plan_build(g, &opts, &p) == EVT_OK);
        opts.fusion_ab = 1;
        u = &p.groups[gi];
        CHECK_MSG(!u->blas && !u->unf && !u->ab && p.nab == 0 && u->kernel >= 0 && strstr(u->tune_desc, "pair < 10% faster"),
                  "%s", u->tune_desc);
        /* fusion_ab 2: every GEMM group with an epilogue the pair can run gets the A/B, recorded or not */
        opts.fusion_ab = 2;
        evt_exec_plan_free(&p);
        CHECK(evt_exec_plan_build(g, &opts, &p) == EVT_OK);
        opts.fusion_ab = 1;
        int nab = 0, ngemm_epi = 0;
        for (int i = 0; i < p.ngroups; i++) {
          nab += p.groups[i].ab;
          ngemm_epi += p.groups[i].fused && p.groups[i].kind == EVT_LK_GEMM_EVT && !p.groups[i].blas;
        }
        CHECK_MSG(nab == p.nab && nab > 1 && nab >= ngemm_epi - 1, "%d A/B groups of %d", nab, ngemm_epi);
      }
      r.choice = EVT_TUNE_FUSED;
      r.cfg = (evt_tile_config){128, tn, 64, 1, 1, EVT_SCHED_COOPERATIVE, 0, EVT_RED_ATOMIC};
      r.swizzle = 4, r.raster = 1;
      r.fused_ms = 0.05;
      r.source_hash = evt_tune_sources_hash(&p.low.k[gi].spec, &r);
      CHECK(evt_tune_record_write(NULL, &r, msg, sizeof msg) == EVT_OK);
      evt_exec_plan_free(&p);
      CHECK(evt_exec_plan_build(g, &opts, &p) == EVT_OK);
      const evt_group_exec *x = &p.groups[gi];
      CHECK(x->fused && x->tuned == EVT_TUNE_FUSED && x->swizzle == 4 && x->raster == 1);
      CHECK(x->kernel >= 0 && strcmp(p.kname[x->kernel], before) && p.gspec[x->kernel]->cfg.tile_n == tn);
      char want[80];
      snprintf(want, sizeof want, "fused 128x%dx64 c1x1 coop swizzle 4 along-M (0.0500 ms", tn);
      CHECK_MSG(strstr(x->tune_desc, want), "%s", x->tune_desc);
      CHECK(!x->ab); /* the pair measured 3.8x slower: no in-step A/B */
      if (epi_nodes > 1) { /* FUSED, the pair within EVT_EXEC_UNFUSED_MIN_GAIN: both bound for the in-step A/B */
        r.fused_ms = 0.2, r.unfused_ms = 0.21;
        CHECK(evt_tune_record_write(NULL, &r, msg, sizeof msg) == EVT_OK);
        evt_exec_plan_free(&p);
        CHECK(evt_exec_plan_build(g, &opts, &p) == EVT_OK);
        x = &p.groups[gi];
        CHECK_MSG(x->fused && x->tuned == EVT_TUNE_FUSED && x->ab && !x->unf && p.alt[gi].unf && p.alt[gi].ab &&
                      strstr(x->tune_desc, "runs fused (in-step A/B: the pair within 10%)"),
                  "%s", x->tune_desc);
        r.fused_ms = 0.05, r.unfused_ms = 0.19; /* back to the record above */
        CHECK(evt_tune_record_write(NULL, &r, msg, sizeof msg) == EVT_OK);
        evt_exec_plan_free(&p);
        CHECK(evt_exec_plan_build(g, &opts, &p) == EVT_OK);
        x = &p.groups[gi];
        CHECK(!x->ab);
      }
      /* what the tuner measures: every problem with the config its groups run untuned (the tuned group's
       * too, not the record's), and that config is the first candidate (so default_ms is the untuned time) */
      evt_tune_problem *probs = NULL;
      int *prob_of = calloc((size_t)p.low.n, sizeof *prob_of);
      int np = evt_tune_collect(&p.low, NULL, &probs, prob_of);
      CHECK(np >= 2 && prob_of[gi] >= 0);
      for (int i = 0; i < p.low.n; i++) {
        const evt_lowered *L = &p.low.k[i];
        if (prob_of[i] < 0) continue;
        const evt_tile_config *pc = &probs[prob_of[i]].spec.cfg;
        evt_tile_config want_cfg = evt_lower_untuned_config(&L->spec, L->m, L->n, L->k);
        char a[96], b[96];
        evt_tile_config_label(pc, a, sizeof a);
        evt_tile_config_label(&want_cfg, b, sizeof b);
        CHECK_MSG(!strcmp(a, b), "group %d: problem config %s, untuned %s", i, a, b);
        if (p.groups[i].tuned == EVT_TUNE_NONE) /* (no record: it runs the untuned config) */
          CHECK_MSG(!strcmp(a, evt_tile_config_label(&L->spec.cfg, b, sizeof b)), "group %d: %s vs %s", i, a, b);
        evt_tile_config c[EVT_TUNE_MAX_CAND];
        CHECK(evt_tune_candidates(&probs[prob_of[i]].spec, L->m, L->n, L->k, c, EVT_TUNE_MAX_CAND) >= 1 &&
              !strcmp(evt_tile_config_label(&c[0], b, sizeof b), a));
      }
      {
        char a[96];
        CHECK_MSG(strcmp(evt_tile_config_label(&probs[prob_of[gi]].spec.cfg, a, sizeof a),
                         evt_tile_config_label(&p.low.k[gi].spec.cfg, want, sizeof want)),
                  "the tuned group's problem kept the record's config %s", a);
      }
      free(probs);
      free(prob_of);
      /* the same record measured on kernels the emitter no longer generates: not applied, and said so */
      r.source_hash ^= 1;
      CHECK(evt_tune_record_write(NULL, &r, msg, sizeof msg) == EVT_OK);
      evt_exec_plan_free(&p);
      CHECK(evt_exec_plan_build(g, &opts, &p) == EVT_OK);
      x = &p.groups[gi];
      CHECK_MSG(x->tuned == EVT_TUNE_NONE && !strcmp(p.kname[x->kernel], before) &&
                    strstr(x->tune_desc, "not tuned (its record is stale"),
                "%s", x->tune_desc);
      evt_exec_plan_free(&p);
    }
    evt_graph_free(g);
  }
  if (saved) {
    setenv("EVT_CACHE_DIR", saved, 1);
    free(saved);
  } else {
    unsetenv("EVT_CACHE_DIR");
  }
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  CHECK(system(cmd) == 0);
}

/* Without a GPU nothing is compiled, measured or written, and the caller hears why. */
TEST(tune_without_a_device_keeps_the_default) {
  if (access("/dev/nvidiactl", F_OK) == 0) return; /* (a machine with a GPU would measure) */
  char dir[128];
  tmpdir(dir, sizeof dir);
  evt_kspec s;
  CHECK(evt_kspec_example(&s, "bias_gelu_aux", EVT_TILE_CONFIG_DEFAULT) == EVT_OK);
  evt_tune_options o = {0};
  o.cache_dir = dir;
  evt_tune_record r;
  char msg[256] = "";
  CHECK(evt_tune_run(&s, 256, 256, 256, &o, &r, msg, sizeof msg) == EVT_ERR_UNSUPPORTED);
  CHECK(strstr(msg, "no CUDA device") && strstr(msg, "default config"));
  evt_kspec t = s;
  CHECK(evt_tune_apply(&t, 256, 256, 256, dir, NULL, &r) == EVT_TUNE_NONE);
  CHECK(!memcmp(&t.cfg, &s.cfg, sizeof t.cfg));
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  CHECK(system(cmd) == 0);
}

/* A GPU that heats as it works: each timed call reads `drift` slower than the one before, whichever
 * implementation it is. Records the order of the calls; fails call number fail_at (0: never). */
typedef struct heat_timer {
  double base[2], drift;
  int calls, fail_at, seq[32];
} heat_timer;

static int heat_time(void *p, int which, double *ms) {
  heat_timer *h = p;
  if (h->fail_at && h->calls + 1 == h->fail_at) return 7;
  h->seq[h->calls] = which;
  *ms = h->base[which] * (1.0 + h->drift * h->calls);
  h->calls++;
  return 0;
}

/* The final fused-vs-unfused comparison alternates the two (0 1, 1 0, 0 1, 1 0) over an even number of rounds
 * and keeps each one's median, so a clock drift that would hand a sequential comparison to whichever ran first
 * cancels. */
TEST(tune_interleave_alternates_and_takes_medians) {
  heat_timer h = {{1.0, 1.0}, 0.05, 0, 0, {0}};
  double ms[2] = {-1, -1};
  CHECK(evt_tune_interleave(3, heat_time, &h, ms) == 0); /* 3 rounds -> 4 */
  CHECK(h.calls == 8);
  int want[8] = {0, 1, 1, 0, 0, 1, 1, 0};
  for (int i = 0; i < 8; i++) CHECK(h.seq[i] == want[i]);
  /* equal implementations on a GPU 5% slower per call: fused at calls 0 3 4 7, unfused at 1 2 5 6, both
   * medians 1.175 (timed one after the other, 4 calls each, the second would read 20% slower) */
  CHECK_NEAR(ms[0], 1.175, 1e-12);
  CHECK_NEAR(ms[1], 1.175, 1e-12);
  /* a 3% faster unfused pair wins although the drift per call is larger than the difference */
  heat_timer h2 = {{1.0, 0.97}, 0.05, 0, 0, {0}};
  CHECK(evt_tune_interleave(5, heat_time, &h2, ms) == 0);
  CHECK(h2.calls == 12 && ms[1] < ms[0]);
  CHECK_NEAR(ms[0], 1.275, 1e-12);
  CHECK_NEAR(ms[1], 0.97 * 1.275, 1e-12);
  /* no drift: the implementations' own times; rounds < 2 still time each twice */
  heat_timer h3 = {{2.0, 1.0}, 0.0, 0, 0, {0}};
  CHECK(evt_tune_interleave(2, heat_time, &h3, ms) == 0 && h3.calls == 4);
  CHECK_NEAR(ms[0], 2.0, 1e-12);
  CHECK_NEAR(ms[1], 1.0, 1e-12);
  heat_timer h4 = {{2.0, 1.0}, 0.0, 0, 0, {0}};
  CHECK(evt_tune_interleave(0, heat_time, &h4, ms) == 0 && h4.calls == 4);
  /* a timing error stops the comparison, returns the code and leaves ms alone */
  heat_timer h5 = {{1.0, 1.0}, 0.0, 0, 3, {0}};
  ms[0] = ms[1] = -1;
  CHECK(evt_tune_interleave(3, heat_time, &h5, ms) == 7);
  CHECK(ms[0] == -1 && ms[1] == -1 && h5.calls == 2);
}
