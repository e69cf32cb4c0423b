/* Kernel specs: building, checking, canonical text and hash (contract in kspec.h).
 *
 * The canonical text lists the mainloop (layout, dtypes, tile, cluster, schedule) and then one line per
 * node with its op, inputs, dtype, value and name; the hash (FNV-1a 64) of that text names the kernel.
 * Names are part of the hash because they name the launcher's arguments in the generated source.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "codegen/kspec.h"
#include "evt_launch.h"
#include "ir/ir.h"

static const struct {
  const char *name;
  int arity;
  char cls;
} vop_table[EVT_V_COUNT] = {
#define X(e, s, a, c) [EVT_V_##e] = {s, a, c},
    EVT_VOP_LIST(X)
#undef X
};

const char *evt_cxx_double(double v, char out[32]) {
  if (isnan(v)) snprintf(out, 32, "__builtin_nan(\"\")");
  else if (isinf(v)) snprintf(out, 32, "%s__builtin_huge_val()", v < 0 ? "-" : "");
  else snprintf(out, 32, "%.17g", v);
  return out;
}

const char *evt_vop_name(evt_vop op) { return (unsigned)op < EVT_V_COUNT ? vop_table[op].name : "?"; }
int evt_vop_arity(evt_vop op) { return (unsigned)op < EVT_V_COUNT ? vop_table[op].arity : -1; }
char evt_vop_class(evt_vop op) { return (unsigned)op < EVT_V_COUNT ? vop_table[op].cls : '?'; }
int evt_vop_has_memory(evt_vop op) {
  return op == EVT_V_ROW_BCAST || op == EVT_V_COL_BCAST || op == EVT_V_AUX_LOAD || op == EVT_V_SCALAR_LOAD ||
         op == EVT_V_ONE_HOT || evt_vop_class(op) == 'S';
}

void evt_kspec_init(evt_kspec *s, evt_gemm_layout layout, evt_dtype ab, evt_dtype d, evt_tile_config cfg) {
  memset(s, 0, sizeof *s);
  s->layout = layout;
  s->ab_dtype = ab;
  s->d_dtype = d;
  s->cfg = cfg;
  s->d_node = -1;
}

bool evt_vop_inputs_ok(evt_vop op, const int in[3], int id) {
  int arity = evt_vop_arity(op);
  if (arity < 0) return false;
  for (int i = 0; i < 3; i++) {
    if (i < arity && (in[i] < 0 || in[i] >= id)) return false;
    if (i >= arity && in[i] != -1) return false;
  }
  return true;
}

evt_dtype evt_vop_node_dtype(evt_vop op, evt_dtype dtype) {
  if (evt_vop_class(op) == 'C' || op == EVT_V_ACC || op == EVT_V_SCALAR) return EVT_F32;
  return dtype;
}

int evt_vop_storage_ok(evt_vop op, evt_dtype dtype, int gemm) {
  bool fl = dtype == EVT_BF16 || dtype == EVT_F16 || dtype == EVT_F32;
  switch (op) {
    case EVT_V_ONE_HOT: return dtype == EVT_I64 || dtype == EVT_I32;
    case EVT_V_ROW_SUM: case EVT_V_COL_SUM: return gemm ? dtype == EVT_F32 : fl;
    case EVT_V_COL_MAX: return gemm ? dtype == EVT_F32 : fl;
    case EVT_V_RAND: return fl; /* GEMM: evt_nodes::Philox (unbatched) */
    case EVT_V_AUX_LOAD: case EVT_V_AUX_STORE: /* GEMM: u8 aux tiles (N % 16); rows: integers in doubles, fp8 */
      return fl || dtype == EVT_BOOL || (!gemm && (dtype == EVT_I64 || dtype == EVT_I32 || evt_dtype_is_fp8(dtype)));
    case EVT_V_COL_BCAST: case EVT_V_SCALAR_LOAD:
      return fl || (!gemm && (dtype == EVT_BOOL || dtype == EVT_I64 || dtype == EVT_I32));
    case EVT_V_ROW_BCAST: return fl || (!gemm && dtype == EVT_BOOL);
    default: return 1;
  }
}

int evt_kspec_add3(evt_kspec *s, evt_vop op, int in0, int in1, int in2, evt_dtype dtype, const char *name) {
  if ((unsigned)op >= EVT_V_COUNT || s->nnodes >= EVT_KSPEC_MAX_NODES) return -1;
  int id = s->nnodes, in[3] = {in0, in1, in2};
  if (!evt_vop_inputs_ok(op, in, id)) return -1;
  evt_vnode *v = &s->nodes[id];
  memset(v, 0, sizeof *v);
  v->op = op;
  for (int k = 0; k < 3; k++) v->in[k] = in[k];
  v->dtype = evt_vop_node_dtype(op, dtype);
  snprintf(v->name, sizeof v->name, "%s", name && *name ? name : "");
  if (!v->name[0]) snprintf(v->name, sizeof v->name, "v%d", id);
  s->nnodes++;
  return id;
}

int evt_kspec_add(evt_kspec *s, evt_vop op, int in0, int in1, evt_dtype dtype, const char *name) {
  return evt_kspec_add3(s, op, in0, in1, -1, dtype, name);
}

int evt_kspec_scalar(evt_kspec *s, double value) {
  int id = evt_kspec_add(s, EVT_V_SCALAR, -1, -1, EVT_F32, NULL);
  if (id >= 0) s->nodes[id].value = value;
  return id;
}

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

int evt_kspec_has_sums(const evt_kspec *s) {
  for (int i = 0; i < s->nnodes; i++)
    if (s->nodes[i].op == EVT_V_ROW_SUM || s->nodes[i].op == EVT_V_COL_SUM || s->nodes[i].op == EVT_V_COL_MAX) return 1;
  return 0;
}

char *evt_tile_config_label(const evt_tile_config *c, char *out, size_t len) {
  int w = snprintf(out, len, "%dx%dx%d c%dx%d %s", c->tile_m, c->tile_n, c->tile_k, c->cluster_m, c->cluster_n,
                   c->schedule == EVT_SCHED_PINGPONG ? "pingpong" : "coop");
  if (w > 0 && (size_t)w < len && c->stages) w += snprintf(out + w, len - (size_t)w, " s%d", c->stages);
  if (w > 0 && (size_t)w < len && c->reduction == EVT_RED_WORKSPACE) w += snprintf(out + w, len - (size_t)w, " red=workspace");
  if (w > 0 && (size_t)w < len && c->epi_n) w += snprintf(out + w, len - (size_t)w, " e%d", c->epi_n);
  if (w > 0 && (size_t)w < len && c->stream_k) w += snprintf(out + w, len - (size_t)w, " sk");
  if (w > 0 && (size_t)w < len && c->epi_stages) snprintf(out + w, len - (size_t)w, " d%d", c->epi_stages);
  return out;
}

evt_status evt_tile_config_parse(const char *text, evt_tile_config *c) {
  evt_tile_config r = EVT_TILE_CONFIG_DEFAULT;
  char sched[16] = "", rest[5][24] = {"", "", "", "", ""};
  int n = sscanf(text, "%dx%dx%d c%dx%d %15s %23s %23s %23s %23s %23s", &r.tile_m, &r.tile_n, &r.tile_k, &r.cluster_m,
                 &r.cluster_n, sched, rest[0], rest[1], rest[2], rest[3], rest[4]);
  if (n < 6) return EVT_ERR_INVALID;
  if (!strcmp(sched, "coop")) r.schedule = EVT_SCHED_COOPERATIVE;
  else if (!strcmp(sched, "pingpong")) r.schedule = EVT_SCHED_PINGPONG;
  else return EVT_ERR_INVALID;
  for (int i = 0; i < n - 6; i++) {
    int st;
    char tail;
    if (sscanf(rest[i], "s%d%c", &st, &tail) == 1 && st > 0) r.stages = st;
    else if (sscanf(rest[i], "e%d%c", &st, &tail) == 1 && st > 0) r.epi_n = st;
    else if (sscanf(rest[i], "d%d%c", &st, &tail) == 1 && st > 0) r.epi_stages = st;
    else if (!strcmp(rest[i], "red=workspace")) r.reduction = EVT_RED_WORKSPACE;
    else if (!strcmp(rest[i], "red=atomic")) r.reduction = EVT_RED_ATOMIC;
    else if (!strcmp(rest[i], "sk")) r.stream_k = 1;
    else return EVT_ERR_INVALID;
  }
  *c = r;
  return EVT_OK;
}

static int pow2_le4(int v) { return v == 1 || v == 2 || v == 4; }

evt_status evt_tile_config_check(const evt_kspec *s, const evt_tile_config *c, char *err, size_t errlen) {
  if (evt_arch_sm8x(s->arch)) return evt_tile_config_check_sm80(s, c, err, errlen);
  char lab[64];
  evt_tile_config_label(c, lab, sizeof lab);
#define BAD(...)                                                                        \
  do {                                                                                  \
    char why_[200];                                                                     \
    snprintf(why_, sizeof why_, __VA_ARGS__);                                           \
    return fail(err, errlen, EVT_ERR_UNSUPPORTED, "kernel spec: config %s: %s", lab, why_); \
  } while (0)
  int tm = c->tile_m, tn = c->tile_n, tk = c->tile_k;
  /* a wgrad's N tile divides C (16, 32: kspec_conv.c) */
  bool wgrad_n = s->conv.kind == EVT_CONV_WGRAD && (tn == 16 || tn == 32);
  if (!((tm == 64 || tm == 128 || tm == 256) && (tn == 64 || tn == 128 || tn == 256 || wgrad_n)))
    BAD("unsupported tile %dx%d (tile_m and tile_n must be 64, 128 or 256; a wgrad's tile_n also 16 or 32)", tm, tn);
  /* a conv's K tile divides C (16 for C = 16, 48, ...: kspec_conv.c) */
  if (tk != 32 && tk != 64 && tk != 128 && !(tk == 16 && s->conv.kind))
    BAD("unsupported tile_k %d (32, 64 or 128; 16 for a convolution)", tk);
  if (evt_dtype_is_fp8(s->ab_dtype) && tk != 128) BAD("tile_k %d with fp8 operands (128: one 128-byte K row per tile)", tk);
  if (s->ab_dtype == EVT_F32 && tk != 32) BAD("tile_k %d with f32 (TF32) operands (32: one 128-byte K row per tile)", tk);
  if (!pow2_le4(c->cluster_m) || !pow2_le4(c->cluster_n) || c->cluster_m * c->cluster_n > 4)
    BAD("unsupported cluster %dx%d (1, 2 or 4 each, at most 4 CTAs)", c->cluster_m, c->cluster_n);
  if (c->schedule == EVT_SCHED_COOPERATIVE) {
    if (tm % 128) BAD("the cooperative schedule needs tile_m >= 128 (two consumer warp groups split M by 64 rows)");
    if (tm * tn > 128 * 256) BAD("the cooperative schedule holds tile_m*tile_n/256 = %d accumulators per thread (max 128)", tm * tn / 256);
  } else if (c->schedule == EVT_SCHED_PINGPONG) {
    if (tm * tn > 128 * 128)
      BAD("ping-pong gives each consumer warp group a whole tile: tile_m*tile_n/128 = %d accumulators per thread "
          "(max 128; use 64x256, 128x128 or a cooperative schedule)", tm * tn / 128);
  } else {
    BAD("unknown schedule %d", (int)c->schedule);
  }
  if (c->stages != 0) {
    int ab = (int)evt_dtype_size(s->ab_dtype);
    long per = (long)(tm + tn) * tk * ab;
    if (c->stages < 2 || c->stages > 8) BAD("stages %d (0 = auto, or 2..8)", c->stages);
    if (per * c->stages > 227L * 1024 - 32 * 1024)
      BAD("%d stages x %ld bytes of A+B tiles exceed the shared memory left for the mainloop (195 KiB)", c->stages, per);
  }
  if (c->epi_n != 0 && ((c->epi_n != 16 && c->epi_n != 32 && c->epi_n != 64 && c->epi_n != 128) || tn % c->epi_n))
    BAD("epilogue subtile N %d (0 = auto, or 16, 32, 64, 128 dividing tile_n)", c->epi_n);
  if (c->epi_stages != 0) {
    /* subtiles of the tile: CUTLASS's subtile is min(tile_m, 128) x epi_n cooperative, 64 x epi_n ping-pong
     * (epi_n 32 when automatic: 16 only adds subtiles, so this bound holds for it too) */
    int em = c->schedule == EVT_SCHED_COOPERATIVE ? (tm < 128 ? tm : 128) : (tm < 64 ? tm : 64);
    int subtiles = (tm / em) * (tn / (c->epi_n ? c->epi_n : 32));
    if (c->epi_stages < 2 || c->epi_stages > 8 || c->epi_stages > subtiles)
      BAD("epilogue store stages %d (0 = CUTLASS's choice, or 2..8 and at most the %d epilogue subtiles of the tile)",
          c->epi_stages, subtiles);
  }
  if (c->reduction != EVT_RED_ATOMIC && c->reduction != EVT_RED_WORKSPACE) BAD("unknown reduction strategy %d", (int)c->reduction);
  if (c->reduction == EVT_RED_WORKSPACE && !evt_kspec_has_sums(s))
    BAD("reduction strategy 'workspace' given but the epilogue has no row_sum / col_sum");
  if (c->stream_k != 0 && c->stream_k != 1) BAD("stream_k %d (0 or 1)", c->stream_k);
  if (c->stream_k && c->schedule != EVT_SCHED_COOPERATIVE)
    BAD("the stream-K tile scheduler needs the cooperative schedule (the ping-pong kernel has no K-split fixup)");
  if (c->stream_k && s->batched) BAD("stream-K is not used for batched GEMMs");
  if (c->stream_k && c->reduction == EVT_RED_WORKSPACE)
    BAD("stream-K with the 'workspace' sum strategy (both own CUTLASS's workspace; use atomic sums)");
#undef BAD
  return EVT_OK;
}

int evt_kspec_tile_k(const evt_kspec *s) { return evt_dtype_is_fp8(s->ab_dtype) ? 128 : s->ab_dtype == EVT_F32 ? 32 : 64; }

evt_dtype evt_kspec_b_dtype(const evt_kspec *s) { return s->b_mixed ? s->b_dtype : s->ab_dtype; }

static const char *layout_name(evt_gemm_layout l) { return l == EVT_LAYOUT_NN ? "NN" : l == EVT_LAYOUT_NT ? "NT" : "TN"; }

/* The operand rules: bf16 / f16 (A and B alike), fp8 (see kspec.h "FP8 operands") or f32 on TF32 tensor cores ("TF32
 * operands"). */
static evt_status check_operands(const evt_kspec *s, char *err, size_t errlen) {
  evt_dtype a = s->ab_dtype, b = evt_kspec_b_dtype(s);
  bool fp8 = evt_dtype_is_fp8(a), tf32 = a == EVT_F32;
  if (a != EVT_BF16 && a != EVT_F16 && !fp8 && !tf32)
    return fail(err, errlen, EVT_ERR_UNSUPPORTED, "kernel spec: operands must be bf16, f16, fp8 or f32 (TF32), not %s",
                evt_dtype_name(a));
  if (s->b_mixed && (!fp8 || !evt_dtype_is_fp8(b) || a == b))
    return fail(err, errlen, EVT_ERR_INVALID, "kernel spec: operands %s x %s (a mixed B takes the other fp8 format)",
                evt_dtype_name(a), evt_dtype_name(b));
  if (tf32 && s->arch)
    return fail(err, errlen, EVT_ERR_UNSUPPORTED, "kernel spec: f32 (TF32) operands on %s (evt's TF32 GEMMs are sm_90a's)",
                evt_arch_name(s->arch));
  if (tf32 && s->layout != EVT_LAYOUT_NT)
    return fail(err, errlen, EVT_ERR_UNSUPPORTED, "kernel spec: f32 (TF32) operands in layout %s (Hopper's TF32 wgmma "
                "reads both operands K-major from shared memory: layout NT, A row-major M x K and B stored N x K)",
                layout_name(s->layout));
  if (!fp8) return EVT_OK;
  if (s->arch)
    return fail(err, errlen, EVT_ERR_UNSUPPORTED, "kernel spec: fp8 operands on %s (evt's fp8 GEMMs are sm_90a's)",
                evt_arch_name(s->arch));
  if (s->layout != EVT_LAYOUT_NT)
    return fail(err, errlen, EVT_ERR_UNSUPPORTED, "kernel spec: fp8 operands in layout %s (Hopper's 8-bit wgmma reads "
                "both operands K-major: layout NT, A row-major M x K and B stored N x K)", layout_name(s->layout));
  if (s->batched) return fail(err, errlen, EVT_ERR_UNSUPPORTED, "kernel spec: fp8 operands in a batched GEMM");
  return EVT_OK;
}

evt_status evt_kspec_check(const evt_kspec *s, char *err, size_t errlen) {
  evt_status ost = check_operands(s, err, errlen);
  if (ost != EVT_OK) return ost;
  if (s->d_dtype != EVT_BF16 && s->d_dtype != EVT_F16 && s->d_dtype != EVT_F32)
    return fail(err, errlen, EVT_ERR_UNSUPPORTED, "kernel spec: D must be bf16, f16 or f32, not %s",
                evt_dtype_name(s->d_dtype));
  if ((unsigned)s->layout > EVT_LAYOUT_TN) return fail(err, errlen, EVT_ERR_INVALID, "kernel spec: bad layout");
  if (s->arch == 90 || !evt_arch_valid(s->arch))
    return fail(err, errlen, EVT_ERR_INVALID, "kernel spec: arch %d (0 = sm_90a, 80, 86 or 89)", s->arch);
  evt_status cst = evt_tile_config_check(s, &s->cfg, err, errlen);
  if (cst == EVT_OK) cst = evt_kspec_conv_check(s, err, errlen);
  if (cst != EVT_OK) return cst;
  if (s->nnodes < 1) return fail(err, errlen, EVT_ERR_INVALID, "kernel spec: empty epilogue");
  if (s->d_node < 0 || s->d_node >= s->nnodes) return fail(err, errlen, EVT_ERR_INVALID, "kernel spec: D is not set");
  int acc = 0;
  for (int i = 0; i < s->nnodes; i++) {
    const evt_vnode *v = &s->nodes[i];
    int ar = evt_vop_arity(v->op);
    if (ar < 0) return fail(err, errlen, EVT_ERR_INVALID, "kernel spec: node %d has a bad op", i);
    for (int j = 0; j < ar; j++)
      if (v->in[j] < 0 || v->in[j] >= i)
        return fail(err, errlen, EVT_ERR_INVALID, "kernel spec: node %d (%s %s): input %d is not an earlier node", i,
                    evt_vop_name(v->op), v->name, j);
    if (!is_ident(v->name))
      return fail(err, errlen, EVT_ERR_INVALID, "kernel spec: node %d: name '%s' is not an identifier", i, v->name);
    for (int j = 0; j < i; j++)
      if (evt_vop_has_memory(v->op) && evt_vop_has_memory(s->nodes[j].op) && !strcmp(s->nodes[j].name, v->name))
        return fail(err, errlen, EVT_ERR_INVALID, "kernel spec: node %d: name '%s' used twice", i, v->name);
    if (v->op == EVT_V_ONE_HOT)
      return fail(err, errlen, EVT_ERR_UNSUPPORTED, "kernel spec: node %d (%s %s): no GEMM epilogue visitor for %s (row "
                  "kernels only)", i, evt_vop_name(v->op), v->name, evt_vop_name(v->op));
    if (v->op == EVT_V_COL_MAX && (s->batched || evt_arch_sm8x(s->arch)))
      return fail(err, errlen, EVT_ERR_UNSUPPORTED, "kernel spec: node %d (col_max %s): %s", i, v->name,
                  s->batched ? "a GEMM's max within rows is unbatched only"
                             : "the Sm80 epilogue has no max reduction (Sm90 only)");
    if (v->op == EVT_V_RAND && evt_arch_sm8x(s->arch))
      return fail(err, errlen, EVT_ERR_UNSUPPORTED, "kernel spec: node %d (rand): %s has no Philox visitor (Sm90 only)", i,
                  evt_arch_name(s->arch));
    if (v->op == EVT_V_RAND && (s->batched || !evt_vop_storage_ok(v->op, v->dtype, 1)))
      return fail(err, errlen, EVT_ERR_UNSUPPORTED, "kernel spec: node %d (rand): %s", i,
                  s->batched ? "the Philox visitor numbers the elements of one M x N output (no batched kernels)"
                             : "rand must be f32, bf16 or f16");
    if ((v->op == EVT_V_ROW_SUM || v->op == EVT_V_COL_SUM || v->op == EVT_V_COL_MAX) && v->dtype != EVT_F32)
      return fail(err, errlen, EVT_ERR_UNSUPPORTED, "kernel spec: node %d (%s %s): %s sum: CTAs add into it with atomics "
                  "in f32, so it cannot be rounded to %s at the store", i, evt_vop_name(v->op), v->name,
                  evt_dtype_name(v->dtype), evt_dtype_name(v->dtype));
    if (evt_vop_has_memory(v->op) && !evt_vop_storage_ok(v->op, v->dtype, 1))
      return fail(err, errlen, EVT_ERR_UNSUPPORTED, "kernel spec: node %d (%s %s): dtype %s not supported", i,
                  evt_vop_name(v->op), v->name, evt_dtype_name(v->dtype));
    if (v->shared && (!s->batched || !evt_vop_has_memory(v->op)))
      return fail(err, errlen, EVT_ERR_INVALID, "kernel spec: node %d (%s %s): 'shared' needs a batched spec and a node with memory",
                  i, evt_vop_name(v->op), v->name);
    if (v->shared && v->op == EVT_V_AUX_STORE)
      return fail(err, errlen, EVT_ERR_UNSUPPORTED,
                  "kernel spec: node %d (aux_store %s): an aux store shared by all batches (the batches would race)", i, v->name);
    acc += v->op == EVT_V_ACC;
  }
  if (s->batched && s->cfg.reduction == EVT_RED_WORKSPACE)
    return fail(err, errlen, EVT_ERR_UNSUPPORTED,
                "kernel spec: batched: row/col sums need the atomic reduction (CUTLASS's workspace reduction keeps "
                "one tile counter per column, not per batch)");
  if (acc != 1)
    return fail(err, errlen, EVT_ERR_INVALID, "kernel spec: the epilogue must read the accumulator exactly once (%d)", acc);
  return EVT_OK;
}

/* Mainloop stages CUTLASS's StageCountAutoCarveout leaves for spec s with a cooperative 128 x epi_n
 * epilogue subtile: 227 KiB of shared memory minus the epilogue's (the collective epilogue's formulas of
 * cutlass/epilogue/collective/builders/sm90_builder.inl: with no source C, StagesC = min(subtiles, 4)
 * TMA-load buffers per aux load, StagesD = min(subtiles, 2) (or cfg.epi_stages) buffers for D and for each
 * aux store; 1 KiB
 * for barriers, broadcasts and reductions), divided by one stage of A and B tiles. */
static int coop_stages(const evt_kspec *s, int epi_n) {
  const evt_tile_config *c = &s->cfg;
  int subtiles = (c->tile_m / 128) * (c->tile_n / epi_n);
  int stages_c = subtiles < 4 ? subtiles : 4, stages_d = c->epi_stages ? c->epi_stages : subtiles < 2 ? subtiles : 2;
  long sub = 128L * epi_n, epi = (long)stages_d * sub * (long)evt_dtype_size(s->d_dtype) + 1024;
  for (int i = 0; i < s->nnodes; i++) {
    long bytes = sub * (long)evt_dtype_size(s->nodes[i].dtype);
    if (s->nodes[i].op == EVT_V_AUX_LOAD) epi += stages_c * bytes;
    if (s->nodes[i].op == EVT_V_AUX_STORE) epi += stages_d * bytes;
  }
  long per = (long)(c->tile_m + c->tile_n) * c->tile_k * (long)evt_dtype_size(s->ab_dtype);
  return (int)((227L * 1024 - epi) / per);
}

int evt_kspec_epilogue_n(const evt_kspec *s) {
  const evt_tile_config *c = &s->cfg;
  if (c->epi_n || c->schedule != EVT_SCHED_COOPERATIVE || c->stages || c->tile_m % 128 || c->tile_n % 32) return c->epi_n;
  int auto_stages = coop_stages(s, 32);
  return auto_stages < 3 && coop_stages(s, 16) > auto_stages ? 16 : 0;
}

int evt_kspec_text(const evt_kspec *s, char *buf, size_t len) {
  size_t pos = 0;
#define OUT(...)                                                                 \
  do {                                                                           \
    int w_ = snprintf(buf ? buf + (pos < len ? pos : len) : NULL,                \
                      buf && pos < len ? len - pos : 0, __VA_ARGS__);            \
    if (w_ > 0) pos += (size_t)w_;                                               \
  } while (0)
  /* the default stages / reduction add nothing, so the default config keeps its text (and hash) */
  char ab[32]; /* a mixed B is named after A's dtype; one dtype for both keeps the text (and hash) of 16-bit specs */
  snprintf(ab, sizeof ab, "%s%s%s", evt_dtype_name(s->ab_dtype), s->b_mixed ? "x" : "",
           s->b_mixed ? evt_dtype_name(s->b_dtype) : "");
  OUT("gemm %s %s->%s tile %dx%dx%d cluster %dx%d %s", layout_name(s->layout), ab, evt_dtype_name(s->d_dtype), s->cfg.tile_m, s->cfg.tile_n, s->cfg.tile_k, s->cfg.cluster_m, s->cfg.cluster_n,
      s->cfg.schedule == EVT_SCHED_PINGPONG ? "pingpong" : "cooperative");
  if (s->cfg.stages) OUT(" stages %d", s->cfg.stages);
  if (s->cfg.reduction == EVT_RED_WORKSPACE) OUT(" reduction workspace");
  if (s->cfg.epi_n) OUT(" epilogue_n %d", s->cfg.epi_n);
  if (s->cfg.stream_k) OUT(" stream_k");
  if (s->cfg.epi_stages) OUT(" epilogue_stages %d", s->cfg.epi_stages);
  OUT("\n");
  if (s->arch) OUT("arch %s\n", evt_arch_name(s->arch)); /* sm_90a specs keep their text (and hash) */
  if (s->batched) OUT("batched\n"); /* unbatched specs keep their text (and hash) */
  if (s->conv.kind) pos += (size_t)evt_conv_text(&s->conv, buf ? buf + (pos < len ? pos : len) : NULL, buf && pos < len ? len - pos : 0);
  for (int i = 0; i < s->nnodes; i++) {
    const evt_vnode *v = &s->nodes[i];
    OUT("%%%d = %s", i, evt_vop_name(v->op));
    for (int j = 0; j < evt_vop_arity(v->op); j++) OUT(" %%%d", v->in[j]);
    if (evt_vop_has_memory(v->op)) OUT(" %s:%s", v->name, evt_dtype_name(v->dtype));
    if (v->op == EVT_V_SCALAR) OUT(" %.17g", v->value);
    if (v->op == EVT_V_RAND) OUT(" %s", evt_dtype_name(v->dtype)); /* seed, offset: launch arguments, not kernel */
    if (v->shared) OUT(" shared");
    OUT("\n");
  }
  OUT("D = %%%d\n", s->d_node);
#undef OUT
  return (int)pos;
}

uint64_t evt_kspec_hash(const evt_kspec *s) {
  char buf[4096];
  int n = evt_kspec_text(s, buf, sizeof buf);
  EVT_ASSERT(n > 0 && (size_t)n < sizeof buf);
  return evt_hash_bytes(0, buf, (size_t)n);
}

uint64_t evt_kspec_epilogue_hash(const evt_kspec *s) {
  evt_kspec t = *s;
  t.cfg = EVT_TILE_CONFIG_DEFAULT;
  return evt_kspec_hash(&t);
}

void evt_kspec_canonicalize(evt_kspec *s) {
  evt_vop op[EVT_KSPEC_MAX_NODES];
  int in[EVT_KSPEC_MAX_NODES][3];
  uint64_t leaf[EVT_KSPEC_MAX_NODES], key[EVT_KSPEC_MAX_NODES];
  for (int v = 0; v < s->nnodes; v++) {
    op[v] = s->nodes[v].op;
    memcpy(in[v], s->nodes[v].in, sizeof in[v]);
    leaf[v] = evt_vop_leaf_key(op[v], s->nodes[v].dtype, s->nodes[v].value, s->nodes[v].name, s->nodes[v].shared);
  }
  evt_vop_canonical_order(s->nnodes, op, in, leaf, key);
  for (int v = 0; v < s->nnodes; v++) memcpy(s->nodes[v].in, in[v], sizeof in[v]);
}

void evt_kspec_launch_rng(const evt_kspec *s, evt_launch_args *a) {
  for (int v = 0; v < s->nnodes && v < EVT_LAUNCH_MAX_PTRS; v++)
    if (s->nodes[v].op == EVT_V_RAND) a->rng[v] = (evt_rng_key){s->nodes[v].seed, s->nodes[v].offset};
}

void evt_kspec_kernel_name(const evt_kspec *s, char out[40]) {
  snprintf(out, 40, "evt_kernel_%016llx", (unsigned long long)evt_kspec_hash(s));
}
