/* GPU check of the public program API (include/evt.h, evt_program_*); run by tests/gpu/run.sh (program).
 *
 *   program_check [--steps 3] [--reps 20] [--budget SECONDS] [--modes node|fused|all] FILE.evt...
 *
 * For every file: parse, build the joint graph, fill inputs/params with evt_interp_init_inputs (seed 0). Then
 * for each mode - node by node, node by node + CUDA graph, fused, fused + CUDA graph - on a fresh copy of the
 * graph: create the program (it runs the passes), cudaMalloc every input/param/output, upload the inputs in
 * their native dtype, bind by name, run `steps` steps on a user stream (no synchronization in between),
 * download the outputs and compare them with the interpreter on the program's graph and the same inputs by
 * `evtc run --check`'s rule (evt_check_step: f32 within 1e-4; bf16 within max(1e-2, 2 x the per-node
 * interpreter's distance) of the exact fp64 answer, or 1e-2 of the per-node interpreter). CUDA-graph outputs must equal the same mode's
 * eager outputs bit for bit; a graph program is then re-bound to a new output buffer (re-capture) and must
 * write the same bits there. The eager modes run in an arena of the caller's memory (evt_program_bind_arena), filled
 * with 0xff bytes first. Times `reps` runs with CUDA events (ms/step) and prints launches per step.
 * Ends with a table; exit 1 if anything mismatched or failed. */
#include "evt.h"
#include "ir/ir.h"
#include "passes/passes.h"
#include "compile/compile.h"
#include "compile/train.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_check.h"

/* ---- native dtypes <-> doubles ---------------------------------------------------------------------- */

static uint16_t f16_bits(double v) { /* v already rounded to f16 */
  uint16_t sign = signbit(v) ? 0x8000 : 0;
  double a = fabs(v);
  if (isnan(v)) return 0x7e00;
  if (isinf(v) || a >= 65520) return sign | 0x7c00;
  if (a == 0) return sign;
  int e;
  double m = frexp(a, &e); /* a = m 2^e, m in [0.5, 1) */
  int E = e - 1 + 15;
  if (E >= 1) return sign | (uint16_t)(E << 10) | (uint16_t)((m * 2 - 1) * 1024);
  return sign | (uint16_t)(a * 16777216.0);
}

static double f16_value(uint16_t h) {
  int E = (h >> 10) & 31, f = h & 1023;
  double v = E == 0 ? f * ldexp(1, -24) : E == 31 ? (f ? NAN : INFINITY) : ldexp(1024 + f, E - 25);
  return (h & 0x8000) ? -v : v;
}

static size_t dsize(evt_dtype dt) { return evt_dtype_size(dt); }

static void to_native(const evt_tensor *t, void *out) {
  for (int64_t i = 0; i < t->numel; i++) {
    double v = evt_round_to_dtype(t->data[i], t->dtype);
    switch (t->dtype) {
    case EVT_F32: ((float *)out)[i] = (float)v; break;
    case EVT_F16: ((uint16_t *)out)[i] = f16_bits(v); break;
    case EVT_BF16: {
      float f = (float)v;
      uint32_t x;
      memcpy(&x, &f, 4);
      ((uint16_t *)out)[i] = (uint16_t)(x >> 16);
      break;
    }
    case EVT_I64: ((int64_t *)out)[i] = (int64_t)v; break;
    case EVT_I32: ((int32_t *)out)[i] = (int32_t)v; break;
    default: ((uint8_t *)out)[i] = v != 0; break;
    }
  }
}

static double native_value(const void *p, evt_dtype dt, int64_t i) {
  switch (dt) {
  case EVT_F32: return ((const float *)p)[i];
  case EVT_F16: return f16_value(((const uint16_t *)p)[i]);
  case EVT_BF16: {
    uint32_t x = (uint32_t)((const uint16_t *)p)[i] << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
  }
  case EVT_I64: return (double)((const int64_t *)p)[i];
  case EVT_I32: return ((const int32_t *)p)[i];
  default: return ((const uint8_t *)p)[i];
  }
}

/* ---- helpers ---------------------------------------------------------------------------------------- */

static evt_graph *load_joint(const char *path) {
  char *err = NULL;
  evt_graph *g = evt_parse_file(path, &err);
  if (!g) {
    fprintf(stderr, "%s: %s\n", path, err ? err : "parse error");
    free(err);
    return NULL;
  }
  if (evt_train_ensure_joint(g, NULL) != EVT_OK) {
    fprintf(stderr, "%s: %s\n", path, evt_graph_error(g));
    evt_graph_free(g);
    return NULL;
  }
  return g;
}

typedef struct result {
  char file[64], mode[24];
  const char *status; /* matched / MISMATCH / FAILED */
  double err, ms;
  int launches;
  int64_t arena;
  char note[200];
} result;

static result results[256];
static int nresults;
static int eager_repro;
static time_t t_start;
static long budget = 0; /* seconds; 0: none. Modes that would start later are listed as skipped. */ /* the last eager mode gave the same bits on a later run (no atomics order effects) */

/* ---- one file, one mode ----------------------------------------------------------------------------- */

typedef struct reference {
  evt_graph *g0;      /* unoptimized: where the inputs were initialized */
  evt_tensor *v0;     /* its input/param values (by name for every program's graph) */
} reference;

static void print_row(const char *prefix, const result *r) {
  printf("%s| %s | %s | %s | %.3g | %d | %.3f | %lld | %s |\n", prefix, r->file, r->mode, r->status, r->err, r->launches,
         r->ms, (long long)r->arena, r->note);
}

/* Runs one mode; the eager outputs (host copies of the native bytes) go to *bytes_out when non-NULL. */
static void run_mode(const char *path, const reference *ref, const char *mode, unsigned flags, int steps, int reps,
                     void ***eager_bytes, int check_bits_against) {
  result *r = &results[nresults++];
  memset(r, 0, sizeof *r);
  snprintf(r->file, sizeof r->file, "%s", strrchr(path, '/') ? strrchr(path, '/') + 1 : path);
  snprintf(r->mode, sizeof r->mode, "%s", mode);
  r->status = "FAILED";
  if (budget > 0 && time(NULL) - t_start > budget) {
    r->status = "skipped";
    snprintf(r->note, sizeof r->note, "out of time (--budget %ld s)", budget);
    return;
  }
  printf("== %s [%s]\n", path, mode);
  fflush(stdout);
  evt_graph *g = load_joint(path);
  if (!g) return;
  evt_program *p = NULL;
  evt_status st = evt_program_create(g, flags, &p);
  if (st != EVT_OK) {
    snprintf(r->note, sizeof r->note, "create: %.180s", evt_graph_error(g));
    printf("   %s\n", r->note);
    print_row("ROW ", r);
    evt_graph_free(g);
    return;
  }
  r->arena = p->arena_bytes;
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int n = g->nnodes, no = evt_graph_output_count(g);
  void **dmem = calloc((size_t)n, sizeof *dmem), **dout = calloc((size_t)no, sizeof *dout);
  /* inputs / params: by name from the unoptimized graph's values */
  for (int v = 0; v < n && st == EVT_OK; v++) {
    const evt_node *nd = &g->nodes[v];
    if (nd->op != EVT_OP_INPUT && nd->op != EVT_OP_PARAM) continue;
    int v0 = evt_graph_find(ref->g0, nd->name);
    if (v0 < 0 || ref->v0[v0].numel != evt_type_numel(&nd->type)) {
      snprintf(r->note, sizeof r->note, "input %%%s has no initial value", nd->name);
      st = EVT_ERR_INTERNAL;
      break;
    }
    size_t bytes = (size_t)ref->v0[v0].numel * dsize(nd->type.dtype);
    void *host = malloc(bytes + 1);
    to_native(&ref->v0[v0], host);
    CUDA_CHECK(cudaMalloc(&dmem[v], bytes + 1));
    CUDA_CHECK(cudaMemcpy(dmem[v], host, bytes, cudaMemcpyHostToDevice));
    free(host);
    st = evt_program_bind(p, nd->name, dmem[v]);
  }
  for (int i = 0; i < no && st == EVT_OK; i++) {
    const evt_type *ty = &g->nodes[evt_graph_output(g, i)].type;
    CUDA_CHECK(cudaMalloc(&dout[i], (size_t)evt_type_numel(ty) * dsize(ty->dtype) + 1));
    CUDA_CHECK(cudaMemset(dout[i], 0xff, (size_t)evt_type_numel(ty) * dsize(ty->dtype) + 1)); /* NaN-ish garbage */
    st = evt_program_bind_output(p, i, dout[i]);
  }
  /* eager modes run in caller memory (evt_program_bind_arena), poisoned: nothing may read it before writing */
  void *arena = NULL;
  int64_t arena_bytes = evt_program_arena_bytes(p);
  if (st == EVT_OK && !(flags & EVT_PROGRAM_CUDA_GRAPH) && arena_bytes > 0) {
    CUDA_CHECK(cudaMalloc(&arena, (size_t)arena_bytes));
    CUDA_CHECK(cudaMemset(arena, 0xff, (size_t)arena_bytes));
    st = evt_program_bind_arena(p, arena, arena_bytes);
    if (st == EVT_OK) snprintf(r->note, sizeof r->note, "caller arena");
  }
  for (int k = 0; k < steps && st == EVT_OK; k++) st = evt_program_run(p, s);
  const uint64_t last_step = evt_program_rng_step(p) - 1; /* every run advances the RNG step (dropout masks) */
  if (st != EVT_OK && !r->note[0]) snprintf(r->note, sizeof r->note, "%.190s", evt_program_error(p));
  if (st == EVT_OK) {
    CUDA_CHECK(cudaStreamSynchronize(s));
    r->launches = evt_program_launch_count(p);
    double worst = 0;
    bool ok = true, bits_ok = true;
    void **host = calloc((size_t)no, sizeof *host);
    evt_tensor *gpu = calloc((size_t)no, sizeof *gpu), *values = calloc((size_t)n, sizeof *values);
    for (int i = 0; i < no; i++) {
      int id = evt_graph_output(g, i);
      const evt_type *ty = &g->nodes[id].type;
      int64_t numel = evt_type_numel(ty);
      size_t bytes = (size_t)numel * dsize(ty->dtype);
      host[i] = malloc(bytes + 1);
      CUDA_CHECK(cudaMemcpy(host[i], dout[i], bytes, cudaMemcpyDeviceToHost));
      evt_tensor_alloc(&gpu[i], ty->dtype, ty->rank, ty->shape);
      for (int64_t e = 0; e < numel; e++) gpu[i].data[e] = native_value(host[i], ty->dtype, e);
      if (check_bits_against && eager_bytes && *eager_bytes && memcmp(host[i], (*eager_bytes)[i], bytes)) {
        bits_ok = !eager_repro; /* eager runs that differ among themselves (atomics) cannot be matched */
        printf("   output %d %%%s: CUDA-graph replay differs from the eager run%s\n", i, g->nodes[id].name,
               eager_repro ? "" : " (the eager runs differ among themselves too: atomic sums)");
      }
    }
    /* the interpreter on the program's (optimized) graph with the same inputs; evtc run --check's rule */
    for (int v = 0; v < n; v++) {
      const evt_node *nd = &g->nodes[v];
      if (nd->op != EVT_OP_INPUT && nd->op != EVT_OP_PARAM) continue;
      const evt_tensor *src = &ref->v0[evt_graph_find(ref->g0, nd->name)];
      evt_tensor_alloc(&values[v], src->dtype, src->rank, src->shape);
      memcpy(values[v].data, src->data, sizeof(double) * (size_t)src->numel);
    }
    evt_graph_set_rng_step(g, last_step); /* the interpreter draws the last run's dropout masks */
    evt_check_result cr;
    if (evt_check_step(g, values, gpu, steps, stdout, &cr) != EVT_OK) {
      ok = false;
      printf("   interpreter: %s\n", evt_graph_error(g));
    }
    ok = ok && cr.mismatches == 0;
    worst = cr.f32_ref > cr.gpu_exact ? cr.f32_ref : cr.gpu_exact;
    if (cr.bound > 0)
      snprintf(r->note, sizeof r->note, "bf16: %.3g from exact (bound %.3g), %.3g from per-node interp", cr.gpu_exact,
               cr.bound, cr.gpu_ref);
    for (int v = 0; v < n; v++) evt_tensor_free(&values[v]);
    for (int i = 0; i < no; i++) evt_tensor_free(&gpu[i]);
    free(values);
    free(gpu);
    r->err = worst;
    r->status = ok && bits_ok ? "matched" : "MISMATCH";
    if (!bits_ok)
      snprintf(r->note + strlen(r->note), sizeof r->note - strlen(r->note), "%sgraph replay != eager bits",
               r->note[0] ? "; " : "");
    /* a graph program: bind output 0 to a new buffer; the re-captured graph must write the same bits */
    if ((flags & EVT_PROGRAM_CUDA_GRAPH) && no > 0) {
      const evt_type *ty = &g->nodes[evt_graph_output(g, 0)].type;
      size_t bytes = (size_t)evt_type_numel(ty) * dsize(ty->dtype);
      void *fresh = NULL, *back = malloc(bytes + 1);
      CUDA_CHECK(cudaMalloc(&fresh, bytes + 1));
      CUDA_CHECK(cudaMemset(fresh, 0xff, bytes + 1));
      if (evt_program_bind_output(p, 0, fresh) != EVT_OK || evt_program_set_rng_step(p, last_step, s) != EVT_OK ||
          evt_program_run(p, s) != EVT_OK) {
        r->status = "FAILED";
        snprintf(r->note, sizeof r->note, "rebind: %.180s", evt_program_error(p));
      } else {
        CUDA_CHECK(cudaStreamSynchronize(s));
        CUDA_CHECK(cudaMemcpy(back, fresh, bytes, cudaMemcpyDeviceToHost));
        if (memcmp(back, host[0], bytes)) {
          r->status = "MISMATCH";
          snprintf(r->note, sizeof r->note, "after re-binding output 0 the re-captured graph wrote other bits");
        } else {
          snprintf(r->note + strlen(r->note), sizeof r->note - strlen(r->note), "%srebind+recapture ok",
                   r->note[0] ? "; " : "");
        }
      }
      CUDA_CHECK(cudaFree(fresh));
      free(back);
    }
    /* timing: reps runs between two events on the user stream */
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    evt_program_run(p, s); /* warm (a re-capture after the rebind) */
    CUDA_CHECK(cudaEventRecord(e0, s));
    for (int k = 0; k < reps && st == EVT_OK; k++) st = evt_program_run(p, s);
    CUDA_CHECK(cudaEventRecord(e1, s));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    r->ms = reps > 0 ? ms / reps : 0;
    CUDA_CHECK(cudaEventDestroy(e0));
    CUDA_CHECK(cudaEventDestroy(e1));
    if (st != EVT_OK) {
      r->status = "FAILED";
      snprintf(r->note, sizeof r->note, "timing run: %.180s", evt_program_error(p));
    }
    if (eager_bytes && !check_bits_against) {
      eager_repro = 1; /* a repeat of the last step writes the same bits? */
      if (evt_program_set_rng_step(p, last_step, s) != EVT_OK || evt_program_run(p, s) != EVT_OK) eager_repro = 0;
      CUDA_CHECK(cudaStreamSynchronize(s));
      for (int i = 0; i < no; i++) {
        const evt_type *ty = &g->nodes[evt_graph_output(g, i)].type;
        size_t bytes = (size_t)evt_type_numel(ty) * dsize(ty->dtype);
        void *again = malloc(bytes + 1);
        CUDA_CHECK(cudaMemcpy(again, dout[i], bytes, cudaMemcpyDeviceToHost));
        if (memcmp(again, host[i], bytes)) eager_repro = 0;
        free(again);
      }
      if (!eager_repro)
        snprintf(r->note + strlen(r->note), sizeof r->note - strlen(r->note), "%seager runs not bit-reproducible",
                 r->note[0] ? "; " : "");
      *eager_bytes = host; /* kept for the graph mode's bit comparison */
    } else {
      for (int i = 0; i < no; i++) free(host[i]);
      free(host);
    }
  }
  printf("   %s: max rel error %.3g, %d launches/step, %.3f ms/step, arena %lld bytes %s\n", r->status, r->err,
         r->launches, r->ms, (long long)r->arena, r->note);
  print_row("ROW ", r); /* the table row now, in case a later mode is killed by the caller's timeout */
  fflush(stdout);
  evt_program_destroy(p);
  if (arena) CUDA_CHECK(cudaFree(arena));
  for (int v = 0; v < n; v++)
    if (dmem[v]) CUDA_CHECK(cudaFree(dmem[v]));
  for (int i = 0; i < no; i++)
    if (dout[i]) CUDA_CHECK(cudaFree(dout[i]));
  free(dmem);
  free(dout);
  CUDA_CHECK(cudaStreamDestroy(s));
  evt_graph_free(g);
}

static bool make_reference(const char *path, reference *ref) {
  memset(ref, 0, sizeof *ref);
  ref->g0 = load_joint(path);
  if (!ref->g0) return false;
  ref->v0 = calloc((size_t)ref->g0->nnodes, sizeof *ref->v0);
  return evt_interp_init_inputs(ref->g0, ref->v0, 0) == EVT_OK;
}

static void free_reference(reference *ref) {
  if (ref->g0 && ref->v0)
    for (int v = 0; v < ref->g0->nnodes; v++) evt_tensor_free(&ref->v0[v]);
  free(ref->v0);
  if (ref->g0) evt_graph_free(ref->g0);
}

int main(int argc, char **argv) {
  int steps = 3, reps = 20, want_node = 1, want_fused = 1;
  int first = 1;
  for (; first < argc && !strncmp(argv[first], "--", 2); first += 2) {
    if (first + 1 >= argc) return 2;
    if (!strcmp(argv[first], "--steps")) steps = atoi(argv[first + 1]);
    else if (!strcmp(argv[first], "--reps")) reps = atoi(argv[first + 1]);
    else if (!strcmp(argv[first], "--budget")) budget = atol(argv[first + 1]);
    else if (!strcmp(argv[first], "--modes")) { /* node (node, node+graph), fused (fused, fused+graph), all */
      want_node = !strcmp(argv[first + 1], "node") || !strcmp(argv[first + 1], "all");
      want_fused = !strcmp(argv[first + 1], "fused") || !strcmp(argv[first + 1], "all");
    }
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  t_start = time(NULL);
  for (int f = first; f < argc && nresults < 240; f++) {
    reference ref;
    if (budget > 0 && time(NULL) - t_start > budget) {
      result *r = &results[nresults++];
      memset(r, 0, sizeof *r);
      snprintf(r->file, sizeof r->file, "%s", argv[f]);
      snprintf(r->mode, sizeof r->mode, "all");
      r->status = "skipped";
      snprintf(r->note, sizeof r->note, "out of time (--budget %ld s)", budget);
      continue;
    }
    if (!make_reference(argv[f], &ref)) {
      result *r = &results[nresults++];
      memset(r, 0, sizeof *r);
      snprintf(r->file, sizeof r->file, "%s", argv[f]);
      snprintf(r->mode, sizeof r->mode, "reference");
      r->status = "FAILED";
      free_reference(&ref);
      continue;
    }
    void **eager = NULL;
    int no = evt_graph_output_count(ref.g0);
    if (want_node) run_mode(argv[f], &ref, "node", 0, steps, reps, &eager, 0);
    if (want_node) run_mode(argv[f], &ref, "node+graph", EVT_PROGRAM_CUDA_GRAPH, steps, reps, &eager, 1);
    if (eager) {
      for (int i = 0; i < no; i++) free(eager[i]);
      free(eager);
      eager = NULL;
    }
    if (want_fused) run_mode(argv[f], &ref, "fused", EVT_PROGRAM_FUSED, steps, reps, &eager, 0);
    if (want_fused) run_mode(argv[f], &ref, "fused+graph", EVT_PROGRAM_FUSED | EVT_PROGRAM_CUDA_GRAPH, steps, reps, &eager, 1);
    if (eager) {
      for (int i = 0; i < no; i++) free(eager[i]);
      free(eager);
    }
    free_reference(&ref);
  }
  int bad = 0;
  printf("\n| file | mode | result | max rel err | launches/step | ms/step | arena bytes | note |\n");
  printf("|---|---|---|---|---|---|---|---|\n");
  for (int i = 0; i < nresults; i++) {
    const result *r = &results[i];
    bad += strcmp(r->status, "matched") != 0 && strcmp(r->status, "skipped") != 0;
    print_row("", r);
  }
  printf("\nprogram_check: %d runs, %d matched, %d not\n", nresults, nresults - bad, bad);
  return bad ? 1 : 0;
}
