/* The kernel library's cuBLAS GEMM entry: ABI shared by kernels/fallback/gemm.cu (which defines it) and
 * src/runtime/gpu/cuda.c (which loads it with dlsym). No generated kernel includes this header, and the JIT cache
 * key hashes only the kernels/ headers a generated source includes (src/runtime/jit/jit.c): editing it recompiles
 * nothing.
 *
 * One GEMM through cuBLAS: the fused runtime runs a GEMM group whose epilogue is plain (D = A.B, nothing
 * to fuse) this way (src/runtime/gpu/exec_plan.h, `blas`). Row-major D[M,N] (leading dim ldd) = op(A).op(B):
 * A stored M x K (ta 0, leading dim lda) or K x M (ta 1); B stored K x N (tb 0, ldb) or N x K (tb 1).
 * batch > 1: batch i at a + i*sa, b + i*sb, d + i*sd (elements; sa or sb 0 broadcasts). A and B are
 * ab_dtype (EVT_FB_F32, F16, BF16); D is ab_dtype or F32. f32 accumulation; tensor cores for 16-bit
 * operands, no TF32 for f32 and no reduced-precision split-K (the context's cuBLAS math mode). Enqueues on
 * stream; no synchronization, no allocation (graph-capturable). Returns 0, 1 (unsupported: err says why)
 * or 2 (a cuBLAS / CUDA error). */
#ifndef EVT_FB_GEMM_H
#define EVT_FB_GEMM_H

#include "evt_fallback.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct evt_fb_gemm {
  int ta, tb, ab_dtype, d_dtype;
  int64_t m, n, k, batch;
  const void *a, *b;
  void *d;
  int64_t lda, ldb, ldd, sa, sb, sd;
  const void *bias; /* NULL, or an N-vector in d_dtype added to every row (cuBLASLt's BIAS epilogue: added to
                     * the f32 accumulator, one rounding; batch must be 1) */
} evt_fb_gemm;

int evt_fb_gemm_run(evt_fb_ctx *c, const evt_fb_gemm *g, void *stream, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
