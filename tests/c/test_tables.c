/* Op/attribute tables and dtype rounding. */
#include "test.h"

#include <string.h>

TEST(tables_names_roundtrip) {
  for (int i = 0; i < EVT_OP_COUNT; i++) {
    const char *nm = evt_op_table[i].name;
    CHECK_MSG(nm && evt_op_from_name(nm, strlen(nm)) == i, "op %d", i);
    CHECK(evt_op_table[i].min_inputs <= evt_op_table[i].max_inputs);
    CHECK(evt_op_table[i].max_inputs <= EVT_MAX_INPUTS);
  }
  for (int i = 0; i < EVT_ATTR_COUNT; i++) {
    const char *nm = evt_attr_table[i].name;
    CHECK_MSG(evt_attr_from_name(nm, strlen(nm)) == i, "attr %s", nm);
  }
  CHECK(evt_dtype_from_name("bf16", 4) == EVT_BF16);
  CHECK(evt_dtype_from_name("f64", 3) == -1);
}

TEST(round_bf16_nearest_even) {
  CHECK(evt_round_bf16(1.0f) == 1.0f);
  /* 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even gives 1 */
  CHECK(evt_round_bf16(1.0f + 0x1p-8f) == 1.0f);
  CHECK(evt_round_bf16(1.0f + 0x1p-7f + 0x1p-8f) == 1.0f + 0x1p-6f);
  CHECK(evt_round_bf16(1.0f + 0x1p-8f + 0x1p-20f) == 1.0f + 0x1p-7f);
  CHECK(isnan(evt_round_bf16(NAN)));
  CHECK(evt_round_bf16(-3.0f) == -3.0f);
}

TEST(round_f16_nearest_even) {
  CHECK(evt_round_f16(1.0f) == 1.0f);
  CHECK(evt_round_f16(1.0f + 0x1p-11f) == 1.0f);                       /* tie to even */
  CHECK(evt_round_f16(1.0f + 0x1p-10f + 0x1p-11f) == 1.0f + 0x1p-9f);  /* tie to even (up) */
  CHECK(evt_round_f16(65504.0f) == 65504.0f);
  CHECK(isinf(evt_round_f16(70000.0f)));
  CHECK(evt_round_f16(0x1p-24f) == 0x1p-24f);                          /* smallest subnormal */
  CHECK(evt_round_f16(0x1p-26f) == 0.0f);
  CHECK(evt_round_to_dtype(2.7, EVT_I64) == 2.0);
  CHECK(evt_round_to_dtype(-0.5, EVT_BOOL) == 1.0);
}

TEST(graph_sources_and_errors) {
  evt_graph *g = evt_graph_new("t");
  int64_t s[2] = {3, 4};
  int x = evt_input(g, "x", EVT_F32, 2, s);
  CHECK(x == 0);
  CHECK(g->nodes[x].type.stride[0] == 4 && g->nodes[x].type.stride[1] == 1);
  CHECK(evt_input(g, "x", EVT_F32, 2, s) == -1);
  CHECK(strstr(evt_graph_error(g), "defined twice") != NULL);
  CHECK(evt_add_op(g, "nosuchop", &x, 1, NULL, 0) == -1);
  CHECK(evt_graph_set_loss(g, x) == EVT_ERR_TYPE);
  evt_graph_free(g);
}

TEST(graph_name_index_survives_renames_and_renumbering) {
  evt_graph *g = evt_graph_new("t");
  int64_t s[1] = {4};
  int x = evt_input(g, "x", EVT_F32, 1, s);
  int prev = x;
  for (int i = 0; i < 300; i++) prev = evt_add_op(g, "relu", &prev, 1, NULL, 0);
  CHECK(prev == 300);
  CHECK(evt_graph_find(g, "x") == 0);
  CHECK(evt_graph_find(g, g->nodes[150].name) == 150);
  CHECK(evt_graph_find(g, "nope") == -1);
  /* swap two names behind the index's back, as a rewrite does */
  const char *a = g->nodes[10].name, *b = g->nodes[20].name;
  g->nodes[10].name = b;
  g->nodes[20].name = a;
  CHECK(evt_graph_find(g, a) == 20);
  CHECK(evt_graph_find(g, b) == 10);
  /* truncate (a rolled-back build): names of dropped nodes are gone */
  const char *dropped = g->nodes[299].name;
  g->nnodes = 200;
  CHECK(evt_graph_find(g, dropped) == -1);
  CHECK(evt_graph_set_name(g, 5, "renamed") == EVT_OK);
  CHECK(evt_graph_find(g, "renamed") == 5);
  evt_graph_free(g);
}
