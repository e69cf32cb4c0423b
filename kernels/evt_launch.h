/* The C ABI between evt's runtime and a generated GEMM + epilogue-visitor kernel (src/codegen/emit_cutlass.c).
 *
 * Every generated shared object exports `int evt_kernel_<hash>(const evt_launch_args *)`. It checks the
 * problem with CUTLASS's can_implement, initializes (which fills atomic reduction outputs with 0), and
 * launches on `stream`; it does not synchronize. ptrs[i] is the device memory of visitor node i (loads,
 * stores, reductions; NULL for the others), dense row-major in the node's dtype: M×N for aux tensors,
 * N for row broadcasts / row sums, M for column broadcasts / column sums (a batched kernel: the same per
 * batch, placed by the batch fields at the end of the struct). Workspace, if CUTLASS needs
 * any, is allocated and kept by the launcher (one buffer per shared object; not thread-safe).
 * Compiles as C and as C++.
 */
#ifndef EVT_LAUNCH_H
#define EVT_LAUNCH_H

#include <stdint.h>
#include <stdlib.h>

#define EVT_LAUNCH_MAX_PTRS 32

/* A rand node's Philox key and counter offset (kernels/philox.h). Launch arguments, not constants of the kernel:
 * kernels that differ only in their rand nodes' seeds (dropout sites of identical layers) are one kernel, and each
 * launch passes its own group's keys (evt_kspec_launch_rng / evt_rspec_launch_rng, src/codegen/kspec.h, rspec.h). */
typedef struct evt_rng_key {
  unsigned long long seed, offset;
} evt_rng_key;

typedef struct evt_launch_args {
  int m, n, k;
  const void *a, *b; /* A and B in the kernel's operand layout */
  void *d;           /* D: M×N row-major, the kernel's D dtype */
  void *ptrs[EVT_LAUNCH_MAX_PTRS];
  void *stream;      /* cudaStream_t; NULL = default stream */

  /* ---- batch mode (a zero-filled struct is exactly the unbatched call) -------------------------------------
   * The runtime memsets the struct to 0 and fills the fields above; for a batched kernel (evt_kspec.batched,
   * evt_lowered.batch) evt_lower_launch_batch copies the values lowering computed (evt_lowered.l, .ld*, .bs*, .os*:
   * same names) into the fields below; evt_lower_batched_check (src/codegen/lower.h) says whether the bound tensors hold
   * every element the launch reaches (a, b, d, ptrs[v] are whole tensors; m, n, k per batch). Unbatched kernels
   * ignore all of them. All strides and leading dims are in ELEMENTS of the tensor's own dtype.
   *
   * A batched kernel computes l GEMMs (0 means 1): for batch i, A_i = a + i*bs_a, B_i = b + i*bs_b,
   * D_i = d + i*bs_d, and visitor node v's tensor ptrs[v] + i*bs_ptrs[v] (0 = one tensor shared by every
   * batch, e.g. a bias broadcast to all heads, or a row/col sum accumulated over all batches).
   * Leading dims (distance between consecutive rows of the stored matrix): 0 = packed (A: K, or M when A is
   * stored transposed; B: N, or K when transposed; D and M×N aux tensors: N).
   * Two batch levels (heads [B,H] of a [B,S,H,D] tensor: no single stride covers them): l_outer > 1 repeats
   * the launch l_outer times, each time with every pointer advanced by its os_* stride; the total batch
   * is l_outer * l, batch index = outer * l + inner. 0 or 1 = one level. */
  int l;                                /* batch count of one launch; 0 means 1 */
  int l_outer;                          /* outer batch count (launch repeats); 0 means 1 */
  int64_t lda, ldb, ldd;                /* leading dims of A, B, D; 0 = packed */
  int64_t bs_a, bs_b, bs_d;             /* batch strides (inner level) */
  int64_t os_a, os_b, os_d;             /* outer batch strides */
  int64_t ld_ptrs[EVT_LAUNCH_MAX_PTRS]; /* leading dim of an M×N aux tensor of node v; 0 = packed (N) */
  int64_t bs_ptrs[EVT_LAUNCH_MAX_PTRS]; /* batch stride of node v's tensor; 0 = shared by all batches */
  int64_t os_ptrs[EVT_LAUNCH_MAX_PTRS]; /* outer batch stride of node v's tensor */

  /* Tile scheduler (launch-time, not part of the kernel; chosen by the tuner, src/tune/tune.h):
   * swizzle = CUTLASS max_swizzle_size (0 or 1: none; 2, 4, 8: groups of tiles for L2 reuse);
   * raster: 0 = CUTLASS's heuristic, 1 = along M, 2 = along N. Zero-initialized args keep the defaults. */
  int swizzle, raster;

  evt_rng_key rng[EVT_LAUNCH_MAX_PTRS]; /* rng[v]: rand node v's key (other entries unused) */
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

/* Generated launchers call this before a programmatic dependent launch (compiled in by EVT_GEMM_PDL /
 * EVT_ROWS_PDL_MAIN); always on. */
static inline int evt_pdl_enabled(void) { return 1; }

#endif
