/* evt_plan_report: the fused plan of a graph as JSON, for `evt.explain` and tools (public contract in evt.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compile/compile.h"
#include "compile/launch_plan.h"
#include "partition/partition.h"

static int64_t tensor_bytes(const evt_graph *g, int v) {
  return evt_type_numel(&g->nodes[v].type) * (int64_t)evt_dtype_size(g->nodes[v].type.dtype);
}

static bool is_view(evt_op op) {
  return op == EVT_OP_RESHAPE || op == EVT_OP_SQUEEZE || op == EVT_OP_UNSQUEEZE || op == EVT_OP_EXPAND ||
         op == EVT_OP_PERMUTE || op == EVT_OP_TRANSPOSE;
}

/* The unfused baseline: every op its own kernel, reading its inputs and writing its output (views, sources and
 * constants are not kernels). */
static void unfused_cost(const evt_graph *g, int64_t *kernels, int64_t *bytes) {
  *kernels = *bytes = 0;
  for (int v = 0; v < g->nnodes; v++) {
    const evt_node *n = &g->nodes[v];
    if (evt_op_get(n->op)->cls == EVT_CLASS_SOURCE || is_view(n->op)) continue;
    ++*kernels;
    *bytes += tensor_bytes(g, v);
    for (int k = 0; k < n->ninputs; k++) *bytes += tensor_bytes(g, n->inputs[k]);
  }
}

/* A JSON string (quotes, backslashes and control characters escaped). */
static void json_str(evt_sbuf *b, const char *s) {
  evt_sbuf_printf(b, "\"");
  for (; s && *s; s++) {
    if (*s == '"' || *s == '\\') evt_sbuf_printf(b, "\\%c", *s);
    else if ((unsigned char)*s < 0x20) evt_sbuf_printf(b, "\\u%04x", (unsigned char)*s);
    else evt_sbuf_printf(b, "%c", *s);
  }
  evt_sbuf_printf(b, "\"");
}

static const char *group_path(const evt_group_exec *x) {
  if (!x->fused) return "node-by-node";
  if (x->blas) return x->unf_bias >= 0 ? "cublaslt" : "cublas";
  if (x->unf) return "cublas+row";
  return "generated";
}

/* The ops of a group's members in id order, as "mm+add+gelu" (at most ~200 characters). */
static void member_ops(evt_sbuf *b, const evt_graph *g, const evt_group_exec *x) {
  char ops[256] = "";
  size_t len = 0;
  for (int k = 0; k < x->nmembers && len < 200; k++)
    len += (size_t)snprintf(ops + len, sizeof ops - len, "%s%s", k ? "+" : "", evt_op_get(g->nodes[x->members[k]].op)->name);
  json_str(b, ops);
}

/* ", "nodes": [the members' names], "out_numel": the largest member output's elements". */
static void member_nodes(evt_sbuf *b, const evt_graph *g, const evt_group_exec *x) {
  int64_t largest = 0;
  evt_sbuf_printf(b, ", \"nodes\": [");
  for (int k = 0; k < x->nmembers; k++) {
    const evt_node *n = &g->nodes[x->members[k]];
    evt_sbuf_printf(b, "%s", k ? ", " : "");
    json_str(b, n->name);
    int64_t numel = evt_type_numel(&n->type);
    if (numel > largest) largest = numel;
  }
  evt_sbuf_printf(b, "], \"out_numel\": %lld", (long long)largest);
}

/* Bytes a fused group's kernel reads and writes at least once: every distinct tensor it binds (A, B, D, the row
 * nucleus inputs and the epilogue's loads and stores): the floor of its memory traffic. */
static int64_t group_io_bytes(const evt_graph *g, const evt_group_exec *x) {
  int nodes[EVT_ROW_LAUNCH_MAX_PTRS + 7], n = 0;
  int cand[EVT_ROW_LAUNCH_MAX_PTRS + 7] = {x->a_node,     x->b_node,     x->d_node,    x->in_node[0],
                                           x->in_node[1], x->in_node[2], x->in_node[3]};
  for (int i = 0; i < EVT_ROW_LAUNCH_MAX_PTRS; i++) cand[7 + i] = x->ptr_node[i];
  int64_t bytes = 0;
  for (int i = 0; i < EVT_ROW_LAUNCH_MAX_PTRS + 7; i++) {
    int v = cand[i], seen = 0;
    for (int j = 0; j < n && !seen; j++) seen = nodes[j] == v;
    if (v < 0 || v >= g->nnodes || seen) continue;
    nodes[n++] = v;
    bytes += tensor_bytes(g, v);
  }
  return bytes;
}

static void report_group(evt_sbuf *b, const evt_graph *g, const evt_exec_plan *xp, int gi) {
  const evt_group_exec *x = &xp->groups[gi];
  evt_sbuf_printf(b, "%s{\"group\": %d, \"kind\": ", gi ? ",\n  " : "\n  ", gi);
  json_str(b, evt_lower_kind_name(x->kind));
  evt_sbuf_printf(b, ", \"path\": \"%s\", \"members\": %d, \"m\": %lld, \"n\": %lld, \"k\": %lld, \"kernel\": ",
                  group_path(x), x->nmembers, (long long)x->m, (long long)x->n, (long long)x->k);
  json_str(b, x->fused && x->kernel >= 0 ? xp->kname[x->kernel] : "");
  evt_sbuf_printf(b, ", \"io_bytes\": %lld, \"why\": ", x->fused ? (long long)group_io_bytes(g, x) : 0LL);
  json_str(b, x->fused ? "" : x->why);
  evt_sbuf_printf(b, ", \"ops\": ");
  member_ops(b, g, x);
  member_nodes(b, g, x);
  if (x->kind == EVT_LK_CONV_EVT) { /* its geometry, as the spec's text: "conv fprop n 4 h 8 ... out 8x8" */
    char geo[160];
    evt_conv_text(&xp->low.k[gi].spec.conv, geo, sizeof geo);
    geo[strcspn(geo, "\n")] = 0;
    evt_sbuf_printf(b, ", \"conv\": ");
    json_str(b, geo);
  }
  evt_sbuf_printf(b, "}");
}

/* Kernel launches of one step: a generated kernel or a cuBLAS call per fused group (two for cuBLAS + a row
 * kernel), one per member of a group that runs node by node. */
static int plan_kernels(const evt_exec_plan *xp) {
  int n = 0;
  for (int gi = 0; gi < xp->ngroups; gi++) {
    const evt_group_exec *x = &xp->groups[gi];
    n += !x->fused ? x->nmembers : x->unf ? 2 : 1;
  }
  return n;
}

/* "dot": the grouped graph as Graphviz text (evtc partition --dot's drawing), for a picture of the plan. */
static void plan_dot(evt_sbuf *b, const evt_graph *g, const evt_part_plan *part) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  if (!f) evt_fatal(__FILE__, __LINE__, "out of memory");
  evt_part_plan_dot(g, part, f);
  fclose(f);
  evt_sbuf_printf(b, " \"dot\": ");
  json_str(b, text);
  free(text);
}

/* The JSON of a created program's plan (evt.h: evt_plan_report's format); dot: with the Graphviz text. */
static char *program_json(const evt_program *p, bool dot) {
  const evt_exec_plan *xp = p->xp;
  const evt_graph *g = p->g;
  evt_plan plan;
  memset(&plan, 0, sizeof plan);
  bool planned = evt_plan_build(g, &xp->part, &xp->low, &plan) == EVT_OK;
  int64_t unf_kernels, unf_bytes;
  unfused_cost(g, &unf_kernels, &unf_bytes);
  evt_sbuf b = {0};
  evt_sbuf_printf(&b, "{\"nodes\": %d, \"groups\": [", g->nnodes);
  for (int gi = 0; gi < xp->ngroups; gi++) report_group(&b, g, xp, gi);
  evt_sbuf_printf(&b, "],\n \"kernels\": %d, \"bytes\": %lld, \"unfused_kernels\": %lld, \"unfused_bytes\": %lld,\n",
                  plan_kernels(xp), planned ? (long long)plan.global_bytes : -1LL, (long long)unf_kernels,
                  (long long)unf_bytes);
  evt_sbuf_printf(&b, " \"arena_bytes\": %lld, \"scratch_bytes\": %lld", (long long)p->arena_bytes,
                  (long long)xp->scratch_bytes);
  if (dot) {
    evt_sbuf_printf(&b, ",\n");
    plan_dot(&b, g, &xp->part);
  }
  evt_sbuf_printf(&b, "}\n");
  if (planned) evt_plan_free(&plan);
  return b.p;
}

char *evt_plan_report(evt_graph *g, const evt_options *o) {
  if (!g) return NULL;
  evt_options opts;
  if (o) opts = *o;
  else evt_options_init(&opts);
  opts.flags = (opts.flags | EVT_PROGRAM_FUSED) & ~(unsigned)EVT_PROGRAM_CUDA_GRAPH;
  evt_program *p = NULL;
  if (evt_program_create_host_opts(g, &opts, &p) != EVT_OK) return NULL;
  char *json = program_json(p, true);
  evt_program_destroy(p);
  return json;
}

char *evt_program_report(const evt_program *p) { return p && p->xp ? program_json(p, false) : NULL; }
