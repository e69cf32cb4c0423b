/* The worked example at the top of include/evt.h, verbatim (as a test that it stays true), plus a check
 * that the SGD step lowers the loss. */
#include "test.h"

#include <stdlib.h>

static int worked_example(FILE *out, double *loss_before, double *loss_after) {
  evt_graph *g = evt_graph_new("linear");
  int64_t xs[] = {32, 64}, ws[] = {64, 10}, ys[] = {32};
  int x = evt_input(g, "x", EVT_F32, 2, xs);
  int w = evt_param(g, "w", EVT_F32, 2, ws);
  int y = evt_input(g, "y", EVT_I64, 1, ys);
  int logits = evt_add_op(g, "mm", (int[]){x, w}, 2, NULL, 0);
  int loss = evt_add_op(g, "cross_entropy", (int[]){logits, y}, 2, NULL, 0);
  if (loss < 0) { fprintf(stderr, "%s\n", evt_graph_error(g)); return 1; }
  evt_graph_set_loss(g, loss);
  evt_graph_build_joint(g, 0);                   // outputs: loss, then d loss / d w ("grad.w")
  evt_graph_print(g, out);                       // the joint graph as text

  evt_tensor *v = calloc(evt_graph_node_count(g), sizeof *v);   // one slot per node
  evt_interp_init_inputs(g, v, 0);               // x ~ N(0,1), w ~ N(0,1); labels are ours:
  for (int i = 0; i < 32; i++) v[y].data[i] = i % 10;
  if (evt_interp_run(g, v, 0, 0) != EVT_OK) { fprintf(stderr, "%s\n", evt_graph_error(g)); return 1; }
  int gw = evt_graph_output(g, 1);               // the gradient of w
  for (int64_t i = 0; i < v[w].numel; i++) v[w].data[i] -= 0.1 * v[gw].data[i];   // SGD
  /* -- test only: the loss before and after the step -- */
  *loss_before = v[loss].data[0];
  if (evt_interp_run(g, v, 0, 0) != EVT_OK) return 1;
  *loss_after = v[loss].data[0];
  /* -- end -- */
  for (int i = 0; i < evt_graph_node_count(g); i++) evt_tensor_free(&v[i]);
  free(v);
  evt_graph_free(g);
  return 0;
}

TEST(api_worked_example_from_header) {
  FILE *out = fopen("/dev/null", "w");
  CHECK(out != NULL);
  if (!out) return;
  double before = 0, after = 0;
  CHECK(worked_example(out, &before, &after) == 0);
  fclose(out);
  CHECK(isfinite(before) && isfinite(after));
  CHECK_MSG(after < before, "SGD step did not lower the loss: %g -> %g", before, after);
}
