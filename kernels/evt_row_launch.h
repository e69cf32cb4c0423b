/* The C ABI between evt's runtime and a generated row kernel (src/codegen/emit_rows.c, spec in src/codegen/rspec.h).
 *
 * Every generated shared object exports `int evt_rowkernel_<hash>(const evt_row_launch_args *)`. It picks a
 * launch configuration from N, launches on `stream` and does not synchronize. Return codes are the
 * EVT_LAUNCH_* codes of evt_launch.h (CANNOT_IMPLEMENT: N too long for a register-resident row, or m/n < 0).
 *
 * Memory (all dense row-major, in the dtype the spec gives):
 *   in[0..2]   the nucleus inputs, M×N unless noted:
 *                softmax {x}; softmax_bwd {dy, y}; layernorm {x, w (N), b (N)}; layernorm_bwd {dy, x, w (N)}
 *                (w / b only when the spec has them); nucleus-free: unused
 *   mean, rstd layer-norm forward statistics (f32 M-vectors), written only when the spec stores them
 *   ptrs[i]    memory of epilogue node i: M×N for aux loads/stores, N for row broadcasts and row_sum
 *              (Σ over M), M for column broadcasts and col_sum (Σ over N); f32 for both sums
 *   rng_step   the RNG step rand nodes draw with (kernels/philox.h), read after the previous kernel completed
 *   rng[i]     rand node i's Philox key and counter offset (evt_rng_key, evt_launch.h; other entries unused)
 *   csr        spmm nucleus only: A [m, k] as rowptr[m+1], col[nnz], val[nnz] (indices in the spec's idx dtype),
 *              x [k, n] dense, perm[nnz] (has_perm: values read as val[perm[q]]); err: a device int into which the
 *              kernel writes err_code (nonzero; the kernel library's convention is node id + 1) on an index out of
 *              range, if it still holds 0 (the entry is skipped); the caller zeroes it and reads it back
 * Row sums (Σ over M) are deterministic: each CTA writes a partial N-vector into a workspace that the
 * launcher allocates and keeps (one buffer per shared object; not thread-safe), then a second kernel adds
 * the partials in a fixed order. Outputs are fully overwritten on every call.
 * Compiles as C and as C++.
 */
#ifndef EVT_ROW_LAUNCH_H
#define EVT_ROW_LAUNCH_H

#include "evt_launch.h"

#define EVT_ROW_LAUNCH_MAX_PTRS 32

typedef struct evt_row_launch_args {
  int m, n;
  const void *in[3];
  void *mean, *rstd;
  void *ptrs[EVT_ROW_LAUNCH_MAX_PTRS];
  void *stream; /* cudaStream_t; NULL = default stream */
  const unsigned long long *rng_step; /* device memory: the run's RNG step for rand nodes (NULL: step 0) */
  evt_rng_key rng[EVT_ROW_LAUNCH_MAX_PTRS]; /* rng[i]: rand node i's seed and offset */
  struct {
    const void *rowptr, *col, *val, *x, *perm;
    long long k, nnz;
    int *err;
    int err_code;
  } csr; /* spmm nucleus only */
} evt_row_launch_args;

#endif
