/* Scaled-dot-product attention through cuDNN's fused flash-attention engines (see evt_cudnn_sdpa.h).
 *
 * How it works
 * cuDNN's flash-attention engines (runtime-compiled, Hopper and Ampere) are not called by name: they are
 * chosen by cuDNN's heuristics for an operation graph of a fixed shape, the one NVIDIA's cudnn-frontend
 * builds for its SDPA nodes ("composite" SDPA). This file builds that graph itself from backend
 * descriptors, one descriptor per tensor and per operation, then asks the heuristics (mode A, then B,
 * then FALLBACK) for engine configurations and keeps the first whose execution plan finalizes.
 *
 * Forward graph (training; tensors [b,h,sq,skv] and [b,h,sq,1] are f32 virtual unless said otherwise):
 *   S  = matmul(Q, K^T)          K^T: K's dims and strides with the last two swapped (no copy)
 *   S1 = S * scale               scale: f32 by-value [1,1,1,1]
 *   causal: row = gen_index(S1, axis 2), col = gen_index(S1, axis 3) (int32 outputs; f32 math in variant A,
 *           int32 in B), keep = row >= col (bool), S1 = binary_select(S1, -FLT_MAX by-value, keep)
 *   M = reduce_max(S1); E = exp(S1 - M); Z = reduce_add(E)
 *   Stats = M + log(Z)           Stats: f32 [b,h,sq,1] packed, non-virtual
 *   P = E / Z                    P: virtual in the io dtype (the second matmul's A operand must be)
 *   O = matmul(P, V)
 * Backward graph:
 *   sum = reduce_add(dO * O) * 1           softmax_sum f32 [b,h,sq,1] (variant A: non-virtual, ours)
 *   S1 = matmul(Q, K^T) * scale
 *   P = exp(S1 - Stats), causal select before the subtraction (variant B) or after it (variant A)
 *   dV = matmul(reshape(P) [b,h,skv,sq] io dtype, dO)
 *   dP = matmul(dO, V^T)         (variant B: dP * 1)
 *   dS = (dP - sum) * P * scale
 *   dK = matmul(reshape(dS) [b,h,skv,sq] io dtype, Q)
 *   dQacc = matmul(dS, reshape(K^T) = K)    dQacc: f32 [b,h,sq,d] packed, non-virtual (ours)
 *   dQ = identity(dQacc)
 * Two variants of each graph, tried in order: A is the frontend's current lowering (cuDNN >= 9.x), B the
 * lowering of frontend 1.5-era releases (causal mask with int32 index arithmetic before the stats
 * subtraction, virtual softmax_sum, F16x16-reordered dQacc).
 *
 * dQacc is zeroed by us (cudaMemsetAsync on the call's stream) for cuDNN < 9.6 and variant B; later
 * cuDNN versions clear it inside the plan. cuDNN <= 9.15.0 needs a padding-mask workaround in the
 * backward when skv % 128 != 0; it is not built here, so such shapes are reported unsupported. */
#include "evt_cudnn_sdpa.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

static void set_msg(char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void set_msg(char *buf, size_t n, const char *fmt, ...) {
  if (!buf || !n) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, n, fmt, ap);
  va_end(ap);
}

extern "C" void evt_cudnn_sdpa_set_strides(evt_cudnn_sdpa_desc *d, int bshd) {
  const int64_t s[4] = {d->sq, d->skv, d->skv, d->sq}, w[4] = {d->d, d->d, d->dv, d->dv};
  int64_t *st[4] = {d->q_stride, d->k_stride, d->v_stride, d->o_stride};
  for (int i = 0; i < 4; i++) {
    st[i][3] = 1;
    if (bshd) { /* [B,S,H,D] memory, viewed as [B,H,S,D] */
      st[i][1] = w[i];
      st[i][2] = d->h * w[i];
    } else {
      st[i][2] = w[i];
      st[i][1] = s[i] * w[i];
    }
    st[i][0] = d->h * s[i] * w[i];
  }
}

#ifndef EVT_HAVE_CUDNN

#define NO_CUDNN "built without cuDNN headers (rebuild libevt_fallback.so where cudnn_graph.h is found)"

extern "C" long evt_cudnn_sdpa_library(char *info, size_t n) {
  set_msg(info, n, NO_CUDNN);
  return 0;
}
extern "C" int evt_cudnn_sdpa_supported(const evt_cudnn_sdpa_desc *, char *why, size_t n) {
  set_msg(why, n, NO_CUDNN);
  return 0;
}
extern "C" int evt_cudnn_sdpa_fwd(void *, const evt_cudnn_sdpa_desc *, const void *, const void *, const void *, void *,
                                  float *, char *err, size_t n) {
  set_msg(err, n, NO_CUDNN);
  return -1;
}
extern "C" int evt_cudnn_sdpa_bwd(void *, const evt_cudnn_sdpa_desc *, const void *, const void *, const void *,
                                  const void *, const float *, const void *, void *, void *, void *, char *err,
                                  size_t n) {
  set_msg(err, n, NO_CUDNN);
  return -1;
}
extern "C" int evt_cudnn_sdpa_plan_info(const evt_cudnn_sdpa_desc *, char *info, size_t n) {
  set_msg(info, n, NO_CUDNN);
  return -1;
}
extern "C" void evt_cudnn_sdpa_release(void) {}

#else /* EVT_HAVE_CUDNN */

#include <dlfcn.h>
#include <float.h>

#include <cudnn_graph.h>

/* ---- the library, loaded with dlopen ------------------------------------------------------------- */

typedef struct cudnn_api {
  void *lib;
  long version;
  char path[512];
  decltype(&cudnnCreate) create;
  decltype(&cudnnDestroy) destroy;
  decltype(&cudnnSetStream) set_stream;
  decltype(&cudnnBackendCreateDescriptor) create_desc;
  decltype(&cudnnBackendDestroyDescriptor) destroy_desc;
  decltype(&cudnnBackendSetAttribute) set_attr;
  decltype(&cudnnBackendGetAttribute) get_attr;
  decltype(&cudnnBackendFinalize) finalize;
  decltype(&cudnnBackendExecute) execute;
  decltype(&cudnnGetErrorString) error_string;
  decltype(&cudnnGetLastErrorString) last_error; /* may be missing: then NULL */
  decltype(&cudnnGetVersion) get_version;
} cudnn_api;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static cudnn_api g_api;
static int g_load_tried;
static char g_load_error[1024];

/* cudnnGetLastErrorString on one line ("" if the library has none) */
static void last_error_text(char *buf, size_t n) {
  buf[0] = 0;
  if (!g_api.last_error) return;
  g_api.last_error(buf, n);
  buf[n - 1] = 0;
  for (char *c = buf; *c; c++)
    if (*c == '\n' || *c == '\r') *c = *(c + 1) ? '|' : ' ';
}

/* "STATUS_NAME (code): last error text" of a failed cuDNN call */
static void status_text(cudnnStatus_t st, char *buf, size_t n) {
  char last[512];
  last_error_text(last, sizeof last);
  const char *name = g_api.error_string ? g_api.error_string(st) : "?";
  if (last[0]) set_msg(buf, n, "%s (%d): %s", name, (int)st, last);
  else set_msg(buf, n, "%s (%d)", name, (int)st);
}

/* Under g_mu. 0 when loaded; the failure is remembered (the library is looked up once per process). */
static int load_library(char *err, size_t n) {
  if (g_api.lib) return 0;
  if (g_load_tried) {
    set_msg(err, n, "%s", g_load_error);
    return -1;
  }
  g_load_tried = 1;
  /* by soname: the loader's search path (in a PyTorch process, the cuDNN torch already loaded) */
  const char *names[2] = {"libcudnn.so.9", "libcudnn.so"};
  char tried[1024] = "";
  void *lib = NULL;
  for (int i = 0; i < 2 && !lib; i++) {
    lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char *e = dlerror();
      size_t used = strlen(tried);
      snprintf(tried + used, sizeof tried - used, "%s%s", used ? "; " : "", e ? e : names[i]);
    }
  }
  if (!lib) {
    set_msg(g_load_error, sizeof g_load_error, "cannot load cuDNN (libcudnn.so.9, libcudnn.so): %s",
            tried);
    set_msg(err, n, "%s", g_load_error);
    return -1;
  }
  cudnn_api a;
  memset(&a, 0, sizeof a);
  const char *missing = NULL;
#define SYM(field, name)                                                                                              \
  do {                                                                                                                \
    *(void **)&a.field = dlsym(lib, #name);                                                                           \
    if (!a.field && !missing) missing = #name;                                                                        \
  } while (0)
  SYM(create, cudnnCreate);
  SYM(destroy, cudnnDestroy);
  SYM(set_stream, cudnnSetStream);
  SYM(create_desc, cudnnBackendCreateDescriptor);
  SYM(destroy_desc, cudnnBackendDestroyDescriptor);
  SYM(set_attr, cudnnBackendSetAttribute);
  SYM(get_attr, cudnnBackendGetAttribute);
  SYM(finalize, cudnnBackendFinalize);
  SYM(execute, cudnnBackendExecute);
  SYM(error_string, cudnnGetErrorString);
  SYM(get_version, cudnnGetVersion);
#undef SYM
  *(void **)&a.last_error = dlsym(lib, "cudnnGetLastErrorString"); /* cuDNN >= 9.0 */
  Dl_info info;
  if (dladdr((void *)a.get_version, &info) && info.dli_fname) set_msg(a.path, sizeof a.path, "%s", info.dli_fname);
  if (missing) {
    set_msg(g_load_error, sizeof g_load_error, "cuDNN library %s lacks %s", a.path, missing);
    set_msg(err, n, "%s", g_load_error);
    dlclose(lib);
    return -1;
  }
  a.version = (long)a.get_version();
  if (a.version < 90000) {
    set_msg(g_load_error, sizeof g_load_error,
            "cuDNN %ld (%s) is older than 9.0: the v9 backend graph API is needed", a.version, a.path);
    set_msg(err, n, "%s", g_load_error);
    dlclose(lib);
    return -1;
  }
  a.lib = lib;
  g_api = a;
  return 0;
}

extern "C" long evt_cudnn_sdpa_library(char *info, size_t n) {
  pthread_mutex_lock(&g_mu);
  long v = 0;
  if (load_library(info, n) == 0) {
    v = g_api.version;
    set_msg(info, n, "cuDNN %ld.%ld.%ld (%s)", v / 10000, v / 100 % 100, v % 100, g_api.path);
  }
  pthread_mutex_unlock(&g_mu);
  return v;
}

/* ---- plans ------------------------------------------------------------------------------------------ */

/* Tensor ids in the variant pack; virtual tensors count up from UID_VIRTUAL. */
enum {
  UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_DO, UID_DQ, UID_DK, UID_DV,
  UID_SOFTMAX_SUM, UID_DQ_ACCUM, UID_SCALE, UID_ONE, UID_FILL,
  UID_VIRTUAL = 100
};
enum { VARIANT_A = 0, VARIANT_B = 1, VARIANT_COUNT };
enum { MAX_DESCS = 192, MAX_OPS = 48, MAX_DEVICES = 64 };

/* By number: the handle attributes are deprecated in 9.x (still honoured), so no deprecation warning fires;
 * the device-property ones appeared in 9.8 and the headers this compiles against may be older. */
static const cudnnBackendAttributeName_t ATTR_OPERATIONGRAPH_HANDLE = (cudnnBackendAttributeName_t)800;
static const cudnnBackendAttributeName_t ATTR_EXECUTION_PLAN_HANDLE = (cudnnBackendAttributeName_t)400;
static const cudnnBackendAttributeName_t ATTR_ENGINEHEUR_DEVICEPROP = (cudnnBackendAttributeName_t)204;
static const cudnnBackendAttributeName_t ATTR_EXECUTION_PLAN_DEVICEPROP = (cudnnBackendAttributeName_t)407;
static const cudnnBackendAttributeName_t ATTR_DEVICEPROP_HANDLE = (cudnnBackendAttributeName_t)2701;
static const cudnnBackendDescriptorType_t DEVICEPROP_DESCRIPTOR = (cudnnBackendDescriptorType_t)38;

typedef struct sdpa_plan {
  int built;     /* a build was attempted */
  int ok;        /* plan ready */
  char msg[1536]; /* why not ok */
  cudnnBackendDescriptor_t descs[MAX_DESCS]; /* everything of the graph, destroyed in reverse order */
  int ndescs;
  cudnnBackendDescriptor_t plan;
  int variant;
  int64_t engine, ws_bytes;
  void *mem;                 /* one cudaMalloc: workspace [| softmax_sum | dq_accum] */
  void *ws, *softmax_sum, *dq_accum;
  int64_t dq_accum_bytes;
  int softmax_sum_in_pack, zero_dq_accum;
} sdpa_plan;

typedef struct sdpa_entry {
  evt_cudnn_sdpa_desc key; /* scale ignored */
  int device;
  sdpa_plan fwd, bwd;
} sdpa_entry;

static sdpa_entry **g_entries;
static int g_nentries, g_capacity;
static cudnnHandle_t g_handles[MAX_DEVICES];

static int same_key(const evt_cudnn_sdpa_desc *a, const evt_cudnn_sdpa_desc *b) {
  if (a->b != b->b || a->h != b->h || a->sq != b->sq || a->skv != b->skv || a->d != b->d || a->dv != b->dv ||
      a->dtype != b->dtype || (a->causal != 0) != (b->causal != 0))
    return 0;
  for (int i = 0; i < 4; i++)
    if (a->q_stride[i] != b->q_stride[i] || a->k_stride[i] != b->k_stride[i] || a->v_stride[i] != b->v_stride[i] ||
        a->o_stride[i] != b->o_stride[i])
      return 0;
  return 1;
}

static void destroy_plan(sdpa_plan *p) {
  for (int i = p->ndescs - 1; i >= 0; i--)
    if (p->descs[i]) g_api.destroy_desc(p->descs[i]);
  p->ndescs = 0;
  p->plan = NULL;
  if (p->mem) cudaFree(p->mem);
  p->mem = p->ws = p->softmax_sum = p->dq_accum = NULL;
}

/* ---- graph builder: sticky errors, so the graph code reads as a straight list -------------------------- */

typedef struct builder {
  sdpa_plan *p;
  const char *graph; /* "forward" / "backward" */
  int variant;
  int failed;
  char err[1024];
  int64_t next_uid;
  cudnnBackendDescriptor_t ops[MAX_OPS];
  int nops;
} builder;

static void fail(builder *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(builder *g, const char *fmt, ...) {
  if (g->failed) return;
  g->failed = 1;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g->err, sizeof g->err, fmt, ap);
  va_end(ap);
}

static void fail_status(builder *g, cudnnStatus_t st, const char *what, const char *obj) {
  char s[640];
  status_text(st, s, sizeof s);
  fail(g, "%s graph %c: %s: %s: %s", g->graph, 'A' + g->variant, obj, what, s);
}

static cudnnBackendDescriptor_t new_desc(builder *g, cudnnBackendDescriptorType_t type, const char *obj) {
  if (g->failed) return NULL;
  if (g->p->ndescs == MAX_DESCS) {
    fail(g, "%s graph: more than %d descriptors", g->graph, MAX_DESCS);
    return NULL;
  }
  cudnnBackendDescriptor_t d = NULL;
  cudnnStatus_t st = g_api.create_desc(type, &d);
  if (st != CUDNN_STATUS_SUCCESS) {
    fail_status(g, st, "cudnnBackendCreateDescriptor", obj);
    return NULL;
  }
  g->p->descs[g->p->ndescs++] = d;
  return d;
}

static void set_attr(builder *g, cudnnBackendDescriptor_t d, const char *obj, cudnnBackendAttributeName_t attr,
                     const char *attr_name, cudnnBackendAttributeType_t type, int64_t count, const void *value) {
  if (g->failed) return;
  cudnnStatus_t st = g_api.set_attr(d, attr, type, count, value);
  if (st != CUDNN_STATUS_SUCCESS) {
    char what[160];
    snprintf(what, sizeof what, "cudnnBackendSetAttribute(%s)", attr_name);
    fail_status(g, st, what, obj);
  }
}
#define SET(g, d, obj, attr, type, count, value) set_attr(g, d, obj, attr, #attr, type, count, value)

static void finalize(builder *g, cudnnBackendDescriptor_t d, const char *obj) {
  if (g->failed) return;
  cudnnStatus_t st = g_api.finalize(d);
  if (st != CUDNN_STATUS_SUCCESS) fail_status(g, st, "cudnnBackendFinalize", obj);
}

static void add_op(builder *g, cudnnBackendDescriptor_t op) {
  if (g->failed) return;
  if (g->nops == MAX_OPS) return fail(g, "%s graph: more than %d operations", g->graph, MAX_OPS);
  g->ops[g->nops++] = op;
}

enum { T_VIRTUAL = 1, T_BY_VALUE = 2, T_F16x16 = 4 };

static cudnnBackendDescriptor_t tensor(builder *g, const char *name, int64_t uid, cudnnDataType_t type,
                                       const int64_t dim[4], const int64_t stride[4], int flags) {
  if (g->failed) return NULL;
  if (!uid) uid = g->next_uid++;
  char obj[96];
  snprintf(obj, sizeof obj, "tensor %s (uid %lld)", name, (long long)uid);
  cudnnBackendDescriptor_t t = new_desc(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR, obj);
  int64_t alignment = 16;
  bool is_virtual = (flags & T_VIRTUAL) != 0, by_value = (flags & T_BY_VALUE) != 0;
  SET(g, t, obj, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
  SET(g, t, obj, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim);
  SET(g, t, obj, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, stride);
  SET(g, t, obj, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
  SET(g, t, obj, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
  SET(g, t, obj, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
  if (by_value) SET(g, t, obj, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
  if (flags & T_F16x16) {
    cudnnBackendTensorReordering_t r = CUDNN_TENSOR_REORDERING_F16x16;
    SET(g, t, obj, CUDNN_ATTR_TENSOR_REORDERING_MODE, CUDNN_TYPE_TENSOR_REORDERING_MODE, 1, &r);
  }
  finalize(g, t, obj);
  return g->failed ? NULL : t;
}

/* y = mode(x [, b [, t]]); axis >= 0 only for GEN_INDEX */
static void pointwise(builder *g, const char *name, cudnnPointwiseMode_t mode, cudnnDataType_t precision, int64_t axis,
                      cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t t,
                      cudnnBackendDescriptor_t y) {
  char obj[96];
  snprintf(obj, sizeof obj, "pointwise %s", name);
  cudnnBackendDescriptor_t pw = new_desc(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, obj);
  SET(g, pw, obj, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
  SET(g, pw, obj, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &precision);
  if (axis >= 0) SET(g, pw, obj, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
  finalize(g, pw, obj);
  cudnnBackendDescriptor_t op = new_desc(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, obj);
  SET(g, op, obj, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw);
  SET(g, op, obj, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
  if (b) SET(g, op, obj, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
  if (t) SET(g, op, obj, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t);
  SET(g, op, obj, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
  finalize(g, op, obj);
  add_op(g, op);
}

static void reduction(builder *g, const char *name, cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x,
                      cudnnBackendDescriptor_t y) {
  char obj[96];
  snprintf(obj, sizeof obj, "reduction %s", name);
  cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  cudnnBackendDescriptor_t r = new_desc(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, obj);
  SET(g, r, obj, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode);
  SET(g, r, obj, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32);
  finalize(g, r, obj);
  cudnnBackendDescriptor_t op = new_desc(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, obj);
  SET(g, op, obj, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
  SET(g, op, obj, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
  SET(g, op, obj, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &r);
  finalize(g, op, obj);
  add_op(g, op);
}

static void matmul(builder *g, const char *name, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                   cudnnBackendDescriptor_t c) {
  char obj[96];
  snprintf(obj, sizeof obj, "matmul %s", name);
  cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  cudnnBackendDescriptor_t mm = new_desc(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR, obj);
  SET(g, mm, obj, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32);
  finalize(g, mm, obj);
  cudnnBackendDescriptor_t op = new_desc(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, obj);
  SET(g, op, obj, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a);
  SET(g, op, obj, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
  SET(g, op, obj, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c);
  SET(g, op, obj, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm);
  finalize(g, op, obj);
  add_op(g, op);
}

static void reshape(builder *g, const char *name, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
  char obj[96];
  snprintf(obj, sizeof obj, "reshape %s", name);
  cudnnBackendDescriptor_t op = new_desc(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, obj);
  SET(g, op, obj, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
  SET(g, op, obj, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
  finalize(g, op, obj);
  add_op(g, op);
}

/* ---- the two graphs ----------------------------------------------------------------------------------- */

typedef struct shapes {
  cudnnDataType_t io;
  int64_t q[4], kt[4], kt_stride[4], vt[4], vt_stride[4], k[4], v[4], o[4];
  int64_t s[4], s_stride[4], st[4], st_stride[4], row[4], row_stride[4], one[4];
  int64_t dq_accum_stride[4];
} shapes;

static void make_shapes(const evt_cudnn_sdpa_desc *d, shapes *s) {
  const int64_t B = d->b, H = d->h, Sq = d->sq, Skv = d->skv, D = d->d, Dv = d->dv;
  s->io = d->dtype == EVT_CUDNN_SDPA_F16 ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16;
  const int64_t q[4] = {B, H, Sq, D}, k[4] = {B, H, Skv, D}, v[4] = {B, H, Skv, Dv}, o[4] = {B, H, Sq, Dv};
  memcpy(s->q, q, sizeof q);
  memcpy(s->k, k, sizeof k);
  memcpy(s->v, v, sizeof v);
  memcpy(s->o, o, sizeof o);
  const int64_t kt[4] = {B, H, D, Skv}, vt[4] = {B, H, Dv, Skv};
  memcpy(s->kt, kt, sizeof kt);
  memcpy(s->vt, vt, sizeof vt);
  const int64_t kts[4] = {d->k_stride[0], d->k_stride[1], d->k_stride[3], d->k_stride[2]};
  const int64_t vts[4] = {d->v_stride[0], d->v_stride[1], d->v_stride[3], d->v_stride[2]};
  memcpy(s->kt_stride, kts, sizeof kts);
  memcpy(s->vt_stride, vts, sizeof vts);
  const int64_t sd[4] = {B, H, Sq, Skv}, ss[4] = {H * Sq * Skv, Sq * Skv, Skv, 1};
  memcpy(s->s, sd, sizeof sd);
  memcpy(s->s_stride, ss, sizeof ss);
  const int64_t st[4] = {B, H, Skv, Sq}, sts[4] = {H * Sq * Skv, Sq * Skv, 1, Skv}; /* S^T: a view of S */
  memcpy(s->st, st, sizeof st);
  memcpy(s->st_stride, sts, sizeof sts);
  const int64_t rd[4] = {B, H, Sq, 1}, rs[4] = {H * Sq, Sq, 1, 1};
  memcpy(s->row, rd, sizeof rd);
  memcpy(s->row_stride, rs, sizeof rs);
  for (int i = 0; i < 4; i++) s->one[i] = 1;
  const int64_t dqs[4] = {H * Sq * D, Sq * D, D, 1};
  memcpy(s->dq_accum_stride, dqs, sizeof dqs);
}

/* binary_select(x, -FLT_MAX, row >= col): the top-left causal mask */
static cudnnBackendDescriptor_t causal_mask(builder *g, const shapes *s, cudnnBackendDescriptor_t x) {
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT, i32 = CUDNN_DATA_INT32, b8 = CUDNN_DATA_BOOLEAN;
  const cudnnDataType_t index_precision = g->variant == VARIANT_A ? f32 : i32;
  cudnnBackendDescriptor_t fill = tensor(g, "mask_value", UID_FILL, f32, s->one, s->one, T_BY_VALUE);
  cudnnBackendDescriptor_t row = tensor(g, "row_index", 0, i32, s->s, s->s_stride, T_VIRTUAL);
  pointwise(g, "gen_index(axis 2)", CUDNN_POINTWISE_GEN_INDEX, index_precision, 2, x, NULL, NULL, row);
  cudnnBackendDescriptor_t col = tensor(g, "col_index", 0, i32, s->s, s->s_stride, T_VIRTUAL);
  pointwise(g, "gen_index(axis 3)", CUDNN_POINTWISE_GEN_INDEX, index_precision, 3, x, NULL, NULL, col);
  cudnnBackendDescriptor_t keep = tensor(g, "row>=col", 0, b8, s->s, s->s_stride, T_VIRTUAL);
  pointwise(g, "cmp_ge(row, col)", CUDNN_POINTWISE_CMP_GE, b8, -1, row, col, NULL, keep);
  cudnnBackendDescriptor_t y = tensor(g, "S_masked", 0, f32, s->s, s->s_stride, T_VIRTUAL);
  pointwise(g, "binary_select(causal)", CUDNN_POINTWISE_BINARY_SELECT, f32, -1, x, fill, keep, y);
  return y;
}

static void build_forward(builder *g, const evt_cudnn_sdpa_desc *d, const shapes *s) {
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT, io = s->io;
  cudnnBackendDescriptor_t Q = tensor(g, "Q", UID_Q, io, s->q, d->q_stride, 0);
  cudnnBackendDescriptor_t KT = tensor(g, "K^T", UID_K, io, s->kt, s->kt_stride, 0);
  cudnnBackendDescriptor_t V = tensor(g, "V", UID_V, io, s->v, d->v_stride, 0);
  cudnnBackendDescriptor_t O = tensor(g, "O", UID_O, io, s->o, d->o_stride, 0);
  cudnnBackendDescriptor_t stats = tensor(g, "Stats", UID_STATS, f32, s->row, s->row_stride, 0);
  cudnnBackendDescriptor_t scale = tensor(g, "attn_scale", UID_SCALE, f32, s->one, s->one, T_BY_VALUE);

  cudnnBackendDescriptor_t S = tensor(g, "S", 0, f32, s->s, s->s_stride, T_VIRTUAL);
  matmul(g, "Q@K^T", Q, KT, S);
  cudnnBackendDescriptor_t S1 = tensor(g, "S*scale", 0, f32, s->s, s->s_stride, T_VIRTUAL);
  pointwise(g, "mul(S, scale)", CUDNN_POINTWISE_MUL, f32, -1, S, scale, NULL, S1);
  cudnnBackendDescriptor_t last = d->causal ? causal_mask(g, s, S1) : S1;

  cudnnBackendDescriptor_t M = tensor(g, "max", 0, f32, s->row, s->row_stride, T_VIRTUAL);
  reduction(g, "max", CUDNN_REDUCE_TENSOR_MAX, last, M);
  cudnnBackendDescriptor_t Z = tensor(g, "S-max", 0, f32, s->s, s->s_stride, T_VIRTUAL);
  pointwise(g, "sub(S, max)", CUDNN_POINTWISE_SUB, f32, -1, last, M, NULL, Z);
  cudnnBackendDescriptor_t E = tensor(g, "exp", 0, f32, s->s, s->s_stride, T_VIRTUAL);
  pointwise(g, "exp", CUDNN_POINTWISE_EXP, f32, -1, Z, NULL, NULL, E);
  cudnnBackendDescriptor_t sum = tensor(g, "sum_exp", 0, f32, s->row, s->row_stride, T_VIRTUAL);
  reduction(g, "sum", CUDNN_REDUCE_TENSOR_ADD, E, sum);
  cudnnBackendDescriptor_t logsum = tensor(g, "log_sum", 0, f32, s->row, s->row_stride, T_VIRTUAL);
  pointwise(g, "log", CUDNN_POINTWISE_LOG, f32, -1, sum, NULL, NULL, logsum);
  pointwise(g, "add(max, log_sum)", CUDNN_POINTWISE_ADD, f32, -1, M, logsum, NULL, stats);
  cudnnBackendDescriptor_t P = tensor(g, "P", 0, io, s->s, s->s_stride, T_VIRTUAL);
  pointwise(g, "div(exp, sum)", CUDNN_POINTWISE_DIV, f32, -1, E, sum, NULL, P);
  matmul(g, "P@V", P, V, O);
}

static void build_backward(builder *g, const evt_cudnn_sdpa_desc *d, const shapes *s) {
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT, io = s->io;
  const int A = g->variant == VARIANT_A;
  cudnnBackendDescriptor_t Q = tensor(g, "Q", UID_Q, io, s->q, d->q_stride, 0);
  cudnnBackendDescriptor_t KT = tensor(g, "K^T", UID_K, io, s->kt, s->kt_stride, 0);
  cudnnBackendDescriptor_t VT = tensor(g, "V^T", UID_V, io, s->vt, s->vt_stride, 0);
  cudnnBackendDescriptor_t O = tensor(g, "O", UID_O, io, s->o, d->o_stride, 0);
  cudnnBackendDescriptor_t stats = tensor(g, "Stats", UID_STATS, f32, s->row, s->row_stride, 0);
  cudnnBackendDescriptor_t dO = tensor(g, "dO", UID_DO, io, s->o, d->o_stride, 0);
  cudnnBackendDescriptor_t dQ = tensor(g, "dQ", UID_DQ, io, s->q, d->q_stride, 0);
  cudnnBackendDescriptor_t dK = tensor(g, "dK", UID_DK, io, s->k, d->k_stride, 0);
  cudnnBackendDescriptor_t dV = tensor(g, "dV", UID_DV, io, s->v, d->v_stride, 0);
  cudnnBackendDescriptor_t scale = tensor(g, "attn_scale", UID_SCALE, f32, s->one, s->one, T_BY_VALUE);
  cudnnBackendDescriptor_t one = tensor(g, "one", UID_ONE, f32, s->one, s->one, T_BY_VALUE);

  /* softmax_sum = rowsum(dO * O) */
  const int64_t H = d->h, Sq = d->sq, Dv = d->dv;
  const int64_t do_o_stride[4] = {H * Sq * Dv, Sq * Dv, H * Dv, 1}; /* virtual: as the frontend writes it */
  cudnnBackendDescriptor_t dOO = tensor(g, "dO*O", 0, f32, s->o, do_o_stride, T_VIRTUAL);
  pointwise(g, "mul(dO, O)", CUDNN_POINTWISE_MUL, f32, -1, dO, O, NULL, dOO);
  cudnnBackendDescriptor_t rowsum = tensor(g, "rowsum(dO*O)", 0, f32, s->row, s->row_stride, T_VIRTUAL);
  reduction(g, "sum(dO*O)", CUDNN_REDUCE_TENSOR_ADD, dOO, rowsum);
  cudnnBackendDescriptor_t softmax_sum =
      tensor(g, "softmax_sum", A ? UID_SOFTMAX_SUM : 0, f32, s->row, s->row_stride, A ? 0 : T_VIRTUAL);
  pointwise(g, "mul(rowsum, 1)", CUDNN_POINTWISE_MUL, f32, -1, rowsum, one, NULL, softmax_sum);

  /* P = exp(Q K^T * scale - Stats), masked */
  cudnnBackendDescriptor_t S = tensor(g, "S", 0, f32, s->s, s->s_stride, T_VIRTUAL);
  matmul(g, "Q@K^T", Q, KT, S);
  cudnnBackendDescriptor_t last = tensor(g, "S*scale", 0, f32, s->s, s->s_stride, T_VIRTUAL);
  pointwise(g, "mul(S, scale)", CUDNN_POINTWISE_MUL, f32, -1, S, scale, NULL, last);
  if (d->causal && !A) last = causal_mask(g, s, last);
  cudnnBackendDescriptor_t Z = tensor(g, "S-Stats", 0, f32, s->s, s->s_stride, T_VIRTUAL);
  pointwise(g, "sub(S, Stats)", CUDNN_POINTWISE_SUB, f32, -1, last, stats, NULL, Z);
  last = Z;
  if (d->causal && A) last = causal_mask(g, s, last);
  cudnnBackendDescriptor_t P = tensor(g, "P", 0, f32, s->s, s->s_stride, T_VIRTUAL);
  pointwise(g, "exp", CUDNN_POINTWISE_EXP, f32, -1, last, NULL, NULL, P);

  /* dV = P^T dO */
  cudnnBackendDescriptor_t PT = tensor(g, "P^T", 0, io, s->st, s->st_stride, T_VIRTUAL);
  reshape(g, "P->P^T", P, PT);
  matmul(g, "P^T@dO", PT, dO, dV);

  /* dS = (dO V^T - softmax_sum) * P * scale */
  cudnnBackendDescriptor_t dP = tensor(g, "dP", 0, f32, s->s, s->s_stride, T_VIRTUAL);
  matmul(g, "dO@V^T", dO, VT, dP);
  if (!A) {
    cudnnBackendDescriptor_t dP1 = tensor(g, "dP*1", 0, f32, s->s, s->s_stride, T_VIRTUAL);
    pointwise(g, "mul(dP, 1)", CUDNN_POINTWISE_MUL, f32, -1, dP, one, NULL, dP1);
    dP = dP1;
  }
  cudnnBackendDescriptor_t dP2 = tensor(g, "dP-sum", 0, f32, s->s, s->s_stride, T_VIRTUAL);
  pointwise(g, "sub(dP, softmax_sum)", CUDNN_POINTWISE_SUB, f32, -1, dP, softmax_sum, NULL, dP2);
  cudnnBackendDescriptor_t dP3 = tensor(g, "(dP-sum)*P", 0, f32, s->s, s->s_stride, T_VIRTUAL);
  pointwise(g, "mul(dP-sum, P)", CUDNN_POINTWISE_MUL, f32, -1, dP2, P, NULL, dP3);
  cudnnBackendDescriptor_t dS = tensor(g, "dS", 0, f32, s->s, s->s_stride, T_VIRTUAL);
  pointwise(g, "mul(dS, scale)", CUDNN_POINTWISE_MUL, f32, -1, dP3, scale, NULL, dS);

  /* dK = dS^T Q */
  cudnnBackendDescriptor_t dST = tensor(g, "dS^T", 0, io, s->st, s->st_stride, T_VIRTUAL);
  reshape(g, "dS->dS^T", dS, dST);
  matmul(g, "dS^T@Q", dST, Q, dK);

  /* dQ = dS K, accumulated in f32 */
  cudnnBackendDescriptor_t K = tensor(g, "K", 0, f32, s->k, d->k_stride, T_VIRTUAL);
  reshape(g, "K^T->K", KT, K);
  cudnnBackendDescriptor_t dq_accum =
      tensor(g, "dQ_accum", UID_DQ_ACCUM, f32, s->q, s->dq_accum_stride, A ? 0 : T_F16x16);
  matmul(g, "dS@K", dS, K, dq_accum);
  pointwise(g, "identity(dQ_accum)", CUDNN_POINTWISE_IDENTITY, f32, -1, dq_accum, NULL, NULL, dQ);
}

/* ---- engine choice ------------------------------------------------------------------------------------ */

/* The operation graph, then heuristics A, B, FALLBACK: the first engine config whose plan finalizes. */
static void choose_engine(builder *g, cudnnHandle_t handle) {
  if (g->failed) return;
  char obj[64];
  snprintf(obj, sizeof obj, "operation graph (%d ops)", g->nops);
  cudnnBackendDescriptor_t og = new_desc(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, obj);
  if (g->failed) return;
  /* The graph's handle tells the heuristics and the plan the device. Should a later 9.x drop the deprecated
   * attribute, a device-property descriptor (cuDNN >= 9.8) carries the handle to them instead. */
  cudnnBackendDescriptor_t devprop = NULL;
  if (g_api.set_attr(og, ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle) != CUDNN_STATUS_SUCCESS) {
    devprop = new_desc(g, DEVICEPROP_DESCRIPTOR, "device properties");
    SET(g, devprop, "device properties", ATTR_DEVICEPROP_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    finalize(g, devprop, "device properties");
  }
  SET(g, og, obj, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g->nops, g->ops);
  finalize(g, og, obj);
  if (g->failed) return;

  const cudnnBackendHeurMode_t modes[3] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_B, CUDNN_HEUR_MODE_FALLBACK};
  const char *mode_names[3] = {"A", "B", "FALLBACK"};
  char tried[900] = "";
  for (int m = 0; m < 3; m++) {
    size_t used = strlen(tried);
    char *out = tried + used;
    size_t room = sizeof tried - used;
    cudnnBackendDescriptor_t heur = NULL;
    cudnnStatus_t st = g_api.create_desc(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur);
    if (st == CUDNN_STATUS_SUCCESS) st = g_api.set_attr(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
                                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &og);
    if (st == CUDNN_STATUS_SUCCESS)
      st = g_api.set_attr(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &modes[m]);
    if (st == CUDNN_STATUS_SUCCESS && devprop)
      st = g_api.set_attr(heur, ATTR_ENGINEHEUR_DEVICEPROP, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &devprop);
    if (st == CUDNN_STATUS_SUCCESS) st = g_api.finalize(heur);
    int64_t count = 0;
    if (st == CUDNN_STATUS_SUCCESS)
      st = g_api.get_attr(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, NULL);
    if (st != CUDNN_STATUS_SUCCESS) {
      char s[512];
      status_text(st, s, sizeof s);
      snprintf(out, room, "%sheuristics %s: %s", used ? "; " : "", mode_names[m], s);
      if (heur) g_api.destroy_desc(heur);
      continue;
    }
    if (count > 64) count = 64;
    cudnnBackendDescriptor_t cfgs[64];
    int64_t ncfg = 0;
    for (int64_t i = 0; i < count && st == CUDNN_STATUS_SUCCESS; i++) {
      st = g_api.create_desc(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfgs[i]);
      if (st == CUDNN_STATUS_SUCCESS) ncfg = i + 1;
    }
    int64_t got = 0;
    if (st == CUDNN_STATUS_SUCCESS && ncfg > 0)
      st = g_api.get_attr(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, ncfg, &got, cfgs);
    if (got > ncfg) got = ncfg;
    char last[512] = "";
    if (st != CUDNN_STATUS_SUCCESS) status_text(st, last, sizeof last);
    else if (got == 0) last_error_text(last, sizeof last); /* why the support checks dropped every config */
    int chosen = -1;
    for (int64_t i = 0; i < got && chosen < 0; i++) {
      cudnnBackendDescriptor_t plan = NULL;
      cudnnStatus_t ps = g_api.create_desc(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan);
      if (ps == CUDNN_STATUS_SUCCESS)
        ps = devprop ? g_api.set_attr(plan, ATTR_EXECUTION_PLAN_DEVICEPROP, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &devprop)
                     : g_api.set_attr(plan, ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
      if (ps == CUDNN_STATUS_SUCCESS)
        ps = g_api.set_attr(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfgs[i]);
      if (ps == CUDNN_STATUS_SUCCESS) ps = g_api.finalize(plan);
      int64_t ws = 0, n = 0;
      if (ps == CUDNN_STATUS_SUCCESS)
        ps = g_api.get_attr(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &ws);
      if (ps != CUDNN_STATUS_SUCCESS) {
        status_text(ps, last, sizeof last);
        if (plan) g_api.destroy_desc(plan);
        continue;
      }
      sdpa_plan *p = g->p;
      if (p->ndescs + 2 > MAX_DESCS) { /* cannot happen: the graphs use < 100 */
        g_api.destroy_desc(plan);
        fail(g, "%s graph: descriptor table full", g->graph);
        break;
      }
      chosen = (int)i;
      /* the engine's global index, for evt_cudnn_sdpa_plan_info */
      int64_t engine = -1;
      cudnnBackendDescriptor_t eng = NULL;
      if (g_api.create_desc(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &eng) == CUDNN_STATUS_SUCCESS) {
        if (g_api.get_attr(cfgs[i], CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &eng) ==
            CUDNN_STATUS_SUCCESS)
          g_api.get_attr(eng, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &engine);
        g_api.destroy_desc(eng);
      }
      p->descs[p->ndescs++] = cfgs[i]; /* the plan's engine config stays alive with it */
      p->descs[p->ndescs++] = plan;
      p->plan = plan;
      p->engine = engine;
      p->ws_bytes = ws;
    }
    for (int64_t i = 0; i < ncfg; i++)
      if (i != chosen) g_api.destroy_desc(cfgs[i]);
    g_api.destroy_desc(heur);
    if (chosen >= 0 || g->failed) return;
    snprintf(out, room, "%sheuristics %s: %lld configs, none finalized%s%s", used ? "; " : "", mode_names[m],
             (long long)got, last[0] ? ", last: " : "", last);
  }
  fail(g, "%s graph %c: no engine (%s)", g->graph, 'A' + g->variant, tried);
}

static size_t align_up(size_t x) { return (x + 255) & ~(size_t)255; }

/* Builds one direction of entry e (the current device is e->device): graph variants in order, then the
 * device memory. Under g_mu. */
static void build_plan(sdpa_entry *e, int backward, cudnnHandle_t handle) {
  sdpa_plan *p = backward ? &e->bwd : &e->fwd;
  const evt_cudnn_sdpa_desc *d = &e->key;
  p->built = 1;
  shapes s;
  make_shapes(d, &s);
  char reasons[1536] = "";
  for (int v = VARIANT_A; v < VARIANT_COUNT; v++) {
    builder g;
    memset(&g, 0, sizeof g);
    g.p = p;
    g.graph = backward ? "backward" : "forward";
    g.variant = v;
    g.next_uid = UID_VIRTUAL;
    if (backward) build_backward(&g, d, &s);
    else build_forward(&g, d, &s);
    choose_engine(&g, handle);
    if (!g.failed) {
      p->variant = v;
      p->softmax_sum_in_pack = backward && v == VARIANT_A;
      p->zero_dq_accum = backward && (v == VARIANT_B || g_api.version < 90600);
      break;
    }
    size_t used = strlen(reasons);
    snprintf(reasons + used, sizeof reasons - used, "%s%s", used ? "; " : "", g.err);
    destroy_plan(p);
  }
  if (!p->plan) {
    set_msg(p->msg, sizeof p->msg, "%s", reasons);
    return;
  }
  size_t ws = align_up((size_t)p->ws_bytes), sum = 0, acc = 0;
  if (backward) {
    sum = align_up((size_t)(d->b * d->h * d->sq) * sizeof(float));
    acc = (size_t)(d->b * d->h * d->sq * d->d) * sizeof(float);
  }
  if (ws + sum + acc > 0) {
    cudaError_t ce = cudaMalloc(&p->mem, ws + sum + acc);
    if (ce != cudaSuccess) {
      cudaGetLastError();
      set_msg(p->msg, sizeof p->msg, "%s: cudaMalloc of %zu bytes (workspace %zu + softmax_sum %zu + dQ_accum %zu): %s",
              backward ? "backward" : "forward", ws + sum + acc, ws, sum, acc, cudaGetErrorString(ce));
      p->mem = NULL;
      destroy_plan(p);
      return;
    }
  }
  p->ws = p->ws_bytes > 0 ? p->mem : NULL;
  if (backward) {
    p->softmax_sum = (char *)p->mem + ws;
    p->dq_accum = (char *)p->mem + ws + sum;
    p->dq_accum_bytes = (int64_t)acc;
  }
  p->ok = 1;
}

/* ---- descriptor checks, entries ------------------------------------------------------------------------ */

static int check_desc(const evt_cudnn_sdpa_desc *d, char *why, size_t n) {
  if (!d) return set_msg(why, n, "no descriptor"), -1;
  if (d->b <= 0 || d->h <= 0 || d->sq <= 0 || d->skv <= 0 || d->d <= 0 || d->dv <= 0)
    return set_msg(why, n, "sizes must be positive (b %lld h %lld sq %lld skv %lld d %lld dv %lld)", (long long)d->b,
                   (long long)d->h, (long long)d->sq, (long long)d->skv, (long long)d->d, (long long)d->dv),
           -1;
  if (d->dtype != EVT_CUDNN_SDPA_BF16 && d->dtype != EVT_CUDNN_SDPA_F16)
    return set_msg(why, n, "element type %d: only bf16 (0) and f16 (1)", d->dtype), -1;
  if (d->d % 8 || d->dv % 8 || d->d > 256 || d->dv > 256)
    return set_msg(why, n, "head sizes d %lld, dv %lld: need multiples of 8, at most 256", (long long)d->d,
                   (long long)d->dv),
           -1;
  const int64_t *st[4] = {d->q_stride, d->k_stride, d->v_stride, d->o_stride};
  const char *names[4] = {"q", "k", "v", "out"};
  for (int i = 0; i < 4; i++) {
    if (st[i][3] != 1)
      return set_msg(why, n, "%s: the last stride must be 1 (is %lld)", names[i], (long long)st[i][3]), -1;
    for (int j = 0; j < 3; j++)
      if (st[i][j] <= 0 || st[i][j] % 8)
        return set_msg(why, n, "%s: stride %d is %lld: must be a positive multiple of 8 elements (16 bytes)", names[i],
                       j, (long long)st[i][j]),
               -1;
  }
  if (!(d->scale == d->scale) || isinf(d->scale)) return set_msg(why, n, "scale is not finite"), -1;
  return 0;
}

static int get_handle(int device, cudnnHandle_t *h, char *err, size_t n) {
  if (device < 0 || device >= MAX_DEVICES) return set_msg(err, n, "device %d: too many devices", device), -1;
  if (!g_handles[device]) {
    cudnnStatus_t st = g_api.create(&g_handles[device]);
    if (st != CUDNN_STATUS_SUCCESS) {
      char s[512];
      status_text(st, s, sizeof s);
      g_handles[device] = NULL;
      return set_msg(err, n, "cudnnCreate on device %d: %s", device, s), -1;
    }
  }
  *h = g_handles[device];
  return 0;
}

/* Reasons a direction is not tried at all on this library / device ("" if none). */
static void known_unsupported(const evt_cudnn_sdpa_desc *d, int backward, int sm, char *why, size_t n) {
  why[0] = 0;
  long v = g_api.version;
  if (sm < 80) set_msg(why, n, "sm_%d: cuDNN's flash attention needs sm_80 or newer", sm);
  else if (sm / 10 != 9 && (d->d > 128 || d->dv > 128))
    set_msg(why, n, "head sizes above 128 need Hopper (sm_9x) here; device is sm_%d", sm);
  else if (v == 91000 || v == 91001) set_msg(why, n, "cuDNN 9.10.0 / 9.10.1 have known SDPA bugs (use >= 9.10.2)");
  else if (backward && v <= 91500 && d->skv % 128)
    set_msg(why, n,
            "cuDNN %ld <= 9.15.0 needs a padding-mask workaround in the backward when skv %% 128 != 0 (skv %lld); "
            "not built here",
            v, (long long)d->skv);
}

/* The entry of d on the current device, built (both directions) if new. Under g_mu. NULL + err when the
 * library, the device or the handle fail (nothing cached then, except the library failure). */
static sdpa_entry *get_entry(const evt_cudnn_sdpa_desc *d, int may_build, char *err, size_t n) {
  if (load_library(err, n)) return NULL;
  int dev = 0;
  cudaError_t ce = cudaGetDevice(&dev);
  if (ce != cudaSuccess) {
    cudaGetLastError();
    return set_msg(err, n, "cudaGetDevice: %s", cudaGetErrorString(ce)), (sdpa_entry *)NULL;
  }
  for (int i = 0; i < g_nentries; i++)
    if (g_entries[i]->device == dev && same_key(&g_entries[i]->key, d)) return g_entries[i];
  if (!may_build)
    return set_msg(err, n, "not prepared: call evt_cudnn_sdpa_supported() for this shape before a CUDA-graph capture"),
           (sdpa_entry *)NULL;
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
    cudaGetLastError();
    return set_msg(err, n, "cannot query device %d", dev), (sdpa_entry *)NULL;
  }
  cudnnHandle_t handle;
  if (get_handle(dev, &handle, err, n)) return NULL;
  if (g_nentries == g_capacity) {
    int cap = g_capacity ? 2 * g_capacity : 16;
    sdpa_entry **grown = (sdpa_entry **)realloc(g_entries, sizeof *grown * (size_t)cap);
    if (!grown) return set_msg(err, n, "out of memory"), (sdpa_entry *)NULL;
    g_entries = grown;
    g_capacity = cap;
  }
  sdpa_entry *e = (sdpa_entry *)calloc(1, sizeof *e);
  if (!e) return set_msg(err, n, "out of memory"), (sdpa_entry *)NULL;
  e->key = *d;
  e->key.scale = 0;
  e->device = dev;
  const int sm = major * 10 + minor;
  for (int backward = 0; backward < 2; backward++) {
    sdpa_plan *p = backward ? &e->bwd : &e->fwd;
    known_unsupported(d, backward, sm, p->msg, sizeof p->msg);
    if (p->msg[0]) {
      p->built = 1;
      continue;
    }
    build_plan(e, backward, handle);
  }
  g_entries[g_nentries++] = e;
  return e;
}

static void describe(const evt_cudnn_sdpa_desc *d, char *buf, size_t n) {
  set_msg(buf, n, "b %lld h %lld sq %lld skv %lld d %lld dv %lld %s%s", (long long)d->b, (long long)d->h,
          (long long)d->sq, (long long)d->skv, (long long)d->d, (long long)d->dv,
          d->dtype == EVT_CUDNN_SDPA_F16 ? "f16" : "bf16", d->causal ? " causal" : "");
}

extern "C" int evt_cudnn_sdpa_supported(const evt_cudnn_sdpa_desc *d, char *why, size_t n) {
  if (check_desc(d, why, n)) return 0;
  pthread_mutex_lock(&g_mu);
  int ok = 0;
  sdpa_entry *e = get_entry(d, 1, why, n);
  if (e) {
    ok = e->fwd.ok && e->bwd.ok;
    if (!ok) set_msg(why, n, "%s", !e->fwd.ok ? e->fwd.msg : e->bwd.msg);
  }
  pthread_mutex_unlock(&g_mu);
  return ok;
}

extern "C" int evt_cudnn_sdpa_plan_info(const evt_cudnn_sdpa_desc *d, char *info, size_t n) {
  if (check_desc(d, info, n)) return -1;
  pthread_mutex_lock(&g_mu);
  int rc = -1;
  sdpa_entry *e = get_entry(d, 0, info, n);
  if (e) {
    char f[256], b[256];
    const sdpa_plan *ps[2] = {&e->fwd, &e->bwd};
    char *out[2] = {f, b};
    for (int i = 0; i < 2; i++) {
      if (ps[i]->ok)
        snprintf(out[i], 256, "graph %c, engine %lld, workspace %lld B%s", 'A' + ps[i]->variant,
                 (long long)ps[i]->engine, (long long)ps[i]->ws_bytes, ps[i]->zero_dq_accum ? ", dQ_accum zeroed" : "");
      else snprintf(out[i], 256, "none");
    }
    set_msg(info, n, "fwd: %s; bwd: %s", f, b);
    rc = 0;
  }
  pthread_mutex_unlock(&g_mu);
  return rc;
}

/* ---- execution ------------------------------------------------------------------------------------------ */

/* Under g_mu: variant pack, stream, execute. */
static int execute(const sdpa_entry *e, const sdpa_plan *p, cudaStream_t stream, int count, const int64_t *uids,
                   void **ptrs, const char *what, char *err, size_t n) {
  cudnnHandle_t handle;
  if (get_handle(e->device, &handle, err, n)) return -1;
  cudnnBackendDescriptor_t vp = NULL;
  const char *step = "cudnnBackendCreateDescriptor(VARIANT_PACK)";
  cudnnStatus_t st = g_api.create_desc(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp);
  void *ws = p->ws;
  if (st == CUDNN_STATUS_SUCCESS) {
    step = "set CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS";
    st = g_api.set_attr(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, count, uids);
  }
  if (st == CUDNN_STATUS_SUCCESS) {
    step = "set CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS";
    st = g_api.set_attr(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, count, ptrs);
  }
  if (st == CUDNN_STATUS_SUCCESS) {
    step = "set CUDNN_ATTR_VARIANT_PACK_WORKSPACE";
    st = g_api.set_attr(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
  }
  if (st == CUDNN_STATUS_SUCCESS) {
    step = "cudnnBackendFinalize(VARIANT_PACK)";
    st = g_api.finalize(vp);
  }
  if (st == CUDNN_STATUS_SUCCESS) {
    step = "cudnnSetStream";
    st = g_api.set_stream(handle, stream);
  }
  if (st == CUDNN_STATUS_SUCCESS) {
    step = "cudnnBackendExecute";
    st = g_api.execute(handle, p->plan, vp);
  }
  if (vp) g_api.destroy_desc(vp);
  if (st != CUDNN_STATUS_SUCCESS) {
    char s[512], shape[160];
    status_text(st, s, sizeof s);
    describe(&e->key, shape, sizeof shape);
    return set_msg(err, n, "cuDNN SDPA %s (%s, graph %c, engine %lld): %s: %s", what, shape, 'A' + p->variant,
                   (long long)p->engine, step, s),
           -1;
  }
  return 0;
}

static int aligned16(const void *ptr) { return ((uintptr_t)ptr & 15) == 0; }

/* The entry for a call: built here unless the stream is capturing. Under g_mu. */
static sdpa_entry *entry_for_call(const evt_cudnn_sdpa_desc *d, cudaStream_t stream, char *err, size_t n) {
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &cs) != cudaSuccess) {
    cudaGetLastError();
    cs = cudaStreamCaptureStatusNone;
  }
  return get_entry(d, cs == cudaStreamCaptureStatusNone, err, n);
}

extern "C" int evt_cudnn_sdpa_fwd(void *stream, const evt_cudnn_sdpa_desc *d, const void *q, const void *k,
                                  const void *v, void *out, float *stats, char *err, size_t n) {
  if (check_desc(d, err, n)) return -1;
  if (!q || !k || !v || !out || !stats) return set_msg(err, n, "cuDNN SDPA forward: a NULL pointer"), -1;
  if (!aligned16(q) || !aligned16(k) || !aligned16(v) || !aligned16(out) || !aligned16(stats))
    return set_msg(err, n, "cuDNN SDPA forward: every pointer must be 16-byte aligned"), -1;
  pthread_mutex_lock(&g_mu);
  int rc = -1;
  sdpa_entry *e = entry_for_call(d, (cudaStream_t)stream, err, n);
  if (e && !e->fwd.ok) set_msg(err, n, "cuDNN SDPA forward not supported: %s", e->fwd.msg);
  if (e && e->fwd.ok) {
    float scale = d->scale != 0 ? d->scale : (float)(1.0 / sqrt((double)d->d));
    float fill = -FLT_MAX;
    int64_t uids[7] = {UID_Q, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE, UID_FILL};
    void *ptrs[7] = {(void *)q, (void *)k, (void *)v, out, (void *)stats, &scale, &fill};
    rc = execute(e, &e->fwd, (cudaStream_t)stream, d->causal ? 7 : 6, uids, ptrs, "forward", err, n);
  }
  pthread_mutex_unlock(&g_mu);
  return rc;
}

extern "C" int evt_cudnn_sdpa_bwd(void *stream, const evt_cudnn_sdpa_desc *d, const void *q, const void *k,
                                  const void *v, const void *out, const float *stats, const void *dout, void *dq,
                                  void *dk, void *dv, char *err, size_t n) {
  if (check_desc(d, err, n)) return -1;
  if (!q || !k || !v || !out || !stats || !dout || !dq || !dk || !dv)
    return set_msg(err, n, "cuDNN SDPA backward: a NULL pointer"), -1;
  const void *all[9] = {q, k, v, out, stats, dout, dq, dk, dv};
  for (int i = 0; i < 9; i++)
    if (!aligned16(all[i])) return set_msg(err, n, "cuDNN SDPA backward: every pointer must be 16-byte aligned"), -1;
  pthread_mutex_lock(&g_mu);
  int rc = -1;
  sdpa_entry *e = entry_for_call(d, (cudaStream_t)stream, err, n);
  if (e && !e->bwd.ok) set_msg(err, n, "cuDNN SDPA backward not supported: %s", e->bwd.msg);
  if (e && e->bwd.ok) {
    const sdpa_plan *p = &e->bwd;
    float scale = d->scale != 0 ? d->scale : (float)(1.0 / sqrt((double)d->d));
    float one = 1.0f, fill = -FLT_MAX;
    int64_t uids[14];
    void *ptrs[14];
    int c = 0;
#define PUT(uid, ptr) (uids[c] = (uid), ptrs[c] = (void *)(ptr), c++)
    PUT(UID_Q, q);
    PUT(UID_K, k);
    PUT(UID_V, v);
    PUT(UID_O, out);
    PUT(UID_STATS, stats);
    PUT(UID_DO, dout);
    PUT(UID_DQ, dq);
    PUT(UID_DK, dk);
    PUT(UID_DV, dv);
    PUT(UID_DQ_ACCUM, p->dq_accum);
    PUT(UID_SCALE, &scale);
    PUT(UID_ONE, &one);
    if (p->softmax_sum_in_pack) PUT(UID_SOFTMAX_SUM, p->softmax_sum);
    if (d->causal) PUT(UID_FILL, &fill);
#undef PUT
    rc = 0;
    if (p->zero_dq_accum) {
      cudaError_t ce = cudaMemsetAsync(p->dq_accum, 0, (size_t)p->dq_accum_bytes, (cudaStream_t)stream);
      if (ce != cudaSuccess) {
        cudaGetLastError();
        set_msg(err, n, "cuDNN SDPA backward: cudaMemsetAsync(dQ_accum): %s", cudaGetErrorString(ce));
        rc = -1;
      }
    }
    if (rc == 0) rc = execute(e, p, (cudaStream_t)stream, c, uids, ptrs, "backward", err, n);
  }
  pthread_mutex_unlock(&g_mu);
  return rc;
}

extern "C" void evt_cudnn_sdpa_release(void) {
  pthread_mutex_lock(&g_mu);
  int dev = -1;
  cudaGetDevice(&dev);
  for (int i = 0; i < g_nentries; i++) {
    cudaSetDevice(g_entries[i]->device);
    destroy_plan(&g_entries[i]->fwd);
    destroy_plan(&g_entries[i]->bwd);
    free(g_entries[i]);
  }
  free(g_entries);
  g_entries = NULL;
  g_nentries = g_capacity = 0;
  for (int i = 0; i < MAX_DEVICES; i++)
    if (g_handles[i]) {
      cudaSetDevice(i);
      g_api.destroy(g_handles[i]);
      g_handles[i] = NULL;
    }
  if (dev >= 0) cudaSetDevice(dev);
  cudaGetLastError();
  pthread_mutex_unlock(&g_mu);
}

#endif /* EVT_HAVE_CUDNN */
