#!/usr/bin/env bash
# GPU window script: where evt's training step spends its GPU time, per step of each program (EVT_PROFILE,
# src/runtime/profile.c), on end-to-end workloads (bench/e2e/run.py --child W --modes evt).
#   bash tests/gpu/w/prof.sh LOGFILE SECONDS     (repo root, on the H200; environment from tests/gpu/window.sh)
# PROF_WORKLOADS "workload:scale,..." (default mlp:1), PROF_EVERY (default 4: a table after every 4th run of
# each program). PROF_HOST=N: host time per step instead (EVT_HOST_PROFILE=N, no synchronization; a table
# after every N-th run of each program). Profiling waits for events after each run: the ms printed by run.py here are not
# benchmark numbers (bench/e2e/run.py without EVT_PROFILE gives those); the per-step tables are the result.
set -u
WINDOW_SECS=90
. "$(dirname "$0")/budget.sh"
echo "== prof.sh: EVT_PROFILE per-step GPU time ($(date -u +%H:%M:%S), budget ${SECS}s)"
export EVT_CACHE_DIR=${EVT_CACHE_DIR:-/tmp/evt-torchgpu-cache} PYTHONUNBUFFERED=1
for spec in ${PROF_WORKLOADS:-mlp:1}; do
  spec=${spec//,/ }
  for ws in $spec; do
    IFS=: read -r w sc <<<"$ws"
    l=$(( $(left) - 5 ))
    [ "$l" -lt 20 ] && { echo "-- $w skipped: ${l}s left"; continue; }
    echo "-- [$(date -u +%H:%M:%S)] $w scale ${sc:-1} (timeout ${l}s)"
    if [ -n "${PROF_HOST:-}" ]; then pe=(EVT_HOST_PROFILE="$PROF_HOST"); else pe=(EVT_PROFILE="${PROF_EVERY:-4}"); fi
    env "${pe[@]}" timeout -k 5 "$l" python3 bench/e2e/run.py --child "$w" --modes evt \
      --scale "${sc:-1}" --iters 4 --warmup 0 --quick --no-profile 2>&1 | grep -v "^\[evt-jit\] [0-9]*/" | tail -c 40000
  done
done
echo "== prof.sh done at +$(( $(date +%s) - start ))s"
