"""The Plan of one FX module: its steps (segments.py), made ready to run, and running them.

Contract: build_plan(gm, options, kind) returns a Plan whose segments are parsed and whose GPU programs exist
(after one tuning and one JIT batch for all of them), or None when evt cannot plan the module; a node the parser
or the GPU program rejects moves to PyTorch and the plan is rebuilt, and a segment that fails to plan otherwise
runs in PyTorch (logged with the error). Plan(args) runs one step; nothing evt cannot do fails it (a segment that
raises runs in PyTorch).
"""
import logging
import time

import torch
import torch.fx

from . import aten as A
from . import config
from . import gpu as G
from . import lib
from . import memory_cuts as MC
from . import placement as P
from . import rewrites as R
from . import segment as SG
from . import slow_groups as SL
from . import torch_steps as TS
from .lib import EvtError, LibraryError
from .segment import Segment
from .segments import Segmentation

log = logging.getLogger("evt")
aten = torch.ops.aten


class Plan:
    """The ordered steps of one FX module (Segments and PyTorch nodes; segments.Segmentation), ready to run."""

    def __init__(self, gm, force_torch, options=None, program_node_fallback=True, kind="module", early=None):
        self.gm = gm
        self.early = early  # a forward's EarlyBackward: its backward's kernels join this plan's batch
        self.kind = kind
        self.options = options or {}
        self.check = config.parse_options(self.options)["check"]
        self.program_node_fallback = program_node_fallback
        self.placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        # constants the graph holds as module attributes (a captured tensor, the index of a slice assignment)
        self.constants = [n for n in gm.graph.nodes if n.op == "get_attr"]
        self.output = next(n for n in gm.graph.nodes if n.op == "output")
        self.rng_by_caller = False  # dropout segments' RNG steps are drawn by the caller (draw_rng_steps)
        self.force = force_torch
        seg = Segmentation(gm, force_torch, self.options)
        if kind == "backward":
            seg = self._cut_for_memory(seg)
        self.steps, self.fallbacks = seg.steps, seg.fallbacks
        self.torch_permutes, self.torch_moves = seg.torch_permutes, seg.torch_moves
        self._foreach_casts = seg.hoisted

    def _cut_for_memory(self, seg):
        """The backward's segmentation again with its large segments ended where they have released enough of the
        forward's saved tensors (memory_cuts.py; options["backward_cut_mib"]: the graph is reordered so that the ops
        that can run before a cut do), or seg when there is no such cut."""
        segs = [s for s in seg.steps if isinstance(s, Segment)]
        mib = config.parse_options(self.options)["backward_cut_mib"]
        cuts = MC.apply(MC.plan_cuts(segs, int(mib * 2**20)))
        if not cuts:
            return seg
        self.gm.recompile()
        for s in segs:
            if any(m in cuts for m in s.members):
                log.info("  %s", MC.describe(s.members, cuts))
        return Segmentation(self.gm, self.force, self.options, cut_before=cuts)

    def finalize(self):
        """Parses every segment (raises EvtError with the parser's message on a rejected statement), tunes and
        prefetches every GPU segment's kernels in one batch each, creates the GPU programs (raising ProgramError
        with the node a program names), marks the PyTorch GEMMs that run padded, and computes each value's last
        use."""
        segs = self._finalize_segments()
        self._create_programs(segs)
        self._mark_padded_gemms()
        self._liveness()

    def _finalize_segments(self):
        """Parses every segment (Segment.finalize, programs deferred); returns the Segments."""
        # The backward module's outputs are gradients for AccumulateGrad: on the GPU path they are returned
        # contiguous as evt wrote them, not copied into PyTorch's recorded strides (a weight gradient is
        # recorded transposed: the copy and AccumulateGrad's copy back to the parameter's layout are saved).
        # A channels-last gradient (the weight of a convolution in a channels-last model: the parameter has
        # those strides, and AccumulateGrad takes a gradient of the parameter's layout as it is) keeps its
        # recorded layout: evt writes it in memory order like the activations beside it (Segment._physical),
        # where a contiguous result would keep its whole segment off the physical layout (resnet50: the 3x3
        # weight gradients' casts share a segment with a ReLU backward, whose activations would be copied).
        grads = set()
        if self.kind == "backward":
            grads = {n for n in _flat_nodes(self.output.args[0]) if P.dense_order(A.meta_val(n)) is None}
        free = grads | {n for n in self.gm.graph.nodes if n.meta.get("evt_conv_input_free")}
        segs = [s for s in self.steps if isinstance(s, Segment)]
        for s in segs:
            s.free_layout = free
            self._finalize_segment(s)
        return segs

    def _finalize_segment(self, s):
        """Segment.finalize; a parser error that names a node not yet moved propagates (build_plan moves that node to
        PyTorch and rebuilds); any other error runs the segment in PyTorch (its nodes are logged as fallbacks with
        the error). An error while libevt is not loaded (no library) is the caller's to see: it propagates."""
        try:
            s.finalize(lambda m: m.users, self.program_node_fallback, defer_program=True)
            return
        except EvtError as e:
            m = SG.NODE_IN_MSG.search(str(e))
            bad = s.b.origin.get(m.group(1)) if m else None
            if not lib.loaded() or (bad in s.members and bad not in self.force):
                raise
            why = f"rejected by evt: {e}"
        except Exception as e:  # noqa: BLE001
            if not lib.loaded():
                raise
            why = f"planning failed: {type(e).__name__}: {e}"
        log.warning("evt could not plan a segment of %d nodes (%s); it runs in PyTorch", len(s.members), why)
        s.path, s.why, s.program = "torch", why, None

    def _create_programs(self, segs):
        """Tunes (gpu.tune_configs) and JIT-compiles every GPU segment's kernels in one batch each, then creates
        the programs (cache hits); a segment whose program cannot be made runs in PyTorch (fallbacks). A forward
        with an EarlyBackward adds its backward's GPU segment texts to both batches."""
        gpu = [s for s in segs if s.path == "gpu" and getattr(s, "pending", None) is not None]
        texts = _uncached_texts(gpu)
        extra = []
        if gpu and self.early is not None:
            own = set(texts)
            extra = [t for t in dict.fromkeys(self.early.texts()) if t not in own]
        batch = texts + extra
        what = "%d GPU segments" % len(texts) if not extra else \
            "%d forward + %d backward GPU segments" % (len(texts), len(extra))
        if batch and G.tune_configs(gpu[0].options) > 0:
            t0 = time.time()
            st, n, why = G.tune(batch, G.program_flags(gpu[0].options), G.tune_configs(gpu[0].options),
                                G.refine_level(gpu[0].options), config.parse_options(gpu[0].options)["arch"],
                                tf32=config.tf32(gpu[0].options))
            msg = "  tune: %d GEMM problems of %s in %.1f s%s" % (
                n, what, time.time() - t0, "" if st == 0 else f" (not all tuned: {why})")
            if st == 0 or not G.tune_asked(gpu[0].options):
                log.info(msg)
            else:
                log.warning(msg)
        if len(batch) > 1:
            t0 = time.time()
            n = G.prefetch(batch, G.program_flags(gpu[0].options), G.refine_level(gpu[0].options),
                           config.parse_options(gpu[0].options)["arch"], tf32=config.tf32(gpu[0].options))
            log.info("  prefetch: %d kernels for %s in %.1f s", n, what, time.time() - t0)
        for s in segs:
            s.create_program()
            if s.path == "torch":
                for m in s.members:
                    self.fallbacks.append((m, s.why))
        self._check_slow_groups(segs)

    def _check_slow_groups(self, segs):
        """Raises SlowGroups with the ops of the GPU programs' large node-by-node groups (slow_groups.py), which
        build_plan moves to PyTorch; once the plan was rebuilt MAX_PROGRAM_REBUILDS times they stay, with a warning."""
        slow = {}
        for s in segs:
            if s.path == "gpu" and hasattr(s.program, "report"):  # (tests' stand-in programs have no report)
                slow.update(SL.slow_nodes(s, s.program.report()))
        if slow and self.program_node_fallback:
            raise SL.SlowGroups(slow)
        if slow:
            log.warning("evt: %d op(s) stay in groups that run node by node on CUDA (%s: %s)", len(slow),
                        next(iter(slow)).name, next(iter(slow.values())))

    def _mark_padded_gemms(self):
        """GEMMs left to PyTorch with unaligned dims run on padded operands (torch_steps.pad_gemm); a PyTorch cast
        that only PyTorch steps read and that feeds such a GEMM writes its result padded (pad_cast_output)."""
        torch_nodes = [m for s in self.steps for m in (s.members if isinstance(s, Segment) and s.path == "torch"
                                                        else [] if isinstance(s, Segment) else [s])]
        for m in torch_nodes:
            if TS.pad_gemm(m):  # (a result the module returns keeps PyTorch's contiguous layout)
                m.meta["evt_pad_gemm"] = "contiguous" if self.output in m.users else "view"
                log.info("  %s (%s): runs in PyTorch on operands zero-padded to multiples of 8", m.name, P.op_name(m))
        in_torch = set(torch_nodes)
        for m in torch_nodes:
            if m.meta.get("evt_pad_gemm"):
                k = P.GEMMS[m.target]
                for x in m.args[k:k + 2]:
                    while isinstance(x, torch.fx.Node) and x in in_torch and x.target in P.PERMUTES:
                        x = x.args[0]
                    if isinstance(x, torch.fx.Node) and TS.pad_cast_output(x, in_torch, self.output):
                        x.meta["evt_pad_out"] = True
                        log.info("  %s (%s): written into memory padded to 8 columns (the padded GEMMs read it "
                                 "without copying)", x.name, P.op_name(x))

    def _liveness(self):
        """free_after[i]: the values dropped from the environment after step i, the last that reads them."""
        step_of = {}
        for i, s in enumerate(self.steps):
            for m in (s.members if isinstance(s, Segment) else [s]):
                step_of[m] = i
        last = {}
        for node in list(self.placeholders) + list(step_of):
            uses = [step_of.get(u, len(self.steps)) for u in node.users]
            last[node] = max(uses, default=step_of.get(node, -1))
        self.free_after = [[] for _ in self.steps]
        for node, i in last.items():
            if 0 <= i < len(self.steps):
                self.free_after[i].append(node)

    def rng_segments(self):
        """The segments that draw an RNG step each run (dropout sites run by evt: the interpreter or a GPU
        program)."""
        return [s for s in self.steps if isinstance(s, Segment) and s.b.rng_sites
                and (s.path == "interp" or (s.path == "gpu" and s.program is not None))]

    def draw_rng_steps(self):
        """Draws the dropout segments' RNG steps for the next call, in plan order, and from then on the segments
        leave the drawing to the caller (rng_by_caller). cudagraphs "step" calls this before each call of its
        step graph, outside any capture: a GPU program's step is a kernel on the current stream, where PyTorch's
        CUDA-graph trees then replay the graph, so the replayed kernels draw with it, and torch.manual_seed
        repeats the masks of the whole-step graph as it does those of the other modes. Segments of the same
        text share one GPU program (_program_for; BERT-large: the 24 layers' forward segments), which is set
        once: its runs in the call draw with that step, then the next ones (the program advances its device
        word after each run), so its masks still differ from run to run. __call__ draws the same way when the
        caller does not (at each program's first run of the call), so both draw the same masks (per-segment CUDA
        graphs never share a program: every segment draws there)."""
        self.rng_by_caller = True
        drawn = set()
        for s in self.rng_segments():
            if self._draws_now(s, drawn):
                s._draw_rng_step()

    @staticmethod
    def _draws_now(s, drawn):
        """Whether segment s draws its RNG step at this point of a call (drawn: the GPU programs drawn for so far in
        the call): an interpreter segment at every run, a GPU program at its first run of the call only."""
        if s.path != "gpu" or s.program is None:
            return True
        if id(s.program) in drawn:
            return False
        drawn.add(id(s.program))
        return True

    def __call__(self, args, consume=False):
        """consume=True (a boxed call): the plan takes the list over (clears it), so it can free each input
        after its last use."""
        env = dict(zip(self.placeholders, args))
        if consume:
            args.clear()
        for n in self.constants:
            env[n] = _attr(self.gm, n.target)
        TS.clear_padded_copies()
        k = 0
        while k < len(self.steps) and self.steps[k] in self._foreach_casts:
            k += 1
        if k > 1:
            TS.run_hoisted_casts(self.steps[:k], env)
            for i in range(k):
                for node in self.free_after[i]:
                    env.pop(node, None)
        else:
            k = 0
        drawn = set()  # the GPU programs this call drew an RNG step for (_draws_now)
        for i, s in enumerate(self.steps[k:], start=k):
            if isinstance(s, Segment):
                try:
                    s.run(env, draw_rng=not self.rng_by_caller and self._draws_now(s, drawn))
                    if self.check and s.path in ("interp", "gpu"):
                        _check_segment(s, env)
                except Exception as e:  # noqa: BLE001 (never fail the step: PyTorch runs the segment)
                    log.warning("evt segment failed at run time on %s (%s: %s); running its %d nodes in PyTorch",
                                s.path, type(e).__name__, e, len(s.members))
                    if s.path == "gpu":  # (a GPU program that failed once is not tried again)
                        s.path, s.why = "torch", f"GPU program failed at run time: {e}"
                    for m in s.members:
                        env[m] = TS.run_torch(m, env)
            else:
                env[s] = TS.run_torch(s, env)
            for node in self.free_after[i]:
                env.pop(node, None)
        return list(torch.fx.node.map_arg(self.output.args[0], lambda n: env[n]))


def _check_segment(seg, env):
    """options["check"]: reruns the segment's nodes in PyTorch and logs every output that differs. Outputs that depend
    on a dropout of the segment are not compared (evt draws its own masks; logged once per segment)."""
    ref = dict(env)
    drawn = set()  # members that depend on one of the segment's dropouts
    for m in seg.members:
        ref[m] = TS.run_torch(m, ref)
        if getattr(m.target, "overloadpacket", None) is aten.native_dropout or any(a in drawn for a in m.all_input_nodes):
            drawn.add(m)
    skipped = [m.name for m, _ in seg.outputs if m in drawn]
    if skipped and not getattr(seg, "_check_skip_logged", False):
        seg._check_skip_logged = True
        log.info("evt check: %d output(s) not compared, they depend on evt's dropout masks: %s", len(skipped),
                 ", ".join(skipped[:8]))
    for m, _ in seg.outputs:
        if m in drawn:
            continue
        a, b = env[m], ref[m]
        if a.shape != b.shape or a.dtype != b.dtype:
            log.warning("evt check %s: %s %s vs PyTorch %s %s", m.name, a.dtype, tuple(a.shape), b.dtype, tuple(b.shape))
            continue
        if a.numel() and a.is_floating_point():
            diff = (a.double() - b.double()).abs().max().item()
            rel = diff / max(b.double().abs().max().item(), 1e-30)
            if diff > 1e-5 and rel > 1e-4:  # (both: values that cancel to ~0 are rounding noise)
                log.warning("evt check %s (%s): max abs error %.3g, relative %.3g", m.name, P.op_name(m), diff, rel)
        elif a.numel() and not torch.equal(a, b):
            log.warning("evt check %s (%s): values differ", m.name, P.op_name(m))


# A CUDA segment whose program creation names a node moves that node to PyTorch and the plan is rebuilt,
# at most this many times per module; later failures run their whole segment in PyTorch.
MAX_PROGRAM_REBUILDS = 16


def _attr(gm, target):
    """The value of a get_attr node's dotted target on gm."""
    v = gm
    for part in target.split("."):
        v = getattr(v, part)
    return v


def _uncached_texts(segs):
    """The optimized texts of the GPU segments (programs pending) whose programs are not yet cached."""
    gpu = [s for s in segs if s.path == "gpu" and getattr(s, "pending", None) is not None]
    return [s.graph.text() for s in gpu
            if not SG.program_cached(s.graph, G.program_flags(s.options), s.device, config.tf32(s.options))]


class _ParseLogsOnly(logging.Filter):
    """Passes the records logged once per parsed text (segment._graph_for, the disk cache) and drops the rest:
    the backward's own plan logs those when it is built."""

    def filter(self, record):
        return record.funcName == "_graph_for" or record.module == "diskcache"


class EarlyBackward:
    """The backward module of a forward being planned: texts() are the GPU segment texts its own Plan will hand to
    gpu.tune / gpu.prefetch (same options), computed once, creating no program; the forward's batch takes them, so
    the backward's kernels compile in the forward's nvcc wave and its own compile finds them cached. Any error:
    [] (logged at debug level), the backward then compiles its kernels itself."""

    def __init__(self, gm, options=None):
        self.gm, self.options, self._texts = gm, options, None

    def texts(self):
        if self._texts is None:
            self._texts = []
            quiet = _ParseLogsOnly()
            log.addFilter(quiet)
            try:
                plan = Plan(self.gm, {}, self.options, kind="backward")
                self._texts = _uncached_texts(plan._finalize_segments())
                self.gm = None  # (the forward's plan need not keep the backward module alive)
            except Exception as e:  # noqa: BLE001 (only an optimization: the backward compiles its own kernels)
                err = e
            else:
                err = None
            finally:
                log.removeFilter(quiet)
            if err is not None:
                log.debug("evt: the backward's kernels are left to its own compile (%s: %s)", type(err).__name__, err)
        return self._texts


def _flat_nodes(x):
    if isinstance(x, torch.fx.Node):
        return [x]
    if isinstance(x, (list, tuple)):
        return [n for y in x for n in _flat_nodes(y)]
    return []


def build_plan(gm, options=None, kind="module", backward=None):
    """A Plan for gm; nodes the evt parser (or the GPU program) rejects move to PyTorch one by one. backward: the
    backward module of a forward, whose GPU kernels are then tuned and JIT-compiled in the forward's batch."""
    early = EarlyBackward(backward, options) if backward is not None and kind == "forward" else None
    if kind in ("module", "inference"):
        R.mark_returned_log_softmax(gm)  # (a module without a backward returns every output to its caller)
    force = {}
    rebuilds = 0
    plan = None
    while True:
        # (the last attempt stays alive until this one is built: the programs it created, cached only while a
        # plan holds them, serve this attempt's segments of the same text)
        last, plan = plan, Plan(gm, force, options, program_node_fallback=rebuilds < MAX_PROGRAM_REBUILDS,
                                kind=kind, early=early)
        try:
            plan.finalize()
            SG.STATS["plans"] += 1
            del last
            return plan
        except LibraryError:
            raise
        except SL.SlowGroups as e:
            log.info("evt: %d op(s) whose groups would run node by node on CUDA move to PyTorch (%s, ...); "
                     "planning again", len(e.nodes), next(iter(e.nodes)).name)
            force.update(e.nodes)
            rebuilds += 1
        except G.ProgramError as e:
            bad = getattr(e, "node", None)
            if bad is None or bad in force:  # (finalize only raises with a node; defensive)
                log.warning("evt could not build a plan (%s); running the module in PyTorch", e)
                return None
            force[bad] = f"evt GPU program: {e}"
            rebuilds += 1
        except EvtError as e:
            msg = str(e)
            m = SG.NODE_IN_MSG.search(msg)
            bad = None
            if m:
                for s in plan.steps:
                    if isinstance(s, Segment) and s.b.origin.get(m.group(1)) in s.members:
                        bad = s.b.origin[m.group(1)]
                        break
            if bad is None or bad in force:
                log.warning("evt could not build a plan (%s); running the module in PyTorch", msg)
                return None
            force[bad] = f"rejected by evt: {msg}"
