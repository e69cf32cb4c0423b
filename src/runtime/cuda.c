/* The GPU runtime's launches and `evtc run`'s host wrapper (contract: cuda.h). Loads build/libevt_fallback.so
 * with dlopen; the library owns every CUDA call of the node-by-node path, the generated kernels their own. */
#include "runtime/cuda.h"

#include <dlfcn.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- the library: loaded once per process ---------------------------------------------------------- */

static void *open_library(char *why, size_t n) {
  const char *env = getenv("EVT_FALLBACK_LIB");
  if (env && *env) {
    void *h = dlopen(env, RTLD_NOW | RTLD_LOCAL);
    if (!h) snprintf(why, n, "%s", dlerror());
    return h;
  }
  char exe[PATH_MAX];
  ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (len > 0) {
    exe[len] = '\0';
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/libevt_fallback.so", dirname(exe));
    if (access(path, F_OK) == 0) {
      void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
      if (!h) snprintf(why, n, "%s", dlerror());
      return h;
    }
  }
  void *h = dlopen("libevt_fallback.so", RTLD_NOW | RTLD_LOCAL);
  if (!h) snprintf(why, n, "libevt_fallback.so not found (build it with `make cuda`): %s", dlerror());
  return h;
}

static bool load_api(void *lib, evt_fb_api *a) {
#define SYM(field, name) *(void **)(&a->field) = dlsym(lib, name)
  SYM(init, "evt_fb_init");
  SYM(ctx_new, "evt_fb_ctx_new");
  SYM(ctx_free, "evt_fb_ctx_free");
  SYM(alloc, "evt_fb_alloc");
  SYM(free_, "evt_fb_free");
  SYM(reserve, "evt_fb_reserve");
  SYM(run, "evt_fb_run");
  SYM(launches, "evt_fb_launches");
  SYM(upload, "evt_fb_upload");
  SYM(download, "evt_fb_download");
  SYM(copy, "evt_fb_copy");
  SYM(sync, "evt_fb_sync");
  SYM(stream_new, "evt_fb_stream_new");
  SYM(stream_free, "evt_fb_stream_free");
  SYM(capture_begin, "evt_fb_capture_begin");
  SYM(capture_end, "evt_fb_capture_end");
  SYM(graph_launch, "evt_fb_graph_launch");
  SYM(graph_free, "evt_fb_graph_free");
  SYM(event_new, "evt_fb_event_new");
  SYM(event_record, "evt_fb_event_record");
  SYM(event_ms, "evt_fb_event_ms");
  SYM(event_free, "evt_fb_event_free");
  SYM(stream_capturing, "evt_fb_stream_capturing");
  SYM(gemm, "evt_fb_gemm_run");
  SYM(sgd, "evt_fb_sgd");
  SYM(rng_step, "evt_fb_rng_step");
#undef SYM
  void *const *f = (void *const *)a;
  for (size_t i = 0; i < sizeof *a / sizeof(void *); i++)
    if (!f[i]) return false;
  return true;
}

/* The library stays loaded for the life of the process (no dlclose): the CUDA runtime does not support
 * being unloaded, and unloading drops the only reference to its C++ runtime's allocations, which
 * LeakSanitizer then reports. A failed load is retried by the next call (the environment may change). */
const evt_fb_api *evt_gpu_library(char *why, size_t n) {
  static evt_fb_api api;
  static bool ready;
  if (ready) return &api;
  char reason[512] = "";
  void *lib = open_library(reason, sizeof reason);
  if (!lib) {
    snprintf(why, n, "no CUDA device: cannot load the CUDA kernel library (%s)", reason);
    return NULL;
  }
  evt_fb_api a;
  memset(&a, 0, sizeof a);
  if (!load_api(lib, &a)) {
    snprintf(why, n, "no CUDA device: the CUDA kernel library lacks an evt_fb_* entry (rebuild it with `make cuda`)");
    return NULL;
  }
  if (a.init(reason, sizeof reason)) {
    snprintf(why, n, "no CUDA device: %s", reason);
    return NULL;
  }
  api = a;
  ready = true;
  return &api;
}

/* ---- launches ---------------------------------------------------------------------------------------- */

static void copy_attrs(const evt_attrs *s, evt_fb_attrs *d) {
  memset(d, 0, sizeof *d);
  d->ndims = s->dims.n;
  for (int i = 0; i < s->dims.n && i < EVT_FB_MAX_RANK; i++) d->dims[i] = s->dims.v[i];
  d->dim = s->dim;
  d->keepdim = s->keepdim;
  d->start = s->start;
  d->end = s->end;
  d->step = s->step;
  d->value = s->value;
  d->eps = s->eps;
  d->p = s->p;
  d->scale = s->scale;
  d->seed = s->seed;
  d->offset = s->offset;
  d->ignore_index = s->ignore_index;
  d->reduction = s->reduction == EVT_REDUCTION_NONE ? 0 : s->reduction == EVT_REDUCTION_MEAN ? 1 : 2;
  d->approx_tanh = s->approximate == EVT_APPROXIMATE_TANH;
  d->nhwc = s->layout == EVT_LAYOUT_NHWC;
  d->causal = s->causal != 0;
  const evt_ilist *l2[4] = {&s->stride, &s->padding, &s->dilation, &s->kernel};
  int64_t *o2[4] = {d->stride, d->padding, d->dilation, d->kernel};
  for (int k = 0; k < 4; k++) {
    o2[k][0] = l2[k]->n > 0 ? l2[k]->v[0] : 0;
    o2[k][1] = l2[k]->n > 1 ? l2[k]->v[1] : o2[k][0];
  }
  d->groups = s->groups;
}

/* Attention gradients (inputs dout, q, k, v): bit 1 q, 2 k, 4 v; 0 for any other op. */
static int sdpa_bit(evt_op op) {
  return op == EVT_OP_SDPA_BACKWARD_Q ? 1 : op == EVT_OP_SDPA_BACKWARD_K ? 2 : op == EVT_OP_SDPA_BACKWARD_V ? 4 : 0;
}

/* Whether gradient node o belongs to attention node n (the forward, or another gradient): the same q, k, v,
 * the same dout when n is a gradient too, the same attributes. */
static bool sdpa_sibling(const evt_node *n, const evt_node *o) {
  if (!sdpa_bit(o->op) || o->attr.causal != n->attr.causal || o->attr.scale != n->attr.scale) return false;
  const int *qkv = n->op == EVT_OP_SDPA ? n->inputs : n->inputs + 1;
  if (n->op != EVT_OP_SDPA && o->inputs[0] != n->inputs[0]) return false;
  return o->inputs[1] == qkv[0] && o->inputs[2] == qkv[1] && o->inputs[3] == qkv[2];
}

void evt_gpu_fb_node(const evt_program *p, int i, evt_fb_node *fn) {
  const evt_node *n = &p->g->nodes[i];
  memset(fn, 0, sizeof *fn);
  fn->id = i;
  fn->op = (int)n->op;
  fn->ninputs = n->ninputs;
  for (int j = 0; j < n->ninputs && j < EVT_FB_MAX_IN; j++) fn->in[j] = p->t[n->inputs[j]];
  fn->out = p->t[i];
  copy_attrs(&n->attr, &fn->a);
  fn->a.rng_step = p->rng_dev;
  /* attention: the gradients computed from the same (dout, q, k, v), or for the forward, those of its q, k, v */
  if (n->op == EVT_OP_SDPA || sdpa_bit(n->op))
    for (int j = 0; j < p->g->nnodes; j++)
      if (sdpa_sibling(n, &p->g->nodes[j])) fn->a.sdpa_siblings |= sdpa_bit(p->g->nodes[j].op);
}

evt_status evt_gpu_launch_node(evt_program *p, int i, void *stream) {
  char err[512];
  evt_fb_node fn;
  evt_gpu_fb_node(p, i, &fn);
  int rc = p->api->run(p->ctx, &fn, stream, err, sizeof err);
  if (rc == 1) return evt_graph_errorf(p->g, i, EVT_ERR_UNSUPPORTED, "not supported on CUDA: %s", err);
  if (rc) return evt_graph_errorf(p->g, i, EVT_ERR_INTERNAL, "CUDA error: %s", err);
  return EVT_OK;
}

static void *dev(const evt_program *p, int node) { return node >= 0 ? p->t[node].ptr : NULL; }
static void *node_ptr(void *p, int node) {
  return node == EVT_EXEC_PTR_RNG ? (void *)((const evt_program *)p)->rng_dev : dev(p, node);
}

_Static_assert(EVT_FB_F32 == (int)EVT_F32 && EVT_FB_F16 == (int)EVT_F16 && EVT_FB_BF16 == (int)EVT_BF16,
               "the kernel library's dtype codes are evt_dtype's");

/* Group gi's GEMM as one call of the kernel library's cuBLAS entry, into d (d_dtype): the spec's layout
 * becomes the operands' transposes, leading dims and batch strides are the lowering's (0: packed), and
 * cuBLASLt adds the bias node x->unf_bias when there is one. `what` names the path in errors. */
static evt_status library_gemm(evt_program *p, int gi, void *d, int d_dtype, const char *what, void *stream) {
  const evt_group_exec *x = &p->xp->groups[gi];
  const evt_lowered *L = &p->xp->low.k[gi];
  const evt_kspec *s = &L->spec;
  evt_fb_gemm g;
  memset(&g, 0, sizeof g);
  g.ta = s->layout == EVT_LAYOUT_TN;
  g.tb = s->layout == EVT_LAYOUT_NT;
  g.ab_dtype = (int)s->ab_dtype;
  g.d_dtype = d_dtype;
  g.m = x->m, g.n = x->n, g.k = x->k;
  g.a = dev(p, x->a_node);
  g.b = dev(p, x->b_node);
  g.d = d;
  g.lda = L->lda ? L->lda : g.ta ? g.m : g.k;
  g.ldb = L->ldb ? L->ldb : g.tb ? g.k : g.n;
  g.ldd = L->ldd ? L->ldd : g.n;
  g.batch = s->batched && L->l > 1 ? L->l : 1;
  g.sa = s->batched ? L->bs_a : 0, g.sb = s->batched ? L->bs_b : 0, g.sd = s->batched ? L->bs_d : 0;
  g.bias = x->unf_bias >= 0 ? dev(p, x->unf_bias) : NULL;
  if (!g.a || !g.b || !g.d || (x->unf_bias >= 0 && !g.bias))
    return evt_graph_errorf(p->g, x->members[0], EVT_ERR_INTERNAL, "group %d: %s GEMM without memory for an operand", gi,
                            what);
  char err[512];
  int rc = p->api->gemm(p->ctx, &g, stream, err, sizeof err);
  if (rc)
    return evt_graph_errorf(p->g, x->members[0], rc == 1 ? EVT_ERR_UNSUPPORTED : EVT_ERR_INTERNAL,
                            "group %d (%s GEMM %lldx%lldx%lld through cuBLAS): %s", gi, what, (long long)g.m,
                            (long long)g.n, (long long)g.k, err);
  return EVT_OK;
}

/* A GEMM group run as one cuBLAS call (x->blas; exec_plan.h): a plain epilogue, or D = acc + bias. */
static evt_status launch_blas(evt_program *p, int gi, void *stream) {
  const evt_group_exec *x = &p->xp->groups[gi];
  return library_gemm(p, gi, dev(p, x->d_node), (int)p->xp->low.k[gi].spec.d_dtype, "plain", stream);
}

/* An unf GEMM group (exec_plan.h): cuBLAS(Lt) into T in the scratch, then its row kernel. */
static evt_status launch_unfused(evt_program *p, int gi, void *stream) {
  const evt_group_exec *x = &p->xp->groups[gi];
  void *t = p->gemm_scratch ? (char *)p->gemm_scratch + p->xp->t_offset : NULL;
  evt_status st = library_gemm(p, gi, t, (int)p->xp->low.k[gi].spec.ab_dtype, "unfused", stream);
  if (st != EVT_OK) return st;
  evt_row_launch_args a;
  memset(&a, 0, sizeof a);
  a.m = (int)x->m;
  a.n = (int)x->n;
  for (int i = 0; i < EVT_ROW_LAUNCH_MAX_PTRS; i++) a.ptrs[i] = x->rptr[i] == EVT_EXEC_PTR_T ? t : dev(p, x->rptr[i]);
  a.stream = stream;
  a.rng_step = p->rng_dev;
  int rc = p->kfn[x->kernel](&a);
  if (rc != EVT_LAUNCH_OK)
    return evt_graph_errorf(p->g, x->members[0], EVT_ERR_INTERNAL, "group %d: generated kernel %s (unfused epilogue) returned %d",
                            gi, p->xp->kname[x->kernel], rc);
  return EVT_OK;
}

evt_status evt_gpu_launch_group(evt_program *p, int gi, void *stream) {
  const evt_group_exec *x = &p->xp->groups[gi];
  if (x->fused && x->blas) return launch_blas(p, gi, stream);
  if (x->fused && x->unf) return launch_unfused(p, gi, stream);
  if (!x->fused) {
    for (int k = 0; k < x->nmembers; k++) {
      evt_status st = evt_gpu_launch_node(p, x->members[k], stream);
      if (st != EVT_OK) return st;
    }
    return EVT_OK;
  }
  if (x->kind == EVT_LK_GEMM_EVT) {
    if (!evt_gemm_group_run(p->gk, p->xp, gi, node_ptr, p, p->gemm_scratch, stream)) p->replan = true;
    return EVT_OK;
  }
  evt_row_launch_args a;
  memset(&a, 0, sizeof a);
  a.m = (int)x->m;
  a.n = (int)x->n;
  for (int k = 0; k < 3; k++) a.in[k] = dev(p, x->in_node[k]);
  for (int i = 0; i < EVT_ROW_LAUNCH_MAX_PTRS; i++) a.ptrs[i] = dev(p, x->ptr_node[i]);
  a.stream = stream;
  a.rng_step = p->rng_dev;
  int rc = p->kfn[x->kernel](&a);
  if (rc != EVT_LAUNCH_OK)
    return evt_graph_errorf(p->g, x->members[0], EVT_ERR_INTERNAL, "group %d: generated kernel %s returned %d", gi,
                            p->xp->kname[x->kernel], rc);
  return EVT_OK;
}

int evt_gpu_group_launches(const evt_program *p, int gi) {
  const evt_group_exec *x = &p->xp->groups[gi];
  if (x->blas) return 0; /* one cuBLAS call: the library's launch count has it */
  const evt_rspec *s = p->xp->kspec[x->kernel];
  if ((x->kind == EVT_LK_GEMM_EVT && !x->unf) || !s) return 1; /* the CUTLASS kernel */
  for (int i = 0; i < s->nnodes; i++)
    if (s->nodes[i].op == EVT_V_ROW_SUM) return 2; /* the row kernel, then the deterministic row-sum finalize */
  return 1;
}

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

static evt_status open_impl(evt_graph *g, unsigned flags, evt_cuda **out) {
  *out = NULL;
  evt_cuda *c = calloc(1, sizeof *c);
  if (!c) return evt_graph_errorf_at(g, (evt_origin){0}, EVT_ERR_INTERNAL, "out of memory");
  evt_status st = evt_program_create(g, flags | EVT_PROGRAM_NO_OPT, &c->p);
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

evt_status evt_cuda_open_flags(evt_graph *g, unsigned flags, evt_cuda **out) { return open_impl(g, flags, out); }
evt_status evt_cuda_open(evt_graph *g, evt_cuda **out) { return open_impl(g, 0, out); }
evt_status evt_cuda_open_fused(evt_graph *g, evt_cuda **out) { return open_impl(g, EVT_PROGRAM_FUSED, out); }

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
  if (st == EVT_OK) st = run_timed(c, g, evt_train_param_count(g) > 0 ? lr : -1);
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
