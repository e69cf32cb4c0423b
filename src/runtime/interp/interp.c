/* The CPU interpreter: the reference semantics of every op in src/ir/ops.def, against which every pass,
 * partition and GPU kernel of evt is checked.
 *
 * Contract
 * - Tensors (evt_tensor) are contiguous row-major and hold every dtype as double; integers exactly, which a
 *   double does within +-(2^53 - 1) (EVT_INT_EXACT_MAX). An integer value past it (an i64 input, sum or
 *   product) is an error naming the node (EVT_ERR_UNSUPPORTED), never a rounded answer; the caller's
 *   integer inputs must hold integers of their dtype (EVT_ERR_INVALID otherwise).
 * - evt_interp_node runs one node: it checks its input tensors against the input nodes' types, allocates
 *   the output with the node's type, computes in double, then rounds every stored value to the node's
 *   dtype with evt_round_to_dtype (f32 → float, f16/bf16 round-to-nearest-even, fp8 round-to-nearest-even
 *   saturating to ±max, ints truncated, i32 wrapped as two's complement); with EVT_RUN_FP64 floating dtypes
 *   (fp8 too) keep the double value (finite-difference gradient checks).
 * - Every op has one fixed order of summation (row-major over the reduced elements; matrix products and
 *   convolutions above EVT_INTERP_BLAS_MIN multiply-adds: the order of OpenBLAS's dgemm, one thread), so a
 *   run is deterministic: same graph, same inputs, same machine, same bits. (OpenBLAS picks its kernels by
 *   CPU: another CPU may differ in a double's last bits, which f32 rounding almost always hides.)
 * - evt_interp_run walks the nodes in id order (inputs always precede their users); input/param slots are
 *   the caller's (checked, never freed); every other slot is filled by the interpreter, and freed right
 *   after its last use unless it is a graph output or keep_all is set. Slots must be zeroed or hold
 *   tensors from an earlier run (those are freed before being refilled).
 * - Bad values met at run time (an index out of range, a CSR row pointer that is not monotone) return
 *   EVT_ERR_INVALID with a message naming the node; NaN inputs propagate through arithmetic.
 * - evt_interp_run_fp8_noise (interp.h) is evt_interp_run with relative noise on every fp8 x fp8 GEMM's product, from
 *   its own counter-based generator (the run's rand / dropout draws are unchanged): the perturbed reference of
 *   `evtc run --check`'s fp8 rule.
 * - evt_interp_init_inputs fills input/param slots from their init attributes with a counter-based
 *   generator: element i of the node named k with seed s depends only on (s, k, i), so renumbering
 *   passes keep the values.
 *
 * The op families live in interp_<family>.c (see interp_impl.h); this file holds the dispatcher, the
 * graph walk, initialisation and helpers they share. */
#include "runtime/interp/internal.h"

#include <stdlib.h>
#include <string.h>

/* ---- tensors --------------------------------------------------------------------------------------- */

evt_status evt_tensor_alloc(evt_tensor *t, evt_dtype dt, int rank, const int64_t *shape) {
  memset(t, 0, sizeof *t);
  if ((unsigned)dt >= EVT_DTYPE_COUNT || rank < 0 || rank > EVT_MAX_RANK) return EVT_ERR_INVALID;
  int64_t numel = 1;
  for (int i = 0; i < rank; i++) {
    if (shape[i] < 0) return EVT_ERR_INVALID;
    if (shape[i] > 0 && numel > INT64_MAX / 8 / shape[i]) return EVT_ERR_INVALID;
    numel *= shape[i];
  }
  double *data = calloc((size_t)(numel > 0 ? numel : 1), sizeof(double));
  if (!data) return EVT_ERR_INVALID;
  t->dtype = dt;
  t->rank = rank;
  for (int i = 0; i < rank; i++) t->shape[i] = shape[i];
  t->numel = numel;
  t->data = data;
  return EVT_OK;
}

void evt_tensor_free(evt_tensor *t) {
  if (!t) return;
  free(t->data);
  memset(t, 0, sizeof *t);
}

/* ---- helpers shared by the families ---------------------------------------------------------------- */

bool evt_interp_bcast_strides(const evt_tensor *in, int rank, const int64_t *shape, int64_t *stride) {
  if (in->rank > rank) return false;
  int64_t s = 1;
  for (int i = rank - 1; i >= 0; i--) {
    int j = i - (rank - in->rank);
    if (j < 0) {
      stride[i] = 0;
      continue;
    }
    if (in->shape[j] != shape[i] && in->shape[j] != 1) return false;
    stride[i] = (in->shape[j] == 1 && shape[i] != 1) ? 0 : s;
    s *= in->shape[j];
  }
  return true;
}

int64_t evt_interp_index(evt_interp_ctx *ctx, const evt_tensor *t, int64_t i, int64_t limit, const char *what) {
  double v = t->data[i];
  if (!(v >= 0 && v < (double)limit) || v != floor(v)) {
    interp_fail(ctx, "%s %g at element %lld is out of range [0, %lld)", what, v, (long long)i, (long long)limit);
    return -1;
  }
  return (int64_t)v;
}

evt_status interp_int_inexact(evt_interp_ctx *ctx, double v, int64_t i) {
  return evt_graph_errorf(ctx->g, ctx->id, EVT_ERR_UNSUPPORTED,
                          "integer value %.17g at element %lld is beyond +-(2^53 - 1), which the interpreter holds "
                          "exactly (it keeps integers in doubles)", v, (long long)i);
}

/* ---- one node -------------------------------------------------------------------------------------- */

/* Rounds the computed values to the node's dtype (floats kept with EVT_RUN_FP64); an i64 value the double
 * does not hold exactly is an error. */
static evt_status round_output(evt_interp_ctx *ctx) {
  evt_dtype dt = ctx->n->type.dtype;
  double *d = ctx->out->data;
  int64_t m = ctx->out->numel;
  if (evt_dtype_is_float(dt) && (ctx->flags & EVT_RUN_FP64)) return EVT_OK;
  if (dt == EVT_F32) {
    for (int64_t i = 0; i < m; i++) d[i] = (double)(float)d[i];
    return EVT_OK;
  }
  if (dt == EVT_BOOL) {
    for (int64_t i = 0; i < m; i++) d[i] = d[i] != 0;
    return EVT_OK;
  }
  for (int64_t i = 0; i < m; i++) {
    if (dt == EVT_I64 && !(fabs(d[i]) <= EVT_INT_EXACT_MAX) && isfinite(d[i])) return interp_int_inexact(ctx, d[i], i);
    d[i] = evt_round_to_dtype(d[i], dt);
  }
  return EVT_OK;
}

static bool tensor_matches(const evt_tensor *t, const evt_type *ty) {
  if (!t || !t->data || t->dtype != ty->dtype || t->rank != ty->rank) return false;
  for (int i = 0; i < ty->rank; i++)
    if (t->shape[i] != ty->shape[i]) return false;
  return true;
}

static evt_status run_family(evt_interp_ctx *ctx) {
  switch (ctx->n->op) {
  case EVT_OP_INPUT:
  case EVT_OP_PARAM:
    return interp_fail(ctx, "an input or parameter has no computation: its value must be provided");
  case EVT_OP_FULL: case EVT_OP_SCALAR: case EVT_OP_RAND:
  case EVT_OP_DROPOUT:
  case EVT_OP_NLL_LOSS: case EVT_OP_NLL_LOSS_BACKWARD: case EVT_OP_CROSS_ENTROPY:
  case EVT_OP_BCE_WITH_LOGITS: case EVT_OP_BCE_WITH_LOGITS_BACKWARD:
  case EVT_OP_MSE_LOSS: case EVT_OP_MSE_LOSS_BACKWARD:
  case EVT_OP_ONE_HOT: case EVT_OP_EMBEDDING: case EVT_OP_EMBEDDING_BACKWARD:
  case EVT_OP_INDEX_SELECT: case EVT_OP_INDEX_SELECT_BACKWARD: case EVT_OP_COO_PERM: case EVT_OP_COO_ROWPTR:
  case EVT_OP_RESHAPE: case EVT_OP_PERMUTE: case EVT_OP_TRANSPOSE: case EVT_OP_EXPAND:
  case EVT_OP_SLICE: case EVT_OP_SLICE_BACKWARD: case EVT_OP_CONCAT: case EVT_OP_SQUEEZE:
  case EVT_OP_UNSQUEEZE:
    return evt_interp_misc(ctx);
  case EVT_OP_NEG: case EVT_OP_EXP: case EVT_OP_LOG: case EVT_OP_SQRT: case EVT_OP_RSQRT:
  case EVT_OP_RECIPROCAL: case EVT_OP_ABS: case EVT_OP_SIGN: case EVT_OP_TANH: case EVT_OP_SIGMOID:
  case EVT_OP_RELU: case EVT_OP_GELU: case EVT_OP_ERF: case EVT_OP_CAST: case EVT_OP_POW:
  case EVT_OP_GELU_BACKWARD: case EVT_OP_THRESHOLD_BACKWARD:
  case EVT_OP_ADD: case EVT_OP_SUB: case EVT_OP_MUL: case EVT_OP_DIV: case EVT_OP_MAXIMUM:
  case EVT_OP_MINIMUM: case EVT_OP_EQ: case EVT_OP_NE: case EVT_OP_LT: case EVT_OP_LE: case EVT_OP_GT:
  case EVT_OP_GE: case EVT_OP_WHERE:
    return evt_interp_elementwise(ctx);
  case EVT_OP_SUM: case EVT_OP_MEAN: case EVT_OP_AMAX:
  case EVT_OP_SOFTMAX: case EVT_OP_LOG_SOFTMAX: case EVT_OP_SOFTMAX_BACKWARD: case EVT_OP_LOG_SOFTMAX_BACKWARD:
  case EVT_OP_LAYER_NORM: case EVT_OP_LAYER_NORM_BACKWARD_INPUT: case EVT_OP_LAYER_NORM_BACKWARD_WEIGHT:
  case EVT_OP_BATCH_NORM: case EVT_OP_BATCH_NORM_BACKWARD_INPUT: case EVT_OP_BATCH_NORM_BACKWARD_WEIGHT:
    return evt_interp_reduce(ctx);
  case EVT_OP_MM: case EVT_OP_BMM: case EVT_OP_ADDMM: case EVT_OP_SPMM: case EVT_OP_SPMM_T:
  case EVT_OP_SDPA: case EVT_OP_SDPA_BACKWARD_Q: case EVT_OP_SDPA_BACKWARD_K: case EVT_OP_SDPA_BACKWARD_V:
    return evt_interp_gemm(ctx);
  case EVT_OP_CONV2D: case EVT_OP_CONV2D_BACKWARD_INPUT: case EVT_OP_CONV2D_BACKWARD_WEIGHT:
  case EVT_OP_MAX_POOL2D: case EVT_OP_MAX_POOL2D_BACKWARD: case EVT_OP_ADAPTIVE_MAX_POOL2D:
  case EVT_OP_ADAPTIVE_MAX_POOL2D_BACKWARD: case EVT_OP_AVG_POOL2D: case EVT_OP_AVG_POOL2D_BACKWARD:
    return evt_interp_conv(ctx);
  case EVT_OP_COUNT: break;
  }
  EVT_UNREACHABLE();
}

/* evt_interp_node with the perturbed reference's noise (NULL: none). */
static evt_status run_node(evt_graph *g, int id, const evt_tensor *const *inputs, evt_tensor *out, unsigned flags,
                           const evt_fp8_noise *noise) {
  if (!g || id < 0 || id >= g->nnodes || !out) return EVT_ERR_INVALID;
  const evt_node *n = &g->nodes[id];
  memset(out, 0, sizeof *out);
  for (int j = 0; j < n->ninputs; j++) {
    const evt_type *ty = &g->nodes[n->inputs[j]].type;
    if (!inputs || !tensor_matches(inputs[j], ty)) {
      char buf[128];
      return evt_graph_errorf(g, id, EVT_ERR_INVALID, "input %d is missing or is not a %s tensor", j,
                              evt_type_str(ty, buf, sizeof buf));
    }
  }
  if (evt_tensor_alloc(out, n->type.dtype, n->type.rank, n->type.shape) != EVT_OK)
    return evt_graph_errorf(g, id, EVT_ERR_INVALID, "cannot allocate the output");
  evt_interp_ctx ctx = {.g = g, .id = id, .n = n, .in = inputs, .out = out, .flags = flags, .noise = noise};
  evt_status st = run_family(&ctx);
  if (st == EVT_OK) st = round_output(&ctx);
  if (st != EVT_OK) evt_tensor_free(out);
  return st;
}

evt_status evt_interp_node(evt_graph *g, int id, const evt_tensor *const *inputs, evt_tensor *out, unsigned flags) {
  return run_node(g, id, inputs, out, flags, NULL);
}

/* ---- the whole graph ------------------------------------------------------------------------------- */

static bool is_caller_slot(const evt_node *n) { return n->op == EVT_OP_INPUT || n->op == EVT_OP_PARAM; }

/* A caller's value of node i: the right type, and for an integer dtype integers it holds (i64: exactly). */
static evt_status check_caller_slot(evt_graph *g, int i, const evt_tensor *t) {
  const evt_node *n = &g->nodes[i];
  char buf[128];
  if (!tensor_matches(t, &n->type))
    return evt_graph_errorf(g, i, EVT_ERR_INVALID, "no value given, or not a %s tensor", evt_type_str(&n->type, buf, sizeof buf));
  evt_dtype dt = n->type.dtype;
  if (evt_dtype_is_float(dt)) return EVT_OK;
  for (int64_t k = 0; k < t->numel; k++) {
    double v = t->data[k];
    if (dt == EVT_I64 && isfinite(v) && v == trunc(v) && !(fabs(v) <= EVT_INT_EXACT_MAX))
      return evt_graph_errorf(g, i, EVT_ERR_UNSUPPORTED,
                              "i64 value %.17g at element %lld is beyond +-(2^53 - 1), which the interpreter holds "
                              "exactly (it keeps integers in doubles)", v, (long long)k);
    if (evt_round_to_dtype(v, dt) != v)
      return evt_graph_errorf(g, i, EVT_ERR_INVALID, "value %.17g at element %lld is not a %s", v, (long long)k,
                              evt_dtype_name(dt));
  }
  return EVT_OK;
}

evt_status evt_interp_run(evt_graph *g, evt_tensor *values, unsigned flags, int keep_all) {
  return evt_interp_run_fp8_noise(g, values, flags, keep_all, NULL);
}

evt_status evt_interp_run_fp8_noise(evt_graph *g, evt_tensor *values, unsigned flags, int keep_all,
                                    const evt_fp8_noise *noise) {
  if (!g || !values) return EVT_ERR_INVALID;
  int nn = g->nnodes;
  int *last_use = malloc(sizeof(int) * (size_t)(nn > 0 ? nn : 1));
  if (!last_use) return EVT_ERR_INVALID;
  for (int i = 0; i < nn; i++) last_use[i] = -1;
  for (int i = 0; i < nn; i++)
    for (int j = 0; j < g->nodes[i].ninputs; j++) last_use[g->nodes[i].inputs[j]] = i;

  evt_status st = EVT_OK;
  for (int i = 0; i < nn && st == EVT_OK; i++) {
    const evt_node *n = &g->nodes[i];
    if (is_caller_slot(n)) {
      st = check_caller_slot(g, i, &values[i]);
      continue;
    }
    const evt_tensor *ins[EVT_MAX_INPUTS];
    for (int j = 0; j < n->ninputs; j++) ins[j] = &values[n->inputs[j]];
    evt_tensor_free(&values[i]);
    st = run_node(g, i, ins, &values[i], flags, noise);
    if (st != EVT_OK || keep_all) continue;
    /* free what this node was the last user of, and this node itself if nothing reads it */
    for (int j = 0; j < n->ninputs; j++) {
      int p = n->inputs[j];
      if (last_use[p] == i && !is_caller_slot(&g->nodes[p]) && !(g->nodes[p].flags & EVT_NODE_OUTPUT))
        evt_tensor_free(&values[p]);
    }
    if (last_use[i] < 0 && !(n->flags & EVT_NODE_OUTPUT)) evt_tensor_free(&values[i]);
  }
  if (st != EVT_OK) /* leave no half-run intermediates behind */
    for (int i = 0; i < nn; i++)
      if (!is_caller_slot(&g->nodes[i])) evt_tensor_free(&values[i]);
  free(last_use);
  return st;
}

/* ---- initialisation -------------------------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

double evt_interp_counter_uniform(uint64_t key, uint64_t i, uint64_t lane) {
  uint64_t h = splitmix64(key ^ splitmix64(i * 2 + lane));
  return (double)(h >> 11) * (1.0 / 9007199254740992.0);
}

/* Inputs are keyed by name, not id, so passes that renumber nodes do not change initial values. */
static uint64_t name_hash(const char *s) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (; s && *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

evt_status evt_interp_init_inputs(evt_graph *g, evt_tensor *values, uint64_t seed) {
  if (!g || !values) return EVT_ERR_INVALID;
  for (int id = 0; id < g->nnodes; id++) {
    const evt_node *n = &g->nodes[id];
    if (!is_caller_slot(n)) continue;
    evt_tensor *t = &values[id];
    evt_tensor_free(t);
    if (evt_tensor_alloc(t, n->type.dtype, n->type.rank, n->type.shape) != EVT_OK)
      return evt_graph_errorf(g, id, EVT_ERR_INVALID, "cannot allocate the value");
    const evt_attrs *a = &n->attr;
    uint64_t key = splitmix64(seed ^ splitmix64(0xE7717u + name_hash(n->name)));
    double lo = a->lo, hi = a->hi;
    if (a->init == EVT_INIT_RANDINT) {
      lo = ceil(lo);
      hi = ceil(hi);
      if (!(hi > lo)) {
        evt_tensor_free(t);
        return evt_graph_errorf(g, id, EVT_ERR_INVALID, "init=randint needs lo < hi, got [%g, %g)", a->lo, a->hi);
      }
    }
    for (int64_t i = 0; i < t->numel; i++) {
      double v = 0;
      switch ((evt_init)a->init) {
      case EVT_INIT_NORMAL: {
        double u1 = 1.0 - evt_interp_counter_uniform(key, (uint64_t)i, 0); /* (0, 1] */
        double u2 = evt_interp_counter_uniform(key, (uint64_t)i, 1);
        v = a->std * sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
        break;
      }
      case EVT_INIT_UNIFORM: v = lo + (hi - lo) * evt_interp_counter_uniform(key, (uint64_t)i, 0); break;
      case EVT_INIT_RANDINT: v = lo + floor((hi - lo) * evt_interp_counter_uniform(key, (uint64_t)i, 0)); break;
      case EVT_INIT_ZEROS: v = 0; break;
      case EVT_INIT_ONES: v = 1; break;
      case EVT_INIT_ROWPTR: v = (double)i * lo; break;
      case EVT_INIT_COUNT:
      default:
        evt_tensor_free(t);
        return evt_graph_errorf(g, id, EVT_ERR_INVALID, "unknown init %lld", (long long)a->init);
      }
      t->data[i] = evt_round_to_dtype(v, t->dtype);
    }
  }
  return EVT_OK;
}

/* ---- small accessors for bindings (tests/python/evt_ctypes.py) ------------------------------------- */

const char *evt_interp_node_name(const evt_graph *g, int id) {
  return g && id >= 0 && id < g->nnodes ? g->nodes[id].name : NULL;
}

const char *evt_interp_node_op(const evt_graph *g, int id) {
  return g && id >= 0 && id < g->nnodes ? evt_op_table[g->nodes[id].op].name : NULL;
}

int evt_interp_output(const evt_graph *g, int i) { return g && i >= 0 && i < g->noutputs ? g->outputs[i] : -1; }
