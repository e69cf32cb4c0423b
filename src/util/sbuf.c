/* A growing text buffer, and bounded messages (contract in util.h). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "util/util.h"

void evt_sbuf_printf(evt_sbuf *b, const char *fmt, ...) {
  va_list ap, ap2;
  va_start(ap, fmt);
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  EVT_ASSERT(n >= 0);
  if (b->len + (size_t)n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 8192;
    while (cap < b->len + (size_t)n + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    EVT_ASSERT(p);
    b->p = p;
    b->cap = cap;
  }
  vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap2);
  va_end(ap2);
  b->len += (size_t)n;
}

void evt_msgf(char *msg, size_t len, const char *fmt, ...) {
  if (!msg || !len) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, len, fmt, ap);
  va_end(ap);
}
