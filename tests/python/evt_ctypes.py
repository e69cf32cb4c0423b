"""A small ctypes harness over build/libevt.so: parse `.evt` text, give inputs, run the CPU interpreter,
get every value back as a float64 numpy array. For cross-checks against PyTorch.

    from evt_ctypes import Graph
    g = Graph('''graph t {
      %x: f32[2,3] = input()
      %y = softmax(%x, dim=1)
      output %y
    }''')
    out = g.run({"x": np.random.randn(2, 3)})      # dict: output name -> np.ndarray (float64)
    out["y"]

- The library is `$EVT_LIB`, else `<repo>/build/libevt.so`.
- run(inputs, seed=0, fp64=False, keep_all=False):
    inputs   dict name -> numpy array / torch tensor / Python number, for input or param nodes; nodes not
             given are filled from their init attributes (evt_interp_init_inputs with `seed`).
             Given values are rounded to the node's dtype first (f32/f16/bf16 round-to-nearest-even,
             ints must be integral), except floats when fp64=True.
    fp64     EVT_RUN_FP64: every float is kept in double (finite-difference checks, tight torch float64
             comparisons).
    keep_all return every node's value, not only the graph's outputs.
  Raises EvtError with the library's message (which names the node) on any failure.
- Graph.inputs() lists (name, dtype, shape) of the input/param nodes; Graph.build_joint(flags) appends the
  backward when the library has autodiff.
"""
import ctypes
import os

import numpy as np

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DTYPES = ["f32", "f16", "bf16", "i64", "i32", "bool", "f8e4m3", "f8e5m2"]
FP8_MAX = {"f8e4m3": 448.0, "f8e5m2": 57344.0}
MAX_RANK = 6
RUN_FP64 = 1


class EvtError(RuntimeError):
    pass


class Tensor(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int), ("rank", ctypes.c_int), ("shape", ctypes.c_int64 * MAX_RANK),
                ("numel", ctypes.c_int64), ("data", ctypes.POINTER(ctypes.c_double))]


_lib = None


def lib():
    """The loaded library, with argument types declared (loaded once)."""
    global _lib
    if _lib is None:
        L = ctypes.CDLL(os.environ.get("EVT_LIB", os.path.join(_REPO, "build", "libevt.so")))
        P, T = ctypes.c_void_p, ctypes.POINTER(Tensor)
        sigs = {
            "evt_parse": (P, [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]),
            "evt_graph_free": (None, [P]),
            "evt_graph_error": (ctypes.c_char_p, [P]),
            "evt_graph_node_count": (ctypes.c_int, [P]),
            "evt_interp_node_name": (ctypes.c_char_p, [P, ctypes.c_int]),
            "evt_interp_node_op": (ctypes.c_char_p, [P, ctypes.c_int]),
            "evt_interp_output": (ctypes.c_int, [P, ctypes.c_int]),
            "evt_interp_init_inputs": (ctypes.c_int, [P, T, ctypes.c_uint64]),
            "evt_interp_run": (ctypes.c_int, [P, T, ctypes.c_uint, ctypes.c_int]),
            "evt_tensor_free": (None, [T]),
            "evt_round_to_dtype": (ctypes.c_double, [ctypes.c_double, ctypes.c_int]),
        }
        for name, (res, args) in sigs.items():
            f = getattr(L, name)
            f.restype, f.argtypes = res, args
        if hasattr(L, "evt_graph_build_joint"):
            L.evt_graph_build_joint.restype, L.evt_graph_build_joint.argtypes = ctypes.c_int, [P, ctypes.c_uint]
        L.free.argtypes = [ctypes.c_void_p]
        _lib = L
    return _lib


def _as_numpy(v):
    """numpy float64 array from a numpy array, torch tensor or number."""
    if hasattr(v, "detach"):  # torch.Tensor, any dtype (bf16 has no numpy equivalent)
        v = v.detach().cpu().double().numpy()
    return np.asarray(v, dtype=np.float64)


def round_to_dtype(a, dtype):
    """Rounds a float64 array to what a tensor of `dtype` (a name in DTYPES) stores, as the library does."""
    a = np.asarray(a, dtype=np.float64)
    if dtype == "f32":
        return a.astype(np.float32).astype(np.float64)
    if dtype == "f16":
        return a.astype(np.float32).astype(np.float16).astype(np.float64)
    if dtype == "bf16":
        f = a.astype(np.float32)
        u = f.view(np.uint32).astype(np.uint64)
        r = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)
        return np.where(np.isfinite(f), r, f).astype(np.float64)
    if dtype in FP8_MAX:  # the saturating cast: clamp to +-max (NaN stays), then torch's round to nearest even
        import torch
        m = FP8_MAX[dtype]
        f = torch.from_numpy(a.astype(np.float32)).clamp(-m, m)
        return f.to(getattr(torch, "float8_e4m3fn" if dtype == "f8e4m3" else "float8_e5m2")).double().numpy()
    if dtype in ("i64", "i32"):
        if not np.all(a == np.trunc(a)):
            raise EvtError("integer input with a fractional value")
        return a
    return (a != 0).astype(np.float64)  # bool


class Graph:
    """A parsed graph (owns the evt_graph; freed with the object or by close())."""

    def __init__(self, text, filename="<python>"):
        L = lib()
        err = ctypes.c_void_p()
        self._g = L.evt_parse(text.encode(), filename.encode(), ctypes.byref(err))
        if not self._g:
            msg = ctypes.cast(err, ctypes.c_char_p).value.decode() if err.value else "parse failed"
            if err.value:
                L.free(err)
            raise EvtError(msg)

    def close(self):
        if getattr(self, "_g", None):
            lib().evt_graph_free(self._g)
            self._g = None

    __del__ = close

    def _check(self, status):
        if status != 0:
            raise EvtError(lib().evt_graph_error(self._g).decode())

    @property
    def node_count(self):
        return lib().evt_graph_node_count(self._g)

    def name(self, i):
        return lib().evt_interp_node_name(self._g, i).decode()

    def op(self, i):
        return lib().evt_interp_node_op(self._g, i).decode()

    def outputs(self):
        """Node ids of the graph outputs, in order (the loss first)."""
        res, k = [], 0
        while (i := lib().evt_interp_output(self._g, k)) >= 0:
            res.append(i)
            k += 1
        return res

    def build_joint(self, flags=0):
        if not hasattr(lib(), "evt_graph_build_joint"):
            raise EvtError("this libevt has no autodiff")
        self._check(lib().evt_graph_build_joint(self._g, flags))

    def _slots(self, seed):
        n = self.node_count
        vals = (Tensor * max(n, 1))()
        self._check(lib().evt_interp_init_inputs(self._g, vals, seed))
        return vals

    def inputs(self):
        """[(name, dtype, shape)] of the input and param nodes."""
        vals = self._slots(0)
        try:
            return [(self.name(i), DTYPES[vals[i].dtype], tuple(vals[i].shape[:vals[i].rank]))
                    for i in range(self.node_count) if self.op(i) in ("input", "param")]
        finally:
            for i in range(self.node_count):
                lib().evt_tensor_free(ctypes.byref(vals[i]))

    def run(self, inputs=None, seed=0, fp64=False, keep_all=False):
        L, n = lib(), self.node_count
        vals = self._slots(seed)
        try:
            ids = {self.name(i): i for i in range(n)}
            for name, v in (inputs or {}).items():
                i = ids.get(name)
                if i is None or self.op(i) not in ("input", "param"):
                    raise EvtError(f"%{name} is not an input or param of the graph")
                t = vals[i]
                a = _as_numpy(v)
                shape = tuple(t.shape[:t.rank])
                if a.shape != shape and a.size == 1 and t.numel == 1:
                    a = a.reshape(shape)  # a number for a one-element tensor
                if a.shape != shape:
                    raise EvtError(f"%{name}: expected shape {shape}, got {a.shape}")
                dt = DTYPES[t.dtype]
                if not (fp64 and dt in ("f32", "f16", "bf16", "f8e4m3", "f8e5m2")):
                    a = round_to_dtype(a, dt)
                if t.numel:
                    np.ctypeslib.as_array(t.data, shape=(t.numel,))[:] = a.reshape(-1)
            self._check(L.evt_interp_run(self._g, vals, RUN_FP64 if fp64 else 0, 1 if keep_all else 0))
            want = range(n) if keep_all else self.outputs()
            out = {}
            for i in want:
                t = vals[i]
                shape = tuple(t.shape[:t.rank])
                if not t.data:
                    continue
                out[self.name(i)] = (np.ctypeslib.as_array(t.data, shape=(t.numel,)).copy().reshape(shape)
                                     if t.numel else np.zeros(shape))
            return out
        finally:
            for i in range(n):
                L.evt_tensor_free(ctypes.byref(vals[i]))


def run(text, inputs=None, **kw):
    """Parses `text` and runs it once: Graph(text).run(inputs, **kw)."""
    g = Graph(text)
    try:
        return g.run(inputs, **kw)
    finally:
        g.close()
