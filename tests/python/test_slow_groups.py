"""On CUDA, an op whose group would run node by node in the reference library on a large tensor moves to PyTorch
(python/evt/slow_groups.py): plans for fake CUDA tensors, with the GPU programs made on the host (the same plan,
evt_program_create_host), so evt_program_report gives the real groups. Nothing runs on a GPU."""
import os
import sys

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "python"))
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402
from torch.fx.passes.fake_tensor_prop import FakeTensorProp  # noqa: E402

from evt import gpu as G  # noqa: E402
from evt import lib as evt_lib  # noqa: E402
from evt import plan as PL  # noqa: E402
from evt import segment as SG  # noqa: E402
from evt import slow_groups as SL  # noqa: E402

os.environ.setdefault("EVT_CACHE", "0")
needs_host = pytest.mark.skipif(not (evt_lib.has_interpreter() and hasattr(evt_lib.lib(), "evt_program_report")),
                                reason="libevt has no evt_program_report")


def _cuda_plan(monkeypatch, f, shapes, dtype=torch.bfloat16):
    """build_plan of f traced on fake CUDA tensors; returns (plan, the host programs made)."""
    made = []

    def program_for(graph, flags, device, refine, arch=None, tf32=False):
        made.append(G.Program(graph.text(), flags, host=True))
        return made[-1]
    monkeypatch.setattr(G, "has_program_api", lambda: True)
    monkeypatch.setattr(SG, "_program_for", program_for)
    monkeypatch.setattr(SG, "_GRAPHS", {})
    monkeypatch.setattr(G, "prefetch", lambda *a, **k: 0)  # (no JIT: host programs compile nothing)
    mode = FakeTensorMode()
    with mode:
        fakes = [torch.empty(*s, device="cuda", dtype=dtype) for s in shapes]
        gm = make_fx(f)(*fakes)
    FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*fakes)
    return PL.build_plan(gm), made


def _slow_in(programs):
    return [g for p in programs for g in (p.report() or {}).get("groups", []) if SL.is_slow(g)]


def _refused(x):
    """An op no visitor has (pow by an exponent the decomposition keeps): its group runs node by node."""
    return [x.abs().pow(1.7) * 2]


@needs_host
@pytest.mark.parametrize("case", ["pow", "bmm_strided"])
def test_large_node_by_node_groups_move_to_pytorch(monkeypatch, case):
    """A pow the visitor lacks and a bmm of permuted operands (HF BERT's attention): the lowering refuses
    both, so their groups would run node by node; they run in PyTorch, saying why, and the plan keeps the rest."""
    if case == "pow":
        f, shapes, moved = _refused, [(4, 8, 256, 256)], "pow"
    else:
        f, shapes, moved = (lambda q, k: [torch.matmul(q.permute(0, 2, 1, 3), k.permute(0, 2, 3, 1)) * 2]), \
            [(4, 256, 8, 64), (4, 256, 8, 64)], "bmm"
    plan, made = _cuda_plan(monkeypatch, f, shapes)
    why = {n.name: w for n, w in plan.fallbacks}
    assert any(name.startswith(moved) for name in why), why
    assert all("node by node in evt's reference library" in w for n, w in why.items() if n.startswith(moved)), why
    final = [s.program for s in plan.steps if isinstance(s, SG.Segment) and s.path == "gpu"]
    assert final and not _slow_in(final)  # the rebuilt plan still runs GPU segments, none of them slow
    assert _slow_in(made[:1]), "the first plan had the slow group the check moved"


@needs_host
def test_small_node_by_node_groups_stay(monkeypatch):
    """Below placement's large-tensor size the reference library's cost does not matter: the op stays in evt."""
    plan, made = _cuda_plan(monkeypatch, _refused, [(2, 4, 16, 16)])
    assert plan.fallbacks == []
    assert any(g["path"] == "node-by-node" for p in made for g in p.report()["groups"])


def test_is_slow_and_fx_names():
    big = SL.P.UNALIGNED_MIN_NUMEL
    group = {"path": "node-by-node", "out_numel": big, "ops": "eq+any"}
    assert SL.is_slow(group)
    assert not SL.is_slow(dict(group, out_numel=big - 1))
    assert not SL.is_slow(dict(group, path="generated"))
    assert not SL.is_slow(dict(group, ops="sdpa_backward_q"))  # cuDNN's attention: fast
    assert not SL.is_slow(dict(group, ops="permute+mm")) and not SL.is_slow(dict(group, ops="index_select"))
    assert SL.is_slow(dict(group, ops="bmm"))
    origin = {"sum_8": "a", "cast": "b"}
    assert SL.fx_node(origin, "sum_8.26") == "a" and SL.fx_node(origin, "sum_8") == "a"
    assert SL.fx_node(origin, "mul_3.1.2") is None


@needs_host
def test_after_the_rebuild_cap_slow_groups_stay_with_a_warning(monkeypatch, caplog):
    """Once build_plan has rebuilt MAX_PROGRAM_REBUILDS times, such ops stay in evt, and the log says so."""
    monkeypatch.setattr(PL, "MAX_PROGRAM_REBUILDS", 0)
    with caplog.at_level("WARNING", logger="evt"):
        plan, _ = _cuda_plan(monkeypatch, _refused, [(4, 8, 256, 256)])
    assert plan.fallbacks == []
    assert any("stay in groups that run node by node on CUDA" in r.getMessage() for r in caplog.records)


def _safe_softmax(x):
    """PyTorch's math attention's softmax as its decomposition traces it (HF BERT's joint graph): rows whose every
    score is -inf give zeros (eq, all as not-any-not, full_like, where)."""
    out = torch.softmax(x, -1)
    masked_rows = ~(~x.eq(float("-inf"))).any(-1, keepdim=True)
    return [torch.where(masked_rows, torch.full_like(out, 0), out) * 2]


@needs_host
def test_safe_softmax_fuses_on_cuda(monkeypatch):
    """`any` / `all` are row maxima of f32 truth values, which the visitor has: the safe softmax of a large tensor
    stays in evt in generated kernels (an i32 maximum had run node by node, split the segment and left its zeros
    to the reference library)."""
    plan, made = _cuda_plan(monkeypatch, _safe_softmax, [(4, 8, 256, 256)])
    assert plan.fallbacks == []
    groups = [g for p in made for g in p.report()["groups"]]
    assert not [g for g in groups if g["path"] == "node-by-node"], groups


def test_safe_softmax_values_on_the_interpreter():
    x = torch.randn(3, 5, 8)
    x[0, 1, :] = float("-inf")
    x[2, 0, 3] = float("-inf")
    compiled = torch.compile(lambda t: _safe_softmax(t)[0], backend="evt")
    got, want = compiled(x), torch.ops.aten._safe_softmax(x, -1) * 2
    assert torch.equal(got[0, 1], torch.zeros(8)) and torch.allclose(got, want, rtol=1e-5, atol=1e-6)
