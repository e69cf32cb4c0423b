/* FNV-1a 64 (contract in util.h): kernel names, cache keys. */
#include "util/util.h"

uint64_t evt_hash_bytes(uint64_t h, const void *data, size_t n) {
  if (h == 0) h = 14695981039346656037ull;
  const unsigned char *p = data;
  for (size_t i = 0; i < n; i++) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}
