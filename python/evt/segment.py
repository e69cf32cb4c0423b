"""One evt segment: a run of FX nodes translated into one `.evt` graph, and how it runs.

Contract: Segment.finalize builds the segment's text (inputs, outputs, dense permuted layouts), parses it
(cached by text in memory and on disk: diskcache.py) and, for CUDA tensors, creates its evt GPU program (cached
by optimized text, flags and device). Segment.run computes the members' values into env on the interpreter
(CPU), the GPU program (CUDA) or, when the program cannot run it, PyTorch. STATS counts what ran where.
"""
import collections
import hashlib
import logging
import os
import re
import time
import weakref

import torch
import torch.fx

from . import aten as A
from . import config
from . import diskcache
from . import gpu as G
from . import placement as P
from . import torch_steps as TS
from .lib import FP8_DTYPES, EvtError, Graph

log = logging.getLogger("evt")
aten = torch.ops.aten


# Counters since the last reset_stats(), read by the benchmark and the tests: what ran where (segment runs per
# path, GPU launches, CUDA-graph captures, input copies) and what was compiled: "plans" (module plans built: one
# per compiled module, or per concrete argument signature of a module with symbolic shapes) and
# "segments_compiled" (segment texts parsed and optimized, i.e. not found in the in-memory cache _GRAPHS).
STATS = collections.Counter()


def reset_stats():
    """Zeroes STATS."""
    STATS.clear()


# The CPU interpreter is the reference, not a fast path: the second run of each interpreter segment is timed
# against the same ops in PyTorch (once, outside the step's results), and the first segment that is at least
# SLOW_RATIO times slower (and takes SLOW_MIN_S or more) logs one warning per process.
SLOW_RATIO, SLOW_MIN_S = 3.0, 0.005
_slow_warned = False


def _eager_seconds(members, env):
    """The best of two PyTorch runs of members from env (a scratch copy: env is not touched), or None when a
    member draws random numbers (that would move PyTorch's generator) or PyTorch cannot run one."""
    if any(torch.Tag.nondeterministic_seeded in getattr(m.target, "tags", ()) for m in members):
        return None
    best = None
    try:
        for _ in range(2):
            scratch, t0 = dict(env), time.perf_counter()
            for m in members:
                scratch[m] = TS.run_torch(m, scratch)
            t = time.perf_counter() - t0
            best = t if best is None else min(best, t)
    except Exception:  # noqa: BLE001 (a comparison only: never the step's concern)
        return None
    return best


def release_programs():
    """Drops the cached GPU programs (their device memory goes with the plans that still hold them)."""
    _PROGRAMS.clear()


_GRAPHS = {}  # sha256 of the segment text -> parsed Graph (the text holds every shape and dtype)


def _graph_for(text, dump=None, pass_flags=0):
    """The parsed and pass-optimized graph of a segment text, cached in memory and (config.cache_enabled()) on disk
    (diskcache.py: the optimized text, reused by later processes). dump: a folder that gets the text and its
    optimized form (options["dump"])."""
    key = hashlib.sha256(f"{pass_flags}\0{text}".encode()).hexdigest()
    g = _GRAPHS.get(key)
    if g is None:
        name = f"evt-{key[:12]}.evt"
        dkey = diskcache.key(text, pass_flags) if diskcache.enabled() else None
        g = diskcache.load(dkey, name) if dkey else None
        if g is None:
            optimized = False
            try:
                g = Graph(text, name, optimize=True, pass_flags=pass_flags)
                optimized = True
            except EvtError as e:
                if "no graph passes" not in str(e):
                    log.warning("evt graph passes failed on %s (%s); running it unoptimized", name, e)
            if g is None:
                g = Graph(text, name)
            if dkey:
                diskcache.store(dkey, g, optimized)
        log.info("  segment %s: %d evt nodes, %d after the graph passes", name, g.parsed_nodes, g.node_count)
        _GRAPHS[key] = g
        STATS["segments_compiled"] += 1
    if dump:
        os.makedirs(dump, exist_ok=True)
        for suffix, body in ((".evt", text), (".opt.evt", None)):
            path = os.path.join(dump, key[:16] + suffix)
            if not os.path.exists(path):
                with open(path, "w") as f:
                    f.write(body if body is not None else g.text())
    return g


_DEF = re.compile(r"^%([\w.]+)(?::| =)")


_REF = re.compile(r"%([\w.]+)")


def _used_input_lines(lines, out_names):
    """The segment's statements without those nothing reads, inputs included (repeated until none is left;
    every statement of the text format is pure, the outputs are listed). A value evt only passes on (an alias
    of a PyTorch-made value, which PyTorch then makes as a view: Segment.torch_views) is then no input that every
    run binds (and copies, when it is strided: the cuDNN attention output of every transformer layer)."""
    lines = list(lines)
    while True:
        refs = set(out_names)
        for ln in lines:
            rhs = ln.split("=", 1)[1] if "=" in ln else ln
            refs.update(_REF.findall(rhs))
        keep = [ln for ln in lines if not ((m := _DEF.match(ln)) and m.group(1) not in refs)]
        if len(keep) == len(lines):
            return keep
        lines = keep


# How libevt's error messages name the node that is the reason (the parser's and evt_program_create's).
NODE_IN_MSG = re.compile(r"node %([A-Za-z0-9_.]+)")


class Segment:
    """A run of FX nodes translated into one evt graph, run on the device of its tensors: the CPU interpreter, an
    evt GPU program, or (when the program cannot run it) PyTorch. A CUDA segment never runs on the interpreter.
    At run time a GPU segment's inputs are bound as they are when they fit evt's memory contract (else copied into
    it, counted in STATS["input_copies"]), its outputs are new tensors in the nodes' dtypes with PyTorch's
    recorded strides, and the program is enqueued on the current stream; a run that raises makes the plan run
    the segment in PyTorch from then on."""

    def __init__(self, options=None):
        self.b = A.Builder()
        self.members = []
        self.options = options or {}
        self.b.cuda_attention = config.gpu_family_in_evt(self.options, "attention")
        self.b.transposed_input = P.gemm_only_transposed
        self.path = None      # "interp", "gpu" or "torch" (set by finalize)
        self.free_layout = set()  # FX nodes returned as evt wrote them (contiguous; set by Plan.finalize)
        self.program = None
        self.why = None       # why a CUDA segment runs in PyTorch
        self.torch_views = []  # members that are views of segment inputs, needed outside: PyTorch views

    def finalize(self, users_outside, program_node_fallback=True, defer_program=False):
        """defer_program: leave a GPU segment's program to create_program() (the plan prefetches every
        segment's kernels in one JIT batch first)."""
        b, members = self.b, set(self.members)
        inputs = {name for _, name in b.inputs}
        self.outputs, self.aliases, out_names = [], [], []
        # Views needed outside: a chain of view ops (placement.VIEW_OPS) ending in a member needed outside is made by
        # PyTorch from the chain's base (a segment input, or a member evt then writes as it is): evt's output
        # would be a materialized copy, copied again into PyTorch's recorded strides.
        self.torch_views, bases = [], set()
        for m in self.members:
            name = b.names.get(m)
            if isinstance(name, dict) or name in inputs or m.target not in P.VIEW_OPS or m.meta.get("evt_conv_input_free"):
                continue  # (a view marked to be returned contiguous is written by evt: mark_embedding_grads)
            if not any(u not in members for u in users_outside(m)):
                continue
            chain, x = [], m
            while x in members and x.target in P.VIEW_OPS and x.args and isinstance(x.args[0], torch.fx.Node):
                chain.append(x)
                x = x.args[0]
            if x in members and (isinstance(b.names.get(x), dict) or x.target in P.VIEW_OPS):
                continue  # (the base is a tuple, or a view of a non-tensor)
            if x not in members and x not in {i for i, _ in b.inputs}:
                continue
            for v in reversed(chain):
                if v not in self.torch_views:
                    self.torch_views.append(v)
            if x in members:
                bases.add(x)
        order = {m: i for i, m in enumerate(self.members)}
        self.torch_views.sort(key=order.get)
        torch_made = set(self.torch_views)
        for m in self.members:
            name = b.names.get(m)
            if m in torch_made or isinstance(name, dict):
                continue
            if m not in bases and not any(u not in members for u in users_outside(m)):
                continue
            if name in inputs:
                src = next(x for x, nm in b.inputs if nm == name)
                self.aliases.append((m, src))
                continue
            if name not in out_names:
                out_names.append(name)
            self.outputs.append((m, out_names.index(name)))
        lines = _used_input_lines(b.lines, out_names)
        self.text = "graph seg {\n  " + "\n  ".join(lines) + "\n" + \
            (f"  output {', '.join('%' + n for n in out_names)}\n" if out_names else "") + "}\n"
        self.graph = _graph_for(self.text, self.options.get("dump"), config.fp8_pass_flags(self.options)) \
            if self.outputs else None
        if self.graph is None:
            self.path = "none"
            return
        self.phys_in, self.phys_out = {}, {}  # bound name -> order / output index -> order (see _physical)
        if b.device is not None and P.cuda_rules(b.device):
            self._physical(out_names)
        self.out_index = list(self.outputs)  # (FX node, index of the graph output)
        # the type of each graph output, from the first FX node it holds
        self.out_types = {}
        for m, k in self.out_index:
            v = A.meta_val(m)
            shape = tuple(int(s) for s in v.shape)
            if k in self.phys_out:
                shape = tuple(shape[d] for d in self.phys_out[k])
            self.out_types.setdefault(k, (shape, v.dtype))
        # node ids after the passes renumbered them
        bound = [(x, name + ".phys" if name + ".phys" in self.phys_in else name) for x, name in b.inputs]
        self.inputs = [(x, self.graph.ids[name]) for x, name in bound if name in self.graph.ids]
        self.input_names = [(x, name) for x, name in bound if name in self.graph.ids]
        self.outputs = [(m, self.graph.outputs[k]) for m, k in self.outputs]
        self.int64_inputs = [x for x, _ in self.inputs if A.meta_val(x).dtype == torch.int64]
        # the magnitude the interpreter computes them exactly to (aten.integer_bound: the segment's integer
        # arithmetic assumed INT_INPUT_BOUND; moves and comparisons are exact to 2^53)
        self.int64_limit = A.INT_INPUT_BOUND if b.int_input_checked else A.EXACT_INT
        dev = b.device or torch.device("cpu")
        self.device = dev
        self.path = G.choose_path(dev.type, G.has_program_api())
        if self.path == "torch":
            self.why = f"libevt has no GPU program API (evt_program_create) for {dev}"
        elif self.path == "gpu":
            if defer_program:
                self.pending = program_node_fallback
            else:
                self._create_program(program_node_fallback)

    def create_program(self):
        """The deferred program of finalize(defer_program=True)."""
        node_fallback = getattr(self, "pending", None)
        if node_fallback is not None:
            self.pending = None
            self._create_program(node_fallback)

    def _physical(self, out_names):
        """Channels-last and other dense permuted layouts (CUDA): inputs and outputs whose recorded strides
        are a dense permutation of their shape are declared in their memory order (`%in.x.phys` permuted to
        the logical `%in.x`; an output `%y` written as `permute(%y)`), so the segment binds the memory as it
        is and returns a permuted view with the recorded strides, instead of copying each input to
        row-major and each output back. Taken only when evt's passes cancel every permute (an elementwise
        segment); otherwise the segment keeps its row-major text."""
        b = self.b
        pin = {name: P.dense_order(A.meta_val(x)) for x, name in b.inputs}
        pin = {k: o for k, o in pin.items() if o}
        pout = {}
        for m, k in self.outputs:
            o = P.dense_order(A.meta_val(m)) if m not in self.free_layout else None
            if o and pout.get(k, o) == o:
                pout[k] = o
            else:
                pout[k] = None
        pout = {k: o for k, o in pout.items() if o}
        if not pin and not pout:
            return
        if "permute(" in self.graph.text() or "transpose(" in self.graph.text():
            return self._physical_inputs(out_names, pin)  # (permutes already: only large inputs, below)
        lines = self._phys_input_lines(out_names, pin)
        outs = list(out_names)
        types = {}
        for m, k in self.outputs:
            types.setdefault(k, A.meta_val(m))
        for k, o in sorted(pout.items()):
            lines.append(f"%{out_names[k]}.phys: {A.type_str(types[k].permute(o))} = "
                         f"permute(%{out_names[k]}, dims=[{','.join(map(str, o))}])")
            outs[k] = out_names[k] + ".phys"
        text, g = self._parsed(lines, outs, "a segment", self.options.get("dump"), config.fp8_pass_flags(self.options))
        if g is None:
            return
        if "permute(" in g.text() or "transpose(" in g.text():
            return self._physical_inputs(out_names, pin)  # (a permute the passes could not cancel: a copy)
        self.text, self.graph = text, g
        self.phys_in = {name + ".phys": o for name, o in pin.items()}
        self.phys_out = pout

    @staticmethod
    def _parsed(lines, outs, what, dump=None, pass_flags=0):
        """(text, parsed graph) of a segment with these statements and outputs, or (text, None) when evt rejects
        it (logged: the segment keeps its row-major text)."""
        text = "graph seg {\n  " + "\n  ".join(lines) + "\n" + f"  output {', '.join('%' + n for n in outs)}\n" + "}\n"
        try:
            return text, _graph_for(text, dump, pass_flags)
        except EvtError as e:
            log.info("  physical layout of %s rejected (%s); row-major kept", what, e)
            return text, None

    def _phys_input_lines(self, out_names, pin):
        """The segment's used statements with each input named in pin (name -> memory order) declared in memory
        order as `%name.phys` and permuted to the logical `%name`."""
        vals = {name: A.meta_val(x) for x, name in self.b.inputs}
        lines = []
        for ln in _used_input_lines(self.b.lines, out_names):
            name = ln.split(":", 1)[0].strip()[1:]
            if name in pin and ln.rstrip().endswith("= input()"):
                o = pin[name]
                inv = [o.index(d) for d in range(len(o))]
                lines.append(f"%{name}.phys: {A.type_str(vals[name].permute(o))} = input()")
                lines.append(f"%{name}: {A.type_str(vals[name])} = permute(%{name}.phys, dims=[{','.join(map(str, inv))}])")
            else:
                lines.append(ln)
        return lines

    def _physical_inputs(self, out_names, pin):
        """The segment keeps permutes (a GEMM, a row op): its large dense permuted inputs (at least
        placement.UNALIGNED_MIN_NUMEL elements: XML-CNN's [N, C, W] view of the [N, W, C] embedding) are still
        declared in memory order and permuted in the segment, where a GEMM absorbs the permute as its operand
        layout or evt writes it with a tiled transpose, instead of a strided PyTorch copy to row-major at every
        run. Outputs keep PyTorch's recorded strides."""
        vals = {name: A.meta_val(x) for x, name in self.b.inputs}
        pin = {k: o for k, o in pin.items() if vals[k].numel() >= P.UNALIGNED_MIN_NUMEL}
        if not pin:
            return
        text, g = self._parsed(self._phys_input_lines(out_names, pin), out_names, "a segment's inputs",
                               self.options.get("dump"), config.fp8_pass_flags(self.options))
        if g is None:
            return
        self.text, self.graph = text, g
        self.phys_in = {name + ".phys": o for name, o in pin.items()}

    def _create_program(self, node_fallback):
        flags = G.program_flags(self.options)
        try:
            self.program = _program_for(self.graph, flags, self.device, G.refine_level(self.options),
                                        config.parse_options(self.options)["arch"], tf32=config.tf32(self.options))
        except G.ProgramError as e:
            msg = str(e)
            m = NODE_IN_MSG.search(msg)
            bad = self.b.origin.get(m.group(1)) if m else None
            if node_fallback and bad in self.members:
                e.node = bad  # build_plan moves this FX node to PyTorch and rebuilds
                raise
            self.path, self.why = "torch", f"evt GPU program: {msg}"
            return
        except Exception as e:  # noqa: BLE001 (anything else: this segment runs in PyTorch, logged)
            self.path, self.why = "torch", f"evt GPU program: {type(e).__name__}: {e}"
            return
        self.pool = G.OutputPool() if flags & G.EVT_PROGRAM_CUDA_GRAPH else None
        self.staged = {}  # CUDA graphs: input name -> staging buffer (see _input)
        self.seen = {}    # CUDA graphs: input name -> the pointer it was first bound with

    def _draw_rng_step(self):
        """Segments with dropout sites (aten.native_dropout): the RNG step of this run, drawn from PyTorch's
        default (CPU) generator, so torch.manual_seed makes evt's masks reproducible and every run, and every
        segment, draws fresh ones. Under a CUDA-graph capture nothing is set (a captured value would repeat at
        every replay): the captured kernels read the step from the program's device word, which the program
        advances after each run on the device, and which cudagraphs "step" sets before every replay
        (Plan.draw_rng_steps, called by step_graphs' wrapper outside the capture)."""
        if self.path == "gpu" and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            return
        step = int(torch.randint(0, 2 ** 62, (1,)).item())
        if self.path == "interp":
            self.graph.set_rng_step(step)
        else:
            self.program.set_rng_step(step, torch.cuda.current_stream(self.device).cuda_stream)

    def run(self, env, draw_rng=True):
        """draw_rng=False: the caller drew this run's RNG step already (Plan.draw_rng_steps)."""
        if self.path == "interp" and self._int64_beyond_double(env):
            return self._run_torch(env)
        if draw_rng and self.b.rng_sites and self.path in ("interp", "gpu"):
            self._draw_rng_step()
        if self.path == "interp":
            names, t0 = dict(self.input_names), time.perf_counter()
            res = self.graph.run([(i, self._layout(names[x], env[x]).contiguous()) for x, i in self.inputs],
                                 [(i, A.meta_val(m).dtype) for m, i in self.outputs])
            for (m, k), t in zip(self.out_index, res):
                env[m] = _with_meta_strides(self._logical(k, t), A.meta_val(m))
            STATS["interp_segment_runs"] += 1
            self.interp_runs = getattr(self, "interp_runs", 0) + 1
            if self.interp_runs == 2 and not _slow_warned and not self.b.rng_sites:
                self._compare_with_eager(env, time.perf_counter() - t0)
        elif self.path == "gpu":
            self._run_gpu(env)
        elif self.path == "torch":
            return self._run_torch(env)
        for m, src in self.aliases:
            env[m] = env[src]
        for m in self.torch_views:
            env[m] = TS.run_torch(m, env)

    def _run_torch(self, env):
        for m in self.members:
            env[m] = TS.run_torch(m, env)
        STATS["torch_segment_runs"] += 1
        STATS["torch_nodes_run"] += len(self.members)

    def _int64_beyond_double(self, env):
        """True when an int64 input holds a value beyond int64_limit (2^53, which the interpreter's doubles hold
        exactly, or the bound the segment's integer arithmetic assumed): the segment then runs in PyTorch for this
        call (logged once per segment)."""
        lim = self.int64_limit
        for x in self.int64_inputs:
            t = env[x]
            if t.numel() and bool(((t > lim) | (t < -lim)).any()):
                if not getattr(self, "_int64_logged", False):
                    self._int64_logged = True
                    log.info("  fallback to PyTorch: segment of %d nodes (%s ...): int64 input %s holds values beyond "
                             "%s (the interpreter computes in double); it runs in PyTorch while it does",
                             len(self.members), self.members[0].name, x.name,
                             "2^53" if lim == A.EXACT_INT else f"{lim} (its integer arithmetic's bound)")
                return True
        return False

    def _compare_with_eager(self, env, seconds):
        """The one warning of SLOW_RATIO, when this interpreter run took that much longer than PyTorch would."""
        global _slow_warned
        eager = _eager_seconds(self.members, env)
        if eager is None or seconds < SLOW_MIN_S or seconds < SLOW_RATIO * eager:
            return
        _slow_warned = True
        log.warning("evt: the CPU interpreter runs this model ~%.0fx slower than PyTorch eager (a segment of %d ops: "
                    "%.1f ms against %.1f ms); it is the reference, not a fast path", seconds / max(eager, 1e-9),
                    len(self.members), seconds * 1e3, eager * 1e3)

    def _layout(self, name, t):
        """An input as its declaration reads it: transposed (gemm_only_transposed) or in memory order
        (_physical) when declared so."""
        if name in self.b.transposed:
            return t.t()
        if name in self.phys_in:
            return t.permute(self.phys_in[name])
        return t

    def _logical(self, k, t):
        """Graph output k as the logical tensor (a view when it was written in memory order)."""
        o = self.phys_out.get(k)
        return t if o is None else t.permute([o.index(d) for d in range(len(o))])

    def _input(self, name, t):
        t = self._layout(name, t)
        if self.pool is None:
            return self._copied_input(name, t) if not G.bindable(t) else t
        # CUDA graphs: an input is bound as it is while its pointer stays the same (parameters); once it
        # changed (a new batch, an activation in another block), it is copied into a staging buffer of
        # its own from then on, as are inputs that need a conversion.
        if name not in self.staged and G.bindable(t):
            last = self.seen.setdefault(name, t.data_ptr())
            if last == t.data_ptr():
                return t
        buf = self.staged.get(name)
        if buf is None:
            buf = self.staged[name] = torch.empty(t.shape, dtype=G.device_dtype(t.dtype), device=t.device)
        buf.copy_(t)
        return buf

    def _copied_input(self, name, t):
        """to_device_layout of an input evt cannot bind as it is (strided, unaligned or another dtype): one
        copy per run, counted (STATS["input_copies"]) and logged once per segment input."""
        STATS["input_copies"] += 1
        logged = self.__dict__.setdefault("_copy_logged", set())
        if name not in logged:
            logged.add(name)
            log.info("  segment input %s %s %s strides %s copied for evt every run (strided, unaligned or "
                     "another dtype)", name, str(t.dtype).replace("torch.", ""), list(t.shape), list(t.stride()))
        return G.to_device_layout(t)

    def _prepare_fast(self):
        """What _run_fast needs per run, computed once: output shapes in evt's device dtype, and per FX
        output whether it needs a cast, a logical permute or PyTorch's recorded strides."""
        outs = [(self.out_types[k][0], G.device_dtype(self.out_types[k][1])) for k in range(len(self.out_types))]
        post = []
        for m, k in self.out_index:
            v = A.meta_val(m)
            cast = v.dtype if outs[k][1] != v.dtype else None
            # (the contiguous result's strides differ from the recorded dense ones: _with_meta_strides copies)
            keep = (m in self.free_layout or v.dim() <= 1 or not is_non_overlapping_and_dense(v)
                    or (k not in self.phys_out and v.stride() == torch.empty(v.shape, device="meta").stride()))
            post.append((m, k, cast, None if keep else v))
        layout = [(x, name, name in self.b.transposed or name in self.phys_in) for x, name in self.input_names]
        self._fast = (outs, post, layout)

    def _run_fast(self, env):
        """_run_gpu without CUDA graphs: the per-run work reduced to binding, allocating and launching (the
        host time of a segment run is on the step's critical path when the GPU is fast)."""
        outs, post, layout = self._fast
        dev = self.device
        ins = []
        for x, name, moved in layout:
            t = env[x]
            if moved:
                t = self._layout(name, t)
            if not (t.dtype in _BINDABLE_DTYPES and t.is_contiguous() and t.data_ptr() % 16 == 0):
                t = self._copied_input(name, t)
            ins.append((name, t))
        bufs = [torch.empty(shape, dtype=dt, device=dev) for shape, dt in outs]
        self.program.run(ins, bufs, torch.cuda.current_stream(dev).cuda_stream)
        STATS["gpu_segment_runs"] += 1
        STATS["gpu_launches"] += self.program.launch_count()
        for m, k, cast, strided in post:
            t = self._logical(k, bufs[k])
            if cast is not None:
                t = t.to(cast)
            env[m] = t if strided is None else _with_meta_strides(t, strided)

    def _run_gpu(self, env):
        if self.pool is None:
            if getattr(self, "_fast", None) is None:
                self._prepare_fast()
            return self._run_fast(env)
        dev = self.device
        ins = [(name, self._input(name, env[x])) for x, name in self.input_names]
        bufs, handed = [], []
        for k in range(len(self.out_types)):
            shape, dt = self.out_types[k]
            if self.pool is not None:
                buf, h = self.pool.get(k, shape, G.device_dtype(dt), dev)
            else:
                buf, h = torch.empty(shape, dtype=G.device_dtype(dt), device=dev), True
            bufs.append(buf)
            handed.append(h)
        before = self.program.captures
        self.program.run(ins, bufs, torch.cuda.current_stream(dev).cuda_stream)
        STATS["gpu_segment_runs"] += 1
        STATS["gpu_launches"] += self.program.launch_count()
        STATS["captures"] += self.program.captures - before
        vals = [G.OutputPool.hand_out(b_, h) if self.pool is not None else b_ for b_, h in zip(bufs, handed)]
        for m, k in self.out_index:
            v = A.meta_val(m)
            t = self._logical(k, vals[k])  # (written in memory order: the view has the recorded strides)
            if t.dtype != v.dtype:
                t = t.to(v.dtype)
            env[m] = t if m in self.free_layout else _with_meta_strides(t, v)


# dtypes evt binds as they are (gpu.device_dtype is the identity on them)
_BINDABLE_DTYPES = frozenset((torch.float32, torch.float16, torch.bfloat16, torch.bool, torch.int64) + FP8_DTYPES)


# (sha256 of the optimized text, flags, device, tf32[, arch]) -> Program (not for CUDA graphs), while a plan's
# segment holds it: a program left behind (a plan rebuilt after a program refused a node, a plan dropped) frees
# its device memory instead of living as long as the process
_PROGRAMS = weakref.WeakValueDictionary()


def _program_key(graph, flags, device, tf32=False):
    # tf32 in the key: a program lowered with TF32 GEMMs is not reused without it (nor the other way)
    return (hashlib.sha256(graph.text().encode()).hexdigest(), flags, str(device), bool(tf32))


def program_cached(graph, flags, device, tf32=False):
    """True when the GPU program of this optimized graph, flags, device and TF32 setting exists (_program_for
    reuses it)."""
    return _program_key(graph, flags, device, tf32) in _PROGRAMS


def _program_for(graph, flags, device, refine, arch=None, tf32=False):
    text = graph.text()
    key = _program_key(graph, flags, device, tf32) + ((arch,) if arch else ())
    p = _PROGRAMS.get(key) if not flags & G.EVT_PROGRAM_CUDA_GRAPH else None
    if p is None:
        with torch.cuda.device(device):
            p = G.Program(text, flags, f"evt-{key[0][:12]}.evt", refine=refine, arch=arch, tf32=tf32)
        log.info("  GPU program for evt-%s: %d kernel launches per run (flags %d)", key[0][:12],
                 p.launch_count(), flags)
        if not flags & G.EVT_PROGRAM_CUDA_GRAPH:
            _PROGRAMS[key] = p
    return p


def _with_meta_strides(t, v):
    """t (contiguous) laid out with the strides PyTorch recorded for it, when they describe a dense
    permutation (the backward relies on e.g. transposed gradients)."""
    if t.dim() > 1 and t.stride() != v.stride() and is_non_overlapping_and_dense(v):
        t = torch.empty_strided(t.shape, v.stride(), dtype=t.dtype, device=t.device).copy_(t)
    return t


def is_non_overlapping_and_dense(v):
    """True when v's strides describe a permutation of a contiguous layout (no zero or gapped strides)."""
    dims = sorted((st, sz) for st, sz in zip(v.stride(), v.shape) if sz != 1)
    expect = 1
    for st, sz in dims:
        if st != expect:
            return False
        expect *= sz
    return True
