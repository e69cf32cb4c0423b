/* Named GEMM epilogue specs: test fixtures and benchmark inputs, not compiler code (contract in examples.h).
 * Each builder gets a spec initialized with bf16 operands, layout NN, D bf16 and node 0 = acc. */
#include <string.h>

#include "codegen/examples.h"

const char *const evt_kspec_example_names[] = {"plain",    "bias_gelu_aux", "bias_relu_dbias", "gelu_bwd",
                                               "gelu_bwd_dbias", "bias_silu", "bias_relu_aux", "bias_gelu_aux_f16", "mixed_f32",
                                               "bmm_plain", "bmm_scale", "bmm_scale_mask_stats", "bmm_softmax_bwd",
                                               "visitor_ops", "visitor_cmp", "bias_dropout", "bias_relu_amax", "tf32_bias_relu", NULL};

/* z = acc + bias[n] (stored as aux "z"); D = act(z)   (the MLP forward: bias_gelu_aux, bias_relu_aux) */
static void bias_act_aux(evt_kspec *s, int acc, evt_vop act) {
  int bias = evt_kspec_add(s, EVT_V_ROW_BCAST, -1, -1, EVT_BF16, "bias");
  int z = evt_kspec_add(s, EVT_V_ADD, acc, bias, EVT_F32, NULL);
  evt_kspec_add(s, EVT_V_AUX_STORE, z, -1, EVT_BF16, "z");
  s->d_node = evt_kspec_add(s, act, z, -1, EVT_F32, NULL);
}

/* y = relu(acc + bias[n]); D = y; dbias[n] = Σ_m y  (row_sum "dbias", f32) */
static void bias_relu_dbias(evt_kspec *s, int acc) {
  int bias = evt_kspec_add(s, EVT_V_ROW_BCAST, -1, -1, EVT_BF16, "bias");
  int z = evt_kspec_add(s, EVT_V_ADD, acc, bias, EVT_F32, NULL);
  int y = evt_kspec_add(s, EVT_V_RELU, z, -1, EVT_F32, NULL);
  evt_kspec_add(s, EVT_V_ROW_SUM, y, -1, EVT_F32, "dbias");
  s->d_node = y;
}

/* y = relu(acc + bias[n]); D = y; amax[m] = max_n |y|  (col_max "amax", f32: the next layer's fp8 amax, per row) */
static void bias_relu_amax(evt_kspec *s, int acc) {
  int bias = evt_kspec_add(s, EVT_V_ROW_BCAST, -1, -1, EVT_BF16, "bias");
  int z = evt_kspec_add(s, EVT_V_ADD, acc, bias, EVT_F32, NULL);
  int y = evt_kspec_add(s, EVT_V_RELU, z, -1, EVT_F32, NULL);
  int ay = evt_kspec_add(s, EVT_V_ABS, y, -1, EVT_F32, NULL);
  evt_kspec_add(s, EVT_V_COL_MAX, ay, -1, EVT_F32, "amax");
  s->d_node = y;
}

/* D = acc · gelu_erf'(x), x an aux load   (the GELU backward, dX = dY·Wᵀ) */
static void gelu_bwd(evt_kspec *s, int acc) {
  int x = evt_kspec_add(s, EVT_V_AUX_LOAD, -1, -1, EVT_BF16, "x");
  s->d_node = evt_kspec_add(s, EVT_V_GELU_ERF_GRAD, acc, x, EVT_F32, NULL);
}

/* The MLP's dX = dY·W2ᵀ with the GELU backward and fc1's bias gradient: a row sum of a value that is 0 past the
 * problem's edges (no per-row bounds check in the sum: emit_cutlass.c zero_out_of_bounds). */
static void gelu_bwd_dbias(evt_kspec *s, int acc) {
  int x = evt_kspec_add(s, EVT_V_AUX_LOAD, -1, -1, EVT_BF16, "x");
  int g = evt_kspec_add(s, EVT_V_GELU_ERF_GRAD, acc, x, EVT_F32, NULL);
  evt_kspec_add(s, EVT_V_ROW_SUM, g, -1, EVT_F32, "dbias");
  s->d_node = g;
}

/* z = acc + bias[n]; D = z · sigmoid(z)   (z is shared: a topological visitor) */
static void bias_silu(evt_kspec *s, int acc) {
  int bias = evt_kspec_add(s, EVT_V_ROW_BCAST, -1, -1, EVT_BF16, "bias");
  int z = evt_kspec_add(s, EVT_V_ADD, acc, bias, EVT_F32, NULL);
  int sg = evt_kspec_add(s, EVT_V_SIGMOID, z, -1, EVT_F32, NULL);
  s->d_node = evt_kspec_add(s, EVT_V_MUL, z, sg, EVT_F32, NULL);
}

/* bias_gelu_aux with f16 operands, bias, aux and D */
static void bias_gelu_aux_f16(evt_kspec *s, evt_tile_config cfg) {
  evt_kspec_init(s, EVT_LAYOUT_NN, EVT_F16, EVT_F16, cfg);
  int acc = evt_kspec_add(s, EVT_V_ACC, -1, -1, EVT_F32, "acc");
  int bias = evt_kspec_add(s, EVT_V_ROW_BCAST, -1, -1, EVT_F16, "bias");
  int z = evt_kspec_add(s, EVT_V_ADD, acc, bias, EVT_F32, NULL);
  evt_kspec_add(s, EVT_V_AUX_STORE, z, -1, EVT_F16, "z");
  s->d_node = evt_kspec_add(s, EVT_V_GELU_ERF, z, -1, EVT_F32, NULL);
}

/* Every remaining node kind once, D in f32: t = (acc·0.5 − c[m]) / 2 (shared); g = gelu_tanh(t);
 * q = gelu_tanh_grad(relu_grad(g, x), t); rowsum[m] = Σ_n q; D = q */
static void mixed_f32(evt_kspec *s, evt_tile_config cfg) {
  evt_kspec_init(s, EVT_LAYOUT_NN, EVT_BF16, EVT_F32, cfg);
  int acc = evt_kspec_add(s, EVT_V_ACC, -1, -1, EVT_F32, "acc");
  int half = evt_kspec_scalar(s, 0.5);
  int c = evt_kspec_add(s, EVT_V_COL_BCAST, -1, -1, EVT_BF16, "c");
  int x = evt_kspec_add(s, EVT_V_AUX_LOAD, -1, -1, EVT_BF16, "x");
  int two = evt_kspec_scalar(s, 2.0);
  int t1 = evt_kspec_add(s, EVT_V_MUL, acc, half, EVT_F32, NULL);
  int t2 = evt_kspec_add(s, EVT_V_SUB, t1, c, EVT_F32, NULL);
  int t = evt_kspec_add(s, EVT_V_DIV, t2, two, EVT_F32, NULL);
  int g = evt_kspec_add(s, EVT_V_GELU_TANH, t, -1, EVT_F32, NULL);
  int r = evt_kspec_add(s, EVT_V_RELU_GRAD, g, x, EVT_F32, NULL);
  int q = evt_kspec_add(s, EVT_V_GELU_TANH_GRAD, r, t, EVT_F32, NULL);
  evt_kspec_add(s, EVT_V_COL_SUM, q, -1, EVT_F32, "rowsum");
  s->d_node = q;
}

/* z = acc + bias[n]; a leaky ReLU with a run-time slope k (scalar_load) through gt / where; the mask stored as
 * bool (u8); unary math; a side output (tanh(z)·rsqrt(|z|+1)) D does not use (keep);
 * D = where(mask, w, exp(−|z|)·log(|z|+0.5)) + erf(z) */
static void visitor_ops(evt_kspec *s, int acc) {
  int bias = evt_kspec_add(s, EVT_V_ROW_BCAST, -1, -1, EVT_BF16, "bias");
  int k = evt_kspec_add(s, EVT_V_SCALAR_LOAD, -1, -1, EVT_BF16, "k");
  int msk = evt_kspec_add(s, EVT_V_AUX_LOAD, -1, -1, EVT_BOOL, "mask");
  int z = evt_kspec_add(s, EVT_V_ADD, acc, bias, EVT_F32, NULL);
  int ax = evt_kspec_add(s, EVT_V_ABS, z, -1, EVT_F32, NULL);
  int e = evt_kspec_add(s, EVT_V_EXP, evt_kspec_add(s, EVT_V_NEG, ax, -1, EVT_F32, NULL), -1, EVT_F32, NULL);
  int l = evt_kspec_add(s, EVT_V_LOG, evt_kspec_add(s, EVT_V_ADD, ax, evt_kspec_scalar(s, 0.5), EVT_F32, NULL), -1,
                        EVT_F32, NULL);
  int er = evt_kspec_add(s, EVT_V_ERF, z, -1, EVT_F32, NULL);
  int th = evt_kspec_add(s, EVT_V_TANH, z, -1, EVT_F32, NULL);
  int rs = evt_kspec_add(s, EVT_V_RSQRT, evt_kspec_add(s, EVT_V_ADD, ax, evt_kspec_scalar(s, 1.0), EVT_F32, NULL), -1,
                         EVT_F32, NULL);
  int c = evt_kspec_add(s, EVT_V_GT, z, evt_kspec_scalar(s, 0.0), EVT_F32, NULL);
  int w = evt_kspec_add3(s, EVT_V_WHERE, c, z, evt_kspec_add(s, EVT_V_MUL, z, k, EVT_F32, NULL), EVT_F32, NULL);
  evt_kspec_add(s, EVT_V_AUX_STORE, c, -1, EVT_BOOL, "pos");
  evt_kspec_add(s, EVT_V_AUX_STORE, evt_kspec_add(s, EVT_V_MUL, th, rs, EVT_F32, NULL), -1, EVT_BF16, "side");
  int sel = evt_kspec_add3(s, EVT_V_WHERE, msk, w, evt_kspec_add(s, EVT_V_MUL, e, l, EVT_F32, NULL), EVT_F32, NULL);
  s->d_node = evt_kspec_add(s, EVT_V_ADD, sel, er, EVT_F32, NULL);
}

/* The remaining computes, D in f32: comparisons of acc with a column broadcast r[m] (0/1 values), maximum /
 * minimum / sign / sqrt / reciprocal: D = (acc≥r)+(acc<r)·2+(acc≤r)·4+(acc==acc)·8+(acc!=r)·16
 *   + max(acc, r) − min(acc, r) + sign(acc)·sqrt(|acc|) · reciprocal(|acc| + 1) */
static void visitor_cmp(evt_kspec *s, evt_tile_config cfg) {
  evt_kspec_init(s, EVT_LAYOUT_NN, EVT_BF16, EVT_F32, cfg);
  int acc = evt_kspec_add(s, EVT_V_ACC, -1, -1, EVT_F32, "acc");
  int r = evt_kspec_add(s, EVT_V_COL_BCAST, -1, -1, EVT_BF16, "r");
  int ge = evt_kspec_add(s, EVT_V_GE, acc, r, EVT_F32, NULL);
  int lt = evt_kspec_add(s, EVT_V_MUL, evt_kspec_add(s, EVT_V_LT, acc, r, EVT_F32, NULL), evt_kspec_scalar(s, 2.0),
                         EVT_F32, NULL);
  int le = evt_kspec_add(s, EVT_V_MUL, evt_kspec_add(s, EVT_V_LE, acc, r, EVT_F32, NULL), evt_kspec_scalar(s, 4.0),
                         EVT_F32, NULL);
  int eq = evt_kspec_add(s, EVT_V_MUL, evt_kspec_add(s, EVT_V_EQ, acc, acc, EVT_F32, NULL), evt_kspec_scalar(s, 8.0),
                         EVT_F32, NULL);
  int ne = evt_kspec_add(s, EVT_V_MUL, evt_kspec_add(s, EVT_V_NE, acc, r, EVT_F32, NULL), evt_kspec_scalar(s, 16.0),
                         EVT_F32, NULL);
  int cmp = evt_kspec_add(s, EVT_V_ADD, evt_kspec_add(s, EVT_V_ADD, ge, lt, EVT_F32, NULL),
                          evt_kspec_add(s, EVT_V_ADD, le, evt_kspec_add(s, EVT_V_ADD, eq, ne, EVT_F32, NULL), EVT_F32, NULL),
                          EVT_F32, NULL);
  int mm = evt_kspec_add(s, EVT_V_SUB, evt_kspec_add(s, EVT_V_MAXIMUM, acc, r, EVT_F32, NULL),
                         evt_kspec_add(s, EVT_V_MINIMUM, acc, r, EVT_F32, NULL), EVT_F32, NULL);
  int ax = evt_kspec_add(s, EVT_V_ABS, acc, -1, EVT_F32, NULL);
  int sq = evt_kspec_add(s, EVT_V_MUL, evt_kspec_add(s, EVT_V_SIGN, acc, -1, EVT_F32, NULL),
                         evt_kspec_add(s, EVT_V_SQRT, ax, -1, EVT_F32, NULL), EVT_F32, NULL);
  int rc = evt_kspec_add(s, EVT_V_RECIPROCAL, evt_kspec_add(s, EVT_V_ADD, ax, evt_kspec_scalar(s, 1.0), EVT_F32, NULL),
                         -1, EVT_F32, NULL);
  s->d_node = evt_kspec_add(s, EVT_V_ADD, evt_kspec_add(s, EVT_V_ADD, cmp, mm, EVT_F32, NULL),
                            evt_kspec_add(s, EVT_V_MUL, sq, rc, EVT_F32, NULL), EVT_F32, NULL);
}

/* A projection's bias + dropout drawn in the epilogue (evt_nodes::Philox, seed 7 offset 3, p = 0.25): the mask
 * stored as bool (the backward's), D = (acc + bias) · keep · 4/3 */
static void bias_dropout(evt_kspec *s, int acc) {
  int bias = evt_kspec_add(s, EVT_V_ROW_BCAST, -1, -1, EVT_BF16, "bias");
  int z = evt_kspec_add(s, EVT_V_ADD, acc, bias, EVT_F32, NULL);
  int u = evt_kspec_add(s, EVT_V_RAND, -1, -1, EVT_F32, NULL);
  if (u >= 0) s->nodes[u].seed = 7, s->nodes[u].offset = 3;
  int keep = evt_kspec_add(s, EVT_V_GE, u, evt_kspec_scalar(s, 0.25), EVT_F32, NULL);
  evt_kspec_add(s, EVT_V_AUX_STORE, keep, -1, EVT_BOOL, "mask");
  s->d_node = evt_kspec_add(s, EVT_V_MUL, evt_kspec_add(s, EVT_V_MUL, z, keep, EVT_F32, NULL),
                            evt_kspec_scalar(s, 4.0 / 3.0), EVT_F32, NULL);
}

/* f32 operands on TF32 tensor cores (kspec.h "TF32 operands": layout NT, tile_k 32), D = relu(acc + bias[n]) in f32,
 * bias f32 (an f32 model's linear layer with evt_options.tf32) */
static void tf32_bias_relu(evt_kspec *s, evt_tile_config cfg) {
  cfg.tile_k = 32;
  evt_kspec_init(s, EVT_LAYOUT_NT, EVT_F32, EVT_F32, cfg);
  int acc = evt_kspec_add(s, EVT_V_ACC, -1, -1, EVT_F32, "acc");
  int bias = evt_kspec_add(s, EVT_V_ROW_BCAST, -1, -1, EVT_F32, "bias");
  s->d_node = evt_kspec_add(s, EVT_V_RELU, evt_kspec_add(s, EVT_V_ADD, acc, bias, EVT_F32, NULL), -1, EVT_F32, NULL);
}

/* Batched (batched = 1; attention-style epilogues): bmm_plain D = acc; bmm_scale D = acc · 0.125 (attention scores
 * q·kᵀ / sqrt(d)); bmm_scale_mask_stats z = acc·0.125 + mask (aux, per batch) + bias[n] (shared), D = z,
 * rowstat[m] = Σ_n z per batch (col_sum), colstat[n] = Σ over m and all batches (shared); bmm_softmax_bwd
 * D = p · (acc − rowdot[m]) · 0.125, p aux per batch, rowdot f32 per batch. */
static evt_status bmm_example(evt_kspec *s, int acc, const char *name) {
  s->batched = 1;
  if (!strcmp(name, "bmm_plain")) {
    s->d_node = acc;
  } else if (!strcmp(name, "bmm_scale")) {
    s->d_node = evt_kspec_add(s, EVT_V_MUL, acc, evt_kspec_scalar(s, 0.125), EVT_F32, NULL);
  } else if (!strcmp(name, "bmm_scale_mask_stats")) {
    int sc = evt_kspec_scalar(s, 0.125);
    int mask = evt_kspec_add(s, EVT_V_AUX_LOAD, -1, -1, EVT_BF16, "mask");
    int bias = evt_kspec_add(s, EVT_V_ROW_BCAST, -1, -1, EVT_BF16, "bias");
    s->nodes[bias].shared = 1;
    int t = evt_kspec_add(s, EVT_V_MUL, acc, sc, EVT_F32, NULL);
    int u = evt_kspec_add(s, EVT_V_ADD, t, mask, EVT_F32, NULL);
    int z = evt_kspec_add(s, EVT_V_ADD, u, bias, EVT_F32, NULL);
    evt_kspec_add(s, EVT_V_COL_SUM, z, -1, EVT_F32, "rowstat");
    int cs = evt_kspec_add(s, EVT_V_ROW_SUM, z, -1, EVT_F32, "colstat");
    s->nodes[cs].shared = 1;
    s->d_node = z;
  } else if (!strcmp(name, "bmm_softmax_bwd")) {
    int c = evt_kspec_add(s, EVT_V_COL_BCAST, -1, -1, EVT_F32, "rowdot");
    int p = evt_kspec_add(s, EVT_V_AUX_LOAD, -1, -1, EVT_BF16, "p");
    int sc = evt_kspec_scalar(s, 0.125);
    int t = evt_kspec_add(s, EVT_V_SUB, acc, c, EVT_F32, NULL);
    int u = evt_kspec_add(s, EVT_V_MUL, p, t, EVT_F32, NULL);
    s->d_node = evt_kspec_add(s, EVT_V_MUL, u, sc, EVT_F32, NULL);
  } else {
    return EVT_ERR_INVALID;
  }
  return EVT_OK;
}

evt_status evt_kspec_example(evt_kspec *s, const char *name, evt_tile_config cfg) {
  evt_kspec_init(s, EVT_LAYOUT_NN, EVT_BF16, EVT_BF16, cfg);
  int acc = evt_kspec_add(s, EVT_V_ACC, -1, -1, EVT_F32, "acc");
  if (!strcmp(name, "plain")) s->d_node = acc;
  else if (!strcmp(name, "bias_gelu_aux")) bias_act_aux(s, acc, EVT_V_GELU_ERF);
  else if (!strcmp(name, "bias_relu_aux")) bias_act_aux(s, acc, EVT_V_RELU);
  else if (!strcmp(name, "bias_relu_dbias")) bias_relu_dbias(s, acc);
  else if (!strcmp(name, "gelu_bwd")) gelu_bwd(s, acc);
  else if (!strcmp(name, "gelu_bwd_dbias")) gelu_bwd_dbias(s, acc);
  else if (!strcmp(name, "bias_silu")) bias_silu(s, acc);
  else if (!strcmp(name, "bias_gelu_aux_f16")) bias_gelu_aux_f16(s, cfg);
  else if (!strcmp(name, "mixed_f32")) mixed_f32(s, cfg);
  else if (!strcmp(name, "visitor_ops")) visitor_ops(s, acc);
  else if (!strcmp(name, "visitor_cmp")) visitor_cmp(s, cfg);
  else if (!strcmp(name, "bias_dropout")) bias_dropout(s, acc);
  else if (!strcmp(name, "bias_relu_amax")) bias_relu_amax(s, acc);
  else if (!strcmp(name, "tf32_bias_relu")) tf32_bias_relu(s, cfg);
  else if (!strncmp(name, "bmm_", 4)) return bmm_example(s, acc, name);
  else return EVT_ERR_INVALID;
  return EVT_OK;
}

void evt_kspec_fp8_example(evt_kspec *s, evt_dtype a, evt_dtype b, evt_dtype d) {
  evt_kspec_init(s, EVT_LAYOUT_NT, a, d, (evt_tile_config){128, 128, 128, 1, 1, EVT_SCHED_COOPERATIVE});
  s->b_mixed = a != b;
  s->b_dtype = b;
  int acc = evt_kspec_add(s, EVT_V_ACC, -1, -1, EVT_F32, "acc");
  int inv = evt_kspec_add(s, EVT_V_SCALAR_LOAD, -1, -1, EVT_F32, "inv_scale");
  s->d_node = evt_kspec_add(s, EVT_V_MUL, acc, inv, EVT_F32, NULL);
}
