// GPU check of the GEMM epilogue's compute functors (kernels/evt_visitor_ops.h), through the
// cutlass::Array<float, 4> specialization Sm90Compute calls, against the CPU element semantics evt_vop_apply3
// (src/codegen/vref.c) in double. Inputs: random in [-3, 3) with ties and special values (0, ±inf, NaN), and the GELUs
// over [-16, 16); a result matches when both are NaN, equal infinities, or |gpu − cpu| ≤ 2e-6 · max(1, |cpu|).
// Prints one line per functor and "N passed, N failed".
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "evt_visitor_ops.h"
extern "C" {
#include "codegen/examples.h"
#include "codegen/kspec.h"
}

#include "cuda_check.h"

template <template <class> class F, int A>
__global__ void apply(int n, const float *x, const float *y, const float *z, float *o) {
  int i = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
  if (i + 4 > n) return;
  cutlass::Array<float, 4> a, b, c, r;
  for (int k = 0; k < 4; k++) a[k] = x[i + k], b[k] = y[i + k], c[k] = z[i + k];
  F<cutlass::Array<float, 4>> f;
  if constexpr (A == 1) r = f(a);
  else if constexpr (A == 2) r = f(a, b);
  else r = f(a, b, c);
  for (int k = 0; k < 4; k++) o[i + k] = r[k];
}

static int g_pass = 0, g_fail = 0;

// a device copy of v (freed at exit)
static float *to_device(const std::vector<float> &v) {
  float *d;
  CUDA_CHECK(cudaMalloc(&d, v.size() * 4));
  CUDA_CHECK(cudaMemcpy(d, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
  return d;
}

template <template <class> class F, int A>
static void check(const char *name, evt_vop op, const std::vector<float> &x, const std::vector<float> &y,
                  const std::vector<float> &z, float *dx, float *dy, float *dz, float *dout) {
  int n = (int)x.size();
  apply<F, A><<<(n / 4 + 255) / 256, 256>>>(n, dx, dy, dz, dout);
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> out(n);
  CUDA_CHECK(cudaMemcpy(out.data(), dout, n * sizeof(float), cudaMemcpyDeviceToHost));
  int bad = 0;
  double worst = 0;
  for (int i = 0; i < n; i++) {
    double ref = op == EVT_V_COUNT ? (double)x[i] : evt_vop_apply3(op, x[i], y[i], z[i]);
    double g = out[i];
    bool ok;
    if (std::isnan(ref) || std::isnan(g)) ok = std::isnan(ref) && std::isnan(g);
    else if (std::isinf(ref) || std::isinf(g)) ok = ref == g;
    else {
      double e = fabs(g - ref) / fmax(1.0, fabs(ref));
      if (e > worst) worst = e;
      ok = e <= 2e-6;
    }
    if (!ok && bad++ < 3) printf("     %s(%g, %g, %g): gpu %.9g cpu %.9g\n", name, x[i], y[i], z[i], g, ref);
  }
  printf("%s %-14s %d elements, max rel err %.3e, %d differ: %s\n", bad ? "FAIL" : "ok  ", name, n, worst, bad,
         bad ? "NOT MATCHED" : "matched");
  (bad ? g_fail : g_pass)++;
}

int main() {
  const int n = 1 << 16;
  std::vector<float> x(n), y(n), z(n);
  uint64_t s = 12345;
  auto rnd = [&]() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return (float)((s >> 11) * (1.0 / 9007199254740992.0)) * 6.f - 3.f;
  };
  const float special[] = {0.f, -0.f, INFINITY, -INFINITY, NAN, 1.f, -1.f};
  for (int i = 0; i < n; i++) {
    x[i] = i % 97 < 7 ? special[i % 97] : rnd();
    y[i] = i % 89 < 7 ? special[i % 89] : (i % 5 == 0 ? x[i] : rnd());  // ties for the comparisons
    z[i] = rnd();
  }
  // the positive-domain functions get |x| (NaN stays NaN)
  std::vector<float> ax(n);
  for (int i = 0; i < n; i++) ax[i] = fabsf(x[i]);
  float *dx = to_device(x), *dy = to_device(y), *dz = to_device(z), *dax = to_device(ax), *dout;
  CUDA_CHECK(cudaMalloc(&dout, n * 4));
  check<evt_ops::Neg, 1>("neg", EVT_V_NEG, x, y, z, dx, dy, dz, dout);
  check<evt_ops::Exp, 1>("exp", EVT_V_EXP, x, y, z, dx, dy, dz, dout);
  check<evt_ops::Log, 1>("log", EVT_V_LOG, ax, y, z, dax, dy, dz, dout);
  check<evt_ops::Erf, 1>("erf", EVT_V_ERF, x, y, z, dx, dy, dz, dout);
  check<evt_ops::Tanh, 1>("tanh", EVT_V_TANH, x, y, z, dx, dy, dz, dout);
  check<evt_ops::Sqrt, 1>("sqrt", EVT_V_SQRT, ax, y, z, dax, dy, dz, dout);
  check<evt_ops::Rsqrt, 1>("rsqrt", EVT_V_RSQRT, ax, y, z, dax, dy, dz, dout);
  check<evt_ops::Reciprocal, 1>("reciprocal", EVT_V_RECIPROCAL, x, y, z, dx, dy, dz, dout);
  check<evt_ops::Abs, 1>("abs", EVT_V_ABS, x, y, z, dx, dy, dz, dout);
  check<evt_ops::Sign, 1>("sign", EVT_V_SIGN, x, y, z, dx, dy, dz, dout);
  check<evt_ops::RoundBf16, 1>("round_bf16", EVT_V_ROUND_BF16, x, y, z, dx, dy, dz, dout);
  check<evt_ops::RoundF16, 1>("round_f16", EVT_V_ROUND_F16, x, y, z, dx, dy, dz, dout);
  check<evt_ops::Maximum, 2>("maximum", EVT_V_MAXIMUM, x, y, z, dx, dy, dz, dout);
  check<evt_ops::Minimum, 2>("minimum", EVT_V_MINIMUM, x, y, z, dx, dy, dz, dout);
  check<evt_ops::Eq, 2>("eq", EVT_V_EQ, x, y, z, dx, dy, dz, dout);
  check<evt_ops::Ne, 2>("ne", EVT_V_NE, x, y, z, dx, dy, dz, dout);
  check<evt_ops::Lt, 2>("lt", EVT_V_LT, x, y, z, dx, dy, dz, dout);
  check<evt_ops::Le, 2>("le", EVT_V_LE, x, y, z, dx, dy, dz, dout);
  check<evt_ops::Gt, 2>("gt", EVT_V_GT, x, y, z, dx, dy, dz, dout);
  check<evt_ops::Ge, 2>("ge", EVT_V_GE, x, y, z, dx, dy, dz, dout);
  check<evt_ops::Keep, 2>("keep", EVT_V_KEEP, x, y, z, dx, dy, dz, dout);
  check<evt_ops::Where, 3>("where", EVT_V_WHERE, x, y, z, dx, dy, dz, dout);
  check<evt_ops::ReluGrad, 2>("relu_grad", EVT_V_RELU_GRAD, x, y, z, dx, dy, dz, dout);
  check<evt_ops::GeluErf, 1>("gelu_erf", EVT_V_GELU_ERF, x, y, z, dx, dy, dz, dout);
  check<evt_ops::GeluErfGrad, 2>("gelu_erf_grad", EVT_V_GELU_ERF_GRAD, y, x, z, dy, dx, dz, dout);
  check<evt_ops::GeluTanh, 1>("gelu_tanh", EVT_V_GELU_TANH, x, y, z, dx, dy, dz, dout);
  check<evt_ops::GeluTanhGrad, 2>("gelu_tanh_grad", EVT_V_GELU_TANH_GRAD, y, x, z, dy, dx, dz, dout);
  // the GELUs again over [-16, 16): their tails (exp(-x²/2) leaves f32 below x ≈ -13.4; the tanh GELU's exponent
  // overflows to inf below x ≈ -11, where the result must be -0, not NaN). dy finite here: an infinite dy times a
  // derivative below f32's range (x < -13) is NaN on the device (inf · 0) where double gives ±inf, and double's
  // 1 + tanh(y) cancels to 0 below x ≈ -8 (inf · 0 = NaN) where the sigmoid form keeps a nonzero f32 derivative.
  std::vector<float> wx(n), wy(n);
  for (int i = 0; i < n; i++) wx[i] = x[i] * (16.f / 3.f), wy[i] = std::isfinite(y[i]) ? y[i] : rnd();
  float *dwx = to_device(wx), *dwy = to_device(wy);
  check<evt_ops::GeluErf, 1>("gelu_erf_wide", EVT_V_GELU_ERF, wx, wy, z, dwx, dwy, dz, dout);
  check<evt_ops::GeluErfGrad, 2>("gelu_erf_grad_w", EVT_V_GELU_ERF_GRAD, wy, wx, z, dwy, dwx, dz, dout);
  check<evt_ops::GeluTanh, 1>("gelu_tanh_wide", EVT_V_GELU_TANH, wx, wy, z, dwx, dwy, dz, dout);
  check<evt_ops::GeluTanhGrad, 2>("gelu_tanh_grad_w", EVT_V_GELU_TANH_GRAD, wy, wx, z, dwy, dwx, dz, dout);
  printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail ? 1 : 0;
}
