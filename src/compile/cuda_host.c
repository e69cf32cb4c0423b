/* `evtc run --device cuda`: the interpreter's double host tensors over a GPU program (contract in compile.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compile/compile.h"

/* ---- evtc run: host doubles over a program ----------------------------------------------------------- */

struct evt_cuda {
  evt_program *p;
  void *stream, *ev0, *ev1;
  void **mem;          /* per node: a device buffer for inputs, params, outputs (else NULL) */
  double last_ms;
  long launched_fused, launched_fallback;
  bool resident; /* evt_cuda_train_step: inputs and params live on the device (uploaded once) */
};

static int64_t node_bytes(const evt_graph *g, int v) {
  return evt_type_numel(&g->nodes[v].type) * (int64_t)evt_dtype_size(g->nodes[v].type.dtype);
}

void evt_cuda_close(evt_cuda *c) {
  if (!c) return;
  const evt_fb_api *api = c->p ? c->p->api : NULL;
  if (api && c->mem)
    for (int i = 0; i < c->p->g->nnodes; i++) api->free_(c->mem[i]);
  if (api) {
    api->event_free(c->ev0);
    api->event_free(c->ev1);
    api->stream_free(c->stream);
  }
  evt_program_destroy(c->p);
  free(c->mem);
  free(c);
}

static evt_status open_impl(evt_graph *g, const evt_options *o, evt_cuda **out) {
  *out = NULL;
  evt_cuda *c = calloc(1, sizeof *c);
  if (!c) return evt_graph_errorf_at(g, (evt_origin){0}, EVT_ERR_INTERNAL, "out of memory");
  evt_options po = *o;
  po.flags |= EVT_PROGRAM_NO_OPT;
  evt_status st = evt_program_create_opts(g, &po, &c->p);
  if (st != EVT_OK) {
    free(c);
    return st;
  }
  char err[512];
  const evt_fb_api *api = c->p->api;
  c->mem = calloc((size_t)g->nnodes + 1, sizeof *c->mem);
  if (!c->mem) evt_fatal(__FILE__, __LINE__, "out of memory");
  if (api->stream_new(&c->stream, err, sizeof err) || api->event_new(&c->ev0, err, sizeof err) ||
      api->event_new(&c->ev1, err, sizeof err)) {
    evt_cuda_close(c);
    return evt_graph_errorf_at(g, (evt_origin){0}, EVT_ERR_INTERNAL, "CUDA: %s", err);
  }
  for (int i = 0; i < g->nnodes && st == EVT_OK; i++) {
    const evt_node *n = &g->nodes[i];
    bool source = n->op == EVT_OP_INPUT || n->op == EVT_OP_PARAM;
    if (!source && !(n->flags & EVT_NODE_OUTPUT)) continue;
    c->mem[i] = api->alloc(node_bytes(g, i), err, sizeof err);
    if (!c->mem[i]) st = evt_graph_errorf(g, i, EVT_ERR_UNSUPPORTED, "%s", err);
    else if (source) st = evt_program_bind(c->p, n->name, c->mem[i]);
  }
  for (int k = 0; k < g->noutputs && st == EVT_OK; k++) st = evt_program_bind_output(c->p, k, c->mem[g->outputs[k]]);
  if (st != EVT_OK) {
    evt_cuda_close(c);
    return st;
  }
  const evt_exec_plan *xp = c->p->xp;
  for (int gi = 0; xp && gi < xp->ngroups; gi++)
    if (!xp->groups[gi].fused)
      fprintf(stderr, "evtc run: warning: group %d (%s) runs node by node: %s\n", gi,
              evt_lower_kind_name(xp->groups[gi].kind), xp->groups[gi].why);
  *out = c;
  return EVT_OK;
}

/* The options of evt_program_create (its defaults, refine_partition 0, no in-step A/B) with these flags. */
static evt_options flag_options(unsigned flags) {
  evt_options o;
  evt_options_init(&o);
  o.flags = flags;
  return o;
}

evt_status evt_cuda_open_opts(evt_graph *g, const evt_options *o, evt_cuda **out) { return open_impl(g, o, out); }
evt_status evt_cuda_open_flags(evt_graph *g, unsigned flags, evt_cuda **out) {
  evt_options o = flag_options(flags);
  return open_impl(g, &o, out);
}
evt_status evt_cuda_open(evt_graph *g, evt_cuda **out) { return evt_cuda_open_flags(g, 0, out); }
evt_status evt_cuda_open_fused(evt_graph *g, evt_cuda **out) { return evt_cuda_open_flags(g, EVT_PROGRAM_FUSED, out); }

double evt_cuda_last_ms(const evt_cuda *c) { return c ? c->last_ms : 0; }
const evt_program *evt_cuda_program(const evt_cuda *c) { return c ? c->p : NULL; }

/* Host values -> the device buffers of the inputs (and the params too when `params`). */
static evt_status upload_sources(evt_cuda *c, evt_graph *g, const evt_tensor *values, bool params) {
  char err[512];
  const evt_fb_api *api = c->p->api;
  for (int i = 0; i < g->nnodes; i++) {
    const evt_node *n = &g->nodes[i];
    if (n->op != EVT_OP_INPUT && !(params && n->op == EVT_OP_PARAM)) continue;
    evt_fb_tensor t = c->p->t[i];
    t.ptr = c->mem[i];
    if (!values[i].data || values[i].numel != t.numel)
      return evt_graph_errorf(g, i, EVT_ERR_INVALID, "no value given for this input");
    if (api->upload(c->p->ctx, &t, values[i].data, c->stream, err, sizeof err))
      return evt_graph_errorf(g, i, EVT_ERR_INTERNAL, "CUDA upload failed: %s", err);
  }
  return EVT_OK;
}

/* The device buffer of node id -> values[id] (allocated here). */
static evt_status download_node(evt_cuda *c, evt_graph *g, evt_tensor *values, int id) {
  char err[512];
  const evt_type *ty = &g->nodes[id].type;
  evt_fb_tensor t = c->p->t[id];
  t.ptr = c->mem[id];
  evt_tensor_free(&values[id]);
  if (evt_tensor_alloc(&values[id], ty->dtype, ty->rank, ty->shape) != EVT_OK)
    return evt_graph_errorf(g, id, EVT_ERR_INTERNAL, "cannot allocate the host copy");
  if (c->p->api->download(c->p->ctx, &t, values[id].data, c->stream, err, sizeof err))
    return evt_graph_errorf(g, id, EVT_ERR_INTERNAL, "CUDA download failed: %s", err);
  return EVT_OK;
}

/* Enqueues the program's run (and, lr >= 0, its SGD step) between the two timing events, waits, and reports
 * a run-time index error; counts the launches. */
static evt_status run_timed(evt_cuda *c, evt_graph *g, double lr) {
  char err[512];
  const evt_fb_api *api = c->p->api;
  if (api->event_record(c->ev0, c->stream, err, sizeof err))
    return evt_graph_errorf_at(g, (evt_origin){0}, EVT_ERR_INTERNAL, "CUDA: %s", err);
  evt_status st = evt_program_run(c->p, c->stream);
  if (st == EVT_OK && lr >= 0) st = evt_program_sgd(c->p, lr, c->stream);
  if (st != EVT_OK) return st;
  if (api->event_record(c->ev1, c->stream, err, sizeof err) || api->event_ms(c->ev0, c->ev1, &c->last_ms, err, sizeof err))
    return evt_graph_errorf_at(g, (evt_origin){0}, EVT_ERR_INTERNAL, "CUDA: %s", err);
  int bad = -1;
  if (api->sync(c->stream, &bad, err, sizeof err)) return evt_graph_errorf_at(g, (evt_origin){0}, EVT_ERR_INTERNAL, "%s", err);
  if (bad >= 0 && bad < g->nnodes)
    return evt_graph_errorf(g, bad, EVT_ERR_INVALID, "an index is out of range (or a CSR rowptr is not monotone) on the GPU");
  if (c->p->xp) {
    int nf = 0, nb = 0;
    evt_exec_plan_counts(c->p->xp, &nf, &nb);
    c->launched_fused += nf;
    c->launched_fallback += nb;
  }
  return EVT_OK;
}

static evt_status download_outputs(evt_cuda *c, evt_graph *g, evt_tensor *values) {
  evt_status st = EVT_OK;
  for (int k = 0; k < g->noutputs && st == EVT_OK; k++) {
    int id = g->outputs[k];
    if (g->nodes[id].op == EVT_OP_INPUT || g->nodes[id].op == EVT_OP_PARAM) continue; /* the caller's slot */
    st = download_node(c, g, values, id);
  }
  return st;
}

evt_status evt_cuda_step(evt_cuda *c, evt_graph *g, evt_tensor *values) {
  if (!c || g != c->p->g) return evt_graph_errorf_at(g, (evt_origin){0}, EVT_ERR_INVALID, "the CUDA runtime was opened for another graph");
  evt_status st = upload_sources(c, g, values, true);
  if (st == EVT_OK) st = run_timed(c, g, -1);
  return st == EVT_OK ? download_outputs(c, g, values) : st;
}

evt_status evt_cuda_train_step(evt_cuda *c, evt_graph *g, evt_tensor *values, double lr, bool all) {
  if (!c || g != c->p->g) return evt_graph_errorf_at(g, (evt_origin){0}, EVT_ERR_INVALID, "the CUDA runtime was opened for another graph");
  if (!(lr >= 0)) return evt_graph_errorf_at(g, (evt_origin){0}, EVT_ERR_INVALID, "the learning rate must be >= 0");
  evt_status st = EVT_OK;
  if (!c->resident) {
    st = upload_sources(c, g, values, true);
    c->resident = st == EVT_OK;
  } else if (all) {
    st = evt_cuda_download_params(c, g, values); /* the params this step reads, for the caller's check */
  }
  /* (a graph without params trains nothing: evt_program_sgd would refuse it for its missing gradient outputs) */
  if (st == EVT_OK) st = run_timed(c, g, evt_graph_float_param_count(g) > 0 ? lr : -1);
  if (st != EVT_OK) return st;
  if (all) return download_outputs(c, g, values);
  return g->loss >= 0 ? download_node(c, g, values, g->loss) : EVT_OK;
}

evt_status evt_cuda_download_params(evt_cuda *c, evt_graph *g, evt_tensor *values) {
  if (!c || g != c->p->g) return evt_graph_errorf_at(g, (evt_origin){0}, EVT_ERR_INVALID, "the CUDA runtime was opened for another graph");
  if (!c->resident) return EVT_OK; /* the host values are the device's */
  evt_status st = EVT_OK;
  for (int i = 0; i < g->nnodes && st == EVT_OK; i++)
    if (g->nodes[i].op == EVT_OP_PARAM) st = download_node(c, g, values, i);
  return st;
}

void evt_cuda_fused_counts(const evt_cuda *c, int *fused, int *fallback, long *launched_fused, long *launched_fallback) {
  *fused = *fallback = 0;
  *launched_fused = c ? c->launched_fused : 0;
  *launched_fallback = c ? c->launched_fallback : 0;
  if (c && c->p->xp) evt_exec_plan_counts(c->p->xp, fused, fallback);
}

void evt_cuda_print_plan(const evt_cuda *c, const evt_graph *g, FILE *out) {
  if (c && c->p->xp) evt_exec_plan_print(g, c->p->xp, out);
}

int evt_cuda_ab_groups(const evt_cuda *c) { return c && c->p->xp ? c->p->xp->nab : 0; }

double evt_cuda_rel_error(const evt_tensor *gpu, const evt_tensor *cpu, double floor_) {
  if (!gpu->data || !cpu->data || gpu->numel != cpu->numel) return INFINITY;
  double maxabs = 0, maxdiff = 0;
  for (int64_t i = 0; i < cpu->numel; i++) {
    double a = gpu->data[i], b = cpu->data[i];
    if (isnan(a) || isnan(b)) return INFINITY;
    if (isinf(a) || isinf(b)) {
      if (a != b) return INFINITY;
      continue;
    }
    if (fabs(b) > maxabs) maxabs = fabs(b);
    if (fabs(a - b) > maxdiff) maxdiff = fabs(a - b);
  }
  if (floor_ > maxabs) maxabs = floor_;
  return maxdiff == 0 ? 0 : maxdiff / (maxabs > 0 ? maxabs : 1e-300);
}
