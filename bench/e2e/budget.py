"""Time budget of one training step: where the GPU time of evt's step and of torch.compile's (and eager's) goes,
by kind of kernel, each kind against its floor.

    python3 bench/e2e/budget.py                                  # bert_large, vit_p14, mlp, xmlcnn_paper
    python3 bench/e2e/budget.py --workloads mlp --modes evt,inductor --out /tmp/b

Per workload (a child process each, every mode side by side in it; bf16 autocast, the paper's dropout on unless
--no-dropout) and mode: ms per step (median, CUDA events), peak memory (torch allocator), cold compile (first
step minus a median step), and one profiled step's kernel time by kind: GEMM, attention, row / pointwise /
reduction math, copies / casts / transposes, other, and the GPU's idle time inside the step. evt runs with
options={"cudagraphs": True}; its kernels run by PyTorch between evt segments (aten's) are counted apart.

Floors, on this GPU: GEMM = the step's matmul FLOPs (torch's FLOP counter over one eager step) at cuBLAS's
rate on a large bf16 GEMM; attention = its FLOPs at that rate; evt's row / pointwise kernels = the bytes their
groups must read and write (evt's plan report, io_bytes) at the measured device-to-device copy bandwidth;
copies and idle time: 0. Then every generated GEMM kernel of evt's step against cuBLAS's plain GEMM
(torch.mm, bf16) at its shape, largest excess first.

Writes <out>/budget_<workload>.json and prints one markdown table per workload (--render re-prints them).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import run as R  # noqa: E402 (the step, timing and profiling helpers of the end-to-end benchmark)

WORKLOADS = ("bert_large", "vit_p14", "mlp", "xmlcnn_paper")
MODES = ("evt", "inductor", "eager")
KINDS = ("GEMM", "attention", "row / pointwise / reduction", "copy / cast / transpose", "other", "idle in the step")
_HEX = re.compile(r"(?:evt_gen_|evt_kernel_)([0-9a-f]{16})")


# ---- measurements on this GPU ---------------------------------------------------------------------------------

def _median_ms(fn, iters=10):
    import torch
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def device_rates():
    """{"gemm_tflops": cuBLAS bf16 on 8192^3, "copy_gbs": device-to-device copy of 1 GiB (read + write bytes)}."""
    import torch
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = _median_ms(lambda: torch.mm(a, b))
    x = torch.empty(2**28, device="cuda", dtype=torch.float32)
    y = torch.empty_like(x)
    cms = _median_ms(lambda: y.copy_(x))
    return {"gemm_tflops": round(2 * 8192**3 / ms / 1e9, 1), "copy_gbs": round(2 * x.numel() * 4 / cms / 1e6, 1)}


_CUBLAS_MS = {}


def cublas_ms(m, n, k):
    """cuBLAS's plain bf16 GEMM (torch.mm, fp32 accumulation, bf16 out) at M x N x K, ms (cached per shape)."""
    import torch
    key = (m, n, k)
    if key not in _CUBLAS_MS:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        _CUBLAS_MS[key] = _median_ms(lambda: torch.mm(a, b), 5)
        del a, b
    return _CUBLAS_MS[key]


def step_flops(step):
    """(GEMM FLOPs, attention FLOPs) of one step, by torch's FLOP counter."""
    from torch.utils.flop_counter import FlopCounterMode
    with FlopCounterMode(display=False) as fc:
        step()
    gemm = attn = 0
    for op, n in fc.get_flop_counts().get("Global", {}).items():
        name = str(op)
        if "attention" in name or "flash" in name or "efficient" in name:
            attn += n
        else:
            gemm += n  # mm, addmm, bmm, baddbmm, convolution
    return gemm, attn


# ---- one profiled step ----------------------------------------------------------------------------------------

def profile_step(step):
    """[(name, start us, end us)] of every device event (kernels, copies, memsets) of one step."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    out = []
    for e in prof.events():
        tr = getattr(e, "time_range", None)
        if str(getattr(e, "device_type", "")).endswith("CUDA") and tr is not None and tr.end > tr.start:
            out.append((e.name, float(tr.start), float(tr.end)))
    return out


def kind_of(name):
    if re.search(r"[Mm]emcpy|[Mm]emset", name):
        return "copy / cast / transpose"
    k = R._kernel_category(name)
    return {"gemm": "GEMM", "attention": "attention", "copy/transpose": "copy / cast / transpose",
            "other": "other"}.get(k, "row / pointwise / reduction")


def split_by_kind(events):
    """{kind: [ms, launches]} over the events, idle included, and the PyTorch (aten) kernels' share."""
    by = {k: [0.0, 0] for k in KINDS}
    aten = [0.0, 0]
    for name, s, e in events:
        k = kind_of(name)
        by[k][0] += (e - s) / 1e3
        by[k][1] += 1
        if "at::" in name:
            aten[0] += (e - s) / 1e3
            aten[1] += 1
    if events:
        by["idle in the step"][0] = R._gpu_timeline([(s, e, n) for n, s, e in events])["idle"] / 1e3
    return by, aten


# ---- evt's plan: its GEMM groups and its row kernels' traffic ------------------------------------------------

def plan_groups(report):
    """Every fused group of every segment evt compiled so far (the dicts of evt_plan_report's "groups")."""
    out = []
    for mod in report.modules:
        for seg in mod["segments"]:
            out += [g for g in (seg["plan"] or {}).get("groups", []) if g["path"] != "node-by-node"]
    return out


def _evt_hash(name, mangled):
    """The 16-hex hash of the evt kernel a profiled kernel name is, or None. A CUTLASS kernel's mangled name does
    not carry its evt namespace: `mangled` ({digest: evt_kernel_<hash>}, from the JIT cache's symbols) names it."""
    m = _HEX.search(name)
    if m is None and name.startswith("_ZN7cutlass13device_kernel"):
        m = _HEX.search(mangled.get(R._cutlass_digest(name), ""))
    return m.group(1) if m else None


def plan_device_bytes(report):
    """Every segment's arena + GEMM scratch (the arenas come from PyTorch's allocator for each run, so the peak
    counts only those live at once; the GEMM scratch is held by the programs)."""
    return sum((seg["plan"] or {}).get("arena_bytes", 0) + (seg["plan"] or {}).get("scratch_bytes", 0)
               for mod in report.modules for seg in mod["segments"])


def gemm_table(groups, events):
    """Each generated GEMM kernel of the step: its shapes, its time in the profiled step, cuBLAS at the shapes."""
    mangled = R._cutlass_names(R._jit_cache_dirs())
    t_by_hex = {}
    for name, s, e in events:
        h = _evt_hash(name, mangled) if kind_of(name) == "GEMM" else None
        if h:
            t_by_hex.setdefault(h, [0.0, 0])
            t_by_hex[h][0] += (e - s) / 1e3
            t_by_hex[h][1] += 1
    rows = {}
    for g in groups:
        m = _HEX.search(g.get("kernel", ""))
        if g["kind"] != "gemm+evt" or g["path"] != "generated" or not m or m.group(1) not in t_by_hex:
            continue
        r = rows.setdefault(m.group(1), dict(kernel=m.group(1), shapes=[], ops=g["ops"][:60], cublas_ms=0.0))
        r["shapes"].append([g["m"], g["n"], g["k"]])
        r["cublas_ms"] += cublas_ms(g["m"], g["n"], g["k"])
    for h, r in rows.items():
        r["ms"], r["launches"] = round(t_by_hex[h][0], 3), t_by_hex[h][1]
        # (a kernel the step launches more often than the plans list it ran for several programs' groups)
        r["cublas_ms"] = round(r["cublas_ms"] * max(1, r["launches"] / len(r["shapes"])), 3)
    return sorted(rows.values(), key=lambda r: -(r["ms"] - r["cublas_ms"]))


def row_floor_ms(groups, copy_gbs):
    nbytes = sum(g.get("io_bytes", 0) for g in groups if g["kind"] in ("row", "pointwise"))
    return nbytes / (copy_gbs * 1e9) * 1e3


# ---- child: one workload ---------------------------------------------------------------------------------------

def measure_mode(name, mode, a):
    import torch
    import models as M
    torch._dynamo.reset()
    R._release_evt()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(0)
    free, total = torch.cuda.mem_get_info()
    used0 = total - free
    m, args, amp = M.make(name, "cuda", 0.0 if a.no_dropout else None, 1.0)
    m.train()
    report = None
    if mode == "eager":
        f = m
    elif mode == "inductor":
        f = torch.compile(m)
    else:
        sys.path.insert(0, os.path.join(REPO, "python"))
        import evt
        backend, report = evt.report_backend({"cudagraphs": True})
        f = torch.compile(m, backend=backend)
    step = R._step_fn(f, args, amp, m.parameters())
    t0 = time.time()
    step()
    torch.cuda.synchronize()
    first = time.time() - t0
    ts = R._time_steps(step, a.warmup, a.iters)
    med = statistics.median(ts)
    free, total = torch.cuda.mem_get_info()
    # (device_gib: the device memory the mode holds after its steps: PyTorch's cached blocks, which hold evt's
    # arenas, and what evt's programs hold themselves: GEMM scratch, CUTLASS workspaces)
    row = dict(ms=round(med, 3), peak_gib=round(torch.cuda.max_memory_allocated() / 2**30, 2),
               device_gib=round((total - free - used0) / 2**30, 2),
               compile_cold_s=round(max(first - med / 1e3, 0.0), 1))
    events = profile_step(step)
    by, aten = split_by_kind(events)
    row.update(kinds={k: [round(v[0], 3), v[1]] for k, v in by.items()}, aten=[round(aten[0], 3), aten[1]])
    if report is not None:
        groups = plan_groups(report)
        row["row_floor_ms"] = round(row_floor_ms(groups, a.rates["copy_gbs"]), 3)
        row["gemms"] = gemm_table(groups, events)
        row["arena_gib"] = round(plan_device_bytes(report) / 2**30, 2)
    if mode == "eager":
        row["flops"] = step_flops(step)
    del step, f, m, args
    return row


def child(name, a):
    import torch
    torch.backends.cuda.matmul.allow_tf32 = True
    a.rates = device_rates()
    res = dict(workload=name, device=torch.cuda.get_device_name(), torch=torch.__version__, rates=a.rates,
               dropout=not a.no_dropout, modes={})
    for mode in a.modes:
        try:
            res["modes"][mode] = measure_mode(name, mode, a)
        except Exception as e:  # noqa: BLE001 (a failure is a result)
            res["modes"][mode] = dict(error=f"{type(e).__name__}: {e}"[:400])
        print(f"  {name} {mode}: {json.dumps(res['modes'][mode])[:300]}", flush=True)
    if "eager" not in a.modes:  # the FLOPs need one eager step
        import models as M
        m, args, amp = M.make(name, "cuda", 0.0, 1.0)
        res["flops"] = step_flops(R._step_fn(m, args, amp, m.parameters()))
    else:
        res["flops"] = res["modes"]["eager"].get("flops", [0, 0])
    return res


# ---- the tables -----------------------------------------------------------------------------------------------

def _floors(res):
    rate = res["rates"]["gemm_tflops"] * 1e9  # FLOPs per ms
    gemm, attn = res["flops"]
    evt = res["modes"].get("evt", {})
    return {"GEMM": gemm / rate, "attention": attn / rate, "row / pointwise / reduction": evt.get("row_floor_ms"),
            "copy / cast / transpose": 0.0, "other": None, "idle in the step": 0.0}


def _cell(row, kind):
    if "error" in row:
        return "—"
    ms, n = row["kinds"][kind]
    return f"{ms:.2f}" + (f" ({n})" if kind != "idle in the step" else "")


def render(res, command):
    modes = [m for m in ("evt", "inductor", "eager") if m in res["modes"]]
    head = {"evt": "evt", "inductor": "torch.compile", "eager": "eager"}
    fl = _floors(res)
    basis = {"GEMM": f"{res['flops'][0] / 1e12:.2f} TFLOP at {res['rates']['gemm_tflops']} TFLOP/s (cuBLAS 8192³)",
             "attention": f"{res['flops'][1] / 1e12:.2f} TFLOP at the same rate",
             "row / pointwise / reduction": f"evt's row groups' bytes at {res['rates']['copy_gbs']:.0f} GB/s (copy)"}
    L = [f"#### {res['workload']} ({res['device']}, torch {res['torch']}, dropout "
         f"{'on' if res['dropout'] else 'off'})", "", f"    {command}", "",
         "| ms in one step (launches) | " + " | ".join(head[m] for m in modes) + " | floor | floor basis |",
         "|---|" + "---:|" * len(modes) + "---:|---|"]
    for k in KINDS:
        f = fl.get(k)
        L.append(f"| {k} | " + " | ".join(_cell(res["modes"][m], k) for m in modes) +
                 f" | {'—' if f is None else f'{f:.2f}'} | {basis.get(k, '')} |")
    rows = [res["modes"][m] for m in modes]
    L.append("| of which PyTorch kernels (aten) | " + " | ".join("—" if "error" in r else f"{r['aten'][0]:.2f} ({r['aten'][1]})" for r in rows) + " | | |")
    L.append("| **ms per step** (median) | " + " | ".join(r.get("error", f"**{r.get('ms', 0):.2f}**")[:60] for r in rows) +
             f" | {sum(v for v in fl.values() if v):.2f} | sum of the floors |")
    L.append("| peak memory GiB (PyTorch allocator) | " + " | ".join("—" if "error" in r else f"{r['peak_gib']:.2f}" for r in rows) + " | | |")
    L.append("| device memory held GiB (with evt's arenas) | " + " | ".join("—" if "error" in r else f"{r['device_gib']:.2f}" for r in rows) + " | | |")
    L.append("| sum of evt's arenas (PyTorch's pool, per run) + GEMM scratch GiB | " + " | ".join(f"{r['arena_gib']:.2f}" if "arena_gib" in r else "" for r in rows) + " | | |")
    L.append("| cold compile s | " + " | ".join("—" if "error" in r else f"{r['compile_cold_s']:.1f}" for r in rows) + " | | |")
    gem = res["modes"].get("evt", {}).get("gemms") or []
    if gem:
        L += ["", "evt's generated GEMM kernels against cuBLAS's plain GEMM at their shapes (largest excess first):", "",
              "| kernel | shape(s) M×N×K | epilogue ops | launches | evt ms | cuBLAS ms | ratio |", "|---|---|---|---:|---:|---:|---:|"]
        for g in gem[:10]:
            shapes = ", ".join("×".join(str(d) for d in s) for s in g["shapes"][:3])
            L.append(f"| {g['kernel'][:8]} | {shapes} | {g['ops']} | {g['launches']} | {g['ms']:.3f} | "
                     f"{g['cublas_ms']:.3f} | {g['ms'] / g['cublas_ms']:.2f}x |" if g["cublas_ms"] else "")
        tot, cub = sum(g["ms"] for g in gem), sum(g["cublas_ms"] for g in gem)
        L.append(f"| all {len(gem)} | | | | {tot:.2f} | {cub:.2f} | {tot / cub if cub else 0:.2f}x |")
    return "\n".join(L)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--modes", default=",".join(MODES), help="comma list of evt, inductor, eager")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--no-dropout", action="store_true", help="dropout off (default: the paper's rates)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per workload")
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "logs"))
    ap.add_argument("--render", nargs="*", help="budget_*.json files to print again")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.modes = a.modes.split(",")
    if any(m not in MODES for m in a.modes):
        ap.error(f"modes: {', '.join(MODES)}")
    if a.render:
        for p in a.render:
            res = json.load(open(p))
            print(render(res, res.get("command", "")) + "\n")
        return
    if a.child:
        res = child(a.child, a)
        print("BUDGET_JSON " + json.dumps(res), flush=True)
        return
    os.makedirs(a.out, exist_ok=True)
    command = "python3 bench/e2e/budget.py " + " ".join(sys.argv[1:])
    for w in a.workloads.split(","):
        print(f"== {w}", flush=True)
        cmd = [sys.executable, os.path.abspath(__file__), "--child", w, "--modes", ",".join(a.modes),
               "--iters", str(a.iters), "--warmup", str(a.warmup)] + (["--no-dropout"] if a.no_dropout else [])
        try:
            r = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=a.timeout, start_new_session=True)
            out = r.stdout
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        sys.stdout.write("".join(ln + "\n" for ln in out.splitlines() if not ln.startswith("BUDGET_JSON ")))
        js = [ln for ln in out.splitlines() if ln.startswith("BUDGET_JSON ")]
        if not js:
            print(f"  {w}: no result (timeout or crash; see above)", flush=True)
            continue
        res = json.loads(js[-1][len("BUDGET_JSON "):])
        res["command"] = command
        with open(os.path.join(a.out, f"budget_{w}.json"), "w") as f:
            json.dump(res, f, indent=1)
        print(render(res, command) + "\n", flush=True)


if __name__ == "__main__":
    main()
