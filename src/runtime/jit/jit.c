/* JIT compilation of generated kernels with nvcc, cached by hash of source + flags + compiler (contract in jit.h).
 *
 * Design: C11 + POSIX only; nvcc is run through /bin/sh with every path single-quoted (paths holding a
 * quote are refused). Up to `jobs` compiles run at once (one CUTLASS Sm90 GEMM takes ~50 s and ~4 GB on
 * one core). Cache rules (private folder, locks, temporary names, sidecar checksums): util/cachedir.h.
 */
#include "runtime/jit/jit.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util/cachedir.h"
#include "util/env.h"
#include "util/util.h"

static int file_exists(const char *p) {
  struct stat st;
  return stat(p, &st) == 0;
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

void evt_jit_gencode(int arch, int ptx, char *out, size_t outlen) {
  if (arch == 80 || arch == 86 || arch == 89)
    snprintf(out, outlen, "-gencode=arch=compute_%d,code=%s_%d", arch, ptx ? "compute" : "sm", arch);
  else snprintf(out, outlen, "-gencode=arch=compute_90a,code=%s_90a", ptx ? "compute" : "sm");
}

evt_status evt_jit_flags(const evt_jit_options *opt, char *out, size_t outlen) {
  char inc[1024], util[1024];
  int nocut = opt && opt->no_cutlass;
  if (nocut) {
    inc[0] = util[0] = 0;
  } else if (evt_jit_find_cutlass(opt ? opt->cutlass_path : NULL, inc, sizeof inc, util, sizeof util) != EVT_OK) {
    evt_msgf(out, outlen, "CUTLASS not found: set CUTLASS_PATH or pip install nvidia-cutlass==4.2.0.0");
    return EVT_ERR_UNSUPPORTED;
  }
  const char *kdir = opt && opt->kernels_dir ? opt->kernels_dir : evt_kernels_dir();
  const char *extra = opt && opt->extra_flags ? opt->extra_flags : "";
  if (has_quote(inc) || has_quote(util) || has_quote(kdir)) {
    evt_msgf(out, outlen, "include paths must not contain a single quote");
    return EVT_ERR_INVALID;
  }
  char gencode[96];
  evt_jit_gencode(opt ? opt->arch : 0, opt ? opt->ptx : 0, gencode, sizeof gencode);
  int n = snprintf(out, outlen,
                   "-std=c++17 --expt-relaxed-constexpr -O3 -DNDEBUG %s "
                   "-Xcompiler -fPIC -I'%s'%s%s%s%s%s%s%s%s%s",
                   gencode, kdir, nocut ? "" : " -I'", inc, nocut ? "" : "'", nocut ? "" : " -I'", util, nocut ? "" : "'",
                   opt && opt->frontend_only  ? " -cuda"
                   : opt && opt->compile_only ? " -c"
                                              : " -shared -lcuda", *extra ? " " : "", extra);
  if (n < 0 || (size_t)n >= outlen) {
    evt_msgf(out, outlen, "nvcc flags too long");
    return EVT_ERR_INVALID;
  }
  return EVT_OK;
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
    text[i] = evt_read_file(path, &len[i]);
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

/* One batch's settings. */
typedef struct jit_ctx {
  const evt_jit_options *opt;
  char flags[4096], cache[1024];
  const char *nvcc, *ext;
  uint64_t compiler; /* hash of nvcc's path and its `--version` output */
} jit_ctx;

/* The cache key of a source: included kernel headers, the source, the flags and the compiler. */
static uint64_t cache_key(const jit_ctx *c, const char *source) {
  uint64_t h = evt_hash_bytes(kernel_headers_hash(c->opt, source), source, strlen(source));
  h = evt_hash_bytes(h, "\n--flags--\n", 11);
  h = evt_hash_bytes(h, c->flags, strlen(c->flags));
  return evt_hash_bytes(h, &c->compiler, sizeof c->compiler);
}

static const char *nvcc_of(const evt_jit_options *opt) {
  const char *nvcc = opt->nvcc ? opt->nvcc : evt_env(EVT_ENV_NVCC);
  return nvcc && *nvcc ? nvcc : "nvcc";
}

/* Hash of the compiler's path and `--version` output (an upgraded nvcc is another compiler); -1: it cannot run. */
static int compiler_id(const char *nvcc, uint64_t *id) {
  char cmd[1200], buf[512];
  snprintf(cmd, sizeof cmd, "'%s' --version 2>&1", nvcc);
  FILE *f = popen(cmd, "r");
  if (!f) return -1;
  uint64_t h = evt_hash_bytes(0, nvcc, strlen(nvcc));
  size_t r;
  while ((r = fread(buf, 1, sizeof buf, f)) > 0) h = evt_hash_bytes(h, buf, r);
  if (pclose(f) != 0) return -1;
  *id = h;
  return 0;
}

/* Flags, compiler and cache folder of a batch; with `prepare` the folder is created and checked (private). */
static evt_status jit_setup(jit_ctx *c, const evt_jit_options *opt, int prepare, char *msg, size_t msglen) {
  c->opt = opt;
  c->ext = opt->frontend_only ? "ii" : opt->compile_only ? "o" : "so";
  evt_status st = evt_jit_flags(opt, c->flags, sizeof c->flags);
  if (st != EVT_OK) return evt_msgf(msg, msglen, "evt_jit: %s", c->flags), st;
  c->nvcc = nvcc_of(opt);
  if (has_quote(c->nvcc)) return evt_msgf(msg, msglen, "evt_jit: nvcc path must not contain a single quote"), EVT_ERR_INVALID;
  if (opt->cache_dir) snprintf(c->cache, sizeof c->cache, "%s", opt->cache_dir);
  else evt_env_cache_dir("jit", c->cache, sizeof c->cache);
  char why[1200];
  if (has_quote(c->cache)) return evt_msgf(msg, msglen, "evt_jit: cache directory %s has a quote", c->cache), EVT_ERR_IO;
  if (prepare && evt_cache_dir_private(c->cache, opt->cache_dir ? 1 : 2, 1, why, sizeof why) != 0)
    return evt_msgf(msg, msglen, "evt_jit: %s", why), EVT_ERR_IO;
  if (compiler_id(c->nvcc, &c->compiler) != 0) /* before any job: a missing nvcc is not N compile errors */
    return evt_msgf(msg, msglen, "evt_jit: cannot run nvcc ('%s'); set EVT_NVCC or PATH", c->nvcc), EVT_ERR_UNSUPPORTED;
  return EVT_OK;
}

static uint64_t entry_path(const jit_ctx *c, const char *name, const char *source, char *out, size_t len) {
  uint64_t key = cache_key(c, source);
  evt_msgf(out, len, "%s/%s-%016llx.%s", c->cache, name, (unsigned long long)key, c->ext);
  return key;
}

evt_status evt_jit_cache_path(const evt_jit_options *opt, const char *name, const char *source, char *out, size_t outlen) {
  evt_jit_options dflt = {0};
  jit_ctx c;
  evt_status st = jit_setup(&c, opt ? opt : &dflt, 0, out, outlen);
  if (st != EVT_OK) return st;
  if (!name || !source) return EVT_ERR_INVALID;
  entry_path(&c, name, source, out, outlen);
  return EVT_OK;
}

typedef struct running {
  pid_t pid;
  int job, lock;
  double t0;
  char tmp[1400], log[1400], tmplog[1400];
} running;

/* The jobs of one evt_jit_compile call and their progress. */
typedef struct batch {
  evt_jit_job *jobs;
  int njobs, par;
  uint64_t *key;
  int *pending, npending; /* jobs still to claim, in order */
  running *run;
  int nrun, done, failed, ncached, ncompiled;
  int ntodo;      /* compiles this batch runs (not cache hits) */
  double t_start; /* when the batch started: the progress line's ETA */
} batch;

static void job_failed(batch *b, int i, const char *why) {
  evt_msgf(b->jobs[i].error, sizeof b->jobs[i].error, "evt_jit: kernel %s: %s", b->jobs[i].name, why);
  b->failed++, b->done++;
}

/* The paths next to an entry: <entry without its extension><suffix>. */
static void sibling(const jit_ctx *c, const char *entry, const char *suffix, char *out, size_t len) {
  snprintf(out, len, "%.*s%s", (int)(strlen(entry) - strlen(c->ext) - 1), entry, suffix);
}

/* Writes the source, reserves the object's temporary name and forks nvcc with its output into a fresh log. */
static int start_compile(const jit_ctx *c, batch *b, int i, int lock) {
  evt_jit_job *j = &b->jobs[i];
  running *r = &b->run[b->nrun];
  char src[1400];
  sibling(c, j->so_path, ".cu", src, sizeof src);
  sibling(c, j->so_path, ".log", r->log, sizeof r->log);
  if (evt_cache_write(src, j->source, strlen(j->source)) != 0) return job_failed(b, i, "cannot write its source"), -1;
  int out = evt_cache_tmp_open(j->so_path, r->tmp, sizeof r->tmp);
  int logfd = out >= 0 ? evt_cache_tmp_open(r->log, r->tmplog, sizeof r->tmplog) : -1;
  if (out >= 0) close(out);
  if (logfd < 0) {
    if (out >= 0) unlink(r->tmp);
    return job_failed(b, i, "cannot create files in the cache folder"), -1;
  }
  size_t clen = strlen(c->flags) + strlen(c->nvcc) + 3000;
  char *cmd = malloc(clen);
  EVT_ASSERT(cmd);
  snprintf(cmd, clen, "'%s' %s -o '%s' '%s'", c->nvcc, c->flags, r->tmp, src);
  r->t0 = evt_now_s();
  pid_t pid = fork();
  if (pid == 0) {
    dup2(logfd, 1), dup2(logfd, 2);
    execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
    _exit(127);
  }
  free(cmd);
  close(logfd);
  if (pid < 0) {
    unlink(r->tmp), unlink(r->tmplog);
    return job_failed(b, i, "fork failed"), -1;
  }
  r->pid = pid, r->job = i, r->lock = lock;
  b->nrun++;
  return 0;
}

/* Takes job i's entry lock (waiting for it when wait is set); then the entry is a hit (another process built
 * it meanwhile) or compiled by us. -1: the lock is busy. */
static int claim(const jit_ctx *c, batch *b, int i, int wait) {
  evt_jit_job *j = &b->jobs[i];
  int lock = evt_cache_lock(j->so_path, wait);
  if (lock == -1) return -1;
  char why[600];
  struct stat st;
  if (evt_cache_object_verified(j->so_path, b->key[i], why, sizeof why)) {
    j->ok = j->cached = 1;
    b->ncached++, b->done++;
    evt_cache_unlock(lock);
    return 0;
  }
  if (lstat(j->so_path, &st) == 0) fprintf(stderr, "[evt-jit] cache entry %s: %s; rebuilding\n", j->so_path, why);
  if (start_compile(c, b, i, lock) != 0) evt_cache_unlock(lock);
  return 0;
}

/* Claims pending jobs whose locks are free while fewer than par compiles run; 1 if any was claimed. */
static int claim_free(const jit_ctx *c, batch *b) {
  int kept = 0, any = 0;
  for (int k = 0; k < b->npending; k++) {
    int i = b->pending[k];
    if (b->nrun < b->par && claim(c, b, i, 0) == 0) any = 1;
    else b->pending[kept++] = i;
  }
  b->npending = kept;
  return any;
}

/* One line per finished compile: what, how long, and the batch's estimated time left (the compiles so far set
 * the pace; the running ones overlap). */
static void progress(const batch *b, const char *name, double took) {
  int finished = b->ncompiled + b->failed, left = b->ntodo - finished;
  double elapsed = evt_now_s() - b->t_start;
  if (left > 0 && finished > 0)
    fprintf(stderr, "[evt-jit] %d/%d %s compiled in %.1f s; about %.0f s left\n", b->done, b->njobs, name, took,
            elapsed / finished * left);
  else
    fprintf(stderr, "[evt-jit] %d/%d %s compiled in %.1f s\n", b->done, b->njobs, name, took);
}

/* A finished nvcc: its log and object are renamed into place, the object sealed, the lock released. */
static void finish(const jit_ctx *c, batch *b, running *r, int status) {
  evt_jit_job *j = &b->jobs[r->job];
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  rename(r->tmplog, r->log);
  b->done++;
  if (code == 0 && rename(r->tmp, j->so_path) == 0 && evt_cache_object_seal(j->so_path, b->key[r->job]) == 0) {
    j->ok = 1;
    b->ncompiled++;
    if (!c->opt->quiet) progress(b, j->name, evt_now_s() - r->t0);
  } else {
    char ex[700];
    log_excerpt(r->log, ex, sizeof ex);
    unlink(r->tmp);
    evt_msgf(j->error, sizeof j->error, "evt_jit: kernel %s failed to compile (nvcc exit %d); log %s:\n%s", j->name, code,
         r->log, ex);
    b->failed++;
    if (!c->opt->quiet) fprintf(stderr, "[evt-jit] %d/%d %s FAILED (exit %d)\n", b->done, b->njobs, j->name, code);
  }
  evt_cache_unlock(r->lock);
}

static void reap_one(const jit_ctx *c, batch *b) {
  int status = 0;
  pid_t pid = waitpid(-1, &status, 0);
  if (pid < 0) {
    if (errno != EINTR) /* no children left: the running ones are lost */
      while (b->nrun > 0) finish(c, b, &b->run[--b->nrun], 127 << 8);
    return;
  }
  for (int k = 0; k < b->nrun; k++)
    if (b->run[k].pid == pid) {
      running r = b->run[k];
      b->run[k] = b->run[--b->nrun];
      finish(c, b, &r, status);
      return;
    }
}

/* Compiles the pending jobs, up to par at a time. A job whose entry another process is building waits for it,
 * but only while this process holds no lock (no compile of its own runs), so two batches never wait on each
 * other. */
static void run_batch(const jit_ctx *c, batch *b) {
  while (b->npending > 0 || b->nrun > 0) {
    int claimed = claim_free(c, b);
    if (b->nrun > 0) reap_one(c, b);
    else if (b->npending > 0 && !claimed) {
      int i = b->pending[0];
      memmove(b->pending, b->pending + 1, (size_t)--b->npending * sizeof *b->pending);
      claim(c, b, i, 1);
    }
  }
}

/* Job i's entry path and key; a verified entry is a hit, anything else is pending. */
static void prepare_job(const jit_ctx *c, batch *b, int i) {
  evt_jit_job *j = &b->jobs[i];
  j->ok = j->cached = 0;
  j->error[0] = 0;
  if (!j->name || !*j->name || has_quote(j->name) || strchr(j->name, '/') || !j->source) {
    evt_msgf(j->error, sizeof j->error, "evt_jit: job %d has no valid name or source", i);
    b->failed++;
    return;
  }
  b->key[i] = entry_path(c, j->name, j->source, j->so_path, sizeof j->so_path);
  if (evt_cache_object_verified(j->so_path, b->key[i], NULL, 0)) {
    j->ok = j->cached = 1;
    b->ncached++, b->done++;
  } else {
    b->pending[b->npending++] = i;
  }
}

static int parallelism(const evt_jit_options *opt) {
  int par = opt->jobs > 0 ? opt->jobs : (int)evt_env_long(EVT_ENV_JIT_JOBS, 0);
  if (par <= 0) par = (int)sysconf(_SC_NPROCESSORS_ONLN);
  return par > 0 ? par : 1;
}

evt_status evt_jit_compile(evt_jit_job *jobs, int njobs, const evt_jit_options *opt, char *msg, size_t msglen) {
  evt_jit_options dflt = {0};
  jit_ctx c;
  evt_status st = jit_setup(&c, opt ? opt : &dflt, 1, msg, msglen);
  if (st != EVT_OK) return st;
  int n1 = njobs > 0 ? njobs : 1;
  batch b = {.jobs = jobs, .njobs = njobs, .par = parallelism(c.opt)};
  b.key = calloc((size_t)n1, sizeof *b.key);
  b.pending = calloc((size_t)n1, sizeof *b.pending);
  b.run = calloc((size_t)b.par, sizeof *b.run);
  EVT_ASSERT(b.key && b.pending && b.run);
  for (int i = 0; i < njobs; i++) prepare_job(&c, &b, i);
  int ntodo = b.ntodo = b.npending;
  if (!c.opt->quiet && njobs)
    fprintf(stderr, "[evt-jit] %d kernel(s): %d cached, %d to compile, %d at a time\n", njobs, b.ncached, ntodo, b.par);
  double t_start = b.t_start = evt_now_s();
  run_batch(&c, &b);
  if (!c.opt->quiet && ntodo)
    fprintf(stderr, "[evt-jit] done: %d compiled, %d cached, %d failed in %.1f s\n", b.ncompiled, b.ncached, b.failed,
            evt_now_s() - t_start);
  free(b.key), free(b.pending), free(b.run);
  if (!b.failed) return EVT_OK;
  for (int i = 0; i < njobs; i++)
    if (!jobs[i].ok) {
      evt_msgf(msg, msglen, "%s", jobs[i].error);
      break;
    }
  return EVT_ERR_INVALID;
}
