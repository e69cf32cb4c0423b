"""DistributedDataParallel and FSDP2 around a model compiled with backend="evt", against single-process eager
training on the full batch.

    python distributed_train.py --mode ddp|fsdp2 [--backend gloo|nccl] [--world 2] [--steps 3]

launches --world processes of this script (one per rank, like torchrun: a free TCP port on 127.0.0.1; gloo on
CPU tensors, nccl on one GPU per rank) and prints one JSON line per rank. Each rank builds TinyLM from the same
seed, wraps a copy (DDP, or fully_shard on the block and the root) and compiles the wrapper with
torch.compile(..., backend="evt"); at every SGD step it trains on its slice of the batch, every rank keeps an
eager copy trained on the whole batch, and the rank reports the relative errors of the loss (averaged over the
ranks) and of every gradient (the full tensor of a sharded one) against that copy, the weights' errors after the
steps, evt.STATS and the ops evt logged as run in PyTorch. test_training_loop.py (gloo) and
tests/gpu/torch_distributed_gpu.py (nccl) launch it and check the reports. The mean loss over equal slices is the
full batch's mean, and DDP and FSDP2 average the gradients over the ranks, so both must equal the full-batch ones.
"""
import argparse
import copy
import faulthandler
import json
import logging
import os
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"))
sys.path.insert(0, HERE)

ROWS_PER_RANK, SEQ = 2, 8


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(mode, backend="gloo", world=2, steps=3, timeout=300):
    """Runs the world ranks as processes of this script; returns their reports (a list of dicts, by rank).
    Raises RuntimeError with the failing rank's output if one fails or runs past timeout seconds (a rank prints
    its threads' stacks shortly before that: a hung collective shows where)."""
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory(prefix="evt-dist-") as tmp:
        logs = [open(os.path.join(tmp, f"rank{r}.log"), "w+") for r in range(world)]
        procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--mode", mode, "--backend", backend,
                                   "--world", str(world), "--steps", str(steps), "--rank", str(r), "--port", str(port),
                                   "--stacks-after", str(max(timeout - 15, 1))],
                                  stdout=logs[r], stderr=subprocess.STDOUT, text=True, env=env)
                 for r in range(world)]
        deadline = time.monotonic() + timeout
        try:
            for p in procs:
                p.wait(timeout=max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            pass
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        outs = []
        for f in logs:
            f.seek(0)
            outs.append(f.read())
            f.close()
    reports = []
    for r, (p, out) in enumerate(zip(procs, outs)):
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        if p.returncode != 0 or not lines:
            raise RuntimeError(f"{mode} rank {r} failed (exit {p.returncode}):\n{out[-8000:]}")
        reports.append(json.loads(lines[-1]))
    return reports


class _PyTorchOps(logging.Handler):
    """Collects what the evt logger says runs in PyTorch (fallbacks, modules without a plan)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.messages = []

    def emit(self, record):
        msg = record.getMessage()
        if "fallback to PyTorch" in msg or "runs in PyTorch" in msg or "failed" in msg:
            self.messages.append(msg.strip())


def _full(t):
    """The whole tensor of a gradient or weight (a DTensor's shards gathered: a collective, every rank calls it)."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _wrap(model, mode, device, world):
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        # (the model fits one gradient bucket: dynamo's DDP optimizer, which splits a graph at bucket boundaries,
        # takes buckets of at least the 1 MiB of DDP's first one, so no split here)
        return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh(device.type, (world,))
    fully_shard(model.block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def run_rank(mode, backend, rank, world, port, steps):
    """One rank's training (see the module docstring); returns its report."""
    import gc

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    report = _train(mode, device, rank, world, steps)
    # the wrapped model (DDP's reducer, FSDP's state) is gone with _train's frame: destroying the process group
    # before them can leave a rank waiting in their destructors at exit
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    return report


def _train(mode, device, rank, world, steps):
    import torch
    import torch.distributed as dist
    import evt
    from loop_models import TinyLM, rel_err

    watch = _PyTorchOps()
    logging.getLogger("evt").addHandler(watch)
    logging.getLogger("evt").setLevel(logging.INFO)
    torch.manual_seed(0)
    ref = TinyLM().to(device)
    model = copy.deepcopy(ref)
    compiled = torch.compile(_wrap(model, mode, device, world), backend="evt")
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    vocab = ref.head.out_features
    report = {"rank": rank, "mode": mode, "loss_errs": [], "grad_errs": [], "worst_grad": []}
    for step in range(steps):
        gen = torch.Generator().manual_seed(100 + step)
        tokens = torch.randint(0, vocab, (world * ROWS_PER_RANK, SEQ), generator=gen).to(device)
        targets = torch.randint(0, vocab, (world * ROWS_PER_RANK, SEQ), generator=gen).to(device)
        mine = slice(rank * ROWS_PER_RANK, (rank + 1) * ROWS_PER_RANK)
        loss_ref = ref(tokens, targets)
        loss_ref.backward()
        loss = compiled(tokens[mine], targets[mine])
        loss.backward()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        report["loss_errs"].append(rel_err(mean / world, loss_ref))
        errs = {name: rel_err(_full(p.grad), p_ref.grad) for (name, p_ref), p in
                zip(ref.named_parameters(), model.parameters())}
        worst = max(errs, key=errs.get)
        report["grad_errs"].append(errs[worst])
        report["worst_grad"].append(worst)
        for o in (opt_ref, opt):
            o.step()
            o.zero_grad()
    report["weight_err"] = max(rel_err(_full(p.detach()), p_ref) for p_ref, p in
                               zip(ref.parameters(), model.parameters()))
    report["grads_checked"] = len(errs)
    report["stats"] = dict(evt.STATS)
    report["in_pytorch"] = watch.messages
    logging.getLogger("evt").removeHandler(watch)
    return report


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=("ddp", "fsdp2"), required=True)
    ap.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--rank", type=int, help="run this rank (set by the launch)")
    ap.add_argument("--port", type=int)
    ap.add_argument("--stacks-after", type=float, help="print every thread's stack after this many seconds")
    a = ap.parse_args()
    if a.rank is None:
        for r in launch(a.mode, a.backend, a.world, a.steps):
            print(json.dumps(r))
        return
    if a.stacks_after:
        faulthandler.dump_traceback_later(a.stacks_after, exit=False)
    os.environ.setdefault("EVT_CACHE", "0")
    print(json.dumps(run_rank(a.mode, a.backend, a.rank, a.world, a.port, a.steps)), flush=True)


if __name__ == "__main__":
    main()
