"""torch.compile(backend="evt") on CUDA vs eager PyTorch; run by tests/gpu/run.sh (torch).

    python3 tests/gpu/torch_models_gpu.py MODEL[,MODEL...] [--modes evt,evt_cg,evt_fp32] [--json FILE]

MODEL: a CI model of tests/python/test_torch_backend.py at small sizes. Modes: evt (default flags), evt_cg
({"cudagraphs": True}), evt_cgs ({"cudagraphs": "segments"}), evt_fp32 (no autocast), evt_all ({"gpu_ops": "all"}:
convolutions and attention in evt too; models that have them), evt_sm80 ({"arch": "compute_80"}: the Ampere / Ada
kernels as PTX the driver compiles for the GPU present; the ampere group of run.sh). Eager and compiled train
side by side from the same weights, 2 SGD (momentum) then 2 AdamW steps; every step's loss and parameter gradients
match eager's when rel = max|a - b| / max|b| <= 1e-2 (bf16 autocast) or 1e-3 (fp32). Under bf16 each step starts
from eager's weights, and a result missing 1e-2 whose distance to an fp32 eager copy is at most twice eager bf16's
is "within bf16 noise". One JSON line per (model, mode): matched, the worst rel and where, the segments' paths, the
ops that fell back, launches per step, CUDA-graph captures.
"""
import argparse
import copy
import json
import logging
import os
import sys
import time
import traceback

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, os.path.join(REPO, "tests", "python"))
import evt  # noqa: E402
from evt import backend as B  # noqa: E402
from evt import gpu as G  # noqa: E402
import test_torch_backend as T  # noqa: E402  (the CI models)

dev = os.environ.get("EVT_TEST_DEVICE", "cuda")  # "cpu": a smoke test of this script without a GPU


def models():
    g = torch.Generator().manual_seed(3)
    src, dst = torch.randint(0, 7, (12,), generator=g), torch.randint(0, 7, (12,), generator=g)
    w = torch.rand(12, generator=g)
    adj = T._adj()
    return {
        "mlp": (T.MLP, lambda: (torch.randn(16, 8), torch.randint(0, 4, (16,)))),
        "bert": (T.Bert, lambda: (torch.randn(4, 6, 8), torch.randint(0, 3, (4,)))),
        "vit": (T.ViT, lambda: (torch.randn(4, 3, 4, 4), torch.randint(0, 3, (4,)))),
        "xmlcnn": (T.XMLCNN, lambda: (torch.randint(0, 30, (4, 7)), torch.rand(4, 5).round())),
        "convbn": (T.ConvBN, lambda: (torch.randn(4, 3, 4, 4), torch.randint(0, 3, (4,)))),
        "gcn": (T.GCN, lambda: (adj, torch.randn(7, 6), torch.randint(0, 3, (7,)))),
        "gcn_edges": (T.GCNEdges, lambda: (src, dst, w, torch.randn(7, 6), torch.randint(0, 3, (7,)))),
        "sdpa": (lambda: T.SDPAModel(d=16, heads=2), lambda: (torch.randn(2, 6, 16), torch.randint(0, 3, (12,)))),
    }


ALL_OPS_MODELS = {"sdpa", "convbn", "vit", "xmlcnn"}  # models with attention or convolutions (mode evt_all)


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-6)).item()


class Capture(logging.Handler):
    def __init__(self):
        super().__init__()
        self.msgs = []

    def emit(self, r):
        self.msgs.append(r.getMessage())


def run(name, mode):
    make_model, make_inputs = models()[name]
    amp = mode != "evt_fp32"
    tol = 1e-2 if amp else 1e-3
    opts = {"evt_cg": {"cudagraphs": True}, "evt_cgs": {"cudagraphs": "segments"},
            "evt_all": {"gpu_ops": "all"}, "evt_sm80": {"arch": "compute_80"}}.get(mode)
    torch._dynamo.reset()
    cap = Capture()
    log = logging.getLogger("evt")
    log.addHandler(cap)
    log.setLevel(logging.INFO)
    torch.manual_seed(0)
    ref = make_model().to(dev)
    mod = copy.deepcopy(ref)
    ref32 = copy.deepcopy(ref)  # fp32 eager: measures how far bf16 rounding alone moves eager's gradients
    compiled = (torch.compile(mod, fullgraph=True) if mode == "inductor" else
                torch.compile(mod, backend="evt", fullgraph=True, options=opts))
    worst, where, steps = 0.0, "", []
    noise_ratio, noise_where = 0.0, ""  # max over tensors of rel(evt, fp32) / rel(eager bf16, fp32), and where
    t0 = time.time()
    first_step_s = None
    for make_opt in (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
                     lambda p: torch.optim.AdamW(p, lr=1e-2)):
        opt_ref, opt = make_opt(ref.parameters()), make_opt(mod.parameters())
        for step in range(2):
            args = [a.to(dev) for a in make_inputs()]
            opt_ref.zero_grad()
            opt.zero_grad()
            with torch.autocast(dev, dtype=torch.bfloat16, enabled=amp):
                loss_ref = ref(*args)
            loss_ref.backward()
            if amp:
                for p in ref32.parameters():
                    p.grad = None
                loss32 = ref32(*args)
                loss32.backward()
            B.reset_stats()
            with torch.autocast(dev, dtype=torch.bfloat16, enabled=amp):
                loss = compiled(*args)
            loss.backward()
            if dev == "cuda":
                torch.cuda.synchronize()
            steps.append(dict(B.STATS))
            if first_step_s is None:
                first_step_s = time.time() - t0
            r = rel(loss, loss_ref)
            if r > worst:
                worst, where = r, f"loss (step {len(steps)})"
            if amp:
                noise_ratio = max(noise_ratio, rel(loss, loss32) / max(rel(loss_ref, loss32), 1e-6))
            for (pn, p_ref), (_, p), (_, p32) in zip(ref.named_parameters(), mod.named_parameters(),
                                                    ref32.named_parameters()):
                if p.grad is None:
                    worst, where = float("inf"), f"grad {pn} missing"
                    continue
                r = rel(p.grad, p_ref.grad)
                if r > worst or r != r:
                    worst, where = r, f"grad {pn} (step {len(steps)})"
                nr = rel(p.grad, p32.grad) / max(rel(p_ref.grad, p32.grad), 1e-6) if amp else 0.0
                if nr > noise_ratio:
                    noise_ratio, noise_where = nr, f"grad {pn} (step {len(steps)})"
            opt_ref.step()
            opt.step()
            if amp:  # next step from the same weights (bf16 differences would compound through the optimizer)
                with torch.no_grad():
                    for p_ref, p, p32 in zip(ref.parameters(), mod.parameters(), ref32.parameters()):
                        p.copy_(p_ref)
                        p32.copy_(p_ref)
    log.removeHandler(cap)
    fallbacks = sorted({m.split("fallback to PyTorch: ")[1].split(":")[0] for m in cap.msgs
                        if "fallback to PyTorch:" in m})
    plans = [m for m in cap.msgs if " evt segment(s)" in m]
    last = steps[-1] if steps else {}
    within_noise = bool(amp and noise_ratio <= 2.0)
    return dict(model=name, mode=mode, matched=bool(worst <= tol), rel=worst, worst=where, tol=tol,
                noise_ratio=round(noise_ratio, 3), noise_worst=noise_where, within_bf16_noise=within_noise,
                gpu_segment_runs=last.get("gpu_segment_runs", 0), torch_segment_runs=last.get("torch_segment_runs", 0),
                gpu_launches_per_step=last.get("gpu_launches", 0),
                captures_per_step=[s.get("captures", 0) for s in steps],
                first_step_s=round(first_step_s or 0.0, 2), plans=plans, fallbacks=fallbacks,
                warnings=[m for m in cap.msgs if "failed" in m][:5])


def preflight():
    """The ctypes binding alone: one evt GPU program (mm -> relu, bf16; an int64 gather) against torch."""
    text = ("graph seg {\n  %in.x: bf16[64,32] = input()\n  %in.w: bf16[32,16] = input()\n"
            "  %in.i: i64[8] = input()\n  %mm: bf16[64,16] = mm(%in.x, %in.w)\n  %r: bf16[64,16] = relu(%mm)\n"
            "  %g: bf16[8,16] = index_select(%r, %in.i, dim=0)\n  output %r, %g\n}\n")
    x = torch.randn(64, 32, device=dev, dtype=torch.bfloat16)
    w = torch.randn(32, 16, device=dev, dtype=torch.bfloat16)
    i = torch.randint(0, 64, (8,), device=dev)
    out = []
    for flags in (G.EVT_PROGRAM_FUSED, 0, G.EVT_PROGRAM_FUSED | G.EVT_PROGRAM_CUDA_GRAPH):
        try:
            p = G.Program(text, flags)
            r, g = torch.empty(64, 16, device=dev, dtype=torch.bfloat16), torch.empty(8, 16, device=dev, dtype=torch.bfloat16)
            for _ in range(3):
                p.run([("in.x", x), ("in.w", w), ("in.i", i)], [r, g], torch.cuda.current_stream().cuda_stream)
            torch.cuda.synchronize()
            ref = torch.relu(x.float() @ w.float())
            e1 = ((r.float() - ref).abs().max() / ref.abs().max()).item()
            e2 = (g.float() - r.float()[i]).abs().max().item()
            out.append(f"flags {flags}: rel {e1:.1e}, gather {e2:.1e}, launches {p.launch_count()}, "
                       f"{'ok' if e1 < 1e-2 and e2 == 0 else 'MISMATCH'}")
        except Exception as e:  # noqa: BLE001
            out.append(f"flags {flags}: {type(e).__name__}: {e}"[:300])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", help="comma list of " + ",".join(models()))
    ap.add_argument("--modes", default="evt,evt_cg")
    ap.add_argument("--json")
    a = ap.parse_args()
    print(f"program API in libevt: {G.has_program_api()}", flush=True)
    if dev == "cuda" and G.has_program_api():
        for line in preflight():
            print("preflight (evt_program via ctypes):", line, flush=True)
    for mode in a.modes.split(","):  # modes outermost: every model's first mode before any second mode
        for name in a.models.split(","):
            if mode == "evt_all" and name not in ALL_OPS_MODELS:
                continue
            t0 = time.time()
            try:
                r = run(name, mode)
            except Exception as e:  # noqa: BLE001 (a crash is a result: not matched, with the error)
                r = dict(model=name, mode=mode, matched=False, rel=float("inf"), worst="exception",
                         error=f"{type(e).__name__}: {e}"[:800], trace=traceback.format_exc()[-1500:])
            r["seconds"] = round(time.time() - t0, 1)
            print(json.dumps(r), flush=True)
            if a.json:
                with open(a.json, "a") as f:
                    f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
