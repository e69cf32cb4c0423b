"""The models people train (bench/e2e/zoo.py: Hugging Face BERT / GPT-2 / LLaMA / LLaMA with grouped-query
attention / ViT, timm ViT and ResNet-18, torchvision ResNet-50, a torch_geometric GCN), compiled with evt's
backend and trained against eager PyTorch on the CPU at small sizes (random weights, fixed seeds).

Each model trains 2 SGD (momentum) and 2 AdamW steps, eager and evt side by side from the same weights and
batches. Each step compares the loss and every gradient:
  - NaN or infinity never passes (evt's or eager's);
  - rel = max|g - g_eager| / max(max|g_eager|, floor) <= 1e-5, where floor is 1e-3 of the model's largest
    gradient: a gradient that is zero in exact arithmetic (an attention key bias: softmax is invariant to a
    shift of a whole row) is rounding noise of ~1e-12 in both, not a relative quantity;
  - where that fails, fp32 eager itself is the noise: eager copies of evt's model (its current weights) run in
    fp32 and in float64, and evt passes if its distance to the float64 gradients is within twice eager fp32's
    (the model's worst gradient) or 1e-5. Batch norm over few values per channel (a ResNet's last stage at
    batch 2) amplifies fp32 rounding to ~1e-3 relative in every implementation.
The backend's report (evt.report_backend: the report of the modules the training compiled) must show evt
segments that ran and nearly all ops in evt; every op left to PyTorch is printed with its reason (pytest -s)
and must be one this file lists for the model, with why (docs/pytorch.md "Models" has the table).
"""
import copy
import math
import os
import sys

import pytest

torch = pytest.importorskip("torch")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "bench", "e2e"))
import evt  # noqa: E402
import zoo  # noqa: E402
from evt import lib as evt_lib  # noqa: E402

pytestmark = pytest.mark.skipif(not evt_lib.has_interpreter(), reason="libevt has no CPU interpreter yet")

torch.set_num_threads(1)
os.environ.setdefault("EVT_CACHE", "0")

TOL = 1e-5
ZERO_GRADIENT_FLOOR = 1e-3
NOISE_FACTOR = 2.0

# Ops each model leaves to PyTorch, and why (a new fallback fails the test; one that goes away does not).
# (Hugging Face models build their attention mask from arange under torch.compile; evt drops a constant one
# before tracing: dynamo_rewrites.py.)
ARANGE = "arange.start_step"           # no evt op (position ids)
HF_ATTENTION = {ARANGE}
ALLOWED_FALLBACKS = {
    "hf_bert": HF_ATTENTION | {"gather.default",                  # token_type_ids buffer gather: no translation
                               "embedding_dense_backward.default"},  # padding_idx=0 (pad_token_id)
    "hf_gpt2": HF_ATTENTION | {"constant_pad_nd.default"},       # the shifted labels' padding
    "hf_llama": HF_ATTENTION | {"constant_pad_nd.default", "cos.default", "sin.default"},  # rotary tables
    "hf_llama_gqa": HF_ATTENTION | {"constant_pad_nd.default", "cos.default", "sin.default"},
    "hf_vit": HF_ATTENTION,
    "timm_vit": set(),
    "timm_resnet": set(),
    "tv_resnet50": set(),
    # the self loops' arange (PyG's scatter_add / gather over a broadcast index run in evt: index_select_backward
    # and index_select)
    "pyg_gcn": {ARANGE},
}
# Models Dynamo traces as one graph (forward and loss together, so the loss can fuse into its head). PyG's GCN
# breaks at its self loops' nonzero (a data-dependent shape).
ONE_GRAPH = set(ALLOWED_FALLBACKS) - {"pyg_gcn"}
MIN_EVT_SHARE = 0.9  # of the ops of the compiled modules, at least this share runs in evt


def _finite(t):
    return bool(torch.isfinite(t).all())


def _rel(a, b, floor):
    return ((a.double() - b.double()).abs().max() / max(b.abs().max().item(), floor)).item()


def _grads(model):
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def _eager_grads(model, args, dtype):
    """(loss, gradients) of an eager copy of model (its current weights) in dtype, on args cast to dtype."""
    m = copy.deepcopy(model).to(dtype)
    for p in m.parameters():
        p.grad = None
    loss = m(*(a.to(dtype) if a.is_floating_point() else a for a in args))
    loss.backward()
    return loss.detach(), _grads(m)


def _worst(errors):
    name = max(errors, key=lambda k: errors[k] if not math.isnan(errors[k]) else math.inf)
    return name, errors[name]


def check_step(step, ref, mod, args, loss_ref, loss):
    """Loss and gradients of evt (mod, loss) against eager (ref, loss_ref) after one backward (module doc)."""
    g_ref, g = _grads(ref), _grads(mod)
    assert set(g) == set(g_ref), (step, set(g_ref) ^ set(g))
    for name in g:
        assert _finite(g_ref[name]), (step, name, "eager's gradient is not finite")
        assert _finite(g[name]), (step, name, "evt's gradient is not finite")
    assert _finite(loss) and _finite(loss_ref), (step, loss.item(), loss_ref.item())
    floor = ZERO_GRADIENT_FLOOR * max(t.abs().max().item() for t in g_ref.values())
    errors = {n: _rel(g[n], g_ref[n], floor) for n in g}
    errors["loss"] = _rel(loss.detach(), loss_ref.detach(), 0.0)
    if _worst(errors)[1] <= TOL:
        return
    # fp32 noise: at evt's weights, eager fp32 and evt each against float64
    l32, g32 = _eager_grads(mod, args, torch.float32)
    l64, g64 = _eager_grads(mod, args, torch.float64)
    noise = {n: _rel(g32[n], g64[n], floor) for n in g}
    noise["loss"] = _rel(l32, l64, 0.0)
    err = {n: _rel(g[n], g64[n], floor) for n in g}
    err["loss"] = _rel(loss.detach(), l64, 0.0)
    bound = max(TOL, NOISE_FACTOR * _worst(noise)[1])
    worst = _worst(err)
    assert worst[1] <= bound, (f"step {step}: {worst[0]}: evt vs float64 {worst[1]:.2e} > {bound:.2e} "
                               f"(eager fp32 vs float64: worst {_worst(noise)}; evt vs eager: {_worst(errors)})")


def train_against_eager(name, sgd_steps=2, adamw_steps=2):
    """Trains zoo model `name` (CI size) eager and with evt; returns evt's Report of the compiled modules."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    work = zoo.make(name, "ci")
    ref = work.model
    mod = copy.deepcopy(ref)
    backend, report = evt.report_backend()
    compiled = torch.compile(mod, backend=backend)
    step = 0
    for make_opt, steps in ((lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9), sgd_steps),
                            (lambda p: torch.optim.AdamW(p, lr=1e-3), adamw_steps)):
        opt_ref, opt = make_opt(ref.parameters()), make_opt(mod.parameters())
        for _ in range(steps):
            args = work.inputs("cpu")
            opt_ref.zero_grad()
            opt.zero_grad()
            loss_ref = ref(*args)
            loss_ref.backward()
            loss = compiled(*args)
            loss.backward()
            check_step(step, ref, mod, args, loss_ref, loss)
            opt_ref.step()
            opt.step()
            step += 1
    return report


def check_report(name, report):
    """evt segments ran, most ops are in evt, and every op left to PyTorch is an expected one (printed)."""
    n_evt, n_torch = report.op_counts()
    reasons = report.fallback_reasons()
    print(f"\n{name}: {n_evt} ops in evt, {n_torch} in PyTorch")
    for op, why in sorted(reasons.items()):
        print(f"  in PyTorch: {op}: {'; '.join(sorted(why))}")
    ran = [s for m in report.modules for s in m["segments"] if s["path"] == "interp"]
    assert ran, f"{name}: no evt segment ran\n{report}"
    assert n_evt >= MIN_EVT_SHARE * (n_evt + n_torch), f"{name}: {n_evt} ops in evt, {n_torch} in PyTorch"
    unexpected = set(reasons) - ALLOWED_FALLBACKS[name]
    assert not unexpected, {op: reasons[op] for op in unexpected}


@pytest.mark.parametrize("name", ["hf_bert", "hf_gpt2", "hf_llama", "hf_llama_gqa", "hf_vit", "timm_vit",
                                  "timm_resnet", "pyg_gcn"])
def test_model_trains_like_eager(name):
    pytest.importorskip({"hf": "transformers", "timm": "timm", "pyg": "torch_geometric"}[name.split("_")[0]])
    check_report(name, train_against_eager(name))


@pytest.mark.parametrize("name", sorted(ONE_GRAPH))
def test_model_is_one_dynamo_graph(name):
    """No graph break: forward and loss in one graph (torch._dynamo.explain, no backend involved)."""
    pytest.importorskip({"hf": "transformers", "timm": "timm", "tv": "torchvision"}[name.split("_")[0]])
    torch._dynamo.reset()
    torch.manual_seed(0)
    work = zoo.make(name, "ci")
    e = torch._dynamo.explain(work.model)(*work.inputs("cpu"))
    assert e.graph_count == 1, [str(b.reason)[:200] for b in e.break_reasons]


def test_torchvision_resnet50_trains_like_eager():
    """ResNet-50 at 2 x 3 x 64 x 64: one SGD and one AdamW step (the interpreter runs its 25M parameters in
    double: seconds per step on 2 cores)."""
    pytest.importorskip("torchvision")
    check_report("tv_resnet50", train_against_eager("tv_resnet50", sgd_steps=1, adamw_steps=1))


class GroupedQueryAttention(torch.nn.Module):
    """Causal attention with 4 query heads over 2 key/value heads through SDPA's enable_gqa (what Hugging Face
    calls when no mask is materialized): evt's sdpa with k, v repeated per head."""

    def __init__(self, d=16, heads=4, kv_heads=2):
        super().__init__()
        self.h, self.kvh, self.dh = heads, kv_heads, d // heads
        self.q, self.kv = torch.nn.Linear(d, d), torch.nn.Linear(d, 2 * kv_heads * self.dh)
        self.out = torch.nn.Linear(d, 3)

    def forward(self, x, y):
        B, S, D = x.shape
        q = self.q(x).view(B, S, self.h, self.dh).transpose(1, 2)
        k, v = (t.view(B, S, self.kvh, self.dh).transpose(1, 2) for t in self.kv(x).chunk(2, dim=-1))
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return torch.nn.functional.cross_entropy(self.out(a.transpose(1, 2).reshape(B, S, D)).flatten(0, 1), y)


def test_grouped_query_attention_runs_in_evt():
    torch._dynamo.reset()
    torch.manual_seed(0)
    ref = GroupedQueryAttention()
    mod = copy.deepcopy(ref)
    backend, report = evt.report_backend()
    compiled = torch.compile(mod, backend=backend, fullgraph=True)
    opt_ref, opt = torch.optim.AdamW(ref.parameters(), lr=1e-2), torch.optim.AdamW(mod.parameters(), lr=1e-2)
    for step in range(3):
        args = (torch.randn(2, 6, 16), torch.randint(0, 3, (12,)))
        for o in (opt_ref, opt):
            o.zero_grad()
        loss_ref = ref(*args)
        loss_ref.backward()
        loss = compiled(*args)
        loss.backward()
        check_step(step, ref, mod, args, loss_ref, loss)
        opt_ref.step()
        opt.step()
    assert report.op_counts()[1] == 0, str(report)


def test_grouped_query_attention_gradient_fallback():
    """evt::sdpa_backward's PyTorch form (a CUDA attention backward left to PyTorch) takes k, v with fewer heads."""
    from evt import aten as A
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    dout = torch.randn(2, 4, 5, 8)
    got = A.sdpa_grad_recompute(dout, q, k, v, True, None)
    qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
    o = torch.nn.functional.scaled_dot_product_attention(qq, kk.repeat_interleave(2, 1), vv.repeat_interleave(2, 1),
                                                         is_causal=True)
    want = torch.autograd.grad(o, (qq, kk, vv), dout)
    for a, b in zip(got, want):
        assert a.shape == b.shape and _rel(a, b, 0.0) <= 1e-6


def test_benchmark_sizes_build():
    """Every model of the GPU benchmark (bench/e2e/zoo_bench.py) builds at its "bench" size (on the meta device:
    no memory), so a config error shows here, not on the GPU machine."""
    for name in zoo.NAMES:
        pytest.importorskip({"hf": "transformers", "timm": "timm", "tv": "torchvision",
                             "pyg": "torch_geometric"}[name.split("_")[0]])
        with torch.device("meta"):
            work = zoo.make(name, "bench")
        assert sum(p.numel() for p in work.model.parameters()) > 0, name
