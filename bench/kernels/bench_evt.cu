// H200 benchmark: GEMM + epilogue, three ways, at 8192^3 and the BERT-large MLP shapes.
//   cublasLt        plain bf16 GEMM (f32 accumulate), D = A·B, heuristic's first algorithm
//   cublasLt+epi    the same GEMM into a bf16 temporary, then one hand-written epilogue kernel
//                   (bias_gelu_aux: z = t + bias, store z, D = gelu_erf(z);
//                    bias_relu_dbias: y = relu(t + bias), store y, dbias = Σ_m y with atomics)
//   cublasLt fused  cuBLASLt's own GELU_AUX_BIAS epilogue (tanh GELU), bias_gelu_aux only
//   evt             the generated CUTLASS Sm90 kernel (initialize + run per call), per tile config
// Timing: 5 warm-ups, then R timed calls each bracketed by CUDA events; median and min reported.
// Each evt result is compared on the GPU with cublasLt+epi's D (relative Frobenius error).
// Usage: bench_evt OUT.json OUT.md [reps]
#include <cublasLt.h>

#include <algorithm>

#include "../../tests/gpu/gpu_util.h"

#define LT_CHECK(x)                                                              \
  do {                                                                           \
    cublasStatus_t s_ = (x);                                                     \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                           \
      fprintf(stderr, "%s:%d: %s failed: %d\n", __FILE__, __LINE__, #x, (int)s_); \
      return false;                                                              \
    }                                                                            \
  } while (0)

struct LtGemm {
  cublasLtHandle_t h = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo;
  void *ws = nullptr;
  size_t ws_bytes = 64 << 20;
  bool ok = false;
  // row-major D[M,N] = A[M,K]·B[K,N] as column-major D^T = B^T·A^T
  bool init(int M, int N, int K, int epilogue, const void *bias, void *aux) {
    LT_CHECK(cublasLtCreate(&h));
    LT_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    if (epilogue) {
      cublasLtEpilogue_t e = (cublasLtEpilogue_t)epilogue;
      LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e));
      LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
      LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
      int64_t ld = N;
      LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld));
    }
    LT_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, N, K, N));
    LT_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, K, M, K));
    LT_CHECK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, N, M, N));
    CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
    cublasLtMatmulPreference_t pref;
    LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                  sizeof ws_bytes));
    cublasLtMatmulHeuristicResult_t res;
    int n = 0;
    LT_CHECK(cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, lc, lc, pref, 1, &res, &n));
    cublasLtMatmulPreferenceDestroy(pref);
    if (n < 1) return false;
    algo = res.algo;
    ok = true;
    return true;
  }
  bool run(const void *A, const void *B, void *D) {
    float alpha = 1.f, beta = 0.f;
    LT_CHECK(cublasLtMatmul(h, op, &alpha, B, la, A, lb, &beta, D, lc, D, lc, &algo, ws, ws_bytes, 0));
    return true;
  }
  ~LtGemm() {
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (op) cublasLtMatmulDescDestroy(op);
    if (h) cublasLtDestroy(h);
    if (ws) cudaFree(ws);
  }
};

// z = t + bias[col]; aux = z; D = gelu_erf(z). 8 bf16 (16 bytes) per thread.
__global__ void epi_bias_gelu_aux(const __nv_bfloat16 *t, const __nv_bfloat16 *bias, __nv_bfloat16 *z,
                                  __nv_bfloat16 *d, int M, int N) {
  size_t n8 = (size_t)M * N / 8;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n8; i += (size_t)gridDim.x * blockDim.x) {
    uint4 tv = reinterpret_cast<const uint4 *>(t)[i];
    int col = (int)((i * 8) % N);
    uint4 bv = *reinterpret_cast<const uint4 *>(bias + col);
    const __nv_bfloat16 *tp = reinterpret_cast<const __nv_bfloat16 *>(&tv);
    const __nv_bfloat16 *bp = reinterpret_cast<const __nv_bfloat16 *>(&bv);
    uint4 zv, dv;
    __nv_bfloat16 *zp = reinterpret_cast<__nv_bfloat16 *>(&zv), *dp = reinterpret_cast<__nv_bfloat16 *>(&dv);
#pragma unroll
    for (int j = 0; j < 8; j++) {
      float x = __bfloat162float(tp[j]) + __bfloat162float(bp[j]);
      zp[j] = __float2bfloat16(x);
      dp[j] = __float2bfloat16(0.5f * x * (1.f + erff(x * 0.70710678118654752f)));
    }
    reinterpret_cast<uint4 *>(z)[i] = zv;
    reinterpret_cast<uint4 *>(d)[i] = dv;
  }
}

// y = relu(t + bias[col]); D = y; dbias[col] += Σ over this block's rows. Block (128, 8): threadIdx.x owns
// 8 columns (16 bytes), the 8 threadIdx.y rows of a block interleave over its `rows_per_block` rows;
// the 8 partial sums meet in shared memory, then one atomicAdd per column and block.
__global__ void __launch_bounds__(1024) epi_bias_relu_dbias(const __nv_bfloat16 *t, const __nv_bfloat16 *bias,
                                                            __nv_bfloat16 *d, float *dbias, int M, int N,
                                                            int rows_per_block) {
  __shared__ float part[8][128 * 8];
  int col = (blockIdx.x * 128 + threadIdx.x) * 8;
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (col < N) {
    uint4 bv = *reinterpret_cast<const uint4 *>(bias + col);
    const __nv_bfloat16 *bp = reinterpret_cast<const __nv_bfloat16 *>(&bv);
    int r0 = blockIdx.y * rows_per_block, r1 = min(M, r0 + rows_per_block);
#pragma unroll 2
    for (int r = r0 + threadIdx.y; r < r1; r += 8) {
      size_t off = (size_t)r * N + col;
      uint4 tv = *reinterpret_cast<const uint4 *>(t + off);
      const __nv_bfloat16 *tp = reinterpret_cast<const __nv_bfloat16 *>(&tv);
      uint4 dv;
      __nv_bfloat16 *dp = reinterpret_cast<__nv_bfloat16 *>(&dv);
#pragma unroll
      for (int j = 0; j < 8; j++) {
        float y = fmaxf(__bfloat162float(tp[j]) + __bfloat162float(bp[j]), 0.f);
        dp[j] = __float2bfloat16(y);
        acc[j] += y;
      }
      *reinterpret_cast<uint4 *>(d + off) = dv;
    }
  }
#pragma unroll
  for (int j = 0; j < 8; j++) part[threadIdx.y][threadIdx.x * 8 + j] = acc[j];
  __syncthreads();
  if (threadIdx.y == 0 && col < N) {
#pragma unroll
    for (int j = 0; j < 8; j++) {
      float sum = 0;
#pragma unroll
      for (int y = 0; y < 8; y++) sum += part[y][threadIdx.x * 8 + j];
      atomicAdd(&dbias[col + j], sum);
    }
  }
}

__global__ void diff_kernel(const __nv_bfloat16 *x, const __nv_bfloat16 *ref, size_t n, double *sums) {
  double num = 0, den = 0, bad = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    float a = __bfloat162float(x[i]), b = __bfloat162float(ref[i]);
    if (!isfinite(a)) bad += 1;
    double dd = (double)a - b;
    num += dd * dd;
    den += (double)b * b;
  }
  atomicAdd(&sums[0], num);
  atomicAdd(&sums[1], den);
  atomicAdd(&sums[2], bad);
}

static double gpu_rel_err(const __nv_bfloat16 *x, const __nv_bfloat16 *ref, size_t n) {
  double *s;
  CUDA_CHECK(cudaMalloc(&s, 3 * sizeof(double)));
  CUDA_CHECK(cudaMemset(s, 0, 3 * sizeof(double)));
  diff_kernel<<<1024, 256>>>(x, ref, n, s);
  double h[3];
  CUDA_CHECK(cudaMemcpy(h, s, sizeof h, cudaMemcpyDeviceToHost));
  cudaFree(s);
  if (h[2] > 0) return INFINITY;
  return sqrt(h[0] / (h[1] > 0 ? h[1] : 1));
}

struct Timing {
  double med = NAN, mn = NAN;
};

template <class F>
static Timing time_it(F &&f, int reps) {
  for (int i = 0; i < 5; i++)
    if (!f()) return Timing{};
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<cudaEvent_t> ev(2 * reps);
  for (auto &e : ev) CUDA_CHECK(cudaEventCreate(&e));
  for (int i = 0; i < reps; i++) {
    CUDA_CHECK(cudaEventRecord(ev[2 * i]));
    if (!f()) return Timing{};
    CUDA_CHECK(cudaEventRecord(ev[2 * i + 1]));
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaGetLastError());
  std::vector<float> ms(reps);
  for (int i = 0; i < reps; i++) CUDA_CHECK(cudaEventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]));
  for (auto &e : ev) cudaEventDestroy(e);
  std::sort(ms.begin(), ms.end());
  return Timing{ms[reps / 2], ms[0]};
}

struct Row {
  std::string shape, epilogue, method, config;
  Timing t;
  double tflops, err;
  Timing t2;  // the same measurement in the second pass
};

static std::string json_escape(const std::string &in) {
  std::string o;
  for (char c : in) {
    if (c == '"' || c == '\\') o += '\\', o += c;
    else if (c == '\n') o += "\\n";
    else if ((unsigned char)c >= 32) o += c;
  }
  return o;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: bench_evt OUT.json OUT.md [reps]\n");
    return 2;
  }
  int reps = argc > 3 ? atoi(argv[3]) : 30;
  std::vector<KernelCase> cases = all_cases();
  jit_load(cases);
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  int drv = 0, rt = 0;
  cudaDriverGetVersion(&drv);
  cudaRuntimeGetVersion(&rt);
  const int shapes[][3] = {{8192, 8192, 8192}, {8192, 1024, 4096}, {8192, 4096, 1024}};
  std::vector<Row> rows;
  size_t ri = 0;
  int pass = 0;
  auto add = [&](Row r) {
    if (pass == 0) rows.push_back(r);
    else {
      rows[ri].t2 = r.t;
      rows[ri].err = std::isnan(rows[ri].err) ? r.err : std::max(rows[ri].err, r.err);
    }
    ri++;
  };
  for (pass = 0; pass < 2; pass++)
  for (auto &sh : shapes) {
    if (&sh == &shapes[0]) ri = 0;
    int M = sh[0], N = sh[1], K = sh[2];
    char shape[64];
    snprintf(shape, sizeof shape, "%dx%dx%d", M, N, K);
    double flop = 2.0 * M * N * K;
    Rng rng(M + N + K);
    std::vector<__nv_bfloat16> ha, hb, hbias;
    std::vector<double> tmp;
    fill_bf16(ha, tmp, (size_t)M * K, rng, -1.f, 1.f);
    fill_bf16(hb, tmp, (size_t)K * N, rng, -1.f, 1.f);
    fill_bf16(hbias, tmp, (size_t)N, rng, -1.f, 1.f);
    __nv_bfloat16 *A = dev_upload(ha), *B = dev_upload(hb), *bias = dev_upload(hbias);
    size_t mn = (size_t)M * N;
    __nv_bfloat16 *T, *D, *Z, *Dref, *Zref;
    float *dbias, *dbias_ref;
    CUDA_CHECK(cudaMalloc(&T, mn * 2));
    CUDA_CHECK(cudaMalloc(&D, mn * 2));
    CUDA_CHECK(cudaMalloc(&Z, mn * 2));
    CUDA_CHECK(cudaMalloc(&Dref, mn * 2));
    CUDA_CHECK(cudaMalloc(&Zref, mn * 2));
    CUDA_CHECK(cudaMalloc(&dbias, N * 4));
    CUDA_CHECK(cudaMalloc(&dbias_ref, N * 4));

    LtGemm lt;
    bool lt_ok = lt.init(M, N, K, 0, nullptr, nullptr);
    Timing t;
    if (lt_ok) {
      t = time_it([&] { return lt.run(A, B, Dref); }, reps);
      add({shape, "plain", "cublasLt", "heuristic #1", t, flop / t.med / 1e9, NAN});
    }
    for (const char *epi : {"bias_gelu_aux", "bias_relu_dbias"}) {
      bool gelu = !strcmp(epi, "bias_gelu_aux");
      // about 4 blocks of 1024 threads per SM, at least 64 rows per block (few atomics per column)
      int bx = (N / 8 + 127) / 128;
      int rpb = std::max(64, (int)((long)M * bx / (prop.multiProcessorCount * 4)));
      dim3 rgrid(bx, (M + rpb - 1) / rpb), rblock(128, 8);
      auto unfused = [&] {
        if (!lt.run(A, B, T)) return false;
        if (gelu)
          epi_bias_gelu_aux<<<prop.multiProcessorCount * 8, 256>>>(T, bias, Zref, Dref, M, N);
        else {
          cudaMemsetAsync(dbias_ref, 0, N * 4);
          epi_bias_relu_dbias<<<rgrid, rblock>>>(T, bias, Dref, dbias_ref, M, N, rpb);
        }
        return cudaPeekAtLastError() == cudaSuccess;
      };
      if (lt_ok) {
        t = time_it(unfused, reps);
        add({shape, epi, "cublasLt + epilogue kernel", "heuristic #1", t, flop / t.med / 1e9, NAN});
      }
      if (gelu) {
        LtGemm ltf;
        if (ltf.init(M, N, K, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, bias, Z)) {
          t = time_it([&] { return ltf.run(A, B, D); }, reps);
          double e = gpu_rel_err(D, Dref, mn);
          add({shape, epi, "cublasLt fused GELU_AUX_BIAS (tanh)", "heuristic #1", t, flop / t.med / 1e9, e});
        } else {
          fprintf(stderr, "cublasLt GELU_AUX_BIAS: no algorithm for %s\n", shape);
        }
      }
      for (auto &kc : cases) {
        if (kc.epilogue != epi || kc.layout != EVT_LAYOUT_NN || !kc.fn) continue;
        evt_launch_args a;
        memset(&a, 0, sizeof a);
        a.m = M, a.n = N, a.k = K, a.a = A, a.b = B, a.d = D;
        for (int v = 0; v < kc.spec.nnodes; v++) {
          evt_vop op = kc.spec.nodes[v].op;
          if (op == EVT_V_ROW_BCAST) a.ptrs[v] = bias;
          if (op == EVT_V_AUX_STORE) a.ptrs[v] = Z;
          if (op == EVT_V_ROW_SUM) a.ptrs[v] = dbias;
        }
        CUDA_CHECK(cudaMemset(D, 0xFF, mn * 2));
        t = time_it([&] { return kc.fn(&a) == 0; }, reps);
        // the last run's outputs against the unfused pipeline's (run once more so both are fresh)
        unfused();
        kc.fn(&a);
        CUDA_CHECK(cudaDeviceSynchronize());
        double e = gpu_rel_err(D, Dref, mn);
        if (!gelu) {
          std::vector<float> h1(N), h2(N);
          CUDA_CHECK(cudaMemcpy(h1.data(), dbias, N * 4, cudaMemcpyDeviceToHost));
          CUDA_CHECK(cudaMemcpy(h2.data(), dbias_ref, N * 4, cudaMemcpyDeviceToHost));
          double num = 0, den = 0;
          for (int i = 0; i < N; i++) num += (double)(h1[i] - h2[i]) * (h1[i] - h2[i]), den += (double)h2[i] * h2[i];
          double ed = std::isfinite(num) ? sqrt(num / den) : INFINITY;
          e = std::max(e, ed);
        } else {
          e = std::max(e, gpu_rel_err(Z, Zref, mn));
        }
        add({shape, epi, "evt fused", cfg_label(kc.cfg), t, flop / t.med / 1e9, e});
      }
    }
    for (auto &kc : cases) {  // CUTLASS mainloop alone (D = acc), per config
      if (kc.epilogue != "plain" || kc.layout != EVT_LAYOUT_NN || !kc.fn) continue;
      evt_launch_args a;
      memset(&a, 0, sizeof a);
      a.m = M, a.n = N, a.k = K, a.a = A, a.b = B, a.d = D;
      t = time_it([&] { return kc.fn(&a) == 0; }, reps);
      lt.run(A, B, Dref);
      CUDA_CHECK(cudaDeviceSynchronize());
      double e = gpu_rel_err(D, Dref, mn);
      add({shape, "plain", "evt (CUTLASS, D = acc)", cfg_label(kc.cfg), t, flop / t.med / 1e9, e});
    }
    for (void *p : {(void *)A, (void *)B, (void *)bias, (void *)T, (void *)D, (void *)Z, (void *)Dref, (void *)Zref,
                    (void *)dbias, (void *)dbias_ref})
      cudaFree(p);
  }
  FILE *js = fopen(argv[1], "w"), *md = fopen(argv[2], "w");
  if (!js || !md) {
    fprintf(stderr, "cannot write outputs\n");
    return 2;
  }
  std::string cmd;
  for (int i = 0; i < argc; i++) cmd += std::string(i ? " " : "") + argv[i];
  if (getenv("EVT_BENCH_COMMAND")) cmd = getenv("EVT_BENCH_COMMAND");
  std::string machine;
  if (const char *mf = getenv("EVT_MACHINE_FILE"))
    if (FILE *f = fopen(mf, "r")) {
      char line[512];
      while (fgets(line, sizeof line, f)) machine += line;
      fclose(f);
    }
  fprintf(js,
          "{\n  \"command\": \"%s\",\n  \"machine\": \"%s\",\n  \"device\": \"%s\", \"sms\": %d, \"driver\": %d, "
          "\"runtime\": %d, \"reps\": %d, \"passes\": 2,\n  \"results\": [\n",
          json_escape(cmd).c_str(), json_escape(machine).c_str(), prop.name, prop.multiProcessorCount, drv, rt, reps);
  fprintf(md,
          "Device: %s (%d SMs), CUDA driver %d, runtime %d. Each row: median of %d timed calls after 5 warm-ups, "
          "measured in two passes over the whole table (pass 1, pass 2); TFLOP/s from the faster median.\n"
          "Command: `%s`\n\n",
          prop.name, prop.multiProcessorCount, drv, rt, reps, cmd.c_str());
  fprintf(md, "| M×N×K | epilogue | method | config | median ms pass 1 | median ms pass 2 | min ms | TFLOP/s | rel err vs unfused |\n");
  fprintf(md, "|---|---|---|---|---:|---:|---:|---:|---:|\n");
  for (size_t i = 0; i < rows.size(); i++) {
    Row &r = rows[i];
    double best = std::min(r.t.med, r.t2.med);
    r.tflops = r.tflops * r.t.med / best;  // tflops was computed from pass 1's median
    char jerr[32];
    if (std::isnan(r.err))
      snprintf(jerr, sizeof jerr, "null");
    else if (std::isinf(r.err))
      snprintf(jerr, sizeof jerr, "\"inf\"");
    else
      snprintf(jerr, sizeof jerr, "%.3e", r.err);
    fprintf(js,
            "    {\"shape\": \"%s\", \"epilogue\": \"%s\", \"method\": \"%s\", \"config\": \"%s\", \"median_ms\": %.4f, "
            "\"median_ms_pass2\": %.4f, \"min_ms\": %.4f, \"tflops\": %.1f, \"rel_err\": %s}%s\n",
            r.shape.c_str(), r.epilogue.c_str(), r.method.c_str(), r.config.c_str(), r.t.med, r.t2.med,
            std::min(r.t.mn, r.t2.mn), r.tflops, jerr, i + 1 < rows.size() ? "," : "");
    char err[32];
    if (std::isnan(r.err))
      snprintf(err, sizeof err, "–");
    else
      snprintf(err, sizeof err, "%.2e", r.err);
    fprintf(md, "| %s | %s | %s | %s | %.3f | %.3f | %.3f | %.0f | %s |\n", r.shape.c_str(), r.epilogue.c_str(),
            r.method.c_str(), r.config.c_str(), r.t.med, r.t2.med, std::min(r.t.mn, r.t2.mn), r.tflops, err);
    printf("%-15s %-15s %-30s %-21s %7.3f %7.3f ms %4.0f TFLOP/s err %s\n", r.shape.c_str(), r.epilogue.c_str(),
           r.method.c_str(), r.config.c_str(), r.t.med, r.t2.med, r.tflops, err);
  }
  fprintf(js, "  ]\n}\n");
  fclose(js);
  fclose(md);
  return 0;
}
