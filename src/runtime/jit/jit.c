/* JIT compilation of generated kernels with nvcc, cached by hash of source + flags (contract in jit.h).
 *
 * Design: C11 + POSIX only; nvcc is run through /bin/sh with every path single-quoted (paths holding a
 * quote are refused). Up to `jobs` compiles run at once (one CUTLASS Sm90 GEMM takes ~50 s and ~4 GB on
 * one core); each writes its log next to its source, and a finished object is renamed into place.
 */
#include "runtime/jit/jit.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "util/env.h"
#include "util/util.h"

static void msgf(char *msg, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void msgf(char *msg, size_t len, const char *fmt, ...) {
  if (!msg || !len) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, len, fmt, ap);
  va_end(ap);
}

static int file_exists(const char *p) {
  struct stat st;
  return stat(p, &st) == 0;
}

static int mkdir_p(const char *path) {
  char tmp[1024];
  if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp) return -1;
  for (char *p = tmp + 1; *p; p++)
    if (*p == '/') {
      *p = 0;
      if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return -1;
      *p = '/';
    }
  if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return -1;
  return 0;
}

static int has_quote(const char *s) { return s && strchr(s, '\'') != NULL; }

evt_status evt_jit_find_cutlass(const char *cutlass_path, char *inc, size_t inclen, char *util, size_t utillen) {
  char base[1024] = "";
  const char *p = cutlass_path ? cutlass_path : evt_env(EVT_ENV_CUTLASS_PATH);
  if (p && *p) {
    snprintf(base, sizeof base, "%s", p);
  } else {
    FILE *f = popen("python3 -c 'import os, cutlass_library; print(os.path.dirname(cutlass_library.__file__))' "
                    "2>/dev/null",
                    "r");
    if (f) {
      char line[900] = "";
      if (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        if (*line) snprintf(base, sizeof base, "%s/source", line);
      }
      pclose(f);
    }
  }
  if (!*base) return EVT_ERR_UNSUPPORTED;
  char probe[1200];
  snprintf(probe, sizeof probe, "%s/include/cutlass/cutlass.h", base);
  if (!file_exists(probe)) return EVT_ERR_UNSUPPORTED;
  snprintf(inc, inclen, "%s/include", base);
  snprintf(util, utillen, "%s/tools/util/include", base);
  return EVT_OK;
}

evt_status evt_jit_flags(const evt_jit_options *opt, char *out, size_t outlen) {
  char inc[1024], util[1024];
  int nocut = opt && opt->no_cutlass;
  if (nocut) {
    inc[0] = util[0] = 0;
  } else if (evt_jit_find_cutlass(opt ? opt->cutlass_path : NULL, inc, sizeof inc, util, sizeof util) != EVT_OK) {
    msgf(out, outlen, "CUTLASS not found: set CUTLASS_PATH or pip install nvidia-cutlass==4.2.0.0");
    return EVT_ERR_UNSUPPORTED;
  }
  const char *kdir = opt && opt->kernels_dir ? opt->kernels_dir : evt_kernels_dir();
  const char *extra = opt && opt->extra_flags ? opt->extra_flags : "";
  if (has_quote(inc) || has_quote(util) || has_quote(kdir)) {
    msgf(out, outlen, "include paths must not contain a single quote");
    return EVT_ERR_INVALID;
  }
  int n = snprintf(out, outlen,
                   "-std=c++17 --expt-relaxed-constexpr -O3 -DNDEBUG -gencode=arch=compute_90a,code=sm_90a "
                   "-Xcompiler -fPIC -I'%s'%s%s%s%s%s%s%s%s%s",
                   kdir, nocut ? "" : " -I'", inc, nocut ? "" : "'", nocut ? "" : " -I'", util, nocut ? "" : "'",
                   opt && opt->frontend_only  ? " -cuda"
                   : opt && opt->compile_only ? " -c"
                                              : " -shared -lcuda", *extra ? " " : "", extra);
  if (n < 0 || (size_t)n >= outlen) {
    msgf(out, outlen, "nvcc flags too long");
    return EVT_ERR_INVALID;
  }
  return EVT_OK;
}


/* Reads a whole file (NULL if it cannot); *len gets its size. */
static char *read_all(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 8192, n = 0, r;
  char *buf = malloc(cap + 1);
  while (buf && (r = fread(buf + n, 1, cap - n, f)) > 0) {
    n += r;
    if (n == cap) {
      char *nb = realloc(buf, 2 * cap + 1);
      if (!nb) {
        free(buf);
        buf = NULL;
        break;
      }
      buf = nb, cap *= 2;
    }
  }
  fclose(f);
  if (buf) buf[n] = 0, *len = n;
  return buf;
}

#define JIT_MAX_HEADERS 64

/* Adds to names[] every `#include "NAME"` of text whose NAME is a file of the kernels directory (no path). */
static void scan_includes(const char *text, const char *kdir, char names[][64], int *n) {
  for (const char *p = strstr(text, "#include"); p; p = strstr(p + 8, "#include")) {
    const char *q = p + 8;
    while (*q == ' ' || *q == '\t') q++;
    if (*q != '"') continue;
    const char *e = strchr(q + 1, '"');
    size_t l = e ? (size_t)(e - q - 1) : 0;
    if (!l || l >= 64 || memchr(q + 1, '/', l) || memchr(q + 1, '\n', l)) continue;
    char nm[64];
    memcpy(nm, q + 1, l);
    nm[l] = 0;
    int seen = 0;
    for (int i = 0; i < *n && !seen; i++) seen = !strcmp(names[i], nm);
    char path[1400];
    snprintf(path, sizeof path, "%s/%s", kdir, nm);
    if (!seen && *n < JIT_MAX_HEADERS && file_exists(path)) strcpy(names[(*n)++], nm);
  }
}

/* Hash of the project's kernel headers that a source includes, directly or through another of them (by name
 * and content, in name order): a changed header must not hit an old cache entry of a kernel that includes it,
 * and kernels that do not include it keep theirs (a visitor functor does not recompile every row kernel). */
static uint64_t kernel_headers_hash(const evt_jit_options *opt, const char *source) {
  const char *kdir = opt && opt->kernels_dir ? opt->kernels_dir : evt_kernels_dir();
  uint64_t h = evt_hash_bytes(0, "--kernel headers--", 18);
  char names[JIT_MAX_HEADERS][64];
  char *text[JIT_MAX_HEADERS] = {0};
  size_t len[JIT_MAX_HEADERS] = {0};
  int n = 0;
  scan_includes(source, kdir, names, &n);
  for (int i = 0; i < n; i++) { /* the list grows while it is walked: headers included by headers */
    char path[1400];
    snprintf(path, sizeof path, "%s/%s", kdir, names[i]);
    text[i] = read_all(path, &len[i]);
    if (text[i]) scan_includes(text[i], kdir, names, &n);
  }
  int order[JIT_MAX_HEADERS];
  for (int i = 0; i < n; i++) order[i] = i;
  for (int i = 1; i < n; i++) /* insertion sort by name */
    for (int j = i; j > 0 && strcmp(names[order[j - 1]], names[order[j]]) > 0; j--) {
      int t = order[j];
      order[j] = order[j - 1], order[j - 1] = t;
    }
  for (int k = 0; k < n; k++) {
    int i = order[k];
    h = evt_hash_bytes(h, names[i], strlen(names[i]));
    if (text[i]) h = evt_hash_bytes(h, text[i], len[i]);
  }
  for (int i = 0; i < n; i++) free(text[i]);
  return h;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* First lines of the log that mention an error (or its last lines), for the job's message. */
static void log_excerpt(const char *log, char *out, size_t len) {
  out[0] = 0;
  FILE *f = fopen(log, "r");
  if (!f) return;
  char line[512];
  size_t pos = 0;
  int found = 0;
  while (fgets(line, sizeof line, f) && found < 3)
    if (strstr(line, "error")) {
      int w = snprintf(out + pos, len - pos, "  %s", line);
      if (w < 0 || (size_t)w >= len - pos) break;
      pos += (size_t)w;
      found++;
    }
  if (!found) { /* no "error" line: show the last line */
    rewind(f);
    char last[512] = "";
    while (fgets(line, sizeof line, f)) snprintf(last, sizeof last, "%s", line);
    snprintf(out, len, "  %s", last);
  }
  fclose(f);
}

typedef struct running {
  pid_t pid;
  int job;
  double t0;
  char tmp[1100], log[1100];
} running;

/* The cache key of a source: included kernel headers, the source, the flags and the compiler's name. */
static uint64_t cache_key(const evt_jit_options *opt, const char *source, const char *flags, const char *nvcc) {
  uint64_t h = evt_hash_bytes(kernel_headers_hash(opt, source), source, strlen(source));
  h = evt_hash_bytes(h, "\n--flags--\n", 11);
  h = evt_hash_bytes(h, flags, strlen(flags));
  return evt_hash_bytes(h, nvcc, strlen(nvcc));
}

static const char *nvcc_of(const evt_jit_options *opt) {
  const char *nvcc = opt->nvcc ? opt->nvcc : evt_env(EVT_ENV_NVCC);
  return nvcc && *nvcc ? nvcc : "nvcc";
}

static void cache_dir_of(const evt_jit_options *opt, char *cache, size_t len) {
  if (opt->cache_dir) snprintf(cache, len, "%s", opt->cache_dir);
  else evt_env_cache_dir("jit", cache, len);
}

evt_status evt_jit_cache_path(const evt_jit_options *opt, const char *name, const char *source, char *out, size_t outlen) {
  evt_jit_options dflt = {0};
  if (!opt) opt = &dflt;
  char flags[4096], cache[1024];
  evt_status st = evt_jit_flags(opt, flags, sizeof flags);
  if (st != EVT_OK) {
    msgf(out, outlen, "%s", flags);
    return st;
  }
  if (!name || !source) return EVT_ERR_INVALID;
  cache_dir_of(opt, cache, sizeof cache);
  const char *ext = opt->frontend_only ? "ii" : opt->compile_only ? "o" : "so";
  msgf(out, outlen, "%s/%s-%016llx.%s", cache, name, (unsigned long long)cache_key(opt, source, flags, nvcc_of(opt)), ext);
  return EVT_OK;
}

evt_status evt_jit_compile(evt_jit_job *jobs, int njobs, const evt_jit_options *opt, char *msg, size_t msglen) {
  evt_jit_options dflt = {0};
  if (!opt) opt = &dflt;
  char flags[4096];
  evt_status st = evt_jit_flags(opt, flags, sizeof flags);
  if (st != EVT_OK) {
    msgf(msg, msglen, "evt_jit: %s", flags);
    return st;
  }
  const char *nvcc = nvcc_of(opt);
  if (has_quote(nvcc)) {
    msgf(msg, msglen, "evt_jit: nvcc path must not contain a single quote");
    return EVT_ERR_INVALID;
  }
  char cache[1024];
  cache_dir_of(opt, cache, sizeof cache);
  if (mkdir_p(cache) != 0 || has_quote(cache)) {
    msgf(msg, msglen, "evt_jit: cannot create cache directory %s", cache);
    return EVT_ERR_IO;
  }
  int par = opt->jobs > 0 ? opt->jobs : (int)evt_env_long(EVT_ENV_JIT_JOBS, 0);
  if (par <= 0) par = (int)sysconf(_SC_NPROCESSORS_ONLN);
  if (par <= 0) par = 1;

  /* the compiler must exist before we start (a missing nvcc would otherwise look like N compile errors) */
  char probe[1200];
  snprintf(probe, sizeof probe, "'%s' --version >/dev/null 2>&1", nvcc);
  if (system(probe) != 0) {
    msgf(msg, msglen, "evt_jit: cannot run nvcc ('%s'); set EVT_NVCC or PATH", nvcc);
    return EVT_ERR_UNSUPPORTED;
  }

  int todo[njobs > 0 ? njobs : 1], ntodo = 0, failed = 0, done = 0, ncached = 0;
  const char *ext = opt->frontend_only ? "ii" : opt->compile_only ? "o" : "so";
  for (int i = 0; i < njobs; i++) {
    evt_jit_job *j = &jobs[i];
    j->ok = j->cached = 0;
    j->error[0] = 0;
    if (!j->name || !*j->name || has_quote(j->name) || strchr(j->name, '/') || !j->source) {
      msgf(j->error, sizeof j->error, "evt_jit: job %d has no valid name or source", i);
      failed++;
      continue;
    }
    msgf(j->so_path, sizeof j->so_path, "%s/%s-%016llx.%s", cache, j->name,
         (unsigned long long)cache_key(opt, j->source, flags, nvcc), ext);
    if (file_exists(j->so_path)) {
      j->ok = j->cached = 1;
      ncached++;
      done++;
      continue;
    }
    todo[ntodo++] = i;
  }
  if (!opt->quiet && njobs)
    fprintf(stderr, "[evt-jit] %d kernel(s): %d cached, %d to compile, %d at a time\n", njobs, ncached, ntodo, par);

  running run[par];
  int nrun = 0, next = 0;
  double t_start = now_s();
  while (next < ntodo || nrun > 0) {
    while (nrun < par && next < ntodo) {
      evt_jit_job *j = &jobs[todo[next]];
      running *r = &run[nrun];
      r->job = todo[next++];
      char src[1100];
      snprintf(src, sizeof src, "%.*s.cu", (int)(strlen(j->so_path) - strlen(ext) - 1), j->so_path);
      snprintf(r->log, sizeof r->log, "%.*s.log", (int)(strlen(j->so_path) - strlen(ext) - 1), j->so_path);
      snprintf(r->tmp, sizeof r->tmp, "%s.tmp%ld", j->so_path, (long)getpid());
      FILE *f = fopen(src, "w");
      if (!f || fputs(j->source, f) < 0) {
        if (f) fclose(f);
        msgf(j->error, sizeof j->error, "evt_jit: kernel %s: cannot write %s", j->name, src);
        failed++;
        done++;
        continue;
      }
      fclose(f);
      size_t clen = strlen(flags) + 3 * 1100 + 64 + strlen(nvcc);
      char *cmd = malloc(clen);
      if (!cmd) abort();
      snprintf(cmd, clen, "'%s' %s -o '%s' '%s' >'%s' 2>&1", nvcc, flags, r->tmp, src, r->log);
      r->t0 = now_s();
      pid_t pid = fork();
      if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
      }
      free(cmd);
      if (pid < 0) {
        msgf(j->error, sizeof j->error, "evt_jit: kernel %s: fork failed", j->name);
        failed++;
        done++;
        continue;
      }
      r->pid = pid;
      nrun++;
    }
    if (nrun == 0) break;
    int status = 0;
    pid_t pid = waitpid(-1, &status, 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      break;
    }
    int k = 0;
    while (k < nrun && run[k].pid != pid) k++;
    if (k == nrun) continue; /* not ours */
    running r = run[k];
    run[k] = run[--nrun];
    evt_jit_job *j = &jobs[r.job];
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    done++;
    if (code == 0 && rename(r.tmp, j->so_path) == 0) {
      j->ok = 1;
      if (!opt->quiet)
        fprintf(stderr, "[evt-jit] %d/%d %s compiled in %.1f s\n", done, njobs, j->name, now_s() - r.t0);
    } else {
      char ex[700];
      log_excerpt(r.log, ex, sizeof ex);
      unlink(r.tmp);
      msgf(j->error, sizeof j->error, "evt_jit: kernel %s failed to compile (nvcc exit %d); log %s:\n%s", j->name,
               code, r.log, ex);
      failed++;
      if (!opt->quiet) fprintf(stderr, "[evt-jit] %d/%d %s FAILED (exit %d)\n", done, njobs, j->name, code);
    }
  }
  if (!opt->quiet && ntodo)
    fprintf(stderr, "[evt-jit] done: %d compiled, %d cached, %d failed in %.1f s\n", ntodo - failed, ncached, failed,
            now_s() - t_start);
  if (failed) {
    for (int i = 0; i < njobs; i++)
      if (!jobs[i].ok) {
        msgf(msg, msglen, "%s", jobs[i].error);
        break;
      }
    return EVT_ERR_INVALID;
  }
  return EVT_OK;
}
