#!/usr/bin/env bash
# GPU window script "dropcheck": evt's dropout on CUDA, checked and then timed (tests/gpu/window.sh environment).
#   bash tests/gpu/w/dropcheck.sh LOGFILE SECONDS     (repo root, on the H200; made for ~540 s, nothing cached)
# Phase 1, four jobs at once (each its own share of nvcc jobs, so the CUTLASS kernels of all of them compile
# together; logs LOGFILE.<job>, appended at the end):
#   visitors  tests/gpu/w/visitors.sh with VISITORS_PARTS="rows gemm": every row example (cmp_where draws rand
#             at offsets 89 and 0, four elements per Philox call where rows allow) and the GEMM example
#             bias_dropout (evt_nodes::Philox), bit for bit against the CPU reference;
#   dropout   tests/gpu/torch_dropout_gpu.py: torch.compile(backend="evt") with evt's masks, 3 modes x bf16/f32,
#             against eager run with evt's mask;
#   prefetch  the kernels of bench/graphs/{mlp,bert_layer}_bf16.evt (for phase 3);
#   prewarm   one evt step of bench/e2e/run.py bert_large --dropout (its kernels, for phase 2).
# Phase 2 (alone on the machine): tests/gpu/w/torchgpu.sh, bert_large --dropout, modes DROPCHECK_MODES
#   (default eager+inductor+evt_cg) (evt draws the masks: the default gpu_ops).
# Phase 3: tests/gpu/w/gemmrt.sh on the two dropout graphs (evtc run --fused --check against the interpreter).
set -u
LOG=${1:?LOGFILE}
SECS=${2:-540}
t0=$SECONDS
left() { echo $((SECS - (SECONDS - t0))); }
exec >>"$LOG" 2>&1
echo "=== dropcheck.sh: $(date -u +%H:%M:%S), budget ${SECS}s"
export EVT_CACHE_DIR=${EVT_CACHE_DIR:-/tmp/evt-torchgpu-cache} PYTHONUNBUFFERED=1
graphs="bench/graphs/mlp_bf16.evt bench/graphs/bert_layer_bf16.evt"
p1=$(( SECS * 45 / 100 ))
VISITORS_PARTS="rows gemm" VISITORS_GEMM_MIN=80 EVT_JIT_JOBS=3 timeout -k 5 $p1 bash tests/gpu/w/visitors.sh "$LOG.visitors" $p1 &
EVT_JIT_JOBS=4 timeout -k 5 $p1 python3 tests/gpu/torch_dropout_gpu.py > "$LOG.dropout" 2>&1 &
EVT_JIT_JOBS=3 timeout -k 5 $p1 "${EVTC:-build/evtc}" prefetch $graphs > "$LOG.prefetch" 2>&1 &
EVT_JIT_JOBS=8 timeout -k 5 $p1 python3 bench/e2e/run.py --child bert_large --modes evt --iters 1 --warmup 0 --quick \
  --no-profile --dropout > "$LOG.prewarm" 2>&1 &
wait
echo "--- phase 1 done at $((SECONDS - t0)) s"
for j in visitors dropout prefetch prewarm; do
  echo; echo "=== $j"; grep -vE '^\[evt-jit\] [0-9]+/|GPU program for' "$LOG.$j" | tail -c 12000; rm -f "$LOG.$j"
done
p2=$(( $(left) - 60 ))
if [ $p2 -gt 60 ]; then
  TORCHGPU_MODELS=none TORCHGPU_BENCH_ARGS=--dropout TORCHGPU_BENCH="bert_large:$((p2 - 20)):1:${DROPCHECK_MODES:-eager+inductor+evt_cg}" \
    bash tests/gpu/w/torchgpu.sh "$LOG.bench" $p2
  echo; echo "=== bench (bert_large --dropout, evt's masks)"; grep -vE '^\[evt-jit\]|GPU program for' "$LOG.bench" | tail -c 15000
  rm -f "$LOG.bench"
else
  echo "bench skipped: $(left) s left"
fi
if [ "$(left)" -gt 25 ]; then
  GEMMRT_GRAPHS="$graphs" bash tests/gpu/w/gemmrt.sh "$LOG.gemmrt" $(( $(left) - 10 ))
  echo; echo "=== gemmrt (dropout graphs, fused vs the interpreter)"; tail -c 6000 "$LOG.gemmrt"; rm -f "$LOG.gemmrt"
fi
echo "=== dropcheck.sh done at $((SECONDS - t0)) s"
