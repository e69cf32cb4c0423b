#!/usr/bin/env bash
# What ran on the H200 for bench/results/runtime-h200.md: the check table, the run-time index error
# (must name the node, exit 1), and GPU-only timings of larger graphs (no interpreter check: too slow on
# the CPU). Usage: EVTC=... bench/cuda_device_run.sh OUTDIR
out=${1:?OUTDIR}
evtc=${EVTC:-build/evtc}
bench/cuda_check.sh 3 /tmp/evt-cuda-logs > "$out/table.md"
tail -n +1 /tmp/evt-cuda-logs/* > "$out/all_logs.txt"
{
  echo "== bad_index (expect exit 1 naming %loss)"
  $evtc run bench/graphs/bad_index.evt --device cuda --steps 1; echo "exit $?"
  i=0
  for spec in "mlp --batch 4096 --hidden 1024 --ffn 4096" "bert_layer --paper" ; do
    i=$((i + 1))
    big=${BIGDIR:-/tmp}/big$i.evt
    [ -f "$big" ] || python3 examples/gen.py $spec -o "$big" || continue
    echo "== GPU only: gen.py $spec"
    timeout 150 $evtc run "$big" --device cuda --steps 3 2>&1 | tail -2
  done
} > "$out/extra.txt" 2>&1
cat "$out/table.md" "$out/extra.txt"
