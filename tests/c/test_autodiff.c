/* Autodiff tests: a finite-difference check in fp64 for every op with a vector-Jacobian rule (fd_<op>),
 * plus accumulation, broadcasting, unused params, output order, tie splitting, origins and errors.
 *
 * An FD case: params in, y = op(params), loss = sum(y * R) with R a fixed random input (so the seed is not
 * all ones), evt_graph_build_joint, evt_interp_run with EVT_RUN_FP64; every gradient element is compared
 * with the central difference (loss(p + h) - loss(p - h)) / 2h, h = 1e-6. Sources are filled from their
 * init attributes by a local deterministic generator (uniform / normal / randint / rowptr / bool). */
#include "test.h"

#include <stdlib.h>
#include <string.h>

/* ---- building helpers --------------------------------------------------------------------------------- */

static uint64_t rng_state = 0x5eed;
static double urand(void) {
  rng_state += 0x9E3779B97F4A7C15ull;
  uint64_t z = rng_state;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}
static int64_t dimr(int lo, int hi) { return lo + (int64_t)(urand() * (hi - lo + 1)); } /* random size in [lo,hi] */

#define SH(...) (int64_t[]){__VA_ARGS__}, (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t))

static int P(evt_graph *g, const char *name, const int64_t *shape, int rank) {
  int id = evt_param(g, name, EVT_F32, rank, shape);
  CHECK_MSG(id >= 0, "%s", evt_graph_error(g));
  return id;
}

/* a param filled uniformly in [lo, hi) */
static int PU(evt_graph *g, const char *name, double lo, double hi, const int64_t *shape, int rank) {
  int id = P(g, name, shape, rank);
  if (id >= 0) {
    g->nodes[id].attr.init = EVT_INIT_UNIFORM;
    g->nodes[id].attr.lo = lo;
    g->nodes[id].attr.hi = hi;
  }
  return id;
}

static int I(evt_graph *g, const char *name, evt_dtype dt, evt_init init, double lo, double hi, const int64_t *shape,
             int rank) {
  int id = evt_input(g, name, dt, rank, shape);
  CHECK_MSG(id >= 0, "%s", evt_graph_error(g));
  if (id >= 0) {
    g->nodes[id].attr.init = init;
    g->nodes[id].attr.lo = lo;
    g->nodes[id].attr.hi = hi;
  }
  return id;
}

static int op(evt_graph *g, const char *name, const int *in, int nin, const evt_attr *attrs, int nattrs) {
  int id = evt_add_op(g, name, in, nin, attrs, nattrs);
  CHECK_MSG(id >= 0, "%s: %s", name, evt_graph_error(g));
  return id;
}
#define OP(g, name, ...) op(g, name, (int[]){__VA_ARGS__}, (int)(sizeof((int[]){__VA_ARGS__}) / sizeof(int)), NULL, 0)
#define OPA(g, name, attrs, ...)                                                                  \
  op(g, name, (int[]){__VA_ARGS__}, (int)(sizeof((int[]){__VA_ARGS__}) / sizeof(int)), attrs, \
     (int)(sizeof(attrs) / sizeof(evt_attr)))
#define LIST(nm, ...) ((evt_attr){.name = (nm), .n = (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), .list = {__VA_ARGS__}})

/* ---- running ------------------------------------------------------------------------------------------ */

static bool is_slot(const evt_node *n) { return n->op == EVT_OP_INPUT || n->op == EVT_OP_PARAM; }

/* Fills every input/param of g from its init attributes; `away` pushes floats to |v| >= 0.2. */
static void fill_sources(evt_graph *g, evt_tensor *v, bool away) {
  for (int i = 0; i < g->nnodes; i++) {
    const evt_node *n = &g->nodes[i];
    if (!is_slot(n)) continue;
    evt_tensor_free(&v[i]);
    CHECK(evt_tensor_alloc(&v[i], n->type.dtype, n->type.rank, n->type.shape) == EVT_OK);
    for (int64_t j = 0; j < v[i].numel; j++) {
      double u = urand(), x;
      const evt_attrs *a = &n->attr;
      if (n->type.dtype == EVT_BOOL) x = u < 0.5;
      else if (a->init == EVT_INIT_RANDINT) x = floor(a->lo + u * (a->hi - a->lo));
      else if (a->init == EVT_INIT_ROWPTR) x = (double)j * a->lo;
      else if (a->init == EVT_INIT_UNIFORM) x = a->lo + u * (a->hi - a->lo);
      else if (a->init == EVT_INIT_ZEROS) x = 0;
      else if (a->init == EVT_INIT_ONES) x = 1;
      else x = a->std * sqrt(-2.0 * log(1.0 - u)) * cos(2.0 * M_PI * urand());
      if (away && evt_dtype_is_float(n->type.dtype) && a->init != EVT_INIT_UNIFORM)
        x = x < 0 ? x - 0.2 : x + 0.2;
      v[i].data[j] = x;
    }
  }
}

static void free_values(evt_graph *g, evt_tensor *v) {
  for (int i = 0; i < g->nnodes; i++) evt_tensor_free(&v[i]);
  free(v);
}

static double run_loss(evt_graph *g, evt_tensor *v) {
  evt_status st = evt_interp_run(g, v, EVT_RUN_FP64, 0);
  CHECK_MSG(st == EVT_OK, "interp: %s", evt_graph_error(g));
  return st == EVT_OK ? v[g->loss].data[0] : NAN;
}

typedef struct fd_opts {
  bool away;        /* keep float sources away from 0 (kinks) */
  double rel, abs;  /* tolerance: |analytic - fd| <= rel * max(|a|, |fd|) + abs */
  unsigned flags;   /* build_joint flags */
} fd_opts;

/* The core check: g has its loss set. Builds the joint graph and compares every gradient output with
 * central differences of the loss. Returns the number of gradient elements checked. */
static int fd_check_loss(evt_graph *g, fd_opts o) {
  if (o.rel == 0) o.rel = 1e-6;
  if (o.abs == 0) o.abs = 1e-7;
  int nf = g->nnodes;
  evt_status st = evt_graph_build_joint(g, o.flags);
  CHECK_MSG(st == EVT_OK, "build_joint: %s", evt_graph_error(g));
  if (st != EVT_OK) return 0;
  evt_tensor *v = calloc((size_t)g->nnodes, sizeof *v);
  fill_sources(g, v, o.away);
  /* targets in output order */
  int ntargets = 0, checked = 0, fails = 0;
  for (int pass = 0; pass < 2; pass++)
    for (int p = 0; p < nf; p++) {
      const evt_node *pn = &g->nodes[p];
      bool want = pass == 0 ? pn->op == EVT_OP_PARAM : pn->op == EVT_OP_INPUT && (o.flags & EVT_GRAD_INPUTS);
      if (!want || !evt_dtype_is_float(pn->type.dtype)) continue;
      ntargets++;
      CHECK(ntargets < g->noutputs);
      if (ntargets >= g->noutputs) break;
      int gid = g->outputs[ntargets];
      run_loss(g, v); /* the gradients at the unperturbed point (earlier FD runs overwrote them) */
      evt_tensor an = {0};
      CHECK(evt_tensor_alloc(&an, v[gid].dtype, v[gid].rank, v[gid].shape) == EVT_OK);
      CHECK(v[gid].numel == v[p].numel);
      memcpy(an.data, v[gid].data, sizeof(double) * (size_t)an.numel);
      const double h = 1e-6;
      for (int64_t j = 0; j < v[p].numel && j < an.numel; j++) {
        double x0 = v[p].data[j];
        v[p].data[j] = x0 + h;
        double lp = run_loss(g, v);
        v[p].data[j] = x0 - h;
        double lm = run_loss(g, v);
        v[p].data[j] = x0;
        double fd = (lp - lm) / (2 * h), a = an.data[j];
        double tol = o.rel * fmax(fabs(a), fabs(fd)) + o.abs;
        checked++;
        if (!(fabs(a - fd) <= tol) && fails++ < 5)
          evt_test_fail(__FILE__, __LINE__, "d loss / d %%%s[%lld]: analytic %.10g, finite difference %.10g", pn->name,
                        (long long)j, a, fd);
      }
      evt_tensor_free(&an);
    }
  CHECK(g->noutputs == ntargets + 1);
  free_values(g, v);
  return checked;
}

/* loss = sum(y * R), R a random input of y's type; then fd_check_loss. */
static int fd_check(evt_graph *g, int y, fd_opts o) {
  if (y < 0) return 0;
  const evt_type t = g->nodes[y].type;
  int r = I(g, "R", t.dtype, EVT_INIT_UNIFORM, -1.0, 1.0, t.shape, t.rank);
  int loss = OP(g, "sum", OP(g, "mul", y, r));
  if (loss < 0) return 0;
  CHECK(evt_graph_set_loss(g, loss) == EVT_OK);
  int n = fd_check_loss(g, o);
  CHECK(n > 0);
  return n;
}

#define FD_UNARY(opname, away_, lo, hi)                                               \
  TEST(fd_##opname) {                                                                 \
    evt_graph *g = evt_graph_new(#opname);                                            \
    int x = lo < hi ? PU(g, "x", lo, hi, SH(dimr(2, 4), dimr(2, 5))) : P(g, "x", SH(dimr(2, 4), dimr(2, 5))); \
    fd_check(g, OP(g, #opname, x), (fd_opts){.away = away_});                         \
    evt_graph_free(g);                                                                \
  }

/* ---- elementwise unary -------------------------------------------------------------------------------- */
FD_UNARY(neg, false, 0, 0)
FD_UNARY(exp, false, 0, 0)
FD_UNARY(log, false, 0.3, 2.0)
FD_UNARY(sqrt, false, 0.3, 2.0)
FD_UNARY(rsqrt, false, 0.3, 2.0)
FD_UNARY(reciprocal, true, 0, 0)
FD_UNARY(abs, true, 0, 0)
FD_UNARY(sign, true, 0, 0)
FD_UNARY(tanh, false, 0, 0)
FD_UNARY(sigmoid, false, 0, 0)
FD_UNARY(relu, true, 0, 0)
FD_UNARY(erf, false, 0, 0)

TEST(fd_gelu) {
  for (int approx = 0; approx < 2; approx++) {
    evt_graph *g = evt_graph_new("gelu");
    int x = P(g, "x", SH(3, 4));
    evt_attr a[] = {EVT_ATTR_INT("approximate", approx)};
    fd_check(g, OPA(g, "gelu", a, x), (fd_opts){0});
    evt_graph_free(g);
  }
}

TEST(fd_cast) {
  /* f32 -> bf16 (exact in fp64 mode) -> back through the rule's cast */
  evt_graph *g = evt_graph_new("cast");
  int x = P(g, "x", SH(3, 4));
  evt_attr a[] = {EVT_ATTR_INT("dtype", EVT_BF16)};
  int y = OPA(g, "cast", a, x);
  CHECK(g->nodes[y].type.dtype == EVT_BF16);
  fd_check(g, OP(g, "exp", y), (fd_opts){0});
  evt_graph_free(g);
}

TEST(fd_pow) {
  const double ps[] = {3.0, 2.0, 0.5, -1.5, 1.0};
  for (int i = 0; i < EVT_ARRAY_LEN(ps); i++) {
    evt_graph *g = evt_graph_new("pow");
    int x = PU(g, "x", 0.4, 1.7, SH(2, 3));
    evt_attr a[] = {EVT_ATTR_FLOAT("value", ps[i])};
    fd_check(g, OPA(g, "pow", a, x), (fd_opts){0});
    evt_graph_free(g);
  }
}

/* ---- elementwise binary (with broadcasting) ------------------------------------------------------------- */
static void fd_binary(const char *name, bool away, double lo, double hi) {
  /* a[2,3,4] with b[3,1]: b is broadcast over a leading dim (no keepdim) and a size-1 dim (keepdim) */
  evt_graph *g = evt_graph_new(name);
  int a = P(g, "a", SH(2, 3, 4));
  int b = lo < hi ? PU(g, "b", lo, hi, SH(3, 1)) : P(g, "b", SH(3, 1));
  fd_check(g, OP(g, name, a, b), (fd_opts){.away = away});
  evt_graph_free(g);
  /* and the other way round, same shapes */
  g = evt_graph_new(name);
  a = P(g, "a", SH(1, 4));
  b = lo < hi ? PU(g, "b", lo, hi, SH(3, 4)) : P(g, "b", SH(3, 4));
  fd_check(g, OP(g, name, a, b), (fd_opts){.away = away});
  evt_graph_free(g);
}
TEST(fd_add) { fd_binary("add", false, 0, 0); }
TEST(fd_sub) { fd_binary("sub", false, 0, 0); }
TEST(fd_mul) { fd_binary("mul", false, 0, 0); }
TEST(fd_div) { fd_binary("div", false, 0.5, 2.0); }
TEST(fd_maximum) { fd_binary("maximum", false, 0, 0); }
TEST(fd_minimum) { fd_binary("minimum", false, 0, 0); }

TEST(fd_where) {
  evt_graph *g = evt_graph_new("where");
  int c = I(g, "c", EVT_BOOL, EVT_INIT_UNIFORM, 0, 1, SH(3, 4));
  int a = P(g, "a", SH(3, 4));
  int b = P(g, "b", SH(4));
  fd_check(g, OP(g, "where", c, a, b), (fd_opts){0});
  evt_graph_free(g);
}

/* ---- reductions ----------------------------------------------------------------------------------------- */
TEST(fd_sum) {
  evt_graph *g = evt_graph_new("sum");
  int x = P(g, "x", SH(2, 3, 4));
  evt_attr a[] = {LIST("dims", 1)};
  int s = OPA(g, "sum", a, x);
  evt_attr b[] = {LIST("dims", -1), EVT_ATTR_INT("keepdim", 1)};
  fd_check(g, OPA(g, "sum", b, s), (fd_opts){0});
  evt_graph_free(g);
}

TEST(fd_mean) {
  evt_graph *g = evt_graph_new("mean");
  int x = P(g, "x", SH(2, 3, 4));
  evt_attr a[] = {LIST("dims", 0, 2), EVT_ATTR_INT("keepdim", 1)};
  int m = OPA(g, "mean", a, x);
  fd_check(g, OP(g, "mean", m), (fd_opts){0}); /* all dims */
  evt_graph_free(g);
  g = evt_graph_new("mean");
  x = P(g, "x", SH(3, 5));
  evt_attr b[] = {LIST("dims", 1)};
  fd_check(g, OPA(g, "mean", b, x), (fd_opts){0});
  evt_graph_free(g);
}

TEST(fd_amax) {
  evt_graph *g = evt_graph_new("amax");
  int x = P(g, "x", SH(3, 4, 2));
  evt_attr a[] = {LIST("dims", 1)};
  fd_check(g, OPA(g, "amax", a, x), (fd_opts){0});
  evt_graph_free(g);
  g = evt_graph_new("amax");
  x = P(g, "x", SH(3, 4));
  evt_attr b[] = {LIST("dims", 0), EVT_ATTR_INT("keepdim", 1)};
  fd_check(g, OPA(g, "amax", b, x), (fd_opts){0});
  evt_graph_free(g);
}

/* ---- matrix products ------------------------------------------------------------------------------------ */
TEST(fd_mm) {
  evt_graph *g = evt_graph_new("mm");
  int a = P(g, "a", SH(3, 5)), b = P(g, "b", SH(5, 4));
  fd_check(g, OP(g, "mm", a, b), (fd_opts){0});
  evt_graph_free(g);
}

TEST(fd_bmm) {
  evt_graph *g = evt_graph_new("bmm");
  int a = P(g, "a", SH(2, 2, 3, 4)), b = P(g, "b", SH(2, 2, 4, 3));
  fd_check(g, OP(g, "bmm", a, b), (fd_opts){0});
  evt_graph_free(g);
}

TEST(fd_addmm) {
  evt_graph *g = evt_graph_new("addmm");
  int c = P(g, "c", SH(4)), a = P(g, "a", SH(3, 5)), b = P(g, "b", SH(5, 4));
  fd_check(g, OP(g, "addmm", c, a, b), (fd_opts){0});
  evt_graph_free(g);
}

TEST(fd_spmm) {
  /* A: 4 x 5 with 2 nonzeros per row; x param [5, 3] */
  evt_graph *g = evt_graph_new("spmm");
  int rowptr = I(g, "rowptr", EVT_I64, EVT_INIT_ROWPTR, 2, 0, SH(5));
  int col = I(g, "col", EVT_I64, EVT_INIT_RANDINT, 0, 5, SH(8));
  int val = I(g, "val", EVT_F32, EVT_INIT_UNIFORM, -1, 1, SH(8));
  int x = P(g, "x", SH(5, 3));
  fd_check(g, OP(g, "spmm", rowptr, col, val, x), (fd_opts){0});
  evt_graph_free(g);
}

/* ---- convolution and pooling ------------------------------------------------------------------------------ */
TEST(fd_conv2d) {
  evt_graph *g = evt_graph_new("conv2d");
  int x = P(g, "x", SH(2, 4, 5, 5)), w = P(g, "w", SH(6, 2, 3, 3));
  evt_attr a[] = {LIST("stride", 2, 1), LIST("padding", 1, 0), EVT_ATTR_INT("groups", 2)};
  fd_check(g, OPA(g, "conv2d", a, x, w), (fd_opts){0});
  evt_graph_free(g);
  g = evt_graph_new("conv2d");
  x = P(g, "x", SH(1, 2, 6, 5));
  w = P(g, "w", SH(3, 2, 2, 2));
  evt_attr b[] = {LIST("dilation", 2, 1), LIST("padding", 1, 1)};
  fd_check(g, OPA(g, "conv2d", b, x, w), (fd_opts){0});
  evt_graph_free(g);
}

TEST(fd_max_pool2d) {
  evt_graph *g = evt_graph_new("max_pool2d");
  int x = P(g, "x", SH(2, 2, 5, 5));
  evt_attr a[] = {LIST("kernel", 3, 2), LIST("stride", 2, 2), LIST("padding", 1, 1)};
  fd_check(g, OPA(g, "max_pool2d", a, x), (fd_opts){0});
  evt_graph_free(g);
}

TEST(fd_adaptive_max_pool2d) {
  evt_graph *g = evt_graph_new("adaptive_max_pool2d");
  int x = P(g, "x", SH(1, 2, 5, 7));
  evt_attr a[] = {LIST("shape", 2, 3)};
  fd_check(g, OPA(g, "adaptive_max_pool2d", a, x), (fd_opts){0});
  evt_graph_free(g);
}

TEST(fd_avg_pool2d) {
  evt_graph *g = evt_graph_new("avg_pool2d");
  int x = P(g, "x", SH(1, 2, 5, 5));
  evt_attr a[] = {LIST("kernel", 3, 3), LIST("stride", 2, 2), LIST("padding", 1, 1)};
  fd_check(g, OPA(g, "avg_pool2d", a, x), (fd_opts){0});
  evt_graph_free(g);
}

/* layout=nhwc forms: x [N,H,W,C], w [O,kh,kw,C/groups]; the VJP passes the layout to the backward ops */
TEST(fd_conv2d_nhwc) {
  evt_graph *g = evt_graph_new("conv2d_nhwc");
  int x = P(g, "x", SH(2, 5, 5, 4)), w = P(g, "w", SH(6, 3, 3, 2));
  evt_attr a[] = {LIST("stride", 2, 1), LIST("padding", 1, 0), EVT_ATTR_INT("groups", 2),
                  EVT_ATTR_INT("layout", EVT_LAYOUT_NHWC)};
  int y = OPA(g, "conv2d", a, x, w);
  CHECK(y >= 0 && g->nodes[y].type.shape[1] == 3 && g->nodes[y].type.shape[2] == 3 && g->nodes[y].type.shape[3] == 6);
  fd_check(g, y, (fd_opts){0});
  evt_graph_free(g);
  g = evt_graph_new("conv2d_nhwc");
  x = P(g, "x", SH(1, 6, 5, 2));
  w = P(g, "w", SH(3, 2, 2, 2));
  evt_attr b[] = {LIST("dilation", 2, 1), LIST("padding", 1, 1), EVT_ATTR_INT("layout", EVT_LAYOUT_NHWC)};
  fd_check(g, OPA(g, "conv2d", b, x, w), (fd_opts){0});
  evt_graph_free(g);
}

TEST(fd_max_pool2d_nhwc) {
  evt_graph *g = evt_graph_new("max_pool2d_nhwc");
  int x = P(g, "x", SH(2, 5, 5, 3));
  evt_attr a[] = {LIST("kernel", 3, 2), LIST("stride", 2, 2), LIST("padding", 1, 1), EVT_ATTR_INT("layout", EVT_LAYOUT_NHWC)};
  fd_check(g, OPA(g, "max_pool2d", a, x), (fd_opts){0});
  evt_graph_free(g);
}

TEST(fd_adaptive_max_pool2d_nhwc) {
  evt_graph *g = evt_graph_new("adaptive_max_pool2d_nhwc");
  int x = P(g, "x", SH(1, 5, 7, 2));
  evt_attr a[] = {LIST("shape", 2, 3), EVT_ATTR_INT("layout", EVT_LAYOUT_NHWC)};
  int y = OPA(g, "adaptive_max_pool2d", a, x);
  CHECK(y >= 0 && g->nodes[y].type.shape[1] == 2 && g->nodes[y].type.shape[2] == 3 && g->nodes[y].type.shape[3] == 2);
  fd_check(g, y, (fd_opts){0});
  evt_graph_free(g);
}

TEST(fd_avg_pool2d_nhwc) {
  evt_graph *g = evt_graph_new("avg_pool2d_nhwc");
  int x = P(g, "x", SH(1, 5, 5, 2));
  evt_attr a[] = {LIST("kernel", 3, 3), LIST("stride", 2, 2), LIST("padding", 1, 1), EVT_ATTR_INT("layout", EVT_LAYOUT_NHWC)};
  fd_check(g, OPA(g, "avg_pool2d", a, x), (fd_opts){0});
  evt_graph_free(g);
}

/* ---- row ops ---------------------------------------------------------------------------------------------- */
TEST(fd_softmax) {
  evt_graph *g = evt_graph_new("softmax");
  int x = P(g, "x", SH(3, 5));
  evt_attr a[] = {EVT_ATTR_INT("dim", 1)};
  fd_check(g, OPA(g, "softmax", a, x), (fd_opts){0});
  evt_graph_free(g);
}

TEST(fd_log_softmax) {
  evt_graph *g = evt_graph_new("log_softmax");
  int x = P(g, "x", SH(4, 3));
  evt_attr a[] = {EVT_ATTR_INT("dim", 0)};
  fd_check(g, OPA(g, "log_softmax", a, x), (fd_opts){0});
  evt_graph_free(g);
}

TEST(fd_layer_norm) {
  evt_graph *g = evt_graph_new("layer_norm");
  int x = P(g, "x", SH(2, 3, 5)), w = P(g, "w", SH(5)), b = P(g, "b", SH(5));
  fd_check(g, OP(g, "layer_norm", x, w, b), (fd_opts){0});
  evt_graph_free(g);
  g = evt_graph_new("layer_norm");
  x = P(g, "x", SH(4, 6));
  fd_check(g, OP(g, "layer_norm", x), (fd_opts){0});
  evt_graph_free(g);
}

TEST(fd_batch_norm) {
  evt_graph *g = evt_graph_new("batch_norm");
  int x = P(g, "x", SH(4, 3, 2, 2)), w = P(g, "w", SH(3)), b = P(g, "b", SH(3));
  fd_check(g, OP(g, "batch_norm", x, w, b), (fd_opts){0});
  evt_graph_free(g);
  g = evt_graph_new("batch_norm");
  x = P(g, "x", SH(5, 3));
  fd_check(g, OP(g, "batch_norm", x), (fd_opts){0});
  evt_graph_free(g);
}

TEST(fd_dropout) {
  evt_graph *g = evt_graph_new("dropout");
  int x = P(g, "x", SH(4, 6));
  evt_attr a[] = {EVT_ATTR_FLOAT("p", 0.3), EVT_ATTR_INT("seed", 7), EVT_ATTR_INT("offset", 5)};
  fd_check(g, OPA(g, "dropout", a, x), (fd_opts){0});
  evt_graph_free(g);
}

/* ---- losses ------------------------------------------------------------------------------------------------ */
TEST(fd_nll_loss) {
  for (int red = 0; red < EVT_REDUCTION_COUNT; red++) {
    evt_graph *g = evt_graph_new("nll_loss");
    int lp = P(g, "logp", SH(5, 4));
    int t = I(g, "t", EVT_I64, EVT_INIT_RANDINT, 0, 4, SH(5));
    evt_attr a[] = {EVT_ATTR_INT("reduction", red), EVT_ATTR_INT("ignore_index", 2)};
    fd_check(g, OPA(g, "nll_loss", a, lp, t), (fd_opts){0});
    evt_graph_free(g);
  }
}

TEST(fd_cross_entropy) {
  for (int red = 0; red < EVT_REDUCTION_COUNT; red++) {
    evt_graph *g = evt_graph_new("cross_entropy");
    int z = P(g, "z", SH(5, 4));
    int t = I(g, "t", EVT_I64, EVT_INIT_RANDINT, 0, 4, SH(5));
    evt_attr a[] = {EVT_ATTR_INT("reduction", red)};
    fd_check(g, OPA(g, "cross_entropy", a, z, t), (fd_opts){0});
    evt_graph_free(g);
  }
}

TEST(fd_bce_with_logits) {
  for (int red = 0; red < EVT_REDUCTION_COUNT; red++) {
    evt_graph *g = evt_graph_new("bce_with_logits");
    int x = P(g, "x", SH(3, 4));
    int y = PU(g, "y", 0.0, 1.0, SH(3, 4)); /* a trainable target: its gradient is -x */
    evt_attr a[] = {EVT_ATTR_INT("reduction", red)};
    fd_check(g, OPA(g, "bce_with_logits", a, x, y), (fd_opts){0});
    evt_graph_free(g);
  }
}

TEST(fd_mse_loss) {
  for (int red = 0; red < EVT_REDUCTION_COUNT; red++) {
    evt_graph *g = evt_graph_new("mse_loss");
    int a = P(g, "a", SH(3, 4)), b = P(g, "b", SH(3, 4));
    evt_attr at[] = {EVT_ATTR_INT("reduction", red)};
    fd_check(g, OPA(g, "mse_loss", at, a, b), (fd_opts){0});
    evt_graph_free(g);
  }
}

/* ---- gathers ------------------------------------------------------------------------------------------------ */
TEST(fd_embedding) {
  evt_graph *g = evt_graph_new("embedding");
  int w = P(g, "w", SH(7, 3));
  int idx = I(g, "idx", EVT_I64, EVT_INIT_RANDINT, 0, 7, SH(2, 5));
  fd_check(g, OP(g, "embedding", w, idx), (fd_opts){0});
  evt_graph_free(g);
}

TEST(fd_index_select) {
  evt_graph *g = evt_graph_new("index_select");
  int x = P(g, "x", SH(3, 5, 2));
  int idx = I(g, "idx", EVT_I64, EVT_INIT_RANDINT, 0, 5, SH(6));
  evt_attr a[] = {EVT_ATTR_INT("dim", 1)};
  fd_check(g, OPA(g, "index_select", a, x, idx), (fd_opts){0});
  evt_graph_free(g);
}

TEST(fd_index_select_backward) { /* a scatter-add (message passing's aggregation), duplicate indices likely */
  evt_graph *g = evt_graph_new("index_select_backward");
  int dy = P(g, "dy", SH(3, 6, 2));
  int idx = I(g, "idx", EVT_I64, EVT_INIT_RANDINT, 0, 4, SH(6));
  evt_attr a[] = {EVT_ATTR_INT("dim", 1), LIST("shape", 3, 4, 2)};
  fd_check(g, OPA(g, "index_select_backward", a, dy, idx), (fd_opts){0});
  evt_graph_free(g);
}

/* ---- layout ------------------------------------------------------------------------------------------------- */
TEST(fd_reshape) {
  evt_graph *g = evt_graph_new("reshape");
  int x = P(g, "x", SH(3, 4));
  evt_attr a[] = {LIST("shape", 2, 6)};
  fd_check(g, OPA(g, "reshape", a, x), (fd_opts){0});
  evt_graph_free(g);
}

TEST(fd_permute) {
  evt_graph *g = evt_graph_new("permute");
  int x = P(g, "x", SH(2, 3, 4));
  evt_attr a[] = {LIST("dims", 2, 0, 1)};
  fd_check(g, OPA(g, "permute", a, x), (fd_opts){0});
  evt_graph_free(g);
}

TEST(fd_transpose) {
  evt_graph *g = evt_graph_new("transpose");
  int x = P(g, "x", SH(2, 3, 4));
  evt_attr a[] = {LIST("dims", 0, 2)};
  fd_check(g, OPA(g, "transpose", a, x), (fd_opts){0});
  evt_graph_free(g);
}

TEST(fd_expand) {
  evt_graph *g = evt_graph_new("expand");
  int x = P(g, "x", SH(3, 1));
  evt_attr a[] = {LIST("shape", 2, 3, 4)};
  fd_check(g, OPA(g, "expand", a, x), (fd_opts){0});
  evt_graph_free(g);
}

TEST(fd_slice) {
  evt_graph *g = evt_graph_new("slice");
  int x = P(g, "x", SH(3, 7));
  evt_attr a[] = {EVT_ATTR_INT("dim", 1), EVT_ATTR_INT("start", 1), EVT_ATTR_INT("end", 6), EVT_ATTR_INT("step", 2)};
  fd_check(g, OPA(g, "slice", a, x), (fd_opts){0});
  evt_graph_free(g);
}

TEST(fd_concat) {
  evt_graph *g = evt_graph_new("concat");
  int a = P(g, "a", SH(2, 1, 3)), b = P(g, "b", SH(2, 3, 3)), c = P(g, "c", SH(2, 2, 3));
  evt_attr at[] = {EVT_ATTR_INT("dim", 1)};
  fd_check(g, OPA(g, "concat", at, a, b, c), (fd_opts){0});
  evt_graph_free(g);
}

TEST(fd_squeeze) {
  evt_graph *g = evt_graph_new("squeeze");
  int x = P(g, "x", SH(3, 1, 4));
  evt_attr a[] = {EVT_ATTR_INT("dim", 1)};
  fd_check(g, OPA(g, "squeeze", a, x), (fd_opts){0});
  evt_graph_free(g);
}

TEST(fd_unsqueeze) {
  evt_graph *g = evt_graph_new("unsqueeze");
  int x = P(g, "x", SH(3, 4));
  evt_attr a[] = {EVT_ATTR_INT("dim", 0)};
  fd_check(g, OPA(g, "unsqueeze", a, x), (fd_opts){0});
  evt_graph_free(g);
}

/* ---- attention ---------------------------------------------------------------------------------------------- */
TEST(fd_sdpa) {
  for (int causal = 0; causal < 2; causal++) {
    evt_graph *g = evt_graph_new("sdpa");
    int q = P(g, "q", SH(1, 2, 3, 4)), k = P(g, "k", SH(1, 2, 5, 4)), v = P(g, "v", SH(1, 2, 5, 2));
    evt_attr a[] = {EVT_ATTR_INT("causal", causal)};
    fd_check(g, OPA(g, "sdpa", a, q, k, v), (fd_opts){0});
    evt_graph_free(g);
  }
}

/* Masked attention: a constant float mask broadcast over heads, a bool mask (from a comparison) broadcast over
 * queries; a float mask that depends on a parameter is refused, naming the node. */
TEST(fd_sdpa_mask) {
  for (int c = 0; c < 4; c++) {
    evt_graph *g = evt_graph_new("sdpa_mask");
    int q = P(g, "q", SH(1, 2, 3, 4)), k = P(g, "k", SH(1, 2, 5, 4)), v = P(g, "v", SH(1, 2, 5, 2));
    int64_t ms[4] = {1, 1, c % 2 ? 1 : 3, 5};
    int m = I(g, "m", EVT_F32, EVT_INIT_UNIFORM, -1, 1, ms, 4);
    if (c % 2) m = OP(g, "gt", m, OP(g, "neg", m)); /* bool: about half the keys kept */
    evt_attr a[] = {EVT_ATTR_INT("causal", c / 2)};
    fd_check(g, OPA(g, "sdpa", a, q, k, v, m), (fd_opts){0});
    evt_graph_free(g);
  }
  evt_graph *g = evt_graph_new("sdpa_mask_param");
  int q = P(g, "q", SH(1, 2, 3, 4)), m = P(g, "m", SH(3, 3));
  int o = OP(g, "sdpa", q, q, q, m);
  CHECK(evt_graph_set_name(g, o, "att") == EVT_OK);
  CHECK(evt_graph_set_loss(g, OP(g, "sum", o)) == EVT_OK);
  CHECK(evt_graph_build_joint(g, 0) == EVT_ERR_UNSUPPORTED);
  CHECK(strstr(evt_graph_error(g), "%att") != NULL && strstr(evt_graph_error(g), "float mask") != NULL);
  evt_graph_free(g);
}

/* ---- the joint graph as a whole ------------------------------------------------------------------------------- */

TEST(autodiff_accumulates_uses) {
  /* y = a * a + exp(a): three uses of a, the gradient sums them with add */
  evt_graph *g = evt_graph_new("acc");
  int a = P(g, "a", SH(3, 4));
  int y = OP(g, "add", OP(g, "mul", a, a), OP(g, "exp", a));
  int nf = g->nnodes;
  fd_check(g, y, (fd_opts){0});
  int adds = 0;
  for (int i = nf; i < g->nnodes; i++) adds += g->nodes[i].op == EVT_OP_ADD;
  CHECK(adds >= 2);
  evt_graph_free(g);
}

TEST(autodiff_broadcast_reduces_to_operand) {
  /* bias [4] and a [3,1] added to x [2,3,4]: gradients are sums over the broadcast dims */
  evt_graph *g = evt_graph_new("bcast");
  int x = P(g, "x", SH(2, 3, 4)), b = P(g, "b", SH(4)), a = P(g, "a", SH(3, 1));
  int y = OP(g, "add", OP(g, "add", x, b), a);
  fd_check(g, y, (fd_opts){0});
  int gb = evt_graph_find(g, "grad.b"), ga = evt_graph_find(g, "grad.a");
  CHECK(gb >= 0 && ga >= 0);
  if (gb >= 0 && ga >= 0) {
    CHECK(evt_type_equal(&g->nodes[gb].type, &g->nodes[b].type));
    CHECK(evt_type_equal(&g->nodes[ga].type, &g->nodes[a].type));
  }
  evt_graph_free(g);
}

/* Random shapes: b and c drop leading dims and have random size-1 dims; two binary ops in a chain, the
 * first result used twice. Exercises reduce-to-operand on many broadcast patterns. */
TEST(autodiff_random_broadcast_graphs) {
  static const char *const ops[] = {"add", "sub", "mul", "div", "maximum", "minimum"};
  for (int trial = 0; trial < 16; trial++) {
    evt_graph *g = evt_graph_new("random");
    int rank = (int)dimr(1, 4);
    int64_t full[EVT_MAX_RANK], sb[EVT_MAX_RANK], sc[EVT_MAX_RANK];
    for (int i = 0; i < rank; i++) full[i] = dimr(2, 3);
    int rb = (int)dimr(0, rank), rc = (int)dimr(1, rank);
    for (int i = 0; i < rb; i++) sb[i] = urand() < 0.5 ? 1 : full[rank - rb + i];
    for (int i = 0; i < rc; i++) sc[i] = urand() < 0.4 ? 1 : full[rank - rc + i];
    int a = P(g, "a", full, rank);
    int b = PU(g, "b", 0.5, 2.0, sb, rb);
    int c = PU(g, "c", 0.5, 2.0, sc, rc);
    const char *o1 = ops[(int)(urand() * 6)], *o2 = ops[(int)(urand() * 6)];
    int y = OP(g, o1, a, b);
    int z = OP(g, o2, c, OP(g, "mul", y, y));
    CHECK_MSG(z >= 0, "trial %d: %s then %s", trial, o1, o2);
    fd_check(g, OP(g, "add", z, y), (fd_opts){0});
    evt_graph_free(g);
  }
}

TEST(autodiff_rank0_param_mixed_dtype) {
  /* a rank-0 f32 param scaling a bf16 tensor: the gradient is summed and cast back to f32 */
  evt_graph *g = evt_graph_new("mixed");
  int x = P(g, "x", SH(3, 4));
  int s = evt_param(g, "s", EVT_F32, 0, NULL);
  evt_attr a[] = {EVT_ATTR_INT("dtype", EVT_BF16)};
  int y = OP(g, "mul", OPA(g, "cast", a, x), s);
  fd_check(g, y, (fd_opts){0});
  int gs = evt_graph_find(g, "grad.s");
  CHECK(gs >= 0 && g->nodes[gs].type.dtype == EVT_F32 && g->nodes[gs].type.rank == 0);
  evt_graph_free(g);
}

TEST(autodiff_unused_param_gets_zeros) {
  evt_graph *g = evt_graph_new("unused");
  int w = P(g, "w", SH(3));
  int u = P(g, "u", SH(2, 2));
  int loss = OP(g, "sum", OP(g, "mul", w, w));
  CHECK(evt_graph_set_loss(g, loss) == EVT_OK);
  CHECK(evt_graph_build_joint(g, 0) == EVT_OK);
  CHECK(g->noutputs == 3);
  int gu = evt_graph_find(g, "grad.u");
  CHECK(gu >= 0 && g->outputs[2] == gu);
  if (gu >= 0) {
    CHECK(g->nodes[gu].op == EVT_OP_FULL && g->nodes[gu].attr.value == 0.0);
    CHECK(evt_type_equal(&g->nodes[gu].type, &g->nodes[u].type));
  }
  evt_tensor *v = calloc((size_t)g->nnodes, sizeof *v);
  fill_sources(g, v, false);
  run_loss(g, v);
  if (gu >= 0)
    for (int i = 0; i < 4; i++) CHECK(v[gu].data[i] == 0.0);
  free_values(g, v);
  evt_graph_free(g);
}

TEST(autodiff_outputs_order_and_inputs_flag) {
  /* forward extra outputs are dropped; params in id order, then floating inputs with EVT_GRAD_INPUTS */
  evt_graph *g = evt_graph_new("order");
  int x = I(g, "x", EVT_F32, EVT_INIT_NORMAL, 0, 1, SH(2, 3));
  int w2 = P(g, "w2", SH(3, 3));
  int t = I(g, "t", EVT_I64, EVT_INIT_RANDINT, 0, 3, SH(2));
  int w1 = P(g, "w1", SH(3, 3));
  int h = OP(g, "mm", OP(g, "mm", x, w2), w1);
  int loss = OP(g, "cross_entropy", h, t);
  CHECK(evt_graph_add_output(g, h) == EVT_OK);
  CHECK(evt_graph_set_loss(g, loss) == EVT_OK);
  CHECK(g->noutputs == 2);
  CHECK(evt_graph_build_joint(g, EVT_GRAD_INPUTS) == EVT_OK);
  CHECK(g->noutputs == 4);
  if (g->noutputs == 4) {
    CHECK(g->outputs[0] == loss);
    CHECK(!strcmp(g->nodes[g->outputs[1]].name, "grad.w2"));
    CHECK(!strcmp(g->nodes[g->outputs[2]].name, "grad.w1"));
    CHECK(!strcmp(g->nodes[g->outputs[3]].name, "grad.x"));
  }
  CHECK(!(g->nodes[h].flags & EVT_NODE_OUTPUT));
  evt_graph_free(g);
  /* the same graph with inputs differentiated passes the FD check for x too */
  g = evt_graph_new("order");
  x = I(g, "x", EVT_F32, EVT_INIT_NORMAL, 0, 1, SH(2, 3));
  w1 = P(g, "w1", SH(3, 3));
  t = I(g, "t", EVT_I64, EVT_INIT_RANDINT, 0, 3, SH(2));
  loss = OP(g, "cross_entropy", OP(g, "mm", x, w1), t);
  CHECK(evt_graph_set_loss(g, loss) == EVT_OK);
  fd_check_loss(g, (fd_opts){.flags = EVT_GRAD_INPUTS});
  evt_graph_free(g);
}

TEST(autodiff_shared_gradient_gets_own_names) {
  /* loss = a + b (scalars): both gradients are the seed; each name gets its own node */
  evt_graph *g = evt_graph_new("shared");
  int a = evt_param(g, "a", EVT_F32, 0, NULL), b = evt_param(g, "b", EVT_F32, 0, NULL);
  int loss = OP(g, "add", a, b);
  CHECK(evt_graph_set_loss(g, loss) == EVT_OK);
  CHECK(evt_graph_build_joint(g, 0) == EVT_OK);
  int ga = evt_graph_find(g, "grad.a"), gb = evt_graph_find(g, "grad.b");
  CHECK(ga >= 0 && gb >= 0 && ga != gb);
  evt_tensor *v = calloc((size_t)g->nnodes, sizeof *v);
  fill_sources(g, v, false);
  run_loss(g, v);
  if (ga >= 0 && gb >= 0) {
    CHECK(v[ga].data[0] == 1.0);
    CHECK(v[gb].data[0] == 1.0);
  }
  free_values(g, v);
  evt_graph_free(g);
}

TEST(autodiff_ties_split_evenly) {
  /* amax over [2, 5, 5, 1]: the two maxima share dy; maximum(a, a'): equal values share dy / 2 */
  evt_graph *g = evt_graph_new("ties");
  int x = P(g, "x", SH(4));
  int a = P(g, "a", SH(2)), b = P(g, "b", SH(2));
  int l1 = OP(g, "amax", x);
  int l2 = OP(g, "sum", OP(g, "maximum", a, b));
  int l3 = OP(g, "sum", OP(g, "minimum", a, b));
  int loss = OP(g, "add", l1, OP(g, "add", l2, OP(g, "mul", l3, l3)));
  CHECK(evt_graph_set_loss(g, loss) == EVT_OK);
  CHECK(evt_graph_build_joint(g, 0) == EVT_OK);
  evt_tensor *v = calloc((size_t)g->nnodes, sizeof *v);
  fill_sources(g, v, false);
  const double xs[] = {2, 5, 5, 1}, as[] = {1, 3}, bs[] = {1, 2};
  memcpy(v[x].data, xs, sizeof xs);
  memcpy(v[a].data, as, sizeof as);
  memcpy(v[b].data, bs, sizeof bs);
  run_loss(g, v);
  int gx = g->outputs[1], ga = g->outputs[2], gb = g->outputs[3];
  const double want_x[] = {0, 0.5, 0.5, 0};
  for (int i = 0; i < 4; i++) CHECK_NEAR(v[gx].data[i], want_x[i], 0);
  /* l3 = min(1,1) + min(3,2) = 3, d(l3^2)/d l3 = 6: ties get 0.5 + 3, else winner only */
  CHECK_NEAR(v[ga].data[0], 0.5 + 3.0, 1e-12);
  CHECK_NEAR(v[gb].data[0], 0.5 + 3.0, 1e-12);
  CHECK_NEAR(v[ga].data[1], 1.0, 1e-12);
  CHECK_NEAR(v[gb].data[1], 6.0, 1e-12);
  free_values(g, v);
  evt_graph_free(g);
}

TEST(autodiff_origin_labels) {
  evt_graph *g = evt_graph_new("origin");
  int x = P(g, "x", SH(2, 3));
  int h = OP(g, "tanh", x);
  CHECK(evt_graph_set_name(g, h, "h") == EVT_OK);
  int loss = OP(g, "sum", h);
  CHECK(evt_graph_set_loss(g, loss) == EVT_OK);
  int nf = g->nnodes;
  CHECK(evt_graph_build_joint(g, 0) == EVT_OK);
  int labelled = 0;
  for (int i = nf; i < g->nnodes; i++) {
    const char *l = g->nodes[i].origin.label;
    CHECK(l && !strncmp(l, "grad of %", 9));
    labelled += l && !strcmp(l, "grad of %h");
  }
  CHECK(labelled >= 1);
  evt_graph_free(g);
}

TEST(autodiff_mlp) {
  /* x -> mm w1 + b1 -> gelu -> layer_norm(g, b) -> mm w2 + b2 -> cross_entropy */
  evt_graph *g = evt_graph_new("mlp");
  int x = I(g, "x", EVT_F32, EVT_INIT_NORMAL, 0, 1, SH(4, 5));
  int t = I(g, "t", EVT_I64, EVT_INIT_RANDINT, 0, 3, SH(4));
  int w1 = P(g, "w1", SH(5, 6)), b1 = P(g, "b1", SH(6));
  int lw = PU(g, "ln_w", 0.5, 1.5, SH(6)), lb = P(g, "ln_b", SH(6));
  int w2 = P(g, "w2", SH(6, 3)), b2 = P(g, "b2", SH(3));
  int h = OP(g, "gelu", OP(g, "add", OP(g, "mm", x, w1), b1));
  int n = OP(g, "layer_norm", h, lw, lb);
  int z = OP(g, "add", OP(g, "mm", n, w2), b2);
  int loss = OP(g, "cross_entropy", z, t);
  CHECK(evt_graph_set_loss(g, loss) == EVT_OK);
  int checked = fd_check_loss(g, (fd_opts){0});
  CHECK(checked == 30 + 6 + 6 + 6 + 18 + 3);
  evt_graph_free(g);
}

/* ---- errors ------------------------------------------------------------------------------------------------ */

TEST(autodiff_error_no_loss) {
  evt_graph *g = evt_graph_new("noloss");
  int x = P(g, "x", SH(2));
  OP(g, "exp", x);
  CHECK(evt_graph_build_joint(g, 0) == EVT_ERR_INVALID);
  CHECK(strstr(evt_graph_error(g), "no loss") != NULL);
  CHECK(evt_graph_build_joint(NULL, 0) == EVT_ERR_INVALID);
  evt_graph_free(g);
}

TEST(autodiff_error_loss_not_scalar) {
  evt_graph *g = evt_graph_new("vecloss");
  int x = P(g, "x", SH(2, 3));
  int y = OP(g, "exp", x);
  CHECK(evt_graph_set_name(g, y, "y") == EVT_OK);
  g->loss = y; /* as a frontend could set it without evt_graph_set_loss's check */
  int nf = g->nnodes;
  CHECK(evt_graph_build_joint(g, 0) == EVT_ERR_INVALID);
  CHECK(strstr(evt_graph_error(g), "%y") != NULL);
  CHECK(strstr(evt_graph_error(g), "scalar") != NULL);
  CHECK(g->nnodes == nf);
  evt_graph_free(g);
}

TEST(autodiff_error_no_rule_on_path) {
  /* gelu_backward has no VJP: differentiating through it fails, names the node, leaves g as it was */
  evt_graph *g = evt_graph_new("norule");
  int x = P(g, "x", SH(2, 3)), d = P(g, "d", SH(2, 3));
  int y = OP(g, "gelu_backward", d, x);
  CHECK(evt_graph_set_name(g, y, "gb") == EVT_OK);
  int loss = OP(g, "sum", OP(g, "exp", y));
  CHECK(evt_graph_set_loss(g, loss) == EVT_OK);
  int nf = g->nnodes, no = g->noutputs;
  CHECK(evt_graph_build_joint(g, 0) == EVT_ERR_UNSUPPORTED);
  CHECK(strstr(evt_graph_error(g), "%gb") != NULL);
  CHECK(strstr(evt_graph_error(g), "gelu_backward") != NULL);
  CHECK(g->nnodes == nf && g->noutputs == no && g->outputs[0] == loss);
  /* a rule-less op that does not lead to a param is fine */
  evt_graph *g2 = evt_graph_new("offpath");
  int d2 = I(g2, "d", EVT_F32, EVT_INIT_NORMAL, 0, 1, SH(2, 3));
  int x2 = P(g2, "x", SH(2, 3));
  int y2 = OP(g2, "gelu_backward", d2, d2);
  int loss2 = OP(g2, "sum", OP(g2, "mul", y2, x2));
  CHECK(evt_graph_set_loss(g2, loss2) == EVT_OK);
  CHECK(evt_graph_build_joint(g2, 0) == EVT_OK);
  evt_graph_free(g2);
  evt_graph_free(g);
}

TEST(autodiff_error_spmm_values) {
  evt_graph *g = evt_graph_new("spmmval");
  int rowptr = I(g, "rowptr", EVT_I64, EVT_INIT_ROWPTR, 1, 0, SH(3));
  int col = I(g, "col", EVT_I64, EVT_INIT_RANDINT, 0, 2, SH(2));
  int val = P(g, "val", SH(2));
  int x = P(g, "x", SH(2, 2));
  int loss = OP(g, "sum", OP(g, "spmm", rowptr, col, val, x));
  CHECK(evt_graph_set_loss(g, loss) == EVT_OK);
  CHECK(evt_graph_build_joint(g, 0) == EVT_ERR_UNSUPPORTED);
  CHECK(strstr(evt_graph_error(g), "%val") != NULL);
  evt_graph_free(g);
}

TEST(autodiff_error_reserved_name) {
  evt_graph *g = evt_graph_new("reserved");
  int w = P(g, "w", SH(2));
  int y = OP(g, "exp", w);
  CHECK(evt_graph_set_name(g, y, "grad.w") == EVT_OK);
  CHECK(evt_graph_set_loss(g, OP(g, "sum", y)) == EVT_OK);
  CHECK(evt_graph_build_joint(g, 0) == EVT_ERR_INVALID);
  CHECK(strstr(evt_graph_error(g), "grad.w") != NULL);
  CHECK(evt_graph_build_joint(g, 0x80) == EVT_ERR_INVALID);
  evt_graph_free(g);
}

/* ---- coverage ----------------------------------------------------------------------------------------------- */

/* Every op with a VJP rule (F_DIFF in ops.def) has an fd_<op> test above: add the op here with its test. */
TEST(autodiff_every_diff_op_has_fd_test) {
  static const char *const covered[] = {
      "neg", "exp", "log", "sqrt", "rsqrt", "reciprocal", "abs", "sign", "tanh", "sigmoid", "relu", "gelu", "erf",
      "cast", "pow", "add", "sub", "mul", "div", "maximum", "minimum", "where", "sum", "mean", "amax", "mm", "bmm",
      "addmm", "spmm", "conv2d", "max_pool2d", "adaptive_max_pool2d", "avg_pool2d", "softmax", "log_softmax",
      "layer_norm", "batch_norm", "dropout", "nll_loss", "cross_entropy", "bce_with_logits", "mse_loss", "embedding",
      "index_select", "index_select_backward", "reshape", "permute", "transpose", "expand", "slice", "concat", "squeeze", "unsqueeze", "sdpa"};
  for (int op = 0; op < EVT_OP_COUNT; op++) {
    bool diff = evt_op_table[op].flags & EVT_OPF_DIFF, found = false;
    for (int i = 0; i < EVT_ARRAY_LEN(covered); i++) found |= !strcmp(covered[i], evt_op_table[op].name);
    CHECK_MSG(diff == found, "op %s: F_DIFF=%d but %s an fd_ test", evt_op_table[op].name, diff,
              found ? "has" : "has no");
  }
}

/* ---- random graphs ------------------------------------------------------------------------------------------ */

/* Adds one random op on random earlier float nodes (attributes random too); -1 if inference refused it. */
static int random_op(evt_graph *g, bool smooth) {
  static const char *const smooth_ops[] = {"neg", "exp", "tanh", "sigmoid", "gelu", "erf", "add", "sub", "mul",
                                           "sum", "mean", "permute", "transpose", "reshape", "unsqueeze", "squeeze",
                                           "expand", "slice", "concat", "softmax", "log_softmax", "layer_norm", "mm",
                                           "where"};
  static const char *const kinked_ops[] = {"relu", "abs", "maximum", "minimum", "amax", "sign"};
  int nsmooth = EVT_ARRAY_LEN(smooth_ops), nk = smooth ? 0 : EVT_ARRAY_LEN(kinked_ops);
  int pick = (int)(urand() * (nsmooth + nk));
  const char *name = pick < nsmooth ? smooth_ops[pick] : kinked_ops[pick - nsmooth];
  int floats[256], nf = 0;
  for (int i = 0; i < g->nnodes && nf < 256; i++)
    if (evt_dtype_is_float(g->nodes[i].type.dtype)) floats[nf++] = i;
  int a = floats[(int)(urand() * nf)], b = floats[(int)(urand() * nf)];
  const evt_type *t = &g->nodes[a].type;
  int r = t->rank;
  int64_t d0 = r ? (int64_t)(urand() * r) : 0, d1 = r ? (int64_t)(urand() * r) : 0;
  evt_attr at[2];
  int nat = 0, in[2] = {a, b}, nin = 1;
  const char *kind = name;
  if (!strcmp(name, "add") || !strcmp(name, "sub") || !strcmp(name, "mul") || !strcmp(name, "maximum") ||
      !strcmp(name, "minimum"))
    nin = 2;
  else if (!strcmp(name, "sum") || !strcmp(name, "mean") || !strcmp(name, "amax")) {
    at[nat++] = (evt_attr){.name = "dims", .n = urand() < 0.3 ? 0 : 1, .list = {d0}};
    at[nat++] = EVT_ATTR_INT("keepdim", urand() < 0.5);
  } else if (!strcmp(name, "permute")) {
    evt_attr p = {.name = "dims", .n = r};
    for (int i = 0; i < r; i++) p.list[i] = i;
    for (int i = r - 1; i > 0; i--) {
      int j = (int)(urand() * (i + 1));
      int64_t s = p.list[i];
      p.list[i] = p.list[j];
      p.list[j] = s;
    }
    at[nat++] = p;
  } else if (!strcmp(name, "transpose")) {
    at[nat++] = LIST("dims", d0, d1);
  } else if (!strcmp(name, "reshape")) {
    evt_attr p = {.name = "shape", .n = r};
    for (int i = 0; i < r; i++) p.list[i] = t->shape[r - 1 - i];
    at[nat++] = p;
  } else if (!strcmp(name, "unsqueeze") || !strcmp(name, "squeeze") || !strcmp(name, "softmax") ||
             !strcmp(name, "log_softmax")) {
    at[nat++] = EVT_ATTR_INT("dim", !strcmp(name, "unsqueeze") ? (int64_t)(urand() * (r + 1)) : d0);
  } else if (!strcmp(name, "expand")) {
    evt_attr p = {.name = "shape", .n = r + 1};
    p.list[0] = 2;
    for (int i = 0; i < r; i++) p.list[i + 1] = t->shape[i] == 1 ? 3 : t->shape[i];
    at[nat++] = p;
  } else if (!strcmp(name, "slice")) {
    at[nat++] = EVT_ATTR_INT("dim", d0);
    at[nat++] = EVT_ATTR_INT("start", 1);
  } else if (!strcmp(name, "concat")) {
    nin = 2;
    in[1] = a;
    at[nat++] = EVT_ATTR_INT("dim", d0);
  } else if (!strcmp(name, "mm")) {
    evt_attr p = LIST("dims", 0, 1);
    int tr = evt_add_op(g, "transpose", &a, 1, &p, 1);
    if (tr < 0) return -1;
    in[1] = tr;
    nin = 2;
  } else if (!strcmp(name, "where")) {
    int c = evt_add_op(g, "gt", (int[]){a, b}, 2, NULL, 0);
    if (c < 0) return -1;
    int w = evt_add_op(g, "where", (int[]){c, a, b}, 3, NULL, 0);
    (void)kind;
    return w;
  }
  return evt_add_op(g, name, in, nin, at, nat);
}

static evt_graph *random_graph(int nops, bool smooth) {
  evt_graph *g = evt_graph_new("random");
  int nparams = (int)dimr(1, 3);
  for (int p = 0; p < nparams; p++) {
    char nm[16];
    snprintf(nm, sizeof nm, "p%d", p);
    int64_t s[3] = {dimr(1, 4), dimr(2, 4), dimr(1, 3)};
    P(g, nm, s, (int)dimr(1, 3));
  }
  I(g, "x", EVT_F32, EVT_INIT_NORMAL, 0, 1, SH(3));
  for (int k = 0, tries = 0; k < nops && tries < 20 * nops; tries++) {
    int id = random_op(g, smooth);
    if (id >= 0 && evt_type_numel(&g->nodes[id].type) <= 256) k++;
  }
  return g;
}

TEST(autodiff_random_graphs_verify) {
  /* build_joint on random graphs: never an internal error; the joint graph passes the verifier */
  int ok = 0;
  for (int trial = 0; trial < 500; trial++) {
    evt_graph *g = random_graph((int)dimr(1, 16), false);
    int last = g->nnodes - 1;
    while (!evt_dtype_is_float(g->nodes[last].type.dtype)) last--;
    int loss = evt_add_op(g, "sum", &last, 1, NULL, 0);
    CHECK(loss >= 0 && evt_graph_set_loss(g, loss) == EVT_OK);
    evt_status st = evt_graph_build_joint(g, trial % 2 ? EVT_GRAD_INPUTS : 0);
    CHECK_MSG(st == EVT_OK, "trial %d: %s", trial, evt_graph_error(g));
    if (st == EVT_OK) {
      st = evt_graph_verify(g);
      CHECK_MSG(st == EVT_OK, "trial %d: verify: %s", trial, evt_graph_error(g));
      ok += st == EVT_OK;
    }
    evt_graph_free(g);
  }
  CHECK(ok == 500);
}

TEST(autodiff_random_graphs_fd) {
  /* smooth random graphs (no kinks, no ties) pass the finite-difference check */
  for (int trial = 0; trial < 150; trial++) {
    evt_graph *g = random_graph((int)dimr(3, 14), true);
    int last = g->nnodes - 1;
    while (!evt_dtype_is_float(g->nodes[last].type.dtype)) last--;
    fd_check(g, last, (fd_opts){0});
    evt_graph_free(g);
  }
}
