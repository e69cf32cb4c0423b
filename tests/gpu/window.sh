#!/usr/bin/env bash
# One H200 "window": the lead's single device call that runs every helper's GPU script in turn.
# Usage (device machine, repo root; .gpuwork/w prepared by tests/gpu/window_prep.sh on the dev machine):
#   bash tests/gpu/window.sh OUTDIR name:seconds [name:seconds ...]
# Each tests/gpu/w/<name>.sh runs as `bash tests/gpu/w/<name>.sh OUTDIR/<name>.log SECONDS` under a hard
# timeout of SECONDS+30 with the environment below; missing scripts are skipped. The JIT cache's
# shared objects travel between windows as OUTDIR/jit.txz.NN parts (xz) (carried back in .gpuwork/w/). Logs come
# back as OUTDIR/logs.tar. Prints a summary last.
out=${1:?OUTDIR}; shift
t0=$SECONDS
w=$PWD/.gpuwork/w
export EVTC=$w/hostbin/evtc EVT_HOSTBIN=$w/hostbin EVT_LIB=$w/hostbin/libevt.so
export LD_LIBRARY_PATH=$w/hostbin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export CUTLASS_PATH=$PWD/.cutlass/cutlass_library/source EVT_KERNELS_DIR=$PWD/kernels
export EVT_JIT_CACHE=/tmp/evt-jit EVT_JIT_JOBS=16 PYTHONUNBUFFERED=1
mkdir -p "$EVT_JIT_CACHE"
tar xzf "$w/hostbin.tgz" -C "$w"
[ -d .cutlass/cutlass_library ] || tar xzf "$w/cutlass.tgz"
[ -f "$w/jit.txz" ] && tar xJf "$w/jit.txz" -C "$EVT_JIT_CACHE" && echo "jit cache: $(ls "$EVT_JIT_CACHE" | grep -c '\.so$') kernels"
# TUNE_RECORDS=folder (in the repo, e.g. bench/results/h200-2026-11-30/S16W4/tune): tuning records to start from
if [ -n "${TUNE_RECORDS:-}" ]; then
  mkdir -p "$EVT_JIT_CACHE/tune" && cp "$TUNE_RECORDS"/*.txt "$EVT_JIT_CACHE/tune/" &&
    echo "tuning records: $(ls "$EVT_JIT_CACHE/tune" | wc -l) (from $TUNE_RECORDS)"
fi
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
if ! make -j16 cuda > /tmp/make_cuda.log 2>&1; then echo "make cuda FAILED"; tail -30 /tmp/make_cuda.log; fi
export EVT_FALLBACK_LIB=$PWD/build/libevt_fallback.so
echo "setup done at $((SECONDS - t0)) s"
summary=""
for spec in "$@"; do
  name=${spec%%:*}; secs=${spec##*:}
  s=tests/gpu/w/$name.sh
  if [ ! -f "$s" ]; then summary+="$name: no script\n"; continue; fi
  t1=$SECONDS
  timeout -k 5 $((secs + 30)) bash "$s" "$out/$name.log" "$secs" > "$out/$name.stdout" 2>&1
  rc=$?
  # keep one file per helper: append the script's own stdout/stderr to its log
  { echo; echo "=== stdout/stderr of $s (rc $rc) ==="; tail -c 20000 "$out/$name.stdout"; } >> "$out/$name.log"
  rm -f "$out/$name.stdout"
  summary+="$name: rc $rc, $((SECONDS - t1)) s\n"
  echo "--- $name done (rc $rc, $((SECONDS - t1)) s); last lines:"; tail -n 12 "$out/$name.log"
done
# logs in one file; the JIT cache's shared objects as up to 7 compressed parts of 15 MB (8 files come back)
( cd "$out" && tar cf logs.tar *.log && rm -f *.log )
( cd "$EVT_JIT_CACHE" && find . -name '*.so' -o -path './tune/*' -type f | tar cf - -T - ) | xz -6 -T16 |
  split -b 15000000 -d - "$out/jit.txz."
n=$(ls "$out"/jit.txz.* 2>/dev/null | wc -l)
[ "$n" -gt 7 ] && { echo "jit cache too big ($n parts), dropped"; rm -f "$out"/jit.txz.*; }
echo "=== window summary ($((SECONDS - t0)) s)"; printf "$summary"
