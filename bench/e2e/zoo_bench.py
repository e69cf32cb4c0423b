"""The models people train (zoo.py: Hugging Face BERT / GPT-2 / LLaMA / LLaMA-GQA / ViT, timm ViT-B and
ResNet-18, torchvision ResNet-50, a torch_geometric GCN) at realistic sizes on CUDA: eager, torch.compile and
evt side by side, with evt's gradients checked against eager's and the ops evt left to PyTorch listed.

    python3 bench/e2e/zoo_bench.py                               # every model; modes eager,inductor,evt
    python3 bench/e2e/zoo_bench.py --models hf_llama_gqa,tv_resnet50 --modes eager,evt,evt_cg
    python3 bench/e2e/zoo_bench.py --iters 5 --timeout 900 --out bench/logs

Needs a CUDA GPU and the pinned model libraries (requirements-models.txt; scripts/setup.sh installs them). Every
model is built from a config with random weights: nothing is downloaded. Each model runs in a child process
under --timeout (a hang, an out-of-memory or a long compile is reported and the others still run); the modes run
one after the other in that process from the same initial weights (seed 0) and the same batch.
A step is run.py's: gradients set to None, forward + backward of the loss under bf16 autocast (the GCN in fp32),
no optimizer. Per mode: median ms/step over --iters steps after --warmup (CUDA events), the first step's time
(compile included), peak memory (PyTorch's allocator) and the device memory held outside it after the timed steps
(the CUDA context, cuBLAS / cuDNN workspaces, evt's own buffers), the gradient match of the first step against eager (rel = max over parameters of
max|g - g_eager| / max|g_eager|; torch.compile's own value is the bf16 noise level; NaN is reported as such), and
for evt modes the ops in evt segments / in PyTorch and every op left to PyTorch with its reason
(evt.report_backend). Prints a markdown table and writes <out>/zoo_<tag>.json (after every model).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "python"))

MODES = ("eager", "inductor", "evt", "evt_cg")
EVT_OPTIONS = {"evt": None, "evt_cg": {"cudagraphs": True}}


def _compiled(model, mode):
    """(callable, evt Report or None) of model for mode."""
    import torch
    if mode == "eager":
        return model, None
    if mode == "inductor":
        return torch.compile(model), None
    import evt
    backend, report = evt.report_backend(EVT_OPTIONS[mode])
    return torch.compile(model, backend=backend), report


def _grads(model):
    return {n: p.grad.detach().float().clone() for n, p in model.named_parameters() if p.grad is not None}


def _grad_rel(grads, ref):
    """(worst rel over parameters, its name); a NaN or a missing gradient is the worst."""
    worst, where = 0.0, ""
    for n, r in ref.items():
        g = grads.get(n)
        if g is None:
            return float("inf"), f"{n}: no gradient"
        rel = ((g - r).abs().max() / r.abs().max().clamp_min(1e-12)).item()
        if rel != rel:
            return float("nan"), n
        if rel > worst:
            worst, where = rel, n
    return worst, where


def run_mode(name, mode, a, ref_grads):
    """One mode of one model: a fresh model (seed 0), its first step (gradients against eager's), timed steps."""
    import torch
    import run as R
    import zoo
    torch._dynamo.reset()
    R._release_evt()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(0)
    work = zoo.make(name, "bench")
    model = work.model.cuda().train()
    torch.manual_seed(1)
    args = work.inputs("cuda")
    f, report = _compiled(model, mode)
    step = R._step_fn(f, args, work.amp, model.parameters())
    t0 = time.time()
    loss = step()
    torch.cuda.synchronize()
    first_s = time.time() - t0
    grads = _grads(model)
    row = {"model": name, "mode": mode, "first_step_s": round(first_s, 2), "loss": loss.item()}
    if ref_grads is not None:
        row["grad_rel"], row["grad_worst"] = _grad_rel(grads, ref_grads)
    ts = R._time_steps(step, a.warmup, a.iters)
    row["ms"] = statistics.median(ts)
    row["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    free, total = torch.cuda.mem_get_info()
    row["outside_gib"] = (total - free - torch.cuda.memory_reserved()) / 2**30  # CUDA context, libraries, evt's own
    if report is not None:
        row["ops_evt"], row["ops_torch"] = report.op_counts()
        row["fallbacks"] = {op: sorted(why) for op, why in report.fallback_reasons().items()}
    return row, grads


def child(name, a):
    """Every mode of one model; one JSON line per mode (ZOO_ROW ...)."""
    ref = None
    for mode in a.modes.split(","):
        try:
            row, grads = run_mode(name, mode, a, ref)
            if mode == "eager":
                ref = grads
        except Exception as e:  # noqa: BLE001 (a mode that fails is a row saying why)
            row = {"model": name, "mode": mode, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        print("ZOO_ROW " + json.dumps(row), flush=True)


def run_child(name, a):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", name, "--modes", a.modes,
           "--warmup", str(a.warmup), "--iters", str(a.iters)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
        out, err = p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        out, err = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""), "timeout"
    rows = [json.loads(line[8:]) for line in out.splitlines() if line.startswith("ZOO_ROW ")]
    done = {r["mode"] for r in rows}
    for mode in a.modes.split(","):
        if mode not in done:
            rows.append({"model": name, "mode": mode, "error": (err or "no output").strip().splitlines()[-1][:300]})
    return rows


def table(rows):
    lines = ["| model | mode | ms/step | vs eager | first step s | grad rel (worst param) | peak GiB | outside GiB | "
             "ops evt / PyTorch |", "|---|---|---|---|---|---|---|---|---|"]
    eager = {r["model"]: r.get("ms") for r in rows if r["mode"] == "eager"}
    for r in rows:
        if "error" in r:
            lines.append(f'| {r["model"]} | {r["mode"]} | {r["error"]} | | | | | | |')
            continue
        e = eager.get(r["model"])
        grad = f'{r["grad_rel"]:.1e} ({r["grad_worst"]})' if "grad_rel" in r and r["mode"] != "eager" else ""
        ops = f'{r["ops_evt"]} / {r["ops_torch"]}' if "ops_evt" in r else ""
        ratio = f'{e / r["ms"]:.2f}x' if e else ""
        lines.append(f'| {r["model"]} | {r["mode"]} | {r["ms"]:.2f} | {ratio} | {r["first_step_s"]} | {grad} | '
                     f'{r["peak_gib"]:.1f} | {r.get("outside_gib", float("nan")):.1f} | {ops} |')
    lines.append("")
    lines.append("Ops evt left to PyTorch (evt modes), with the reasons:")
    for r in rows:
        for op, why in sorted(r.get("fallbacks", {}).items()):
            lines.append(f'- {r["model"]} / {r["mode"]}: {op}: {"; ".join(why)[:300]}')
    return "\n".join(lines)


def main():
    import zoo
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(zoo.NAMES))
    ap.add_argument("--modes", default="eager,inductor,evt")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per model (all its modes)")
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "logs"))
    ap.add_argument("--tag", default=time.strftime("%Y%m%d-%H%M"))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    bad = [m for m in a.modes.split(",") if m not in MODES]
    if bad:
        ap.error(f"unknown modes {bad}; modes: {', '.join(MODES)}")
    if "eager" not in a.modes.split(",")[:1]:
        ap.error("the first mode must be eager (the gradient reference)")
    if a.child:
        return child(a.child, a)
    rows = []
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, f"zoo_{a.tag}.json")
    for name in a.models.split(","):
        print(f"== {name}", flush=True)
        rows += run_child(name, a)
        print(table([r for r in rows if r["model"] == name]), flush=True)
        with open(path, "w") as f:  # after every model: a run cut short keeps the models it finished
            json.dump(rows, f, indent=1)
    print("\n" + table(rows))
    print(f"\nwritten: {path}")


if __name__ == "__main__":
    main()
