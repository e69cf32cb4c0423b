/* The fused execution plan (contract: exec_plan.h). */
#include "runtime/exec_plan.h"

#include <stdlib.h>
#include <string.h>

static bool caller_slot(const evt_node *n) { return n->op == EVT_OP_INPUT || n->op == EVT_OP_PARAM; }

bool evt_exec_bind(const evt_graph *g, const int *group, const evt_lowered *L, evt_group_exec *x) {
  const evt_rspec *s = &L->rspec;
  for (int k = 0; k < 3; k++) x->in_node[k] = -1;
  for (int i = 0; i < EVT_ROW_LAUNCH_MAX_PTRS; i++) x->ptr_node[i] = -1;
  x->m = L->m;
  x->n = L->n;
  if (!L->ok || (L->kind != EVT_LK_ROW && L->kind != EVT_LK_POINTWISE)) {
    snprintf(x->why, sizeof x->why, "%s", L->ok ? "gemm+evt kernels are not wired into the runtime yet" : L->reason);
    return false;
  }
  if (L->n > 32768 || L->m > 2147483647 || L->n < 0 || L->m < 0) {
    snprintf(x->why, sizeof x->why, "group %d: [%lld, %lld] does not fit a register-resident row kernel", L->group,
             (long long)L->m, (long long)L->n);
    return false;
  }
  if (s->nnodes > EVT_ROW_LAUNCH_MAX_PTRS) {
    snprintf(x->why, sizeof x->why, "group %d: %d spec nodes (at most %d pointers)", L->group, s->nnodes,
             EVT_ROW_LAUNCH_MAX_PTRS);
    return false;
  }
  int nin = evt_row_nucleus_ninputs(s);
  for (int k = 0; k < nin && k < 3; k++) {
    int v = L->rin[k];
    if (v < 0 || v >= g->nnodes) {
      snprintf(x->why, sizeof x->why, "group %d: nucleus input %d is not bound", L->group, k);
      return false;
    }
    x->in_node[k] = v;
  }
  for (int i = 0; i < s->nnodes; i++) {
    const evt_rnode *r = &s->nodes[i];
    if (!evt_vop_has_memory(r->op)) continue;
    int v = L->vtensor[i];
    if (v < 0 || v >= g->nnodes) {
      snprintf(x->why, sizeof x->why, "group %d: spec node %s is not bound to a tensor", L->group, r->name);
      return false;
    }
    const evt_type *t = &g->nodes[v].type;
    if (t->dtype != r->dtype) {
      snprintf(x->why, sizeof x->why, "group %d: %%%s is %s but spec node %s has %s", L->group, g->nodes[v].name,
               evt_dtype_name(t->dtype), r->name, evt_dtype_name(r->dtype));
      return false;
    }
    if (evt_type_numel(t) != evt_rspec_node_elems(s, i, L->m, L->n)) {
      snprintf(x->why, sizeof x->why, "group %d: %%%s has %lld elements, spec node %s needs %lld", L->group,
               g->nodes[v].name, (long long)evt_type_numel(t), r->name,
               (long long)evt_rspec_node_elems(s, i, L->m, L->n));
      return false;
    }
    x->ptr_node[i] = v;
  }
  /* every value leaving the group must be written by a store */
  for (int w = 0; w < g->nnodes; w++) {
    const evt_node *nd = &g->nodes[w];
    for (int k = -1; k < nd->ninputs; k++) {
      int u = k < 0 ? w : nd->inputs[k];
      if (group[u] != L->group) continue;
      bool leaves = k < 0 ? (nd->flags & EVT_NODE_OUTPUT) != 0 : group[w] != L->group;
      if (!leaves) continue;
      bool stored = false;
      for (int i = 0; i < s->nnodes && !stored; i++)
        stored = x->ptr_node[i] == u && evt_vop_class(s->nodes[i].op) != 'L';
      if (!stored) {
        snprintf(x->why, sizeof x->why, "group %d: %%%s leaves the group but no store of the spec writes it", L->group,
                 g->nodes[u].name);
        return false;
      }
    }
  }
  return true;
}

evt_status evt_exec_plan_build(evt_graph *g, evt_exec_plan *p) {
  memset(p, 0, sizeof *p);
  evt_part_options opt = evt_part_options_default();
  opt.use_cache = 0;
  evt_status st = evt_part_plan_build(g, &opt, EVT_PART_LAMBDA_DEFAULT, &p->part);
  if (st != EVT_OK) return st;
  st = evt_lower_plan(g, &p->part, &p->low);
  if (st != EVT_OK) {
    evt_part_plan_free(&p->part);
    return evt_graph_errorf_at(g, (evt_origin){0}, EVT_ERR_INTERNAL, "the lowering does not match the partition");
  }
  int n = g->nnodes, ng = p->part.ngroups;
  p->ngroups = ng;
  p->groups = calloc((size_t)ng + 1, sizeof *p->groups);
  p->sources = malloc(sizeof(int) * ((size_t)n + 1));
  p->kname = calloc((size_t)ng + 1, sizeof *p->kname);
  p->kspec = calloc((size_t)ng + 1, sizeof *p->kspec);
  EVT_ASSERT(p->groups && p->sources && p->kname && p->kspec);
  for (int v = 0; v < n; v++) {
    int gi = p->part.group[v];
    if (gi >= 0) {
      EVT_ASSERT(gi < ng);
      p->groups[gi].nmembers++;
      continue;
    }
    if (caller_slot(&g->nodes[v])) continue;
    for (int k = 0; k < g->nodes[v].ninputs; k++)
      if (p->part.group[g->nodes[v].inputs[k]] >= 0) {
        evt_exec_plan_free(p);
        return evt_graph_errorf(g, v, EVT_ERR_INTERNAL, "a partition source reads a grouped tensor");
      }
    p->sources[p->nsources++] = v;
  }
  for (int gi = 0; gi < ng; gi++) {
    evt_group_exec *x = &p->groups[gi];
    x->members = malloc(sizeof(int) * ((size_t)x->nmembers + 1));
    EVT_ASSERT(x->members);
    x->nmembers = 0;
  }
  for (int v = 0; v < n; v++)
    if (p->part.group[v] >= 0) {
      evt_group_exec *x = &p->groups[p->part.group[v]];
      x->members[x->nmembers++] = v;
    }
  for (int gi = 0; gi < ng; gi++) {
    evt_group_exec *x = &p->groups[gi];
    const evt_lowered *L = &p->low.k[gi];
    x->group = gi;
    x->kind = L->kind;
    x->kernel = -1;
    x->fused = evt_exec_bind(g, p->part.group, L, x);
    if (!x->fused) continue;
    int k = 0;
    while (k < p->nkernels && strcmp(p->kname[k], L->kernel)) k++;
    if (k == p->nkernels) {
      snprintf(p->kname[k], sizeof p->kname[k], "%s", L->kernel);
      p->kspec[k] = &L->rspec;
      p->nkernels++;
    }
    x->kernel = k;
  }
  return EVT_OK;
}

void evt_exec_plan_demote(evt_exec_plan *p, int k, const char *why) {
  for (int gi = 0; gi < p->ngroups; gi++) {
    evt_group_exec *x = &p->groups[gi];
    if (!x->fused || x->kernel != k) continue;
    x->fused = 0;
    snprintf(x->why, sizeof x->why, "group %d: kernel %s: %.340s", gi, p->kname[k], why);
  }
}

void evt_exec_plan_counts(const evt_exec_plan *p, int *fused, int *fallback) {
  *fused = *fallback = 0;
  for (int gi = 0; gi < p->ngroups; gi++) (p->groups[gi].fused ? fused : fallback)[0]++;
}

void evt_exec_plan_free(evt_exec_plan *p) {
  if (p->groups)
    for (int gi = 0; gi < p->ngroups; gi++) free(p->groups[gi].members);
  free(p->groups);
  free(p->sources);
  free(p->kname);
  free(p->kspec);
  if (p->low.k) evt_lower_free(&p->low);
  evt_part_plan_free(&p->part);
  memset(p, 0, sizeof *p);
}

void evt_exec_plan_print(const evt_graph *g, const evt_exec_plan *p, FILE *out) {
  (void)g;
  for (int gi = 0; gi < p->ngroups; gi++) {
    const evt_group_exec *x = &p->groups[gi];
    if (x->fused)
      fprintf(out, "group %d %s %s fused [%lld x %lld], %d nodes\n", gi, evt_lower_kind_name(x->kind),
              p->kname[x->kernel], (long long)x->m, (long long)x->n, x->nmembers);
    else
      fprintf(out, "group %d %s fallback, %d nodes: %s\n", gi, evt_lower_kind_name(x->kind), x->nmembers, x->why);
  }
}

/* CPU model of a fused step: the GPU path's order, fused groups through evt_rspec_reference. */
evt_status evt_exec_plan_run_cpu(evt_graph *g, const evt_exec_plan *p, evt_tensor *values) {
  evt_status st = EVT_OK;
  const evt_tensor *ins[EVT_MAX_INPUTS];
  for (int k = 0; k < p->nsources && st == EVT_OK; k++) {
    int v = p->sources[k];
    for (int j = 0; j < g->nodes[v].ninputs; j++) ins[j] = &values[g->nodes[v].inputs[j]];
    evt_tensor_free(&values[v]);
    st = evt_interp_node(g, v, ins, &values[v], 0);
  }
  for (int gi = 0; gi < p->ngroups && st == EVT_OK; gi++) {
    const evt_group_exec *x = &p->groups[gi];
    if (!x->fused) {
      for (int k = 0; k < x->nmembers && st == EVT_OK; k++) {
        int v = x->members[k];
        for (int j = 0; j < g->nodes[v].ninputs; j++) ins[j] = &values[g->nodes[v].inputs[j]];
        evt_tensor_free(&values[v]);
        st = evt_interp_node(g, v, ins, &values[v], 0);
      }
      continue;
    }
    const evt_rspec *s = &p->low.k[gi].rspec;
    const double *in[3] = {NULL, NULL, NULL};
    double *mem[EVT_ROW_LAUNCH_MAX_PTRS] = {0};
    for (int k = 0; k < 3; k++)
      if (x->in_node[k] >= 0) in[k] = values[x->in_node[k]].data;
    for (int k = 0; k < x->nmembers; k++) evt_tensor_free(&values[x->members[k]]); /* not materialized */
    for (int i = 0; i < s->nnodes && st == EVT_OK; i++) {
      int v = x->ptr_node[i];
      if (v < 0) continue;
      if (evt_vop_class(s->nodes[i].op) != 'L') {
        const evt_type *t = &g->nodes[v].type;
        evt_tensor_free(&values[v]);
        st = evt_tensor_alloc(&values[v], t->dtype, t->rank, t->shape);
      }
      if (st == EVT_OK && !values[v].data)
        st = evt_graph_errorf(g, v, EVT_ERR_INTERNAL, "group %d: tensor not computed before its kernel", gi);
      if (st == EVT_OK) mem[i] = values[v].data;
    }
    if (st == EVT_OK) evt_rspec_reference(s, x->m, x->n, in, mem, NULL, NULL);
  }
  return st;
}
