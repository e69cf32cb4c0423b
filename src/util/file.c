/* Whole files and folders (contract in util.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "util/util.h"

char *evt_read_stream(FILE *f, size_t *len) {
  size_t cap = 65536, n = 0, r;
  char *buf = malloc(cap + 1);
  while (buf && (r = fread(buf + n, 1, cap - n, f)) > 0) {
    n += r;
    if (n < cap) continue;
    char *bigger = realloc(buf, 2 * cap + 1);
    if (!bigger) free(buf);
    buf = bigger, cap *= 2;
  }
  if (buf && ferror(f)) free(buf), buf = NULL;
  if (buf) buf[n] = 0, *len = n;
  return buf;
}

char *evt_read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *buf = evt_read_stream(f, len);
  fclose(f);
  return buf;
}

int evt_mkdirs(const char *path, unsigned mode) {
  char p[4096];
  if (snprintf(p, sizeof p, "%s", path) >= (int)sizeof p) return errno = ENAMETOOLONG, -1;
  for (char *c = p + 1; *c; c++)
    if (*c == '/') {
      *c = 0;
      if (mkdir(p, (mode_t)mode) != 0 && errno != EEXIST) return -1;
      *c = '/';
    }
  return mkdir(p, (mode_t)mode) != 0 && errno != EEXIST ? -1 : 0;
}
