#!/usr/bin/env bash
# GPU window script of the program API (helper devapi): bash tests/gpu/w/devapi.sh LOGFILE SECONDS
# Builds tests/gpu/program_check.c and examples/c/train_step.c against libevt + cudart, then, most important
# first (the window budget is small):
#   1. program_check on bert_layer_bf16 and mlp_bf16, modes node, node+graph, fused, fused+graph, CUTLASS
#      hidden (GEMM+EVT groups node by node; row / pointwise groups fused);
#   2. program_check fused / fused+graph on the same two graphs WITH the GEMM+EVT kernels (CUTLASS JIT);
#   3. program_check on every other examples/*.evt and bench/graphs/*_bf16.evt (CUTLASS hidden);
#   4. `evtc run --device cuda --check` (evt_cuda_step over the program), 5. the C API example.
# Every program_check row: matched against the interpreter (evtc run --check's rule), CUDA-graph replay ==
# eager bits, re-binding re-captures, ms/step (20 runs between CUDA events), launches/step. All output goes to
# LOGFILE, ending with the rows of every mode that finished and a summary table.
set -uo pipefail
WINDOW_LOG=devapi.log WINDOW_SECS=300 WINDOW_TMP=/tmp/devapi-gpu
source "$(dirname "$0")/budget_tee.sh"
NOCUTLASS=/nonexistent/devapi-no-cutlass
log "== devapi: program API on the GPU ($(date -u +%H:%M:%S), budget ${BUDGET}s)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >>"$LOG" 2>&1
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
# the fallback library must have the stream/context ABI of this tree (evt_fb_ctx_new)
FB=${EVT_FALLBACK_LIB:-$PWD/build/libevt_fallback.so}
if ! grep -q evt_fb_ctx_new "$FB" 2>/dev/null; then
  log "WARNING: fallback library $FB lacks evt_fb_ctx_new (stale?): building a private copy"
  make -s cuda BUILD="$B" >>"$LOG" 2>&1 && FB=$B/libevt_fallback.so
fi
export EVT_FALLBACK_LIB=$FB
# libevt: $EVT_LIB (window.sh: evtc's libevt.so from the dev machine, CBC libs on LD_LIBRARY_PATH), else build/
LIBEVT=${EVT_LIB:-$PWD/build/libevt.so}
if ! grep -q evt_program_create "$LIBEVT" 2>/dev/null; then
  log "$LIBEVT missing or without evt_program_create: make build/libevt.so"
  timeout $(( $(left) / 3 )) make -s -j16 build/libevt.so >>"$LOG" 2>&1
  LIBEVT=$PWD/build/libevt.so
fi
RPL=$(echo "${LD_LIBRARY_PATH:-}" | tr ':' '\n' | grep . | sed 's/^/-Wl,-rpath-link,/' | tr '\n' ' ')
CFLAGS="-std=gnu11 -O2 -Iinclude -Isrc -Ikernels -I$CUDA_HOME/include"
LDF="$LIBEVT -L$CUDA_HOME/lib64 -lcudart -lm -ldl -Wl,-rpath,$(dirname "$LIBEVT") -Wl,-rpath,$CUDA_HOME/lib64 -Wl,--allow-shlib-undefined $RPL"
gcc $CFLAGS tests/gpu/program_check.c $LDF -o "$B/program_check" >>"$LOG" 2>&1 || log "BUILD FAILED: program_check"
gcc $CFLAGS examples/c/train_step.c $LDF -o "$B/train_step" >>"$LOG" 2>&1 || log "BUILD FAILED: examples/c/train_step.c"
log "built drivers in $(( $(date +%s) - T0 )) s; EVT_FALLBACK_LIB=$EVT_FALLBACK_LIB"

# program_check PHASE CUTLASS_PATH TIMEOUT MODES FILES...: runs with an internal budget 8 s under the timeout
pc() {
  local phase=$1 cut=$2 t=$3 modes=$4
  shift 4
  [ "$t" -lt 12 ] && { log "== program_check $phase: skipped (time)"; return; }
  log "== program_check $phase ($modes; $# graphs; timeout ${t}s)"
  CUTLASS_PATH=$cut timeout "$t" "$B/program_check" --steps 3 --reps 20 --budget $(( t - 8 )) --modes "$modes" "$@" 2>&1 \
    | grep -v '^\[evt-jit\] [0-9]' | tee -a "$LOG" >/dev/null
  log "   ($phase: exit ${PIPESTATUS[0]})"
}
main2=(bench/graphs/bert_layer_bf16.evt bench/graphs/mlp_bf16.evt)
rest=(bench/graphs/vit_bf16.evt bench/graphs/xmlcnn_bf16.evt bench/graphs/gcn_bf16.evt bench/graphs/resnet_block_bf16.evt
      bench/graphs/bert_layer_sdpa_bf16.evt examples/*.evt)
if [ -x "$B/program_check" ]; then
  pc "phase 1, no CUTLASS" "$NOCUTLASS" $(( $(left) * 2 / 5 )) all "${main2[@]}"
  pc "phase 2, with GEMM+EVT kernels" "${CUTLASS_PATH:-}" $(( $(left) / 2 )) fused "${main2[@]}"
  pc "phase 3, the other graphs, no CUTLASS" "$NOCUTLASS" $(( $(left) - 25 )) all "${rest[@]}"
fi

log "== evtc run --device cuda --check (evt_cuda_step over the program; no CUTLASS)"
declare -a sumrows
for args in "bench/graphs/mlp_bf16.evt --fused --cuda-graph" "bench/graphs/bert_layer_bf16.evt --cuda-graph"; do
  [ "$(left)" -lt 18 ] && { sumrows+=("| evtc run $args | skipped (time) |"); continue; }
  out=$(CUTLASS_PATH=$NOCUTLASS timeout $(( $(left) - 10 )) "$EVTC" run $args --device cuda --steps 5 --check 2>&1)
  rc=$?
  echo "$ evtc run $args --device cuda --steps 5 --check" >>"$LOG"
  echo "$out" | grep -v "^step [234] \|warning: group" >>"$LOG"
  ms=$(echo "$out" | grep -o "[0-9.]* ms/step.*" | head -1)
  chk=$(echo "$out" | grep -o "^check: [A-Za-z]*" | head -1)
  sumrows+=("| evtc run $args | rc=$rc $chk ${ms} |")
done

rc_ex=skipped
if [ -x "$B/train_step" ] && [ "$(left)" -gt 8 ]; then
  log "== examples/c/train_step.c"
  CUTLASS_PATH=$NOCUTLASS timeout $(( $(left) - 2 )) "$B/train_step" 2>&1 | grep -v '^\[evt-jit\] [0-9]' >>"$LOG"
  rc_ex="rc=${PIPESTATUS[0]}"
fi

log ""
log "== devapi: every program_check row (ms/step: 20 runs between CUDA events on a user stream)"
log "| file | mode | result | max rel err | launches/step | ms/step | arena bytes | note |"
log "|---|---|---|---|---|---|---|---|"
grep "^ROW " "$LOG" | sed 's/^ROW //' > "$B/rows.txt"
cat "$B/rows.txt" | tee -a "$LOG" >/dev/null
log ""
log "== devapi summary ($(( $(date +%s) - T0 )) s)"
log "| what | result |"
log "|---|---|"
log "| program_check rows | $(grep -c '| matched |' "$B/rows.txt") matched, $(grep -c '| MISMATCH |\|| FAILED |' "$B/rows.txt") not matched / failed, $(grep -c '| skipped |' "$B/rows.txt") skipped |"
for r in "${sumrows[@]}"; do log "$r"; done
log "| examples/c/train_step | $rc_ex |"
