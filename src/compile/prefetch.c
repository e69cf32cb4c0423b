/* Kernel prefetch: the generated kernels of many fused plans JIT-compiled in one parallel batch (contract in
 * cuda.h, evt_prefetch_*; public entry evt_program_prefetch in include/evt.h; `evtc prefetch` uses it too).
 * Also evt_program_tune (include/evt.h): the autotuner over every GEMM group of many plans, before their
 * creation, for the torch backend's option {"tune": N}.
 *
 * Why: evt_program_create compiles the kernels of its own plan, one graph at a time; a training step split
 * into many graphs (the torch backend's segments around PyTorch ops) would compile one batch per graph, each
 * as slow as its slowest CUTLASS kernel. Prefetching every graph's kernels first costs one batch.
 * Same sources and the same JIT options as the creation (CUTLASS GEMM kernels with default options, row /
 * pointwise kernels with no_cutlass), so the creation's cache keys match. */
#include "compile/compile.h"
#include "runtime/gpu/exec_plan.h"
#include "runtime/jit/jit.h"
#include "tune/tune.h"

#include <stdlib.h>
#include <string.h>

int evt_prefetch_collect(const evt_exec_plan *xp, const char *label, evt_pf_kernel **ks, int *n, int *cap, char *err,
                         size_t errlen) {
  int bad = 0;
  for (int k = 0; k < xp->nkernels; k++) {
    int i = 0;
    while (i < *n && strcmp((*ks)[i].name, xp->kname[k])) i++;
    if (i < *n) { /* already listed: note the user */
      size_t len = strlen((*ks)[i].users);
      snprintf((*ks)[i].users + len, sizeof (*ks)[i].users - len, " %s", label);
      continue;
    }
    char *src = xp->gspec[k] ? evt_emit_cutlass(xp->gspec[k], err, errlen) : evt_emit_rows(xp->kspec[k], err, errlen);
    if (!src) {
      bad++;
      continue;
    }
    if (*n == *cap) {
      *cap = *cap ? 2 * *cap : 64;
      evt_pf_kernel *bigger = realloc(*ks, sizeof **ks * (size_t)*cap);
      if (!bigger) evt_fatal(__FILE__, __LINE__, "out of memory");
      *ks = bigger;
    }
    evt_pf_kernel *K = &(*ks)[(*n)++];
    memset(K, 0, sizeof *K);
    snprintf(K->name, sizeof K->name, "%s", xp->kname[k]);
    K->gemm = xp->gspec[k] != NULL;
    K->conv = K->gemm && xp->gspec[k]->conv.kind != EVT_CONV_NONE;
    K->arch = xp->arch;
    K->ptx = xp->ptx;
    K->source = src;
    snprintf(K->users, sizeof K->users, "%s", label);
  }
  return bad;
}

/* The kernels of one kind and target (arch, ptx) as one JIT batch; returns how many failed. */
static int compile_batch(evt_pf_kernel *ks, int n, int gemm, int arch, int ptx, FILE *errs) {
  evt_jit_job *jobs = calloc((size_t)n + 1, sizeof *jobs);
  if (!jobs) evt_fatal(__FILE__, __LINE__, "out of memory");
  int nj = 0;
  for (int i = 0; i < n; i++)
    if (ks[i].gemm == gemm && ks[i].arch == arch && ks[i].ptx == ptx) jobs[nj].name = ks[i].name, jobs[nj++].source = ks[i].source;
  int failed = 0;
  if (nj) {
    evt_jit_options jo = {0};
    jo.no_cutlass = !gemm;
    jo.arch = arch;
    jo.ptx = ptx;
    char msg[1024] = "";
    evt_status st = evt_jit_compile(jobs, nj, &jo, msg, sizeof msg);
    if (st != EVT_OK && st != EVT_ERR_INVALID) {
      if (errs) fprintf(errs, "evt prefetch: %s kernels: %s\n", gemm ? "GEMM" : "row", msg);
      failed = nj;
    } else {
      for (int j = 0; j < nj; j++)
        if (!jobs[j].ok) {
          if (errs) fprintf(errs, "evt prefetch: %s\n", jobs[j].error);
          failed++;
        }
    }
  }
  free(jobs);
  return failed;
}

int evt_prefetch_compile(evt_pf_kernel *ks, int n, int gemm, FILE *errs) {
  int failed = 0;
  for (int i = 0; i < n; i++) { /* one batch per target, at its first kernel */
    bool first = ks[i].gemm == gemm;
    for (int j = 0; j < i && first; j++) first = !(ks[j].gemm == gemm && ks[j].arch == ks[i].arch && ks[j].ptx == ks[i].ptx);
    if (first) failed += compile_batch(ks, n, gemm, ks[i].arch, ks[i].ptx, errs);
  }
  return failed;
}

void evt_prefetch_free(evt_pf_kernel *ks, int n) {
  for (int i = 0; i < n; i++) free(ks[i].source);
  free(ks);
}

int evt_program_prefetch(evt_graph *const *graphs, int n, unsigned flags) {
  evt_options o;
  evt_options_init(&o);
  o.flags = flags;
  return evt_program_prefetch_opts(graphs, n, &o);
}

int evt_program_prefetch_opts(evt_graph *const *graphs, int n, const evt_options *o) {
  if (!o || !(o->flags & EVT_PROGRAM_FUSED) || n <= 0 || !graphs) return 0;
  evt_pf_kernel *ks = NULL;
  int nk = 0, cap = 0;
  for (int i = 0; i < n; i++) {
    evt_program *p = NULL;
    if (!graphs[i] || evt_program_create_host_opts(graphs[i], o, &p) != EVT_OK) {
      evt_program_destroy(p); /* (its creation will report the problem) */
      continue;
    }
    char label[24], err[512];
    snprintf(label, sizeof label, "graph%d", i);
    evt_prefetch_collect(p->xp, label, &ks, &nk, &cap, err, sizeof err);
    evt_program_destroy(p);
  }
  /* both batches at once would oversubscribe the cores: CUTLASS first (the long pole), then the rows */
  int failed = evt_prefetch_compile(ks, nk, 1, NULL) + evt_prefetch_compile(ks, nk, 0, NULL);
  evt_prefetch_free(ks, nk);
  return nk - failed;
}

/* ---- evt_program_tune: the autotuner over every GEMM group of many plans (include/evt.h) -------------- */

evt_status evt_program_tune(evt_graph *const *graphs, int n, unsigned flags, int max_configs, int *nproblems,
                            char *msg, size_t msglen) {
  evt_options o;
  evt_options_init(&o);
  o.flags = flags;
  return evt_program_tune_opts(graphs, n, &o, max_configs, nproblems, msg, msglen);
}

evt_status evt_program_tune_opts(evt_graph *const *graphs, int n, const evt_options *o, int max_configs,
                                 int *nproblems, char *msg, size_t msglen) {
  if (nproblems) *nproblems = 0;
  if (msg && msglen) msg[0] = 0;
  if (!o || !(o->flags & EVT_PROGRAM_FUSED) || n <= 0 || !graphs) return EVT_OK;
  evt_tune_problem *all = NULL;
  int np = 0, cap = 0;
  for (int i = 0; i < n; i++) {
    evt_program *p = NULL;
    if (!graphs[i] || evt_program_create_host_opts(graphs[i], o, &p) != EVT_OK) {
      evt_program_destroy(p); /* (its creation will report the problem) */
      continue;
    }
    const evt_exec_plan *xp = p->xp;
    int *want = calloc((size_t)xp->ngroups + 1, sizeof *want);
    EVT_ASSERT(want);
    /* the groups the fused runtime runs as GEMMs (generated or cuBLAS), and those a record sent unfused; at one
     * config (the backend's default tuning) not those a rule already runs unfused untuned (few output tiles for
     * a long K: the generated kernel has no split-K, so it loses by far, and compiling and timing it costs
     * minutes) */
    for (int gi = 0; gi < xp->ngroups; gi++) {
      const evt_group_exec *x = &xp->groups[gi];
      want[gi] = x->kind == EVT_LK_GEMM_EVT && (x->fused || x->tuned == EVT_TUNE_UNFUSED) &&
                 !(max_configs == 1 && x->unf && x->tuned == EVT_TUNE_NONE);
    }
    evt_tune_problem *mine = NULL;
    int nm = evt_tune_collect(&xp->low, want, &mine, NULL);
    for (int j = 0; j < nm; j++) { /* distinct (epilogue, shape) across the graphs */
      uint64_t h = evt_kspec_epilogue_hash(&mine[j].spec);
      bool seen = false;
      for (int k = 0; k < np && !seen; k++)
        seen = evt_kspec_epilogue_hash(&all[k].spec) == h && all[k].m == mine[j].m && all[k].n == mine[j].n &&
               all[k].k == mine[j].k;
      if (seen) continue;
      if (np == cap) {
        cap = cap ? 2 * cap : 16;
        all = realloc(all, sizeof *all * (size_t)cap);
        EVT_ASSERT(all);
      }
      all[np++] = mine[j];
    }
    free(mine);
    free(want);
    evt_program_destroy(p);
  }
  if (nproblems) *nproblems = np;
  evt_status st = EVT_OK;
  if (np > 0) {
    evt_tune_options to = {0};
    to.max_configs = max_configs;
    evt_tune_record *rec = calloc((size_t)np, sizeof *rec);
    EVT_ASSERT(rec);
    char tmp[1024] = "";
    st = evt_tune_run_many(all, np, &to, rec, NULL, tmp, sizeof tmp);
    if (st != EVT_OK && msg && msglen) snprintf(msg, msglen, "%s", tmp);
    free(rec);
  }
  free(all);
  return st;
}
