// GPU check of the visitor node types (src/codegen/kspec.h EVT_VOP_LIST) in generated kernels against the CPU
// reference of their spec (evt_rspec_reference / evt_kspec_reference, which the unit tests check against the
// interpreter); run by tests/gpu/run.sh.
//   check_visitors emit DIR   DIR/<kernel>.cu for the row examples unary_math, cmp_where, softmax_xent (bf16, f32)
//   check_visitors check DIR  runs DIR/<kernel>.so at several sizes (N % 8 != 0: element path; long rows: 2 and 4
//                             chunks per thread)
//   check_visitors gemm       JIT-compiles (src/runtime/jit/jit.c, CUTLASS) and runs the GEMM examples visitor_ops and
//                             visitor_cmp
// Per case: NaN-poisoned outputs, two launches (equal bit for bit), every store within a relative Frobenius error
// of 1e-2 (16-bit storage; GEMM kernels) or 1e-5 (f32 row kernels); bool stores of row kernels match exactly.
// Prints one line per store, a table per node type, then "N passed, N failed".
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

extern "C" {
#include "codegen/examples.h"
#include "codegen/kspec.h"
#include "codegen/rspec.h"
#include "evt_launch.h"
#include "evt_row_launch.h"
#include "runtime/jit/jit.h"
}

#include "cuda_check.h"

static int g_pass = 0, g_fail = 0;
struct TypeStat {
  int cases = 0, passed = 0;
  double max_err = 0;
};
static std::map<std::string, TypeStat> g_types;  // node type → cases that contain it

struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
  float uniform(float lo, float hi) { return lo + (hi - lo) * (float)((next() >> 11) * (1.0 / 9007199254740992.0)); }
};

static const char *evt_dtype_name(evt_dtype dt) {
  static const char *n[] = {"f32", "f16", "bf16", "i64", "i32", "bool"};
  return (unsigned)dt < 6 ? n[dt] : "?";
}

static size_t dt_bytes(evt_dtype dt) {
  switch (dt) {
    case EVT_F32: case EVT_I32: return 4;
    case EVT_I64: return 8;
    case EVT_BOOL: return 1;
    default: return 2;
  }
}

// host value v stored as dt into bytes[i]; returns the stored value (what the device reads)
static double put(std::vector<unsigned char> &bytes, size_t i, evt_dtype dt, double v) {
  unsigned char *p = &bytes[i * dt_bytes(dt)];
  switch (dt) {
    case EVT_BF16: { __nv_bfloat16 h = __float2bfloat16((float)v); memcpy(p, &h, 2); return __bfloat162float(h); }
    case EVT_F16: { __half h = __float2half((float)v); memcpy(p, &h, 2); return __half2float(h); }
    case EVT_F32: { float f = (float)v; memcpy(p, &f, 4); return f; }
    case EVT_I64: { long long q = (long long)v; memcpy(p, &q, 8); return (double)q; }
    case EVT_I32: { int q = (int)v; memcpy(p, &q, 4); return (double)q; }
    default: { unsigned char b = v != 0; *p = b; return b; }
  }
}

static std::vector<double> download(const void *d, size_t n, evt_dtype dt) {
  std::vector<unsigned char> h(n * dt_bytes(dt));
  CUDA_CHECK(cudaMemcpy(h.data(), d, h.size(), cudaMemcpyDeviceToHost));
  std::vector<double> out(n);
  for (size_t i = 0; i < n; i++) {
    const unsigned char *p = &h[i * dt_bytes(dt)];
    switch (dt) {
      case EVT_BF16: { __nv_bfloat16 x; memcpy(&x, p, 2); out[i] = __bfloat162float(x); break; }
      case EVT_F16: { __half x; memcpy(&x, p, 2); out[i] = __half2float(x); break; }
      case EVT_F32: { float x; memcpy(&x, p, 4); out[i] = x; break; }
      case EVT_I64: { long long x; memcpy(&x, p, 8); out[i] = (double)x; break; }
      case EVT_I32: { int x; memcpy(&x, p, 4); out[i] = x; break; }
      default: out[i] = *p; break;
    }
  }
  return out;
}

// relative Frobenius error (NaN/inf in out → inf) and the number of elements that differ
static double rel_err(const std::vector<double> &out, const std::vector<double> &ref, size_t *ndiff) {
  double num = 0, den = 0;
  *ndiff = 0;
  for (size_t i = 0; i < out.size(); i++) {
    if (!std::isfinite(out[i]) && !(std::isinf(out[i]) && out[i] == ref[i])) return INFINITY;
    if (std::isinf(ref[i])) continue;
    double d = out[i] - ref[i];
    *ndiff += d != 0;
    num += d * d;
    den += ref[i] * ref[i];
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

// one device buffer per node with memory, host values (double) for the reference
struct Buffers {
  std::vector<void *> dev;
  std::vector<std::vector<double>> host;
  std::vector<size_t> count;
  std::vector<evt_dtype> dt;
  void init(int nnodes) {
    dev.assign(nnodes, nullptr);
    host.assign(nnodes, {});
    count.assign(nnodes, 0);
    dt.assign(nnodes, EVT_F32);
  }
  // a load: random values suited to the node; a store: poisoned
  void make(int i, evt_vop op, evt_dtype d, size_t n, int64_t ncols, Rng &r) {
    count[i] = n;
    dt[i] = d;
    host[i].assign(n, 0.0);
    std::vector<unsigned char> bytes(n * dt_bytes(d));
    CUDA_CHECK(cudaMalloc(&dev[i], bytes.size() + 16));
    if (evt_vop_class(op) == 'L') {
      for (size_t k = 0; k < n; k++) {
        double v;
        if (op == EVT_V_ONE_HOT) v = (double)((int64_t)(r.next() % (uint64_t)(ncols + 1)) - 1);  // -1: a zero row
        else if (d == EVT_BOOL) v = (double)(r.next() & 1);
        else if (d == EVT_I64 || d == EVT_I32) v = (double)((int64_t)(r.next() % 7) - 1);  // labels, some = 2
        else if (op == EVT_V_SCALAR_LOAD) v = r.uniform(0.5f, 1.5f);
        else v = r.uniform(-3.f, 3.f);
        host[i][k] = put(bytes, k, d, v);
      }
      CUDA_CHECK(cudaMemcpy(dev[i], bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
    } else {
      poison(i);
    }
  }
  void poison(int i) { CUDA_CHECK(cudaMemset(dev[i], 0xFF, count[i] * dt_bytes(dt[i]))); }
  ~Buffers() {
    for (void *p : dev) cudaFree(p);
  }
};

static std::vector<std::string> spec_types(const evt_vop *ops, const evt_dtype *dts, int n) {
  std::vector<std::string> t;
  for (int i = 0; i < n; i++) {
    std::string s = evt_vop_name(ops[i]);
    if (evt_vop_has_memory(ops[i]) && dts[i] == EVT_BOOL) s += " (bool)";
    if ((ops[i] == EVT_V_ROW_SUM || ops[i] == EVT_V_COL_SUM || ops[i] == EVT_V_COL_MAX) && dts[i] != EVT_F32)
      s += std::string(" (") + evt_dtype_name(dts[i]) + ")";
    bool dup = false;
    for (auto &o : t) dup |= o == s;
    if (!dup) t.push_back(s);
  }
  return t;
}

// compares every store; returns true when all matched. tol: float stores; bool stores: at most max_bool_diff
static bool compare_stores(const char *label, int m, int n, const evt_vop *ops, const evt_dtype *dts, const char (*names)[24],
                           int nn, Buffers &B, const std::vector<std::vector<double>> &first, double tol,
                           size_t max_bool_diff, double *worst) {
  bool all = true;
  for (int i = 0; i < nn; i++) {
    if (evt_vop_class(ops[i]) != 'S') continue;
    auto out = download(B.dev[i], B.count[i], dts[i]);
    size_t nd;
    double e = rel_err(out, B.host[i], &nd);
    bool same = out.size() == first[i].size() && memcmp(out.data(), first[i].data(), out.size() * sizeof(double)) == 0;
    bool exact = dts[i] == EVT_BOOL || dts[i] == EVT_I64 || dts[i] == EVT_I32;  // 0/1 or labels: count mismatches
    bool ok = same && (exact ? nd <= max_bool_diff && std::isfinite(e) : e <= tol);
    if (!exact && e > *worst) *worst = e;
    printf("%s %-26s %5dx%-5d: %-7s %-11s %-4s rel err %.3e, %zu/%zu elements differ: %s%s\n", ok ? "ok  " : "FAIL", label,
           m, n, names[i], evt_vop_name(ops[i]), evt_dtype_name(dts[i]), e, nd, out.size(),
           ok ? "matched" : "NOT MATCHED", same ? "" : " (second launch differs)");
    (ok ? g_pass : g_fail)++;
    all = all && ok;
  }
  return all;
}

// ---- row kernels ------------------------------------------------------------------------------------------
typedef int (*row_fn)(const evt_row_launch_args *);
struct RowCase {
  std::string example, label, name;
  evt_dtype dt;
  evt_rspec spec;
  row_fn fn = nullptr;
};

static std::vector<RowCase> row_cases() {
  std::vector<RowCase> v;
  for (const char *ex : {"unary_math", "cmp_where", "softmax_xent"})
    for (evt_dtype dt : {EVT_BF16, EVT_F32}) {
      RowCase c;
      c.example = ex;
      c.dt = dt;
      if (evt_rspec_example(&c.spec, ex, dt) != EVT_OK) {
        fprintf(stderr, "unknown row example %s\n", ex);
        exit(2);
      }
      char nm[40];
      evt_rspec_kernel_name(&c.spec, nm);
      c.name = nm;
      c.label = std::string(ex) + " " + evt_dtype_name(dt);
      v.push_back(c);
    }
  return v;
}

static void check_row(const RowCase &c, int m, int n, uint64_t seed) {
  const evt_rspec &s = c.spec;
  Rng r(seed);
  evt_row_launch_args a;
  memset(&a, 0, sizeof a);
  a.m = m, a.n = n;
  evt_rspec_launch_rng(&s, &a);  // rand nodes' seeds and offsets: launch arguments
  std::vector<double> in_h[3];
  std::vector<void *> ins;
  for (int k = 0; k < evt_row_nucleus_ninputs(&s); k++) {  // the examples' nuclei take M×N inputs only
    std::vector<unsigned char> bytes((size_t)m * n * dt_bytes(s.in_dtype));
    in_h[k].resize((size_t)m * n);
    for (size_t e = 0; e < in_h[k].size(); e++) in_h[k][e] = put(bytes, e, s.in_dtype, r.uniform(-4.f, 4.f));
    void *d;
    CUDA_CHECK(cudaMalloc(&d, bytes.size() + 16));
    CUDA_CHECK(cudaMemcpy(d, bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
    a.in[k] = d;
    ins.push_back(d);
  }
  Buffers B;
  B.init(s.nnodes);
  evt_vop ops[EVT_RSPEC_MAX_NODES];
  evt_dtype dts[EVT_RSPEC_MAX_NODES];
  char names[EVT_RSPEC_MAX_NODES][24];
  for (int i = 0; i < s.nnodes; i++) {
    ops[i] = s.nodes[i].op;
    dts[i] = s.nodes[i].dtype;
    memcpy(names[i], s.nodes[i].name, 24);
    size_t cnt = (size_t)evt_rspec_node_elems(&s, i, m, n);
    if (!cnt) continue;
    B.make(i, ops[i], dts[i], cnt, n, r);
    a.ptrs[i] = B.dev[i];
  }
  // the run's RNG step (kernels/philox.h): every other case a nonzero one past 2^32, so rand nodes are checked
  // with both upper counter words, the others at step 0
  const unsigned long long step_h = (seed & 1) ? 0x100000003ull + seed : 0;
  unsigned long long *step_d;
  CUDA_CHECK(cudaMalloc(&step_d, sizeof step_h));
  CUDA_CHECK(cudaMemcpy(step_d, &step_h, sizeof step_h, cudaMemcpyHostToDevice));
  a.rng_step = step_d;
  std::vector<std::vector<double>> first(s.nnodes);
  int rc = c.fn(&a);
  CUDA_CHECK(cudaDeviceSynchronize());
  for (int i = 0; i < s.nnodes; i++)
    if (evt_vop_class(ops[i]) == 'S') {
      first[i] = download(B.dev[i], B.count[i], dts[i]);
      B.poison(i);
    }
  int rc2 = c.fn(&a);
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaGetLastError());
  bool ok = rc == EVT_LAUNCH_OK && rc2 == EVT_LAUNCH_OK;
  double worst = 0;
  if (!ok) {
    printf("FAIL %-26s %5dx%-5d: launcher returned %d / %d: NOT MATCHED\n", c.label.c_str(), m, n, rc, rc2);
    g_fail++;
  } else {
    const double *inp[3] = {in_h[0].empty() ? nullptr : in_h[0].data(), in_h[1].empty() ? nullptr : in_h[1].data(), nullptr};
    std::vector<double *> t(s.nnodes, nullptr);
    for (int i = 0; i < s.nnodes; i++) t[i] = B.host[i].empty() ? nullptr : B.host[i].data();
    evt_rspec_reference_at(&s, m, n, inp, t.data(), nullptr, nullptr, step_h);
    ok = compare_stores(c.label.c_str(), m, n, ops, dts, names, s.nnodes, B, first, c.dt == EVT_F32 ? 1e-5 : 1e-2, 0,
                        &worst);
  }
  for (auto &ty : spec_types(ops, dts, s.nnodes)) {
    TypeStat &st = g_types[ty];
    st.cases++;
    st.passed += ok;
    if (worst > st.max_err) st.max_err = worst;
  }
  for (void *d : ins) cudaFree(d);
  cudaFree(step_d);
}

// ---- GEMM kernels ------------------------------------------------------------------------------------------
typedef int (*gemm_fn)(const evt_launch_args *);

static void check_gemm(const char *label, const evt_kspec &s, gemm_fn fn, int M, int N, int K, uint64_t seed) {
  Rng r(seed);
  std::vector<unsigned char> ha((size_t)M * K * 2), hb((size_t)K * N * 2);
  std::vector<double> ra((size_t)M * K), rb((size_t)K * N);
  for (size_t i = 0; i < ra.size(); i++) ra[i] = put(ha, i, EVT_BF16, r.uniform(-1.f, 1.f));
  for (size_t i = 0; i < rb.size(); i++) rb[i] = put(hb, i, EVT_BF16, r.uniform(-1.f, 1.f));
  evt_launch_args a;
  memset(&a, 0, sizeof a);
  a.m = M, a.n = N, a.k = K;
  evt_kspec_launch_rng(&s, &a);  // rand nodes' seeds and offsets: launch arguments
  void *da, *db, *dd;
  CUDA_CHECK(cudaMalloc(&da, ha.size()));
  CUDA_CHECK(cudaMalloc(&db, hb.size()));
  CUDA_CHECK(cudaMemcpy(da, ha.data(), ha.size(), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(db, hb.data(), hb.size(), cudaMemcpyHostToDevice));
  size_t dbytes = (size_t)M * N * dt_bytes(s.d_dtype);
  CUDA_CHECK(cudaMalloc(&dd, dbytes));
  a.a = da, a.b = db, a.d = dd;
  Buffers B;
  B.init(s.nnodes + 1);
  evt_vop ops[EVT_KSPEC_MAX_NODES + 1];
  evt_dtype dts[EVT_KSPEC_MAX_NODES + 1];
  char names[EVT_KSPEC_MAX_NODES + 1][24];
  // rand nodes (evt_nodes::Philox) read the run's RNG step from device memory: one past 2^32 (both counter words)
  const unsigned long long step_h = (1ull << 33) + 5;
  unsigned long long *step_d = nullptr;
  for (int i = 0; i < s.nnodes; i++) {
    ops[i] = s.nodes[i].op;
    dts[i] = s.nodes[i].dtype;
    memcpy(names[i], s.nodes[i].name, 24);
    if (ops[i] == EVT_V_RAND) {
      if (!step_d) {
        CUDA_CHECK(cudaMalloc(&step_d, sizeof step_h));
        CUDA_CHECK(cudaMemcpy(step_d, &step_h, sizeof step_h, cudaMemcpyHostToDevice));
      }
      a.ptrs[i] = step_d;
    }
    if (!evt_vop_has_memory(ops[i])) continue;
    B.make(i, ops[i], dts[i], (size_t)evt_vop_elems(ops[i], M, N), N, r);
    a.ptrs[i] = B.dev[i];
  }
  // D as one more "store" (index nnodes) so it is compared like the others
  int dn = s.nnodes;
  ops[dn] = EVT_V_AUX_STORE, dts[dn] = s.d_dtype;
  snprintf(names[dn], 24, "D");
  B.count[dn] = (size_t)M * N, B.dt[dn] = s.d_dtype, B.dev[dn] = dd, B.host[dn].assign((size_t)M * N, 0.0);
  B.poison(dn);
  std::vector<std::vector<double>> first(s.nnodes + 1);
  int rc = fn(&a);
  CUDA_CHECK(cudaDeviceSynchronize());
  for (int i = 0; i <= s.nnodes; i++)
    if (evt_vop_class(ops[i]) == 'S' && B.dev[i]) {
      first[i] = download(B.dev[i], B.count[i], dts[i]);
      B.poison(i);
    }
  int rc2 = fn(&a);
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaGetLastError());
  bool ok = rc == EVT_LAUNCH_OK && rc2 == EVT_LAUNCH_OK;
  double worst = 0;
  if (!ok) {
    printf("FAIL %-26s %5dx%-5d: launcher returned %d / %d: NOT MATCHED\n", label, M, N, rc, rc2);
    g_fail++;
  } else {
    std::vector<double *> t(s.nnodes, nullptr);
    for (int i = 0; i < s.nnodes; i++) t[i] = B.host[i].empty() ? nullptr : B.host[i].data();
    evt_kspec_reference_batched_at(&s, 1, M, N, K, ra.data(), rb.data(), t.data(), B.host[dn].data(), step_d ? step_h : 0);
    // bool stores of comparisons on the accumulator may flip where GPU and CPU sums differ in the last bit
    ok = compare_stores(label, M, N, ops, dts, names, s.nnodes + 1, B, first, 1e-2, (size_t)M * N / 10000, &worst);
  }
  for (auto &ty : spec_types(ops, dts, s.nnodes)) {
    TypeStat &st = g_types["gemm " + ty];
    st.cases++;
    st.passed += ok;
    if (worst > st.max_err) st.max_err = worst;
  }
  B.dev[dn] = nullptr;
  cudaFree(step_d);
  cudaFree(dd);
  cudaFree(da);
  cudaFree(db);
}

static void run_gemm() {
  const char *eps[] = {"visitor_ops", "visitor_cmp", "bias_dropout"};  // bias_dropout: evt_nodes::Philox (a bool mask)
  constexpr int NE = 3;
  evt_tile_config cfg = {128, 128, 64, 1, 1, EVT_SCHED_COOPERATIVE};
  evt_kspec specs[NE];
  std::string names[NE];
  std::vector<evt_jit_job> jobs(NE);
  std::vector<char *> srcs;
  for (int i = 0; i < NE; i++) {
    evt_kspec_example(&specs[i], eps[i], cfg);
    char nm[40], err[512];
    evt_kspec_kernel_name(&specs[i], nm);
    names[i] = nm;
    char *src = evt_emit_cutlass(&specs[i], err, sizeof err);
    if (!src) {
      printf("FAIL %s: emit: %s\n", eps[i], err);
      g_fail++;
      return;
    }
    srcs.push_back(src);
    memset(&jobs[i], 0, sizeof jobs[i]);
    jobs[i].name = names[i].c_str();
    jobs[i].source = src;
  }
  char msg[2048];
  evt_jit_compile(jobs.data(), NE, nullptr, msg, sizeof msg);
  for (int i = 0; i < NE; i++) {
    gemm_fn fn = nullptr;
    if (jobs[i].ok) {
      void *h = dlopen(jobs[i].so_path, RTLD_NOW | RTLD_LOCAL);
      if (h) fn = (gemm_fn)dlsym(h, names[i].c_str());
    }
    if (!fn) {
      printf("FAIL gemm %s: not compiled / loaded: %.1500s\n", eps[i], jobs[i].error);
      g_fail++;
      continue;
    }
    std::string label = std::string("gemm ") + eps[i];
    const int sizes[][3] = {{1032, 784, 520}, {256, 384, 1024}};
    uint64_t seed = 100;
    for (auto &sz : sizes) check_gemm(label.c_str(), specs[i], fn, sz[0], sz[1], sz[2], seed++);
  }
  for (char *s : srcs) free(s);
}

int main(int argc, char **argv) {
  if (argc >= 2 && !strcmp(argv[1], "gemm")) {
    run_gemm();
    printf("\n%-28s %6s %6s %10s\n", "node type", "cases", "passed", "max relerr");
    for (auto &kv : g_types)
      printf("%-28s %6d %6d %10.3e %s\n", kv.first.c_str(), kv.second.cases, kv.second.passed, kv.second.max_err,
             kv.second.passed == kv.second.cases ? "matched" : "NOT MATCHED");
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
  }
  if (argc < 3) {
    fprintf(stderr, "usage: check_visitors emit|check DIR | check_visitors gemm\n");
    return 2;
  }
  std::vector<RowCase> cases = row_cases();
  if (!strcmp(argv[1], "emit")) {
    for (auto &c : cases) {
      char err[256];
      char *src = evt_emit_rows(&c.spec, err, sizeof err);
      if (!src) {
        fprintf(stderr, "emit %s: %s\n", c.label.c_str(), err);
        return 2;
      }
      std::string path = std::string(argv[2]) + "/" + c.name + ".cu";
      FILE *f = fopen(path.c_str(), "w");
      if (!f || fputs(src, f) < 0) return 2;
      fclose(f);
      free(src);
    }
    printf("%zu sources written\n", cases.size());
    return 0;
  }
  for (auto &c : cases) {
    std::string so = std::string(argv[2]) + "/" + c.name + ".so";
    void *h = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h) c.fn = (row_fn)dlsym(h, c.name.c_str());
    if (!c.fn) {
      printf("FAIL %-26s: not compiled / loaded (%s): NOT MATCHED\n", c.label.c_str(), h ? "dlsym" : dlerror());
      g_fail++;
    }
  }
  // (M, N): aligned; N % 8 != 0 (element path); short rows; one column; 2 and 4 chunks per thread
  const int sizes[][2] = {{300, 1024}, {37, 1000}, {129, 100}, {5, 1}, {64, 520}, {17, 5000}, {9, 20000}};
  uint64_t seed = 1;
  for (auto &c : cases)
    if (c.fn)
      for (auto &sz : sizes) check_row(c, sz[0], sz[1], seed++);
  printf("\n%-28s %6s %6s %10s\n", "node type", "cases", "passed", "max relerr");
  for (auto &kv : g_types)
    printf("%-28s %6d %6d %10.3e %s\n", kv.first.c_str(), kv.second.cases, kv.second.passed, kv.second.max_err,
           kv.second.passed == kv.second.cases ? "matched" : "NOT MATCHED");
  printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail ? 1 : 0;
}
