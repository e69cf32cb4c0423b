"""Memory cuts of the backward (python/evt/memory_cuts.py): a residual network's backward segment is split under the
CUDA rules, never between a GEMM and its epilogue, with the gradients of eager PyTorch;
options["backward_cut_mib"] = 0 (the default) keeps one segment."""
import copy
import os
import sys

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

from evt import backend as B  # noqa: E402
from evt import config as C  # noqa: E402
from evt import lib as evt_lib  # noqa: E402
from evt import memory_cuts as MC  # noqa: E402
from evt.segment import Segment  # noqa: E402

needs_lib = pytest.mark.skipif(not evt_lib.has_interpreter(), reason="libevt has no CPU interpreter")
os.environ.setdefault("EVT_CACHE", "0")
aten = torch.ops.aten


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln, self.fc1, self.fc2 = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.fc2(nn.functional.gelu(self.fc1(self.ln(x))))


class Residual(nn.Module):
    def __init__(self, d=32, n=3):
        super().__init__()
        self.blocks, self.head = nn.Sequential(*[Block(d) for _ in range(n)]), nn.Linear(d, 10)

    def forward(self, x, y):
        return nn.functional.cross_entropy(self.head(self.blocks(x)), y)


def _train(monkeypatch, options, steps=2):
    """Gradients of evt and eager over `steps` steps (same inputs), and the backward plans evt built."""
    monkeypatch.setattr(C, "SIMULATE_CUDA_RULES", True)
    plans, build = [], B.build_plan

    def recording(gm, options=None, kind="module", backward=None):
        p = build(gm, options, kind, backward=backward)
        if kind == "backward":
            plans.append(p)
        return p
    monkeypatch.setattr(B, "build_plan", recording)
    torch._dynamo.reset()
    torch.manual_seed(0)
    ref = Residual()
    mod = copy.deepcopy(ref)
    f = torch.compile(mod, backend="evt", options=options)
    for _ in range(steps):
        x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
        f(x, y).backward()
        ref(x, y).backward()
    for (n, p_ref), (_, p) in zip(ref.named_parameters(), mod.named_parameters()):
        err = ((p.grad - p_ref.grad).abs().max() / p_ref.grad.abs().max().clamp_min(1e-6)).item()
        assert err <= 1e-4, n
    return plans


def _segments(plan):
    return [s for s in plan.steps if isinstance(s, Segment)]


@needs_lib
def test_backward_is_cut_and_no_op_waits_for_a_later_program(monkeypatch):
    """Three blocks' backward becomes several segments with eager's gradients; every op of a later segment that is
    no GEMM reads a value of its own segment (the ops that could run before the cut were moved there)."""
    plans = _train(monkeypatch, {"backward_cut_mib": 1e-3})
    segs = _segments(plans[-1])
    assert len(segs) >= 3
    earlier = set()
    for s in segs:
        own = set(s.members)
        for m in s.members:
            if s is not segs[0] and MC._movable(m) and any(w in own or w in earlier for w in m.all_input_nodes):
                assert any(w in own for w in m.all_input_nodes), (m.name, [w.name for w in m.all_input_nodes])
        earlier |= own


@needs_lib
def test_no_cut_when_off(monkeypatch):
    plans = _train(monkeypatch, {"backward_cut_mib": 0}, steps=1)
    assert len(_segments(plans[-1])) == 1


def _members(f, *shapes):
    from torch.fx.experimental.proxy_tensor import make_fx
    gm = make_fx(f, tracing_mode="fake")(*[torch.randn(s) for s in shapes])
    return [n for n in gm.graph.nodes if n.op == "call_function"]


def test_no_cut_between_a_gemm_and_its_epilogue():
    """The saved inputs `a` and `pre` are released after the first GEMM's GELU-backward epilogue: the cut comes
    before the next GEMM, not between the GEMM and its epilogue."""
    def f(a, w1, pre, w2):
        h = aten.gelu_backward(aten.mm(a, w1), pre)
        return aten.mm(h, w2)
    members = _members(f, (64, 64), (64, 64), (64, 64), (64, 64))
    cuts = MC.segment_cuts(members, 1)
    assert [(c.target, ahead) for c, ahead in cuts] == [(aten.mm.default, [])]
    assert members.index(cuts[0][0]) == len(members) - 1


def test_ops_of_values_before_a_cut_move_ahead_of_it():
    """A bias-gradient sum that the graph orders after the next GEMM reads only values from before the cut: it is
    moved before the cut (the graph reordered), where it fuses with its producer."""
    def f(a, w1, w2):
        h = aten.relu(aten.mm(a, w1))
        return aten.mm(h, w2), aten.sum(h, [0])
    members = _members(f, (64, 64), (64, 64), (64, 64))
    cuts = MC.segment_cuts(members, 1)
    assert [(c.target, [m.target for m in ahead]) for c, ahead in cuts] == \
        [(aten.mm.default, [aten.sum.dim_IntList])]
    cut, (total,) = cuts[0][0], cuts[0][1]
    assert MC.apply(cuts) == {cut}
    order = [n for n in cut.graph.nodes]
    assert order.index(total) < order.index(cut)
    cut.graph.lint()


def test_nothing_to_release_gives_no_cut():
    def f(a, w):
        return aten.add(aten.mm(aten.relu(aten.mm(a, w)), w), a)
    assert MC.segment_cuts(_members(f, (64, 64), (64, 64)), 1) == []  # (both inputs are read to the end)


def test_option_is_checked():
    assert C.parse_options(None)["backward_cut_mib"] == 0  # (off: see docs/pytorch.md "Memory cuts")
    for bad in (-1, "1", True):
        with pytest.raises(ValueError, match="backward_cut_mib"):
            C.parse_options({"backward_cut_mib": bad})
