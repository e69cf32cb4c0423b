#!/usr/bin/env bash
# H200 only (the device tool): build the evt sources the row-kernel programs need, write every generated
# row kernel (tests/gpu/check_rows.cu emit), compile them with nvcc in parallel (they need no CUTLASS), run
# the correctness check against the CPU reference, then the benchmark (bench/kernels/bench_rows.cu) and the
# PyTorch eager comparison (bench/kernels/bench_rows.py).
#   bash tests/gpu/run_rows_h200.sh [check|bench|all]     results and logs under $OUT (default ./out)
set -uo pipefail
cd "$(dirname "$0")/../.."
what=${1:-all}
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
B=/tmp/evt-rows-build
K=$B/kernels
mkdir -p "$B/obj" "$K"
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
ar rcs "$B/libevt_rows.a" "${objs[@]}" || exit 1
NV="nvcc -std=c++17 -O2 -gencode=arch=compute_90a,code=sm_90a -Isrc -Iinclude -Ikernels"
$NV tests/gpu/check_rows.cu "$B/libevt_rows.a" -ldl -lm -o "$B/check_rows" &
$NV bench/kernels/bench_rows.cu "$B/libevt_rows.a" -ldl -lm -o "$B/bench_rows" &
wait
[ -x "$B/check_rows" ] && [ -x "$B/bench_rows" ] || { echo "driver build failed"; exit 1; }
"$B/check_rows" emit "$K" || exit 1
# the same flags as src/runtime/jit/jit.c (minus the CUTLASS include paths these kernels do not use)
ls "$K"/*.cu | sed 's/\.cu$//' | xargs -P "$(nproc)" -I{} sh -c \
  'nvcc -std=c++17 --expt-relaxed-constexpr -O3 -DNDEBUG -gencode=arch=compute_90a,code=sm_90a -Xcompiler -fPIC \
   -Ikernels -shared -lcuda -Xptxas -v -o {}.so {}.cu >{}.log 2>&1 || echo "nvcc failed: {}"'
grep -h "spill" "$K"/*.log | sort | uniq -c | sort -rn | head -5 >"$OUT/ptxas_spills.txt"
echo "built in $(( $(date +%s) - t0 )) s"
rc=0
if [ "$what" = check ] || [ "$what" = all ]; then
  "$B/check_rows" check "$K" 2>&1 | tee "$OUT/check_rows.log"
  rc=${PIPESTATUS[0]}
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  "$B/bench_rows" "$K" "$OUT/bench_rows_evt.json" "${REPS:-30}" 2>&1 | tee "$OUT/bench_rows.log"
  python3 bench/kernels/bench_rows.py "$OUT/bench_rows_evt.json" "$OUT/machine.txt" "$OUT" \
    "bash tests/gpu/run_rows_h200.sh $what (REPS=${REPS:-30})" "${REPS:-30}" 2>&1 | tee -a "$OUT/bench_rows.log"
fi
exit $rc
