// Hand-written device code of evt's row kernels (reduce-apply nuclei and nucleus-free groups), included by
// the CUDA C++ that src/evt/emit_rows.c generates. Spec semantics: src/evt/rspec.h; ABI: evt_row_launch.h.
//
// Layout of work: a CTA holds R row-groups of WARPS warps (T = 32·WARPS threads); a row-group owns one row
// at a time and keeps it in registers as VPT chunks of 8 elements per thread: thread t holds columns
// j = (v·T + t)·8 + e, v < VPT, e < 8. A chunk moves with one or two 16-byte accesses when `full`
// (the launcher checked N % 8 == 0 and 16-byte aligned pointers, and the chunk lies inside the row),
// otherwise element by element with bounds checks. Reductions within a row: butterfly warp shuffles, then
// one shared-memory slot per warp, summed by every thread in the same order (deterministic; all threads of
// a group see the same value); the group synchronizes on its own named barrier. Kernels are persistent (one
// wave of CTAs, a grid-stride loop over rows) and fetch the next row's M×N inputs into raw registers before
// working on the current one; per-column N-vectors (w, b, row broadcasts) are loaded once per thread. Elementwise math matches evt_vop_apply (src/evt/vref.c).
#ifndef EVT_ROWS_CUH
#define EVT_ROWS_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

namespace evt_rows {

// ---- conversions and chunk access ------------------------------------------------------------------------
__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
template <class T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ __half from_f<__half>(float x) { return __float2half_rn(x); }

template <class T>
__device__ __forceinline__ void load8(const T *__restrict__ p, int j0, int n, bool full, float (&o)[8]) {
  if (full) {
    alignas(16) T tmp[8];
    constexpr int NV = (int)sizeof(T) * 8 / 16;
#pragma unroll
    for (int k = 0; k < NV; k++) reinterpret_cast<uint4 *>(tmp)[k] = reinterpret_cast<const uint4 *>(p + j0)[k];
#pragma unroll
    for (int e = 0; e < 8; e++) o[e] = to_f(tmp[e]);
  } else {
#pragma unroll
    for (int e = 0; e < 8; e++) o[e] = j0 + e < n ? to_f(p[j0 + e]) : 0.f;
  }
}

template <class T>
__device__ __forceinline__ void store8(T *__restrict__ p, int j0, int n, bool full, const float (&v)[8]) {
  if (full) {
    alignas(16) T tmp[8];
#pragma unroll
    for (int e = 0; e < 8; e++) tmp[e] = from_f<T>(v[e]);
    constexpr int NV = (int)sizeof(T) * 8 / 16;
#pragma unroll
    for (int k = 0; k < NV; k++) reinterpret_cast<uint4 *>(p + j0)[k] = reinterpret_cast<const uint4 *>(tmp)[k];
  } else {
#pragma unroll
    for (int e = 0; e < 8; e++)
      if (j0 + e < n) p[j0 + e] = from_f<T>(v[e]);
  }
}

// A whole row (VPT chunks) into registers; zeros outside the row or for a dead row-group.
template <int T, int VPT, class E>
__device__ __forceinline__ void load_row(const E *__restrict__ p, int n, int t, bool live, bool vec, float (&o)[VPT][8]) {
#pragma unroll
  for (int v = 0; v < VPT; v++) {
    const int j0 = (v * T + t) * 8;
    if (live && j0 < n) {
      load8(p, j0, n, vec && j0 + 8 <= n, o[v]);
    } else {
#pragma unroll
      for (int e = 0; e < 8; e++) o[v][e] = 0.f;
    }
  }
}

// A chunk of 8 elements in its storage type (4 or 8 registers): the prefetch buffer of the next row, so
// its loads stay in flight while the current row is reduced and written.
template <class T>
struct Raw8 {
  uint4 u[(int)sizeof(T) * 8 / 16];
};
template <class T>
__device__ __forceinline__ void fetch8(const T *__restrict__ p, int j0, int n, bool full, Raw8<T> &r) {
  if (full) {
#pragma unroll
    for (int k = 0; k < (int)sizeof(T) * 8 / 16; k++) r.u[k] = reinterpret_cast<const uint4 *>(p + j0)[k];
  } else {
    T *q = reinterpret_cast<T *>(r.u);
#pragma unroll
    for (int e = 0; e < 8; e++) q[e] = j0 + e < n ? p[j0 + e] : from_f<T>(0.f);
  }
}
template <class T>
__device__ __forceinline__ void unpack8(const Raw8<T> &r, float (&o)[8]) {
  const T *q = reinterpret_cast<const T *>(r.u);
#pragma unroll
  for (int e = 0; e < 8; e++) o[e] = to_f(q[e]);
}
// Row `p` (already offset to the row) into raw chunks; zeros outside the row or when !live.
template <int T, int VPT, class E>
__device__ __forceinline__ void fetch_row(const E *__restrict__ p, int n, int t, bool live, bool vec, Raw8<E> (&r)[VPT]) {
#pragma unroll
  for (int v = 0; v < VPT; v++) {
    const int j0 = (v * T + t) * 8;
    if (live && j0 < n) {
      fetch8(p, j0, n, vec && j0 + 8 <= n, r[v]);
    } else {
#pragma unroll
      for (int k = 0; k < (int)sizeof(E) * 8 / 16; k++) r[v].u[k] = make_uint4(0, 0, 0, 0);
    }
  }
}
template <int VPT, class E>
__device__ __forceinline__ void unpack_row(const Raw8<E> (&r)[VPT], float (&o)[VPT][8]) {
#pragma unroll
  for (int v = 0; v < VPT; v++) unpack8(r[v], o[v]);
}

// ---- reductions --------------------------------------------------------------------------------------------
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return __shfl_sync(0xffffffffu, v, 0);  // lanes may differ in the last bit: take lane 0's
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Barrier of this thread's row-group only (named barrier g + 1; id 0 is __syncthreads), so row-groups of a
// CTA do not wait for each other.
template <int WARPS>
__device__ __forceinline__ void group_sync() {
  if (WARPS == 1)
    __syncwarp();
  else
    asm volatile("bar.sync %0, %1;" ::"r"((int)(threadIdx.x / (WARPS * 32)) + 1), "r"(WARPS * 32) : "memory");
}
// red: this row-group's WARPS shared floats.
template <int WARPS>
__device__ __forceinline__ float group_sum(float v, float *red) {
  v = warp_sum(v);
  if (WARPS == 1) return v;
  group_sync<WARPS>();  // earlier readers of red are done
  if ((threadIdx.x & 31) == 0) red[(threadIdx.x >> 5) % WARPS] = v;
  group_sync<WARPS>();
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < WARPS; k++) s += red[k];
  return s;
}
// Two sums with one barrier pair; red must hold 2·WARPS floats.
template <int WARPS>
__device__ __forceinline__ void group_sum2(float &a, float &b, float *red) {
  a = warp_sum(a);
  b = warp_sum(b);
  if (WARPS == 1) return;
  group_sync<WARPS>();
  if ((threadIdx.x & 31) == 0) {
    red[(threadIdx.x >> 5) % WARPS] = a;
    red[WARPS + (threadIdx.x >> 5) % WARPS] = b;
  }
  group_sync<WARPS>();
  a = b = 0.f;
#pragma unroll
  for (int k = 0; k < WARPS; k++) {
    a += red[k];
    b += red[WARPS + k];
  }
}
template <int WARPS>
__device__ __forceinline__ float group_max(float v, float *red) {
  v = warp_max(v);
  if (WARPS == 1) return v;
  group_sync<WARPS>();
  if ((threadIdx.x & 31) == 0) red[(threadIdx.x >> 5) % WARPS] = v;
  group_sync<WARPS>();
  float s = -INFINITY;
#pragma unroll
  for (int k = 0; k < WARPS; k++) s = fmaxf(s, red[k]);
  return s;
}

#define EVT_ROWS_FOR_VALID(body)                   \
  _Pragma("unroll") for (int v = 0; v < VPT; v++)  \
    _Pragma("unroll") for (int e = 0; e < 8; e++) { \
      const bool ok = (v * T + t) * 8 + e < n;      \
      body                                          \
    }

// ---- nuclei --------------------------------------------------------------------------------------------------
// y = exp(x − max) / Σ exp(x − max)
template <int WARPS, int VPT>
__device__ __forceinline__ void softmax(const float (&x)[VPT][8], float (&y)[VPT][8], int n, int t, float *red) {
  constexpr int T = WARPS * 32;
  float mx = -INFINITY;
  EVT_ROWS_FOR_VALID(if (ok) mx = fmaxf(mx, x[v][e]);)
  mx = group_max<WARPS>(mx, red);
  float s = 0.f;
  const float mx2 = mx * 1.4426950408889634f;  // exp(x − max) = 2^(x·log2 e − max·log2 e): one FMA + MUFU.EX2
  EVT_ROWS_FOR_VALID(y[v][e] = ok ? exp2f(fmaf(x[v][e], 1.4426950408889634f, -mx2)) : 0.f; s += y[v][e];)
  s = group_sum<WARPS>(s, red);
  const float inv = 1.f / s;
  EVT_ROWS_FOR_VALID((void)ok; y[v][e] *= inv;)
}

// dx = y · (dy − Σ dy·y)
template <int WARPS, int VPT>
__device__ __forceinline__ void softmax_bwd(const float (&dy)[VPT][8], const float (&y)[VPT][8], float (&dx)[VPT][8],
                                            int n, int t, float *red) {
  constexpr int T = WARPS * 32;
  float dot = 0.f;
  EVT_ROWS_FOR_VALID(if (ok) dot += dy[v][e] * y[v][e];)
  dot = group_sum<WARPS>(dot, red);
  EVT_ROWS_FOR_VALID((void)ok; dx[v][e] = y[v][e] * (dy[v][e] - dot);)
}

// mean, rstd of x (two passes over the registers: exact variance, no E[x²] − E[x]² cancellation); x̂.
template <int WARPS, int VPT>
__device__ __forceinline__ void ln_stats(const float (&x)[VPT][8], float eps, float (&xh)[VPT][8], float *mean,
                                         float *rstd, int n, int t, float *red) {
  constexpr int T = WARPS * 32;
  float s = 0.f;
  EVT_ROWS_FOR_VALID(if (ok) s += x[v][e];)
  const float mu = group_sum<WARPS>(s, red) / (float)n;
  float q = 0.f;
  EVT_ROWS_FOR_VALID(const float d = ok ? x[v][e] - mu : 0.f; q += d * d; xh[v][e] = d;)
  const float rs = rsqrtf(group_sum<WARPS>(q, red) / (float)n + eps);
  EVT_ROWS_FOR_VALID((void)ok; xh[v][e] *= rs;)
  *mean = mu;
  *rstd = rs;
}

// y = x̂ (· w) (+ b); w, b: this thread's columns of the N-vectors (HW / HB: present)
template <int WARPS, int VPT, bool HW, bool HB>
__device__ __forceinline__ void layernorm(const float (&x)[VPT][8], const float (&w)[VPT][8], const float (&b)[VPT][8],
                                          float eps, float (&xh)[VPT][8], float (&y)[VPT][8], float *mean, float *rstd,
                                          int n, int t, float *red) {
  constexpr int T = WARPS * 32;
  ln_stats<WARPS, VPT>(x, eps, xh, mean, rstd, n, t, red);
  EVT_ROWS_FOR_VALID((void)ok; y[v][e] = xh[v][e] * (HW ? w[v][e] : 1.f) + (HB ? b[v][e] : 0.f);)
}

// dx = rstd · (g − mean(g) − x̂ · mean(g·x̂)), g = dy (· w); mean/rstd recomputed from x.
template <int WARPS, int VPT, bool HW>
__device__ __forceinline__ void layernorm_bwd(const float (&dy)[VPT][8], const float (&x)[VPT][8], const float (&w)[VPT][8],
                                              float eps, float (&xh)[VPT][8], float (&dx)[VPT][8], int n, int t,
                                              float *red) {
  constexpr int T = WARPS * 32;
  float mu, rs;
  ln_stats<WARPS, VPT>(x, eps, xh, &mu, &rs, n, t, red);
  float g[VPT][8];
  EVT_ROWS_FOR_VALID((void)ok; g[v][e] = HW ? dy[v][e] * w[v][e] : dy[v][e];)
  float sg = 0.f, sgx = 0.f;
  EVT_ROWS_FOR_VALID(if (ok) { sg += g[v][e]; sgx += g[v][e] * xh[v][e]; })
  group_sum2<WARPS>(sg, sgx, red);
  const float mg = sg / (float)n, mgx = sgx / (float)n;
  EVT_ROWS_FOR_VALID((void)ok; dx[v][e] = rs * (g[v][e] - mg - xh[v][e] * mgx);)
}

// ---- elementwise ops (evt_vop_apply) --------------------------------------------------------------------------
__device__ __forceinline__ float relu(float x) { return x > 0.f ? x : (x != x ? x : 0.f); }
__device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }
__device__ __forceinline__ float gelu_erf(float x) { return 0.5f * x * (1.f + erff(x * 0.70710678118654752f)); }
__device__ __forceinline__ float gelu_tanh(float x) {
  return 0.5f * x * (1.f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}
__device__ __forceinline__ float gelu_erf_grad(float dy, float x) {
  const float cdf = 0.5f * (1.f + erff(x * 0.70710678118654752f));
  const float pdf = 0.39894228040143268f * expf(-0.5f * x * x);
  return dy * (cdf + x * pdf);
}
__device__ __forceinline__ float gelu_tanh_grad(float dy, float x) {
  const float k0 = 0.7978845608028654f, k1 = 0.044715f;
  const float th = tanhf(k0 * (x + k1 * x * x * x));
  return dy * (0.5f * (1.f + th) + 0.5f * x * (1.f - th * th) * k0 * (1.f + 3.f * k1 * x * x));
}
__device__ __forceinline__ float relu_grad(float dy, float x) { return x > 0.f ? dy : 0.f; }

// ---- deterministic Σ over M (row_sum) ---------------------------------------------------------------------------
// Adds this CTA's R row-group partials into its workspace row ws_row[0..n) in group order.
template <int T, int VPT, int R>
__device__ __forceinline__ void flush_rowsum(const float (&acc)[VPT][8], float *ws_row, int n, int g, int t) {
#pragma unroll 1
  for (int gg = 0; gg < R; gg++) {
    if (g == gg) {
#pragma unroll
      for (int v = 0; v < VPT; v++)
#pragma unroll
        for (int e = 0; e < 8; e++) {
          const int j = (v * T + t) * 8 + e;
          if (j < n) ws_row[j] = (gg == 0 ? 0.f : ws_row[j]) + acc[v][e];
        }
    }
    if (R > 1) __syncthreads();
  }
}

// out[j] = Σ_{b < parts} ws[b·n + j] in a fixed order: thread (x, y) of a 32×32 block sums b ≡ y (mod 32)
// ascending (loads unrolled by 8, so they are in flight together), then y = 0..31 are added in order.
// Grid: (ceil(n / 32), number of sums); sum k reads ws + k·parts·n and writes out.p[k].
struct RowSumOuts {
  float *p[8];
};
static __global__ void __launch_bounds__(1024) rowsum_finalize(const float *__restrict__ ws, int parts, int n,
                                                               RowSumOuts out) {
  __shared__ float s[32][33];
  const int j = blockIdx.x * 32 + threadIdx.x;
  const float *w = ws + (size_t)blockIdx.y * parts * n;
  float a = 0.f;
  if (j < n) {
#pragma unroll 8
    for (int b = threadIdx.y; b < parts; b += 32) a += w[(size_t)b * n + j];
  }
  s[threadIdx.y][threadIdx.x] = a;
  __syncthreads();
  if (threadIdx.y == 0 && j < n) {
    float r = 0.f;
#pragma unroll
    for (int k = 0; k < 32; k++) r += s[k][threadIdx.x];
    out.p[blockIdx.y][j] = r;
  }
}

// ---- launch configuration -----------------------------------------------------------------------------------------
// Smallest VPT (1, 2, 4) whose warp count fits (8, 16, 32 warps), warps rounded up to a power of two.
// Returns 0 when N is longer than 32 warps × 32 lanes × 4 chunks × 8 = 32768 elements.
static inline int pick_config(int n, int *warps, int *vpt) {
  const int chunks = (n + 7) / 8;
  const int caps[3][2] = {{1, 8}, {2, 16}, {4, 32}};
  for (int k = 0; k < 3; k++) {
    const int need = (chunks + 32 * caps[k][0] - 1) / (32 * caps[k][0]);
    if (need <= caps[k][1]) {
      int w = 1;
      while (w < need) w *= 2;
      *warps = w;
      *vpt = caps[k][0];
      return 1;
    }
  }
  return 0;
}

}  // namespace evt_rows

#endif
