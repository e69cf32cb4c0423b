"""PyTorch eager side of the row-kernel benchmark (bench/kernels/bench_rows.cu perf): the same ops and shapes,
bf16, timed with CUDA events (median of 7 runs of 20 back-to-back calls over 4 rotating inputs).

    python3 bench/kernels/torch_rows.py [M:N ...] [bce=M:N ...] [bn=M:N ...]
        (default: the vocabulary-wide rows of bench_rows; bce=: the BCE backward + bias gradient; bn=: batch-norm
         kernels on a channels-last [M / 56², N, 56, 56] activation (M = batch · 56²; else [M, N, 1, 1]): bench_rows'
         bn_stats, bn_apply, bn_bwd_reduce)
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
    args = [a for a in sys.argv[1:] if not a.startswith(("bce=", "bn="))]
    bn_shapes = [tuple(int(v) for v in a[3:].split(":")) for a in sys.argv[1:] if a.startswith("bn=")]
    shapes = [tuple(int(v) for v in s.split(":")) for s in args] or [(2048, 50304), (2048, 50257)]
    bce_shapes = [tuple(int(v) for v in a[4:].split(":")) for a in sys.argv[1:] if a.startswith("bce=")]
    print(f"{'op':<12} {'M':>6} {'N':>6} {'torch eager us':>15}")
    for m, n in shapes:
        xs = [torch.randn(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
        ys = [torch.softmax(x, -1) for x in xs]
        dys = [torch.randn_like(x) for x in xs]
        t_f = timed_us(lambda i: torch.softmax(xs[i % 4], -1))
        t_b = timed_us(lambda i: torch._softmax_backward_data(dys[i % 4], ys[i % 4], -1, torch.bfloat16))
        print(f"{'softmax':<12} {m:>6} {n:>6} {t_f:>15.1f}")
        print(f"{'softmax_bwd':<12} {m:>6} {n:>6} {t_b:>15.1f}")
        del xs, ys, dys
    for m, n in bce_shapes:  # bench_rows' bce_bias_grad: dx = (sigmoid(x) - y) / 4 (bf16), db = Σ_M dx (f32)
        xs = [torch.randn(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
        ts = [torch.rand(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(2)]

        def bce(i):
            d = (torch.sigmoid(xs[i % 2].float()) - ts[i % 2].float()) * 0.25
            return d.to(torch.bfloat16), d.sum(0)
        print(f"{'bce_bias_grad':<12} {m:>6} {n:>6} {timed_us(bce, reps=5, runs=5):>15.1f}")
    for m, n in bn_shapes:  # PyTorch's channels-last batch-norm kernels on the same bytes as bench_rows' bn_*
        shape = (m // 3136, n, 56, 56) if m % 3136 == 0 else (m, n, 1, 1)
        mk = lambda: torch.randn(shape, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
        xs, dys = [mk() for _ in range(2)], [mk() for _ in range(2)]
        w = torch.rand(n, device="cuda") + 0.5
        b = torch.randn(n, device="cuda")
        mean, invstd = torch.batch_norm_stats(xs[0], 1e-5)
        ys = [torch.relu(torch.batch_norm_elemt(x, w, b, mean, invstd, 1e-5)) for x in xs]
        rows = [("bn_stats", lambda i: torch.batch_norm_stats(xs[i % 2], 1e-5)),
                ("bn_apply", lambda i: torch.batch_norm_elemt(xs[i % 2], w, b, mean, invstd, 1e-5)),
                ("bn_apply+relu", lambda i: torch.relu_(torch.batch_norm_elemt(xs[i % 2], w, b, mean, invstd, 1e-5))),
                ("bn_bwd_reduce", lambda i: torch.batch_norm_backward_reduce(dys[i % 2], xs[i % 2], mean, invstd, w,
                                                                             True, True, True)),
                ("relu_bwd+bn_bwd_reduce", lambda i: torch.batch_norm_backward_reduce(
                    torch.ops.aten.threshold_backward(dys[i % 2], ys[i % 2], 0), xs[i % 2], mean, invstd, w, True, True, True))]
        for name, fn in rows:
            print(f"{name:<12} {m:>6} {n:>6} {timed_us(fn):>15.1f}")
        del xs, dys, ys


if __name__ == "__main__":
    main()
