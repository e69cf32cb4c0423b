/* kernels/evt_math.h on the host: the branch-free GELU every generated kernel evaluates (GEMM epilogues and row
 * kernels), against the reference semantics of src/evt/vref.c (double precision). The host path computes the MUFU
 * approximations (rcp, exp2) exactly, so this checks the formula and its coefficients; the GPU tests check the device
 * code against the interpreter. */
#include <math.h>

#include "evt/kspec.h"
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

/* The tanh GELU and its derivative: the same f32 formulas as PyTorch's approximate="tanh", on tanhf, against the
 * interpreter's (double) */
TEST(evt_math_gelu_tanh_matches_the_interpreter) {
  double worst = 0, worst_grad = 0;
  for (int i = -16000; i <= 16000; i++) { /* x in [-8, 8] */
    const float x = (float)(i * 5e-4 + (i % 5) * 1.7e-5);
    const double g = evt_vop_apply(EVT_V_GELU_TANH, x, 0), gg = evt_vop_apply(EVT_V_GELU_TANH_GRAD, 0.75, x);
    /* relative, at least 1/20: 1 + tanh cancels in f32 in the negative tail (PyTorch's f32 formula alike) */
    worst = fmax(worst, fabs(evt_gelu_tanh(x) - g) / fmax(fabs(g), 1.0 / 20));
    const double th = tanh(0.7978845608028654 * (x + 0.044715 * (double)x * x * x));
    /* relative to dy·0.5·(1 + th), at least dy / 20: in f32 th reaches -1 near x = -5, where the exact derivative is
     * -4e-7 (PyTorch's f32 formula gives 0 there too) */
    worst_grad = fmax(worst_grad, fabs(evt_gelu_tanh_grad(0.75f, x) - gg) / fmax(fmax(fabs(gg), 0.75 * 0.5 * (1.0 + th)), 0.75 / 20));
  }
  CHECK_MSG(worst < 2e-5, "gelu_tanh: worst relative error %.3g", worst);
  CHECK_MSG(worst_grad < 2e-5, "gelu_tanh_grad: worst relative error %.3g", worst_grad);
  CHECK(evt_gelu_tanh(0.f) == 0.f && fabsf(evt_gelu_tanh_grad(2.f, 0.f) - 1.f) < 1e-6f);
  CHECK(isnan(evt_gelu_tanh(NAN)) && isnan(evt_gelu_tanh_grad(1.f, NAN)));
}
