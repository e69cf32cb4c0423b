/* Mainloop autotuning and the fused-vs-unfused choice: host side (contract in tune.h).
 *
 * This file holds everything that needs no GPU: candidate configs, the unfused alternative's row spec,
 * the sampled CPU check, and the record files. The measurement (evt_tune_run) is in tune_gpu.c.
 */
#include "tune/tune.h"

#include "util/cachedir.h"
#include "util/env.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "codegen/lower.h"
#include "ir/ir.h"

/* ---- candidates --------------------------------------------------------------------------------- */

/* sm_8x candidates (CUTLASS 2.x multistage mainloop; evt_tile_config_check_sm80 drops those over the target's shared
 * memory): the common Ampere tiles at 32-deep K steps, then 64-deep ones with fewer stages. */
static int candidates_sm80(const evt_kspec *s, evt_tile_config *list) {
  static const int cfgs[][4] = {{128, 128, 32, 4}, {128, 128, 32, 3}, {128, 256, 32, 3}, {256, 128, 32, 3},
                                {128, 64, 32, 4},  {64, 128, 32, 4},  {64, 64, 32, 5},   {128, 128, 64, 3},
                                {64, 128, 64, 3},  {128, 64, 64, 3},  {128, 256, 64, 3}};
  int nl = 0;
  list[nl++] = s->cfg;
  for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
    evt_tile_config c = EVT_TILE_CONFIG_DEFAULT;
    c.tile_m = cfgs[i][0], c.tile_n = cfgs[i][1], c.tile_k = cfgs[i][2], c.stages = cfgs[i][3];
    list[nl++] = c;
  }
  return nl;
}

/* Keeps the legal, distinct configs of list[0..nl) that fit the problem, at most max, in out. */
static int keep_candidates(const evt_kspec *s, int64_t m, int64_t n, const evt_tile_config *list, int nl,
                           evt_tile_config *out, int max);

int evt_tune_candidates(const evt_kspec *s, int64_t m, int64_t n, int64_t k, evt_tile_config *out, int max) {
  if (evt_arch_sm8x(s->arch)) {
    evt_tile_config l8[16];
    return keep_candidates(s, m, n, l8, candidates_sm80(s, l8), out, max);
  }
  evt_tile_config C = EVT_TILE_CONFIG_DEFAULT;
  if (s->ab_dtype == EVT_F32) C.tile_k = evt_kspec_tile_k(s); /* TF32: 32 (evt_tile_config_check) */
  /* In the order they are worth trying (a cap keeps the first ones): the spec's own config (what runs
   * untuned: the lowering's default), the large cooperative tiles with and without a 2-CTA cluster (the best
   * configs measured), ping-pong, then the deterministic workspace reduction for specs with
   * sums; each config once. */
  evt_tile_config list[32];
  int nl = 0;
  list[nl++] = s->cfg;
#define ADD(tm, tn, cm, cn, sc, red)                                                                  \
  do {                                                                                                \
    evt_tile_config c_ = C;                                                                           \
    c_.tile_m = tm, c_.tile_n = tn, c_.cluster_m = cm, c_.cluster_n = cn, c_.schedule = sc, c_.reduction = red; \
    list[nl++] = c_;                                                                                  \
  } while (0)
  /* Fewer 128x256 output tiles than SMs over a long K: the stream-K scheduler right after the default (the
   * generated kernel otherwise runs a handful of CTAs down K, e.g. vit_p14's weight gradients at K = 32896) */
  if (!s->batched && k >= 2048 && ((m + 127) / 128) * ((n + 255) / 256) < EVT_TUNE_SMS) {
    ADD(128, 256, 1, 1, EVT_SCHED_COOPERATIVE, EVT_RED_ATOMIC);
    list[nl - 1].stream_k = 1;
    ADD(128, 128, 1, 1, EVT_SCHED_COOPERATIVE, EVT_RED_ATOMIC);
    list[nl - 1].stream_k = 1;
  }
  /* ping-pong with a 64x64 epilogue subtile (64x32 otherwise): more independent elements between the subtile's
   * barriers: faster on the GELU epilogues */
  ADD(128, 128, 1, 1, EVT_SCHED_PINGPONG, EVT_RED_ATOMIC);
  list[nl - 1].epi_n = 64;
  ADD(128, 256, 1, 1, EVT_SCHED_COOPERATIVE, EVT_RED_ATOMIC);
  ADD(128, 256, 2, 1, EVT_SCHED_COOPERATIVE, EVT_RED_ATOMIC);
  ADD(128, 256, 1, 1, EVT_SCHED_COOPERATIVE, EVT_RED_ATOMIC);
  { /* CUTLASS's own 32-wide subtile, where the automatic one of this tile is 16 (evt_kspec_epilogue_n) */
    evt_kspec t = *s;
    t.cfg = list[nl - 1];
    if (evt_kspec_epilogue_n(&t) == 16) list[nl - 1].epi_n = 32;
    else nl--;
  }
  ADD(128, 128, 1, 1, EVT_SCHED_PINGPONG, EVT_RED_ATOMIC);
  ADD(256, 128, 2, 1, EVT_SCHED_COOPERATIVE, EVT_RED_ATOMIC);
  ADD(256, 128, 1, 1, EVT_SCHED_COOPERATIVE, EVT_RED_ATOMIC);
  ADD(128, 128, 2, 1, EVT_SCHED_COOPERATIVE, EVT_RED_ATOMIC);
  ADD(128, 128, 2, 1, EVT_SCHED_PINGPONG, EVT_RED_ATOMIC);
  ADD(64, 256, 1, 1, EVT_SCHED_PINGPONG, EVT_RED_ATOMIC);
  ADD(128, 256, 1, 1, EVT_SCHED_COOPERATIVE, EVT_RED_WORKSPACE);
  ADD(128, 256, 2, 1, EVT_SCHED_COOPERATIVE, EVT_RED_WORKSPACE);
  ADD(128, 128, 1, 1, EVT_SCHED_PINGPONG, EVT_RED_WORKSPACE);
  ADD(128, 256, 1, 1, EVT_SCHED_COOPERATIVE, EVT_RED_ATOMIC);
  list[nl - 1].epi_n = 64; /* a wider epilogue subtile (fewer, larger TMA stores; less smem for stages) */
  ADD(128, 256, 2, 1, EVT_SCHED_COOPERATIVE, EVT_RED_ATOMIC);
  list[nl - 1].epi_n = 64;
#undef ADD
  return keep_candidates(s, m, n, list, nl, out, max);
}

static int keep_candidates(const evt_kspec *s, int64_t m, int64_t n, const evt_tile_config *list, int nl,
                           evt_tile_config *out, int max) {
  int cnt = 0;
  for (int i = 0; i < nl && cnt < max; i++) {
    evt_tile_config c = list[i];
    if (i > 0 && (m < c.tile_m || n < c.tile_n)) continue; /* a tile larger than the problem */
    if (evt_tile_config_check(s, &c, NULL, 0) != EVT_OK) continue;
    bool seen = false; /* (the default may already be one of the list's configs: 128x256 once N >= 256) */
    for (int j = 0; j < cnt && !seen; j++)
      seen = out[j].tile_m == c.tile_m && out[j].tile_n == c.tile_n && out[j].tile_k == c.tile_k &&
             out[j].cluster_m == c.cluster_m && out[j].cluster_n == c.cluster_n && out[j].schedule == c.schedule &&
             out[j].stages == c.stages && out[j].reduction == c.reduction && out[j].epi_n == c.epi_n &&
             out[j].stream_k == c.stream_k && out[j].epi_stages == c.epi_stages;
    if (!seen) out[cnt++] = c;
  }
  return cnt;
}

int evt_tune_sched_variants(int64_t m, int64_t n, int (*out)[2], int max) {
  /* swizzle only matters when a wave of tiles spans more than a few tile rows / columns */
  static const int all[][2] = {{1, 0}, {2, 0}, {4, 0}, {8, 0}, {4, 1}, {4, 2}, {8, 1}, {8, 2}};
  int nv = (m * n >= (int64_t)4096 * 4096) ? 8 : 4;
  int c = 0;
  for (int i = 0; i < nv && c < max; i++) {
    out[c][0] = all[i][0];
    out[c][1] = all[i][1];
    c++;
  }
  return c;
}

/* ---- the unfused alternative's row spec ----------------------------------------------------------- */

static int nusers(const evt_kspec *s, int v) {
  int u = 0;
  for (int i = 0; i < s->nnodes; i++)
    for (int j = 0; j < evt_vop_arity(s->nodes[i].op); j++) u += s->nodes[i].in[j] == v;
  return u;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int evt_tune_interleave(int rounds, int (*time)(void *ctx, int which, double *ms), void *ctx, double ms[2]) {
  enum { MAX_ROUNDS = 16 };
  double t[2][MAX_ROUNDS];
  /* an even number of rounds: each implementation then runs first as often as second, so a steady clock drift
   * puts both medians at the same mean position (with an odd count the median of one sits a call later) */
  if (rounds < 2) rounds = 2;
  if (rounds > MAX_ROUNDS) rounds = MAX_ROUNDS;
  rounds += rounds % 2;
  for (int r = 0; r < rounds; r++)
    for (int j = 0; j < 2; j++) {
      int which = (r + j) % 2; /* round 0: fused first; round 1: unfused first; ... */
      int rc = time(ctx, which, &t[which][r]);
      if (rc) return rc;
    }
  for (int w = 0; w < 2; w++) { /* the median of an even count: the mean of the middle two */
    qsort(t[w], (size_t)rounds, sizeof t[w][0], cmp_double);
    ms[w] = 0.5 * (t[w][rounds / 2 - 1] + t[w][rounds / 2]);
  }
  return 0;
}

evt_status evt_tune_unfused_rspec(const evt_kspec *s, evt_dtype t_dtype, int absorb_bias, evt_rspec *out, int *map,
                                  int *t_node, int *d_node, int *bias_node, char *err, size_t errlen) {
  *t_node = *d_node = *bias_node = -1;
  int acc = -1;
  for (int i = 0; i < s->nnodes; i++)
    if (s->nodes[i].op == EVT_V_ACC) acc = i;
  if (acc < 0 || s->d_node < 0) {
    snprintf(err, errlen, "spec has no accumulator or no D");
    return EVT_ERR_INVALID;
  }
  /* the node that becomes T: the accumulator, or acc + row_bcast when cuBLASLt adds the bias */
  int tsrc = acc, bias = -1;
  if (absorb_bias && nusers(s, acc) == 1) {
    for (int i = 0; i < s->nnodes; i++) {
      const evt_vnode *v = &s->nodes[i];
      if (v->op != EVT_V_ADD) continue;
      int o = v->in[0] == acc ? v->in[1] : v->in[1] == acc ? v->in[0] : -1;
      if (o < 0 || s->nodes[o].op != EVT_V_ROW_BCAST || s->nodes[o].dtype != t_dtype) continue;
      tsrc = i;
      bias = o;
      break;
    }
  }
  if (s->d_node == tsrc && s->nnodes == (bias >= 0 ? 3 : 1)) {
    *bias_node = bias;
    snprintf(err, errlen, "D is the GEMM output itself: no row kernel");
    return EVT_ERR_UNSUPPORTED;
  }
  int remap[EVT_KSPEC_MAX_NODES];
  evt_rspec_init(out, EVT_ROWN_NONE, t_dtype);
  int id = -1;
  for (int i = 0; i < s->nnodes; i++) {
    const evt_vnode *v = &s->nodes[i];
    remap[i] = -1;
    if (i == acc && tsrc != acc) continue;                  /* folded into T */
    if (i == bias && nusers(s, bias) == 1) continue;        /* added by cuBLASLt */
    if (i == tsrc) {
      id = evt_rspec_add(out, EVT_V_AUX_LOAD, -1, -1, t_dtype, "t_gemm");
      if (id >= 0) map[id] = -1, *t_node = id;
    } else {
      int in0 = v->in[0] >= 0 ? remap[v->in[0]] : -1, in1 = v->in[1] >= 0 ? remap[v->in[1]] : -1;
      int in2 = v->in[2] >= 0 ? remap[v->in[2]] : -1; /* (where: a ReLU backward's select) */
      if (v->op == EVT_V_SCALAR) {
        id = evt_rspec_scalar(out, v->value);
      } else {
        id = evt_rspec_add3(out, v->op, in0, in1, in2, v->dtype, v->name);
      }
      if (id >= 0) map[id] = evt_vop_has_memory(v->op) ? i : -1;
    }
    if (id < 0) {
      snprintf(err, errlen, "node %d (%s) does not fit a row spec", i, evt_vop_name(v->op));
      return EVT_ERR_UNSUPPORTED;
    }
    remap[i] = id;
  }
  int dsrc = remap[s->d_node];
  EVT_ASSERT(dsrc >= 0);
  id = evt_rspec_add(out, EVT_V_AUX_STORE, dsrc, -1, s->d_dtype, "d_out");
  if (id < 0) {
    snprintf(err, errlen, "too many nodes for a row spec");
    return EVT_ERR_UNSUPPORTED;
  }
  map[id] = -1;
  *d_node = id;
  *bias_node = bias;
  return evt_rspec_check(out, err, errlen);
}

/* ---- sampled CPU check ---------------------------------------------------------------------------- */

static double f16_to_double(uint16_t h) {
  int e = (h >> 10) & 31, mant = h & 1023;
  double sgn = (h & 0x8000) ? -1.0 : 1.0;
  if (e == 0) return sgn * ldexp(mant, -24);
  if (e == 31) return mant ? NAN : sgn * INFINITY;
  return sgn * ldexp(mant + 1024, e - 25);
}

static double raw_get(const void *p, evt_dtype dt, int64_t i) {
  if (dt == EVT_F32) return ((const float *)p)[i];
  uint16_t h = ((const uint16_t *)p)[i];
  if (dt == EVT_F16) return f16_to_double(h);
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

typedef struct erracc {
  double maxdiff, maxref;
  int nan_bad;
} erracc;

static void err_add(erracc *e, double g, double r) {
  if (isnan(g) || isnan(r)) {
    if (!(isnan(g) && isnan(r))) e->nan_bad = 1;
    return;
  }
  if (isinf(g) || isinf(r)) {
    if (g != r) e->nan_bad = 1;
    return;
  }
  double d = fabs(g - r);
  if (d > e->maxdiff) e->maxdiff = d;
  if (fabs(r) > e->maxref) e->maxref = fabs(r);
}

static double err_value(const erracc *e) {
  if (e->nan_bad) return INFINITY;
  return e->maxdiff / (e->maxref > 1e-3 ? e->maxref : 1e-3);
}

/* The sampled check is the tuner's main host cost at training sizes (an MLP problem's rows are 16384 x 4096
 * multiply-adds each; XML-CNN's rows are 670208 wide), so:
 * the operands are converted to double once per sub-problem, in row-major (NN) order whatever the spec's
 * layout (the reference's inner loop then runs along contiguous memory), and each sampled row / column is
 * an independent job; the jobs run on the online CPUs (evt_tune_set_threads). */
typedef struct check_job {
  const evt_kspec *s;  /* the spec with layout NN */
  int64_t m, n, k;     /* the full problem */
  const void *const *mem;
  const void *d;
  const double *A, *B; /* sub 0: A = the sampled rows (cnt x k), B = all of B (k x n); sub 1: A = all of A
                        * (m x k), B = the sampled columns, each contiguous (cnt x k) */
  const int64_t *idx;
  int sub, pos;        /* rows (0) or columns (1); which sample */
  double err;
} check_job;

static void check_one(check_job *J) {
  const evt_kspec *s = J->s;
  int64_t m = J->m, n = J->n, k = J->k, gi = J->idx[J->pos];
  int sub = J->sub;
  int64_t sm = sub ? m : 1, sn = sub ? 1 : n;
  const double *A = sub ? J->A : J->A + J->pos * k, *B = sub ? J->B + J->pos * k : J->B;
  double *D = malloc(sizeof(double) * (size_t)(sm * sn));
  EVT_ASSERT(D);
  double *T[EVT_KSPEC_MAX_NODES] = {0};
  for (int v = 0; v < s->nnodes; v++) {
    const evt_vnode *nd = &s->nodes[v];
    int64_t len = 0;
    switch (nd->op) {
      case EVT_V_ROW_BCAST:
      case EVT_V_ROW_SUM: len = sn; break;
      case EVT_V_COL_BCAST:
      case EVT_V_COL_SUM: len = sm; break;
      case EVT_V_AUX_LOAD:
      case EVT_V_AUX_STORE: len = sm * sn; break;
      default: break;
    }
    if (!len) continue;
    T[v] = calloc((size_t)len, sizeof(double));
    EVT_ASSERT(T[v]);
    if (nd->op == EVT_V_ROW_BCAST)
      for (int64_t j = 0; j < sn; j++) T[v][j] = raw_get(J->mem[v], nd->dtype, sub ? gi : j);
    if (nd->op == EVT_V_COL_BCAST)
      for (int64_t i = 0; i < sm; i++) T[v][i] = raw_get(J->mem[v], nd->dtype, sub ? i : gi);
    if (nd->op == EVT_V_AUX_LOAD)
      for (int64_t i = 0; i < sm; i++)
        for (int64_t j = 0; j < sn; j++) T[v][i * sn + j] = raw_get(J->mem[v], nd->dtype, (sub ? i : gi) * n + (sub ? gi : j));
  }
  /* (a B of one column is k x 1 in NN order: the contiguous k values this job holds) */
  evt_kspec_reference(s, sm, sn, k, A, B, T, D);
  erracc e = {0};
  for (int64_t i = 0; i < sm; i++)
    for (int64_t j = 0; j < sn; j++) err_add(&e, raw_get(J->d, s->d_dtype, (sub ? i : gi) * n + (sub ? gi : j)), D[i * sn + j]);
  double worst = err_value(&e);
  for (int v = 0; v < s->nnodes; v++) {
    const evt_vnode *nd = &s->nodes[v];
    erracc ev = {0};
    if (nd->op == EVT_V_AUX_STORE) {
      for (int64_t i = 0; i < sm; i++)
        for (int64_t j = 0; j < sn; j++)
          err_add(&ev, raw_get(J->mem[v], nd->dtype, (sub ? i : gi) * n + (sub ? gi : j)), T[v][i * sn + j]);
    } else if (nd->op == EVT_V_ROW_SUM && sub == 1) {
      err_add(&ev, raw_get(J->mem[v], EVT_F32, gi), T[v][0]);
    } else if (nd->op == EVT_V_COL_SUM && sub == 0) {
      err_add(&ev, raw_get(J->mem[v], EVT_F32, gi), T[v][0]);
    } else {
      continue;
    }
    worst = fmax(worst, err_value(&ev));
  }
  for (int v = 0; v < s->nnodes; v++) free(T[v]);
  free(D);
  J->err = worst;
}

/* ---- host-side parallel loop (the sampled check, the random data) ------------------------------------- */

typedef struct par_pool {
  void (*fn)(void *ctx, int i);
  void *ctx;
  int njobs, next;
  pthread_mutex_t mu;
} par_pool;

static void *par_worker(void *arg) {
  par_pool *P = arg;
  for (;;) {
    pthread_mutex_lock(&P->mu);
    int i = P->next < P->njobs ? P->next++ : -1;
    pthread_mutex_unlock(&P->mu);
    if (i < 0) return NULL;
    P->fn(P->ctx, i);
  }
}

/* fn(ctx, i) for i in [0, njobs), on up to EVT_TUNE_CHECK_THREADS threads (default: the online CPUs), this one
 * included; the jobs must be independent. Runs them all in this thread when no other could start. */
static int tune_threads; /* 0: the CPU count */
void evt_tune_set_threads(int n) { tune_threads = n; }

static void par_for(int njobs, void (*fn)(void *ctx, int i), void *ctx) {
  if (njobs <= 0) return;
  long nt = tune_threads > 0 ? tune_threads : sysconf(_SC_NPROCESSORS_ONLN);
  if (nt < 1) nt = 1;
  if (nt > njobs) nt = njobs;
  if (nt > 64) nt = 64;
  par_pool P = {fn, ctx, njobs, 0, PTHREAD_MUTEX_INITIALIZER};
  pthread_t th[64];
  int started = 0;
  for (long t = 1; t < nt; t++)
    if (pthread_create(&th[started], NULL, par_worker, &P) == 0) started++;
  par_worker(&P);
  for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
  pthread_mutex_destroy(&P.mu);
}

static void check_job_run(void *ctx, int i) { check_one(&((check_job *)ctx)[i]); }

double evt_tune_check_sampled(const evt_kspec *s, int64_t m, int64_t n, int64_t k, const void *a, const void *b,
                              const void *const *mem, const void *d, const int64_t *rows, int nr, const int64_t *cols,
                              int nc) {
  if (nr < 0) nr = 0;
  if (nc < 0) nc = 0;
  if (nr + nc == 0) return 0;
  int at = s->layout == EVT_LAYOUT_TN, bt = s->layout == EVT_LAYOUT_NT;
  evt_kspec nn = *s;
  nn.layout = EVT_LAYOUT_NN;
#define A_AT(i, kk) raw_get(a, s->ab_dtype, at ? (kk) * m + (i) : (i) * k + (kk))
#define B_AT(kk, j) raw_get(b, s->ab_dtype, bt ? (j) * k + (kk) : (kk) * n + (j))
  double *Ar = NULL, *Bn = NULL, *An = NULL, *Bc = NULL;
  if (nr) { /* the sampled rows of A (nr x k) and all of B (k x n) */
    Ar = malloc(sizeof(double) * (size_t)(nr * k));
    Bn = malloc(sizeof(double) * (size_t)(k * n));
    EVT_ASSERT(Ar && Bn);
    for (int r = 0; r < nr; r++)
      for (int64_t kk = 0; kk < k; kk++) Ar[r * k + kk] = A_AT(rows[r], kk);
    for (int64_t kk = 0; kk < k; kk++)
      for (int64_t j = 0; j < n; j++) Bn[kk * n + j] = B_AT(kk, j);
  }
  if (nc) { /* all of A (m x k) and the sampled columns of B, each contiguous */
    An = malloc(sizeof(double) * (size_t)(m * k));
    Bc = malloc(sizeof(double) * (size_t)(nc * k));
    EVT_ASSERT(An && Bc);
    for (int64_t i = 0; i < m; i++)
      for (int64_t kk = 0; kk < k; kk++) An[i * k + kk] = A_AT(i, kk);
    for (int c = 0; c < nc; c++)
      for (int64_t kk = 0; kk < k; kk++) Bc[c * k + kk] = B_AT(kk, cols[c]);
  }
#undef A_AT
#undef B_AT
  int njobs = nr + nc;
  check_job *jobs = calloc((size_t)njobs, sizeof *jobs);
  EVT_ASSERT(jobs);
  for (int i = 0; i < njobs; i++) {
    check_job *J = &jobs[i];
    J->s = &nn, J->m = m, J->n = n, J->k = k, J->mem = mem, J->d = d;
    J->sub = i >= nr;
    J->pos = J->sub ? i - nr : i;
    J->idx = J->sub ? cols : rows;
    J->A = J->sub ? An : Ar;
    J->B = J->sub ? Bc : Bn;
  }
  par_for(njobs, check_job_run, jobs);
  double e = 0;
  for (int i = 0; i < njobs; i++) e = isinf(jobs[i].err) || isinf(e) ? INFINITY : fmax(e, jobs[i].err);
  free(jobs);
  free(Ar), free(Bn), free(An), free(Bc);
  return e;
}

/* ---- random operands for the timing ------------------------------------------------------------------ */

static uint16_t to_16(float v, evt_dtype dt) {
  double r = evt_round_to_dtype(v, dt);
  if (dt == EVT_BF16) {
    float f = (float)r;
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
  }
  /* f16: r is exactly representable; |r| < 2 here, so normal or subnormal */
  float f = (float)r;
  uint16_t sgn = f < 0 ? 0x8000 : 0;
  f = fabsf(f);
  if (f == 0) return sgn;
  int e;
  float m = frexpf(f, &e); /* f = m·2^e, m in [0.5, 1) */
  int he = e - 1 + 15;
  if (he <= 0) return (uint16_t)(sgn | (uint16_t)lrintf(ldexpf(f, 24)));
  return (uint16_t)(sgn | (he << 10) | ((uint16_t)lrintf((m * 2 - 1) * 1024) & 1023));
}

#define RAND_CHUNK ((int64_t)1 << 20)

typedef struct rand_job {
  unsigned char *b;
  evt_dtype dt;
  int64_t n;
  uint64_t seed;
} rand_job;

static void rand_chunk(void *ctx, int c) {
  const rand_job *R = ctx;
  int64_t lo = (int64_t)c * RAND_CHUNK, hi = lo + RAND_CHUNK < R->n ? lo + RAND_CHUNK : R->n;
  /* xorshift64 per chunk, its state from (seed, chunk) through splitmix64: the same values whatever the threads */
  uint64_t z = R->seed * 0x9E3779B97F4A7C15ull + (uint64_t)c * 0xBF58476D1CE4E5B9ull + 1;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  uint64_t s = (z ^ (z >> 31)) | 1;
  for (int64_t i = lo; i < hi; i++) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    float v = (float)((double)(s >> 11) * (2.0 / 9007199254740992.0) - 1.0);
    if (R->dt == EVT_F32) memcpy(R->b + 4 * i, &v, 4);
    else {
      uint16_t h = to_16(v, R->dt);
      memcpy(R->b + 2 * i, &h, 2);
    }
  }
}

void *evt_tune_random_data(evt_dtype dt, int64_t n, uint64_t seed) {
  size_t es = dt == EVT_F32 ? 4 : 2;
  rand_job R = {malloc((size_t)n * es + 16), dt, n, seed};
  EVT_ASSERT(R.b);
  par_for((int)((n + RAND_CHUNK - 1) / RAND_CHUNK), rand_chunk, &R);
  return R.b;
}

/* ---- record files ------------------------------------------------------------------------------- */

void evt_tune_dir(const char *cache_dir, char *out, size_t len) {
  if (cache_dir && *cache_dir) snprintf(out, len, "%s/tune", cache_dir);
  else evt_env_cache_dir("tune", out, len);
}

static void gpu_slug(const char *gpu, char *out, size_t len) {
  if (!gpu || !*gpu) gpu = "any";
  size_t i = 0;
  for (; gpu[i] && i + 1 < len; i++) out[i] = isalnum((unsigned char)gpu[i]) ? gpu[i] : '_';
  out[i] = 0;
}

void evt_tune_record_name(uint64_t spec_hash, int64_t m, int64_t n, int64_t k, const char *gpu, char *out, size_t len) {
  char slug[80];
  gpu_slug(gpu, slug, sizeof slug);
  snprintf(out, len, "%016llx-%lldx%lldx%lld-%s.txt", (unsigned long long)spec_hash, (long long)m, (long long)n,
           (long long)k, slug);
}

/* The record's text, without its checksum line. */
static void record_text(FILE *f, const evt_tune_record *r) {
  char lab[96];
  fprintf(f, "evt-tune 1\nspec %016llx\nshape %lld %lld %lld\ngpu %s\n", (unsigned long long)r->spec_hash,
          (long long)r->m, (long long)r->n, (long long)r->k, r->gpu[0] ? r->gpu : "any");
  fprintf(f, "choice %s\n", r->choice == EVT_TUNE_FUSED ? "fused" : r->choice == EVT_TUNE_UNFUSED ? "unfused" : "none");
  fprintf(f, "config %s\nswizzle %d\nraster %d\n", evt_tile_config_label(&r->cfg, lab, sizeof lab), r->swizzle, r->raster);
  fprintf(f, "fused_ms %.6f\nunfused_ms %.6f\ndefault_ms %.6f\nunfused %s\ncheck %.6g\n", r->fused_ms, r->unfused_ms,
          r->default_ms, r->unfused_how[0] ? r->unfused_how : "-", r->check_err);
  fprintf(f, "source %016llx\n", (unsigned long long)r->source_hash);
  for (int i = 0; i < r->ncand; i++) {
    const evt_tune_cand *c = &r->cand[i];
    fprintf(f, "cand %.6f %d %d %s%s%s\n", c->ms, c->swizzle, c->raster, evt_tile_config_label(&c->cfg, lab, sizeof lab),
            c->note[0] ? " ; " : "", c->note);
  }
}

/* The tune folder of cache_dir, checked (and created with create): 0, or -1 with msg. */
static int tune_dir_ok(const char *cache_dir, int create, char *dir, size_t dirlen, char *msg, size_t msglen) {
  evt_tune_dir(cache_dir, dir, dirlen);
  return evt_cache_dir_private(dir, 2, create, msg, msglen) == 0 ? 0 : -1;
}

evt_status evt_tune_record_write(const char *cache_dir, const evt_tune_record *r, char *msg, size_t msglen) {
  char dir[1000], name[200], path[1300];
  if (tune_dir_ok(cache_dir, 1, dir, sizeof dir, msg, msglen) != 0) return EVT_ERR_IO;
  evt_tune_record_name(r->spec_hash, r->m, r->n, r->k, r->gpu, name, sizeof name);
  snprintf(path, sizeof path, "%s/%s", dir, name);
  char *text = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&text, &n);
  EVT_ASSERT(f);
  record_text(f, r);
  fclose(f);
  text = evt_cache_seal_text(text, n);
  int rc = evt_cache_write(path, text, strlen(text));
  free(text);
  if (rc != 0) {
    snprintf(msg, msglen, "cannot write %s: %s", path, strerror(errno));
    return EVT_ERR_IO;
  }
  return EVT_OK;
}

static evt_status parse_record(FILE *f, evt_tune_record *r) {
  memset(r, 0, sizeof *r);
  r->unfused_ms = r->default_ms = r->check_err = -1;
  char line[512];
  int version = 0, have_choice = 0, have_shape = 0;
  while (fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = 0;
    char *sp = strchr(line, ' ');
    if (!sp) continue;
    *sp = 0;
    const char *key = line, *val = sp + 1;
    if (!strcmp(key, "evt-tune")) version = atoi(val);
    else if (!strcmp(key, "spec")) r->spec_hash = strtoull(val, NULL, 16);
    else if (!strcmp(key, "shape")) {
      long long m, n, k;
      if (sscanf(val, "%lld %lld %lld", &m, &n, &k) != 3) return EVT_ERR_INVALID;
      r->m = m, r->n = n, r->k = k;
      have_shape = 1;
    } else if (!strcmp(key, "gpu")) snprintf(r->gpu, sizeof r->gpu, "%s", val);
    else if (!strcmp(key, "choice")) {
      have_choice = 1;
      if (!strcmp(val, "fused")) r->choice = EVT_TUNE_FUSED;
      else if (!strcmp(val, "unfused")) r->choice = EVT_TUNE_UNFUSED;
      else if (!strcmp(val, "none")) r->choice = EVT_TUNE_NONE;
      else return EVT_ERR_INVALID;
    } else if (!strcmp(key, "config")) {
      if (evt_tile_config_parse(val, &r->cfg) != EVT_OK) return EVT_ERR_INVALID;
    } else if (!strcmp(key, "swizzle")) r->swizzle = atoi(val);
    else if (!strcmp(key, "raster")) r->raster = atoi(val);
    else if (!strcmp(key, "fused_ms")) r->fused_ms = atof(val);
    else if (!strcmp(key, "unfused_ms")) r->unfused_ms = atof(val);
    else if (!strcmp(key, "default_ms")) r->default_ms = atof(val);
    else if (!strcmp(key, "check")) r->check_err = atof(val);
    else if (!strcmp(key, "source")) r->source_hash = strtoull(val, NULL, 16);
    else if (!strcmp(key, "unfused")) snprintf(r->unfused_how, sizeof r->unfused_how, "%s", strcmp(val, "-") ? val : "");
    else if (!strcmp(key, "cand") && r->ncand < EVT_TUNE_MAX_CAND) {
      evt_tune_cand *c = &r->cand[r->ncand];
      memset(c, 0, sizeof *c);
      int off = 0;
      if (sscanf(val, "%lf %d %d %n", &c->ms, &c->swizzle, &c->raster, &off) < 3) return EVT_ERR_INVALID;
      char lab[200];
      snprintf(lab, sizeof lab, "%s", val + off);
      char *semi = strstr(lab, " ; ");
      if (semi) {
        snprintf(c->note, sizeof c->note, "%s", semi + 3);
        *semi = 0;
      }
      if (evt_tile_config_parse(lab, &c->cfg) != EVT_OK) return EVT_ERR_INVALID;
      r->ncand++;
    }
  }
  if (version != 1 || !have_choice || !have_shape) return EVT_ERR_INVALID;
  return EVT_OK;
}

uint64_t evt_tune_sources_hash(const evt_kspec *s, const evt_tune_record *r) {
  uint64_t h = evt_hash_bytes(0, "--tune sources--", 16);
  int n = r->ncand > 0 ? r->ncand : 1;
  for (int i = 0; i < n; i++) {
    evt_kspec t = *s;
    t.cfg = r->ncand > 0 ? r->cand[i].cfg : r->cfg;
    char err[256];
    char *src = evt_emit_cutlass(&t, err, sizeof err);
    if (src) h = evt_hash_bytes(h, src, strlen(src));
    else h = evt_hash_bytes(h, "-", 1); /* (a config the emitter now refuses changes the hash too) */
    free(src);
  }
  return h;
}

/* Was r measured on the kernels the emitter generates now? */
static int record_current(const evt_kspec *s, const evt_tune_record *r) {
  return r->source_hash != 0 && r->source_hash == evt_tune_sources_hash(s, r);
}

evt_status evt_tune_record_reusable(const char *cache_dir, const evt_kspec *s, int64_t m, int64_t n, int64_t k,
                                   int max_configs, evt_tune_record *r) {
  int maxc = max_configs > 0 && max_configs < EVT_TUNE_MAX_CAND ? max_configs : EVT_TUNE_MAX_CAND;
  evt_tile_config cf[EVT_TUNE_MAX_CAND];
  int want = evt_tune_candidates(s, m, n, k, cf, maxc);
  evt_status st = evt_tune_record_read(cache_dir, evt_kspec_epilogue_hash(s), m, n, k, NULL, r);
  if (st == EVT_OK && (r->ncand < want || !record_current(s, r))) st = EVT_ERR_IO;
  return st;
}

/* Parses the record at path when its checksum holds; a failed checksum is said once on stderr. */
static evt_status read_verified(const char *path, evt_tune_record *r) {
  size_t n;
  char *text = evt_cache_read(path, &n);
  if (!text) return EVT_ERR_IO;
  long body = evt_cache_text_body(text, n);
  evt_status st = EVT_ERR_INVALID;
  if (body < 0) {
    fprintf(stderr, "evt: warning: tuning record %s fails its checksum: ignored (measured again)\n", path);
  } else if (body > 0) {
    FILE *f = fmemopen(text, (size_t)body, "r");
    EVT_ASSERT(f);
    st = parse_record(f, r);
    fclose(f);
  }
  free(text);
  return st;
}

evt_status evt_tune_record_read(const char *cache_dir, uint64_t spec_hash, int64_t m, int64_t n, int64_t k,
                                const char *gpu, evt_tune_record *r) {
  char dir[1000], name[260], path[1300], why[1200];
  if (tune_dir_ok(cache_dir, 0, dir, sizeof dir, why, sizeof why) != 0) return EVT_ERR_IO;
  if (gpu) {
    evt_tune_record_name(spec_hash, m, n, k, gpu, name, sizeof name);
  } else {
    /* any GPU: the first file (in name order) with this spec and shape */
    char prefix[100];
    snprintf(prefix, sizeof prefix, "%016llx-%lldx%lldx%lld-", (unsigned long long)spec_hash, (long long)m,
             (long long)n, (long long)k);
    DIR *dp = opendir(dir);
    if (!dp) return EVT_ERR_IO;
    name[0] = 0;
    struct dirent *de;
    while ((de = readdir(dp)))
      if (!strncmp(de->d_name, prefix, strlen(prefix)) && strlen(de->d_name) > 4 &&
          !strcmp(de->d_name + strlen(de->d_name) - 4, ".txt") && (!name[0] || strcmp(de->d_name, name) < 0))
        snprintf(name, sizeof name, "%s", de->d_name);
    closedir(dp);
    if (!name[0]) return EVT_ERR_IO;
  }
  snprintf(path, sizeof path, "%s/%s", dir, name);
  evt_status st = read_verified(path, r);
  if (st == EVT_OK && (r->spec_hash != spec_hash || r->m != m || r->n != n || r->k != k)) st = EVT_ERR_INVALID;
  return st;
}

/* evt_tune_apply; *stale (if given) = 1 when a record exists but was timed on kernels generated differently. */
static evt_tune_choice tune_apply(evt_kspec *s, int64_t m, int64_t n, int64_t k, const char *cache_dir, const char *gpu,
                                  evt_tune_record *rec, int *stale) {
  evt_tune_record r;
  if (stale) *stale = 0;
  if (evt_tune_record_read(cache_dir, evt_kspec_epilogue_hash(s), m, n, k, gpu, &r) != EVT_OK) return EVT_TUNE_NONE;
  if (!record_current(s, &r)) {
    if (stale) *stale = 1;
    return EVT_TUNE_NONE;
  }
  if (rec) *rec = r;
  if (r.choice == EVT_TUNE_FUSED || r.choice == EVT_TUNE_UNFUSED) {
    /* UNFUSED: the best fused config too, for a runtime that runs the group fused anyway */
    if (evt_tile_config_check(s, &r.cfg, NULL, 0) != EVT_OK) return r.choice == EVT_TUNE_FUSED ? EVT_TUNE_NONE : r.choice;
    s->cfg = r.cfg;
  }
  return r.choice;
}

evt_tune_choice evt_tune_apply(evt_kspec *s, int64_t m, int64_t n, int64_t k, const char *cache_dir, const char *gpu,
                               evt_tune_record *rec) {
  return tune_apply(s, m, n, k, cache_dir, gpu, rec, NULL);
}

void evt_tune_launch_apply(const evt_tune_record *r, evt_launch_args *a) {
  if (!r || r->choice != EVT_TUNE_FUSED) return;
  a->swizzle = r->swizzle;
  a->raster = r->raster;
}

static const char *raster_name(int r) { return r == 1 ? " along-M" : r == 2 ? " along-N" : ""; }

void evt_tune_describe(const evt_tune_record *r, evt_tune_choice c, const evt_kspec *s, char *out, size_t len) {
  char lab[96];
  if (c == EVT_TUNE_FUSED) {
    snprintf(out, len, "fused %s swizzle %d%s (%.4f ms; unfused %.4f ms via %s; default config %.4f ms)",
             evt_tile_config_label(&r->cfg, lab, sizeof lab), r->swizzle > 1 ? r->swizzle : 1, raster_name(r->raster),
             r->fused_ms, r->unfused_ms, r->unfused_how[0] ? r->unfused_how : "-", r->default_ms);
  } else if (c == EVT_TUNE_UNFUSED) {
    snprintf(out, len, "unfused (measured %.4f ms via %s vs fused %.4f ms)", r->unfused_ms,
             r->unfused_how[0] ? r->unfused_how : "-", r->fused_ms);
  } else {
    snprintf(out, len, "not tuned (default config %s)", evt_tile_config_label(&s->cfg, lab, sizeof lab));
  }
}

int evt_tune_apply_lowered(evt_lower_result *low, const char *cache_dir, const char *gpu, evt_tune_group *out) {
  int found = 0;
  for (int i = 0; i < low->n; i++) {
    evt_lowered *L = &low->k[i];
    evt_tune_group *o = &out[i];
    memset(o, 0, sizeof *o);
    if (L->kind != EVT_LK_GEMM_EVT || !L->ok) continue;
    if (L->spec.batched) {
      snprintf(o->desc, sizeof o->desc, "not tuned (batched GEMMs are not tuned; default config)");
      continue;
    }
    evt_tune_record r;
    int stale;
    o->choice = tune_apply(&L->spec, L->m, L->n, L->k, cache_dir, gpu, &r, &stale);
    o->unfused_bias = (o->choice == EVT_TUNE_UNFUSED || o->choice == EVT_TUNE_FUSED) && strstr(r.unfused_how, "(bias)") != NULL;
    if (o->choice == EVT_TUNE_FUSED || o->choice == EVT_TUNE_UNFUSED) {
      o->fused_ms = r.fused_ms;
      o->unfused_ms = r.unfused_ms;
      evt_kspec_kernel_name(&L->spec, L->kernel);
      o->swizzle = r.swizzle;
      o->raster = r.raster;
    }
    found += o->choice != EVT_TUNE_NONE;
    evt_tune_describe(&r, o->choice, &L->spec, o->desc, sizeof o->desc);
    if (stale) {
      char lab[96];
      snprintf(o->desc, sizeof o->desc,
               "not tuned (its record is stale: measured on kernels the emitter now generates differently; the next "
               "tuning measures it again; default config %s)",
               evt_tile_config_label(&L->spec.cfg, lab, sizeof lab));
    }
  }
  return found;
}

int evt_tune_collect(const evt_lower_result *low, const int *want, evt_tune_problem **out, int *prob_of) {
  evt_tune_problem *p = calloc((size_t)low->n + 1, sizeof *p);
  EVT_ASSERT(p);
  int np = 0;
  for (int gi = 0; gi < low->n; gi++) {
    const evt_lowered *L = &low->k[gi];
    if (prob_of) prob_of[gi] = -1;
    if (L->kind != EVT_LK_GEMM_EVT || !L->ok || L->spec.batched || (want && !want[gi])) continue;
    if (evt_dtype_is_fp8(L->spec.ab_dtype)) continue; /* measured with 16-bit data against cuBLAS: fp8 runs untuned */
    evt_kspec s = L->spec;
    /* the untuned kernel first (a record applied to L may have changed L->spec.cfg): candidate 0, the one the
     * runtime compiles anyway, and the record's default_ms is its time at CUTLASS's default scheduler */
    s.cfg = evt_lower_untuned_config(&s, L->m, L->n, L->k);
    uint64_t h = evt_kspec_epilogue_hash(&s);
    int j = 0;
    while (j < np && !(evt_kspec_epilogue_hash(&p[j].spec) == h && p[j].m == L->m && p[j].n == L->n && p[j].k == L->k)) j++;
    if (j == np) {
      p[np].spec = s;
      p[np].m = L->m, p[np].n = L->n, p[np].k = L->k;
      np++;
    }
    if (prob_of) prob_of[gi] = j;
  }
  *out = p;
  return np;
}
