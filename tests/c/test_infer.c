/* Shape/dtype inference (src/ir/infer.c) and the verifier (src/ir/verify.c): for every op a valid case
 * with its inferred type, and for every rule family an invalid case that fails with EVT_ERR_TYPE and a
 * message naming the node. Graphs are built with the public builder. */
#include "test.h"

#include <string.h>

#define SHP(...) ((int64_t[]){__VA_ARGS__})
#define INS(...) ((int[]){__VA_ARGS__})
#define NIN(...) (int)(sizeof((int[]){__VA_ARGS__}) / sizeof(int))

/* Checks node id has type dt[shape...]. */
static bool covered[EVT_OP_COUNT];  /* ops with a passing valid case (infer_every_op_covered) */

static bool has_type(evt_graph *g, int id, evt_dtype dt, int rank, const int64_t *shape) {
  if (id < 0 || id >= g->nnodes) return false;
  covered[g->nodes[id].op] = true;
  const evt_type *t = &g->nodes[id].type;
  if (t->dtype != dt || t->rank != rank) return false;
  for (int i = 0; i < rank; i++)
    if (t->shape[i] != shape[i]) return false;
  int64_t s = 1;
  for (int i = rank - 1; i >= 0; i--) {
    if (t->stride[i] != s) return false;
    s *= shape[i];
  }
  return true;
}
#define CHECK_TYPE(g, id, dt, rank, ...)                                                    \
  do {                                                                                      \
    char b_[128];                                                                           \
    int id_ = (id);                                                                         \
    CHECK_MSG(has_type(g, id_, dt, rank, (int64_t[]){0, __VA_ARGS__} + 1), "node %d: %s (%s)", id_, \
              id_ >= 0 ? evt_type_str(&(g)->nodes[id_].type, b_, sizeof b_) : "failed", evt_graph_error(g)); \
  } while (0)

/* Adds op expecting failure with EVT_ERR_TYPE; the message must name the node's op and contain `frag`. */
static void expect_fail(evt_graph *g, const char *op, const int *in, int nin, const evt_attr *a, int na,
                        const char *frag, const char *file, int line) {
  int id = evt_add_op(g, op, in, nin, a, na);
  const char *msg = evt_graph_error(g);
  char want[64];
  snprintf(want, sizeof want, "(%s): ", op);
  if (id >= 0) evt_test_fail(file, line, "%s unexpectedly succeeded", op);
  else if (!strstr(msg, "node %") || !strstr(msg, want) || !strstr(msg, frag))
    evt_test_fail(file, line, "%s: message '%s' lacks '%s'", op, msg, frag);
}
#define FAILS(...) FAILS_(__VA_ARGS__)
#define FAILS_(g, op, in, nin, a, na, frag) expect_fail(g, op, in, nin, a, na, frag, __FILE__, __LINE__)

TEST(infer_mm_and_binary) {
  evt_graph *g = evt_graph_new("t");
  int x = evt_input(g, "x", EVT_F32, 2, SHP(32, 64));
  int w = evt_param(g, "w", EVT_F32, 2, SHP(64, 10));
  int w2 = evt_param(g, "w2", EVT_F32, 2, SHP(65, 10));
  CHECK_TYPE(g, evt_add_op(g, "mm", INS(x, w), 2, NULL, 0), EVT_F32, 2, 32, 10);
  FAILS(g, "mm", INS(x, w2), 2, NULL, 0, "inner dimensions differ: f32[32,64] x f32[65,10]");
  evt_graph_free(g);
}

#define AI(nm, v) EVT_ATTR_INT(nm, v)
#define AF(nm, v) EVT_ATTR_FLOAT(nm, v)
#define AL(nm, ...) ((evt_attr){.name = (nm), .n = NIN(__VA_ARGS__), .list = {__VA_ARGS__}})
#define ATTRS(...) ((evt_attr[]){__VA_ARGS__}), (int)(sizeof((evt_attr[]){__VA_ARGS__}) / sizeof(evt_attr))
#define OP0(g, op, ...) evt_add_op(g, op, INS(__VA_ARGS__), NIN(__VA_ARGS__), NULL, 0)

TEST(infer_sources) {
  evt_graph *g = evt_graph_new("t");
  CHECK_TYPE(g, evt_input(g, "x", EVT_BF16, 3, SHP(2, 3, 4)), EVT_BF16, 3, 2, 3, 4);
  CHECK_TYPE(g, evt_param(g, "p", EVT_F16, 0, NULL), EVT_F16, 0, 0);
  evt_attrs a = evt_attrs_default;
  a.shape = (evt_ilist){2, {5, 6}};
  a.dtype = EVT_I32;
  CHECK_TYPE(g, evt_graph_add_node(g, EVT_OP_FULL, NULL, 0, &a, 0, NULL, "f", (evt_origin){0}), EVT_I32, 2, 5, 6);
  a.dtype = EVT_F32;
  CHECK_TYPE(g, evt_graph_add_node(g, EVT_OP_RAND, NULL, 0, &a, 0, NULL, "r", (evt_origin){0}), EVT_F32, 2, 5, 6);
  a.shape.n = 0;
  CHECK_TYPE(g, evt_graph_add_node(g, EVT_OP_SCALAR, NULL, 0, &a, 0, NULL, "s", (evt_origin){0}), EVT_F32, 0, 0);
  /* invalid: a scalar with a shape, rand of integers, negative sizes */
  a.shape = (evt_ilist){1, {3}};
  CHECK(evt_graph_add_node(g, EVT_OP_SCALAR, NULL, 0, &a, 0, NULL, "s2", (evt_origin){0}) < 0);
  CHECK(strstr(evt_graph_error(g), "node %s2 (scalar): a scalar has rank 0"));
  a.dtype = EVT_I64;
  CHECK(evt_graph_add_node(g, EVT_OP_RAND, NULL, 0, &a, 0, NULL, "r2", (evt_origin){0}) < 0);
  CHECK(strstr(evt_graph_error(g), "node %r2 (rand): rand's dtype must be floating-point"));
  a.shape = (evt_ilist){1, {3}};
  a.dtype = EVT_I64;
  a.init = EVT_INIT_ROWPTR;
  CHECK_TYPE(g, evt_graph_add_node(g, EVT_OP_INPUT, NULL, 0, &a, 0, NULL, "rp", (evt_origin){0}), EVT_I64, 1, 3);
  a.dtype = EVT_F32;
  CHECK(evt_graph_add_node(g, EVT_OP_INPUT, NULL, 0, &a, 0, NULL, "rp2", (evt_origin){0}) < 0);
  CHECK(strstr(evt_graph_error(g), "node %rp2 (input): init=rowptr needs an integer [M+1] tensor, got f32[3]"));
  a.init = EVT_INIT_UNIFORM;
  a.lo = 1;
  CHECK(evt_graph_add_node(g, EVT_OP_PARAM, NULL, 0, &a, 0, NULL, "u", (evt_origin){0}) < 0);
  CHECK(strstr(evt_graph_error(g), "node %u (param): init range [lo, hi) = [1, 1) is empty"));
  CHECK(evt_input(g, "neg", EVT_F32, 2, SHP(3, -1)) < 0);
  CHECK(strstr(evt_graph_error(g), "node %neg (input): negative size -1 in dim 1"));
  CHECK(evt_graph_verify(g) == EVT_OK);
  evt_graph_free(g);
}

TEST(infer_unary) {
  evt_graph *g = evt_graph_new("t");
  int x = evt_input(g, "x", EVT_F16, 2, SHP(4, 5));
  int xi = evt_input(g, "xi", EVT_I64, 2, SHP(4, 5));
  int xb = evt_input(g, "xb", EVT_BOOL, 1, SHP(4));
  const char *fl[] = {"exp", "log", "sqrt", "rsqrt", "reciprocal", "tanh", "sigmoid", "gelu", "erf", "pow"};
  for (int i = 0; i < EVT_ARRAY_LEN(fl); i++) {
    CHECK_TYPE(g, OP0(g, fl[i], x), EVT_F16, 2, 4, 5);
    FAILS(g, fl[i], INS(xi), 1, NULL, 0, "the input must be floating-point, got i64[4,5]");
  }
  const char *num[] = {"neg", "abs", "sign", "relu"};
  for (int i = 0; i < EVT_ARRAY_LEN(num); i++) {
    CHECK_TYPE(g, OP0(g, num[i], x), EVT_F16, 2, 4, 5);
    CHECK_TYPE(g, OP0(g, num[i], xi), EVT_I64, 2, 4, 5);
    FAILS(g, num[i], INS(xb), 1, NULL, 0, "must be numeric, got bool[4]");
  }
  CHECK_TYPE(g, evt_add_op(g, "cast", INS(xi), 1, ATTRS(AI("dtype", EVT_BF16))), EVT_BF16, 2, 4, 5);
  CHECK_TYPE(g, evt_add_op(g, "cast", INS(xb), 1, ATTRS(AI("dtype", EVT_F32))), EVT_F32, 1, 4);
  FAILS(g, "cast", INS(x), 1, ATTRS(AI("dtype", 17)), "bad dtype 17");
  CHECK_TYPE(g, OP0(g, "gelu_backward", x, x), EVT_F16, 2, 4, 5);
  CHECK_TYPE(g, OP0(g, "threshold_backward", x, x), EVT_F16, 2, 4, 5);
  int y = evt_input(g, "y", EVT_F16, 2, SHP(4, 6));
  FAILS(g, "gelu_backward", INS(x, y), 2, NULL, 0, "dy and x must have the same type: f16[4,5] vs f16[4,6]");
  FAILS(g, "threshold_backward", INS(x, xi), 2, NULL, 0, "dy and y must have the same type");
  FAILS(g, "gelu", INS(x), 1, ATTRS(AI("approximate", 5)), "bad approximate 5");
  CHECK(evt_graph_verify(g) == EVT_OK);
  evt_graph_free(g);
}

TEST(infer_binary_broadcast_and_dtypes) {
  evt_graph *g = evt_graph_new("t");
  int a = evt_input(g, "a", EVT_F32, 3, SHP(2, 1, 4));
  int b = evt_input(g, "b", EVT_F32, 2, SHP(3, 1));
  int c = evt_input(g, "c", EVT_F32, 2, SHP(3, 5));
  int s64 = evt_input(g, "s64", EVT_F32, 0, NULL);
  int h = evt_input(g, "h", EVT_BF16, 2, SHP(3, 1));
  int i32 = evt_input(g, "i32", EVT_I32, 1, SHP(4));
  int i64s = evt_input(g, "i64s", EVT_I64, 0, NULL);
  int bo = evt_input(g, "bo", EVT_BOOL, 1, SHP(4));
  const char *ar[] = {"add", "sub", "mul", "div", "maximum", "minimum"};
  for (int i = 0; i < EVT_ARRAY_LEN(ar); i++) {
    CHECK_TYPE(g, OP0(g, ar[i], a, b), EVT_F32, 3, 2, 3, 4);
    FAILS(g, ar[i], INS(a, c), 2, NULL, 0, "shapes do not broadcast: f32[2,1,4] vs f32[3,5]");
    FAILS(g, ar[i], INS(b, h), 2, NULL, 0, "dtypes differ: f32[3,1] vs bf16[3,1]");
  }
  const char *cmp[] = {"eq", "ne", "lt", "le", "gt", "ge"};
  for (int i = 0; i < EVT_ARRAY_LEN(cmp); i++) {
    CHECK_TYPE(g, OP0(g, cmp[i], a, b), EVT_BOOL, 3, 2, 3, 4);
    FAILS(g, cmp[i], INS(a, c), 2, NULL, 0, "shapes do not broadcast");
  }
  /* a rank-0 float adopts the other dtype; a rank-0 int next to an int tensor too */
  CHECK_TYPE(g, OP0(g, "mul", h, s64), EVT_BF16, 2, 3, 1);
  CHECK_TYPE(g, OP0(g, "add", s64, i32), EVT_I32, 1, 4);
  CHECK_TYPE(g, OP0(g, "add", i32, i64s), EVT_I32, 1, 4);
  FAILS(g, "add", INS(h, i64s), 2, NULL, 0, "dtypes differ: bf16[3,1] vs i64[]");
  CHECK_TYPE(g, OP0(g, "add", i64s, s64), EVT_F32, 0, 0);  /* two scalars: the floating one wins */
  int s16 = evt_input(g, "s16", EVT_F16, 0, NULL);
  CHECK_TYPE(g, OP0(g, "sub", s16, s64), EVT_F32, 0, 0);
  FAILS(g, "div", INS(i32, i32), 2, NULL, 0, "div needs floating operands");
  FAILS(g, "add", INS(bo, bo), 2, NULL, 0, "arithmetic on bool operands");
  CHECK_TYPE(g, OP0(g, "eq", bo, bo), EVT_BOOL, 1, 4);
  /* where: cond bool, three-way broadcast */
  CHECK_TYPE(g, OP0(g, "where", bo, b, s64), EVT_F32, 2, 3, 4);
  FAILS(g, "where", INS(i32, b, b), 3, NULL, 0, "the condition must be bool, got i32[4]");
  FAILS(g, "where", INS(bo, b, h), 3, NULL, 0, "dtypes of the branches differ");
  FAILS(g, "where", INS(bo, c, c), 3, NULL, 0, "shapes do not broadcast: bool[4] vs f32[3,5] vs f32[3,5]");
  CHECK(evt_graph_verify(g) == EVT_OK);
  evt_graph_free(g);
}

TEST(infer_reductions) {
  evt_graph *g = evt_graph_new("t");
  int x = evt_input(g, "x", EVT_F32, 3, SHP(2, 3, 4));
  int xi = evt_input(g, "xi", EVT_I64, 2, SHP(2, 3));
  int s = evt_add_op(g, "sum", INS(x), 1, ATTRS(AL("dims", -1, 0, 2)));
  CHECK_TYPE(g, s, EVT_F32, 1, 3);
  const evt_ilist *d = &g->nodes[s].attr.dims;  /* canonical: sorted, deduplicated, non-negative */
  CHECK(d->n == 2 && d->v[0] == 0 && d->v[1] == 2);
  CHECK_TYPE(g, evt_add_op(g, "mean", INS(x), 1, ATTRS(AL("dims", 1), AI("keepdim", 1))), EVT_F32, 3, 2, 1, 4);
  CHECK_TYPE(g, OP0(g, "amax", x), EVT_F32, 0, 0);
  CHECK_TYPE(g, evt_add_op(g, "sum", INS(xi), 1, ATTRS(AI("keepdim", 1))), EVT_I64, 2, 1, 1);
  FAILS(g, "mean", INS(xi), 1, NULL, 0, "the input of mean must be floating-point");
  FAILS(g, "sum", INS(x), 1, ATTRS(AL("dims", 3)), "dims=3 is out of range for rank 3");
  FAILS(g, "amax", INS(x), 1, ATTRS(AL("dims", -4)), "out of range");
  CHECK(evt_graph_verify(g) == EVT_OK);
  evt_graph_free(g);
}

TEST(infer_matmuls) {
  evt_graph *g = evt_graph_new("t");
  int a = evt_input(g, "a", EVT_F32, 2, SHP(8, 4));
  int b = evt_input(g, "b", EVT_F32, 2, SHP(4, 6));
  int bh = evt_input(g, "bh", EVT_F16, 2, SHP(4, 6));
  int c1 = evt_input(g, "c1", EVT_F32, 1, SHP(6));
  int c2 = evt_input(g, "c2", EVT_F32, 1, SHP(7));
  int p = evt_input(g, "p", EVT_F32, 4, SHP(2, 3, 8, 4));
  int q = evt_input(g, "q", EVT_F32, 4, SHP(2, 3, 4, 5));
  int q2 = evt_input(g, "q2", EVT_F32, 4, SHP(2, 2, 4, 5));
  FAILS(g, "mm", INS(a, bh), 2, NULL, 0, "same floating dtype: f32[8,4] x f16[4,6]");
  FAILS(g, "mm", INS(p, q), 2, NULL, 0, "mm needs rank-2 operands");
  CHECK_TYPE(g, OP0(g, "bmm", p, q), EVT_F32, 4, 2, 3, 8, 5);
  FAILS(g, "bmm", INS(p, q2), 2, NULL, 0, "batch dimensions differ: f32[2,3,8,4] x f32[2,2,4,5]");
  FAILS(g, "bmm", INS(q, q), 2, NULL, 0, "inner dimensions differ");
  FAILS(g, "bmm", INS(a, b), 2, NULL, 0, "rank >= 3");
  CHECK_TYPE(g, OP0(g, "addmm", c1, a, b), EVT_F32, 2, 8, 6);
  FAILS(g, "addmm", INS(c2, a, b), 3, NULL, 0, "c f32[7] does not broadcast to the product f32[8,6]");
  CHECK(evt_graph_verify(g) == EVT_OK);
  evt_graph_free(g);
}

TEST(infer_sparse) {
  evt_graph *g = evt_graph_new("t");
  int rp = evt_input(g, "rp", EVT_I64, 1, SHP(5));
  int col = evt_input(g, "col", EVT_I64, 1, SHP(12));
  int val = evt_input(g, "val", EVT_F32, 1, SHP(12));
  int fcol = evt_input(g, "fcol", EVT_F32, 1, SHP(12));
  int x = evt_input(g, "x", EVT_F32, 2, SHP(7, 3));
  int dy = evt_input(g, "dy", EVT_F32, 2, SHP(4, 3));
  CHECK_TYPE(g, OP0(g, "spmm", rp, col, val, x), EVT_F32, 2, 4, 3);
  FAILS(g, "spmm", INS(rp, fcol, val, x), 4, NULL, 0, "col must be an integer tensor");
  FAILS(g, "spmm", INS(rp, col, x, x), 4, NULL, 0, "col and val must both be [nnz]");
  CHECK_TYPE(g, evt_add_op(g, "spmm_t", INS(rp, col, val, dy), 4, ATTRS(AL("shape", 7, 3))), EVT_F32, 2, 7, 3);
  FAILS(g, "spmm_t", INS(rp, col, val, x), 4, ATTRS(AL("shape", 7, 3)), "dy must be [M,N] with M = 4");
  FAILS(g, "spmm_t", INS(rp, col, val, dy), 4, ATTRS(AL("shape", 7, 2)), "shape=[7,2] must be [K,3]");
  CHECK(evt_graph_verify(g) == EVT_OK);
  evt_graph_free(g);
}

TEST(infer_conv) {
  evt_graph *g = evt_graph_new("t");
  int x = evt_input(g, "x", EVT_F32, 4, SHP(2, 4, 9, 8));
  int w = evt_param(g, "w", EVT_F32, 4, SHP(6, 2, 3, 3));
  evt_attr at[] = {AL("stride", 2), AL("padding", 1, 0), AI("groups", 2)};
  int y = evt_add_op(g, "conv2d", INS(x, w), 2, at, 3);
  /* H: (9 + 2 - 2 - 1)/2 + 1 = 5; W: (8 - 2 - 1)/2 + 1 = 3 */
  CHECK_TYPE(g, y, EVT_F32, 4, 2, 6, 5, 3);
  CHECK(g->nodes[y].attr.stride.n == 2 && g->nodes[y].attr.stride.v[1] == 2);  /* one value doubled */
  evt_attr bi[] = {AL("stride", 2), AL("padding", 1, 0), AI("groups", 2), AL("shape", 2, 4, 9, 8)};
  CHECK_TYPE(g, evt_add_op(g, "conv2d_backward_input", INS(y, w), 2, bi, 4), EVT_F32, 4, 2, 4, 9, 8);
  evt_attr bw[] = {AL("stride", 2), AL("padding", 1, 0), AI("groups", 2), AL("shape", 6, 2, 3, 3)};
  CHECK_TYPE(g, evt_add_op(g, "conv2d_backward_weight", INS(x, y), 2, bw, 4), EVT_F32, 4, 6, 2, 3, 3);
  FAILS(g, "conv2d", INS(x, w), 2, NULL, 0, "channels differ: x f32[2,4,9,8] has 4, w f32[6,2,3,3] expects 2");
  int wbig = evt_param(g, "wbig", EVT_F32, 4, SHP(6, 4, 11, 3));
  FAILS(g, "conv2d", INS(x, wbig), 2, NULL, 0, "is larger than the padded input");
  bi[3] = AL("shape", 2, 4, 11, 8);
  FAILS(g, "conv2d_backward_input", INS(y, w), 2, bi, 4, "dy f32[2,6,5,3] must be the conv2d output f32[2,6,6,3]");
  bw[3] = AL("shape", 6, 2, 1, 3);
  FAILS(g, "conv2d_backward_weight", INS(x, y), 2, bw, 4, "must be the conv2d output");
  FAILS(g, "conv2d", INS(x, w), 2, ATTRS(AL("stride", 0, 1), AI("groups", 2)), "stride=[0,1]: values must be in [1,");
  CHECK(evt_graph_verify(g) == EVT_OK);
  evt_graph_free(g);
}

TEST(infer_pool) {
  evt_graph *g = evt_graph_new("t");
  int x = evt_input(g, "x", EVT_F32, 4, SHP(2, 3, 7, 8));
  evt_attr pa[] = {AL("kernel", 3), AL("stride", 2), AL("padding", 1)};
  int mp = evt_add_op(g, "max_pool2d", INS(x), 1, pa, 3);
  CHECK_TYPE(g, mp, EVT_F32, 4, 2, 3, 4, 4);  /* (7+2-3)/2+1 = 4, (8+2-3)/2+1 = 4 */
  CHECK_TYPE(g, evt_add_op(g, "max_pool2d_backward", INS(mp, x), 2, pa, 3), EVT_F32, 4, 2, 3, 7, 8);
  int ap = evt_add_op(g, "avg_pool2d", INS(x), 1, pa, 3);
  CHECK_TYPE(g, ap, EVT_F32, 4, 2, 3, 4, 4);
  evt_attr pb[] = {AL("kernel", 3), AL("stride", 2), AL("padding", 1), AL("shape", 2, 3, 7, 8)};
  CHECK_TYPE(g, evt_add_op(g, "avg_pool2d_backward", INS(ap), 1, pb, 4), EVT_F32, 4, 2, 3, 7, 8);
  FAILS(g, "max_pool2d_backward", INS(x, x), 2, pa, 3, "dy f32[2,3,7,8] must be the pooled output f32[2,3,4,4]");
  pb[3] = AL("shape", 2, 3, 9, 8);
  FAILS(g, "avg_pool2d_backward", INS(ap), 1, pb, 4, "must be the pooled output f32[2,3,5,4]");
  FAILS(g, "max_pool2d", INS(x), 1, ATTRS(AL("kernel", 2), AL("padding", 2)), "padding=[2,2] must be at most half of kernel=[2,2]");
  FAILS(g, "avg_pool2d", INS(x), 1, ATTRS(AL("kernel", 9)), "kernel=[9,9] is larger than the padded input");
  FAILS(g, "max_pool2d", INS(x), 1, ATTRS(AL("kernel", 1, 2, 3)), "kernel must have 2 values");
  int am = evt_add_op(g, "adaptive_max_pool2d", INS(x), 1, ATTRS(AL("shape", 2, 3)));
  CHECK_TYPE(g, am, EVT_F32, 4, 2, 3, 2, 3);
  CHECK_TYPE(g, evt_add_op(g, "adaptive_max_pool2d_backward", INS(am, x), 2, ATTRS(AL("shape", 2, 3))), EVT_F32, 4, 2, 3, 7, 8);
  FAILS(g, "adaptive_max_pool2d_backward", INS(am, x), 2, ATTRS(AL("shape", 3, 3)), "dy must be f32[2,3,3,3]");
  FAILS(g, "adaptive_max_pool2d", INS(x), 1, ATTRS(AL("shape", 0, 3)), "shape must be [Ho,Wo] with positive sizes");
  int x3 = evt_input(g, "x3", EVT_F32, 3, SHP(3, 7, 8));
  FAILS(g, "max_pool2d", INS(x3), 1, NULL, 0, "x must be [N,C,H,W], got f32[3,7,8]");
  CHECK(evt_graph_verify(g) == EVT_OK);
  evt_graph_free(g);
}

TEST(infer_row_ops) {
  evt_graph *g = evt_graph_new("t");
  int x = evt_input(g, "x", EVT_F32, 3, SHP(2, 5, 6));
  int xi = evt_input(g, "xi", EVT_I64, 2, SHP(2, 5));
  int w = evt_param(g, "w", EVT_F32, 1, SHP(6));
  int b = evt_param(g, "b", EVT_F32, 1, SHP(6));
  int wc = evt_param(g, "wc", EVT_F32, 1, SHP(5));
  const char *sm[] = {"softmax", "log_softmax"};
  for (int i = 0; i < 2; i++) {
    int s = OP0(g, sm[i], x);
    CHECK_TYPE(g, s, EVT_F32, 3, 2, 5, 6);
    CHECK(g->nodes[s].attr.dim == 2);  /* -1 canonicalized */
    FAILS(g, sm[i], INS(xi), 1, NULL, 0, "x must be floating-point");
    FAILS(g, sm[i], INS(x), 1, ATTRS(AI("dim", 3)), "dim=3 is out of range for rank 3");
  }
  CHECK_TYPE(g, OP0(g, "softmax_backward", x, x), EVT_F32, 3, 2, 5, 6);
  CHECK_TYPE(g, OP0(g, "log_softmax_backward", x, x), EVT_F32, 3, 2, 5, 6);
  FAILS(g, "softmax_backward", INS(x, w), 2, NULL, 0, "dy and y must have the same type");
  CHECK_TYPE(g, OP0(g, "layer_norm", x), EVT_F32, 3, 2, 5, 6);
  CHECK_TYPE(g, OP0(g, "layer_norm", x, w, b), EVT_F32, 3, 2, 5, 6);
  FAILS(g, "layer_norm", INS(x, wc), 2, NULL, 0, "w must be f32[6] to match x f32[2,5,6], got f32[5]");
  CHECK_TYPE(g, OP0(g, "layer_norm_backward_input", x, x, w), EVT_F32, 3, 2, 5, 6);
  CHECK_TYPE(g, OP0(g, "layer_norm_backward_weight", x, x), EVT_F32, 1, 6);
  FAILS(g, "layer_norm_backward_weight", INS(w, x), 2, NULL, 0, "dy and x must have the same type");
  CHECK_TYPE(g, OP0(g, "batch_norm", x, wc, wc), EVT_F32, 3, 2, 5, 6);
  CHECK_TYPE(g, OP0(g, "batch_norm_backward_input", x, x, wc), EVT_F32, 3, 2, 5, 6);
  CHECK_TYPE(g, OP0(g, "batch_norm_backward_weight", x, x), EVT_F32, 1, 5);
  FAILS(g, "batch_norm", INS(x, w), 2, NULL, 0, "w must be f32[5]");
  FAILS(g, "batch_norm", INS(w), 1, NULL, 0, "x must have rank >= 2, got f32[6]");
  FAILS(g, "layer_norm", INS(x), 1, ATTRS(AF("eps", -1.0)), "eps must be >= 0");
  CHECK_TYPE(g, OP0(g, "dropout", x), EVT_F32, 3, 2, 5, 6);
  FAILS(g, "dropout", INS(x), 1, ATTRS(AF("p", 1.0)), "p must be in [0, 1), got 1");
  FAILS(g, "dropout", INS(xi), 1, NULL, 0, "x must be floating-point");
  CHECK(evt_graph_verify(g) == EVT_OK);
  evt_graph_free(g);
}

TEST(infer_losses) {
  evt_graph *g = evt_graph_new("t");
  int lp = evt_input(g, "lp", EVT_F32, 2, SHP(8, 10));
  int t = evt_input(g, "t", EVT_I64, 1, SHP(8));
  int t7 = evt_input(g, "t7", EVT_I64, 1, SHP(7));
  int tf = evt_input(g, "tf", EVT_F32, 1, SHP(8));
  int s = evt_input(g, "s", EVT_F32, 0, NULL);
  int v8 = evt_input(g, "v8", EVT_F32, 1, SHP(8));
  CHECK_TYPE(g, OP0(g, "nll_loss", lp, t), EVT_F32, 0, 0);
  CHECK_TYPE(g, evt_add_op(g, "nll_loss", INS(lp, t), 2, ATTRS(AI("reduction", EVT_REDUCTION_NONE))), EVT_F32, 1, 8);
  CHECK_TYPE(g, OP0(g, "cross_entropy", lp, t), EVT_F32, 0, 0);
  FAILS(g, "cross_entropy", INS(lp, t7), 2, NULL, 0, "the target must be [8] to match f32[8,10], got i64[7]");
  FAILS(g, "nll_loss", INS(lp, tf), 2, NULL, 0, "the target must be an integer tensor");
  FAILS(g, "nll_loss", INS(v8, t), 2, NULL, 0, "the scores must be [N,C], got f32[8]");
  FAILS(g, "nll_loss", INS(lp, t), 2, ATTRS(AI("reduction", 9)), "bad reduction 9");
  CHECK_TYPE(g, OP0(g, "nll_loss_backward", s, lp, t), EVT_F32, 2, 8, 10);
  CHECK_TYPE(g, evt_add_op(g, "nll_loss_backward", INS(v8, lp, t), 3, ATTRS(AI("reduction", EVT_REDUCTION_NONE))), EVT_F32, 2, 8, 10);
  FAILS(g, "nll_loss_backward", INS(v8, lp, t), 3, NULL, 0, "dy must be f32[] (the forward output), got f32[8]");
  CHECK_TYPE(g, OP0(g, "bce_with_logits", lp, lp), EVT_F32, 0, 0);
  CHECK_TYPE(g, evt_add_op(g, "mse_loss", INS(lp, lp), 2, ATTRS(AI("reduction", EVT_REDUCTION_NONE))), EVT_F32, 2, 8, 10);
  CHECK_TYPE(g, OP0(g, "mse_loss", v8, v8), EVT_F32, 0, 0);
  FAILS(g, "bce_with_logits", INS(lp, v8), 2, NULL, 0, "x and y must have the same type");
  CHECK_TYPE(g, OP0(g, "bce_with_logits_backward", s, lp, lp), EVT_F32, 2, 8, 10);
  CHECK_TYPE(g, OP0(g, "mse_loss_backward", s, v8, v8), EVT_F32, 1, 8);
  FAILS(g, "mse_loss_backward", INS(lp, v8, v8), 3, NULL, 0, "dy must be f32[] (the forward output)");
  FAILS(g, "mse_loss", INS(t, t), 2, NULL, 0, "x must be floating-point");
  CHECK(evt_graph_verify(g) == EVT_OK);
  evt_graph_free(g);
}

TEST(infer_gathers) {
  evt_graph *g = evt_graph_new("t");
  int idx = evt_input(g, "idx", EVT_I64, 2, SHP(4, 5));
  int idx1 = evt_input(g, "idx1", EVT_I32, 1, SHP(3));
  int fidx = evt_input(g, "fidx", EVT_F32, 1, SHP(3));
  int w = evt_param(g, "w", EVT_F32, 2, SHP(100, 16));
  int x = evt_input(g, "x", EVT_F32, 3, SHP(6, 7, 8));
  int r6 = evt_input(g, "r6", EVT_I64, 6, SHP(1, 1, 1, 1, 1, 2));
  CHECK_TYPE(g, evt_add_op(g, "one_hot", INS(idx), 1, ATTRS(AI("num_classes", 10), AI("dtype", EVT_BF16))), EVT_BF16, 3, 4, 5, 10);
  FAILS(g, "one_hot", INS(idx), 1, NULL, 0, "num_classes must be positive, got 0");
  FAILS(g, "one_hot", INS(fidx), 1, ATTRS(AI("num_classes", 3)), "the index must be an integer tensor");
  FAILS(g, "one_hot", INS(r6), 1, ATTRS(AI("num_classes", 3)), "exceeds the rank limit 6");
  int e = OP0(g, "embedding", w, idx);
  CHECK_TYPE(g, e, EVT_F32, 3, 4, 5, 16);
  FAILS(g, "embedding", INS(w, fidx), 2, NULL, 0, "the index must be an integer tensor");
  FAILS(g, "embedding", INS(x, idx), 2, NULL, 0, "the table must be [V,D], got f32[6,7,8]");
  FAILS(g, "embedding", INS(w, r6), 2, NULL, 0, "exceeds the rank limit 6");
  CHECK_TYPE(g, evt_add_op(g, "embedding_backward", INS(e, idx), 2, ATTRS(AL("shape", 100, 16))), EVT_F32, 2, 100, 16);
  FAILS(g, "embedding_backward", INS(e, idx), 2, ATTRS(AL("shape", 100, 15)), "dy must be f32[4,5,15] (index shape + [D]), got f32[4,5,16]");
  int is = evt_add_op(g, "index_select", INS(x, idx1), 2, ATTRS(AI("dim", -2)));
  CHECK_TYPE(g, is, EVT_F32, 3, 6, 3, 8);
  CHECK(g->nodes[is].attr.dim == 1);
  FAILS(g, "index_select", INS(x, idx), 2, ATTRS(AI("dim", 0)), "the index must have rank 1, got i64[4,5]");
  FAILS(g, "index_select", INS(x, idx1), 2, ATTRS(AI("dim", 3)), "dim=3 is out of range for rank 3");
  CHECK_TYPE(g, evt_add_op(g, "index_select_backward", INS(is, idx1), 2, ATTRS(AI("dim", 1), AL("shape", 6, 7, 8))), EVT_F32, 3, 6, 7, 8);
  FAILS(g, "index_select_backward", INS(is, idx1), 2, ATTRS(AI("dim", 2), AL("shape", 6, 7, 8)), "dy must be f32[6,7,3]");
  CHECK_TYPE(g, evt_add_op(g, "coo_perm", INS(idx1), 1, ATTRS(AI("rows", 7))), EVT_I64, 1, 3);
  CHECK_TYPE(g, evt_add_op(g, "coo_rowptr", INS(idx1), 1, ATTRS(AI("rows", 7))), EVT_I64, 1, 8);
  FAILS(g, "coo_perm", INS(idx), 1, ATTRS(AI("rows", 7)), "the key must have rank 1, got i64[4,5]");
  FAILS(g, "coo_rowptr", INS(fidx), 1, ATTRS(AI("rows", 7)), "the key must be an integer tensor");
  FAILS(g, "coo_perm", INS(idx1), 1, NULL, 0, "rows must be positive, got 0");
  CHECK(evt_graph_verify(g) == EVT_OK);
  evt_graph_free(g);
}

TEST(infer_layout) {
  evt_graph *g = evt_graph_new("t");
  int x = evt_input(g, "x", EVT_F32, 3, SHP(2, 3, 4));
  int r = evt_add_op(g, "reshape", INS(x), 1, ATTRS(AL("shape", 4, -1)));
  CHECK_TYPE(g, r, EVT_F32, 2, 4, 6);
  CHECK(g->nodes[r].attr.shape.v[1] == 6);  /* the -1 is resolved */
  FAILS(g, "reshape", INS(x), 1, ATTRS(AL("shape", 5, 5)), "shape=[5,5] has 25 elements, the input f32[2,3,4] has 24");
  FAILS(g, "reshape", INS(x), 1, ATTRS(AL("shape", -1, -1)), "more than one -1");
  FAILS(g, "reshape", INS(x), 1, ATTRS(AL("shape", 5, -1)), "cannot infer the -1");
  int p = evt_add_op(g, "permute", INS(x), 1, ATTRS(AL("dims", 2, 0, -2)));
  CHECK_TYPE(g, p, EVT_F32, 3, 4, 2, 3);
  CHECK(g->nodes[p].attr.dims.v[2] == 1);
  FAILS(g, "permute", INS(x), 1, ATTRS(AL("dims", 0, 0, 1)), "is not a permutation");
  FAILS(g, "permute", INS(x), 1, ATTRS(AL("dims", 0, 1)), "must list all 3 dims");
  CHECK_TYPE(g, evt_add_op(g, "transpose", INS(x), 1, ATTRS(AL("dims", 0, -1))), EVT_F32, 3, 4, 3, 2);
  FAILS(g, "transpose", INS(x), 1, ATTRS(AL("dims", 0)), "dims must be a pair");
  int y = evt_input(g, "y", EVT_F32, 2, SHP(3, 1));
  int e = evt_add_op(g, "expand", INS(y), 1, ATTRS(AL("shape", 2, -1, 5)));
  CHECK_TYPE(g, e, EVT_F32, 3, 2, 3, 5);
  CHECK(g->nodes[e].attr.shape.v[1] == 3);
  FAILS(g, "expand", INS(y), 1, ATTRS(AL("shape", 4, 5)), "cannot expand f32[3,1] to shape=[4,5]");
  FAILS(g, "expand", INS(y), 1, ATTRS(AL("shape", 5)), "must have rank between 2 and 6");
  FAILS(g, "expand", INS(y), 1, ATTRS(AL("shape", -1, 3, 1)), "a new leading dim");
  int s = evt_add_op(g, "slice", INS(x), 1, ATTRS(AI("dim", -1), AI("start", -3), AI("step", 2)));
  CHECK_TYPE(g, s, EVT_F32, 3, 2, 3, 2);  /* elements 1, 3 */
  CHECK(g->nodes[s].attr.dim == 2 && g->nodes[s].attr.start == 1 && g->nodes[s].attr.end == 4);
  int s2 = evt_add_op(g, "slice", INS(x), 1, ATTRS(AI("dim", 1), AI("start", 2), AI("end", -2)));
  CHECK_TYPE(g, s2, EVT_F32, 3, 2, 0, 4);  /* empty slice */
  FAILS(g, "slice", INS(x), 1, ATTRS(AI("dim", 0), AI("step", 0)), "step must be positive");
  CHECK_TYPE(g, evt_add_op(g, "slice_backward", INS(s), 1, ATTRS(AI("dim", 2), AI("start", 1), AI("step", 2), AL("shape", 2, 3, 4))),
             EVT_F32, 3, 2, 3, 4);
  FAILS(g, "slice_backward", INS(s), 1, ATTRS(AI("dim", 2), AI("start", 0), AL("shape", 2, 3, 4)), "dy f32[2,3,2] must be the slice of shape=[2,3,4], i.e. f32[2,3,4]");
  int z = evt_input(g, "z", EVT_F32, 3, SHP(2, 5, 4));
  int zh = evt_input(g, "zh", EVT_F16, 3, SHP(2, 5, 4));
  CHECK_TYPE(g, evt_add_op(g, "concat", INS(x, z, x), 3, ATTRS(AI("dim", 1))), EVT_F32, 3, 2, 11, 4);
  FAILS(g, "concat", INS(x, z), 2, ATTRS(AI("dim", 0)), "differs from input 0 f32[2,3,4] outside dim 0");
  FAILS(g, "concat", INS(z, zh), 2, ATTRS(AI("dim", 0)), "input 1 f16[2,5,4] does not match input 0 f32[2,5,4]");
  CHECK_TYPE(g, evt_add_op(g, "squeeze", INS(y), 1, ATTRS(AI("dim", -1))), EVT_F32, 1, 3);
  FAILS(g, "squeeze", INS(y), 1, ATTRS(AI("dim", 0)), "dim 0 of f32[3,1] has size 3, not 1");
  CHECK_TYPE(g, evt_add_op(g, "unsqueeze", INS(y), 1, ATTRS(AI("dim", -1))), EVT_F32, 3, 3, 1, 1);
  CHECK_TYPE(g, evt_add_op(g, "unsqueeze", INS(y), 1, ATTRS(AI("dim", 0))), EVT_F32, 3, 1, 3, 1);
  FAILS(g, "unsqueeze", INS(y), 1, ATTRS(AI("dim", 3)), "dim=3 is out of range for rank 3");
  int r6 = evt_input(g, "r6", EVT_F32, 6, SHP(1, 1, 1, 1, 1, 2));
  FAILS(g, "unsqueeze", INS(r6), 1, ATTRS(AI("dim", 0)), "exceeds the rank limit 6");
  CHECK(evt_graph_verify(g) == EVT_OK);
  evt_graph_free(g);
}

TEST(infer_sdpa) {
  evt_graph *g = evt_graph_new("t");
  int q = evt_input(g, "q", EVT_F32, 4, SHP(2, 4, 8, 16));
  int k = evt_input(g, "k", EVT_F32, 4, SHP(2, 4, 10, 16));
  int v = evt_input(g, "v", EVT_F32, 4, SHP(2, 4, 10, 32));
  int o = OP0(g, "sdpa", q, k, v);
  CHECK_TYPE(g, o, EVT_F32, 4, 2, 4, 8, 32);
  CHECK_TYPE(g, OP0(g, "sdpa_backward_q", o, q, k, v), EVT_F32, 4, 2, 4, 8, 16);
  CHECK_TYPE(g, OP0(g, "sdpa_backward_k", o, q, k, v), EVT_F32, 4, 2, 4, 10, 16);
  CHECK_TYPE(g, OP0(g, "sdpa_backward_v", o, q, k, v), EVT_F32, 4, 2, 4, 10, 32);
  FAILS(g, "sdpa", INS(q, q, v), 3, NULL, 0, "k f32[2,4,8,16] and v f32[2,4,10,32] differ");
  FAILS(g, "sdpa", INS(q, v, v), 3, NULL, 0, "q f32[2,4,8,16] and k f32[2,4,10,32] differ");
  FAILS(g, "sdpa_backward_q", INS(q, q, k, v), 4, NULL, 0, "dout must be f32[2,4,8,32] (the forward output)");
  FAILS(g, "sdpa", INS(q, k, v), 3, ATTRS(AI("causal", 2)), "causal must be 0 or 1");
  CHECK(evt_graph_verify(g) == EVT_OK);
  evt_graph_free(g);
}

/* The optional mask: bool or q's dtype, broadcastable to the scores [B,H,Sq,Skv]; the backward ops take it
 * last. */
TEST(infer_sdpa_mask) {
  evt_graph *g = evt_graph_new("t");
  int q = evt_input(g, "q", EVT_F32, 4, SHP(2, 4, 8, 16));
  int k = evt_input(g, "k", EVT_F32, 4, SHP(2, 4, 10, 16));
  int v = evt_input(g, "v", EVT_F32, 4, SHP(2, 4, 10, 32));
  int mb = evt_input(g, "mb", EVT_BOOL, 4, SHP(2, 1, 8, 10));
  int mf = evt_input(g, "mf", EVT_F32, 4, SHP(2, 1, 1, 10));
  int m2 = evt_input(g, "m2", EVT_F32, 2, SHP(8, 10));
  int o = OP0(g, "sdpa", q, k, v, mb);
  CHECK_TYPE(g, o, EVT_F32, 4, 2, 4, 8, 32);
  CHECK_TYPE(g, OP0(g, "sdpa", q, k, v, mf), EVT_F32, 4, 2, 4, 8, 32);
  CHECK_TYPE(g, OP0(g, "sdpa", q, k, v, m2), EVT_F32, 4, 2, 4, 8, 32);
  CHECK_TYPE(g, OP0(g, "sdpa_backward_q", o, q, k, v, mb), EVT_F32, 4, 2, 4, 8, 16);
  CHECK_TYPE(g, OP0(g, "sdpa_backward_k", o, q, k, v, mf), EVT_F32, 4, 2, 4, 10, 16);
  CHECK_TYPE(g, OP0(g, "sdpa_backward_v", o, q, k, v, m2), EVT_F32, 4, 2, 4, 10, 32);
  int mi = evt_input(g, "mi", EVT_I64, 4, SHP(2, 1, 8, 10));
  int mh = evt_input(g, "mh", EVT_F16, 4, SHP(2, 1, 8, 10));
  int mw = evt_input(g, "mw", EVT_BOOL, 4, SHP(2, 4, 8, 9));
  int m5 = evt_input(g, "m5", EVT_BOOL, 5, SHP(1, 2, 4, 8, 10));
  FAILS(g, "sdpa", INS(q, k, v, mi), 4, NULL, 0, "the mask must be bool or q's dtype f32, got i64[2,1,8,10]");
  FAILS(g, "sdpa", INS(q, k, v, mh), 4, NULL, 0, "the mask must be bool or q's dtype f32, got f16[2,1,8,10]");
  FAILS(g, "sdpa", INS(q, k, v, mw), 4, NULL, 0, "the mask bool[2,4,8,9] does not broadcast to the scores [2,4,8,10]");
  FAILS(g, "sdpa", INS(q, k, v, m5), 4, NULL, 0, "has rank > 4");
  FAILS(g, "sdpa_backward_q", INS(o, q, k, v, mw), 5, NULL, 0, "does not broadcast to the scores");
  CHECK(evt_graph_verify(g) == EVT_OK);
  evt_graph_free(g);
}

/* Every op of ops.def has a valid case above: runs them all and checks which ops they covered. */
TEST(infer_every_op_covered) {
  void (*all[])(void) = {infer_mm_and_binary, infer_sources, infer_unary, infer_binary_broadcast_and_dtypes, infer_reductions,
                         infer_matmuls, infer_sparse, infer_conv, infer_pool, infer_row_ops, infer_losses,
                         infer_gathers, infer_layout, infer_sdpa, infer_sdpa_mask};
  for (int i = 0; i < EVT_ARRAY_LEN(all); i++) all[i]();
  for (int op = 0; op < EVT_OP_COUNT; op++) CHECK_MSG(covered[op], "op %s has no valid case", evt_op_table[op].name);
}

TEST(verify_graph) {
  evt_graph *g = evt_graph_new("t");
  int x = evt_input(g, "x", EVT_F32, 2, SHP(4, 3));
  int w = evt_param(g, "w", EVT_F32, 2, SHP(3, 5));
  int y = evt_input(g, "y", EVT_I64, 1, SHP(4));
  int l = OP0(g, "mm", x, w);
  int loss = OP0(g, "cross_entropy", l, y);
  CHECK(evt_graph_set_loss(g, loss) == EVT_OK);
  CHECK(evt_graph_add_output(g, l) == EVT_OK);
  CHECK(evt_graph_verify(g) == EVT_OK);
  /* a stored type that disagrees with the op */
  g->nodes[l].type.shape[1] = 6;
  CHECK(evt_graph_verify(g) == EVT_ERR_TYPE);
  CHECK(strstr(evt_graph_error(g), "(mm): stored type f32[4,6] but the op gives f32[4,5]"));
  g->nodes[l].type.shape[1] = 5;
  /* non-canonical attributes */
  int s = evt_add_op(g, "softmax", INS(l), 1, NULL, 0);
  g->nodes[s].attr.dim = -1;
  CHECK(evt_graph_verify(g) == EVT_ERR_TYPE);
  CHECK(strstr(evt_graph_error(g), "not in canonical form"));
  g->nodes[s].attr.dim = 1;
  CHECK(evt_graph_verify(g) == EVT_OK);
  /* an input that does not precede its user */
  g->nodes[l].inputs[1] = s;
  CHECK(evt_graph_verify(g) == EVT_ERR_INVALID);
  CHECK(strstr(evt_graph_error(g), "(mm): input 1"));
  g->nodes[l].inputs[1] = w;
  /* duplicate and empty names */
  const char *old = g->nodes[s].name;
  g->nodes[s].name = "x";
  CHECK(evt_graph_verify(g) == EVT_ERR_INVALID);
  CHECK(strstr(evt_graph_error(g), "the name %x is also used by node 0"));
  g->nodes[s].name = "";
  CHECK(evt_graph_verify(g) == EVT_ERR_INVALID);
  CHECK(strstr(evt_graph_error(g), "no name"));
  g->nodes[s].name = old;
  /* outputs: repeated, out of range; the loss first and a float scalar */
  CHECK(evt_graph_verify(g) == EVT_OK);
  g->outputs[1] = loss;
  CHECK(evt_graph_verify(g) == EVT_ERR_INVALID);
  CHECK(strstr(evt_graph_error(g), "listed twice"));
  g->outputs[1] = 99;
  CHECK(evt_graph_verify(g) == EVT_ERR_INVALID);
  g->outputs[1] = loss;
  g->outputs[0] = l;
  CHECK(evt_graph_verify(g) == EVT_ERR_INVALID);
  CHECK(strstr(evt_graph_error(g), "the loss must be the first output"));
  g->outputs[0] = loss;
  g->outputs[1] = l;
  g->loss = l;
  CHECK(evt_graph_verify(g) == EVT_ERR_TYPE);
  CHECK(strstr(evt_graph_error(g), "(mm): the loss must be a floating-point scalar, got f32[4,5]"));
  g->loss = loss;
  CHECK(evt_graph_verify(g) == EVT_OK);
  g->nodes[l].flags |= EVT_NODE_LOSS;
  CHECK(evt_graph_verify(g) == EVT_ERR_INVALID);
  CHECK(strstr(evt_graph_error(g), "(mm): carries the loss flag but the loss is cross_entropy"));
  g->nodes[l].flags &= ~EVT_NODE_LOSS;
  CHECK(evt_graph_verify(g) == EVT_OK);
  (void)x;
  (void)y;
  evt_graph_free(g);
}

/* Random inputs and attributes for every op (including extreme values): inference never crashes or
 * overflows (run under `make asan`), and every node it accepts passes the verifier, i.e. re-inference
 * on the canonicalized attributes is a fixed point. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static int64_t rnd(int64_t lo, int64_t hi) {  /* uniform in [lo, hi] */
  rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
  return lo + (int64_t)((rng_state >> 33) % (uint64_t)(hi - lo + 1));
}
static int64_t rnd_value(void) {
  switch (rnd(0, 9)) {
  case 0: return INT64_MAX;
  case 1: return INT64_MIN;
  case 2: return rnd(-8, -1);
  default: return rnd(0, 9);
  }
}

TEST(infer_random_fixed_point) {
  evt_graph *g = evt_graph_new("t");
  int pool[24], np = 0;
  for (int i = 0; i < 24; i++) {
    int rank = (int)rnd(0, 6);
    int64_t shape[EVT_MAX_RANK];
    for (int k = 0; k < rank; k++) shape[k] = rnd(0, 5) == 0 ? 1 : rnd(1, 4);
    char name[16];
    snprintf(name, sizeof name, "in%d", i);
    int id = evt_input(g, name, (evt_dtype)rnd(0, EVT_DTYPE_COUNT - 1), rank, shape);
    if (id >= 0) pool[np++] = id;
  }
  CHECK(np == 24);
  int accepted = 0;
  for (int op = 0; op < EVT_OP_COUNT; op++) {
    const evt_op_info *info = &evt_op_table[op];
    if (info->flags & EVT_OPF_TYPED) continue;
    for (int trial = 0; trial < 400; trial++) {
      int in[EVT_MAX_INPUTS];
      int nin = (int)rnd(info->min_inputs, info->max_inputs);
      for (int k = 0; k < nin; k++) in[k] = pool[rnd(0, np - 1)];
      evt_attrs a = evt_attrs_default;
      for (int at = 0; at < EVT_ATTR_COUNT; at++) {
        if (!(info->attrs & (1ull << at)) || rnd(0, 2) == 0) continue;
        const evt_attr_info *ai = &evt_attr_table[at];
        char *f = (char *)&a + ai->offset;
        if (ai->kind == EVT_AK_LIST) {
          evt_ilist l = {(int)rnd(0, 4), {0}};
          for (int k = 0; k < l.n; k++) l.v[k] = rnd(0, 3) ? rnd(-2, 5) : rnd_value();
          memcpy(f, &l, sizeof l);
        } else if (ai->kind == EVT_AK_FLOAT) {
          double v = (double[]){-1.0, 0.0, 0.5, 1.0, 1e-5, 1e300, NAN}[rnd(0, 6)];
          memcpy(f, &v, sizeof v);
        } else {
          int64_t v = rnd(0, 3) ? rnd(-2, 5) : rnd_value();
          memcpy(f, &v, sizeof v);
        }
      }
      int id = evt_graph_add_node(g, (evt_op)op, in, nin, &a, 0, NULL, NULL, (evt_origin){0});
      if (id < 0) {
        CHECK_MSG(strstr(evt_graph_error(g), "node %"), "%s: message without the node: %s", info->name, evt_graph_error(g));
        continue;
      }
      accepted++;
    }
  }
  CHECK_MSG(accepted > 200, "accepted %d", accepted);
  CHECK_MSG(evt_graph_verify(g) == EVT_OK, "%s", evt_graph_error(g));
  evt_graph_free(g);
}
