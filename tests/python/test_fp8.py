"""evt's FP8 casts (src/ir/fp8.c, the interpreter's `cast`) against PyTorch's float8_e4m3fn / float8_e5m2.

evt's cast to f8 saturates (a finite value or an infinity past the largest finite value gives +-max, NaN stays
NaN); PyTorch's does not (e4m3fn: NaN past 464, e5m2: inf past 61440), so the input is clamped to +-max before
PyTorch's cast. The codes must then be equal bit for bit: NaN's sign and -0 included.
"""
import ctypes
import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from evt_ctypes import DTYPES, lib, run  # noqa: E402

FORMATS = [("f8e4m3", torch.float8_e4m3fn, 448.0), ("f8e5m2", torch.float8_e5m2, 57344.0)]


def samples(n, seed=0):
    """n f32 values: random bit patterns (huge, tiny, subnormal, inf, NaN), normals spread over fp8's range and
    beyond, and the exact midpoints between neighbouring fp8 values of both formats (the ties)."""
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2**32, n // 2, dtype=np.uint64).astype(np.uint32).view(np.float32)
    spread = (rng.standard_normal(n // 4) * np.exp2(rng.uniform(-20, 20, n // 4))).astype(np.float32)
    ties = []
    for _, tdt, _ in FORMATS:
        v = torch.arange(256, dtype=torch.uint8).view(tdt).float().numpy()
        v = np.sort(v[np.isfinite(v)])
        ties.append(((v[1:].astype(np.float64) + v[:-1]) / 2).astype(np.float32))
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 448, 449, 464, 465, 57344, 61440, 1e38],
                       dtype=np.float32)
    out = np.concatenate([bits, spread] + ties + [special])
    return np.concatenate([out, -out[: n - len(out)]]) if len(out) < n else out


def torch_codes(x, tdt, m):
    return torch.from_numpy(x).clamp(-m, m).to(tdt).view(torch.uint8).numpy()


@pytest.mark.parametrize("name,tdt,m", FORMATS)
def test_codes_match_torch(name, tdt, m):
    """evt_fp8_from_f32 on 200k values (a ctypes call each) gives torch's codes after clamping."""
    L = lib()
    f = L.evt_fp8_from_f32
    f.restype, f.argtypes = ctypes.c_uint8, [ctypes.c_float, ctypes.c_int]
    x = samples(200_000, seed=1)
    dt = DTYPES.index(name)
    ours = np.fromiter((f(float(v), dt) for v in x), dtype=np.uint8, count=len(x))
    want = torch_codes(x, tdt, m)
    bad = np.nonzero(ours != want)[0]
    assert len(bad) == 0, [(float(x[i]), hex(ours[i]), hex(want[i])) for i in bad[:10]]


@pytest.mark.parametrize("name,tdt,m", FORMATS)
def test_decode_matches_torch(name, tdt, m):
    """evt_fp8_to_f32 of all 256 codes equals torch's view-and-upcast (NaN codes: NaN)."""
    f = lib().evt_fp8_to_f32
    f.restype, f.argtypes = ctypes.c_float, [ctypes.c_uint8, ctypes.c_int]
    ours = np.array([f(c, DTYPES.index(name)) for c in range(256)], dtype=np.float32)
    want = torch.arange(256, dtype=torch.uint8).view(tdt).float().numpy()
    assert np.array_equal(ours, want, equal_nan=True)
    assert np.array_equal(np.signbit(ours), np.signbit(want))


@pytest.mark.parametrize("name,tdt,m", FORMATS)
def test_interpreter_cast_matches_torch(name, tdt, m):
    """A graph `cast(x f32[N], dtype=f8...)` then back to f32 on 1M values: torch's values (clamped input)."""
    x = samples(1_000_000, seed=2)
    text = (f"graph c {{\n  %x: f32[{len(x)}] = input()\n  %q = cast(%x, dtype={name})\n"
            f"  %y = cast(%q, dtype=f32)\n  output %y\n}}\n")
    with np.errstate(invalid="ignore"):  # NaN bit patterns through numpy's f64 -> f32
        y = run(text, {"x": x.astype(np.float64)})["y"]
    want = torch.from_numpy(x).clamp(-m, m).to(tdt).double().numpy()
    assert np.array_equal(y, want, equal_nan=True)
    finite = np.isfinite(want)
    assert np.array_equal(np.signbit(y[finite]), np.signbit(want[finite]))


def test_fp8_linear_graph():
    """tests/graphs/fp8_linear.evt (amax, scale, saturating cast to f8e4m3, f8 x f8 mm into f32, rescale) on the
    interpreter equals the same steps by hand in PyTorch, bit for bit: each f32 op rounds once either way, and
    the products of f8 values sum exactly in float64 at this K, so the accumulator rounds to f32 once too."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "graphs", "fp8_linear.evt")
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(16, 64, generator=g) * 3).bfloat16()
    x[0, 0] = 40.0  # one outlier sets the scale: small values go subnormal or to zero in e4m3
    w = torch.randn(64, 32, generator=g) * 0.05
    w_scale = torch.tensor(448.0) / w.abs().max()
    wq = (w * w_scale).to(torch.float8_e4m3fn)
    got = run(open(path).read(), {"x": x, "wq": wq.double(), "w_scale": w_scale})

    amax = x.abs().amax()
    scale = torch.tensor(448.0) / amax.float()
    xq = (x.float() * scale).clamp(-448, 448).to(torch.float8_e4m3fn)
    acc = (xq.double() @ wq.double()).float()
    want = (acc / (scale * w_scale)).bfloat16()
    assert got["amax"] == amax.double().item()
    assert torch.equal(torch.from_numpy(got["y"]).bfloat16(), want)
    # and it is a good linear layer: close to the bf16 product it approximates
    ref = x.float() @ w
    assert (want.float() - ref).abs().max() <= 0.1 * ref.abs().max()


def test_backend_binds_fp8_tensors():
    """The PyTorch backend's library binding (python/evt/lib.py) maps float8_e4m3fn / float8_e5m2 to evt's
    dtypes: a graph with fp8 inputs and outputs runs with torch fp8 tensors in and out; the backend's aten
    translation leaves casts to fp8 to PyTorch (evt's saturates, PyTorch's does not)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                    "python"))
    from evt import aten, lib as evt_lib

    assert evt_lib.DTYPES[torch.float8_e4m3fn] == DTYPES.index("f8e4m3")
    assert evt_lib.DTYPES[torch.float8_e5m2] == DTYPES.index("f8e5m2")
    g = evt_lib.Graph("graph t {\n  %a: f8e4m3[2,3] = input()\n  %b = cast(%a, dtype=f8e5m2)\n"
                      "  %c: f32[2,3] = cast(%b, dtype=f32)\n  output %b, %c\n}\n")
    a = torch.tensor([[1.0, -448.0, 0.0625], [3.0, 0.001953125, -0.5]]).to(torch.float8_e4m3fn)
    b, c = g.run([(g.ids["a"], a)], [(g.ids["b"], torch.float8_e5m2), (g.ids["c"], torch.float32)])
    want = a.float().to(torch.float8_e5m2)
    assert b.dtype == torch.float8_e5m2 and torch.equal(b.view(torch.uint8), want.view(torch.uint8))
    assert torch.equal(c, want.float())
    assert aten.type_str(a) == "f8e4m3[2,3]"


def test_compiled_cast_to_fp8_stays_in_pytorch():
    """Under torch.compile(backend="evt") a cast to fp8 runs in PyTorch (eager's NaN past 448 kept) and the fp8
    tensor it makes crosses into evt's next segment."""
    os.environ.setdefault("EVT_CACHE", "0")
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                    "python"))
    import evt

    def f(x):
        return (x * 2).to(torch.float8_e4m3fn).float() + 1

    x = torch.tensor([1000.0, 1.0, 3.0, -0.3])
    got = torch.compile(f, backend="evt")(x)
    assert torch.equal(got.isnan(), f(x).isnan()) and torch.equal(got.nan_to_num(), f(x).nan_to_num())
    assert "a cast to fp8: evt's saturates" in str(evt.explain(f, x))
