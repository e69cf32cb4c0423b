/* The launch plan of `evtc compile`: launches, buffers, liveness, one arena (contract in launch_plan.h).
 * Lifetimes come from the launch order (launch i runs group i); placement is evt_arena_place
 * (src/runtime/gpu/memory.c), checked by evt_plan_check, not trusted. */
#include "compile/launch_plan.h"

#include <stdlib.h>
#include <string.h>

#include "partition/partition.h"
#include "runtime/gpu/memory.h"

static int64_t align_up(int64_t x) { return (x + EVT_ARENA_ALIGN - 1) / EVT_ARENA_ALIGN * EVT_ARENA_ALIGN; }

static bool view_op(evt_op op) {
  return op == EVT_OP_RESHAPE || op == EVT_OP_SQUEEZE || op == EVT_OP_UNSQUEEZE || op == EVT_OP_EXPAND ||
         op == EVT_OP_PERMUTE || op == EVT_OP_TRANSPOSE;
}

static int64_t tensor_bytes(const evt_graph *g, int v) {
  return evt_type_numel(&g->nodes[v].type) * (int64_t)evt_dtype_size(g->nodes[v].type.dtype);
}

static int add_buffer(evt_plan *p, int node, evt_buf_kind kind, int64_t bytes, int first, int last) {
  p->buffers = realloc(p->buffers, (size_t)(p->nbuffers + 1) * sizeof *p->buffers);
  EVT_ASSERT(p->buffers);
  p->buffers[p->nbuffers] = (evt_plan_buffer){node, kind, bytes, first, last, -1};
  return p->nbuffers++;
}

static void add_id(int **a, int *n, int id) {
  for (int i = 0; i < *n; i++)
    if ((*a)[i] == id) return;
  *a = realloc(*a, (size_t)(*n + 1) * sizeof **a);
  EVT_ASSERT(*a);
  (*a)[(*n)++] = id;
}

static bool external(const evt_plan_buffer *b) { return b->kind == EVT_BUF_INPUT || b->kind == EVT_BUF_PARAM; }

static bool intersect(const evt_plan_buffer *a, const evt_plan_buffer *b) { return a->first <= b->last && b->first <= a->last; }

static void place(evt_plan *p) {
  int nb = p->nbuffers;
  int64_t *bytes = malloc((size_t)(nb + 1) * sizeof *bytes), *offs = malloc((size_t)(nb + 1) * sizeof *offs);
  int *first = malloc((size_t)(nb + 1) * sizeof *first), *last = malloc((size_t)(nb + 1) * sizeof *last);
  EVT_ASSERT(bytes && offs && first && last);
  p->naive_bytes = 0;
  for (int i = 0; i < nb; i++) {
    const evt_plan_buffer *b = &p->buffers[i];
    bytes[i] = external(b) ? -1 : b->bytes;
    first[i] = b->first;
    last[i] = b->last;
    if (!external(b)) p->naive_bytes += align_up(b->bytes > 0 ? b->bytes : 1);
  }
  p->arena_bytes = evt_arena_place(nb, bytes, first, last, offs);
  for (int i = 0; i < nb; i++) p->buffers[i].offset = offs[i];
  free(bytes);
  free(offs);
  free(first);
  free(last);
}

evt_status evt_plan_build(const evt_graph *g, const evt_part_plan *part, const evt_lower_result *low, evt_plan *p) {
  memset(p, 0, sizeof *p);
  if (!part || !low || low->n != part->ngroups) return EVT_ERR_INVALID;
  int n = g->nnodes, L = part->ngroups;
  p->nlaunches = L;
  p->launches = calloc((size_t)L + 1, sizeof *p->launches);
  p->buffer_of = malloc(((size_t)n + 1) * sizeof(int));
  EVT_ASSERT(p->launches && p->buffer_of);
  for (int v = 0; v < n; v++) p->buffer_of[v] = -1;
  unsigned char *leaves = calloc((size_t)n + 1, 1);
  EVT_ASSERT(leaves);
  for (int w = 0; w < n; w++)
    for (int k = 0; k < g->nodes[w].ninputs; k++) {
      int u = g->nodes[w].inputs[k];
      if (part->group[u] >= 0 && part->group[w] != part->group[u]) leaves[u] = 1;
    }
  /* buffers in node order: sources, views of sources (aliases), tensors that leave their group */
  for (int v = 0; v < n; v++) {
    const evt_node *nd = &g->nodes[v];
    bool out = nd->flags & EVT_NODE_OUTPUT;
    int gi = part->group[v];
    if (gi >= L) {
      free(leaves);
      return EVT_ERR_INVALID;
    }
    if (nd->op == EVT_OP_INPUT || nd->op == EVT_OP_PARAM) {
      p->buffer_of[v] = add_buffer(p, v, nd->op == EVT_OP_INPUT ? EVT_BUF_INPUT : EVT_BUF_PARAM, tensor_bytes(g, v), -1, L);
      p->external_bytes += tensor_bytes(g, v);
    } else if (gi < 0 && view_op(nd->op) && p->buffer_of[nd->inputs[0]] >= 0 && !out) {
      p->buffer_of[v] = p->buffer_of[nd->inputs[0]];
    } else if (gi < 0) {
      /* a constant / rand / view of one: compile-time or in-kernel; an output of that kind is filled at bind */
      if (out) p->buffer_of[v] = add_buffer(p, v, EVT_BUF_OUTPUT, tensor_bytes(g, v), -1, L > 0 ? L - 1 : 0);
    } else if (low->k[gi].ok && evt_lowered_alias_base(&low->k[gi], v) >= 0 &&
               p->buffer_of[evt_lowered_alias_base(&low->k[gi], v)] >= 0) {
      p->buffer_of[v] = p->buffer_of[evt_lowered_alias_base(&low->k[gi], v)]; /* the bytes of a value the kernel stores */
    } else if (leaves[v] || out) {
      p->buffer_of[v] = add_buffer(p, v, out ? EVT_BUF_OUTPUT : EVT_BUF_TEMP, tensor_bytes(g, v), gi, out ? L - 1 : gi);
      add_id(&p->launches[gi].writes, &p->launches[gi].nwrites, p->buffer_of[v]);
    }
  }
  free(leaves);
  /* reads: every operand from outside the reader's group that has memory */
  for (int w = 0; w < n; w++) {
    int gw = part->group[w];
    if (gw < 0) continue;
    for (int k = 0; k < g->nodes[w].ninputs; k++) {
      int u = g->nodes[w].inputs[k], b = p->buffer_of[u];
      if (part->group[u] == gw || b < 0) continue;
      add_id(&p->launches[gw].reads, &p->launches[gw].nreads, b);
      evt_plan_buffer *bf = &p->buffers[b];
      if (!external(bf) && gw > bf->last) bf->last = gw;
    }
  }
  for (int i = 0; i < L; i++) {
    evt_plan_launch *la = &p->launches[i];
    la->group = i;
    la->kernel = &low->k[i];
    if (la->kernel->ok && evt_lowered_cutlass(la->kernel) && la->kernel->d_tensor < 0) { /* (GEMM or conv: D scratch) */
      const evt_lowered *K = la->kernel;
      int b = add_buffer(p, K->nucleus, EVT_BUF_SCRATCH, K->m * K->n * (int64_t)evt_dtype_size(K->spec.d_dtype), i, i);
      add_id(&la->writes, &la->nwrites, b);
    }
  }
  for (int i = 0; i < L; i++) {
    evt_plan_launch *la = &p->launches[i];
    for (int j = 0; j < la->nreads; j++) la->bytes_read += p->buffers[la->reads[j]].bytes;
    for (int j = 0; j < la->nwrites; j++) la->bytes_written += p->buffers[la->writes[j]].bytes;
    p->global_bytes += la->bytes_read + la->bytes_written;
  }
  place(p);
  return EVT_OK;
}

void evt_plan_free(evt_plan *p) {
  for (int i = 0; i < p->nlaunches; i++) {
    free(p->launches[i].reads);
    free(p->launches[i].writes);
  }
  free(p->launches);
  free(p->buffers);
  free(p->buffer_of);
  memset(p, 0, sizeof *p);
}

evt_status evt_plan_check(const evt_graph *g, const evt_plan *p, char *err, size_t errlen) {
  for (int i = 0; i < p->nbuffers; i++) {
    const evt_plan_buffer *a = &p->buffers[i];
    if (external(a)) continue;
    if (a->offset < 0 || a->offset % EVT_ARENA_ALIGN || a->offset + a->bytes > p->arena_bytes || a->first > a->last) {
      snprintf(err, errlen, "buffer b%d (%%%s): offset %lld, %lld bytes, live %d..%d outside the arena of %lld bytes", i,
               g->nodes[a->node].name, (long long)a->offset, (long long)a->bytes, a->first, a->last, (long long)p->arena_bytes);
      return EVT_ERR_INTERNAL;
    }
    for (int j = i + 1; j < p->nbuffers; j++) {
      const evt_plan_buffer *b = &p->buffers[j];
      if (external(b) || !intersect(a, b)) continue;
      if (a->offset < b->offset + b->bytes && b->offset < a->offset + a->bytes) {
        snprintf(err, errlen, "buffers b%d (%%%s) and b%d (%%%s) are live together (launches %d..%d and %d..%d) and overlap", i,
                 g->nodes[a->node].name, j, g->nodes[b->node].name, a->first, a->last, b->first, b->last);
        return EVT_ERR_INTERNAL;
      }
    }
  }
  for (int l = 0; l < p->nlaunches; l++) {
    const evt_plan_launch *la = &p->launches[l];
    for (int pass = 0; pass < 2; pass++) {
      int nn = pass ? la->nwrites : la->nreads;
      const int *ids = pass ? la->writes : la->reads;
      for (int j = 0; j < nn; j++) {
        const evt_plan_buffer *b = &p->buffers[ids[j]];
        if (external(b)) continue;
        if (l < b->first || l > b->last || (pass == 0 && l == b->first)) {
          snprintf(err, errlen, "launch %d %s buffer b%d (%%%s) outside its lifetime %d..%d", l, pass ? "writes" : "reads",
                   ids[j], g->nodes[b->node].name, b->first, b->last);
          return EVT_ERR_INTERNAL;
        }
      }
    }
  }
  return EVT_OK;
}

static const char *kind_name(evt_buf_kind k) {
  static const char *names[] = {"input", "param", "temp", "output", "scratch"};
  return names[k];
}

void evt_plan_print(const evt_graph *g, const evt_plan *p, FILE *out) {
  char tb[96];
  fprintf(out, "plan %s: %d launches, %d buffers\n", g->name ? g->name : "graph", p->nlaunches, p->nbuffers);
  fprintf(out, "arena: %lld bytes (sum of buffers %lld; %.1f%%); inputs+params %lld bytes; global memory traffic %lld bytes\n",
          (long long)p->arena_bytes, (long long)p->naive_bytes,
          p->naive_bytes ? 100.0 * (double)p->arena_bytes / (double)p->naive_bytes : 0.0, (long long)p->external_bytes,
          (long long)p->global_bytes);
  fprintf(out, "\nlaunches:\n");
  for (int i = 0; i < p->nlaunches; i++) {
    const evt_plan_launch *la = &p->launches[i];
    const evt_lowered *K = la->kernel;
    if (K->ok)
      fprintf(out, "  %d: group %d %s %s (%s%s)\n", i, la->group, evt_lower_kind_name(K->kind), K->kernel, K->nucleus >= 0 ? "%" : "",
              K->nucleus >= 0 ? g->nodes[K->nucleus].name : "nucleus-free");
    else fprintf(out, "  %d: group %d %s -- %s\n", i, la->group, evt_lower_kind_name(K->kind), K->reason);
    fprintf(out, "     reads:");
    for (int j = 0; j < la->nreads; j++) fprintf(out, " b%d", la->reads[j]);
    fprintf(out, "\n     writes:");
    for (int j = 0; j < la->nwrites; j++) fprintf(out, " b%d", la->writes[j]);
    fprintf(out, "\n");
    if (K->ok && evt_lowered_cutlass(K)) {
      fprintf(out, "     args: M=%lld N=%lld K=%lld A=b%d B=b%d D=", (long long)K->m, (long long)K->n, (long long)K->k,
              p->buffer_of[K->a_node], p->buffer_of[K->b_node]);
      if (K->d_tensor >= 0) fprintf(out, "b%d", p->buffer_of[K->d_tensor]);
      else fprintf(out, "scratch");
      for (int v = 0; v < K->spec.nnodes; v++)
        if (K->vtensor[v] >= 0) fprintf(out, " %s=b%d", K->spec.nodes[v].name, p->buffer_of[K->vtensor[v]]);
      fprintf(out, "\n");
    } else if (K->ok) {
      fprintf(out, "     args: M=%lld N=%lld", (long long)K->m, (long long)K->n);
      static const char *const csr[4] = {"rowptr", "col", "val", "x"}; /* (an spmm nucleus's operands) */
      for (int k = 0; k < 4; k++)
        if (K->rin[k] >= 0 && K->rspec.nucleus == EVT_ROWN_SPMM) fprintf(out, " %s=b%d", csr[k], p->buffer_of[K->rin[k]]);
        else if (K->rin[k] >= 0) fprintf(out, " in%d=b%d", k, p->buffer_of[K->rin[k]]);
      for (int v = 0; v < K->rspec.nnodes; v++)
        if (K->vtensor[v] >= 0) fprintf(out, " %s=b%d", K->rspec.nodes[v].name, p->buffer_of[K->vtensor[v]]);
      fprintf(out, "\n");
    }
  }
  fprintf(out, "\nbuffers:\n");
  for (int i = 0; i < p->nbuffers; i++) {
    const evt_plan_buffer *b = &p->buffers[i];
    fprintf(out, "  b%d %%%s %s %s %lld bytes", i, g->nodes[b->node].name, kind_name(b->kind),
            evt_type_str(&g->nodes[b->node].type, tb, sizeof tb), (long long)b->bytes);
    if (external(b)) fprintf(out, " external\n");
    else fprintf(out, " @%lld live %d..%d\n", (long long)b->offset, b->first, b->last);
  }
  fprintf(out, "\nbindings:\n");
  for (int v = 0; v < g->nnodes; v++) {
    const evt_node *nd = &g->nodes[v];
    if (nd->op == EVT_OP_INPUT || nd->op == EVT_OP_PARAM)
      fprintf(out, "  %s %%%s -> b%d\n", nd->op == EVT_OP_INPUT ? "input" : "param", nd->name, p->buffer_of[v]);
  }
  for (int i = 0; i < g->noutputs; i++) {
    int o = g->outputs[i];
    const char *what = o == g->loss ? "loss" : !strncmp(g->nodes[o].name, "grad.", 5) ? "gradient" : "output";
    fprintf(out, "  %s %%%s -> b%d\n", what, g->nodes[o].name, p->buffer_of[o]);
  }
}
