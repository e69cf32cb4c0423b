/* program.c — a training step compiled for the GPU, run on the caller's memory and stream (public contract:
 * the evt_program_* comment in include/evt.h; internals: src/runtime/cuda.h).
 *
 * Create: load the kernel library (first, so a machine without a GPU fails before g is touched), run the
 * passes (unless EVT_PROGRAM_NO_OPT), with EVT_PROGRAM_FUSED partition + lower + JIT the distinct row /
 * pointwise kernels and (src/runtime/gemm_launch.c) GEMM+EVT kernels (a group whose kernel fails to
 * compile or load falls back to node by node, reason in its `why`), list the steps, plan the arena,
 * allocate it, and reserve the library's scratch for every node step (a run never allocates, except after
 * a GEMM launcher refused its group: then the program re-plans and enqueues the step again).
 * Run: check every binding, then enqueue every step (cuda.c) and the output copies (an output that is an
 * input/param, or a node listed twice as an output, is copied into the caller's output memory). With
 * EVT_PROGRAM_CUDA_GRAPH the first run is eager (it loads lazily loaded kernels and lets generated
 * launchers allocate their workspaces), later runs replay a graph captured on a private stream, captured
 * again after any binding changed. Nothing synchronizes; a run-time index error (an out-of-range index)
 * is skipped by the kernel and flagged on the device (evt_fb_sync reads it; evt_cuda_step reports it).
 */
#include "evt.h"
#include "passes/passes.h"
#include "runtime/cuda.h"
#include "runtime/jit.h"
#include "runtime/plan.h"

#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static bool caller_source(const evt_node *n) { return n->op == EVT_OP_INPUT || n->op == EVT_OP_PARAM; }

static int64_t aligned_bytes(const evt_graph *g, int v) {
  int64_t b = evt_type_numel(&g->nodes[v].type) * (int64_t)evt_dtype_size(g->nodes[v].type.dtype);
  return (b > 0 ? b + 255 : 256) / 256 * 256;
}

/* ---- steps and memory (pure host code) ------------------------------------------------------------- */

#define MAX_ACCESS (EVT_MAX_INPUTS + 3 + EVT_ROW_LAUNCH_MAX_PTRS)
static void step_access(const evt_graph *g, const evt_exec_plan *xp, evt_prog_step s, int *reads, int *nr,
                        int *writes, int *nw);

int evt_program_steps(const evt_graph *g, const evt_exec_plan *xp, evt_prog_step *steps) {
  int n = 0;
  if (!xp) {
    for (int v = 0; v < g->nnodes; v++)
      if (!caller_source(&g->nodes[v])) steps[n++] = (evt_prog_step){v, -1};
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
  bool gemm = x->kind == EVT_LK_GEMM_EVT;
  int nspec = gemm ? L->spec.nnodes : L->rspec.nnodes;
  if (gemm) {
    reads[(*nr)++] = x->a_node;
    reads[(*nr)++] = x->b_node;
    if (x->d_node >= 0) writes[(*nw)++] = x->d_node;
  } else {
    for (int k = 0; k < 3; k++)
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

/* Nodes that share another's memory point where it does (after the arena or a caller pointer moved). */
static void follow_aliases(evt_program *p) {
  for (int v = 0; v < p->g->nnodes; v++) {
    int u = evt_exec_alias(p->xp, v);
    if (u >= 0) p->t[v].ptr = p->t[u].ptr;
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
    bool caller = caller_source(nd) || (nd->flags & EVT_NODE_OUTPUT);
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

/* Records the graph's current error as the program's, returns st. */
static evt_status fail(evt_program *p, evt_status st) {
  snprintf(p->err, sizeof p->err, "%s", evt_graph_error(p->g));
  return st;
}

static evt_status failf(evt_program *p, int node, evt_status st, const char *msg) {
  if (node >= 0) evt_graph_errorf(p->g, node, st, "%s", msg);
  else evt_graph_errorf_at(p->g, (evt_origin){0}, st, "%s", msg);
  return fail(p, st);
}

/* ---- device memory --------------------------------------------------------------------------------- */

/* Sets every node's tensor description; arena slots get their address, fused-only members none; caller
 * pointers (bound inputs/params) are kept. */
static void set_tensors(evt_program *p) {
  const evt_graph *g = p->g;
  for (int v = 0; v < g->nnodes; v++) {
    const evt_type *ty = &g->nodes[v].type;
    evt_fb_tensor *t = &p->t[v];
    void *keep = p->slots[v].kind == EVT_SLOT_CALLER ? t->ptr : NULL;
    t->dtype = (int)ty->dtype;
    t->rank = ty->rank;
    t->numel = 1;
    for (int d = 0; d < ty->rank; d++) {
      t->shape[d] = ty->shape[d];
      t->numel *= ty->shape[d];
    }
    t->ptr = p->slots[v].kind == EVT_SLOT_ARENA ? p->arena + p->slots[v].offset : keep;
  }
  follow_aliases(p);
}

/* Allocates the arena (and the GEMM scratch) for the current layout, points the tensors at it and
 * reserves the library's scratch for every node step. */
static evt_status place_on_device(evt_program *p) {
  evt_graph *g = p->g;
  char why[512];
  p->api->free_(p->arena); /* a re-plan: waits for the device (cudaFree) */
  p->arena = p->api->alloc(p->arena_bytes, why, sizeof why);
  if (!p->arena)
    return evt_graph_errorf_at(g, (evt_origin){0}, EVT_ERR_UNSUPPORTED, "the arena of %lld bytes: %s",
                               (long long)p->arena_bytes, why);
  if (p->xp && p->xp->scratch_bytes > 0 && !p->gemm_scratch &&
      !(p->gemm_scratch = p->api->alloc(p->xp->scratch_bytes, why, sizeof why)))
    return evt_graph_errorf_at(g, (evt_origin){0}, EVT_ERR_UNSUPPORTED, "GEMM scratch: %s", why);
  set_tensors(p);
  for (int s = 0; s < p->nsteps; s++) {
    int v = p->steps[s].node;
    if (v < 0) continue;
    evt_fb_node fn; /* (with the attributes: attention plans depend on causal) */
    evt_gpu_fb_node(p, v, &fn);
    if (p->api->reserve(p->ctx, &fn, why, sizeof why))
      return evt_graph_errorf(g, v, EVT_ERR_UNSUPPORTED, "scratch memory: %s", why);
  }
  return EVT_OK;
}

/* A GEMM launcher refused its group (now demoted): new steps, layout and arena. */
static evt_status replan(evt_program *p) {
  char why[512];
  p->replan = false;
  p->dirty = true;
  evt_exec_plan_counts(p->xp, &p->groups_fused, &p->groups_fallback);
  p->nsteps = evt_program_steps(p->g, p->xp, p->steps);
  evt_status st = evt_program_layout(p->g, p->xp, p->slots, &p->arena_bytes, &p->naive_bytes, why, sizeof why);
  if (st != EVT_OK) evt_graph_errorf_at(p->g, (evt_origin){0}, st, "memory plan: %s", why);
  if (st == EVT_OK) st = place_on_device(p);
  return st == EVT_OK ? EVT_OK : fail(p, st);
}

/* ---- create / destroy ------------------------------------------------------------------------------ */

void evt_program_destroy(evt_program *p) {
  if (!p) return;
  evt_prof_free(p);
  evt_hprof_free(p);
  if (p->api) {
    p->api->graph_free(p->graph_exec);
    p->api->stream_free(p->capture_stream);
    p->api->free_(p->arena);
    p->api->free_(p->gemm_scratch);
    p->api->free_(p->rng_dev);
    p->api->ctx_free(p->ctx);
  }
  /* generated kernels stay loaded (no dlclose; see evt_gpu_library) */
  if (p->xp) {
    evt_exec_plan_free(p->xp);
    free(p->xp);
  }
  evt_gemm_kernels_free(p->gk);
  free(p->kfn);
  free(p->steps);
  free(p->t);
  free(p->slots);
  free(p->out_node);
  free(p->out_ptr);
  free(p->bound);
  free(p->grad_of);
  free(p);
}

/* EVT_PROGRAM_FUSED: the plan, then one JIT job per distinct kernel; failures demote their groups. */
static evt_status build_fused(evt_program *p, bool device) {
  evt_graph *g = p->g;
  p->xp = calloc(1, sizeof *p->xp);
  if (!p->xp) evt_fatal(__FILE__, __LINE__, "out of memory");
  evt_status st = evt_exec_plan_build(g, p->xp);
  if (st != EVT_OK) {
    free(p->xp);
    p->xp = NULL;
    return fail(p, st);
  }
  evt_exec_plan *xp = p->xp;
  evt_exec_plan_counts(xp, &p->groups_fused, &p->groups_fallback);
  if (!device) return EVT_OK;
  int nk = xp->nkernels;
  p->kfn = calloc((size_t)nk + 1, sizeof *p->kfn);
  evt_jit_job *jobs = calloc((size_t)nk + 1, sizeof *jobs);
  char **src = calloc((size_t)nk + 1, sizeof *src);
  int njobs = 0, *job_of = calloc((size_t)nk + 1, sizeof *job_of);
  if (!p->kfn || !jobs || !src || !job_of) evt_fatal(__FILE__, __LINE__, "out of memory");
  char msg[1024];
  for (int k = 0; k < nk; k++) {
    job_of[k] = -1;
    if (!xp->kspec[k]) continue; /* a GEMM+EVT kernel: gemm_launch.c */
    src[k] = evt_emit_rows(xp->kspec[k], msg, sizeof msg);
    if (!src[k]) {
      evt_exec_plan_demote(xp, k, msg);
      continue;
    }
    jobs[njobs].name = xp->kname[k];
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
      evt_exec_plan_demote(xp, k, msg);
      continue;
    }
    if (!jobs[j].ok) {
      evt_exec_plan_demote(xp, k, jobs[j].error[0] ? jobs[j].error : "failed to compile");
      continue;
    }
    void *so = dlopen(jobs[j].so_path, RTLD_NOW | RTLD_LOCAL);
    if (so) *(void **)(&p->kfn[k]) = dlsym(so, xp->kname[k]);
    if (!so || !p->kfn[k]) {
      char why[600];
      snprintf(why, sizeof why, "cannot load %.300s: %.250s", jobs[j].so_path, dlerror());
      evt_exec_plan_demote(xp, k, why);
    }
  }
  for (int k = 0; k < nk; k++) free(src[k]);
  free(src);
  free(jobs);
  free(job_of);
  p->gk = evt_gemm_kernels_load(xp);
  evt_exec_plan_counts(xp, &p->groups_fused, &p->groups_fallback);
  return EVT_OK;
}

/* Graphs with rand / dropout: the device word their kernels read the RNG step from, starting at the graph's
 * (evt_graph_set_rng_step), so the first run draws what the interpreter draws for that graph. */
static evt_status rng_init(evt_program *p) {
  bool rng = false;
  for (int v = 0; v < p->g->nnodes && !rng; v++) rng = p->g->nodes[v].op == EVT_OP_RAND || p->g->nodes[v].op == EVT_OP_DROPOUT;
  if (!rng) return EVT_OK;
  char why[512];
  int bad = -1;
  if (!(p->rng_dev = p->api->alloc(sizeof *p->rng_dev, why, sizeof why)) ||
      p->api->rng_step(p->rng_dev, p->rng_step, 1, NULL, why, sizeof why) || p->api->sync(NULL, &bad, why, sizeof why))
    return evt_graph_errorf_at(p->g, (evt_origin){0}, EVT_ERR_UNSUPPORTED, "the RNG step's memory: %s", why);
  return EVT_OK;
}

/* After a run's kernels on `stream`: the next run draws with the next RNG step (inside a captured run too). */
static evt_status rng_advance(evt_program *p, void *stream) {
  char err[512];
  if (p->rng_dev && p->api->rng_step(p->rng_dev, 0, 0, stream, err, sizeof err)) return failf(p, -1, EVT_ERR_INTERNAL, err);
  return EVT_OK;
}

static evt_status create(evt_graph *g, unsigned flags, bool device, evt_program **out) {
  if (!out) return EVT_ERR_INVALID;
  *out = NULL;
  if (!g) return EVT_ERR_INVALID;
  if (flags & ~(unsigned)(EVT_PROGRAM_FUSED | EVT_PROGRAM_CUDA_GRAPH | EVT_PROGRAM_NO_OPT))
    return evt_graph_errorf_at(g, (evt_origin){0}, EVT_ERR_INVALID, "evt_program_create: unknown flags 0x%x", flags);
  evt_program *p = calloc(1, sizeof *p);
  if (!p) return evt_graph_errorf_at(g, (evt_origin){0}, EVT_ERR_INTERNAL, "out of memory");
  p->g = g;
  p->flags = flags;
  p->rng_step = g->rng_step; /* the first run's RNG step */
  char why[1024];
  p->api = device ? evt_gpu_library(why, sizeof why) : NULL;
  evt_status st = EVT_OK;
  if (device && !p->api) {
    evt_graph_errorf_at(g, (evt_origin){0}, EVT_ERR_UNSUPPORTED, "%s", why);
    evt_program_destroy(p);
    return EVT_ERR_UNSUPPORTED;
  }
  if (!(flags & EVT_PROGRAM_NO_OPT)) st = evt_passes_run_all(g, 0, 0);
  if (st == EVT_OK && g->noutputs == 0) st = evt_graph_errorf_at(g, (evt_origin){0}, EVT_ERR_INVALID, "the graph has no outputs");
  if (st == EVT_OK && device && !(p->ctx = p->api->ctx_new(why, sizeof why)))
    st = evt_graph_errorf_at(g, (evt_origin){0}, EVT_ERR_UNSUPPORTED, "no CUDA device: %s", why);
  if (st == EVT_OK && (flags & EVT_PROGRAM_FUSED)) st = build_fused(p, device);
  int n = g->nnodes;
  if (st == EVT_OK) {
    p->steps = malloc(sizeof *p->steps * (size_t)(n + 1));
    p->t = calloc((size_t)n + 1, sizeof *p->t);
    p->slots = calloc((size_t)n + 1, sizeof *p->slots);
    p->bound = calloc((size_t)n + 1, 1);
    p->noutputs = g->noutputs;
    p->out_node = malloc(sizeof(int) * (size_t)(g->noutputs + 1));
    p->out_ptr = calloc((size_t)g->noutputs + 1, sizeof(void *));
    if (!p->steps || !p->t || !p->slots || !p->bound || !p->out_node || !p->out_ptr)
      evt_fatal(__FILE__, __LINE__, "out of memory");
    for (int k = 0; k < g->noutputs; k++) p->out_node[k] = g->outputs[k];
    p->nsteps = evt_program_steps(g, p->xp, p->steps);
    st = evt_program_layout(g, p->xp, p->slots, &p->arena_bytes, &p->naive_bytes, why, sizeof why);
    if (st != EVT_OK) evt_graph_errorf_at(g, (evt_origin){0}, st, "memory plan: %s", why);
  }
  if (!device) {
    if (st != EVT_OK) {
      evt_program_destroy(p);
      return st;
    }
    set_tensors(p);
    *out = p;
    return EVT_OK;
  }
  if (st == EVT_OK) st = place_on_device(p);
  if (st == EVT_OK) st = rng_init(p);
  if (st == EVT_OK && (flags & EVT_PROGRAM_CUDA_GRAPH) && p->api->stream_new(&p->capture_stream, why, sizeof why))
    st = evt_graph_errorf_at(g, (evt_origin){0}, EVT_ERR_UNSUPPORTED, "capture stream: %s", why);
  if (st != EVT_OK) {
    evt_program_destroy(p);
    return st;
  }
  p->dirty = true;
  *out = p;
  return EVT_OK;
}

evt_status evt_program_create(evt_graph *g, unsigned flags, evt_program **out) { return create(g, flags, true, out); }

evt_status evt_program_create_host(evt_graph *g, unsigned flags, evt_program **out) {
  return create(g, flags, false, out);
}

/* ---- bindings ------------------------------------------------------------------------------------- */

evt_status evt_program_bind(evt_program *p, const char *name, void *device_ptr) {
  if (!p) return EVT_ERR_INVALID;
  char msg[600];
  if (!name) return failf(p, -1, EVT_ERR_INVALID, "evt_program_bind: no name given");
  int v = evt_graph_find(p->g, name);
  if (v < 0) {
    snprintf(msg, sizeof msg, "evt_program_bind: the graph has no input or param named '%.200s'", name);
    return failf(p, -1, EVT_ERR_INVALID, msg);
  }
  if (!caller_source(&p->g->nodes[v])) {
    snprintf(msg, sizeof msg, "evt_program_bind: '%.200s' is a %s node, not an input or param (bind graph outputs with "
             "evt_program_bind_output)", name, evt_op_get(p->g->nodes[v].op)->name);
    return failf(p, v, EVT_ERR_INVALID, msg);
  }
  if (!device_ptr) return failf(p, v, EVT_ERR_INVALID, "evt_program_bind: NULL device pointer");
  if (p->t[v].ptr != device_ptr) p->dirty = true;
  p->t[v].ptr = device_ptr;
  p->bound[v] = 1;
  return EVT_OK;
}

evt_status evt_program_bind_output(evt_program *p, int i, void *device_ptr) {
  if (!p) return EVT_ERR_INVALID;
  char msg[200];
  if (i < 0 || i >= p->noutputs) {
    snprintf(msg, sizeof msg, "evt_program_bind_output: output index %d is out of range (the graph has %d outputs)", i,
             p->noutputs);
    return failf(p, -1, EVT_ERR_INVALID, msg);
  }
  if (!device_ptr) return failf(p, p->out_node[i], EVT_ERR_INVALID, "evt_program_bind_output: NULL device pointer");
  if (p->out_ptr[i] != device_ptr) p->dirty = true;
  p->out_ptr[i] = device_ptr;
  return EVT_OK;
}

/* ---- run ----------------------------------------------------------------------------------------- */

/* Every input/param and output bound; computed outputs get their caller pointer (the first output index
 * listing the node wins; the others are copies). */
static evt_status check_bindings(evt_program *p) {
  evt_graph *g = p->g;
  for (int v = 0; v < g->nnodes; v++)
    if (caller_source(&g->nodes[v]) && !p->bound[v])
      return failf(p, v, EVT_ERR_INVALID, "evt_program_run: this input/param is not bound (evt_program_bind)");
  for (int i = p->noutputs - 1; i >= 0; i--) {
    if (!p->out_ptr[i]) {
      char msg[160];
      snprintf(msg, sizeof msg, "evt_program_run: output %d is not bound (evt_program_bind_output)", i);
      return failf(p, p->out_node[i], EVT_ERR_INVALID, msg);
    }
    int v = p->out_node[i];
    if (!caller_source(&g->nodes[v])) p->t[v].ptr = p->out_ptr[i];
  }
  follow_aliases(p);
  return EVT_OK;
}

/* Enqueues the step. Stops early (EVT_OK, p->replan set) when a GEMM launcher refused its group. */
static evt_status enqueue(evt_program *p, void *stream) {
  char err[512];
  long before = p->api->launches(p->ctx), generated = 0;
  evt_status st = EVT_OK;
  bool prof = evt_prof_begin(p, stream);
  bool hprof = evt_hprof_begin(p, stream);
  double t_run = hprof ? evt_now_us() : 0;
  for (int s = 0; s < p->nsteps && st == EVT_OK && !p->replan; s++) {
    const evt_prog_step *sp = &p->steps[s];
    if (prof) evt_prof_mark(p, s, stream);
    double t_step = hprof ? evt_now_us() : 0;
    if (sp->node >= 0) {
      st = evt_gpu_launch_node(p, sp->node, stream);
    } else {
      st = evt_gpu_launch_group(p, sp->group, stream);
      generated += evt_gpu_group_launches(p, sp->group);
    }
    if (hprof) evt_hprof_step(p, s, evt_now_us() - t_step);
  }
  if (p->replan) return EVT_OK;
  for (int i = 0; i < p->noutputs && st == EVT_OK; i++) {
    int v = p->out_node[i];
    if (p->out_ptr[i] == p->t[v].ptr) continue;
    int64_t bytes = p->t[v].numel * (int64_t)evt_dtype_size((evt_dtype)p->t[v].dtype);
    if (p->api->copy(p->out_ptr[i], p->t[v].ptr, bytes, stream, err, sizeof err))
      st = evt_graph_errorf(p->g, v, EVT_ERR_INTERNAL, "CUDA copy to output %d: %s", i, err);
  }
  p->launches = p->api->launches(p->ctx) - before + generated;
  if (prof && st == EVT_OK) evt_prof_end(p, stream);
  if (hprof && st == EVT_OK) evt_hprof_end(p, evt_now_us() - t_run);
  return st == EVT_OK ? EVT_OK : fail(p, st);
}

/* Eager: enqueue; a refused GEMM group re-plans and the whole step is enqueued again (it only reads the
 * inputs, so running its first groups twice is harmless). At most one re-plan per group. */
static evt_status run_eager(evt_program *p, void *stream) {
  for (int tries = 0;; tries++) {
    evt_status st = enqueue(p, stream);
    if (st != EVT_OK || !p->replan) return st;
    if (tries > p->xp->ngroups) return failf(p, -1, EVT_ERR_INTERNAL, "evt_program_run: re-planning does not converge");
    if ((st = check_bindings(p)) != EVT_OK) return st;
    if ((st = replan(p)) != EVT_OK) return st;
    if ((st = check_bindings(p)) != EVT_OK) return st;
  }
}

/* Captures the step on the private stream into p->graph_exec (re-planning as run_eager does). */
static evt_status capture(evt_program *p) {
  char err[512];
  p->api->graph_free(p->graph_exec);
  p->graph_exec = NULL;
  for (int tries = 0;; tries++) {
    if (p->api->capture_begin(p->capture_stream, err, sizeof err)) return failf(p, -1, EVT_ERR_INTERNAL, err);
    evt_status st = enqueue(p, p->capture_stream);
    if (st == EVT_OK && !p->replan) st = rng_advance(p, p->capture_stream); /* every replay advances it */
    void *exec = NULL;
    bool again = st == EVT_OK && p->replan;
    if (p->api->capture_end(p->capture_stream, st != EVT_OK || again, &exec, err, sizeof err))
      return failf(p, -1, EVT_ERR_INTERNAL, err);
    if (st != EVT_OK) return st;
    if (!again) {
      p->graph_exec = exec;
      p->dirty = false;
      return EVT_OK;
    }
    if (tries > p->xp->ngroups) return failf(p, -1, EVT_ERR_INTERNAL, "evt_program_run: re-planning does not converge");
    if ((st = replan(p)) != EVT_OK || (st = check_bindings(p)) != EVT_OK) return st;
  }
}

/* ---- the in-step A/B of fusion (exec_plan.h: groups with ab) ------------------------------------------ */
#define AB_ROUNDS 3 /* rounds of (implementation A, implementation B), alternating */
#define AB_RUNS 3   /* timed runs per implementation and round, after one untimed run */

/* Whole-run GPU time of the program as it is now: one untimed run, then AB_RUNS timed ones (events around
 * each), their median into *ms. false when a run failed or re-planned (*st then says which). */
static bool time_program(evt_program *p, void *stream, double *ms, evt_status *st) {
  char err[256];
  void *ev[2 * AB_RUNS] = {0};
  double t[AB_RUNS];
  bool ok = true;
  *st = enqueue(p, stream);
  if (*st != EVT_OK || p->replan) return false;
  for (int i = 0; i < 2 * AB_RUNS && ok; i++) ok = !p->api->event_new(&ev[i], err, sizeof err);
  for (int i = 0; i < AB_RUNS && ok; i++) {
    ok = !p->api->event_record(ev[2 * i], stream, err, sizeof err);
    if (ok && ((*st = enqueue(p, stream)) != EVT_OK || p->replan)) ok = false;
    if (ok) ok = !p->api->event_record(ev[2 * i + 1], stream, err, sizeof err);
  }
  for (int i = 0; i < AB_RUNS && ok; i++) ok = !p->api->event_ms(ev[2 * i], ev[2 * i + 1], &t[i], err, sizeof err);
  for (int i = 0; i < 2 * AB_RUNS; i++) p->api->event_free(ev[i]);
  if (!ok) return false;
  for (int i = 1; i < AB_RUNS; i++) /* insertion sort: the median */
    for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
      double x = t[j];
      t[j] = t[j - 1];
      t[j - 1] = x;
    }
  *ms = t[AB_RUNS / 2];
  return true;
}

static bool is_unfused_impl(const evt_group_exec *x) { return x->unf || x->blas; }

static void swap_class(evt_exec_plan *xp, const int *cls, int c, int first) {
  for (int gi = first; gi < xp->ngroups; gi++)
    if (cls[gi] == c && xp->groups[gi].ab) evt_exec_swap_alt(xp, gi); /* (a group demoted meanwhile: not) */
}

/* After the first (eager) run: for each class of groups with two implementations bound (the same fused kernel
 * and problem: one tuning record), time the whole program with the class fused and with it unfused, alternating
 * AB_ROUNDS times, and keep the faster (sum of the rounds' medians); then one more run, so this call's outputs
 * come from the implementations kept. The program only reads its inputs, so the extra runs are harmless (as
 * run_eager's re-runs). Eager runs: the times include host launch gaps, which a CUDA graph would hide (the
 * unfused pair is one launch more). Skipped while the stream is captured (the starting choice, the margin's,
 * stays). Prints one line per class on stderr. A run that fails or re-plans during the A/B ends it (choices made
 * so far stay; a failure's status is returned, a re-plan is left to the caller). */
static evt_status fusion_ab(evt_program *p, void *stream) {
  evt_exec_plan *xp = p->xp;
  if (!xp || xp->nab <= 0 || !p->api || p->api->stream_capturing(stream)) return EVT_OK;
  const int ng = xp->ngroups;
  int *cls = malloc(sizeof(int) * ((size_t)ng + 1)), ncls = 0;
  EVT_ASSERT(cls);
  for (int gi = 0; gi < ng; gi++) {
    cls[gi] = -1;
    const evt_group_exec *x = &xp->groups[gi];
    if (!x->ab || !x->fused) continue;
    const evt_group_exec *f = is_unfused_impl(x) ? &xp->alt[gi] : x;
    for (int j = 0; j < gi && cls[gi] < 0; j++) {
      if (cls[j] < 0) continue;
      const evt_group_exec *y = &xp->groups[j], *fy = is_unfused_impl(y) ? &xp->alt[j] : y;
      if (fy->kernel == f->kernel && y->m == x->m && y->n == x->n && y->k == x->k) cls[gi] = cls[j];
    }
    if (cls[gi] < 0) cls[gi] = ncls++;
  }
  evt_status st = EVT_OK;
  for (int c = 0; c < ncls && st == EVT_OK && !p->replan; c++) {
    int first = 0, count = 0;
    while (cls[first] != c) first++;
    for (int gi = first; gi < ng; gi++) count += cls[gi] == c;
    const bool start_unf = is_unfused_impl(&xp->groups[first]);
    double sum[2] = {0, 0}; /* [0]: the starting implementation, [1]: the other */
    bool ok = true, on_other = false;
    for (int r = 0; r < 2 * AB_ROUNDS && ok; r++) {
      double ms = 0;
      if ((r % 2 == 1) != on_other) {
        swap_class(xp, cls, c, first);
        on_other = !on_other;
      }
      ok = time_program(p, stream, &ms, &st);
      sum[r % 2] += ms;
    }
    const bool keep_other = ok && sum[1] < sum[0];
    if (keep_other != on_other) swap_class(xp, cls, c, first);
    const bool unf = keep_other ? !start_unf : start_unf;
    const evt_group_exec *x = &xp->groups[first];
    const double f_ms = (start_unf ? sum[1] : sum[0]) / AB_ROUNDS, u_ms = (start_unf ? sum[0] : sum[1]) / AB_ROUNDS;
    char line[200];
    if (ok)
      snprintf(line, sizeof line, "in-step A/B: run %.3f ms fused, %.3f unfused -> %s", f_ms, u_ms, unf ? "unfused" : "fused");
    else
      snprintf(line, sizeof line, "in-step A/B stopped (a run failed or re-planned): %s", unf ? "unfused" : "fused");
    char rec[80] = "no record";
    if (x->rec_fused_ms > 0 && x->rec_unfused_ms > 0)
      snprintf(rec, sizeof rec, "record %.4f ms fused, %.4f unfused", x->rec_fused_ms, x->rec_unfused_ms);
    fprintf(stderr, "[evt-ab] group %d (%d group%s, %lldx%lldx%lld; %s): %s\n", first, count, count == 1 ? "" : "s",
            (long long)x->m, (long long)x->n, (long long)x->k, rec, line);
    for (int gi = first; gi < ng; gi++) {
      if (cls[gi] != c) continue;
      evt_group_exec *y = &xp->groups[gi];
      char *d = strstr(y->tune_desc, "(in-step A/B");
      if (d) snprintf(d, sizeof y->tune_desc - (size_t)(d - y->tune_desc), "(%s)", line);
    }
  }
  free(cls);
  p->dirty = true; /* a CUDA graph captures the choices */
  /* this call's outputs from the implementations kept (the last timed run may have used the others) */
  if (st == EVT_OK && !p->replan && ncls > 0) st = enqueue(p, stream);
  return st;
}

evt_status evt_program_run(evt_program *p, void *cuda_stream) {
  if (!p) return EVT_ERR_INVALID;
  evt_status st = check_bindings(p);
  if (st != EVT_OK) return st;
  if (!p->api) return failf(p, -1, EVT_ERR_UNSUPPORTED, "evt_program_run: the program was planned without a device");
  if (!(p->flags & EVT_PROGRAM_CUDA_GRAPH) || !p->warmed) {
    st = run_eager(p, cuda_stream);
    if (st == EVT_OK && !p->warmed && p->xp && p->xp->nab > 0) {
      st = fusion_ab(p, cuda_stream);
      if (st == EVT_OK && p->replan) st = run_eager(p, cuda_stream); /* a launcher refused during the A/B */
    }
    if (st == EVT_OK) st = rng_advance(p, cuda_stream); /* (once: the A/B's runs drew with the same step) */
    p->warmed = st == EVT_OK;
    if (st == EVT_OK) p->runs++, p->rng_step++;
    return st;
  }
  if ((p->dirty || !p->graph_exec) && (st = capture(p)) != EVT_OK) return st;
  char err[512];
  if (p->api->graph_launch(p->graph_exec, cuda_stream, err, sizeof err)) return failf(p, -1, EVT_ERR_INTERNAL, err);
  p->runs++, p->rng_step++;
  return EVT_OK;
}

evt_status evt_program_set_rng_step(evt_program *p, uint64_t step, void *cuda_stream) {
  if (!p) return EVT_ERR_INVALID;
  char err[512];
  if (p->rng_dev && p->api->rng_step(p->rng_dev, step, 1, cuda_stream, err, sizeof err))
    return failf(p, -1, EVT_ERR_INTERNAL, err);
  p->rng_step = step;
  return EVT_OK;
}

uint64_t evt_program_rng_step(const evt_program *p) { return p ? p->rng_step : 0; }

/* One SGD step on the device (public contract in include/evt.h): every param with a %grad.<name> output,
 * p -= lr * grad in the memory bound to both, enqueued on the caller's stream after whatever it holds (the
 * run that filled the gradients). */
evt_status evt_program_sgd(evt_program *p, double lr, void *cuda_stream) {
  if (!p) return EVT_ERR_INVALID;
  if (!isfinite(lr) || lr < 0) return failf(p, -1, EVT_ERR_INVALID, "evt_program_sgd: the learning rate must be finite and >= 0");
  evt_status st = check_bindings(p);
  if (st != EVT_OK) return st;
  const evt_graph *g = p->g;
  if (!p->grad_of) {
    p->grad_of = malloc(sizeof(int) * (size_t)(g->nnodes ? g->nnodes : 1));
    if (!p->grad_of) evt_fatal(__FILE__, __LINE__, "out of memory");
    p->nparams_trained = evt_train_grad_outputs(g, p->grad_of);
  }
  if (p->nparams_trained == 0)
    return failf(p, -1, EVT_ERR_INVALID, "evt_program_sgd: the graph has no %grad.<param> output (build the joint graph)");
  if (!p->api) return failf(p, -1, EVT_ERR_UNSUPPORTED, "evt_program_sgd: the program was planned without a device");
  char err[512];
  for (int v = 0; v < g->nnodes; v++) {
    if (p->grad_of[v] < 0) continue;
    if (p->api->sgd(&p->t[v], &p->t[p->grad_of[v]], lr, cuda_stream, err, sizeof err)) return failf(p, v, EVT_ERR_INTERNAL, err);
  }
  return EVT_OK;
}

const char *evt_program_error(const evt_program *p) { return p ? p->err : "no program"; }

int evt_program_launch_count(const evt_program *p) { return p ? (int)p->launches : 0; }
