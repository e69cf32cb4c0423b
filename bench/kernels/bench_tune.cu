// Benchmark of GEMM + epilogue kernels with mainloop tuning (bench/kernels/run.sh tune runs it).
// Per case (shape, operand layout, epilogue) it reports
//   cuBLAS plain      cuBLASLt GEMM alone (bf16 out), heuristic's first algorithm
//   cuBLAS + separate cuBLASLt GEMM into T (with cuBLASLt's BIAS epilogue when the epilogue starts with
//                     acc + bias, else plain) + the rest of the epilogue as one generated row kernel
//                     (evt_tune_unfused_rspec, src/codegen/emit_rows.c); the faster of the two variants
//   evt default       the generated CUTLASS kernel, default config (128x128x64 c1x1 coop), no swizzle
//   evt tuned         the fastest of evt_tune_candidates x evt_tune_sched_variants (launch-time swizzle/raster)
// Timing: 5 warm-ups, then the median of R calls each bracketed by CUDA events. Every fused result (default
// and tuned) is checked against the CPU reference (evt_kspec_reference) on 8 sampled rows and 8 sampled
// columns (evt_tune_check_sampled); bf16 tolerance 2e-2 relative to the tensor's max.
// Usage:
//   bench_tune compile MAXCFG          JIT-compile every kernel the cases need (parallel, cached)
//   bench_tune run MAXCFG OUT.md REPS  time and check, using only kernels already in the JIT cache
//   bench_tune tune MAXCFG             run the autotuner (evt_tune_run_many) on every case, print its choices
//   bench_tune list MAXCFG             case, config -> kernel name (for a profiler's kernel filter)
// Environment: BENCH_TUNE_CASES=epi (the epilogue ablation cases instead of the default ones),
// BENCH_TUNE_CFGS="label;label" (these mainloop configs instead of the tuner's candidates),
// BENCH_TUNE_ONLY="what:epilogue,..." (these cases), BENCH_TUNE_NSV=N (the first N scheduler variants),
// BENCH_TUNE_SO_DIR=DIR (load NAME-*.so from DIR: kernels compiled on another machine, other include paths).
#include <cublasLt.h>

#include <algorithm>
#include <map>

#include <glob.h>
#include <unistd.h>

#include "../../tests/gpu/gpu_util.h"

extern "C" {
#include "codegen/rspec.h"
#include "evt_row_launch.h"
#include "tune/tune.h"
}

typedef int (*row_launch_fn)(const evt_row_launch_args *);

#define LT(x)                                                                     \
  do {                                                                            \
    cublasStatus_t s_ = (x);                                                      \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                            \
      fprintf(stderr, "%s:%d: %s failed: %d\n", __FILE__, __LINE__, #x, (int)s_); \
      return false;                                                               \
    }                                                                             \
  } while (0)

static cudaDataType_t cu_type(evt_dtype t) {
  return t == EVT_F32 ? CUDA_R_32F : t == EVT_F16 ? CUDA_R_16F : CUDA_R_16BF;
}
static size_t dbytes(evt_dtype t) { return t == EVT_F32 ? 4 : 2; }

// Row-major D[M,N] = A·B in the spec's layout, as column-major D^T = B^T·A^T.
struct Lt {
  cublasLtHandle_t h = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo;
  void *ws = nullptr;
  size_t ws_bytes = 64 << 20;
  // epi (optional): a cuBLASLt built-in epilogue other than BIAS, with its aux matrix (N x M column-major,
  // leading dimension N: the row-major M x N of the spec) — the library's own fused GELU kernels, timed for
  // reference (bench_main: GELU_AUX_BIAS, DGELU_BGRAD)
  bool init(int M, int N, int K, evt_gemm_layout layout, evt_dtype ab, evt_dtype out, const void *bias,
            cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT, const void *aux = nullptr) {
    LT(cublasLtCreate(&h));
    LT(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = layout == EVT_LAYOUT_NT ? CUBLAS_OP_T : CUBLAS_OP_N;  // on B (cuBLAS's A)
    cublasOperation_t tb = layout == EVT_LAYOUT_TN ? CUBLAS_OP_T : CUBLAS_OP_N;  // on A (cuBLAS's B)
    LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (bias && epi == CUBLASLT_EPILOGUE_DEFAULT) epi = CUBLASLT_EPILOGUE_BIAS;
    if (epi != CUBLASLT_EPILOGUE_DEFAULT)
      LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    if (bias) LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    if (aux) {
      int64_t ld = N;
      LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
      LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld));
    }
    cudaDataType_t t = cu_type(ab);
    if (ta == CUBLAS_OP_N) LT(cublasLtMatrixLayoutCreate(&la, t, N, K, N));
    else LT(cublasLtMatrixLayoutCreate(&la, t, K, N, K));
    if (tb == CUBLAS_OP_N) LT(cublasLtMatrixLayoutCreate(&lb, t, K, M, K));
    else LT(cublasLtMatrixLayoutCreate(&lb, t, M, K, M));
    LT(cublasLtMatrixLayoutCreate(&lc, cu_type(out), N, M, N));
    CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
    cublasLtMatmulPreference_t pref;
    LT(cublasLtMatmulPreferenceCreate(&pref));
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes));
    cublasLtMatmulHeuristicResult_t res;
    int n = 0;
    LT(cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, lc, lc, pref, 1, &res, &n));
    cublasLtMatmulPreferenceDestroy(pref);
    if (n < 1) return false;
    algo = res.algo;
    return true;
  }
  bool run(const void *A, const void *B, void *D) {
    float alpha = 1.f, beta = 0.f;
    LT(cublasLtMatmul(h, op, &alpha, B, la, A, lb, &beta, D, lc, D, lc, &algo, ws, ws_bytes, 0));
    return true;
  }
  ~Lt() {
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (op) cublasLtMatmulDescDestroy(op);
    if (h) cublasLtDestroy(h);
    if (ws) cudaFree(ws);
  }
};

// BENCH_GAP_US=g: the GPU idles g microseconds before every timed call (synchronize, then sleep), so each call
// starts from an idle GPU's clocks and power state instead of from a row of back-to-back calls (an experiment on
// why the tuner's isolated timings differ from the same kernels' in a training step).
static int gap_us() {
  static int g = -1;
  if (g < 0) g = getenv("BENCH_GAP_US") ? atoi(getenv("BENCH_GAP_US")) : 0;
  return g;
}
template <class F>
static double median_ms(F &&f, int reps) {
  for (int i = 0; i < 5; i++)
    if (!f()) return -1;
  if (cudaDeviceSynchronize() != cudaSuccess) return -1;
  std::vector<cudaEvent_t> ev(2 * reps);
  for (auto &e : ev) CUDA_CHECK(cudaEventCreate(&e));
  for (int i = 0; i < reps; i++) {
    if (gap_us() > 0) {
      CUDA_CHECK(cudaDeviceSynchronize());
      usleep((useconds_t)gap_us());
    }
    CUDA_CHECK(cudaEventRecord(ev[2 * i]));
    if (!f()) return -1;
    CUDA_CHECK(cudaEventRecord(ev[2 * i + 1]));
  }
  if (cudaDeviceSynchronize() != cudaSuccess || cudaGetLastError() != cudaSuccess) return -1;
  std::vector<float> ms(reps);
  for (int i = 0; i < reps; i++) CUDA_CHECK(cudaEventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]));
  for (auto &e : ev) cudaEventDestroy(e);
  std::sort(ms.begin(), ms.end());
  return ms[reps / 2];
}

struct Case {
  const char *what;  // BERT role
  int M, N, K;
  evt_gemm_layout layout;
  std::string epi;
  evt_kspec spec;  // default config
};

// D = gelu_erf'(x) · acc, dbias = Σ_M D  (GELU backward into the fc1 bias gradient)
static void spec_gelu_bwd_dbias(evt_kspec *s) {
  evt_kspec_init(s, EVT_LAYOUT_NN, EVT_BF16, EVT_BF16, EVT_TILE_CONFIG_DEFAULT);
  int acc = evt_kspec_add(s, EVT_V_ACC, -1, -1, EVT_F32, "acc");
  int x = evt_kspec_add(s, EVT_V_AUX_LOAD, -1, -1, EVT_BF16, "x");
  int g = evt_kspec_add(s, EVT_V_GELU_ERF_GRAD, acc, x, EVT_F32, NULL);
  evt_kspec_add(s, EVT_V_ROW_SUM, g, -1, EVT_F32, "dbias");
  s->d_node = g;
}

// Epilogue ablation (BENCH_TUNE_CASES=epi): BERT-large's fc1 forward (16384x4096x1024 NN) and fc2 backward dX
// (16384x4096x1024 NT) with the epilogue built up node by node, to see what each part of the fused epilogue
// costs next to the plain GEMM (bench/RESULTS.md).
static void spec_ablation(evt_kspec *s, const std::string &b) {
  evt_kspec_init(s, EVT_LAYOUT_NN, EVT_BF16, EVT_BF16, EVT_TILE_CONFIG_DEFAULT);
  int acc = evt_kspec_add(s, EVT_V_ACC, -1, -1, EVT_F32, "acc");
  int d = acc;
  if (b.rfind("bias", 0) == 0) {
    int bias = evt_kspec_add(s, EVT_V_ROW_BCAST, -1, -1, EVT_BF16, "bias");
    int z = evt_kspec_add(s, EVT_V_ADD, acc, bias, EVT_F32, NULL);
    if (b.find("_aux") != std::string::npos) evt_kspec_add(s, EVT_V_AUX_STORE, z, -1, EVT_BF16, "z");
    d = z;
    // "gelut": the tanh GELU (PyTorch's approximate="tanh") instead of the erf one
    if (b.find("gelu") != std::string::npos)
      d = evt_kspec_add(s, b.find("gelut") != std::string::npos ? EVT_V_GELU_TANH : EVT_V_GELU_ERF, z, -1, EVT_F32, NULL);
    if (b.find("relu") != std::string::npos) d = evt_kspec_add(s, EVT_V_RELU, z, -1, EVT_F32, NULL);
  } else if (b.rfind("mulx", 0) == 0 || b.rfind("gelu_bwd", 0) == 0 || b.rfind("gelut_bwd", 0) == 0) {
    int x = evt_kspec_add(s, EVT_V_AUX_LOAD, -1, -1, EVT_BF16, "x");
    d = evt_kspec_add(s, b[0] == 'm' ? EVT_V_MUL : b[4] == 't' ? EVT_V_GELU_TANH_GRAD : EVT_V_GELU_ERF_GRAD, acc, x, EVT_F32, NULL);
    if (b.find("dbias") != std::string::npos) evt_kspec_add(s, EVT_V_ROW_SUM, d, -1, EVT_F32, "dbias");
  } else if (b == "dbias") {
    evt_kspec_add(s, EVT_V_ROW_SUM, acc, -1, EVT_F32, "dbias");
  }
  s->d_node = d;
}

static std::vector<Case> bench_cases() {
  struct {
    const char *what;
    int M, N, K;
    evt_gemm_layout l;
    const char *epi;
  } T[] = {
      {"fc1 fwd", 8192, 4096, 1024, EVT_LAYOUT_NN, "bias_gelu_aux"},
      {"fc2 fwd", 8192, 1024, 4096, EVT_LAYOUT_NN, "bias_gelu_aux"},
      {"fc1 fwd", 8192, 4096, 1024, EVT_LAYOUT_NN, "bias_relu_dbias"},
      {"fc2 bwd dX", 8192, 4096, 1024, EVT_LAYOUT_NT, "gelu_bwd_dbias"},
      {"fc1 bwd dX", 8192, 1024, 4096, EVT_LAYOUT_NT, "plain"},
      {"fc1 bwd dW", 1024, 4096, 8192, EVT_LAYOUT_TN, "plain"},
      {"fc2 bwd dW", 4096, 1024, 8192, EVT_LAYOUT_TN, "plain"},
      {"square", 8192, 8192, 8192, EVT_LAYOUT_NN, "plain"},  // the mainloop alone against cuBLAS's
      {"square", 8192, 8192, 8192, EVT_LAYOUT_NN, "bias_gelu_aux"},
      {"square", 8192, 8192, 8192, EVT_LAYOUT_NN, "bias_relu_dbias"},
  };
  std::vector<Case> v;
  const char *set = getenv("BENCH_TUNE_CASES");
  if (set && !strcmp(set, "epi")) {
    const char *fw[] = {"plain", "bias", "bias_aux", "bias_gelu", "bias_gelu_aux", "bias_relu_aux", "bias_gelut_aux"};
    const char *bw[] = {"plain", "dbias", "mulx", "mulx_dbias", "gelu_bwd", "gelu_bwd_dbias", "gelut_bwd_dbias"};
    for (int dir = 0; dir < 2; dir++)
      for (const char *e : dir ? bw : fw) {
        Case c;
        c.what = dir ? "fc2 bwd dX" : "fc1 fwd";
        c.M = 16384, c.N = 4096, c.K = 1024, c.layout = dir ? EVT_LAYOUT_NT : EVT_LAYOUT_NN, c.epi = e;
        // BENCH_TUNE_MNK="MxNxK": another problem size for these epilogues (e.g. the paper MLP's 8192x16384x4096)
        if (const char *mnk = getenv("BENCH_TUNE_MNK")) sscanf(mnk, "%dx%dx%d", &c.M, &c.N, &c.K);
        spec_ablation(&c.spec, c.epi);
        c.spec.layout = c.layout;
        // BENCH_TUNE_ONLY="fc1 fwd:bias_gelu_aux[,fc2 bwd dX:dbias...]": these cases only (e.g. a profiler run)
        const char *only = getenv("BENCH_TUNE_ONLY");
        if (only && *only && ("," + std::string(only) + ",").find("," + std::string(c.what) + ":" + c.epi + ",") == std::string::npos)
          continue;
        v.push_back(c);
      }
    return v;
  }
  for (auto &t : T) {
    Case c;
    c.what = t.what, c.M = t.M, c.N = t.N, c.K = t.K, c.layout = t.l, c.epi = t.epi;
    if (c.epi == "gelu_bwd_dbias") spec_gelu_bwd_dbias(&c.spec);
    else if (evt_kspec_example(&c.spec, t.epi, EVT_TILE_CONFIG_DEFAULT) != EVT_OK) exit(2);
    c.spec.layout = t.l;
    v.push_back(c);
  }
  return v;
}

struct Kern {
  std::string name, src;
  bool row = false;
  void *fn = nullptr;
  bool cached = false;
};

// The JIT cache path evt_jit_compile would use (same key), so `run` can use only what is compiled.
static std::string cache_path(const Kern &k) {
  evt_jit_options o = {0};  // the options of `compile` below (every kernel with the CUTLASS include paths)
  char p[2048];
  if (evt_jit_cache_path(&o, k.name.c_str(), k.src.c_str(), p, sizeof p) != EVT_OK) return "";
  return p;
}

struct Plan {
  Case c;
  std::vector<evt_tile_config> cfgs;
  std::vector<std::string> kname;  // per config
  evt_rspec rs[2];
  int have_rs[2] = {0, 0};
  int map[2][EVT_RSPEC_MAX_NODES], tnode[2], dnode[2], bnode[2];
  std::string rname[2];
};

static std::map<std::string, Kern> g_kern;

static std::string add_gemm(const evt_kspec &s) {
  char nm[40], err[512];
  evt_kspec_kernel_name(&s, nm);
  if (!g_kern.count(nm)) {
    char *src = evt_emit_cutlass(&s, err, sizeof err);
    if (!src) {
      fprintf(stderr, "emit %s: %s\n", nm, err);
      return "";
    }
    Kern k;
    k.name = nm, k.src = src;
    free(src);
    g_kern[nm] = k;
  }
  return nm;
}

// BENCH_TUNE_CFGS="128x256x64 c1x1 coop;128x128x64 c1x1 pingpong": these configs instead of the tuner's list
static int env_configs(evt_tile_config *out, int max) {
  const char *e = getenv("BENCH_TUNE_CFGS");
  if (!e || !*e) return -1;
  std::string all = e;
  int n = 0;
  size_t at = 0;
  while (at <= all.size() && n < max) {
    size_t semi = all.find(';', at);
    std::string one = all.substr(at, semi == std::string::npos ? std::string::npos : semi - at);
    if (!one.empty() && evt_tile_config_parse(one.c_str(), &out[n]) == EVT_OK) n++;
    else if (!one.empty()) fprintf(stderr, "BENCH_TUNE_CFGS: cannot parse '%s'\n", one.c_str());
    if (semi == std::string::npos) break;
    at = semi + 1;
  }
  return n;
}

static std::string add_row(const evt_rspec &s) {
  char nm[40], err[512];
  evt_rspec_kernel_name(&s, nm);
  if (!g_kern.count(nm)) {
    char *src = evt_emit_rows(&s, err, sizeof err);
    if (!src) {
      fprintf(stderr, "emit %s: %s\n", nm, err);
      return "";
    }
    Kern k;
    k.name = nm, k.src = src, k.row = true;
    free(src);
    g_kern[nm] = k;
  }
  return nm;
}

static std::vector<Plan> make_plans(int maxcfg) {
  std::vector<Plan> ps;
  for (Case &c : bench_cases()) {
    Plan p;
    p.c = c;
    evt_tile_config cf[EVT_TUNE_MAX_CAND];
    int n = env_configs(cf, EVT_TUNE_MAX_CAND);
    if (n < 0) n = evt_tune_candidates(&c.spec, c.M, c.N, c.K, cf, maxcfg);
    for (int i = 0; i < n; i++) {
      evt_kspec s = c.spec;
      s.cfg = cf[i];
      std::string nm = add_gemm(s);
      if (nm.empty()) continue;
      p.cfgs.push_back(cf[i]);
      p.kname.push_back(nm);
    }
    for (int ab = 0; ab < 2; ab++) {
      char err[512];
      evt_status st = evt_tune_unfused_rspec(&c.spec, c.spec.ab_dtype, ab, &p.rs[ab], p.map[ab], &p.tnode[ab],
                                             &p.dnode[ab], &p.bnode[ab], err, sizeof err);
      if (st == EVT_OK) {
        p.have_rs[ab] = 1;
        p.rname[ab] = add_row(p.rs[ab]);
      } else if (p.dnode[ab] < 0 && st == EVT_ERR_UNSUPPORTED && strstr(err, "no row kernel")) {
        p.have_rs[ab] = 2;  // cuBLASLt alone
      }
    }
    ps.push_back(p);
  }
  return ps;
}

// Host random data, raw dtype bytes (xorshift, uniform [lo, hi)).
static std::vector<unsigned char> rand_raw(evt_dtype dt, size_t n, uint64_t seed, float lo, float hi) {
  Rng r(seed);
  std::vector<unsigned char> b(n * dbytes(dt));
  for (size_t i = 0; i < n; i++) {
    float v = r.uniform(lo, hi);
    if (dt == EVT_BF16) {
      __nv_bfloat16 h = __float2bfloat16(v);
      memcpy(&b[2 * i], &h, 2);
    } else if (dt == EVT_F16) {
      __half h = __float2half(v);
      memcpy(&b[2 * i], &h, 2);
    } else {
      memcpy(&b[4 * i], &v, 4);
    }
  }
  return b;
}

static void *upload(const std::vector<unsigned char> &h) {
  void *d;
  CUDA_CHECK(cudaMalloc(&d, h.size() + 256));
  CUDA_CHECK(cudaMemcpy(d, h.data(), h.size(), cudaMemcpyHostToDevice));
  return d;
}

static std::vector<unsigned char> download(const void *d, size_t bytes) {
  std::vector<unsigned char> h(bytes);
  CUDA_CHECK(cudaMemcpy(h.data(), d, bytes, cudaMemcpyDeviceToHost));
  return h;
}

static int64_t node_elems(const evt_vnode &v, int64_t m, int64_t n) {
  switch (v.op) {
    case EVT_V_ROW_BCAST:
    case EVT_V_ROW_SUM: return n;
    case EVT_V_COL_BCAST:
    case EVT_V_COL_SUM: return m;
    case EVT_V_AUX_LOAD:
    case EVT_V_AUX_STORE: return m * n;
    default: return 0;
  }
}

static const char *lname(evt_gemm_layout l) { return l == EVT_LAYOUT_NN ? "NN" : l == EVT_LAYOUT_NT ? "NT" : "TN"; }

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: bench_tune compile MAXCFG | run MAXCFG OUT.md REPS\n");
    return 2;
  }
  bool compile = !strcmp(argv[1], "compile");
  int maxcfg = atoi(argv[2]);
  std::vector<Plan> plans = make_plans(maxcfg);
  if (!strcmp(argv[1], "list")) {  // case, config -> kernel name (for ncu's kernel filter)
    for (Plan &p : plans)
      for (size_t i = 0; i < p.cfgs.size(); i++) {
        char lab[96];
        evt_tile_config_label(&p.cfgs[i], lab, sizeof lab);
        printf("%s %s %s | %s | %s%s\n", p.c.what, lname(p.c.layout), p.c.epi.c_str(), lab, p.kname[i].c_str(),
               access(cache_path(g_kern[p.kname[i]]).c_str(), R_OK) == 0 ? " (in the JIT cache)" : "");
      }
    return 0;
  }
  if (!strcmp(argv[1], "tune")) {
    // the autotuner itself (src/tune/tune_gpu.c) on every case: records under $EVT_CACHE_DIR/tune
    std::vector<evt_tune_problem> probs;
    for (Plan &p : plans) {
      evt_tune_problem q;
      q.spec = p.c.spec;
      q.m = p.c.M, q.n = p.c.N, q.k = p.c.K;
      probs.push_back(q);
    }
    std::vector<evt_tune_record> rec(probs.size());
    std::vector<evt_status> sts(probs.size());
    evt_tune_options o;
    memset(&o, 0, sizeof o);
    o.max_configs = maxcfg;
    o.force = 1;
    char msg[1024] = "";
    evt_status st = evt_tune_run_many(probs.data(), (int)probs.size(), &o, rec.data(), sts.data(), msg, sizeof msg);
    if (st != EVT_OK) printf("evt_tune_run_many: %s\n", msg);
    for (size_t i = 0; i < probs.size(); i++) {
      char line[400] = "not tuned";
      if (sts[i] == EVT_OK) evt_tune_describe(&rec[i], rec[i].choice, &probs[i].spec, line, sizeof line);
      printf("TUNED %-10s %dx%dx%d %s %-16s %s; sampled check %.1e\n", plans[i].c.what, plans[i].c.M, plans[i].c.N,
             plans[i].c.K, lname(plans[i].c.layout), plans[i].c.epi.c_str(), line, sts[i] == EVT_OK ? rec[i].check_err : -1.0);
    }
    return st == EVT_OK ? 0 : 1;
  }
  if (compile) {
    // the autotuner's timing helper too (same name and source as src/tune/tune_gpu.c uses: one cache entry)
    {
      const char *kd = getenv("EVT_KERNELS_DIR") ? getenv("EVT_KERNELS_DIR") : "kernels";
      std::string path = std::string(kd) + "/evt_tune_bench.cu";
      FILE *f = fopen(path.c_str(), "rb");
      if (f) {
        std::string txt;
        char buf[4096];
        size_t n;
        while ((n = fread(buf, 1, sizeof buf, f)) > 0) txt.append(buf, n);
        fclose(f);
        Kern k;
        k.name = "evt_tune_bench", k.src = txt;
        g_kern[k.name] = k;
      }
    }
    std::vector<evt_jit_job> jobs;
    for (auto &kv : g_kern) {
      evt_jit_job j;
      memset(&j, 0, sizeof j);
      j.name = kv.second.name.c_str();
      j.source = kv.second.src.c_str();
      jobs.push_back(j);
    }
    char msg[2048];
    evt_status st = evt_jit_compile(jobs.data(), (int)jobs.size(), nullptr, msg, sizeof msg);
    int ok = 0;
    for (auto &j : jobs) {
      ok += j.ok;
      if (!j.ok) fprintf(stderr, "FAILED %s: %s\n", j.name, j.error);
    }
    printf("compiled/cached %d of %zu kernels (%s)\n", ok, jobs.size(), st == EVT_OK ? "all ok" : msg);
    return 0;
  }
  if (argc < 5) return 2;
  const char *out_md = argv[3];
  int reps = std::max(20, atoi(argv[4]));
  // load what is cached
  int nload = 0;
  for (auto &kv : g_kern) {
    std::string p = cache_path(kv.second);
    if (const char *sod = getenv("BENCH_TUNE_SO_DIR")) {  // kernels compiled elsewhere (other include paths)
      glob_t g;
      std::string pat = std::string(sod) + "/" + kv.second.name + "-*.so";
      if (glob(pat.c_str(), 0, nullptr, &g) == 0 && g.gl_pathc > 0) p = g.gl_pathv[0];
      globfree(&g);
    }
    if (access(p.c_str(), R_OK) != 0) continue;
    void *h = dlopen(p.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      fprintf(stderr, "dlopen %s: %s\n", p.c_str(), dlerror());
      continue;
    }
    kv.second.fn = dlsym(h, kv.second.name.c_str());
    nload += kv.second.fn != nullptr;
  }
  printf("loaded %d of %zu kernels from the JIT cache\n", nload, g_kern.size());
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  FILE *md = fopen(out_md, "w");
  if (!md) return 2;
  fprintf(md, "Device: %s (%d SMs). Median of %d calls after 5 warm-ups (CUDA events). ms; ratios vs cuBLAS plain; the interleaved column times cuBLAS, the separate pair and the tuned config again in alternating rounds (same GPU temperature).\n\n",
          prop.name, prop.multiProcessorCount, reps);
  fprintf(md, "| case | M×N×K | layout | epilogue | cuBLAS plain | cuBLAS + separate | evt default | evt tuned | tuned config | tuned/cuBLAS | tuned/separate | interleaved cuBLAS / separate / tuned: tuned/cuBLAS, tuned/separate | check default / tuned |\n");
  fprintf(md, "|---|---|---|---|---:|---:|---:|---:|---|---:|---:|---|---|\n");
  for (Plan &p : plans) {
    Case &c = p.c;
    const evt_kspec &s = c.spec;
    int64_t M = c.M, N = c.N, K = c.K;
    printf("== %s %dx%dx%d %s %s\n", c.what, c.M, c.N, c.K, lname(c.layout), c.epi.c_str());
    fflush(stdout);
    uint64_t seed = (uint64_t)M * 31 + N * 7 + K + c.layout;
    auto ha = rand_raw(s.ab_dtype, (size_t)(M * K), seed, -1.f, 1.f);
    auto hb = rand_raw(s.ab_dtype, (size_t)(K * N), seed + 1, -1.f, 1.f);
    void *A = upload(ha), *B = upload(hb);
    void *D, *T;
    CUDA_CHECK(cudaMalloc(&D, (size_t)(M * N) * dbytes(s.d_dtype) + 256));
    CUDA_CHECK(cudaMalloc(&T, (size_t)(M * N) * dbytes(s.ab_dtype) + 256));
    std::vector<std::vector<unsigned char>> hmem(s.nnodes);
    void *dmem[EVT_KSPEC_MAX_NODES] = {0};
    for (int v = 0; v < s.nnodes; v++) {
      int64_t e = node_elems(s.nodes[v], M, N);
      if (!e) continue;
      evt_dtype dt = s.nodes[v].dtype;
      if (evt_vop_class(s.nodes[v].op) == 'L') {
        hmem[v] = rand_raw(dt, (size_t)e, seed + 10 + v, -1.f, 1.f);
        dmem[v] = upload(hmem[v]);
      } else {
        CUDA_CHECK(cudaMalloc(&dmem[v], (size_t)e * dbytes(dt) + 256));
      }
    }
    // cuBLAS plain
    auto time_plain = [&]() -> double {
      Lt lt;
      return lt.init(c.M, c.N, c.K, c.layout, s.ab_dtype, s.ab_dtype, nullptr)
                 ? median_ms([&] { return lt.run(A, B, T); }, reps) : -1;
    };
    double t_plain = time_plain();
    // cuBLAS + separate (ab 0: cuBLASLt then the whole epilogue as a row kernel; ab 1: with cuBLASLt's BIAS
    // epilogue); -2 when that variant does not apply to this epilogue
    auto time_sep = [&](int ab) -> double {
      if (!p.have_rs[ab]) return -2;
      const void *bias = ab && p.bnode[ab] >= 0 ? dmem[p.bnode[ab]] : nullptr;
      if (ab && !bias) return -2;
      Lt lt;
      evt_dtype tout = p.have_rs[ab] == 2 ? s.d_dtype : s.ab_dtype;
      if (!lt.init(c.M, c.N, c.K, c.layout, s.ab_dtype, tout, bias)) return -2;
      if (p.have_rs[ab] == 2) return median_ms([&] { return lt.run(A, B, D); }, reps);
      row_launch_fn rf = (row_launch_fn)g_kern[p.rname[ab]].fn;
      if (!rf) {
        printf("  separate (%s): row kernel not compiled\n", ab ? "bias" : "plain");
        return -2;
      }
      evt_row_launch_args ra;
      memset(&ra, 0, sizeof ra);
      ra.m = c.M, ra.n = c.N;
      for (int i = 0; i < p.rs[ab].nnodes; i++) {
        if (i == p.tnode[ab]) ra.ptrs[i] = T;
        else if (i == p.dnode[ab]) ra.ptrs[i] = D;
        else if (p.map[ab][i] >= 0) ra.ptrs[i] = dmem[p.map[ab][i]];
      }
      return median_ms([&] { return lt.run(A, B, T) && rf(&ra) == 0; }, reps);
    };
    double t_sep = -1;
    int sep_ab = -1;
    std::string sep_how = "-";
    for (int ab = 0; ab < 2; ab++) {
      double t = time_sep(ab);
      if (t == -2) continue;
      printf("  cuBLAS%s + %s: %.4f ms\n", ab ? "(bias)" : "", p.have_rs[ab] == 2 ? "nothing" : "row kernel", t);
      if (t > 0 && (t_sep < 0 || t < t_sep)) {
        t_sep = t, sep_ab = ab;
        sep_how = std::string(ab ? "cuBLASLt(bias)" : "cuBLASLt") + (p.have_rs[ab] == 2 ? "" : " + row kernel");
      }
    }
    // cuBLASLt's own fused GELU epilogues (tanh-approximated GELU, not evt's erf one: a timing reference of what
    // the library achieves with the same memory traffic, no output check): fc1 forward bias + GELU + aux as
    // GELU_AUX_BIAS (D = gelu(acc + bias), aux = acc + bias), the GELU backward with its bias gradient as
    // DGELU_BGRAD (D = acc · gelu'(aux), bias = Σ_M D)
    {
      cublasLtEpilogue_t le = CUBLASLT_EPILOGUE_DEFAULT;
      const char *lname_ = nullptr;
      if (c.epi == "bias_gelu_aux" || c.epi == "bias_gelut_aux") le = CUBLASLT_EPILOGUE_GELU_AUX_BIAS, lname_ = "GELU_AUX_BIAS";
      if (c.epi == "gelu_bwd_dbias" || c.epi == "gelut_bwd_dbias") le = CUBLASLT_EPILOGUE_DGELU_BGRAD, lname_ = "DGELU_BGRAD";
      if (c.epi == "gelu_bwd") le = CUBLASLT_EPILOGUE_DGELU, lname_ = "DGELU";
      if (lname_) {
        void *lbias = nullptr, *laux = nullptr;
        CUDA_CHECK(cudaMalloc(&lbias, (size_t)N * dbytes(s.ab_dtype) + 256));
        CUDA_CHECK(cudaMalloc(&laux, (size_t)(M * N) * dbytes(s.ab_dtype) + 256));
        CUDA_CHECK(cudaMemset(lbias, 0, (size_t)N * dbytes(s.ab_dtype)));
        CUDA_CHECK(cudaMemset(laux, 0, (size_t)(M * N) * dbytes(s.ab_dtype)));
        Lt lt;
        double t = -1;
        if (lt.init(c.M, c.N, c.K, c.layout, s.ab_dtype, s.ab_dtype, le == CUBLASLT_EPILOGUE_DGELU ? nullptr : lbias,
                    le, laux))
          t = median_ms([&] { return lt.run(A, B, T); }, reps);
        printf("  cuBLASLt %s (its tanh GELU; reference, not checked): %s%.4f ms (%.3fx cuBLAS plain)\n", lname_,
               t < 0 ? "unsupported " : "", t, t > 0 && t_plain > 0 ? t / t_plain : 0.0);
        cudaFree(lbias);
        cudaFree(laux);
      }
    }
    // evt: every compiled config x scheduler variant
    int sv[16][2];
    int nsv = evt_tune_sched_variants(M, N, sv, 16);
    if (getenv("BENCH_TUNE_NSV") && atoi(getenv("BENCH_TUNE_NSV")) > 0) nsv = std::min(nsv, atoi(getenv("BENCH_TUNE_NSV")));
    double t_def = -1, t_best = -1;
    std::string best_lab = "-";
    evt_tile_config best_cfg = EVT_TILE_CONFIG_DEFAULT;
    int best_sw = 0, best_r = 0;
    std::string best_name;
    for (size_t ci = 0; ci < p.cfgs.size(); ci++) {
      evt_launch_fn fn = (evt_launch_fn)g_kern[p.kname[ci]].fn;
      char lab[96];
      evt_tile_config_label(&p.cfgs[ci], lab, sizeof lab);
      if (!fn) {
        printf("  %-34s not compiled\n", lab);
        continue;
      }
      for (int vi = 0; vi < (ci == 0 ? nsv : nsv); vi++) {
        evt_launch_args a;
        memset(&a, 0, sizeof a);
        a.m = c.M, a.n = c.N, a.k = c.K, a.a = A, a.b = B, a.d = D;
        for (int v = 0; v < s.nnodes; v++) a.ptrs[v] = dmem[v];
        a.swizzle = sv[vi][0], a.raster = sv[vi][1];
        int rc = 0;
        double t = median_ms([&] { return (rc = fn(&a)) == 0; }, reps);
        printf("  %-34s swz %d raster %d: %s%.4f ms\n", lab, sv[vi][0], sv[vi][1], t < 0 ? "FAILED " : "", t);
        if (t < 0) {
          printf("    launcher returned %d\n", rc);
          break;
        }
        if (ci == 0 && vi == 0) t_def = t;
        if (t_best < 0 || t < t_best) {
          t_best = t, best_cfg = p.cfgs[ci], best_sw = sv[vi][0], best_r = sv[vi][1], best_name = p.kname[ci];
          char b2[160];
          snprintf(b2, sizeof b2, "%s swz%d r%d", lab, sv[vi][0], sv[vi][1]);
          best_lab = b2;
        }
      }
      fflush(stdout);
    }
    // Interleaved rounds (BENCH_TUNE_ROUNDS, default 6: each of the three takes each slot of a round twice; 0: none):
    // cuBLAS plain, the faster separate pair and evt's best config timed again side by side, their order rotated
    // each round, each a median of `reps` calls; the medians over the rounds compare the three at the same GPU
    // temperature and clocks. (The sweep above times cuBLAS first and evt's configs after it, and the clocks follow
    // the GPU's temperature and power, so times far apart in the sweep are not comparable.)
    double i_plain = -1, i_sep = -1, i_evt = -1;
    int rounds = getenv("BENCH_TUNE_ROUNDS") ? atoi(getenv("BENCH_TUNE_ROUNDS")) : 6;
    if (rounds > 0 && t_best > 0) {
      evt_launch_fn fn = (evt_launch_fn)g_kern[best_name].fn;
      evt_launch_args a;
      memset(&a, 0, sizeof a);
      a.m = c.M, a.n = c.N, a.k = c.K, a.a = A, a.b = B, a.d = D;
      for (int v = 0; v < s.nnodes; v++) a.ptrs[v] = dmem[v];
      a.swizzle = best_sw, a.raster = best_r;
      std::vector<double> tp, ts, te;
      for (int r = 0; r < rounds; r++)
        for (int j = 0; j < 3; j++) switch ((r + j) % 3) {
            case 0: tp.push_back(time_plain()); break;
            case 1: if (sep_ab >= 0) ts.push_back(time_sep(sep_ab)); break;
            default: te.push_back(median_ms([&] { return fn(&a) == 0; }, reps)); break;
          }
      auto med = [](std::vector<double> v) -> double {
        if (v.empty()) return -1;
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
      };
      i_plain = med(tp), i_sep = med(ts), i_evt = med(te);
      printf("  interleaved (%d rounds, medians): cuBLAS %.4f | separate %.4f | evt tuned %.4f -> evt/cuBLAS %.3f, "
             "evt/separate %.3f\n", rounds, i_plain, i_sep, i_evt, i_plain > 0 ? i_evt / i_plain : 0.0,
             i_sep > 0 ? i_evt / i_sep : 0.0);
    }
    // checks: default config (swizzle 1) and the tuned one
    auto check = [&](const std::string &kn, int sw, int r) -> double {
      evt_launch_fn fn = (evt_launch_fn)g_kern[kn].fn;
      if (!fn) return -1;
      evt_launch_args a;
      memset(&a, 0, sizeof a);
      a.m = c.M, a.n = c.N, a.k = c.K, a.a = A, a.b = B, a.d = D;
      for (int v = 0; v < s.nnodes; v++) a.ptrs[v] = dmem[v];
      a.swizzle = sw, a.raster = r;
      CUDA_CHECK(cudaMemset(D, 0xFF, (size_t)(M * N) * dbytes(s.d_dtype)));
      if (fn(&a) != 0 || cudaDeviceSynchronize() != cudaSuccess) return INFINITY;
      auto hd = download(D, (size_t)(M * N) * dbytes(s.d_dtype));
      std::vector<std::vector<unsigned char>> out(s.nnodes);
      const void *mem[EVT_KSPEC_MAX_NODES] = {0};
      for (int v = 0; v < s.nnodes; v++) {
        int64_t e = node_elems(s.nodes[v], M, N);
        if (!e) continue;
        if (evt_vop_class(s.nodes[v].op) == 'L') mem[v] = hmem[v].data();
        else {
          out[v] = download(dmem[v], (size_t)e * dbytes(s.nodes[v].dtype));
          mem[v] = out[v].data();
        }
      }
      int64_t rows[8], cols[8];
      for (int i = 0; i < 8; i++) rows[i] = (M - 1) * i / 7, cols[i] = (N - 1) * (7 - i) / 7 ^ (i & 1);
      for (int i = 0; i < 8; i++) cols[i] = std::min<int64_t>(std::max<int64_t>(cols[i], 0), N - 1);
      return evt_tune_check_sampled(&s, M, N, K, ha.data(), hb.data(), mem, hd.data(), rows, 8, cols, 8);
    };
    double e_def = p.kname.empty() ? -1 : check(p.kname[0], 0, 0);
    double e_best = best_name.empty() ? -1 : check(best_name, best_sw, best_r);
    auto verdict = [](double e) -> std::string {
      if (e < 0) return "not run";
      char b[64];
      snprintf(b, sizeof b, "%s %.1e", e <= 2e-2 ? "matched" : "NOT MATCHED", e);
      return b;
    };
    printf("  check vs CPU reference (8 rows + 8 cols): default %s, tuned %s\n", verdict(e_def).c_str(),
           verdict(e_best).c_str());
    printf("  SUMMARY cuBLAS %.4f | separate %.4f (%s) | evt default %.4f | evt tuned %.4f (%s)\n", t_plain, t_sep,
           sep_how.c_str(), t_def, t_best, best_lab.c_str());
    char r1[32] = "-", r2[32] = "-";
    if (t_plain > 0 && t_best > 0) snprintf(r1, sizeof r1, "%.3f", t_best / t_plain);
    if (t_sep > 0 && t_best > 0) snprintf(r2, sizeof r2, "%.3f", t_best / t_sep);
    char r3[96] = "-";
    if (i_plain > 0 && i_evt > 0)
      snprintf(r3, sizeof r3, "%.4f / %.4f / %.4f: %.3f, %.3f", i_plain, i_sep, i_evt, i_evt / i_plain,
               i_sep > 0 ? i_evt / i_sep : 0.0);
    fprintf(md, "| %s | %dx%dx%d | %s | %s | %.4f | %.4f (%s) | %.4f | %.4f | %s | %s | %s | %s | %s / %s |\n", c.what,
            c.M, c.N, c.K, lname(c.layout), c.epi.c_str(), t_plain, t_sep, sep_how.c_str(), t_def, t_best,
            best_lab.c_str(), r1, r2, r3, verdict(e_def).c_str(), verdict(e_best).c_str());
    fflush(md);
    cudaFree(A), cudaFree(B), cudaFree(D), cudaFree(T);
    for (int v = 0; v < s.nnodes; v++)
      if (dmem[v]) cudaFree(dmem[v]);
  }
  fclose(md);
  return 0;
}
