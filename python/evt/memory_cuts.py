"""Memory cuts: where a backward segment ends early so that the forward's saved tensors are released as it goes.

Contract: memory_cuts(segments, min_bytes) returns the member nodes that start a new segment. A GPU program holds
every input until it ends and has every output allocated before it starts; a backward run as one large program
(the MLP: one segment of every layer) therefore holds all saved activations and all weight gradients at once,
where PyTorch's own backward frees each saved tensor after its last use. A cut is made before member i when

- the segment's inputs whose last reader precedes i, and that nothing after the segment reads, hold at least
  min_bytes since the previous cut (the plan frees them between the two programs: Plan._liveness), and
- no value made before i is read from i on by an op that would share its kernel (_allowed): readers from i on
  read it as a GEMM operand, or are row reductions of a GEMM epilogue's value, or also read a value made from i
  on (a later kernel's epilogue), so the value is in memory either way and the cut costs no fusion.

Only segments under the CUDA rules are cut (the CPU interpreter has no arena to plan). The same text on both sides
of a cut in repeated layers gives the programs one compile (segment._program_for).
"""
import torch

from . import aten as A  # noqa: F401 (registers evt::layer_norm_backward, a ROW_OPS member)
from . import placement as P

MAX_PROGRAMS = 16  # the cut threshold rises so that one segment becomes at most this many programs

aten = torch.ops.aten
# ops that reduce whole rows, which evt runs as row kernels. In part only for a layer norm's backward: its dY * gamma
# and beta-gradient sum join the previous GEMM's epilogue, so a cut before it costs two pointwise kernels (pytorch.md)
ROW_OPS = {aten.native_layer_norm.default, aten.native_layer_norm_backward.default, aten._softmax.default,
           aten._softmax_backward_data.default, aten._log_softmax.default, aten._log_softmax_backward_data.default,
           torch.ops.evt.layer_norm_backward.default}


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


def _release_positions(members, pos):
    """{root: (position of its last reader, bytes)} for the memories the segment reads from outside that no node
    outside it reads."""
    inside = set(members)
    roots = {}
    for m in members:
        for x in m.all_input_nodes:
            if x not in inside:
                r = _root(x)
                if r not in inside and r not in roots:
                    roots[r] = None
    out = {}
    for r in roots:
        readers = _view_closure_readers(r)
        if r.op == "get_attr" or not readers or any(u not in inside for u in readers):
            continue
        out[r] = (max(pos[u] for u in readers), _nbytes(r))
    return out


def _gemm_read(u, inside):
    """True when member u reads its input as a GEMM operand: a GEMM, or a view whose readers all do."""
    if u.target in P.GEMMS:
        return True
    return u.target in P.VIEW_OPS and bool(u.users) and all(w in inside and _gemm_read(w, inside) for w in u.users)


def _from_gemm(v, inside):
    """True when member v is computed from a GEMM of the segment through ops that are no row reductions: a GEMM
    epilogue's value, which a row-wide reader (ROW_OPS) never joins (it is written out either way)."""
    todo, seen = [v], set()
    while todo:
        x = todo.pop()
        if x in seen or x not in inside or x.target in ROW_OPS:
            continue
        if x.target in P.GEMMS:
            return True
        seen.add(x)
        todo.extend(x.all_input_nodes)
    return False


def _free_crossing(v, u, inside):
    """True when a cut between member v and its reader u costs no fusion: u reads v as a GEMM operand, or u is a
    row-wide op reading a GEMM epilogue's value."""
    return _gemm_read(u, inside) or (u.target in ROW_OPS and _from_gemm(v, inside))


def _allowed(members, pos, inside):
    """allowed[i]: a cut before member i separates no value from a reader that would share its kernel. A reader that
    also reads a member made later than the cut is in a later kernel anyway (the epilogue of a later GEMM: the
    residual add beside the GEMM's output); any reader of a tuple or a view stays with it."""
    n = len(members)
    diff = [0] * (n + 2)
    for v in members:
        plain = isinstance(v.meta.get("val"), torch.Tensor) and v.target not in P.VIEW_OPS
        for u in v.users:
            if u not in inside or (plain and _free_crossing(v, u, inside)):
                continue
            start = pos[v] + 1
            if plain:
                start = max([start] + [pos[w] + 1 for w in u.all_input_nodes if w in inside and w is not v])
            if start <= pos[u]:
                diff[start] += 1
                diff[pos[u] + 1] -= 1
    out, depth = [], 0
    for i in range(n):
        depth += diff[i]
        out.append(depth == 0)
    return out


def segment_cuts(members, min_bytes):
    """The members of one segment (in order) that start a new segment."""
    pos = {m: i for i, m in enumerate(members)}
    releases = _release_positions(members, pos)
    total = sum(b for _, b in releases.values())
    need = max(min_bytes, total // MAX_PROGRAMS)
    if need <= 0 or total < 2 * need:
        return []
    freed_at = [0] * len(members)
    for last, b in releases.values():
        freed_at[last] += b
    allowed = _allowed(members, pos, set(members))
    cuts, since = [], 0
    for i in range(1, len(members)):
        since += freed_at[i - 1]
        if since >= need and allowed[i]:
            cuts.append(members[i])
            since = 0
    return cuts


def memory_cuts(segments, min_bytes):
    """The member nodes that start a new segment, over every segment under the CUDA rules (see the module
    contract); min_bytes <= 0: none."""
    if min_bytes <= 0:
        return set()
    cuts = set()
    for s in segments:
        if s.b.device is not None and P.cuda_rules(s.b.device) and len(s.members) > 1:
            cuts.update(segment_cuts(s.members, min_bytes))
    return cuts


def describe(members, cuts):
    """One log line: the programs a segment became."""
    k = sum(1 for m in members if m in cuts)
    return f"a backward segment of {len(members)} nodes runs as {k + 1} GPU programs (memory cuts before " + \
        ", ".join(m.name for m in members if m in cuts) + ")"
