/* The environment variables of docs/config.md, read here and nowhere else in src/ (contract in env.h). */
#include "util/env.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <stdbool.h>

#include "util/util.h"

static const char *const names[EVT_ENV_COUNT] = {
    [EVT_ENV_CACHE_DIR] = "EVT_CACHE_DIR",       [EVT_ENV_XDG_CACHE_HOME] = "XDG_CACHE_HOME",
    [EVT_ENV_HOME] = "HOME",                     [EVT_ENV_NVCC] = "EVT_NVCC",
    [EVT_ENV_CUTLASS_PATH] = "CUTLASS_PATH",     [EVT_ENV_KERNELS_DIR] = "EVT_KERNELS_DIR",
    [EVT_ENV_FALLBACK_LIB] = "EVT_FALLBACK_LIB", [EVT_ENV_JIT_JOBS] = "EVT_JIT_JOBS",
    [EVT_ENV_PROFILE] = "EVT_PROFILE",
};

const char *evt_env_name(evt_env_var v) {
  EVT_ASSERT(v >= 0 && v < EVT_ENV_COUNT);
  return names[v];
}

const char *evt_env(evt_env_var v) {
  const char *s = getenv(evt_env_name(v));
  return s && *s ? s : NULL;
}

long evt_env_long(evt_env_var v, long dflt) {
  const char *s = evt_env(v);
  char *end = NULL;
  long x = s ? strtol(s, &end, 10) : 0;
  return s && end != s && !*end ? x : dflt;
}

const char *evt_self_dir(void) {
  static char dir[PATH_MAX];
  static int done;
  if (!done) {
    Dl_info info;
    if (dladdr((void *)&evt_self_dir, &info) && info.dli_fname && realpath(info.dli_fname, dir)) {
      char *slash = strrchr(dir, '/');
      if (slash) *slash = '\0';
    } else {
      dir[0] = '\0';
    }
    done = 1;
  }
  return dir;
}

static bool has_launch_header(const char *dir) {
  char path[PATH_MAX + 32];
  snprintf(path, sizeof path, "%s/evt_launch.h", dir);
  return access(path, R_OK) == 0;
}

const char *evt_kernels_dir(void) {
  static char dir[PATH_MAX + 16];
  const char *env = evt_env(EVT_ENV_KERNELS_DIR);
  if (env) return env;
  const char *self = evt_self_dir();
  snprintf(dir, sizeof dir, "%s/kernels", self);
  if (*self && has_launch_header(dir)) return dir;
  snprintf(dir, sizeof dir, "%s/../kernels", self);
  if (*self && has_launch_header(dir)) return dir;
  return "kernels";
}

void evt_env_cache_dir(const char *sub, char *out, size_t len) {
  const char *root = evt_env(EVT_ENV_CACHE_DIR), *xdg = evt_env(EVT_ENV_XDG_CACHE_HOME), *home = evt_env(EVT_ENV_HOME);
  if (root) snprintf(out, len, "%s/%s", root, sub);
  else if (xdg) snprintf(out, len, "%s/evt/%s", xdg, sub);
  else if (home) snprintf(out, len, "%s/.cache/evt/%s", home, sub);
  else snprintf(out, len, "/tmp/evt-cache-%u/%s", (unsigned)getuid(), sub);
}
