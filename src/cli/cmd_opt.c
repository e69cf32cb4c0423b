/* `evtc opt FILE`: runs the graph passes (src/passes/pipeline.c) on a .evt file and prints the result.
 * A graph with a loss but no further outputs is first turned into the joint graph (evt_graph_build_joint).
 * --verify runs the CPU interpreter on fresh random inputs before and after every pass, twice: in fp64 (the
 * math a pass preserves) and with every node rounded to its dtype (what the step computes), and prints the
 * largest relative difference of each over all outputs (loss and gradients; see max_rel_diff); with it, the
 * verifier also runs after every pass. Exit codes: 0 ok, 1 user error (bad file or flags), 2 a pass broke the
 * graph or its values moved (--verify: by more than 1e-5 in fp64, or by more than the rounding tolerance of
 * the graph's narrowest float dtype when rounded, or an output became or stopped being inf / NaN). */
#include "cli.h"
#include "passes/passes.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define VERIFY_TOLERANCE 1e-5
/* Rounded runs: reassociation may move an output by a few roundings of the narrowest float dtype it is
 * computed in (relative to the output's magnitude); f32-only graphs keep the fp64 tolerance. */
#define ROUNDED_ULPS 8.0

static void print_counts(const evt_graph *g, FILE *out) {
  int counts[EVT_CLASS_COUNT] = {0};
  for (int i = 0; i < g->nnodes; i++) counts[evt_op_table[g->nodes[i].op].cls]++;
  fprintf(out, "%d nodes |", g->nnodes);
  const char *sep = " ";
  for (int c = 0; c < EVT_CLASS_COUNT; c++) {
    if (!counts[c]) continue;
    fprintf(out, "%s%s %d", sep, evt_op_class_names[c], counts[c]);
    sep = ", ";
  }
  int permutes = 0; /* data movement the layout pass works on (a permute that is a reshape is folded) */
  for (int i = 0; i < g->nnodes; i++) permutes += g->nodes[i].op == EVT_OP_PERMUTE || g->nodes[i].op == EVT_OP_TRANSPOSE;
  fprintf(out, " | permutes %d\n", permutes);
}

static void free_values(evt_tensor *v, int n) {
  if (!v) return;
  for (int i = 0; i < n; i++) evt_tensor_free(&v[i]);
  free(v);
}

/* What a pre-pass run leaves for the comparison: node names (arena-owned by the graph, so they survive
 * the pass), output ids, and the values. */
typedef struct snapshot {
  const char **names;
  int nnodes;
  int *outputs;
  int noutputs;
  evt_tensor *values;    /* fp64 run */
  evt_tensor *rounded;   /* run with every node rounded to its dtype, same inputs */
} snapshot;

static int find_name(const snapshot *s, const char *name) {
  for (int i = 0; i < s->nnodes; i++)
    if (!strcmp(s->names[i], name)) return i;
  return -1;
}

/* Runs g with run_flags on inputs initialized from `seed` (or, with `src`, copied by name from its inputs);
 * returns the value array (outputs kept; inputs too when src is NULL) or NULL with the message on g. */
static evt_tensor *run_graph(evt_graph *g, uint64_t seed, const snapshot *src, unsigned run_flags, evt_status *st_out) {
  evt_tensor *v = calloc((size_t)g->nnodes + 1, sizeof *v);
  if (!v) evt_fatal(__FILE__, __LINE__, "out of memory");
  evt_status st = evt_interp_init_inputs(g, v, seed);
  if (st == EVT_OK && src) {
    for (int i = 0; i < g->nnodes && st == EVT_OK; i++) {
      if (g->nodes[i].op != EVT_OP_INPUT && g->nodes[i].op != EVT_OP_PARAM) continue;
      int j = find_name(src, g->nodes[i].name);
      if (j < 0 || src->values[j].numel != v[i].numel) {
        st = evt_graph_errorf(g, i, EVT_ERR_INTERNAL, "input lost or reshaped by a pass");
        break;
      }
      memcpy(v[i].data, src->values[j].data, sizeof(double) * (size_t)v[i].numel);
    }
  }
  if (st == EVT_OK) st = evt_interp_run(g, v, run_flags, src == NULL);
  if (st_out) *st_out = st;
  if (st != EVT_OK) {
    free_values(v, g->nnodes);
    return NULL;
  }
  return v;
}

/* Largest relative difference between the outputs av of snapshot a and b of graph gb (output `skip` left
 * out): per output max|a-b| divided by its largest finite magnitude max|a|, floored at `floor` times the
 * largest over all outputs, so an output that is zero in exact arithmetic (the gradient of an attention key
 * bias) compares its rounding noise against the step's scale rather than against itself (fp64 runs: 1e-6;
 * rounded runs: 0.1, as evtc run --check). An element that is inf or NaN on one side only (or inf of the
 * other sign) is an infinite difference. *worst_out gets the output with the largest difference. */
static double max_rel_diff(const snapshot *a, const evt_tensor *av, const evt_graph *gb, const evt_tensor *b, int skip,
                           double floor, int *worst_out) {
  double worst = 0, global = 0;
  *worst_out = -1;
  if (a->noutputs != gb->noutputs) return INFINITY;
  for (int o = 0; o < a->noutputs; o++) {
    const evt_tensor *x = &av[a->outputs[o]];
    for (int64_t i = 0; o != skip && i < x->numel; i++)
      if (isfinite(x->data[i]) && fabs(x->data[i]) > global) global = fabs(x->data[i]);
  }
  for (int o = 0; o < a->noutputs; o++) {
    if (o == skip) continue;
    const evt_tensor *x = &av[a->outputs[o]], *y = &b[gb->outputs[o]];
    if (x->numel != y->numel) return *worst_out = o, INFINITY;
    double diff = 0, scale = floor * global;
    for (int64_t i = 0; i < x->numel; i++) {
      double xv = x->data[i], yv = y->data[i];
      if (!isfinite(xv) || !isfinite(yv)) {
        if (isnan(xv) != isnan(yv) || (!isnan(xv) && xv != yv)) return *worst_out = o, INFINITY;
        continue;
      }
      if (fabs(xv - yv) > diff) diff = fabs(xv - yv);
      if (fabs(xv) > scale) scale = fabs(xv);
    }
    double rel = diff == 0 ? 0 : diff / (scale > 1e-300 ? scale : 1e-300);
    if (rel > worst) worst = rel, *worst_out = o;
  }
  return worst;
}

/* The tolerance of rounded runs: ROUNDED_ULPS units in the last place of g's narrowest float dtype, at least
 * the fp64 tolerance. */
static double unit_roundoff(evt_dtype dt) {
  return dt == EVT_F8E5M2 ? 0x1p-2 : dt == EVT_F8E4M3 ? 0x1p-3 : dt == EVT_BF16 ? 0x1p-7 : dt == EVT_F16 ? 0x1p-10 : 0x1p-23;
}

static double rounded_tolerance(const evt_graph *g) {
  double eps = 0x1p-23; /* f32 */
  for (int i = 0; i < g->nnodes; i++) eps = fmax(eps, unit_roundoff(g->nodes[i].type.dtype));
  return fmax(VERIFY_TOLERANCE, ROUNDED_ULPS * eps);
}

/* The pre-pass runs of --verify (fp64 and rounded, same inputs) and what the comparison needs of g: node
 * names (arena-owned, so they survive the pass), output ids. Else the interpreter's status, message on g. */
static evt_status snapshot_take(evt_graph *g, uint64_t seed, snapshot *s) {
  evt_status st = EVT_OK;
  s->nnodes = g->nnodes;
  s->noutputs = g->noutputs;
  s->values = run_graph(g, seed, NULL, EVT_RUN_FP64, &st);
  s->rounded = s->values ? run_graph(g, seed, NULL, 0, &st) : NULL;
  s->names = malloc(sizeof(char *) * (size_t)(g->nnodes + 1));
  s->outputs = malloc(sizeof(int) * (size_t)(g->noutputs + 1));
  if (!s->names || !s->outputs) evt_fatal(__FILE__, __LINE__, "out of memory");
  for (int k = 0; k < g->nnodes; k++) s->names[k] = g->nodes[k].name;
  if (g->noutputs > 0) memcpy(s->outputs, g->outputs, sizeof(int) * (size_t)g->noutputs);
  return st;
}

static void snapshot_free(snapshot *s) {
  free_values(s->values, s->nnodes);
  free_values(s->rounded, s->nnodes);
  free(s->names);
  free(s->outputs);
}

/* Runs g after pass p on the snapshot's inputs, in fp64 and rounded, and compares; prints the verify line.
 * Returns EVTC_EXIT_OK or EVTC_EXIT_INTERNAL (message on stderr). */
static int verify_after(evt_graph *g, const evt_pass_info *p, uint64_t seed, const snapshot *before, bool dropped,
                        bool loss_zero, double rtol) {
  evt_tensor *after = run_graph(g, seed, before, EVT_RUN_FP64, NULL);
  evt_tensor *after_rd = after ? run_graph(g, seed, before, 0, NULL) : NULL;
  if (!after_rd) {
    fprintf(stderr, "evtc opt: interpreter after %s: %s\n", p->name, evt_graph_error(g));
    free_values(after, g->nnodes);
    return EVTC_EXIT_INTERNAL;
  }
  int w64 = -1, wrd = -1, skip = dropped ? 0 : -1;
  double d = max_rel_diff(before, before->values, g, after, skip, 1e-6, &w64);
  double drd = max_rel_diff(before, before->rounded, g, after_rd, skip, 0.1, &wrd);
  printf("verify: %-13s max rel diff %.3g over %d outputs, %.3g rounded to their dtypes%s%s\n", p->name, d,
         g->noutputs, drd, dropped ? " (loss dropped: not compared)" : "",
         g->loss < 0 ? "" : loss_zero ? ", loss output 0 is the constant 0" : ", loss kept as output 0");
  int rc = EVTC_EXIT_OK;
  if (!(d <= VERIFY_TOLERANCE) || !(drd <= rtol)) {
    bool fp64 = !(d <= VERIFY_TOLERANCE);
    int w = fp64 ? w64 : wrd;
    fprintf(stderr, "evtc opt: pass %s changed output %d (%%%s) by %.3g (> %g)%s\n", p->name, w,
            w >= 0 ? g->nodes[g->outputs[w]].name : "?", fp64 ? d : drd, fp64 ? VERIFY_TOLERANCE : rtol,
            fp64 ? " in fp64" : " with every node rounded to its dtype");
    rc = EVTC_EXIT_INTERNAL;
  }
  free_values(after, g->nnodes);
  free_values(after_rd, g->nnodes);
  return rc;
}

typedef struct options {
  const evt_pass_info *list[64];
  int n;
  const char *dump_after;
  bool stats, verify, no_loss, fp8;
} options;

static int parse_passes(options *o, const char *s) {
  o->n = 0;
  while (*s) {
    const char *e = strchr(s, ',');
    size_t len = e ? (size_t)(e - s) : strlen(s);
    const evt_pass_info *p = evt_pass_find(s, len);
    if (!p || o->n == EVT_ARRAY_LEN(o->list)) {
      fprintf(stderr, "evtc opt: unknown pass '%.*s'; passes:", (int)len, s);
      for (int i = 0; i < evt_npasses; i++) fprintf(stderr, " %s", evt_passes[i].name);
      fputc('\n', stderr);
      return -1;
    }
    o->list[o->n++] = p;
    s += len + (e ? 1 : 0);
  }
  return 0;
}

EVTC_COMMAND(opt, "FILE [--passes=a,b,...] [--dump-after=PASS] [--stats] [--verify] [--no-loss] [--fp8]",
             "run the graph passes and print the optimized graph\n"
             "  --passes=a,b,...   run these passes in this order (default: the whole pipeline:\n"
             "                     canonicalize,[fp8,]loss-elim,decompose,reduce-elim,constprop,cse,layout,dce,\n"
             "                     split-casts)\n"
             "  --fp8              the default pipeline includes the fp8 pass: eligible GEMMs in FP8 with per-tensor\n"
             "                     scaling (docs/passes.md; it changes values, so --verify fails on it)\n"
             "  --dump-after=PASS  print the graph right after PASS instead of the final graph\n"
             "  --stats            print node counts by op class (and of permutes) before and after each pass\n"
             "  --verify           run the verifier after every pass, and the interpreter on fresh random inputs\n"
             "                     before and after it, in fp64 and rounded to every node's dtype: print the\n"
             "                     largest relative difference over all outputs (each output against its own\n"
             "                     magnitude, floored at 1e-6 (fp64) or 0.1 (rounded) of the largest output\n"
             "                     magnitude); exit 2 if a pass moves one by more than 1e-5 in fp64, more than\n"
             "                     8 ulps of the graph's narrowest float dtype rounded, or makes it inf / NaN\n"
             "  --no-loss          loss elimination replaces the loss output by the constant 0") {
  options o = {0};
  bool explicit_list = false;
  const char *file = NULL;
  for (int a = 1; a < argc; a++) {
    if (!strncmp(argv[a], "--passes=", 9)) {
      if (parse_passes(&o, argv[a] + 9)) return EVTC_EXIT_USER;
      explicit_list = true;
    } else if (!strcmp(argv[a], "--fp8")) {
      o.fp8 = true;
    } else if (!strncmp(argv[a], "--dump-after=", 13)) {
      o.dump_after = argv[a] + 13;
    } else if (!strcmp(argv[a], "--stats")) {
      o.stats = true;
    } else if (!strcmp(argv[a], "--verify")) {
      o.verify = true;
    } else if (!strcmp(argv[a], "--no-loss")) {
      o.no_loss = true;
    } else if (argv[a][0] == '-' && argv[a][1]) {
      fprintf(stderr, "evtc opt: unknown flag '%s'\n", argv[a]);
      return EVTC_EXIT_USER;
    } else if (!file) {
      file = argv[a];
    } else {
      fprintf(stderr, "evtc opt: more than one FILE\n");
      return EVTC_EXIT_USER;
    }
  }
  if (!file) {
    fprintf(stderr, "usage: evtc opt FILE [--passes=a,b,...] [--dump-after=PASS] [--stats] [--verify] [--no-loss] [--fp8]\n");
    return EVTC_EXIT_USER;
  }
  unsigned flags = o.fp8 ? EVT_PASS_FP8 : 0; /* the default list: the pipeline as evt_passes_run_all(g, flags) runs it */
  for (int i = 0; !explicit_list && i < evt_npasses; i++)
    if ((evt_passes[i].needs & flags) == evt_passes[i].needs) o.list[o.n++] = &evt_passes[i];
  if (o.dump_after) {
    bool found = false;
    for (int i = 0; i < o.n; i++) found = found || !strcmp(o.list[i]->name, o.dump_after);
    if (!found) {
      fprintf(stderr, "evtc opt: --dump-after=%s names no pass that runs\n", o.dump_after);
      return EVTC_EXIT_USER;
    }
  }
  char *err = NULL;
  evt_graph *g = evt_parse_file(file, &err);
  if (!g) {
    fprintf(stderr, "%s\n", err ? err : "parse failed");
    free(err);
    return EVTC_EXIT_USER;
  }
  int rc = EVTC_EXIT_OK;
  if (g->loss >= 0 && g->noutputs == 1) {
    evt_status st = evt_graph_build_joint(g, 0);
    if (st != EVT_OK) {
      fprintf(stderr, "%s\n", evt_graph_error(g));
      evt_graph_free(g);
      return evtc_exit_code(st);
    }
  }
  if (o.stats) {
    printf("stats: %-13s ", "input");
    print_counts(g, stdout);
  }
  int nodes_before = g->nnodes;
  bool loss_zero = false; /* --no-loss and loss elimination ran */
  for (int i = 0; i < o.n && rc == EVTC_EXIT_OK; i++) {
    const evt_pass_info *p = o.list[i];
    snapshot before = {0};
    uint64_t seed = 1000 + (uint64_t)i;
    double rtol = rounded_tolerance(g);
    evt_status run_st = o.verify ? snapshot_take(g, seed, &before) : EVT_OK;
    if (run_st != EVT_OK) { /* the graph's own values fail (an index out of range): a user error before the first pass */
      fprintf(stderr, "evtc opt: interpreter before %s: %s\n", p->name, evt_graph_error(g));
      rc = i == 0 ? evtc_exit_code(run_st) : EVTC_EXIT_INTERNAL;
    }
    int nb = g->nnodes;
    evt_pass_stats st = {.flags = (o.no_loss ? EVT_PASS_DROP_LOSS : 0) | flags};
    evt_status s = rc == EVTC_EXIT_OK ? p->run(g, &st) : EVT_OK;
    if (rc == EVTC_EXIT_OK && s == EVT_OK && o.verify) s = evt_graph_verify(g);
    if (s != EVT_OK) {
      fprintf(stderr, "evtc opt: pass %s: %s\n", p->name, evt_graph_error(g));
      rc = s == EVT_ERR_INTERNAL || o.verify ? EVTC_EXIT_INTERNAL : evtc_exit_code(s);
    }
    if (rc == EVTC_EXIT_OK && o.stats) {
      printf("stats: %-13s ", p->name);
      print_counts(g, stdout);
      printf("stats: %-13s %d rewrites, %+d nodes\n", "", st.rewrites, g->nnodes - nb);
    }
    if (rc == EVTC_EXIT_OK && o.verify) {
      bool dropped = o.no_loss && !strcmp(p->name, "loss-elim") && g->loss >= 0;
      loss_zero = loss_zero || dropped;
      rc = verify_after(g, p, seed, &before, dropped, loss_zero, rtol);
    }
    snapshot_free(&before);
    if (rc == EVTC_EXIT_OK && o.dump_after && !strcmp(o.dump_after, p->name)) evt_graph_print(g, stdout);
  }
  if (rc == EVTC_EXIT_OK && o.stats) printf("stats: %d nodes -> %d nodes (%+d)\n", nodes_before, g->nnodes, g->nnodes - nodes_before);
  if (rc == EVTC_EXIT_OK && !o.dump_after) evt_graph_print(g, stdout);
  evt_graph_free(g);
  return rc;
}
