#!/usr/bin/env bash
# GPU window script: what a row sum (Σ over M, a bias gradient) costs in the GEMM epilogue, and where.
#   bash tests/gpu/w/rsum.sh LOGFILE SECONDS        (tests/gpu/window.sh; bench_tune prebuilt by window_prep.sh)
# 1. bench/kernels/bench_tune.cu, epilogue ablation (BENCH_TUNE_CASES=epi) on fc2's backward dX (16384x4096x1024 NT):
#    plain, dbias, mulx, mulx_dbias, gelu_bwd, gelu_bwd_dbias, each in RSUM_CFGS (default: 128x128 ping-pong and
#    128x256 cooperative) x the first 2 scheduler variants; every result checked against the CPU reference.
#    With .gpuwork/w/bench_tune_old (a driver linked against an older emitter; RSUM_OLD_LABEL says which) the same
#    again with its kernels, for an A/B of the emitter change (separate processes: same kernel names).
# 2. ncu (SpeedOfLight, WarpStateStats, SchedulerStats, SourceCounters) of single kernels: RSUM_NCU="case|config ..."
set -uo pipefail
WINDOW_SECS=240
. "$(dirname "$0")/budget.sh"  # LOG, SECS, left(); output appended to LOG
T0=$start
echo "=== rsum.sh: $(date -u) budget ${SECS}s"
NEW=${EVT_HOSTBIN:?window_prep.sh builds hostbin}/bench_tune
OLD=$PWD/.gpuwork/w/bench_tune_old
export BENCH_TUNE_CASES=epi BENCH_TUNE_NSV=${RSUM_NSV:-2}
export BENCH_TUNE_CFGS=${RSUM_CFGS:-"128x128x64 c1x1 pingpong;128x256x64 c1x1 coop"}
export BENCH_TUNE_ONLY=${RSUM_ONLY:-"fc2 bwd dX:plain,fc2 bwd dX:dbias,fc2 bwd dX:mulx,fc2 bwd dX:mulx_dbias,fc2 bwd dX:gelu_bwd,fc2 bwd dX:gelu_bwd_dbias"}
B=/tmp/evt-rsum
mkdir -p "$B"
drivers=("new:$NEW")
[ -x "$OLD" ] && drivers+=("old:$OLD")
# compile every driver's kernels in one go each (16 nvcc jobs; cached by source hash, so shared kernels once)
for d in "${drivers[@]}"; do
  lab=${d%%:*}; bin=${d#*:}
  echo "-- compile ($lab) at +$(( $(date +%s) - T0 ))s"
  timeout $(( $(left) - 60 )) "$bin" compile 2 2>&1 | grep -v "^\[evt-jit\] [0-9]*/" | tail -3
done
for d in "${drivers[@]}"; do
  lab=${d%%:*}; bin=${d#*:}
  echo "-- run ($lab) at +$(( $(date +%s) - T0 ))s"
  timeout $(( $(left) - 20 )) "$bin" run 2 "$B/$lab.md" 20 2>&1 | grep -v "^\[evt-jit\]"
done
# 2. profiles: "epilogue|config" pairs, new driver unless prefixed old:
if command -v ncu >/dev/null; then
  for pc in ${RSUM_NCU:-"dbias|128x128x64_c1x1_pingpong" "plain|128x128x64_c1x1_pingpong" "dbias|128x256x64_c1x1_coop"}; do
    [ "$pc" = none ] && continue   # RSUM_NCU=none: no profiles
    [ "$(left)" -gt 25 ] || { echo "no time left for ncu $pc"; break; }
    bin=$NEW; lab=new
    case $pc in old:*) bin=$OLD; lab=old; pc=${pc#old:} ;; esac
    epi=${pc%%|*}; cfg=${pc#*|}; cfg=${cfg//_/ }
    case $epi in *:*) cp=${epi%%:*}; cs="${cp//_/ }:${epi#*:}" ;; *) cs="fc2 bwd dX:$epi" ;; esac  # fc1_fwd:bias_aux
    echo "-- ncu ($lab) $cs, $cfg at +$(( $(date +%s) - T0 ))s"
    BENCH_TUNE_ONLY="$cs" BENCH_TUNE_CFGS="$cfg" BENCH_TUNE_NSV=1 timeout $(( $(left) - 5 )) \
      ncu --kernel-name regex:device_kernel --launch-skip 3 --launch-count 1 --section SpeedOfLight \
      --section WarpStateStats --section SchedulerStats --section SourceCounters --section LaunchStats \
      --section ComputeWorkloadAnalysis --section InstructionStats -o "$B/prof" -f \
      "$bin" run 2 "$B/ncu.md" 3 > "$B/ncu_run.log" 2>&1
    ncu -i "$B/prof.ncu-rep" 2>&1 | sed -n '/Section: GPU Speed Of Light/,$p' | grep -v "^\s*$\|^    ---" | head -120
    # the instructions the warps stalled on most (SASS, sampled)
    ncu -i "$B/prof.ncu-rep" --page source --csv --print-source sass > "$B/src.csv" 2>/dev/null &&
      python3 - "$B/src.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
hdr = next((i for i, r in enumerate(rows) if "Source" in r), None)
if hdr is None:
    print("no source page"); sys.exit()
h = rows[hdr]
def col(name):
    return next((i for i, c in enumerate(h) if c.startswith(name)), None)
src, st = col("Source"), col("Warp Stall Sampling (All")
if st is None:
    print("no stall column:", h[:12]); sys.exit()
body = [r for r in rows[hdr + 1:] if len(r) > max(src, st)]
tot = sum(float(r[st] or 0) for r in body) or 1
print("top stalls: %d instructions, %d samples" % (len(body), tot))
for r in sorted(body, key=lambda r: -float(r[st] or 0))[:25]:
    print("%6.2f%%  %s" % (100 * float(r[st] or 0) / tot, r[src][:110]))
PY
  done
else
  echo "no ncu on this machine"
fi
echo
for d in "${drivers[@]}"; do
  lab=${d%%:*}
  echo "### rsum table ($lab${RSUM_OLD_LABEL:+; old = $RSUM_OLD_LABEL})"
  cat "$B/$lab.md" 2>/dev/null || echo "(no table)"
done
echo "=== rsum.sh done at +$(( $(date +%s) - T0 ))s"
