#!/usr/bin/env python3
"""The CPU path against PyTorch eager on a small MLP training step (forward, MSE loss, backward).

    python3 bench/scale/cpu_mlp.py [--batch 128] [--dims 512,1024,1024,512] [--steps 5] [--profile]

Prints the median step time of eager PyTorch and of torch.compile(model, backend="evt") on the CPU (the evt
interpreter), their ratio, and with --profile where evt's step time goes (cProfile, top entries by own time).
"""
import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import evt  # noqa: E402,F401  (registers the backend)


def model(dims):
    layers = []
    for i in range(len(dims) - 1):
        layers.append(torch.nn.Linear(dims[i], dims[i + 1]))
        if i + 2 < len(dims):
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def step_time(m, x, y, steps):
    times = []
    for _ in range(steps + 1):
        t0 = time.perf_counter()
        loss = torch.nn.functional.mse_loss(m(x), y)
        loss.backward()
        times.append(time.perf_counter() - t0)
        for p in m.parameters():
            p.grad = None
    return statistics.median(times[1:]), times[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--dims", default="512,1024,1024,512")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    dims = [int(d) for d in a.dims.split(",")]
    torch.manual_seed(0)
    m = model(dims)
    x, y = torch.randn(a.batch, dims[0]), torch.randn(a.batch, dims[-1])
    eager, _ = step_time(m, x, y, a.steps)
    cm = torch.compile(m, backend="evt")
    ev, first = step_time(cm, x, y, a.steps)
    print(f"MLP {dims}, batch {a.batch}, {torch.get_num_threads()} threads: eager {eager * 1e3:.1f} ms, "
          f"evt {ev * 1e3:.1f} ms ({ev / eager:.1f}x eager; first step with compile {first:.1f} s)")
    if a.profile:
        pr = cProfile.Profile()
        pr.enable()
        step_time(cm, x, y, 2)
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
