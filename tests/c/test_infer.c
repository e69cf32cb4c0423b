/* Shape/dtype inference (src/ir/infer.c) and the verifier (src/ir/verify.c): for every op a valid case
 * with its inferred type, and for every rule family an invalid case that fails with EVT_ERR_TYPE and a
 * message naming the node. Graphs are built with the public builder. */
#include "test.h"

#include <string.h>

#define SHP(...) ((int64_t[]){__VA_ARGS__})
#define INS(...) ((int[]){__VA_ARGS__})
#define NIN(...) (int)(sizeof((int[]){__VA_ARGS__}) / sizeof(int))

/* Checks node id has type dt[shape...]. */
static bool has_type(evt_graph *g, int id, evt_dtype dt, int rank, const int64_t *shape) {
  if (id < 0 || id >= g->nnodes) return false;
  const evt_type *t = &g->nodes[id].type;
  if (t->dtype != dt || t->rank != rank) return false;
  for (int i = 0; i < rank; i++)
    if (t->shape[i] != shape[i]) return false;
  int64_t s = 1;
  for (int i = rank - 1; i >= 0; i--) {
    if (t->stride[i] != s) return false;
    s *= shape[i];
  }
  return true;
}
#define CHECK_TYPE(g, id, dt, rank, ...)                                                    \
  do {                                                                                      \
    char b_[128];                                                                           \
    int id_ = (id);                                                                         \
    CHECK_MSG(has_type(g, id_, dt, rank, (int64_t[]){0, __VA_ARGS__} + 1), "node %d: %s (%s)", id_, \
              id_ >= 0 ? evt_type_str(&(g)->nodes[id_].type, b_, sizeof b_) : "failed", evt_graph_error(g)); \
  } while (0)

/* Adds op expecting failure with EVT_ERR_TYPE; the message must name the node's op and contain `frag`. */
static void expect_fail(evt_graph *g, const char *op, const int *in, int nin, const evt_attr *a, int na,
                        const char *frag, const char *file, int line) {
  int id = evt_add_op(g, op, in, nin, a, na);
  const char *msg = evt_graph_error(g);
  char want[64];
  snprintf(want, sizeof want, "(%s): ", op);
  if (id >= 0) evt_test_fail(file, line, "%s unexpectedly succeeded", op);
  else if (!strstr(msg, "node %") || !strstr(msg, want) || !strstr(msg, frag))
    evt_test_fail(file, line, "%s: message '%s' lacks '%s'", op, msg, frag);
}
#define FAILS(g, op, in, nin, a, na, frag) expect_fail(g, op, in, nin, a, na, frag, __FILE__, __LINE__)

TEST(infer_mm_and_binary) {
  evt_graph *g = evt_graph_new("t");
  int x = evt_input(g, "x", EVT_F32, 2, SHP(32, 64));
  int w = evt_param(g, "w", EVT_F32, 2, SHP(64, 10));
  int w2 = evt_param(g, "w2", EVT_F32, 2, SHP(65, 10));
  CHECK_TYPE(g, evt_add_op(g, "mm", INS(x, w), 2, NULL, 0), EVT_F32, 2, 32, 10);
  FAILS(g, "mm", INS(x, w2), 2, NULL, 0, "inner dimensions differ: f32[32,64] x f32[65,10]");
  evt_graph_free(g);
}
