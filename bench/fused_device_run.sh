#!/usr/bin/env bash
# What ran on the H200 for bench/results/runtime-fused-h200.md: every bf16 example graph (bench/graphs) and
# then the f32 examples, each as `evtc run FILE --device cuda --fused --check --stats --steps 2` and as the
# node-by-node baseline on the same optimized graph (`--opt --check --steps 2`), with a markdown table.
# Usage (device machine, from a copy of the tree with hostbin/ = evtc + its CBC libraries built elsewhere):
#   bench/fused_device_run.sh OUTDIR [SECONDS]   (stops starting new graphs after SECONDS, default 230)
out=${1:?OUTDIR}
budget=${2:-230}
t0=$SECONDS
evtc=${EVTC:-hostbin/evtc}
export LD_LIBRARY_PATH=$PWD/hostbin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export EVT_FALLBACK_LIB=${EVT_FALLBACK_LIB:-$PWD/build/libevt_fallback.so}
export EVT_JIT_CACHE=${EVT_JIT_CACHE:-/tmp/evt-jit} EVT_KERNELS_DIR=$PWD/kernels
logs=${LOGDIR:-$out/logs}
mkdir -p "$logs"
[ -f "$EVT_FALLBACK_LIB" ] || make cuda > "$out/make_cuda.log" 2>&1 || { cat "$out/make_cuda.log"; exit 1; }
table=$out/table.md
echo "| example | groups fused / fallback | fused matched | fused max rel error | unfused matched | unfused max rel error | fused ms/step (mean, last) | unfused ms/step (mean, last) | loss first -> last (fused) |" > "$table"
echo "|---|---|---|---|---|---|---|---|---|" >> "$table"
field() { sed -n "$2" "$1" | tail -1; }
for f in $(ls bench/graphs/*_bf16.evt) examples/*.evt; do
  if [ $((SECONDS - t0)) -gt "$budget" ]; then echo "| $(basename "$f" .evt) | not run (time budget) | | | | | | | |" >> "$table"; continue; fi
  b=$(basename "$f" .evt)
  timeout 60 $evtc run "$f" --device cuda --fused --check --stats --steps 2 > "$logs/$b.fused.log" 2>&1; rf=$?
  timeout 40 $evtc run "$f" --device cuda --opt --check --steps 2 > "$logs/$b.unfused.log" 2>&1; ru=$?
  groups=$(field "$logs/$b.fused.log" 's/^stats: groups fused \([0-9]*\), fallback \([0-9]*\);.*/\1 \/ \2/p')
  mf=$(grep -q '^check: matched' "$logs/$b.fused.log" && echo yes || echo "NO (rc $rf)")
  mu=$(grep -q '^check: matched' "$logs/$b.unfused.log" && echo yes || echo "NO (rc $ru)")
  ef=$(field "$logs/$b.fused.log" 's/^check: .*max rel error \([^ ]*\).*/\1/p')
  eu=$(field "$logs/$b.unfused.log" 's/^check: .*max rel error \([^ ]*\).*/\1/p')
  tf=$(field "$logs/$b.fused.log" 's/^done: .*, \([0-9.]*\) ms\/step/\1/p'); lf=$(field "$logs/$b.fused.log" 's/^step .*(\([0-9.]*\) ms)/\1/p')
  tu=$(field "$logs/$b.unfused.log" 's/^done: .*, \([0-9.]*\) ms\/step/\1/p'); lu=$(field "$logs/$b.unfused.log" 's/^step .*(\([0-9.]*\) ms)/\1/p')
  loss=$(field "$logs/$b.fused.log" 's/^done: .*loss \(.*\), [0-9.]* ms\/step/\1/p')
  echo "| $b | ${groups:--} | $mf | ${ef:--} | $mu | ${eu:--} | ${tf:--}, ${lf:--} | ${tu:--}, ${lu:--} | ${loss:--} |" >> "$table"
done
cat "$table"
echo "elapsed $((SECONDS - t0)) s"
