#!/usr/bin/env bash
# The wheel as a user installs it, on a GPU machine: a fresh virtual environment outside the repository (the
# machine's PyTorch visible through a .pth file: the GPU machines cannot download it), the wheel installed with pip,
# no EVT_* variable, CUTLASS hidden (GEMMs on cuBLAS: nothing slow to JIT), then tests/gpu/wheel_train.py.
#   bash tests/gpu/wheel_check.sh WHEEL [SECONDS]    (WHEEL: from `pip wheel ./python -w DIR` on a machine with CBC)
set -uo pipefail
wheel=$(realpath "$1") || exit 2
here=$(cd "$(dirname "$0")" && pwd)
venv=$(mktemp -d)/venv
python3 -m venv --without-pip "$venv" || exit 2
python3 -m pip --python "$venv/bin/python" install -q --no-deps --no-index "$wheel" || exit 2
python3 -c "import site; print(site.getsitepackages()[0])" \
  >"$("$venv/bin/python" -c 'import site; print(site.getsitepackages()[0])')/machine_packages.pth"
cd "$(dirname "$venv")" && cp "$here/wheel_train.py" .
env -u EVT_KERNELS_DIR -u EVT_FALLBACK_LIB -u EVT_LIB -u EVT_CACHE_DIR -u PYTHONPATH CUTLASS_PATH=/nonexistent \
  timeout "${2:-120}" "$venv/bin/python" wheel_train.py
