/* The op and attribute tables generated from ops.def / attrs.def, dtype facts, and dtype rounding. */
#include "ir/ir.h"

#include <math.h>
#include <string.h>

#define A(U) (1ull << EVT_ATTR_##U)
#define F_DIFF EVT_OPF_DIFF
#define F_COMM EVT_OPF_COMM
#define F_TYPED EVT_OPF_TYPED
const evt_op_info evt_op_table[EVT_OP_COUNT] = {
#define X(U, name, mn, mx, cls, attrs, flags) [EVT_OP_##U] = {name, mn, mx, EVT_CLASS_##cls, attrs, flags},
#include "ir/ops.def"
#undef X
};
#undef A

const char *const evt_op_class_names[EVT_CLASS_COUNT] = {
    "source", "elementwise", "reduction", "gemm", "sparse", "conv", "pool",
    "row",    "rng",         "loss",      "gather", "layout", "attention",
};

static const char *const reduction_names[] = {"none", "mean", "sum"};
static const char *const approximate_names[] = {"none", "tanh"};
static const char *const layout_names[] = {"nchw", "nhwc"};
static const char *const dtype_names[] = {"f32", "f16", "bf16", "i64", "i32", "bool", "f8e4m3", "f8e5m2"};
static const char *const init_names[] = {"normal", "uniform", "randint", "zeros", "ones", "rowptr"};
_Static_assert(EVT_ARRAY_LEN(reduction_names) == EVT_REDUCTION_COUNT, "reduction names");
_Static_assert(EVT_ARRAY_LEN(approximate_names) == EVT_APPROXIMATE_COUNT, "approximate names");
_Static_assert(EVT_ARRAY_LEN(layout_names) == EVT_LAYOUT_COUNT, "layout names");
_Static_assert(EVT_ARRAY_LEN(dtype_names) == EVT_DTYPE_COUNT, "dtype names");
_Static_assert(EVT_ARRAY_LEN(init_names) == EVT_INIT_COUNT, "init names");

#define EVT_AI_INT EVT_AK_INT, NULL, 0
#define EVT_AI_FLOAT EVT_AK_FLOAT, NULL, 0
#define EVT_AI_LIST EVT_AK_LIST, NULL, 0
#define EVT_AI_ENUM_REDUCTION EVT_AK_ENUM, reduction_names, EVT_REDUCTION_COUNT
#define EVT_AI_ENUM_APPROXIMATE EVT_AK_ENUM, approximate_names, EVT_APPROXIMATE_COUNT
#define EVT_AI_ENUM_LAYOUT EVT_AK_ENUM, layout_names, EVT_LAYOUT_COUNT
#define EVT_AI_ENUM_DTYPE EVT_AK_ENUM, dtype_names, EVT_DTYPE_COUNT
#define EVT_AI_ENUM_INIT EVT_AK_ENUM, init_names, EVT_INIT_COUNT
const evt_attr_info evt_attr_table[EVT_ATTR_COUNT] = {
#define X(U, l, kind, def) [EVT_ATTR_##U] = {#l, EVT_AI_##kind, offsetof(evt_attrs, l)},
#include "ir/attrs.def"
#undef X
};

const evt_attrs evt_attrs_default = {
#define X(U, l, kind, def) .l = def,
#include "ir/attrs.def"
#undef X
};

const char *evt_dtype_name(evt_dtype dt) { return (unsigned)dt < EVT_DTYPE_COUNT ? dtype_names[dt] : "?"; }

static int find_name(const char *const *names, int count, const char *name, size_t len) {
  for (int i = 0; i < count; i++)
    if (names[i] && strlen(names[i]) == len && memcmp(names[i], name, len) == 0) return i;
  return -1;
}

int evt_dtype_from_name(const char *name, size_t len) { return find_name(dtype_names, EVT_DTYPE_COUNT, name, len); }

int evt_op_from_name(const char *name, size_t len) {
  for (int i = 0; i < EVT_OP_COUNT; i++)
    if (strlen(evt_op_table[i].name) == len && memcmp(evt_op_table[i].name, name, len) == 0) return i;
  return -1;
}

int evt_attr_from_name(const char *name, size_t len) {
  for (int i = 0; i < EVT_ATTR_COUNT; i++)
    if (strlen(evt_attr_table[i].name) == len && memcmp(evt_attr_table[i].name, name, len) == 0) return i;
  return -1;
}

size_t evt_dtype_size(evt_dtype dt) {
  switch (dt) {
  case EVT_F32: return 4;
  case EVT_F16: return 2;
  case EVT_BF16: return 2;
  case EVT_I64: return 8;
  case EVT_I32: return 4;
  case EVT_BOOL: return 1;
  case EVT_F8E4M3: return 1;
  case EVT_F8E5M2: return 1;
  case EVT_DTYPE_COUNT: break;
  }
  EVT_UNREACHABLE();
}

bool evt_dtype_is_float(evt_dtype dt) {
  return dt == EVT_F32 || dt == EVT_F16 || dt == EVT_BF16 || evt_dtype_is_fp8(dt);
}

bool evt_dtype_is_fp8(evt_dtype dt) { return dt == EVT_F8E4M3 || dt == EVT_F8E5M2; }

/* bf16 keeps the top 16 bits of an f32; round to nearest, ties to even, NaN stays NaN. */
float evt_round_bf16(float v) {
  uint32_t u;
  memcpy(&u, &v, 4);
  if ((u & 0x7f800000u) == 0x7f800000u) { /* inf or nan */
    if (u & 0x007fffffu) u |= 0x00400000u;
    u &= 0xffff0000u;
  } else {
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
  }
  float r;
  memcpy(&r, &u, 4);
  return r;
}

/* IEEE half: 1 sign, 5 exponent, 10 mantissa bits; RNE including subnormals; overflow to inf. */
float evt_round_f16(float v) {
  if (isnan(v) || isinf(v)) return v;
  float a = fabsf(v);
  if (a >= 65520.0f) return copysignf(INFINITY, v); /* rounds past the largest half, 65504 */
  int e;
  frexpf(a, &e);                 /* a = m * 2^e, m in [0.5, 1) */
  int exp_unbiased = e - 1;      /* a = 1.x * 2^exp_unbiased */
  if (exp_unbiased < -14) exp_unbiased = -14;    /* subnormal range: fixed quantum 2^-24 */
  float quantum = ldexpf(1.0f, exp_unbiased - 10);
  float q = a / quantum;         /* exact: quantum is a power of two */
  float r = nearbyintf(q) * quantum;  /* default rounding mode: nearest even */
  return copysignf(r, v);
}

double evt_round_to_dtype(double v, evt_dtype dt) {
  switch (dt) {
  case EVT_F32: return (double)(float)v;
  case EVT_F16: return (double)evt_round_f16((float)v);
  case EVT_BF16: return (double)evt_round_bf16((float)v);
  case EVT_I64: return isfinite(v) ? trunc(v) : 0.0;
  case EVT_I32: return fabs(v) < 0x1p63 ? (double)(int32_t)(uint32_t)(uint64_t)(int64_t)trunc(v) : 0.0;
  case EVT_BOOL: return v != 0.0 ? 1.0 : 0.0;
  case EVT_F8E4M3: return (double)evt_round_fp8((float)v, dt);
  case EVT_F8E5M2: return (double)evt_round_fp8((float)v, dt);
  case EVT_DTYPE_COUNT: break;
  }
  EVT_UNREACHABLE();
}
