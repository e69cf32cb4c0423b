/* Elementwise math shared by every kind of generated kernel (GEMM epilogues through evt_visitor_ops.h, row
 * kernels through evt_rows.cuh), so an op gives the same bits whichever kernel the partitioner puts it in. Plain C
 * as well (no CUTLASS, no namespace: the unit tests check the formula on the host, where the MUFU approximations are
 * the exact functions).
 *
 *   evt_normal_tail_tp(x, &e)  t·P(t) with Φ(-|x|) = t·P(t)·e, e = exp(-x²/2): one branch-free formula for the
 *                            normal CDF's tail (~11 instructions and two MUFU operations where erff + expf cost ~35)
 *   evt_normal_cdf(x, &e)    Φ(x) from it (GELU)
 *   evt_gelu_erf(x)          x·Φ(x), the exact (erf-based) GELU
 *   evt_gelu_erf_grad(dy, x) dy·(Φ(x) + x·φ(x)), its derivative times dy
 *   evt_gelu_tanh(x), evt_gelu_tanh_grad(dy, x)   the tanh approximation of GELU (PyTorch's approximate="tanh")
 *                            and its derivative, in the exact sigmoid form x·σ(2y): 7 / 13 instructions, two MUFU
 *                            operations (tanhf costs ~20; CUTLASS's GELU_taylor / dGELU take tanh.approx, ~5e-4
 *                            relative error)
 *   evt_rcp_approx, evt_exp2_approx   the MUFU forms they use
 */
#ifndef EVT_MATH_H
#define EVT_MATH_H

#include <math.h>

#if defined(__CUDACC__)
#define EVT_MATH_HD __host__ __device__ __forceinline__
#else
#define EVT_MATH_HD static inline
#endif

EVT_MATH_HD float evt_rcp_approx(float x) {
#ifdef __CUDA_ARCH__
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
#else
  return 1.0f / x;
#endif
}

EVT_MATH_HD float evt_exp2_approx(float x) {
#ifdef __CUDA_ARCH__
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
#else
  return exp2f(x);
#endif
}

/* q = Φ(-|x|) = erfc(|x|/√2)/2, the normal CDF's tail, and *e = exp(-x²/2), in one branch-free formula:
 * q = t·P(t)·exp(-x²/2), t = 1/(1 + 0.373·|x|/√2) and P of degree 6 fitted (minimax) for the relative error of q
 * over |x| ≤ 13.4 (where exp(-x²/2) leaves f32): at most 5.4e-7 in exact arithmetic. P keeps degree 6: degree 5
 * saves one instruction per element but makes ~7x as many bf16 results differ from the exact GELU's
 * (bench/kernels/gelu_accuracy.cc measures both). */
EVT_MATH_HD float evt_normal_tail_tp(float x, float *e) { /* t·P(t); q = t·P(t)·e */
  float t = evt_rcp_approx(fmaf(fabsf(x), 0.263750821f, 1.0f));
  float p = fmaf(t, -0.0695693567f, 0.205193743f);
  p = fmaf(t, p, -0.0784068257f);
  p = fmaf(t, p, 0.149989784f);
  p = fmaf(t, p, 0.0799206123f);
  p = fmaf(t, p, 0.107803389f);
  p = fmaf(t, p, 0.105068445f);
  *e = evt_exp2_approx(x * x * -0.721347520f); /* exp(-x²/2) = 2^(-x²/(2 ln 2)) */
  return t * p;
}

/* Φ(x), the standard normal CDF: q for x < 0 (relative accuracy in the tail) and 1 - q otherwise.
 * ±inf and NaN give what x·Φ(x) should: gelu(+inf) = inf, gelu(-inf) = NaN like PyTorch's, NaN stays NaN. */
EVT_MATH_HD float evt_normal_cdf(float x, float *e) {
  const float q = evt_normal_tail_tp(x, e) * *e;
  return x < 0.f ? q : 1.0f - q;
}

EVT_MATH_HD float evt_gelu_erf(float x) {
  float e;
  return x * evt_normal_cdf(x, &e);
}

/* dy·(Φ(x) + x·φ(x)), φ(x) = e/√(2π). With w = q - |x|·φ = (t·P(t) - |x|/√(2π))·e (one FMA inside: no
 * cancellation but the derivative's own zero near x = -0.75), Φ + x·φ = w for x < 0 and 1 - w otherwise: one
 * multiply per element fewer than Φ + x·φ from Φ. */
EVT_MATH_HD float evt_gelu_erf_grad(float dy, float x) {
  float e;
  const float w = fmaf(fabsf(x), -0.39894228040143268f, evt_normal_tail_tp(x, &e)) * e;
  return dy * (x < 0.f ? w : 1.0f - w);
}

/* The tanh GELU, 0.5·x·(1 + tanh(y)) with y = √(2/π)·(x + 0.044715·x³) (PyTorch's approximate="tanh"), in its
 * exact sigmoid form x·σ(2y) = x / (1 + exp(-2y)): seven instructions with two MUFU operations, where tanhf costs
 * ~20 and CUTLASS's GELU_taylor takes tanh.approx (~5e-4 relative error). No cancellation: relative accuracy
 * (a few ulp) over the whole range, where the 1 + tanh form loses it in the negative tail.
 * exp(-2y) = 2^(x·(c0 + c1·x²)), c0 = -2·√(2/π)·log2(e), c1 = c0·0.044715. gelu(+inf) = inf, gelu(-inf) = NaN as
 * PyTorch's, NaN stays NaN; below x ≈ -11 the exponent overflows to inf and the result is -0. */
EVT_MATH_HD float evt_gelu_tanh_exp(float x) { /* exp(-2y) */
  return evt_exp2_approx(x * fmaf(x * x, -0.102943240f, -2.30220820f));
}

EVT_MATH_HD float evt_gelu_tanh(float x) { return x * evt_rcp_approx(1.0f + evt_gelu_tanh_exp(x)); }

/* d/dx x·s = s + x·s·(1 - s)·2y', s = σ(2y) = 1 / (1 + e), e = exp(-2y), 2y' = 2·√(2/π)·(1 + 3·0.044715·x²).
 * 1 - s as e·s (a few ulp; 1.0f - s loses up to 2e-6 of the derivative near x = 5), with e capped at FLT_MAX where
 * the exponent overflows (s = 0 there: 1 - s becomes 0 instead of inf·0, and the derivative 0, its f32 value). */
EVT_MATH_HD float evt_gelu_tanh_grad(float dy, float x) {
  const float e = evt_gelu_tanh_exp(x);
  const float s = evt_rcp_approx(1.0f + e);
  const float xw = x * fmaf(x * x, 0.214064449f, 1.59576912f);
  return dy * fmaf(xw * s, fminf(e, 3.40282347e38f) * s, s);
}

#endif
