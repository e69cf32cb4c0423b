/* kernels/evt_math.h on the host: the branch-free GELU every generated kernel evaluates (GEMM epilogues and row
 * kernels), against the reference semantics of src/codegen/vref.c (double precision). The host path computes the MUFU
 * approximations (rcp, exp2) exactly, so this checks the formula and its coefficients; the GPU tests check the device
 * code against the interpreter. */
#include <math.h>

#include "codegen/kspec.h"
#include "evt_math.h"
#include "test.h"

/* The exact GELU in double, as a tail-accurate reference (vref's 0.5·x·(1 + erf(x/√2)) loses relative accuracy in
 * the far negative tail, where 1 + erf cancels) */
static double gelu_exact(double x) { return 0.5 * x * erfc(-x / sqrt(2.0)); }
static double gelu_grad_exact(double dy, double x) {
  return dy * (0.5 * erfc(-x / sqrt(2.0)) + x * exp(-0.5 * x * x) / sqrt(2.0 * M_PI));
}

TEST(evt_math_gelu_matches_the_exact_gelu) {
  double worst = 0, worst_grad = 0, worst_vref = 0;
  for (int i = -40000; i <= 40000; i++) { /* x in [-10, 10] step 2.5e-4, plus the points between */
    const float x = (float)(i * 2.5e-4 + (i % 7) * 1.3e-5);
    const double g = gelu_exact(x), gg = gelu_grad_exact(0.75, x);
    if (fabs(g) > 1e-30) worst = fmax(worst, fabs(evt_gelu_erf(x) - g) / fabs(g));
    /* the derivative crosses zero near x = -0.75, where Φ and x·φ cancel: relative to dy·Φ, the terms' scale */
    worst_grad = fmax(worst_grad, fabs(evt_gelu_erf_grad(0.75f, x) - gg) / fmax(fabs(gg), 0.75 * 0.5 * erfc(-x / sqrt(2.0))));
    if (fabs(x) < 4) worst_vref = fmax(worst_vref, fabs(evt_gelu_erf(x) - evt_vop_apply(EVT_V_GELU_ERF, x, 0)) /
                                                      fmax(fabs(g), 1e-6));
  }
  CHECK_MSG(worst < 2e-5, "gelu: worst relative error %.3g", worst);
  CHECK_MSG(worst_grad < 2e-5, "gelu_grad: worst relative error %.3g", worst_grad);
  CHECK_MSG(worst_vref < 2e-5, "gelu vs the interpreter's: worst relative error %.3g", worst_vref);
  /* special values: gelu(+inf) = inf, gelu(-inf) = NaN (as PyTorch's), NaN stays NaN; Φ(0) = 1/2 */
  float e;
  CHECK(isinf(evt_gelu_erf(INFINITY)) && evt_gelu_erf(INFINITY) > 0);
  CHECK(isnan(evt_gelu_erf(-INFINITY)) && isnan(evt_gelu_erf(NAN)) && isnan(evt_gelu_erf_grad(1.f, NAN)));
  CHECK(fabsf(evt_normal_cdf(0.f, &e) - 0.5f) < 1e-6f && e == 1.f);
  CHECK(evt_gelu_erf(0.f) == 0.f && fabsf(evt_gelu_erf_grad(2.f, 0.f) - 1.f) < 1e-6f);
}

/* The tanh GELU and its derivative (the sigmoid form x·σ(2y), y = √(2/π)·(x + 0.044715·x³)): against the same
 * function in double over [-12, 12], relative (the form has no cancellation; what is left grows with the exponent
 * x·(c0 + c1·x²), rounded in f32: 1.5e-6·|x|), the derivative relative to its larger term σ(2y) (it crosses zero near
 * x = -0.75); and against the interpreter's 0.5·x·(1 + tanh y) (double) with floors (1 + tanh y leaves double
 * precision below x ≈ -7). Below x ≈ -11 the f32 exponent overflows and the result is -0 (the exact one < 1e-60). */
static double gelu_tanh_exact(double x, double *grad) {
  const double k0 = 0.7978845608028654, k1 = 0.044715, y2 = 2 * k0 * (x + k1 * x * x * x);
  const double s = 1 / (1 + exp(-y2)), oms = 1 / (1 + exp(y2));
  *grad = s + x * s * oms * 2 * k0 * (1 + 3 * k1 * x * x);
  return x * s;
}
TEST(evt_math_gelu_tanh_matches_the_exact_function) {
  double worst = 0, worst_grad = 0, worst_i = 0, worst_igrad = 0;
  for (int i = -24000; i <= 24000; i++) { /* x in [-12, 12] */
    const float x = (float)(i * 5e-4 + (i % 5) * 1.7e-5);
    double eg;
    const double e = gelu_tanh_exact(x, &eg);
    const double s = x != 0.f ? e / x : 0.5, scale = fmax(1.0, fabs(x)); /* σ(2y) */
    worst = fmax(worst, fabs(evt_gelu_tanh(x) - e) / fmax(fabs(e), 1e-30) / scale);
    worst_grad = fmax(worst_grad, fabs(evt_gelu_tanh_grad(0.75f, x) - 0.75 * eg) / fmax(0.75 * fmax(fabs(eg), s), 1e-30) / scale);
    const double g = evt_vop_apply(EVT_V_GELU_TANH, x, 0), gg = evt_vop_apply(EVT_V_GELU_TANH_GRAD, 0.75, x);
    worst_i = fmax(worst_i, fabs(evt_gelu_tanh(x) - g) / fmax(fabs(g), 1e-6));
    worst_igrad = fmax(worst_igrad, fabs(evt_gelu_tanh_grad(0.75f, x) - gg) / fmax(fabs(gg), 0.75e-2));
  }
  CHECK_MSG(worst < 1.5e-6, "gelu_tanh: worst relative error / max(1, |x|) %.3g", worst);
  CHECK_MSG(worst_grad < 1.5e-6, "gelu_tanh_grad: worst relative error / max(1, |x|) %.3g", worst_grad);
  CHECK_MSG(worst_i < 5e-6 && worst_igrad < 5e-6, "vs the interpreter: %.3g / %.3g", worst_i, worst_igrad);
  CHECK(evt_gelu_tanh(0.f) == 0.f && evt_gelu_tanh_grad(2.f, 0.f) == 1.f);
  CHECK(evt_gelu_tanh(INFINITY) == INFINITY && isnan(evt_gelu_tanh(-INFINITY)) && evt_gelu_tanh(-30.f) == 0.f);
  CHECK(evt_gelu_tanh_grad(1.f, 30.f) == 1.f && evt_gelu_tanh_grad(1.f, -30.f) == 0.f);
  CHECK(isnan(evt_gelu_tanh(NAN)) && isnan(evt_gelu_tanh_grad(1.f, NAN)));
}
