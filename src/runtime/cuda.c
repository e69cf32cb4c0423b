/* The CUDA runtime (contract: cuda.h). Loads build/libevt_fallback.so with dlopen and drives it node by
 * node; the library owns every CUDA call. */
#include "runtime/cuda.h"

#include "evt_fallback.h"
#include "evt_row_launch.h"
#include "runtime/exec_plan.h"
#include "runtime/gemm_launch.h"
#include "runtime/jit.h"

#include <dlfcn.h>
#include <math.h>
#include <libgen.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct fb_api {
  int (*init)(char *, size_t);
  void *(*alloc)(int64_t, char *, size_t);
  void (*free_)(void *);
  int (*upload)(const evt_fb_tensor *, const double *, char *, size_t);
  int (*download)(const evt_fb_tensor *, double *, char *, size_t);
  int (*run)(const evt_fb_node *, char *, size_t);
  int (*sync)(int *, char *, size_t);
  int (*dtype_bytes)(int);
} fb_api;

struct evt_cuda {
  void *lib;
  fb_api api;
  char *arena;            /* device memory */
  int64_t arena_bytes;
  int nnodes;
  evt_fb_tensor *t;       /* per node: its device tensor */
  /* --fused (evt_cuda_open_fused): the plan, one shared object and entry per distinct kernel */
  evt_exec_plan *xp;
  void **so;
  int (**kfn)(const evt_row_launch_args *);
  evt_gemm_kernels *gk;   /* GEMM+EVT kernels (src/runtime/gemm_launch.h) */
  void *scratch;          /* xp->scratch_bytes of device memory for D tiles nobody reads */
  long launches_fused, launches_fallback; /* group executions so far, by path */
};

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

static bool load_api(void *lib, fb_api *a) {
#define SYM(field, name) *(void **)(&a->field) = dlsym(lib, name)
  SYM(init, "evt_fb_init");
  SYM(alloc, "evt_fb_alloc");
  SYM(free_, "evt_fb_free");
  SYM(upload, "evt_fb_upload");
  SYM(download, "evt_fb_download");
  SYM(run, "evt_fb_run");
  SYM(sync, "evt_fb_sync");
  SYM(dtype_bytes, "evt_fb_dtype_bytes");
#undef SYM
  return a->init && a->alloc && a->free_ && a->upload && a->download && a->run && a->sync && a->dtype_bytes;
}

static evt_status global_error(evt_graph *g, evt_status st, const char *msg) {
  return evt_graph_errorf_at(g, (evt_origin){0}, st, "%s", msg);
}

void evt_cuda_close(evt_cuda *c) {
  if (!c) return;
  if (c->arena) c->api.free_(c->arena);
  if (c->scratch) c->api.free_(c->scratch);
  evt_gemm_kernels_free(c->gk);
  /* Loaded libraries stay loaded for the life of the process (no dlclose): the CUDA runtime does not
   * support being unloaded, and unloading drops the only reference to their C++ runtime's allocations,
   * which LeakSanitizer then reports. dlopen of the same path again returns the same handle. */
  if (c->xp) {
    evt_exec_plan_free(c->xp);
    free(c->xp);
  }
  free(c->so);
  free(c->kfn);
  free(c->t);
  free(c);
}

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

/* ---- the arena: lifetimes in node order, first fit by address, largest buffers first -------------- */

static int64_t slot_bytes(const evt_node *n) {
  static const int64_t size[EVT_DTYPE_COUNT] = {[EVT_F32] = 4, [EVT_F16] = 2, [EVT_BF16] = 2, [EVT_I64] = 8,
                                                 [EVT_I32] = 4, [EVT_BOOL] = 1};
  int64_t numel = 1;
  for (int d = 0; d < n->type.rank; d++) numel *= n->type.shape[d];
  int64_t b = numel * size[n->type.dtype];
  return (b > 0 ? b + 255 : 256) / 256 * 256;
}

typedef struct slot {
  int id;
  int64_t bytes;
  int first, last;
} slot;

static int by_size_desc(const void *a, const void *b) {
  const slot *x = a, *y = b;
  if (x->bytes != y->bytes) return x->bytes > y->bytes ? -1 : 1;
  return x->id - y->id;
}

static int by_offset(const void *a, const void *b) {
  const int64_t *x = a, *y = b;
  return x[0] < y[0] ? -1 : x[0] > y[0];
}

int64_t evt_cuda_arena_layout(const evt_graph *g, int64_t *offsets, int64_t *naive) {
  int n = g->nnodes;
  slot *s = malloc(sizeof(slot) * (size_t)(n > 0 ? n : 1));
  int64_t(*busy)[2] = malloc(sizeof(*busy) * (size_t)(n > 0 ? n : 1));
  if (!s || !busy) {
    free(s);
    free(busy);
    return -1;
  }
  int64_t total = 0;
  for (int i = 0; i < n; i++) {
    const evt_node *nd = &g->nodes[i];
    bool whole = nd->op == EVT_OP_INPUT || nd->op == EVT_OP_PARAM || (nd->flags & EVT_NODE_OUTPUT);
    s[i] = (slot){.id = i, .bytes = slot_bytes(nd), .first = whole ? -1 : i, .last = whole ? n : i};
    total += s[i].bytes;
  }
  for (int i = 0; i < n; i++)
    for (int j = 0; j < g->nodes[i].ninputs; j++) {
      slot *p = &s[g->nodes[i].inputs[j]];
      if (p->last < i) p->last = i;
    }
  qsort(s, (size_t)n, sizeof *s, by_size_desc);
  int64_t top = 0;
  for (int k = 0; k < n; k++) {
    int nb = 0;
    for (int q = 0; q < k; q++) /* placed buffers alive at the same time */
      if (s[q].first <= s[k].last && s[k].first <= s[q].last) {
        busy[nb][0] = offsets[s[q].id];
        busy[nb][1] = offsets[s[q].id] + s[q].bytes;
        nb++;
      }
    qsort(busy, (size_t)nb, sizeof *busy, by_offset);
    int64_t at = 0;
    for (int q = 0; q < nb; q++) {
      if (busy[q][0] >= at + s[k].bytes) break;
      if (busy[q][1] > at) at = busy[q][1];
    }
    offsets[s[k].id] = at;
    if (at + s[k].bytes > top) top = at + s[k].bytes;
  }
  free(s);
  free(busy);
  if (naive) *naive = total;
  return top;
}

static evt_status open_impl(evt_graph *g, bool reuse, evt_cuda **out) {
  *out = NULL;
  char why[512] = "";
  evt_cuda *c = calloc(1, sizeof *c);
  if (!c) return global_error(g, EVT_ERR_INTERNAL, "out of memory");
  c->lib = open_library(why, sizeof why);
  if (!c->lib) {
    char msg[700];
    snprintf(msg, sizeof msg, "no CUDA device: cannot load the CUDA kernel library (%s)", why);
    evt_cuda_close(c);
    return global_error(g, EVT_ERR_UNSUPPORTED, msg);
  }
  if (!load_api(c->lib, &c->api)) {
    evt_cuda_close(c);
    return global_error(g, EVT_ERR_UNSUPPORTED, "no CUDA device: libevt_fallback.so lacks the evt_fb_* entries");
  }
  if (c->api.init(why, sizeof why)) {
    char msg[700];
    snprintf(msg, sizeof msg, "no CUDA device: %s", why);
    evt_cuda_close(c);
    return global_error(g, EVT_ERR_UNSUPPORTED, msg);
  }
  c->nnodes = g->nnodes;
  c->t = calloc((size_t)(g->nnodes > 0 ? g->nnodes : 1), sizeof *c->t);
  if (!c->t) {
    evt_cuda_close(c);
    return global_error(g, EVT_ERR_INTERNAL, "out of memory");
  }
  int64_t *offs = malloc(sizeof(int64_t) * (size_t)(g->nnodes > 0 ? g->nnodes : 1));
  if (!offs) {
    evt_cuda_close(c);
    return global_error(g, EVT_ERR_INTERNAL, "out of memory");
  }
  for (int i = 0; i < g->nnodes; i++) {
    const evt_type *ty = &g->nodes[i].type;
    evt_fb_tensor *t = &c->t[i];
    t->dtype = (int)ty->dtype;
    t->rank = ty->rank;
    t->numel = 1;
    for (int d = 0; d < ty->rank; d++) {
      t->shape[d] = ty->shape[d];
      t->numel *= ty->shape[d];
    }
  }
  int64_t off = 0;
  if (reuse) {
    off = evt_cuda_arena_layout(g, offs, NULL);
  } else { /* groups run out of node order: every node its own bytes */
    for (int i = 0; i < g->nnodes; i++) {
      offs[i] = off;
      off += slot_bytes(&g->nodes[i]);
    }
  }
  if (off < 0) {
    free(offs);
    evt_cuda_close(c);
    return global_error(g, EVT_ERR_INTERNAL, "out of memory");
  }
  c->arena_bytes = off;
  c->arena = c->api.alloc(off, why, sizeof why);
  if (!c->arena) {
    free(offs);
    evt_cuda_close(c);
    return global_error(g, EVT_ERR_UNSUPPORTED, why);
  }
  for (int i = 0; i < g->nnodes; i++) c->t[i].ptr = c->arena + offs[i];
  free(offs);
  *out = c;
  return EVT_OK;
}

evt_status evt_cuda_open(evt_graph *g, evt_cuda **out) { return open_impl(g, true, out); }

/* Enqueues node i on the fallback library. */
static evt_status run_node(evt_cuda *c, evt_graph *g, int i) {
  char err[512];
  const evt_node *n = &g->nodes[i];
  evt_fb_node fn;
  memset(&fn, 0, sizeof fn);
  fn.id = i;
  fn.op = (int)n->op;
  fn.ninputs = n->ninputs;
  for (int j = 0; j < n->ninputs && j < EVT_FB_MAX_IN; j++) fn.in[j] = c->t[n->inputs[j]];
  fn.out = c->t[i];
  copy_attrs(&n->attr, &fn.a);
  int rc = c->api.run(&fn, err, sizeof err);
  if (rc == 1) return evt_graph_errorf(g, i, EVT_ERR_UNSUPPORTED, "not supported on CUDA: %s", err);
  if (rc) return evt_graph_errorf(g, i, EVT_ERR_INTERNAL, "CUDA error: %s", err);
  return EVT_OK;
}

evt_status evt_cuda_open_fused(evt_graph *g, evt_cuda **out) {
  evt_status st = open_impl(g, false, out);
  if (st != EVT_OK) return st;
  evt_cuda *c = *out;
  c->xp = calloc(1, sizeof *c->xp);
  if (!c->xp) evt_fatal(__FILE__, __LINE__, "out of memory");
  st = evt_exec_plan_build(g, c->xp);
  if (st != EVT_OK) {
    free(c->xp);
    c->xp = NULL;
    evt_cuda_close(c);
    *out = NULL;
    return st;
  }
  evt_exec_plan *p = c->xp;
  int nk = p->nkernels;
  c->so = calloc((size_t)nk + 1, sizeof *c->so);
  c->kfn = calloc((size_t)nk + 1, sizeof *c->kfn);
  evt_jit_job *jobs = calloc((size_t)nk + 1, sizeof *jobs);
  char **src = calloc((size_t)nk + 1, sizeof *src);
  if (!c->so || !c->kfn || !jobs || !src) evt_fatal(__FILE__, __LINE__, "out of memory");
  char msg[1024];
  int njobs = 0, *job_of = calloc((size_t)nk + 1, sizeof *job_of);
  if (!job_of) evt_fatal(__FILE__, __LINE__, "out of memory");
  for (int k = 0; k < nk; k++) {
    job_of[k] = -1;
    if (!p->kspec[k]) continue; /* a GEMM+EVT kernel: gemm_launch.c */
    src[k] = evt_emit_rows(p->kspec[k], msg, sizeof msg);
    if (!src[k]) {
      evt_exec_plan_demote(p, k, msg);
      continue;
    }
    jobs[njobs].name = p->kname[k];
    jobs[njobs].source = src[k];
    job_of[k] = njobs++;
  }
  evt_jit_options jo = {0};
  jo.no_cutlass = 1;
  evt_status js = njobs ? evt_jit_compile(jobs, njobs, &jo, msg, sizeof msg) : EVT_OK;
  for (int k = 0; k < nk; k++) {
    int j = job_of[k];
    if (j < 0) continue;
    if (js != EVT_OK && js != EVT_ERR_INVALID) { /* no nvcc at all */
      evt_exec_plan_demote(p, k, msg);
      continue;
    }
    if (!jobs[j].ok) {
      evt_exec_plan_demote(p, k, jobs[j].error[0] ? jobs[j].error : "failed to compile");
      continue;
    }
    c->so[k] = dlopen(jobs[j].so_path, RTLD_NOW | RTLD_LOCAL);
    if (c->so[k]) *(void **)(&c->kfn[k]) = dlsym(c->so[k], p->kname[k]);
    if (!c->so[k] || !c->kfn[k]) {
      char why[600];
      snprintf(why, sizeof why, "cannot load %.300s: %.250s", jobs[j].so_path, dlerror());
      evt_exec_plan_demote(p, k, why);
    }
  }
  for (int k = 0; k < nk; k++) free(src[k]);
  free(src);
  free(jobs);
  free(job_of);
  c->gk = evt_gemm_kernels_load(p);
  if (p->scratch_bytes > 0 && !(c->scratch = c->api.alloc(p->scratch_bytes, msg, sizeof msg))) {
    evt_cuda_close(c);
    *out = NULL;
    return global_error(g, EVT_ERR_UNSUPPORTED, msg);
  }
  for (int gi = 0; gi < p->ngroups; gi++)
    if (!p->groups[gi].fused)
      fprintf(stderr, "evtc run: warning: group %d (%s) runs node by node: %s\n", gi,
              evt_lower_kind_name(p->groups[gi].kind), p->groups[gi].why);
  return EVT_OK;
}

void evt_cuda_fused_counts(const evt_cuda *c, int *fused, int *fallback, long *launched_fused, long *launched_fallback) {
  *fused = *fallback = 0;
  *launched_fused = c ? c->launches_fused : 0;
  *launched_fallback = c ? c->launches_fallback : 0;
  if (c && c->xp) evt_exec_plan_counts(c->xp, fused, fallback);
}

void evt_cuda_print_plan(const evt_cuda *c, const evt_graph *g, FILE *out) {
  if (c && c->xp) evt_exec_plan_print(g, c->xp, out);
}

static void *node_ptr(void *ctx, int v) { return ((evt_cuda *)ctx)->t[v].ptr; }

/* One fused step after the upload: sources, then every group on its path. */
static evt_status fused_groups(evt_cuda *c, evt_graph *g) {
  evt_exec_plan *p = c->xp;
  evt_status st = EVT_OK;
  for (int k = 0; k < p->nsources && st == EVT_OK; k++) st = run_node(c, g, p->sources[k]);
  for (int gi = 0; gi < p->ngroups && st == EVT_OK; gi++) {
    const evt_group_exec *x = &p->groups[gi];
    if (x->fused && x->kind == EVT_LK_GEMM_EVT && evt_gemm_group_run(c->gk, p, gi, node_ptr, c, c->scratch, NULL)) {
      c->launches_fused++;
      continue;
    }
    if (!x->fused) {
      for (int k = 0; k < x->nmembers && st == EVT_OK; k++) st = run_node(c, g, x->members[k]);
      c->launches_fallback++;
      continue;
    }
    evt_row_launch_args a;
    memset(&a, 0, sizeof a);
    a.m = (int)x->m;
    a.n = (int)x->n;
    for (int k = 0; k < 3; k++) a.in[k] = x->in_node[k] >= 0 ? c->t[x->in_node[k]].ptr : NULL;
    for (int i = 0; i < EVT_ROW_LAUNCH_MAX_PTRS; i++) a.ptrs[i] = x->ptr_node[i] >= 0 ? c->t[x->ptr_node[i]].ptr : NULL;
    int rc = c->kfn[x->kernel](&a);
    if (rc != EVT_LAUNCH_OK)
      return evt_graph_errorf(g, x->members[0], EVT_ERR_INTERNAL, "group %d: generated kernel %s returned %d", gi,
                              p->kname[x->kernel], rc);
    c->launches_fused++;
  }
  return st;
}

evt_status evt_cuda_step(evt_cuda *c, evt_graph *g, evt_tensor *values) {
  char err[512];
  if (!c || g->nnodes != c->nnodes) return global_error(g, EVT_ERR_INVALID, "the CUDA runtime was opened for another graph");
  for (int i = 0; i < g->nnodes; i++) {
    const evt_node *n = &g->nodes[i];
    if (n->op != EVT_OP_INPUT && n->op != EVT_OP_PARAM) continue;
    if (!values[i].data || values[i].numel != c->t[i].numel)
      return evt_graph_errorf(g, i, EVT_ERR_INVALID, "no value given for this input");
    if (c->api.upload(&c->t[i], values[i].data, err, sizeof err))
      return evt_graph_errorf(g, i, EVT_ERR_INTERNAL, "CUDA upload failed: %s", err);
  }
  if (c->xp) {
    evt_status st = fused_groups(c, g);
    if (st != EVT_OK) return st;
  } else {
    for (int i = 0; i < g->nnodes; i++) {
      const evt_node *n = &g->nodes[i];
      if (n->op == EVT_OP_INPUT || n->op == EVT_OP_PARAM) continue;
      evt_status st = run_node(c, g, i);
      if (st != EVT_OK) return st;
    }
  }
  int bad = -1;
  if (c->api.sync(&bad, err, sizeof err)) return global_error(g, EVT_ERR_INTERNAL, err);
  if (bad >= 0 && bad < g->nnodes)
    return evt_graph_errorf(g, bad, EVT_ERR_INVALID, "an index is out of range (or a CSR rowptr is not monotone) on the GPU");
  for (int k = 0; k < g->noutputs; k++) {
    int id = g->outputs[k];
    if (g->nodes[id].op == EVT_OP_INPUT || g->nodes[id].op == EVT_OP_PARAM) continue; /* the caller's slot */
    const evt_type *ty = &g->nodes[id].type;
    evt_tensor_free(&values[id]);
    if (evt_tensor_alloc(&values[id], ty->dtype, ty->rank, ty->shape) != EVT_OK)
      return evt_graph_errorf(g, id, EVT_ERR_INTERNAL, "cannot allocate the host copy");
    if (c->api.download(&c->t[id], values[id].data, err, sizeof err))
      return evt_graph_errorf(g, id, EVT_ERR_INTERNAL, "CUDA download failed: %s", err);
  }
  return EVT_OK;
}

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
