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
} evt_row_launch_args;

#endif
