#!/usr/bin/env bash
# The SDK's DataLoader tests with PyTorch itself (issue 42): the mode x start-method matrix in
# python/tests/test_torch_helpers.py runs a real torch.utils.data.DataLoader where torch
# imports, and the multiprocessing equivalent everywhere. torch from PyPI is large (about
# 5 GB with its CUDA libraries, ~2 min to install here), so it is not in the test command: this
# installs it once into .deps/torchvenv, which also sees the project venv's packages (the
# SDK wheel, fsspec, pyarrow, pytest), and runs the SDK's torch tests there.
#
#   scripts/test-torch.sh [pytest args...]     (after scripts/install-deps.sh)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
deps="$root/.deps/pyvenv"
venv="$root/.deps/torchvenv"
TORCH_VERSION=${SILT_TORCH_VERSION:-2.15.0}
[ -x "$deps/bin/python" ] || { echo "test-torch: run scripts/install-deps.sh first" >&2; exit 1; }
if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  # The interpreter the project venv was made from, so both venvs' packages fit.
  "$("$deps/bin/python" -c 'import sys; print(sys._base_executable)')" -m venv "$venv"
  echo "test-torch: installing torch $TORCH_VERSION into $venv (large: a few minutes)" >&2
  "$venv/bin/python" -m pip install --progress-bar on "torch==$TORCH_VERSION" numpy
fi
# The project venv's packages, after torch's own.
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
deps_site=$("$deps/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$deps_site" > "$site/silt-deps.pth"
"$root/scripts/python-wheel.sh"
cd "$root/python/tests"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider test_torch_helpers.py "$@"
