"""The configuration of the evt package: the backend's options dict and the few environment variables it reads.

Contract: this is the only module of the package that reads os.environ, and no module writes it (except the one
line of gpu.py that configures libevt until libevt takes its options through its API). The environment is read
at each call, so a process can change it between compilations. docs/pytorch.md documents every key and variable.
"""
import logging
import os

# ---- environment --------------------------------------------------------------------------------------


def library_override():
    """$EVT_LIB: the libevt.so to load instead of <repo>/build/libevt.so, or None."""
    return os.environ.get("EVT_LIB") or None


def log_level():
    """The level $EVT_LOG asks for the `evt` logger: None when unset, empty or "0"; "1" is INFO; a level name
    (debug, info, warning, ...) that level."""
    v = os.environ.get("EVT_LOG", "").strip()
    if v in ("", "0"):
        return None
    if v == "1":
        return logging.INFO
    level = logging.getLevelName(v.upper())
    return level if isinstance(level, int) else logging.INFO


def configure_logging(log):
    """Gives the `evt` logger a stderr handler at log_level(), unless EVT_LOG is off or it has handlers."""
    level = log_level()
    if level is None or log.handlers:
        return
    h = logging.StreamHandler()
    h.setFormatter(logging.Formatter("[evt] %(message)s"))
    log.addHandler(h)
    log.setLevel(level)


def cache_enabled():
    """False when EVT_CACHE is "0" or empty: the disk caches are neither read nor written."""
    return os.environ.get("EVT_CACHE", "1") not in ("", "0")


def cache_root():
    """$EVT_CACHE_DIR, else $XDG_CACHE_HOME/evt, else $HOME/.cache/evt, else /tmp/evt-cache-<uid> (as the C side:
    src/util/env.c)."""
    d = os.environ.get("EVT_CACHE_DIR")
    if d:
        return d
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return os.path.join(xdg, "evt")
    home = os.environ.get("HOME")
    return os.path.join(home, ".cache", "evt") if home else f"/tmp/evt-cache-{os.getuid()}"


def torch_cache_dir():
    """Where the torch backend's compiled segments are stored (diskcache.py)."""
    return os.path.join(cache_root(), "torch")


# Tests set this to apply the CUDA placement and layout rules to CPU tensors as well, so the rules' rewrites
# can be checked end to end on the interpreter. It is no option: a user never wants it.
SIMULATE_CUDA_RULES = False


# ---- the backend's options: torch.compile(model, backend="evt", options={...}) ---------------------------

# options["cudagraphs"] -> its mode: False (none), "step" (the forward and the backward each replayed as one
# CUDA graph through PyTorch's CUDA-graph trees, cudagraphs.py), "segments" (each evt GPU program captured on
# its own; PyTorch's ops between them run eagerly).
CUDAGRAPHS = {False: False, None: False, True: "step", "step": "step", "segments": "segments"}

# The op families that evt can run on CUDA but that run in PyTorch unless options["gpu_ops"] names them
# (placement.py says why for each). "fast", the default, keeps dropout only: evt draws its masks in the row
# kernels it runs anyway. "all" keeps every family and also turns off the shape rules (unaligned or long
# rows, partial broadcasts, large data moves), so that every translatable op runs in evt.
GPU_OP_FAMILIES = ("attention", "batch_norm", "convolution", "dropout", "embedding", "pooling")
GPU_OPS_FAST = ("dropout",)

OPTIONS = ("arch", "backward_cut_mib", "check", "cudagraphs", "dump", "fp8", "fused", "gpu_ops", "tf32", "tune")
DEFAULTS = {"arch": None, "backward_cut_mib": 0, "check": False, "cudagraphs": False, "dump": None, "fp8": None,
            "fused": True, "gpu_ops": GPU_OPS_FAST, "tf32": None, "tune": None}
# options["fp8"] -> evt_options.fp8 (include/evt.h): None (off) or "tensorwise" (eligible GEMMs in FP8 with per-tensor
# current scaling: the fp8 pass, run with the graph passes as pass flag EVT_PASS_FP8 of src/passes/passes.h)
FP8_RECIPES = {None: 0, "tensorwise": 1}
EVT_PASS_FP8 = 2


def fp8_pass_flags(options):
    """The graph-pass flags of options["fp8"]: EVT_PASS_FP8 when a recipe is on, else 0."""
    return EVT_PASS_FP8 if parse_options(options)["fp8"] else 0


def tf32(options):
    """evt_options.tf32 for these options (GEMMs of f32 operands on TF32 tensor cores, docs/codegen.md "TF32"):
    options["tf32"] when given, else torch.backends.cuda.matmul.allow_tf32 as it is now (read when a segment's
    program is made, i.e. at compile time)."""
    v = parse_options(options)["tf32"]
    if v is None:
        import torch
        v = bool(torch.backends.cuda.matmul.allow_tf32)
    return v


# options["arch"]: the GPU target of evt's generated kernels (evt_options.arch / ptx, evt_arch_parse): None = the
# present GPU's; "sm_80" / "sm_86" / "sm_89" (Ampere / Ada), "sm_90a", or "compute_XX" (PTX only)
ARCHS = ("auto", "sm_80", "sm_86", "sm_89", "sm_90a", "sm_90", "compute_80", "compute_86", "compute_89", "compute_90a")


def _gpu_ops(v):
    if v is None or v == "fast":
        return GPU_OPS_FAST
    if v == "all":
        return "all"
    if isinstance(v, (list, tuple, set, frozenset)) and all(isinstance(f, str) for f in v):
        bad = sorted(set(v) - set(GPU_OP_FAMILIES))
        if not bad:
            return tuple(sorted(set(v)))
        raise ValueError(f"evt backend: unknown gpu_ops famil{'y' if len(bad) == 1 else 'ies'} {bad}; "
                         f"known: {list(GPU_OP_FAMILIES)}")
    raise ValueError(f"evt backend: gpu_ops must be \"fast\", \"all\" or a list of op families from "
                     f"{list(GPU_OP_FAMILIES)}, not {v!r}")


def parse_options(options):
    """The backend's options dict checked, with every key present (DEFAULTS for those not given). Idempotent.
    Raises ValueError naming an unknown key or a bad value."""
    options = dict(options or {})
    unknown = set(options) - set(OPTIONS)
    if unknown:
        raise ValueError(f"evt backend: unknown option(s) {sorted(unknown)}; known: {list(OPTIONS)}")
    cg = options.get("cudagraphs", False)
    if not isinstance(cg, (bool, str, type(None))) or cg not in CUDAGRAPHS:
        raise ValueError(f"evt backend: cudagraphs must be one of {sorted(CUDAGRAPHS, key=str)}, not {cg!r}")
    fused = options.get("fused", True)
    if not isinstance(fused, (bool, type(None))):
        raise ValueError(f"evt backend: fused must be a bool, not {fused!r}")
    tune = options.get("tune")
    if tune is not None and not isinstance(tune, (bool, int)):
        raise ValueError(f"evt backend: tune must be a bool or a number of candidate configs, not {tune!r}")
    check = options.get("check", False)
    if not isinstance(check, bool):
        raise ValueError(f"evt backend: check must be a bool, not {check!r}")
    arch = options.get("arch")
    if arch is not None and arch not in ARCHS:
        raise ValueError(f"evt backend: arch must be one of {list(ARCHS)}, not {arch!r}")
    fp8 = options.get("fp8")
    fp8 = None if fp8 in (False, "off") else fp8
    if fp8 not in FP8_RECIPES:
        raise ValueError(f"evt backend: fp8 must be None, False, \"off\" or \"tensorwise\", not {fp8!r}")
    tf32_ = options.get("tf32")
    if tf32_ is not None and not isinstance(tf32_, bool):
        raise ValueError(f"evt backend: tf32 must be None (PyTorch's allow_tf32) or a bool, not {tf32_!r}")
    cut = options.get("backward_cut_mib", DEFAULTS["backward_cut_mib"])
    if isinstance(cut, bool) or not isinstance(cut, (int, float)) or not cut >= 0:
        raise ValueError(f"evt backend: backward_cut_mib must be a number of MiB >= 0, not {cut!r}")
    dump = options.get("dump")
    if dump is not None and not isinstance(dump, (str, os.PathLike)):
        raise ValueError(f"evt backend: dump must be a directory path, not {dump!r}")
    return {"arch": arch, "backward_cut_mib": cut, "check": check, "cudagraphs": CUDAGRAPHS[cg],
            "dump": os.fspath(dump) if dump is not None else None,
            "fp8": fp8, "fused": fused is not False, "gpu_ops": _gpu_ops(options.get("gpu_ops")), "tf32": tf32_,
            "tune": tune}


def all_gpu_ops(options):
    """True under gpu_ops "all": every translatable CUDA op runs in evt, whatever its family or shape."""
    return parse_options(options)["gpu_ops"] == "all"


def gpu_family_in_evt(options, family):
    """True when the CUDA ops of this family (GPU_OP_FAMILIES) run in evt under these options."""
    ops = parse_options(options)["gpu_ops"]
    return ops == "all" or family in ops
