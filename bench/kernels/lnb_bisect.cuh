// bench_rows lnbbisect: where layer-norm backward's time goes at 16384 x 1024 bf16 (included by bench_rows.cu).
//
// The generated layer-norm backward (dx, and dγ = Σ_rows dy·x̂, dβ = Σ_rows dy over the whole batch) runs 1.38-1.40x
// the floor; softmax backward over the same bytes (dy, y in, dx out, no column sums) 1.00-1.04x. These hand-written
// kernels add one difference at a time, each checked against a CPU reference and timed steady (back to back over 3
// rotating buffer sets, programmatic dependent launches, the column sums' finalize kernel included):
//   MODE 0  dx only, w = 1, no column sums (the ceiling)
//   MODE 1  + w (held as bf16 bits: every row of a row-group has the same columns)
//   MODE 2  + dγ / dβ accumulated in registers over the row-group's rows, reduced once per CTA through shared memory
//   MODE 3  + dγ / dβ accumulated in a shared-memory slice per row-group (read-modify-write per row)
// Row-groups of WPR warps (4 / WPR chunks of 8 per lane), WPC warps per CTA, one wave of CTAs looping over the rows;
// each CTA writes one partial of (dγ, dβ) and the finalize kernel sums the partials in a fixed order.
namespace lnbb {
constexpr int N = 1024;

template <int WPR, int K>
__device__ __forceinline__ void gsum(float (&a)[K], float *red, int &par) {
#pragma unroll
  for (int o = 16; o; o >>= 1)
#pragma unroll
    for (int k = 0; k < K; k++) a[k] += __shfl_xor_sync(0xffffffffu, a[k], o);
  if constexpr (WPR > 1) {
    const int wi = (threadIdx.x >> 5) % WPR, rg = threadIdx.x / (WPR * 32);
    float *slot = red + par * WPR * K;  // (this row-group's 2 parity slots)
    par ^= 1;
    if ((threadIdx.x & 31) == 0)
#pragma unroll
      for (int k = 0; k < K; k++) slot[wi * K + k] = a[k];
    asm volatile("bar.sync %0, %1;" ::"r"(rg + 1), "r"(WPR * 32) : "memory");
#pragma unroll
    for (int k = 0; k < K; k++) {
      float s = 0.f;
#pragma unroll
      for (int q = 0; q < WPR; q++) s += slot[q * K + k];
      a[k] = s;
    }
  }
}

template <int WPR, int WPC, int MODE>
__global__ void __launch_bounds__(WPC * 32, 1) k(const uint4 *__restrict__ dy, const uint4 *__restrict__ x,
                                                 const uint4 *__restrict__ w, uint4 *__restrict__ dx,
                                                 float *__restrict__ ws, int m, float eps) {
  constexpr int VPT = 4 / WPR, T = WPR * 32, RG = WPC / WPR, C = N / 8;
  extern __shared__ __align__(16) float sm[];  // MODE 2 / 3: [RG][2][N]
  __shared__ float red[RG][2 * WPR * 4];
  const int rg = threadIdx.x / T, t = threadIdx.x % T;
  int par = 0;
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  uint4 wr[VPT];
#pragma unroll
  for (int v = 0; v < VPT; v++) {
    if (MODE >= 1) wr[v] = w[v * T + t];
    else wr[v] = make_uint4(0x3f803f80u, 0x3f803f80u, 0x3f803f80u, 0x3f803f80u);  // bf16 1.0
  }
  float ag[VPT][8], ab[VPT][8];
  float *slice = sm + rg * 2 * N;
#pragma unroll
  for (int v = 0; v < VPT; v++)
#pragma unroll
    for (int e = 0; e < 8; e++) ag[v][e] = ab[v][e] = 0.f;
  if constexpr (MODE == 3)  // (each thread touches only its own columns: no barrier)
#pragma unroll
    for (int v = 0; v < VPT; v++)
#pragma unroll
      for (int e = 0; e < 8; e++) slice[(v * T + t) * 8 + e] = slice[N + (v * T + t) * 8 + e] = 0.f;
  for (long long row = (long long)blockIdx.x * RG + rg; row < m; row += (long long)gridDim.x * RG) {
    uint4 rx[VPT], rd[VPT];
#pragma unroll
    for (int v = 0; v < VPT; v++) rx[v] = x[row * C + v * T + t], rd[v] = dy[row * C + v * T + t];
    float s1[1] = {0.f};
#pragma unroll
    for (int v = 0; v < VPT; v++) {
      float f[8];
      lnb::unpack(rx[v], f);
#pragma unroll
      for (int e = 0; e < 8; e++) s1[0] += f[e];
    }
    gsum<WPR>(s1, red[rg], par);
    const float mu = s1[0] * (1.f / N);
    float s3[3] = {0.f, 0.f, 0.f};
#pragma unroll
    for (int v = 0; v < VPT; v++) {
      float f[8], d[8], ww[8];
      lnb::unpack(rx[v], f);
      lnb::unpack(rd[v], d);
      lnb::unpack(wr[v], ww);
#pragma unroll
      for (int e = 0; e < 8; e++) {
        const float c = f[e] - mu, g = d[e] * ww[e];
        s3[0] += c * c, s3[1] += g, s3[2] += g * c;
      }
    }
    gsum<WPR>(s3, red[rg], par);
    const float rs = rsqrtf(s3[0] * (1.f / N) + eps), mg = s3[1] * (1.f / N), mgx = rs * s3[2] * (1.f / N);
#pragma unroll
    for (int v = 0; v < VPT; v++) {
      float f[8], d[8], ww[8], o[8];
      lnb::unpack(rx[v], f);
      lnb::unpack(rd[v], d);
      lnb::unpack(wr[v], ww);
#pragma unroll
      for (int e = 0; e < 8; e++) {
        const float xh = (f[e] - mu) * rs;
        o[e] = rs * (d[e] * ww[e] - mg - xh * mgx);
        if constexpr (MODE == 2) ag[v][e] += d[e] * xh, ab[v][e] += d[e];
        f[e] = d[e] * xh;  // (MODE 3: dγ term)
      }
      dx[row * C + v * T + t] = lnb::pack(o);
      if constexpr (MODE == 3) {
        float4 *pg = reinterpret_cast<float4 *>(slice + (v * T + t) * 8), *pb = reinterpret_cast<float4 *>(slice + N + (v * T + t) * 8);
        float4 g0 = pg[0], g1 = pg[1], b0 = pb[0], b1 = pb[1];
        g0.x += f[0], g0.y += f[1], g0.z += f[2], g0.w += f[3], g1.x += f[4], g1.y += f[5], g1.z += f[6], g1.w += f[7];
        b0.x += d[0], b0.y += d[1], b0.z += d[2], b0.w += d[3], b1.x += d[4], b1.y += d[5], b1.z += d[6], b1.w += d[7];
        pg[0] = g0, pg[1] = g1, pb[0] = b0, pb[1] = b1;
      }
    }
  }
  if constexpr (MODE >= 2) {
    if constexpr (MODE == 2)
#pragma unroll
      for (int v = 0; v < VPT; v++)
#pragma unroll
        for (int e = 0; e < 8; e++) slice[(v * T + t) * 8 + e] = ag[v][e], slice[N + (v * T + t) * 8 + e] = ab[v][e];
    __syncthreads();
    for (int j = threadIdx.x; j < 2 * N; j += blockDim.x) {  // this CTA's partial: the row-groups in order
      float s = 0.f;
      for (int q = 0; q < RG; q++) s += sm[q * 2 * N + j];
      ws[(size_t)blockIdx.x * 2 * N + j] = s;
    }
  }
}

// out[j] = Σ_b ws[b][j] for b < parts, in order (out: dγ then dβ, 2N floats)
__global__ void fin(const float *__restrict__ ws, int parts, float *__restrict__ out) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= 2 * N) return;
  float s = 0.f;
#pragma unroll 8
  for (int b = 0; b < parts; b++) s += ws[(size_t)b * 2 * N + j];
  out[j] = s;
}

typedef void (*fn_t)(const uint4 *, const uint4 *, const uint4 *, uint4 *, float *, int, float);
struct Cfg {
  fn_t f;
  int wpr, wpc, mode;
};
static const Cfg cfgs[] = {{k<1, 16, 0>, 1, 16, 0}, {k<2, 16, 0>, 2, 16, 0}, {k<1, 16, 1>, 1, 16, 1}, {k<2, 16, 1>, 2, 16, 1},
                           {k<1, 16, 2>, 1, 16, 2}, {k<2, 16, 2>, 2, 16, 2}, {k<2, 24, 2>, 2, 24, 2}, {k<2, 8, 2>, 2, 8, 2},
                           {k<1, 16, 3>, 1, 16, 3}, {k<2, 16, 3>, 2, 16, 3}, {k<2, 8, 3>, 2, 8, 3}};
}  // namespace lnbb

static int lnbbisect_main(int argc, char **argv) {
  using namespace lnbb;
  const int M = 16384, K = 3;
  const float eps = 1e-5f;
  char *src, *dst;
  const double bw = floor_bandwidth(&src, &dst);
  int sms = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const size_t xe = (size_t)M * N;
  std::vector<__nv_bfloat16> hx(xe), hd(xe), hw(N);
  std::vector<float> fx(xe), fd(xe), fw(N);
  Rng rng(777);
  for (size_t i = 0; i < xe; i++) {
    hx[i] = __float2bfloat16(rng.uniform(-2.f, 3.f)), fx[i] = __bfloat162float(hx[i]);
    hd[i] = __float2bfloat16(rng.uniform(-1.f, 1.f)), fd[i] = __bfloat162float(hd[i]);
  }
  for (int j = 0; j < N; j++) hw[j] = __float2bfloat16(rng.uniform(0.5f, 1.5f)), fw[j] = __bfloat162float(hw[j]);
  uint4 *dx_[K], *dd[K], *dout[K], *dw;
  float *dws, *dsum;
  for (int r = 0; r < K; r++) {
    CUDA_CHECK(cudaMalloc(&dx_[r], xe * 2));
    CUDA_CHECK(cudaMalloc(&dd[r], xe * 2));
    CUDA_CHECK(cudaMalloc(&dout[r], xe * 2));
    CUDA_CHECK(cudaMemcpy(dx_[r], hx.data(), xe * 2, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dd[r], hd.data(), xe * 2, cudaMemcpyHostToDevice));
  }
  CUDA_CHECK(cudaMalloc(&dw, N * 2));
  CUDA_CHECK(cudaMemcpy(dw, hw.data(), N * 2, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMalloc(&dws, (size_t)8 * sms * 2 * N * 4));
  CUDA_CHECK(cudaMalloc(&dsum, 2 * N * 4));
  // CPU references (double): dx with w and with w = 1, dγ, dβ
  std::vector<double> rdx(xe), rdx1(xe), rg(N, 0.0), rb(N, 0.0);
  for (int i = 0; i < M; i++) {
    const float *xr = &fx[(size_t)i * N], *dr = &fd[(size_t)i * N];
    double s = 0, q = 0;
    for (int j = 0; j < N; j++) s += xr[j];
    const double mu = s / N;
    for (int j = 0; j < N; j++) q += (xr[j] - mu) * (xr[j] - mu);
    const double rs = 1.0 / sqrt(q / N + eps);
    double sg = 0, sgx = 0, sg1 = 0, sgx1 = 0;
    for (int j = 0; j < N; j++) {
      const double xh = (xr[j] - mu) * rs;
      sg += dr[j] * fw[j], sgx += dr[j] * fw[j] * xh, sg1 += dr[j], sgx1 += dr[j] * xh;
      rg[j] += dr[j] * xh, rb[j] += dr[j];
    }
    for (int j = 0; j < N; j++) {
      const double xh = (xr[j] - mu) * rs;
      rdx[(size_t)i * N + j] = rs * (dr[j] * fw[j] - sg / N - xh * sgx / N);
      rdx1[(size_t)i * N + j] = rs * (dr[j] - sg1 / N - xh * sgx1 / N);
    }
  }
  std::vector<double> rsum(rg);
  rsum.insert(rsum.end(), rb.begin(), rb.end());
  const double bytes = 3.0 * xe * 2, floor_us = bytes / bw * 1e6;  // dy, x read, dx written
  printf("\n%-32s | %8s %5s | %5s | %s\n", "variant (warps/row, warps/CTA)", "PDL us", "xflr", "regs", "check (rel err)");
  bool all = true;
  auto check = [&](const char *label, int mode, double tp, int regs, int r0) {
    std::vector<__nv_bfloat16> ho(xe);
    CUDA_CHECK(cudaMemcpy(ho.data(), dout[r0], xe * 2, cudaMemcpyDeviceToHost));
    std::vector<double> out(xe);
    for (size_t i = 0; i < xe; i++) out[i] = __bfloat162float(ho[i]);
    double err = rel_err_v(out, mode == 0 ? rdx1 : rdx);
    if (mode >= 2) {
      std::vector<float> hs(2 * N);
      CUDA_CHECK(cudaMemcpy(hs.data(), dsum, 2 * N * 4, cudaMemcpyDeviceToHost));
      err = std::max(err, rel_err_v(std::vector<double>(hs.begin(), hs.end()), rsum));
    }
    const bool ok = err <= 1e-2;
    all = all && ok;
    printf("%-32s | %8.1f %5.2f | %5d | %s (%.2e)\n", label, tp, tp / floor_us, regs, ok ? "matched" : "NOT MATCHED", err);
    fflush(stdout);
  };
  for (const Cfg &c : cfgs) {
    const size_t smem = c.mode >= 2 ? (size_t)(c.wpc / c.wpr) * 2 * N * 4 : 0;
    CUDA_CHECK(cudaFuncSetAttribute(c.f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    int occ = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, c.f, c.wpc * 32, smem));
    cudaFuncAttributes fa = {};
    CUDA_CHECK(cudaFuncGetAttributes(&fa, c.f));
    const int grid = sms * std::max(occ, 1);
    auto run = [&](int r) {
      launch_ex(c.f, grid, c.wpc * 32, smem, true, dd[r], dx_[r], dw, dout[r], dws, M, eps);
      if (c.mode >= 2) launch_ex(fin, 2 * N / 128, 128, 0, true, dws, grid, dsum);
    };
    CUDA_CHECK(cudaMemset(dout[0], 0xff, xe * 2));
    CUDA_CHECK(cudaMemset(dsum, 0xff, 2 * N * 4));
    run(0);
    CUDA_CHECK(cudaDeviceSynchronize());
    const double tp = steady_us([&](int i) { run(i % K); }, 16 * K);
    char label[64];
    snprintf(label, sizeof label, "mode %d (%d, %d) %d CTA/SM", c.mode, c.wpr, c.wpc, occ);
    check(label, c.mode, tp, fa.numRegs, 0);
  }
  // the generated layer-norm backward of each LABEL=DIR on the same buffers (its finalize included)
  for (int a = 0; a < argc; a++) {
    const char *eq = strchr(argv[a], '=');
    if (!eq) continue;
    std::vector<RowCase> cases;
    const RowCase *c = generated_case(cases, eq + 1, "layernorm_bwd");
    if (!c) {
      all = false;
      continue;
    }
    evt_row_launch_args la[K];
    int nsum = 0;
    for (int r = 0; r < K; r++) {
      la[r] = evt_row_launch_args{};
      la[r].m = M, la[r].n = N;
      la[r].in[0] = dd[r], la[r].in[1] = dx_[r], la[r].in[2] = dw;
      nsum = 0;
      for (int i = 0; i < c->spec.nnodes; i++) {
        if (c->spec.nodes[i].op == EVT_V_AUX_STORE) la[r].ptrs[i] = dout[r];
        if (c->spec.nodes[i].op == EVT_V_ROW_SUM) la[r].ptrs[i] = dsum + N * nsum++;
      }
    }
    CUDA_CHECK(cudaMemset(dout[0], 0xff, xe * 2));
    CUDA_CHECK(cudaMemset(dsum, 0xff, 2 * N * 4));
    int rc = c->fn(&la[0]);
    CUDA_CHECK(cudaDeviceSynchronize());
    const double tp = steady_us([&](int i) { rc |= c->fn(&la[i % K]); }, 16 * K);
    CUDA_CHECK(cudaDeviceSynchronize());
    int info[5] = {0, 0, 0, 0, 0};
    if (c->info) c->info(info);
    char label[64];
    snprintf(label, sizeof label, "generated %.*s W%dV%dR%d %dCTA/SM", (int)(eq - argv[a]), argv[a], info[0], info[1], info[2],
             info[3]);
    if (rc || nsum != 2) printf("%s: launch error or %d sums\n", label, nsum), all = false;
    check(label, 2, tp, info[4], 0);
  }
  return all ? 0 : 1;
}
