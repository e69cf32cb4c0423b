/* A training step on the GPU through the public program API (include/evt.h): a linear layer with a
 * cross-entropy loss, its joint graph compiled into a program, caller-owned device memory, a user stream,
 * and plain SGD on the device between steps (evt_program_sgd): only the loss comes back each step. Build:
 *   cc -Iinclude -I$CUDA/include examples/c/train_step.c -Lbuild -levt -L$CUDA/lib64 -lcudart -o train_step
 * Run with build/libevt_fallback.so reachable ($EVT_FALLBACK_LIB). Without a GPU it prints why and exits 1. */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#include "evt.h"

int main(void) {
  evt_graph *g = evt_graph_new("linear");
  int64_t xs[] = {32, 64}, ws[] = {64, 10}, ys[] = {32};
  int x = evt_input(g, "x", EVT_F32, 2, xs);
  int w = evt_param(g, "w", EVT_F32, 2, ws);
  int y = evt_input(g, "y", EVT_I64, 1, ys);
  int logits = evt_add_op(g, "mm", (int[]){x, w}, 2, NULL, 0);
  int loss = evt_add_op(g, "cross_entropy", (int[]){logits, y}, 2, NULL, 0);
  if (loss < 0 || evt_graph_set_loss(g, loss) != EVT_OK || evt_graph_build_joint(g, 0) != EVT_OK) {
    fprintf(stderr, "%s\n", evt_graph_error(g));
    return 1;
  }
  evt_program *p = NULL;
  if (evt_program_create(g, EVT_PROGRAM_FUSED | EVT_PROGRAM_CUDA_GRAPH, &p) != EVT_OK) {
    fprintf(stderr, "evt_program_create: %s\n", evt_graph_error(g));
    evt_graph_free(g);
    return 1;
  }
  /* the caller's memory: f32 x and w, i64 labels, the f32 loss and gradient (outputs 0 and 1) */
  float hx[32 * 64], hw[64 * 10], hloss = 0;
  int64_t hy[32];
  for (int i = 0; i < 32 * 64; i++) hx[i] = (float)((i * 37 % 101) - 50) / 50.0f;
  for (int i = 0; i < 64 * 10; i++) hw[i] = (float)((i * 53 % 97) - 48) / 480.0f;
  for (int i = 0; i < 32; i++) hy[i] = i % 10;
  void *dx, *dw, *dy, *dloss, *dgw;
  cudaMalloc(&dx, sizeof hx);
  cudaMalloc(&dw, sizeof hw);
  cudaMalloc(&dy, sizeof hy);
  cudaMalloc(&dloss, sizeof hloss);
  cudaMalloc(&dgw, sizeof hw);
  cudaStream_t s;
  cudaStreamCreate(&s);
  cudaMemcpyAsync(dx, hx, sizeof hx, cudaMemcpyHostToDevice, s);
  cudaMemcpyAsync(dy, hy, sizeof hy, cudaMemcpyHostToDevice, s);
  cudaMemcpyAsync(dw, hw, sizeof hw, cudaMemcpyHostToDevice, s); /* the weights stay on the device */
  evt_status st = EVT_OK;
  if (evt_program_bind(p, "x", dx) || evt_program_bind(p, "w", dw) || evt_program_bind(p, "y", dy) ||
      evt_program_bind_output(p, 0, dloss) || evt_program_bind_output(p, 1, dgw))
    st = EVT_ERR_INVALID;
  for (int step = 1; step <= 5 && st == EVT_OK; step++) {
    st = evt_program_run(p, s);                /* enqueued on s; nothing waits */
    if (st == EVT_OK) st = evt_program_sgd(p, 0.5, s); /* w -= 0.5 * grad.w, on the device, after the run */
    cudaMemcpyAsync(&hloss, dloss, sizeof hloss, cudaMemcpyDeviceToHost, s);
    cudaStreamSynchronize(s);
    printf("step %d loss %.6f (%d kernel launches)\n", step, hloss, evt_program_launch_count(p));
  }
  if (st != EVT_OK) fprintf(stderr, "evt_program: %s\n", evt_program_error(p));
  evt_program_destroy(p);
  cudaFree(dx);
  cudaFree(dw);
  cudaFree(dy);
  cudaFree(dloss);
  cudaFree(dgw);
  cudaStreamDestroy(s);
  evt_graph_free(g);
  return st == EVT_OK ? 0 : 1;
}
