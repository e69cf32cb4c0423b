/* The row kernels' __global__ functions (contract in emit_rows_internal.h): row_kernel<WARPS, VPT, R, EX>, the
 * register-resident kernel (a grid-stride loop over blocks of R rows, each row's inputs fetched ahead in a ring,
 * the nucleus, then the epilogue per chunk of 8 columns); row_kernel_long<WARPS> for rows longer than the register
 * configurations take; row_kernel_cols<WARPS, U> for nucleus-free rows without a per-row reduction. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/emit_rows_internal.h"
#include "evt_row_config.h"

/* Row sums' accumulators (evt_rows::RowSums): how many sums stay in registers, the rest in shared memory. */
static void rowsum_types(sbuf *b, int nrowsum) {
  if (nrowsum)
    sb(b, "// row-sum accumulators: the first EVT_ROWS_SUM_REGS (EX kernels: EVT_ROWS_SUM_REGS_EX) sums in registers, the\n"
          "// others in shared memory when asked for and at most 96 KiB per CTA, else all in registers\n"
          "template <bool EX>\nconstexpr int kSumRegsOf = (EX ? EVT_ROWS_SUM_REGS_EX : EVT_ROWS_SUM_REGS) < %d\n"
          "                                ? (EX ? EVT_ROWS_SUM_REGS_EX : EVT_ROWS_SUM_REGS) : %d;\n"
          "template <int WARPS, int VPT, int R, bool EX, int K = kSumRegsOf<EX && VPT >= 2>>  // (one chunk: 1024-thread CTAs, 64 registers)\n"
          "using RSumsOf = evt_rows::RowSums<WARPS * 32, VPT, R, %d,\n"
          "    EVT_ROWS_SMEM_SUM && (size_t)(%d - K) * VPT * 8 * WARPS * 32 * R * 4 <= 98304 ? K : %d>;\n\n",
       nrowsum, nrowsum, nrowsum, nrowsum, nrowsum);
}

/* row_kernel's head: template, launch bounds, thread / row-group indices, the reduction slots. */
static void kernel_head(sbuf *b, const rows_emit *ctx) {
  evt_row_nucleus nu = ctx->nu;
  int nrowsum = ctx->nrowsum, ncolsum = ctx->ncolsum;
  sb(b, nrowsum ? "template <int WARPS, int VPT, int R, bool EX>\n__global__ void __launch_bounds__(WARPS * 32 * R, EVT_ROWS_MINB_SUM) row_kernel(Params p) {\n"
                : "// one-chunk rows: at least 1024 resident threads per SM (caps registers at 64 per thread); one-warp rows\n"
                  "// with more chunks: at least kMinbW1 CTAs per SM, longer rows EVT_ROWS_MINB_MULTI\n"
                  "template <int WARPS, int VPT, int R, bool EX>\n__global__ void __launch_bounds__(WARPS * 32 * R, VPT == 1 && 1024 / (WARPS * 32 * R) > 1 ? 1024 / (WARPS * 32 * R) : WARPS == 1 ? kMinbW1 : EVT_ROWS_MINB_MULTI)\n"
                  "row_kernel(Params p) {\n");
  sb(b, "  constexpr int T = WARPS * 32;\n");
  if (nrowsum) sb(b, "  using RSums = RSumsOf<WARPS, VPT, R, EX>;\n");
  sb(b, "  static_assert(WARPS == 1 || R <= 15, \"named barriers 1..15: one per row-group\");\n");
  /* programmatic dependent launch: no global access before the previous kernel in the stream completed; a kernel
   * without row sums lets the next one start launching at once (its finalize kernel must wait for the partials) */
  sb(b, "  evt_rows::wait_prior_grids();  // launched early (EVT_ROWS_PDL_MAIN): the previous kernel's writes first\n");
  if (!nrowsum) sb(b, "  evt_rows::release_dependents();  // the next kernel may be scheduled into the slots this grid frees\n");
  sb(b, "  const int g = threadIdx.x / T, t = threadIdx.x %% T;\n"
        "  const int n = EX ? T * 8 * VPT : p.n;  // EX: the row fills the group exactly (its bounds checks fold away)\n"
        "  const bool vec = EX || p.vec;  // EX kernels run only with 16-byte aligned tensors\n"
        "  constexpr bool EXF = EX && EVT_ROWS_EX_FULL != 0;  // every chunk a full vector: no bounds tests\n");
  if ((nu != EVT_ROWN_NONE && nu != EVT_ROWN_SPMM) || ncolsum)
    sb(b, "  __shared__ float red[R][evt_rows::red_floats<WARPS>()];  // per row-group reduction slots\n"
          "  evt_rows::Red<WARPS> rk = {red[g], 0};\n");
}

/* Layer norms' w / b: this thread's columns held in registers, staged in shared memory, or (LN_LATE) loaded per
 * chunk by the epilogue. */
static void kernel_wb(sbuf *b, const rows_emit *ctx) {
  const evt_rspec *s = ctx->s;
  evt_row_nucleus nu = ctx->nu;
  int hw = s->has_w, hb = s->has_b;
  if (nu == EVT_ROWN_LAYERNORM || nu == EVT_ROWN_LAYERNORM_BWD) {
    /* w / b: this thread's columns in registers, loaded once; from EVT_ROWS_WB_SMEM_VPT chunks per thread
     * (WB_SMEM; rows of at most 2048 elements) they would take 16·VPT registers, so the CTA stages them in shared
     * memory as f32 once and each row reads its chunks back (16-byte loads) */
    /* layer norm forward with EVT_ROWS_LN_LATE: w / b are not held at all; each chunk's 8 columns are loaded
     * (L1 hits after the first row) right where the epilogue applies them, so they take no registers across the
     * row reductions */
    if (nu == EVT_ROWN_LAYERNORM)
      sb(b, "  constexpr bool LN_LATE = kLnLate;  // w / b applied per chunk in the epilogue\n");
    else
      sb(b, "  constexpr bool LN_LATE = EVT_ROWS_LNB_LATE != 0;  // w read per chunk (reductions, then dx)\n");
    sb(b, "  constexpr bool WB_SMEM = !LN_LATE && VPT >= EVT_ROWS_WB_SMEM_VPT && T * VPT <= 256;  // (at most 16 KiB)\n"
          "  __shared__ __align__(16) float wb_s[2][WB_SMEM ? T * 8 * VPT : 4];  // w, b as f32 (WB_SMEM)\n"
          "  float nu_w[VPT][8], nu_b[VPT][8];  // this thread's columns of w / b\n"
          "  if constexpr (WB_SMEM) {\n"
          "    for (int j = threadIdx.x; j < T * 8 * VPT; j += blockDim.x) {\n"
          "      wb_s[0][j] = %s;\n      wb_s[1][j] = %s;\n    }\n    __syncthreads();\n  } else if constexpr (!LN_LATE) {\n",
       hw ? "j < n ? evt_rows::to_f(p.w[j]) : 0.f" : "0.f", hb ? "j < n ? evt_rows::to_f(p.b[j]) : 0.f" : "0.f");
    sb(b, hw ? "    evt_rows::load_row<T, VPT>(p.w, n, t, true, vec, nu_w);\n"
             : "    evt_rows::load_row<T, VPT>((const float *)nullptr, n, t, false, false, nu_w);  // no w\n");
    sb(b, hb ? "    evt_rows::load_row<T, VPT>(p.b, n, t, true, vec, nu_b);\n"
             : "    evt_rows::load_row<T, VPT>((const float *)nullptr, n, t, false, false, nu_b);  // no b\n");
    sb(b, "  }\n");
  }
}

/* Row broadcasts held or (RB_LATE) loaded per chunk, the scalars, the row sums' accumulators. */
static void kernel_row_vectors(sbuf *b, const rows_emit *ctx) {
  const evt_rspec *s = ctx->s;
  int nrb = ctx->nrb, nrowsum = ctx->nrowsum;
  /* row broadcasts: this thread's columns loaded once and held, or (RB_LATE: holding them all would take
   * EVT_ROWS_RB_LATE_FLOATS registers or more) one chunk at a time where the epilogue uses them */
  if (nrb)
    sb(b, "  constexpr bool RB_LATE = VPT * 8 * %d >= EVT_ROWS_RB_LATE_FLOATS;  // row broadcasts per chunk, below\n", nrb);
  for (int i = 0; i < s->nnodes; i++)
    if (s->nodes[i].op == EVT_V_ROW_BCAST)
      sb(b, "  float L%d[RB_LATE ? 1 : VPT][8];  // row_bcast %s (held unless RB_LATE)\n"
            "  if constexpr (!RB_LATE) evt_rows::load_row<T, VPT>(p.n%d_%s, n, t, true, vec, L%d);\n",
         i, s->nodes[i].name, i, s->nodes[i].name, i);
  evt_emit_rows_scalar_loads(b, s);
  if (nrowsum)
    sb(b, "  extern __shared__ __align__(16) float dyn_smem[];\n"
          "  RSums rsum;  // this thread's columns of the row sums over the CTA's rows\n  rsum.init(dyn_smem, g, t);\n");
}

/* The prefetch ring's first D rows, then the row loop's head: the row's inputs taken from the ring, the row D
 * ahead fetched. */
static void kernel_row_loop(sbuf *b, const rows_emit *ctx) {
  const rows_input *rin = ctx->rin;
  int nrin = ctx->nrin, nrowsum = ctx->nrowsum, nstore = ctx->nstore;
  sb(b, "  const long long stride = (long long)gridDim.x * R;\n");
  if (nrin)
    sb(b, "  // prefetch ring: rows i+1 .. i+D of this row-group in flight while row i is worked on; none when the\n"
          "  // launch gives each row-group one row (ONE: one pass, a CTA per R rows) and EVT_ROWS_ONE_RING is 0\n"
          "  constexpr bool ONE = %s && EVT_ROWS_ONE_RING == 0;\n"
          "  constexpr int D = !ONE && VPT <= EVT_ROWS_DEPTH_VPT && %s ? EVT_ROWS_DEPTH : 1;\n",
       nrowsum ? "false" : "WARPS == 1 && EVT_ROWS_WAVES_W1 == 0", nrowsum ? "EVT_ROWS_DEEP_SUM" : "true");
  for (int k = 0; k < nrin; k++)
    sb(b, "  evt_rows::Raw8<%s> q_%s[D][VPT];  // %s, the next D rows\n", rin[k].type, rin[k].arr, rin[k].field);
  if (nrin)
    sb(b, "#pragma unroll\n  for (int d = 0; d < D; d++) {  // the first D rows\n"
          "    const long long row = (long long)blockIdx.x * R + g + d * stride;\n    const bool live = row < p.m;\n");
  for (int k = 0; k < nrin; k++)
    sb(b, "    evt_rows::fetch_row<T, VPT, EXF>(p.%s + (live ? row * n : 0), n, t, live, vec, q_%s[d]);\n", rin[k].field,
       rin[k].arr);
  if (nrin) sb(b, "  }\n");
  sb(b, "  for (long long base = (long long)blockIdx.x * R; base < p.m; base += stride) {\n");
  sb(b, "    const long long row = base + g;\n    const bool live = row < p.m;\n"
        "    const long long ro = live ? row * n : 0;  // row offset\n");
  if (!nstore) sb(b, "    (void)ro;  // (no M×N store)\n");
  if (nrin) {
    sb(b, "    const long long nrow = row + D * stride;  // the row to fetch now\n"
          "    const bool nlive = nrow < p.m;\n");
    for (int k = 0; k < nrin; k++) {
      sb(b, "    evt_rows::Raw8<%s> c_%s[VPT];\n#pragma unroll\n    for (int v = 0; v < VPT; v++) {\n"
            "      c_%s[v] = q_%s[0][v];\n#pragma unroll\n      for (int d = 0; d + 1 < D; d++) q_%s[d][v] = q_%s[d + 1][v];\n"
            "    }\n",
         rin[k].type, rin[k].arr, rin[k].arr, rin[k].arr, rin[k].arr, rin[k].arr);
      sb(b, "    if constexpr (!ONE)\n"
            "      evt_rows::fetch_row<T, VPT, EXF>(p.%s + (nlive ? nrow * n : 0), n, t, nlive, vec, q_%s[D - 1]);\n",
         rin[k].field, rin[k].arr);
    }
  }
}

/* The nucleus on the register-resident row. */
static void kernel_nucleus(sbuf *b, const rows_emit *ctx) {
  const evt_rspec *s = ctx->s;
  evt_row_nucleus nu = ctx->nu;
  int hw = s->has_w, hb = s->has_b;
  if (nu == EVT_ROWN_LAYERNORM || nu == EVT_ROWN_LAYERNORM_BWD)
    sb(b, "    if constexpr (WB_SMEM) {  // this row's copy of the staged w / b chunks\n"
          "      evt_rows::smem_row<T, VPT>(wb_s[0], t, nu_w);\n      evt_rows::smem_row<T, VPT>(wb_s[1], t, nu_b);\n    }\n");
  switch (nu) {
    case EVT_ROWN_SOFTMAX:
      sb(b, "    float nu_in0[VPT][8], nu_out[VPT][8];\n    evt_rows::unpack_row(c_in0, nu_in0);\n"
            "    evt_rows::softmax<WARPS, VPT>(nu_in0, nu_out, n, t, rk);\n");
      break;
    case EVT_ROWN_SOFTMAX_BWD:
      sb(b, "    float nu_in0[VPT][8], nu_in1[VPT][8], nu_out[VPT][8];\n"
            "    evt_rows::unpack_row(c_in0, nu_in0);\n    evt_rows::unpack_row(c_in1, nu_in1);\n"
            "    evt_rows::softmax_bwd<WARPS, VPT>(nu_in0, nu_in1, nu_out, n, t, rk);\n");
      break;
    case EVT_ROWN_LAYERNORM:
      sb(b, "    float nu_in0[VPT][8], nu_xhat[VPT][8], nu_out[VPT][8], mean, rstd;\n"
            "    evt_rows::unpack_row(c_in0, nu_in0);\n"
            "    if constexpr (LN_LATE)  // x̂ and y = x̂·w + b per chunk, below\n"
            "      evt_rows::ln_moments<WARPS, VPT>(nu_in0, p.eps, &mean, &rstd, n, t, rk);\n"
            "    else\n"
            "      evt_rows::layernorm<WARPS, VPT, %s, %s>(nu_in0, nu_w, nu_b, p.eps, nu_xhat, nu_out, &mean, &rstd, n, t, "
            "rk);\n", hw ? "true" : "false", hb ? "true" : "false");
      if (s->store_stats)
        sb(b, "    if (live && t == 0) {\n      p.mean[row] = mean;\n      p.rstd[row] = rstd;\n    }\n");
      else
        sb(b, "    (void)mean;\n    (void)rstd;\n");
      break;
    case EVT_ROWN_LAYERNORM_BWD:
      sb(b, "    float nu_in0[VPT][8], nu_in1[VPT][8], nu_xhat[VPT][8], nu_out[VPT][8];\n"
            "    evt_rows::unpack_row(c_in0, nu_in0);\n    evt_rows::unpack_row(c_in1, nu_in1);\n"
            "    float lnb_rs = 0.f, lnb_mg = 0.f, lnb_mgx = 0.f;  // (LN_LATE) rstd, mean(g), mean(g·x̂)\n"
            "    if constexpr (LN_LATE)  // x̂ in place of x; dx per chunk, below\n"
            "      evt_rows::layernorm_bwd_stats<WARPS, VPT, %s>(nu_in0, nu_in1, %s, vec, p.eps, lnb_rs, lnb_mg, lnb_mgx, n, t, rk);\n"
            "    else\n"
            "      evt_rows::layernorm_bwd<WARPS, VPT, %s>(nu_in0, nu_in1, nu_w, p.eps, nu_xhat, nu_out, n, t, rk);\n",
         hw ? "true" : "false", hw ? "p.w" : "(const float *)nullptr", hw ? "true" : "false");
      break;
    case EVT_ROWN_SPMM: /* the row gathered from x through A's CSR (kernels/evt_spmm.cuh) */
      sb(b, "    float nu_out[VPT][8];\n"
            "    evt_rows::spmm_row<T, VPT, EXF>(p.rowptr, p.col, p.val, p.perm, p.x, row, live, p.k, p.nnz, n, t, vec, p.err,\n"
            "                                    p.err_code, nu_out);\n");
      break;
    default: break;
  }
}

void evt_emit_rows_kernel(sbuf *b, const rows_emit *ctx) {
  int nrin = ctx->nrin, nrowsum = ctx->nrowsum;
  rowsum_types(b, nrowsum);
  kernel_head(b, ctx);
  kernel_wb(b, ctx);
  kernel_row_vectors(b, ctx);
  kernel_row_loop(b, ctx);
  kernel_nucleus(b, ctx);
  evt_emit_rows_epilogue(b, ctx, 0);
  if (nrin) sb(b, "    if constexpr (ONE) break;  // (the row-group's only row: nothing carried to a next iteration)\n");
  sb(b, "  }\n");
  if (nrowsum) sb(b, "  evt_rows::trigger_dependents();  // the finalize kernel may start launching\n");
  if (nrowsum) sb(b, "  rsum.flush(p.ws + (size_t)blockIdx.x * n, (size_t)gridDim.x * n, n, g, t);\n");
  sb(b, "}\n\n");
}

/* Rows the register configurations do not take (no row sums): one CTA per row, the nucleus's statistics in passes
 * over the row, then chunk by chunk its values and the epilogue. */
void evt_emit_rows_long_kernel(sbuf *b, const rows_emit *ctx) {
  const evt_rspec *s = ctx->s;
  evt_row_nucleus nu = ctx->nu;
  const rows_input *rin = ctx->rin;
  const char *w_t = ctx->w_t;
  int nrin = ctx->nrin;
  sb(b, "// Rows longer than a register-resident row-group takes (evt_row_pick_config refuses N > 32768): one CTA of\n"
        "// WARPS warps per row, the nucleus's statistics in passes over the row, then chunk by chunk the nucleus's\n"
        "// values and the epilogue (evt_rows::long_*).\n"
        "#ifndef EVT_ROWS_LONG_MINB  // long rows: __launch_bounds__ minimum CTAs per SM\n#define EVT_ROWS_LONG_MINB %d\n#endif\n"
        "template <int WARPS>\n__global__ void __launch_bounds__(WARPS * 32, EVT_ROWS_LONG_MINB) row_kernel_long(Params p) {\n"
        "  constexpr int T = WARPS * 32;\n"
        "  evt_rows::wait_prior_grids();  // launched early (EVT_ROWS_PDL_MAIN): the previous kernel's writes first\n"
        "  evt_rows::release_dependents();\n"
        "  const int t = threadIdx.x, n = p.n;\n"
        "  __shared__ float red[evt_rows::red_floats<WARPS>()];\n  evt_rows::Red<WARPS> rk = {red, 0};\n  (void)rk;\n",
     nu == EVT_ROWN_SOFTMAX || nu == EVT_ROWN_SOFTMAX_BWD ? EVT_ROWS_DEFAULT_LONG_MINB : EVT_ROWS_DEFAULT_LONG_MINB_HEAVY);
  evt_emit_rows_scalar_loads(b, s);
  sb(b, "  for (long long row = blockIdx.x; row < p.m; row += gridDim.x) {\n"
        "    const bool live = true;\n    (void)live;\n    const long long ro = row * n;  // row offset\n");
  if (nrin)
    sb(b, "    const int h = evt_rows::long_head(p.%s + ro);  // elements before its first 16-byte boundary\n", rin[0].field);
  else
    sb(b, "    const int h = 0;\n");
  const char *wn = s->has_w ? "p.w" : NULL;
  char wnull[64];
  snprintf(wnull, sizeof wnull, "(const %s *)nullptr", w_t);
  switch (nu) {
    case EVT_ROWN_SOFTMAX:
      sb(b, "    float sm_m2, sm_inv;  // max · log2(e), 1 / Σ\n"
            "    evt_rows::long_softmax_stats<WARPS>(p.x + ro, n, h, t, rk, sm_m2, sm_inv);\n");
      break;
    case EVT_ROWN_SOFTMAX_BWD:
      sb(b, "    const float sb_dot = evt_rows::long_softmax_bwd_stats<WARPS>(p.dy + ro, p.y + ro, n, h, t, rk);\n");
      break;
    case EVT_ROWN_LAYERNORM:
      sb(b, "    float mean, rstd;\n    evt_rows::long_ln_stats<WARPS>(p.x + ro, n, h, p.eps, t, rk, mean, rstd);\n");
      if (s->store_stats) sb(b, "    if (t == 0) {\n      p.mean[row] = mean;\n      p.rstd[row] = rstd;\n    }\n");
      break;
    case EVT_ROWN_LAYERNORM_BWD:
      sb(b, "    float lnb_mu, lnb_rs, lnb_mg, lnb_mgx;\n"
            "    evt_rows::long_lnb_stats<WARPS>(p.dy + ro, p.x + ro, %s, n, h, p.eps, t, rk, lnb_mu, lnb_rs, lnb_mg, lnb_mgx);\n",
         wn ? wn : wnull);
      break;
    default: break;
  }
  evt_emit_rows_epilogue(b, ctx, 1);
  sb(b, "  }\n}\n\n");
}

/* row_kernel_cols's head: tuning knobs, thread layout (rows side by side or column blocks), row broadcasts. */
static void cols_kernel_head(sbuf *b, const rows_emit *ctx) {
  const evt_rspec *s = ctx->s;
  int nrowsum = ctx->nrowsum;
  sb(b, "// Nucleus-free rows without a per-row reduction, as a tile of 8-column chunks: a row of cpr < T chunks takes cpr\n"
        "// threads and a CTA S = T / cpr rows side by side (short rows: every lane busy); longer rows a column block of\n"
        "// T chunks per CTA (blockIdx.x), S = 1. CTA (x, y) takes the rows of slice y, U rows per thread fetched\n"
        "// together (their loads in flight at once), then each row's epilogue; sums over M accumulate in registers,\n"
        "// are added over the S rows side by side in a fixed order, and give partials ws[k][y][n] for rowsum_finalize.\n"
        "#ifndef EVT_ROWS_COLS_WARPS\n#define EVT_ROWS_COLS_WARPS %d\n#endif\n"
        "#ifndef EVT_ROWS_PACK_CHUNKS  // rows of at most this many 8-element chunks take this kernel (0: only long rows)\n"
        "#define EVT_ROWS_PACK_CHUNKS %d\n#endif\n"
        "#ifndef EVT_ROWS_PACK_CHUNKS_SUM  // ... in kernels with sums over M\n"
        "#define EVT_ROWS_PACK_CHUNKS_SUM %d\n#endif\n"
        "#ifndef EVT_ROWS_PACK_ONE_WAVE  // short rows with sums over M: one wave of resident CTAs (fewer partials)\n"
        "#define EVT_ROWS_PACK_ONE_WAVE %d\n#endif\n"
        "#ifndef EVT_ROWS_PACK_UNROLL  // rows per thread whose loads are issued together: several rows side by side\n"
        "#define EVT_ROWS_PACK_UNROLL %d\n#endif\n"
        "#ifndef EVT_ROWS_COLS_UNROLL  // ... column blocks of long rows\n"
        "#define EVT_ROWS_COLS_UNROLL %d\n#endif\n"
        "template <int WARPS, int U>\n__global__ void __launch_bounds__(WARPS * 32) row_kernel_cols(Params p) {\n"
        "  constexpr int T = WARPS * 32;\n"
        "  evt_rows::wait_prior_grids();  // launched early (EVT_ROWS_PDL_MAIN): the previous kernel's writes first\n",
     EVT_ROWS_DEFAULT_COLS_WARPS, EVT_ROWS_DEFAULT_PACK_CHUNKS, EVT_ROWS_DEFAULT_PACK_CHUNKS_SUM,
     EVT_ROWS_DEFAULT_PACK_ONE_WAVE, EVT_ROWS_DEFAULT_PACK_UNROLL,
     EVT_ROWS_DEFAULT_COLS_UNROLL);
  if (!nrowsum) sb(b, "  evt_rows::release_dependents();  // the next kernel may be scheduled into the slots this grid frees\n");
  sb(b, "  const int n = p.n, es = 1, lim = n;\n"
        "  const int cpr = (n + 7) / 8, cw = cpr < T ? cpr : T, S = T / cw;  // threads per row, rows side by side\n"
        "  const int c = threadIdx.x %% cw, sub = threadIdx.x / cw;  // sub >= S: idle (T %% cw threads)\n"
        "  const int j0 = (blockIdx.x * cw + c) * 8;  // this thread's 8 columns\n"
        "  const bool full = p.vec && j0 + 8 <= n;\n  (void)es;\n  (void)lim;\n  (void)full;\n");
  evt_emit_rows_scalar_loads(b, s);
  for (int i = 0; i < s->nnodes; i++)
    if (s->nodes[i].op == EVT_V_ROW_BCAST)
      sb(b, "  float L%d[1][8];  // row_bcast %s: this thread's columns (loaded once)\n"
            "  evt_rows::load8s(p.n%d_%s, j0, es, lim, full, L%d[0]);\n",
         i, s->nodes[i].name, i, s->nodes[i].name, i);
  for (int k = 0; k < nrowsum; k++) sb(b, "  float rsa%d[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};  // row sum %d\n", k, k);
  sb(b, "  const long long rows_per = ((long long)p.m + gridDim.y - 1) / gridDim.y;\n"
        "  const long long r0 = (long long)blockIdx.y * rows_per, r1 = r0 + rows_per < p.m ? r0 + rows_per : p.m;\n"
        "  if (sub < S && j0 < n) {\n"
        "    for (long long rb = r0 + sub; rb < r1; rb += (long long)S * U) {\n");
}

/* The row loop: U rows' loads issued together, then each row's epilogue. */
static void cols_kernel_rows(sbuf *b, const rows_emit *ctx) {
  const evt_rspec *s = ctx->s;
  int nstore = ctx->nstore;
  for (int i = 0; i < s->nnodes; i++)
    if (s->nodes[i].op == EVT_V_AUX_LOAD)
      sb(b, "      evt_rows::Raw8<%s> f_L%d[U];  // %s, U rows\n", ctype(s->nodes[i].dtype), i, s->nodes[i].name);
  sb(b, "#pragma unroll\n      for (int u = 0; u < U; u++) {  // the U rows' loads first\n"
        "        const long long row = rb + (long long)u * S;\n        const bool ok = row < r1;\n        (void)ok;\n");
  for (int i = 0; i < s->nnodes; i++)
    if (s->nodes[i].op == EVT_V_AUX_LOAD)
      sb(b, "        evt_rows::fetch8s(p.n%d_%s + (ok ? row * n : 0), j0, es, ok ? lim : 0, full && ok, f_L%d[u]);\n", i,
         s->nodes[i].name, i);
  sb(b, "      }\n#pragma unroll\n      for (int u = 0; u < U; u++) {\n"
        "        const long long row = rb + (long long)u * S;\n        if (row >= r1) break;\n"
        "        const bool live = true;\n        (void)live;\n        const long long ro = row * n;  // row offset\n");
  if (!nstore) sb(b, "        (void)ro;  // (no M×N store)\n");
  {  /* the epilogue (written for a row loop at depth 1) indented to this loop's depth */
    sbuf e = {0};
    evt_emit_rows_epilogue(&e, ctx, 2);
    for (const char *q = e.p; q && *q;) {
      const char *nl = strchr(q, '\n');
      const int len = nl ? (int)(nl - q) : (int)strlen(q);
      sb(b, *q != '#' && len ? "    %.*s\n" : "%.*s\n", len, q);
      q += len + (nl ? 1 : 0);
    }
    free(e.p);
  }
  sb(b, "      }\n    }\n  }\n");
}

/* Sums over M: the S rows side by side added in a fixed order, one partial per slice into the workspace. */
static void cols_kernel_sums(sbuf *b, int nrowsum) {
  sb(b, "  evt_rows::trigger_dependents();  // the finalize kernel may start launching\n"
        "  if (S > 1) {  // (uniform over the CTA) the S rows side by side added in order: sub 0's threads hold the sums\n"
        "    __shared__ float cred[8 * T];\n");
  for (int k = 0; k < nrowsum; k++)
    sb(b, "    __syncthreads();\n#pragma unroll\n    for (int e = 0; e < 8; e++) cred[e * T + threadIdx.x] = rsa%d[e];\n"
          "    __syncthreads();\n    if (sub == 0)\n#pragma unroll\n      for (int e = 0; e < 8; e++) {\n"
          "        float a = 0.f;\n        for (int q = 0; q < S; q++) a += cred[e * T + q * cw + c];\n"
          "        rsa%d[e] = a;\n      }\n", k, k);
  sb(b, "  }\n  if (sub == 0 && j0 < n) {\n");
  for (int k = 0; k < nrowsum; k++)
    sb(b, "#pragma unroll\n    for (int e = 0; e < 8; e++)\n"
          "      if (j0 + e < n) p.ws[((size_t)%d * gridDim.y + blockIdx.y) * n + j0 + e] = rsa%d[e];\n", k, k);
  sb(b, "  }\n");
}

/* Nucleus-free rows without a per-row reduction, as a tile of 8-column chunks: short rows several side by side in
 * a CTA (every lane busy), rows with sums over M that the register kernels refuse in column blocks. */
void evt_emit_rows_cols_kernel(sbuf *b, const rows_emit *ctx) {
  cols_kernel_head(b, ctx);
  cols_kernel_rows(b, ctx);
  if (ctx->nrowsum) cols_kernel_sums(b, ctx->nrowsum);
  sb(b, "}\n\n");
}
