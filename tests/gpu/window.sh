#!/usr/bin/env bash
# One H200 "window": the lead's single device call that runs every helper's GPU script in turn.
# Usage (device machine, repo root; .gpuwork/w prepared by tests/gpu/window_prep.sh on the dev machine):
#   bash tests/gpu/window.sh OUTDIR name:seconds [name:seconds ...]
# Each tests/gpu/w/<name>.sh runs as `bash tests/gpu/w/<name>.sh OUTDIR/<name>.log SECONDS` under a hard
# timeout of SECONDS+30 with the environment below; missing scripts are skipped. The JIT cache travels
# between windows as OUTDIR/jit.tar (carried back in .gpuwork/w/jit.tar). Prints a summary last.
out=${1:?OUTDIR}; shift
t0=$SECONDS
w=$PWD/.gpuwork/w
export EVTC=$w/hostbin/evtc EVT_HOSTBIN=$w/hostbin EVT_LIB=$w/hostbin/libevt.so
export LD_LIBRARY_PATH=$w/hostbin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export CUTLASS_PATH=$PWD/.cutlass/cutlass_library/source EVT_KERNELS_DIR=$PWD/kernels
export EVT_JIT_CACHE=/tmp/evt-jit EVT_JIT_JOBS=16 PYTHONUNBUFFERED=1
mkdir -p "$EVT_JIT_CACHE"
[ -f "$w/jit.tar" ] && tar xf "$w/jit.tar" -C "$EVT_JIT_CACHE" 2>/dev/null
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
( cd "$EVT_JIT_CACHE" && tar cf "$out/jit.tar" --exclude='*.log' . ) 2>/dev/null
sz=$(stat -c %s "$out/jit.tar" 2>/dev/null || echo 0)
[ "$sz" -gt 16000000 ] && { echo "jit.tar too big ($sz), dropped"; rm -f "$out/jit.tar"; }
echo "=== window summary ($((SECONDS - t0)) s)"; printf "$summary"
