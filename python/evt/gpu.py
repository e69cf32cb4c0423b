"""GPU path of the torch.compile backend: a segment on CUDA tensors runs as an evt GPU program.

Contract
- Program(text, flags) parses an already pass-optimized segment text into a graph of its own and creates its
  evt_program with EVT_PROGRAM_NO_OPT (include/evt.h). A failure raises ProgramError with the library's message,
  which names the node when a node is the reason, so the caller can move that node to PyTorch.
- Program.run(inputs, outputs, stream) binds device pointers (inputs by node name, outputs by index) and
  enqueues the step on `stream` (a cudaStream_t as an int); it does not synchronize. Its arena (the values a run
  computes and drops, and its scratch) comes from PyTorch's caching allocator for that run (evt_program_bind_arena), so segments
  and PyTorch's own tensors share one pool instead of each program holding its arena for good; a program with
  its own CUDA graph (EVT_PROGRAM_CUDA_GRAPH) keeps an arena of its own (a new address would re-capture it).
- evt_program's memory contract: dense row-major in the node's dtype, integers as i64, bool as u8, fp8 as
  PyTorch's float8_e4m3fn / float8_e5m2 bytes (device_dtype, bindable, to_device_layout).
- program_flags / tune_configs turn the backend options (config.parse_options) into evt_program flags and the
  autotuner's candidate count; prefetch / tune compile and measure every segment's kernels in one batch.
- OutputPool keeps stable output buffers for CUDA-graph replay (see the class).
- Programs are created with evt_options (include/evt.h): the flags, and refine_partition (refine_level: 1 splits
  a group the lowering refuses around the node it names, so the rest still runs as a generated kernel; 2, when
  batch norms run in evt, isolates every per-channel member of a refused group at once).
"""
import ctypes
import json

import torch

from . import config
from . import lib as L

EVT_PROGRAM_FUSED = 1
EVT_PROGRAM_CUDA_GRAPH = 2
EVT_PROGRAM_NO_OPT = 4


class EvtOptions(ctypes.Structure):
    """evt_options of include/evt.h (filled by evt_options_init, then by options_for)."""
    _fields_ = [("flags", ctypes.c_uint), ("refine_partition", ctypes.c_int), ("fusion_ab", ctypes.c_int),
                ("arch", ctypes.c_int), ("ptx", ctypes.c_int), ("fp8", ctypes.c_int),
                ("tf32", ctypes.c_int)]

# Outputs of at most this many elements are copied out of a private buffer under CUDA graphs.
SMALL_OUTPUT = 1 << 16


class ProgramError(L.EvtError):
    pass


TUNE_DEFAULT_CONFIGS = 4
# Without options["tune"], every GEMM group is measured with one config, the one it runs untuned: the tuner
# times that kernel at the tile scheduler's swizzle / raster variants and against the unfused alternative
# (cuBLASLt + a generated row kernel) and records the fastest; a few seconds per problem, once (the records
# are cached on disk).
TUNE_BY_DEFAULT = 1


def tune_configs(options, cuda=None):
    """Candidate mainloop configs per GEMM kernel the autotuner compiles before the GPU programs are created
    (evt_program_tune): options["tune"] (True: TUNE_DEFAULT_CONFIGS, a number: that many, False / 0: off), else
    TUNE_BY_DEFAULT where CUDA is available (`cuda`, default torch.cuda.is_available(); without a GPU there is
    nothing to measure). Records are cached; a record of fewer configs than asked for is measured again."""
    tune = config.parse_options(options)["tune"]
    if tune is None:
        if cuda is None:
            cuda = torch.cuda.is_available()
        return TUNE_BY_DEFAULT if cuda else 0
    if tune is True:
        return TUNE_DEFAULT_CONFIGS
    return max(0, int(tune))


def tune_asked(options):
    """True when options["tune"] was given: a tuning that fails (no nvcc, no CUTLASS) is then worth a warning; at
    the default level it is logged at INFO."""
    return config.parse_options(options)["tune"] is not None


def refine_level(options):
    """evt_options.refine_partition for these backend options: 2 when batch norms run in evt, else 1."""
    return 2 if config.gpu_family_in_evt(options, "batch_norm") else 1


def options_for(flags, refine, arch=None, fp8=None, tf32=False):
    """The evt_options a program of these flags, refine level, GPU target (options["arch"], parsed by
    evt_arch_parse; None: the present GPU's), fp8 recipe (options["fp8"]) and TF32 setting (config.tf32) is created
    with (NO_OPT always: the backend ran the passes)."""
    o = EvtOptions()
    L._declare("evt_options_init", None, [ctypes.POINTER(EvtOptions)])(ctypes.byref(o))
    o.flags = flags | EVT_PROGRAM_NO_OPT
    o.refine_partition = refine
    o.fp8 = config.FP8_RECIPES[fp8]
    o.tf32 = int(bool(tf32))
    if arch is not None:
        a, p = ctypes.c_int(0), ctypes.c_int(0)
        parse = L._declare("evt_arch_parse", ctypes.c_int,
                           [ctypes.c_char_p, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)])
        if parse(arch.encode(), ctypes.byref(a), ctypes.byref(p)) != 0:
            raise ValueError(f"evt backend: unknown arch {arch!r}")
        o.arch, o.ptx = a.value, p.value
    return o


def program_flags(options):
    """evt_program flags: FUSED unless options["fused"] is False; CUDA_GRAPH when options["cudagraphs"] is
    "segments" (under "step" PyTorch captures the whole step: a program must not capture on its own); NO_OPT
    always (the backend ran the passes)."""
    opts = config.parse_options(options)
    flags = EVT_PROGRAM_NO_OPT
    if opts["fused"]:
        flags |= EVT_PROGRAM_FUSED
    if opts["cudagraphs"] == "segments":
        flags |= EVT_PROGRAM_CUDA_GRAPH
    return flags


def device_dtype(dtype):
    """The torch dtype of evt's device representation of a torch dtype (integers are i64)."""
    if dtype in (torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8):
        return torch.int64
    if dtype in (torch.float32, torch.float16, torch.bfloat16, torch.bool) + L.FP8_DTYPES:
        return dtype
    raise ProgramError(f"dtype {dtype} has no evt device representation")


def bindable(t):
    """True when t can be bound as it is: dense row-major, in evt's dtype, 16-byte aligned (a view at an
    odd offset would keep the generated kernels off their vector loads and CUTLASS off the GEMM)."""
    return t.dtype == device_dtype(t.dtype) and t.is_contiguous() and t.data_ptr() % 16 == 0


def to_device_layout(t):
    """t as evt's program reads it: dense row-major, in device_dtype(t.dtype), 16-byte aligned."""
    if bindable(t):
        return t
    dt = device_dtype(t.dtype)
    return torch.empty(t.shape, dtype=dt, device=t.device).copy_(t)


def has_program_api():
    """True when the loaded libevt exports the GPU program API (evt_program_create). No libevt at all raises
    LibraryError (a configuration error, not a reason to run the model in PyTorch)."""
    return hasattr(L.lib(), "evt_program_create")


def choose_path(device_type, program_api):
    """'interp' (CPU interpreter), 'gpu' (evt program) or 'torch' (the segment runs in PyTorch)."""
    if device_type == "cpu":
        return "interp"
    if device_type == "cuda" and program_api:
        return "gpu"
    return "torch"


def _api():
    lib = L.lib()
    P = ctypes.c_void_p
    sigs = {
        "evt_program_create": (ctypes.c_int, [P, ctypes.c_uint, ctypes.POINTER(P)]),
        "evt_program_create_opts": (ctypes.c_int, [P, ctypes.POINTER(EvtOptions), ctypes.POINTER(P)]),
        "evt_program_bind": (ctypes.c_int, [P, ctypes.c_char_p, P]),
        "evt_program_bind_output": (ctypes.c_int, [P, ctypes.c_int, P]),
        "evt_program_run": (ctypes.c_int, [P, P]),
        "evt_program_bind_arena": (ctypes.c_int, [P, P, ctypes.c_int64]),
        "evt_program_arena_bytes": (ctypes.c_int64, [P]),
        "evt_program_error": (ctypes.c_char_p, [P]),
        "evt_program_launch_count": (ctypes.c_int, [P]),
        "evt_program_destroy": (None, [P]),
    }
    for name, (res, args) in sigs.items():
        L._declare(name, res, args)
    return lib


class Program:
    """One evt GPU program for one segment text (owns its graph and the evt_program)."""

    def __init__(self, text, flags, name="<segment>", host=False, refine=1, arch=None, tf32=False):
        """host=True: evt_program_create_host_opts, the same plan without a device (tests: runs fail)."""
        lib = _api()
        self.flags = flags
        self.graph = L.Graph(text, name)  # a graph of its own: the program may keep pointers into it
        self._p = None
        p = ctypes.c_void_p()
        create = lib.evt_program_create_opts
        if host:
            create = L._declare("evt_program_create_host_opts", ctypes.c_int,
                                [ctypes.c_void_p, ctypes.POINTER(EvtOptions), ctypes.POINTER(ctypes.c_void_p)])
        st = create(self.graph._g, ctypes.byref(options_for(flags, refine, arch, tf32=tf32)), ctypes.byref(p))
        if st != 0 or not p.value:
            msg = lib.evt_graph_error(self.graph._g).decode() if self.graph._g else ""
            if p.value:
                msg = lib.evt_program_error(p).decode() or msg
                lib.evt_program_destroy(p)
            raise ProgramError(msg or f"evt_program_create failed (status {st})")
        self._p = p
        self._names = {}      # input name -> its bytes (bound at every run)
        self.runs = 0
        self.captures = 0     # CUDA graphs: runs whose bindings differed from the previous run's (the first
        #                       run is eager, the next captures: evt_program_run)
        self._last = None

    def report(self):
        """evt_program_report: the program's plan as a dict (groups with their paths and nodes), None without one."""
        fn = L._declare("evt_program_report", ctypes.c_void_p, [ctypes.c_void_p])
        text = L.take_string(fn(self._p)) if fn is not None else None
        return json.loads(text) if text else None

    def _err(self, what):
        return ProgramError(f"{what}: {L.lib().evt_program_error(self._p).decode()}")

    def run(self, inputs, outputs, stream):
        """inputs: [(node name, tensor)], outputs: [tensor per graph output]; tensors already in the
        device layout. Enqueues the step on `stream` (int cudaStream_t)."""
        lib = L.lib()
        bind, bind_out, p, enc = lib.evt_program_bind, lib.evt_program_bind_output, self._p, self._names
        ptrs = []
        for name, t in inputs:
            ptr = t.data_ptr()
            b = enc.get(name)
            if b is None:
                b = enc[name] = name.encode()
            if bind(p, b, ptr) != 0:
                raise self._err(f"bind {name}")
            ptrs.append(ptr)
        for i, t in enumerate(outputs):
            ptr = t.data_ptr()
            if bind_out(p, i, ptr) != 0:
                raise self._err(f"bind output {i}")
            ptrs.append(ptr)
        key = tuple(ptrs)
        if key != self._last and self.flags & EVT_PROGRAM_CUDA_GRAPH:
            self.captures += 1
        self._last = key
        arena = self._pool_arena(outputs)
        if lib.evt_program_run(self._p, stream) != 0:
            raise self._err("run")
        self.runs += 1
        del arena  # back to the pool once the stream has run this step (stream-ordered reuse)

    def _pool_arena(self, outputs):
        """Binds this run's arena from PyTorch's allocator (kept by the caller until the run is enqueued); None
        where the program keeps its own: its own CUDA graph, or no arena. A program allocates its own only at a
        run that finds none bound, so one pooled from its first run never holds device memory of its own (and
        binding inside a stream capture frees nothing)."""
        lib = L.lib()
        n = int(lib.evt_program_arena_bytes(self._p))
        if self.flags & EVT_PROGRAM_CUDA_GRAPH or n <= 0 or not outputs or outputs[0].device.type != "cuda":
            return None
        arena = torch.empty(n, dtype=torch.uint8, device=outputs[0].device)
        if lib.evt_program_bind_arena(self._p, arena.data_ptr(), n) != 0:
            raise self._err("bind the arena")
        return arena

    def launch_count(self):
        return int(L.lib().evt_program_launch_count(self._p))

    def set_rng_step(self, step, stream):
        """The RNG step of the next run (evt_program_set_rng_step, enqueued on `stream`)."""
        f = L._declare("evt_program_set_rng_step", ctypes.c_int, [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_void_p])
        if f(self._p, step, stream) != 0:
            raise self._err("set the RNG step")

    def __del__(self):
        p = getattr(self, "_p", None)
        if p is not None and L._lib is not None:
            L._lib.evt_program_destroy(p)
            self._p = None


def prefetch(texts, flags, refine=1, arch=None, tf32=False):
    """One JIT batch for the kernels of every program about to be created from `texts` (optimized segment
    texts, as Program takes them): evt_program_prefetch. Returns the number of distinct kernels compiled or
    cached; 0 when nothing is fused, there is nothing to do, or the library predates the call."""
    if not texts or not flags & EVT_PROGRAM_FUSED:
        return 0
    lib = L.lib()
    if not hasattr(lib, "evt_program_prefetch_opts"):
        return 0
    fn = L._declare("evt_program_prefetch_opts", ctypes.c_int,
                    [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.POINTER(EvtOptions)])
    graphs = [L.Graph(t, f"<prefetch {i}>") for i, t in enumerate(texts)]
    arr = (ctypes.c_void_p * len(graphs))(*[g._g for g in graphs])
    return int(fn(arr, len(graphs), ctypes.byref(options_for(flags, refine, arch, tf32=tf32))))


def tune(texts, flags, max_configs, refine=1, arch=None, tf32=False):
    """evt_program_tune over the programs about to be created from `texts` (include/evt.h): (status, distinct
    GEMM problems, message). Status 0 when every problem has a tuning record (measured now or before); the
    message says why not (no GPU, no nvcc / CUTLASS, a failed measurement). A library without the call: (-1, 0, why)."""
    if not texts or not flags & EVT_PROGRAM_FUSED or max_configs <= 0:
        return 0, 0, ""
    lib = L.lib()
    if not hasattr(lib, "evt_program_tune_opts"):
        return -1, 0, "libevt has no evt_program_tune_opts"
    fn = L._declare("evt_program_tune_opts", ctypes.c_int,
                    [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.POINTER(EvtOptions), ctypes.c_int,
                     ctypes.POINTER(ctypes.c_int), ctypes.c_char_p, ctypes.c_size_t])
    graphs = [L.Graph(t, f"<tune {i}>") for i, t in enumerate(texts)]
    arr = (ctypes.c_void_p * len(graphs))(*[g._g for g in graphs])
    n = ctypes.c_int(0)
    msg = ctypes.create_string_buffer(1024)
    st = int(fn(arr, len(graphs), ctypes.byref(options_for(flags, refine, arch, tf32=tf32)), int(max_configs), ctypes.byref(n), msg,
                len(msg)))
    return st, n.value, msg.value.decode(errors="replace")


def _use_count(t):
    return torch._C._storage_Use_Count(t.untyped_storage()._cdata)


class OutputPool:
    """Stable output buffers for CUDA-graph replay. A captured graph replays with the pointers bound at capture,
    so each output keeps a base buffer that is bound again whenever it is free: no tensor handed out from it is
    alive (the storage's use count is the pool's own reference; the caller gets a fresh view, and whatever keeps
    it, autograd's saved tensors included, holds that view). A busy buffer is replaced by a new one (the program
    then captures again). Small outputs (the loss, statistics) go to a private buffer that is never handed out
    and are returned as copies, so they never force a capture."""

    def __init__(self):
        self.base = {}    # output index -> the pool's own tensor
        self.idle = None  # use count of a buffer nobody else holds (measured once)

    def _free(self, buf):
        if self.idle is None:
            probe = torch.empty(1, device=buf.device)
            self.idle = _use_count(probe)
        return _use_count(buf) <= self.idle

    def get(self, i, shape, dtype, device):
        """(buffer to bind, handed_out): handed_out is False for a small output (copy it out)."""
        buf = self.base.get(i)
        small = int(torch.Size(shape).numel()) <= SMALL_OUTPUT
        if buf is None or (not small and not self._free(buf)):
            buf = torch.empty(shape, dtype=dtype, device=device)
            self.base[i] = buf
        return buf, not small

    @staticmethod
    def hand_out(buf, handed_out):
        """The tensor the caller gets for a buffer bound by get()."""
        return buf.view(buf.shape) if handed_out else buf.clone()
