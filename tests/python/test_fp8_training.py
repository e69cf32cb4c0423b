"""FP8 training (the fp8 pass, evt_options.fp8) on the CPU interpreter: a small MLP (two hidden layers of 256,
batch 256) trained for 100 SGD steps with fp8 on and off, through evtc run and through the PyTorch backend. The
fp8 run must end within a few percent of the f32 run's loss and far below its first loss, and must really have
run its GEMMs in fp8 (different losses; the rewritten graph's fp8 casts)."""
import glob
import os
import re
import subprocess
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EVTC = os.environ.get("EVTC", os.path.join(ROOT, "build", "evtc"))
GRAPH = os.path.join(ROOT, "tests", "graphs", "fp8_mlp.evt")
STEPS = 100
REL = 0.05  # the fp8 run's final loss within 5% of the f32 run's


def evtc_losses(*flags):
    p = subprocess.run([EVTC, "run", GRAPH, "--steps", str(STEPS), "--lr", "0.5", "--every", str(STEPS), *flags],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    m = re.search(r"done: \d+ steps, loss (\S+) -> (\S+),", p.stdout)
    assert m, p.stdout
    return float(m.group(1)), float(m.group(2))


def test_evtc_run_fp8_trains_like_f32():
    first_ref, last_ref = evtc_losses("--opt")
    first, last = evtc_losses("--fp8")
    assert first != first_ref  # the step really ran in fp8
    assert abs(first - first_ref) <= 1e-2 * first_ref
    assert last < 0.05 * first
    assert abs(last - last_ref) <= REL * last_ref, (last, last_ref)


torch = pytest.importorskip("torch")


def torch_losses(options, dump=None):
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import evt  # noqa: F401 (registers the backend)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                torch.nn.ReLU(), torch.nn.Linear(256, 10))
    x, y = torch.randn(256, 256), torch.randint(0, 10, (256,))
    step = torch.compile(lambda: torch.nn.functional.cross_entropy(model(x), y), backend="evt",
                         options=dict(options, dump=dump) if dump else options)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(STEPS):
        loss = step()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_torch_backend_fp8_option_trains_like_f32(monkeypatch):
    monkeypatch.setenv("EVT_CACHE", "0")
    ref = torch_losses({})
    with tempfile.TemporaryDirectory() as dump:
        got = torch_losses({"fp8": "tensorwise"}, dump)
        texts = [open(f).read() for f in glob.glob(os.path.join(dump, "*.opt.evt"))]
    # the two hidden layers: 2 forward GEMMs (4 e4m3 operands), 3 backward GEMMs (3 e5m2 gradients, 3 e4m3)
    casts = {fmt: sum(len(re.findall(rf"{fmt}\[[0-9,]+\] = cast\(", t)) for t in texts) for fmt in ("f8e4m3", "f8e5m2")}
    assert casts["f8e5m2"] >= 2 and casts["f8e4m3"] >= 6, casts
    assert got != ref
    assert got[-1] < 0.5 * got[0]
    assert abs(got[-1] - ref[-1]) <= REL * ref[-1], (got[-1], ref[-1])


def test_fp8_option_values():
    sys.path.insert(0, os.path.join(ROOT, "python"))
    from evt import config

    assert config.parse_options({"fp8": "tensorwise"})["fp8"] == "tensorwise"
    assert config.parse_options({})["fp8"] is None and config.parse_options({"fp8": "off"})["fp8"] is None
    assert config.fp8_pass_flags({"fp8": "tensorwise"}) == config.EVT_PASS_FP8
    with pytest.raises(ValueError, match="fp8 must be"):
        config.parse_options({"fp8": "rowwise"})
