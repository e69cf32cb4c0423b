/* CPU reference for kernel specs (contract in kspec.h, evt_kspec_reference).
 *
 * Computes acc = A·B in double, then evaluates every visitor node per element in spec order. Mirrors the
 * kernel's rounding points: loads read values already in their dtype, aux stores round to their dtype
 * in memory but pass the unrounded value on (as Sm90AuxStore does), D is rounded to D's dtype, sums
 * accumulate in double and are rounded to f32. Intermediates are double (the kernel uses f32), so the
 * comparison tolerance must cover f32 arithmetic and the GELU/sigmoid approximations.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "evt/kspec.h"
#include "evt_impl.h"

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
    default: EVT_ASSERT(!"evt_vop_apply: not a compute op"); return 0;
  }
}

double evt_vop_visit(evt_vop op, evt_dtype dtype, double value, double *const *tensors, int v, int64_t i,
                     int64_t j, int64_t n, double x, double y) {
  switch (op) {
    case EVT_V_ROW_BCAST: return tensors[v][j];
    case EVT_V_COL_BCAST: return tensors[v][i];
    case EVT_V_SCALAR: return (double)(float)value;
    case EVT_V_AUX_LOAD: return tensors[v][i * n + j];
    case EVT_V_AUX_STORE: tensors[v][i * n + j] = evt_round_to_dtype(x, dtype); return x;
    case EVT_V_ROW_SUM: tensors[v][j] += x; return x;
    case EVT_V_COL_SUM: tensors[v][i] += x; return x;
    default: return evt_vop_apply(op, x, y);
  }
}

int64_t evt_vnode_numel(const evt_kspec *s, int v, int64_t m, int64_t n) {
  switch (s->nodes[v].op) {
    case EVT_V_AUX_LOAD:
    case EVT_V_AUX_STORE: return m * n;
    case EVT_V_ROW_BCAST:
    case EVT_V_ROW_SUM: return n;
    case EVT_V_COL_BCAST:
    case EVT_V_COL_SUM: return m;
    default: return 0;
  }
}

/* One batch: tensors already point at this batch's memory; sums were zeroed by the caller. */
static void reference_one(const evt_kspec *s, int64_t m, int64_t n, int64_t k, const double *a, const double *b,
                          double *const *tensors, double *d) {
  int at = s->layout == EVT_LAYOUT_TN, bt = s->layout == EVT_LAYOUT_NT;
  double *row = malloc(sizeof(double) * (size_t)n);
  EVT_ASSERT(row);
  double val[EVT_KSPEC_MAX_NODES];
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
    for (int64_t j = 0; j < n; j++) {
      for (int v = 0; v < s->nnodes; v++) {
        const evt_vnode *nd = &s->nodes[v];
        double x = nd->in[0] >= 0 ? val[nd->in[0]] : 0, y = nd->in[1] >= 0 ? val[nd->in[1]] : 0;
        switch (nd->op) {
          case EVT_V_ACC: val[v] = (double)(float)row[j]; break;
          default: val[v] = evt_vop_visit(nd->op, nd->dtype, nd->value, tensors, v, i, j, n, x, y); break;
        }
      }
      d[i * n + j] = evt_round_to_dtype(val[s->d_node], s->d_dtype);
    }
  }
  free(row);
}

void evt_kspec_reference_batched(const evt_kspec *s, int64_t l, int64_t m, int64_t n, int64_t k, const double *a,
                                 const double *b, double *const *tensors, double *d) {
  for (int v = 0; v < s->nnodes; v++) {
    evt_vop op = s->nodes[v].op;
    if (op == EVT_V_ROW_SUM || op == EVT_V_COL_SUM)
      memset(tensors[v], 0, sizeof(double) * (size_t)(evt_vnode_numel(s, v, m, n) * (s->nodes[v].shared ? 1 : l)));
  }
  double *tb[EVT_KSPEC_MAX_NODES];
  for (int64_t bi = 0; bi < l; bi++) {
    for (int v = 0; v < s->nnodes; v++)
      tb[v] = tensors[v] && !s->nodes[v].shared ? tensors[v] + bi * evt_vnode_numel(s, v, m, n) : tensors[v];
    reference_one(s, m, n, k, a + bi * m * k, b + bi * k * n, tb, d + bi * m * n);
  }
}

void evt_kspec_reference(const evt_kspec *s, int64_t m, int64_t n, int64_t k, const double *a, const double *b,
                         double *const *tensors, double *d) {
  evt_kspec_reference_batched(s, 1, m, n, k, a, b, tensors, d);
}
