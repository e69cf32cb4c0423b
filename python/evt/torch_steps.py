"""The PyTorch steps of a plan: an FX node run as its op, autocast's hoisted casts as one multi-tensor copy, and
GEMMs whose dims are not multiples of 8 on zero-padded operands.

Contract: run_torch(node, env) computes node from the values in env, as PyTorch would (a padded GEMM or a cast
into padded memory gives the same values); pad_gemm / pad_cast_output decide at plan time which nodes get the
padded forms (meta evt_pad_gemm / evt_pad_out).
"""
import logging
import weakref

import torch
import torch.fx

from . import placement as P

log = logging.getLogger("evt")
aten = torch.ops.aten


def _foreach_castable(node, x):
    """A hoisted cast that the multi-tensor copy may run: a plain dtype change of a contiguous tensor (no padded
    output, no memory format, no other kwargs)."""
    if node.meta.get("evt_pad_out"):
        return False
    if not isinstance(x, torch.Tensor) or not x.is_contiguous() or x.numel() == 0:
        return False
    if node.target is aten._to_copy.default:
        kw = dict(node.kwargs)
        if len(node.args) != 1 or kw.pop("layout", torch.strided) != torch.strided:
            return False
        if kw.pop("memory_format", None) not in (None, torch.preserve_format, torch.contiguous_format):
            return False
        for k in ("dtype", "device", "non_blocking", "pin_memory"):  # (same device: hoisted_casts checked)
            kw.pop(k, None)
        return not kw
    return len(node.args) == 2 and not node.kwargs  # prims.convert_element_type(x, dtype)


def run_hoisted_casts(nodes, env):
    """Runs hoisted casts (autocast's f32 -> bf16/f16 weight copies, placement.HOISTED_CAST) as one
    torch._foreach_copy_ per (device, source dtype, target dtype) into fresh tensors: a multi-tensor kernel
    instead of one PyTorch kernel per tensor, bitwise equal (bench/e2e/cast_bench.py compares the two). A cast it
    cannot take, or a group the multi-tensor copy refuses, runs on its own (run_torch)."""
    groups = {}
    for n in nodes:
        x = env[n.args[0]]
        v = n.meta.get("val")
        if isinstance(v, torch.Tensor) and _foreach_castable(n, x):
            groups.setdefault((x.device, x.dtype, v.dtype), []).append((n, x))
        else:
            env[n] = run_torch(n, env)
    for (_, _, dt), items in groups.items():
        outs = [torch.empty_like(x, dtype=dt) for _, x in items]
        try:
            torch._foreach_copy_(outs, [x for _, x in items])
        except RuntimeError as e:
            log.info("hoisted casts: the multi-tensor copy refused %d tensors (%s); one kernel each", len(items), e)
            outs = [run_torch(n, env) for n, _ in items]
        for (n, _), o in zip(items, outs):
            env[n] = o


def run_torch(node, env):
    """node's value computed by PyTorch from env (padded where the plan marked it: evt_pad_out, evt_pad_gemm)."""
    args = torch.fx.node.map_arg(node.args, lambda n: env[n])
    kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: env[n])
    try:
        if node.meta.get("evt_pad_out"):
            out = cast_into_padded(args, kwargs)
            if out is not None:
                return out
        if node.meta.get("evt_pad_gemm"):
            return padded_gemm(node.target, args, kwargs, contiguous=node.meta["evt_pad_gemm"] == "contiguous")
    except Exception as e:  # noqa: BLE001 (the padded forms are evt's: the op itself runs, from now on)
        log.warning("%s: the padded form failed (%s: %s); it runs as PyTorch's op", node.name, type(e).__name__, e)
        node.meta.pop("evt_pad_out", None)
        node.meta.pop("evt_pad_gemm", None)
    return node.target(*args, **kwargs)


def pad_gemm(node):
    """True when a PyTorch-run CUDA GEMM (mm / addmm) of 16-bit operands has M, K or N not a multiple of 8 and is
    large (placement.UNALIGNED_MIN_NUMEL): cuBLAS then has only 2-byte-aligned kernels for it (a 30522-word
    vocabulary's logits and their gradients), slower than the same GEMM on operands padded to multiples of 8,
    so padded_gemm runs it on zero-padded operands (as Inductor's padded GEMM does)."""
    if node.target not in (aten.mm.default, aten.addmm.default):
        return False
    k = P.GEMMS[node.target]
    if len(node.args) < k + 2 or not P.on_cuda(node):
        return False
    a, b = (x.meta.get("val") if isinstance(x, torch.fx.Node) else None for x in node.args[k:k + 2])
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dim() == 2 and b.dim() == 2):
        return False
    if a.dtype not in (torch.bfloat16, torch.float16) or b.dtype != a.dtype:
        return False
    m, kk, n = a.shape[0], a.shape[1], b.shape[1]
    return bool((m % 8 or kk % 8 or n % 8) and max(m * kk, kk * n, m * n) >= P.UNALIGNED_MIN_NUMEL)


def up8(d):
    """d rounded up to a multiple of 8."""
    return (d + 7) // 8 * 8


def pad_cast_output(node, in_torch, output):
    """True for a PyTorch cast (_to_copy to a 16-bit dtype, same device) of a 2-D value whose row length is not
    a multiple of 8, that only PyTorch steps read and the module does not return: cast_into_padded writes it
    into memory padded to 8 columns, and the padded GEMMs that read it (directly or transposed) use that
    memory as their operand instead of copying it into a padded one each (a vocabulary head's logits gradient
    feeds two such GEMMs)."""
    if node.target not in P.CASTS or not node.args or output in node.users:
        return False
    v = node.meta.get("val")
    if not (isinstance(v, torch.Tensor) and v.dim() == 2 and v.dtype in (torch.bfloat16, torch.float16)
            and v.shape[1] % 8 and v.is_contiguous()):
        return False
    if set(node.kwargs) - {"dtype", "layout", "device"}:
        return False
    return all(u in in_torch for u in node.users)


def cast_into_padded(args, kwargs):
    """A pad_cast_output cast: the [M, N] result written into a new [M, N rounded up to 8] buffer whose extra
    columns are zero, returned as the [M, N] view (the buffer flagged _evt_zero_margin; _pad2d uses it). None
    when the call is not the 2-D same-device cast it was planned as (the caller then runs the op itself)."""
    x = args[0] if args else None
    dt = kwargs.get("dtype")
    dev = kwargs.get("device")
    if not (isinstance(x, torch.Tensor) and x.dim() == 2 and dt in (torch.bfloat16, torch.float16)
            and (dev is None or torch.device(dev) == x.device) and len(args) == 1):
        return None
    m, n = x.shape
    full = torch.empty((m, up8(n)), dtype=dt, device=x.device)
    full[:, n:].zero_()
    full[:, :n].copy_(x)
    full._evt_zero_margin = n  # (the data columns; the rest are zero)
    view = full[:, :n]
    view._evt_padded = full  # (keeps the flagged buffer object alive while the view is)
    return view


def _padded_base(x, rows, cols):
    """When x is exactly the data of a cast_into_padded buffer (all its rows, its data columns; or the transpose
    of that) and [rows, cols] fits in the buffer: its [rows, cols] corner (zeros beyond x), with no copy; else
    None (a slice of the data is not: what lies beyond it is data, not zeros)."""
    b = getattr(x, "_base", None)
    n = getattr(b, "_evt_zero_margin", None) if b is not None else None
    if not n or b.dim() != 2 or x.storage_offset() != b.storage_offset():
        return None
    if x.stride() == b.stride() and tuple(x.shape) == (b.shape[0], n) and rows == b.shape[0] and cols <= b.shape[1]:
        return b[:rows, :cols]
    xt = x.t()
    if xt.stride() == b.stride() and tuple(xt.shape) == (b.shape[0], n) and cols == b.shape[0] and rows <= b.shape[1]:
        return b[:cols, :rows].t()
    return None


def _pad2d(x, rows, cols):
    """x (2-D) zero-padded to [rows, cols]: one copy of x into new memory whose margins alone are zeroed. A
    column-major x (a transposed view: the weight-gradient GEMM's grad^T) stays column-major, padded as the
    row-major tensor it views (a straight copy; padding the view itself would copy it transposed, several times
    slower)."""
    r, c = x.shape
    if (r, c) == (rows, cols):
        return x
    pb = _padded_base(x, rows, cols)
    if pb is not None:
        return pb
    if not x.is_contiguous() and x.t().is_contiguous():
        return _pad2d(x.t(), cols, rows).t()
    src = x._base if x._base is not None else x  # (a view object is made anew for each use; its base is not)
    key = (x.data_ptr(), x.dtype, tuple(x.shape), tuple(x.stride()), rows, cols)
    hit = _PAD_CACHE.get(key)
    if hit is not None and hit[0]() is src:
        return hit[1]
    out = x.new_empty((rows, cols))
    out[:r, :c].copy_(x)
    if cols > c:
        out[:, c:].zero_()
    if rows > r:
        out[r:, :c].zero_()
    # the other padded GEMM of the same value (the logits gradient feeds the input- and the weight-gradient
    # GEMMs) reuses this copy within the plan run while x lives (a functional graph: its values cannot change;
    # each plan run starts with clear_padded_copies, as pooled buffers hold new values at the next run)
    _PAD_CACHE[key] = (weakref.ref(src), out)
    weakref.finalize(src, _PAD_CACHE.pop, key, None)
    return out


_PAD_CACHE = {}  # (data_ptr, dtype, shape, strides, rows, cols) -> (weakref to the source's base, padded copy)


def clear_padded_copies():
    """Forgets the padded copies of the previous run (_pad2d): pooled buffers hold new values at the next one."""
    _PAD_CACHE.clear()


def padded_gemm(target, args, kwargs, contiguous=True):
    """mm(a, b) / addmm(bias, a, b, beta=, alpha=) with M, K, N rounded up to multiples of 8 by zero padding
    (an operand is copied only when one of its dims grows; _pad2d), then the [M, N] result sliced out: made
    contiguous (the layout of PyTorch's own result) when `contiguous`, else the strided view of the padded
    result (no copy; for values that only PyTorch ops and segment inputs read, which take any strides).
    Exact: the padded rows / columns add zero products."""
    import torch.nn.functional as F
    k = P.GEMMS[target]
    a, b = args[k], args[k + 1]
    m, kk, n = a.shape[0], a.shape[1], b.shape[1]
    mp, kp, np_ = up8(m), up8(kk), up8(n)
    a, b = _pad2d(a, mp, kp), _pad2d(b, kp, np_)
    if target is aten.addmm.default:
        bias = args[0]
        if np_ != n and bias.dim() >= 1 and bias.shape[-1] == n:
            bias = F.pad(bias, (0, np_ - n))
        if mp != m and bias.dim() == 2 and bias.shape[0] == m:
            bias = F.pad(bias, (0, 0, 0, mp - m))
        out = aten.addmm.default(bias, a, b, *args[3:], **kwargs)
    else:
        out = aten.mm.default(a, b)
    if (mp, np_) == (m, n):
        return out
    return out[:m, :n].contiguous() if contiguous else out[:m, :n]
