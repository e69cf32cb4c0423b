"""A minimal ctypes view of libevt for the example tests: parse, build the joint graph, initialize the
inputs, run the interpreter, read values by node name. Only public API calls (include/evt.h); node names,
ops and dtypes come from the printed graph (evt_graph_to_string lists nodes in id order).
The library is $EVT_LIB or build/libevt.so."""
import ctypes as C
import os
import re

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
MAX_RANK = 6
RUN_FP64 = 1
INT_DTYPES = {"i64", "i32", "bool"}


class Tensor(C.Structure):
    _fields_ = [("dtype", C.c_int), ("rank", C.c_int), ("shape", C.c_int64 * MAX_RANK), ("numel", C.c_int64),
                ("data", C.POINTER(C.c_double))]


_lib = None


def lib():
    global _lib
    if _lib is None:
        L = C.CDLL(os.environ.get("EVT_LIB", os.path.join(ROOT, "build", "libevt.so")))
        L.evt_parse.restype = C.c_void_p
        L.evt_parse.argtypes = [C.c_char_p, C.c_char_p, C.POINTER(C.c_void_p)]
        L.evt_graph_free.argtypes = [C.c_void_p]
        L.evt_graph_error.restype = C.c_char_p
        L.evt_graph_error.argtypes = [C.c_void_p]
        L.evt_graph_node_count.argtypes = [C.c_void_p]
        L.evt_graph_to_string.restype = C.c_void_p
        L.evt_graph_to_string.argtypes = [C.c_void_p]
        L.evt_graph_build_joint.argtypes = [C.c_void_p, C.c_uint]
        L.evt_interp_run.argtypes = [C.c_void_p, C.POINTER(Tensor), C.c_uint, C.c_int]
        L.evt_interp_init_inputs.argtypes = [C.c_void_p, C.POINTER(Tensor), C.c_uint64]
        L.evt_tensor_free.argtypes = [C.POINTER(Tensor)]
        _lib = L
    return _lib


def _take_string(ptr):
    if not ptr:
        return ""
    s = C.string_at(ptr).decode()
    C.CDLL(None).free(C.c_void_p(ptr))
    return s


class EvtGraph:
    """One parsed graph and its value slots. Call free() at the end."""

    def __init__(self, text, filename="test.evt"):
        L = lib()
        err = C.c_void_p()
        self.g = L.evt_parse(text.encode(), filename.encode(), C.byref(err))
        if not self.g:
            raise ValueError(_take_string(err.value))
        self.values = None
        self._scan()

    def _scan(self):
        """Node table from the printed graph: names, ops, dtypes in id order; the loss and outputs."""
        text = _take_string(lib().evt_graph_to_string(self.g))
        self.nodes = [m.groups() for m in re.finditer(r"^\s*%(\S+): (\w+)\[[^\]]*\] = (\w+)\(", text, re.M)]
        assert len(self.nodes) == lib().evt_graph_node_count(self.g), "printed graph lacks nodes"
        self.index = {n[0]: i for i, n in enumerate(self.nodes)}
        m = re.search(r"^\s*loss %(\S+)", text, re.M)
        self.loss_name = m.group(1) if m else None
        self.outputs = ([self.loss_name] if self.loss_name else []) + [
            o.strip().lstrip("%") for m in re.finditer(r"^\s*output (.*)$", text, re.M) for o in m.group(1).split(",")]

    def _check(self, st, what):
        if st != 0:
            raise RuntimeError(f"{what}: status {st}: {lib().evt_graph_error(self.g).decode()}")

    def build_joint(self, flags=0):
        self._check(lib().evt_graph_build_joint(self.g, flags), "build_joint")
        self._scan()

    def source_names(self):
        return [n for n, _, op in self.nodes if op in ("input", "param")]

    def param_names(self):
        return [n for n, _, op in self.nodes if op == "param"]

    def is_param(self, name):
        return self.nodes[self.index[name]][2] == "param"

    def init_inputs(self, seed=0):
        self.values = (Tensor * len(self.nodes))()
        self._check(lib().evt_interp_init_inputs(self.g, self.values, seed), "init_inputs")

    def _array(self, i):
        t = self.values[i]
        a = np.ctypeslib.as_array(t.data, shape=(t.numel,)).copy() if t.numel else np.zeros(0)
        a = a.reshape([t.shape[k] for k in range(t.rank)])
        return a.astype(np.int64) if self.nodes[i][1] in INT_DTYPES else a

    def value(self, name):
        return self._array(self.index[name])

    def set_value(self, name, array):
        """Overwrites a filled input/param slot with values of the same shape."""
        i = self.index[name]
        t = self.values[i]
        a = np.ascontiguousarray(array, dtype=np.float64).ravel()
        assert a.size == t.numel
        C.memmove(t.data, a.ctypes.data, a.nbytes)

    def run(self, fp64=False):
        """Runs the graph; returns {output name: array}; frees every non-source slot afterwards."""
        self._check(lib().evt_interp_run(self.g, self.values, RUN_FP64 if fp64 else 0, 0), "run")
        out = {n: self._array(self.index[n]) for n in self.outputs}
        for i, (_, _, op) in enumerate(self.nodes):
            if op not in ("input", "param") and self.values[i].data:
                lib().evt_tensor_free(C.byref(self.values[i]))
                self.values[i] = Tensor()
        return out

    def free(self):
        if self.values is not None:
            for i in range(len(self.nodes)):
                if self.values[i].data:
                    lib().evt_tensor_free(C.byref(self.values[i]))
            self.values = None
        if self.g:
            lib().evt_graph_free(self.g)
            self.g = None
