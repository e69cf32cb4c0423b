/* CPU reference for kernel specs (contract in kspec.h, evt_kspec_reference).
 *
 * Computes acc = A·B in double (or takes it: evt_kspec_reference_acc, a convolution's tile), then evaluates every
 * visitor node per element in spec order. Mirrors the
 * kernel's rounding points: loads read values already in their dtype, aux stores round to their dtype
 * in memory but pass the unrounded value on (as Sm90AuxStore does), D is rounded to D's dtype, sums
 * accumulate in double and are rounded to f32. Intermediates are double (the kernel uses f32), so the
 * comparison tolerance must cover f32 arithmetic and the GELU/sigmoid approximations.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/kspec.h"
#include "ir/ir.h"
#include "philox.h"

double evt_vop_apply(evt_vop op, double x, double y) {
  switch (op) {
    case EVT_V_ADD: return x + y;
    case EVT_V_SUB: return x - y;
    case EVT_V_MUL: return x * y;
    case EVT_V_DIV: return x / y;
    case EVT_V_RELU: return isnan(x) ? x : (x > 0 ? x : 0);
    case EVT_V_SIGMOID: return 1.0 / (1.0 + exp(-x));
    case EVT_V_GELU_ERF: return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
    case EVT_V_GELU_TANH: {
      const double k0 = 0.7978845608028654, k1 = 0.044715;
      return 0.5 * x * (1.0 + tanh(k0 * (x + k1 * x * x * x)));
    }
    case EVT_V_GELU_ERF_GRAD: {
      double cdf = 0.5 * (1.0 + erf(y / sqrt(2.0)));
      double pdf = exp(-0.5 * y * y) / sqrt(2.0 * 3.14159265358979323846);
      return x * (cdf + y * pdf);
    }
    case EVT_V_GELU_TANH_GRAD: {
      const double k0 = 0.7978845608028654, k1 = 0.044715;
      double u = k0 * (y + k1 * y * y * y), th = tanh(u);
      double du = k0 * (1.0 + 3.0 * k1 * y * y);
      return x * (0.5 * (1.0 + th) + 0.5 * y * (1.0 - th * th) * du);
    }
    case EVT_V_RELU_GRAD: return y > 0 ? x : 0;
    case EVT_V_NEG: return -x;
    case EVT_V_EXP: return exp(x);
    case EVT_V_LOG: return log(x);
    case EVT_V_ERF: return erf(x);
    case EVT_V_TANH: return tanh(x);
    case EVT_V_SQRT: return sqrt(x);
    case EVT_V_RSQRT: return 1.0 / sqrt(x);
    case EVT_V_RECIPROCAL: return 1.0 / x;
    case EVT_V_ABS: return fabs(x);
    case EVT_V_SIGN: return isnan(x) ? x : x > 0 ? 1.0 : x < 0 ? -1.0 : 0.0;
    case EVT_V_ROUND_BF16: return evt_round_to_dtype(x, EVT_BF16);
    case EVT_V_ROUND_F16: return evt_round_to_dtype(x, EVT_F16);
    case EVT_V_MAXIMUM: return isnan(x) || isnan(y) ? NAN : x > y ? x : y;
    case EVT_V_MINIMUM: return isnan(x) || isnan(y) ? NAN : x < y ? x : y;
    case EVT_V_EQ: return x == y;
    case EVT_V_NE: return x != y;
    case EVT_V_LT: return x < y;
    case EVT_V_LE: return x <= y;
    case EVT_V_GT: return x > y;
    case EVT_V_GE: return x >= y;
    case EVT_V_KEEP: return x;
    default: EVT_ASSERT(!"evt_vop_apply: not a compute op"); return 0;
  }
}

double evt_vop_apply3(evt_vop op, double x, double y, double z) {
  if (op == EVT_V_WHERE) return x != 0 ? y : z;
  return evt_vop_apply(op, x, y);
}

double evt_vop_rand(uint64_t seed, uint64_t offset, uint64_t step, evt_dtype dtype, int64_t e) {
  return evt_round_to_dtype((double)evt_philox_uniform(seed, offset, step, (uint64_t)e), dtype);
}

int64_t evt_vop_elems(evt_vop op, int64_t m, int64_t n) {
  switch (op) {
    case EVT_V_ROW_BCAST: case EVT_V_ROW_SUM: return n;
    case EVT_V_COL_BCAST: case EVT_V_COL_SUM: case EVT_V_COL_MAX: case EVT_V_ONE_HOT: return m;
    case EVT_V_AUX_LOAD: case EVT_V_AUX_STORE: return m * n;
    case EVT_V_SCALAR_LOAD: return 1;
    default: return 0;
  }
}

double evt_vop_visit(evt_vop op, evt_dtype dtype, double value, double *const *tensors, int v, int64_t i,
                     int64_t j, int64_t n, const double in[3]) {
  double x = in[0];
  switch (op) {
    case EVT_V_ROW_BCAST: return tensors[v][j];
    case EVT_V_COL_BCAST: return tensors[v][i];
    case EVT_V_SCALAR: return (double)(float)value;
    case EVT_V_SCALAR_LOAD: return tensors[v][0];
    case EVT_V_ONE_HOT: return tensors[v][i] == (double)j ? 1.0 : 0.0;
    case EVT_V_AUX_LOAD: return tensors[v][i * n + j];
    case EVT_V_AUX_STORE: tensors[v][i * n + j] = evt_round_to_dtype(x, dtype); return x;
    case EVT_V_ROW_SUM: tensors[v][j] += x; return x;
    case EVT_V_COL_SUM: tensors[v][i] += x; return x;
    case EVT_V_COL_MAX: {
      double *mx = &tensors[v][i];
      if (!isnan(*mx) && (isnan(x) || x > *mx)) *mx = x;
      return x;
    }
    default: return evt_vop_apply3(op, x, in[1], in[2]);
  }
}

int64_t evt_vnode_numel(const evt_kspec *s, int v, int64_t m, int64_t n) { return evt_vop_elems(s->nodes[v].op, m, n); }

/* Row i of the epilogue from its accumulator values row[0..n) (rounded to f32 as the kernel's f32 accumulator). */
static void epilogue_row(const evt_kspec *s, int64_t i, int64_t n, const double *row, double *const *tensors, double *d,
                         uint64_t rng_step) {
  double val[EVT_KSPEC_MAX_NODES];
  for (int64_t j = 0; j < n; j++) {
    for (int v = 0; v < s->nnodes; v++) {
      const evt_vnode *nd = &s->nodes[v];
      double in[3];
      for (int q = 0; q < 3; q++) in[q] = nd->in[q] >= 0 ? val[nd->in[q]] : 0;
      switch (nd->op) {
        case EVT_V_ACC: val[v] = (double)(float)row[j]; break;
        case EVT_V_RAND: val[v] = evt_vop_rand(nd->seed, nd->offset, rng_step, nd->dtype, i * n + j); break;
        default: val[v] = evt_vop_visit(nd->op, nd->dtype, nd->value, tensors, v, i, j, n, in); break;
      }
    }
    d[i * n + j] = evt_round_to_dtype(val[s->d_node], s->d_dtype);
  }
}

/* One batch: tensors already point at this batch's memory; sums were zeroed by the caller. */
static void reference_one(const evt_kspec *s, int64_t m, int64_t n, int64_t k, const double *a, const double *b,
                          double *const *tensors, double *d, uint64_t rng_step) {
  int at = s->layout == EVT_LAYOUT_TN, bt = s->layout == EVT_LAYOUT_NT;
  double *row = malloc(sizeof(double) * (size_t)n);
  EVT_ASSERT(row);
  for (int64_t i = 0; i < m; i++) {
    for (int64_t j = 0; j < n; j++) row[j] = 0;
    for (int64_t kk = 0; kk < k; kk++) {
      double av = at ? a[kk * m + i] : a[i * k + kk];
      if (av == 0) continue;
      if (bt)
        for (int64_t j = 0; j < n; j++) row[j] += av * b[j * k + kk];
      else
        for (int64_t j = 0; j < n; j++) row[j] += av * b[kk * n + j];
    }
    epilogue_row(s, i, n, row, tensors, d, rng_step);
  }
  free(row);
}

/* Sums start at 0, col_max at -inf (l batches of every per-batch tensor). */
static void reset_reductions(const evt_kspec *s, int64_t l, int64_t m, int64_t n, double *const *tensors) {
  for (int v = 0; v < s->nnodes; v++) {
    evt_vop op = s->nodes[v].op;
    int64_t len = evt_vnode_numel(s, v, m, n) * (s->nodes[v].shared ? 1 : l);
    if (op == EVT_V_ROW_SUM || op == EVT_V_COL_SUM) memset(tensors[v], 0, sizeof(double) * (size_t)len);
    for (int64_t i = 0; op == EVT_V_COL_MAX && i < len; i++) tensors[v][i] = -INFINITY; /* max's identity */
  }
}

void evt_kspec_reference_acc(const evt_kspec *s, int64_t m, int64_t n, const double *acc, double *const *tensors, double *d,
                             uint64_t rng_step) {
  reset_reductions(s, 1, m, n, tensors);
  for (int64_t i = 0; i < m; i++) epilogue_row(s, i, n, acc + i * n, tensors, d, rng_step);
}

void evt_kspec_reference_batched_at(const evt_kspec *s, int64_t l, int64_t m, int64_t n, int64_t k, const double *a,
                                    const double *b, double *const *tensors, double *d, uint64_t rng_step) {
  reset_reductions(s, l, m, n, tensors);
  double *tb[EVT_KSPEC_MAX_NODES];
  for (int64_t bi = 0; bi < l; bi++) {
    for (int v = 0; v < s->nnodes; v++)
      tb[v] = tensors[v] && !s->nodes[v].shared ? tensors[v] + bi * evt_vnode_numel(s, v, m, n) : tensors[v];
    reference_one(s, m, n, k, a + bi * m * k, b + bi * k * n, tb, d + bi * m * n, rng_step);
  }
}

void evt_kspec_reference_batched(const evt_kspec *s, int64_t l, int64_t m, int64_t n, int64_t k, const double *a,
                                 const double *b, double *const *tensors, double *d) {
  evt_kspec_reference_batched_at(s, l, m, n, k, a, b, tensors, d, 0);
}

void evt_kspec_reference(const evt_kspec *s, int64_t m, int64_t n, int64_t k, const double *a, const double *b,
                         double *const *tensors, double *d) {
  evt_kspec_reference_batched_at(s, 1, m, n, k, a, b, tensors, d, 0);
}
