/* The disk caches trust nothing they find (docs/config.md, "Caches"): tampered JIT entries, tuning records and
 * partition solutions are rebuilt; directories owned by someone else, writable by others or planted as symlinks
 * are refused; two processes compiling one kernel compile it once. */
#include "test.h"

#include <dirent.h>
#include <fcntl.h>
#include <pwd.h>
#include <sys/wait.h>

#include "partition/partition.h"
#include "tune/tune.h"
#include "util/cachedir.h"
#include "util/util.h"

static int count_lines(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  int n = 0, c;
  while ((c = fgetc(f)) != EOF) n += c == '\n';
  fclose(f);
  return n;
}

static void write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  CHECK(f != NULL);
  if (f) fputs(text, f), fclose(f);
}

static char *read_text(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *buf = calloc(1, 1 << 16);
  size_t n = fread(buf, 1, (1 << 16) - 1, f);
  buf[n] = 0;
  fclose(f);
  return buf;
}

/* A fake nvcc in dir: --version succeeds; a compile sleeps `delay` seconds, appends a line to dir/calls.txt
 * and writes the source's bytes as the object. */
static void fake_nvcc(const char *dir, int delay) {
  char path[400], text[1000];
  snprintf(path, sizeof path, "%s/nvcc", dir);
  snprintf(text, sizeof text,
           "#!/bin/sh\n[ \"$1\" = --version ] && exit 0\nout=''; src=''\n"
           "while [ $# -gt 0 ]; do case \"$1\" in -o) out=$2; shift;; *.cu) src=$1;; esac; shift; done\n"
           "sleep %d\necho \"$$ $src\" >> %s/calls.txt\ncat \"$src\" > \"$out\"\n",
           delay, dir);
  write_text(path, text);
  chmod(path, 0755);
}

static evt_jit_options jit_opts(const char *dir, char *nvcc, char *cache) {
  sprintf(nvcc, "%s/nvcc", dir);
  sprintf(cache, "%s/jit", dir);
  return (evt_jit_options){.nvcc = nvcc, .cache_dir = cache, .kernels_dir = "kernels", .jobs = 2, .quiet = 1,
                           .no_cutlass = 1};
}

/* Sends stderr into dir/stderr.txt (emptied) until stderr_back(the returned descriptor). */
static int stderr_to(const char *dir) {
  char path[400];
  snprintf(path, sizeof path, "%s/stderr.txt", dir);
  fflush(stderr);
  int saved = dup(2), fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  dup2(fd, 2);
  close(fd);
  return saved;
}

static void stderr_back(int saved) {
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
}

/* Runs evt_jit_compile with stderr into dir/stderr.txt; returns its status. */
static evt_status compile_logged(evt_jit_job *j, int n, const evt_jit_options *o, const char *dir, char *msg, size_t len) {
  int saved = stderr_to(dir);
  evt_status st = evt_jit_compile(j, n, o, msg, len);
  stderr_back(saved);
  return st;
}

static int stderr_count(const char *dir, const char *what) {
  char path[400];
  snprintf(path, sizeof path, "%s/stderr.txt", dir);
  char *t = read_text(path);
  int n = 0;
  for (const char *p = t ? strstr(t, what) : NULL; p; p = strstr(p + 1, what)) n++;
  free(t);
  return n;
}

TEST(jit_cache_rebuilds_tampered_entries) {
  char dir[128], nvcc[200], cache[200], calls[200], msg[1024];
  evt_test_tmpdir(dir, sizeof dir, "jit-tamper");
  fake_nvcc(dir, 0);
  snprintf(calls, sizeof calls, "%s/calls.txt", dir);
  evt_jit_options o = jit_opts(dir, nvcc, cache);
  evt_jit_job job = {.name = "evt_kernel_t", .source = "int tampered_test;\n"};
  CHECK(evt_jit_compile(&job, 1, &o, msg, sizeof msg) == EVT_OK && job.ok && !job.cached);
  CHECK(count_lines(calls) == 1);
  /* random bytes, then a truncation to 0 bytes: each rebuilt, saying so once on stderr */
  const char *tamper[] = {"head -c 4096 /dev/urandom > '%s'", ": > '%s'"};
  for (int t = 0; t < 2; t++) {
    char cmd[1400];
    snprintf(cmd, sizeof cmd, tamper[t], job.so_path);
    CHECK(system(cmd) == 0);
    CHECK(compile_logged(&job, 1, &o, dir, msg, sizeof msg) == EVT_OK && job.ok);
    CHECK_MSG(!job.cached, "tampered entry %d reported cached", t);
    CHECK(count_lines(calls) == 2 + t);
    CHECK_MSG(stderr_count(dir, "rebuilding") == 1, "tamper %d: one line on stderr", t);
    char *back = read_text(job.so_path);
    CHECK(back && !strcmp(back, job.source));
    free(back);
  }
  /* the rebuilt entry is a hit again, silently */
  CHECK(compile_logged(&job, 1, &o, dir, msg, sizeof msg) == EVT_OK && job.cached);
  CHECK(count_lines(calls) == 3 && stderr_count(dir, "rebuilding") == 0);
  evt_test_rmdir(dir);
}

/* Two processes compile the same kernel at once with a slow nvcc: nvcc runs once, both get the entry. */
TEST(jit_concurrent_compiles_of_one_kernel_wait) {
  char dir[128], nvcc[200], cache[200], calls[200], msg[1024];
  evt_test_tmpdir(dir, sizeof dir, "jit-lock");
  fake_nvcc(dir, 1);
  snprintf(calls, sizeof calls, "%s/calls.txt", dir);
  evt_jit_options o = jit_opts(dir, nvcc, cache);
  pid_t pid[2];
  for (int i = 0; i < 2; i++)
    if ((pid[i] = fork()) == 0) {
      evt_jit_job job = {.name = "evt_kernel_c", .source = "int concurrent_test;\n"};
      evt_status st = evt_jit_compile(&job, 1, &o, msg, sizeof msg);
      _exit(st == EVT_OK && job.ok ? 0 : 1);
    }
  for (int i = 0; i < 2; i++) {
    int status = -1;
    CHECK(waitpid(pid[i], &status, 0) == pid[i] && WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  CHECK_MSG(count_lines(calls) == 1, "nvcc ran %d times", count_lines(calls));
  evt_test_rmdir(dir);
}

/* A kernel's source file planted as a symlink to someone's file: the file is left alone. */
TEST(jit_does_not_follow_planted_symlinks) {
  char dir[128], nvcc[200], cache[200], msg[1024], victim[300], link[1200];
  evt_test_tmpdir(dir, sizeof dir, "jit-link");
  fake_nvcc(dir, 0);
  evt_jit_options o = jit_opts(dir, nvcc, cache);
  CHECK(mkdir(cache, 0700) == 0);
  snprintf(victim, sizeof victim, "%s/victim", dir);
  write_text(victim, "precious\n");
  chmod(victim, 0600);
  evt_jit_job job = {.name = "evt_kernel_l", .source = "int symlink_test;\n"};
  char so[1024];
  CHECK(evt_jit_cache_path(&o, job.name, job.source, so, sizeof so) == EVT_OK);
  const char *ext[] = {".cu", ".log"};
  for (int i = 0; i < 2; i++) {
    snprintf(link, sizeof link, "%.*s%s", (int)(strlen(so) - 3), so, ext[i]);
    CHECK(symlink(victim, link) == 0);
  }
  CHECK(evt_jit_compile(&job, 1, &o, msg, sizeof msg) == EVT_OK && job.ok);
  char *t = read_text(victim);
  CHECK_MSG(t && !strcmp(t, "precious\n"), "the victim now holds: %s", t ? t : "(unreadable)");
  free(t);
  evt_test_rmdir(dir);
}

static evt_tune_record tune_example(void) {
  evt_tune_record r;
  memset(&r, 0, sizeof r);
  r.spec_hash = 0x1234, r.m = 256, r.n = 512, r.k = 64;
  snprintf(r.gpu, sizeof r.gpu, "NVIDIA H200");
  r.choice = EVT_TUNE_FUSED;
  r.cfg = EVT_TILE_CONFIG_DEFAULT;
  r.swizzle = 8, r.raster = 1;
  r.fused_ms = 0.1, r.unfused_ms = 0.2, r.default_ms = 0.15, r.check_err = 1e-3;
  r.ncand = 1;
  r.cand[0].cfg = r.cfg, r.cand[0].ms = 0.1, r.cand[0].swizzle = 8, r.cand[0].raster = 1;
  r.source_hash = 0x5678;
  return r;
}

/* A tuning record edited (another swizzle), overwritten with random bytes or truncated is not read. */
TEST(tune_records_with_a_bad_checksum_are_ignored) {
  char dir[128], msg[256], name[200], path[500], cmd[800];
  evt_test_tmpdir(dir, sizeof dir, "tune-sum");
  evt_tune_record r = tune_example(), q;
  CHECK(evt_tune_record_write(dir, &r, msg, sizeof msg) == EVT_OK);
  CHECK(evt_tune_record_read(dir, r.spec_hash, r.m, r.n, r.k, r.gpu, &q) == EVT_OK && q.swizzle == 8);
  evt_tune_record_name(r.spec_hash, r.m, r.n, r.k, r.gpu, name, sizeof name);
  snprintf(path, sizeof path, "%s/tune/%s", dir, name);
  const char *tamper[] = {"sed -i 's/^swizzle 8$/swizzle 2/' '%s'", "head -c 300 /dev/urandom > '%s'", ": > '%s'"};
  for (int t = 0; t < 3; t++) {
    CHECK(evt_tune_record_write(dir, &r, msg, sizeof msg) == EVT_OK);
    snprintf(cmd, sizeof cmd, tamper[t], path);
    CHECK(system(cmd) == 0);
    CHECK_MSG(evt_tune_record_read(dir, r.spec_hash, r.m, r.n, r.k, r.gpu, &q) != EVT_OK, "tamper %d read back", t);
    CHECK(evt_tune_record_read(dir, r.spec_hash, r.m, r.n, r.k, NULL, &q) != EVT_OK);
  }
  evt_test_rmdir(dir);
}

/* A cache directory of another user, one writable by its group, a planted symlink: refused with one line that
 * says how to fix it; nothing written there. */
TEST(cache_dirs_of_others_are_refused) {
  char dir[128], nvcc[200], cache[200], msg[1024], cmd[600];
  evt_test_tmpdir(dir, sizeof dir, "cache-priv");
  fake_nvcc(dir, 0);
  evt_jit_options o = jit_opts(dir, nvcc, cache);
  evt_jit_job job = {.name = "evt_kernel_p", .source = "int private_test;\n"};
  struct passwd *nobody = getpwnam("nobody");
  CHECK(mkdir(cache, 0700) == 0);
  if (getuid() == 0 && nobody) {
    CHECK(chown(cache, nobody->pw_uid, nobody->pw_gid) == 0);
    CHECK(evt_jit_compile(&job, 1, &o, msg, sizeof msg) == EVT_ERR_IO && !job.ok);
    CHECK_MSG(strstr(msg, "owned by") && strstr(msg, cache) && !strchr(msg, '\n'), "%s", msg);
    CHECK(chown(cache, getuid(), getgid()) == 0);
  } else {
    fprintf(stderr, "note: cache_dirs_of_others_are_refused: not root, the other-owner case is skipped\n");
  }
  CHECK(chmod(cache, 0770) == 0);
  CHECK(evt_jit_compile(&job, 1, &o, msg, sizeof msg) == EVT_ERR_IO && strstr(msg, "writable"));
  snprintf(cmd, sizeof cmd, "rmdir '%s' && mkdir '%s/elsewhere' && ln -s elsewhere '%s'", cache, dir, cache);
  CHECK(system(cmd) == 0);
  CHECK(evt_jit_compile(&job, 1, &o, msg, sizeof msg) == EVT_ERR_IO && strstr(msg, "symbolic link"));
  snprintf(cmd, sizeof cmd, "test -z \"$(ls -A '%s/elsewhere')\"", dir);
  CHECK_MSG(system(cmd) == 0, "something was written through the symlink");
  /* tuning records: not written into a group-writable root */
  snprintf(cmd, sizeof cmd, "%s/troot", dir);
  CHECK(mkdir(cmd, 0775) == 0 && chmod(cmd, 0775) == 0);
  evt_tune_record r;
  memset(&r, 0, sizeof r);
  r.m = r.n = r.k = 8, r.choice = EVT_TUNE_UNFUSED;
  CHECK(evt_tune_record_write(cmd, &r, msg, sizeof msg) == EVT_ERR_IO && strstr(msg, "writable"));
  evt_test_rmdir(dir);
}

/* Layers of GEMM -> two pointwise ops -> a reduction (+ a residual): every fusion is optional (no FUSE edge),
 * so one kernel per node is a legal grouping, and a costly one. */
static evt_pgraph *chain_layers(int layers) {
  int per = 4, n = 1 + per * layers;
  evt_pgraph *g = evt_pgraph_new(n);
  g->nodes[0].flags = EVT_PN_SOURCE;
  g->nodes[0].bytes = 1 << 20;
  int prev = 0;
  for (int l = 0; l < layers; l++) {
    int b = 1 + per * l;
    g->nodes[b].flags = EVT_PN_NUCLEUS | EVT_PN_CUT_IN;
    g->nodes[b + 3].flags = EVT_PN_CUT_OUT;
    for (int i = 0; i < per; i++) g->nodes[b + i].bytes = 1 << 20, g->nodes[b + i].label = (uint64_t)i;
    evt_pgraph_add_edge(g, prev, b);
    for (int i = 0; i < 3; i++) evt_pgraph_add_edge(g, b + i, b + i + 1);
    prev = b + 2;
  }
  g->nodes[prev].flags |= EVT_PN_OUTPUT;
  g->lambda = 1 << 20;
  evt_pgraph_finish(g);
  return g;
}

/* Rewrites every cached block solution in dir as singletons (a legal grouping, each node its own kernel),
 * keeping the rest of the entry (its cost claim); with reseal its checksum is made to match again. How many. */
static int plant_singletons(const char *dir, bool reseal) {
  DIR *d = opendir(dir);
  if (!d) return 0;
  int count = 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    if (strncmp(de->d_name, "partition-", 10) || !strstr(de->d_name, ".txt") || strstr(de->d_name, ".part")) continue;
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
    char *t = read_text(path), *nl = t ? strchr(t, '\n') : NULL, *nl2 = nl ? strchr(nl + 1, '\n') : NULL;
    int opt, n;
    if (!nl2 || sscanf(nl + 1, "%d %d", &opt, &n) != 2) {
      free(t);
      continue;
    }
    evt_sbuf b = {0};
    evt_sbuf_printf(&b, "%.*s%d %d", (int)(nl + 1 - t), t, opt, n);
    for (int i = 0; i < n; i++) evt_sbuf_printf(&b, " %d", i);
    evt_sbuf_printf(&b, "%s", nl2);
    if (reseal) b.p = evt_cache_seal_text(b.p, strlen(b.p) - 26); /* (in place of the old checksum line) */
    write_text(path, b.p);
    free(b.p), free(t);
    count++;
  }
  closedir(d);
  return count;
}

/* A cached partition that is legal but costlier than the solver's is not taken (nor called proven optimal). */
TEST(partition_cache_recosts_cached_groupings) {
  char dir[128];
  evt_test_tmpdir(dir, sizeof dir, "part-cost");
  evt_pgraph *g = chain_layers(3);
  int best[32], got[32];
  evt_part_stats st;
  evt_part_options o = evt_part_options_default();
  o.cache_dir = dir;
  CHECK(evt_part_solve(g, &o, best, &st) == EVT_OK && st.proven);
  double cost = evt_part_evaluate(g, best).total;
  int single[32];
  for (int v = 0; v < g->n; v++) single[v] = v;
  CHECK(evt_part_validate(g, single) == EVT_OK && evt_part_evaluate(g, single).total > 1.5 * cost);
  /* an edited entry (its checksum fails), then one resealed but whose grouping does not cost what it claims */
  for (int reseal = 0; reseal < 2; reseal++) {
    int planted = plant_singletons(dir, reseal), saved = stderr_to(dir);
    CHECK(planted > 0);
    CHECK(evt_part_solve(g, &o, got, &st) == EVT_OK);
    stderr_back(saved);
    CHECK_MSG(stderr_count(dir, reseal ? "not the" : "fails its checksum") == planted, "reseal %d", reseal);
    CHECK_MSG(st.disk_hits == 0, "%d disk hits on planted groupings", st.disk_hits);
    CHECK_NEAR(evt_part_evaluate(g, got).total, cost, 1e-9 * cost);
    CHECK(st.proven);
    /* the solutions were written again: the next solve hits them */
    CHECK(evt_part_solve(g, &o, got, &st) == EVT_OK && st.disk_hits >= 1 && st.proven);
    CHECK_NEAR(evt_part_evaluate(g, got).total, cost, 1e-9 * cost);
  }
  evt_pgraph_free(g);
  evt_test_rmdir(dir);
}
