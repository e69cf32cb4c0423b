/* GPU check: a fused program follows a CSR adjacency that changes in place between runs; run by tests/gpu/run.sh
 * (program group).
 *
 *   adjacency_check FILE.evt   (a graph whose spmm / spmm_t read the inputs %adj.rowptr and %adj.col, as gcn's)
 *
 * The spmm_t groups of FILE's joint graph run as generated row kernels over A^T's CSR, which the runtime builds on the
 * device from rowptr / col at every run (kernels/fallback/csr.cu), so nothing may go stale when the caller writes a
 * new adjacency into the same buffers. For the fused program, eager and as a CUDA graph: run two steps with the file's
 * adjacency, write another one (other row lengths, an empty row, a long column, the same nnz) into the same device
 * memory, run once more (with a CUDA graph: a replay, nothing re-bound) and compare every output with the interpreter
 * on the new adjacency by `evtc run --check`'s rule (evt_check_step). One ok / FAIL line per mode, then
 * "N passed, N failed"; exit 1 on a failure. */
#include "evt.h"
#include "compile/compile.h"
#include "compile/train.h"
#include "ir/ir.h"

#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"

static int passed, failed;

/* t's values in its native dtype (f32, bf16, i64, i32; the dtypes of gcn's tensors), into out. */
static bool to_native(const evt_tensor *t, void *out) {
  for (int64_t i = 0; i < t->numel; i++) {
    double v = evt_round_to_dtype(t->data[i], t->dtype);
    float f = (float)v;
    uint32_t x;
    memcpy(&x, &f, 4);
    switch (t->dtype) {
    case EVT_F32: ((float *)out)[i] = f; break;
    case EVT_BF16: ((uint16_t *)out)[i] = (uint16_t)(x >> 16); break;
    case EVT_I64: ((int64_t *)out)[i] = (int64_t)v; break;
    case EVT_I32: ((int32_t *)out)[i] = (int32_t)v; break;
    default: return false;
    }
  }
  return true;
}

static double native_value(const void *p, evt_dtype dt, int64_t i) {
  uint32_t x = dt == EVT_BF16 ? (uint32_t)((const uint16_t *)p)[i] << 16 : 0;
  float f;
  memcpy(&f, &x, 4);
  return dt == EVT_F32 ? ((const float *)p)[i] : dt == EVT_BF16 ? f : dt == EVT_I64 ? (double)((const int64_t *)p)[i]
                                                                                     : ((const int32_t *)p)[i];
}

/* Another adjacency of the same m rows, k columns and nnz entries: row 0 empty, row lengths and columns drawn from a
 * fixed generator, every third entry in column k / 2 (a long column). */
static void other_adjacency(evt_tensor *rowptr, evt_tensor *col, int64_t k) {
  int64_t m = rowptr->numel - 1, nnz = col->numel;
  uint64_t s = 12345;
#define NEXT() (s = s * 6364136223846793005ull + 1442695040888963407ull, s >> 33)
  int64_t *count = calloc((size_t)m + 1, sizeof *count);
  for (int64_t q = 0; q < nnz && m > 1; q++) count[1 + (int64_t)(NEXT() % (uint64_t)(m - 1))]++;
  rowptr->data[0] = 0;
  for (int64_t i = 0; i < m; i++) rowptr->data[i + 1] = rowptr->data[i] + (double)(m > 1 ? count[i] : i == 0 ? nnz : 0);
  for (int64_t q = 0; q < nnz; q++) col->data[q] = (double)(q % 3 == 0 ? k / 2 : (int64_t)(NEXT() % (uint64_t)k));
#undef NEXT
  free(count);
}

/* Fused spmm_t groups of p's plan. */
static int fused_spmm_t(const evt_program *p) {
  int n = 0;
  for (int gi = 0; p->xp && gi < p->xp->ngroups; gi++)
    n += p->xp->groups[gi].fused && p->xp->low.k[gi].rspec.nucleus == EVT_ROWN_SPMM && p->xp->low.k[gi].rspec.has_perm;
  return n;
}

typedef struct device_io {
  void **in, **out; /* per node: its bound memory; per output: the caller's memory */
} device_io;

/* Uploads input / param v's values (by name from v0) and binds them; false with a message. */
static bool bind_inputs(evt_program *p, evt_graph *g, const evt_graph *g0, const evt_tensor *v0, device_io *io) {
  for (int v = 0; v < g->nnodes; v++) {
    const evt_node *nd = &g->nodes[v];
    if (nd->op != EVT_OP_INPUT && nd->op != EVT_OP_PARAM) continue;
    int u = evt_graph_find(g0, nd->name);
    size_t bytes = (size_t)evt_type_numel(&nd->type) * evt_dtype_size(nd->type.dtype);
    void *host = malloc(bytes + 1);
    bool ok = u >= 0 && v0[u].numel == evt_type_numel(&nd->type) && to_native(&v0[u], host);
    if (ok) {
      CUDA_CHECK(cudaMalloc(&io->in[v], bytes + 1));
      CUDA_CHECK(cudaMemcpy(io->in[v], host, bytes, cudaMemcpyHostToDevice));
    }
    free(host);
    if (!ok || evt_program_bind(p, nd->name, io->in[v]) != EVT_OK) {
      printf("   input %%%s: no value in a supported dtype, or not bound: %s\n", nd->name, evt_program_error(p));
      return false;
    }
  }
  for (int i = 0; i < evt_graph_output_count(g); i++) {
    const evt_type *t = &g->nodes[evt_graph_output(g, i)].type;
    CUDA_CHECK(cudaMalloc(&io->out[i], (size_t)evt_type_numel(t) * evt_dtype_size(t->dtype) + 1));
    if (evt_program_bind_output(p, i, io->out[i]) != EVT_OK) return false;
  }
  return true;
}

/* Writes v0's (new) adjacency into the program's bound rowptr / col memory. */
static void write_adjacency(const evt_graph *g, const evt_graph *g0, const evt_tensor *v0, device_io *io) {
  const char *names[2] = {"adj.rowptr", "adj.col"};
  for (int k = 0; k < 2; k++) {
    int v = evt_graph_find(g, names[k]), u = evt_graph_find(g0, names[k]);
    size_t bytes = (size_t)v0[u].numel * evt_dtype_size(v0[u].dtype);
    void *host = malloc(bytes + 1);
    to_native(&v0[u], host);
    CUDA_CHECK(cudaMemcpy(io->in[v], host, bytes, cudaMemcpyHostToDevice));
    free(host);
  }
}

/* The outputs against the interpreter on g with v0's inputs and the last run's RNG step. */
static bool matches_interpreter(evt_graph *g, const evt_graph *g0, const evt_tensor *v0, const device_io *io,
                                uint64_t rng_step) {
  int n = g->nnodes, no = evt_graph_output_count(g);
  evt_tensor *values = calloc((size_t)n, sizeof *values), *gpu = calloc((size_t)no, sizeof *gpu);
  for (int i = 0; i < no; i++) {
    const evt_type *t = &g->nodes[evt_graph_output(g, i)].type;
    size_t bytes = (size_t)evt_type_numel(t) * evt_dtype_size(t->dtype);
    void *host = malloc(bytes + 1);
    CUDA_CHECK(cudaMemcpy(host, io->out[i], bytes, cudaMemcpyDeviceToHost));
    evt_tensor_alloc(&gpu[i], t->dtype, t->rank, t->shape);
    for (int64_t e = 0; e < gpu[i].numel; e++) gpu[i].data[e] = native_value(host, t->dtype, e);
    free(host);
  }
  for (int v = 0; v < n; v++) {
    const evt_node *nd = &g->nodes[v];
    if (nd->op != EVT_OP_INPUT && nd->op != EVT_OP_PARAM) continue;
    const evt_tensor *src = &v0[evt_graph_find(g0, nd->name)];
    evt_tensor_alloc(&values[v], src->dtype, src->rank, src->shape);
    memcpy(values[v].data, src->data, sizeof(double) * (size_t)src->numel);
  }
  evt_graph_set_rng_step(g, rng_step);
  evt_check_result cr;
  bool ok = evt_check_step(g, values, gpu, 3, stdout, &cr) == EVT_OK && cr.mismatches == 0;
  for (int v = 0; v < n; v++) evt_tensor_free(&values[v]);
  for (int i = 0; i < no; i++) evt_tensor_free(&gpu[i]);
  free(values);
  free(gpu);
  return ok;
}

/* One mode: two steps with v0 (the file's adjacency), v1's adjacency written into the same memory, a third step, and
 * the outputs against the interpreter with v1. */
static void run_mode(const char *path, const evt_graph *g0, const evt_tensor *v0, const evt_tensor *v1, unsigned flags,
                     const char *mode) {
  char *err = NULL;
  evt_graph *g = evt_parse_file(path, &err);
  free(err);
  evt_program *p = NULL;
  bool ok = g && evt_train_ensure_joint(g, NULL) == EVT_OK && evt_program_create(g, flags, &p) == EVT_OK;
  int nt = ok ? fused_spmm_t(p) : 0, no = g ? evt_graph_output_count(g) : 0;
  device_io io = {calloc((size_t)(g ? g->nnodes : 0) + 1, sizeof(void *)), calloc((size_t)no + 1, sizeof(void *))};
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  ok = ok && nt > 0 && bind_inputs(p, g, g0, v0, &io);
  for (int k = 0; k < 2 && ok; k++) ok = evt_program_run(p, s) == EVT_OK;
  CUDA_CHECK(cudaStreamSynchronize(s));
  if (ok) write_adjacency(g, g0, v1, &io);
  ok = ok && evt_program_run(p, s) == EVT_OK;
  CUDA_CHECK(cudaStreamSynchronize(s));
  ok = ok && matches_interpreter(g, g0, v1, &io, evt_program_rng_step(p) - 1);
  printf("%s %s [%s]: %d fused spmm_t group(s), adjacency rewritten in place before run 3%s%s\n", ok ? "ok  " : "FAIL",
         path, mode, nt, p && !ok ? ": " : "", p && !ok ? evt_program_error(p) : "");
  *(ok ? &passed : &failed) += 1;
  if (p) evt_program_destroy(p);
  for (int v = 0; g && v < g->nnodes; v++)
    if (io.in[v]) CUDA_CHECK(cudaFree(io.in[v]));
  for (int i = 0; i < no; i++)
    if (io.out[i]) CUDA_CHECK(cudaFree(io.out[i]));
  free(io.in);
  free(io.out);
  CUDA_CHECK(cudaStreamDestroy(s));
  if (g) evt_graph_free(g);
}

/* k of the graph's A [m, k]: the rows of its first spmm_t's output; -1 without one. */
static int64_t spmm_t_columns(const evt_graph *g) {
  for (int v = 0; v < g->nnodes; v++)
    if (g->nodes[v].op == EVT_OP_SPMM_T) return g->nodes[v].type.shape[0];
  return -1;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: adjacency_check FILE.evt\n");
    return 2;
  }
  char *err = NULL;
  evt_graph *g0 = evt_parse_file(argv[1], &err);
  if (!g0 || evt_train_ensure_joint(g0, NULL) != EVT_OK) {
    fprintf(stderr, "%s: %s\n", argv[1], g0 ? evt_graph_error(g0) : err ? err : "parse error");
    return 2;
  }
  free(err);
  int n = g0->nnodes, rp = evt_graph_find(g0, "adj.rowptr"), cl = evt_graph_find(g0, "adj.col");
  int64_t k = spmm_t_columns(g0);
  evt_tensor *v0 = calloc((size_t)n, sizeof *v0), *v1 = calloc((size_t)n, sizeof *v1);
  if (rp < 0 || cl < 0 || k < 1 || evt_interp_init_inputs(g0, v0, 0) != EVT_OK || evt_interp_init_inputs(g0, v1, 0) != EVT_OK) {
    fprintf(stderr, "%s: no %%adj.rowptr / %%adj.col inputs, no spmm_t, or no initial values\n", argv[1]);
    return 2;
  }
  other_adjacency(&v1[rp], &v1[cl], k);
  run_mode(argv[1], g0, v0, v1, EVT_PROGRAM_FUSED, "fused");
  run_mode(argv[1], g0, v0, v1, EVT_PROGRAM_FUSED | EVT_PROGRAM_CUDA_GRAPH, "fused+graph");
  for (int v = 0; v < n; v++) evt_tensor_free(&v0[v]), evt_tensor_free(&v1[v]);
  free(v0);
  free(v1);
  evt_graph_free(g0);
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
