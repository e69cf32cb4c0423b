"""Where evt's device memory outside PyTorch's caching allocator comes from, for one zoo model (zoo.py) on CUDA:
one evt training step (compile included) and a few timed steps, with gpu.Program creation, each program's first
run, gpu.tune and gpu.prefetch wrapped by the device memory in use outside PyTorch's pool (mem_get_info minus
memory_reserved, after a synchronize). Prints one table: calls and MiB per phase, the programs created and run,
and the arenas summed over the programs (these come from PyTorch's pool at each run).

    python3 bench/e2e/program_memory.py --model hf_llama_gqa
"""
import argparse
import collections
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"))


def outside_mib(torch):
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return (total - free - torch.cuda.memory_reserved()) / 2**20


def instrument(torch, G):
    """Wraps the program API; returns (MiB by phase, calls by phase, arena MiB of each program at its first run)."""
    mib, calls, arenas, seen = collections.Counter(), collections.Counter(), [], set()

    def wrap(owner, attr, phase, once_per_object=False):
        orig = getattr(owner, attr)

        def wrapped(*a, **k):
            if once_per_object:
                if id(a[0]) in seen:
                    return orig(*a, **k)
                seen.add(id(a[0]))
            before = outside_mib(torch)
            out = orig(*a, **k)
            mib[phase] += outside_mib(torch) - before
            calls[phase] += 1
            if once_per_object:
                arenas.append(int(G.L.lib().evt_program_arena_bytes(a[0]._p)) / 2**20)
            return out
        setattr(owner, attr, wrapped)
    wrap(G.Program, "__init__", "program creation")
    wrap(G.Program, "run", "first run of a program", once_per_object=True)
    wrap(G, "tune", "tuning")
    wrap(G, "prefetch", "kernel prefetch")
    return mib, calls, arenas


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="hf_llama_gqa")
    ap.add_argument("--iters", type=int, default=5)
    a = ap.parse_args()
    import torch
    import run as R
    import zoo
    from evt import gpu as G
    mib, calls, arenas = instrument(torch, G)
    torch.manual_seed(0)
    work = zoo.make(a.model, "bench")
    model = work.model.cuda().train()
    torch.manual_seed(1)
    args = work.inputs("cuda")
    start = outside_mib(torch)
    step = R._step_fn(torch.compile(model, backend="evt"), args, work.amp, model.parameters())
    t0 = time.time()
    step()
    first_s = time.time() - t0
    after_first = outside_mib(torch)
    ms = statistics.median(R._time_steps(step, 2, a.iters))
    end = outside_mib(torch)
    print(f"{a.model} on {torch.cuda.get_device_name()}: first step {first_s:.1f} s, {ms:.2f} ms/step; "
          f"peak allocated {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
    print("\n| where | calls | MiB outside PyTorch's pool |\n|---|---:|---:|")
    for phase in ("program creation", "first run of a program", "tuning", "kernel prefetch"):
        print(f"| {phase} | {calls[phase]} | {mib[phase]:,.0f} |")
    print(f"| outside the pool: before / after the first step / after the timed steps | | "
          f"{start:,.0f} / {after_first:,.0f} / {end:,.0f} |")
    print(f"\nprograms created {calls['program creation']}, run {len(arenas)}; their arenas (from PyTorch's pool "
          f"at each run) sum to {sum(arenas):,.0f} MiB")


if __name__ == "__main__":
    main()
