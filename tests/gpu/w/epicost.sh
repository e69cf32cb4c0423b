#!/usr/bin/env bash
# GPU window script: what a GEMM epilogue costs by itself, and the mainloop alone at 8192^3.
#   bash tests/gpu/w/epicost.sh LOGFILE SECONDS        (tests/gpu/window.sh; bench_tune prebuilt by window_prep.sh)
# 1. The fc1 forward epilogues (plain, bias, bias + aux, bias + GELU, bias + GELU + aux) at 16384x4096 over
#    EPICOST_KS (default "64 1024"): at K = 64 the mainloop is one k-tile, so the kernel time is ~ the epilogue's
#    (per tile: time / tiles per SM); at K = 1024 what is left of it after the overlap. EPICOST_CFGS configs.
# 2. The plain NN GEMM at EPICOST_SQ (default 8192x8192x8192) in EPICOST_SQCFGS configs x 8 scheduler variants,
#    cuBLASLt plain side by side (where CUTLASS's mainloop stands against cuBLAS's).
# Every evt result is checked against the CPU reference by bench_tune (sampled rows and columns).
set -uo pipefail
WINDOW_SECS=300
. "$(dirname "$0")/budget.sh"  # LOG, SECS, left(); output appended to LOG
T0=$start
echo "=== epicost.sh: $(date -u) budget ${SECS}s"
BIN=${EVT_HOSTBIN:?window_prep.sh builds hostbin}/bench_tune
B=/tmp/evt-epicost
mkdir -p "$B"
export BENCH_TUNE_CASES=epi
EPI="fc1 fwd:plain,fc1 fwd:bias,fc1 fwd:bias_aux,fc1 fwd:bias_gelu,fc1 fwd:bias_gelu_aux"
CF1=${EPICOST_CFGS:-"128x128x64 c1x1 pingpong e64;128x256x64 c1x1 coop"}
CF2=${EPICOST_SQCFGS:-"128x256x64 c1x1 coop;128x256x64 c2x1 coop;128x256x64 c1x2 coop;256x128x64 c1x1 coop;256x128x64 c2x1 coop;256x128x64 c1x2 coop;128x256x64 c2x1 coop s3;128x256x64 c1x2 coop s3"}
SQ=${EPICOST_SQ:-8192x8192x8192}
# compile both sets at once (two bench_tune processes, 8 nvcc jobs each)
echo "-- compile at +$(( $(date +%s) - T0 ))s"
( BENCH_TUNE_ONLY="$EPI" BENCH_TUNE_CFGS="$CF1" EVT_JIT_JOBS=8 timeout $(( $(left) - 60 )) "$BIN" compile 2 2>&1 | grep -v "^\[evt-jit\] [0-9]*/" | tail -3 ) &
( BENCH_TUNE_MNK=$SQ BENCH_TUNE_ONLY="fc1 fwd:plain" BENCH_TUNE_CFGS="$CF2" EVT_JIT_JOBS=8 timeout $(( $(left) - 60 )) "$BIN" compile 2 2>&1 | grep -v "^\[evt-jit\] [0-9]*/" | tail -3 ) &
wait
for k in ${EPICOST_KS:-64 1024}; do
  echo "-- run 16384x4096x$k at +$(( $(date +%s) - T0 ))s"
  BENCH_TUNE_MNK=16384x4096x$k BENCH_TUNE_ONLY="$EPI" BENCH_TUNE_CFGS="$CF1" BENCH_TUNE_NSV=1 \
    timeout $(( $(left) - 20 )) "$BIN" run 2 "$B/k$k.md" 20 2>&1 | grep -v "^\[evt-jit\]"
done
echo "-- run $SQ at +$(( $(date +%s) - T0 ))s"
BENCH_TUNE_MNK=$SQ BENCH_TUNE_ONLY="fc1 fwd:plain" BENCH_TUNE_CFGS="$CF2" BENCH_TUNE_NSV=8 \
  timeout $(( $(left) - 5 )) "$BIN" run 2 "$B/sq.md" 20 2>&1 | grep -v "^\[evt-jit\]"
for f in "$B"/k*.md "$B/sq.md"; do echo; echo "### $f"; cat "$f" 2>/dev/null; done
echo "=== epicost.sh done at +$(( $(date +%s) - T0 ))s"
