"""Helper for test_torch_backend.test_disk_cache: one MLP training step, eager vs evt, in a fresh process.
Prints `time_to_first_step <seconds>` and `maxrel <loss/grad max relative error vs eager>`. An argument `tanh`
uses tanh instead of GELU as the activation."""
import copy
import os
import sys
import time

t0 = time.perf_counter()
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "python"))
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import evt  # noqa: E402,F401

torch.set_num_threads(1)
ACT = torch.tanh if sys.argv[1:] == ["tanh"] else F.gelu


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.ln, self.l2 = nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 4)

    def forward(self, x, y):
        return F.cross_entropy(self.l2(ACT(self.ln(self.l1(x)))), y)


torch.manual_seed(0)
ref = MLP()
mod = copy.deepcopy(ref)
x, y = torch.randn(4, 8), torch.randint(0, 4, (4,))
t1 = time.perf_counter()
loss = torch.compile(mod, backend="evt", fullgraph=True)(x, y)
loss.backward()
t2 = time.perf_counter()
loss_ref = ref(x, y)
loss_ref.backward()


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-6)).item()


errs = [rel(loss.detach(), loss_ref.detach())] + [rel(p.grad, q.grad) for p, q in zip(mod.parameters(), ref.parameters())]
print(f"time_to_first_step {t2 - t1:.3f} total {t2 - t0:.3f}")
print(f"maxrel {max(errs):.3g}")
