/* Batched GEMM + epilogue visitor trees (kernel spec batch mode, batched CPU reference, emitter, lowering
 * of bmm groups). The nvcc front-end check runs only where nvcc and CUTLASS are installed. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "evt/kspec.h"
#include "runtime/jit.h"
#include "test.h"

static const evt_tile_config bcfg = {128, 128, 64, 1, 1, EVT_SCHED_COOPERATIVE};

TEST(bmm_kspec_text_and_check) {
  evt_kspec s;
  char err[256], text[2048];
  CHECK(evt_kspec_example(&s, "bmm_scale_mask_stats", bcfg) == EVT_OK);
  CHECK(s.batched == 1);
  CHECK(evt_kspec_check(&s, err, sizeof err) == EVT_OK);
  evt_kspec_text(&s, text, sizeof text);
  CHECK(strstr(text, "\nbatched\n") != NULL);
  CHECK(strstr(text, "bias:bf16 shared") != NULL && strstr(text, "colstat:f32 shared") != NULL);
  CHECK(strstr(text, "mask:bf16 shared") == NULL);
  /* the batch mode and sharing are part of the kernel's name */
  uint64_t h = evt_kspec_hash(&s);
  s.nodes[2].shared = 1;
  CHECK(evt_kspec_hash(&s) != h);
  s.nodes[2].shared = 0;
  s.batched = 0;
  CHECK(evt_kspec_check(&s, err, sizeof err) == EVT_ERR_INVALID && strstr(err, "'shared' needs a batched spec"));
  /* an unbatched spec's text has no batch line (existing kernel names do not change) */
  evt_kspec p;
  CHECK(evt_kspec_example(&p, "plain", bcfg) == EVT_OK);
  evt_kspec_text(&p, text, sizeof text);
  CHECK(strstr(text, "batched") == NULL);
  /* a shared aux store would race between batches */
  CHECK(evt_kspec_example(&s, "bmm_plain", bcfg) == EVT_OK);
  int st = evt_kspec_add(&s, EVT_V_AUX_STORE, 0, -1, EVT_BF16, "z");
  s.nodes[st].shared = 1;
  s.d_node = st;
  CHECK(evt_kspec_check(&s, err, sizeof err) == EVT_ERR_UNSUPPORTED && strstr(err, "batches would race"));
}

static uint64_t rng_state = 88172645463325252ull;
static double urand(double lo, double hi) {
  rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
  return lo + (hi - lo) * (double)(rng_state >> 11) / 9007199254740992.0;
}
static double bf(double x) { return evt_round_to_dtype(x, EVT_BF16); }

/* The batched reference against a naive per-batch evaluation written here for each example, over every
 * layout: A, B per batch; mask / p / rowdot per batch; bias and colstat shared by all batches. */
TEST(bmm_reference_matches_naive_per_batch) {
  const char *names[] = {"bmm_plain", "bmm_scale", "bmm_scale_mask_stats", "bmm_softmax_bwd"};
  const int64_t L = 3, M = 5, N = 4, K = 6;
  for (int e = 0; e < 4; e++)
    for (int lay = 0; lay < 3; lay++) {
      evt_kspec s;
      CHECK(evt_kspec_example(&s, names[e], bcfg) == EVT_OK);
      s.layout = (evt_gemm_layout)lay;
      int at = lay == EVT_LAYOUT_TN, bt = lay == EVT_LAYOUT_NT;
      double a[L * M * K], b[L * K * N], d[L * M * N];
      for (int64_t i = 0; i < L * M * K; i++) a[i] = bf(urand(-1, 1));
      for (int64_t i = 0; i < L * K * N; i++) b[i] = bf(urand(-1, 1));
      double *tens[EVT_KSPEC_MAX_NODES] = {0};
      double store[EVT_KSPEC_MAX_NODES][L * M * N];
      for (int v = 0; v < s.nnodes; v++) {
        int64_t n = evt_vnode_numel(&s, v, M, N) * (s.nodes[v].shared ? 1 : L);
        if (!n) continue;
        tens[v] = store[v];
        for (int64_t i = 0; i < n; i++) store[v][i] = evt_vop_class(s.nodes[v].op) == 'L' ? bf(urand(-2, 2)) : 1e30;
      }
      evt_kspec_reference_batched(&s, L, M, N, K, a, b, tens, d);
      double rowstat[L * M], colstat[N];
      memset(rowstat, 0, sizeof rowstat);
      memset(colstat, 0, sizeof colstat);
      for (int64_t l = 0; l < L; l++)
        for (int64_t i = 0; i < M; i++)
          for (int64_t j = 0; j < N; j++) {
            double acc = 0;
            for (int64_t k = 0; k < K; k++)
              acc += a[l * M * K + (at ? k * M + i : i * K + k)] * b[l * K * N + (bt ? j * K + k : k * N + j)];
            acc = (double)(float)acc;
            double want = acc;
            if (e == 1) want = acc * 0.125;
            if (e == 2) {
              want = acc * 0.125 + store[2][l * M * N + i * N + j] + store[3][j];
              rowstat[l * M + i] += want;
              colstat[j] += want;
            }
            if (e == 3) want = store[2][l * M * N + i * N + j] * (acc - store[1][l * M + i]) * 0.125;
            CHECK_NEAR(d[l * M * N + i * N + j], bf(want), 1e-12);
          }
      if (e == 2) {
        for (int64_t i = 0; i < L * M; i++) CHECK_NEAR(store[7][i], rowstat[i], 1e-9);
        for (int64_t j = 0; j < N; j++) CHECK_NEAR(store[8][j], colstat[j], 1e-9);
      }
    }
}

/* The batched launcher: problem (M, N, K, L), strides from the launch's leading dims / batch strides,
 * shared nodes with batch stride 0, the outer batch loop. */
TEST(bmm_emitted_launcher) {
  evt_kspec s;
  char err[256];
  CHECK(evt_kspec_example(&s, "bmm_scale_mask_stats", bcfg) == EVT_OK);
  s.layout = EVT_LAYOUT_NT;
  char *src = evt_emit_cutlass(&s, err, sizeof err);
  CHECK_MSG(src != NULL, "%s", err);
  if (!src) return;
  CHECK(strstr(src, "{M, N, K, L}") != NULL);
  CHECK(strstr(src, "bstride<typename GemmKernel::StrideA>(lda, bsa)") != NULL);
  CHECK(strstr(src, "int64_t ldb = a->ldb ? a->ldb : (int64_t)K") || strstr(src, "ldb = a->ldb ? a->ldb : (int64_t)K"));
  CHECK(strstr(src, "int64_t bs3 = 0, os3 = 0;  // bias: shared by all batches") != NULL);
  CHECK(strstr(src, "bs2 = a->bs_ptrs[2] ? a->bs_ptrs[2] : (int64_t)M * ld2") != NULL);
  CHECK(strstr(src, "Sm90ColReduction<cutlass::plus, cutlass::plus, cutlass::atomic_add, 0, TileShape, float, float, RN, "
                    "Stride<_1, _0, int64_t>>") != NULL);
  CHECK(strstr(src, "if (LO > 1) return EVT_LAUNCH_CANNOT_IMPLEMENT;") != NULL); /* a shared sum */
  CHECK(strstr(src, "for (int64_t o = 0; o < LO; o++)") != NULL);
  free(src);
  /* without shared sums, two batch levels are fine */
  CHECK(evt_kspec_example(&s, "bmm_softmax_bwd", bcfg) == EVT_OK);
  src = evt_emit_cutlass(&s, err, sizeof err);
  CHECK(src && !strstr(src, "if (LO > 1)"));
  free(src);
  /* unbatched kernels are emitted as before */
  CHECK(evt_kspec_example(&s, "bias_relu_dbias", bcfg) == EVT_OK);
  src = evt_emit_cutlass(&s, err, sizeof err);
  CHECK(src && !strstr(src, "bstride") && strstr(src, "{M, N, K, 1}"));
  free(src);
}

/* nvcc front end (parsing + every template instantiation) over one batched kernel: attention scores
 * (layout NT) with scale, a per-batch aux mask, a shared bias and per-batch / shared sums. */
TEST(ci_nvcc_frontend_accepts_batched_kernel) {
  evt_jit_options o = {.kernels_dir = "kernels", .jobs = 1, .quiet = 1, .frontend_only = 1};
  struct stat st;
  if (!getenv("CUTLASS_PATH") && stat(".cutlass/cutlass_library/source/include/cutlass/cutlass.h", &st) == 0)
    o.cutlass_path = ".cutlass/cutlass_library/source";
  char inc[1024], util[1024];
  if (evt_jit_find_cutlass(o.cutlass_path, inc, sizeof inc, util, sizeof util) != EVT_OK ||
      system("nvcc --version >/dev/null 2>&1") != 0) {
    fprintf(stderr, "note: ci_nvcc_frontend_accepts_batched_kernel: no nvcc or CUTLASS here, nothing checked\n");
    return;
  }
  evt_kspec s;
  char err[256], name[40], msg[4096];
  CHECK(evt_kspec_example(&s, "bmm_scale_mask_stats", bcfg) == EVT_OK);
  s.layout = EVT_LAYOUT_NT;
  char *src = evt_emit_cutlass(&s, err, sizeof err);
  CHECK(src != NULL);
  if (!src) return;
  evt_kspec_kernel_name(&s, name);
  evt_jit_job job = {.name = name, .source = src};
  evt_status stt = evt_jit_compile(&job, 1, &o, msg, sizeof msg);
  CHECK_MSG(stt == EVT_OK && job.ok, "%s %s", msg, job.error);
  free(src);
}
