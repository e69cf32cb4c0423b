#!/usr/bin/env bash
# Every GPU correctness check of evt, each against its CPU reference: the one entry point (`make test-gpu`).
#   bash tests/gpu/run.sh [kernels] [graphs] [program] [torch] [ampere]   (no argument: the first four, in this order)
#   kernels  the CUDA checks of generated kernels and cuDNN attention against their CPU references: GEMM+EVT kernels
#            (check_evt), NHWC convolution+EVT kernels (check_conv, against the interpreter), batched ones (check_bmm),
#            visitor nodes (check_visitors: row kernels and GEMM kernels), epilogue functors (check_vops), row kernels
#            (check_rows), spmm row kernels (check_spmm: spmm / spmm_t with epilogues on random CSR), the fp8 kernels
#            (check_fp8: conversions, the recipe's row kernels and fp8 GEMMs), cuDNN attention (check_cudnn_sdpa);
#            KERNEL_CHECKS=check_evt,check_conv,... runs only those programs
#   graphs   every generated kernel of the graphs JIT-compiled (evtc prefetch), then `evtc run --device cuda --check`
#            (against the interpreter) over examples/*.evt, bench/graphs/*.evt, tests/gpu/graphs/*.evt,
#            tests/graphs/resnet_block_nhwc_bf16.evt (--fused: its CONV+EVT fprop, dgrad and wgrad kernels) and a
#            medium BERT layer whose attention runs on cuDNN: node by node, optimized, fused, and the optimized and
#            fused steps as CUDA graphs; tests/graphs/fp8_mlp.evt with --fp8 (node by node, fused, fused as a CUDA
#            graph); examples/mlp.evt and tests/graphs/tf32_odd_rows.evt with --tf32 --fused (TF32 GEMMs of layout NT,
#            1001 rows), also as CUDA graphs; the run-time index error (bench/graphs/bad_index.evt, tests/gpu/bad_coo_key.evt); the device-resident training loop
#            against --host-sgd (identical losses)
#   program  the program API on every graph (program_check.c: eager, CUDA graph, fused, fused CUDA graph), the
#            API example examples/c/train_step.c, and gcn's adjacency rewritten in place between runs of the fused
#            program, eager and replayed as a CUDA graph (adjacency_check.c: spmm_t's A^T is rebuilt every run)
#   ampere   the Ampere / Ada path (sm_8x) on this GPU, one command: `bash tests/gpu/run.sh ampere`. The kernel library
#            (build/ampere/libevt_fallback.so) and every generated kernel compiled as PTX for compute_80 only
#            (-gencode arch=compute_80,code=compute_80; evtc --arch compute_80), which the driver JIT-compiles for the
#            GPU present: CUTLASS 2.x GEMMs with Sm80 visitor trees, row kernels without programmatic dependent
#            launches. Then `evtc run --device cuda --check --fused --arch compute_80` (and with --cuda-graph, and node
#            by node) over the graphs group's list, and the row-kernel checks (check_rows, check_visitors' row kernels)
#            with their kernels built for compute_80 with PDL off, as the sm_8x emitter writes them, and the torch
#            group's models with options={"arch": "compute_80"} (mode evt_sm80). Not part of the default groups.
#   torch    torch.compile(backend="evt") on CUDA against eager PyTorch (torch_models_gpu.py, every model in the
#            modes evt, evt_cg, evt_cgs, evt_fp32, evt_all; torch_dropout_gpu.py; torch_distributed_gpu.py
#            (DDP and FSDP2 over NCCL) where there are 2 GPUs)
#   (The installed wheel on a GPU is tests/gpu/wheel_check.sh WHEEL: it needs a wheel built where CBC's headers are.)
# Needs an NVIDIA Hopper GPU (the kernels are sm_90a) and nvcc; without a GPU it exits 2 at once. Needs what
# scripts/setup.sh installs (CUTLASS 4.2 headers in .cutlass/ or at $CUTLASS_PATH, PyTorch), PyTorch with CUDA for
# the torch group, and cuDNN 9 (the toolkit's, or the nvidia-cudnn wheel PyTorch brings) for attention. Runs `make`
# first (only the CUDA parts where tests/gpu/prep.sh packed libevt built on a machine with CBC). Prints one line per
# check ("ok" / "FAIL") and last "N passed, N failed"; exit 0 only if none failed. Full logs under $OUT (default
# build/gpu-logs). Generated kernels are JIT-compiled once into the JIT cache ($EVT_CACHE_DIR/jit, docs/config.md):
# a second run starts from them. Benchmarks are in bench/, not here.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
ROOT=$PWD
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "tests/gpu/run.sh: no GPU here (nvidia-smi is missing or fails): nothing run" >&2
  exit 2
fi
groups=${*:-kernels graphs program torch}
for g in $groups; do
  case $g in kernels | graphs | program | torch | ampere) ;; *) echo "tests/gpu/run.sh: no group '$g' (kernels graphs program torch ampere)" >&2; exit 2 ;; esac
done
want() { [[ " $groups " == *" $1 "* ]]; }
# KERNEL_CHECKS=check_evt,check_conv,...: the kernels group builds and runs only these programs (default: all)
kwant() { [ -z "${KERNEL_CHECKS:-}" ] || [[ ",$KERNEL_CHECKS," == *",$1,"* ]]; }

OUT=${OUT:-$ROOT/build/gpu-logs}
B=$ROOT/build/gpu # the check programs and their kernels
mkdir -p "$OUT" "$B"
JOBS=$(nproc)
EVTC=$ROOT/build/evtc
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
export CUTLASS_PATH=${CUTLASS_PATH:-$ROOT/.cutlass/cutlass_library/source}
export EVT_KERNELS_DIR=$ROOT/kernels EVT_FALLBACK_LIB=$ROOT/build/libevt_fallback.so EVT_LIB=$ROOT/build/libevt.so
export EVT_JIT_JOBS=${EVT_JIT_JOBS:-$JOBS} PYTHONUNBUFFERED=1
NOCUTLASS=/nonexistent/no-cutlass # as CUTLASS_PATH: GEMM groups run node by node (cuBLAS), nothing to JIT-compile
# cuDNN: its headers for check_cudnn_sdpa; its libraries on the loader's path (kernels/fallback/cudnn_sdpa.cu loads
# libcudnn.so.9 by soname; its runtime-compiled engines need NVRTC): the nvidia-* wheels' lib/, the toolkit's lib64
WHEEL=$(python3 -c "import nvidia.cudnn,os;print(list(nvidia.cudnn.__path__)[0])" 2>/dev/null)
CUDNN_INC=""
for d in "$CUDA_HOME/include" /usr/local/cuda/include ${WHEEL:+"$WHEEL/include"}; do
  [ -f "$d/cudnn_graph.h" ] && { CUDNN_INC=$d; break; }
done
if [ -n "$WHEEL" ]; then
  for d in "$(dirname "$WHEEL")"/*/lib; do [ -d "$d" ] && LD_LIBRARY_PATH=$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}; done
fi
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$CUDA_HOME/lib64
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  nvcc --version | tail -1
  echo "cores $JOBS; CUTLASS_PATH=$CUTLASS_PATH; cuDNN headers ${CUDNN_INC:-none}; groups: $groups"
} >"$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

# ---- bookkeeping ------------------------------------------------------------------------------------------------
pass=0 fail=0
failed=()
record() { # NAME STATUS LOG
  if [ "$2" -eq 0 ]; then
    pass=$((pass + 1))
    echo "ok   $1"
  else
    fail=$((fail + 1))
    failed+=("$1")
    echo "FAIL $1 (status $2; log ${3#"$ROOT"/})"
  fi
}
# check NAME LOG CMD...: CMD (a program or a function of this script) with its output in $OUT/LOG.log, at most
# 30 minutes; passes on exit status 0
check() {
  local name=$1 log=$OUT/$2.log
  shift 2
  if declare -F "$1" >/dev/null; then
    "$@" >"$log" 2>&1
  else
    timeout -k 10 1800 "$@" >"$log" 2>&1
  fi
  record "$name" $? "$log"
}
# built NAME: the check program $B/NAME was built (else a failed check "build NAME")
built() { [ -x "$B/$1" ] || { record "build $1" 1 "$OUT/build_$1.log"; return 1; }; }

# ---- build ------------------------------------------------------------------------------------------------------
echo "== build: make, then the check programs"
CBC_LIBS="$(pkg-config --libs cbc 2>/dev/null) $(pkg-config --libs openblas 2>/dev/null || echo -lopenblas)"
TARGETS=all
if [ -f .gpuwork/hostbin.tgz ]; then # libevt and evtc built elsewhere (tests/gpu/prep.sh): only the CUDA parts here
  tar xzf .gpuwork/hostbin.tgz -C build && cp build/hostbin/evtc build/hostbin/libevt.so build/hostbin/libevt.a build/
  export LD_LIBRARY_PATH=$ROOT/build/hostbin/lib:$LD_LIBRARY_PATH
  # link what prep.sh packed (the libraries evtc itself loads), in CBC's dependency order
  CBC_LIBS="-L$ROOT/build/hostbin/lib"
  for l in CbcSolver Cbc Cgl OsiClp ClpSolver Clp Osi CoinUtils lapack blas openblas gfortran quadmath bz2 z; do
    [ -e "build/hostbin/lib/lib$l.so" ] && CBC_LIBS="$CBC_LIBS -l$l"
  done
  CBC_LIBS="$CBC_LIBS -lstdc++"
  TARGETS=cuda
fi
[ -d .cutlass/cutlass_library ] || [ ! -f .gpuwork/cutlass.tgz ] || tar xzf .gpuwork/cutlass.tgz
if ! make -j"$JOBS" $TARGETS >"$OUT/build.log" 2>&1 || [ ! -f build/libevt_fallback.so ]; then
  tail -20 "$OUT/build.log"
  record "make (libevt, evtc, libevt_fallback.so)" 1 "$OUT/build.log"
  echo "$pass passed, $fail failed"
  exit 1
fi
LIBS="$ROOT/build/libevt.a $CBC_LIBS -lm -lpthread -ldl"
NV="nvcc -std=c++17 -O2 -gencode=arch=compute_90a,code=sm_90a -Iinclude -Isrc -Ikernels"
CUT="-I$CUTLASS_PATH/include -I$CUTLASS_PATH/tools/util/include"
CC_CUDA="gcc -std=gnu11 -O2 -Werror=implicit-function-declaration -Iinclude -Isrc -Ikernels -I$CUDA_HOME/include"
CUDART="-L$CUDA_HOME/lib64 -lcudart -Wl,-rpath,$CUDA_HOME/lib64"
build_bg() { # NAME CMD...: builds $B/NAME in the background (log $OUT/build_NAME.log)
  local name=$1
  shift
  rm -f "$B/$name"
  ("$@" -o "$B/$name" >"$OUT/build_$name.log" 2>&1) &
}
if want kernels; then
  kwant check_evt && build_bg check_evt $NV tests/gpu/check_evt.cu $LIBS
  kwant check_conv && build_bg check_conv $NV tests/gpu/check_conv.cu $LIBS
  kwant check_bmm && build_bg check_bmm $NV tests/gpu/check_bmm.cu $LIBS -lcublas
  kwant check_visitors && build_bg check_visitors $NV tests/gpu/check_visitors.cu $LIBS
  kwant check_vops && build_bg check_vops $NV --expt-relaxed-constexpr $CUT tests/gpu/check_vops.cu $LIBS
  kwant check_rows && build_bg check_rows $NV tests/gpu/check_rows.cu $LIBS
  kwant check_spmm && build_bg check_spmm $NV tests/gpu/check_spmm.cu $LIBS
  kwant check_fp8 && build_bg check_fp8 $NV tests/gpu/check_fp8.cu $LIBS
  if ! kwant check_cudnn_sdpa; then
    :
  elif [ -n "$CUDNN_INC" ]; then
    build_bg check_cudnn_sdpa $NV -DEVT_HAVE_CUDNN -I"$CUDNN_INC" tests/gpu/check_cudnn_sdpa.cu \
      kernels/fallback/cudnn_sdpa.cu -ldl
  else
    echo "no cudnn_graph.h in $CUDA_HOME/include, /usr/local/cuda/include or the nvidia-cudnn wheel" >"$OUT/build_check_cudnn_sdpa.log"
  fi
fi
if want ampere; then # the row-kernel check programs (host code; their kernels are compiled below for compute_80)
  want kernels || { build_bg check_rows $NV tests/gpu/check_rows.cu $LIBS; build_bg check_visitors $NV tests/gpu/check_visitors.cu $LIBS
    build_bg check_spmm $NV tests/gpu/check_spmm.cu $LIBS; }
  AMPERE_LIB=$ROOT/build/ampere/libevt_fallback.so
  make -j"$JOBS" FALLBACK_SO="$AMPERE_LIB" CUDA_GENCODE="-gencode arch=compute_80,code=compute_80" "$AMPERE_LIB" \
    >"$OUT/build_ampere_lib.log" 2>&1 || record "make the compute_80 kernel library (build/ampere)" 1 "$OUT/build_ampere_lib.log"
fi
if want program; then
  build_bg program_check $CC_CUDA tests/gpu/program_check.c $LIBS $CUDART
  build_bg train_step $CC_CUDA examples/c/train_step.c $LIBS $CUDART
  build_bg adjacency_check $CC_CUDA tests/gpu/adjacency_check.c $LIBS $CUDART
fi
wait

# ---- kernels ----------------------------------------------------------------------------------------------------
# compile_dir DIR: DIR/*.cu into DIR/*.so, in parallel, with src/runtime/jit/jit.c's flags for kernels without CUTLASS
# (KGENCODE: the target; the ampere group's compute_80 PTX with the sm_8x row kernels' PDL off)
KGENCODE=${KGENCODE:--gencode=arch=compute_90a,code=sm_90a}
compile_dir() {
  ls "$1"/*.cu | sed 's/\.cu$//' | xargs -P "$JOBS" -I{} sh -c 'nvcc -std=c++17 --expt-relaxed-constexpr -O3 -DNDEBUG \
    '"$KGENCODE"' -Xcompiler -fPIC -Ikernels -shared -lcuda -o {}.so {}.cu >{}.log 2>&1 ||
    { echo "nvcc failed: {}.cu"; cat {}.log; exit 1; }'
}
emitted_check() { # PROGRAM: PROGRAM emit DIR, compile DIR, PROGRAM check DIR
  local k=$B/$1.kernels
  rm -rf "$k" && mkdir -p "$k"
  "$B/$1" emit "$k" && compile_dir "$k" && timeout -k 10 1800 "$B/$1" check "$k"
}
if want kernels; then
  echo "== kernels: generated kernels and cuDNN attention against their CPU references"
  kwant check_evt && built check_evt && check "check_evt: GEMM+EVT kernels vs the CPU reference" check_evt "$B/check_evt"
  kwant check_conv && built check_conv && check "check_conv: conv+EVT kernels (NHWC fprop) vs the interpreter" check_conv "$B/check_conv"
  kwant check_bmm && built check_bmm && check "check_bmm: batched GEMM+EVT kernels, three layouts" check_bmm "$B/check_bmm" --no-bench
  kwant check_vops && built check_vops && check "check_vops: epilogue compute functors vs evt_vop_apply3" check_vops "$B/check_vops"
  kwant check_rows && built check_rows && check "check_rows: row kernels vs evt_rspec_reference" check_rows emitted_check check_rows
  kwant check_spmm && built check_spmm && check "check_spmm: spmm row kernels vs evt_rspec_reference_csr" check_spmm emitted_check check_spmm
  kwant check_fp8 && built check_fp8 && check "check_fp8: fp8 conversions, row kernels and GEMMs vs src/ir/fp8.c" check_fp8 "$B/check_fp8"
  if kwant check_visitors && built check_visitors; then
    check "check_visitors: visitor nodes in row kernels" check_visitors_rows emitted_check check_visitors
    check "check_visitors gemm: visitor nodes in GEMM kernels" check_visitors_gemm "$B/check_visitors" gemm
  fi
  kwant check_cudnn_sdpa && built check_cudnn_sdpa && check "check_cudnn_sdpa: cuDNN attention fwd/bwd vs a double reference, CUDA-graph replay" \
    check_cudnn_sdpa "$B/check_cudnn_sdpa" --iters 3
fi

# ---- graphs -----------------------------------------------------------------------------------------------------
graphs=(examples/*.evt)
for f in bench/graphs/*.evt; do [ "$f" = bench/graphs/bad_index.evt ] || graphs+=("$f"); done
graphs+=(tests/gpu/graphs/*.evt)
graphs+=(tests/graphs/resnet_block_nhwc_bf16.evt) # channels-last: --fused runs its conv groups on CONV+EVT kernels
MEDIUM=$B/bert_layer_sdpa_medium_bf16.evt # attention with head size 64, on cuDNN
if want graphs || want program || want ampere; then
  if python3 examples/gen.py bert_layer_sdpa --dtype bf16 --batch 2 --seq 128 --hidden 256 --heads 4 --ffn 1024 \
    --vocab 1000 -o "$MEDIUM" >"$OUT/gen_medium.log" 2>&1; then
    graphs+=("$MEDIUM")
  else
    record "examples/gen.py bert_layer_sdpa (medium)" 1 "$OUT/gen_medium.log"
  fi
fi
logname() { basename "$1" .evt; }
evtc_check() { # GRAPH FLAGS...: evtc run --check passes and says "check: matched"
  local out
  out=$(timeout -k 10 1800 "$EVTC" run "$1" --device cuda --steps 3 --check "${@:2}" 2>&1)
  local rc=$?
  echo "$out"
  [ $rc -eq 0 ] && grep -q '^check: matched' <<<"$out"
}
cudnn_attention() { # GRAPH: as evtc_check, and no attention node fell back to the reference kernel
  local out
  out=$(evtc_check "$@")
  local rc=$?
  echo "$out"
  [ $rc -eq 0 ] && ! grep -q 'runs on the reference kernel' <<<"$out"
}
bad_index() { # the run-time index error names the node and exits 1
  timeout -k 10 600 "$EVTC" run bench/graphs/bad_index.evt --device cuda --steps 1 >"$B/bad_index.out" 2>&1
  local rc=$?
  cat "$B/bad_index.out"
  [ $rc -eq 1 ] && grep -q 'node %loss (cross_entropy): an index is out of range' "$B/bad_index.out"
}
bad_coo_key() { # a coo_perm / coo_rowptr key out of range: the run-time index error names the coo node, exits 1
  timeout -k 10 600 "$EVTC" run tests/gpu/bad_coo_key.evt --device cuda --steps 1 >"$B/bad_coo_key.out" 2>&1
  local rc=$?
  cat "$B/bad_coo_key.out"
  [ $rc -eq 1 ] && grep -Eq 'node %(perm|rowptr) \(coo_(perm|rowptr)\): an index is out of range' "$B/bad_coo_key.out"
}
sgd_loops() { # GRAPH FLAGS...: the device-resident loop's losses equal --host-sgd's to every bit
  local d h
  d=$(EVT_LOSS_DIGITS=17 timeout -k 10 1800 "$EVTC" run "$@" --device cuda --steps 8 --every 1 2>&1) || { echo "$d"; return 1; }
  h=$(EVT_LOSS_DIGITS=17 timeout -k 10 1800 "$EVTC" run "$@" --device cuda --steps 8 --every 1 --host-sgd 2>&1) || { echo "$h"; return 1; }
  printf '%s\n--- --host-sgd\n%s\n' "$d" "$h"
  local ld lh
  ld=$(grep -o '^step [0-9]* loss [^ ]*' <<<"$d")
  lh=$(grep -o '^step [0-9]* loss [^ ]*' <<<"$h")
  [ -n "$ld" ] && [ "$ld" = "$lh" ]
}
if want graphs; then
  echo "== graphs: evtc run --device cuda --check against the interpreter (${#graphs[@]} graphs)"
  check "evtc prefetch: every generated kernel of the graphs compiles" prefetch "$EVTC" prefetch "${graphs[@]}"
  for f in "${graphs[@]}"; do
    b=$(logname "$f")
    f_=${f#"$ROOT"/}
    check "$f_ node by node" "run_$b.node" evtc_check "$f"
    check "$f_ --opt" "run_$b.opt" evtc_check "$f" --opt
    check "$f_ --fused" "run_$b.fused" evtc_check "$f" --fused
    check "$f_ --opt --cuda-graph" "run_$b.opt_graph" evtc_check "$f" --opt --cuda-graph
    check "$f_ --fused --cuda-graph" "run_$b.fused_graph" evtc_check "$f" --fused --cuda-graph
  done
  fp8=tests/graphs/fp8_mlp.evt # the fp8 pass's step: generated fp8 GEMMs and row kernels, fp8 in the kernel library
  check "$fp8 --fp8 node by node" run_fp8_mlp.node evtc_check "$fp8" --fp8
  check "$fp8 --fp8 --fused" run_fp8_mlp.fused evtc_check "$fp8" --fp8 --fused
  check "$fp8 --fp8 --fused --cuda-graph" run_fp8_mlp.fused_graph evtc_check "$fp8" --fp8 --fused --cuda-graph
  # TF32 GEMM+EVT kernels (layout NT), also over 1001 rows
  for f in examples/mlp.evt tests/graphs/tf32_odd_rows.evt; do
    check "$f --tf32 --fused" "run_$(logname "$f").tf32_fused" evtc_check "$f" --tf32 --fused
    check "$f --tf32 --fused --cuda-graph" "run_$(logname "$f").tf32_fused_graph" evtc_check "$f" --tf32 --fused --cuda-graph
  done
  if [ -f "$MEDIUM" ]; then
    check "attention on cuDNN inside the runtime (medium BERT layer, fused)" attention_cudnn cudnn_attention "$MEDIUM" --fused
  fi
  check "bench/graphs/bad_index.evt: the run-time index error names the node, exit 1" bad_index bad_index
  check "tests/gpu/bad_coo_key.evt: a coo key out of range names its node, exit 1" bad_coo_key bad_coo_key
  sgd=("examples/mlp.evt" "examples/mlp.evt --cuda-graph" "bench/graphs/mlp_bf16.evt --fused" "bench/graphs/bert_layer_bf16.evt"
    "bench/graphs/bert_layer_bf16.evt --fused --cuda-graph" "tests/gpu/graphs/no_params.evt")
  for f in examples/*.evt; do [ "$f" = examples/mlp.evt ] || sgd+=("$f"); done
  for spec in "${sgd[@]}"; do
    check "$spec: device SGD loop == --host-sgd, every bit" "sgd_$(tr -c 'A-Za-z0-9_.\n' _ <<<"$spec")" sgd_loops $spec
  done
fi

# ---- ampere -----------------------------------------------------------------------------------------------------
ampere_check() { # GRAPH FLAGS...: evtc_check with the compute_80 kernel library and kernels
  EVT_FALLBACK_LIB=$AMPERE_LIB evtc_check "$@" --arch compute_80
}
ampere_emitted() { # PROGRAM: emitted_check with the row kernels as the sm_8x emitter writes them, PTX for compute_80
  KGENCODE="-gencode=arch=compute_80,code=compute_80 -DEVT_ROWS_PDL=0 -DEVT_ROWS_PDL_MAIN=0" \
    EVT_FALLBACK_LIB=$AMPERE_LIB emitted_check "$@"
}
# ---- torch models (the torch group; the ampere group's evt_sm80 mode) ------------------------------------------
MODELS=${TORCH_MODELS:-mlp,bert,vit,xmlcnn,convbn,gcn,gcn_edges,sdpa} # (TORCH_MODELS / TORCH_MODES: a subset)
MODES=${TORCH_MODES:-evt,evt_cg,evt_cgs,evt_fp32,evt_all}
torch_models() { # MODES NAME: one check per (model, mode) line of torch_models_gpu.py's JSON ($B/NAME.results)
  local modes=$1 json=$OUT/$2.jsonl
  rm -f "$json"
  # their GEMMs through cuBLAS (CUTLASS hidden): tiny shapes, each a CUTLASS compile; the fused GEMMs are the
  # graphs group's
  CUTLASS_PATH=$NOCUTLASS timeout -k 10 3600 python3 tests/gpu/torch_models_gpu.py "$MODELS" --modes "$modes" \
    --json "$json" >"$OUT/$2.log" 2>&1
  local rc=$?
  python3 - "$json" "$MODELS" "$modes" "$rc" <<'PY' >"$B/$2.results"
import json, os, sys
path, models, modes, rc = sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(","), sys.argv[4]
rows = {}
if os.path.exists(path):
    for line in open(path):
        if line.strip():
            r = json.loads(line)
            rows[(r["model"], r["mode"])] = r
for mode in modes:
    for m in models:
        if mode == "evt_all" and m not in ("sdpa", "convbn", "vit", "xmlcnn") or mode == "inductor":
            continue  # (inductor: the baseline's own disagreement, reported in the log, not a check)
        r = rows.get((m, mode))
        ok = bool(r and (r.get("matched") or r.get("within_bf16_noise")))
        why = "" if ok else (f"rel {r.get('rel')} at {r.get('worst')} {r.get('error', '')}" if r else f"no result (exit {rc})")
        print(f"{0 if ok else 1}\t{m} {mode}\t{why}")
PY
}
if want ampere; then
  echo "== ampere: the sm_8x path (compute_80 PTX, JIT-compiled by the driver) against the interpreter (${#graphs[@]} graphs)"
  check "evtc prefetch --arch compute_80: every generated kernel of the graphs compiles" ampere_prefetch \
    "$EVTC" prefetch --arch compute_80 "${graphs[@]}"
  built check_rows && check "check_rows (compute_80, no PDL): row kernels vs evt_rspec_reference" ampere_check_rows \
    ampere_emitted check_rows
  built check_visitors && check "check_visitors (compute_80, no PDL): visitor nodes in row kernels" ampere_check_visitors \
    ampere_emitted check_visitors
  built check_spmm && check "check_spmm (compute_80, no PDL): spmm row kernels vs evt_rspec_reference_csr" \
    ampere_check_spmm ampere_emitted check_spmm
  for f in "${graphs[@]}"; do
    b=$(logname "$f")
    f_=${f#"$ROOT"/}
    check "$f_ --arch compute_80 node by node" "ampere_$b.node" ampere_check "$f"
    check "$f_ --arch compute_80 --fused" "ampere_$b.fused" ampere_check "$f" --fused
    check "$f_ --arch compute_80 --fused --cuda-graph" "ampere_$b.fused_graph" ampere_check "$f" --fused --cuda-graph
  done
  # the torch backend's CI models with options={"arch": "compute_80"} and the compute_80 kernel library
  EVT_FALLBACK_LIB=$AMPERE_LIB torch_models evt_sm80 torch_models_sm80
  while IFS=$'\t' read -r st name why; do
    record "torch_models_gpu.py $name${why:+ ($why)}" "$st" "$OUT/torch_models_sm80.log"
  done <"$B/torch_models_sm80.results"
fi

# ---- program ----------------------------------------------------------------------------------------------------
if want program; then
  echo "== program: the program API (include/evt.h) against the interpreter"
  if built program_check; then
    for f in "${graphs[@]}"; do
      check "program_check ${f#"$ROOT"/}: node, node+graph, fused, fused+graph" "program_$(logname "$f")" \
        "$B/program_check" --steps 3 --reps 2 --modes all "$f"
    done
  fi
  built train_step && check "examples/c/train_step.c: evt_program_* with device SGD" train_step "$B/train_step"
  built adjacency_check && check "adjacency_check examples/gcn.evt: a CSR rewritten in place is followed (fused, CUDA graph)" \
    adjacency_check "$B/adjacency_check" examples/gcn.evt
fi

if want torch; then
  echo "== torch: torch.compile(backend=\"evt\") on CUDA against eager PyTorch"
  if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" >"$OUT/torch_cuda.log" 2>&1; then
    torch_models "$MODES" torch_models
    while IFS=$'\t' read -r st name why; do
      record "torch_models_gpu.py $name${why:+ ($why)}" "$st" "$OUT/torch_models.log"
    done <"$B/torch_models.results"
    check "torch_dropout_gpu.py: evt's dropout masks, 3 modes x bf16/f32, vs eager with the same mask" torch_dropout \
      python3 tests/gpu/torch_dropout_gpu.py
    # (two processes, one GPU each; tiny shapes: GEMMs through cuBLAS as in torch_models, nothing to JIT-compile)
    if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
      check "torch_distributed_gpu.py: DDP and FSDP2 on 2 GPUs (NCCL) vs eager on the full batch" torch_distributed \
        env CUTLASS_PATH=$NOCUTLASS python3 tests/gpu/torch_distributed_gpu.py --timeout 600
    else
      echo "skip torch_distributed_gpu.py (needs 2 GPUs)"
    fi
  else
    record "PyTorch with CUDA (needed by the torch group)" 1 "$OUT/torch_cuda.log"
  fi
fi

echo
if [ $fail -gt 0 ]; then
  echo "failed:"
  printf '  %s\n' "${failed[@]}"
fi
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
