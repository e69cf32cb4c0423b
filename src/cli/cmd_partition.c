/* `evtc partition FILE [flags]`: splits a graph into fused kernels (src/partition) and prints each group
 * (nucleus, ops, tensors read and written) and, with --stats, the plan's cost next to the greedy
 * baseline and the solver's statistics. Bad input: message on stderr, exit 1; an invalid partition
 * (a bug): exit 2. */
#include "cli.h"
#include "passes/passes.h"
#include "partition/partition.h"

#include <stdlib.h>
#include <string.h>

#define LAMBDA_MAX 1e12     /* bytes per launch */
#define TIME_LIMIT_MAX 1e6  /* seconds per MIP */

static int run_check(evt_graph *g, const evt_part_plan *plan) {
  int n = g->nnodes;
  evt_tensor *a = calloc((size_t)n + 1, sizeof *a), *b = calloc((size_t)n + 1, sizeof *b);
  int rc = EVTC_EXIT_OK, peak = 0;
  evt_status st = evt_interp_init_inputs(g, a, 1);
  if (st == EVT_OK) st = evt_interp_init_inputs(g, b, 1);
  if (st == EVT_OK) st = evt_interp_run(g, a, 0, 0);
  if (st == EVT_OK) st = evt_part_exec(g, plan, b, 0, &peak);
  if (st != EVT_OK) {
    fprintf(stderr, "%s\n", evt_graph_error(g));
    rc = evtc_exit_code(st);
  } else {
    int bad = 0;
    for (int i = 0; i < g->noutputs; i++) {
      int o = g->outputs[i];
      if (a[o].numel != b[o].numel || memcmp(a[o].data, b[o].data, sizeof(double) * (size_t)a[o].numel)) {
        fprintf(stderr, "evtc partition: output %%%s differs between the partitioned and the plain run\n", g->nodes[o].name);
        bad++;
      }
    }
    if (bad) rc = EVTC_EXIT_INTERNAL;
    else printf("check: partitioned run equals the plain run on %d outputs (peak %d live tensors between groups)\n", g->noutputs, peak);
  }
  for (int i = 0; i < n; i++) evt_tensor_free(&a[i]), evt_tensor_free(&b[i]);
  free(a);
  free(b);
  return rc;
}

EVTC_COMMAND(partition, "FILE [--solver=ilp|mip|greedy] [--time-limit S] [--dot OUT.dot|--svg OUT.svg] [--stats] [--joint] [--opt]",
             "split FILE into fused kernels and print the groups\n"
             "  --solver=ilp     exact: decomposition, then per component the down-set DP when the\n"
             "                   component is narrow, else a CBC MIP (default)\n"
             "  --solver=mip     exact, without the DP: one CBC MIP per component\n"
             "  --solver=greedy  greedy fusion along the heaviest edges\n"
             "  --time-limit S   seconds for the whole search, 0..1e6 (default 10); blocks not proven by then keep\n"
             "                   the best legal grouping found (at worst the greedy one), with a warning\n"
             "  --dot OUT.dot    write the grouped graph as Graphviz; --svg OUT.svg renders it with `dot`\n"
             "  --stats          kernels and bytes (and the greedy baseline), components, MIPs, cache hits,\n"
             "                   solve time, optimality (proven, or the largest gap)\n"
             "  --joint          append the backward of the loss first (the training step)\n"
             "  --opt            run the graph-pass pipeline (evtc opt) before partitioning\n"
             "  --lambda B       launch cost of one kernel in bytes, 0..1e12 (default 4194304)\n"
             "  --no-cache       do not read or write the solution cache ($EVT_CACHE_DIR, ~/.cache/evt)\n"
             "  --check          run the plan group by group on the interpreter and compare with a plain run\n"
             "  --quiet          do not list the groups") {
  const char *path = NULL, *dot = NULL, *svg = NULL;
  int stats = 0, joint = 0, check = 0, quiet = 0, optimize = 0;
  double lambda = EVT_PART_LAMBDA_DEFAULT;
  evt_part_options opt = evt_part_options_default();
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--solver=ilp")) opt.use_ilp = 1;
    else if (!strcmp(a, "--solver=mip")) opt.use_ilp = 1, opt.use_dp = 0;
    else if (!strcmp(a, "--solver=greedy")) opt.use_ilp = 0;
    else if (!strcmp(a, "--stats")) stats = 1;
    else if (!strcmp(a, "--joint")) joint = 1;
    else if (!strcmp(a, "--opt")) optimize = 1;
    else if (!strcmp(a, "--check")) check = 1;
    else if (!strcmp(a, "--quiet")) quiet = 1;
    else if (!strcmp(a, "--no-cache")) opt.use_cache = 0;
    else if ((!strcmp(a, "--time-limit") || !strcmp(a, "--lambda") || !strcmp(a, "--dot") || !strcmp(a, "--svg")) && i + 1 < argc) {
      const char *v = argv[++i];
      if (!strcmp(a, "--dot")) dot = v;
      else if (!strcmp(a, "--svg")) svg = v;
      /* bounded so that the MIP's objective stays far below the solver's 1e25 limit */
      else if (!strcmp(a, "--lambda") ? !evtc_parse_double("partition", a, v, 0, LAMBDA_MAX, &lambda)
                                      : !evtc_parse_double("partition", a, v, 0, TIME_LIMIT_MAX, &opt.time_limit))
        return EVTC_EXIT_USER;
    } else if (a[0] == '-' && a[1]) {
      fprintf(stderr, "evtc partition: unknown or incomplete flag '%s'\n", a);
      return EVTC_EXIT_USER;
    } else if (path) {
      fprintf(stderr, "evtc partition: more than one file ('%s' and '%s')\n", path, a);
      return EVTC_EXIT_USER;
    } else {
      path = a;
    }
  }
  if (!path) {
    fprintf(stderr, "usage: evtc partition FILE [--solver=ilp|mip|greedy] [--time-limit S] [--dot OUT.dot|--svg OUT.svg] [--stats] [--joint] [--opt]\n");
    return EVTC_EXIT_USER;
  }
  char *err = NULL;
  evt_graph *g = evt_parse_file(path, &err);
  if (!g) {
    fprintf(stderr, "%s\n", err ? err : "cannot parse");
    free(err);
    return EVTC_EXIT_USER;
  }
  if (joint) {
    evt_status st = evt_graph_build_joint(g, 0);
    if (st != EVT_OK) {
      fprintf(stderr, "%s\n", evt_graph_error(g));
      evt_graph_free(g);
      return evtc_exit_code(st);
    }
  }
  if (optimize) {
    evt_status st = evt_passes_run_all(g, 0, 0);
    if (st != EVT_OK) {
      fprintf(stderr, "%s\n", evt_graph_error(g));
      evt_graph_free(g);
      return evtc_exit_code(st);
    }
  }
  evt_part_plan plan;
  evt_status st = evt_part_plan_build(g, &opt, lambda, &plan);
  if (st != EVT_OK) {
    fprintf(stderr, "%s\n", evt_graph_error(g));
    evt_graph_free(g);
    return evtc_exit_code(st);
  }
  if (!quiet) evt_part_plan_print(g, &plan, stdout);
  int rc = EVTC_EXIT_OK;
  if (stats) {
    evt_part_plan base;
    evt_part_options gopt = opt;
    gopt.use_ilp = 0;
    st = evt_part_plan_build(g, &gopt, lambda, &base);
    if (st != EVT_OK) {
      fprintf(stderr, "%s\n", evt_graph_error(g));
      rc = evtc_exit_code(st);
    } else {
      const evt_part_stats *s = &plan.stats;
      printf("solver: %s\n", opt.use_ilp ? (opt.use_dp ? "ilp" : "mip") : "greedy");
      printf("kernels: %d (greedy %d)\n", plan.cost.groups, base.cost.groups);
      printf("bytes: %.0f (written %.0f, read %.0f); greedy %.0f\n", plan.cost.written + plan.cost.read,
             plan.cost.written, plan.cost.read, base.cost.written + base.cost.read);
      printf("objective: %.0f (bytes + %d kernels x lambda %.0f); greedy %.0f\n", plan.cost.total, plan.cost.groups,
             lambda, base.cost.total);
      if (opt.use_ilp) {
        printf("components: %d (DP %d [<= %ld down-sets], MIPs %d, lower bound %d, trivial %d, cache hits %d of them %d from disk, merged %d, lazy rows %d, largest %d nodes, %ld branch-and-bound nodes)\n",
               s->components, s->dps, s->dp_most_sets, s->mips, s->bounds, s->trivial, s->cache_hits, s->disk_hits, s->merges, s->lazy_rows, s->largest_component,
               s->bb_nodes);
        if (s->too_large) printf("too large for the MIP: %d blocks (largest %d nodes), greedy grouping kept\n", s->too_large, s->largest_too_large);
        if (s->proven) printf("optimality: proven\n");
        else printf("optimality: not proven (%d timeouts, %d at the node budget, largest gap %.2f%%)\n", s->timeouts,
                    s->node_limited, 100 * s->max_gap);
      }
      printf("solve time: %.3f s\n", s->solve_seconds);
      evt_part_plan_free(&base);
    }
  }
  if (rc == EVTC_EXIT_OK && (dot || svg)) {
    const char *dpath = dot;
    char tmp[4096];
    if (!dot) snprintf(tmp, sizeof tmp, "%s.dot", svg), dpath = tmp;
    FILE *f = fopen(dpath, "w");
    if (!f) {
      fprintf(stderr, "evtc partition: cannot write '%s'\n", dpath);
      rc = EVTC_EXIT_USER;
    } else {
      evt_part_plan_dot(g, &plan, f);
      fclose(f);
      if (svg) {
        char cmd[9000];
        snprintf(cmd, sizeof cmd, "dot -Tsvg '%s' -o '%s' 2>/dev/null", dpath, svg);
        if (strchr(svg, '\'') || strchr(dpath, '\'') || system(cmd) != 0) {
          fprintf(stderr, "evtc partition: could not render '%s' (is graphviz `dot` installed?); the dot text is in '%s'\n", svg, dpath);
          rc = EVTC_EXIT_USER;
        } else if (!dot) {
          remove(dpath);
        }
      }
    }
  }
  if (rc == EVTC_EXIT_OK && check) rc = run_check(g, &plan);
  evt_part_plan_free(&plan);
  evt_graph_free(g);
  return rc;
}
