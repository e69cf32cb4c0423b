/* Bump allocator: everything a graph owns lives here and is freed with one call. */
#include "ir/ir.h"

#include <stdlib.h>
#include <string.h>

struct evt_arena_block {
  evt_arena_block *next;
  size_t used, cap;
  _Alignas(16) unsigned char data[];
};

void *evt_arena_alloc(evt_arena *a, size_t size) {
  size = (size + 15) & ~(size_t)15;
  evt_arena_block *b = a->head;
  if (!b || b->used + size > b->cap) {
    size_t cap = size > 65536 ? size : 65536;
    b = malloc(sizeof *b + cap);
    if (!b) evt_fatal(__FILE__, __LINE__, "out of memory (%zu bytes)", size);
    b->next = a->head;
    b->used = 0;
    b->cap = cap;
    a->head = b;
  }
  void *p = b->data + b->used;
  b->used += size;
  memset(p, 0, size);
  return p;
}

char *evt_arena_strdup(evt_arena *a, const char *s) {
  size_t n = strlen(s);
  char *p = evt_arena_alloc(a, n + 1);
  memcpy(p, s, n + 1);
  return p;
}

void evt_arena_free(evt_arena *a) {
  evt_arena_block *b = a->head;
  while (b) {
    evt_arena_block *next = b->next;
    free(b);
    b = next;
  }
  a->head = NULL;
}
