"""Segmentation: the ordered steps of one FX module, each an evt segment or a PyTorch op.

Contract: Segmentation(gm, force_torch, options) places every call_function node in graph order: hoisted casts
first, then a PyTorch step (placement rules, nodes evt cannot translate, force_torch), a PyTorch data move or
view before the segment being built, or a member of an evt segment. PyTorch steps keep their relative order.
Whatever a translator or a placement rule raises makes its node a PyTorch step, the error its logged reason.
"""
import operator

import torch
import torch.fx

from . import aten as A
from . import config
from . import placement as P
from .segment import Segment


def _has_tensor(node):
    """True when node's value is (or may be) a tensor: an untranslated node without one (SymInt arithmetic) is no
    fallback worth logging."""
    v = node.meta.get("val")
    vs = v if isinstance(v, (tuple, list)) else [v]
    return v is None or any(isinstance(t, torch.Tensor) for t in vs)


def _size_arithmetic(node):
    """True for arithmetic on sizes (a module with symbolic shapes: `s0 * s1` for a view's shape), a pure Python
    operator or torch.sym_* function whose value is no tensor: like a functional op it need not end a segment."""
    fn = node.target
    pure = getattr(fn, "__module__", None) in ("_operator", "operator") or \
        getattr(fn, "__name__", "").startswith("sym_")
    return pure and not _has_tensor(node)


def _reason(e):
    """The logged reason of a translation error: Unsupported's own message, else the exception's type and message."""
    if isinstance(e, A.Unsupported):
        return str(e) or "unsupported"
    return f"translation failed: {type(e).__name__}: {e}"


class Segmentation:
    """The steps of one FX module in order: Segments and PyTorch nodes (see the module contract)."""

    def __init__(self, gm, force_torch, options=None, cut_before=frozenset()):
        """cut_before: evt nodes that start a new segment (memory_cuts)."""
        self.options = options or {}
        self._cut_before = cut_before
        self.steps, self.fallbacks = [], []  # fallbacks: (node, why it runs in PyTorch)
        self.torch_permutes = []  # views PyTorch makes before a segment (placement.contiguous_permute / _slice)
        self.torch_moves = []     # data movement of PyTorch-made values (placement.DATA_MOVES), run by PyTorch
        self._torch_vals = set()  # nodes PyTorch computes as plan steps (not module inputs, not hoisted casts)
        self._deferred = []       # nodes placed after the segment being built (see _torch_step, _place)
        self._deferred_set = set()
        self._force_torch = force_torch
        self._seg_of = {}
        self._new_segment = False  # the next evt node starts a segment (after deferred steps were placed)
        hoisted = P.hoisted_casts(gm)
        self.hoisted = set(hoisted)  # (run as one multi-tensor copy at the start: torch_steps.run_hoisted_casts)
        for node in hoisted:
            self.steps.append(node)
            self.fallbacks.append((node, P.HOISTED_CAST))
        for node in gm.graph.nodes:
            if node.op != "call_function" or node in self.hoisted:
                continue
            self._place(node)
        self._flush_deferred()

    def _place(self, node):
        """Places one FX node: a PyTorch step, a PyTorch view or data move, or an evt node of the segment being
        built. An evt node that reads a deferred step (or a deferred evt node), or once a step was deferred a
        permute that reads nothing of the segment being built, is deferred too: the segment goes on with the
        other nodes (XML-CNN: the bias gradient's bf16 cast reads the deferred long-row sum; ending the segment
        there would split the weight-gradient GEMM from its transposed f32 cast, which would then bind the
        transposed GEMM result as a copied input)."""
        seg_of, torch_vals = self._seg_of, self._torch_vals
        why = self._torch_why(node)
        if why:
            self._torch_step(node)
            self.fallbacks.append((node, why))
            torch_vals.add(node)
            return
        if node.target in P.DATA_MOVES and P.on_cuda(node) and P.tensor_args(node) and \
                all(a in torch_vals for a in P.tensor_args(node)):
            # data movement of values PyTorch made (the attention's q/k/v gradients stacked, permuted and
            # flattened for the projection's backward): PyTorch, before the segment being built, which
            # then binds the result (in evt these are node-by-node copies in double)
            self._before_segment(node)
            self.torch_moves.append(node)
            torch_vals.add(node)
            return
        if (P.contiguous_permute(node) or P.contiguous_slice(node)) and \
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
            snap = seg.b.snapshot()
            try:
                seg.b.names[node] = A.translate(seg.b, node, set())
                seg.members.append(node)
                seg_of[node] = seg
                return
            except Exception:  # noqa: BLE001 (placed below like any other node)
                seg.b.rollback(snap)
        if node in self._cut_before:
            self._flush_deferred()
        cur = self._open_segment()
        if self._reads_deferred(node):
            self._defer(node, self._place)
            return
        elif self._deferred and cur is not None and node.target in P.PERMUTES and \
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
        except Exception as e:  # noqa: BLE001 (whatever a translator raises: the node runs in PyTorch, logged)
            cur.b.rollback(snap)
            self._torch_step(node)
            torch_vals.add(node)
            if src is None and _has_tensor(node):  # (size arithmetic on SymInts is not a fallback)
                self.fallbacks.append((node, _reason(e)))
            return
        cur.members.append(node)
        seg_of[node] = cur
        if not (self.steps and self.steps[-1] is cur):
            self.steps.append(cur)
            self._new_segment = False

    def _torch_why(self, node):
        """Why node runs in PyTorch before any translation (forced, marked by a rewrite, a placement rule), or None.
        A placement rule that raises puts the node in PyTorch with the error as the reason."""
        try:
            why = self._force_torch.get(node) or node.meta.get("evt_torch_why") or \
                P.cuda_placement(node, self.options)
            if why is None and node.target in P.CASTS and P.on_cuda(node) and \
                    not config.all_gpu_ops(self.options) and P.tensor_args(node) and \
                    all(a in self._torch_vals for a in P.tensor_args(node)) and P.torch_bound(node, self.options):
                why = P.TORCH_CAST
            return why
        except Exception as e:  # noqa: BLE001
            return f"placement failed: {type(e).__name__}: {e}"

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
        too and start a segment after it, _place); every PyTorch step after a deferred one is deferred too, so
        the PyTorch steps keep their order among themselves (random ops draw from PyTorch's generator in eager's
        order). An op that is not functional ends the segment."""
        cur = self._open_segment()
        schema = getattr(node.target, "_schema", None)
        functional = node.target is operator.getitem or (schema is not None and not schema.is_mutable) or \
            _size_arithmetic(node)
        reads_cur = any(self._seg_of.get(a) is cur for a in node.all_input_nodes)
        if cur is not None and functional and not reads_cur and not self._deferred:
            self.steps.insert(len(self.steps) - 1, node)
        elif cur is not None and functional:
            self._defer(node, self._torch_step)
        else:
            self._flush_deferred()
            self.steps.append(node)
