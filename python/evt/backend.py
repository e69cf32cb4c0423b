"""The `evt` torch.compile backend: AOTAutograd joint graph -> evt segments, run on the CPU interpreter
(CPU tensors) or as evt GPU programs (CUDA tensors; gpu.py), PyTorch for the rest.

Contract
- `evt_backend(gm, example_inputs, options=None)` (registered as "evt"; options from
  torch.compile(..., options={"cudagraphs": bool|"step"|"segments", "fused": bool, "gpu_ops": "fast"|"all",
  "tune": bool|N}), checked by gpu.parse_options) is aot_autograd with DECOMPOSITIONS (PyTorch's core ATen set minus
  the ops evt wants whole: layer/batch norm and their backward, softmax/log_softmax and theirs, gelu
  backward, nll_loss, embedding backward, pooling backward, select/slice backward, ...), partition_fn
  (sees the joint forward+backward graph; logs its op histogram, records each layer-norm backward's eps
  from its forward, then splits with default_partition, or with min_cut_rematerialization_partition when
  EVT_PARTITIONER=min_cut) and compile_module as fw/bw compiler.
- compile_module(gm) walks the FX nodes in order and translates each into evt IR (aten.py). Maximal runs of
  translated nodes become one evt *segment* (one `.evt` graph, parsed once and cached by its text, which
  holds every shape and dtype); a node without an exact translation runs as ordinary PyTorch between
  segments and is logged (`EVT_LOG=1`, logger `evt`). If the evt parser rejects a statement the node it
  names is moved to PyTorch and the plan is rebuilt; if the interpreter fails at run time the segment's
  nodes run in PyTorch instead. Nothing evt cannot do ever fails the step. A PyTorch node that reads nothing
  of the segment being built runs before it; one that reads it runs after it (deferred), and the segment
  goes on until a node reads a deferred one (Plan._torch_step; EVT_DEFER_TORCH=0: it ends the segment).
- CUDA op placement (gpu.gpu_ops: options={"gpu_ops": "fast"|"all"}, else EVT_CUDA_OPS; default "fast"):
  under "fast" a CUDA node whose op is in CUDA_REFERENCE_ONLY (convolutions, attention, pooling and their
  backward, the embedding and its backward: evt's only GPU implementation of them is the reference library
  kernels/evt_fallback.cu, direct loops in double, no implicit-GEMM convolution or tiled attention; batch norm
  and its backward: evt's kernels measured slower, see _BN; EVT_BATCH_NORM=evt keeps them in evt; dropout
  only with EVT_DROPOUT=torch, see _DROP: by default it runs in evt with evt's masks) runs in
  PyTorch (cuDNN, flash attention), logged as a fallback with that reason; so does a large op whose rows
  are not 16-byte aligned (unaligned_rows: a 30522-word vocabulary's logits and their GEMMs), or that
  broadcasts or sums over some leading dims only (partial_broadcast: position embeddings and their gradient),
  for which evt has no generated kernel either. CPU nodes are unaffected.
  "all" keeps them in evt segments (CUDA attention then too; EVT_ATTENTION=evt: attention only).
- Casts hoisted (CUDA): an f32 -> bf16/f16 cast of a module input (autocast's copy of a weight, bias or
  input) runs in PyTorch before the module's first step (HOISTED_CAST, logged as a fallback; EVT_HOIST_CASTS=0
  keeps them in evt, where the lowering refuses the cast's group and it runs node by node in double); all of them
  as one torch._foreach_copy_ per dtype pair (run_hoisted_casts; EVT_FOREACH_CASTS=0: one kernel each).
- Joint graph (partition_fn, aten.rewrite_joint): pool backward ops become evt:: ones (on CUDA only under
  gpu_ops "all"), CUDA SDPA backward evt::sdpa_backward when attention is in evt, and a CUDA layer-norm
  backward whose statistics come from its forward evt::layer_norm_backward (recomputes them from x), so
  the forward no longer computes mean / rstd.
- A member of a segment needed outside it that is a chain of views (_VIEW_OPS) of a segment input or of
  a member (the chain's base, then a graph output of the segment) is made by PyTorch after the segment
  ran (Segment.torch_views: views, no copy), not written by evt as a copy.
- Large CUDA data moves no evt kernel takes (unfusable_move: concatenation, slice, slice_backward,
  select_backward from UNALIGNED_MIN_NUMEL elements) run in PyTorch, and a cast of a PyTorch-made value that only
  PyTorch reads goes with them (TORCH_CAST). An f32 upcast of a 16-bit value that both halves read is cast
  again in the backward (recompute_upcasts, joint graph): the forward saves the 16-bit value.
- A CUDA permute that makes a strided value contiguous (contiguous_permute: the attention output permuted
  back), or a slice of a value from before the segment with a contiguous result (contiguous_slice: bert's
  position embeddings), runs in PyTorch before the segment that reads it (a view; the segment binds it
  without a copy).
- A 16-bit 2-D CUDA input laid out transposed that only GEMMs read (gemm_only_transposed: the weight saved
  transposed for the backward) is declared as its [cols, rows] memory and read through a permute (a GEMM
  operand layout); the segment binds x.t(), no copy.
- Dense permuted layouts (CUDA; Segment._physical; EVT_PHYSICAL_LAYOUT=0 turns it off): when evt's passes
  cancel every permute (an elementwise segment), inputs and outputs recorded channels-last (any dense
  permutation, rank >= 3) are declared in memory order: inputs bound as they are, outputs written in
  memory order and returned as the permuted view with the recorded strides (no copies either way).
- Data movement of PyTorch-made values (CUDA; _DATA_MOVES: stack / cat / select_backward / views / clone
  whose every tensor input a PyTorch step made, e.g. the q/k/v gradients of the attention backward) runs
  in PyTorch before the segment reading it (in evt these are node-by-node copies); the stack of the q/k/v
  gradients takes the permute and clone after it (_fold_stack_permute_clone: one copy instead of two).
- Device dispatch (gpu.choose_path): a segment holds tensors of one device (aten.Builder.on_device; a
  node on another device starts a PyTorch step). CPU segments run on the interpreter. CUDA segments get
  an evt GPU program at plan time (gpu.Program: flags FUSED unless EVT_FUSED=0 / fused=False, CUDA_GRAPH
  with cudagraphs="segments"; cached by optimized text + flags + device, except CUDA-graph programs, which are
  per segment). If program creation names a node of the segment, that node moves to PyTorch and the plan
  is rebuilt (at most MAX_PROGRAM_REBUILDS times); any other creation failure, or a libevt without the
  program API, runs the segment in PyTorch (logged as fallbacks). A CUDA segment never runs on the
  interpreter. At run time inputs are made contiguous in evt's device dtype, outputs are torch.empty in
  the node's dtype on the device, and the step is enqueued on torch.cuda.current_stream() of the call.
  A GPU run that raises runs the segment in PyTorch from then on.
- STATS counts segment runs per path, GPU kernel launches (evt_program_launch_count per run) and CUDA
  graph captures since reset_stats().
- The returned callable is boxed (takes the argument list) and returns values in the module's output
  order; tensors evt produced are fresh, with the strides recorded in meta["val"]; outputs that are
  graph inputs (or PyTorch results) are returned as the module would return them.
- Graphs with symbolic shapes run as the unmodified module (logged).
"""
import collections
import copy
import hashlib
import logging
import operator
import os
import re
import weakref

import torch
import torch.fx
from torch._decomp import core_aten_decompositions
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.partitioners import default_partition

from . import aten as A
from . import config
from . import diskcache
from . import gpu as G
from .lib import EvtError, Graph

log = logging.getLogger("evt")
config.configure_logging(log)

aten = torch.ops.aten

# Ops evt translates whole (its row ops, losses and backward ops); the rest of the core set decomposes.
KEEP_WHOLE = {
    aten.gelu_backward, aten.native_layer_norm, aten.native_layer_norm_backward, aten._softmax,
    aten._softmax_backward_data, aten._log_softmax, aten._log_softmax_backward_data, aten.nll_loss_forward,
    aten.nll_loss_backward, aten.native_batch_norm_backward, aten._native_batch_norm_legit_functional,
    aten.native_batch_norm, aten._native_batch_norm_legit, aten.embedding_dense_backward,
    aten.max_pool2d_with_indices_backward, aten.avg_pool2d_backward, aten.adaptive_max_pool2d_backward,
    aten.binary_cross_entropy_with_logits, aten.mse_loss_backward, aten.threshold_backward,
    aten.slice_backward, aten.select_backward, aten.mse_loss,
    # PyTorch 2.11 decomposes the CPU flash-attention forward but not its backward kernel, whose
    # logsumexp input then disagrees with the decomposition's: wrong gradients. Kept whole.
    aten._scaled_dot_product_flash_attention_for_cpu,
}


def decompositions():
    return {k: v for k, v in core_aten_decompositions().items()
            if getattr(k, "overloadpacket", None) not in KEEP_WHOLE}


DECOMPOSITIONS = decompositions()


def _op_name(node):
    t = node.target
    if t is operator.getitem:
        return "getitem"
    return str(getattr(t, "__name__", t))


def histogram(gm):
    return collections.Counter(_op_name(n) for n in gm.graph.nodes if n.op == "call_function")


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


def partition_fn(joint, joint_inputs, options=None, **kwargs):
    """Sees the whole training step; records what evt needs across the fw/bw split, then splits."""
    if log.isEnabledFor(logging.INFO):
        h = histogram(joint)
        log.info("joint graph: %d ops: %s", sum(h.values()), ", ".join(f"{k} x{v}" for k, v in h.most_common()))
    if kwargs.get("num_fwd_outputs") is not None:
        mark_returned_log_softmax(joint, kwargs["num_fwd_outputs"])
    joint_cse(joint)
    A.rewrite_joint(joint, attention=config.gpu_family_in_evt(options, "attention"),
                    cuda_pools=config.gpu_family_in_evt(options, "pooling"),
                    ln_devices=("cuda", "cpu") if _cuda_rules("cpu") else ("cuda",))
    stack_select_backwards(joint, options)
    mark_conv_inputs(joint)
    mark_embedding_grads(joint)
    pad_vocab(joint, options)
    recompute_log_softmax(joint, options)
    recompute_upcasts(joint, kwargs.get("num_fwd_outputs"), options)
    upcast_into_log_softmax(joint, options)
    for n in joint.graph.nodes:
        if n.op == "call_function" and n.target == aten.native_layer_norm_backward.default:
            rstd = n.args[4]
            if isinstance(rstd, torch.fx.Node) and rstd.target is operator.getitem:
                fwd = rstd.args[0]
                if getattr(fwd, "target", None) == aten.native_layer_norm.default:
                    n.meta["evt_eps"] = float(fwd.args[4])
    return default_partition(joint, joint_inputs, **kwargs)


# ops a padded vocabulary dim may pass through (pad_vocab): views get the padded size, the rest are shape-generic
_VOCAB_VIEWS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default}
_VOCAB_OPS = _VOCAB_VIEWS | {aten.permute.default, aten.t.default, aten.transpose.int, aten.alias.default,
                             aten._to_copy.default, aten.clone.default, aten.detach.default, aten.mm.default,
                             aten.addmm.default, aten._log_softmax.default, aten._log_softmax_backward_data.default,
                             aten.nll_loss_forward.default, aten.nll_loss_backward.default, aten.sum.dim_IntList}
# ops where the vocabulary dim may end: the GEMM contracting over it (the hidden gradient) and the loss
_VOCAB_ENDS = {aten.mm.default, aten.addmm.default, aten.nll_loss_forward.default, operator.getitem}


def pad_vocab(gm, options=None):
    """A classifier head whose vocabulary V is not a multiple of 8 (bert's 30522 words), feeding a log-softmax and
    NLL loss, computed on V rounded up to 8 (Vp) in the joint graph: the weight gets zero rows and the bias its
    dtype's lowest value (exact: the padded logits' probabilities are 0, so are their gradients, and the loss
    picks only real targets), every [.., V] value of the head becomes [.., Vp], and the weight and bias gradients are
    sliced back to V. Then the logits GEMM, the log-softmax, the loss and its backward and both gradient GEMMs
    have 16-byte rows and run in evt (generated kernels; unpadded they ran in PyTorch with padded copies).
    Applied to a CUDA addmm(bias, x, permute(w)) that pad_gemm would pad when every op its vocabulary dim
    reaches is one the rewrite knows (_VOCAB_OPS); else the graph is left as it is. EVT_PAD_VOCAB=0 turns it
    off. Returns the number of heads padded."""
    count = 0
    for a in list(gm.graph.nodes):
        if a.op == "call_function" and a.target == aten.addmm.default and pad_gemm(a):
            count += _pad_vocab_head(gm, a)
    if count:
        gm.graph.lint()
        gm.recompile()
        log.info("joint graph: %d vocabulary head(s) padded to multiples of 8", count)
    return count


def _pad_vocab_head(gm, a):
    from torch._guards import detect_fake_mode
    bias, x, wt = a.args[:3]
    if len(a.args) > 3 or a.kwargs or not all(isinstance(n, torch.fx.Node) for n in (bias, x, wt)):
        return 0
    if wt.target not in _PERMUTES or not isinstance(wt.args[0], torch.fx.Node):
        return 0
    w = wt.args[0]
    wv, bv, av = w.meta.get("val"), bias.meta.get("val"), a.meta.get("val")
    if not all(isinstance(t, torch.Tensor) for t in (wv, bv, av)) or wv.dim() != 2 or bv.dim() != 1:
        return 0
    v = wv.shape[0]
    if v % 8 == 0 or tuple(bv.shape) != (v,) or av.shape[-1] != v:
        return 0
    vp = _up8(v)
    # the region: values with a vocabulary dim reached from the head's weight permute and logits
    region, todo = [], [wt, a]
    seen = set(todo)
    while todo:
        n = todo.pop()
        val = n.meta.get("val")
        if not isinstance(val, torch.Tensor) or v not in val.shape:
            if n.target not in _VOCAB_ENDS:
                return 0
            continue  # (the vocabulary dim ends here)
        if n.target not in _VOCAB_OPS:
            return 0
        region.append(n)
        for u in n.users:
            if u.op == "output":
                continue
            if u not in seen:
                seen.add(u)
                todo.append(u)
    inside = set(region) | {w, bias}
    for n in region:  # every other vocabulary-sized operand would need padding too: not taken
        for i in n.all_input_nodes:
            iv = i.meta.get("val")
            if i not in inside and isinstance(iv, torch.Tensor) and v in iv.shape:
                return 0
    mode = detect_fake_mode([p.meta.get("val") for p in gm.graph.nodes if p.op == "placeholder"])
    if mode is None:
        return 0
    g = gm.graph
    with g.inserting_after(w):
        w_p = g.call_function(aten.constant_pad_nd.default, (w, [0, 0, 0, vp - v], 0.0))
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
    # region values the graph returns (the weight and bias gradients) are sliced back to V
    out = next(n for n in g.nodes if n.op == "output")
    for n in region:
        if n in out.all_input_nodes:
            dim = list(n.meta["val"].shape).index(vp)
            with g.inserting_after(n):
                sl = g.call_function(aten.slice.Tensor, (n, dim, 0, v))
            with mode:
                sl.meta["val"] = aten.slice.Tensor(n.meta["val"], dim, 0, v)
            out.replace_input_with(n, sl)
    return 1


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
    the forward saved a [tokens, vocab] f32 tensor (written, then read back: 8 bytes per logit) where the logits
    themselves are 2 bytes each way, and the backward's row kernel recomputes the row's log-sum-exp while it
    reads them (the widening cast fuses into the softmax's load: partition rules, CONVERT). The forward's loss
    then needs no log-probabilities in memory (loss_elim's logsumexp form). bert_large's MLM head: 16384 x 30528
    logits per step. EVT_RECOMPUTE_LOG_SOFTMAX=0 turns it off. Returns the number rewritten."""
    count = 0
    for n in list(gm.graph.nodes):
        m = _log_softmax_of_upcast(n)
        if m is None or not _cuda_rules(m[1].meta["val"].device) or cuda_placement(n, options) is not None:
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
    the f32 copy (4 bytes each way); the cast is exact either way. XML-CNN's head: the [1024, 670208] f32 logits
    were an output of the logits GEMM's epilogue (2.75 GB) and the input of the loss backward's kernel, 1.63 ms on
    the H200 (S17W2). CUDA rules, tensors from UNALIGNED_MIN_NUMEL elements; EVT_RECOMPUTE_UPCASTS=0 turns it
    off. Returns the number rewritten."""
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
                not _cuda_rules(v.device) or v.numel() < UNALIGNED_MIN_NUMEL:
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
    """A log-softmax that runs in PyTorch on CUDA (unaligned rows: bert's 30522-word MLM head) over the f32 upcast
    of 16-bit logits reads the 16-bit logits itself (`_log_softmax(x, dim, half_to_float=True)`, which
    accumulates in f32 as before): the upcast's separate [tokens, vocab] f32 copy (1.2 ms per bert_large step on
    the H200, S13W4) goes. The backward is unchanged (it reads the f32 output). Real CUDA tensors only (PyTorch
    has no CPU kernel for half_to_float). EVT_UPCAST_LOG_SOFTMAX=0 turns it off. Returns the number rewritten."""
    count = 0
    for n in list(gm.graph.nodes):
        m = _log_softmax_of_upcast(n)
        if m is None or len(m[0].users) != 1 or m[1].meta["val"].device.type != "cuda" or not cuda_placement(n, options):
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
    returns apart). Autocast casts the same activation once per consumer: XML-CNN's transposed embedding went
    to bf16 three times (one per convolution, [256, 304, 512] each at x0.25) and all three were saved for the
    backward. EVT_JOINT_CSE=0 turns it off. Returns the number of nodes removed."""
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
    on_cuda = any(isinstance(t, torch.Tensor) and _cuda_rules(t.device) for t in vs)
    return on_cuda and getattr(node.target, "overloadpacket", None) not in A.TABLE


def stack_select_backwards(gm, options=None):
    """Rewrites a sum of select_backward(g_i, sizes, d, i) over every index i of dim d (the gradient of
    q, k, v = qkv[0], qkv[1], qkv[2]) into stack([g_0, ..., g_n-1], d) when the g_i are outputs of one op
    that runs in PyTorch on CUDA (cuda_placement, or an op evt has no translation for: the fused attention
    backward); with Plan's data-movement
    rule the stack and the permute / flatten after it then run in PyTorch (one copy each) instead of n
    zero-filled scatters and n-1 adds. Returns how many sums were rewritten."""
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
        if not (cuda_placement(src, options) or _untranslated_on_cuda(src)):
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


def _cuda_rules(device):
    """True when the CUDA placement and layout rules apply to a value on this device: CUDA, or the CPU
    with EVT_SIMULATE_CUDA_RULES=1 (tests: the rules' rewrites checked end to end on the interpreter)."""
    t = getattr(device, "type", device)
    return t == "cuda" or (t == "cpu" and config.SIMULATE_CUDA_RULES)


# ---- CUDA op placement ------------------------------------------------------------------------------------

def _keep(family):
    return f"; options={{'gpu_ops': 'all'}} or a gpu_ops list naming {family!r} keeps it in evt"


def _reference_only(family, what, how, torch_kernels):
    return (f"evt's only CUDA implementation of {what} is the reference library (kernels/evt_fallback.cu: {how}); "
            f"runs in PyTorch ({torch_kernels})" + _keep(family))


# Why each op family of config.GPU_OP_FAMILIES runs in PyTorch on CUDA unless options["gpu_ops"] names it.
FAMILY_REASON = {
    "convolution": _reference_only("convolution", "convolution", "direct loops in double, no implicit GEMM",
                                   "cuDNN"),
    "attention": ("evt's CUDA attention is cuDNN's fused flash attention for bf16/f16 (kernels/evt_cudnn_sdpa.cu; "
                  "a backward program recomputes the forward: evt's sdpa_backward takes q, k, v, not the saved "
                  "statistics) and the reference library for f32 (kernels/evt_fallback.cu: one thread per query row "
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
    if not any(isinstance(t, torch.Tensor) and _cuda_rules(t.device) for t in vs):
        return None
    family = CUDA_FAMILY.get(getattr(node.target, "overloadpacket", None))
    if family is None:
        return unaligned_rows(node) or long_rows(node) or partial_broadcast(node) or unfusable_move(node)
    return None if config.gpu_family_in_evt(options, family) else FAMILY_REASON[family]


# Tensors from this many elements on: an op whose rows are not 16-byte aligned runs in PyTorch (CUDA).
UNALIGNED_MIN_NUMEL = 1 << 20
# Row / pointwise ops on such rows run in PyTorch too, unless EVT_UNALIGNED_ROWS=evt: the row kernels take them
# element by element (no 16-byte vectors), which measured 3-4x slower than PyTorch's kernels on bert_large's
# MLM head (30522 words: its log-softmax and backward in evt took 13.7 ms per step vs PyTorch's ~7.6 with the
# copies; 101.0 vs 90.0 ms/step, S13W3)
_GEMMS = {aten.mm.default: 0, aten.addmm.default: 1, aten.bmm.default: 0}


def _row_length(t):
    """Elements per row of t in memory: the size of its unit-stride dim (channels-last: C), else the last."""
    unit = [d for d in range(t.dim()) if t.stride()[d] == 1 and t.shape[d] > 1]
    return t.shape[unit[-1]] if _dense_order(t) and unit else t.shape[-1]


def unaligned_rows(node):
    """Why a large CUDA op runs in PyTorch because evt has no generated kernel for its shapes, or None:
    a tensor of at least UNALIGNED_MIN_NUMEL elements (output or input) whose rows (last dim x element size)
    are not a multiple of 16 bytes (the row kernels' vector loads and CUTLASS need 16-byte rows), or a 16-bit
    GEMM with M, N or K not a multiple of 8 (a vocabulary of 30522 words): the reference library would run
    it node by node in double, with one thread per row for its reductions."""
    if node.target is operator.getitem:
        return None
    ts = [t for t in (node.meta.get("val"),) for t in (t if isinstance(t, (tuple, list)) else [t])]
    ts += [a.meta.get("val") for a in _tensor_args(node)]
    ts = [t for t in ts if isinstance(t, torch.Tensor) and t.dim() >= 1]
    if not ts or max(t.numel() for t in ts) < UNALIGNED_MIN_NUMEL:
        return None
    for t in ts:
        if t.numel() >= UNALIGNED_MIN_NUMEL and (_row_length(t) * t.element_size()) % 16:
            return (f"rows of {_row_length(t)} x {str(t.dtype).replace('torch.', '')} are not 16-byte aligned: evt's "
                    "row kernels would take them element by element (no 16-byte vector accesses: several times "
                    "slower than PyTorch's) and no GEMM epilogue stores them; runs in PyTorch")
    k = _GEMMS.get(node.target)
    if k is not None and len(node.args) >= k + 2:
        a, b = (x.meta.get("val") for x in node.args[k:k + 2])
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype in (torch.bfloat16, torch.float16):
            dims = (a.shape[-2], a.shape[-1], b.shape[-1])
            if any(d % 8 for d in dims):
                return (f"GEMM M={dims[0]} K={dims[1]} N={dims[2]}: CUTLASS needs multiples of 8 (16-byte rows); runs "
                        "in PyTorch (cuBLAS) instead of node by node; options={'gpu_ops': 'all'} keeps it in evt")
    return None


# The longest row evt's register-resident row / pointwise kernels take (32 warps x 32 lanes x 4 chunks x 8
# elements; kernels/evt_row_config.h). Longer rows run as the generated kernels' long-row form (session 26), which has
# no sum over rows: a group with one (a bias gradient beside a nucleus-free op) runs node by node, so a large op on
# longer rows that no GEMM feeds still runs in PyTorch (long_rows below).
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
            if a.target in _GEMMS:
                if unaligned_rows(a) is None:
                    return True
                continue  # (a GEMM left to PyTorch has no epilogue that could take the chain)
            todo.append((a, d + 1))
    return False


def long_rows(node):
    """Why a large CUDA op that no GEMM feeds runs in PyTorch because its rows are longer than the row kernels
    take (ROW_KERNEL_MAX_N), or None: its group would run node by node in the reference library (in double);
    XML-CNN's loss backward over 670,208 labels took 22 ms so on the H200 (S11W5), where PyTorch's elementwise
    kernels stream at bandwidth. A chain a GEMM feeds stays in evt (the GEMM epilogue takes any row length)."""
    if node.target in _GEMMS or node.target is operator.getitem or node.target in _VIEW_OPS:
        return None
    if _whole_tensor_pointwise(node):
        return None  # (an elementwise-only group launches as rows of any length: exec_plan.c elementwise_launch_shape)
    ts = [t for t in (node.meta.get("val"),) for t in (t if isinstance(t, (tuple, list)) else [t])]
    ts += [a.meta.get("val") for a in _tensor_args(node)]
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
    would run node by node in the reference library (in double: 0.8 ms for bert_large's position-embedding
    add, 0.1 ms for its gradient's sum, S13W6 / S14W1); PyTorch's kernels stream them at bandwidth."""
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
    for a in _tensor_args(node):
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
# library (in double). ViT's token concatenation (class token + patches, with the f32 cast of the patches), the
# zero-padded gradient of its class-token select and the patches' slice of the token gradient, each
# [128, 257, 768] f32 at batch 128: ~1.2 ms per reference-library pass on the H200 (S17W1, k_elementwise).
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


def _torch_bound(node, options=None, depth=6):
    """True when every reader of node runs in PyTorch by the placement rules (cuda_placement), also through
    data moves (views, casts) whose own readers do: a value only PyTorch reads."""
    if depth == 0 or not node.users:
        return False
    for u in node.users:
        if u.op != "call_function":
            return False
        if cuda_placement(u, options) is not None:
            continue
        if (u.target in _DATA_MOVES or u.target in _CASTS) and _torch_bound(u, options, depth - 1):
            continue
        return False
    return True


TORCH_CAST = ("cast of a PyTorch-made value that only PyTorch reads (the input of a concatenation or a slice "
              "PyTorch runs): one PyTorch kernel instead of an evt segment of its own")


def _whole_tensor_pointwise(node):
    """True for a pointwise op (ATen's pointwise tag, or a cast) with a contiguous result whose tensor operands
    are contiguous of its shape or have one element: a group of such ops has no broadcast vector or reduction,
    and the runtime launches it reshaped into rows the row kernel takes, whatever the row length (XML-CNN's
    loss backward over 670,208 labels: sigmoid, sub, mul, div and the bf16 cast in one kernel instead of five
    PyTorch passes). A strided operand would be a permute the group cannot take."""
    t = node.target
    if not (t in _CASTS or torch.Tag.pointwise in getattr(t, "tags", ())):
        return False
    v = node.meta.get("val")
    if not isinstance(v, torch.Tensor) or not v.is_contiguous():
        return False
    for a in _tensor_args(node):
        av = a.meta.get("val")
        if not isinstance(av, torch.Tensor) or not (av.numel() == 1 or (tuple(av.shape) == tuple(v.shape)
                                                                         and av.is_contiguous())):
            return False
    return True


HOISTED_CAST = ("cast of a module input to 16 bits (autocast's weight copy): one PyTorch kernel at the start of "
                "the module (in evt its group is refused by the lowering: a cast rounded inside an epilogue, and it "
                "would run node by node); EVT_HOIST_CASTS=0 keeps it in evt")
_CASTS = {aten._to_copy.default, torch.ops.prims.convert_element_type.default}


def hoisted_casts(gm):
    """The casts run in PyTorch before the first step (module contract): f32 -> bf16/f16 casts of the
    module's inputs on CUDA, in graph order."""
    out = []
    for n in gm.graph.nodes:
        if n.op != "call_function" or n.target not in _CASTS or not n.args:
            continue
        x = n.args[0]
        if not isinstance(x, torch.fx.Node) or x.op != "placeholder":
            continue
        v, xv = n.meta.get("val"), x.meta.get("val")
        if not (isinstance(v, torch.Tensor) and isinstance(xv, torch.Tensor)):
            continue
        if (_cuda_rules(v.device) and v.device == xv.device and xv.dtype == torch.float32
                and v.dtype in (torch.bfloat16, torch.float16) and v.shape == xv.shape):
            out.append(n)
    return out


def _channels_last_like(t):
    """True for a 3-D [N, C, W] tensor laid out [N, W, C] or a 4-D one in channels-last memory (not contiguous)."""
    if not isinstance(t, torch.Tensor) or t.dim() not in (3, 4) or t.is_contiguous() or t.shape[1] < 2:
        return False
    if t.dim() == 3:
        return t.stride(1) == 1 and t.stride(2) == t.shape[1] and t.stride(0) == t.shape[1] * t.shape[2]
    return t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last)


def mark_conv_inputs(gm):
    """(Default; EVT_CONV_INPUT_LAYOUT=strided turns it off) A value laid out channels-last
    ([N, W, C] memory: XML-CNN's transposed embedding) that only convolutions and their backward read as input,
    in the whole joint graph, is returned by its evt segment contiguous in its logical [N, C, W] layout instead
    of PyTorch's recorded strides (meta evt_conv_input_free; Plan.finalize adds it to the segments'
    free_layout): cuDNN then takes it with the contiguous weight as it is, where it copied it in each
    convolution and backward (7 copies, 1.6 ms per xmlcnn_paper x0.25 step, S13W4); what the convolutions
    return is then contiguous too. On the H200 xmlcnn_paper x0.25 went from 8.07 to 6.42 ms/step with it
    (S13W6 vs S14W1). Not for a convolution with a channels-last weight (cuDNN runs it NHWC). Returns the number
    marked."""
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
        log.info("joint graph: %d convolution input(s) returned contiguous (EVT_CONV_INPUT_LAYOUT)", count)
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
    segment's [N, C, W] result): PyTorch's embedding backward copied it contiguous itself (a strided copy,
    0.27 ms per xmlcnn_paper x0.25 step, S14W2), where evt writes it with a tiled transpose. CUDA rules only.
    Returns the number marked."""
    count = 0
    for n in gm.graph.nodes:
        v = n.meta.get("val")
        if n.op != "call_function" or not isinstance(v, torch.Tensor) or not _cuda_rules(v.device) or \
                v.is_contiguous() or not n.users:
            continue
        if all(u.target == aten.embedding_dense_backward.default and u.args and u.args[0] is n and
               n not in u.args[1:] for u in n.users):
            n.meta["evt_conv_input_free"] = True
            count += 1
    if count:
        log.info("joint graph: %d embedding gradient(s) returned contiguous", count)
    return count


_PERMUTES = {aten.permute.default, aten.transpose.int, aten.t.default}
# Data movement that runs in PyTorch when every tensor it reads was made by a PyTorch step (CUDA).
_DATA_MOVES = {aten.stack.default, aten.cat.default, aten.select_backward.default, aten.slice_backward.default,
               aten.permute.default, aten.transpose.int, aten.t.default, aten.view.default, aten._unsafe_view.default,
               aten.reshape.default, aten.clone.default, aten.expand.default, aten.unsqueeze.default,
               aten.squeeze.dim, aten.select.int, aten.slice.Tensor, operator.getitem}


def _on_cuda(node):
    v = node.meta.get("val")
    v = v[0] if isinstance(v, (tuple, list)) and v else v
    return isinstance(v, torch.Tensor) and _cuda_rules(v.device)


def _tensor_args(node):
    out = []
    for a in node.args:
        for x in (a if isinstance(a, (list, tuple)) else [a]):
            if isinstance(x, torch.fx.Node):
                out.append(x)
    return out


def _dense_order(v):
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
    if not (isinstance(v, torch.Tensor) and _cuda_rules(v.device) and v.dim() == 2
            and v.dtype in (torch.bfloat16, torch.float16) and v.shape[0] > 1 and v.shape[1] > 1
            and tuple(v.stride()) == (1, v.shape[0])):
        return False
    for u in x.users:
        if _gemm_operand_use(u, x):
            continue
        if u.target in _PERMUTES and u.users and all(_gemm_operand_use(w, u) for w in u.users):
            continue
        return False
    return True


def contiguous_slice(node):
    """True for a CUDA slice whose result is contiguous (a prefix or a block of rows of a contiguous value:
    bert's position embeddings sliced to the sequence length): PyTorch makes it as a free view before the
    segment that reads it, which binds the slice itself; in evt a slice has no visitor node, so its group
    (the embedding sum and the first layer norm's mean) ran node by node in the reference library (in
    double: 0.8 ms for bert_large's [32, 512, 1024] add, S13W6)."""
    if node.target is not aten.slice.Tensor or not node.args or not isinstance(node.args[0], torch.fx.Node):
        return False
    v, xv = node.meta.get("val"), node.args[0].meta.get("val")
    return (isinstance(v, torch.Tensor) and isinstance(xv, torch.Tensor) and _cuda_rules(v.device)
            and xv.is_contiguous() and v.is_contiguous() and v.numel() > 1)


def contiguous_permute(node):
    """True for a permute / transpose on CUDA that turns a strided value into a contiguous one (e.g. the
    attention output, [B, H, S, D] over memory laid out [B, S, H, D], permuted back): PyTorch makes it as
    a free view, and the segment binds the contiguous result instead of copying the strided input into
    contiguous memory and permuting it again (which also keeps a GEMM operand off its layouts)."""
    if node.target not in _PERMUTES or not node.args or not isinstance(node.args[0], torch.fx.Node):
        return False
    v, xv = node.meta.get("val"), node.args[0].meta.get("val")
    return (isinstance(v, torch.Tensor) and isinstance(xv, torch.Tensor) and _cuda_rules(v.device)
            and not xv.is_contiguous() and v.is_contiguous() and v.numel() > 1)


# ---- segments -----------------------------------------------------------------------------------------

_GRAPHS = {}  # sha256 of the segment text -> parsed Graph (the text holds every shape and dtype)


def _graph_for(text, dump=None):
    """The parsed and pass-optimized graph of a segment text, cached in memory and, unless EVT_CACHE=0, on disk
    (diskcache.py: the optimized text, reused by later processes). dump: a folder that gets the text and its
    optimized form (options["dump"])."""
    key = hashlib.sha256(text.encode()).hexdigest()
    g = _GRAPHS.get(key)
    if g is None:
        name = f"evt-{key[:12]}.evt"
        dkey = diskcache.key(text) if diskcache.enabled() else None
        g = diskcache.load(dkey, name) if dkey else None
        if g is None:
            optimized = False
            try:
                g = Graph(text, name, optimize=True)
                optimized = True
            except EvtError as e:
                if "no graph passes" not in str(e):
                    log.warning("evt graph passes failed on %s (%s); running it unoptimized", name, e)
            if g is None:
                g = Graph(text, name)
            if dkey:
                diskcache.store(dkey, g, optimized)
        log.info("  segment %s: %d evt nodes, %d after the graph passes", name, g.parsed_nodes, g.node_count)
        _GRAPHS[key] = g
    if dump:
        os.makedirs(dump, exist_ok=True)
        for suffix, body in ((".evt", text), (".opt.evt", None)):
            path = os.path.join(dump, key[:16] + suffix)
            if not os.path.exists(path):
                with open(path, "w") as f:
                    f.write(body if body is not None else g.text())
    return g


_DEF = re.compile(r"^%([\w.]+)(?::| =)")
_REF = re.compile(r"%([\w.]+)")


def _used_input_lines(lines, out_names):
    """The segment's statements without those nothing reads, inputs included (repeated until none is left;
    every statement of the text format is pure, the outputs are listed). A value evt only passes on (an alias
    of a PyTorch-made value, which PyTorch then makes as a view: Segment.torch_views) stayed an input that
    every run bound, and a strided one was copied to be bound: the cuDNN attention output of every bert_large
    layer, forward and backward, 48 copies per step on the H200 (S12W5/W6, input_copies)."""
    lines = list(lines)
    while True:
        refs = set(out_names)
        for ln in lines:
            rhs = ln.split("=", 1)[1] if "=" in ln else ln
            refs.update(_REF.findall(rhs))
        keep = [ln for ln in lines if not ((m := _DEF.match(ln)) and m.group(1) not in refs)]
        if len(keep) == len(lines):
            return keep
        lines = keep


class Segment:
    """A run of FX nodes translated into one evt graph, run on the device of its tensors: the CPU
    interpreter, an evt GPU program, or (when the program cannot run it) PyTorch."""

    def __init__(self, options=None):
        self.b = A.Builder()
        self.members = []
        self.options = options or {}
        self.b.cuda_attention = config.gpu_family_in_evt(self.options, "attention")
        self.b.transposed_input = gemm_only_transposed
        self.path = None      # "interp", "gpu" or "torch" (set by finalize)
        self.free_layout = set()  # FX nodes returned as evt wrote them (contiguous; see Plan.finalize)
        self.program = None
        self.why = None       # why a CUDA segment runs in PyTorch
        self.torch_views = []  # members that are views of segment inputs, needed outside: PyTorch views

    def finalize(self, users_outside, program_node_fallback=True, defer_program=False):
        """defer_program: leave a GPU segment's program to create_program() (the plan prefetches every
        segment's kernels in one JIT batch first)."""
        b, members = self.b, set(self.members)
        inputs = {name for _, name in b.inputs}
        self.outputs, self.aliases, out_names = [], [], []
        # Views needed outside: a chain of view ops (_VIEW_OPS) ending in a member needed outside is made by
        # PyTorch from the chain's base (a segment input, or a member evt then writes as it is): evt's output
        # would be a materialized copy, copied again into PyTorch's recorded strides.
        self.torch_views, bases = [], set()
        for m in self.members:
            name = b.names.get(m)
            if isinstance(name, dict) or name in inputs or m.target not in _VIEW_OPS or m.meta.get("evt_conv_input_free"):
                continue  # (a view marked to be returned contiguous is written by evt: mark_embedding_grads)
            if not any(u not in members for u in users_outside(m)):
                continue
            chain, x = [], m
            while x in members and x.target in _VIEW_OPS and x.args and isinstance(x.args[0], torch.fx.Node):
                chain.append(x)
                x = x.args[0]
            if x in members and (isinstance(b.names.get(x), dict) or x.target in _VIEW_OPS):
                continue  # (the base is a tuple, or a view of a non-tensor)
            if x not in members and x not in {i for i, _ in b.inputs}:
                continue
            for v in reversed(chain):
                if v not in self.torch_views:
                    self.torch_views.append(v)
            if x in members:
                bases.add(x)
        order = {m: i for i, m in enumerate(self.members)}
        self.torch_views.sort(key=order.get)
        torch_made = set(self.torch_views)
        for m in self.members:
            name = b.names.get(m)
            if m in torch_made or isinstance(name, dict):
                continue
            if m not in bases and not any(u not in members for u in users_outside(m)):
                continue
            if name in inputs:
                src = next(x for x, nm in b.inputs if nm == name)
                self.aliases.append((m, src))
                continue
            if name not in out_names:
                out_names.append(name)
            self.outputs.append((m, out_names.index(name)))
        lines = _used_input_lines(b.lines, out_names)
        self.text = "graph seg {\n  " + "\n  ".join(lines) + "\n" + \
            (f"  output {', '.join('%' + n for n in out_names)}\n" if out_names else "") + "}\n"
        self.graph = _graph_for(self.text, self.options.get("dump")) if self.outputs else None
        if self.graph is None:
            self.path = "none"
            return
        self.phys_in, self.phys_out = {}, {}  # bound name -> order / output index -> order (see _physical)
        if b.device is not None and _cuda_rules(b.device):
            self._physical(out_names)
        self.out_index = list(self.outputs)  # (FX node, index of the graph output)
        # the type of each graph output, from the first FX node it holds
        self.out_types = {}
        for m, k in self.out_index:
            v = A.meta_val(m)
            shape = tuple(int(s) for s in v.shape)
            if k in self.phys_out:
                shape = tuple(shape[d] for d in self.phys_out[k])
            self.out_types.setdefault(k, (shape, v.dtype))
        # node ids after the passes renumbered them
        bound = [(x, name + ".phys" if name + ".phys" in self.phys_in else name) for x, name in b.inputs]
        self.inputs = [(x, self.graph.ids[name]) for x, name in bound if name in self.graph.ids]
        self.input_names = [(x, name) for x, name in bound if name in self.graph.ids]
        self.outputs = [(m, self.graph.outputs[k]) for m, k in self.outputs]
        dev = b.device or torch.device("cpu")
        self.device = dev
        self.path = G.choose_path(dev.type, G.has_program_api())
        if self.path == "torch":
            self.why = f"libevt has no GPU program API (evt_program_create) for {dev}"
        elif self.path == "gpu":
            if defer_program:
                self.pending = program_node_fallback
            else:
                self._create_program(program_node_fallback)

    def create_program(self):
        """The deferred program of finalize(defer_program=True)."""
        node_fallback = getattr(self, "pending", None)
        if node_fallback is not None:
            self.pending = None
            self._create_program(node_fallback)

    def _physical(self, out_names):
        """Channels-last and other dense permuted layouts (CUDA): inputs and outputs whose recorded strides
        are a dense permutation of their shape are declared in their memory order (`%in.x.phys` permuted to
        the logical `%in.x`; an output `%y` written as `permute(%y)`), so the segment binds the memory as it
        is and returns a permuted view with the recorded strides, instead of copying each input to
        row-major and each output back. Taken only when evt's passes cancel every permute (an elementwise
        segment); otherwise the segment keeps its row-major text."""
        b = self.b
        pin = {name: _dense_order(A.meta_val(x)) for x, name in b.inputs}
        pin = {k: o for k, o in pin.items() if o}
        pout = {}
        for m, k in self.outputs:
            o = _dense_order(A.meta_val(m)) if m not in self.free_layout else None
            if o and pout.get(k, o) == o:
                pout[k] = o
            else:
                pout[k] = None
        pout = {k: o for k, o in pout.items() if o}
        if not pin and not pout:
            return
        if "permute(" in self.graph.text() or "transpose(" in self.graph.text():
            return self._physical_inputs(out_names, pin)  # (permutes already: only large inputs, below)
        lines = self._phys_input_lines(out_names, pin)
        outs = list(out_names)
        types = {}
        for m, k in self.outputs:
            types.setdefault(k, A.meta_val(m))
        for k, o in sorted(pout.items()):
            lines.append(f"%{out_names[k]}.phys: {A.type_str(types[k].permute(o))} = "
                         f"permute(%{out_names[k]}, dims=[{','.join(map(str, o))}])")
            outs[k] = out_names[k] + ".phys"
        text, g = self._parsed(lines, outs, "a segment", self.options.get("dump"))
        if g is None:
            return
        if "permute(" in g.text() or "transpose(" in g.text():
            return self._physical_inputs(out_names, pin)  # (a permute the passes could not cancel: a copy)
        self.text, self.graph = text, g
        self.phys_in = {name + ".phys": o for name, o in pin.items()}
        self.phys_out = pout

    @staticmethod
    def _parsed(lines, outs, what, dump=None):
        """(text, parsed graph) of a segment with these statements and outputs, or (text, None) when evt rejects
        it (logged: the segment keeps its row-major text)."""
        text = "graph seg {\n  " + "\n  ".join(lines) + "\n" + f"  output {', '.join('%' + n for n in outs)}\n" + "}\n"
        try:
            return text, _graph_for(text, dump)
        except EvtError as e:
            log.info("  physical layout of %s rejected (%s); row-major kept", what, e)
            return text, None

    def _phys_input_lines(self, out_names, pin):
        """The segment's used statements with each input named in pin (name -> memory order) declared in memory
        order as `%name.phys` and permuted to the logical `%name`."""
        vals = {name: A.meta_val(x) for x, name in self.b.inputs}
        lines = []
        for ln in _used_input_lines(self.b.lines, out_names):
            name = ln.split(":", 1)[0].strip()[1:]
            if name in pin and ln.rstrip().endswith("= input()"):
                o = pin[name]
                inv = [o.index(d) for d in range(len(o))]
                lines.append(f"%{name}.phys: {A.type_str(vals[name].permute(o))} = input()")
                lines.append(f"%{name}: {A.type_str(vals[name])} = permute(%{name}.phys, dims=[{','.join(map(str, inv))}])")
            else:
                lines.append(ln)
        return lines

    def _physical_inputs(self, out_names, pin):
        """The segment keeps permutes (a GEMM, a row op): its large dense permuted inputs (at least
        UNALIGNED_MIN_NUMEL elements: XML-CNN's [N, C, W] view of the [N, W, C] embedding) are still declared
        in memory order and permuted in the segment, where a GEMM absorbs the permute as its operand layout
        or evt writes it with a tiled transpose; bound as they are, they were copied to row-major by a
        strided PyTorch copy at every run (0.27 ms per xmlcnn_paper x0.25 step, S14W2). Outputs keep
        PyTorch's recorded strides."""
        vals = {name: A.meta_val(x) for x, name in self.b.inputs}
        pin = {k: o for k, o in pin.items() if vals[k].numel() >= UNALIGNED_MIN_NUMEL}
        if not pin:
            return
        text, g = self._parsed(self._phys_input_lines(out_names, pin), out_names, "a segment's inputs",
                               self.options.get("dump"))
        if g is None:
            return
        self.text, self.graph = text, g
        self.phys_in = {name + ".phys": o for name, o in pin.items()}

    def _create_program(self, node_fallback):
        flags = G.program_flags(self.options)
        try:
            self.program = _program_for(self.graph, flags, self.device)
        except G.ProgramError as e:
            msg = str(e)
            m = _NODE_IN_MSG.search(msg)
            bad = self.b.origin.get(m.group(1)) if m else None
            if node_fallback and bad in self.members:
                e.node = bad  # build_plan moves this FX node to PyTorch and rebuilds
                raise
            self.path, self.why = "torch", f"evt GPU program: {msg}"
            return
        except Exception as e:  # noqa: BLE001 (anything else: this segment runs in PyTorch, logged)
            self.path, self.why = "torch", f"evt GPU program: {type(e).__name__}: {e}"
            return
        self.pool = G.OutputPool() if flags & G.EVT_PROGRAM_CUDA_GRAPH else None
        self.staged = {}  # CUDA graphs: input name -> staging buffer (see _input)
        self.seen = {}    # CUDA graphs: input name -> the pointer it was first bound with

    def _draw_rng_step(self):
        """Segments with dropout sites (aten.native_dropout): the RNG step of this run, drawn from PyTorch's
        default (CPU) generator, so torch.manual_seed makes evt's masks reproducible and every run, and every
        segment, draws fresh ones. Under a CUDA-graph capture nothing is set (a captured value would repeat at
        every replay): the captured kernels read the step from the program's device word, which the program
        advances after each run on the device, and which cudagraphs "step" sets before every replay
        (Plan.draw_rng_steps, called by step_graphs' wrapper outside the capture)."""
        if self.path == "gpu" and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            return
        step = int(torch.randint(0, 2 ** 62, (1,)).item())
        if self.path == "interp":
            self.graph.set_rng_step(step)
        else:
            self.program.set_rng_step(step, torch.cuda.current_stream(self.device).cuda_stream)

    def run(self, env, draw_rng=True):
        """draw_rng=False: the caller drew this run's RNG step already (Plan.draw_rng_steps)."""
        if draw_rng and self.b.rng_sites and self.path in ("interp", "gpu"):
            self._draw_rng_step()
        if self.path == "interp":
            names = dict(self.input_names)
            res = self.graph.run([(i, self._layout(names[x], env[x]).contiguous()) for x, i in self.inputs],
                                 [(i, A.meta_val(m).dtype) for m, i in self.outputs])
            for (m, k), t in zip(self.out_index, res):
                env[m] = _with_meta_strides(self._logical(k, t), A.meta_val(m))
            STATS["interp_segment_runs"] += 1
        elif self.path == "gpu":
            self._run_gpu(env)
        elif self.path == "torch":
            for m in self.members:
                env[m] = _run_torch(m, env)
            STATS["torch_segment_runs"] += 1
            STATS["torch_nodes_run"] += len(self.members)
            return
        for m, src in self.aliases:
            env[m] = env[src]
        for m in self.torch_views:
            env[m] = _run_torch(m, env)

    def _layout(self, name, t):
        """An input as its declaration reads it: transposed (gemm_only_transposed) or in memory order
        (_physical) when declared so."""
        if name in self.b.transposed:
            return t.t()
        if name in self.phys_in:
            return t.permute(self.phys_in[name])
        return t

    def _logical(self, k, t):
        """Graph output k as the logical tensor (a view when it was written in memory order)."""
        o = self.phys_out.get(k)
        return t if o is None else t.permute([o.index(d) for d in range(len(o))])

    def _input(self, name, t):
        t = self._layout(name, t)
        if self.pool is None:
            return self._copied_input(name, t) if not G.bindable(t) else t
        # CUDA graphs: an input is bound as it is while its pointer stays the same (parameters); once it
        # changed (a new batch, an activation in another block), it is copied into a staging buffer of
        # its own from then on, as are inputs that need a conversion.
        if name not in self.staged and G.bindable(t):
            last = self.seen.setdefault(name, t.data_ptr())
            if last == t.data_ptr():
                return t
        buf = self.staged.get(name)
        if buf is None:
            buf = self.staged[name] = torch.empty(t.shape, dtype=G.device_dtype(t.dtype), device=t.device)
        buf.copy_(t)
        return buf

    def _copied_input(self, name, t):
        """to_device_layout of an input evt cannot bind as it is (strided, unaligned or another dtype): one
        copy per run, counted (STATS["input_copies"]) and logged once per segment input."""
        STATS["input_copies"] += 1
        logged = self.__dict__.setdefault("_copy_logged", set())
        if name not in logged:
            logged.add(name)
            log.info("  segment input %s %s %s strides %s copied for evt every run (strided, unaligned or "
                     "another dtype)", name, str(t.dtype).replace("torch.", ""), list(t.shape), list(t.stride()))
        return G.to_device_layout(t)

    def _prepare_fast(self):
        """What _run_fast needs per run, computed once: output shapes in evt's device dtype, and per FX
        output whether it needs a cast, a logical permute or PyTorch's recorded strides."""
        outs = [(self.out_types[k][0], G.device_dtype(self.out_types[k][1])) for k in range(len(self.out_types))]
        post = []
        for m, k in self.out_index:
            v = A.meta_val(m)
            cast = v.dtype if outs[k][1] != v.dtype else None
            # (the contiguous result's strides differ from the recorded dense ones: _with_meta_strides copies)
            keep = (m in self.free_layout or v.dim() <= 1 or not is_non_overlapping_and_dense(v)
                    or (k not in self.phys_out and v.stride() == torch.empty(v.shape, device="meta").stride()))
            post.append((m, k, cast, None if keep else v))
        layout = [(x, name, name in self.b.transposed or name in self.phys_in) for x, name in self.input_names]
        self._fast = (outs, post, layout)

    def _run_fast(self, env):
        """_run_gpu without CUDA graphs: the per-run work reduced to binding, allocating and launching (the
        host time of a segment run is on the step's critical path when the GPU is fast)."""
        outs, post, layout = self._fast
        dev = self.device
        ins = []
        for x, name, moved in layout:
            t = env[x]
            if moved:
                t = self._layout(name, t)
            if not (t.dtype in _BINDABLE_DTYPES and t.is_contiguous() and t.data_ptr() % 16 == 0):
                t = self._copied_input(name, t)
            ins.append((name, t))
        bufs = [torch.empty(shape, dtype=dt, device=dev) for shape, dt in outs]
        self.program.run(ins, bufs, torch.cuda.current_stream(dev).cuda_stream)
        STATS["gpu_segment_runs"] += 1
        STATS["gpu_launches"] += self.program.launch_count()
        for m, k, cast, strided in post:
            t = self._logical(k, bufs[k])
            if cast is not None:
                t = t.to(cast)
            env[m] = t if strided is None else _with_meta_strides(t, strided)

    def _run_gpu(self, env):
        if self.pool is None:
            if getattr(self, "_fast", None) is None:
                self._prepare_fast()
            return self._run_fast(env)
        dev = self.device
        ins = [(name, self._input(name, env[x])) for x, name in self.input_names]
        bufs, handed = [], []
        for k in range(len(self.out_types)):
            shape, dt = self.out_types[k]
            if self.pool is not None:
                buf, h = self.pool.get(k, shape, G.device_dtype(dt), dev)
            else:
                buf, h = torch.empty(shape, dtype=G.device_dtype(dt), device=dev), True
            bufs.append(buf)
            handed.append(h)
        before = self.program.captures
        self.program.run(ins, bufs, torch.cuda.current_stream(dev).cuda_stream)
        STATS["gpu_segment_runs"] += 1
        STATS["gpu_launches"] += self.program.launch_count()
        STATS["captures"] += self.program.captures - before
        vals = [G.OutputPool.hand_out(b_, h) if self.pool is not None else b_ for b_, h in zip(bufs, handed)]
        for m, k in self.out_index:
            v = A.meta_val(m)
            t = self._logical(k, vals[k])  # (written in memory order: the view has the recorded strides)
            if t.dtype != v.dtype:
                t = t.to(v.dtype)
            env[m] = t if m in self.free_layout else _with_meta_strides(t, v)


# dtypes evt binds as they are (gpu.device_dtype is the identity on them)
_BINDABLE_DTYPES = frozenset((torch.float32, torch.float16, torch.bfloat16, torch.bool, torch.int64))

# View ops whose result, when it is a view of a segment input needed outside the segment, PyTorch makes
# (Segment.torch_views) instead of evt writing a copy.
_VIEW_OPS = {aten.permute.default, aten.t.default, aten.transpose.int, aten.view.default, aten._unsafe_view.default,
             aten.reshape.default, aten.expand.default, aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims,
             aten.squeeze.default, aten.alias.default, aten.select.int, aten.slice.Tensor}

# Counters of what ran where since the last reset_stats() (read by the benchmark and the GPU tests).
STATS = collections.Counter()


def reset_stats():
    STATS.clear()


def release_programs():
    """Drops the cached GPU programs (their device memory goes with the plans that still hold them)."""
    _PROGRAMS.clear()


_PROGRAMS = {}  # (sha256 of the optimized text, flags, device) -> Program (not for CUDA graphs)


def _program_key(graph, flags, device):
    return (hashlib.sha256(graph.text().encode()).hexdigest(), flags, str(device))


def _program_for(graph, flags, device):
    text = graph.text()
    key = _program_key(graph, flags, device)
    p = _PROGRAMS.get(key) if not flags & G.EVT_PROGRAM_CUDA_GRAPH else None
    if p is None:
        with torch.cuda.device(device):
            p = G.Program(text, flags, f"evt-{key[0][:12]}.evt")
        log.info("  GPU program for evt-%s: %d kernel launches per run (flags %d)", key[0][:12],
                 p.launch_count(), flags)
        if not flags & G.EVT_PROGRAM_CUDA_GRAPH:
            _PROGRAMS[key] = p
    return p


def _with_meta_strides(t, v):
    """t (contiguous) laid out with the strides PyTorch recorded for it, when they describe a dense
    permutation (the backward relies on e.g. transposed gradients)."""
    if t.dim() > 1 and t.stride() != v.stride() and is_non_overlapping_and_dense(v):
        t = torch.empty_strided(t.shape, v.stride(), dtype=t.dtype, device=t.device).copy_(t)
    return t


def is_non_overlapping_and_dense(v):
    """True when v's strides describe a permutation of a contiguous layout (no zero or gapped strides)."""
    dims = sorted((st, sz) for st, sz in zip(v.stride(), v.shape) if sz != 1)
    expect = 1
    for st, sz in dims:
        if st != expect:
            return False
        expect *= sz
    return True


def _has_tensor(node):
    v = node.meta.get("val")
    vs = v if isinstance(v, (tuple, list)) else [v]
    return v is None or any(isinstance(t, torch.Tensor) for t in vs)


def _foreach_castable(node, x):
    """A hoisted cast that the multi-tensor copy may run: a plain dtype change of a contiguous tensor (no padded or
    channels-last output, no memory format, no other kwargs)."""
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
    """Runs hoisted casts (autocast's f32 -> bf16/f16 weight copies, HOISTED_CAST) as one torch._foreach_copy_ per
    (device, source dtype, target dtype) into fresh tensors: a multi-tensor kernel instead of one PyTorch kernel
    per tensor. On the H200 (bench/e2e/cast_bench.py, S20W9) BERT-large's 291 casts took 1.84 ms per step this way
    against 2.54 ms one by one, bitwise equal (a copy of the same bytes: 0.95 ms). A cast it cannot take, or a
    group the multi-tensor copy refuses, runs as before (_run_torch)."""
    groups = {}
    for n in nodes:
        x = env[n.args[0]]
        v = n.meta.get("val")
        if isinstance(v, torch.Tensor) and _foreach_castable(n, x):
            groups.setdefault((x.device, x.dtype, v.dtype), []).append((n, x))
        else:
            env[n] = _run_torch(n, env)
    for (_, _, dt), items in groups.items():
        outs = [torch.empty_like(x, dtype=dt) for _, x in items]
        try:
            torch._foreach_copy_(outs, [x for _, x in items])
        except RuntimeError as e:
            log.info("hoisted casts: the multi-tensor copy refused %d tensors (%s); one kernel each", len(items), e)
            outs = [_run_torch(n, env) for n, _ in items]
        for (n, _), o in zip(items, outs):
            env[n] = o


def _run_torch(node, env):
    args = torch.fx.node.map_arg(node.args, lambda n: env[n])
    kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: env[n])
    if node.meta.get("evt_pad_out"):
        out = cast_into_padded(args, kwargs)
        if out is not None:
            return out
    if node.meta.get("evt_pad_gemm"):
        return padded_gemm(node.target, args, kwargs, contiguous=node.meta["evt_pad_gemm"] == "contiguous")
    return node.target(*args, **kwargs)


def pad_gemm(node):
    """True when a PyTorch-run CUDA GEMM (mm / addmm) of 16-bit operands has M, K or N not a multiple of 8 and is
    large (UNALIGNED_MIN_NUMEL): cuBLAS then has only 2-byte-aligned kernels for it (a 30522-word vocabulary's
    logits and their gradients: 4.1 ms per GEMM at bert_large's size on the H200, where Inductor's padded GEMM
    takes 2.5 ms; S11W5), so padded_gemm runs it on zero-padded operands. EVT_PAD_GEMM=0 turns it off."""
    if node.target not in (aten.mm.default, aten.addmm.default):
        return False
    k = _GEMMS[node.target]
    if len(node.args) < k + 2 or not _on_cuda(node):
        return False
    a, b = (x.meta.get("val") if isinstance(x, torch.fx.Node) else None for x in node.args[k:k + 2])
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dim() == 2 and b.dim() == 2):
        return False
    if a.dtype not in (torch.bfloat16, torch.float16) or b.dtype != a.dtype:
        return False
    m, kk, n = a.shape[0], a.shape[1], b.shape[1]
    return bool((m % 8 or kk % 8 or n % 8) and max(m * kk, kk * n, m * n) >= UNALIGNED_MIN_NUMEL)


def _up8(d):
    return (d + 7) // 8 * 8


def pad_cast_output(node, in_torch, output):
    """True for a PyTorch cast (_to_copy to a 16-bit dtype, same device) of a 2-D value whose row length is not
    a multiple of 8, that only PyTorch steps read and the module does not return: cast_into_padded writes it
    into memory padded to 8 columns, and the padded GEMMs that read it (directly or transposed) use that
    memory as their operand instead of copying it into a padded one each (bert_large's logits gradient,
    [16384, 30522]: two 1-GB copies and fills per step, S12W4)."""
    if node.target not in _CASTS or not node.args or output in node.users:
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
    full = torch.empty((m, _up8(n)), dtype=dt, device=x.device)
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
    row-major tensor it views (a straight copy; padding the view itself copied it transposed: 3.3 ms for
    bert_large's [30522, 16384] logits gradient on the H200, S12W4)."""
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
    # Plan.__call__ empties the cache, as pooled buffers hold new values at the next run)
    _PAD_CACHE[key] = (weakref.ref(src), out)
    weakref.finalize(src, _PAD_CACHE.pop, key, None)
    return out


_PAD_CACHE = {}  # (data_ptr, dtype, shape, strides, rows, cols) -> (weakref to the source's base, padded copy)


def padded_gemm(target, args, kwargs, contiguous=True):
    """mm(a, b) / addmm(bias, a, b, beta=, alpha=) with M, K, N rounded up to multiples of 8 by zero padding
    (an operand is copied only when one of its dims grows; _pad2d), then the [M, N] result sliced out: made
    contiguous (the layout of PyTorch's own result) when `contiguous`, else the strided view of the padded
    result (no copy; for values that only PyTorch ops and segment inputs read, which take any strides).
    Exact: the padded rows / columns add zero products."""
    import torch.nn.functional as F
    k = _GEMMS[target]
    a, b = args[k], args[k + 1]
    m, kk, n = a.shape[0], a.shape[1], b.shape[1]
    mp, kp, np_ = _up8(m), _up8(kk), _up8(n)
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


class Plan:
    """The ordered steps of one FX module: Segments and PyTorch nodes."""

    def __init__(self, gm, force_torch, options=None, program_node_fallback=True, kind="module"):
        self.gm = gm
        self.kind = kind
        self.options = options or {}
        self.check = config.parse_options(self.options)["check"]
        self.program_node_fallback = program_node_fallback
        self.placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.output = next(n for n in gm.graph.nodes if n.op == "output")
        self.steps, self.fallbacks = [], []
        self.rng_by_caller = False  # dropout segments' RNG steps are drawn by the caller (draw_rng_steps)
        self.torch_permutes = []  # see contiguous_permute
        self.torch_moves = []     # data movement of PyTorch-made values (_DATA_MOVES), run by PyTorch
        self._torch_vals = set()  # nodes PyTorch computes as plan steps (not module inputs, not hoisted casts)
        self._deferred = []       # nodes placed after the segment being built (see _torch_step, _place)
        self._deferred_set = set()
        self._force_torch = force_torch
        self._seg_of = {}
        self._new_segment = False  # the next evt node starts a segment (after deferred steps were placed)
        hoisted = hoisted_casts(gm)
        self._foreach_casts = set(hoisted)  # (the leading hoisted casts run as one multi-tensor copy)
        for node in hoisted:
            self.steps.append(node)
            self.fallbacks.append((node, HOISTED_CAST))
        for node in gm.graph.nodes:
            if node.op != "call_function" or node in hoisted:
                continue
            self._place(node)
        self._flush_deferred()

    def _place(self, node):
        """Places one FX node: a PyTorch step, a PyTorch view or data move, or an evt node of the segment being
        built. An evt node that reads a deferred step (or a deferred evt node), or once a step was deferred a
        permute that reads nothing of the segment being built, is deferred too: the segment goes on with the
        other nodes (XML-CNN: the bias gradient's bf16 cast read the deferred long-row sum
        and ended the segment between the weight-gradient GEMM and its transposed f32 cast, which then bound
        the transposed GEMM result as a copied input: a 690 MB strided copy per step)."""
        seg_of, torch_vals = self._seg_of, self._torch_vals
        why = self._force_torch.get(node) or node.meta.get("evt_torch_why") or cuda_placement(node, self.options)
        if why is None and node.target in _CASTS and _on_cuda(node) and not config.all_gpu_ops(self.options) and \
                _tensor_args(node) and all(a in torch_vals for a in _tensor_args(node)) and _torch_bound(node, self.options):
            why = TORCH_CAST
        if why:
            self._torch_step(node)
            self.fallbacks.append((node, why))
            torch_vals.add(node)
            return
        if node.target in _DATA_MOVES and _on_cuda(node) and _tensor_args(node) and \
                all(a in torch_vals for a in _tensor_args(node)):
            # data movement of values PyTorch made (the attention's q/k/v gradients stacked, permuted and
            # flattened for the projection's backward): PyTorch, before the segment being built, which
            # then binds the result (in evt these are node-by-node copies in double)
            self._before_segment(node)
            self.torch_moves.append(node)
            torch_vals.add(node)
            return
        if (contiguous_permute(node) or contiguous_slice(node)) and \
                not isinstance(seg_of.get(node.args[0]), Segment) and node.args[0] not in self._deferred_set:
            # runs in PyTorch before the segment being built (it reads a value from before it), which then
            # binds the contiguous result: evt would copy the strided input and permute it again (a slice:
            # no visitor node; its group would run node by node)
            self._before_segment(node)
            self.torch_permutes.append(node)
            return
        src = node.args[0] if node.target is operator.getitem else None
        if src is not None and src in seg_of:
            seg = seg_of[src]
            try:
                seg.b.names[node] = A.translate(seg.b, node, set())
                seg.members.append(node)
                seg_of[node] = seg
                return
            except A.Unsupported:
                pass
        cur = self._open_segment()
        if self._reads_deferred(node):
            self._defer(node, self._place)
            return
        elif self._deferred and cur is not None and node.target in _PERMUTES and \
                not any(seg_of.get(a) is cur for a in node.all_input_nodes):
            # a permute that reads nothing of the segment being built goes with its readers, after the deferred
            # steps (XML-CNN's transposed weights would otherwise be made in the embedding's segment and
            # copied into the logits GEMM's segment as strided inputs, where a GEMM absorbs the permute)
            self._defer(node, self._place)
            return
        cur = cur or Segment(self.options)
        used = {u.args[1] for u in node.users if u.target is operator.getitem}
        snap = cur.b.snapshot()
        try:
            cur.b.names[node] = A.translate(cur.b, node, used)
        except (A.Unsupported, TypeError, ValueError, IndexError, KeyError, AttributeError) as e:
            cur.b.rollback(snap)
            self._torch_step(node)
            torch_vals.add(node)
            if src is None and _has_tensor(node):  # (size arithmetic on SymInts is not a fallback)
                self.fallbacks.append((node, str(e) or type(e).__name__))
            return
        cur.members.append(node)
        seg_of[node] = cur
        if not (self.steps and self.steps[-1] is cur):
            self.steps.append(cur)
            self._new_segment = False

    def _open_segment(self):
        """The segment being built (the last step, unless deferred steps were placed after it), or None."""
        last = self.steps[-1] if self.steps else None
        return last if isinstance(last, Segment) and not self._new_segment else None

    def _defer(self, node, place):
        """Places node later, with place(node), when the deferred nodes are placed (_flush_deferred)."""
        self._deferred.append((node, place))
        self._deferred_set.add(node)

    def _reads_deferred(self, node):
        return bool(self._deferred) and any(a in self._deferred_set for a in node.all_input_nodes)

    def _flush_deferred(self):
        """Ends the segment being built and places the deferred nodes in graph order (PyTorch steps, and evt
        nodes in a new segment after them; a node may be deferred again behind that one), until none is left."""
        while self._deferred:
            nodes = self._deferred
            self._deferred, self._deferred_set = [], set()
            self._new_segment = True
            for node, place in nodes:
                place(node)
        self._new_segment = True

    def _before_segment(self, node):
        """A PyTorch data move of PyTorch-made values: before the segment being built, or after it with the
        deferred steps when there are any."""
        if self._deferred:  # (after a deferred step: deferred too, so PyTorch's steps keep their order)
            self._defer(node, self._before_segment)
            return
        at = len(self.steps) - (1 if self._open_segment() is not None else 0)
        self.steps.insert(at, node)

    def _torch_step(self, node):
        """Adds a PyTorch step. A functional op that reads nothing of the segment being built runs before that
        segment, which then goes on (one segment where the op would have split it in two: XML-CNN's weight
        gradient, its f32 cast and its transpose stay one GEMM group although the bias gradient between them
        in graph order runs in PyTorch). A functional op that reads the segment is deferred: it runs after the
        segment, which goes on with the evt nodes that do not read a deferred step (those that do are deferred
        too and start a segment after it, _place); every PyTorch step after a deferred one is deferred too, so the PyTorch steps keep their order
        among themselves (random ops draw from PyTorch's generator in eager's order). XML-CNN's bias gradient
        (a long-row sum, PyTorch) read the loss gradient the segment made, and split the weight gradient GEMM
        from its transposed f32 cast, which then bound the transposed GEMM result as a copied input.
        EVT_DEFER_TORCH=0: such an op ends the segment at once (as before)."""
        cur = self._open_segment()
        schema = getattr(node.target, "_schema", None)
        functional = node.target is operator.getitem or (schema is not None and not schema.is_mutable)
        reads_cur = any(self._seg_of.get(a) is cur for a in node.all_input_nodes)
        if cur is not None and functional and not reads_cur and not self._deferred:
            self.steps.insert(len(self.steps) - 1, node)
        elif cur is not None and functional:
            self._defer(node, self._torch_step)
        else:
            self._flush_deferred()
            self.steps.append(node)

    def finalize(self):
        """Parses every segment (raises EvtError with the parser's message on a rejected statement)."""
        # The backward module's outputs are gradients for AccumulateGrad: on the GPU path they are returned
        # contiguous as evt wrote them, not copied into PyTorch's recorded strides (a weight gradient is
        # recorded transposed: the copy and AccumulateGrad's copy back to the parameter's layout are saved).
        # A channels-last gradient (the weight of a convolution in a channels-last model: the parameter has
        # those strides, and AccumulateGrad takes a gradient of the parameter's layout as it is) keeps its
        # recorded layout: evt writes it in memory order like the activations beside it (Segment._physical),
        # where a contiguous result kept its whole segment off the physical layout (resnet50: the 3x3 weight
        # gradients' casts share a segment with a ReLU backward, whose activations were then copied).
        # EVT_PHYSICAL_GRADS=0: every gradient returned contiguous, as before session 23.
        grads = set()
        if self.kind == "backward":
            grads = {n for n in _flat_nodes(self.output.args[0]) if _dense_order(A.meta_val(n)) is None}
        free = grads | {n for n in self.gm.graph.nodes if n.meta.get("evt_conv_input_free")}
        segs = [s for s in self.steps if isinstance(s, Segment)]
        for s in segs:
            s.free_layout = free
            s.finalize(lambda m: m.users, self.program_node_fallback, defer_program=True)
        # every GPU segment's kernels in one parallel JIT batch, then the programs (cache hits)
        gpu = [s for s in segs if s.path == "gpu" and getattr(s, "pending", None) is not None]
        texts = [s.graph.text() for s in gpu if _program_key(s.graph, G.program_flags(s.options), s.device)
                 not in _PROGRAMS]
        if texts and G.tune_configs(gpu[0].options) > 0:
            import time
            t0 = time.time()
            st, n, why = G.tune(texts, G.program_flags(gpu[0].options), G.tune_configs(gpu[0].options))
            msg = "  tune: %d GEMM problems of %d GPU segments in %.1f s%s" % (
                n, len(texts), time.time() - t0, "" if st == 0 else f" (not all tuned: {why})")
            if st == 0 or not G.tune_asked(gpu[0].options):
                log.info(msg)
            else:
                log.warning(msg)
        if len(texts) > 1:
            import time
            t0 = time.time()
            n = G.prefetch(texts, G.program_flags(gpu[0].options))
            log.info("  prefetch: %d kernels for %d GPU segments in %.1f s", n, len(texts), time.time() - t0)
        for s in segs:
            s.create_program()
            if s.path == "torch":
                for m in s.members:
                    self.fallbacks.append((m, s.why))
        # GEMMs left to PyTorch with unaligned dims run on padded operands (pad_gemm); a PyTorch cast that only
        # PyTorch steps read and that feeds such a GEMM writes its result padded (pad_cast_output)
        torch_nodes = [m for s in self.steps for m in (s.members if isinstance(s, Segment) and s.path == "torch"
                                                        else [] if isinstance(s, Segment) else [s])]
        for m in torch_nodes:
            if pad_gemm(m):  # (a result the module returns keeps PyTorch's contiguous layout)
                m.meta["evt_pad_gemm"] = "contiguous" if self.output in m.users else "view"
                log.info("  %s (%s): runs in PyTorch on operands zero-padded to multiples of 8", m.name, _op_name(m))
        in_torch = set(torch_nodes)
        for m in torch_nodes:
            if m.meta.get("evt_pad_gemm"):
                k = _GEMMS[m.target]
                for x in m.args[k:k + 2]:
                    while isinstance(x, torch.fx.Node) and x in in_torch and x.target in _PERMUTES:
                        x = x.args[0]
                    if isinstance(x, torch.fx.Node) and pad_cast_output(x, in_torch, self.output):
                        x.meta["evt_pad_out"] = True
                        log.info("  %s (%s): written into memory padded to 8 columns (the padded GEMMs read it "
                                 "without copying)", x.name, _op_name(x))
        # Liveness: each value is dropped from the environment after the last step that reads it.
        step_of = {}
        for i, s in enumerate(self.steps):
            for m in (s.members if isinstance(s, Segment) else [s]):
                step_of[m] = i
        last = {}
        for node in list(self.placeholders) + list(step_of):
            uses = [step_of.get(u, len(self.steps)) for u in node.users]
            last[node] = max(uses, default=step_of.get(node, -1))
        self.free_after = [[] for _ in self.steps]
        for node, i in last.items():
            if 0 <= i < len(self.steps):
                self.free_after[i].append(node)

    def rng_segments(self):
        """The segments that draw an RNG step each run (dropout sites run by evt: the interpreter or a GPU
        program)."""
        return [s for s in self.steps if isinstance(s, Segment) and s.b.rng_sites
                and (s.path == "interp" or (s.path == "gpu" and s.program is not None))]

    def draw_rng_steps(self):
        """Draws the dropout segments' RNG steps for the next call, in plan order, and from then on the segments
        leave the drawing to the caller (rng_by_caller). cudagraphs "step" calls this before each call of its
        step graph, outside any capture: a GPU program's step is a kernel on the current stream, where PyTorch's
        CUDA-graph trees then replay the graph, so the replayed kernels draw with it, and torch.manual_seed
        repeats the masks of the whole-step graph as it does those of the other modes. Segments of the same
        text share one GPU program (_program_for; BERT-large: the 24 layers' forward segments), which is set
        once: its runs in the call draw with that step, then the next ones (the program advances its device
        word after each run), so its masks still differ from run to run. __call__ draws the same way when the
        caller does not (at each program's first run of the call), so both draw the same masks (per-segment CUDA
        graphs never share a program: every segment draws there)."""
        self.rng_by_caller = True
        drawn = set()
        for s in self.rng_segments():
            if self._draws_now(s, drawn):
                s._draw_rng_step()

    @staticmethod
    def _draws_now(s, drawn):
        """Whether segment s draws its RNG step at this point of a call (drawn: the GPU programs drawn for so far in
        the call): an interpreter segment at every run, a GPU program at its first run of the call only."""
        if s.path != "gpu" or s.program is None:
            return True
        if id(s.program) in drawn:
            return False
        drawn.add(id(s.program))
        return True

    def __call__(self, args, consume=False):
        """consume=True (a boxed call): the plan takes the list over (clears it), so it can free each input
        after its last use."""
        env = dict(zip(self.placeholders, args))
        if consume:
            args.clear()
        _PAD_CACHE.clear()  # (see _pad2d)
        k = 0
        while k < len(self.steps) and self.steps[k] in self._foreach_casts:
            k += 1
        if k > 1:
            run_hoisted_casts(self.steps[:k], env)
            for i in range(k):
                for node in self.free_after[i]:
                    env.pop(node, None)
        else:
            k = 0
        drawn = set()  # the GPU programs this call drew an RNG step for (_draws_now)
        for i, s in enumerate(self.steps[k:], start=k):
            if isinstance(s, Segment):
                try:
                    s.run(env, draw_rng=not self.rng_by_caller and self._draws_now(s, drawn))
                    if self.check:
                        _check_segment(s, env)
                except Exception as e:  # noqa: BLE001 (never fail the step: PyTorch runs the segment)
                    log.warning("evt segment failed at run time on %s (%s: %s); running its %d nodes in PyTorch",
                                s.path, type(e).__name__, e, len(s.members))
                    if s.path == "gpu":  # (a GPU program that failed once is not tried again)
                        s.path, s.why = "torch", f"GPU program failed at run time: {e}"
                    for m in s.members:
                        env[m] = _run_torch(m, env)
            else:
                env[s] = _run_torch(s, env)
            for node in self.free_after[i]:
                env.pop(node, None)
        return list(torch.fx.node.map_arg(self.output.args[0], lambda n: env[n]))


def _check_segment(seg, env):
    """options["check"]: reruns the segment's nodes in PyTorch and logs every output that differs. Outputs that depend
    on a dropout of the segment are not compared (evt draws its own masks; logged once per segment)."""
    ref = dict(env)
    drawn = set()  # members that depend on one of the segment's dropouts
    for m in seg.members:
        ref[m] = _run_torch(m, ref)
        if getattr(m.target, "overloadpacket", None) is aten.native_dropout or any(a in drawn for a in m.all_input_nodes):
            drawn.add(m)
    skipped = [m.name for m, _ in seg.outputs if m in drawn]
    if skipped and not getattr(seg, "_check_skip_logged", False):
        seg._check_skip_logged = True
        log.info("evt check: %d output(s) not compared, they depend on evt's dropout masks: %s", len(skipped),
                 ", ".join(skipped[:8]))
    for m, _ in seg.outputs:
        if m in drawn:
            continue
        a, b = env[m], ref[m]
        if a.shape != b.shape or a.dtype != b.dtype:
            log.warning("evt check %s: %s %s vs PyTorch %s %s", m.name, a.dtype, tuple(a.shape), b.dtype, tuple(b.shape))
            continue
        if a.numel() and a.is_floating_point():
            diff = (a.double() - b.double()).abs().max().item()
            rel = diff / max(b.double().abs().max().item(), 1e-30)
            if diff > 1e-5 and rel > 1e-4:  # (both: values that cancel to ~0 are rounding noise)
                log.warning("evt check %s (%s): max abs error %.3g, relative %.3g", m.name, _op_name(m), diff, rel)
        elif a.numel() and not torch.equal(a, b):
            log.warning("evt check %s (%s): values differ", m.name, _op_name(m))


_NODE_IN_MSG = re.compile(r"node %([A-Za-z0-9_.]+)")


# A CUDA segment whose program creation names a node moves that node to PyTorch and the plan is rebuilt,
# at most this many times per module; later failures run their whole segment in PyTorch.
MAX_PROGRAM_REBUILDS = 16


def _flat_nodes(x):
    if isinstance(x, torch.fx.Node):
        return [x]
    if isinstance(x, (list, tuple)):
        return [n for y in x for n in _flat_nodes(y)]
    return []


def build_plan(gm, options=None, kind="module"):
    """A Plan for gm; nodes the evt parser (or the GPU program) rejects move to PyTorch one by one."""
    if kind in ("module", "inference"):
        mark_returned_log_softmax(gm)  # (a module without a backward returns every output to its caller)
    force = {}
    rebuilds = 0
    while True:
        plan = Plan(gm, force, options, program_node_fallback=rebuilds < MAX_PROGRAM_REBUILDS, kind=kind)
        try:
            plan.finalize()
            return plan
        except G.ProgramError as e:
            bad = getattr(e, "node", None)
            if bad is None or bad in force:  # (finalize only raises with a node; defensive)
                log.warning("evt could not build a plan (%s); running the module in PyTorch", e)
                return None
            force[bad] = f"evt GPU program: {e}"
            rebuilds += 1
        except EvtError as e:
            msg = str(e)
            m = _NODE_IN_MSG.search(msg)
            bad = None
            if m:
                for s in plan.steps:
                    if isinstance(s, Segment) and s.b.origin.get(m.group(1)) in s.members:
                        bad = s.b.origin[m.group(1)]
                        break
            if bad is None or bad in force:
                log.warning("evt could not build a plan (%s); running the module in PyTorch", msg)
                return None
            force[bad] = f"rejected by evt: {msg}"


def _symbolic(gm):
    for n in gm.graph.nodes:
        v = n.meta.get("val")
        if isinstance(v, torch.SymInt):
            return True
        if isinstance(v, torch.Tensor) and any(not isinstance(s, int) for s in v.shape):
            return True
    return False


def _log_plan(plan, kind):
    if log.isEnabledFor(logging.INFO):
        segs = [s for s in plan.steps if isinstance(s, Segment) and s.path != "torch"]
        n_evt = sum(len(s.members) for s in segs)
        where = collections.Counter(s.path for s in segs)
        log.info("%s: %d ops in %d evt segment(s) (%s), %d in PyTorch", kind, n_evt, len(segs),
                 ", ".join(f"{v} on {k}" for k, v in sorted(where.items())) or "none", len(plan.fallbacks))
        for node, why in plan.fallbacks:
            log.info("  fallback to PyTorch: %s (%s): %s", _op_name(node), node.name, why)
        if plan.torch_permutes:
            log.info("  %d permute(s) making a strided input contiguous run in PyTorch (views): %s",
                     len(plan.torch_permutes), ", ".join(n.name for n in plan.torch_permutes[:8]))


def _specialize(gm, args):
    """A copy of gm whose meta["val"] holds the concrete shapes of these arguments (FakeTensorProp)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    g2 = copy.deepcopy(gm)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fakes = [mode.from_tensor(a, static_shapes=True) if isinstance(a, torch.Tensor) else a for a in args]
    FakeTensorProp(g2, mode).propagate_dont_convert_inputs(*fakes)
    return g2


def compile_module(gm, example_inputs, kind="module", options=None):
    """fw/bw compiler: a boxed callable running gm through evt segments and PyTorch fallbacks.
    A module with symbolic shapes gets one plan per concrete argument signature, built at the first call
    with that signature (shapes re-derived with FakeTensorProp)."""
    if _symbolic(gm):
        plans = {}

        def run_dynamic(args):
            key = tuple((tuple(a.shape), a.dtype, tuple(a.stride())) if isinstance(a, torch.Tensor) else
                        (type(a).__name__, a) for a in args)
            plan = plans.get(key)
            if plan is None:
                try:
                    plan = build_plan(_specialize(gm, args), options, kind)
                except Exception as e:  # noqa: BLE001 (any failure to specialize: run the module as is)
                    log.warning("%s: could not specialize symbolic shapes (%s)", kind, e)
                    plan = None
                if plan is None:
                    plan = lambda a: gm(*a)  # noqa: E731
                    log.info("%s: runs in PyTorch", kind)
                else:
                    _log_plan(plan, f"{kind} (specialized to {[k[0] for k in key]})")
                plans[key] = plan
            return plan(args, consume=True) if isinstance(plan, Plan) else plan(args)
        run_dynamic._boxed_call = True
        return run_dynamic
    try:
        plan = build_plan(gm, options, kind)
    except Exception as e:  # noqa: BLE001 (a bug in the translation must not fail the user's step)
        log.warning("%s: evt failed to build a plan (%s: %s); the module runs in PyTorch", kind, type(e).__name__, e)
        plan = None
    if plan is None:
        log.info("%s: no plan: runs in PyTorch", kind)

        def run_gm(args):
            return gm(*args)
        run_gm._boxed_call = True
        return run_gm
    _log_plan(plan, kind)

    def run(args):
        return plan(args, consume=True)
    run._boxed_call = True
    run.plan = plan
    return run


def make_backend(options=None, n_dynamo_inputs=None):
    """aot_autograd with evt's decompositions, partition_fn and fw/bw compilers for these options
    (cudagraphs "step": the compilers of step_graphs, which need the Dynamo graph's input count)."""
    opts = config.parse_options(options)
    fw = lambda gm, ex: compile_module(gm, ex, "forward", opts)  # noqa: E731
    bw = lambda gm, ex: compile_module(gm, ex, "backward", opts)  # noqa: E731
    inference = lambda gm, ex: compile_module(gm, ex, "inference", opts)  # noqa: E731
    if opts["cudagraphs"] == "step" and n_dynamo_inputs is not None:
        fw, bw, inference = step_graphs(opts, n_dynamo_inputs)
    return aot_autograd(fw_compiler=fw, bw_compiler=bw, inference_compiler=inference,
                        partition_fn=lambda j, ji, **kw: partition_fn(j, ji, options=opts, **kw),
                        decompositions=DECOMPOSITIONS)


def step_graphs(opts, n_dynamo_inputs):
    """(forward, backward, inference) compilers of cudagraphs "step": compile_module's plan, replayed as one
    CUDA graph per module through PyTorch's CUDA-graph trees (torch._inductor.cudagraph_trees, the machinery
    of mode="reduce-overhead": warm-up run, capture into a private memory pool, replay; parameters and buffers
    are static inputs (a moved one re-records), other inputs are copied into the graph's buffers; outputs of
    a replay stay valid until the next forward). The Python glue, PyTorch's ops between segments and every
    evt launch leave the host path. A module PyTorch's checks refuse (CPU tensors, several devices, a mutated
    input that is no parameter or buffer, an op that cannot be captured) runs with per-segment graphs instead
    ("segments"), logged; so does its backward. A capture that raises logs a warning and the module runs
    without the step graph from then on."""
    from torch._dynamo.backends.cudagraphs import (find_input_mutations, get_device_index,
                                                   get_device_node_mapping, get_stack_traces)
    from torch._inductor.cudagraph_trees import cudagraphify_impl, get_manager
    from torch._inductor.cudagraph_utils import (check_multiple_devices_or_any_cpu_nodes,
                                                 get_placeholder_info)
    from torch._inductor.utils import count_tangents, get_first_incompatible_cudagraph_node, num_fw_fixed_arguments
    seg_opts = dict(opts, cudagraphs="segments")
    state = {"on": True, "device": None}

    def skip(gm, static):
        mutated = set(find_input_mutations(gm.graph)) - set(static)
        if mutated:
            return f"mutates input(s) {sorted(mutated)}, which are no parameters or buffers"
        why = check_multiple_devices_or_any_cpu_nodes(get_device_node_mapping(gm))
        if why:
            return why
        node = get_first_incompatible_cudagraph_node(gm)
        return f"op {node.name} cannot be captured" if node is not None else None

    def graphed(gm, ex, kind, static, backward, inference):
        why = skip(gm, static)
        if why:
            log.info("%s: no step CUDA graph (%s); per-segment CUDA graphs", kind, why)
            return None
        run = compile_module(gm, ex, kind, opts)

        def consume(args):  # (the trees' calling convention: the model takes its argument list over)
            a = list(args)
            args.clear()
            return run(a)  # (a Plan clears `a` in turn, freeing each input after its last use)
        state["device"] = get_device_index(gm)
        g = cudagraphify_impl(consume, ex, static, device_index=state["device"], is_backward=backward,
                              is_inference=inference, stack_traces=get_stack_traces(gm),
                              placeholders=get_placeholder_info(gm.graph),
                              mutated_input_idxs=tuple(find_input_mutations(gm.graph)))
        broken = []
        plan = getattr(run, "plan", None)
        draw = plan.draw_rng_steps if plan is not None and plan.rng_segments() else None

        def step(args):
            if draw is not None:  # (dropout: this step's masks, from PyTorch's generator; see Plan.draw_rng_steps)
                draw()
            if broken:
                return run(args)
            try:
                return g(list(args))
            except Exception as e:  # noqa: BLE001 (a capture that fails must not fail the user's step)
                log.warning("%s: the step CUDA graph failed (%s: %s); the module runs without it from now on",
                            kind, type(e).__name__, str(e)[:300])
                broken.append(e)
                return run(args)
        step._boxed_call = True
        step.plan = getattr(run, "plan", None)
        log.info("%s: replayed as one CUDA graph (PyTorch CUDA-graph trees; %d static inputs)", kind, len(static))
        return step

    def forward(gm, ex, inference=False):
        kind = "inference" if inference else "forward"
        ctx = torch._guards.TracingContext.try_get()
        if ctx is not None and ctx.fw_metadata is not None:  # (parameters and buffers, as Inductor's)
            static = list(ctx.fw_metadata.static_input_indices)
        else:
            static = list(range(num_fw_fixed_arguments(n_dynamo_inputs, len(ex))))
        out = graphed(gm, ex, kind, static, False, inference)
        if out is None:
            state["on"] = False
            out = compile_module(gm, ex, kind, seg_opts)
        return out

    def backward(gm, ex):
        if not state["on"]:
            return compile_module(gm, ex, "backward", seg_opts)
        out = graphed(gm, ex, "backward", list(range(count_tangents(gm))), True, False)
        if out is None:  # (the forward was captured: tell the trees its backward ran, as PyTorch's backend does)
            run = compile_module(gm, ex, "backward", seg_opts)
            dev = state["device"] if state["device"] is not None else 0

            def out(args):
                mgr = get_manager(dev, create_if_none_exists=False)
                if mgr is not None:
                    mgr.set_to_running_backward()
                return run(args)
            out._boxed_call = True
        return out

    return forward, backward, lambda gm, ex: forward(gm, ex, inference=True)


_DEFAULT = make_backend()


def evt_backend(gm, example_inputs, options=None, mode=None):
    """The "evt" backend: torch.compile(m, backend="evt", options={"cudagraphs": True, "fused": False}).
    `mode` is accepted and ignored (evt has one mode)."""
    if not options:
        return _DEFAULT(gm, example_inputs)
    return make_backend(options, len(example_inputs))(gm, example_inputs)
