"""H200 microbenchmark: autocast's per-step weight casts (f32 -> bf16) of a BERT-large-sized parameter set, one
PyTorch kernel per tensor (what evt's backend runs today: HOISTED_CAST steps) against one torch._foreach_copy_
into fresh bf16 tensors (a multi-tensor kernel), and the bytes/bandwidth floor. Checks the foreach result bit for
bit against the per-tensor casts.
    python3 bench/e2e/cast_bench.py [LAYERS]
"""
import sys

import torch

layers = int(sys.argv[1]) if len(sys.argv) > 1 else 24
h, f, v = 1024, 4096, 30528
shapes = [(v, h), (512, h), (2, h)]
for _ in range(layers):
    shapes += [(3 * h, h), (3 * h,), (h, h), (h,), (h,), (h,), (f, h), (f,), (h, f), (h,), (h,), (h,)]
xs = [torch.randn(s, device="cuda") for s in shapes]
nbytes = sum(x.numel() for x in xs) * 6  # f32 read + bf16 write


def per_tensor():
    return [x.to(torch.bfloat16) for x in xs]


def foreach():
    out = [torch.empty(x.shape, device="cuda", dtype=torch.bfloat16) for x in xs]
    torch._foreach_copy_(out, xs)
    return out


def med_ms(fn, reps=30):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


ref, got = per_tensor(), foreach()
same = all(torch.equal(r, g) for r, g in zip(ref, got))
copy = torch.empty(nbytes // 4, device="cuda", dtype=torch.float32)
dst = torch.empty_like(copy)
t_copy = med_ms(lambda: dst.copy_(copy))
t_pt, t_fe = med_ms(per_tensor), med_ms(foreach)
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
    foreach()
    torch.cuda.synchronize()
kern = sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})
print(f"{len(xs)} tensors, {sum(x.numel() for x in xs) / 1e6:.1f} M elements, {nbytes / 1e9:.2f} GB moved; "
      f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
print(f"per-tensor .to(bf16): {t_pt:.3f} ms | _foreach_copy_: {t_fe:.3f} ms (bitwise equal: {same}) | "
      f"a copy of the same bytes: {t_copy:.3f} ms")
print("foreach kernels:", "; ".join(k[:90] for k in kern[:6]))
