"""Dropout through torch.compile(backend="evt") on CUDA; run by tests/gpu/run.sh (torch).

    python3 tests/gpu/torch_dropout_gpu.py [--steps N]

Under the default gpu_ops native_dropout runs in evt with evt's own Philox masks, which eager
PyTorch cannot draw, so each step is checked against eager run with evt's mask. The model (test_torch_backend.py's
DropMLP at GPU sizes) also returns the dropped activation h, whose zeros are the mask. Per mode (evt, evt_cgs, evt_cg)
and dtype (bf16 weights, f32): h, the loss and every gradient against eager with that mask (rel = max|a - b| /
max|b|; bf16 1e-2, f32 1e-4), the keep rate (1 - p within 0.01), fresh masks every step, and torch.manual_seed
repeating a step's mask (under evt_cg too). Prints one line per case and a summary; exit status 1 on any failure.
"""
import argparse
import copy
import logging
import os
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, os.path.join(REPO, "tests", "python"))
import evt  # noqa: E402,F401
from evt import backend as B  # noqa: E402
import test_torch_backend as T  # noqa: E402

dev = os.environ.get("EVT_TEST_DEVICE", "cuda")  # "cpu": a smoke test of this script (mode evt, small sizes)
K, H, ROWS = (512, 2048, 4096) if dev == "cuda" else (64, 256, 256)


class Big(T.DropMLP):
    def __init__(self, p, dtype):
        super().__init__(p, dtype)
        self.a, self.b = torch.nn.Linear(K, H, dtype=dtype), torch.nn.Linear(H, 64, dtype=dtype)


class Log(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.msgs = []

    def emit(self, r):
        self.msgs.append(r.getMessage())


LOG = Log()
logging.getLogger("evt").addHandler(LOG)
logging.getLogger("evt").setLevel(logging.INFO)


def rel(a, b):
    a, b = a.detach().float(), b.detach().float()
    if not torch.isfinite(a).all():
        return float("inf")
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-6)).item()


SEEDED = {}  # (mode, dtype) -> the mask drawn right after torch.manual_seed(123)


def case(mode, dtype, steps, p=0.1):
    torch._dynamo.reset()
    torch.manual_seed(0)
    ref = Big(p, dtype).to(dev)
    mod = copy.deepcopy(ref)
    opts = {"evt": None, "evt_cgs": {"cudagraphs": "segments"}, "evt_cg": {"cudagraphs": True}}[mode]
    f = torch.compile(mod, backend="evt", fullgraph=True, options=opts)
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-4
    x, y = torch.randn(ROWS, K, device=dev, dtype=dtype), torch.randint(0, 64, (ROWS,), device=dev)
    B.reset_stats()
    LOG.msgs.clear()
    worst, masks, fails = 0.0, [], []
    for step in range(steps):
        for m in (ref, mod):
            m.zero_grad(set_to_none=True)
        loss, h = f(x, y)
        loss.backward()
        h, loss = h.detach().clone(), loss.detach().clone()
        keep = h != 0
        masks.append(keep)
        rate = keep.float().mean().item()
        if abs(rate - (1 - p)) > (0.01 if dev == "cuda" else 0.03):
            fails.append(f"step {step}: keep rate {rate:.4f}")
        hr = F.gelu(ref.a(x))
        dropped = torch.ops.aten.native_dropout_backward(hr, keep, 1 / (1 - p))
        loss_ref = F.cross_entropy(ref.b(dropped).float(), y)
        loss_ref.backward()
        errs = {"h": rel(h, dropped), "loss": rel(loss, loss_ref)}
        for (n, pr), (_, pe) in zip(ref.named_parameters(), mod.named_parameters()):
            errs["grad " + n] = rel(pe.grad, pr.grad)
        k, v = max(errs.items(), key=lambda kv: kv[1])
        worst = max(worst, v)
        if v > tol:
            fails.append(f"step {step}: {k} rel {v:.2e} > {tol:g}")
    for a in range(len(masks)):
        for b in range(a + 1, len(masks)):
            d = (masks[a] != masks[b]).float().mean().item()
            if abs(d - 2 * p * (1 - p)) > (0.02 if dev == "cuda" else 0.06):
                fails.append(f"steps {a}, {b}: masks differ at {d:.4f} (independent: {2 * p * (1 - p):.4f})")
    again = []
    for _ in range(2):
        torch.manual_seed(123)
        again.append((f(x, y)[1] != 0).clone())
    if not torch.equal(again[0], again[1]):
        fails.append("torch.manual_seed did not repeat the mask")
    SEEDED[(mode, dtype)] = again[0]
    first = SEEDED.get(("evt", dtype))
    if mode != "evt" and first is not None and not torch.equal(first, again[0]):
        fails.append("the mask of torch.manual_seed(123) differs from mode evt's")
    fb = B.STATS.get("torch_nodes_run", 0)
    fails += [m.strip() for m in LOG.msgs if "fallback to PyTorch: native_dropout" in m]
    print(f"{mode:8s} {str(dtype).replace('torch.', ''):9s} worst rel {worst:.2e} (tol {tol:g}); gpu segment runs "
          f"{B.STATS.get('gpu_segment_runs', 0)}, PyTorch-run nodes {fb}, evt launches {B.STATS.get('gpu_launches', 0)}"
          f"{'; ' + '; '.join(fails) if fails else ''} -> {'FAIL' if fails else 'ok'}", flush=True)
    return not fails


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args()
    ok = n = 0
    for mode in ("evt", "evt_cgs", "evt_cg") if dev == "cuda" else ("evt",):
        for dtype in (torch.bfloat16, torch.float32):
            n += 1
            try:
                ok += case(mode, dtype, a.steps)
            except Exception as e:  # noqa: BLE001 (report and go on)
                print(f"{mode:8s} {dtype}: {type(e).__name__}: {str(e)[:400]} -> FAIL", flush=True)
    print(f"dropout on CUDA: {ok} of {n} cases passed")
    sys.exit(0 if ok == n else 1)


if __name__ == "__main__":
    main()
