#!/usr/bin/env bash
# ncu of single kernels of `bench_rows lnbbisect` (H200; run from the repo root through the device tool with a
# bench_rows built on the dev machine carried as .gpuwork/w/bench_rows and, for the generated kernel, its .so in
# .gpuwork/w/gen/new):
#   bash tests/gpu/w/ncu_lnbb.sh 'REGEX|CFG' ...
# REGEX: ncu's kernel-name regex (demangled base name: ^k$, ^k4$, ^k5$, row_kernel); CFG: LNBB_CFG, the hand-written
# configurations that run (index into lnbb::cfgs; "-": none). Each kernel's third launch is profiled (the first is
# the checked one); reports and details go under $OUT, a digest of the counters is printed.
set -u
mkdir -p "$OUT"
for a in "$@"; do
  rx=${a%%|*}
  export LNBB_CFG=${a#*|}
  tag=$(echo "$rx-$LNBB_CFG" | tr -c 'A-Za-z0-9\n' _)
  echo "=== $rx (LNBB_CFG=$LNBB_CFG)"
  timeout 100 ncu -f --clock-control none --kernel-name "regex:$rx" --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
    --section LaunchStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis -o "$OUT/p_$tag" \
    .gpuwork/w/bench_rows lnbbisect new=.gpuwork/w/gen/new >"$OUT/run_$tag.log" 2>&1
  ncu -i "$OUT/p_$tag.ncu-rep" --print-details all >"$OUT/d_$tag.txt" 2>&1
  grep -E "Duration|DRAM Throughput|Issue Slots Busy|Active Warps Per Scheduler|Eligible Warps|Warp Cycles Per Issued|Stall (Long|Short) Scoreboard|Stall Barrier" \
    "$OUT/d_$tag.txt" | head -12
done
