#!/usr/bin/env bash
# The kernel benchmarks on a Hopper GPU (their correctness checks are tests/gpu/run.sh's):
#   bash bench/kernels/run.sh evt  [REPS]          GEMM + epilogue: cuBLASLt, cuBLASLt + a separate epilogue, the
#                                                  generated kernel per tile config (bench_evt.cu)
#   bash bench/kernels/run.sh rows [REPS]          the generated row kernels, then PyTorch eager (bench_rows.cu,
#                                                  bench_rows.py)
#   bash bench/kernels/run.sh tune [MAXCFG] [REPS] cuBLAS plain, cuBLAS + a separate kernel, evt default and tuned
#                                                  (bench_tune.cu)
# Results and logs under $OUT (default build/bench-logs). Runs `make` first; the generated kernels JIT-compile into
# the JIT cache ($EVT_CACHE_DIR/jit). Needs CUTLASS 4.2 headers (.cutlass/ or $CUTLASS_PATH).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
ROOT=$PWD
what=${1:?evt, rows or tune}
OUT=${OUT:-$ROOT/build/bench-logs}
B=$ROOT/build/bench
mkdir -p "$OUT" "$B"
export CUTLASS_PATH=${CUTLASS_PATH:-$ROOT/.cutlass/cutlass_library/source}
export EVT_KERNELS_DIR=$ROOT/kernels EVT_JIT_JOBS=${EVT_JIT_JOBS:-$(nproc)}
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv
  nvcc --version | tail -2
  echo "cores: $(nproc)"
} >"$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
make -j"$(nproc)" build/libevt.a >"$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
LIBS="$ROOT/build/libevt.a $(pkg-config --libs cbc 2>/dev/null) $(pkg-config --libs openblas 2>/dev/null || echo -lopenblas) -lm -lpthread -ldl"
NV="nvcc -std=c++17 -O2 -gencode=arch=compute_90a,code=sm_90a -Iinclude -Isrc -Ikernels"
case $what in
evt)
  $NV bench/kernels/bench_evt.cu $LIBS -lcublasLt -o "$B/bench_evt" || exit 1
  EVT_MACHINE_FILE="$OUT/machine.txt" EVT_BENCH_COMMAND="bash bench/kernels/run.sh evt ${2:-30}" \
    "$B/bench_evt" "$OUT/bench_evt.json" "$OUT/bench_evt.md" "${2:-30}" 2>&1 | tee "$OUT/bench_evt.log"
  ;;
rows)
  $NV tests/gpu/check_rows.cu $LIBS -o "$B/check_rows" || exit 1
  $NV bench/kernels/bench_rows.cu $LIBS -o "$B/bench_rows" || exit 1
  K=$B/rows.kernels
  rm -rf "$K" && mkdir -p "$K"
  "$B/check_rows" emit "$K" || exit 1 # the kernels of tests/gpu/check_rows.cu's cases
  # src/runtime/jit/jit.c's flags for kernels without CUTLASS
  ls "$K"/*.cu | sed 's/\.cu$//' | xargs -P "$(nproc)" -I{} sh -c 'nvcc -std=c++17 --expt-relaxed-constexpr -O3 \
    -DNDEBUG -gencode=arch=compute_90a,code=sm_90a -Xcompiler -fPIC -Ikernels -shared -lcuda -o {}.so {}.cu >{}.log 2>&1 ||
    { echo "nvcc failed: {}.cu"; exit 1; }' || exit 1
  "$B/bench_rows" "$K" "$OUT/bench_rows_evt.json" "${2:-30}" 2>&1 | tee "$OUT/bench_rows.log"
  python3 bench/kernels/bench_rows.py "$OUT/bench_rows_evt.json" "$OUT/machine.txt" "$OUT" \
    "bash bench/kernels/run.sh rows ${2:-30}" "${2:-30}" 2>&1 | tee -a "$OUT/bench_rows.log"
  ;;
tune)
  $NV -diag-suppress 550 bench/kernels/bench_tune.cu $LIBS -lcublasLt -o "$B/bench_tune" || exit 1
  "$B/bench_tune" compile "${2:-4}" && "$B/bench_tune" run "${2:-4}" "$OUT/bench_tune.md" "${3:-20}" 2>&1 |
    tee "$OUT/bench_tune.log"
  ;;
*)
  echo "bench/kernels/run.sh: evt, rows or tune" >&2
  exit 2
  ;;
esac
