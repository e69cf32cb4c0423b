"""DistributedDataParallel and FSDP2 around torch.compile(backend="evt") on GPUs with NCCL, one process per GPU.

    python3 tests/gpu/torch_distributed_gpu.py [--world 2] [--steps 3] [--modes ddp,fsdp2] [--backend nccl]
        [--timeout S]

The checks of tests/python/test_training_loop.py's gloo tests, on CUDA tensors: tests/python/distributed_train.py
launches one process per rank (rank r on GPU r), each trains TinyLM wrapped in DDP (or fully_shard on the block
and the root) and compiled with backend="evt" on its slice of the batch, next to an eager copy trained on the whole
batch; every rank's loss (averaged over the ranks), every gradient (a sharded one gathered) and the weights after
the steps must match the eager copy to rel 1e-3 (fp32 on the GPU: evt's kernels and cuBLAS sum in other orders;
rel = max|a - b| / max|b|, inf/NaN never pass), evt GPU programs must have run and no evt segment may have fallen
back to PyTorch at run time. Ops the CUDA placement leaves to PyTorch (attention under the default gpu_ops) are
listed, not failures. `--backend gloo` runs the same script on CPU tensors (the interpreter; a smoke test of the
script without GPUs, rel 1e-5). Needs --world GPUs for nccl, else exits 2. Prints one line per (mode, rank) and
"N passed, N failed"; exit status 1 on any failure.
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
import distributed_train  # noqa: E402  (tests/python/distributed_train.py)


def check(report, backend):
    """The failures of one rank's report (an empty list when it passed)."""
    tol = 1e-3 if backend == "nccl" else 1e-5
    stats = report["stats"]
    runs = stats.get("gpu_segment_runs", 0) if backend == "nccl" else stats.get("interp_segment_runs", 0)
    bad = []
    if max(report["loss_errs"]) > tol:
        bad.append(f'loss rel {max(report["loss_errs"]):.3g}')
    if max(report["grad_errs"]) > tol:
        i = report["grad_errs"].index(max(report["grad_errs"]))
        bad.append(f'grad {report["worst_grad"][i]} rel {report["grad_errs"][i]:.3g} at step {i}')
    if report["weight_err"] > tol:
        bad.append(f'weights rel {report["weight_err"]:.3g}')
    if runs == 0:
        bad.append("no evt segment ran")
    if stats.get("torch_segment_runs", 0):
        bad.append(f'{stats["torch_segment_runs"]} segment run(s) fell back to PyTorch')
    if any("failed" in m or "runs in PyTorch" in m for m in report["in_pytorch"]):
        bad.append("evt failed: " + "; ".join(m for m in report["in_pytorch"] if "failed" in m or "runs in" in m))
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--modes", default="ddp,fsdp2")
    ap.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per mode (kernels JIT-compile at the first)")
    a = ap.parse_args()
    if a.backend == "nccl":
        import torch
        if torch.cuda.device_count() < a.world:
            print(f"torch_distributed_gpu.py: {torch.cuda.device_count()} GPU(s), {a.world} needed: nothing run",
                  file=sys.stderr)
            sys.exit(2)
    passed = failed = 0
    for mode in a.modes.split(","):
        try:
            reports = distributed_train.launch(mode, a.backend, a.world, a.steps, timeout=a.timeout)
        except RuntimeError as e:
            print(f"FAIL {mode}: {e}")
            failed += 1
            continue
        for r in reports:
            bad = check(r, a.backend)
            placed = sorted({m.split("fallback to PyTorch: ")[1].split(" ")[0] for m in r["in_pytorch"]
                             if "fallback to PyTorch: " in m})
            print(f'{"FAIL" if bad else "ok  "} {mode} rank {r["rank"]}: loss rel {max(r["loss_errs"]):.2g}, '
                  f'grads rel {max(r["grad_errs"]):.2g}, weights rel {r["weight_err"]:.2g}, stats {r["stats"]}'
                  f'{", in PyTorch: " + ", ".join(placed) if placed else ""}{"; " + "; ".join(bad) if bad else ""}')
            failed += bool(bad)
            passed += not bad
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
