"""cuBLAS (through torch) time of the GEMM shapes of one bert_large training step, for comparison with
evt's per-step GPU table (EVT_PROFILE=N, src/runtime/gpu/profile.c), which names each GEMM as M x N x K.

    python3 bench/kernels/torch_gemm_shapes.py [--tokens 16384] [--hidden 1024] [--ffn 4096] [--vocab 30528]

Prints, per shape and operand layout (NN: A[M,K] @ B[K,N]; NT: A @ B[N,K]^T; TN: A[K,M]^T @ B), the median
milliseconds of 20 calls after 5 warm-ups (CUDA events), bf16 operands and output, and TFLOP/s."""
import argparse

import torch


def gemm_ms(m, n, k, layout, iters=20):
    a = torch.randn((k, m) if layout == "TN" else (m, k), device="cuda", dtype=torch.bfloat16)
    b = torch.randn((n, k) if layout == "NT" else (k, n), device="cuda", dtype=torch.bfloat16)
    aa = a.t() if layout == "TN" else a
    bb = b.t() if layout == "NT" else b
    for _ in range(5):
        torch.mm(aa, bb)
    ts = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        torch.mm(aa, bb)
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e))
    return sorted(ts)[len(ts) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--ffn", type=int, default=4096)
    ap.add_argument("--vocab", type=int, default=30528)
    a = ap.parse_args()
    t, h, f, v = a.tokens, a.hidden, a.ffn, a.vocab
    # (what, M, N, K, layout): forward x @ W^T, input gradient dY @ W, weight gradient dY^T @ X
    cases = []
    for name, n_out, n_in in (("qkv", 3 * h, h), ("attn out", h, h), ("up", f, h), ("down", h, f), ("head", v, h)):
        cases += [(f"{name} fwd", t, n_out, n_in, "NT"), (f"{name} dX", t, n_in, n_out, "NN"),
                  (f"{name} dW", n_out, n_in, t, "TN")]
    print(f"{'GEMM':14s} {'M x N x K':>22s} {'layout':>6s} {'cuBLAS ms':>10s} {'TFLOP/s':>8s}")
    for what, m, n, k, lay in cases:
        ms = gemm_ms(m, n, k, lay)
        print(f"{what:14s} {f'{m} x {n} x {k}':>22s} {lay:>6s} {ms:10.4f} {2 * m * n * k / ms / 1e9:8.1f}", flush=True)


if __name__ == "__main__":
    main()
