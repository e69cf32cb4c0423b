/* The CPU interpreter (src/runtime/interp*.c): per op family, small cases with hand-computed values,
 * adjoint identities for the backward ops, the Philox dropout mask, dtype rounding, the fp64 flag,
 * run-time index errors, memory release in evt_interp_run, and evt_interp_init_inputs.
 *
 * Nodes are appended with their output type given explicitly (raw_op), so these tests check the
 * interpreter alone, independent of shape inference. */
#include "test.h"

#include "philox.h"
#include "runtime/interp/interp.h"

#include <stdlib.h>
#include <string.h>

#define SH(...) ((const int64_t[]){__VA_ARGS__})
#define DV(...) ((const double[]){__VA_ARGS__})
#define IDS(...) ((const int[]){__VA_ARGS__})

typedef struct tg {
  evt_graph *g;
  evt_tensor v[64];
} tg;

static tg *tg_new(void) {
  tg *t = calloc(1, sizeof *t);
  t->g = evt_graph_new("t");
  return t;
}

static void tg_free(tg *t) {
  for (int i = 0; i < 64; i++) evt_tensor_free(&t->v[i]);
  evt_graph_free(t->g);
  free(t);
}

/* An input with the given values (NULL: leave unset). */
static int in_(tg *t, evt_dtype dt, int rank, const int64_t *shape, const double *data) {
  char name[16];
  snprintf(name, sizeof name, "in%d", t->g->nnodes);
  int id = evt_input(t->g, name, dt, rank, shape);
  EVT_ASSERT(id >= 0);
  if (data) {
    EVT_ASSERT(evt_tensor_alloc(&t->v[id], dt, rank, shape) == EVT_OK);
    memcpy(t->v[id].data, data, sizeof(double) * (size_t)t->v[id].numel);
  }
  return id;
}

/* Appends a node with an explicit output type, bypassing shape inference. */
static int raw_op(tg *t, const char *op, const int *ins, int nin, const evt_attrs *a, evt_dtype dt, int rank,
                  const int64_t *shape) {
  evt_graph *g = t->g;
  if (g->nnodes == g->cap) {
    g->cap = g->cap ? g->cap * 2 : 64;
    g->nodes = realloc(g->nodes, sizeof(evt_node) * (size_t)g->cap);
  }
  int id = g->nnodes++;
  evt_node *n = &g->nodes[id];
  memset(n, 0, sizeof *n);
  n->op = (evt_op)evt_op_from_name(op, strlen(op));
  EVT_ASSERT((int)n->op >= 0);
  n->attr = a ? *a : evt_attrs_default;
  n->ninputs = nin;
  for (int i = 0; i < nin; i++) n->inputs[i] = ins[i];
  n->type.dtype = dt;
  n->type.rank = rank;
  for (int i = 0; i < rank; i++) n->type.shape[i] = shape[i];
  evt_type_set_contiguous(&n->type);
  n->name = evt_graph_fresh_name(g, op);
  return id;
}

static evt_status run(tg *t, unsigned flags) { return evt_interp_run(t->g, t->v, flags, 1); }

static void check_vals(const evt_tensor *x, const double *want, int64_t n, double tol, int line) {
  if (!x->data || x->numel != n) {
    evt_test_fail(__FILE__, line, "tensor has %lld elements (data %p), want %lld", (long long)x->numel,
                  (void *)x->data, (long long)n);
    return;
  }
  for (int64_t i = 0; i < n; i++) {
    bool ok = isnan(want[i]) ? isnan(x->data[i]) : fabs(x->data[i] - want[i]) <= tol * (1 + fabs(want[i]));
    if (!ok) {
      evt_test_fail(__FILE__, line, "element %lld = %.9g, want %.9g", (long long)i, x->data[i], want[i]);
      return;
    }
  }
}
#define CHECK_VALS(x, want, n, tol) check_vals(&(x), (want), (n), (tol), __LINE__)

static evt_attrs A(void) { return evt_attrs_default; }

/* ---- elementwise ----------------------------------------------------------------------------------- */

TEST(interp_binary_broadcast) {
  tg *t = tg_new();
  int a = in_(t, EVT_F32, 2, SH(2, 3), DV(1, 2, 3, 4, 5, 6));
  int b = in_(t, EVT_F32, 1, SH(3), DV(10, 20, 30));
  int c = in_(t, EVT_F32, 2, SH(2, 1), DV(2, -1));
  int add = raw_op(t, "add", IDS(a, b), 2, NULL, EVT_F32, 2, SH(2, 3));
  int sub = raw_op(t, "sub", IDS(b, a), 2, NULL, EVT_F32, 2, SH(2, 3));
  int mul = raw_op(t, "mul", IDS(a, c), 2, NULL, EVT_F32, 2, SH(2, 3));
  int div = raw_op(t, "div", IDS(a, c), 2, NULL, EVT_F32, 2, SH(2, 3));
  int mx = raw_op(t, "maximum", IDS(a, c), 2, NULL, EVT_F32, 2, SH(2, 3));
  int mn = raw_op(t, "minimum", IDS(a, c), 2, NULL, EVT_F32, 2, SH(2, 3));
  int lt = raw_op(t, "lt", IDS(a, c), 2, NULL, EVT_BOOL, 2, SH(2, 3));
  int eq = raw_op(t, "eq", IDS(a, c), 2, NULL, EVT_BOOL, 2, SH(2, 3));
  int wh = raw_op(t, "where", IDS(lt, a, b), 3, NULL, EVT_F32, 2, SH(2, 3));
  CHECK(run(t, 0) == EVT_OK);
  CHECK_VALS(t->v[add], DV(11, 22, 33, 14, 25, 36), 6, 0);
  CHECK_VALS(t->v[sub], DV(9, 18, 27, 6, 15, 24), 6, 0);
  CHECK_VALS(t->v[mul], DV(2, 4, 6, -4, -5, -6), 6, 0);
  CHECK_VALS(t->v[div], DV(0.5, 1, 1.5, -4, -5, -6), 6, 0);
  CHECK_VALS(t->v[mx], DV(2, 2, 3, 4, 5, 6), 6, 0);
  CHECK_VALS(t->v[mn], DV(1, 2, 2, -1, -1, -1), 6, 0);
  CHECK_VALS(t->v[lt], DV(1, 0, 0, 0, 0, 0), 6, 0);
  CHECK_VALS(t->v[eq], DV(0, 1, 0, 0, 0, 0), 6, 0);
  CHECK_VALS(t->v[wh], DV(1, 20, 30, 10, 20, 30), 6, 0);
  tg_free(t);
}

TEST(interp_binary_broadcast_middle_dim) {
  /* [2,1,3] + [4,1] -> [2,4,3] */
  tg *t = tg_new();
  int a = in_(t, EVT_F32, 3, SH(2, 1, 3), DV(0, 1, 2, 100, 101, 102));
  int b = in_(t, EVT_F32, 2, SH(4, 1), DV(10, 20, 30, 40));
  int s = raw_op(t, "add", IDS(a, b), 2, NULL, EVT_F32, 3, SH(2, 4, 3));
  CHECK(run(t, 0) == EVT_OK);
  double want[24];
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 4; j++)
      for (int k = 0; k < 3; k++) want[(i * 4 + j) * 3 + k] = i * 100 + k + (j + 1) * 10;
  CHECK_VALS(t->v[s], want, 24, 0);
  tg_free(t);
}

TEST(interp_unary_values) {
  tg *t = tg_new();
  int x = in_(t, EVT_F32, 1, SH(4), DV(-2, -0.5, 0, 1));
  int p = in_(t, EVT_F32, 1, SH(3), DV(1, 4, 9));
  evt_attrs tanh_a = A();
  tanh_a.approximate = EVT_APPROXIMATE_TANH;
  evt_attrs pw = A();
  pw.value = 1.5;
  int relu = raw_op(t, "relu", IDS(x), 1, NULL, EVT_F32, 1, SH(4));
  int sgn = raw_op(t, "sign", IDS(x), 1, NULL, EVT_F32, 1, SH(4));
  int ab = raw_op(t, "abs", IDS(x), 1, NULL, EVT_F32, 1, SH(4));
  int neg = raw_op(t, "neg", IDS(x), 1, NULL, EVT_F32, 1, SH(4));
  int sig = raw_op(t, "sigmoid", IDS(x), 1, NULL, EVT_F32, 1, SH(4));
  int ge = raw_op(t, "gelu", IDS(x), 1, NULL, EVT_F32, 1, SH(4));
  int gt = raw_op(t, "gelu", IDS(x), 1, &tanh_a, EVT_F32, 1, SH(4));
  int sq = raw_op(t, "sqrt", IDS(p), 1, NULL, EVT_F32, 1, SH(3));
  int rs = raw_op(t, "rsqrt", IDS(p), 1, NULL, EVT_F32, 1, SH(3));
  int rc = raw_op(t, "reciprocal", IDS(p), 1, NULL, EVT_F32, 1, SH(3));
  int po = raw_op(t, "pow", IDS(p), 1, &pw, EVT_F32, 1, SH(3));
  int lg = raw_op(t, "log", IDS(p), 1, NULL, EVT_F32, 1, SH(3));
  CHECK(run(t, EVT_RUN_FP64) == EVT_OK);
  CHECK_VALS(t->v[relu], DV(0, 0, 0, 1), 4, 0);
  CHECK_VALS(t->v[sgn], DV(-1, -1, 0, 1), 4, 0);
  CHECK_VALS(t->v[ab], DV(2, 0.5, 0, 1), 4, 0);
  CHECK_VALS(t->v[neg], DV(2, 0.5, 0, -1), 4, 0);
  CHECK_VALS(t->v[sig], DV(0.11920292202211755, 0.3775406687981454, 0.5, 0.7310585786300049), 4, 1e-15);
  /* torch.nn.functional.gelu(torch.tensor([-2., -.5, 0, 1], dtype=torch.float64)) */
  CHECK_VALS(t->v[ge], DV(-0.04550026389635842, -0.15426876936299344, 0, 0.8413447460685429), 4, 1e-15);
  CHECK_VALS(t->v[gt], DV(-0.04540230591222494, -0.15428599017485606, 0, 0.8411919906082768), 4, 1e-14);
  CHECK_VALS(t->v[sq], DV(1, 2, 3), 3, 0);
  CHECK_VALS(t->v[rs], DV(1, 0.5, 1.0 / 3), 3, 1e-16);
  CHECK_VALS(t->v[rc], DV(1, 0.25, 1.0 / 9), 3, 1e-16);
  CHECK_VALS(t->v[po], DV(1, 8, 27), 3, 1e-15);
  CHECK_VALS(t->v[lg], DV(0, log(4.0), log(9.0)), 3, 1e-16);
  tg_free(t);
}

TEST(interp_nan_propagates) {
  tg *t = tg_new();
  int x = in_(t, EVT_F32, 1, SH(3), DV(NAN, 1, -1));
  int y = in_(t, EVT_F32, 1, SH(3), DV(0, NAN, 2));
  int relu = raw_op(t, "relu", IDS(x), 1, NULL, EVT_F32, 1, SH(3));
  int mx = raw_op(t, "maximum", IDS(x, y), 2, NULL, EVT_F32, 1, SH(3));
  int ne = raw_op(t, "ne", IDS(x, y), 2, NULL, EVT_BOOL, 1, SH(3));
  int am = raw_op(t, "amax", IDS(x), 1, NULL, EVT_F32, 0, NULL);
  int sm = raw_op(t, "softmax", IDS(x), 1, NULL, EVT_F32, 1, SH(3));
  CHECK(run(t, 0) == EVT_OK);
  CHECK_VALS(t->v[relu], DV(NAN, 1, 0), 3, 0);
  CHECK_VALS(t->v[mx], DV(NAN, NAN, 2), 3, 0);
  CHECK_VALS(t->v[ne], DV(1, 1, 1), 3, 0);
  CHECK(isnan(t->v[am].data[0]));
  CHECK_VALS(t->v[sm], DV(NAN, NAN, NAN), 3, 0);
  tg_free(t);
}

TEST(interp_elementwise_backward_helpers) {
  tg *t = tg_new();
  int dy = in_(t, EVT_F32, 1, SH(4), DV(1, 2, 3, 4));
  int y = in_(t, EVT_F32, 1, SH(4), DV(-1, 0, 0.5, 2));
  int tb = raw_op(t, "threshold_backward", IDS(dy, y), 2, NULL, EVT_F32, 1, SH(4));
  int gb = raw_op(t, "gelu_backward", IDS(dy, y), 2, NULL, EVT_F32, 1, SH(4));
  evt_attrs ta = A();
  ta.approximate = EVT_APPROXIMATE_TANH;
  int gbt = raw_op(t, "gelu_backward", IDS(dy, y), 2, &ta, EVT_F32, 1, SH(4));
  CHECK(run(t, EVT_RUN_FP64) == EVT_OK);
  CHECK_VALS(t->v[tb], DV(0, 0, 3, 4), 4, 0);
  /* central differences of gelu */
  for (int i = 0; i < 4; i++) {
    double xv = t->v[y].data[i], h = 1e-6;
    double e = (0.5 * (xv + h) * (1 + erf((xv + h) / sqrt(2))) - 0.5 * (xv - h) * (1 + erf((xv - h) / sqrt(2)))) / (2 * h);
    CHECK_NEAR(t->v[gb].data[i], t->v[dy].data[i] * e, 1e-8);
    double k = sqrt(2 / M_PI);
#define GT(z) (0.5 * (z) * (1 + tanh(k * ((z) + 0.044715 * (z) * (z) * (z)))))
    double et = (GT(xv + h) - GT(xv - h)) / (2 * h);
#undef GT
    CHECK_NEAR(t->v[gbt].data[i], t->v[dy].data[i] * et, 1e-8);
  }
  tg_free(t);
}

TEST(interp_cast_and_bf16_rounding) {
  tg *t = tg_new();
  int x = in_(t, EVT_F32, 1, SH(4), DV(2.7, -2.7, 1.0 + 0x1p-8, 1.0 + 0x1p-8 + 0x1p-20));
  evt_attrs ci = A();
  ci.dtype = EVT_I64;
  int ti = raw_op(t, "cast", IDS(x), 1, &ci, EVT_I64, 1, SH(4));
  int tb = raw_op(t, "add", IDS(x, x), 2, NULL, EVT_BF16, 1, SH(4)); /* add computed in double, stored bf16 */
  int tb2 = raw_op(t, "neg", IDS(x), 1, NULL, EVT_BF16, 1, SH(4));
  CHECK(run(t, 0) == EVT_OK);
  CHECK_VALS(t->v[ti], DV(2, -2, 1, 1), 4, 0);
  CHECK(t->v[tb].data[0] == (double)evt_round_bf16(5.4f));
  CHECK(t->v[tb2].data[2] == -1.0);             /* tie to even */
  CHECK(t->v[tb2].data[3] == -(1.0 + 0x1p-7));  /* above the tie */
  /* with EVT_RUN_FP64 floats keep double values */
  CHECK(run(t, EVT_RUN_FP64) == EVT_OK);
  CHECK(t->v[tb2].data[2] == -(1.0 + 0x1p-8));
  CHECK(t->v[ti].data[0] == 2); /* ints stay exact */
  tg_free(t);
}

TEST(interp_f32_rounding_vs_fp64) {
  tg *t = tg_new();
  int x = in_(t, EVT_F32, 1, SH(1), DV(1));
  int y = in_(t, EVT_F32, 1, SH(1), DV(3));
  int d = raw_op(t, "div", IDS(x, y), 2, NULL, EVT_F32, 1, SH(1));
  CHECK(run(t, 0) == EVT_OK);
  CHECK(t->v[d].data[0] == (double)(1.0f / 3.0f));
  CHECK(run(t, EVT_RUN_FP64) == EVT_OK);
  CHECK(t->v[d].data[0] == 1.0 / 3.0);
  tg_free(t);
}

/* ---- reductions ------------------------------------------------------------------------------------ */

TEST(interp_reductions) {
  tg *t = tg_new();
  int x = in_(t, EVT_F32, 3, SH(2, 2, 3), DV(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, -12));
  evt_attrs d1 = A();
  d1.dims = (evt_ilist){1, {-2}};
  d1.keepdim = 1;
  evt_attrs d02 = A();
  d02.dims = (evt_ilist){2, {0, 2}};
  int s = raw_op(t, "sum", IDS(x), 1, &d1, EVT_F32, 3, SH(2, 1, 3));
  int m = raw_op(t, "mean", IDS(x), 1, &d02, EVT_F32, 1, SH(2));
  int ma = raw_op(t, "amax", IDS(x), 1, &d02, EVT_F32, 1, SH(2));
  int all = raw_op(t, "sum", IDS(x), 1, NULL, EVT_F32, 0, NULL);
  CHECK(run(t, 0) == EVT_OK);
  CHECK_VALS(t->v[s], DV(5, 7, 9, 17, 19, -3), 6, 0);
  CHECK_VALS(t->v[m], DV((1 + 2 + 3 + 7 + 8 + 9) / 6.0, (4 + 5 + 6 + 10 + 11 - 12) / 6.0), 2, 1e-7);
  CHECK_VALS(t->v[ma], DV(9, 11), 2, 0);
  CHECK_VALS(t->v[all], DV(54), 1, 0);
  tg_free(t);
}

/* ---- matrix products ------------------------------------------------------------------------------- */

TEST(interp_mm_bmm_addmm) {
  tg *t = tg_new();
  int a = in_(t, EVT_F32, 2, SH(2, 3), DV(1, 2, 3, 4, 5, 6));
  int b = in_(t, EVT_F32, 2, SH(3, 2), DV(7, 8, 9, 10, 11, 12));
  int c = in_(t, EVT_F32, 1, SH(2), DV(100, 200));
  int mm = raw_op(t, "mm", IDS(a, b), 2, NULL, EVT_F32, 2, SH(2, 2));
  int am = raw_op(t, "addmm", IDS(c, a, b), 3, NULL, EVT_F32, 2, SH(2, 2));
  int ba = in_(t, EVT_F32, 3, SH(2, 2, 2), DV(1, 0, 0, 1, 2, 0, 0, 2));
  int bb = in_(t, EVT_F32, 3, SH(2, 2, 1), DV(1, 2, 3, 4));
  int bm = raw_op(t, "bmm", IDS(ba, bb), 2, NULL, EVT_F32, 3, SH(2, 2, 1));
  int bb1 = in_(t, EVT_F32, 2, SH(2, 1), DV(5, 6)); /* broadcast batch */
  int bm1 = raw_op(t, "bmm", IDS(ba, bb1), 2, NULL, EVT_F32, 3, SH(2, 2, 1));
  CHECK(run(t, 0) == EVT_OK);
  CHECK_VALS(t->v[mm], DV(58, 64, 139, 154), 4, 0);
  CHECK_VALS(t->v[am], DV(158, 264, 239, 354), 4, 0);
  CHECK_VALS(t->v[bm], DV(1, 2, 6, 8), 4, 0);
  CHECK_VALS(t->v[bm1], DV(5, 6, 10, 12), 4, 0);
  tg_free(t);
}

TEST(interp_spmm_and_transpose) {
  /* A = [[1, 0, 2], [0, 0, 0], [0, 3, 0]] in CSR; x = [[1,2],[3,4],[5,6]] */
  tg *t = tg_new();
  int rp = in_(t, EVT_I64, 1, SH(4), DV(0, 2, 2, 3));
  int col = in_(t, EVT_I64, 1, SH(3), DV(0, 2, 1));
  int val = in_(t, EVT_F32, 1, SH(3), DV(1, 2, 3));
  int x = in_(t, EVT_F32, 2, SH(3, 2), DV(1, 2, 3, 4, 5, 6));
  int y = raw_op(t, "spmm", IDS(rp, col, val, x), 4, NULL, EVT_F32, 2, SH(3, 2));
  evt_attrs sa = A();
  sa.shape = (evt_ilist){2, {3, 2}};
  int yt = raw_op(t, "spmm_t", IDS(rp, col, val, x), 4, &sa, EVT_F32, 2, SH(3, 2));
  CHECK(run(t, 0) == EVT_OK);
  CHECK_VALS(t->v[y], DV(11, 14, 0, 0, 9, 12), 6, 0);
  /* A^T x = [[1,2],[15,18],[2,4]] */
  CHECK_VALS(t->v[yt], DV(1, 2, 15, 18, 2, 4), 6, 0);
  /* a row pointer that goes down is a user error naming the node */
  t->v[rp].data[2] = 1;
  CHECK(run(t, 0) == EVT_ERR_INVALID);
  CHECK(strstr(evt_graph_error(t->g), "monotone") != NULL);
  CHECK(strstr(evt_graph_error(t->g), "spmm") != NULL);
  t->v[rp].data[2] = 2;
  t->v[col].data[1] = 3; /* column out of range */
  CHECK(run(t, 0) == EVT_ERR_INVALID);
  CHECK(strstr(evt_graph_error(t->g), "column") != NULL);
  tg_free(t);
}

/* sdpa: the backward ops match central differences of L = sum(dout * sdpa(q, k, v)). */
/* sdpa's gradients gq/gk/gv (of q, k, v: 12 elements each) against central differences of sum(dd * out). */
static void check_sdpa_grads(tg *t, const int which[3], const int grads[3], int out, const double *dd) {
  for (int w = 0; w < 3; w++)
    for (int i = 0; i < 12; i++) {
      double save = t->v[which[w]].data[i], h = 1e-6, lp = 0, lm = 0;
      t->v[which[w]].data[i] = save + h;
      CHECK(run(t, EVT_RUN_FP64) == EVT_OK);
      for (int j = 0; j < 12; j++) lp += dd[j] * t->v[out].data[j];
      t->v[which[w]].data[i] = save - h;
      CHECK(run(t, EVT_RUN_FP64) == EVT_OK);
      for (int j = 0; j < 12; j++) lm += dd[j] * t->v[out].data[j];
      t->v[which[w]].data[i] = save;
      CHECK(run(t, EVT_RUN_FP64) == EVT_OK);
      CHECK_NEAR(t->v[grads[w]].data[i], (lp - lm) / (2 * h), 1e-7);
    }
}

TEST(interp_sdpa_gradients_match_finite_differences) {
  for (int causal = 0; causal < 2; causal++) {
    tg *t = tg_new();
    const int64_t *s = SH(1, 2, 3, 2);
    double qd[12], kd[12], vd[12], dd[12];
    for (int i = 0; i < 12; i++) {
      qd[i] = sin(i * 1.3);
      kd[i] = cos(i * 0.7);
      vd[i] = sin(i * 0.4 + 1);
      dd[i] = cos(i * 2.1);
    }
    int q = in_(t, EVT_F32, 4, s, qd), k = in_(t, EVT_F32, 4, s, kd), v = in_(t, EVT_F32, 4, s, vd);
    int d = in_(t, EVT_F32, 4, s, dd);
    evt_attrs a = A();
    a.causal = causal;
    int o = raw_op(t, "sdpa", IDS(q, k, v), 3, &a, EVT_F32, 4, s);
    int gq = raw_op(t, "sdpa_backward_q", IDS(d, q, k, v), 4, &a, EVT_F32, 4, s);
    int gk = raw_op(t, "sdpa_backward_k", IDS(d, q, k, v), 4, &a, EVT_F32, 4, s);
    int gv = raw_op(t, "sdpa_backward_v", IDS(d, q, k, v), 4, &a, EVT_F32, 4, s);
    CHECK(run(t, EVT_RUN_FP64) == EVT_OK);
    if (causal) /* query 0 sees only key 0 */
      CHECK(fabs(t->v[o].data[0] - vd[0]) < 1e-15 && fabs(t->v[o].data[1] - vd[1]) < 1e-15);
    check_sdpa_grads(t, IDS(q, k, v), IDS(gq, gk, gv), o, dd);
    tg_free(t);
  }
}

/* Direct reference of masked attention on [1,H,S,S] inputs with head dim D: add[(h*S+i)*S+j] is added to the
 * scaled score (-inf drops the key); a row with every key dropped gives 0, as PyTorch. */
static void ref_sdpa(const double *q, const double *k, const double *v, const double *add, int H, int S, int D,
                     double *out) {
  for (int h = 0; h < H; h++)
    for (int i = 0; i < S; i++) {
      double s[8], m = -INFINITY, sum = 0;
      for (int j = 0; j < S; j++) {
        s[j] = add[(h * S + i) * S + j];
        for (int d = 0; d < D; d++) s[j] += q[(h * S + i) * D + d] * k[(h * S + j) * D + d] / sqrt((double)D);
        if (s[j] > m) m = s[j];
      }
      for (int j = 0; j < S; j++) sum += s[j] = m == -INFINITY ? 0 : exp(s[j] - m);
      for (int d = 0; d < D; d++) {
        double o = 0;
        for (int j = 0; j < S; j++) o += sum > 0 ? s[j] / sum * v[(h * S + j) * D + d] : 0;
        out[(h * S + i) * D + d] = o;
      }
    }
}

/* sdpa with a float mask broadcast over heads, a bool mask over keys (rank 1) and a bool mask over rows
 * (one row fully dropped: output and gradients 0, no NaN), against the direct reference. */
TEST(interp_sdpa_mask_matches_reference) {
  const int64_t *s = SH(1, 2, 3, 2);
  double qd[12], kd[12], vd[12], fm[9], add[3][18], want[12];
  for (int i = 0; i < 12; i++) qd[i] = sin(i * 1.3), kd[i] = cos(i * 0.7), vd[i] = sin(i * 0.4 + 1);
  for (int i = 0; i < 9; i++) fm[i] = 0.5 * sin(i * 0.9);
  fm[2] = -INFINITY;
  const double keys[3] = {1, 0, 1}, rows[6] = {1, 0, 1, 1, 1, 1};
  for (int h = 0; h < 2; h++)
    for (int i = 0; i < 3; i++)
      for (int j = 0; j < 3; j++) {
        add[0][(h * 3 + i) * 3 + j] = fm[i * 3 + j];
        add[1][(h * 3 + i) * 3 + j] = keys[j] ? 0 : -INFINITY;
        add[2][(h * 3 + i) * 3 + j] = rows[h * 3 + i] ? 0 : -INFINITY;
      }
  for (int c = 0; c < 3; c++) {
    tg *t = tg_new();
    int q = in_(t, EVT_F32, 4, s, qd), k = in_(t, EVT_F32, 4, s, kd), v = in_(t, EVT_F32, 4, s, vd);
    int m = c == 0 ? in_(t, EVT_F32, 4, SH(1, 1, 3, 3), fm)
          : c == 1 ? in_(t, EVT_BOOL, 1, SH(3), keys) : in_(t, EVT_BOOL, 4, SH(1, 2, 3, 1), rows);
    int o = raw_op(t, "sdpa", IDS(q, k, v, m), 4, NULL, EVT_F32, 4, s);
    int gq = raw_op(t, "sdpa_backward_q", IDS(o, q, k, v, m), 5, NULL, EVT_F32, 4, s);
    int gk = raw_op(t, "sdpa_backward_k", IDS(o, q, k, v, m), 5, NULL, EVT_F32, 4, s);
    CHECK(run(t, EVT_RUN_FP64) == EVT_OK);
    ref_sdpa(qd, kd, vd, add[c], 2, 3, 2, want);
    CHECK_VALS(t->v[o], want, 12, 1e-12);
    for (int i = 0; i < 12; i++) CHECK(isfinite(t->v[gq].data[i]) && isfinite(t->v[gk].data[i]));
    if (c == 2) /* head 0, query 1 dropped every key */
      CHECK(t->v[o].data[2] == 0 && t->v[o].data[3] == 0 && t->v[gq].data[2] == 0 && t->v[gq].data[3] == 0);
    tg_free(t);
  }
}

/* Masked sdpa's backward ops match central differences of L = sum(dout * sdpa(q, k, v, mask)), with and
 * without causal: a float mask [1,1,3,3] and a bool mask [1,3] dropping key 0 (with causal, query 0 then has
 * no key: output and gradients 0). */
TEST(interp_sdpa_mask_gradients_match_finite_differences) {
  for (int c = 0; c < 4; c++) {
    tg *t = tg_new();
    const int64_t *s = SH(1, 2, 3, 2);
    double qd[12], kd[12], vd[12], dd[12], fm[9];
    for (int i = 0; i < 12; i++) qd[i] = sin(i * 1.3), kd[i] = cos(i * 0.7), vd[i] = sin(i * 0.4 + 1), dd[i] = cos(i * 2.1);
    for (int i = 0; i < 9; i++) fm[i] = 0.7 * cos(i * 1.1);
    int q = in_(t, EVT_F32, 4, s, qd), k = in_(t, EVT_F32, 4, s, kd), v = in_(t, EVT_F32, 4, s, vd);
    int d = in_(t, EVT_F32, 4, s, dd);
    int m = c % 2 == 0 ? in_(t, EVT_F32, 4, SH(1, 1, 3, 3), fm) : in_(t, EVT_BOOL, 2, SH(1, 3), DV(0, 1, 1));
    evt_attrs a = A();
    a.causal = c / 2;
    int o = raw_op(t, "sdpa", IDS(q, k, v, m), 4, &a, EVT_F32, 4, s);
    int gq = raw_op(t, "sdpa_backward_q", IDS(d, q, k, v, m), 5, &a, EVT_F32, 4, s);
    int gk = raw_op(t, "sdpa_backward_k", IDS(d, q, k, v, m), 5, &a, EVT_F32, 4, s);
    int gv = raw_op(t, "sdpa_backward_v", IDS(d, q, k, v, m), 5, &a, EVT_F32, 4, s);
    CHECK(run(t, EVT_RUN_FP64) == EVT_OK);
    if (c == 3) CHECK(t->v[o].data[0] == 0 && t->v[o].data[1] == 0);
    check_sdpa_grads(t, IDS(q, k, v), IDS(gq, gk, gv), o, dd);
    tg_free(t);
  }
}

/* ---- convolution and pooling ----------------------------------------------------------------------- */

TEST(interp_conv2d_hand) {
  /* x = 1..9 as 3x3, w = [[1,0],[0,-1]]: y[i,j] = x[i,j] - x[i+1,j+1] = -4 everywhere (2x2) */
  tg *t = tg_new();
  int x = in_(t, EVT_F32, 4, SH(1, 1, 3, 3), DV(1, 2, 3, 4, 5, 6, 7, 8, 9));
  int w = in_(t, EVT_F32, 4, SH(1, 1, 2, 2), DV(1, 0, 0, -1));
  int y = raw_op(t, "conv2d", IDS(x, w), 2, NULL, EVT_F32, 4, SH(1, 1, 2, 2));
  evt_attrs pa = A();
  pa.padding = (evt_ilist){2, {1, 1}};
  pa.stride = (evt_ilist){2, {2, 2}};
  /* padded by 1, stride 2: outputs at (-1,-1), (-1,1), (1,-1), (1,1) */
  int yp = raw_op(t, "conv2d", IDS(x, w), 2, &pa, EVT_F32, 4, SH(1, 1, 2, 2));
  CHECK(run(t, 0) == EVT_OK);
  CHECK_VALS(t->v[y], DV(-4, -4, -4, -4), 4, 0);
  CHECK_VALS(t->v[yp], DV(-1, -3, -7, 5 - 9), 4, 0);
  tg_free(t);
}

/* <conv(x, w), dy> = <x, conv_bwd_input(dy, w)> = <w, conv_bwd_weight(x, dy)> with stride, padding,
 * dilation and groups. */
TEST(interp_conv2d_backward_adjoint) {
  tg *t = tg_new();
  const int64_t *xs = SH(2, 4, 6, 5), *ws = SH(6, 2, 3, 2);
  double xd[240], wd[72], dyd[108];
  for (int i = 0; i < 240; i++) xd[i] = sin(i * 0.37);
  for (int i = 0; i < 72; i++) wd[i] = cos(i * 0.91);
  for (int i = 0; i < 108; i++) dyd[i] = sin(i * 1.7 + 0.3);
  int x = in_(t, EVT_F32, 4, xs, xd), w = in_(t, EVT_F32, 4, ws, wd);
  evt_attrs a = A();
  a.stride = (evt_ilist){2, {2, 2}};
  a.padding = (evt_ilist){2, {1, 1}};
  a.dilation = (evt_ilist){2, {2, 1}};
  a.groups = 2;
  /* Ho = (6 + 2 - 2*2 - 1)/2 + 1 = 2, Wo = (5 + 2 - 1 - 1)/2 + 1 = 3 */
  const int64_t *ys2 = SH(2, 6, 2, 3);
  int y = raw_op(t, "conv2d", IDS(x, w), 2, &a, EVT_F32, 4, ys2);
  int dyi = in_(t, EVT_F32, 4, ys2, dyd);
  evt_attrs bi = a;
  bi.shape = (evt_ilist){4, {2, 4, 6, 5}};
  int dx = raw_op(t, "conv2d_backward_input", IDS(dyi, w), 2, &bi, EVT_F32, 4, xs);
  evt_attrs bw = a;
  bw.shape = (evt_ilist){4, {6, 2, 3, 2}};
  int dw = raw_op(t, "conv2d_backward_weight", IDS(x, dyi), 2, &bw, EVT_F32, 4, ws);
  CHECK(run(t, EVT_RUN_FP64) == EVT_OK);
  double l0 = 0, l1 = 0, l2 = 0;
  for (int i = 0; i < 72; i++) l0 += t->v[y].data[i] * dyd[i];
  for (int i = 0; i < 240; i++) l1 += xd[i] * t->v[dx].data[i];
  for (int i = 0; i < 72; i++) l2 += wd[i] * t->v[dw].data[i];
  CHECK(fabs(l0) > 0.1);
  CHECK_NEAR(l1, l0, 1e-12);
  CHECK_NEAR(l2, l0, 1e-12);
  /* one output by hand: y[0, 3, 0, 0] (group 1: channels 2,3), window rows -1,1,3 (dilation 2), cols -1,0 */
  double e = 0;
  for (int c = 0; c < 2; c++)
    for (int ki = 0; ki < 3; ki++)
      for (int kj = 0; kj < 2; kj++) {
        int ih = -1 + 2 * ki, iw = -1 + kj;
        if (ih < 0 || iw < 0) continue;
        e += wd[((3 * 2 + c) * 3 + ki) * 2 + kj] * xd[((0 * 4 + 2 + c) * 6 + ih) * 5 + iw];
      }
  CHECK_NEAR(t->v[y].data[3 * 6], e, 1e-14);
  tg_free(t);
}

/* Products large enough for the BLAS path (gemm.c, conv.c: >= EVT_INTERP_BLAS_MIN multiply-adds) against
 * the plain sums, in fp64: the same dot products in another order, so equal to rounding (1e-12 relative);
 * a batch of transposes (misc.c's tiled path) exactly. */
TEST(interp_blas_products_match_plain_sums) {
  tg *t = tg_new();
  enum { M = 64, K = 48, N = 40 };
  double *a = malloc(sizeof(double) * M * K), *b = malloc(sizeof(double) * K * N);
  for (int i = 0; i < M * K; i++) a[i] = sin(i * 0.37);
  for (int i = 0; i < K * N; i++) b[i] = cos(i * 0.11);
  int ia = in_(t, EVT_F32, 2, SH(M, K), a), ib = in_(t, EVT_F32, 2, SH(K, N), b);
  int mm = raw_op(t, "mm", IDS(ia, ib), 2, NULL, EVT_F32, 2, SH(M, N));
  evt_attrs pa = A();
  pa.dims = (evt_ilist){2, {1, 0}};
  int tr = raw_op(t, "permute", IDS(ia), 1, &pa, EVT_F32, 2, SH(K, M));
  /* conv: x [2,8,20,18], w [12,4,3,3], groups 2, stride 2x1, padding 1, dilation 1x2: Ho 10, Wo 16, and a
   * product of 6 x 160 x 36 = 34560 multiply-adds per image and group */
  enum { CN = 2, CC = 8, CH = 20, CW = 18, CO = 12, CG = 4, KH = 3, KW = 3, HO = 10, WO = 16, GR = 2 };
  double *xd = malloc(sizeof(double) * CN * CC * CH * CW), *wd = malloc(sizeof(double) * CO * CG * KH * KW);
  double *dyd = malloc(sizeof(double) * CN * CO * HO * WO);
  for (int i = 0; i < CN * CC * CH * CW; i++) xd[i] = sin(i * 0.13 + 0.5);
  for (int i = 0; i < CO * CG * KH * KW; i++) wd[i] = cos(i * 0.71);
  for (int i = 0; i < CN * CO * HO * WO; i++) dyd[i] = sin(i * 1.3);
  int x = in_(t, EVT_F32, 4, SH(CN, CC, CH, CW), xd), w = in_(t, EVT_F32, 4, SH(CO, CG, KH, KW), wd);
  int dy = in_(t, EVT_F32, 4, SH(CN, CO, HO, WO), dyd);
  evt_attrs ca = A();
  ca.stride = (evt_ilist){2, {2, 1}};
  ca.padding = (evt_ilist){2, {1, 1}};
  ca.dilation = (evt_ilist){2, {1, 2}};
  ca.groups = GR;
  int y = raw_op(t, "conv2d", IDS(x, w), 2, &ca, EVT_F32, 4, SH(CN, CO, HO, WO));
  evt_attrs bi = ca, bw = ca;
  bi.shape = (evt_ilist){4, {CN, CC, CH, CW}};
  bw.shape = (evt_ilist){4, {CO, CG, KH, KW}};
  int dx = raw_op(t, "conv2d_backward_input", IDS(dy, w), 2, &bi, EVT_F32, 4, SH(CN, CC, CH, CW));
  int dw = raw_op(t, "conv2d_backward_weight", IDS(x, dy), 2, &bw, EVT_F32, 4, SH(CO, CG, KH, KW));
  CHECK(run(t, EVT_RUN_FP64) == EVT_OK);
  double worst = 0;
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      double s = 0;
      for (int k = 0; k < K; k++) s += a[i * K + k] * b[k * N + j];
      worst = fmax(worst, fabs(t->v[mm].data[i * N + j] - s) / (1 + fabs(s)));
      CHECK(t->v[tr].data[(j % K) * M + i] == a[i * K + j % K]);
    }
  double *ey = calloc(CN * CO * HO * WO, sizeof(double)), *ex = calloc(CN * CC * CH * CW, sizeof(double));
  double *ew = calloc(CO * CG * KH * KW, sizeof(double));
  for (int n = 0; n < CN; n++)
    for (int o = 0; o < CO; o++)
      for (int c = 0; c < CG; c++)
        for (int ki = 0; ki < KH; ki++)
          for (int kj = 0; kj < KW; kj++)
            for (int oh = 0; oh < HO; oh++)
              for (int ow = 0; ow < WO; ow++) {
                int ih = oh * 2 - 1 + ki, iw = ow - 1 + kj * 2, ci = o / (CO / GR) * CG + c;
                if (ih < 0 || ih >= CH || iw < 0 || iw >= CW) continue;
                int yi = ((n * CO + o) * HO + oh) * WO + ow, xi = ((n * CC + ci) * CH + ih) * CW + iw;
                int wi = ((o * CG + c) * KH + ki) * KW + kj;
                ey[yi] += wd[wi] * xd[xi], ex[xi] += dyd[yi] * wd[wi], ew[wi] += dyd[yi] * xd[xi];
              }
  for (int i = 0; i < CN * CO * HO * WO; i++) worst = fmax(worst, fabs(t->v[y].data[i] - ey[i]) / (1 + fabs(ey[i])));
  for (int i = 0; i < CN * CC * CH * CW; i++) worst = fmax(worst, fabs(t->v[dx].data[i] - ex[i]) / (1 + fabs(ex[i])));
  for (int i = 0; i < CO * CG * KH * KW; i++) worst = fmax(worst, fabs(t->v[dw].data[i] - ew[i]) / (1 + fabs(ew[i])));
  CHECK_MSG(worst <= 1e-12, "largest relative difference %g", worst);
  free(a); free(b); free(xd); free(wd); free(dyd); free(ey); free(ex); free(ew);
  tg_free(t);
}

TEST(interp_pools) {
  tg *t = tg_new();
  /* 4x4 plane with a tie in the first window */
  int x = in_(t, EVT_F32, 4, SH(1, 1, 4, 4), DV(1, 5, 2, 0, 5, 3, 1, 1, 0, 0, 9, 9, -1, 2, 9, 9));
  evt_attrs k2 = A();
  k2.kernel = (evt_ilist){2, {2, 2}};
  k2.stride = (evt_ilist){2, {2, 2}};
  int mp = raw_op(t, "max_pool2d", IDS(x), 1, &k2, EVT_F32, 4, SH(1, 1, 2, 2));
  int dy = in_(t, EVT_F32, 4, SH(1, 1, 2, 2), DV(10, 20, 30, 40));
  int mpb = raw_op(t, "max_pool2d_backward", IDS(dy, x), 2, &k2, EVT_F32, 4, SH(1, 1, 4, 4));
  evt_attrs ap = A();
  ap.kernel = (evt_ilist){2, {3, 3}};
  ap.stride = (evt_ilist){2, {2, 2}};
  ap.padding = (evt_ilist){2, {1, 1}};
  int av = raw_op(t, "avg_pool2d", IDS(x), 1, &ap, EVT_F32, 4, SH(1, 1, 2, 2));
  evt_attrs apb = ap;
  apb.shape = (evt_ilist){4, {1, 1, 4, 4}};
  int avb = raw_op(t, "avg_pool2d_backward", IDS(dy), 1, &apb, EVT_F32, 4, SH(1, 1, 4, 4));
  CHECK(run(t, 0) == EVT_OK);
  CHECK_VALS(t->v[mp], DV(5, 2, 2, 9), 4, 0);
  /* ties: the first 5 (row 0, col 1) gets 10; the first 9 (row 2, col 2) gets 40 */
  CHECK_VALS(t->v[mpb], DV(0, 10, 20, 0, 0, 0, 0, 0, 0, 0, 40, 0, 0, 30, 0, 0), 16, 0);
  /* avg with pad 1, divisor 9: window 0 covers rows/cols 0..1 */
  CHECK_VALS(t->v[av], DV(14 / 9.0, 12 / 9.0, 9 / 9.0, 43 / 9.0), 4, 1e-7);
  /* dx[1,1] lies in all four windows */
  CHECK_NEAR(t->v[avb].data[5], (10 + 20 + 30 + 40) / 9.0, 1e-6);
  CHECK_NEAR(t->v[avb].data[0], 10 / 9.0, 1e-6);
  tg_free(t);
}

TEST(interp_adaptive_max_pool) {
  /* H = 5 -> 3: windows [0,2), [1,4), [3,5); W = 1 -> 1 */
  tg *t = tg_new();
  int x = in_(t, EVT_F32, 3, SH(1, 5, 1), DV(3, 1, 4, 1, 5));
  evt_attrs a = A();
  a.shape = (evt_ilist){2, {3, 1}};
  int y = raw_op(t, "adaptive_max_pool2d", IDS(x), 1, &a, EVT_F32, 3, SH(1, 3, 1));
  int dy = in_(t, EVT_F32, 3, SH(1, 3, 1), DV(1, 2, 3));
  int dx = raw_op(t, "adaptive_max_pool2d_backward", IDS(dy, x), 2, &a, EVT_F32, 3, SH(1, 5, 1));
  CHECK(run(t, 0) == EVT_OK);
  CHECK_VALS(t->v[y], DV(3, 4, 5), 3, 0);
  CHECK_VALS(t->v[dx], DV(1, 0, 2, 0, 3), 5, 0);
  tg_free(t);
}

/* ---- row ops and norms ----------------------------------------------------------------------------- */

TEST(interp_softmax_family) {
  tg *t = tg_new();
  int x = in_(t, EVT_F32, 2, SH(3, 2), DV(0, 1000, log(2.0), 0, log(3.0), 0)); /* softmax over dim 0 */
  evt_attrs d0 = A();
  d0.dim = 0;
  int sm = raw_op(t, "softmax", IDS(x), 1, &d0, EVT_F32, 2, SH(3, 2));
  int ls = raw_op(t, "log_softmax", IDS(x), 1, &d0, EVT_F32, 2, SH(3, 2));
  int dy = in_(t, EVT_F32, 2, SH(3, 2), DV(1, 0, 2, 0, 3, 1));
  int smb = raw_op(t, "softmax_backward", IDS(dy, sm), 2, &d0, EVT_F32, 2, SH(3, 2));
  int lsb = raw_op(t, "log_softmax_backward", IDS(dy, ls), 2, &d0, EVT_F32, 2, SH(3, 2));
  CHECK(run(t, EVT_RUN_FP64) == EVT_OK);
  CHECK_VALS(t->v[sm], DV(1 / 6.0, 1, 2 / 6.0, 0, 3 / 6.0, 0), 6, 1e-15);
  CHECK_VALS(t->v[ls], DV(-log(6.0), 0, log(2 / 6.0), -1000, log(0.5), -1000), 6, 1e-15);
  /* column 0: y = [1,2,3]/6, dy = [1,2,3], sum(dy*y) = 14/6 */
  double s = 14 / 6.0;
  CHECK_VALS(t->v[smb], DV((1 - s) / 6, 0, 2 * (2 - s) / 6, 0, 3 * (3 - s) / 6, 0), 6, 1e-15);
  CHECK_VALS(t->v[lsb], DV(1 - 6 / 6.0, 0 - 1, 2 - 2 * 6 / 6.0, 0, 3 - 3 * 6 / 6.0, 1), 6, 1e-15);
  tg_free(t);
}

TEST(interp_layer_and_batch_norm) {
  tg *t = tg_new();
  int x = in_(t, EVT_F32, 2, SH(2, 3), DV(1, 2, 3, 2, 2, 8));
  int w = in_(t, EVT_F32, 1, SH(3), DV(1, 2, 3));
  int b = in_(t, EVT_F32, 1, SH(3), DV(0, 1, 0));
  evt_attrs e0 = A();
  e0.eps = 0;
  int ln = raw_op(t, "layer_norm", IDS(x, w, b), 3, &e0, EVT_F32, 2, SH(2, 3));
  int bn = raw_op(t, "batch_norm", IDS(x), 1, &e0, EVT_F32, 2, SH(2, 3));
  CHECK(run(t, EVT_RUN_FP64) == EVT_OK);
  double r = sqrt(1.5); /* row 0: mean 2, var 2/3 */
  CHECK_VALS(t->v[ln], DV(-r, 1, 3 * r, -1 / sqrt(2.0), 1 - 2 / sqrt(2.0), 3 * 2 / sqrt(2.0)), 6, 1e-12);
  /* channel 0: [1, 2] -> [-1, 1]; channel 1: [2, 2] -> 0/0 with eps 0 = NaN */
  CHECK_VALS(t->v[bn], DV(-1, NAN, -1, 1, NAN, 1), 6, 1e-12);
  tg_free(t);
}

/* The norm backward ops match central differences of L = sum(dy * norm(x, w)). */
TEST(interp_norm_backward_finite_differences) {
  for (int layer = 0; layer < 2; layer++) {
    tg *t = tg_new();
    const int64_t *xs = SH(3, 4, 2);
    int64_t wn = layer ? 2 : 4;
    double xd[24], dd[24], wd[4] = {0.5, -1.5, 2, 0.7};
    for (int i = 0; i < 24; i++) {
      xd[i] = sin(i * 1.1);
      dd[i] = cos(i * 0.3);
    }
    int x = in_(t, EVT_F32, 3, xs, xd), w = in_(t, EVT_F32, 1, &wn, wd), dy = in_(t, EVT_F32, 3, xs, dd);
    const char *fw = layer ? "layer_norm" : "batch_norm";
    char bi[64], bw[64];
    snprintf(bi, sizeof bi, "%s_backward_input", fw);
    snprintf(bw, sizeof bw, "%s_backward_weight", fw);
    int y = raw_op(t, fw, IDS(x, w), 2, NULL, EVT_F32, 3, xs);
    int dx = raw_op(t, bi, IDS(dy, x, w), 3, NULL, EVT_F32, 3, xs);
    int dw = raw_op(t, bw, IDS(dy, x), 2, NULL, EVT_F32, 1, &wn);
    int which[2] = {x, w}, grads[2] = {dx, dw}, counts[2] = {24, (int)wn};
    CHECK(run(t, EVT_RUN_FP64) == EVT_OK);
    for (int k = 0; k < 2; k++)
      for (int i = 0; i < counts[k]; i++) {
        double save = t->v[which[k]].data[i], h = 1e-6, lp = 0, lm = 0;
        t->v[which[k]].data[i] = save + h;
        CHECK(run(t, EVT_RUN_FP64) == EVT_OK);
        for (int j = 0; j < 24; j++) lp += dd[j] * t->v[y].data[j];
        t->v[which[k]].data[i] = save - h;
        CHECK(run(t, EVT_RUN_FP64) == EVT_OK);
        for (int j = 0; j < 24; j++) lm += dd[j] * t->v[y].data[j];
        t->v[which[k]].data[i] = save;
        CHECK(run(t, EVT_RUN_FP64) == EVT_OK);
        /* the weight gradient of the op is sum(dy * xhat), i.e. dL/dw */
        CHECK_MSG(fabs(t->v[grads[k]].data[i] - (lp - lm) / (2 * h)) < 1e-6, "%s grad %d[%d]: %.9g vs %.9g", fw, k,
                  i, t->v[grads[k]].data[i], (lp - lm) / (2 * h));
      }
    tg_free(t);
  }
}

/* ---- randomness ------------------------------------------------------------------------------------ */

TEST(interp_dropout_mask_is_philox) {
  tg *t = tg_new();
  double xd[1000];
  for (int i = 0; i < 1000; i++) xd[i] = 1 + i % 7;
  int x = in_(t, EVT_F32, 2, SH(10, 100), xd);
  evt_attrs a = A();
  a.p = 0.3;
  a.seed = 1234567;
  a.offset = 99;
  int d = raw_op(t, "dropout", IDS(x), 1, &a, EVT_F32, 2, SH(10, 100));
  int r = raw_op(t, "rand", NULL, 0, &a, EVT_F32, 2, SH(10, 100));
  /* step 0 (the default), then RNG step 7 (a later training step): the counter's upper words */
  static double mask0[1000];
  const uint64_t steps[2] = {0, 7};
  for (int k = 0; k < 2; k++) {
    if (k) evt_graph_set_rng_step(t->g, steps[k]);
    CHECK(evt_graph_rng_step(t->g) == steps[k]);
    CHECK(run(t, 0) == EVT_OK);
    int kept = 0, changed = 0;
    for (int i = 0; i < 1000; i++) {
      float u = evt_philox_uniform(1234567, 99, steps[k], (uint64_t)i);
      double want = u >= 0.3f ? (double)(float)(xd[i] / 0.7) : 0.0;
      CHECK_MSG(t->v[d].data[i] == want, "step %d element %d: %g vs %g", (int)steps[k], i, t->v[d].data[i], want);
      CHECK(t->v[r].data[i] == (double)u);
      kept += u >= 0.3f;
      if (k == 0) mask0[i] = want != 0;
      changed += k > 0 && mask0[i] != (want != 0);
    }
    CHECK(kept > 620 && kept < 780);
    /* independent masks keep-vs-drop differ at 2 * 0.3 * 0.7 = 42% of the elements */
    CHECK_MSG(k == 0 || (changed > 340 && changed < 500), "masks of steps 0 and 7 differ at %d of 1000", changed);
  }
  tg_free(t);
}

/* Philox4x32-10 against the known-answer vectors of its authors (Random123's kat_vectors: counter, key -> the
 * four output words), the step filling the counter's upper words; and evt's stream convention on top of it:
 * element j uses word j mod 4 of counter j / 4, so evt_philox_uniform4 equals four evt_philox_uniform calls. */
TEST(philox_known_answers) {
  static const struct {
    uint64_t seed, counter, step;
    uint32_t w[4];
  } kat[] = {
      {0, 0, 0, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
      {~0ull, ~0ull, ~0ull, {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
      {0x299f31d0a4093822ull, 0x85a308d3243f6a88ull, 0x0370734413198a2eull,
       {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
  };
  for (int t = 0; t < 3; t++) {
    uint32_t w[4];
    evt_philox4x32_10(kat[t].seed, kat[t].counter, kat[t].step, w);
    for (int k = 0; k < 4; k++) CHECK_MSG(w[k] == kat[t].w[k], "vector %d word %d: %08x", t, k, w[k]);
  }
  /* element j of stream (seed, offset): word j % 4 of counter j / 4 */
  uint32_t w[4];
  evt_philox4x32_10(77, 5, 9, w);
  for (int k = 0; k < 4; k++) {
    CHECK(evt_philox_uniform(77, 3, 9, (uint64_t)(17 + k)) == (float)(w[k] >> 8) / 16777216.0f);
    CHECK(evt_philox_uniform(77, 20, 9, (uint64_t)k) == (float)(w[k] >> 8) / 16777216.0f);
  }
  float u4[4];
  evt_philox_uniform4(77, 3, 9, 17, u4);
  for (int k = 0; k < 4; k++) CHECK(u4[k] == evt_philox_uniform(77, 3, 9, (uint64_t)(17 + k)));
}

/* ---- losses ---------------------------------------------------------------------------------------- */

TEST(interp_class_losses) {
  tg *t = tg_new();
  double l2 = log(2.0);
  int lp = in_(t, EVT_F32, 2, SH(3, 2), DV(-l2, -l2, -1, -2, -3, -4));
  int tgt = in_(t, EVT_I64, 1, SH(3), DV(1, -100, 0));
  int nll = raw_op(t, "nll_loss", IDS(lp, tgt), 2, NULL, EVT_F32, 0, NULL);
  evt_attrs sum = A();
  sum.reduction = EVT_REDUCTION_SUM;
  evt_attrs none = A();
  none.reduction = EVT_REDUCTION_NONE;
  int nlls = raw_op(t, "nll_loss", IDS(lp, tgt), 2, &sum, EVT_F32, 0, NULL);
  int nlln = raw_op(t, "nll_loss", IDS(lp, tgt), 2, &none, EVT_F32, 1, SH(3));
  int one = in_(t, EVT_F32, 0, NULL, DV(1));
  int nllb = raw_op(t, "nll_loss_backward", IDS(one, lp, tgt), 3, NULL, EVT_F32, 2, SH(3, 2));
  /* cross entropy of logits [0, ln 3] with target 1: -log(3/4) */
  int lg = in_(t, EVT_F32, 2, SH(1, 2), DV(0, log(3.0)));
  int t1 = in_(t, EVT_I64, 1, SH(1), DV(1));
  int ce = raw_op(t, "cross_entropy", IDS(lg, t1), 2, NULL, EVT_F32, 0, NULL);
  int soft = in_(t, EVT_F32, 2, SH(1, 2), DV(0.5, 0.5));
  int ces = raw_op(t, "cross_entropy", IDS(lg, soft), 2, NULL, EVT_F32, 0, NULL);
  CHECK(run(t, EVT_RUN_FP64) == EVT_OK);
  CHECK_VALS(t->v[nll], DV((l2 + 3) / 2), 1, 1e-15); /* the ignored target is not counted */
  CHECK_VALS(t->v[nlls], DV(l2 + 3), 1, 1e-15);
  CHECK_VALS(t->v[nlln], DV(l2, 0, 3), 3, 1e-15);
  CHECK_VALS(t->v[nllb], DV(0, -0.5, 0, 0, -0.5, 0), 6, 0);
  CHECK_VALS(t->v[ce], DV(-log(0.75)), 1, 1e-15);
  CHECK_VALS(t->v[ces], DV(-0.5 * log(0.25) - 0.5 * log(0.75)), 1, 1e-15);
  /* a target out of range is a run-time error naming the node */
  t->v[tgt].data[0] = 2;
  CHECK(run(t, 0) == EVT_ERR_INVALID);
  CHECK(strstr(evt_graph_error(t->g), "nll_loss") && strstr(evt_graph_error(t->g), "out of range"));
  tg_free(t);
}

TEST(interp_pointwise_losses) {
  tg *t = tg_new();
  int x = in_(t, EVT_F32, 2, SH(2, 2), DV(0, 1000, -1000, 2));
  int y = in_(t, EVT_F32, 2, SH(2, 2), DV(1, 1, 0, 0.5));
  evt_attrs none = A();
  none.reduction = EVT_REDUCTION_NONE;
  int bn = raw_op(t, "bce_with_logits", IDS(x, y), 2, &none, EVT_F32, 2, SH(2, 2));
  int bm = raw_op(t, "bce_with_logits", IDS(x, y), 2, NULL, EVT_F32, 0, NULL);
  int mse = raw_op(t, "mse_loss", IDS(x, y), 2, NULL, EVT_F32, 0, NULL);
  int one = in_(t, EVT_F32, 0, NULL, DV(2));
  int bb = raw_op(t, "bce_with_logits_backward", IDS(one, x, y), 3, NULL, EVT_F32, 2, SH(2, 2));
  int mb = raw_op(t, "mse_loss_backward", IDS(one, x, y), 3, NULL, EVT_F32, 2, SH(2, 2));
  CHECK(run(t, EVT_RUN_FP64) == EVT_OK);
  double l3 = 2 - 1 + log1p(exp(-2.0));
  CHECK_VALS(t->v[bn], DV(log(2.0), 0, 0, l3), 4, 1e-15); /* stable for |x| = 1000 */
  CHECK_VALS(t->v[bm], DV((log(2.0) + l3) / 4), 1, 1e-15);
  CHECK_VALS(t->v[mse], DV((1 + 999 * 999 + 1000 * 1000 + 1.5 * 1.5) / 4), 1, 1e-15);
  double s2 = 1 / (1 + exp(-2.0));
  CHECK_VALS(t->v[bb], DV((0.5 - 1) * 0.5, 0, 0, (s2 - 0.5) * 0.5), 4, 1e-15);
  CHECK_VALS(t->v[mb], DV(2 * -1 * 0.5, 2 * 999 * 0.5, 2 * -1000 * 0.5, 2 * 1.5 * 0.5), 4, 1e-15);
  tg_free(t);
}

/* ---- gathers --------------------------------------------------------------------------------------- */

TEST(interp_gathers) {
  tg *t = tg_new();
  int w = in_(t, EVT_F32, 2, SH(3, 2), DV(1, 2, 3, 4, 5, 6));
  int idx = in_(t, EVT_I64, 2, SH(2, 2), DV(2, 0, 2, 2));
  int emb = raw_op(t, "embedding", IDS(w, idx), 2, NULL, EVT_F32, 3, SH(2, 2, 2));
  evt_attrs es = A();
  es.shape = (evt_ilist){2, {3, 2}};
  int eb = raw_op(t, "embedding_backward", IDS(emb, idx), 2, &es, EVT_F32, 2, SH(3, 2));
  evt_attrs oh = A();
  oh.num_classes = 3;
  int one = raw_op(t, "one_hot", IDS(idx), 1, &oh, EVT_F32, 3, SH(2, 2, 3));
  int i1 = in_(t, EVT_I64, 1, SH(3), DV(1, 1, 0));
  evt_attrs d1 = A();
  d1.dim = 1;
  int is = raw_op(t, "index_select", IDS(w, i1), 2, &d1, EVT_F32, 2, SH(3, 3));
  evt_attrs isb = d1;
  isb.shape = (evt_ilist){2, {3, 2}};
  int isbk = raw_op(t, "index_select_backward", IDS(is, i1), 2, &isb, EVT_F32, 2, SH(3, 2));
  CHECK(run(t, 0) == EVT_OK);
  CHECK_VALS(t->v[emb], DV(5, 6, 1, 2, 5, 6, 5, 6), 8, 0);
  CHECK_VALS(t->v[eb], DV(1, 2, 0, 0, 15, 18), 6, 0);
  CHECK_VALS(t->v[one], DV(0, 0, 1, 1, 0, 0, 0, 0, 1, 0, 0, 1), 12, 0);
  CHECK_VALS(t->v[is], DV(2, 2, 1, 4, 4, 3, 6, 6, 5), 9, 0);
  CHECK_VALS(t->v[isbk], DV(1, 4, 3, 8, 5, 12), 6, 0);
  t->v[idx].data[3] = 3;
  CHECK(run(t, 0) == EVT_ERR_INVALID);
  CHECK(strstr(evt_graph_error(t->g), "embedding") && strstr(evt_graph_error(t->g), "out of range"));
  t->v[idx].data[3] = -1;
  CHECK(run(t, 0) == EVT_ERR_INVALID);
  t->v[idx].data[3] = 0.5; /* not an integer */
  CHECK(run(t, 0) == EVT_ERR_INVALID);
  t->v[idx].data[3] = 2;
  t->v[i1].data[2] = 2; /* index_select along a dim of size 2 */
  CHECK(run(t, 0) == EVT_ERR_INVALID);
  CHECK(strstr(evt_graph_error(t->g), "index_select") && strstr(evt_graph_error(t->g), "out of range"));
  t->v[i1].data[2] = 0;
  CHECK(run(t, 0) == EVT_OK);
  t->v[idx].data[0] = NAN;
  CHECK(run(t, 0) == EVT_ERR_INVALID);
  tg_free(t);
}

/* ---- layout ---------------------------------------------------------------------------------------- */

TEST(interp_layout) {
  tg *t = tg_new();
  int x = in_(t, EVT_F32, 2, SH(2, 3), DV(1, 2, 3, 4, 5, 6));
  evt_attrs tr = A();
  tr.dims = (evt_ilist){2, {0, -1}};
  int tt = raw_op(t, "transpose", IDS(x), 1, &tr, EVT_F32, 2, SH(3, 2));
  evt_attrs pe = A();
  pe.dims = (evt_ilist){3, {2, 0, 1}};
  int x3 = in_(t, EVT_F32, 3, SH(2, 1, 2), DV(1, 2, 3, 4));
  int pp = raw_op(t, "permute", IDS(x3), 1, &pe, EVT_F32, 3, SH(2, 2, 1));
  evt_attrs ex = A();
  ex.shape = (evt_ilist){3, {2, 2, 3}};
  int b = in_(t, EVT_F32, 2, SH(2, 1), DV(7, 8));
  int ee = raw_op(t, "expand", IDS(b), 1, &ex, EVT_F32, 3, SH(2, 2, 3));
  evt_attrs sl = A();
  sl.dim = 1;
  sl.start = -3;
  sl.step = 2;
  int ss = raw_op(t, "slice", IDS(x), 1, &sl, EVT_F32, 2, SH(2, 2));
  evt_attrs slb = sl;
  slb.shape = (evt_ilist){2, {2, 3}};
  int sb = raw_op(t, "slice_backward", IDS(ss), 1, &slb, EVT_F32, 2, SH(2, 3));
  evt_attrs c1 = A();
  c1.dim = 1;
  int cc = raw_op(t, "concat", IDS(x, ss, b), 3, &c1, EVT_F32, 2, SH(2, 6));
  evt_attrs rs = A();
  rs.shape = (evt_ilist){1, {6}};
  int rr = raw_op(t, "reshape", IDS(x), 1, &rs, EVT_F32, 1, SH(6));
  int uq = raw_op(t, "unsqueeze", IDS(x), 1, NULL, EVT_F32, 3, SH(2, 3, 1));
  evt_attrs sl2 = A();
  sl2.dim = 0;
  sl2.start = 1;
  sl2.end = -5; /* empty */
  int se = raw_op(t, "slice", IDS(x), 1, &sl2, EVT_F32, 2, SH(0, 3));
  CHECK(run(t, 0) == EVT_OK);
  CHECK_VALS(t->v[tt], DV(1, 4, 2, 5, 3, 6), 6, 0);
  CHECK_VALS(t->v[pp], DV(1, 3, 2, 4), 4, 0);
  CHECK_VALS(t->v[ee], DV(7, 7, 7, 8, 8, 8, 7, 7, 7, 8, 8, 8), 12, 0);
  CHECK_VALS(t->v[ss], DV(1, 3, 4, 6), 4, 0);
  CHECK_VALS(t->v[sb], DV(1, 0, 3, 4, 0, 6), 6, 0);
  CHECK_VALS(t->v[cc], DV(1, 2, 3, 1, 3, 7, 4, 5, 6, 4, 6, 8), 12, 0);
  CHECK_VALS(t->v[rr], DV(1, 2, 3, 4, 5, 6), 6, 0);
  CHECK_VALS(t->v[uq], DV(1, 2, 3, 4, 5, 6), 6, 0);
  CHECK(t->v[se].numel == 0);
  tg_free(t);
}

/* ---- whole runs ------------------------------------------------------------------------------------ */

TEST(interp_run_frees_intermediates) {
  tg *t = tg_new();
  int x = in_(t, EVT_F32, 1, SH(2), DV(1, 2));
  int a = raw_op(t, "exp", IDS(x), 1, NULL, EVT_F32, 1, SH(2));
  int b = raw_op(t, "neg", IDS(a), 1, NULL, EVT_F32, 1, SH(2));
  int c = raw_op(t, "add", IDS(b, x), 2, NULL, EVT_F32, 1, SH(2));
  int dead = raw_op(t, "relu", IDS(x), 1, NULL, EVT_F32, 1, SH(2));
  int s = raw_op(t, "sum", IDS(c), 1, NULL, EVT_F32, 0, NULL);
  CHECK(evt_graph_set_loss(t->g, s) == EVT_OK);
  CHECK(evt_graph_add_output(t->g, b) == EVT_OK);
  CHECK(evt_interp_run(t->g, t->v, 0, 0) == EVT_OK);
  CHECK(t->v[x].data != NULL);  /* the caller's */
  CHECK(t->v[a].data == NULL);  /* freed after its last use */
  CHECK(t->v[b].data != NULL);  /* an output */
  CHECK(t->v[c].data == NULL);
  CHECK(t->v[dead].data == NULL);
  CHECK_VALS(t->v[s], DV(3 - exp(1.0) - exp(2.0)), 1, 1e-6);
  CHECK(evt_interp_run(t->g, t->v, 0, 1) == EVT_OK); /* refills slots from the last run */
  CHECK(t->v[a].data != NULL && t->v[dead].data != NULL);
  /* a missing input names the node */
  evt_tensor_free(&t->v[x]);
  CHECK(evt_interp_run(t->g, t->v, 0, 0) == EVT_ERR_INVALID);
  CHECK(strstr(evt_graph_error(t->g), "%in0") != NULL);
  CHECK(t->v[a].data == NULL && t->v[s].data == NULL);
  tg_free(t);
}

TEST(interp_run_is_deterministic) {
  tg *t = tg_new();
  double xd[64 * 48];
  for (int i = 0; i < 64 * 48; i++) xd[i] = sin(i * 0.013) * 3;
  int x = in_(t, EVT_F32, 2, SH(64, 48), xd);
  int w = in_(t, EVT_F32, 2, SH(48, 32), xd);
  int m = raw_op(t, "mm", IDS(x, w), 2, NULL, EVT_F32, 2, SH(64, 32));
  int s = raw_op(t, "softmax", IDS(m), 1, NULL, EVT_F32, 2, SH(64, 32));
  int r = raw_op(t, "sum", IDS(s), 1, NULL, EVT_F32, 0, NULL);
  CHECK(run(t, 0) == EVT_OK);
  double first = t->v[r].data[0];
  CHECK_NEAR(first, 64, 1e-4);
  CHECK(run(t, 0) == EVT_OK);
  CHECK(t->v[r].data[0] == first);
  tg_free(t);
}

TEST(interp_init_inputs) {
  evt_graph *g = evt_graph_new("init");
  int64_t big[] = {4000}, rp[] = {5};
  int n = evt_input(g, "n", EVT_F32, 1, big);
  int u = evt_param(g, "u", EVT_F32, 1, big);
  int r = evt_input(g, "r", EVT_I64, 1, big);
  int p = evt_input(g, "p", EVT_I64, 1, rp);
  int z = evt_param(g, "z", EVT_BF16, 1, rp);
  g->nodes[n].attr.std = 2;
  g->nodes[u].attr.init = EVT_INIT_UNIFORM;
  g->nodes[u].attr.lo = -1;
  g->nodes[u].attr.hi = 3;
  g->nodes[r].attr.init = EVT_INIT_RANDINT;
  g->nodes[r].attr.lo = 2;
  g->nodes[r].attr.hi = 5;
  g->nodes[p].attr.init = EVT_INIT_ROWPTR;
  g->nodes[p].attr.lo = 3;
  g->nodes[z].attr.init = EVT_INIT_ONES;
  evt_tensor v[5] = {0}, w[5] = {0};
  CHECK(evt_interp_init_inputs(g, v, 7) == EVT_OK);
  CHECK(evt_interp_init_inputs(g, w, 7) == EVT_OK);
  double mean = 0, var = 0, umin = 9, umax = -9;
  int hist[3] = {0};
  for (int i = 0; i < 4000; i++) {
    mean += v[n].data[i] / 4000;
    var += v[n].data[i] * v[n].data[i] / 4000;
    CHECK(v[n].data[i] == (double)(float)v[n].data[i]); /* rounded to f32 */
    umin = fmin(umin, v[u].data[i]);
    umax = fmax(umax, v[u].data[i]);
    int k = (int)v[r].data[i] - 2;
    CHECK(k >= 0 && k < 3 && v[r].data[i] == floor(v[r].data[i]));
    if (k >= 0 && k < 3) hist[k]++;
  }
  CHECK(fabs(mean) < 0.15 && fabs(sqrt(var) - 2) < 0.15);
  CHECK(umin >= -1 && umin < -0.95 && umax < 3 && umax > 2.95);
  CHECK(hist[0] > 1200 && hist[1] > 1200 && hist[2] > 1200);
  CHECK_VALS(v[p], DV(0, 3, 6, 9, 12), 5, 0);
  CHECK_VALS(v[z], DV(1, 1, 1, 1, 1), 5, 0);
  CHECK(memcmp(v[n].data, w[n].data, 4000 * sizeof(double)) == 0); /* deterministic */
  evt_tensor_free(&w[n]);
  CHECK(evt_interp_init_inputs(g, w, 8) == EVT_OK);
  CHECK(memcmp(v[n].data, w[n].data, 4000 * sizeof(double)) != 0); /* the seed matters */
  for (int i = 0; i < 5; i++) {
    evt_tensor_free(&v[i]);
    evt_tensor_free(&w[i]);
  }
  evt_graph_free(g);
}

/* A node whose declared type disagrees with its inputs (a pass bug, say) is reported, never read out of
 * bounds; so is a wrong input tensor handed to evt_interp_node. */
TEST(interp_malformed_nodes_are_errors) {
  const char *ops[] = {"add", "softmax", "layer_norm", "dropout", "expand", "bmm", "sdpa", "mse_loss_backward"};
  for (int k = 0; k < EVT_ARRAY_LEN(ops); k++) {
    tg *t = tg_new();
    int a = in_(t, EVT_F32, 4, SH(1, 2, 3, 3), NULL);
    evt_tensor_alloc(&t->v[a], EVT_F32, 4, SH(1, 2, 3, 3));
    int ins[4] = {a, a, a, a};
    int nin = evt_op_table[evt_op_from_name(ops[k], strlen(ops[k]))].min_inputs;
    int y = raw_op(t, ops[k], ins, nin, NULL, EVT_F32, 4, SH(1, 2, 5, 3));
    CHECK_MSG(run(t, 0) == EVT_ERR_INVALID, "%s", ops[k]);
    CHECK_MSG(strstr(evt_graph_error(t->g), ops[k]) != NULL, "%s: %s", ops[k], evt_graph_error(t->g));
    CHECK(t->v[y].data == NULL);
    tg_free(t);
  }
  tg *t = tg_new();
  int a = in_(t, EVT_F32, 1, SH(3), DV(1, 2, 3));
  int y = raw_op(t, "exp", IDS(a), 1, NULL, EVT_F32, 1, SH(3));
  evt_tensor wrong, out;
  CHECK(evt_tensor_alloc(&wrong, EVT_F32, 1, SH(4)) == EVT_OK);
  const evt_tensor *ins[1] = {&wrong};
  CHECK(evt_interp_node(t->g, y, ins, &out, 0) == EVT_ERR_INVALID);
  CHECK(out.data == NULL);
  ins[0] = &t->v[a];
  CHECK(evt_interp_node(t->g, y, ins, &out, 0) == EVT_OK);
  CHECK_VALS(out, DV(exp(1.0), exp(2.0), exp(3.0)), 3, 1e-7);
  evt_tensor_free(&out);
  evt_tensor_free(&wrong);
  tg_free(t);
}

/* Every op at once: tests/golden/infer/all_ops.evt (one node of each op) parses, initialises and runs;
 * every node gets a value of its type, and a second run gives the same bits. */
TEST(interp_every_op_runs) {
  FILE *f = fopen("tests/golden/infer/all_ops.evt", "rb");
  if (!f) {
    printf("  (skipped: tests/golden/infer/all_ops.evt not found from %s)\n", "the working directory");
    return;
  }
  fclose(f);
  char *err = NULL;
  evt_graph *g = evt_parse_file("tests/golden/infer/all_ops.evt", &err);
  CHECK_MSG(g != NULL, "%s", err ? err : "?");
  free(err);
  if (!g) return;
  int n = g->nnodes;
  evt_tensor *v = calloc((size_t)n, sizeof *v), *w = calloc((size_t)n, sizeof *w);
  CHECK(evt_interp_init_inputs(g, v, 11) == EVT_OK);
  CHECK(evt_interp_init_inputs(g, w, 11) == EVT_OK);
  CHECK_MSG(evt_interp_run(g, v, 0, 1) == EVT_OK, "%s", evt_graph_error(g));
  CHECK_MSG(evt_interp_run(g, w, 0, 1) == EVT_OK, "%s", evt_graph_error(g));
  bool seen[EVT_OP_COUNT] = {0};
  for (int i = 0; i < n; i++) {
    seen[g->nodes[i].op] = true;
    CHECK_MSG(v[i].data && v[i].numel == evt_type_numel(&g->nodes[i].type) && v[i].dtype == g->nodes[i].type.dtype,
              "node %s", g->nodes[i].name);
    if (v[i].data && w[i].data)
      CHECK_MSG(memcmp(v[i].data, w[i].data, sizeof(double) * (size_t)v[i].numel) == 0, "node %s differs", g->nodes[i].name);
  }
  for (int op = 0; op < EVT_OP_COUNT; op++) CHECK_MSG(seen[op], "op %s not in all_ops.evt", evt_op_table[op].name);
  for (int i = 0; i < n; i++) {
    evt_tensor_free(&v[i]);
    evt_tensor_free(&w[i]);
  }
  free(v);
  free(w);
  evt_graph_free(g);
}

/* Zero-size tensors: no reads, empty sums are 0, empty means NaN, empty inner dims give zero products. */
TEST(interp_zero_size_tensors) {
  evt_graph *g = evt_graph_new("z");
  int a = evt_input(g, "a", EVT_F32, 2, SH(0, 3));
  int b = evt_input(g, "b", EVT_F32, 2, SH(4, 0));
  int c = evt_input(g, "c", EVT_F32, 2, SH(0, 5));
  int e = evt_add_op(g, "exp", IDS(a), 1, NULL, 0);
  int s = evt_add_op(g, "sum", IDS(a), 1, (evt_attr[]){{.name = "dims", .n = 1, .list = {0}}}, 1);
  int m = evt_add_op(g, "mean", IDS(a), 1, (evt_attr[]){{.name = "dims", .n = 1, .list = {0}}}, 1);
  int mm = evt_add_op(g, "mm", IDS(b, c), 2, NULL, 0);
  int sm = evt_add_op(g, "softmax", IDS(a), 1, NULL, 0);
  int cat = evt_add_op(g, "concat", IDS(a, a), 2, (evt_attr[]){EVT_ATTR_INT("dim", 0)}, 1);
  CHECK_MSG(e >= 0 && s >= 0 && m >= 0 && mm >= 0 && sm >= 0 && cat >= 0, "%s", evt_graph_error(g));
  evt_tensor v[16] = {0};
  CHECK(evt_interp_init_inputs(g, v, 1) == EVT_OK);
  CHECK_MSG(evt_interp_run(g, v, 0, 1) == EVT_OK, "%s", evt_graph_error(g));
  CHECK(v[e].numel == 0 && v[sm].numel == 0 && v[cat].numel == 0);
  CHECK_VALS(v[s], DV(0, 0, 0), 3, 0);
  CHECK_VALS(v[m], DV(NAN, NAN, NAN), 3, 0);
  double z[20] = {0};
  CHECK_VALS(v[mm], z, 20, 0);
  for (int i = 0; i < 16; i++) evt_tensor_free(&v[i]);
  evt_graph_free(g);
}

/* layout=nhwc: conv2d, its two backwards, max/avg/adaptive pool and their backwards, fed the NHWC permutes of NCHW
 * inputs (weights [O,kh,kw,C/g]), give exactly the NHWC permutes of the nchw results. */
TEST(interp_nhwc_matches_nchw) {
  static const char *text =
      "graph t {\n"
      "  %x: f32[2,4,5,6] = input()\n"
      "  %w: f32[6,2,3,3] = param()\n"
      "  %dy: f32[2,6,3,6] = input()\n"
      "  %dp: f32[2,4,3,4] = input()\n"
      "  %xt: f32[2,5,6,4] = permute(%x, dims=[0,2,3,1])\n"
      "  %wt: f32[6,3,3,2] = permute(%w, dims=[0,2,3,1])\n"
      "  %dyt: f32[2,3,6,6] = permute(%dy, dims=[0,2,3,1])\n"
      "  %dpt: f32[2,3,4,4] = permute(%dp, dims=[0,2,3,1])\n"
      "  %y: f32[2,6,3,6] = conv2d(%x, %w, stride=[2,1], padding=[1,1], groups=2)\n"
      "  %yt: f32[2,3,6,6] = conv2d(%xt, %wt, stride=[2,1], padding=[1,1], groups=2, layout=nhwc)\n"
      "  %y2: f32[2,6,3,6] = permute(%yt, dims=[0,3,1,2])\n"
      "  %dx: f32[2,4,5,6] = conv2d_backward_input(%dy, %w, shape=[2,4,5,6], stride=[2,1], padding=[1,1], groups=2)\n"
      "  %dxt: f32[2,5,6,4] = conv2d_backward_input(%dyt, %wt, shape=[2,5,6,4], stride=[2,1], padding=[1,1], groups=2, layout=nhwc)\n"
      "  %dx2: f32[2,4,5,6] = permute(%dxt, dims=[0,3,1,2])\n"
      "  %dw: f32[6,2,3,3] = conv2d_backward_weight(%x, %dy, shape=[6,2,3,3], stride=[2,1], padding=[1,1], groups=2)\n"
      "  %dwt: f32[6,3,3,2] = conv2d_backward_weight(%xt, %dyt, shape=[6,3,3,2], stride=[2,1], padding=[1,1], groups=2, layout=nhwc)\n"
      "  %dw2: f32[6,2,3,3] = permute(%dwt, dims=[0,3,1,2])\n"
      "  %p: f32[2,4,3,4] = max_pool2d(%x, kernel=[3,2], stride=[2,2], padding=[1,1])\n"
      "  %pt: f32[2,3,4,4] = max_pool2d(%xt, kernel=[3,2], stride=[2,2], padding=[1,1], layout=nhwc)\n"
      "  %p2: f32[2,4,3,4] = permute(%pt, dims=[0,3,1,2])\n"
      "  %pb: f32[2,4,5,6] = max_pool2d_backward(%dp, %x, kernel=[3,2], stride=[2,2], padding=[1,1])\n"
      "  %pbt: f32[2,5,6,4] = max_pool2d_backward(%dpt, %xt, kernel=[3,2], stride=[2,2], padding=[1,1], layout=nhwc)\n"
      "  %pb2: f32[2,4,5,6] = permute(%pbt, dims=[0,3,1,2])\n"
      "  %a: f32[2,4,3,4] = avg_pool2d(%x, kernel=[3,2], stride=[2,2], padding=[1,1])\n"
      "  %at: f32[2,3,4,4] = avg_pool2d(%xt, kernel=[3,2], stride=[2,2], padding=[1,1], layout=nhwc)\n"
      "  %a2: f32[2,4,3,4] = permute(%at, dims=[0,3,1,2])\n"
      "  %ab: f32[2,4,5,6] = avg_pool2d_backward(%dp, shape=[2,4,5,6], kernel=[3,2], stride=[2,2], padding=[1,1])\n"
      "  %abt: f32[2,5,6,4] = avg_pool2d_backward(%dpt, shape=[2,5,6,4], kernel=[3,2], stride=[2,2], padding=[1,1], layout=nhwc)\n"
      "  %ab2: f32[2,4,5,6] = permute(%abt, dims=[0,3,1,2])\n"
      "  %m: f32[2,4,2,3] = adaptive_max_pool2d(%x, shape=[2,3])\n"
      "  %mt: f32[2,2,3,4] = adaptive_max_pool2d(%xt, shape=[2,3], layout=nhwc)\n"
      "  %m2: f32[2,4,2,3] = permute(%mt, dims=[0,3,1,2])\n"
      "  %dm: f32[2,4,2,3] = input()\n"
      "  %dmt: f32[2,2,3,4] = permute(%dm, dims=[0,2,3,1])\n"
      "  %mb: f32[2,4,5,6] = adaptive_max_pool2d_backward(%dm, %x, shape=[2,3])\n"
      "  %mbt: f32[2,5,6,4] = adaptive_max_pool2d_backward(%dmt, %xt, shape=[2,3], layout=nhwc)\n"
      "  %mb2: f32[2,4,5,6] = permute(%mbt, dims=[0,3,1,2])\n"
      "  output %y, %y2, %dx, %dx2, %dw, %dw2, %p, %p2, %pb, %pb2, %a, %a2, %ab, %ab2, %m, %m2, %mb, %mb2\n"
      "}\n";
  char *err = NULL;
  evt_graph *g = evt_parse(text, "nhwc.evt", &err);
  CHECK_MSG(g != NULL, "%s", err ? err : "");
  free(err);
  if (!g) return;
  evt_tensor *v = calloc((size_t)g->nnodes, sizeof *v);
  CHECK(evt_interp_init_inputs(g, v, 7) == EVT_OK);
  CHECK(evt_interp_run(g, v, EVT_RUN_FP64, 0) == EVT_OK);
  for (int i = 0; i + 1 < g->noutputs; i += 2) {
    const evt_tensor *a = &v[g->outputs[i]], *b = &v[g->outputs[i + 1]];
    CHECK(a->numel == b->numel && a->numel > 0);
    double nz = 0;
    for (int64_t k = 0; k < a->numel && a->numel == b->numel; k++) {
      CHECK_MSG(a->data[k] == b->data[k], "%s[%lld]: %g vs %g", g->nodes[g->outputs[i]].name, (long long)k,
                a->data[k], b->data[k]);
      if (a->data[k] != b->data[k]) break;
      nz += fabs(a->data[k]);
    }
    CHECK(nz > 0);
  }
  for (int i = 0; i < g->nnodes; i++) evt_tensor_free(&v[i]);
  free(v);
  evt_graph_free(g);
}
