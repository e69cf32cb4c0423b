#!/usr/bin/env bash
# GPU window script of the program API (helper devapi): bash tests/gpu/w/devapi.sh LOGFILE SECONDS
# Builds tests/gpu/program_check.c and examples/c/train_step.c against libevt + cudart, runs program_check on
# every examples/*.evt and bench/graphs/*_bf16.evt (node, node+graph, fused, fused+graph: matched against the
# interpreter, graph replay == eager bits, ms/step, launches/step), then `evtc run --device cuda` with
# --check in its modes (the evt_cuda_step wrapper over the program), then the C example. Everything goes to
# LOGFILE, ending with a summary table.
set -uo pipefail
LOG=${1:-devapi.log}
BUDGET=${2:-300}
cd "$(dirname "$0")/../../.."
: >"$LOG"
T0=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
log() { echo "$@" | tee -a "$LOG"; }
EVTC=${EVTC:-$PWD/build/evtc}
B=/tmp/devapi-gpu
mkdir -p "$B"
log "== devapi: program API on the GPU ($(date -u +%H:%M:%S), budget ${BUDGET}s, git $(git rev-parse --short HEAD 2>/dev/null))"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >>"$LOG" 2>&1
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
# the fallback library must have the stream/context ABI of this tree (evt_fb_ctx_new)
FB=${EVT_FALLBACK_LIB:-$PWD/build/libevt_fallback.so}
if ! grep -q evt_fb_ctx_new "$FB" 2>/dev/null; then
  log "WARNING: fallback library $FB ($(ls -l --time-style=+%H:%M:%S "$FB" 2>&1 | awk '{print $6}'); kernels/evt_fallback.cu $(ls -l --time-style=+%H:%M:%S kernels/evt_fallback.cu | awk '{print $6}')) lacks evt_fb_ctx_new (stale: make cuda did not rebuild it?): building a private copy"
  make -s cuda BUILD="$B" >>"$LOG" 2>&1 && FB=$B/libevt_fallback.so
fi
export EVT_FALLBACK_LIB=$FB
# libevt: $EVT_LIB (window.sh: evtc's libevt.so from the dev machine, CBC libs on LD_LIBRARY_PATH), else build/
LIBEVT=${EVT_LIB:-$PWD/build/libevt.so}
if ! grep -q evt_program_create "$LIBEVT" 2>/dev/null; then
  log "build/libevt.so missing or without evt_program_create: make build/libevt.so"
  timeout $(( $(left) / 3 )) make -s -j16 build/libevt.so >>"$LOG" 2>&1
fi
RPL=$(echo "${LD_LIBRARY_PATH:-}" | tr ':' '\n' | grep . | sed 's/^/-Wl,-rpath-link,/' | tr '\n' ' ')
CFLAGS="-std=gnu11 -O2 -Iinclude -Isrc -Ikernels -I$CUDA_HOME/include"
LDF="$LIBEVT -L$CUDA_HOME/lib64 -lcudart -lm -ldl -Wl,-rpath,$(dirname "$LIBEVT") -Wl,-rpath,$CUDA_HOME/lib64 -Wl,--allow-shlib-undefined $RPL"
gcc $CFLAGS tests/gpu/program_check.c $LDF -o "$B/program_check" >>"$LOG" 2>&1 || log "BUILD FAILED: program_check"
gcc $CFLAGS examples/c/train_step.c $LDF -o "$B/train_step" >>"$LOG" 2>&1 || log "BUILD FAILED: examples/c/train_step.c"
log "built drivers in $(( $(date +%s) - T0 )) s; EVT_FALLBACK_LIB=$EVT_FALLBACK_LIB"

# Phase 1: every graph, CUTLASS hidden (GEMM+EVT groups fall back node by node, quickly; row / pointwise
# groups are JIT-compiled without CUTLASS). Phase 2: two graphs with the GEMM+EVT kernels (CUTLASS JIT,
# shared cache; slow when cold).
rc_pc=skipped
rc_pc2=skipped
if [ -x "$B/program_check" ]; then
  files=(bench/graphs/bert_layer_bf16.evt bench/graphs/mlp_bf16.evt bench/graphs/vit_bf16.evt bench/graphs/xmlcnn_bf16.evt
         bench/graphs/gcn_bf16.evt bench/graphs/resnet_block_bf16.evt bench/graphs/bert_layer_sdpa_bf16.evt examples/*.evt)
  # warm the JIT cache: the row / pointwise kernels of every graph, all graphs at once (evtc run --steps 0
  # creates the fused program, which compiles them)
  t1=$(date +%s)
  [ "$BUDGET" -lt 150 ] && log "small budget: no JIT warm-up"
  [ "$BUDGET" -ge 150 ] && for f in "${files[@]}"; do
    CUTLASS_PATH=/nonexistent/devapi-no-cutlass EVT_JIT_JOBS=3 timeout $(( $(left) / 4 )) \
      "$EVTC" run "$f" --device cuda --fused --steps 0 >/dev/null 2>&1 &
  done
  wait
  log "JIT warm-up (row kernels of ${#files[@]} graphs in parallel): $(( $(date +%s) - t1 )) s"
  log "== program_check phase 1: ${#files[@]} graphs x 4 modes, 3 steps + 20 timed runs each, no CUTLASS (GEMM groups node by node)"
  CUTLASS_PATH=/nonexistent/devapi-no-cutlass timeout $(( $(left) / 2 )) "$B/program_check" --steps 3 --reps 20 \
    --budget $(( $(left) / 2 - 10 )) "${files[@]}" 2>&1 | tee -a "$LOG" >/dev/null
  rc=${PIPESTATUS[0]}
  rc_pc=$([ "$rc" = 0 ] && echo ok || echo "rc=$rc")
  if [ "$(left)" -gt 90 ]; then
    log "== program_check phase 2: with GEMM+EVT kernels (CUTLASS JIT)"
    timeout $(( $(left) - 60 )) "$B/program_check" --steps 3 --reps 20 --budget $(( $(left) - 80 )) \
      bench/graphs/mlp_bf16.evt bench/graphs/bert_layer_bf16.evt 2>&1 | tee -a "$LOG" >/dev/null
    rc=${PIPESTATUS[0]}
    rc_pc2=$([ "$rc" = 0 ] && echo ok || echo "rc=$rc")
  fi
fi

log "== evtc run --device cuda (evt_cuda_step over the program), --check against the interpreter (no CUTLASS: GEMM groups node by node)"
declare -a sumrows
runs=("bench/graphs/mlp_bf16.evt --fused --cuda-graph" "bench/graphs/mlp_bf16.evt" "bench/graphs/mlp_bf16.evt --cuda-graph"
      "examples/bert_layer.evt" "examples/bert_layer.evt --cuda-graph" "bench/graphs/bert_layer_bf16.evt --fused")
for args in "${runs[@]}"; do
  [ "$(left)" -lt 25 ] && { sumrows+=("| evtc run $args | skipped (time) |"); continue; }
  out=$(CUTLASS_PATH=/nonexistent/devapi-no-cutlass timeout $(( $(left) / 2 )) "$EVTC" run $args --device cuda --steps 5 --check 2>&1)
  rc=$?
  echo "$ evtc run $args --device cuda --steps 5 --check" >>"$LOG"
  echo "$out" | grep -v "^step [234] " >>"$LOG"
  ms=$(echo "$out" | grep -o "[0-9.]* ms/step.*" | head -1)
  chk=$(echo "$out" | grep -o "^check: [A-Za-z]*" | head -1)
  sumrows+=("| evtc run $args | rc=$rc $chk ${ms} |")
done

rc_ex=skipped
if [ -x "$B/train_step" ] && [ "$(left)" -gt 10 ]; then
  log "== examples/c/train_step.c"
  timeout 60 "$B/train_step" >>"$LOG" 2>&1
  rc_ex=rc=$?
fi

log ""
log "== devapi summary ($(( $(date +%s) - T0 )) s)"
log "| what | result |"
log "|---|---|"
log "| program_check (phase 1, no CUTLASS; phase 2 with GEMM+EVT) | $rc_pc; $rc_pc2 ($(grep -c '| matched |' "$LOG") matched rows, $(grep -c '| MISMATCH |\|| FAILED |' "$LOG") not) |"
for r in "${sumrows[@]}"; do log "$r"; done
log "| examples/c/train_step | $rc_ex |"
