#!/usr/bin/env bash
# Runs every test suite and ends with one line "N passed, N failed".
#   bash tests/run.sh [BUILD_DIR] [--c-only]
# Suites: C unit tests (BUILD/unit_tests), golden IR tests (tests/golden/*.evt), pytest (tests/python), and 30 s
# of the parser fuzzer (tests/fuzz; when clang has libFuzzer; not with --c-only).
set -u
build=${1:-build}
c_only=0
[ "${2:-}" = "--c-only" ] && c_only=1
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
total_pass=0
total_fail=0
log=$(mktemp)

count() { # $1: suite name; reads the suite's output in $log, adds its "N passed, N failed" numbers
  local p f
  p=$(grep -Eo '[0-9]+ passed' "$log" | tail -1 | grep -Eo '[0-9]+')
  f=$(grep -Eo '[0-9]+ failed' "$log" | tail -1 | grep -Eo '[0-9]+')
  p=${p:-0}; f=${f:-0}
  if [ "$2" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; echo "$1: exited with status $2"; fi
  total_pass=$((total_pass + p)); total_fail=$((total_fail + f))
}

echo "== C unit tests"
"$build/unit_tests" >"$log" 2>&1; rc=$?
grep -v '^ok  ' "$log"
count unit $rc

echo "== golden tests"
EVTC="$build/evtc" python3 tests/golden/run.py tests/golden >"$log" 2>&1; rc=$?
grep -v '^ok  ' "$log"
count golden $rc

if [ $c_only -eq 0 ] && [ -d tests/python ]; then
  echo "== pytest"
  EVTC="$here/$build/evtc" EVT_LIB="$here/$build/libevt.so" python3 -m pytest -q -p no:cacheprovider tests/python >"$log" 2>&1; rc=$?
  [ $rc -eq 5 ] && rc=0  # no tests collected
  tail -30 "$log"
  count pytest $rc
fi
# The parser fuzzer (tests/fuzz) for 30 s on a copy of the corpus, one test; skipped without clang's libFuzzer.
fuzz_available() {
  command -v clang >/dev/null 2>&1 || return 1
  printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; (void)n; return 0; }\n' |
    clang -x c -fsanitize=fuzzer -o "$1/probe" - >/dev/null 2>&1
}
if [ $c_only -eq 0 ]; then
  echo "== fuzz (parser, 30 s)"
  work=$(mktemp -d)
  if ! fuzz_available "$work"; then
    echo "fuzz: skipped (no clang with libFuzzer)"
  else
    make -s BUILD="$build" fuzz >"$work/out" 2>&1 &&
      "$build/fuzz_parse" -max_total_time=30 -dict=tests/fuzz/evt.dict -artifact_prefix="$build/fuzz-" \
        "$work" tests/fuzz/corpus >>"$work/out" 2>&1
    rc=$?
    if [ $rc -eq 0 ]; then echo "fuzz: 1 passed, 0 failed" >"$log"; else tail -40 "$work/out"; echo "fuzz: 0 passed, 1 failed" >"$log"; fi
    grep -E '^Done [0-9]+ runs' "$work/out"
    cat "$log"
    count fuzz 0
  fi
  rm -rf "$work"
fi
rm -f "$log"
echo "$total_pass passed, $total_fail failed"
[ "$total_fail" -eq 0 ]
