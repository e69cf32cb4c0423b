// The spmm nucleus of generated row kernels (spec: src/codegen/rspec.h, nucleus spmm; ABI: evt_row_launch.h, csr):
// a row-group owns output row i and accumulates Σ_q val[q] · x[col[q], :] into its register row (thread t holds
// columns (v·T + t)·8 + e, as every row kernel), in f32 and in q order, so a row's value never depends on the launch.
// The entries' indices are read four at a time before their x rows, so four gathers are in flight per thread.
#ifndef EVT_SPMM_CUH
#define EVT_SPMM_CUH

#include "evt_rows.cuh"

namespace evt_rows {

// A bad index: the first one's code into the flag (the launcher's caller reads it back); the entry is skipped.
__device__ __forceinline__ void spmm_flag(int *err, int code) { atomicCAS(err, 0, code); }

// Row `row` of A·x (A in CSR; perm: values through a permutation, spmm_t), zeros for a dead row-group.
template <int T, int VPT, bool EXF, class I, class V, class X>
__device__ __forceinline__ void spmm_row(const I *__restrict__ rowptr, const I *__restrict__ col, const V *__restrict__ val,
                                         const I *__restrict__ perm, const X *__restrict__ x, long long row, bool live,
                                         long long k, long long nnz, int n, int t, bool vec, int *err, int code,
                                         float (&o)[VPT][8]) {
#pragma unroll
  for (int v = 0; v < VPT; v++)
#pragma unroll
    for (int e = 0; e < 8; e++) o[v][e] = 0.f;
  if (!live) return;
  const long long p0 = (long long)rowptr[row], p1 = (long long)rowptr[row + 1];
  if (p0 < 0 || p1 < p0 || p1 > nnz) {
    if (t == 0) spmm_flag(err, code);
    return;
  }
  constexpr int B = 4;  // entries whose indices are read ahead of their gathers
  for (long long q0 = p0; q0 < p1; q0 += B) {
    long long c[B];
    float a[B];
#pragma unroll
    for (int u = 0; u < B; u++) {
      const long long q = q0 + u;
      c[u] = -1;
      a[u] = 0.f;
      if (q >= p1) continue;
      const long long ci = (long long)col[q], vi = perm ? (long long)perm[q] : q;
      if (ci < 0 || ci >= k || vi < 0 || vi >= nnz) {
        if (t == 0) spmm_flag(err, code);
        continue;
      }
      c[u] = ci;
      a[u] = to_f(val[vi]);
    }
#pragma unroll
    for (int u = 0; u < B; u++) {
      if (c[u] < 0) continue;
      const X *xr = x + c[u] * n;
#pragma unroll
      for (int v = 0; v < VPT; v++) {
        const int j0 = (v * T + t) * 8;
        if (!EXF && j0 >= n) continue;
        float xv[8];
        load8(xr, j0, n, EXF || (vec && j0 + 8 <= n), xv);
#pragma unroll
        for (int e = 0; e < 8; e++) o[v][e] = fmaf(a[u], xv[e], o[v][e]);
      }
    }
  }
}

}  // namespace evt_rows

#endif
