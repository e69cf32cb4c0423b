/* A tiny unit-test harness. In a test file under tests/c:
 *   TEST(parse_roundtrip) { CHECK(x == 1); CHECK_NEAR(a, b, 1e-6); }
 * Tests register themselves; build/unit_tests runs them all (or those whose name contains argv[1]) and
 * prints "unit: N passed, N failed". A failed CHECK reports file:line and fails the test. */
#ifndef EVT_TEST_H
#define EVT_TEST_H
#include "ir/ir.h"

#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "codegen/kspec.h"
#include "runtime/jit/jit.h"

typedef void (*evt_test_fn)(void);
void evt_test_register(const char *name, evt_test_fn fn);
void evt_test_fail(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#define TEST(name)                                                                              \
  static void name(void);                                                                       \
  __attribute__((constructor)) static void evt_test_reg_##name(void) { evt_test_register(#name, name); } \
  static void name(void)

#define CHECK(cond)                                                 \
  do {                                                              \
    if (!(cond)) evt_test_fail(__FILE__, __LINE__, "%s", #cond);   \
  } while (0)
#define CHECK_MSG(cond, ...)                                        \
  do {                                                              \
    if (!(cond)) evt_test_fail(__FILE__, __LINE__, __VA_ARGS__);    \
  } while (0)
#define CHECK_NEAR(a, b, tol)                                                                         \
  do {                                                                                                \
    double evt_a_ = (a), evt_b_ = (b);                                                                \
    if (!(fabs(evt_a_ - evt_b_) <= (tol)))                                                            \
      evt_test_fail(__FILE__, __LINE__, "%s = %.9g, %s = %.9g, tolerance %g", #a, evt_a_, #b, evt_b_, (double)(tol)); \
  } while (0)
/* Helpers shared by the test files: nodes of op `op` in g; a graph parsed from text (a failed parse is a test
 * failure, with the parser's message, and returns NULL). */
static inline int evt_test_count_op(const evt_graph *g, evt_op op) {
  int c = 0;
  for (int i = 0; i < g->nnodes; i++) c += g->nodes[i].op == op;
  return c;
}
static inline evt_graph *evt_test_parse_ok(const char *text) {
  char *err = NULL;
  evt_graph *g = evt_parse(text, "t.evt", &err);
  CHECK_MSG(g != NULL, "parse failed: %s", err ? err : "(no message)");
  free(err);
  return g;
}
/* The largest |value| over the graph outputs other than the loss in values (evt_cuda_rel_error's floor for a
 * step's gradients is 0.1 x it: a gradient that is 0 in exact arithmetic holds only rounding noise). */
static inline double evt_test_output_scale(const evt_graph *g, const evt_tensor *values) {
  double sc = 0;
  for (int k = 0; k < g->noutputs; k++)
    if (g->outputs[k] != g->loss)
      for (int64_t i = 0; i < values[g->outputs[k]].numel; i++) sc = fmax(sc, fabs(values[g->outputs[k]].data[i]));
  return sc;
}
/* The fp64 rule for a 16-bit output of the fused CPU model (evtc run --check's idea): its distance to the exact
 * answer is at most max(the per-node interpreter's distance, 1e-2) + 1e-2. */
static inline bool evt_test_near_exact(double model_to_exact, double interp_to_exact) {
  return model_to_exact <= fmax(interp_to_exact, 1e-2) + 1e-2;
}
/* A fresh empty directory /tmp/evt-<tag>-<pid>-XXXXXX in out (a failure is a test failure), and its removal. */
static inline void evt_test_tmpdir(char *out, size_t len, const char *tag) {
  snprintf(out, len, "/tmp/evt-%s-%ld-XXXXXX", tag, (long)getpid());
  CHECK(mkdtemp(out) != NULL);
}
static inline void evt_test_rmdir(const char *dir) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  CHECK(system(cmd) == 0);
}
/* The evtc of the build under test: beside the running unit_tests (build/ or build-asan/), else build/evtc. */
static inline const char *evt_test_evtc(void) {
  static char path[1024];
  ssize_t n = readlink("/proc/self/exe", path, sizeof path - 8);
  if (n <= 0) return "build/evtc";
  path[n] = 0;
  char *slash = strrchr(path, '/');
  if (!slash) return "build/evtc";
  strcpy(slash + 1, "evtc");
  return path;
}
/* Saves the environment variables keys[0..n) into saved[] (strdup'd or NULL) / puts them back and frees. */
static inline void evt_test_env_save(const char *const *keys, int n, char **saved) {
  for (int i = 0; i < n; i++) saved[i] = getenv(keys[i]) ? strdup(getenv(keys[i])) : NULL;
}
static inline void evt_test_env_restore(const char *const *keys, int n, char **saved) {
  for (int i = 0; i < n; i++) {
    if (saved[i]) setenv(keys[i], saved[i], 1);
    else unsetenv(keys[i]);
    free(saved[i]);
  }
}
/* CI check of generated CUDA C++ (no GPU needed): nvcc's front end (-cuda: parsing and every template
 * instantiation) over spec s's CUTLASS kernel, cached by source hash like any JIT result. Needs nvcc and the
 * CUTLASS 4.2 headers (CUTLASS_PATH, ./.cutlass from scripts/setup.sh, or the nvidia-cutlass package); without
 * them it prints a note naming `test` and checks nothing. */
static inline void evt_test_nvcc_frontend(const char *test, const evt_kspec *s) {
  evt_jit_options o = {.kernels_dir = "kernels", .jobs = 1, .quiet = 1, .frontend_only = 1};
  struct stat st;
  if (!getenv("CUTLASS_PATH") && stat(".cutlass/cutlass_library/source/include/cutlass/cutlass.h", &st) == 0)
    o.cutlass_path = ".cutlass/cutlass_library/source";
  char inc[1024], util[1024];
  if (evt_jit_find_cutlass(o.cutlass_path, inc, sizeof inc, util, sizeof util) != EVT_OK ||
      system("nvcc --version >/dev/null 2>&1") != 0) {
    fprintf(stderr, "note: %s: no nvcc or CUTLASS here, nothing checked\n", test);
    return;
  }
  char err[256], name[40], msg[4096];
  char *src = evt_emit_cutlass(s, err, sizeof err);
  CHECK_MSG(src != NULL, "%s: emission refused: %s", test, err);
  if (!src) return;
  evt_kspec_kernel_name(s, name);
  evt_jit_job job = {.name = name, .source = src};
  evt_status stt = evt_jit_compile(&job, 1, &o, msg, sizeof msg);
  CHECK_MSG(stt == EVT_OK && job.ok, "%s: %s %s", test, msg, job.error);
  free(src);
}

#endif
