// How close two f32 GELU formulas come to the exact GELU once rounded to bf16 (host only, no GPU):
//   erff form    0.5·x·(1 + erff(x/√2)), dy·(cdf + x·φ(x)) with expf: PyTorch's CUDA formula
//   normal_cdf   evt_gelu_erf / evt_gelu_erf_grad (kernels/evt_math.h): the GEMM epilogues' and row kernels' formula
//   degree 5     the same with the tail polynomial P of degree 5 (refitted minimax, 4.0e-6, Φ(0) = 1/2 exact): one
//                instruction per element fewer in a GEMM epilogue; measured here and not taken
// against the double-precision GELU (what the CPU interpreter computes), on x ~ N(0, SCALE²), dy ~ N(0, 1).
//   g++ -O2 -Ikernels bench/kernels/gelu_accuracy.cc -o /tmp/gelu_accuracy -lm && /tmp/gelu_accuracy [SCALE] [COUNT]
// The host build evaluates evt_math.h's rcp / exp2 exactly where the GPU uses MUFU approximations (1-2 ulp).
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "evt_math.h"

// evt_normal_tail_tp with P of degree 5 (t = 1/(1 + 0.3066·|x|))
static float tail_tp_deg5(float x, float *e) {
  const float t = 1.0f / fmaf(fabsf(x), 0.306622416f, 1.0f);
  float p = fmaf(t, -0.0761068985f, 0.19507128f);
  p = fmaf(t, p, 0.00224591163f);
  p = fmaf(t, p, 0.13829346f);
  p = fmaf(t, p, 0.117888384f);
  p = fmaf(t, p, 0.122607857f);
  *e = exp2f(x * x * -0.721347520f);
  return t * p;
}
static float gelu_deg5(float x) {
  float e;
  const float q = tail_tp_deg5(x, &e) * e;
  return x * (x < 0.f ? q : 1.0f - q);
}
static float gelu_grad_deg5(float dy, float x) {
  float e;
  const float w = fmaf(fabsf(x), -0.39894228040143268f, tail_tp_deg5(x, &e)) * e;
  return dy * (x < 0.f ? w : 1.0f - w);
}

static uint16_t to_bf16(float f) {  // round to nearest even (finite inputs)
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

int main(int argc, char **argv) {
  const double scale = argc > 1 ? atof(argv[1]) : 1.0;
  const long n = argc > 2 ? atol(argv[2]) : 4000000;
  srand(1);
  long diff[2][3] = {{0, 0, 0}, {0, 0, 0}};  // [gelu, grad][erff form, normal_cdf, degree 5]
  for (long i = 0; i < n; i++) {
    const double u1 = (rand() + 1.0) / (RAND_MAX + 2.0), u2 = (rand() + 1.0) / (RAND_MAX + 2.0);
    const float x = (float)(scale * sqrt(-2 * log(u1)) * cos(2 * M_PI * u2));
    const float dy = (float)(sqrt(-2 * log(u2)) * sin(2 * M_PI * u1));
    const double xd = x, cdf_d = 0.5 * erfc(-xd / sqrt(2.0));
    const double gelu_d = xd * cdf_d, grad_d = (double)dy * (cdf_d + xd * exp(-0.5 * xd * xd) / sqrt(2 * M_PI));
    const float cdf_f = 0.5f * (1.f + erff(x * 0.70710678118654752f));
    const float gelu_f = x * cdf_f, grad_f = dy * (cdf_f + x * 0.39894228040143268f * expf(-0.5f * x * x));
    diff[0][0] += to_bf16(gelu_f) != to_bf16((float)gelu_d);
    diff[0][1] += to_bf16(evt_gelu_erf(x)) != to_bf16((float)gelu_d);
    diff[1][0] += to_bf16(grad_f) != to_bf16((float)grad_d);
    diff[1][1] += to_bf16(evt_gelu_erf_grad(dy, x)) != to_bf16((float)grad_d);
    diff[0][2] += to_bf16(gelu_deg5(x)) != to_bf16((float)gelu_d);
    diff[1][2] += to_bf16(gelu_grad_deg5(dy, x)) != to_bf16((float)grad_d);
  }
  printf("x ~ N(0, %.2f^2), %ld samples: bf16 results that differ from the exact GELU rounded to bf16\n", scale, n);
  for (int k = 0; k < 2; k++)
    printf("  %s erff form %.4f%%   normal_cdf %.4f%%   degree 5 %.4f%%\n", k ? "gelu_grad:" : "gelu:     ",
           100.0 * diff[k][0] / n, 100.0 * diff[k][1] / n, 100.0 * diff[k][2] / n);
  return 0;
}
