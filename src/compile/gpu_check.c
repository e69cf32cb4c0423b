/* `evtc run --check`: one GPU step's outputs against the CPU interpreter (contract and the rule: cuda.h,
 * evt_check_step). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compile/compile.h"
#include "compile/train.h"
#include "runtime/interp/interp.h"

/* The fp8 tensor cores' accumulation error, rounded up: measured 1.5e-4 relative (about 2^-13) against exact sums of
 * exact fp8 products on an H100 (docs/codegen.md "FP8"); the perturbed references use 2^-12. */
#define FP8_ACC_EPS 0x1p-12
/* Perturbed references per check (fixed seeds 1..N): the noise bound takes their largest distance. */
#define FP8_NOISE_SEEDS 3

/* 0.1 x the largest finite |value| over the outputs other than the loss (all of them if the loss is alone). */
static double grad_scale(const evt_graph *g, const evt_tensor *t) {
  double scale = 0;
  for (int k = 0; k < g->noutputs; k++) {
    if (g->outputs[k] == g->loss && g->noutputs > 1) continue;
    for (int64_t i = 0; i < t[k].numel; i++)
      if (isfinite(t[k].data[i]) && fabs(t[k].data[i]) > scale) scale = fabs(t[k].data[i]);
  }
  return 0.1 * scale;
}

/* Runs the interpreter with `flags` (and `noise` on its fp8 GEMMs, NULL: none) on the inputs/params of `values` and
 * moves its outputs into out[k]. */
static evt_status interp_outputs(evt_graph *g, evt_tensor *values, unsigned flags, const evt_fp8_noise *noise,
                                 evt_tensor *out) {
  evt_status st = evt_interp_run_fp8_noise(g, values, flags, 0, noise);
  for (int k = 0; k < g->noutputs && st == EVT_OK; k++) {
    out[k] = values[g->outputs[k]];
    memset(&values[g->outputs[k]], 0, sizeof(evt_tensor));
  }
  evt_train_release(g, values);
  return st;
}

static bool low_precision(evt_dtype dt) { return dt == EVT_BF16 || dt == EVT_F16; }

/* A GEMM of two f32 operands: with evt_options.tf32 it may run on TF32 tensor cores. */
static bool tf32_gemm(const evt_graph *g, int v) {
  const evt_node *n = &g->nodes[v];
  int ai = n->op == EVT_OP_ADDMM ? 1 : 0;
  if (n->op != EVT_OP_MM && n->op != EVT_OP_ADDMM && n->op != EVT_OP_BMM) return false;
  return g->nodes[n->inputs[ai]].type.dtype == EVT_F32 && g->nodes[n->inputs[ai + 1]].type.dtype == EVT_F32;
}

/* anc[v] = 1 when node v has a dtype `of` accepts, is a TF32 GEMM (tf32), or is computed from such a value (an f32
 * loss of bf16 logits carries bf16 error, whichever valid bf16 evaluation produced the logits). Inputs precede
 * their users. */
static unsigned char *ancestry(const evt_graph *g, bool (*of)(evt_dtype), bool tf32) {
  unsigned char *anc = calloc((size_t)g->nnodes + 1, 1);
  if (!anc) evt_fatal(__FILE__, __LINE__, "out of memory");
  for (int v = 0; v < g->nnodes; v++) {
    anc[v] = of(g->nodes[v].type.dtype) || (tf32 && tf32_gemm(g, v));
    for (int j = 0; j < g->nodes[v].ninputs && !anc[v]; j++) anc[v] = anc[g->nodes[v].inputs[j]];
  }
  return anc;
}

/* ||gpu - cpu|| / ||cpu|| over the whole tensor (0 when equal; +inf for a NaN, an unmatched infinity or a size
 * mismatch): the fp8 rule's metric, in which a few values across an fp8 rounding boundary weigh little. */
static double rel_norm_error(const evt_tensor *gpu, const evt_tensor *cpu) {
  if (!gpu->data || !cpu->data || gpu->numel != cpu->numel) return INFINITY;
  double diff = 0, ref = 0;
  for (int64_t i = 0; i < cpu->numel; i++) {
    double a = gpu->data[i], b = cpu->data[i];
    if (isnan(a) || isnan(b) || ((isinf(a) || isinf(b)) && a != b)) return INFINITY;
    if (isinf(b)) continue;
    diff += (a - b) * (a - b);
    ref += b * b;
  }
  return diff == 0 ? 0 : sqrt(diff) / (ref > 0 ? sqrt(ref) : 1e-300);
}

double evt_check_fp8_bound(double e_noise) { return isfinite(e_noise) ? fmax(1e-2, 2 * e_noise) : 1e-2; }

bool evt_check_fp8_ok(double e_gpu, double e_noise) {
  return isfinite(e_gpu) && (e_gpu <= 1e-2 || e_gpu <= evt_check_fp8_bound(e_noise));
}

/* e[k] = the GPU's relative norm error against the interpreter for each output k of fp8 ancestry (0 for others);
 * true when one of them is over the plain 1e-2 (and finite: the noise cannot excuse a NaN). */
static bool fp8_errors(const evt_graph *g, const unsigned char *anc8, const evt_tensor *gpu, const evt_tensor *ref,
                       double *e) {
  bool over = false;
  for (int k = 0; k < g->noutputs; k++) {
    e[k] = anc8[g->outputs[k]] ? rel_norm_error(&gpu[k], &ref[k]) : 0;
    over |= isfinite(e[k]) && e[k] > 1e-2;
  }
  return over;
}

/* noise[k] = the largest relative norm distance of FP8_NOISE_SEEDS perturbed references (evt_fp8_noise,
 * FP8_ACC_EPS) from ref, for each output of fp8 ancestry: how far the hardware's accumulation alone can move it. */
static evt_status fp8_noise_spread(evt_graph *g, evt_tensor *values, const unsigned char *anc8, const evt_tensor *ref,
                                   double *noise) {
  int no = g->noutputs;
  evt_tensor *pert = calloc((size_t)(no ? no : 1), sizeof *pert);
  if (!pert) evt_fatal(__FILE__, __LINE__, "out of memory");
  evt_status st = EVT_OK;
  for (int s = 1; s <= FP8_NOISE_SEEDS && st == EVT_OK; s++) {
    evt_fp8_noise nz = {.eps = FP8_ACC_EPS, .seed = (uint64_t)s};
    st = interp_outputs(g, values, 0, &nz, pert);
    for (int k = 0; k < no && st == EVT_OK; k++) {
      double d = anc8[g->outputs[k]] ? rel_norm_error(&pert[k], &ref[k]) : 0;
      if (!(d <= noise[k])) noise[k] = d;
    }
    for (int k = 0; k < no; k++) evt_tensor_free(&pert[k]);
  }
  free(pert);
  return st;
}

/* The fp8 rule for output k (computed from fp8 values), with its error e and noise spread (0: not measured):
 * counts a mismatch, printed to out with both numbers. */
static void check_fp8_output(const evt_graph *g, int k, double e, double noise, long step, FILE *out,
                             evt_check_result *r) {
  int id = g->outputs[k];
  r->fp8_outputs++;
  if (!(e <= r->fp8_ref)) r->fp8_ref = e;
  if (!(noise <= r->fp8_noise)) r->fp8_noise = noise;
  if (evt_check_fp8_ok(e, noise)) return;
  fprintf(out, "check: step %ld output %%%s (%s, computed from fp8 values): relative norm error %.3g against the "
          "interpreter", step, g->nodes[id].name ? g->nodes[id].name : "?", evt_dtype_name(g->nodes[id].type.dtype), e);
  if (noise > 0) /* measured: the output was finite and over 1e-2 */
    fprintf(out, " > %.3g = max(1e-2, 2 x %.3g, the interpreter's own spread under fp8 accumulation noise of %.2g)",
            evt_check_fp8_bound(noise), noise, FP8_ACC_EPS);
  else
    fprintf(out, " > 1e-2");
  fprintf(out, ": MISMATCH\n");
  r->mismatches++;
}

evt_status evt_check_step(evt_graph *g, evt_tensor *values, const evt_tensor *gpu, long step, FILE *out,
                          evt_check_result *r) {
  return evt_check_step_tf32(g, values, gpu, step, false, out, r);
}

evt_status evt_check_step_tf32(evt_graph *g, evt_tensor *values, const evt_tensor *gpu, long step, bool tf32, FILE *out,
                               evt_check_result *r) {
  int no = g->noutputs;
  memset(r, 0, sizeof *r);
  evt_tensor *ref = calloc((size_t)(no ? no : 1), sizeof *ref), *exact = calloc((size_t)(no ? no : 1), sizeof *exact);
  double *e8 = calloc((size_t)(no ? no : 1), sizeof *e8), *noise8 = calloc((size_t)(no ? no : 1), sizeof *noise8);
  if (!ref || !exact || !e8 || !noise8) evt_fatal(__FILE__, __LINE__, "out of memory");
  evt_status st = interp_outputs(g, values, 0, NULL, ref);
  unsigned char *anc = ancestry(g, low_precision, tf32), *anc8 = ancestry(g, evt_dtype_is_fp8, false);
  bool low = false;
  for (int k = 0; k < no; k++) {
    if (anc8[g->outputs[k]]) anc[g->outputs[k]] = 0; /* the fp8 rule */
    low |= anc[g->outputs[k]];
  }
  if (st == EVT_OK && low) st = interp_outputs(g, values, EVT_RUN_FP64, NULL, exact);
  /* the perturbed references run only where an fp8 output is over the plain 1e-2 */
  if (st == EVT_OK && fp8_errors(g, anc8, gpu, ref, e8)) st = fp8_noise_spread(g, values, anc8, ref, noise8);
  if (st == EVT_OK) {
    double sref = grad_scale(g, ref), sx = low ? grad_scale(g, exact) : 0;
    for (int k = 0; k < no && low; k++) /* the per-node evaluation's own distance to the exact answer */
      if (anc[g->outputs[k]]) {
        double e = evt_cuda_rel_error(&ref[k], &exact[k], sx);
        if (!(e <= r->ref_exact)) r->ref_exact = e;
      }
    if (low) r->bound = fmax(1e-2, 2 * r->ref_exact);
    for (int k = 0; k < no; k++) {
      int id = g->outputs[k];
      evt_dtype dt = g->nodes[id].type.dtype;
      const char *name = g->nodes[id].name ? g->nodes[id].name : "?";
      if (anc8[id]) {
        check_fp8_output(g, k, e8[k], noise8[k], step, out, r);
        continue;
      }
      double er = evt_cuda_rel_error(&gpu[k], &ref[k], sref);
      if (!anc[id]) {
        double tol = dt == EVT_F32 ? 1e-4 : 1e-2;
        if (!(er <= r->f32_ref)) r->f32_ref = er;
        if (!(er <= tol)) {
          fprintf(out, "check: step %ld output %%%s (%s): max rel error %.3g > %.0e against the interpreter: MISMATCH\n",
                  step, name, evt_dtype_name(dt), er, tol);
          r->mismatches++;
        }
        continue;
      }
      double ex = evt_cuda_rel_error(&gpu[k], &exact[k], sx);
      if (!(er <= r->gpu_ref)) r->gpu_ref = er;
      if (!(ex <= r->gpu_exact)) r->gpu_exact = ex;
      if (!(ex <= r->bound) && !(er <= 1e-2)) {
        fprintf(out,
                "check: step %ld output %%%s (%s): max rel error %.3g against the exact (fp64) answer > %.3g "
                "(max(1e-2, 2 x %.3g, the per-node %s interpreter's own distance)), %.3g against that interpreter: "
                "MISMATCH\n",
                step, name, evt_dtype_name(dt), ex, r->bound, r->ref_exact, evt_dtype_name(dt), er);
        r->mismatches++;
      }
    }
  }
  free(anc);
  free(anc8);
  free(e8);
  free(noise8);
  for (int k = 0; k < no; k++) {
    evt_tensor_free(&ref[k]);
    evt_tensor_free(&exact[k]);
  }
  free(ref);
  free(exact);
  return st;
}
