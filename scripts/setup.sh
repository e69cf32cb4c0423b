#!/usr/bin/env bash
# Installs everything evt needs to build and test, from Debian and PyPI. Idempotent: run it as often as
# you like. Usage: bash scripts/setup.sh
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)

need_apt=""
for pkg in build-essential pkg-config coinor-libcbc-dev graphviz clang; do
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
echo "setup: ok"
