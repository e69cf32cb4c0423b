/* greedy.c — a legal grouping without a solver: the fallback, the MIP start, and the baseline.
 * Start from singletons; merge along every FUSE edge; then along FREE edges by decreasing bytes (ties by
 * edge id), whenever the merged group keeps every rule: no CUT edge between the two groups, at most one
 * nucleus and only compatible members, and no path between them through a third group (which would make
 * the contracted graph cyclic). Deterministic.
 * Cost: each group keeps lists of its members' outgoing and incoming kernel edges; an edge found inside
 * one group is dropped from them for good. The path test searches forward from the tail group and
 * backward from the head group in lockstep and stops when either side runs out, so it costs about the
 * smaller of the two cones (on chains and fans: the few edges of the newly joined node). */
#include "partition/partition.h"

#include <stdlib.h>

typedef struct elist {
  int head, tail;   /* edge ids, -1 when empty */
} elist;

typedef struct greedy {
  const evt_pgraph *g;
  int *parent, *next, *nuc, *size;
  long *deg;          /* kernel edges at the group's members */
  elist *out, *in;    /* per group root */
  int *onext, *inext; /* per edge: next edge in its group's list */
  /* the lockstep search: one DFS per direction */
  int *fmark, *bmark, *fstack, *bstack;
  int stamp;
} greedy;

static int find(int *p, int x) {
  while (p[x] != x) x = p[x] = p[p[x]];
  return x;
}

static void list_push(elist *l, int *nx, int e) {
  nx[e] = -1;
  if (l->tail >= 0) nx[l->tail] = e;
  else l->head = e;
  l->tail = e;
}

static void list_cat(elist *a, elist *b, int *nx) {
  if (b->head < 0) return;
  if (a->tail >= 0) nx[a->tail] = b->head;
  else a->head = b->head;
  a->tail = b->tail;
  b->head = b->tail = -1;
}

/* One side of the search. It scans group `cur`'s list from `e` (with predecessor `prev`, for dropping
 * edges that became internal) and keeps a stack of groups still to scan. */
typedef struct side {
  int fwd, from, to;   /* fwd: along out-edges from `from`; else along in-edges from `to` */
  int *mark, *stack, top;
  int cur, e, prev;
} side;

/* Advances one edge. Returns 1: a path through a third group exists; -1: this side is exhausted; 0: go on. */
static int side_step(greedy *s, side *d, const int *other_mark) {
  const evt_pgraph *g = s->g;
  while (d->e < 0) {
    if (d->top == 0) return -1;
    d->cur = d->stack[--d->top];
    elist *l = d->fwd ? &s->out[d->cur] : &s->in[d->cur];
    d->e = l->head, d->prev = -1;
  }
  int *nx = d->fwd ? s->onext : s->inext;
  elist *l = d->fwd ? &s->out[d->cur] : &s->in[d->cur];
  int e = d->e, t = find(s->parent, d->fwd ? g->edges[e].v : g->edges[e].u);
  if (t == d->cur) {   /* internal for good: drop it */
    if (d->prev >= 0) nx[d->prev] = nx[e];
    else l->head = nx[e];
    if (l->tail == e) l->tail = d->prev;
    d->e = nx[e];
    return 0;
  }
  d->prev = e, d->e = nx[e];
  int start = d->fwd ? d->from : d->to, goal = d->fwd ? d->to : d->from;
  if (t == goal) return d->cur == start ? 0 : 1;   /* the direct edge itself does not count */
  if (other_mark[t] == s->stamp) return 1;         /* the two searches met in a third group */
  if (d->mark[t] != s->stamp) d->mark[t] = s->stamp, d->stack[d->top++] = t;
  return 0;
}

/* Is there a path from group a to group b through some other group? (a -> b is an edge, so the contracted
 * graph, a DAG, has no path back from b to a.) */
static bool indirect_path(greedy *s, int a, int b) {
  s->stamp++;
  side f = {1, a, b, s->fmark, s->fstack, 0, -1, -1, -1};
  side r = {0, a, b, s->bmark, s->bstack, 0, -1, -1, -1};
  f.stack[f.top++] = a, f.mark[a] = s->stamp;
  r.stack[r.top++] = b, r.mark[b] = s->stamp;
  for (;;) {
    int x = side_step(s, &f, s->bmark);
    if (x) return x > 0;
    x = side_step(s, &r, s->fmark);
    if (x) return x > 0;
  }
}

/* Any CUT edge between groups a and b? Scans the members of the one with fewer edges. */
static bool cut_between(greedy *s, int a, int b) {
  const evt_pgraph *g = s->g;
  int x0 = s->deg[a] <= s->deg[b] ? a : b, other = x0 == a ? b : a, x = x0;
  do {
    const evt_pnode *p = &g->nodes[x];
    for (int k = 0; k < p->nout; k++) {
      const evt_pedge *e = &g->edges[g->out_edges[p->out0 + k]];
      if (e->status == EVT_PE_CUT && find(s->parent, e->v) == other) return true;
    }
    for (int k = 0; k < p->nin; k++) {
      const evt_pedge *e = &g->edges[g->in_edges[p->in0 + k]];
      if (e->status == EVT_PE_CUT && evt_pgraph_kernel(g, e->u) && find(s->parent, e->u) == other) return true;
    }
    x = s->next[x];
  } while (x != x0);
  return false;
}

/* a -> b: a holds the edge's tail. */
static bool can_merge(greedy *s, int a, int b) {
  const evt_pgraph *g = s->g;
  if (s->nuc[a] >= 0 && s->nuc[b] >= 0) return false;
  int nu = s->nuc[a] >= 0 ? s->nuc[a] : s->nuc[b];
  int other = s->nuc[a] >= 0 ? b : a, x = other;
  if (nu >= 0) do {
      if (!evt_part_pair_ok(g, nu, x)) return false;
      x = s->next[x];
    } while (x != other);
  return !cut_between(s, a, b) && !indirect_path(s, a, b);
}

static void merge(greedy *s, int a, int b) {
  if (s->size[a] < s->size[b]) {
    int t = a;
    a = b, b = t;
  }
  s->parent[b] = a;
  s->size[a] += s->size[b];
  s->deg[a] += s->deg[b];
  int t = s->next[a];
  s->next[a] = s->next[b];
  s->next[b] = t;
  if (s->nuc[a] < 0) s->nuc[a] = s->nuc[b];
  list_cat(&s->out[a], &s->out[b], s->onext);
  list_cat(&s->in[a], &s->in[b], s->inext);
}

static int by_bytes(const void *x, const void *y, void *ctx) {
  const evt_pgraph *g = ctx;
  int a = *(const int *)x, b = *(const int *)y;
  double ba = g->nodes[g->edges[a].u].bytes, bb = g->nodes[g->edges[b].u].bytes;
  if (ba != bb) return ba > bb ? -1 : 1;
  return a - b;
}

static void greedy_init(greedy *s, const evt_pgraph *g) {
  int n = g->n, m = g->m;
  s->g = g;
  s->parent = malloc((size_t)(n + 1) * sizeof(int));
  s->next = malloc((size_t)(n + 1) * sizeof(int));
  s->nuc = malloc((size_t)(n + 1) * sizeof(int));
  s->size = malloc((size_t)(n + 1) * sizeof(int));
  s->deg = malloc((size_t)(n + 1) * sizeof(long));
  s->out = malloc((size_t)(n + 1) * sizeof(elist));
  s->in = malloc((size_t)(n + 1) * sizeof(elist));
  s->onext = malloc((size_t)(m + 1) * sizeof(int));
  s->inext = malloc((size_t)(m + 1) * sizeof(int));
  s->fmark = calloc((size_t)n + 1, sizeof(int));
  s->bmark = calloc((size_t)n + 1, sizeof(int));
  s->fstack = malloc((size_t)(n + 1) * sizeof(int));
  s->bstack = malloc((size_t)(n + 1) * sizeof(int));
  EVT_ASSERT(s->parent && s->next && s->nuc && s->size && s->deg && s->out && s->in && s->onext && s->inext &&
             s->fmark && s->bmark && s->fstack && s->bstack);
  s->stamp = 0;
  for (int v = 0; v < n; v++) {
    s->parent[v] = s->next[v] = v, s->size[v] = 1;
    s->nuc[v] = (g->nodes[v].flags & EVT_PN_NUCLEUS) ? v : -1;
    s->deg[v] = g->nodes[v].nin + g->nodes[v].nout;
    s->out[v] = s->in[v] = (elist){-1, -1};
  }
  for (int e = 0; e < m; e++) {
    if (!evt_pgraph_kernel(g, g->edges[e].u)) continue;
    list_push(&s->out[g->edges[e].u], s->onext, e);
    list_push(&s->in[g->edges[e].v], s->inext, e);
  }
}

static void greedy_free(greedy *s) {
  free(s->parent); free(s->next); free(s->nuc); free(s->size); free(s->deg); free(s->out); free(s->in);
  free(s->onext); free(s->inext); free(s->fmark); free(s->bmark); free(s->fstack); free(s->bstack);
}

int evt_part_greedy(const evt_pgraph *g, int *group) {
  int n = g->n;
  greedy s;
  greedy_init(&s, g);
  int *order = malloc((size_t)(g->m + 1) * sizeof(int));
  EVT_ASSERT(order);
  for (int e = 0; e < g->m; e++) {
    if (g->edges[e].status != EVT_PE_FUSE) continue;
    int a = find(s.parent, g->edges[e].u), b = find(s.parent, g->edges[e].v);
    if (a == b) continue;
    if (!can_merge(&s, a, b)) evt_fatal(__FILE__, __LINE__, "FUSE edge %d -> %d cannot be honoured", g->edges[e].u, g->edges[e].v);
    merge(&s, a, b);
  }
  int k = 0;
  for (int e = 0; e < g->m; e++)
    if (g->edges[e].status == EVT_PE_FREE) order[k++] = e;
  qsort_r(order, (size_t)k, sizeof(int), by_bytes, (void *)g);
  for (int i = 0; i < k; i++) {
    const evt_pedge *e = &g->edges[order[i]];
    int a = find(s.parent, e->u), b = find(s.parent, e->v);
    if (a != b && can_merge(&s, a, b)) merge(&s, a, b);
  }
  for (int v = 0; v < n; v++) group[v] = evt_pgraph_kernel(g, v) ? find(s.parent, v) : -1;
  int ngroups = evt_part_normalize(g, group);
  EVT_ASSERT(ngroups >= 0);
  greedy_free(&s);
  free(order);
  return ngroups;
}
