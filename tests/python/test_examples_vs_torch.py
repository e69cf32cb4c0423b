"""The example models (examples/*.evt) against PyTorch, and `evtc run`.

For every example: the committed file is what examples/gen.py writes; evt parses it, builds the joint
graph, initializes inputs and params (seed 0) and runs the interpreter; the same values go into the PyTorch
model of tests/python/models.py (dropout with evt's own Philox masks), and the loss and the gradient of
every param must agree:
  - fp64 on both sides (EVT_RUN_FP64): relative error (norm-wise) <= 1e-9, a check of the semantics;
  - fp32 on both sides (evt rounds every tensor to f32): relative error <= 1e-4.
Then `evtc run` must train each example (the loss goes down on a fixed batch), and mlp over 20 steps.
"""
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
import models  # noqa: E402
from models import gen  # noqa: E402

from evt_ctypes import Graph  # noqa: E402

EVTC = os.environ.get("EVTC", os.path.join(ROOT, "build", "evtc"))
NAMES = list(gen.BUILDERS)


def rel_err(a, b):
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def example_path(name):
    return os.path.join(ROOT, "examples", name + ".evt")


@pytest.mark.parametrize("name", NAMES)
def test_committed_file_is_generated(name):
    with open(example_path(name)) as f:
        assert f.read() == gen.build(name), f"examples/{name}.evt is stale: run python3 examples/gen.py all"


def evt_and_torch(name, fp64, cfg=None):
    """(evt loss, evt grads by param name, torch loss, torch grads by param name); cfg: knobs other than the
    committed example's (the graph is then generated)."""
    if cfg is None:
        with open(example_path(name)) as f:
            text = f.read()
    else:
        text = gen.build(name, cfg)
    g = Graph(text, name + ".evt")
    g.build_joint()
    sources = [(nm, dt) for nm, dt, _ in g.inputs()]
    params = [g.name(i) for i in range(g.node_count) if g.op(i) == "param"]
    loss_name = g.name(g.outputs()[0])
    vals = g.run(seed=0, fp64=fp64, keep_all=True)  # every node, the initialized sources included
    dtype = torch.float64 if fp64 else torch.float32
    t = {}
    for nm, dt in sources:
        if dt in ("f32", "f16", "bf16"):
            t[nm] = torch.tensor(vals[nm], dtype=dtype, requires_grad=nm in params)
        else:
            t[nm] = torch.tensor(vals[nm].astype(np.int64))
    loss = models.MODELS[name](cfg or gen.DEFAULTS[name], t)
    loss.backward()
    evt_grads = {p: vals["grad." + p] for p in params}
    torch_grads = {p: t[p].grad.detach().double().numpy() for p in params}
    g.close()
    return float(vals[loss_name]), evt_grads, loss.item(), torch_grads


# (name, knobs other than the defaults): the committed examples, and the mlp with the tanh GELU
CASES = [(n, None) for n in NAMES] + [("mlp", dict(gen.DEFAULTS["mlp"], gelu="tanh"))]


@pytest.mark.parametrize("fp64,tol", [(True, 1e-9), (False, 1e-4)], ids=["fp64", "fp32"])
@pytest.mark.parametrize("name,cfg", CASES, ids=[n if c is None else n + "_gelu_tanh" for n, c in CASES])
def test_loss_and_grads_match_torch(name, cfg, fp64, tol):
    loss, grads, tloss, tgrads = evt_and_torch(name, fp64, cfg)
    assert math.isfinite(loss)
    assert abs(loss - tloss) <= tol * max(abs(tloss), 1e-30), f"loss evt {loss} torch {tloss}"
    assert set(grads) == set(tgrads) and grads
    # A gradient that is zero in exact arithmetic (the attention key bias: softmax ignores a per-row
    # constant) holds only rounding noise; for those both sides must be negligible next to the largest
    # gradient of the model instead.
    scale = max(np.linalg.norm(v) for v in tgrads.values())
    bad, checked = [], 0
    for p in grads:
        assert grads[p].shape == tgrads[p].shape, p
        if np.linalg.norm(tgrads[p]) <= 1e-7 * scale:
            if not np.linalg.norm(grads[p]) <= tol * 1e-3 * scale:
                bad.append(f"{p}: should be ~0, evt has norm {np.linalg.norm(grads[p]):.3g}")
            continue
        checked += 1
        e = rel_err(grads[p], tgrads[p])
        if not e <= tol:
            bad.append(f"{p}: relative error {e:.3g}")
    assert not bad, "\n".join(bad)
    assert checked >= len(grads) - 2, "too many zero gradients: the check would prove little"


def test_dropout_masks_are_evts():
    """The reference masks follow kernels/philox.h: a dropout node computed by evt equals x * keep / (1-p)."""
    text = """graph d {
  %x: f32[3,50] = input(init=normal)
  %y: f32[3,50] = dropout(%x, p=0.3, seed=5, offset=11)
  output %y
}"""
    vals = Graph(text, "d.evt").run(seed=1, fp64=True, keep_all=True)
    keep = models.philox_keep(5, 11, (3, 50), 0.3).numpy()
    assert 0 < keep.sum() < keep.size
    np.testing.assert_allclose(vals["y"], vals["x"] * keep / 0.7, rtol=1e-12, atol=0)


def evtc_run(path, *args):
    p = subprocess.run([EVTC, "run", path, *args], capture_output=True, text=True, timeout=600)
    losses = [float(m.group(1)) for m in re.finditer(r"^step \d+ loss (\S+)", p.stdout, re.M)]
    return p, losses


def test_evtc_run_mlp_20_steps_loss_decreases():
    p, losses = evtc_run(example_path("mlp"), "--steps", "20", "--lr", "0.1")
    assert p.returncode == 0, p.stderr
    assert len(losses) == 20
    assert losses[-1] < losses[0], losses
    assert "done: 20 steps" in p.stdout


# Learning rates at which a few SGD steps lower each example's loss on its fixed batch.
RUN_LR = {"mlp": 0.1, "bert_layer": 0.1, "bert_layer_sdpa": 0.1, "vit": 0.1, "xmlcnn": 0.5, "gcn": 0.5,
          "resnet_block": 0.1}


@pytest.mark.parametrize("name", NAMES)
def test_evtc_run_trains_every_example(name):
    p, losses = evtc_run(example_path(name), "--steps", "3", "--lr", str(RUN_LR[name]))
    assert p.returncode == 0, p.stderr
    assert len(losses) == 3 and all(math.isfinite(v) for v in losses)
    assert losses[2] < losses[0], losses


def test_evtc_run_same_seed_same_losses_other_seed_differs():
    a = evtc_run(example_path("mlp"), "--steps", "2", "--seed", "7")[1]
    b = evtc_run(example_path("mlp"), "--steps", "2", "--seed", "7")[1]
    c = evtc_run(example_path("mlp"), "--steps", "2", "--seed", "8")[1]
    assert a == b and a != c


def test_gen_paper_sizes():
    """The knobs reach the paper's configurations (text only: these do not run on the interpreter)."""
    text = gen.build("bert_layer", gen.config("bert_layer", ["--batch", "32", "--seq", "512", "--hidden", "1024",
                                                              "--heads", "16", "--ffn", "4096"])[0])
    assert "%x: f32[32,512,1024] = input(" in text
    assert "%attn.scores: f32[32,16,512,512] = bmm(" in text
    assert "%ffn.fc1.w: f32[1024,4096] = param(" in text
    text = gen.build("xmlcnn", gen.config("xmlcnn", ["--batch", "1024", "--seq", "512", "--emb", "304", "--filters",
                                                      "32", "--hidden", "512", "--labels", "670208"])[0])
    assert "%out.w: f32[512,670208] = param(" in text
    p = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "gen.py"), "vit", "--image", "224", "--patch",
                        "14", "--hidden", "768", "--heads", "12", "--ffn", "3072", "--layers", "12", "--batch", "128"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "%tokens: f32[128,257,768] = concat(" in p.stdout and "%b11.mlp.fc2.w" in p.stdout
    p = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "gen.py"), "bert_layer", "--hidden", "65"],
                       capture_output=True, text=True)
    assert p.returncode == 1 and "inconsistent sizes" in p.stderr


@pytest.mark.parametrize("name", sorted(gen.PAPER))
def test_paper_configuration_checks_and_differentiates(name):
    """Each model at the paper's sizes type-checks and gets its joint graph (no data: nothing is run)."""
    text = gen.build(name, gen.config(name, ["--paper"])[0])
    p = subprocess.run([EVTC, "check", "-"], input=text, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and ": ok," in p.stdout, p.stderr
    p = subprocess.run([EVTC, "grad", "-"], input=text, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    params = re.findall(r"^  %(\S+): \S+ = param\(", text, re.M)
    assert params and all(f"%grad.{q}:" in p.stdout for q in params)


@pytest.mark.parametrize("name", ["mlp", "bert_layer"])
def test_evtc_run_on_printed_joint_graph(name, tmp_path):
    """`evtc grad` output read back is trained as it is and gives the same losses as the forward file."""
    p = subprocess.run([EVTC, "grad", example_path(name)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    joint = tmp_path / "joint.evt"
    joint.write_text(p.stdout)
    a, la = evtc_run(example_path(name), "--steps", "3", "--lr", "0.1")
    b, lb = evtc_run(str(joint), "--steps", "3", "--lr", "0.1")
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    assert "(joint graph built)" in a.stdout and "(joint graph built)" not in b.stdout
    assert la == lb and len(la) == 3


@pytest.mark.parametrize("name", NAMES)
def test_evtc_run_opt_trains_the_same(name):
    """Training the graph after the pass pipeline (--opt) follows the same losses (fp64: passes only
    reassociate floating-point sums)."""
    a, la = evtc_run(example_path(name), "--steps", "4", "--lr", str(RUN_LR[name]), "--fp64")
    b, lb = evtc_run(example_path(name), "--steps", "4", "--lr", str(RUN_LR[name]), "--fp64", "--opt")
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    assert "after the passes" in b.stdout
    assert len(la) == len(lb) == 4
    np.testing.assert_allclose(lb, la, rtol=1e-6, atol=1.5e-6)  # printed with 6 decimals


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("name", ["mlp", "bert_layer", "resnet_block"])
def test_evtc_run_half_precision_from_stdin(name, dtype):
    """gen.py --dtype writes a half-precision model; `evtc run -` reads it from stdin and trains it; the
    first loss is the f32 one up to half-precision rounding."""
    text = gen.build(name, gen.config(name, ["--dtype", dtype])[0])
    assert f"%loss: {dtype}[]" in text
    p = subprocess.run([EVTC, "run", "-", "--steps", "3", "--lr", str(RUN_LR[name])], input=text,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    losses = [float(m.group(1)) for m in re.finditer(r"^step \d+ loss (\S+)", p.stdout, re.M)]
    ref = evtc_run(example_path(name), "--steps", "1")[1]
    assert len(losses) == 3 and losses[2] < losses[0], losses
    assert abs(losses[0] - ref[0]) <= 0.02 * abs(ref[0]), (losses[0], ref[0])
