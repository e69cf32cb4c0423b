/* Matrix products: mm / bmm / addmm nodes (cuBLAS, or a tiled kernel in double), and evt_fb_gemm_run, the fused
 * runtime's plain GEMM (cuBLAS; cuBLASLt for a bias epilogue). */
#include "internal.h"

#include <mutex>

/* ---- gemm: out[b] = a[b] @ b[b], double, k increasing; 16x16 tiles ---------------------------------- */

#define TILE 16
__global__ void k_gemm(double *S, tv A, tv B, ll M, ll K, ll N, shape_t bsh, strides sa, strides sb) {
  __shared__ double ta[TILE][TILE], tb[TILE][TILE];
  ll b = blockIdx.z;
  ll oa = strided_off(b, bsh, sa), ob = strided_off(b, bsh, sb);
  ll i = blockIdx.y * TILE + threadIdx.y, j = blockIdx.x * TILE + threadIdx.x;
  double acc = 0;
  for (ll k0 = 0; k0 < K; k0 += TILE) {
    ll ka = k0 + threadIdx.x, kb = k0 + threadIdx.y;
    ta[threadIdx.y][threadIdx.x] = i < M && ka < K ? ld(A.p, A.dt, oa + i * K + ka) : 0.0;
    tb[threadIdx.y][threadIdx.x] = kb < K && j < N ? ld(B.p, B.dt, ob + kb * N + j) : 0.0;
    __syncthreads();
    ll kend = K - k0 < TILE ? K - k0 : TILE;
    for (ll k = 0; k < kend; k++) acc += ta[threadIdx.y][k] * tb[k][threadIdx.x];
    __syncthreads();
  }
  if (i < M && j < N) S[(b * M + i) * N + j] = acc;
}

__global__ void k_float_to_double(double *S, const float *F, ll n) {
  GRID_FOR(e, n) S[e] = (double)F[e];
}

__global__ void k_addmm_bias(double *S, tv c, ll M, ll N, ll cs0, ll cs1) {
  GRID_FOR(e, M * N) S[e] += ld(c.p, c.dt, (e / N) * cs0 + (e % N) * cs1);
}

/* ---- the context's cuBLAS state ----------------------------------------------------------------------- */

/* One cuBLAS handle per device, shared by every context on it: a handle holds device memory of its own, which
 * per program added up to gigabytes for models of many segments. A call sets its context's stream and workspace
 * and enqueues under the device's lock (blas_call), so contexts on other streams or threads never interleave. */
struct shared_blas {
  std::mutex mu;
  cublasHandle_t h;
  int refs;
};
enum { MAX_DEVICES = 64 };
static std::mutex g_blas_mu; /* guards h and refs of every device */
static shared_blas g_blas[MAX_DEVICES];

static int blas_acquire(evt_fb_ctx *c, char *err, size_t errlen) {
  if (cudaGetDevice(&c->device) != cudaSuccess || c->device < 0 || c->device >= MAX_DEVICES) {
    snprintf(err, errlen, "cuBLAS: no usable current device");
    return 1;
  }
  std::lock_guard<std::mutex> lk(g_blas_mu);
  shared_blas &b = g_blas[c->device];
  if (b.refs == 0) {
    cublasStatus_t cs = cublasCreate(&b.h);
    if (cs != CUBLAS_STATUS_SUCCESS) {
      snprintf(err, errlen, "cublasCreate failed (status %d)", (int)cs);
      return 1;
    }
    /* Tensor cores on, but no TF32 for f32 operands (DEFAULT_MATH never uses it) and no reduced-precision
     * (bf16/f16) split-K reductions: products and sums stay f32, as the interpreter models them. */
    cublasSetMathMode(b.h, (cublasMath_t)(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
  }
  b.refs++;
  c->cublas = b.h;
  return 0;
}

static void blas_release(evt_fb_ctx *c) {
  if (!c->cublas) return;
  std::lock_guard<std::mutex> lk(g_blas_mu);
  shared_blas &b = g_blas[c->device];
  if (--b.refs == 0) cublasDestroy(b.h);
  c->cublas = NULL;
}

/* The device's shared handle, set to the context's stream and workspace, held for one call (the lock). */
struct blas_call {
  std::lock_guard<std::mutex> lk;
  blas_call(evt_fb_ctx *c, cudaStream_t stream) : lk(g_blas[c->device].mu) {
    cublasSetStream(c->cublas, stream);
    cublasSetWorkspace(c->cublas, c->cublas_ws, c->cublas_ws_bytes); /* after SetStream, which resets it */
  }
};

int fb_gemm_ctx_init(evt_fb_ctx *c, char *err, size_t errlen) {
  if (blas_acquire(c, err, errlen)) return 1;
  c->cublas_ws_bytes = (size_t)32 << 20;
  cudaError_t e = cudaMalloc(&c->cublas_ws, c->cublas_ws_bytes);
  if (e != cudaSuccess) {
    snprintf(err, errlen, "cudaMalloc(cuBLAS workspace): %s", cudaGetErrorString(e));
    c->cublas_ws = NULL;
    return 1;
  }
  return 0;
}

static void lt_plan_free(lt_plan *p) {
  if (!p->used) return;
  if (p->la) cublasLtMatrixLayoutDestroy(p->la);
  if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
  if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
  if (p->op) cublasLtMatmulDescDestroy(p->op);
  memset(p, 0, sizeof *p);
}

void fb_gemm_ctx_free(evt_fb_ctx *c) {
  for (int i = 0; i < LT_PLANS; i++) lt_plan_free(&c->plans[i]);
  if (c->lt) cublasLtDestroy(c->lt);
  blas_release(c);
  cudaFree(c->cublas_ws);
}

/* ---- mm / bmm / addmm nodes ------------------------------------------------------------------------------ */

/* true if batch b (row-major over bsh) sits at b * (*u) elements for a constant *u: batch dims contiguous,
 * or every batch dim broadcast (u = 0) */
static bool uniform_stride(const shape_t &bsh, const strides &st_, ll *u) {
  *u = 0;
  int last = -1;
  for (int i = 0; i < bsh.rank; i++)
    if (bsh.d[i] != 1) last = i;
  if (last < 0) return true;
  *u = st_.s[last];
  ll inner = 1;
  for (int i = bsh.rank - 1; i >= 0; i--) {
    if (bsh.d[i] != 1 && st_.s[i] != *u * inner) return false;
    inner *= bsh.d[i];
  }
  return true;
}

/* Batch strides of operand t (in matrices, scaled to elements) at the output's batch dims, with numpy broadcast;
 * false if they do not match. */
static bool batch_strides(const evt_fb_tensor &t, const evt_fb_tensor &out, int rb, strides *ss) {
  memset(ss, 0, sizeof *ss);
  int tb = t.rank - 2;
  if (tb > rb) return false;
  ll s = t.shape[t.rank - 2] * t.shape[t.rank - 1];
  for (int i = rb - 1; i >= 0; i--) {
    int j = i - (rb - tb);
    if (j < 0) continue;
    if (t.shape[j] != out.shape[i] && t.shape[j] != 1) return false;
    ss->s[i] = (t.shape[j] == 1 && out.shape[i] != 1) ? 0 : s;
    s *= t.shape[j];
  }
  return true;
}

/* The geometry of an mm / bmm / addmm node: C[b] (M x N) = A[b] (M x K) B[b] (K x N) over the output's batch
 * dims bsh; uniform when each operand's batch matrices sit at a constant stride (ua, ub elements), as cuBLAS's
 * strided batches need. NULL, or why the node's shapes are not a product. */
struct mm_geometry {
  ll M, K, N, nbat, ua, ub;
  shape_t bsh;
  strides sa, sb;
  bool uniform;
};

static const char *mm_geometry_of(const evt_fb_node *nd, mm_geometry *g) {
  const evt_fb_tensor &out = nd->out;
  const evt_fb_tensor &A = nd->in[nd->op == EVT_FB_OP_ADDMM ? 1 : 0], &B = nd->in[nd->op == EVT_FB_OP_ADDMM ? 2 : 1];
  if (A.rank < 2 || B.rank < 2 || out.rank < 2) return "operands must have rank >= 2";
  g->M = A.shape[A.rank - 2], g->K = A.shape[A.rank - 1], g->N = B.shape[B.rank - 1];
  if (B.shape[B.rank - 2] != g->K || out.shape[out.rank - 2] != g->M || out.shape[out.rank - 1] != g->N)
    return "operand shapes do not match the output";
  int rb = out.rank - 2;
  g->bsh = shape_t{rb, {1, 1, 1, 1, 1, 1}};
  for (int i = 0; i < rb; i++) g->bsh.d[i] = out.shape[i];
  if (!batch_strides(A, out, rb, &g->sa) || !batch_strides(B, out, rb, &g->sb))
    return "batch dims of the operands do not match the output";
  g->nbat = prod(out.shape, 0, rb);
  g->ua = g->ub = 0;
  g->uniform = uniform_stride(g->bsh, g->sa, &g->ua) && uniform_stride(g->bsh, g->sb, &g->ub);
  return NULL;
}

static bool cublas_dims(const mm_geometry &g) {
  return g.uniform && g.nbat && g.M && g.N && g.K && g.nbat <= INT32_MAX && g.M <= INT32_MAX && g.N <= INT32_MAX &&
         g.K <= INT32_MAX;
}

static cudaDataType_t cuda_type(int dt) {
  return dt == EVT_FB_F32 ? CUDA_R_32F : dt == EVT_FB_BF16 ? CUDA_R_16BF : CUDA_R_16F;
}

static bool floating(int dt) { return dt == EVT_FB_F32 || dt == EVT_FB_BF16 || dt == EVT_FB_F16; }

/* C[b] = A[b] B[b] through cuBLAS (f32 compute, no TF32) into C of dtype ct (row-major [M, N] matrices). */
static int cublas_product(evt_fb_ctx *ctx, const evt_fb_node *nd, const mm_geometry &g, void *C, cudaDataType_t ct,
                          char *err, size_t errlen) {
  const evt_fb_tensor &A = nd->in[nd->op == EVT_FB_OP_ADDMM ? 1 : 0], &B = nd->in[nd->op == EVT_FB_OP_ADDMM ? 2 : 1];
  cudaDataType_t at = cuda_type(A.dtype);
  float alpha = 1.0f, beta = 0.0f;
  blas_call lock(ctx, ctx->stream);
  ctx->launches++;
  /* row-major C[M,N] = A B  <=>  column-major C^T[N,M] = B^T A^T */
  cublasStatus_t cs = cublasGemmStridedBatchedEx(
      ctx->cublas, CUBLAS_OP_N, CUBLAS_OP_N, (int)g.N, (int)g.M, (int)g.K, &alpha, B.ptr, at, (int)g.N, g.ub, A.ptr,
      at, (int)g.K, g.ua, &beta, C, ct, (int)g.N, g.M * g.N, (int)g.nbat, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (cs != CUBLAS_STATUS_SUCCESS) {
    snprintf(err, errlen, "cublasGemmStridedBatchedEx failed (status %d)", (int)cs);
    return 2;
  }
  return 0;
}

/* An mm / bmm cuBLAS writes straight into its output: operands of one floating dtype, the output of theirs or
 * f32. One rounding of the f32 accumulator either way, so the double path's value; no scratch. */
bool fb_matmul_native_covers(const evt_fb_node *nd) {
  if (nd->op != EVT_FB_OP_MM && nd->op != EVT_FB_OP_BMM) return false;
  int a = nd->in[0].dtype, b = nd->in[1].dtype, o = nd->out.dtype;
  mm_geometry g;
  return a == b && floating(a) && (o == a || o == EVT_FB_F32) && !mm_geometry_of(nd, &g) && cublas_dims(g);
}

int fb_matmul_native(evt_fb_ctx *ctx, const evt_fb_node *nd, char *err, size_t errlen) {
  if (!fb_matmul_native_covers(nd)) return -1;
  mm_geometry g;
  mm_geometry_of(nd, &g);
  return cublas_product(ctx, nd, g, nd->out.ptr, cuda_type(nd->out.dtype), err, errlen);
}

int fb_matmul(evt_fb_ctx *ctx, const evt_fb_node *nd, double *S, char *err, size_t errlen) {
  const evt_fb_tensor &out = nd->out;
  const evt_fb_tensor *in = nd->in;
  int op = nd->op;
  ll n = out.numel;
  const evt_fb_tensor &A = in[op == EVT_FB_OP_ADDMM ? 1 : 0], &B = in[op == EVT_FB_OP_ADDMM ? 2 : 1];
  mm_geometry g;
  const char *why = mm_geometry_of(nd, &g);
  if (why) UNSUPPORTED(why);
  /* cuBLAS (f32 compute, no TF32) when both operands share a floating dtype and each operand's batch matrices
   * sit at a constant stride; else the f64 tiled kernel */
  if (A.dtype == B.dtype && floating(A.dtype) && cublas_dims(g)) {
    float *F = (float *)ctx->s2;
    int r = cublas_product(ctx, nd, g, F, CUDA_R_32F, err, errlen);
    if (r) return r;
    k_float_to_double<<<blocks(n), 256, 0, ST>>>(S, F, n);
  } else {
    if (g.nbat > 65535) UNSUPPORTED("more than 65535 batch matrices with broadcast batch dims");
    dim3 grid((unsigned)((g.N + TILE - 1) / TILE), (unsigned)((g.M + TILE - 1) / TILE), (unsigned)(g.nbat ? g.nbat : 1));
    if (g.nbat && g.M && g.N)
      k_gemm<<<grid, dim3(TILE, TILE), 0, ST>>>(S, view(A), view(B), g.M, g.K, g.N, g.bsh, g.sa, g.sb);
  }
  if (op == EVT_FB_OP_ADDMM) {
    strides cs;
    if (out.rank != 2 || !bcast(in[0], out, &cs)) UNSUPPORTED("addmm bias does not broadcast to the product");
    k_addmm_bias<<<blocks(n), 256, 0, ST>>>(S, view(in[0]), g.M, g.N, cs.s[0], cs.s[1]);
  }
  return 0;
}

/* ---- evt_fb_gemm_run --------------------------------------------------------------------------------------- */

#define LTK(x)                                                                     \
  do {                                                                             \
    cublasStatus_t s_ = (x);                                                       \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                             \
      snprintf(err, errlen, "%s failed (cuBLAS status %d)", #x, (int)s_);          \
      return 2;                                                                    \
    }                                                                              \
  } while (0)

/* A new cuBLASLt plan for g in p: descriptor with the BIAS epilogue, layouts, the heuristic's algorithm. */
static int lt_plan_build(evt_fb_ctx *c, lt_plan *p, const evt_fb_gemm *g, cudaDataType_t ab, cudaDataType_t dt,
                         char *err, size_t errlen) {
  p->used = 1, p->m = (int)g->m, p->n = (int)g->n, p->k = (int)g->k, p->ta = g->ta, p->tb = g->tb;
  p->ab = g->ab_dtype, p->d = g->d_dtype;
  LTK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  /* column-major D^T[N,M] = B^T A^T, as in evt_fb_gemm_run */
  cublasOperation_t opb = g->tb ? CUBLAS_OP_T : CUBLAS_OP_N, opa = g->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  LTK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &opb, sizeof opb));
  LTK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &opa, sizeof opa));
  cublasLtEpilogue_t e = CUBLASLT_EPILOGUE_BIAS;
  LTK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e));
  const void *b0 = g->bias;
  LTK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &b0, sizeof b0));
  if (opb == CUBLAS_OP_N) LTK(cublasLtMatrixLayoutCreate(&p->la, ab, (uint64_t)g->n, (uint64_t)g->k, g->ldb));
  else LTK(cublasLtMatrixLayoutCreate(&p->la, ab, (uint64_t)g->k, (uint64_t)g->n, g->ldb));
  if (opa == CUBLAS_OP_N) LTK(cublasLtMatrixLayoutCreate(&p->lb, ab, (uint64_t)g->k, (uint64_t)g->m, g->lda));
  else LTK(cublasLtMatrixLayoutCreate(&p->lb, ab, (uint64_t)g->m, (uint64_t)g->k, g->lda));
  LTK(cublasLtMatrixLayoutCreate(&p->lc, dt, (uint64_t)g->n, (uint64_t)g->m, g->ldd));
  cublasLtMatmulPreference_t pref;
  LTK(cublasLtMatmulPreferenceCreate(&pref));
  size_t ws = c->cublas_ws_bytes;
  cublasStatus_t ps = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  cublasLtMatmulHeuristicResult_t res;
  int nres = 0;
  cublasStatus_t hs = ps == CUBLAS_STATUS_SUCCESS
                          ? cublasLtMatmulAlgoGetHeuristic(c->lt, p->op, p->la, p->lb, p->lc, p->lc, pref, 1, &res, &nres)
                          : ps;
  cublasLtMatmulPreferenceDestroy(pref);
  if (hs != CUBLAS_STATUS_SUCCESS || nres < 1) {
    snprintf(err, errlen, "cuBLASLt has no algorithm for the bias GEMM %lldx%lldx%lld (status %d)", (long long)g->m,
             (long long)g->n, (long long)g->k, (int)hs);
    return 1;
  }
  p->algo = res.algo;
  return 0;
}

/* D = op(A).op(B) + bias (an N-vector in D's dtype, broadcast over the rows) through cuBLASLt's BIAS
 * epilogue: f32 accumulation, the bias added in f32, one rounding to D's dtype. Unbatched, packed or
 * strided by the leading dims of g. */
static int lt_gemm_bias(evt_fb_ctx *c, const evt_fb_gemm *g, cudaDataType_t ab, cudaDataType_t dt, void *stream,
                        char *err, size_t errlen) {
  if (g->batch != 1) {
    snprintf(err, errlen, "cuBLASLt bias GEMM: batched (%lld) is not supported", (long long)g->batch);
    return 1;
  }
  if (!c->lt) LTK(cublasLtCreate(&c->lt));
  lt_plan *p = NULL;
  for (int i = 0; i < LT_PLANS && !p; i++) {
    lt_plan *q = &c->plans[i];
    if (q->used && q->m == g->m && q->n == g->n && q->k == g->k && q->ta == g->ta && q->tb == g->tb &&
        q->ab == g->ab_dtype && q->d == g->d_dtype)
      p = q;
  }
  if (!p) {
    p = &c->plans[c->next_plan];
    c->next_plan = (c->next_plan + 1) % LT_PLANS;
    lt_plan_free(p);
    int rc = lt_plan_build(c, p, g, ab, dt, err, errlen);
    if (rc) {
      lt_plan_free(p);
      return rc;
    }
  }
  const void *bias = g->bias;
  LTK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  float alpha = 1.0f, beta = 0.0f;
  c->launches++;
  LTK(cublasLtMatmul(c->lt, p->op, &alpha, g->b, p->la, g->a, p->lb, &beta, g->d, p->lc, g->d, p->lc, &p->algo,
                     c->cublas_ws, c->cublas_ws_bytes, (cudaStream_t)stream));
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    snprintf(err, errlen, "cuBLASLt bias GEMM: %s", cudaGetErrorString(e));
    return 2;
  }
  return 0;
}
#undef LTK

extern "C" int evt_fb_gemm_run(evt_fb_ctx *c, const evt_fb_gemm *g, void *stream, char *err, size_t errlen) {
  const int dts[3] = {EVT_FB_F32, EVT_FB_F16, EVT_FB_BF16};
  const cudaDataType_t cts[3] = {CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF};
  int ia = -1, id = -1;
  for (int i = 0; i < 3; i++) {
    if (g->ab_dtype == dts[i]) ia = i;
    if (g->d_dtype == dts[i]) id = i;
  }
  if (ia < 0 || id < 0 || (g->d_dtype != g->ab_dtype && g->d_dtype != EVT_FB_F32)) {
    snprintf(err, errlen, "cuBLAS GEMM: operands %d, result %d: unsupported dtypes", g->ab_dtype, g->d_dtype);
    return 1;
  }
  const int64_t lim = INT32_MAX;
  if (g->m < 1 || g->n < 1 || g->k < 1 || g->batch < 1 || g->m > lim || g->n > lim || g->k > lim || g->batch > lim ||
      g->lda > lim || g->ldb > lim || g->ldd > lim) {
    snprintf(err, errlen, "cuBLAS GEMM: sizes %lld x %lld x %lld (batch %lld) out of range", (long long)g->m,
             (long long)g->n, (long long)g->k, (long long)g->batch);
    return 1;
  }
  if (g->bias) return lt_gemm_bias(c, g, cts[ia], cts[id], stream, err, errlen);
  blas_call lock(c, (cudaStream_t)stream);
  c->launches++;
  float alpha = 1.0f, beta = 0.0f;
  /* row-major D[M,N] = A B  <=>  column-major D^T[N,M] = B^T A^T: B is cuBLAS's first operand; a row-major
   * K x N B is a column-major N x K matrix (no transpose), a row-major N x K B needs one; A likewise */
  cublasStatus_t cs = cublasGemmStridedBatchedEx(
      c->cublas, g->tb ? CUBLAS_OP_T : CUBLAS_OP_N, g->ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)g->n, (int)g->m, (int)g->k,
      &alpha, g->b, cts[ia], (int)g->ldb, g->sb, g->a, cts[ia], (int)g->lda, g->sa, &beta, g->d, cts[id], (int)g->ldd,
      g->sd, (int)g->batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (cs != CUBLAS_STATUS_SUCCESS) {
    snprintf(err, errlen, "cublasGemmStridedBatchedEx failed (status %d)", (int)cs);
    return 2;
  }
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    snprintf(err, errlen, "cuBLAS GEMM: %s", cudaGetErrorString(e));
    return 2;
  }
  return 0;
}
