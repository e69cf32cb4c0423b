/* Elementwise functors for epilogue visitor nodes that CUTLASS does not ship (C++ / CUDA only; included
 * by generated kernels after the CUTLASS headers).
 *
 * Each is a class template usable as Sm90Compute's ComputeFn: Fn<T> for scalars and Fn<cutlass::Array<T,N>>
 * for fragments, binary operator()(dy, x). Semantics match evt_vop_apply in src/evt/vref.c:
 *   evt_ops::GeluErfGrad: dy · (Φ(x) + x·φ(x))   (derivative of the exact, erf-based GELU)
 *   evt_ops::ReluGrad:    x > 0 ? dy : 0
 */
#ifndef EVT_VISITOR_OPS_H
#define EVT_VISITOR_OPS_H

#include "cutlass/array.h"
#include "cutlass/cutlass.h"

namespace evt_ops {

template <class T>
struct GeluErfGrad {
  CUTLASS_HOST_DEVICE T operator()(T const &dy, T const &x) const {
    float xf = float(x);
    float cdf = 0.5f * (1.0f + erff(xf * 0.70710678118654752f));
    float pdf = 0.39894228040143268f * expf(-0.5f * xf * xf);
    return T(float(dy) * (cdf + xf * pdf));
  }
};

template <class T, int N>
struct GeluErfGrad<cutlass::Array<T, N>> {
  CUTLASS_HOST_DEVICE cutlass::Array<T, N> operator()(cutlass::Array<T, N> const &dy,
                                                      cutlass::Array<T, N> const &x) const {
    cutlass::Array<T, N> y;
    GeluErfGrad<T> op;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) y[i] = op(dy[i], x[i]);
    return y;
  }
};

template <class T>
struct ReluGrad {
  CUTLASS_HOST_DEVICE T operator()(T const &dy, T const &x) const { return x > T(0) ? dy : T(0); }
};

template <class T, int N>
struct ReluGrad<cutlass::Array<T, N>> {
  CUTLASS_HOST_DEVICE cutlass::Array<T, N> operator()(cutlass::Array<T, N> const &dy,
                                                      cutlass::Array<T, N> const &x) const {
    cutlass::Array<T, N> y;
    ReluGrad<T> op;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) y[i] = op(dy[i], x[i]);
    return y;
  }
};

}  // namespace evt_ops

#endif
