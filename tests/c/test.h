/* A tiny unit-test harness. In a test file under tests/c:
 *   TEST(parse_roundtrip) { CHECK(x == 1); CHECK_NEAR(a, b, 1e-6); }
 * Tests register themselves; build/unit_tests runs them all (or those whose name contains argv[1]) and
 * prints "unit: N passed, N failed". A failed CHECK reports file:line and fails the test. */
#ifndef EVT_TEST_H
#define EVT_TEST_H
#include "evt_impl.h"

#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

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
#endif
