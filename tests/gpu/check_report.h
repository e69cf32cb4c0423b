// The pass / fail tally every tests/gpu/check_*.cu program prints: one "ok" / "FAIL" line per case, then
// "N passed, N failed" (tests/gpu/run.sh reads it) and the exit status.
#ifndef EVT_CHECK_REPORT_H
#define EVT_CHECK_REPORT_H

#include <cstdarg>
#include <cstdio>

static int g_pass = 0, g_fail = 0;

static void report(bool ok, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("%s ", ok ? "ok  " : "FAIL");
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
  fflush(stdout);  // (a crash later still shows the cases before it)
  (ok ? g_pass : g_fail)++;
}

// The summary line; the program's exit status (1 when a case failed).
static int report_summary() {
  printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail ? 1 : 0;
}

#endif
