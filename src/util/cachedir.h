/* Private disk-cache folders and verified entries (src/util/cachedir.c): the one place that holds the rules of
 * docs/config.md "Caches" for evt's C caches (jit/, tune/, partition/).
 *
 * - A cache folder, and each folder above it up to the cache root, is a real directory (not a symlink) owned by
 *   the effective user and not writable by its group or others; evt creates missing ones with mode 0700. One that
 *   breaks a rule is refused: the cache is not used, and one line saying how to fix it goes to stderr (once per
 *   process).
 * - Entries are read without following symlinks and only when they are regular files owned by the user.
 * - Writes go to a fresh temporary file next to the entry (<entry>.<pid>-<random>.part, O_EXCL, mode 0600) that
 *   is renamed into place.
 * - Text entries end with a line "checksum <16 hex>": FNV-1a 64 of everything before it. Compiled objects
 *   have a sidecar <object>.sum holding their key, size and content hash; only a verified object is dlopen'ed.
 * - One process builds an entry at a time: an exclusive flock of <entry>.lock.
 */
#ifndef EVT_UTIL_CACHEDIR_H
#define EVT_UTIL_CACHEDIR_H

#include <stddef.h>
#include <stdint.h>

/* Checks dir and the levels-1 folders above it (dir alone: levels = 1; <root>/jit: 2), creating missing ones
 * (mode 0700) when create is set. 0 when usable; -1 when refused (msg says why and how to fix it, and it went to
 * stderr); -2 when missing (create = 0) or it cannot be created (msg). */
int evt_cache_dir_private(const char *dir, int levels, int create, char *msg, size_t len);

/* A new empty file <path>.<pid>-<random>.part (O_EXCL, O_NOFOLLOW, mode 0600) open for writing; its name in
 * tmp. The descriptor, or -1. */
int evt_cache_tmp_open(const char *path, char *tmp, size_t len);
/* Writes data to a temporary file and renames it onto path. 0 or -1 (nothing left behind). */
int evt_cache_write(const char *path, const void *data, size_t n);
/* The whole regular file at path, owned by the user, opened without following a symlink: malloc'd and
 * NUL-terminated (*n: its size), or NULL. */
char *evt_cache_read(const char *path, size_t *n);

/* Appends the checksum line of text (the first n bytes) to it; returns the new malloc'd text (text is freed). */
char *evt_cache_seal_text(char *text, size_t n);
/* The length of text's body when its last line is a checksum line that matches the body, else -1. */
long evt_cache_text_body(const char *text, size_t n);

/* Exclusive lock of the entry at path (flock of <path>.lock, waiting for it when wait is set): the descriptor,
 * -1 when busy (wait = 0), -2 when the lock file cannot be used. evt_cache_unlock releases it. */
int evt_cache_lock(const char *path, int wait);
void evt_cache_unlock(int fd);

/* Writes the sidecar <obj>.sum of a finished object: key, size and content hash. 0 or -1. */
int evt_cache_object_seal(const char *obj, uint64_t key);
/* 1 when obj matches its sidecar (size, content hash, the sidecar's own checksum), the sidecar's key is key (0:
 * any) and obj's name ends with "-<that key in hex>.<ext>"; else 0 with the reason in why (may be NULL). */
int evt_cache_object_verified(const char *obj, uint64_t key, char *why, size_t len);
/* dlopen (RTLD_NOW | RTLD_LOCAL) of a verified object only: the handle, or NULL with the reason in why. */
void *evt_cache_dlopen(const char *obj, char *why, size_t len);

#endif
