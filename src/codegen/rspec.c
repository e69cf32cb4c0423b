/* Row-kernel specs: building, checking, canonical text and hash, the CPU reference (contract in rspec.h;
 * named example specs: examples_rows.c).
 *
 * The canonical text is a header line (nucleus, dtypes, flags, eps) plus one line per node; its FNV-1a hash
 * names the kernel. The reference evaluates the nucleus per row and the epilogue per element in double,
 * rounding only where the kernel writes memory (aux stores to their dtype, sums to f32).
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/rspec.h"
#include "evt_row_launch.h"
#include "ir/ir.h"

static const char *const nucleus_names[EVT_ROWN_COUNT] = {"none", "softmax", "softmax_bwd", "layernorm",
                                                          "layernorm_bwd", "spmm"};
static const char *const value_names[EVT_RV_COUNT] = {"out", "xhat", "in0", "in1"};

const char *evt_row_nucleus_name(evt_row_nucleus n) { return (unsigned)n < EVT_ROWN_COUNT ? nucleus_names[n] : "?"; }
const char *evt_row_value_name(evt_row_value v) { return (unsigned)v < EVT_RV_COUNT ? value_names[v] : "?"; }

int evt_rspec_long_rows(const evt_rspec *s) {
  int row_sums = 0, per_row = 0;
  for (int i = 0; i < s->nnodes; i++) {
    row_sums += s->nodes[i].op == EVT_V_ROW_SUM;
    per_row += s->nodes[i].op == EVT_V_COL_SUM || s->nodes[i].op == EVT_V_COL_MAX;
  }
  if (s->nucleus == EVT_ROWN_SPMM) return 0; /* (register rows only: N <= EVT_ROW_MAX_N) */
  if (!row_sums) return 1;
  return s->nucleus == EVT_ROWN_NONE && !per_row ? 2 : 0;
}

int evt_row_nucleus_ninputs(const evt_rspec *s) {
  switch (s->nucleus) {
    case EVT_ROWN_SOFTMAX: return 1;
    case EVT_ROWN_SOFTMAX_BWD: return 2;
    case EVT_ROWN_LAYERNORM: return 1 + (s->has_w || s->has_b ? 2 : 0);
    case EVT_ROWN_LAYERNORM_BWD: return 2 + (s->has_w ? 1 : 0);
    default: return 0; /* (spmm: its CSR operand travels in evt_row_launch_args.csr, not in[]) */
  }
}

void evt_rspec_init(evt_rspec *s, evt_row_nucleus nucleus, evt_dtype in_dtype) {
  memset(s, 0, sizeof *s);
  s->nucleus = nucleus;
  s->in_dtype = in_dtype;
  s->w_dtype = in_dtype;
  s->val_dtype = in_dtype;
  s->idx_dtype = EVT_I64;
  s->eps = 1e-5;
}

int evt_rspec_add3(evt_rspec *s, evt_vop op, int in0, int in1, int in2, evt_dtype dtype, const char *name) {
  if ((unsigned)op >= EVT_V_COUNT || s->nnodes >= EVT_RSPEC_MAX_NODES) return -1;
  int id = s->nnodes, in[3] = {in0, in1, in2};
  if (!evt_vop_inputs_ok(op, in, id)) return -1;
  evt_rnode *v = &s->nodes[id];
  memset(v, 0, sizeof *v);
  v->op = op;
  for (int k = 0; k < 3; k++) v->in[k] = in[k];
  v->dtype = evt_vop_node_dtype(op, dtype);
  v->sel = EVT_RV_OUT;
  snprintf(v->name, sizeof v->name, "%s", name && *name ? name : "");
  if (!v->name[0]) snprintf(v->name, sizeof v->name, "v%d", id);
  s->nnodes++;
  return id;
}

int evt_rspec_add(evt_rspec *s, evt_vop op, int in0, int in1, evt_dtype dtype, const char *name) {
  return evt_rspec_add3(s, op, in0, in1, -1, dtype, name);
}

int evt_rspec_acc(evt_rspec *s, evt_row_value sel) {
  int id = evt_rspec_add(s, EVT_V_ACC, -1, -1, EVT_F32, NULL);
  if (id >= 0) s->nodes[id].sel = sel;
  return id;
}

int evt_rspec_rand(evt_rspec *s, uint64_t seed, uint64_t offset, evt_dtype dtype) {
  int id = evt_rspec_add(s, EVT_V_RAND, -1, -1, dtype, NULL);
  if (id >= 0) s->nodes[id].seed = seed, s->nodes[id].offset = offset;
  return id;
}

int evt_rspec_scalar(evt_rspec *s, double value) {
  int id = evt_rspec_add(s, EVT_V_SCALAR, -1, -1, EVT_F32, NULL);
  if (id >= 0) s->nodes[id].value = value;
  return id;
}

static evt_status fail(char *err, size_t errlen, evt_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static evt_status fail(char *err, size_t errlen, evt_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (err && errlen) vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return st;
}

static int is_ident(const char *s) {
  if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || *s == '_')) return 0;
  for (; *s; s++)
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '_')) return 0;
  return 1;
}

static int storage_dtype(evt_dtype t) { return t == EVT_BF16 || t == EVT_F16 || t == EVT_F32; }

evt_dtype evt_rspec_in_dtype(const evt_rspec *s, int k) { return k == 1 && s->in1_mixed ? s->in1_dtype : s->in_dtype; }

evt_status evt_rspec_check(const evt_rspec *s, char *err, size_t errlen) {
  if ((unsigned)s->nucleus >= EVT_ROWN_COUNT) return fail(err, errlen, EVT_ERR_INVALID, "row spec: bad nucleus");
  const char *nn = evt_row_nucleus_name(s->nucleus);
  int ln = s->nucleus == EVT_ROWN_LAYERNORM || s->nucleus == EVT_ROWN_LAYERNORM_BWD;
  if (s->nucleus != EVT_ROWN_NONE && !storage_dtype(s->in_dtype))
    return fail(err, errlen, EVT_ERR_UNSUPPORTED, "row spec: %s inputs must be bf16, f16 or f32, not %s", nn,
                evt_dtype_name(s->in_dtype));
  if (s->in1_mixed && (evt_row_nucleus_ninputs(s) < 2 || !storage_dtype(s->in1_dtype)))
    return fail(err, errlen, EVT_ERR_INVALID, "row spec: %s: a second input dtype %s", nn, evt_dtype_name(s->in1_dtype));
  if ((s->has_w && !ln) || (s->has_b && s->nucleus != EVT_ROWN_LAYERNORM))
    return fail(err, errlen, EVT_ERR_INVALID, "row spec: %s takes no %s", nn, s->has_b ? "bias" : "weight");
  if (s->has_b && !s->has_w)
    return fail(err, errlen, EVT_ERR_UNSUPPORTED, "row spec: layernorm with a bias needs a weight");
  if ((s->has_w || s->has_b) && !storage_dtype(s->w_dtype))
    return fail(err, errlen, EVT_ERR_UNSUPPORTED, "row spec: layer-norm weight dtype %s not supported",
                evt_dtype_name(s->w_dtype));
  if (s->store_stats && s->nucleus != EVT_ROWN_LAYERNORM)
    return fail(err, errlen, EVT_ERR_INVALID, "row spec: only layernorm stores statistics");
  if (ln && !(s->eps > 0 && isfinite(s->eps)))
    return fail(err, errlen, EVT_ERR_INVALID, "row spec: layer-norm eps must be positive and finite (%g)", s->eps);
  if (s->nucleus == EVT_ROWN_SPMM && (!storage_dtype(s->val_dtype) || (s->idx_dtype != EVT_I64 && s->idx_dtype != EVT_I32)))
    return fail(err, errlen, EVT_ERR_UNSUPPORTED, "row spec: spmm values %s (bf16, f16, f32) or indices %s (i64, i32)",
                evt_dtype_name(s->val_dtype), evt_dtype_name(s->idx_dtype));
  if (s->nucleus != EVT_ROWN_SPMM && s->has_perm) return fail(err, errlen, EVT_ERR_INVALID, "row spec: %s takes no perm", nn);
  int outputs = s->store_stats;
  for (int i = 0; i < s->nnodes; i++) {
    const evt_rnode *v = &s->nodes[i];
    int ar = evt_vop_arity(v->op);
    if (ar < 0) return fail(err, errlen, EVT_ERR_INVALID, "row spec: node %d has a bad op", i);
    for (int j = 0; j < ar; j++)
      if (v->in[j] < 0 || v->in[j] >= i)
        return fail(err, errlen, EVT_ERR_INVALID, "row spec: node %d (%s %s): input %d is not an earlier node", i,
                    evt_vop_name(v->op), v->name, j);
    if (!is_ident(v->name))
      return fail(err, errlen, EVT_ERR_INVALID, "row spec: node %d: name '%s' is not an identifier", i, v->name);
    for (int j = 0; j < i; j++)
      if (evt_vop_has_memory(v->op) && evt_vop_has_memory(s->nodes[j].op) && !strcmp(s->nodes[j].name, v->name))
        return fail(err, errlen, EVT_ERR_INVALID, "row spec: node %d: name '%s' used twice", i, v->name);
    if ((evt_vop_has_memory(v->op) || v->op == EVT_V_RAND) && !evt_vop_storage_ok(v->op, v->dtype, 0))
      return fail(err, errlen, EVT_ERR_UNSUPPORTED, "row spec: node %d (%s %s): dtype %s not supported", i,
                  evt_vop_name(v->op), v->name, evt_dtype_name(v->dtype));
    if (v->op == EVT_V_ACC) {
      if (s->nucleus == EVT_ROWN_NONE)
        return fail(err, errlen, EVT_ERR_INVALID, "row spec: node %d: acc in a nucleus-free group", i);
      int ok = (unsigned)v->sel < EVT_RV_COUNT;
      if (v->sel == EVT_RV_XHAT) ok = ln;
      if (v->sel == EVT_RV_IN1) ok = s->nucleus == EVT_ROWN_SOFTMAX_BWD || s->nucleus == EVT_ROWN_LAYERNORM_BWD;
      if (s->nucleus == EVT_ROWN_SPMM) ok = v->sel == EVT_RV_OUT; /* (x is K x N: no M x N input to read back) */
      if (!ok)
        return fail(err, errlen, EVT_ERR_INVALID, "row spec: node %d: %s has no value '%s'", i, nn,
                    evt_row_value_name(v->sel));
    }
    outputs += evt_vop_class(v->op) == 'S';
  }
  int nrs = 0;
  for (int i = 0; i < s->nnodes; i++) nrs += s->nodes[i].op == EVT_V_ROW_SUM;
  if (nrs > 8) return fail(err, errlen, EVT_ERR_UNSUPPORTED, "row spec: at most 8 row_sum nodes (%d)", nrs);
  if (!outputs) return fail(err, errlen, EVT_ERR_INVALID, "row spec: no outputs (no store, no statistics)");
  return EVT_OK;
}

int evt_rspec_text(const evt_rspec *s, char *buf, size_t len) {
  size_t pos = 0;
#define OUT(...)                                                                                              \
  do {                                                                                                        \
    int w_ = snprintf(buf ? buf + (pos < len ? pos : len) : NULL, buf && pos < len ? len - pos : 0, __VA_ARGS__); \
    if (w_ > 0) pos += (size_t)w_;                                                                            \
  } while (0)
  OUT("rows %s in:%s", evt_row_nucleus_name(s->nucleus), evt_dtype_name(s->in_dtype));
  if (s->in1_mixed) OUT(",%s", evt_dtype_name(s->in1_dtype)); /* (absent otherwise: earlier specs keep their hash) */
  if (s->has_w || s->has_b) OUT(" w:%s%s%s", evt_dtype_name(s->w_dtype), s->has_w ? " +w" : "", s->has_b ? " +b" : "");
  if (s->store_stats) OUT(" +stats");
  if (s->nucleus == EVT_ROWN_LAYERNORM || s->nucleus == EVT_ROWN_LAYERNORM_BWD) OUT(" eps %.17g", s->eps);
  if (s->nucleus == EVT_ROWN_SPMM)
    OUT(" val:%s idx:%s%s", evt_dtype_name(s->val_dtype), evt_dtype_name(s->idx_dtype), s->has_perm ? " +perm" : "");
  if (s->arch) OUT(" arch sm_%d", s->arch); /* (absent for sm_90a: its specs keep their hash) */
  OUT("\n");
  for (int i = 0; i < s->nnodes; i++) {
    const evt_rnode *v = &s->nodes[i];
    OUT("%%%d = %s", i, evt_vop_name(v->op));
    if (v->op == EVT_V_ACC) OUT(".%s", evt_row_value_name(v->sel));
    for (int j = 0; j < evt_vop_arity(v->op); j++) OUT(" %%%d", v->in[j]);
    if (evt_vop_has_memory(v->op)) OUT(" %s:%s", v->name, evt_dtype_name(v->dtype));
    if (v->op == EVT_V_SCALAR) OUT(" %.17g", v->value);
    if (v->op == EVT_V_RAND) OUT(" %s", evt_dtype_name(v->dtype)); /* seed, offset: launch arguments, not kernel */
    OUT("\n");
  }
#undef OUT
  return (int)pos;
}

uint64_t evt_rspec_hash(const evt_rspec *s) {
  char buf[4096];
  int n = evt_rspec_text(s, buf, sizeof buf);
  EVT_ASSERT(n > 0 && (size_t)n < sizeof buf);
  return evt_hash_bytes(0, buf, (size_t)n);
}

void evt_rspec_canonicalize(evt_rspec *s) {
  evt_vop op[EVT_RSPEC_MAX_NODES];
  int in[EVT_RSPEC_MAX_NODES][3];
  uint64_t leaf[EVT_RSPEC_MAX_NODES], key[EVT_RSPEC_MAX_NODES];
  for (int v = 0; v < s->nnodes; v++) {
    op[v] = s->nodes[v].op;
    memcpy(in[v], s->nodes[v].in, sizeof in[v]);
    leaf[v] = evt_vop_leaf_key(op[v], s->nodes[v].dtype, s->nodes[v].value, s->nodes[v].name,
                               op[v] == EVT_V_ACC ? (int)s->nodes[v].sel : 0);
  }
  evt_vop_canonical_order(s->nnodes, op, in, leaf, key);
  for (int v = 0; v < s->nnodes; v++) memcpy(s->nodes[v].in, in[v], sizeof in[v]);
}

void evt_rspec_launch_rng(const evt_rspec *s, evt_row_launch_args *a) {
  for (int v = 0; v < s->nnodes && v < EVT_ROW_LAUNCH_MAX_PTRS; v++)
    if (s->nodes[v].op == EVT_V_RAND) a->rng[v] = (evt_rng_key){s->nodes[v].seed, s->nodes[v].offset};
}

void evt_rspec_kernel_name(const evt_rspec *s, char out[40]) {
  snprintf(out, 40, "evt_rowkernel_%016llx", (unsigned long long)evt_rspec_hash(s));
}

int64_t evt_rspec_node_elems(const evt_rspec *s, int i, int64_t m, int64_t n) {
  return evt_vop_elems(s->nodes[i].op, m, n);
}

/* ---- reference ---------------------------------------------------------------------------------------- */

/* Nucleus of one row: out/xhat (may be unused), from inputs in[k] + row offset. */
static void ref_nucleus(const evt_rspec *s, int64_t i, int64_t n, const double *const in[3], double *out, double *xhat,
                        double *mean_out, double *rstd_out) {
  const double *a = in[0] ? in[0] + i * n : NULL, *b = in[1] ? in[1] + i * n : NULL;
  switch (s->nucleus) {
    case EVT_ROWN_SOFTMAX: {
      double mx = -INFINITY, sum = 0;
      for (int64_t j = 0; j < n; j++) mx = a[j] > mx ? a[j] : mx;
      for (int64_t j = 0; j < n; j++) sum += exp(a[j] - mx);
      for (int64_t j = 0; j < n; j++) out[j] = exp(a[j] - mx) / sum;
      break;
    }
    case EVT_ROWN_SOFTMAX_BWD: {
      double dot = 0;
      for (int64_t j = 0; j < n; j++) dot += a[j] * b[j];
      for (int64_t j = 0; j < n; j++) out[j] = b[j] * (a[j] - dot);
      break;
    }
    case EVT_ROWN_LAYERNORM:
    case EVT_ROWN_LAYERNORM_BWD: {
      const double *x = s->nucleus == EVT_ROWN_LAYERNORM ? a : b;
      double mean = 0, var = 0;
      for (int64_t j = 0; j < n; j++) mean += x[j];
      mean /= (double)n;
      for (int64_t j = 0; j < n; j++) var += (x[j] - mean) * (x[j] - mean);
      var /= (double)n;
      double rstd = 1.0 / sqrt(var + (double)(float)s->eps);
      for (int64_t j = 0; j < n; j++) xhat[j] = (x[j] - mean) * rstd;
      if (s->nucleus == EVT_ROWN_LAYERNORM) {
        const double *w = s->has_w ? in[1] : NULL, *bb = s->has_b ? in[2] : NULL;
        for (int64_t j = 0; j < n; j++) out[j] = xhat[j] * (w ? w[j] : 1.0) + (bb ? bb[j] : 0.0);
        if (mean_out) *mean_out = mean;
        if (rstd_out) *rstd_out = rstd;
      } else {
        const double *w = s->has_w ? in[2] : NULL;
        double mg = 0, mgx = 0;
        for (int64_t j = 0; j < n; j++) {
          double g = a[j] * (w ? w[j] : 1.0);
          mg += g;
          mgx += g * xhat[j];
        }
        mg /= (double)n;
        mgx /= (double)n;
        for (int64_t j = 0; j < n; j++) out[j] = rstd * (a[j] * (w ? w[j] : 1.0) - mg - xhat[j] * mgx);
      }
      break;
    }
    default: break;
  }
}

void evt_rspec_reference(const evt_rspec *s, int64_t m, int64_t n, const double *const in[3], double *const *tensors,
                         double *mean, double *rstd) {
  evt_rspec_reference_at(s, m, n, in, tensors, mean, rstd, 0);
}

/* Sums and maxima start empty (the reference accumulates into them). */
static void ref_clear(const evt_rspec *s, int64_t m, int64_t n, double *const *tensors) {
  for (int v = 0; v < s->nnodes; v++) {
    evt_vop op = s->nodes[v].op;
    if (op == EVT_V_ROW_SUM) memset(tensors[v], 0, sizeof(double) * (size_t)n);
    if (op == EVT_V_COL_SUM) memset(tensors[v], 0, sizeof(double) * (size_t)m);
    if (op == EVT_V_COL_MAX)
      for (int64_t k = 0; k < m; k++) tensors[v][k] = -INFINITY;
  }
}

/* The epilogue of row i from its nucleus values (out, xhat; in0 / in1: the row's M×N inputs, may be NULL). */
static void ref_row_epilogue(const evt_rspec *s, int64_t i, int64_t n, const double *out, const double *xhat,
                             const double *in0, const double *in1, double *const *tensors, uint64_t rng_step) {
  double val[EVT_RSPEC_MAX_NODES];
  for (int64_t j = 0; j < n; j++) {
    for (int v = 0; v < s->nnodes; v++) {
      const evt_rnode *nd = &s->nodes[v];
      double vin[3];
      for (int k = 0; k < 3; k++) vin[k] = nd->in[k] >= 0 ? val[nd->in[k]] : 0;
      switch (nd->op) {
        case EVT_V_ACC:
          val[v] = nd->sel == EVT_RV_OUT ? out[j] : nd->sel == EVT_RV_XHAT ? xhat[j] : nd->sel == EVT_RV_IN0 ? in0[j] : in1[j];
          break;
        case EVT_V_RAND: val[v] = evt_vop_rand(nd->seed, nd->offset, rng_step, nd->dtype, i * n + j); break;
        default: val[v] = evt_vop_visit(nd->op, nd->dtype, nd->value, tensors, v, i, j, n, vin); break;
      }
    }
  }
}

/* Sums and maxima rounded at their one store: f32, then their dtype. */
static void ref_finish(const evt_rspec *s, int64_t m, int64_t n, double *const *tensors) {
  for (int v = 0; v < s->nnodes; v++) {
    evt_vop op = s->nodes[v].op;
    int64_t cnt = op == EVT_V_ROW_SUM ? n : op == EVT_V_COL_SUM || op == EVT_V_COL_MAX ? m : 0;
    for (int64_t k = 0; k < cnt; k++) tensors[v][k] = evt_round_to_dtype((double)(float)tensors[v][k], s->nodes[v].dtype);
  }
}

void evt_rspec_reference_at(const evt_rspec *s, int64_t m, int64_t n, const double *const in[3], double *const *tensors,
                            double *mean, double *rstd, uint64_t rng_step) {
  ref_clear(s, m, n, tensors);
  double *out = calloc((size_t)n, sizeof(double)), *xhat = calloc((size_t)n, sizeof(double));
  EVT_ASSERT(out && xhat);
  for (int64_t i = 0; i < m; i++) {
    double mu = 0, rs = 0;
    ref_nucleus(s, i, n, in, out, xhat, &mu, &rs);
    if (s->store_stats) {
      if (mean) mean[i] = (double)(float)mu;
      if (rstd) rstd[i] = (double)(float)rs;
    }
    ref_row_epilogue(s, i, n, out, xhat, in[0] ? in[0] + i * n : NULL, in[1] ? in[1] + i * n : NULL, tensors, rng_step);
  }
  ref_finish(s, m, n, tensors);
  free(out);
  free(xhat);
}

/* Are a's indices in range (rowptr monotone in [0, nnz], referenced col in [0, k) and perm in [0, nnz))? */
static bool csr_ok(const evt_rspec *s, int64_t m, const evt_rspec_csr *a) {
  if (!(a->rowptr[0] >= 0)) return false;
  for (int64_t i = 0; i < m; i++)
    if (!(a->rowptr[i + 1] >= a->rowptr[i] && a->rowptr[i + 1] <= (double)a->nnz)) return false;
  for (int64_t q = (int64_t)a->rowptr[0]; q < (int64_t)a->rowptr[m]; q++) {
    if (!(a->col[q] >= 0 && a->col[q] < (double)a->k)) return false;
    if (s->has_perm && !(a->perm[q] >= 0 && a->perm[q] < (double)a->nnz)) return false;
  }
  return true;
}

evt_status evt_rspec_reference_csr(const evt_rspec *s, int64_t m, int64_t n, const evt_rspec_csr *a, double *const *tensors,
                                   uint64_t rng_step) {
  if (s->nucleus != EVT_ROWN_SPMM || !csr_ok(s, m, a)) return EVT_ERR_INVALID;
  ref_clear(s, m, n, tensors);
  double *out = calloc((size_t)n + 1, sizeof(double));
  EVT_ASSERT(out);
  for (int64_t i = 0; i < m; i++) {
    memset(out, 0, sizeof(double) * (size_t)n);
    for (int64_t q = (int64_t)a->rowptr[i]; q < (int64_t)a->rowptr[i + 1]; q++) {
      double v = a->val[s->has_perm ? (int64_t)a->perm[q] : q];
      const double *xr = a->x + (int64_t)a->col[q] * n;
      for (int64_t j = 0; j < n; j++) out[j] += v * xr[j];
    }
    ref_row_epilogue(s, i, n, out, NULL, NULL, NULL, tensors, rng_step);
  }
  ref_finish(s, m, n, tensors);
  free(out);
  return EVT_OK;
}
