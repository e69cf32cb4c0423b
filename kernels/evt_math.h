/* Elementwise math shared by every kind of generated kernel (GEMM epilogues through evt_visitor_ops.h, row
 * kernels through evt_rows.cuh), so an op gives the same bits whichever kernel the partitioner puts it in.
 * No CUTLASS here: row kernels include this without it.
 *
 *   evt_math::normal_cdf(x, &e)  Φ(x) and e = exp(-x²/2) in one branch-free formula (GELU and its derivative:
 *                                ~12 instructions and two MUFU operations where erff + expf cost ~35)
 *   evt_math::rcp_approx, exp2_approx   the MUFU forms it uses (the host gets the exact functions)
 */
#ifndef EVT_MATH_H
#define EVT_MATH_H

#include <math.h>

#if defined(__CUDACC__)
#define EVT_MATH_HD __host__ __device__ __forceinline__
#else
#define EVT_MATH_HD static inline
#endif

namespace evt_math {

EVT_MATH_HD float rcp_approx(float x) {
#ifdef __CUDA_ARCH__
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
#else
  return 1.0f / x;
#endif
}

EVT_MATH_HD float exp2_approx(float x) {
#ifdef __CUDA_ARCH__
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
#else
  return exp2f(x);
#endif
}

/* Φ(x), the standard normal CDF, and *e = exp(-x²/2). With q = erfc(|x|/√2)/2 = t·P(t)·exp(-x²/2),
 * t = 1/(1 + 0.373·|x|/√2) and P of degree 6 fitted for the relative error of q over |x| ≤ 13.4 (where
 * exp(-x²/2) leaves f32) — at most 5.4e-7 in exact arithmetic (bench: GELU within 7.4e-6 relative and 3.7e-7
 * absolute of the exact one in f32) — Φ = q for x < 0 (relative accuracy in the tail) and 1 - q otherwise.
 * ±inf and NaN give what x·Φ(x) should: gelu(+inf) = inf, gelu(-inf) = NaN like PyTorch's, NaN stays NaN. */
EVT_MATH_HD float normal_cdf(float x, float *e) {
  float t = rcp_approx(fmaf(fabsf(x), 0.263750821f, 1.0f));
  float p = fmaf(t, -0.0695693567f, 0.205193743f);
  p = fmaf(t, p, -0.0784068257f);
  p = fmaf(t, p, 0.149989784f);
  p = fmaf(t, p, 0.0799206123f);
  p = fmaf(t, p, 0.107803389f);
  p = fmaf(t, p, 0.105068445f);
  *e = exp2_approx(x * x * -0.721347520f); /* exp(-x²/2) = 2^(-x²/(2 ln 2)) */
  float q = t * p * *e;
  return x < 0.f ? q : 1.0f - q;
}

/* x·Φ(x), the exact (erf-based) GELU */
EVT_MATH_HD float gelu_erf(float x) {
  float e;
  return x * normal_cdf(x, &e);
}

/* dy·(Φ(x) + x·φ(x)), its derivative times dy; φ(x) = e/√(2π) */
EVT_MATH_HD float gelu_erf_grad(float dy, float x) {
  float e;
  const float cdf = normal_cdf(x, &e);
  return dy * fmaf(x * 0.39894228040143268f, e, cdf);
}

}  // namespace evt_math

#endif
