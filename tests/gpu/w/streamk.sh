#!/usr/bin/env bash
# GPU window script: the stream-K candidates on the H200 (src/runtime/tune.c evt_tune_candidates proposes them
# for GEMMs with fewer 128x256 tiles than SMs over K >= 2048). Graph: tests/gpu/graphs/streamk_bf16.evt (two
# starved weight gradients, 1024x1024x8192 and 1024x256x8192, plus its forward GEMMs).
#   1. `evtc tune` with 3 configs per kernel (the default, stream-K 128x256, stream-K 128x128): every candidate
#      timed at its scheduler variants, the fastest checked against the CPU (sampled rows / columns), vs cuBLAS;
#   2. `evtc compile --stats`: each group's record;
#   3. the fused step with those records, checked against the CPU interpreter (`evtc run --fused --check`),
#      then the same with EVT_PLAIN_GEMM=cutlass and the records moved away, for the untuned default kernels.
#   bash tests/gpu/w/streamk.sh LOGFILE SECONDS     (repo root, on the H200; environment: tests/gpu/window.sh)
set -u
WINDOW_SECS=200
. "$(dirname "$0")/budget.sh"
echo "== streamk.sh ($(date -u +%H:%M:%S), budget ${SECS}s)"
export EVT_REFINE_PARTITION=1
export EVT_TUNE_CACHE=/tmp/evt-streamk-records   # records of this script only
rm -rf "$EVT_TUNE_CACHE"; mkdir -p "$EVT_TUNE_CACHE"
EVTC=${EVTC:-build/evtc}
g=tests/gpu/graphs/streamk_bf16.evt
l=$(( $(left) - 60 ))
echo "-- [$(date -u +%H:%M:%S)] evtc tune $g --max-configs 3 (limit ${l}s)"
timeout -k 5 "$l" "$EVTC" tune "$g" --max-configs 3 --reps 20 --jobs "${EVT_JIT_JOBS:-16}" 2>&1 | grep -v "^\[evt-jit\] [0-9]*/"
echo "evtc tune exit ${PIPESTATUS[0]} at +$(( $(date +%s) - start ))s"
echo "-- records"; for f in "$EVT_TUNE_CACHE"/tune/*.txt; do echo "# $f"; cat "$f"; done
echo "-- choices (evtc compile --stats)"
timeout 30 "$EVTC" compile "$g" -o /tmp/streamk-compile --stats 2>&1 | sed -n '/gemm+evt tuning/,$p'
echo "-- [$(date -u +%H:%M:%S)] fused step with the records, checked against the CPU interpreter"
timeout -k 5 $(( $(left) - 5 )) "$EVTC" run "$g" --device cuda --fused --check --stats --steps 3 2>&1 | tail -25
echo "exit ${PIPESTATUS[0]}"
