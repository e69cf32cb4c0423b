"""On-disk cache of compiled torch.compile segments, shared between processes.

Contract
- key(text) = SHA-256 of (FORMAT, the identity of the loaded libevt (SHA-256 of the library file), the arguments
  of the pass pipeline, the segment's `.evt` text before the passes, which holds every shape and dtype).
- The value is one JSON file `<config.torch_cache_dir()>/<key>.json` with the optimized text and the node ids
  the backend uses (name -> id, output ids); a hit parses the stored text without running the passes and checks
  that it gets the stored ids. config.cache_enabled() is read at each call.
- Writes are atomic (temp file, then os.replace). An unreadable, corrupt or stale entry is logged, ignored and
  rewritten; a failed write is logged. The cache never raises.
"""
import hashlib
import json
import logging
import os
import tempfile

from . import config
from . import lib as L

log = logging.getLogger("evt")

FORMAT = "evt-torch-segment-1"
PASS_OPTIONS = "evt_passes_run_all(flags=0,verify=1)"

_lib_hash = None


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


def key(text):
    h = hashlib.sha256()
    for part in (FORMAT, library_hash(), PASS_OPTIONS, text):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def _path(k):
    return os.path.join(cache_dir(), k + ".json")


def load(k, name):
    """The Graph stored under key k, or None (miss, or an entry that is ignored and logged)."""
    path = _path(k)
    try:
        with open(path, encoding="utf-8") as f:
            raw = f.read()
    except FileNotFoundError:
        log.info("  disk cache miss: %s", name)
        return None
    except OSError as e:
        log.info("  disk cache: cannot read %s (%s); recompiling", path, e)
        return None
    try:
        e = json.loads(raw)
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
    d = cache_dir()
    entry = {"format": FORMAT, "key": k, "text": g.text(), "optimized": bool(optimized),
             "parsed_nodes": g.parsed_nodes, "node_count": g.node_count, "ids": g.ids, "outputs": g.outputs}
    tmp = None
    try:
        os.makedirs(d, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=d)
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
