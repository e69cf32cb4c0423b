"""evt.dynamo_rewrites.drop_constant_attention_masks: an attention mask Dynamo's graph computes from constants is
dropped when it is all-true and becomes is_causal=True when it is causal (as Hugging Face models build them under
torch.compile); any other mask stays. Each case runs the rewritten Dynamo graph against eager PyTorch (output and
gradients, fp32 rel 1e-5), and one runs whole through backend="evt" on the CPU interpreter."""
import logging
import os
import sys

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "python"))
from evt import dynamo_rewrites as DR  # noqa: E402
from evt import lib as evt_lib  # noqa: E402

torch.set_num_threads(1)
os.environ.setdefault("EVT_CACHE", "0")

B, H, S, D = 2, 3, 6, 4


def _indices(x):
    s = x.shape[-2]
    return torch.arange(s, device=x.device)[None, None, :, None], torch.arange(s, device=x.device)[None, None, None, :]


def all_true(x):
    q, _ = _indices(x)
    return (q >= 0).expand(x.shape[0], -1, x.shape[-2], x.shape[-2])  # (BERT's mask under tracing)


def causal(x):
    q, k = _indices(x)
    return (k <= q).expand(x.shape[0], -1, -1, -1)  # (GPT-2's and LLaMA's)


def causal_additive(x):
    q, k = _indices(x)
    return torch.zeros(S, S).masked_fill(k > q, torch.finfo(torch.float32).min)


def causal_from_input_shape(x):
    q, k = _indices(x)
    return (k <= q) & x.new_ones(x.shape[0], 1, 1, 1, dtype=torch.bool)  # (a shape-only use of the input)


def band(x):
    q, k = _indices(x)
    return (k <= q) & (k >= q - 2)  # (constant, but neither all-true nor causal)


def from_input(x):
    return (x[..., :1] > -10).expand(-1, -1, -1, x.shape[-2])  # (all true here, but it reads the input)


class Attention(torch.nn.Module):
    def __init__(self, make_mask):
        super().__init__()
        self.make_mask = make_mask
        self.proj = torch.nn.Linear(D, D)

    def forward(self, x):
        return F.scaled_dot_product_attention(self.proj(x), x, x, attn_mask=self.make_mask(x)).sum()


def rel_err(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-6)).item()


def run_rewritten(make_mask):
    """(SDPA calls as rewritten: their (mask, is_causal), loss, gradients) through a backend that rewrites
    Dynamo's graph and runs it, and eager's loss and gradients."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model, x = Attention(make_mask), torch.randn(B, H, S, D)
    calls = []

    def backend(gm, example_inputs):
        DR.run_all(gm)
        calls.extend(DR._sdpa_args(n)[2:] for n in gm.graph.nodes if n.op == "call_function" and n.target in DR._SDPA)
        return gm.forward
    ref = model(x)
    ref.backward()
    ref_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    out = torch.compile(model, backend=backend)(x)
    out.backward()
    assert rel_err(out, ref) < 1e-5
    for p, g in zip(model.parameters(), ref_grads):
        assert rel_err(p.grad, g) < 1e-5
    return calls


@pytest.mark.parametrize("make_mask,expect", [(all_true, (None, False)), (causal, (None, True)),
                                              (causal_additive, (None, True)),
                                              (causal_from_input_shape, (None, True))])
def test_constant_mask_rewritten(make_mask, expect):
    assert run_rewritten(make_mask) == [expect]


@pytest.mark.parametrize("make_mask", [band, from_input])
def test_other_masks_stay(make_mask):
    (mask, is_causal), = run_rewritten(make_mask)
    assert isinstance(mask, torch.fx.Node) and is_causal is False


@pytest.mark.skipif(not evt_lib.has_interpreter(), reason="libevt has no CPU interpreter yet")
def test_causal_mask_through_evt(caplog):
    """backend="evt" logs the rewrite, and the step matches eager."""
    torch._dynamo.reset()
    caplog.set_level(logging.INFO, logger="evt")
    torch.manual_seed(0)
    model, x = Attention(causal), torch.randn(B, H, S, D)
    ref = model(x)
    ref.backward()
    ref_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    out = torch.compile(model, backend="evt")(x)
    out.backward()
    assert "is_causal=True instead" in caplog.text
    assert rel_err(out, ref) < 1e-5
    for p, g in zip(model.parameters(), ref_grads):
        assert rel_err(p.grad, g) < 1e-5
