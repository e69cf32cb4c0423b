"""On-disk cache of compiled torch.compile segments, shared between processes.

Contract
- key(text, passes) = SHA-256 of (FORMAT, the segment's `.evt` text before the passes -- it holds every
  shape and dtype --, the identity of the loaded libevt (SHA-256 of the library file's bytes, computed once
  per process), and the pass options: whether passes run and PASS_OPTIONS, the arguments given to
  evt_passes_run_all, with the values of PASS_ENV, the environment variables the passes read).
- The value is one JSON file `<dir>/<key>.json`: the key, the optimized `.evt` text (output of the pass
  pipeline; the parsed text when the passes failed), whether it is optimized, the node count before the
  passes, and the node ids the Python side uses (name -> id, output ids). A hit parses the stored text
  without running the passes and checks that the ids it gets are the stored ones.
- The folder is `$EVT_CACHE_DIR`, else `$XDG_CACHE_HOME/evt`, else `~/.cache/evt`; subfolder `torch/`.
  `EVT_CACHE=0` disables the cache (read at each call, so a process can switch it).
- Writes are atomic (a temp file in the same folder, then os.replace). Any unreadable, corrupt or stale
  entry, or one that fails to parse, is ignored (logged on the `evt` logger) and recompiled and rewritten;
  a failure to write is logged too. The cache never raises.
"""
import hashlib
import json
import logging
import os
import tempfile

from . import lib as L

log = logging.getLogger("evt")

FORMAT = "evt-torch-segment-1"
PASS_OPTIONS = "evt_passes_run_all(flags=0,verify=1)"
# environment variables the C passes read (a different value gives a different optimized text)
PASS_ENV = ("EVT_LOSS_ELIM_LSE",)

_lib_hash = None


def enabled():
    return os.environ.get("EVT_CACHE", "1") not in ("", "0")


def cache_dir():
    d = os.environ.get("EVT_CACHE_DIR")
    if not d:
        xdg = os.environ.get("XDG_CACHE_HOME")
        d = os.path.join(xdg, "evt") if xdg else os.path.join(os.path.expanduser("~"), ".cache", "evt")
    return os.path.join(d, "torch")


def library_hash():
    """SHA-256 of the libevt file in use (a rebuilt library invalidates every entry)."""
    global _lib_hash
    if _lib_hash is None:
        h = hashlib.sha256()
        with open(L.library_path(), "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        _lib_hash = h.hexdigest()
    return _lib_hash


def key(text, passes):
    h = hashlib.sha256()
    env = ";".join(f"{k}={os.environ.get(k, '')}" for k in PASS_ENV)
    for part in (FORMAT, library_hash(), (PASS_OPTIONS + env) if passes else "no-passes", text):
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
