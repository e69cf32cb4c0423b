/* ilp.c — the exact MIP of one block (a component, or a union of components) with CBC.
 *
 * Edge formulation (Megiddo–Sarkar potentials), local ids 0..n-1:
 *   x_e in {0,1} per variable edge e = (u,v): 1 = the tensor goes through global memory (cut);
 *                FUSE edges have x_e = 0.
 *   pi_v in [0, n]: group order. x_e <= pi_v - pi_u <= n x_e, so an uncut edge keeps pi equal and a cut
 *                edge raises it; groups (components of uncut edges) are then numbered consistently with
 *                every edge, i.e. the contracted graph is acyclic. (n bounds the number of groups on a
 *                chain; the longest node path would not: a chain of groups can be longer.)
 *   fixed arcs (cut edges inside, and pairs joined by a path leaving the block): pi_v >= pi_u + 1.
 *   m_u in [0,1] >= x_e for u's variable out-edges (write), unless u is written anyway.
 *   s_vw in [0,1] for co-consumers v < w of one tensor: "v and w are in one group". Valid upper bounds:
 *                s <= 1 - x_e on an edge, s = 0 on fixed
 *                arcs and incompatible pairs; and, lazily, the connectivity cut
 *                s_vw <= sum_{e in delta(S)} (1 - x_e) for the group S of v in a solution that claimed
 *                s_vw = 1 with w outside S (any uncut path from v to w crosses delta(S)).
 *   kernels: l_v in {0,1} marks a leader; a flow on uncut edges (f <= n (1 - x_e), both directions) from
 *                leaders (g_v <= n l_v) delivers one unit to every node, so every group holds a leader and
 *                minimizing lambda sum l_v counts the groups exactly.
 *   y_fi in [0,1] >= reads_i - sum_{j<i} s_{c_i c_j} for member i of a read family (one producer's
 *                consumers inside; reads_i = x_e, or 1 if the producer is outside): one read per group.
 *   related incompatible pairs a -> b (two nuclei, or a nucleus and a member compat rejects):
 *                pi_b >= pi_a + 1. Unrelated pairs, lazily: "some edge on this joining path is cut".
 *   minimize  sum bytes(u) m_u + sum bytes_f y_fi + lambda sum l_v  (+ forced writes)
 * The s bounds are relaxations (s may claim "same group" wrongly); the loop solves, compares the
 * objective with the true cost of the grouping x defines, adds connectivity cuts for the wrong s and
 * unrelated-pair rows, and re-solves with the best legal grouping as MIP start (CBC 2.10's C API has no
 * lazy-constraint callback, and a model cannot be modified after Cbc_solve, so it is rebuilt). When x's
 * true cost equals the objective, x is optimal: every legal grouping with its exact s satisfies every
 * row ever added. The objective is scaled so its largest coefficient is 1; gaps are 1e-10.
 * Branch-and-bound nodes are budgeted per block over its rounds (node_limit): a block that runs out of them stops
 * at the same point on every machine, so its plan is reproducible; the time limit is only the safety net.
 * A timeout returns the best legal grouping found (at worst the MIP start), never an illegal one; so does a
 * failure of CBC (abandoned, non-finite values, a solution that breaks a row), reported in `failed`.
 * Storage is sparse: the s columns and the forbidden pairs live in hash maps over the pairs that exist. */
#include "partition/partition.h"

#include <coin/Cbc_C_Interface.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void evt_pblock_free(evt_pblock *b) {
  if (!b) return;
  free(b->gid); free(b->var); free(b->var_fuse); free(b->var_bytes); free(b->fix); free(b->rel);
  free(b->unrel); free(b->written); free(b->has_var_out); free(b->bytes); free(b->kin); free(b->fixed_in);
  free(b->label); free(b->fam_start); free(b->fam_len); free(b->fam_cons); free(b->fam_var); free(b->fam_bytes);
  memset(b, 0, sizeof *b);
}

static int uf(int *p, int x) {
  while (p[x] != x) x = p[x] = p[p[x]];
  return x;
}

/* comp[v]: the connected piece of v's group (uncut variable edges inside one group). */
static void pieces(const evt_pblock *b, const int *sol, int *comp) {
  for (int v = 0; v < b->n; v++) comp[v] = v;
  for (int i = 0; i < b->nvar; i++)
    if (sol[b->var[i][0]] == sol[b->var[i][1]]) {
      int a = uf(comp, b->var[i][0]), c = uf(comp, b->var[i][1]);
      if (a != c) comp[c] = a;
    }
  for (int v = 0; v < b->n; v++) comp[v] = uf(comp, v);
}

double evt_pblock_cost(const evt_pblock *b, const int *sol) {
  int n = b->n;
  double c = 0;
  int *comp = malloc((size_t)(n + 1) * sizeof(int)), *stamp = malloc((size_t)(n + 1) * sizeof(int));
  unsigned char *w = calloc((size_t)n + 1, 1);
  EVT_ASSERT(comp && stamp && w);
  pieces(b, sol, comp);
  for (int i = 0; i < b->nvar; i++)
    if (comp[b->var[i][0]] != comp[b->var[i][1]]) w[b->var[i][0]] = 1;
  for (int v = 0; v < n; v++) {
    if (w[v] || b->written[v]) c += b->bytes[v];
    if (comp[v] == v) c += b->lambda;
    stamp[v] = -1;
  }
  for (int f = 0; f < b->nfam; f++)
    for (int k = 0; k < b->fam_len[f]; k++) {
      int i = b->fam_start[f] + k, cons = b->fam_cons[i], e = b->fam_var[i];
      if (e >= 0 && comp[b->var[e][0]] == comp[cons]) continue;   /* inside the producer's group */
      if (stamp[comp[cons]] == f) continue;                        /* this group already reads it */
      stamp[comp[cons]] = f;
      c += b->fam_bytes[f];
    }
  free(comp);
  free(stamp);
  free(w);
  return c;
}

/* Longest-path levels of the groups of sol[] over the block's arcs (variable edges and fixed arcs), by
 * Kahn's algorithm on the contracted graph; false if it has a cycle. lvl[] is per group label (< n). */
static bool group_levels(const evt_pblock *b, const int *sol, int *lvl) {
  int n = b->n, na = b->nvar + b->nfix, done = 0, groups = 0;
  int *indeg = calloc((size_t)n + 1, sizeof(int)), *start = calloc((size_t)n + 2, sizeof(int));
  int *to = malloc((size_t)(na + 1) * sizeof(int)), *queue = malloc((size_t)(n + 1) * sizeof(int));
  unsigned char *isg = calloc((size_t)n + 1, 1);
  EVT_ASSERT(indeg && start && to && queue && isg);
  for (int v = 0; v < n; v++) lvl[v] = 0, groups += !isg[sol[v]], isg[sol[v]] = 1;
  for (int i = 0; i < na; i++) {
    const int *a = i < b->nvar ? b->var[i] : b->fix[i - b->nvar];
    if (sol[a[0]] != sol[a[1]]) start[sol[a[0]] + 1]++, indeg[sol[a[1]]]++;
  }
  for (int x = 0; x < n; x++) start[x + 1] += start[x];
  for (int i = 0; i < na; i++) {
    const int *a = i < b->nvar ? b->var[i] : b->fix[i - b->nvar];
    if (sol[a[0]] != sol[a[1]]) to[start[sol[a[0]]]++] = sol[a[1]];
  }
  for (int x = n; x > 0; x--) start[x] = start[x - 1];
  start[0] = 0;
  int h = 0, t = 0;
  for (int x = 0; x < n; x++)
    if (isg[x] && indeg[x] == 0) queue[t++] = x;
  while (h < t) {
    int x = queue[h++];
    done++;
    for (int k = start[x]; k < start[x + 1]; k++) {
      int y = to[k];
      if (lvl[y] < lvl[x] + 1) lvl[y] = lvl[x] + 1;
      if (--indeg[y] == 0) queue[t++] = y;
    }
  }
  free(indeg); free(start); free(to); free(queue); free(isg);
  return done == groups;
}

bool evt_pblock_legal(const evt_pblock *b, const int *sol) {
  int n = b->n;
  for (int v = 0; v < n; v++)
    if (sol[v] < 0 || sol[v] >= n) return false;
  for (int i = 0; i < b->nvar; i++)
    if (b->var_fuse[i] && sol[b->var[i][0]] != sol[b->var[i][1]]) return false;
  for (int i = 0; i < b->nrel; i++)
    if (sol[b->rel[i][0]] == sol[b->rel[i][1]]) return false;
  for (int i = 0; i < b->nunrel; i++)
    if (sol[b->unrel[i][0]] == sol[b->unrel[i][1]]) return false;
  for (int i = 0; i < b->nfix; i++)
    if (sol[b->fix[i][0]] == sol[b->fix[i][1]]) return false;
  int *lvl = malloc((size_t)(n + 1) * sizeof(int));
  EVT_ASSERT(lvl);
  bool ok = group_levels(b, sol, lvl);
  free(lvl);
  return ok;
}

/* Group levels of a legal grouping: the potentials of the MIP start. */
static void levels(const evt_pblock *b, const int *sol, double *pi) {
  int *lvl = malloc((size_t)(b->n + 1) * sizeof(int));
  EVT_ASSERT(lvl);
  EVT_ASSERT(group_levels(b, sol, lvl));
  for (int v = 0; v < b->n; v++) pi[v] = lvl[sol[v]];
  free(lvl);
}

/* Groups of an x vector: components of the uncut variable edges, labelled by their root. */
static void groups_of(const evt_pblock *b, const double *x, int *sol) {
  for (int v = 0; v < b->n; v++) sol[v] = v;
  for (int i = 0; i < b->nvar; i++)
    if (x[i] < 0.5) {
      int a = uf(sol, b->var[i][0]), c = uf(sol, b->var[i][1]);
      if (a != c) sol[c] = a;
    }
  for (int v = 0; v < b->n; v++) sol[v] = uf(sol, v);
}

/* Variable edges at each node, in increasing edge index (the order the dense loops used). */
typedef struct incidence {
  int *start, *edge;
} incidence;

static void incidence_init(const evt_pblock *b, incidence *I) {
  int n = b->n;
  I->start = calloc((size_t)n + 2, sizeof(int));
  I->edge = malloc((size_t)(2 * b->nvar + 1) * sizeof(int));
  EVT_ASSERT(I->start && I->edge);
  for (int i = 0; i < b->nvar; i++) I->start[b->var[i][0] + 1]++, I->start[b->var[i][1] + 1]++;
  for (int v = 0; v < n; v++) I->start[v + 1] += I->start[v];
  for (int i = 0; i < b->nvar; i++) I->edge[I->start[b->var[i][0]]++] = i, I->edge[I->start[b->var[i][1]]++] = i;
  for (int v = n; v > 0; v--) I->start[v] = I->start[v - 1];
  I->start[0] = 0;
}

static void incidence_free(incidence *I) {
  free(I->start);
  free(I->edge);
}

/* Undirected path of uncut variable edges from a to c (edge indices into path[]); its length. */
static int uncut_path(const evt_pblock *b, const incidence *I, const int *sol, int a, int c, int *path) {
  int n = b->n;
  int *from = malloc((size_t)(n + 1) * sizeof(int)), *queue = malloc((size_t)(n + 1) * sizeof(int));
  EVT_ASSERT(from && queue);
  for (int v = 0; v < n; v++) from[v] = -2;
  int head = 0, tail = 0;
  queue[tail++] = a;
  from[a] = -1;
  while (head < tail && from[c] == -2) {
    int x = queue[head++];
    for (int k = I->start[x]; k < I->start[x + 1]; k++) {
      int i = I->edge[k], u = b->var[i][0], v = b->var[i][1];
      if (sol[u] != sol[v]) continue;
      int y = u == x ? v : u;
      if (from[y] == -2) from[y] = i, queue[tail++] = y;
    }
  }
  int len = 0;
  for (int y = c; from[y] >= 0;) {
    int i = from[y];
    path[len++] = i;
    y = b->var[i][0] == y ? b->var[i][1] : b->var[i][0];
  }
  free(from);
  free(queue);
  return len;
}

/* Rows found lazily: sum cols[k] * vals[k] (sense) rhs, over the fixed column layout. */
typedef struct lazy_rows {
  int n, cap, *start, *len, nidx, capidx, *col;
  double *val, *rhs;
  char *sense;
} lazy_rows;

static void lazy_add(lazy_rows *l, const int *cols, const double *vals, int len, char sense, double rhs) {
  if (l->n == l->cap) {
    l->cap = l->cap ? 2 * l->cap : 16;
    l->start = realloc(l->start, (size_t)l->cap * sizeof(int));
    l->len = realloc(l->len, (size_t)l->cap * sizeof(int));
    l->rhs = realloc(l->rhs, (size_t)l->cap * sizeof(double));
    l->sense = realloc(l->sense, (size_t)l->cap);
  }
  while (l->nidx + len > l->capidx) {
    l->capidx = l->capidx ? 2 * l->capidx : 64;
    l->col = realloc(l->col, (size_t)l->capidx * sizeof(int));
    l->val = realloc(l->val, (size_t)l->capidx * sizeof(double));
  }
  EVT_ASSERT(l->start && l->len && l->rhs && l->sense && l->col && l->val);
  l->start[l->n] = l->nidx;
  l->len[l->n] = len;
  l->rhs[l->n] = rhs;
  l->sense[l->n++] = sense;
  memcpy(l->col + l->nidx, cols, (size_t)len * sizeof(int));
  memcpy(l->val + l->nidx, vals, (size_t)len * sizeof(double));
  l->nidx += len;
}

static void lazy_free(lazy_rows *l) {
  free(l->start); free(l->len); free(l->col); free(l->val); free(l->rhs); free(l->sense);
}

/* A set of node pairs v < w (key v * n + w) with a value each: open addressing. */
typedef struct pairmap {
  uint64_t *key;   /* key + 1; 0 = empty */
  int *val;
  size_t cap, count;
} pairmap;

static size_t pm_slot(const pairmap *p, uint64_t key) {
  uint64_t h = key * 0x9e3779b97f4a7c15ull;
  size_t i = (size_t)(h ^ (h >> 29)) & (p->cap - 1);
  while (p->key[i] && p->key[i] != key + 1) i = (i + 1) & (p->cap - 1);
  return i;
}

static void pm_init(pairmap *p, size_t expect) {
  p->cap = 16;
  while (p->cap < 2 * expect + 2) p->cap *= 2;
  p->key = calloc(p->cap, sizeof(uint64_t));
  p->val = malloc(p->cap * sizeof(int));
  p->count = 0;
  EVT_ASSERT(p->key && p->val);
}

static uint64_t pm_key(int n, int v, int w) { return v < w ? (uint64_t)v * (uint64_t)n + (uint64_t)w : (uint64_t)w * (uint64_t)n + (uint64_t)v; }

/* Inserts (v, w) with value x unless present; returns its value. */
static int pm_put(pairmap *p, int n, int v, int w, int x) {
  uint64_t key = pm_key(n, v, w);
  size_t i = pm_slot(p, key);
  if (p->key[i]) return p->val[i];
  p->key[i] = key + 1, p->val[i] = x, p->count++;
  return x;
}

static int pm_get(const pairmap *p, int n, int v, int w) {
  size_t i = pm_slot(p, pm_key(n, v, w));
  return p->key[i] ? p->val[i] : -1;
}

static void pm_free(pairmap *p) {
  free(p->key);
  free(p->val);
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* Column layout of a block's MIP. */
typedef struct layout {
  int ncols, xcol, picol, fcol, gcol, lcol, ycol;
  int *mcol;          /* per node, -1 if no write variable */
  pairmap s;          /* co-consumers v < w of one tensor -> their s column */
  uint64_t *pairs;    /* their keys, ascending (= column order) */
  int npairs;
  pairmap forbid;     /* pairs that never share a group: fixed arcs, incompatible pairs (value 1) */
  incidence inc;
  double scale, constant;   /* objective scale; forced writes */
} layout;

static void layout_pairs(const evt_pblock *b, layout *L, int *col) {
  int n = b->n;
  size_t expect = 0;
  for (int f = 0; f < b->nfam; f++) expect += (size_t)b->fam_len[f] * (size_t)(b->fam_len[f] - 1) / 2;
  pm_init(&L->s, expect);
  L->pairs = malloc((expect + 1) * sizeof(uint64_t));
  EVT_ASSERT(L->pairs);
  L->npairs = 0;
  for (int f = 0; f < b->nfam; f++)
    for (int i = b->fam_start[f]; i < b->fam_start[f] + b->fam_len[f]; i++)
      for (int j = b->fam_start[f]; j < i; j++)
        if (pm_put(&L->s, n, b->fam_cons[j], b->fam_cons[i], 0) == 0 && L->s.count > (size_t)L->npairs)
          L->pairs[L->npairs++] = pm_key(n, b->fam_cons[j], b->fam_cons[i]);
  qsort(L->pairs, (size_t)L->npairs, sizeof(uint64_t), cmp_u64);
  for (int i = 0; i < L->npairs; i++) {
    int v = (int)(L->pairs[i] / (uint64_t)n), w = (int)(L->pairs[i] % (uint64_t)n);
    L->s.val[pm_slot(&L->s, pm_key(n, v, w))] = (*col)++;
  }
  pm_init(&L->forbid, (size_t)(b->nfix + b->nrel + b->nunrel));
  for (int i = 0; i < b->nfix + b->nrel + b->nunrel; i++) {
    const int *pr = i < b->nfix ? b->fix[i] : i < b->nfix + b->nrel ? b->rel[i - b->nfix] : b->unrel[i - b->nfix - b->nrel];
    pm_put(&L->forbid, n, pr[0], pr[1], 1);
  }
}

static void layout_init(const evt_pblock *b, layout *L) {
  int n = b->n, col = 0;
  L->mcol = malloc((size_t)(n + 1) * sizeof(int));
  EVT_ASSERT(L->mcol);
  L->xcol = col, col += b->nvar;
  L->picol = col, col += n;
  L->constant = 0;
  for (int v = 0; v < n; v++) {
    L->mcol[v] = b->has_var_out[v] && !b->written[v] ? col++ : -1;
    if (b->written[v]) L->constant += b->bytes[v];
  }
  layout_pairs(b, L, &col);
  incidence_init(b, &L->inc);
  L->fcol = col, col += 2 * b->nvar;
  L->gcol = col, col += n;
  L->lcol = col, col += n;
  L->ycol = col;
  col += b->nfam ? b->fam_start[b->nfam - 1] + b->fam_len[b->nfam - 1] : 0;
  L->ncols = col;
  L->scale = b->lambda;
  for (int v = 0; v < n; v++) L->scale = b->bytes[v] > L->scale ? b->bytes[v] : L->scale;
  for (int f = 0; f < b->nfam; f++) L->scale = b->fam_bytes[f] > L->scale ? b->fam_bytes[f] : L->scale;
  if (L->scale <= 0) L->scale = 1;
}

static void layout_free(layout *L) {
  free(L->mcol);
  free(L->pairs);
  pm_free(&L->s);
  pm_free(&L->forbid);
  incidence_free(&L->inc);
}

static int scol(const layout *L, int n, int v, int w) { return pm_get(&L->s, n, v, w); }
static bool forbidden(const layout *L, int n, int v, int w) { return pm_get(&L->forbid, n, v, w) > 0; }

/* Start values of the flow: leaders are the roots of the pieces; flow runs along a BFS tree from each, an
 * edge carrying its subtree size. */
static void start_flow(const evt_pblock *b, const layout *L, const int *comp, double *val) {
  int n = b->n;
  int *order = malloc((size_t)(n + 1) * sizeof(int)), *pedge = malloc((size_t)(n + 1) * sizeof(int));
  int *seen = calloc((size_t)n + 1, sizeof(int));
  double *sub = malloc((size_t)(n + 1) * sizeof(double));
  EVT_ASSERT(order && pedge && seen && sub);
  for (int r = 0; r < n; r++) {
    if (comp[r] != r) continue;
    val[L->lcol + r] = 1;
    int h = 0, t = 0;
    order[t++] = r;
    pedge[r] = -1;
    seen[r] = 1;
    while (h < t) {
      int x = order[h++];
      for (int k = L->inc.start[x]; k < L->inc.start[x + 1]; k++) {
        int i = L->inc.edge[k], u = b->var[i][0], v = b->var[i][1];
        if (comp[u] != comp[v]) continue;
        int y = u == x ? v : u;
        if (seen[y]) continue;
        seen[y] = 1, pedge[y] = i, order[t++] = y;
      }
    }
    for (int k = t - 1; k >= 0; k--) sub[order[k]] = 1;
    for (int k = t - 1; k > 0; k--) {
      int y = order[k], i = pedge[y];
      int parent = b->var[i][0] == y ? b->var[i][1] : b->var[i][0];
      sub[parent] += sub[y];
      val[L->fcol + 2 * i + (b->var[i][1] == y ? 0 : 1)] = sub[y];   /* +: u -> v, -: v -> u */
    }
    val[L->gcol + r] = t;
  }
  free(order);
  free(pedge);
  free(seen);
  free(sub);
}

/* The exact values of every column for a legal grouping (the MIP start). */
static void start_values(const evt_pblock *b, const layout *L, const int *sol, double *val) {
  int n = b->n;
  int *comp = malloc((size_t)(n + 1) * sizeof(int)), *stamp = malloc((size_t)(n + 1) * sizeof(int));
  double *pi = malloc((size_t)(n + 1) * sizeof(double));
  EVT_ASSERT(comp && stamp && pi);
  memset(val, 0, (size_t)L->ncols * sizeof(double));
  pieces(b, sol, comp);
  levels(b, comp, pi);
  for (int i = 0; i < b->nvar; i++) {
    int cut = comp[b->var[i][0]] != comp[b->var[i][1]];
    val[L->xcol + i] = cut;
    if (cut && L->mcol[b->var[i][0]] >= 0) val[L->mcol[b->var[i][0]]] = 1;
  }
  for (int v = 0; v < n; v++) val[L->picol + v] = pi[v], stamp[v] = -1;
  for (int i = 0; i < L->npairs; i++) {
    int v = (int)(L->pairs[i] / (uint64_t)n), w = (int)(L->pairs[i] % (uint64_t)n);
    val[scol(L, n, v, w)] = comp[v] == comp[w];
  }
  start_flow(b, L, comp, val);
  for (int f = 0; f < b->nfam; f++)
    for (int k = 0; k < b->fam_len[f]; k++) {
      int i = b->fam_start[f] + k, cons = b->fam_cons[i], e = b->fam_var[i];
      if (e >= 0 && comp[b->var[e][0]] == comp[cons]) continue;
      if (stamp[comp[cons]] == f) continue;
      stamp[comp[cons]] = f;
      val[L->ycol + i] = 1;
    }
  free(comp);
  free(stamp);
  free(pi);
}

static void row(Cbc_Model *m, int k, int *c, double *v, char sense, double rhs) { Cbc_addRow(m, "", k, c, v, sense, rhs); }

/* Row scratch of at least `need` entries. */
typedef struct rowbuf {
  int *c, cap;
  double *v;
} rowbuf;

static void rb_need(rowbuf *r, int need) {
  if (need <= r->cap) return;
  r->cap = need;
  r->c = realloc(r->c, (size_t)need * sizeof(int));
  r->v = realloc(r->v, (size_t)need * sizeof(double));
  EVT_ASSERT(r->c && r->v);
}

static void add_columns(Cbc_Model *m, const evt_pblock *b, const layout *L) {
  int n = b->n;
  double sc = L->scale;
  for (int i = 0; i < b->nvar; i++) Cbc_addCol(m, "", 0, b->var_fuse[i] ? 0 : 1, 0, 1, 0, NULL, NULL);
  for (int v = 0; v < n; v++) Cbc_addCol(m, "", 0, n, 0, 0, 0, NULL, NULL);
  for (int v = 0; v < n; v++)
    if (L->mcol[v] >= 0) Cbc_addCol(m, "", 0, 1, b->bytes[v] / sc, 0, 0, NULL, NULL);
  for (int i = 0; i < L->npairs; i++) {
    int v = (int)(L->pairs[i] / (uint64_t)n), w = (int)(L->pairs[i] % (uint64_t)n);
    Cbc_addCol(m, "", 0, forbidden(L, n, v, w) ? 0 : 1, 0, 0, 0, NULL, NULL);
  }
  for (int i = 0; i < 2 * b->nvar; i++) Cbc_addCol(m, "", 0, n, 0, 0, 0, NULL, NULL);
  for (int v = 0; v < n; v++) Cbc_addCol(m, "", 0, n, 0, 0, 0, NULL, NULL);
  for (int v = 0; v < n; v++) Cbc_addCol(m, "", 0, 1, b->lambda / sc, 1, 0, NULL, NULL);
  for (int f = 0; f < b->nfam; f++)
    for (int k = 0; k < b->fam_len[f]; k++) Cbc_addCol(m, "", 0, 1, b->fam_bytes[f] / sc, 0, 0, NULL, NULL);
}

/* Per variable edge: potentials, write, s <= 1 - x, flow only when uncut; groups >= nodes - uncut edges. */
static void add_edge_rows(Cbc_Model *m, const evt_pblock *b, const layout *L, rowbuf *r) {
  int n = b->n;
  rb_need(r, n + b->nvar + 8);
  int *rc = r->c;
  double *rv = r->v;
  for (int i = 0; i < b->nvar; i++) {
    int u = b->var[i][0], v = b->var[i][1];
    rc[0] = L->picol + v, rc[1] = L->picol + u, rc[2] = L->xcol + i;
    rv[0] = 1, rv[1] = -1, rv[2] = -1;
    row(m, 3, rc, rv, 'G', 0);
    rv[2] = -(double)n;
    row(m, 3, rc, rv, 'L', 0);
    if (L->mcol[u] >= 0) {
      rc[0] = L->mcol[u], rc[1] = L->xcol + i, rv[0] = 1, rv[1] = -1;
      row(m, 2, rc, rv, 'G', 0);
    }
    if (scol(L, n, u, v) >= 0) {
      rc[0] = scol(L, n, u, v), rc[1] = L->xcol + i, rv[0] = 1, rv[1] = 1;   /* s_uv <= 1 - x_e */
      row(m, 2, rc, rv, 'L', 1);
    }
    for (int d = 0; d < 2; d++) {   /* flow only on uncut edges */
      rc[0] = L->fcol + 2 * i + d, rc[1] = L->xcol + i, rv[0] = 1, rv[1] = n;
      row(m, 2, rc, rv, 'L', n);
    }
  }
  int k = 0;   /* valid: groups >= nodes - uncut edges */
  for (int v = 0; v < n; v++) rc[k] = L->lcol + v, rv[k++] = 1;
  for (int i = 0; i < b->nvar; i++) rc[k] = L->xcol + i, rv[k++] = -1;
  row(m, k, rc, rv, 'G', n - b->nvar);
}

/* Flow conservation per node, fixed and related arcs, and the one-read-per-group rows of the families. */
static void add_node_rows(Cbc_Model *m, const evt_pblock *b, const layout *L, rowbuf *r) {
  int n = b->n;
  for (int v = 0; v < n; v++) {   /* inflow - outflow + g_v = 1; g_v <= n l_v */
    int k = 0;
    rb_need(r, 2 * (L->inc.start[v + 1] - L->inc.start[v]) + 2);
    for (int q = L->inc.start[v]; q < L->inc.start[v + 1]; q++) {
      int i = L->inc.edge[q];
      if (b->var[i][1] == v) r->c[k] = L->fcol + 2 * i, r->v[k++] = 1, r->c[k] = L->fcol + 2 * i + 1, r->v[k++] = -1;
      if (b->var[i][0] == v) r->c[k] = L->fcol + 2 * i + 1, r->v[k++] = 1, r->c[k] = L->fcol + 2 * i, r->v[k++] = -1;
    }
    r->c[k] = L->gcol + v, r->v[k++] = 1;
    row(m, k, r->c, r->v, 'E', 1);
    r->c[0] = L->gcol + v, r->c[1] = L->lcol + v, r->v[0] = 1, r->v[1] = -(double)n;
    row(m, 2, r->c, r->v, 'L', 0);
  }
  for (int i = 0; i < b->nfix + b->nrel; i++) {
    int u = i < b->nfix ? b->fix[i][0] : b->rel[i - b->nfix][0];
    int v = i < b->nfix ? b->fix[i][1] : b->rel[i - b->nfix][1];
    r->c[0] = L->picol + v, r->c[1] = L->picol + u, r->v[0] = 1, r->v[1] = -1;
    row(m, 2, r->c, r->v, 'G', 1);
  }
  for (int f = 0; f < b->nfam; f++)
    for (int a = 0; a < b->fam_len[f]; a++) {   /* y_i + sum_{j<i} s_{c_i c_j} - reads_i >= 0 */
      int i = b->fam_start[f] + a, k = 0;
      rb_need(r, a + 3);
      r->c[k] = L->ycol + i, r->v[k++] = 1;
      for (int j = b->fam_start[f]; j < i; j++)
        if (!forbidden(L, n, b->fam_cons[j], b->fam_cons[i])) r->c[k] = scol(L, n, b->fam_cons[j], b->fam_cons[i]), r->v[k++] = 1;
      if (b->fam_var[i] >= 0) {
        r->c[k] = L->xcol + b->fam_var[i], r->v[k++] = -1;
        row(m, k, r->c, r->v, 'G', 0);
      } else {
        row(m, k, r->c, r->v, 'G', 1);
      }
    }
}

/* Builds and solves the MIP once. Returns 1 if CBC produced a solution (all columns in xs, all finite), 0 if
 * it produced none, -1 if it failed (abandoned on numerical difficulties, or non-finite values); *obj and
 * *bound are unscaled block costs. */
static int solve_once(const evt_pblock *b, const layout *L, const lazy_rows *lz, const int *start, double seconds,
                      long *nodes_left, double *xs, int *optimal, double *obj, double *bound) {
  Cbc_Model *m = Cbc_newModel();
  Cbc_setLogLevel(m, 0);
  Cbc_setParameter(m, "threads", "1");
  /* (cut generation at the root is not bounded by the node budget: off, the budget bounds the whole search) */
  Cbc_setParameter(m, "cuts", "off");
  Cbc_setMaximumSeconds(m, seconds > 0.01 ? seconds : 0.01);
  Cbc_setMaximumNodes(m, (int)(*nodes_left < INT_MAX ? *nodes_left : INT_MAX));
  Cbc_setAllowableGap(m, 1e-10);
  Cbc_setAllowableFractionGap(m, 1e-10);
  Cbc_setObjSense(m, 1.0);
  add_columns(m, b, L);
  rowbuf r = {0};
  add_edge_rows(m, b, L, &r);
  add_node_rows(m, b, L, &r);
  for (int i = 0; i < lz->n; i++) Cbc_addRow(m, "", lz->len[i], lz->col + lz->start[i], lz->val + lz->start[i], lz->sense[i], lz->rhs[i]);
  double *sv = malloc((size_t)(L->ncols + 1) * sizeof(double));
  int *si = malloc((size_t)(L->ncols + 1) * sizeof(int));
  EVT_ASSERT(sv && si);
  start_values(b, L, start, sv);
  for (int i = 0; i < L->ncols; i++) si[i] = i;
  Cbc_setMIPStartI(m, L->ncols, si, sv);
  Cbc_solve(m);
  int ok = 0;
  const double *sol = Cbc_getColSolution(m);
  if (Cbc_isAbandoned(m) || Cbc_status(m) == 2) ok = -1;
  else if (sol && !Cbc_isProvenInfeasible(m) && Cbc_numberSavedSolutions(m) > 0) {
    memcpy(xs, sol, (size_t)L->ncols * sizeof(double));
    ok = 1;
    for (int i = 0; i < L->ncols && ok > 0; i++)
      if (!isfinite(xs[i])) ok = -1;
  }
  *nodes_left -= Cbc_getNodeCount(m) > 0 ? Cbc_getNodeCount(m) : 0;
  *optimal = Cbc_isProvenOptimal(m);
  *obj = Cbc_getObjValue(m) * L->scale + L->constant;
  *bound = Cbc_getBestPossibleObjValue(m) * L->scale + L->constant;
  if (ok > 0 && !isfinite(*obj)) ok = -1;
  Cbc_deleteModel(m);
  free(r.c); free(r.v); free(sv); free(si);
  return ok;
}

/* Connectivity cuts for every s that claimed "same group" for a pair the grouping cand[] splits. */
static int connectivity_cuts(const evt_pblock *b, const layout *L, const int *cand, const double *xs, lazy_rows *lz,
                             int *rc, double *rv, unsigned char *in) {
  int n = b->n, added = 0;
  for (int p = 0; p < L->npairs; p++) {
    int v = (int)(L->pairs[p] / (uint64_t)n), w = (int)(L->pairs[p] % (uint64_t)n), sc = scol(L, n, v, w);
    if (cand[v] == cand[w] || xs[sc] < 1e-6) continue;
    int k = 0;
    rc[k] = sc, rv[k++] = 1;
    for (int x = 0; x < n; x++) in[x] = cand[x] == cand[v];
    for (int e = 0; e < b->nvar; e++)
      if (in[b->var[e][0]] != in[b->var[e][1]]) rc[k] = L->xcol + e, rv[k++] = 1;
    lazy_add(lz, rc, rv, k, 'L', (double)(k - 1));
    added++;
  }
  return added;
}

void evt_ilp_solve_block(const evt_pgraph *g, const evt_pblock *b, const int *start, double time_limit,
                         long node_limit, int *sol, evt_ilp_result *res) {
  (void)g;
  int n = b->n;
  memset(res, 0, sizeof *res);
  EVT_ASSERT(evt_pblock_legal(b, start));
  memcpy(sol, start, (size_t)n * sizeof(int));
  double best = evt_pblock_cost(b, sol);
  res->objective = best;
  if (b->nvar == 0) {
    res->optimal = 1;
    return;
  }
  layout L;
  layout_init(b, &L);
  lazy_rows lz = {0};
  double *xs = malloc((size_t)(L.ncols + 1) * sizeof(double));
  int *cand = malloc((size_t)(n + 1) * sizeof(int)), *path = malloc((size_t)(b->nvar + 1) * sizeof(int));
  int *rc = malloc((size_t)(b->nvar + 2) * sizeof(int));
  double *rv = malloc((size_t)(b->nvar + 2) * sizeof(double)), *ones = malloc((size_t)(b->nvar + 1) * sizeof(double));
  unsigned char *in = malloc((size_t)n + 1);
  EVT_ASSERT(xs && cand && path && rc && rv && ones && in);
  for (int i = 0; i <= b->nvar; i++) ones[i] = 1;
  double t0 = evt_now_s(), lower = -1e300;
  long nodes_left = node_limit > 0 ? node_limit : LONG_MAX;
  int done = 0;
  for (int iter = 0; iter < 10000 && !done; iter++) {
    double left = time_limit - (evt_now_s() - t0);
    if (left <= 0 || nodes_left <= 0) break;
    int optimal = 0;
    double obj = 0, bound = 0;
    int got = solve_once(b, &L, &lz, sol, left, &nodes_left, xs, &optimal, &obj, &bound);
    if (got < 0) res->failed = 1;
    if (got <= 0) break;
    if (bound > lower && isfinite(bound)) lower = bound;
    groups_of(b, xs + L.xcol, cand);
    int added = 0;
    for (int i = 0; i < b->nunrel && !res->failed; i++) {   /* unrelated incompatible pairs joined by an uncut path */
      int a = b->unrel[i][0], c = b->unrel[i][1];
      if (cand[a] != cand[c]) continue;
      int len = uncut_path(b, &L.inc, cand, a, c, path);
      if (len <= 0) { res->failed = 1; break; }
      for (int k = 0; k < len; k++) rc[k] = L.xcol + path[k];
      lazy_add(&lz, rc, ones, len, 'G', 1);
      added++;
    }
    if (res->failed) break;
    if (!added) {
      if (!evt_pblock_legal(b, cand)) { res->failed = 1; break; }   /* CBC returned an x that breaks a row */
      double c = evt_pblock_cost(b, cand);
      if (c < best) best = c, memcpy(sol, cand, (size_t)n * sizeof(int));
      if (c > obj + 1e-7 * L.scale + 1e-9 * c) added += connectivity_cuts(b, &L, cand, xs, &lz, rc, rv, in);
      if (!added) {   /* x's true cost is the objective (within CBC's tolerance): optimal */
        res->optimal = optimal;
        done = 1;
      }
    }
    res->lazy_rows += added;
  }
  res->bb_nodes = (node_limit > 0 ? node_limit : LONG_MAX) - nodes_left;
  if (!res->optimal) {
    res->node_limited = !res->failed && nodes_left <= 0;
    res->timeout = !res->failed && !res->node_limited;
    res->gap = best > 1e-12 && lower > -1e299 ? (best - lower) / best : 1;
    if (res->gap < 0) res->gap = 0;
    if (res->gap == 0) res->gap = 1e-12;
  }
  res->objective = best;
  free(xs); free(cand); free(path); free(rc); free(rv); free(ones); free(in);
  layout_free(&L);
  lazy_free(&lz);
}
