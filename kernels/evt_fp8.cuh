// The device's fp8 store, src/ir/fp8.c's encoder, shared by the row kernels (evt_rows.cuh) and the kernel library
// (kernels/fallback/internal.h) so that every kernel writes the same codes. Formats f8e4m3 / f8e5m2, one byte each.
#ifndef EVT_FP8_CUH
#define EVT_FP8_CUH

#include <cuda_fp8.h>
#include <math.h>

// The code of x in format F: round to nearest even and saturate (a finite value or an infinity beyond the largest
// finite code gives ±max: the conversion's SATFINITE mode); NaN stays NaN with its sign as S.1111111, which the
// conversion alone does not keep (it gives +NaN).
template <__nv_fp8_interpretation_t F>
__device__ __forceinline__ __nv_fp8_storage_t evt_fp8_code(float x) {
  if (isnan(x)) return (__nv_fp8_storage_t)(signbit(x) ? 0xffu : 0x7fu);
  return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, F);
}

#endif
