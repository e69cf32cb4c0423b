#!/usr/bin/env bash
# GPU window script of the row-kernel performance work (H200; run by the lead from the repo root):
#   bash tests/gpu/w/rowperf.sh LOGFILE SECONDS
# Builds the row-kernel drivers (tests/gpu/check_rows.cu, bench/kernels/bench_rows.cu) and compiles, in parallel,
# the generated row kernels in several variants:
#   v0     the kernels as generated before this work (frozen sources + header in bench/kernels/rows_v0/)
#   new    src/codegen/emit_rows.c + kernels/evt_rows.cuh as they are, default tuning (all kernels, all configurations)
#   others the same sources with tuning macros changed (see VARIANTS below; bf16 kernels, with ROWPERF_VARIANT_F32=1
#          f32-input ones too, only the (warps, vpt) configurations the benchmark sizes use, EVT_ROWS_INST)
# then checks every `new` kernel against the CPU reference at small odd sizes (check_rows: aligned / unaligned
# N, 1 to 32 warps, 1 to 4 chunks per thread, NaN-poisoned outputs, bitwise-equal second launch), and times
# every variant at BERT-large sizes, each output checked against the CPU reference at that size (bench_rows
# perf: "dirty" = the old method, "steady" = back-to-back launches over rotating buffers; floor = bytes / the
# bandwidth of a 1 GiB device-to-device copy; ROWPERF_STEADY: launches per timed batch per rotating buffer set, default
# 16). Everything goes to LOGFILE; a summary table ends it.
LOG=${1:?usage: rowperf.sh LOGFILE SECONDS}
SECS=${2:-150}
cd "$(dirname "$0")/../../.."
exec >>"$LOG" 2>&1
t0=$(date +%s)
left() { echo $(( SECS - ($(date +%s) - t0) )); }
echo "== rowperf: $(date -u +%H:%M:%S) budget ${SECS}s, $(nproc) cores"
B=/tmp/evt-rowperf
rm -rf "$B"; mkdir -p "$B/obj"
objs=()
for f in src/util/*.c src/ir/*.c src/codegen/*.c src/runtime/jit/*.c; do
  o="$B/obj/$(echo "$f" | tr / _).o"
  gcc -std=c11 -O2 -fPIC -D_GNU_SOURCE -Iinclude -Isrc -Ikernels -c "$f" -o "$o" &
  objs+=("$o")
done
wait
ar rcs "$B/libevt_rows.a" "${objs[@]}" || { echo "FAIL: evt sources do not build"; exit 1; }
NV="nvcc -std=c++17 -O2 -gencode=arch=compute_90a,code=sm_90a -Isrc -Iinclude -Ikernels"
$NV tests/gpu/check_rows.cu "$B/libevt_rows.a" -ldl -lm -o "$B/check_rows" &
$NV bench/kernels/bench_rows.cu "$B/libevt_rows.a" -ldl -lm -o "$B/bench_rows" &
mkdir -p "$B/gen"
wait
[ -x "$B/check_rows" ] && [ -x "$B/bench_rows" ] || { echo "FAIL: driver build failed"; exit 1; }
"$B/check_rows" emit "$B/gen" >/dev/null || { echo "FAIL: emit"; exit 1; }
# the configurations the benchmark sizes (N = 64 .. 256, 512, 1024, 4096) can pick under any variant below
cat >"$B/inst.h" <<'H'
#define EVT_ROWS_INST(w, v) (((w) == 1 && (v) == 1) || ((w) == 1 && (v) == 2) || ((w) == 2 && (v) == 1) || ((w) == 4 && (v) == 1) || ((w) == 2 && (v) == 2) || \
                             ((w) == 1 && (v) == 4) || ((w) == 8 && (v) == 2) || ((w) == 16 && (v) == 1))
H
# name|flags (variants other than v0 / new)
VARIANTS=${ROWPERF_VARIANTS:-"noex|-DEVT_ROWS_EXACT=0
wv2|-DEVT_ROWS_WARP_VPT=2
regsum|-DEVT_ROWS_SMEM_SUM=0 -DEVT_ROWS_DEEP_SUM=1 -DEVT_ROWS_CTA_WARPS_SUM=16
dv4|-DEVT_ROWS_DEPTH_VPT=4"}
NVK="nvcc -std=c++17 --expt-relaxed-constexpr -O3 -DNDEBUG -gencode=arch=compute_90a,code=sm_90a -Xcompiler -fPIC -shared -Xptxas -v"
jobs=$B/jobs.txt; : >"$jobs"
mkdir -p "$B/v0" "$B/new"
for f in "$B"/gen/evt_rowkernel_*.cu; do
  k=$(basename "$f" .cu)
  echo "$NVK -Ikernels -o $B/new/$k.so $f >$B/new/$k.log 2>&1 || echo 'nvcc failed: new/$k'" >>"$jobs"
done
for f in bench/kernels/rows_v0/evt_rowkernel_*.cu; do
  k=$(basename "$f" .cu)
  head -3 "$f" | grep -q "in:bf16" || continue
  echo "$NVK -Ibench/kernels/rows_v0 -Ikernels -o $B/v0/$k.so $f >$B/v0/$k.log 2>&1 || echo 'nvcc failed: v0/$k'" >>"$jobs"
done
VARS="v0 new"
while IFS='|' read -r v fl; do
  v=${v// /}; [ -n "$v" ] || continue  # (a blank ROWPERF_VARIANTS: no extra variants)
  VARS="$VARS $v"; mkdir -p "$B/$v"
  for f in "$B"/gen/evt_rowkernel_*.cu; do
    k=$(basename "$f" .cu)
    head -3 "$f" | grep -q "in:bf16${ROWPERF_VARIANT_F32:+\\|in:f32}" || continue  # (ROWPERF_VARIANT_F32=1: f32 inputs too)
    grep -q "^//   rows \(softmax\|softmax_bwd\|layernorm\|layernorm_bwd\|none\) " "$f" || continue
    echo "$NVK -Ikernels -include $B/inst.h $fl -o $B/$v/$k.so $f >$B/$v/$k.log 2>&1 || echo 'nvcc failed: $v/$k'" >>"$jobs"
  done
done <<<"$VARIANTS"
echo "compiling $(wc -l <"$jobs") kernels, variants: $VARS ($(left)s left)"
timeout $(( $(left) - 35 )) xargs -P "$(nproc)" -I{} sh -c '{}' <"$jobs"
echo "compiled at +$(( $(date +%s) - t0 ))s"
for v in $VARS; do
  echo -n "ptxas $v registers (count x regs): "
  grep -h "Used [0-9]* registers" "$B/$v"/*.log 2>/dev/null | sed 's/.*Used \([0-9]*\) registers.*/\1/' | sort -n | uniq -c | tr '\n' ' '
  echo
done
echo "== correctness (new): check_rows vs the CPU reference ($(left)s left)"
timeout $(( $(left) - 30 > 10 ? $(left) - 30 : 10 )) "$B/check_rows" check "$B/new" >"$B/check_new.log" 2>&1
rc=$?
grep -v "^ok" "$B/check_new.log" | head -20
tail -1 "$B/check_new.log"
echo "== timing ($(left)s left)"
args=""; for v in $VARS; do args="$args $v=$B/$v"; done
REPS=${REPS:-20} timeout $(( $(left) - 3 )) "$B/bench_rows" perf $args
# ncu of single kernels: ROWPERF_NCU="op:variant ..." (e.g. layernorm:new); the first row_kernel launch of that op
# (the checked one, operands cold), sections: throughput, occupancy, warp stalls, memory (ROWPERF_NCU_EXTRA: more
# ncu options, e.g. "--section MemoryWorkloadAnalysis_Tables"; ROWPERF_NCU_LINES: lines printed, default 90)
if command -v ncu >/dev/null; then
  for ov in ${ROWPERF_NCU:-}; do
    [ "$(left)" -gt 20 ] || { echo "no time left for ncu $ov"; break; }
    op=${ov%%:*}; v=${ov#*:}
    echo "== ncu $op ($v) at +$(( $(date +%s) - t0 ))s"
    ROWPERF_ONLY=$op REPS=1 timeout $(( $(left) - 5 )) ncu --kernel-name regex:row_kernel --launch-count 1 \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
      --section SchedulerStats --section MemoryWorkloadAnalysis ${ROWPERF_NCU_EXTRA:-} -o "$B/prof_$op" -f \
      "$B/bench_rows" perf "$v=$B/$v" >"$B/ncu_$op.log" 2>&1
    # (--print-details all: the sections' tables too, e.g. MemoryWorkloadAnalysis_Tables; without it if refused)
    { ncu -i "$B/prof_$op.ncu-rep" --print-details all 2>/dev/null || ncu -i "$B/prof_$op.ncu-rep" 2>&1; } |
      grep -v "^\s*$\|^    ---\|^    OPT\|^          " | head -${ROWPERF_NCU_LINES:-90}
  done
fi
echo "== rowperf done at +$(( $(date +%s) - t0 ))s (check_rows rc $rc)"
exit $rc
