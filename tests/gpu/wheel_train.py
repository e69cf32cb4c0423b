"""A user's training loop with the installed wheel, on CUDA, run by tests/gpu/wheel_check.sh from outside the
repository: three steps of a GELU MLP under bf16 autocast compiled with backend="evt", each step's loss and
gradients against the same eager model's. Exits non-zero unless every step matched (gradients within the bf16
noise bound, 2e-2 relative) and evt ran GPU segments from the installed package."""
import copy
import sys

import torch

import evt
from evt import lib

torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)).cuda()
ref = copy.deepcopy(m)
x, y = torch.randn(512, 256, device="cuda"), torch.randn(512, 256, device="cuda")
step = torch.compile(lambda x: torch.nn.functional.mse_loss(m(x), y), backend="evt")
worst = 0.0
for i in range(3):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = step(x)
        lref = torch.nn.functional.mse_loss(ref(x), y)
    loss.backward()
    lref.backward()
    rel = max(((p.grad - q.grad).abs().max() / q.grad.abs().max()).item() for p, q in zip(m.parameters(), ref.parameters()))
    worst = max(worst, rel)
    print(f"step {i}: loss {loss.item():.6f}, eager {lref.item():.6f}, gradients {rel:.2e} from eager's")
    for p in list(m.parameters()) + list(ref.parameters()):
        p.grad = None
runs = {k: v for k, v in evt.STATS.items() if "runs" in k}
print("package", evt.__file__, "library", lib.library_path())
print("segment runs", runs)
ok = worst <= 2e-2 and runs.get("gpu_segment_runs", 0) > 0 and "/site-packages/" in evt.__file__
print("wheel check:", "ok" if ok else "FAILED")
sys.exit(0 if ok else 1)
