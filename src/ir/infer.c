/* Shape and dtype inference, and the verifier rule of every op. evt_infer_node checks a node's inputs
 * and attributes and sets its type; any violation is a user error naming the node (EVT_ERR_TYPE).
 *
 * Contract of evt_infer_node(g, n, id):
 *   - reads the types of n's inputs from g->nodes[n->inputs[k]] (they precede n), n->op and n->attr;
 *   - sets n->type (dtype, rank, shape, contiguous strides) or returns EVT_ERR_TYPE with a message that
 *     says concretely what is wrong, e.g. "inner dimensions differ: f32[32,64] x f32[65,10]";
 *   - canonicalizes attributes in place so that print(parse(text)) is a fixed point and later stages
 *     never see negative dims: dim/dims normalized to [0, rank), reduction dims sorted and deduplicated,
 *     reshape's single -1 resolved, expand's -1 replaced by the kept size, slice start/end clamped
 *     python-style (end default INT64_MAX becomes the size), one-value conv/pool lists doubled;
 *   - is idempotent: running it again on the canonical attributes gives the same type and attributes
 *     (evt_graph_verify relies on this).
 * Dtype classes: floating (f32, f16, bf16, f8e4m3, f8e5m2), integer (i64, i32), bool. Binary ops: equal dtypes, or a
 * rank-0 operand that is floating or of the other operand's class adopts the other operand's dtype (so
 * x_bf16 * 0.5 stays bf16, and i32 + 1.0 stays i32); of two numeric rank-0 operands a floating one wins,
 * within a class the wider (f32, i64).
 * mm: out_dtype (when given, not the operands' dtype) must be f32: the output is then the f32 accumulator of
 * 16-bit or fp8 operands (canonicalize's bf16/f16 addmm); out_dtype equal to the operands' dtype is reset to the
 * default (-1) so that printing stays canonical. mm alone (not bmm / addmm) takes mixed fp8 operands (f8e4m3 x
 * f8e5m2, either order: the fp8 pass's backward GEMMs), and then needs out_dtype=f32.
 * The switch has no default: -Werror=switch makes every op of ops.def have a rule here. */
#include "ir/ir.h"

#include <stdlib.h>
#include <string.h>

#define FAIL(...) return evt_graph_errorf(g, id, EVT_ERR_TYPE, __VA_ARGS__)
#define CHECK_ST(expr)                  \
  do {                                  \
    evt_status st_ = (expr);            \
    if (st_ != EVT_OK) return st_;      \
  } while (0)

/* Largest element count of any tensor; keeps every size computation far from int64 overflow. */
#define MAX_NUMEL (INT64_C(1) << 48)
/* Bound of conv/pool window attributes (kernel, stride, padding, dilation). */
#define MAX_WINDOW (INT64_C(1) << 30)

/* ---- helpers ---------------------------------------------------------------------------------------- */

/* Type text for messages; a small ring of buffers so one message can show several types. */
static const char *ts(const evt_type *t) {
  static _Thread_local char ring[6][160];
  static _Thread_local int next;
  char *b = ring[next++ % 6];
  return evt_type_str(t, b, sizeof ring[0]);
}

static const char *ls(const evt_ilist *l) {
  static _Thread_local char ring[4][160];
  static _Thread_local int next;
  char *b = ring[next++ % 4];
  size_t len = (size_t)snprintf(b, sizeof ring[0], "[");
  for (int i = 0; i < l->n && len < sizeof ring[0]; i++)
    len += (size_t)snprintf(b + len, sizeof ring[0] - len, "%s%lld", i ? "," : "", (long long)l->v[i]);
  if (len < sizeof ring[0]) snprintf(b + len, sizeof ring[0] - len, "]");
  return b;
}

static const evt_type *in_type(const evt_graph *g, const evt_node *n, int k) { return &g->nodes[n->inputs[k]].type; }

static bool is_int(evt_dtype d) { return d == EVT_I64 || d == EVT_I32; }
static int dclass(evt_dtype d) { return evt_dtype_is_float(d) ? 0 : is_int(d) ? 1 : 2; }

static bool same_shape(const evt_type *a, const evt_type *b) {
  if (a->rank != b->rank) return false;
  for (int i = 0; i < a->rank; i++)
    if (a->shape[i] != b->shape[i]) return false;
  return true;
}

static void set_type(evt_type *t, evt_dtype dt, int rank, const int64_t *shape) {
  t->dtype = dt;
  t->rank = rank;
  for (int i = 0; i < rank; i++) t->shape[i] = shape[i];
}

/* Normalizes an axis d of a rank-`rank` tensor into [0, rank); `what` names the attribute. */
static evt_status norm_axis(evt_graph *g, int id, int64_t *d, int rank, const char *what) {
  if (*d < -rank || *d >= rank) {
    if (rank == 0) FAIL("%s=%lld is out of range for a rank-0 tensor", what, (long long)*d);
    FAIL("%s=%lld is out of range for rank %d (valid: %d..%d)", what, (long long)*d, rank, -rank, rank - 1);
  }
  if (*d < 0) *d += rank;
  return EVT_OK;
}

static evt_status need_float(evt_graph *g, int id, const evt_type *t, const char *what) {
  if (!evt_dtype_is_float(t->dtype)) FAIL("%s must be floating-point, got %s", what, ts(t));
  return EVT_OK;
}

static evt_status need_int(evt_graph *g, int id, const evt_type *t, const char *what) {
  if (!is_int(t->dtype)) FAIL("%s must be an integer tensor (i64 or i32), got %s", what, ts(t));
  return EVT_OK;
}

static evt_status need_same(evt_graph *g, int id, const evt_type *a, const evt_type *b, const char *wa, const char *wb) {
  if (!evt_type_equal(a, b)) FAIL("%s and %s must have the same type: %s vs %s", wa, wb, ts(a), ts(b));
  return EVT_OK;
}

/* The result dtype of a binary op on a and b, or -1 if they do not combine (see the file comment). */
static int binary_dtype(const evt_type *a, const evt_type *b) {
  if (a->dtype == b->dtype) return a->dtype;
  if (a->rank == 0 && b->rank == 0 && a->dtype != EVT_BOOL && b->dtype != EVT_BOOL) {
    /* two scalars: a floating one wins over an integer one; within a class the widest (f32, i64) */
    if (dclass(a->dtype) != dclass(b->dtype)) return evt_dtype_is_float(a->dtype) ? a->dtype : b->dtype;
    return evt_dtype_is_float(a->dtype) ? EVT_F32 : EVT_I64;
  }
  if (a->rank == 0 && (evt_dtype_is_float(a->dtype) || dclass(a->dtype) == dclass(b->dtype))) return b->dtype;
  if (b->rank == 0 && (evt_dtype_is_float(b->dtype) || dclass(a->dtype) == dclass(b->dtype))) return a->dtype;
  return -1;
}

/* A shape attribute checked as a tensor shape: rank ≤ 6, sizes ≥ 0. */
static evt_status check_shape_attr(evt_graph *g, int id, const evt_ilist *s, const char *what) {
  if (s->n < 0 || s->n > EVT_MAX_RANK) FAIL("%s has rank %d, the limit is %d", what, s->n, EVT_MAX_RANK);
  for (int i = 0; i < s->n; i++)
    if (s->v[i] < 0) FAIL("%s=%s has a negative size in dim %d", what, ls(s), i);
  return EVT_OK;
}

static void type_from_list(evt_type *t, evt_dtype dt, const evt_ilist *s) { set_type(t, dt, s->n, s->v); }

/* A list attribute of two window values (kernel/stride/padding/dilation); one value is doubled. */
static evt_status pair_attr(evt_graph *g, int id, evt_ilist *l, const char *what, int64_t lo) {
  if (l->n == 1) {
    l->n = 2;
    l->v[1] = l->v[0];
  }
  if (l->n != 2) FAIL("%s must have 2 values, got %s", what, ls(l));
  for (int i = 0; i < 2; i++)
    if (l->v[i] < lo || l->v[i] > MAX_WINDOW) FAIL("%s=%s: values must be in [%lld, %lld]", what, ls(l), (long long)lo, (long long)MAX_WINDOW);
  return EVT_OK;
}

static evt_status reduction_attr(evt_graph *g, int id, const evt_node *n) {
  if (n->attr.reduction < 0 || n->attr.reduction >= EVT_REDUCTION_COUNT) FAIL("bad reduction %lld", (long long)n->attr.reduction);
  return EVT_OK;
}

/* ---- sources ---------------------------------------------------------------------------------------- */

static evt_status set_from_attrs(evt_graph *g, evt_node *n, int id) {
  const evt_ilist *s = &n->attr.shape;
  if (s->n < 0 || s->n > EVT_MAX_RANK) FAIL("rank %d out of range", s->n);
  if (n->attr.dtype < 0 || n->attr.dtype >= EVT_DTYPE_COUNT) FAIL("bad dtype %lld", (long long)n->attr.dtype);
  n->type.dtype = (evt_dtype)n->attr.dtype;
  n->type.rank = s->n;
  for (int i = 0; i < s->n; i++) {
    if (s->v[i] < 0) FAIL("negative size %lld in dim %d", (long long)s->v[i], i);
    n->type.shape[i] = s->v[i];
  }
  return EVT_OK;
}

/* ---- elementwise ------------------------------------------------------------------------------------ */

static evt_status infer_unary(evt_graph *g, evt_node *n, int id, bool floating) {
  const evt_type *x = in_type(g, n, 0);
  if (floating) CHECK_ST(need_float(g, id, x, "the input"));
  else if (x->dtype == EVT_BOOL) FAIL("the input must be numeric, got %s", ts(x));
  if (n->op == EVT_OP_GELU && (n->attr.approximate < 0 || n->attr.approximate >= EVT_APPROXIMATE_COUNT))
    FAIL("bad approximate %lld", (long long)n->attr.approximate);
  n->type = *x;
  return EVT_OK;
}

static evt_status infer_binary(evt_graph *g, evt_node *n, int id) {
  const evt_type *a = in_type(g, n, 0), *b = in_type(g, n, 1);
  int dt = binary_dtype(a, b);
  if (dt < 0) FAIL("dtypes differ: %s vs %s", ts(a), ts(b));
  if (!evt_broadcast_shapes(a, b, &n->type)) FAIL("shapes do not broadcast: %s vs %s", ts(a), ts(b));
  switch (n->op) {
  case EVT_OP_EQ:
  case EVT_OP_NE:
  case EVT_OP_LT:
  case EVT_OP_LE:
  case EVT_OP_GT:
  case EVT_OP_GE: n->type.dtype = EVT_BOOL; break;
  case EVT_OP_DIV:
    if (!evt_dtype_is_float((evt_dtype)dt)) FAIL("div needs floating operands, got %s / %s", ts(a), ts(b));
    n->type.dtype = (evt_dtype)dt;
    break;
  default:
    if (dt == EVT_BOOL) FAIL("arithmetic on bool operands (%s, %s); cast them first", ts(a), ts(b));
    n->type.dtype = (evt_dtype)dt;
    break;
  }
  return EVT_OK;
}

static evt_status infer_where(evt_graph *g, evt_node *n, int id) {
  const evt_type *c = in_type(g, n, 0), *a = in_type(g, n, 1), *b = in_type(g, n, 2);
  if (c->dtype != EVT_BOOL) FAIL("the condition must be bool, got %s", ts(c));
  int dt = binary_dtype(a, b);
  if (dt < 0) FAIL("dtypes of the branches differ: %s vs %s", ts(a), ts(b));
  evt_type ab;
  if (!evt_broadcast_shapes(a, b, &ab)) FAIL("shapes do not broadcast: %s vs %s", ts(a), ts(b));
  if (!evt_broadcast_shapes(c, &ab, &n->type))
    FAIL("shapes do not broadcast: %s vs %s vs %s", ts(c), ts(a), ts(b));
  n->type.dtype = (evt_dtype)dt;
  return EVT_OK;
}

/* ---- reductions ------------------------------------------------------------------------------------- */

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

static evt_status infer_reduce(evt_graph *g, evt_node *n, int id) {
  const evt_type *x = in_type(g, n, 0);
  if (n->op == EVT_OP_MEAN) CHECK_ST(need_float(g, id, x, "the input of mean"));
  else if (x->dtype == EVT_BOOL) FAIL("cannot reduce a bool tensor (%s); cast it first", ts(x));
  evt_ilist *d = &n->attr.dims;
  if (d->n < 0 || d->n > EVT_MAX_RANK) FAIL("dims has %d values", d->n);
  for (int i = 0; i < d->n; i++) CHECK_ST(norm_axis(g, id, &d->v[i], x->rank, "dims"));
  qsort(d->v, (size_t)d->n, sizeof d->v[0], cmp_i64);
  int m = 0;
  for (int i = 0; i < d->n; i++)
    if (m == 0 || d->v[m - 1] != d->v[i]) d->v[m++] = d->v[i];
  d->n = m;
  bool red[EVT_MAX_RANK] = {0};
  for (int i = 0; i < x->rank; i++) red[i] = m == 0;
  for (int i = 0; i < m; i++) red[d->v[i]] = true;
  if (n->attr.keepdim != 0 && n->attr.keepdim != 1) FAIL("keepdim must be 0 or 1, got %lld", (long long)n->attr.keepdim);
  for (int i = 0; i < x->rank && n->op == EVT_OP_AMAX; i++) /* as PyTorch: a max of nothing has no value */
    if (red[i] && x->shape[i] == 0) FAIL("amax over dim %d of %s, which has size 0", i, ts(x));
  n->type.dtype = x->dtype;
  n->type.rank = 0;
  for (int i = 0; i < x->rank; i++) {
    if (!red[i]) n->type.shape[n->type.rank++] = x->shape[i];
    else if (n->attr.keepdim) n->type.shape[n->type.rank++] = 1;
  }
  return EVT_OK;
}

/* ---- matrix products -------------------------------------------------------------------------------- */

/* Operands of mm / addmm: the same floating dtype; `mixed_fp8` (mm only) also lets one be f8e4m3 and the other
 * f8e5m2 (the output dtype is then set by the caller: out_dtype=f32 is required). */
static evt_status infer_mm(evt_graph *g, evt_node *n, int id, const evt_type *a, const evt_type *b, bool mixed_fp8) {
  if (a->rank != 2 || b->rank != 2) FAIL("mm needs rank-2 operands, got %s x %s", ts(a), ts(b));
  bool mixed = mixed_fp8 && evt_dtype_is_fp8(a->dtype) && evt_dtype_is_fp8(b->dtype);
  if (!evt_dtype_is_float(a->dtype) || (a->dtype != b->dtype && !mixed))
    FAIL("operands must have the same floating dtype: %s x %s", ts(a), ts(b));
  if (a->shape[1] != b->shape[0]) FAIL("inner dimensions differ: %s x %s", ts(a), ts(b));
  set_type(&n->type, a->dtype, 2, (int64_t[]){a->shape[0], b->shape[1]});
  return EVT_OK;
}

static evt_status infer_bmm(evt_graph *g, evt_node *n, int id) {
  const evt_type *a = in_type(g, n, 0), *b = in_type(g, n, 1);
  if (a->rank < 3 || a->rank != b->rank) FAIL("bmm needs operands of equal rank >= 3, got %s x %s", ts(a), ts(b));
  if (!evt_dtype_is_float(a->dtype) || a->dtype != b->dtype)
    FAIL("operands must have the same floating dtype: %s x %s", ts(a), ts(b));
  int r = a->rank;
  for (int i = 0; i < r - 2; i++)
    if (a->shape[i] != b->shape[i]) FAIL("batch dimensions differ: %s x %s", ts(a), ts(b));
  if (a->shape[r - 1] != b->shape[r - 2]) FAIL("inner dimensions differ: %s x %s", ts(a), ts(b));
  n->type = *a;
  n->type.shape[r - 1] = b->shape[r - 1];
  return EVT_OK;
}

static evt_status infer_addmm(evt_graph *g, evt_node *n, int id) {
  const evt_type *c = in_type(g, n, 0);
  CHECK_ST(infer_mm(g, n, id, in_type(g, n, 1), in_type(g, n, 2), false));
  if (c->dtype != n->type.dtype) FAIL("c must have dtype %s, got %s", evt_dtype_name(n->type.dtype), ts(c));
  evt_type bc;
  if (c->rank > 2 || !evt_broadcast_shapes(c, &n->type, &bc) || !same_shape(&bc, &n->type))
    FAIL("c %s does not broadcast to the product %s", ts(c), ts(&n->type));
  return EVT_OK;
}

/* ---- layout ----------------------------------------------------------------------------------------- */

static evt_status infer_reshape(evt_graph *g, evt_node *n, int id) {
  const evt_type *x = in_type(g, n, 0);
  evt_ilist *s = &n->attr.shape;
  if (s->n < 0 || s->n > EVT_MAX_RANK) FAIL("shape has rank %d, the limit is %d", s->n, EVT_MAX_RANK);
  int hole = -1;
  int64_t known = 1;
  for (int i = 0; i < s->n; i++) {
    if (s->v[i] == -1) {
      if (hole >= 0) FAIL("shape=%s has more than one -1", ls(s));
      hole = i;
    } else if (s->v[i] < 0) {
      FAIL("shape=%s has a negative size in dim %d", ls(s), i);
    } else {
      if (s->v[i] > MAX_NUMEL || (known && s->v[i] > MAX_NUMEL / known)) FAIL("shape=%s is too large", ls(s));
      known *= s->v[i];
    }
  }
  int64_t numel = evt_type_numel(x);
  if (hole >= 0) {
    if (known == 0 || numel % known != 0) FAIL("cannot infer the -1 of shape=%s from %s", ls(s), ts(x));
    s->v[hole] = numel / known;
    known = numel;
  }
  if (known != numel) FAIL("shape=%s has %lld elements, the input %s has %lld", ls(s), (long long)known, ts(x), (long long)numel);
  type_from_list(&n->type, x->dtype, s);
  return EVT_OK;
}

static evt_status infer_permute(evt_graph *g, evt_node *n, int id) {
  const evt_type *x = in_type(g, n, 0);
  evt_ilist *d = &n->attr.dims;
  if (d->n != x->rank) FAIL("dims=%s must list all %d dims of %s", ls(d), x->rank, ts(x));
  bool seen[EVT_MAX_RANK] = {0};
  for (int i = 0; i < d->n; i++) {
    CHECK_ST(norm_axis(g, id, &d->v[i], x->rank, "dims"));
    if (seen[d->v[i]]) FAIL("dims=%s is not a permutation (dim %lld repeats)", ls(d), (long long)d->v[i]);
    seen[d->v[i]] = true;
  }
  n->type.dtype = x->dtype;
  n->type.rank = x->rank;
  for (int i = 0; i < x->rank; i++) n->type.shape[i] = x->shape[d->v[i]];
  return EVT_OK;
}

static evt_status infer_transpose(evt_graph *g, evt_node *n, int id) {
  const evt_type *x = in_type(g, n, 0);
  evt_ilist *d = &n->attr.dims;
  if (d->n != 2) FAIL("dims must be a pair [a,b], got %s", ls(d));
  CHECK_ST(norm_axis(g, id, &d->v[0], x->rank, "dims"));
  CHECK_ST(norm_axis(g, id, &d->v[1], x->rank, "dims"));
  n->type = *x;
  n->type.shape[d->v[0]] = x->shape[d->v[1]];
  n->type.shape[d->v[1]] = x->shape[d->v[0]];
  return EVT_OK;
}

static evt_status infer_expand(evt_graph *g, evt_node *n, int id) {
  const evt_type *x = in_type(g, n, 0);
  evt_ilist *s = &n->attr.shape;
  if (s->n < x->rank || s->n > EVT_MAX_RANK)
    FAIL("shape=%s must have rank between %d and %d to expand %s", ls(s), x->rank, EVT_MAX_RANK, ts(x));
  int lead = s->n - x->rank;
  int64_t numel = 1;
  for (int i = 0; i < s->n; i++) {
    int64_t want = s->v[i];
    if (i >= lead) {
      int64_t have = x->shape[i - lead];
      if (want == -1) want = have;
      if (want < 0) FAIL("shape=%s has a negative size in dim %d", ls(s), i);
      if (have != want && have != 1) FAIL("cannot expand %s to shape=%s (dim %d: %lld vs %lld)", ts(x), ls(s), i, (long long)have, (long long)want);
    } else if (want < 0) {
      FAIL("shape=%s: a new leading dim (%d) needs a size >= 0", ls(s), i);
    }
    if (want > MAX_NUMEL || (numel && want > MAX_NUMEL / numel)) FAIL("shape=%s is too large", ls(s));
    numel *= want;
    s->v[i] = want;
  }
  type_from_list(&n->type, x->dtype, s);
  return EVT_OK;
}

/* Python-style clamp of a slice bound into [0, size]. */
static int64_t clamp_bound(int64_t v, int64_t size) {
  if (v < 0) v = v < -size ? 0 : v + size;
  return v > size ? size : v;
}

/* Checks dim/start/end/step of a slice of type x (canonicalizing them) and writes the sliced type. */
static evt_status slice_type(evt_graph *g, evt_node *n, int id, const evt_type *x, evt_type *out) {
  CHECK_ST(norm_axis(g, id, &n->attr.dim, x->rank, "dim"));
  if (n->attr.step <= 0) FAIL("step must be positive, got %lld", (long long)n->attr.step);
  int64_t size = x->shape[n->attr.dim];
  int64_t s = clamp_bound(n->attr.start, size), e = clamp_bound(n->attr.end, size);
  n->attr.start = s;
  n->attr.end = e;
  *out = *x;
  out->shape[n->attr.dim] = e > s ? (e - s - 1) / n->attr.step + 1 : 0;
  return EVT_OK;
}

static evt_status infer_slice_backward(evt_graph *g, evt_node *n, int id) {
  const evt_type *dy = in_type(g, n, 0);
  CHECK_ST(check_shape_attr(g, id, &n->attr.shape, "shape"));
  evt_type x, y;
  type_from_list(&x, dy->dtype, &n->attr.shape);
  CHECK_ST(slice_type(g, n, id, &x, &y));
  if (!same_shape(&y, dy)) FAIL("dy %s must be the slice of shape=%s, i.e. %s", ts(dy), ls(&n->attr.shape), ts(&y));
  n->type = x;
  return EVT_OK;
}

static evt_status infer_concat(evt_graph *g, evt_node *n, int id) {
  const evt_type *a = in_type(g, n, 0);
  if (a->rank == 0) FAIL("cannot concatenate rank-0 tensors");
  CHECK_ST(norm_axis(g, id, &n->attr.dim, a->rank, "dim"));
  int d = (int)n->attr.dim;
  n->type = *a;
  for (int k = 1; k < n->ninputs; k++) {
    const evt_type *b = in_type(g, n, k);
    if (b->dtype != a->dtype || b->rank != a->rank) FAIL("input %d %s does not match input 0 %s", k, ts(b), ts(a));
    for (int i = 0; i < a->rank; i++)
      if (i != d && b->shape[i] != a->shape[i])
        FAIL("input %d %s differs from input 0 %s outside dim %d", k, ts(b), ts(a), d);
    n->type.shape[d] += b->shape[d];
  }
  return EVT_OK;
}

static evt_status infer_squeeze(evt_graph *g, evt_node *n, int id) {
  const evt_type *x = in_type(g, n, 0);
  CHECK_ST(norm_axis(g, id, &n->attr.dim, x->rank, "dim"));
  int d = (int)n->attr.dim;
  if (x->shape[d] != 1) FAIL("dim %d of %s has size %lld, not 1", d, ts(x), (long long)x->shape[d]);
  n->type.dtype = x->dtype;
  n->type.rank = 0;
  for (int i = 0; i < x->rank; i++)
    if (i != d) n->type.shape[n->type.rank++] = x->shape[i];
  return EVT_OK;
}

static evt_status infer_unsqueeze(evt_graph *g, evt_node *n, int id) {
  const evt_type *x = in_type(g, n, 0);
  if (x->rank >= EVT_MAX_RANK) FAIL("unsqueeze of %s exceeds the rank limit %d", ts(x), EVT_MAX_RANK);
  CHECK_ST(norm_axis(g, id, &n->attr.dim, x->rank + 1, "dim"));
  int d = (int)n->attr.dim;
  n->type.dtype = x->dtype;
  n->type.rank = x->rank + 1;
  for (int i = 0, j = 0; i < n->type.rank; i++) n->type.shape[i] = i == d ? 1 : x->shape[j++];
  return EVT_OK;
}

/* ---- sparse ----------------------------------------------------------------------------------------- */

/* The CSR operands (rowptr [M+1], col [nnz], val [nnz]) of spmm/spmm_t; sets *m (rows of A). */
static evt_status check_csr(evt_graph *g, evt_node *n, int id, int64_t *m) {
  const evt_type *rp = in_type(g, n, 0), *col = in_type(g, n, 1), *val = in_type(g, n, 2);
  CHECK_ST(need_int(g, id, rp, "rowptr"));
  CHECK_ST(need_int(g, id, col, "col"));
  CHECK_ST(need_float(g, id, val, "val"));
  if (rp->rank != 1 || rp->shape[0] < 1) FAIL("rowptr must be [M+1] with M >= 0, got %s", ts(rp));
  if (col->rank != 1 || val->rank != 1 || col->shape[0] != val->shape[0])
    FAIL("col and val must both be [nnz]: %s vs %s", ts(col), ts(val));
  *m = rp->shape[0] - 1;
  return EVT_OK;
}

static evt_status infer_spmm(evt_graph *g, evt_node *n, int id) {
  int64_t m;
  CHECK_ST(check_csr(g, n, id, &m));
  const evt_type *val = in_type(g, n, 2), *x = in_type(g, n, 3);
  if (x->rank != 2) FAIL("x must be [K,N], got %s", ts(x));
  if (x->dtype != val->dtype) FAIL("x %s and val %s must have the same dtype", ts(x), ts(val));
  set_type(&n->type, x->dtype, 2, (int64_t[]){m, x->shape[1]});
  return EVT_OK;
}

static evt_status infer_spmm_t(evt_graph *g, evt_node *n, int id) {
  int64_t m;
  CHECK_ST(check_csr(g, n, id, &m));
  const evt_type *val = in_type(g, n, 2), *dy = in_type(g, n, 3);
  const evt_ilist *s = &n->attr.shape;
  if (dy->rank != 2 || dy->shape[0] != m) FAIL("dy must be [M,N] with M = %lld rows of rowptr, got %s", (long long)m, ts(dy));
  if (dy->dtype != val->dtype) FAIL("dy %s and val %s must have the same dtype", ts(dy), ts(val));
  CHECK_ST(check_shape_attr(g, id, s, "shape"));
  if (s->n != 2 || s->v[1] != dy->shape[1]) FAIL("shape=%s must be [K,%lld] to match dy %s", ls(s), (long long)dy->shape[1], ts(dy));
  type_from_list(&n->type, dy->dtype, s);
  return EVT_OK;
}

/* ---- convolution and pooling ------------------------------------------------------------------------ */

/* Layouts (attrs.def `layout`): nhwc tensors are checked through their NCHW view. Activations [N,H,W,C] and
 * nhwc weights [O,kh,kw,C/g] map to [N,C,H,W] / [O,C/g,kh,kw] by the same dim order [0,3,1,2]; the view
 * of an NCHW shape back to NHWC is [0,2,3,1]. Types of another rank are left alone (the callers reject them). */
static void layout_view(const evt_type *t, int64_t layout, bool to_nchw, evt_type *out) {
  *out = *t;
  if (layout != EVT_LAYOUT_NHWC || t->rank != 4) return;
  static const int to_c[4] = {0, 3, 1, 2}, to_l[4] = {0, 2, 3, 1};
  const int *p = to_nchw ? to_c : to_l;
  for (int i = 0; i < 4; i++) out->shape[i] = t->shape[p[i]];
  evt_type_set_contiguous(out);
}

/* Messages about an nhwc node name the NCHW views; say so. */
static evt_status nhwc_note(evt_graph *g, const evt_node *n, evt_status st) {
  if (st != EVT_OK && n->attr.layout == EVT_LAYOUT_NHWC) {
    size_t len = strlen(g->error);
    snprintf(g->error + len, sizeof g->error - len, " (layout=nhwc: shapes shown as NCHW)");
  }
  return st;
}

static evt_status layout_attr(evt_graph *g, const evt_node *n, int id) {
  if (n->attr.layout != EVT_LAYOUT_NCHW && n->attr.layout != EVT_LAYOUT_NHWC)
    FAIL("layout must be nchw or nhwc, got %lld", (long long)n->attr.layout);
  return EVT_OK;
}

/* Checks and canonicalizes stride/padding/dilation/groups. */
static evt_status conv_attrs(evt_graph *g, evt_node *n, int id) {
  CHECK_ST(pair_attr(g, id, &n->attr.stride, "stride", 1));
  CHECK_ST(pair_attr(g, id, &n->attr.padding, "padding", 0));
  CHECK_ST(pair_attr(g, id, &n->attr.dilation, "dilation", 1));
  if (n->attr.groups < 1 || n->attr.groups > MAX_WINDOW) FAIL("groups must be positive, got %lld", (long long)n->attr.groups);
  return EVT_OK;
}

/* The conv2d output type for x [N,C,H,W] and w [O,C/groups,kh,kw] (dtypes checked by the caller). */
static evt_status conv_out(evt_graph *g, evt_node *n, int id, const evt_type *x, const evt_type *w, evt_type *out) {
  if (x->rank != 4) FAIL("x must be [N,C,H,W], got %s", ts(x));
  if (w->rank != 4) FAIL("w must be [O,C/groups,kh,kw], got %s", ts(w));
  int64_t gr = n->attr.groups;
  if (x->shape[1] % gr != 0 || x->shape[1] / gr != w->shape[1])
    FAIL("channels differ: x %s has %lld, w %s expects %lld per group times groups=%lld", ts(x), (long long)x->shape[1],
         ts(w), (long long)w->shape[1], (long long)gr);
  if (w->shape[2] > MAX_WINDOW || w->shape[3] > MAX_WINDOW) FAIL("the kernel of w %s is too large", ts(w));
  if (w->shape[0] % gr != 0) FAIL("output channels %lld of w %s are not divisible by groups=%lld", (long long)w->shape[0], ts(w), (long long)gr);
  *out = *x;
  out->shape[1] = w->shape[0];
  for (int i = 0; i < 2; i++) {
    int64_t span = x->shape[2 + i] + 2 * n->attr.padding.v[i] - n->attr.dilation.v[i] * (w->shape[2 + i] - 1) - 1;
    if (span < 0)
      FAIL("the kernel of w %s (dilation %s) is larger than the padded input %s", ts(w), ls(&n->attr.dilation), ts(x));
    out->shape[2 + i] = span / n->attr.stride.v[i] + 1;
  }
  return EVT_OK;
}

static evt_status infer_conv_view(evt_graph *g, evt_node *n, int id) {
  CHECK_ST(conv_attrs(g, n, id));
  CHECK_ST(layout_attr(g, n, id));
  int64_t lay = n->attr.layout;
  evt_type av, bv, yv;
  layout_view(in_type(g, n, 0), lay, true, &av);
  layout_view(in_type(g, n, 1), lay, true, &bv);
  const evt_type *a = &av, *b = &bv; /* NCHW views; messages name them as such */
  if (!evt_dtype_is_float(a->dtype) || a->dtype != b->dtype)
    FAIL("operands must have the same floating dtype: %s, %s", ts(a), ts(b));
  evt_type x, w, y;
  switch (n->op) {
  case EVT_OP_CONV2D:
    CHECK_ST(conv_out(g, n, id, a, b, &yv));
    layout_view(&yv, lay, false, &n->type);
    return EVT_OK;
  case EVT_OP_CONV2D_BACKWARD_INPUT: /* (dy, w), shape = x */
    CHECK_ST(check_shape_attr(g, id, &n->attr.shape, "shape"));
    type_from_list(&yv, a->dtype, &n->attr.shape);
    layout_view(&yv, lay, true, &x);
    CHECK_ST(conv_out(g, n, id, &x, b, &y));
    if (!same_shape(&y, a)) FAIL("dy %s must be the conv2d output %s of x shape=%s", ts(a), ts(&y), ls(&n->attr.shape));
    layout_view(&x, lay, false, &n->type);
    return EVT_OK;
  case EVT_OP_CONV2D_BACKWARD_WEIGHT: /* (x, dy), shape = w */
    CHECK_ST(check_shape_attr(g, id, &n->attr.shape, "shape"));
    type_from_list(&yv, a->dtype, &n->attr.shape);
    layout_view(&yv, lay, true, &w);
    CHECK_ST(conv_out(g, n, id, a, &w, &y));
    if (!same_shape(&y, b)) FAIL("dy %s must be the conv2d output %s of w shape=%s", ts(b), ts(&y), ls(&n->attr.shape));
    layout_view(&w, lay, false, &n->type);
    return EVT_OK;
  default: EVT_UNREACHABLE();
  }
}

/* The max/avg pool output of x (floor mode). */
static evt_status pool_out(evt_graph *g, evt_node *n, int id, const evt_type *x, evt_type *out) {
  CHECK_ST(pair_attr(g, id, &n->attr.kernel, "kernel", 1));
  CHECK_ST(pair_attr(g, id, &n->attr.stride, "stride", 1));
  CHECK_ST(pair_attr(g, id, &n->attr.padding, "padding", 0));
  if (x->rank != 4) FAIL("x must be [N,C,H,W], got %s", ts(x));
  if (x->dtype == EVT_BOOL) FAIL("x must be numeric, got %s", ts(x));
  *out = *x;
  for (int i = 0; i < 2; i++) {
    int64_t k = n->attr.kernel.v[i], p = n->attr.padding.v[i];
    if (2 * p > k) FAIL("padding=%s must be at most half of kernel=%s", ls(&n->attr.padding), ls(&n->attr.kernel));
    int64_t span = x->shape[2 + i] + 2 * p - k;
    if (span < 0) FAIL("kernel=%s is larger than the padded input %s", ls(&n->attr.kernel), ts(x));
    out->shape[2 + i] = span / n->attr.stride.v[i] + 1;
  }
  return EVT_OK;
}

static evt_status infer_pool_view(evt_graph *g, evt_node *n, int id) {
  CHECK_ST(layout_attr(g, n, id));
  int64_t lay = n->attr.layout;
  evt_type av, t;
  layout_view(in_type(g, n, 0), lay, true, &av);
  const evt_type *a = &av; /* NCHW view */
  evt_type x, y;
  switch (n->op) {
  case EVT_OP_MAX_POOL2D:
  case EVT_OP_AVG_POOL2D:
    if (n->op == EVT_OP_AVG_POOL2D) CHECK_ST(need_float(g, id, a, "x"));
    CHECK_ST(pool_out(g, n, id, a, &t));
    layout_view(&t, lay, false, &n->type);
    return EVT_OK;
  case EVT_OP_MAX_POOL2D_BACKWARD: /* (dy, x) */
    layout_view(in_type(g, n, 1), lay, true, &x);
    if (x.dtype != a->dtype) FAIL("dy %s and x %s must have the same dtype", ts(a), ts(&x));
    break;
  case EVT_OP_AVG_POOL2D_BACKWARD: /* (dy), shape = x */
    CHECK_ST(need_float(g, id, a, "dy"));
    CHECK_ST(check_shape_attr(g, id, &n->attr.shape, "shape"));
    type_from_list(&t, a->dtype, &n->attr.shape);
    layout_view(&t, lay, true, &x);
    break;
  default: EVT_UNREACHABLE();
  }
  CHECK_ST(pool_out(g, n, id, &x, &y));
  if (!same_shape(&y, a)) FAIL("dy %s must be the pooled output %s of x %s", ts(a), ts(&y), ts(&x));
  layout_view(&x, lay, false, &n->type);
  return EVT_OK;
}

static evt_status infer_conv(evt_graph *g, evt_node *n, int id) { return nhwc_note(g, n, infer_conv_view(g, n, id)); }
static evt_status infer_pool(evt_graph *g, evt_node *n, int id) { return nhwc_note(g, n, infer_pool_view(g, n, id)); }

static evt_status adaptive_out(evt_graph *g, evt_node *n, int id, const evt_type *x, evt_type *out) {
  const evt_ilist *s = &n->attr.shape;
  if (x->rank != 4) FAIL("x must be [N,C,H,W], got %s", ts(x));
  if (x->dtype == EVT_BOOL) FAIL("x must be numeric, got %s", ts(x));
  if (s->n != 2 || s->v[0] < 1 || s->v[1] < 1) FAIL("shape must be [Ho,Wo] with positive sizes, got %s", ls(s));
  if (x->shape[2] < 1 || x->shape[3] < 1) FAIL("x %s has an empty spatial dim", ts(x));
  *out = *x;
  out->shape[2] = s->v[0];
  out->shape[3] = s->v[1];
  return EVT_OK;
}

/* ---- row ops ---------------------------------------------------------------------------------------- */

static evt_status infer_softmax(evt_graph *g, evt_node *n, int id) {
  const evt_type *x = in_type(g, n, 0);
  if (n->ninputs == 2) CHECK_ST(need_same(g, id, x, in_type(g, n, 1), "dy", "y"));
  CHECK_ST(need_float(g, id, x, n->ninputs == 2 ? "dy" : "x"));
  if (x->rank == 0) FAIL("x must have rank >= 1, got %s", ts(x));
  CHECK_ST(norm_axis(g, id, &n->attr.dim, x->rank, "dim"));
  n->type = *x;
  return EVT_OK;
}

/* Norm ops: `ch` is the normalized feature dim (layer: last, batch: 1); w/b must be [that size]. */
static evt_status check_affine(evt_graph *g, int id, const evt_type *x, const evt_type *p, int ch, const char *what) {
  if (p->dtype != x->dtype || p->rank != 1 || p->shape[0] != x->shape[ch])
    FAIL("%s must be %s[%lld] to match x %s, got %s", what, evt_dtype_name(x->dtype), (long long)x->shape[ch], ts(x), ts(p));
  return EVT_OK;
}

static evt_status infer_norm(evt_graph *g, evt_node *n, int id) {
  bool batch = n->op == EVT_OP_BATCH_NORM || n->op == EVT_OP_BATCH_NORM_BACKWARD_INPUT || n->op == EVT_OP_BATCH_NORM_BACKWARD_WEIGHT;
  bool fwd = n->op == EVT_OP_LAYER_NORM || n->op == EVT_OP_BATCH_NORM;
  if (!(n->attr.eps >= 0)) FAIL("eps must be >= 0, got %g", n->attr.eps);
  int xi = fwd ? 0 : 1;
  const evt_type *x = in_type(g, n, xi);
  CHECK_ST(need_float(g, id, x, "x"));
  if (batch ? x->rank < 2 : x->rank < 1) FAIL("x must have rank >= %d, got %s", batch ? 2 : 1, ts(x));
  int ch = batch ? 1 : x->rank - 1;
  if (batch && evt_type_numel(x) == 0) FAIL("batch statistics of %s, which has no value per channel", ts(x));
  if (!fwd) CHECK_ST(need_same(g, id, in_type(g, n, 0), x, "dy", "x"));
  if (fwd) {
    if (n->ninputs > 1) CHECK_ST(check_affine(g, id, x, in_type(g, n, 1), ch, "w"));
    if (n->ninputs > 2) CHECK_ST(check_affine(g, id, x, in_type(g, n, 2), ch, "b"));
  } else if (n->ninputs > 2) {
    CHECK_ST(check_affine(g, id, x, in_type(g, n, 2), ch, "w"));
  }
  if (n->op == EVT_OP_LAYER_NORM_BACKWARD_WEIGHT || n->op == EVT_OP_BATCH_NORM_BACKWARD_WEIGHT)
    set_type(&n->type, x->dtype, 1, &x->shape[ch]);
  else
    n->type = *x;
  return EVT_OK;
}

/* ---- losses ----------------------------------------------------------------------------------------- */

/* The forward output type of a loss with the given per-element type under n's reduction. */
static void loss_out(const evt_node *n, const evt_type *elem, evt_type *out) {
  *out = *elem;
  if (n->attr.reduction != EVT_REDUCTION_NONE) out->rank = 0;
}

/* nll_loss / cross_entropy operands: logp [N,C] float, target int [N]; *elem = the per-row type [N]. */
static evt_status check_class_loss(evt_graph *g, evt_node *n, int id, const evt_type *p, const evt_type *t, evt_type *elem) {
  CHECK_ST(reduction_attr(g, id, n));
  CHECK_ST(need_float(g, id, p, "the scores"));
  if (p->rank != 2) FAIL("the scores must be [N,C], got %s", ts(p));
  if (p->shape[1] == 0) FAIL("the scores %s have no class: every target would be out of range", ts(p));
  CHECK_ST(need_int(g, id, t, "the target"));
  if (t->rank != 1 || t->shape[0] != p->shape[0]) FAIL("the target must be [%lld] to match %s, got %s", (long long)p->shape[0], ts(p), ts(t));
  set_type(elem, p->dtype, 1, p->shape);
  return EVT_OK;
}

static evt_status infer_loss(evt_graph *g, evt_node *n, int id) {
  evt_type elem, y;
  const evt_type *a = in_type(g, n, 0), *b = in_type(g, n, 1);
  switch (n->op) {
  case EVT_OP_NLL_LOSS:
  case EVT_OP_CROSS_ENTROPY:
    CHECK_ST(check_class_loss(g, n, id, a, b, &elem));
    loss_out(n, &elem, &n->type);
    return EVT_OK;
  case EVT_OP_BCE_WITH_LOGITS:
  case EVT_OP_MSE_LOSS:
    CHECK_ST(reduction_attr(g, id, n));
    CHECK_ST(need_float(g, id, a, "x"));
    CHECK_ST(need_same(g, id, a, b, "x", "y"));
    loss_out(n, a, &n->type);
    return EVT_OK;
  case EVT_OP_NLL_LOSS_BACKWARD: /* (dy, logp, target) */
    CHECK_ST(check_class_loss(g, n, id, b, in_type(g, n, 2), &elem));
    loss_out(n, &elem, &y);
    if (!evt_type_equal(a, &y)) FAIL("dy must be %s (the forward output), got %s", ts(&y), ts(a));
    n->type = *b;
    return EVT_OK;
  case EVT_OP_BCE_WITH_LOGITS_BACKWARD: /* (dy, x, y) */
  case EVT_OP_MSE_LOSS_BACKWARD:
    CHECK_ST(reduction_attr(g, id, n));
    CHECK_ST(need_float(g, id, b, "x"));
    CHECK_ST(need_same(g, id, b, in_type(g, n, 2), "x", "y"));
    loss_out(n, b, &y);
    if (!evt_type_equal(a, &y)) FAIL("dy must be %s (the forward output), got %s", ts(&y), ts(a));
    n->type = *b;
    return EVT_OK;
  default: EVT_UNREACHABLE();
  }
}

/* ---- gathers and scatters --------------------------------------------------------------------------- */

static evt_status infer_gather(evt_graph *g, evt_node *n, int id) {
  const evt_type *a = in_type(g, n, 0);
  const evt_ilist *s = &n->attr.shape;
  switch (n->op) {
  case EVT_OP_ONE_HOT:
    CHECK_ST(need_int(g, id, a, "the index"));
    if (n->attr.num_classes <= 0 || n->attr.num_classes > MAX_NUMEL) FAIL("num_classes must be positive, got %lld", (long long)n->attr.num_classes);
    if (n->attr.dtype < 0 || n->attr.dtype >= EVT_DTYPE_COUNT) FAIL("bad dtype %lld", (long long)n->attr.dtype);
    if (a->rank >= EVT_MAX_RANK) FAIL("one_hot of %s exceeds the rank limit %d", ts(a), EVT_MAX_RANK);
    n->type = *a;
    n->type.dtype = (evt_dtype)n->attr.dtype;
    n->type.shape[n->type.rank++] = n->attr.num_classes;
    return EVT_OK;
  case EVT_OP_EMBEDDING: { /* (w [V,D], idx) */
    const evt_type *idx = in_type(g, n, 1);
    CHECK_ST(need_float(g, id, a, "the table"));
    if (a->rank != 2) FAIL("the table must be [V,D], got %s", ts(a));
    CHECK_ST(need_int(g, id, idx, "the index"));
    if (idx->rank >= EVT_MAX_RANK) FAIL("embedding of index %s exceeds the rank limit %d", ts(idx), EVT_MAX_RANK);
    n->type = *idx;
    n->type.dtype = a->dtype;
    n->type.shape[n->type.rank++] = a->shape[1];
    return EVT_OK;
  }
  case EVT_OP_EMBEDDING_BACKWARD: { /* (dy, idx), shape = [V,D] */
    const evt_type *idx = in_type(g, n, 1);
    CHECK_ST(need_float(g, id, a, "dy"));
    CHECK_ST(need_int(g, id, idx, "the index"));
    CHECK_ST(check_shape_attr(g, id, s, "shape"));
    if (s->n != 2) FAIL("shape must be [V,D], got %s", ls(s));
    evt_type want = *idx;
    want.dtype = a->dtype;
    if (want.rank >= EVT_MAX_RANK) FAIL("index %s exceeds the rank limit", ts(idx));
    want.shape[want.rank++] = s->v[1];
    if (!evt_type_equal(&want, a)) FAIL("dy must be %s (index shape + [D]), got %s", ts(&want), ts(a));
    type_from_list(&n->type, a->dtype, s);
    return EVT_OK;
  }
  case EVT_OP_INDEX_SELECT:
  case EVT_OP_INDEX_SELECT_BACKWARD: {
    const evt_type *idx = in_type(g, n, 1);
    CHECK_ST(need_int(g, id, idx, "the index"));
    if (idx->rank != 1) FAIL("the index must have rank 1, got %s", ts(idx));
    evt_type x = *a;
    if (n->op == EVT_OP_INDEX_SELECT_BACKWARD) {
      CHECK_ST(check_shape_attr(g, id, s, "shape"));
      type_from_list(&x, a->dtype, s);
    }
    CHECK_ST(norm_axis(g, id, &n->attr.dim, x.rank, "dim"));
    evt_type y = x;
    y.shape[n->attr.dim] = idx->shape[0];
    if (n->op == EVT_OP_INDEX_SELECT) {
      n->type = y;
    } else {
      if (!evt_type_equal(&y, a)) FAIL("dy must be %s (the selection of shape=%s), got %s", ts(&y), ls(s), ts(a));
      n->type = x;
    }
    return EVT_OK;
  }
  case EVT_OP_COO_PERM:
  case EVT_OP_COO_ROWPTR: {
    CHECK_ST(need_int(g, id, a, "the key"));
    if (a->rank != 1) FAIL("the key must have rank 1, got %s", ts(a));
    int64_t rows = n->attr.rows;
    if (rows <= 0 || rows >= MAX_NUMEL) FAIL("rows must be positive, got %lld", (long long)rows);
    int64_t len = n->op == EVT_OP_COO_PERM ? a->shape[0] : rows + 1;
    set_type(&n->type, EVT_I64, 1, &len);
    return EVT_OK;
  }
  default: EVT_UNREACHABLE();
  }
}

/* ---- attention -------------------------------------------------------------------------------------- */

/* q [B,H,S,D], k [B,H,Sk,D], v [B,H,Sk,Dv] of one float dtype; *out = [B,H,S,Dv]. */
static evt_status sdpa_out(evt_graph *g, evt_node *n, int id, const evt_type *q, const evt_type *k, const evt_type *v, evt_type *out) {
  if (q->rank != 4 || k->rank != 4 || v->rank != 4) FAIL("q, k, v must be [B,H,S,D], got %s, %s, %s", ts(q), ts(k), ts(v));
  CHECK_ST(need_float(g, id, q, "q"));
  if (k->dtype != q->dtype || v->dtype != q->dtype) FAIL("q, k, v must have one dtype: %s, %s, %s", ts(q), ts(k), ts(v));
  if (q->shape[0] != k->shape[0] || q->shape[1] != k->shape[1] || q->shape[3] != k->shape[3])
    FAIL("q %s and k %s differ in batch, heads or head dim", ts(q), ts(k));
  if (v->shape[0] != k->shape[0] || v->shape[1] != k->shape[1] || v->shape[2] != k->shape[2])
    FAIL("k %s and v %s differ in batch, heads or sequence length", ts(k), ts(v));
  if (!(n->attr.scale >= 0)) FAIL("scale must be >= 0 (0: 1/sqrt(head dim)), got %g", n->attr.scale);
  if (n->attr.causal != 0 && n->attr.causal != 1) FAIL("causal must be 0 or 1, got %lld", (long long)n->attr.causal);
  *out = *q;
  out->shape[3] = v->shape[3];
  return EVT_OK;
}

/* The optional mask (input `k`): bool (true = keep, as PyTorch) or q's float dtype (added to the scaled
 * scores); rank <= 4 and broadcastable numpy-style to the scores [B,H,Sq,Skv], as PyTorch's attn_mask. */
static evt_status sdpa_mask(evt_graph *g, evt_node *n, int id, int k, const evt_type *q, const evt_type *kt) {
  if (n->ninputs <= k) return EVT_OK;
  const evt_type *m = in_type(g, n, k);
  if (m->dtype != EVT_BOOL && m->dtype != q->dtype)
    FAIL("the mask must be bool or q's dtype %s, got %s", evt_dtype_name(q->dtype), ts(m));
  int64_t scores[4] = {q->shape[0], q->shape[1], q->shape[2], kt->shape[2]};
  if (m->rank > 4) FAIL("the mask %s has rank > 4; it must broadcast to the scores [B,H,Sq,Skv]", ts(m));
  for (int d = 0; d < m->rank; d++) {
    int64_t want = scores[4 - m->rank + d];
    if (m->shape[d] != 1 && m->shape[d] != want)
      FAIL("the mask %s does not broadcast to the scores [%lld,%lld,%lld,%lld]", ts(m), (long long)scores[0],
           (long long)scores[1], (long long)scores[2], (long long)scores[3]);
  }
  return EVT_OK;
}

static evt_status infer_sdpa(evt_graph *g, evt_node *n, int id) {
  if (n->op == EVT_OP_SDPA) {
    CHECK_ST(sdpa_out(g, n, id, in_type(g, n, 0), in_type(g, n, 1), in_type(g, n, 2), &n->type));
    return sdpa_mask(g, n, id, 3, in_type(g, n, 0), in_type(g, n, 1));
  }
  const evt_type *dout = in_type(g, n, 0);
  evt_type y;
  CHECK_ST(sdpa_out(g, n, id, in_type(g, n, 1), in_type(g, n, 2), in_type(g, n, 3), &y));
  CHECK_ST(sdpa_mask(g, n, id, 4, in_type(g, n, 1), in_type(g, n, 2)));
  if (!evt_type_equal(dout, &y)) FAIL("dout must be %s (the forward output), got %s", ts(&y), ts(dout));
  int which = n->op == EVT_OP_SDPA_BACKWARD_Q ? 1 : n->op == EVT_OP_SDPA_BACKWARD_K ? 2 : 3;
  n->type = *in_type(g, n, which);
  return EVT_OK;
}

/* ---- the rule of every op --------------------------------------------------------------------------- */

/* One switch over every op (the longer rules are the functions above): -Werror=switch keeps it complete. */
static evt_status infer_op(evt_graph *g, evt_node *n, int id) {
  switch (n->op) {
  case EVT_OP_INPUT:
  case EVT_OP_PARAM:
    CHECK_ST(set_from_attrs(g, n, id));
    if (n->attr.init < 0 || n->attr.init >= EVT_INIT_COUNT) FAIL("bad init %lld", (long long)n->attr.init);
    if (n->attr.init == EVT_INIT_ROWPTR && (!is_int(n->type.dtype) || n->type.rank != 1 || n->type.shape[0] < 1))
      FAIL("init=rowptr needs an integer [M+1] tensor, got %s", ts(&n->type));
    if ((n->attr.init == EVT_INIT_UNIFORM || n->attr.init == EVT_INIT_RANDINT) && !(n->attr.lo < n->attr.hi))
      FAIL("init range [lo, hi) = [%g, %g) is empty", n->attr.lo, n->attr.hi);
    if (n->attr.init == EVT_INIT_NORMAL && !(n->attr.std >= 0)) FAIL("std must be >= 0, got %g", n->attr.std);
    return EVT_OK;
  case EVT_OP_FULL:
    return set_from_attrs(g, n, id);
  case EVT_OP_SCALAR:
    CHECK_ST(set_from_attrs(g, n, id));
    if (n->type.rank != 0) FAIL("a scalar has rank 0, got %s", ts(&n->type));
    return EVT_OK;
  case EVT_OP_RAND:
    CHECK_ST(set_from_attrs(g, n, id));
    return need_float(g, id, &n->type, "rand's dtype");

  case EVT_OP_EXP:
  case EVT_OP_LOG:
  case EVT_OP_SQRT:
  case EVT_OP_RSQRT:
  case EVT_OP_RECIPROCAL:
  case EVT_OP_TANH:
  case EVT_OP_SIGMOID:
  case EVT_OP_GELU:
  case EVT_OP_ERF:
  case EVT_OP_POW:
    return infer_unary(g, n, id, true);
  case EVT_OP_NEG:
  case EVT_OP_ABS:
  case EVT_OP_SIGN:
  case EVT_OP_RELU:
    return infer_unary(g, n, id, false);
  case EVT_OP_CAST:
    if (n->attr.dtype < 0 || n->attr.dtype >= EVT_DTYPE_COUNT) FAIL("bad dtype %lld", (long long)n->attr.dtype);
    n->type = *in_type(g, n, 0);
    n->type.dtype = (evt_dtype)n->attr.dtype;
    return EVT_OK;
  case EVT_OP_GELU_BACKWARD:
  case EVT_OP_THRESHOLD_BACKWARD: {
    const evt_type *dy = in_type(g, n, 0), *x = in_type(g, n, 1);
    CHECK_ST(need_same(g, id, dy, x, "dy", n->op == EVT_OP_GELU_BACKWARD ? "x" : "y"));
    if (n->op == EVT_OP_GELU_BACKWARD) CHECK_ST(need_float(g, id, dy, "dy"));
    else if (dy->dtype == EVT_BOOL) FAIL("dy must be numeric, got %s", ts(dy));
    if (n->op == EVT_OP_GELU_BACKWARD && (n->attr.approximate < 0 || n->attr.approximate >= EVT_APPROXIMATE_COUNT))
      FAIL("bad approximate %lld", (long long)n->attr.approximate);
    n->type = *dy;
    return EVT_OK;
  }

  case EVT_OP_ADD:
  case EVT_OP_SUB:
  case EVT_OP_MUL:
  case EVT_OP_DIV:
  case EVT_OP_MAXIMUM:
  case EVT_OP_MINIMUM:
  case EVT_OP_EQ:
  case EVT_OP_NE:
  case EVT_OP_LT:
  case EVT_OP_LE:
  case EVT_OP_GT:
  case EVT_OP_GE:
    return infer_binary(g, n, id);
  case EVT_OP_WHERE:
    return infer_where(g, n, id);

  case EVT_OP_SUM:
  case EVT_OP_MEAN:
  case EVT_OP_AMAX:
    return infer_reduce(g, n, id);

  case EVT_OP_MM: {
    CHECK_ST(infer_mm(g, n, id, in_type(g, n, 0), in_type(g, n, 1), true));
    int64_t od = n->attr.out_dtype;
    if (in_type(g, n, 0)->dtype != in_type(g, n, 1)->dtype && od != EVT_F32)
      FAIL("mixed fp8 operands %s x %s need out_dtype=f32", ts(in_type(g, n, 0)), ts(in_type(g, n, 1)));
    if (od == -1) return EVT_OK;
    if (od != EVT_F32 && od != n->type.dtype)
      FAIL("out_dtype=%s: the output is the operands' dtype %s or the f32 accumulator", evt_dtype_name((evt_dtype)od),
           evt_dtype_name(n->type.dtype));
    if (od == n->type.dtype) n->attr.out_dtype = -1; /* canonical: the operands' dtype is the default */
    else n->type.dtype = EVT_F32;
    return EVT_OK;
  }
  case EVT_OP_BMM:
    return infer_bmm(g, n, id);
  case EVT_OP_ADDMM:
    return infer_addmm(g, n, id);

  case EVT_OP_RESHAPE:
    return infer_reshape(g, n, id);
  case EVT_OP_PERMUTE:
    return infer_permute(g, n, id);
  case EVT_OP_TRANSPOSE:
    return infer_transpose(g, n, id);
  case EVT_OP_EXPAND:
    return infer_expand(g, n, id);
  case EVT_OP_SLICE:
    return slice_type(g, n, id, in_type(g, n, 0), &n->type);
  case EVT_OP_SLICE_BACKWARD:
    return infer_slice_backward(g, n, id);
  case EVT_OP_CONCAT:
    return infer_concat(g, n, id);
  case EVT_OP_SQUEEZE:
    return infer_squeeze(g, n, id);
  case EVT_OP_UNSQUEEZE:
    return infer_unsqueeze(g, n, id);

  case EVT_OP_SPMM:
    return infer_spmm(g, n, id);
  case EVT_OP_SPMM_T:
    return infer_spmm_t(g, n, id);

  case EVT_OP_CONV2D:
  case EVT_OP_CONV2D_BACKWARD_INPUT:
  case EVT_OP_CONV2D_BACKWARD_WEIGHT:
    return infer_conv(g, n, id);
  case EVT_OP_MAX_POOL2D:
  case EVT_OP_MAX_POOL2D_BACKWARD:
  case EVT_OP_AVG_POOL2D:
  case EVT_OP_AVG_POOL2D_BACKWARD:
    return infer_pool(g, n, id);
  case EVT_OP_ADAPTIVE_MAX_POOL2D: {
    evt_type x, y;
    CHECK_ST(layout_attr(g, n, id));
    layout_view(in_type(g, n, 0), n->attr.layout, true, &x);
    CHECK_ST(nhwc_note(g, n, adaptive_out(g, n, id, &x, &y)));
    layout_view(&y, n->attr.layout, false, &n->type);
    return EVT_OK;
  }
  case EVT_OP_ADAPTIVE_MAX_POOL2D_BACKWARD: { /* (dy, x) */
    evt_type dy, x, y;
    CHECK_ST(layout_attr(g, n, id));
    layout_view(in_type(g, n, 0), n->attr.layout, true, &dy);
    layout_view(in_type(g, n, 1), n->attr.layout, true, &x);
    CHECK_ST(nhwc_note(g, n, adaptive_out(g, n, id, &x, &y)));
    if (!evt_type_equal(&dy, &y)) return nhwc_note(g, n, evt_graph_errorf(g, id, EVT_ERR_TYPE, "dy must be %s (the pooled output), got %s", ts(&y), ts(&dy)));
    n->type = *in_type(g, n, 1);
    return EVT_OK;
  }

  case EVT_OP_SOFTMAX:
  case EVT_OP_LOG_SOFTMAX:
  case EVT_OP_SOFTMAX_BACKWARD:
  case EVT_OP_LOG_SOFTMAX_BACKWARD:
    return infer_softmax(g, n, id);
  case EVT_OP_LAYER_NORM:
  case EVT_OP_LAYER_NORM_BACKWARD_INPUT:
  case EVT_OP_LAYER_NORM_BACKWARD_WEIGHT:
  case EVT_OP_BATCH_NORM:
  case EVT_OP_BATCH_NORM_BACKWARD_INPUT:
  case EVT_OP_BATCH_NORM_BACKWARD_WEIGHT:
    return infer_norm(g, n, id);

  case EVT_OP_DROPOUT:
    CHECK_ST(need_float(g, id, in_type(g, n, 0), "x"));
    if (!(n->attr.p >= 0 && n->attr.p < 1)) FAIL("p must be in [0, 1), got %g", n->attr.p);
    n->type = *in_type(g, n, 0);
    return EVT_OK;

  case EVT_OP_NLL_LOSS:
  case EVT_OP_NLL_LOSS_BACKWARD:
  case EVT_OP_CROSS_ENTROPY:
  case EVT_OP_BCE_WITH_LOGITS:
  case EVT_OP_BCE_WITH_LOGITS_BACKWARD:
  case EVT_OP_MSE_LOSS:
  case EVT_OP_MSE_LOSS_BACKWARD:
    return infer_loss(g, n, id);

  case EVT_OP_ONE_HOT:
  case EVT_OP_EMBEDDING:
  case EVT_OP_EMBEDDING_BACKWARD:
  case EVT_OP_INDEX_SELECT:
  case EVT_OP_INDEX_SELECT_BACKWARD:
  case EVT_OP_COO_PERM:
  case EVT_OP_COO_ROWPTR:
    return infer_gather(g, n, id);

  case EVT_OP_SDPA:
  case EVT_OP_SDPA_BACKWARD_Q:
  case EVT_OP_SDPA_BACKWARD_K:
  case EVT_OP_SDPA_BACKWARD_V:
    return infer_sdpa(g, n, id);
  case EVT_OP_COUNT:
    break;
  }
  FAIL("unknown op %d", (int)n->op);
}

evt_status evt_infer_node(evt_graph *g, evt_node *n, int id) {
  memset(&n->type, 0, sizeof n->type);
  if ((unsigned)n->op >= EVT_OP_COUNT) FAIL("unknown op %d", (int)n->op);
  const evt_op_info *info = &evt_op_table[n->op];
  if (n->ninputs < info->min_inputs || n->ninputs > info->max_inputs)
    FAIL("takes %d to %d inputs, got %d", info->min_inputs, info->max_inputs, n->ninputs);
  for (int k = 0; k < n->ninputs; k++)
    if (n->inputs[k] < 0 || n->inputs[k] >= id) FAIL("input %d is not an earlier node", k);
  CHECK_ST(infer_op(g, n, id));
  if (n->type.rank < 0 || n->type.rank > EVT_MAX_RANK) FAIL("result rank %d exceeds the limit %d", n->type.rank, EVT_MAX_RANK);
  int64_t numel = 1;
  for (int i = 0; i < n->type.rank; i++) {
    int64_t s = n->type.shape[i];
    if (s < 0) FAIL("result %s has a negative size", ts(&n->type));
    if (s > MAX_NUMEL || (numel && s > MAX_NUMEL / numel)) FAIL("result %s has too many elements", ts(&n->type));
    numel *= s;
  }
  evt_type_set_contiguous(&n->type);
  return EVT_OK;
}

bool evt_broadcast_shapes(const evt_type *a, const evt_type *b, evt_type *out) {
  int r = a->rank > b->rank ? a->rank : b->rank;
  out->rank = r;
  for (int i = 0; i < r; i++) {
    int ia = i - (r - a->rank), ib = i - (r - b->rank);
    int64_t da = ia >= 0 ? a->shape[ia] : 1, db = ib >= 0 ? b->shape[ib] : 1;
    if (da != db && da != 1 && db != 1) return false;
    out->shape[i] = da == 1 ? db : da;
  }
  return true;
}
