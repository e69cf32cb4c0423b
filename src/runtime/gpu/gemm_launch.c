/* GEMM+EVT kernels of a fused plan: load, launch (contract: gemm_launch.h). */
#include "runtime/gpu/gemm_launch.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "evt_launch.h"
#include "util/cachedir.h"
#include <stdio.h>

typedef int (*gemm_entry)(const evt_launch_args *);

struct evt_gemm_kernels {
  int nk;             /* = p->nkernels at load */
  gemm_entry *fn;     /* per plan kernel: the loaded entry, NULL for row kernels and failures */
  int wanted, loaded;
};

evt_gemm_kernels *evt_gemm_kernels_load(evt_exec_plan *p, char *const *so) {
  int nk = p->nkernels;
  evt_gemm_kernels *gk = calloc(1, sizeof *gk);
  gemm_entry *fn = calloc((size_t)nk + 1, sizeof *fn);
  if (!gk || !fn) evt_fatal(__FILE__, __LINE__, "out of memory");
  gk->nk = nk;
  gk->fn = fn;
  for (int k = 0; k < nk; k++) {
    if (!p->gspec[k]) continue;
    gk->wanted++;
    if (!so[k]) continue; /* it did not compile: its groups are demoted */
    /* never dlclosed: CUDA code cannot be unloaded */
    char why[700];
    void *lib = evt_cache_dlopen(so[k], why, sizeof why);
    if (lib) *(void **)(&fn[k]) = dlsym(lib, p->kname[k]);
    if (!lib || !fn[k]) {
      if (lib) snprintf(why, sizeof why, "cannot load %.300s: no entry %.300s", so[k], p->kname[k]);
      fn[k] = NULL;
      evt_exec_plan_demote(p, k, why);
      continue;
    }
    gk->loaded++;
  }
  return gk;
}

const char *evt_gemm_launch_status_name(int rc) {
  switch (rc) {
    case EVT_LAUNCH_OK: return "ok";
    case EVT_LAUNCH_CANNOT_IMPLEMENT: return "cannot implement (CUTLASS can_implement refused the problem)";
    case EVT_LAUNCH_WORKSPACE: return "workspace allocation failed";
    case EVT_LAUNCH_INIT: return "Gemm::initialize failed";
    case EVT_LAUNCH_RUN: return "the launch failed";
    case EVT_LAUNCH_BAD_ARGS: return "a needed pointer is NULL (a conv: or m, n, k not its compiled-in geometry's)";
    default: return "unknown launcher code";
  }
}

static bool refuse(evt_exec_plan *p, int gi, const char *why) {
  evt_exec_plan_demote_group(p, gi, why);
  fprintf(stderr, "evtc run: warning: group %d (%s) runs node by node from now on: %s\n", gi,
          evt_lower_kind_name(p->groups[gi].kind), p->groups[gi].why);
  return false;
}

bool evt_gemm_group_run(evt_gemm_kernels *gk, evt_exec_plan *p, int gi, evt_node_ptr_fn node_ptr, void *ctx,
                        void *scratch, void *stream) {
  evt_group_exec *x = &p->groups[gi];
  EVT_ASSERT(x->fused && evt_group_exec_cutlass(x) && x->kernel >= 0 && x->kernel < gk->nk);
  gemm_entry f = gk->fn[x->kernel];
  if (!f) return refuse(p, gi, "the kernel is not loaded");
  evt_launch_args a;
  memset(&a, 0, sizeof a);
  a.m = (int)x->m;
  a.n = (int)x->n;
  a.k = (int)x->k;
  a.a = node_ptr(ctx, x->a_node);
  a.b = node_ptr(ctx, x->b_node);
  a.d = x->d_node >= 0 ? node_ptr(ctx, x->d_node) : scratch;
  a.stream = stream;
  a.swizzle = x->swizzle; /* the tuned tile scheduler (0: CUTLASS's default) */
  a.raster = x->raster;
  evt_lower_launch_batch(&p->low.k[gi], &a); /* batch fields (all 0 for an unbatched GEMM; batched: l x l_outer batches through the lowered strides) */
  bool aligned = ((uintptr_t)a.a | (uintptr_t)a.b | (uintptr_t)a.d) % 16 == 0;
  const evt_kspec *s = &p->low.k[gi].spec;
  evt_kspec_launch_rng(s, &a); /* this group's seeds (the kernel may be shared with other groups) */
  for (int i = 0; i < EVT_LAUNCH_MAX_PTRS; i++)
    if (x->ptr_node[i] >= 0) {
      a.ptrs[i] = node_ptr(ctx, x->ptr_node[i]);
      aligned = aligned && (uintptr_t)a.ptrs[i] % 16 == 0;
    } else if (i < s->nnodes && s->nodes[i].op == EVT_V_RAND) {
      a.ptrs[i] = node_ptr(ctx, EVT_EXEC_PTR_RNG); /* (evt_nodes::Philox reads the step there; NULL: step 0) */
    }
  if (!a.a || !a.b || !a.d) return refuse(p, gi, "no device memory for A, B or D");
  if (!aligned) return refuse(p, gi, "a tensor is not 16-byte aligned");
  int rc = f(&a);
  if (rc != EVT_LAUNCH_OK) {
    char why[200];
    snprintf(why, sizeof why, "the launcher returned %d: %s", rc, evt_gemm_launch_status_name(rc));
    return refuse(p, gi, why);
  }
  return true;
}

void evt_gemm_kernels_counts(const evt_gemm_kernels *gk, int *wanted, int *loaded) {
  *wanted = gk ? gk->wanted : 0;
  *loaded = gk ? gk->loaded : 0;
}

void evt_gemm_kernels_free(evt_gemm_kernels *gk) {
  if (!gk) return;
  free(gk->fn);
  free(gk);
}
