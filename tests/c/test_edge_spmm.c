/* Edge-list message passing as SpMM: the interpreter's coo_perm / coo_rowptr, and the edge-spmm pass
 * (src/passes/edge_spmm.c) on tests/gpu/graphs/gcn_edges.evt and small patterns, values compared before and after. */
#include "test.h"

#include "passes/passes.h"

/* ---- coo_perm / coo_rowptr on the interpreter ------------------------------------------------------------ */

static const char *kCoo =
    "graph t {\n  %k: i64[7] = input()\n  %p: i64[7] = coo_perm(%k, rows=5)\n"
    "  %r: i64[6] = coo_rowptr(%k, rows=5)\n  output %p, %r\n}\n";

/* Runs kCoo's graph on keys; returns its status, *g_out the graph and v its values (caller frees both). */
static evt_status run_coo(const double keys[7], evt_graph **g_out, evt_tensor **v_out) {
  evt_graph *g = evt_test_parse_ok(kCoo);
  evt_tensor *v = calloc((size_t)g->nnodes, sizeof *v);
  CHECK(evt_interp_init_inputs(g, v, 1) == EVT_OK);
  memcpy(v[0].data, keys, 7 * sizeof(double));
  evt_status st = evt_interp_run(g, v, 0, 1);
  *g_out = g;
  *v_out = v;
  return st;
}

static void free_run(evt_graph *g, evt_tensor *v) {
  for (int i = 0; i < g->nnodes; i++) evt_tensor_free(&v[i]);
  free(v);
  evt_graph_free(g);
}

TEST(coo_perm_rowptr_stable_with_duplicates_and_empty_rows) {
  /* keys 0: e 1, 4; key 1: e 6; key 2: e 0, 2, 5; key 3: e 3; key 4: none */
  const double keys[7] = {2, 0, 2, 3, 0, 2, 1};
  const double perm[7] = {1, 4, 6, 0, 2, 5, 3}, rowptr[6] = {0, 2, 3, 6, 7, 7};
  evt_graph *g;
  evt_tensor *v;
  CHECK_MSG(run_coo(keys, &g, &v) == EVT_OK, "%s", evt_graph_error(g));
  for (int i = 0; i < 7; i++) CHECK_NEAR(v[1].data[i], perm[i], 0);
  for (int i = 0; i < 6; i++) CHECK_NEAR(v[2].data[i], rowptr[i], 0);
  CHECK(g->nodes[1].type.dtype == EVT_I64 && g->nodes[2].type.shape[0] == 6);
  free_run(g, v);
}

TEST(coo_bad_key_is_an_index_error) {
  const double bad[2][7] = {{2, 0, 2, 5, 0, 2, 1}, {2, 0, -1, 3, 0, 2, 1}};
  for (int t = 0; t < 2; t++) {
    evt_graph *g;
    evt_tensor *v;
    CHECK(run_coo(bad[t], &g, &v) != EVT_OK);
    CHECK_MSG(strstr(evt_graph_error(g), "out of range") != NULL, "%s", evt_graph_error(g));
    free_run(g, v);
  }
}

TEST(coo_types_checked) {
  const char *bad[] = {
      "graph t {\n  %k: i64[7] = input()\n  %p: i64[7] = coo_perm(%k)\n  output %p\n}\n",         /* no rows */
      "graph t {\n  %k: f32[7] = input()\n  %p: i64[7] = coo_perm(%k, rows=3)\n  output %p\n}\n", /* float key */
      "graph t {\n  %k: i64[7,1] = input()\n  %r: i64[4] = coo_rowptr(%k, rows=3)\n  output %r\n}\n",
  };
  for (int i = 0; i < EVT_ARRAY_LEN(bad); i++) {
    char *err = NULL;
    evt_graph *g = evt_parse(bad[i], "t.evt", &err);
    CHECK_MSG(g == NULL, "graph %d parsed", i);
    evt_graph_free(g);
    free(err);
  }
}

/* ---- the pass ------------------------------------------------------------------------------------------ */

/* Slot of the node named `name` in g, or -1. */
static int node_named(const evt_graph *g, const char *name) {
  for (int i = 0; i < g->nnodes; i++)
    if (!strcmp(g->nodes[i].name, name)) return i;
  return -1;
}

/* Runs the whole pipeline on g (a joint graph when it has a loss) and checks every output keeps its value on the
 * interpreter (each node rounded to its dtype; random inputs and edges of `seeds` seeds): max |diff| <= 1e-5 of
 * the output's largest magnitude. */
static void check_pipeline_values(evt_graph *g, int seeds) {
  int n0 = g->nnodes, no = g->noutputs;
  evt_tensor *v0 = calloc((size_t)n0 * (size_t)seeds, sizeof *v0);
  char **names = calloc((size_t)n0, sizeof *names);
  int *outs = malloc(sizeof(int) * (size_t)no);
  memcpy(outs, g->outputs, sizeof(int) * (size_t)no);
  for (int i = 0; i < n0; i++) names[i] = strdup(g->nodes[i].name);
  for (int s = 0; s < seeds; s++) {
    CHECK(evt_interp_init_inputs(g, v0 + s * n0, 100 + (uint64_t)s) == EVT_OK);
    CHECK_MSG(evt_interp_run(g, v0 + s * n0, 0, 1) == EVT_OK, "before: %s", evt_graph_error(g));
  }
  CHECK_MSG(evt_passes_run_all(g, 0, 1) == EVT_OK, "passes: %s", evt_graph_error(g));
  CHECK(g->noutputs == no);
  for (int s = 0; s < seeds; s++) {
    evt_tensor *v1 = calloc((size_t)g->nnodes, sizeof *v1);
    CHECK(evt_interp_init_inputs(g, v1, 1) == EVT_OK);
    for (int j = 0; j < n0; j++) {
      int i = node_named(g, names[j]);
      if (i >= 0 && (g->nodes[i].op == EVT_OP_INPUT || g->nodes[i].op == EVT_OP_PARAM))
        memcpy(v1[i].data, v0[s * n0 + j].data, sizeof(double) * (size_t)v1[i].numel);
    }
    CHECK_MSG(evt_interp_run(g, v1, 0, 1) == EVT_OK, "after: %s", evt_graph_error(g));
    for (int o = 0; o < no && o < g->noutputs; o++) {
      const evt_tensor *a = &v0[s * n0 + outs[o]], *b = &v1[g->outputs[o]];
      double scale = 1e-12, diff = 0;
      for (int64_t e = 0; e < a->numel && a->numel == b->numel; e++) {
        scale = fmax(scale, fabs(a->data[e]));
        diff = fmax(diff, fabs(a->data[e] - b->data[e]));
      }
      CHECK_MSG(a->numel == b->numel && diff <= 1e-5 * scale, "seed %d output %d: diff %g at scale %g", s, o, diff, scale);
    }
    for (int i = 0; i < g->nnodes; i++) evt_tensor_free(&v1[i]);
    free(v1);
  }
  for (int i = 0; i < n0 * seeds; i++) evt_tensor_free(&v0[i]);
  for (int i = 0; i < n0; i++) free(names[i]);
  free(v0), free(names), free(outs);
}

TEST(edge_spmm_gcn_training_step) {
  char *err = NULL;
  evt_graph *g = evt_parse_file("tests/gpu/graphs/gcn_edges.evt", &err);
  CHECK_MSG(g != NULL, "%s", err ? err : "");
  free(err);
  if (!g) return;
  CHECK(evt_graph_build_joint(g, 0) == EVT_OK);
  CHECK(evt_test_count_op(g, EVT_OP_INDEX_SELECT_BACKWARD) == 4); /* 2 forward scatters, 2 in the backward */
  check_pipeline_values(g, 3);
  CHECK(evt_test_count_op(g, EVT_OP_INDEX_SELECT_BACKWARD) == 0);
  CHECK(evt_test_count_op(g, EVT_OP_SPMM) == 4);
  CHECK(evt_test_count_op(g, EVT_OP_COO_PERM) == 2);   /* by dst (forward) and by src (backward), shared */
  CHECK(evt_test_count_op(g, EVT_OP_COO_ROWPTR) == 2);
  evt_graph_free(g);
}

TEST(edge_spmm_expanded_weight_i32_indices) {
  evt_graph *g = evt_test_parse_ok(
      "graph t {\n  %x: f32[5,3] = input()\n  %src: i32[9] = input(init=randint, lo=0, hi=5)\n"
      "  %dst: i32[9] = input(init=randint, lo=0, hi=6)\n  %w: f32[9,1] = input()\n"
      "  %g: f32[9,3] = index_select(%x, %src, dim=0)\n  %we: f32[9,3] = expand(%w, shape=[9,3])\n"
      "  %m: f32[9,3] = mul(%we, %g)\n  %s: f32[6,3] = index_select_backward(%m, %dst, dim=0, shape=[6,3])\n"
      "  output %s\n}\n");
  if (!g) return;
  check_pipeline_values(g, 3);
  CHECK(evt_test_count_op(g, EVT_OP_SPMM) == 1 && evt_test_count_op(g, EVT_OP_INDEX_SELECT_BACKWARD) == 0);
  evt_graph_free(g);
}

TEST(edge_spmm_leaves_a_shared_gather) {
  evt_graph *g = evt_test_parse_ok(
      "graph t {\n  %x: f32[5,3] = input()\n  %src: i64[9] = input(init=randint, lo=0, hi=5)\n"
      "  %dst: i64[9] = input(init=randint, lo=0, hi=5)\n  %w: f32[9,1] = input()\n"
      "  %g: f32[9,3] = index_select(%x, %src, dim=0)\n  %m: f32[9,3] = mul(%g, %w)\n"
      "  %s: f32[5,3] = index_select_backward(%m, %dst, dim=0, shape=[5,3])\n  output %s, %g\n}\n");
  if (!g) return;
  CHECK(evt_passes_run_all(g, 0, 1) == EVT_OK);
  CHECK(evt_test_count_op(g, EVT_OP_SPMM) == 0 && evt_test_count_op(g, EVT_OP_INDEX_SELECT_BACKWARD) == 1);
  evt_graph_free(g);
}
