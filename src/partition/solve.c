/* decompose.c — exact decomposition of the partition problem, and the driver evt_part_solve.
 *
 * 1. Barriers: a kernel node whose in-edges are all CUT (a nucleus; an OPERAND prologue fused into it
 *    counts as part of it), or whose out-edges are all CUT (a reduction that ends its group).
 * 2. Forced cuts: an edge (a, b) with a barrier f != a, b on a path a -> f -> b is cut in every legal
 *    grouping (a and b together would need f and f's cut edge on the path inside the group). With
 *    descendant/ancestor bitsets this is one AND per edge: desc(a) & barriers & anc(b) != 0.
 * 3. Blocks: the weakly connected components of the remaining (FREE or FUSE) edges. Each is solved alone
 *    exactly — by the down-set DP (dp.c) when it is narrow enough, else by the MIP (ilp.c) — with fixed
 *    arcs for its cut edges and for every pair u, v joined by a path that leaves it (pi_v >= pi_u + 1), so its groups are ordered consistently with the rest of the graph.
 * 4. Coupling: components can still close a cycle through each other without any path leaving one and
 *    coming back (u ~ v in one group of A, w1 ~ w2 in one group of B, edges u -> w1 and w2 -> v). After
 *    assembling, the contracted graph is checked; the blocks on a cycle are merged into one block and
 *    re-solved (a lazy constraint at block level), until it is acyclic. Every block is solved exactly
 *    with all constraints among its nodes, so the result is the whole-graph optimum.
 * Isomorphic blocks (repeated layers) are solved once (cache.c). */
#include "partition/partition.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

evt_part_options evt_part_options_default(void) {
  return (evt_part_options){.use_ilp = 1, .time_limit = 10.0, .decompose = 1, .use_cache = 1, .cache_dir = NULL,
                            .use_dp = 1};
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int uf(int *p, int x) {
  while (p[x] != x) x = p[x] = p[p[x]];
  return x;
}

typedef struct ctx {
  evt_pgraph *g;
  evt_bits desc, anc;
  unsigned char *forced;   /* per edge: cut in every legal grouping (CUT status or barrier) */
  int *loc;                /* global -> local id scratch, -1 outside the block */
} ctx;

static bool cut_for_sure(const ctx *c, int e) { return c->g->edges[e].status == EVT_PE_CUT || c->forced[e]; }

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

/* The block of the given global nodes (sorted ascending). */
static void build_block(ctx *c, const int *nodes, int n, evt_pblock *b) {
  const evt_pgraph *g = c->g;
  memset(b, 0, sizeof *b);
  b->n = n;
  b->lambda = g->lambda;
  b->gid = malloc((size_t)(n + 1) * sizeof(int));
  b->written = calloc((size_t)n + 1, 1);
  b->has_var_out = calloc((size_t)n + 1, 1);
  b->bytes = malloc((size_t)(n + 1) * sizeof(double));
  b->kin = calloc((size_t)n + 1, sizeof(int));
  b->fixed_in = calloc((size_t)n + 1, sizeof(int));
  b->label = malloc((size_t)(n + 1) * sizeof(uint64_t));
  EVT_ASSERT(b->gid && b->written && b->has_var_out && b->bytes && b->kin && b->fixed_in && b->label);
  for (int i = 0; i < n; i++) c->loc[nodes[i]] = i, b->gid[i] = nodes[i];
  int capv = 0, capf = 0, capr = 0, capu = 0;
  for (int i = 0; i < n; i++) {
    int v = nodes[i];
    const evt_pnode *p = &g->nodes[v];
    b->bytes[i] = p->bytes;
    b->label[i] = mix(mix(p->label, p->flags), (uint64_t)p->shape_class);
    if (p->flags & EVT_PN_OUTPUT) b->written[i] = 1;
    for (int k = 0; k < p->nin; k++) {
      int e = g->in_edges[p->in0 + k], u = g->edges[e].u;
      if (!evt_pgraph_kernel(g, u)) continue;
      b->kin[i]++;
      if (c->loc[u] < 0 || cut_for_sure(c, e)) b->fixed_in[i]++;
    }
    for (int k = 0; k < p->nout; k++) {
      int e = g->out_edges[p->out0 + k], w = g->edges[e].v;
      if (c->loc[w] < 0 || cut_for_sure(c, e)) b->written[i] = 1;
      if (c->loc[w] < 0) continue;
      if (cut_for_sure(c, e)) {
        PUSH2(b->fix, b->nfix, capf, i, c->loc[w]);
      } else {
        if (b->nvar == capv) {
          capv = capv ? 2 * capv : 16;
          b->var = realloc(b->var, (size_t)capv * sizeof *b->var);
          b->var_fuse = realloc(b->var_fuse, (size_t)capv);
          b->var_bytes = realloc(b->var_bytes, (size_t)capv * sizeof(double));
          EVT_ASSERT(b->var && b->var_fuse && b->var_bytes);
        }
        b->var[b->nvar][0] = i, b->var[b->nvar][1] = c->loc[w];
        b->var_fuse[b->nvar] = g->edges[e].status == EVT_PE_FUSE;
        b->var_bytes[b->nvar++] = p->bytes;
        b->has_var_out[i] = 1;
      }
    }
  }
  /* read families: per producer (inside, outside or source), its consumers inside, ascending */
  int nmem = 0, capm = 0;
  int(*mem)[3] = NULL;   /* (producer global id, consumer local, var edge or -1) */
  for (int i = 0; i < n; i++) {
    const evt_pnode *p = &g->nodes[nodes[i]];
    for (int k = 0; k < p->nin; k++) {
      int e = g->in_edges[p->in0 + k], u = g->edges[e].u;
      if (g->nodes[u].bytes <= 0) continue;
      if (nmem == capm) {
        capm = capm ? 2 * capm : 32;
        mem = realloc(mem, (size_t)capm * sizeof *mem);
        EVT_ASSERT(mem);
      }
      int var = -1;
      if (c->loc[u] >= 0 && !cut_for_sure(c, e))
        for (int j = 0; j < b->nvar; j++)
          if (b->var[j][0] == c->loc[u] && b->var[j][1] == i) { var = j; break; }
      mem[nmem][0] = u, mem[nmem][1] = i, mem[nmem++][2] = var;
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
  /* pairs joined by a path that leaves the block: ext(u) = U over successors s of u of
   * (s inside ? ext(s) : desc*(s) & block), computed in reverse order */
  int words = (n + 63) / 64;
  uint64_t *ext = calloc((size_t)n * (size_t)words + 1, sizeof(uint64_t));
  EVT_ASSERT(ext);
  for (int i = n - 1; i >= 0; i--) {
    const evt_pnode *p = &g->nodes[nodes[i]];
    uint64_t *r = ext + (size_t)i * (size_t)words;
    for (int k = 0; k < p->nout; k++) {
      int s = g->edges[g->out_edges[p->out0 + k]].v;
      if (c->loc[s] >= 0) {
        const uint64_t *rs = ext + (size_t)c->loc[s] * (size_t)words;
        for (int w = 0; w < words; w++) r[w] |= rs[w];
      } else {
        for (int j = i + 1; j < n; j++)
          if (evt_bits_get(&c->desc, s, nodes[j])) r[j >> 6] |= 1ull << (j & 63);
      }
    }
  }
  for (int i = 0; i < n; i++)
    for (int j = i + 1; j < n; j++)
      if ((ext[(size_t)i * (size_t)words + (size_t)(j >> 6)] >> (j & 63)) & 1u) PUSH2(b->fix, b->nfix, capf, i, j);
  free(ext);
  /* incompatible pairs */
  for (int i = 0; i < n; i++) {
    if (!(g->nodes[nodes[i]].flags & EVT_PN_NUCLEUS)) continue;
    for (int j = 0; j < n; j++) {
      if (j == i || evt_part_pair_ok(g, nodes[i], nodes[j])) continue;
      if ((g->nodes[nodes[j]].flags & EVT_PN_NUCLEUS) && j < i) continue;   /* each nucleus pair once */
      int a = i < j ? i : j, z = i < j ? j : i;
      if (evt_bits_get(&c->desc, nodes[a], nodes[z])) PUSH2(b->rel, b->nrel, capr, a, z);
      else PUSH2(b->unrel, b->nunrel, capu, a, z);
    }
  }
  for (int i = 0; i < n; i++) c->loc[nodes[i]] = -1;
}

/* A cached grouping of block b into sol[], if it is legal and no costlier than the greedy one (start): an entry
 * costlier than a grouping in hand is not optimal, whatever it claims. */
static bool cached_solution(evt_part_cache *cache, const evt_pblock *b, const int *start, int *sol, evt_part_stats *st) {
  int optimal = 0, hit = evt_part_cache_get(cache, b, sol, &optimal);
  if (!hit || !evt_pblock_legal(b, sol)) return false;
  double cost = evt_pblock_cost(b, sol), tol = 1e-9 * (cost > 1 ? cost : 1);
  if (evt_pblock_legal(b, start) && evt_pblock_cost(b, start) < cost - tol) return false;
  st->cache_hits++;
  if (hit == 2) st->disk_hits++;
  if (!optimal) st->proven = 0;
  return true;
}

/* Solves one block: trivial, cached, or MIP (start: the global greedy grouping restricted to it). */
static void solve_block(ctx *c, const evt_pblock *b, const int *greedy_group, const evt_part_options *opt,
                        evt_part_cache *cache, int *sol, evt_part_stats *st) {
  int n = b->n;
  if (b->nvar == 0) {
    for (int i = 0; i < n; i++) sol[i] = i;
    st->trivial++;
    return;
  }
  int *start = malloc((size_t)(n + 1) * sizeof(int));
  EVT_ASSERT(start);
  for (int i = 0; i < n; i++) {   /* local ids of the greedy groups: the first member's index */
    start[i] = i;
    for (int j = 0; j < i; j++)
      if (greedy_group[b->gid[j]] == greedy_group[b->gid[i]]) { start[i] = j; break; }
  }
  if (cache && cached_solution(cache, b, start, sol, st)) {
    free(start);
    return;
  }
  if (opt->use_dp) {
    double obj = 0;
    long nsets = 0;
    if (evt_dp_solve_block(b, opt->dp_max_sets > 0 ? opt->dp_max_sets : EVT_DP_MAX_SETS, EVT_DP_MAX_WORK, sol, &obj, &nsets)) {
      if (!evt_pblock_legal(b, sol)) evt_fatal(__FILE__, __LINE__, "DP solution breaks a block constraint");
      double cost = evt_pblock_cost(b, sol), tol = 1e-12 * (cost > 0 ? cost : 1) + 1e-9;
      if (cost > obj + tol || cost < obj - tol)
        evt_fatal(__FILE__, __LINE__, "DP objective %.17g differs from the block cost %.17g", obj, cost);
      /* ties: keep the greedy grouping when it is optimal too (the MIP keeps its start the same way), so
       * plans do not change with the solver */
      if (evt_pblock_legal(b, start) && evt_pblock_cost(b, start) <= cost + tol) memcpy(sol, start, (size_t)n * sizeof(int));
      st->dps++;
      if (nsets > st->dp_most_sets) st->dp_most_sets = nsets;
      if (cache) evt_part_cache_put(cache, b, sol, 1);
      free(start);
      return;
    }
  }
  evt_ilp_result r;
  evt_ilp_solve_block(c->g, b, start, opt->time_limit, sol, &r);
  st->mips++;
  st->lazy_rows += r.lazy_rows;
  if (!r.optimal) {
    st->proven = 0;
    st->timeouts++;
    if (r.gap > st->max_gap) st->max_gap = r.gap;
  }
  if (cache) evt_part_cache_put(cache, b, sol, r.optimal);
  free(start);
}

/* Finds a cycle in the contracted graph of group[] and merges the blocks of its groups. Returns false
 * if the contracted graph is acyclic. */
static bool merge_cycle(const evt_pgraph *g, const int *group, int *block) {
  int n = g->n;
  int *tmp = malloc((size_t)(n + 1) * sizeof(int));
  EVT_ASSERT(tmp);
  memcpy(tmp, group, (size_t)n * sizeof(int));
  if (evt_part_normalize(g, tmp) >= 0) {
    free(tmp);
    return false;
  }
  /* Kahn on groups (ids are node ids < n) to find the groups left on or after a cycle */
  int *indeg = calloc((size_t)n + 1, sizeof(int)), *q = malloc((size_t)(n + 1) * sizeof(int));
  unsigned char *isg = calloc((size_t)n + 1, 1), *gone = calloc((size_t)n + 1, 1);
  EVT_ASSERT(indeg && q && isg && gone);
  for (int v = 0; v < n; v++)
    if (evt_pgraph_kernel(g, v)) isg[group[v]] = 1;
  for (int e = 0; e < g->m; e++)
    if (evt_pgraph_kernel(g, g->edges[e].u) && group[g->edges[e].u] != group[g->edges[e].v]) indeg[group[g->edges[e].v]]++;
  int h = 0, t = 0;
  for (int x = 0; x < n; x++)
    if (isg[x] && indeg[x] == 0) q[t++] = x;
  while (h < t) {
    int x = q[h++];
    gone[x] = 1;
    for (int v = 0; v < n; v++) {
      if (!evt_pgraph_kernel(g, v) || group[v] != x) continue;
      const evt_pnode *p = &g->nodes[v];
      for (int k = 0; k < p->nout; k++) {
        int w = g->edges[g->out_edges[p->out0 + k]].v;
        if (group[w] != x && --indeg[group[w]] == 0) q[t++] = group[w];
      }
    }
  }
  /* walk backwards through remaining predecessors until a group repeats */
  int *seen = malloc((size_t)(n + 1) * sizeof(int)), *walk = malloc((size_t)(n + 1) * sizeof(int));
  EVT_ASSERT(seen && walk);
  for (int x = 0; x < n; x++) seen[x] = -1;
  int cur = -1, len = 0;
  for (int x = 0; x < n && cur < 0; x++)
    if (isg[x] && !gone[x]) cur = x;
  EVT_ASSERT(cur >= 0);
  while (seen[cur] < 0) {
    seen[cur] = len;
    walk[len++] = cur;
    int pred = -1;
    for (int e = 0; e < g->m && pred < 0; e++) {
      const evt_pedge *ed = &g->edges[e];
      if (!evt_pgraph_kernel(g, ed->u) || group[ed->v] != cur || group[ed->u] == cur) continue;
      if (!gone[group[ed->u]]) pred = group[ed->u];
    }
    EVT_ASSERT(pred >= 0);
    cur = pred;
  }
  /* groups walk[seen[cur] .. len) form a cycle: merge their blocks */
  int target = -1;
  for (int i = seen[cur]; i < len; i++)
    for (int v = 0; v < n; v++)
      if (evt_pgraph_kernel(g, v) && group[v] == walk[i]) {
        if (target < 0) target = block[v];
        int old = block[v];
        if (old != target)
          for (int w = 0; w < n; w++)
            if (block[w] == old) block[w] = target;
      }
  free(tmp); free(indeg); free(q); free(isg); free(gone); free(seen); free(walk);
  return true;
}

evt_status evt_part_solve(evt_pgraph *g, const evt_part_options *opt, int *group, evt_part_stats *st) {
  double t0 = now_s();
  int n = g->n;
  memset(st, 0, sizeof *st);
  st->proven = 1;
  int *greedy = malloc((size_t)(n + 1) * sizeof(int));
  EVT_ASSERT(greedy);
  evt_part_greedy(g, greedy);
  if (!opt->use_ilp) {
    memcpy(group, greedy, (size_t)n * sizeof(int));
    free(greedy);
    st->proven = 0;
    st->solve_seconds = now_s() - t0;
    return evt_part_validate(g, group);
  }
  ctx c = {g, {0}, {0}, NULL, NULL};
  evt_pgraph_reach(g, &c.desc, &c.anc);
  c.forced = calloc((size_t)g->m + 1, 1);
  c.loc = malloc((size_t)(n + 1) * sizeof(int));
  int *block = malloc((size_t)(n + 1) * sizeof(int));
  EVT_ASSERT(c.forced && c.loc && block);
  for (int v = 0; v < n; v++) c.loc[v] = -1, block[v] = v;
  if (opt->decompose) {
    evt_bits bar = {0};
    bar.n = 1, bar.words = c.desc.words;
    bar.w = calloc((size_t)bar.words + 1, sizeof(uint64_t));
    EVT_ASSERT(bar.w);
    for (int v = 0; v < n; v++) {
      if (!evt_pgraph_kernel(g, v)) continue;
      const evt_pnode *p = &g->nodes[v];
      bool in_bar = true, out_bar = p->nout > 0;
      for (int k = 0; k < p->nin; k++) {
        const evt_pedge *e = &g->edges[g->in_edges[p->in0 + k]];
        if (!evt_pgraph_kernel(g, e->u) || e->status == EVT_PE_CUT) continue;
        const evt_pnode *pu = &g->nodes[e->u];
        bool prologue = e->status == EVT_PE_FUSE && evt_pn_prologue(pu->flags) && pu->nout == 1;
        if (!prologue) in_bar = false;
      }
      for (int k = 0; k < p->nout; k++)
        if (g->edges[g->out_edges[p->out0 + k]].status != EVT_PE_CUT) out_bar = false;
      if (in_bar || out_bar) bar.w[v >> 6] |= 1ull << (v & 63);
    }
    for (int e = 0; e < g->m; e++) {
      const evt_pedge *ed = &g->edges[e];
      if (ed->status != EVT_PE_FREE && ed->status != EVT_PE_FUSE) continue;
      const uint64_t *da = evt_bits_row(&c.desc, ed->u), *ab = evt_bits_row(&c.anc, ed->v);
      for (int w = 0; w < bar.words; w++)
        if (da[w] & bar.w[w] & ab[w]) { c.forced[e] = 1; break; }
      EVT_ASSERT(!(c.forced[e] && ed->status == EVT_PE_FUSE));
    }
    free(bar.w);
    for (int e = 0; e < g->m; e++) {
      const evt_pedge *ed = &g->edges[e];
      if ((ed->status == EVT_PE_FREE || ed->status == EVT_PE_FUSE) && !c.forced[e]) {
        int a = uf(block, ed->u), b = uf(block, ed->v);
        if (a != b) block[b < a ? a : b] = b < a ? b : a;
      }
    }
    for (int v = 0; v < n; v++) block[v] = uf(block, v);
  } else {
    int first = -1;
    for (int v = 0; v < n; v++)
      if (evt_pgraph_kernel(g, v)) {
        if (first < 0) first = v;
        block[v] = first;
      }
  }
  for (int v = 0; v < n; v++)
    if (evt_pgraph_kernel(g, v) && block[v] == v) st->components++;
  evt_part_cache *cache = NULL;
  if (opt->use_cache) {
    char buf[1024];
    const char *dir = opt->cache_dir ? opt->cache_dir : evt_part_cache_default_dir(buf, sizeof buf);
    cache = evt_part_cache_new(dir, opt->cache_dir ? 1 : 2);
  }
  unsigned char *solved = calloc((size_t)n + 1, 1);   /* per block representative */
  int *nodes = malloc((size_t)(n + 1) * sizeof(int)), *sol = malloc((size_t)(n + 1) * sizeof(int));
  EVT_ASSERT(solved && nodes && sol);
  for (int v = 0; v < n; v++) group[v] = -1;
  for (;;) {
    for (int r = 0; r < n; r++) {
      if (!evt_pgraph_kernel(g, r) || block[r] != r || solved[r]) continue;
      int k = 0;
      for (int v = r; v < n; v++)
        if (evt_pgraph_kernel(g, v) && block[v] == r) nodes[k++] = v;
      if (k > st->largest_component) st->largest_component = k;
      evt_pblock b;
      build_block(&c, nodes, k, &b);
      solve_block(&c, &b, greedy, opt, cache, sol, st);
      for (int i = 0; i < k; i++) group[nodes[i]] = nodes[sol[i]];
      evt_pblock_free(&b);
      solved[r] = 1;
    }
    int *before = malloc((size_t)(n + 1) * sizeof(int));
    EVT_ASSERT(before);
    memcpy(before, block, (size_t)n * sizeof(int));
    bool merged = merge_cycle(g, group, block);
    if (merged && !memcmp(before, block, (size_t)n * sizeof(int))) merged = false;   /* validate reports it */
    if (merged) {
      st->merges++;
      for (int v = 0; v < n; v++)   /* re-root merged blocks at their smallest node; mark unsolved */
        if (evt_pgraph_kernel(g, v) && block[v] != before[v]) solved[block[v]] = 0;
      int *root = malloc((size_t)(n + 1) * sizeof(int));
      EVT_ASSERT(root);
      for (int v = 0; v < n; v++) root[v] = -1;
      for (int v = 0; v < n; v++)
        if (evt_pgraph_kernel(g, v)) {
          if (root[block[v]] < 0) root[block[v]] = v;
        }
      for (int v = 0; v < n; v++)
        if (evt_pgraph_kernel(g, v)) {
          int nb = root[block[v]];
          if (!solved[block[v]]) solved[nb] = 0;
          else solved[nb] = 1;
          block[v] = nb;
        }
      free(root);
    }
    free(before);
    if (!merged) break;
  }
  evt_part_normalize(g, group);
  if (cache) evt_part_cache_free(cache);
  free(solved); free(nodes); free(sol); free(block); free(greedy); free(c.forced); free(c.loc);
  evt_bits_free(&c.desc);
  evt_bits_free(&c.anc);
  st->solve_seconds = now_s() - t0;
  return evt_part_validate(g, group);
}
