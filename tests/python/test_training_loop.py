"""Training-loop features of real scripts, with torch.compile(model, backend="evt") on the CPU.

Each test trains a few optimizer steps with the compiled model and, side by side from the same initial weights,
with eager PyTorch, and compares the loss and every gradient (fp32 rel <= 1e-5, fp16 autocast 1e-2, bf16 2e-2:
see BF16_TOL; a NaN or inf never passes). Every test also checks that evt really ran the step: interpreter segments ran,
no segment and no op fell back to PyTorch, no module ran in PyTorch (`EvtCheck`). Features: gradient
accumulation, activation checkpointing, bf16 autocast, fp16 autocast with GradScaler, changing sequence
lengths (plans built per shape, reused when a shape comes back), eval + no_grad between training steps, a
state_dict round trip, two compiled models in one process, and DistributedDataParallel / FSDP2 on two gloo
processes against single-process training on the full batch (tests/gpu/torch_distributed_gpu.py: the NCCL
version on two GPUs).
"""
import copy
import io
import logging
import os
import sys

import pytest

torch = pytest.importorskip("torch")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"))
sys.path.insert(0, HERE)
import evt  # noqa: E402
from evt import lib as evt_lib  # noqa: E402
from evt import segment as evt_segment  # noqa: E402
import distributed_train  # noqa: E402
from loop_models import BatchNormMLP, TinyLM, lm_batch, mlp_batch, rel_err  # noqa: E402

pytestmark = pytest.mark.skipif(not evt_lib.has_interpreter(), reason="libevt has no CPU interpreter yet")

torch.set_num_threads(1)
os.environ.setdefault("EVT_CACHE", "0")  # in-process tests stay off the disk cache

# fp16 against eager fp16: 1e-2. bf16 keeps 8 significant bits (rounding 2^-9 = 2e-3 per operation): eager bf16's
# own gradients are ~1e-2 from an fp32 run of these models, and two bf16 computations that round in different
# places (evt rounds where its graph passes decompose an op, eager where its kernels do) differ by up to about
# that twice; test_bf16_autocast also checks that evt is no farther from fp32 than eager.
FP32_TOL, HALF_TOL, BF16_TOL = 1e-5, 1e-2, 2e-2


# ---- checks ------------------------------------------------------------------------------------------------

def assert_close(got, want, tol, what):
    err = rel_err(got, want)
    assert err <= tol, f"{what}: rel error {err:.3g} > {tol}"


def assert_grads_equal(model, ref, tol, what=""):
    """Every parameter gradient of model against ref's (same names)."""
    for (name, p_ref), (_, p) in zip(ref.named_parameters(), model.named_parameters()):
        assert p.grad is not None and p_ref.grad is not None, (what, name)
        assert_close(p.grad, p_ref.grad, tol, f"{what} grad {name}")


def assert_params_equal(model, ref, tol, what=""):
    for (name, p_ref), (_, p) in zip(ref.state_dict().items(), model.state_dict().items()):
        if p_ref.is_floating_point():
            assert_close(p, p_ref, tol, f"{what} {name}")
        else:
            assert torch.equal(p, p_ref), (what, name)


class EvtCheck:
    """Resets evt's STATS, its in-memory cache of compiled segments (so the compile counts a test asserts do not
    depend on the tests before it) and dynamo's caches, captures the evt log; all_in_evt() asserts that evt ran
    the compiled modules: interpreter segments ran, nothing ran in PyTorch (no segment, no op, no module)."""

    def __init__(self, caplog):
        torch._dynamo.reset()
        evt.reset_stats()
        evt_segment._GRAPHS.clear()
        caplog.set_level(logging.INFO, logger="evt")
        self.caplog = caplog

    def messages(self):
        return [r.getMessage() for r in self.caplog.records if r.name == "evt"]

    def all_in_evt(self):
        msgs = self.messages()
        assert evt.STATS["interp_segment_runs"] > 0, dict(evt.STATS)
        assert evt.STATS["torch_segment_runs"] == 0, dict(evt.STATS)
        bad = [m for m in msgs if "fallback to PyTorch" in m or "runs in PyTorch" in m or "failed" in m]
        assert not bad, bad


def step(compiled, ref, batch, backward_scale=1.0):
    """One forward + backward of both models on batch; returns (loss, reference loss)."""
    loss_ref = ref(*batch)
    (loss_ref * backward_scale).backward()
    loss = compiled(*batch)
    (loss * backward_scale).backward()
    return loss, loss_ref


def pair(make_model, seed=0):
    """(eager model, its copy): the same initial weights."""
    torch.manual_seed(seed)
    ref = make_model()
    return ref, copy.deepcopy(ref)


# ---- 1. gradient accumulation -----------------------------------------------------------------------------

def test_gradient_accumulation(caplog):
    """Three backward calls (loss / 3 each) add into .grad before every optimizer step (SGD with momentum: its
    update is linear in the gradient, so the weights compare at the gradients' tolerance; Adam divides by
    sqrt(v) and magnifies the rounding of near-zero gradients); the gradients after each micro-batch and the
    updated weights match eager."""
    check = EvtCheck(caplog)
    ref, model = pair(TinyLM)
    compiled = torch.compile(model, backend="evt", fullgraph=True)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for outer in range(2):
        for micro in range(3):
            loss, loss_ref = step(compiled, ref, lm_batch(), backward_scale=1 / 3)
            assert_close(loss, loss_ref, FP32_TOL, f"loss {outer}.{micro}")
            assert_grads_equal(model, ref, FP32_TOL, f"{outer}.{micro}")
        opt_ref.step()
        opt.step()
        opt_ref.zero_grad()
        opt.zero_grad()
        assert_params_equal(model, ref, FP32_TOL, f"after step {outer}")
    check.all_in_evt()
    assert evt.STATS["plans"] == 2  # one forward and one backward plan for all six micro-batches


# ---- 2. activation checkpointing ----------------------------------------------------------------------------

def test_activation_checkpointing(caplog):
    """checkpoint(..., use_reentrant=False) around the attention and the MLP: the backward recomputes them.
    PyTorch wraps the recomputed SDPA (tagged as a random op for its dropout) in RNG-state wrappers; with
    dropout_p = 0 evt unwraps it, so the whole step runs in evt (one segment per module)."""
    check = EvtCheck(caplog)
    ref, model = pair(lambda: TinyLM(ckpt=True))
    compiled = torch.compile(model, backend="evt", fullgraph=True)
    opt_ref, opt = torch.optim.SGD(ref.parameters(), lr=0.1), torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(3):
        loss, loss_ref = step(compiled, ref, lm_batch())
        assert_close(loss, loss_ref, FP32_TOL, f"loss {i}")
        assert_grads_equal(model, ref, FP32_TOL, str(i))
        opt_ref.step()
        opt.step()
        opt_ref.zero_grad()
        opt.zero_grad()
    check.all_in_evt()
    msgs = check.messages()
    assert any("run unwrapped" in m for m in msgs), msgs
    assert any(m.startswith("backward: ") and "1 evt segment(s)" in m for m in msgs), msgs
    assert evt.STATS["plans"] == 2  # no symbolic generator state: one plan per module, not one per call signature


# ---- 3. autocast --------------------------------------------------------------------------------------------

def test_bf16_autocast(caplog):
    """torch.autocast("cpu", dtype=torch.bfloat16) around the compiled forward; SGD steps. evt's gradients agree
    with eager bf16 and are no farther from an fp32 run of the same model than eager bf16's are (the rounding
    of two bf16 computations differs by about bf16's own error)."""
    check = EvtCheck(caplog)
    ref, model = pair(TinyLM)
    fp32 = copy.deepcopy(ref)
    compiled = torch.compile(model, backend="evt", fullgraph=True)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (ref, model, fp32)]
    for i in range(3):
        batch = lm_batch()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss, loss_ref = step(compiled, ref, batch)
        fp32(*batch).backward()
        assert_close(loss, loss_ref, HALF_TOL, f"loss {i}")
        assert_grads_equal(model, ref, BF16_TOL, str(i))
        for (name, p32), p_ref, p in zip(fp32.named_parameters(), ref.parameters(), model.parameters()):
            eager_noise = rel_err(p_ref.grad, p32.grad)
            assert rel_err(p.grad, p32.grad) <= 2 * eager_noise + 1e-3, (i, name, eager_noise)
        for o in opts:
            o.step()
            o.zero_grad()
        for p32, p_ref in zip(fp32.parameters(), ref.parameters()):  # (the fp32 run follows eager bf16's weights)
            p32.data.copy_(p_ref.data)
    check.all_in_evt()


def test_fp16_autocast_with_grad_scaler(caplog):
    """fp16 autocast on the CPU with torch.amp.GradScaler("cpu"): the scaled loss's gradients, unscaled with
    scaler.unscale_, and the scale's updates. The first scale (2^24) overflows fp16 in the backward by far, the
    next (2^20) too, the one after (2^16) by far not: the scaler skips exactly the first two steps, on evt as
    on eager, and the weights stay equal."""
    check = EvtCheck(caplog)
    ref, model = pair(TinyLM)
    compiled = torch.compile(model, backend="evt", fullgraph=True)
    opt_ref, opt = torch.optim.SGD(ref.parameters(), lr=0.1), torch.optim.SGD(model.parameters(), lr=0.1)
    scalers = [torch.amp.GradScaler("cpu", init_scale=2.0 ** 24, backoff_factor=2.0 ** -4, growth_interval=100)
               for _ in range(2)]
    found = []
    for i in range(4):
        batch = lm_batch()
        with torch.autocast("cpu", dtype=torch.float16):
            loss_ref = ref(*batch)
            loss = compiled(*batch)
        assert_close(loss, loss_ref, HALF_TOL, f"loss {i}")
        infs = []
        for scaler, o, lo in zip(scalers, (opt_ref, opt), (loss_ref, loss)):
            scaler.scale(lo).backward()
            scaler.unscale_(o)
            infs.append(sum(v.item() for v in scaler._per_optimizer_states[id(o)]["found_inf_per_device"].values()))
        assert infs[0] == infs[1], (i, infs)
        found.append(infs[0] > 0)
        if not found[-1]:
            assert_grads_equal(model, ref, HALF_TOL, str(i))
        for scaler, o in zip(scalers, (opt_ref, opt)):
            scaler.step(o)
            scaler.update()
            o.zero_grad()
        assert scalers[0].get_scale() == scalers[1].get_scale(), i
        assert_params_equal(model, ref, HALF_TOL, f"after step {i}")
    assert found == [True, True, False, False], found
    check.all_in_evt()


# ---- 4. changing sequence lengths ----------------------------------------------------------------------------

SEQ_LENS = (8, 5, 12, 8, 5)


def train_on_lengths(compiled, model, ref, lens):
    """One SGD step per sequence length; returns the plans and segment compiles evt did at each step."""
    opt_ref, opt = torch.optim.SGD(ref.parameters(), lr=0.1), torch.optim.SGD(model.parameters(), lr=0.1)
    new = []
    for seq in lens:
        before = evt.STATS["plans"], evt.STATS["segments_compiled"]
        loss, loss_ref = step(compiled, ref, lm_batch(2, seq))
        assert_close(loss, loss_ref, FP32_TOL, f"loss at length {seq}")
        assert_grads_equal(model, ref, FP32_TOL, f"length {seq}")
        for o in (opt_ref, opt):
            o.step()
            o.zero_grad()
        new.append((evt.STATS["plans"] - before[0], evt.STATS["segments_compiled"] - before[1]))
    return new


def test_sequence_lengths_default_compile(caplog):
    """torch.compile's default: the first length compiles a static graph, the second recompiles it with
    symbolic sizes (dynamo's automatic dynamic shapes); evt builds a forward and a backward plan (one segment
    each) per concrete length at its first call there, and a length that comes back reuses them. Dynamo's
    symbolic graph serves every call after the first, so length 8 gets one plan more there; its segments differ
    from the static graph's only in the names of the module's inputs (the symbolic graph also takes the sizes),
    so they are compiled once more."""
    check = EvtCheck(caplog)
    ref, model = pair(TinyLM)
    compiled = torch.compile(model, backend="evt")
    new = train_on_lengths(compiled, model, ref, SEQ_LENS)
    assert new == [(2, 2), (2, 2), (2, 2), (2, 2), (0, 0)], new
    check.all_in_evt()


def test_sequence_lengths_static(caplog):
    """dynamic=False: dynamo compiles a static graph per length (evt: one forward and one backward plan each) and
    finds it again when the length comes back (nothing compiled)."""
    check = EvtCheck(caplog)
    ref, model = pair(TinyLM)
    compiled = torch.compile(model, backend="evt", dynamic=False)
    new = train_on_lengths(compiled, model, ref, SEQ_LENS)
    assert new == [(2, 2), (2, 2), (2, 2), (0, 0), (0, 0)], new
    check.all_in_evt()


def test_sequence_lengths_dynamic_true(caplog):
    """dynamic=True: one symbolic graph; evt plans each concrete length once and reuses the plans."""
    check = EvtCheck(caplog)
    ref, model = pair(TinyLM)
    compiled = torch.compile(model, backend="evt", dynamic=True)
    new = train_on_lengths(compiled, model, ref, SEQ_LENS)
    assert new == [(2, 2), (2, 2), (2, 2), (0, 0), (0, 0)], new
    check.all_in_evt()


# ---- 5. eval + no_grad between training steps -------------------------------------------------------------------

def test_eval_no_grad_then_train(caplog):
    """Train (BatchNorm uses batch statistics and updates its running ones), evaluate under model.eval() and
    torch.no_grad() through the same compiled module (running statistics; evt's inference plan), train again:
    losses, gradients, running statistics and the evaluation loss match eager."""
    check = EvtCheck(caplog)
    ref, model = pair(BatchNormMLP)
    compiled = torch.compile(model, backend="evt", fullgraph=True)
    opt_ref, opt = torch.optim.SGD(ref.parameters(), lr=0.1), torch.optim.SGD(model.parameters(), lr=0.1)

    def train(n):
        for m in (ref, model):
            m.train()
        for i in range(n):
            loss, loss_ref = step(compiled, ref, mlp_batch())
            assert_close(loss, loss_ref, FP32_TOL, f"loss {i}")
            assert_grads_equal(model, ref, FP32_TOL, str(i))
            assert_params_equal(model, ref, FP32_TOL, f"buffers {i}")
            for o in (opt_ref, opt):
                o.step()
                o.zero_grad()

    train(2)
    assert evt.STATS["plans"] == 2
    for m in (ref, model):
        m.eval()
    runs = evt.STATS["interp_segment_runs"]
    with torch.no_grad():
        for _ in range(2):
            batch = mlp_batch()
            got, want = compiled(*batch), ref(*batch)
            assert not got.requires_grad
            assert_close(got, want, FP32_TOL, "eval loss")
    assert evt.STATS["interp_segment_runs"] > runs  # the evaluation ran in evt
    assert any(m.startswith("inference: ") for m in check.messages())
    assert evt.STATS["plans"] == 3  # the inference plan
    train(2)
    assert evt.STATS["plans"] == 3  # training again: the first two plans
    check.all_in_evt()


# ---- 6. state_dict round trip -----------------------------------------------------------------------------------

def test_state_dict_round_trip(caplog):
    """A trained compiled model and its optimizer are saved (torch.save of their state_dicts) and loaded into a
    fresh compiled model: the same outputs, and further training of both stays equal. The fresh model's
    segments are evt's in-memory cache hits (the same texts)."""
    check = EvtCheck(caplog)
    torch.manual_seed(0)
    model = TinyLM()
    compiled = torch.compile(model, backend="evt", fullgraph=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(2):
        compiled(*lm_batch()).backward()
        opt.step()
        opt.zero_grad()
    buf = io.BytesIO()
    torch.save({"model": compiled.state_dict(), "opt": opt.state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf)
    assert all(k.startswith("_orig_mod.") for k in saved["model"])  # a compiled module's keys

    torch.manual_seed(1)
    fresh = TinyLM()
    fresh_compiled = torch.compile(fresh, backend="evt", fullgraph=True)
    fresh_compiled.load_state_dict(saved["model"])
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    fresh_opt.load_state_dict(saved["opt"])
    assert_params_equal(fresh, model, 0.0, "loaded")
    compiled_segments = evt.STATS["segments_compiled"]
    for i in range(2):
        batch = lm_batch()
        loss, loss_fresh = compiled(*batch), fresh_compiled(*batch)
        assert_close(loss_fresh, loss, FP32_TOL, f"loss {i}")
        loss.backward()
        loss_fresh.backward()
        assert_grads_equal(fresh, model, FP32_TOL, str(i))
        for o in (opt, fresh_opt):
            o.step()
            o.zero_grad()
        assert_params_equal(fresh, model, FP32_TOL, f"after step {i}")
    assert evt.STATS["segments_compiled"] == compiled_segments
    check.all_in_evt()


# ---- 7. two compiled models in one process -----------------------------------------------------------------------

def test_two_compiled_models_interleaved(caplog):
    """Two models of the same architecture (different weights: evt shares their parsed segments) and a third
    of another, stepped interleaved (all forwards, then the backwards in another order): each matches its own
    eager twin."""
    check = EvtCheck(caplog)
    pairs = [pair(TinyLM, seed=0), pair(TinyLM, seed=1), pair(BatchNormMLP, seed=2)]
    compiled = [torch.compile(m, backend="evt", fullgraph=True) for _, m in pairs]
    opts = [(torch.optim.SGD(r.parameters(), lr=0.1), torch.optim.SGD(m.parameters(), lr=0.1)) for r, m in pairs]
    batches = [lm_batch, lm_batch, mlp_batch]
    for i in range(2):
        losses = []
        for (ref, _), c, make in zip(pairs, compiled, batches):
            batch = make()
            losses.append((c(*batch), ref(*batch)))
        for k in (1, 2, 0):
            loss, loss_ref = losses[k]
            assert_close(loss, loss_ref, FP32_TOL, f"model {k} loss {i}")
            loss.backward()
            loss_ref.backward()
        for k, (ref, model) in enumerate(pairs):
            assert_grads_equal(model, ref, FP32_TOL, f"model {k} step {i}")
        for o_ref, o in opts:
            for x in (o_ref, o):
                x.step()
                x.zero_grad()
    check.all_in_evt()


# ---- 8. DistributedDataParallel and FSDP2 (two gloo processes) -----------------------------------------------------

def check_distributed(reports, world=2):
    """Every rank's loss (averaged over the ranks), gradients (all of them; a sharded one gathered) and final
    weights equal single-process eager training on the full batch, and evt ran the rank's compiled modules."""
    assert len(reports) == world
    for r in reports:
        what = f'{r["mode"]} rank {r["rank"]}'
        assert max(r["loss_errs"]) <= FP32_TOL, (what, r)
        assert max(r["grad_errs"]) <= FP32_TOL, (what, r)
        assert r["weight_err"] <= FP32_TOL, (what, r)
        assert r["grads_checked"] == len(list(TinyLM().parameters())), (what, r)
        assert r["stats"].get("interp_segment_runs", 0) > 0 and r["stats"].get("plans", 0) > 0, (what, r)
        assert r["stats"].get("torch_segment_runs", 0) == 0 and not r["in_pytorch"], (what, r)


def test_distributed_data_parallel_gloo():
    """torch.compile(DDP(model), backend="evt") on two gloo processes, 3 SGD steps (distributed_train.py)."""
    check_distributed(distributed_train.launch("ddp", "gloo", world=2, steps=3))


def test_fsdp2_gloo():
    """fully_shard on the block and the root, then torch.compile(model, backend="evt"), on two gloo processes: the
    sharded gradients gathered equal the full batch's (distributed_train.py)."""
    check_distributed(distributed_train.launch("fsdp2", "gloo", world=2, steps=3))
