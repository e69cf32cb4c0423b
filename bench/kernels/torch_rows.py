"""PyTorch eager side of the row-kernel benchmark (bench/kernels/bench_rows.cu perf): the same ops and shapes,
bf16, timed with CUDA events (median of 7 runs of 20 back-to-back calls over 4 rotating inputs).

    python3 bench/kernels/torch_rows.py [M:N ...]     (default: the vocabulary-wide rows of bench_rows)
"""
import statistics
import sys

import torch


def timed_us(fn, reps=20, runs=7):
    fn(0)
    torch.cuda.synchronize()
    out = []
    for _ in range(runs):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for i in range(reps):
            fn(i)
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b) * 1e3 / reps)
    return statistics.median(out)


def main():
    shapes = [tuple(int(v) for v in s.split(":")) for s in sys.argv[1:]] or [(2048, 50304), (2048, 50257)]
    print(f"{'op':<12} {'M':>6} {'N':>6} {'torch eager us':>15}")
    for m, n in shapes:
        xs = [torch.randn(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
        ys = [torch.softmax(x, -1) for x in xs]
        dys = [torch.randn_like(x) for x in xs]
        t_f = timed_us(lambda i: torch.softmax(xs[i % 4], -1))
        t_b = timed_us(lambda i: torch._softmax_backward_data(dys[i % 4], ys[i % 4], -1, torch.bfloat16))
        print(f"{'softmax':<12} {m:>6} {n:>6} {t_f:>15.1f}")
        print(f"{'softmax_bwd':<12} {m:>6} {n:>6} {t_b:>15.1f}")


if __name__ == "__main__":
    main()
