/* block.c — one block of the decomposition as a self-contained problem (evt_pblock), and a lower bound
 * on its cost.
 *
 * A block lists its variable edges (FREE or FUSE, not forced), its fixed arcs (cut edges inside, and with
 * `pairs` every pair joined by a path that leaves the block), its incompatible pairs (with `pairs`), its
 * read families and forced writes. Without `pairs` the block is enough to cost a grouping and bound the
 * optimum, not to solve it: blocks too large for an exact solver are built that way (no reachability).
 *
 * Lower bound, valid for every legal grouping of the block: the forced writes; one read of every family
 * with a member that always reads (producer outside or edge cut for sure); and lambda times the number of
 * groups, which is at least the number of nuclei and at least 1 + the longest chain of fixed arcs (each
 * fixed arc goes to a strictly later group). A grouping that meets it is optimal. */
#include "partition/partition.h"

#include <stdlib.h>
#include <string.h>

static bool cut_for_sure(const evt_part_work *w, int e) { return w->g->edges[e].status == EVT_PE_CUT || w->forced[e]; }

static uint64_t mix(uint64_t h, uint64_t x) {
  h ^= x + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h * 0xff51afd7ed558ccdull;
}

#define PUSH2(arr, cnt, cap, a, b)                                                  \
  do {                                                                              \
    if ((cnt) == (cap)) {                                                           \
      (cap) = (cap) ? 2 * (cap) : 16;                                               \
      (arr) = realloc((arr), (size_t)(cap) * sizeof *(arr));                        \
      EVT_ASSERT(arr);                                                              \
    }                                                                               \
    (arr)[cnt][0] = (a), (arr)[cnt][1] = (b), (cnt)++;                              \
  } while (0)

static int cmp3(const void *x, const void *y) {
  const int *a = x, *b = y;
  return a[0] != b[0] ? (a[0] < b[0] ? -1 : 1) : a[1] - b[1];
}

static void block_alloc(evt_pblock *b, int n, double lambda) {
  memset(b, 0, sizeof *b);
  b->n = n;
  b->lambda = lambda;
  b->gid = malloc((size_t)(n + 1) * sizeof(int));
  b->written = calloc((size_t)n + 1, 1);
  b->has_var_out = calloc((size_t)n + 1, 1);
  b->bytes = malloc((size_t)(n + 1) * sizeof(double));
  b->kin = calloc((size_t)n + 1, sizeof(int));
  b->fixed_in = calloc((size_t)n + 1, sizeof(int));
  b->label = malloc((size_t)(n + 1) * sizeof(uint64_t));
  EVT_ASSERT(b->gid && b->written && b->has_var_out && b->bytes && b->kin && b->fixed_in && b->label);
}

/* Node facts, variable edges (recorded in w->edge_var) and fixed arcs of the block's own edges. */
static void block_edges(evt_part_work *w, const int *nodes, evt_pblock *b) {
  const evt_pgraph *g = w->g;
  int capv = 0, capf = 0;
  for (int i = 0; i < b->n; i++) {
    const evt_pnode *p = &g->nodes[nodes[i]];
    b->bytes[i] = p->bytes;
    b->label[i] = mix(mix(p->label, p->flags), (uint64_t)p->shape_class);
    if (p->flags & EVT_PN_OUTPUT) b->written[i] = 1;
    for (int k = 0; k < p->nin; k++) {
      int e = g->in_edges[p->in0 + k], u = g->edges[e].u;
      if (!evt_pgraph_kernel(g, u)) continue;
      b->kin[i]++;
      if (w->loc[u] < 0 || cut_for_sure(w, e)) b->fixed_in[i]++;
    }
    for (int k = 0; k < p->nout; k++) {
      int e = g->out_edges[p->out0 + k], x = g->edges[e].v;
      if (w->loc[x] < 0 || cut_for_sure(w, e)) b->written[i] = 1;
      if (w->loc[x] < 0) continue;
      if (cut_for_sure(w, e)) {
        PUSH2(b->fix, b->nfix, capf, i, w->loc[x]);
        continue;
      }
      if (b->nvar == capv) {
        capv = capv ? 2 * capv : 16;
        b->var = realloc(b->var, (size_t)capv * sizeof *b->var);
        b->var_fuse = realloc(b->var_fuse, (size_t)capv);
        b->var_bytes = realloc(b->var_bytes, (size_t)capv * sizeof(double));
        EVT_ASSERT(b->var && b->var_fuse && b->var_bytes);
      }
      b->var[b->nvar][0] = i, b->var[b->nvar][1] = w->loc[x];
      b->var_fuse[b->nvar] = g->edges[e].status == EVT_PE_FUSE;
      b->var_bytes[b->nvar] = p->bytes;
      w->edge_var[e] = b->nvar++;
      b->has_var_out[i] = 1;
    }
  }
}

/* Read families: per producer (inside, outside or source), its consumers inside, ascending. */
static void block_families(evt_part_work *w, const int *nodes, evt_pblock *b) {
  const evt_pgraph *g = w->g;
  int nmem = 0, capm = 0;
  int(*mem)[3] = NULL;   /* (producer global id, consumer local, var edge or -1) */
  for (int i = 0; i < b->n; i++) {
    const evt_pnode *p = &g->nodes[nodes[i]];
    for (int k = 0; k < p->nin; k++) {
      int e = g->in_edges[p->in0 + k], u = g->edges[e].u;
      if (g->nodes[u].bytes <= 0) continue;
      if (nmem == capm) {
        capm = capm ? 2 * capm : 32;
        mem = realloc(mem, (size_t)capm * sizeof *mem);
        EVT_ASSERT(mem);
      }
      mem[nmem][0] = u, mem[nmem][1] = i, mem[nmem++][2] = w->edge_var[e];
    }
  }
  if (nmem > 0) qsort(mem, (size_t)nmem, sizeof *mem, cmp3); /* mem is NULL when no edge carries bytes */
  b->fam_start = malloc((size_t)(nmem + 1) * sizeof(int));
  b->fam_len = malloc((size_t)(nmem + 1) * sizeof(int));
  b->fam_bytes = malloc((size_t)(nmem + 1) * sizeof(double));
  b->fam_cons = malloc((size_t)(nmem + 1) * sizeof(int));
  b->fam_var = malloc((size_t)(nmem + 1) * sizeof(int));
  EVT_ASSERT(b->fam_start && b->fam_len && b->fam_bytes && b->fam_cons && b->fam_var);
  for (int i = 0; i < nmem; i++) {
    if (i == 0 || mem[i][0] != mem[i - 1][0]) {
      b->fam_start[b->nfam] = i;
      b->fam_len[b->nfam] = 0;
      b->fam_bytes[b->nfam++] = g->nodes[mem[i][0]].bytes;
    }
    b->fam_len[b->nfam - 1]++;
    b->fam_cons[i] = mem[i][1];
    b->fam_var[i] = mem[i][2];
  }
  free(mem);
}

/* Fixed arcs for pairs joined by a path that leaves the block, and the incompatible pairs (related: a path
 * joins them; unrelated: none does). */
static void block_pairs(evt_part_work *w, const int *nodes, evt_pblock *b) {
  const evt_pgraph *g = w->g;
  int n = b->n, words = (n + 63) / 64, capf = b->nfix, capr = 0, capu = 0;
  uint64_t *desc = malloc((size_t)n * (size_t)words * sizeof(uint64_t) + 8);
  uint64_t *ext = malloc((size_t)n * (size_t)words * sizeof(uint64_t) + 8);
  EVT_ASSERT(desc && ext);
  if (w->exits_known && w->exits_known[nodes[0]]) evt_part_block_reach_exits(w, nodes, n, desc, ext);
  else evt_part_block_reach(w, nodes, n, desc, ext);
  for (int i = 0; i < n; i++) {
    const uint64_t *r = ext + (size_t)i * (size_t)words;
    for (int q = 0; q < words; q++)
      for (uint64_t x = r[q]; x; x &= x - 1) {
        int j = q * 64 + __builtin_ctzll(x);
        if (j > i) PUSH2(b->fix, b->nfix, capf, i, j);
      }
  }
  for (int i = 0; i < n; i++) {
    if (!(g->nodes[nodes[i]].flags & EVT_PN_NUCLEUS)) continue;
    for (int j = 0; j < n; j++) {
      if (j == i || evt_part_pair_ok(g, nodes[i], nodes[j])) continue;
      if ((g->nodes[nodes[j]].flags & EVT_PN_NUCLEUS) && j < i) continue;   /* each nucleus pair once */
      int a = i < j ? i : j, z = i < j ? j : i;
      if ((desc[(size_t)a * (size_t)words + (size_t)(z >> 6)] >> (z & 63)) & 1u) PUSH2(b->rel, b->nrel, capr, a, z);
      else PUSH2(b->unrel, b->nunrel, capu, a, z);
    }
  }
  free(desc);
  free(ext);
}

void evt_part_block_build(evt_part_work *w, const int *nodes, int n, bool pairs, evt_pblock *b) {
  block_alloc(b, n, w->g->lambda);
  for (int i = 0; i < n; i++) w->loc[nodes[i]] = i, b->gid[i] = nodes[i];
  block_edges(w, nodes, b);
  block_families(w, nodes, b);
  if (pairs) block_pairs(w, nodes, b);
  for (int i = 0; i < n; i++) {   /* reset the scratch */
    const evt_pnode *p = &w->g->nodes[nodes[i]];
    for (int k = 0; k < p->nout; k++) w->edge_var[w->g->out_edges[p->out0 + k]] = -1;
  }
  for (int i = 0; i < n; i++) w->loc[nodes[i]] = -1;
}

double evt_pblock_lower_bound(const evt_pblock *b, int nuclei) {
  int n = b->n;
  double c = 0;
  for (int v = 0; v < n; v++)
    if (b->written[v]) c += b->bytes[v];
  for (int f = 0; f < b->nfam; f++)
    for (int i = b->fam_start[f]; i < b->fam_start[f] + b->fam_len[f]; i++)
      if (b->fam_var[i] < 0) {
        c += b->fam_bytes[f];
        break;
      }
  /* longest chain of fixed arcs: local ids are topological, arcs go from a smaller to a larger id */
  int *start = calloc((size_t)n + 2, sizeof(int)), *from = malloc((size_t)(b->nfix + 1) * sizeof(int));
  int *lvl = calloc((size_t)n + 1, sizeof(int));
  EVT_ASSERT(start && from && lvl);
  for (int i = 0; i < b->nfix; i++) start[b->fix[i][1] + 1]++;
  for (int v = 0; v < n; v++) start[v + 1] += start[v];
  for (int i = 0; i < b->nfix; i++) from[start[b->fix[i][1]]++] = b->fix[i][0];
  for (int v = n; v > 0; v--) start[v] = start[v - 1];
  start[0] = 0;
  int longest = 0;
  for (int v = 0; v < n; v++) {
    for (int k = start[v]; k < start[v + 1]; k++)
      if (lvl[from[k]] + 1 > lvl[v]) lvl[v] = lvl[from[k]] + 1;
    if (lvl[v] > longest) longest = lvl[v];
  }
  free(start);
  free(from);
  free(lvl);
  int groups = longest + 1 > nuclei ? longest + 1 : nuclei;
  return c + b->lambda * (n > 0 ? groups : 0);
}
