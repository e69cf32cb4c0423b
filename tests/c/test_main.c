/* Runner for the tests registered with TEST() (tests/c/test.h). */
#include "test.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  const char *name;
  evt_test_fn fn;
} test_entry;
static test_entry tests[1024];
static int ntests;
static int current_failed;

void evt_test_register(const char *name, evt_test_fn fn) {
  if (ntests == EVT_ARRAY_LEN(tests)) evt_fatal(__FILE__, __LINE__, "too many tests");
  tests[ntests++] = (test_entry){name, fn};
}

void evt_test_fail(const char *file, int line, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stdout, "  %s:%d: ", file, line);
  vfprintf(stdout, fmt, ap);
  fputc('\n', stdout);
  va_end(ap);
  current_failed = 1;
}

static int by_name(const void *a, const void *b) {
  return strcmp(((const test_entry *)a)->name, ((const test_entry *)b)->name);
}

int main(int argc, char **argv) {
  qsort(tests, (size_t)ntests, sizeof tests[0], by_name);
  int passed = 0, failed = 0;
  for (int i = 0; i < ntests; i++) {
    if (argc > 1 && !strstr(tests[i].name, argv[1])) continue;
    current_failed = 0;
    tests[i].fn();
    printf("%s %s\n", current_failed ? "FAIL" : "ok  ", tests[i].name);
    fflush(stdout);
    if (current_failed) failed++; else passed++;
  }
  printf("unit: %d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
