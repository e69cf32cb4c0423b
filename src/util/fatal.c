/* Internal bugs: a message with file:line on stderr, then abort (contract in util.h). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "util/util.h"

void evt_fatal(const char *file, int line, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "evt: internal error at %s:%d: ", file, line);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  abort();
}
