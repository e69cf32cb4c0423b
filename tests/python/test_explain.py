"""evt.explain: the report of what evt does with a model (segments, PyTorch fallbacks with reasons, the fused
plan's groups, launches and bytes against every op as its own kernel) and its HTML page."""
import os
import shutil
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "python"))
import evt  # noqa: E402


class Head(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)

    def forward(self, x, y):
        h = torch.nn.functional.gelu(self.a(x))
        return torch.nn.functional.cross_entropy(self.b(h).to(torch.bfloat16).float(), y)


def test_explain_reports_segments_groups_and_savings(tmp_path):
    torch.manual_seed(0)
    r = evt.explain(Head(), torch.randn(8, 16), torch.randint(0, 4, (8,)))
    kinds = [m["kind"] for m in r.modules]
    assert kinds == ["forward", "backward"], kinds
    segs = [s for m in r.modules for s in m["segments"]]
    assert segs and all(s["path"] == "interp" and s["plan"] for s in segs), segs
    t, groups = r.totals()
    assert 0 < t["kernels"] <= t["unfused_kernels"] and 0 < t["bytes"] <= t["unfused_bytes"], t
    assert any(k.startswith("pointwise") or k.startswith("row") for k in groups), groups
    # the device memory a GPU program of each segment would hold: an arena no larger than its buffers unshared
    assert all(0 <= s["plan"]["arena_bytes"] <= s["plan"]["unfused_bytes"] and s["plan"]["scratch_bytes"] >= 0
               for s in segs), segs
    # every fused group's own traffic: positive, and within the whole plan's
    fused = [g for s in segs for g in s["plan"]["groups"] if g["path"] != "node-by-node"]
    assert fused and all(0 < g["io_bytes"] <= s["plan"]["unfused_bytes"] for s in segs for g in s["plan"]["groups"]
                         if g["path"] != "node-by-node"), fused
    text = str(r)
    assert "forward:" in text and "backward:" in text and "fused plan" in text, text
    page = r.html(str(tmp_path / "plan.html"))
    body = open(page, encoding="utf-8").read()
    assert "<table>" in body and "gelu" in body, body[:500]
    # the grouped graph: drawn where Graphviz is installed (scripts/setup.sh installs it), else its dot text
    assert ("<svg" in body and "cluster" in body) if shutil.which("dot") else "digraph" in body, body[-500:]


def test_explain_names_the_ops_left_to_pytorch():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    x = torch.randn(4, 8)
    r = evt.explain(lambda t: torch.cumsum(m(t), dim=1), x)  # cumsum has no translation
    fallbacks = [f for mod in r.modules for f in mod["fallbacks"]]
    assert any("cumsum" in op for op, _, _ in fallbacks), fallbacks
    assert "in PyTorch: " in str(r)


def test_explain_plans_the_optimized_segment(monkeypatch):
    """The plan reported is the one the backend runs: of the pass-optimized segment graph, not of its raw text
    (a Linear's weight gradient under autocast is mm -> permute -> permute -> cast in the raw text; the passes
    cancel the permutes)."""
    import importlib
    import re
    E = importlib.import_module("evt.explain")
    texts = []
    real = E.plan_report
    monkeypatch.setattr(E, "plan_report", lambda text, options=None: texts.append(text) or real(text, options))
    torch.manual_seed(0)
    lin = torch.nn.Linear(32, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        evt.explain(lin, torch.randn(8, 32))
    assert texts
    for text in texts:
        permuted = set(re.findall(r"%(\S+): \S+ = permute\(", text))
        twice = [ln for ln in text.splitlines() if re.search(r"= permute\(%(\S+),", ln)
                 and re.search(r"= permute\(%(\S+),", ln).group(1) in permuted]
        assert not twice, twice
