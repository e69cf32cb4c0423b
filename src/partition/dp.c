/* dp.c — an exact combinatorial solver for one block: dynamic programming over down-sets.
 *
 * Arcs of a block: its variable edges and its fixed arcs (u -> v: v's group comes after u's). A grouping
 * is legal when its groups can be numbered G_1..G_k so that every arc goes from a lower or equal number to
 * a higher one (fixed arcs strictly), no group holds a fixed, related or unrelated pair, and every FUSE
 * edge lies inside a group. The prefixes D_i = G_1 u .. u G_i are then *down-sets* (closed under arc
 * predecessors), and conversely every chain of down-sets 0 = D_0 < D_1 < .. < D_k = V whose differences
 * are legal groups is a legal grouping. The block cost (evt_pblock_cost) is a sum over groups of a
 * function of the group alone:
 *   lambda per connected piece,
 *   bytes(u) for u in G if u is a forced write or has a variable out-edge leaving G,
 *   fam_bytes(f) once per piece of G holding a consumer of family f, unless that piece also holds f's
 *   producer and all of the piece's consumers of f are joined to it by variable edges.
 * A group with several pieces costs the sum of its pieces, and its pieces (no arcs between them: a
 * variable edge would join them, a fixed arc is a forbidden pair) can be taken one after another, so
 * only *connected* groups (in the undirected graph of variable edges) need to be considered. Hence
 *   best(D') = min over down-sets D < D' with G = D' \ D connected and legal of best(D) + cost(G),
 * and best(V) is the optimum. The number of down-sets is exponential only in the block's width; the
 * groups from a down-set D are enumerated as connected sets rooted at their smallest node r (which must be
 * minimal in V \ D), growing only by larger nodes (each connected set once: the classic
 * extension/exclusion enumeration), pruned by forbidden pairs and by nodes with a predecessor that can no
 * longer join. Work is capped (down-sets and enumeration steps); over the cap the caller uses the MIP.
 * Blocks of more than 64 nodes are not handled (bit masks). */
#include "partition/partition.h"

#include <stdlib.h>
#include <string.h>

typedef uint64_t mask;
#define BIT(i) (1ull << (i))

typedef struct dp {
  const evt_pblock *b;
  int n;
  mask pred[64], forbid[64], fuse[64], adj[64], vsucc[64];
  mask written;
  int nfam;
  mask *cfix, *cvar;   /* per family: consumers always reading / consumers joined to the producer by a var edge */
  int *prod;           /* producer's local id, or -1 */
  double *fbytes;
  /* down-sets: open-addressing hash over masks */
  mask *set;
  double *best;
  int *arg;
  int nsets, capsets, maxsets;
  int *slot;
  size_t hcap;
  long work, max_work;
  /* scratch for the current transition source */
  int from;
  mask dmask, allowed;
} dp;

static size_t hash_mask(mask m) {
  m ^= m >> 33;
  m *= 0xff51afd7ed558ccdull;
  m ^= m >> 33;
  m *= 0xc4ceb9fe1a85ec53ull;
  m ^= m >> 33;
  return (size_t)m;
}

static int lookup(const dp *s, mask m) {
  size_t h = hash_mask(m) & (s->hcap - 1);
  while (s->slot[h] >= 0) {
    if (s->set[s->slot[h]] == m) return s->slot[h];
    h = (h + 1) & (s->hcap - 1);
  }
  return -1;
}

/* Doubles the arrays and the hash table (up to the cap). Returns false at the cap. */
static bool grow_table(dp *s) {
  if (s->capsets >= s->maxsets) return false;
  int cap = s->capsets * 2 < s->maxsets ? s->capsets * 2 : s->maxsets;
  s->set = realloc(s->set, (size_t)cap * sizeof(mask));
  s->best = realloc(s->best, (size_t)cap * sizeof(double));
  s->arg = realloc(s->arg, (size_t)cap * sizeof(int));
  s->capsets = cap;
  while (s->hcap < 2 * (size_t)cap) s->hcap <<= 1;
  free(s->slot);
  s->slot = malloc(s->hcap * sizeof(int));
  EVT_ASSERT(s->set && s->best && s->arg && s->slot);
  memset(s->slot, -1, s->hcap * sizeof(int));
  for (int i = 0; i < s->nsets; i++) {
    size_t h = hash_mask(s->set[i]) & (s->hcap - 1);
    while (s->slot[h] >= 0) h = (h + 1) & (s->hcap - 1);
    s->slot[h] = i;
  }
  return true;
}

/* Inserts m; returns its index, or -1 when the cap is reached. */
static int insert(dp *s, mask m) {
  int at = lookup(s, m);
  if (at >= 0) return at;
  if (s->nsets == s->capsets && !grow_table(s)) return -1;
  size_t h = hash_mask(m) & (s->hcap - 1);
  while (s->slot[h] >= 0) h = (h + 1) & (s->hcap - 1);
  s->slot[h] = s->nsets;
  s->set[s->nsets] = m;
  s->best[s->nsets] = 1e300;
  s->arg[s->nsets] = -1;
  return s->nsets++;
}

static double group_cost(const dp *s, mask g) {
  const evt_pblock *b = s->b;
  double c = b->lambda;
  for (mask r = g; r; r &= r - 1) {
    int u = __builtin_ctzll(r);
    if ((s->written & BIT(u)) || (s->vsucc[u] & ~g)) c += b->bytes[u];
  }
  for (int f = 0; f < s->nfam; f++) {
    if (s->cfix[f] & g) c += s->fbytes[f];
    else if ((s->cvar[f] & g) && !(s->prod[f] >= 0 && (g & BIT(s->prod[f])))) c += s->fbytes[f];
  }
  return c;
}

/* A candidate group g from down-set s->dmask. */
static void consider(dp *s, mask g) {
  mask d2 = s->dmask | g;
  for (mask r = g; r; r &= r - 1) {
    int x = __builtin_ctzll(r);
    if ((s->pred[x] & ~d2) || (s->fuse[x] & ~g)) return;
  }
  int to = lookup(s, d2);
  EVT_ASSERT(to >= 0);   /* every down-set was enumerated */
  double c = s->best[s->from] + group_cost(s, g);
  if (c < s->best[to]) s->best[to] = c, s->arg[to] = s->from;
}

/* Connected sets g (grown by nodes of `allowed`) containing the current set, each once. */
static void grow(dp *s, mask g, mask cand, mask excl, mask allowed) {
  if (++s->work > s->max_work) return;
  consider(s, g);
  while (cand) {
    int v = __builtin_ctzll(cand);
    cand &= cand - 1;
    mask al = allowed & ~s->forbid[v];
    mask g2 = g | BIT(v);
    grow(s, g2, (cand | s->adj[v]) & al & ~g2 & ~excl, excl, al);
    if (s->work > s->max_work) return;
    excl |= BIT(v);
  }
}

int evt_dp_solve_block(const evt_pblock *b, long max_sets, long max_work, int *sol, double *objective,
                       long *nsets_out) {
  int n = b->n;
  if (n > 64 || n < 1) return 0;
  dp s;
  memset(&s, 0, sizeof s);
  s.b = b, s.n = n;
  for (int i = 0; i < b->nvar; i++) {
    int u = b->var[i][0], v = b->var[i][1];
    s.pred[v] |= BIT(u);
    s.adj[u] |= BIT(v), s.adj[v] |= BIT(u);
    s.vsucc[u] |= BIT(v);
    if (b->var_fuse[i]) s.fuse[u] |= BIT(v), s.fuse[v] |= BIT(u);
  }
  for (int i = 0; i < b->nfix; i++) {
    int u = b->fix[i][0], v = b->fix[i][1];
    s.pred[v] |= BIT(u);
    s.forbid[u] |= BIT(v), s.forbid[v] |= BIT(u);
  }
  for (int i = 0; i < b->nrel + b->nunrel; i++) {
    const int *p = i < b->nrel ? b->rel[i] : b->unrel[i - b->nrel];
    s.forbid[p[0]] |= BIT(p[1]), s.forbid[p[1]] |= BIT(p[0]);
  }
  for (int v = 0; v < n; v++)
    if (b->written[v]) s.written |= BIT(v);
  s.nfam = b->nfam;
  s.cfix = calloc((size_t)b->nfam + 1, sizeof(mask));
  s.cvar = calloc((size_t)b->nfam + 1, sizeof(mask));
  s.prod = malloc((size_t)(b->nfam + 1) * sizeof(int));
  s.fbytes = malloc((size_t)(b->nfam + 1) * sizeof(double));
  EVT_ASSERT(s.cfix && s.cvar && s.prod && s.fbytes);
  for (int f = 0; f < b->nfam; f++) {
    s.prod[f] = -1;
    s.fbytes[f] = b->fam_bytes[f];
    for (int i = b->fam_start[f]; i < b->fam_start[f] + b->fam_len[f]; i++) {
      if (b->fam_var[i] >= 0) {
        s.cvar[f] |= BIT(b->fam_cons[i]);
        s.prod[f] = b->var[b->fam_var[i]][0];
      } else {
        s.cfix[f] |= BIT(b->fam_cons[i]);
      }
    }
  }
  s.maxsets = max_sets < 1 ? 1 : max_sets > (1 << 26) ? (1 << 26) : (int)max_sets;
  s.capsets = s.maxsets < 256 ? s.maxsets : 256;
  s.hcap = 1;
  while (s.hcap < 2 * (size_t)s.capsets) s.hcap <<= 1;
  s.set = malloc((size_t)s.capsets * sizeof(mask));
  s.best = malloc((size_t)s.capsets * sizeof(double));
  s.arg = malloc((size_t)s.capsets * sizeof(int));
  s.slot = malloc(s.hcap * sizeof(int));
  EVT_ASSERT(s.set && s.best && s.arg && s.slot);
  memset(s.slot, -1, s.hcap * sizeof(int));
  s.max_work = max_work;
  mask all = n == 64 ? ~0ull : BIT(n) - 1;
  int ok = 1;
  /* breadth first: layer k holds the down-sets of k nodes, so indices are in popcount order */
  insert(&s, 0);
  for (int i = 0; i < s.nsets && ok; i++) {
    mask d = s.set[i];
    for (mask r = all & ~d; r; r &= r - 1) {
      int v = __builtin_ctzll(r);
      if ((s.pred[v] & ~d) == 0 && insert(&s, d | BIT(v)) < 0) { ok = 0; break; }
    }
  }
  if (ok) {
    s.best[0] = 0;
    for (int i = 0; i < s.nsets && ok; i++) {
      mask d = s.set[i];
      if (s.best[i] >= 1e299) continue;
      s.from = i, s.dmask = d;
      mask rest = all & ~d;
      for (mask r = rest; r; r &= r - 1) {
        int root = __builtin_ctzll(r);
        if (s.pred[root] & ~d) continue;   /* the smallest node of a group is minimal in V \ D */
        /* nodes that may join: larger than root, not in d, and no predecessor that can never join */
        mask allowed = 0;
        for (mask q = rest & ~(BIT(root + 1) - 1) & ~BIT(root); q; q &= q - 1) {
          int x = __builtin_ctzll(q);
          mask need = s.pred[x] & ~d;
          if (need & (BIT(root) - 1)) continue;   /* a predecessor below root, outside d */
          allowed |= BIT(x);
        }
        allowed &= ~s.forbid[root];
        grow(&s, BIT(root), s.adj[root] & allowed, 0, allowed);
        if (s.work > s.max_work) { ok = 0; break; }
      }
    }
  }
  if (nsets_out) *nsets_out = s.nsets;
  if (ok) {
    int last = lookup(&s, all);
    EVT_ASSERT(last >= 0);
    if (s.best[last] >= 1e299) ok = 0;   /* no legal grouping (cannot happen for a satisfiable block) */
    else {
      *objective = s.best[last];
      for (int i = last; i > 0;) {
        int j = s.arg[i];
        mask g = s.set[i] & ~s.set[j];
        int first = __builtin_ctzll(g);
        for (mask r = g; r; r &= r - 1) sol[__builtin_ctzll(r)] = first;
        i = j;
      }
    }
  }
  free(s.cfix); free(s.cvar); free(s.prod); free(s.fbytes);
  free(s.set); free(s.best); free(s.arg); free(s.slot);
  return ok;
}
