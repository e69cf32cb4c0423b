"""Which FX op runs where: the CUDA placement rules of the torch.compile backend.

Contract: cuda_placement(node, options) is None when an op on CUDA tensors may join an evt segment, else the
reason it runs in PyTorch (logged as a fallback): its op family is left to PyTorch by options["gpu_ops"], or its
shapes have no generated evt kernel (unaligned or long rows, partial broadcasts, large data moves). The other
predicates classify nodes for the segmentation (casts hoisted to the module's start, data moves and views that
PyTorch makes). CPU tensors are unaffected unless config.SIMULATE_CUDA_RULES (tests).
"""
import operator

import torch
import torch.fx

from . import aten as A  # noqa: F401 (defines the evt:: ops named below)
from . import config

aten = torch.ops.aten


def op_name(node):
    """The op's name as the logs show it (aten overload name, or getitem)."""
    t = node.target
    if t is operator.getitem:
        return "getitem"
    return str(getattr(t, "__name__", t))


def cuda_rules(device):
    """True when the CUDA placement and layout rules apply to a value on this device: CUDA, or the CPU under
    config.SIMULATE_CUDA_RULES (tests)."""
    t = getattr(device, "type", device)
    return t == "cuda" or (t == "cpu" and config.SIMULATE_CUDA_RULES)


def _keep(family):
    return f"; options={{'gpu_ops': 'all'}} or a gpu_ops list naming {family!r} keeps it in evt"


def _reference_only(family, what, how, torch_kernels):
    return (f"evt's only CUDA implementation of {what} is the reference library (kernels/fallback/: {how}); "
            f"runs in PyTorch ({torch_kernels})" + _keep(family))


# Why each op family of config.GPU_OP_FAMILIES runs in PyTorch on CUDA unless options["gpu_ops"] names it.
FAMILY_REASON = {
    "convolution": ("evt's CUDA convolutions are implicit-GEMM kernels with the generated epilogue for channels-last "
                    "bf16 / f16 only (fprop, stride-1 data gradient, weight gradient; not yet measured against cuDNN), "
                    "the reference library (direct loops in double) otherwise; runs in PyTorch (cuDNN)"
                    + _keep("convolution")),
    "attention": ("evt's CUDA attention is cuDNN's fused flash attention for bf16/f16 (kernels/fallback/cudnn_sdpa.cu; "
                  "a backward program recomputes the forward: evt's sdpa_backward takes q, k, v, not the saved "
                  "statistics) and the reference library for f32 (kernels/fallback/attention.cu: one thread per query row "
                  "in double); runs in PyTorch (flash / efficient / cuDNN attention)" + _keep("attention")),
    "pooling": _reference_only("pooling", "pooling", "one thread per element in double", "cuDNN / ATen"),
    "embedding": _reference_only("embedding", "the embedding and its backward", "a gather by index, and a "
                                 "scatter-add with atomics in double plus a conversion pass",
                                 "its gather and sort-based backward kernels"),
    "batch_norm": ("batch norm runs in PyTorch (its channels-last kernels): in evt its channels-last statistics "
                   "lower as column sums of the row kernels, one warp per row of 64-256 channels, slower than "
                   "PyTorch's" + _keep("batch_norm")),
    "dropout": ("dropout draws its mask in PyTorch on CUDA, as options['gpu_ops'] asks (the default \"fast\" draws "
                "it in evt's row kernels)"),
}


# FX op packets of each family (the backward ops of PyTorch's fused attention have no translation; when
# attention runs in evt the joint graph's rewrite makes them evt::sdpa_backward).
CUDA_FAMILY = {
    aten.convolution: "convolution", aten.convolution_backward: "convolution",
    aten._scaled_dot_product_flash_attention: "attention", aten._scaled_dot_product_efficient_attention: "attention",
    aten._scaled_dot_product_cudnn_attention: "attention", torch.ops.evt.sdpa_backward: "attention",
    aten._scaled_dot_product_cudnn_attention_backward: "attention",
    aten._scaled_dot_product_flash_attention_backward: "attention",
    aten._scaled_dot_product_efficient_attention_backward: "attention",
    aten.max_pool2d_with_indices: "pooling", aten.max_pool2d_with_indices_backward: "pooling",
    torch.ops.evt.max_pool2d_backward: "pooling", aten.avg_pool2d: "pooling", aten.avg_pool2d_backward: "pooling",
    aten.adaptive_max_pool2d: "pooling", aten.adaptive_max_pool2d_backward: "pooling",
    torch.ops.evt.adaptive_max_pool2d_backward: "pooling",
    aten._native_batch_norm_legit_functional: "batch_norm", aten.native_batch_norm: "batch_norm",
    aten._native_batch_norm_legit: "batch_norm", aten._native_batch_norm_legit_no_training: "batch_norm",
    aten.native_batch_norm_backward: "batch_norm",
    aten.embedding: "embedding", aten.embedding_dense_backward: "embedding",
    aten.native_dropout: "dropout",
}


def cuda_placement(node, options=None):
    """Why node runs in PyTorch under the CUDA op placement policy (module contract), or None."""
    if config.all_gpu_ops(options):
        return None
    v = node.meta.get("val")
    vs = v if isinstance(v, (tuple, list)) else [v]
    if not any(isinstance(t, torch.Tensor) and cuda_rules(t.device) for t in vs):
        return None
    family = CUDA_FAMILY.get(getattr(node.target, "overloadpacket", None))
    if family is None:
        return unaligned_rows(node) or long_rows(node) or partial_broadcast(node) or unfusable_move(node)
    return None if config.gpu_family_in_evt(options, family) else FAMILY_REASON[family]


# Tensors from this many elements on, the shape rules apply (unaligned or long rows, partial broadcasts, large
# data moves); below it the reference library's node-by-node cost does not matter.
UNALIGNED_MIN_NUMEL = 1 << 20

# GEMM targets -> index of their first operand.
GEMMS = {aten.mm.default: 0, aten.addmm.default: 1, aten.bmm.default: 0}


def _row_length(t):
    """Elements per row of t in memory: the size of its unit-stride dim (channels-last: C), else the last."""
    unit = [d for d in range(t.dim()) if t.stride()[d] == 1 and t.shape[d] > 1]
    return t.shape[unit[-1]] if dense_order(t) and unit else t.shape[-1]


# Index ops -> the positions of their index operands (a list of indices for index / index_put). An index vector
# is read one element per gathered or scattered row (and sorted by the kernel library for edge-list spmm), never
# with the row kernels' vector loads: its length needs no alignment.
INDEX_OPERANDS = {aten.index.Tensor: 1, aten.index_put.default: 1, aten.index_put_.default: 1,
                  aten.index_select.default: 2, aten.index_add.default: 2, aten.scatter_add.default: 2,
                  aten.gather.default: 2, aten.embedding.default: 1}


def _row_checked_args(node):
    """node's tensor arguments whose rows the row kernels load as vectors: all but index operands and
    broadcast columns (an [R, 1] operand of a wider op: one value per row, read as a scalar)."""
    k = INDEX_OPERANDS.get(node.target)
    skip = set(_nodes_in(node.args[k])) if k is not None and len(node.args) > k else set()
    out = node.meta.get("val")
    wide = isinstance(out, torch.Tensor) and out.dim() >= 1 and out.shape[-1] > 1
    vals = [(a.args[0] if _gemm_layout_transpose(a) else a).meta.get("val") for a in tensor_args(node) if a not in skip]
    return [t for t in vals if not (wide and isinstance(t, torch.Tensor) and t.dim() >= 2 and t.shape[-1] == 1)]


def _gemm_layout_transpose(node):
    """True for a 2-D transpose that only GEMMs read, as an operand: the GEMM takes it as its operand's layout, so
    no kernel writes it and its rows in memory are its input's (a weight gradient's xᵀ over 736,389 graph nodes)."""
    v = node.meta.get("val")
    return (node.target in PERMUTES and isinstance(v, torch.Tensor) and v.dim() == 2 and bool(node.users)
            and all(_gemm_operand_use(u, node) for u in node.users))


def _column_view(node):
    """True for a view that makes a column [R, 1] (w[:, None]): free, and read as one value per row."""
    v = node.meta.get("val")
    return node.target in VIEW_OPS and isinstance(v, torch.Tensor) and v.dim() >= 2 and v.shape[-1] == 1


def unaligned_rows(node):
    """Why a large CUDA op runs in PyTorch because evt has no generated kernel for its shapes, or None:
    a tensor of at least UNALIGNED_MIN_NUMEL elements (output or input; not an index operand or a broadcast
    column) whose rows (last dim x element size) are not a multiple of 16 bytes (the row kernels' vector
    loads and CUTLASS need 16-byte rows), or a 16-bit GEMM whose operand or result rows are not
    (gemm_rows_aligned: a vocabulary of 30522 words): the reference library would run it node by node in double,
    with one thread per row for its reductions. A transpose only GEMMs read is their operand's layout: its rows are
    its input's."""
    if node.target is operator.getitem or _column_view(node) or _gemm_layout_transpose(node):
        return None
    ts = [t for t in (node.meta.get("val"),) for t in (t if isinstance(t, (tuple, list)) else [t])]
    ts += _row_checked_args(node)
    ts = [t for t in ts if isinstance(t, torch.Tensor) and t.dim() >= 1]
    if not ts or max(t.numel() for t in ts) < UNALIGNED_MIN_NUMEL:
        return None
    for t in ts:
        if t.numel() >= UNALIGNED_MIN_NUMEL and (_row_length(t) * t.element_size()) % 16:
            return (f"rows of {_row_length(t)} x {str(t.dtype).replace('torch.', '')} are not 16-byte aligned: evt's "
                    "row kernels would take them element by element (no 16-byte vector accesses: several times "
                    "slower than PyTorch's) and no GEMM epilogue stores them; runs in PyTorch")
    k = GEMMS.get(node.target)
    if k is not None and len(node.args) >= k + 2:
        a, b = (x.meta.get("val") for x in node.args[k:k + 2])
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype in (torch.bfloat16, torch.float16):
            m, kk, n = a.shape[-2], a.shape[-1], b.shape[-1]
            if not gemm_rows_aligned(m, n, kk, _stored_transposed(a), _stored_transposed(b), node.target):
                return (f"GEMM M={m} K={kk} N={n}: CUTLASS needs the operands' and the result's rows in memory to be "
                        "multiples of 8 elements (16-byte TMA rows); runs in PyTorch (cuBLAS) instead of node by "
                        "node; options={'gpu_ops': 'all'} keeps it in evt")
    return None


def _stored_transposed(t):
    """True for a matrix (the last two dims) laid out transposed in memory (unit stride along its rows)."""
    return t.dim() >= 2 and t.stride(-2) == 1 and t.shape[-1] > 1 and t.stride(-1) == t.shape[-2]


def gemm_rows_aligned(m, n, k, ta, tb, target=None):
    """The 16-byte row rule of evt's GEMM kernels (src/codegen/lower_gemm.c evt_lower_gemm_dims_ok): the rows of A
    (K, or M when A is stored transposed), of B (N, or K when B is stored transposed) and of the result (N) are
    multiples of 8 elements; the other extents take any size. Batched GEMMs need all three."""
    if target is aten.bmm.default:
        return m % 8 == 0 and n % 8 == 0 and k % 8 == 0
    return n % 8 == 0 and (m % 8 == 0 if ta else k % 8 == 0) and (not tb or k % 8 == 0)


# The longest row evt's register-resident row / pointwise kernels take (32 warps x 32 lanes x 4 chunks x 8
# elements; kernels/evt_row_config.h). Longer rows run as the generated kernels' long-row form, which has no sum
# over rows: a group with one (a bias gradient beside a nucleus-free op) runs node by node, so a large op on
# longer rows that no GEMM feeds runs in PyTorch (long_rows).
ROW_KERNEL_MAX_N = 32768


def _gemm_fed(node, depth=24):
    """True when node's value comes from a GEMM evt runs through non-GEMM ops only (a chain a GEMM epilogue may
    take)."""
    seen, todo = set(), [(node, 0)]
    while todo:
        n, d = todo.pop()
        if n in seen or d > depth:
            continue
        seen.add(n)
        for a in n.all_input_nodes:
            if a.op != "call_function":
                continue
            if a.target in GEMMS:
                if unaligned_rows(a) is None:
                    return True
                continue  # (a GEMM left to PyTorch has no epilogue that could take the chain)
            todo.append((a, d + 1))
    return False


def long_rows(node):
    """Why a large CUDA op that no GEMM feeds runs in PyTorch because its rows are longer than the row kernels
    take (ROW_KERNEL_MAX_N), or None: its group would run node by node in the reference library (in double),
    where PyTorch's elementwise kernels stream at bandwidth. A chain a GEMM feeds stays in evt (the GEMM
    epilogue takes any row length)."""
    if node.target in GEMMS or node.target is operator.getitem or node.target in VIEW_OPS:
        return None
    if _whole_tensor_pointwise(node):
        return None  # (an elementwise-only group launches as rows of any length: exec_plan.c elementwise_launch_shape)
    ts = [t for t in (node.meta.get("val"),) for t in (t if isinstance(t, (tuple, list)) else [t])]
    ts += _row_checked_args(node)
    ts = [t for t in ts if isinstance(t, torch.Tensor) and t.dim() >= 1 and t.numel() >= UNALIGNED_MIN_NUMEL]
    long = [t for t in ts if _row_length(t) > ROW_KERNEL_MAX_N]
    if not long or _gemm_fed(node):
        return None
    return (f"rows of {_row_length(long[0])} elements: evt's row kernels hold a row in registers (at most "
            f"{ROW_KERNEL_MAX_N}), and no GEMM epilogue takes this op (the reference library would run it node by "
            "node in double); runs in PyTorch; options={'gpu_ops': 'all'} keeps it in evt")


_SUMS = {aten.sum.dim_IntList, aten.mean.dim}


def partial_broadcast(node):
    """Why a large CUDA op runs in PyTorch because it broadcasts or reduces over some leading dims of its
    tensor but not all of them, or None: [B, S, D] + [S, D] (bert's and ViT's position embeddings) and the sum
    over B of its gradient. evt's visitor loads take a full tile, a row vector (broadcast over every leading
    dim) or a column vector, and its reductions sum over the rows or over every leading dim, so the group
    would run node by node in the reference library (in double); PyTorch's kernels stream them at bandwidth."""
    v = node.meta.get("val")
    if not isinstance(v, torch.Tensor):
        return None
    if node.target in _SUMS:
        x = node.args[0].meta.get("val") if node.args and isinstance(node.args[0], torch.fx.Node) else None
        if not isinstance(x, torch.Tensor) or x.dim() < 3 or x.numel() < UNALIGNED_MIN_NUMEL or len(node.args) < 2 \
                or node.args[1] is None:
            return None  # (dims None: every dim, a whole-tensor reduction)
        r = x.dim()
        dims = {d % r for d in (node.args[1] if isinstance(node.args[1], (list, tuple)) else [node.args[1]])}
        lead = [d for d in range(r - 1) if x.shape[d] > 1]
        if r - 1 in dims or not any(d in dims for d in lead) or all(d in dims for d in lead):
            return None
        return (f"a sum over dims {sorted(dims)} of {list(x.shape)} (some leading dims, not the last): evt's reductions "
                "sum a row or every leading dim, so its group would run node by node in the reference library (in "
                "double); runs in PyTorch")
    if torch.Tag.pointwise not in getattr(node.target, "tags", ()) or v.dim() < 3 or v.numel() < UNALIGNED_MIN_NUMEL:
        return None
    r = v.dim()
    for a in tensor_args(node):
        av = a.meta.get("val")
        if not isinstance(av, torch.Tensor) or av.numel() == v.numel() or av.numel() == 1:
            continue
        shp = [1] * (r - av.dim()) + list(av.shape)
        lead = [d for d in range(r - 1) if v.shape[d] > 1]
        if any(shp[d] == 1 for d in lead) and any(shp[d] > 1 for d in lead):
            return (f"{list(av.shape)} broadcast to {list(v.shape)} over some leading dims only: evt's visitor loads "
                    "take a full tile, a row or a column vector, so its group would run node by node in the reference "
                    "library (in double); runs in PyTorch")
    return None


# Data moves no evt kernel takes (no visitor node, no row-kernel form): from UNALIGNED_MIN_NUMEL elements on,
# they run in PyTorch on CUDA (a view, or one kernel at bandwidth) instead of node by node in the reference
# library (in double); e.g. ViT's token concatenation, the gradient of its class-token select and the patches'
# slice of the token gradient.
_UNFUSABLE_MOVES = {aten.cat.default: "concatenation", aten.slice_backward.default: "slice_backward",
                    aten.select_backward.default: "select_backward", aten.slice.Tensor: "slice"}


def unfusable_move(node):
    """Why a large CUDA data move evt has no kernel for runs in PyTorch (_UNFUSABLE_MOVES), or None."""
    what = _UNFUSABLE_MOVES.get(node.target)
    v = node.meta.get("val")
    if what is None or not isinstance(v, torch.Tensor) or v.numel() < UNALIGNED_MIN_NUMEL:
        return None
    return (f"a {what} of {list(v.shape)}: no evt kernel takes it (no visitor node), so its group would run node by "
            "node in the reference library (in double); runs in PyTorch (a view or one copy kernel)")


def torch_bound(node, options=None, depth=6):
    """True when every reader of node runs in PyTorch by the placement rules (cuda_placement), also through
    data moves (views, casts) whose own readers do: a value only PyTorch reads."""
    if depth == 0 or not node.users:
        return False
    for u in node.users:
        if u.op != "call_function":
            return False
        if cuda_placement(u, options) is not None:
            continue
        if (u.target in DATA_MOVES or u.target in CASTS) and torch_bound(u, options, depth - 1):
            continue
        return False
    return True


TORCH_CAST = ("cast of a PyTorch-made value that only PyTorch reads (the input of a concatenation or a slice "
              "PyTorch runs): one PyTorch kernel instead of an evt segment of its own")


def _whole_tensor_pointwise(node):
    """True for a pointwise op (ATen's pointwise tag, or a cast) with a contiguous result whose tensor operands
    are contiguous of its shape or have one element: a group of such ops has no broadcast vector or reduction,
    and the runtime launches it reshaped into rows the row kernel takes, whatever the row length. A strided
    operand would be a permute the group cannot take."""
    t = node.target
    if not (t in CASTS or torch.Tag.pointwise in getattr(t, "tags", ())):
        return False
    v = node.meta.get("val")
    if not isinstance(v, torch.Tensor) or not v.is_contiguous():
        return False
    for a in tensor_args(node):
        av = a.meta.get("val")
        if not isinstance(av, torch.Tensor) or not (av.numel() == 1 or (tuple(av.shape) == tuple(v.shape)
                                                                         and av.is_contiguous())):
            return False
    return True


HOISTED_CAST = ("cast of a module input to 16 bits (autocast's weight copy): one PyTorch kernel at the start of "
                "the module (in evt its group is refused by the lowering: a cast rounded inside an epilogue, and it "
                "would run node by node)")


CASTS = {aten._to_copy.default, torch.ops.prims.convert_element_type.default}


def hoisted_casts(gm):
    """The casts that run in PyTorch at the start of the module (HOISTED_CAST): f32 -> bf16/f16 casts of the
    module's inputs on CUDA (autocast's copies of weights, biases and inputs), in graph order."""
    out = []
    for n in gm.graph.nodes:
        if n.op != "call_function" or n.target not in CASTS or not n.args:
            continue
        x = n.args[0]
        if not isinstance(x, torch.fx.Node) or x.op != "placeholder":
            continue
        v, xv = n.meta.get("val"), x.meta.get("val")
        if not (isinstance(v, torch.Tensor) and isinstance(xv, torch.Tensor)):
            continue
        if (cuda_rules(v.device) and v.device == xv.device and xv.dtype == torch.float32
                and v.dtype in (torch.bfloat16, torch.float16) and v.shape == xv.shape):
            out.append(n)
    return out


PERMUTES = {aten.permute.default, aten.transpose.int, aten.t.default}


# Data movement that runs in PyTorch when every tensor it reads was made by a PyTorch step (CUDA).
DATA_MOVES = {aten.stack.default, aten.cat.default, aten.select_backward.default, aten.slice_backward.default,
              aten.permute.default, aten.transpose.int, aten.t.default, aten.view.default, aten._unsafe_view.default,
              aten.reshape.default, aten.clone.default, aten.expand.default, aten.unsqueeze.default,
              aten.squeeze.dim, aten.select.int, aten.slice.Tensor, operator.getitem}


# View ops whose result, when it is a view of a segment input needed outside the segment, PyTorch makes
# (Segment.torch_views) instead of evt writing a copy.
VIEW_OPS = {aten.permute.default, aten.t.default, aten.transpose.int, aten.view.default, aten._unsafe_view.default,
            aten.reshape.default, aten.expand.default, aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims,
            aten.squeeze.default, aten.alias.default, aten.select.int, aten.slice.Tensor}


def on_cuda(node):
    """True when node's value (its first, for a tuple) is a tensor the CUDA rules apply to."""
    v = node.meta.get("val")
    v = v[0] if isinstance(v, (tuple, list)) and v else v
    return isinstance(v, torch.Tensor) and cuda_rules(v.device)


def tensor_args(node):
    """The FX nodes among node's positional arguments (lists included), in order."""
    return [x for a in node.args for x in _nodes_in(a)]


def _nodes_in(a):
    """The FX nodes in one argument (a node, or a list of them and constants)."""
    return [x for x in (a if isinstance(a, (list, tuple)) else [a]) if isinstance(x, torch.fx.Node)]


def dense_order(v):
    """The memory order of v's dims (outermost first) when v is a non-contiguous dense permutation of its
    shape with rank >= 3 and no size-1 dim (channels-last), else None."""
    if not isinstance(v, torch.Tensor) or v.dim() < 3 or v.is_contiguous() or any(s == 1 for s in v.shape):
        return None
    o = sorted(range(v.dim()), key=lambda d: -v.stride()[d])
    return o if v.permute(o).is_contiguous() else None


_GEMM_OPERANDS = {aten.mm.default: (0, 1), aten.addmm.default: (1, 2)}


def _gemm_operand_use(u, x):
    pos = _GEMM_OPERANDS.get(u.target)
    return pos is not None and not u.kwargs and all(
        i in pos for i, a in enumerate(u.args) if a is x)


def gemm_only_transposed(x):
    """True for a 16-bit 2-D CUDA value laid out transposed (strides (1, rows): a weight saved transposed
    for the backward) that only GEMMs read (directly, or through one t / permute / transpose): the segment
    declares it as the row-major [cols, rows] memory it is and reads it through a permute, which the GEMM
    absorbs as its operand layout, instead of copying it into a row-major [rows, cols] at every run."""
    v = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    if not (isinstance(v, torch.Tensor) and cuda_rules(v.device) and v.dim() == 2
            and v.dtype in (torch.bfloat16, torch.float16) and v.shape[0] > 1 and v.shape[1] > 1
            and tuple(v.stride()) == (1, v.shape[0])):
        return False
    for u in x.users:
        if _gemm_operand_use(u, x):
            continue
        if u.target in PERMUTES and u.users and all(_gemm_operand_use(w, u) for w in u.users):
            continue
        return False
    return True


def contiguous_slice(node):
    """True for a CUDA slice whose result is contiguous (a prefix or a block of rows of a contiguous value:
    bert's position embeddings sliced to the sequence length): PyTorch makes it as a free view before the
    segment that reads it, which binds the slice itself; in evt a slice has no visitor node, so its group
    (the embedding sum and the first layer norm's mean) would run node by node in the reference library."""
    if node.target is not aten.slice.Tensor or not node.args or not isinstance(node.args[0], torch.fx.Node):
        return False
    v, xv = node.meta.get("val"), node.args[0].meta.get("val")
    return (isinstance(v, torch.Tensor) and isinstance(xv, torch.Tensor) and cuda_rules(v.device)
            and xv.is_contiguous() and v.is_contiguous() and v.numel() > 1)


def contiguous_permute(node):
    """True for a permute / transpose on CUDA that turns a strided value into a contiguous one (e.g. the
    attention output, [B, H, S, D] over memory laid out [B, S, H, D], permuted back): PyTorch makes it as
    a free view, and the segment binds the contiguous result instead of copying the strided input into
    contiguous memory and permuting it again (which also keeps a GEMM operand off its layouts)."""
    if node.target not in PERMUTES or not node.args or not isinstance(node.args[0], torch.fx.Node):
        return False
    v, xv = node.meta.get("val"), node.args[0].meta.get("val")
    return (isinstance(v, torch.Tensor) and isinstance(xv, torch.Tensor) and cuda_rules(v.device)
            and not xv.is_contiguous() and v.is_contiguous() and v.numel() > 1)
