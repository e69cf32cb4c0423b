#!/usr/bin/env bash
# GPU window script: `evtc tune` on whole training-step segments (the GEMM+EVT groups the fused runtime and
# the torch.compile backend run), records into the JIT cache's tune/ directory, which later scripts of the
# same window (torchgpu.sh, prof.sh) read: their programs then run the tuned configs or the measured
# unfused path. Then `evtc compile --stats` per graph shows each group's choice.
#   bash tests/gpu/w/tunegraphs.sh LOGFILE SECONDS      (repo root, on the H200; environment: tests/gpu/window.sh)
# TUNE_GRAPHS: space-separated .evt files (default: .gpuwork/w/graphs/*.evt, the paper MLP's forward and
# backward segments as the torch backend builds them); TUNE_MAXCFG (default 3) candidate configs per kernel.
# EVT_REFINE_PARTITION=1 as in the torch backend's programs (the same groups are tuned).
set -u
WINDOW_SECS=240
. "$(dirname "$0")/budget.sh"
echo "== tunegraphs.sh ($(date -u +%H:%M:%S), budget ${SECS}s)"
export EVT_REFINE_PARTITION=1
EVTC=${EVTC:-build/evtc}
graphs=${TUNE_GRAPHS:-$(ls .gpuwork/w/graphs/*.evt 2>/dev/null)}
[ -n "$graphs" ] || { echo "no graphs"; exit 1; }
# 1. compile every graph's candidates in one go per graph (16 nvcc), then measure
for g in $graphs; do
  l=$(( $(left) - 20 ))
  [ "$l" -lt 30 ] && { echo "-- $g skipped: ${l}s left"; continue; }
  echo "-- [$(date -u +%H:%M:%S)] evtc tune $g (limit ${l}s)"
  timeout -k 5 "$l" "$EVTC" tune "$g" --max-configs "${TUNE_MAXCFG:-3}" --reps 20 --jobs "${EVT_JIT_JOBS:-16}" 2>&1 |
    grep -v "^\[evt-jit\] [0-9]*/"
  echo "evtc tune exit ${PIPESTATUS[0]} at +$(( $(date +%s) - start ))s"
done
for g in $graphs; do
  echo "-- choices of $g (evtc compile --stats)"
  timeout 20 "$EVTC" compile "$g" -o "/tmp/tunegraphs-$(basename "$g" .evt)" --stats 2>&1 | sed -n '/gemm+evt tuning/,$p'
done
echo "records: $(ls "${EVT_JIT_CACHE:-/tmp}/tune" 2>/dev/null | wc -l) in ${EVT_JIT_CACHE:-?}/tune"
echo "== tunegraphs.sh done at +$(( $(date +%s) - start ))s"
