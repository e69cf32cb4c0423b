/* `evtc prefetch FILE... [--only gemm|rows] [--list]`: JIT-compiles, in one parallel batch, every generated
 * kernel that `evtc run FILE --device cuda --fused` would compile for each FILE, so that later runs find
 * them in the JIT cache (src/runtime/jit/jit.h: $EVT_CACHE_DIR/jit, EVT_JIT_JOBS).
 *
 * Per FILE exactly what run does before it JIT-compiles: parse, joint graph, the pass pipeline once,
 * evt_program_create_host(EVT_PROGRAM_FUSED | EVT_PROGRAM_NO_OPT) (partition, lowering, tune records,
 * bindings); then per plan kernel the same source (evt_emit_cutlass for GEMM+EVT kernels, evt_emit_rows for
 * row / pointwise kernels) with the same JIT options (default; no_cutlass for rows), so the cache keys match.
 * Kernels are deduplicated across files by name (the name is the spec's hash). Two batches, one per option
 * set: CUTLASS GEMM kernels (~35-50 s of one core each), then row kernels (~2-10 s); `--only` picks one, so
 * a script can run both at once in two processes. Files are taken in the order given (kernels of earlier
 * files are queued first). --list prints the kernels (name, kind, the files using them) without compiling.
 * Exit: 0 all compiled (or cached), 1 a file failed to load / plan or a kernel failed to compile (named),
 * 2 internal error. Needs no GPU (nvcc and CUTLASS for the GEMM batch). */
#include "cli.h"
#include "passes/passes.h"
#include "compile/compile.h"
#include "runtime/gpu/exec_plan.h"
#include "runtime/jit/jit.h"
#include "compile/train.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *base_name(const char *path) {
  const char *s = strrchr(path, '/');
  return s ? s + 1 : path;
}

/* The plan of one file as `evtc run --fused` builds it; its kernels into ks. false (message printed) on error. */
static bool plan_file(const char *path, const evt_options *po, evt_pf_kernel **ks, int *n, int *cap, int *bad_kernels) {
  char *perr = NULL;
  evt_graph *g = evt_parse_file(path, &perr);
  if (!g) {
    fprintf(stderr, "%s\n", perr ? perr : "evtc prefetch: cannot read the file");
    free(perr);
    return false;
  }
  evt_status st = evt_train_ensure_joint(g, NULL);
  if (st == EVT_OK) st = evt_passes_run_all(g, 0, 0);
  evt_program *p = NULL;
  if (st == EVT_OK) st = evt_program_create_host_opts(g, po, &p);
  if (st != EVT_OK) {
    fprintf(stderr, "evtc prefetch: %s: %s\n", path, evt_graph_error(g));
    evt_graph_free(g);
    return false;
  }
  const evt_exec_plan *xp = p->xp;
  int ng = 0, nc = 0, nr = 0; /* CUTLASS GEMM, CUTLASS conv (compiled in the GEMM batch), row kernels */
  for (int k = 0; k < xp->nkernels; k++) (xp->gspec[k] ? xp->gspec[k]->conv.kind ? &nc : &ng : &nr)[0]++;
  char err[512];
  int bad = evt_prefetch_collect(xp, base_name(path), ks, n, cap, err, sizeof err);
  if (bad) fprintf(stderr, "evtc prefetch: %s: %d kernel(s) cannot be emitted: %s\n", path, bad, err);
  *bad_kernels += bad;
  char conv[48] = ""; /* (graphs without convolutions keep their line) */
  if (nc) snprintf(conv, sizeof conv, " %d CONV+EVT kernels,", nc);
  printf("%s: %d groups, %d fused: %d GEMM+EVT kernels,%s %d row kernels\n", path, xp->ngroups, p->groups_fused, ng, conv, nr);
  evt_program_destroy(p);
  evt_graph_free(g);
  return true;
}

EVTC_COMMAND(prefetch, "FILE... [--arch ARCH] [--only gemm|rows] [--list]",
             "JIT-compile in one parallel batch the generated kernels that `evtc run FILE --device cuda --fused`\n"
             "would compile for every FILE (deduplicated; results in the JIT cache, $EVT_CACHE_DIR/jit; EVT_JIT_JOBS\n"
             "compiles at a time). CUTLASS GEMM kernels first, then row / pointwise kernels.\n"
             "  --arch ARCH   the GPU target, as evtc run --arch (default: the present GPU's, else sm_90a)\n"
             "  --only gemm   only the CUTLASS GEMM+EVT (and CONV+EVT) kernels\n"
             "  --only rows   only the row / pointwise kernels\n"
             "  --list        list the kernels (name, kind, the files that use them) without compiling") {
  int only = -1; /* -1 both, 1 gemm, 0 rows */
  bool list = false;
  const char **files = calloc((size_t)argc + 1, sizeof *files);
  if (!files) evt_fatal(__FILE__, __LINE__, "out of memory");
  int nf = 0;
  evt_options po; /* what `evtc run --fused` creates: fused, the passes already run */
  evt_options_init(&po);
  po.flags = EVT_PROGRAM_FUSED | EVT_PROGRAM_NO_OPT;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--list")) {
      list = true;
    } else if (!strcmp(argv[i], "--arch") && i + 1 < argc) {
      if (evt_arch_parse(argv[++i], &po.arch, &po.ptx) != EVT_OK) {
        fprintf(stderr, "evtc prefetch: --arch takes sm_80, sm_86, sm_89, sm_90a or compute_XX, not '%s'\n", argv[i]);
        free(files);
        return EVTC_EXIT_USER;
      }
    } else if (!strcmp(argv[i], "--only") && i + 1 < argc && (!strcmp(argv[i + 1], "gemm") || !strcmp(argv[i + 1], "rows"))) {
      only = !strcmp(argv[++i], "gemm");
    } else if (argv[i][0] == '-' && argv[i][1]) {
      fprintf(stderr, "evtc prefetch: unknown or incomplete option %s\nusage: evtc prefetch FILE... [--only gemm|rows] [--list]\n",
              argv[i]);
      free(files);
      return EVTC_EXIT_USER;
    } else {
      files[nf++] = argv[i];
    }
  }
  if (!nf) {
    fprintf(stderr, "usage: evtc prefetch FILE... [--only gemm|rows] [--list]\n");
    free(files);
    return EVTC_EXIT_USER;
  }
  evt_pf_kernel *ks = NULL;
  int n = 0, cap = 0, bad = 0, badfiles = 0;
  for (int f = 0; f < nf; f++)
    if (!plan_file(files[f], &po, &ks, &n, &cap, &bad)) badfiles++;
  int ngemm = 0, nconv = 0;
  for (int i = 0; i < n; i++) ngemm += ks[i].gemm && !ks[i].conv, nconv += ks[i].conv;
  char conv[32] = "";
  if (nconv) snprintf(conv, sizeof conv, " %d CONV+EVT,", nconv);
  printf("prefetch: %d files, %d distinct kernels: %d GEMM+EVT,%s %d row\n", nf, n, ngemm, conv, n - ngemm - nconv);
  int failed = 0;
  if (list) {
    for (int i = 0; i < n; i++)
      if (only < 0 || only == ks[i].gemm) printf("%s %s: %s\n", ks[i].name, ks[i].conv ? "conv" : ks[i].gemm ? "gemm" : "row", ks[i].users);
  } else {
    if (only != 0) failed += evt_prefetch_compile(ks, n, 1, stderr);
    if (only != 1) failed += evt_prefetch_compile(ks, n, 0, stderr);
    printf("prefetch: %d failed\n", failed);
  }
  evt_prefetch_free(ks, n);
  free(files);
  return failed || bad || badfiles ? EVTC_EXIT_USER : EVTC_EXIT_OK;
}
