#!/usr/bin/env bash
# GPU window script: one ad-hoc command (a diagnosis that no other script covers), its output in the log.
#   WINDOW_CMD='...' bash tests/gpu/w/cmd.sh LOGFILE SECONDS   (repo root, on the H200; tests/gpu/window.sh env)
# Example: dump the segments evt builds for a workload on CUDA (files printed into the log):
#   WINDOW_CMD='EVT_LOG=1 E2E_EVT_OPTIONS={\"dump\":\"/tmp/d\"} python3 bench/e2e/run.py --child xmlcnn_paper --modes evt --scale 0.25
#     --iters 1 --warmup 0 --quick --no-profile; tail -n +1 /tmp/d/*.evt'
set -u
LOG=${1:?LOGFILE}
SECS=${2:-60}
exec >>"$LOG" 2>&1
echo "== cmd.sh ($(date -u +%H:%M:%S), budget ${SECS}s): ${WINDOW_CMD:?WINDOW_CMD}"
export EVT_CACHE_DIR=${EVT_CACHE_DIR:-/tmp/evt-torchgpu-cache} PYTHONUNBUFFERED=1
timeout -k 5 "$SECS" bash -c "$WINDOW_CMD"
echo "== cmd.sh rc $?"
