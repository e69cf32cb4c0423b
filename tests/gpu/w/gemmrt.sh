#!/usr/bin/env bash
# GPU window script of helper "gemmrt" (see tests/gpu/window.sh): every example through the fused runtime.
# Usage (device machine, repo root): bash tests/gpu/w/gemmrt.sh LOGFILE SECONDS   (made for ~240 s)
# Environment from window.sh: EVTC, LD_LIBRARY_PATH, EVT_FALLBACK_LIB, CUTLASS_PATH, EVT_JIT_CACHE,
# EVT_KERNELS_DIR. Graphs: bench/graphs/*_bf16.evt (7) and examples/*.evt (7, f32).
#   1. `evtc prefetch ALL --list`: the distinct generated kernels of all 14 graphs (as `evtc run --fused` builds
#      them); graphs are ordered by how many CUTLASS GEMM kernels they need (slowest-compiling last).
#   2. ONE parallel JIT batch for all graphs, two processes at once: `evtc prefetch ALL --only gemm`
#      (EVT_JIT_JOBS=16, ~35-50 s per CUTLASS kernel) and `--only rows` (EVT_JIT_JOBS=8, ~2-10 s each), within
#      ~55% of the budget (timeout kills nvcc too; finished kernels stay in $EVT_JIT_CACHE for later windows).
#   3. per graph, in that order, once its kernels are in (row-only graphs start as soon as the row batch is
#      done, while GEMM kernels still compile: those rows are marked '*' as their timing ran under CPU load):
#        fused:        evtc run F --device cuda --fused --check --stats --steps 5
#        node by node: evtc run F --device cuda --opt --check --steps 5
#      checked against the CPU interpreter (the oracle; bf16: the exact fp64 answer, evt_check_step's bound).
#   4. while time is left, both again with --cuda-graph (the step replayed as one CUDA graph), checked too.
# Each graph's table row is logged as soon as it is known ("ROW | ..."); the summary table at the end holds
# every graph, "skipped (time)" for those the budget did not reach.
log=${1:?LOGFILE}; secs=${2:-240}
t0=$SECONDS
: "${EVTC:=build/evtc}"
exec >>"$log" 2>&1
left() { echo $((secs - (SECONDS - t0))); }
el() { echo $((SECONDS - t0)); }
echo "=== gemmrt.sh: $(date -u +%H:%M:%S) budget ${secs}s, evtc=$EVTC cache=${EVT_JIT_CACHE:-default}"
tmp=$(mktemp -d)
cached() { ls "${EVT_JIT_CACHE:-/nonexistent}" 2>/dev/null | grep -c '^evt_.*kernel_.*\.so$'; }
all=${GEMMRT_GRAPHS:-"bench/graphs/*_bf16.evt examples/*.evt"}  # (GEMMRT_GRAPHS: a subset)
all=$(echo $all)

# 1. kernels per graph; order: fewest GEMM kernels first, then fewest row kernels
"$EVTC" prefetch $all --list > "$tmp/list" 2>&1
echo "--- 1. kernels ($(el) s): $(grep '^prefetch:' "$tmp/list"); $(cached) kernels cached before"
grep -E '\.evt: ' "$tmp/list"
order=$(grep -E '\.evt: .* GEMM\+EVT kernels' "$tmp/list" |
        sed -E 's/^([^:]+): .* ([0-9]+) GEMM\+EVT kernels, ([0-9]+) row kernels/\2 \3 \1/' | sort -n -k1,1 -k2,2 | awk '{print $3}')
[ -n "$order" ] || { echo "(prefetch --list failed; default order)"; order=$all; }
declare -A ngemm
while read -r a b f; do ngemm[$f]=$a; done < <(grep -E '\.evt: .* GEMM\+EVT kernels' "$tmp/list" |
        sed -E 's/^([^:]+): .* ([0-9]+) GEMM\+EVT kernels, ([0-9]+) row kernels/\2 \3 \1/')

# 2. one JIT batch for every graph, GEMM and row kernels at once
plim=$(( secs * 55 / 100 )); [ $plim -lt 20 ] && plim=20
echo "--- 2. prefetch all graphs' kernels within ${plim}s (order: $(for f in $order; do basename $f .evt; done | tr '\n' ' '))"
EVT_JIT_JOBS=16 timeout -k 5 $plim "$EVTC" prefetch $order --only gemm > "$tmp/pre.gemm" 2>&1 &
pg=$!
EVT_JIT_JOBS=8 timeout -k 5 $plim "$EVTC" prefetch $order --only rows > "$tmp/pre.rows" 2>&1 &
pr=$!
gemm_done=0
prereport() {
  echo "[prefetch $1] at $(el) s (rc $2): $(grep -E '^\[evt-jit\] [0-9]+ kernel' "$tmp/pre.$1" | head -1) $(grep -E '^\[evt-jit\] done' "$tmp/pre.$1")"
  grep -E 'compiled in' "$tmp/pre.$1" | sed -E 's/.*(evt_[a-z]*kernel_[0-9a-f]*) compiled in ([0-9.]+) s/\1 \2/' | sort -k2 -n -r | head -4 | tr '\n' ';'; echo
  grep -E 'FAILED|error|evtc prefetch:' "$tmp/pre.$1" | head -8
}
wait $pr; prereport rows $?

rows=()
addrow() { rows+=("$1"); echo "ROW $1"; }
for f in $order; do
  b=$(basename "$f" .evt); dt=f32; case $b in *_bf16) dt=bf16;; esac
  if [ "${ngemm[$f]:-1}" != 0 ] && [ $gemm_done = 0 ]; then
    wait $pg; prereport gemm $?; gemm_done=1
  fi
  if [ "$(left)" -lt 12 ]; then addrow "| $b | $dt | skipped (time) | | | | | | | |"; continue; fi
  busy=""; [ $gemm_done = 0 ] && kill -0 $pg 2>/dev/null && busy="*"
  per=$(( $(left) - 8 )); [ $per -gt 90 ] && per=90
  echo; echo "--- $b ($dt) at $(el) s: fused (limit ${per}s)"
  timeout -k 3 $per "$EVTC" run "$f" --device cuda --fused --check --stats --steps 5 > "$tmp/$b.fused" 2>&1
  rcf=$?
  # fallback groups summarized by reason; row / pointwise group lines and the per-group warnings left out
  grep -vE 'compiled in|^\[evt-jit\] [0-9]+ kernel\(s\): ([0-9]+) cached, 0 to compile|^evtc run: warning: group [0-9]+ \((unfused|gemm\+evt|row|pointwise)\) runs node by node: ' "$tmp/$b.fused" |
    grep -vE '^group [0-9]+ ((row|pointwise) .* fused|[a-z+]+ fallback)|^(step|done|check)' | head -100
  grep -E '^(step|done|check)' "$tmp/$b.fused" | tail -30  # never cut
  grep -E '^group [0-9]+ [a-z+]+ fallback' "$tmp/$b.fused" | sed -E 's/^group [0-9]+ ([a-z+]+) fallback, [0-9]+ nodes: group [0-9]+: %[^ ]+ /\1 fallback: /; s/M=[0-9]+ N=[0-9]+ K=[0-9]+/M, N, K/' |
    sort | uniq -c | sort -rn
  echo "(rc $rcf)"
  rcn=skip; : > "$tmp/$b.nbn"
  if [ "$(left)" -ge 6 ]; then
    per=$(( $(left) - 4 )); [ $per -gt 60 ] && per=60
    echo "--- $b: node by node (limit ${per}s)"
    timeout -k 3 $per "$EVTC" run "$f" --device cuda --opt --check --steps 5 > "$tmp/$b.nbn" 2>&1
    rcn=$?
    grep -E '^(step|done|check|device|evtc run: [^w])|rror' "$tmp/$b.nbn"; echo "(rc $rcn)"
  fi
  fz=$tmp/$b.fused
  ng=$(grep -cE '^group [0-9]+ gemm\+evt .* fused' "$fz")
  nbat=$(grep -cE '^group [0-9]+ gemm\+evt .* fused .* batched' "$fz")
  nr=$(grep -cE '^group [0-9]+ (row|pointwise) .* fused' "$fz")
  nb=$(grep -cE '^group [0-9]+ [a-z+]+ fallback' "$fz")
  late=$(grep -c 'runs node by node from now on' "$fz")
  chk() { grep -E '^check: (matched|MISMATCH)' "$1" | sed -E 's/^check: ([A-Za-z]+),.*max rel error ([^ ,]+).*/\1 \2/'; }
  bound() { if [ $dt = bf16 ]; then grep -E '^check: bf16/f16 outputs' "$1" | sed -E 's/.*, bound ([^ ]+) .*/\1/'; else grep -qE '^check:' "$1" && echo 1e-4; fi; }
  med() { grep -E '^done: ' "$1" | sed -E 's/.*\(median ([0-9.]+) ms\/step[;)].*/\1/'; }
  cf=$(chk "$fz"); cn=$(chk "$tmp/$b.nbn"); mf=$(med "$fz"); mn=$(med "$tmp/$b.nbn")
  [ -n "$cf" ] || cf="no-result -"
  [ $rcf = 124 ] || [ $rcf = 137 ] && cf="timeout -"
  sp=""; [ -n "$mf" ] && [ -n "$mn" ] && sp=$(awk -v a="$mf" -v b="$mn" 'BEGIN { if (a > 0) printf "%.2fx", b / a }')
  addrow "| $b | $dt | $ng ($nbat batched) / $nr / $nb (+$late at launch) | ${cf% *} | ${cf#* } | $(bound "$fz") | ${cn:-none} | ${mf}${busy} | ${mn}${busy} | $sp | $rcf/$rcn |"
done
[ $gemm_done = 0 ] && { wait $pg; prereport gemm $?; }
# 4. while time is left: both paths again with the step replayed as a CUDA graph (launch overhead removed)
cgrows=()
for f in $order; do
  b=$(basename "$f" .evt)
  [ -s "$tmp/$b.fused" ] || continue
  if [ "$(left)" -lt 10 ]; then cgrows+=("| $b | skipped (time) | | | | |"); continue; fi
  echo; echo "--- $b at $(el) s: CUDA graph, fused then node by node"
  per=$(( $(left) - 6 )); [ $per -gt 40 ] && per=40
  timeout -k 3 $per "$EVTC" run "$f" --device cuda --fused --cuda-graph --check --steps 5 > "$tmp/$b.cgf" 2>&1; r1=$?
  grep -E '^(done|check: (matched|MISMATCH)|check: step)|rror' "$tmp/$b.cgf" | head -12
  : > "$tmp/$b.cgn"; r2=skip
  if [ "$(left)" -ge 6 ]; then
    per=$(( $(left) - 4 )); [ $per -gt 40 ] && per=40
    timeout -k 3 $per "$EVTC" run "$f" --device cuda --opt --cuda-graph --check --steps 5 > "$tmp/$b.cgn" 2>&1; r2=$?
    grep -E '^(done|check: (matched|MISMATCH)|check: step)|rror' "$tmp/$b.cgn" | head -12
  fi
  c1=$(grep -E '^check: (matched|MISMATCH)' "$tmp/$b.cgf" | sed -E 's/^check: ([A-Za-z]+),.*max rel error ([^ ,]+).*/\1 \2/')
  c2=$(grep -E '^check: (matched|MISMATCH)' "$tmp/$b.cgn" | sed -E 's/^check: ([A-Za-z]+),.*max rel error ([^ ,]+).*/\1 \2/')
  m1=$(grep -E '^done: ' "$tmp/$b.cgf" | sed -E 's/.*\(median ([0-9.]+) ms\/step[;)].*/\1/')
  m2=$(grep -E '^done: ' "$tmp/$b.cgn" | sed -E 's/.*\(median ([0-9.]+) ms\/step[;)].*/\1/')
  sp=""; [ -n "$m1" ] && [ -n "$m2" ] && sp=$(awk -v a="$m1" -v b="$m2" 'BEGIN { if (a > 0) printf "%.2fx", b / a }')
  cgrows+=("| $b | ${c1:-none} | ${c2:-none} | $m1 | $m2 | $sp | $r1/$r2 |")
  echo "CGROW ${cgrows[-1]}"
done
echo
echo "=== gemmrt summary ($(el) s of ${secs}): evtc run F --device cuda --fused --check --stats --steps 5 vs --opt (node by node)"
echo "groups: GEMM+EVT fused (of which batched bmm) / row+pointwise fused / node by node (+ demoted at launch)."
echo "check: against the CPU interpreter (bf16: GPU vs the exact fp64 answer, within bound = max(1e-2, 2 x per-node"
echo "interpreter vs exact); f32: within 1e-4 of the interpreter). ms: median ms/step of 5 (GPU events); * = ran"
echo "while GEMM kernels were still compiling (CPU under load). Kernels: one JIT batch (evtc prefetch) for all graphs."
echo "| graph | dtype | groups GEMM+EVT (batched) / row / node | fused check | max rel err | bound | node-by-node check, err | fused ms/step | node-by-node ms/step | speedup | rc |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for r in "${rows[@]}"; do echo "$r"; done
echo
echo "CUDA graph replay (--cuda-graph, same check): median ms/step of 5"
echo "| graph | fused check, err | node-by-node check, err | fused ms/step | node-by-node ms/step | speedup | rc |"
echo "|---|---|---|---|---|---|---|"
for r in "${cgrows[@]}"; do echo "$r"; done
echo "$(cached) kernels cached at the end"
rm -rf "$tmp"
