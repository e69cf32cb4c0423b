/* evt — a compiler for deep-learning training steps (ASPLOS'24 "Epilogue Visitor Tree" and beyond).
 *
 * This is the one public header. A training step is a tensor graph: build it with the calls below (or
 * parse it from the `.evt` text format), let evt add the backward (the *joint* graph), and run it on the
 * CPU interpreter (the reference every other backend is checked against).
 *
 * Worked example: a linear layer with a cross-entropy loss, one SGD step (tests/c/test_api_example.c
 * compiles and runs exactly this).
 *
 *     evt_graph *g = evt_graph_new("linear");
 *     int64_t xs[] = {32, 64}, ws[] = {64, 10}, ys[] = {32};
 *     int x = evt_input(g, "x", EVT_F32, 2, xs);
 *     int w = evt_param(g, "w", EVT_F32, 2, ws);
 *     int y = evt_input(g, "y", EVT_I64, 1, ys);
 *     int logits = evt_add_op(g, "mm", (int[]){x, w}, 2, NULL, 0);
 *     int loss = evt_add_op(g, "cross_entropy", (int[]){logits, y}, 2, NULL, 0);
 *     if (loss < 0) { fprintf(stderr, "%s\n", evt_graph_error(g)); return 1; }
 *     evt_graph_set_loss(g, loss);
 *     evt_graph_build_joint(g, 0);                   // outputs: loss, then d loss / d w ("grad.w")
 *     evt_graph_print(g, stdout);                    // the joint graph as text
 *
 *     evt_tensor *v = calloc(evt_graph_node_count(g), sizeof *v);   // one slot per node
 *     evt_interp_init_inputs(g, v, 0);               // x ~ N(0,1), w ~ N(0,1); labels are ours:
 *     for (int i = 0; i < 32; i++) v[y].data[i] = i % 10;
 *     if (evt_interp_run(g, v, 0, 0) != EVT_OK) { fprintf(stderr, "%s\n", evt_graph_error(g)); return 1; }
 *     int gw = evt_graph_output(g, 1);               // the gradient of w
 *     for (int64_t i = 0; i < v[w].numel; i++) v[w].data[i] -= 0.1 * v[gw].data[i];   // SGD
 *     for (int i = 0; i < evt_graph_node_count(g); i++) evt_tensor_free(&v[i]);
 *     free(v);
 *     evt_graph_free(g);
 *
 * Errors: calls that can fail return an evt_status (or -1 for a node id) and leave a message on the graph,
 * `file:line:col: node %name (op): what went wrong`, readable with evt_graph_error().
 */
#ifndef EVT_H
#define EVT_H

#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum evt_status {
  EVT_OK = 0,
  EVT_ERR_PARSE,        /* malformed text */
  EVT_ERR_TYPE,         /* shape / dtype / attribute error at a node */
  EVT_ERR_INVALID,      /* bad argument to an API call */
  EVT_ERR_IO,           /* file could not be read or written */
  EVT_ERR_UNSUPPORTED,  /* valid request evt cannot do (yet); the message says what */
  EVT_ERR_INTERNAL,     /* a bug in evt */
} evt_status;

/* f8e4m3 / f8e5m2: the OCP FP8 formats (docs/text-format.md); a cast to them saturates to +-max. */
typedef enum evt_dtype {
  EVT_F32 = 0, EVT_F16, EVT_BF16, EVT_I64, EVT_I32, EVT_BOOL, EVT_F8E4M3, EVT_F8E5M2, EVT_DTYPE_COUNT
} evt_dtype;

#define EVT_MAX_RANK 6
#define EVT_MAX_INPUTS 8

typedef struct evt_graph evt_graph;

/* ---- graphs ---------------------------------------------------------------------------------------- */
evt_graph *evt_graph_new(const char *name);
void evt_graph_free(evt_graph *g);
const char *evt_graph_error(const evt_graph *g);    /* message of the last failed call, "" if none */
int evt_graph_node_count(const evt_graph *g);

/* Parse `.evt` text (filename is used in messages). Returns NULL and writes the message to *err (caller
 * frees with free()) on failure. */
evt_graph *evt_parse(const char *text, const char *filename, char **err);
evt_graph *evt_parse_file(const char *path, char **err);
evt_status evt_graph_print(const evt_graph *g, FILE *out);
char *evt_graph_to_string(const evt_graph *g);      /* malloc'd text; free() it */
evt_status evt_graph_verify(evt_graph *g);           /* full re-check of every node and the outputs */

/* ---- building -------------------------------------------------------------------------------------- */
/* An attribute for evt_add_op: name as in the text format; set exactly one of i / f / list (n values). */
typedef struct evt_attr {
  const char *name;
  int64_t i;
  double f;
  int n;                    /* >0: list attribute with n values in list[]; -1: float attribute in f */
  int64_t list[EVT_MAX_RANK];
} evt_attr;
#define EVT_ATTR_INT(nm, v) ((evt_attr){.name = (nm), .i = (v)})
#define EVT_ATTR_FLOAT(nm, v) ((evt_attr){.name = (nm), .f = (v), .n = -1})

/* Adds a node of op `op` (its text name, e.g. "mm"); returns its id, or -1 with a message on the graph. */
int evt_add_op(evt_graph *g, const char *op, const int *inputs, int ninputs, const evt_attr *attrs, int nattrs);
int evt_input(evt_graph *g, const char *name, evt_dtype dt, int rank, const int64_t *shape);
int evt_param(evt_graph *g, const char *name, evt_dtype dt, int rank, const int64_t *shape);
evt_status evt_graph_set_name(evt_graph *g, int node, const char *name);
evt_status evt_graph_set_loss(evt_graph *g, int node);      /* also makes it the first output */
evt_status evt_graph_add_output(evt_graph *g, int node);
int evt_graph_output_count(const evt_graph *g);
int evt_graph_output(const evt_graph *g, int i);            /* node id of output i, or -1 */

/* ---- autodiff -------------------------------------------------------------------------------------- */
#define EVT_GRAD_INPUTS 1u  /* also differentiate w.r.t. floating-point inputs, not only params */
/* Appends the backward of the loss to g. Outputs become: loss, then d loss / d p for every floating-point
 * param in node order (then every floating input with EVT_GRAD_INPUTS); integer and bool params get no
 * gradient, as in PyTorch. Gradient nodes are named "grad.<param name>".
 * A param the loss does not depend on (differentiably) gets a zeros `full`; other forward outputs are
 * dropped. Fails with EVT_ERR_INVALID (no loss, loss not a floating scalar, a name grad.<p> already taken)
 * or EVT_ERR_UNSUPPORTED (an op without a gradient rule between the loss and a param, or the values of a
 * spmm), naming the node; g is then left as it was. New nodes carry the origin "grad of %<node>". */
evt_status evt_graph_build_joint(evt_graph *g, unsigned flags);

/* ---- the CPU interpreter (reference) --------------------------------------------------------------- */
/* A host tensor: contiguous, row-major; values of every dtype held as doubles: integers exactly, which a double
 * does within +-(2^53 - 1); evt_interp_run reports an i64 value past that (EVT_ERR_UNSUPPORTED) instead of
 * rounding it, and an integer slot the caller fills must hold integers of its dtype. */
typedef struct evt_tensor {
  evt_dtype dtype;
  int rank;
  int64_t shape[EVT_MAX_RANK];
  int64_t numel;
  double *data;
} evt_tensor;

evt_status evt_tensor_alloc(evt_tensor *t, evt_dtype dt, int rank, const int64_t *shape);
void evt_tensor_free(evt_tensor *t);

#define EVT_RUN_FP64 1u      /* compute and store every float in fp64 (gradient checks): no rounding */
/* Runs the graph. values[] has one slot per node: the caller fills the input/param slots (shape and dtype
 * must match), the interpreter fills the rest; outputs stay, other intermediates are freed after their
 * last use unless keep_all. Deterministic. */
evt_status evt_interp_run(evt_graph *g, evt_tensor *values, unsigned flags, int keep_all);
/* Fills every input/param slot from the node's init attributes with a counter-based generator. */
evt_status evt_interp_init_inputs(evt_graph *g, evt_tensor *values, uint64_t seed);
/* The RNG step of the graph's later interpreter runs (default 0): rand and dropout draw element i with the
 * Philox counter (offset + i, step), so a training loop that sets step k before step k's run gets fresh
 * dropout masks every step, the ones a GPU program draws in its k-th run (evt_program_set_rng_step). */
void evt_graph_set_rng_step(evt_graph *g, uint64_t step);
uint64_t evt_graph_rng_step(const evt_graph *g);

/* ---- running a step on the GPU (src/runtime/program.c) ---------------------------------------------
 * A program is a graph compiled for the GPU: optimized (unless EVT_PROGRAM_NO_OPT), partitioned, lowered,
 * its fused groups JIT-compiled (cache $EVT_CACHE_DIR/jit, docs/config.md) and loaded, its intermediates planned by liveness
 * in one device arena. The caller owns the memory of every input, param and graph output: dense row-major
 * in the node's dtype (bf16/f16 as 16-bit, f32, i64 for integer inputs, u8 for bool, f8e4m3 / f8e5m2 as the
 * one-byte codes of PyTorch's float8_e4m3fn / float8_e5m2), bound before a run.
 * A run enqueues the whole step on the caller's stream (cudaStream_t; NULL = the legacy default stream)
 * and returns without synchronizing; with EVT_PROGRAM_CUDA_GRAPH the step is captured once as a CUDA graph
 * and replayed (captured again when a binding changed). Needs libevt_fallback.so and a CUDA device;
 * otherwise EVT_ERR_UNSUPPORTED with the reason in evt_program_error / the graph's error. Errors of a run
 * name the group or node. g must outlive the program (the program may optimize g in place).
 * Outputs must not alias inputs or params. The first run of a CUDA-graph program runs eagerly (it loads
 * kernels and workspaces), later runs replay the captured graph. The first run of a fused program whose
 * tuning records leave a GEMM group's fusion open (the unfused pair measured faster, or within 10%) also
 * times the whole step with each implementation and keeps the faster (in-step A/B: ~24 extra runs per such
 * problem, synchronizing the stream; an `[evt-ab]` line each on stderr; outputs as of one run; not while the
 * stream is being captured; EVT_FUSION_AB=0 turns it off). A program runs one step at a time: runs
 * on different streams must be ordered by the caller. An index out of range at run time (embedding,
 * one_hot, spmm) is skipped by the kernel and flagged on the device, not reported by evt_program_run
 * (`evtc run --device cuda` synchronizes and reports it). Launch count: known after the first run.
 *
 * Example (examples/c/train_step.c builds and runs it; error checks shortened):
 *
 *     evt_program *p;
 *     if (evt_program_create(g, EVT_PROGRAM_FUSED | EVT_PROGRAM_CUDA_GRAPH, &p) != EVT_OK)
 *       fprintf(stderr, "%s\n", evt_graph_error(g));      // e.g. "no CUDA device: ..."
 *     cudaMalloc(&dx, 32 * 64 * 4); cudaMalloc(&dw, 64 * 10 * 4); cudaMalloc(&dy, 32 * 8);   // f32, f32, i64
 *     cudaMalloc(&dloss, 4); cudaMalloc(&dgw, 64 * 10 * 4);
 *     evt_program_bind(p, "x", dx); evt_program_bind(p, "w", dw); evt_program_bind(p, "y", dy);
 *     evt_program_bind_output(p, 0, dloss); evt_program_bind_output(p, 1, dgw);            // loss, grad.w
 *     for (int step = 0; step < 100; step++) {
 *       if (evt_program_run(p, stream) != EVT_OK) fprintf(stderr, "%s\n", evt_program_error(p));
 *       evt_program_sgd(p, 0.5, stream);                       // w -= 0.5 * grad.w on the device
 *     }
 *     cudaStreamSynchronize(stream);
 *     evt_program_destroy(p);                                  // the caller frees its buffers */
typedef struct evt_program evt_program;
#define EVT_PROGRAM_FUSED 1u       /* run lowered groups as generated kernels (else node by node) */
#define EVT_PROGRAM_CUDA_GRAPH 2u  /* capture the step as a CUDA graph, replay it */
#define EVT_PROGRAM_NO_OPT 4u      /* skip the graph passes (g is run as given) */
/* Options of a program: everything evt's compile driver can be told, in one place (the torch backend's
 * options= dict maps onto it; environment variables hold only paths, see docs/config.md). Start from
 * evt_options_init, which sets the defaults below. */
typedef struct evt_options {
  unsigned flags;       /* EVT_PROGRAM_*: default EVT_PROGRAM_FUSED */
  /* A group the lowering refuses, split around the node it names so the rest still runs as one generated
   * kernel: 0 off (default), 1 one node per round, 2 also every smaller per-channel member of such a group at
   * once (batch-norm statistics beside their apply: fewer partitioner rounds). */
  int refine_partition;
  /* The in-step A/B of fusion at a program's first run (the whole step timed with each implementation of a
   * GEMM group whose tuning records leave fused-vs-unfused open, the faster kept): 0 off, 1 on (default),
   * 2 also every other GEMM group with an epilogue the unfused pair can run. */
  int fusion_ab;
  /* GPU target of the generated kernels: 80, 86 or 89 (Ampere / Ada: CUTLASS 2.x GEMMs with Sm80 visitor trees, row
   * kernels without programmatic dependent launches) or 90 (sm_90a, Hopper: CUTLASS Sm90 collectives); 0 (default):
   * the present GPU's, else 90. */
  int arch;
  /* 1: generated kernels are compiled to PTX only (compute_XX, or compute_90a), which the driver JIT-compiles for the
   * GPU present. 0: machine code for `arch` - unless a GPU is present whose own arch differs (sm_80 kernels run on a
   * Hopper), where PTX is used all the same. */
  int ptx;
  /* FP8 training (opt-in; docs/passes.md "fp8", docs/pytorch.md "FP8 (opt-in)"): EVT_FP8_OFF (default) or
   * EVT_FP8_TENSORWISE: the graph passes run the eligible GEMMs in FP8 with per-tensor current scaling (e4m3
   * forward operands, e5m2 gradients; the loss layer and small GEMMs stay as they are). A device program runs
   * it: generated kernels for the fp8 GEMMs (sm_90a) and row groups, the kernel library for the rest. */
  int fp8;
  /* GEMMs of f32 operands (docs/codegen.md "TF32"): 0 (default) exact f32, such GEMMs run on cuBLAS without TF32 and
   * get no generated epilogue; 1: they lower like 16-bit ones onto TF32 tensor cores (operands rounded to 10 mantissa
   * bits, f32 accumulation; sm_90a, K-major operands), as PyTorch's torch.backends.cuda.matmul.allow_tf32 allows. The
   * CPU interpreter stays exact; `--check` then compares within the TF32 tolerance. */
  int tf32;
} evt_options;
enum { EVT_FP8_OFF = 0, EVT_FP8_TENSORWISE = 1 };
void evt_options_init(evt_options *o);
/* Parses a GPU target as `evtc --arch` and the PyTorch backend's "arch" option write it: "sm_80", "sm_86", "sm_89",
 * "sm_90a" (or "sm_90"), "compute_80" / "compute_86" / "compute_89" / "compute_90a" (the same target, PTX only), or
 * "auto" (0: the present GPU's). EVT_OK with *arch and *ptx set, else EVT_ERR_INVALID. */
evt_status evt_arch_parse(const char *text, int *arch, int *ptx);
/* The fused plan evt would run for g with these options, without a GPU, as JSON text (malloc'd; free() it):
 * {"nodes", "groups": [{"group", "kind" (gemm+evt / row / pointwise / unfused / conv+evt), "path" (generated / cublas /
 * cublaslt / cublas+row / node-by-node), "members", "ops" (the members' ops, "mm+add+gelu"), "m", "n", "k",
 * "kernel", "io_bytes" (fused: the distinct tensors its kernel reads or writes, bytes), "why" (node by node: the
 * reason), "nodes" (the members' names), "out_numel" (the largest member output's elements), "conv" (conv+evt
 * only: its geometry, "conv fprop n 4 h 8 w 8 c 16 o 16 kernel 3x3 ...")}], "kernels" (launches per step), "bytes" (through global memory
 * per step), "unfused_kernels" and "unfused_bytes" (every op its own kernel), "arena_bytes" and "scratch_bytes" (the
 * device memory a run of a GPU program of it uses: its intermediates, the GEMM scratch; its arena holds both),
 * "dot" (the grouped graph as Graphviz text, one cluster per group)}. The graph passes run on g first unless o->flags has
 * EVT_PROGRAM_NO_OPT. NULL on error (message on g). */
char *evt_plan_report(evt_graph *g, const evt_options *o);
/* The plan of a created program in evt_plan_report's format, without "dot" (malloc'd; free() it); each group also
 * has "nodes" (its members' names) and "out_numel" (its largest member output's elements), as evt_plan_report's do.
 * NULL for a program without a fused plan. */
char *evt_program_report(const evt_program *p);
/* evt_program_create with options (o NULL: the defaults with o->flags = 0). */
evt_status evt_program_create_opts(evt_graph *g, const evt_options *o, evt_program **out);
evt_status evt_program_create(evt_graph *g, unsigned flags, evt_program **out);
/* Optional, before creating several programs: JIT-compiles in one parallel batch every generated kernel that
 * evt_program_create(graphs[i], flags) would compile (deduplicated across graphs; results in the JIT cache),
 * so the creations that follow only load them. Needs nvcc, not a GPU. Problems are left to the creations to
 * report. Returns the number of distinct kernels now compiled or cached (0 without EVT_PROGRAM_FUSED). */
int evt_program_prefetch(evt_graph *const *graphs, int n, unsigned flags);
int evt_program_prefetch_opts(evt_graph *const *graphs, int n, const evt_options *o);
/* Optional, before creating programs (and before evt_program_prefetch): autotunes every GEMM+EVT group that
 * evt_program_create(graphs[i], flags) would run - the distinct (epilogue, shape) problems across the graphs:
 * candidate mainloop configs x tile-scheduler variants against the unfused cuBLAS alternative, the fastest
 * checked against the CPU reference (`evtc tune`, docs/codegen.md) - and writes the records the creations
 * then apply (in $EVT_CACHE_DIR/tune). Problems that have a record of at
 * least as many configs are not measured again, so a second process costs nothing. max_configs caps the
 * candidate configs per kernel (0: all, ~10; each is a CUTLASS compile); 1 measures the untuned config's
 * kernel (the one the program compiles anyway) at its scheduler variants against the unfused alternative
 * (seconds; the torch backend's default on a GPU) and skips the groups a rule already runs unfused (long K
 * over few output tiles). Needs nvcc, CUTLASS and a GPU; minutes of compiling for more configs. Returns EVT_OK
 * when every problem has a record, else the first failure with its reason in msg (no GPU:
 * EVT_ERR_UNSUPPORTED, nothing written). *nproblems (may be NULL): the distinct problems found. */
evt_status evt_program_tune(evt_graph *const *graphs, int n, unsigned flags, int max_configs, int *nproblems,
                            char *msg, size_t msglen);
evt_status evt_program_tune_opts(evt_graph *const *graphs, int n, const evt_options *o, int max_configs,
                                 int *nproblems, char *msg, size_t msglen);
/* Binds device memory to an input or param, by node name. */
evt_status evt_program_bind(evt_program *p, const char *name, void *device_ptr);
/* Binds device memory to graph output i (evt_graph_output order of the graph passed to create). */
evt_status evt_program_bind_output(evt_program *p, int i, void *device_ptr);
evt_status evt_program_run(evt_program *p, void *cuda_stream);
/* The arena: device memory for the values a run computes and drops, the GEMM scratch and the kernel library's
 * scratch (every byte is written before it is read within the run, so nothing in it outlives a run). A run that
 * finds none bound allocates the program's own (once; create allocates none); a caller with a caching allocator
 * may give it memory instead, per run if it likes: evt_program_bind_arena frees the program's own arena, if
 * any, and uses device_ptr (at least evt_program_arena_bytes bytes, 256-byte aligned; the caller keeps it alive
 * until the run is done on the stream); NULL returns to an arena of the program's own, allocated by the next
 * run. A different pointer re-captures a CUDA graph like any binding. A run that must re-plan its memory beyond
 * the caller's bytes allocates its own again (evt_program_arena_bytes then tells the new size). */
int64_t evt_program_arena_bytes(const evt_program *p);
evt_status evt_program_bind_arena(evt_program *p, void *device_ptr, int64_t bytes);
/* RNG: a graph's rand / dropout draw with a step (kernels/philox.h). A program's first run uses the graph's
 * step at create (evt_graph_set_rng_step, default 0) and every run advances it by one, on the device (a
 * CUDA-graph replay too), so each training step gets fresh dropout masks: run k (from 0) draws what the
 * interpreter draws with step first + k. evt_program_set_rng_step sets the step of the next run (enqueued
 * on the stream; e.g. to repeat a step); evt_program_rng_step returns it as enqueued. */
evt_status evt_program_set_rng_step(evt_program *p, uint64_t step, void *cuda_stream);
uint64_t evt_program_rng_step(const evt_program *p);
/* Optional, after a run: one SGD step on the device, enqueued on cuda_stream (no synchronization; may be
 * captured into the caller's own CUDA graph): for every param %w with a graph output %grad.w (the joint
 * graph's gradients), w -= lr * grad.w in the memory bound to both, elementwise in double and rounded to w's
 * dtype - the arithmetic of `evtc run`'s CPU update, so a training loop on the GPU follows it bit for bit
 * given the same gradients. Params that are not floating (f32, f16, bf16, fp8) are left alone. EVT_ERR_INVALID
 * for lr < 0 or not finite, an unbound input/param/output, or a graph without gradient outputs. */
evt_status evt_program_sgd(evt_program *p, double lr, void *cuda_stream);
const char *evt_program_error(const evt_program *p);   /* message of the last failed call, "" if none */
/* Kernel launches one run enqueues (generated + library kernels; memsets and copies not counted). */
int evt_program_launch_count(const evt_program *p);
void evt_program_destroy(evt_program *p);

#ifdef __cplusplus
}
#endif
#endif
