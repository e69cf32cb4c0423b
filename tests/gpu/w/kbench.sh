#!/usr/bin/env bash
# GPU window script: the issue's GEMM kernel table (bench/kernels/bench_tune.cu, its default cases: BERT-large's
# MLP GEMMs at 8192 tokens forward and backward, and 8192^3) with the tuner's first KBENCH_MAXCFG candidate
# configs x every scheduler variant; cuBLASLt plain and cuBLASLt + a separate generated kernel side by side,
# every fused result checked against the CPU reference. Uses the driver window_prep.sh builds.
#   bash tests/gpu/w/kbench.sh LOGFILE SECONDS
set -uo pipefail
WINDOW_SECS=300
. "$(dirname "$0")/budget.sh"  # LOG, SECS, left(); output appended to LOG
T0=$start
echo "=== kbench.sh: $(date -u) budget ${SECS}s"
BIN=${EVT_HOSTBIN:?window_prep.sh builds hostbin}/bench_tune
MAXCFG=${KBENCH_MAXCFG:-4}
B=/tmp/evt-kbench
mkdir -p "$B"
"$BIN" list "$MAXCFG"
timeout $(( $(left) - 60 )) "$BIN" compile "$MAXCFG" 2>&1 | grep -v "^\[evt-jit\] [0-9]*/" | tail -3
echo "-- run at +$(( $(date +%s) - T0 ))s"
timeout $(( $(left) - 5 )) "$BIN" run "$MAXCFG" "$B/kbench.md" 20 2>&1 | grep -v "^\[evt-jit\]"
echo
echo "### kernel table (bench_tune default cases, $(date -u +%H:%M) UTC)"
cat "$B/kbench.md" 2>/dev/null || echo "(no table)"
echo "=== kbench.sh done at +$(( $(date +%s) - T0 ))s"
