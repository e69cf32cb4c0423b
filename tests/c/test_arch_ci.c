/* CI compile check per GPU target (no GPU needed): every generated kernel of the examples and bench graphs (the .evt
 * files of examples/ and bench/graphs/; the GPU's `ampere` group runs these and a few more), planned as
 * `evtc run --fused --arch A` plans them,
 * compiled by nvcc for sm_80, sm_89 and sm_90a (-gencode for that target only, -c: front end, code generation and
 * ptxas). Kernels are deduplicated by name (their spec's hash, which names the target), and an sm_89 row kernel that
 * is its sm_80 twin's code (all are: row kernels differ by target only in PDL, off on both) is compiled once, for
 * sm_80; per target the GEMM kernels
 * and the row kernels each go into two translation units (headers parsed once per unit; the kernels live in their own
 * namespaces), compiled two at a time. Each unit's object is cached in build/arch_ci/ under the hash of its text, its
 * command and the kernels/ headers, so a rerun compiles only what an emitter or header change touched. Needs nvcc
 * and the CUTLASS 4.2 headers (as evt_test_nvcc_frontend); without them it says so and checks nothing. */
#include "test.h"

#include <dirent.h>
#include <time.h>

#include "codegen/examples.h"
#include "codegen/lower.h"
#include "compile/compile.h"
#include "compile/train.h"
#include "partition/partition.h"
#include "passes/passes.h"
#include "runtime/gpu/exec_plan.h"

#define CI_DIR "build/arch_ci"

/* The graph files of one folder ending in .evt (sorted; bad_index.evt, a run-time error check, left out). */
static int list_graphs(const char *dir, char paths[][160], int n, int cap) {
  struct dirent **ents = NULL;
  int k = scandir(dir, &ents, NULL, alphasort);
  for (int i = 0; i < k; i++) {
    size_t l = strlen(ents[i]->d_name);
    if (l > 4 && !strcmp(ents[i]->d_name + l - 4, ".evt") && strcmp(ents[i]->d_name, "bad_index.evt") && n < cap &&
        snprintf(paths[n], 160, "%s/%s", dir, ents[i]->d_name) < 160)
      n++;
    free(ents[i]);
  }
  free(ents);
  return n;
}

/* The distinct kernels of every graph planned for `arch` (as evtc prefetch --arch plans them; a graph with a loss as
 * its training step) after the graph passes with pass_flags (EVT_PASS_FP8: the fp8 recipe), appended to ks from
 * index n. Returns the new count. */
static int collect_kernels(char paths[][160], int np, int arch, unsigned pass_flags, evt_pf_kernel **ks, int n,
                           int *cap) {
  evt_options o;
  evt_options_init(&o);
  o.flags = EVT_PROGRAM_FUSED | EVT_PROGRAM_NO_OPT;
  o.arch = arch;
  for (int f = 0; f < np; f++) {
    char *perr = NULL;
    evt_graph *g = evt_parse_file(paths[f], &perr);
    CHECK_MSG(g != NULL, "%s: %s", paths[f], perr ? perr : "");
    free(perr);
    if (!g) continue;
    evt_program *p = NULL;
    evt_status st = g->loss >= 0 ? evt_train_ensure_joint(g, NULL) : EVT_OK;
    if (st == EVT_OK) st = evt_passes_run_all(g, pass_flags, 0);
    if (st == EVT_OK) st = evt_program_create_host_opts(g, &o, &p);
    CHECK_MSG(st == EVT_OK, "%s: %s", paths[f], evt_graph_error(g));
    char err[512];
    if (st == EVT_OK) CHECK_MSG(evt_prefetch_collect(p->xp, paths[f], ks, &n, cap, err, sizeof err) == 0, "%s: %s", paths[f], err);
    evt_program_destroy(p);
    evt_graph_free(g);
  }
  return n;
}

/* FNV hash of every file of kernels/ (what the units include). */
static uint64_t headers_hash(void) {
  char paths[64][160];
  int n = 0;
  struct dirent **ents = NULL;
  int k = scandir("kernels", &ents, NULL, alphasort);
  for (int i = 0; i < k; i++) {
    size_t l = strlen(ents[i]->d_name);
    if ((l > 2 && !strcmp(ents[i]->d_name + l - 2, ".h")) || (l > 4 && !strcmp(ents[i]->d_name + l - 4, ".cuh")))
      if (n < 64 && snprintf(paths[n], 160, "kernels/%s", ents[i]->d_name) < 160) n++;
    free(ents[i]);
  }
  free(ents);
  uint64_t h = 0;
  for (int i = 0; i < n; i++) {
    FILE *f = fopen(paths[i], "rb");
    char buf[4096];
    size_t r;
    while (f && (r = fread(buf, 1, sizeof buf, f)) > 0) h = evt_hash_bytes(h, buf, r);
    if (f) fclose(f);
  }
  return h;
}

/* Writes unit `part` of 2 (the kernels of kind gemm with index % 2 == part) and appends its nvcc command to the job
 * list unless its object is cached. Returns 1 if a command was added. Conv kernels are left to
 * ci_nvcc_compiles_conv_kernels: CUTLASS's conv kernel and a GEMM in one unit make GemmUniversal's partial
 * specializations ambiguous (each JIT unit holds one kernel, so the runtime never mixes them). */
static int add_unit(const evt_pf_kernel *ks, int n, int gemm, int part, int arch, const char *flags, uint64_t hh, FILE *jobs,
                    char objs[][200], int *nobj) {
  evt_sbuf text = {0};
  int count = 0;
  for (int i = 0, j = 0; i < n; i++)
    if (ks[i].gemm == gemm && !ks[i].conv && j++ % 2 == part) evt_sbuf_printf(&text, "%s\n", ks[i].source), count++;
  if (!count) return 0;
  uint64_t h = evt_hash_bytes(hh, text.p, strlen(text.p));
  h = evt_hash_bytes(h, flags, strlen(flags));
  char base[160];
  snprintf(base, sizeof base, CI_DIR "/%s-%s%d-%016llx", evt_arch_name(arch), gemm ? "gemm" : "rows", part,
           (unsigned long long)h);
  snprintf(objs[(*nobj)++], 200, "%s.o", base);
  struct stat st;
  int added = 0;
  if (stat(objs[*nobj - 1], &st) != 0) {
    char cu[200];
    snprintf(cu, sizeof cu, "%s.cu", base);
    FILE *f = fopen(cu, "w");
    CHECK(f != NULL);
    if (f) {
      fputs(text.p, f);
      fclose(f);
      fprintf(jobs, "nvcc %s -c -o %s.o.part %s.cu >%s.log 2>&1 && mv %s.o.part %s.o\n", flags, base, base, base, base, base);
      added = 1;
    }
  }
  free(text.p);
  return added;
}

/* src with every occurrence of `name`'s hash and of "sm_<arch>" replaced by fixed text: two kernels equal under it are
 * the same code for two targets (a row kernel of sm_89 and its sm_80 twin: only their spec's target differs). */
static char *normalized(const char *src, const char *name, int arch) {
  const char *hash = strrchr(name, '_') + 1;
  char tgt[16];
  snprintf(tgt, sizeof tgt, "sm_%d", arch);
  evt_sbuf b = {0};
  for (const char *p = src; *p;) {
    if (!strncmp(p, hash, strlen(hash))) evt_sbuf_printf(&b, "HASH"), p += strlen(hash);
    else if (!strncmp(p, tgt, strlen(tgt))) evt_sbuf_printf(&b, "sm_TARGET"), p += strlen(tgt);
    else evt_sbuf_printf(&b, "%c", *p++);
  }
  return b.p;
}

/* Drops from ks the row kernels of `arch` that are the same code as the row kernel at the same place of `base` (the
 * plans of two sm_8x targets differ only in their GEMM configs): compiling them again would check nothing new. */
static int drop_twins(evt_pf_kernel *ks, int n, int arch, const evt_pf_kernel *base, int nb, int base_arch) {
  int m = 0;
  for (int i = 0; i < n; i++) {
    bool twin = false;
    if (!ks[i].gemm && i < nb && !base[i].gemm) {
      char *a = normalized(ks[i].source, ks[i].name, arch), *b = normalized(base[i].source, base[i].name, base_arch);
      twin = !strcmp(a, b);
      free(a);
      free(b);
    }
    if (twin) free(ks[i].source);
    else ks[m++] = ks[i];
  }
  return m;
}

/* Runs the nvcc command lines of jobs file `jobs_path` two at a time and checks that every unit's object exists;
 * returns the seconds it took. */
static long long run_jobs(const char *jobs_path, int njobs, char (*objs)[200], int nobj) {
  time_t t0 = time(NULL);
  char cmd[512];
  snprintf(cmd, sizeof cmd, "tr '\\n' '\\0' <%s | xargs -0 -P 2 -n 1 sh -c", jobs_path);
  if (njobs) (void)!system(cmd);
  for (int i = 0; i < nobj; i++) {
    struct stat st;
    CHECK_MSG(stat(objs[i], &st) == 0, "nvcc rejected %s; see %.*s.log", objs[i], (int)strlen(objs[i]) - 2, objs[i]);
  }
  return (long long)(time(NULL) - t0);
}

/* True when nvcc and the CUTLASS headers are here, their include folders in inc and util (else the test notes
 * that it checked nothing). */
static bool have_nvcc_and_cutlass(const char *test, char inc[1024], char util[1024]) {
  const char *cp = getenv("CUTLASS_PATH") ? NULL : ".cutlass/cutlass_library/source";
  if (evt_jit_find_cutlass(cp, inc, 1024, util, 1024) == EVT_OK && system("nvcc --version >/dev/null 2>&1") == 0)
    return true;
  fprintf(stderr, "note: %s: no nvcc or CUTLASS here, nothing checked\n", test);
  return false;
}

TEST(ci_nvcc_compiles_example_kernels_per_arch) {
  char inc[1024], util[1024];
  if (!have_nvcc_and_cutlass("ci_nvcc_compiles_example_kernels_per_arch", inc, util)) return;
  static char paths[96][160];
  int np = list_graphs("examples", paths, 0, 96);
  np = list_graphs("bench/graphs", paths, np, 96); /* the 16-bit graphs: the examples' f32 GEMMs are not lowered */
  CHECK(np >= 7);
  CHECK(system("mkdir -p " CI_DIR) == 0);
  FILE *jobs = fopen(CI_DIR "/jobs.sh", "w");
  CHECK(jobs != NULL);
  if (!jobs) return;
  static char objs[16][200];
  int nobj = 0, njobs = 0, counts[3][2] = {{0}};
  uint64_t hh = headers_hash();
  const int archs[3] = {80, 89, 90};
  evt_pf_kernel *sm80 = NULL;
  int n80 = 0, twins = 0;
  for (int a = 0; a < 3; a++) {
    evt_pf_kernel *ks = NULL;
    int cap = 0, n = collect_kernels(paths, np, archs[a], 0, &ks, 0, &cap);
    for (int i = 0; i < n; i++) counts[a][ks[i].gemm]++;
    if (archs[a] == 89) {
      int before = n;
      n = drop_twins(ks, n, 89, sm80, n80, 80);
      twins = before - n;
    }
    char gencode[96], flags[3000];
    evt_jit_gencode(archs[a], 0, gencode, sizeof gencode);
    snprintf(flags, sizeof flags, "-std=c++17 --expt-relaxed-constexpr -O3 -DNDEBUG %s -Ikernels -I'%s' -I'%s'", gencode, inc,
             util);
    for (int gemm = 0; gemm < 2; gemm++)
      for (int part = 0; part < 2; part++) njobs += add_unit(ks, n, gemm, part, archs[a], flags, hh, jobs, objs, &nobj);
    if (archs[a] == 80) sm80 = ks, n80 = n;
    else evt_prefetch_free(ks, n);
  }
  evt_prefetch_free(sm80, n80);
  fclose(jobs);
  for (int a = 0; a < 3; a++) CHECK_MSG(counts[a][1] >= 10 && counts[a][0] >= 50, "%s: %d GEMM, %d row kernels", evt_arch_name(archs[a]), counts[a][1], counts[a][0]);
  long long secs = run_jobs(CI_DIR "/jobs.sh", njobs, objs, nobj);
  fprintf(stderr, "note: ci_nvcc_compiles_example_kernels_per_arch: sm_80 %d+%d, sm_89 %d+%d, sm_90a %d+%d GEMM+row kernels; "
          "%d sm_89 row kernels the same code as their sm_80 twins; %d of %d units compiled now (%lld s), the rest cached\n",
          counts[0][1], counts[0][0], counts[1][1], counts[1][0], counts[2][1], counts[2][0], twins, njobs, nobj, secs);
  CHECK(twins > 0);
}

/* Appends a generated kernel (source owned by ks; named by its spec r or s) unless one of that name is there. */
static void add_kernel(evt_pf_kernel **ks, int *n, int *cap, char *src, int gemm, const evt_rspec *r, const evt_kspec *s) {
  char name[40];
  if (gemm) evt_kspec_kernel_name(s, name);
  else evt_rspec_kernel_name(r, name);
  for (int i = 0; i < *n; i++)
    if (!strcmp((*ks)[i].name, name)) {
      free(src);
      return;
    }
  if (*n == *cap) *ks = realloc(*ks, sizeof **ks * (size_t)(*cap = *cap * 2 + 4));
  EVT_ASSERT(*ks);
  evt_pf_kernel *k = &(*ks)[(*n)++];
  memset(k, 0, sizeof *k);
  snprintf(k->name, sizeof k->name, "%s", name);
  k->gemm = gemm;
  k->source = src;
}

/* The fp8 graphs' kernels after the fp8 pass (fp8 GEMMs with their rescale and the next row amax, quantizing casts,
 * amax stages), the fp8 recipe's row kernels (quantize, dequantize, row amax; e4m3 and e5m2) and its GEMM for each
 * operand pair (e4m3 x e4m3, e4m3 x e5m2, e5m2 x e4m3), for sm_90a, into ks. Returns how many. */
static int collect_fp8_kernels(evt_pf_kernel **ks, int *cap) {
  static char paths[2][160] = {"tests/graphs/fp8_linear.evt", "tests/graphs/fp8_mlp.evt"};
  int n = collect_kernels(paths, 2, 90, EVT_PASS_FP8, ks, 0, cap);
  static const char *const rows[3] = {"quantize", "dequantize", "amax_rows"};
  for (int i = 0; i < 6; i++) {
    evt_rspec r;
    char err[256];
    CHECK(evt_rspec_fp8_example(&r, rows[i % 3], i < 3 ? EVT_F8E4M3 : EVT_F8E5M2) == EVT_OK);
    char *src = evt_emit_rows(&r, err, sizeof err);
    CHECK_MSG(src != NULL, "fp8 row kernel %s: %s", rows[i % 3], err);
    if (src) add_kernel(ks, &n, cap, src, 0, &r, NULL);
  }
  const evt_dtype ops[3][2] = {{EVT_F8E4M3, EVT_F8E4M3}, {EVT_F8E4M3, EVT_F8E5M2}, {EVT_F8E5M2, EVT_F8E4M3}};
  for (int i = 0; i < 3; i++) {
    evt_kspec s;
    char err[256];
    evt_kspec_fp8_example(&s, ops[i][0], ops[i][1], EVT_BF16);
    char *src = evt_emit_cutlass(&s, err, sizeof err);
    CHECK_MSG(src != NULL, "fp8 GEMM %d: %s", i, err);
    if (src) add_kernel(ks, &n, cap, src, 1, NULL, &s);
  }
  return n;
}

/* ks's kernels (GEMM units, and row units too when with_rows) compiled for sm_90a, two units per kind, each cached
 * by its hash; returns the seconds nvcc ran (-1: no job file) and sets *njobs (compiled now) and *nobj (units). */
static long long compile_sm90_units(const char *jobs_path, const evt_pf_kernel *ks, int n, bool with_rows, const char *inc,
                                    const char *util, int *njobs, int *nobj) {
  static char objs[4][200];
  *njobs = *nobj = 0;
  if (system("mkdir -p " CI_DIR) != 0) return -1;
  FILE *jobs = fopen(jobs_path, "w");
  if (!jobs) return -1;
  char gencode[96], flags[3000];
  evt_jit_gencode(90, 0, gencode, sizeof gencode);
  snprintf(flags, sizeof flags, "-std=c++17 --expt-relaxed-constexpr -O3 -DNDEBUG %s -Ikernels -I'%s' -I'%s'", gencode, inc, util);
  uint64_t hh = headers_hash();
  for (int gemm = with_rows ? 0 : 1; gemm < 2; gemm++)
    for (int part = 0; part < 2; part++) *njobs += add_unit(ks, n, gemm, part, 90, flags, hh, jobs, objs, nobj);
  fclose(jobs);
  return run_jobs(jobs_path, *njobs, objs, *nobj);
}

TEST(ci_nvcc_compiles_fp8_kernels) {
  char inc[1024], util[1024];
  if (!have_nvcc_and_cutlass("ci_nvcc_compiles_fp8_kernels", inc, util)) return;
  evt_pf_kernel *ks = NULL;
  int cap = 0, n = collect_fp8_kernels(&ks, &cap), counts[2] = {0}, fp8_rows = 0;
  for (int i = 0; i < n; i++) {
    counts[ks[i].gemm]++;
    fp8_rows += !ks[i].gemm && strstr(ks[i].source, "__nv_fp8_e") != NULL;
  }
  /* 3 example GEMMs + fp8_mlp's 4 distinct fp8 GEMM kernels (5 groups; two share one) */
  CHECK_MSG(counts[1] == 7 && fp8_rows >= 4, "%d GEMM kernels, %d row kernels (%d with fp8 tensors)", counts[1], counts[0],
            fp8_rows);
  int njobs, nobj;
  long long secs = compile_sm90_units(CI_DIR "/fp8_jobs.sh", ks, n, true, inc, util, &njobs, &nobj);
  CHECK(secs >= 0);
  fprintf(stderr, "note: ci_nvcc_compiles_fp8_kernels: sm_90a %d GEMM + %d row kernels (%d with fp8 tensors); %d of %d units "
          "compiled now (%lld s), the rest cached\n", counts[1], counts[0], fp8_rows, njobs, nobj, secs);
  evt_prefetch_free(ks, n);
}

/* TF32 (evt_options.tf32): check_evt's tf32_bias_relu example and the TF32 dX GEMM of examples/mlp.evt (f32 A, B, D,
 * layout NT, tile_k 32; its GELU backward and bias-gradient sum in the epilogue), compiled for sm_90a. */
TEST(ci_nvcc_compiles_tf32_kernels) {
  char inc[1024], util[1024];
  if (!have_nvcc_and_cutlass("ci_nvcc_compiles_tf32_kernels", inc, util)) return;
  evt_pf_kernel *ks = NULL;
  int cap = 0, n = 0;
  evt_kspec s;
  char err[256];
  CHECK(evt_kspec_example(&s, "tf32_bias_relu", EVT_TILE_CONFIG_DEFAULT) == EVT_OK);
  char *src = evt_emit_cutlass(&s, err, sizeof err);
  CHECK_MSG(src != NULL, "tf32_bias_relu: %s", err);
  if (src) add_kernel(&ks, &n, &cap, src, 1, NULL, &s);
  evt_options o;
  evt_options_init(&o);
  o.flags = EVT_PROGRAM_FUSED | EVT_PROGRAM_NO_OPT;
  o.arch = 90;
  o.tf32 = 1;
  char *perr = NULL;
  evt_graph *g = evt_parse_file("examples/mlp.evt", &perr);
  CHECK_MSG(g != NULL, "examples/mlp.evt: %s", perr ? perr : "");
  free(perr);
  evt_program *p = NULL;
  evt_status st = g ? evt_train_ensure_joint(g, NULL) : EVT_ERR_INVALID;
  if (st == EVT_OK) st = evt_passes_run_all(g, 0, 0);
  if (st == EVT_OK) st = evt_program_create_host_opts(g, &o, &p);
  CHECK_MSG(st == EVT_OK, "examples/mlp.evt: %s", g ? evt_graph_error(g) : "");
  evt_pf_kernel *all = NULL;
  int nall = 0, capall = 0;
  if (st == EVT_OK) CHECK(evt_prefetch_collect(p->xp, "examples/mlp.evt", &all, &nall, &capall, err, sizeof err) == 0);
  for (int i = 0; i < nall; i++) /* the first TF32 GEMM with a sum in its epilogue: one kernel keeps CI short */
    if (all[i].gemm && strstr(all[i].source, "using ElementA = float;") && strstr(all[i].source, "row_sum") && n < 2) {
      if (n == cap) ks = realloc(ks, sizeof *ks * (size_t)(cap = cap * 2 + 4));
      EVT_ASSERT(ks);
      memset(&ks[n], 0, sizeof ks[n]);
      snprintf(ks[n].name, sizeof ks[n].name, "%s", all[i].name);
      ks[n].gemm = 1, ks[n++].source = all[i].source, all[i].source = NULL;
    }
  evt_prefetch_free(all, nall);
  evt_program_destroy(p);
  evt_graph_free(g);
  CHECK_MSG(n == 2, "%d TF32 GEMM kernels (the example and one of examples/mlp.evt with --tf32)", n);
  int njobs, nobj;
  long long secs = compile_sm90_units(CI_DIR "/tf32_jobs.sh", ks, n, false, inc, util, &njobs, &nobj);
  CHECK(secs >= 0);
  fprintf(stderr, "note: ci_nvcc_compiles_tf32_kernels: sm_90a %d TF32 GEMM kernels; %d of %d units compiled now (%lld s), "
          "the rest cached\n", n, njobs, nobj, secs);
  evt_prefetch_free(ks, n);
}

/* The CONV+EVT kernels of graph g (after the joint graph and the passes when it has a loss), partitioned with the
 * lowering's rules, appended to ks; returns how many conv groups lowered. */
static int collect_conv_kernels(evt_graph *g, const char *what, evt_pf_kernel **ks, int *n, int *cap) {
  evt_status st = g->loss >= 0 ? evt_train_ensure_joint(g, NULL) : EVT_OK;
  if (st == EVT_OK && g->loss >= 0) st = evt_passes_run_all(g, 0, 0);
  evt_part_options o = evt_part_options_default();
  o.use_cache = 0;
  evt_part_plan part;
  if (st == EVT_OK) st = evt_lower_partition(g, &o, EVT_PART_LAMBDA_DEFAULT, &part);
  CHECK_MSG(st == EVT_OK, "%s: %s", what, evt_graph_error(g));
  if (st != EVT_OK) return 0;
  evt_lower_result low;
  CHECK(evt_lower_plan(g, &part, &low) == EVT_OK);
  int convs = 0;
  for (int i = 0; i < low.n; i++) {
    if (!low.k[i].ok || low.k[i].kind != EVT_LK_CONV_EVT) continue;
    char err[256];
    char *src = evt_emit_cutlass(&low.k[i].spec, err, sizeof err);
    CHECK_MSG(src != NULL, "%s group %d: %s", what, i, err);
    if (src) add_kernel(ks, n, cap, src, 1, NULL, &low.k[i].spec);
    convs++;
  }
  evt_lower_free(&low);
  evt_part_plan_free(&part);
  return convs;
}

/* Convolution + EVT kernels (src/codegen/emit_cutlass_conv.c: CUTLASS's Sm90 implicit GEMM, the visitor tree as a
 * GEMM's) compiled for sm_90a: a 3x3 stride-2 fprop with bias + ReLU + an aux store of the
 * pre-activation, and tests/graphs/resnet_block_nhwc_bf16.evt's training step: its forward convs (the batch-norm
 * statistics as row sums, D in f32), its dgrad (the ReLU mask of the previous layer as a where over a bool aux load,
 * the batch-norm backward's sums) and its wgrad (dw stored); and an fprop with per-pixel sums and maxima over the
 * channels (column reductions) and a mean over N, P, Q. */
TEST(ci_nvcc_compiles_conv_kernels) {
  char inc[1024], util[1024];
  if (!have_nvcc_and_cutlass("ci_nvcc_compiles_conv_kernels", inc, util)) return;
  evt_pf_kernel *ks = NULL;
  int cap = 0, n = 0, convs = 0;
  char *perr = NULL;
  evt_graph *g = evt_parse("graph conv {\n  %x: bf16[2,15,15,32] = input()\n  %w: bf16[64,3,3,32] = param()\n"
                           "  %b: bf16[64] = param()\n  %c = conv2d(%x, %w, stride=[2,2], padding=[1,1], layout=nhwc)\n"
                           "  %y = add(%c, %b)\n  %r = relu(%y)\n  output %r\n  output %y\n}\n",
                           "conv", &perr);
  CHECK_MSG(g != NULL, "%s", perr ? perr : "");
  free(perr);
  if (g) convs += collect_conv_kernels(g, "bias+relu+aux conv", &ks, &n, &cap);
  evt_graph_free(g);
  perr = NULL;
  g = evt_parse_file("tests/graphs/resnet_block_nhwc_bf16.evt", &perr);
  CHECK_MSG(g != NULL, "%s", perr ? perr : "");
  free(perr);
  if (g) convs += collect_conv_kernels(g, "resnet_block_nhwc_bf16", &ks, &n, &cap);
  evt_graph_free(g);
  perr = NULL;
  g = evt_parse("graph convcol {\n  %x: bf16[2,14,14,32] = input()\n  %w: bf16[64,3,3,32] = param()\n"
                "  %c = conv2d(%x, %w, padding=[1,1], layout=nhwc)\n  %r = relu(%c)\n  %f = cast(%c, dtype=f32)\n"
                "  %s = sum(%f, dims=[3])\n  %m = amax(%f, dims=[3])\n  %u = mean(%f, dims=[0,1,2])\n"
                "  output %r\n  output %s\n  output %m\n  output %u\n}\n",
                "convcol", &perr);
  CHECK_MSG(g != NULL, "%s", perr ? perr : "");
  free(perr);
  if (g) convs += collect_conv_kernels(g, "channel sums / maxima conv", &ks, &n, &cap);
  evt_graph_free(g);
  /* the block's two forward convs share a kernel, so do its two wgrads; its backward has one dgrad (the first conv's
   * input needs none) */
  CHECK_MSG(convs == 7 && n == 5, "%d conv groups lowered, %d distinct kernels (want 7 and 5)", convs, n);
  int sums = 0, colred = 0, dgrads = 0, wgrads = 0;
  for (int i = 0; i < n; i++) {
    sums += strstr(ks[i].source, "RowSum<") != NULL;
    colred += strstr(ks[i].source, "FlatM<cutlass::epilogue::fusion::Sm90ColReduction") != NULL;
    dgrads += strstr(ks[i].source, "Operator::kDgrad") != NULL;
    wgrads += strstr(ks[i].source, "Operator::kWgrad") != NULL;
  }
  CHECK_MSG(sums == 3 && colred == 1 && dgrads == 1 && wgrads == 1,
            "%d kernels with row sums (want 3: the block's batch-norm sums, a mean), %d with column reductions (want 1), "
            "%d dgrad, %d wgrad kernels (want 1 each)", sums, colred, dgrads, wgrads);
  int njobs, nobj;
  long long secs = compile_sm90_units(CI_DIR "/conv_jobs.sh", ks, n, false, inc, util, &njobs, &nobj);
  CHECK(secs >= 0);
  fprintf(stderr, "note: ci_nvcc_compiles_conv_kernels: sm_90a %d conv+EVT kernels; %d of %d units compiled now (%lld s), "
          "the rest cached\n", n, njobs, nobj, secs);
  evt_prefetch_free(ks, n);
}
