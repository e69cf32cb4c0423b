// H200 benchmark of generated row kernels at BERT-large sizes vs the bandwidth floor.
//
// For each (example, dtype, M, N): the kernel is run once and its outputs checked against nothing here
// (tests/gpu/check_rows.cu verifies the same kernels first), then timed: before every timed launch a
// 256 MiB buffer is overwritten so that L2 (50 MB) holds none of the operands; CUDA events around the launch
// only; the median of REPS launches. Floor = bytes one launch must move (every input read once, every output
// written once; the row-sum workspace is not counted) ÷ the copy bandwidth of a plain device-to-device
// cudaMemcpyAsync of 1 GiB measured in the same run (2 × bytes ÷ time, also L2-flushed, median). For context
// each row also times a plain copy that moves the same number of bytes (small copies do not reach the 1 GiB rate).
//   bench_rows DIR OUT.json [REPS]    (DIR holds the compiled kernels; see tests/gpu/run_rows_h200.sh)
#include <algorithm>
#include <functional>

#include "../../tests/gpu/rows_gpu.h"

static void *g_flush = nullptr;
static const size_t kFlush = 256u << 20;

static double median_us(const std::function<void()> &f, int reps) {
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  std::vector<float> t;
  f();  // warm-up (also the first-call occupancy query / workspace allocation)
  CUDA_CHECK(cudaDeviceSynchronize());
  for (int r = 0; r < reps; r++) {
    CUDA_CHECK(cudaMemsetAsync(g_flush, r & 0xff, kFlush));
    CUDA_CHECK(cudaEventRecord(a));
    f();
    CUDA_CHECK(cudaEventRecord(b));
    CUDA_CHECK(cudaEventSynchronize(b));
    float ms;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1000.f);
  }
  std::sort(t.begin(), t.end());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return t[t.size() / 2];
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: bench_rows DIR OUT.json [REPS]\n");
    return 2;
  }
  int reps = argc > 3 ? atoi(argv[3]) : 30;
  std::vector<RowCase> cases = all_row_cases();
  load_all(cases, argv[1]);
  CUDA_CHECK(cudaMalloc(&g_flush, kFlush));
  // copy bandwidth
  const size_t cb = 1u << 30;
  void *src, *dst;
  CUDA_CHECK(cudaMalloc(&src, cb));
  CUDA_CHECK(cudaMalloc(&dst, cb));
  CUDA_CHECK(cudaMemset(src, 1, cb));
  double copy_us = median_us([&] { CUDA_CHECK(cudaMemcpyAsync(dst, src, cb, cudaMemcpyDeviceToDevice)); }, 10);
  double bw = 2.0 * cb / (copy_us * 1e-6);  // bytes/s
  printf("device-to-device copy of 1 GiB: %.1f us -> %.1f GB/s (read + write)\n", copy_us, bw / 1e9);

  struct B {
    const char *ex;
    evt_dtype dt;
    int m, n;
  };
  const B list[] = {{"softmax", EVT_BF16, 16384, 1024},      {"softmax", EVT_BF16, 262144, 512},
                    {"softmax_bwd", EVT_BF16, 16384, 1024},  {"softmax_bwd", EVT_BF16, 262144, 512},
                    {"layernorm", EVT_BF16, 16384, 1024},    {"ln_residual", EVT_BF16, 16384, 1024},
                    {"layernorm_bwd", EVT_BF16, 16384, 1024}, {"gelu_bwd", EVT_BF16, 16384, 1024},
                    {"gelu_bwd", EVT_BF16, 16384, 4096},     {"chain_rowsum", EVT_BF16, 16384, 1024},
                    {"softmax", EVT_F32, 16384, 1024},       {"layernorm_bwd", EVT_F32, 16384, 1024}};
  FILE *js = fopen(argv[2], "w");
  if (!js) return 2;
  fprintf(js, "{\n  \"copy_bandwidth_GBps\": %.2f,\n  \"reps\": %d,\n  \"results\": [\n", bw / 1e9, reps);
  printf("%-14s %-5s %7s %5s %9s %9s %9s %6s %9s\n", "op", "dtype", "M", "N", "MB moved", "evt us", "floor us", "ratio",
         "copy us");
  bool first = true;
  for (const B &b : list) {
    const RowCase *c = nullptr;
    for (auto &k : cases)
      if (k.example == b.ex && k.dt == b.dt) c = &k;
    if (!c || !c->fn) {
      printf("%-14s %-5s: not compiled\n", b.ex, dt_name(b.dt));
      continue;
    }
    RowProblem P(&c->spec, b.m, b.n, 7);
    int rc = 0;
    double us = median_us([&] { rc |= c->fn(&P.args); }, reps);
    CUDA_CHECK(cudaDeviceSynchronize());
    if (rc) {
      printf("%-14s %-5s: launcher returned %d\n", b.ex, dt_name(b.dt), rc);
      continue;
    }
    double bytes = (double)(P.bytes_read + P.bytes_written), floor_us = bytes / bw * 1e6;
    // context: a plain copy that moves the same number of bytes (bytes / 2 read + bytes / 2 written)
    size_t half = std::min((size_t)(bytes / 2) & ~(size_t)255, cb);
    double copy_same = median_us([&] { CUDA_CHECK(cudaMemcpyAsync(dst, src, half, cudaMemcpyDeviceToDevice)); }, reps);
    printf("%-14s %-5s %7d %5d %9.1f %9.1f %9.1f %6.2f %9.1f\n", b.ex, dt_name(b.dt), b.m, b.n, bytes / 1e6, us, floor_us,
           us / floor_us, copy_same);
    fprintf(js, "%s    {\"op\": \"%s\", \"dtype\": \"%s\", \"m\": %d, \"n\": %d, \"bytes\": %.0f, \"evt_us\": %.2f, "
                "\"floor_us\": %.2f, \"ratio\": %.3f, \"copy_same_bytes_us\": %.2f, \"kernel\": \"%s\"}",
            first ? "" : ",\n", b.ex, dt_name(b.dt), b.m, b.n, bytes, us, floor_us, us / floor_us, copy_same, c->name.c_str());
    first = false;
  }
  fprintf(js, "\n  ]\n}\n");
  fclose(js);
  return 0;
}
