#!/usr/bin/env bash
# Runs every test suite and ends with one line "N passed, N failed".
#   bash tests/run.sh [BUILD_DIR] [--c-only]
# Suites: C unit tests (BUILD/unit_tests), golden IR tests (tests/golden/*.evt), pytest (tests/python).
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
rm -f "$log"
echo "$total_pass passed, $total_fail failed"
[ "$total_fail" -eq 0 ]
