// GPU check of the fp8 kernels against evt's CPU reference (src/ir/fp8.c's codes, exact sums in double); run by
// tests/gpu/run.sh (kernels group). Prints "N passed, N failed".
//   1. the row kernels' fp8 conversions (kernels/evt_rows.cuh to_f / from_f): every code decoded, and special and
//      random floats encoded, bit for bit as evt_fp8_from_f32 / evt_fp8_to_f32 (NaN keeps its sign; ±inf and finite
//      values past the largest code saturate to ±max);
//   2. the fp8 recipe's row kernels (evt_rspec_fp8_example: quantize, dequantize, row amax; e4m3 and e5m2) on fresh
//      random inputs with outliers beyond the fp8 range: fp8 outputs bit for bit, f32 outputs exactly;
//   3. the fp8 GEMM + rescale epilogue (evt_kspec_fp8_example: e4m3 x e4m3, e4m3 x e5m2, e5m2 x e4m3, layout NT, D bf16)
//      on fresh random fp8 operands: D within a relative Frobenius error of 1e-2 of the exact product times the scale;
//      and with D f32 (the fp8 pass's GEMMs), within 1e-3: the error printed is then the tensor cores' own
//      accumulation error, which the bf16 store hides.
#include <cuda_fp8.h>

#include "evt_rows.cuh"
#include "gpu_util.h"
#include "evt_row_launch.h"
extern "C" {  // (ir.h declares C functions without a C++ guard)
#include "ir/ir.h"
}

typedef int (*row_fn)(const evt_row_launch_args *);

#include "check_report.h"

template <class T>
__global__ void encode_kernel(const float *x, unsigned char *code, float *back, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  T v = evt_rows::from_f<T>(x[i]);
  code[i] = *reinterpret_cast<unsigned char *>(&v);
  back[i] = evt_rows::to_f(v);
}

static bool same_float(float a, float b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

// Special values of format f (max, ties around it and in the subnormals, infinities, NaNs of both signs) and random
// floats over many binades.
static std::vector<float> conversion_inputs(evt_dtype f, Rng &rng) {
  float mx = f == EVT_F8E4M3 ? 448.f : 57344.f, sub = f == EVT_F8E4M3 ? ldexpf(1.f, -9) : ldexpf(1.f, -16);
  std::vector<float> x = {0.f, -0.f, mx, -mx, mx * 1.03f, mx * 1.07f, -mx * 1.2f, INFINITY, -INFINITY, NAN, -NAN,
                          sub, sub * 0.5f, sub * 0.51f, sub * 1.5f, sub * 2.5f, 1e-30f, -1e-30f, 3.4e38f};
  for (int i = 0; i < 200000; i++) {
    float u = rng.uniform(-1.f, 1.f);
    x.push_back(u * ldexpf(1.f, (int)(rng.uniform(0.f, 1.f) * 44.f) - 24));
  }
  for (int c = 0; c < 256; c++) x.push_back(evt_fp8_to_f32((uint8_t)c, f));  // every code, decoded and encoded back
  return x;
}

static void check_conversions(evt_dtype f, Rng &rng) {
  std::vector<float> x = conversion_inputs(f, rng);
  int n = (int)x.size();
  float *dx, *dback;
  unsigned char *dcode;
  CUDA_CHECK(cudaMalloc(&dx, n * 4));
  CUDA_CHECK(cudaMalloc(&dback, n * 4));
  CUDA_CHECK(cudaMalloc(&dcode, n));
  CUDA_CHECK(cudaMemcpy(dx, x.data(), n * 4, cudaMemcpyHostToDevice));
  if (f == EVT_F8E4M3) encode_kernel<__nv_fp8_e4m3><<<(n + 255) / 256, 256>>>(dx, dcode, dback, n);
  else encode_kernel<__nv_fp8_e5m2><<<(n + 255) / 256, 256>>>(dx, dcode, dback, n);
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<unsigned char> code(n);
  std::vector<float> back(n);
  CUDA_CHECK(cudaMemcpy(code.data(), dcode, n, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(back.data(), dback, n * 4, cudaMemcpyDeviceToHost));
  int bad = 0, first = -1;
  for (int i = 0; i < n; i++) {
    uint8_t want = evt_fp8_from_f32(x[i], f);
    if (code[i] != want || !same_float(back[i], evt_fp8_to_f32(want, f))) bad++, first = first < 0 ? i : first;
  }
  report(bad == 0, "%-8s conversions: %d values, %d differ%s", evt_dtype_name(f), n, bad, bad ? " (first below)" : "");
  if (bad)
    printf("     x = %a: code 0x%02x, want 0x%02x\n", x[first], code[first], evt_fp8_from_f32(x[first], f));
  cudaFree(dx), cudaFree(dback), cudaFree(dcode);
}

static void *jit_one(const char *name, char *src) {
  evt_jit_job job;
  memset(&job, 0, sizeof job);
  job.name = name;
  job.source = src;
  char msg[2048];
  evt_jit_compile(&job, 1, nullptr, msg, sizeof msg);
  free(src);
  if (!job.ok) {
    fprintf(stderr, "JIT %s: %s\n", name, job.error);
    return nullptr;
  }
  void *h = dlopen(job.so_path, RTLD_NOW | RTLD_LOCAL);
  return h ? dlsym(h, name) : nullptr;
}

// Host values of x in [-8, 8) with every 50th element an outlier in [-1e5, 1e5) (beyond both fp8 ranges once scaled),
// rounded to bf16; codes of fp8 tensors drawn uniformly over the finite ones.
static std::vector<float> bf16_values(size_t n, Rng &rng) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i++) v[i] = __bfloat162float(__float2bfloat16_rn(i % 50 ? rng.uniform(-8.f, 8.f) : rng.uniform(-1e5f, 1e5f)));
  return v;
}
static std::vector<unsigned char> fp8_codes(size_t n, evt_dtype f, Rng &rng) {
  std::vector<unsigned char> c(n);
  for (size_t i = 0; i < n; i++) {
    do c[i] = (unsigned char)(rng.uniform(0.f, 1.f) * 256.f);
    while (!std::isfinite(evt_fp8_to_f32(c[i], f)));
  }
  return c;
}

template <class T>
static T *upload(const std::vector<T> &h) {
  T *d;
  CUDA_CHECK(cudaMalloc(&d, h.size() * sizeof(T) + 16));
  CUDA_CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}
template <class T>
static std::vector<T> fetch(const void *d, size_t n) {
  std::vector<T> h(n);
  CUDA_CHECK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

// One row kernel of the fp8 recipe at M x N; outputs compared exactly with the host computation in f32.
static void check_row(const char *ex, evt_dtype f, row_fn fn, int m, int n, Rng &rng) {
  size_t mn = (size_t)m * n;
  float scale = rng.uniform(0.5f, 64.f);
  std::vector<float> sc = {scale};
  evt_row_launch_args a;
  memset(&a, 0, sizeof a);
  a.m = m, a.n = n;
  std::vector<float> x = bf16_values(mn, rng);
  std::vector<__nv_bfloat16> xb(mn);
  for (size_t i = 0; i < mn; i++) xb[i] = __float2bfloat16_rn(x[i]);
  std::vector<unsigned char> q = fp8_codes(mn, f, rng);
  bool quant = !strcmp(ex, "quantize"), deq = !strcmp(ex, "dequantize");
  a.ptrs[0] = quant || !deq ? (void *)upload(xb) : (void *)upload(q);
  a.ptrs[1] = quant || deq ? (void *)upload(sc) : nullptr;
  size_t out_n = deq || quant ? mn : (size_t)m, out_b = quant ? 1 : 4;
  int out = quant || deq ? 3 : 2;
  CUDA_CHECK(cudaMalloc(&a.ptrs[out], out_n * out_b + 16));
  CUDA_CHECK(cudaMemset(a.ptrs[out], 0xFF, out_n * out_b));
  int rc = fn(&a);
  CUDA_CHECK(cudaDeviceSynchronize());
  size_t bad = 0;
  if (quant) {
    std::vector<unsigned char> got = fetch<unsigned char>(a.ptrs[out], mn);
    for (size_t i = 0; i < mn; i++) bad += got[i] != evt_fp8_from_f32(x[i] * scale, f);
  } else if (deq) {
    std::vector<float> got = fetch<float>(a.ptrs[out], mn);
    for (size_t i = 0; i < mn; i++) bad += !same_float(got[i], evt_fp8_to_f32(q[i], f) * scale);
  } else {
    std::vector<float> got = fetch<float>(a.ptrs[out], (size_t)m);
    for (int i = 0; i < m; i++) {
      float mx = 0.f;
      for (int j = 0; j < n; j++) mx = fmaxf(mx, fabsf(x[(size_t)i * n + j]));
      bad += got[i] != mx;
    }
  }
  report(rc == 0 && bad == 0, "%-10s %-7s %5dx%-5d: rc %d, %zu of %zu outputs differ", ex, evt_dtype_name(f), m, n, rc, bad,
         out_n);
  for (int i = 0; i < 4; i++)
    if (a.ptrs[i]) cudaFree(a.ptrs[i]);
}

static void check_rows_fp8(Rng &rng) {
  static const char *const names[3] = {"quantize", "dequantize", "amax_rows"};
  const int sizes[][2] = {{300, 1024}, {37, 1000}, {129, 100}, {5, 1}, {4099, 64}, {6, 40000}};
  for (evt_dtype f : {EVT_F8E4M3, EVT_F8E5M2})
    for (const char *ex : names) {
      evt_rspec s;
      char err[256], name[40];
      evt_rspec_fp8_example(&s, ex, f);
      evt_rspec_kernel_name(&s, name);
      char *src = evt_emit_rows(&s, err, sizeof err);
      row_fn fn = src ? (row_fn)jit_one(name, src) : nullptr;
      if (!fn) {
        report(false, "%-10s %-7s: not compiled (%s)", ex, evt_dtype_name(f), src ? "JIT" : err);
        continue;
      }
      for (auto &sz : sizes) check_row(ex, f, fn, sz[0], sz[1], rng);
    }
}

// D = (A·B) · inv with A M x K and B stored N x K (layout NT), exact in double.
static void check_gemm(evt_dtype fa, evt_dtype fb, evt_dtype fd, evt_launch_fn fn, int m, int n, int k, Rng &rng) {
  std::vector<unsigned char> a = fp8_codes((size_t)m * k, fa, rng), b = fp8_codes((size_t)n * k, fb, rng);
  float inv = rng.uniform(1e-4f, 1e-2f);
  std::vector<float> iv = {inv};
  evt_launch_args args;
  memset(&args, 0, sizeof args);
  args.m = m, args.n = n, args.k = k;
  args.a = upload(a);
  args.b = upload(b);
  args.ptrs[1] = upload(iv);
  void *d;
  const size_t dbytes = fd == EVT_F32 ? 4 : 2;
  CUDA_CHECK(cudaMalloc(&d, (size_t)m * n * dbytes));
  CUDA_CHECK(cudaMemset(d, 0xFF, (size_t)m * n * dbytes));
  args.d = d;
  int rc = fn(&args);
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaGetLastError());
  std::vector<double> got((size_t)m * n);
  if (fd == EVT_F32) {
    std::vector<float> g = fetch<float>(d, got.size());
    for (size_t i = 0; i < got.size(); i++) got[i] = g[i];
  } else {
    std::vector<__nv_bfloat16> g = fetch<__nv_bfloat16>(d, got.size());
    for (size_t i = 0; i < got.size(); i++) got[i] = __bfloat162float(g[i]);
  }
  std::vector<double> da((size_t)m * k), db((size_t)n * k);
  for (size_t i = 0; i < da.size(); i++) da[i] = evt_fp8_to_f32(a[i], fa);
  for (size_t i = 0; i < db.size(); i++) db[i] = evt_fp8_to_f32(b[i], fb);
  double num = 0, den = 0;
  for (int i = 0; i < m; i++)
    for (int j = 0; j < n; j++) {
      double r = 0;
      for (int l = 0; l < k; l++) r += da[(size_t)i * k + l] * db[(size_t)j * k + l];
      r *= inv;
      double g = got[(size_t)i * n + j], e = g - r;
      num += std::isfinite(g) ? e * e : INFINITY;
      den += r * r;
    }
  double rel = sqrt(num / (den > 0 ? den : 1));
  report(rc == 0 && rel <= (fd == EVT_F32 ? 1e-3 : 1e-2), "fp8 GEMM %s x %s -> %s %5dx%5dx%5d: rc %d, D rel err %.3e",
         evt_dtype_name(fa), evt_dtype_name(fb), evt_dtype_name(fd), m, n, k, rc, rel);
  cudaFree((void *)args.a), cudaFree((void *)args.b), cudaFree(args.ptrs[1]), cudaFree(d);
}

static void check_gemms(Rng &rng) {
  const evt_dtype ops[4][3] = {{EVT_F8E4M3, EVT_F8E4M3, EVT_BF16}, {EVT_F8E4M3, EVT_F8E5M2, EVT_BF16},
                               {EVT_F8E5M2, EVT_F8E4M3, EVT_BF16}, {EVT_F8E4M3, EVT_F8E5M2, EVT_F32}};
  const int sizes[][3] = {{256, 384, 1024}, {1032, 776, 528}, {128, 128, 16}, {256, 256, 256}};
  for (auto &op : ops) {
    evt_kspec s;
    char err[256], name[40];
    evt_kspec_fp8_example(&s, op[0], op[1], op[2]);
    evt_kspec_kernel_name(&s, name);
    char *src = evt_emit_cutlass(&s, err, sizeof err);
    evt_launch_fn fn = src ? (evt_launch_fn)jit_one(name, src) : nullptr;
    if (!fn) {
      report(false, "fp8 GEMM %s x %s: not compiled (%s)", evt_dtype_name(op[0]), evt_dtype_name(op[1]), src ? "JIT" : err);
      continue;
    }
    for (auto &sz : sizes) check_gemm(op[0], op[1], op[2], fn, sz[0], sz[1], sz[2], rng);
  }
}

int main() {
  Rng rng(20260);
  check_conversions(EVT_F8E4M3, rng);
  check_conversions(EVT_F8E5M2, rng);
  check_rows_fp8(rng);
  check_gemms(rng);
  return report_summary();
}
