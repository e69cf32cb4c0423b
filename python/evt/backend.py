"""The `evt` torch.compile backend: AOTAutograd's joint graph -> evt segments, run on the CPU interpreter (CPU
tensors) or as evt GPU programs (CUDA tensors), PyTorch for the rest.

Contract: evt_backend (registered as "evt") is dynamo_rewrites.run_all on Dynamo's graph, then aot_autograd with
DECOMPOSITIONS, partition_fn and compile_module as its compilers; the options (config.parse_options) are documented
in docs/pytorch.md, and so is how a module is planned (rewrites.py, placement.py, segments.py, segment.py, plan.py,
cudagraphs.py). Nothing evt cannot do, and no error of its own, fails a step eager PyTorch runs: such ops, segments
or modules run in PyTorch, and a rewrite that raises leaves the joint graph as traced (each logged on the `evt`
logger with the reason); only a missing or unloadable libevt is the configuration error it is: LibraryError at the
first call, saying how to fix it. STATS counts segment runs per path, GPU kernel launches and CUDA-graph captures
since reset_stats().
"""
import collections
import copy
import logging
import warnings
import weakref

import torch
import torch.fx
from torch._decomp import core_aten_decompositions
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.partitioners import default_partition

from . import config
from . import dynamo_rewrites as DR
from . import placement as P
from . import rewrites as R
from .cudagraphs import step_graphs
from .lib import LibraryError
from .plan import Plan, build_plan
from .segment import STATS, Segment, release_programs, reset_stats  # noqa: F401 (the package's API)

log = logging.getLogger("evt")
config.configure_logging(log)

aten = torch.ops.aten


# Ops evt translates whole (its row ops, losses and backward ops); the rest of the core set decomposes.
KEEP_WHOLE = {
    aten.gelu_backward, aten.native_layer_norm, aten.native_layer_norm_backward, aten._softmax,
    aten._softmax_backward_data, aten._log_softmax, aten._log_softmax_backward_data, aten.nll_loss_forward,
    aten.nll_loss_backward, aten.native_batch_norm_backward, aten._native_batch_norm_legit_functional,
    aten.native_batch_norm, aten._native_batch_norm_legit, aten.embedding_dense_backward,
    aten.max_pool2d_with_indices_backward, aten.avg_pool2d_backward, aten.adaptive_max_pool2d_backward,
    aten.binary_cross_entropy_with_logits, aten.mse_loss_backward, aten.threshold_backward,
    aten.slice_backward, aten.select_backward, aten.mse_loss,
    # PyTorch 2.11 decomposes the CPU flash-attention forward but not its backward kernel, whose
    # logsumexp input then disagrees with the decomposition's: wrong gradients. Kept whole.
    aten._scaled_dot_product_flash_attention_for_cpu,
}


def decompositions():
    return {k: v for k, v in core_aten_decompositions().items()
            if getattr(k, "overloadpacket", None) not in KEEP_WHOLE}


DECOMPOSITIONS = decompositions()


def histogram(gm):
    return collections.Counter(P.op_name(n) for n in gm.graph.nodes if n.op == "call_function")


# forward GraphModule -> its backward (partition_fn), for the forward's plan to JIT-compile the backward's kernels
_BACKWARD = weakref.WeakKeyDictionary()


def partition_fn(joint, joint_inputs, options=None, **kwargs):
    """Sees the whole training step: logs its op histogram, rewrites it (rewrites.run_all), then splits it and
    unwraps the recomputed ops that draw no random numbers (rewrites.unwrap_unseeded_rng_ops)."""
    if log.isEnabledFor(logging.INFO):
        h = histogram(joint)
        log.info("joint graph: %d ops: %s", sum(h.values()), ", ".join(f"{k} x{v}" for k, v in h.most_common()))
    _rewrite(joint, options, kwargs.get("num_fwd_outputs"))
    fw, bw = default_partition(joint, joint_inputs, **kwargs)
    _unwrap_rng(fw, bw)
    _BACKWARD[fw] = bw  # (AOTAutograd hands this very fw to the forward compiler; another object finds none)
    return fw, bw


def _unwrap_rng(fw, bw):
    """rewrites.unwrap_unseeded_rng_ops on the two modules; if it raises, both stay as partitioned (logged)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        kept = copy.deepcopy(fw.graph), copy.deepcopy(bw.graph)
    try:
        R.unwrap_unseeded_rng_ops(fw, bw)
    except Exception as e:  # noqa: BLE001 (a bug in a rewrite must not fail the user's step)
        log.warning("evt could not unwrap the checkpointed ops' RNG wrappers (%s: %s); they run in PyTorch",
                    type(e).__name__, e)
        for gm, graph in zip((fw, bw), kept):
            gm.graph = graph
            gm.recompile()


def _rewrite(joint, options, num_fwd_outputs):
    """rewrites.run_all on the joint graph; a rewrite that raises leaves the graph as traced (logged with the
    error): the step then runs without evt's rewrites, its nodes translated as usual."""
    with warnings.catch_warnings():  # (PyTorch's pytree warns about copying the graph's output spec)
        warnings.simplefilter("ignore", FutureWarning)
        traced = copy.deepcopy(joint.graph)  # (the nodes are copied, their meta shallowly: no tensor is copied)
    try:
        R.run_all(joint, options, num_fwd_outputs)
    except Exception as e:  # noqa: BLE001 (a bug in a rewrite must not fail the user's step)
        log.warning("evt's rewrites of the joint graph failed (%s: %s); it is partitioned as traced",
                    type(e).__name__, e)
        joint.graph = traced
        joint.recompile()


def _symbolic(gm):
    for n in gm.graph.nodes:
        v = n.meta.get("val")
        if isinstance(v, torch.SymInt):
            return True
        if isinstance(v, torch.Tensor) and any(not isinstance(s, int) for s in v.shape):
            return True
    return False


def _log_plan(plan, kind):
    if log.isEnabledFor(logging.INFO):
        segs = [s for s in plan.steps if isinstance(s, Segment) and s.path != "torch"]
        n_evt = sum(len(s.members) for s in segs)
        where = collections.Counter(s.path for s in segs)
        log.info("%s: %d ops in %d evt segment(s) (%s), %d in PyTorch", kind, n_evt, len(segs),
                 ", ".join(f"{v} on {k}" for k, v in sorted(where.items())) or "none", len(plan.fallbacks))
        for node, why in plan.fallbacks:
            log.info("  fallback to PyTorch: %s (%s): %s", P.op_name(node), node.name, why)
        if plan.torch_permutes:
            log.info("  %d permute(s) making a strided input contiguous run in PyTorch (views): %s",
                     len(plan.torch_permutes), ", ".join(n.name for n in plan.torch_permutes[:8]))


def _specialize(gm, args):
    """A copy of gm whose meta["val"] holds the concrete shapes of these arguments (FakeTensorProp)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    g2 = copy.deepcopy(gm)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fakes = [mode.from_tensor(a, static_shapes=True) if isinstance(a, torch.Tensor) else a for a in args]
    FakeTensorProp(g2, mode).propagate_dont_convert_inputs(*fakes)
    return g2


def compile_module(gm, example_inputs, kind="module", options=None):
    """fw/bw compiler: a boxed callable running gm through evt segments and PyTorch fallbacks.
    A module with symbolic shapes gets one plan per concrete argument signature, built at the first call
    with that signature (shapes re-derived with FakeTensorProp). A forward whose backward partition_fn made
    JIT-compiles the backward's GPU kernels in its own batch (plan.EarlyBackward; not for symbolic shapes)."""
    backward = _BACKWARD.pop(gm, None) if kind == "forward" else None
    if _symbolic(gm):
        plans = {}

        def run_dynamic(args):
            key = tuple((tuple(a.shape), a.dtype, tuple(a.stride())) if isinstance(a, torch.Tensor) else
                        (type(a).__name__, a) for a in args)
            plan = plans.get(key)
            if plan is None:
                try:
                    plan = build_plan(_specialize(gm, args), options, kind)
                except LibraryError:
                    raise
                except Exception as e:  # noqa: BLE001 (any failure to specialize: run the module as is)
                    log.warning("%s: could not specialize symbolic shapes (%s)", kind, e)
                    plan = None
                if plan is None:
                    plan = lambda a: gm(*a)  # noqa: E731
                    log.info("%s: runs in PyTorch", kind)
                else:
                    _log_plan(plan, f"{kind} (specialized to {[k[0] for k in key]})")
                plans[key] = plan
            return plan(args, consume=True) if isinstance(plan, Plan) else plan(args)
        run_dynamic._boxed_call = True
        return run_dynamic
    try:
        plan = build_plan(gm, options, kind, backward=backward)
    except LibraryError:  # (a configuration error: the user must see it)
        raise
    except Exception as e:  # noqa: BLE001 (a bug in the translation must not fail the user's step)
        log.warning("%s: evt failed to build a plan (%s: %s); the module runs in PyTorch", kind, type(e).__name__, e)
        plan = None
    if plan is None:
        log.info("%s: no plan: runs in PyTorch", kind)

        def run_gm(args):
            return gm(*args)
        run_gm._boxed_call = True
        return run_gm
    _log_plan(plan, kind)

    def run(args):
        return plan(args, consume=True)
    run._boxed_call = True
    run.plan = plan
    return run


def make_backend(options=None, n_dynamo_inputs=None, on_compiled=None):
    """aot_autograd with evt's decompositions, partition_fn and fw/bw compilers for these options
    (cudagraphs "step": the compilers of step_graphs, which need the Dynamo graph's input count).
    on_compiled(kind, run), when given, sees each module's compiled callable (its `plan` attribute: the Plan,
    absent where the module runs in PyTorch): evt.explain's reports are built from it."""
    opts = config.parse_options(options)

    def compile_(gm, example, kind, o):
        run = compile_module(gm, example, kind, o)
        if on_compiled is not None:
            on_compiled(kind, run)
        return run
    fw = lambda gm, ex: compile_(gm, ex, "forward", opts)  # noqa: E731
    bw = lambda gm, ex: compile_(gm, ex, "backward", opts)  # noqa: E731
    inference = lambda gm, ex: compile_(gm, ex, "inference", opts)  # noqa: E731
    if opts["cudagraphs"] == "step" and n_dynamo_inputs is not None:
        fw, bw, inference = step_graphs(compile_, opts, n_dynamo_inputs)
    traced = aot_autograd(fw_compiler=fw, bw_compiler=bw, inference_compiler=inference,
                          partition_fn=lambda j, ji, **kw: partition_fn(j, ji, options=opts, **kw),
                          decompositions=DECOMPOSITIONS)

    def backend(gm, example_inputs):
        DR.run_all(gm)
        return traced(gm, example_inputs)
    return backend


_DEFAULT = make_backend()


def evt_backend(gm, example_inputs, options=None, mode=None):
    """The "evt" backend: torch.compile(m, backend="evt", options={"cudagraphs": True, "fused": False}).
    `mode` is accepted and ignored (evt has one mode)."""
    if not options:
        return _DEFAULT(gm, example_inputs)
    return make_backend(options, len(example_inputs))(gm, example_inputs)
