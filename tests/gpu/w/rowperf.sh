#!/usr/bin/env bash
# GPU window script of the row-kernel performance work (H200; run by the lead from the repo root):
#   bash tests/gpu/w/rowperf.sh LOGFILE SECONDS
# Builds the row-kernel drivers (tests/gpu/check_rows.cu, bench/kernels/bench_rows.cu) and compiles, in parallel,
# the generated row kernels in several variants:
#   v0     the kernels as generated before this work (frozen sources + header in bench/kernels/rows_v0/)
#   new    src/evt/emit_rows.c + kernels/evt_rows.cuh as they are, default tuning
#   wv1/wv4, cw16, sum2, ss   the same with tuning macros changed (-DEVT_ROWS_WARP_VPT=1/4; 16 warps per CTA;
#          row-sum kernels prefetching one row ahead with a 2-CTA register cap; row sums accumulated in shared
#          memory, 32-warp CTAs; d3: three rows prefetched instead of two; r2: EVT_ROWS_RED=2, warp-level
#          butterflies of plain sums and one cross-warp merge instead of merge operators at every level)
# then checks every kernel of the CHECKED variants against the CPU reference at small odd sizes (check_rows), and times
# every variant at BERT-large sizes with three methods, each output checked against the CPU reference at that
# size (bench_rows perf; methods and floor explained there). Everything goes to LOGFILE; a summary table ends it.
LOG=${1:?usage: rowperf.sh LOGFILE SECONDS}
SECS=${2:-150}
cd "$(dirname "$0")/../../.."
exec >>"$LOG" 2>&1
t0=$(date +%s)
left() { echo $(( SECS - ($(date +%s) - t0) )); }
echo "== rowperf: $(date -u +%H:%M:%S) budget ${SECS}s, $(nproc) cores"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem --format=csv,noheader 2>&1 | head -2
B=/tmp/evt-rowperf
rm -rf "$B"; mkdir -p "$B/obj"
objs=()
for f in src/ir/*.c src/evt/*.c; do
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
# variant -> (source dir, include dir, extra flags)
declare -A SRC=([v0]=bench/kernels/rows_v0 [new]=$B/gen [wv1]=$B/gen [wv4]=$B/gen [cw16]=$B/gen [sum2]=$B/gen [ss]=$B/gen [d3]=$B/gen [r2]=$B/gen)
declare -A INC=([v0]="-Ibench/kernels/rows_v0 -Ikernels" [new]=-Ikernels [wv1]=-Ikernels [wv4]=-Ikernels [cw16]=-Ikernels
                [sum2]=-Ikernels [ss]=-Ikernels [d3]=-Ikernels [r2]=-Ikernels)
declare -A FL=([v0]="" [new]="" [wv1]="-DEVT_ROWS_WARP_VPT=1" [wv4]="-DEVT_ROWS_WARP_VPT=4"
               [cw16]="-DEVT_ROWS_CTA_WARPS=16 -DEVT_ROWS_CTA_WARPS_SUM=32" [sum2]="-DEVT_ROWS_DEEP_SUM=0 -DEVT_ROWS_MINB_SUM=2"
               [ss]="-DEVT_ROWS_SMEM_SUM=1 -DEVT_ROWS_DEEP_SUM=0 -DEVT_ROWS_CTA_WARPS_SUM=32" [d3]="-DEVT_ROWS_DEPTH=3"
               [r2]="-DEVT_ROWS_RED=2")
VARS=${ROWPERF_VARS:-v0 new r2 wv4 cw16 sum2 ss d3}
CHECKED=${ROWPERF_CHECKED:-new r2 wv4 ss}  # variants checked at small odd sizes too (all their kernels compiled)
jobs=$B/jobs.txt; : >"$jobs"
for v in $VARS; do
  mkdir -p "$B/$v"
  for f in "${SRC[$v]}"/evt_rowkernel_*.cu; do
    k=$(basename "$f" .cu)
    # variants other than `new` only serve the benchmark: its bf16 kernels
    case " $CHECKED " in *" $v "*) ;; *) head -3 "$f" | grep -q "in:bf16" || continue ;; esac
    echo "nvcc -std=c++17 --expt-relaxed-constexpr -O3 -DNDEBUG -gencode=arch=compute_90a,code=sm_90a -Xcompiler -fPIC ${INC[$v]} ${FL[$v]} -shared -Xptxas -v -o $B/$v/$k.so $f >$B/$v/$k.log 2>&1 || echo 'nvcc failed: $v/$k'" >>"$jobs"
  done
done
echo "compiling $(wc -l <"$jobs") kernels ($(left)s left)"
timeout $(( $(left) - 60 )) xargs -P "$(nproc)" -I{} sh -c '{}' <"$jobs"
echo "compiled at +$(( $(date +%s) - t0 ))s"
for v in $VARS; do
  echo -n "ptxas $v: count x registers: "
  grep -h "Used [0-9]* registers" "$B/$v"/*.log 2>/dev/null | sed 's/.*Used \([0-9]*\) registers.*/\1/' | sort -n | uniq -c | tr '\n' ' '
  echo; grep -h "spill stores" "$B/$v"/*.log | grep -v " 0 bytes spill stores" | sort | uniq -c | head -3
done
rc=0
for v in $CHECKED; do
  case " $VARS " in *" $v "*) ;; *) continue ;; esac
  echo "== correctness ($v): check_rows vs the CPU reference ($(left)s left)"
  timeout $(( $(left) - 70 > 10 ? $(left) - 70 : 10 )) "$B/check_rows" check "$B/$v" >"$B/check_$v.log" 2>&1
  r=$?; [ $v = new ] && rc=$r
  grep -v "^ok" "$B/check_$v.log" | head -20
  tail -1 "$B/check_$v.log"
done
echo "== timing ($(left)s left)"
args=""; for v in $VARS; do args="$args $v=$B/$v"; done
REPS=${REPS:-15} timeout $(( $(left) - 3 )) "$B/bench_rows" perf $args
echo "== rowperf done at +$(( $(date +%s) - t0 ))s (check_rows rc $rc)"
exit $rc
