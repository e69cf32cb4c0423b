// bench_rows lnbisect: where layer norm's time goes at 16384 x 1024 bf16 (included by bench_rows.cu).
// The generated softmax over 16384 x 1024 bf16 runs 1.13x the floor, the generated layer norm over the same bytes
// 1.25-1.28x. These hand-written one-warp-per-row kernels (4 chunks of 8 per lane, a CTA of WPC rows, one pass) go
// from a row copy to the full layer norm one difference at a time, each checked against a CPU reference, timed
// steady (back to back over 3 rotating buffer sets, programmatic dependent launches as evt launches its kernels).
//   0 copy         y = x
//   1 softmax      max, Σ exp, y = exp(x - max) / Σ
//   2 ln           mean, Σ (x - mean)², y = (x - mean)·rstd
//   3 ln+stats     ... and mean, rstd stored (f32 per row)
//   4 +wb late     ... y = x̂·w + b, w / b loaded per chunk (16-byte bf16 loads, L1 / L2 hits)
//   5 +wb regs     ... w / b loaded once per thread after the wait, held as bf16 (16 + 16 registers)
//   6 +wb early    ... the same loaded before the wait (overlaps the previous kernel: not safe in general)
//   7 +wb smem     ... w / b staged once per CTA as f32 in shared memory
//   8 onepass      3 with Σx and Σx² in one reduction round (var = E[x²] - mean²)
//   9 4+stats last stats stored after y (stores of a row last)
namespace lnb {
constexpr int N = 1024, VPT = 4;
__device__ __forceinline__ void unpack(uint4 r, float *f) {
  const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&r);
#pragma unroll
  for (int i = 0; i < 4; i++) {
    float2 t = __bfloat1622float2(h[i]);
    f[2 * i] = t.x, f[2 * i + 1] = t.y;
  }
}
__device__ __forceinline__ uint4 pack(const float *f) {
  uint4 r;
  __nv_bfloat162 *h = reinterpret_cast<__nv_bfloat162 *>(&r);
#pragma unroll
  for (int i = 0; i < 4; i++) h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
  return r;
}
__device__ __forceinline__ float wsum(float v) {
#pragma unroll
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float wmax(float v) {
#pragma unroll
  for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
template <int V>
__device__ __forceinline__ void body(const uint4 *raw, uint4 *yr, const uint4 *__restrict__ w, const uint4 *__restrict__ b,
                                     const uint4 *wr, const uint4 *br, const float *wbs, float *__restrict__ mean,
                                     float *__restrict__ rstd, int row, int lane, float eps);
template <int V, int WPC>
__global__ void __launch_bounds__(WPC * 32) k(const uint4 *__restrict__ x, uint4 *__restrict__ y, const uint4 *__restrict__ w,
                                              const uint4 *__restrict__ b, float *__restrict__ mean, float *__restrict__ rstd,
                                              int m, float eps) {
  constexpr int C = N / 8;  // 16-byte chunks per row
  const int lane = threadIdx.x & 31, row = blockIdx.x * WPC + threadIdx.x / 32;
  __shared__ float wbs[V == 7 ? 2 * N : 1];
  uint4 wr[VPT], br[VPT];
  if constexpr (V == 6)
#pragma unroll
    for (int v = 0; v < VPT; v++) wr[v] = w[v * 32 + lane], br[v] = b[v * 32 + lane];
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if constexpr (V == 5)
#pragma unroll
    for (int v = 0; v < VPT; v++) wr[v] = w[v * 32 + lane], br[v] = b[v * 32 + lane];
  if constexpr (V == 7) {
    for (int j = threadIdx.x; j < C; j += blockDim.x) {
      unpack(w[j], &wbs[j * 8]);
      unpack(b[j], &wbs[N + j * 8]);
    }
    __syncthreads();
  }
  if (row >= m) return;
  const uint4 *xr = x + (size_t)row * C;
  uint4 *yr = y + (size_t)row * C;
  uint4 raw[VPT];
#pragma unroll
  for (int v = 0; v < VPT; v++) raw[v] = xr[v * 32 + lane];
  if constexpr (V == 0) {
#pragma unroll
    for (int v = 0; v < VPT; v++) yr[v * 32 + lane] = raw[v];
  } else {
    body<V>(raw, yr, w, b, wr, br, wbs, mean, rstd, row, lane, eps);
  }
}
template <int V>
__device__ __forceinline__ void body(const uint4 *raw, uint4 *yr, const uint4 *__restrict__ w, const uint4 *__restrict__ b,
                                     const uint4 *wr, const uint4 *br, const float *wbs, float *__restrict__ mean,
                                     float *__restrict__ rstd, int row, int lane, float eps) {
  float f[VPT][8];
#pragma unroll
  for (int v = 0; v < VPT; v++) unpack(raw[v], f[v]);
  if constexpr (V == 1) {
    float mx = -INFINITY;
#pragma unroll
    for (int v = 0; v < VPT; v++)
#pragma unroll
      for (int e = 0; e < 8; e++) mx = fmaxf(mx, f[v][e]);
    mx = wmax(mx);
    float s = 0.f;
#pragma unroll
    for (int v = 0; v < VPT; v++)
#pragma unroll
      for (int e = 0; e < 8; e++) s += (f[v][e] = __expf(f[v][e] - mx));
    const float inv = 1.f / wsum(s);
#pragma unroll
    for (int v = 0; v < VPT; v++) {
#pragma unroll
      for (int e = 0; e < 8; e++) f[v][e] *= inv;
      yr[v * 32 + lane] = pack(f[v]);
    }
    return;
  }
  float mu, rs;
  if constexpr (V == 8) {
    float s = 0.f, q = 0.f;
#pragma unroll
    for (int v = 0; v < VPT; v++)
#pragma unroll
      for (int e = 0; e < 8; e++) s += f[v][e], q += f[v][e] * f[v][e];
#pragma unroll
    for (int o = 16; o; o >>= 1) {
      s += __shfl_xor_sync(0xffffffffu, s, o);
      q += __shfl_xor_sync(0xffffffffu, q, o);
    }
    mu = s * (1.f / N);
    rs = rsqrtf(fmaxf(q * (1.f / N) - mu * mu, 0.f) + eps);
  } else {
    float s = 0.f;
#pragma unroll
    for (int v = 0; v < VPT; v++)
#pragma unroll
      for (int e = 0; e < 8; e++) s += f[v][e];
    mu = wsum(s) * (1.f / N);
    float q = 0.f;
#pragma unroll
    for (int v = 0; v < VPT; v++)
#pragma unroll
      for (int e = 0; e < 8; e++) q += (f[v][e] - mu) * (f[v][e] - mu);
    rs = rsqrtf(wsum(q) * (1.f / N) + eps);
  }
  if (V >= 3 && V != 9 && lane == 0) mean[row] = mu, rstd[row] = rs;
#pragma unroll
  for (int v = 0; v < VPT; v++) {
    float o[8];
#pragma unroll
    for (int e = 0; e < 8; e++) o[e] = (f[v][e] - mu) * rs;
    if constexpr (V >= 4 && V <= 7 || V == 9) {
      float wf[8], bf[8];
      if constexpr (V == 7) {
#pragma unroll
        for (int e = 0; e < 8; e++) wf[e] = wbs[(v * 32 + lane) * 8 + e], bf[e] = wbs[N + (v * 32 + lane) * 8 + e];
      } else {
        unpack(V == 4 || V == 9 ? w[v * 32 + lane] : wr[v], wf);
        unpack(V == 4 || V == 9 ? b[v * 32 + lane] : br[v], bf);
      }
#pragma unroll
      for (int e = 0; e < 8; e++) o[e] = o[e] * wf[e] + bf[e];
    }
    yr[v * 32 + lane] = pack(o);
  }
  if (V == 9 && lane == 0) mean[row] = mu, rstd[row] = rs;
}
typedef void (*fn_t)(const uint4 *, uint4 *, const uint4 *, const uint4 *, float *, float *, int, float);
template <int WPC>
static fn_t pick(int v) {
  switch (v) {
    case 0: return k<0, WPC>;
    case 1: return k<1, WPC>;
    case 2: return k<2, WPC>;
    case 3: return k<3, WPC>;
    case 4: return k<4, WPC>;
    case 5: return k<5, WPC>;
    case 6: return k<6, WPC>;
    case 7: return k<7, WPC>;
    case 8: return k<8, WPC>;
    default: return k<9, WPC>;
  }
}
// Several rows per warp (RPW, one after the other, the next row's loads in flight while a row is worked on), w / b
// loaded once per warp and held as bf16 bits (16 + 16 registers), x kept as bits and converted where used: the w / b
// traffic through L1 (2 x 2 KB per row with one row per warp, twice x's) divided by RPW. EARLY: w / b before the wait.
template <int WPC, int RPW, bool EARLY>
__global__ void __launch_bounds__(WPC * 32) km(const uint4 *__restrict__ x, uint4 *__restrict__ y, const uint4 *__restrict__ w,
                                               const uint4 *__restrict__ b, float *__restrict__ mean,
                                               float *__restrict__ rstd, int m, float eps) {
  constexpr int C = N / 8;
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const long long base = (long long)blockIdx.x * WPC * RPW + warp;  // rows base + r * WPC
  uint4 wr[VPT], br[VPT];
  if constexpr (EARLY)
#pragma unroll
    for (int v = 0; v < VPT; v++) wr[v] = w[v * 32 + lane], br[v] = b[v * 32 + lane];
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if constexpr (!EARLY)
#pragma unroll
    for (int v = 0; v < VPT; v++) wr[v] = w[v * 32 + lane], br[v] = b[v * 32 + lane];
  uint4 cur[VPT], nxt[VPT];
  if (base < m)
#pragma unroll
    for (int v = 0; v < VPT; v++) cur[v] = x[base * C + v * 32 + lane];
#pragma unroll
  for (int r = 0; r < RPW; r++) {
    const long long row = base + (long long)r * WPC, nrow = row + WPC;
    if (r + 1 < RPW && nrow < m)
#pragma unroll
      for (int v = 0; v < VPT; v++) nxt[v] = x[nrow * C + v * 32 + lane];
    if (row < m) {
      float s = 0.f;
#pragma unroll
      for (int v = 0; v < VPT; v++) {
        float f[8];
        unpack(cur[v], f);
#pragma unroll
        for (int e = 0; e < 8; e++) s += f[e];
      }
      const float mu = wsum(s) * (1.f / N);
      float q = 0.f;
#pragma unroll
      for (int v = 0; v < VPT; v++) {
        float f[8];
        unpack(cur[v], f);
#pragma unroll
        for (int e = 0; e < 8; e++) q += (f[e] - mu) * (f[e] - mu);
      }
      const float rs = rsqrtf(wsum(q) * (1.f / N) + eps);
      if (lane == 0) mean[row] = mu, rstd[row] = rs;
#pragma unroll
      for (int v = 0; v < VPT; v++) {
        float f[8], wf[8], bf[8];
        unpack(cur[v], f);
        unpack(wr[v], wf);
        unpack(br[v], bf);
#pragma unroll
        for (int e = 0; e < 8; e++) f[e] = (f[e] - mu) * rs * wf[e] + bf[e];
        y[row * C + v * 32 + lane] = pack(f);
      }
    }
#pragma unroll
    for (int v = 0; v < VPT; v++) cur[v] = nxt[v];
  }
}
struct MultiCfg {
  fn_t f;
  int wpc, rpw;
  bool early;
};
static const MultiCfg multi[] = {{km<8, 2, false>, 8, 2, false}, {km<8, 4, false>, 8, 4, false}, {km<4, 2, false>, 4, 2, false},
                                 {km<4, 4, false>, 4, 4, false}, {km<4, 8, false>, 4, 8, false}, {km<8, 2, true>, 8, 2, true},
                                 {km<4, 4, true>, 4, 4, true}};
static const char *const names[] = {"copy", "softmax", "ln", "ln+stats", "+wb late", "+wb regs", "+wb early",
                                    "+wb smem", "onepass+stats", "+wb late, stats last"};
}  // namespace lnb

static int lnbisect_main(int argc, char **argv) {
  using namespace lnb;
  const int M = 16384, nvar = 10;
  const float eps = 1e-5f;
  char *src, *dst;
  const double bw = floor_bandwidth(&src, &dst);
  const size_t xe = (size_t)M * N;
  std::vector<__nv_bfloat16> hx(xe), hw(N), hb(N);
  std::vector<float> fx(xe), fw(N), fb(N);
  Rng rng(12345);
  for (size_t i = 0; i < xe; i++) {
    hx[i] = __float2bfloat16(rng.uniform(-2.f, 2.f) + (float)(i / N % 7) * 0.25f);
    fx[i] = __bfloat162float(hx[i]);
  }
  for (int j = 0; j < N; j++) {
    hw[j] = __float2bfloat16(rng.uniform(0.5f, 1.5f)), hb[j] = __float2bfloat16(rng.uniform(-0.5f, 0.5f));
    fw[j] = __bfloat162float(hw[j]), fb[j] = __bfloat162float(hb[j]);
  }
  const int K = 3;  // rotating buffer sets (3 x 67 MB > L2)
  uint4 *dx[K], *dy[K], *dw, *db;
  float *dm[K], *dr[K];
  for (int r = 0; r < K; r++) {
    CUDA_CHECK(cudaMalloc(&dx[r], xe * 2));
    CUDA_CHECK(cudaMalloc(&dy[r], xe * 2));
    CUDA_CHECK(cudaMalloc(&dm[r], M * 4));
    CUDA_CHECK(cudaMalloc(&dr[r], M * 4));
    // LNB_CONST=1: the rotation copies 1 and 2 filled with the byte 0x3c (as bench_rows perf fills them)
    if (r > 0 && getenv("LNB_CONST")) CUDA_CHECK(cudaMemset(dx[r], 0x3c, xe * 2));
    else CUDA_CHECK(cudaMemcpy(dx[r], hx.data(), xe * 2, cudaMemcpyHostToDevice));
  }
  CUDA_CHECK(cudaMalloc(&dw, N * 2));
  CUDA_CHECK(cudaMalloc(&db, N * 2));
  CUDA_CHECK(cudaMemcpy(dw, hw.data(), N * 2, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(db, hb.data(), N * 2, cudaMemcpyHostToDevice));
  // CPU references (double): softmax, x̂, and the row statistics
  std::vector<double> rsm(xe), rxh(xe), rmu(M), rrs(M);
  for (int i = 0; i < M; i++) {
    const float *r = &fx[(size_t)i * N];
    double mx = -INFINITY, s = 0, q = 0;
    for (int j = 0; j < N; j++) mx = std::max(mx, (double)r[j]), s += r[j];
    const double mu = s / N;
    for (int j = 0; j < N; j++) q += (r[j] - mu) * (r[j] - mu);
    const double rs = 1.0 / sqrt(q / N + eps);
    double se = 0;
    for (int j = 0; j < N; j++) se += exp(r[j] - mx);
    for (int j = 0; j < N; j++) {
      rsm[(size_t)i * N + j] = exp(r[j] - mx) / se;
      rxh[(size_t)i * N + j] = (r[j] - mu) * rs;
    }
    rmu[i] = mu, rrs[i] = rs;
  }
  const double bytes = 2.0 * xe * 2, floor_us = bytes / bw * 1e6;  // x read, y written (stats / w / b not counted)
  printf("\n%-22s %-4s | %8s %5s | %8s %5s | %5s | %s\n", "variant", "WPC", "PDL us", "xflr", "plain us", "xflr", "regs",
         "check (rel err)");
  bool all = true;
  // check against the CPU reference (v: which output), then time steady with and without PDL
  auto run = [&](fn_t f, int grid, int threads, int v, const char *label, int wpc) {
    cudaFuncAttributes fa = {};
    CUDA_CHECK(cudaFuncGetAttributes(&fa, f));
    auto launch = [&](int r, bool pdl) { launch_ex(f, grid, threads, 0, pdl, dx[r], dy[r], dw, db, dm[r], dr[r], M, eps); };
    CUDA_CHECK(cudaMemset(dy[0], 0xff, xe * 2));  // NaN-poisoned
    CUDA_CHECK(cudaMemset(dm[0], 0xff, M * 4));
    CUDA_CHECK(cudaMemset(dr[0], 0xff, M * 4));
    launch(0, true);
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<__nv_bfloat16> hy(xe);
    std::vector<float> hm(M), hr(M);
    CUDA_CHECK(cudaMemcpy(hy.data(), dy[0], xe * 2, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(hm.data(), dm[0], M * 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(hr.data(), dr[0], M * 4, cudaMemcpyDeviceToHost));
    std::vector<double> out(xe), ref(xe);
    for (size_t i = 0; i < xe; i++) {
      out[i] = __bfloat162float(hy[i]);
      const int j = (int)(i % N);
      ref[i] = v == 0 ? fx[i] : v == 1 ? rsm[i] : v <= 3 || v == 8 ? rxh[i] : rxh[i] * fw[j] + fb[j];
    }
    double err = rel_err_v(out, ref);
    if (v >= 3) {
      std::vector<double> om(hm.begin(), hm.end()), orr(hr.begin(), hr.end());
      err = std::max(err, std::max(rel_err_v(om, rmu), rel_err_v(orr, rrs)));
    }
    const bool ok = err <= 1e-2;
    all = all && ok;
    const double tp = steady_us([&](int i) { launch(i % K, true); }, 4 * K * 4);
    const double tn = steady_us([&](int i) { launch(i % K, false); }, 4 * K * 4);
    CUDA_CHECK(cudaDeviceSynchronize());
    printf("%-22s %-4d | %8.1f %5.2f | %8.1f %5.2f | %5d | %s (%.2e)\n", label, wpc, tp, tp / floor_us, tn, tn / floor_us,
           fa.numRegs, ok ? "matched" : "NOT MATCHED", err);
    fflush(stdout);
  };
  for (int wpc : {8, 4})
    for (int v = 0; v < nvar; v++) run(wpc == 8 ? pick<8>(v) : pick<4>(v), (M + wpc - 1) / wpc, wpc * 32, v, names[v], wpc);
  for (const MultiCfg &c : multi) {
    char label[64];
    snprintf(label, sizeof label, "rows/warp %d%s", c.rpw, c.early ? " early" : "");
    run(c.f, (M + c.wpc * c.rpw - 1) / (c.wpc * c.rpw), c.wpc * 32, 4, label, c.wpc);
  }
  // the generated layer norm (bf16, w, b, stats) of each LABEL=DIR on the same buffers, launched by its launcher
  for (int k = 0; k < argc; k++) {
    const char *eq = strchr(argv[k], '=');
    if (!eq) continue;
    std::vector<RowCase> cases;
    const RowCase *c = generated_case(cases, eq + 1, "layernorm");
    if (!c) {
      all = false;
      continue;
    }
    int ys = -1;
    for (int i = 0; i < c->spec.nnodes; i++)
      if (c->spec.nodes[i].op == EVT_V_AUX_STORE) ys = i;
    evt_row_launch_args a[K];
    for (int r = 0; r < K; r++) {
      a[r] = evt_row_launch_args{};
      a[r].m = M, a[r].n = N;
      a[r].in[0] = dx[r], a[r].in[1] = dw, a[r].in[2] = db;
      a[r].mean = dm[r], a[r].rstd = dr[r];
      a[r].ptrs[ys] = dy[r];
    }
    CUDA_CHECK(cudaMemset(dy[0], 0xff, xe * 2));
    int rc = c->fn(&a[0]);
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<__nv_bfloat16> hy(xe);
    CUDA_CHECK(cudaMemcpy(hy.data(), dy[0], xe * 2, cudaMemcpyDeviceToHost));
    std::vector<double> out(xe), ref(xe);
    for (size_t i = 0; i < xe; i++) out[i] = __bfloat162float(hy[i]), ref[i] = rxh[i] * fw[i % N] + fb[i % N];
    const double err = rel_err_v(out, ref);
    const bool ok = rc == 0 && err <= 1e-2;
    all = all && ok;
    const double tp = steady_us([&](int i) { rc |= c->fn(&a[i % K]); }, 4 * K * 4);
    const double t12 = steady_us([&](int i) { rc |= c->fn(&a[i % K]); }, 4 * K);  // as many as bench_rows perf
    CUDA_CHECK(cudaDeviceSynchronize());
    int info[5] = {0, 0, 0, 0, 0};
    if (c->info) c->info(info);
    printf("generated %-12.*s      | %8.1f %5.2f | %4.2f over %d launches | W%d V%d R%d, %d CTA/SM | %5d | %s (%.2e)\n",
           (int)(eq - argv[k]), argv[k], tp, tp / floor_us, t12 / floor_us, 4 * K, info[0], info[1], info[2], info[3],
           info[4], ok ? "matched" : "NOT MATCHED", err);
    fflush(stdout);
  }
  return all ? 0 : 1;
}
