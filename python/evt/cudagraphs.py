"""cudagraphs "step": the forward and the backward of a module each replayed as one CUDA graph through PyTorch's
CUDA-graph trees.

Contract: step_graphs(compile_module, opts, n_dynamo_inputs) returns the (forward, backward, inference)
compilers; a module the trees cannot take runs with per-segment CUDA graphs instead (logged).
"""
import logging

import torch

log = logging.getLogger("evt")


def step_graphs(compile_module, opts, n_dynamo_inputs):
    """(forward, backward, inference) compilers of cudagraphs "step": compile_module's plan, replayed as one
    CUDA graph per module through PyTorch's CUDA-graph trees (torch._inductor.cudagraph_trees, the machinery
    of mode="reduce-overhead": warm-up run, capture into a private memory pool, replay; parameters and buffers
    are static inputs (a moved one re-records), other inputs are copied into the graph's buffers; outputs of
    a replay stay valid until the next forward). The Python glue, PyTorch's ops between segments and every
    evt launch leave the host path. A module PyTorch's checks refuse (CPU tensors, several devices, a mutated
    input that is no parameter or buffer, an op that cannot be captured) runs with per-segment graphs instead
    ("segments"), logged; so does its backward. A capture that raises logs a warning and the module runs
    without the step graph from then on."""
    from torch._dynamo.backends.cudagraphs import (find_input_mutations, get_device_index,
                                                   get_device_node_mapping, get_stack_traces)
    from torch._inductor.cudagraph_trees import cudagraphify_impl, get_manager
    from torch._inductor.cudagraph_utils import (check_multiple_devices_or_any_cpu_nodes,
                                                 get_placeholder_info)
    from torch._inductor.utils import count_tangents, get_first_incompatible_cudagraph_node, num_fw_fixed_arguments
    seg_opts = dict(opts, cudagraphs="segments")
    state = {"on": True, "device": None}

    def skip(gm, static):
        mutated = set(find_input_mutations(gm.graph)) - set(static)
        if mutated:
            return f"mutates input(s) {sorted(mutated)}, which are no parameters or buffers"
        why = check_multiple_devices_or_any_cpu_nodes(get_device_node_mapping(gm))
        if why:
            return why
        node = get_first_incompatible_cudagraph_node(gm)
        return f"op {node.name} cannot be captured" if node is not None else None

    def graphed(gm, ex, kind, static, backward, inference):
        why = skip(gm, static)
        if why:
            log.info("%s: no step CUDA graph (%s); per-segment CUDA graphs", kind, why)
            return None
        run = compile_module(gm, ex, kind, opts)

        def consume(args):  # (the trees' calling convention: the model takes its argument list over)
            a = list(args)
            args.clear()
            return run(a)  # (a Plan clears `a` in turn, freeing each input after its last use)
        state["device"] = get_device_index(gm)
        g = cudagraphify_impl(consume, ex, static, device_index=state["device"], is_backward=backward,
                              is_inference=inference, stack_traces=get_stack_traces(gm),
                              placeholders=get_placeholder_info(gm.graph),
                              mutated_input_idxs=tuple(find_input_mutations(gm.graph)))
        broken = []
        plan = getattr(run, "plan", None)
        draw = plan.draw_rng_steps if plan is not None and plan.rng_segments() else None

        def step(args):
            if draw is not None:  # (dropout: this step's masks, from PyTorch's generator; see Plan.draw_rng_steps)
                draw()
            if broken:
                return run(args)
            try:
                return g(list(args))
            except Exception as e:  # noqa: BLE001 (a capture that fails must not fail the user's step)
                log.warning("%s: the step CUDA graph failed (%s: %s); the module runs without it from now on",
                            kind, type(e).__name__, str(e)[:300])
                broken.append(e)
                return run(args)
        step._boxed_call = True
        step.plan = getattr(run, "plan", None)
        log.info("%s: replayed as one CUDA graph (PyTorch CUDA-graph trees; %d static inputs)", kind, len(static))
        return step

    def forward(gm, ex, inference=False):
        kind = "inference" if inference else "forward"
        ctx = torch._guards.TracingContext.try_get()
        if ctx is not None and ctx.fw_metadata is not None:  # (parameters and buffers, as Inductor's)
            static = list(ctx.fw_metadata.static_input_indices)
        else:
            static = list(range(num_fw_fixed_arguments(n_dynamo_inputs, len(ex))))
        out = graphed(gm, ex, kind, static, False, inference)
        if out is None:
            state["on"] = False
            out = compile_module(gm, ex, kind, seg_opts)
        return out

    def backward(gm, ex):
        if not state["on"]:
            return compile_module(gm, ex, "backward", seg_opts)
        out = graphed(gm, ex, "backward", list(range(count_tangents(gm))), True, False)
        if out is None:  # (the forward was captured: tell the trees its backward ran, as PyTorch's backend does)
            run = compile_module(gm, ex, "backward", seg_opts)
            dev = state["device"] if state["device"] is not None else 0

            def out(args):
                mgr = get_manager(dev, create_if_none_exists=False)
                if mgr is not None:
                    mgr.set_to_running_backward()
                return run(args)
            out._boxed_call = True
        return out

    return forward, backward, lambda gm, ex: forward(gm, ex, inference=True)
