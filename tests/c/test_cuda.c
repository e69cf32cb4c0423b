/* The CUDA runtime's host side without a GPU: the --check metric, and a clean "no CUDA device" when the
 * kernel library cannot be loaded. */
#include "compile/compile.h"
#include "test.h"
#include "compile/train.h"

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

/* The library's node description (evt_gpu_fb_node, also what it reserves scratch for before a step) carries
 * the attributes (a causal attention's cuDNN plans are the causal ones) and, on attention gradients, which of
 * the three the graph computes from the same inputs (the library then runs one cuDNN backward for them). */
TEST(cuda_fb_node_carries_attention_attributes_and_siblings) {
  char *err = NULL;
  evt_graph *g = evt_parse_file("tests/golden/grad/attention.evt", &err);
  CHECK_MSG(g, "%s", err ? err : "");
  free(err);
  if (!g) return;
  CHECK(evt_train_ensure_joint(g, NULL) == EVT_OK);
  evt_program p;
  memset(&p, 0, sizeof p);
  p.g = g;
  p.t = calloc((size_t)g->nnodes + 1, sizeof *p.t);
  int fwd = 0, bwd = 0;
  for (int i = 0; i < g->nnodes; i++) {
    evt_op op = g->nodes[i].op;
    if (op != EVT_OP_SDPA && op != EVT_OP_SDPA_BACKWARD_Q && op != EVT_OP_SDPA_BACKWARD_K && op != EVT_OP_SDPA_BACKWARD_V)
      continue;
    evt_fb_node fn;
    evt_gpu_fb_node(&p, i, &fn);
    CHECK(fn.id == i && fn.op == (int)op && fn.a.causal == 1);
    if (op == EVT_OP_SDPA) { /* the forward: the gradients of its q, k, v */
      fwd++;
      CHECK_MSG(fn.a.sdpa_siblings == 7, "forward: %d", fn.a.sdpa_siblings);
    } else {
      bwd++;
      CHECK_MSG(fn.a.sdpa_siblings == 7, "node %d: siblings %d", i, fn.a.sdpa_siblings);
    }
  }
  CHECK(fwd == 1 && bwd == 3);
  /* a gradient whose inputs differ from the others' is not their sibling */
  for (int i = 0; i < g->nnodes; i++)
    if (g->nodes[i].op == EVT_OP_SDPA_BACKWARD_V) {
      g->nodes[i].attr.causal = 0;
      for (int j = 0; j < g->nnodes; j++)
        if (g->nodes[j].op == EVT_OP_SDPA_BACKWARD_Q) {
          evt_fb_node fn;
          evt_gpu_fb_node(&p, j, &fn);
          CHECK_MSG(fn.a.sdpa_siblings == 3, "siblings %d", fn.a.sdpa_siblings);
        }
    }
  /* a forward whose inputs no gradient reads keeps nothing */
  evt_graph *f = evt_parse("graph f {\n  %q: bf16[2,4,8,16] = input()\n  %o = sdpa(%q, %q, %q)\n"
                           "  %loss: bf16[] = sum(%o)\n}\n", "f.evt", &err);
  CHECK_MSG(f, "%s", err ? err : "");
  free(err);
  if (f) {
    evt_program pf;
    memset(&pf, 0, sizeof pf);
    pf.g = f;
    pf.t = calloc((size_t)f->nnodes + 1, sizeof *pf.t);
    for (int i = 0; i < f->nnodes; i++)
      if (f->nodes[i].op == EVT_OP_SDPA) {
        evt_fb_node fn;
        evt_gpu_fb_node(&pf, i, &fn);
        CHECK(fn.a.sdpa_siblings == 0);
      }
    free(pf.t);
    evt_graph_free(f);
  }
  free(p.t);
  evt_graph_free(g);
}
