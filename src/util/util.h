/* evt's base layer: internal-bug assertions, a growing text buffer, hashing. Everything in src/ may use it;
 * it uses nothing of evt's. */
#ifndef EVT_UTIL_H
#define EVT_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* ---- fatal.c: internal bugs abort with file:line (always on) ------------------------------------------ */
void evt_fatal(const char *file, int line, const char *fmt, ...) __attribute__((noreturn, format(printf, 3, 4)));
#define EVT_ASSERT(cond)                                                         \
  do {                                                                           \
    if (!(cond)) evt_fatal(__FILE__, __LINE__, "assertion failed: %s", #cond);   \
  } while (0)
#define EVT_UNREACHABLE() evt_fatal(__FILE__, __LINE__, "unreachable")
#define EVT_ARRAY_LEN(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* ---- hash.c ------------------------------------------------------------------------------------------ */
uint64_t evt_hash_bytes(uint64_t h, const void *data, size_t n);  /* FNV-1a 64; start with h = 0 */

/* ---- sbuf.c: a growing text buffer (the source emitters, reports) ------------------------------------ */
typedef struct evt_sbuf {
  char *p;          /* NUL-terminated text, malloc'd; the caller owns it */
  size_t len, cap;
} evt_sbuf;
void evt_sbuf_printf(evt_sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
