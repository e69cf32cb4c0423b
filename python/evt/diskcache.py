"""On-disk cache of compiled torch.compile segments, shared between processes of one user.

Contract
- key(text) = SHA-256 of (FORMAT, the identity of the loaded libevt (SHA-256 of the library file), the arguments
  of the pass pipeline, the segment's `.evt` text before the passes, which holds every shape and dtype).
- The value is one JSON file `<config.torch_cache_dir()>/<key>.json` with the optimized text and the node ids
  the backend uses (name -> id, output ids), and `sha256`: the hash of the key and everything else in the entry.
  A hit checks that hash, parses the stored text without running the passes and checks that it gets the stored
  ids. config.cache_enabled() is read at each call.
- The folder rules of docs/config.md "Caches" (the C side: src/util/cachedir.c): the cache folder and the root
  above it are real directories of this user that no one else may write (created with mode 0700); otherwise the
  cache is not used and a warning says how to fix it. Entries are opened without following symlinks and only
  when this user owns them.
- Writes are atomic (a fresh temporary file in the folder, then os.replace). An entry whose hash fails (edited or
  damaged) is deleted with a warning; an unreadable, corrupt or stale one is logged and ignored; both are
  rewritten. A failed write is logged. The cache never raises.
"""
import hashlib
import json
import logging
import os
import stat
import tempfile

from . import config
from . import lib as L

log = logging.getLogger("evt")

FORMAT = "evt-torch-segment-2"
def pass_options(flags=0):
    """The arguments of the pass pipeline, as they enter the key."""
    return f"evt_passes_run_all(flags={flags},verify=1)"

_lib_hash = None
_warned = set()


def enabled():
    return config.cache_enabled()


def cache_dir():
    return config.torch_cache_dir()


def library_hash():
    """SHA-256 of the libevt file in use (a rebuilt library invalidates every entry)."""
    global _lib_hash
    if _lib_hash is None:
        h = hashlib.sha256()
        L.lib()  # (a library that does not load is LibraryError, before its file is read)
        with open(L.library_path(), "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        _lib_hash = h.hexdigest()
    return _lib_hash


def key(text, pass_flags=0):
    h = hashlib.sha256()
    for part in (FORMAT, library_hash(), pass_options(pass_flags), text):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def _path(k):
    return os.path.join(cache_dir(), k + ".json")


def _why_not_private(d):
    """Why folder d breaks the folder rules (a line saying how to fix it), or None."""
    st = os.lstat(d)
    if stat.S_ISLNK(st.st_mode):
        return f"cache folder {d} is a symbolic link: not used (replace it by a real folder, or set EVT_CACHE_DIR)"
    if not stat.S_ISDIR(st.st_mode):
        return f"cache folder {d} is not a directory: not used"
    if st.st_uid != os.geteuid():
        return (f"cache folder {d} is owned by uid {st.st_uid}, not by you (uid {os.geteuid()}): not used (remove it, "
                "or set EVT_CACHE_DIR to a folder of your own)")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (f"cache folder {d} is writable by its group or others (mode {st.st_mode & 0o777:03o}): not used "
                f"(chmod go-w {d})")
    return None


def _private_dir(create):
    """The cache folder when it and the root above it follow the folder rules (missing folders are created with
    mode 0700 when create is set), else None (a broken rule is warned about once per process)."""
    d = cache_dir()
    levels = [d, os.path.dirname(d)]
    try:
        if create:
            for p in reversed(_missing(d)):
                os.mkdir(p, 0o700)
        for p in levels:
            if not create and not os.path.lexists(p):
                continue  # nothing cached yet: every load is a miss
            why = _why_not_private(p)
            if why:
                if why not in _warned:
                    _warned.add(why)
                    log.warning("disk cache: %s", why)
                return None
    except OSError as e:
        if create:
            log.info("  disk cache: cannot use %s (%s)", d, e)
        return None
    return d


def _missing(d):
    """d and the folders above it that do not exist, deepest first."""
    out = []
    while d and not os.path.lexists(d):
        out.append(d)
        parent = os.path.dirname(d)
        if parent == d:
            break
        d = parent
    return out


def _read_own(path):
    """The text of a regular file this user owns, opened without following a symlink."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, encoding="utf-8") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise OSError(f"not a regular file of uid {os.geteuid()}")
        return f.read()


def _entry_hash(k, entry):
    body = json.dumps({n: v for n, v in entry.items() if n != "sha256"}, sort_keys=True)
    return hashlib.sha256((k + "\0" + body).encode()).hexdigest()


def _drop_edited(path, k, e):
    """True (and the entry is deleted, with a warning) when e's hash does not match its key and content."""
    if e.get("sha256") == _entry_hash(k, e):
        return False
    log.warning("disk cache: ignoring corrupt entry %s (checksum mismatch: the entry was edited or damaged); "
                "deleted, recompiling", path)
    try:
        os.unlink(path)
    except OSError:
        pass
    return True


def load(k, name):
    """The Graph stored under key k, or None (miss, or an entry that is ignored and logged)."""
    if _private_dir(create=False) is None:
        return None
    path = _path(k)
    try:
        raw = _read_own(path)
    except FileNotFoundError:
        log.info("  disk cache miss: %s", name)
        return None
    except OSError as e:
        log.info("  disk cache: cannot read %s (%s); recompiling", path, e)
        return None
    try:
        e = json.loads(raw)
        if not isinstance(e, dict) or _drop_edited(path, k, e):
            return None
        if e.get("key") != k or e.get("format") != FORMAT:
            raise ValueError("key or format differs")
        g = L.Graph(e["text"], name)
        if g.node_count != e["node_count"] or g.ids != e["ids"] or g.outputs != e["outputs"]:
            raise ValueError("node ids differ from the stored ones")
        g.parsed_nodes = int(e["parsed_nodes"])
        g.optimized = bool(e["optimized"])
    except (ValueError, KeyError, TypeError, AttributeError, L.EvtError) as err:
        log.info("  disk cache: ignoring corrupt entry %s (%s: %s); recompiling",
                 path, type(err).__name__, str(err).splitlines()[0] if str(err) else "")
        return None
    log.info("  disk cache hit: %s", name)
    return g


def store(k, g, optimized):
    """Writes the entry for graph g atomically; failures are logged, never raised."""
    d = _private_dir(create=True)
    if d is None:
        return
    entry = {"format": FORMAT, "key": k, "text": g.text(), "optimized": bool(optimized),
             "parsed_nodes": g.parsed_nodes, "node_count": g.node_count, "ids": g.ids, "outputs": g.outputs}
    entry["sha256"] = _entry_hash(k, entry)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".tmp-{os.getpid()}-", suffix=".json", dir=d)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(entry, f)
        os.replace(tmp, _path(k))
        tmp = None
    except OSError as e:
        log.info("  disk cache: cannot write %s (%s)", d, e)
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
