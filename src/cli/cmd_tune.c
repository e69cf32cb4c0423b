/* `evtc tune FILE`: measure every GEMM+EVT kernel of a training step on the GPU and record, per kernel and
 * shape, the fastest mainloop configuration or "unfused" (src/tune/tune.h).
 *
 * The graph is prepared exactly as `evtc run --fused` prepares it (joint graph, passes, the fused execution
 * plan: partition with the lowering's rules, lowering, binding), so the records written are the ones the
 * fused runtime and `evtc compile` read back. Every GEMM group that binds (or that an earlier record sent
 * to the unfused path) is a problem; equal epilogues of equal shape are tuned once. Prints one line per
 * problem and a summary. Without nvcc, CUTLASS or a GPU nothing is measured or written: the message says
 * so, every GEMM group keeps the default config, exit 1. */
#include "cli.h"
#include "codegen/lower.h"
#include "passes/passes.h"
#include "compile/compile.h"
#include "tune/tune.h"
#include "compile/train.h"

#include <stdlib.h>
#include <string.h>

EVTC_COMMAND(tune, "FILE [--dtype bf16|f16] [--max-configs N] [--reps N] [--jobs N] [--force] [--compile-only] [--cache DIR]",
             "tune every GEMM+EVT kernel of FILE's training step on the GPU: time the candidate mainloop configs\n"
             "(tile, cluster, schedule, stages, sum strategy) x tile-scheduler swizzles and the unfused alternative\n"
             "(cuBLASLt + a row kernel), keep the fastest; records go to <JIT cache>/tune (read by evtc compile\n"
             "and evtc run --fused)\n"
             "  --dtype bf16|f16  read every f32 tensor of FILE as that type first (as evtc compile --dtype)\n"
             "  --max-configs N   compile at most N candidate configs per kernel (default: all, ~10)\n"
             "  --reps N          timed calls per candidate, median (default 30, at least 20)\n"
             "  --jobs N          parallel nvcc (default $EVT_JIT_JOBS or the CPU count)\n"
             "  --force           measure again even where a record exists\n"
             "  --compile-only    only JIT-compile the candidates (into the JIT cache) and stop: nothing measured\n"
             "  --cache DIR       the cache directory (default: $EVT_CACHE_DIR, docs/config.md)") {
  const char *path = NULL, *cache = NULL;
  int dtype = -1;
  evt_tune_options o = {0};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--force")) o.force = 1;
    else if (!strcmp(a, "--compile-only")) o.compile_only = 1;
    else if ((!strcmp(a, "--max-configs") || !strcmp(a, "--reps") || !strcmp(a, "--jobs")) && i + 1 < argc) {
      long v;
      if (!evtc_parse_long("tune", a, argv[++i], 0, 100000, &v)) return EVTC_EXIT_USER;
      *(!strcmp(a, "--max-configs") ? &o.max_configs : !strcmp(a, "--reps") ? &o.reps : &o.jobs) = (int)v;
    }
    else if (!strcmp(a, "--cache") && i + 1 < argc) cache = argv[++i];
    else if (!strcmp(a, "--dtype") && i + 1 < argc) {
      if (!evtc_parse_dtype16("tune", argv[++i], &dtype)) return EVTC_EXIT_USER;
    } else if (a[0] == '-' && a[1]) {
      fprintf(stderr, "evtc tune: unknown or incomplete flag '%s'\n", a);
      return EVTC_EXIT_USER;
    } else if (path) {
      fprintf(stderr, "evtc tune: more than one file ('%s' and '%s')\n", path, a);
      return EVTC_EXIT_USER;
    } else {
      path = a;
    }
  }
  if (!path) {
    fprintf(stderr, "usage: evtc tune FILE [--dtype bf16|f16] [--max-configs N] [--reps N] [--force] [--cache DIR]\n");
    return EVTC_EXIT_USER;
  }
  o.cache_dir = cache;
  char *err = NULL;
  evt_graph *g = evt_parse_file(path, &err);
  if (!g) {
    fprintf(stderr, "%s\n", err ? err : "cannot parse");
    free(err);
    return EVTC_EXIT_USER;
  }
  bool built = false;
  evt_status st = dtype >= 0 ? evt_lower_retype(g, (evt_dtype)dtype) : EVT_OK;
  if (st == EVT_OK && g->loss >= 0) st = evt_train_ensure_joint(g, &built);
  if (st == EVT_OK) st = evt_passes_run_all(g, 0, 0);
  evt_exec_plan p;
  bool have = false;
  if (st == EVT_OK) {
    st = evt_exec_plan_build(g, NULL, &p);
    have = st == EVT_OK;
  }
  if (st != EVT_OK) {
    fprintf(stderr, "%s\n", evt_graph_error(g));
    evt_graph_free(g);
    return evtc_exit_code(st);
  }
  int *want = calloc((size_t)p.low.n + 1, sizeof *want), *prob_of = calloc((size_t)p.low.n + 1, sizeof *prob_of);
  EVT_ASSERT(want && prob_of);
  for (int gi = 0; gi < p.ngroups; gi++)
    want[gi] = p.groups[gi].kind == EVT_LK_GEMM_EVT && (p.groups[gi].fused || p.groups[gi].tuned == EVT_TUNE_UNFUSED);
  evt_tune_problem *probs = NULL;
  int np = evt_tune_collect(&p.low, want, &probs, prob_of);
  int rc = EVTC_EXIT_OK;
  int ng = 0;
  for (int gi = 0; gi < p.ngroups; gi++) ng += want[gi];
  printf("gemm+evt groups to tune: %d (%d distinct kernel/shape problems)\n", ng, np);
  fflush(stdout); /* before the tuner's progress lines on stderr */
  if (np > 0) {
    evt_tune_record *rec = calloc((size_t)np, sizeof *rec);
    evt_status *sts = calloc((size_t)np, sizeof *sts);
    EVT_ASSERT(rec && sts);
    char msg[1024] = "";
    st = evt_tune_run_many(probs, np, &o, rec, sts, msg, sizeof msg);
    int nf = 0, nu = 0;
    for (int i = 0; i < np; i++) {
      char name[40], line[300];
      evt_kspec_kernel_name(&probs[i].spec, name);
      if (sts[i] != EVT_OK) {
        printf("  %s %lldx%lldx%lld: not tuned (default config)\n", name, (long long)probs[i].m, (long long)probs[i].n,
               (long long)probs[i].k);
        continue;
      }
      evt_tune_describe(&rec[i], rec[i].choice, &probs[i].spec, line, sizeof line);
      printf("  %s %lldx%lldx%lld: %s; check %.1e\n", name, (long long)probs[i].m, (long long)probs[i].n,
             (long long)probs[i].k, line, rec[i].check_err);
      nf += rec[i].choice == EVT_TUNE_FUSED;
      nu += rec[i].choice == EVT_TUNE_UNFUSED;
    }
    if (o.compile_only) {
      printf("compile only: %s\n", st == EVT_OK ? "every candidate compiled (JIT cache)" : msg);
      rc = st == EVT_OK ? EVTC_EXIT_OK : evtc_exit_code(st);
    } else if (st != EVT_OK) {
      fprintf(stderr, "evtc tune: %s\nevtc tune: the GEMM groups above that are not tuned keep the default config\n",
              msg);
      rc = evtc_exit_code(st);
    }
    char dir[1024];
    evt_tune_dir(cache, dir, sizeof dir);
    printf("tuned: %d fused, %d unfused, %d not tuned; records in %s\n", nf, nu, np - nf - nu, dir);
    free(rec);
    free(sts);
  }
  free(probs);
  free(want);
  free(prob_of);
  if (have) evt_exec_plan_free(&p);
  evt_graph_free(g);
  (void)built;
  return rc;
}
