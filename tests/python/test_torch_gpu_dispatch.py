"""The GPU parts of the torch.compile backend that need no GPU: options and evt_program flags, the device
dtype mapping, the dispatch rule (interpreter / GPU program / PyTorch) and how a plan for CUDA tensors
is built when the program API is missing or rejects a node, the CUDA-graph output pool's reuse policy.

CUDA graphs of FX modules are made with fake CUDA tensors (FakeTensorProp needs no GPU); no test here
runs anything on a GPU or produces GPU results: those are tests/gpu/run.sh's (torch).
"""
import collections
import contextlib
import logging
import operator
import os
import sys
import types

import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "python"))
import evt  # noqa: E402
from evt import aten as A  # noqa: E402
from evt import config as C  # noqa: E402
from evt import backend as B  # noqa: E402
from evt import placement as P  # noqa: E402
from evt import plan as PL  # noqa: E402
from evt import rewrites as R  # noqa: E402
from evt import segment as SG  # noqa: E402
from evt import torch_steps as TS  # noqa: E402
from evt import gpu as G  # noqa: E402
from evt import lib as evt_lib  # noqa: E402
from bench_module import load  # noqa: E402

needs_lib = pytest.mark.skipif(not evt_lib.has_interpreter(), reason="libevt has no CPU interpreter yet")
os.environ.setdefault("EVT_CACHE", "0")


# ---- options and flags -----------------------------------------------------------------------------------

def test_parse_options_defaults_and_unknown():
    assert C.parse_options(None) == {"arch": None, "backward_cut_mib": 0, "check": False, "cudagraphs": False, "dump": None, "fp8": None,
                                     "fused": True, "gpu_ops": ("dropout",), "tf32": None, "tune": None}
    assert C.parse_options({"cudagraphs": True})["cudagraphs"] == "step"
    assert C.parse_options({"cudagraphs": "step"})["cudagraphs"] == "step"
    assert C.parse_options({"cudagraphs": "segments"})["cudagraphs"] == "segments"
    assert C.parse_options({"cudagraphs": False})["cudagraphs"] is False
    assert C.parse_options(C.parse_options({"cudagraphs": True}))["cudagraphs"] == "step"  # (idempotent)
    for bad in ("always", 2.5, ["step"]):
        with pytest.raises(ValueError, match="cudagraphs must be one of"):
            C.parse_options({"cudagraphs": bad})
    with pytest.raises(ValueError, match="unknown option"):
        C.parse_options({"cudagraph": True})


def test_program_flags():
    F_, CG, NO = G.EVT_PROGRAM_FUSED, G.EVT_PROGRAM_CUDA_GRAPH, G.EVT_PROGRAM_NO_OPT
    assert G.program_flags(None) == F_ | NO
    assert G.program_flags({"fused": False}) == NO
    assert G.program_flags({"fused": True}) == F_ | NO
    assert G.program_flags({"cudagraphs": "segments"}) == F_ | CG | NO
    assert G.program_flags({"cudagraphs": "segments", "fused": False}) == CG | NO
    # the whole-step graph is PyTorch's capture: a program inside it must not capture on its own
    assert G.program_flags({"cudagraphs": True}) == F_ | NO
    with pytest.raises(ValueError, match="fused must be a bool"):
        G.program_flags({"fused": "no"})
    # the values agree with include/evt.h
    h = open(os.path.join(evt_lib.REPO, "include", "evt.h")).read()
    for name, v in (("FUSED", F_), ("CUDA_GRAPH", CG), ("NO_OPT", NO)):
        assert f"#define EVT_PROGRAM_{name} {v}u" in h.replace("  ", " ").replace("  ", " ")


def test_tf32_option():
    """options["tf32"]: evt_options.tf32, by default PyTorch's allow_tf32 when the program is made; a bool overrides it."""
    assert C.parse_options({"tf32": True})["tf32"] is True
    with pytest.raises(ValueError, match="tf32 must be"):
        C.parse_options({"tf32": 1})
    saved = torch.backends.cuda.matmul.allow_tf32
    try:
        for allowed in (False, True):
            torch.backends.cuda.matmul.allow_tf32 = allowed
            assert C.tf32(None) is allowed and C.tf32({"tf32": not allowed}) is (not allowed)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    assert G.options_for(G.EVT_PROGRAM_FUSED, 1, tf32=True).tf32 == 1
    assert G.options_for(G.EVT_PROGRAM_FUSED, 1).tf32 == 0
    # a program made with TF32 GEMMs is cached apart from one without
    g = types.SimpleNamespace(text=lambda: "graph t {}")
    assert SG._program_key(g, 1, "cuda:0", True) != SG._program_key(g, 1, "cuda:0", False)


def test_arch_option():
    """options["arch"]: the GPU target of the generated kernels, parsed by libevt's evt_arch_parse into evt_options."""
    assert C.parse_options({"arch": "sm_80"})["arch"] == "sm_80"
    with pytest.raises(ValueError, match="arch must be one of"):
        C.parse_options({"arch": "sm_75"})
    o = G.options_for(G.EVT_PROGRAM_FUSED, 1, "compute_80")
    assert (o.arch, o.ptx) == (80, 1)
    o = G.options_for(G.EVT_PROGRAM_FUSED, 1, "sm_89")
    assert (o.arch, o.ptx) == (89, 0)
    assert G.options_for(G.EVT_PROGRAM_FUSED, 1).arch == 0  # the present GPU's


def test_tune_option():
    """options["tune"]: how many candidate configs the autotuner compiles per GEMM kernel."""
    assert G.tune_configs(None, cuda=True) == G.TUNE_BY_DEFAULT == 1  # measured by default on a GPU
    assert G.tune_configs(None, cuda=False) == 0  # nothing to measure
    assert G.tune_configs({"tune": 3}, cuda=False) == 3
    assert G.tune_configs({"tune": 0}, cuda=True) == 0
    assert G.tune_configs({"tune": True}) == G.TUNE_DEFAULT_CONFIGS
    assert G.tune_configs({"tune": False}, cuda=True) == 0
    assert not G.tune_asked(None) and G.tune_asked({"tune": 1}) and G.tune_asked({"tune": False})
    with pytest.raises(ValueError, match="tune must be"):
        C.parse_options({"tune": "fast"})


@needs_lib
def test_tune_without_a_gpu_says_why(monkeypatch, tmp_path):
    """G.tune -> evt_program_tune on segment texts: the distinct GEMM problems are found, and without a GPU
    nothing is measured or written, with the reason (the backend logs it and creates the programs untuned)."""
    if os.path.exists("/dev/nvidiactl"):
        pytest.skip("a machine with a GPU would measure")
    monkeypatch.setenv("EVT_CACHE_DIR", str(tmp_path))
    text = ("graph seg {\n  %x: bf16[64,128] = input()\n  %w: bf16[128,256] = input()\n"
            "  %b: bf16[256] = input()\n  %h = mm(%x, %w)\n  %y = add(%h, %b)\n  %z = relu(%y)\n"
            "  output %z\n}\n")
    flags = G.EVT_PROGRAM_FUSED | G.EVT_PROGRAM_NO_OPT
    assert G.tune([text], flags, 0) == (0, 0, "")
    st, n, why = G.tune([text, text], flags, 2)
    assert st != 0 and n == 1 and "no CUDA device" in why, (st, n, why)
    assert not list(tmp_path.rglob("*.txt"))


def test_device_dtype_mapping():
    assert G.device_dtype(torch.bfloat16) is torch.bfloat16
    assert G.device_dtype(torch.float16) is torch.float16
    assert G.device_dtype(torch.float32) is torch.float32
    assert G.device_dtype(torch.int32) is torch.int64
    assert G.device_dtype(torch.int64) is torch.int64
    assert G.device_dtype(torch.bool) is torch.bool
    assert G.device_dtype(torch.float8_e4m3fn) is torch.float8_e4m3fn  # evt's f8e4m3 codes
    assert G.device_dtype(torch.float8_e5m2) is torch.float8_e5m2
    with pytest.raises(G.ProgramError):
        G.device_dtype(torch.float64)
    t = torch.arange(6, dtype=torch.int32).view(2, 3).t()
    d = G.to_device_layout(t)
    assert d.dtype == torch.int64 and d.is_contiguous() and torch.equal(d, t.long())
    x = torch.randn(4, 4, dtype=torch.bfloat16)
    assert G.to_device_layout(x) is x  # already right: no copy
    v = torch.randn(65)[1:]  # contiguous, 4 bytes past an aligned start
    assert v.is_contiguous() and not G.bindable(v)
    d = G.to_device_layout(v)
    assert d.data_ptr() % 16 == 0 and torch.equal(d, v)


def test_choose_path():
    assert G.choose_path("cpu", True) == "interp"
    assert G.choose_path("cpu", False) == "interp"
    assert G.choose_path("cuda", True) == "gpu"
    assert G.choose_path("cuda", False) == "torch"
    assert G.choose_path("mps", True) == "torch"


def test_builder_one_device_per_segment():
    b = A.Builder()
    b.on_device("cuda:0")
    b.on_device(torch.device("cuda", 0))
    with pytest.raises(A.Unsupported, match="segment on cuda:0"):
        b.on_device("cpu")
    snap = A.Builder().snapshot()
    b2 = A.Builder()
    b2.on_device("cpu")
    b2.rollback(snap)
    assert b2.device is None


# ---- plans for CUDA tensors (fake CUDA tensors; nothing runs) --------------------------------------------

def _cuda_module(with_cumsum=True):
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    def f(x, w, y):
        h = torch.relu(x @ w)
        if with_cumsum:
            h = torch.cumsum(h, 1)
        return F.cross_entropy(torch.tanh(h) * 2.0, y)
    gm = make_fx(f)(torch.randn(4, 8), torch.randn(8, 3), torch.randint(0, 3, (4,)))
    mode = FakeTensorMode()
    with mode:
        fakes = [torch.empty(4, 8, device="cuda"), torch.empty(8, 3, device="cuda"),
                 torch.zeros(4, dtype=torch.long, device="cuda")]
    FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*fakes)
    return gm


def _segments(plan):
    return [s for s in plan.steps if isinstance(s, SG.Segment)]


def _cuda_fx(f, shapes, dtype=torch.float32):
    """make_fx of f on CPU tensors of these shapes, with meta["val"] of fake CUDA tensors (FakeTensorProp): the
    graph build_plan sees for a CUDA module, without a GPU."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    gm = make_fx(f)(*[torch.randn(sh).to(dtype) for sh in shapes])
    mode = FakeTensorMode()
    with mode:
        fakes = [torch.empty(sh, device="cuda", dtype=dtype) for sh in shapes]
    FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*fakes)
    return gm


@needs_lib
def test_cuda_segments_without_program_api_run_in_pytorch(monkeypatch, caplog):
    monkeypatch.setattr(G, "has_program_api", lambda: False)
    caplog.set_level(logging.INFO, logger="evt")
    plan = PL.build_plan(_cuda_module())
    segs = _segments(plan)
    assert segs and all(s.path == "torch" and s.device.type == "cuda" for s in segs)
    why = {n.name: w for n, w in plan.fallbacks}
    assert "no translation" in why["cumsum"]
    assert "no GPU program API" in why["mm"] and "no GPU program API" in why["tanh"]
    assert all(s.program is None for s in segs)


class _Created:
    """Stands in for a created program: plan construction only records it (nothing is run)."""

    def __init__(self, text):
        self.text = text


def _fake_programs(monkeypatch, refuse=None):
    """gpu.Program replaced by a stand-in that records each created program's text (the returned list) and
    refuses a text containing `refuse` with a node-naming ProgramError; an empty program cache of the module's
    own kind; no CUDA device context."""
    made = []

    class FakeProgram:
        def __init__(self, text, flags, name, refine=1, arch=None, tf32=False):
            if refuse and refuse in text:
                raise G.ProgramError("seg.evt:3:3: node %tanh (tanh): no GPU kernel for this op")
            made.append(text)

        def launch_count(self):
            return 1
    monkeypatch.setattr(G, "Program", FakeProgram)
    monkeypatch.setattr(SG, "_PROGRAMS", type(SG._PROGRAMS)())
    monkeypatch.setattr(SG.torch.cuda, "device", lambda d: contextlib.nullcontext())  # (no CUDA here)
    return made


@needs_lib
def test_program_cache_keeps_only_programs_in_use(monkeypatch):
    """Segments of one text share a program while one of them holds it; a program no segment holds any more
    (its plan was rebuilt or dropped) leaves the cache, so its device memory is freed."""
    import gc
    made = _fake_programs(monkeypatch)
    g = evt_lib.Graph("graph t {\n  %x: f32[4] = input()\n  %y = relu(%x)\n  output %y\n}\n", "<t>")
    p = SG._program_for(g, G.EVT_PROGRAM_FUSED, None, 1)
    assert SG._program_for(g, G.EVT_PROGRAM_FUSED, None, 1) is p and len(made) == 1
    assert SG.program_cached(g, G.EVT_PROGRAM_FUSED, None)
    del p
    gc.collect()
    assert not SG.program_cached(g, G.EVT_PROGRAM_FUSED, None)
    SG._program_for(g, G.EVT_PROGRAM_FUSED, None, 1)
    assert len(made) == 2


@needs_lib
def test_program_rejecting_a_node_moves_it_to_pytorch(monkeypatch):
    monkeypatch.setattr(G, "has_program_api", lambda: True)
    made = []

    def fake_program_for(graph, flags, device, refine, arch=None, tf32=False):
        text = graph.text()
        if "tanh(" in text:
            raise G.ProgramError("seg.evt:3:3: node %tanh (tanh): no GPU kernel for this op")
        made.append((flags, device))
        return _Created(text)
    monkeypatch.setattr(SG, "_program_for", fake_program_for)
    plan = PL.build_plan(_cuda_module(with_cumsum=False))
    why = {n.name: w for n, w in plan.fallbacks}
    assert set(why) == {"tanh"} and "evt GPU program" in why["tanh"], why
    segs = _segments(plan)
    assert len(segs) == 2 and all(s.path == "gpu" and isinstance(s.program, _Created) for s in segs)
    assert all(flags == G.EVT_PROGRAM_FUSED | G.EVT_PROGRAM_NO_OPT for flags, _ in made)
    assert all(str(d) == "cuda:0" for _, d in made)


@needs_lib
def test_rebuild_reuses_the_last_attempts_programs(monkeypatch):
    """A plan rebuilt after a program refused a node creates no program twice: the programs of the last attempt
    stay cached (the cache holds a program only while a plan does) until the new attempt is built."""
    monkeypatch.setattr(G, "has_program_api", lambda: True)
    made = _fake_programs(monkeypatch, refuse="tanh(")
    plan = PL.build_plan(_cuda_module(with_cumsum=True))  # (mm, relu | cumsum in PyTorch | tanh, ...)
    assert {n.name for n, _ in plan.fallbacks} >= {"tanh"}
    assert len(made) >= 2 and len(made) == len(set(made)), made
    assert all(type(s.program) is G.Program for s in _segments(plan))


@needs_lib
def test_program_failure_without_a_node_runs_its_segment_in_pytorch(monkeypatch):
    monkeypatch.setattr(G, "has_program_api", lambda: True)

    def fake_program_for(graph, flags, device, refine, arch=None, tf32=False):
        if "mm(" in graph.text():
            raise G.ProgramError("out of device memory for the arena")
        return _Created(graph.text())
    monkeypatch.setattr(SG, "_program_for", fake_program_for)
    plan = PL.build_plan(_cuda_module(with_cumsum=True), {"cudagraphs": "segments"})
    segs = _segments(plan)
    assert [s.path for s in segs] == ["torch", "gpu"], [(s.path, s.text) for s in segs]
    why = {n.name: w for n, w in plan.fallbacks}
    assert "out of device memory" in why["mm"] and "out of device memory" in why["relu"]
    assert isinstance(segs[1].pool, G.OutputPool)  # cudagraphs: stable output buffers


@needs_lib
def test_rebuilds_are_bounded(monkeypatch):
    """Past MAX_PROGRAM_REBUILDS node rejections, a rejecting segment runs whole in PyTorch."""
    monkeypatch.setattr(G, "has_program_api", lambda: True)
    monkeypatch.setattr(PL, "MAX_PROGRAM_REBUILDS", 1)

    def fake_program_for(graph, flags, device, refine, arch=None, tf32=False):
        t = graph.text()
        for op in ("tanh", "relu"):
            if f"{op}(" in t:
                raise G.ProgramError(f"x: node %{op} ({op}): unsupported")
        return _Created(t)
    monkeypatch.setattr(SG, "_program_for", fake_program_for)
    plan = PL.build_plan(_cuda_module(with_cumsum=False))
    why = {n.name: w for n, w in plan.fallbacks}
    assert "relu" in why and "tanh" in why
    assert any(s.path == "torch" and len(s.members) > 1 for s in _segments(plan))


@needs_lib
def test_cpu_segments_use_the_interpreter():
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    gm = make_fx(lambda x, w: [torch.relu(x @ w).sum()])(torch.randn(4, 8), torch.randn(8, 3))
    FakeTensorProp(gm).propagate(torch.randn(4, 8), torch.randn(8, 3))
    plan = PL.build_plan(gm)
    assert [s.path for s in _segments(plan)] == ["interp"]
    x, w = torch.randn(4, 8), torch.randn(8, 3)
    B.reset_stats()
    (out,) = plan([x, w])
    assert B.STATS["interp_segment_runs"] == 1 and B.STATS["gpu_segment_runs"] == 0
    assert torch.allclose(out, torch.relu(x @ w).sum(), rtol=1e-5)


# ---- CUDA-graph output pool (policy only; exercised with CPU tensors) ------------------------------------

def test_output_pool_reuses_only_free_buffers():
    pool = G.OutputPool()
    big = (G.SMALL_OUTPUT + 1,)
    b1, handed = pool.get(0, big, torch.float32, "cpu")
    assert handed
    out1 = G.OutputPool.hand_out(b1, handed)
    assert out1.data_ptr() == b1.data_ptr()
    b2, _ = pool.get(0, big, torch.float32, "cpu")  # out1 alive: a new buffer
    assert b2.data_ptr() != b1.data_ptr()
    out2 = G.OutputPool.hand_out(b2, True)
    a = torch.randn(big, requires_grad=True)
    y = a * out2  # autograd saves out2
    del out2
    b3, _ = pool.get(0, big, torch.float32, "cpu")
    assert b3 is not b2  # still saved for backward: busy
    y.sum().backward()
    del y
    b4, _ = pool.get(0, big, torch.float32, "cpu")
    b5, _ = pool.get(0, big, torch.float32, "cpu")
    assert b5 is b4  # nothing handed out in between: reused
    del b1, b2


def test_output_pool_small_outputs_are_copied():
    pool = G.OutputPool()
    b1, handed = pool.get(0, (), torch.float32, "cpu")
    assert not handed
    b1.fill_(3.0)
    loss = G.OutputPool.hand_out(b1, handed)
    assert loss.data_ptr() != b1.data_ptr() and loss.item() == 3.0
    b2, _ = pool.get(0, (), torch.float32, "cpu")
    assert b2 is b1  # the caller holding `loss` does not force a new buffer


# ---- the backend's options through torch.compile ----------------------------------------------------------

@needs_lib
def test_compile_with_options_on_cpu(caplog):
    torch._dynamo.reset()
    m = nn.Linear(4, 3)
    x = torch.randn(2, 4)
    f = torch.compile(m, backend="evt", options={"cudagraphs": True, "fused": False})
    with caplog.at_level(logging.INFO, logger="evt"):
        y = f(x)
    assert torch.allclose(y, m(x), rtol=1e-5, atol=1e-6)
    # CPU tensors: PyTorch's CUDA-graph checks refuse the step graph; the module still runs (and trains)
    assert any("no step CUDA graph" in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]
    y.sum().backward()
    w = m.weight.grad.clone()
    m.zero_grad()
    m(x).sum().backward()
    assert torch.allclose(w, m.weight.grad, rtol=1e-5, atol=1e-6)
    torch._dynamo.reset()
    g = torch.compile(nn.Linear(4, 3), backend="evt", options={"no_such_option": 1})
    with pytest.raises(Exception, match="unknown option"):
        g(x)
    torch._dynamo.reset()


def test_backend_registered_with_options_signature():
    import inspect
    assert "options" in inspect.signature(evt.evt_backend).parameters


# ---- the ctypes binding of evt_program_* on a host-only plan (no device: runs must fail cleanly) ----------

def _host_api():
    return evt_lib.has_interpreter() and hasattr(evt_lib.lib(), "evt_program_create_host")


@pytest.mark.skipif(not _host_api(), reason="libevt has no evt_program_create_host")
def test_program_binding_on_a_host_plan():
    text = ("graph seg {\n  %in.x: f32[4,8] = input()\n  %in.w: f32[8,3] = input()\n"
            "  %mm: f32[4,3] = mm(%in.x, %in.w)\n  %r: f32[4,3] = relu(%mm)\n  output %r, %mm\n}\n")
    p = G.Program(text, G.EVT_PROGRAM_FUSED, host=True)
    assert isinstance(p.launch_count(), int)
    x, w = torch.zeros(4, 8), torch.zeros(8, 3)
    outs = [torch.empty(4, 3), torch.empty(4, 3)]
    with pytest.raises(G.ProgramError, match="no input or param named 'in.y'"):
        p.run([("in.y", x)], outs, 0)
    with pytest.raises(G.ProgramError, match="run"):  # bound, but planned without a device
        p.run([("in.x", x), ("in.w", w)], outs, 0)
    assert p.runs == 0
    assert evt_lib.lib().evt_program_arena_bytes(p._p) == 0  # every value is an output (caller memory)
    del p  # evt_program_destroy
    # node by node, %mm lives in the arena: 4 x 3 f32 rounded up to the arena's 256-byte alignment
    q = G.Program(text.replace("output %r, %mm", "output %r"), 0, host=True)
    assert evt_lib.lib().evt_program_arena_bytes(q._p) == 256


@pytest.mark.skipif(not _host_api(), reason="libevt has no evt_program_create_host")
def test_program_create_error_is_a_program_error():
    with pytest.raises(G.ProgramError, match="no outputs"):
        G.Program("graph seg {\n  %in.x: f32[4] = input()\n}\n", 0, host=True)


# ---- the GPU path's Python glue end to end, with the interpreter standing in for the device -------------
# choose_path sends CPU segments down the GPU path and _program_for returns a program object whose run()
# executes the bound inputs on the CPU interpreter and writes the bound output buffers. Everything the GPU
# path does around evt_program_run (names and pointers bound, output order and dtypes, int64 inputs,
# strides, the CUDA-graph pool and input staging, STATS) runs for real; the values come from evt.

class InterpProgram:
    def __init__(self, text, flags):
        self.graph = evt_lib.Graph(text, "interp-program")
        self.flags = flags
        self.runs = self.captures = 0
        self._last = None
        self._names = []
        self.moved = []  # names of the bindings whose pointer changed, once per change
        self.steps = []  # the RNG step set before each run (set_rng_step)
        self.bound = []

    def run(self, inputs, outputs, stream):
        assert stream == 0
        for _, t in inputs:
            assert t.is_contiguous() and t.dtype == G.device_dtype(t.dtype)
        key = tuple(t.data_ptr() for _, t in inputs) + tuple(t.data_ptr() for t in outputs)
        if key != self._last:
            self.captures += 1
            if self._last is not None:  # which bindings moved (by name; outputs by position)
                now = [name for name, _ in inputs] + ["out%d" % k for k in range(len(outputs))]
                before = dict(zip(self._names, self._last))
                self.moved.extend(n for n, ptr in zip(now, key) if before.get(n, ptr) != ptr)
            self._last, self._names = key, [name for name, _ in inputs] + ["out%d" % k for k in range(len(outputs))]
        ids = self.graph.ids
        res = self.graph.run([(ids[name], t) for name, t in inputs],
                             [(self.graph.outputs[k], t.dtype) for k, t in enumerate(outputs)])
        for t, r in zip(outputs, res):
            assert t.shape == r.shape and t.dtype == r.dtype
            t.copy_(r)
        self.runs += 1
        self.bound.append([name for name, _ in inputs])

    def launch_count(self):
        return 1

    def set_rng_step(self, step, stream):
        assert stream == 0
        self.steps.append(step)
        self.graph.set_rng_step(step)


class _Stream:
    cuda_stream = 0


def _glue_setup(monkeypatch):
    monkeypatch.setattr(G, "choose_path", lambda dev, api: "gpu")
    made = []

    def program_for(graph, flags, device, refine, arch=None, tf32=False):
        made.append(InterpProgram(graph.text(), flags))
        return made[-1]
    monkeypatch.setattr(SG, "_program_for", program_for)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _Stream())
    monkeypatch.setattr(SG, "_GRAPHS", {})  # (other tests expect to see their segments parsed)
    return made


@needs_lib
@pytest.mark.parametrize("options", [None, {"cudagraphs": "segments"}, "cuda_rules"])
@pytest.mark.parametrize("model", ["MLP", "Bert", "XMLCNN", "ConvBN", "GCNEdges"])
def test_gpu_glue_with_the_interpreter_as_device(monkeypatch, options, model):
    """The GPU path's Python glue (binding, output allocation, layouts, casts; Segment._run_fast without CUDA
    graphs, the staging / output pool with them) on the interpreter: "cuda_rules" also applies the CUDA
    placement and layout rules (config.SIMULATE_CUDA_RULES: transposed and memory-order bindings, hoisted casts)."""
    import copy
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import test_torch_backend as T
    if options == "cuda_rules":
        monkeypatch.setattr(C, "SIMULATE_CUDA_RULES", True)
        options = None
    made = _glue_setup(monkeypatch)
    make, inputs = {
        "MLP": (T.MLP, lambda: (torch.randn(4, 8), torch.randint(0, 4, (4,)))),
        "Bert": (T.Bert, lambda: (torch.randn(2, 5, 8), torch.randint(0, 3, (2,)))),
        "XMLCNN": (T.XMLCNN, lambda: (torch.randint(0, 30, (2, 7)), torch.rand(2, 5).round())),
        "ConvBN": (T.ConvBN, lambda: (torch.randn(2, 3, 4, 4), torch.randint(0, 3, (2,)))),
        "GCNEdges": (T.GCNEdges, lambda: (torch.tensor([0, 1, 2, 3, 4, 5, 6, 0]), torch.tensor([1, 2, 3, 4, 5, 6, 0, 0]),
                                          torch.rand(8), torch.randn(7, 6), torch.randint(0, 3, (7,)))),
    }[model]
    torch._dynamo.reset()
    torch.manual_seed(0)
    ref = make()
    mod = copy.deepcopy(ref)
    f = torch.compile(mod, backend="evt", fullgraph=True, options=options)
    opt_ref, opt = torch.optim.SGD(ref.parameters(), lr=0.1), torch.optim.SGD(mod.parameters(), lr=0.1)
    B.reset_stats()
    captures = []
    losses = []
    steps = 6
    for step in range(steps):
        args = inputs()
        before = B.STATS["captures"]
        loss = f(*args)  # (the previous step's loss is still held: small outputs are copies)
        loss.backward()
        losses.append(loss)
        captures.append(B.STATS["captures"] - before)
        loss_ref = ref(*args)
        loss_ref.backward()
        assert T.rel_err(loss.detach(), loss_ref.detach()) <= 1e-4
        for (n, p_ref), (_, p) in zip(ref.named_parameters(), mod.named_parameters()):
            assert T.rel_err(p.grad, p_ref.grad) <= 1e-4, (step, n)
        opt.step()
        opt_ref.step()
        opt.zero_grad()
        opt_ref.zero_grad()
    assert made and all(p.runs == steps for p in made)
    assert all(p.flags & G.EVT_PROGRAM_NO_OPT for p in made)
    assert bool(options) == all(p.flags & G.EVT_PROGRAM_CUDA_GRAPH for p in made)
    assert B.STATS["gpu_segment_runs"] == steps * len(made) and B.STATS["interp_segment_runs"] == 0
    if options:
        # Each input can force one more capture, when its pointer first changes (it is staged from then
        # on; at which step that happens depends on the allocator), so no binding moves twice.
        for p in made:
            assert len(p.moved) == len(set(p.moved)), (p.moved, captures)
        assert sum(captures) <= sum(1 + len(p.bound[0]) for p in made), captures


@needs_lib
@pytest.mark.parametrize("options", [None, {"cudagraphs": "segments"}, "cuda_rules"])
def test_gpu_glue_draws_an_rng_step_per_dropout_run(monkeypatch, options):
    """The GPU path of a model with dropout: the segment holding native_dropout gets a fresh RNG step from
    PyTorch's generator before every run (set_rng_step), repeated by torch.manual_seed; its mask and output
    agree with eager PyTorch run with that mask."""
    import copy
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import test_torch_backend as T
    if options == "cuda_rules":  # (CUDA placement: dropout runs in evt under the default gpu_ops)
        monkeypatch.setattr(C, "SIMULATE_CUDA_RULES", True)
        options = None
    made = _glue_setup(monkeypatch)
    torch._dynamo.reset()
    torch.manual_seed(0)
    ref = T.DropMLP(0.25)
    f = torch.compile(copy.deepcopy(ref), backend="evt", fullgraph=True, options=options)
    x, y = torch.randn(64, 16), torch.randint(0, 4, (64,))
    outs = []
    for seed in (5, 6, 5):
        torch.manual_seed(seed)
        loss, h = f(x, y)
        loss.backward()
        keep = h != 0
        assert T.rel_err(h.detach(), (F.gelu(ref.a(x)) * keep / 0.75).detach()) <= 1e-5
        outs.append(keep)
    drawing = [p for p in made if p.steps]
    assert len(drawing) == 1 and len(drawing[0].steps) == 3 == drawing[0].runs, [(p.steps, p.runs) for p in made]
    s = drawing[0].steps
    assert s[0] == s[2] != s[1] and torch.equal(outs[0], outs[2]) and not torch.equal(outs[0], outs[1])


@needs_lib
@pytest.mark.parametrize("gpu_ops", [None, ()])
def test_cuda_dropout_runs_in_evt_unless_gpu_ops_leaves_it_out(monkeypatch, caplog, gpu_ops):
    """Under the CUDA placement rules (simulated on the CPU) native_dropout runs in evt by default, and in
    PyTorch with the logged reason when a gpu_ops list leaves "dropout" out; the rest of the step runs in evt
    either way."""
    import test_torch_backend as T
    monkeypatch.setattr(C, "SIMULATE_CUDA_RULES", True)
    caplog.set_level(logging.INFO, logger="evt")
    torch._dynamo.reset()
    torch.manual_seed(0)
    f = torch.compile(T.DropMLP(0.25), backend="evt", fullgraph=True,
                      options=None if gpu_ops is None else {"gpu_ops": gpu_ops})
    loss, h = f(torch.randn(64, 16), torch.randint(0, 4, (64,)))
    loss.backward()
    in_torch = "native_dropout.default" in T.fallbacks(caplog.records)
    logged = any("dropout draws its mask in PyTorch on CUDA" in r.getMessage() for r in caplog.records)
    assert in_torch == logged == (gpu_ops is not None)
    assert abs((h != 0).float().mean().item() - 0.75) < 0.1


# ---- CUDA attention (gpu_ops naming "attention") --------------------------------------------------------------------

def test_sdpa_grad_recompute_matches_the_cpu_kernel():
    """evt::sdpa_backward's device-generic implementation (used on CUDA) against PyTorch's CPU kernel."""
    g = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(2, 3, 5, 4, generator=g) for _ in range(4))
    for causal in (False, True):
        ref = torch.ops.evt.sdpa_backward(dout, q, k, v, causal, 0.0)
        got = A.sdpa_grad_recompute(dout, q, k, v, causal, None)
        for a, b in zip(got, ref):
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)


@needs_lib
def test_cuda_attention_translation_is_opt_in(monkeypatch):
    """The CUDA SDPA ops are translated only when gpu_ops names "attention"; the joint-graph rewrite likewise."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    def f(q, k, v):
        o = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, False, 0.0, False)[0]
        return [torch.relu(o)]
    mode = FakeTensorMode()
    with mode:
        fakes = [torch.empty(1, 2, 4, 8, device="cuda") for _ in range(3)]
    with mode:
        gm = make_fx(f)(*fakes)
    gm.graph.eliminate_dead_code()  # (the unused outputs' getitems, as in AOTAutograd's graphs)
    gm.recompile()
    FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*fakes)
    monkeypatch.setattr(G, "has_program_api", lambda: True)
    monkeypatch.setattr(SG, "_program_for", lambda graph, flags, device, refine, arch=None, tf32=False: _Created(graph.text()))
    plan = PL.build_plan(gm)
    why = {n.name: w for n, w in plan.fallbacks}
    assert any("naming 'attention'" in w for w in why.values()), why
    plan = PL.build_plan(gm, {"gpu_ops": ["attention", "dropout"]})
    segs = _segments(plan)
    assert plan.fallbacks == [] and len(segs) == 1 and "sdpa(" in segs[0].text


@needs_lib
def test_cuda_convolution_stays_in_pytorch_unless_all_ops(monkeypatch):
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    def f(x, w):
        return [torch.relu(torch.ops.aten.convolution(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1))]
    mode = FakeTensorMode()
    with mode:
        fakes = [torch.empty(2, 3, 6, 6, device="cuda"), torch.empty(4, 3, 3, 3, device="cuda")]
        gm = make_fx(f)(*fakes)
    FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*fakes)
    monkeypatch.setattr(G, "has_program_api", lambda: True)
    monkeypatch.setattr(SG, "_program_for", lambda graph, flags, device, refine, arch=None, tf32=False: _Created(graph.text()))
    why = {n.name: w for n, w in PL.build_plan(gm).fallbacks}
    assert list(why) == ["convolution"] and "cuDNN" in why["convolution"], why
    for ops in ("all", ("convolution",)):
        plan = PL.build_plan(gm, {"gpu_ops": ops})
        assert plan.fallbacks == [] and "conv2d(" in _segments(plan)[0].text


def _cuda_resnet_block():
    """conv -> batch norm -> relu -> max pool -> sum on fake CUDA tensors, forward and backward (make_fx of
    autograd.grad), with the joint-graph rewrite applied as partition_fn does."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    aten = torch.ops.aten

    def f(x, w, g, b):
        y = aten.convolution(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
        y = aten.native_batch_norm(y, g, b, None, None, True, 0.1, 1e-5)[0]
        y = aten.max_pool2d_with_indices(torch.relu(y), [2, 2], [2, 2])[0]
        loss = (y * y).sum()
        return [loss] + list(torch.autograd.grad(loss, [x, w, g, b]))
    shapes = [(2, 3, 6, 6), (4, 3, 3, 3), (4,), (4,)]
    gm = make_fx(f)(*[torch.randn(s, requires_grad=True) for s in shapes])  # (traced on CPU: autograd)
    mode = FakeTensorMode()
    with mode:
        fakes = [torch.empty(s, device="cuda") for s in shapes]
    FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*fakes)
    return gm


@needs_lib
def test_cuda_reference_only_ops_run_in_pytorch(monkeypatch):
    """gpu_ops "fast" (default): convolution, pooling and their backward on CUDA are PyTorch fallbacks naming
    the reference library, batch norm and its backward fallbacks naming the "batch_norm" family (evt's kernels
    are slower); the elementwise ops around them stay evt segments on the GPU; gpu_ops "all" keeps them in evt,
    a list naming "batch_norm" the batch norms only."""
    monkeypatch.setattr(G, "has_program_api", lambda: True)
    monkeypatch.setattr(SG, "_program_for", lambda graph, flags, device, refine, arch=None, tf32=False: _Created(graph.text()))
    gm = _cuda_resnet_block()
    A.rewrite_joint(gm, attention=False, cuda_pools=False)
    assert any(n.target == torch.ops.aten.max_pool2d_with_indices_backward.default for n in gm.graph.nodes)
    plan = PL.build_plan(gm)
    fb = collections.Counter(P.op_name(n).split(".")[0] for n, w in plan.fallbacks if "reference library" in w)
    assert fb["convolution"] == 1 and fb["convolution_backward"] == 1, fb
    bn = collections.Counter(P.op_name(n).split(".")[0] for n, w in plan.fallbacks if "naming 'batch_norm'" in w)
    assert bn["native_batch_norm"] == 1 and bn["native_batch_norm_backward"] == 1, plan.fallbacks
    assert fb["max_pool2d_with_indices"] == 1 and fb["max_pool2d_with_indices_backward"] == 1, fb
    segs = _segments(plan)
    assert segs and all(s.path == "gpu" for s in segs)
    text = "".join(s.text for s in segs)
    assert "relu(" in text or "threshold_backward(" in text or "where(" in text
    for op in ("conv2d", "batch_norm", "max_pool2d"):
        assert f"{op}(" not in text and f"{op}_backward" not in text, op
    # "all", and a list of every family but dropout (the block has none)
    for opts in ({"gpu_ops": "all"}, {"gpu_ops": ("attention", "batch_norm", "convolution", "pooling")}):
        gm = _cuda_resnet_block()
        A.rewrite_joint(gm, attention=True, cuda_pools=True)
        plan = PL.build_plan(gm, opts)
        assert not any("reference library" in w for _, w in plan.fallbacks), plan.fallbacks
        text = "".join(s.text for s in _segments(plan))
        assert "conv2d(" in text and "max_pool2d_backward(" in text, text
    # a list naming "batch_norm": the batch norms alone join the segments
    gm = _cuda_resnet_block()
    A.rewrite_joint(gm, attention=False, cuda_pools=False)
    plan = PL.build_plan(gm, {"gpu_ops": ["batch_norm", "dropout"]})
    names = {P.op_name(n).split(".")[0] for n, _ in plan.fallbacks}
    assert "convolution" in names and "native_batch_norm" not in names and "native_batch_norm_backward" not in names, names
    text = "".join(s.text for s in _segments(plan))
    assert "batch_norm" in text, text


@needs_lib
def test_cuda_placement_leaves_cpu_plans_alone(monkeypatch):
    """The same block on CPU tensors: every op is translated (interpreter), whatever the policy."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    aten = torch.ops.aten

    def f(x, w):
        y = aten.convolution(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
        return [aten.max_pool2d_with_indices(torch.relu(y), [2, 2], [2, 2])[0].sum()]
    x, w = torch.randn(2, 3, 6, 6), torch.randn(4, 3, 3, 3)
    gm = make_fx(f)(x, w)
    gm.graph.eliminate_dead_code()  # (the unused indices' getitem, as in AOTAutograd's graphs)
    gm.recompile()
    FakeTensorProp(gm).propagate(x, w)
    for n in gm.graph.nodes:
        if n.op == "call_function":
            assert P.cuda_placement(n, {"gpu_ops": "fast"}) is None
    plan = PL.build_plan(gm, {"gpu_ops": "fast"})
    assert plan.fallbacks == [] and [s.path for s in _segments(plan)] == ["interp"]
    (out,) = plan([x, w])
    assert torch.allclose(out, f(x, w)[0], rtol=1e-5)


def _cuda_autocast_linear():
    """A bf16 linear as autocast records it: casts of x, w and b, mm with t(w), the bias add; the transposed
    bf16 weight is also an output (saved for the backward)."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    aten = torch.ops.aten

    def f(x, w, b):
        xb, wb, bb = (aten._to_copy(t, dtype=torch.bfloat16) for t in (x, w, b))
        wt = aten.t(wb)
        return [torch.relu(aten.addmm(bb, xb, wt)), wt]
    shapes = [(16, 32), (64, 32), (64,)]
    gm = make_fx(f)(*[torch.randn(s) for s in shapes])
    mode = FakeTensorMode()
    with mode:
        fakes = [torch.empty(s, device="cuda") for s in shapes]
    FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*fakes)
    return gm


@needs_lib
def test_input_casts_are_hoisted_on_cuda(monkeypatch):
    monkeypatch.setattr(G, "has_program_api", lambda: True)
    monkeypatch.setattr(SG, "_program_for", lambda graph, flags, device, refine, arch=None, tf32=False: _Created(graph.text()))
    plan = PL.build_plan(_cuda_autocast_linear())
    casts = [n for n, w in plan.fallbacks if w == P.HOISTED_CAST]
    assert len(casts) == 3 and plan.steps[:3] == casts, plan.steps
    (seg,) = _segments(plan)
    assert "cast(" not in seg.text and "mm(" in seg.text, seg.text
    # the transposed weight leaves the segment as a PyTorch view of the hoisted cast, not an evt output
    assert [m.target for m in seg.torch_views] == [torch.ops.aten.t.default], seg.torch_views
    assert seg.text.count("output") == 1 and "output %relu" in seg.text.replace(" ", " "), seg.text


@needs_lib
def test_hoisted_casts_run_as_one_multi_tensor_copy(monkeypatch):
    """Hoisted casts (config.SIMULATE_CUDA_RULES: the CUDA rules on the CPU) run as one torch._foreach_copy_ per
    (device, dtypes) into fresh tensors, bitwise equal to one cast each; a non-contiguous input is cast on its
    own."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    aten = torch.ops.aten
    monkeypatch.setattr(C, "SIMULATE_CUDA_RULES", True)

    def f(x, w1, w2, b):
        xb, w1b, w2b, bb = (aten._to_copy(t, dtype=torch.bfloat16) for t in (x, w1, w2, b))
        h = torch.relu(aten.addmm(bb, xb, aten.t(w1b)))
        return [aten.mm(h, aten.t(w2b)).float().sum()]
    shapes = [(4, 8), (6, 8), (5, 6), (6,)]
    ins = [torch.randn(s) for s in shapes]
    gm = make_fx(f)(*ins)
    FakeTensorProp(gm).propagate(*ins)
    calls = []
    real = torch._foreach_copy_

    def spy(outs, srcs):
        calls.append([tuple(t.shape) for t in srcs])
        return real(outs, srcs)
    monkeypatch.setattr(torch, "_foreach_copy_", spy)
    ref = f(*ins)[0]
    plan = PL.build_plan(gm)
    assert [w for _, w in plan.fallbacks].count(P.HOISTED_CAST) == 4, plan.fallbacks
    (out,) = plan(list(ins))
    assert torch.equal(out, ref), (out, ref)
    assert calls == [[(4, 8), (6, 8), (5, 6), (6,)]], calls
    # one step's casts directly: fresh bf16 tensors equal to .to(); a transposed (non-contiguous) weight alone
    casts = plan.steps[:4]
    w1t = torch.randn(8, 6).t()
    env = dict(zip(plan.placeholders, [ins[0], w1t, ins[2], ins[3]]))
    calls.clear()
    TS.run_hoisted_casts(casts, env)
    assert calls == [[(4, 8), (5, 6), (6,)]], calls
    for c, x in zip(casts, [ins[0], w1t, ins[2], ins[3]]):
        assert env[c].dtype == torch.bfloat16 and torch.equal(env[c], x.to(torch.bfloat16))
        assert env[c].data_ptr() != x.data_ptr()


@needs_lib
def test_views_leaving_a_segment_are_pytorch_views():
    """CPU: views needed outside the segment are PyTorch's views of their base: t(w) of the input w (same
    storage), t(cast(w)) of the cast evt writes, select(permute(view(mm))) of the product (a chain); the
    rest runs in evt, and casts of CPU inputs are not hoisted."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    aten = torch.ops.aten

    def f(x, w):
        wt = aten.t(aten._to_copy(w, dtype=torch.bfloat16))
        y = aten.mm(aten._to_copy(x, dtype=torch.bfloat16), wt)
        q = aten.select(aten.permute(aten.view(y, [4, 3, 2]), [2, 0, 1]), 0, 1)  # [4, 3]: y.view(4,3,2)[..., 1]
        return [torch.relu(y).float().sum(), wt, aten.t(w), aten.cumsum(q, 0)]  # (cumsum: PyTorch)
    x, w = torch.randn(4, 8), torch.randn(6, 8)
    gm = make_fx(f)(x, w)
    FakeTensorProp(gm).propagate(x, w)
    assert P.hoisted_casts(gm) == []
    plan = PL.build_plan(gm)
    segs = _segments(plan)
    assert [P.op_name(n) for n, _ in plan.fallbacks] == ["cumsum.default"], plan.fallbacks
    assert [s.path for s in segs if s.path != "none"] == ["interp"], [(s.path, s.text) for s in segs]
    views = [m for s in segs for m in s.torch_views]
    names = sorted(P.op_name(m).split(".")[0] for m in views)
    assert names == ["permute", "select", "t", "t", "view"], names
    (seg,) = [s for s in segs if s.path == "interp"]
    assert "output" in seg.text and "permute(" not in seg.text.split("output")[1]
    ref = f(x, w)
    got = plan([x, w])
    assert got[2].data_ptr() == w.data_ptr() and got[2].stride() == (1, 8)  # a view of the input itself
    assert got[1].stride() == (1, 8) and torch.equal(got[1], ref[1])      # a view of evt's cast
    assert torch.allclose(got[0], ref[0], rtol=2e-2) and torch.allclose(got[3].float(), ref[3].float(), rtol=2e-2)


@needs_lib
def test_contiguous_permute_of_a_strided_input_runs_before_the_segment(monkeypatch):
    """CUDA: the attention output ([B, H, S, D] over [B, S, H, D] memory) permuted back to contiguous then
    flattened into a GEMM: the permute is a PyTorch step before the segment, which binds its contiguous
    result (no permute of the input in the segment: the GEMM operand stays row-major)."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    aten = torch.ops.aten
    monkeypatch.setattr(G, "has_program_api", lambda: True)
    monkeypatch.setattr(SG, "_program_for", lambda graph, flags, device, refine, arch=None, tf32=False: _Created(graph.text()))

    def f(w, a):
        w = torch.tanh(w)  # (first: the segment starts before the permute)
        y = aten.view(aten.permute(a, [0, 2, 1, 3]), [16, 64])
        return [torch.relu(aten.mm(w, y.t())).sum()]
    gm = make_fx(f)(torch.randn(3, 64), torch.randn(2, 8, 4, 16).transpose(1, 2))
    mode = FakeTensorMode()
    with mode:
        fakes = [torch.empty(3, 64, device="cuda"), torch.empty(2, 8, 4, 16, device="cuda").transpose(1, 2)]
    FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*fakes)
    plan = PL.build_plan(gm)
    assert [P.op_name(n) for n in plan.torch_permutes] == ["permute.default"]
    assert plan.steps[0] is plan.torch_permutes[0] and len(_segments(plan)) == 1
    (seg,) = _segments(plan)
    assert "permute(%in.a" not in seg.text and "in.permute" in seg.text, seg.text
    # CPU: unaffected
    gm2 = make_fx(f)(torch.randn(3, 64), torch.randn(2, 8, 4, 16).transpose(1, 2))
    FakeTensorProp(gm2).propagate(torch.randn(3, 64), torch.randn(2, 8, 4, 16).transpose(1, 2))
    assert PL.build_plan(gm2).torch_permutes == []


@needs_lib
def test_transposed_gemm_operand_is_bound_as_its_memory(monkeypatch):
    """CUDA: a bf16 [32, 64] input laid out transposed (strides (1, 32)) that only a GEMM reads is declared
    bf16[64, 32] and permuted in the segment; the segment binds x.t() (no copy). Used elementwise too: not."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    aten = torch.ops.aten
    monkeypatch.setattr(G, "has_program_api", lambda: True)
    monkeypatch.setattr(SG, "_program_for", lambda graph, flags, device, refine, arch=None, tf32=False: _Created(graph.text()))

    def plan_for(f):
        a, wt = torch.randn(16, 32).bfloat16(), torch.randn(64, 32).bfloat16().t()
        gm = make_fx(f)(a, wt)
        mode = FakeTensorMode()
        with mode:
            fakes = [torch.empty(16, 32, device="cuda", dtype=torch.bfloat16),
                     torch.empty(64, 32, device="cuda", dtype=torch.bfloat16).t()]
        FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*fakes)
        return PL.build_plan(gm), wt

    plan, wt = plan_for(lambda a, wt: [torch.relu(aten.mm(a, wt))])
    (seg,) = _segments(plan)
    assert seg.b.transposed == {"in.wt_1"}, (seg.b.transposed, seg.text)
    assert "%in.wt_1: bf16[64,32] = input()" in seg.text and "permute(%in.wt_1, dims=[1,0])" in seg.text
    bound = seg._input("in.wt_1", wt)
    assert bound.is_contiguous() and bound.data_ptr() == wt.data_ptr() and bound.shape == (64, 32)
    plan, _ = plan_for(lambda a, wt: [torch.relu(aten.mm(a, wt)), wt * 2])
    (seg,) = _segments(plan)
    assert seg.b.transposed == set() and "%in.wt_1: bf16[32,64] = input()" in seg.text, seg.text


@needs_lib
def test_channels_last_segment_runs_in_memory_order(monkeypatch):
    """CUDA, channels-last: relu(x) + y * b[c] is declared over [N, H, W, C] memory (inputs %in.*.phys, the
    output permuted to memory order, every permute cancelled by the passes); at run time the inputs are
    bound as they are (same storage) and the output comes back as a channels-last view with the right
    values (a stand-in program computes on the physical tensors)."""
    import types
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    monkeypatch.setattr(G, "has_program_api", lambda: True)
    monkeypatch.setattr(SG, "_program_for", lambda graph, flags, device, refine, arch=None, tf32=False: _Created(graph.text()))
    cl = torch.channels_last

    def f(x, y, b):
        return [torch.cumsum(torch.relu(x) + y * b.view(1, 3, 1, 1), 0)]  # (cumsum: PyTorch, so the sum leaves)
    x, y, bb = (torch.randn(2, 3, 4, 5).to(memory_format=cl), torch.randn(2, 3, 4, 5).to(memory_format=cl),
                torch.randn(3))
    gm = make_fx(f)(x, y, bb)
    mode = FakeTensorMode()
    with mode:
        fakes = [torch.empty(2, 3, 4, 5, device="cuda").to(memory_format=cl),
                 torch.empty(2, 3, 4, 5, device="cuda").to(memory_format=cl), torch.empty(3, device="cuda")]
    FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*fakes)
    plan = PL.build_plan(gm)
    (seg,) = _segments(plan)
    assert set(seg.phys_in) == {"in.x_1.phys", "in.y_1.phys"} and list(seg.phys_out.values()) == [[0, 2, 3, 1]], seg.text
    assert "permute(" not in seg.graph.text() and "f32[2,4,5,3]" in seg.graph.text(), seg.graph.text()

    class Prog:
        captures = 0

        def run(self, ins, bufs, stream):
            d = dict(ins)
            assert d["in.x_1.phys"].data_ptr() == x.data_ptr() and d["in.x_1.phys"].is_contiguous()
            bphys = d["in.b_1"].view(1, 1, 1, 3)
            bufs[0].copy_(torch.relu(d["in.x_1.phys"]) + d["in.y_1.phys"] * bphys)

        def launch_count(self):
            return 1
    seg.program, seg.device = Prog(), torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "current_stream", lambda dev=None: types.SimpleNamespace(cuda_stream=0))
    ph = [n for n in gm.graph.nodes if n.op == "placeholder"]
    env = dict(zip(ph, [x, y, bb]))
    seg._run_gpu(env)
    (m, _), = seg.out_index
    assert env[m].is_contiguous(memory_format=cl) and torch.allclose(env[m], torch.relu(x) + y * bb.view(1, 3, 1, 1))


@needs_lib
def test_attention_gradients_are_stacked_and_moved_by_pytorch(monkeypatch):
    """CUDA: dq, dk, dv of an attention backward that runs in PyTorch, summed through select_backward into
    the qkv gradient, permuted and flattened for the projection GEMM: the sum becomes a stack
    (stack_select_backwards), and the stack / permute / clone / view run in PyTorch before the segment,
    which then starts from the flattened gradient (row-major GEMM operand, no slice_backward). The permute and
    clone after the stack fold into one stack of permuted views (_fold_stack_permute_clone)."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    aten = torch.ops.aten
    monkeypatch.setattr(G, "has_program_api", lambda: True)
    monkeypatch.setattr(SG, "_program_for", lambda graph, flags, device, refine, arch=None, tf32=False: _Created(graph.text()))

    def f(dout, qkv, w):
        q, k, v = (aten.select(qkv, 0, i) for i in range(3))
        dq, dk, dv = torch.ops.evt.sdpa_backward(dout, q, k, v, False, 0.0)
        sz = [3, 2, 4, 8, 16]
        g = aten.add(aten.add(aten.select_backward(dv, sz, 0, 2), aten.select_backward(dk, sz, 0, 1)),
                     aten.select_backward(dq, sz, 0, 0))
        z = aten._unsafe_view(aten.clone(aten.permute(g, [1, 3, 0, 2, 4]), memory_format=torch.contiguous_format),
                              [16, 192])
        return [torch.relu(aten.mm(z, w))]
    args = [torch.randn(2, 4, 8, 16), torch.randn(3, 2, 4, 8, 16), torch.randn(192, 32)]
    gm = make_fx(f)(*args)
    mode = FakeTensorMode()
    with mode:
        fakes = [torch.empty(a.shape, device="cuda") for a in args]
    FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*fakes)
    assert R.stack_select_backwards(gm) == 1
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert aten.stack.default in targets and aten.select_backward.default not in targets
    # the permute + clone after the stack fold into it: one stack of the permuted gradients (one copy)
    assert aten.clone.default not in targets, targets
    (st,) = [n for n in gm.graph.nodes if n.target == aten.stack.default]
    assert st.args[1] == 2 and all(x.target == aten.permute.default and x.args[1] == [0, 2, 1, 3] for x in st.args[0])
    assert tuple(st.meta["val"].shape) == (2, 8, 3, 4, 16)
    assert torch.equal(gm(*args)[0], f(*args)[0])  # (exact: the same elements, moved once)
    plan = PL.build_plan(gm)
    moved = [P.op_name(n).split(".")[0] for n in plan.torch_moves]
    assert moved[-5:] == ["permute", "permute", "permute", "stack", "_unsafe_view"], moved
    (seg,) = [s for s in _segments(plan) if s.path == "gpu"]  # (the q/k/v selects: PyTorch views, path none)
    assert "in._unsafe_view" in seg.text and "slice_backward" not in seg.text, seg.text
    # the rewrite is exact
    ref = f(*args)[0]
    gm2 = make_fx(f)(*args)
    R.stack_select_backwards(gm2, {"gpu_ops": "fast"})  # (CPU nodes: cuda_placement says no; unchanged)
    assert torch.allclose(gm2(*args)[0], ref)
    # PyTorch's own CUDA attention backward (placed in PyTorch with the forward's reason, and no translation in
    # evt) is a source too: the bert_large graphs under autocast have the cuDNN one
    gm3 = make_fx(f)(*args)
    FakeTensorProp(gm3, mode).propagate_dont_convert_inputs(*fakes)
    (bwd,) = [n for n in gm3.graph.nodes if n.target == torch.ops.evt.sdpa_backward.default]
    bwd.target = aten._scaled_dot_product_cudnn_attention_backward.default
    assert "attention is cuDNN's fused flash attention" in P.cuda_placement(bwd) and R._untranslated_on_cuda(bwd)
    assert R.stack_select_backwards(gm3) == 1
    gm4 = make_fx(f)(*args)
    FakeTensorProp(gm4, mode).propagate_dont_convert_inputs(*fakes)
    (bwd4,) = [n for n in gm4.graph.nodes if n.target == torch.ops.evt.sdpa_backward.default]
    bwd4.target = aten.add.Tensor  # (an op evt translates: the gradients stay in evt, no rewrite)
    assert R.stack_select_backwards(gm4) == 0


@needs_lib
def test_layer_norm_backward_recomputes_its_statistics():
    """rewrite_joint on a layer norm's forward + backward (forced on CPU: ln_devices): the backward becomes
    evt::layer_norm_backward (statistics recomputed from x), the forward's mean / rstd die; the plan's
    results (interpreter) and the op's PyTorch implementation both match autograd."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    aten = torch.ops.aten

    def f(x, w, b, dy):
        y, mean, rstd = aten.native_layer_norm(x, [8], w, b, 1e-5)
        dx, dw, db = aten.native_layer_norm_backward(dy, x, [8], mean, rstd, w, b, [True, True, True])
        return [torch.relu(y), dx, dw, db]
    g = torch.Generator().manual_seed(0)
    args = [torch.randn(5, 8, generator=g), torch.rand(8, generator=g) + 0.5, torch.randn(8, generator=g),
            torch.randn(5, 8, generator=g)]
    ref = f(*args)
    gm = make_fx(f)(*args)
    assert A.rewrite_joint(gm) == 0  # (CPU nodes: not rewritten by default)
    assert A.rewrite_joint(gm, ln_devices=("cpu",)) == 1
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert torch.ops.evt.layer_norm_backward.default in targets
    assert sum(1 for n in gm.graph.nodes if n.target is operator.getitem and
               n.args[0].target == aten.native_layer_norm.default) == 1  # only y is left
    FakeTensorProp(gm).propagate(*args)
    plan = PL.build_plan(gm)
    assert plan.fallbacks == [] and all(s.path in ("interp", "none") for s in _segments(plan))
    got = plan(args)
    for a, r in zip(got, ref):
        assert torch.allclose(a, r, rtol=1e-4, atol=1e-5)
    for a, r in zip(torch.ops.evt.layer_norm_backward(args[3], args[0], [8], args[1], args[2], 1e-5), ref[1:]):
        assert torch.allclose(a, r, rtol=1e-5, atol=1e-6)


@needs_lib
def test_unaligned_rows_run_in_pytorch_on_cuda(monkeypatch):
    """CUDA: a vocabulary of 30522 words (bf16 rows of 61044 bytes) -> the decoder GEMM (with its bias add) runs
    in PyTorch (CUTLASS needs 16-byte rows), and so does the log-softmax after it (the row kernels would take
    its unaligned rows element by element); the aligned GEMM before stays evt; small unaligned tensors and
    gpu_ops "all" are unaffected."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    aten = torch.ops.aten
    monkeypatch.setattr(G, "has_program_api", lambda: True)
    monkeypatch.setattr(SG, "_program_for", lambda graph, flags, device, refine, arch=None, tf32=False: _Created(graph.text()))

    def f(x, w1, w2, b2):
        h = torch.relu(aten.mm(x, w1))
        return [aten._log_softmax(aten.addmm(b2, h, w2).float(), 1, False)]

    def plan_for(v, opts=None):
        shapes = [(64, 64), (64, 64), (64, v), (v,)]
        gm = make_fx(f)(*[torch.randn(s).bfloat16() for s in shapes])
        mode = FakeTensorMode()
        with mode:
            fakes = [torch.empty(s, device="cuda", dtype=torch.bfloat16) for s in shapes]
        FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*fakes)
        return PL.build_plan(gm, opts)
    big = plan_for(30522 * 17)  # (64 x 518874 logits: over UNALIGNED_MIN_NUMEL)
    why = {P.op_name(n).split(".")[0]: w for n, w in big.fallbacks}
    assert "addmm" in why and "_log_softmax" in why and "16-byte" in why["addmm"], why
    why = {P.op_name(n).split(".")[0]: w for n, w in plan_for(30522).fallbacks}
    assert "_log_softmax" in why and "16-byte" in why["_log_softmax"], why
    assert "mm" not in why and any("mm(" in s.text for s in _segments(big))
    assert not plan_for(30).fallbacks  # (64 x 30: small)
    assert not plan_for(30522 * 17, {"gpu_ops": "all"}).fallbacks
    assert P.unaligned_rows(next(n for n in plan_for(64 * 1024).gm.graph.nodes if n.op == "call_function")) is None
    # the GEMM left to PyTorch runs on zero-padded operands (pad_gemm); the aligned one and small ones do not
    padded = [n for n in big.gm.graph.nodes if n.meta.get("evt_pad_gemm")]
    assert [n.target for n in padded] == [aten.addmm.default], padded
    assert not [n for n in plan_for(30).gm.graph.nodes if n.meta.get("evt_pad_gemm")]


@needs_lib
def test_transposed_gemm_operand_rows_are_its_inputs(monkeypatch):
    """CUDA: a weight gradient xᵀ·g over 8193 rows reads x [8193, 128] through a transpose the GEMM takes as its
    operand layout: its rows in memory are x's 128, so neither the transpose nor the GEMM runs in PyTorch as
    "unaligned rows"; a transpose something else reads is still judged by its own rows."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    aten = torch.ops.aten
    monkeypatch.setattr(G, "has_program_api", lambda: True)
    monkeypatch.setattr(SG, "_program_for", lambda graph, flags, device, refine, arch=None, tf32=False: _Created(graph.text()))
    n = 8193

    def plan_for(f, dtype=torch.bfloat16):
        shapes = [(n, 128), (n, 64)]
        gm = make_fx(f)(*[torch.randn(s).to(dtype) for s in shapes])
        mode = FakeTensorMode()
        with mode:
            fakes = [torch.empty(s, device="cuda", dtype=dtype) for s in shapes]
        FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*fakes)
        return PL.build_plan(gm, None)
    assert not plan_for(lambda x, g: [aten.mm(aten.t(x), g)]).fallbacks
    why = {P.op_name(n).split(".")[0]: w for n, w in plan_for(lambda x, g: [aten.mm(aten.t(x), g), aten.t(x) * 2]).fallbacks}
    assert "t" in why and "rows of 8193" in why["t"], why


@needs_lib
def test_edge_list_index_vectors_need_no_alignment_on_cuda(monkeypatch):
    """CUDA: message passing over an odd number of edges (index vectors of 8 x E bytes, the weight column
    w[:, None] of 4 bytes per row) stays in evt, where the edge-spmm pass makes it spmm; an unaligned data
    tensor still runs in PyTorch."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    monkeypatch.setattr(G, "has_program_api", lambda: True)
    monkeypatch.setattr(SG, "_program_for", lambda graph, flags, device, refine, arch=None, tf32=False: _Created(graph.text()))
    E, n = (1 << 20) + 1, 4096

    def prop(h, src, dst, w):
        return [torch.zeros_like(h).index_add(0, dst, h[src] * w[:, None])]

    def plan_for(f):
        args = [torch.randn(n, f), torch.randint(0, n, (E,)), torch.randint(0, n, (E,)), torch.rand(E)]
        gm = make_fx(prop)(*args)
        mode = FakeTensorMode()
        with mode:
            fakes = [torch.empty(a.shape, device="cuda", dtype=a.dtype) for a in args]
        FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*fakes)
        return PL.build_plan(gm, None)
    why = {P.op_name(n).split(".")[0]: w for n, w in plan_for(16).fallbacks}
    assert not {"index", "mul", "index_add"} & set(why), why
    why = {P.op_name(n).split(".")[0]: w for n, w in plan_for(3).fallbacks}  # (rows of 3 x f32: 12 bytes)
    assert "index" in why and "16-byte" in why["index"], why


@needs_lib
def test_long_rows_run_in_pytorch_unless_a_gemm_feeds_them(monkeypatch):
    """CUDA: ops on rows longer than the row kernels take (ROW_KERNEL_MAX_N) that no GEMM feeds run in PyTorch
    (the XML-CNN loss backward over 670,208 labels: its bias-gradient sum), except whole-tensor elementwise ops
    (sigmoid(logits) - target), whose group the runtime launches reshaped into short rows; the chain a GEMM
    feeds (the loss forward in the logits GEMM's epilogue) stays in evt. The sum reads the segment's g: it is
    deferred (runs after the segment), and the GEMMs after it in graph order stay in the segment."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    aten = torch.ops.aten
    monkeypatch.setattr(G, "has_program_api", lambda: True)
    monkeypatch.setattr(SG, "_program_for", lambda graph, flags, device, refine, arch=None, tf32=False: _Created(graph.text()))
    n = 40000

    def f(h, w, logits, t, x2, w2):
        fwd = torch.relu(aten.mm(h, w))                      # a GEMM feeds it: evt
        g = aten.sub(aten.sigmoid(logits), t)               # long rows, whole-tensor elementwise: evt
        dw = aten.mm(aten.t(g), h)                          # [n, 64]: evt
        b = aten.sum(g, [0])                                # long rows, a reduction: PyTorch
        out = aten.relu(aten.mm(fwd, w2))                   # evt, after the sum in graph order, reads the segment
        return [fwd, dw, b, out]
    shapes = [(32, 64), (64, n), (32, n), (32, n), (32, 64), (n, 64)]
    gm = make_fx(f)(*[torch.randn(sh).bfloat16() for sh in shapes])
    mode = FakeTensorMode()
    with mode:
        fakes = [torch.empty(sh, device="cuda", dtype=torch.bfloat16) for sh in shapes]
    FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*fakes)
    plan = PL.build_plan(gm, None)
    why = {P.op_name(m).split(".")[0]: w for m, w in plan.fallbacks}
    assert set(why) == {"sum"} and "rows of 40000" in why["sum"], why
    segs = _segments(plan)
    # relu(mm), sigmoid - t, mm(t(g), h) and relu(mm(fwd, w2)) in one segment; the sum after it
    assert len(segs) == 1 and segs[0].text.count("mm(") == 3 and "sigmoid(" in segs[0].text, [s.text for s in segs]
    names = [P.op_name(s).split(".")[0] if not isinstance(s, SG.Segment) else "SEG" for s in plan.steps]
    assert names == ["SEG", "sum"], names
    assert P.long_rows(next(m for m in gm.graph.nodes if m.target == aten.relu.default)) is None


@pytest.mark.parametrize("m,k,n", [(30, 64, 30522), (64, 30522, 40), (30522, 24, 64), (5, 3, 7), (16, 16, 16)])
def test_padded_gemm_is_the_gemm(m, k, n):
    """padded_gemm (mm / addmm on operands zero-padded to multiples of 8, the result sliced back) gives
    PyTorch's result, with operands that are transposed views too (the weight-gradient GEMM reads grad^T)."""
    aten = torch.ops.aten
    g = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=g, dtype=torch.float64)
    bt = torch.randn(n, k, generator=g, dtype=torch.float64)
    b = bt.t()  # (a transposed view, as the logits' weight W^T)
    for bias in (torch.randn(n, generator=g, dtype=torch.float64), torch.randn(m, n, generator=g, dtype=torch.float64)):
        got = TS.padded_gemm(aten.addmm.default, [bias, a, b], {"beta": 0.5, "alpha": 2.0})
        ref = aten.addmm(bias, a, b, beta=0.5, alpha=2.0)
        assert got.shape == ref.shape and got.is_contiguous()
        assert torch.allclose(got, ref, rtol=1e-12, atol=1e-12)
    got = TS.padded_gemm(aten.mm.default, [a.t().contiguous().t(), b], {})
    assert torch.allclose(got, a @ b, rtol=1e-12, atol=1e-12) and got.is_contiguous()
    # contiguous=False: the strided view of the padded result (no copy), the same values
    view = TS.padded_gemm(aten.mm.default, [a, b], {}, contiguous=False)
    assert torch.equal(view, TS.padded_gemm(aten.mm.default, [a, b], {}))
    assert view.is_contiguous() == (n % 8 == 0)  # (padded columns: a row stride of N rounded up)
    # a transposed view is padded as the row-major tensor it views: the padded operand stays column-major
    at = a.t().contiguous().t()
    pa = TS._pad2d(at, TS.up8(m), TS.up8(k))
    assert pa.t().is_contiguous() and torch.equal(pa, torch.nn.functional.pad(a, (0, TS.up8(k) - k, 0, TS.up8(m) - m)))
    if m * k * n > 10000:  # bf16 (what it runs on): the same up to the summation order
        a16, b16 = a.bfloat16(), b.bfloat16()
        got = TS.padded_gemm(aten.mm.default, [a16, b16], {})
        ref = (a16.double() @ b16.double())
        assert got.dtype == torch.bfloat16 and ((got.double() - ref).abs().max() / ref.abs().max()) < 1e-2


def test_gpu_ops_option():
    """gpu_ops: "fast" (the default: dropout only), "all", or the list of op families that run in evt on CUDA."""
    assert C.parse_options({"gpu_ops": "fast"})["gpu_ops"] == C.parse_options(None)["gpu_ops"] == ("dropout",)
    assert C.parse_options({"gpu_ops": ["dropout", "attention"]})["gpu_ops"] == ("attention", "dropout")
    assert C.parse_options(C.parse_options({"gpu_ops": {"pooling"}}))["gpu_ops"] == ("pooling",)  # (idempotent)
    assert C.all_gpu_ops({"gpu_ops": "all"}) and not C.all_gpu_ops(None)
    assert C.all_gpu_ops(C.parse_options({"gpu_ops": "all"}))
    assert C.gpu_family_in_evt(None, "dropout") and not C.gpu_family_in_evt(None, "attention")
    assert not C.gpu_family_in_evt({"gpu_ops": ()}, "dropout")
    assert C.gpu_family_in_evt({"gpu_ops": ("attention",)}, "attention")
    assert all(C.gpu_family_in_evt({"gpu_ops": "all"}, f) for f in C.GPU_OP_FAMILIES)
    for bad, msg in (("some", "gpu_ops must be"), (["attention", "softmax"], "unknown gpu_ops family"), (3, "gpu_ops")):
        with pytest.raises(ValueError, match=msg):
            C.parse_options({"gpu_ops": bad})


# ---- mixed-dtype normalizations (CUDA autocast: bf16 activations, f32 affine parameters and statistics) ----

@needs_lib
@pytest.mark.parametrize("norm", ["batch", "layer"])
def test_mixed_dtype_norm_translation(norm):
    """Batch norm (training, running stats) and layer norm on a bf16 input with f32 parameters, forward and
    backward, as one evt segment on the interpreter against PyTorch's own mixed-dtype kernels."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    aten = torch.ops.aten
    g = torch.Generator().manual_seed(1)
    if norm == "batch":
        x = torch.randn(4, 3, 5, 5, generator=g).bfloat16()
        w, bb = torch.rand(3, generator=g) + 0.5, torch.randn(3, generator=g)
        rm, rv = torch.randn(3, generator=g), torch.rand(3, generator=g) + 0.5

        def f(x, w, bb, rm, rv, dy):
            y, mean, rstd, nrm, nrv = aten._native_batch_norm_legit_functional(x, w, bb, rm, rv, True, 0.1, 1e-5)
            dx, dw, db = aten.native_batch_norm_backward(dy, x, w, nrm, nrv, mean, rstd, True, 1e-5, [True, True, True])
            return [y, mean, rstd, nrm, nrv, dx, dw, db]
        args = (x, w, bb, rm, rv, torch.randn(4, 3, 5, 5, generator=g).bfloat16())
    else:
        x = torch.randn(6, 8, generator=g).bfloat16()
        w, bb = torch.rand(8, generator=g) + 0.5, torch.randn(8, generator=g)

        def f(x, w, bb, dy):
            y, mean, rstd = aten.native_layer_norm(x, [8], w, bb, 1e-5)
            dx, dw, db = aten.native_layer_norm_backward(dy, x, [8], mean, rstd, w, bb, [True, True, True])
            return [y, mean, rstd, dx, dw, db]
        args = (x, w, bb, torch.randn(6, 8, generator=g).bfloat16())
    gm = make_fx(f)(*args)
    FakeTensorProp(gm).propagate(*args)
    plan = PL.build_plan(gm)
    assert plan.fallbacks == [] and [s.path for s in _segments(plan)] == ["interp"], plan.fallbacks
    got, ref = plan(list(args)), f(*args)
    for a, r in zip(got, ref):
        if a.dtype != r.dtype:  # (PyTorch's CPU kernel disagrees with its own meta on the stats' dtype)
            a = a.to(r.dtype)
        err = ((a.double() - r.double()).abs().max() / r.double().abs().max().clamp_min(1e-6)).item()
        assert err <= 1e-2, (a.dtype, err)


@needs_lib
def test_bf16_composite_backward_rounds_once():
    """gelu / softmax / log_softmax backward on bf16 compute in f32 and round once, as PyTorch's kernels
    do (evt's passes decompose them; in bf16 every primitive would round): within one bf16 rounding of
    PyTorch, with the passes on."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    aten = torch.ops.aten
    g = torch.Generator().manual_seed(2)
    x, dy = torch.randn(8, 32, generator=g).bfloat16(), torch.randn(8, 32, generator=g).bfloat16()
    y = torch.softmax(x.float(), 1).bfloat16()
    ly = torch.log_softmax(x.float(), 1).bfloat16()

    def f(x, dy, y, ly):
        return [aten.gelu_backward(dy, x), aten._softmax_backward_data(dy, y, 1, torch.bfloat16),
                aten._log_softmax_backward_data(dy, ly, 1, torch.bfloat16)]
    args = (x, dy, y, ly)
    gm = make_fx(f)(*args)
    FakeTensorProp(gm).propagate(*args)
    plan = PL.build_plan(gm)
    assert plan.fallbacks == []
    assert "dtype=f32" in _segments(plan)[0].text
    for a, r in zip(plan(list(args)), f(*args)):
        assert a.dtype == torch.bfloat16
        ulp = r.float().abs().clamp_min(1e-3) * 2.0 ** -7
        assert ((a.float() - r.float()).abs() <= ulp).all()


@needs_lib
def test_gpu_segments_prefetch_their_kernels_in_one_batch(monkeypatch):
    """A plan with several GPU segments (CUDA convolution / batch norm / pooling run in PyTorch between
    them) hands every segment's optimized text to gpu.prefetch once, before it creates any program."""
    gm = _cuda_resnet_block()
    events = []
    monkeypatch.setattr(G, "has_program_api", lambda: True)
    monkeypatch.setattr(SG, "_PROGRAMS", {})
    monkeypatch.setattr(G, "prefetch", lambda texts, flags, refine, arch=None, tf32=False: events.append(("prefetch", list(texts), flags)) or 0)

    def program_for(graph, flags, device, refine, arch=None, tf32=False):
        events.append(("create", graph.text()))
        return _Created(graph.text())
    monkeypatch.setattr(SG, "_program_for", program_for)
    plan = PL.build_plan(gm)
    segs = [s for s in _segments(plan) if s.path == "gpu"]
    assert len(segs) >= 2, [s.path for s in _segments(plan)]
    kinds = [e[0] for e in events]
    assert kinds[0] == "prefetch" and kinds.count("prefetch") == 1 and kinds.count("create") == len(segs), kinds
    assert sorted(events[0][1]) == sorted(s.graph.text() for s in segs)
    assert events[0][2] & G.EVT_PROGRAM_FUSED


@needs_lib
def test_gpu_segments_are_tuned_first_when_asked(monkeypatch, caplog):
    """options={"tune": 3}: every GPU segment's text goes to gpu.tune once, before the
    prefetch and the programs (which then read the records); a tuning failure (no GPU here) is a logged
    warning, and the programs are created untuned."""
    gm = _cuda_resnet_block()
    events = []
    monkeypatch.setattr(G, "has_program_api", lambda: True)
    monkeypatch.setattr(SG, "_PROGRAMS", {})
    monkeypatch.setattr(G, "tune", lambda texts, flags, n, refine, arch=None, tf32=False: events.append(("tune", list(texts), n)) or (5, 2, "no GPU"))
    monkeypatch.setattr(G, "prefetch", lambda texts, flags, refine, arch=None, tf32=False: events.append(("prefetch",)) or 0)
    monkeypatch.setattr(SG, "_program_for", lambda graph, flags, device, refine, arch=None, tf32=False: events.append(("create",)) or _Created(graph.text()))
    with caplog.at_level(logging.WARNING, logger="evt"):
        plan = PL.build_plan(gm, {"tune": 3})
    segs = [s for s in _segments(plan) if s.path == "gpu"]
    kinds = [e[0] for e in events]
    assert kinds[:2] == ["tune", "prefetch"] and kinds.count("tune") == 1 and kinds.count("create") == len(segs), kinds
    assert sorted(events[0][1]) == sorted(s.graph.text() for s in segs) and events[0][2] == 3
    assert any("not all tuned: no GPU" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records), \
        caplog.text


@needs_lib
def test_default_tuning_failure_is_not_a_warning(monkeypatch, caplog):
    """Without options["tune"] the backend tunes at TUNE_BY_DEFAULT on a GPU; when that cannot run
    (no nvcc or CUTLASS, say) the programs are created untuned and the reason is logged at INFO, not as a
    warning the user did not ask for."""
    gm = _cuda_resnet_block()
    events = []
    monkeypatch.setattr(G, "has_program_api", lambda: True)
    monkeypatch.setattr(SG, "_PROGRAMS", {})
    monkeypatch.setattr(G.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(G, "tune", lambda texts, flags, n, refine, arch=None, tf32=False: events.append(("tune", n)) or (5, 2, "no nvcc"))
    monkeypatch.setattr(G, "prefetch", lambda texts, flags, refine, arch=None, tf32=False: 0)
    monkeypatch.setattr(SG, "_program_for", lambda graph, flags, device, refine, arch=None, tf32=False: _Created(graph.text()))
    with caplog.at_level(logging.INFO, logger="evt"):
        PL.build_plan(gm)
    assert events == [("tune", G.TUNE_BY_DEFAULT)], events
    msgs = [r for r in caplog.records if "not all tuned: no nvcc" in r.getMessage()]
    assert msgs and all(r.levelno == logging.INFO for r in msgs), caplog.text


def _training_step_batches(monkeypatch, caplog, fail_early=False):
    """One MLP training step through backend="evt" on the GPU glue path (the interpreter standing in for the
    device) with gpu.tune / gpu.prefetch recorded: ((kind, texts) of the forward's compile, of the backward's),
    (texts of the programs the forward created, of those the backward created). Asserts the step's loss and
    gradients agree with eager. fail_early: the forward's computation of its backward's texts raises."""
    import copy
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import test_torch_backend as T
    _glue_setup(monkeypatch)
    calls, created = [], []

    def program_for(graph, flags, device, refine, arch=None, tf32=False):
        created.append(graph.text())
        return InterpProgram(graph.text(), flags)
    monkeypatch.setattr(SG, "_program_for", program_for)
    monkeypatch.setattr(G, "tune", lambda texts, flags, n, refine, arch=None, tf32=False:
                        calls.append(("tune", list(texts))) or (0, 0, ""))
    monkeypatch.setattr(G, "prefetch", lambda texts, flags, refine, arch=None, tf32=False:
                        calls.append(("prefetch", list(texts))) or 0)
    if fail_early:
        real = PL.EarlyBackward.texts

        def texts(self):
            self.gm = None  # (Plan(None, ...) raises AttributeError inside texts())
            return real(self)
        monkeypatch.setattr(PL.EarlyBackward, "texts", texts)
    torch._dynamo.reset()
    torch.manual_seed(0)
    ref = T.MLP()
    f = torch.compile(copy.deepcopy(ref), backend="evt", fullgraph=True, options={"tune": 2})
    x, y = torch.randn(4, 8), torch.randint(0, 4, (4,))
    with caplog.at_level(logging.DEBUG, logger="evt"):
        loss = f(x, y)
        n_calls, n_created = len(calls), len(created)
        loss.backward()
    loss_ref = ref(x, y)
    loss_ref.backward()
    assert T.rel_err(loss.detach(), loss_ref.detach()) <= 1e-4
    for (n, p_ref), p in zip(ref.named_parameters(), f.parameters()):
        assert T.rel_err(p.grad, p_ref.grad) <= 1e-4, n
    return (calls[:n_calls], calls[n_calls:]), (created[:n_created], created[n_created:])


@needs_lib
def test_forward_tunes_and_prefetches_its_backward_kernels_in_one_batch(monkeypatch, caplog):
    """The forward's compile tunes and JIT-compiles its backward's GPU kernels with its own, in one gpu.tune and
    one gpu.prefetch batch (one nvcc wave, not a second one at the first backward call): the batch holds every
    text the backward's own compile then passes or creates a program of (on a GPU: cache hits)."""
    (fw_calls, bw_calls), (fw_made, bw_made) = _training_step_batches(monkeypatch, caplog)
    assert [c[0] for c in fw_calls] == ["tune", "prefetch"], fw_calls
    batch = fw_calls[1][1]
    assert fw_calls[0][1] == batch and set(fw_made) < set(batch), (fw_made, batch)
    assert bw_made and set(bw_made) <= set(batch) and not set(bw_made) & set(fw_made)
    assert bw_calls and all(set(texts) <= set(batch) for _, texts in bw_calls), bw_calls
    n_bw = len(set(batch) - set(fw_made))
    assert any(r.getMessage().startswith("  prefetch: 0 kernels for %d forward + %d backward GPU segments in "
                                         % (len(fw_made), n_bw)) for r in caplog.records), caplog.text
    parsed = [r.getMessage() for r in caplog.records if r.getMessage().startswith("  segment evt-")]
    assert len(parsed) == len(set(parsed)) == len(set(batch)), parsed  # (each text parsed and logged once)


@needs_lib
def test_forward_compiles_alone_when_its_backward_texts_fail(monkeypatch, caplog):
    """An error while the forward computes its backward's texts is logged at debug level; the forward's batch
    then holds its own texts only, and the backward tunes and prefetches its own at its compile."""
    (fw_calls, bw_calls), (fw_made, bw_made) = _training_step_batches(monkeypatch, caplog, fail_early=True)
    assert fw_calls == [("tune", fw_made)], fw_calls  # (one text: no prefetch, its program compiles it)
    assert bw_made and bw_calls == [("tune", bw_made)], bw_calls
    assert any(r.levelno == logging.DEBUG and "left to its own compile (AttributeError" in r.getMessage()
               for r in caplog.records), caplog.text


# ---- cudagraphs "step": the wiring around PyTorch's CUDA-graph trees, with a stand-in for the trees ---------

def _fake_trees(monkeypatch, fail=False, events=None):
    """Replaces the trees' cudagraphify_impl by a recorder that calls the model as the trees do (a list the model
    must consume) and makes PyTorch's device checks pass for CPU graphs; returns the record. events: a list the
    stand-in appends "call" / "end" to around each call of a model."""
    import torch._dynamo.backends.cudagraphs as cgb
    import torch._inductor.cudagraph_trees as trees
    import torch._inductor.cudagraph_utils as cgu
    rec = []

    def cudagraphify_impl(model, inputs, static, **kw):
        entry = dict(static=list(static), kw=kw, calls=0)
        rec.append(entry)

        def replay(new_inputs):
            entry["calls"] += 1
            if fail:
                raise RuntimeError("capture failed (stand-in)")
            if events is not None:
                events.append("call")
            out = model(new_inputs)
            if events is not None:
                events.append("end")
            assert len(new_inputs) == 0, "the model must consume its argument list"
            return out
        return replay
    monkeypatch.setattr(trees, "cudagraphify_impl", cudagraphify_impl)
    monkeypatch.setattr(cgu, "check_multiple_devices_or_any_cpu_nodes", lambda mapping: None)
    monkeypatch.setattr(cgb, "get_device_index", lambda gm: 0)
    return rec


@needs_lib
@pytest.mark.parametrize("fail", [False, True])
def test_step_graphs_wiring(monkeypatch, caplog, fail):
    """options={"cudagraphs": True}: the forward and the backward modules are handed to the trees with the
    parameters as static inputs (Dynamo's static_input_indices) and the saved tensors as the backward's; the
    model the trees call consumes its argument list; a capture that raises runs the plan directly from then on
    (logged), and the training step still matches eager."""
    rec = _fake_trees(monkeypatch, fail)
    torch._dynamo.reset()
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    ref = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    ref.load_state_dict(m.state_dict())
    f = torch.compile(m, backend="evt", options={"cudagraphs": True})
    with caplog.at_level(logging.INFO, logger="evt"):
        for _ in range(3):
            x = torch.randn(5, 8)
            m.zero_grad(set_to_none=True)
            ref.zero_grad(set_to_none=True)
            f(x).square().sum().backward()
            ref(x).square().sum().backward()
            for p, q in zip(m.parameters(), ref.parameters()):
                assert torch.allclose(p.grad, q.grad, rtol=1e-5, atol=1e-6)
    msgs = [r.getMessage() for r in caplog.records]
    assert len(rec) == 2, rec  # forward and backward
    fw, bw = rec
    assert len(fw["static"]) == 4 and not fw["kw"]["is_backward"] and bw["kw"]["is_backward"], rec
    assert all(e["calls"] == (1 if fail else 3) for e in rec), rec
    assert any("replayed as one CUDA graph" in s for s in msgs), msgs
    assert fail == any("the step CUDA graph failed" in s for s in msgs), msgs
    torch._dynamo.reset()


@needs_lib
def test_step_graphs_draw_dropout_masks_from_torch_manual_seed(monkeypatch):
    """cudagraphs "step" with dropout run by evt: the step wrapper draws every dropout segment's RNG step before
    each call of the trees (a replay runs no Python), once per call, from PyTorch's generator, so the masks are
    fresh every step, torch.manual_seed repeats them, and they are the masks the per-segment mode draws from the
    same seed."""
    from test_torch_backend import DropMLP
    events = []
    _fake_trees(monkeypatch, events=events)
    real = SG.Segment._draw_rng_step
    monkeypatch.setattr(SG.Segment, "_draw_rng_step", lambda self: events.append("draw") or real(self))

    def masks(options, seed, steps=3):
        torch._dynamo.reset()
        torch.manual_seed(0)
        m = DropMLP(0.5)
        f = torch.compile(m, backend="evt", fullgraph=True, options=options)
        x, y = torch.randn(24, 16), torch.randint(0, 4, (24,))
        torch.manual_seed(seed)
        out = []
        for _ in range(steps):
            loss, h = f(x, y)
            loss.backward()
            out.append(h.detach() != 0)
        return out

    a = masks({"cudagraphs": True}, 7)
    # one dropout segment: one draw per step, before the forward's call of the trees (whose replays run no
    # Python), none inside a call and none for the backward
    assert events == ["draw", "call", "end", "call", "end"] * 3, events
    b = masks({"cudagraphs": True}, 7)
    c = masks(None, 7)
    d = masks({"cudagraphs": True}, 8)
    assert all(torch.equal(u, v) for u, v in zip(a, b)), "torch.manual_seed did not repeat the step graph's masks"
    assert all(torch.equal(u, v) for u, v in zip(a, c)), "the step graph drew other masks than the plain mode"
    assert not torch.equal(a[0], a[1]) and not torch.equal(a[1], a[2]), "a mask repeated across steps"
    assert not torch.equal(a[0], d[0]), "another seed drew the same mask"
    torch._dynamo.reset()


def test_draw_rng_steps_sets_each_shared_program_once(monkeypatch):
    """Plan.draw_rng_steps (cudagraphs "step"): GPU segments that share one program (the same text, e.g. every
    layer of a transformer) get one draw and one set per call, in plan order, from PyTorch's generator (so
    torch.manual_seed repeats them); segments without dropout or running in PyTorch get none; afterwards the
    segments leave the drawing to the plan's caller. A plain call of the plan draws the same steps (at each
    program's first run), so the default mode and the whole-step graph draw the same masks."""
    class Prog:
        def __init__(self):
            self.steps = []

        def set_rng_step(self, step, stream):
            self.steps.append(step)

    def seg(program, sites=1, path="gpu"):
        s = SG.Segment.__new__(SG.Segment)
        s.b, s.path, s.program, s.device = types.SimpleNamespace(rng_sites=sites), path, program, 0
        return s

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: types.SimpleNamespace(cuda_stream=0))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    a, b, c, d = Prog(), Prog(), Prog(), Prog()
    plan = PL.Plan.__new__(PL.Plan)
    plan.steps, plan.rng_by_caller = [seg(a), seg(b), seg(a), seg(c, sites=0), seg(d, path="torch"), seg(b)], False

    def draws(seed):
        for q in (a, b, c, d):
            q.steps.clear()
        torch.manual_seed(seed)
        plan.draw_rng_steps()
        plan.draw_rng_steps()
        return [list(q.steps) for q in (a, b, c, d)]

    first = draws(5)
    assert [len(x) for x in first] == [2, 2, 0, 0], first  # a and b once per call, c (no dropout) and d never
    assert len({*first[0], *first[1]}) == 4, first  # four different steps
    assert draws(5) == first and draws(6) != first
    assert plan.rng_by_caller

    # a plain call of the plan (no caller drawing) draws at each program's first run: the same steps
    class Seg(SG.Segment):
        def run(self, env, draw_rng=True):
            if draw_rng and self.b.rng_sites and self.path in ("interp", "gpu"):
                self._draw_rng_step()

    for x in plan.steps:
        x.__class__ = Seg
    plan.rng_by_caller, plan.placeholders, plan._foreach_casts, plan.check = False, [], set(), False
    plan.constants = []
    plan.free_after, plan.output = [[] for _ in plan.steps], types.SimpleNamespace(args=([],))
    for q in (a, b, c, d):
        q.steps.clear()
    torch.manual_seed(5)
    plan([])
    plan([])
    assert [list(q.steps) for q in (a, b, c, d)] == first


@needs_lib
def test_padded_gemms_train_like_eager(monkeypatch, caplog):
    """End to end under the simulated CUDA rules (CPU tensors): a vocabulary head whose 16-bit GEMMs have an
    unaligned N (4001 words) runs in PyTorch on padded operands (forward logits, and in the backward the input
    and weight gradients), and the loss and gradients match eager."""
    monkeypatch.setattr(C, "SIMULATE_CUDA_RULES", True)
    monkeypatch.setattr(R, "pad_vocab", lambda gm, options=None: 0)  # (it would take the head whole: test_pad_vocab_...)
    monkeypatch.setattr(P, "UNALIGNED_MIN_NUMEL", 1 << 16)
    msgs = _train_vocab_head_like_eager(caplog)
    padded = [m_ for m_ in msgs if "zero-padded" in m_]
    assert len(padded) >= 2, padded  # the logits GEMM and at least one gradient GEMM
    # the logits gradient's bf16 cast is written padded: both gradient GEMMs read that memory
    assert any("written into memory padded" in m_ for m_ in msgs)


def test_cast_into_padded_feeds_padded_gemms_without_copies():
    """cast_into_padded writes [M, N] into [M, N rounded up to 8] memory with zero margins; _pad2d then hands the
    padded GEMM that memory (as it is, or transposed) instead of a padded copy; the GEMMs equal PyTorch's."""
    aten = torch.ops.aten
    g = torch.Generator().manual_seed(0)
    x32, w, h = (torch.randn(24, 4001, generator=g), torch.randn(4001, 16, generator=g).bfloat16(),
                 torch.randn(24, 16, generator=g).bfloat16())
    x = TS.cast_into_padded([x32], {"dtype": torch.bfloat16})
    assert x.shape == (24, 4001) and x.stride() == (4008, 1) and torch.equal(x, x32.bfloat16())
    pa = TS._pad2d(x, 24, 4008)
    assert pa.data_ptr() == x.data_ptr() and torch.equal(pa[:, 4001:], torch.zeros(24, 7, dtype=torch.bfloat16))
    pt = TS._pad2d(x.t(), 4008, 24)  # (the weight gradient's grad^T)
    assert pt.data_ptr() == x.data_ptr() and pt.shape == (4008, 24)
    ref = (x32.bfloat16().double() @ w.double())
    got = TS.padded_gemm(aten.mm.default, [x, w], {})
    assert ((got.double() - ref).abs().max() / ref.abs().max()) < 1e-2
    got_t = TS.padded_gemm(aten.mm.default, [x.t(), h], {})
    ref_t = x32.bfloat16().double().t() @ h.double()
    assert got_t.shape == (4001, 16) and ((got_t.double() - ref_t).abs().max() / ref_t.abs().max()) < 1e-2
    # a slice of the data is not the padded buffer's corner (data, not zeros, lies beyond it): copied
    part = x[:, :100]
    pp = TS._pad2d(part, 24, 104)
    assert pp.data_ptr() != x.data_ptr() and torch.equal(pp[:, 100:], torch.zeros(24, 4, dtype=torch.bfloat16))
    rows = x[:5]
    pr = TS._pad2d(rows, 8, 4008)
    assert pr.data_ptr() != x.data_ptr() and torch.equal(pr[5:], torch.zeros(3, 4008, dtype=torch.bfloat16))
    # not a padded buffer: the ordinary copy
    y = x32.bfloat16()
    assert TS._pad2d(y, 24, 4008).data_ptr() != y.data_ptr()
    assert TS.cast_into_padded([x32.view(24, 4001, 1)], {"dtype": torch.bfloat16}) is None


def test_joint_cse_merges_duplicate_casts(monkeypatch):
    """joint_cse: autocast's three casts of one activation (one per convolution in XML-CNN) become one node,
    the graph computes the same."""
    from torch.fx.experimental.proxy_tensor import make_fx
    aten = torch.ops.aten

    def f(x, w1, w2, w3):
        xt = aten.permute(x, [0, 2, 1])
        outs = [aten.mm(aten._to_copy(xt, dtype=torch.bfloat16)[0], w) for w in (w1, w2, w3)]
        return [outs[0] + outs[1] + outs[2]]
    g = torch.Generator().manual_seed(0)
    args = [torch.randn(2, 8, 4, generator=g)] + [torch.randn(8, 3, generator=g).bfloat16() for _ in range(3)]
    ref = f(*args)[0]
    casts = lambda gm: sum(n.target == aten._to_copy.default for n in gm.graph.nodes)  # noqa: E731
    gm = make_fx(f)(*args)
    assert casts(gm) == 3
    assert R.joint_cse(gm) >= 2 and casts(gm) == 1
    assert torch.equal(gm(*args)[0], ref)


@needs_lib
def test_values_a_segment_only_passes_on_are_not_its_inputs(monkeypatch):
    """An alias of a value PyTorch made (AOT saves the cuDNN attention output for the backward as one) is made
    by PyTorch as a view (Segment.torch_views), so the segment does not declare the aliased value as an input
    that every run binds (and copies, when it is strided): its text keeps only statements something reads
    (_used_input_lines); the plan still returns the alias."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    aten = torch.ops.aten
    monkeypatch.setattr(G, "has_program_api", lambda: True)
    monkeypatch.setattr(SG, "_program_for", lambda graph, flags, device, refine, arch=None, tf32=False: _Created(graph.text()))

    def f(x, b, w):
        a = aten.cumsum(x, 0)  # (no translation: PyTorch makes it, as it makes the attention output)
        return [torch.relu(aten.mm(b, w)), aten.alias(a)]
    args = [torch.randn(4, 8, 16).bfloat16(), torch.randn(16, 32).bfloat16(), torch.randn(32, 8).bfloat16()]
    gm = make_fx(f)(*args)
    mode = FakeTensorMode()
    with mode:
        fakes = [torch.empty(4, 16, 8, device="cuda", dtype=torch.bfloat16).transpose(1, 2),
                 torch.empty(16, 32, device="cuda", dtype=torch.bfloat16),
                 torch.empty(32, 8, device="cuda", dtype=torch.bfloat16)]
    FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*fakes)
    plan = PL.build_plan(gm)
    (seg,) = _segments(plan)
    names = [n for _, n in seg.input_names]
    assert names == ["in.b_1", "in.w_1"], (names, seg.text)  # (make_fx names the placeholders x_1, b_1, w_1)
    assert "in.cumsum" not in seg.text and [(m.name, x.name) for m, x in seg.aliases] == [("alias", "cumsum")]
    # (the raw helper: an unread input goes, and so does a dead statement that alone read another input)
    lines = ["%in.x: f32[2] = input()", "%in.y: f32[2] = input()", "%dead: f32[2] = neg(%in.y)",
             "%r: f32[2] = relu(%in.x)"]
    assert SG._used_input_lines(lines, ["r"]) == [lines[0], lines[3]]


@needs_lib
def test_deferred_pytorch_steps_keep_their_order(monkeypatch):
    """Plan._torch_step: a PyTorch op that reads the segment being built runs after it (deferred) and the
    segment goes on; a later PyTorch op that reads nothing of the segment is deferred too (not hoisted before
    the segment), so PyTorch's steps run in graph order (random ops draw in eager's order)."""
    aten = torch.ops.aten
    monkeypatch.setattr(G, "has_program_api", lambda: True)
    monkeypatch.setattr(SG, "_program_for", lambda graph, flags, device, refine, arch=None, tf32=False: _Created(graph.text()))

    def f(a, b, w, w2):
        s = torch.relu(aten.mm(a, w))        # evt
        x = aten.cumsum(s, 0)                # PyTorch (no translation), reads the segment: deferred
        y = aten.cumsum(b, 0)                # PyTorch, reads nothing of it: deferred after x
        z = torch.relu(aten.mm(s, w2))       # evt, reads the segment: the same segment
        return [x, y, z]
    shapes = [(16, 32), (16, 32), (32, 32), (32, 32)]
    gm = _cuda_fx(f, shapes)
    plan = PL.build_plan(gm, None)
    names = [s.name if not isinstance(s, SG.Segment) else "SEG" for s in plan.steps]
    assert names == ["SEG", "cumsum", "cumsum_1"], names
    (seg,) = _segments(plan)
    assert seg.text.count("mm(") == 2


@needs_lib
def test_evt_nodes_reading_a_deferred_step_are_deferred(monkeypatch):
    """Plan._place: an evt node that reads a deferred PyTorch step is deferred too (it starts a segment after
    that step) and the segment being built goes on with the nodes that do not: XML-CNN's bias-gradient cast
    read the deferred long-row sum and ended the segment between the weight-gradient GEMM and its transposed
    cast (the transposed GEMM result was then copied into the next segment every step). A node reading the
    deferred evt node is deferred behind it."""
    aten = torch.ops.aten
    monkeypatch.setattr(G, "has_program_api", lambda: True)
    monkeypatch.setattr(SG, "_program_for", lambda graph, flags, device, refine, arch=None, tf32=False: _Created(graph.text()))

    def f(a, b, w, w2):
        s = aten.mm(a, w)                    # evt
        x = aten.cumsum(s, 0)                # PyTorch, reads the segment: deferred
        y = torch.relu(x)                    # evt, reads the deferred step: deferred (a segment after it)
        y2 = torch.sigmoid(y)                # evt, reads the deferred y: deferred, same segment as y
        z = aten.t(s).to(torch.bfloat16)     # evt: the segment goes on (the transposed cast of the GEMM)
        u = torch.relu(aten.mm(b, w2))       # evt, reads nothing of the segment: stays in it (not a permute)
        wt = aten.t(w2)                      # a permute reading nothing of it: goes with its reader, y3
        y3 = aten.mm(y2, wt)                 # evt, reads the deferred y2: the second segment
        return [y3, z, u]
    shapes = [(16, 32), (16, 32), (32, 32), (32, 32)]
    gm = _cuda_fx(f, shapes)
    plan = PL.build_plan(gm, None)
    names = [s.name if not isinstance(s, SG.Segment) else "SEG" for s in plan.steps]
    assert names == ["SEG", "cumsum", "SEG"], names
    first, second = _segments(plan)
    assert first.text.count("mm(") == 2 and "sigmoid(" not in first.text, first.text
    assert "cast(" in first.text and "permute(%in.w2" not in first.text, first.text  # (z stays, wt does not)
    assert "sigmoid(" in second.text and "relu(%in.cumsum" in second.text.replace(" ", ""), second.text
    assert second.text.count("mm(") == 1 and "in.mm:" not in second.text and "in.t:" not in second.text, second.text


def test_padded_gemms_share_one_padded_copy():
    """_pad2d: the input- and the weight-gradient GEMMs of one unaligned logits gradient (g and its transpose)
    pad it once per plan run (the copy is reused while g lives); both GEMMs equal PyTorch's; a new tensor at
    the same address after the first died is padded anew."""
    aten = torch.ops.aten
    g = torch.Generator().manual_seed(0)
    x = torch.randn(24, 4001, generator=g).bfloat16()
    w, h = torch.randn(4001, 16, generator=g).bfloat16(), torch.randn(24, 16, generator=g).bfloat16()
    TS._PAD_CACHE.clear()
    got = TS.padded_gemm(aten.mm.default, [x, w], {})
    assert len(TS._PAD_CACHE) == 2  # (x along K, w along its rows)
    (ref_pad,) = [v[1] for k, v in TS._PAD_CACHE.items() if k[0] == x.data_ptr()]
    got_t = TS.padded_gemm(aten.mm.default, [x.t(), h], {})
    assert len(TS._PAD_CACHE) == 2  # (x^T reused x's copy)
    assert [v[1] for k, v in TS._PAD_CACHE.items() if k[0] == x.data_ptr()][0] is ref_pad
    for a, b, r in ((x, w, got), (x.t(), h, got_t)):
        ref = a.double() @ b.double()
        assert ((r.double() - ref).abs().max() / ref.abs().max()) < 1e-2
    del x, ref_pad, got, got_t, a, r
    import gc
    gc.collect()
    assert len(TS._PAD_CACHE) == 1  # (x's copy went with x; w's stays while w lives)


def test_upcast_into_log_softmax():
    """A PyTorch-run CUDA log-softmax over the f32 upcast of bf16 logits (unaligned rows) reads the bf16 logits
    with half_to_float (the upcast's copy goes); an aligned one (evt runs it), one whose upcast has another
    reader are left as they are."""
    aten = torch.ops.aten

    def f(x):
        return [aten._log_softmax(x.float(), 1, False)]

    def g(x):
        xf = x.float()
        return [aten._log_softmax(xf, 1, False), xf.sum()]

    def graph_for(fn, v):
        return _cuda_fx(fn, [(64, v)], torch.bfloat16)
    gm = graph_for(f, 30522 * 17)
    assert R.upcast_into_log_softmax(gm) == 1
    (ls,) = [n for n in gm.graph.nodes if n.target == aten._log_softmax.default]
    assert ls.args[2] is True and ls.args[0].op == "placeholder", ls.args
    assert not [n for n in gm.graph.nodes if n.target == aten._to_copy.default]
    assert R.upcast_into_log_softmax(graph_for(f, 1024 * 17)) == 0   # (aligned rows: evt's)
    assert R.upcast_into_log_softmax(graph_for(g, 30522 * 17)) == 0  # (the upcast has another reader)


@needs_lib
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_pad_vocab_trains_like_eager(monkeypatch, caplog, smoothing):
    """pad_vocab (simulated CUDA rules, CPU tensors): a 4001-word head (bf16 logits GEMM, f32 log-softmax and
    NLL loss) is computed on 4008 words in the joint graph (zero weight rows, lowest-value bias), so its
    GEMMs, log-softmax and loss backward run in evt segments (no GEMM left to PyTorch); the loss and every
    gradient match eager, the weight and bias gradients have the unpadded shapes. Label smoothing (a sum over
    the vocabulary the rewrite does not know) leaves the head as it is, still matching."""
    monkeypatch.setattr(C, "SIMULATE_CUDA_RULES", True)
    monkeypatch.setattr(P, "UNALIGNED_MIN_NUMEL", 1 << 16)
    msgs = _train_vocab_head_like_eager(caplog, smoothing=smoothing, ignore_row=3)
    padded = any("vocabulary head(s) padded" in m_ for m_ in msgs)
    assert padded == (smoothing == 0.0), msgs
    if padded:
        fell = [m_ for m_ in msgs if "fallback to PyTorch" in m_ and ("mm" in m_ or "softmax" in m_ or "nll" in m_)]
        assert not fell, fell
        pads = [m_ for m_ in msgs if "fallback to PyTorch: constant_pad_nd" in m_]
        assert len(pads) == 2 and all("padded to 4008 words" in m_ for m_ in pads), pads


@needs_lib
@pytest.mark.parametrize("bias", [True, False])
def test_pad_vocab_tied_embedding_trains_like_eager(monkeypatch, caplog, bias):
    """pad_vocab (simulated CUDA rules) on a head whose weight is the word embedding's (Hugging Face BERT's MLM
    head with a bias, GPT-2's without one): the weight's gradient adds the embedding's [V, H] gradient to the
    head's, so the head's padded gradient is sliced back to V before that add; a head without a bias gets a zero
    one (its padded words need the lowest logit). The head is padded, and training matches eager."""
    monkeypatch.setattr(C, "SIMULATE_CUDA_RULES", True)
    monkeypatch.setattr(P, "UNALIGNED_MIN_NUMEL", 1 << 16)
    torch._dynamo.reset()
    torch.manual_seed(0)

    class TiedHead(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.proj = nn.Embedding(4001, 64), nn.Linear(64, 64)
            self.out = nn.Linear(64, 4001, bias=bias)
            self.out.weight = self.emb.weight

        def forward(self, ids, t):
            return F.cross_entropy(self.out(torch.relu(self.proj(self.emb(ids)))).float(), t)
    ids, t = torch.randint(0, 4001, (32,)), torch.randint(0, 4001, (32,))
    with caplog.at_level(logging.INFO, logger="evt"):
        _step_like_eager(TiedHead(), ids, t)
    msgs = [r.getMessage() for r in caplog.records]
    assert any("vocabulary head(s) padded" in m_ for m_ in msgs), msgs


def _train_vocab_head_like_eager(caplog, smoothing=0.0, ignore_row=None):
    """One bf16-autocast step of a 4001-word classifier head (Linear, ReLU, Linear, cross-entropy) through
    backend="evt" and in eager from the same weights: asserts the loss (finite) and every gradient (shape and
    value) match; returns the evt log messages."""
    torch._dynamo.reset()
    torch.manual_seed(0)

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj, self.out = nn.Linear(64, 64), nn.Linear(64, 4001)

        def forward(self, x, t):
            return F.cross_entropy(self.out(torch.relu(self.proj(x))).float(), t, label_smoothing=smoothing)
    m = Head()
    x, t = torch.randn(32, 64), torch.randint(0, 4001, (32,))
    if ignore_row is not None:
        t[ignore_row] = -100  # (an ignored target)
    with caplog.at_level(logging.INFO, logger="evt"):
        _step_like_eager(m, x, t)
    return [r.getMessage() for r in caplog.records]


def test_conv_inputs_returned_contiguous(monkeypatch):
    """mark_conv_inputs: XML-CNN's transposed embedding, read only by the convolutions and their backward in the
    joint graph, is marked so its forward segment returns it contiguous (it is in the segments' free_layout);
    training matches eager (simulated CUDA rules)."""
    plans = []
    orig = PL.Plan.finalize
    monkeypatch.setattr(PL.Plan, "finalize", lambda self: (plans.append(self), orig(self))[1])
    _train_xmlcnn_like_eager(monkeypatch)
    fwd = [p for p in plans if p.kind == "forward"]
    marked = [n for p in fwd for n in p.gm.graph.nodes if n.meta.get("evt_conv_input_free")]
    assert len(marked) == 1, marked
    segs = [s for p in fwd for s in p.steps if isinstance(s, SG.Segment)]
    assert all(n in s.free_layout for n in marked for s in segs)
    assert any(n in [m_ for m_, _ in s.outputs] for n in marked for s in segs)


class _ConvBlock(torch.nn.Module):
    """A ResNet-like block: 1x1 conv -> BN -> ReLU -> 3x3 conv (the ReLU output is read by convolutions only)
    -> BN -> ReLU, then a max over space and a linear classifier (a max, not a mean: the mean's backward would
    put an expand into the ReLU backward's segment)."""

    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(8, 16, 1, bias=False)
        self.b1 = torch.nn.BatchNorm2d(16)
        self.c2 = torch.nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.b2 = torch.nn.BatchNorm2d(16)
        self.fc = torch.nn.Linear(16, 10)

    def forward(self, x, t):
        y = torch.relu(self.b2(self.c2(torch.relu(self.b1(self.c1(x))))))
        return torch.nn.functional.cross_entropy(self.fc(y.amax((2, 3))).float(), t)


def test_conv_inputs_of_channels_last_convolutions_keep_their_layout(monkeypatch):
    """mark_conv_inputs leaves alone a value that only convolutions read when their weight is channels-last (a
    model in torch.channels_last, like ResNet: cuDNN runs it NHWC, and a contiguous input would be copied back to
    channels-last in every call); the same net in the default format has no channels-last value to mark.
    Training matches eager either way (simulated CUDA rules)."""
    plans = []
    orig = PL.Plan.finalize
    monkeypatch.setattr(PL.Plan, "finalize", lambda self: (plans.append(self), orig(self))[1])
    monkeypatch.setattr(C, "SIMULATE_CUDA_RULES", True)

    for fmt in (torch.channels_last, torch.contiguous_format):
        plans.clear()
        torch._dynamo.reset()
        torch.manual_seed(0)
        m = _ConvBlock().to(memory_format=fmt)
        x = torch.randn(4, 8, 12, 12).to(memory_format=fmt)
        _step_like_eager(m, x, torch.randint(0, 10, (4,)))
        marked = [n for p in plans for n in p.gm.graph.nodes if n.meta.get("evt_conv_input_free")]
        convs = [n for p in plans for n in p.gm.graph.nodes if n.target == torch.ops.aten.convolution.default]
        assert len(convs) == 2, convs
        # channels-last: the relu output is channels-last, and its convolution's weight too -> not marked
        if fmt is torch.channels_last:
            relu_in = convs[1].args[0].meta["val"]
            assert relu_in.is_contiguous(memory_format=torch.channels_last) and not relu_in.is_contiguous()
            assert convs[1].args[1].meta["val"].is_contiguous(memory_format=torch.channels_last)
        assert marked == [], marked


def test_channels_last_weight_gradients_keep_the_physical_layout(monkeypatch):
    """A channels-last model's 3x3 weight gradient (cast to f32 for the parameter) is a backward output in its
    recorded channels-last strides, written by evt in memory order (Segment._physical) like the ReLU backward in
    the same segment: no segment with channels-last values falls back to row-major (which copied its activations
    to contiguous and back), the gradient has the parameter's strides, and training matches eager (simulated
    CUDA rules)."""
    plans = []
    orig = PL.Plan.finalize
    monkeypatch.setattr(PL.Plan, "finalize", lambda self: (plans.append(self), orig(self))[1])
    monkeypatch.setattr(C, "SIMULATE_CUDA_RULES", True)

    torch._dynamo.reset()
    torch.manual_seed(0)
    m = _ConvBlock().to(memory_format=torch.channels_last)
    x = torch.randn(4, 8, 12, 12).to(memory_format=torch.channels_last)
    _step_like_eager(m, x, torch.randint(0, 10, (4,)))
    assert m.c2.weight.grad.stride() == m.c2.weight.stride()
    bwd = [p for p in plans if p.kind == "backward"]
    segs = [s for p in bwd for s in p.steps if isinstance(s, SG.Segment) and s.path != "none"]
    # the segment that casts c2's weight gradient [16, 16, 3, 3] to f32 writes it, and the ReLU backward beside
    # it, in memory order
    wseg = [(s, k) for s in segs for m_, k in s.out_index if tuple(A.meta_val(m_).shape) == (16, 16, 3, 3)]
    assert len(wseg) == 1, [s.text for s in segs]
    s, k = wseg[0]
    assert k in s.phys_out and len(s.phys_out) == len({k_ for _, k_ in s.out_index}), s.text
    assert not s.torch_views and "permute(" not in s.graph.text(), s.graph.text()


def _train_xmlcnn_like_eager(monkeypatch):
    """One bf16-autocast step of a small XML-CNN (bench/e2e/models.py) through backend="evt" under the simulated
    CUDA rules, and in eager from the same weights: asserts the loss and every gradient match."""
    M = load("bench/e2e/models.py", "e2e_models")
    monkeypatch.setattr(C, "SIMULATE_CUDA_RULES", True)
    torch._dynamo.reset()
    torch.manual_seed(0)
    _step_like_eager(M.XMLCNN(vocab=1000, labels=512, p=0.0), torch.randint(0, 1000, (16, 64)),
                     (torch.rand(16, 512) < 0.01).float())


def _step_like_eager(m, *args, tol=2e-2):
    """One bf16-autocast training step of m through backend="evt" and of a copy of m in eager from the same
    weights: the loss (finite, within 1e-2) and every parameter gradient (shape, and max error relative to
    eager's largest within tol) match."""
    import copy
    ref = copy.deepcopy(m)
    f = torch.compile(m, backend="evt")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = f(*args)
    loss.backward()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss_ref = ref(*args)
    loss_ref.backward()
    assert torch.isfinite(loss) and abs(loss.item() - loss_ref.item()) <= 1e-2 * abs(loss_ref.item())
    for (n, p), (_, q) in zip(m.named_parameters(), ref.named_parameters()):
        assert p.grad.shape == q.grad.shape, n
        rel = ((p.grad.float() - q.grad.float()).abs().max() / q.grad.float().abs().max()).item()
        assert rel <= tol, (n, rel)
    torch._dynamo.reset()



def test_vit_token_moves_run_in_pytorch(monkeypatch):
    """unfusable_move / TORCH_CAST (simulated CUDA rules): a small ViT (bench/e2e/models.py). Its token
    concatenation (class token + the f32 cast of the permuted patches), the zero-padded gradient of the class
    token's select and the patches' slice of the token gradient (with its bf16 cast for the convolution's
    backward) have no evt kernel: from UNALIGNED_MIN_NUMEL elements on they run in PyTorch, the casts with them,
    and no evt segment keeps a concat, slice or slice_backward of that size (in evt each would run node by node
    in the reference library, in double). Below the size nothing moves; training matches eager either way."""
    M = load("bench/e2e/models.py", "e2e_models")
    monkeypatch.setattr(C, "SIMULATE_CUDA_RULES", True)
    plans = []
    orig = PL.Plan.finalize
    monkeypatch.setattr(PL.Plan, "finalize", lambda self: (plans.append(self), orig(self))[1])
    for min_numel, moved in ((1024, True), (1 << 20, False)):
        monkeypatch.setattr(P, "UNALIGNED_MIN_NUMEL", min_numel)
        plans.clear()
        torch._dynamo.reset()
        torch.manual_seed(0)
        m = M.ViT(patch=8, image=32, layers=1, dim=64, heads=2, ffn=128, classes=10)
        _step_like_eager(m, torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,)))
        why = {n.target: w for p in plans for n, w in p.fallbacks}
        casts = [w for p in plans for n, w in p.fallbacks if w is P.TORCH_CAST]
        in_evt = [n for p in plans for s in p.steps if isinstance(s, SG.Segment) for n in s.members
                  if n.target in P._UNFUSABLE_MOVES and n.meta["val"].numel() >= 1024]
        if moved:
            assert "concatenation of [4, 17, 64]" in why[torch.ops.aten.cat.default], why
            assert "select_backward of [4, 17, 64]" in why[torch.ops.aten.select_backward.default], why
            assert "slice of [4, 16, 64]" in why[torch.ops.aten.slice.Tensor], why
            assert len(casts) == 2, casts  # (the patches' f32 cast forward, their bf16 cast backward)
            assert in_evt == []
        else:
            assert torch.ops.aten.cat.default not in why and casts == [], why
            assert {n.target for n in in_evt} >= {torch.ops.aten.cat.default, torch.ops.aten.slice.Tensor}, in_evt


@needs_lib
def test_position_embedding_ops_evt_has_no_kernel_for_run_in_pytorch(monkeypatch):
    """CUDA: bert's embeddings. The token embedding and its backward run in PyTorch (evt's only CUDA
    implementation is the reference library), the position table's slice is a PyTorch view before the segment
    (contiguous_slice; evt has no visitor node for a slice), the [B, S, D] + [S, D] add and the sum over B of
    its gradient run in PyTorch (partial_broadcast: no visitor load or reduction takes them) from
    UNALIGNED_MIN_NUMEL elements on; the layer norm's arithmetic after them stays one evt segment. Small
    tensors and the CPU are unaffected."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    aten = torch.ops.aten
    monkeypatch.setattr(G, "has_program_api", lambda: True)
    monkeypatch.setattr(SG, "_program_for", lambda graph, flags, device, refine, arch=None, tf32=False: _Created(graph.text()))

    def f(w, ids, pos, dy):
        x = aten.add(aten.embedding(w, ids), aten.slice(pos, 0, 0, 16))
        y = aten.mul(aten.sub(x, aten.mean(x, [2], True)), 2.0)
        dpos = aten.sum(dy, [0], True)
        dw = aten.embedding_dense_backward(dy, ids, 100, -1, False)
        return [y, dpos, dw]

    def plan_for(device, min_numel):
        monkeypatch.setattr(P, "UNALIGNED_MIN_NUMEL", min_numel)
        args = [torch.randn(100, 32), torch.randint(0, 100, (4, 16)), torch.randn(64, 32), torch.randn(4, 16, 32)]
        gm = make_fx(f)(*args)
        mode = FakeTensorMode()
        with mode:
            fakes = [mode.from_tensor(a).to(device) for a in args]
        FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*fakes)
        return PL.build_plan(gm)

    plan = plan_for("cuda", 1024)
    why = {n.name: w for n, w in plan.fallbacks}
    assert "embedding and its backward is the reference library" in why["embedding"]
    assert "embedding and its backward is the reference library" in why["embedding_dense_backward"]
    assert "broadcast to [4, 16, 32] over some leading dims only" in why["add"], why
    assert "a sum over dims [0] of [4, 16, 32]" in why["sum_1"], why
    assert [n.name for n in plan.torch_permutes] == ["slice_1"]
    (seg,) = _segments(plan)
    assert [n.name for n in seg.members][:3] == ["mean", "sub", "mul"], seg.members
    assert seg.path != "torch"
    # below UNALIGNED_MIN_NUMEL: the add and the sum stay in evt (the embedding is placed by op, not size)
    why = {n.name: w for n, w in plan_for("cuda", 1 << 20).fallbacks}
    assert "add" not in why and "sum_1" not in why and "embedding" in why
    # CPU: nothing moves
    plan = plan_for("cpu", 1024)
    assert plan.fallbacks == [] and plan.torch_permutes == []
    # a sum over every dim (dims None) is no partial reduction
    gm = make_fx(lambda x: [aten.sum.dim_IntList(x, None)])(torch.randn(4, 16, 32))
    assert all(P.partial_broadcast(n) is None for n in gm.graph.nodes if n.op == "call_function")


def test_log_softmax_recomputed_in_the_backward(monkeypatch, caplog):
    """recompute_log_softmax (simulated CUDA rules): the padded 4008-word head's log-softmax over the f32 upcast of
    its bf16 logits is computed again in the backward from the bf16 logits, so no forward segment returns a
    [tokens, vocab] f32 value (the forward's loss is a row sum in the softmax kernel: loss_elim) and the
    backward's segment reads the bf16 logits; loss and gradients match eager."""
    monkeypatch.setattr(C, "SIMULATE_CUDA_RULES", True)
    monkeypatch.setattr(P, "UNALIGNED_MIN_NUMEL", 1 << 16)
    plans = []
    orig = PL.Plan.finalize
    monkeypatch.setattr(PL.Plan, "finalize", lambda self: (plans.append(self), orig(self))[1])
    msgs = _train_vocab_head_like_eager(caplog, ignore_row=3)
    assert any("recomputed in the backward" in m_ for m_ in msgs), msgs

    def big_f32(p, which):
        return [n for s in p.steps if isinstance(s, SG.Segment) for n, _ in getattr(s, which)
                if isinstance(n.meta.get("val"), torch.Tensor) and n.meta["val"].dtype == torch.float32
                and tuple(n.meta["val"].shape) == (32, 4008)]
    fwd = [p for p in plans if p.kind == "forward"]
    bwd = [p for p in plans if p.kind == "backward"]
    assert fwd and bwd
    assert not big_f32(fwd[0], "outputs")


def test_embedding_gradient_returned_contiguous(monkeypatch):
    """mark_embedding_grads (simulated CUDA rules): XML-CNN's embedding gradient (the convolutions' [N, C, W]
    input gradient permuted to [N, W, C]), read only by the embedding backward PyTorch runs, is an output
    evt writes contiguous (not a PyTorch view of the [N, C, W] result, which the embedding backward copied);
    training matches eager."""
    plans = []
    orig = PL.Plan.finalize
    monkeypatch.setattr(PL.Plan, "finalize", lambda self: (plans.append(self), orig(self))[1])
    _train_xmlcnn_like_eager(monkeypatch)
    bwd = [p for p in plans if p.kind == "backward"]
    marked = [n for p in bwd for n in p.gm.graph.nodes if n.meta.get("evt_conv_input_free")
              and all(u.target == torch.ops.aten.embedding_dense_backward.default for u in n.users)]
    assert len(marked) == 1 and not marked[0].meta["val"].is_contiguous()
    segs = [s for p in bwd for s in p.steps if isinstance(s, SG.Segment)]
    assert any(marked[0] in [m_ for m_, _ in s.outputs] for s in segs)
    assert not any(marked[0] in s.torch_views for s in segs)


def test_upcast_logits_recomputed_in_the_backward(monkeypatch):
    """recompute_upcasts (simulated CUDA rules): XML-CNN's f32 upcast of its bf16 logits, which the loss reads in
    the forward and the loss backward in the backward, is cast again in the backward from the bf16 logits: no
    forward segment returns a [batch, labels] f32 value, one returns the bf16 logits; training matches eager."""
    monkeypatch.setattr(P, "UNALIGNED_MIN_NUMEL", 1024)
    plans = []
    orig = PL.Plan.finalize
    monkeypatch.setattr(PL.Plan, "finalize", lambda self: (plans.append(self), orig(self))[1])
    _train_xmlcnn_like_eager(monkeypatch)

    def returned(dtype):
        return [n for p in plans if p.kind == "forward" for s in p.steps if isinstance(s, SG.Segment)
                for n, _ in getattr(s, "outputs", []) if tuple(n.meta["val"].shape) == (16, 512)
                and n.meta["val"].dtype == dtype and n.target != torch.ops.aten.relu.default]  # (the hidden: 512 too)
    assert not returned(torch.float32)
    assert returned(torch.bfloat16)


def test_large_permuted_input_declared_in_memory_order(monkeypatch):
    """Segment._physical_inputs (simulated CUDA rules): XML-CNN's forward segment keeps permutes (its
    convolution input is returned contiguous), so _physical does not apply; its large input, the [N, C, W] view
    of the [N, W, C] embedding PyTorch made, is still declared in memory order (`%in.x.phys`, permuted in the
    segment) instead of being copied row-major at every run; below UNALIGNED_MIN_NUMEL it is not; training
    matches eager either way."""
    plans = []
    orig = PL.Plan.finalize
    monkeypatch.setattr(PL.Plan, "finalize", lambda self: (plans.append(self), orig(self))[1])
    for min_numel, want in ((1 << 10, True), (1 << 30, False)):
        plans.clear()
        monkeypatch.setattr(P, "UNALIGNED_MIN_NUMEL", min_numel)
        _train_xmlcnn_like_eager(monkeypatch)
        segs = [s for p in plans if p.kind == "forward" for s in p.steps if isinstance(s, SG.Segment)]
        phys = [name for s in segs for name in getattr(s, "phys_in", {})]  # (a segment of views only has none)
        assert bool(phys) == want, (phys, [s.text for s in segs])


@needs_lib
def test_python_numbers_in_16bit_arithmetic_are_f32():
    """x op number on a bf16 tensor: add, sub, mul and div take the number as an f32 scalar (PyTorch's CUDA
    opmath; the result as float math rounded once), a comparison its bf16 rounding (0.1 -> 0.10009765625, as
    PyTorch's comparison functors), on the interpreter."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    def f(x):
        return [x * 0.1, x + 0.1, x - 0.1, 0.1 - x, x / 3.0, x > 0.1]
    x = (torch.randn(64, 64, generator=torch.Generator().manual_seed(2)) * 0.2).bfloat16()
    x[0, :4] = torch.tensor([0.1, -0.1, 0.2, 3.0]).bfloat16()  # (x > 0.1 with x = bf16(0.1): false)
    gm = make_fx(f)(x)
    FakeTensorProp(gm).propagate(x)
    plan = PL.build_plan(gm)
    assert plan.fallbacks == [] and [s.path for s in _segments(plan)] == ["interp"], plan.fallbacks
    text = _segments(plan)[0].text
    assert "f32[] = scalar(value=0.1" in text and "bf16[] = scalar(value=0.1" in text, text
    got = plan([x])
    xf = x.float()
    want = [xf * 0.1, xf + 0.1, xf - 0.1, 0.1 - xf]
    for k, w in enumerate(want):
        assert torch.equal(got[k], w.bfloat16()), k
    assert torch.equal(got[4], (xf / 3.0).bfloat16())
    assert torch.equal(got[5], x > torch.tensor(0.1).bfloat16()) and not got[5][0, 0]


def test_only_config_reads_the_environment():
    """python/evt/config.py is the package's one reader of os.environ; the one write left is gpu.py's line that
    configures libevt."""
    import re
    pkg = os.path.dirname(C.__file__)
    for name in sorted(os.listdir(pkg)):
        if not name.endswith(".py") or name == "config.py":
            continue
        for ln in open(os.path.join(pkg, name)).read().splitlines():
            if re.search(r"os\.environ|getenv|putenv", ln):
                assert name == "gpu.py" and ln.startswith('os.environ.setdefault("EVT_REFINE_PARTITION"'), (name, ln)


def test_config_environment(monkeypatch, tmp_path):
    """The variables config.py reads: the cache root ($EVT_CACHE_DIR, $XDG_CACHE_HOME/evt, ~/.cache/evt), EVT_CACHE,
    EVT_LIB and EVT_LOG."""
    for k in ("EVT_CACHE_DIR", "XDG_CACHE_HOME", "EVT_CACHE", "EVT_LIB", "EVT_LOG"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert C.cache_root() == str(tmp_path / ".cache" / "evt") and C.cache_enabled()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert C.cache_root() == str(tmp_path / "x" / "evt")
    monkeypatch.setenv("EVT_CACHE_DIR", str(tmp_path / "c"))
    assert C.torch_cache_dir() == str(tmp_path / "c" / "torch")
    monkeypatch.setenv("EVT_CACHE", "0")
    assert not C.cache_enabled()
    assert C.library_override() is None and C.log_level() is None
    monkeypatch.setenv("EVT_LIB", "/x/libevt.so")
    assert C.library_override() == "/x/libevt.so"
    for v, level in (("0", None), ("1", logging.INFO), ("debug", logging.DEBUG), ("WARNING", logging.WARNING)):
        monkeypatch.setenv("EVT_LOG", v)
        assert C.log_level() == level, v


def test_options_are_checked():
    """Unknown keys and bad values of the backend options are errors that name them."""
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['gpu_op'\]"):
        C.parse_options({"gpu_op": "all"})
    for key, bad in (("check", 1), ("dump", 3), ("fused", "yes"), ("tune", "fast"), ("cudagraphs", "always")):
        with pytest.raises(ValueError, match=key):
            C.parse_options({key: bad})
    assert C.parse_options({"dump": "/tmp/x", "check": True}) == dict(C.DEFAULTS, dump="/tmp/x", check=True)
