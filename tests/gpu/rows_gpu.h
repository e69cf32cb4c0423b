// Shared helpers of the row-kernel programs (tests/gpu/check_rows.cu, bench/kernels/bench_rows.cu): the case list
// (named row specs of src/codegen/rspec.c × dtypes), writing their generated sources (compiled in parallel by
// tests/gpu/run.sh or bench/kernels/run.sh), loading the compiled launchers, and allocating /
// filling every tensor a spec needs (host copies kept as double for the CPU reference).
#ifndef EVT_ROWS_GPU_H
#define EVT_ROWS_GPU_H

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern "C" {
#include "codegen/examples.h"
#include "codegen/rspec.h"
#include "evt_row_launch.h"
}

#include "cuda_check.h"

typedef int (*evt_row_fn)(const evt_row_launch_args *);

struct RowCase {
  std::string example;
  evt_dtype dt;
  evt_rspec spec;
  std::string name, label;
  evt_row_fn fn = nullptr;
  void (*info)(int *) = nullptr;  // <kernel>_info when the kernel exports it (the configuration of its last launch)
};

static const char *dt_name(evt_dtype d) { return d == EVT_BF16 ? "bf16" : d == EVT_F16 ? "f16" : "f32"; }

static RowCase make_row_case(const char *ex, evt_dtype dt) {
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
  c.label = std::string(ex) + " " + dt_name(dt);
  return c;
}

// Floating-point storage only (this harness keeps tensors as bf16 / f16 / f32); the examples with integer or
// bool tensors (one_hot targets, masks) are checked by tests/gpu/check_visitors.cu.
static bool float_only(const evt_rspec &s) {
  if (s.in_dtype != EVT_BF16 && s.in_dtype != EVT_F16 && s.in_dtype != EVT_F32) return false;
  for (int i = 0; i < s.nnodes; i++) {
    const evt_dtype d = s.nodes[i].dtype;
    if (evt_vop_has_memory(s.nodes[i].op) && d != EVT_BF16 && d != EVT_F16 && d != EVT_F32) return false;
  }
  return true;
}

// Every kernel either program uses: each float-only example in bf16 and f32, plus softmax and layernorm_bwd in f16.
static std::vector<RowCase> all_row_cases() {
  std::vector<RowCase> v;
  for (int k = 0; evt_rspec_example_names[k]; k++)
    for (evt_dtype dt : {EVT_BF16, EVT_F32}) {
      RowCase c = make_row_case(evt_rspec_example_names[k], dt);
      bool dup = false;  // (an example equal to another in this dtype: layernorm_bwd_mixed in f32)
      for (auto &o : v) dup = dup || o.name == c.name;
      if (float_only(c.spec) && !dup) v.push_back(c);
    }
  v.push_back(make_row_case("softmax", EVT_F16));
  v.push_back(make_row_case("layernorm_bwd", EVT_F16));
  return v;
}

// Writes DIR/<kernel name>.cu for every case.
static void emit_all(const std::vector<RowCase> &cases, const char *dir) {
  for (auto &c : cases) {
    char err[256];
    char *src = evt_emit_rows(&c.spec, err, sizeof err);
    if (!src) {
      fprintf(stderr, "emit %s: %s\n", c.label.c_str(), err);
      exit(2);
    }
    std::string path = std::string(dir) + "/" + c.name + ".cu";
    FILE *f = fopen(path.c_str(), "w");
    if (!f || fputs(src, f) < 0) {
      fprintf(stderr, "cannot write %s\n", path.c_str());
      exit(2);
    }
    fclose(f);
    free(src);
  }
}

// quiet: a missing .so is not reported (the benchmark's variants hold only the kernels it times).
static void load_all(std::vector<RowCase> &cases, const char *dir, bool quiet = false) {
  for (auto &c : cases) {
    std::string so = std::string(dir) + "/" + c.name + ".so";
    void *h = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      if (!quiet) fprintf(stderr, "dlopen %s (%s): %s\n", so.c_str(), c.label.c_str(), dlerror());
      continue;
    }
    c.fn = (evt_row_fn)dlsym(h, c.name.c_str());
    c.info = (void (*)(int *))dlsym(h, (c.name + "_info").c_str());
    if (!c.fn) fprintf(stderr, "dlsym %s: %s\n", c.name.c_str(), dlerror());
  }
}

struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
  float uniform(float lo, float hi) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return lo + (hi - lo) * (float)((s >> 11) * (1.0 / 9007199254740992.0));
  }
};

static size_t dt_bytes(evt_dtype dt) { return dt == EVT_F32 ? 4 : 2; }

// Relative-error tolerance of one output of a case in dtype case_dt stored as store_dt: 1e-5 for f32 cases, 1e-2
// for 16-bit ones, and 1e-2 for a 16-bit store of an f32 case (e.g. ln_affine_mixed's bf16 copy: the reference
// rounds a double, the kernel an f32, so one-ulp flips read ~1e-5). Row sums and mean / rstd are f32 stores.
static double store_tol(evt_dtype case_dt, evt_dtype store_dt) {
  return case_dt == EVT_F32 && store_dt != EVT_BF16 && store_dt != EVT_F16 ? 1e-5 : 1e-2;
}

// n random values in [lo, hi) stored as dt; ref gets the stored values exactly.
static std::vector<unsigned char> fill_dt(evt_dtype dt, size_t n, Rng &r, float lo, float hi, std::vector<double> &ref) {
  std::vector<unsigned char> bytes(n * dt_bytes(dt));
  ref.resize(n);
  for (size_t i = 0; i < n; i++) {
    float v = r.uniform(lo, hi);
    if (dt == EVT_BF16) {
      __nv_bfloat16 h = __float2bfloat16(v);
      memcpy(&bytes[2 * i], &h, 2);
      ref[i] = __bfloat162float(h);
    } else if (dt == EVT_F16) {
      __half h = __float2half(v);
      memcpy(&bytes[2 * i], &h, 2);
      ref[i] = __half2float(h);
    } else {
      memcpy(&bytes[4 * i], &v, 4);
      ref[i] = v;
    }
  }
  return bytes;
}

static std::vector<double> download(const void *d, size_t n, evt_dtype dt) {
  std::vector<double> out(n);
  std::vector<unsigned char> h(n * dt_bytes(dt));
  CUDA_CHECK(cudaMemcpy(h.data(), d, h.size(), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < n; i++) {
    if (dt == EVT_F32) {
      float f;
      memcpy(&f, &h[4 * i], 4);
      out[i] = f;
    } else if (dt == EVT_F16) {
      __half x;
      memcpy(&x, &h[2 * i], 2);
      out[i] = __half2float(x);
    } else {
      __nv_bfloat16 x;
      memcpy(&x, &h[2 * i], 2);
      out[i] = __bfloat162float(x);
    }
  }
  return out;
}

// Every tensor of one spec at one size: device buffers in args, host values (double) for the reference.
struct RowProblem {
  const evt_rspec *s;
  int m, n;
  evt_row_launch_args args;
  std::vector<double> in_h[3], mean_h, rstd_h;
  std::vector<std::vector<double>> node_h;
  size_t in_elems[3] = {0, 0, 0};
  evt_dtype in_dt[3] = {EVT_F32, EVT_F32, EVT_F32};
  size_t bytes_read = 0, bytes_written = 0;  // what one launch must move (the bandwidth floor)

  // host = false: device buffers only, inputs filled with the byte 0x3c (small finite values), no reference data
  // (the benchmark's extra rotation copies).
  RowProblem(const evt_rspec *spec, int m_, int n_, uint64_t seed, bool host = true) : s(spec), m(m_), n(n_) {
    memset(&args, 0, sizeof args);
    args.m = m, args.n = n;
    evt_rspec_launch_rng(s, &args);  // rand nodes' seeds and offsets: launch arguments
    Rng r(seed);
    const size_t mn = (size_t)m * n;
    int nin = evt_row_nucleus_ninputs(s);
    for (int k = 0; k < nin; k++) {
      bool vecn = (s->nucleus == EVT_ROWN_LAYERNORM && k >= 1) || (s->nucleus == EVT_ROWN_LAYERNORM_BWD && k == 2);
      if (s->nucleus == EVT_ROWN_LAYERNORM && k == 2 && !s->has_b) continue;
      in_dt[k] = vecn ? s->w_dtype : evt_rspec_in_dtype(s, k);  // (a mixed spec's second input has its own)
      in_elems[k] = vecn ? (size_t)n : mn;
      float lo = -1, hi = 1;
      if (s->nucleus == EVT_ROWN_SOFTMAX) lo = -4, hi = 4;
      if (s->nucleus == EVT_ROWN_SOFTMAX_BWD && k == 1) lo = 0, hi = 1;
      if ((s->nucleus == EVT_ROWN_LAYERNORM && k == 0) || (s->nucleus == EVT_ROWN_LAYERNORM_BWD && k == 1)) lo = -2, hi = 3;
      if (vecn && ((s->nucleus == EVT_ROWN_LAYERNORM && k == 1) || s->nucleus == EVT_ROWN_LAYERNORM_BWD)) lo = 0.5, hi = 1.5;
      void *d;
      const size_t nb = in_elems[k] * dt_bytes(in_dt[k]);
      CUDA_CHECK(cudaMalloc(&d, nb + 16));
      if (host) {
        auto bytes = fill_dt(in_dt[k], in_elems[k], r, lo, hi, in_h[k]);
        CUDA_CHECK(cudaMemcpy(d, bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
      } else {
        CUDA_CHECK(cudaMemset(d, 0x3c, nb));
      }
      args.in[k] = d;
      bytes_read += nb;
    }
    if (s->store_stats) {
      CUDA_CHECK(cudaMalloc(&args.mean, (size_t)m * 4 + 16));
      CUDA_CHECK(cudaMalloc(&args.rstd, (size_t)m * 4 + 16));
      if (host) mean_h.assign(m, 0), rstd_h.assign(m, 0);
      bytes_written += (size_t)m * 8;
    }
    node_h.resize(s->nnodes);
    for (int i = 0; i < s->nnodes; i++) {
      const evt_rnode &nd = s->nodes[i];
      size_t cnt = (size_t)evt_rspec_node_elems(s, i, m, n);
      if (!cnt) continue;
      size_t bytes = cnt * dt_bytes(nd.dtype);
      CUDA_CHECK(cudaMalloc(&args.ptrs[i], bytes + 16));
      if (evt_vop_class(nd.op) == 'L') {
        float lim = nd.op == EVT_V_AUX_LOAD ? 3.f : 1.f;
        if (host) {
          auto h = fill_dt(nd.dtype, cnt, r, -lim, lim, node_h[i]);
          CUDA_CHECK(cudaMemcpy(args.ptrs[i], h.data(), bytes, cudaMemcpyHostToDevice));
        } else {
          CUDA_CHECK(cudaMemset(args.ptrs[i], 0x3c, bytes));
        }
        bytes_read += bytes;
      } else {
        if (host) node_h[i].assign(cnt, 0.0);
        bytes_written += bytes;
      }
    }
    poison();
  }
  void poison() {  // NaN in every output
    if (args.mean) CUDA_CHECK(cudaMemset(args.mean, 0xFF, (size_t)m * 4));
    if (args.rstd) CUDA_CHECK(cudaMemset(args.rstd, 0xFF, (size_t)m * 4));
    for (int i = 0; i < s->nnodes; i++)
      if (evt_vop_class(s->nodes[i].op) == 'S')
        CUDA_CHECK(cudaMemset(args.ptrs[i], 0xFF, (size_t)evt_rspec_node_elems(s, i, m, n) * dt_bytes(s->nodes[i].dtype)));
  }
  void reference() {
    const double *in[3] = {in_h[0].empty() ? nullptr : in_h[0].data(), in_h[1].empty() ? nullptr : in_h[1].data(),
                           in_h[2].empty() ? nullptr : in_h[2].data()};
    std::vector<double *> t(s->nnodes, nullptr);
    for (int i = 0; i < s->nnodes; i++) t[i] = node_h[i].empty() ? nullptr : node_h[i].data();
    evt_rspec_reference(s, m, n, in, t.data(), mean_h.empty() ? nullptr : mean_h.data(),
                        rstd_h.empty() ? nullptr : rstd_h.data());
  }
  ~RowProblem() {
    for (int k = 0; k < 3; k++) cudaFree((void *)args.in[k]);
    cudaFree(args.mean);
    cudaFree(args.rstd);
    for (int i = 0; i < s->nnodes; i++) cudaFree(args.ptrs[i]);
  }
};

#endif
