// GPU check of generated batched GEMM + epilogue-visitor-tree kernels (kspec batch mode) against the CPU reference
// (evt_kspec_reference_batched), per batch; tests/gpu/run.sh runs `check_bmm --no-bench`.
// Epilogues: bmm_plain (NN / NT / TN), bmm_scale NT (attention scores q·k^T/8), bmm_scale_mask_stats NT (scale,
// per-batch aux mask, shared bias, per-batch Σ_n and shared Σ_m,batch), bmm_softmax_bwd NN. Fresh random bf16 data,
// NaN-poisoned outputs, two runs (initialize() must reset atomic sums); D and every stored tensor within a relative
// Frobenius error of 1e-2 (NaN never passes). Layouts: packed (every stride 0); heads of [B,S,H,D] tensors (two
// batch levels: l_outer = B, l = H, ld = H*D, bs = D, os = S*H*D); padded (leading dims and batch strides larger
// than packed). Without --no-bench it first times BERT-large attention shapes against cuBLAS.
// Prints "ok"/"FAIL" lines and "N passed, N failed".
#include <cublas_v2.h>

#include <algorithm>

#include "gpu_util.h"

#include "check_report.h"

static double rel_err(const std::vector<double> &out, const std::vector<double> &ref, double *maxabs) {
  double num = 0, den = 0;
  *maxabs = 0;
  for (size_t i = 0; i < out.size(); i++) {
    if (!std::isfinite(out[i])) {
      *maxabs = INFINITY;
      return INFINITY;
    }
    double d = out[i] - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
    *maxabs = std::max(*maxabs, fabs(d));
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

static double to_double(const unsigned char *p, evt_dtype dt) {
  if (dt == EVT_F32) {
    float f;
    memcpy(&f, p, 4);
    return f;
  }
  if (dt == EVT_F16) {
    __half h;
    memcpy(&h, p, 2);
    return __half2float(h);
  }
  __nv_bfloat16 h;
  memcpy(&h, p, 2);
  return __bfloat162float(h);
}

// Where one stored matrix (rows × cols per batch) or vector lies: element (o, i, r, c) at
// o*os + i*bs + r*ld + c. Every value explicit (the packed test passes 0s to the launcher but the
// host uses the same packed values).
struct Place {
  int64_t ld, bs, os;
};

struct Buf {
  evt_dtype dt;
  std::vector<unsigned char> host;  // the whole buffer (random for loads, downloaded for outputs)
  void *dev = nullptr;
  size_t elems = 0;
};

static void buf_alloc(Buf &b, evt_dtype dt, size_t elems, Rng &rng, bool load, float lim) {
  b.dt = dt;
  b.elems = elems;
  std::vector<double> tmp;
  if (load)
    b.host = fill_dtype(dt, elems, rng, -lim, lim, tmp);
  else
    b.host.assign(elems * dtype_bytes(dt), 0xFF);  // NaN poison
  CUDA_CHECK(cudaMalloc(&b.dev, b.host.size() + 16));
  CUDA_CHECK(cudaMemcpy(b.dev, b.host.data(), b.host.size(), cudaMemcpyHostToDevice));
}

static void buf_download(Buf &b) {
  CUDA_CHECK(cudaMemcpy(b.host.data(), b.dev, b.host.size(), cudaMemcpyDeviceToHost));
}

static double buf_at(const Buf &b, int64_t idx) { return to_double(&b.host[(size_t)idx * dtype_bytes(b.dt)], b.dt); }

// gather a rows × cols matrix of batch (o, i) into a packed vector
static void gather(const Buf &b, const Place &p, int64_t o, int64_t i, int64_t rows, int64_t cols, double *out) {
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++) out[r * cols + c] = buf_at(b, o * p.os + i * p.bs + r * p.ld + c);
}

static size_t extent(const Place &p, int64_t lo, int64_t l, int64_t rows, int64_t cols) {
  return (size_t)((lo - 1) * p.os + (l - 1) * p.bs + (rows - 1) * p.ld + cols);
}

struct Result {
  std::string label;
  bool ok;
  double err;
};
static std::vector<Result> g_results;

// Runs kc over [lo, l, M, N, K] with operands placed by `mode` ("packed", "heads", "padded"), checks the
// batches in `check` (all if empty), returns the launcher rc (and times it if ms != nullptr).
static int run_case(const KernelCase &kc, const char *mode, int64_t lo, int64_t l, int64_t M, int64_t N, int64_t K,
                    uint64_t seed, std::vector<int64_t> check, double *ms = nullptr, int reps = 0) {
  const evt_kspec &s = kc.spec;
  Rng rng(seed);
  int at = s.layout == EVT_LAYOUT_TN, bt = s.layout == EVT_LAYOUT_NT;
  int64_t ar = at ? K : M, ac = at ? M : K, br = bt ? N : K, bc = bt ? K : N;
  bool heads = !strcmp(mode, "heads"), padded = !strcmp(mode, "padded"), packed = !strcmp(mode, "packed");
  // heads: every matrix is one head of a [lo, rows, l, cols] tensor (rows apart by l*cols)
  auto place = [&](int64_t rows, int64_t cols) -> Place {
    if (heads) return Place{l * cols, cols, rows * l * cols};
    if (padded) return Place{cols + 8, rows * (cols + 8) + 64, 0};
    return Place{cols, rows * cols, l * rows * cols};
  };
  auto vplace = [&](int64_t len, bool shared) -> Place {
    if (shared) return Place{0, 0, 0};
    if (padded) return Place{0, len + 16, 0};
    return Place{0, len, l * len};
  };
  Place pa = place(ar, ac), pb = place(br, bc), pd = place(M, N);
  Buf A, B, D;
  buf_alloc(A, s.ab_dtype, extent(pa, lo, l, ar, ac), rng, true, 1.f);
  buf_alloc(B, s.ab_dtype, extent(pb, lo, l, br, bc), rng, true, 1.f);
  buf_alloc(D, s.d_dtype, extent(pd, lo, l, M, N), rng, false, 0);
  evt_launch_args args;
  memset(&args, 0, sizeof args);
  args.m = (int)M, args.n = (int)N, args.k = (int)K, args.l = (int)l, args.l_outer = (int)lo;
  args.a = A.dev, args.b = B.dev, args.d = D.dev;
  if (!packed) {
    args.lda = pa.ld, args.bs_a = pa.bs, args.os_a = pa.os;
    args.ldb = pb.ld, args.bs_b = pb.bs, args.os_b = pb.os;
    args.ldd = pd.ld, args.bs_d = pd.bs, args.os_d = pd.os;
  } else {
    args.os_a = pa.os, args.os_b = pb.os, args.os_d = pd.os;  // outer strides have no default
  }
  std::vector<Buf> nb(s.nnodes);
  std::vector<Place> np(s.nnodes);
  for (int v = 0; v < s.nnodes; v++) {
    const evt_vnode &nd = s.nodes[v];
    if (!evt_vop_has_memory(nd.op)) continue;
    bool tile = nd.op == EVT_V_AUX_LOAD || nd.op == EVT_V_AUX_STORE;
    np[v] = tile ? (nd.shared ? Place{N, 0, 0} : place(M, N)) : vplace(evt_vnode_numel(&s, v, M, N), nd.shared);
    int64_t rows = tile ? M : 1, cols = tile ? N : evt_vnode_numel(&s, v, M, N);
    size_t n = nd.shared ? (size_t)(rows * cols) : extent(np[v], lo, l, rows, cols);
    buf_alloc(nb[v], nd.dtype, n, rng, evt_vop_class(nd.op) == 'L', nd.op == EVT_V_AUX_LOAD ? 3.f : 1.f);
    args.ptrs[v] = nb[v].dev;
    if (!packed) args.ld_ptrs[v] = tile ? np[v].ld : 0, args.bs_ptrs[v] = np[v].bs;
    args.os_ptrs[v] = np[v].os;
  }
  int rc = 0;
  for (int rep = 0; rep < 2 && rc == 0; rep++) {
    rc = kc.fn(&args);
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaGetLastError());
  }
  if (rc == 0 && ms && reps > 0) {
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    CUDA_CHECK(cudaEventRecord(e0));
    for (int r = 0; r < reps; r++) kc.fn(&args);
    CUDA_CHECK(cudaEventRecord(e1));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float t;
    CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
    *ms = t / reps;
  }
  char label[160];
  snprintf(label, sizeof label, "%s %s [%lldx%lld]x%lldx%lldx%lld", kc.label.c_str(), mode, (long long)lo, (long long)l,
           (long long)M, (long long)N, (long long)K);
  if (rc != 0) {
    report(false, "%s: launcher returned %d", label, rc);
    g_results.push_back({label, false, INFINITY});
  } else {
    buf_download(D);
    for (int v = 0; v < s.nnodes; v++)
      if (nb[v].dev && evt_vop_class(s.nodes[v].op) == 'S') buf_download(nb[v]);
    bool all = check.empty();
    if (all)
      for (int64_t b = 0; b < lo * l; b++) check.push_back(b);
    // per batch: gather operands, reference with l = 1, compare D and per-batch stores; shared sums are
    // accumulated over the batches (compared only when every batch was checked)
    std::vector<double> a(ar * ac), bm(br * bc), dref(M * N), dgot(M * N);
    std::vector<std::vector<double>> tin(s.nnodes), tref(s.nnodes), sharedsum(s.nnodes);
    double worst = 0, mx = 0;
    bool ok = true;
    for (int64_t bi : check) {
      int64_t o = bi / l, i = bi % l;
      gather(A, pa, o, i, ar, ac, a.data());
      gather(B, pb, o, i, br, bc, bm.data());
      std::vector<double *> t(s.nnodes, nullptr);
      for (int v = 0; v < s.nnodes; v++) {
        if (!nb[v].dev) continue;
        bool tile = s.nodes[v].op == EVT_V_AUX_LOAD || s.nodes[v].op == EVT_V_AUX_STORE;
        int64_t rows = tile ? M : 1, cols = tile ? N : evt_vnode_numel(&s, v, M, N);
        tin[v].assign(rows * cols, 0);
        if (evt_vop_class(s.nodes[v].op) == 'L') {
          Place p = s.nodes[v].shared ? Place{cols, 0, 0} : np[v];
          gather(nb[v], p, s.nodes[v].shared ? 0 : o, s.nodes[v].shared ? 0 : i, rows, cols, tin[v].data());
        }
        t[v] = tin[v].data();
      }
      evt_kspec_reference_batched(&s, 1, M, N, K, a.data(), bm.data(), t.data(), dref.data());
      gather(D, pd, o, i, M, N, dgot.data());
      double e = rel_err(dgot, dref, &mx);
      worst = std::max(worst, e);
      ok &= e <= 1e-2;
      for (int v = 0; v < s.nnodes; v++) {
        if (!nb[v].dev || evt_vop_class(s.nodes[v].op) != 'S') continue;
        if (s.nodes[v].shared) {
          if (sharedsum[v].empty()) sharedsum[v].assign(tin[v].size(), 0);
          for (size_t j = 0; j < tin[v].size(); j++) sharedsum[v][j] += tin[v][j];
          continue;
        }
        bool tile = s.nodes[v].op == EVT_V_AUX_STORE;
        int64_t rows = tile ? M : 1, cols = tile ? N : evt_vnode_numel(&s, v, M, N);
        std::vector<double> got(rows * cols);
        gather(nb[v], np[v], o, i, rows, cols, got.data());
        double ev = rel_err(got, tin[v], &mx);
        worst = std::max(worst, ev);
        ok &= ev <= 1e-2;
      }
    }
    for (int v = 0; v < s.nnodes && all; v++) {
      if (sharedsum[v].empty()) continue;
      std::vector<double> got(sharedsum[v].size());
      for (size_t j = 0; j < got.size(); j++) got[j] = buf_at(nb[v], (int64_t)j);
      double ev = rel_err(got, sharedsum[v], &mx);
      worst = std::max(worst, ev);
      ok &= ev <= 1e-2;
    }
    report(ok, "%s: %s, max rel err %.3e over %zu batches (D and every store)", label, ok ? "matched" : "NOT matched",
           worst, check.size());
    g_results.push_back({label, ok, worst});
  }
  cudaFree(A.dev), cudaFree(B.dev), cudaFree(D.dev);
  for (auto &b : nb)
    if (b.dev) cudaFree(b.dev);
  return rc;
}

// cuBLAS strided batched, row-major D[M,N] = alpha · A[M,K]·B[K,N] per batch (bf16, f32 compute).
static double time_cublas(cublasHandle_t h, evt_gemm_layout lay, int64_t L, int64_t M, int64_t N, int64_t K,
                          float alpha, int reps) {
  void *A, *B, *D;
  CUDA_CHECK(cudaMalloc(&A, (size_t)L * M * K * 2));
  CUDA_CHECK(cudaMalloc(&B, (size_t)L * K * N * 2));
  CUDA_CHECK(cudaMalloc(&D, (size_t)L * M * N * 2));
  CUDA_CHECK(cudaMemset(A, 0, (size_t)L * M * K * 2));
  CUDA_CHECK(cudaMemset(B, 0, (size_t)L * K * N * 2));
  float beta = 0;
  // column-major view: D^T (N×M) = B^T (N×K) · A^T (K×M)
  cublasOperation_t ob = lay == EVT_LAYOUT_NT ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t oa = lay == EVT_LAYOUT_TN ? CUBLAS_OP_T : CUBLAS_OP_N;
  int ldb = lay == EVT_LAYOUT_NT ? (int)K : (int)N, lda = lay == EVT_LAYOUT_TN ? (int)M : (int)K;
  auto call = [&]() {
    return cublasGemmStridedBatchedEx(h, ob, oa, (int)N, (int)M, (int)K, &alpha, B, CUDA_R_16BF, ldb, K * N, A,
                                      CUDA_R_16BF, lda, M * K, &beta, D, CUDA_R_16BF, (int)N, M * N, (int)L,
                                      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  };
  double ms = -1;
  if (call() == CUBLAS_STATUS_SUCCESS) {
    for (int i = 0; i < 3; i++) call();
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    CUDA_CHECK(cudaEventRecord(e0));
    for (int r = 0; r < reps; r++) call();
    CUDA_CHECK(cudaEventRecord(e1));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float t;
    CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
    ms = t / reps;
  }
  cudaFree(A), cudaFree(B), cudaFree(D);
  return ms;
}

int main(int argc, char **argv) {
  bool bench = !(argc > 1 && !strcmp(argv[1], "--no-bench"));
  std::vector<KernelCase> cases;
  cases.push_back(make_case("bmm_plain", kCfg128, EVT_LAYOUT_NN));
  cases.push_back(make_case("bmm_plain", kCfg128, EVT_LAYOUT_NT));
  cases.push_back(make_case("bmm_plain", kCfg128, EVT_LAYOUT_TN));
  cases.push_back(make_case("bmm_scale", kCfg128, EVT_LAYOUT_NT));
  cases.push_back(make_case("bmm_scale_mask_stats", kCfg128, EVT_LAYOUT_NT));
  cases.push_back(make_case("bmm_softmax_bwd", kCfg128, EVT_LAYOUT_NN));
  // the same attention GEMMs with tiles that fit their shapes (context N = 64; scores N = 512)
  const evt_tile_config cfg128x64 = {128, 64, 64, 1, 1, EVT_SCHED_COOPERATIVE};
  cases.push_back(make_case("bmm_plain", cfg128x64, EVT_LAYOUT_NN));
  cases.push_back(make_case("bmm_scale", kCfg128x256c1x1, EVT_LAYOUT_NT));
  jit_load(cases);
  uint64_t seed = 11;
  // timing first (without --no-bench)
  if (bench) {
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
      printf("cublasCreate failed\n");
      return 2;
    }
    const int reps = 20;
    struct Row {
      std::string what;
      double evt_ms, cublas_ms;
    };
    std::vector<Row> rows;
    const int64_t Bt = 32, H = 16, S = 512, Dh = 64, L = Bt * H;
    std::vector<int64_t> sample = {0, 1, 257, L - 1};
    // shape-fitting tiles first, then the 128x128 ones
    const int order[] = {6, 7, 3, 0, 1};
    for (int oi : order) {
      KernelCase &kc = cases[oi];
      if (!kc.fn) continue;
      bool scores = kc.epilogue == "bmm_scale" || (kc.epilogue == "bmm_plain" && kc.layout == EVT_LAYOUT_NT);
      bool ctx = kc.epilogue == "bmm_plain" && kc.layout == EVT_LAYOUT_NN;
      if (!scores && !ctx) continue;
      int64_t M = S, N = scores ? S : Dh, K = scores ? Dh : S;
      double ms = -1;
      run_case(kc, "packed", 1, L, M, N, K, seed++, sample, &ms, reps);
      double cb = time_cublas(h, kc.layout, L, M, N, K, kc.epilogue == "bmm_scale" ? 0.125f : 1.f, reps);
      rows.push_back({kc.label + (scores ? " scores" : " context") + " packed", ms, cb});
      printf("bench %s: evt %.4f ms, cuBLAS strided-batched %.4f ms\n", rows.back().what.c_str(), ms, cb);
      fflush(stdout);
      if (scores && oi == 7) {
        double ms2 = -1;
        run_case(kc, "heads", Bt, H, M, N, K, seed++, {0, 17, L - 1}, &ms2, reps);
        rows.push_back({kc.label + " scores heads (32 launches x 16)", ms2, cb});
        printf("bench %s: evt %.4f ms\n", rows.back().what.c_str(), ms2);
        fflush(stdout);
      }
    }
    cublasDestroy(h);
    printf("\n| BERT-large attention (512 batches) | evt ms | cuBLAS strided-batched ms | evt / cuBLAS |\n|---|---|---|---|\n");
    for (auto &r : rows)
      printf("| %s | %.4f | %.4f | %.2f |\n", r.what.c_str(), r.evt_ms, r.cublas_ms,
             r.evt_ms > 0 && r.cublas_ms > 0 ? r.evt_ms / r.cublas_ms : -1.0);
  }
  for (auto &kc : cases) {
    if (!kc.fn) {
      report(false, "%s: not compiled", kc.label.c_str());
      g_results.push_back({kc.label + " (not compiled)", false, INFINITY});
      continue;
    }
    run_case(kc, "packed", 1, 5, 200, 136, 72, seed++, {});
    run_case(kc, "padded", 1, 3, 136, 200, 96, seed++, {});
    bool shared_sum = false;
    for (int v = 0; v < kc.spec.nnodes; v++)
      shared_sum |= kc.spec.nodes[v].shared && evt_vop_class(kc.spec.nodes[v].op) == 'S';
    if (!shared_sum) {
      run_case(kc, "heads", 2, 3, 128, 128, 64, seed++, {});
    } else {
      // two batch levels with a sum shared by every batch: the launcher must refuse (initialize() per launch)
      evt_launch_args a;
      memset(&a, 0, sizeof a);
      void *buf;
      CUDA_CHECK(cudaMalloc(&buf, 1 << 20));
      a.m = a.n = a.k = 64, a.l = 2, a.l_outer = 2, a.a = a.b = a.d = buf;
      for (int v = 0; v < kc.spec.nnodes; v++) a.ptrs[v] = buf;
      int rc = kc.fn(&a);
      report(rc == EVT_LAUNCH_CANNOT_IMPLEMENT, "%s: two batch levels with a shared sum refused (rc %d)",
             kc.label.c_str(), rc);
      cudaFree(buf);
    }
  }
  printf("\n| case | result | max rel err |\n|---|---|---|\n");
  for (auto &r : g_results) printf("| %s | %s | %.3e |\n", r.label.c_str(), r.ok ? "matched" : "NOT matched", r.err);
  return report_summary();
}
