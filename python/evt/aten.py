"""ATen -> evt IR: the translation table of the torch.compile backend.

Contract
- TABLE maps an ATen overload packet (torch.ops.aten.<op>) to a translator `fn(b, node, used)`; `b` is the
  Builder of the segment being built, `node` the FX call_function node, `used` the set of tuple indices
  its getitem users read (empty for single-output ops). A translator returns the evt name (`%x`, without
  the %) of the node's value, or a dict {index: name} for tuple-valued ops covering at least `used`.
- A translator raises Unsupported (with a short reason) for anything it cannot express exactly: an
  argument it does not understand, an unsupported dtype, symbolic shapes. The backend then runs that FX
  node as ordinary PyTorch. Translators never compute values themselves: they only emit evt statements.
- Every statement that produces an FX node's value declares the type from `meta["val"]`, so the evt
  parser checks each translation against PyTorch's own shape/dtype; a mismatch is reported by the parser
  naming the node, and the backend falls back for that node.
- Helper statements are named `<fx name>.<k>` so every evt error can be traced back to its FX node.
- Decompositions into several evt ops are used where evt lacks a single op (e.g. layer-norm statistics,
  the running-stat update of batch norm, nll_loss's total weight).
"""
import math
import operator
from typing import Optional

import torch

from . import config
from . import sparse  # noqa: F401 (defines the evt::spmm_csr ops translated below)
from .lib import DTYPE_NAMES, FP8_DTYPES

aten = torch.ops.aten
INT64_MAX = (1 << 63) - 1


class Unsupported(Exception):
    pass


def _fmt(v):
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        r = repr(v)
        return r
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(str(int(x)) for x in v) + "]"
    return str(v)  # enum names


def meta_val(node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def is_tensor_node(x):
    return isinstance(x, torch.fx.Node) and isinstance(meta_val(x), torch.Tensor)


def static_shape(v):
    try:
        return [int(s) for s in v.shape]
    except (TypeError, ValueError):
        raise Unsupported("symbolic shape")


def type_str(v, dtype=None):
    dt = DTYPE_NAMES.get(dtype or v.dtype)
    if dt is None:
        raise Unsupported(f"dtype {v.dtype}")
    shape = static_shape(v)
    if len(shape) > 6:
        raise Unsupported("rank above 6")
    return f"{dt}[{','.join(map(str, shape))}]"


# evt holds every value as a double (the interpreter, and the GPU programs' node-by-node steps): integers are exact
# up to 2^53 in magnitude, and arithmetic does not wrap around on overflow as PyTorch's integer kernels do.
EXACT_INT = 1 << 53


def number(value):
    """A Python number as the double of an evt attribute; an integer beyond 2^53 (no exact double) is Unsupported."""
    if not isinstance(value, (int, float, bool)):
        raise Unsupported("symbolic or non-numeric value")
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > EXACT_INT:
        raise Unsupported(f"integer {value} beyond 2^53 (evt computes in double)")
    return float(value)


def _ints(xs):
    out = []
    for x in xs:
        if not isinstance(x, int):
            raise Unsupported("symbolic size")
        out.append(int(x))
    return out


class Builder:
    """The evt text of one segment under construction.

    lines: statements in order (one evt node each, so the statement index is the node id);
    names: FX node -> evt name (or {index: name} for tuple values); inputs: [(FX node, evt name)]."""

    def __init__(self):
        self.lines = []
        self.stmt_names = []  # evt name of each statement (its node id is the index)
        self.names = {}
        self.inputs = []
        self.origin = {}  # evt name -> FX node that emitted it
        self.cur = None
        self.k = 0
        self.device = None  # torch.device of every tensor in the segment (one device per segment)
        self.cuda_attention = False  # translate CUDA SDPA (the backend sets it from its options)
        self.transposed_input = None  # FX node -> True: declare it transposed (placement.gemm_only_transposed)
        self.transposed = set()       # names of inputs declared transposed (bound as x.t())
        self.rng_sites = 0            # dropout sites so far: site k draws with Philox seed k (native_dropout)
        self.int_bounds = {}          # FX node -> (bound on its integer values' magnitude, rests on an input's)
        self.int_input_checked = False  # a bound assumed an int64 input within INT_INPUT_BOUND (checked at run time)

    def snapshot(self):
        return (len(self.lines), len(self.inputs), dict(self.names), dict(self.origin), self.device,
                set(self.transposed), dict(self.int_bounds), self.int_input_checked)

    def rollback(self, s):
        del self.lines[s[0]:]
        del self.stmt_names[s[0]:]
        del self.inputs[s[1]:]
        self.names, self.origin, self.device, self.transposed = s[2], s[3], s[4], s[5]
        self.int_bounds, self.int_input_checked = s[6], s[7]

    def on_device(self, dev):
        """Claims the segment for dev (the first tensor decides); a tensor elsewhere is Unsupported."""
        dev = torch.device(dev)
        if self.device is None:
            self.device = dev
        elif dev != self.device:
            raise Unsupported(f"tensor on {dev}, segment on {self.device}")

    def _stmt(self, name, typ, op, operands, attrs):
        args = [f"%{o}" for o in operands]
        args += [f"{k}={_fmt(v)}" for k, v in attrs.items()]
        t = f": {typ}" if typ else ""
        self.lines.append(f"%{name}{t} = {op}({', '.join(args)})")
        self.stmt_names.append(name)
        self.origin[name] = self.cur
        return name

    def fresh(self):
        self.k += 1
        return f"{self.cur.name}.{self.k}"

    def op(self, op, operands, attrs=None, like=None, dtype=None):
        """Emits a helper statement (type inferred unless `like`, a tensor, is given)."""
        typ = type_str(like, dtype) if like is not None else None
        return self._stmt(self.fresh(), typ, op, operands, attrs or {})

    def result(self, op, operands, attrs=None, val=None):
        """Emits the statement holding the current FX node's value (type declared from meta)."""
        v = meta_val(self.cur) if val is None else val
        return self._stmt(self.cur.name if val is None else self.fresh(), type_str(v), op, operands, attrs or {})

    def val(self, x):
        """evt name of a tensor operand (declaring it as a segment input when it comes from outside)."""
        if not is_tensor_node(x):
            raise Unsupported(f"operand {x!r} is not a tensor")
        n = self.names.get(x)
        if isinstance(n, dict):
            raise Unsupported("tuple used as a tensor")
        if n is not None:
            return n
        self.on_device(meta_val(x).device)
        name = f"in.{x.name}"
        if self.transposed_input is not None and self.transposed_input(x):
            # bound as the row-major [cols, rows] memory it is (Segment binds x.t()), read through a permute
            # (a GEMM operand absorbs it as its layout): no copy into a row-major [rows, cols]
            v = meta_val(x)
            self._stmt(name, type_str(v.t()), "input", [], {})
            self.origin[name] = x
            self.inputs.append((x, name))
            self.transposed.add(name)
            self.names[x] = self._stmt(f"{name}.T", type_str(v), "permute", [name], {"dims": [1, 0]})
            self.origin[self.names[x]] = x
            return self.names[x]
        self._stmt(name, type_str(meta_val(x)), "input", [], {})
        self.origin[name] = x
        self.inputs.append((x, name))
        self.names[x] = name
        return name

    def scalar(self, value, dtype):
        value = number(value)
        dt = DTYPE_NAMES.get(dtype)
        if dt is None:
            raise Unsupported(f"dtype {dtype}")
        return self._stmt(self.fresh(), f"{dt}[]", "scalar", [], {"value": value})

    def cast(self, x, dtype):
        """evt name of tensor operand x converted to dtype."""
        name = self.val(x)
        if meta_val(x).dtype == dtype:
            return name
        if dtype not in DTYPE_NAMES:
            raise Unsupported(f"dtype {dtype}")
        return self._stmt(self.fresh(), None, "cast", [name], {"dtype": DTYPE_NAMES[dtype]})

    def reshape(self, name, shape):
        return self.op("reshape", [name], {"shape": list(shape)})


# ---- helpers ------------------------------------------------------------------------------------------

def out(node):
    return meta_val(node)


def arg(node, i, name, default=None):
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(name, default)


def _operand(b, x, dtype):
    """A binary-op operand: a tensor cast to dtype, or a Python number as a scalar of dtype."""
    if is_tensor_node(x):
        return b.cast(x, dtype)
    return b.scalar(x, dtype)


def _promote(args):
    """PyTorch's result dtype for the operands of a comparison (tensors first, then Python numbers)."""
    dts = [meta_val(a).dtype for a in args if is_tensor_node(a)]
    dims = [meta_val(a).dim() for a in args if is_tensor_node(a)]
    if not dts:
        raise Unsupported("no tensor operand")
    ranked = [d for d, r in zip(dts, dims) if r > 0] or dts
    dt = ranked[0]
    for d in ranked[1:]:
        dt = torch.promote_types(dt, d)
    nums = [a for a in args if not isinstance(a, torch.fx.Node)]
    if any(isinstance(a, float) for a in nums) and not dt.is_floating_point:
        dt = torch.get_default_dtype()
    return dt


TABLE = {}


def rule(*ops):
    def reg(fn):
        for o in ops:
            TABLE[o] = fn
        return fn
    return reg


def unary(evt_op, **attrs):
    def fn(b, node, used):
        v = out(node)
        return b.result(evt_op, [b.cast(node.args[0], v.dtype)], attrs)
    return fn


for _a, _e in [("neg", "neg"), ("exp", "exp"), ("log", "log"), ("sqrt", "sqrt"), ("rsqrt", "rsqrt"),
               ("reciprocal", "reciprocal"), ("abs", "abs"), ("sign", "sign"), ("tanh", "tanh"),
               ("sigmoid", "sigmoid"), ("relu", "relu"), ("erf", "erf")]:
    TABLE[getattr(aten, _a)] = unary(_e)


@rule(aten.gelu)
def _gelu(b, node, used):
    approx = node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none")
    return b.result("gelu", [b.val(node.args[0])], {"approximate": approx} if approx != "none" else {})


LOW_PRECISION = (torch.bfloat16, torch.float16)


def _opmath_result(b, op, operands, attrs):
    """The current node as one evt op computed as PyTorch's kernel does: a bf16/f16 result is computed
    in f32 from f32 casts of its operands and rounded once (evt's passes decompose these ops into
    primitives, which would otherwise round after every step)."""
    val = out(b.cur)
    if val.dtype not in LOW_PRECISION:
        return b.result(op, [b.val(x) for x in operands], attrs)
    return _result_in(b, op, [b.cast(x, torch.float32) for x in operands], attrs, torch.float32, val)


@rule(aten.gelu_backward)
def _gelu_bwd(b, node, used):
    approx = node.kwargs.get("approximate", node.args[2] if len(node.args) > 2 else "none")
    return _opmath_result(b, "gelu_backward", [node.args[0], node.args[1]],
                          {"approximate": approx} if approx != "none" else {})


@rule(aten.threshold_backward)
def _thr_bwd(b, node, used):
    return b.result("threshold_backward", [b.val(node.args[0]), b.val(node.args[1])], {"value": float(node.args[2])})


@rule(aten.pow)
def _pow(b, node, used):
    if node.target != aten.pow.Tensor_Scalar or isinstance(node.args[1], torch.fx.Node):
        raise Unsupported("pow with a tensor exponent")
    return b.result("pow", [b.cast(node.args[0], out(node).dtype)], {"value": float(node.args[1])})


def _number_dtype(evt_op, dt):
    """The dtype of a Python number operand of evt_op on dtype-dt tensors. PyTorch's CUDA kernels add, subtract,
    multiply and divide a 16-bit tensor and a Python number in f32 (opmath) without rounding the number to the
    tensor's dtype: an f32 scalar, which adopts the tensor's dtype in evt (x * 1/(1-p) of a dropout's backward).
    Comparisons round it (their functors take the tensor's type), and so does CPU eager's bf16 add (its mul does
    not): the CUDA semantics are the ones evt's GPU path is checked against."""
    return torch.float32 if evt_op in ("mul", "div", "add", "sub") and dt in LOW_PRECISION else dt


def binary(evt_op, compare=False):
    def fn(b, node, used):
        x, y = node.args[0], node.args[1]
        alpha = node.kwargs.get("alpha", 1)
        dt = _promote([x, y]) if compare else out(node).dtype
        sdt = _number_dtype(evt_op, dt)
        a, c = _operand(b, x, sdt if not is_tensor_node(x) else dt), _operand(b, y, sdt if not is_tensor_node(y) else dt)
        if alpha != 1:
            c = b.op("mul", [c, b.scalar(alpha, sdt)])
        return b.result(evt_op, [a, c])
    return fn


for _a, _e in [("add", "add"), ("sub", "sub"), ("mul", "mul"), ("div", "div"), ("maximum", "maximum"),
               ("minimum", "minimum")]:
    TABLE[getattr(aten, _a)] = binary(_e)
for _a in ["eq", "ne", "lt", "le", "gt", "ge"]:
    TABLE[getattr(aten, _a)] = binary(_a, compare=True)


@rule(aten.div)
def _div(b, node, used):
    if node.kwargs.get("rounding_mode") is not None:
        raise Unsupported("div with rounding_mode")
    return binary("div")(b, node, used)


@rule(aten.rsub)
def _rsub(b, node, used):
    dt = out(node).dtype
    sdt = _number_dtype("sub", dt)
    x, y = (_operand(b, a, sdt if not is_tensor_node(a) else dt) for a in node.args[:2])
    alpha = node.kwargs.get("alpha", 1)
    if alpha != 1:
        x = b.op("mul", [x, b.scalar(alpha, sdt)])
    return b.result("sub", [y, x])


@rule(aten.where)
def _where(b, node, used):
    if len(node.args) != 3:
        raise Unsupported("where(cond)")
    dt = out(node).dtype
    c = b.cast(node.args[0], torch.bool)
    return b.result("where", [c, _operand(b, node.args[1], dt), _operand(b, node.args[2], dt)])


def _clamp_impl(b, node, lo, hi):
    v = out(node)
    y = b.cast(node.args[0], v.dtype)
    if lo is not None:
        y = b.op("maximum", [y, _operand(b, lo, v.dtype)])
    if hi is not None:
        y = b.op("minimum", [y, _operand(b, hi, v.dtype)])
    if lo is None and hi is None:
        return y
    return b.result("reshape", [y], {"shape": static_shape(v)})


@rule(aten.clamp)
def _clamp(b, node, used):
    return _clamp_impl(b, node, arg(node, 1, "min"), arg(node, 2, "max"))


@rule(aten.clamp_min)
def _clamp_min(b, node, used):
    return _clamp_impl(b, node, node.args[1], None)


@rule(aten.clamp_max)
def _clamp_max(b, node, used):
    return _clamp_impl(b, node, None, node.args[1])


@rule(aten.hardtanh)
def _hardtanh(b, node, used):
    return _clamp_impl(b, node, float(arg(node, 1, "min_val", -1.0)), float(arg(node, 2, "max_val", 1.0)))


@rule(aten.leaky_relu)
def _leaky_relu(b, node, used):
    dt = out(node).dtype
    xn = b.val(node.args[0])
    neg = b.op("mul", [xn, b.scalar(float(arg(node, 1, "negative_slope", 0.01)), dt)])
    return b.result("where", [b.op("gt", [xn, b.scalar(0.0, dt)]), xn, neg])


def _truth(b, x):
    """bool evt value: x != 0 (x itself when bool)."""
    if meta_val(x).dtype == torch.bool:
        return b.val(x)
    return b.op("ne", [b.val(x), b.scalar(0, meta_val(x).dtype)])


@rule(aten.logical_not)
def _lnot(b, node, used):
    return b.result("eq", [_truth(b, node.args[0]), b.scalar(0, torch.bool)])


def _and_or(b, node, is_and):
    """x and y = where(x, y, false); x or y = where(x, true, y), on the truth values of the operands."""
    x, y = _truth(b, node.args[0]), _truth(b, node.args[1])
    if is_and:
        return b.result("where", [x, y, b.scalar(0, torch.bool)])
    return b.result("where", [x, b.scalar(1, torch.bool), y])


@rule(aten.logical_and, aten.logical_or)
def _land(b, node, used):
    return _and_or(b, node, node.target.overloadpacket == aten.logical_and)


@rule(aten.bitwise_and, aten.bitwise_or, aten.bitwise_not)
def _bitwise(b, node, used):
    ts = [a for a in node.args if is_tensor_node(a)]
    if len(ts) != len(node.args) or any(meta_val(t).dtype != torch.bool for t in ts):
        raise Unsupported("bitwise ops on other than bool tensors")
    if node.target.overloadpacket == aten.bitwise_not:
        return _lnot(b, node, used)
    return _and_or(b, node, node.target.overloadpacket == aten.bitwise_and)


@rule(aten.log1p)
def _log1p(b, node, used):
    # The interpreter computes in double, so log(1 + x) rounded to f32 keeps log1p's accuracy for |x| >~ 1e-9.
    dt = out(node).dtype
    return b.result("log", [b.op("add", [b.cast(node.args[0], dt), b.scalar(1.0, dt)])])


@rule(aten.expm1)
def _expm1(b, node, used):
    dt = out(node).dtype
    return b.result("sub", [b.op("exp", [b.cast(node.args[0], dt)]), b.scalar(1.0, dt)])


@rule(aten.elu)
def _elu(b, node, used):
    x = node.args[0]
    alpha, scale, iscale = arg(node, 1, "alpha", 1.0), arg(node, 2, "scale", 1.0), arg(node, 3, "input_scale", 1.0)
    dt = out(node).dtype
    xn = b.val(x)
    pos = b.op("mul", [xn, b.scalar(float(scale), dt)])
    e = b.op("sub", [b.op("exp", [b.op("mul", [xn, b.scalar(float(iscale), dt)])]), b.scalar(1.0, dt)])
    neg = b.op("mul", [e, b.scalar(float(alpha) * float(scale), dt)])
    return b.result("where", [b.op("gt", [xn, b.scalar(0.0, dt)]), pos, neg])


@rule(aten.var)
def _var(b, node, used):
    x = node.args[0]
    if node.target != aten.var.correction:
        raise Unsupported("var overload")
    shp = static_shape(meta_val(x))
    dims = arg(node, 1, "dim", None)
    dims = list(range(len(shp))) if not dims else [d % len(shp) for d in _ints(dims)]
    corr = node.kwargs.get("correction", 1)
    corr = 1 if corr is None else corr
    keep = node.kwargs.get("keepdim", False)
    n = 1
    for d in dims:
        n *= shp[d]
    dt = out(node).dtype
    xn = b.val(x)
    d = b.op("sub", [xn, b.op("mean", [xn], {"dims": dims, "keepdim": 1})])
    s2 = b.op("sum", [b.op("mul", [d, d])], {"dims": dims, "keepdim": 1 if keep else 0})
    return b.result("div", [s2, b.scalar(float(max(n - corr, 0)), dt)])


@rule(aten.linalg_vector_norm)
def _vnorm(b, node, used):
    x = node.args[0]
    ord_ = arg(node, 1, "ord", 2)
    dims, keep = arg(node, 2, "dim", None), arg(node, 3, "keepdim", False)
    if arg(node, 4, "dtype") is not None:
        raise Unsupported("dtype argument")
    r = meta_val(x).dim()
    attrs = {"dims": [] if not dims else [d % r for d in _ints(dims)]}
    if keep:
        attrs["keepdim"] = 1
    xn = b.val(x)
    if ord_ == 2:
        return b.result("sqrt", [b.op("sum", [b.op("mul", [xn, xn])], attrs)])
    if ord_ == 1:
        return b.result("sum", [b.op("abs", [xn])], attrs)
    if ord_ == float("inf"):
        return b.result("amax", [b.op("abs", [xn])], attrs)
    raise Unsupported(f"ord={ord_}")


@rule(aten.any)
def _any(b, node, used):
    x = node.args[0]
    r = meta_val(x).dim()
    dims = arg(node, 1, "dim", None) if node.target != aten.any.default else None
    dims = [] if dims is None else [d % r for d in _ints(dims if isinstance(dims, (list, tuple)) else [dims])]
    attrs = {"dims": dims}
    if arg(node, 2, "keepdim", False):
        attrs["keepdim"] = 1
    # the truth values as f32 0 / 1 (exact): their max is a row reduction the visitor has (it has none in i32), so
    # the safe softmax's all-masked-rows test fuses with the softmax instead of running node by node
    t = b.op("cast", [_truth(b, x)], {"dtype": "f32"})
    return b.result("ne", [b.op("amax", [t], attrs), b.scalar(0, torch.float32)])


# ---- copies, casts, layout ------------------------------------------------------------------------

@rule(aten.alias, aten.clone, aten.detach, aten.lift_fresh_copy, aten.contiguous)
def _identity(b, node, used):
    x = node.args[0]
    if meta_val(x).dtype != out(node).dtype or static_shape(meta_val(x)) != static_shape(out(node)):
        raise Unsupported("identity changes the type")
    return b.val(x)


@rule(aten._to_copy)
def _to_copy(b, node, used):
    x, v = node.args[0], out(node)
    if v.device != meta_val(x).device:
        raise Unsupported("device change")
    if meta_val(x).dtype == v.dtype:
        return b.val(x)
    if v.dtype in FP8_DTYPES:
        raise Unsupported("a cast to fp8: evt's saturates to +-max, PyTorch's gives NaN / inf past it")
    return b.result("cast", [b.val(x)], {"dtype": DTYPE_NAMES.get(v.dtype, "?")})


@rule(aten.view, aten._unsafe_view, aten.reshape, aten.squeeze, aten.unsqueeze, aten.flatten, aten.unflatten)
def _reshape(b, node, used):
    x = node.args[0]
    if node.target == aten.view.dtype:
        raise Unsupported("view as another dtype")
    shape = static_shape(out(node))
    if static_shape(meta_val(x)) == shape:
        return b.val(x)
    return b.result("reshape", [b.val(x)], {"shape": shape})


@rule(aten.permute)
def _permute(b, node, used):
    dims = _ints(node.args[1])
    if dims == list(range(len(dims))):
        return b.val(node.args[0])
    return b.result("permute", [b.val(node.args[0])], {"dims": dims})


@rule(aten.t)
def _t(b, node, used):
    if meta_val(node.args[0]).dim() < 2:
        return b.val(node.args[0])
    return b.result("permute", [b.val(node.args[0])], {"dims": [1, 0]})


@rule(aten.transpose)
def _transpose(b, node, used):
    r = meta_val(node.args[0]).dim()
    d0, d1 = node.args[1] % max(r, 1), node.args[2] % max(r, 1)
    if d0 == d1:
        return b.val(node.args[0])
    return b.result("transpose", [b.val(node.args[0])], {"dims": [d0, d1]})


@rule(aten.expand)
def _expand(b, node, used):
    x = node.args[0]
    shape = static_shape(out(node))
    if static_shape(meta_val(x)) == shape:
        return b.val(x)
    return b.result("expand", [b.val(x)], {"shape": shape})


def _norm_dim(d, r):
    return d % r if r else 0


@rule(aten.slice)
def _slice(b, node, used):
    x = node.args[0]
    r = meta_val(x).dim()
    dim = _norm_dim(arg(node, 1, "dim", 0), r)
    start, end, step = arg(node, 2, "start", None), arg(node, 3, "end", None), arg(node, 4, "step", 1)
    size = static_shape(meta_val(x))[dim]
    start = 0 if start is None else start
    end = size if end is None else end
    n = static_shape(out(node))[dim]
    if isinstance(end, torch.fx.Node) and isinstance(start, int) and isinstance(step, int) and start >= 0:
        end = start + (n - 1) * step + 1 if n else start  # symbolic end: the one meta["val"] implies
    _ints([start, end, step])
    start = max(0, min(size, start + size if start < 0 else start))
    end = max(0, min(size, end + size if end < 0 else end))
    if start == 0 and end >= size and step == 1:
        return b.val(x)
    return b.result("slice", [b.val(x)], {"dim": dim, "start": start, "end": max(end, start), "step": step})


@rule(aten.select)
def _select(b, node, used):
    x = node.args[0]
    shp = static_shape(meta_val(x))
    dim = _norm_dim(node.args[1], len(shp))
    idx = _ints([node.args[2]])[0]
    idx = idx + shp[dim] if idx < 0 else idx
    s = b.op("slice", [b.val(x)], {"dim": dim, "start": idx, "end": idx + 1})
    return b.result("reshape", [s], {"shape": static_shape(out(node))})


def _static_or(x, fallback):
    """x if it is a plain int, else `fallback` (a symbolic size: use what meta["val"] says)."""
    return x if isinstance(x, int) else fallback


@rule(aten.slice_backward)
def _slice_bwd(b, node, used):
    dy, _, dim, start, end, step = node.args[:6]
    sizes = static_shape(out(node))  # = input_sizes, also when those are symbolic in the graph
    dim = _norm_dim(dim, len(sizes))
    size = sizes[dim]
    n = static_shape(meta_val(dy))[dim]
    start, step = _ints([start, step])
    start = max(0, min(size, start + size if start < 0 else start))
    end = _static_or(end, start + (n - 1) * step + 1 if n else start)
    end = max(0, min(size, end + size if end < 0 else end))
    return b.result("slice_backward", [b.val(dy)],
                    {"dim": dim, "start": start, "end": max(end, start), "step": step, "shape": sizes})


@rule(aten.select_backward)
def _select_bwd(b, node, used):
    dy, _, dim, idx = node.args[:4]
    sizes = static_shape(out(node))
    dim = _norm_dim(dim, len(sizes))
    idx = _ints([idx])[0]
    idx = idx + sizes[dim] if idx < 0 else idx
    shp = list(sizes)
    shp[dim] = 1
    r = b.reshape(b.val(dy), shp)
    return b.result("slice_backward", [r], {"dim": dim, "start": idx, "end": idx + 1, "shape": sizes})


@rule(aten.cat)
def _cat(b, node, used):
    xs = [x for x in node.args[0] if static_shape(meta_val(x)) != [0]]
    v = out(node)
    dim = _norm_dim(arg(node, 1, "dim", 0), v.dim())
    names = [b.cast(x, v.dtype) for x in xs]
    if len(names) == 1:
        return names[0]
    while len(names) > 8:
        names = [b.op("concat", names[:8], {"dim": dim})] + names[8:]
    return b.result("concat", names, {"dim": dim})


@rule(aten.split_with_sizes, aten.split)
def _split(b, node, used):
    x = node.args[0]
    shp = static_shape(meta_val(x))
    dim = _norm_dim(arg(node, 2, "dim", 0), len(shp))
    if node.target == aten.split.Tensor:
        sz = _ints([node.args[1]])[0]
        sizes = [min(sz, shp[dim] - s) for s in range(0, shp[dim], sz)]
    elif node.target == aten.split_with_sizes.default:
        sizes = _ints(node.args[1])
    else:
        raise Unsupported("split overload")
    res, start = {}, 0
    for i, s in enumerate(sizes):
        if i in used:
            res[i] = b.result("slice", [b.val(x)], {"dim": dim, "start": start, "end": start + s},
                              val=out(node)[i])
        start += s
    return res


# ---- sources --------------------------------------------------------------------------------------

@rule(aten.full)
def _full(b, node, used):
    return b.result("full", [], {"value": number(node.args[1])})


@rule(aten.scalar_tensor)
def _scalar_tensor(b, node, used):
    return b.result("scalar", [], {"value": number(node.args[0])})


# ---- reductions -----------------------------------------------------------------------------------

def _reduce(evt_op):
    def fn(b, node, used):
        x, v = node.args[0], out(node)
        r = meta_val(x).dim()
        dims = arg(node, 1, "dim", None)
        if node.target.overloadpacket in (aten.sum, aten.mean) and node.target._overloadname == "default":
            dims = None
        keep = bool(arg(node, 2, "keepdim", False))
        dims = [] if dims is None else [d % r for d in _ints(dims if isinstance(dims, (list, tuple)) else [dims])]
        if r == 0:
            return b.cast(x, v.dtype)
        attrs = {"dims": dims}
        if keep:
            attrs["keepdim"] = 1
        src = b.cast(x, v.dtype if evt_op != "amax" else meta_val(x).dtype)
        return b.result(evt_op, [src], attrs)
    return fn


TABLE[aten.sum] = _reduce("sum")
TABLE[aten.mean] = _reduce("mean")
TABLE[aten.amax] = _reduce("amax")


# ---- matrix products ------------------------------------------------------------------------------

@rule(aten.mm)
def _mm(b, node, used):
    return b.result("mm", [b.val(node.args[0]), b.val(node.args[1])])


@rule(aten.bmm)
def _bmm(b, node, used):
    return b.result("bmm", [b.val(node.args[0]), b.val(node.args[1])])


@rule(aten.addmm)
def _addmm(b, node, used):
    if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
        raise Unsupported("addmm with beta/alpha")
    return b.result("addmm", [b.val(node.args[0]), b.val(node.args[1]), b.val(node.args[2])])


# ---- convolution and pooling ------------------------------------------------------------------------

def _conv_attrs(stride, padding, dilation, groups, one_d):
    st, pd, dl = _ints(stride), _ints(padding), _ints(dilation)
    if one_d:
        st, pd, dl = [1] + st, [0] + pd, [1] + dl
    return {"stride": st, "padding": pd, "dilation": dl, "groups": int(groups)}


@rule(aten.convolution)
def _conv(b, node, used):
    x, w, bias, stride, padding, dilation, transposed, out_pad, groups = node.args[:9]
    if transposed:
        raise Unsupported("transposed convolution")
    r = meta_val(x).dim()
    if r not in (3, 4):
        raise Unsupported(f"{r - 2}-d convolution")
    one_d = r == 3
    attrs = _conv_attrs(stride, padding, dilation, groups, one_d)
    xs, ws = static_shape(meta_val(x)), static_shape(meta_val(w))
    xn, wn = b.val(x), b.val(w)
    if one_d:
        xn = b.reshape(xn, [xs[0], xs[1], 1, xs[2]])
        wn = b.reshape(wn, [ws[0], ws[1], 1, ws[2]])
    o = static_shape(out(node))
    if not one_d and bias is None:
        return b.result("conv2d", [xn, wn], attrs)
    y = b.op("conv2d", [xn, wn], attrs)
    if bias is not None:
        bb = b.reshape(b.val(bias), [1, ws[0], 1, 1])
        if not one_d:
            return b.result("add", [y, bb])
        y = b.op("add", [y, bb])
    return b.result("reshape", [y], {"shape": o})


@rule(aten.convolution_backward)
def _conv_bwd(b, node, used):
    dy, x, w, bias_sizes, stride, padding, dilation, transposed, out_pad, groups, mask = node.args[:11]
    if transposed:
        raise Unsupported("transposed convolution")
    r = meta_val(x).dim()
    if r not in (3, 4):
        raise Unsupported(f"{r - 2}-d convolution")
    one_d = r == 3
    attrs = _conv_attrs(stride, padding, dilation, groups, one_d)
    xs, ws, ds = static_shape(meta_val(x)), static_shape(meta_val(w)), static_shape(meta_val(dy))
    vals = out(node)
    xn, wn, dn = b.val(x) if 1 in used else None, b.val(w) if 0 in used else None, b.val(dy)
    x4, w4 = xs, ws
    if one_d:
        x4, w4 = [xs[0], xs[1], 1, xs[2]], [ws[0], ws[1], 1, ws[2]]
        dn = b.reshape(dn, [ds[0], ds[1], 1, ds[2]])
        xn = b.reshape(xn, x4) if xn else None
        wn = b.reshape(wn, w4) if wn else None
    res = {}
    if 0 in used:
        d = b.op("conv2d_backward_input", [dn, wn], dict(attrs, shape=x4))
        res[0] = b.result("reshape", [d], {"shape": xs}, val=vals[0])
    if 1 in used:
        d = b.op("conv2d_backward_weight", [xn, dn], dict(attrs, shape=w4))
        res[1] = b.result("reshape", [d], {"shape": ws}, val=vals[1])
    if 2 in used:
        res[2] = b.result("sum", [dn], {"dims": [0, 2, 3]}, val=vals[2])
    return res


def _pool_args(node, x):
    kernel = _ints(node.args[1])
    stride = _ints(arg(node, 2, "stride", []) or kernel)
    padding = _ints(arg(node, 3, "padding", [0]))
    if len(kernel) == 1:
        kernel = kernel * 2
    if len(stride) == 1:
        stride = stride * 2
    if len(padding) == 1:
        padding = padding * 2
    if meta_val(x).dim() != 4:
        raise Unsupported("pooling needs NCHW")
    return {"kernel": kernel, "stride": stride, "padding": padding}


@rule(aten.max_pool2d_with_indices)
def _maxpool(b, node, used):
    x = node.args[0]
    dil = _ints(arg(node, 4, "dilation", [1]))
    if any(d != 1 for d in dil) or arg(node, 5, "ceil_mode", False):
        raise Unsupported("dilation or ceil_mode")
    if used - {0}:
        raise Unsupported("the indices output")
    return {0: b.result("max_pool2d", [b.val(x)], _pool_args(node, x), val=out(node)[0])}


@rule(aten.max_pool2d_with_indices_backward)
def _maxpool_bwd(b, node, used):
    dy, x = node.args[0], node.args[1]
    a = _pool_args(node, x)
    a["padding"] = _ints(node.args[4]) * (2 if len(node.args[4]) == 1 else 1)
    a["stride"] = _ints(node.args[3] or node.args[2])
    if len(a["stride"]) == 1:
        a["stride"] *= 2
    if any(d != 1 for d in _ints(node.args[5])) or node.args[6]:
        raise Unsupported("dilation or ceil_mode")
    # evt routes each window's gradient to its first maximum of x, as PyTorch's indices do.
    return b.result("max_pool2d_backward", [b.val(dy), b.val(x)], a)


@rule(aten.avg_pool2d)
def _avgpool(b, node, used):
    x = node.args[0]
    if arg(node, 4, "ceil_mode", False) or not arg(node, 5, "count_include_pad", True) or \
            arg(node, 6, "divisor_override", None) is not None:
        raise Unsupported("ceil_mode / count_include_pad=False / divisor_override")
    return b.result("avg_pool2d", [b.val(x)], _pool_args(node, x))


@rule(aten.avg_pool2d_backward)
def _avgpool_bwd(b, node, used):
    dy, x, kernel, stride, padding, ceil, cip, div = node.args[:8]
    if ceil or not cip or div is not None:
        raise Unsupported("ceil_mode / count_include_pad=False / divisor_override")
    a = {"kernel": _ints(kernel), "stride": _ints(stride or kernel), "padding": _ints(padding)}
    for k in a:
        if len(a[k]) == 1:
            a[k] = a[k] * 2
    a["shape"] = static_shape(meta_val(x))
    return b.result("avg_pool2d_backward", [b.val(dy)], a)


@rule(aten.adaptive_max_pool2d)
def _amaxpool(b, node, used):
    x = node.args[0]
    if meta_val(x).dim() != 4:
        raise Unsupported("needs NCHW")
    if used - {0}:
        raise Unsupported("the indices output")
    return {0: b.result("adaptive_max_pool2d", [b.val(x)], {"shape": _ints(node.args[1])}, val=out(node)[0])}


@rule(aten.adaptive_max_pool2d_backward)
def _amaxpool_bwd(b, node, used):
    dy, x = node.args[0], node.args[1]
    if meta_val(x).dim() != 4:
        raise Unsupported("needs NCHW")
    return b.result("adaptive_max_pool2d_backward", [b.val(dy), b.val(x)],
                    {"shape": static_shape(meta_val(dy))[2:]})


# ---- row ops --------------------------------------------------------------------------------------

def _softmax(evt_op):
    def fn(b, node, used):
        x, dim, half = node.args[:3]
        if half:
            raise Unsupported("half_to_float")
        d = dim % meta_val(x).dim()
        if evt_op == "log_softmax" and node.meta.get("evt_stable_log_softmax"):
            return _stable_log_softmax(b, x, d)
        return _opmath_result(b, evt_op, [x], {"dim": d})
    return fn


def _stable_log_softmax(b, x, d):
    """log_softmax(x) as x - max - log(sum(exp(x - max))) over dim d, in f32 (rounded once to a 16-bit result):
    finite wherever PyTorch's is, where evt's log(softmax(x)) is -inf once a probability underflows f32 (a log-softmax
    the module returns to its caller: rewrites.mark_returned_log_softmax). Two more reductions than the row op."""
    xf = b.cast(x, torch.float32)
    z = b.op("sub", [xf, b.op("amax", [xf], {"dims": [d], "keepdim": 1})])
    lse = b.op("log", [b.op("sum", [b.op("exp", [z])], {"dims": [d], "keepdim": 1})])
    return _result_in(b, "sub", [z, lse], {}, torch.float32, out(b.cur))


def _softmax_bwd(evt_op):
    def fn(b, node, used):
        dy, y, dim = node.args[:3]
        return _opmath_result(b, evt_op, [dy, y], {"dim": dim % meta_val(y).dim()})
    return fn


TABLE[aten._softmax] = _softmax("softmax")
TABLE[aten._log_softmax] = _softmax("log_softmax")
TABLE[aten._softmax_backward_data] = _softmax_bwd("softmax_backward")
TABLE[aten._log_softmax_backward_data] = _softmax_bwd("log_softmax_backward")


def _ln_check(x, ns):
    """(rows shape, feature count) of a layer norm over the trailing dims ns."""
    shp = static_shape(meta_val(x))
    ns = _ints(ns)
    k = len(ns)
    if k == 0 or k > len(shp) or shp[len(shp) - k:] != ns:
        raise Unsupported("normalized_shape does not match the trailing dims")
    feat = 1
    for d in ns:
        feat *= d
    return shp[:len(shp) - k], feat


def _flat(b, name, rows, feat, k):
    """name reshaped to rows + [feat] when the norm covers k > 1 dims (else unchanged)."""
    return b.reshape(name, rows + [feat]) if k > 1 else name


def _row_stats(b, xn, eps, dims, dt):
    """(mean, rstd) of xn over dims, keepdim: rstd = 1/sqrt(mean((x-mean)^2) + eps)."""
    m = b.op("mean", [xn], {"dims": dims, "keepdim": 1})
    d = b.op("sub", [xn, m])
    var = b.op("mean", [b.op("mul", [d, d])], {"dims": dims, "keepdim": 1})
    return m, var, b.op("rsqrt", [b.op("add", [var, b.scalar(eps, dt)])])


def _ln_compute_dtype(x, w):
    """The dtype a layer norm computes in: x's, or the affine weight's when they differ (CPU autocast runs
    layer norm on a bf16 x with f32 weights, computing in f32 and returning x's dtype)."""
    xdt = meta_val(x).dtype
    wdt = meta_val(w).dtype if is_tensor_node(w) else xdt
    return xdt if wdt == xdt else torch.promote_types(xdt, wdt)


def _result_in(b, op, operands, attrs, cdt, val):
    """The statement holding an FX value that evt computes in cdt: the op itself when val has that dtype,
    else the op (in cdt) cast to val's dtype."""
    if val.dtype == cdt:
        return b.result(op, operands, attrs, val=val)
    return b.result("cast", [b.op(op, operands, attrs)], {"dtype": DTYPE_NAMES[val.dtype]}, val=val)


def _ln_result(b, name, k, cdt, val):
    """The statement holding a layer-norm output computed in cdt: reshaped back (k > 1), cast to val's dtype."""
    if val.dtype == cdt:
        return b.result("reshape", [name], {"shape": static_shape(val)}, val=val)
    if k > 1:
        name = b.op("reshape", [name], {"shape": static_shape(val)})
    return b.result("cast", [name], {"dtype": DTYPE_NAMES[val.dtype]}, val=val)


@rule(aten.native_layer_norm)
def _layer_norm(b, node, used):
    x, ns, w, bias, eps = node.args[:5]
    rows, feat = _ln_check(x, ns)
    k = len(ns)
    if w is None and bias is not None:
        raise Unsupported("layer norm with a bias but no weight")
    vals, res = out(node), {}
    cdt = _ln_compute_dtype(x, w)
    xn = _flat(b, b.cast(x, cdt), rows, feat, k)
    aff = [_flat(b, b.cast(t, cdt), [], feat, k) for t in (w, bias) if t is not None]
    if 0 in used:
        if k == 1 and cdt == vals[0].dtype:
            res[0] = b.result("layer_norm", [xn] + aff, {"eps": float(eps)}, val=vals[0])
        else:
            res[0] = _ln_result(b, b.op("layer_norm", [xn] + aff, {"eps": float(eps)}), k, cdt, vals[0])
    if used & {1, 2}:
        m, _, r = _row_stats(b, xn, float(eps), [-1], cdt)
        if 1 in used:
            res[1] = _ln_result(b, m, 2, cdt, vals[1])  # (k=2: always reshaped)
        if 2 in used:
            res[2] = _ln_result(b, r, 2, cdt, vals[2])
    return res


@rule(aten.native_layer_norm_backward)
def _layer_norm_bwd(b, node, used):
    dy, x, ns, mean, rstd, w, bias, mask = node.args[:8]
    return _layer_norm_bwd_math(b, node, used, dy, x, ns, w, node.meta.get("evt_eps"), mean, rstd)


def _evt_layer_norm_bwd(b, node, used):  # (registered after evt::layer_norm_backward is defined)
    dy, x, ns, w, bias, eps = node.args[:6]
    return _layer_norm_bwd_math(b, node, used, dy, x, ns, w, float(eps), None, None)


def _norm_bwd_from_stats(b, used, dyn, xn, wn, m, r, norm_dims, sum_dims):
    """The (op, operands, attrs) of a normalization's dx (0) and dw (1) from saved statistics m / r (broadcast to
    xn), as PyTorch's kernels compute them: x̂ = (x - m)·r, g = dy [· w], dx = (g - mean(g) - x̂·mean(g·x̂))·r
    with the means over norm_dims, dw = Σ dy·x̂ over sum_dims."""
    final = {}
    xhat = b.op("mul", [b.op("sub", [xn, m]), r])
    if 1 in used:
        final[1] = ("sum", [b.op("mul", [dyn, xhat])], {"dims": sum_dims})
    if 0 in used:
        g = b.op("mul", [dyn, wn]) if wn else dyn
        mg = b.op("mean", [g], {"dims": norm_dims, "keepdim": 1})
        mgx = b.op("mean", [b.op("mul", [g, xhat])], {"dims": norm_dims, "keepdim": 1})
        t = b.op("sub", [b.op("sub", [g, mg]), b.op("mul", [xhat, mgx])])
        final[0] = ("mul", [t, r], {})
    return final


def _layer_norm_bwd_math(b, node, used, dy, x, ns, w, eps, mean, rstd):
    """(dx, dw, db) of a layer norm: the row ops (statistics recomputed from x) when eps is known, else
    the same math from the saved statistics mean / rstd."""
    rows, feat = _ln_check(x, ns)
    k = len(ns)
    vals, res = out(node), {}
    cdt = _ln_compute_dtype(x, w)
    dyn, xn = _flat(b, b.cast(dy, cdt), rows, feat, k), _flat(b, b.cast(x, cdt), rows, feat, k)
    wn = _flat(b, b.cast(w, cdt), [], feat, k) if w is not None else None
    rdims = list(range(len(rows)))
    final = {}
    if eps is not None:
        # The whole row op: evt recomputes the statistics from x (eps recorded from the joint graph).
        if 0 in used:
            final[0] = ("layer_norm_backward_input", [dyn, xn] + ([wn] if wn else []), {"eps": float(eps)})
        if 1 in used:
            final[1] = ("layer_norm_backward_weight", [dyn, xn], {"eps": float(eps)})
    elif used & {0, 1}:
        # No eps known: the same math from the saved statistics (as PyTorch's own kernel does).
        mn, rn = _flat(b, b.cast(mean, cdt), rows, 1, k), _flat(b, b.cast(rstd, cdt), rows, 1, k)
        final.update(_norm_bwd_from_stats(b, used, dyn, xn, wn, mn, rn, [-1], rdims))
    if 2 in used:
        final[2] = ("sum", [dyn], {"dims": rdims})
    for i, (op, ops, attrs) in sorted(final.items()):
        if k == 1 and vals[i].dtype == cdt:
            res[i] = b.result(op, ops, attrs, val=vals[i])
        else:
            res[i] = _ln_result(b, b.op(op, ops, attrs), k, cdt, vals[i])
    return res


@rule(aten._native_batch_norm_legit_no_training)
def _batch_norm_eval(b, node, used):
    x, w, bias, rm, rv, momentum, eps = node.args[:7]
    if used - {0}:
        raise Unsupported("batch norm eval statistics outputs")
    shp = static_shape(meta_val(x))
    dt = meta_val(x).dtype
    bc = [1, shp[1]] + [1] * (len(shp) - 2)
    y = b.op("mul", [b.op("sub", [b.val(x), b.reshape(b.val(rm), bc)]),
                     b.reshape(b.op("rsqrt", [b.op("add", [b.val(rv), b.scalar(float(eps), dt)])]), bc)])
    if w is not None:
        y = b.op("mul", [y, b.reshape(b.val(w), bc)])
    if bias is not None:
        y = b.op("add", [y, b.reshape(b.val(bias), bc)])
    return {0: b.result("reshape", [y], {"shape": shp}, val=out(node)[0])}


@rule(aten._native_batch_norm_legit_functional, aten.native_batch_norm, aten._native_batch_norm_legit)
def _batch_norm(b, node, used):
    if node.target == aten._native_batch_norm_legit.no_stats:
        raise Unsupported("batch norm without running stats")
    x, w, bias, rm, rv, training, momentum, eps = node.args[:8]
    if not training:
        raise Unsupported("batch norm in eval mode")
    if w is None and bias is not None:
        raise Unsupported("batch norm with a bias but no weight")
    functional = node.target == aten._native_batch_norm_legit_functional.default
    if not functional and used - {0, 1, 2}:
        raise Unsupported("batch norm output")
    if not functional and rm is not None:
        raise Unsupported("in-place running-stat update")
    vals, res = out(node), {}
    dt = _ln_compute_dtype(x, w)  # (CUDA autocast: bf16 x with f32 affine and statistics, computed in f32)
    xn = b.cast(x, dt)
    shp = static_shape(meta_val(x))
    dims = [0] + list(range(2, len(shp)))
    ops = [xn] + ([b.cast(w, dt)] if w is not None else []) + ([b.cast(bias, dt)] if bias is not None else [])
    if 0 in used:
        res[0] = _result_in(b, "batch_norm", ops, {"eps": float(eps)}, dt, vals[0])
    if used - {0}:
        m, var, r = _row_stats(b, xn, float(eps), dims, dt)
        C = [shp[1]]
        if 1 in used:
            res[1] = _result_in(b, "reshape", [m], {"shape": C}, dt, vals[1])
        if 2 in used:
            res[2] = _result_in(b, "reshape", [r], {"shape": C}, dt, vals[2])
        n = 1
        for i in dims:
            n *= shp[i]
        mom = float(momentum)
        if 3 in used:
            keep = b.op("mul", [b.cast(rm, dt), b.scalar(1.0 - mom, dt)])
            new = b.op("mul", [b.reshape(m, C), b.scalar(mom, dt)])
            res[3] = _result_in(b, "add", [keep, new], {}, dt, vals[3])
        if 4 in used:
            unb = b.op("mul", [b.reshape(var, C), b.scalar(mom * n / max(n - 1, 1), dt)])
            keep = b.op("mul", [b.cast(rv, dt), b.scalar(1.0 - mom, dt)])
            res[4] = _result_in(b, "add", [keep, unb], {}, dt, vals[4])
    return res


@rule(aten.native_batch_norm_backward)
def _batch_norm_bwd(b, node, used):
    dy, x, w, rm, rv, smean, sinv, train, eps, mask = node.args[:10]
    if not train:
        raise Unsupported("batch norm backward in eval mode")
    vals, res = out(node), {}
    dt = _ln_compute_dtype(x, w)
    dyn, xn = b.cast(dy, dt), b.cast(x, dt)
    nd = meta_val(x).dim()
    dims = [0] + list(range(2, nd))
    if smean is not None and sinv is not None and used & {0, 1}:
        # From the forward's saved statistics, as PyTorch's kernel does: x̂ needs no statistics pass over x
        # (evt's batch_norm_backward_* ops recompute them: one more pass)
        bc = [1, meta_val(x).shape[1]] + [1] * (nd - 2)
        m, r = b.reshape(b.cast(smean, dt), bc), b.reshape(b.cast(sinv, dt), bc)
        wn = b.reshape(b.cast(w, dt), bc) if w is not None else None
        for i, (op, ops, attrs) in _norm_bwd_from_stats(b, used, dyn, xn, wn, m, r, dims, dims).items():
            res[i] = _result_in(b, op, ops, attrs, dt, vals[i])
    elif used & {0, 1}:
        if 0 in used:
            ops = [dyn, xn] + ([b.cast(w, dt)] if w is not None else [])
            res[0] = _result_in(b, "batch_norm_backward_input", ops, {"eps": float(eps)}, dt, vals[0])
        if 1 in used:
            res[1] = _result_in(b, "batch_norm_backward_weight", [dyn, xn], {"eps": float(eps)}, dt, vals[1])
    if 2 in used:
        res[2] = _result_in(b, "sum", [dyn], {"dims": dims}, dt, vals[2])
    return res


# ---- losses ---------------------------------------------------------------------------------------

_RED = {0: "none", 1: "mean", 2: "sum"}


@rule(aten.nll_loss_forward)
def _nll(b, node, used):
    logp, target, weight, reduction, ignore = node.args[:5]
    if weight is not None:
        raise Unsupported("class weights")
    if meta_val(logp).dim() != 2:
        raise Unsupported("nll_loss on other than [N, C]")
    vals, res = out(node), {}
    red = _RED[int(reduction)]
    attrs = {"reduction": red, "ignore_index": int(ignore)}
    if 0 in used:
        res[0] = b.result("nll_loss", [b.val(logp), b.val(target)], attrs, val=vals[0])
    if 1 in used:
        if red == "none":
            raise Unsupported("total_weight of reduction=none")
        t = b.val(target)
        keep = b.op("ne", [t, b.scalar(int(ignore), meta_val(target).dtype)])
        cnt = b.op("cast", [keep], {"dtype": DTYPE_NAMES[meta_val(logp).dtype]})
        res[1] = b.result("sum", [cnt], {"dims": []}, val=vals[1])
    return res


@rule(aten.nll_loss_backward)
def _nll_bwd(b, node, used):
    dy, logp, target, weight, reduction, ignore, total = node.args[:7]
    if weight is not None:
        raise Unsupported("class weights")
    if meta_val(logp).dim() != 2:
        raise Unsupported("nll_loss on other than [N, C]")
    return b.result("nll_loss_backward", [b.val(dy), b.val(logp), b.val(target)],
                    {"reduction": _RED[int(reduction)], "ignore_index": int(ignore)})


@rule(aten.binary_cross_entropy_with_logits)
def _bce(b, node, used):
    x, y = node.args[:2]
    if arg(node, 2, "weight") is not None or arg(node, 3, "pos_weight") is not None:
        raise Unsupported("weight / pos_weight")
    red = _RED[int(arg(node, 4, "reduction", 1))]
    return b.result("bce_with_logits", [b.val(x), b.cast(y, meta_val(x).dtype)], {"reduction": red})


@rule(aten.mse_loss)
def _mse(b, node, used):
    red = _RED[int(arg(node, 2, "reduction", 1))]
    return b.result("mse_loss", [b.val(node.args[0]), b.val(node.args[1])], {"reduction": red})


@rule(aten.mse_loss_backward)
def _mse_bwd(b, node, used):
    dy, x, y, red = node.args[:4]
    return b.result("mse_loss_backward", [b.val(dy), b.val(x), b.val(y)], {"reduction": _RED[int(red)]})


# ---- gathers --------------------------------------------------------------------------------------

@rule(aten.embedding)
def _embedding(b, node, used):
    w, idx = node.args[:2]
    return b.result("embedding", [b.val(w), b.val(idx)])


@rule(aten.embedding_dense_backward)
def _embedding_bwd(b, node, used):
    dy, idx, num, pad, scale = node.args[:5]
    if int(pad) >= 0 or scale:
        raise Unsupported("padding_idx / scale_grad_by_freq")
    return b.result("embedding_backward", [b.val(dy), b.val(idx)], {"shape": static_shape(out(node))})


@rule(aten.index_select)
def _index_select(b, node, used):
    x, dim, idx = node.args[:3]
    return b.result("index_select", [b.val(x), b.val(idx)], {"dim": dim % meta_val(x).dim()})


# Message passing over an edge list (torch_geometric's aggregation, its degree normalization and their backward):
# scatter_add / gather whose index repeats one 1-d index over every other dim (edge_index[1] viewed [-1, 1] and
# expanded over the features) are evt's scatter-add (index_select_backward) and index_select along that dim.
# Other index tensors pick a different element per position: no evt op, they run in PyTorch.

def _broadcast_index(b, index, dim):
    """The evt name of the 1-d i64 index that `index` (an FX node) repeats over every dim but `dim`: index itself
    when 1-d, else the input of the expand that made it, shaped 1 in every other dim."""
    iv = meta_val(index)
    if iv.dtype not in (torch.int64, torch.int32):
        raise Unsupported("index of dtype other than int64 / int32")
    if iv.dim() == 1:
        return b.cast(index, torch.int64)
    if getattr(index.target, "overloadpacket", None) is not aten.expand:
        raise Unsupported("index not a 1-d index expanded over the other dims")
    base = index.args[0]
    bs = static_shape(meta_val(base))
    if len(bs) != iv.dim() or any(s != 1 for d, s in enumerate(bs) if d != dim):
        raise Unsupported("index not a 1-d index expanded over the other dims")
    return b.reshape(b.cast(base, torch.int64), [bs[dim]])


def _index_fits(ishape, shape, dim):
    """scatter_add / gather read or write the block index.shape of every dim but dim; evt's ops take them whole."""
    return len(ishape) == len(shape) and all(ishape[d] == shape[d] for d in range(len(shape)) if d != dim)


@rule(aten.scatter_add)
def _scatter_add(b, node, used):
    """x.scatter_add(dim, index, src), index a 1-d index broadcast over the other dims and shaped like src:
    x + index_select_backward(src, index) along dim (floating point: integer sums would need a bound)."""
    x, dim, index, src = node.args[:4]
    v = out(node)
    if not v.dtype.is_floating_point:
        raise Unsupported("integer scatter_add")
    dim %= max(v.dim(), 1)
    xs, ishape = static_shape(meta_val(x)), static_shape(meta_val(index))
    if ishape != static_shape(meta_val(src)) or not _index_fits(ishape, xs, dim):
        raise Unsupported("scatter_add whose index is shaped unlike src or self")
    idx = _broadcast_index(b, index, dim)
    sc = b.op("index_select_backward", [b.cast(src, v.dtype), idx], {"dim": dim, "shape": xs})
    return b.result("add", [b.cast(x, v.dtype), sc])


@rule(aten.index_add)
def _index_add(b, node, used):
    """x.index_add(dim, index, src, alpha): x + alpha * index_select_backward(src, index) along dim (floating
    point, as scatter_add)."""
    x, dim, index, src = node.args[:4]
    alpha = arg(node, 4, "alpha", 1)
    v = out(node)
    if not v.dtype.is_floating_point:
        raise Unsupported("integer index_add")
    if meta_val(index).dim() != 1 or meta_val(index).dtype not in (torch.int64, torch.int32):
        raise Unsupported("index_add with an index other than 1-d integers")
    dim %= max(v.dim(), 1)
    sc = b.op("index_select_backward", [b.cast(src, v.dtype), b.cast(index, torch.int64)],
              {"dim": dim, "shape": static_shape(meta_val(x))})
    if alpha != 1:
        sc = b.op("mul", [sc, b.scalar(alpha, v.dtype)])
    return b.result("add", [b.cast(x, v.dtype), sc])

@rule(torch.ops.evt.spmm_csr)
def _spmm_csr(b, node, used):
    """evt::spmm_csr(crow, col, values, x) (evt.sparse_mm): evt's spmm."""
    crow, col, values, x = node.args[:4]
    dt = out(node).dtype
    return b.result("spmm", [b.cast(crow, torch.int64), b.cast(col, torch.int64), b.cast(values, dt), b.cast(x, dt)])


@rule(torch.ops.evt.spmm_csr_t)
def _spmm_csr_t(b, node, used):
    """evt::spmm_csr_t(crow, col, values, dy, k) (spmm_csr's backward): evt's spmm_t, A^T dy."""
    crow, col, values, dy = node.args[:4]
    dt = out(node).dtype
    return b.result("spmm_t", [b.cast(crow, torch.int64), b.cast(col, torch.int64), b.cast(values, dt),
                               b.cast(dy, dt)], {"shape": static_shape(out(node))})


@rule(torch.ops.evt.spmm_csr_values_grad)
def _spmm_csr_values_grad(b, node, used):
    raise Unsupported("evt's spmm has no gradient for its values")

@rule(aten.gather)
def _gather(b, node, used):
    """x.gather(dim, index), index a 1-d index broadcast over the other dims: index_select(x, index) along dim
    (the backward of scatter_add above)."""
    x, dim, index = node.args[:3]
    dim %= max(meta_val(x).dim(), 1)
    if not _index_fits(static_shape(meta_val(index)), static_shape(meta_val(x)), dim):
        raise Unsupported("gather of a block smaller than x")
    return b.result("index_select", [b.val(x), _broadcast_index(b, index, dim)], {"dim": dim})


@rule(aten.repeat)
def _repeat(b, node, used):
    """x.repeat(reps): x viewed [1, s0, 1, s1, ...], broadcast to [r0, s0, r1, s1, ...], reshaped to the result
    (tiles: out[i * s + j] = x[j] along each dim)."""
    x, reps = node.args[:2]
    reps = [int(r) for r in reps]
    shape = [1] * (len(reps) - meta_val(x).dim()) + static_shape(meta_val(x))
    ones = [d for s in shape for d in (1, s)]
    tiled = [d for r, s in zip(reps, shape) for d in (r, s)]
    y = b.op("expand", [b.reshape(b.val(x), ones)], {"shape": tiled})
    return b.result("reshape", [y], {"shape": static_shape(out(node))})


# ---- joint-graph rewrites ------------------------------------------------------------------------------
# PyTorch's max-pool backward ops take the forward's argmax indices, which evt does not produce: evt's
# backward recomputes each window's first maximum from x. rewrite_joint replaces them by the evt::
# operators below (same values: PyTorch's indices also point at each window's first maximum), so the
# indices become dead and the forward pool can run in evt. Their PyTorch implementation (used when evt
# falls back) recomputes the indices.

@torch.library.custom_op("evt::max_pool2d_backward", mutates_args=())
def max_pool2d_backward(dy: torch.Tensor, x: torch.Tensor, kernel: list[int], stride: list[int],
                        padding: list[int], dilation: list[int], ceil_mode: bool) -> torch.Tensor:
    _, idx = aten.max_pool2d_with_indices(x, kernel, stride, padding, dilation, ceil_mode)
    return aten.max_pool2d_with_indices_backward(dy, x, kernel, stride, padding, dilation, ceil_mode, idx)


@max_pool2d_backward.register_fake
def _(dy, x, kernel, stride, padding, dilation, ceil_mode):
    return torch.empty_like(x)


@torch.library.custom_op("evt::adaptive_max_pool2d_backward", mutates_args=())
def adaptive_max_pool2d_backward(dy: torch.Tensor, x: torch.Tensor, output_size: list[int]) -> torch.Tensor:
    _, idx = aten.adaptive_max_pool2d(x, output_size)
    return aten.adaptive_max_pool2d_backward(dy, x, idx)


@adaptive_max_pool2d_backward.register_fake
def _(dy, x, output_size):
    return torch.empty_like(x)


@torch.library.custom_op("evt::layer_norm_backward", mutates_args=())
def layer_norm_backward(dy: torch.Tensor, x: torch.Tensor, normalized_shape: list[int], w: torch.Tensor,
                        bias: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dw, db) of native_layer_norm(x, normalized_shape, w, bias, eps), with the statistics recomputed
    from x (PyTorch's kernels: its forward for mean / rstd, then its backward)."""
    _, mean, rstd = aten.native_layer_norm(x, normalized_shape, w, bias, eps)
    dx, dw, db = aten.native_layer_norm_backward(dy, x, normalized_shape, mean, rstd, w, bias, [True, True, True])
    return dx, dw, db


@layer_norm_backward.register_fake
def _(dy, x, normalized_shape, w, bias, eps):
    return torch.empty_like(x), torch.empty_like(w), torch.empty_like(bias)


TABLE[torch.ops.evt.layer_norm_backward] = _evt_layer_norm_bwd


def sdpa_grad_recompute(dout, q, k, v, is_causal, scale, attn_mask=None):
    """(dq, dk, dv) of scaled_dot_product_attention, recomputed with autograd (any device). k and v with fewer
    heads than q are grouped-query attention (enable_gqa), as the forward kernel took them."""
    with torch.enable_grad():
        qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
        o = torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, attn_mask=attn_mask, is_causal=is_causal,
                                                             scale=scale, enable_gqa=q.shape[-3] != k.shape[-3])
        return tuple(g.contiguous() for g in torch.autograd.grad(o, (qq, kk, vv), dout))


@torch.library.custom_op("evt::sdpa_backward", mutates_args=())
def sdpa_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
                  scale: float, attn_mask: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor,
                                                                                    torch.Tensor]:
    """(dq, dk, dv) of SDPA with no dropout; attn_mask (bool: true = keep, or additive float) gets no gradient."""
    sc = scale if scale > 0 else None
    if q.device.type != "cpu":
        return sdpa_grad_recompute(dout, q, k, v, is_causal, sc, attn_mask)
    out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, is_causal, attn_mask=attn_mask,
                                                                scale=sc)
    return aten._scaled_dot_product_flash_attention_for_cpu_backward(dout, q, k, v, out, lse, 0.0, is_causal,
                                                                     attn_mask=attn_mask, scale=sc)


@sdpa_backward.register_fake
def _(dout, q, k, v, is_causal, scale, attn_mask=None):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


# CUDA SDPA backward ops: (index of dropout_p, index of is_causal, index of attn_bias or None)
_CUDA_SDPA_BWD = {
    aten._scaled_dot_product_flash_attention_backward.default: (10, 11, None),
    aten._scaled_dot_product_efficient_attention_backward.default: (9, 11, 4),
    aten._scaled_dot_product_cudnn_attention_backward.default: (13, 14, 8),
}
# CUDA SDPA forward ops: (index of dropout_p, index of is_causal, index of attn_bias or None)
_CUDA_SDPA_FWD = {
    aten._scaled_dot_product_flash_attention: (3, 4, None),
    aten._scaled_dot_product_efficient_attention: (5, 6, 3),
    aten._scaled_dot_product_cudnn_attention: (5, 6, 3),
}


def _on_cuda(n):
    v = n.meta.get("val")
    v = v[0] if isinstance(v, (tuple, list)) and v else v
    sim = config.SIMULATE_CUDA_RULES
    return isinstance(v, torch.Tensor) and (v.device.type == "cuda" or (sim and v.device.type == "cpu"))


def _ln_recompute_args(n, devices):
    """(dy, x, normalized_shape, w, bias, eps) when the layer-norm backward n can recompute its statistics
    (evt::layer_norm_backward): its mean / rstd come from a native_layer_norm of the same x with an affine
    weight and bias, every gradient is wanted, and its output is on one of devices; else None."""
    if n.target != aten.native_layer_norm_backward.default or len(n.args) < 8:
        return None
    dy, x, ns, mean, rstd, w, bias, mask = n.args[:8]
    if list(mask) != [True, True, True] or not (is_tensor_node(w) and is_tensor_node(bias)):
        return None
    if not all(isinstance(t, torch.fx.Node) and t.target is operator.getitem for t in (mean, rstd)):
        return None
    fwd = mean.args[0]
    if fwd is not rstd.args[0] or getattr(fwd, "target", None) != aten.native_layer_norm.default:
        return None
    if fwd.args[0] is not x or list(fwd.args[1]) != list(ns) or fwd.args[2] is not w or fwd.args[3] is not bias:
        return None
    v = n.meta.get("val")
    v = v[0] if isinstance(v, (tuple, list)) else v
    if not isinstance(v, torch.Tensor) or v.device.type not in devices:
        return None
    return dy, x, list(ns), w, bias, float(fwd.args[4])


def rewrite_joint(gm, attention=False, cuda_pools=True, ln_devices=("cuda",)):
    """Replaces index-taking pool backward ops by the evt:: ones (on CUDA only when cuda_pools: when
    the pools run in PyTorch, its indexed backward is kept), when attention (CUDA attention runs in evt) the
    CUDA SDPA backward by evt::sdpa_backward, and a layer-norm backward on
    ln_devices whose statistics come from its forward by evt::layer_norm_backward (statistics recomputed
    from x, as evt's row ops do anyway: the forward then no longer computes and saves mean / rstd);
    returns how many were replaced."""
    count = 0
    for n in list(gm.graph.nodes):
        if n.op != "call_function":
            continue
        if not cuda_pools and _on_cuda(n) and n.target in (aten.max_pool2d_with_indices_backward.default,
                                                           aten.adaptive_max_pool2d_backward.default):
            continue
        if n.target == aten.max_pool2d_with_indices_backward.default:
            dy, x, k, st, pd, dl, ceil = n.args[:7]
            new_args = (dy, x, list(k), list(st), list(pd), list(dl), bool(ceil))
            target = torch.ops.evt.max_pool2d_backward.default
        elif n.target == aten.adaptive_max_pool2d_backward.default:
            dy, x = n.args[:2]
            if not is_tensor_node(dy):
                continue
            new_args = (dy, x, static_shape(meta_val(dy))[2:])
            target = torch.ops.evt.adaptive_max_pool2d_backward.default
        elif n.target in _CUDA_SDPA_BWD and attention:
            dout, q, k, v = n.args[:4]
            i_p, i_causal, i_bias = _CUDA_SDPA_BWD[n.target]
            p, causal = n.args[i_p], n.args[i_causal]
            if p != 0.0 or (i_bias is not None and n.args[i_bias] is not None):
                continue
            if any(u.target is operator.getitem and u.args[1] > 2 for u in n.users):
                continue  # (the efficient kernel's attn_bias gradient)
            sc = n.kwargs.get("scale")
            new_args = (dout, q, k, v, bool(causal), float(sc) if sc is not None else 0.0)
            target = torch.ops.evt.sdpa_backward.default
        elif _ln_recompute_args(n, ln_devices) is not None:
            new_args = tuple(_ln_recompute_args(n, ln_devices))
            target = torch.ops.evt.layer_norm_backward.default
        elif n.target == aten._scaled_dot_product_flash_attention_for_cpu_backward.default:
            dout, q, k, v, o, lse, p, causal = n.args[:8]
            if p != 0.0:
                continue
            sc = n.kwargs.get("scale")
            new_args = (dout, q, k, v, bool(causal), float(sc) if sc is not None else 0.0, n.kwargs.get("attn_mask"))
            target = torch.ops.evt.sdpa_backward.default
        else:
            continue
        with gm.graph.inserting_before(n):
            m = gm.graph.call_function(target, new_args)
        m.meta = dict(n.meta)
        n.replace_all_uses_with(m)
        gm.graph.erase_node(n)
        count += 1
    if count:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return count


@rule(torch.ops.evt.max_pool2d_backward)
def _evt_maxpool_bwd(b, node, used):
    dy, x, k, st, pd, dl, ceil = node.args
    if any(d != 1 for d in dl) or ceil or meta_val(x).dim() != 4:
        raise Unsupported("dilation, ceil_mode or not NCHW")
    two = lambda v: list(v) * 2 if len(v) == 1 else list(v)  # noqa: E731
    return b.result("max_pool2d_backward", [b.val(dy), b.val(x)],
                    {"kernel": two(k), "stride": two(st or k), "padding": two(pd)})


@rule(torch.ops.evt.adaptive_max_pool2d_backward)
def _evt_amaxpool_bwd(b, node, used):
    dy, x, size = node.args
    if meta_val(x).dim() != 4:
        raise Unsupported("needs NCHW")
    return b.result("adaptive_max_pool2d_backward", [b.val(dy), b.val(x)], {"shape": list(size)})


def _gqa_groups(q, k):
    """Query heads per key/value head of an attention (1 without grouped-query attention). PyTorch's kernels take
    k, v with fewer heads than q (enable_gqa, LLaMA's num_key_value_heads): query head h reads kv head h // g.
    evt's sdpa takes q, k, v of equal heads, so the translation repeats k and v (and sums their gradients back)."""
    qs, ks = static_shape(meta_val(q)), static_shape(meta_val(k))
    if len(qs) != 4 or len(ks) != 4:
        raise Unsupported("q must be [B, H, S, D]")
    if qs[1] == ks[1]:
        return 1
    if qs[1] % ks[1] or qs[0] != ks[0] or qs[3] != ks[3]:
        raise Unsupported(f"q heads {qs[1]} not a multiple of k heads {ks[1]}")
    return qs[1] // ks[1]


def _repeat_heads(b, x, g):
    """evt name of [B, Hkv, S, D] tensor x with each head repeated g times in place ([B, Hkv * g, S, D], head h
    = x's head h // g, as repeat_interleave(g, dim=1)): a broadcast over a new group dim, then a reshape."""
    name = b.val(x)
    if g == 1:
        return name
    B, H, S, D = static_shape(meta_val(x))
    e = b.op("expand", [b.reshape(name, [B, H, 1, S, D])], {"shape": [B, H, g, S, D]})
    return b.reshape(e, [B, H * g, S, D])


def _sdpa_operands(b, q, k, v, mask=None):
    """evt's sdpa operands: q, k and v (repeated to q's heads), then the mask if any. evt's mask is PyTorch's
    attn_mask: bool (true = keep) or q's float dtype (added to the scaled scores), broadcast to
    [B, H, Sq, Skv]; a row whose keys are all masked gives 0, as PyTorch's kernels."""
    g = _gqa_groups(q, k)
    ops = [b.val(q), _repeat_heads(b, k, g), _repeat_heads(b, v, g)]
    if mask is not None:
        m, qv = meta_val(mask), meta_val(q)
        if m.dtype != torch.bool and m.dtype != qv.dtype:
            raise Unsupported(f"attn_mask of dtype {m.dtype} with {qv.dtype} q")
        if m.requires_grad:
            raise Unsupported("an attn_mask that requires grad (evt computes no mask gradient)")
        ops.append(b.val(mask))
    return ops


@rule(aten._scaled_dot_product_flash_attention_for_cpu)
def _sdpa(b, node, used):
    q, k, v = node.args[:3]
    p, causal = arg(node, 3, "dropout_p", 0.0), arg(node, 4, "is_causal", False)
    if p != 0.0:
        raise Unsupported("dropout")
    if used - {0}:
        raise Unsupported("the logsumexp output")
    sc = node.kwargs.get("scale")
    attrs = {"causal": 1} if causal else {}
    if sc is not None:
        attrs["scale"] = float(sc)
    ops = _sdpa_operands(b, q, k, v, node.kwargs.get("attn_mask"))
    return {0: b.result("sdpa", ops, attrs, val=out(node)[0])}


@rule(*_CUDA_SDPA_FWD)
def _sdpa_cuda(b, node, used):
    """CUDA SDPA forward (when options["gpu_ops"] keeps attention in evt): evt sdpa when only the output is used
    (the backward was rewritten to evt::sdpa_backward, so the logsumexp and RNG state are dead)."""
    if not b.cuda_attention:
        raise Unsupported("CUDA attention stays in PyTorch (flash attention; options={'gpu_ops': 'all'} or a "
                          "gpu_ops list naming 'attention' translates it)")
    i_p, i_causal, i_bias = _CUDA_SDPA_FWD[node.target.overloadpacket]
    q, k, v = node.args[:3]
    p = node.args[i_p] if len(node.args) > i_p else 0.0
    causal = node.args[i_causal] if len(node.args) > i_causal else False
    if p != 0.0 or (i_bias is not None and len(node.args) > i_bias and node.args[i_bias] is not None):
        raise Unsupported("dropout or attn_bias (evt's CUDA attention, cuDNN or the reference kernel, takes no "
                          "mask)")
    if used - {0}:
        raise Unsupported("the logsumexp output")
    sc = node.kwargs.get("scale")
    attrs = {"causal": 1} if causal else {}
    if sc is not None:
        attrs["scale"] = float(sc)
    return {0: b.result("sdpa", _sdpa_operands(b, q, k, v), attrs, val=out(node)[0])}


@rule(torch.ops.evt.sdpa_backward)
def _sdpa_bwd(b, node, used):
    dout, q, k, v, causal, sc = node.args[:6]
    mask = node.args[6] if len(node.args) > 6 else node.kwargs.get("attn_mask")
    attrs = {"causal": 1} if causal else {}
    if sc > 0:
        attrs["scale"] = float(sc)
    g = _gqa_groups(q, k)
    ops = [b.val(dout)] + _sdpa_operands(b, q, k, v, mask)
    vals = out(node)
    res = {}
    for i, w in enumerate("qkv"):
        if i in used:
            res[i] = (b.result(f"sdpa_backward_{w}", ops, attrs, val=vals[i]) if i == 0 or g == 1 else
                      _sum_head_groups(b, b.op(f"sdpa_backward_{w}", ops, attrs), vals[i], g))
    return res


def _sum_head_groups(b, name, val, g):
    """The statement holding the gradient val [B, Hkv, S, D] of a k or v repeated g times per head, from name, the
    gradient of the repeated [B, Hkv * g, S, D] tensor: summed over each group (in f32 for a 16-bit val, one
    rounding, as PyTorch's kernels accumulate)."""
    B, H, S, D = static_shape(val)
    grouped = b.reshape(name, [B, H, g, S, D])
    if val.dtype in LOW_PRECISION:
        grouped = b.op("cast", [grouped], {"dtype": DTYPE_NAMES[torch.float32]})
    return _result_in(b, "sum", [grouped], {"dims": [2]}, torch.float32 if val.dtype in LOW_PRECISION else val.dtype,
                      val)


@rule(aten.index)
def _index(b, node, used):
    """x[idx] with one integer index tensor (other dims sliced fully): index_select (+ reshape)."""
    x, idxs = node.args[:2]
    pos = [i for i, t in enumerate(idxs) if t is not None]
    if len(pos) != 1 or not is_tensor_node(idxs[pos[0]]):
        raise Unsupported("more than one index tensor")
    idx = idxs[pos[0]]
    iv = meta_val(idx)
    if iv.dtype not in (torch.int64, torch.int32):
        raise Unsupported("boolean mask index")
    d = pos[0]
    iname = b.val(idx)
    if iv.dim() != 1:
        iname = b.reshape(iname, [iv.numel()])
    y = b.op("index_select", [b.val(x), iname], {"dim": d})
    return b.result("reshape", [y], {"shape": static_shape(out(node))})


@rule(aten.index_put)
def _index_put(b, node, used):
    """x.index_put([idx], v, accumulate=True) with one 1-d index on dim 0: x + scatter-add of v."""
    x, idxs, v = node.args[:3]
    acc = arg(node, 3, "accumulate", False)
    if not acc:
        raise Unsupported("index_put without accumulate")
    if len(idxs) != 1 or not is_tensor_node(idxs[0]) or meta_val(idxs[0]).dim() != 1 or \
            meta_val(idxs[0]).dtype not in (torch.int64, torch.int32):
        raise Unsupported("index_put other than one 1-d integer index")
    xs = static_shape(meta_val(x))
    dt = out(node).dtype
    want = [static_shape(meta_val(idxs[0]))[0]] + xs[1:]
    vn = b.cast(v, dt)
    if static_shape(meta_val(v)) != want:
        vn = b.op("expand", [vn], {"shape": want})
    sc = b.op("index_select_backward", [vn, b.val(idxs[0])], {"dim": 0, "shape": xs})
    return b.result("add", [b.cast(x, dt), sc])


@rule(aten.native_dropout)
def _native_dropout(b, node, used):
    """(y, mask) = native_dropout(x, p, train) with evt's own random numbers: site k of the segment draws u from
    Philox with seed k (the RNG step of the run: the backend sets a fresh one from PyTorch's generator before
    every run, Segment.run); mask = u >= p (keep probability 1 - p, as PyTorch's u > p) and y = evt's dropout op,
    x * mask / (1 - p) rounded once, which the passes decompose into the same rand, so mask and y agree."""
    x, p, train = node.args[0], node.args[1], arg(node, 2, "train", None)
    if not isinstance(p, (int, float)):
        raise Unsupported("symbolic dropout probability")
    p = float(p)
    vals, res = out(node), {}
    if train is False or p == 0.0:  # the identity, and an all-true mask
        if 0 in used:
            res[0] = b.val(x)
        if 1 in used:
            res[1] = b.result("full", [], {"value": 1.0}, val=vals[1])
        return res
    if not 0.0 < p < 1.0:
        if p != 1.0:
            raise Unsupported(f"dropout probability {p}")
        for i in used & {0, 1}:  # p = 1 drops everything
            res[i] = b.result("full", [], {"value": 0.0}, val=vals[i])
        return res
    b.rng_sites += 1
    seed = b.rng_sites
    if 0 in used:
        res[0] = b.result("dropout", [b.val(x)], {"p": p, "seed": seed}, val=vals[0])
    if 1 in used:
        u = b.op("rand", [], {"seed": seed}, like=vals[1], dtype=torch.float32)
        thr = b.scalar(math.ceil(p * 16777216.0) / 16777216.0, torch.float32)  # (p on f32's grid, as decompose.c)
        res[1] = b.result("ge", [u, thr], val=vals[1])
    return res


@rule(aten.full_like)
def _full_like(b, node, used):
    return b.result("full", [], {"value": number(node.args[1])})


# Integer values: evt holds them in doubles, exact to 2^53, and does not wrap around on overflow as PyTorch's integer
# kernels do. Each integer value of a segment gets a bound on its magnitude (Builder.int_bounds): an int64 input
# INT_INPUT_BOUND on the CPU (Segment.run checks it at each run; on CUDA no check is made: 2^63), an int32 input its
# range, a bool 1, a number its magnitude. Moves, selections and casts keep their operands' bound; the arithmetic of
# INT_ARITH derives one (a + b: |a| + |b|, a * b: |a| |b|, a sum: |a| times the elements summed). An INT_ARITH node
# or an integer cast whose bound exceeds its result dtype's exact range (2^53 for int64, the range of int32) runs
# in PyTorch: evt computes it exactly only where the bound says so (BatchNorm's num_batches_tracked + 1, a count of
# a mask), and never gives another value than PyTorch's.
INT_INPUT_BOUND = (1 << 31) - 1
INT_ARITH = {aten.add, aten.sub, aten.mul, aten.div, aten.rsub, aten.neg, aten.abs, aten.pow, aten.sum, aten.mean,
             aten.index_put, aten.remainder, aten.fmod, aten.floor_divide, aten.cumsum, aten.prod}
INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
# the ops whose Python-number arguments are values of the result (the others' numbers are sizes, dims, ...)
_NUMBER_VALUES = {aten.full, aten.full_like, aten.scalar_tensor, aten.clamp, aten.clamp_min, aten.clamp_max,
                  aten.where, aten.maximum, aten.minimum}


def _exact_limit(dtype):
    return EXACT_INT if dtype == torch.int64 else torch.iinfo(dtype).max


def operand_bound(b, x, assumed):
    """A bound on |x| for an operand x (a number or an FX node) of an integer-valued node, or None (unbounded: a
    float tensor, or an integer value of the segment whose bound is unknown). Appends to `assumed` when the bound
    rests on an int64 input's INT_INPUT_BOUND."""
    if isinstance(x, bool):
        return 1
    if isinstance(x, (int, float)):
        return abs(x)
    if not is_tensor_node(x):
        return None
    v = meta_val(x)
    if v.dtype == torch.bool:
        return 1
    if v.dtype not in INT_DTYPES:
        return None
    if x in b.int_bounds:
        bound, assumes = b.int_bounds[x]
        if assumes:
            assumed.append(x)
        return bound
    if x in b.names and not str(b.names[x]).startswith("in."):
        return None  # (a member whose bound was not derived: a tuple's element)
    if v.dtype != torch.int64:
        return -torch.iinfo(v.dtype).min
    if v.device.type != "cpu":
        return INT64_MAX
    assumed.append(x)
    return INT_INPUT_BOUND


def _all_bounds(b, xs, assumed):
    """The bounds of the tensor operands in xs (nested lists flattened), or None when one is unbounded."""
    out = []
    for x in xs:
        if isinstance(x, (list, tuple)):
            sub = _all_bounds(b, x, assumed)
            if sub is None:
                return None
            out += sub
        elif isinstance(x, torch.fx.Node):
            bx = operand_bound(b, x, assumed)
            if bx is None:
                return None
            out.append(bx)
    return out


def _arith_bound(b, node, packet, assumed):
    """The bound of an INT_ARITH node's result, or None."""
    a = [operand_bound(b, x, assumed) for x in node.args[:2]] + [None] * (2 - len(node.args[:2]))
    alpha = operand_bound(b, node.kwargs.get("alpha", 1), assumed)
    if packet in (aten.add, aten.sub) and None not in (a[0], a[1], alpha):
        return a[0] + alpha * a[1]
    if packet is aten.rsub and None not in (a[0], a[1], alpha):
        return a[1] + alpha * a[0]
    if packet is aten.mul and None not in a:
        return a[0] * a[1]
    if packet in (aten.neg, aten.abs):
        return a[0]
    if packet is aten.sum and a[0] is not None:
        return a[0] * (meta_val(node.args[0]).numel() // max(meta_val(node).numel(), 1))
    if packet is aten.index_put and len(node.args) > 2 and isinstance(node.args[1], (list, tuple)):
        bv = operand_bound(b, node.args[2], assumed)
        idx = [meta_val(i).numel() for i in node.args[1] if is_tensor_node(i)]
        return None if a[0] is None or bv is None or len(idx) != 1 else a[0] + bv * idx[0]
    if packet is aten.pow and a[0] is not None and isinstance(node.args[1], int) and node.args[1] >= 0:
        return a[0] ** node.args[1]
    return None


def integer_bound(b, node, packet):
    """(bound, assumed, why) for node's integer result: the bound on its magnitude, whether the bound rests on an
    int64 input's INT_INPUT_BOUND, and why evt must not compute it (None when it may); (None, False, None) for other
    results."""
    v = meta_val(node)
    if not isinstance(v, torch.Tensor) or v.dtype not in INT_DTYPES:
        return None, False, None
    limit = _exact_limit(v.dtype)
    dt = str(v.dtype).replace("torch.", "")
    assumed = []
    if packet in INT_ARITH:
        bound = _arith_bound(b, node, packet, assumed)
        if bound is None or bound > limit:
            return bound, False, (f"integer arithmetic ({dt}) whose values may exceed "
                                  f"{'2^53' if limit == EXACT_INT else dt}: evt computes in double, without "
                                  f"PyTorch's wrap-around")
        return bound, bool(assumed), None
    xs = list(node.args) + list(node.kwargs.values())
    bounds = _all_bounds(b, xs, assumed)
    if bounds is not None and packet in _NUMBER_VALUES:
        bounds += [abs(x) for x in xs if isinstance(x, (int, float)) and not isinstance(x, bool)]
    bound = max(bounds, default=0) if bounds is not None else None
    src = meta_val(node.args[0]) if node.args and is_tensor_node(node.args[0]) else None
    if packet is aten._to_copy and src is not None and src.dtype in INT_DTYPES and (bound is None or bound > limit):
        return bound, False, f"integer cast {src.dtype} -> {v.dtype} of values that may not fit (PyTorch wraps around)"
    return bound, bool(assumed), None


def translate(b, node, used):
    """Emits node into b; returns its evt name(s) or raises Unsupported."""
    if node.target is operator.getitem:
        src, i = node.args
        n = b.names.get(src)
        if not isinstance(n, dict) or i not in n:
            raise Unsupported("getitem of a value evt does not hold")
        return n[i]
    packet = getattr(node.target, "overloadpacket", None)
    fn = TABLE.get(packet)
    if fn is None:
        raise Unsupported("no translation")
    v = meta_val(node)
    for t in (v if isinstance(v, (tuple, list)) else [v]):
        if t is not None and not isinstance(t, torch.Tensor):
            raise Unsupported("non-tensor result")
        if t is not None:
            if t.device.type not in ("cpu", "cuda"):
                raise Unsupported(f"tensor on {t.device.type}")
            b.on_device(t.device)
    bound, assumed, why = integer_bound(b, node, packet)
    if why:
        raise Unsupported(why)
    b.cur = node
    res = fn(b, node, used)
    if bound is not None:
        b.int_bounds[node] = (bound, assumed)
        # (a bound that arithmetic or a narrowing cast relies on: Segment.run checks the int64 inputs against it)
        if assumed and (packet in INT_ARITH or meta_val(node).dtype != torch.int64):
            b.int_input_checked = True
    return res
