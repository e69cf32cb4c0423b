#!/usr/bin/env bash
# H200 only (the device tool): build the evt sources the GPU programs need, the correctness check
# (tests/gpu/check_evt.cu) and the benchmark (bench/kernels/bench_evt.cu), JIT-compile every generated
# kernel once in parallel (src/runtime/jit/jit.c, 16 jobs), then run the check and the benchmark.
#   bash tests/gpu/run_h200.sh [check|bench|all]      results and logs under $OUT (default ./out)
# Needs CUTLASS 4.2 headers: CUTLASS_PATH, default .cutlass/cutlass_library/source (carried folder).
set -uo pipefail
cd "$(dirname "$0")/../.."
what=${1:-all}
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export CUTLASS_PATH=${CUTLASS_PATH:-$PWD/.cutlass/cutlass_library/source}
export EVT_KERNELS_DIR=$PWD/kernels
export EVT_JIT_CACHE=${EVT_JIT_CACHE:-/tmp/evt-jit-cache}
export EVT_JIT_JOBS=${EVT_JIT_JOBS:-$(nproc)}
B=/tmp/evt-gpu-build
mkdir -p "$EVT_JIT_CACHE"
[ -n "${EVT_JIT_CACHE_TGZ:-}" ] && [ -f "$EVT_JIT_CACHE_TGZ" ] && tar xzf "$EVT_JIT_CACHE_TGZ" -C "$EVT_JIT_CACHE"
mkdir -p "$B/obj"
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv
  nvcc --version | tail -2
  echo "cores: $(nproc)"
} >"$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

t0=$(date +%s)
objs=()
for f in src/util/*.c src/ir/*.c src/codegen/*.c src/runtime/jit/*.c; do
  o="$B/obj/$(echo "$f" | tr / _).o"
  gcc -std=c11 -O2 -fPIC -D_GNU_SOURCE -Iinclude -Isrc -Ikernels -c "$f" -o "$o" &
  objs+=("$o")
done
wait
ar rcs "$B/libevt_gpu.a" "${objs[@]}" || exit 1
NV="nvcc -std=c++17 -O2 -gencode=arch=compute_90a,code=sm_90a -Isrc -Iinclude -Ikernels"
$NV tests/gpu/check_evt.cu "$B/libevt_gpu.a" -ldl -lm -o "$B/check_evt" &
$NV bench/kernels/bench_evt.cu "$B/libevt_gpu.a" -lcublasLt -ldl -lm -o "$B/bench_evt" &
wait
[ -x "$B/check_evt" ] && [ -x "$B/bench_evt" ] || { echo "driver build failed"; exit 1; }
echo "drivers built in $(( $(date +%s) - t0 )) s"

rc=0
if [ "$what" = check ] || [ "$what" = all ]; then
  "$B/check_evt" 2>&1 | tee "$OUT/check.log"
  rc=${PIPESTATUS[0]}
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  EVT_MACHINE_FILE="$OUT/machine.txt" EVT_BENCH_COMMAND="bash tests/gpu/run_h200.sh $what (bench_evt OUT.json OUT.md ${REPS:-30})" \
    "$B/bench_evt" "$OUT/bench.json" "$OUT/bench.md" "${REPS:-30}" 2>&1 | tee "$OUT/bench.log"
  [ "${PIPESTATUS[0]}" -ne 0 ] && rc=1
fi
# nvcc logs (errors, if any) and the compiled kernels, so a later call can start with a warm cache
# (EVT_JIT_CACHE_TGZ=path: unpacked into the cache before anything is compiled)
grep -l . "$EVT_JIT_CACHE"/*.log >/dev/null 2>&1 && tail -n 20 "$EVT_JIT_CACHE"/*.log >"$OUT/jit_logs.txt" 2>&1
(cd "$EVT_JIT_CACHE" && tar czf "$OUT/jit_cache.tgz" ./*.so) 2>/dev/null
exit $rc
