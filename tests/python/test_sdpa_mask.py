"""Attention with a mask in evt: F.scaled_dot_product_attention(q, k, v, attn_mask=..., is_causal=...) compiled
with backend="evt" on the CPU against eager PyTorch, output and gradients to fp32 rel 1e-5. The masks are those
Hugging Face models pass (additive float [B, 1, Q, K], bool padding [B, 1, 1, K]), plus a fully masked row
(PyTorch gives 0 there, and so must evt) and grouped-query attention. The log must show no fallback."""
import logging
import os
import sys

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "python"))
import evt  # noqa: E402,F401
from evt import lib as evt_lib  # noqa: E402

pytestmark = pytest.mark.skipif(not evt_lib.has_interpreter(), reason="libevt has no CPU interpreter yet")

torch.set_num_threads(1)
os.environ.setdefault("EVT_CACHE", "0")

B, H, Q, K, D = 2, 2, 5, 6, 4


def rel_err(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-6)).item()


def attention(q, k, v, mask, w, causal, gqa):
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=gqa)
    return (o * w).sum(), o


def masks():
    g = torch.Generator().manual_seed(1)
    fm = torch.randn(B, 1, Q, K, generator=g)
    fm[0, 0, 1, 2] = float("-inf")
    pad = torch.ones(B, 1, 1, K, dtype=torch.bool)
    pad[1, 0, 0, 4:] = False
    rows = torch.rand(B, H, Q, K, generator=g) > 0.4
    rows[0, 1, 2, :] = False  # a fully masked row
    hf = torch.zeros(B, 1, Q, K)
    hf[1, :, :, 5:] = torch.finfo(torch.float32).min  # HF's padding: finfo.min, not -inf
    return {"float": fm, "bool_padding": pad, "bool_full_row": rows, "hf_min": hf, "rank2": torch.randn(Q, K)}


CASES = [(name, causal, gqa) for name in masks() for causal in (False, True) for gqa in (False, True)
         if not (gqa and name != "bool_padding")]


@pytest.mark.parametrize("name,causal,gqa", CASES)
def test_masked_sdpa_matches_pytorch(name, causal, gqa, caplog):
    torch._dynamo.reset()
    caplog.set_level(logging.INFO, logger="evt")
    torch.manual_seed(0)
    mask = masks()[name]
    q = torch.randn(B, H, Q, D)
    k, v = torch.randn(B, 1 if gqa else H, K, D), torch.randn(B, 1 if gqa else H, K, D)
    w = torch.randn(B, H, Q, D)
    grads = []
    for fn in (attention, torch.compile(attention, backend="evt", fullgraph=True)):
        qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
        loss, o = fn(qq, kk, vv, mask, w, causal, gqa)
        loss.backward()
        grads.append((o.detach(), qq.grad, kk.grad, vv.grad))
    for what, got, want in zip(("out", "dq", "dk", "dv"), grads[1], grads[0]):
        assert torch.isfinite(got).all() == torch.isfinite(want).all(), what
        assert rel_err(got, want) < 1e-5, (what, rel_err(got, want))
    if name == "bool_full_row":
        assert (grads[1][0][0, 1, 2] == 0).all() and (grads[1][1][0, 1, 2] == 0).all()
    msgs = [r.getMessage() for r in caplog.records]
    assert not [m for m in msgs if "fallback to PyTorch:" in m], msgs
    assert sum(m.startswith(("forward:", "backward:")) and m.endswith(", 0 in PyTorch") for m in msgs) == 2, msgs


def test_float_mask_that_requires_grad(caplog):
    """A float mask with requires_grad: PyTorch's dispatcher takes the math attention (bmm, softmax), which evt
    runs with the mask's gradient, summed over the heads the mask broadcasts over."""
    torch._dynamo.reset()
    caplog.set_level(logging.INFO, logger="evt")
    torch.manual_seed(0)
    q, k, v, m, w = torch.randn(B, H, Q, D), torch.randn(B, H, K, D), torch.randn(B, H, K, D), \
        torch.randn(B, 1, Q, K), torch.randn(B, H, Q, D)
    got = []
    for fn in (attention, torch.compile(attention, backend="evt", fullgraph=True)):
        qq, mm = q.clone().requires_grad_(), m.clone().requires_grad_()
        loss, o = fn(qq, k, v, mm, w, False, False)
        loss.backward()
        got.append((o.detach(), qq.grad, mm.grad))
    for what, a, b in zip(("out", "dq", "dmask"), got[1], got[0]):
        assert rel_err(a, b) < 1e-5, (what, rel_err(a, b))
    msgs = [r.getMessage() for r in caplog.records]
    assert sum(m.startswith(("forward:", "backward:")) and m.endswith(", 0 in PyTorch") for m in msgs) == 2, msgs
