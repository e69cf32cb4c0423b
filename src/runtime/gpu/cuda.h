/* The GPU runtime (internal header): the program behind the public evt_program_* API (src/runtime/gpu/program.c)
 * and the launches it enqueues (src/runtime/gpu/cuda.c); a launch reads the program's tensors, the program
 * enqueues launches: the two call each other through this header on purpose.
 *
 * There is ONE GPU runtime: an evt_program. Layers:
 *   cuda.c     loads the kernel library of kernels/fallback/ (build/libevt_fallback.so) with dlopen - libevt
 *              never links CUDA: path $EVT_FALLBACK_LIB, else libevt_fallback.so beside libevt, else next to
 *              the running executable, else the loader's search path; no library, no libcudart or no device:
 *              EVT_ERR_UNSUPPORTED with "no CUDA device: ..." -, and launches one step of a program on a
 *              stream: evt_gpu_launch_node (one node through the library) and evt_gpu_launch_group (one
 *              partition group on its path: a generated row kernel, a generated GEMM+EVT kernel
 *              (src/runtime/gpu/gemm_launch.c), or its members node by node). Nothing there synchronizes or
 *              copies to the host.
 *   program.c  a program created by src/compile/program.c (passes, fused plan, compiled kernels, memory plan):
 *              loads its kernels, places its arena, binds caller memory, runs (eager or CUDA graph).
 *   memory.c   the steps of a run and the arena's layout (memory.h); exec_plan.c, the plan's run-time changes.
 *   profile.c  EVT_PROFILE's tables.
 *
 * Steps and memory: src/runtime/gpu/memory.h.
 */
#ifndef EVT_RUNTIME_CUDA_H
#define EVT_RUNTIME_CUDA_H

#include <stdio.h>

#include "evt_fallback.h"
#include "evt_fb_gemm.h"
#include "ir/ir.h"
#include "evt_row_launch.h"
#include "runtime/gpu/exec_plan.h"
#include "runtime/gpu/gemm_launch.h"
#include "runtime/gpu/memory.h"

/* ---- the kernel library (cuda.c) ------------------------------------------------------------------- */
typedef struct evt_fb_api {
  int (*init)(char *, size_t);
  evt_fb_ctx *(*ctx_new)(char *, size_t);
  void (*ctx_free)(evt_fb_ctx *);
  void *(*alloc)(int64_t, char *, size_t);
  void (*free_)(void *);
  int (*reserve)(evt_fb_ctx *, const evt_fb_node *, char *, size_t);
  int (*scratch_need)(evt_fb_ctx *, const evt_fb_node *, int64_t *, int64_t *, char *, size_t);
  void (*bind_scratch)(evt_fb_ctx *, void *, int64_t, void *, int64_t);
  int (*run)(evt_fb_ctx *, const evt_fb_node *, void *, char *, size_t);
  long (*launches)(const evt_fb_ctx *);
  int (*upload)(evt_fb_ctx *, const evt_fb_tensor *, const double *, void *, char *, size_t);
  int (*download)(evt_fb_ctx *, const evt_fb_tensor *, double *, void *, char *, size_t);
  int (*copy)(void *, const void *, int64_t, void *, char *, size_t);
  int (*sync)(void *, int *, char *, size_t);
  int (*stream_new)(void **, char *, size_t);
  void (*stream_free)(void *);
  int (*capture_begin)(void *, char *, size_t);
  int (*capture_end)(void *, int, void **, char *, size_t);
  int (*graph_launch)(void *, void *, char *, size_t);
  void (*graph_free)(void *);
  int (*event_new)(void **, char *, size_t);
  int (*event_record)(void *, void *, char *, size_t);
  int (*event_ms)(void *, void *, double *, char *, size_t);
  void (*event_free)(void *);
  int (*stream_capturing)(void *);  /* 1: the stream is being captured (or its state is unknown), else 0 */
  int (*gemm)(evt_fb_ctx *, const evt_fb_gemm *, void *, char *, size_t);
  int (*sgd)(const evt_fb_tensor *, const evt_fb_tensor *, double, void *, char *, size_t);
  int (*rng_step)(unsigned long long *, unsigned long long, int, void *, char *, size_t);
  int (*device_arch)(void);
  int (*index_flag)(int **, char *, size_t);
  int (*csr_reserve)(evt_fb_ctx *, const evt_fb_csr_transpose_args *, char *, size_t);
  int (*csr_transpose)(evt_fb_ctx *, evt_fb_csr_transpose_args *, void *, char *, size_t);
} evt_fb_api;

/* Loads the library once per process and initializes the device; NULL with the reason in why. */
const evt_fb_api *evt_gpu_library(char *why, size_t n);
/* The present GPU's compute capability (major * 10 + minor: 80, 86, 89, 90, ...), or 0 without a GPU or kernel
 * library; asked once per process. */
int evt_gpu_device_arch(void);

/* ---- a program (program.c) ------------------------------------------------------------------------- */
struct evt_program {
  evt_graph *g;
  unsigned flags;
  const evt_fb_api *api;
  evt_fb_ctx *ctx;
  /* EVT_PROGRAM_FUSED: the groups' paths and one loaded entry per distinct generated kernel */
  evt_exec_plan *xp;
  int (**kfn)(const evt_row_launch_args *);  /* row / pointwise kernel k (NULL: a GEMM kernel or a failure) */
  evt_gemm_kernels *gk;     /* GEMM+EVT kernels (src/runtime/gpu/gemm_launch.h) */
  void *gemm_scratch;       /* xp->scratch_bytes (D tiles nobody reads, T) at the arena's end: evt_gpu_arena_total */
  bool replan;              /* a GEMM launcher refused its group during a run: re-plan, run the step again */
  int nsteps;
  evt_prog_step *steps;
  evt_fb_tensor *t;         /* per node: shape, dtype, device pointer (arena, caller, or NULL: none) */
  evt_arena_slot *slots;    /* per node */
  char *arena;
  int64_t arena_bytes, naive_bytes; /* the intermediates' layout (the arena holds the scratch after it) */
  int64_t lib_n1, lib_n2;   /* doubles of the library's two scratch buffers (largest node step), in the arena */
  bool arena_caller;        /* the arena is the caller's memory (evt_program_bind_arena), never freed here */
  int64_t arena_caller_bytes;
  int noutputs;
  int *out_node;            /* graph output i: its node (at create) */
  void **out_ptr;           /* graph output i: the caller's memory */
  unsigned char *bound;     /* per input/param node: bound */
  void *graph_exec, *capture_stream;
  bool dirty, warmed;
  int *grad_of;             /* evt_program_sgd: per node, its %grad.<name> output node (-1), found at the first call */
  int nparams_trained;
  unsigned long long *rng_dev; /* graphs with rand / dropout: device memory holding the RNG step of the next run */
  int *index_flag;          /* the kernel library's run-time index-error flag (evt_fb_index_flag), asked at first use */
  uint64_t rng_step;        /* ... its value as the host enqueued it (evt_program_rng_step) */
  long launches;            /* kernel launches of one run */
  int groups_fused, groups_fallback;
  long runs;
  struct evt_prof *prof;    /* EVT_PROFILE (src/runtime/gpu/profile.c), NULL when off */
  struct evt_hprof *hprof;  /* EVT_PROFILE=host:N (src/runtime/gpu/profile.c), NULL when off */
  char err[1024];
};

/* ---- EVT_PROFILE (profile.c): per-step GPU time of eager runs, a table on stderr ------------------- */
/* True when this run on `stream` is profiled (EVT_PROFILE=N set, not a capture); enqueue then calls
 * evt_prof_mark before each step and evt_prof_end after the last (which waits and may print). */
bool evt_prof_begin(evt_program *p, void *stream);
void evt_prof_mark(evt_program *p, int step, void *stream);
void evt_prof_end(evt_program *p, void *stream);
void evt_prof_free(evt_program *p);
/* The table's description of step s (what runs, its shape and config) into buf. */
void evt_prof_step_label(const evt_program *p, int s, char *buf, size_t len);

/* ---- EVT_PROFILE=host:N (profile.c): per-step HOST time of eager runs, a table on stderr -------------- */
/* EVT_PROFILE=host:N: enqueue times each step's host work (the launcher calls, argument building, library
 * calls; no synchronization, so runs keep their speed) and the whole enqueue; after every N-th run a table
 * of microseconds per run, slowest steps first. The bindings (evt_program_bind*) are not included. */
bool evt_hprof_begin(evt_program *p, void *stream);  /* true when this run is host-profiled */
void evt_hprof_step(evt_program *p, int step, double us);
void evt_hprof_end(evt_program *p, double total_us); /* counts the run; prints every N-th */
/* The table (as printed) into buf; returns its length (0: nothing recorded). */
size_t evt_hprof_format(const evt_program *p, char *buf, size_t len);
void evt_hprof_free(evt_program *p);
double evt_now_us(void); /* CLOCK_MONOTONIC in microseconds */

/* ---- launches (cuda.c): enqueue on `stream`, no synchronization ------------------------------------ */
evt_status evt_gpu_launch_node(evt_program *p, int node, void *stream);
/* The library's description of node i with the program's device pointers and attributes (what
 * evt_gpu_launch_node runs, and what the library reserves scratch for before a step). */
void evt_gpu_fb_node(const evt_program *p, int i, evt_fb_node *fn);
/* Group gi of p->xp on its path (fused: its generated kernel; else its members node by node). A GEMM+EVT
 * launcher that refuses the problem demotes the group (gemm_launch.h) before launching anything: this sets
 * p->replan and returns EVT_OK; the run then re-plans the memory and enqueues the step again. */
evt_status evt_gpu_launch_group(evt_program *p, int gi, void *stream);
/* Reserves the library's scratch group gi needs at run time (a fused spmm_t group: A^T's CSR, evt_fb_csr_reserve);
 * allocates: before a step or a capture. */
evt_status evt_gpu_reserve_group(evt_program *p, int gi);
/* Kernel launches one execution of group gi enqueues on its generated path (0 for a cuBLAS group: the
 * library counts those). */
int evt_gpu_group_launches(const evt_program *p, int gi);

/* ---- program.c: what the compile driver (src/compile/program.c) calls ---------------------------------- */
/* Loads the compiled kernels of p->xp (so[k]: kernel k's shared object or NULL); failures demote groups. */
void evt_gpu_program_load_kernels(evt_program *p, char *const *so);
/* Points every node's tensor description at its memory (arena slot, caller pointer, or none). */
void evt_gpu_program_set_tensors(evt_program *p);
/* Allocates the arena (and the GEMM scratch) of the current layout and reserves the library's scratch for
 * every node step and fused spmm_t group (evt_gpu_reserve_group). */
evt_status evt_gpu_program_place(evt_program *p);
/* Bytes of the arena a run needs: the intermediates (arena_bytes), then the GEMM scratch and the library's double
 * scratch, all used within a run only (evt_program_arena_bytes). */
int64_t evt_gpu_arena_total(const evt_program *p);
/* The program's own arena when none is bound and the layout needs one (every run starts with it). */
evt_status evt_gpu_program_ensure_arena(evt_program *p);
/* Graphs with rand / dropout: the device word the kernels read the RNG step from. */
evt_status evt_gpu_program_rng_init(evt_program *p);

#endif
