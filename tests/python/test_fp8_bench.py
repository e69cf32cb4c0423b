"""bench/e2e/fp8_bench.py (the FP8 training benchmark of issue 45) at its CPU smoke-test size: both workloads, 3
AdamW steps in eager, evt_bf16 and evt_fp8 (the CPU interpreter, CUDA graphs off) and torchao_fp8 (skipped on the
CPU, with its reason), each in its own child process as on the GPU. The JSON must hold finite losses for every mode
that ran; evt_bf16's first loss must be eager's (same weights, same batch, f32 on the CPU) and evt_fp8's first loss
close to it but not equal (the tiny sizes keep every GEMM >= 256 on each side, so the fp8 pass rewrites them). The
synthetic task's batches must be the same in every process. (The bf16 mode, torch.compile on the CPU, is left
out: Inductor's CPU compile takes ~45 s per workload.)"""
import json
import math
import os
import subprocess
import sys

import pytest

from bench_module import load

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "e2e", "fp8_bench.py")
sys.path.insert(0, os.path.join(ROOT, "python"))
from evt import lib as evt_lib  # noqa: E402

pytestmark = pytest.mark.skipif(not evt_lib.has_interpreter(), reason="libevt has no CPU interpreter yet")


def _bench_module():
    return load("bench/e2e/fp8_bench.py")


def test_fp8_bench_cpu_tiny(tmp_path):
    env = dict(os.environ, EVT_CACHE="0")
    p = subprocess.run([sys.executable, SCRIPT, "--device", "cpu", "--size", "tiny", "--steps", "3",
                        "--modes", "eager,evt_bf16,evt_fp8,torchao_fp8", "--out", str(tmp_path), "--tag", "t"],
                       capture_output=True, text=True, timeout=240, env=env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rows = json.load(open(tmp_path / "fp8_t.json"))["rows"]
    by = {(r["workload"], r["mode"]): r for r in rows}
    modes = ("eager", "evt_bf16", "evt_fp8", "torchao_fp8")
    assert set(by) == {(w, m) for w in ("bert_large", "llama8") for m in modes}
    for w in ("bert_large", "llama8"):
        assert "CPU" in by[w, "torchao_fp8"]["skipped"]
        for m in ("eager", "evt_bf16", "evt_fp8"):
            r = by[w, m]
            assert "error" not in r, r
            assert len(r["losses"]) == 3 and all(math.isfinite(x) for x in r["losses"]), r["losses"]
            assert r["ref_mode"] == "eager" and r["loss_ok"], r
        first = {m: by[w, m]["losses"][0] for m in ("eager", "evt_bf16", "evt_fp8")}
        assert abs(first["evt_bf16"] - first["eager"]) <= 1e-4 * first["eager"], first
        assert abs(first["evt_fp8"] - first["eager"]) <= 1e-2 * first["eager"], first
        assert first["evt_fp8"] != first["evt_bf16"], first  # (the GEMMs really ran in fp8)
        assert by[w, "evt_fp8"]["options"] == {"fp8": "tensorwise"}  # (no CUDA graphs on the CPU)
    out = p.stdout
    assert "| llama8 | evt_fp8 |" in out and "skipped: torchao float8 needs a CUDA GPU" in out
    assert "speed target not measured" in out


def test_fp8_bench_batches_are_seeded_and_learnable():
    b = _bench_module()
    c = b.SIZES["tiny"]["llama8"]
    t1, t2 = b.teacher_table("llama8", c["vocab"]), b.teacher_table("llama8", c["vocab"])
    assert torch.equal(t1, t2)
    x1, y1 = b.make_batch("llama8", c, 5, t1)
    x2, _ = b.make_batch("llama8", c, 5, t1)
    x3, _ = b.make_batch("llama8", c, 6, t1)
    assert torch.equal(x1, x2) and not torch.equal(x1, x3) and torch.equal(x1, y1)
    # every next token is one of the teacher's successors of the token before it
    assert (t1[x1[:, :-1]] == x1[:, 1:, None]).any(-1).all()
    cb = b.SIZES["tiny"]["bert_large"]
    ids, labels = b.make_batch("bert_large", cb, 0, b.teacher_table("bert_large", cb["vocab"]))
    masked = labels != -100
    assert masked.any() and (ids[masked] == cb["vocab"] - 1).all() and (ids[~masked] < cb["vocab"] - 1).all()


def test_fp8_bench_summary():
    b = _bench_module()
    ref = [10.0] * 60
    rows = [dict(workload="w", mode="bf16", losses=ref, ms=10.0),
            dict(workload="w", mode="evt_fp8", losses=[10.05] * 60, ms=7.0),
            dict(workload="w", mode="torchao_fp8", losses=[10.0] * 9 + [10.5] + [10.0] * 50, ms=8.0),
            dict(workload="w", mode="evt_bf16", error="timeout after 5s")]
    md = b.table(rows)
    assert rows[1]["loss_ok"] and abs(rows[1]["loss_dev"] - 0.005) < 1e-9
    assert rows[2]["loss_ok"]  # (the step off by 5% is not in the last 50)
    assert abs(rows[1]["speedup_vs_ref"] - 10 / 7) < 1e-9
    assert "timeout after 5s" in md and "target >= 1.35x: pass" in md and "1.14x torchao_fp8 (pass)" in md
    assert b.checkpoints(300) == [1, 100, 200, 300] and b.checkpoints(3) == [1, 2, 3]
    assert b.loss_dev([1.0, float("nan")], [1.0, 1.0]) == float("inf")
