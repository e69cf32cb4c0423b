/* evt's base layer: internal-bug assertions, a growing text buffer, hashing, whole files, the clock. Everything
 * in src/ may use it; it uses nothing of evt's. */
#ifndef EVT_UTIL_H
#define EVT_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

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
/* Formats into msg (at most len bytes, NUL-terminated); nothing when msg is NULL or len 0. */
void evt_msgf(char *msg, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* ---- file.c: whole files and folders -------------------------------------------------------------------- */
/* The rest of f (a file, stdin) malloc'd and NUL-terminated, *len its size (a NUL inside stays); NULL on a read
 * error or without memory. */
char *evt_read_stream(FILE *f, size_t *len);
/* The whole file at path as evt_read_stream reads it; NULL also when it cannot be opened. */
char *evt_read_file(const char *path, size_t *len);
/* mkdir -p: creates every missing folder of path with mode (before the umask). 0, or -1 with errno. */
int evt_mkdirs(const char *path, unsigned mode);

/* ---- clock.c ----------------------------------------------------------------------------------------- */
double evt_now_s(void); /* CLOCK_MONOTONIC in seconds */

#endif
