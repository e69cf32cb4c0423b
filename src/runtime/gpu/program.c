/* A GPU program at run time (public contract: the evt_program_* comment in include/evt.h; internals:
 * src/runtime/gpu/cuda.h). src/compile/program.c creates it: passes, fused plan, compiled kernels, memory
 * plan; this file loads its kernels, places its arena on the device, binds caller memory and runs it.
 *
 * The arena is allocated lazily: by the first run that finds none bound (evt_program_bind_arena), so a caller
 * that binds its own never holds two, and programs made ahead of their first run hold none. A run allocates
 * nothing else, except after a GEMM launcher refused its group: then the program re-plans its memory and
 * enqueues the step again. Run: check every binding, then enqueue every step (cuda.c) and the
 * output copies (an output that is an input/param, or a node listed twice as an output, is copied into the
 * caller's output memory). With EVT_PROGRAM_CUDA_GRAPH the first run is eager (it loads lazily loaded
 * kernels and lets generated launchers allocate their workspaces), later runs replay a graph captured on a
 * private stream, captured again after any binding changed. Nothing synchronizes; a run-time index error
 * is skipped by the kernel and flagged on the device (evt_fb_sync reads it). */
#include "runtime/gpu/cuda.h"

#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/cachedir.h"

/* Nodes that share another's memory point where it does (after the arena or a caller pointer moved). */
static void follow_aliases(evt_program *p) {
  for (int v = 0; v < p->g->nnodes; v++) {
    int u = evt_exec_alias(p->xp, v);
    if (u >= 0) p->t[v].ptr = p->t[u].ptr;
  }
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

static int64_t aligned(int64_t bytes) { return (bytes + EVT_ARENA_ALIGN - 1) / EVT_ARENA_ALIGN * EVT_ARENA_ALIGN; }

/* The arena's parts after the intermediates: offsets of the GEMM scratch and the library's two double
 * scratch buffers, and the whole arena's size. */
typedef struct arena_tail {
  int64_t gemm, s1, s2, total;
} arena_tail;

static arena_tail tail_of(const evt_program *p) {
  arena_tail t;
  int64_t gemm = p->xp && p->xp->scratch_bytes > 0 ? p->xp->scratch_bytes : 0;
  t.gemm = aligned(p->arena_bytes);
  t.s1 = aligned(t.gemm + gemm);
  t.s2 = aligned(t.s1 + 8 * p->lib_n1);
  t.total = gemm || p->lib_n1 || p->lib_n2 ? t.s2 + 8 * p->lib_n2 : p->arena_bytes;
  return t;
}

int64_t evt_gpu_arena_total(const evt_program *p) { return tail_of(p).total; }

/* Sets every node's tensor description; arena slots get their address, fused-only members none; caller
 * pointers (bound inputs/params) are kept. */
void evt_gpu_program_set_tensors(evt_program *p) {
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
    bool in_arena = p->slots[v].kind == EVT_SLOT_ARENA;
    t->ptr = in_arena ? (p->arena ? p->arena + p->slots[v].offset : NULL) : keep;
  }
  follow_aliases(p);
  arena_tail at = tail_of(p);
  bool scratch = p->arena && p->xp && p->xp->scratch_bytes > 0;
  p->gemm_scratch = scratch ? p->arena + at.gemm : NULL;
  if (p->api && p->ctx && p->lib_n1 > 0)
    p->api->bind_scratch(p->ctx, p->arena ? p->arena + at.s1 : NULL, p->lib_n1,
                         p->arena && p->lib_n2 ? p->arena + at.s2 : NULL, p->lib_n2);
}

/* Drops the arena: frees it when it is the program's own (cudaFree waits for the device). */
static void release_arena(evt_program *p) {
  if (!p->arena_caller) p->api->free_(p->arena);
  p->arena = NULL;
  p->arena_caller = false;
}

/* The program's own arena (evt_gpu_arena_total bytes). */
static evt_status own_arena(evt_program *p) {
  char why[512];
  release_arena(p);
  int64_t bytes = evt_gpu_arena_total(p);
  p->arena = p->api->alloc(bytes, why, sizeof why);
  if (!p->arena)
    return evt_graph_errorf_at(p->g, (evt_origin){0}, EVT_ERR_UNSUPPORTED, "the arena of %lld bytes: %s",
                               (long long)bytes, why);
  return EVT_OK;
}

/* Before a run: the program's own arena when none is bound (allocated once, kept until a caller binds one). */
evt_status evt_gpu_program_ensure_arena(evt_program *p) {
  if (p->arena || evt_gpu_arena_total(p) <= 0) return EVT_OK;
  evt_status st = own_arena(p);
  if (st != EVT_OK) return fail(p, st);
  evt_gpu_program_set_tensors(p);
  return EVT_OK;
}

/* Sizes the library's double scratch for every node step (it lives in the arena, after the GEMM scratch) and
 * reserves what the library keeps per node (attention plans, A^T's CSR of every fused spmm_t group: shapes
 * only, no data); drops an arena that no longer fits (the next run allocates one:
 * evt_gpu_program_ensure_arena) and points the tensors into the arena. */
evt_status evt_gpu_program_place(evt_program *p) {
  evt_graph *g = p->g;
  char why[512];
  evt_status st = EVT_OK;
  p->lib_n1 = p->lib_n2 = 0;
  evt_gpu_program_set_tensors(p); /* (the nodes' shapes) */
  for (int s = 0; s < p->nsteps; s++) {
    int v = p->steps[s].node;
    if (v < 0 && (st = evt_gpu_reserve_group(p, p->steps[s].group)) != EVT_OK) return st;
    if (v < 0) continue;
    evt_fb_node fn; /* (with the attributes: attention plans depend on causal) */
    evt_gpu_fb_node(p, v, &fn);
    int64_t n1, n2;
    if (p->api->scratch_need(p->ctx, &fn, &n1, &n2, why, sizeof why))
      return evt_graph_errorf(g, v, EVT_ERR_UNSUPPORTED, "scratch memory: %s", why);
    if (n1 > p->lib_n1) p->lib_n1 = n1;
    if (n2 > p->lib_n2) p->lib_n2 = n2;
  }
  bool caller_fits = p->arena_caller && p->arena_caller_bytes >= evt_gpu_arena_total(p);
  if (!caller_fits) release_arena(p); /* (a re-plan may need more than the caller gave) */
  evt_gpu_program_set_tensors(p);
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
  if (st == EVT_OK) st = evt_gpu_program_place(p);
  if (st != EVT_OK) return fail(p, st);
  return evt_gpu_program_ensure_arena(p);
}

/* ---- create / destroy ------------------------------------------------------------------------------ */

void evt_program_destroy(evt_program *p) {
  if (!p) return;
  evt_prof_free(p);
  evt_hprof_free(p);
  if (p->api) {
    p->api->graph_free(p->graph_exec);
    p->api->stream_free(p->capture_stream);
    release_arena(p);
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

/* Loads the fused plan's compiled kernels (so[k]: kernel k's shared object, NULL: it did not compile and its
 * groups were demoted); a kernel that fails to load demotes its groups. */
void evt_gpu_program_load_kernels(evt_program *p, char *const *so) {
  evt_exec_plan *xp = p->xp;
  int nk = xp->nkernels;
  p->kfn = calloc((size_t)nk + 1, sizeof *p->kfn);
  if (!p->kfn) evt_fatal(__FILE__, __LINE__, "out of memory");
  for (int k = 0; k < nk; k++) {
    if (!xp->kspec[k] || !so[k]) continue; /* a GEMM+EVT kernel (gemm_launch.c), or a failure */
    char why[700];
    void *lib = evt_cache_dlopen(so[k], why, sizeof why); /* never dlclosed: CUDA code cannot be unloaded */
    if (lib) *(void **)(&p->kfn[k]) = dlsym(lib, xp->kname[k]);
    if (lib && !p->kfn[k]) snprintf(why, sizeof why, "cannot load %.300s: no entry %.300s", so[k], xp->kname[k]);
    if (!lib || !p->kfn[k]) evt_exec_plan_demote(xp, k, why);
  }
  p->gk = evt_gemm_kernels_load(xp, so);
  evt_exec_plan_counts(xp, &p->groups_fused, &p->groups_fallback);
}

/* Graphs with rand / dropout: the device word their kernels read the RNG step from, starting at the graph's
 * (evt_graph_set_rng_step), so the first run draws what the interpreter draws for that graph. */
evt_status evt_gpu_program_rng_init(evt_program *p) {
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
  if (!evt_is_caller_source(&p->g->nodes[v])) {
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

int64_t evt_program_arena_bytes(const evt_program *p) { return p ? evt_gpu_arena_total(p) : 0; }

evt_status evt_program_bind_arena(evt_program *p, void *device_ptr, int64_t bytes) {
  if (!p) return EVT_ERR_INVALID;
  char msg[200];
  if (!p->api) return failf(p, -1, EVT_ERR_UNSUPPORTED, "evt_program_bind_arena: the program was planned without a device");
  if (!device_ptr) { /* back to an arena of its own, allocated by the next run */
    if (!p->arena_caller) return EVT_OK;
    release_arena(p);
  } else {
    if ((uintptr_t)device_ptr % EVT_ARENA_ALIGN) {
      snprintf(msg, sizeof msg, "evt_program_bind_arena: the memory is not %d-byte aligned", EVT_ARENA_ALIGN);
      return failf(p, -1, EVT_ERR_INVALID, msg);
    }
    if (bytes < evt_gpu_arena_total(p)) {
      snprintf(msg, sizeof msg, "evt_program_bind_arena: %lld bytes, the arena needs %lld (evt_program_arena_bytes)",
               (long long)bytes, (long long)evt_gpu_arena_total(p));
      return failf(p, -1, EVT_ERR_INVALID, msg);
    }
    p->arena_caller_bytes = bytes;
    if (p->arena == device_ptr) return EVT_OK;
    release_arena(p);
    p->arena = device_ptr;
    p->arena_caller = true;
  }
  evt_gpu_program_set_tensors(p);
  p->dirty = true; /* a CUDA graph captured the old addresses */
  return EVT_OK;
}

/* ---- run ----------------------------------------------------------------------------------------- */

/* Every input/param and output bound; computed outputs get their caller pointer (the first output index
 * listing the node wins; the others are copies). */
static evt_status check_bindings(evt_program *p) {
  evt_graph *g = p->g;
  for (int v = 0; v < g->nnodes; v++)
    if (evt_is_caller_source(&g->nodes[v]) && !p->bound[v])
      return failf(p, v, EVT_ERR_INVALID, "evt_program_run: this input/param is not bound (evt_program_bind)");
  for (int i = p->noutputs - 1; i >= 0; i--) {
    if (!p->out_ptr[i]) {
      char msg[160];
      snprintf(msg, sizeof msg, "evt_program_run: output %d is not bound (evt_program_bind_output)", i);
      return failf(p, p->out_node[i], EVT_ERR_INVALID, msg);
    }
    int v = p->out_node[i];
    if (!evt_is_caller_source(&g->nodes[v])) p->t[v].ptr = p->out_ptr[i];
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
  if ((st = evt_gpu_program_ensure_arena(p)) != EVT_OK) return st;
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
    p->nparams_trained = evt_graph_grad_outputs(g, p->grad_of);
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
