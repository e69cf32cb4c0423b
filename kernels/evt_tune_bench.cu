// Timing helper of the GEMM + EVT autotuner (src/tune/tune_gpu.c), JIT-compiled into its own shared object
// together with the candidate kernels and dlopened by libevt (which never links CUDA). C ABI: see the
// functions below; every one returns 0 on success, a launcher's nonzero code, or -1 on a CUDA / cuBLASLt
// error (message in a thread-local buffer, evt_tb_last_error).
//
// Timing: `warmup` calls, a device synchronize, then `reps` calls each bracketed by two CUDA events on the
// default stream; the median of the per-call times. cuBLASLt (the unfused alternative's GEMM) is loaded with
// dlopen (libcublasLt.so.13 / .12 / libcublasLt.so), so the shared object needs no link flags beyond the
// JIT's defaults; no cuBLASLt means the unfused alternative cannot be measured (-1 from evt_tb_lt_create).
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <library_types.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "evt_launch.h"
#include "evt_row_launch.h"

typedef int (*evt_tb_gemm_fn)(const evt_launch_args *);
typedef int (*evt_tb_row_fn)(const evt_row_launch_args *);

static thread_local char g_err[512];

static int cuda_fail(cudaError_t e, const char *what) {
  snprintf(g_err, sizeof g_err, "%s: %s", what, cudaGetErrorString(e));
  return -1;
}
#define CU(x)                                   \
  do {                                          \
    cudaError_t e_ = (x);                       \
    if (e_ != cudaSuccess) return cuda_fail(e_, #x); \
  } while (0)

extern "C" const char *evt_tb_last_error(void) { return g_err; }

extern "C" int evt_tb_device(char *name, int len, int *sms) {
  int dev = 0;
  CU(cudaGetDevice(&dev));
  cudaDeviceProp p;
  CU(cudaGetDeviceProperties(&p, dev));
  snprintf(name, (size_t)len, "%s", p.name);
  if (sms) *sms = p.multiProcessorCount;
  return 0;
}

extern "C" void *evt_tb_alloc(size_t bytes) {
  void *p = nullptr;
  if (cudaMalloc(&p, bytes + 256) != cudaSuccess) return nullptr;
  return p;
}
extern "C" void evt_tb_free(void *p) {
  if (p) cudaFree(p);
}
extern "C" int evt_tb_upload(void *dev, const void *host, size_t bytes) {
  CU(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice));
  return 0;
}
extern "C" int evt_tb_download(void *host, const void *dev, size_t bytes) {
  CU(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost));
  return 0;
}
extern "C" int evt_tb_memset(void *dev, int byte, size_t bytes) {
  CU(cudaMemset(dev, byte, bytes));
  return 0;
}
extern "C" int evt_tb_sync(void) {
  CU(cudaDeviceSynchronize());
  CU(cudaGetLastError());
  return 0;
}

// Times `call` (returns 0 or a nonzero code): the median in *ms.
template <class F>
static int time_median(F &&call, int warmup, int reps, double *ms) {
  for (int i = 0; i < warmup; i++) {
    int rc = call();
    if (rc) return rc;
  }
  CU(cudaDeviceSynchronize());
  std::vector<cudaEvent_t> ev(2 * (size_t)reps);
  for (auto &e : ev) CU(cudaEventCreate(&e));
  int rc = 0;
  for (int i = 0; i < reps && !rc; i++) {
    CU(cudaEventRecord(ev[2 * i]));
    rc = call();
    CU(cudaEventRecord(ev[2 * i + 1]));
  }
  cudaError_t e = cudaDeviceSynchronize();
  std::vector<float> t((size_t)reps);
  for (int i = 0; i < reps && !rc && e == cudaSuccess; i++) cudaEventElapsedTime(&t[i], ev[2 * i], ev[2 * i + 1]);
  for (auto &x : ev) cudaEventDestroy(x);
  if (rc) return rc;
  if (e != cudaSuccess) return cuda_fail(e, "timed calls");
  CU(cudaGetLastError());
  std::sort(t.begin(), t.end());
  *ms = t[(size_t)reps / 2];
  return 0;
}

extern "C" int evt_tb_time_gemm(evt_tb_gemm_fn fn, const evt_launch_args *a, int warmup, int reps, double *ms) {
  return time_median([&] { return fn(a); }, warmup, reps, ms);
}

// ---- cuBLASLt through dlopen (the few entry points the unfused GEMM needs) ----------------------------------
typedef int lt_status;  // cublasStatus_t
typedef void *lt_handle, *lt_desc, *lt_layout, *lt_pref;
struct lt_heur {         // cublasLtMatmulHeuristicResult_t
  uint64_t algo[8];
  size_t workspaceSize;
  int state;
  float wavesCount;
  int reserved[4];
};
enum {
  LT_COMPUTE_32F = 68,              // CUBLAS_COMPUTE_32F
  LT_DESC_TRANSA = 3,               // CUBLASLT_MATMUL_DESC_TRANSA
  LT_DESC_TRANSB = 4,               // CUBLASLT_MATMUL_DESC_TRANSB
  LT_DESC_EPILOGUE = 7,             // CUBLASLT_MATMUL_DESC_EPILOGUE
  LT_DESC_BIAS_POINTER = 8,         // CUBLASLT_MATMUL_DESC_BIAS_POINTER
  LT_EPILOGUE_BIAS = 4,             // CUBLASLT_EPILOGUE_BIAS
  LT_PREF_MAX_WORKSPACE_BYTES = 1,  // CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES
  LT_OP_N = 0,
  LT_OP_T = 1
};
static struct {
  int tried, ok;
  lt_status (*create)(lt_handle *);
  lt_status (*destroy)(lt_handle);
  lt_status (*desc_create)(lt_desc *, int, int);
  lt_status (*desc_destroy)(lt_desc);
  lt_status (*desc_set)(lt_desc, int, const void *, size_t);
  lt_status (*layout_create)(lt_layout *, int, uint64_t, uint64_t, int64_t);
  lt_status (*layout_destroy)(lt_layout);
  lt_status (*pref_create)(lt_pref *);
  lt_status (*pref_destroy)(lt_pref);
  lt_status (*pref_set)(lt_pref, int, const void *, size_t);
  lt_status (*heuristic)(lt_handle, lt_desc, lt_layout, lt_layout, lt_layout, lt_layout, lt_pref, int, lt_heur *, int *);
  lt_status (*matmul)(lt_handle, lt_desc, const void *, const void *, lt_layout, const void *, lt_layout, const void *,
                      const void *, lt_layout, void *, lt_layout, const void *, void *, size_t, cudaStream_t);
} L;

static bool lt_load() {
  if (L.tried) return L.ok;
  L.tried = 1;
  void *h = nullptr;
  for (const char *n : {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"})
    if ((h = dlopen(n, RTLD_NOW | RTLD_GLOBAL))) break;
  if (!h) {
    snprintf(g_err, sizeof g_err, "cannot dlopen libcublasLt: %s", dlerror());
    return false;
  }
#define SYM(f, s)                                                \
  if (!(*(void **)&L.f = dlsym(h, s))) {                         \
    snprintf(g_err, sizeof g_err, "libcublasLt lacks %s", s);   \
    return false;                                                \
  }
  SYM(create, "cublasLtCreate");
  SYM(destroy, "cublasLtDestroy");
  SYM(desc_create, "cublasLtMatmulDescCreate");
  SYM(desc_destroy, "cublasLtMatmulDescDestroy");
  SYM(desc_set, "cublasLtMatmulDescSetAttribute");
  SYM(layout_create, "cublasLtMatrixLayoutCreate");
  SYM(layout_destroy, "cublasLtMatrixLayoutDestroy");
  SYM(pref_create, "cublasLtMatmulPreferenceCreate");
  SYM(pref_destroy, "cublasLtMatmulPreferenceDestroy");
  SYM(pref_set, "cublasLtMatmulPreferenceSetAttribute");
  SYM(heuristic, "cublasLtMatmulAlgoGetHeuristic");
  SYM(matmul, "cublasLtMatmul");
#undef SYM
  L.ok = 1;
  return true;
}

struct LtPlan {
  lt_handle h = nullptr;
  lt_desc op = nullptr;
  lt_layout la = nullptr, lb = nullptr, lc = nullptr;
  lt_heur heur;
  void *ws = nullptr;
  size_t ws_bytes = 32u << 20;
};

static int dtype_code(int c) { return c == 2 ? CUDA_R_32F : c == 1 ? CUDA_R_16F : CUDA_R_16BF; }

#define LTC(x)                                                              \
  do {                                                                      \
    int s_ = (x);                                                           \
    if (s_ != 0) {                                                          \
      snprintf(g_err, sizeof g_err, "%s failed: cuBLAS status %d", #x, s_); \
      return -1;                                                            \
    }                                                                       \
  } while (0)

static int lt_build(LtPlan *p, int M, int N, int K, int layout, int ab, int out, const void *bias) {
  LTC(L.create(&p->h));
  LTC(L.desc_create(&p->op, LT_COMPUTE_32F, CUDA_R_32F));
  // row-major D[M,N] = A·B as column-major D^T[N,M] = B^T·A^T; layout 0 NN, 1 NT (B stored N×K), 2 TN (A K×M)
  int ta = layout == 1 ? LT_OP_T : LT_OP_N, tb = layout == 2 ? LT_OP_T : LT_OP_N;
  LTC(L.desc_set(p->op, LT_DESC_TRANSA, &ta, sizeof ta));
  LTC(L.desc_set(p->op, LT_DESC_TRANSB, &tb, sizeof tb));
  if (bias) {
    int e = LT_EPILOGUE_BIAS;
    LTC(L.desc_set(p->op, LT_DESC_EPILOGUE, &e, sizeof e));
    LTC(L.desc_set(p->op, LT_DESC_BIAS_POINTER, &bias, sizeof bias));
  }
  int t = dtype_code(ab);
  if (ta == LT_OP_N) LTC(L.layout_create(&p->la, t, N, K, N));
  else LTC(L.layout_create(&p->la, t, K, N, K));
  if (tb == LT_OP_N) LTC(L.layout_create(&p->lb, t, K, M, K));
  else LTC(L.layout_create(&p->lb, t, M, K, M));
  LTC(L.layout_create(&p->lc, dtype_code(out), N, M, N));
  CU(cudaMalloc(&p->ws, p->ws_bytes));
  lt_pref pref;
  LTC(L.pref_create(&pref));
  LTC(L.pref_set(pref, LT_PREF_MAX_WORKSPACE_BYTES, &p->ws_bytes, sizeof p->ws_bytes));
  int n = 0;
  int s = L.heuristic(p->h, p->op, p->la, p->lb, p->lc, p->lc, pref, 1, &p->heur, &n);
  L.pref_destroy(pref);
  if (s != 0 || n < 1) {
    snprintf(g_err, sizeof g_err, "cuBLASLt has no algorithm (status %d)", s);
    return -1;
  }
  return 0;
}

extern "C" void evt_tb_lt_free(void *plan) {
  LtPlan *p = (LtPlan *)plan;
  if (!p) return;
  if (p->la) L.layout_destroy(p->la);
  if (p->lb) L.layout_destroy(p->lb);
  if (p->lc) L.layout_destroy(p->lc);
  if (p->op) L.desc_destroy(p->op);
  if (p->h) L.destroy(p->h);
  if (p->ws) cudaFree(p->ws);
  delete p;
}

// A cuBLASLt GEMM plan: layout 0 NN / 1 NT / 2 TN, dtypes 0 bf16 / 1 f16 / 2 f32, bias (an N-vector of the
// output dtype) or NULL. NULL on failure (evt_tb_last_error).
extern "C" void *evt_tb_lt_create(int m, int n, int k, int layout, int ab, int out, const void *bias) {
  if (!lt_load()) return nullptr;
  LtPlan *p = new LtPlan;
  if (lt_build(p, m, n, k, layout, ab, out, bias) != 0) {
    evt_tb_lt_free(p);
    return nullptr;
  }
  return p;
}

static int lt_run(LtPlan *p, const void *A, const void *B, void *T) {
  float alpha = 1.f, beta = 0.f;
  LTC(L.matmul(p->h, p->op, &alpha, B, p->la, A, p->lb, &beta, T, p->lc, T, p->lc, &p->heur.algo, p->ws, p->ws_bytes,
               0));
  return 0;
}

// The unfused alternative: the cuBLASLt GEMM into T, then (rowfn non-NULL) the row kernel over T.
extern "C" int evt_tb_time_unfused(void *plan, const void *A, const void *B, void *T, evt_tb_row_fn rowfn,
                                   const evt_row_launch_args *ra, int warmup, int reps, double *ms) {
  LtPlan *p = (LtPlan *)plan;
  return time_median(
      [&] {
        int rc = lt_run(p, A, B, T);
        if (rc == 0 && rowfn && (rc = rowfn(ra)) != 0)
          snprintf(g_err, sizeof g_err, "the row kernel's launcher returned %d%s", rc,
                   rc == EVT_LAUNCH_CANNOT_IMPLEMENT ? " (cannot implement: no row config takes rows this long)" : "");
        return rc;
      },
      warmup, reps, ms);
}
