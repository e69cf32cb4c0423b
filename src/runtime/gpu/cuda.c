/* The GPU runtime's launches and `evtc run`'s host wrapper (contract: cuda.h). Loads build/libevt_fallback.so
 * with dlopen; the library owns every CUDA call of the node-by-node path, the generated kernels their own. */
#include "runtime/gpu/cuda.h"
#include "util/env.h"

#include <dlfcn.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- the library: loaded once per process ---------------------------------------------------------- */

static void *open_library(char *why, size_t n) {
  const char *env = evt_env(EVT_ENV_FALLBACK_LIB);
  if (env) {
    void *h = dlopen(env, RTLD_NOW | RTLD_LOCAL);
    if (!h) snprintf(why, n, "%s", dlerror());
    return h;
  }
  char beside[PATH_MAX + 32]; /* an installed package: the kernel library beside libevt */
  snprintf(beside, sizeof beside, "%s/libevt_fallback.so", evt_self_dir());
  if (*evt_self_dir() && access(beside, F_OK) == 0) {
    void *h = dlopen(beside, RTLD_NOW | RTLD_LOCAL);
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
  SYM(scratch_need, "evt_fb_scratch_need");
  SYM(bind_scratch, "evt_fb_bind_scratch");
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
  SYM(device_arch, "evt_fb_device_arch");
  SYM(index_flag, "evt_fb_index_flag");
  SYM(csr_reserve, "evt_fb_csr_reserve");
  SYM(csr_transpose, "evt_fb_csr_transpose");
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

int evt_gpu_device_arch(void) {
  static int arch = -1;
  if (arch < 0) {
    char why[600];
    const evt_fb_api *api = evt_gpu_library(why, sizeof why);
    arch = api ? api->device_arch() : 0;
  }
  return arch;
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
  d->rows = s->rows;
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

_Static_assert(EVT_FB_F32 == (int)EVT_F32 && EVT_FB_F16 == (int)EVT_F16 && EVT_FB_BF16 == (int)EVT_BF16 &&
                   EVT_FB_I64 == (int)EVT_I64 && EVT_FB_I32 == (int)EVT_I32 && EVT_FB_BOOL == (int)EVT_BOOL &&
                   EVT_FB_F8E4M3 == (int)EVT_F8E4M3 && EVT_FB_F8E5M2 == (int)EVT_F8E5M2 &&
                   EVT_FB_F8E5M2 + 1 == (int)EVT_DTYPE_COUNT,
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
  evt_rspec_launch_rng(&p->xp->urs[gi], &a); /* this group's seeds (the kernel may be shared) */
  int rc = p->kfn[x->kernel](&a);
  if (rc != EVT_LAUNCH_OK)
    return evt_graph_errorf(p->g, x->members[0], EVT_ERR_INTERNAL, "group %d: generated kernel %s (unfused epilogue) returned %d",
                            gi, p->xp->kname[x->kernel], rc);
  return EVT_OK;
}

/* A fused spmm_t group's transpose (spmm_t(rowptr, col, val, dy) = A^T dy, A [m, k] with k = the group's rows): the
 * library's arguments for A's rowptr / col (in_node[0..1]). */
static void transpose_args(const evt_program *p, int gi, evt_fb_csr_transpose_args *t) {
  const evt_group_exec *x = &p->xp->groups[gi];
  memset(t, 0, sizeof *t);
  t->node = p->xp->low.k[gi].nucleus;
  t->idx_dtype = (int)p->xp->low.k[gi].rspec.idx_dtype;
  t->m = evt_type_numel(&p->g->nodes[x->in_node[0]].type) - 1;
  t->k = x->m;
  t->nnz = evt_type_numel(&p->g->nodes[x->in_node[1]].type);
  t->rowptr = dev(p, x->in_node[0]);
  t->col = dev(p, x->in_node[1]);
}

static bool is_spmm_t(const evt_program *p, int gi) {
  const evt_group_exec *x = &p->xp->groups[gi];
  return x->fused && x->kind != EVT_LK_GEMM_EVT && !x->unf && x->kernel >= 0 && p->xp->kspec[x->kernel] &&
         p->xp->kspec[x->kernel]->nucleus == EVT_ROWN_SPMM && p->xp->kspec[x->kernel]->has_perm;
}

evt_status evt_gpu_reserve_group(evt_program *p, int gi) {
  if (!is_spmm_t(p, gi)) return EVT_OK;
  evt_fb_csr_transpose_args t;
  transpose_args(p, gi, &t);
  char why[256] = "";
  if (p->api->csr_reserve(p->ctx, &t, why, sizeof why))
    return evt_graph_errorf(p->g, t.node, EVT_ERR_UNSUPPORTED, "group %d: A^T's CSR scratch: %s", gi, why);
  return EVT_OK;
}

/* spmm_t: A^T's CSR built on the device from A's rowptr / col (every run: they may change between steps), enqueued
 * before the row kernel, which reads it with the values through perm (kernels/evt_spmm.cuh). */
static evt_status spmm_t_operand(evt_program *p, int gi, evt_row_launch_args *a, void *stream) {
  evt_fb_csr_transpose_args t;
  transpose_args(p, gi, &t);
  char why[256] = "";
  if (p->api->csr_transpose(p->ctx, &t, stream, why, sizeof why))
    return evt_graph_errorf(p->g, t.node, EVT_ERR_INTERNAL, "group %d: A^T's CSR: %s", gi, why);
  a->csr.rowptr = t.colptr;
  a->csr.col = t.rowidx;
  a->csr.perm = t.perm;
  return EVT_OK;
}

/* An spmm group's CSR operand (rowptr, col, val, x: in_node[0..3]; spmm_t: A^T's CSR over A's val and dy) and the
 * index-error flag: the kernel library's, with the nucleus's id + 1, so the next sync names the node as it does for
 * the library's own index checks. */
static evt_status spmm_args(evt_program *p, int gi, evt_row_launch_args *a, void *stream) {
  const evt_group_exec *x = &p->xp->groups[gi];
  int nu = p->xp->low.k[gi].nucleus;
  char why[256] = "";
  if (!p->index_flag && p->api->index_flag(&p->index_flag, why, sizeof why))
    return evt_graph_errorf(p->g, nu, EVT_ERR_INTERNAL, "group %d: the index-error flag: %s", gi, why);
  a->csr.rowptr = dev(p, x->in_node[0]);
  a->csr.col = dev(p, x->in_node[1]);
  a->csr.val = dev(p, x->in_node[2]);
  a->csr.x = dev(p, x->in_node[3]);
  a->csr.nnz = evt_type_numel(&p->g->nodes[x->in_node[1]].type);
  a->csr.k = x->n ? evt_type_numel(&p->g->nodes[x->in_node[3]].type) / x->n : 0;
  a->csr.err = p->index_flag;
  a->csr.err_code = nu + 1;
  return is_spmm_t(p, gi) ? spmm_t_operand(p, gi, a, stream) : EVT_OK;
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
  if (evt_group_exec_cutlass(x)) {
    if (!evt_gemm_group_run(p->gk, p->xp, gi, node_ptr, p, p->gemm_scratch, stream)) p->replan = true;
    return EVT_OK;
  }
  evt_row_launch_args a;
  memset(&a, 0, sizeof a);
  a.m = (int)x->m;
  a.n = (int)x->n;
  if (p->xp->kspec[x->kernel]->nucleus == EVT_ROWN_SPMM) {
    evt_status st = spmm_args(p, gi, &a, stream);
    if (st != EVT_OK) return st;
  } else {
    for (int k = 0; k < 3; k++) a.in[k] = dev(p, x->in_node[k]);
  }
  for (int i = 0; i < EVT_ROW_LAUNCH_MAX_PTRS; i++) a.ptrs[i] = dev(p, x->ptr_node[i]);
  a.stream = stream;
  a.rng_step = p->rng_dev;
  evt_rspec_launch_rng(&p->xp->low.k[gi].rspec, &a); /* this group's seeds, not kspec[kernel]'s (shared) */
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
  if ((evt_group_exec_cutlass(x) && !x->unf) || !s) return 1; /* the CUTLASS kernel */
  for (int i = 0; i < s->nnodes; i++)
    if (s->nodes[i].op == EVT_V_ROW_SUM) return 2; /* the row kernel, then the deterministic row-sum finalize */
  return 1;
}

