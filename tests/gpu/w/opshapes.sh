#!/usr/bin/env bash
# GPU window script: the PyTorch ops (shapes, calling line) with GPU time in one training step of e2e
# workloads (bench/e2e/opshapes.py), to find copies and glue outside evt's kernels.
#   bash tests/gpu/w/opshapes.sh LOGFILE SECONDS   (repo root, on the H200; environment from tests/gpu/window.sh)
# OPSHAPES "workload:scale:mode[:match],..." (default bert_large:1:evt).
set -u
WINDOW_SECS=90
. "$(dirname "$0")/budget.sh"
echo "== opshapes.sh ($(date -u +%H:%M:%S), budget ${SECS}s)"
export EVT_CACHE_DIR=${EVT_CACHE_DIR:-/tmp/evt-torchgpu-cache} PYTHONUNBUFFERED=1
for spec in ${OPSHAPES:-bert_large:1:evt}; do
  spec=${spec//,/ }
  for ws in $spec; do
    IFS=: read -r w sc mode match <<<"$ws"
    l=$(( $(left) - 5 ))
    [ "$l" -lt 20 ] && { echo "-- $w $mode skipped: ${l}s left"; continue; }
    echo "-- [$(date -u +%H:%M:%S)] $w scale ${sc:-1} mode ${mode:-evt} (timeout ${l}s)"
    timeout -k 5 "$l" python3 bench/e2e/opshapes.py "$w" --scale "${sc:-1}" --mode "${mode:-evt}" \
      ${match:+--match "$match"} --top 30 2>&1 | grep -v "^\[evt-jit\]" | tail -c 20000
  done
done
echo "== opshapes.sh done at +$(( $(date +%s) - start ))s"
