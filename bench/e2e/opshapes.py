"""Which PyTorch ops (with their input shapes and strides, and the Python line that called them) take the GPU
time of one training step: a diagnostic next to run.py's kernel list, for finding the copies and glue that
run outside evt's kernels.

    python3 bench/e2e/opshapes.py WORKLOAD [--scale S] [--mode eager|evt|inductor] [--top N] [--match SUBSTR]

Profiles the third step (two warm-up steps first) with record_shapes and with_stack; prints the top aten ops
by self CUDA time grouped by (op, input shapes, caller), each with the innermost stack frame outside torch.
--match keeps only ops whose name contains SUBSTR (e.g. copy_). CUDA only."""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def _caller(evt):
    for fr in getattr(evt, "stack", None) or []:
        if "/torch/" not in fr and "opshapes.py" not in fr:
            return fr
    return ""


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workload")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--mode", default="evt")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--match", default="")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test of this script (CPU op times)")
    a = ap.parse_args(argv)
    import torch
    from torch.profiler import ProfilerActivity, profile
    import models as M
    import run as R
    torch.manual_seed(0)
    m, args, amp = M.make(a.workload, a.device, 0.0, a.scale)
    m.train()
    f = R._compile(m, a.mode)
    step = R._step_fn(f, args, amp and a.device == "cuda", m.parameters())
    cuda = a.device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(2):
        step()
    sync()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts, record_shapes=True, with_stack=True) as prof:
        step()
        sync()
    rows = {}
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CPU or not e.name.startswith("aten::"):
            continue
        if a.match and a.match not in e.name:
            continue
        t = getattr(e, "self_device_time_total", None) if cuda else e.self_cpu_time_total
        if t is None:
            t = getattr(e, "self_cuda_time_total", 0)
        if not t:
            continue
        key = (e.name, str(e.input_shapes)[:160], _caller(e)[:120])
        us, n = rows.get(key, (0.0, 0))
        rows[key] = (us + t, n + 1)
    total = sum(us for us, _ in rows.values())
    print(f"{a.workload} x{a.scale} {a.mode}: aten ops with GPU time, {total / 1e3:.2f} ms in all (self {'CUDA' if cuda else 'CPU'} time)")
    for (name, shapes, caller), (us, n) in sorted(rows.items(), key=lambda kv: -kv[1][0])[:a.top]:
        print(f"{us / 1e3:9.3f} ms {n:4d}x  {name}  {shapes}" + (f"\n{'':22}{caller}" if caller else ""))


if __name__ == "__main__":
    main()
