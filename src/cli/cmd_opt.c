/* `evtc opt FILE`: runs the graph passes (src/passes/pipeline.c) on a .evt file and prints the result.
 * A graph with a loss but no further outputs is first turned into the joint graph (evt_graph_build_joint).
 * --verify runs the CPU interpreter (in fp64) on fresh random inputs before and after every pass and prints
 * the largest relative difference over all outputs (loss and gradients; see max_rel_diff); with it, the
 * verifier also runs after every pass. Exit codes: 0 ok, 1 user error (bad file or flags), 2 a pass broke the graph or its values
 * moved by more than 1e-5 (--verify). */
#include "cli.h"
#include "passes/passes.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define VERIFY_TOLERANCE 1e-5

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
  evt_tensor *values;
} snapshot;

static int find_name(const snapshot *s, const char *name) {
  for (int i = 0; i < s->nnodes; i++)
    if (!strcmp(s->names[i], name)) return i;
  return -1;
}

/* Runs g on inputs initialized from `seed` (or, with `src`, copied by name from its inputs); returns the
 * value array (outputs kept) or NULL with the message on g. */
static evt_tensor *run_graph(evt_graph *g, uint64_t seed, const snapshot *src) {
  evt_tensor *v = calloc((size_t)g->nnodes, sizeof *v);
  if (!v) return NULL;
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
  /* fp64: a pass is judged by the math it preserves, not by f32 rounding; the first run keeps its inputs */
  if (st == EVT_OK) st = evt_interp_run(g, v, EVT_RUN_FP64, src == NULL);
  if (st != EVT_OK) {
    free_values(v, g->nnodes);
    return NULL;
  }
  return v;
}

/* Largest relative difference over the outputs (output `skip` left out): per output max|a-b| divided by its
 * largest magnitude max|a|, floored at 1e-6 times the largest magnitude over all outputs, so an output that
 * is zero in exact arithmetic (the gradient of an attention key bias) compares its rounding noise against
 * the step's scale rather than against itself. *worst_out gets the output with the largest difference. */
static double max_rel_diff(const snapshot *a, const evt_graph *gb, const evt_tensor *b, int skip, int *worst_out) {
  double worst = 0, global = 0;
  *worst_out = -1;
  if (a->noutputs != gb->noutputs) return INFINITY;
  for (int o = 0; o < a->noutputs; o++) {
    const evt_tensor *x = &a->values[a->outputs[o]];
    for (int64_t i = 0; o != skip && i < x->numel; i++)
      if (fabs(x->data[i]) > global) global = fabs(x->data[i]);
  }
  for (int o = 0; o < a->noutputs; o++) {
    if (o == skip) continue;
    const evt_tensor *x = &a->values[a->outputs[o]], *y = &b[gb->outputs[o]];
    if (x->numel != y->numel) return *worst_out = o, INFINITY;
    double diff = 0, scale = 1e-6 * global;
    for (int64_t i = 0; i < x->numel; i++) {
      double d = fabs(x->data[i] - y->data[i]);
      if (isnan(x->data[i]) != isnan(y->data[i])) return *worst_out = o, INFINITY;
      if (!isnan(d) && d > diff) diff = d;
      if (fabs(x->data[i]) > scale) scale = fabs(x->data[i]);
    }
    double rel = diff == 0 ? 0 : diff / (scale > 1e-300 ? scale : 1e-300);
    if (rel > worst) worst = rel, *worst_out = o;
  }
  return worst;
}

typedef struct options {
  const evt_pass_info *list[64];
  int n;
  const char *dump_after;
  bool stats, verify, no_loss;
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

EVTC_COMMAND(opt, "FILE [--passes=a,b,...] [--dump-after=PASS] [--stats] [--verify] [--no-loss]",
             "run the graph passes and print the optimized graph\n"
             "  --passes=a,b,...   run these passes in this order (default: the whole pipeline:\n"
             "                     canonicalize,loss-elim,decompose,reduce-elim,constprop,cse,layout,dce)\n"
             "  --dump-after=PASS  print the graph right after PASS instead of the final graph\n"
             "  --stats            print node counts by op class (and of permutes) before and after each pass\n"
             "  --verify           run the verifier after every pass, and the interpreter (fp64) on fresh random\n"
             "                     inputs before and after it: print the largest relative difference over\n"
             "                     all outputs (each output against its own magnitude, floored at 1e-6 of\n"
             "                     the largest output magnitude); exit 2 if a pass moves one by more than 1e-5\n"
             "  --no-loss          loss elimination replaces the loss output by the constant 0") {
  options o = {0};
  for (int i = 0; i < evt_npasses; i++) o.list[o.n++] = &evt_passes[i];
  const char *file = NULL;
  for (int a = 1; a < argc; a++) {
    if (!strncmp(argv[a], "--passes=", 9)) {
      if (parse_passes(&o, argv[a] + 9)) return EVTC_EXIT_USER;
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
    fprintf(stderr, "usage: evtc opt FILE [--passes=a,b,...] [--dump-after=PASS] [--stats] [--verify] [--no-loss]\n");
    return EVTC_EXIT_USER;
  }
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
    if (o.verify) {
      before.values = run_graph(g, 1000 + (uint64_t)i, NULL);
      if (!before.values) {
        fprintf(stderr, "evtc opt: interpreter before %s: %s\n", p->name, evt_graph_error(g));
        rc = EVTC_EXIT_INTERNAL;
        break;
      }
      before.nnodes = g->nnodes;
      before.noutputs = g->noutputs;
      before.names = malloc(sizeof(char *) * (size_t)g->nnodes);
      before.outputs = malloc(sizeof(int) * (size_t)(g->noutputs + 1));
      if (!before.names || !before.outputs) evt_fatal(__FILE__, __LINE__, "out of memory");
      for (int k = 0; k < g->nnodes; k++) before.names[k] = g->nodes[k].name;
      if (g->noutputs > 0) memcpy(before.outputs, g->outputs, sizeof(int) * (size_t)g->noutputs);
    }
    int nb = g->nnodes;
    evt_pass_stats st = {.flags = o.no_loss ? EVT_PASS_DROP_LOSS : 0};
    evt_status s = p->run(g, &st);
    if (s == EVT_OK && o.verify) s = evt_graph_verify(g);
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
      evt_tensor *after = run_graph(g, 1000 + (uint64_t)i, &before);
      if (!after) {
        fprintf(stderr, "evtc opt: interpreter after %s: %s\n", p->name, evt_graph_error(g));
        rc = EVTC_EXIT_INTERNAL;
      } else {
        bool dropped = o.no_loss && !strcmp(p->name, "loss-elim") && g->loss >= 0;
        loss_zero = loss_zero || dropped;
        int worst = -1;
        double d = max_rel_diff(&before, g, after, dropped ? 0 : -1, &worst);
        printf("verify: %-13s max rel diff %.3g over %d outputs%s%s\n", p->name, d, g->noutputs,
               dropped ? " (loss dropped: not compared)" : "",
               g->loss < 0 ? "" : loss_zero ? ", loss output 0 is the constant 0" : ", loss kept as output 0");
        if (!(d <= VERIFY_TOLERANCE)) {
          fprintf(stderr, "evtc opt: pass %s changed output %d (%%%s) by %.3g (> %g)\n", p->name, worst,
                  worst >= 0 ? g->nodes[g->outputs[worst]].name : "?", d, VERIFY_TOLERANCE);
          rc = EVTC_EXIT_INTERNAL;
        }
        free_values(after, g->nnodes);
      }
    }
    free_values(before.values, before.nnodes);
    free(before.names);
    free(before.outputs);
    if (rc == EVTC_EXIT_OK && o.dump_after && !strcmp(o.dump_after, p->name)) evt_graph_print(g, stdout);
  }
  if (rc == EVTC_EXIT_OK && o.stats) printf("stats: %d nodes -> %d nodes (%+d)\n", nodes_before, g->nnodes, g->nnodes - nodes_before);
  if (rc == EVTC_EXIT_OK && !o.dump_after) evt_graph_print(g, stdout);
  evt_graph_free(g);
  return rc;
}
