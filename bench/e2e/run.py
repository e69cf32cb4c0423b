"""End-to-end training-step benchmark: PyTorch eager, torch.compile (Inductor), optionally max-autotune,
and evt (torch.compile(backend="evt"), optionally with CUDA graphs), side by side on the paper's workloads.

    python3 bench/e2e/run.py                       # every workload, modes eager,inductor,evt
    python3 bench/e2e/run.py --quick               # fewer steps, a subset, a time budget (GPU windows)
    python3 bench/e2e/run.py --autotune --cudagraphs --workloads mlp,bert_large
    python3 bench/e2e/run.py --tune 5 --workloads mlp --modes eager,evt_cg,inductor  # evt tuned
    python3 bench/e2e/run.py --render FILE.json    # markdown + PNG again from a JSON result
    python3 bench/e2e/run.py --render W.log --tag w3   # ... from a GPU window's log (its E2E_JSON line)

Each workload runs in a child process (all its modes side by side in that one process) under a timeout,
so a workload that hangs, runs out of memory or takes too long to compile is reported as such and the
others still run. A step is: gradients set to None, forward + backward of the loss (no optimizer), bf16 autocast
except the GCN.
Per mode: median / min / max ms per step (CUDA events), speedup over eager and over torch.compile,
peak memory (torch allocator's max_memory_allocated, and the device's used memory after the steps,
which also counts evt's own device arenas), compile time (cold: first step minus a median step, with the
caches as found; warm: the same after torch._dynamo.reset() in the same process, in-memory and disk
caches warm; skipped with --quick), kernels per step (CUDA kernels in a profiler trace of one step; for
evt also evt_program_launch_count summed over the step's programs), evt's coverage (ops in evt segments,
ops in PyTorch, segments on the GPU, CUDA graph captures), and the gradient match: one step from the same
initial weights and inputs as eager, rel = max over parameters of max|g - g_eager| / max|g_eager|
(dropout is off by default for this reason; --dropout keeps the paper's rates and skips the check).
Writes <out>/e2e_<tag>.json (default out: bench/logs), .md and .png (matplotlib, when present). E2E_EVT_OPTIONS (a JSON dict) adds
backend options to every evt mode.
"""
import argparse
import copy
import json
import logging
import os
import signal
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

ALL_MODES = ("eager", "inductor", "autotune", "evt", "evt_cg", "evt_cgs", "evt_cg_bn", "evt_cg_fp8")
# The backend options of each evt mode. evt_cg: the forward and the backward each replayed as one CUDA graph;
# evt_cgs: each evt GPU program its own graph, PyTorch's ops between them eager; evt_cg_bn: evt_cg with the CUDA
# batch norms in evt segments instead of PyTorch's kernels; evt_cg_fp8: evt_cg with the fp8 recipe (docs/pytorch.md
# "FP8 (opt-in)"). evt modes read the tuning records `--tune N` leaves.
MODE_OPTIONS = {"evt_cg": {"cudagraphs": True}, "evt_cgs": {"cudagraphs": "segments"},
                "evt_cg_bn": {"cudagraphs": True, "gpu_ops": ("batch_norm", "dropout")},
                "evt_cg_fp8": {"cudagraphs": True, "fp8": "tensorwise"}}
WORKLOADS = ("bert_large", "vit_p14", "xmlcnn_paper", "resnet50", "gcn_mag", "gcn_mag_edges", "mlp")  # = models.WORKLOADS
QUICK_WORKLOADS = ("mlp", "xmlcnn_paper", "gcn_mag", "vit_p14")


# ---- child: one workload, every mode ---------------------------------------------------------------

class _Capture(logging.Handler):
    """Keeps the evt logger's messages; echoes the compile progress (plans, new GPU programs) with the
    seconds since the mode started, so a window's log shows where a slow compile is."""

    PROGRESS = (" evt segment(s)", "GPU program for", "could not", "failed", "copied for evt")

    def __init__(self, echo=True):
        super().__init__()
        self.msgs = []
        self.echo = echo
        self.t0 = time.time()

    def emit(self, r):
        m = r.getMessage()
        self.msgs.append(m)
        if self.echo and any(k in m for k in self.PROGRESS):
            print(f"  [evt +{time.time() - self.t0:.1f}s] {m.strip()[:300]}", flush=True)


def _compile(model, mode, extra=None):
    """model compiled for `mode`; extra: backend options added to the mode's (evt modes)."""
    import torch
    if mode == "eager":
        return model
    if mode == "inductor":
        return torch.compile(model)
    if mode == "autotune":
        return torch.compile(model, mode="max-autotune-no-cudagraphs")
    sys.path.insert(0, os.path.join(REPO, "python"))
    import evt  # noqa: F401 (registers the backend)
    # (E2E_EVT_OPTIONS: a JSON dict of backend options added to every evt mode's, e.g. {"dump": "/tmp/d"})
    opts = dict(MODE_OPTIONS.get(mode, {}), **json.loads(os.environ.get("E2E_EVT_OPTIONS") or "{}"), **(extra or {}))
    return torch.compile(model, backend="evt", options=opts or None)


def _step_fn(f, args, amp, params=()):
    """One training step as a training loop runs it: gradients set to None (optimizer.zero_grad()), forward
    under autocast, backward. (Accumulating into the previous step's gradients instead would add a kernel
    per parameter, and CUDA-graph replays of the step may not keep the previous step's outputs.)"""
    import torch
    params = list(params)

    def step():
        for p in params:
            p.grad = None
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            loss = f(*args)
        loss.backward()
        return loss
    return step


def _time_steps(step, warmup, iters, spin_ms=0.0, pause_s=0.0):
    """ms per step, each step timed alone (CUDA events around it, synchronized after it). spin_ms > 0 first
    queues a GPU spin of that long, so the host has queued the step before the GPU reaches it: the GPU time
    of the step without the host's lead. pause_s > 0 sleeps that long before each step (a cool GPU: with
    the spin, a step's time at the clocks an idle GPU starts with)."""
    import torch
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if pause_s > 0:
            time.sleep(pause_s)
        if spin_ms > 0:
            torch.cuda._sleep(int(spin_ms * 1e-3 * _SPIN_HZ))
        a.record()
        step()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return ts


_SPIN_HZ = 1.98e9  # torch.cuda._sleep counts SM clock cycles (the H200's maximum clock: a spin at least as long)


def _cutlass_digest(mangled):
    """The 8-hex digest that names a CUTLASS GEMM kernel in the top-kernels list (their mangled names share their
    first 110 characters)."""
    import hashlib
    return hashlib.sha1(mangled.encode()).hexdigest()[:8]


def _cutlass_names_from_symbols(symbols_by_kernel):
    """{digest: evt kernel name} from {evt kernel name: symbol names of its shared object}: the device kernel's
    name is the host stub's (`_ZN7cutlassL13device_kernel...`, internal linkage) without the L."""
    out = {}
    for kname, syms in symbols_by_kernel.items():
        for sym in syms:
            if sym.startswith("_ZN7cutlassL13device_kernel"):
                out[_cutlass_digest("_ZN7cutlass13device_kernel" + sym[len("_ZN7cutlassL13device_kernel"):])] = kname
    return out


def _jit_cache_dirs():
    """Where libevt's JIT cache keeps its kernels: <cache root>/jit, or the cache root itself (older libevt); the
    root as python/evt/config.py cache_root() finds it."""
    root = os.environ.get("EVT_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "evt")
    return [os.path.join(root, "jit"), root]


def _cutlass_names(cache_dirs):
    """{digest: evt_kernel_<hash>} for the GEMM kernels in the JIT cache folders, read with nm; {} when there is no
    cache or no nm."""
    import glob
    syms = {}
    sos = [so for d in cache_dirs for so in sorted(glob.glob(os.path.join(d, "evt_kernel_*.so")))]
    for so in sos[:2000]:
        try:
            r = subprocess.run(["nm", so], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return {}
        syms[os.path.basename(so).split("-")[0]] = [ln.split()[-1] for ln in r.stdout.splitlines() if ln.strip()]
    return _cutlass_names_from_symbols(syms)


def _kernels_in_one_step(step):
    """Profiles one step: prints the top kernels by GPU time ($E2E_TOP_KERNELS of them, default 12; a generated CUTLASS kernel is named by its
    evt_gen_<hash> namespace) and the host-side CUDA API calls by host time (a synchronizing call or an
    allocation in the step shows up there); returns (kernel launches, kernel ms)."""
    import re
    import torch
    from torch.profiler import ProfilerActivity, profile
    from torch.autograd.profiler import record_function
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with record_function("e2e_step"):
            step()
        torch.cuda.synchronize()
    n = 0
    by_name, api = {}, {}
    gemm_names = None
    spans, step_start = [], None
    for e in prof.events():
        dev = str(getattr(e, "device_type", ""))
        tr = getattr(e, "time_range", None)
        if e.name == "e2e_step":
            # (the annotation: on the host, the step's start; on the device it spans kernels, not one)
            if tr is not None and dev.endswith("CPU"):
                step_start = float(tr.start)
            continue
        if dev.endswith("CUDA") and tr is not None:
            spans.append((float(tr.start), float(tr.end), e.name))
        if dev.endswith("CUDA") and not any(k in e.name for k in ("Memcpy", "Memset", "memcpy", "memset")):
            n += 1
            name = e.name
            m = re.search(r"evt_gen_[0-9a-f]{16}", name)
            if m and "cutlass" in name:
                name = f"{m.group(0)} (generated CUTLASS GEMM+EVT)"
            elif name.startswith("_ZN7cutlass13device_kernel"):
                # (the mangled names of different GEMM kernels share their first 110 characters: a digest of the
                # whole name tells them apart from one profile to the next; the JIT cache's objects name it)
                if gemm_names is None:
                    gemm_names = _cutlass_names(_jit_cache_dirs())
                d = _cutlass_digest(e.name)
                name = f"CUTLASS GemmUniversal #{d} ({gemm_names[d] if d in gemm_names else f'{len(e.name)}-char mangled name'})"
            t, c = by_name.get(name, (0.0, 0))
            by_name[name] = (t + _device_us(e), c + 1)
        elif dev.endswith("CPU") and re.match(r"cu[A-Z]|cuda[A-Z]", e.name):
            t, c = api.get(e.name, (0.0, 0))
            api[e.name] = (t + float(getattr(e, "cpu_time_total", 0) or 0), c + 1)
    top = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:int(os.environ.get("E2E_TOP_KERNELS", "12"))]
    total = sum(t for t, _ in by_name.values())
    print(f"  top kernels of one step ({n} launches, {total / 1e3:.2f} ms of kernel time):", flush=True)
    for name, (t, c) in top:
        print(f"    {t / 1e3:9.3f} ms {c:5d}x  {name[:110]}", flush=True)
    cats = {}
    for name, (t, c) in by_name.items():
        k = _kernel_category(name)
        ct, cc = cats.get(k, (0.0, 0))
        cats[k] = (ct + t, cc + c)
    print("  kernel time by kind: " + ", ".join(f"{k} {t / 1e3:.2f} ms ({c}x)" for k, (t, c) in
                                              sorted(cats.items(), key=lambda kv: -kv[1][0])), flush=True)
    if spans:
        _print_timeline(_gpu_timeline(spans, step_start))
    if api:
        htot = sum(t for t, _ in api.values())
        print(f"  host CUDA API calls of that step ({htot / 1e3:.2f} ms of host time):", flush=True)
        for name, (t, c) in sorted(api.items(), key=lambda kv: -kv[1][0])[:8]:
            print(f"    {t / 1e3:9.3f} ms {c:5d}x  {name[:80]}", flush=True)
    return n, round(total / 1e3, 3)


def _gpu_timeline(spans, step_start=None, top=6):
    """Where the GPU is idle within one profiled step: spans = (start us, end us, name) of every device
    event (kernels, copies, memsets), step_start = the host's start of the step (us, same clock) or None.
    Returns a dict: span (first start to last end), busy (their union), idle = span - busy, lead (step
    start to the first device event: host work before the GPU has anything to do) and the `top` largest
    gaps between consecutive events as (us, name before, name after)."""
    spans = sorted(spans)
    busy, gaps = 0.0, []
    cur_s, cur_e, cur_name = spans[0][0], spans[0][1], spans[0][2]
    for s, e, name in spans[1:]:
        if s > cur_e:
            busy += cur_e - cur_s
            gaps.append((s - cur_e, cur_name, name))
            cur_s = s
        if e >= cur_e:
            cur_e, cur_name = e, name
    busy += cur_e - cur_s
    span = cur_e - spans[0][0]
    lead = None if step_start is None else max(0.0, spans[0][0] - step_start)
    return dict(span=span, busy=busy, idle=span - busy, lead=lead, first=spans[0][2],
                gaps=sorted(gaps, key=lambda g: -g[0])[:top], ngaps=len(gaps))


def _print_timeline(t):
    lead = "" if t["lead"] is None else f"; {t['lead'] / 1e3:.3f} ms from the step's start to the first ({t['first'][:40]})"
    print(f"  GPU timeline of that step: {t['span'] / 1e3:.3f} ms from the first device event to the last, busy "
          f"{t['busy'] / 1e3:.3f} ms, idle {t['idle'] / 1e3:.3f} ms in {t['ngaps']} gaps{lead}", flush=True)
    for us, a, b in t["gaps"]:
        print(f"    gap {us / 1e3:8.3f} ms after {a[:50]}  before {b[:50]}", flush=True)


_KINDS = (("attention", r"sdpa|flash|fmha|attention"),
          ("gemm", r"nvjet|gemm|GemmUniversal|xmma|cutlass|cublas|sm90_|sm80_"),
          ("evt row/pointwise", r"evt_gen_|row_kernel"),
          ("reduction", r"triton_red_|triton_per_|reduce|Reduce|GammaBeta"),
          ("elementwise", r"triton_poi_"),
          ("copy/transpose", r"copy|transpose|k_move|CatArray|nchwToNhwc|nhwcToNchw|index_select|gather"),
          ("elementwise", r"elementwise|Functor"))


def _kernel_category(name):
    """A coarse kind for a kernel name (the profile's per-kind totals: where evt and Inductor differ)."""
    for kind, pat in _KINDS:
        if re.search(pat, name):
            return kind
    return "other"


def _host_time(step, iters=3, top=0):
    """Host milliseconds of step() until it returns, the GPU idle at its start (median of `iters`): a step
    whose host time is close to its ms/step is host-bound (or synchronizes inside); top > 0 also runs the
    steps under cProfile and prints the `top` functions by own time (where the host time goes)."""
    import cProfile
    import pstats
    import torch
    ts = []
    prof = cProfile.Profile() if top > 0 else None
    for _ in range(iters):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        if prof is not None:
            prof.enable()
        step()
        if prof is not None:
            prof.disable()
        ts.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    if prof is not None:
        print(f"  host profile of {iters} steps (cProfile, own time; includes the profiler's overhead):", flush=True)
        st = pstats.Stats(prof)
        rows = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:top]
        for (fn, line, name), (cc, nc, tt, ct, _) in rows:
            print(f"    {tt * 1e3 / iters:8.2f} ms own {ct * 1e3 / iters:8.2f} ms cum {nc // iters:6d}x  "
                  f"{os.path.basename(fn)}:{line}({name})"[:150], flush=True)
    return round(statistics.median(ts), 2)


def _device_us(e):
    """Kernel time of a profiler event in us (the attribute's name differs across torch versions)."""
    for attr in ("device_time_total", "cuda_time_total", "device_time", "cuda_time"):
        v = getattr(e, attr, None)
        if isinstance(v, (int, float)) and v > 0:
            return float(v)
    return 0.0


def _grad_rel(model, ref_grads):
    worst, where = 0.0, ""
    for n, p in model.named_parameters():
        r = ref_grads.get(n)
        if r is None:
            continue
        if p.grad is None:
            return float("inf"), f"{n}: no gradient"
        d = (p.grad.float() - r).abs().max().item()
        s = max(r.abs().max().item(), 1e-12)
        if d / s > worst or d != d:
            worst, where = d / s, n
    return worst, where


def _fp32_grads(m, args):
    """The gradients of one step of eager module m without autocast and without TF32 (E2E_FP32_REF=1): the
    reference that tells a mode's bf16 (or TF32) error from that noise (a freshly initialized ResNet's batch-norm
    gradients differ between two bf16 runs by more than 1e-2 relative, torch.compile's by more)."""
    import torch
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        m.zero_grad(set_to_none=True)
        _step_fn(m, args, False, m.parameters())()
        torch.cuda.synchronize()
        return {n: p.grad.detach().float().clone() for n, p in m.named_parameters() if p.grad is not None}
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
        m.zero_grad(set_to_none=True)


def _release_evt():
    """Drops evt's cached GPU programs (their device arenas) of the previous mode."""
    import gc
    gc.collect()
    b = sys.modules.get("evt.backend")
    if b is not None:
        b.release_programs()
        gc.collect()


def _fresh_model_step(name, mode, a, extra=None):
    """(model, args, amp, step): a new model of the workload (seed 0) compiled for `mode` (with the backend
    options extra) and its step function, after dropping the previous mode's compiled graphs, evt programs and
    cached device memory."""
    import torch
    import models as M
    torch._dynamo.reset()
    _release_evt()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(0)
    m, args, amp = M.make(name, "cuda", None if a.dropout else 0.0, a.scale)
    m.train()
    return m, args, amp, _step_fn(_compile(m, mode, extra), args, amp, m.parameters())


def _tune_workload(name, a):
    """--tune N: one evt step of the workload with options={"tune": N}, so that evt's autotuner measures every GEMM
    group of its GPU segments and leaves records in the JIT cache, which the timed evt modes then read
    (docs/pytorch.md "Autotuning"). Problems with a record are not measured again. Returns the seconds it took
    (None when it failed: the modes then run with whatever records exist)."""
    import torch
    t0 = time.time()
    print(f"  tuning {name}'s GEMM groups (tune={a.tune}) ...", flush=True)
    try:
        step = _fresh_model_step(name, "evt", a, {"tune": a.tune})[3]
        step()
        torch.cuda.synchronize()
        took = round(time.time() - t0, 1)
        print(f"  tuned in {took} s", flush=True)
        return took
    except Exception as e:  # noqa: BLE001 (the benchmark goes on untuned)
        print(f"  tuning failed ({type(e).__name__}: {str(e)[:300]}); the modes run with the records there are",
              flush=True)
        return None
    finally:
        torch._dynamo.reset()
        _release_evt()
        torch.cuda.empty_cache()


def run_workload(name, modes, a):
    import torch
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    ref_grads, ref32, rows = None, None, []
    try:
        env = dict(torch=torch.__version__, device=torch.cuda.get_device_name())
    except Exception as e:  # noqa: BLE001 (no GPU: every mode reports the error)
        env = dict(torch=torch.__version__, device=f"none ({type(e).__name__})")
    tune_s = _tune_workload(name, a) if a.tune > 0 and any(m.startswith("evt") for m in modes) else None
    for mode in modes:
        row = dict(workload=name, mode=mode, **env)
        if tune_s is not None and mode.startswith("evt"):
            row["tune_s"] = tune_s
        cap = _Capture()
        evt_log = logging.getLogger("evt")
        evt_log.addHandler(cap)
        evt_log.setLevel(logging.INFO)
        t_mode = time.time()
        try:
            m, args, amp, step = _fresh_model_step(name, mode, a)
            if mode.startswith("evt"):
                from evt import backend as B
                B.reset_stats()
            t0 = time.time()
            step()
            torch.cuda.synchronize()
            first = time.time() - t0
            # the gradient of the first step (same weights and inputs in every mode)
            if mode == "eager":
                ref_grads = {n: p.grad.detach().float().clone() for n, p in m.named_parameters()
                             if p.grad is not None} if not a.dropout else None
                low = amp or torch.backends.cuda.matmul.allow_tf32  # (an f32 workload's GEMMs run on TF32)
                if ref_grads is not None and low and os.environ.get("E2E_FP32_REF", "0") != "0":
                    # eager's own bf16 / TF32 error against the exact fp32 step, the noise a mode's error is compared with
                    ref32 = _fp32_grads(m, args)
                    for n, p in m.named_parameters():
                        p.grad = ref_grads.get(n)
                    row["grad_rel_fp32"], row["grad_worst_fp32"] = _grad_rel(m, ref32)
            elif ref_grads is not None:
                row["grad_rel"], row["grad_worst"] = _grad_rel(m, ref_grads)
                if ref32 is not None:
                    row["grad_rel_fp32"], row["grad_worst_fp32"] = _grad_rel(m, ref32)
            m.zero_grad(set_to_none=True)
            if mode.startswith("evt"):
                B.reset_stats()
                step()
                torch.cuda.synchronize()
                st = dict(B.STATS)
                row.update(evt_launches=st.get("gpu_launches", 0), gpu_segments=st.get("gpu_segment_runs", 0),
                           torch_segments=st.get("torch_segment_runs", 0), interp_segments=st.get("interp_segment_runs", 0),
                           input_copies=st.get("input_copies", 0))
            ts = _time_steps(step, a.warmup, a.iters)
            med = statistics.median(ts)
            row.update(ms=round(med, 3), ms_min=round(min(ts), 3), ms_max=round(max(ts), 3),
                       compile_cold_s=round(max(first - med / 1e3, 0.0), 2))
            if os.environ.get("E2E_STEP_DETAIL", "0") != "0":
                # where a step's time goes besides the kernels: gpu_ms = the GPU's time for the step with the
                # host's lead hidden (a 20 ms spin queued first), cool_ms = the same after 0.3 s idle (clocks).
                # (The spin also lowers the power drawn before the step: a power-bound, GEMM-heavy step runs
                # faster after it, for every compiler: compare modes, not ms/step.)
                g = _time_steps(step, 1, a.iters, spin_ms=20.0)
                c = _time_steps(step, 0, a.iters, spin_ms=20.0, pause_s=0.3)
                row.update(gpu_ms=round(statistics.median(g), 3), cool_ms=round(statistics.median(c), 3))
                print(f"  step detail: {row['ms']:.3f} ms timed, {row['gpu_ms']:.3f} ms with the host's lead "
                      f"hidden, {row['cool_ms']:.3f} ms after 0.3 s idle", flush=True)
            if mode.startswith("evt"):
                B.reset_stats()
                step()
                torch.cuda.synchronize()
                row["captures_per_step"] = B.STATS.get("captures", 0)
            if mode != "eager" and ref_grads is not None:
                # the gradient again after the timed steps (same weights: no optimizer step): what the
                # steady state computes (reused launches, CUDA-graph replays), not only the first call
                m.zero_grad(set_to_none=True)
                step()
                torch.cuda.synchronize()
                row["grad_rel_steady"], row["grad_worst_steady"] = _grad_rel(m, ref_grads)
            row["peak_alloc_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
            free, total = torch.cuda.mem_get_info()
            row["device_used_gib"] = round((total - free) / 2**30, 2)
            row["host_ms"] = _host_time(step)
            if not a.no_profile:
                row["kernels"], row["kernel_ms"] = _kernels_in_one_step(step)
            if a.host_profile and mode != "eager" or a.host_profile > 1:
                _host_time(step, 3, 25)
            if mode != "eager" and not a.quick:
                torch._dynamo.reset()
                f2 = _compile(m, mode)
                step2 = _step_fn(f2, args, amp, m.parameters())
                t0 = time.time()
                step2()
                torch.cuda.synchronize()
                row["compile_warm_s"] = round(max(time.time() - t0 - med / 1e3, 0.0), 2)
            if mode.startswith("evt"):
                ops_evt = ops_torch = 0
                for msg in cap.msgs:
                    if " evt segment(s)" in msg:  # "<kind>: N ops in K evt segment(s) (...), M in PyTorch"
                        parts = msg.split()
                        ops_evt += int(parts[parts.index("ops") - 1])
                        ops_torch += int(parts[parts.index("PyTorch") - 2])
                fb, why = {}, {}
                for msg in cap.msgs:
                    if "fallback to PyTorch:" in msg:
                        rest = msg.split("fallback to PyTorch: ")[1]
                        op = rest.split(" ")[0]
                        fb[op] = fb.get(op, 0) + 1
                        why.setdefault(op, rest.split("): ", 1)[-1][:160])
                top = sorted(fb.items(), key=lambda kv: -kv[1])[:12]
                row.update(ops_in_evt=ops_evt, ops_in_pytorch=ops_torch, fallback_ops=dict(top),
                           fallback_reasons={k: why[k] for k, _ in top})
                if row.get("gpu_segments", 0) == 0 and row.get("interp_segments", 0) == 0:
                    row["status"] = ("evt cannot run it: no evt segment" if ops_evt == 0 else
                                     "evt cannot run it: every segment ran in PyTorch")
        except Exception as e:  # noqa: BLE001 (a failure is a result)
            row["error"] = f"{type(e).__name__}: {e}"[:600]
        row["mode_s"] = round(time.time() - t_mode, 1)
        evt_log.removeHandler(cap)
        rows.append(row)
        print(json.dumps(row), flush=True)
        if a.json:  # (each mode as it ends: a timeout keeps the modes done)
            with open(a.json, "a") as fh:
                fh.write(json.dumps(row) + "\n")
        m = args = f = step = None
    return rows


# ---- parent: run the children, write the report -----------------------------------------------------

def _speedups(rows):
    by = {(r["workload"], r["mode"]): r for r in rows}
    for r in rows:
        e, i = by.get((r["workload"], "eager")), by.get((r["workload"], "inductor"))
        if "ms" in r and e and "ms" in e:
            r["x_eager"] = round(e["ms"] / r["ms"], 3)
        if "ms" in r and i and "ms" in i:
            r["x_inductor"] = round(i["ms"] / r["ms"], 3)


def _ratio(x):
    """A speedup cell: '1.23x', or '–' when the reference mode has no time (not run, timed out)."""
    return f"{x:.2f}x" if isinstance(x, (int, float)) and x > 0 else "–"


def render(result, base):
    rows = result["rows"]
    _speedups(rows)
    lines = [f"# End-to-end training step: eager vs torch.compile vs evt ({result.get('device', '?')})", "",
             f"Command: `{result.get('command', '')}`  ", f"torch {result.get('torch', '?')}, "
             f"{result.get('date', '')}. Median of {result.get('iters', '?')} steps (forward + backward, "
             f"bf16 autocast except the GCNs), dropout {'as in the paper' if result.get('dropout') else 'off'}. "
             "grad rel: max over parameters of max|g - g_eager| / max|g_eager| after one step from the same "
             "weights (first call / again after the timed steps, when both were measured); fp32 (E2E_FP32_REF=1): the "
             "same against one eager step without autocast or TF32, eager's row its own bf16 error, the noise to "
             "compare with. kernels/step: launches "
             "and GPU kernel time of one profiled step (ms/step minus it: host-side gaps); host: milliseconds until "
             "step() returns, the GPU idle at its start (close to ms/step: the step is host-bound); GPU: the step "
             "timed with the host's lead hidden (E2E_STEP_DETAIL=1). Memory: torch allocator "
             "peak / device memory in use (includes evt's arenas).", "",
             "| workload | mode | ms/step | vs eager | vs compile | peak GiB (alloc/device) | compile s (cold/warm) "
             "| kernels/step | grad rel | evt: ops evt/PyTorch, launches, captures[, input copies] | status |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "ms" not in r:
            lines.append(f"| {r['workload']} | {r['mode']} | – | | | | | | | | {r.get('error', r.get('status', 'not run'))} |")
            continue
        g, g2 = r.get("grad_rel"), r.get("grad_rel_steady")
        gs = "–" if g is None else f"{g:.1e}" if g2 is None else f"{g:.1e} / {g2:.1e}"
        if r.get("grad_rel_fp32") is not None:  # (E2E_FP32_REF=1: the distance to the fp32 step, eager's too)
            gs = (f"{gs}; " if g is not None else "") + f"fp32 {r['grad_rel_fp32']:.1e}"
        evtcol = ""
        if r["mode"].startswith("evt"):
            evtcol = (f"{r.get('ops_in_evt', 0)}/{r.get('ops_in_pytorch', 0)}, {r.get('evt_launches', 0)}, "
                      f"{r.get('captures_per_step', '-')}")
            if "input_copies" in r:
                evtcol += f", {r['input_copies']}"
        k = r.get("kernels", "–")
        if r["mode"].startswith("evt") and "evt_launches" in r:
            k = f"{k} ({r['evt_launches']} evt)"
        if r.get("kernel_ms"):
            k = f"{k}; {r['kernel_ms']:.1f} ms"
        if r.get("host_ms"):
            k = f"{k}; host {r['host_ms']:.1f} ms"
        if r.get("gpu_ms"):
            k = f"{k}; GPU {r['gpu_ms']:.1f} ms"
        status = r.get("status", r.get("error", ""))
        if r.get("tune_s") is not None:
            status = (status + "; " if status else "") + f"tuned (tuning step {r['tune_s']} s)"
        lines.append(
            f"| {r['workload']} | {r['mode']} | {r['ms']:.2f} | {_ratio(r.get('x_eager'))} | "
            f"{_ratio(r.get('x_inductor'))} | {r.get('peak_alloc_gib', '–')}/{r.get('device_used_gib', '–')} | "
            f"{r.get('compile_cold_s', '–')}/{r.get('compile_warm_s', '–')} | {k} | {gs} | {evtcol} | "
            f"{status} |")
    fb = [(r["workload"], r["mode"], r["fallback_ops"], r.get("fallback_reasons", {})) for r in rows
          if r.get("fallback_ops")]
    if fb:
        lines += ["", "Ops that ran in PyTorch under evt (most frequent first; the reason of the first):", ""]
        for w, m, ops, why in fb:
            lines.append(f"- {w} ({m}): " + "; ".join(f"{k} x{v}" + (f" ({why[k]})" if why.get(k) else "")
                                                      for k, v in ops.items()))
    md = "\n".join(lines) + "\n"
    with open(base + ".md", "w") as f:
        f.write(md)
    png = _chart(rows, base + ".png")
    return md, png


def _chart(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    wls = [w for w in dict.fromkeys(r["workload"] for r in rows)]
    seen = list(dict.fromkeys(r["mode"] for r in rows))  # (a result of older modes renders too)
    modes = [m for m in ALL_MODES if m in seen] + [m for m in seen if m not in ALL_MODES]
    fig, ax = plt.subplots(figsize=(1.8 * len(wls) + 2, 4))
    width = 0.8 / max(len(modes), 1)
    for j, mode in enumerate(modes):
        xs, ys = [], []
        for i, w in enumerate(wls):
            r = next((r for r in rows if r["workload"] == w and r["mode"] == mode), None)
            if r and r.get("x_eager"):
                xs.append(i + j * width)
                ys.append(r["x_eager"])
        ax.bar(xs, ys, width, label=mode)
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xticks([i + width * (len(modes) - 1) / 2 for i in range(len(wls))])
    ax.set_xticklabels(wls)
    ax.set_ylabel("speedup over eager (x)")
    ax.set_title("training step (fwd+bwd), H200")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workloads", default=None, help="comma list (default: all; --quick: a subset)")
    ap.add_argument("--modes", default=None, help="comma list of " + ",".join(ALL_MODES))
    ap.add_argument("--autotune", action="store_true", help="add torch.compile max-autotune (slow to compile)")
    ap.add_argument("--cudagraphs", action="store_true", help="add evt with options={'cudagraphs': True}")
    ap.add_argument("--quick", action="store_true", help="3 warm-up + 5 timed steps, no warm compile, a subset")
    ap.add_argument("--iters", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--timeout", type=float, default=900, help="seconds per workload (all its modes)")
    ap.add_argument("--budget", type=float, default=None, help="seconds for the whole run")
    ap.add_argument("--dropout", action="store_true", help="paper dropout rates (no gradient check)")
    ap.add_argument("--scale", type=float, default=1.0, help="shrink batch sizes (smoke tests)")
    ap.add_argument("--no-profile", action="store_true", help="skip the kernel count")
    ap.add_argument("--host-profile", type=int, default=0,
                    help="1: cProfile 3 steps of each compiled mode (top functions by own host time); 2: eager too")
    ap.add_argument("--tune", type=int, default=0,
                    help="N > 0: before the timed modes, one evt step per workload with options={'tune': N} (evt's autotuner: "
                         "N mainloop configs per GEMM kernel against cuBLAS, records in the JIT cache, which the evt "
                         "modes then read); the rows get tune_s")
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "logs"))
    ap.add_argument("--tag", default=None)
    ap.add_argument("--render", default=None, help="re-render a JSON result (markdown + PNG)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--json", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.iters = a.iters or (5 if a.quick else 20)
    a.warmup = a.warmup if a.warmup is not None else (2 if a.quick else 3)
    # order: evt right after eager, so that a workload cut short by its timeout still has evt's row
    modes = a.modes.split(",") if a.modes else ["eager", "evt", "inductor"]
    if a.cudagraphs and "evt_cg" not in modes:
        modes.insert(modes.index("evt") + 1 if "evt" in modes else len(modes), "evt_cg")
    if a.autotune and "autotune" not in modes:
        modes.append("autotune")
    if "eager" in modes:
        modes = ["eager"] + [m for m in modes if m != "eager"]
    bad = [m for m in modes if m not in ALL_MODES]
    if bad:
        ap.error(f"unknown mode(s) {bad}")

    if a.render:
        if a.render.endswith(".json"):
            result, base = json.load(open(a.render)), os.path.splitext(a.render)[0]
        else:  # a GPU window's log: the last E2E_JSON line, written to --out/e2e_<--tag>.json
            lines = [ln for ln in open(a.render) if ln.startswith("E2E_JSON ")]
            if not lines:
                ap.error(f"{a.render}: no E2E_JSON line")
            result = json.loads(lines[-1][len("E2E_JSON "):])
            base = os.path.join(a.out, f"e2e_{a.tag or 'window'}")
            os.makedirs(a.out, exist_ok=True)
            with open(base + ".json", "w") as f:
                json.dump(result, f, indent=1)
        md, png = render(result, base)
        print(md)
        print("chart:", png or "matplotlib not available")
        return

    if a.child:
        run_workload(a.child, modes, a)
        return

    # (the parent never imports torch: in a short GPU window its seconds go to the workloads)
    wls = a.workloads.split(",") if a.workloads else list(QUICK_WORKLOADS if a.quick else WORKLOADS)
    os.makedirs(a.out, exist_ok=True)
    tag = a.tag or time.strftime("%Y%m%d_%H%M%S", time.gmtime())
    tmp = os.path.join(a.out, f".e2e_{tag}.jsonl")
    start = time.time()
    rows = []
    for i, w in enumerate(wls):
        left = (a.budget - (time.time() - start)) if a.budget else None
        to = a.timeout if left is None else min(a.timeout, left / (len(wls) - i))
        if to < 20:
            rows += [dict(workload=w, mode=m, error="not run: no time left in the budget") for m in modes]
            continue
        print(f"== {w}: {','.join(modes)} (timeout {to:.0f}s)", flush=True)
        cmd = [sys.executable, os.path.abspath(__file__), "--child", w, "--json", tmp, "--modes", ",".join(modes),
               "--iters", str(a.iters), "--warmup", str(a.warmup), "--scale", str(a.scale)]
        cmd += [f for f, on in (("--quick", a.quick), ("--dropout", a.dropout), ("--no-profile", a.no_profile)) if on]
        cmd += ["--host-profile", str(a.host_profile)] if a.host_profile else []
        cmd += ["--tune", str(a.tune)] if a.tune else []
        before = _read_rows(tmp)
        # the child in a session of its own: a timeout kills it with everything it started (nvcc JIT jobs),
        # so nothing keeps compiling into the next workload's time
        child = subprocess.Popen(cmd, start_new_session=True)
        try:
            child.wait(timeout=to)
            status = None
        except subprocess.TimeoutExpired:
            status = f"timeout after {to:.0f}s"
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            child.wait()
        got = _read_rows(tmp)[len(before):]
        done = {r["mode"] for r in got}
        for m in modes:
            if m not in done:
                got.append(dict(workload=w, mode=m, error=status or "child process died (see the log above)"))
        rows += got
    env = next((r for r in rows if "torch" in r), {})
    result = dict(command="python3 bench/e2e/run.py " + " ".join(sys.argv[1:]), torch=env.get("torch", "?"),
                  device=env.get("device", "?"),
                  date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), iters=a.iters,
                  dropout=a.dropout, modes=modes, rows=rows)
    _speedups(rows)
    base = os.path.join(a.out, f"e2e_{tag}")
    with open(base + ".json", "w") as f:
        json.dump(result, f, indent=1)
    md, png = render(result, base)
    print("\n" + md)
    print("E2E_JSON " + json.dumps(result))  # (the GPU window returns only the log: the JSON travels in it)
    print(f"wrote {base}.json, {base}.md, {png or '(no PNG: matplotlib not available)'}")
    if os.path.exists(tmp):
        os.remove(tmp)


def _read_rows(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


if __name__ == "__main__":
    main()
