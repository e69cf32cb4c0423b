/* The row kernels' epilogue (contract in emit_rows_internal.h): per row its per-row values, then per chunk of 8
 * columns the chunk's loads, one f32 statement per node and element, the chunk's stores, then the per-row
 * reductions. The same text serves the register kernel, the long-row kernel and the column-block kernel. */
#include <stdio.h>
#include <string.h>

#include "codegen/emit_rows_internal.h"

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
 * statistics the kernel computed (evt_emit_rows_long_kernel) */
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

/* Per-row values: column broadcasts, the per-row reductions' accumulators, one_hot's class of the row. */
static void row_values(sbuf *b, const evt_rspec *s) {
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
}

/* The chunk loop's head for the form lng, then the chunk's loads of the long-row and column-block forms. */
static void chunk_head(sbuf *b, const evt_rspec *s, int lng) {
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
}

/* Layer norms with LN_LATE (register kernel): the chunk's w / b loaded where the epilogue applies them. */
static void late_layer_norm(sbuf *b, const evt_rspec *s, int lng) {
  evt_row_nucleus nu = s->nucleus;
  int hw = s->has_w, hb = s->has_b;
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
}

/* The chunk's arrays: unpacked aux loads, aux stores' values, row sums' terms, random numbers. */
static void chunk_arrays(sbuf *b, const evt_rspec *s, int lng) {
  for (int i = 0; i < s->nnodes; i++) {
    const evt_rnode *v = &s->nodes[i];
    const char *et = is_int(v->dtype) ? "double" : "float"; /* integer tensors: values in doubles (exact) */
    if (v->op == EVT_V_AUX_LOAD) sb(b, "      %s L%d[8];\n      evt_rows::unpack8(c_L%d[v], L%d);\n", et, i, i, i);
    if (v->op == EVT_V_AUX_STORE) sb(b, "      %s S%d[8];\n", et, i);
    if (v->op == EVT_V_ROW_SUM) sb(b, "      float RS%d[8];  // this chunk's terms of row_sum %s\n", i, v->name);
  }
  /* rand over contiguous columns j0 .. j0 + 7 (not long rows, whose elements may be T apart): drawn before the
   * element loop, four elements per Philox call (evt_rows::rand8); seed and offset are the launch's (p.seed<i>) */
  for (int i = 0; lng != 1 && i < s->nnodes; i++)
    if (s->nodes[i].op == EVT_V_RAND)
      sb(b, "      float R%d[8];  // rand\n      evt_rows::rand8<%s>(p.seed%d, p.offset%d, rng_step, (unsigned long long)row * n + j0, R%d);\n",
         i, ctype(s->nodes[i].dtype), i, i, i);
}

/* The element loop: one statement per node and element. */
static void element_statements(sbuf *b, const evt_rspec *s, const int *users, int lng) {
  /* the column of element e: j0 + e (register kernel), j0 + e·es (long rows) */
  const char *col = lng ? "j0 + e * es" : "j0 + e";
  sb(b, "#pragma unroll\n      for (int e = 0; e < 8; e++) {\n        const bool ok = %s < %s;\n        (void)ok;\n", col,
     lng ? "lim" : "n");
  for (int i = 0; i < s->nnodes; i++) {
    const evt_rnode *v = &s->nodes[i];
    int a = v->in[0], c = v->in[1];
    char num[32];
    switch (v->op) {
      case EVT_V_ACC: sb(b, "        const auto v%d = %s[v][e];\n", i, acc_arrays[v->sel]); break;
      case EVT_V_AUX_LOAD: sb(b, "        const auto v%d = L%d[e];  // %s\n", i, i, v->name); break;
      case EVT_V_ROW_BCAST:
        sb(b, "        const auto v%d = L%d[%s][e];  // %s\n", i, i, lng ? "v" : "RB_LATE ? 0 : v", v->name);
        break;
      case EVT_V_COL_BCAST: sb(b, "        const auto v%d = cb%d;\n", i, i); break;
      case EVT_V_SCALAR: sb(b, "        const auto v%d = (float)(%s);\n", i, evt_cxx_double(v->value, num)); break;
      case EVT_V_SCALAR_LOAD: sb(b, "        const auto v%d = sl%d;  // %s\n", i, i, v->name); break;
      case EVT_V_RAND:
        if (lng != 1)
          sb(b, "        const auto v%d = R%d[e];  // rand\n", i, i);
        else
          sb(b, "        const auto v%d = evt_rows::rand_u<%s>(p.seed%d, p.offset%d, rng_step, (unsigned long long)row * n + %s);  // rand\n",
             i, ctype(v->dtype), i, i, col);
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
}

/* The chunk's stores and row-sum terms, the chunk loop's end, then the per-row reductions. */
static void chunk_stores(sbuf *b, const evt_rspec *s, const int *rsk, int lng) {
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

/* lng 1: the long-row kernel's form (this thread's chunk of each block, the nucleus's chunk values and the M×N loads
 * per chunk); lng 2: the column-block kernel's (one chunk set by the kernel, the M×N loads already fetched in
 * f_L<i>[u], the row broadcasts loaded once before the row loop, row sums into registers rsa<k>). */
void evt_emit_rows_epilogue(sbuf *b, const rows_emit *ctx, int lng) {
  const evt_rspec *s = ctx->s;
  row_values(b, s);
  chunk_head(b, s, lng);
  late_layer_norm(b, s, lng);
  chunk_arrays(b, s, lng);
  element_statements(b, s, ctx->users, lng);
  chunk_stores(b, s, ctx->rsk, lng);
}

/* (after wait_prior_grids: the previous kernel may have written them; the RNG step: kernels/philox.h,
 * evt_row_launch_args.rng_step) */
void evt_emit_rows_scalar_loads(sbuf *b, const evt_rspec *s) {
  if (has_rand(s)) sb(b, "  const unsigned long long rng_step = p.rng_step ? *p.rng_step : 0ull;  // the run's RNG step\n");
  for (int i = 0; i < s->nnodes; i++)
    if (s->nodes[i].op == EVT_V_SCALAR_LOAD)
      sb(b, is_int(s->nodes[i].dtype) ? "  const double sl%d = (double)p.n%d_%s[0];  // scalar_load (rank-0 tensor)\n"
                                      : "  const float sl%d = evt_rows::to_f(p.n%d_%s[0]);  // scalar_load (rank-0 tensor)\n",
         i, i, s->nodes[i].name);
}
