"""torch.compile(model, backend="evt") on the CPU: the same losses and gradients as eager PyTorch.

Each model runs 3 SGD steps and then 3 AdamW steps, eager and compiled side by side from the same
initial weights; losses and every gradient must agree to rel 1e-4 (fp32, dropout p=0). The evt log is
captured to check which ops ran in evt and which fell back to PyTorch.
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
import evt  # noqa: E402
from evt import config as C  # noqa: E402
from evt import lib as evt_lib  # noqa: E402

pytestmark = pytest.mark.skipif(not evt_lib.has_interpreter(), reason="libevt has no CPU interpreter yet")

torch.set_num_threads(1)
os.environ.setdefault("EVT_CACHE", "0")  # in-process tests stay off the disk cache; test_disk_cache turns it on


def rel_err(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-6)).item()


def fallbacks(records):
    """Names of the ATen ops the backend logged as falling back to PyTorch."""
    out = set()
    for r in records:
        msg = r.getMessage()
        if "fallback to PyTorch:" in msg:
            out.add(msg.split("fallback to PyTorch: ")[1].split(" ")[0])
    return out


def check_training(make_model, make_inputs, caplog, steps=3, tol=1e-4, options=None):
    """3 SGD + 3 AdamW steps eager vs evt (backend options: options); returns the set of ops that fell back."""
    torch._dynamo.reset()
    caplog.set_level(logging.INFO, logger="evt")
    torch.manual_seed(0)
    ref = make_model()
    mod = copy.deepcopy(ref)
    compiled = torch.compile(mod, backend="evt", fullgraph=True, options=options)
    for make_opt in (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
                     lambda p: torch.optim.AdamW(p, lr=1e-2)):
        opt_ref, opt = make_opt(ref.parameters()), make_opt(mod.parameters())
        for step in range(steps):
            args = make_inputs()
            opt_ref.zero_grad()
            opt.zero_grad()
            loss_ref = ref(*args)
            loss_ref.backward()
            loss = compiled(*args)
            loss.backward()
            assert rel_err(loss.detach(), loss_ref.detach()) <= tol, (step, loss.item(), loss_ref.item())
            for (name, p_ref), (_, p) in zip(ref.named_parameters(), mod.named_parameters()):
                assert p.grad is not None, name
                assert rel_err(p.grad, p_ref.grad) <= tol, (step, name, rel_err(p.grad, p_ref.grad))
            for (name, b_ref), (_, b) in zip(ref.named_buffers(), mod.named_buffers()):
                assert rel_err(b.double(), b_ref.double()) <= tol, (step, name)
            opt_ref.step()
            opt.step()
    msgs = [r.getMessage() for r in caplog.records]
    assert any("evt segment" in m for m in msgs), msgs  # evt actually ran
    return fallbacks(caplog.records)


# ---- models (small sizes: CI has 2 cores) ----------------------------------------------------------------

class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.ln, self.l2, self.out = nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x, y):
        h = self.ln(F.gelu(self.l1(x)))
        h = h + self.l2(h)
        return F.cross_entropy(self.out(h), y)


class Block(nn.Module):
    """A post-LN transformer encoder layer with attention as matmul + softmax."""

    def __init__(self, d=8, heads=2, ff=16):
        super().__init__()
        self.h = heads
        self.qkv, self.o = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.f1, self.f2 = nn.Linear(d, ff), nn.Linear(ff, d)
        self.drop = nn.Dropout(0.0)

    def forward(self, x):
        B, S, D = x.shape
        q, k, v = self.qkv(x).split(D, dim=-1)
        q, k, v = (t.view(B, S, self.h, D // self.h).transpose(1, 2) for t in (q, k, v))
        a = torch.softmax(q @ k.transpose(-1, -2) / (D // self.h) ** 0.5, dim=-1)
        a = (self.drop(a) @ v).transpose(1, 2).reshape(B, S, D)
        x = self.ln1(x + self.o(a))
        return self.ln2(x + self.drop(self.f2(F.gelu(self.f1(x)))))


class Bert(nn.Module):
    def __init__(self):
        super().__init__()
        self.block, self.cls = Block(), nn.Linear(8, 3)

    def forward(self, x, y):
        return F.cross_entropy(self.cls(self.block(x)[:, 0]), y)


class ViT(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.patch = nn.Conv2d(3, d, 2, stride=2)
        self.cls = nn.Parameter(torch.randn(1, 1, d) * 0.1)
        self.pos = nn.Parameter(torch.randn(1, 5, d) * 0.1)
        self.block, self.ln, self.head = Block(d), nn.LayerNorm(d), nn.Linear(d, 3)

    def forward(self, img, y):
        h = self.patch(img).flatten(2).transpose(1, 2)
        h = torch.cat([self.cls.expand(h.shape[0], -1, -1), h], dim=1) + self.pos
        return F.cross_entropy(self.head(self.ln(self.block(h))[:, 0]), y)


class XMLCNN(nn.Module):
    def __init__(self, vocab=30, d=8, labels=5):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.convs = nn.ModuleList([nn.Conv1d(d, 4, k, padding=k // 2) for k in (3, 5)])
        self.fc = nn.Linear(4 * 2 * 2, labels)

    def forward(self, tokens, y):
        h = self.emb(tokens).transpose(1, 2)
        h = torch.cat([F.adaptive_max_pool1d(F.relu(c(h)), 2).flatten(1) for c in self.convs], dim=1)
        return F.binary_cross_entropy_with_logits(self.fc(h), y)


class ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.bn1 = nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4)
        self.c2, self.bn2 = nn.Conv2d(4, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 2 * 2, 3)

    def forward(self, x, y):
        h = F.relu(self.bn1(self.c1(x)))
        h = F.max_pool2d(F.relu(self.bn2(self.c2(h)) + h), 2)
        return F.cross_entropy(self.fc(h.flatten(1)), y)


class GCN(nn.Module):
    """Two graph-convolution layers over a dense normalized adjacency (torch.sparse is not traced by
    dynamo with fullgraph=True: 'Attempted to wrap sparse Tensor')."""

    def __init__(self):
        super().__init__()
        self.l1, self.l2 = nn.Linear(6, 8), nn.Linear(8, 3)

    def forward(self, adj, x, y):
        h = F.relu(adj @ self.l1(x))
        return F.cross_entropy(adj @ self.l2(h), y)


class GCNEdges(nn.Module):
    """The same GCN as message passing over an edge list: gather x[src] (index -> evt index_select),
    scale by the edge weight, scatter-add into dst (index_add_ -> index_put accumulate -> evt
    index_select_backward). Its backward uses the same two ops the other way round."""

    def __init__(self):
        super().__init__()
        self.l1, self.l2 = nn.Linear(6, 8), nn.Linear(8, 3)

    @staticmethod
    def prop(h, src, dst, w):
        # (w in h's dtype: under bf16 autocast h is bf16 and eager index_add_ needs matching dtypes)
        return torch.zeros_like(h).index_add_(0, dst, h[src] * w[:, None].to(h.dtype))

    def forward(self, src, dst, w, x, y):
        h = F.relu(self.prop(self.l1(x), src, dst, w))
        return F.cross_entropy(self.prop(self.l2(h), src, dst, w), y)


def _adj(n=7):
    a = (torch.rand(n, n) < 0.4).float()
    a = ((a + a.t()) > 0).float() + torch.eye(n)
    d = a.sum(1).rsqrt()
    return d[:, None] * a * d[None, :]


# ---- tests ---------------------------------------------------------------------------------------------

def test_registered():
    assert "evt" in torch._dynamo.list_backends(exclude_tags=())


def test_mlp(caplog):
    fb = check_training(MLP, lambda: (torch.randn(4, 8), torch.randint(0, 4, (4,))), caplog)
    assert fb == set(), fb
    if hasattr(evt_lib.lib(), "evt_passes_run_all"):
        assert any("after the graph passes" in r.getMessage() for r in caplog.records)


def test_bert_layer(caplog):
    fb = check_training(Bert, lambda: (torch.randn(2, 5, 8), torch.randint(0, 3, (2,))), caplog)
    assert fb == set(), fb


def test_vit(caplog):
    fb = check_training(ViT, lambda: (torch.randn(2, 3, 4, 4), torch.randint(0, 3, (2,))), caplog)
    assert fb == set(), fb


def test_xml_cnn(caplog):
    fb = check_training(XMLCNN, lambda: (torch.randint(0, 30, (2, 7)), torch.rand(2, 5).round()), caplog)
    assert fb == set(), fb


def test_conv_batchnorm(caplog):
    fb = check_training(ConvBN, lambda: (torch.randn(2, 3, 4, 4), torch.randint(0, 3, (2,))), caplog)
    assert fb == set(), fb


def test_gcn(caplog):
    adj = _adj()
    fb = check_training(GCN, lambda: (adj, torch.randn(7, 6), torch.randint(0, 3, (7,))), caplog)
    assert fb == set(), fb


def test_gcn_edge_list(caplog, tmp_path):
    g = torch.Generator().manual_seed(3)
    src, dst = torch.randint(0, 7, (12,), generator=g), torch.randint(0, 7, (12,), generator=g)
    w = torch.rand(12, generator=g)
    fb = check_training(GCNEdges, lambda: (src, dst, w, torch.randn(7, 6), torch.randint(0, 3, (7,))), caplog,
                        options={"dump": str(tmp_path)})
    assert fb == set(), fb
    # the edge-spmm pass: every scatter-add of messages (2 forward, 2 backward) became an spmm over coo_* indices
    optimized = "".join(p.read_text() for p in tmp_path.glob("*.opt.evt"))
    assert optimized.count(" spmm(") == 4 and "index_select_backward" not in optimized, optimized
    assert "coo_perm(" in optimized and "coo_rowptr(" in optimized, optimized


class WithCumsum(nn.Module):
    """cumsum has no evt op: it (and its backward, a flip-cumsum-flip) must run in PyTorch."""

    def __init__(self):
        super().__init__()
        self.l1, self.l2 = nn.Linear(6, 8), nn.Linear(8, 3)

    def forward(self, x, y):
        h = torch.cumsum(torch.tanh(self.l1(x)), dim=1)
        return F.cross_entropy(self.l2(h), y)


def test_unsupported_op_falls_back(caplog):
    fb = check_training(WithCumsum, lambda: (torch.randn(4, 6), torch.randint(0, 3, (4,))), caplog)
    assert "cumsum.default" in fb, fb
    msgs = [r.getMessage() for r in caplog.records]
    assert any("evt segment" in m for m in msgs)


def test_evt_log_env(tmp_path):
    """EVT_LOG=1 prints the joint-graph histogram and the fallbacks on stderr."""
    import subprocess
    code = ("import torch, torch.nn.functional as F, evt\n"
            "w = torch.randn(3, 4, requires_grad=True)\n"
            "f = torch.compile(lambda x: torch.cumsum(x @ w, 1).sum(), backend='evt', fullgraph=True)\n"
            "f(torch.randn(2, 3)).backward()\n")
    env = dict(os.environ, EVT_LOG="1",
               PYTHONPATH=os.path.join(os.path.dirname(evt.__file__), "..") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "[evt] joint graph:" in r.stderr
    assert "fallback to PyTorch: cumsum.default" in r.stderr


def test_segment_cache():
    """Two compilations of the same graph reuse the parsed evt segments (keyed by text: shapes, dtypes)."""
    from evt import segment
    torch._dynamo.reset()
    lin = nn.Linear(4, 3)
    x = torch.randn(2, 4)
    torch.compile(lin, backend="evt")(x).sum().backward()
    n = len(segment._GRAPHS)
    torch._dynamo.reset()
    torch.compile(copy.deepcopy(lin), backend="evt")(x).sum().backward()
    assert len(segment._GRAPHS) == n
    torch.compile(copy.deepcopy(lin), backend="evt", dynamic=False)(torch.randn(5, 4)).sum().backward()
    assert len(segment._GRAPHS) > n  # new shapes: new segments


def test_dump_option(tmp_path):
    """options={"dump": dir} writes each segment's text (<hash>.evt) and its optimized form (<hash>.opt.evt)."""
    torch._dynamo.reset()
    lin = nn.Linear(4, 3)
    torch.compile(lin, backend="evt", options={"dump": str(tmp_path / "d")})(torch.randn(2, 4)).sum().backward()
    texts = sorted((tmp_path / "d").glob("*.evt"))
    plain = [p for p in texts if not p.name.endswith(".opt.evt")]
    assert plain and len(texts) == 2 * len(plain), texts
    assert all(p.read_text().startswith("graph seg {") for p in plain)


class SDPAModel(nn.Module):
    """Causal attention through F.scaled_dot_product_attention (CPU flash attention in the graph)."""

    def __init__(self, d=8, heads=2):
        super().__init__()
        self.h, self.qkv, self.out = heads, nn.Linear(d, 3 * d), nn.Linear(d, 3)

    def forward(self, x, y):
        B, S, D = x.shape
        q, k, v = (t.view(B, S, self.h, D // self.h).transpose(1, 2) for t in self.qkv(x).split(D, dim=-1))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, S, D)
        return F.cross_entropy(self.out(a).flatten(0, 1), y)


def test_sdpa_causal(caplog):
    fb = check_training(SDPAModel, lambda: (torch.randn(2, 5, 8), torch.randint(0, 3, (10,))), caplog)
    assert fb == set(), fb


def test_rejected_translation_falls_back(caplog, monkeypatch):
    """A translation the evt parser rejects (here: a deliberately wrong one for relu) moves that node to
    PyTorch; the rest still runs in evt and the step stays exact."""
    from evt import aten as A
    monkeypatch.setitem(A.TABLE, torch.ops.aten.relu, lambda b, node, used: b.result("sum", [b.val(node.args[0])]))
    fb = check_training(GCN, lambda: (_adj(), torch.randn(7, 6), torch.randint(0, 3, (7,))), caplog)
    assert fb == {"relu.default"}, fb
    assert any("rejected by evt" in r.getMessage() for r in caplog.records)


def test_runtime_failure_falls_back(caplog, monkeypatch):
    """If the interpreter fails at run time the segment's nodes run in PyTorch (logged), still exact."""
    def fail(self, inputs, outputs):
        raise evt_lib.EvtError("injected failure")
    monkeypatch.setattr(evt_lib.Graph, "run", fail)
    check_training(MLP, lambda: (torch.randn(4, 8), torch.randint(0, 4, (4,))), caplog, steps=1)
    assert any("injected failure" in r.getMessage() for r in caplog.records)


def test_dynamic_shapes(caplog):
    """dynamic=True: the graph has symbolic sizes; evt specializes a plan per concrete batch size."""
    torch._dynamo.reset()
    caplog.set_level(logging.INFO, logger="evt")
    torch.manual_seed(0)
    ref = Bert()
    mod = copy.deepcopy(ref)
    compiled = torch.compile(mod, backend="evt", dynamic=True)
    for n in (4, 3, 4):
        x, y = torch.randn(n, 5, 8), torch.randint(0, 3, (n,))
        ref.zero_grad()
        mod.zero_grad()
        loss_ref = ref(x, y)
        loss_ref.backward()
        loss = compiled(x, y)
        loss.backward()
        assert rel_err(loss.detach(), loss_ref.detach()) <= 1e-4
        for (name, p_ref), (_, p) in zip(ref.named_parameters(), mod.named_parameters()):
            assert rel_err(p.grad, p_ref.grad) <= 1e-4, name
    msgs = [r.getMessage() for r in caplog.records]
    assert sum("specialized to" in m for m in msgs) == 4, msgs  # fw + bw for n=4 and n=3; n=4 again is cached
    assert fallbacks(caplog.records) == set()


_LN_W, _LN_B = torch.linspace(0.5, 1.5, 6).view(2, 3), torch.linspace(-1, 1, 6).view(2, 3)
ELEMENTWISE_CASES = {
    "clamp": lambda t: t.clamp(-0.5, 0.5),
    "hardtanh": F.hardtanh,  # backward: logical/bitwise ops on bool masks
    "leaky_relu": lambda t: F.leaky_relu(t, 0.1),
    "elu": F.elu,
    "softplus_log1p": lambda t: torch.log1p(t.exp()),
    "var": lambda t: t.var(1, keepdim=True) + t,
    "norm": lambda t: t.norm(dim=1, keepdim=True) * t,
    "layer_norm_2d": lambda t: F.layer_norm(t.view(4, 2, 3), [2, 3]).view(4, 6),
    "layer_norm_2d_affine": lambda t: F.layer_norm(t.view(4, 2, 3), [2, 3], _LN_W, _LN_B).view(4, 6),
    "rms_norm": lambda t: F.rms_norm(t, [6]),
    "avg_pool": lambda t: F.avg_pool2d(t.view(1, 4, 2, 3), 2, 1).flatten(),
    "mse": lambda t: F.mse_loss(t, torch.ones(4, 6)).expand(3),
}


@pytest.mark.parametrize("name", sorted(ELEMENTWISE_CASES))
def test_more_ops(name, caplog):
    """Ops beyond the six models: translated (no fallback) and exact, forward and backward."""
    torch._dynamo.reset()
    caplog.set_level(logging.INFO, logger="evt")
    fn = ELEMENTWISE_CASES[name]
    torch.manual_seed(1)
    x = torch.randn(4, 6, requires_grad=True)
    w = torch.randn_like(fn(x.detach()))

    def f(t):
        return (fn(t) * w).sum()
    ref = f(x)
    (g_ref,) = torch.autograd.grad(ref, x)
    got = torch.compile(f, backend="evt", fullgraph=True)(x)
    (g,) = torch.autograd.grad(got, x)
    assert rel_err(got.detach(), ref.detach()) <= 1e-4
    assert rel_err(g, g_ref) <= 1e-4
    assert fallbacks(caplog.records) == set()


def test_batchnorm_eval_no_grad(caplog):
    """Inference (eval BatchNorm, no_grad) goes through the same path (fw compiler only)."""
    torch._dynamo.reset()
    caplog.set_level(logging.INFO, logger="evt")
    torch.manual_seed(0)
    m = ConvBN()
    x, y = torch.randn(2, 3, 4, 4), torch.randint(0, 3, (2,))
    m(x, y)  # moves the running statistics away from their initial values
    m.eval()
    c = torch.compile(copy.deepcopy(m), backend="evt", fullgraph=True)
    with torch.no_grad():
        assert rel_err(c(x, y), m(x, y)) <= 1e-4
    assert fallbacks(caplog.records) == set()


def test_outputs_views_and_input_grads(caplog):
    """Several outputs (one a transposed view, one an input passed through), a gradient for a data input,
    and a parameter the loss does not use (its gradient stays None): the structure PyTorch expects."""
    torch._dynamo.reset()
    caplog.set_level(logging.INFO, logger="evt")
    torch.manual_seed(0)
    lin, unused = nn.Linear(6, 4), nn.Parameter(torch.randn(3))

    def f(x, y):
        logits = lin(x)
        return F.cross_entropy(logits, y), logits.t(), y

    x0, y = torch.randn(5, 6), torch.randint(0, 4, (5,))
    res = []
    for fn in (f, torch.compile(f, backend="evt", fullgraph=True)):
        lin.zero_grad()
        x = x0.clone().requires_grad_()
        loss, lt, yy = fn(x, y)
        (loss + lt.square().sum()).backward()
        assert lt.shape == (4, 5) and yy.dtype == torch.int64 and torch.equal(yy, y)
        res.append((loss.detach(), lt.detach(), x.grad, lin.weight.grad.clone(), lin.bias.grad.clone()))
    for a, b in zip(*res):
        assert rel_err(b, a) <= 1e-4
    assert unused.grad is None
    assert fallbacks(caplog.records) == set()


def test_disk_cache(tmp_path):
    """A second fresh process reuses the first one's segments from $EVT_CACHE_DIR (hits, no misses, no
    passes rerun) with the same loss and gradients as eager; a corrupted entry is recompiled."""
    import subprocess
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cache_step.py")
    env = dict(os.environ, EVT_LOG="1", EVT_CACHE="1", EVT_CACHE_DIR=str(tmp_path))

    def step():
        r = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        assert float(r.stdout.split("maxrel ")[1].split()[0]) <= 1e-4, r.stdout
        return r.stderr

    cold = step()
    entries = sorted((tmp_path / "torch").glob("*.json"))
    assert cold.count("disk cache miss") == len(entries) >= 2, (cold, entries)
    assert "disk cache hit" not in cold
    assert not list((tmp_path / "torch").glob(".tmp-*"))  # atomic writes leave no temp files
    warm = step()
    assert warm.count("disk cache hit") == len(entries) and "disk cache miss" not in warm, warm
    import json
    entries[0].write_text(entries[0].read_text()[:-40] + "garbage")  # truncated JSON
    e1 = json.loads(entries[1].read_text())
    e1["text"] = e1["text"].replace("graph", "grpah", 1)  # valid JSON, evt text the parser rejects
    entries[1].write_text(json.dumps(e1))
    bad = step()
    assert bad.count("ignoring corrupt entry") == 2 and bad.count("disk cache hit") == len(entries) - 2, bad
    assert step().count("disk cache hit") == len(entries)  # the recompiled entry was rewritten
    env["EVT_CACHE"] = "0"
    off = step()
    assert "disk cache" not in off


def test_disk_cache_detects_an_edited_entry(tmp_path):
    """An entry whose text was edited (tanh -> sigmoid: still a valid graph of the same nodes) is detected by its
    checksum, deleted with a warning and recompiled: the step keeps eager's loss and gradients."""
    import subprocess
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cache_step.py")
    env = dict(os.environ, EVT_LOG="1", EVT_CACHE="1", EVT_CACHE_DIR=str(tmp_path))

    def step():
        r = subprocess.run([sys.executable, script, "tanh"], env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        assert float(r.stdout.split("maxrel ")[1].split()[0]) <= 1e-4, r.stdout + r.stderr
        return r.stderr

    step()
    edited = [p for p in (tmp_path / "torch").glob("*.json") if "tanh(" in p.read_text()]
    assert edited
    for p in edited:
        p.write_text(p.read_text().replace("tanh(", "sigmoid("))
    bad = step()
    assert bad.count("checksum") == len(edited) and "disk cache hit" in bad, bad
    assert all("sigmoid(" not in p.read_text() for p in edited)  # deleted and written again
    assert "checksum" not in step()


# ---- the CUDA placement and layout rules, run on the interpreter (config.SIMULATE_CUDA_RULES) ------------

@pytest.mark.parametrize("name", ["bert", "vit", "xmlcnn", "convbn", "sdpa"])
def test_cuda_rules_simulated_on_cpu(name, caplog, monkeypatch):
    """The CUDA-only rewrites (PyTorch placement of convolution / attention / pooling / batch norm, the
    layer-norm backward recomputing its statistics, the q/k/v gradient stack, data movement of PyTorch-made
    values, view chains, channels-last / transposed input declarations) applied to CPU tensors: the same
    training steps as the CI tests still match eager."""
    monkeypatch.setattr(C, "SIMULATE_CUDA_RULES", True)
    models = {
        "bert": (Bert, lambda: (torch.randn(2, 5, 8), torch.randint(0, 3, (2,)))),
        "vit": (ViT, lambda: (torch.randn(2, 3, 4, 4), torch.randint(0, 3, (2,)))),
        "xmlcnn": (XMLCNN, lambda: (torch.randint(0, 30, (2, 7)), torch.rand(2, 5).round())),
        "convbn": (ConvBN, lambda: (torch.randn(2, 3, 4, 4).to(memory_format=torch.channels_last),
                                    torch.randint(0, 3, (2,)))),
        "sdpa": (SDPAModel, lambda: (torch.randn(2, 5, 8), torch.randint(0, 3, (10,)))),
    }
    make_model, make_inputs = models[name]
    fb = check_training(make_model, make_inputs, caplog, steps=2)
    msgs = [r.getMessage() for r in caplog.records]
    if name in ("vit", "xmlcnn", "convbn"):
        assert any(f.startswith("convolution") for f in fb) and any("reference library" in m for m in msgs), fb
    if name == "sdpa":
        assert any("reference library" in m and "sdpa_backward" in m for m in msgs), fb


def test_cuda_batch_norm_in_evt_simulated_on_cpu(caplog, monkeypatch):
    """gpu_ops naming "batch_norm" (simulated CUDA rules, channels-last): the batch norms and their backward stay
    in evt segments (no batch-norm fallback; the convolutions and pooling still run in PyTorch), and training,
    the running statistics included, matches eager."""
    monkeypatch.setattr(C, "SIMULATE_CUDA_RULES", True)
    fb = check_training(ConvBN, lambda: (torch.randn(2, 3, 4, 4).to(memory_format=torch.channels_last),
                                         torch.randint(0, 3, (2,))), caplog, steps=2,
                        options={"gpu_ops": ("batch_norm", "dropout")})
    assert any(f.startswith("convolution") for f in fb), fb
    assert not any("batch_norm" in f for f in fb), fb


@pytest.mark.parametrize("affine", [False, True])
def test_batch_norm_backward_from_saved_statistics(affine, caplog):
    """native_batch_norm_backward is translated from the forward's saved mean / invstd (x̂ without a statistics
    pass over x, as PyTorch's kernel), with and without the affine weight: training matches eager."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.c, self.bn = nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8, affine=affine)
            self.fc = nn.Linear(8, 3)

        def forward(self, x, y):
            return F.cross_entropy(self.fc(F.relu(self.bn(self.c(x))).mean((2, 3))), y)
    check_training(M, lambda: (torch.randn(4, 3, 5, 5), torch.randint(0, 3, (4,))), caplog, steps=2)


def test_cross_entropy_is_finite_for_far_logits():
    """A target whose logit is 200 below its row's max: its probability underflows f32, so log(softmax) there is
    -inf; evt's loss (one pass: (max - x[t]) - log(max(softmax))) equals eager's finite value, and so do the
    gradients (the log-probabilities are saved for the backward: the one-pass form is the one taken)."""
    torch._dynamo.reset()
    x = torch.zeros(4, 16)
    x[0, 0] = 200.0
    t = torch.tensor([3, 1, 2, 3])

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.eye(16))

        def forward(self, x, t):
            return torch.nn.functional.cross_entropy(x @ self.w, t)
    ref, m = M(), M()
    want = ref(x, t)
    want.backward()
    got = torch.compile(m, backend="evt")(x, t)
    got.backward()
    assert torch.isfinite(got) and abs(got.item() - want.item()) <= 1e-4 * abs(want.item())
    assert torch.allclose(m.w.grad, ref.w.grad, rtol=1e-4, atol=1e-6)


def test_returned_log_softmax_is_finite_for_far_logits():
    """A module that returns its log-probabilities (mark_returned_log_softmax): where a probability underflows f32
    (a logit 200 below its row's max) evt's value is PyTorch's finite one (x - max - log(sum(exp(x - max)))), not
    log(softmax(x)) = -inf; in training (the gradient matches eager) and under no_grad."""
    torch._dynamo.reset()
    x = torch.zeros(4, 16)
    x[0, 0] = 200.0

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.eye(16))

        def forward(self, x):
            return torch.nn.functional.log_softmax(x @ self.w, dim=1)
    ref, m = M(), M()
    want, got = ref(x), torch.compile(m, backend="evt")(x)
    assert torch.isfinite(got).all() and torch.allclose(got, want, rtol=1e-5, atol=1e-5)
    g = torch.randn(4, 16)
    want.backward(g)
    got.backward(g)
    assert torch.allclose(m.w.grad, ref.w.grad, rtol=1e-4, atol=1e-5)
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(M(), backend="evt")(x)
    assert torch.isfinite(got).all() and torch.allclose(got, want.detach(), rtol=1e-5, atol=1e-5)


class DropMLP(nn.Module):
    """Linear -> GELU -> dropout(p) -> Linear -> cross entropy; also returns the dropped activation, whose zeros
    are the mask (GELU of random floats is never exactly 0)."""

    def __init__(self, p, dtype=torch.float32):
        super().__init__()
        self.p = p
        self.a, self.b = nn.Linear(16, 32, dtype=dtype), nn.Linear(32, 4, dtype=dtype)

    def forward(self, x, y):
        h = F.dropout(F.gelu(self.a(x)), self.p, training=True)
        return F.cross_entropy(self.b(h).float(), y), h


def test_native_dropout_runs_in_evt_with_fresh_reproducible_masks(caplog):
    """native_dropout translates (evt's Philox masks, mask = u >= p): the forward and backward agree with eager
    PyTorch run with evt's mask, each step draws a fresh mask with keep rate 1 - p, and torch.manual_seed
    repeats a step's masks (the RNG step of every run comes from PyTorch's generator)."""
    torch._dynamo.reset()
    caplog.set_level(logging.INFO, logger="evt")
    p = 0.25
    torch.manual_seed(0)
    ref = DropMLP(p)
    mod = copy.deepcopy(ref)
    f = torch.compile(mod, backend="evt", fullgraph=True)
    x, y = torch.randn(64, 16), torch.randint(0, 4, (64,))
    masks = []
    for step in range(3):
        for m in (ref, mod):
            m.zero_grad()
        loss, h = f(x, y)
        loss.backward()
        keep = h != 0
        masks.append(keep)
        assert abs(keep.float().mean().item() - (1 - p)) < 0.05, keep.float().mean()
        hr = F.gelu(ref.a(x))
        dropped = hr * keep / (1 - p)  # eager with evt's mask
        assert rel_err(h.detach(), dropped.detach()) <= 1e-5
        loss_ref = F.cross_entropy(ref.b(dropped), y)
        loss_ref.backward()
        assert rel_err(loss.detach(), loss_ref.detach()) <= 1e-5
        for (n, p_ref), (_, p_evt) in zip(ref.named_parameters(), mod.named_parameters()):
            assert rel_err(p_evt.grad, p_ref.grad) <= 1e-4, (step, n)
    assert not fallbacks(caplog.records), fallbacks(caplog.records)
    for a, b in ((0, 1), (1, 2), (0, 2)):  # fresh masks: independent ones differ at 2p(1 - p) = 37.5%
        assert (masks[a] != masks[b]).float().mean().item() > 0.25
    again = []
    for _ in range(2):
        torch.manual_seed(123)
        again.append(f(x, y)[1] != 0)
    assert torch.equal(again[0], again[1])


def test_dropout_under_activation_checkpointing_backward_uses_the_forward_mask():
    """A dropout inside torch.utils.checkpoint: the backward recomputes the block, and its mask must be the one the
    forward drew (PyTorch wraps the two in run_and_save_rng_state / run_with_rng_state, which run in PyTorch), or
    the gradient would be silently wrong. dW is checked against x^T (mask / (1 - p) * tanh'(xW)) with the mask read
    from the forward's output, over two steps (fresh masks)."""
    from torch.utils.checkpoint import checkpoint
    torch._dynamo.reset()
    torch.manual_seed(0)
    w = torch.randn(16, 32, requires_grad=True)

    def block(x):
        return F.dropout(torch.tanh(x @ w), 0.5, training=True)

    f = torch.compile(lambda x: checkpoint(block, x, use_reentrant=False), backend="evt")
    x = torch.randn(8, 16)
    masks = []
    for _ in range(2):
        w.grad = None
        y = f(x)
        y.sum().backward()
        mask = (y != 0).float()
        t = torch.tanh(x @ w).detach()
        assert torch.allclose(w.grad, x.t() @ (mask * 2.0 * (1 - t * t)), rtol=1e-5, atol=1e-5)
        masks.append(mask)
    assert not torch.equal(masks[0], masks[1])
    torch._dynamo.reset()


def test_native_dropout_bf16_scales_in_f32(caplog):
    """A bf16 dropout and its backward scale by 1/(1 - p) as PyTorch does (f32, not the bf16-rounded 1.109375):
    eager with evt's mask gives the same bits for the activation and matching gradients."""
    torch._dynamo.reset()
    p = 0.1
    torch.manual_seed(0)
    ref = DropMLP(p, torch.bfloat16)
    mod = copy.deepcopy(ref)
    f = torch.compile(mod, backend="evt", fullgraph=True)
    x, y = torch.randn(64, 16, dtype=torch.bfloat16), torch.randint(0, 4, (64,))
    loss, h = f(x, y)
    loss.backward()
    keep = h != 0
    hr = F.gelu(ref.a(x))
    dropped = torch.ops.aten.native_dropout_backward(hr, keep, 1 / (1 - p))  # hr * keep * scale as PyTorch's dropout
    assert torch.equal(h, dropped)
    F.cross_entropy(ref.b(dropped).float(), y).backward()
    for (n, p_ref), (_, p_evt) in zip(ref.named_parameters(), mod.named_parameters()):
        assert rel_err(p_evt.grad.float(), p_ref.grad.float()) <= 2e-2, n


def test_bert_block_with_dropout_runs_whole_in_evt(caplog):
    """The CI Bert block with dropout 0.1 on its attention probabilities and FFN output (4-d and 3-d
    native_dropout, two sites in one segment): nothing falls back, torch.manual_seed repeats the step bit for bit
    (loss and every gradient) and another seed draws other masks."""
    torch._dynamo.reset()
    caplog.set_level(logging.INFO, logger="evt")
    torch.manual_seed(0)
    m = Bert()
    m.block.drop.p = 0.1
    f = torch.compile(m, backend="evt", fullgraph=True)
    x, y = torch.randn(4, 6, 8), torch.randint(0, 3, (4,))
    runs = []
    for seed in (1, 1, 2):
        m.zero_grad()
        torch.manual_seed(seed)
        loss = f(x, y)
        loss.backward()
        runs.append([loss.detach()] + [p.grad.clone() for p in m.parameters()])
    assert not fallbacks(caplog.records), fallbacks(caplog.records)
    assert all(torch.isfinite(t).all() for t in runs[0])
    assert all(torch.equal(a, b) for a, b in zip(runs[0], runs[1]))
    assert not torch.equal(runs[0][0], runs[2][0])
    sites = [r.getMessage() for r in caplog.records if "native_dropout" in r.getMessage()]
    assert any("native_dropout.default x2" in s for s in sites), sites


def test_evt_check_compares_segments_with_pytorch(caplog, monkeypatch):
    """options={"check": True} reruns each segment in PyTorch: silent on a correct step, a warning naming the
    node when evt's values are off (here every interpreter result + 1), and outputs that depend on a dropout of
    the segment (evt's own masks) are left out, logged once."""
    caplog.set_level(logging.INFO, logger="evt")
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    torch._dynamo.reset()
    torch.manual_seed(0)
    f = torch.compile(DropMLP(0.0), backend="evt", fullgraph=True, options={"check": True})
    f(x, y)[0].backward()
    assert not [r for r in caplog.records if "evt check" in r.getMessage()]
    run = evt_lib.Graph.run
    monkeypatch.setattr(evt_lib.Graph, "run", lambda self, i, o: [t + 1 for t in run(self, i, o)])
    torch._dynamo.reset()
    f = torch.compile(DropMLP(0.0), backend="evt", fullgraph=True, options={"check": True})
    f(x, y)
    assert any("evt check" in r.getMessage() and r.levelname == "WARNING" for r in caplog.records)
    monkeypatch.setattr(evt_lib.Graph, "run", run)
    caplog.clear()
    torch._dynamo.reset()
    f = torch.compile(DropMLP(0.3), backend="evt", fullgraph=True, options={"check": True})
    f(x, y)[0].backward()
    msgs = [r.getMessage() for r in caplog.records if "evt check" in r.getMessage()]
    assert msgs and all("not compared" in s for s in msgs), msgs


def test_slow_interpreter_warns_once(caplog, monkeypatch):
    """Each interpreter segment's second run is timed against the same ops in PyTorch; one that is SLOW_RATIO
    times slower (and takes SLOW_MIN_S or more) logs one warning per process: the interpreter is the reference,
    not a fast path. With the thresholds at 0 every run counts as slow: exactly one warning in three steps; with
    the defaults a tiny MLP (well under SLOW_MIN_S a segment) says nothing."""
    from evt import segment as S
    caplog.set_level(logging.INFO, logger="evt")

    def steps():
        torch._dynamo.reset()
        torch.manual_seed(0)
        f = torch.compile(MLP(), backend="evt", fullgraph=True)
        for _ in range(3):
            f(torch.randn(4, 8), torch.randint(0, 4, (4,))).backward()
        return [r for r in caplog.records if "it is the reference, not a fast path" in r.getMessage()]

    monkeypatch.setattr(S, "_slow_warned", False)
    assert not steps()
    monkeypatch.setattr(S, "SLOW_RATIO", 0.0)
    monkeypatch.setattr(S, "SLOW_MIN_S", 0.0)
    warned = steps()
    assert len(warned) == 1 and warned[0].levelname == "WARNING", [r.getMessage() for r in warned]
    assert "slower than PyTorch eager" in warned[0].getMessage()
