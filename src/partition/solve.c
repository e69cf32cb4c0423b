/* solve.c — exact decomposition of the partition problem, and the driver evt_part_solve.
 *
 * 1. Barriers: a kernel node whose in-edges are all CUT (a nucleus; an OPERAND prologue fused into it
 *    counts as part of it), or whose out-edges are all CUT (a reduction that ends its group).
 * 2. Forced cuts: an edge (a, b) with a barrier f != a, b on a path a -> f -> b is cut in every legal
 *    grouping (a and b together would need f and f's cut edge on the path inside the group); reach.c
 *    finds them with bit rows over chunks of barriers, never an n x n table.
 * 3. Blocks: the weakly connected components of the remaining (FREE or FUSE) edges. Each is solved alone
 *    exactly — by the down-set DP (dp.c) when it is narrow enough, else by the MIP (ilp.c) — with fixed
 *    arcs for its cut edges and for every pair u, v joined by a path that leaves it (pi_v >= pi_u + 1), so
 *    its groups are ordered consistently with the rest of the graph.
 * 4. Coupling: components can still close a cycle through each other without any path leaving one and
 *    coming back (u ~ v in one group of A, w1 ~ w2 in one group of B, edges u -> w1 and w2 -> v). After
 *    assembling, the contracted graph is checked; the blocks on a cycle are merged into one block and
 *    re-solved (a lazy constraint at block level), until it is acyclic. Every block is solved exactly
 *    with all constraints among its nodes, so the result is the whole-graph optimum.
 * Isomorphic blocks (repeated layers) are solved once (cache.c).
 *
 * Scale. Every block starts from the greedy grouping restricted to it (legal, as the greedy grouping of the
 * whole graph is). A block whose greedy grouping meets the lower bound of block.c is optimal as it is. A
 * block over the MIP's caps (nodes, co-consumer pairs) keeps its greedy grouping, unproven; so does every
 * block reached after the time limit (which counts from the start: decomposition and model building
 * included), and a block where CBC fails keeps its best legal grouping. Each of these says so once, in one
 * warning on stderr (and in evt_part_stats.warning). */
#include "partition/partition.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

evt_part_options evt_part_options_default(void) {
  return (evt_part_options){.use_ilp = 1, .time_limit = 10.0, .decompose = 1, .use_cache = 1, .cache_dir = NULL,
                            .use_dp = 1};
}

static int uf(int *p, int x) {
  while (p[x] != x) x = p[x] = p[p[x]];
  return x;
}

/* What no solver should see: a launch cost, tensor size or time limit that is not a number >= 0. */
static evt_status check_numbers(evt_pgraph *g, const evt_part_options *opt) {
  if (!isfinite(g->lambda) || g->lambda < 0) {
    snprintf(g->error, sizeof g->error, "partition: the launch cost lambda must be a finite number >= 0, not %g", g->lambda);
    return EVT_ERR_INVALID;
  }
  if (isnan(opt->time_limit) || opt->time_limit < 0) {
    snprintf(g->error, sizeof g->error, "partition: the time limit must be a number >= 0, not %g", opt->time_limit);
    return EVT_ERR_INVALID;
  }
  for (int v = 0; v < g->n; v++)
    if (!isfinite(g->nodes[v].bytes) || g->nodes[v].bytes < 0) {
      char name[128];
      snprintf(g->error, sizeof g->error, "partition: %s has a tensor size of %g bytes", evt_pgraph_name(g, v, name, sizeof name),
               g->nodes[v].bytes);
      return EVT_ERR_INVALID;
    }
  return EVT_OK;
}

/* Step 1: barrier[v] = 1 for kernel nodes whose in-edges are all cut (operand prologues aside) or whose
 * out-edges are all cut. */
static void find_barriers(const evt_pgraph *g, unsigned char *barrier) {
  for (int v = 0; v < g->n; v++) {
    barrier[v] = 0;
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
    barrier[v] = in_bar || out_bar;
  }
}

/* Steps 1-3: block[v] = the smallest node of v's block. Returns false if the deadline passed during the
 * forced-cut search (the blocks are then coarser, still valid). */
static bool find_blocks(evt_part_work *w, const evt_part_options *opt, double deadline, int *block) {
  const evt_pgraph *g = w->g;
  int n = g->n;
  bool done = true;
  for (int v = 0; v < n; v++) block[v] = v;
  if (!opt->decompose) {
    int first = -1;
    for (int v = 0; v < n; v++)
      if (evt_pgraph_kernel(g, v)) {
        if (first < 0) first = v;
        block[v] = first;
      }
    return true;
  }
  unsigned char *barrier = malloc((size_t)n + 1);
  EVT_ASSERT(barrier);
  find_barriers(g, barrier);
  done = evt_part_forced_cuts(w, barrier, deadline);
  free(barrier);
  for (int e = 0; e < g->m; e++) {
    const evt_pedge *ed = &g->edges[e];
    if ((ed->status == EVT_PE_FREE || ed->status == EVT_PE_FUSE) && !w->forced[e]) {
      int a = uf(block, ed->u), b = uf(block, ed->v);
      if (a != b) block[b < a ? a : b] = b < a ? b : a;
    }
  }
  for (int v = 0; v < n; v++) block[v] = uf(block, v);
  return done;
}

/* The solver's state across blocks. */
typedef struct solver {
  evt_part_work w;
  const evt_part_options *opt;
  evt_part_cache *cache;
  const int *greedy;
  int *first;          /* per node: scratch of greedy_start (-1) */
  double deadline, limit;
  int mip_max;
  bool late;           /* the deadline passed */
  double too_large_gap;
} solver;

/* Local ids of the greedy groups: each node's first block member in its greedy group. */
static void greedy_start(solver *s, const evt_pblock *b, int *start) {
  for (int i = 0; i < b->n; i++) {
    int gg = s->greedy[b->gid[i]];
    if (s->first[gg] < 0) s->first[gg] = i;
    start[i] = s->first[gg];
  }
  for (int i = 0; i < b->n; i++) s->first[s->greedy[b->gid[i]]] = -1;
}

static int block_nuclei(const evt_pgraph *g, const evt_pblock *b) {
  int k = 0;
  for (int i = 0; i < b->n; i++) k += (g->nodes[b->gid[i]].flags & EVT_PN_NUCLEUS) != 0;
  return k;
}

static long block_pairs(const evt_pblock *b) {
  long p = 0;
  for (int f = 0; f < b->nfam; f++) p += (long)b->fam_len[f] * (b->fam_len[f] - 1) / 2;
  return p;
}

/* The DP on a narrow block; true if it solved it (sol[] set). */
static bool solve_dp(solver *s, const evt_pblock *b, const int *start, int *sol, evt_part_stats *st) {
  double obj = 0;
  long nsets = 0, cap = s->opt->dp_max_sets > 0 ? s->opt->dp_max_sets : EVT_DP_MAX_SETS;
  if (!evt_dp_solve_block(b, cap, EVT_DP_MAX_WORK, sol, &obj, &nsets)) return false;
  if (!evt_pblock_legal(b, sol)) evt_fatal(__FILE__, __LINE__, "DP solution breaks a block constraint");
  double cost = evt_pblock_cost(b, sol), tol = 1e-12 * (cost > 0 ? cost : 1) + 1e-9;
  if (cost > obj + tol || cost < obj - tol)
    evt_fatal(__FILE__, __LINE__, "DP objective %.17g differs from the block cost %.17g", obj, cost);
  /* ties: keep the greedy grouping when it is optimal too (the MIP keeps its start the same way), so
   * plans do not change with the solver */
  if (evt_pblock_legal(b, start) && evt_pblock_cost(b, start) <= cost + tol) memcpy(sol, start, (size_t)b->n * sizeof(int));
  st->dps++;
  if (nsets > st->dp_most_sets) st->dp_most_sets = nsets;
  return true;
}

static void solve_mip(solver *s, const evt_pblock *b, const int *start, double seconds, int *sol, evt_part_stats *st) {
  evt_ilp_result r;
  long budget = s->opt->mip_bb_nodes == 0 ? EVT_MIP_BB_NODES : s->opt->mip_bb_nodes < 0 ? 0 : s->opt->mip_bb_nodes;
  evt_ilp_solve_block(s->w.g, b, start, seconds > 0 ? seconds : 0, budget, sol, &r);
  st->mips++;
  st->lazy_rows += r.lazy_rows;
  st->bb_nodes += r.bb_nodes;
  if (r.failed) st->mip_failures++;
  if (!r.optimal) {
    st->proven = 0;
    st->timeouts += r.timeout;
    st->node_limited += r.node_limited;
    if (r.gap > st->max_gap) st->max_gap = r.gap;
  }
  if (s->cache && !r.failed) evt_part_cache_put(s->cache, b, sol, r.optimal);
}

/* A cached solution of an isomorphic block, if it is legal and no costlier than the grouping in sol[] (the greedy
 * one: an entry costlier than a grouping in hand is not optimal, whatever it claims); on a miss sol[] is left as
 * it was. */
static bool cache_hit(solver *s, const evt_pblock *b, int *sol, evt_part_stats *st) {
  int *got = malloc((size_t)(b->n + 1) * sizeof(int)), optimal = 0;
  EVT_ASSERT(got);
  int hit = evt_part_cache_get(s->cache, b, got, &optimal);
  bool ok = hit && evt_pblock_legal(b, got);
  if (ok) {
    double cost = evt_pblock_cost(b, got), tol = 1e-9 * (cost > 1 ? cost : 1);
    ok = !(evt_pblock_legal(b, sol) && evt_pblock_cost(b, sol) < cost - tol);
  }
  if (ok) {
    memcpy(sol, got, (size_t)b->n * sizeof(int));
    st->cache_hits++;
    st->disk_hits += hit == 2;
    if (!optimal) st->proven = 0;
  }
  free(got);
  return ok;
}

/* A block that keeps its greedy grouping unproven (late or too large): counted, with its gap to the bound. */
static void keep_greedy(solver *s, int k, double cost, double lb, evt_part_stats *st) {
  double gap = cost > 1e-12 ? (cost - lb) / cost : 0;
  st->proven = 0;
  if (s->late) {
    st->late++, st->timeouts++;
    if (gap > st->max_gap) st->max_gap = gap;
  } else {
    st->too_large++;
    if (k > st->largest_too_large) st->largest_too_large = k;
    if (gap > s->too_large_gap) s->too_large_gap = gap;
  }
}

/* Solves the block of nodes[0..k) into sol[] (local group ids) without the MIP: trivial, cached, DP, lower
 * bound, or (late, too large) the greedy grouping. Returns true when the block waits for the MIP pass
 * (sol[] holds the greedy grouping meanwhile). */
static bool solve_block(solver *s, const int *nodes, int k, int *sol, evt_part_stats *st) {
  const evt_pgraph *g = s->w.g;
  if (!s->late && evt_now_s() > s->deadline) s->late = true;
  bool dp_ok = !s->late && s->opt->use_dp && k <= 64, mip_ok = !s->late && k <= s->mip_max, wait = false;
  evt_pblock b;
  evt_part_block_build(&s->w, nodes, k, dp_ok || mip_ok, &b);
  mip_ok = mip_ok && block_pairs(&b) <= EVT_MIP_MAX_PAIRS;
  int *start = malloc((size_t)(k + 1) * sizeof(int));
  EVT_ASSERT(start);
  greedy_start(s, &b, start);
  memcpy(sol, start, (size_t)k * sizeof(int));
  bool full = dp_ok || mip_ok;
  if (b.nvar == 0) {
    for (int i = 0; i < k; i++) sol[i] = i;
    st->trivial++;
  } else if (full && s->cache && cache_hit(s, &b, sol, st)) {
  } else if (dp_ok && solve_dp(s, &b, start, sol, st)) {
    if (s->cache) evt_part_cache_put(s->cache, &b, sol, 1);
  } else {
    double cost = evt_pblock_cost(&b, start), lb = evt_pblock_lower_bound(&b, block_nuclei(g, &b));
    if (cost <= lb * (1 + 1e-12) + 1e-9) {   /* the greedy grouping meets the lower bound: optimal */
      st->bounds++;
      if (full && s->cache) evt_part_cache_put(s->cache, &b, sol, 1);
    } else if (mip_ok) {
      wait = true;
    } else {
      keep_greedy(s, k, cost, lb, st);
    }
  }
  free(start);
  evt_pblock_free(&b);
  return wait;
}

/* The MIP pass over the blocks solve_block left waiting: each gets an equal share of the time left among
 * those still waiting (`waiting`, itself included); an isomorphic block solved meanwhile is a cache hit. */
static void mip_block(solver *s, const int *nodes, int k, int waiting, int *sol, evt_part_stats *st) {
  if (!s->late && evt_now_s() > s->deadline) s->late = true;
  evt_pblock b;
  evt_part_block_build(&s->w, nodes, k, true, &b);
  int *start = malloc((size_t)(k + 1) * sizeof(int));
  EVT_ASSERT(start);
  greedy_start(s, &b, start);
  memcpy(sol, start, (size_t)k * sizeof(int));
  if (s->cache && cache_hit(s, &b, sol, st)) {
  } else if (s->late) {
    keep_greedy(s, k, evt_pblock_cost(&b, start), evt_pblock_lower_bound(&b, block_nuclei(s->w.g, &b)), st);
  } else {
    solve_mip(s, &b, start, (s->deadline - evt_now_s()) / waiting, sol, st);
  }
  free(start);
  evt_pblock_free(&b);
}

/* Blocks as lists: nodes of the block rooted at r are list[at[r] .. at[r] + len[r]), ascending. */
static void block_lists(const evt_pgraph *g, const int *block, int *at, int *len, int *list) {
  int n = g->n, pos = 0;
  for (int v = 0; v < n; v++) len[v] = 0;
  for (int v = 0; v < n; v++)
    if (evt_pgraph_kernel(g, v)) len[block[v]]++;
  for (int v = 0; v < n; v++) at[v] = pos, pos += len[v], len[v] = 0;
  for (int v = 0; v < n; v++)
    if (evt_pgraph_kernel(g, v)) list[at[block[v]] + len[block[v]]++] = v;
}

/* Finds a cycle in the contracted graph of group[] (labels are node ids) and merges the blocks of its
 * groups into the block of the cycle's first group. Returns false if the contracted graph is acyclic. */
static bool merge_cycle(const evt_pgraph *g, const int *group, int *block) {
  int n = g->n;
  int *indeg = calloc((size_t)n + 1, sizeof(int)), *q = malloc((size_t)(n + 1) * sizeof(int));
  int *at = malloc((size_t)(n + 1) * sizeof(int)), *len = malloc((size_t)(n + 1) * sizeof(int));
  int *list = malloc((size_t)(n + 1) * sizeof(int)), *seen = malloc((size_t)(n + 1) * sizeof(int));
  int *walk = malloc((size_t)(n + 1) * sizeof(int));
  unsigned char *isg = calloc((size_t)n + 1, 1), *gone = calloc((size_t)n + 1, 1), *hit = calloc((size_t)n + 1, 1);
  EVT_ASSERT(indeg && q && at && len && list && seen && walk && isg && gone && hit);
  block_lists(g, group, at, len, list);   /* members per group label */
  for (int v = 0; v < n; v++)
    if (evt_pgraph_kernel(g, v)) isg[group[v]] = 1;
  for (int e = 0; e < g->m; e++)
    if (evt_pgraph_kernel(g, g->edges[e].u) && group[g->edges[e].u] != group[g->edges[e].v]) indeg[group[g->edges[e].v]]++;
  int h = 0, t = 0, groups = 0;
  for (int x = 0; x < n; x++) {
    groups += isg[x];
    if (isg[x] && indeg[x] == 0) q[t++] = x;
  }
  while (h < t) {
    int x = q[h++];
    gone[x] = 1;
    for (int i = at[x]; i < at[x] + len[x]; i++) {
      const evt_pnode *p = &g->nodes[list[i]];
      for (int k = 0; k < p->nout; k++) {
        int y = group[g->edges[g->out_edges[p->out0 + k]].v];
        if (y != x && --indeg[y] == 0) q[t++] = y;
      }
    }
  }
  bool cyclic = t < groups;
  if (cyclic) {
    /* walk backwards through remaining predecessors (the lowest edge id each time) until a group repeats */
    int cur = -1, n_walk = 0;
    for (int x = 0; x < n && cur < 0; x++)
      if (isg[x] && !gone[x]) cur = x;
    for (int x = 0; x < n; x++) seen[x] = -1;
    while (seen[cur] < 0) {
      seen[cur] = n_walk;
      walk[n_walk++] = cur;
      int best = -1;
      for (int i = at[cur]; i < at[cur] + len[cur]; i++) {
        const evt_pnode *p = &g->nodes[list[i]];
        for (int k = 0; k < p->nin; k++) {
          int e = g->in_edges[p->in0 + k], u = g->edges[e].u;
          if (evt_pgraph_kernel(g, u) && group[u] != cur && !gone[group[u]] && (best < 0 || e < best)) best = e;
        }
      }
      EVT_ASSERT(best >= 0);
      cur = group[g->edges[best].u];
    }
    int target = block[list[at[walk[seen[cur]]]]];
    for (int i = seen[cur]; i < n_walk; i++)
      for (int j = at[walk[i]]; j < at[walk[i]] + len[walk[i]]; j++) hit[block[list[j]]] = 1;
    for (int w = 0; w < n; w++)
      if (hit[block[w]]) block[w] = target;
  }
  free(indeg); free(q); free(at); free(len); free(list); free(seen); free(walk); free(isg); free(gone); free(hit);
  return cyclic;
}

/* One warning for everything that left a block unproven for want of time, size or a working solver. */
static void warn(const solver *s, const evt_part_stats *st, char *out, size_t cap) {
  size_t len = 0;
  out[0] = 0;
  if (st->too_large && len < cap)
    len += (size_t)snprintf(out + len, cap - len,
                            "evt partition: warning: %d block%s of up to %d nodes %s too large for the exact solver (MIP cap "
                            "%d nodes, %d co-consumer pairs): greedy grouping kept, not proven optimal (within %.2f%% of the "
                            "lower bound)\n",
                            st->too_large, st->too_large > 1 ? "s" : "", st->largest_too_large, st->too_large > 1 ? "are" : "is",
                            s->mip_max, EVT_MIP_MAX_PAIRS, 100 * s->too_large_gap);
  if (st->timeouts && len < cap)
    len += (size_t)snprintf(out + len, cap - len,
                            "evt partition: warning: the time limit of %g s ran out: %d block%s not proven optimal (%d not "
                            "searched: greedy grouping kept); largest gap %.2f%%\n",
                            s->limit, st->timeouts, st->timeouts > 1 ? "s" : "", st->late, 100 * st->max_gap);
  if (st->node_limited && len < cap)
    len += (size_t)snprintf(out + len, cap - len,
                            "evt partition: warning: %d block%s used the MIP's budget of branch-and-bound nodes unproven: the "
                            "best grouping found was kept, not proven optimal (the same on every machine); largest gap %.2f%%\n",
                            st->node_limited, st->node_limited > 1 ? "s" : "", 100 * st->max_gap);
  if (st->mip_failures && len < cap)
    len += (size_t)snprintf(out + len, cap - len,
                            "evt partition: warning: the MIP solver (CBC) failed on %d block%s: the best legal grouping found "
                            "(at worst the greedy one) was kept, not proven optimal\n",
                            st->mip_failures, st->mip_failures > 1 ? "s" : "");
  if (!s->opt->quiet && out[0]) fputs(out, stderr);
}

static void solver_init(solver *s, evt_pgraph *g, const evt_part_options *opt, const int *greedy, double t0) {
  int n = g->n;
  memset(s, 0, sizeof *s);
  s->w.g = g;
  s->opt = opt;
  s->greedy = greedy;
  s->limit = opt->time_limit;
  s->deadline = t0 + (opt->time_limit < 1e9 ? opt->time_limit : 1e9);
  s->mip_max = opt->mip_max_nodes > 0 ? opt->mip_max_nodes : EVT_MIP_MAX_NODES;
  s->w.forced = calloc((size_t)g->m + 1, 1);
  s->w.edge_var = malloc((size_t)(g->m + 1) * sizeof(int));
  s->w.loc = malloc((size_t)(n + 1) * sizeof(int));
  s->w.mark = calloc((size_t)n + 1, sizeof(int));
  s->w.row = malloc((size_t)(n + 1) * sizeof(int));
  s->first = malloc((size_t)(n + 1) * sizeof(int));
  s->w.entry_ix = malloc((size_t)(n + 1) * sizeof(int));
  s->w.exit_off = malloc((size_t)(n + 1) * sizeof(long));
  s->w.exits_known = calloc((size_t)n + 1, 1);
  EVT_ASSERT(s->w.forced && s->w.edge_var && s->w.loc && s->w.mark && s->w.row && s->first && s->w.entry_ix &&
             s->w.exit_off && s->w.exits_known);
  for (int e = 0; e < g->m; e++) s->w.edge_var[e] = -1;
  for (int v = 0; v < n; v++) s->w.loc[v] = s->w.row[v] = s->first[v] = s->w.entry_ix[v] = -1, s->w.exit_off[v] = -1;
  if (opt->use_cache) {
    char buf[1024];
    const char *dir = opt->cache_dir ? opt->cache_dir : evt_part_cache_default_dir(buf, sizeof buf);
    s->cache = evt_part_cache_new(dir, opt->cache_dir ? 1 : 2);
  }
}

static void solver_free(solver *s) {
  if (s->cache) evt_part_cache_free(s->cache);
  free(s->w.forced); free(s->w.edge_var); free(s->w.loc); free(s->w.mark); free(s->w.row); free(s->first);
  free(s->w.entry_ix); free(s->w.exit_off); free(s->w.exit_bits); free(s->w.exits_known);
}

/* Re-roots merged blocks at their smallest node; a merged block is unsolved. */
static void reroot(const evt_pgraph *g, const int *before, int *block, unsigned char *solved) {
  int n = g->n;
  for (int v = 0; v < n; v++)
    if (evt_pgraph_kernel(g, v) && block[v] != before[v]) solved[block[v]] = 0;
  int *root = malloc((size_t)(n + 1) * sizeof(int));
  EVT_ASSERT(root);
  for (int v = 0; v < n; v++) root[v] = -1;
  for (int v = 0; v < n; v++)
    if (evt_pgraph_kernel(g, v) && root[block[v]] < 0) root[block[v]] = v;
  for (int v = 0; v < n; v++)
    if (evt_pgraph_kernel(g, v)) {
      int nb = root[block[v]];
      solved[nb] = solved[block[v]] ? 1 : 0;
      block[v] = nb;
    }
  free(root);
}

/* Solves every unsolved block, then repairs couplings (merging the blocks on a cycle) until acyclic. */
static void solve_blocks(solver *s, int *block, int *group, evt_part_stats *st) {
  const evt_pgraph *g = s->w.g;
  int n = g->n;
  unsigned char *solved = calloc((size_t)n + 1, 1);   /* per block root */
  int *at = malloc((size_t)(n + 1) * sizeof(int)), *len = malloc((size_t)(n + 1) * sizeof(int));
  int *list = malloc((size_t)(n + 1) * sizeof(int)), *sol = malloc((size_t)(n + 1) * sizeof(int));
  int *before = malloc((size_t)(n + 1) * sizeof(int)), *waiting = malloc((size_t)(n + 1) * sizeof(int));
  EVT_ASSERT(solved && at && len && list && sol && before && waiting);
  for (int v = 0; v < n; v++) group[v] = -1;
  for (int round = 0;; round++) {
    block_lists(g, block, at, len, list);
    if (round == 0 && !s->late) {   /* the exits' reach for every block an exact solver may take */
      unsigned char *want = calloc((size_t)n + 1, 1);
      EVT_ASSERT(want);
      for (int r = 0; r < n; r++)
        want[r] = evt_pgraph_kernel(g, r) && block[r] == r && len[r] >= 2 &&
                  ((s->opt->use_dp && len[r] <= 64) || len[r] <= s->mip_max);
      if (!evt_part_exit_reach(&s->w, at, len, list, want, s->deadline)) s->late = true;
      free(want);
    }
    int nwait = 0;
    for (int r = 0; r < n; r++) {
      if (!evt_pgraph_kernel(g, r) || block[r] != r || solved[r]) continue;
      const int *nodes = list + at[r];
      int k = len[r];
      if (k > st->largest_component) st->largest_component = k;
      if (solve_block(s, nodes, k, sol, st)) waiting[nwait++] = r;
      for (int i = 0; i < k; i++) group[nodes[i]] = nodes[sol[i]];
      solved[r] = 1;
    }
    for (int i = 0; i < nwait; i++) {
      const int *nodes = list + at[waiting[i]];
      mip_block(s, nodes, len[waiting[i]], nwait - i, sol, st);
      for (int j = 0; j < len[waiting[i]]; j++) group[nodes[j]] = nodes[sol[j]];
    }
    memcpy(before, block, (size_t)n * sizeof(int));
    bool merged = merge_cycle(g, group, block);
    if (merged && !memcmp(before, block, (size_t)n * sizeof(int))) merged = false;   /* validate reports it */
    if (!merged) break;
    st->merges++;
    reroot(g, before, block, solved);
    for (int v = 0; v < n; v++)
      if (evt_pgraph_kernel(g, v) && !solved[block[v]]) s->w.exits_known[v] = 0;   /* merged: searched locally */
  }
  free(solved); free(at); free(len); free(list); free(sol); free(before); free(waiting);
}

evt_status evt_part_solve(evt_pgraph *g, const evt_part_options *opt, int *group, evt_part_stats *st) {
  double t0 = evt_now_s();
  int n = g->n;
  memset(st, 0, sizeof *st);
  st->proven = 1;
  evt_status rc = check_numbers(g, opt);
  if (rc != EVT_OK) return rc;
  int *greedy = malloc((size_t)(n + 1) * sizeof(int)), *block = malloc((size_t)(n + 1) * sizeof(int));
  EVT_ASSERT(greedy && block);
  evt_part_greedy(g, greedy);
  if (!opt->use_ilp) {
    memcpy(group, greedy, (size_t)n * sizeof(int));
    free(greedy);
    free(block);
    st->proven = 0;
    st->solve_seconds = evt_now_s() - t0;
    return evt_part_validate(g, group);
  }
  solver s;
  solver_init(&s, g, opt, greedy, t0);
  if (!find_blocks(&s.w, opt, s.deadline, block)) s.late = true;
  for (int v = 0; v < n; v++)
    if (evt_pgraph_kernel(g, v) && block[v] == v) st->components++;
  solve_blocks(&s, block, group, st);
  evt_part_normalize(g, group);
  st->scratch_peak = s.w.scratch_peak;
  warn(&s, st, st->warning, sizeof st->warning);
  solver_free(&s);
  free(block);
  free(greedy);
  st->solve_seconds = evt_now_s() - t0;
  return evt_part_validate(g, group);
}
