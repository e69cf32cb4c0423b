"""ctypes binding of libevt: parse `.evt` text and run it on the CPU interpreter with torch tensors.

Contract
- The library is `$EVT_LIB`, else the one built into the package (`pip install <repo>/python`: evt/_libevt.so,
  which finds the libraries it needs beyond glibc in evt/libs/ through its rpath; an older build's _libevt*.so),
  else `<repo>/build/libevt.so` of a checkout (`make`); none found, or one that does not load, raises LibraryError
  saying how to fix it (the backend lets it through: a model never falls back to PyTorch as a whole silently).
- Graph(text) parses (raising EvtError with the library's message, which names the node) and owns the
  evt_graph. Graph.run(inputs, outputs) binds torch tensors to the `input` node ids given, runs
  evt_interp_run, and returns fresh torch tensors for the output node ids asked for, in the dtypes asked for.
- The interpreter keeps every value as a double in a contiguous row-major buffer, so tensors are copied in
  (converted to float64 straight into that buffer) and out (converted from a view of it); strides of the callers'
  tensors do not matter.
"""
import ctypes
import glob
import os
import threading

import torch

from . import config

_PKG = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(_PKG))
MAX_RANK = 6

# evt_dtype's values (include/evt.h) and text names. evt's cast to fp8 saturates; PyTorch's does not (aten.py).
DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2, torch.int64: 3, torch.int32: 4, torch.bool: 5,
          torch.float8_e4m3fn: 6, torch.float8_e5m2: 7}
DTYPE_NAMES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.int64: "i64",
               torch.int32: "i32", torch.bool: "bool", torch.float8_e4m3fn: "f8e4m3", torch.float8_e5m2: "f8e5m2"}
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


class EvtError(RuntimeError):
    pass


def _doubles(t, shape):
    """A float64 torch view of an evt tensor's buffer (no copy: valid only while the evt tensor lives)."""
    buf = (ctypes.c_double * t.numel).from_address(ctypes.cast(t.data, ctypes.c_void_p).value)
    return torch.frombuffer(buf, dtype=torch.float64).view(shape)


class Tensor(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int), ("rank", ctypes.c_int), ("shape", ctypes.c_int64 * MAX_RANK),
                ("numel", ctypes.c_int64), ("data", ctypes.POINTER(ctypes.c_double))]


_lib = None
_lock = threading.Lock()


class LibraryError(EvtError):
    """libevt is missing or does not load: a configuration error the user must fix."""


def library_path():
    """Where libevt is: $EVT_LIB, else the package's own, else <repo>/build/libevt.so; LibraryError if none."""
    env = config.library_override()
    if env:
        return env
    own = os.path.join(_PKG, "_libevt.so")
    older = sorted(set(glob.glob(os.path.join(_PKG, "_libevt*.so"))) - {own})  # builds that named it like an extension
    for path in [own] + older + [os.path.join(REPO, "build", "libevt.so")]:
        if os.path.exists(path):
            return path
    raise LibraryError("libevt not found: install the package with `pip install <evt checkout>/python` (it builds "
                       "libevt; needs CBC: coinor-libcbc-dev), or build a checkout with `make`, or set EVT_LIB")


def lib():
    """The loaded library with argument types declared (loaded once per process)."""
    global _lib
    with _lock:
        if _lib is None:
            path = library_path()
            try:
                L = ctypes.CDLL(path)
            except OSError as e:
                raise LibraryError(f"libevt at {path} does not load: {e}") from None
            P, T = ctypes.c_void_p, ctypes.POINTER(Tensor)
            sigs = {
                "evt_parse": (P, [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]),
                "evt_graph_free": (None, [P]),
                "evt_graph_error": (ctypes.c_char_p, [P]),
                "evt_graph_node_count": (ctypes.c_int, [P]),
                "evt_tensor_alloc": (ctypes.c_int, [T, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int64)]),
                "evt_tensor_free": (None, [T]),
            }
            for name, (res, args) in sigs.items():
                f = getattr(L, name)
                f.restype, f.argtypes = res, args
            L.free.argtypes = [ctypes.c_void_p]
            _lib = L
    return _lib


def loaded():
    """True once the library is loaded: an error before that (no library, an unloadable one) is a configuration
    error the caller must see, never a fallback of one segment."""
    return _lib is not None


def has_interpreter():
    """True when the loaded libevt exports the CPU interpreter (evt_interp_run)."""
    try:
        return hasattr(lib(), "evt_interp_run")
    except (OSError, EvtError):
        return False


def _interp():
    L = lib()
    f = L.evt_interp_run
    if f.argtypes is None:
        f.restype, f.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(Tensor), ctypes.c_uint, ctypes.c_int]
    return f


def _declare(name, res, args):
    f = getattr(lib(), name, None)
    if f is not None and f.argtypes is None:
        f.restype, f.argtypes = res, args
    return f


def take_string(p):
    """The text of a malloc'd C string libevt returned (freed here); None for NULL."""
    if not p:
        return None
    try:
        return ctypes.string_at(p).decode()
    finally:
        lib().free(p)


class Graph:
    """A parsed evt graph (owns the evt_graph; freed with the object).

    optimize=True runs evt's graph-pass pipeline (evt_passes_run_all with pass_flags, EVT_PASS_* of src/passes/passes.h,
    and the verifier after each pass),
    which renumbers nodes: `ids` (name -> node id) and `outputs` (node id of each `output`, in order) are
    read back from the graph afterwards. A pass failure raises EvtError (the caller may use the text as is).
    """

    def __init__(self, text, filename="<torch>", optimize=False, pass_flags=0):
        L = lib()
        err = ctypes.c_void_p()
        self._g = L.evt_parse(text.encode(), filename.encode(), ctypes.byref(err))
        if not self._g:
            msg = ctypes.cast(err, ctypes.c_char_p).value.decode() if err.value else "parse failed"
            if err.value:
                L.free(err)
            raise EvtError(msg)
        self.parsed_nodes = L.evt_graph_node_count(self._g)
        if optimize:
            run_all = _declare("evt_passes_run_all", ctypes.c_int, [ctypes.c_void_p, ctypes.c_uint, ctypes.c_int])
            if run_all is None:
                raise EvtError("this libevt has no graph passes")
            if run_all(self._g, pass_flags, 1) != 0:
                raise EvtError(L.evt_graph_error(self._g).decode())
        self.node_count = L.evt_graph_node_count(self._g)
        name_of = _declare("evt_interp_node_name", ctypes.c_char_p, [ctypes.c_void_p, ctypes.c_int])
        output = _declare("evt_interp_output", ctypes.c_int, [ctypes.c_void_p, ctypes.c_int])
        self.ids = {name_of(self._g, i).decode(): i for i in range(self.node_count)}
        self.outputs = []
        while (i := output(self._g, len(self.outputs))) >= 0:
            self.outputs.append(i)

    def text(self):
        """The graph as canonical `.evt` text (after the passes, if it was optimized)."""
        f = _declare("evt_graph_to_string", ctypes.c_void_p, [ctypes.c_void_p])
        return take_string(f(self._g))

    def set_rng_step(self, step):
        """The RNG step the next interpreter runs draw rand / dropout with (evt_graph_set_rng_step)."""
        f = _declare("evt_graph_set_rng_step", None, [ctypes.c_void_p, ctypes.c_uint64])
        if f is None:
            raise EvtError("this libevt has no evt_graph_set_rng_step")
        f(self._g, step)

    def __del__(self):
        g = getattr(self, "_g", None)
        if g and _lib is not None:
            _lib.evt_graph_free(g)
            self._g = None

    def run(self, inputs, outputs):
        """inputs: [(node id, torch tensor)]; outputs: [(node id, torch dtype)] -> [torch tensors]."""
        L, run = lib(), _interp()
        n = self.node_count
        vals = (Tensor * max(n, 1))()
        try:
            for i, t in inputs:
                src = t.detach()
                shape = (ctypes.c_int64 * MAX_RANK)(*src.shape)
                st = L.evt_tensor_alloc(ctypes.byref(vals[i]), DTYPES[t.dtype], src.dim(), shape)
                if st != 0:
                    raise EvtError(f"evt_tensor_alloc failed for a tensor of shape {tuple(src.shape)}")
                if src.numel():  # one pass: converted to float64 straight into the interpreter's buffer
                    _doubles(vals[i], tuple(src.shape)).copy_(src)
            if run(self._g, vals, 0, 0) != 0:
                raise EvtError(L.evt_graph_error(self._g).decode())
            res = []
            for i, dt in outputs:
                v = vals[i]
                shape = tuple(v.shape[:v.rank])
                res.append(_doubles(v, shape).to(dt, copy=True) if v.numel else torch.empty(shape, dtype=dt))
            return res
        finally:
            for i in range(n):
                L.evt_tensor_free(ctypes.byref(vals[i]))
