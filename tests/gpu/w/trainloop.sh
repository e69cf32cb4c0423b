#!/usr/bin/env bash
# GPU window script of evtc run's training loop: bash tests/gpu/w/trainloop.sh LOGFILE SECONDS
# (repo root on the H200, tests/gpu/window.sh's environment: $EVTC, $EVT_FALLBACK_LIB, $CUTLASS_PATH).
# For each graph and mode: `evtc run F --device cuda --steps N MODE` twice, with the device-resident loop
# (default: params on the device, evt_program_sgd there, the loss downloaded) and with --host-sgd (every input and
# param uploaded each step, every output downloaded, the update on the host). The loss lines must be identical
# bit for bit (the device's update has the host's arithmetic) - a difference is a FAIL row. Then one --check run
# with the device loop (the params the step read come back for the interpreter), and examples/c/train_step.c
# (evt_program_sgd through the public API). Ends with a table: graph, mode, losses identical, wall seconds and
# ms/step of both loops (GPU events and host wall clock).
set -uo pipefail
WINDOW_LOG=trainloop.log WINDOW_SECS=200 WINDOW_TMP=/tmp/trainloop-gpu
source "$(dirname "$0")/budget_tee.sh"
log "== trainloop: evtc run's GPU loop, device SGD vs host SGD ($(date -u +%H:%M:%S), budget ${BUDGET}s)"
STEPS=${TRAINLOOP_STEPS:-12}
export EVT_LOSS_DIGITS=17 # every bit of each step's loss
declare -a rows
one() { # graph mode...: both loops, compare
  local f=$1; shift
  local mode="$*"
  [ "$(left)" -lt 20 ] && { rows+=("| $f | $mode | skipped (time) | | | |"); return; }
  local t1 t2 t3 rc1 rc2
  t1=$(date +%s.%N)
  timeout $(( $(left) / 2 )) "$EVTC" run "$f" --device cuda --steps "$STEPS" $mode >"$B/dev.out" 2>"$B/dev.err"; rc1=$?
  t2=$(date +%s.%N)
  timeout $(( $(left) - 5 )) "$EVTC" run "$f" --device cuda --steps "$STEPS" $mode --host-sgd >"$B/host.out" 2>"$B/host.err"; rc2=$?
  t3=$(date +%s.%N)
  { echo "$ evtc run $f --device cuda --steps $STEPS $mode   (rc $rc1)"; cat "$B/dev.out"; grep -v "^\[evt-jit\] [0-9]" "$B/dev.err" | tail -5
    echo "$ ... --host-sgd   (rc $rc2)"; cat "$B/host.out"; grep -v "^\[evt-jit\] [0-9]" "$B/host.err" | tail -5; } >>"$LOG"
  grep -o "^step [0-9]* loss [^ ]*" "$B/dev.out" >"$B/dev.loss"
  grep -o "^step [0-9]* loss [^ ]*" "$B/host.out" >"$B/host.loss"
  local same=FAIL
  [ "$rc1" = 0 ] && [ "$rc2" = 0 ] && [ -s "$B/dev.loss" ] && cmp -s "$B/dev.loss" "$B/host.loss" && same=identical
  local md mh
  md=$(grep -o "median [0-9.]* ms/step" "$B/dev.out" | grep -o "[0-9.]*" | head -1)
  mh=$(grep -o "median [0-9.]* ms/step" "$B/host.out" | grep -o "[0-9.]*" | head -1)
  local wd wh
  wd=$(grep -o "wall median [0-9.]* ms/step" "$B/dev.out" | grep -o "[0-9.]*" | head -1)
  wh=$(grep -o "wall median [0-9.]* ms/step" "$B/host.out" | grep -o "[0-9.]*" | head -1)
  rows+=("| $f | ${mode:-node by node} | $same ($(wc -l <"$B/dev.loss") steps) | ${md:-?} / ${wd:-?} | ${mh:-?} / ${wh:-?} | $(awk "BEGIN{printf \"%.1f / %.1f\", $t2 - $t1, $t3 - $t2}") |")
}
one examples/mlp.evt
one examples/mlp.evt --cuda-graph
if [ -z "${TRAINLOOP_QUICK:-}" ]; then # (TRAINLOOP_QUICK=1: no generated kernels to compile)
  one bench/graphs/mlp_bf16.evt --fused
  one bench/graphs/bert_layer_bf16.evt --fused --cuda-graph
fi
one bench/graphs/bert_layer_bf16.evt
for f in examples/*.evt; do [ "$f" = examples/mlp.evt ] || one "$f"; done
one tests/gpu/graphs/no_params.evt

chk=skipped
if [ "$(left)" -gt 25 ] && [ -z "${TRAINLOOP_QUICK:-}" ]; then
  out=$(timeout $(( $(left) - 10 )) "$EVTC" run bench/graphs/mlp_bf16.evt --device cuda --fused --steps 4 --check 2>&1)
  echo "$ evtc run bench/graphs/mlp_bf16.evt --device cuda --fused --steps 4 --check"$'\n'"$out" | grep -v "^\[evt-jit\] [0-9]" >>"$LOG"
  chk=$(echo "$out" | grep -o "^check: [A-Za-z]*.*max rel error [^ ]*" | head -1)
fi
ex=skipped
if [ "$(left)" -gt 15 ]; then
  CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
  LIBEVT=${EVT_LIB:-$PWD/build/libevt.so}
  RPL=$(echo "${LD_LIBRARY_PATH:-}" | tr ':' '\n' | grep . | sed 's/^/-Wl,-rpath-link,/' | tr '\n' ' ')
  if gcc -std=gnu11 -O2 -Iinclude -I"$CUDA_HOME/include" examples/c/train_step.c "$LIBEVT" -L"$CUDA_HOME/lib64" -lcudart -lm \
      -ldl -Wl,-rpath,"$(dirname "$LIBEVT")" -Wl,-rpath,"$CUDA_HOME/lib64" -Wl,--allow-shlib-undefined $RPL \
      -o "$B/train_step" >>"$LOG" 2>&1; then
    exo=$(timeout $(( $(left) - 5 )) "$B/train_step" 2>&1)
    ex="rc=$?, $(echo "$exo" | grep -c "^step [0-9]* loss") steps, loss $(echo "$exo" | grep -o "loss [0-9.]*" | head -1 | cut -d' ' -f2) -> $(echo "$exo" | grep -o "loss [0-9.]*" | tail -1 | cut -d' ' -f2)"
    { echo "$ examples/c/train_step"; echo "$exo" | grep -v '^\[evt-jit\] [0-9]'; } >>"$LOG"
  else
    ex="BUILD FAILED"
  fi
fi
log ""
log "== trainloop summary ($(( $(date +%s) - T0 )) s; $STEPS steps; wall s = the whole evtc run incl. compile)"
log "| graph | mode | device vs host SGD losses (17 digits) | device loop: median ms/step run + SGD / wall median ms/step | host loop: median ms/step run only / wall median ms/step incl. transfers + update | evtc wall s device / host (incl. compile) |"
log "|---|---|---|---|---|---|"
for r in "${rows[@]}"; do log "$r"; done
log "| --check (device loop) | mlp_bf16 --fused | ${chk} | | | |"
log "| examples/c/train_step | evt_program_sgd | ${ex} | | | |"
