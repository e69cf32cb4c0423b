"""Groups of a CUDA program that would run node by node in the reference library on large tensors.

The reference library (kernels/fallback/) runs a group the lowering refused one node at a time, holding values in
double: correct, but several times slower than PyTorch's kernels on large tensors (Hugging Face BERT's attention-mask
ops, casts and permutes took over 300 ms of a 400 ms step that way). The CUDA placement (placement.py) keeps the
ops it knows to be refused in PyTorch; this is the check after the fact: every FX node of such a group moves to
PyTorch and the plan is rebuilt (plan.build_plan), so no large op is left to the reference library silently.
"""
import logging
import re

from . import placement as P

log = logging.getLogger("evt")

# Node-by-node groups with a nucleus the library runs with a kernel of its own stay: cuDNN attention and
# convolutions, cuBLAS matrix products, gathers and scatters. Moving those moved their neighbours too and undid
# fusions around them (an edge-list GCN: its spmm pattern lost, 1.6x slower and 4x the memory on an H100). A
# batched product (bmm) moves: its operands and f32 result in double cost more than the product (HF BERT).
# (f32 attention, whose library kernel is the slow reference one, is placed in PyTorch already.)
LIBRARY_OPS = ("mm", "addmm", "sdpa", "conv", "embedding", "index_", "gather", "scatter", "spmm", "coo", "one_hot")
_SUFFIX = re.compile(r"\.\d+$")


class SlowGroups(Exception):
    """Raised by Plan._create_programs: nodes (FX node -> reason) whose groups would run node by node."""

    def __init__(self, nodes):
        super().__init__(f"{len(nodes)} node(s) of groups that would run node by node in the reference library")
        self.nodes = nodes


def is_slow(group):
    """True for a plan_report group that runs node by node on at least placement's large-tensor size."""
    if group["path"] != "node-by-node" or group.get("out_numel", 0) < P.UNALIGNED_MIN_NUMEL:
        return False
    return not any(op.startswith(LIBRARY_OPS) for op in group["ops"].split("+"))


def fx_node(origin, name):
    """The FX node an evt node name comes from: the name itself, else with its pass suffixes (".N") dropped."""
    while name not in origin and _SUFFIX.search(name):
        name = _SUFFIX.sub("", name)
    return origin.get(name)


def slow_nodes(segment, report):
    """FX node -> reason for every member of segment's slow groups (report: its program's evt_program_report)."""
    out = {}
    for group in (report or {}).get("groups", []):
        if not is_slow(group):
            continue
        why = re.sub(r"^group \d+: ", "", group["why"]).split(";")[0]
        reason = (f"its group would run node by node in evt's reference library on CUDA (in double, "
                  f"{group['out_numel']} elements: slower than PyTorch's kernels): {why}")
        nodes = [fx_node(segment.b.origin, name) for name in group["nodes"]]
        nodes = [n for n in nodes if n is not None and n in segment.members]
        if not nodes:  # (only nodes the graph passes made: nothing to move; said, not silent)
            log.warning("evt: group %d (%s, %s) runs node by node on CUDA: %s", group["group"], group["ops"],
                        group["nodes"][0], why)
        for node in nodes:
            out.setdefault(node, reason)
    return out
