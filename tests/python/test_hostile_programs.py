"""Hostile PyTorch programs under torch.compile(backend="evt") on the CPU, against eager PyTorch.

The backend must never fail where eager succeeds: every program here gives eager's forward values and, where it
trains, eager's loss and every gradient (fp32 to 1e-5, bf16 to 1e-2, integers exactly; a NaN never passes).
What evt cannot compute exactly runs in PyTorch, logged on the `evt` logger with its reason.
"""
import copy
import logging
import os
import sys

import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "python"))
import evt  # noqa: E402,F401 (registers the backend)
from evt import lib as evt_lib  # noqa: E402

pytestmark = pytest.mark.skipif(not evt_lib.has_interpreter(), reason="libevt has no CPU interpreter")

torch.set_num_threads(1)
os.environ.setdefault("EVT_CACHE", "0")

TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-2, torch.float64: 1e-5}


# ---- comparison -------------------------------------------------------------------------------------------

def assert_same(got, ref, where="output"):
    """got == ref: tensors to their dtype's tolerance (integers and bools exactly, NaN never), containers item by
    item, anything else by ==."""
    if isinstance(ref, torch.Tensor):
        assert isinstance(got, torch.Tensor), (where, type(got))
        assert got.shape == ref.shape and got.dtype == ref.dtype, (where, got.shape, got.dtype, ref.shape, ref.dtype)
        if ref.is_floating_point():
            assert not torch.isnan(got).any() and not torch.isnan(ref).any(), (where, "NaN")
            tol = TOL[ref.dtype]
            torch.testing.assert_close(got.double(), ref.double(), rtol=tol, atol=tol, msg=lambda m: f"{where}: {m}")
        else:
            assert torch.equal(got, ref), (where, got, ref)
    elif isinstance(ref, (list, tuple)):
        assert type(got) is type(ref) and len(got) == len(ref), (where, got, ref)
        for i, (g, r) in enumerate(zip(got, ref)):
            assert_same(g, r, f"{where}[{i}]")
    elif isinstance(ref, dict):
        assert got.keys() == ref.keys(), (where, got.keys(), ref.keys())
        for k in ref:
            assert_same(got[k], ref[k], f"{where}[{k!r}]")
    else:
        assert got == ref, (where, got, ref)


def _tensors(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for y in x for t in _tensors(y)]
    if isinstance(x, dict):
        return [t for y in x.values() for t in _tensors(y)]
    return []


def _loss(out):
    """A scalar of every floating output that carries a gradient (weights break symmetries)."""
    ts = [t for t in _tensors(out) if t.is_floating_point() and t.requires_grad]
    assert ts, "a training program must return a differentiable output"
    return sum(((t.float() * torch.linspace(0.5, 1.5, t.numel()).view(t.shape)).sum() if t.numel() else t.sum())
               for t in ts)


def run_both(fn, make_args, train=False, steps=2, grad_args=()):
    """Runs fn (a function or module) eagerly and compiled with backend="evt" on fresh arguments from make_args,
    `steps` times, comparing outputs, mutated arguments and module state; with train=True also the loss and the
    gradients of every parameter and of the arguments at grad_args."""
    torch._dynamo.reset()
    ref_fn = fn
    mod_fn = copy.deepcopy(fn) if isinstance(fn, nn.Module) else fn
    compiled = torch.compile(mod_fn, backend="evt")
    for step in range(steps):
        torch.manual_seed(step)
        args_ref = make_args()
        args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args_ref]
        for i in grad_args:
            args_ref[i].requires_grad_(True)
            args[i].requires_grad_(True)
        ctx = torch.enable_grad if train else torch.no_grad
        with ctx():
            out_ref = ref_fn(*args_ref)
            out = compiled(*args)
        assert_same(out, out_ref, f"step {step} output")
        assert_same([a.detach() if isinstance(a, torch.Tensor) else a for a in args],
                    [a.detach() if isinstance(a, torch.Tensor) else a for a in args_ref], f"step {step} arguments")
        if isinstance(fn, nn.Module):
            assert_same(dict(mod_fn.state_dict()), dict(ref_fn.state_dict()), f"step {step} state")
        if not train:
            continue
        loss_ref, loss = _loss(out_ref), _loss(out)
        assert_same(loss.detach(), loss_ref.detach(), f"step {step} loss")
        loss_ref.backward()
        loss.backward()
        if isinstance(fn, nn.Module):
            for (name, p_ref), (_, p) in zip(ref_fn.named_parameters(), mod_fn.named_parameters()):
                assert (p.grad is None) == (p_ref.grad is None), (step, name)
                if p_ref.grad is not None:
                    assert_same(p.grad, p_ref.grad, f"step {step} grad {name}")
                p.grad = p_ref.grad = None
        for i in grad_args:
            assert_same(args[i].grad, args_ref[i].grad, f"step {step} grad of argument {i}")


@pytest.fixture
def evt_log(caplog):
    caplog.set_level(logging.INFO, logger="evt")
    return caplog


def messages(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "evt"]


def assert_no_plan_failure(caplog):
    """No module ran wholly in PyTorch because evt failed to plan it, and no segment failed at run time."""
    bad = [m for m in messages(caplog) if "failed" in m or "could not" in m]
    assert not bad, bad


def fallback_reasons(caplog):
    """{op name: reason} of the nodes logged as running in PyTorch."""
    out = {}
    for m in messages(caplog):
        if "fallback to PyTorch:" in m:
            rest = m.split("fallback to PyTorch: ", 1)[1]
            out[rest.split(" ")[0]] = rest.split(": ", 1)[1] if ": " in rest else ""
    return out


# ---- modules --------------------------------------------------------------------------------------------

class Lin(nn.Module):
    """A Linear layer followed by `body(self, h, x)`."""

    def __init__(self, body, d_in=8, d_out=6, dtype=torch.float32):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(d_in, d_out).to(dtype)
        self.body = body

    def forward(self, x):
        return self.body(self, self.lin(x), x)


def x_of(n=4, d=8, dtype=torch.float32):
    return lambda: [torch.randn(n, d).to(dtype)]


def _add_(m, h, x):
    h.add_(1.0)
    return h.relu()


def _mul_(m, h, x):
    h.mul_(2.0)
    h.add_(x[:, :6], alpha=0.5)
    return torch.tanh(h)


def _relu_(m, h, x):
    h.relu_()
    return h * 3.0


def _index_put_(m, h, x):
    idx = torch.tensor([0, 2])
    h.index_put_((idx,), torch.full((2, 6), 0.5))
    return h.sigmoid()


def _index_put_acc_(m, h, x):
    idx = torch.tensor([1, 1, 3])
    h.index_put_((idx,), x[:3, :6], accumulate=True)
    return h


def _slice_assign(m, h, x):
    h[:, 0] = 0.0
    return h


def _slice_assign_tensor(m, h, x):
    h[1:3, 2:4] = x[:2, :2] * 2.0
    return h.exp()


def _masked_fill_(m, h, x):
    h.masked_fill_(x[:, :6] > 0, -1.0)
    return h


INPLACE = {"add_": _add_, "mul_": _mul_, "relu_": _relu_, "index_put_": _index_put_,
           "index_put_accumulate": _index_put_acc_, "slice_assign": _slice_assign,
           "slice_assign_tensor": _slice_assign_tensor, "masked_fill_": _masked_fill_}


@pytest.mark.parametrize("train", [True, False], ids=["train", "no_grad"])
@pytest.mark.parametrize("name", sorted(INPLACE))
def test_inplace_ops(name, train, evt_log):
    run_both(Lin(INPLACE[name]), x_of(), train=train)
    assert_no_plan_failure(evt_log)


def test_slice_assignment_bf16(evt_log):
    run_both(Lin(_slice_assign, dtype=torch.bfloat16), x_of(dtype=torch.bfloat16), train=True)
    assert_no_plan_failure(evt_log)


def test_views_of_views(evt_log):
    def body(m, h, x):
        v = h.view(2, 2, 6).transpose(1, 2)[:, 1:, :].reshape(2, 10)
        w = v.t().unsqueeze(0).expand(3, 10, 2)
        return w.sum(0).narrow(0, 2, 5), v[:, ::2]
    run_both(Lin(body), x_of(), train=True)
    assert_no_plan_failure(evt_log)


def test_views_of_views_of_an_input(evt_log):
    def f(x):
        y = x.view(4, 2, 4).permute(2, 0, 1)
        return y[1:].flatten(1).t(), y.diagonal(dim1=1, dim2=2)
    run_both(f, x_of(), train=True, grad_args=(0,))
    assert_no_plan_failure(evt_log)


# ---- captured constants -----------------------------------------------------------------------------------

def test_closure_python_float(evt_log):
    scale = 0.37
    run_both(Lin(lambda m, h, x: h * scale + scale), x_of(), train=True)
    assert_no_plan_failure(evt_log)


def test_closure_captured_tensor(evt_log):
    t = torch.linspace(-1, 1, 6)

    def f(x):
        return (x[:, :6] + t) * t.exp()
    run_both(f, x_of(), train=True, grad_args=(0,))
    run_both(Lin(lambda m, h, x: h - t), x_of(), train=False)
    assert_no_plan_failure(evt_log)


class WithBuffers(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(8, 6)
        self.register_buffer("scale", torch.linspace(0.5, 2.0, 6))
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))
        self.register_buffer("ema", torch.zeros(6))

    def forward(self, x):
        h = self.lin(x) * self.scale
        self.calls += 1
        with torch.no_grad():
            self.ema.mul_(0.9).add_(h.detach().mean(0), alpha=0.1)
        return h


@pytest.mark.parametrize("train", [True, False], ids=["train", "no_grad"])
def test_module_buffers(train, evt_log):
    run_both(WithBuffers(), x_of(), train=train, steps=3)
    assert_no_plan_failure(evt_log)


# ---- integers --------------------------------------------------------------------------------------------

BIG = [2 ** 53, 2 ** 53 + 1, 2 ** 60, -(2 ** 60) - 3, 7]


def ints(*values, dtype=torch.int64):
    return lambda: [torch.tensor(values, dtype=dtype)]


INT_PROGRAMS = {
    "add_sub": lambda a: (a + 1) - a,
    "mul": lambda a: a * 3 - a,
    "neg_abs": lambda a: -a + a.abs(),
    "sum": lambda a: a.sum(),
    "tensor_add": lambda a: a + a.flip(0),
    "floordiv": lambda a: a // 3,
    "remainder": lambda a: a % 5,
    "trunc_div": lambda a: torch.div(a, 7, rounding_mode="trunc"),
    "fmod": lambda a: torch.fmod(a, 6),
    "true_div": lambda a: a / 4,
    "compare": lambda a: (a + 1 > a, a == a - 1),
    "compare_tensors": lambda a: (a == a.flip(0), a < a.roll(1), a > 2 ** 53),
    "moves": lambda a: (torch.cat([a, a.flip(0)]), torch.where(a > 0, a, torch.zeros_like(a)), a.view(1, -1).t()),
    "to_float": lambda a: (a.float(), a.to(torch.bfloat16), a.double()),
    "narrowing_cast": lambda a: a.to(torch.int32),
    "large_constant": lambda a: (a + 2 ** 60, torch.full_like(a, 2 ** 60 + 1), a.float() * (2 ** 53 + 1)),
}


@pytest.mark.parametrize("name", sorted(INT_PROGRAMS))
def test_int64_near_2_53_and_2_60(name, evt_log):
    run_both(INT_PROGRAMS[name], ints(*BIG))
    assert_no_plan_failure(evt_log)


def test_int64_arithmetic_falls_back_with_its_reason(evt_log):
    """Arithmetic whose values may leave the doubles' exact range runs in PyTorch (logged with the reason); arithmetic
    whose bound fits runs in evt while the int64 inputs are within INT_INPUT_BOUND (checked at each run)."""
    run_both(lambda a: a * a * a, ints(*BIG))
    reasons = fallback_reasons(evt_log)
    assert "mul.Tensor" in reasons and "2^53" in reasons["mul.Tensor"], reasons
    evt_log.clear()
    run_both(lambda a: (a + 1) - a, ints(3, 2 ** 20, -7))
    assert not fallback_reasons(evt_log), fallback_reasons(evt_log)
    run_both(lambda a: (a + 1) - a, ints(*BIG))
    assert any("int64 input" in m and "runs in PyTorch" in m for m in messages(evt_log)), messages(evt_log)


def test_int64_values_beyond_2_53_move_through_pytorch(evt_log):
    """Moves and comparisons of int64 values stay in evt while they are within 2^53; a run whose int64 input is
    beyond it runs the segment in PyTorch (logged)."""
    def f(a):
        return torch.cat([a, a.flip(0)]), torch.where(a > 0, a, torch.zeros_like(a)), a == a.flip(0)
    run_both(f, ints(3, -5, 2 ** 52, 7))
    assert not any("beyond 2^53" in m for m in messages(evt_log))
    assert any("evt segment" in m for m in messages(evt_log))
    run_both(f, ints(*BIG))
    assert any("beyond 2^53" in m for m in messages(evt_log)), messages(evt_log)
    assert_no_plan_failure(evt_log)


def test_int32_overflow_wraps_as_in_pytorch(evt_log):
    run_both(lambda a: (a * 4 + a, a - (2 ** 31 - 1)), ints(2 ** 30, -(2 ** 30), 12345, dtype=torch.int32))
    assert_no_plan_failure(evt_log)


def test_integer_division_of_small_values(evt_log):
    def f(a, b):
        return a // b, a % b, torch.div(a, b, rounding_mode="trunc"), torch.remainder(a, -3), a / b
    run_both(f, lambda: [torch.tensor([-7, -6, -1, 0, 1, 5, 9]), torch.tensor([2, -4, 3, 5, -2, 2, 4])])
    assert_no_plan_failure(evt_log)


def test_float_floor_division_and_remainder(evt_log):
    def f(x):
        return x // 0.75, torch.remainder(x, 1.5), torch.fmod(x, -1.25)
    run_both(f, x_of())
    assert_no_plan_failure(evt_log)


def test_index_plumbing_stays_in_evt(evt_log):
    """Embedding indices and argmax outputs are integer values evt carries exactly: no fallback for them."""
    class Emb(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.emb = nn.Embedding(10, 6)
            self.lin = nn.Linear(6, 4)

        def forward(self, idx):
            h = self.lin(self.emb(idx))
            return h, h.argmax(-1)
    run_both(Emb(), lambda: [torch.randint(0, 10, (3, 5))], train=True)
    assert_no_plan_failure(evt_log)
    reasons = fallback_reasons(evt_log)
    assert not any(k.startswith(("embedding", "addmm", "mm")) or "integer" in why for k, why in reasons.items()), \
        reasons


# ---- masks, empty tensors, scalars, outputs -----------------------------------------------------------------

def test_bool_masks(evt_log):
    def body(m, h, x):
        mask = x[:, :6] > 0
        keep = ~mask & (h < 0.5)
        return torch.where(keep, h, torch.zeros_like(h)) + h * mask, keep.any(1), mask.sum()
    run_both(Lin(body), x_of(), train=True)
    assert_no_plan_failure(evt_log)


def test_boolean_mask_indexing(evt_log):
    """x[mask] has a data-dependent shape: dynamo graph-breaks around it."""
    def f(x):
        y = x * 2
        return y[y > 0].sum() + x.mean()
    run_both(f, x_of(), train=True, grad_args=(0,))
    assert_no_plan_failure(evt_log)


@pytest.mark.parametrize("train", [True, False], ids=["train", "no_grad"])
def test_empty_batch(train, evt_log):
    run_both(Lin(lambda m, h, x: F.relu(h).sum(0) + h.mean(1).sum()), x_of(n=0), train=train)
    run_both(Lin(lambda m, h, x: F.gelu(h) * 2), x_of(n=0), train=train)
    assert_no_plan_failure(evt_log)


def test_scalar_outputs(evt_log):
    run_both(Lin(lambda m, h, x: h.sum()), x_of(), train=True)
    run_both(Lin(lambda m, h, x: (h.mean() * 2, h.amax(), h[0, 0])), x_of(), train=True)
    run_both(lambda x: x.sum() * 0 + 1.5, x_of(), train=True, grad_args=(0,))
    assert_no_plan_failure(evt_log)


def test_multiple_outputs_with_non_tensors(evt_log):
    def body(m, h, x):
        return {"h": h, "n": h.shape[0], "tag": "out", "none": None, "scale": 2.5, "pair": (h.sum(), x.shape)}
    run_both(Lin(body), x_of(), train=True)
    assert_no_plan_failure(evt_log)


class MutatesInput(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(8, 6)

    def forward(self, x, y):
        x.mul_(2.0)
        x[:, 0] = -1.0
        y.add_(x[:, :6])
        return self.lin(x) + y


@pytest.mark.parametrize("train", [True, False], ids=["train", "no_grad"])
def test_inplace_on_inputs(train, evt_log):
    run_both(MutatesInput(), lambda: [torch.randn(4, 8), torch.randn(4, 6)], train=train)

    def f(a, b):
        a.add_(b)
        b.zero_()
        return a * 2
    run_both(f, lambda: [torch.randn(3, 4), torch.randn(3, 4)])
    assert_no_plan_failure(evt_log)


# ---- graph breaks ------------------------------------------------------------------------------------------

class Branchy(nn.Module):
    """Data-dependent Python control flow: dynamo compiles the pieces between the breaks."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 4)

    def forward(self, x):
        h = torch.tanh(self.a(x))
        n = 0
        while h.abs().sum().item() > 1.0 and n < 3:
            h = h * 0.5
            n += 1
        if h.sum() > 0:
            h = h + 1
        else:
            h = -h
        return self.b(h), n


@pytest.mark.parametrize("train", [True, False], ids=["train", "no_grad"])
def test_data_dependent_control_flow(train, evt_log):
    run_both(Branchy(), x_of(), train=train, steps=4)
    assert_no_plan_failure(evt_log)


# ---- evt's own errors: a failure of translation or planning runs that node or segment in PyTorch ------------------

from evt import aten as A  # noqa: E402
from evt import placement as P  # noqa: E402
from evt import rewrites as R  # noqa: E402
from evt import segment as SG  # noqa: E402


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 4)

    def forward(self, x):
        return F.log_softmax(self.b(torch.relu(self.a(x))), -1)


def _boom(*args, **kwargs):
    raise RuntimeError("boom")


def test_a_translator_that_raises_runs_its_node_in_pytorch(monkeypatch, evt_log):
    monkeypatch.setitem(A.TABLE, torch.ops.aten.relu, _boom)
    run_both(MLP(), x_of(), train=True)
    reasons = fallback_reasons(evt_log)
    assert reasons.get("relu.default") == "translation failed: RuntimeError: boom", reasons
    assert any("evt segment" in m for m in messages(evt_log))


def test_a_placement_rule_that_raises_runs_its_node_in_pytorch(monkeypatch, evt_log):
    real = P.cuda_placement

    def placement(node, options):
        if node.target is torch.ops.aten.relu.default:
            raise ValueError("bad rule")
        return real(node, options)
    monkeypatch.setattr(P, "cuda_placement", placement)
    run_both(MLP(), x_of(), train=True)
    assert fallback_reasons(evt_log).get("relu.default") == "placement failed: ValueError: bad rule"


@pytest.mark.parametrize("error", [RuntimeError("boom"), evt_lib.EvtError("no node named here")], ids=["bug", "evt"])
def test_a_segment_that_cannot_be_planned_runs_in_pytorch(error, monkeypatch, evt_log):
    real = SG.Segment.finalize
    calls = []

    def finalize(self, *a, **k):
        calls.append(self)
        if len(calls) == 1:
            raise error
        return real(self, *a, **k)
    monkeypatch.setattr(SG.Segment, "finalize", finalize)
    run_both(MLP(), x_of(), train=True)
    msgs = messages(evt_log)
    assert any("could not plan a segment" in m and str(error) in m for m in msgs), msgs
    assert any("fallback to PyTorch" in m and str(error) in m for m in msgs), msgs
    assert not any("module runs in PyTorch" in m or "running the module in PyTorch" in m for m in msgs), msgs


def test_a_rewrite_that_raises_leaves_the_joint_graph_as_traced(monkeypatch, evt_log):
    monkeypatch.setattr(R, "stack_select_backwards", _boom)
    run_both(MLP(), x_of(), train=True)
    msgs = messages(evt_log)
    assert any("rewrites of the joint graph failed (RuntimeError: boom)" in m for m in msgs), msgs
    assert any("evt segment" in m for m in msgs)


def test_a_missing_library_is_an_error_naming_it(monkeypatch, evt_log, tmp_path):
    """No libevt is a configuration error: LibraryError at the first call, naming the library (never a silent
    run of the module in PyTorch, never hidden as one segment's fallback)."""
    from evt import config as C
    monkeypatch.setattr(evt_lib, "_lib", None)
    monkeypatch.setattr(C, "library_override", lambda: str(tmp_path / "libevt.so"))
    monkeypatch.setattr(SG, "_GRAPHS", {})
    with pytest.raises(Exception) as e:
        run_both(MLP(), x_of(), train=True, steps=1)
    assert "does not load" in str(e.value) and str(tmp_path) in str(e.value), e.value
    warnings = [r.getMessage() for r in evt_log.records if r.name == "evt" and r.levelno >= logging.WARNING]
    assert not any("could not plan a segment" in m for m in warnings), warnings


def test_a_padded_gemm_that_raises_runs_the_op(monkeypatch, evt_log):
    from evt import torch_steps as TS
    g = torch.fx.Graph()
    a, b = g.placeholder("a"), g.placeholder("b")
    n = g.call_function(torch.ops.aten.mm.default, (a, b))
    n.meta["evt_pad_gemm"] = "contiguous"
    monkeypatch.setattr(TS, "padded_gemm", _boom)
    x, y = torch.randn(3, 5), torch.randn(5, 7)
    assert_same(TS.run_torch(n, {a: x, b: y}), x @ y)
    assert "evt_pad_gemm" not in n.meta
    assert any("padded form failed (RuntimeError: boom)" in m for m in messages(evt_log))
