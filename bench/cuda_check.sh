#!/usr/bin/env bash
# Runs every example (and bench/graphs/*.evt: bf16 variants, op coverage) on the GPU for N steps with
# --check against the interpreter (plain joint graph and --opt), and prints a markdown table.
# Usage: [EVTC=build/evtc] bench/cuda_check.sh [STEPS] [LOGDIR]   (needs `make cuda`)
steps=${1:-3}
logs=${2:-/tmp/evt-cuda-check}
mkdir -p "$logs"
echo "| example | graph | matched | max rel error | GPU ms/step (mean) | GPU ms (last step) | interpreter ms/step | loss first -> last |"
echo "|---|---|---|---|---|---|---|---|"
for f in examples/*.evt $(ls bench/graphs/*.evt | grep -v bad_index); do
  base=$(basename "$f" .evt)
  for mode in joint opt; do
    flag=""; [ "$mode" = opt ] && flag="--opt"
    log="$logs/$base.$mode.log"
    timeout 120 ${EVTC:-build/evtc} run "$f" --device cuda --steps "$steps" --check $flag >"$log" 2>&1
    rc=$?
    chk=$(grep '^check:' "$log" | tail -1)
    done_=$(grep '^done:' "$log" | tail -1)
    matched=$(echo "$chk" | grep -q 'check: matched' && echo yes || echo "NO (rc $rc)")
    err=$(echo "$chk" | sed -n 's/.*max rel error \([^ ]*\).*/\1/p')
    ims=$(echo "$chk" | sed -n 's/.*interpreter \([0-9.]*\) ms.*/\1/p')
    gms=$(echo "$done_" | sed -n 's/.*, \([0-9.]*\) ms\/step/\1/p')
    lastms=$(grep '^step ' "$log" | tail -1 | sed -n 's/.*(\([0-9.]*\) ms)/\1/p')
    loss=$(echo "$done_" | sed -n 's/.*loss \(.*\), [0-9.]* ms\/step/\1/p')
    echo "| $base | $mode | $matched | ${err:--} | ${gms:--} | ${lastms:--} | ${ims:--} | ${loss:--} |"
  done
done
