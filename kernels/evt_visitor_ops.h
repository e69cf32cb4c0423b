/* Elementwise functors for epilogue visitor nodes that CUTLASS does not ship (C++ / CUDA only; included
 * by generated kernels after the CUTLASS headers).
 *
 * Each is a class template usable as Sm90Compute's ComputeFn: Fn<T> for scalars and Fn<cutlass::Array<T,N>>
 * for fragments, binary operator()(dy, x). Semantics match evt_vop_apply in src/codegen/vref.c:
 *   evt_ops::GeluErf:     x · Φ(x)                (the exact, erf-based GELU)
 *   evt_ops::GeluErfGrad: dy · (Φ(x) + x·φ(x))   (its derivative)
 *   Both evaluate Φ's tail with evt_normal_tail_tp (kernels/evt_math.h: one branch-free formula), not with erff: a GEMM epilogue
 *   is issue-bound on its math (the cooperative kernel's tensor cores wait for it), and erff's two
 *   polynomials selected per element cost ~25 instructions where this costs ~12 and two MUFU operations.
 *   evt_ops::ReluGrad:    x > 0 ? dy : 0
 *   evt_ops::Neg ... Where, Keep: the other computes of src/codegen/kspec.h (see below)
 */
#ifndef EVT_VISITOR_OPS_H
#define EVT_VISITOR_OPS_H

#include "cutlass/array.h"
#include "cutlass/cutlass.h"
#include "cutlass/numeric_types.h"
#include "evt_math.h"

namespace evt_ops {

template <class T>
struct GeluErf {
  CUTLASS_HOST_DEVICE T operator()(T const &v) const { return T(evt_gelu_erf(float(v))); }
};

template <class T, int N>
struct GeluErf<cutlass::Array<T, N>> {
  CUTLASS_HOST_DEVICE cutlass::Array<T, N> operator()(cutlass::Array<T, N> const &v) const {
    cutlass::Array<T, N> y;
    GeluErf<T> op;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) y[i] = op(v[i]);
    return y;
  }
};

template <class T>
struct GeluErfGrad {
  CUTLASS_HOST_DEVICE T operator()(T const &dy, T const &v) const {
    return T(evt_gelu_erf_grad(float(dy), float(v)));
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

// Unary / binary / ternary functors in f32 (evaluated per element of a fragment), for the visitor computes
// CUTLASS has no functor for with our semantics (evt_vop_apply3): NaN propagates through maximum/minimum
// and sign, comparisons give 1/0, where selects on c != 0, keep returns its first operand.
#define EVT_OPS_ELEMENTWISE(Name, NARGS, PARAMS, ARGS, EXPR)                                       \
  template <class T>                                                                                \
  struct Name {                                                                                     \
    CUTLASS_HOST_DEVICE T operator() PARAMS const { return T(EXPR); }                              \
  };                                                                                                \
  template <class T, int N>                                                                         \
  struct Name<cutlass::Array<T, N>> {                                                               \
    using A = cutlass::Array<T, N>;                                                                 \
    CUTLASS_HOST_DEVICE A operator() ARGS const {                                                   \
      A r;                                                                                          \
      Name<T> op;                                                                                   \
      for (int i = 0; i < N; ++i) r[i] = EVT_OPS_CALL##NARGS;                                       \
      return r;                                                                                     \
    }                                                                                               \
  };
#define EVT_OPS_CALL1 op(a[i])
#define EVT_OPS_CALL2 op(a[i], b[i])
#define EVT_OPS_CALL3 op(a[i], b[i], c[i])
#define EVT_OPS_U(Name, EXPR) EVT_OPS_ELEMENTWISE(Name, 1, (T const &x_), (A const &a), ([&] { float x = float(x_); return EXPR; }()))
#define EVT_OPS_B(Name, EXPR) \
  EVT_OPS_ELEMENTWISE(Name, 2, (T const &x_, T const &y_), (A const &a, A const &b), ([&] { float x = float(x_), y = float(y_); return EXPR; }()))

EVT_OPS_U(Neg, -x)
EVT_OPS_U(Exp, expf(x))
EVT_OPS_U(Log, logf(x))
EVT_OPS_U(Erf, erff(x))
EVT_OPS_U(Tanh, tanhf(x))
// the tanh GELU in its sigmoid form (kernels/evt_math.h), as the row kernels compute it; CUTLASS's GELU_taylor /
// dGELU take tanh.approx (~5e-4 relative error)
EVT_OPS_U(GeluTanh, evt_gelu_tanh(x))
EVT_OPS_B(GeluTanhGrad, evt_gelu_tanh_grad(x, y))  // (dy, x)
EVT_OPS_U(Sqrt, sqrtf(x))
EVT_OPS_U(Rsqrt, 1.0f / sqrtf(x))
EVT_OPS_U(Reciprocal, 1.0f / x)
EVT_OPS_U(Abs, fabsf(x))
EVT_OPS_U(Sign, x > 0.f ? 1.f : x < 0.f ? -1.f : (x != x ? x : 0.f))
// a cast to 16 bits inside the tree (round to nearest even, keep computing in f32)
EVT_OPS_U(RoundBf16, float(cutlass::bfloat16_t(x)))
EVT_OPS_U(RoundF16, float(cutlass::half_t(x)))
EVT_OPS_B(Maximum, x != x || y != y ? x + y : (x > y ? x : y))
EVT_OPS_B(Minimum, x != x || y != y ? x + y : (x < y ? x : y))
EVT_OPS_B(Eq, x == y ? 1.f : 0.f)
EVT_OPS_B(Ne, x != y ? 1.f : 0.f)
EVT_OPS_B(Lt, x < y ? 1.f : 0.f)
EVT_OPS_B(Le, x <= y ? 1.f : 0.f)
EVT_OPS_B(Gt, x > y ? 1.f : 0.f)
EVT_OPS_B(Ge, x >= y ? 1.f : 0.f)
EVT_OPS_B(Keep, x)
EVT_OPS_ELEMENTWISE(Where, 3, (T const &c_, T const &a_, T const &b_), (A const &a, A const &b, A const &c),
                    (float(c_) != 0.f ? a_ : b_))

}  // namespace evt_ops

#endif
