/* The C ABI between evt's runtime and a generated GEMM + epilogue-visitor kernel (src/evt/emit_cutlass.c).
 *
 * Every generated shared object exports `int evt_kernel_<hash>(const evt_launch_args *)`. It checks the
 * problem with CUTLASS's can_implement, initializes (which fills atomic reduction outputs with 0), and
 * launches on `stream`; it does not synchronize. ptrs[i] is the device memory of visitor node i (loads,
 * stores, reductions; NULL for the others), dense row-major in the node's dtype: M×N for aux tensors,
 * N for row broadcasts / row sums, M for column broadcasts / column sums. Workspace, if CUTLASS needs
 * any, is allocated and kept by the launcher (one buffer per shared object; not thread-safe).
 * Compiles as C and as C++.
 */
#ifndef EVT_LAUNCH_H
#define EVT_LAUNCH_H

#include <stdint.h>

#define EVT_LAUNCH_MAX_PTRS 32

typedef struct evt_launch_args {
  int m, n, k;
  const void *a, *b; /* A and B in the kernel's operand layout */
  void *d;           /* D: M×N row-major, the kernel's D dtype */
  void *ptrs[EVT_LAUNCH_MAX_PTRS];
  void *stream;      /* cudaStream_t; NULL = default stream */
  /* Tile scheduler (launch-time, not part of the kernel; chosen by the tuner, src/runtime/tune.h):
   * swizzle = CUTLASS max_swizzle_size (0 or 1: none; 2, 4, 8: groups of tiles for L2 reuse);
   * raster: 0 = CUTLASS's heuristic, 1 = along M, 2 = along N. Zero-initialized args keep the defaults. */
  int swizzle, raster;
} evt_launch_args;

/* Launcher return codes. */
enum {
  EVT_LAUNCH_OK = 0,
  EVT_LAUNCH_CANNOT_IMPLEMENT = 1, /* shape / alignment rejected by CUTLASS */
  EVT_LAUNCH_WORKSPACE = 2,        /* workspace allocation failed */
  EVT_LAUNCH_INIT = 3,             /* Gemm::initialize failed */
  EVT_LAUNCH_RUN = 4,              /* Gemm::run failed or the launch reported an error */
  EVT_LAUNCH_BAD_ARGS = 5          /* a needed pointer is NULL */
};

#endif
