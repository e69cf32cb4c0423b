"""Rewrites of the Dynamo graph, before AOTAutograd traces it into ATen ops.

Contract: run_all(gm) applies each rewrite; a rewrite keeps the graph's values (as PyTorch computes them), logs
what it changed and returns how many places it changed.

Why here and not on the joint graph: PyTorch picks the attention kernel (flash, memory-efficient, cuDNN or the
decomposed math) while AOTAutograd traces, from the mask it is given. Hugging Face models build their masks from
torch.arange when Dynamo traces them (in eager they pass none): an all-true mask for BERT, a causal one for GPT-2
and LLaMA. Such a mask sends the step to the math attention (batched GEMMs, a softmax over [B, H, S, S] and its
backward) where eager PyTorch runs flash attention.
"""
import logging
import operator

import torch
import torch.fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

log = logging.getLogger("evt")

_SDPA = {torch._C._nn.scaled_dot_product_attention, torch.nn.functional.scaled_dot_product_attention}

# What a mask computed from constants may be made of: creation from sizes, comparisons, logic and views. A node
# outside these (an input, a parameter, a random op, an uninitialized tensor) makes the mask not a constant.
_CONST_FUNCTIONS = {
    torch.arange, torch.ones, torch.zeros, torch.full, torch.tril, torch.triu, torch.where, torch.logical_and,
    torch.logical_or, torch.logical_not, torch.eq, torch.ne, torch.ge, torch.gt, torch.le, torch.lt,
    torch.broadcast_to, torch.cumsum, torch.diff, torch.cat, torch.stack,
}
_CONST_OPERATORS = {
    operator.getitem, operator.add, operator.sub, operator.mul, operator.neg, operator.ge, operator.gt, operator.le,
    operator.lt, operator.eq, operator.ne, operator.and_, operator.or_, operator.invert, operator.floordiv,
    operator.mod,
}
_CONST_METHODS = {
    "expand", "view", "reshape", "unsqueeze", "squeeze", "to", "bool", "float", "contiguous", "transpose",
    "permute", "masked_fill", "logical_and", "logical_or", "logical_not", "__and__", "__or__", "__invert__",
    "tril", "triu", "ge", "gt", "le", "lt", "eq", "ne", "type", "cumsum", "diff", "__eq__", "__ne__", "__ge__",
    "__gt__", "__le__", "__lt__", "__add__", "__sub__", "__mul__", "__getitem__", "any", "all", "long", "int",
}
# Ops whose value depends on their first operand's shape, dtype and device only, never on its values: that operand
# may be anything (an input), and stands in as an uninitialized tensor of its traced metadata.
_SHAPE_ONLY_METHODS = {"new_ones", "new_zeros", "new_full"}
_SHAPE_ONLY_FUNCTIONS = {torch.ones_like, torch.zeros_like, torch.full_like}


def _shape_only(n):
    return (n.op == "call_method" and n.target in _SHAPE_ONLY_METHODS) or \
        (n.op == "call_function" and n.target in _SHAPE_ONLY_FUNCTIONS)


def _stand_in(n):
    """An uninitialized tensor of node n's traced shape, dtype and device, or None."""
    shape = _shape(n)
    if shape is None or not all(isinstance(s, int) for s in shape):
        return None
    v = n.meta["example_value"]
    return torch.empty(shape, dtype=v.dtype, device=v.device)


def _constant_node(n):
    if n.op == "call_function":
        return n.target in _CONST_FUNCTIONS or n.target in _CONST_OPERATORS
    return n.op == "call_method" and n.target in _CONST_METHODS


def _evaluate(node, memo, depth=64):
    """node's value when it is computed from constants only (_constant_node all the way up), else None."""
    if node in memo:
        return memo[node]
    memo[node] = None
    if depth == 0 or not (_constant_node(node) or _shape_only(node)):
        return None
    missing = []
    first = _stand_in(node.args[0]) if _shape_only(node) and node.args else None

    def value(a):
        if not isinstance(a, torch.fx.Node):
            return a
        v = _evaluate(a, memo, depth - 1)
        if v is None:
            missing.append(a)
        return v
    args = torch.fx.node.map_aggregate(node.args if first is None else node.args[1:], value)
    args = args if first is None else (first, *args)
    kwargs = torch.fx.node.map_aggregate(node.kwargs, value)
    if missing:
        return None
    if node.op == "call_method":
        self_, *rest = args
        memo[node] = getattr(self_, node.target)(*rest, **kwargs)
    else:
        memo[node] = node.target(*args, **kwargs)
    return memo[node]


def _mask_kind(mask, q_len, kv_len):
    """"all" when the mask lets every query see every key, "causal" when it is exactly PyTorch's is_causal mask
    (top-left lower triangle of [q_len, kv_len]) for every batch and head, else None. Masked is False for a bool
    mask, -inf or the dtype's lowest value for an additive one (exp of either underflows to 0 when the row keeps
    its diagonal, which a causal row does)."""
    if not isinstance(mask, torch.Tensor) or mask.dim() < 2 or mask.shape[-2:] not in (
            (q_len, kv_len), (1, kv_len), (q_len, 1), (1, 1)):
        return None
    mask = _one_of_each_broadcast(mask)
    if mask.dtype == torch.bool:
        keep = mask
    elif mask.is_floating_point():
        low = torch.finfo(mask.dtype).min
        if not bool(((mask == 0) | (mask == float("-inf")) | (mask == low)).all()):
            return None
        keep = mask == 0
    else:
        return None
    if bool(keep.all()):
        return "all"
    tril = torch.ones(q_len, kv_len, dtype=torch.bool, device=keep.device).tril()
    if bool((keep == tril).all()):
        return "causal"
    return None


def _one_of_each_broadcast(t):
    """t with every broadcast dim (stride 0) narrowed to size 1: the same values, and the checks below read and
    allocate no more than the mask's own elements (an expanded [B, 1, S, S] mask is one [S, S] or [S, 1])."""
    for d in range(t.dim()):
        if t.stride(d) == 0 and t.shape[d] > 1:
            t = t.narrow(d, 0, 1)
    return t


def _sdpa_args(n):
    """(q, k, attn_mask, is_causal) of an SDPA call, from its positional or keyword arguments."""
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")
    got = dict(zip(names, n.args))
    got.update(n.kwargs)
    return got.get("query"), got.get("key"), got.get("attn_mask"), bool(got.get("is_causal", False))


def _set_sdpa_args(n, attn_mask, is_causal):
    args = list(n.args)
    kwargs = dict(n.kwargs)
    for i, (name, val) in ((3, ("attn_mask", attn_mask)), (5, ("is_causal", is_causal))):
        if len(args) > i:
            args[i] = val
        else:
            kwargs[name] = val
    n.args, n.kwargs = tuple(args), kwargs


def _shape(n):
    v = n.meta.get("example_value") if isinstance(n, torch.fx.Node) else None
    return tuple(v.shape) if isinstance(v, torch.Tensor) else None


def drop_constant_attention_masks(gm):
    """An SDPA whose mask Dynamo's graph computes from constants alone: an all-true mask is dropped, a causal one
    becomes is_causal=True (PyTorch then may pick flash attention, as in eager). Returns how many changed."""
    count, memo = 0, {}
    for n in list(gm.graph.nodes):
        if n.op != "call_function" or n.target not in _SDPA:
            continue
        q, k, mask, causal = _sdpa_args(n)
        qs, ks = _shape(q), _shape(k)
        if not isinstance(mask, torch.fx.Node) or qs is None or ks is None or \
                not all(isinstance(s, int) for s in qs + ks):
            continue
        try:
            with torch.no_grad(), unset_fake_temporarily():  # (real tensors, even under a fake mode)
                kind = _mask_kind(_evaluate(mask, memo), qs[-2], ks[-2])
        except Exception as e:  # noqa: BLE001 (a mask this rewrite cannot evaluate stays as traced)
            log.info("the attention mask of %s was not evaluated (%s: %s); kept", n.name, type(e).__name__, e)
            continue
        if kind is None or causal:
            continue  # (a mask with is_causal stays as traced: PyTorch refuses the pair, and so must the step)
        _set_sdpa_args(n, None, kind == "causal")
        log.info("the attention mask of %s is constant (%s): %s", n.name, mask.name,
                 "dropped" if kind == "all" else "is_causal=True instead")
        count += 1
    if count:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return count


def run_all(gm):
    """Every rewrite above, in order; returns how many places changed."""
    return drop_constant_attention_masks(gm)
