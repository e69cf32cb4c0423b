/* EVT_PROFILE: where a program's step spends its GPU time (opt-in diagnostics of the GPU runtime).
 *
 * EVT_PROFILE=N (N >= 1): every eager run of every program records a CUDA event before each of its steps
 * and one after the last; after every N-th profiled run of a program a table of its steps, slowest first,
 * goes to stderr: milliseconds per run (mean over the runs so far), share of the step, and what the step
 * is (a generated GEMM+EVT kernel with M x N x K and its config, a row / pointwise kernel with M x N, a
 * group that runs node by node with the reason, or one node through the reference library).
 * Profiling waits for the events, so it serializes the host with the GPU: use it to find slow steps, not
 * to time a step. CUDA-graph replays are not profiled (their first, eager run is).
 * EVT_PROFILE=host:N: the same table of each step's host time (evt_hprof_*).
 * Everything here is host code over the kernel library's event functions (src/runtime/gpu/cuda.h). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/gpu/cuda.h"
#include "util/env.h"

struct evt_prof {
  int every;     /* print after every `every`-th profiled run */
  int nsteps;    /* steps the arrays were made for (a re-plan changes them: the counts restart) */
  void **ev;     /* nsteps + 1 events */
  double *ms;    /* per step: milliseconds summed over the runs */
  long runs;
};

/* EVT_PROFILE's period for the GPU table (host 0) or the host table (host 1): "N" is the GPU's, "host:N" the
 * host's; 0 when off. */
static int prof_every(bool host) {
  const char *e = evt_env(EVT_ENV_PROFILE);
  if (!e) return 0;
  bool is_host = !strncmp(e, "host:", 5);
  int n = atoi(is_host ? e + 5 : e);
  return is_host == host && n > 0 ? n : 0;
}

static void prof_release(const evt_fb_api *api, struct evt_prof *f) {
  if (!f) return;
  for (int i = 0; f->ev && i <= f->nsteps; i++) api->event_free(f->ev[i]);
  free(f->ev);
  free(f->ms);
  f->ev = NULL;
  f->ms = NULL;
  f->nsteps = 0;
  f->runs = 0;
}

void evt_prof_free(evt_program *p) {
  if (!p->prof) return;
  if (p->api) prof_release(p->api, p->prof);
  free(p->prof);
  p->prof = NULL;
}

bool evt_prof_begin(evt_program *p, void *stream) {
  if (!p->api || (p->capture_stream && stream == p->capture_stream)) return false;
  if (!p->prof) {
    int every = prof_every(false);
    if (!every) return false;
    p->prof = calloc(1, sizeof *p->prof);
    EVT_ASSERT(p->prof);
    p->prof->every = every;
  }
  struct evt_prof *f = p->prof;
  if (f->nsteps != p->nsteps || !f->ev) {
    prof_release(p->api, f);
    f->ev = calloc((size_t)p->nsteps + 1, sizeof *f->ev);
    f->ms = calloc((size_t)p->nsteps + 1, sizeof *f->ms);
    EVT_ASSERT(f->ev && f->ms);
    f->nsteps = p->nsteps;
    char err[256];
    for (int i = 0; i <= p->nsteps; i++)
      if (p->api->event_new(&f->ev[i], err, sizeof err)) {
        fprintf(stderr, "[evt-profile] no CUDA event (%s): profiling off\n", err);
        prof_release(p->api, f);
        f->every = 0;
        return false;
      }
  }
  return f->every > 0;
}

void evt_prof_mark(evt_program *p, int step, void *stream) {
  char err[256];
  if (p->prof && p->prof->ev && step <= p->prof->nsteps) p->api->event_record(p->prof->ev[step], stream, err, sizeof err);
}

void evt_prof_step_label(const evt_program *p, int s, char *buf, size_t len) {
  const evt_prog_step *sp = &p->steps[s];
  const evt_graph *g = p->g;
  if (sp->node >= 0) {
    const evt_node *n = &g->nodes[sp->node];
    snprintf(buf, len, "node %%%s (%s): reference library", n->name, evt_op_table[n->op].name);
    return;
  }
  const evt_group_exec *x = &p->xp->groups[sp->group];
  const evt_node *first = &g->nodes[x->members[0]];
  if (!x->fused) {
    snprintf(buf, len, "group %d: %d nodes node by node from %%%s (%s)", sp->group, x->nmembers, first->name, x->why);
    return;
  }
  if (x->kind == EVT_LK_GEMM_EVT && x->unf) {
    snprintf(buf, len, "group %d: unfused: cuBLAS%s %lldx%lldx%lld + row kernel %s", sp->group,
             x->unf_bias >= 0 ? "Lt(bias)" : "", (long long)x->m, (long long)x->n, (long long)x->k,
             p->xp->kname[x->kernel]);
    return;
  }
  if (x->kind == EVT_LK_GEMM_EVT && x->blas) {
    const evt_kspec *ks = &p->xp->low.k[sp->group].spec;
    snprintf(buf, len, "group %d: cuBLAS%s %lldx%lldx%lld %s %s->%s (%s)", sp->group, x->unf_bias >= 0 ? "Lt" : "",
             (long long)x->m,
             (long long)x->n, (long long)x->k,
             ks->layout == EVT_LAYOUT_NN ? "NN" : ks->layout == EVT_LAYOUT_NT ? "NT" : "TN", evt_dtype_name(ks->ab_dtype),
             evt_dtype_name(ks->d_dtype), x->unf_bias >= 0 ? "with the bias, tuned unfused" : "plain epilogue");
    return;
  }
  if (x->kind == EVT_LK_CONV_EVT) {
    char geo[160] = "";
    evt_conv_text(&p->xp->low.k[sp->group].spec.conv, geo, sizeof geo);
    char *nl = strchr(geo, '\n');
    if (nl) *nl = 0;
    snprintf(buf, len, "group %d: conv+evt %s %lldx%lldx%lld %s from %%%s", sp->group, p->xp->kname[x->kernel],
             (long long)x->m, (long long)x->n, (long long)x->k, geo, first->name);
    return;
  }
  if (x->kind == EVT_LK_GEMM_EVT) {
    char spec[160] = "";
    const evt_kspec *ks = p->xp->gspec[x->kernel];
    if (ks) evt_kspec_text(ks, spec, sizeof spec);
    char *nl = strchr(spec, '\n');
    if (nl) *nl = 0;
    snprintf(buf, len, "group %d: %s %lldx%lldx%lld %s (%d epilogue nodes; %s)", sp->group, p->xp->kname[x->kernel],
             (long long)x->m, (long long)x->n, (long long)x->k, spec, ks ? ks->nnodes : 0, x->tune_desc);
    return;
  }
  snprintf(buf, len, "group %d: %s %s %lldx%lld from %%%s (%s)", sp->group, x->kind == EVT_LK_ROW ? "row" : "pointwise",
           p->xp->kname[x->kernel], (long long)x->m, (long long)x->n, first->name, evt_op_table[first->op].name);
}

void evt_prof_end(evt_program *p, void *stream) {
  struct evt_prof *f = p->prof;
  if (!f || !f->ev || f->nsteps != p->nsteps) return;
  evt_prof_mark(p, p->nsteps, stream);
  char err[256];
  for (int s = 0; s < p->nsteps; s++) {
    double ms = 0;
    if (p->api->event_ms(f->ev[s], f->ev[s + 1], &ms, err, sizeof err)) {
      fprintf(stderr, "[evt-profile] %s: profiling off\n", err);
      f->every = 0;
      return;
    }
    f->ms[s] += ms;
  }
  f->runs++;
  if (f->runs % f->every) return;
  int *order = malloc(sizeof *order * (size_t)(p->nsteps + 1));
  EVT_ASSERT(order);
  double total = 0;
  for (int s = 0; s < p->nsteps; s++) {
    order[s] = s;
    total += f->ms[s];
  }
  for (int i = 1; i < p->nsteps; i++) /* slowest first (insertion sort: a step list is short) */
    for (int j = i; j > 0 && f->ms[order[j]] > f->ms[order[j - 1]]; j--) {
      int t = order[j];
      order[j] = order[j - 1];
      order[j - 1] = t;
    }
  fprintf(stderr, "[evt-profile] program of %d nodes: %d steps, %.3f ms per run (mean of %ld runs; events around each step)\n",
          p->g->nnodes, p->nsteps, total / (double)f->runs, f->runs);
  char label[640];
  for (int i = 0; i < p->nsteps; i++) {
    int s = order[i];
    double ms = f->ms[s] / (double)f->runs;
    if (i >= 40 && ms < 0.01) break;
    evt_prof_step_label(p, s, label, sizeof label);
    fprintf(stderr, "[evt-profile] %9.3f ms %5.1f%%  step %3d  %s\n", ms, total > 0 ? 100.0 * f->ms[s] / total : 0.0,
            s, label);
  }
  free(order);
}

/* ---- EVT_PROFILE=host:N: host time per step (no events, no synchronization) -------------------------- */

struct evt_hprof {
  int every, nsteps;
  double *us;   /* per step: microseconds summed over the runs */
  double total; /* whole enqueues, summed */
  long runs;
};

double evt_now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

void evt_hprof_free(evt_program *p) {
  if (!p->hprof) return;
  free(p->hprof->us);
  free(p->hprof);
  p->hprof = NULL;
}

bool evt_hprof_begin(evt_program *p, void *stream) {
  if (p->capture_stream && stream == p->capture_stream) return false;
  if (!p->hprof) {
    int every = prof_every(true);
    if (every <= 0) return false;
    p->hprof = calloc(1, sizeof *p->hprof);
    EVT_ASSERT(p->hprof);
    p->hprof->every = every;
  }
  struct evt_hprof *h = p->hprof;
  if (h->nsteps != p->nsteps || !h->us) { /* (first run, or a re-plan changed the steps: counts restart) */
    free(h->us);
    h->us = calloc((size_t)p->nsteps + 1, sizeof *h->us);
    EVT_ASSERT(h->us);
    h->nsteps = p->nsteps;
    h->total = 0;
    h->runs = 0;
  }
  return true;
}

void evt_hprof_step(evt_program *p, int step, double us) {
  if (p->hprof && p->hprof->us && step >= 0 && step < p->hprof->nsteps) p->hprof->us[step] += us;
}

size_t evt_hprof_format(const evt_program *p, char *buf, size_t len) {
  const struct evt_hprof *h = p->hprof;
  if (!h || !h->us || h->runs <= 0 || h->nsteps != p->nsteps || len == 0) return 0;
  size_t n = 0;
  buf[0] = 0;
#define HPUT(...)                                                                        \
  do {                                                                                   \
    if (n < len) {                                                                       \
      int w_ = snprintf(buf + n, len - n, __VA_ARGS__);                                  \
      n += w_ > 0 ? (size_t)w_ : 0;                                                      \
      if (n >= len) n = len - 1;                                                         \
    }                                                                                    \
  } while (0)
  double steps = 0;
  for (int s = 0; s < h->nsteps; s++) steps += h->us[s];
  HPUT("[evt-host] program of %d nodes: %d steps, %.1f us of host time per run (%.1f in the steps; mean of %ld "
       "runs; enqueue only, bindings not included)\n",
       p->g->nnodes, h->nsteps, h->total / (double)h->runs, steps / (double)h->runs, h->runs);
  int *order = malloc(sizeof(int) * (size_t)(h->nsteps ? h->nsteps : 1));
  EVT_ASSERT(order);
  for (int s = 0; s < h->nsteps; s++) order[s] = s;
  for (int i = 1; i < h->nsteps; i++) /* slowest first, ties by step index (stable insertion sort) */
    for (int j = i; j > 0 && h->us[order[j]] > h->us[order[j - 1]]; j--) {
      int t = order[j];
      order[j] = order[j - 1];
      order[j - 1] = t;
    }
  for (int i = 0; i < h->nsteps && i < 16; i++) {
    int s = order[i];
    char label[640];
    evt_prof_step_label(p, s, label, sizeof label);
    HPUT("[evt-host] %9.1f us %5.1f%%  step %3d  %s\n", h->us[s] / (double)h->runs,
         steps > 0 ? 100.0 * h->us[s] / steps : 0.0, s, label);
  }
#undef HPUT
  free(order);
  return n;
}

void evt_hprof_end(evt_program *p, double total_us) {
  struct evt_hprof *h = p->hprof;
  if (!h || !h->us || h->nsteps != p->nsteps) return;
  h->total += total_us;
  h->runs++;
  if (h->runs % h->every) return;
  char buf[16384];
  if (evt_hprof_format(p, buf, sizeof buf)) fputs(buf, stderr);
}
