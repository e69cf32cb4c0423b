#!/usr/bin/env bash
# Installs everything evt needs to build and test, from Debian and PyPI. Idempotent: run it as often as
# you like. Usage: bash scripts/setup.sh
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)

need_apt=""
for pkg in build-essential pkg-config coinor-libcbc-dev libopenblas-dev graphviz clang; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_apt="$need_apt $pkg"
done
if [ -n "$need_apt" ]; then
  echo "setup: apt-get install$need_apt"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq $need_apt >/dev/null
fi

# PyTorch (CPU wheel; same minor version as the H200 machine) and pytest for the numerics tests.
if ! python3 -c "import torch, pytest, numpy" >/dev/null 2>&1; then
  echo "setup: pip install -r requirements-dev.txt"
  python3 -m pip install -q -r "$here/requirements-dev.txt"
fi
# The model libraries of the model-coverage tests, at their exact pins: installed when any pin is missing or
# at another version (their dependencies come from their own requirements).
if ! python3 - "$here/requirements-models.txt" <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version
pins = [l.split("#")[0].strip() for l in open(sys.argv[1])]
for name, want in (p.split("==") for p in pins if p):
    try:
        if version(name) != want:
            sys.exit(1)
    except PackageNotFoundError:
        sys.exit(1)
PY
then
  echo "setup: pip install -r requirements-models.txt"
  python3 -m pip install -q -r "$here/requirements-models.txt"
fi
# CUTLASS 4.2 headers for the generated-kernel checks (only include/ and tools/util/include, ~28 MB) into
# the git-ignored .cutlass/; the H200 runs carry the same folder. Skipped when already there.
if [ ! -f "$here/.cutlass/cutlass_library/source/include/cutlass/cutlass.h" ]; then
  echo "setup: CUTLASS headers (nvidia-cutlass==4.2.0.0) into .cutlass/"
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps nvidia-cutlass==4.2.0.0 -d "$tmp"
  python3 - "$tmp" "$here/.cutlass" <<'PY'
import glob, sys, zipfile
whl = glob.glob(sys.argv[1] + "/nvidia_cutlass-*.whl")[0]
with zipfile.ZipFile(whl) as z:
    names = [n for n in z.namelist() if n.startswith(("cutlass_library/source/include/",
                                                       "cutlass_library/source/tools/util/include/"))]
    z.extractall(sys.argv[2], names)
PY
  rm -rf "$tmp"
fi
echo "setup: ok"
