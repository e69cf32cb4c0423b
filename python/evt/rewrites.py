"""Rewrites of the joint forward+backward FX graph before the partition (partition_fn): what evt can compute
better when it sees both halves of the step.

Contract: run_all(joint, options, num_fwd_outputs) applies every rewrite in order; each rewrite keeps the graph's
values (exactly, or as PyTorch computes them), logs what it changed and returns how many places it changed. Most
apply under the CUDA rules only (placement.cuda_rules).
"""
import logging
import operator

import torch
import torch.fx

from . import aten as A
from . import config
from . import placement as P
from . import torch_steps as TS

log = logging.getLogger("evt")
aten = torch.ops.aten


_PASS_THROUGH = {aten.alias.default, aten.detach.default, aten.view.default, aten._unsafe_view.default,
                 aten.reshape.default}


def mark_returned_log_softmax(gm, nout=None):
    """Marks (meta evt_stable_log_softmax) each log-softmax the module returns to its caller (the first nout
    outputs of the graph; all when nout is None), through aliases and views: aten.py translates it as x - max -
    log(sum(exp(x - max))) instead of evt's one-kernel log(softmax(x)), which is -inf where a probability
    underflows f32 (a logit ~88 below its row's max; PyTorch's value is finite there). A log-softmax kept only for
    the backward stays log(softmax(x)) (its gradient reads exp of it). Returns the number marked."""
    outs = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    count = 0
    for o in outs[:nout] if nout is not None else outs:
        while isinstance(o, torch.fx.Node) and o.target in _PASS_THROUGH and o.args:
            o = o.args[0]
        if isinstance(o, torch.fx.Node) and o.target == aten._log_softmax.default and \
                not o.meta.get("evt_stable_log_softmax"):
            o.meta["evt_stable_log_softmax"] = True
            count += 1
    return count


# ops a padded vocabulary dim may pass through (pad_vocab): views get the padded size, the rest are shape-generic
_VOCAB_VIEWS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default}


_VOCAB_OPS = _VOCAB_VIEWS | {aten.permute.default, aten.t.default, aten.transpose.int, aten.alias.default,
                             aten._to_copy.default, aten.clone.default, aten.detach.default, aten.mm.default,
                             aten.addmm.default, aten._log_softmax.default, aten._log_softmax_backward_data.default,
                             aten.nll_loss_forward.default, aten.nll_loss_backward.default, aten.sum.dim_IntList}


# ops where the vocabulary dim may end: the GEMM contracting over it (the hidden gradient) and the loss
_VOCAB_ENDS = {aten.mm.default, aten.addmm.default, aten.nll_loss_forward.default, operator.getitem}

# ops that may join a head value with a vocabulary-sized value from outside the head (a weight tied to the word
# embedding: its gradient is the head's plus the embedding's): the head's operand is sliced back to V there
_VOCAB_JOINS = {aten.add.Tensor}


def pad_vocab(gm, options=None):
    """A classifier head whose vocabulary V is not a multiple of 8 (bert's 30522 words), feeding a log-softmax and
    NLL loss, computed on V rounded up to 8 (Vp) in the joint graph: the weight gets zero rows and the bias its
    dtype's lowest value (exact: the padded logits' probabilities are 0, so are their gradients, and the loss
    picks only real targets), every [.., V] value of the head becomes [.., Vp], and the weight and bias gradients are
    sliced back to V. Then the logits GEMM, the log-softmax, the loss and its backward and both gradient GEMMs
    have 16-byte rows and run in evt (generated kernels; unpadded they would run in PyTorch with padded copies).
    Applied to a CUDA addmm(bias, x, permute(w)) or mm(x, permute(w)) (which becomes an addmm with a zero bias)
    that pad_gemm would pad when every op its vocabulary dim reaches is one the rewrite knows (_VOCAB_OPS); else
    the graph is left as it is. Returns the number of heads padded."""
    count = 0
    for a in list(gm.graph.nodes):
        if a.op == "call_function" and a.target in (aten.addmm.default, aten.mm.default) and TS.pad_gemm(a):
            count += _pad_vocab_head(gm, a)
    if count:
        gm.graph.lint()
        gm.recompile()
        log.info("joint graph: %d vocabulary head(s) padded to multiples of 8", count)
    return count


def _pad_vocab_head(gm, a):
    from torch._guards import detect_fake_mode
    bias, x, wt = a.args[:3] if a.target == aten.addmm.default else (None,) + tuple(a.args[:2])
    if len(a.args) > (3 if bias is not None else 2) or a.kwargs or \
            not all(isinstance(n, torch.fx.Node) for n in (x, wt) + ((bias,) if bias is not None else ())):
        return 0
    if wt.target not in P.PERMUTES or not isinstance(wt.args[0], torch.fx.Node):
        return 0
    w = wt.args[0]
    wv, av = w.meta.get("val"), a.meta.get("val")
    bv = bias.meta.get("val") if bias is not None else av
    if not all(isinstance(t, torch.Tensor) for t in (wv, bv, av)) or wv.dim() != 2 or av.dim() != 2:
        return 0
    v = wv.shape[0]
    if v % 8 == 0 or (bias is not None and tuple(bv.shape) != (v,)) or av.shape[-1] != v:
        return 0
    vp = TS.up8(v)
    region, joins = _vocab_region(wt, a, v)
    if region is None:
        return 0
    inside = set(region) | {w, bias}
    for n in region:  # every other vocabulary-sized operand would need padding too: not taken
        if any(i not in inside and _has_dim(i, v) for i in n.all_input_nodes):
            return 0
    mode = detect_fake_mode([p.meta.get("val") for p in gm.graph.nodes if p.op == "placeholder"])
    if mode is None:
        return 0
    g = gm.graph
    with g.inserting_after(w):
        w_p = g.call_function(aten.constant_pad_nd.default, (w, [0, 0, 0, vp - v], 0.0))
    if bias is None:  # (a head without a bias gets a zero one, to carry the padded words' lowest logits)
        with g.inserting_before(a):
            bias = g.call_function(aten.full.default, ([v], 0.0), {"dtype": av.dtype, "device": av.device,
                                                                     "pin_memory": False})
        with mode:
            bias.meta["val"] = aten.full.default([v], 0.0, dtype=av.dtype, device=av.device, pin_memory=False)
        a.target, a.args = aten.addmm.default, (bias, x, wt)
    with g.inserting_after(bias):
        # (the lowest finite value, not -inf: the loss picks its target's logit as a sum of logits x one-hot,
        # and -inf x 0 would be NaN; exp(lowest - max) is 0 all the same)
        b_p = g.call_function(aten.constant_pad_nd.default, (bias, [0, vp - v], float(torch.finfo(bv.dtype).min)))
    for p_ in (w_p, b_p):  # (a PyTorch step: one small copy per step; evt has no pad op)
        p_.meta["evt_torch_why"] = f"pad_vocab: the head's {'weight' if p_ is w_p else 'bias'} padded to {vp} words"
    wt.replace_input_with(w, w_p)
    a.replace_input_with(bias, b_p)
    for n in region:
        if n.target in _VOCAB_VIEWS:
            n.args = (n.args[0], [vp if d == v else d for d in n.args[1]]) + tuple(n.args[2:])
    order = {n: i for i, n in enumerate(g.nodes)}
    with mode:
        for n in sorted([w_p, b_p] + region, key=order.get):
            args, kwargs = torch.fx.node.map_arg((n.args, n.kwargs), lambda m: m.meta["val"])
            n.meta["val"] = n.target(*args, **kwargs)
            n.meta.pop("tensor_meta", None)
    # region values the graph returns (the weight and bias gradients) or joins with an outside value are sliced
    # back to V
    out = next(n for n in g.nodes if n.op == "output")
    for n, reader in [(n, out) for n in region if n in out.all_input_nodes] + joins:
        dim = list(n.meta["val"].shape).index(vp)
        with g.inserting_after(n):
            sl = g.call_function(aten.slice.Tensor, (n, dim, 0, v))
        with mode:
            sl.meta["val"] = aten.slice.Tensor(n.meta["val"], dim, 0, v)
        reader.replace_input_with(n, sl)
    return 1


def _vocab_region(wt, a, v):
    """(region, joins) of a vocabulary head: the values with a vocabulary dim reached from its weight permute wt
    and logits a, and the (region value, reader) pairs where a _VOCAB_JOINS op adds a vocabulary-sized value that
    does not come from the head; (None, None) when the dim reaches an op the rewrite does not know."""
    region, joins, todo = [], [], [wt, a]
    seen = set(todo)
    while todo:
        n = todo.pop()
        val = n.meta.get("val")
        if not isinstance(val, torch.Tensor) or v not in val.shape:
            if n.target not in _VOCAB_ENDS:
                return None, None
            continue  # (the vocabulary dim ends here)
        if n.target not in _VOCAB_OPS:
            return None, None
        region.append(n)
        for u in n.users:
            if u.op == "output":
                continue
            if u.target in _VOCAB_JOINS:
                joins.append((n, u))
                continue
            if u not in seen:
                seen.add(u)
                todo.append(u)
    inside = set(region)
    for _, u in joins:  # (a join of two head values would need no slice, nor stop the region: not taken)
        if all(i in inside for i in u.all_input_nodes if _has_dim(i, v)):
            return None, None
    return region, joins


def _has_dim(n, size):
    val = n.meta.get("val")
    return isinstance(val, torch.Tensor) and size in val.shape


def _upcast_source(up):
    """x when FX node up is `_to_copy(x, dtype=float32)` of a 16-bit x (a widening cast, exact), else None."""
    if not (isinstance(up, torch.fx.Node) and up.op == "call_function" and up.target == aten._to_copy.default
            and len(up.args) == 1 and set(up.kwargs) <= {"dtype"} and up.kwargs.get("dtype") == torch.float32):
        return None
    x = up.args[0]
    xv = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    return x if isinstance(xv, torch.Tensor) and xv.dtype in (torch.bfloat16, torch.float16) else None


def _upcast_again_before(gm, up, node):
    """A copy of the upcast up (same input, dtype and meta) inserted before node: the partitioner places it in
    the backward when node is there (a node tagged is_forward, and the nodes before it, go to the forward)."""
    with gm.graph.inserting_before(node):
        up2 = gm.graph.call_function(aten._to_copy.default, (up.args[0],), {"dtype": torch.float32})
    up2.meta.update({k: up.meta[k] for k in ("val", "tensor_meta") if k in up.meta})
    return up2


def _log_softmax_of_upcast(n):
    """(upcast, x) when FX node n is `_log_softmax(_to_copy(x, dtype=float32), dim, False)` over 16-bit x (a
    head's logits widened for the loss), else None."""
    if n.op != "call_function" or n.target != aten._log_softmax.default or len(n.args) != 3 or n.args[2]:
        return None
    up = n.args[0]
    x = _upcast_source(up)
    return (up, x) if x is not None and isinstance(n.meta.get("val"), torch.Tensor) else None


def recompute_log_softmax(gm, options=None):
    """A log-softmax evt runs (CUDA rules) over the f32 upcast of 16-bit logits, whose output the backward reads
    (_log_softmax_backward_data), is computed again in the backward from the 16-bit logits instead of being saved:
    saving it costs a [tokens, vocab] f32 tensor (written, then read back: 8 bytes per logit) where the logits
    themselves are 2 bytes each way, and the backward's row kernel recomputes the row's log-sum-exp while it
    reads them (the widening cast fuses into the softmax's load: partition rules, CONVERT). The forward's loss
    then needs no log-probabilities in memory (loss_elim's logsumexp form). Returns the number rewritten."""
    count = 0
    for n in list(gm.graph.nodes):
        m = _log_softmax_of_upcast(n)
        if m is None or not P.cuda_rules(m[1].meta["val"].device) or P.cuda_placement(n, options) is not None:
            continue
        up, x = m
        # the backward's readers of the output, directly or through aliases: its gradient, and the loss's
        # gradient (nll_loss_backward takes it for its shape)
        outs, todo, bwds = {n}, [n], []
        while todo:
            for u in todo.pop().users:
                if u.target in (aten.alias.default, aten.detach.default) and u not in outs:
                    outs.add(u)
                    todo.append(u)
                elif u.target in (aten._log_softmax_backward_data.default, aten.nll_loss_backward.default) and \
                        len(u.args) >= 2 and u.args[1] in outs:
                    bwds.append(u)
        if not any(u.target == aten._log_softmax_backward_data.default for u in bwds):
            continue
        order = {m: i for i, m in enumerate(gm.graph.nodes)}
        first = min(bwds, key=order.get)
        up2 = _upcast_again_before(gm, up, first)
        with gm.graph.inserting_before(first):
            ls2 = gm.graph.call_function(aten._log_softmax.default, (up2, n.args[1], False))
            ls2.meta.update({k: n.meta[k] for k in ("val", "tensor_meta") if k in n.meta})
        for u in bwds:
            u.args = (u.args[0], ls2) + tuple(u.args[2:])
        count += 1
    if count:
        gm.graph.eliminate_dead_code()
        gm.recompile()
        log.info("joint graph: %d log-softmax(es) recomputed in the backward from 16-bit logits", count)
    return count


def recompute_upcasts(gm, num_fwd_outputs, options=None):
    """A widening cast of a 16-bit value to f32 (autocast's `.float()` of a GEMM's logits) that the forward
    computes and the backward reads is computed again in the backward from the 16-bit value: the partition then
    saves the 16-bit value (2 bytes per element written by the forward and read by the backward) instead of
    the f32 copy (4 bytes each way); the cast is exact either way (XML-CNN's head: its f32 logits are no longer
    an output of the logits GEMM's epilogue). CUDA rules, tensors from placement.UNALIGNED_MIN_NUMEL elements.
    Returns the number rewritten."""
    if num_fwd_outputs is None:
        return 0
    # the forward, as the default partitioner splits: every node the forward's outputs need
    out = next(n for n in gm.graph.nodes if n.op == "output")
    returned = {a for a in out.args[0][:num_fwd_outputs] if isinstance(a, torch.fx.Node)}
    fwd, todo = set(), list(returned)
    while todo:
        n = todo.pop()
        if n not in fwd:
            fwd.add(n)
            todo.extend(n.all_input_nodes)
    bwd = {n for n in gm.graph.nodes if n not in fwd}
    count = 0
    order = {m: i for i, m in enumerate(gm.graph.nodes)}
    for up in list(gm.graph.nodes):
        x, v = _upcast_source(up), up.meta.get("val")
        if x is None or up in bwd or up in returned or not isinstance(v, torch.Tensor) or \
                not P.cuda_rules(v.device) or v.numel() < P.UNALIGNED_MIN_NUMEL:
            continue
        readers = [u for u in up.users if u in bwd]
        if not readers or len(readers) == len(up.users):
            continue  # (no backward reader, or no forward one: the forward does not make it for itself; a value
            # the module returns is written anyway, so neither is it rewritten then)
        up2 = _upcast_again_before(gm, up, min(readers, key=order.get))
        for u in readers:
            u.replace_input_with(up, up2)
        count += 1
    if count:
        gm.recompile()
        log.info("joint graph: %d f32 upcast(s) of 16-bit values recomputed in the backward", count)
    return count


def upcast_into_log_softmax(gm, options=None):
    """A log-softmax that runs in PyTorch on CUDA (unaligned rows: a vocabulary that is no multiple of 8) over the
    f32 upcast of 16-bit logits reads the 16-bit logits itself (`_log_softmax(x, dim, half_to_float=True)`, which
    accumulates in f32 all the same): the upcast's separate [tokens, vocab] f32 copy goes. The backward is
    unchanged (it reads the f32 output). Real CUDA tensors only (PyTorch has no CPU kernel for half_to_float).
    Returns the number rewritten."""
    count = 0
    for n in list(gm.graph.nodes):
        m = _log_softmax_of_upcast(n)
        if m is None or len(m[0].users) != 1 or m[1].meta["val"].device.type != "cuda" or not P.cuda_placement(n, options):
            continue
        up, x = m
        n.args = (x, n.args[1], True)
        gm.graph.erase_node(up)
        count += 1
    if count:
        gm.recompile()
        log.info("joint graph: %d log-softmax(es) read 16-bit logits directly (half_to_float)", count)
    return count


def joint_cse(gm):
    """Common-subexpression elimination on the joint graph with PyTorch's own pass (fx_graph_cse, which the
    min-cut partitioner runs and the default partitioner does not; it leaves random ops and values the module
    returns apart). Autocast casts the same activation once per consumer (XML-CNN's transposed embedding, once per
    convolution), and every copy would be saved for the backward. Returns the number of nodes removed."""
    try:
        from torch._functorch.compile_utils import fx_graph_cse
    except ImportError:  # (an older PyTorch without it: nothing to do)
        return 0
    before = len(gm.graph.nodes)
    gm.graph = fx_graph_cse(gm.graph)
    gm.recompile()
    removed = before - len(gm.graph.nodes)
    if removed:
        log.info("joint graph: %d duplicate node(s) removed (CSE)", removed)
    return removed


def _untranslated_on_cuda(node):
    """True when node is a CUDA op evt has no translation for (it runs in PyTorch anyway: PyTorch's fused
    attention backward _scaled_dot_product_{cudnn,flash,efficient}_attention_backward when attention stays
    in PyTorch)."""
    v = node.meta.get("val")
    vs = v if isinstance(v, (tuple, list)) else [v]
    on_cuda = any(isinstance(t, torch.Tensor) and P.cuda_rules(t.device) for t in vs)
    return on_cuda and getattr(node.target, "overloadpacket", None) not in A.TABLE


def stack_select_backwards(gm, options=None):
    """Rewrites a sum of select_backward(g_i, sizes, d, i) over every index i of dim d (the gradient of
    q, k, v = qkv[0], qkv[1], qkv[2]) into stack([g_0, ..., g_n-1], d) when the g_i are outputs of one op
    that runs in PyTorch on CUDA (placement.cuda_placement, or an op evt has no translation for: the fused
    attention backward); with the segmentation's data-movement rule the stack and the permute / flatten after it
    then run in PyTorch (one copy each) instead of n zero-filled scatters and n-1 adds. Returns how many sums
    were rewritten."""
    count = 0
    for root in list(gm.graph.nodes):
        if root.op != "call_function" or root.target != aten.add.Tensor:
            continue
        if any(u.target == aten.add.Tensor and len(u.args) == 2 for u in root.users):
            continue  # (not the root of an add tree)
        leaves, stack_, ok = [], [root], True
        while stack_ and ok:
            n = stack_.pop()
            for a in n.args[:2]:
                if not isinstance(a, torch.fx.Node) or len(a.users) != 1:
                    ok = False
                elif a.target == aten.add.Tensor and len(a.args) == 2 and not a.kwargs:
                    stack_.append(a)
                elif a.target == aten.select_backward.default:
                    leaves.append(a)
                else:
                    ok = False
            if n.kwargs or len(n.args) != 2:
                ok = False
        if not ok or len(leaves) < 2:
            continue
        sizes, dim = list(leaves[0].args[1]), leaves[0].args[2]
        if any(list(sb.args[1]) != sizes or sb.args[2] != dim for sb in leaves):
            continue
        d = dim % len(sizes)
        by_index = {sb.args[3] % sizes[d]: sb for sb in leaves}
        if len(by_index) != len(leaves) or sorted(by_index) != list(range(sizes[d])):
            continue
        grads = [by_index[i].args[0] for i in range(sizes[d])]
        srcs = {g.args[0] for g in grads if isinstance(g, torch.fx.Node) and g.target is operator.getitem}
        if len(srcs) != 1 or len(grads) != sizes[d] or not all(g.target is operator.getitem for g in grads):
            continue
        (src,) = srcs
        if not (P.cuda_placement(src, options) or _untranslated_on_cuda(src)):
            continue
        with gm.graph.inserting_before(root):
            st = gm.graph.call_function(aten.stack.default, (grads, d))
        st.meta = dict(root.meta)
        root.replace_all_uses_with(st)
        _fold_stack_permute_clone(gm, st)
        count += 1
    if count:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return count


def _fold_stack_permute_clone(gm, st):
    """clone(permute(stack(xs, d), perm)) -> stack([permute(x, q) for x in xs], perm.index(d)): the same
    contiguous tensor in one copy instead of two (the attention's q/k/v gradients, [B, H, S, D] each, become
    the [B, S, 3, H, D] gradient of the qkv projection; PyTorch's stack then reads each gradient once through
    its permuted view). Only when the permute is the stack's one user and the clone the permute's."""
    if len(st.users) != 1:
        return False
    (pm,) = st.users
    if pm.target != aten.permute.default or len(pm.users) != 1 or pm.kwargs:
        return False
    (cl,) = pm.users
    fmt = cl.kwargs.get("memory_format", torch.contiguous_format)
    if cl.target != aten.clone.default or len(cl.args) != 1 or fmt not in (torch.contiguous_format, None):
        return False
    xs, d = st.args[0], st.args[1] if len(st.args) > 1 else 0
    r = len(pm.args[1])
    perm = [p % r for p in pm.args[1]]
    d %= r
    if sorted(perm) != list(range(r)) or not all(isinstance(x, torch.fx.Node) for x in xs):
        return False
    nd = perm.index(d)
    q = [s_ if s_ < d else s_ - 1 for j, s_ in enumerate(perm) if j != nd]
    with gm.graph.inserting_before(cl):
        views = []
        for x in xs:
            v = gm.graph.call_function(aten.permute.default, (x, q))
            xv = x.meta.get("val")
            v.meta = dict(x.meta)
            if isinstance(xv, torch.Tensor):
                v.meta["val"] = xv.permute(q)
            views.append(v)
        st2 = gm.graph.call_function(aten.stack.default, (views, nd))
    st2.meta = dict(cl.meta)
    cl.replace_all_uses_with(st2)
    return True


def _channels_last_like(t):
    """True for a 3-D [N, C, W] tensor laid out [N, W, C] or a 4-D one in channels-last memory (not contiguous)."""
    if not isinstance(t, torch.Tensor) or t.dim() not in (3, 4) or t.is_contiguous() or t.shape[1] < 2:
        return False
    if t.dim() == 3:
        return t.stride(1) == 1 and t.stride(2) == t.shape[1] and t.stride(0) == t.shape[1] * t.shape[2]
    return t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last)


def mark_conv_inputs(gm):
    """A value laid out channels-last ([N, W, C] memory: XML-CNN's transposed embedding) that only convolutions and
    their backward read as input, in the whole joint graph, is returned by its evt segment contiguous in its
    logical [N, C, W] layout instead of PyTorch's recorded strides (meta evt_conv_input_free; Plan.finalize adds
    it to the segments' free_layout): cuDNN then takes it with the contiguous weight as it is instead of copying
    it in each convolution and backward, and what the convolutions return is contiguous too. Not for a
    convolution with a channels-last weight (cuDNN runs it NHWC). Returns the number marked."""
    count = 0
    for n in gm.graph.nodes:
        if n.op != "call_function" or not _channels_last_like(n.meta.get("val")) or not n.users:
            continue
        ok = all((u.target == aten.convolution.default and u.args[0] is n and n not in u.args[1:]) or
                 (u.target == aten.convolution_backward.default and len(u.args) > 2 and u.args[1] is n
                  and n is not u.args[0] and n not in u.args[2:]) for u in n.users)
        # a convolution whose weight is channels-last (a model in torch.channels_last: ResNet) runs NHWC in cuDNN
        # and wants its input channels-last too (a contiguous one would be copied back in every call), so such
        # inputs keep PyTorch's layout
        nhwc = any(_nhwc_strides(A.meta_val(u.args[1] if u.target == aten.convolution.default else u.args[2]))
                   for u in n.users) if ok else False
        if ok and not nhwc:
            n.meta["evt_conv_input_free"] = True
            count += 1
    if count:
        log.info("joint graph: %d convolution input(s) returned contiguous", count)
    return count


def _nhwc_strides(t):
    """True for a 4-D tensor with exactly channels-last strides, 1x1 kernels included (a [O, C, 1, 1] weight of a
    channels-last model has strides (C, 1, C, C), which PyTorch's convolution takes as channels-last, although
    the tensor is also contiguous)."""
    if not isinstance(t, torch.Tensor) or t.dim() != 4:
        return False
    _, c, h, w = t.shape
    return c > 1 and tuple(t.stride()) == (h * w * c, 1, w * c, c)


def mark_embedding_grads(gm):
    """A strided value that only embedding backward ops read as their gradient (XML-CNN's: the convolutions'
    input gradient [N, C, W] permuted back to the embedding's [N, W, C]) is returned by its evt segment
    contiguous (meta evt_conv_input_free, so in the segments' free_layout, and not as a PyTorch view of the
    segment's [N, C, W] result): PyTorch's embedding backward would copy it contiguous itself (a strided copy),
    where evt writes it with a tiled transpose. CUDA rules only. Returns the number marked."""
    count = 0
    for n in gm.graph.nodes:
        v = n.meta.get("val")
        if n.op != "call_function" or not isinstance(v, torch.Tensor) or not P.cuda_rules(v.device) or \
                v.is_contiguous() or not n.users:
            continue
        if all(u.target == aten.embedding_dense_backward.default and u.args and u.args[0] is n and
               n not in u.args[1:] for u in n.users):
            n.meta["evt_conv_input_free"] = True
            count += 1
    if count:
        log.info("joint graph: %d embedding gradient(s) returned contiguous", count)
    return count


def record_layer_norm_eps(gm):
    """Records each layer-norm backward's eps from its forward (meta evt_eps): the backward op has no eps
    argument, and evt's recomputes the statistics."""
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target == aten.native_layer_norm_backward.default:
            rstd = n.args[4]
            if isinstance(rstd, torch.fx.Node) and rstd.target is operator.getitem:
                fwd = rstd.args[0]
                if getattr(fwd, "target", None) == aten.native_layer_norm.default:
                    n.meta["evt_eps"] = float(fwd.args[4])


def _expanded_index_base(index, dim):
    """The 1-d index that `index` (an FX node) repeats over every dim but dim, as the FX node it is expanded from
    (shaped 1 in every other dim), or None."""
    if not isinstance(index, torch.fx.Node) or index.target != aten.expand.default:
        return None
    base, iv = index.args[0], A.meta_val(index)
    bs = A.static_shape(A.meta_val(base))
    if iv.dtype != torch.int64 or len(bs) != iv.dim() or any(s != 1 for d, s in enumerate(bs) if d != dim):
        return None
    return base


def index_ops_for_broadcast_index(gm):
    """gather / scatter_add whose index is a 1-d index expanded over the other dims (torch_geometric's
    aggregation and its backward) become index_select / index_add of the 1-d index (the same values). The
    partition then saves the 1-d index for the backward, whose gather would otherwise receive the expanded
    index as an input and no longer see that it repeats one index. Returns the number of nodes replaced."""
    count = 0
    for n in list(gm.graph.nodes):
        if n.op != "call_function" or n.target not in (aten.gather.default, aten.scatter_add.default):
            continue
        x, dim, index = n.args[:3]
        dim %= max(A.meta_val(n).dim(), 1)
        base = _expanded_index_base(index, dim)
        shape = A.static_shape(A.meta_val(x))
        if base is None or not A._index_fits(A.static_shape(A.meta_val(index)), shape, dim) or \
                (n.target == aten.scatter_add.default and
                 A.static_shape(A.meta_val(n.args[3])) != A.static_shape(A.meta_val(index))):
            continue
        with gm.graph.inserting_before(n):
            flat = gm.graph.call_function(aten.view.default, (base, [A.static_shape(A.meta_val(index))[dim]]))
            flat.meta["val"] = A.meta_val(base).reshape(-1)
            if n.target == aten.gather.default:
                new = gm.graph.call_function(aten.index_select.default, (x, dim, flat))
            else:
                new = gm.graph.call_function(aten.index_add.default, (x, dim, flat, n.args[3]))
        new.meta = dict(n.meta)
        n.replace_all_uses_with(new)
        gm.graph.erase_node(n)
        count += 1
    if count:
        gm.graph.eliminate_dead_code()
        gm.recompile()
        log.info("joint graph: %d gather / scatter_add over a broadcast index made index_select / index_add", count)
    return count


def run_all(joint, options=None, num_fwd_outputs=None):
    """Every rewrite of the joint graph, in order (num_fwd_outputs: AOTAutograd's count of the forward's outputs
    the module returns; None when unknown)."""
    if num_fwd_outputs is not None:
        mark_returned_log_softmax(joint, num_fwd_outputs)
    joint_cse(joint)
    index_ops_for_broadcast_index(joint)
    A.rewrite_joint(joint, attention=config.gpu_family_in_evt(options, "attention"),
                    cuda_pools=config.gpu_family_in_evt(options, "pooling"),
                    ln_devices=("cuda", "cpu") if P.cuda_rules("cpu") else ("cuda",))
    stack_select_backwards(joint, options)
    mark_conv_inputs(joint)
    mark_embedding_grads(joint)
    pad_vocab(joint, options)
    recompute_log_softmax(joint, options)
    recompute_upcasts(joint, num_fwd_outputs, options)
    upcast_into_log_softmax(joint, options)
    record_layer_norm_eps(joint)


# ---- after the partition: the forward and backward modules -------------------------------------------------

def _draws_random(op, args, kwargs):
    """False when op draws no random numbers with these arguments: an ATen op with a `dropout_p` argument (the
    attention kernels) draws only for its dropout, so none at dropout_p == 0. True for every other op tagged
    nondeterministic_seeded (the tag marks what may draw, not what does)."""
    schema = getattr(op, "_schema", None)
    if schema is None:
        return True
    for i, a in enumerate(schema.arguments):
        if a.name == "dropout_p":
            p = args[i] if i < len(args) else kwargs.get("dropout_p", a.default_value)
            return not (isinstance(p, (int, float)) and p == 0)
    return True


def unwrap_unseeded_rng_ops(fw, bw):
    """Undoes PyTorch's RNG functionalization of an activation-checkpointed op that draws no random numbers.

    default_partition wraps every op that is tagged nondeterministic_seeded and recomputed in the backward
    (torch.utils.checkpoint) in run_and_save_rng_state (forward: returns the generator state and the result,
    the state is saved for the backward) and run_with_rng_state (backward: restores the state, recomputes), so
    both draw the same numbers. An attention op with dropout_p == 0 carries the tag but draws nothing: its
    wrappers only hide it from evt (they have no translation) and save a generator state whose size is
    symbolic. Here each such pair becomes the plain op in both modules, and the state leaves the forward's
    outputs and the backward's inputs (matched by order: the k-th state output of the forward is the k-th
    rng_state_output placeholder of the backward, as the partitioner creates them). Pairs that draw are kept.
    Returns the number of pairs unwrapped."""
    wrap, rewrap = torch.ops.higher_order.run_and_save_rng_state, torch.ops.higher_order.run_with_rng_state
    out = next(n for n in fw.graph.nodes if n.op == "output")
    outs = list(out.args[0])
    states = [o for o in outs if isinstance(o, torch.fx.Node) and o.target is operator.getitem and
              o.args[0].target is wrap and o.args[1] == 0]
    holders = [n for n in bw.graph.nodes if n.op == "placeholder" and n.name.startswith("rng_state_output")]
    if len(states) != len(holders):  # (not the partitioner's layout: leave both modules as they are)
        return 0
    count = 0
    for state, holder in zip(states, holders):
        node = state.args[0]
        users = list(holder.users)
        if _draws_random(node.args[0], node.args[1:], node.kwargs) or \
                not all(u.target is rewrap and u.args[0] is holder for u in users) or \
                not all(u.target is operator.getitem for u in node.users):
            continue
        outs.remove(state)
        out.args = (tuple(outs),) + tuple(out.args[1:])
        meta = _call_unwrapped(fw.graph, node, node.args[1:], None)
        for u in users:
            _call_unwrapped(bw.graph, u, u.args[2:], meta)
        bw.graph.erase_node(holder)
        count += 1
    if count:
        for gm in (fw, bw):
            gm.graph.lint()
            gm.recompile()
        log.info("activation checkpointing: %d recomputed op(s) that draw no random numbers run unwrapped "
                 "(no generator state saved)", count)
    return count


def _call_unwrapped(graph, wrapper, args, meta):
    """Replaces wrapper (run_and_save_rng_state or run_with_rng_state of an op) by a call of its op with args;
    the result (item 1 of the former's tuple, the latter's value) goes to the wrapper's users. The call gets the
    op's meta: the forward's from its result item, the backward's from meta (the forward call's: the backward's
    wrapper has none). Returns the call's meta."""
    op = wrapper.args[1] if wrapper.target is torch.ops.higher_order.run_with_rng_state else wrapper.args[0]
    with graph.inserting_before(wrapper):
        call = graph.call_function(op, tuple(args), dict(wrapper.kwargs))
    if wrapper.target is torch.ops.higher_order.run_and_save_rng_state:
        for g in list(wrapper.users):
            if g.args[1] == 1:
                call.meta = dict(g.meta)
                g.replace_all_uses_with(call)
            graph.erase_node(g)
    else:
        call.meta = dict(meta or wrapper.meta)
        wrapper.replace_all_uses_with(call)
    graph.erase_node(wrapper)
    return call.meta
