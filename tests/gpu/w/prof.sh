#!/usr/bin/env bash
# ad-hoc (lead, uncommitted): profile evt's e2e mlp step
LOG=${1:?}; SECS=${2:-200}
exec >>"$LOG" 2>&1
export EVT_CACHE_DIR=/tmp/evt-prof-cache PYTHONUNBUFFERED=1
timeout -k 5 $SECS python3 bench/e2e/run.py --quick --workloads mlp --modes evt,eager --budget $((SECS-5)) --out /tmp/prof-e2e
