#!/usr/bin/env bash
# GPU window script: how stable is the tuner's fused-vs-unfused verdict? `evtc tune --force --max-configs 1`
# on the paper MLP's segments (TUNEBIAS_GRAPHS, default .gpuwork/w/graphs/mlp_fwd.evt: the forward as the torch
# backend builds it), once per run of TUNEBIAS_RUNS ("VAR=value:tag,..." or "-:tag" for no setting; default two
# plain runs), each run with its own record directory; prints each problem's fused / unfused lines per run.
# Session 19 ran it with two experimental timing changes (not kept): a 256 MiB memset before every timed call
# (S19W2) and operands scaled to a unit-variance accumulator (S19W3); neither moved the verdict on the MLP's
# fc1 forward (fused 1.71-1.72 ms, cuBLASLt + row kernel 1.62-1.64 ms in every run), which the training step
# runs at 1.47-1.53 ms fused (profiles in S19W1/S19W3's torchgpu.log).
#   bash tests/gpu/w/tunebias.sh LOGFILE SECONDS     (repo root, on the H200; environment: tests/gpu/window.sh)
set -u
WINDOW_SECS=200
. "$(dirname "$0")/budget.sh"
echo "== tunebias.sh ($(date -u +%H:%M:%S), budget ${SECS}s)"
export EVT_REFINE_PARTITION=1
EVTC=${EVTC:-build/evtc}
graphs=${TUNEBIAS_GRAPHS:-.gpuwork/w/graphs/mlp_fwd.evt}
runs=${TUNEBIAS_RUNS:--:a,-:b}
for run in ${runs//,/ }; do
  setting=${run%%:*} tag=${run##*:}
  for g in $graphs; do
    l=$(( $(left) - 5 ))
    [ "$l" -lt 20 ] && { echo "-- run $tag $g skipped: ${l}s left"; continue; }
    echo "-- [$(date -u +%H:%M:%S)] run $tag: $setting, $g"
    [ "$setting" = - ] && setting=TUNEBIAS_RUN=$tag
    env "$setting" EVT_TUNE_CACHE=/tmp/tunebias-$tag timeout -k 5 "$l" "$EVTC" tune "$g" --force --max-configs 1 \
      --reps 20 --jobs "${EVT_JIT_JOBS:-16}" 2>&1 | grep -E "ms|took|exit" | grep -v "^\[evt-jit\]"
  done
done
