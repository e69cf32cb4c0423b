/* evtc run: train a `.evt` model with SGD on the CPU interpreter or on the GPU.
 *
 *   evtc run FILE --steps N [--lr X] [--seed S] [--device cpu|auto|cuda] [--every K] [--fp64] [--opt] [--check]
 *
 * Parses FILE ("-": standard input); if it has a loss and no gradient outputs, builds the joint graph;
 * fills inputs and params from their init attributes (seed S); with --opt runs the graph-pass pipeline on
 * the joint graph (it keeps the loss, the %grad.<param> outputs, and the inputs/params with their values);
 * then N times: run the interpreter, print `step K loss L (T ms)`, and update every param
 * p -= lr * grad.p. The data inputs stay the same every step, so a working backward makes the loss go
 * down; rand / dropout draw fresh numbers every step (step K with RNG step K - 1, kernels/philox.h). Ends with `done: N steps, loss A -> B, T ms/step`.
 * --device cuda (or gpu) runs each step on the GPU (src/runtime/gpu/cuda.h): the inputs and params are uploaded
 * once and stay on the device, each step runs the program and the SGD update there (evt_program_sgd: the
 * host update's arithmetic) and brings back the loss only (evt_cuda_train_step); --host-sgd instead uploads
 * every input and param each step, downloads every output and updates on the host (an independent path to
 * compare with: both give the same losses bit for bit). With --check every step is also run on the
 * interpreter and every output compared (check_step; the GPU then also sends back the outputs and the params
 * the step read); the step time printed excludes the check. No GPU or no kernel library: exit 1 with "no CUDA device".
 * --fused (implies --opt) partitions and lowers the graph and runs GEMM+EVT / CONV+EVT / row / pointwise groups as generated
 * kernels (src/runtime/gpu/exec_plan.h, evt_cuda_open_fused); --stats lists each group's path. Off by default.
 * --check's rule (evt_check_step, src/compile/compile.h): f32 outputs within 1e-4 of the interpreter; bf16/f16
 * outputs within max(1e-2, 2 x the per-node interpreter's own distance) of the exact (fp64) answer; outputs
 * computed from fp8 values within 1e-2 of the interpreter in relative norm, or within twice the distance of
 * interpreter runs with the fp8 tensor cores' accumulation noise on their fp8 GEMMs.
 * --cuda-graph (with --device cuda) replays the step as a CUDA graph (EVT_PROGRAM_CUDA_GRAPH). The GPU
 * runs through the public evt_program API (src/runtime/gpu/program.c); the printed step time is the
 * program's run and the device's SGD update measured with CUDA events (the loss's download excluded; with
 * --host-sgd the run only: conversions, uploads and the host's update excluded).
 * EVT_LOSS_DIGITS=N prints each step's loss with N significant digits (17: every bit of the double).
 * Exit codes: 0 ok; 1 bad flags, a bad file, no loss, a non-finite loss; 2 an internal error. */
#include "cli.h"
#include "passes/passes.h"
#include "compile/compile.h"
#include "compile/train.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
  const char *path;
  long steps, every, loss_digits;
  double lr;
  unsigned long long seed;
  const char *device;
  bool fp64, opt, check, fused, stats, cuda_graph, host_sgd, fp8, tf32;
  int arch, ptx; /* --arch: the GPU target of generated kernels (0: the GPU's) */
} run_options;

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static bool parse_long(const char *s, long lo, long *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < lo) return false;
  *out = v;
  return true;
}

/* Returns EVTC_EXIT_OK or EVTC_EXIT_USER (message printed). */
static int parse_options(int argc, char **argv, run_options *o) {
  *o = (run_options){.steps = -1, .every = 1, .lr = 0.01, .seed = 0, .device = "cpu"};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    bool has_value = i + 1 < argc;
    if (!strcmp(a, "--fp64")) {
      o->fp64 = true;
    } else if (!strcmp(a, "--opt")) {
      o->opt = true;
    } else if (!strcmp(a, "--fp8")) {
      o->fp8 = true;
    } else if (!strcmp(a, "--tf32")) {
      o->tf32 = true;
    } else if (!strcmp(a, "--check")) {
      o->check = true;
    } else if (!strcmp(a, "--fused")) {
      o->fused = true;
    } else if (!strcmp(a, "--cuda-graph")) {
      o->cuda_graph = true;
    } else if (!strcmp(a, "--host-sgd")) {
      o->host_sgd = true;
    } else if (!strcmp(a, "--stats")) {
      o->stats = true;
    } else if (!strcmp(a, "--arch") && has_value) {
      if (evt_arch_parse(argv[++i], &o->arch, &o->ptx) != EVT_OK) {
        fprintf(stderr, "evtc run: --arch takes sm_80, sm_86, sm_89, sm_90a or compute_XX, not '%s'\n", argv[i]);
        return EVTC_EXIT_USER;
      }
    } else if (!strcmp(a, "--steps") || !strcmp(a, "--every") || !strcmp(a, "--lr") || !strcmp(a, "--seed") ||
               !strcmp(a, "--device") || !strcmp(a, "--loss-digits")) {
      if (!has_value) {
        fprintf(stderr, "evtc run: %s needs a value\n", a);
        return EVTC_EXIT_USER;
      }
      const char *v = argv[++i];
      bool ok = true;
      if (!strcmp(a, "--steps")) {
        ok = parse_long(v, 0, &o->steps);
      } else if (!strcmp(a, "--every")) {
        ok = parse_long(v, 1, &o->every);
      } else if (!strcmp(a, "--loss-digits")) {
        ok = parse_long(v, 1, &o->loss_digits) && o->loss_digits <= 17;
      } else if (!strcmp(a, "--lr")) {
        char *end;
        errno = 0;
        o->lr = strtod(v, &end);
        ok = !errno && end != v && !*end && isfinite(o->lr) && o->lr >= 0;
      } else if (!strcmp(a, "--seed")) {
        char *end;
        errno = 0;
        o->seed = strtoull(v, &end, 10);
        ok = !errno && end != v && !*end && v[0] != '-';
      } else {
        o->device = v;
        ok = !strcmp(v, "cpu") || !strcmp(v, "auto") || !strcmp(v, "gpu") || !strcmp(v, "cuda");
      }
      if (!ok) {
        fprintf(stderr, "evtc run: bad value '%s' for %s\n", v, a);
        return EVTC_EXIT_USER;
      }
    } else if (a[0] == '-' && a[1]) {
      fprintf(stderr, "evtc run: unknown flag '%s' (evtc run --help)\n", a);
      return EVTC_EXIT_USER;
    } else if (o->path) {
      fprintf(stderr, "evtc run: more than one FILE ('%s' and '%s')\n", o->path, a);
      return EVTC_EXIT_USER;
    } else {
      o->path = a;
    }
  }
  if (!o->path) {
    fprintf(stderr, "evtc run: no FILE given (evtc run --help)\n");
    return EVTC_EXIT_USER;
  }
  if (o->steps < 0) {
    fprintf(stderr, "evtc run: --steps N is required\n");
    return EVTC_EXIT_USER;
  }
  bool gpu = !strcmp(o->device, "gpu") || !strcmp(o->device, "cuda");
  if (o->check && !gpu) {
    fprintf(stderr, "evtc run: --check needs --device cuda\n");
    return EVTC_EXIT_USER;
  }
  if ((o->fused || o->stats || o->cuda_graph || o->host_sgd) && !gpu) {
    fprintf(stderr, "evtc run: %s needs --device cuda\n",
            o->fused ? "--fused" : o->stats ? "--stats" : o->cuda_graph ? "--cuda-graph" : "--host-sgd");
    return EVTC_EXIT_USER;
  }
  if (o->stats && !o->fused) {
    fprintf(stderr, "evtc run: --stats needs --fused (it lists the path each partition group runs on)\n");
    return EVTC_EXIT_USER;
  }
  if (o->fused) o->opt = true; /* groups are partitioned on the optimized graph, as evtc compile does */
  if (o->fp8) o->opt = true;   /* the fp8 pass is part of the pipeline */
  if (o->fp64 && gpu) {
    fprintf(stderr, "evtc run: --fp64 is not supported with --device %s (the GPU rounds to each dtype)\n", o->device);
    return EVTC_EXIT_USER;
  }
  return EVTC_EXIT_OK;
}

static evt_graph *load(const char *path, char **err) {
  if (strcmp(path, "-")) return evt_parse_file(path, err);
  char *text = evtc_read_stdin();
  if (!text) return NULL;
  evt_graph *g = evt_parse(text, "<stdin>", err);
  free(text);
  return g;
}

static int fail(evt_graph *g, evt_status st) {
  fprintf(stderr, "evtc run: %s\n", evt_graph_error(g));
  return evtc_exit_code(st);
}

static bool is_source(const evt_node *n) { return n->op == EVT_OP_INPUT || n->op == EVT_OP_PARAM; }

/* Runs the pass pipeline on g and carries the filled input/param slots over to the rewritten graph by name
 * (passes keep every input and param with its name, but may renumber them, and the initializers depend on
 * the node id: initializing after the passes would train from different starting values). */
static evt_status optimize(evt_graph *g, evt_tensor **values, unsigned pass_flags) {
  int n0 = g->nnodes;
  const char **names = calloc((size_t)n0, sizeof *names);
  if (!names) evt_fatal(__FILE__, __LINE__, "out of memory");
  for (int i = 0; i < n0; i++) names[i] = is_source(&g->nodes[i]) ? g->nodes[i].name : NULL; /* arena-owned */
  evt_status st = evt_passes_run_all(g, pass_flags, 0);
  evt_tensor *old = *values, *nw = calloc((size_t)g->nnodes, sizeof *nw);
  int *grad_of = malloc(sizeof(int) * (size_t)g->nnodes);
  if (!nw || !grad_of) evt_fatal(__FILE__, __LINE__, "out of memory");
  if (st == EVT_OK && evt_graph_grad_outputs(g, grad_of) != evt_graph_float_param_count(g))
    st = evt_graph_errorf_at(g, (evt_origin){0}, EVT_ERR_INTERNAL, "the passes lost a %%grad.<param> output");
  free(grad_of);
  for (int i = 0; i < g->nnodes && st == EVT_OK; i++) {
    if (!is_source(&g->nodes[i])) continue;
    int k = 0;
    while (k < n0 && !(names[k] && !strcmp(names[k], g->nodes[i].name))) k++;
    if (k == n0) {
      st = evt_graph_errorf(g, i, EVT_ERR_INTERNAL, "the passes made a new input or param");
      break;
    }
    nw[i] = old[k];
    memset(&old[k], 0, sizeof old[k]);
  }
  for (int k = 0; k < n0; k++) evt_tensor_free(&old[k]);
  free(old);
  free(names);
  *values = nw;
  return st;
}

/* Runs the interpreter on the same inputs as the GPU step that filled the outputs of `values` and compares
 * every graph output with evt_check_step's rule (src/compile/compile.h). Leaves the GPU's outputs in `values`.
 * Returns false (message printed) on a mismatch; *acc gets the maxima over the steps. */
static bool check_step(evt_graph *g, evt_tensor *values, long step, bool tf32, evt_check_result *acc, evt_status *st) {
  int no = g->noutputs;
  evt_tensor *saved = calloc((size_t)(no ? no : 1), sizeof *saved);
  if (!saved) evt_fatal(__FILE__, __LINE__, "out of memory");
  for (int k = 0; k < no; k++) {
    saved[k] = values[g->outputs[k]];
    memset(&values[g->outputs[k]], 0, sizeof(evt_tensor));
  }
  evt_check_result r;
  *st = evt_check_step_tf32(g, values, saved, step, tf32, stdout, &r);
  double *mx[7] = {&acc->f32_ref, &acc->gpu_exact, &acc->ref_exact, &acc->gpu_ref, &acc->bound, &acc->fp8_ref,
                   &acc->fp8_noise};
  const double *now[7] = {&r.f32_ref, &r.gpu_exact, &r.ref_exact, &r.gpu_ref, &r.bound, &r.fp8_ref, &r.fp8_noise};
  for (int k = 0; k < 7; k++)
    if (!(*mx[k] >= *now[k])) *mx[k] = *now[k];
  acc->mismatches += r.mismatches;
  acc->fp8_outputs += r.fp8_outputs;
  for (int k = 0; k < no; k++) values[g->outputs[k]] = saved[k];
  free(saved);
  return *st == EVT_OK && r.mismatches == 0;
}

/* The summary's words for the fp8 rule's noise bound (noise: the perturbed references' largest spread). */
static const char *fp8_noise_note(double noise, char *buf, size_t len) {
  snprintf(buf, len, "; over it, max(1e-2, 2 x the interpreter's spread under fp8 accumulation noise, up to %.3g)",
           noise);
  return buf;
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Median of v[0..n) (sorts v). */
static double median(double *v, long n) {
  qsort(v, (size_t)n, sizeof *v, by_value);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* step_times (GPU only, else NULL): 2 x steps slots, the GPU time of each step then its host wall time */
static int train_steps(evt_graph *g, const run_options *o, evt_tensor *values, evt_cuda *cuda, double *step_times) {
  evt_status st;
  double first = NAN, last = NAN, total_ms = 0, check_ms = 0;
  evt_check_result acc;
  memset(&acc, 0, sizeof acc);
  bool mismatch = false;
  /* EVT_LOSS_DIGITS=17: the loss printed to every digit of the double (comparing two loops bit for bit) */
  const int loss_digits = (int)o->loss_digits;
  for (long step = 1; step <= o->steps; step++) {
    /* fresh dropout masks every step: step K draws with RNG step K - 1 (kernels/philox.h); a GPU program
     * advances its own step after each run, from the graph's at create (0) */
    evt_graph_set_rng_step(g, (uint64_t)(step - 1));
    double t0 = now_ms();
    bool device_sgd = cuda && !o->host_sgd; /* the model stays on the device, updated there */
    if (device_sgd) st = evt_cuda_train_step(cuda, g, values, o->lr, o->check);
    else st = cuda ? evt_cuda_step(cuda, g, values) : evt_interp_run(g, values, o->fp64 ? EVT_RUN_FP64 : 0, 0);
    if (st != EVT_OK) return fail(g, st);
    double step_ms = cuda ? evt_cuda_last_ms(cuda) : now_ms() - t0; /* GPU: run (+ device update), events */
    double check_before = check_ms;
    if (cuda && o->check) {
      double c0 = now_ms();
      if (!check_step(g, values, step, o->tf32, &acc, &st)) {
        if (st != EVT_OK) return fail(g, st);
        mismatch = true;
      }
      check_ms += now_ms() - c0; /* the step's time excludes the check */
    }
    const evt_tensor *l = &values[g->loss];
    if (!l->data || l->numel != 1) {
      fprintf(stderr, "evtc run: internal error: the interpreter left no loss value\n");
      return EVTC_EXIT_INTERNAL;
    }
    last = l->data[0];
    if (step == 1) first = last;
    if (!isfinite(last)) {
      printf("step %ld loss %.6g\n", step, last);
      fprintf(stderr, "evtc run: the loss is %g at step %ld (try a smaller --lr)\n", isnan(last) ? fabs(last) : last, step); /* "nan", not "-nan" */
      return EVTC_EXIT_USER;
    }
    double u0 = now_ms();
    if (!device_sgd) st = evt_train_sgd_update(g, values, o->lr, o->fp64 ? EVT_RUN_FP64 : 0);
    if (st != EVT_OK) return fail(g, st);
    evt_train_release(g, values);
    double ms = step_ms + (cuda ? 0 : now_ms() - u0); /* the CPU's step includes the update */
    total_ms += ms;
    if (step_times) { /* the GPU's time, and the host's wall clock of the whole step (the check excluded) */
      step_times[step - 1] = ms;
      step_times[o->steps + step - 1] = now_ms() - t0 - (check_ms - check_before);
    }
    if (step == 1 || step == o->steps || step % o->every == 0) {
      if (loss_digits > 0) printf("step %ld loss %.*g (%.1f ms)\n", step, loss_digits, last, ms);
      else printf("step %ld loss %.6f (%.1f ms)\n", step, last, ms);
    }
    fflush(stdout);
  }
  if (o->steps > 0) {
    printf("done: %ld steps, loss %.6f -> %.6f, %.1f ms/step", o->steps, first, last, total_ms / (double)o->steps);
    /* the GPU's steady state: the first step loads kernels lazily, a CUDA-graph run captures at step 2 */
    if (cuda && step_times)
      printf(" (median %.3f ms/step; wall median %.3f ms/step with the host's transfers%s)", median(step_times, o->steps),
             median(step_times + o->steps, o->steps),
             o->host_sgd ? " and update" : o->check ? " and the check's downloads" : "");
    printf("\n");
  }
  if (cuda && !o->host_sgd && (st = evt_cuda_download_params(cuda, g, values)) != EVT_OK) return fail(g, st);
  if (cuda && o->check && o->steps > 0) {
    bool low = acc.bound > 0; /* the graph has bf16/f16 outputs */
    char note[160];
    double shown = low ? acc.gpu_exact : acc.fp8_outputs > 0 ? fmax(acc.fp8_ref, acc.f32_ref) : acc.f32_ref;
    printf("check: %s, %ld steps against the interpreter, max rel error %.3g (interpreter %.1f ms/step)\n",
           mismatch ? "MISMATCH" : "matched", o->steps, shown, check_ms / (double)o->steps);
    if (acc.fp8_outputs > 0)
      printf("check: outputs of fp8 values: GPU vs per-node interpreter %.3g in relative norm (bound 1e-2%s)\n",
             acc.fp8_ref, acc.fp8_noise > 0 ? fp8_noise_note(acc.fp8_noise, note, sizeof note) : "");
    if (acc.bound > 0)
      printf("check: bf16/f16 outputs: GPU vs exact (fp64 interpreter) %.3g, bound %.3g = max(1e-2, 2 x %.3g, the "
             "per-node interpreter vs exact); GPU vs per-node interpreter %.3g; f32 outputs vs interpreter %.3g\n",
             acc.gpu_exact, acc.bound, acc.ref_exact, acc.gpu_ref, acc.f32_ref);
    if (mismatch) return EVTC_EXIT_USER;
  }
  return EVTC_EXIT_OK;
}

static int train(evt_graph *g, const run_options *o, evt_tensor *values, evt_cuda *cuda) {
  double *step_times = cuda && o->steps > 0 ? calloc(2 * (size_t)o->steps, sizeof(double)) : NULL;
  int rc = train_steps(g, o, values, cuda, step_times);
  free(step_times);
  return rc;
}

EVTC_COMMAND(run, "FILE --steps N [--lr X] [--seed S] [--device cpu|auto|cuda] [--every K] [--fp64] [--opt] [--fp8] [--tf32] [--check] [--fused] [--cuda-graph] [--host-sgd] [--stats] [--arch ARCH] [--loss-digits D]",
             "train a model with SGD on the CPU interpreter or the GPU\n"
             "  FILE          a .evt graph with a loss (- for stdin; the joint graph is built if it has no gradients)\n"
             "  --steps N     training steps (required; 0 only checks that the graph can be prepared)\n"
             "  --lr X        SGD learning rate: p -= X * grad (default 0.01)\n"
             "  --seed S      seed of the input/param initializers (default 0)\n"
             "  --device D    cpu (default); auto: cuda when a GPU and build/libevt_fallback.so are there, else cpu;\n"
             "                cuda (or gpu): each step runs on the GPU node by node (build/libevt_fallback.so,\n"
             "                `make cuda`); the inputs and params stay on the device, SGD runs there, the loss\n"
             "                comes back\n"
             "  --every K     print every K-th step (the first and last always; default 1)\n"
             "  --loss-digits D  print each step's loss with D significant digits (17: every digit of the double)\n"
             "  --fp64        compute (and update params) in fp64 instead of rounding to each tensor's dtype\n"
             "  --opt         run the graph passes (evtc opt's pipeline) on the joint graph first\n"
             "  --fp8         (implies --opt) the eligible GEMMs in FP8 with per-tensor scaling (the fp8 pass,\n"
             "                docs/passes.md); on the GPU too (--fused: generated fp8 GEMMs on sm_90a)\n"
             "  --tf32        GEMMs of f32 operands run on TF32 tensor cores as generated GEMM+EVT kernels (evt_options.tf32,\n"
             "                docs/codegen.md \"TF32\"); --check then holds their outputs to the 16-bit tolerance\n"
             "  --check       with --device cuda: compare every step's loss and gradients with the interpreter\n"
             "                (max error / max(the tensor's largest magnitude, 0.1 x the step's largest gradient);\n"
             "                f32: within 1e-4 of the interpreter; f16/bf16: within max(1e-2, 2 x the per-node\n"
             "                interpreter's own distance) of the exact answer (the interpreter in fp64), or 1e-2 of\n"
             "                the per-node interpreter; computed from fp8 values: within 1e-2 of the interpreter in\n"
             "                relative norm, ||gpu - cpu|| / ||cpu||; NaN fails)\n"
             "  --fused       with --device cuda (implies --opt): partition + lower the graph, JIT-compile the\n"
             "                GEMM+EVT / CONV+EVT / row / pointwise kernels (nvcc, cache $EVT_CACHE_DIR/jit) and run each\n"
             "                such group as one generated kernel; other groups run node by node, one warning each\n"
             "  --cuda-graph  with --device cuda: capture the step as a CUDA graph once, replay it every step\n"
             "  --host-sgd    with --device cuda: upload the inputs and params every step, bring every output back\n"
             "                and update on the host (the same losses, slower; for comparison)\n"
             "  --stats       with --fused: list every group with the path it runs on, and launches per path\n"
             "  --arch ARCH   with --fused: the GPU target of the generated kernels: sm_80, sm_86, sm_89 (Ampere / Ada:\n"
             "                CUTLASS 2.x GEMMs, no programmatic dependent launches), sm_90a, or compute_XX (PTX only);\n"
             "                another GPU's target runs as PTX the driver compiles (sm_80 on a Hopper). Default: the GPU's\n"
             "prints `step K loss L (T ms)` per step, then `done: N steps, loss A -> B, T ms/step`") {
  run_options o;
  int rc = parse_options(argc, argv, &o);
  if (rc != EVTC_EXIT_OK) return rc;
  bool gpu = !strcmp(o.device, "gpu") || !strcmp(o.device, "cuda");
  bool autodev = !strcmp(o.device, "auto") && !o.fp64;

  char *err = NULL;
  evt_graph *g = load(o.path, &err);
  if (!g) {
    fprintf(stderr, "%s\n", err ? err : "evtc run: cannot read the input (or it holds a NUL byte)");
    free(err);
    return EVTC_EXIT_USER;
  }
  bool built = false;
  evt_status st = evt_train_ensure_joint(g, &built);
  if (st != EVT_OK) {
    rc = fail(g, st);
    evt_graph_free(g);
    return rc;
  }
  int before = g->nnodes;
  evt_tensor *values = calloc((size_t)g->nnodes, sizeof *values);
  if (!values) evt_fatal(__FILE__, __LINE__, "out of memory");
  st = evt_interp_init_inputs(g, values, o.seed);
  if (st == EVT_OK && o.opt) st = optimize(g, &values, o.fp8 ? EVT_PASS_FP8 : 0);
  if (st == EVT_OK) {
    printf("%s: %d nodes%s", o.path, before, built ? " (joint graph built)" : "");
    if (o.opt) printf(", %d after the passes", g->nnodes);
    printf(", %d params, lr %g, seed %llu\n", evt_graph_float_param_count(g), o.lr, o.seed);
  }
  evt_cuda *cuda = NULL;
  if (st == EVT_OK && autodev) { /* auto: the GPU when there is one (node by node), else the interpreter */
    evt_status cst = evt_cuda_open(g, &cuda);
    if (cst == EVT_OK) {
      printf("device: cuda (auto; node-by-node kernels, libevt_fallback.so)\n");
    } else if (cst == EVT_ERR_UNSUPPORTED) {
      printf("device: cpu interpreter (auto: %s)\n", evt_graph_error(g));
      cuda = NULL;
    } else {
      st = cst;
    }
  }
  if (st == EVT_OK && gpu) {
    unsigned pf = (o.fused ? EVT_PROGRAM_FUSED : 0) | (o.cuda_graph ? EVT_PROGRAM_CUDA_GRAPH : 0);
    evt_options po;
    evt_options_init(&po);
    po.flags = pf;
    po.arch = o.arch;
    po.ptx = o.ptx;
    po.tf32 = o.tf32;
    st = evt_cuda_open_opts(g, &po, &cuda);
    const char *graph_note = o.cuda_graph ? ", replayed as a CUDA graph" : "";
    if (st == EVT_OK && !o.fused) printf("device: cuda (node-by-node kernels, libevt_fallback.so%s)\n", graph_note);
    if (st == EVT_OK && o.fused) {
      int nf, nb;
      long lf, lb;
      evt_cuda_fused_counts(cuda, &nf, &nb, &lf, &lb);
      printf("device: cuda --fused (%d groups: %d generated kernels, %d node by node%s)\n", nf + nb, nf, nb, graph_note);
      if (o.stats) evt_cuda_print_plan(cuda, g, stdout);
    }
  }
  rc = st == EVT_OK ? train(g, &o, values, cuda) : fail(g, st);
  if (st == EVT_OK && o.fused && o.stats) {
    int nf, nb;
    long lf, lb;
    evt_cuda_fused_counts(cuda, &nf, &nb, &lf, &lb);
    printf("stats: groups fused %d, fallback %d; group launches: generated %ld, node by node %ld\n", nf, nb, lf, lb);
    if (evt_cuda_ab_groups(cuda) > 0) { /* the in-step A/B chose some groups' paths at the first step */
      printf("plan after the in-step A/B of %d group(s):\n", evt_cuda_ab_groups(cuda));
      evt_cuda_print_plan(cuda, g, stdout);
    }
  }
  evt_cuda_close(cuda);
  for (int i = 0; i < g->nnodes; i++) evt_tensor_free(&values[i]);
  free(values);
  evt_graph_free(g);
  return rc;
}
