/* Private cache folders, atomic writes, checksums, entry locks (contract in cachedir.h). */
#include "util/cachedir.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "util/util.h"

/* ---- folders ------------------------------------------------------------------------------------------ */

/* Prints a refusal once per process. */
static void warn_once(const char *msg) {
  static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  static uint64_t seen[32];
  static int nseen;
  uint64_t h = evt_hash_bytes(0, msg, strlen(msg));
  pthread_mutex_lock(&mu);
  int dup = 0;
  for (int i = 0; i < nseen && !dup; i++) dup = seen[i] == h;
  if (!dup && nseen < EVT_ARRAY_LEN(seen)) seen[nseen++] = h;
  pthread_mutex_unlock(&mu);
  if (!dup) fprintf(stderr, "evt: warning: %s\n", msg);
}

/* One folder's rule: a directory (not a symlink) of the effective user, not writable by group or others. */
static int check_one(const char *dir, char *msg, size_t len) {
  struct stat st;
  if (lstat(dir, &st) != 0) return evt_msgf(msg, len, "cannot use cache folder %s: %s", dir, strerror(errno)), -2;
  if (S_ISLNK(st.st_mode))
    return evt_msgf(msg, len, "cache folder %s is a symbolic link: not used (replace it by a real folder, or set "
                "EVT_CACHE_DIR to a private one)", dir), -1;
  if (!S_ISDIR(st.st_mode)) return evt_msgf(msg, len, "cache folder %s is not a directory: not used", dir), -1;
  if (st.st_uid != geteuid())
    return evt_msgf(msg, len, "cache folder %s is owned by uid %u, not by you (uid %u): not used (remove it, or set "
                "EVT_CACHE_DIR to a folder of your own)", dir, (unsigned)st.st_uid, (unsigned)geteuid()), -1;
  if (st.st_mode & (S_IWGRP | S_IWOTH))
    return evt_msgf(msg, len, "cache folder %s is writable by its group or others (mode %03o): not used (chmod go-w %s)",
                dir, (unsigned)(st.st_mode & 0777), dir), -1;
  return 0;
}

int evt_cache_dir_private(const char *dir, int levels, int create, char *msg, size_t len) {
  char p[1024];
  if (!dir || !*dir || snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p)
    return evt_msgf(msg, len, "no usable cache folder"), -2;
  for (size_t n = strlen(p); n > 1 && p[n - 1] == '/'; n--) p[n - 1] = 0;
  if (create && evt_mkdirs(p, 0700) != 0) return evt_msgf(msg, len, "cannot create cache folder %s: %s", p, strerror(errno)), -2;
  for (int i = 0; i < levels; i++) { /* dir, then the folders above it */
    int rc = check_one(p, msg, len);
    if (rc == -1) warn_once(msg);
    if (rc) return rc;
    char *slash = strrchr(p, '/');
    if (!slash || slash == p) break;
    *slash = 0;
  }
  return 0;
}

/* ---- files -------------------------------------------------------------------------------------------- */

static uint64_t random_word(void) {
  uint64_t r = 0;
  if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    r = evt_hash_bytes(0, &ts, sizeof ts) ^ (uint64_t)getpid() << 32;
  }
  return r;
}

int evt_cache_tmp_open(const char *path, char *tmp, size_t len) {
  for (int attempt = 0; attempt < 16; attempt++) {
    int w = snprintf(tmp, len, "%s.%ld-%016" PRIx64 ".part", path, (long)getpid(), random_word());
    if (w < 0 || (size_t)w >= len) return -1;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd >= 0 || errno != EEXIST) return fd;
  }
  return -1;
}

static int write_all(int fd, const void *data, size_t n) {
  const char *p = data;
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    p += w, n -= (size_t)w;
  }
  return 0;
}

int evt_cache_write(const char *path, const void *data, size_t n) {
  char tmp[1400];
  int fd = evt_cache_tmp_open(path, tmp, sizeof tmp);
  if (fd < 0) return -1;
  int bad = write_all(fd, data, n) != 0;
  bad |= close(fd) != 0;
  if (!bad && rename(tmp, path) == 0) return 0;
  unlink(tmp);
  return -1;
}

char *evt_cache_read(const char *path, size_t *n) {
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return NULL;
  struct stat st;
  char *buf = NULL;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() && (buf = malloc((size_t)st.st_size + 1))) {
    size_t got = 0;
    ssize_t r = 1;
    while (got < (size_t)st.st_size && (r = read(fd, buf + got, (size_t)st.st_size - got)) > 0) got += (size_t)r;
    if (got != (size_t)st.st_size) free(buf), buf = NULL;
    else buf[got] = 0, *n = got;
  }
  close(fd);
  return buf;
}

/* ---- checksums ---------------------------------------------------------------------------------------- */

#define SUM_TAG "checksum "
#define SUM_LINE 26 /* "checksum " + 16 hex + "\n" */

char *evt_cache_seal_text(char *text, size_t n) {
  char *t = realloc(text, n + SUM_LINE + 1);
  EVT_ASSERT(t);
  snprintf(t + n, SUM_LINE + 1, SUM_TAG "%016" PRIx64 "\n", evt_hash_bytes(0, t, n));
  return t;
}

long evt_cache_text_body(const char *text, size_t n) {
  if (n < SUM_LINE || text[n - 1] != '\n') return -1;
  size_t body = n - SUM_LINE;
  if ((body && text[body - 1] != '\n') || strncmp(text + body, SUM_TAG, strlen(SUM_TAG))) return -1;
  char want[SUM_LINE + 1];
  snprintf(want, sizeof want, SUM_TAG "%016" PRIx64 "\n", evt_hash_bytes(0, text, body));
  return memcmp(want, text + body, SUM_LINE) ? -1 : (long)body;
}

/* ---- locks -------------------------------------------------------------------------------------------- */

int evt_cache_lock(const char *path, int wait) {
  char lock[1400];
  if (snprintf(lock, sizeof lock, "%s.lock", path) >= (int)sizeof lock) return -2;
  int fd = open(lock, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return -2;
  int rc;
  while ((rc = flock(fd, LOCK_EX | (wait ? 0 : LOCK_NB))) != 0 && errno == EINTR) {}
  if (rc == 0) return fd;
  int busy = errno == EWOULDBLOCK;
  close(fd);
  return busy ? -1 : -2;
}

void evt_cache_unlock(int fd) {
  if (fd >= 0) close(fd); /* closing the last descriptor releases the flock */
}

/* ---- compiled objects --------------------------------------------------------------------------------- */

static int object_hash(const char *obj, uint64_t *h, size_t *size) {
  char *data = evt_cache_read(obj, size);
  if (!data) return -1;
  *h = evt_hash_bytes(0, data, *size);
  free(data);
  return 0;
}

int evt_cache_object_seal(const char *obj, uint64_t key) {
  uint64_t h;
  size_t size;
  if (object_hash(obj, &h, &size) != 0) return -1;
  char *text = malloc(256), path[1400];
  EVT_ASSERT(text);
  int n = snprintf(text, 256, "evt-object 1\nkey %016" PRIx64 "\nsize %zu\nhash %016" PRIx64 "\n", key, size, h);
  text = evt_cache_seal_text(text, (size_t)n);
  snprintf(path, sizeof path, "%s.sum", obj);
  int rc = evt_cache_write(path, text, strlen(text));
  free(text);
  return rc;
}

/* Reads the sidecar of obj into its key, size and hash; 0, or -1 with why. */
static int read_sidecar(const char *obj, uint64_t *key, size_t *size, uint64_t *h, char *why, size_t len) {
  char path[1400];
  size_t n;
  snprintf(path, sizeof path, "%s.sum", obj);
  char *text = evt_cache_read(path, &n);
  if (!text) return evt_msgf(why, len, "no readable checksum file %s", path), -1;
  int ok = evt_cache_text_body(text, n) >= 0 &&
           sscanf(text, "evt-object 1\nkey %" SCNx64 "\nsize %zu\nhash %" SCNx64, key, size, h) == 3;
  free(text);
  if (!ok) evt_msgf(why, len, "its checksum file %s is damaged", path);
  return ok ? 0 : -1;
}

int evt_cache_object_verified(const char *obj, uint64_t key, char *why, size_t len) {
  uint64_t skey, sh, h;
  size_t ssize, size;
  if (read_sidecar(obj, &skey, &ssize, &sh, why, len) != 0) return 0;
  char tag[24];
  snprintf(tag, sizeof tag, "-%016" PRIx64 ".", skey);
  const char *dot = strrchr(obj, '.');
  size_t tl = strlen(tag);
  if ((key && skey != key) || !dot || (size_t)(dot + 1 - obj) < tl || strncmp(dot + 1 - tl, tag, tl))
    return evt_msgf(why, len, "its checksum file is for another entry"), 0;
  if (object_hash(obj, &h, &size) != 0) return evt_msgf(why, len, "cannot read it"), 0;
  if (size != ssize || h != sh)
    return evt_msgf(why, len, "its content differs from its checksum (%zu bytes, %zu recorded)", size, ssize), 0;
  return 1;
}

void *evt_cache_dlopen(const char *obj, char *why, size_t len) {
  char v[600];
  if (!evt_cache_object_verified(obj, 0, v, sizeof v))
    return evt_msgf(why, len, "cache entry %s is not loaded: %s", obj, v), NULL;
  void *h = dlopen(obj, RTLD_NOW | RTLD_LOCAL);
  if (!h) evt_msgf(why, len, "cannot load %s: %s", obj, dlerror());
  return h;
}
