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
 *   r_v in [0,1] >= 1 - k_v + sum x_e over v's k_v variable in-edges (kernel start).
 *   related incompatible pairs a -> b (two nuclei, or a nucleus and a member compat rejects):
 *                pi_b >= pi_a + 1. Unrelated pairs: lazily, "some edge on this joining path is cut":
 *                solve, look for a violated pair, add the row for the uncut undirected path found,
 *                re-solve with the best legal grouping as MIP start (CBC 2.10's C API has no lazy
 *                constraint callback, and a model cannot be modified after Cbc_solve, so it is rebuilt).
 *   minimize  sum bytes(u) x_e + sum bytes(u) m_u + lambda sum r_v   (+ constants outside the block)
 * The objective is scaled so its largest coefficient is 1; gaps are 1e-10 absolute and relative.
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
  free(b->label);
  memset(b, 0, sizeof *b);
}

double evt_pblock_cost(const evt_pblock *b, const int *sol) {
  double c = 0;
  int *uncut_in = calloc((size_t)b->n + 1, sizeof(int));
  unsigned char *w = calloc((size_t)b->n + 1, 1);
  EVT_ASSERT(uncut_in && w);
  for (int i = 0; i < b->nvar; i++) {
    int u = b->var[i][0], v = b->var[i][1];
    if (sol[u] != sol[v]) c += b->var_bytes[i], w[u] = 1;
    else uncut_in[v]++;
  }
  for (int v = 0; v < b->n; v++) {
    if (w[v] || b->written[v]) c += b->bytes[v];
    if (uncut_in[v] == 0) c += b->lambda;
  }
  free(uncut_in);
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

static int uf(int *p, int x) {
  while (p[x] != x) x = p[x] = p[p[x]];
  return x;
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

typedef struct lazy_rows {
  int n, cap, *start, *len, *idx, nidx, capidx;
} lazy_rows;

static void lazy_add(lazy_rows *l, const int *path, int len) {
  if (l->n == l->cap) {
    l->cap = l->cap ? 2 * l->cap : 16;
    l->start = realloc(l->start, (size_t)l->cap * sizeof(int));
    l->len = realloc(l->len, (size_t)l->cap * sizeof(int));
  }
  while (l->nidx + len > l->capidx) {
    l->capidx = l->capidx ? 2 * l->capidx : 64;
    l->idx = realloc(l->idx, (size_t)l->capidx * sizeof(int));
  }
  EVT_ASSERT(l->start && l->len && l->idx);
  l->start[l->n] = l->nidx;
  l->len[l->n++] = len;
  memcpy(l->idx + l->nidx, path, (size_t)len * sizeof(int));
  l->nidx += len;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Builds and solves the MIP once. Returns 1 if CBC produced a solution (x in xs). */
static int solve_once(const evt_pblock *b, const lazy_rows *lz, const int *start, double seconds, double *xs,
                      int *optimal, double *gap) {
  int n = b->n, col = 0;
  Cbc_Model *m = Cbc_newModel();
  Cbc_setLogLevel(m, 0);
  Cbc_setParameter(m, "threads", "1");
  Cbc_setMaximumSeconds(m, seconds > 0.01 ? seconds : 0.01);
  Cbc_setAllowableGap(m, 1e-10);
  Cbc_setAllowableFractionGap(m, 1e-10);
  Cbc_setObjSense(m, 1.0);
  double scale = b->lambda;
  for (int v = 0; v < n; v++) scale = b->bytes[v] > scale ? b->bytes[v] : scale;
  if (scale <= 0) scale = 1;
  int xcol = col;
  for (int i = 0; i < b->nvar; i++)
    Cbc_addCol(m, "", 0, b->var_fuse[i] ? 0 : 1, b->var_bytes[i] / scale, 1, 0, NULL, NULL), col++;
  int picol = col;
  for (int v = 0; v < n; v++) Cbc_addCol(m, "", 0, n, 0, 0, 0, NULL, NULL), col++;
  int *mcol = malloc((size_t)(n + 1) * sizeof(int)), *rcol = malloc((size_t)(n + 1) * sizeof(int));
  int *nvin = calloc((size_t)n + 1, sizeof(int));
  EVT_ASSERT(mcol && rcol && nvin);
  for (int i = 0; i < b->nvar; i++) nvin[b->var[i][1]]++;
  for (int v = 0; v < n; v++) {
    mcol[v] = rcol[v] = -1;
    if (b->has_var_out[v] && !b->written[v]) mcol[v] = col++, Cbc_addCol(m, "", 0, 1, b->bytes[v] / scale, 0, 0, NULL, NULL);
    if (nvin[v] > 0) rcol[v] = col++, Cbc_addCol(m, "", 0, 1, b->lambda / scale, 0, 0, NULL, NULL);
  }
  for (int i = 0; i < b->nvar; i++) {
    int u = b->var[i][0], v = b->var[i][1];
    int cols[3] = {picol + v, picol + u, xcol + i};
    double c1[3] = {1, -1, -1}, c2[3] = {1, -1, -(double)n};
    Cbc_addRow(m, "", 3, cols, c1, 'G', 0);
    Cbc_addRow(m, "", 3, cols, c2, 'L', 0);
    if (mcol[u] >= 0) {
      int mc[2] = {mcol[u], xcol + i};
      double mv[2] = {1, -1};
      Cbc_addRow(m, "", 2, mc, mv, 'G', 0);
    }
  }
  for (int i = 0; i < b->nfix + b->nrel; i++) {
    int u = i < b->nfix ? b->fix[i][0] : b->rel[i - b->nfix][0];
    int v = i < b->nfix ? b->fix[i][1] : b->rel[i - b->nfix][1];
    int cols[2] = {picol + v, picol + u};
    double c[2] = {1, -1};
    Cbc_addRow(m, "", 2, cols, c, 'G', 1);
  }
  int *rc = malloc((size_t)(b->nvar + 2) * sizeof(int));
  double *rv = malloc((size_t)(b->nvar + 2) * sizeof(double));
  EVT_ASSERT(rc && rv);
  for (int v = 0; v < n; v++) {
    if (rcol[v] < 0) continue;
    int k = 0;
    rc[k] = rcol[v], rv[k++] = 1;
    for (int i = 0; i < b->nvar; i++)
      if (b->var[i][1] == v) rc[k] = xcol + i, rv[k++] = -1;
    Cbc_addRow(m, "", k, rc, rv, 'G', 1.0 - nvin[v]);
  }
  for (int r = 0; r < lz->n; r++) {
    for (int k = 0; k < lz->len[r]; k++) rc[k] = xcol + lz->idx[lz->start[r] + k], rv[k] = 1;
    Cbc_addRow(m, "", lz->len[r], rc, rv, 'G', 1);
  }
  /* MIP start */
  int *si = malloc((size_t)(col + 1) * sizeof(int));
  double *sv = malloc((size_t)(col + 1) * sizeof(double)), *pi = malloc((size_t)(n + 1) * sizeof(double));
  EVT_ASSERT(si && sv && pi);
  levels(b, start, pi);
  int ns = 0;
  unsigned char *wr = calloc((size_t)n + 1, 1);
  int *uin = calloc((size_t)n + 1, sizeof(int));
  EVT_ASSERT(wr && uin);
  for (int i = 0; i < b->nvar; i++) {
    int cut = start[b->var[i][0]] != start[b->var[i][1]];
    si[ns] = xcol + i, sv[ns++] = cut;
    if (cut) wr[b->var[i][0]] = 1;
    else uin[b->var[i][1]]++;
  }
  for (int v = 0; v < n; v++) si[ns] = picol + v, sv[ns++] = pi[v];
  for (int v = 0; v < n; v++) {
    if (mcol[v] >= 0) si[ns] = mcol[v], sv[ns++] = wr[v];
    if (rcol[v] >= 0) si[ns] = rcol[v], sv[ns++] = uin[v] == 0;
  }
  Cbc_setMIPStartI(m, ns, si, sv);
  Cbc_solve(m);
  int ok = 0;
  const double *sol = Cbc_getColSolution(m);
  if (sol && !Cbc_isProvenInfeasible(m) && Cbc_numberSavedSolutions(m) > 0) {
    memcpy(xs, sol + xcol, (size_t)b->nvar * sizeof(double));
    ok = 1;
  }
  *optimal = Cbc_isProvenOptimal(m);
  double obj = Cbc_getObjValue(m), bound = Cbc_getBestPossibleObjValue(m);
  *gap = *optimal ? 0 : (obj > 1e-12 ? (obj - bound) / obj : 0);
  if (*gap < 0) *gap = 0;
  Cbc_deleteModel(m);
  free(mcol); free(rcol); free(nvin); free(rc); free(rv); free(si); free(sv); free(pi); free(wr); free(uin);
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
  lazy_rows lz = {0};
  double *x = malloc((size_t)(b->nvar + 1) * sizeof(double));
  int *cand = malloc((size_t)(n + 1) * sizeof(int)), *path = malloc((size_t)(b->nvar + 1) * sizeof(int));
  EVT_ASSERT(x && cand && path);
  double t0 = now_s();
  for (int iter = 0; iter < 1000; iter++) {
    double left = time_limit - (now_s() - t0);
    if (left <= 0) { res->timeout = 1; break; }
    int optimal = 0;
    double gap = 0;
    if (!solve_once(b, &lz, sol, left, x, &optimal, &gap)) { res->timeout = 1; res->gap = 1; break; }
    groups_of(b, x, cand);
    int added = 0;
    for (int i = 0; i < b->nunrel; i++) {
      int a = b->unrel[i][0], c = b->unrel[i][1];
      if (cand[a] != cand[c]) continue;
      int len = uncut_path(b, cand, a, c, path);
      EVT_ASSERT(len > 0);
      lazy_add(&lz, path, len);
      added++;
    }
    res->lazy_rows += added;
    if (added) continue;
    if (!evt_pblock_legal(b, cand)) evt_fatal(__FILE__, __LINE__, "MIP solution breaks a block constraint");
    double c = evt_pblock_cost(b, cand);
    if (c < best) best = c, memcpy(sol, cand, (size_t)n * sizeof(int));
    res->optimal = optimal;
    res->gap = gap;
    if (!optimal) res->timeout = 1;
    break;
  }
  if (res->timeout && res->gap == 0 && !res->optimal) res->gap = 1;
  res->objective = best;
  free(x); free(cand); free(path);
  free(lz.start); free(lz.len); free(lz.idx);
}
