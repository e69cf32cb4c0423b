/* The generated kernels of a fused plan: emitted and JIT-compiled in two parallel batches (row / pointwise
 * kernels without CUTLASS, GEMM+EVT kernels with it), contract in compile.h. */
#include <stdlib.h>
#include <string.h>

#include "codegen/kspec.h"
#include "codegen/rspec.h"
#include "compile/compile.h"
#include "runtime/jit/jit.h"

/* Emits and compiles the kernels of one kind (gemm: xp->gspec[k] set, else xp->kspec[k]); so[k] gets the
 * compiled object's path; kernels that fail to emit, compile or find nvcc / CUTLASS demote their groups. */
static void compile_kind(evt_exec_plan *xp, bool gemm, char **so) {
  int nk = xp->nkernels;
  evt_jit_job *jobs = calloc((size_t)nk + 1, sizeof *jobs);
  char **src = calloc((size_t)nk + 1, sizeof *src);
  int njobs = 0, *job_of = calloc((size_t)nk + 1, sizeof *job_of);
  if (!jobs || !src || !job_of) evt_fatal(__FILE__, __LINE__, "out of memory");
  char msg[1024];
  for (int k = 0; k < nk; k++) {
    job_of[k] = -1;
    if (gemm ? !xp->gspec[k] : !xp->kspec[k]) continue;
    src[k] = gemm ? evt_emit_cutlass(xp->gspec[k], msg, sizeof msg) : evt_emit_rows(xp->kspec[k], msg, sizeof msg);
    if (!src[k]) {
      evt_exec_plan_demote(xp, k, msg);
      continue;
    }
    jobs[njobs].name = xp->kname[k];
    jobs[njobs].source = src[k];
    job_of[k] = njobs++;
  }
  evt_jit_options jo = {0}; /* evtc compile --build's options for GEMMs: one cache entry for both */
  jo.no_cutlass = !gemm;
  jo.arch = xp->arch;
  jo.ptx = xp->ptx;
  msg[0] = 0;
  evt_status js = njobs ? evt_jit_compile(jobs, njobs, &jo, msg, sizeof msg) : EVT_OK;
  for (int k = 0; k < nk; k++) {
    int j = job_of[k];
    if (j < 0) continue;
    if (js != EVT_OK && js != EVT_ERR_INVALID) /* no nvcc / CUTLASS / cache dir: nothing compiled */
      evt_exec_plan_demote(xp, k, msg[0] ? msg : "the JIT failed");
    else if (!jobs[j].ok)
      evt_exec_plan_demote(xp, k, jobs[j].error[0] ? jobs[j].error : "failed to compile");
    else if (!(so[k] = strdup(jobs[j].so_path)))
      evt_fatal(__FILE__, __LINE__, "out of memory");
  }
  for (int k = 0; k < nk; k++) free(src[k]);
  free(src);
  free(jobs);
  free(job_of);
}

char **evt_compile_kernels(evt_exec_plan *xp) {
  char **so = calloc((size_t)xp->nkernels + 1, sizeof *so);
  if (!so) evt_fatal(__FILE__, __LINE__, "out of memory");
  compile_kind(xp, false, so);
  compile_kind(xp, true, so);
  return so;
}

void evt_compile_kernels_free(char **so, int n) {
  if (!so) return;
  for (int k = 0; k < n; k++) free(so[k]);
  free(so);
}
