/* greedy.c — a legal grouping without a solver: the fallback, the MIP start, and the baseline.
 * Start from singletons; merge along every FUSE edge; then along FREE edges by decreasing bytes (ties by
 * edge id), whenever the merged group keeps every rule: no CUT edge between the two groups, at most one
 * nucleus and only compatible members, and no path between them through a third group (which would make
 * the contracted graph cyclic). Deterministic. O(edges x (nodes + edges)) worst case. */
#include "partition/partition.h"

#include <stdlib.h>

typedef struct greedy {
  const evt_pgraph *g;
  int *parent, *next, *nuc, *mark, *stack;
  int stamp;
} greedy;

static int find(int *p, int x) {
  while (p[x] != x) x = p[x] = p[p[x]];
  return x;
}

/* Is there a path from group a to group b through some other group? */
static bool indirect_path(greedy *s, int a, int b) {
  const evt_pgraph *g = s->g;
  int top = 0;
  s->stamp++;
  s->stack[top++] = a;
  s->mark[a] = s->stamp;
  while (top > 0) {
    int c = s->stack[--top], x = c;
    do {   /* the members of group c form a circular list */
      const evt_pnode *p = &g->nodes[x];
      for (int k = 0; k < p->nout; k++) {
        int d = find(s->parent, g->edges[g->out_edges[p->out0 + k]].v);
        if (d == b) {
          if (c != a) return true;
          continue;
        }
        if (s->mark[d] != s->stamp) s->mark[d] = s->stamp, s->stack[top++] = d;
      }
      x = s->next[x];
    } while (x != c);
  }
  return false;
}

static bool can_merge(greedy *s, int a, int b) {
  const evt_pgraph *g = s->g;
  if (s->nuc[a] >= 0 && s->nuc[b] >= 0) return false;
  int nu = s->nuc[a] >= 0 ? s->nuc[a] : s->nuc[b];
  int other = s->nuc[a] >= 0 ? b : a;
  int x = other;
  do {
    if (nu >= 0 && !evt_part_pair_ok(g, nu, x)) return false;
    x = s->next[x];
  } while (x != other);
  x = a;
  do {   /* no CUT edge between a and b */
    const evt_pnode *p = &g->nodes[x];
    for (int k = 0; k < p->nout; k++) {
      const evt_pedge *e = &g->edges[g->out_edges[p->out0 + k]];
      if (e->status == EVT_PE_CUT && find(s->parent, e->v) == b) return false;
    }
    for (int k = 0; k < p->nin; k++) {
      const evt_pedge *e = &g->edges[g->in_edges[p->in0 + k]];
      if (e->status == EVT_PE_CUT && evt_pgraph_kernel(g, e->u) && find(s->parent, e->u) == b) return false;
    }
    x = s->next[x];
  } while (x != a);
  return !indirect_path(s, a, b) && !indirect_path(s, b, a);
}

static void merge(greedy *s, int a, int b) {
  s->parent[b] = a;
  int t = s->next[a];
  s->next[a] = s->next[b];
  s->next[b] = t;
  if (s->nuc[a] < 0) s->nuc[a] = s->nuc[b];
}

static int by_bytes(const void *x, const void *y, void *ctx) {
  const evt_pgraph *g = ctx;
  int a = *(const int *)x, b = *(const int *)y;
  double ba = g->nodes[g->edges[a].u].bytes, bb = g->nodes[g->edges[b].u].bytes;
  if (ba != bb) return ba > bb ? -1 : 1;
  return a - b;
}

int evt_part_greedy(const evt_pgraph *g, int *group) {
  int n = g->n;
  greedy s = {g, NULL, NULL, NULL, NULL, NULL, 0};
  s.parent = malloc((size_t)(n + 1) * sizeof(int));
  s.next = malloc((size_t)(n + 1) * sizeof(int));
  s.nuc = malloc((size_t)(n + 1) * sizeof(int));
  s.mark = calloc((size_t)n + 1, sizeof(int));
  s.stack = malloc((size_t)(n + 1) * sizeof(int));
  int *order = malloc((size_t)(g->m + 1) * sizeof(int));
  EVT_ASSERT(s.parent && s.next && s.nuc && s.mark && s.stack && order);
  for (int v = 0; v < n; v++) s.parent[v] = v, s.next[v] = v, s.nuc[v] = (g->nodes[v].flags & EVT_PN_NUCLEUS) ? v : -1;
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
  free(s.parent); free(s.next); free(s.nuc); free(s.mark); free(s.stack); free(order);
  return ngroups;
}
