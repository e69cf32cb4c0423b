/* The compile driver (src/compile/): the only place that runs passes -> partition -> lowering -> fused plan ->
 * kernels -> memory plan, for the GPU program (program.c), `evtc compile` (launch_plan.c), the prefetch and
 * tuning of many graphs (prefetch.c), and `evtc run`'s host wrapper (cuda_host.c, gpu_check.c). */
#ifndef EVT_COMPILE_H
#define EVT_COMPILE_H

#include <stdbool.h>
#include <stdio.h>

#include "runtime/gpu/cuda.h"

/* ---- arch.c: the GPU target ---------------------------------------------------------------------------- */
/* The target of o's kernels: *arch = o->arch, or (0) the present GPU's (80, 86, 89 or 90; 90 without a GPU); *ptx
 * = o->ptx, or 1 when a GPU is present whose compute capability is not *arch's (sm_80 kernels on a Hopper). */
void evt_compile_target(const evt_options *o, int *arch, int *ptx);

/* ---- program.c ------------------------------------------------------------------------------------------ */
/* The graph-pass flags (passes.h EVT_PASS_*) of these options: EVT_PASS_FP8 when o->fp8 is on. */
unsigned evt_compile_pass_flags(const evt_options *o);

/* ---- fused_plan.c: the fused plan (runtime/gpu/exec_plan.h) ------------------------------------------- */
/* Partitions (with the lowering's rules, no partition cache), lowers, refines (o->refine_partition), applies
 * the tuning records and the in-step A/B (o->fusion_ab), binds every group. o NULL: the defaults. EVT_OK, or
 * the partitioner's error (message in g's error). */
evt_status evt_exec_plan_build(evt_graph *g, const evt_options *o, evt_exec_plan *p);
/* The binding checks of one lowered group (ROW / POINTWISE and GEMM+EVT): fills x->m/n/k, in_node,
 * a/b/d_node, ptr_node; true if it can run as its generated kernel, else false with the reason in x->why
 * (naming the group and the tensor). */
bool evt_exec_bind(const evt_graph *g, const int *group, const evt_lowered *L, evt_group_exec *x);
/* A GEMM+EVT group whose epilogue is plain (D = acc, stored to a tensor) has nothing to fuse: it runs as one
 * cuBLAS call (the layouts' transposes become cuBLAS operand ops) unless a tuning record measured its CUTLASS
 * kernel faster (tuned == EVT_TUNE_FUSED); cuBLAS's host overhead per call is far lower than a launcher's.
 * Two-level batches (l_outer > 1) always keep CUTLASS. */
bool evt_exec_plain_blas(const evt_lowered *L, int tuned);
/* The tuner times each kernel alone, and there a fused kernel can read slower than inside the step while the
 * unfused pair reads the same; gains below this margin are within that error (bench/RESULTS.md). */
#define EVT_EXEC_UNFUSED_MIN_GAIN 0.10
/* Whether a group whose record measured the unfused pair faster runs the pair from the start: it measured at
 * least EVT_EXEC_UNFUSED_MIN_GAIN faster than the best fused config. With the in-step A/B this is only the
 * starting choice. */
bool evt_exec_unfused_wanted(double fused_ms, double unfused_ms);
/* A GEMM+EVT group with an epilogue whose output has at most a quarter as many tiles (of its config) as the
 * GPU has SMs while K is at least 32x its larger output dim runs the unfused pair by default: the generated
 * mainloop has no split-K, so a handful of CTAs would walk all of K, where cuBLAS splits K. */
#define EVT_EXEC_SMS 132
int64_t evt_exec_output_tiles(const evt_lowered *L, int64_t m, int64_t n);
bool evt_exec_split_k_starved(const evt_lowered *L, int64_t m, int64_t n, int64_t k);

/* ---- fused_cpu.c: the CPU model of one fused step ---------------------------------------------------- */
/* What the GPU runs, in the same order: inputs / params already in values; sources and fallback groups
 * through the interpreter node by node, fused groups through their spec's CPU reference (row:
 * evt_rspec_reference; GEMM: evt_lower_gemm_reference, batched through the launch's strides; both
 * f32-or-better inside the group, rounding only at stores), reading and writing exactly the bound tensors (a
 * scratch D in a host buffer); members a kernel does not store are left empty. Checks the bindings without a
 * GPU. */
evt_status evt_exec_plan_run_cpu(evt_graph *g, const evt_exec_plan *p, evt_tensor *values);

/* ---- kernels.c: a fused plan's kernels emitted and JIT-compiled ------------------------------------ */
/* Per kernel k of xp: the path of its compiled shared object, or NULL (it failed: its groups are demoted,
 * with the reason). Free with evt_compile_kernels_free(so, xp->nkernels). */
char **evt_compile_kernels(evt_exec_plan *xp);
void evt_compile_kernels_free(char **so, int n);

/* ---- prefetch.c: the kernels of many fused plans in one JIT batch ------------------------------------- */
typedef struct evt_pf_kernel {
  char name[40];
  int gemm;        /* 1: CUTLASS GEMM+EVT or CONV+EVT kernel (one JIT batch), 0: row / pointwise kernel */
  int conv;        /* 1: of those, a CONV+EVT kernel */
  char *source;    /* generated source (owned) */
  char users[400]; /* labels of the plans that use it */
  int arch, ptx;   /* the target its plan compiles for (evt_exec_plan.arch / ptx) */
} evt_pf_kernel;
/* Adds the distinct kernels of plan xp (labelled `label`) to ks[0..*n) (grown as needed; deduplicated by
 * name, which is the spec's hash); returns how many could not be emitted (last message in err). */
int evt_prefetch_collect(const evt_exec_plan *xp, const char *label, evt_pf_kernel **ks, int *n, int *cap, char *err,
                         size_t errlen);
/* JIT-compiles the kernels of one kind (gemm 1: CUTLASS, 0: rows) as one batch per target with the options
 * evt_program_create uses; returns how many failed (each named on errs, when not NULL). */
int evt_prefetch_compile(evt_pf_kernel *ks, int n, int gemm, FILE *errs);
void evt_prefetch_free(evt_pf_kernel *ks, int n);

/* ---- program.c --------------------------------------------------------------------------------------- */
/* Tests without a GPU: everything evt_program_create does on the host (passes, fused plan without JIT,
 * steps, layout, bindings), no library, no device memory; evt_program_run fails with EVT_ERR_UNSUPPORTED. */
evt_status evt_program_create_host(evt_graph *g, unsigned flags, evt_program **out);
evt_status evt_program_create_host_opts(evt_graph *g, const evt_options *o, evt_program **out);

/* ---- cuda_host.c: `evtc run --device cuda`'s host doubles over a program -------------------------------- */
typedef struct evt_cuda evt_cuda;

/* A program with `flags` (EVT_PROGRAM_FUSED, EVT_PROGRAM_CUDA_GRAPH) over g as given (EVT_PROGRAM_NO_OPT
 * is implied: evtc runs the passes itself, keeping the host values' node ids). evt_cuda_open: node by node. */
evt_status evt_cuda_open_flags(evt_graph *g, unsigned flags, evt_cuda **out);
/* The same with options (o->flags as above; o->arch / o->ptx: the GPU target, `evtc run --arch`). */
evt_status evt_cuda_open_opts(evt_graph *g, const evt_options *o, evt_cuda **out);
evt_status evt_cuda_open(evt_graph *g, evt_cuda **out);
/* Fused (EVT_PROGRAM_FUSED): a group that falls back gets one warning line on stderr naming it and why
 * (also through evt_cuda_open_flags). */
evt_status evt_cuda_open_fused(evt_graph *g, evt_cuda **out);
/* Uploads every input and param slot of values (double host tensors) into the program's device buffers
 * in their dtype, runs the program on its stream, reports run-time index errors (naming the node), and
 * fills the slot of every graph output that is not an input/param with the downloaded result. */
evt_status evt_cuda_step(evt_cuda *c, evt_graph *g, evt_tensor *values);
/* A training step that keeps the model on the device (evtc run's default on the GPU): the first call uploads
 * the inputs and params, later calls none; each runs the program and evt_program_sgd(lr) on the device and
 * brings back the loss only - or, with `all` (evtc run --check), every output and, before the run, the
 * params the step reads, so the interpreter can run the same step. last_ms covers the run and the update.
 * After the first call the host's param values are stale until evt_cuda_download_params. */
evt_status evt_cuda_train_step(evt_cuda *c, evt_graph *g, evt_tensor *values, double lr, bool all);
/* The device's params -> values (nothing before the first evt_cuda_train_step). */
evt_status evt_cuda_download_params(evt_cuda *c, evt_graph *g, evt_tensor *values);
/* Milliseconds of the last step's program run on the GPU (events around evt_program_run). */
double evt_cuda_last_ms(const evt_cuda *c);
const evt_program *evt_cuda_program(const evt_cuda *c);
void evt_cuda_close(evt_cuda *c);
/* Groups per path of a fused runtime (0, 0 otherwise) and group executions so far per path. */
void evt_cuda_fused_counts(const evt_cuda *c, int *fused, int *fallback, long *launched_fused, long *launched_fallback);
/* `--stats`: one line per group with the path it runs on (nothing for a node-by-node runtime). */
void evt_cuda_print_plan(const evt_cuda *c, const evt_graph *g, FILE *out);
/* Groups whose fused / unfused implementation the in-step A/B chose (exec_plan.h, EVT_FUSION_AB). */
int evt_cuda_ab_groups(const evt_cuda *c);

/* `evtc run --check`: max |gpu - cpu| over the tensor divided by max(max |cpu| of the tensor, floor_)
 * (0 when equal); +inf when either holds a NaN, when an infinity is not matched exactly, or when the sizes
 * differ. The floor keeps a tensor that is zero in exact arithmetic (rounding noise only) from failing on
 * noise: evtc passes 0.1 x the largest |gradient| of the step. */
double evt_cuda_rel_error(const evt_tensor *gpu, const evt_tensor *cpu, double floor_);

/* `evtc run --check` (src/compile/gpu_check.c): one GPU step's outputs gpu[k] (for g->outputs[k]) against the
 * CPU interpreter run on the same inputs / params (`values`: its other slots are used and released).
 * The rule, per output, with errors measured by evt_cuda_rel_error (floor: 0.1 x the step's largest |gradient|
 * of the reference it is compared with):
 * - f32 outputs computed from f32 values only: within 1e-4 of the interpreter (which rounds every node to
 *   f32, like the node-by-node GPU; a fused group keeps f32-or-better inside: f32 rounding differences only).
 * - bf16 / f16 outputs, and f32 outputs with a 16-bit value among their ancestors (an f32 loss of bf16
 *   logits carries bf16 error): within `bound` of the EXACT answer, the interpreter in EVT_RUN_FP64 mode on the same
 *   (already bf16) inputs: bound = max(1e-2, 2 x ref_exact), where ref_exact is the largest distance of the
 *   per-node-rounding interpreter (every node rounded to bf16, the semantics of the node-by-node path) from
 *   that exact answer over this step's outputs of this kind; or, as before, within 1e-2 of the per-node interpreter.
 *   Why: a fused kernel rounds only what it stores (f32 inside: acc + bias rounded once where the interpreter
 *   rounds mm's result and then the sum), so it is a different, valid bf16 evaluation of the same step. Two
 *   valid bf16 evaluations each sit about ref_exact from the exact answer, with independent errors, so their
 *   mutual distance can reach twice that; measured on the CPU model of the fused step (evt_exec_plan_run_cpu)
 *   over 7 bf16 graphs x 3 seeds x 4 SGD steps, the per-node interpreter itself is 0.005-0.033 from exact
 *   (0.11-0.40 where max-pool / comparison decisions flip: resnet_block, xmlcnn) and the fused step at most
 *   1.44 x max(1e-2, ref_exact) from it (the old rule, fused within 1e-2 of the per-node interpreter, fails by
 *   construction whenever ref_exact is above about 5e-3). Where decisions flip the bound is correspondingly loose;
 *   the f32 runs stay the tight check of the same kernels.
 * - outputs with an fp8 value among their ancestors (the fp8 pass's steps; this rule before the others): within 1e-2
 *   of the per-node interpreter in relative norm, ||gpu - ref|| / ||ref|| over the tensor. Why: the exact answer is
 *   no reference (fp8 rounding moves fp8_mlp's gradients 0.26-0.37 from it), and a fused step whose f32 sums round
 *   differently moves single values across an fp8 rounding boundary, so a few elements differ by a few 1e-3 of the
 *   tensor's largest value: on the CPU model of the fused fp8_mlp step, 2 of 72 steps (24 seeds x 3), 2.9e-3 and
 *   4.3e-3 by evt_cuda_rel_error but 3.0e-4 and 4.7e-4 in relative norm, while a gradient 5% off (0.05) or with 1%
 *   of its elements negated (0.2-0.23) fails in every step. An fp8 output over 1e-2 passes within max(1e-2, 2 x noise),
 *   noise = the largest relative norm distance from the interpreter of 3 perturbed references (evt_interp_run_fp8_noise,
 *   eps 2^-12; run only then). Why: the fp8 tensor cores accumulate with about 2^-13 relative error where the
 *   interpreter sums exactly, and the gradients' fp8 quantization amplifies it to a few 1e-2 (docs/codegen.md "FP8");
 *   the GPU is one more draw of that noise, whose distance varies up to 1.7x between draws. NaN never passes.
 * Prints one line per mismatching output to `out` and fills r (maxima over the outputs); returns the
 * interpreter's status. */
typedef struct evt_check_result {
  int mismatches;
  double f32_ref;   /* f32 outputs: max error against the interpreter */
  double gpu_exact; /* bf16/f16 outputs: max error of the GPU against the exact answer */
  double ref_exact; /* bf16/f16 outputs: max error of the per-node interpreter against the exact answer */
  double gpu_ref;   /* bf16/f16 outputs: max error of the GPU against the per-node interpreter */
  double bound;     /* max(1e-2, 2 x ref_exact) */
  double fp8_ref;   /* outputs of fp8 values: max relative norm error of the GPU against the per-node interpreter */
  double fp8_noise; /* outputs of fp8 values: max distance of the perturbed references (0: none ran) */
  int fp8_outputs;  /* outputs judged by the fp8 rule */
} evt_check_result;
/* The fp8 rule's bound for an output whose perturbed references lie e_noise from the interpreter (relative norm):
 * max(1e-2, 2 x e_noise), 1e-2 when e_noise is not finite. evt_check_fp8_ok: the GPU's error e_gpu passes (a NaN or
 * an infinity never does). */
double evt_check_fp8_bound(double e_noise);
bool evt_check_fp8_ok(double e_gpu, double e_noise);
/* evt_check_step_tf32 with tf32: the program ran with evt_options.tf32, so the result of an mm / addmm / bmm of f32
 * operands (and everything computed from it) carries TF32 error (10 mantissa bits, as f16): it is held to the
 * 16-bit rule below, not to f32's 1e-4. evt_check_step: tf32 off. */
evt_status evt_check_step_tf32(evt_graph *g, evt_tensor *values, const evt_tensor *gpu, long step, bool tf32, FILE *out,
                               struct evt_check_result *r);
evt_status evt_check_step(evt_graph *g, evt_tensor *values, const evt_tensor *gpu, long step, FILE *out,
                          evt_check_result *r);

#endif
