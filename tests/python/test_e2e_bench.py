"""bench/e2e/run.py's host-side helpers, without a GPU: the one-step profile summary (kernel names, kernel
time, host CUDA API calls) from a stand-in profiler, and the markdown renderer's cells."""
import importlib.util
import os
import sys
import types

import pytest

torch = pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run_module():
    spec = importlib.util.spec_from_file_location("e2e_run", os.path.join(ROOT, "bench", "e2e", "run.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, os.path.join(ROOT, "bench", "e2e"))
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.pop(0)
    return mod


def _profile_one_step(run, events, monkeypatch):
    """run._kernels_in_one_step over a stand-in profiler that reports `events`; returns its result."""
    class _Prof:
        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

        def events(self):
            return events
    fake = types.SimpleNamespace(profile=lambda activities: _Prof(),
                                 ProfilerActivity=types.SimpleNamespace(CPU="cpu", CUDA="cuda"))
    monkeypatch.setitem(sys.modules, "torch.profiler", fake)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    return run._kernels_in_one_step(lambda: None)


class _Ev:
    def __init__(self, name, dev, us):
        self.name, self.device_type = name, f"DeviceType.{dev}"
        self.device_time_total = us if dev == "CUDA" else 0
        self.cpu_time_total = us if dev == "CPU" else 0


def test_profile_summary_names_generated_kernels_and_host_calls(monkeypatch, capsys):
    run = _run_module()
    cutlass = ("_ZN7cutlass13device_kernelINS_4gemm6kernel13GemmUniversalIN4cute5tupleIJiiiiEEENS1_10collective"
               "N24evt_gen_0123456789abcdef8EVT_TREEE")
    events = [_Ev(cutlass, "CUDA", 1500.0), _Ev(cutlass, "CUDA", 1500.0), _Ev("nvjet_sm90_tst", "CUDA", 1000.0),
              _Ev("Memcpy HtoD", "CUDA", 50.0), _Ev("cudaLaunchKernel", "CPU", 30.0),
              _Ev("cudaStreamSynchronize", "CPU", 4000.0), _Ev("aten::mm", "CPU", 90.0)]
    n, ms = _profile_one_step(run, events, monkeypatch)
    out = capsys.readouterr().out
    assert (n, ms) == (3, 4.0), (n, ms)  # (the memcpy is not a kernel)
    assert "evt_gen_0123456789abcdef (generated CUTLASS GEMM+EVT)" in out and "    3.000 ms     2x" in out
    assert "host CUDA API calls of that step (4.03 ms of host time)" in out
    assert out.index("cudaStreamSynchronize") < out.index("cudaLaunchKernel") and "aten::mm" not in out


def test_cutlass_gemm_kernels_are_named_from_the_jit_cache(monkeypatch, capsys):
    """A CUTLASS kernel whose mangled name carries no evt hash is listed by its digest and the evt kernel whose
    shared object holds its host stub (`_ZN7cutlassL13device_kernel...`, read with nm); an unknown one keeps the
    name's length."""
    run = _run_module()
    tail = "INS_4gemm6kernel13GemmUniversalIN4cute5tupleIJiiiiEEEEEvNT_6ParamsE"
    dev, other = "_ZN7cutlass13device_kernel" + tail, "_ZN7cutlass13device_kernel" + tail + "X"
    names = run._cutlass_names_from_symbols({"evt_kernel_00000000000000aa": ["_ZN7cutlassL13device_kernel" + tail,
                                                                             "_Z4main"]})
    assert names == {run._cutlass_digest(dev): "evt_kernel_00000000000000aa"}
    monkeypatch.setattr(run, "_cutlass_names", lambda cache: names)
    events = [_Ev(dev, "CUDA", 2000.0), _Ev(other, "CUDA", 1000.0)]
    _profile_one_step(run, events, monkeypatch)
    out = capsys.readouterr().out
    assert f"CUTLASS GemmUniversal #{run._cutlass_digest(dev)} (evt_kernel_00000000000000aa)" in out, out
    assert f"CUTLASS GemmUniversal #{run._cutlass_digest(other)} ({len(other)}-char mangled name)" in out, out


def test_render_cells(tmp_path):
    run = _run_module()
    assert run._ratio(1.234) == "1.23x" and run._ratio(None) == "–" and run._ratio(0) == "–"
    rows = [dict(workload="mlp", mode="eager", ms=10.0, x_eager=1.0, kernels=5, kernel_ms=9.0),
            dict(workload="mlp", mode="evt", ms=8.0, x_eager=1.25, kernels=4, kernel_ms=7.5, evt_launches=3,
                 grad_rel=1e-3, grad_rel_steady=2e-3)]
    md, _ = run.render(dict(rows=rows, command="c", torch="t", date="d", iters=5), str(tmp_path / "e2e"))
    assert "| mlp | evt | 8.00 | 1.25x | – |" in md and "4 (3 evt); 7.5 ms" in md and "1.0e-03 / 2.0e-03" in md


def test_gpu_timeline_finds_the_idle_time_and_the_largest_gaps(monkeypatch, capsys):
    """The step's GPU timeline: overlapping events count once, the gaps between them are idle time, named by
    the events around them, and the lead is the host's time before the first device event."""
    run = _run_module()
    spans = [(100.0, 200.0, "a"), (150.0, 250.0, "b"), (1250.0, 1300.0, "c"), (1310.0, 1400.0, "d")]
    t = run._gpu_timeline(spans, step_start=40.0)
    assert t["span"] == 1300.0 and t["busy"] == 150.0 + 50.0 + 90.0 and t["idle"] == 1300.0 - 290.0
    assert t["lead"] == 60.0 and t["ngaps"] == 2 and t["gaps"][0] == (1000.0, "b", "c") and t["gaps"][1][0] == 10.0

    class _Tr:
        def __init__(self, s, e):
            self.start, self.end = s, e
    evs = []
    for s, e, name in spans:
        ev = _Ev(name, "CUDA", e - s)
        ev.time_range = _Tr(s, e)
        evs.append(ev)
    mark = _Ev("e2e_step", "CPU", 0.0)
    mark.time_range = _Tr(40.0, 45.0)
    gpu_mark = _Ev("e2e_step", "CUDA", 900.0)  # (the annotation's device side: neither a kernel nor busy time)
    gpu_mark.time_range = _Tr(100.0, 1000.0)
    n, ms = _profile_one_step(run, evs + [mark, gpu_mark], monkeypatch)
    out = capsys.readouterr().out
    assert (n, ms) == (4, 0.34), (n, ms)
    assert "GPU timeline of that step: 1.300 ms from the first device event to the last, busy 0.290 ms, idle " \
           "1.010 ms in 2 gaps; 0.060 ms from the step's start to the first (a)" in out, out
    assert "gap    1.000 ms after b  before c" in out, out


def test_tune_runs_one_evt_step_with_the_tune_option(monkeypatch, capsys, tmp_path):
    """--tune N: one evt step compiled with options={"tune": N} (the backend tunes when it compiles), the seconds
    returned; a failing step returns None and the benchmark goes on. The rendered table says which evt rows ran
    with the records and shows the GPU time of a step."""
    run = _run_module()
    seen = []
    # (a stand-in for bench/e2e/models.py: the name `models` may be another test module's in this session)
    monkeypatch.setitem(sys.modules, "models", types.SimpleNamespace(
        make=lambda *a, **k: (torch.nn.Linear(2, 2), (), False)))
    monkeypatch.setattr(run, "_compile", lambda m, mode, extra=None: (seen.append(("compile", mode, extra)), m)[1])
    monkeypatch.setattr(run, "_step_fn", lambda f, args, amp, params: lambda: seen.append("step"))
    monkeypatch.setattr(run, "_release_evt", lambda: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda: None)
    a = types.SimpleNamespace(tune=5, dropout=False, scale=1.0)
    took = run._tune_workload("mlp", a)
    assert isinstance(took, float) and seen == [("compile", "evt", {"tune": 5}), "step"], seen
    monkeypatch.setattr(run, "_step_fn", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("no GPU")))
    assert run._tune_workload("mlp", a) is None and "tuning failed (RuntimeError: no GPU)" in capsys.readouterr().out
    rows = [dict(workload="mlp", mode="evt_cg", ms=40.0, gpu_ms=36.5, tune_s=180.0),
            dict(workload="mlp", mode="inductor", ms=42.0)]
    md, _ = run.render(dict(rows=rows, command="c", torch="t", date="d", iters=5), str(tmp_path / "e2e"))
    assert "GPU 36.5 ms" in md and "tuned (tuning step 180.0 s)" in md, md


def test_fp32_reference_gradients_and_their_cell(monkeypatch, tmp_path):
    """E2E_FP32_REF=1: _fp32_grads runs one step of the eager module without autocast and with TF32 off (the
    flags restored after it, the module's gradients cleared) and returns its gradients; the table's grad rel
    cell then shows each mode's distance to them, eager's own as the noise."""
    run = _run_module()
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))
    x = torch.randn(5, 4)
    seen = []

    class _M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = m

        def forward(self, x):
            seen.append((torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32))
            return self.net(x).sum()
    w = _M()
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", True)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    g = run._fp32_grads(w, (x,))
    assert seen == [(False, False)]
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    assert all(p.grad is None for p in w.parameters())
    w.zero_grad()
    w(x).backward()
    assert set(g) == {n for n, _ in w.named_parameters()}
    assert all(torch.equal(g[n], p.grad) for n, p in w.named_parameters())
    rows = [dict(workload="resnet50", mode="eager", ms=30.0, grad_rel_fp32=4e-2),
            dict(workload="resnet50", mode="evt_cg", ms=31.0, grad_rel=8e-2, grad_rel_steady=8e-2, grad_rel_fp32=5e-2)]
    md, _ = run.render(dict(rows=rows, command="c", torch="t", date="d", iters=5), str(tmp_path / "e2e"))
    assert "| fp32 4.0e-02 |" in md and "| 8.0e-02 / 8.0e-02; fp32 5.0e-02 |" in md, md
