/* The partitioner on large graphs: structure, not timing (timings live in bench/RESULTS.md, "Partitioner scale").
 * A 10k-node chain and fan are one block each, too large for the MIP, proven by the lower bound; an MLP chain
 * splits into one small block per layer; no reachability table is n x n (evt_part_stats.scratch_peak); a block
 * over the MIP's cap or past the time limit keeps the greedy grouping and says so; numbers no solver should
 * see are rejected. */
#include "test.h"
#include "partition/partition.h"
#include "passes/passes.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static evt_part_options quiet_options(void) {
  evt_part_options o = evt_part_options_default();
  o.use_cache = 0;
  o.quiet = 1;
  return o;
}

/* A training-step-shaped chain: a source, k forward ops, and k backward ops each reading the next backward
 * op and its forward op (like a joint graph's gradient chain); the last backward op is the output. */
static evt_pgraph *joint_chain(int k) {
  int n = 1 + 2 * k;
  evt_pgraph *g = evt_pgraph_new(n);
  g->nodes[0].flags = EVT_PN_SOURCE;
  for (int v = 0; v < n; v++) g->nodes[v].bytes = 4096;
  for (int i = 1; i <= k; i++) evt_pgraph_add_edge(g, i - 1, i);           /* forward f_i = node i */
  for (int j = 0; j < k; j++) {                                              /* backward b_j = node k + 1 + j */
    int b = k + 1 + j, f = k - j;                                            /* ... reads f_{k-j} */
    if (j > 0) evt_pgraph_add_edge(g, b - 1, b);
    evt_pgraph_add_edge(g, f, b);
  }
  g->nodes[n - 1].flags |= EVT_PN_OUTPUT;
  evt_pgraph_finish(g);
  return g;
}

/* A fan: source -> h, h read by m ops (each also reading a source weight), summed back by a balanced tree. */
static evt_pgraph *fan(int m) {
  int n = 2 + 2 * m + (m - 1), next = 2;
  evt_pgraph *g = evt_pgraph_new(n);
  for (int v = 0; v < n; v++) g->nodes[v].bytes = 4096;
  g->nodes[0].flags = EVT_PN_SOURCE;
  evt_pgraph_add_edge(g, 0, 1);
  int *level = malloc((size_t)m * sizeof(int)), nl = 0;
  for (int i = 0; i < m; i++) {
    int w = next++, y = next++;
    g->nodes[w].flags = EVT_PN_SOURCE;
    evt_pgraph_add_edge(g, 1, y);
    evt_pgraph_add_edge(g, w, y);
    level[nl++] = y;
  }
  while (nl > 1) {
    int k = 0;
    for (int i = 0; i + 1 < nl; i += 2) {
      int s = next++;
      evt_pgraph_add_edge(g, level[i], s);
      evt_pgraph_add_edge(g, level[i + 1], s);
      level[k++] = s;
    }
    if (nl % 2) level[k++] = level[nl - 1];
    nl = k;
  }
  EVT_ASSERT(next == n);
  g->nodes[level[0]].flags |= EVT_PN_OUTPUT;
  free(level);
  evt_pgraph_finish(g);
  return g;
}

/* Solves g with o; checks the grouping, that it is no worse than greedy, and that no table was n x n. */
static void solve_checked(evt_pgraph *g, const evt_part_options *o, evt_part_stats *st) {
  int *group = malloc((size_t)g->n * sizeof(int)), *gg = malloc((size_t)g->n * sizeof(int));
  CHECK(evt_part_solve(g, o, group, st) == EVT_OK);
  CHECK(evt_part_validate(g, group) == EVT_OK);
  evt_part_greedy(g, gg);
  CHECK(evt_part_evaluate(g, group).total <= evt_part_evaluate(g, gg).total + 1e-6);
  /* linear scratch (<= 1 KiB a node), far below one n x n bitset (n^2 / 8 bytes) at these sizes */
  CHECK_MSG(st->scratch_peak <= (size_t)1024 * (size_t)g->n, "scratch %zu bytes for %d nodes", st->scratch_peak, g->n);
  CHECK((size_t)1024 * (size_t)g->n < (size_t)g->n * (size_t)g->n / 8);
  free(group);
  free(gg);
}

TEST(partition_scale_chain_10k_one_block_proven_by_bound) {
  evt_pgraph *g = joint_chain(5000);
  evt_part_options o = quiet_options();
  evt_part_stats st;
  solve_checked(g, &o, &st);
  CHECK_MSG(st.largest_component == 10000 && st.largest_component > EVT_MIP_MAX_NODES, "largest block %d", st.largest_component);
  CHECK(st.bounds == 1 && st.mips == 0 && st.dps == 0 && st.too_large == 0);
  CHECK(st.proven && st.warning[0] == 0);
  printf("  (10001-node chain: 1 block, proven by the lower bound, scratch %zu bytes, %.3f s)\n", st.scratch_peak, st.solve_seconds);
  evt_pgraph_free(g);
}

TEST(partition_scale_fan_10k_one_block_proven_by_bound) {
  evt_pgraph *g = fan(3333);
  evt_part_options o = quiet_options();
  evt_part_stats st;
  solve_checked(g, &o, &st);
  CHECK_MSG(st.largest_component > EVT_MIP_MAX_NODES, "largest block %d", st.largest_component);
  CHECK(st.bounds == 1 && st.mips == 0 && st.proven && st.warning[0] == 0);
  printf("  (%d-node fan: largest block %d, proven by the lower bound, scratch %zu bytes)\n", g->n, st.largest_component,
         st.scratch_peak);
  evt_pgraph_free(g);
}

/* Layers of (nucleus, fusible op reading it and the previous layer's nucleus, reduction): nuclei cannot share
 * a group, so the greedy grouping is not tight against the lower bound, and the whole graph is one block
 * when not decomposed. */
static evt_pgraph *layered_nuclei(int layers) {
  int n = 1 + 3 * layers;
  evt_pgraph *g = evt_pgraph_new(n);
  g->nodes[0].flags = EVT_PN_SOURCE;
  for (int v = 0; v < n; v++) g->nodes[v].bytes = 100 + (v * 37) % 50;
  int prev = 0, prevnu = -1;
  for (int l = 0; l < layers; l++) {
    int nu = 1 + 3 * l, e = nu + 1, r = nu + 2;
    g->nodes[nu].flags = EVT_PN_NUCLEUS | EVT_PN_CUT_IN;
    g->nodes[r].flags = EVT_PN_CUT_OUT;
    evt_pgraph_add_edge(g, prev, nu);
    evt_pgraph_add_edge(g, nu, e);
    if (prevnu >= 0) evt_pgraph_add_edge(g, prevnu, e);
    evt_pgraph_add_edge(g, e, r);
    prev = e, prevnu = nu;
  }
  g->nodes[prev].flags |= EVT_PN_OUTPUT;
  g->lambda = 200;
  evt_pgraph_finish(g);
  return g;
}

TEST(partition_scale_too_large_block_keeps_greedy_with_warning) {
  evt_pgraph *g = layered_nuclei(100);
  evt_part_options o = quiet_options();
  o.decompose = 0;          /* one block of 300 nodes */
  o.mip_max_nodes = 100;    /* over the MIP's cap (and the DP's 64) */
  evt_part_stats st;
  int *group = malloc((size_t)g->n * sizeof(int)), *gg = malloc((size_t)g->n * sizeof(int));
  CHECK(evt_part_solve(g, &o, group, &st) == EVT_OK);
  CHECK(evt_part_validate(g, group) == EVT_OK);
  evt_part_greedy(g, gg);
  CHECK_NEAR(evt_part_evaluate(g, group).total, evt_part_evaluate(g, gg).total, 1e-9);
  CHECK_MSG(st.too_large == 1 && st.largest_too_large == 300 && st.mips == 0 && !st.proven,
            "too large %d (%d nodes), mips %d, bounds %d", st.too_large, st.largest_too_large, st.mips, st.bounds);
  CHECK_MSG(strstr(st.warning, "too large for the exact solver") != NULL, "warning: '%s'", st.warning);
  /* decomposed, the same graph is many small blocks, solved exactly */
  o = quiet_options();
  CHECK(evt_part_solve(g, &o, group, &st) == EVT_OK);
  CHECK(st.proven && st.too_large == 0 && st.components > 50 && st.warning[0] == 0);
  free(group);
  free(gg);
  evt_pgraph_free(g);
}

TEST(partition_scale_time_limit_bounds_the_search) {
  evt_pgraph *g = layered_nuclei(200);
  evt_part_options o = quiet_options();
  o.time_limit = 0;   /* spent before the first block: every block not proven by the bound keeps the greedy grouping */
  evt_part_stats st;
  int *group = malloc((size_t)g->n * sizeof(int)), *gg = malloc((size_t)g->n * sizeof(int));
  CHECK(evt_part_solve(g, &o, group, &st) == EVT_OK);
  CHECK(evt_part_validate(g, group) == EVT_OK);
  evt_part_greedy(g, gg);
  CHECK_NEAR(evt_part_evaluate(g, group).total, evt_part_evaluate(g, gg).total, 1e-9);
  CHECK(st.dps == 0 && st.mips == 0);
  CHECK_MSG(st.late > 0 && st.timeouts >= st.late && !st.proven, "late %d timeouts %d", st.late, st.timeouts);
  CHECK_MSG(strstr(st.warning, "time limit of 0 s ran out") != NULL, "warning: '%s'", st.warning);
  free(group);
  free(gg);
  evt_pgraph_free(g);
}

TEST(partition_scale_rejects_numbers_no_solver_should_see) {
  evt_pgraph *g = layered_nuclei(3);
  int group[16];
  evt_part_stats st;
  evt_part_options o = quiet_options();
  double lambdas[] = {NAN, INFINITY, -1};
  for (int i = 0; i < 3; i++) {
    g->lambda = lambdas[i];
    CHECK(evt_part_solve(g, &o, group, &st) == EVT_ERR_INVALID);
    CHECK(strstr(g->error, "lambda") != NULL);
  }
  g->lambda = 200;
  g->nodes[2].bytes = NAN;
  CHECK(evt_part_solve(g, &o, group, &st) == EVT_ERR_INVALID);
  g->nodes[2].bytes = 100;
  o.time_limit = NAN;
  CHECK(evt_part_solve(g, &o, group, &st) == EVT_ERR_INVALID);
  o.time_limit = INFINITY;   /* no limit */
  CHECK(evt_part_solve(g, &o, group, &st) == EVT_OK && st.proven);
  evt_pgraph_free(g);
}

/* 2500 layers of mm + bias + relu (10k nodes written), joint graph after the passes: one small block per
 * layer (forward and backward of a layer share one: the relu mask is computed from the forward value). */
TEST(partition_scale_mlp_chain_splits_into_layer_blocks) {
  int layers = 2500;
  evt_sbuf t = {0};
  evt_sbuf_printf(&t, "graph mlp {\n  %%x: f32[16,64] = input(init=normal, std=1.0)\n");
  for (int i = 0; i < layers; i++) {
    char in[32];
    if (i) snprintf(in, sizeof in, "a%d", i - 1);
    else snprintf(in, sizeof in, "x");
    evt_sbuf_printf(&t,
                    "  %%w%d: f32[64,64] = param(init=normal, std=0.125)\n  %%b%d: f32[64] = param(init=zeros)\n"
                    "  %%mm%d: f32[16,64] = mm(%%%s, %%w%d)\n  %%z%d: f32[16,64] = add(%%mm%d, %%b%d)\n"
                    "  %%a%d: f32[16,64] = relu(%%z%d)\n",
                    i, i, i, in, i, i, i, i, i, i);
  }
  evt_sbuf_printf(&t, "  %%loss: f32[] = mean(%%a%d)\n  loss %%loss\n}\n", layers - 1);
  evt_graph *g = evt_test_parse_ok(t.p);
  free(t.p);
  if (!g) return;
  CHECK(evt_graph_build_joint(g, 0) == EVT_OK);
  CHECK_MSG(evt_passes_run_all(g, 0, 0) == EVT_OK, "%s", evt_graph_error(g));
  evt_part_options o = quiet_options();
  evt_part_plan plan;
  CHECK(evt_part_plan_build(g, &o, EVT_PART_LAMBDA_DEFAULT, &plan) == EVT_OK);
  const evt_part_stats *s = &plan.stats;
  CHECK_MSG(s->components >= layers && s->largest_component <= 16, "%d components, largest %d", s->components,
            s->largest_component);
  CHECK(s->proven && s->too_large == 0 && s->warning[0] == 0);
  CHECK_MSG(s->scratch_peak <= (size_t)1024 * (size_t)g->nnodes, "scratch %zu bytes, %d nodes", s->scratch_peak, g->nnodes);
  printf("  (MLP chain, %d layers: %d nodes after the passes, %d kernels, %d blocks, largest %d, scratch %zu bytes)\n",
         layers, g->nnodes, plan.ngroups, s->components, s->largest_component, s->scratch_peak);
  evt_part_plan_free(&plan);
  evt_graph_free(g);
}
