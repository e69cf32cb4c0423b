#!/usr/bin/env bash
# GPU window script: one end-to-end workload under several environments, side by side (an A/B of opt-in
# switches such as EVT_LONG_K_UNFUSED=1 or EVT_GEMM_ROW_SUMS=0).
#   AB_WORKLOAD=mlp AB_SCALE=1 AB_MODES=evt_cg AB_VARIANTS="|EVT_LONG_K_UNFUSED=1|EVT_GEMM_ROW_SUMS=0" AB_REPEAT=2 \
#   AB_REF=inductor bash tests/gpu/w/ab.sh LOGFILE SECONDS     (repo root, on the H200; tests/gpu/window.sh env)
# AB_ARGS: more bench/e2e/run.py arguments for every run (e.g. --dropout).
# AB_VARIANTS: '|'-separated; each variant is space-separated VAR=value pairs ('' = the defaults). Every round
# (AB_REPEAT, default 2) runs each variant once, in order, as `bench/e2e/run.py --quick --no-profile` with
# AB_MODES (default evt_cg); AB_REF (default none) adds those modes (e.g. inductor) to the defaults' run of the
# first round only. Gradients are checked against eager when AB_MODES holds eager. With E2E_STEP_DETAIL=1 the table
# also has each step's GPU time with the host's lead hidden and after an idle pause (bench/e2e/run.py). The log ends with a table of
# ms/step per variant and round read from the runs' E2E_JSON lines (the lines themselves are kept whole).
set -u
WINDOW_SECS=240
. "$(dirname "$0")/budget.sh"
W=${AB_WORKLOAD:-mlp}
SC=${AB_SCALE:-1}
MODES=${AB_MODES:-evt_cg}
REF=${AB_REF:-}
ROUNDS=${AB_REPEAT:-2}
IFS='|' read -r -a VARS <<<"${AB_VARIANTS:-|}"
[ "${#VARS[@]}" -eq 0 ] && VARS=("")
echo "== ab.sh: $W x$SC ${AB_ARGS:-} modes $MODES, ${#VARS[@]} variant(s) x $ROUNDS round(s) ($(date -u +%H:%M:%S), budget ${SECS}s)"
export EVT_CACHE_DIR=${EVT_CACHE_DIR:-/tmp/evt-torchgpu-cache} PYTHONUNBUFFERED=1
J=$(mktemp /tmp/ab.XXXXXX.jsonl)
for r in $(seq 1 "$ROUNDS"); do
  for i in "${!VARS[@]}"; do
    v=${VARS[$i]}
    l=$(( $(left) - 5 ))
    [ "$l" -lt 25 ] && { echo "-- round $r variant '$v' skipped: ${l}s left"; continue; }
    m=$MODES
    [ "$r" = 1 ] && [ "$i" = 0 ] && [ -n "$REF" ] && m="$MODES,$REF"
    echo "-- [$(date -u +%H:%M:%S)] round $r variant '${v:-defaults}' modes $m (timeout ${l}s)"
    # shellcheck disable=SC2086  # the variant is a list of VAR=value words
    env $v timeout -k 5 "$l" python3 bench/e2e/run.py --quick --no-profile --workloads "$W" --scale "$SC" \
      --modes "$m" --timeout "$l" --out /tmp --tag "ab$r$i" ${AB_ARGS:-} 2>&1 | grep -v "^\[evt-jit\] [0-9]*/" |
      while IFS= read -r line; do
        echo "$line"
        case "$line" in E2E_JSON*) printf '%s\t%s\t%s\n' "$r" "${v:-defaults}" "${line#E2E_JSON }" >>"$J" ;; esac
      done
  done
done
echo
echo "### A/B summary: $W x$SC ($(date -u +%H:%M) UTC; ms/step, median of 5 timed steps; grad rel vs eager when run)"
python3 - "$J" <<'EOF'
import json, sys
print("| round | variant | mode | ms/step | GPU ms (host lead hidden) | after idle | grad rel |")
print("|---|---|---|---:|---:|---:|---|")
for ln in open(sys.argv[1]):
    r, v, js = ln.rstrip("\n").split("\t", 2)
    try:
        res = json.loads(js)
    except ValueError:
        print(f"| {r} | {v} | (unreadable result) | | |")
        continue
    for row in res.get("rows", []):
        ms = row.get("ms")
        g = row.get("grad_rel")
        print(f"| {r} | {v} | {row.get('mode')} | {ms if ms is not None else row.get('status', '-')} | "
              f"{row.get('gpu_ms', '-')} | {row.get('cool_ms', '-')} | "
              f"{'%.1e' % g if isinstance(g, (int, float)) else '-'} |")
EOF
rm -f "$J"
echo "== ab.sh done at +$(( $(date +%s) - start ))s"
