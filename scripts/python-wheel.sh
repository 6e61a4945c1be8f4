#!/usr/bin/env bash
# Builds the `silt` Python wheel (maturin, abi3: one wheel for CPython >= 3.9) from python/
# and installs it into the project's venv (.deps/pyvenv, made by install-deps.sh).
# `--release` builds what `pip install ./python` builds (Cargo.toml's `wheel` profile: optimised,
# no debug information; benchmarks); the default is the dev profile the tests share.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv="$root/.deps/pyvenv"
profile=(--profile dev)
[ "${1:-}" = "--release" ] && profile=(--profile wheel)
rm -rf "$root/target/wheels"
(cd "$root/python" && "$venv/bin/maturin" build --quiet --locked "${profile[@]}" --interpreter "$venv/bin/python" -o "$root/target/wheels")
"$venv/bin/python" -m pip install -q --force-reinstall --no-deps "$root"/target/wheels/silt-*.whl
