/* Mainloop autotuning: the measurement on the GPU (contract in tune.h, evt_tune_run / evt_tune_run_many).
 *
 * libevt never links CUDA: every CUDA call goes through the timing helper kernels/evt_tune_bench.cu, which
 * is JIT-compiled in the same batch as the candidate kernels and the unfused row kernels and dlopened here
 * (like the generated launchers). Data: uniform random values in [-1, 1) generated on the host (the sampled
 * CPU check needs the host copies) and uploaded once per problem.
 */
#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/cachedir.h"
#include "util/env.h"
#include "ir/ir.h"
#include "evt_row_launch.h"
#include "runtime/gpu/cuda.h"
#include "runtime/jit/jit.h"
#include "tune/tune.h"

typedef int (*gemm_fn)(const evt_launch_args *);
typedef int (*row_fn)(const evt_row_launch_args *);

/* the helper's entry points */
typedef struct tb_api {
  const char *(*last_error)(void);
  int (*device)(char *, int, int *);
  void *(*alloc)(size_t);
  void (*free_)(void *);
  int (*upload)(void *, const void *, size_t);
  int (*download)(void *, const void *, size_t);
  int (*memset_)(void *, int, size_t);
  int (*sync)(void);
  int (*time_gemm)(gemm_fn, const evt_launch_args *, int, int, double *);
  void *(*lt_create)(int, int, int, int, int, int, const void *);
  void (*lt_free)(void *);
  int (*time_unfused)(void *, const void *, const void *, void *, row_fn, const evt_row_launch_args *, int, int,
                      double *);
} tb_api;

static int tb_load(const char *so, tb_api *t, char *msg, size_t len) {
  char why[700];
  void *h = evt_cache_dlopen(so, why, sizeof why);
  if (!h) {
    snprintf(msg, len, "cannot load the timing helper: %s", why);
    return -1;
  }
#define SYM(f, s)                                                       \
  if (!(*(void **)&t->f = dlsym(h, s))) {                               \
    snprintf(msg, len, "timing helper %s lacks %s", so, s);             \
    return -1;                                                          \
  }
  SYM(last_error, "evt_tb_last_error");
  SYM(device, "evt_tb_device");
  SYM(alloc, "evt_tb_alloc");
  SYM(free_, "evt_tb_free");
  SYM(upload, "evt_tb_upload");
  SYM(download, "evt_tb_download");
  SYM(memset_, "evt_tb_memset");
  SYM(sync, "evt_tb_sync");
  SYM(time_gemm, "evt_tb_time_gemm");
  SYM(lt_create, "evt_tb_lt_create");
  SYM(lt_free, "evt_tb_lt_free");
  SYM(time_unfused, "evt_tb_time_unfused");
#undef SYM
  return 0;
}

/* the faster unfused variant, kept for the final comparison (evt_tune_interleave) */
typedef struct unf_variant {
  void *lt; /* cuBLASLt plan (tb->lt_create) */
  row_fn rf; /* the row kernel, or NULL: cuBLASLt alone */
  evt_row_launch_args ra;
  void *out; /* the GEMM's output: T, or D when cuBLASLt alone is the whole epilogue */
} unf_variant;

typedef struct ab_ctx {
  const tb_api *tb;
  gemm_fn fn;
  const evt_launch_args *a;
  const unf_variant *u;
  const void *A, *B;
  int warm, reps;
} ab_ctx;

/* evt_tune_interleave's timer: 0 = the fused kernel, 1 = the unfused pair */
static int ab_time(void *p, int which, double *ms) {
  ab_ctx *c = p;
  if (which == 0) return c->tb->time_gemm(c->fn, c->a, c->warm, c->reps, ms);
  return c->tb->time_unfused(c->u->lt, c->A, c->B, c->u->out, c->u->rf, &c->u->ra, c->warm, c->reps, ms);
}

static size_t dsize(evt_dtype t) { return t == EVT_F32 ? 4 : 2; }
static int dcode(evt_dtype t) { return t == EVT_F32 ? 2 : t == EVT_F16 ? 1 : 0; }

static int64_t node_elems(const evt_vnode *v, int64_t m, int64_t n) {
  switch (v->op) {
    case EVT_V_ROW_BCAST:
    case EVT_V_ROW_SUM: return n;
    case EVT_V_COL_BCAST:
    case EVT_V_COL_SUM: return m;
    case EVT_V_AUX_LOAD:
    case EVT_V_AUX_STORE: return m * n;
    default: return 0;
  }
}

/* What one problem compiles: candidate kernels (jobs [c0, c0+nc)), unfused row kernels (r[0..1] or -1). */
typedef struct pwork {
  evt_tile_config cfg[EVT_TUNE_MAX_CAND];
  int ncfg;
  int job[EVT_TUNE_MAX_CAND]; /* job index per config */
  evt_rspec rs[2];
  int rs_state[2];            /* 0 none, 1 row kernel, 2 cuBLASLt alone */
  int rjob[2];
  int map[2][EVT_RSPEC_MAX_NODES], tnode[2], dnode[2], bnode[2];
  int have_record;
} pwork;

typedef struct jobs_t {
  evt_jit_job *j;
  char **src;
  char (*name)[48];
  int n, cap;
} jobs_t;

static int add_job(jobs_t *J, const char *name, char *src) {
  for (int i = 0; i < J->n; i++)
    if (!strcmp(J->name[i], name)) {
      free(src);
      return i;
    }
  if (J->n == J->cap) {
    J->cap = J->cap ? 2 * J->cap : 32;
    J->j = realloc(J->j, sizeof *J->j * (size_t)J->cap);
    J->src = realloc(J->src, sizeof *J->src * (size_t)J->cap);
    J->name = realloc(J->name, sizeof *J->name * (size_t)J->cap);
    EVT_ASSERT(J->j && J->src && J->name);
  }
  int i = J->n++;
  snprintf(J->name[i], sizeof J->name[i], "%s", name);
  J->src[i] = src;
  return i;
}

static void *load_fn(const evt_jit_job *j, const char *name) {
  if (!j->ok) return NULL;
  char why[700];
  void *h = evt_cache_dlopen(j->so_path, why, sizeof why);
  return h ? dlsym(h, name) : NULL;
}

/* Measures problem p (its kernels compiled in J) into r. */
static evt_status measure(const tb_api *tb, const char *gpu, const evt_tune_problem *P, pwork *w, jobs_t *J,
                          const evt_tune_options *opt, evt_tune_record *r, char *msg, size_t msglen) {
  const evt_kspec *s = &P->spec;
  /* The random data and the sampled check below handle float tensors only: a kernel with a bool / integer
   * tensor is not tuned (no record: it keeps the default config) rather than timed on garbage. */
  for (int v = 0; v < s->nnodes; v++)
    if (evt_vop_has_memory(s->nodes[v].op) && s->nodes[v].dtype != EVT_F32 && s->nodes[v].dtype != EVT_BF16 &&
        s->nodes[v].dtype != EVT_F16) {
      snprintf(msg, msglen, "not tuned: visitor node %s holds a %s tensor (the tuner generates float data only)",
               s->nodes[v].name, evt_dtype_name(s->nodes[v].dtype));
      return EVT_ERR_UNSUPPORTED;
    }
  int64_t M = P->m, N = P->n, K = P->k;
  double t_start = evt_now_s(), t_data = 0, t_check = 0; /* (for the summary line: where a problem's seconds go) */
  int reps = opt->reps > 0 ? opt->reps : 30, warm = opt->warmup > 0 ? opt->warmup : 5;
  if (reps < 20) reps = 20;
  memset(r, 0, sizeof *r);
  r->spec_hash = evt_kspec_epilogue_hash(s);
  r->m = M, r->n = N, r->k = K;
  snprintf(r->gpu, sizeof r->gpu, "%.63s", gpu);
  r->unfused_ms = r->default_ms = r->fused_ms = r->check_err = -1;
  int at = s->layout == EVT_LAYOUT_TN, bt = s->layout == EVT_LAYOUT_NT;
  (void)at, (void)bt;
  uint64_t seed = (uint64_t)(M * 1000003 + N * 1009 + K) ^ r->spec_hash;
  void *ha = evt_tune_random_data(s->ab_dtype, M * K, seed), *hb = evt_tune_random_data(s->ab_dtype, K * N, seed + 1);
  void *hmem[EVT_KSPEC_MAX_NODES] = {0}, *dmem[EVT_KSPEC_MAX_NODES] = {0};
  void *A = tb->alloc((size_t)(M * K) * dsize(s->ab_dtype)), *B = tb->alloc((size_t)(K * N) * dsize(s->ab_dtype));
  void *D = tb->alloc((size_t)(M * N) * dsize(s->d_dtype)), *T = tb->alloc((size_t)(M * N) * 4);
  evt_status st = EVT_OK;
  if (!A || !B || !D || !T) {
    snprintf(msg, msglen, "out of device memory for %lldx%lldx%lld", (long long)M, (long long)N, (long long)K);
    st = EVT_ERR_UNSUPPORTED;
    goto done;
  }
  tb->upload(A, ha, (size_t)(M * K) * dsize(s->ab_dtype));
  tb->upload(B, hb, (size_t)(K * N) * dsize(s->ab_dtype));
  for (int v = 0; v < s->nnodes; v++) {
    int64_t e = node_elems(&s->nodes[v], M, N);
    if (!e) continue;
    size_t bytes = (size_t)e * dsize(s->nodes[v].dtype);
    dmem[v] = tb->alloc(bytes);
    if (!dmem[v]) {
      snprintf(msg, msglen, "out of device memory");
      st = EVT_ERR_UNSUPPORTED;
      goto done;
    }
    if (evt_vop_class(s->nodes[v].op) == 'L') {
      hmem[v] = evt_tune_random_data(s->nodes[v].dtype, e, seed + 10 + (uint64_t)v);
      tb->upload(dmem[v], hmem[v], bytes);
    }
  }
  t_data = evt_now_s() - t_start;
  /* fused candidates: each config with each scheduler variant; keep each config's best */
  int sv[16][2];
  int nsv = evt_tune_sched_variants(M, N, sv, 16);
  evt_launch_args a;
  memset(&a, 0, sizeof a);
  a.m = (int)M, a.n = (int)N, a.k = (int)K, a.a = A, a.b = B, a.d = D;
  for (int v = 0; v < s->nnodes; v++) a.ptrs[v] = dmem[v];
  evt_kspec_launch_rng(s, &a);
  char lab[96];
  for (int c = 0; c < w->ncfg && r->ncand < EVT_TUNE_MAX_CAND; c++) {
    evt_tune_cand *cd = &r->cand[r->ncand++];
    memset(cd, 0, sizeof *cd);
    cd->cfg = w->cfg[c];
    cd->ms = -1;
    evt_kspec ks = *s;
    ks.cfg = w->cfg[c];
    char kname[40];
    evt_kspec_kernel_name(&ks, kname);
    gemm_fn fn = w->job[c] >= 0 ? (gemm_fn)load_fn(&J->j[w->job[c]], kname) : NULL;
    if (!fn) {
      snprintf(cd->note, sizeof cd->note, "%s",
               w->job[c] < 0 ? "no source (emission refused)" : J->j[w->job[c]].ok ? "cannot load" : "compile failed");
      continue;
    }
    for (int vi = 0; vi < nsv; vi++) {
      a.swizzle = sv[vi][0], a.raster = sv[vi][1];
      double ms = -1;
      int rc = tb->time_gemm(fn, &a, warm, reps, &ms);
      if (rc) {
        snprintf(cd->note, sizeof cd->note, rc > 0 ? "launcher returned %d" : "CUDA error %d", rc);
        if (rc < 0) snprintf(cd->note, sizeof cd->note, "CUDA error: %.80s", tb->last_error());
        break;
      }
      if (c == 0 && vi == 0) r->default_ms = ms;
      if (cd->ms < 0 || ms < cd->ms) cd->ms = ms, cd->swizzle = sv[vi][0], cd->raster = sv[vi][1];
    }
    if (!opt->quiet) {
      evt_tile_config_label(&cd->cfg, lab, sizeof lab);
      char untuned[80] = ""; /* candidate 0 is the untuned config (evt_tune_collect): also its time as it runs */
      if (c == 0 && r->default_ms >= 0)
        snprintf(untuned, sizeof untuned, "; untuned, at CUTLASS's default scheduler %.4f ms", r->default_ms);
      if (cd->ms >= 0)
        fprintf(stderr, "[evt-tune] %lldx%lldx%lld %-34s %.4f ms (swizzle %d raster %d)%s%s%s\n", (long long)M,
                (long long)N, (long long)K, lab, cd->ms, cd->swizzle, cd->raster, untuned, cd->note[0] ? "; " : "",
                cd->note);
      else
        fprintf(stderr, "[evt-tune] %lldx%lldx%lld %-34s %s\n", (long long)M, (long long)N, (long long)K, lab, cd->note);
    }
  }
  /* unfused: cuBLASLt (+ bias) + the row kernel; the faster variant (kept in unf for the final comparison) */
  unf_variant unf = {0};
  for (int ab = 0; ab < 2; ab++) {
    if (!w->rs_state[ab]) continue;
    const void *bias = ab ? (w->bnode[ab] >= 0 ? dmem[w->bnode[ab]] : NULL) : NULL;
    if (ab && !bias) continue;
    int alone = w->rs_state[ab] == 2;
    void *lt = tb->lt_create((int)M, (int)N, (int)K, (int)s->layout, dcode(s->ab_dtype),
                             dcode(alone ? s->d_dtype : s->ab_dtype), bias);
    if (!lt) {
      if (!opt->quiet) fprintf(stderr, "[evt-tune] cuBLASLt: %s\n", tb->last_error());
      continue;
    }
    row_fn rf = NULL;
    evt_row_launch_args ra;
    memset(&ra, 0, sizeof ra);
    if (!alone) {
      char rname[40];
      evt_rspec_kernel_name(&w->rs[ab], rname);
      rf = (row_fn)load_fn(&J->j[w->rjob[ab]], rname);
      if (!rf) {
        tb->lt_free(lt);
        continue;
      }
      ra.m = (int)M, ra.n = (int)N;
      for (int i = 0; i < w->rs[ab].nnodes; i++)
        ra.ptrs[i] = i == w->tnode[ab] ? T : i == w->dnode[ab] ? D : w->map[ab][i] >= 0 ? dmem[w->map[ab][i]] : NULL;
      evt_rspec_launch_rng(&w->rs[ab], &ra);
    }
    double ms = -1;
    int rc = tb->time_unfused(lt, A, B, alone ? D : T, rf, &ra, warm, reps, &ms);
    if (!opt->quiet)
      fprintf(stderr, "[evt-tune] %lldx%lldx%lld unfused %s%s: %.4f ms%s%.200s%s\n", (long long)M, (long long)N,
              (long long)K, ab ? "cublasLt(bias)" : "cublasLt", alone ? "" : " + row kernel", rc ? -1.0 : ms,
              rc ? " (failed: " : "", rc ? tb->last_error() : "", rc ? ")" : "");
    if (!rc && (r->unfused_ms < 0 || ms < r->unfused_ms)) {
      r->unfused_ms = ms;
      snprintf(r->unfused_how, sizeof r->unfused_how, "%s%s", ab ? "cublasLt(bias)" : "cublasLt", alone ? "" : " + row kernel");
      if (unf.lt) tb->lt_free(unf.lt);
      unf.lt = lt, unf.rf = rf, unf.ra = ra, unf.out = alone ? D : T;
    } else {
      tb->lt_free(lt);
    }
  }
  /* choose: the fastest fused candidate that passes the sampled check */
  gemm_fn best_fn = NULL;
  for (;;) {
    int best = -1;
    for (int c = 0; c < r->ncand; c++)
      if (r->cand[c].ms >= 0 && !r->cand[c].note[0] && (best < 0 || r->cand[c].ms < r->cand[best].ms)) best = c;
    if (best < 0) break;
    evt_tune_cand *cd = &r->cand[best];
    evt_kspec ks = *s;
    ks.cfg = cd->cfg;
    char kname[40];
    evt_kspec_kernel_name(&ks, kname);
    int c = 0;
    while (memcmp(&w->cfg[c], &cd->cfg, sizeof cd->cfg)) c++;
    gemm_fn fn = (gemm_fn)load_fn(&J->j[w->job[c]], kname);
    best_fn = fn;
    a.swizzle = cd->swizzle, a.raster = cd->raster;
    tb->memset_(D, 0xFF, (size_t)(M * N) * dsize(s->d_dtype));
    double err = INFINITY;
    if (fn && fn(&a) == 0 && tb->sync() == 0) {
      void *hd = malloc((size_t)(M * N) * dsize(s->d_dtype));
      void *out[EVT_KSPEC_MAX_NODES] = {0};
      const void *mem[EVT_KSPEC_MAX_NODES] = {0};
      EVT_ASSERT(hd);
      tb->download(hd, D, (size_t)(M * N) * dsize(s->d_dtype));
      for (int v = 0; v < s->nnodes; v++) {
        int64_t e = node_elems(&s->nodes[v], M, N);
        if (!e) continue;
        if (hmem[v]) mem[v] = hmem[v];
        else {
          out[v] = malloc((size_t)e * dsize(s->nodes[v].dtype));
          EVT_ASSERT(out[v]);
          tb->download(out[v], dmem[v], (size_t)e * dsize(s->nodes[v].dtype));
          mem[v] = out[v];
        }
      }
      int64_t rows[6], cols[6];
      for (int i = 0; i < 6; i++) rows[i] = (M - 1) * i / 5, cols[i] = (N - 1) * (5 - i) / 5;
      double t0 = evt_now_s();
      err = evt_tune_check_sampled(s, M, N, K, ha, hb, mem, hd, rows, 6, cols, 6);
      t_check += evt_now_s() - t0;
      free(hd);
      for (int v = 0; v < s->nnodes; v++) free(out[v]);
    }
    double tol = 2e-2; /* 16-bit and TF32 operands (f32 ones are TF32's: 10 mantissa bits, as f16) */
    if (err <= tol) {
      r->choice = EVT_TUNE_FUSED;
      r->cfg = cd->cfg;
      r->swizzle = cd->swizzle, r->raster = cd->raster;
      r->fused_ms = cd->ms;
      r->check_err = err;
      break;
    }
    snprintf(cd->note, sizeof cd->note, "check vs CPU reference failed (%.2e)", err);
  }
  /* the final comparison in alternating rounds (evt_tune_interleave: times taken far apart in the sweep above
   * are not comparable, the clocks follow the GPU's temperature and power) */
  const int rounds = 4;
  if (r->choice == EVT_TUNE_FUSED && unf.lt && best_fn) {
    ab_ctx ctx = {tb, best_fn, &a, &unf, A, B, warm, reps};
    a.swizzle = r->swizzle, a.raster = r->raster;
    double ms[2];
    if (evt_tune_interleave(rounds, ab_time, &ctx, ms) == 0) {
      if (!opt->quiet)
        fprintf(stderr, "[evt-tune] %lldx%lldx%lld fused vs unfused side by side (EVT_TUNE_AB_ROUNDS %d): %.4f vs %.4f "
                "ms (sweep: %.4f vs %.4f)\n", (long long)M, (long long)N, (long long)K, rounds, ms[0], ms[1],
                r->fused_ms, r->unfused_ms);
      r->fused_ms = ms[0], r->unfused_ms = ms[1];
    }
  }
  if (unf.lt) tb->lt_free(unf.lt);
  if (r->choice == EVT_TUNE_FUSED && r->unfused_ms >= 0 && r->unfused_ms < r->fused_ms) r->choice = EVT_TUNE_UNFUSED;
  if (!opt->quiet && r->check_err >= 0)
    fprintf(stderr, "[evt-tune] %lldx%lldx%lld best fused %s passed the sampled CPU check (%.1e)\n", (long long)M,
            (long long)N, (long long)K, evt_tile_config_label(&r->cfg, lab, sizeof lab), r->check_err);
  if (!opt->quiet)
    fprintf(stderr, "[evt-tune] %lldx%lldx%lld took %.1f s (random data %.1f s, sampled CPU check %.1f s)\n",
            (long long)M, (long long)N, (long long)K, evt_now_s() - t_start, t_data, t_check);
  if (r->choice == EVT_TUNE_NONE) {
    if (r->unfused_ms >= 0) {
      r->choice = EVT_TUNE_UNFUSED; /* no fused candidate ran and passed its check */
      r->cfg = EVT_TILE_CONFIG_DEFAULT;
    } else {
      snprintf(msg, msglen, "%lldx%lldx%lld: nothing could be measured", (long long)M, (long long)N, (long long)K);
      st = EVT_ERR_UNSUPPORTED;
    }
  }
done:
  tb->free_(A), tb->free_(B), tb->free_(D), tb->free_(T);
  for (int v = 0; v < s->nnodes; v++) {
    tb->free_(dmem[v]);
    free(hmem[v]);
  }
  free(ha);
  free(hb);
  return st;
}

evt_status evt_tune_run_many(const evt_tune_problem *P, int np, const evt_tune_options *opt_in, evt_tune_record *out,
                             evt_status *sts, char *msg, size_t msglen) {
  evt_tune_options dflt = {0};
  const evt_tune_options *opt = opt_in ? opt_in : &dflt;
  evt_status first = EVT_OK;
  char tmp[1024];
  if (msg && msglen) msg[0] = 0;
  pwork *W = calloc((size_t)np + 1, sizeof *W);
  EVT_ASSERT(W);
  jobs_t J = {0};
  /* no GPU: say so before minutes of nvcc */
  if (!opt->compile_only && access("/dev/nvidiactl", F_OK) != 0) {
    snprintf(msg, msglen, "no CUDA device (no /dev/nvidiactl): nothing measured, every GEMM keeps the default config");
    for (int i = 0; i < np; i++)
      if (sts) sts[i] = EVT_ERR_UNSUPPORTED;
    free(W);
    return EVT_ERR_UNSUPPORTED;
  }
  /* the timing helper first */
  const char *kdir = evt_kernels_dir();
  char hpath[1100];
  snprintf(hpath, sizeof hpath, "%s/evt_tune_bench.cu", kdir);
  size_t hlen;
  char *hsrc = evt_read_file(hpath, &hlen);
  if (!hsrc) {
    snprintf(msg, msglen, "cannot read the timing helper %s (set EVT_KERNELS_DIR)", hpath);
    free(W);
    return EVT_ERR_UNSUPPORTED;
  }
  add_job(&J, "evt_tune_bench", hsrc);
  int todo = 0;
  for (int i = 0; i < np; i++) {
    evt_status *sp = sts ? &sts[i] : NULL;
    if (sp) *sp = EVT_OK;
    const evt_kspec *s = &P[i].spec;
    if (s->batched) { /* the timing runs one GEMM: batched kernels are not tuned */
      if (sp) *sp = EVT_ERR_UNSUPPORTED;
      W[i].have_record = 1;
      memset(&out[i], 0, sizeof out[i]);
      continue;
    }
    /* a record serves unless it tried fewer configs than this run would (the default run measures one
     * config, a later {"tune": N} measures N: its record replaces the smaller one) */
    if (!opt->force &&
        evt_tune_record_reusable(opt->cache_dir, s, P[i].m, P[i].n, P[i].k, opt->max_configs, &out[i]) == EVT_OK) {
      W[i].have_record = 1;
      continue;
    }
    memset(&out[i], 0, sizeof out[i]);
    todo++;
    pwork *w = &W[i];
    int maxc = opt->max_configs > 0 && opt->max_configs < EVT_TUNE_MAX_CAND ? opt->max_configs : EVT_TUNE_MAX_CAND;
    evt_tile_config cf[EVT_TUNE_MAX_CAND];
    int n = evt_tune_candidates(s, P[i].m, P[i].n, P[i].k, cf, maxc);
    for (int c = 0; c < n; c++) {
      evt_kspec ks = *s;
      ks.cfg = cf[c];
      char name[40];
      evt_kspec_kernel_name(&ks, name);
      char *src = evt_emit_cutlass(&ks, tmp, sizeof tmp);
      w->cfg[w->ncfg] = cf[c]; /* (a config that cannot be emitted is recorded as tried: job -1) */
      w->job[w->ncfg++] = src ? add_job(&J, name, src) : -1;
    }
    for (int ab = 0; ab < 2; ab++) {
      evt_status rs = evt_tune_unfused_rspec(s, s->ab_dtype, ab, &w->rs[ab], w->map[ab], &w->tnode[ab], &w->dnode[ab],
                                             &w->bnode[ab], tmp, sizeof tmp);
      if (rs == EVT_OK) {
        char name[40];
        w->rs[ab].arch = s->arch; /* the unfused pair's row kernel for the same target */
        evt_rspec_kernel_name(&w->rs[ab], name);
        char *src = evt_emit_rows(&w->rs[ab], tmp, sizeof tmp);
        if (!src) continue;
        w->rs_state[ab] = 1;
        w->rjob[ab] = add_job(&J, name, src);
      } else if (w->dnode[ab] < 0 && strstr(tmp, "no row kernel")) {
        w->rs_state[ab] = 2;
      }
    }
  }
  evt_status st = EVT_OK;
  if (todo) {
    for (int i = 0; i < J.n; i++) {
      memset(&J.j[i], 0, sizeof J.j[i]);
      J.j[i].name = J.name[i];
      J.j[i].source = J.src[i];
    }
    evt_jit_options jo = {0};
    jo.jobs = opt->jobs;
    jo.quiet = opt->quiet;
    /* the problems' target (one per run: the plans' evt_compile_target); PTX where the GPU present is another */
    jo.arch = np > 0 ? P[0].spec.arch : 0;
    int cc = opt->compile_only ? 0 : evt_gpu_device_arch();
    jo.ptx = cc && cc != (jo.arch ? jo.arch : 90);
    st = evt_jit_compile(J.j, J.n, &jo, tmp, sizeof tmp);
    if (opt->compile_only) {
      first = st;
      if (st != EVT_OK) snprintf(msg, msglen, "%s", tmp);
      for (int i = 0; i < np && sts; i++)
        if (!W[i].have_record) sts[i] = EVT_ERR_UNSUPPORTED; /* compiled, not measured */
    } else if (st == EVT_ERR_UNSUPPORTED || st == EVT_ERR_IO) {
      snprintf(msg, msglen, "%s", tmp);
      first = st;
    } else if (!J.j[0].ok) {
      snprintf(msg, msglen, "the timing helper failed to compile: %s", J.j[0].error);
      first = EVT_ERR_UNSUPPORTED;
    }
    tb_api tb;
    memset(&tb, 0, sizeof tb);
    char gpu[128] = "";
    int sms = 0;
    int go = !opt->compile_only;
    if (go && first == EVT_OK && tb_load(J.j[0].so_path, &tb, msg, msglen) != 0) first = EVT_ERR_UNSUPPORTED;
    if (go && first == EVT_OK && tb.device(gpu, sizeof gpu, &sms) != 0) {
      snprintf(msg, msglen, "no CUDA device: %s", tb.last_error());
      first = EVT_ERR_UNSUPPORTED;
    }
    for (int i = 0; i < np && go && first == EVT_OK; i++) {
      if (W[i].have_record) continue;
      char m2[512] = "";
      evt_status s2 = measure(&tb, gpu, &P[i], &W[i], &J, opt, &out[i], m2, sizeof m2);
      if (s2 == EVT_OK) {
        out[i].source_hash = evt_tune_sources_hash(&P[i].spec, &out[i]);
        s2 = evt_tune_record_write(opt->cache_dir, &out[i], m2, sizeof m2);
      }
      if (sts) sts[i] = s2;
      if (s2 != EVT_OK && first == EVT_OK) {
        first = s2;
        snprintf(msg, msglen, "%s", m2);
      }
    }
    if (go && first != EVT_OK && sts)
      for (int i = 0; i < np; i++)
        if (!W[i].have_record && sts[i] == EVT_OK) sts[i] = first;
  }
  for (int i = 0; i < J.n; i++) free(J.src[i]);
  free(J.j);
  free(J.src);
  free(J.name);
  free(W);
  return first;
}

evt_status evt_tune_run(const evt_kspec *s, int64_t m, int64_t n, int64_t k, const evt_tune_options *opt,
                        evt_tune_record *out, char *msg, size_t msglen) {
  evt_tune_problem p;
  p.spec = *s;
  p.m = m, p.n = n, p.k = k;
  return evt_tune_run_many(&p, 1, opt, out, NULL, msg, msglen);
}
