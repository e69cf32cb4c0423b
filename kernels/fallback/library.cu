/* The kernel library's frame: device, contexts, memory, host transfers, streams, CUDA graphs, events, and the
 * dispatcher evt_fb_run, which hands a node to its native path or its op family (design: internal.h). */
#include "internal.h"

__global__ void k_finish(void *out, int dt, const double *S, ll n) {
  GRID_FOR(e, n) st(out, dt, e, S[e]);
}

__global__ void k_to_double(double *S, tv x, ll n) {
  GRID_FOR(e, n) S[e] = ld(x.p, x.dt, e);
}

/* Grows *buf to n doubles. Growing frees the old buffer (cudaFree waits for the device): runs reserve every
 * node's scratch before the first step, so a step never grows it (see evt_fb_reserve). */
static int ensure(double **buf, size_t *cap, size_t n, char *err, size_t errlen) {
  if (n <= *cap) return 0;
  if (*buf) cudaFree(*buf);
  *buf = NULL;
  *cap = 0;
  CK(cudaMalloc((void **)buf, n * sizeof(double)));
  *cap = n;
  return 0;
}

/* Doubles of S2 node nd needs (0: none); mirrors the families' uses of ctx->s2. */
static ll scratch2_need(const evt_fb_node *nd) {
  const evt_fb_tensor *in = nd->in;
  switch (nd->op) {
  case EVT_FB_OP_NLL_LOSS: case EVT_FB_OP_NLL_LOSS_BACKWARD: case EVT_FB_OP_CROSS_ENTROPY: {
    const evt_fb_tensor &x = in[nd->op == EVT_FB_OP_NLL_LOSS_BACKWARD ? 1 : 0];
    ll m = x.rank == 1 ? 1 : x.rank >= 2 ? x.shape[0] * prod(x.shape, 2, x.rank) : 0;
    return 2 * m + 1;
  }
  case EVT_FB_OP_BCE_WITH_LOGITS: case EVT_FB_OP_MSE_LOSS: return 2 * in[0].numel + 1;
  case EVT_FB_OP_MM: case EVT_FB_OP_BMM: case EVT_FB_OP_ADDMM: return (nd->out.numel + 1) / 2 + 1;
  case EVT_FB_OP_SDPA: case EVT_FB_OP_SDPA_BACKWARD_Q: case EVT_FB_OP_SDPA_BACKWARD_K: case EVT_FB_OP_SDPA_BACKWARD_V: {
    const evt_fb_tensor &q = in[nd->op == EVT_FB_OP_SDPA ? 0 : 1], &k = in[nd->op == EVT_FB_OP_SDPA ? 1 : 2];
    if (q.rank < 2 || k.rank != q.rank) return 0;
    return prod(q.shape, 0, q.rank - 2) * q.shape[q.rank - 2] * 2 * k.shape[k.rank - 2] + 1;
  }
  default: return 0;
  }
}

/* Ops whose kernels assign every element of S (one thread per output element, grid-stride): no zeroing
 * memset needed. Scatters, atomics and partial writes (one_hot, backward gathers, losses) are not listed. */
static bool writes_every_element(int op) {
  switch (op) {
  case EVT_FB_OP_FULL: case EVT_FB_OP_SCALAR: case EVT_FB_OP_RAND: case EVT_FB_OP_DROPOUT:
  case EVT_FB_OP_NEG: case EVT_FB_OP_EXP: case EVT_FB_OP_LOG: case EVT_FB_OP_SQRT: case EVT_FB_OP_RSQRT:
  case EVT_FB_OP_RECIPROCAL: case EVT_FB_OP_ABS: case EVT_FB_OP_SIGN: case EVT_FB_OP_TANH: case EVT_FB_OP_SIGMOID:
  case EVT_FB_OP_RELU: case EVT_FB_OP_GELU: case EVT_FB_OP_ERF: case EVT_FB_OP_CAST: case EVT_FB_OP_POW:
  case EVT_FB_OP_GELU_BACKWARD: case EVT_FB_OP_THRESHOLD_BACKWARD:
  case EVT_FB_OP_ADD: case EVT_FB_OP_SUB: case EVT_FB_OP_MUL: case EVT_FB_OP_DIV: case EVT_FB_OP_MAXIMUM:
  case EVT_FB_OP_MINIMUM: case EVT_FB_OP_EQ: case EVT_FB_OP_NE: case EVT_FB_OP_LT: case EVT_FB_OP_LE:
  case EVT_FB_OP_GT: case EVT_FB_OP_GE: case EVT_FB_OP_WHERE:
  case EVT_FB_OP_SUM: case EVT_FB_OP_MEAN: case EVT_FB_OP_AMAX:
  case EVT_FB_OP_SOFTMAX: case EVT_FB_OP_LOG_SOFTMAX: case EVT_FB_OP_SOFTMAX_BACKWARD: case EVT_FB_OP_LOG_SOFTMAX_BACKWARD:
  case EVT_FB_OP_RESHAPE: case EVT_FB_OP_SQUEEZE: case EVT_FB_OP_UNSQUEEZE: case EVT_FB_OP_PERMUTE:
  case EVT_FB_OP_TRANSPOSE: case EVT_FB_OP_EXPAND:
  case EVT_FB_OP_MM: case EVT_FB_OP_BMM: case EVT_FB_OP_ADDMM:
    return true;
  default:
    return false;
  }
}

/* The double-path family of op (NULL: the library does not cover it). */
static fb_family_fn family_of(int op) {
  switch (op) {
  case EVT_FB_OP_FULL: case EVT_FB_OP_SCALAR: case EVT_FB_OP_RAND: case EVT_FB_OP_DROPOUT:
    return fb_source;
  case EVT_FB_OP_NEG: case EVT_FB_OP_EXP: case EVT_FB_OP_LOG: case EVT_FB_OP_SQRT: case EVT_FB_OP_RSQRT:
  case EVT_FB_OP_RECIPROCAL: case EVT_FB_OP_ABS: case EVT_FB_OP_SIGN: case EVT_FB_OP_TANH: case EVT_FB_OP_SIGMOID:
  case EVT_FB_OP_RELU: case EVT_FB_OP_GELU: case EVT_FB_OP_ERF: case EVT_FB_OP_CAST: case EVT_FB_OP_POW:
  case EVT_FB_OP_GELU_BACKWARD: case EVT_FB_OP_THRESHOLD_BACKWARD:
  case EVT_FB_OP_ADD: case EVT_FB_OP_SUB: case EVT_FB_OP_MUL: case EVT_FB_OP_DIV: case EVT_FB_OP_MAXIMUM:
  case EVT_FB_OP_MINIMUM: case EVT_FB_OP_EQ: case EVT_FB_OP_NE: case EVT_FB_OP_LT: case EVT_FB_OP_LE:
  case EVT_FB_OP_GT: case EVT_FB_OP_GE: case EVT_FB_OP_WHERE:
    return fb_elementwise;
  case EVT_FB_OP_SUM: case EVT_FB_OP_MEAN: case EVT_FB_OP_AMAX:
    return fb_reduce;
  case EVT_FB_OP_SOFTMAX: case EVT_FB_OP_LOG_SOFTMAX: case EVT_FB_OP_SOFTMAX_BACKWARD:
  case EVT_FB_OP_LOG_SOFTMAX_BACKWARD:
    return fb_softmax;
  case EVT_FB_OP_LAYER_NORM: case EVT_FB_OP_LAYER_NORM_BACKWARD_INPUT: case EVT_FB_OP_LAYER_NORM_BACKWARD_WEIGHT:
  case EVT_FB_OP_BATCH_NORM: case EVT_FB_OP_BATCH_NORM_BACKWARD_INPUT: case EVT_FB_OP_BATCH_NORM_BACKWARD_WEIGHT:
    return fb_norm;
  case EVT_FB_OP_NLL_LOSS: case EVT_FB_OP_NLL_LOSS_BACKWARD: case EVT_FB_OP_CROSS_ENTROPY:
    return fb_class_loss;
  case EVT_FB_OP_BCE_WITH_LOGITS: case EVT_FB_OP_MSE_LOSS: case EVT_FB_OP_BCE_WITH_LOGITS_BACKWARD:
  case EVT_FB_OP_MSE_LOSS_BACKWARD:
    return fb_pointwise_loss;
  case EVT_FB_OP_ONE_HOT: case EVT_FB_OP_EMBEDDING: case EVT_FB_OP_EMBEDDING_BACKWARD: case EVT_FB_OP_INDEX_SELECT:
  case EVT_FB_OP_INDEX_SELECT_BACKWARD:
    return fb_gather;
  case EVT_FB_OP_RESHAPE: case EVT_FB_OP_SQUEEZE: case EVT_FB_OP_UNSQUEEZE: case EVT_FB_OP_PERMUTE:
  case EVT_FB_OP_TRANSPOSE: case EVT_FB_OP_EXPAND: case EVT_FB_OP_SLICE: case EVT_FB_OP_SLICE_BACKWARD:
  case EVT_FB_OP_CONCAT:
    return fb_layout;
  case EVT_FB_OP_MM: case EVT_FB_OP_BMM: case EVT_FB_OP_ADDMM:
    return fb_matmul;
  case EVT_FB_OP_SPMM: case EVT_FB_OP_SPMM_T:
    return fb_spmm;
  case EVT_FB_OP_CONV2D: case EVT_FB_OP_CONV2D_BACKWARD_INPUT: case EVT_FB_OP_CONV2D_BACKWARD_WEIGHT:
    return fb_conv;
  case EVT_FB_OP_MAX_POOL2D: case EVT_FB_OP_MAX_POOL2D_BACKWARD: case EVT_FB_OP_ADAPTIVE_MAX_POOL2D:
  case EVT_FB_OP_ADAPTIVE_MAX_POOL2D_BACKWARD: case EVT_FB_OP_AVG_POOL2D: case EVT_FB_OP_AVG_POOL2D_BACKWARD:
    return fb_pool;
  case EVT_FB_OP_SDPA: case EVT_FB_OP_SDPA_BACKWARD_Q: case EVT_FB_OP_SDPA_BACKWARD_K: case EVT_FB_OP_SDPA_BACKWARD_V:
    return fb_sdpa_reference;
  default:
    return NULL;
  }
}

extern "C" int evt_fb_run(evt_fb_ctx *ctx, const evt_fb_node *nd, void *stream, char *err, size_t errlen) {
  ctx->stream = (cudaStream_t)stream;
  int r = fb_fill_native(ctx, nd, err, errlen);
  if (r < 0) r = fb_layout_native(ctx, nd, err, errlen);
  if (r < 0) r = fb_gather_native(ctx, nd, err, errlen);
  if (r < 0) r = fb_attention_cudnn(ctx, nd, err, errlen);
  if (r < 0) r = fb_coo_native(ctx, nd, err, errlen);
  if (r < 0) r = fb_matmul_native(ctx, nd, err, errlen);
  if (r >= 0) return r;
  if (nd->op == EVT_FB_OP_INPUT || nd->op == EVT_FB_OP_PARAM) UNSUPPORTED("an input or parameter has no computation");
  fb_family_fn run = family_of(nd->op);
  if (!run) {
    snprintf(err, errlen, "op %d is not supported by the CUDA fallback library", nd->op);
    return 1;
  }
  if (evt_fb_reserve(ctx, nd, err, errlen)) return 2; /* no-op when reserved before the step */
  ll n = nd->out.numel;
  double *S = ctx->s1;
  if (!writes_every_element(nd->op)) CK(cudaMemsetAsync(S, 0, sizeof(double) * (size_t)(n ? n : 1), ctx->stream));
  if ((r = run(ctx, nd, S, err, errlen))) return r;
  CK(cudaGetLastError());
  k_finish<<<blocks(n), 256, 0, ST>>>(nd->out.ptr, nd->out.dtype, S, n);
  CK(cudaGetLastError());
  return 0;
}

/* Reserves what node nd keeps in the context (attention plans and buffers, COO scratch) and sets *n1, *n2 to
 * the doubles of S and S2 its double path needs (0: a native path, or memory of its own). */
static int reserve_own(evt_fb_ctx *c, const evt_fb_node *nd, ll *n1, ll *n2, char *err, size_t errlen) {
  *n1 = *n2 = 0;
  int r = fb_attention_reserve(c, nd, err, errlen);
  if (r < 0) r = fb_coo_reserve(c, nd, err, errlen);
  if (r >= 0) return r;
  if (nd->op == EVT_FB_OP_FULL || nd->op == EVT_FB_OP_SCALAR || fb_matmul_native_covers(nd))
    return 0; /* (stored in the output's dtype: fb_fill_native, fb_matmul_native) */
  *n1 = nd->out.numel > 0 ? nd->out.numel : 1;
  *n2 = scratch2_need(nd);
  return 0;
}

extern "C" int evt_fb_scratch_need(evt_fb_ctx *c, const evt_fb_node *nd, int64_t *n1, int64_t *n2, char *err,
                                   size_t errlen) {
  ll a, b;
  int r = reserve_own(c, nd, &a, &b, err, errlen);
  *n1 = r ? 0 : a, *n2 = r ? 0 : b;
  return r;
}

extern "C" int evt_fb_reserve(evt_fb_ctx *c, const evt_fb_node *nd, char *err, size_t errlen) {
  ll n1, n2;
  int r = reserve_own(c, nd, &n1, &n2, err, errlen);
  if (r) return r;
  if (c->scratch_bound) {
    if ((size_t)n1 <= c->n1 && (size_t)n2 <= c->n2) return 0;
    snprintf(err, errlen, "node %d needs %lld + %lld doubles of scratch; the bound scratch holds %zu + %zu", nd->id,
             (long long)n1, (long long)n2, c->n1, c->n2);
    return 2;
  }
  if (n1 > 0 && ensure(&c->s1, &c->n1, (size_t)n1, err, errlen)) return 2;
  if (n2 > 0 && ensure(&c->s2, &c->n2, (size_t)n2, err, errlen)) return 2;
  return 0;
}

extern "C" void evt_fb_bind_scratch(evt_fb_ctx *c, void *s1, int64_t n1, void *s2, int64_t n2) {
  if (!c->scratch_bound) { /* (its own, if any: freed; cudaFree waits for the device, once) */
    if (c->s1) cudaFree(c->s1);
    if (c->s2) cudaFree(c->s2);
  }
  c->scratch_bound = s1 != NULL;
  c->s1 = (double *)s1, c->s2 = (double *)s2;
  c->n1 = s1 ? (size_t)n1 : 0, c->n2 = s1 && s2 ? (size_t)n2 : 0;
  if (!s1) c->s2 = NULL;
}

/* ---- device, contexts, memory --------------------------------------------------------------------------- */

extern "C" int evt_fb_dtype_bytes(int dt) {
  switch (dt) {
  case EVT_FB_F32: case EVT_FB_I32: return 4;
  case EVT_FB_F16: case EVT_FB_BF16: return 2;
  case EVT_FB_I64: return 8;
  default: return 1; /* bool, f8e4m3, f8e5m2 */
  }
}

extern "C" int evt_fb_init(char *err, size_t errlen) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    snprintf(err, errlen, "%s", e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount found 0 devices");
    return 1;
  }
  CK(cudaSetDevice(0));
  return 0;
}

extern "C" int evt_fb_device_arch(void) {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) != cudaSuccess)
    return 0;
  return major * 10 + minor;
}

extern "C" void evt_fb_ctx_free(evt_fb_ctx *c) {
  if (!c) return;
  fb_gemm_ctx_free(c);
  if (!c->scratch_bound) cudaFree(c->s1), cudaFree(c->s2);
  cudaFree(c->stage);
  cudaFree(c->attn);
  cudaFree(c->csr);
  cudaFree(c->coo);
  for (int i = 0; i < c->nsaved; i++) cudaFree(c->saved[i].o), cudaFree(c->saved[i].stats);
  free(c->saved);
  free(c);
}

extern "C" evt_fb_ctx *evt_fb_ctx_new(char *err, size_t errlen) {
  evt_fb_ctx *c = (evt_fb_ctx *)calloc(1, sizeof *c);
  if (!c) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  if (fb_gemm_ctx_init(c, err, errlen)) {
    evt_fb_ctx_free(c);
    return NULL;
  }
  return c;
}

extern "C" long evt_fb_launches(const evt_fb_ctx *c) { return c ? c->launches : 0; }

extern "C" void *evt_fb_alloc(int64_t bytes, char *err, size_t errlen) {
  void *p = NULL;
  cudaError_t e = cudaMalloc(&p, (size_t)(bytes > 0 ? bytes : 1));
  if (e != cudaSuccess) {
    snprintf(err, errlen, "cudaMalloc(%lld): %s", (long long)bytes, cudaGetErrorString(e));
    return NULL;
  }
  return p;
}

extern "C" void evt_fb_free(void *p) {
  if (p) cudaFree(p);
}

extern "C" int evt_fb_upload(evt_fb_ctx *ctx, const evt_fb_tensor *t, const double *host, void *stream, char *err,
                             size_t errlen) {
  cudaStream_t s = (cudaStream_t)stream;
  if (ensure(&ctx->stage, &ctx->nstage, (size_t)(t->numel ? t->numel : 1), err, errlen)) return 2;
  CK(cudaMemcpyAsync(ctx->stage, host, sizeof(double) * (size_t)t->numel, cudaMemcpyHostToDevice, s));
  k_finish<<<blocks(t->numel), 256, 0, s>>>(t->ptr, t->dtype, ctx->stage, t->numel);
  CK(cudaGetLastError());
  CK(cudaStreamSynchronize(s)); /* the staging buffer is reused by the next upload */
  return 0;
}

extern "C" int evt_fb_download(evt_fb_ctx *ctx, const evt_fb_tensor *t, double *host, void *stream, char *err,
                               size_t errlen) {
  cudaStream_t s = (cudaStream_t)stream;
  if (ensure(&ctx->stage, &ctx->nstage, (size_t)(t->numel ? t->numel : 1), err, errlen)) return 2;
  k_to_double<<<blocks(t->numel), 256, 0, s>>>(ctx->stage, view(*t), t->numel);
  CK(cudaGetLastError());
  CK(cudaMemcpyAsync(host, ctx->stage, sizeof(double) * (size_t)t->numel, cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  return 0;
}

extern "C" int evt_fb_copy(void *dst, const void *src, int64_t bytes, void *stream, char *err, size_t errlen) {
  if (bytes > 0) CK(cudaMemcpyAsync(dst, src, (size_t)bytes, cudaMemcpyDeviceToDevice, (cudaStream_t)stream));
  return 0;
}

extern "C" int evt_fb_sync(void *stream, int *bad_node, char *err, size_t errlen) {
  CK(cudaStreamSynchronize((cudaStream_t)stream));
  int b = 0;
  if (fb_take_bad_node(&b, err, errlen)) return 2;
  *bad_node = b - 1;
  return 0;
}

/* ---- streams, CUDA graphs (capture a step enqueued on a stream, replay it), events ------------------------- */

extern "C" int evt_fb_stream_new(void **stream, char *err, size_t errlen) {
  cudaStream_t s = NULL;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  *stream = (void *)s;
  return 0;
}

extern "C" void evt_fb_stream_free(void *stream) {
  if (stream) cudaStreamDestroy((cudaStream_t)stream);
}

/* 1 when `stream` is being captured into a CUDA graph (or the query fails: treat as capturing), else 0. */
extern "C" int evt_fb_stream_capturing(void *stream) {
  cudaStreamCaptureStatus s = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing((cudaStream_t)stream, &s) != cudaSuccess) {
    (void)cudaGetLastError();
    return 1;
  }
  return s != cudaStreamCaptureStatusNone;
}

extern "C" int evt_fb_capture_begin(void *stream, char *err, size_t errlen) {
  /* relaxed: a generated launcher may cudaMalloc its workspace on first use while being captured */
  CK(cudaStreamBeginCapture((cudaStream_t)stream, cudaStreamCaptureModeRelaxed));
  return 0;
}

/* Ends the capture; instantiates the graph into *exec unless discard (a failed step: capture abandoned). */
extern "C" int evt_fb_capture_end(void *stream, int discard, void **exec, char *err, size_t errlen) {
  cudaGraph_t graph = NULL;
  *exec = NULL;
  cudaError_t e = cudaStreamEndCapture((cudaStream_t)stream, &graph);
  if (discard) {
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    return 0;
  }
  if (e != cudaSuccess) {
    if (graph) cudaGraphDestroy(graph);
    snprintf(err, errlen, "cudaStreamEndCapture: %s", cudaGetErrorString(e));
    return 2;
  }
  cudaGraphExec_t x = NULL;
  e = cudaGraphInstantiate(&x, graph, 0);
  cudaGraphDestroy(graph);
  if (e != cudaSuccess) {
    snprintf(err, errlen, "cudaGraphInstantiate: %s", cudaGetErrorString(e));
    return 2;
  }
  *exec = (void *)x;
  return 0;
}

extern "C" int evt_fb_graph_launch(void *exec, void *stream, char *err, size_t errlen) {
  CK(cudaGraphLaunch((cudaGraphExec_t)exec, (cudaStream_t)stream));
  return 0;
}

extern "C" void evt_fb_graph_free(void *exec) {
  if (exec) cudaGraphExecDestroy((cudaGraphExec_t)exec);
}

extern "C" int evt_fb_event_new(void **ev, char *err, size_t errlen) {
  cudaEvent_t e = NULL;
  CK(cudaEventCreate(&e));
  *ev = (void *)e;
  return 0;
}

extern "C" int evt_fb_event_record(void *ev, void *stream, char *err, size_t errlen) {
  CK(cudaEventRecord((cudaEvent_t)ev, (cudaStream_t)stream));
  return 0;
}

/* Waits for `to`; milliseconds between the two events. */
extern "C" int evt_fb_event_ms(void *from, void *to, double *ms, char *err, size_t errlen) {
  float f = 0;
  CK(cudaEventSynchronize((cudaEvent_t)to));
  CK(cudaEventElapsedTime(&f, (cudaEvent_t)from, (cudaEvent_t)to));
  *ms = f;
  return 0;
}

extern "C" void evt_fb_event_free(void *ev) {
  if (ev) cudaEventDestroy((cudaEvent_t)ev);
}
