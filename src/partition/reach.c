/* reach.c — the reachability facts the decomposition needs, without an n x n table.
 *
 * Forced cuts: edge (a, b) is cut in every legal grouping when a path a -> f -> b passes a barrier f
 * (f != a, b). Barriers are taken in chunks of at most 64 x EVT_REACH_MAX_WORDS (by id); for one chunk,
 * D(x) holds the chunk's barriers reachable from x and A(x) those reaching x, as bit rows over the
 * chunk only, and (a, b) is forced when D(a) & A(b) != 0. Ids are topological, so a path a -> f -> b has
 * a < f < b: D is needed only from the smallest such a up to the chunk's last barrier and A only from its
 * first barrier up to the largest such b. Memory: rows x words of one chunk; time: about
 * (barriers / 64) x (nodes + edges) word operations.
 *
 * Block reachability: a path between two nodes of a block never leaves the id range of the block, so the
 * nodes reachable from the block within that range are visited once, in decreasing id order, with rows of
 * k bits (k = block size) kept only for outside nodes that reach back into the block. */
#include "partition/partition.h"

#include <stdlib.h>
#include <string.h>

#define EVT_REACH_MAX_WORDS 64          /* bitset words per row: 4096 barriers per chunk */
#define EVT_REACH_BUDGET_WORDS (4u << 20) /* 32 MiB per table: fewer words per row on large graphs */

static void note_scratch(evt_part_work *w, size_t bytes) {
  if (bytes > w->scratch_peak) w->scratch_peak = bytes;
}

static bool candidate(const evt_pgraph *g, const unsigned char *forced, int e) {
  int s = g->edges[e].status;
  return (s == EVT_PE_FREE || s == EVT_PE_FUSE) && !forced[e];
}

/* One chunk of barriers bar[c0..c1) with columns col[] set: marks the forced edges. */
static void forced_chunk(evt_part_work *w, const int *bar, int c0, int c1, const int *col) {
  const evt_pgraph *g = w->g;
  int f0 = bar[c0], f1 = bar[c1 - 1], lo = g->n, hi = -1, words = (c1 - c0 + 63) / 64;
  for (int e = 0; e < g->m; e++)
    if (candidate(g, w->forced, e) && g->edges[e].u < f1 && g->edges[e].v > f0) {
      if (g->edges[e].u < lo) lo = g->edges[e].u;
      if (g->edges[e].v > hi) hi = g->edges[e].v;
    }
  if (hi < 0) return;
  size_t nd = (size_t)(f1 - lo + 1), na = (size_t)(hi - f0 + 1);
  uint64_t *D = calloc(nd * (size_t)words + 1, sizeof(uint64_t)), *A = calloc(na * (size_t)words + 1, sizeof(uint64_t));
  EVT_ASSERT(D && A);
  note_scratch(w, (nd + na) * (size_t)words * sizeof(uint64_t));
  for (int x = f1; x >= lo; x--) {   /* D(x) = U over successors s <= f1: [s in chunk] | D(s) */
    uint64_t *r = D + (size_t)(x - lo) * (size_t)words;
    const evt_pnode *p = &g->nodes[x];
    for (int k = 0; k < p->nout; k++) {
      int s = g->edges[g->out_edges[p->out0 + k]].v;
      if (s > f1) continue;
      const uint64_t *rs = D + (size_t)(s - lo) * (size_t)words;
      for (int q = 0; q < words; q++) r[q] |= rs[q];
      if (col[s] >= 0) r[col[s] >> 6] |= 1ull << (col[s] & 63);
    }
  }
  for (int x = f0; x <= hi; x++) {   /* A(x) = U over predecessors p >= f0: [p in chunk] | A(p) */
    uint64_t *r = A + (size_t)(x - f0) * (size_t)words;
    const evt_pnode *p = &g->nodes[x];
    for (int k = 0; k < p->nin; k++) {
      int u = g->edges[g->in_edges[p->in0 + k]].u;
      if (u < f0) continue;
      const uint64_t *ru = A + (size_t)(u - f0) * (size_t)words;
      for (int q = 0; q < words; q++) r[q] |= ru[q];
      if (col[u] >= 0) r[col[u] >> 6] |= 1ull << (col[u] & 63);
    }
  }
  for (int e = 0; e < g->m; e++) {
    const evt_pedge *ed = &g->edges[e];
    if (!candidate(g, w->forced, e) || ed->u >= f1 || ed->v <= f0) continue;
    const uint64_t *da = D + (size_t)(ed->u - lo) * (size_t)words, *ab = A + (size_t)(ed->v - f0) * (size_t)words;
    for (int q = 0; q < words; q++)
      if (da[q] & ab[q]) { w->forced[e] = 1; break; }
    EVT_ASSERT(!(w->forced[e] && ed->status == EVT_PE_FUSE));
  }
  free(D);
  free(A);
}

bool evt_part_forced_cuts(evt_part_work *w, const unsigned char *barrier, double deadline) {
  const evt_pgraph *g = w->g;
  int n = g->n, nb = 0;
  int *bar = malloc((size_t)(n + 1) * sizeof(int)), *col = malloc((size_t)(n + 1) * sizeof(int));
  EVT_ASSERT(bar && col);
  for (int v = 0; v < n; v++) {
    col[v] = -1;
    if (barrier[v]) bar[nb++] = v;
  }
  int words = (int)(EVT_REACH_BUDGET_WORDS / (unsigned)(n > 0 ? n : 1));
  if (words > EVT_REACH_MAX_WORDS) words = EVT_REACH_MAX_WORDS;
  if (words < 1) words = 1;
  bool done = true;
  for (int c0 = 0; c0 < nb; c0 += 64 * words) {
    if (evt_now_s() > deadline) { done = false; break; }
    int c1 = c0 + 64 * words < nb ? c0 + 64 * words : nb;
    for (int j = c0; j < c1; j++) col[bar[j]] = j - c0;
    forced_chunk(w, bar, c0, c1, col);
    for (int j = c0; j < c1; j++) col[bar[j]] = -1;
  }
  free(bar);
  free(col);
  return done;
}

static int by_id_desc(const void *a, const void *b) { return *(const int *)b - *(const int *)a; }

void evt_part_block_reach(evt_part_work *w, const int *nodes, int k, uint64_t *desc, uint64_t *ext) {
  const evt_pgraph *g = w->g;
  int words = (k + 63) / 64, hi = nodes[k - 1], nv = 0, cap = k + 16, nrows = 0, caprows = 16;
  int *vis = malloc((size_t)cap * sizeof(int));
  uint64_t *rows = malloc((size_t)caprows * (size_t)words * sizeof(uint64_t));
  EVT_ASSERT(vis && rows);
  memset(desc, 0, (size_t)k * (size_t)words * sizeof(uint64_t));
  memset(ext, 0, (size_t)k * (size_t)words * sizeof(uint64_t));
  /* the nodes reachable from the block up to its last node */
  for (int i = 0; i < k; i++) vis[nv++] = nodes[i], w->mark[nodes[i]] = 1;
  for (int h = 0; h < nv; h++) {
    const evt_pnode *p = &g->nodes[vis[h]];
    for (int q = 0; q < p->nout; q++) {
      int s = g->edges[g->out_edges[p->out0 + q]].v;
      if (s > hi || w->mark[s]) continue;
      if (nv == cap) {
        cap *= 2;
        vis = realloc(vis, (size_t)cap * sizeof(int));
        EVT_ASSERT(vis);
      }
      w->mark[s] = 1, vis[nv++] = s;
    }
  }
  qsort(vis, (size_t)nv, sizeof(int), by_id_desc);
  uint64_t *tmp = malloc((size_t)words * sizeof(uint64_t));
  EVT_ASSERT(tmp);
  for (int h = 0; h < nv; h++) {
    int x = vis[h], i = w->loc[x];
    const evt_pnode *p = &g->nodes[x];
    uint64_t *r = i >= 0 ? desc + (size_t)i * (size_t)words : tmp, *re = i >= 0 ? ext + (size_t)i * (size_t)words : NULL;
    if (i < 0) memset(tmp, 0, (size_t)words * sizeof(uint64_t));
    for (int q = 0; q < p->nout; q++) {
      int s = g->edges[g->out_edges[p->out0 + q]].v, j = w->loc[s];
      if (s > hi || !w->mark[s]) continue;
      const uint64_t *rs = j >= 0 ? desc + (size_t)j * (size_t)words : w->row[s] >= 0 ? rows + (size_t)w->row[s] * (size_t)words : NULL;
      if (j >= 0) r[j >> 6] |= 1ull << (j & 63);
      for (int t = 0; rs && t < words; t++) r[t] |= rs[t];
      /* ext: through an inside successor, what it reaches by leaving; through an outside one, all it reaches */
      const uint64_t *rx = j >= 0 ? ext + (size_t)j * (size_t)words : rs;
      for (int t = 0; re && rx && t < words; t++) re[t] |= rx[t];
    }
    if (i >= 0) continue;
    bool any = false;
    for (int t = 0; t < words && !any; t++) any = tmp[t] != 0;
    if (!any) continue;
    if (nrows == caprows) {
      caprows *= 2;
      rows = realloc(rows, (size_t)caprows * (size_t)words * sizeof(uint64_t));
      EVT_ASSERT(rows);
    }
    memcpy(rows + (size_t)nrows * (size_t)words, tmp, (size_t)words * sizeof(uint64_t));
    w->row[x] = nrows++;
  }
  note_scratch(w, ((size_t)nrows + 2 * (size_t)k) * (size_t)words * sizeof(uint64_t));
  for (int h = 0; h < nv; h++) w->mark[vis[h]] = 0, w->row[vis[h]] = -1;
  free(vis);
  free(rows);
  free(tmp);
}

/* Entries and exits of the wanted blocks; exit rows allocated in w->exit_bits. owner[v]: v's wanted block. */
static void exits_prepare(evt_part_work *w, const int *at, const int *len, const int *list, const unsigned char *want,
                          const int *owner, int *nent) {
  const evt_pgraph *g = w->g;
  long words = 0;
  for (int r = 0; r < g->n; r++) {
    nent[r] = 0;
    if (!want[r]) continue;
    for (int i = at[r]; i < at[r] + len[r]; i++) {
      const evt_pnode *p = &g->nodes[list[i]];
      for (int k = 0; k < p->nin; k++) {
        int u = g->edges[g->in_edges[p->in0 + k]].u;
        if (evt_pgraph_kernel(g, u) && owner[u] != r) { w->entry_ix[list[i]] = nent[r]++; break; }
      }
    }
    for (int i = at[r]; i < at[r] + len[r] && nent[r] > 0; i++) {
      const evt_pnode *p = &g->nodes[list[i]];
      for (int k = 0; k < p->nout; k++)
        if (owner[g->edges[g->out_edges[p->out0 + k]].v] != r) { w->exit_off[list[i]] = words, words += (nent[r] + 63) / 64; break; }
    }
  }
  free(w->exit_bits);
  w->exit_bits = calloc((size_t)words + 1, sizeof(uint64_t));
  EVT_ASSERT(w->exit_bits);
}

/* One chunk: the wanted blocks roots[0..nr), their entries numbered from col0[] on. */
static void exits_chunk(evt_part_work *w, const int *at, const int *len, const int *list, const int *owner,
                        const int *nent, const int *roots, const int *col0, int nr, int cols, int *col) {
  const evt_pgraph *g = w->g;
  int words = (cols + 63) / 64, hi = -1, lo = g->n;
  for (int q = 0; q < nr; q++)
    for (int i = at[roots[q]]; i < at[roots[q]] + len[roots[q]]; i++) {
      int v = list[i];
      if (w->entry_ix[v] >= 0) col[v] = col0[q] + w->entry_ix[v], hi = v > hi ? v : hi;
    }
  for (int q = 0; q < nr; q++)
    for (int i = at[roots[q]]; i < at[roots[q]] + len[roots[q]]; i++) {
      const evt_pnode *p = &g->nodes[list[i]];
      for (int k = 0; w->exit_off[list[i]] >= 0 && k < p->nout; k++) {
        int y = g->edges[g->out_edges[p->out0 + k]].v;
        if (owner[y] != roots[q] && y < lo) lo = y;
      }
    }
  if (lo <= hi) {
    size_t rows = (size_t)(hi - lo + 1);
    uint64_t *D = calloc(rows * (size_t)words + 1, sizeof(uint64_t));
    EVT_ASSERT(D);
    note_scratch(w, rows * (size_t)words * sizeof(uint64_t));
    for (int x = hi; x >= lo; x--) {   /* D(x): the chunk's entries reachable from x */
      uint64_t *r = D + (size_t)(x - lo) * (size_t)words;
      const evt_pnode *p = &g->nodes[x];
      for (int k = 0; k < p->nout; k++) {
        int y = g->edges[g->out_edges[p->out0 + k]].v;
        if (y > hi) continue;
        const uint64_t *ry = D + (size_t)(y - lo) * (size_t)words;
        for (int t = 0; t < words; t++) r[t] |= ry[t];
        if (col[y] >= 0) r[col[y] >> 6] |= 1ull << (col[y] & 63);
      }
    }
    for (int q = 0; q < nr; q++)
      for (int i = at[roots[q]]; i < at[roots[q]] + len[roots[q]]; i++) {
        int v = list[i], c0 = col0[q], ne = nent[roots[q]];
        const evt_pnode *p = &g->nodes[v];
        for (int k = 0; w->exit_off[v] >= 0 && k < p->nout; k++) {
          int y = g->edges[g->out_edges[p->out0 + k]].v;
          if (owner[y] == roots[q] || y > hi) continue;
          const uint64_t *ry = D + (size_t)(y - lo) * (size_t)words;
          uint64_t *out = w->exit_bits + w->exit_off[v];
          for (int t = c0 >> 6; t <= (c0 + ne - 1) >> 6; t++)
            for (uint64_t b = ry[t]; b; b &= b - 1) {
              int c = t * 64 + __builtin_ctzll(b) - c0;
              if (c >= 0 && c < ne) out[c >> 6] |= 1ull << (c & 63);
            }
        }
      }
    free(D);
  }
  for (int q = 0; q < nr; q++)
    for (int i = at[roots[q]]; i < at[roots[q]] + len[roots[q]]; i++) col[list[i]] = -1;
}

bool evt_part_exit_reach(evt_part_work *w, const int *at, const int *len, const int *list, const unsigned char *want,
                         double deadline) {
  const evt_pgraph *g = w->g;
  int n = g->n;
  int *owner = malloc((size_t)(n + 1) * sizeof(int)), *nent = malloc((size_t)(n + 1) * sizeof(int));
  int *col = malloc((size_t)(n + 1) * sizeof(int)), *roots = malloc((size_t)(n + 1) * sizeof(int));
  int *col0 = malloc((size_t)(n + 1) * sizeof(int));
  EVT_ASSERT(owner && nent && col && roots && col0);
  for (int v = 0; v < n; v++) owner[v] = -1, col[v] = -1, w->entry_ix[v] = -1, w->exit_off[v] = -1;
  for (int r = 0; r < n; r++)
    for (int i = at[r]; want[r] && i < at[r] + len[r]; i++) owner[list[i]] = r;
  exits_prepare(w, at, len, list, want, owner, nent);
  int cap = (int)(EVT_REACH_BUDGET_WORDS / (unsigned)(n > 0 ? n : 1));
  cap = 64 * (cap < 1 ? 1 : cap > EVT_REACH_MAX_WORDS ? EVT_REACH_MAX_WORDS : cap);
  bool done = true;
  int nr = 0, cols = 0;
  for (int r = 0; r <= n && done; r++) {
    bool take = r < n && want[r] && nent[r] > 0;
    if (nr > 0 && (r == n || (take && cols + nent[r] > cap))) {   /* the chunk is full: sweep it */
      if (evt_now_s() > deadline) { done = false; break; }
      exits_chunk(w, at, len, list, owner, nent, roots, col0, nr, cols, col);
      nr = 0, cols = 0;
    }
    if (take) roots[nr] = r, col0[nr++] = cols, cols += nent[r];
  }
  for (int r = 0; r < n && done; r++)
    for (int i = at[r]; want[r] && i < at[r] + len[r]; i++) w->exits_known[list[i]] = 1;
  free(owner); free(nent); free(col); free(roots); free(col0);
  return done;
}

/* evt_part_block_reach from the exit rows: in decreasing local order, desc(i) gathers its inside successors
 * and their desc, and every entry j its outside successors reach with desc(j); ext(i) gathers the inside
 * successors' ext and the same entries. */
void evt_part_block_reach_exits(evt_part_work *w, const int *nodes, int k, uint64_t *desc, uint64_t *ext) {
  const evt_pgraph *g = w->g;
  int words = (k + 63) / 64, ne = 0;
  int *ent = malloc((size_t)(k + 1) * sizeof(int));
  EVT_ASSERT(ent);
  for (int i = 0; i < k; i++)
    if (w->entry_ix[nodes[i]] >= 0) ent[w->entry_ix[nodes[i]]] = i, ne++;
  memset(desc, 0, (size_t)k * (size_t)words * sizeof(uint64_t));
  memset(ext, 0, (size_t)k * (size_t)words * sizeof(uint64_t));
  for (int i = k - 1; i >= 0; i--) {
    int v = nodes[i];
    uint64_t *rd = desc + (size_t)i * (size_t)words, *rx = ext + (size_t)i * (size_t)words;
    const evt_pnode *p = &g->nodes[v];
    for (int q = 0; q < p->nout; q++) {
      int t = w->loc[g->edges[g->out_edges[p->out0 + q]].v];
      if (t < 0) continue;
      const uint64_t *td = desc + (size_t)t * (size_t)words, *tx = ext + (size_t)t * (size_t)words;
      rd[t >> 6] |= 1ull << (t & 63);
      for (int c = 0; c < words; c++) rd[c] |= td[c], rx[c] |= tx[c];
    }
    if (w->exit_off[v] < 0) continue;
    const uint64_t *row = w->exit_bits + w->exit_off[v];
    for (int c = 0; c < (ne + 63) / 64; c++)
      for (uint64_t b = row[c]; b; b &= b - 1) {
        int j = ent[c * 64 + __builtin_ctzll(b)];
        const uint64_t *jd = desc + (size_t)j * (size_t)words;
        rd[j >> 6] |= 1ull << (j & 63), rx[j >> 6] |= 1ull << (j & 63);
        for (int q = 0; q < words; q++) rd[q] |= jd[q], rx[q] |= jd[q];
      }
  }
  free(ent);
}
