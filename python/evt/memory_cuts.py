"""Memory cuts: where a backward segment ends early so that the forward's saved tensors are released as it goes.

Contract: plan_cuts(segments, min_bytes) returns [(cut node, nodes to move before it)] for the segments under the
CUDA rules; apply(cuts) reorders the graph so, and the cut nodes then start new segments (Segmentation's
cut_before). A GPU program holds every input until it ends and has every output allocated before it starts; a
backward run as one large program (an MLP's: every layer in one segment) therefore holds all saved activations and
all weight gradients at once, where PyTorch's own backward frees each saved tensor after its last use.

A cut before member i splits the segment into the members that can run before it and the rest. Those before it
are the members before i and every later member that is no GEMM, reads a member, and reads only members that
are before the cut and values the graph has made by then (_available): moved before the cut, an epilogue op (the
GELU backward of a GEMM before the cut, a layer norm's backward and its bias-gradient sums) stays with its
producer. So a value crosses a cut only as a GEMM operand or into an op that also reads a value made after the
cut (a residual add in a later GEMM's epilogue): it is in memory either way, and the cut splits no fused kernel.
A cut is made where the inputs whose readers are all before it, and that nothing after the segment reads, hold at
least min_bytes since the previous cut (the plan frees them between the programs: Plan._liveness).

Only segments under the CUDA rules are cut (the CPU interpreter has no arena to plan). The same text on both sides
of a cut in repeated layers gives the programs one compile (segment._program_for).
"""
import bisect

import torch

from . import placement as P

MAX_PROGRAMS = 16  # the cut threshold rises so that one segment becomes at most this many programs


def _nbytes(node):
    v = node.meta.get("val") if node is not None else None
    return v.numel() * v.element_size() if isinstance(v, torch.Tensor) else 0


def _root(x):
    """The node whose memory x views (through view ops), or x."""
    while x.op == "call_function" and x.target in P.VIEW_OPS and x.args and isinstance(x.args[0], torch.fx.Node):
        x = x.args[0]
    return x


def _view_closure_readers(root):
    """The non-view readers of root's memory (through chains of views)."""
    out, todo = [], [root]
    while todo:
        x = todo.pop()
        for u in x.users:
            (todo if u.target in P.VIEW_OPS else out).append(u)
    return out


def _movable(m):
    """An op that may run before a cut placed ahead of it: no GEMM, and no view a GEMM reads (the GEMM takes it as
    its operand's layout, with the GEMM)."""
    if m.target in P.GEMMS:
        return False
    return not (m.target in P.VIEW_OPS and any(u.target in P.GEMMS for u in m.users))


def _available(members, pos):
    """avail[k]: the first cut position i at which member k can run before the cut (k + 1 unless it can move)."""
    order = {n: k for k, n in enumerate(members[0].graph.nodes)}
    placed = [order[m] for m in members]
    avail = []
    for k, m in enumerate(members):
        inside = [avail[pos[w]] for w in m.all_input_nodes if w in pos]
        if not inside or not _movable(m):
            avail.append(k + 1)
            continue
        outside = [order[x] for x in m.all_input_nodes if x not in pos]
        made = bisect.bisect_right(placed, max(outside)) if outside else 0  # (the graph has made them by then)
        avail.append(max(inside + [made]))
    return avail


def _releases(members, pos, avail):
    """[(cut position from which it is free, bytes)] for the memories the segment reads from outside that no node
    outside it reads."""
    roots = {}
    for m in members:
        for x in m.all_input_nodes:
            if x not in pos:
                r = _root(x)
                if r not in pos:
                    roots[r] = None
    out = []
    for r in roots:
        readers = _view_closure_readers(r)
        if r.op == "get_attr" or not readers or any(u not in pos for u in readers):
            continue
        out.append((max(avail[pos[u]] for u in readers), _nbytes(r)))
    return out


def segment_cuts(members, min_bytes):
    """[(cut member, members moved before it)] for one segment's members in order."""
    pos = {m: k for k, m in enumerate(members)}
    avail = _available(members, pos)
    releases = _releases(members, pos, avail)
    total = sum(b for _, b in releases)
    need = max(min_bytes, total // MAX_PROGRAMS)
    if need <= 0 or total < 2 * need:
        return []
    freed_at = [0] * (len(members) + 1)
    for at, b in releases:
        freed_at[at] += b
    cuts, since, moved = [], freed_at[0], set()
    for i in range(1, len(members)):
        since += freed_at[i]
        if since < need or avail[i] <= i or members[i] in moved:  # (a member that runs earlier starts no segment)
            continue
        ahead = [m for m in members[i + 1:] if avail[pos[m]] <= i and m not in moved]
        cuts.append((members[i], ahead))
        moved.update(ahead)
        since = 0
    return cuts


def plan_cuts(segments, min_bytes):
    """The cuts of every segment under the CUDA rules (see the module contract); min_bytes <= 0: none."""
    if min_bytes <= 0:
        return []
    cuts = []
    for s in segments:
        if s.b.device is not None and P.cuda_rules(s.b.device) and len(s.members) > 1:
            cuts.extend(segment_cuts(s.members, min_bytes))
    return cuts


def apply(cuts):
    """Moves each cut's nodes before it in the graph (their order kept); returns the set of cut nodes."""
    for cut, ahead in cuts:
        for m in ahead:
            cut.prepend(m)
    return {cut for cut, _ in cuts}


def describe(members, cuts):
    """One log line: the programs a segment became."""
    k = sum(1 for m in members if m in cuts)
    return f"a backward segment of {len(members)} nodes runs as {k + 1} segments (memory cuts before " + \
        ", ".join(m.name for m in members if m in cuts) + ")"
