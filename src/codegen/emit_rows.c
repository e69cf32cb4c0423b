/* CUDA C++ emitter for row kernels (contract in rspec.h, evt_emit_rows; device code in kernels/evt_rows.cuh).
 *
 * Output, in order (deterministic: the same spec gives the same bytes, so the JIT cache hits):
 *   1. a banner marking the file generated, with the spec's canonical text;
 *   2. in `namespace evt_gen_<hash>`: `Params` (sizes, the vector flag, one typed pointer per tensor),
 *      `template <WARPS, VPT, R> __global__ row_kernel`: a grid-stride loop over blocks of R rows (all
 *      threads iterate alike, so group reductions may synchronize); per row the nucleus (evt_rows::softmax /
 *      softmax_bwd / layernorm / layernorm_bwd on register-resident rows), then per chunk of 8 columns the
 *      epilogue: chunk loads (aux, row broadcast), one straight-line f32 statement per node and element,
 *      chunk stores; col_sum accumulates per thread and is reduced per row; row_sum (Σ over M) accumulates
 *      per thread across the CTA's rows, and at the end each CTA writes one partial N-vector to a workspace;
 *      `launch<WARPS, VPT>`: block size, grid (one warp per row: one pass, a CTA per R rows; otherwise, and
 *      always with row sums, at most one wave of resident CTAs: the loop prefetches the next row, and the
 *      partial count stays small; EVT_ROWS_WAVES*), workspace, the kernel, then evt_rows::rowsum_finalize per row sum
 *      (fixed-order two-pass: deterministic on a given GPU, no atomics);
 *      without row sums also `row_kernel_long<WARPS>` + `launch_long`: rows longer than the register
 *      configurations take (N > 32768), one CTA per row, the nucleus's statistics in passes over the row
 *      (evt_rows::long_*), then chunk by chunk the nucleus's values and the same epilogue (emit_epilogue, lng);
 *      nucleus-free kernels without a per-row reduction also `row_kernel_cols<WARPS, U>` + `launch_cols`: the
 *      tile in 8-column chunks, short rows (at most EVT_ROWS_PACK_CHUNKS[_SUM] chunks) several side by side in a
 *      CTA, long rows with sums over M in column blocks; U rows' loads per thread issued together;
 *   3. `extern "C" int evt_rowkernel_<hash>(const evt_row_launch_args *)`: argument checks, the 16-byte
 *      vector flag (N % 8 == 0 and every M×N / N-vector pointer 16-byte aligned), configuration choice
 *      (short rows of a nucleus-free kernel: the column-block kernel; else evt_row_pick_config,
 *      kernels/evt_row_config.h; none: the long-row or column-block kernel, or refused) and dispatch.
 * R (row-groups per CTA): 8 warps per CTA for plain kernels, 16 with row sums (fewer partials), ≥ WARPS.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/rspec.h"
#include "evt_row_config.h"
#include "ir/ir.h"

typedef evt_sbuf sbuf;
#define sb evt_sbuf_printf

static const char *ctype(evt_dtype t) {
  switch (t) {
    case EVT_BF16: return "__nv_bfloat16";
    case EVT_F16: return "__half";
    case EVT_BOOL: return "unsigned char";
    case EVT_I64: return "long long";
    case EVT_I32: return "int";
    default: return "float";
  }
}


static int is_int(evt_dtype t) { return t == EVT_I64 || t == EVT_I32; }
static int is_16bit(evt_dtype t) { return t == EVT_BF16 || t == EVT_F16; }

static const char *binop(evt_vop op) {
  switch (op) {
    case EVT_V_ADD: return "+";
    case EVT_V_SUB: return "-";
    case EVT_V_MUL: return "*";
    case EVT_V_DIV: return "/";
    default: return NULL;
  }
}

static const char *fn(evt_vop op) {
  switch (op) {
    case EVT_V_RELU: return "relu";
    case EVT_V_SIGMOID: return "sigmoid";
    case EVT_V_GELU_ERF: return "gelu_erf";
    case EVT_V_GELU_TANH: return "gelu_tanh";
    case EVT_V_GELU_ERF_GRAD: return "gelu_erf_grad";
    case EVT_V_GELU_TANH_GRAD: return "gelu_tanh_grad";
    case EVT_V_RELU_GRAD: return "relu_grad";
    case EVT_V_NEG: return "neg";
    case EVT_V_EXP: return "exp_";
    case EVT_V_LOG: return "log_";
    case EVT_V_ERF: return "erf_";
    case EVT_V_TANH: return "tanh_";
    case EVT_V_SQRT: return "sqrt_";
    case EVT_V_RSQRT: return "rsqrt_";
    case EVT_V_RECIPROCAL: return "reciprocal";
    case EVT_V_ABS: return "abs_";
    case EVT_V_SIGN: return "sign";
    case EVT_V_ROUND_BF16: return "round_bf16";
    case EVT_V_ROUND_F16: return "round_f16";
    case EVT_V_MAXIMUM: return "maximum";
    case EVT_V_MINIMUM: return "minimum";
    case EVT_V_EQ: return "eq";
    case EVT_V_NE: return "ne";
    case EVT_V_LT: return "lt";
    case EVT_V_LE: return "le";
    case EVT_V_GT: return "gt";
    case EVT_V_GE: return "ge";
    case EVT_V_WHERE: return "where";
    default: return NULL;
  }
}

static const char *const acc_arrays[EVT_RV_COUNT] = {"nu_out", "nu_xhat", "nu_in0", "nu_in1"};

/* Long-row kernel: this chunk's nucleus values (nu_in0 / nu_in1 / nu_xhat / nu_out as [1][8] arrays) from the row
 * statistics the kernel computed (emit_long_kernel) */
static void emit_long_chunk(sbuf *b, const evt_rspec *s) {
  const char *w_t = ctype(s->w_dtype);
  char w[64], bb[64];
  snprintf(w, sizeof w, s->has_w ? "p.w" : "(const %s *)nullptr", w_t);
  snprintf(bb, sizeof bb, s->has_b ? "p.b" : "(const %s *)nullptr", w_t);
  switch (s->nucleus) {
    case EVT_ROWN_SOFTMAX:
      sb(b, "      float nu_in0[1][8], nu_out[1][8];\n"
            "      evt_rows::long_softmax_chunk(p.x + ro, j0, es, lim, full, sm_m2, sm_inv, nu_in0[0], nu_out[0]);\n"
            "      (void)nu_in0;\n");
      break;
    case EVT_ROWN_SOFTMAX_BWD:
      sb(b, "      float nu_in0[1][8], nu_in1[1][8], nu_out[1][8];\n"
            "      evt_rows::long_softmax_bwd_chunk(p.dy + ro, p.y + ro, j0, es, lim, full, sb_dot, nu_in0[0], nu_in1[0], nu_out[0]);\n");
      break;
    case EVT_ROWN_LAYERNORM:
      sb(b, "      float nu_in0[1][8], nu_xhat[1][8], nu_out[1][8];\n"
            "      evt_rows::long_ln_chunk(p.x + ro, %s, %s, j0, es, lim, full, mean, rstd, nu_in0[0], nu_xhat[0], nu_out[0]);\n"
            "      (void)nu_in0;\n      (void)nu_xhat;\n", w, bb);
      break;
    case EVT_ROWN_LAYERNORM_BWD:
      sb(b, "      float nu_in0[1][8], nu_in1[1][8], nu_xhat[1][8], nu_out[1][8];\n"
            "      evt_rows::long_lnb_chunk(p.dy + ro, p.x + ro, %s, j0, es, lim, full, lnb_mu, lnb_rs, lnb_mg, lnb_mgx, nu_in0[0],\n"
            "                               nu_in1[0], nu_xhat[0], nu_out[0]);\n"
            "      (void)nu_in1;\n      (void)nu_xhat;\n", w);
      break;
    default: break;
  }
}

/* The epilogue of one row: per-row values (column broadcasts, per-row reduction accumulators), then per chunk of 8
 * columns its loads, one statement per node and element, its stores, then the per-row reductions. lng 1: the long-row
 * kernel's form (this thread's chunk of each block, the nucleus's chunk values and the M×N loads per chunk); lng 2:
 * the column-block kernel's (one chunk, j0 / es / lim / full set by the kernel; the M×N loads already fetched in
 * f_L<i>[u], row_kernel_cols's batch of U rows; the row broadcasts loaded once before the row loop; row sums into
 * registers rsa<k>). */
static void emit_epilogue(sbuf *b, const evt_rspec *s, const int *users, const int *rsk, int lng) {
  evt_row_nucleus nu = s->nucleus;
  int hw = s->has_w, hb = s->has_b;
  for (int i = 0; i < s->nnodes; i++) {
    const evt_rnode *v = &s->nodes[i];
    if (v->op == EVT_V_COL_BCAST && is_int(v->dtype)) /* integers ride in doubles: exact */
      sb(b, "    const double cb%d = live ? (double)p.n%d_%s[row] : 0.0;  // col_bcast\n", i, i, v->name);
    else if (v->op == EVT_V_COL_BCAST)
      sb(b, "    const float cb%d = live ? evt_rows::to_f(p.n%d_%s[row]) : 0.f;  // col_bcast\n", i, i, v->name);
    if (v->op == EVT_V_COL_SUM) sb(b, "    float cs%d = 0.f;  // col_sum %s\n", i, v->name);
    if (v->op == EVT_V_COL_MAX) sb(b, "    float cm%d = -INFINITY;  // col_max %s\n", i, v->name);
    if (v->op == EVT_V_ONE_HOT)
      sb(b, "    const long long oh%d = live ? (long long)p.n%d_%s[row] : -1;  // one_hot class of this row\n", i, i, v->name);
  }
  if (!lng) {
    sb(b, "#pragma unroll\n    for (int v = 0; v < VPT; v++) {\n      const int j0 = (v * T + t) * 8;\n"
          "      if (!live || (!EXF && j0 >= n)) continue;\n"
          "      const bool full = EXF || (vec && j0 + 8 <= n);\n"
          "      (void)full;\n");
    for (int i = 0; i < s->nnodes; i++)
      if (s->nodes[i].op == EVT_V_ROW_BCAST)
        sb(b, "      if constexpr (RB_LATE) evt_rows::load8(p.n%d_%s, j0, n, full, L%d[0]);  // row_bcast %s\n", i,
           s->nodes[i].name, i, s->nodes[i].name);
  } else if (lng == 2) { /* the column-block kernel: this thread's 8 columns of this row */
    sb(b, "    if (j0 < n) {\n      const int v = 0;\n      (void)v;\n");
  } else {
    sb(b, "    // this thread's chunk of each block of 8·T elements: elements j0 + e·es < lim (evt_rows::long_head; h > 0:\n"
          "    // the first block is the head, thread 0's elements 0 .. h - 1; the others 16-byte aligned in the first input)\n"
          "    for (int jb = h > 0 ? h - 8 * T : 0; jb < n; jb += 8 * T) {\n"
          "      const bool head = jb < 0;\n"
          "      const int v = 0, j0 = head ? 0 : jb + (h >= 0 ? t * 8 : t), es = h >= 0 ? 1 : T, lim = head ? h : n;\n"
          "      if (head ? t != 0 : j0 >= n) continue;\n"
          "      const bool full = !head && h >= 0 && j0 + 8 <= n;\n      (void)full;\n");
    emit_long_chunk(b, s);
  }
  for (int i = 0; lng && i < s->nnodes; i++) {
    const evt_rnode *v = &s->nodes[i];
    if (v->op == EVT_V_AUX_LOAD && lng == 2) /* fetched with the batch's other rows (row_kernel_cols) */
      sb(b, "      evt_rows::Raw8<%s> c_L%d[1] = {f_L%d[u]};  // %s\n", ctype(v->dtype), i, i, v->name);
    else if (v->op == EVT_V_AUX_LOAD)
      sb(b, "      evt_rows::Raw8<%s> c_L%d[1];  // %s\n      evt_rows::fetch8s(p.n%d_%s + ro, j0, es, lim, full, c_L%d[0]);\n",
         ctype(v->dtype), i, v->name, i, v->name, i);
    if (v->op == EVT_V_ROW_BCAST && lng != 2) /* (row_kernel_cols loads its columns once) */
      sb(b, "      float L%d[1][8];  // row_bcast %s\n      evt_rows::load8s(p.n%d_%s, j0, es, lim, full, L%d[0]);\n", i, v->name, i,
         v->name, i);
  }
  if (nu == EVT_ROWN_LAYERNORM_BWD && !lng)
    sb(b, "      if constexpr (LN_LATE) {  // this chunk's w, then dx (as layernorm_bwd forms it)\n"
           "        float w8[8];\n"
           "%s"
           "#pragma unroll\n        for (int e = 0; e < 8; e++) {\n"
           "          const bool ok = j0 + e < n;\n"
           "          nu_xhat[v][e] = nu_in1[v][e];\n"
           "          nu_out[v][e] = ok ? lnb_rs * (%s - lnb_mg - nu_in1[v][e] * lnb_mgx) : 0.f;\n"
           "        }\n      }\n",
       hw ? "        evt_rows::load8(p.w, j0, n, full, w8);\n" : "#pragma unroll\n        for (int e = 0; e < 8; e++) w8[e] = 1.f;  // no w\n",
       hw ? "__fmul_rn(nu_in0[v][e], w8[e])" : "nu_in0[v][e]");
  if (nu == EVT_ROWN_LAYERNORM && !lng)
    sb(b, "      if constexpr (LN_LATE) {  // this chunk's x̂, w / b, then y\n"
           "        float w8[8], b8[8];\n"
           "%s%s"
           "#pragma unroll\n        for (int e = 0; e < 8; e++) {\n"
           "          nu_xhat[v][e] = j0 + e < n ? (nu_in0[v][e] - mean) * rstd : 0.f;\n"
           "          nu_out[v][e] = nu_xhat[v][e] * w8[e] + b8[e];\n"
           "        }\n"
           "      }\n",
       hw ? "        evt_rows::load8(p.w, j0, n, full, w8);\n"
          : "#pragma unroll\n        for (int e = 0; e < 8; e++) w8[e] = 1.f;  // no w\n",
       hb ? "        evt_rows::load8(p.b, j0, n, full, b8);\n"
          : "#pragma unroll\n        for (int e = 0; e < 8; e++) b8[e] = 0.f;  // no b\n");
  for (int i = 0; i < s->nnodes; i++) {
    const evt_rnode *v = &s->nodes[i];
    const char *et = is_int(v->dtype) ? "double" : "float"; /* integer tensors: values in doubles (exact) */
    if (v->op == EVT_V_AUX_LOAD) sb(b, "      %s L%d[8];\n      evt_rows::unpack8(c_L%d[v], L%d);\n", et, i, i, i);
    if (v->op == EVT_V_AUX_STORE) sb(b, "      %s S%d[8];\n", et, i);
    if (v->op == EVT_V_ROW_SUM) sb(b, "      float RS%d[8];  // this chunk's terms of row_sum %s\n", i, v->name);
  }
  /* rand over contiguous columns j0 .. j0 + 7 (not long rows, whose elements may be T apart): drawn before the
   * element loop, four elements per Philox call (evt_rows::rand8) */
  for (int i = 0; lng != 1 && i < s->nnodes; i++)
    if (s->nodes[i].op == EVT_V_RAND)
      sb(b, "      float R%d[8];  // rand\n      evt_rows::rand8<%s>(%lluull, %lluull, rng_step, (unsigned long long)row * n + j0, R%d);\n",
         i, ctype(s->nodes[i].dtype), (unsigned long long)s->nodes[i].seed, (unsigned long long)s->nodes[i].offset, i);
  /* the column of element e: j0 + e (register kernel), j0 + e·es (long rows) */
  const char *col = lng ? "j0 + e * es" : "j0 + e";
  sb(b, "#pragma unroll\n      for (int e = 0; e < 8; e++) {\n        const bool ok = %s < %s;\n        (void)ok;\n", col,
     lng ? "lim" : "n");
  for (int i = 0; i < s->nnodes; i++) {
    const evt_rnode *v = &s->nodes[i];
    int a = v->in[0], c = v->in[1];
    switch (v->op) {
      case EVT_V_ACC: sb(b, "        const auto v%d = %s[v][e];\n", i, acc_arrays[v->sel]); break;
      case EVT_V_AUX_LOAD: sb(b, "        const auto v%d = L%d[e];  // %s\n", i, i, v->name); break;
      case EVT_V_ROW_BCAST:
        sb(b, "        const auto v%d = L%d[%s][e];  // %s\n", i, i, lng ? "v" : "RB_LATE ? 0 : v", v->name);
        break;
      case EVT_V_COL_BCAST: sb(b, "        const auto v%d = cb%d;\n", i, i); break;
      case EVT_V_SCALAR: sb(b, "        const auto v%d = (float)(%.17g);\n", i, v->value); break;
      case EVT_V_SCALAR_LOAD: sb(b, "        const auto v%d = sl%d;  // %s\n", i, i, v->name); break;
      case EVT_V_RAND:
        if (lng != 1)
          sb(b, "        const auto v%d = R%d[e];  // rand\n", i, i);
        else
          sb(b, "        const auto v%d = evt_rows::rand_u<%s>(%lluull, %lluull, rng_step, (unsigned long long)row * n + %s);  // rand\n",
             i, ctype(v->dtype), (unsigned long long)v->seed, (unsigned long long)v->offset, col);
        break;
      case EVT_V_ONE_HOT: sb(b, "        const auto v%d = (long long)(%s) == oh%d ? 1.f : 0.f;  // %s\n", i, col, i, v->name); break;
      case EVT_V_COL_MAX:
        sb(b, "        if (ok) cm%d = evt_rows::nanmax(cm%d, v%d);  // %s\n        const auto v%d = v%d;\n", i, i, a, v->name, i, a);
        break;
      case EVT_V_AUX_STORE: sb(b, "        S%d[e] = v%d;  // %s\n        const auto v%d = v%d;\n", i, a, v->name, i, a); break;
      case EVT_V_ROW_SUM:
        sb(b, "        RS%d[e] = ok ? (float)v%d : 0.f;  // %s\n        const auto v%d = v%d;\n", i, a, v->name, i, a);
        break;
      case EVT_V_COL_SUM:
        sb(b, "        if (ok) cs%d += v%d;  // %s\n        const auto v%d = v%d;\n", i, a, v->name, i, a);
        break;
      default:
        if (binop(v->op))
          sb(b, "        const auto v%d = v%d %s v%d;\n", i, a, binop(v->op), c);
        else if (evt_vop_arity(v->op) == 3)
          sb(b, "        const auto v%d = evt_rows::%s(v%d, v%d, v%d);\n", i, fn(v->op), a, c, v->in[2]);
        else if (evt_vop_arity(v->op) == 2)
          sb(b, "        const auto v%d = evt_rows::%s(v%d, v%d);\n", i, fn(v->op), a, c);
        else
          sb(b, "        const auto v%d = evt_rows::%s(v%d);\n", i, fn(v->op), a);
        break;
    }
    if (!users[i]) sb(b, "        (void)v%d;\n", i);
  }
  sb(b, "      }\n");
  for (int i = 0; i < s->nnodes; i++)
    if (s->nodes[i].op == EVT_V_AUX_STORE)
      sb(b, lng ? "      evt_rows::store8s(p.n%d_%s + ro, j0, es, lim, full, S%d);\n"
                : "      evt_rows::store8(p.n%d_%s + ro, j0, n, full, S%d);\n", i, s->nodes[i].name, i);
    else if (s->nodes[i].op == EVT_V_ROW_SUM && lng == 2)
      sb(b, "#pragma unroll\n      for (int e = 0; e < 8; e++) rsa%d[e] += RS%d[e];\n", rsk[i], i);
    else if (s->nodes[i].op == EVT_V_ROW_SUM)
      sb(b, "      rsum.add8(%d, v, RS%d);\n", rsk[i], i);
  sb(b, "    }\n");
  for (int i = 0; i < s->nnodes; i++)
    if (s->nodes[i].op == EVT_V_COL_SUM)
      sb(b, "    cs%d = evt_rows::group_sum1<WARPS>(cs%d, rk);\n    if (live && t == 0) p.n%d_%s[row] = evt_rows::from_f<%s>(cs%d);\n", i, i,
         i, s->nodes[i].name, ctype(s->nodes[i].dtype), i);
    else if (s->nodes[i].op == EVT_V_COL_MAX)
      sb(b, "    cm%d = evt_rows::group_nanmax1<WARPS>(cm%d, rk);\n    if (live && t == 0) p.n%d_%s[row] = evt_rows::from_f<%s>(cm%d);\n", i, i,
         i, s->nodes[i].name, ctype(s->nodes[i].dtype), i);
}

/* Whether the spec draws random numbers (a rand node: the kernel then reads the run's RNG step) */
static bool has_rand(const evt_rspec *s) {
  for (int i = 0; i < s->nnodes; i++)
    if (s->nodes[i].op == EVT_V_RAND) return true;
  return false;
}

/* The kernel's scalars (after wait_prior_grids: the previous kernel may have written them): rank-0 loads and,
 * with rand nodes, the run's RNG step (kernels/philox.h; evt_row_launch_args.rng_step) */
static void emit_scalar_loads(sbuf *b, const evt_rspec *s) {
  if (has_rand(s)) sb(b, "  const unsigned long long rng_step = p.rng_step ? *p.rng_step : 0ull;  // the run's RNG step\n");
  for (int i = 0; i < s->nnodes; i++)
    if (s->nodes[i].op == EVT_V_SCALAR_LOAD)
      sb(b, is_int(s->nodes[i].dtype) ? "  const double sl%d = (double)p.n%d_%s[0];  // scalar_load (rank-0 tensor)\n"
                                       : "  const float sl%d = evt_rows::to_f(p.n%d_%s[0]);  // scalar_load (rank-0 tensor)\n",
         i, i, s->nodes[i].name);
}

/* The row sums' finalize launch (launch<> and launch_cols): parts = the expression naming the partial count */
static void emit_rowsum_finalize(sbuf *b, const evt_rspec *s, int nrowsum, const char *parts) {
  sb(b, "  evt_rows::RowSumOuts outs = {};\n");
  for (int i = 0, k = 0; i < s->nnodes; i++)
    if (s->nodes[i].op == EVT_V_ROW_SUM) {
      evt_dtype dt = s->nodes[i].dtype;
      sb(b, "  outs.p[%d] = p.n%d_%s;\n  outs.dt[%d] = %d;  // %s\n", k, i, s->nodes[i].name, k,
         dt == EVT_F32 ? 0 : dt == EVT_F16 ? 1 : 2, evt_dtype_name(dt));
      k++;
    }
  sb(b, "  evt_rows::launch_rowsum_finalize(dim3((p.n + 31) / 32, %d), st, p.ws, %s, p.n, outs);\n", nrowsum, parts);
}

/* The launcher's row-sum workspace (g_ws): nrowsum partial N-vectors per part (`parts`: the grid's count of them),
 * grown when a launch needs more, p.ws pointed at it */
static void emit_ws_alloc(sbuf *b, int nrowsum, const char *parts) {
  sb(b, "  const size_t need = (size_t)%d * %s * p.n * sizeof(float);\n"
        "  if (need > g_ws_bytes) {\n    if (g_ws) cudaFree(g_ws);\n    g_ws = nullptr;\n    g_ws_bytes = 0;\n"
        "    if (cudaMalloc(&g_ws, need) != cudaSuccess) return EVT_LAUNCH_WORKSPACE;\n    g_ws_bytes = need;\n  }\n"
        "  p.ws = g_ws;\n", nrowsum, parts);
}

char *evt_emit_rows(const evt_rspec *s, char *err, size_t errlen) {
  if (evt_rspec_check(s, err, errlen) != EVT_OK) return NULL;
  char kname[40], text[4096];
  evt_rspec_kernel_name(s, kname);
  const char *hash = kname + strlen("evt_rowkernel_");
  evt_rspec_text(s, text, sizeof text);
  int nrowsum = 0, users[EVT_RSPEC_MAX_NODES] = {0}, rsk[EVT_RSPEC_MAX_NODES] = {0};
  for (int i = 0; i < s->nnodes; i++) {
    if (s->nodes[i].op == EVT_V_ROW_SUM) rsk[i] = nrowsum++;
    for (int j = 0; j < evt_vop_arity(s->nodes[i].op); j++) users[s->nodes[i].in[j]]++;
  }
  const char *in_t = ctype(s->in_dtype), *in1_t = ctype(evt_rspec_in_dtype(s, 1)), *w_t = ctype(s->w_dtype);
  evt_row_nucleus nu = s->nucleus;
  /* EX kernels keep EVT_ROWS_DEFAULT_SUM_REGS_EX row sums in registers when their row inputs are 16-bit (f32 rows
   * hold twice the registers: their sums stay in shared memory, or they spill) */
  const int half_rows = is_16bit(s->in_dtype) && is_16bit(evt_rspec_in_dtype(s, 1)) && (!s->has_w || is_16bit(s->w_dtype));
  sbuf b = {0};

  /* 1. banner */
  sb(&b, "// GENERATED by evt (src/codegen/emit_rows.c) -- do not edit.\n// Row kernel %s for the spec:\n", kname);
  for (const char *p = text; *p;) {
    const char *e = strchr(p, '\n');
    int len = e ? (int)(e - p) : (int)strlen(p);
    sb(&b, "//   %.*s\n", len, p);
    p += len + (e ? 1 : 0);
  }
  sb(&b, "#include \"evt_rows.cuh\"\n#include \"evt_row_launch.h\"\n\n");
  /* tuning knobs: defaults here, overridable with -D (the H200 measurements in bench/results/rows-* chose them) */
  sb(&b, "#ifndef EVT_ROWS_CTA_WARPS  // warps per CTA (several row-groups per CTA)\n#define EVT_ROWS_CTA_WARPS %d\n#endif\n"
         "#ifndef EVT_ROWS_CTA_WARPS_SUM  // the same with row sums (fewer CTAs: fewer partials)\n"
         "#define EVT_ROWS_CTA_WARPS_SUM %d\n#endif\n"
         "#ifndef EVT_ROWS_W1CAP  // most warps per row with one chunk per thread (8 or 16)\n#define EVT_ROWS_W1CAP %d\n#endif\n"
         "#ifndef EVT_ROWS_DEPTH  // rows prefetched ahead when a thread holds one chunk (else 1)\n"
         "#define EVT_ROWS_DEPTH %d\n#endif\n"
         "#ifndef EVT_ROWS_DEPTH_VPT  // ... when a thread holds at most this many chunks\n#define EVT_ROWS_DEPTH_VPT %d\n#endif\n"
         "#ifndef EVT_ROWS_DEEP_SUM  // row sums: EVT_ROWS_DEPTH rows ahead (1) or one (0)\n#define EVT_ROWS_DEEP_SUM %d\n#endif\n"
         "#ifndef EVT_ROWS_MINB_SUM  // row sums: __launch_bounds__ minimum CTAs per SM (caps registers)\n"
         "#define EVT_ROWS_MINB_SUM %d\n#endif\n"
         "#ifndef EVT_ROWS_SMEM_SUM  // row sums: accumulate in shared memory (1) or registers (0)\n"
         "#define EVT_ROWS_SMEM_SUM %d\n#endif\n"
         "#ifndef EVT_ROWS_SUM_REGS  // with EVT_ROWS_SMEM_SUM: this many of the row sums in registers all the same\n"
         "#define EVT_ROWS_SUM_REGS %d\n#endif\n"
         "#ifndef EVT_ROWS_SUM_REGS_EX  // ... in the exact-size (EX) kernels\n"
         "#define EVT_ROWS_SUM_REGS_EX %d\n#endif\n"

         "#ifndef EVT_ROWS_EXACT  // 1: also a kernel for N = 256 * warps * vpt without bounds checks\n"
         "#define EVT_ROWS_EXACT %d\n#endif\n"
         "#ifndef EVT_ROWS_EX_FULL  // EX kernels: chunk bounds tests left out (nvcc does not prove them from t < T)\n"
         "#define EVT_ROWS_EX_FULL %d\n#endif\n"
         "#ifndef EVT_ROWS_RED_SOFTMAX  // softmax reductions: 0 max round + sum round, 2 warp rounds + one merge\n"
         "#define EVT_ROWS_RED_SOFTMAX %d\n#endif\n"
         "#ifndef EVT_ROWS_MINB_W1  // one warp per row, several chunks per thread: __launch_bounds__ minimum CTAs per SM\n"
         "#define EVT_ROWS_MINB_W1 -1  // (-1: each kernel's kMinbW1)\n#endif\n"
         "#ifndef EVT_ROWS_CTA_WARPS_W1  // warps per CTA, one warp per row\n"
         "#define EVT_ROWS_CTA_WARPS_W1 -1  // (-1: each kernel's kCtaWarpsW1)\n#endif\n"
         "#ifndef EVT_ROWS_MINB_MULTI  // several warps and chunks per row, no row sums: __launch_bounds__ minimum CTAs per SM\n"
         "#define EVT_ROWS_MINB_MULTI %d\n#endif\n"
         "#ifndef EVT_ROWS_WB_SMEM_VPT  // layer norms: w / b in shared memory from this many chunks per thread\n"
         "#define EVT_ROWS_WB_SMEM_VPT %d\n#endif\n"
         "#ifndef EVT_ROWS_LN_LATE  // layer norm: w / b loaded per chunk in the epilogue, not held in registers\n"
         "#define EVT_ROWS_LN_LATE -1  // (-1: each kernel's kLnLate)\n#endif\n"
         "#ifndef EVT_ROWS_LNB_LATE  // layer-norm backward: w loaded per chunk where used, not held in registers\n"
         "#define EVT_ROWS_LNB_LATE %d\n#endif\n"
         "#ifndef EVT_ROWS_RB_LATE_FLOATS  // row broadcasts: loaded per chunk where used from this many held floats\n"
         "#define EVT_ROWS_RB_LATE_FLOATS %d\n#endif\n"
         "#ifndef EVT_ROWS_WAVES_W1  // grid, one warp per row: at most this many waves of resident CTAs (0: one pass)\n"
         "#define EVT_ROWS_WAVES_W1 %d\n#endif\n"
         "#ifndef EVT_ROWS_ONE_RING  // one pass: keep the (dead) prefetch of each row-group's second row (1) or not (0)\n"
         "#define EVT_ROWS_ONE_RING %d\n#endif\n"
         "#ifndef EVT_ROWS_WAVES  // ... rows of several warps\n"
         "#define EVT_ROWS_WAVES %d\n#endif\n"
         "#ifndef EVT_ROWS_WAVES_SUM  // ... for kernels with row sums (one workspace partial per CTA)\n"
         "#define EVT_ROWS_WAVES_SUM %d\n#endif\n"
         "#ifndef EVT_ROWS_INST  // which (warps, vpt) configurations to instantiate (benchmarks compile fewer)\n"
         "#define EVT_ROWS_INST(w, v) 1\n#endif\n\n",
     EVT_ROWS_DEFAULT_CTA_WARPS, EVT_ROWS_DEFAULT_CTA_WARPS_SUM, EVT_ROWS_DEFAULT_W1CAP,
     EVT_ROWS_DEFAULT_DEPTH, EVT_ROWS_DEFAULT_DEPTH_VPT, EVT_ROWS_DEFAULT_DEEP_SUM, EVT_ROWS_DEFAULT_MINB_SUM, EVT_ROWS_DEFAULT_SMEM_SUM,
     EVT_ROWS_DEFAULT_SUM_REGS, half_rows ? EVT_ROWS_DEFAULT_SUM_REGS_EX : EVT_ROWS_DEFAULT_SUM_REGS,
     EVT_ROWS_DEFAULT_EXACT, EVT_ROWS_DEFAULT_EX_FULL, EVT_ROWS_DEFAULT_RED_SOFTMAX, EVT_ROWS_DEFAULT_MINB_MULTI,
     EVT_ROWS_DEFAULT_WB_SMEM_VPT, EVT_ROWS_DEFAULT_LNB_LATE, EVT_ROWS_DEFAULT_RB_LATE_FLOATS,
     EVT_ROWS_DEFAULT_WAVES_W1, EVT_ROWS_DEFAULT_ONE_RING, EVT_ROWS_DEFAULT_WAVES, EVT_ROWS_DEFAULT_WAVES_SUM);
  sb(&b, "namespace evt_gen_%s {\n\n", hash);
  /* one warp per row while a row fits 32 lanes x this many chunks: per kernel (not a shared macro default, so
   * several kernels in one translation unit keep their own): light nuclei (softmax, nucleus-free without Σ over
   * M, plain softmax backward) take 4 chunks per lane, layer norms and row-sum kernels 2 (more registers per element:
   * one warp per 1024-wide row spilled or fell to one CTA per SM on the H200, W2) */
  int aux_rows = 0; /* M×N inputs of the epilogue */
  for (int i = 0; i < s->nnodes; i++) aux_rows += s->nodes[i].op == EVT_V_AUX_LOAD;
  /* softmax backward without other M×N inputs counts as light (S24W4: 16384x1024 as one warp x 4 chunks, 114
   * registers, 1.17 -> 1.12x floor) */
  const int light = (nu == EVT_ROWN_SOFTMAX || nu == EVT_ROWN_NONE || (nu == EVT_ROWN_SOFTMAX_BWD && !aux_rows)) && !nrowsum;
  const int ln_plain = nu == EVT_ROWN_LAYERNORM && !aux_rows; /* (kernels/evt_row_config.h, session 29) */
  sb(&b, "#ifdef EVT_ROWS_WARP_VPT\nconstexpr int kWarpVpt = EVT_ROWS_WARP_VPT;\n#else\nconstexpr int kWarpVpt = %d;\n#endif\n",
     light ? EVT_ROWS_DEFAULT_WARP_VPT_LIGHT : ln_plain ? EVT_ROWS_DEFAULT_WARP_VPT_LN : EVT_ROWS_DEFAULT_WARP_VPT);
  /* the same for the knobs a kernel picks for itself (macro -1); kernels with row sums use neither (nvcc's #177) */
  sb(&b, "[[maybe_unused]] constexpr int kMinbW1 = EVT_ROWS_MINB_W1 > 0 ? EVT_ROWS_MINB_W1 : %d;\n"
         "[[maybe_unused]] constexpr int kCtaWarpsW1 = EVT_ROWS_CTA_WARPS_W1 > 0 ? EVT_ROWS_CTA_WARPS_W1 : %d;\n",
     ln_plain ? EVT_ROWS_DEFAULT_MINB_W1_LN : EVT_ROWS_DEFAULT_MINB_W1,
     ln_plain || nu == EVT_ROWN_SOFTMAX ? EVT_ROWS_DEFAULT_CTA_WARPS_W1 : EVT_ROWS_DEFAULT_CTA_WARPS);
  if (nu == EVT_ROWN_LAYERNORM)
    sb(&b, "constexpr bool kLnLate = EVT_ROWS_LN_LATE >= 0 ? EVT_ROWS_LN_LATE != 0 : %s;\n",
       (ln_plain ? EVT_ROWS_DEFAULT_LN_LATE : EVT_ROWS_DEFAULT_LN_LATE_AUX) ? "true" : "false");
  /* rows longer than one warp takes: at least this many chunks per thread (EVT_ROWS_MIN_VPT overrides; 1 or 2).
   * Layer norms without other M×N inputs take 2 (H200 S22W1/W2: layer norm 1.42 -> 1.33x floor, backward 1.55
   * -> 1.46x; a residual input's registers cost it the gain), the rest 1. */
  const int min_vpt = (nu == EVT_ROWN_LAYERNORM || nu == EVT_ROWN_LAYERNORM_BWD) && !aux_rows ? EVT_ROWS_DEFAULT_MIN_VPT_LN : 1;
  sb(&b, "#ifdef EVT_ROWS_MIN_VPT\nconstexpr int kMinVpt = EVT_ROWS_MIN_VPT;\n#else\nconstexpr int kMinVpt = %d;\n#endif\n\n",
     min_vpt);

  /* 2a. Params */
  sb(&b, "struct Params {\n  int m, n;\n  bool vec;  // 16-byte chunk accesses allowed\n");
  if (nu == EVT_ROWN_SOFTMAX) sb(&b, "  const %s *x;\n", in_t);
  /* (one declaration when both inputs share the dtype: the text, so the JIT cache key, of earlier kernels) */
  if (nu == EVT_ROWN_SOFTMAX_BWD && !s->in1_mixed) sb(&b, "  const %s *dy, *y;\n", in_t);
  if (nu == EVT_ROWN_SOFTMAX_BWD && s->in1_mixed) sb(&b, "  const %s *dy;\n  const %s *y;\n", in_t, in1_t);
  if (nu == EVT_ROWN_LAYERNORM) sb(&b, "  const %s *x;\n  const %s *w, *b;\n  float *mean, *rstd;\n  float eps;\n", in_t, w_t);
  if (nu == EVT_ROWN_LAYERNORM_BWD && !s->in1_mixed) sb(&b, "  const %s *dy, *x;\n  const %s *w;\n  float eps;\n", in_t, w_t);
  if (nu == EVT_ROWN_LAYERNORM_BWD && s->in1_mixed)
    sb(&b, "  const %s *dy;\n  const %s *x;\n  const %s *w;\n  float eps;\n", in_t, in1_t, w_t);
  for (int i = 0; i < s->nnodes; i++) {
    const evt_rnode *v = &s->nodes[i];
    if (!evt_vop_has_memory(v->op)) continue;
    int ld = evt_vop_class(v->op) == 'L';
    sb(&b, "  %s%s *n%d_%s;  // %s\n", ld ? "const " : "", ctype(v->dtype), i, v->name, evt_vop_name(v->op));
  }
  if (nrowsum) sb(&b, "  float *ws;  // row_sum partials: [%d][gridDim.x][n]\n", nrowsum);
  if (has_rand(s)) sb(&b, "  const unsigned long long *rng_step;  // rand: the run's RNG step (device memory; NULL: 0)\n");
  sb(&b, "};\n\n");

  /* 2b. kernel */
  if (nrowsum)
    sb(&b, "// row-sum accumulators: the first EVT_ROWS_SUM_REGS (EX kernels: EVT_ROWS_SUM_REGS_EX) sums in registers, the\n"
           "// others in shared memory when asked for and at most 96 KiB per CTA, else all in registers\n"
           "template <bool EX>\nconstexpr int kSumRegsOf = (EX ? EVT_ROWS_SUM_REGS_EX : EVT_ROWS_SUM_REGS) < %d\n"
           "                                ? (EX ? EVT_ROWS_SUM_REGS_EX : EVT_ROWS_SUM_REGS) : %d;\n"
           "template <int WARPS, int VPT, int R, bool EX, int K = kSumRegsOf<EX && VPT >= 2>>  // (one chunk: 1024-thread CTAs, 64 registers)\n"
           "using RSumsOf = evt_rows::RowSums<WARPS * 32, VPT, R, %d,\n"
           "    EVT_ROWS_SMEM_SUM && (size_t)(%d - K) * VPT * 8 * WARPS * 32 * R * 4 <= 98304 ? K : %d>;\n\n",
       nrowsum, nrowsum, nrowsum, nrowsum, nrowsum);
  int nstore = 0; /* M×N stores (aux_store) */
  for (int i = 0; i < s->nnodes; i++) nstore += s->nodes[i].op == EVT_V_AUX_STORE;
  int ncolsum = 0;  /* per-row reductions (col_sum, col_max): they need the group's shared slots */
  for (int i = 0; i < s->nnodes; i++) ncolsum += s->nodes[i].op == EVT_V_COL_SUM || s->nodes[i].op == EVT_V_COL_MAX;
  /* M×N row inputs fetched one row ahead: (pointer field, element type, register array) */
  struct {
    char field[40];
    const char *type;
    char arr[16];
  } rin[EVT_RSPEC_MAX_NODES + 2];
  int nrin = 0;
#define RIN(f, ty, a)                                           \
  do {                                                          \
    snprintf(rin[nrin].field, sizeof rin[nrin].field, "%s", f); \
    rin[nrin].type = ty;                                        \
    snprintf(rin[nrin].arr, sizeof rin[nrin].arr, "%s", a);     \
    nrin++;                                                     \
  } while (0)
  if (nu == EVT_ROWN_SOFTMAX || nu == EVT_ROWN_LAYERNORM) RIN("x", in_t, "in0");
  if (nu == EVT_ROWN_SOFTMAX_BWD) {
    RIN("dy", in_t, "in0");
    RIN("y", in1_t, "in1");
  }
  if (nu == EVT_ROWN_LAYERNORM_BWD) {
    RIN("dy", in_t, "in0");
    RIN("x", in1_t, "in1");
  }
  for (int i = 0; i < s->nnodes; i++)
    if (s->nodes[i].op == EVT_V_AUX_LOAD) {
      char f[40], a[16];
      snprintf(f, sizeof f, "n%d_%s", i, s->nodes[i].name);
      snprintf(a, sizeof a, "L%d", i);
      RIN(f, ctype(s->nodes[i].dtype), a);
    }
#undef RIN
  sb(&b, nrowsum ? "template <int WARPS, int VPT, int R, bool EX>\n__global__ void __launch_bounds__(WARPS * 32 * R, EVT_ROWS_MINB_SUM) row_kernel(Params p) {\n"
                 : "// one-chunk rows: at least 1024 resident threads per SM (caps registers at 64 per thread); one-warp rows\n"
                   "// with more chunks: at least kMinbW1 CTAs per SM, longer rows EVT_ROWS_MINB_MULTI\n"
                   "template <int WARPS, int VPT, int R, bool EX>\n__global__ void __launch_bounds__(WARPS * 32 * R, VPT == 1 && 1024 / (WARPS * 32 * R) > 1 ? 1024 / (WARPS * 32 * R) : WARPS == 1 ? kMinbW1 : EVT_ROWS_MINB_MULTI)\n"
                   "row_kernel(Params p) {\n");
  sb(&b, "  constexpr int T = WARPS * 32;\n");
  if (nrowsum) sb(&b, "  using RSums = RSumsOf<WARPS, VPT, R, EX>;\n");
  sb(&b, "  static_assert(WARPS == 1 || R <= 15, \"named barriers 1..15: one per row-group\");\n");
  /* programmatic dependent launch: no global access before the previous kernel in the stream completed; a kernel
   * without row sums lets the next one start launching at once (its finalize kernel must wait for the partials) */
  sb(&b, "  evt_rows::wait_prior_grids();  // launched early (EVT_ROWS_PDL_MAIN): the previous kernel's writes first\n");
  if (!nrowsum) sb(&b, "  evt_rows::release_dependents();  // the next kernel may be scheduled into the slots this grid frees\n");
  sb(&b, "  const int g = threadIdx.x / T, t = threadIdx.x %% T;\n"
         "  const int n = EX ? T * 8 * VPT : p.n;  // EX: the row fills the group exactly (its bounds checks fold away)\n"
         "  const bool vec = EX || p.vec;  // EX kernels run only with 16-byte aligned tensors\n"
         "  constexpr bool EXF = EX && EVT_ROWS_EX_FULL != 0;  // every chunk a full vector: no bounds tests\n");
  if (nu != EVT_ROWN_NONE || ncolsum)
    sb(&b, "  __shared__ float red[R][evt_rows::red_floats<WARPS>()];  // per row-group reduction slots\n"
           "  evt_rows::Red<WARPS> rk = {red[g], 0};\n");
  /* per-column vectors: loaded once */
  int hw = s->has_w, hb = s->has_b;
  if (nu == EVT_ROWN_LAYERNORM || nu == EVT_ROWN_LAYERNORM_BWD) {
    /* w / b: this thread's columns in registers, loaded once; from EVT_ROWS_WB_SMEM_VPT chunks per thread
     * (WB_SMEM; rows of at most 2048 elements) they would take 16·VPT registers, so the CTA stages them in shared
     * memory as f32 once and each row reads its chunks back (16-byte loads) */
    /* layer norm forward with EVT_ROWS_LN_LATE: w / b are not held at all; each chunk's 8 columns are loaded
     * (L1 hits after the first row) right where the epilogue applies them, so they take no registers across the
     * row reductions */
    if (nu == EVT_ROWN_LAYERNORM)
      sb(&b, "  constexpr bool LN_LATE = kLnLate;  // w / b applied per chunk in the epilogue\n");
    else
      sb(&b, "  constexpr bool LN_LATE = EVT_ROWS_LNB_LATE != 0;  // w read per chunk (reductions, then dx)\n");
    sb(&b, "  constexpr bool WB_SMEM = !LN_LATE && VPT >= EVT_ROWS_WB_SMEM_VPT && T * VPT <= 256;  // (at most 16 KiB)\n"
           "  __shared__ __align__(16) float wb_s[2][WB_SMEM ? T * 8 * VPT : 4];  // w, b as f32 (WB_SMEM)\n"
           "  float nu_w[VPT][8], nu_b[VPT][8];  // this thread's columns of w / b\n"
           "  if constexpr (WB_SMEM) {\n"
           "    for (int j = threadIdx.x; j < T * 8 * VPT; j += blockDim.x) {\n"
           "      wb_s[0][j] = %s;\n      wb_s[1][j] = %s;\n    }\n    __syncthreads();\n  } else if constexpr (!LN_LATE) {\n",
       hw ? "j < n ? evt_rows::to_f(p.w[j]) : 0.f" : "0.f", hb ? "j < n ? evt_rows::to_f(p.b[j]) : 0.f" : "0.f");
    sb(&b, hw ? "    evt_rows::load_row<T, VPT>(p.w, n, t, true, vec, nu_w);\n"
              : "    evt_rows::load_row<T, VPT>((const float *)nullptr, n, t, false, false, nu_w);  // no w\n");
    sb(&b, hb ? "    evt_rows::load_row<T, VPT>(p.b, n, t, true, vec, nu_b);\n"
              : "    evt_rows::load_row<T, VPT>((const float *)nullptr, n, t, false, false, nu_b);  // no b\n");
    sb(&b, "  }\n");
  }
  /* row broadcasts: this thread's columns loaded once and held, or (RB_LATE: holding them all would take
   * EVT_ROWS_RB_LATE_FLOATS registers or more) one chunk at a time where the epilogue uses them */
  int nrb = 0;
  for (int i = 0; i < s->nnodes; i++) nrb += s->nodes[i].op == EVT_V_ROW_BCAST;
  if (nrb)
    sb(&b, "  constexpr bool RB_LATE = VPT * 8 * %d >= EVT_ROWS_RB_LATE_FLOATS;  // row broadcasts per chunk, below\n", nrb);
  for (int i = 0; i < s->nnodes; i++)
    if (s->nodes[i].op == EVT_V_ROW_BCAST)
      sb(&b, "  float L%d[RB_LATE ? 1 : VPT][8];  // row_bcast %s (held unless RB_LATE)\n"
             "  if constexpr (!RB_LATE) evt_rows::load_row<T, VPT>(p.n%d_%s, n, t, true, vec, L%d);\n",
         i, s->nodes[i].name, i, s->nodes[i].name, i);
  emit_scalar_loads(&b, s);
  if (nrowsum)
    sb(&b, "  extern __shared__ __align__(16) float dyn_smem[];\n"
           "  RSums rsum;  // this thread's columns of the row sums over the CTA's rows\n  rsum.init(dyn_smem, g, t);\n");
  /* prefetch of the first row */
  sb(&b, "  const long long stride = (long long)gridDim.x * R;\n");
  if (nrin)
    sb(&b, "  // prefetch ring: rows i+1 .. i+D of this row-group in flight while row i is worked on; none when the\n"
           "  // launch gives each row-group one row (ONE: one pass, a CTA per R rows) and EVT_ROWS_ONE_RING is 0\n"
           "  constexpr bool ONE = %s && EVT_ROWS_ONE_RING == 0;\n"
           "  constexpr int D = !ONE && VPT <= EVT_ROWS_DEPTH_VPT && %s ? EVT_ROWS_DEPTH : 1;\n",
       nrowsum ? "false" : "WARPS == 1 && EVT_ROWS_WAVES_W1 == 0", nrowsum ? "EVT_ROWS_DEEP_SUM" : "true");
  for (int k = 0; k < nrin; k++)
    sb(&b, "  evt_rows::Raw8<%s> q_%s[D][VPT];  // %s, the next D rows\n", rin[k].type, rin[k].arr, rin[k].field);
  if (nrin)
    sb(&b, "#pragma unroll\n  for (int d = 0; d < D; d++) {  // the first D rows\n"
           "    const long long row = (long long)blockIdx.x * R + g + d * stride;\n    const bool live = row < p.m;\n");
  for (int k = 0; k < nrin; k++)
    sb(&b, "    evt_rows::fetch_row<T, VPT, EXF>(p.%s + (live ? row * n : 0), n, t, live, vec, q_%s[d]);\n", rin[k].field,
       rin[k].arr);
  if (nrin) sb(&b, "  }\n");
  sb(&b, "  for (long long base = (long long)blockIdx.x * R; base < p.m; base += stride) {\n");
  sb(&b, "    const long long row = base + g;\n    const bool live = row < p.m;\n"
         "    const long long ro = live ? row * n : 0;  // row offset\n");
  if (!nstore) sb(&b, "    (void)ro;  // (no M×N store)\n");
  if (nrin) {
    sb(&b, "    const long long nrow = row + D * stride;  // the row to fetch now\n"
           "    const bool nlive = nrow < p.m;\n");
    for (int k = 0; k < nrin; k++) {
      sb(&b, "    evt_rows::Raw8<%s> c_%s[VPT];\n#pragma unroll\n    for (int v = 0; v < VPT; v++) {\n"
             "      c_%s[v] = q_%s[0][v];\n#pragma unroll\n      for (int d = 0; d + 1 < D; d++) q_%s[d][v] = q_%s[d + 1][v];\n"
             "    }\n",
         rin[k].type, rin[k].arr, rin[k].arr, rin[k].arr, rin[k].arr, rin[k].arr);
      sb(&b, "    if constexpr (!ONE)\n"
             "      evt_rows::fetch_row<T, VPT, EXF>(p.%s + (nlive ? nrow * n : 0), n, t, nlive, vec, q_%s[D - 1]);\n",
         rin[k].field, rin[k].arr);
    }
  }
  /* nucleus */
  if (nu == EVT_ROWN_LAYERNORM || nu == EVT_ROWN_LAYERNORM_BWD)
    sb(&b, "    if constexpr (WB_SMEM) {  // this row's copy of the staged w / b chunks\n"
           "      evt_rows::smem_row<T, VPT>(wb_s[0], t, nu_w);\n      evt_rows::smem_row<T, VPT>(wb_s[1], t, nu_b);\n    }\n");
  switch (nu) {
    case EVT_ROWN_SOFTMAX:
      sb(&b, "    float nu_in0[VPT][8], nu_out[VPT][8];\n    evt_rows::unpack_row(c_in0, nu_in0);\n"
             "    evt_rows::softmax<WARPS, VPT>(nu_in0, nu_out, n, t, rk);\n");
      break;
    case EVT_ROWN_SOFTMAX_BWD:
      sb(&b, "    float nu_in0[VPT][8], nu_in1[VPT][8], nu_out[VPT][8];\n"
             "    evt_rows::unpack_row(c_in0, nu_in0);\n    evt_rows::unpack_row(c_in1, nu_in1);\n"
             "    evt_rows::softmax_bwd<WARPS, VPT>(nu_in0, nu_in1, nu_out, n, t, rk);\n");
      break;
    case EVT_ROWN_LAYERNORM:
      sb(&b, "    float nu_in0[VPT][8], nu_xhat[VPT][8], nu_out[VPT][8], mean, rstd;\n"
             "    evt_rows::unpack_row(c_in0, nu_in0);\n"
             "    if constexpr (LN_LATE)  // x̂ and y = x̂·w + b per chunk, below\n"
             "      evt_rows::ln_moments<WARPS, VPT>(nu_in0, p.eps, &mean, &rstd, n, t, rk);\n"
             "    else\n"
             "      evt_rows::layernorm<WARPS, VPT, %s, %s>(nu_in0, nu_w, nu_b, p.eps, nu_xhat, nu_out, &mean, &rstd, n, t, "
             "rk);\n", hw ? "true" : "false", hb ? "true" : "false");
      if (s->store_stats)
        sb(&b, "    if (live && t == 0) {\n      p.mean[row] = mean;\n      p.rstd[row] = rstd;\n    }\n");
      else
        sb(&b, "    (void)mean;\n    (void)rstd;\n");
      break;
    case EVT_ROWN_LAYERNORM_BWD:
      sb(&b, "    float nu_in0[VPT][8], nu_in1[VPT][8], nu_xhat[VPT][8], nu_out[VPT][8];\n"
             "    evt_rows::unpack_row(c_in0, nu_in0);\n    evt_rows::unpack_row(c_in1, nu_in1);\n"
             "    float lnb_rs = 0.f, lnb_mg = 0.f, lnb_mgx = 0.f;  // (LN_LATE) rstd, mean(g), mean(g·x̂)\n"
             "    if constexpr (LN_LATE)  // x̂ in place of x; dx per chunk, below\n"
             "      evt_rows::layernorm_bwd_stats<WARPS, VPT, %s>(nu_in0, nu_in1, %s, vec, p.eps, lnb_rs, lnb_mg, lnb_mgx, n, t, rk);\n"
             "    else\n"
             "      evt_rows::layernorm_bwd<WARPS, VPT, %s>(nu_in0, nu_in1, nu_w, p.eps, nu_xhat, nu_out, n, t, rk);\n",
         hw ? "true" : "false", hw ? "p.w" : "(const float *)nullptr", hw ? "true" : "false");
      break;
    default: break;
  }
  emit_epilogue(&b, s, users, rsk, 0);
  if (nrin) sb(&b, "    if constexpr (ONE) break;  // (the row-group's only row: nothing carried to a next iteration)\n");
  sb(&b, "  }\n");
  if (nrowsum) sb(&b, "  evt_rows::trigger_dependents();  // the finalize kernel may start launching\n");
  if (nrowsum) sb(&b, "  rsum.flush(p.ws + (size_t)blockIdx.x * n, (size_t)gridDim.x * n, n, g, t);\n");
  sb(&b, "}\n\n");

  /* 2b'. the long-row kernel (no row sums): rows the register configurations do not take */
  const int long_form = evt_rspec_long_rows(s);
  if (long_form == 1) {
    sb(&b, "// Rows longer than a register-resident row-group takes (evt_row_pick_config refuses N > 32768): one CTA of\n"
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
    emit_scalar_loads(&b, s);
    sb(&b, "  for (long long row = blockIdx.x; row < p.m; row += gridDim.x) {\n"
           "    const bool live = true;\n    (void)live;\n    const long long ro = row * n;  // row offset\n");
    if (nrin)
      sb(&b, "    const int h = evt_rows::long_head(p.%s + ro);  // elements before its first 16-byte boundary\n", rin[0].field);
    else
      sb(&b, "    const int h = 0;\n");
    const char *wn = s->has_w ? "p.w" : NULL;
    char wnull[64];
    snprintf(wnull, sizeof wnull, "(const %s *)nullptr", w_t);
    switch (nu) {
      case EVT_ROWN_SOFTMAX:
        sb(&b, "    float sm_m2, sm_inv;  // max · log2(e), 1 / Σ\n"
               "    evt_rows::long_softmax_stats<WARPS>(p.x + ro, n, h, t, rk, sm_m2, sm_inv);\n");
        break;
      case EVT_ROWN_SOFTMAX_BWD:
        sb(&b, "    const float sb_dot = evt_rows::long_softmax_bwd_stats<WARPS>(p.dy + ro, p.y + ro, n, h, t, rk);\n");
        break;
      case EVT_ROWN_LAYERNORM:
        sb(&b, "    float mean, rstd;\n    evt_rows::long_ln_stats<WARPS>(p.x + ro, n, h, p.eps, t, rk, mean, rstd);\n");
        if (s->store_stats) sb(&b, "    if (t == 0) {\n      p.mean[row] = mean;\n      p.rstd[row] = rstd;\n    }\n");
        break;
      case EVT_ROWN_LAYERNORM_BWD:
        sb(&b, "    float lnb_mu, lnb_rs, lnb_mg, lnb_mgx;\n"
               "    evt_rows::long_lnb_stats<WARPS>(p.dy + ro, p.x + ro, %s, n, h, p.eps, t, rk, lnb_mu, lnb_rs, lnb_mg, lnb_mgx);\n",
           wn ? wn : wnull);
        break;
      default: break;
    }
    emit_epilogue(&b, s, users, rsk, 1);
    sb(&b, "  }\n}\n\n");
  }
  /* 2b''. the column-block kernel: nucleus-free, no per-row reduction (with or without Σ over M): short rows, several
   * side by side in a CTA (every lane busy; the register kernels give each row a warp), and rows with sums over M
   * that the register kernels refuse (column blocks) */
  const int cols = nu == EVT_ROWN_NONE && !ncolsum;
  if (cols) {
    sb(&b, "// Nucleus-free rows without a per-row reduction, as a tile of 8-column chunks: a row of cpr < T chunks takes cpr\n"
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
    if (!nrowsum) sb(&b, "  evt_rows::release_dependents();  // the next kernel may be scheduled into the slots this grid frees\n");
    sb(&b, "  const int n = p.n, es = 1, lim = n;\n"
           "  const int cpr = (n + 7) / 8, cw = cpr < T ? cpr : T, S = T / cw;  // threads per row, rows side by side\n"
           "  const int c = threadIdx.x %% cw, sub = threadIdx.x / cw;  // sub >= S: idle (T %% cw threads)\n"
           "  const int j0 = (blockIdx.x * cw + c) * 8;  // this thread's 8 columns\n"
           "  const bool full = p.vec && j0 + 8 <= n;\n  (void)es;\n  (void)lim;\n  (void)full;\n");
    emit_scalar_loads(&b, s);
    for (int i = 0; i < s->nnodes; i++)
      if (s->nodes[i].op == EVT_V_ROW_BCAST)
        sb(&b, "  float L%d[1][8];  // row_bcast %s: this thread's columns (loaded once)\n"
               "  evt_rows::load8s(p.n%d_%s, j0, es, lim, full, L%d[0]);\n",
           i, s->nodes[i].name, i, s->nodes[i].name, i);
    for (int k = 0; k < nrowsum; k++) sb(&b, "  float rsa%d[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};  // row sum %d\n", k, k);
    sb(&b, "  const long long rows_per = ((long long)p.m + gridDim.y - 1) / gridDim.y;\n"
           "  const long long r0 = (long long)blockIdx.y * rows_per, r1 = r0 + rows_per < p.m ? r0 + rows_per : p.m;\n"
           "  if (sub < S && j0 < n) {\n"
           "    for (long long rb = r0 + sub; rb < r1; rb += (long long)S * U) {\n");
    for (int i = 0; i < s->nnodes; i++)
      if (s->nodes[i].op == EVT_V_AUX_LOAD)
        sb(&b, "      evt_rows::Raw8<%s> f_L%d[U];  // %s, U rows\n", ctype(s->nodes[i].dtype), i, s->nodes[i].name);
    sb(&b, "#pragma unroll\n      for (int u = 0; u < U; u++) {  // the U rows' loads first\n"
           "        const long long row = rb + (long long)u * S;\n        const bool ok = row < r1;\n        (void)ok;\n");
    for (int i = 0; i < s->nnodes; i++)
      if (s->nodes[i].op == EVT_V_AUX_LOAD)
        sb(&b, "        evt_rows::fetch8s(p.n%d_%s + (ok ? row * n : 0), j0, es, ok ? lim : 0, full && ok, f_L%d[u]);\n", i,
           s->nodes[i].name, i);
    sb(&b, "      }\n#pragma unroll\n      for (int u = 0; u < U; u++) {\n"
           "        const long long row = rb + (long long)u * S;\n        if (row >= r1) break;\n"
           "        const bool live = true;\n        (void)live;\n        const long long ro = row * n;  // row offset\n");
    if (!nstore) sb(&b, "        (void)ro;  // (no M×N store)\n");
    {  /* the epilogue (written for a row loop at depth 1) indented to this loop's depth */
      sbuf e = {0};
      emit_epilogue(&e, s, users, rsk, 2);
      for (const char *q = e.p; q && *q;) {
        const char *nl = strchr(q, '\n');
        const int len = nl ? (int)(nl - q) : (int)strlen(q);
        sb(&b, *q != '#' && len ? "    %.*s\n" : "%.*s\n", len, q);
        q += len + (nl ? 1 : 0);
      }
      free(e.p);
    }
    sb(&b, "      }\n    }\n  }\n");
    if (nrowsum) {
      sb(&b, "  evt_rows::trigger_dependents();  // the finalize kernel may start launching\n"
             "  if (S > 1) {  // (uniform over the CTA) the S rows side by side added in order: sub 0's threads hold the sums\n"
             "    __shared__ float cred[8 * T];\n");
      for (int k = 0; k < nrowsum; k++)
        sb(&b, "    __syncthreads();\n#pragma unroll\n    for (int e = 0; e < 8; e++) cred[e * T + threadIdx.x] = rsa%d[e];\n"
               "    __syncthreads();\n    if (sub == 0)\n#pragma unroll\n      for (int e = 0; e < 8; e++) {\n"
               "        float a = 0.f;\n        for (int q = 0; q < S; q++) a += cred[e * T + q * cw + c];\n"
               "        rsa%d[e] = a;\n      }\n", k, k);
      sb(&b, "  }\n  if (sub == 0 && j0 < n) {\n");
      for (int k = 0; k < nrowsum; k++)
        sb(&b, "#pragma unroll\n    for (int e = 0; e < 8; e++)\n"
               "      if (j0 + e < n) p.ws[((size_t)%d * gridDim.y + blockIdx.y) * n + j0 + e] = rsa%d[e];\n", k, k);
      sb(&b, "  }\n");
    }
    sb(&b, "}\n\n");
  }

  /* 2c. launch<WARPS, VPT> */
  if (nrowsum) sb(&b, "static float *g_ws = nullptr;  // row_sum workspace, kept (not thread-safe)\nstatic size_t g_ws_bytes = 0;\n\n");
  sb(&b, "static int g_info[5];  // the last launch: warps, vpt, row-groups per CTA, CTAs per SM, registers\n\n");
  sb(&b, "template <int WARPS, int VPT, bool EX>\nstatic int launch(Params p, cudaStream_t st) {\n");
  sb(&b, "  // warps per CTA (row sums with more than one chunk per thread: half, 1024 threads would cap registers at 64)\n"
         "  constexpr int CW = %s, R0 = CW / WARPS > 1 ? CW / WARPS : 1;\n"
         "  constexpr int R = WARPS == 1 || R0 <= 15 ? R0 : 15;  // row-groups per CTA\n",
     nrowsum ? "VPT == 1 ? EVT_ROWS_CTA_WARPS_SUM : EVT_ROWS_CTA_WARPS_SUM / 2" : "WARPS == 1 ? kCtaWarpsW1 : EVT_ROWS_CTA_WARPS");
  sb(&b, "  const long long blocks = ((long long)p.m + R - 1) / R;\n");
  sb(&b, nrowsum ? "  constexpr size_t SMEM = RSumsOf<WARPS, VPT, R, EX>::smem_bytes();  // dynamic shared memory\n"
                 : "  constexpr size_t SMEM = 0;  // dynamic shared memory\n");
  sb(&b, "  static int resident = 0, occ = 0, regs = 0;  // CTAs of this shape that fit on the GPU at once: the grid\n"
         "  if (!resident) {\n    int dev = 0, sms = 0;\n    cudaGetDevice(&dev);\n"
         "    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);\n"
         "    if (SMEM > 0)  // (static + dynamic above 48 KiB needs the opt-in)\n"
         "      cudaFuncSetAttribute(row_kernel<WARPS, VPT, R, EX>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)SMEM);\n"
         "    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, row_kernel<WARPS, VPT, R, EX>, WARPS * 32 * R, SMEM);\n"
         "    cudaFuncAttributes fa = {};\n    cudaFuncGetAttributes(&fa, row_kernel<WARPS, VPT, R, EX>);\n    regs = fa.numRegs;\n"
         "    resident = sms * (occ > 0 ? occ : 1);\n  }\n"
         "  g_info[0] = WARPS, g_info[1] = VPT, g_info[2] = R, g_info[3] = occ, g_info[4] = regs;\n"
         "  constexpr int WAVES = %s;  // 0: one pass\n"
         "  const long long cap = WAVES > 0 ? (long long)resident * WAVES : blocks;\n"
         "  const int grid = (int)(blocks < cap ? blocks : cap);\n",
     nrowsum ? "EVT_ROWS_WAVES_SUM" : "WARPS == 1 ? EVT_ROWS_WAVES_W1 : EVT_ROWS_WAVES");
  if (nrowsum) emit_ws_alloc(&b, nrowsum, "grid");
  sb(&b, "  evt_rows::launch_main(row_kernel<WARPS, VPT, R, EX>, grid, WARPS * 32 * R, SMEM, st, p);\n");
  if (nrowsum) {
    sb(&b, "  if (cudaPeekAtLastError() != cudaSuccess) return EVT_LAUNCH_RUN;  // before the finalize launch\n");
    emit_rowsum_finalize(&b, s, nrowsum, "grid");
  }
  sb(&b, "  return cudaPeekAtLastError() == cudaSuccess ? EVT_LAUNCH_OK : EVT_LAUNCH_RUN;\n}\n\n");
  if (long_form == 1) {
    sb(&b, "// the long-row kernel: EVT_ROWS_LONG_WARPS warps per row, at most one wave of resident CTAs looping over the rows\n"
           "#ifndef EVT_ROWS_LONG_WARPS\n#define EVT_ROWS_LONG_WARPS %d\n#endif\n", EVT_ROWS_DEFAULT_LONG_WARPS);
    sb(&b, 
           "static int launch_long(Params p, cudaStream_t st) {\n  constexpr int W = EVT_ROWS_LONG_WARPS;\n"
           "  static int resident = 0, occ = 0, regs = 0;\n  if (!resident) {\n    int dev = 0, sms = 0;\n"
           "    cudaGetDevice(&dev);\n    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);\n"
           "    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, row_kernel_long<W>, W * 32, 0);\n"
           "    cudaFuncAttributes fa = {};\n    cudaFuncGetAttributes(&fa, row_kernel_long<W>);\n    regs = fa.numRegs;\n"
           "    resident = sms * (occ > 0 ? occ : 1);\n  }\n"
           "  if (p.n > (1 << 30)) return EVT_LAUNCH_CANNOT_IMPLEMENT;  // (block offsets stay in int)\n"
           "  g_info[0] = W, g_info[1] = 0, g_info[2] = 1, g_info[3] = occ, g_info[4] = regs;\n"
           "  const int grid = (int)(p.m < resident ? p.m : resident);\n"
           "  evt_rows::launch_main(row_kernel_long<W>, grid, W * 32, 0, st, p);\n"
           "  return cudaPeekAtLastError() == cudaSuccess ? EVT_LAUNCH_OK : EVT_LAUNCH_RUN;\n}\n\n");
  }
  if (cols) {
    sb(&b, "// the column-block kernel: about 8 CTAs per SM in all, row slices of at least 64 rows and 8 steps of S rows\n"
           "// (fewer partials)\n"
           "static int launch_cols(Params p, cudaStream_t st) {\n  constexpr int W = EVT_ROWS_COLS_WARPS, T = W * 32;\n"
           "  if (p.n > (1 << 30)) return EVT_LAUNCH_CANNOT_IMPLEMENT;  // (column offsets stay in int)\n"
           "  const int cpr = (p.n + 7) / 8, S = cpr < T ? T / cpr : 1;  // rows side by side (as the kernel)\n");
    /* (column blocks of long rows only where the register kernels refuse them: kernels with sums over M) */
    sb(&b, "  void (*kern)(Params) = %s;\n",
       long_form == 2 ? "S > 1 ? row_kernel_cols<W, EVT_ROWS_PACK_UNROLL> : row_kernel_cols<W, EVT_ROWS_COLS_UNROLL>"
                      : "row_kernel_cols<W, EVT_ROWS_PACK_UNROLL>");
    sb(&b, "  static int sms = 0, occ = 0;  // (occ: resident CTAs per SM of the short-row kernel)\n  if (!sms) {\n"
           "    int dev = 0;\n    cudaGetDevice(&dev);\n"
           "    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);\n    if (sms < 1) sms = 1;\n"
           "    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, row_kernel_cols<W, EVT_ROWS_PACK_UNROLL>, T, 0);\n"
           "    if (occ < 1) occ = 1;\n  }\n"
           "  const int gx = (cpr + T - 1) / T, minrows = 8 * S > 64 ? 8 * S : 64;\n"
           "  // row slices: about 8 CTAs per SM; %s\n"
           "  long long gy = %s, cap = ((long long)p.m + minrows - 1) / minrows;\n"
           "  if (gy > cap) gy = cap;\n  if (gy > 65535) gy = 65535;\n  if (gy < 1) gy = 1;\n"
           "  g_info[0] = W, g_info[1] = 0, g_info[2] = (int)gy, g_info[3] = S > 1 ? occ : 0, g_info[4] = 0;\n",
       nrowsum ? "short rows with sums over M one wave of resident CTAs (each slice's partial is read by the finalize)"
               : "at least 64 rows and 8 steps of S rows each",
       nrowsum ? "S > 1 && EVT_ROWS_PACK_ONE_WAVE ? (long long)sms * occ : ((long long)sms * 8 + gx - 1) / gx"
               : "((long long)sms * 8 + gx - 1) / gx");
    if (nrowsum) emit_ws_alloc(&b, nrowsum, "gy");
    sb(&b, "#if EVT_ROWS_PDL_MAIN\n"
           "  if (!(evt_pdl_enabled() && evt_rows::launch_pdl(kern, dim3(gx, (unsigned)gy), dim3(T), 0, st, p)))\n"
           "#endif\n"
           "    kern<<<dim3(gx, (unsigned)gy), T, 0, st>>>(p);\n");
    if (nrowsum) {
      sb(&b, "  if (cudaPeekAtLastError() != cudaSuccess) return EVT_LAUNCH_RUN;  // before the finalize launch\n"
             "  const int parts = (int)gy;\n");
      emit_rowsum_finalize(&b, s, nrowsum, "parts");
    }
    sb(&b, "  return cudaPeekAtLastError() == cudaSuccess ? EVT_LAUNCH_OK : EVT_LAUNCH_RUN;\n}\n\n");
  }
  sb(&b, "static bool aligned16(const void *q) { return ((uintptr_t)q & 15) == 0; }\n\n}  // namespace evt_gen_%s\n\n",
     hash);

  sb(&b, "// Diagnostics: the configuration of the last launch (benchmarks print it).\n"
         "extern \"C\" void %s_info(int *out) {\n  for (int k = 0; k < 5; k++) out[k] = evt_gen_%s::g_info[k];\n}\n\n",
     kname, hash);

  /* 3. launcher */
  sb(&b, "extern \"C\" int %s(const evt_row_launch_args *a) {\n  using namespace evt_gen_%s;\n", kname, hash);
  sb(&b, "  if (!a || a->m < 0 || a->n < 0) return EVT_LAUNCH_BAD_ARGS;\n");
  sb(&b, "  Params p = {};\n  p.m = a->m;\n  p.n = a->n;\n  bool ok = true, al = a->n %% 8 == 0;\n");
  const char *in_names[EVT_ROWN_COUNT][3] = {
      {0}, {"x"}, {"dy", "y"}, {"x", "w", "b"}, {"dy", "x", "w"}};
  int nin = evt_row_nucleus_ninputs(s);
  for (int k = 0; k < nin; k++) {
    const char *nm = in_names[nu][k];
    int is_w = (nu == EVT_ROWN_LAYERNORM && k >= 1) || (nu == EVT_ROWN_LAYERNORM_BWD && k == 2);
    if (nu == EVT_ROWN_LAYERNORM && k == 2 && !s->has_b) continue;
    sb(&b, "  p.%s = (const %s *)a->in[%d];\n  ok = ok && p.%s;\n  al = al && aligned16(p.%s);\n", nm,
       is_w ? w_t : k == 1 ? in1_t : in_t, k, nm, nm);
  }
  if (nu == EVT_ROWN_LAYERNORM || nu == EVT_ROWN_LAYERNORM_BWD) sb(&b, "  p.eps = (float)(%.17g);\n", s->eps);
  if (s->store_stats) sb(&b, "  p.mean = (float *)a->mean;\n  p.rstd = (float *)a->rstd;\n  ok = ok && p.mean && p.rstd;\n");
  for (int i = 0; i < s->nnodes; i++) {
    const evt_rnode *v = &s->nodes[i];
    if (!evt_vop_has_memory(v->op)) continue;
    int ld = evt_vop_class(v->op) == 'L';
    sb(&b, "  p.n%d_%s = (%s%s *)a->ptrs[%d];\n  ok = ok && p.n%d_%s;\n", i, v->name, ld ? "const " : "", ctype(v->dtype),
       i, i, v->name);
    if (v->op == EVT_V_AUX_LOAD || v->op == EVT_V_AUX_STORE || v->op == EVT_V_ROW_BCAST)
      sb(&b, "  al = al && aligned16(p.n%d_%s);\n", i, v->name);
  }
  if (has_rand(s)) sb(&b, "  p.rng_step = a->rng_step;\n");
  sb(&b, "  if (!ok) return EVT_LAUNCH_BAD_ARGS;\n  p.vec = al;\n  cudaStream_t st = (cudaStream_t)a->stream;\n");
  sb(&b, "  if (p.m == 0 || p.n == 0) {  // empty: sums are 0\n");
  for (int i = 0; i < s->nnodes; i++) {
    const evt_rnode *v = &s->nodes[i];
    if (v->op == EVT_V_ROW_SUM) sb(&b, "    cudaMemsetAsync(p.n%d_%s, 0, sizeof(%s) * p.n, st);\n", i, v->name, ctype(v->dtype));
    if (v->op == EVT_V_COL_SUM) sb(&b, "    cudaMemsetAsync(p.n%d_%s, 0, sizeof(%s) * p.m, st);\n", i, v->name, ctype(v->dtype));
    if (v->op == EVT_V_COL_MAX) sb(&b, "    if (p.m > 0) return EVT_LAUNCH_CANNOT_IMPLEMENT;  // max over no columns\n");
  }
  sb(&b, "    return cudaPeekAtLastError() == cudaSuccess ? EVT_LAUNCH_OK : EVT_LAUNCH_RUN;\n  }\n");
  if (cols)
    sb(&b, "  if (%s > 0 && (p.n + 7) / 8 <= %s)  // short rows: several side by side\n"
           "    return launch_cols(p, st);\n",
       nrowsum ? "EVT_ROWS_PACK_CHUNKS_SUM" : "EVT_ROWS_PACK_CHUNKS", nrowsum ? "EVT_ROWS_PACK_CHUNKS_SUM" : "EVT_ROWS_PACK_CHUNKS");
  sb(&b, "  int warps = 0, vpt = 0;\n"
         "  if (!evt_row_pick_config(p.n, kWarpVpt, EVT_ROWS_W1CAP, kMinVpt, &warps, &vpt))%s\n",
     long_form == 2 ? "  // longer than the register configurations take\n    return launch_cols(p, st);"
     : long_form == 1 ? "  // longer than the register configurations take\n    return launch_long(p, st);"
                      : " return EVT_LAUNCH_CANNOT_IMPLEMENT;");
  /* configurations only min_vpt 2 reaches, and the several-warp single-chunk ones it never reaches: instantiated
   * for the kernel's min_vpt (kMinVpt: this kernel's default unless EVT_ROWS_MIN_VPT is defined) */
  static const char *const mv_gate[2][3] = {
      {"", " && defined(EVT_ROWS_MIN_VPT) && EVT_ROWS_MIN_VPT == 2", " && (!defined(EVT_ROWS_MIN_VPT) || EVT_ROWS_MIN_VPT != 2)"},
      {"", " && (!defined(EVT_ROWS_MIN_VPT) || EVT_ROWS_MIN_VPT == 2)", " && defined(EVT_ROWS_MIN_VPT) && EVT_ROWS_MIN_VPT != 2"}};
  for (int k = 0; k < EVT_ROW_NCONFIGS; k++)
    sb(&b, "#if EVT_ROWS_INST(%d, %d)%s\n  if (warps == %d && vpt == %d)\n"
           "    return EVT_ROWS_EXACT && p.vec && p.n == %d ? launch<%d, %d, EVT_ROWS_EXACT != 0>(p, st) : launch<%d, %d, false>(p, st);\n"
           "#endif\n",
       evt_row_configs[k][0], evt_row_configs[k][1], mv_gate[min_vpt == 2][evt_row_configs[k][2] == 2 ? 1 : evt_row_configs[k][0] > 1 && evt_row_configs[k][1] == 1 ? 2 : 0],
       evt_row_configs[k][0], evt_row_configs[k][1], evt_row_configs[k][0] * evt_row_configs[k][1] * 256, evt_row_configs[k][0], evt_row_configs[k][1],
       evt_row_configs[k][0], evt_row_configs[k][1]);
  sb(&b, "  return EVT_LAUNCH_CANNOT_IMPLEMENT;\n}\n");
  return b.p;
}
