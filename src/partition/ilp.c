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
 * A timeout returns the best legal grouping found (at worst the MIP start), never an illegal one. */
#include "partition/partition.h"

#include <coin/Cbc_C_Interface.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

bool evt_pblock_legal(const evt_pblock *b, const int *sol) {
  int n = b->n;
  for (int i = 0; i < b->nvar; i++)
    if (b->var_fuse[i] && sol[b->var[i][0]] != sol[b->var[i][1]]) return false;
  for (int i = 0; i < b->nrel; i++)
    if (sol[b->rel[i][0]] == sol[b->rel[i][1]]) return false;
  for (int i = 0; i < b->nunrel; i++)
    if (sol[b->unrel[i][0]] == sol[b->unrel[i][1]]) return false;
  for (int i = 0; i < b->nfix; i++)
    if (sol[b->fix[i][0]] == sol[b->fix[i][1]]) return false;
  /* acyclic: Bellman-Ford style levels over group arcs must settle within n rounds */
  int *lvl = calloc((size_t)n + 1, sizeof(int));
  EVT_ASSERT(lvl);
  bool changed = true;
  for (int round = 0; round <= n && changed; round++) {
    changed = false;
    for (int i = 0; i < b->nvar + b->nfix; i++) {
      int u = i < b->nvar ? b->var[i][0] : b->fix[i - b->nvar][0];
      int v = i < b->nvar ? b->var[i][1] : b->fix[i - b->nvar][1];
      int gu = sol[u], gv = sol[v];
      if (gu != gv && lvl[gv] < lvl[gu] + 1) lvl[gv] = lvl[gu] + 1, changed = true;
    }
  }
  free(lvl);
  return !changed;
}

/* Group levels of a legal grouping: the potentials of the MIP start. */
static void levels(const evt_pblock *b, const int *sol, double *pi) {
  int *lvl = calloc((size_t)b->n + 1, sizeof(int));
  EVT_ASSERT(lvl);
  bool changed = true;
  for (int round = 0; round <= b->n && changed; round++) {
    changed = false;
    for (int i = 0; i < b->nvar + b->nfix; i++) {
      int u = i < b->nvar ? b->var[i][0] : b->fix[i - b->nvar][0];
      int v = i < b->nvar ? b->var[i][1] : b->fix[i - b->nvar][1];
      if (sol[u] != sol[v] && lvl[sol[v]] < lvl[sol[u]] + 1) lvl[sol[v]] = lvl[sol[u]] + 1, changed = true;
    }
  }
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

/* Undirected path of uncut variable edges from a to c (edge indices into path[]); its length. */
static int uncut_path(const evt_pblock *b, const int *sol, int a, int c, int *path) {
  int n = b->n;
  int *from = malloc((size_t)(n + 1) * sizeof(int)), *queue = malloc((size_t)(n + 1) * sizeof(int));
  EVT_ASSERT(from && queue);
  for (int v = 0; v < n; v++) from[v] = -2;
  int head = 0, tail = 0;
  queue[tail++] = a;
  from[a] = -1;
  while (head < tail && from[c] == -2) {
    int x = queue[head++];
    for (int i = 0; i < b->nvar; i++) {
      int u = b->var[i][0], v = b->var[i][1];
      if (sol[u] != sol[v]) continue;
      int y = u == x ? v : v == x ? u : -1;
      if (y >= 0 && from[y] == -2) from[y] = i, queue[tail++] = y;
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

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Column layout of a block's MIP. */
typedef struct layout {
  int ncols, xcol, picol, fcol, gcol, lcol, ycol;
  int *mcol;   /* per node, -1 if no write variable */
  int *scol;   /* per pair v*n+w (v < w) of co-consumers of one tensor; -1 for other pairs */
  double scale, constant;   /* objective scale; forced writes */
} layout;

static void layout_init(const evt_pblock *b, layout *L) {
  int n = b->n, col = 0;
  L->mcol = malloc((size_t)(n + 1) * sizeof(int));
  L->scol = malloc((size_t)n * (size_t)n * sizeof(int) + sizeof(int));
  EVT_ASSERT(L->mcol && L->scol);
  L->xcol = col, col += b->nvar;
  L->picol = col, col += n;
  L->constant = 0;
  for (int v = 0; v < n; v++) {
    L->mcol[v] = b->has_var_out[v] && !b->written[v] ? col++ : -1;
    if (b->written[v]) L->constant += b->bytes[v];
  }
  for (int i = 0; i < n * n; i++) L->scol[i] = -1;
  for (int f = 0; f < b->nfam; f++)
    for (int i = b->fam_start[f]; i < b->fam_start[f] + b->fam_len[f]; i++)
      for (int j = b->fam_start[f]; j < i; j++) {
        int v = b->fam_cons[j], w = b->fam_cons[i];
        L->scol[(v < w ? v : w) * n + (v < w ? w : v)] = 0;
      }
  for (int i = 0; i < n * n; i++)
    if (L->scol[i] == 0) L->scol[i] = col++;
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

static int scol(const layout *L, int n, int v, int w) { return v < w ? L->scol[v * n + w] : L->scol[w * n + v]; }

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
  for (int v = 0; v < n; v++) {
    val[L->picol + v] = pi[v];
    for (int w = v + 1; w < n; w++)
      if (L->scol[v * n + w] >= 0) val[L->scol[v * n + w]] = comp[v] == comp[w];
    stamp[v] = -1;
  }
  /* leaders: the root of each piece; flow: along a BFS tree from it, each edge carrying its subtree size */
  int *order = malloc((size_t)(n + 1) * sizeof(int)), *pedge = malloc((size_t)(n + 1) * sizeof(int));
  double *sub = malloc((size_t)(n + 1) * sizeof(double));
  EVT_ASSERT(order && pedge && sub);
  for (int r = 0; r < n; r++) {
    if (comp[r] != r) continue;
    val[L->lcol + r] = 1;
    int h = 0, t = 0;
    order[t++] = r;
    pedge[r] = -1;
    for (int v = 0; v < n; v++) stamp[v] = v == r ? -2 : -1;
    while (h < t) {
      int x = order[h++];
      for (int i = 0; i < b->nvar; i++) {
        int u = b->var[i][0], v = b->var[i][1];
        if (comp[u] != comp[v] || (u != x && v != x)) continue;
        int y = u == x ? v : u;
        if (stamp[y] != -1) continue;
        stamp[y] = -2, pedge[y] = i, order[t++] = y;
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
  for (int v = 0; v < n; v++) stamp[v] = -1;
  free(order);
  free(pedge);
  free(sub);
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

/* Builds and solves the MIP once. Returns 1 if CBC produced a solution (all columns in xs); *obj and
 * *bound are unscaled block costs. */
static int solve_once(const evt_pblock *b, const layout *L, const lazy_rows *lz, const int *start, double seconds,
                      double *xs, int *optimal, double *obj, double *bound) {
  int n = b->n;
  Cbc_Model *m = Cbc_newModel();
  Cbc_setLogLevel(m, 0);
  Cbc_setParameter(m, "threads", "1");
  Cbc_setMaximumSeconds(m, seconds > 0.01 ? seconds : 0.01);
  Cbc_setAllowableGap(m, 1e-10);
  Cbc_setAllowableFractionGap(m, 1e-10);
  Cbc_setObjSense(m, 1.0);
  double sc = L->scale;
  unsigned char *forbid = calloc((size_t)n * (size_t)n + 1, 1);
  EVT_ASSERT(forbid);
  for (int i = 0; i < b->nfix + b->nrel + b->nunrel; i++) {
    const int *pr = i < b->nfix ? b->fix[i] : i < b->nfix + b->nrel ? b->rel[i - b->nfix] : b->unrel[i - b->nfix - b->nrel];
    forbid[pr[0] * n + pr[1]] = forbid[pr[1] * n + pr[0]] = 1;
  }
  for (int i = 0; i < b->nvar; i++) Cbc_addCol(m, "", 0, b->var_fuse[i] ? 0 : 1, 0, 1, 0, NULL, NULL);
  for (int v = 0; v < n; v++) Cbc_addCol(m, "", 0, n, 0, 0, 0, NULL, NULL);
  for (int v = 0; v < n; v++)
    if (L->mcol[v] >= 0) Cbc_addCol(m, "", 0, 1, b->bytes[v] / sc, 0, 0, NULL, NULL);
  for (int i = 0; i < n * n; i++)
    if (L->scol[i] >= 0) Cbc_addCol(m, "", 0, forbid[i] ? 0 : 1, 0, 0, 0, NULL, NULL);
  for (int i = 0; i < 2 * b->nvar; i++) Cbc_addCol(m, "", 0, n, 0, 0, 0, NULL, NULL);
  for (int v = 0; v < n; v++) Cbc_addCol(m, "", 0, n, 0, 0, 0, NULL, NULL);
  for (int v = 0; v < n; v++) Cbc_addCol(m, "", 0, 1, b->lambda / sc, 1, 0, NULL, NULL);
  for (int f = 0; f < b->nfam; f++)
    for (int k = 0; k < b->fam_len[f]; k++) Cbc_addCol(m, "", 0, 1, b->fam_bytes[f] / sc, 0, 0, NULL, NULL);
  int cap = 2 * n + 8;
  int *rc = malloc((size_t)cap * sizeof(int));
  double *rv = malloc((size_t)cap * sizeof(double));
  EVT_ASSERT(rc && rv);
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
  {   /* valid: groups >= nodes - uncut edges */
    int k = 0;
    if (n + b->nvar + 2 > cap) {
      cap = n + b->nvar + 2;
      rc = realloc(rc, (size_t)cap * sizeof(int));
      rv = realloc(rv, (size_t)cap * sizeof(double));
      EVT_ASSERT(rc && rv);
    }
    for (int v = 0; v < n; v++) rc[k] = L->lcol + v, rv[k++] = 1;
    for (int i = 0; i < b->nvar; i++) rc[k] = L->xcol + i, rv[k++] = -1;
    row(m, k, rc, rv, 'G', n - b->nvar);
  }
  for (int v = 0; v < n; v++) {   /* inflow - outflow + g_v = 1; g_v <= n l_v */
    int k = 0;
    if (k + 2 * b->nvar + 2 > cap) {
      cap = k + 2 * b->nvar + 2;
      rc = realloc(rc, (size_t)cap * sizeof(int));
      rv = realloc(rv, (size_t)cap * sizeof(double));
      EVT_ASSERT(rc && rv);
    }
    for (int i = 0; i < b->nvar; i++) {
      if (b->var[i][1] == v) rc[k] = L->fcol + 2 * i, rv[k++] = 1, rc[k] = L->fcol + 2 * i + 1, rv[k++] = -1;
      if (b->var[i][0] == v) rc[k] = L->fcol + 2 * i + 1, rv[k++] = 1, rc[k] = L->fcol + 2 * i, rv[k++] = -1;
    }
    rc[k] = L->gcol + v, rv[k++] = 1;
    row(m, k, rc, rv, 'E', 1);
    rc[0] = L->gcol + v, rc[1] = L->lcol + v, rv[0] = 1, rv[1] = -(double)n;
    row(m, 2, rc, rv, 'L', 0);
  }
  for (int i = 0; i < b->nfix + b->nrel; i++) {
    int u = i < b->nfix ? b->fix[i][0] : b->rel[i - b->nfix][0];
    int v = i < b->nfix ? b->fix[i][1] : b->rel[i - b->nfix][1];
    rc[0] = L->picol + v, rc[1] = L->picol + u, rv[0] = 1, rv[1] = -1;
    row(m, 2, rc, rv, 'G', 1);
  }
  for (int f = 0; f < b->nfam; f++)
    for (int a = 0; a < b->fam_len[f]; a++) {   /* y_i + sum_{j<i} s_{c_i c_j} - reads_i >= 0 */
      int i = b->fam_start[f] + a, k = 0;
      rc[k] = L->ycol + i, rv[k++] = 1;
      for (int j = b->fam_start[f]; j < i; j++)
        if (!forbid[b->fam_cons[j] * n + b->fam_cons[i]]) rc[k] = scol(L, n, b->fam_cons[j], b->fam_cons[i]), rv[k++] = 1;
      if (b->fam_var[i] >= 0) {
        rc[k] = L->xcol + b->fam_var[i], rv[k++] = -1;
        row(m, k, rc, rv, 'G', 0);
      } else {
        row(m, k, rc, rv, 'G', 1);
      }
    }
  for (int r = 0; r < lz->n; r++) Cbc_addRow(m, "", lz->len[r], lz->col + lz->start[r], lz->val + lz->start[r], lz->sense[r], lz->rhs[r]);
  double *sv = malloc((size_t)(L->ncols + 1) * sizeof(double));
  int *si = malloc((size_t)(L->ncols + 1) * sizeof(int));
  EVT_ASSERT(sv && si);
  start_values(b, L, start, sv);
  for (int i = 0; i < L->ncols; i++) si[i] = i;
  Cbc_setMIPStartI(m, L->ncols, si, sv);
  Cbc_solve(m);
  int ok = 0;
  const double *sol = Cbc_getColSolution(m);
  if (sol && !Cbc_isProvenInfeasible(m) && Cbc_numberSavedSolutions(m) > 0) {
    memcpy(xs, sol, (size_t)L->ncols * sizeof(double));
    ok = 1;
  }
  *optimal = Cbc_isProvenOptimal(m);
  *obj = Cbc_getObjValue(m) * sc + L->constant;
  *bound = Cbc_getBestPossibleObjValue(m) * sc + L->constant;
  Cbc_deleteModel(m);
  free(forbid); free(rc); free(rv); free(sv); free(si);
  return ok;
}

void evt_ilp_solve_block(const evt_pgraph *g, const evt_pblock *b, const int *start, double time_limit,
                         int *sol, evt_ilp_result *res) {
  (void)g;
  int n = b->n;
  memset(res, 0, sizeof *res);
  EVT_ASSERT(evt_pblock_legal(b, start));
  memcpy(sol, start, (size_t)n * sizeof(int));
  double best = evt_pblock_cost(b, sol);
  if (b->nvar == 0) {
    res->optimal = 1;
    res->objective = best;
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
  double t0 = now_s(), lower = -1e300;
  int done = 0;
  for (int iter = 0; iter < 10000 && !done; iter++) {
    double left = time_limit - (now_s() - t0);
    if (left <= 0) break;
    int optimal = 0;
    double obj = 0, bound = 0;
    if (!solve_once(b, &L, &lz, sol, left, xs, &optimal, &obj, &bound)) break;
    if (bound > lower) lower = bound;
    groups_of(b, xs + L.xcol, cand);
    int added = 0;
    for (int i = 0; i < b->nunrel; i++) {   /* unrelated incompatible pairs joined by an uncut path */
      int a = b->unrel[i][0], c = b->unrel[i][1];
      if (cand[a] != cand[c]) continue;
      int len = uncut_path(b, cand, a, c, path);
      EVT_ASSERT(len > 0);
      for (int k = 0; k < len; k++) rc[k] = L.xcol + path[k];
      lazy_add(&lz, rc, ones, len, 'G', 1);
      added++;
    }
    if (!added) {
      double c = evt_pblock_cost(b, cand);
      if (!evt_pblock_legal(b, cand)) evt_fatal(__FILE__, __LINE__, "MIP solution breaks a block constraint");
      if (c < best) best = c, memcpy(sol, cand, (size_t)n * sizeof(int));
      if (c > obj + 1e-7 * L.scale + 1e-9 * c) {   /* some s claimed a group x does not form: connectivity cuts */
        for (int v = 0; v < n; v++)
          for (int w = v + 1; w < n; w++) {
            if (L.scol[v * n + w] < 0 || cand[v] == cand[w] || xs[L.scol[v * n + w]] < 1e-6) continue;
            int k = 0;
            rc[k] = L.scol[v * n + w], rv[k++] = 1;
            for (int x = 0; x < n; x++) in[x] = cand[x] == cand[v];
            for (int e = 0; e < b->nvar; e++)
              if (in[b->var[e][0]] != in[b->var[e][1]]) rc[k] = L.xcol + e, rv[k++] = 1;
            lazy_add(&lz, rc, rv, k, 'L', (double)(k - 1));
            added++;
          }
      }
      if (!added) {   /* x's true cost is the objective (within CBC's tolerance): optimal */
        res->optimal = optimal;
        done = 1;
      }
    }
    res->lazy_rows += added;
  }
  if (!res->optimal) {
    res->timeout = 1;
    res->gap = best > 1e-12 && lower > -1e299 ? (best - lower) / best : 1;
    if (res->gap < 0) res->gap = 0;
    if (res->gap == 0) res->gap = 1e-12;
  }
  res->objective = best;
  free(xs); free(cand); free(path); free(rc); free(rv); free(ones); free(in);
  free(L.mcol); free(L.scol);
  lazy_free(&lz);
}
