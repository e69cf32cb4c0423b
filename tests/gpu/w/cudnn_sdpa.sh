#!/usr/bin/env bash
# GPU window script of helper "cudnn_sdpa" (see tests/gpu/window.sh): attention forward + backward through cuDNN's
# fused flash-attention engines, driven by the cuDNN v9 backend graph API (kernels/evt_cudnn_sdpa.cu).
# Usage (device machine, repo root): bash tests/gpu/w/cudnn_sdpa.sh LOGFILE SECONDS
# 1. Says where cuDNN is: every cudnn_graph.h and libcudnn.so* on the machine, the nvidia-cudnn pip wheel, the
#    cuDNN torch loads. Picks the headers (EVT_CUDNN_INCLUDE, $CUDA_HOME/include, /usr/local/cuda/include, the
#    wheel's include/) and the library (EVT_CUDNN_LIB, the wheel's lib/libcudnn.so.9, the toolkit's).
# 2. Builds tests/gpu/check_cudnn_sdpa.cu + kernels/evt_cudnn_sdpa.cu with nvcc (sm_90a) and runs it with
#    EVT_CUDNN_SDPA_LOG=1 (each plan: graph variant, engine, workspace): every case against a double reference on
#    the GPU, fwd/bwd times (BERT-large TFLOP/s), CUDA-graph replay; one table, SUMMARY line.
# 3. If it failed and time is left: the first case again with cuDNN's own log (CUDNN_LOGLEVEL_DBG=2), which
#    names the pattern check that refused the graph; then every case with graph variant B forced.
# 4. Whether $EVT_FALLBACK_LIB (build/libevt_fallback.so from `make cuda`; built into /tmp when missing and time
#    allows) has the module, built with the headers, and no link-time dependency on libcudnn.
log=${1:?LOGFILE}; secs=${2:-240}
t0=$SECONDS
exec >>"$log" 2>&1
left() { echo $((secs - (SECONDS - t0))); }
upto() { local t=$(( $(left) - $1 )); [ $t -lt 10 ] && t=10; echo $t; } # seconds for a step, leaving $1
echo "=== cudnn_sdpa.sh: $(date -u +%H:%M:%S) budget ${secs}s"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
echo "CUDA_HOME=$CUDA_HOME ($(nvcc --version | tail -1))"

echo "--- cudnn_graph.h and libcudnn.so* on this machine"
timeout 30 find / \( -path /proc -o -path /sys -o -path /dev \) -prune -o \( -name 'cudnn_graph.h' -o -name 'libcudnn.so*' \) -print 2>/dev/null | head -20
WHEEL=$(python3 -c "import nvidia.cudnn,os;print(list(nvidia.cudnn.__path__)[0])" 2>/dev/null)
echo "nvidia.cudnn wheel: ${WHEEL:-none}"
timeout 60 python3 -c "import torch;print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version())" 2>&1 | tail -1

INC=""
for d in ${EVT_CUDNN_INCLUDE:-} "$CUDA_HOME/include" /usr/local/cuda/include ${WHEEL:+"$WHEEL/include"}; do
  [ -f "$d/cudnn_graph.h" ] && { INC=$d; break; }
done
LIB=${EVT_CUDNN_LIB:-}
if [ -z "$LIB" ]; then
  for f in ${WHEEL:+"$WHEEL/lib/libcudnn.so.9"} "$CUDA_HOME/lib64/libcudnn.so.9" /usr/lib/x86_64-linux-gnu/libcudnn.so.9; do
    [ -f "$f" ] && { LIB=$f; break; }
  done
fi
if [ -z "$INC" ]; then
  echo "=== SUMMARY cudnn_sdpa: no cudnn_graph.h found (set EVT_CUDNN_INCLUDE): nothing built"
  exit 1
fi
hv=$(awk '/define CUDNN_MAJOR/{a=$3}/define CUDNN_MINOR/{b=$3}/define CUDNN_PATCHLEVEL/{c=$3}END{print a"."b"."c}' "$INC/cudnn_version.h")
echo "headers: $INC (cuDNN $hv); library: ${LIB:-libcudnn.so.9 from the loader path}"
# the library's own directory, the CUDA wheels' lib dirs (NVRTC for the runtime-compiled engines), the toolkit
LDP=""
[ -n "$LIB" ] && LDP=$(dirname "$LIB")
if [ -n "$WHEEL" ]; then
  for d in "$(dirname "$WHEEL")"/*/lib; do [ -d "$d" ] && LDP=$LDP:$d; done
fi
LDP=$LDP:$CUDA_HOME/lib64
export LD_LIBRARY_PATH=$LDP${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
[ -n "$LIB" ] && export EVT_CUDNN_LIB=$LIB

B=/tmp/evt-cudnn-sdpa
mkdir -p "$B"
if ! nvcc -std=c++17 -O2 -gencode=arch=compute_90a,code=sm_90a -Xcompiler -Wall,-Wextra -Ikernels -DEVT_HAVE_CUDNN \
  -I"$INC" tests/gpu/check_cudnn_sdpa.cu kernels/evt_cudnn_sdpa.cu -ldl -o "$B/check_cudnn_sdpa"; then
  echo "=== SUMMARY cudnn_sdpa: check_cudnn_sdpa build FAILED"
  exit 1
fi
echo "built at $((SECONDS - t0)) s; $(left) s left"

EVT_CUDNN_SDPA_LOG=1 timeout -k 5 "$(upto 60)" "$B/check_cudnn_sdpa"
rc=$?
[ $rc -eq 124 ] && echo "NOTE: check_cudnn_sdpa was cut by the budget (each plan is compiled by cuDNN's NVRTC once, ~1 s)"
echo "check_cudnn_sdpa rc $rc at $((SECONDS - t0)) s"

if [ $rc -ne 0 ] && [ "$(left)" -gt 40 ]; then
  echo "--- the first case again with cuDNN's log (CUDNN_LOGLEVEL_DBG=2), last 150 lines"
  CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG=stderr EVT_CUDNN_SDPA_LOG=1 timeout "$(upto 60)" \
    "$B/check_cudnn_sdpa" --only 128x128 --iters 2 2>&1 | tail -150
fi
if [ $rc -ne 0 ] && [ "$(left)" -gt 60 ]; then
  echo "--- every case again with graph variant B forced (EVT_CUDNN_SDPA_VARIANT=B), 5 timed runs"
  EVT_CUDNN_SDPA_VARIANT=B EVT_CUDNN_SDPA_LOG=1 timeout "$(upto 20)" "$B/check_cudnn_sdpa" --iters 5 2>&1 | tail -40
fi

FB=${EVT_FALLBACK_LIB:-$PWD/build/libevt_fallback.so}
if [ ! -f "$FB" ] && [ "$(left)" -gt 100 ]; then
  echo "--- no $FB: make cuda BUILD=$B/fb (checks the Makefile's cuDNN header lookup here)"
  timeout "$(upto 15)" make -s cuda BUILD="$B/fb" 2>&1 | tail -20
  FB=$B/fb/libevt_fallback.so
fi
if [ -f "$FB" ]; then
  echo "--- $FB: symbols, link-time dependencies, which cuDNN it loads"
  nm -D "$FB" | grep -c ' T evt_cudnn_sdpa_' | sed 's/^/exported evt_cudnn_sdpa_* symbols: /'
  ldd "$FB" | grep -i cudnn || echo "no libcudnn among its link-time dependencies (good)"
  timeout 60 python3 - "$FB" <<'EOF' 2>&1 | tail -2
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
lib.evt_cudnn_sdpa_library.restype = ctypes.c_long
buf = ctypes.create_string_buffer(1024)
print("libevt_fallback.so evt_cudnn_sdpa_library():", lib.evt_cudnn_sdpa_library(buf, 1024), buf.value.decode())
EOF
fi
echo "=== SUMMARY cudnn_sdpa: check_cudnn_sdpa rc $rc ($( [ $rc -eq 0 ] && echo 'all matched' || echo 'failures, unsupported required shapes or timeout: see above')), $((SECONDS - t0)) s"
exit $rc
