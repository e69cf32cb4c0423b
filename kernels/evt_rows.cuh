// Hand-written device code of evt's row kernels (reduce-apply nuclei and nucleus-free groups), included by
// the CUDA C++ that src/codegen/emit_rows.c generates. Spec semantics: src/codegen/rspec.h; ABI: evt_row_launch.h.
//
// Layout of work: a CTA holds R row-groups of WARPS warps (T = 32·WARPS threads); a row-group owns one row
// at a time and keeps it in registers as VPT chunks of 8 elements per thread: thread t holds columns
// j = (v·T + t)·8 + e, v < VPT, e < 8. A chunk moves with one or two 16-byte accesses when `full`
// (the launcher checked N % 8 == 0 and 16-byte aligned pointers, and the chunk lies inside the row),
// otherwise element by element with bounds checks. Reductions within a row: butterfly warp shuffles, then
// one shared-memory slot per warp, summed by every thread in the same order (deterministic; all threads of
// a group see the same value); the group synchronizes on its own named barrier. Kernels loop over rows
// (grid-stride; the launcher's grid is one wave of CTAs, or one pass for one warp per row: EVT_ROWS_WAVES*) and
// fetch the next row's M×N inputs into raw registers before working on the current one; per-column N-vectors
// (w, b, row broadcasts) are loaded once per thread. Elementwise math matches evt_vop_apply (src/codegen/vref.c).
#ifndef EVT_ROWS_CUH
#define EVT_ROWS_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include <type_traits>

#include "evt_fp8.cuh"
#include "evt_launch.h"
#include "evt_math.h"
#include "evt_row_config.h"
#include "philox.h"

#ifndef EVT_ROWS_PDL  // programmatic dependent launch of the row-sum finalize kernel (Hopper)
#define EVT_ROWS_PDL 1
#endif

#ifndef EVT_ROWS_PDL_MAIN  // the row kernels themselves as programmatic dependent launches (evt_row_config.h)
#define EVT_ROWS_PDL_MAIN EVT_ROWS_DEFAULT_PDL_MAIN
#endif
// griddepcontrol needs sm_90: a kernel compiled for an older target (its generated source defines both 0) must not
// be launched as a programmatic dependent launch either, since its device code would not wait
#if (EVT_ROWS_PDL || EVT_ROWS_PDL_MAIN) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#error "EVT_ROWS_PDL / EVT_ROWS_PDL_MAIN need sm_90 (the emitter turns them off for sm_8x targets)"
#endif

#ifndef EVT_ROWS_BF16_SHIFT  // bf16 chunks unpacked from their 32-bit words (1) or element by element (0)
#define EVT_ROWS_BF16_SHIFT 1
#endif

#ifndef EVT_ROWS_LONG_UNROLL  // long rows: blocks of a statistics pass unrolled by this much (evt_row_config.h)
#define EVT_ROWS_LONG_UNROLL EVT_ROWS_DEFAULT_LONG_UNROLL
#endif
#ifndef EVT_ROWS_CS  // cache-streaming hints on M×N chunks (evt_row_config.h; -D overrides)
#define EVT_ROWS_CS EVT_ROWS_DEFAULT_CS
#endif

namespace evt_rows {

// ---- conversions and chunk access ------------------------------------------------------------------------
__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
template <class T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ __half from_f<__half>(float x) { return __float2half_rn(x); }
// integer tensors (i64 / i32): their values ride in doubles (exact below 2^53); stores truncate like the
// interpreter (non-finite → 0)
template <> __device__ __forceinline__ long long from_f<long long>(float x) { return (long long)x; }
template <> __device__ __forceinline__ int from_f<int>(float x) { return (int)x; }
__device__ __forceinline__ long long to_int64(double v) { return isfinite(v) ? (long long)trunc(v) : 0; }
// bool tensors are u8 0/1 (as the interpreter and the kernel library store them): nonzero (NaN too) → 1
__device__ __forceinline__ float to_f(unsigned char x) { return (float)x; }
template <> __device__ __forceinline__ unsigned char from_f<unsigned char>(float x) { return x != 0.f ? 1 : 0; }
// fp8 tensors (f8e4m3, f8e5m2; one byte each, as src/ir/fp8.c codes them): loads are exact; stores are
// evt_fp8_code (evt_fp8.cuh: round to nearest even, saturating, NaN keeping its sign)
__device__ __forceinline__ float to_f(__nv_fp8_e4m3 x) { return static_cast<float>(x); }
__device__ __forceinline__ float to_f(__nv_fp8_e5m2 x) { return static_cast<float>(x); }
template <> __device__ __forceinline__ __nv_fp8_e4m3 from_f<__nv_fp8_e4m3>(float x) {
  __nv_fp8_e4m3 r;
  r.__x = evt_fp8_code<__NV_E4M3>(x);
  return r;
}
template <> __device__ __forceinline__ __nv_fp8_e5m2 from_f<__nv_fp8_e5m2>(float x) {
  __nv_fp8_e5m2 r;
  r.__x = evt_fp8_code<__NV_E5M2>(x);
  return r;
}

// u8 chunks (bool tensors) are 8 bytes: one uint2 (the launcher's vector flag implies 8-byte alignment).
__device__ __forceinline__ void load8(const unsigned char *__restrict__ p, int j0, int n, bool full, float (&o)[8]) {
  if (full) {
    const uint2 u = *reinterpret_cast<const uint2 *>(p + j0);
    const unsigned char *q = reinterpret_cast<const unsigned char *>(&u);
#pragma unroll
    for (int e = 0; e < 8; e++) o[e] = (float)q[e];
  } else {
#pragma unroll
    for (int e = 0; e < 8; e++) o[e] = j0 + e < n ? (float)p[j0 + e] : 0.f;
  }
}
__device__ __forceinline__ void store8(unsigned char *__restrict__ p, int j0, int n, bool full, const float (&v)[8]) {
  if (full) {
    uint2 u;
    unsigned char *q = reinterpret_cast<unsigned char *>(&u);
#pragma unroll
    for (int e = 0; e < 8; e++) q[e] = from_f<unsigned char>(v[e]);
    *reinterpret_cast<uint2 *>(p + j0) = u;
  } else {
#pragma unroll
    for (int e = 0; e < 8; e++)
      if (j0 + e < n) p[j0 + e] = from_f<unsigned char>(v[e]);
  }
}

template <class T>
__device__ __forceinline__ void load8(const T *__restrict__ p, int j0, int n, bool full, float (&o)[8]) {
  if constexpr (sizeof(T) == 1) {  // fp8: one 8-byte access
    if (!full) {
#pragma unroll
      for (int e = 0; e < 8; e++) o[e] = j0 + e < n ? to_f(p[j0 + e]) : 0.f;
      return;
    }
    const uint2 u = *reinterpret_cast<const uint2 *>(p + j0);
    const T *q = reinterpret_cast<const T *>(&u);
#pragma unroll
    for (int e = 0; e < 8; e++) o[e] = to_f(q[e]);
  } else if (full) {
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

// 2^x in one MUFU.EX2 (ex2.approx.ftz: ~2 ulp, denormal results flushed to 0) instead of exp2f's range fixups.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

template <class T>
__device__ __forceinline__ void store8(T *__restrict__ p, int j0, int n, bool full, const float (&v)[8]) {
  if constexpr (sizeof(T) == 1) {  // fp8: one 8-byte access
    if (!full) {
#pragma unroll
      for (int e = 0; e < 8; e++)
        if (j0 + e < n) p[j0 + e] = from_f<T>(v[e]);
      return;
    }
    uint2 u;
    T *q = reinterpret_cast<T *>(&u);
#pragma unroll
    for (int e = 0; e < 8; e++) q[e] = from_f<T>(v[e]);
    *reinterpret_cast<uint2 *>(p + j0) = u;
  } else if (full) {
    alignas(16) T tmp[8];
    if constexpr (std::is_same<T, __nv_bfloat16>::value) {
#pragma unroll
      for (int e = 0; e < 8; e += 2)  // one F2FP.BF16.PACK per pair
        *reinterpret_cast<__nv_bfloat162 *>(&tmp[e]) = __floats2bfloat162_rn(v[e], v[e + 1]);
    } else {
#pragma unroll
      for (int e = 0; e < 8; e++) tmp[e] = from_f<T>(v[e]);
    }
    constexpr int NV = (int)sizeof(T) * 8 / 16;
#pragma unroll
    for (int k = 0; k < NV; k++) {
      uint4 *q = reinterpret_cast<uint4 *>(p + j0) + k;
      const uint4 u = reinterpret_cast<const uint4 *>(tmp)[k];
      if (EVT_ROWS_CS == 1 || EVT_ROWS_CS == 3) __stcs(q, u);  // evict-first: written once, read by a later kernel
      else *q = u;
    }
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

// This thread's VPT chunks of an f32 row staged in shared memory (16-byte aligned, T·8·VPT floats).
template <int T, int VPT>
__device__ __forceinline__ void smem_row(const float *s, int t, float (&o)[VPT][8]) {
#pragma unroll
  for (int v = 0; v < VPT; v++) {
    const float4 *q = reinterpret_cast<const float4 *>(s + (v * T + t) * 8);
    const float4 a = q[0], b = q[1];
    o[v][0] = a.x, o[v][1] = a.y, o[v][2] = a.z, o[v][3] = a.w;
    o[v][4] = b.x, o[v][5] = b.y, o[v][6] = b.z, o[v][7] = b.w;
  }
}

// A chunk of 8 elements in its storage type (4 or 8 registers): the prefetch buffer of the next row, so
// its loads stay in flight while the current row is reduced and written.
template <class T>
struct Raw8 {
  uint4 u[(int)sizeof(T) * 8 / 16];
};
template <>
struct Raw8<unsigned char> {  // a bool chunk: 8 bytes
  uint2 u[1];
};
template <>
struct Raw8<__nv_fp8_e4m3> {  // fp8 chunks: 8 bytes
  uint2 u[1];
};
template <>
struct Raw8<__nv_fp8_e5m2> {
  uint2 u[1];
};
__device__ __forceinline__ void fetch8(const unsigned char *__restrict__ p, int j0, int n, bool full, Raw8<unsigned char> &r) {
  if (full) {
    r.u[0] = *reinterpret_cast<const uint2 *>(p + j0);
  } else {
    unsigned char *q = reinterpret_cast<unsigned char *>(r.u);
#pragma unroll
    for (int e = 0; e < 8; e++) q[e] = j0 + e < n ? p[j0 + e] : 0;
  }
}
template <class T>
__device__ __forceinline__ void fetch8(const T *__restrict__ p, int j0, int n, bool full, Raw8<T> &r) {
  if (full) {
    if constexpr (sizeof(T) == 1) {  // fp8: one 8-byte access
      r.u[0] = *reinterpret_cast<const uint2 *>(p + j0);
    } else {
#pragma unroll
      for (int k = 0; k < (int)sizeof(T) * 8 / 16; k++) {
        const uint4 *q = reinterpret_cast<const uint4 *>(p + j0) + k;
        r.u[k] = EVT_ROWS_CS == 1 || EVT_ROWS_CS == 2 ? __ldcs(q) : *q;  // streamed: each chunk is read once
      }
    }
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
// bf16 → f32 is the 16 bits shifted up: one instruction per element from the 32-bit words (w << 16 for the low
// element, w & 0xffff0000 for the high one), where extracting each 16-bit element first costs the high one a PRMT
// more; the same values.
#if EVT_ROWS_BF16_SHIFT
__device__ __forceinline__ void unpack8(const Raw8<__nv_bfloat16> &r, float (&o)[8]) {
  const unsigned w[4] = {r.u[0].x, r.u[0].y, r.u[0].z, r.u[0].w};
#pragma unroll
  for (int k = 0; k < 4; k++) {
    o[2 * k] = __uint_as_float(w[k] << 16);
    o[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
  }
}
#endif
// Row `p` (already offset to the row) into raw chunks; zeros outside the row or when !live.
template <class T>
__device__ __forceinline__ void unpack8(const Raw8<T> &r, double (&o)[8]) {  // integer chunks, exact
  const T *q = reinterpret_cast<const T *>(r.u);
#pragma unroll
  for (int e = 0; e < 8; e++) o[e] = (double)q[e];
}
__device__ __forceinline__ void store8(long long *__restrict__ p, int j0, int n, bool full, const double (&v)[8]) {
#pragma unroll
  for (int e = 0; e < 8; e++)
    if (full || j0 + e < n) p[j0 + e] = to_int64(v[e]);
}
__device__ __forceinline__ void store8(int *__restrict__ p, int j0, int n, bool full, const double (&v)[8]) {
#pragma unroll
  for (int e = 0; e < 8; e++)
    if (full || j0 + e < n) p[j0 + e] = (int)to_int64(v[e]);
}
// EXACT: the row is exactly T·8·VPT elements and vec holds (an EX kernel): every chunk is a full vector. nvcc does
// not prove j0 + 8 <= n from t < T itself, and the element-wise fallback it keeps is predicated, not branched over:
// issued instructions per chunk and tensor.
template <int T, int VPT, bool EXACT = false, class E>
__device__ __forceinline__ void fetch_row(const E *__restrict__ p, int n, int t, bool live, bool vec, Raw8<E> (&r)[VPT]) {
#pragma unroll
  for (int v = 0; v < VPT; v++) {
    const int j0 = (v * T + t) * 8;
    if (live && (EXACT || j0 < n)) {
      fetch8(p, j0, n, EXACT || (vec && j0 + 8 <= n), r[v]);
    } else {
      r[v] = Raw8<E>{};  // zeros
    }
  }
}
template <int VPT, class E>
__device__ __forceinline__ void unpack_row(const Raw8<E> (&r)[VPT], float (&o)[VPT][8]) {
#pragma unroll
  for (int v = 0; v < VPT; v++) unpack8(r[v], o[v]);
}

// ---- reductions --------------------------------------------------------------------------------------------
constexpr int kRedVals = 5;  // values one group_reduce (below) can carry
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
// Two-barrier reductions. red: this row-group's shared buffer (red_floats<WARPS>() floats); they use its last
// 2·WARPS floats, apart from the parity slots of group_reduce, so the two kinds may be mixed in one kernel.
template <int WARPS>
__device__ __forceinline__ float group_sum(float v, float *red) {
  red += 2 * kRedVals * WARPS;
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
  red += 2 * kRedVals * WARPS;
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
  red += 2 * kRedVals * WARPS;
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

// ---- one-barrier group reductions (the nuclei and col_sum use these) ---------------------------------------------
// A row-group's reductions alternate between two parity slots of its shared buffer (Red::k counts them; every
// thread of the group runs the same sequence, so the counters agree). Reduction i writes slot i % 2, passes the
// group barrier and reads it; reduction i + 1 writes the other slot, and reduction i + 2 can only start writing
// slot i % 2 again after every thread passed barrier i + 1, i.e. after everyone finished reading reduction i:
// one barrier per reduction instead of two. Up to kRedVals values per reduction. Within a warp: an xor butterfly
// (SYM: the combine is bitwise commutative, so every lane ends with the same bits; otherwise lane 0's result is
// broadcast); across warps: warp leaders write, and every thread combines the WARPS results in warp order.
// Deterministic for a given configuration.
template <int WARPS>
struct Red {
  float *s;  // this group's 2 · kRedVals · WARPS floats (+ the legacy region used by group_sum / group_max)
  int k;
};
// Floats of shared memory one row-group needs (parity slots + the region of the two-barrier functions above).
template <int WARPS>
constexpr int red_floats() {
  return (2 * kRedVals + 2) * WARPS;
}
template <int WARPS, int K, bool SYM, class Op>
__device__ __forceinline__ void group_reduce(float (&a)[K], Red<WARPS> &r, Op op) {
  static_assert(K <= kRedVals, "too many values in one reduction");
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    float b[K];
#pragma unroll
    for (int k = 0; k < K; k++) b[k] = __shfl_xor_sync(0xffffffffu, a[k], o);
    op(a, b);
  }
  if (WARPS == 1) {
    if (!SYM) {
#pragma unroll
      for (int k = 0; k < K; k++) a[k] = __shfl_sync(0xffffffffu, a[k], 0);
    }
    return;
  }
  float *slot = r.s + (r.k & 1) * kRedVals * WARPS;
  r.k++;
  const int w = (threadIdx.x >> 5) % WARPS;
  if ((threadIdx.x & 31) == 0) {
#pragma unroll
    for (int k = 0; k < K; k++) slot[k * WARPS + w] = a[k];
  }
  group_sync<WARPS>();
#pragma unroll
  for (int k = 0; k < K; k++) a[k] = slot[k * WARPS];
#pragma unroll
  for (int ww = 1; ww < WARPS; ww++) {
    float b[K];
#pragma unroll
    for (int k = 0; k < K; k++) b[k] = slot[k * WARPS + ww];
    op(a, b);
  }
}
struct AddOp {
  template <int K>
  __device__ __forceinline__ void operator()(float (&a)[K], const float (&b)[K]) const {
#pragma unroll
    for (int k = 0; k < K; k++) a[k] += b[k];
  }
};
template <int WARPS>
__device__ __forceinline__ float group_sum1(float v, Red<WARPS> &r) {
  float a[1] = {v};
  group_reduce<WARPS, 1, true>(a, r, AddOp());
  return a[0];
}
// Online softmax pair (m, s): m = max of x·log2 e, s = Σ 2^(x·log2 e − m). Both terms are computed the same
// way whichever operand comes first and + is commutative: symmetric.
struct SoftmaxOp {
  __device__ __forceinline__ void operator()(float (&a)[2], const float (&b)[2]) const {
    const float m = fmaxf(a[0], b[0]);
    const float sa = a[0] == m ? a[1] : a[1] * exp2f(a[0] - m);
    const float sb = b[0] == m ? b[1] : b[1] * exp2f(b[0] - m);
    a[0] = m;
    a[1] = sa + sb;
  }
};
// Chan et al. parallel merge of (count, mean, M2 = Σ(x − mean)²) and, for layer-norm backward, (G = Σg,
// C = Σ g·(x − mean)): C moves to the merged mean by (mean_part − mean)·G_part. Exact-variance quality (no
// E[x²] − E[x]² cancellation) in one reduction round.
template <int K>
struct ChanOp {
  static_assert(K == 3 || K == 5, "ChanOp merges (count, mean, M2) or (count, mean, M2, G, C)");
  __device__ __forceinline__ void operator()(float (&a)[K], const float (&b)[K]) const {
    const float n = a[0] + b[0];
    const float f = n > 0.f ? b[0] / n : 0.f;
    const float d = b[1] - a[1];
    const float mu = fmaf(d, f, a[1]);
    a[2] = a[2] + b[2] + d * d * a[0] * f;
    if constexpr (K == 5) {
      a[4] = a[4] + b[4] + (a[1] - mu) * a[3] + (b[1] - mu) * b[3];
      a[3] += b[3];
    }
    a[0] = n;
    a[1] = mu;
  }
};

// Mode 2 building blocks: plain xor-butterfly sums / max inside a warp (bitwise identical on every lane), then
// one exchange of each warp's values through the group's parity slot (one barrier); the caller merges the
// WARPS entries in warp order (identical on every thread).
template <int K>
__device__ __forceinline__ void warp_sums(float (&a)[K]) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    float b[K];
#pragma unroll
    for (int k = 0; k < K; k++) b[k] = __shfl_xor_sync(0xffffffffu, a[k], o);
#pragma unroll
    for (int k = 0; k < K; k++) a[k] += b[k];
  }
}
__device__ __forceinline__ float warp_max_all(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Returns the slot: entry (k, w) at [k * WARPS + w].
template <int WARPS, int K>
__device__ __forceinline__ const float *group_exchange(const float (&a)[K], Red<WARPS> &r) {
  static_assert(K <= kRedVals, "too many values in one exchange");
  float *slot = r.s + (r.k & 1) * kRedVals * WARPS;
  r.k++;
  if ((threadIdx.x & 31) == 0) {
    const int w = (threadIdx.x >> 5) % WARPS;
#pragma unroll
    for (int k = 0; k < K; k++) slot[k * WARPS + w] = a[k];
  }
  group_sync<WARPS>();
  return slot;
}

// Reduction scheme of the nuclei. 0: plain sum / max rounds (softmax: max, then Σ; layer norm: Σx, then Σ(x − μ)²;
// layer-norm backward: Σx, then {Σ(x − μ)², Σg, Σg·(x − μ)} in one round), each a butterfly of adds / maxes
// and one barrier: short dependency chains. 1: one round with merge operators at every butterfly level
// (SoftmaxOp, ChanOp). 2: warp-level plain butterflies and one cross-warp merge. 1 and 2 are slower than 0: the
// exp / divide inside the chain costs more than the rounds it saves.
#ifndef EVT_ROWS_RED
#define EVT_ROWS_RED 0
#endif
#ifndef EVT_ROWS_RED_SOFTMAX  // the softmax nucleus's scheme (2 has no long chain: one exp per warp entry)
#define EVT_ROWS_RED_SOFTMAX EVT_ROWS_RED
#endif
struct MaxOp {
  template <int K>
  __device__ __forceinline__ void operator()(float (&a)[K], const float (&b)[K]) const {
#pragma unroll
    for (int k = 0; k < K; k++) a[k] = fmaxf(a[k], b[k]);
  }
};

#define EVT_ROWS_FOR_VALID(body)                   \
  _Pragma("unroll") for (int v = 0; v < VPT; v++)  \
    _Pragma("unroll") for (int e = 0; e < 8; e++) { \
      const bool ok = (v * T + t) * 8 + e < n;      \
      body                                          \
    }

// ---- nuclei --------------------------------------------------------------------------------------------------
// y = exp(x − max) / Σ exp(x − max). EVT_ROWS_RED 0: a max round, then a Σ round. 2: warp max, exponentials against the warp's
// max, warp sum; the warps' (max, Σ) pairs are exchanged once and merged, each thread rescales by
// 2^(warp max − row max) / Σ. EVT_ROWS_RED 1: the same with per-thread maxima and SoftmaxOp at every level.
template <int WARPS, int VPT>
__device__ __forceinline__ void softmax(const float (&x)[VPT][8], float (&y)[VPT][8], int n, int t, Red<WARPS> &r) {
  constexpr int T = WARPS * 32;
  constexpr float L2E = 1.4426950408889634f;
  float mx = -INFINITY;
  EVT_ROWS_FOR_VALID(if (ok) mx = fmaxf(mx, x[v][e]);)
#if EVT_ROWS_RED_SOFTMAX == 0
  {
    float a[1] = {mx};
    group_reduce<WARPS, 1, true>(a, r, MaxOp());
    const float m2 = a[0] * L2E;
    a[0] = 0.f;
    EVT_ROWS_FOR_VALID(y[v][e] = ok ? fast_exp2(fmaf(x[v][e], L2E, -m2)) : 0.f; a[0] += y[v][e];)
    group_reduce<WARPS, 1, true>(a, r, AddOp());
    const float inv = __frcp_rn(a[0]);
    EVT_ROWS_FOR_VALID((void)ok; y[v][e] *= inv;)
    return;
  }
#endif
#if EVT_ROWS_RED_SOFTMAX == 2
  {
    const float m2 = warp_max_all(mx) * L2E;
    float sm[1] = {0.f};
    EVT_ROWS_FOR_VALID(y[v][e] = ok ? fast_exp2(fmaf(x[v][e], L2E, -m2)) : 0.f; sm[0] += y[v][e];)
    warp_sums<1>(sm);
    float scale;
    if (WARPS == 1) {
      scale = __frcp_rn(sm[0]);
    } else {
      const float a[2] = {m2, sm[0]};
      const float *q = group_exchange<WARPS, 2>(a, r);
      float M = q[0];
#pragma unroll
      for (int w = 1; w < WARPS; w++) M = fmaxf(M, q[w]);
      float S = 0.f;
#pragma unroll
      for (int w = 0; w < WARPS; w++) S += q[w] == M ? q[WARPS + w] : q[WARPS + w] * fast_exp2(q[w] - M);
      scale = (m2 == M ? 1.f : fast_exp2(m2 - M)) * __frcp_rn(S);
    }
    EVT_ROWS_FOR_VALID((void)ok; y[v][e] *= scale;)
    return;
  }
#endif
  const float m2 = mx * L2E;
  float s = 0.f;
  EVT_ROWS_FOR_VALID(y[v][e] = ok ? exp2f(fmaf(x[v][e], L2E, -m2)) : 0.f; s += y[v][e];)
  float a[2] = {m2, s};
  group_reduce<WARPS, 2, true>(a, r, SoftmaxOp());
  const float scale = (m2 == a[0] ? 1.f : exp2f(m2 - a[0])) / a[1];
  EVT_ROWS_FOR_VALID((void)ok; y[v][e] *= scale;)
}

// dx = y · (dy − Σ dy·y)
template <int WARPS, int VPT>
__device__ __forceinline__ void softmax_bwd(const float (&dy)[VPT][8], const float (&y)[VPT][8], float (&dx)[VPT][8],
                                            int n, int t, Red<WARPS> &r) {
  constexpr int T = WARPS * 32;
  float dot = 0.f;
  EVT_ROWS_FOR_VALID(if (ok) dot += dy[v][e] * y[v][e];)
  dot = group_sum1<WARPS>(dot, r);
  EVT_ROWS_FOR_VALID((void)ok; dx[v][e] = y[v][e] * (dy[v][e] - dot);)
}

// This thread's (count, mean, M2) of its valid elements: two passes over its registers.
template <int T, int VPT>
__device__ __forceinline__ void thread_moments(const float (&x)[VPT][8], int n, int t, float &cnt, float &mu, float &m2) {
  float c = 0.f, s = 0.f;
  EVT_ROWS_FOR_VALID(if (ok) { c += 1.f; s += x[v][e]; })
  mu = c > 0.f ? s / c : 0.f;
  float q = 0.f;
  EVT_ROWS_FOR_VALID(const float d = x[v][e] - mu; if (ok) q = fmaf(d, d, q);)
  cnt = c;
  m2 = q;
}

// Mode 2 moments of a row-group with one barrier: warp sums of (count, Σx) give the warp mean; warp sums of
// Σ(x − warp mean)² (and, with G, of Σg and Σ g·(x − warp mean)); then the warps' (count, Σx, M2[, G, C]) are
// exchanged and merged in warp order: mean = ΣΣx / Σcount, M2 = Σ (M2_w + count_w·(mean_w − mean)²),
// C = Σ (C_w + (mean_w − mean)·G_w). g: this thread's g values (used when G).
template <int WARPS, int VPT, bool G>
__device__ __forceinline__ void group_moments(const float (&x)[VPT][8], const float (&g)[VPT][8], int n, int t,
                                              Red<WARPS> &r, float &mean, float &m2, float &sg, float &sc) {
  constexpr int T = WARPS * 32;
  float a[2] = {0.f, 0.f};
  EVT_ROWS_FOR_VALID(if (ok) { a[0] += 1.f; a[1] += x[v][e]; })
  warp_sums<2>(a);
  const float mw = a[0] > 0.f ? a[1] / a[0] : 0.f;
  float b[3] = {0.f, 0.f, 0.f};
  EVT_ROWS_FOR_VALID(if (ok) {
    const float d = x[v][e] - mw;
    b[0] = fmaf(d, d, b[0]);
    if (G) {
      b[1] += g[v][e];
      b[2] = fmaf(g[v][e], d, b[2]);
    }
  })
  if (G)
    warp_sums<3>(b);
  else
    warp_sums<1>(reinterpret_cast<float(&)[1]>(b));
  if (WARPS == 1) {
    mean = mw;
    m2 = b[0];
    sg = b[1];
    sc = b[2];
    return;
  }
  const float e5[5] = {a[0], a[1], b[0], b[1], b[2]};
  const float *q = group_exchange<WARPS, G ? 5 : 3>(reinterpret_cast<const float(&)[G ? 5 : 3]>(e5), r);
  float cnt = 0.f, sx = 0.f;
#pragma unroll
  for (int w = 0; w < WARPS; w++) {
    cnt += q[w];
    sx += q[WARPS + w];
  }
  const float mu = cnt > 0.f ? sx / cnt : 0.f;
  float M2 = 0.f, S = 0.f, C = 0.f;
#pragma unroll
  for (int w = 0; w < WARPS; w++) {
    const float c = q[w], mwq = c > 0.f ? q[WARPS + w] / c : 0.f, dm = mwq - mu;
    M2 += q[2 * WARPS + w] + c * dm * dm;
    if (G) {
      S += q[3 * WARPS + w];
      C += q[4 * WARPS + w] + dm * q[3 * WARPS + w];
    }
  }
  mean = mu;
  m2 = M2;
  sg = S;
  sc = C;
}

// mean, rstd of x in one reduction round; x̂.
template <int WARPS, int VPT>
__device__ __forceinline__ void ln_stats(const float (&x)[VPT][8], float eps, float (&xh)[VPT][8], float *mean,
                                         float *rstd, int n, int t, Red<WARPS> &r) {
  constexpr int T = WARPS * 32;
#if EVT_ROWS_RED == 0
  {
    float a[1] = {0.f};
    EVT_ROWS_FOR_VALID(if (ok) a[0] += x[v][e];)
    group_reduce<WARPS, 1, true>(a, r, AddOp());
    const float mu = a[0] / (float)n;
    a[0] = 0.f;
    EVT_ROWS_FOR_VALID(const float d = ok ? x[v][e] - mu : 0.f; a[0] = fmaf(d, d, a[0]); xh[v][e] = d;)
    group_reduce<WARPS, 1, true>(a, r, AddOp());
    const float rs = rsqrtf(a[0] / (float)n + eps);
    EVT_ROWS_FOR_VALID((void)ok; xh[v][e] *= rs;)
    *mean = mu;
    *rstd = rs;
    return;
  }
#endif
#if EVT_ROWS_RED == 2
  {
    float mu, m2, sg, sc;
    group_moments<WARPS, VPT, false>(x, x, n, t, r, mu, m2, sg, sc);
    const float rs = rsqrtf(m2 / (float)n + eps);
    EVT_ROWS_FOR_VALID(xh[v][e] = ok ? (x[v][e] - mu) * rs : 0.f;)
    *mean = mu;
    *rstd = rs;
    return;
  }
#endif
  float a[3];
  thread_moments<T, VPT>(x, n, t, a[0], a[1], a[2]);
  group_reduce<WARPS, 3, false>(a, r, ChanOp<3>());
  const float mu = a[1];
  const float rs = rsqrtf(a[2] / (float)n + eps);
  EVT_ROWS_FOR_VALID(xh[v][e] = ok ? (x[v][e] - mu) * rs : 0.f;)
  *mean = mu;
  *rstd = rs;
}

// mean, rstd only (x̂ formed per chunk by the caller: fewer registers live across the row's stores)
template <int WARPS, int VPT>
__device__ __forceinline__ void ln_moments(const float (&x)[VPT][8], float eps, float *mean, float *rstd, int n, int t,
                                           Red<WARPS> &r) {
  float xh[VPT][8];  // (dead: its stores are removed)
  ln_stats<WARPS, VPT>(x, eps, xh, mean, rstd, n, t, r);
}

// y = x̂ (· w) (+ b); w, b: this thread's columns of the N-vectors (HW / HB: present)
template <int WARPS, int VPT, bool HW, bool HB>
__device__ __forceinline__ void layernorm(const float (&x)[VPT][8], const float (&w)[VPT][8], const float (&b)[VPT][8],
                                          float eps, float (&xh)[VPT][8], float (&y)[VPT][8], float *mean, float *rstd,
                                          int n, int t, Red<WARPS> &r) {
  constexpr int T = WARPS * 32;
  ln_stats<WARPS, VPT>(x, eps, xh, mean, rstd, n, t, r);
  EVT_ROWS_FOR_VALID((void)ok; y[v][e] = xh[v][e] * (HW ? w[v][e] : 1.f) + (HB ? b[v][e] : 0.f);)
}

// dx = rstd · (g − mean(g) − x̂ · mean(g·x̂)), g = dy (· w); mean/rstd recomputed from x. One reduction round:
// per thread (count, mean, M2) of x and G = Σg, C = Σ g·(x − own mean); merged with ChanOp plus the shift of C
// to the merged mean; then Σ g·x̂ = rstd · C.
template <int WARPS, int VPT, bool HW>
__device__ __forceinline__ void layernorm_bwd(const float (&dy)[VPT][8], const float (&x)[VPT][8], const float (&w)[VPT][8],
                                              float eps, float (&xh)[VPT][8], float (&dx)[VPT][8], int n, int t,
                                              Red<WARPS> &r) {
  constexpr int T = WARPS * 32;
#if EVT_ROWS_RED == 0
  {
    float a[3] = {0.f, 0.f, 0.f};
    EVT_ROWS_FOR_VALID(if (ok) a[0] += x[v][e];)
    group_reduce<WARPS, 1, true>(reinterpret_cast<float(&)[1]>(a), r, AddOp());
    const float mu = a[0] / (float)n;
    a[0] = 0.f;
    EVT_ROWS_FOR_VALID(if (ok) {
      const float d = x[v][e] - mu;
      const float g = HW ? dy[v][e] * w[v][e] : dy[v][e];
      a[0] = fmaf(d, d, a[0]);
      a[1] += g;
      a[2] = fmaf(g, d, a[2]);
    })
    group_reduce<WARPS, 3, true>(a, r, AddOp());
    const float rs = rsqrtf(a[0] / (float)n + eps);
    const float inv_n = 1.f / (float)n;
    const float mg = a[1] * inv_n, mgx = rs * a[2] * inv_n;  // Σ g·x̂ = rstd · Σ g·(x − μ)
    // g rounded as in Σ g (__fmul_rn: no fma of dy·w into g − mean(g)): g − mean(g) is exactly 0 where it should be
    // (a 1-wide row: dx was rstd ≈ 316 times dy·w's rounding error, ~1e-5 instead of 0)
    EVT_ROWS_FOR_VALID(xh[v][e] = ok ? (x[v][e] - mu) * rs : 0.f;
                       dx[v][e] = ok ? rs * ((HW ? __fmul_rn(dy[v][e], w[v][e]) : dy[v][e]) - mg - xh[v][e] * mgx) : 0.f;)
    return;
  }
#endif
#if EVT_ROWS_RED == 2
  {
    float g[VPT][8];
    EVT_ROWS_FOR_VALID((void)ok; g[v][e] = HW ? __fmul_rn(dy[v][e], w[v][e]) : dy[v][e];)
    float mu, m2, sg, sc;
    group_moments<WARPS, VPT, true>(x, g, n, t, r, mu, m2, sg, sc);
    const float rs = rsqrtf(m2 / (float)n + eps);
    const float inv_n = 1.f / (float)n;
    const float mg = sg * inv_n, mgx = rs * sc * inv_n;
    EVT_ROWS_FOR_VALID(xh[v][e] = ok ? (x[v][e] - mu) * rs : 0.f;
                       dx[v][e] = ok ? rs * (g[v][e] - mg - xh[v][e] * mgx) : 0.f;)
    return;
  }
#endif
  float cnt, mu_t, m2_t;
  thread_moments<T, VPT>(x, n, t, cnt, mu_t, m2_t);
  float sg = 0.f, sc = 0.f;
  EVT_ROWS_FOR_VALID(if (ok) {
    const float g = HW ? dy[v][e] * w[v][e] : dy[v][e];
    sg += g;
    sc = fmaf(g, x[v][e] - mu_t, sc);
  })
  float a[5] = {cnt, mu_t, m2_t, sg, sc};
  group_reduce<WARPS, 5, false>(a, r, ChanOp<5>());
  const float mu = a[1];
  const float rs = rsqrtf(a[2] / (float)n + eps);
  const float inv_n = 1.f / (float)n;
  const float mg = a[3] * inv_n, mgx = rs * a[4] * inv_n;
  EVT_ROWS_FOR_VALID(xh[v][e] = ok ? (x[v][e] - mu) * rs : 0.f;
                     dx[v][e] = ok ? rs * ((HW ? __fmul_rn(dy[v][e], w[v][e]) : dy[v][e]) - mg - xh[v][e] * mgx) : 0.f;)
}

// Layer-norm backward with w read per chunk from memory (EVT_ROWS_LNB_LATE: no registers hold w across the row):
// the reductions of layernorm_bwd's EVT_ROWS_RED 0 path, in the same order (bit for bit the same results); x
// becomes x̂ in place; the caller forms dx = rs · (dy·w − mg − x̂·mgx) per chunk, loading w again (L1).
template <int WARPS, int VPT, bool HW, class W>
__device__ __forceinline__ void layernorm_bwd_stats(const float (&dy)[VPT][8], float (&x)[VPT][8], const W *__restrict__ w,
                                                    bool vec, float eps, float &rs, float &mg, float &mgx, int n, int t,
                                                    Red<WARPS> &r) {
  constexpr int T = WARPS * 32;
  float a[3] = {0.f, 0.f, 0.f};
  EVT_ROWS_FOR_VALID(if (ok) a[0] += x[v][e];)
  group_reduce<WARPS, 1, true>(reinterpret_cast<float(&)[1]>(a), r, AddOp());
  const float mu = a[0] / (float)n;
  a[0] = 0.f;
#pragma unroll
  for (int v = 0; v < VPT; v++) {
    const int j0 = (v * T + t) * 8;
    float w8[8];
    if (HW && j0 < n) {
      load8(w, j0, n, vec && j0 + 8 <= n, w8);
    } else {
#pragma unroll
      for (int e = 0; e < 8; e++) w8[e] = 1.f;
    }
#pragma unroll
    for (int e = 0; e < 8; e++)
      if (j0 + e < n) {
        const float d = x[v][e] - mu;
        const float g = HW ? dy[v][e] * w8[e] : dy[v][e];
        a[0] = fmaf(d, d, a[0]);
        a[1] += g;
        a[2] = fmaf(g, d, a[2]);
      }
  }
  group_reduce<WARPS, 3, true>(a, r, AddOp());
  rs = rsqrtf(a[0] / (float)n + eps);
  const float inv_n = 1.f / (float)n;
  mg = a[1] * inv_n;
  mgx = rs * a[2] * inv_n;  // Σ g·x̂ = rstd · Σ g·(x − μ)
  EVT_ROWS_FOR_VALID(x[v][e] = ok ? (x[v][e] - mu) * rs : 0.f;)
}

// ---- long rows: one row per CTA, streamed from memory ---------------------------------------------------------------
// Rows longer than a register-resident row-group takes (N > 32768, evt_row_pick_config refuses): a CTA of WARPS
// warps per row, the row walked in blocks of 8·T elements. h (long_head) = the elements before the first 16-byte
// boundary of the row's first input: thread 0 takes those as a head chunk, then thread t holds elements j0 .. j0 + 7,
// j0 = h + block + 8t, of each block (16-byte vectors wherever a tensor's chunk is aligned: every tensor of the
// input's element size when the base pointers are; others element by element). h = -1 (a u8 row's head longer than
// a chunk): elements j0 + e·T, j0 = block + t (es = T: each scalar access contiguous across the warp). The nucleus's
// row statistics take passes over the row (the re-reads of a CTA's row hit L2), each pass's reduction the same
// kind as the register nuclei's EVT_ROWS_RED 0 path; the apply pass gives each chunk's nucleus values (x / dy / y,
// x̂, the output) to the generated epilogue. A chunk's elements are j0 + e·es < lim. Kernels with Σ-over-M row sums
// have no long form.
template <class E>
__device__ __forceinline__ int long_head(const E *row) {
  const unsigned a = (unsigned)((uintptr_t)row & 15);
  if (a % sizeof(E)) return -1;
  const int h = a ? (int)((16 - a) / sizeof(E)) : 0;
  return h < 8 ? h : -1;
}
#define EVT_ROWS_STR_(x) #x
#define EVT_ROWS_PRAGMA_(x) _Pragma(EVT_ROWS_STR_(x))
// The chunks of a long row (h > 0: the first block is the head, thread 0's elements 0 .. h - 1), as one loop.
#define EVT_ROWS_LONG_CHUNKS(...)                                                                            \
  EVT_ROWS_PRAGMA_(unroll EVT_ROWS_LONG_UNROLL) for (int jb_ = h > 0 ? h - 8 * T : 0; jb_ < n; jb_ += 8 * T) { \
    const bool head_ = jb_ < 0;                                                                              \
    const int j0 = head_ ? 0 : jb_ + (h >= 0 ? t * 8 : t), es = h >= 0 ? 1 : T, lim = head_ ? h : n;        \
    if (head_ ? t != 0 : j0 >= n) continue;                                                                  \
    const bool full = !head_ && h >= 0 && j0 + 8 <= n;                                                       \
    __VA_ARGS__                                                                                              \
  }
// chunk access with element stride es; full: es == 1 and the 8 elements in the row (vectors where aligned)
template <class P>
__device__ __forceinline__ bool chunk_aligned(const P *p) {
  return ((uintptr_t)p & (sizeof(P) == 1 ? 7 : 15)) == 0;
}
template <class P>
__device__ __forceinline__ void load8s(const P *__restrict__ p, int j0, int es, int lim, bool full, float (&o)[8]) {
  if (full && chunk_aligned(p + j0)) {
    load8(p, j0, lim, true, o);
  } else {
#pragma unroll
    for (int e = 0; e < 8; e++) o[e] = j0 + e * es < lim ? to_f(p[j0 + e * es]) : 0.f;
  }
}
template <class E>
__device__ __forceinline__ void fetch8s(const E *__restrict__ p, int j0, int es, int lim, bool full, Raw8<E> &r) {
  if (full && chunk_aligned(p + j0)) {
    fetch8(p, j0, lim, true, r);
  } else {
    E *q = reinterpret_cast<E *>(r.u);
#pragma unroll
    for (int e = 0; e < 8; e++) q[e] = j0 + e * es < lim ? p[j0 + e * es] : from_f<E>(0.f);
  }
}
__device__ __forceinline__ void store1(long long *p, double v) { *p = to_int64(v); }
__device__ __forceinline__ void store1(int *p, double v) { *p = (int)to_int64(v); }
template <class P>
__device__ __forceinline__ void store1(P *p, float v) { *p = from_f<P>(v); }
template <class P, class V>
__device__ __forceinline__ void store8s(P *__restrict__ p, int j0, int es, int lim, bool full, const V (&v)[8]) {
  if (full && chunk_aligned(p + j0)) {
    store8(p, j0, lim, true, v);
  } else {
#pragma unroll
    for (int e = 0; e < 8; e++)
      if (j0 + e * es < lim) store1(p + j0 + e * es, v[e]);
  }
}
// max and Σ exp(x − max) in one pass (online: a thread's running sum is rescaled when its maximum grows; the
// threads' (max, Σ) pairs merge with SoftmaxOp); m2 = max · log2(e), inv = 1 / Σ
template <int WARPS, class X>
__device__ __forceinline__ void long_softmax_stats(const X *__restrict__ x, int n, int h, int t, Red<WARPS> &r, float &m2,
                                                   float &inv) {
  constexpr int T = WARPS * 32;
  constexpr float L2E = 1.4426950408889634f;
  float a[2] = {-INFINITY, 0.f};
  EVT_ROWS_LONG_CHUNKS(float v[8]; load8s(x, j0, es, lim, full, v); float cm = -INFINITY;
                       for (int e = 0; e < 8; e++) if (j0 + e * es < lim) cm = fmaxf(cm, v[e]);
                       cm *= L2E;
                       if (cm > a[0]) {
                         a[1] *= fast_exp2(a[0] - cm);
                         a[0] = cm;
                       }
                       for (int e = 0; e < 8; e++) if (j0 + e * es < lim) a[1] += fast_exp2(fmaf(v[e], L2E, -a[0]));)
  group_reduce<WARPS, 2, true>(a, r, SoftmaxOp());
  m2 = a[0];
  inv = __frcp_rn(a[1]);
}
// one chunk: x into in, y = exp(x − max) / Σ into y (0 outside the chunk's elements)
template <class X>
__device__ __forceinline__ void long_softmax_chunk(const X *__restrict__ x, int j0, int es, int lim, bool full, float m2,
                                                   float inv, float (&in)[8], float (&y)[8]) {
  load8s(x, j0, es, lim, full, in);
#pragma unroll
  for (int e = 0; e < 8; e++) y[e] = j0 + e * es < lim ? fast_exp2(fmaf(in[e], 1.4426950408889634f, -m2)) * inv : 0.f;
}
// Σ dy·y of the row
template <int WARPS, class D, class Y>
__device__ __forceinline__ float long_softmax_bwd_stats(const D *__restrict__ dy, const Y *__restrict__ y, int n, int h,
                                                        int t, Red<WARPS> &r) {
  constexpr int T = WARPS * 32;
  float dot = 0.f;
  EVT_ROWS_LONG_CHUNKS(float a[8]; float b[8]; load8s(dy, j0, es, lim, full, a); load8s(y, j0, es, lim, full, b);
                       for (int e = 0; e < 8; e++) if (j0 + e * es < lim) dot += a[e] * b[e];)
  return group_sum1<WARPS>(dot, r);
}
template <class D, class Y>
__device__ __forceinline__ void long_softmax_bwd_chunk(const D *__restrict__ dy, const Y *__restrict__ y, int j0, int es,
                                                       int lim, bool full, float dot, float (&in0)[8], float (&in1)[8],
                                                       float (&dx)[8]) {
  load8s(dy, j0, es, lim, full, in0);
  load8s(y, j0, es, lim, full, in1);
#pragma unroll
  for (int e = 0; e < 8; e++) dx[e] = j0 + e * es < lim ? in1[e] * (in0[e] - dot) : 0.f;
}
// mean and rstd of the row (Σx, then Σ(x − mean)²)
template <int WARPS, class X>
__device__ __forceinline__ void long_ln_stats(const X *__restrict__ x, int n, int h, float eps, int t, Red<WARPS> &r,
                                              float &mu, float &rs) {
  constexpr int T = WARPS * 32;
  float a[1] = {0.f};
  EVT_ROWS_LONG_CHUNKS(float v[8]; load8s(x, j0, es, lim, full, v);
                       for (int e = 0; e < 8; e++) if (j0 + e * es < lim) a[0] += v[e];)
  group_reduce<WARPS, 1, true>(a, r, AddOp());
  mu = a[0] / (float)n;
  a[0] = 0.f;
  EVT_ROWS_LONG_CHUNKS(float v[8]; load8s(x, j0, es, lim, full, v);
                       for (int e = 0; e < 8; e++) if (j0 + e * es < lim) {
                         const float d = v[e] - mu;
                         a[0] = fmaf(d, d, a[0]);
                       })
  group_reduce<WARPS, 1, true>(a, r, AddOp());
  rs = rsqrtf(a[0] / (float)n + eps);
}
// one chunk of layer norm: x, x̂, y = x̂ (· w) (+ b); w / b null when absent
template <class X, class W>
__device__ __forceinline__ void long_ln_chunk(const X *__restrict__ x, const W *__restrict__ w, const W *__restrict__ b,
                                              int j0, int es, int lim, bool full, float mu, float rs, float (&in)[8],
                                              float (&xh)[8], float (&y)[8]) {
  float w8[8], b8[8];
  load8s(x, j0, es, lim, full, in);
  if (w) load8s(w, j0, es, lim, full, w8);
  if (b) load8s(b, j0, es, lim, full, b8);
#pragma unroll
  for (int e = 0; e < 8; e++) {
    const bool ok = j0 + e * es < lim;
    xh[e] = ok ? (in[e] - mu) * rs : 0.f;
    y[e] = ok ? xh[e] * (w ? w8[e] : 1.f) + (b ? b8[e] : 0.f) : 0.f;
  }
}
// layer-norm backward's row statistics: rstd, mean(g), mean(g·x̂) (g = dy (· w)), as layernorm_bwd's EVT_ROWS_RED 0
template <int WARPS, class D, class X, class W>
__device__ __forceinline__ void long_lnb_stats(const D *__restrict__ dy, const X *__restrict__ x, const W *__restrict__ w,
                                               int n, int h, float eps, int t, Red<WARPS> &r, float &mu, float &rs,
                                               float &mg, float &mgx) {
  constexpr int T = WARPS * 32;
  float a[3] = {0.f, 0.f, 0.f};
  EVT_ROWS_LONG_CHUNKS(float v[8]; load8s(x, j0, es, lim, full, v);
                       for (int e = 0; e < 8; e++) if (j0 + e * es < lim) a[0] += v[e];)
  group_reduce<WARPS, 1, true>(reinterpret_cast<float(&)[1]>(a), r, AddOp());
  mu = a[0] / (float)n;
  a[0] = 0.f;
  EVT_ROWS_LONG_CHUNKS(float xv[8]; float dv[8]; float w8[8]; load8s(x, j0, es, lim, full, xv);
                       load8s(dy, j0, es, lim, full, dv); if (w) load8s(w, j0, es, lim, full, w8);
                       for (int e = 0; e < 8; e++) if (j0 + e * es < lim) {
                         const float d = xv[e] - mu, g = w ? dv[e] * w8[e] : dv[e];
                         a[0] = fmaf(d, d, a[0]);
                         a[1] += g;
                         a[2] = fmaf(g, d, a[2]);
                       })
  group_reduce<WARPS, 3, true>(a, r, AddOp());
  rs = rsqrtf(a[0] / (float)n + eps);
  const float inv_n = 1.f / (float)n;
  mg = a[1] * inv_n;
  mgx = rs * a[2] * inv_n;
}
template <class D, class X, class W>
__device__ __forceinline__ void long_lnb_chunk(const D *__restrict__ dy, const X *__restrict__ x, const W *__restrict__ w,
                                               int j0, int es, int lim, bool full, float mu, float rs, float mg,
                                               float mgx, float (&in0)[8], float (&in1)[8], float (&xh)[8],
                                               float (&dx)[8]) {
  float w8[8];
  load8s(dy, j0, es, lim, full, in0);
  load8s(x, j0, es, lim, full, in1);
  if (w) load8s(w, j0, es, lim, full, w8);
#pragma unroll
  for (int e = 0; e < 8; e++) {
    const bool ok = j0 + e * es < lim;
    xh[e] = ok ? (in1[e] - mu) * rs : 0.f;
    dx[e] = ok ? rs * ((w ? __fmul_rn(in0[e], w8[e]) : in0[e]) - mg - xh[e] * mgx) : 0.f;
  }
}

// ---- elementwise ops (evt_vop_apply) --------------------------------------------------------------------------
__device__ __forceinline__ float relu(float x) { return x > 0.f ? x : (x != x ? x : 0.f); }
__device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }
// GELU and its derivative: evt_math.h's branch-free Φ, the very formula of the GEMM epilogues (evt_ops::GeluErf), so a
// GELU gives the same bits in either kind of kernel (and costs fewer instructions than erff + expf)
#ifndef EVT_ROWS_GELU_ERFF  // 1: the libm-accurate erff / expf forms instead (for comparison)
#define EVT_ROWS_GELU_ERFF 0
#endif
#if EVT_ROWS_GELU_ERFF
__device__ __forceinline__ float gelu_erf(float x) { return 0.5f * x * (1.f + erff(x * 0.70710678118654752f)); }
__device__ __forceinline__ float gelu_erf_grad(float dy, float x) {
  const float cdf = 0.5f * (1.f + erff(x * 0.70710678118654752f));
  const float pdf = 0.39894228040143268f * expf(-0.5f * x * x);
  return dy * (cdf + x * pdf);
}
#else
__device__ __forceinline__ float gelu_erf(float x) { return evt_gelu_erf(x); }
__device__ __forceinline__ float gelu_erf_grad(float dy, float x) { return evt_gelu_erf_grad(dy, x); }
#endif
__device__ __forceinline__ float gelu_tanh(float x) { return evt_gelu_tanh(x); }
__device__ __forceinline__ float gelu_tanh_grad(float dy, float x) { return evt_gelu_tanh_grad(dy, x); }
__device__ __forceinline__ float relu_grad(float dy, float x) { return x > 0.f ? dy : 0.f; }
__device__ __forceinline__ float neg(float x) { return -x; }
__device__ __forceinline__ float exp_(float x) { return expf(x); }
__device__ __forceinline__ float log_(float x) { return logf(x); }
__device__ __forceinline__ float erf_(float x) { return erff(x); }
__device__ __forceinline__ float tanh_(float x) { return tanhf(x); }
__device__ __forceinline__ float sqrt_(float x) { return sqrtf(x); }
__device__ __forceinline__ float rsqrt_(float x) { return rsqrtf(x); }
__device__ __forceinline__ float reciprocal(float x) { return 1.f / x; }
__device__ __forceinline__ float abs_(float x) { return fabsf(x); }
__device__ __forceinline__ float sign(float x) { return x > 0.f ? 1.f : x < 0.f ? -1.f : x != x ? x : 0.f; }
// a cast to 16 bits inside the tree: round (RNE), keep computing in f32
__device__ __forceinline__ float round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
__device__ __forceinline__ float round_f16(float x) { return __half2float(__float2half_rn(x)); }
// Templates: a value is a float, or a double when it holds an integer tensor's elements (exact); mixed
// operands compare / select in the common type.
template <class X, class Y>
__device__ __forceinline__ auto maximum(X x, Y y) -> decltype(x + y) {
  return x != x || y != y ? (decltype(x + y))NAN : x > y ? x : y;
}
template <class X, class Y>
__device__ __forceinline__ auto minimum(X x, Y y) -> decltype(x + y) {
  return x != x || y != y ? (decltype(x + y))NAN : x < y ? x : y;
}
template <class X, class Y> __device__ __forceinline__ float eq(X x, Y y) { return x == y ? 1.f : 0.f; }
template <class X, class Y> __device__ __forceinline__ float ne(X x, Y y) { return x != y ? 1.f : 0.f; }
template <class X, class Y> __device__ __forceinline__ float lt(X x, Y y) { return x < y ? 1.f : 0.f; }
template <class X, class Y> __device__ __forceinline__ float le(X x, Y y) { return x <= y ? 1.f : 0.f; }
template <class X, class Y> __device__ __forceinline__ float gt(X x, Y y) { return x > y ? 1.f : 0.f; }
template <class X, class Y> __device__ __forceinline__ float ge(X x, Y y) { return x >= y ? 1.f : 0.f; }
template <class C, class A, class B>
__device__ __forceinline__ auto where(C c, A a, B b) -> decltype(a + b) {
  return c != 0 ? (decltype(a + b))a : (decltype(a + b))b;
}
__device__ __forceinline__ double neg(double x) { return -x; }
__device__ __forceinline__ double abs_(double x) { return fabs(x); }
// rand: element e of a Philox stream (kernels/philox.h, as the interpreter draws it), rounded to T like the tensor
template <class T>
__device__ __forceinline__ float rand_u(unsigned long long seed, unsigned long long offset, unsigned long long step,
                                        unsigned long long e) {
  return to_f(from_f<T>(evt_philox_uniform(seed, offset, step, e)));
}
// rand of a thread's 8 consecutive elements e0 .. e0 + 7: with offset + e0 a multiple of 4 (a row of a multiple
// of 4 elements, an aligned offset) two Philox calls, each giving four elements; else one call per element
template <class T>
__device__ __forceinline__ void rand8(unsigned long long seed, unsigned long long offset, unsigned long long step,
                                      unsigned long long e0, float u[8]) {
  if (((offset + e0) & 3) == 0) {
    float a[4], b[4];
    evt_philox_uniform4(seed, offset, step, e0, a);
    evt_philox_uniform4(seed, offset, step, e0 + 4, b);
#pragma unroll
    for (int k = 0; k < 4; k++) u[k] = to_f(from_f<T>(a[k])), u[4 + k] = to_f(from_f<T>(b[k]));
  } else {
#pragma unroll
    for (int k = 0; k < 8; k++) u[k] = rand_u<T>(seed, offset, step, e0 + k);
  }
}
// max that lets NaN win (amax propagates NaN); the running value m starts at -inf
__device__ __forceinline__ float nanmax(float m, float x) { return m != m ? m : (x != x || x > m) ? x : m; }
struct NanMaxOp {  // not bitwise symmetric for two NaNs: group_reduce broadcasts lane 0's result
  template <int K>
  __device__ __forceinline__ void operator()(float (&a)[K], const float (&b)[K]) const {
#pragma unroll
    for (int k = 0; k < K; k++) a[k] = nanmax(a[k], b[k]);
  }
};
template <int WARPS>
__device__ __forceinline__ float group_nanmax1(float v, Red<WARPS> &r) {
  float a[1] = {v};
  group_reduce<WARPS, 1, false>(a, r, NanMaxOp());
  return a[0];
}

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

// The Σ-over-M accumulators of a kernel's NRS row sums, per thread: VPT·8 columns each. Sums k < NREG in
// registers, the others in this row-group's slots of dynamic shared memory (smem_bytes() per CTA; frees the
// registers for occupancy). Shared layout: float4 slot ((k'·VPT + v)·2 + h)·T + t (k' = k − NREG) holds columns
// e = 4h..4h+3 of chunk v of thread t, so add8 is two 16-byte loads and stores per chunk and sum, a warp's
// 16-byte accesses consecutive (no bank conflicts; scalar read-modify-writes per element make the kernel
// L1-bound). flush writes the CTA's partial of sum k to
// ws + k·kstride[0..n): the R row-groups added in group order (either way: the same bits).
template <int T, int VPT, int R, int NRS, int NREG>
struct RowSums {
  static_assert(NREG >= 0 && NREG <= NRS, "sums in registers: 0..NRS");
  static constexpr int NSM = NRS - NREG;             // sums in shared memory
  static constexpr int kPer = NSM * VPT * 8 * T;     // floats per row-group (a multiple of 4: float4 slots)
  // Register sums are flushed through shared memory too when slots for every sum fit (96 KiB per CTA): each
  // row-group writes its registers into its slots (after the shared ones), one barrier, then one ordered sum over
  // the row-groups (flush_rowsum's R barrier-separated global read-modify-write rounds lengthen the kernel's tail);
  // else flush_rowsum.
  static constexpr bool SMFLUSH = NREG > 0 && (size_t)NRS * VPT * 8 * T * R * 4 <= 98304;
  static constexpr int kStride = SMFLUSH ? NRS * VPT * 8 * T : kPer;  // floats per row-group
  static constexpr size_t smem_bytes() { return sizeof(float) * (size_t)kStride * R; }
  float a[NREG > 0 ? NREG : 1][VPT][8];
  float4 *s;  // this row-group's slots
  int t;
  __device__ __forceinline__ void init(float *dyn, int g, int t_) {
    t = t_;
    s = reinterpret_cast<float4 *>(dyn + (size_t)g * kStride);
#pragma unroll
    for (int k = 0; k < NRS; k++)
#pragma unroll
      for (int v = 0; v < VPT; v++) {
        if (k >= NREG) {
          s[(((k - NREG) * VPT + v) * 2) * T + t] = make_float4(0.f, 0.f, 0.f, 0.f);
          s[(((k - NREG) * VPT + v) * 2 + 1) * T + t] = make_float4(0.f, 0.f, 0.f, 0.f);
        } else {
#pragma unroll
          for (int e = 0; e < 8; e++) a[k < NREG ? k : 0][v][e] = 0.f;
        }
      }
  }
  // sum k, chunk v += x (elements outside the row must be 0 in x)
  __device__ __forceinline__ void add8(int k, int v, const float (&x)[8]) {
    if (k >= NREG) {
#pragma unroll
      for (int h = 0; h < 2; h++) {
        float4 &q = s[(((k - NREG) * VPT + v) * 2 + h) * T + t];
        float4 c = q;
        c.x += x[4 * h], c.y += x[4 * h + 1], c.z += x[4 * h + 2], c.w += x[4 * h + 3];
        q = c;
      }
    } else {
#pragma unroll
      for (int e = 0; e < 8; e++) a[k < NREG ? k : 0][v][e] += x[e];
    }
  }
  __device__ __forceinline__ void flush(float *ws, size_t kstride, int n, int g, int t_) {
    if constexpr (!SMFLUSH) {
#pragma unroll
      for (int k = 0; k < NREG; k++) flush_rowsum<T, VPT, R>(a[k], ws + k * kstride, n, g, t_);
    } else {
#pragma unroll
      for (int k = 0; k < NREG; k++)
#pragma unroll
        for (int v = 0; v < VPT; v++)
#pragma unroll
          for (int h = 0; h < 2; h++)
            s[(((NSM + k) * VPT + v) * 2 + h) * T + t] =
                make_float4(a[k][v][4 * h], a[k][v][4 * h + 1], a[k][v][4 * h + 2], a[k][v][4 * h + 3]);
    }
    constexpr int K0 = SMFLUSH ? 0 : NREG;  // the sums reduced from shared memory
    if constexpr (NRS > K0) {
      __syncthreads();
      const float *base = reinterpret_cast<const float *>(s) - (size_t)g * kStride;
      for (int k = K0; k < NRS; k++) {
        const int kk = k >= NREG ? k - NREG : NSM + k;  // its slots
        for (int j = threadIdx.x; j < n; j += T * R) {
          const int c = j >> 3, e = j & 7, v = c / T, tt = c % T;
          const size_t off = ((size_t)((kk * VPT + v) * 2 + (e >> 2)) * T + tt) * 4 + (e & 3);
          float acc = 0.f;
          for (int gg = 0; gg < R; gg++) acc += base[(size_t)gg * kStride + off];
          ws[k * kstride + j] = acc;
        }
      }
    }
  }
};

// A row kernel launched as a programmatic dependent launch (EVT_ROWS_PDL_MAIN) is scheduled while the previous
// kernel in the stream drains: its first statement waits until that kernel completed and its writes are visible
// (a no-op in a plain launch). Every kernel whose launcher sets the attribute waits before touching memory, so the
// wait is transitive down the stream.
__device__ __forceinline__ void wait_prior_grids() {
#if EVT_ROWS_PDL_MAIN
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// Lets the next kernel in the stream, if launched with the attribute, be scheduled once every CTA of this grid has
// started (it waits for this grid's completion all the same): kernels without row sums call it right after the wait.
__device__ __forceinline__ void release_dependents() {
#if EVT_ROWS_PDL_MAIN
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// out[j] = Σ_{b < parts} ws[b·n + j] in a fixed order: thread (x, y) of a 32×32 block sums b ≡ y (mod 32)
// ascending (loads unrolled by 8, so they are in flight together), then y = 0..31 are added in order.
// Grid: (ceil(n / 32), number of sums); sum k reads ws + k·parts·n and writes out.p[k].
struct RowSumOuts {
  void *p[8];
  unsigned char dt[8];  // storage of each sum: 0 f32, 1 f16, 2 bf16 (rounded once, here)
};
static __global__ void __launch_bounds__(1024) rowsum_finalize(const float *__restrict__ ws, int parts, int n,
                                                               RowSumOuts out) {
  __shared__ float s[32][33];
#if EVT_ROWS_PDL
  cudaGridDependencySynchronize();  // launched early (programmatic dependent launch): wait for the row kernel
#endif
  release_dependents();  // the next row kernel may be scheduled
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
    void *o = out.p[blockIdx.y];
    const int dt = out.dt[blockIdx.y];
    if (dt == 0) static_cast<float *>(o)[j] = r;
    else if (dt == 1) static_cast<__half *>(o)[j] = __float2half_rn(r);
    else static_cast<__nv_bfloat16 *>(o)[j] = __float2bfloat16_rn(r);
  }
}

// The finalize launch. With EVT_ROWS_PDL (default) it is a programmatic dependent launch: it may start while the
// row kernel's last CTAs run (the row kernel triggers it once its partials are being flushed), and waits in
// cudaGridDependencySynchronize() until the row kernel completed and its writes are visible.
// One launch with cudaLaunchAttributeProgrammaticStreamSerialization; false if refused (e.g. an old driver: the
// caller then launches plainly, and the kernel's wait is a no-op).
template <class... P, class... A>
static inline bool launch_pdl(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t st, A... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = at;
  cfg.numAttrs = 1;
  if (cudaLaunchKernelEx(&cfg, kernel, args...) == cudaSuccess) return true;
  (void)cudaGetLastError();
  return false;
}
static inline void launch_rowsum_finalize(dim3 grid, cudaStream_t st, const float *ws, int parts, int n, RowSumOuts outs) {
#ifdef EVT_ROWS_BENCH_NO_FINALIZE  // benchmarks only: time the row kernel without its finalize (the row sums stay unset)
  (void)grid, (void)st, (void)ws, (void)parts, (void)n, (void)outs;
  return;
#endif
#if EVT_ROWS_PDL
  if (launch_pdl(rowsum_finalize, grid, dim3(32, 32), 0, st, ws, parts, n, outs)) return;
#endif
  rowsum_finalize<<<grid, dim3(32, 32), 0, st>>>(ws, parts, n, outs);
}
// The row kernel's launch: with EVT_ROWS_PDL_MAIN a programmatic dependent launch (plain if the driver refuses it).
template <class P>
static inline void launch_main(void (*kernel)(P), int grid, int threads, size_t smem, cudaStream_t st, P p) {
#if EVT_ROWS_PDL_MAIN
  if (evt_pdl_enabled() && launch_pdl(kernel, dim3(grid), dim3(threads), smem, st, p)) return;
#endif
  kernel<<<grid, threads, smem, st>>>(p);
}

// Called by a row kernel with row sums after its last row: lets the dependent finalize launch begin.
__device__ __forceinline__ void trigger_dependents() {
#if EVT_ROWS_PDL
  cudaTriggerProgrammaticLaunchCompletion();
#endif
}

// ---- launch configuration -----------------------------------------------------------------------------------------
// The original rule (evt_row_config.h with warp_vpt 1, w1cap 8), kept for callers of this name.
static inline int pick_config(int n, int *warps, int *vpt) { return evt_row_pick_config(n, 1, 8, 1, warps, vpt); }

}  // namespace evt_rows

#endif
