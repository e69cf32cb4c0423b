/* The GPU program's memory plan (contract in memory.h): the steps of a run, which tensors they read and
 * write, and one arena placed by liveness. Pure host code. */
#include "runtime/gpu/memory.h"

#include <stdlib.h>
#include <string.h>

#include "codegen/kspec.h"

static int64_t aligned_bytes(const evt_graph *g, int v) {
  int64_t b = evt_type_numel(&g->nodes[v].type) * (int64_t)evt_dtype_size(g->nodes[v].type.dtype);
  return (b > 0 ? b + 255 : 256) / 256 * 256;
}

/* ---- steps and memory (pure host code) ------------------------------------------------------------- */

#define MAX_ACCESS (EVT_MAX_INPUTS + 4 + EVT_ROW_LAUNCH_MAX_PTRS)
static void step_access(const evt_graph *g, const evt_exec_plan *xp, evt_prog_step s, int *reads, int *nr,
                        int *writes, int *nw);

int evt_program_steps(const evt_graph *g, const evt_exec_plan *xp, evt_prog_step *steps) {
  int n = 0;
  if (!xp) {
    for (int v = 0; v < g->nnodes; v++)
      if (!evt_is_caller_source(&g->nodes[v])) steps[n++] = (evt_prog_step){v, -1};
    return n;
  }
  for (int gi = 0; gi < xp->ngroups; gi++) {
    const evt_group_exec *x = &xp->groups[gi];
    if (x->fused) steps[n++] = (evt_prog_step){-1, gi};
    else
      for (int k = 0; k < x->nmembers; k++) steps[n++] = (evt_prog_step){x->members[k], -1};
  }
  /* Sources go first, but only those something reads: a graph output, a tensor a group step binds, or the
   * input of such a source. A view of an input that GEMMs read through their layouts (a transposed weight)
   * is never materialized. */
  int ns = 0;
  unsigned char *need = calloc((size_t)g->nnodes + 1, 1);
  EVT_ASSERT(need);
  int reads[MAX_ACCESS], writes[MAX_ACCESS], nr, nw;
  for (int s = 0; s < n; s++) {
    step_access(g, xp, steps[s], reads, &nr, writes, &nw);
    for (int k = 0; k < nr; k++) need[reads[k]] = 1;
  }
  for (int k = xp->nsources - 1; k >= 0; k--) {
    int v = xp->sources[k];
    if (g->nodes[v].flags & EVT_NODE_OUTPUT) need[v] = 1;
    if (!need[v]) continue;
    ns++;
    for (int j = 0; j < g->nodes[v].ninputs; j++) need[g->nodes[v].inputs[j]] = 1;
  }
  memmove(steps + ns, steps, sizeof *steps * (size_t)n);
  for (int k = 0, i = 0; k < xp->nsources; k++)
    if (need[xp->sources[k]]) steps[i++] = (evt_prog_step){xp->sources[k], -1};
  free(need);
  return n + ns;
}

_Static_assert(EVT_ROW_LAUNCH_MAX_PTRS <= EVT_LAUNCH_MAX_PTRS, "ptr_node serves both ABIs");

static void alias_reads(const evt_exec_plan *xp, int *reads, int nr);

/* The nodes step s reads and writes. */
static void step_access(const evt_graph *g, const evt_exec_plan *xp, evt_prog_step s, int *reads, int *nr,
                        int *writes, int *nw) {
  *nr = *nw = 0;
  if (s.node >= 0) {
    const evt_node *n = &g->nodes[s.node];
    for (int j = 0; j < n->ninputs; j++) reads[(*nr)++] = n->inputs[j];
    writes[(*nw)++] = s.node;
    alias_reads(xp, reads, *nr);
    return;
  }
  const evt_group_exec *x = &xp->groups[s.group];
  const evt_lowered *L = &xp->low.k[s.group];
  bool gemm = evt_group_exec_cutlass(x); /* (a conv's a / b / d likewise) */
  int nspec = gemm ? L->spec.nnodes : L->rspec.nnodes;
  if (gemm) {
    reads[(*nr)++] = x->a_node;
    reads[(*nr)++] = x->b_node;
    if (x->d_node >= 0) writes[(*nw)++] = x->d_node;
  } else {
    for (int k = 0; k < 4; k++)
      if (x->in_node[k] >= 0) reads[(*nr)++] = x->in_node[k];
  }
  for (int i = 0; i < EVT_ROW_LAUNCH_MAX_PTRS && i < nspec; i++) {
    int v = x->ptr_node[i];
    if (v < 0) continue;
    evt_vop op = gemm ? L->spec.nodes[i].op : L->rspec.nodes[i].op;
    if (evt_vop_class(op) == 'L') reads[(*nr)++] = v;
    else writes[(*nw)++] = v;
  }
  alias_reads(xp, reads, *nr);
}

/* A read of a node that shares another's memory (evt_exec_alias) is a read of that node. */
static void alias_reads(const evt_exec_plan *xp, int *reads, int nr) {
  for (int k = 0; k < nr; k++) {
    int u = evt_exec_alias(xp, reads[k]);
    if (u >= 0) reads[k] = u;
  }
}

evt_status evt_program_layout(const evt_graph *g, const evt_exec_plan *xp, evt_arena_slot *slots, int64_t *arena,
                              int64_t *naive, char *err, size_t errlen) {
  int n = g->nnodes;
  evt_prog_step *steps = malloc(sizeof *steps * (size_t)(n + 1));
  int64_t *bytes = malloc(sizeof *bytes * (size_t)(n + 1)), *offs = malloc(sizeof *offs * (size_t)(n + 1));
  int *first = malloc(sizeof *first * (size_t)(n + 1)), *last = malloc(sizeof *last * (size_t)(n + 1));
  EVT_ASSERT(steps && bytes && offs && first && last);
  int64_t sum = 0;
  for (int v = 0; v < n; v++) {
    const evt_node *nd = &g->nodes[v];
    bool caller = evt_is_caller_source(nd) || (nd->flags & EVT_NODE_OUTPUT);
    slots[v] = (evt_arena_slot){caller ? EVT_SLOT_CALLER : EVT_SLOT_NONE, -1, 0, -1, -1};
    first[v] = last[v] = -1;
    if (!caller) sum += aligned_bytes(g, v);
  }
  int ns = evt_program_steps(g, xp, steps), reads[MAX_ACCESS], writes[MAX_ACCESS], nr, nw;
  evt_status st = EVT_OK;
  for (int s = 0; s < ns && st == EVT_OK; s++) {
    step_access(g, xp, steps[s], reads, &nr, writes, &nw);
    for (int k = 0; k < nr; k++) {
      int v = reads[k];
      if (slots[v].kind == EVT_SLOT_CALLER) continue;
      if (first[v] < 0) {
        snprintf(err, errlen, "step %d reads %%%s before any step writes it", s, g->nodes[v].name);
        st = EVT_ERR_INTERNAL;
        break;
      }
      last[v] = s;
    }
    for (int k = 0; k < nw; k++) {
      int v = writes[k];
      if (slots[v].kind == EVT_SLOT_CALLER || first[v] >= 0) continue;
      slots[v].kind = EVT_SLOT_ARENA;
      first[v] = last[v] = s;
    }
  }
  for (int v = 0; v < n; v++) bytes[v] = slots[v].kind == EVT_SLOT_ARENA ? aligned_bytes(g, v) : -1;
  int64_t top = st == EVT_OK ? evt_arena_place(n, bytes, first, last, offs) : 0;
  for (int v = 0; v < n && st == EVT_OK; v++)
    if (slots[v].kind == EVT_SLOT_ARENA) {
      slots[v].offset = offs[v];
      slots[v].bytes = bytes[v];
      slots[v].first = first[v];
      slots[v].last = last[v];
    }
  for (int v = 0; v < n && st == EVT_OK; v++) { /* a node sharing another's memory: that node's slot */
    int u = evt_exec_alias(xp, v); /* (a caller's tensor: follow_aliases points at it once it is bound) */
    if (u >= 0 && slots[v].kind == EVT_SLOT_NONE && slots[u].kind == EVT_SLOT_ARENA) slots[v] = slots[u];
  }
  free(steps);
  free(bytes);
  free(offs);
  free(first);
  free(last);
  *arena = top;
  if (naive) *naive = sum;
  return st;
}


/* ---- best-fit placement -------------------------------------------------------------------------- */

static int64_t align_up(int64_t x) { return (x + EVT_ARENA_ALIGN - 1) / EVT_ARENA_ALIGN * EVT_ARENA_ALIGN; }

typedef struct place_item {
  int id;
  int64_t size;
  int first, last;
} place_item;

static int by_size(const void *x, const void *y) {
  const place_item *a = x, *b = y;
  if (a->size != b->size) return a->size > b->size ? -1 : 1;
  if (a->first != b->first) return a->first < b->first ? -1 : 1;
  return a->id - b->id;
}

static int64_t *sort_offsets;
static int by_offset(const void *x, const void *y) {
  int64_t a = sort_offsets[((const place_item *)x)->id], b = sort_offsets[((const place_item *)y)->id];
  return a < b ? -1 : a > b;
}

int64_t evt_arena_place(int n, const int64_t *bytes, const int *first, const int *last, int64_t *offsets) {
  place_item *order = malloc((size_t)(n + 1) * sizeof *order), *obst = malloc((size_t)(n + 1) * sizeof *obst);
  EVT_ASSERT(order && obst);
  int k = 0;
  for (int i = 0; i < n; i++) {
    offsets[i] = -1;
    if (bytes[i] >= 0) order[k++] = (place_item){i, align_up(bytes[i] > 0 ? bytes[i] : 1), first[i], last[i]};
  }
  qsort(order, (size_t)k, sizeof *order, by_size);
  int64_t top = 0;
  sort_offsets = offsets;
  for (int i = 0; i < k; i++) {
    const place_item *b = &order[i];
    int no = 0;
    for (int j = 0; j < i; j++)
      if (order[j].first <= b->last && b->first <= order[j].last) obst[no++] = order[j];
    qsort(obst, (size_t)no, sizeof *obst, by_offset);
    int64_t best = -1, best_gap = INT64_MAX, cur = 0;
    for (int j = 0; j < no; j++) {
      int64_t gap = offsets[obst[j].id] - cur;
      if (gap >= b->size && gap < best_gap) best = cur, best_gap = gap;
      int64_t end = offsets[obst[j].id] + obst[j].size;
      if (end > cur) cur = end;
    }
    offsets[b->id] = best >= 0 ? best : cur;
    if (offsets[b->id] + b->size > top) top = offsets[b->id] + b->size;
  }
  free(order);
  free(obst);
  return top;
}

