/* plan.c — partition an evt_graph: the plan (group per node, nucleus per group, cost, solver stats),
 * its text listing and its Graphviz picture. Groups are numbered in a topological order of the
 * contracted graph, so running them in number order is a valid schedule (exec.c). */
#include "partition/partition.h"

#include <stdlib.h>
#include <string.h>

evt_status evt_part_plan_build(evt_graph *eg, const evt_part_options *opt, double lambda, evt_part_plan *plan) {
  return evt_part_plan_build_compat(eg, opt, lambda, NULL, plan);
}

evt_status evt_part_plan_build_compat(evt_graph *eg, const evt_part_options *opt, double lambda,
                                      evt_part_compat_fn compat, evt_part_plan *plan) {
  return evt_part_plan_build_isolated(eg, opt, lambda, compat, NULL, plan);
}

evt_status evt_part_plan_build_isolated(evt_graph *eg, const evt_part_options *opt, double lambda,
                                        evt_part_compat_fn compat, const unsigned char *isolate, evt_part_plan *plan) {
  memset(plan, 0, sizeof *plan);
  evt_pgraph *g = evt_part_from_graph(eg, lambda);
  bool refinish = false, classes = false;
  for (int v = 0; isolate && v < eg->nnodes; v++)
    if (isolate[v] && evt_pgraph_kernel(g, v) && !(g->nodes[v].flags & (EVT_PN_VIEW | EVT_PN_OPERAND))) {
      if (isolate[v] == EVT_PART_ISOLATE_CLASS) {
        classes = refinish = true;
        continue;
      }
      g->nodes[v].flags |= EVT_PN_CUT_IN | EVT_PN_CUT_OUT;
      refinish = true;
    }
  if (compat) g->compat = compat;
  if (compat || refinish)
    evt_pgraph_finish(g); /* edge statuses depend on the hook (FUSE edges that break a pair rule become FREE) */
  if (classes) {
    /* EVT_PART_ISOLATE_CLASS nodes group only among themselves: every edge between one of them (or a view of
     * one, in graph order) and another kernel node is cut; FUSE edges (views, operand prologues) are kept */
    unsigned char *cls = calloc((size_t)g->n + 1, 1);
    EVT_ASSERT(cls);
    for (int v = 0; v < g->n && v < eg->nnodes; v++) {
      const evt_pnode *p = &g->nodes[v];
      if (!evt_pgraph_kernel(g, v)) continue;
      if (isolate[v] == EVT_PART_ISOLATE_CLASS && !(p->flags & (EVT_PN_VIEW | EVT_PN_OPERAND))) cls[v] = 1;
      else if ((p->flags & EVT_PN_VIEW) && p->nin == 1) cls[v] = cls[g->edges[g->in_edges[p->in0]].u];
    }
    for (int e = 0; e < g->m; e++) {
      evt_pedge *ed = &g->edges[e];
      if (ed->status == EVT_PE_FREE && evt_pgraph_kernel(g, ed->u) && evt_pgraph_kernel(g, ed->v) &&
          cls[ed->u] != cls[ed->v])
        ed->status = EVT_PE_CUT;
    }
    free(cls);
  }
  int n = eg->nnodes;
  plan->group = malloc((size_t)(n + 1) * sizeof(int));
  EVT_ASSERT(plan->group);
  evt_status st = evt_part_solve(g, opt, plan->group, &plan->stats);
  if (st != EVT_OK) {
    snprintf(eg->error, sizeof eg->error, "%s", g->error);
    evt_pgraph_free(g);
    evt_part_plan_free(plan);
    return st;
  }
  plan->cost = evt_part_evaluate(g, plan->group);
  int k = 0;
  for (int v = 0; v < n; v++)
    if (plan->group[v] + 1 > k) k = plan->group[v] + 1;
  plan->ngroups = k;
  plan->nucleus = malloc((size_t)(k + 1) * sizeof(int));
  EVT_ASSERT(plan->nucleus);
  for (int i = 0; i < k; i++) plan->nucleus[i] = -1;
  for (int v = 0; v < n; v++)
    if (plan->group[v] >= 0 && (g->nodes[v].flags & EVT_PN_NUCLEUS)) plan->nucleus[plan->group[v]] = v;
  evt_pgraph_free(g);
  return EVT_OK;
}

void evt_part_plan_free(evt_part_plan *plan) {
  free(plan->group);
  free(plan->nucleus);
  plan->group = plan->nucleus = NULL;
}

/* Members of each group in id order: list[at[gi] .. at[gi + 1]). */
static void group_members(const evt_graph *eg, const evt_part_plan *p, int *at, int *list) {
  int n = eg->nnodes;
  for (int gi = 0; gi <= p->ngroups; gi++) at[gi] = 0;
  for (int v = 0; v < n; v++)
    if (p->group[v] >= 0) at[p->group[v] + 1]++;
  for (int gi = 0; gi < p->ngroups; gi++) at[gi + 1] += at[gi];
  for (int v = 0; v < n; v++)
    if (p->group[v] >= 0) list[at[p->group[v]]++] = v;
  for (int gi = p->ngroups; gi > 0; gi--) at[gi] = at[gi - 1];
  at[0] = 0;
}

void evt_part_plan_print(const evt_graph *eg, const evt_part_plan *p, FILE *out) {
  int n = eg->nnodes;
  int *seen = malloc((size_t)(n + 1) * sizeof(int)), *leaves = calloc((size_t)n + 1, sizeof(int));
  int *at = malloc((size_t)(p->ngroups + 2) * sizeof(int)), *list = malloc((size_t)(n + 1) * sizeof(int));
  EVT_ASSERT(seen && leaves && at && list);
  char buf[128];
  /* leaves[v]: v's value is needed outside its group (a consumer elsewhere, or a graph output) */
  for (int v = 0; v < n; v++) {
    seen[v] = -1;
    if (eg->nodes[v].flags & EVT_NODE_OUTPUT) leaves[v] = 1;
    for (int k = 0; k < eg->nodes[v].ninputs; k++)
      if (p->group[eg->nodes[v].inputs[k]] != p->group[v]) leaves[eg->nodes[v].inputs[k]] = 1;
  }
  group_members(eg, p, at, list);
  for (int gi = 0; gi < p->ngroups; gi++) {
    int nu = p->nucleus[gi], cnt = at[gi + 1] - at[gi];
    if (nu >= 0) fprintf(out, "group %d: nucleus %%%s (%s), %d ops\n", gi, eg->nodes[nu].name, evt_op_table[eg->nodes[nu].op].name, cnt);
    else fprintf(out, "group %d: no nucleus, %d ops\n", gi, cnt);
    fprintf(out, "  ops:");
    for (int i = at[gi]; i < at[gi + 1]; i++) fprintf(out, " %%%s", eg->nodes[list[i]].name);
    fprintf(out, "\n  reads:");
    for (int i = at[gi]; i < at[gi + 1]; i++) {
      int v = list[i];
      for (int k = 0; k < eg->nodes[v].ninputs; k++) {
        int u = eg->nodes[v].inputs[k];
        if (p->group[u] == gi || seen[u] == gi) continue;
        seen[u] = gi;
        fprintf(out, " %%%s:%s", eg->nodes[u].name, evt_type_str(&eg->nodes[u].type, buf, sizeof buf));
      }
    }
    fprintf(out, "\n  writes:");
    for (int i = at[gi]; i < at[gi + 1]; i++)
      if (leaves[list[i]]) fprintf(out, " %%%s:%s", eg->nodes[list[i]].name, evt_type_str(&eg->nodes[list[i]].type, buf, sizeof buf));
    fprintf(out, "\n");
  }
  free(seen); free(leaves); free(at); free(list);
}

void evt_part_plan_dot(const evt_graph *eg, const evt_part_plan *p, FILE *out) {
  int n = eg->nnodes;
  fprintf(out, "digraph \"%s\" {\n  rankdir=TB;\n  node [shape=box, fontsize=10];\n", eg->name ? eg->name : "graph");
  fprintf(out, "  labelloc=t; fontsize=14;\n  label=\"%s: %d kernels (one box = one kernel; filled: its nucleus). "
          "Solid edges stay in the kernel, dashed edges go through global memory.\";\n",
          eg->name ? eg->name : "graph", p->ngroups);
  int *at = malloc((size_t)(p->ngroups + 2) * sizeof(int)), *list = malloc((size_t)(n + 1) * sizeof(int));
  EVT_ASSERT(at && list);
  group_members(eg, p, at, list);
  for (int gi = 0; gi < p->ngroups; gi++) {
    int nu = p->nucleus[gi], members = at[gi + 1] - at[gi];
    if (nu >= 0)
      fprintf(out, "  subgraph cluster_%d {\n    label=\"kernel %d: %s +%d\"; fontsize=12; style=rounded; "
              "color=blue; penwidth=2;\n", gi, gi, eg->nodes[nu].name, members - 1);
    else
      fprintf(out, "  subgraph cluster_%d {\n    label=\"kernel %d: %d ops\"; fontsize=12; style=rounded; "
              "color=gray40;\n", gi, gi, members);
    for (int i = at[gi]; i < at[gi + 1]; i++) {
      int v = list[i];
      fprintf(out, "    n%d [label=\"%s\\n%s\"%s];\n", v, eg->nodes[v].name, evt_op_table[eg->nodes[v].op].name,
              v == nu ? ", style=filled, fillcolor=lightblue" : "");
    }
    fprintf(out, "  }\n");
  }
  free(at);
  free(list);
  for (int v = 0; v < n; v++)
    if (p->group[v] < 0)
      fprintf(out, "  n%d [label=\"%s\", shape=ellipse, color=gray, fontcolor=gray30, fontsize=8];\n", v, eg->nodes[v].name);
  for (int v = 0; v < n; v++)
    for (int k = 0; k < eg->nodes[v].ninputs; k++) {
      int u = eg->nodes[v].inputs[k];
      bool cut = p->group[u] < 0 || p->group[u] != p->group[v];
      fprintf(out, "  n%d -> n%d%s;\n", u, v, p->group[u] < 0 ? " [style=dashed, color=gray]" : cut ? " [style=dashed]" : "");
    }
  fprintf(out, "}\n");
}
