/* Mainloop autotuning and the measured fused-vs-unfused choice for GEMM + EVT kernels (src/tune/tune.c).
 *
 * What is tuned: for one lowered GEMM + EVT kernel spec and one problem shape M×N×K, the mainloop
 * configuration (evt_tile_config: tile, cluster, schedule, stages, row/col-sum strategy; compiled into the
 * kernel, part of its hash) and the launch-time tile scheduler (swizzle 1/2/4/8, raster order; fields of
 * evt_launch_args, not compiled in). evt_tune_candidates lists the configs tried.
 *
 * How (evt_tune_run; needs nvcc, CUTLASS and a GPU): every candidate's kernel and a small timing helper
 * (kernels/evt_tune_bench.cu: cudaEvent timing, cuBLASLt through dlopen) are JIT-compiled together in one
 * parallel batch (src/runtime/jit/jit.h). Each candidate runs on random data of the real shape: warm-up, then
 * the median of `reps` (>= 20) calls, each bracketed by CUDA events. The unfused alternative is timed
 * the same way: cuBLASLt's GEMM into a temporary T (in the operand dtype) — with cuBLASLt's BIAS epilogue
 * when the epilogue starts with acc + row_bcast — followed by the rest of the epilogue as ONE generated
 * pointwise row kernel (evt_tune_unfused_rspec, src/codegen/emit_rows.c); a plain epilogue (D = acc) is
 * cuBLASLt alone. The fastest fused candidate is checked against the CPU reference on sampled rows and
 * columns (evt_tune_check_sampled); a candidate that fails to compile, to launch or the check is dropped
 * with a note. The checked kernel and the faster unfused variant are then timed again side by side
 * (evt_tune_interleave; times taken far apart in a long sweep are not comparable). The choice: FUSED
 * (config + scheduler) when that fused time <= the unfused time, else UNFUSED. The compiler never ships a fused
 * kernel slower than the unfused alternative it measured.
 *
 * Where the result lives: one text file per (spec, shape, GPU) under <root>/tune/, root = the cache_dir
 * argument, else evt's cache root (docs/config.md: $EVT_CACHE_DIR, $XDG_CACHE_HOME/evt or ~/.cache/evt), named
 * <epilogue hash>-<M>x<N>x<K>-<GPU name with [^A-Za-z0-9] as _>.txt, written atomically (tmp + rename).
 * The key is evt_kspec_epilogue_hash (the spec without its config), so every config of an epilogue shares
 * it. Format (line oriented, `key value`; unknown keys are ignored on read):
 *   evt-tune 1 / spec <16 hex> / shape M N K / gpu <name> / choice fused|unfused /
 *   config <evt_tile_config_label> / swizzle S / raster R / fused_ms / unfused_ms / default_ms /
 *   unfused <how> / check <rel err> / cand <ms or -1> <swizzle> <raster> <config label> [; note]
 *
 * How the runtime uses it (evt_tune_apply): before compiling a GEMM group's kernel it looks the record up
 * (any GPU when gpu is NULL); FUSED → the spec's cfg is replaced by the tuned one (the kernel to compile
 * and launch) and the launch args get swizzle/raster (evt_tune_launch_apply); UNFUSED → run the group
 * unfused; NONE (no record) → the default config, "not tuned". Without a GPU nothing is measured and
 * everything stays at the default config.
 */
#ifndef EVT_RUNTIME_TUNE_H
#define EVT_RUNTIME_TUNE_H

#include <stdint.h>
#include <stdio.h>

#include "codegen/kspec.h"
#include "codegen/rspec.h"
#include "evt_launch.h"

struct evt_lower_result;

#define EVT_TUNE_MAX_CAND 48
#define EVT_TUNE_SMS EVT_HOPPER_SMS /* below this many output tiles the stream-K candidates join */

typedef enum evt_tune_choice { EVT_TUNE_NONE = 0, EVT_TUNE_FUSED, EVT_TUNE_UNFUSED } evt_tune_choice;

typedef struct evt_tune_cand {
  evt_tile_config cfg;
  int swizzle, raster;
  double ms;          /* median; < 0: not measured (see note) */
  char note[96];      /* why dropped ("compile failed", "launch error 1", "check 3e-1"), or "" */
} evt_tune_cand;

typedef struct evt_tune_record {
  uint64_t spec_hash;        /* evt_kspec_epilogue_hash */
  int64_t m, n, k;
  char gpu[64];
  evt_tune_choice choice;
  evt_tile_config cfg;       /* FUSED: the config to compile */
  int swizzle, raster;       /* FUSED: launch-time scheduler */
  double fused_ms;           /* best fused candidate (any choice) */
  double unfused_ms;         /* the unfused alternative; < 0 if it could not be measured */
  double default_ms;         /* candidate 0 (the untuned config) at CUTLASS's default scheduler; < 0 if not measured */
  char unfused_how[80];      /* "cublasLt + row kernel", "cublasLt(bias) + row kernel", "cublasLt" */
  double check_err;          /* sampled CPU check of the chosen fused kernel (max rel error), -1 if none */
  int ncand;
  evt_tune_cand cand[EVT_TUNE_MAX_CAND];
  uint64_t source_hash;      /* evt_tune_sources_hash when measured: a record whose candidates the emitter now
                              * generates differently (or without this line: older records) timed other kernels,
                              * so it is stale: not applied, measured again */
} evt_tune_record;

/* Hash of the generated CUTLASS sources of s under each of r's candidate configs (r->cfg if it has none). */
uint64_t evt_tune_sources_hash(const evt_kspec *s, const evt_tune_record *r);

typedef struct evt_tune_options {
  const char *cache_dir;  /* records under <cache_dir>/tune; NULL: evt's cache root (docs/config.md) */
  int jobs;               /* parallel nvcc; 0: $EVT_JIT_JOBS or online CPUs */
  int reps;               /* timed calls per candidate (median); 0: 30; at least 20 */
  int warmup;             /* 0: 5 */
  int max_configs;        /* cap on compiled candidate configs; 0: all of evt_tune_candidates */
  int quiet;              /* no progress on stderr */
  int force;              /* re-measure even when a record exists */
  int compile_only;       /* JIT-compile every candidate (and the helper) and stop: nothing measured or written;
                           * returns EVT_OK when all compiled (a later run finds them in the JIT cache) */
} evt_tune_options;

/* ---- pure host code (no GPU) ------------------------------------------------------------------------ */
/* Candidate mainloop configs for spec s at M×N×K, s->cfg first (from evt_tune_collect: the untuned config),
 * every one passing evt_tile_config_check; returns how many (<= max). Row/col-sum specs also get the
 * WORKSPACE strategy for the larger tiles; a problem of fewer 128x256 tiles than EVT_TUNE_SMS over K >= 2048
 * gets two stream-K configs right after the default. */
int evt_tune_candidates(const evt_kspec *s, int64_t m, int64_t n, int64_t k, evt_tile_config *out, int max);
/* The launch-time scheduler variants tried per config: pairs (swizzle, raster). Returns how many. */
int evt_tune_sched_variants(int64_t m, int64_t n, int (*out)[2], int max);

/* The final fused-vs-unfused comparison: times implementation 0 (the best fused candidate) and 1 (the faster
 * unfused variant) in `rounds` rounds (rounded up to an even number, 2..16), the order swapped every round
 * (0 1, 1 0, 0 1, 1 0, ...), and stores the median of each one's times in ms[0], ms[1] (under a steady drift
 * both medians sit at the same mean position). time(ctx, which, &ms) times one implementation (itself a median
 * of calls) and returns 0 or an error code. Why: the GPU's clocks follow its temperature and power draw, so
 * times taken at different points of a sweep over tens of candidates are not comparable (bench/RESULTS.md).
 * Returns 0, or the first nonzero code of time (ms[] untouched). */
int evt_tune_interleave(int rounds, int (*time)(void *ctx, int which, double *ms), void *ctx, double ms[2]);

/* The unfused alternative's epilogue as a nucleus-free row spec over [M, N]: the accumulator becomes an
 * aux_load "t" of dtype t_dtype (the GEMM's output T); with absorb_bias the node acc + row_bcast (when
 * the accumulator has no other user) is T itself (cuBLASLt added the bias; *bias_node gets the kspec
 * node of the bias, else -1); D becomes an aux_store "d" (d_dtype). map[i] = the kspec node whose memory
 * rspec node i uses (-1 for the T load and the D store, which are ptrs[*t_node] / ptrs[*d_node]).
 * Returns EVT_OK, or EVT_ERR_UNSUPPORTED when nothing is left for a row kernel (D = acc: cuBLASLt alone,
 * *d_node = -1) or the rspec is refused (message in err). */
evt_status evt_tune_unfused_rspec(const evt_kspec *s, evt_dtype t_dtype, int absorb_bias, evt_rspec *out, int *map,
                                  int *t_node, int *d_node, int *bias_node, char *err, size_t errlen);

/* Sampled CPU check of a GEMM + EVT result. Inputs as stored on the device, raw (bf16/f16 as uint16, f32 as
 * float): a, b in the spec's layout, mem[i] the memory of spec node i (loads: the inputs the kernel read;
 * stores / sums: what it wrote), d the kernel's D. Recomputes rows `rows[0..nr)` (every column) and columns
 * `cols[0..nc)` (every row) with evt_kspec_reference, and compares D, aux stores, row sums (at cols) and
 * col sums (at rows). Returns the largest error: max |gpu - ref| / max(max |ref|, 1e-3) over each compared
 * tensor (+inf for a NaN mismatch). */
double evt_tune_check_sampled(const evt_kspec *s, int64_t m, int64_t n, int64_t k, const void *a, const void *b,
                              const void *const *mem, const void *d, const int64_t *rows, int nr, const int64_t *cols,
                              int nc);

/* n random values in [-1, 1) stored as dt (f32, or bf16 / f16 bits), malloc'ed: the tuner's operands. Made in
 * chunks of 2^20 on the threads of the sampled check (EVT_TUNE_CHECK_THREADS); each chunk's generator is seeded
 * from (seed, chunk), so the values depend on seed alone. */
void *evt_tune_random_data(evt_dtype dt, int64_t n, uint64_t seed);

/* Record file name (without directory) for a key; gpu NULL → "any". */
void evt_tune_record_name(uint64_t spec_hash, int64_t m, int64_t n, int64_t k, const char *gpu, char *out, size_t len);
/* The directory tuning records live in (created on write): <cache>/tune. */
void evt_tune_dir(const char *cache_dir, char *out, size_t len);
/* Threads of the sampled CPU check and the random operands (0, the default: the CPU count); for tests. */
void evt_tune_set_threads(int n);
evt_status evt_tune_record_write(const char *cache_dir, const evt_tune_record *r, char *msg, size_t msglen);
/* Reads the record for (spec_hash, m, n, k, gpu); gpu NULL: the first record for that spec and shape on
 * any GPU. EVT_OK, EVT_ERR_IO when there is none, EVT_ERR_INVALID for a file that does not parse. */
evt_status evt_tune_record_read(const char *cache_dir, uint64_t spec_hash, int64_t m, int64_t n, int64_t k,
                                const char *gpu, evt_tune_record *r);
/* The record the tuner reuses for spec s at M×N×K when asked to try up to max_configs configs (0: all):
 * EVT_OK with *r when a record exists that tried at least as many configs as this run would
 * (evt_tune_candidates capped at max_configs); EVT_ERR_IO when there is none or it tried fewer (the run
 * measures again and its record replaces the smaller one); EVT_ERR_INVALID for a file that does not parse. */
evt_status evt_tune_record_reusable(const char *cache_dir, const evt_kspec *s, int64_t m, int64_t n, int64_t k,
                                   int max_configs, evt_tune_record *r);
/* Looks up the record of spec s (by evt_kspec_epilogue_hash) and shape; on FUSED sets s->cfg to the tuned
 * config (so the caller compiles and names that kernel), on UNFUSED to the fastest fused config measured
 * (what a group runs that its runtime cannot run unfused: the fused runtime's GEMM groups with an
 * epilogue, exec_plan.h). Returns the choice (NONE when there is no record
 * or its config is illegal for s); *rec (may be NULL) gets the record. */
evt_tune_choice evt_tune_apply(evt_kspec *s, int64_t m, int64_t n, int64_t k, const char *cache_dir, const char *gpu,
                               evt_tune_record *rec);
/* Sets a->swizzle / a->raster from a FUSED record (no-op otherwise). */
void evt_tune_launch_apply(const evt_tune_record *r, evt_launch_args *a);
/* One line for `evtc compile --stats`: "fused 128x256x64 c2x1 coop swz8 (0.123 ms; unfused 0.150 ms; default
 * 0.140 ms)", "unfused (measured 0.150 ms vs fused 0.170 ms)", or "not tuned (default config ...)". */
void evt_tune_describe(const evt_tune_record *r, evt_tune_choice c, const evt_kspec *s, char *out, size_t len);

/* ---- applying records to a lowering (evtc compile, the fused runtime) ------------------------------ */
typedef struct evt_tune_group {
  evt_tune_choice choice;   /* NONE for non-GEMM groups and untuned ones */
  int swizzle, raster;      /* FUSED (and UNFUSED: of the fastest fused config): launch-time scheduler */
  int unfused_bias;         /* the faster unfused variant measured had cuBLASLt add the bias ("cublasLt(bias)") */
  double fused_ms, unfused_ms; /* the record's times (0 without a record; unfused < 0: not measured) */
  char desc[240];           /* evt_tune_describe's line */
} evt_tune_group;
/* For every lowered GEMM+EVT group of `low` (low->n entries in out): evt_tune_apply on its spec (a FUSED
 * record replaces the config and renames L->kernel), and the description. Returns the number of groups
 * with a record. */
int evt_tune_apply_lowered(struct evt_lower_result *low, const char *cache_dir, const char *gpu, evt_tune_group *out);

/* ---- GPU ------------------------------------------------------------------------------------------- */
typedef struct evt_tune_problem {
  evt_kspec spec;          /* its cfg is ignored: the candidates replace it */
  int64_t m, n, k;
} evt_tune_problem;
/* The distinct (epilogue, shape) problems of the lowered GEMM+EVT groups of `low` (those with want[gi] != 0,
 * or every lowered one when want is NULL; never fp8 GEMMs, which run untuned), each with the config it runs
 * untuned (evt_lower_untuned_config).
 * *out is malloc'd (caller frees); prob_of[gi] (low->n entries, may be NULL) gets the problem index of group
 * gi or -1. Returns the count. */
int evt_tune_collect(const struct evt_lower_result *low, const int *want, evt_tune_problem **out, int *prob_of);
/* evt_tune_run for several problems at once: every candidate of every problem compiles in one parallel
 * JIT batch, then each problem is measured in turn. out[i] / st[i] per problem (st may be NULL); returns
 * EVT_OK if every problem got a record, else the first failure (message in msg). */
evt_status evt_tune_run_many(const evt_tune_problem *p, int np, const evt_tune_options *opt, evt_tune_record *out,
                             evt_status *st, char *msg, size_t msglen);
/* Measures and chooses as described on top, writes the record, fills *out. A record already on disk is
 * returned as is unless opt->force. EVT_ERR_UNSUPPORTED (message in msg) without nvcc, CUTLASS, a CUDA
 * device or cuBLASLt; nothing is written then. */
evt_status evt_tune_run(const evt_kspec *s, int64_t m, int64_t n, int64_t k, const evt_tune_options *opt,
                        evt_tune_record *out, char *msg, size_t msglen);

#endif
