/* The environment: the one place evt's C code reads it (src/util/env.c). Every variable is listed, with its
 * meaning, in docs/config.md; tests/python/test_config.py checks that the two lists match. Everything else
 * is an option (evt_options in include/evt.h) or a command-line flag. */
#ifndef EVT_UTIL_ENV_H
#define EVT_UTIL_ENV_H

#include <stddef.h>

typedef enum evt_env_var {
  EVT_ENV_CACHE_DIR,      /* EVT_CACHE_DIR: root of every disk cache */
  EVT_ENV_XDG_CACHE_HOME, /* XDG_CACHE_HOME: the root is $XDG_CACHE_HOME/evt when EVT_CACHE_DIR is unset */
  EVT_ENV_HOME,           /* HOME: else $HOME/.cache/evt */
  EVT_ENV_NVCC,           /* EVT_NVCC: the CUDA compiler (default: nvcc on PATH) */
  EVT_ENV_CUTLASS_PATH,   /* CUTLASS_PATH: a CUTLASS checkout (default: the nvidia-cutlass Python package) */
  EVT_ENV_KERNELS_DIR,    /* EVT_KERNELS_DIR: evt's kernels/ headers for generated code (default: evt_kernels_dir) */
  EVT_ENV_FALLBACK_LIB,   /* EVT_FALLBACK_LIB: the CUDA kernel library libevt_fallback.so */
  EVT_ENV_JIT_JOBS,       /* EVT_JIT_JOBS: parallel nvcc processes (default: the CPU count) */
  EVT_ENV_PROFILE,        /* EVT_PROFILE: N (GPU time per step, a table every N runs) or host:N (host time) */
  EVT_ENV_COUNT
} evt_env_var;

/* The variable's value, or NULL when it is unset or empty. */
const char *evt_env(evt_env_var v);
/* Its name, e.g. "EVT_CACHE_DIR". */
const char *evt_env_name(evt_env_var v);
/* The integer value, or dflt when unset, empty or not a number. */
long evt_env_long(evt_env_var v, long dflt);
/* The folder of the library (libevt.so) or program this code was linked into: where a package puts the files
 * it ships beside it. "" if unknown. */
const char *evt_self_dir(void);
/* evt's kernels/ headers for generated code: $EVT_KERNELS_DIR, else <self>/kernels (an installed package), else
 * <self>/../kernels (a build/ folder of a checkout), else ./kernels. */
const char *evt_kernels_dir(void);
/* <root>/<sub> of evt's disk caches: root = $EVT_CACHE_DIR, else $XDG_CACHE_HOME/evt, else $HOME/.cache/evt,
 * else /tmp/evt-cache-<uid> (no home). The path only: util/cachedir.h checks and creates the folders. */
void evt_env_cache_dir(const char *sub, char *out, size_t len);

#endif
