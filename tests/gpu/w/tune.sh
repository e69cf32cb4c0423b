#!/usr/bin/env bash
# GPU window script of helper "tune": mainloop tuning (src/runtime/tune*.c) and its benchmark.
#   bash tests/gpu/w/tune.sh LOGFILE SECONDS        (from the repository root on the H200)
# Compiling comes first (16 parallel nvcc, kept in $EVT_JIT_CACHE across windows), measuring uses whatever
# is compiled, in order of priority:
#   1. bench/kernels/bench_tune.cu: per case cuBLAS plain, cuBLAS + separate generated epilogue kernel, evt
#      default config, evt tuned (best of the candidate configs x swizzle/raster), every fused result checked
#      against the CPU reference (sampled rows + columns); a markdown table at the end of the log;
#   2. `evtc tune` on a BERT-large encoder layer (gen.py bert_layer, batch 16 x seq 512, hidden 1024, ffn 4096,
#      bf16): every GEMM+EVT group the fused runtime runs, the default config x scheduler variants vs unfused
#      measured (--max-configs 1: the slice has no time to compile more), then `evtc compile --stats` showing
#      each group's choice (records in a private directory: other scripts do not read them);
#   3. the autotuner on the benchmark's cases (bench_tune tune).
# TUNE_MAXCFG (default 3) caps the candidate configs per kernel (compile budget).
set -uo pipefail
WINDOW_SECS=240
. "$(dirname "$0")/budget.sh"  # LOG, SECS, left(); output appended to LOG
T0=$start
echo "=== tune.sh: $(date -u) budget ${SECS}s"
export CUTLASS_PATH=${CUTLASS_PATH:-$PWD/.cutlass/cutlass_library/source}
export EVT_KERNELS_DIR=${EVT_KERNELS_DIR:-$PWD/kernels}
export EVT_JIT_CACHE=${EVT_JIT_CACHE:-/tmp/evt-jit-cache}
export EVT_JIT_JOBS=${EVT_JIT_JOBS:-16}
export EVT_TUNE_CACHE=/tmp/evt-tune-records   # tuning records of this script only
MAXCFG=${TUNE_MAXCFG:-3}
EVTC=${EVTC:-build/evtc}
B=/tmp/evt-tune-build
mkdir -p "$B/obj" "$EVT_JIT_CACHE" "$EVT_TUNE_CACHE"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv 2>&1 | tail -1
echo "JIT cache at start: $(ls "$EVT_JIT_CACHE" 2>/dev/null | grep -c '\.so$') kernels"

# driver: prebuilt by tests/gpu/window_prep.sh (the library needs CBC, which the device lacks), else built here
if [ -x "${EVT_HOSTBIN:-/nonexistent}/bench_tune" ]; then
  mkdir -p "$B" && cp "$EVT_HOSTBIN/bench_tune" "$B/bench_tune"
else
objs=()
for f in src/ir/*.c src/evt/*.c src/runtime/jit.c src/runtime/tune.c src/runtime/tune_gpu.c; do
  o="$B/obj/$(echo "$f" | tr / _).o"
  gcc -std=c11 -O2 -fPIC -D_GNU_SOURCE -Iinclude -Isrc -Ikernels -c "$f" -o "$o" &
  objs+=("$o")
done
wait
ar rcs "$B/libevt_tune.a" "${objs[@]}" || { echo "tune.sh: host build failed"; exit 1; }
nvcc -std=c++17 -O2 -diag-suppress 550 -gencode=arch=compute_90a,code=sm_90a -Isrc -Iinclude -Ikernels \
  bench/kernels/bench_tune.cu "$B/libevt_tune.a" -lcublasLt -ldl -lm -o "$B/bench_tune" ||
  { echo "tune.sh: driver build failed"; exit 1; }
fi
python3 examples/gen.py bert_layer --batch 16 --seq 512 --hidden 1024 --heads 16 --ffn 4096 --vocab 1024 \
  --dtype bf16 >"$B/bert_large.evt" || echo "tune.sh: gen.py failed"
echo "driver built at +$(( $(date +%s) - T0 ))s"

# compile: the benchmark's kernels (cached since W2; a missing one is compiled), and in the background, with
# 4 nvcc jobs (the benchmark measures meanwhile), the BERT layer's default-config candidates + unfused row kernels
CT=$(( $(left) - 35 ))   # all cached: ~2 s; if another emitter change invalidated them, compiling comes first
if [ "$CT" -gt 3 ]; then
  echo "benchmark kernels (limit ${CT}s, max $MAXCFG configs per epilogue)"
  timeout "$CT" "$B/bench_tune" compile "$MAXCFG" 2>&1 | grep -v "^\[evt-jit\] [0-9]*/" | tail -4
fi
BG=0
if [ -s "$B/bert_large.evt" ] && [ "$(left)" -gt 45 ]; then
  ( EVT_JIT_JOBS=4 timeout $(( $(left) - 30 )) "$EVTC" tune "$B/bert_large.evt" --max-configs 1 --compile-only \
      --jobs 4 >"$B/bert_compile.log" 2>&1 ) &
  BG=$!
fi

# 1. benchmark + checks (only what is in the JIT cache)
RT=$(( $(left) - 30 ))
if [ "$RT" -gt 5 ]; then
  echo "benchmark (limit ${RT}s) at +$(( $(date +%s) - T0 ))s"
  timeout "$RT" "$B/bench_tune" run "$MAXCFG" "$B/tune.md" 20
  echo "bench step exit $? at +$(( $(date +%s) - T0 ))s"
fi
if [ "$BG" -ne 0 ]; then
  wait "$BG"
  echo "BERT layer candidates (background compile) done at +$(( $(date +%s) - T0 ))s:"
  grep -v "^\[evt-jit\] [0-9]*/" "$B/bert_compile.log" | tail -3
fi

# 2. the autotuner on the BERT layer's GEMM groups (default config x scheduler vs unfused), then the
#    compiler's view of the records
RT=$(( $(left) - 6 ))
if [ "$RT" -gt 8 ] && [ -s "$B/bert_large.evt" ]; then
  echo "evtc tune on the BERT-large layer (limit ${RT}s)"
  timeout "$RT" "$EVTC" tune "$B/bert_large.evt" --max-configs 1 --reps 20 --force 2>&1 |
    grep -v "^\[evt-jit\] [0-9]*/"
  echo "evtc tune exit ${PIPESTATUS[0]} at +$(( $(date +%s) - T0 ))s"
  timeout 5 "$EVTC" compile "$B/bert_large.evt" -o "$B/bert_compile" --stats --no-cache --fuse-rules=lower 2>&1 |
    sed -n '/gemm+evt tuning/,$p'
fi

# 3. the autotuner on the benchmark's cases (if time is left)
RT=$(( $(left) - 4 ))
if [ "$RT" -gt 20 ]; then
  echo "bench_tune tune (limit ${RT}s)"
  timeout "$RT" "$B/bench_tune" tune "$MAXCFG" 2>&1 | grep -v "^\[evt-jit\] [0-9]*/"
  echo "tune step exit $? at +$(( $(date +%s) - T0 ))s"
fi
echo
echo "### tune summary table (bench/kernels/bench_tune.cu, $(date -u +%H:%M) UTC)"
cat "$B/tune.md" 2>/dev/null || echo "(no table)"
echo "=== tune.sh done at +$(( $(date +%s) - T0 ))s"
