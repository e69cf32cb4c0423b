// GPU check of generated GEMM + epilogue-visitor-tree kernels against the CPU reference (src/codegen/vref.c); run by
// tests/gpu/run.sh. Every case of all_cases() (gpu_util.h: plain, bias+GELU+aux store, bias+ReLU+Σ_M bias gradient,
// GELU backward, bias+SiLU through a topological visitor, bias+ReLU+max_N |y| (col_max, atomic max; its
// NaN-poisoned output must be reset to -inf by initialize()); layouts NN, NT, TN; tf32_bias_relu (layout NT): f32
// operands on TF32 tensor cores, D within 5e-3 of the exact reference, the error of 10-bit operand mantissas) at two sizes
// whose M and N are not tile multiples, and at an odd M (K for layout TN), which no row in memory has: fresh random bf16 inputs, NaN-poisoned outputs, two runs (initialize() must reset atomic
// reductions), D and every stored tensor within a relative Frobenius error of 1e-2 (NaN never passes). Kernels with
// a Σ over M run once more with that output 4- but not 8-byte aligned; an unaligned N must be rejected by
// can_implement; the stream-K case also runs over K = 16392 (few tiles, split K loops). CHECK_EVT_ONLY=substring keeps the cases whose label has it. Prints "N passed, N failed".
#include "gpu_util.h"

#include "check_report.h"

// relative Frobenius error; NaN/inf anywhere in out → +inf
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
    if (fabs(d) > *maxabs) *maxabs = fabs(d);
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

static std::vector<double> download(const void *dptr, size_t n, evt_dtype dt) {
  std::vector<double> out(n);
  if (dt == EVT_F32) {
    std::vector<float> h(n);
    CUDA_CHECK(cudaMemcpy(h.data(), dptr, n * 4, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) out[i] = h[i];
  } else if (dt == EVT_F16) {
    std::vector<__half> h(n);
    CUDA_CHECK(cudaMemcpy(h.data(), dptr, n * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) out[i] = __half2float(h[i]);
  } else {
    std::vector<__nv_bfloat16> h(n);
    CUDA_CHECK(cudaMemcpy(h.data(), dptr, n * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) out[i] = __bfloat162float(h[i]);
  }
  return out;
}

// rs_off: bytes added to every row_sum (Σ over M) output pointer: 4 puts it at an address that is 4- but not 8-byte
// aligned (a view into a flat gradient buffer); evt's RowSum node must still sum correctly (scalar reductions there),
// CUTLASS's workspace-mode node may refuse it (can_implement), but never return a wrong sum.
static void check_case(const KernelCase &kc, int M, int N, int K, uint64_t seed, int rs_off = 0) {
  const evt_kspec &s = kc.spec;
  Rng rng(seed);
  std::vector<double> ra, rb;
  std::vector<unsigned char> ha = fill_dtype(s.ab_dtype, (size_t)M * K, rng, -1.f, 1.f, ra);
  std::vector<unsigned char> hb = fill_dtype(s.ab_dtype, (size_t)K * N, rng, -1.f, 1.f, rb);
  evt_launch_args args;
  memset(&args, 0, sizeof args);
  args.m = M, args.n = N, args.k = K;
  evt_kspec_launch_rng(&s, &args);  // rand nodes' seeds and offsets: launch arguments
  args.a = dev_upload(ha);
  args.b = dev_upload(hb);
  void *dd;
  size_t d_bytes = (size_t)M * N * dtype_bytes(s.d_dtype);
  CUDA_CHECK(cudaMalloc(&dd, d_bytes));
  args.d = dd;
  std::vector<std::vector<double>> host(s.nnodes);
  std::vector<double *> tens(s.nnodes, nullptr);
  std::vector<size_t> count(s.nnodes, 0);
  for (int v = 0; v < s.nnodes; v++) {
    const evt_vnode &nd = s.nodes[v];
    if (!evt_vop_has_memory(nd.op)) continue;
    size_t n = nd.op == EVT_V_ROW_BCAST || nd.op == EVT_V_ROW_SUM   ? (size_t)N
               : nd.op == EVT_V_COL_BCAST || nd.op == EVT_V_COL_SUM || nd.op == EVT_V_COL_MAX ? (size_t)M
                                                                                              : (size_t)M * N;
    count[v] = n;
    host[v].assign(n, 0.0);
    size_t bytes = n * dtype_bytes(nd.dtype);
    CUDA_CHECK(cudaMalloc(&args.ptrs[v], bytes + 16));
    if (nd.op == EVT_V_ROW_SUM && rs_off) args.ptrs[v] = (char *)args.ptrs[v] + rs_off;
    if (evt_vop_class(nd.op) == 'L') {
      float lim = nd.op == EVT_V_AUX_LOAD ? 3.f : 1.f;
      std::vector<unsigned char> h = fill_dtype(nd.dtype, n, rng, -lim, lim, host[v]);
      CUDA_CHECK(cudaMemcpy(args.ptrs[v], h.data(), bytes, cudaMemcpyHostToDevice));
    } else {
      CUDA_CHECK(cudaMemset(args.ptrs[v], 0xFF, bytes));  // NaN poison
    }
    tens[v] = host[v].data();
  }
  CUDA_CHECK(cudaMemset(dd, 0xFF, d_bytes));
  int rc = 0;
  for (int rep = 0; rep < 2 && rc == 0; rep++) {
    rc = kc.fn(&args);
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaGetLastError());
  }
  char tag[16] = "";
  if (rs_off) snprintf(tag, sizeof tag, " Σ+%dB", rs_off);
  if (rc != 0 && rs_off && rc == EVT_LAUNCH_CANNOT_IMPLEMENT && kc.cfg.reduction == EVT_RED_WORKSPACE) {
    report(true, "%-40s %5dx%5dx%5d%s: refused by can_implement (workspace mode)", kc.label.c_str(), M, N, K, tag);
  } else if (rc != 0) {
    report(false, "%-40s %5dx%5dx%5d%s: launcher returned %d", kc.label.c_str(), M, N, K, tag, rc);
  } else {
    // layout: the reference reads A as K×M when A is transposed, B as N×K when B is; the host arrays were
    // generated directly in the stored layout, so they are passed through unchanged.
    std::vector<double> dref((size_t)M * N);
    evt_kspec_reference(&s, M, N, K, ra.data(), rb.data(), tens.data(), dref.data());
    double mx;
    double e = rel_err(download(dd, (size_t)M * N, s.d_dtype), dref, &mx);
    // f32 operands run on TF32 tensor cores (10 mantissa bits kept): ~1e-3 from the exact reference, not f32's 1e-6
    double dtol = s.ab_dtype == EVT_F32 ? 5e-3 : 1e-2;
    report(e <= dtol, "%-40s %5dx%5dx%5d%s: D rel err %.3e (tol %.0e) max abs %.3e", kc.label.c_str(), M, N, K, tag, e,
           dtol, mx);
    for (int v = 0; v < s.nnodes; v++) {
      if (evt_vop_class(s.nodes[v].op) != 'S') continue;
      double tol = 1e-2;
      double ev = rel_err(download(args.ptrs[v], count[v], s.nodes[v].dtype), host[v], &mx);
      report(ev <= tol, "%-40s %5dx%5dx%5d%s: %s (%s) rel err %.3e max abs %.3e", kc.label.c_str(), M, N, K, tag,
             s.nodes[v].name, evt_vop_name(s.nodes[v].op), ev, mx);
    }
  }
  cudaFree((void *)args.a);
  cudaFree((void *)args.b);
  cudaFree(dd);
  for (int v = 0; v < s.nnodes; v++)
    if (args.ptrs[v]) cudaFree((char *)args.ptrs[v] - (s.nodes[v].op == EVT_V_ROW_SUM ? rs_off : 0));
}

int main() {
  std::vector<KernelCase> cases = all_cases();
  if (const char *only = getenv("CHECK_EVT_ONLY")) {  // label substring (e.g. "dbias"): fewer kernels to compile
    std::vector<KernelCase> keep;
    for (auto &kc : cases)
      if (kc.label.find(only) != std::string::npos) keep.push_back(kc);
    cases.swap(keep);
  }
  jit_load(cases);
  const int sizes[][3] = {{1032, 776, 520}, {256, 384, 1024}};
  uint64_t seed = 1;
  for (auto &kc : cases) {
    bool is_check = kc.cfg.tile_n == 128 && kc.cfg.schedule == EVT_SCHED_COOPERATIVE && kc.cfg.cluster_m == 1;
    bool bench_only = !is_check;
    if (!kc.fn) {
      report(false, "%-40s: not compiled", kc.label.c_str());
      continue;
    }
    // bench-only configs get one (smaller) check so their numbers come from verified kernels
    for (auto &sz : sizes) {
      check_case(kc, sz[0], sz[1], sz[2], seed++);
      if (bench_only) break;
    }
    bool has_rs = false;
    for (int v = 0; v < kc.spec.nnodes; v++) has_rs |= kc.spec.nodes[v].op == EVT_V_ROW_SUM;
    if (has_rs) check_case(kc, sizes[0][0], sizes[0][1], sizes[0][2], seed++, 4);  // Σ output only 4-byte aligned
    if (kc.cfg.stream_k) check_case(kc, 1032, 776, 16392, seed++);  // 36 tiles over a long K: CTAs share tiles' K loops
    // extents that are no rows in memory take any size (lower_gemm.c's rule): an odd M where A is row-major, an
    // odd K where A and B are MN-major (TN)
    if (is_check && kc.layout != EVT_LAYOUT_TN) check_case(kc, 1001, 776, 520, seed++);
    if (is_check && kc.layout == EVT_LAYOUT_TN) check_case(kc, 1032, 776, 1001, seed++);
  }
  // can_implement must reject N whose rows are not 16-byte aligned
  for (auto &kc : cases) {
    if (kc.epilogue != "plain" || kc.layout != EVT_LAYOUT_NN || !kc.fn) continue;
    evt_launch_args args;
    memset(&args, 0, sizeof args);
    void *buf;
    CUDA_CHECK(cudaMalloc(&buf, 1 << 20));
    args.m = 128, args.n = 100, args.k = 64, args.a = buf, args.b = buf, args.d = buf;
    int rc = kc.fn(&args);
    report(rc == EVT_LAUNCH_CANNOT_IMPLEMENT, "%-40s: N=100 rejected by can_implement (rc %d)", kc.label.c_str(), rc);
    cudaFree(buf);
    break;
  }
  return report_summary();
}
