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
//   MODE 4  MODE 2 at one warp per row, rows fed through a per-warp cp.async pipeline in shared memory (k4)
//   MODE 5  tiles of rows staged in shared memory: dx a warp per row, then dγ / dβ a thread per column (k5)
// Row-groups of WPR warps (4 / WPR chunks of 8 per lane), WPC warps per CTA, one wave of CTAs looping over the rows;
// each CTA writes one partial of (dγ, dβ) and the finalize kernel sums the partials in a fixed order. Modes 2-5 are
// timed again without the finalize launch (its cost). LNBB_CFG="i,j,..." runs only those entries of cfgs ("-": none).
// Session 30 (S30W2, S30W5): no hand-written form with column sums beat the generated kernel (1.38x with its
// finalize): MODE 4 1.39-1.49 (1.29 without the finalize), MODE 5 1.53-1.85; the finalize costs 1.8-3.4 us.
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

// A 16-byte shared-memory load ptxas may not merge with an earlier one (k4 re-reads the staged row in each
// pass instead of holding it in registers).
__device__ __forceinline__ uint4 lds(const uint4 *p) {
  uint4 r;
  asm volatile("ld.volatile.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "r"((unsigned)__cvta_generic_to_shared(p))
               : "memory");
  return r;
}

// A row staged in shared memory (x at xr, dy at dr: 4 chunks of 8 per lane, chunk v of lane l at [v·32 + l]; w in
// sw): mean, rstd, mean(g) and rstd · mean(g·(x − mean)), g = dy·w — one warp, two shuffle rounds (k4, k5).
__device__ __forceinline__ void staged_stats(const uint4 *xr, const uint4 *dr, const uint4 *sw, int lane, float eps,
                                             float &mu, float &rs, float &mg, float &mgx) {
  float s1 = 0.f;
#pragma unroll
  for (int v = 0; v < 4; v++) {
    float f[8];
    lnb::unpack(lds(xr + v * 32 + lane), f);
#pragma unroll
    for (int e = 0; e < 8; e++) s1 += f[e];
  }
#pragma unroll
  for (int o = 16; o; o >>= 1) s1 += __shfl_xor_sync(0xffffffffu, s1, o);
  mu = s1 * (1.f / N);
  float s3[3] = {0.f, 0.f, 0.f};
#pragma unroll
  for (int v = 0; v < 4; v++) {
    float f[8], d[8], ww[8];
    lnb::unpack(lds(xr + v * 32 + lane), f);
    lnb::unpack(lds(dr + v * 32 + lane), d);
    lnb::unpack(lds(sw + v * 32 + lane), ww);
#pragma unroll
    for (int e = 0; e < 8; e++) {
      const float c = f[e] - mu, g = d[e] * ww[e];
      s3[0] += c * c, s3[1] += g, s3[2] += g * c;
    }
  }
#pragma unroll
  for (int o = 16; o; o >>= 1)
#pragma unroll
    for (int k = 0; k < 3; k++) s3[k] += __shfl_xor_sync(0xffffffffu, s3[k], o);
  rs = rsqrtf(s3[0] * (1.f / N) + eps);
  mg = s3[1] * (1.f / N);
  mgx = rs * s3[2] * (1.f / N);
}

// MODE 4: one warp per row (4 chunks of 8 per lane), dγ / dβ in registers (64 per lane), the rows fed through a
// per-warp S-stage cp.async pipeline in shared memory: each lane copies its own 16-byte chunks of x and dy S − 1 rows
// ahead and reads back only what it copied (its own wait_group makes them visible: no barrier), so the bytes in
// flight do not cost registers. w is read from shared memory (loaded once per CTA). Three passes over the staged row
// (Σx; Σ(x−μ)², Σg, Σg(x−μ); dx and the column sums). Each CTA writes one partial of (dγ, dβ) (its warps in order).
template <int WPC, int S>
__global__ void __launch_bounds__(WPC * 32, 1) k4(const uint4 *__restrict__ dy, const uint4 *__restrict__ x,
                                                  const uint4 *__restrict__ w, uint4 *__restrict__ dx,
                                                  float *__restrict__ ws, int m, float eps) {
  constexpr int C = N / 8;
  extern __shared__ __align__(16) uint4 sbuf[];  // [WPC][S][2][4][32] staged rows, then [WPC][2][N] floats
  __shared__ uint4 sw[C];
  const int wi = threadIdx.x >> 5, lane = threadIdx.x & 31;
  uint4 *mine = sbuf + (size_t)wi * S * 256;
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  for (int j = threadIdx.x; j < C; j += WPC * 32) sw[j] = w[j];
  const long long G = (long long)gridDim.x * WPC, r0 = (long long)blockIdx.x * WPC + wi;
  auto issue = [&](long long row, int stage) {
    if (row < m) {
      uint4 *st = mine + stage * 256;
#pragma unroll
      for (int v = 0; v < 4; v++) {
        const unsigned sx = (unsigned)__cvta_generic_to_shared(st + v * 32 + lane);
        const unsigned sd = (unsigned)__cvta_generic_to_shared(st + 128 + v * 32 + lane);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sx), "l"(x + row * C + v * 32 + lane) : "memory");
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sd), "l"(dy + row * C + v * 32 + lane) : "memory");
      }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
  };
#pragma unroll
  for (int s = 0; s < S - 1; s++) issue(r0 + s * G, s);
  __syncthreads();  // sw
  float ag[4][8], ab[4][8];
#pragma unroll
  for (int v = 0; v < 4; v++)
#pragma unroll
    for (int e = 0; e < 8; e++) ag[v][e] = ab[v][e] = 0.f;
  int stage = 0;
  for (long long row = r0; row < m; row += G) {
    asm volatile("cp.async.wait_group %0;" ::"n"(S - 2) : "memory");
    const uint4 *st = mine + stage * 256;
    float mu, rs, mg, mgx;
    staged_stats(st, st + 128, sw, lane, eps, mu, rs, mg, mgx);
#pragma unroll
    for (int v = 0; v < 4; v++) {
      float f[8], d[8], ww[8], o[8];
      lnb::unpack(lds(st + v * 32 + lane), f);
      lnb::unpack(lds(st + 128 + v * 32 + lane), d);
      lnb::unpack(lds(sw + v * 32 + lane), ww);
#pragma unroll
      for (int e = 0; e < 8; e++) {
        const float xh = (f[e] - mu) * rs;
        o[e] = rs * (d[e] * ww[e] - mg - xh * mgx);
        ag[v][e] += d[e] * xh, ab[v][e] += d[e];
      }
      dx[row * C + v * 32 + lane] = lnb::pack(o);
    }
    issue(row + (S - 1) * G, (stage + S - 1) % S);  // into the stage read last iteration (its values are used)
    stage = stage + 1 == S ? 0 : stage + 1;
  }
  asm volatile("cp.async.wait_group 0;" ::: "memory");
  __syncthreads();  // every warp done with its stages: reuse them for the flush
  float *sm = reinterpret_cast<float *>(sbuf);
#pragma unroll
  for (int v = 0; v < 4; v++)
#pragma unroll
    for (int e = 0; e < 8; e++)
      sm[(size_t)wi * 2 * N + (v * 32 + lane) * 8 + e] = ag[v][e], sm[(size_t)wi * 2 * N + N + (v * 32 + lane) * 8 + e] = ab[v][e];
  __syncthreads();
  for (int j = threadIdx.x; j < 2 * N; j += blockDim.x) {
    float s = 0.f;
    for (int q = 0; q < WPC; q++) s += sm[q * 2 * N + j];
    ws[(size_t)blockIdx.x * 2 * N + j] = s;
  }
}

// MODE 5: the column sums taken from a staged tile instead of per row. A CTA of WPC warps walks tiles of TR rows;
// each tile's x and dy arrive through cp.async in one of two shared-memory stages (the next tile in flight while
// this one is worked on). Phase A: a warp per row (TR / WPC rows each) forms the row's statistics and dx from the
// staged row (w from shared memory) and leaves mean / rstd in shared memory. Phase B: thread t owns CPT columns and
// adds dy·x̂ and dy over the tile's rows from the same stage — 2·CPT accumulators instead of 64, no per-row
// read-modify-write of shared memory. Each CTA writes its partial (its threads' columns) to ws.
template <int CPT>
__device__ __forceinline__ void lds_bf(const __nv_bfloat16 *p, float (&f)[CPT]) {
  if constexpr (CPT == 8) {
    lnb::unpack(lds(reinterpret_cast<const uint4 *>(p)), f);
  } else if constexpr (CPT == 4) {
    uint2 r;
    asm volatile("ld.volatile.shared.v2.u32 {%0, %1}, [%2];" : "=r"(r.x), "=r"(r.y) : "r"((unsigned)__cvta_generic_to_shared(p)) : "memory");
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&r.x));
    const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&r.y));
    f[0] = a.x, f[1] = a.y, f[2] = b.x, f[3] = b.y;
  } else {
    unsigned r;
    asm volatile("ld.volatile.shared.u32 %0, [%1];" : "=r"(r) : "r"((unsigned)__cvta_generic_to_shared(p)) : "memory");
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&r));
    f[0] = a.x, f[1] = a.y;
  }
}

template <int WPC, int TR>
__global__ void __launch_bounds__(WPC * 32, 1) k5(const uint4 *__restrict__ dy, const uint4 *__restrict__ x,
                                                  const uint4 *__restrict__ w, uint4 *__restrict__ dx,
                                                  float *__restrict__ ws, int m, float eps) {
  constexpr int C = N / 8, NT = WPC * 32, CPT = N / NT, TILE = TR * C;  // TILE: 16-byte chunks per tensor per tile
  static_assert(TR % WPC == 0 && CPT >= 2 && CPT <= 8, "rows per warp, columns per thread");
  extern __shared__ __align__(16) uint4 sbuf[];  // [2][2][TR][C]: stage, (x, dy), row, chunk
  __shared__ uint4 sw[C];
  __shared__ float smu[TR], srs[TR];
  const int wi = threadIdx.x >> 5, lane = threadIdx.x & 31;
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  for (int j = threadIdx.x; j < C; j += NT) sw[j] = w[j];
  const int tiles = (m + TR - 1) / TR;
  auto issue = [&](int tile, int stage) {
    if (tile < tiles) {
      uint4 *st = sbuf + stage * 2 * TILE;
      const long long g0 = (long long)tile * TILE;
#pragma unroll 4
      for (int c = threadIdx.x; c < TILE; c += NT) {
        if ((long long)tile * TR + c / C < m) {
          const unsigned sx = (unsigned)__cvta_generic_to_shared(st + c), sd = (unsigned)__cvta_generic_to_shared(st + TILE + c);
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sx), "l"(x + g0 + c) : "memory");
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sd), "l"(dy + g0 + c) : "memory");
        }
      }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
  };
  issue(blockIdx.x, 0);
  issue(blockIdx.x + gridDim.x, 1);
  float ag[CPT], ab[CPT];
#pragma unroll
  for (int e = 0; e < CPT; e++) ag[e] = ab[e] = 0.f;
  int stage = 0;
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    asm volatile("cp.async.wait_group 1;" ::: "memory");
    __syncthreads();  // this tile's stage complete for every thread (and sw)
    const uint4 *st = sbuf + stage * 2 * TILE;
    // phase A: a warp per row
#pragma unroll 1
    for (int r = wi; r < TR; r += WPC) {
      const long long row = (long long)tile * TR + r;
      if (row >= m) break;
      const uint4 *xr = st + r * C, *dr = st + TILE + r * C;
      float mu, rs, mg, mgx;
      staged_stats(xr, dr, sw, lane, eps, mu, rs, mg, mgx);
      if (lane == 0) smu[r] = mu, srs[r] = rs;
#pragma unroll
      for (int v = 0; v < 4; v++) {
        float f[8], d[8], ww[8], o[8];
        lnb::unpack(lds(xr + v * 32 + lane), f);
        lnb::unpack(lds(dr + v * 32 + lane), d);
        lnb::unpack(lds(sw + v * 32 + lane), ww);
#pragma unroll
        for (int e = 0; e < 8; e++) o[e] = rs * (d[e] * ww[e] - mg - (f[e] - mu) * rs * mgx);
        dx[row * C + v * 32 + lane] = lnb::pack(o);
      }
    }
    __syncthreads();  // mean / rstd of every row of the tile
    // phase B: thread t's columns over the tile's rows
    const __nv_bfloat16 *xb = reinterpret_cast<const __nv_bfloat16 *>(st), *db = reinterpret_cast<const __nv_bfloat16 *>(st + TILE);
    const int rows = (int)min((long long)TR, (long long)m - (long long)tile * TR);
#pragma unroll 4
    for (int r = 0; r < rows; r++) {
      float f[CPT], d[CPT];
      lds_bf<CPT>(xb + r * N + threadIdx.x * CPT, f);
      lds_bf<CPT>(db + r * N + threadIdx.x * CPT, d);
      const float mu = smu[r], rs = srs[r];
#pragma unroll
      for (int e = 0; e < CPT; e++) ag[e] = fmaf(d[e], (f[e] - mu) * rs, ag[e]), ab[e] += d[e];
    }
    __syncthreads();  // the stage and smu / srs are free again
    issue(tile + 2 * gridDim.x, stage);
    stage ^= 1;
  }
  asm volatile("cp.async.wait_group 0;" ::: "memory");
#pragma unroll
  for (int e = 0; e < CPT; e++) {
    ws[(size_t)blockIdx.x * 2 * N + threadIdx.x * CPT + e] = ag[e];
    ws[(size_t)blockIdx.x * 2 * N + N + threadIdx.x * CPT + e] = ab[e];
  }
}

// out[j] = Σ_b ws[b][j] for b < parts in a fixed order (out: dγ then dβ, 2N floats). Block (32, 32) per 32 columns:
// thread (x, y) sums b ≡ y (mod 32), then y = 0..31 in order (evt_rows::rowsum_finalize's form; a thread per column
// summing all parts serially took ~10 us of L2 round trips at 132 parts).
__global__ void fin(const float *__restrict__ ws, int parts, float *__restrict__ out) {
  __shared__ float s[32][33];
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const int j = blockIdx.x * 32 + threadIdx.x;
  float a = 0.f;
#pragma unroll 8
  for (int b = threadIdx.y; b < parts; b += 32) a += ws[(size_t)b * 2 * N + j];
  s[threadIdx.y][threadIdx.x] = a;
  __syncthreads();
  if (threadIdx.y == 0) {
    float r = 0.f;
#pragma unroll
    for (int k = 0; k < 32; k++) r += s[k][threadIdx.x];
    out[j] = r;
  }
}

typedef void (*fn_t)(const uint4 *, const uint4 *, const uint4 *, uint4 *, float *, int, float);
struct Cfg {
  fn_t f;
  int wpr, wpc, mode, stages;  // stages: MODE 4's pipeline depth
};
static const Cfg cfgs[] = {{k<1, 16, 0>, 1, 16, 0}, {k<2, 16, 0>, 2, 16, 0}, {k<1, 16, 1>, 1, 16, 1}, {k<2, 16, 1>, 2, 16, 1},
                           {k<1, 16, 2>, 1, 16, 2}, {k<2, 16, 2>, 2, 16, 2}, {k<2, 24, 2>, 2, 24, 2}, {k<2, 8, 2>, 2, 8, 2},
                           {k<1, 16, 3>, 1, 16, 3}, {k<2, 16, 3>, 2, 16, 3}, {k<2, 8, 3>, 2, 8, 3},
                           {k4<8, 3>, 1, 8, 4, 3},   {k4<8, 4>, 1, 8, 4, 4},   {k4<12, 3>, 1, 12, 4, 3},
                           {k4<12, 4>, 1, 12, 4, 4}, {k4<16, 2>, 1, 16, 4, 2}, {k4<16, 3>, 1, 16, 4, 3},
                           {k4<4, 4>, 1, 4, 4, 4},   {k4<4, 6>, 1, 4, 4, 6},
                           {k5<8, 16>, 1, 8, 5, 16}, {k5<8, 8>, 1, 8, 5, 8},   {k5<4, 8>, 1, 4, 5, 8},
                           {k5<16, 16>, 1, 16, 5, 16}, {k5<4, 4>, 1, 4, 5, 4}, {k5<8, 24>, 1, 8, 5, 24}};
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
  bool nofin = false;
  const char *only = getenv("LNBB_CFG");  // e.g. "2,14": the hand-written configurations run (index in cfgs; "-": none)
  for (const Cfg &c : cfgs) {
    if (only) {
      char idx[16];
      snprintf(idx, sizeof idx, ",%d,", (int)(&c - cfgs));
      if (!strstr((std::string(",") + only + ",").c_str(), idx)) continue;
    }
    size_t smem = c.mode >= 2 ? (size_t)(c.wpc / c.wpr) * 2 * N * 4 : 0;
    if (c.mode == 4) smem = std::max(smem, (size_t)c.wpc * c.stages * 256 * 16);
    if (c.mode == 5) smem = (size_t)2 * 2 * c.stages * N * 2;  // (stages: the tile's rows)
    CUDA_CHECK(cudaFuncSetAttribute(c.f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    int occ = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, c.f, c.wpc * 32, smem));
    cudaFuncAttributes fa = {};
    CUDA_CHECK(cudaFuncGetAttributes(&fa, c.f));
    const int grid = sms * std::max(occ, 1);
    auto run = [&](int r) {
      launch_ex(c.f, grid, c.wpc * 32, smem, true, dd[r], dx_[r], dw, dout[r], dws, M, eps);
      if (c.mode >= 2 && !nofin) launch_ex(fin, dim3(2 * N / 32), dim3(32, 32), 0, true, dws, grid, dsum);
    };
    CUDA_CHECK(cudaMemset(dout[0], 0xff, xe * 2));
    CUDA_CHECK(cudaMemset(dsum, 0xff, 2 * N * 4));
    run(0);
    CUDA_CHECK(cudaDeviceSynchronize());
    const double tp = steady_us([&](int i) { run(i % K); }, 16 * K);
    char label[64];
    if (c.mode == 4) snprintf(label, sizeof label, "mode 4 (1, %d) S%d %d CTA/SM", c.wpc, c.stages, occ);
    else if (c.mode == 5) snprintf(label, sizeof label, "mode 5 (%d warps, %d-row tiles) %d CTA/SM", c.wpc, c.stages, occ);
    else snprintf(label, sizeof label, "mode %d (%d, %d) %d CTA/SM", c.mode, c.wpr, c.wpc, occ);
    check(label, c.mode, tp, fa.numRegs, 0);
    if (c.mode >= 2) {  // the same without the finalize launch (its cost; dγ / dβ not checked)
      nofin = true;
      const double t2 = steady_us([&](int i) { run(i % K); }, 16 * K);
      nofin = false;
      printf("%-32s | %8.1f %5.2f | %5d | (not checked)\n", "  without the finalize", t2, t2 / floor_us, fa.numRegs);
    }
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
