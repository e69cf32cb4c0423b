/* The perturbed reference (evt_interp_run_fp8_noise: relative noise on every fp8 GEMM's product, the fp8 tensor cores'
 * accumulation error). */
#include "test.h"

#include "runtime/interp/interp.h"

/* ||a - b|| / ||b|| over the tensor. */
static double rel_norm(const evt_tensor *a, const evt_tensor *b) {
  double d = 0, r = 0;
  for (int64_t i = 0; i < b->numel; i++) d += (a->data[i] - b->data[i]) * (a->data[i] - b->data[i]), r += b->data[i] * b->data[i];
  return sqrt(d) / sqrt(r);
}

static bool same_bits(const evt_tensor *a, const evt_tensor *b) {
  return a->numel == b->numel && !memcmp(a->data, b->data, sizeof(double) * (size_t)a->numel);
}

/* Outputs of text's graph (inputs from seed 5) into out[0..noutputs), with `noise` (NULL: none) and `flags`. */
static void run_outputs(evt_graph *g, unsigned flags, const evt_fp8_noise *noise, evt_tensor *out) {
  evt_tensor *v = calloc((size_t)g->nnodes, sizeof *v);
  CHECK(evt_interp_init_inputs(g, v, 5) == EVT_OK);
  CHECK_MSG(evt_interp_run_fp8_noise(g, v, flags, 0, noise) == EVT_OK, "%s", evt_graph_error(g));
  for (int k = 0; k < g->noutputs; k++) {
    out[k] = v[g->outputs[k]];
    memset(&v[g->outputs[k]], 0, sizeof(evt_tensor));
  }
  for (int i = 0; i < g->nnodes; i++) evt_tensor_free(&v[i]);
  free(v);
}

/* An fp8 GEMM (mixed formats, f32 result, through the BLAS) and an f32 GEMM with dropout after it, side by side. */
static const char *noise_graph =
    "graph n {\n  %a: f8e4m3[32,64] = input(init=normal, std=1.0)\n  %b: f8e5m2[64,48] = input(init=normal, std=1.0)\n"
    "  %x: f32[32,64] = input(init=normal, std=1.0)\n  %w: f32[64,48] = input(init=normal, std=1.0)\n"
    "  %y = mm(%a, %b, out_dtype=f32)\n  %z = mm(%x, %w)\n  %d = dropout(%z, p=0.5, seed=3)\n"
    "  output %y\n  output %z\n  output %d\n}\n";

/* The perturbed reference moves an fp8 GEMM's product by at most eps relative per element (exactly so in fp64) and by
 * a positive amount in norm; the same seed gives the same bits, another seed other bits; the f32 GEMM and the dropout
 * mask after it are bit-identical to the plain run. */
TEST(fp8_noise_perturbs_fp8_gemms_only) {
  evt_graph *g = evt_test_parse_ok(noise_graph);
  if (!g) return;
  const double eps = 0x1p-12;
  evt_fp8_noise n1 = {.eps = eps, .seed = 1}, n2 = {.eps = eps, .seed = 2};
  evt_tensor plain[3], p1[3], p1again[3], p2[3], x64[3], p64[3];
  run_outputs(g, 0, NULL, plain);
  run_outputs(g, 0, &n1, p1);
  run_outputs(g, 0, &n1, p1again);
  run_outputs(g, 0, &n2, p2);
  run_outputs(g, EVT_RUN_FP64, NULL, x64);
  run_outputs(g, EVT_RUN_FP64, &n1, p64);
  double e = rel_norm(&p1[0], &plain[0]);
  CHECK_MSG(e > eps / 4 && e <= eps, "relative norm change %g (eps %g)", e, eps); /* uniform u: about eps / sqrt(3) */
  double worst = 0;
  for (int64_t i = 0; i < x64[0].numel; i++) worst = fmax(worst, fabs(p64[0].data[i] - x64[0].data[i]) / fabs(x64[0].data[i]));
  CHECK_MSG(worst > 0.9 * eps && worst <= eps * (1 + 1e-12), "largest element change %g (eps %g)", worst, eps);
  CHECK(same_bits(&p1[0], &p1again[0]) && !same_bits(&p1[0], &p2[0]));
  CHECK(same_bits(&p1[1], &plain[1]) && same_bits(&p1[2], &plain[2]) && same_bits(&p64[1], &x64[1]));
  for (int k = 0; k < 3; k++) {
    evt_tensor *all[6] = {&plain[k], &p1[k], &p1again[k], &p2[k], &x64[k], &p64[k]};
    for (int j = 0; j < 6; j++) evt_tensor_free(all[j]);
  }
  evt_graph_free(g);
}
