/* JIT compilation of generated CUDA C++ into shared objects (src/runtime/jit/jit.c).
 *
 * evt_jit_compile writes each job's source to the cache directory and runs nvcc on it, up to `jobs`
 * at a time, and fills in each job's `so_path`. A result is cached under
 * <cache>/<name>-<hash of source, flags, compiler (path and `--version` output) and the kernels directory's headers
 * that the source includes, directly or through one another>.so: the same text with the same flags, compiler and
 * headers is never compiled twice (a changed visitor-functor header recompiles the GEMM kernels, not the row
 * kernels, which do not include it). The cache rules are util/cachedir.h's: a private folder (else EVT_ERR_IO
 * and nothing compiled), a finished object renamed into place from a unique temporary name and sealed with a
 * sidecar <entry>.sum (its key, size and content hash); an entry that fails the check is rebuilt, saying so
 * on stderr; one process compiles an entry while others wanting it wait on its lock (<entry>.lock). Flags:
 *   nvcc -std=c++17 --expt-relaxed-constexpr -O3 -DNDEBUG -gencode=arch=compute_90a,code=sm_90a (evt_jit_gencode)
 *        -shared -Xcompiler -fPIC -I<kernels dir> -I<CUTLASS include> -I<CUTLASS tools/util/include> -lcuda
 * CUTLASS is found from CUTLASS_PATH (a CUTLASS tree, or the `cutlass_library/source` folder of the
 * nvidia-cutlass PyPI package) or else from the installed `cutlass_library` Python package.
 * Environment (docs/config.md): EVT_NVCC, the cache <root>/jit (EVT_CACHE_DIR), EVT_KERNELS_DIR (evt_kernels_dir), EVT_JIT_JOBS.
 * A progress line per finished compile goes to stderr unless quiet. A failed compile leaves in the job's
 * `error` the kernel's name, nvcc's exit status, the log file and the log's first error lines.
 */
#ifndef EVT_JIT_H
#define EVT_JIT_H

#include <stddef.h>

#include "evt.h"

typedef struct evt_jit_job {
  const char *name;    /* kernel name, e.g. evt_kernel_0123456789abcdef (used in file names, messages) */
  const char *source;  /* CUDA C++ text */
  /* results */
  char so_path[1024];
  int ok;              /* 1: so_path holds the compiled shared object */
  int cached;          /* 1: it was already in the cache */
  char error[1024];
} evt_jit_job;

typedef struct evt_jit_options {
  const char *nvcc;         /* NULL: $EVT_NVCC or "nvcc" */
  const char *cache_dir;    /* NULL: see above */
  const char *cutlass_path; /* NULL: $CUTLASS_PATH, else the Python package */
  const char *kernels_dir;  /* NULL: $EVT_KERNELS_DIR or "kernels" */
  const char *extra_flags;  /* appended to the nvcc command (part of the cache key); may be NULL */
  int jobs;                 /* 0: $EVT_JIT_JOBS or the number of online CPUs */
  int quiet;                /* no progress line */
  int compile_only;         /* -c to an object instead of a shared object (checks; no -lcuda needed) */
  int frontend_only;        /* -cuda: the C++ front end only (parsing and every template instantiation, host
                             * and device code) with no code generation; ~30 s instead of ~50-200 s. The CI
                             * check of generated kernels on machines without a GPU. */
  int no_cutlass;           /* row / pointwise kernels (emit_rows.c): no CUTLASS include paths, none needed */
  int arch;                 /* GPU target: 0 or 90 = sm_90a, 80 / 86 / 89 = sm_80 / sm_86 / sm_89 (the source must be
                             * emitted for it: kernel specs carry their arch) */
  int ptx;                  /* 1: PTX only (code=compute_XX), JIT-compiled by the driver for the GPU present */
} evt_jit_options;
/* The -gencode flag of a target: "-gencode=arch=compute_90a,code=sm_90a", "-gencode=arch=compute_80,code=compute_80"
 * (ptx), ... into out. */
void evt_jit_gencode(int arch, int ptx, char *out, size_t outlen);

/* Compiles every job (cache hits are free). EVT_OK if all succeeded; otherwise EVT_ERR_UNSUPPORTED when
 * nvcc or CUTLASS cannot be found (message in *msg), EVT_ERR_IO for cache-dir trouble (a folder refused by the
 * cache rules: the message says how to fix it), or
 * EVT_ERR_INVALID when some job failed to compile (see each job's error). msg may be NULL. */
evt_status evt_jit_compile(evt_jit_job *jobs, int njobs, const evt_jit_options *opt, char *msg, size_t msglen);
/* The CUTLASS include directories that evt_jit_compile would use; EVT_ERR_UNSUPPORTED if none. */
evt_status evt_jit_find_cutlass(const char *cutlass_path, char *inc, size_t inclen, char *util, size_t utillen);
/* The full nvcc flag string (without -o/sources); what the cache key covers besides the source. */
evt_status evt_jit_flags(const evt_jit_options *opt, char *out, size_t outlen);
/* Where evt_jit_compile keeps (or would keep) the shared object of `source` named `name` under opt's
 * settings: <cache>/<name>-<key>.so, whether it exists or not (benchmarks that load only what is compiled:
 * through evt_cache_dlopen, which loads a verified entry only). Runs `nvcc --version` (part of the key). */
evt_status evt_jit_cache_path(const evt_jit_options *opt, const char *name, const char *source, char *out, size_t outlen);

#endif
