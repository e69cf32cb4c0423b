#!/usr/bin/env bash
# GPU window script of the "visitors" area: the visitor node types added for the examples' loss /
# activation / mask groups, generated kernels on the H200 against the CPU reference / interpreter.
#   bash tests/gpu/w/visitors.sh LOGFILE SECONDS        (environment: tests/gpu/window.sh)
# 1. tests/gpu/check_visitors.cu: row kernels of the examples unary_math / cmp_where / softmax_xent (bf16,
#    f32; 7 sizes) vs evt_rspec_reference, per store and per node type ("matched" / "NOT MATCHED").
# 1b. tests/gpu/check_vops.cu: the GEMM epilogue's compute functors (kernels/evt_visitor_ops.h) on the device
#    vs evt_vop_apply3 (seconds; no CUTLASS GEMM to compile).
# 2. evtc run --device cuda --fused --check: whole training steps of the f32 examples whose loss / mask /
#    optimizer groups now lower to generated row kernels, every output vs the interpreter (f32: 1e-4);
#    the bf16 graphs too (--check's bf16 rule: src/runtime/gpu_check.c).
# 3. with time left: the two GEMM examples visitor_ops / visitor_cmp JIT-compiled with CUTLASS (nvcc,
#    $EVT_JIT_CACHE) and checked the same way.
# VISITORS_PARTS (default "rows vops e2e gemm"): the parts to run, e.g. VISITORS_PARTS=gemm for the CUTLASS part alone;
# VISITORS_GEMM_MIN (150): the seconds that must be left for the CUTLASS part.
# Ends with a summary table.
log=${1:?LOGFILE}
secs=${2:-600}
t0=$SECONDS
cd "$(dirname "$0")/../../.."
exec >"$log" 2>&1
left() { echo $((secs - (SECONDS - t0))); }
echo "=== visitors: $(date -u) on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), budget ${secs}s"
B=/tmp/evt-visitors
K=$B/kernels
rm -rf "$K" && mkdir -p "$B/obj" "$K"
lib=${EVT_HOSTBIN:-/nonexistent}/libevt.a  # built on the dev machine from this tree (window_prep.sh)
if [ ! -f "$lib" ]; then
  objs=()
  for f in src/util/*.c src/ir/*.c src/codegen/*.c src/runtime/jit/*.c; do
    o="$B/obj/$(echo "$f" | tr / _).o"
    gcc -std=c11 -O2 -fPIC -D_GNU_SOURCE -Iinclude -Isrc -Ikernels -c "$f" -o "$o" &
    objs+=("$o")
  done
  wait
  ar rcs "$B/libevt_vis.a" "${objs[@]}"
  lib=$B/libevt_vis.a
fi
nvcc -std=c++17 -O2 -gencode=arch=compute_90a,code=sm_90a -Isrc -Iinclude -Ikernels tests/gpu/check_visitors.cu \
  "$lib" -ldl -lm -lpthread -o "$B/check_visitors" || echo "BUILD FAILED: check_visitors" &
nvcc -std=c++17 --expt-relaxed-constexpr -O2 -gencode=arch=compute_90a,code=sm_90a -Isrc -Iinclude -Ikernels \
  -I"${CUTLASS_PATH:-.cutlass/cutlass_library/source}/include" tests/gpu/check_vops.cu "$lib" -ldl -lm -lpthread \
  -o "$B/check_vops" || echo "BUILD FAILED: check_vops" &
wait
summary=""
parts=" ${VISITORS_PARTS:-rows vops e2e gemm} "
want() { [[ "$parts" == *" $1 "* ]]; }
row_rc=skipped
if [ -x "$B/check_visitors" ] && want rows; then
  "$B/check_visitors" emit "$K"
  # the flags of src/runtime/jit/jit.c for kernels without CUTLASS
  ls "$K"/*.cu | sed 's/\.cu$//' | xargs -P "$(nproc)" -I{} sh -c \
    'nvcc -std=c++17 --expt-relaxed-constexpr -O3 -DNDEBUG -gencode=arch=compute_90a,code=sm_90a -Xcompiler -fPIC \
     -Ikernels -shared -lcuda -o {}.so {}.cu >{}.log 2>&1 || { echo "nvcc failed: {}"; tail -20 {}.log; }'
  echo "--- row kernels built at $((SECONDS - t0)) s"
  timeout $(( $(left) > 20 ? $(left) - 5 : 15 )) "$B/check_visitors" check "$K" >"$B/rows.txt" 2>&1
  row_rc=$?
  cat "$B/rows.txt"
fi
summary+="row visitor kernels (check_visitors): rc $row_rc, $(tail -1 "$B/rows.txt" 2>/dev/null)\n"

echo; echo "=== GEMM epilogue functors (evt_ops::*, Array<float,4> as Sm90Compute calls them) vs evt_vop_apply3"
vops_rc=skipped
if [ -x "$B/check_vops" ] && [ "$(left)" -gt 8 ] && want vops; then
  timeout $(( $(left) - 3 )) "$B/check_vops" >"$B/vops.txt" 2>&1
  vops_rc=$?
  cat "$B/vops.txt"
fi
summary+="GEMM compute functors (check_vops): rc $vops_rc, $(tail -1 "$B/vops.txt" 2>/dev/null)\n"

echo; echo "=== end-to-end: evtc run --device cuda --fused --check (generated row kernels vs the interpreter)"
echo "(row kernels JIT-compile on first use; \$EVT_JIT_CACHE keeps them for the next window)"
for f in examples/mlp.evt examples/bert_layer.evt examples/gcn.evt examples/resnet_block.evt examples/vit.evt \
         bench/graphs/mlp_bf16.evt bench/graphs/bert_layer_bf16.evt; do
  want e2e || break
  [ "$(left)" -lt 12 ] && { summary+="$f: skipped (time)\n"; continue; }
  out=$(timeout $(( $(left) - 4 )) "$EVTC" run "$f" --device cuda --fused --check --steps 2 --stats 2>&1)
  rc=$?
  echo "--- $f (rc $rc)"
  echo "$out" | grep -E "^(device|check|stats|done|step)|error|FAIL|mismatch|not matched" | head -20
  res=$([ $rc -eq 0 ] && echo "matched" || echo "NOT MATCHED (rc $rc)")
  res="$res; $(echo "$out" | grep -E '^check:' | sed 's/^check: //' | head -1); $(echo "$out" | grep -E '^stats:' | sed 's/^stats: //' | head -1)"
  summary+="$f: $res\n"
done

gemm_rc=skipped
if [ -x "$B/check_visitors" ] && [ "$(left)" -gt "${VISITORS_GEMM_MIN:-150}" ] && want gemm; then  # two CUTLASS kernels: ~3 min of nvcc when not cached
  echo; echo "=== GEMM visitor kernels (CUTLASS JIT, $(left) s left)"
  timeout $(( $(left) - 20 )) "$B/check_visitors" gemm 2>&1 | tee "$B/gemm.txt"
  gemm_rc=${PIPESTATUS[0]}
fi
summary+="GEMM visitor kernels (visitor_ops, visitor_cmp): rc $gemm_rc, $(grep -E 'passed, ' "$B/gemm.txt" 2>/dev/null | tail -1)$([ "$gemm_rc" = skipped ] && echo " (needs > ${VISITORS_GEMM_MIN:-150} s of budget: CUTLASS JIT)")\n"
echo; echo "=== visitors summary ($((SECONDS - t0)) s)"
printf "$summary"
