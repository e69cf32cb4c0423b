/* Named row-kernel specs: test fixtures and benchmark inputs, not compiler code (contract in examples.h). dt is the
 * storage dtype of every tensor except the f32 sums (and where a builder says otherwise). */
#include <string.h>

#include "codegen/examples.h"

/* Batch norm's x̂ = (x − mean)·invstd for the examples, with per-channel f32 mean and invstd broadcast along
 * the row (channels-last: a row is one position's channels) */
static int bn_xhat(evt_rspec *s, int x) {
  int mu = evt_rspec_add(s, EVT_V_ROW_BCAST, -1, -1, EVT_F32, "mean");
  int is = evt_rspec_add(s, EVT_V_ROW_BCAST, -1, -1, EVT_F32, "invstd");
  return evt_rspec_add(s, EVT_V_MUL, evt_rspec_add(s, EVT_V_SUB, x, mu, EVT_F32, NULL), is, EVT_F32, NULL);
}

/* y = softmax(x) (aux_store y) */
static void ex_softmax(evt_rspec *s, evt_dtype dt) {
  evt_rspec_init(s, EVT_ROWN_SOFTMAX, dt);
  evt_rspec_add(s, EVT_V_AUX_STORE, evt_rspec_acc(s, EVT_RV_OUT), -1, dt, "y");
}

/* dx = softmax_bwd(dy, y) (aux_store dx) */
static void ex_softmax_bwd(evt_rspec *s, evt_dtype dt) {
  evt_rspec_init(s, EVT_ROWN_SOFTMAX_BWD, dt);
  evt_rspec_add(s, EVT_V_AUX_STORE, evt_rspec_acc(s, EVT_RV_OUT), -1, dt, "dx");
}

/* y = LN(x)·w + b with the statistics stored; residual: h = y + r (aux_load r) stored instead of y */
static void layer_norm(evt_rspec *s, evt_dtype dt, bool residual) {
  evt_rspec_init(s, EVT_ROWN_LAYERNORM, dt);
  s->has_w = s->has_b = 1;
  s->store_stats = 1;
  int y = evt_rspec_acc(s, EVT_RV_OUT);
  if (residual) {
    int r = evt_rspec_add(s, EVT_V_AUX_LOAD, -1, -1, dt, "residual");
    evt_rspec_add(s, EVT_V_AUX_STORE, evt_rspec_add(s, EVT_V_ADD, y, r, EVT_F32, NULL), -1, dt, "h");
  } else {
    evt_rspec_add(s, EVT_V_AUX_STORE, y, -1, dt, "y");
  }
}

static void ex_layernorm(evt_rspec *s, evt_dtype dt) { layer_norm(s, dt, false); }
static void ex_ln_residual(evt_rspec *s, evt_dtype dt) { layer_norm(s, dt, true); }

/* dx = LN_bwd(dy, x, w) (aux_store dx); dgamma = Σ_M dy·x̂, dbeta = Σ_M dy (row_sum); mixed: dy in dt, x and w in
 * f32 (autocast's layer norm; as layernorm_bwd for f32) */
static void layer_norm_bwd(evt_rspec *s, evt_dtype dt, bool mixed) {
  evt_rspec_init(s, EVT_ROWN_LAYERNORM_BWD, dt);
  s->has_w = 1;
  if (mixed && dt != EVT_F32) {
    s->in1_mixed = 1;
    s->in1_dtype = s->w_dtype = EVT_F32;
  }
  evt_rspec_add(s, EVT_V_AUX_STORE, evt_rspec_acc(s, EVT_RV_OUT), -1, dt, "dx");
  int dy = evt_rspec_acc(s, EVT_RV_IN0), xh = evt_rspec_acc(s, EVT_RV_XHAT);
  evt_rspec_add(s, EVT_V_ROW_SUM, evt_rspec_add(s, EVT_V_MUL, dy, xh, EVT_F32, NULL), -1, EVT_F32, "dgamma");
  evt_rspec_add(s, EVT_V_ROW_SUM, dy, -1, EVT_F32, "dbeta");
}

static void ex_layernorm_bwd(evt_rspec *s, evt_dtype dt) { layer_norm_bwd(s, dt, false); }
static void ex_layernorm_bwd_mixed(evt_rspec *s, evt_dtype dt) { layer_norm_bwd(s, dt, true); }

/* Autocast's layer norm over an f32 residual stream as the torch backend lowers it (ViT): the nucleus without
 * w / b, the affine as two f32 row broadcasts, the f32 result and its bf16 copy (the next GEMM's operand) */
static void ex_ln_affine_mixed(evt_rspec *s, evt_dtype dt) {
  evt_rspec_init(s, EVT_ROWN_LAYERNORM, dt);
  int y = evt_rspec_acc(s, EVT_RV_OUT);
  int wy = evt_rspec_add(s, EVT_V_MUL, evt_rspec_add(s, EVT_V_ROW_BCAST, -1, -1, EVT_F32, "w"), y, EVT_F32, NULL);
  int z = evt_rspec_add(s, EVT_V_ADD, evt_rspec_add(s, EVT_V_ROW_BCAST, -1, -1, EVT_F32, "b"), wy, EVT_F32, NULL);
  int z16 = evt_rspec_add(s, EVT_V_ROUND_BF16, z, -1, EVT_F32, NULL);
  evt_rspec_add(s, EVT_V_AUX_STORE, z, -1, EVT_F32, "y");
  evt_rspec_add(s, EVT_V_AUX_STORE, z16, -1, EVT_BF16, "y16");
}

/* Nucleus-free: dx = gelu_erf'(x + bias[j]) · dy (aux loads dy, x; row_bcast bias) */
static void ex_gelu_bwd(evt_rspec *s, evt_dtype dt) {
  evt_rspec_init(s, EVT_ROWN_NONE, dt);
  int dy = evt_rspec_add(s, EVT_V_AUX_LOAD, -1, -1, dt, "dy");
  int x = evt_rspec_add(s, EVT_V_AUX_LOAD, -1, -1, dt, "x");
  int b = evt_rspec_add(s, EVT_V_ROW_BCAST, -1, -1, dt, "bias");
  int z = evt_rspec_add(s, EVT_V_ADD, x, b, EVT_F32, NULL);
  evt_rspec_add(s, EVT_V_AUX_STORE, evt_rspec_add(s, EVT_V_GELU_ERF_GRAD, dy, z, EVT_F32, NULL), -1, dt, "dx");
}

/* Nucleus-free with a Σ over M and no per-row reduction (XML-CNN's loss backward and its classifier's bias
 * gradient): dx = (sigmoid(x) − y)·k, db = Σ_M dx */
static void ex_bce_bias_grad(evt_rspec *s, evt_dtype dt) {
  evt_rspec_init(s, EVT_ROWN_NONE, dt);
  int x = evt_rspec_add(s, EVT_V_AUX_LOAD, -1, -1, dt, "x");
  int y = evt_rspec_add(s, EVT_V_AUX_LOAD, -1, -1, dt, "y");
  int d = evt_rspec_add(s, EVT_V_MUL, evt_rspec_add(s, EVT_V_SUB, evt_rspec_add(s, EVT_V_SIGMOID, x, -1, EVT_F32, NULL), y,
                                                    EVT_F32, NULL),
                        evt_rspec_scalar(s, 0.25), EVT_F32, NULL);
  evt_rspec_add(s, EVT_V_AUX_STORE, d, -1, dt, "dx");
  evt_rspec_add(s, EVT_V_ROW_SUM, d, -1, EVT_F32, "db");
}

/* Batch-norm statistics in channels-last memory order (rows = N·H·W positions, N = channels): Σ_M x, Σ_M x² */
static void ex_bn_stats(evt_rspec *s, evt_dtype dt) {
  evt_rspec_init(s, EVT_ROWN_NONE, dt);
  int x = evt_rspec_add(s, EVT_V_AUX_LOAD, -1, -1, dt, "x");
  evt_rspec_add(s, EVT_V_ROW_SUM, x, -1, EVT_F32, "sx");
  evt_rspec_add(s, EVT_V_ROW_SUM, evt_rspec_add(s, EVT_V_MUL, x, x, EVT_F32, NULL), -1, EVT_F32, "sxx");
}

/* Batch-norm apply + ReLU, channels-last: y = relu((x − mean)·invstd·w + b), per-channel vectors broadcast */
static void ex_bn_apply(evt_rspec *s, evt_dtype dt) {
  evt_rspec_init(s, EVT_ROWN_NONE, dt);
  int xh = bn_xhat(s, evt_rspec_add(s, EVT_V_AUX_LOAD, -1, -1, dt, "x"));
  int w = evt_rspec_add(s, EVT_V_ROW_BCAST, -1, -1, dt, "w");
  int b = evt_rspec_add(s, EVT_V_ROW_BCAST, -1, -1, dt, "b");
  int y = evt_rspec_add(s, EVT_V_ADD, evt_rspec_add(s, EVT_V_MUL, xh, w, EVT_F32, NULL), b, EVT_F32, NULL);
  evt_rspec_add(s, EVT_V_AUX_STORE, evt_rspec_add(s, EVT_V_RELU, y, -1, EVT_F32, NULL), -1, dt, "y");
}

/* Batch-norm backward's reduction through the ReLU, channels-last: g = dy·(y > 0), Σ_M g, Σ_M g·x̂ */
static void ex_bn_bwd_reduce(evt_rspec *s, evt_dtype dt) {
  evt_rspec_init(s, EVT_ROWN_NONE, dt);
  int dy = evt_rspec_add(s, EVT_V_AUX_LOAD, -1, -1, dt, "dy");
  int y = evt_rspec_add(s, EVT_V_AUX_LOAD, -1, -1, dt, "y");
  int xh = bn_xhat(s, evt_rspec_add(s, EVT_V_AUX_LOAD, -1, -1, dt, "x"));
  int g = evt_rspec_add3(s, EVT_V_WHERE, evt_rspec_add(s, EVT_V_GT, y, evt_rspec_scalar(s, 0.0), EVT_F32, NULL), dy,
                         evt_rspec_scalar(s, 0.0), EVT_F32, NULL);
  evt_rspec_add(s, EVT_V_ROW_SUM, g, -1, EVT_F32, "sg");
  evt_rspec_add(s, EVT_V_ROW_SUM, evt_rspec_add(s, EVT_V_MUL, g, xh, EVT_F32, NULL), -1, EVT_F32, "sgx");
}

/* Nucleus-free: z = relu(a·s[i] + b) − 0.5·a (col_bcast s), aux_store z, col_sum Σ_N z */
static void ex_chain_rowsum(evt_rspec *s, evt_dtype dt) {
  evt_rspec_init(s, EVT_ROWN_NONE, dt);
  int a = evt_rspec_add(s, EVT_V_AUX_LOAD, -1, -1, dt, "a");
  int sc = evt_rspec_add(s, EVT_V_COL_BCAST, -1, -1, dt, "scale");
  int b = evt_rspec_add(s, EVT_V_AUX_LOAD, -1, -1, dt, "b");
  int t = evt_rspec_add(s, EVT_V_RELU, evt_rspec_add(s, EVT_V_ADD, evt_rspec_add(s, EVT_V_MUL, a, sc, EVT_F32, NULL),
                                                      b, EVT_F32, NULL),
                        -1, EVT_F32, NULL);
  int h = evt_rspec_add(s, EVT_V_MUL, a, evt_rspec_scalar(s, 0.5), EVT_F32, NULL);
  int z = evt_rspec_add(s, EVT_V_AUX_STORE, evt_rspec_add(s, EVT_V_SUB, t, h, EVT_F32, NULL), -1, dt, "z");
  evt_rspec_add(s, EVT_V_COL_SUM, z, -1, EVT_F32, "zsum");
}

/* Nucleus-free: every unary compute on safe arguments (neg exp log erf tanh sqrt rsqrt reciprocal abs sign),
 * maximum / minimum, the tanh GELU and its derivative */
static void ex_unary_math(evt_rspec *s, evt_dtype dt) {
  evt_rspec_init(s, EVT_ROWN_NONE, dt);
  int x = evt_rspec_add(s, EVT_V_AUX_LOAD, -1, -1, dt, "x");
  int ax = evt_rspec_add(s, EVT_V_ABS, x, -1, EVT_F32, NULL);
  int h = evt_rspec_scalar(s, 0.5), one = evt_rspec_scalar(s, 1.0);
  int e = evt_rspec_add(s, EVT_V_EXP, evt_rspec_add(s, EVT_V_NEG, ax, -1, EVT_F32, NULL), -1, EVT_F32, NULL);
  int l = evt_rspec_add(s, EVT_V_LOG, evt_rspec_add(s, EVT_V_ADD, ax, h, EVT_F32, NULL), -1, EVT_F32, NULL);
  int er = evt_rspec_add(s, EVT_V_ERF, x, -1, EVT_F32, NULL);
  int y1 = evt_rspec_add(s, EVT_V_ADD, evt_rspec_add(s, EVT_V_ADD, e, l, EVT_F32, NULL), er, EVT_F32, NULL);
  evt_rspec_add(s, EVT_V_AUX_STORE, y1, -1, dt, "y1");
  int th = evt_rspec_add(s, EVT_V_TANH, x, -1, EVT_F32, NULL);
  int sq = evt_rspec_add(s, EVT_V_SQRT, ax, -1, EVT_F32, NULL);
  int ax1 = evt_rspec_add(s, EVT_V_ADD, ax, one, EVT_F32, NULL);
  int rs = evt_rspec_add(s, EVT_V_RSQRT, ax1, -1, EVT_F32, NULL);
  int rc = evt_rspec_add(s, EVT_V_RECIPROCAL, ax1, -1, EVT_F32, NULL);
  int sg = evt_rspec_add(s, EVT_V_SIGN, x, -1, EVT_F32, NULL);
  int y2 = evt_rspec_add(s, EVT_V_ADD, evt_rspec_add(s, EVT_V_MUL, th, sq, EVT_F32, NULL),
                         evt_rspec_add(s, EVT_V_SUB, evt_rspec_add(s, EVT_V_MUL, rs, rc, EVT_F32, NULL), sg, EVT_F32, NULL),
                         EVT_F32, NULL);
  evt_rspec_add(s, EVT_V_AUX_STORE, y2, -1, dt, "y2");
  int y3 = evt_rspec_add(s, EVT_V_SUB, evt_rspec_add(s, EVT_V_MAXIMUM, x, er, EVT_F32, NULL),
                         evt_rspec_add(s, EVT_V_MINIMUM, x, th, EVT_F32, NULL), EVT_F32, NULL);
  evt_rspec_add(s, EVT_V_AUX_STORE, y3, -1, dt, "y3");
  /* the tanh GELU and its derivative (kernels/evt_math.h, as in GEMM epilogues) */
  int gt = evt_rspec_add(s, EVT_V_GELU_TANH, x, -1, EVT_F32, NULL);
  int gg = evt_rspec_add(s, EVT_V_GELU_TANH_GRAD, th, x, EVT_F32, NULL);
  evt_rspec_add(s, EVT_V_AUX_STORE, evt_rspec_add(s, EVT_V_ADD, gt, gg, EVT_F32, NULL), -1, dt, "y4");
}

/* Nucleus-free: comparisons of loaded values (exact on both sides), where, bool loads and stores (u8), a
 * dropout-style mask ge(rand, 0.25) drawn in the kernel, i64 labels where(ne(lab, 2), lab, 0) */
static void ex_cmp_where(evt_rspec *s, evt_dtype dt) {
  evt_rspec_init(s, EVT_ROWN_NONE, dt);
  int x = evt_rspec_add(s, EVT_V_AUX_LOAD, -1, -1, dt, "x");
  int m = evt_rspec_add(s, EVT_V_AUX_LOAD, -1, -1, EVT_BOOL, "mask");
  int r = evt_rspec_add(s, EVT_V_ROW_BCAST, -1, -1, dt, "r");
  int z = evt_rspec_scalar(s, 0.0);
  evt_rspec_add(s, EVT_V_AUX_STORE, evt_rspec_add(s, EVT_V_GT, x, r, EVT_F32, NULL), -1, EVT_BOOL, "gt");
  int ge = evt_rspec_add(s, EVT_V_GE, x, z, EVT_F32, NULL), lt = evt_rspec_add(s, EVT_V_LT, x, r, EVT_F32, NULL);
  int le = evt_rspec_add(s, EVT_V_LE, r, z, EVT_F32, NULL), eq = evt_rspec_add(s, EVT_V_EQ, m, z, EVT_F32, NULL);
  int ne = evt_rspec_add(s, EVT_V_NE, x, r, EVT_F32, NULL);
  int sel = evt_rspec_add3(s, EVT_V_WHERE, m, x, r, EVT_F32, NULL);
  int cnt = evt_rspec_add(s, EVT_V_ADD, evt_rspec_add(s, EVT_V_ADD, ge, lt, EVT_F32, NULL),
                          evt_rspec_add(s, EVT_V_ADD, le, evt_rspec_add(s, EVT_V_MUL, eq, ne, EVT_F32, NULL), EVT_F32, NULL),
                          EVT_F32, NULL);
  evt_rspec_add(s, EVT_V_AUX_STORE, evt_rspec_add(s, EVT_V_ADD, sel, cnt, EVT_F32, NULL), -1, dt, "y");
  evt_rspec_add(s, EVT_V_AUX_STORE, evt_rspec_add3(s, EVT_V_WHERE, ge, m, eq, EVT_F32, NULL), -1, EVT_BOOL, "mb");
  /* integer labels (values in doubles): where(ne(lab, 2), lab, 0) stored as i64, as the loss's ignore mask */
  int lab = evt_rspec_add(s, EVT_V_AUX_LOAD, -1, -1, EVT_I64, "lab");
  int keep = evt_rspec_add(s, EVT_V_NE, lab, evt_rspec_scalar(s, 2.0), EVT_F32, NULL);
  evt_rspec_add(s, EVT_V_AUX_STORE, evt_rspec_add3(s, EVT_V_WHERE, keep, lab, z, EVT_F32, NULL), -1, EVT_I64, "labo");
  int u = evt_rspec_rand(s, 1234567, 89, dt); /* a dropout mask drawn in the kernel */
  evt_rspec_add(s, EVT_V_AUX_STORE, evt_rspec_add(s, EVT_V_GE, u, evt_rspec_scalar(s, 0.25), EVT_F32, NULL), -1,
                EVT_BOOL, "keep");
  /* at offset 0 (four elements per Philox call where a row's length is a multiple of 4; offset 89 above never
   * is): the numbers themselves, stored in f32 (exact) */
  evt_rspec_add(s, EVT_V_AUX_STORE, evt_rspec_rand(s, 424242, 0, dt), -1, EVT_F32, "u0");
}

/* Cross-entropy backward on a softmax row: (softmax(x) − one_hot(t)) · k with k a run-time scalar, the row max
 * (col_max), Σ_N x·one_hot (col_sum) and Σ_M of the gradient (row_sum), all stored in dt */
static void ex_softmax_xent(evt_rspec *s, evt_dtype dt) {
  evt_rspec_init(s, EVT_ROWN_SOFTMAX, dt);
  int y = evt_rspec_acc(s, EVT_RV_OUT), x = evt_rspec_acc(s, EVT_RV_IN0);
  int oh = evt_rspec_add(s, EVT_V_ONE_HOT, -1, -1, EVT_I64, "target");
  int k = evt_rspec_add(s, EVT_V_SCALAR_LOAD, -1, -1, dt, "k");
  int d = evt_rspec_add(s, EVT_V_MUL, evt_rspec_add(s, EVT_V_SUB, y, oh, EVT_F32, NULL), k, EVT_F32, NULL);
  evt_rspec_add(s, EVT_V_AUX_STORE, d, -1, dt, "dx");
  evt_rspec_add(s, EVT_V_ROW_SUM, d, -1, dt, "db");
  evt_rspec_add(s, EVT_V_COL_MAX, x, -1, dt, "xmax");
  evt_rspec_add(s, EVT_V_COL_SUM, evt_rspec_add(s, EVT_V_MUL, x, oh, EVT_F32, NULL), -1, dt, "xt");
}

#define ROW_EXAMPLES(X)                                                                                              \
  X(softmax) X(softmax_bwd) X(layernorm) X(ln_residual) X(layernorm_bwd) X(gelu_bwd) X(chain_rowsum) X(unary_math) \
  X(cmp_where) X(softmax_xent) X(layernorm_bwd_mixed) X(bce_bias_grad) X(bn_stats) X(bn_apply) X(bn_bwd_reduce)    \
  X(ln_affine_mixed)

#define NAME(e) #e,
const char *const evt_rspec_example_names[] = {ROW_EXAMPLES(NAME) NULL};
#undef NAME

#define BUILDER(e) ex_##e,
static void (*const builders[])(evt_rspec *s, evt_dtype dt) = {ROW_EXAMPLES(BUILDER)};
#undef BUILDER

evt_status evt_rspec_example(evt_rspec *s, const char *name, evt_dtype dt) {
  for (int i = 0; evt_rspec_example_names[i]; i++)
    if (!strcmp(name, evt_rspec_example_names[i])) {
      builders[i](s, dt);
      return EVT_OK;
    }
  return EVT_ERR_INVALID;
}

evt_status evt_rspec_fp8_example(evt_rspec *s, const char *name, evt_dtype f8) {
  evt_rspec_init(s, EVT_ROWN_NONE, EVT_F32);
  if (!strcmp(name, "quantize")) {
    int x = evt_rspec_add(s, EVT_V_AUX_LOAD, -1, -1, EVT_BF16, "x");
    int sc = evt_rspec_add(s, EVT_V_SCALAR_LOAD, -1, -1, EVT_F32, "scale");
    evt_rspec_add(s, EVT_V_AUX_STORE, evt_rspec_add(s, EVT_V_MUL, x, sc, EVT_F32, NULL), -1, f8, "q");
  } else if (!strcmp(name, "dequantize")) {
    int q = evt_rspec_add(s, EVT_V_AUX_LOAD, -1, -1, f8, "q");
    int sc = evt_rspec_add(s, EVT_V_SCALAR_LOAD, -1, -1, EVT_F32, "scale");
    evt_rspec_add(s, EVT_V_AUX_STORE, evt_rspec_add(s, EVT_V_MUL, q, sc, EVT_F32, NULL), -1, EVT_F32, "y");
  } else if (!strcmp(name, "amax_rows")) {
    int x = evt_rspec_add(s, EVT_V_AUX_LOAD, -1, -1, EVT_BF16, "x");
    evt_rspec_add(s, EVT_V_COL_MAX, evt_rspec_add(s, EVT_V_ABS, x, -1, EVT_F32, NULL), -1, EVT_F32, "m");
  } else {
    return EVT_ERR_INVALID;
  }
  return EVT_OK;
}
