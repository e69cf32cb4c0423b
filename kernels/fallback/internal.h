/* What the files of the kernel library (kernels/fallback/*.cu, built into build/libevt_fallback.so) share: the
 * context, the device helpers every kernel uses, the host-side shape helpers, and one entry per op family.
 * ABI and contract: kernels/evt_fallback.h (and kernels/evt_fb_gemm.h, kernels/evt_cudnn_sdpa.h).
 *
 * Design: every node computes in double into a scratch S (numel doubles; zeroed first unless its kernel assigns
 * every element, fb_writes_every_element), then the dispatcher (evt_fb_run, library.cu) rounds S to the output
 * dtype. Kernels are one thread per output element (or per row / group) with grid-stride loops, mirroring the
 * interpreter's loops so that sums run in the same order. Exceptions, tried first: pure data movement whose data
 * operands have the output's dtype copies elements in that dtype (fb_layout_native, fb_gather_native: the same
 * bits, no scratch, no rounding pass), full / scalar stored in the output's dtype (fb_fill_native), mm / bmm
 * written by cuBLAS in the output's dtype (fb_matmul_native), and attention on cuDNN (fb_attention_cudnn). A node
 * a native path serves reserves no double scratch (evt_fb_reserve). */
#ifndef EVT_FALLBACK_INTERNAL_H
#define EVT_FALLBACK_INTERNAL_H

#include "evt_fallback.h"
#include "evt_cudnn_sdpa.h"
#include "evt_fb_gemm.h"
#include "evt_fp8.cuh"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define R EVT_FB_MAX_RANK
typedef long long ll;

/* ---- the context ------------------------------------------------------------------------------------ */

/* A cuBLASLt GEMM with a bias epilogue (evt_fb_gemm_run with a bias): descriptor, layouts and the heuristic's
 * algorithm, kept per problem (the heuristic costs more host time than the launch). */
struct lt_plan {
  int used, m, n, k, ta, tb, ab, d;
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, lc;
  cublasLtMatmulAlgo_t algo;
};
enum { LT_PLANS = 32 };

/* Per-runtime state (one per evt_program): the stream of the node being enqueued, the device's shared cuBLAS
 * handle with this context's own workspace (cuBLAS under CUDA-graph capture must not allocate), the double
 * scratch S of every node, the second scratch S2 (loss terms, cuBLAS f32 product, sdpa rows) and a staging
 * buffer for host conversions (never read by a captured step, so growing it cannot invalidate a CUDA graph). */
struct evt_fb_ctx {
  cudaStream_t stream;
  int device;                  /* the current device at creation: its cuBLAS handle is shared (gemm.cu) */
  cublasHandle_t cublas;
  void *cublas_ws;
  size_t cublas_ws_bytes;
  double *s1, *s2, *stage;
  size_t n1, n2, nstage;
  bool scratch_bound;          /* s1 / s2 are the caller's (evt_fb_bind_scratch): never grown or freed here */
  long launches;
  cublasLtHandle_t lt;         /* created on the first bias GEMM */
  lt_plan plans[LT_PLANS];     /* ring of cuBLASLt plans */
  int next_plan;
  void *attn;                  /* attention through cuDNN: stats, and the backward's out / other gradients */
  size_t attn_bytes;
  struct {                     /* the gradients the last attention backward left in attn, for its siblings */
    bool valid;
    const void *in[4];         /* dout, q, k, v */
    evt_cudnn_sdpa_desc d;
    int served, siblings;      /* bits 1 q, 2 k, 4 v */
  } memo;
  struct attn_saved {          /* per attention forward node: its out and statistics, for the backward */
    int node;
    const void *qkv[3];        /* the inputs of the last run (keys for the backward) */
    evt_cudnn_sdpa_desc d;
    void *o;
    float *stats;
    long stamp;                /* 0: never run; else the order of the runs */
  } *saved;
  int nsaved;
  long stamps;
  void *csr;                   /* A^T's CSR of an spmm_t row kernel and its sort's scratch (csr.cu) */
  size_t csr_bytes;
  int *index_flag;             /* the run-time index-error flag's address (evt_fb_index_flag), for csr.cu, coo.cu */
  void *coo;                   /* coo_perm / coo_rowptr: keys, values, counts and CUB's scratch (coo.cu) */
  size_t coo_bytes;
};

/* the stream argument of every launch of a node: counts the launch */
#define ST (ctx->launches++, ctx->stream)

#define CK(call)                                                                                           \
  do {                                                                                                     \
    cudaError_t e_ = (call);                                                                               \
    if (e_ != cudaSuccess) {                                                                               \
      snprintf(err, errlen, "%s: %s", #call, cudaGetErrorString(e_));                                      \
      return 2;                                                                                            \
    }                                                                                                      \
  } while (0)

#define UNSUPPORTED(msg)                                                                                   \
  do {                                                                                                     \
    snprintf(err, errlen, "%s", msg);                                                                      \
    return 1;                                                                                              \
  } while (0)

/* ---- device helpers ----------------------------------------------------------------------------------- */

#define GRID_FOR(i, n) for (ll i = blockIdx.x * (ll)blockDim.x + threadIdx.x; i < (n); i += (ll)gridDim.x * blockDim.x)

typedef struct tv { /* a tensor view passed by value */
  const void *p;
  int dt;
} tv;

typedef struct strides {
  ll s[R];
} strides;

typedef struct shape_t {
  int rank;
  ll d[R];
} shape_t;

/* The value of fp8 code c in format F, exactly; a NaN keeps the code's sign as src/ir/fp8.c decodes it (the
 * conversion gives +NaN). */
template <__nv_fp8_interpretation_t F> static __device__ __forceinline__ double ld_fp8(unsigned char c) {
  float v = __half2float(__half(__nv_cvt_fp8_to_halfraw(c, F)));
  return (double)copysignf(v, c & 0x80 ? -1.0f : 1.0f);
}

static __device__ __forceinline__ double ld(const void *p, int dt, ll i) {
  switch (dt) {
  case EVT_FB_F32: return (double)((const float *)p)[i];
  case EVT_FB_F16: return (double)__half2float(((const __half *)p)[i]);
  case EVT_FB_BF16: return (double)__bfloat162float(((const __nv_bfloat16 *)p)[i]);
  case EVT_FB_I64: return (double)((const ll *)p)[i];
  case EVT_FB_I32: return (double)((const int *)p)[i];
  case EVT_FB_F8E4M3: return ld_fp8<__NV_E4M3>(((const unsigned char *)p)[i]);
  case EVT_FB_F8E5M2: return ld_fp8<__NV_E5M2>(((const unsigned char *)p)[i]);
  default: return (double)((const unsigned char *)p)[i];
  }
}

static __device__ __forceinline__ void st(void *p, int dt, ll i, double v) {
  switch (dt) {
  case EVT_FB_F32: ((float *)p)[i] = (float)v; break;
  case EVT_FB_F16: ((__half *)p)[i] = __float2half_rn((float)v); break;
  case EVT_FB_BF16: ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn((float)v); break;
  case EVT_FB_I64: ((ll *)p)[i] = isfinite(v) ? (ll)trunc(v) : 0; break;
  case EVT_FB_I32: ((int *)p)[i] = isfinite(v) ? (int)fmax(fmin(trunc(v), 2147483647.0), -2147483648.0) : 0; break;
  case EVT_FB_F8E4M3: ((__nv_fp8_storage_t *)p)[i] = evt_fp8_code<__NV_E4M3>((float)v); break;
  case EVT_FB_F8E5M2: ((__nv_fp8_storage_t *)p)[i] = evt_fp8_code<__NV_E5M2>((float)v); break;
  default: ((unsigned char *)p)[i] = v != 0.0; break;
  }
}

/* offset of the row-major element e of shape sh under strides st */
static __device__ __forceinline__ ll strided_off(ll e, const shape_t &sh, const strides &stv) {
  ll o = 0;
  for (int d = sh.rank - 1; d >= 0; d--) {
    ll i = e % sh.d[d];
    e /= sh.d[d];
    o += i * stv.s[d];
  }
  return o;
}

/* ---- host helpers --------------------------------------------------------------------------------------- */

static inline int blocks(ll n) {
  ll b = (n + 255) / 256;
  return (int)(b < 1 ? 1 : b > 65535 * 4 ? 65535 * 4 : b);
}

static inline tv view(const evt_fb_tensor &t) { return tv{t.ptr, t.dtype}; }

/* floating dtypes (evt_dtype_is_float): f32, f16, bf16 and fp8 */
static inline bool is_float_dtype(int dt) {
  return dt == EVT_FB_F32 || dt == EVT_FB_F16 || dt == EVT_FB_BF16 || dt == EVT_FB_F8E4M3 || dt == EVT_FB_F8E5M2;
}

static inline shape_t shape_of(const evt_fb_tensor &t) {
  shape_t s;
  s.rank = t.rank;
  for (int i = 0; i < R; i++) s.d[i] = i < t.rank ? t.shape[i] : 1;
  return s;
}

/* row-major element strides of t */
static inline void contig(const evt_fb_tensor &t, ll *stv) {
  ll s = 1;
  for (int d = t.rank - 1; d >= 0; d--) {
    stv[d] = s;
    s *= t.shape[d];
  }
}

/* numpy broadcast strides of t read at out's shape; false if it does not broadcast */
static inline bool bcast(const evt_fb_tensor &t, const evt_fb_tensor &out, strides *st_) {
  memset(st_, 0, sizeof *st_);
  if (t.rank > out.rank) return false;
  ll s = 1;
  for (int i = out.rank - 1; i >= 0; i--) {
    int j = i - (out.rank - t.rank);
    if (j < 0) continue;
    if (t.shape[j] != out.shape[i] && t.shape[j] != 1) return false;
    st_->s[i] = (t.shape[j] == 1 && out.shape[i] != 1) ? 0 : s;
    s *= t.shape[j];
  }
  return true;
}

static inline int normdim(ll d, int rank) {
  if (d < 0) d += rank;
  return d >= 0 && d < rank ? (int)d : -1;
}

static inline ll prod(const int64_t *s, int lo, int hi) {
  ll p = 1;
  for (int i = lo; i < hi; i++) p *= s[i];
  return p;
}

static const tv NO_TENSOR = {NULL, 0};

/* ---- data movement in the tensors' own dtype ------------------------------------------------------------
 * Ops that only move elements (layout changes, slices, concat, gathers by index) give the same bits with or
 * without the double round trip (every dtype converts to double and back exactly), so when the moved operands
 * have the output's dtype they copy elements of that size directly: no scratch, no zeroing of the whole scratch,
 * no rounding pass. A move kernel is a template over T, an unsigned integer of the element's size. */

/* The element size (1, 2, 4 or 8) for a native move of nd whose data operands are in[0 .. ndata-1]; 0 when they
 * do not have the output's dtype, or one overlaps the output (the double path reads every operand before it
 * writes). layout.cu. */
int fb_move_bytes(const evt_fb_node *nd, int ndata);

/* One launch (on ST) of move kernel KERNEL<T> for elements of `bytes` bytes: out_ and in_ become T *. */
#define MOVE_CASE(T, KERNEL, grid, out_, in_, ...)                                                         \
  KERNEL<T><<<grid, 256, 0, ST>>>(static_cast<T *>(out_), static_cast<const T *>(in_), __VA_ARGS__)
#define MOVE_DISPATCH(bytes, KERNEL, grid, out_, in_, ...)                                                 \
  do {                                                                                                     \
    switch (bytes) {                                                                                       \
    case 1: MOVE_CASE(uint8_t, KERNEL, grid, out_, in_, __VA_ARGS__); break;                               \
    case 2: MOVE_CASE(uint16_t, KERNEL, grid, out_, in_, __VA_ARGS__); break;                              \
    case 4: MOVE_CASE(uint32_t, KERNEL, grid, out_, in_, __VA_ARGS__); break;                              \
    default: MOVE_CASE(uint64_t, KERNEL, grid, out_, in_, __VA_ARGS__); break;                             \
    }                                                                                                      \
  } while (0)

/* ---- op families ------------------------------------------------------------------------------------------
 * A double-path family enqueues the node's kernels into S (ctx->s1, reserved and zeroed as needed by the
 * dispatcher) on ST; it returns 0, or 1 / 2 with err set (evt_fb_run's codes). A native path returns -1 when the
 * node is not one of its cases (the dispatcher then takes the double path), else evt_fb_run's result. */
typedef int (*fb_family_fn)(evt_fb_ctx *ctx, const evt_fb_node *nd, double *S, char *err, size_t errlen);

int fb_source(evt_fb_ctx *, const evt_fb_node *, double *, char *, size_t);      /* elementwise.cu */
int fb_elementwise(evt_fb_ctx *, const evt_fb_node *, double *, char *, size_t); /* elementwise.cu */
int fb_reduce(evt_fb_ctx *, const evt_fb_node *, double *, char *, size_t);      /* reduce.cu */
int fb_softmax(evt_fb_ctx *, const evt_fb_node *, double *, char *, size_t);     /* reduce.cu */
int fb_norm(evt_fb_ctx *, const evt_fb_node *, double *, char *, size_t);        /* reduce.cu */
int fb_matmul(evt_fb_ctx *, const evt_fb_node *, double *, char *, size_t);      /* gemm.cu */
int fb_conv(evt_fb_ctx *, const evt_fb_node *, double *, char *, size_t);        /* conv.cu */
int fb_pool(evt_fb_ctx *, const evt_fb_node *, double *, char *, size_t);        /* conv.cu */
int fb_layout(evt_fb_ctx *, const evt_fb_node *, double *, char *, size_t);      /* layout.cu */
int fb_class_loss(evt_fb_ctx *, const evt_fb_node *, double *, char *, size_t);  /* misc.cu */
int fb_pointwise_loss(evt_fb_ctx *, const evt_fb_node *, double *, char *, size_t); /* misc.cu */
int fb_gather(evt_fb_ctx *, const evt_fb_node *, double *, char *, size_t);      /* misc.cu */
int fb_spmm(evt_fb_ctx *, const evt_fb_node *, double *, char *, size_t);        /* misc.cu */
int fb_sdpa_reference(evt_fb_ctx *, const evt_fb_node *, double *, char *, size_t); /* attention.cu */

int fb_layout_native(evt_fb_ctx *ctx, const evt_fb_node *nd, char *err, size_t errlen);   /* layout.cu */
int fb_gather_native(evt_fb_ctx *ctx, const evt_fb_node *nd, char *err, size_t errlen);   /* misc.cu */
int fb_attention_cudnn(evt_fb_ctx *ctx, const evt_fb_node *nd, char *err, size_t errlen); /* attention.cu */
int fb_coo_native(evt_fb_ctx *ctx, const evt_fb_node *nd, char *err, size_t errlen);      /* coo.cu */
int fb_fill_native(evt_fb_ctx *ctx, const evt_fb_node *nd, char *err, size_t errlen);     /* elementwise.cu */
int fb_matmul_native(evt_fb_ctx *ctx, const evt_fb_node *nd, char *err, size_t errlen);   /* gemm.cu */
bool fb_matmul_native_covers(const evt_fb_node *nd);                                      /* gemm.cu */

/* attention.cu: sizes the context's cuDNN attention scratch for node nd (-1: nd does not run on cuDNN). */
int fb_attention_reserve(evt_fb_ctx *c, const evt_fb_node *nd, char *err, size_t errlen);
/* coo.cu: sizes the context's coo scratch for a coo_perm / coo_rowptr node (-1: nd is neither). */
int fb_coo_reserve(evt_fb_ctx *c, const evt_fb_node *nd, char *err, size_t errlen);
/* gemm.cu: the context's cuBLAS handle and workspace; frees them and the cuBLASLt plans. */
int fb_gemm_ctx_init(evt_fb_ctx *c, char *err, size_t errlen);
void fb_gemm_ctx_free(evt_fb_ctx *c);
/* misc.cu (the file of the run-time index-error flag; csr.cu's kernels set it through its address): the node id + 1
 * of the first error since the last call, or 0; clears it. */
int fb_take_bad_node(int *bad_plus_one, char *err, size_t errlen);

#endif
