"""bench/e2e/saved_bytes.py on a small model: both partitions are recorded without running a step, the
pre-activation of a GELU layer is among the saved values, and views of one value count once."""
import pytest

from bench_module import load

torch = pytest.importorskip("torch")
nn = torch.nn


@pytest.fixture(scope="module")
def sb():
    return load("bench/e2e/saved_bytes.py")


class Ffn(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(64, 256), nn.Linear(256, 64)

    def forward(self, x, y):
        return nn.functional.cross_entropy(self.down(nn.functional.gelu(self.up(x))).float(), y)


@pytest.mark.parametrize("which", ["evt", "torch.compile"])
def test_partition_recorded_without_running(sb, which):
    model = Ffn()
    x, y = torch.randn(32, 64), torch.randint(0, 64, (32,))
    with torch.no_grad():
        before = [p.clone() for p in model.parameters()]
    rows = sb.measure_model(model, (x, y), which, "ffn")
    shapes = {r[1] for r in rows}
    assert (32, 256) in shapes, rows  # the GELU's input (and output) of the up projection
    assert all(r[3] > 0 for r in rows)
    assert all(p.grad is None for p in model.parameters())  # no backward ran
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    import evt.config
    assert evt.config.SIMULATE_CUDA_RULES is False  # (restored after the evt trace)


def test_views_count_once(sb):
    g = torch.fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.empty(4, 8)
    v = g.call_function(torch.ops.aten.view.default, (x, [32]))
    v.meta["val"] = torch.empty(32)
    t = g.call_function(torch.ops.aten.permute.default, (x, [1, 0]))
    t.meta["val"] = torch.empty(8, 4)
    y = g.call_function(torch.ops.aten.relu.default, (x,))
    y.meta["val"] = torch.empty(4, 8)
    g.output((y, x, v, t))
    rows = sb._saved(torch.fx.GraphModule(torch.nn.Module(), g), 1)
    assert [(r[0], r[3]) for r in rows] == [("x", 128)]
