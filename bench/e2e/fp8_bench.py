"""FP8 training benchmark (issue 45): BERT-large and a LLaMA-style 8-layer decoder trained for --steps AdamW steps on
a learnable synthetic task, with torch.compile bf16 (the baseline), evt bf16, evt with its fp8 option and torchao
float8 + torch.compile side by side: the loss of every step (the fp8 runs against the bf16 run's) and the step time.

    python3 bench/e2e/fp8_bench.py                                   # both workloads, every mode, 300 steps
    python3 bench/e2e/fp8_bench.py --workloads llama8 --batch 8 --modes bf16,evt_fp8
    python3 bench/e2e/fp8_bench.py --steps 50 --timeout 1200 --out bench/logs
    python3 bench/e2e/fp8_bench.py --device cpu --size tiny --steps 3  # tiny models on the CPU (a smoke test)
    python3 bench/e2e/fp8_bench.py --render bench/logs/fp8_A.json bench/logs/fp8_B.json  # one table of several runs

Workloads: `bert_large` (models.py's BertMLM: 24 post-LN layers, d 1024, FFN 4096, vocab 30522, batch 32 x 512
tokens, no dropout) and `llama8` (transformers' LlamaForCausalLM from a config, random weights, nothing downloaded:
8 layers, d 2048, 16 heads, SwiGLU FFN 5632, vocab 32000, batch 4 x 2048 tokens). --batch overrides the batch.
The task: token sequences from a fixed random "teacher" (seeded tables): llama8 predicts the next token of a
bigram chain over the first 1024 token ids where each token has 4 possible successors (loss floor ln 4); bert_large
predicts the 15% masked tokens (replaced by the last vocabulary id) of rows drawn from one of 64 random 16-token
topics (loss floor ln 16). Every batch comes from a generator seeded by the step, so
every mode sees the same batches; every mode starts from the same weights (seed 0, built on the CPU).

Modes: `bf16` (torch.compile, default backend), `evt_bf16` (backend="evt", {"cudagraphs": True}), `evt_fp8`
(backend="evt", {"fp8": "tensorwise", "cudagraphs": True}; docs/pytorch.md "FP8 (opt-in)"), `torchao_fp8`
(torchao.float8.convert_to_float8_training, tensorwise dynamic scaling, on every nn.Linear but the loss layer as evt
leaves it (the MLM decoder / the LM head), + torch.compile; needs torchao and an sm_89+ GPU), `eager`. On CUDA every
mode runs under bf16 autocast with f32 master weights. A step: gradients set to None, forward + backward, gradient
clipping (--clip), AdamW (fused on CUDA; lr warmed up linearly over --lr-warmup steps). On the CPU (--device cpu) the
modes run in f32 without autocast, evt without CUDA graphs (its CPU interpreter), and torchao_fp8 is skipped; the
tiny size is 1 layer, d 256, FFN 512, vocab 512, 4 x 64 tokens (every GEMM but the loss layer's >= 256 on each side,
so evt's fp8 pass rewrites them: its size rule).

Each workload x mode runs in a child process under --timeout (an out-of-memory, a hang or a long compile is a row
saying so, and the rest still runs). Per mode: the loss of every step, the median ms per step over the steps after
--warmup (CUDA events around each step, the host not synchronized between steps: throughput) and of its forward +
backward alone, the first step's seconds (compile included), peak memory (max_memory_allocated), and for evt modes
the ops in evt / in PyTorch. Writes <out>/fp8_<tag>.json after every mode and prints a markdown table last: ms/step,
speed vs bf16, the loss at steps 1, N/3, 2N/3, N, and the max over the last 50 steps of |loss - loss_bf16| / loss_bf16
(the issue's 1% criterion, pass/fail; evt_bf16's row shows how far two bf16 runs drift apart), peak GiB, first-step
seconds; then the issue's speed target per workload (evt_fp8 >= 1.35x bf16 and faster than torchao_fp8). Without a
bf16 row the losses and times are compared with eager's. --render prints one table from several result files.
"""
import argparse
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "python"))

WORKLOADS = ("bert_large", "llama8")
MODES = ("eager", "bf16", "evt_bf16", "evt_fp8", "torchao_fp8")
DEFAULT_MODES = ("bf16", "evt_bf16", "evt_fp8", "torchao_fp8")
EVT_OPTIONS = {"evt_bf16": {"cudagraphs": True}, "evt_fp8": {"fp8": "tensorwise", "cudagraphs": True}}
REF = "bf16"          # the loss and speed reference
LOSS_TOL = 0.01       # the criterion: within 1% of the bf16 run's loss
LAST = 50             # ... over the last 50 steps
TARGET_SPEEDUP = 1.35

# Sizes. "full": the issue's; "tiny": CPU smoke-test size whose GEMMs are still >= 256 on every side, so that evt's
# fp8 pass really rewrites them (its size rule, docs/pytorch.md) at batch 4 x 64 tokens.
SIZES = {
    "full": {
        "bert_large": dict(layers=24, dim=1024, heads=16, ffn=4096, vocab=30522, seq=512, batch=32, lr=1e-4),
        "llama8": dict(layers=8, dim=2048, heads=16, ffn=5632, vocab=32000, seq=2048, batch=4, lr=3e-4),
    },
    "tiny": {
        "bert_large": dict(layers=1, dim=256, heads=4, ffn=512, vocab=512, seq=64, batch=4, lr=1e-3),
        "llama8": dict(layers=1, dim=256, heads=4, ffn=512, vocab=512, seq=64, batch=4, lr=1e-3),
    },
}
TEACHER_TOKENS = 1024   # the teachers use the token ids below min(this, vocab - 1)
TEACHER_FANOUT = 4      # llama8: successors per token
TOPICS, TOPIC_TOKENS = 64, 16  # bert_large: topics, tokens per topic
MASK_RATE = 0.15        # bert_large: masked positions


def teacher_table(workload, vocab, seed=1234):
    """The fixed random teacher: llama8: [n, TEACHER_FANOUT] successors of each of the first n token ids (a bigram
    chain); bert_large: [TOPICS, TOPIC_TOKENS] token ids of each topic."""
    import torch
    n = min(TEACHER_TOKENS, vocab - 1)
    g = torch.Generator().manual_seed(seed)
    shape = (n, TEACHER_FANOUT) if workload == "llama8" else (TOPICS, TOPIC_TOKENS)
    return torch.randint(0, n, shape, generator=g)


def make_batch(workload, c, step, table, seed=1234):
    """(input ids, labels) of step `step` on the CPU, the same in every mode and process. llama8: a bigram chain
    per row from the teacher (uniform over each token's successors; the loss can reach ln TEACHER_FANOUT), labels =
    ids (the model shifts them). bert_large: each row's tokens drawn uniformly from one random topic's tokens (the
    masked tokens are predictable from the others, wherever they are: the loss can reach ln TOPIC_TOKENS), MASK_RATE
    of the positions replaced by the last vocabulary id, labels there, -100 elsewhere."""
    import torch
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    b, s = c["batch"], c["seq"]
    if workload == "llama8":
        choice = torch.randint(0, TEACHER_FANOUT, (b, s), generator=g)
        ids = torch.empty(b, s, dtype=torch.long)
        ids[:, 0] = torch.randint(0, table.shape[0], (b,), generator=g)
        for t in range(1, s):
            ids[:, t] = table[ids[:, t - 1], choice[:, t]]
        return ids, ids.clone()
    topic = torch.randint(0, table.shape[0], (b, 1), generator=g)
    ids = table[topic, torch.randint(0, table.shape[1], (b, s), generator=g)]
    mask = torch.rand(b, s, generator=g) < MASK_RATE
    mask[:, 0] = True  # (at least one labelled position per row)
    labels = torch.where(mask, ids, torch.full_like(ids, -100))
    return torch.where(mask, torch.full_like(ids, c["vocab"] - 1), ids), labels


# ---- models -----------------------------------------------------------------------------------------------

def make_model(workload, c):
    """The workload's model (forward(ids, labels) -> loss) on the CPU, weights from seed 0."""
    import torch
    torch.manual_seed(0)
    if workload == "bert_large":
        import models as M
        return M.BertMLM(layers=c["layers"], dim=c["dim"], heads=c["heads"], ffn=c["ffn"], vocab=c["vocab"],
                         max_len=c["seq"], p=0.0)
    if workload == "llama8":
        import transformers as T
        import zoo
        cfg = T.LlamaConfig(vocab_size=c["vocab"], hidden_size=c["dim"], intermediate_size=c["ffn"],
                            num_hidden_layers=c["layers"], num_attention_heads=c["heads"],
                            num_key_value_heads=c["heads"], max_position_embeddings=c["seq"],
                            bos_token_id=0, eos_token_id=0)
        return zoo.LossOf(T.LlamaForCausalLM(cfg), "input_ids")
    raise ValueError(f"unknown workload {workload!r}; one of {', '.join(WORKLOADS)}")


LOSS_LAYERS = ("decoder", "lm_head")  # the Linear whose output reaches the loss: evt's fp8 pass leaves it alone


def _torchao_filter(mod, fqn):
    import torch
    return (isinstance(mod, torch.nn.Linear) and fqn.split(".")[-1] not in LOSS_LAYERS
            and mod.in_features % 16 == 0 and mod.out_features % 16 == 0)


def skip_reason(mode, device):
    """Why `mode` cannot run here, or None."""
    import torch
    if mode != "torchao_fp8":
        return None
    if device != "cuda":
        return "torchao float8 needs a CUDA GPU (skipped on the CPU)"
    try:
        import torchao.float8  # noqa: F401
    except ImportError as e:
        return f"torchao not importable ({e}); pip install torchao (requirements-models.txt)"
    if not torch.cuda.is_available():
        return "no CUDA GPU"
    cap = torch.cuda.get_device_capability()
    if cap < (8, 9):
        return f"torchao float8 needs sm_89+ (this GPU is sm_{cap[0]}{cap[1]})"
    return None


def compiled(model, mode, device):
    """(callable, evt Report or None, the backend options used or None)."""
    import torch
    if mode == "eager":
        return model, None, None
    if mode == "bf16":
        return torch.compile(model), None, None
    if mode == "torchao_fp8":
        from torchao.float8 import convert_to_float8_training
        convert_to_float8_training(model, module_filter_fn=_torchao_filter)
        return torch.compile(model), None, None
    import evt
    opts = dict(EVT_OPTIONS[mode])
    if device != "cuda":
        opts.pop("cudagraphs", None)  # (CUDA graphs: CUDA only)
    backend, report = evt.report_backend(opts)
    return torch.compile(model, backend=backend), report, opts


# ---- child: one workload, one mode ------------------------------------------------------------------------

def run_mode(workload, mode, a):
    """The row of one workload x mode: losses of every step, times, memory."""
    import torch
    c = dict(SIZES[a.size][workload])
    if a.batch:
        c["batch"] = a.batch
    lr = a.lr or c["lr"]
    dev = a.device
    row = {"workload": workload, "mode": mode, "device": dev, "size": a.size, "batch": c["batch"], "seq": c["seq"],
           "steps": a.steps, "lr": lr, "torch": torch.__version__}
    why = skip_reason(mode, dev)
    if why:
        row["skipped"] = why
        print(f"  {workload} / {mode}: skipped: {why}", flush=True)
        return row
    if dev == "cuda":
        row["gpu"] = torch.cuda.get_device_name()
        torch.cuda.reset_peak_memory_stats()
    elif mode in EVT_OPTIONS and EVT_OPTIONS[mode].get("cudagraphs"):
        print(f"  {workload} / {mode}: cudagraphs off on the CPU (CUDA graphs need CUDA tensors)", flush=True)
    table = teacher_table(workload, c["vocab"])
    # (all on the device before the first step: a copy from pageable memory between steps would synchronize)
    batches = [tuple(t.to(dev) for t in make_batch(workload, c, i, table)) for i in range(a.steps)]
    model = make_model(workload, c).to(dev).train()
    row["params_m"] = sum(p.numel() for p in model.parameters()) / 1e6
    row["param_dtype"] = str(next(model.parameters()).dtype)
    f, report, opts = compiled(model, mode, dev)
    row["options"] = opts
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01, **({"fused": True} if dev == "cuda" else {}))
    amp = dev == "cuda"
    cuda = dev == "cuda"

    def step(i, ids, labels):
        for p in params:
            p.grad = None
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            loss = f(ids, labels)
        loss.backward()
        out = loss.detach().float().clone()  # (a CUDA-graph replay may overwrite the step's output)
        mid = None
        if cuda:
            mid = torch.cuda.Event(enable_timing=True)
            mid.record()
        if a.clip > 0:
            torch.nn.utils.clip_grad_norm_(params, a.clip)
        for g in opt.param_groups:
            g["lr"] = lr * min(1.0, (i + 1) / max(1, a.lr_warmup))
        opt.step()
        return out, mid

    losses, events, cpu_ms = [], [], []
    t_first = None
    for i, (ids, labels) in enumerate(batches):
        if i == 0:
            t0 = time.time()
            out, _ = step(i, ids, labels)
            if cuda:
                torch.cuda.synchronize()
            t_first = time.time() - t0
            losses.append(out)
            print(f"  {workload} / {mode}: first step {t_first:.1f}s, loss {out.item():.4f}", flush=True)
            continue
        if cuda:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            out, mid = step(i, ids, labels)
            e.record()
            events.append((s, mid, e))
        else:
            t0 = time.perf_counter()
            out, _ = step(i, ids, labels)
            cpu_ms.append((time.perf_counter() - t0) * 1e3)
        losses.append(out)
        if a.log_every and (i + 1) % a.log_every == 0:
            print(f"  {workload} / {mode}: step {i + 1} loss {out.item():.4f}", flush=True)
    if cuda:
        torch.cuda.synchronize()
        ms = [s.elapsed_time(e) for s, _, e in events]
        fb = [s.elapsed_time(m) for s, m, _ in events]
        row["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    else:
        ms, fb = cpu_ms, None
    row["losses"] = [float(x.item()) for x in losses]
    row["first_step_s"] = round(t_first, 2)
    w = min(max(0, a.warmup - 1), max(0, len(ms) - 1))  # (step 1 is not in ms)
    if ms:
        row["ms"] = statistics.median(ms[w:])
        row["ms_min"] = min(ms[w:])
        if fb:
            row["ms_fwd_bwd"] = statistics.median(fb[w:])
    if report is not None:
        try:
            row["ops_evt"], row["ops_torch"] = report.op_counts()
        except Exception as e:  # noqa: BLE001 (the counts are a nicety)
            row["ops_error"] = str(e)[:200]
    return row


def child(a):
    try:
        row = run_mode(a.child, a.mode, a)
    except Exception as e:  # noqa: BLE001 (a mode that fails is a row saying why)
        import traceback
        traceback.print_exc()
        row = {"workload": a.child, "mode": a.mode, "error": f"{type(e).__name__}: {str(e)[:400]}"}
    with open(a.row_out, "w") as fh:
        json.dump(row, fh)


def run_child(workload, mode, a):
    """One workload x mode in a child process (its own session: a timeout kills it with everything it started)."""
    import tempfile
    fd, path = tempfile.mkstemp(prefix="fp8_row_", suffix=".json")
    os.close(fd)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", workload, "--mode", mode, "--row-out", path,
           "--device", a.device, "--size", a.size, "--steps", str(a.steps), "--warmup", str(a.warmup),
           "--lr-warmup", str(a.lr_warmup), "--clip", str(a.clip), "--log-every", str(a.log_every)]
    cmd += ["--batch", str(a.batch)] if a.batch else []
    cmd += ["--lr", str(a.lr)] if a.lr else []
    p = subprocess.Popen(cmd, start_new_session=True)
    status = None
    try:
        rc = p.wait(timeout=a.timeout)
        if rc != 0:
            status = f"child process exited with {rc} (see the log above)"
    except subprocess.TimeoutExpired:
        status = f"timeout after {a.timeout:.0f}s"
    finally:  # (a timeout, or this process interrupted / terminated: the child's session goes with it)
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
    try:
        with open(path) as fh:
            row = json.load(fh)
    except (OSError, ValueError):
        row = {"workload": workload, "mode": mode, "error": status or "child process wrote no result"}
    finally:
        os.remove(path)
    return row


# ---- the summary ---------------------------------------------------------------------------------------------

def checkpoints(n):
    """The steps (1-based) the table shows: 1, n/3, 2n/3, n (1/100/200/300 for 300 steps)."""
    return sorted({1, max(1, round(n / 3)), max(1, round(2 * n / 3)), n})


def loss_dev(losses, ref, last=LAST):
    """max over the last `last` common steps of |loss - ref| / |ref| (inf where a loss is not finite)."""
    n = min(len(losses), len(ref))
    if n == 0:
        return None
    worst = 0.0
    for x, r in zip(losses[n - min(last, n):n], ref[n - min(last, n):n]):
        if not (math.isfinite(x) and math.isfinite(r)) or r == 0:
            return float("inf")
        worst = max(worst, abs(x - r) / abs(r))
    return worst


def summarize(rows):
    """Adds ref_mode, speedup_vs_ref and loss_dev / loss_ok against the same workload's reference row (bf16; eager
    where no bf16 row ran) to every row that ran."""
    ref = {}
    for m in ("eager", REF):
        ref.update({r["workload"]: r for r in rows if r["mode"] == m and "losses" in r})
    for r in rows:
        b = ref.get(r["workload"])
        if b is None or "losses" not in r:
            continue
        r["ref_mode"] = b["mode"]
        if r.get("ms") and b.get("ms"):
            r["speedup_vs_ref"] = b["ms"] / r["ms"]
        r["loss_dev"] = loss_dev(r["losses"], b["losses"])
        r["loss_ok"] = r["loss_dev"] is not None and r["loss_dev"] <= LOSS_TOL
    return rows


def table(rows):
    rows = summarize(rows)
    n = max((len(r.get("losses", [])) for r in rows), default=0)
    cps = checkpoints(n) if n else []
    head = (["workload", "mode", "ms/step", "fwd+bwd ms", "vs ref"] + [f"loss @{s}" for s in cps] +
            [f"max rel. loss diff, last {LAST} (<= {LOSS_TOL:.0%})", "peak GiB", "first step s", "ops evt / PyTorch"])
    lines = [f"ref: {REF} (torch.compile bf16; eager where {REF} did not run)", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["workload"], r["mode"]]
        if "losses" not in r:
            msg = r.get("error") or ("skipped: " + r.get("skipped", "?"))
            lines.append("| " + " | ".join(cells + [msg] + [""] * (len(head) - 3)) + " |")
            continue
        ls = r["losses"]
        cells += [f'{r["ms"]:.2f}' if "ms" in r else "", f'{r["ms_fwd_bwd"]:.2f}' if "ms_fwd_bwd" in r else "",
                  f'{r["speedup_vs_ref"]:.2f}x' if "speedup_vs_ref" in r else ""]
        cells += [f"{ls[s - 1]:.4f}" if s <= len(ls) else "" for s in cps]
        d = r.get("loss_dev")
        cells.append("(reference)" if r.get("ref_mode") == r["mode"] else
                     "" if d is None else f"{d:.2%} " + ("pass" if r["loss_ok"] else "FAIL"))
        cells += [f'{r["peak_gib"]:.1f}' if "peak_gib" in r else "", str(r.get("first_step_s", "")),
                  f'{r["ops_evt"]} / {r["ops_torch"]}' if "ops_evt" in r else ""]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for w in dict.fromkeys(r["workload"] for r in rows):
        by = {r["mode"]: r for r in rows if r["workload"] == w}
        e, t = by.get("evt_fp8", {}), by.get("torchao_fp8", {})
        if "speedup_vs_ref" not in e or e.get("ref_mode") != REF:
            lines.append(f"- {w}: speed target not measured (needs evt_fp8 and {REF} times)")
            continue
        s = e["speedup_vs_ref"]
        vs_tao = (f"{t['ms'] / e['ms']:.2f}x torchao_fp8 ({'pass' if e['ms'] < t['ms'] else 'FAIL'})" if t.get("ms")
                  else "torchao_fp8 not measured")
        loss = (f"loss within {LOSS_TOL:.0%}: {'pass' if e.get('loss_ok') else 'FAIL'}")
        lines.append(f"- {w}: evt_fp8 {s:.2f}x {REF} (target >= {TARGET_SPEEDUP}x: "
                     f"{'pass' if s >= TARGET_SPEEDUP else 'FAIL'}), {vs_tao}, {loss}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--modes", default=",".join(DEFAULT_MODES), help=f"of {', '.join(MODES)}")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--size", default="full", choices=tuple(SIZES))
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=10, help="steps not timed (the first step is never timed)")
    ap.add_argument("--batch", type=int, default=0, help="batch (default: bert_large 32, llama8 4)")
    ap.add_argument("--lr", type=float, default=0.0, help="AdamW peak lr (default: bert_large 1e-4, llama8 3e-4)")
    ap.add_argument("--lr-warmup", type=int, default=20, help="steps of linear lr warmup")
    ap.add_argument("--clip", type=float, default=1.0, help="gradient-norm clipping (0: off)")
    ap.add_argument("--log-every", type=int, default=50, help="print the loss every N steps (0: never)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per workload x mode")
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "logs"))
    ap.add_argument("--tag", default=None)
    ap.add_argument("--render", nargs="+", metavar="JSON",
                    help="print the table of the rows of these result files (runs split over several commands)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--row-out", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a)
    if a.render:
        rows = []
        for fn in a.render:
            with open(fn) as fh:
                rows += json.load(fh)["rows"]
        print(table(rows))
        return
    modes, wls = a.modes.split(","), a.workloads.split(",")
    bad = [m for m in modes if m not in MODES] + [w for w in wls if w not in WORKLOADS]
    if bad:
        ap.error(f"unknown modes/workloads {bad}; modes: {', '.join(MODES)}; workloads: {', '.join(WORKLOADS)}")
    if a.steps < 1:
        ap.error("--steps must be >= 1")
    if REF in modes:  # the reference first: a run cut short still has it
        modes = [REF] + [m for m in modes if m != REF]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # (SystemExit: run_child kills the running child)
    os.makedirs(a.out, exist_ok=True)
    tag = a.tag or time.strftime("%Y%m%d-%H%M", time.gmtime())
    path = os.path.join(a.out, f"fp8_{tag}.json")
    rows = []
    for w in wls:
        for m in modes:
            print(f"== {w} / {m}", flush=True)
            t0 = time.time()
            if m == "torchao_fp8" and a.device != "cuda":  # (no child process for that)
                row = {"workload": w, "mode": m, "skipped": "torchao float8 needs a CUDA GPU (skipped on the CPU)"}
                print(f"  {w} / {m}: skipped: {row['skipped']}", flush=True)
            else:
                row = run_child(w, m, a)
                print(f"  ({time.time() - t0:.1f}s)", flush=True)
            if "error" in row:
                print(f"  {w} / {m}: error: {row['error']}", flush=True)
            rows.append(row)
            with open(path, "w") as fh:  # after every mode: a run cut short keeps what it finished
                json.dump({"command": "python3 bench/e2e/fp8_bench.py " + " ".join(sys.argv[1:]),
                           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                           "rows": summarize(rows)}, fh, indent=1)
    print("\n" + table(rows))
    print(f"\nwritten: {path}")


if __name__ == "__main__":
    main()
