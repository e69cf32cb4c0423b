#!/usr/bin/env bash
# GPU window script of helper "tune": mainloop tuning benchmark (bench/kernels/bench_tune.cu).
#   bash tests/gpu/w/tune.sh LOGFILE SECONDS        (from the repository root on the H200)
# Steps: build the benchmark driver (gcc + nvcc), JIT-compile the candidate kernels (16 parallel nvcc,
# cached in $EVT_JIT_CACHE across windows) under a time limit, then time and check with whatever compiled:
# cuBLAS plain, cuBLAS + separate generated epilogue kernel, evt default config, evt tuned (best of the
# candidate configs x swizzle/raster), each fused result checked against the CPU reference (sampled); then
# the autotuner (src/runtime/tune_gpu.c) on the same cases, its choices and record files.
# TUNE_MAXCFG (default 3) caps the candidate configs per epilogue (compile budget).
set -uo pipefail
LOG=${1:-/dev/stdout}
SECS=${2:-240}
T0=$(date +%s)
left() { echo $((SECS - ($(date +%s) - T0))); }
exec >>"$LOG" 2>&1
echo "=== tune.sh: $(date -u) budget ${SECS}s"
export CUTLASS_PATH=${CUTLASS_PATH:-$PWD/.cutlass/cutlass_library/source}
export EVT_KERNELS_DIR=${EVT_KERNELS_DIR:-$PWD/kernels}
export EVT_JIT_CACHE=${EVT_JIT_CACHE:-/tmp/evt-jit-cache}
export EVT_JIT_JOBS=${EVT_JIT_JOBS:-16}
MAXCFG=${TUNE_MAXCFG:-3}
B=/tmp/evt-tune-build
mkdir -p "$B/obj" "$EVT_JIT_CACHE"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv 2>&1 | tail -1

# 1. driver
objs=()
for f in src/ir/*.c src/evt/*.c src/runtime/jit.c src/runtime/tune.c src/runtime/tune_gpu.c; do
  o="$B/obj/$(echo "$f" | tr / _).o"
  gcc -std=c11 -O2 -fPIC -D_GNU_SOURCE -Iinclude -Isrc -Ikernels -c "$f" -o "$o" &
  objs+=("$o")
done
wait
ar rcs "$B/libevt_tune.a" "${objs[@]}" || { echo "tune.sh: host build failed"; exit 1; }
nvcc -std=c++17 -O2 -gencode=arch=compute_90a,code=sm_90a -Isrc -Iinclude -Ikernels bench/kernels/bench_tune.cu \
  "$B/libevt_tune.a" -lcublasLt -ldl -lm -o "$B/bench_tune" || { echo "tune.sh: driver build failed"; exit 1; }
echo "driver built at +$(( $(date +%s) - T0 ))s"

# 2. compile candidates + the tuner's timing helper (leave ~110 s for measuring)
CT=$(( $(left) - 110 ))
if [ "$CT" -gt 20 ]; then
  echo "compiling (limit ${CT}s, max $MAXCFG configs per epilogue)"
  timeout "$CT" "$B/bench_tune" compile "$MAXCFG" 2>&1 | grep -v "^\[evt-jit\] [0-9]*/" | tail -20
  echo "compile step ended at +$(( $(date +%s) - T0 ))s"
else
  echo "no time to compile; measuring cached kernels only"
fi
ls -la "$EVT_JIT_CACHE"/*.so 2>/dev/null | awk '{s+=$5; n++} END {printf "JIT cache: %d .so files, %.1f MB\n", n, s/1e6}'

# 3. benchmark + checks (only what is in the JIT cache)
RT=$(( ($(left) - 10) * 60 / 100 ))
echo "benchmark (limit ${RT}s)"
timeout "$RT" "$B/bench_tune" run "$MAXCFG" "$B/tune.md" 30
echo "bench step exit $? at +$(( $(date +%s) - T0 ))s"

# 4. the autotuner itself on the same cases (records in a private directory, not read by other scripts)
export EVT_TUNE_CACHE=/tmp/evt-tune-records
RT=$(( $(left) - 8 ))
if [ "$RT" -gt 15 ]; then
  echo "autotuner (limit ${RT}s)"
  timeout "$RT" "$B/bench_tune" tune "$MAXCFG" 2>&1 | grep -v "^\[evt-jit\] [0-9]*/"
  echo "tune step exit $? at +$(( $(date +%s) - T0 ))s"
  for f in "$EVT_TUNE_CACHE"/tune/*.txt; do [ -f "$f" ] && { echo "--- $f"; head -12 "$f"; }; done
fi
echo
echo "### tune summary table (bench/kernels/bench_tune.cu, $(date -u +%H:%M) UTC)"
cat "$B/tune.md" 2>/dev/null || echo "(no table)"
echo "=== tune.sh done at +$(( $(date +%s) - T0 ))s"
