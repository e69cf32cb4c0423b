"""What the backward keeps from the forward: the bytes of the tensors the forward saves for the backward, as evt's
partition chooses them (its joint-graph rewrites, CUDA placement rules) and as torch.compile's default partitioner
(min-cut rematerialization over Inductor's decompositions) chooses them, for one workload at its real size.

    python3 bench/e2e/saved_bytes.py --workloads mlp,xmlcnn_paper        # on the CPU, no GPU needed
    python3 bench/e2e/saved_bytes.py --workloads bert_large --scale 0.25 --top 12

Nothing is executed: each partition function is called once while torch.compile traces the first call (fake
tensors), its forward's saved outputs are recorded, and the compile is abandoned. The trace runs on the CPU under
CPU bf16 autocast (the CUDA placement rules simulated for evt), which may cast a few ops differently from CUDA
autocast. Prints per workload and partitioner: saved MiB by dtype and the largest saved tensors. Views of one value
count once (as the value they view); parameters and their bf16 copies count like any other saved value.
"""
import argparse
import collections
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"))
import models  # noqa: E402


class _Recorded(Exception):
    """Raised from the partition function once the saved values are recorded: the compile stops there."""


_VIEWS = {"view", "_unsafe_view", "alias", "unsqueeze", "squeeze", "permute", "t", "transpose", "expand", "slice",
          "select", "detach"}


def _storage_root(node):
    """The node whose memory node views (through view ops), or node itself."""
    while isinstance(node, torch.fx.Node) and node.op == "call_function" and node.args and \
            getattr(node.target, "__name__", "").split(".")[0] in _VIEWS and isinstance(node.args[0], torch.fx.Node):
        node = node.args[0]
    return node


def _saved(fw, num_fwd_outputs):
    """[(name, shape, dtype, bytes)] of the forward module's outputs after the first num_fwd_outputs, one row per
    memory: views of one value count once, as the value they view."""
    out = next(n for n in fw.graph.nodes if n.op == "output").args[0]
    rows, seen = [], set()
    for o in list(out)[num_fwd_outputs:]:
        root = _storage_root(o) if isinstance(o, torch.fx.Node) else None
        v = root.meta.get("val") if root is not None else None
        if isinstance(v, torch.Tensor) and root not in seen:
            seen.add(root)
            rows.append((root.name, tuple(v.shape), str(v.dtype).replace("torch.", ""), v.numel() * v.element_size()))
    return rows


def _recording(partition):
    """A partition function that records its forward's saved values, then stops the compile."""
    got = {}

    def fn(joint, joint_inputs, **kw):
        fw, _ = partition(joint, joint_inputs, **kw)
        got["rows"] = _saved(fw, kw.get("num_fwd_outputs", 1))
        raise _Recorded()
    return fn, got


def _inductor_backend(partition):
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor.decomposition import select_decomp_table
    return aot_autograd(fw_compiler=lambda gm, ex: gm, bw_compiler=lambda gm, ex: gm,
                        partition_fn=partition, decompositions=select_decomp_table())


def measure(workload, scale, which):
    """Saved rows of one workload under 'evt' or 'torch.compile'."""
    torch.manual_seed(0)
    model, args, _ = models.make(workload, device="cpu", scale=scale)
    return measure_model(model, args, which, workload)


def measure_model(model, args, which, name="model"):
    """Saved rows [(name, shape, dtype, bytes)] of model(*args) (a scalar loss) under 'evt' or 'torch.compile'."""
    torch._dynamo.reset()
    if which == "evt":
        import evt.backend as B
        import evt.config as C
        saved_fn, saved_rules = B.partition_fn, C.SIMULATE_CUDA_RULES
        C.SIMULATE_CUDA_RULES = True
        fn, got = _recording(lambda j, ji, **kw: saved_fn(j, ji, options={}, **kw))
        B.partition_fn = lambda j, ji, options=None, **kw: fn(j, ji, **kw)
        backend = B.make_backend({})
    else:
        from torch._functorch.partitioners import min_cut_rematerialization_partition
        fn, got = _recording(min_cut_rematerialization_partition)
        backend = _inductor_backend(fn)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            torch.compile(model, backend=backend)(*args)
    except Exception as e:  # noqa: BLE001 (the recording stops the compile by raising)
        if "rows" not in got:
            raise RuntimeError(f"{name} / {which}: no partition recorded ({type(e).__name__}: {e})") from e
    finally:
        if which == "evt":
            B.partition_fn, C.SIMULATE_CUDA_RULES = saved_fn, saved_rules
    return got["rows"]


def report(workload, scale, rows_by, top):
    print(f"\n#### {workload} (scale {scale:g}): saved for the backward, MiB\n")
    dtypes = sorted({r[2] for rows in rows_by.values() for r in rows})
    print("| partition | " + " | ".join(dtypes) + " | total | tensors |")
    print("|---|" + "---:|" * (len(dtypes) + 2))
    for which, rows in rows_by.items():
        by = collections.Counter()
        for r in rows:
            by[r[2]] += r[3]
        cells = [f"{by[d] / 2**20:.1f}" for d in dtypes]
        print(f"| {which} | " + " | ".join(cells) + f" | {sum(by.values()) / 2**20:.1f} | {len(rows)} |")
    for which, rows in rows_by.items():
        print(f"\n{which}, largest: " + ", ".join(f"{n} {list(s)} {d} {b / 2**20:.0f}"
                                               for n, s, d, b in sorted(rows, key=lambda r: -r[3])[:top]))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="mlp,xmlcnn_paper")
    ap.add_argument("--scale", type=float, default=1.0, help="batch scale (models.make)")
    ap.add_argument("--top", type=int, default=8, help="largest saved tensors listed per partition")
    a = ap.parse_args()
    for w in a.workloads.split(","):
        rows_by = {which: measure(w, a.scale, which) for which in ("evt", "torch.compile")}
        report(w, a.scale, rows_by, a.top)


if __name__ == "__main__":
    main()
