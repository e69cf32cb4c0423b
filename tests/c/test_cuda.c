/* The CUDA runtime's host side without a GPU: the --check metric, and a clean "no CUDA device" when the
 * kernel library cannot be loaded. */
#include "runtime/cuda.h"
#include "test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static evt_tensor vec(const double *v, int n) {
  evt_tensor t;
  int64_t shape[1] = {n};
  evt_tensor_alloc(&t, EVT_F32, 1, shape);
  memcpy(t.data, v, sizeof(double) * (size_t)n);
  return t;
}

TEST(cuda_rel_error_metric) {
  double a[3] = {1, -2, 4}, b[3] = {1, -2, 4}, c[3] = {1, -2.04, 4}, d[3] = {1, NAN, 4}, e[3] = {1, INFINITY, 4};
  evt_tensor ta = vec(a, 3), tb = vec(b, 3), tc = vec(c, 3), td = vec(d, 3), te = vec(e, 3), tshort = vec(a, 2);
  CHECK(evt_cuda_rel_error(&ta, &tb, 0) == 0);
  CHECK_NEAR(evt_cuda_rel_error(&tc, &ta, 0), 0.04 / 4, 1e-12); /* relative to the largest magnitude, 4 */
  CHECK_NEAR(evt_cuda_rel_error(&tc, &ta, 2), 0.04 / 4, 1e-12); /* a floor below it changes nothing */
  CHECK_NEAR(evt_cuda_rel_error(&tc, &ta, 8), 0.04 / 8, 1e-12); /* a floor above it is the denominator */
  CHECK(isinf(evt_cuda_rel_error(&td, &ta, 8)));                /* NaN never passes, either side */
  CHECK(isinf(evt_cuda_rel_error(&ta, &td, 8)));
  CHECK(isinf(evt_cuda_rel_error(&te, &ta, 8)));                /* an unmatched infinity */
  CHECK(evt_cuda_rel_error(&te, &te, 0) == 0);
  CHECK(isinf(evt_cuda_rel_error(&tshort, &ta, 0)));            /* size mismatch */
  evt_tensor *all[] = {&ta, &tb, &tc, &td, &te, &tshort};
  for (int i = 0; i < 6; i++) evt_tensor_free(all[i]);
}

TEST(cuda_open_without_library_is_unsupported) {
  char *err = NULL;
  evt_graph *g = evt_parse("graph g {\n  %w: f32[4] = param(init=ones)\n  %t: f32[4] = input(init=zeros)\n"
                           "  %loss: f32[] = mse_loss(%w, %t)\n  loss %loss\n}\n", "t.evt", &err);
  CHECK(g != NULL);
  const char *old = getenv("EVT_FALLBACK_LIB");
  char *saved = old ? strdup(old) : NULL;
  setenv("EVT_FALLBACK_LIB", "/nonexistent/libevt_fallback.so", 1);
  evt_cuda *c = (evt_cuda *)1;
  CHECK(evt_cuda_open(g, &c) == EVT_ERR_UNSUPPORTED);
  CHECK(c == NULL);
  CHECK(strstr(evt_graph_error(g), "no CUDA device") != NULL);
  if (saved) setenv("EVT_FALLBACK_LIB", saved, 1);
  else unsetenv("EVT_FALLBACK_LIB");
  free(saved);
  free(err);
  evt_graph_free(g);
}

/* Every pair of buffers alive at the same time (lifetimes recomputed here from the contract in cuda.h)
 * occupies disjoint bytes, for every example's joint graph; and the arena reuses memory. */
TEST(cuda_arena_layout_disjoint_when_live) {
  const char *files[] = {"examples/mlp.evt", "examples/bert_layer.evt", "examples/resnet_block.evt",
                         "examples/vit.evt", "examples/gcn.evt", "examples/xmlcnn.evt"};
  for (int f = 0; f < 6; f++) {
    char *err = NULL;
    evt_graph *g = evt_parse_file(files[f], &err);
    CHECK_MSG(g != NULL, "%s: %s (run from the repository root)", files[f], err ? err : "");
    free(err);
    if (!g) continue;
    bool built = false;
    CHECK(evt_train_ensure_joint(g, &built) == EVT_OK);
    int n = g->nnodes;
    int64_t *off = calloc((size_t)n, sizeof *off), naive = 0;
    int *first = calloc((size_t)n, sizeof *first), *last = calloc((size_t)n, sizeof *last);
    int64_t *bytes = calloc((size_t)n, sizeof *bytes);
    int64_t arena = evt_cuda_arena_layout(g, off, &naive);
    CHECK(arena > 0 && arena < naive);
    static const int64_t sz[] = {4, 2, 2, 8, 4, 1};
    for (int i = 0; i < n; i++) {
      const evt_node *nd = &g->nodes[i];
      bool whole = nd->op == EVT_OP_INPUT || nd->op == EVT_OP_PARAM || (nd->flags & EVT_NODE_OUTPUT);
      first[i] = whole ? -1 : i;
      last[i] = whole ? n : i;
      int64_t numel = 1;
      for (int d = 0; d < nd->type.rank; d++) numel *= nd->type.shape[d];
      bytes[i] = numel * sz[nd->type.dtype];
      CHECK(off[i] % 256 == 0 && off[i] + bytes[i] <= arena);
    }
    for (int i = 0; i < n; i++)
      for (int j = 0; j < g->nodes[i].ninputs; j++)
        if (last[g->nodes[i].inputs[j]] < i) last[g->nodes[i].inputs[j]] = i;
    int bad = 0;
    for (int a = 0; a < n; a++)
      for (int b = a + 1; b < n; b++)
        if (first[a] <= last[b] && first[b] <= last[a] && bytes[a] && bytes[b] && off[a] < off[b] + bytes[b] &&
            off[b] < off[a] + bytes[a])
          bad++;
    CHECK_MSG(bad == 0, "%s: %d live pairs share bytes", files[f], bad);
    free(off);
    free(first);
    free(last);
    free(bytes);
    evt_graph_free(g);
  }
}
