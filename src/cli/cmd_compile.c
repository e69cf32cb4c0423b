/* `evtc compile FILE -o DIR [--emit-cuda] [--stats] [--build]`: the whole compiler front to back without a
 * GPU. A graph with a loss and no gradient outputs becomes the joint graph; then the graph passes, the
 * partitioner, the lowering of every group to a kernel spec (src/codegen/lower*.c) and the runtime plan
 * (src/compile/launch_plan.c). Writes DIR/plan.txt (lowering per group, launches, buffers with arena offsets,
 * bindings); --emit-cuda also writes DIR/<kernel>.cu for every distinct lowered kernel (each marked
 * GENERATED); --stats prints kernels by kind, the unlowered groups with their reasons, arena bytes and
 * bytes through global memory; --build compiles the emitted kernels with the JIT (needs nvcc + CUTLASS;
 * minutes per kernel). --dtype bf16|f16 reads every f32 tensor of FILE as that type first (the examples
 * are f32 and the kernel spec takes 16-bit operands). Exit codes: 0 ok, 1 user error, 2 internal error
 * (a plan that fails its own check). */
#include "cli.h"
#include "codegen/lower.h"
#include "partition/partition.h"
#include "passes/passes.h"
#include "compile/compile.h"
#include "runtime/jit/jit.h"
#include "compile/launch_plan.h"
#include "tune/tune.h"
#include "compile/train.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static int write_file(const char *dir, const char *name, const char *text) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, "evtc compile: cannot write '%s': %s\n", path, strerror(errno));
    return -1;
  }
  fputs(text, f);
  fclose(f);
  return 0;
}

EVTC_COMMAND(compile, "FILE -o DIR [--arch ARCH] [--emit-cuda] [--stats] [--build] [--tune] [--tune-cache DIR] [--dtype bf16|f16] [--solver=ilp|greedy] [--no-cache] [--fuse-rules=lower] [--fp8] [--tf32]",
             "optimize, partition, lower every group to a kernel spec, plan memory; write DIR/plan.txt\n"
             "  -o DIR           output folder (created if missing)\n"
             "  --arch ARCH      GPU target of the kernels: sm_80, sm_86, sm_89 (Ampere / Ada), sm_90a, compute_XX (PTX\n"
             "                   only); default: the present GPU's, else sm_90a\n"
             "  --emit-cuda      also write DIR/<kernel>.cu for every distinct lowered kernel (generated CUDA C++)\n"
             "  --stats          print kernels by kind (gemm+evt / row / pointwise / unfused, with reasons),\n"
             "                   distinct kernels, arena bytes vs the sum of buffers, bytes through global memory\n"
             "  --build          JIT-compile the emitted kernels with nvcc (needs nvcc and CUTLASS; minutes each)\n"
             "  --tune           first tune every lowered GEMM+EVT kernel on the GPU (as evtc tune; needs nvcc, CUTLASS\n"
             "                   and a GPU; without them every GEMM keeps the default config). Tuning records found\n"
             "                   are always applied: a GEMM group gets its tuned config, or runs unfused\n"
             "  --tune-cache DIR where tuning records live (default: $EVT_CACHE_DIR, docs/config.md)\n"
             "  --dtype bf16|f16 read every f32 tensor of FILE as bf16/f16 (kernel specs take 16-bit operands)\n"
             "  --solver=greedy  partition greedily instead of exactly\n"
             "  --no-cache       do not read or write the partition cache\n"
             "  --fp8            run the fp8 pass (evt_options.fp8): eligible GEMMs in FP8; fp8 casts, amax and\n"
             "                   K-major fp8 GEMMs lower (docs/codegen.md \"FP8\"), the rest is refused by node\n"
             "  --tf32           GEMMs of f32 operands lower onto TF32 tensor cores (evt_options.tf32; docs/codegen.md\n"
             "                   \"TF32\": sm_90a, layout NT); default: exact f32, such GEMMs stay unfused\n"
             "  --fuse-rules=lower  partition with the lowering's rules (evt_lower_compat): a GEMM group only takes\n"
             "                   members its kernel spec can hold; default --fuse-rules=shape (the partitioner's own)") {
  const char *path = NULL, *dir = NULL;
  int emit = 0, stats = 0, build = 0, lower_rules = 0, tune = 0;
  const char *tune_cache = NULL;
  int dtype = -1;
  evt_options ao; /* the GPU target (--arch) */
  evt_options_init(&ao);
  evt_part_options opt = evt_part_options_default();
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--emit-cuda")) emit = 1;
    else if (!strcmp(a, "--stats")) stats = 1;
    else if (!strcmp(a, "--build")) build = emit = 1;
    else if (!strcmp(a, "--no-cache")) opt.use_cache = 0;
    else if (!strcmp(a, "--arch") && i + 1 < argc) {
      if (evt_arch_parse(argv[++i], &ao.arch, &ao.ptx) != EVT_OK) {
        fprintf(stderr, "evtc compile: --arch takes sm_80, sm_86, sm_89, sm_90a or compute_XX, not '%s'\n", argv[i]);
        return EVTC_EXIT_USER;
      }
    }
    else if (!strcmp(a, "--tune")) tune = 1;
    else if (!strcmp(a, "--fp8")) ao.fp8 = EVT_FP8_TENSORWISE;
    else if (!strcmp(a, "--tf32")) ao.tf32 = 1;
    else if (!strcmp(a, "--tune-cache") && i + 1 < argc) tune_cache = argv[++i];
    else if (!strcmp(a, "--fuse-rules=lower")) lower_rules = 1;
    else if (!strcmp(a, "--fuse-rules=shape")) lower_rules = 0;
    else if (!strcmp(a, "--solver=ilp")) opt.use_ilp = 1;
    else if (!strcmp(a, "--solver=greedy")) opt.use_ilp = 0;
    else if (!strcmp(a, "-o") && i + 1 < argc) dir = argv[++i];
    else if (!strcmp(a, "--dtype") && i + 1 < argc) {
      if (!evtc_parse_dtype16("compile", argv[++i], &dtype)) return EVTC_EXIT_USER;
    } else if (a[0] == '-' && a[1]) {
      fprintf(stderr, "evtc compile: unknown or incomplete flag '%s'\n", a);
      return EVTC_EXIT_USER;
    } else if (path) {
      fprintf(stderr, "evtc compile: more than one file ('%s' and '%s')\n", path, a);
      return EVTC_EXIT_USER;
    } else {
      path = a;
    }
  }
  if (!path || !dir) {
    fprintf(stderr, "usage: evtc compile FILE -o DIR [--emit-cuda] [--stats] [--build] [--dtype bf16|f16]\n");
    return EVTC_EXIT_USER;
  }
  if (evt_mkdirs(dir, 0777) != 0) {
    fprintf(stderr, "evtc compile: cannot create '%s': %s\n", dir, strerror(errno));
    return EVTC_EXIT_USER;
  }
  char *err = NULL;
  evt_graph *g = evt_parse_file(path, &err);
  if (!g) {
    fprintf(stderr, "%s\n", err ? err : "cannot parse");
    free(err);
    return EVTC_EXIT_USER;
  }
  bool built = false;
  evt_status st = dtype >= 0 ? evt_lower_retype(g, (evt_dtype)dtype) : EVT_OK;
  if (st == EVT_OK && g->loss >= 0) st = evt_train_ensure_joint(g, &built); /* a forward-only graph stays as it is */
  if (st == EVT_OK) st = evt_passes_run_all(g, evt_compile_pass_flags(&ao), 0);
  evt_part_plan part;
  bool have_part = false;
  if (st == EVT_OK) {
    st = lower_rules ? evt_lower_partition_flags(g, &opt, EVT_PART_LAMBDA_DEFAULT, evt_lower_flags(&ao), &part)
                     : evt_part_plan_build(g, &opt, EVT_PART_LAMBDA_DEFAULT, &part);
    have_part = st == EVT_OK;
  }
  if (st != EVT_OK) {
    fprintf(stderr, "%s\n", evt_graph_error(g));
    evt_graph_free(g);
    return evtc_exit_code(st);
  }
  int rc = EVTC_EXIT_OK;
  evt_lower_result low;
  evt_plan plan;
  memset(&plan, 0, sizeof plan);
  st = evt_lower_plan_flags(g, &part, evt_lower_flags(&ao), &low);
  int arch = 90, ptx = 0;
  evt_compile_target(&ao, &arch, &ptx);
  if (st == EVT_OK) evt_lower_retarget(g, part.group, &low, arch);
  evt_tune_group *tg = calloc((size_t)(st == EVT_OK ? low.n : 0) + 1, sizeof *tg);
  EVT_ASSERT(tg);
  if (st == EVT_OK && tune) {
    evt_tune_problem *probs = NULL;
    int np = evt_tune_collect(&low, NULL, &probs, NULL);
    evt_tune_record *rec = calloc((size_t)np + 1, sizeof *rec);
    EVT_ASSERT(rec);
    evt_tune_options to = {0};
    to.cache_dir = tune_cache;
    char tmsg[1024] = "";
    if (np > 0 && evt_tune_run_many(probs, np, &to, rec, NULL, tmsg, sizeof tmsg) != EVT_OK)
      fprintf(stderr, "evtc compile: --tune: %s; GEMM groups without a record keep the default config\n", tmsg);
    free(rec);
    free(probs);
  }
  int ntuned = st == EVT_OK ? evt_tune_apply_lowered(&low, tune_cache, NULL, tg) : 0;
  if (st == EVT_OK) st = evt_plan_build(g, &part, &low, &plan);
  char msg[512];
  if (st == EVT_OK && evt_plan_check(g, &plan, msg, sizeof msg) != EVT_OK) {
    fprintf(stderr, "evtc compile: internal error: %s\n", msg);
    rc = EVTC_EXIT_INTERNAL;
  } else if (st != EVT_OK) {
    fprintf(stderr, "evtc compile: internal error: the lowering does not match the partition\n");
    rc = EVTC_EXIT_INTERNAL;
  }
  /* distinct kernels (equal specs share one compiled kernel) */
  int nk = 0, *uniq = calloc((size_t)low.n + 1, sizeof *uniq);
  EVT_ASSERT(uniq);
  for (int i = 0; i < low.n; i++) {
    if (!low.k[i].ok) continue;
    bool seen = false;
    for (int j = 0; j < nk && !seen; j++) seen = !strcmp(low.k[uniq[j]].kernel, low.k[i].kernel);
    if (!seen) uniq[nk++] = i;
  }
  if (rc == EVTC_EXIT_OK) {
    char ppath[4096];
    snprintf(ppath, sizeof ppath, "%s/plan.txt", dir);
    FILE *f = fopen(ppath, "w");
    if (!f) {
      fprintf(stderr, "evtc compile: cannot write '%s': %s\n", ppath, strerror(errno));
      rc = EVTC_EXIT_USER;
    } else {
      fprintf(f, "# generated by evtc compile %s\n\nlowering:\n", path);
      evt_lower_print(g, &low, f);
      fprintf(f, "\n");
      evt_plan_print(g, &plan, f);
      fclose(f);
    }
  }
  evt_jit_job *jobs = calloc((size_t)nk + 1, sizeof *jobs);
  char **srcs = calloc((size_t)nk + 1, sizeof *srcs);
  EVT_ASSERT(jobs && srcs);
  for (int j = 0; j < nk && rc == EVTC_EXIT_OK && emit; j++) {
    const evt_lowered *K = &low.k[uniq[j]];
    srcs[j] = evt_lowered_cutlass(K) ? evt_emit_cutlass(&K->spec, msg, sizeof msg) : evt_emit_rows(&K->rspec, msg, sizeof msg);
    if (!srcs[j]) {
      fprintf(stderr, "evtc compile: internal error: group %d: %s\n", K->group, msg);
      rc = EVTC_EXIT_INTERNAL;
      break;
    }
    char name[64];
    snprintf(name, sizeof name, "%s.cu", K->kernel);
    if (write_file(dir, name, srcs[j]) != 0) rc = EVTC_EXIT_USER;
    jobs[j].name = K->kernel;
    jobs[j].source = srcs[j];
  }
  if (rc == EVTC_EXIT_OK && stats) {
    printf("groups: %d\n", low.n);
    for (int k = 0; k < EVT_LK_COUNT; k++) {
      if (k == EVT_LK_CONV_EVT && !low.count[k]) continue; /* graphs without convolutions keep their four lines */
      int lowered = 0;
      for (int i = 0; i < low.n; i++) lowered += low.k[i].kind == (evt_lower_kind)k && low.k[i].ok;
      printf("  %-10s %d (lowered %d)\n", evt_lower_kind_name((evt_lower_kind)k), low.count[k], lowered);
    }
    int nkg = 0, nkc = 0;
    for (int j = 0; j < nk; j++) nkg += low.k[uniq[j]].kind == EVT_LK_GEMM_EVT, nkc += low.k[uniq[j]].kind == EVT_LK_CONV_EVT;
    if (nkc) printf("distinct kernels: %d (gemm+evt %d, conv+evt %d, row/pointwise %d)\n", nk, nkg, nkc, nk - nkg - nkc);
    else printf("distinct kernels: %d (gemm+evt %d, row/pointwise %d)\n", nk, nkg, nk - nkg);
    printf("not lowered (%d):\n", low.n - low.lowered);
    for (int i = 0; i < low.n; i++)
      if (!low.k[i].ok) printf("  %s: %s\n", evt_lower_kind_name(low.k[i].kind), low.k[i].reason);
    printf("arena: %lld bytes (sum of buffers %lld, %.1f%%)\n", (long long)plan.arena_bytes, (long long)plan.naive_bytes,
           plan.naive_bytes ? 100.0 * (double)plan.arena_bytes / (double)plan.naive_bytes : 0.0);
    printf("inputs+params: %lld bytes\n", (long long)plan.external_bytes);
    printf("global memory traffic: %lld bytes\n", (long long)plan.global_bytes);
    int nlg = 0;
    for (int i = 0; i < low.n; i++) nlg += low.k[i].kind == EVT_LK_GEMM_EVT && low.k[i].ok;
    printf("gemm+evt tuning (%d of %d groups with a record):\n", ntuned, nlg);
    for (int i = 0; i < low.n; i++)
      if (low.k[i].kind == EVT_LK_GEMM_EVT && low.k[i].ok)
        printf("  group %d %s %lldx%lldx%lld: %s%s\n", i, low.k[i].kernel, (long long)low.k[i].m, (long long)low.k[i].n,
               (long long)low.k[i].k, tg[i].desc,
               evt_exec_plain_blas(&low.k[i], tg[i].choice) ? "; the GPU runtime runs it as one cuBLAS call (plain epilogue)"
               : tg[i].choice == EVT_TUNE_UNFUSED
                   ? "; the GPU runtime binds the kernel and the pair and keeps the one its whole run measures faster"
                     " at the first run (in-step A/B)"
                   : "");
  }
  if (rc == EVTC_EXIT_OK && build && nk > 0) {
    evt_jit_options jo = {0};
    jo.arch = arch;
    jo.ptx = ptx;
    st = evt_jit_compile(jobs, nk, &jo, msg, sizeof msg);
    if (st != EVT_OK) {
      fprintf(stderr, "evtc compile: --build: %s\n", msg);
      for (int j = 0; j < nk; j++)
        if (!jobs[j].ok && jobs[j].error[0]) fprintf(stderr, "%s\n", jobs[j].error);
      rc = evtc_exit_code(st);
    } else {
      for (int j = 0; j < nk; j++) printf("built %s%s\n", jobs[j].so_path, jobs[j].cached ? " (cached)" : "");
    }
  }
  for (int j = 0; j < nk; j++) free(srcs[j]);
  free(srcs);
  free(jobs);
  free(uniq);
  free(tg);
  evt_plan_free(&plan);
  evt_lower_free(&low);
  if (have_part) evt_part_plan_free(&part);
  evt_graph_free(g);
  (void)built;
  return rc;
}
