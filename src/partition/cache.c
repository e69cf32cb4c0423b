/* cache.c — solutions of isomorphic blocks are reused.
 *
 * Canonical form: Weisfeiler–Lehman colour refinement over the block's labelled structure (node label =
 * op/dtype/shape class/flags, bytes, forced write, in-degrees; typed directed edges: variable (with
 * bytes and FUSE), fixed arcs, related and unrelated incompatible pairs), then nodes sorted by (final
 * colour, local index). The key is the whole block written out in that canonical order, so two blocks
 * with equal keys are isomorphic through their canonical orders *by construction* — a hash collision or
 * an ambiguous WL colouring can only cost a miss, never a wrong answer. The stored solution is in
 * canonical positions and is mapped back through the order. Entries live in memory and, if a directory
 * is given, in files <dir>/partition-<fnv64 of key>.txt (key line, "optimal n g0 g1 ...", "cost C", checksum;
 * util/cachedir.h). A hit whose grouping the current cost model does not give its stored cost is a miss. */
#include "partition/partition.h"
#include "util/cachedir.h"
#include "util/env.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct entry {
  uint64_t hash;
  char *key;
  int n, optimal;
  int *sol;     /* canonical positions -> canonical group label */
  double cost;  /* evt_pblock_cost of the solution when it was stored */
} entry;

struct evt_part_cache {
  char *dir;    /* NULL: memory only */
  int levels;   /* folders checked from dir up (util/cachedir.h) */
  entry *e;
  int n, cap;
  int *slot;        /* open addressing by key hash: entry index or -1 */
  size_t nslot;
};

const char *evt_part_cache_default_dir(char *buf, size_t n) {
  evt_env_cache_dir("partition", buf, n);
  return buf;
}

evt_part_cache *evt_part_cache_new(const char *dir, int levels) {
  evt_part_cache *c = calloc(1, sizeof *c);
  EVT_ASSERT(c);
  char why[1200];
  c->levels = levels;
  if (dir && *dir && evt_cache_dir_private(dir, levels, 0, why, sizeof why) != -1) c->dir = strdup(dir);
  return c;
}

void evt_part_cache_free(evt_part_cache *c) {
  if (!c) return;
  for (int i = 0; i < c->n; i++) free(c->e[i].key), free(c->e[i].sol);
  free(c->e);
  free(c->slot);
  free(c->dir);
  free(c);
}

static uint64_t mix(uint64_t h, uint64_t x) {
  h ^= x + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h *= 0xff51afd7ed558ccdull;
  return h ^ (h >> 29);
}

static uint64_t fnv(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static int by_color(const void *a, const void *b, void *ctx) {
  const uint64_t *color = ctx;
  int x = *(const int *)a, y = *(const int *)b;
  if (color[x] != color[y]) return color[x] < color[y] ? -1 : 1;
  return x - y;
}

typedef struct text {
  char *s;
  size_t n, cap;
} text;

static void put(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(text *t, const char *fmt, ...) {
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(t->s ? t->s + t->n : NULL, t->s ? t->cap - t->n : 0, fmt, ap);
    va_end(ap);
    if (t->s && (size_t)k < t->cap - t->n) {
      t->n += (size_t)k;
      return;
    }
    t->cap = (t->cap + (size_t)k + 64) * 2;
    t->s = realloc(t->s, t->cap);
    EVT_ASSERT(t->s);
  }
}

static int cmp_pair(const void *a, const void *b) {
  const int *x = a, *y = b;
  return x[0] != y[0] ? x[0] - y[0] : x[1] != y[1] ? x[1] - y[1] : x[2] - y[2];
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The typed neighbours of every node (CSR): variable edges, fixed arcs, related pairs (both directions,
 * tagged) and unrelated pairs; a node's WL signature mixes each with the neighbour's colour. */
typedef struct nbrs {
  int *start, *other;
  uint64_t *tag;   /* t << 8 | d: signature mix(mix(t, colour), d); d = 0xff: mix(t, colour) */
} nbrs;

static void nbrs_build(const evt_pblock *b, nbrs *a) {
  int n = b->n, ne = b->nvar + b->nfix + b->nrel + b->nunrel;
  a->start = calloc((size_t)n + 2, sizeof(int));
  a->other = malloc((size_t)(2 * ne + 1) * sizeof(int));
  a->tag = malloc((size_t)(2 * ne + 1) * sizeof(uint64_t));
  EVT_ASSERT(a->start && a->other && a->tag);
  for (int pass = 0; pass < 2; pass++) {
    for (int i = 0; i < ne; i++) {
      const int *e = i < b->nvar ? b->var[i] : i < b->nvar + b->nfix ? b->fix[i - b->nvar]
                   : i < b->nvar + b->nfix + b->nrel ? b->rel[i - b->nvar - b->nfix] : b->unrel[i - b->nvar - b->nfix - b->nrel];
      uint64_t t = i < b->nvar ? 1u + b->var_fuse[i] : i < b->nvar + b->nfix ? 3 : i < b->nvar + b->nfix + b->nrel ? 4 : 5;
      for (int end = 0; end < 2; end++) {
        int v = e[end];
        if (pass == 0) {
          a->start[v + 1]++;
          continue;
        }
        a->other[a->start[v]] = e[1 - end];
        a->tag[a->start[v]++] = t << 8 | (t == 5 ? 0xffu : end == 0 ? 10u : 11u);
      }
    }
    if (pass == 0)
      for (int v = 0; v < n; v++) a->start[v + 1] += a->start[v];
  }
  for (int v = n; v > 0; v--) a->start[v] = a->start[v - 1];
  a->start[0] = 0;
}

#define EVT_WL_PAIRWISE_FAMILY 64   /* larger read families enter a node's signature as one multiset hash */

/* One round of colour refinement: nc[v] from col[] over v's neighbours and read families. */
static void wl_round(const evt_pblock *b, const nbrs *a, const int *famof_start, const int *famof, const uint64_t *col,
                     uint64_t *fh, uint64_t *sig, uint64_t *nc) {
  int n = b->n;
  for (int f = 0; f < b->nfam; f++) {   /* large families: the sorted multiset of their members' colours */
    if (b->fam_len[f] <= EVT_WL_PAIRWISE_FAMILY) continue;
    for (int x = 0; x < b->fam_len[f]; x++) sig[x] = col[b->fam_cons[b->fam_start[f] + x]];
    qsort(sig, (size_t)b->fam_len[f], sizeof(uint64_t), cmp_u64);
    uint64_t h = mix(7, (uint64_t)b->fam_bytes[f]);
    for (int x = 0; x < b->fam_len[f]; x++) h = mix(h, sig[x]);
    fh[f] = h;
  }
  for (int v = 0; v < n; v++) {
    int k = 0;
    for (int q = a->start[v]; q < a->start[v + 1]; q++) {
      uint64_t t = a->tag[q] >> 8, d = a->tag[q] & 0xff;
      sig[k++] = d == 0xff ? mix(t, col[a->other[q]]) : mix(mix(t, col[a->other[q]]), d);
    }
    for (int q = famof_start[v]; q < famof_start[v + 1]; q++) {   /* co-consumers of one tensor */
      int f = famof[q];
      if (b->fam_len[f] > EVT_WL_PAIRWISE_FAMILY) {
        sig[k++] = fh[f];
        continue;
      }
      for (int y = 0; y < b->fam_len[f]; y++)
        if (b->fam_cons[b->fam_start[f] + y] != v) sig[k++] = mix(mix(6, (uint64_t)b->fam_bytes[f]), col[b->fam_cons[b->fam_start[f] + y]]);
    }
    qsort(sig, (size_t)k, sizeof(uint64_t), cmp_u64);
    uint64_t h = col[v];
    for (int i = 0; i < k; i++) h = mix(h, sig[i]);
    nc[v] = h;
  }
}

char *evt_pblock_canonical(const evt_pblock *b, int *order) {
  int n = b->n, nmem = b->nfam ? b->fam_start[b->nfam - 1] + b->fam_len[b->nfam - 1] : 0;
  uint64_t *col = malloc((size_t)(n + 1) * sizeof(uint64_t)), *nc = malloc((size_t)(n + 1) * sizeof(uint64_t));
  int nadj = 2 * (b->nvar + b->nfix + b->nrel + b->nunrel) + nmem + 1;
  for (int f = 0; f < b->nfam; f++)
    if (b->fam_len[f] <= EVT_WL_PAIRWISE_FAMILY) nadj += b->fam_len[f] * b->fam_len[f];
  uint64_t *sig = malloc((size_t)nadj * sizeof(uint64_t)), *fh = malloc((size_t)(b->nfam + 1) * sizeof(uint64_t));
  int *pos = malloc((size_t)(n + 1) * sizeof(int)), *famof_start = calloc((size_t)n + 2, sizeof(int));
  int *famof = malloc((size_t)(nmem + 1) * sizeof(int));
  EVT_ASSERT(col && nc && sig && fh && pos && famof_start && famof);
  nbrs nb;
  nbrs_build(b, &nb);
  for (int i = 0; i < nmem; i++) famof_start[b->fam_cons[i] + 1]++;
  for (int v = 0; v < n; v++) famof_start[v + 1] += famof_start[v];
  for (int f = 0; f < b->nfam; f++)
    for (int i = b->fam_start[f]; i < b->fam_start[f] + b->fam_len[f]; i++) famof[famof_start[b->fam_cons[i]]++] = f;
  for (int v = n; v > 0; v--) famof_start[v] = famof_start[v - 1];
  famof_start[0] = 0;
  for (int v = 0; v < n; v++) {
    uint64_t h = mix(b->label[v], (uint64_t)b->bytes[v]);
    h = mix(h, (uint64_t)b->written[v] | (uint64_t)b->kin[v] << 8 | (uint64_t)b->fixed_in[v] << 32);
    col[v] = h;
  }
  int distinct = 0;
  for (int round = 0; round < n; round++) {
    wl_round(b, &nb, famof_start, famof, col, fh, sig, nc);
    memcpy(col, nc, (size_t)n * sizeof(uint64_t));
    memcpy(nc, col, (size_t)n * sizeof(uint64_t));
    qsort(nc, (size_t)n, sizeof(uint64_t), cmp_u64);
    int d = n > 0;
    for (int i = 1; i < n; i++) d += nc[i] != nc[i - 1];
    if (d == distinct) break;
    distinct = d;
  }
  free(nb.start); free(nb.other); free(nb.tag); free(fh); free(famof_start); free(famof);
  for (int v = 0; v < n; v++) order[v] = v;
  qsort_r(order, (size_t)n, sizeof(int), by_color, col);
  for (int i = 0; i < n; i++) pos[order[i]] = i;
  text t = {0};
  put(&t, "n=%d lambda=%.17g;", n, b->lambda);
  for (int i = 0; i < n; i++) {
    int v = order[i];
    put(&t, " %llx/%.17g/%d/%d/%d", (unsigned long long)b->label[v], b->bytes[v], b->written[v], b->kin[v], b->fixed_in[v]);
  }
  int ne = b->nvar + b->nfix + b->nrel + b->nunrel;
  int(*e)[3] = malloc((size_t)(ne + 1) * sizeof *e);
  EVT_ASSERT(e);
  int k = 0;
  for (int i = 0; i < b->nvar; i++) e[k][0] = pos[b->var[i][0]], e[k][1] = pos[b->var[i][1]], e[k++][2] = b->var_fuse[i];
  for (int i = 0; i < b->nfix; i++) e[k][0] = pos[b->fix[i][0]], e[k][1] = pos[b->fix[i][1]], e[k++][2] = 3;
  for (int i = 0; i < b->nrel; i++) e[k][0] = pos[b->rel[i][0]], e[k][1] = pos[b->rel[i][1]], e[k++][2] = 4;
  for (int i = 0; i < b->nunrel; i++) {
    int a = pos[b->unrel[i][0]], z = pos[b->unrel[i][1]];
    e[k][0] = a < z ? a : z, e[k][1] = a < z ? z : a, e[k++][2] = 5;
  }
  qsort(e, (size_t)ne, sizeof *e, cmp_pair);
  put(&t, ";");
  for (int i = 0; i < ne; i++)   /* duplicate fixed arcs are harmless but must not make keys differ */
    if (i == 0 || cmp_pair(e[i], e[i - 1])) put(&t, " %d-%d:%d", e[i][0], e[i][1], e[i][2]);
  /* read families: each as "bytes:consumer/producer ..." in canonical positions (producer -1: outside),
   * members sorted, families sorted */
  char **fams = malloc((size_t)(b->nfam + 1) * sizeof(char *));
  EVT_ASSERT(fams);
  for (int f = 0; f < b->nfam; f++) {
    int len = b->fam_len[f];
    int(*mb)[3] = malloc((size_t)(len + 1) * sizeof *mb);
    EVT_ASSERT(mb);
    for (int q = 0; q < len; q++) {
      int i = b->fam_start[f] + q;
      mb[q][0] = pos[b->fam_cons[i]];
      mb[q][1] = b->fam_var[i] >= 0 ? pos[b->var[b->fam_var[i]][0]] : -1;
      mb[q][2] = 0;
    }
    qsort(mb, (size_t)len, sizeof *mb, cmp_pair);
    text ft = {0};
    put(&ft, "%.17g:", b->fam_bytes[f]);
    for (int q = 0; q < len; q++) put(&ft, "%d/%d,", mb[q][0], mb[q][1]);
    fams[f] = ft.s;
    free(mb);
  }
  qsort(fams, (size_t)b->nfam, sizeof(char *), cmp_str);
  put(&t, "; reads");
  for (int f = 0; f < b->nfam; f++) put(&t, " %s", fams[f]), free(fams[f]);
  free(fams);
  free(e); free(col); free(nc); free(sig); free(pos);
  return t.s;
}

static void path_of(const evt_part_cache *c, uint64_t h, char *buf, size_t n) {
  snprintf(buf, n, "%s/partition-%016llx.txt", c->dir, (unsigned long long)h);
}

static void slot_put(evt_part_cache *c, int i) {
  size_t at = (size_t)c->e[i].hash & (c->nslot - 1);
  while (c->slot[at] >= 0) at = (at + 1) & (c->nslot - 1);
  c->slot[at] = i;
}

static entry *find_entry(const evt_part_cache *c, uint64_t h, const char *key) {
  for (size_t at = c->nslot ? (size_t)h & (c->nslot - 1) : 0; c->nslot && c->slot[at] >= 0; at = (at + 1) & (c->nslot - 1))
    if (c->e[c->slot[at]].hash == h && !strcmp(c->e[c->slot[at]].key, key)) return &c->e[c->slot[at]];
  return NULL;
}

static entry *add_entry(evt_part_cache *c, uint64_t h, char *key, int n, const int *csol, int optimal, double cost) {
  if (c->n == c->cap) {
    c->cap = c->cap ? 2 * c->cap : 32;
    c->e = realloc(c->e, (size_t)c->cap * sizeof *c->e);
    EVT_ASSERT(c->e);
  }
  if (2 * (size_t)(c->n + 1) > c->nslot) {   /* keep the table at most half full */
    c->nslot = c->nslot ? 2 * c->nslot : 64;
    free(c->slot);
    c->slot = malloc(c->nslot * sizeof(int));
    EVT_ASSERT(c->slot);
    for (size_t i = 0; i < c->nslot; i++) c->slot[i] = -1;
    for (int i = 0; i < c->n; i++) slot_put(c, i);
  }
  entry *e = &c->e[c->n++];
  e->hash = h, e->key = key, e->n = n, e->optimal = optimal, e->cost = cost;
  e->sol = malloc((size_t)(n + 1) * sizeof(int));
  EVT_ASSERT(e->sol);
  memcpy(e->sol, csol, (size_t)n * sizeof(int));
  slot_put(c, c->n - 1);
  return e;
}

/* Parses an entry's verified body: the key line, then "optimal n g0 g1 ...", then "cost C". 0 or -1. */
static int parse_entry(char *body, size_t len, const char *key, int n, int *csol, int *optimal, double *cost) {
  size_t klen = strlen(key);
  if (len <= klen || memcmp(body, key, klen) || body[klen] != '\n') return -1;
  FILE *f = fmemopen(body + klen + 1, len - klen - 1, "r");
  EVT_ASSERT(f);
  int m = -1, ok = fscanf(f, "%d %d", optimal, &m) == 2 && m == n;
  for (int i = 0; i < n && ok; i++) ok = fscanf(f, "%d", &csol[i]) == 1 && csol[i] >= 0 && csol[i] < n;
  ok = ok && fscanf(f, " cost %lf", cost) == 1;
  fclose(f);
  return ok ? 0 : -1;
}

/* The solution stored on disk for key (canonical positions), when its checksum holds. */
static int load_disk(const evt_part_cache *c, uint64_t h, const char *key, int n, int *csol, int *optimal, double *cost) {
  if (!c->dir) return -1;
  char path[1200];
  path_of(c, h, path, sizeof path);
  size_t len;
  char *data = evt_cache_read(path, &len);
  if (!data) return -1;
  long body = evt_cache_text_body(data, len);
  int rc = body < 0 ? -1 : parse_entry(data, (size_t)body, key, n, csol, optimal, cost);
  if (body < 0) fprintf(stderr, "evt: warning: partition cache entry %s fails its checksum: solving again\n", path);
  free(data);
  return rc;
}

/* Does the cost model give the grouping the cost its entry claims? (A changed model or an edited entry: no.) */
static bool cost_holds(const evt_pblock *b, const int *sol, double claimed) {
  double now = evt_pblock_cost(b, sol), tol = 1e-9 * fmax(fabs(now), 1.0);
  return fabs(now - claimed) <= tol;
}

int evt_part_cache_get(evt_part_cache *c, const evt_pblock *b, int *sol, int *optimal) {
  int n = b->n, *order = malloc((size_t)(n + 1) * sizeof(int)), *csol = malloc((size_t)(n + 1) * sizeof(int));
  EVT_ASSERT(order && csol);
  char *key = evt_pblock_canonical(b, order);
  uint64_t h = fnv(key);
  int where = 0, opt = 0;
  double cost = 0;
  const entry *mem = find_entry(c, h, key);
  if (mem) {
    memcpy(csol, mem->sol, (size_t)n * sizeof(int));
    opt = mem->optimal, cost = mem->cost, where = 1;
  }
  if (!where && load_disk(c, h, key, n, csol, &opt, &cost) == 0) where = 2;
  if (where) {
    for (int i = 0; i < n; i++) sol[order[i]] = order[csol[i]];
    if (!cost_holds(b, sol, cost)) {
      if (where == 2)
        fprintf(stderr, "evt: warning: a partition cache entry's grouping costs %.17g, not the %.17g it was stored "
                "with: solving again\n", evt_pblock_cost(b, sol), cost);
      where = 0;
    }
  }
  if (where == 2) add_entry(c, h, strdup(key), n, csol, opt, cost);
  if (where) *optimal = opt;
  free(key), free(order), free(csol);
  return where;
}

/* Writes an entry's file: key, solution, cost, checksum (a refused or missing folder: memory only). */
static void store_disk(const evt_part_cache *c, const entry *e) {
  char path[1200], why[1200];
  if (!c->dir || evt_cache_dir_private(c->dir, c->levels, 1, why, sizeof why) != 0) return;
  text t = {0};
  put(&t, "%s\n%d %d", e->key, e->optimal, e->n);
  for (int i = 0; i < e->n; i++) put(&t, " %d", e->sol[i]);
  put(&t, "\ncost %.17g\n", e->cost);
  t.s = evt_cache_seal_text(t.s, t.n);
  path_of(c, e->hash, path, sizeof path);
  evt_cache_write(path, t.s, strlen(t.s));
  free(t.s);
}

void evt_part_cache_put(evt_part_cache *c, const evt_pblock *b, const int *sol, int optimal) {
  int n = b->n;
  int *order = malloc((size_t)(n + 1) * sizeof(int)), *pos = malloc((size_t)(n + 1) * sizeof(int));
  int *csol = malloc((size_t)(n + 1) * sizeof(int));
  EVT_ASSERT(order && pos && csol);
  char *key = evt_pblock_canonical(b, order);
  /* canonical group label: the smallest canonical position among the group's members (labels are < n) */
  for (int i = 0; i < n; i++) pos[i] = -1;
  for (int i = 0; i < n; i++) {
    if (pos[sol[order[i]]] < 0) pos[sol[order[i]]] = i;
    csol[i] = pos[sol[order[i]]];
  }
  entry *e = add_entry(c, fnv(key), key, n, csol, optimal, evt_pblock_cost(b, sol));
  store_disk(c, e);
  free(order), free(pos), free(csol);
}
