#!/usr/bin/env bash
# GPU window script: attention (sdpa and its backward) on cuDNN's fused flash attention inside evt's runtime
# (kernels/evt_fallback.cu attn_run -> kernels/evt_cudnn_sdpa.cu), checked against the CPU interpreter.
#   1. tests/gpu/graphs/attn_causal_bf16.evt (causal, 96 queries), bench/graphs/bert_layer_sdpa_bf16.evt (S=16, D=16)
#      and a medium BERT layer (gen.py bert_layer_sdpa --batch 2 --seq 128 --hidden 256 --heads 4: D=64): node by
#      node (`--opt --check`), fused (`--fused --check`) and fused as a CUDA graph (`--cuda-graph`), each with
#      EVT_CUDNN_SDPA_LOG=1 (the plans cuDNN built);
#   2. time, node by node (cuBLAS GEMMs, no JIT): a BERT-large-shaped layer (--batch 4 --seq 512 --hidden 1024
#      --heads 16 --ffn 4096 --vocab 8192) with attention on cuDNN, on cuDNN with the backward recomputing the
#      forward (EVT_CUDNN_ATTENTION_SAVE=0), and on the reference kernel (EVT_CUDNN_ATTENTION=0).
#   bash tests/gpu/w/attn.sh LOGFILE SECONDS     (repo root, on the H200; environment: tests/gpu/window.sh)
set -u
WINDOW_SECS=240
. "$(dirname "$0")/budget.sh"
echo "== attn.sh ($(date -u +%H:%M:%S), budget ${SECS}s)"
EVTC=${EVTC:-build/evtc}
# cuDNN: already loaded in a PyTorch process; here from the pip wheel's lib dir
cl=$(python3 -c "import nvidia.cudnn,os;print(os.path.join(list(nvidia.cudnn.__path__)[0],'lib'))" 2>/dev/null)
[ -n "$cl" ] && export LD_LIBRARY_PATH=$cl${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} && echo "cuDNN lib dir: $cl"
export EVT_CUDNN_SDPA_LOG=1
tmp=$(mktemp -d)
python3 examples/gen.py bert_layer_sdpa --dtype bf16 --batch 2 --seq 128 --hidden 256 --heads 4 --ffn 1024 --vocab 1000 -o "$tmp/medium.evt"
python3 examples/gen.py bert_layer_sdpa --dtype bf16 --batch 4 --seq 512 --hidden 1024 --heads 16 --ffn 4096 --vocab 8192 -o "$tmp/large.evt"
for g in tests/gpu/graphs/attn_causal_bf16.evt bench/graphs/bert_layer_sdpa_bf16.evt "$tmp/medium.evt"; do
  for mode in "--opt" "--fused" "--fused --cuda-graph"; do
    l=$(( $(left) - 5 )); [ "$l" -lt 20 ] && { echo "-- $g $mode skipped"; continue; }
    echo "-- [$(date -u +%H:%M:%S)] $g $mode --check"
    stats=; [ "$mode" != --opt ] && stats=--stats
    timeout -k 5 "$l" "$EVTC" run "$g" --device cuda $mode --check $stats --steps 2 > "$tmp/run.log" 2>&1
    echo "exit $?"
    echo "attention plans cuDNN built: $(grep -c 'graph A\|graph B' "$tmp/run.log"); on the reference kernel: $(grep -c 'runs on the reference kernel' "$tmp/run.log")"
    grep -E '^\[evt-cudnn-sdpa\]|reference kernel' "$tmp/run.log" | head -6
    grep -v "^\[evt-jit\] [0-9]*/" "$tmp/run.log" | grep -E "^(step|done|check|stats)" | tail -6
  done
done
for v in EVT_CUDNN_ATTENTION=1 EVT_CUDNN_ATTENTION_SAVE=0 EVT_CUDNN_ATTENTION=0; do
  l=$(( $(left) - 5 )); [ "$l" -lt 20 ] && { echo "-- large $v skipped"; continue; }
  echo "-- [$(date -u +%H:%M:%S)] large layer, node by node, $v"
  env $v timeout -k 5 "$l" "$EVTC" run "$tmp/large.evt" --device cuda --opt --steps 4 2>&1 | tail -4
done
