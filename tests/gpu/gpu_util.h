// Shared helpers of tests/gpu/check_evt.cu and bench/kernels/bench_evt.cu:
// CUDA error checks, random bf16 data, the kernel list both programs need (JIT-compiled once, in
// parallel, through src/runtime/jit/jit.c), and loading a generated launcher from its shared object.
#ifndef EVT_GPU_UTIL_H
#define EVT_GPU_UTIL_H

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
#include <string>
#include <vector>

extern "C" {
#include "codegen/examples.h"
#include "codegen/kspec.h"
#include "evt_launch.h"
#include "runtime/jit/jit.h"
}

#include "cuda_check.h"

typedef int (*evt_launch_fn)(const evt_launch_args *);

struct KernelCase {
  std::string epilogue;  // evt_kspec_example name
  evt_tile_config cfg;
  evt_gemm_layout layout;
  evt_kspec spec;
  std::string name, label;
  evt_launch_fn fn = nullptr;
};

static const evt_tile_config kCfg128 = {128, 128, 64, 1, 1, EVT_SCHED_COOPERATIVE};
static const evt_tile_config kCfg256c2 = {128, 256, 64, 2, 1, EVT_SCHED_COOPERATIVE};
static const evt_tile_config kCfgPing = {128, 128, 64, 1, 1, EVT_SCHED_PINGPONG};
static const evt_tile_config kCfg256x128c1x2 = {256, 128, 64, 1, 2, EVT_SCHED_COOPERATIVE};
static const evt_tile_config kCfg128x256c1x1 = {128, 256, 64, 1, 1, EVT_SCHED_COOPERATIVE};
// CUTLASS's deterministic row reduction (the atomic ones run on kernels/evt_visitor_nodes.h's RowSum)
static const evt_tile_config kCfgWorkspace = {128, 256, 64, 1, 1, EVT_SCHED_COOPERATIVE, 0, EVT_RED_WORKSPACE};

// the untuned config of few output tiles over a long K (weight gradients): the stream-K scheduler
static const evt_tile_config kCfgStreamK = {128, 256, 64, 1, 1, EVT_SCHED_COOPERATIVE, 0, EVT_RED_ATOMIC, 0, 1};

static std::string cfg_label(const evt_tile_config &c) {
  char b[80];
  snprintf(b, sizeof b, "%dx%d c%dx%d %s%s%s", c.tile_m, c.tile_n, c.cluster_m, c.cluster_n,
           c.schedule == EVT_SCHED_PINGPONG ? "pingpong" : "coop", c.reduction == EVT_RED_WORKSPACE ? " workspace" : "",
           c.stream_k ? " stream-K" : "");
  return b;
}

static KernelCase make_case(const char *epi, evt_tile_config cfg, evt_gemm_layout layout = EVT_LAYOUT_NN) {
  KernelCase k;
  k.epilogue = epi;
  k.cfg = cfg;
  k.layout = layout;
  if (evt_kspec_example(&k.spec, epi, cfg) != EVT_OK) {
    fprintf(stderr, "unknown epilogue %s\n", epi);
    exit(2);
  }
  k.spec.layout = layout;
  char nm[40];
  evt_kspec_kernel_name(&k.spec, nm);
  k.name = nm;
  static const char *ln[] = {"NN", "NT", "TN"};
  k.label = std::string(epi) + " " + ln[layout] + " " + cfg_label(cfg);
  return k;
}

// Every kernel either program uses: compiled together so the 16 cores work in parallel.
static std::vector<KernelCase> all_cases() {
  std::vector<KernelCase> v;
  const char *checks[] = {"plain",     "bias_gelu_aux",     "bias_relu_dbias", "gelu_bwd",
                          "bias_silu", "bias_gelu_aux_f16", "mixed_f32", "bias_relu_amax"};
  for (const char *e : checks) v.push_back(make_case(e, kCfg128));
  v.push_back(make_case("plain", kCfg128, EVT_LAYOUT_NT));
  v.push_back(make_case("plain", kCfg128, EVT_LAYOUT_TN));
  v.push_back(make_case("bias_relu_dbias", kCfgWorkspace));
  v.push_back(make_case("gelu_bwd_dbias", kCfgPing, EVT_LAYOUT_NT));
  v.push_back(make_case("bias_relu_dbias", kCfgStreamK, EVT_LAYOUT_TN));  // a weight gradient's layout
  evt_tile_config tf32_cfg = kCfg128;  // f32 operands on TF32 tensor cores: K-major (NT), one 128-byte K row per tile
  tf32_cfg.tile_k = 32;
  v.push_back(make_case("tf32_bias_relu", tf32_cfg, EVT_LAYOUT_NT));
  const evt_tile_config bench_cfgs[] = {kCfg128, kCfg256c2, kCfgPing, kCfg256x128c1x2, kCfg128x256c1x1};
  const char *bench_epis[] = {"plain", "bias_gelu_aux", "bias_relu_dbias", "gelu_bwd_dbias"};
  for (const char *e : bench_epis)
    for (const evt_tile_config &c : bench_cfgs) {
      KernelCase k = make_case(e, c);
      bool dup = false;
      for (auto &o : v) dup |= o.name == k.name;
      if (!dup) v.push_back(k);
    }
  return v;
}

// Emits, JIT-compiles (cache + parallel) and loads every case; exits on any failure.
static void jit_load(std::vector<KernelCase> &cases) {
  std::vector<char *> srcs;
  std::vector<evt_jit_job> jobs(cases.size());
  for (size_t i = 0; i < cases.size(); i++) {
    char err[512];
    char *src = evt_emit_cutlass(&cases[i].spec, err, sizeof err);
    if (!src) {
      fprintf(stderr, "emit %s: %s\n", cases[i].label.c_str(), err);
      exit(2);
    }
    srcs.push_back(src);
    memset(&jobs[i], 0, sizeof jobs[i]);
    jobs[i].name = cases[i].name.c_str();
    jobs[i].source = src;
  }
  char msg[2048];
  evt_status st = evt_jit_compile(jobs.data(), (int)jobs.size(), nullptr, msg, sizeof msg);
  for (size_t i = 0; i < cases.size(); i++) {
    if (!jobs[i].ok) {
      fprintf(stderr, "JIT %s (%s): %s\n", cases[i].label.c_str(), cases[i].name.c_str(), jobs[i].error);
      continue;
    }
    void *h = dlopen(jobs[i].so_path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      fprintf(stderr, "dlopen %s: %s\n", jobs[i].so_path, dlerror());
      exit(2);
    }
    cases[i].fn = (evt_launch_fn)dlsym(h, cases[i].name.c_str());
    if (!cases[i].fn) {
      fprintf(stderr, "dlsym %s: %s\n", cases[i].name.c_str(), dlerror());
      exit(2);
    }
  }
  for (char *s : srcs) free(s);
  if (st != EVT_OK) fprintf(stderr, "JIT: %s\n", msg);
}

// Deterministic xorshift uniform values in [lo, hi), rounded to bf16 (host copy kept as float).
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

static void fill_bf16(std::vector<__nv_bfloat16> &h, std::vector<double> &ref, size_t n, Rng &r, float lo, float hi) {
  h.resize(n);
  ref.resize(n);
  for (size_t i = 0; i < n; i++) {
    h[i] = __float2bfloat16(r.uniform(lo, hi));
    ref[i] = (double)__bfloat162float(h[i]);
  }
}

static size_t dtype_bytes(evt_dtype dt) { return dt == EVT_F32 ? 4 : 2; }

// n random values in [lo, hi) stored as dtype (bf16, f16 or f32); ref gets the stored values exactly.
static std::vector<unsigned char> fill_dtype(evt_dtype dt, size_t n, Rng &r, float lo, float hi,
                                             std::vector<double> &ref) {
  std::vector<unsigned char> bytes(n * dtype_bytes(dt));
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

template <class T>
static T *dev_upload(const std::vector<T> &h) {
  T *d = nullptr;
  CUDA_CHECK(cudaMalloc(&d, h.size() * sizeof(T) + 16));
  CUDA_CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

#endif
