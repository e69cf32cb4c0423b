#!/usr/bin/env bash
# GPU window script of helper "gemmrt" (see tests/gpu/window.sh): GEMM+EVT groups in the fused runtime.
# Usage (device machine, repo root): bash tests/gpu/w/gemmrt.sh LOGFILE SECONDS
# Environment from window.sh: EVTC, LD_LIBRARY_PATH, EVT_FALLBACK_LIB, CUTLASS_PATH, EVT_JIT_CACHE,
# EVT_KERNELS_DIR. Graphs in priority order (GEMM-heavy bf16 graphs first, then the rest):
#   1. pre-compile the generated kernels (`evtc run F --device cuda --fused --steps 0` opens the fused runtime,
#      which JIT-compiles the graph's distinct CUTLASS GEMM and row kernels) of as many of the GEMM graphs as
#      the budget allows (one CUTLASS kernel is ~50 s of one core; mlp_bf16 has 5, bert_layer_bf16 6, two shared),
#      all at once, EVT_JIT_JOBS=16 each; finished kernels stay in $EVT_JIT_CACHE for later windows;
#   2. per graph while time is left: fused   evtc run F --device cuda --fused --check --stats --steps 3
#                                     node by node  evtc run F --device cuda --opt --check --steps 3
# and ends the log with a table: groups fused by kind / fallback, check result and errors (against the CPU
# interpreter, the oracle; bf16: the exact fp64 answer, see evt_check_step), ms of step 3 fused vs node by node.
log=${1:?LOGFILE}; secs=${2:-600}
t0=$SECONDS
: "${EVTC:=build/evtc}"
exec >>"$log" 2>&1
left() { echo $((secs - (SECONDS - t0))); }
echo "=== gemmrt.sh: $(date -u +%H:%M:%S) budget ${secs}s, evtc=$EVTC cache=${EVT_JIT_CACHE:-default}"
prio="bench/graphs/mlp_bf16.evt bench/graphs/bert_layer_bf16.evt bench/graphs/gcn_bf16.evt bench/graphs/bert_layer_sdpa_bf16.evt"
files="$prio"
for f in bench/graphs/*_bf16.evt examples/*.evt; do case " $prio " in *" $f "*) ;; *) files="$files $f";; esac; done
tmp=$(mktemp -d)
cached() { ls "${EVT_JIT_CACHE:-/nonexistent}" 2>/dev/null | grep -c '^evt_kernel_.*\.so$'; }

# 1. pre-compile the GEMM graphs in the background, all at once (kernels already cached cost nothing); each
#    graph's runs below wait for its own pre-compile, so later graphs compile while earlier ones run.
lim=$(( secs * 7 / 10 )); [ $lim -gt $((secs - 25)) ] && lim=$((secs - 25)); [ $lim -lt 10 ] && lim=10
echo "--- 1. pre-compile $(echo $prio | wc -w) GEMM graph(s) in the background within ${lim}s; $(cached) CUTLASS kernels cached before"
declare -A prepid
for f in $prio; do
  b=$(basename "$f" .evt)
  EVT_JIT_JOBS=16 timeout -k 5 $lim "$EVTC" run "$f" --device cuda --fused --steps 0 > "$tmp/$b.pre" 2>&1 &
  prepid[$b]=$!
done
prereport() {
  echo "[$1] pre-compile: $(grep -c 'compiled in' "$tmp/$1.pre") compiled, $(grep -c 'FAILED' "$tmp/$1.pre") failed at $((SECONDS - t0)) s; $(grep '^device:' "$tmp/$1.pre" || echo 'not finished')"
  grep -E 'evt_kernel.*compiled in|FAILED|error' "$tmp/$1.pre" | head -12
}

rows=()
for f in $files; do
  b=$(basename "$f" .evt)
  if [ "$(left)" -lt 15 ]; then rows+=("| $b | skipped (time) | | | | | | | | | |"); continue; fi
  if [ -n "${prepid[$b]}" ]; then wait "${prepid[$b]}"; prereport "$b"; fi
  if [ "$(left)" -lt 15 ]; then rows+=("| $b | skipped (time) | | | | | | | | | |"); continue; fi
  per=$(( $(left) * 2 / 3 )); [ $per -gt 240 ] && per=240
  echo; echo "--- $b: fused (limit ${per}s)"
  timeout -k 5 $per "$EVTC" run "$f" --device cuda --fused --check --stats --steps 3 > "$tmp/$b.fused" 2>&1
  rcf=$?
  grep -vE 'compiled in' "$tmp/$b.fused"; echo "(rc $rcf)"
  rcn=skip
  : > "$tmp/$b.nbn"
  if [ "$(left)" -ge 8 ]; then
    echo "--- $b: node by node"
    timeout -k 3 $(( $(left) - 3 )) "$EVTC" run "$f" --device cuda --opt --check --steps 3 > "$tmp/$b.nbn" 2>&1
    rcn=$?
    grep -E '^(step|done|check|device)' "$tmp/$b.nbn"; echo "(rc $rcn)"
  fi
  fz=$tmp/$b.fused
  ng=$(grep -cE '^group [0-9]+ gemm\+evt .* fused' "$fz")
  nr=$(grep -cE '^group [0-9]+ row .* fused' "$fz")
  np=$(grep -cE '^group [0-9]+ pointwise .* fused' "$fz")
  nb=$(grep -cE '^group [0-9]+ [a-z+]+ fallback' "$fz")
  late=$(grep -c 'runs node by node from now on' "$fz")
  chk() { grep -E '^check: (matched|MISMATCH)' "$1" | sed -E 's/^check: ([A-Za-z]+),.*max rel error ([^ ,]+).*/\1 \2/'; }
  last() { grep -E '^step 3 ' "$1" | sed -E 's/.*\(([0-9.]+) ms\).*/\1/'; }
  # bf16/f16 detail: GPU vs exact, bound, per-node interpreter vs exact, GPU vs per-node interpreter
  det() { grep -E '^check: bf16/f16 outputs' "$1" | sed -E 's/.*exact \(fp64 interpreter\) ([^,]+), bound ([^ ]+) = max\(1e-2, 2 x ([^,]+),.*per-node interpreter ([^;]+);.*/\1 \/ \2 \/ \3 \/ \4/'; }
  cf=$(chk "$fz"); cn=$(chk "$tmp/$b.nbn")
  rows+=("| $b | $ng / $nr / $np | $nb (+$late at launch) | ${cf% *} | ${cf#* } | $(det "$fz") | ${cn% *} ${cn#* } | $(det "$tmp/$b.nbn") | $(last "$fz") | $(last "$tmp/$b.nbn") | rc $rcf/$rcn |")
done
echo
echo "=== gemmrt summary ($((SECONDS - t0)) s): evtc run F --device cuda --fused --check --stats --steps 3 vs --opt (node by node)"
echo "max rel err: bf16 graphs: GPU vs the exact (fp64) interpreter; f32: vs the interpreter. 16-bit detail columns:"
echo "GPU vs exact / bound = max(1e-2, 2 x per-node-interpreter vs exact) / per-node interpreter vs exact / GPU vs per-node interpreter"
echo "| graph | fused gemm / row / pointwise | fallback groups | fused check | fused max rel err | fused 16-bit detail | node-by-node check, err | node-by-node 16-bit detail | fused ms (step 3) | node-by-node ms (step 3) | rc |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for r in "${rows[@]}"; do echo "$r"; done
for b in "${!prepid[@]}"; do kill "${prepid[$b]}" 2>/dev/null; done
wait
echo "$(cached) CUTLASS kernels cached at the end"
rm -rf "$tmp"
