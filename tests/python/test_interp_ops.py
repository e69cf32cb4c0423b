"""Every op of src/ir/ops.def on the CPU interpreter against PyTorch, through the text format.

Each case declares its inputs, one op line (or a few), and a PyTorch reference. Cases run twice:
in fp64 mode (EVT_RUN_FP64, inputs in float64) against torch float64 with rel 1e-9, and in f32 mode
against torch float32 with rel 1e-5 (where the op is not dominated by cancellation). Backward ops are
checked against torch.autograd of the forward op.
"""
import math
import os
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from evt_ctypes import EvtError, Graph, run  # noqa: E402

RNG = np.random.default_rng(1234)


def randn(*s):
    return RNG.standard_normal(s)


def pos(*s):
    return RNG.uniform(0.5, 2.0, s)


def ints(lo, hi, *s):
    return RNG.integers(lo, hi, s).astype(np.float64)


def shape_str(a):
    return ",".join(str(d) for d in a.shape)


def graph_text(ins, body, out="y"):
    lines = ["graph t {"]
    for name, (dt, a) in ins.items():
        lines.append(f"  %{name}: {dt}[{shape_str(a)}] = input()")
    lines += ["  " + l for l in body.strip().splitlines()]
    lines.append(f"  output %{out}")
    lines.append("}")
    return "\n".join(lines)


def vjp(fn, args, wrt, dy):
    """Gradient of sum(dy * fn(*args)) w.r.t. args[wrt] (torch autograd)."""
    args = [a.clone().requires_grad_(i == wrt) for i, a in enumerate(args)]
    y = fn(*args)
    (g,) = torch.autograd.grad(y, args[wrt], dy)
    return g


# ---- the cases: (id, inputs {name: (dtype, array)}, body, reference(torch tensors by name) -> tensor) ----

CASES = []


def case(cid, ins, body, ref, f32=True, fp64=True):
    """f32: also run in f32 mode; fp64: also run in fp64 mode (where float results are not rounded)."""
    CASES.append(pytest.param(ins, body, ref, f32, fp64, id=cid))


X = randn(3, 4)
P = pos(3, 4)
for op, fn in [("neg", torch.neg), ("exp", torch.exp), ("tanh", torch.tanh), ("sigmoid", torch.sigmoid),
               ("relu", torch.relu), ("abs", torch.abs), ("sign", torch.sign), ("erf", torch.erf),
               ("gelu", F.gelu)]:
    case(op, {"x": ("f32", X)}, f"%y = {op}(%x)", lambda t, fn=fn: fn(t["x"]))
case("gelu_tanh", {"x": ("f32", X)}, "%y = gelu(%x, approximate=tanh)", lambda t: F.gelu(t["x"], approximate="tanh"))
for op, fn in [("log", torch.log), ("sqrt", torch.sqrt), ("rsqrt", torch.rsqrt), ("reciprocal", torch.reciprocal)]:
    case(op, {"x": ("f32", P)}, f"%y = {op}(%x)", lambda t, fn=fn: fn(t["x"]))
case("pow", {"x": ("f32", P)}, "%y = pow(%x, value=2.5)", lambda t: t["x"] ** 2.5)
case("cast_i64", {"x": ("f32", X * 3)}, "%y = cast(%x, dtype=i64)", lambda t: t["x"].to(torch.int64))
case("cast_bf16", {"x": ("f32", X)}, "%y = cast(%x, dtype=bf16)", lambda t: t["x"].float().to(torch.bfloat16), fp64=False)
case("gelu_backward", {"dy": ("f32", randn(3, 4)), "x": ("f32", X)}, "%y = gelu_backward(%dy, %x)",
     lambda t: vjp(F.gelu, [t["x"]], 0, t["dy"]))
case("gelu_backward_tanh", {"dy": ("f32", randn(3, 4)), "x": ("f32", X)},
     "%y = gelu_backward(%dy, %x, approximate=tanh)",
     lambda t: vjp(lambda a: F.gelu(a, approximate="tanh"), [t["x"]], 0, t["dy"]))
case("threshold_backward", {"dy": ("f32", randn(3, 4)), "r": ("f32", torch.relu(torch.tensor(X)).numpy())},
     "%y = threshold_backward(%dy, %r)", lambda t: torch.where(t["r"] > 0, t["dy"], 0.0))

A, B = randn(3, 1, 4), randn(5, 1) + 0.1
for op, fn in [("add", torch.add), ("sub", torch.sub), ("mul", torch.mul), ("div", torch.div),
               ("maximum", torch.maximum), ("minimum", torch.minimum), ("eq", torch.eq), ("ne", torch.ne),
               ("lt", torch.lt), ("le", torch.le), ("gt", torch.gt), ("ge", torch.ge)]:
    case(op, {"a": ("f32", A), "b": ("f32", B)}, f"%y = {op}(%a, %b)", lambda t, fn=fn: fn(t["a"], t["b"]))
case("eq_ties", {"a": ("i64", ints(0, 3, 4, 5)), "b": ("i64", ints(0, 3, 5))}, "%y = eq(%a, %b)",
     lambda t: t["a"] == t["b"])
case("add_scalar", {"a": ("f32", A), "s": ("f32", np.array(2.5))}, "%y = add(%a, %s)", lambda t: t["a"] + t["s"])
case("where", {"c": ("bool", ints(0, 2, 3, 4)), "a": ("f32", randn(3, 4)), "b": ("f32", randn(4))},
     "%y = where(%c, %a, %b)", lambda t: torch.where(t["c"].bool(), t["a"], t["b"]))

R = randn(3, 4, 5)
case("sum_dims", {"x": ("f32", R)}, "%y = sum(%x, dims=[0,2], keepdim=true)", lambda t: t["x"].sum((0, 2), keepdim=True))
case("sum_all", {"x": ("f32", R)}, "%y = sum(%x)", lambda t: t["x"].sum())
case("mean", {"x": ("f32", R)}, "%y = mean(%x, dims=[1])", lambda t: t["x"].mean(1))
case("amax", {"x": ("f32", R)}, "%y = amax(%x, dims=[-1])", lambda t: t["x"].amax(-1))
case("sum_i64", {"x": ("i64", ints(-5, 5, 3, 4))}, "%y = sum(%x, dims=[1])", lambda t: t["x"].sum(1))

case("mm", {"a": ("f32", randn(5, 7)), "b": ("f32", randn(7, 3))}, "%y = mm(%a, %b)", lambda t: t["a"] @ t["b"])
case("bmm", {"a": ("f32", randn(2, 3, 5, 7)), "b": ("f32", randn(2, 3, 7, 4))}, "%y = bmm(%a, %b)",
     lambda t: t["a"] @ t["b"])
case("addmm", {"c": ("f32", randn(3)), "a": ("f32", randn(5, 7)), "b": ("f32", randn(7, 3))},
     "%y = addmm(%c, %a, %b)", lambda t: torch.addmm(t["c"], t["a"], t["b"]))

# CSR of a random 6x5 matrix with empty rows
_dense = randn(6, 5) * (RNG.uniform(size=(6, 5)) < 0.4)
_dense[2] = 0
_rp = np.concatenate([[0], np.cumsum((_dense != 0).sum(1))]).astype(np.float64)
_cols = np.nonzero(_dense)[1].astype(np.float64)
_vals = _dense[_dense != 0]
_csr = {"rp": ("i64", _rp), "col": ("i64", _cols), "val": ("f32", _vals)}
case("spmm", {**_csr, "x": ("f32", randn(5, 3))}, "%y = spmm(%rp, %col, %val, %x)",
     lambda t: torch.tensor(_dense, dtype=t["x"].dtype) @ t["x"])
case("spmm_t", {**_csr, "dy": ("f32", randn(6, 3))}, "%y = spmm_t(%rp, %col, %val, %dy, shape=[5,3])",
     lambda t: torch.tensor(_dense, dtype=t["dy"].dtype).T @ t["dy"])

CX, CW = randn(2, 4, 9, 8), randn(6, 2, 3, 2)
CONV = "stride=[2,1], padding=[1,2], dilation=[1,2], groups=2"
_conv = lambda x, w: F.conv2d(x, w, stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2)  # noqa: E731
CY = _conv(torch.tensor(CX), torch.tensor(CW))
CDY = randn(*CY.shape)
case("conv2d", {"x": ("f32", CX), "w": ("f32", CW)}, f"%y = conv2d(%x, %w, {CONV})", lambda t: _conv(t["x"], t["w"]))
case("conv2d_backward_input", {"dy": ("f32", CDY), "w": ("f32", CW)},
     f"%y = conv2d_backward_input(%dy, %w, {CONV}, shape=[2,4,9,8])",
     lambda t: vjp(_conv, [torch.tensor(CX, dtype=t["w"].dtype), t["w"]], 0, t["dy"]))
case("conv2d_backward_weight", {"x": ("f32", CX), "dy": ("f32", CDY)},
     f"%y = conv2d_backward_weight(%x, %dy, {CONV}, shape=[6,2,3,2])",
     lambda t: vjp(_conv, [t["x"], torch.tensor(CW, dtype=t["x"].dtype)], 1, t["dy"]))

PX = randn(2, 3, 7, 6)
_mp = lambda x: F.max_pool2d(x, 3, stride=2, padding=1)  # noqa: E731
_ap = lambda x: F.avg_pool2d(x, 3, stride=2, padding=1, count_include_pad=True)  # noqa: E731
_amp = lambda x: F.adaptive_max_pool2d(x, (3, 4))  # noqa: E731
PDY = randn(2, 3, 4, 3)
case("max_pool2d", {"x": ("f32", PX)}, "%y = max_pool2d(%x, kernel=[3,3], stride=[2,2], padding=[1,1])",
     lambda t: _mp(t["x"]))
case("max_pool2d_backward", {"dy": ("f32", PDY), "x": ("f32", PX)},
     "%y = max_pool2d_backward(%dy, %x, kernel=[3,3], stride=[2,2], padding=[1,1])",
     lambda t: vjp(_mp, [t["x"]], 0, t["dy"]))
case("avg_pool2d", {"x": ("f32", PX)}, "%y = avg_pool2d(%x, kernel=[3,3], stride=[2,2], padding=[1,1])",
     lambda t: _ap(t["x"]))
case("avg_pool2d_backward", {"dy": ("f32", PDY)},
     "%y = avg_pool2d_backward(%dy, kernel=[3,3], stride=[2,2], padding=[1,1], shape=[2,3,7,6])",
     lambda t: vjp(_ap, [torch.zeros(2, 3, 7, 6, dtype=t["dy"].dtype)], 0, t["dy"]))
case("adaptive_max_pool2d", {"x": ("f32", PX)}, "%y = adaptive_max_pool2d(%x, shape=[3,4])", lambda t: _amp(t["x"]))
case("adaptive_max_pool2d_backward", {"dy": ("f32", randn(2, 3, 3, 4)), "x": ("f32", PX)},
     "%y = adaptive_max_pool2d_backward(%dy, %x, shape=[3,4])", lambda t: vjp(_amp, [t["x"]], 0, t["dy"]))

SX, SDY = randn(2, 5, 3) * 3, randn(2, 5, 3)
_sm = lambda x: torch.softmax(x, 1)  # noqa: E731
_lsm = lambda x: torch.log_softmax(x, 1)  # noqa: E731
case("softmax", {"x": ("f32", SX)}, "%y = softmax(%x, dim=1)", lambda t: _sm(t["x"]))
case("log_softmax", {"x": ("f32", SX)}, "%y = log_softmax(%x, dim=-2)", lambda t: _lsm(t["x"]))
case("softmax_backward", {"dy": ("f32", SDY), "s": ("f32", _sm(torch.tensor(SX)).numpy())},
     "%y = softmax_backward(%dy, %s, dim=1)", lambda t: vjp(_sm, [torch.tensor(SX, dtype=t["dy"].dtype)], 0, t["dy"]),
     f32=False)
case("log_softmax_backward", {"dy": ("f32", SDY), "s": ("f32", _lsm(torch.tensor(SX)).numpy())},
     "%y = log_softmax_backward(%dy, %s, dim=1)",
     lambda t: vjp(_lsm, [torch.tensor(SX, dtype=t["dy"].dtype)], 0, t["dy"]), f32=False)

NX, NW, NB, NDY = randn(4, 3, 6) * 2 + 1, randn(6), randn(6), randn(4, 3, 6)
_ln = lambda x, w, b: F.layer_norm(x, (6,), w, b, eps=1e-5)  # noqa: E731
case("layer_norm", {"x": ("f32", NX), "w": ("f32", NW), "b": ("f32", NB)}, "%y = layer_norm(%x, %w, %b)",
     lambda t: _ln(t["x"], t["w"], t["b"]))
case("layer_norm_plain", {"x": ("f32", NX)}, "%y = layer_norm(%x, eps=0.01)",
     lambda t: F.layer_norm(t["x"], (6,), eps=0.01))
case("layer_norm_backward_input", {"dy": ("f32", NDY), "x": ("f32", NX), "w": ("f32", NW)},
     "%y = layer_norm_backward_input(%dy, %x, %w)",
     lambda t: vjp(_ln, [t["x"], t["w"], torch.tensor(NB, dtype=t["x"].dtype)], 0, t["dy"]), f32=False)
case("layer_norm_backward_weight", {"dy": ("f32", NDY), "x": ("f32", NX)}, "%y = layer_norm_backward_weight(%dy, %x)",
     lambda t: vjp(_ln, [t["x"], torch.tensor(NW, dtype=t["x"].dtype), torch.tensor(NB, dtype=t["x"].dtype)], 1,
                   t["dy"]), f32=False)
BX, BW, BB, BDY = randn(4, 3, 2, 5) + 1, randn(3), randn(3), randn(4, 3, 2, 5)
_bn = lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True, eps=1e-5)  # noqa: E731
case("batch_norm", {"x": ("f32", BX), "w": ("f32", BW), "b": ("f32", BB)}, "%y = batch_norm(%x, %w, %b)",
     lambda t: _bn(t["x"], t["w"], t["b"]))
case("batch_norm_2d", {"x": ("f32", randn(8, 3))}, "%y = batch_norm(%x)",
     lambda t: F.batch_norm(t["x"], None, None, training=True))
case("batch_norm_backward_input", {"dy": ("f32", BDY), "x": ("f32", BX), "w": ("f32", BW)},
     "%y = batch_norm_backward_input(%dy, %x, %w)",
     lambda t: vjp(_bn, [t["x"], t["w"], torch.tensor(BB, dtype=t["x"].dtype)], 0, t["dy"]), f32=False)
case("batch_norm_backward_weight", {"dy": ("f32", BDY), "x": ("f32", BX)}, "%y = batch_norm_backward_weight(%dy, %x)",
     lambda t: vjp(_bn, [t["x"], torch.tensor(BW, dtype=t["x"].dtype), torch.tensor(BB, dtype=t["x"].dtype)], 1,
                   t["dy"]), f32=False)

LG = randn(6, 5) * 2
TG = np.array([1, 0, 4, -100, 2, 4], dtype=np.float64)
LP = torch.log_softmax(torch.tensor(LG), 1).numpy()
for red in ["mean", "sum", "none"]:
    case(f"nll_loss_{red}", {"lp": ("f32", LP), "t": ("i64", TG)}, f"%y = nll_loss(%lp, %t, reduction={red})",
         lambda t, red=red: F.nll_loss(t["lp"], t["t"], reduction=red))
    case(f"cross_entropy_{red}", {"x": ("f32", LG), "t": ("i64", TG)}, f"%y = cross_entropy(%x, %t, reduction={red})",
         lambda t, red=red: F.cross_entropy(t["x"], t["t"], reduction=red))
    dys = (6,) if red == "none" else ()
    case(f"nll_loss_backward_{red}", {"dy": ("f32", randn(*dys) + 2), "lp": ("f32", LP), "t": ("i64", TG)},
         f"%y = nll_loss_backward(%dy, %lp, %t, reduction={red})",
         lambda t, red=red: vjp(lambda a: F.nll_loss(a, t["t"], reduction=red), [t["lp"]], 0, t["dy"]))
    BXL, BYL = randn(3, 4) * 3, RNG.uniform(size=(3, 4))
    dyb = (3, 4) if red == "none" else ()
    case(f"bce_{red}", {"x": ("f32", BXL), "t": ("f32", BYL)}, f"%y = bce_with_logits(%x, %t, reduction={red})",
         lambda t, red=red: F.binary_cross_entropy_with_logits(t["x"], t["t"], reduction=red))
    case(f"bce_backward_{red}", {"dy": ("f32", randn(*dyb) + 2), "x": ("f32", BXL), "t": ("f32", BYL)},
         f"%y = bce_with_logits_backward(%dy, %x, %t, reduction={red})",
         lambda t, red=red: vjp(lambda a: F.binary_cross_entropy_with_logits(a, t["t"], reduction=red), [t["x"]], 0,
                                t["dy"]))
    case(f"mse_{red}", {"x": ("f32", BXL), "t": ("f32", BYL)}, f"%y = mse_loss(%x, %t, reduction={red})",
         lambda t, red=red: F.mse_loss(t["x"], t["t"], reduction=red))
    case(f"mse_backward_{red}", {"dy": ("f32", randn(*dyb) + 2), "x": ("f32", BXL), "t": ("f32", BYL)},
         f"%y = mse_loss_backward(%dy, %x, %t, reduction={red})",
         lambda t, red=red: vjp(lambda a: F.mse_loss(a, t["t"], reduction=red), [t["x"]], 0, t["dy"]))

EW, EI = randn(7, 4), ints(0, 7, 3, 5)
case("one_hot", {"i": ("i64", EI)}, "%y = one_hot(%i, num_classes=7)", lambda t: F.one_hot(t["i"], 7))
case("embedding", {"w": ("f32", EW), "i": ("i64", EI)}, "%y = embedding(%w, %i)", lambda t: F.embedding(t["i"], t["w"]))
case("embedding_backward", {"dy": ("f32", randn(3, 5, 4)), "i": ("i64", EI)},
     "%y = embedding_backward(%dy, %i, shape=[7,4])",
     lambda t: vjp(lambda w: F.embedding(t["i"], w), [torch.zeros(7, 4, dtype=t["dy"].dtype)], 0, t["dy"]))
II = np.array([2, 0, 2, 3], dtype=np.float64)
case("index_select", {"x": ("f32", R), "i": ("i64", II)}, "%y = index_select(%x, %i, dim=2)",
     lambda t: torch.index_select(t["x"], 2, t["i"]))
case("index_select_backward", {"dy": ("f32", randn(3, 4, 4)), "i": ("i64", II)},
     "%y = index_select_backward(%dy, %i, dim=1, shape=[3,5,4])",
     lambda t: vjp(lambda x: torch.index_select(x, 1, t["i"]), [torch.zeros(3, 5, 4, dtype=t["dy"].dtype)], 0, t["dy"]))

CK = np.array([2, 0, 2, 3, 0, 2, 1], dtype=np.float64)  # duplicate keys, row 4 empty
case("coo_perm", {"k": ("i64", CK)}, "%y = coo_perm(%k, rows=5)", lambda t: torch.argsort(t["k"], stable=True))
case("coo_rowptr", {"k": ("i32", CK)}, "%y = coo_rowptr(%k, rows=5)",
     lambda t: torch.cat([torch.zeros(1, dtype=torch.int64), torch.bincount(t["k"], minlength=5).cumsum(0)]))

LX = randn(2, 3, 8)
case("reshape", {"x": ("f32", LX)}, "%y = reshape(%x, shape=[6,-1])", lambda t: t["x"].reshape(6, -1))
case("permute", {"x": ("f32", LX)}, "%y = permute(%x, dims=[2,0,1])", lambda t: t["x"].permute(2, 0, 1))
case("transpose", {"x": ("f32", LX)}, "%y = transpose(%x, dims=[0,-1])", lambda t: t["x"].transpose(0, -1))
case("expand", {"x": ("f32", randn(3, 1))}, "%y = expand(%x, shape=[2,3,4])", lambda t: t["x"].expand(2, 3, 4))
case("slice", {"x": ("f32", LX)}, "%y = slice(%x, dim=2, start=1, end=7, step=2)", lambda t: t["x"][:, :, 1:7:2])
case("slice_neg", {"x": ("f32", LX)}, "%y = slice(%x, dim=1, start=-2)", lambda t: t["x"][:, -2:])
case("slice_backward", {"dy": ("f32", randn(2, 3, 3))},
     "%y = slice_backward(%dy, dim=2, start=1, end=7, step=2, shape=[2,3,8])",
     lambda t: vjp(lambda x: x[:, :, 1:7:2], [torch.zeros(2, 3, 8, dtype=t["dy"].dtype)], 0, t["dy"]))
case("concat", {"a": ("f32", randn(2, 3)), "b": ("f32", randn(2, 1)), "c": ("f32", randn(2, 2))},
     "%y = concat(%a, %b, %c, dim=1)", lambda t: torch.cat([t["a"], t["b"], t["c"]], 1))
case("squeeze", {"x": ("f32", randn(3, 1, 2))}, "%y = squeeze(%x, dim=1)", lambda t: t["x"].squeeze(1))
case("unsqueeze", {"x": ("f32", randn(3, 2))}, "%y = unsqueeze(%x, dim=-1)", lambda t: t["x"].unsqueeze(-1))

QS, KS = (2, 3, 5, 4), (2, 3, 6, 4)
Q, K, V, DO = randn(*QS), randn(*KS), randn(2, 3, 6, 3), randn(2, 3, 5, 3)
for causal in [0, 1]:
    for scale in [0.0, 0.7]:
        sfx = f"{'causal' if causal else 'full'}_{'s' if scale else 'd'}"
        kw = dict(is_causal=bool(causal), scale=scale or None)
        attrs = f"causal={causal}, scale={scale}"
        _sd = lambda q, k, v, kw=kw: F.scaled_dot_product_attention(q, k, v, **kw)  # noqa: E731
        case(f"sdpa_{sfx}", {"q": ("f32", Q), "k": ("f32", K), "v": ("f32", V)}, f"%y = sdpa(%q, %k, %v, {attrs})",
             lambda t, _sd=_sd: _sd(t["q"], t["k"], t["v"]))
        for w, nm in enumerate("qkv"):
            case(f"sdpa_backward_{nm}_{sfx}", {"do": ("f32", DO), "q": ("f32", Q), "k": ("f32", K), "v": ("f32", V)},
                 f"%y = sdpa_backward_{nm}(%do, %q, %k, %v, {attrs})",
                 lambda t, _sd=_sd, w=w: vjp(_sd, [t["q"], t["k"], t["v"]], w, t["do"]))

case("full", {}, "%y: f32[2,3] = full(value=2.5)", lambda t: torch.full((2, 3), 2.5))
case("scalar", {}, "%y: f32[] = scalar(value=-1.5)", lambda t: torch.tensor(-1.5))


def _check(got, want, rel):
    want = want.detach().to(torch.float64).numpy()
    assert got.shape == want.shape
    err = np.abs(got - want)
    tol = rel * (1 + np.abs(want))
    assert np.all(err <= tol), f"max abs err {err.max():.3g}, rel tol {rel}"


@pytest.mark.parametrize("ins,body,ref,f32,fp64", [c for c in CASES if c.values[4]])
def test_op_fp64(ins, body, ref, f32, fp64):
    out = run(graph_text(ins, body), {k: a for k, (dt, a) in ins.items()}, fp64=True)
    tens = {k: torch.tensor(a, dtype=torch.float64 if dt in ("f32", "f16", "bf16") else
                            torch.int64 if dt != "bool" else torch.bool) for k, (dt, a) in ins.items()}
    _check(out["y"], ref(tens), 1e-9)


@pytest.mark.parametrize("ins,body,ref,f32,fp64", [c for c in CASES if c.values[3]])
def test_op_f32(ins, body, ref, f32, fp64):
    out = run(graph_text(ins, body), {k: a for k, (dt, a) in ins.items()})
    tens = {k: torch.tensor(a, dtype=torch.float32 if dt in ("f32", "f16", "bf16") else
                            torch.int64 if dt != "bool" else torch.bool) for k, (dt, a) in ins.items()}
    _check(out["y"], ref(tens), 1e-5)


def test_dropout_matches_rand_mask():
    x = randn(16, 33)
    text = graph_text({"x": ("f32", x)}, """
%u: f32[16,33] = rand(seed=77, offset=5)
%y = dropout(%x, p=0.25, seed=77, offset=5)
%s: f32[] = scalar(value=0.25)
%k = ge(%u, %s)
""")
    out = Graph(text).run({"x": x}, keep_all=True, fp64=True)
    keep = out["k"] != 0
    assert 0.6 < keep.mean() < 0.9
    np.testing.assert_array_equal(out["y"], np.where(keep, x * (1 / 0.75), 0.0))
    np.testing.assert_array_equal(keep, out["u"] >= 0.25)


def test_bf16_outputs_are_rounded():
    x = randn(50)
    text = "graph t {\n  %x: bf16[50] = input()\n  %y = exp(%x)\n  output %y\n}"
    out = run(text, {"x": x})["y"]
    want = torch.exp(torch.tensor(x).to(torch.bfloat16).double()).to(torch.bfloat16).double().numpy()
    np.testing.assert_array_equal(out, want)


def test_runtime_index_error_names_node():
    text = graph_text({"w": ("f32", EW), "i": ("i64", EI)}, "%y = embedding(%w, %i)")
    bad = EI.copy()
    bad[1, 2] = 7
    with pytest.raises(EvtError, match=r"%y \(embedding\).*out of range"):
        run(text, {"w": EW, "i": bad})


def test_init_inputs_and_outputs():
    text = """graph t {
  %x: f32[64,256] = input()
  %w: f32[256,10] = param(init=uniform, lo=-0.1, hi=0.1)
  %y: i64[64] = input(init=randint, lo=0, hi=10)
  %h = mm(%x, %w)
  %l = cross_entropy(%h, %y)
  loss %l
}"""
    g = Graph(text)
    a, b = g.run(seed=1), g.run(seed=1)
    assert list(a) == ["l"] and a["l"] == b["l"]
    assert abs(a["l"] - math.log(10)) < 0.5
    assert g.run(seed=2)["l"] != a["l"]
    assert [n for n, _, _ in g.inputs()] == ["x", "w", "y"]


# ---- whole training steps: the joint graph's gradients against central differences of the loss -------

_EXAMPLES = os.environ.get("EVT_EXAMPLES_DIR") or os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples")
_EXAMPLE_FILES = sorted(f for f in os.listdir(_EXAMPLES) if f.endswith(".evt")) if os.path.isdir(_EXAMPLES) else []


@pytest.mark.skipif(not _EXAMPLE_FILES, reason="no examples/*.evt")
@pytest.mark.parametrize("fname", _EXAMPLE_FILES)
def test_example_gradients_match_finite_differences(fname):
    """Runs the joint graph in fp64 and checks the directional derivative of the loss along a random
    direction in every parameter: <grad, d> = (L(p + h d) - L(p - h d)) / 2h."""
    g = Graph(open(os.path.join(_EXAMPLES, fname)).read(), fname)
    g.build_joint(0)
    vals = g.run(seed=3, fp64=True, keep_all=True)
    loss_name = g.name(g.outputs()[0])
    params = [n for n, _, _ in g.inputs() if f"grad.{n}" in vals]
    assert params, "no parameter gradients"
    feeds = {n: vals[n] for n, _, _ in g.inputs()}
    rng = np.random.default_rng(5)
    for p in params:
        d = rng.standard_normal(feeds[p].shape)
        want = float(np.sum(vals[f"grad.{p}"] * d))
        h = 1e-6 * max(1.0, float(np.abs(feeds[p]).max()))
        lp = g.run({**feeds, p: feeds[p] + h * d}, fp64=True)[loss_name]
        lm = g.run({**feeds, p: feeds[p] - h * d}, fp64=True)[loss_name]
        fd = float(lp - lm) / (2 * h)
        assert abs(fd - want) <= 1e-5 * (1 + abs(want)), f"{fname} {p}: fd {fd:.9g} vs grad {want:.9g}"


@pytest.mark.parametrize("dt,tdt", [("bf16", torch.bfloat16), ("f16", torch.float16)])
@pytest.mark.parametrize("body,ref", [
    ("%y = add(%a, %b)", lambda a, b: a + b),
    ("%y = exp(%a)", lambda a, b: torch.exp(a)),
    ("%y = softmax(%a, dim=1)", lambda a, b: torch.softmax(a.float(), 1).to(a.dtype)),
    ("%y = mm(%a, %b)", lambda a, b: (a.double() @ b.double()).to(a.dtype)),
], ids=["add", "exp", "softmax", "mm"])
def test_half_dtypes_round_like_torch(dt, tdt, body, ref):
    """Inputs and outputs in bf16/f16: evt computes in double and rounds once; torch computes in float (or
    as noted) and rounds once, so the two agree to one unit in the last place of the half type."""
    a, b = randn(8, 8), randn(8, 8)
    out = run(graph_text({"a": (dt, a), "b": (dt, b)}, body), {"a": a, "b": b})["y"]
    want = ref(torch.tensor(a).to(tdt), torch.tensor(b).to(tdt)).double().numpy()
    ulp = 2.0 ** (-7 if dt == "bf16" else -10)
    assert np.all(np.abs(out - want) <= ulp * np.abs(want) + 1e-6)
    # and every value is representable in the dtype
    np.testing.assert_array_equal(out, torch.tensor(out).to(tdt).double().numpy())
