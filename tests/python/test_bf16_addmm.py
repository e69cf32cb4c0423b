"""A bf16 Linear under torch.compile(backend="evt") on the CPU matches eager PyTorch to one bf16 ulp.

PyTorch's addmm adds the bias to the f32 accumulator and rounds once; evt's canonicalize pass used to split a
bf16 addmm into a bf16 mm and a bf16 add (two roundings), which left forward values several ulps off where
the bias cancels the product, and the backward amplified that (weight gradients hundreds of ulps off). Both
a bf16 model and an f32 model under bf16 autocast are checked: the output and every gradient, elementwise,
within one bf16 ulp of eager's value (the interpreter accumulates in double, eager in f32: a near-tie may
round the other way).
"""
import logging
import os
import sys

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "python"))
import evt  # noqa: E402,F401
from evt import backend as evt_backend  # noqa: E402
from evt import lib as evt_lib  # noqa: E402

pytestmark = pytest.mark.skipif(not evt_lib.has_interpreter(), reason="libevt has no CPU interpreter yet")

torch.set_num_threads(1)
os.environ.setdefault("EVT_CACHE", "0")


def bf16_ulp(t):
    """One bf16 ulp of each element of t (8 significant bits)."""
    a = t.detach().float().abs().clamp_min(2.0 ** -120)
    return torch.exp2(torch.floor(torch.log2(a)) - 7)


def step(model, fn, x, autocast):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        y = fn(x)
    y.float().square().sum().backward()
    return [("y", y)] + [(f"{n}.grad", p.grad) for n, p in model.named_parameters()]


@pytest.mark.parametrize("autocast", [False, True], ids=["bf16_model", "f32_model_bf16_autocast"])
def test_bf16_linear_matches_eager_to_one_ulp(autocast, caplog):
    caplog.set_level(logging.INFO, logger="evt")
    torch._dynamo.reset()
    evt_backend.reset_stats()
    torch.manual_seed(0)
    ref = torch.nn.Linear(64, 48)
    mod = torch.nn.Linear(64, 48)
    mod.load_state_dict(ref.state_dict())
    dt = torch.float32 if autocast else torch.bfloat16
    ref, mod = ref.to(dt), mod.to(dt)
    x = torch.randn(32, 64, dtype=dt)
    want = step(ref, ref, x, autocast)
    got = step(mod, torch.compile(mod, backend="evt"), x, autocast)
    assert evt_backend.STATS["interp_segment_runs"] >= 2, dict(evt_backend.STATS)  # forward and backward in evt
    assert not any("fallback to PyTorch: aten.addmm" in r.getMessage() for r in caplog.records)
    assert want[0][1].dtype == torch.bfloat16
    for (name, g), (_, w) in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, name
        d = (g.float() - w.float()).abs()
        over = d > bf16_ulp(w)
        assert not over.any(), (f"{name}: {int(over.sum())} of {d.numel()} elements more than one bf16 ulp from "
                                f"eager (max abs diff {d.max().item():.3g})")
