#!/usr/bin/env bash
# Runs every test of the project: installs dependencies, then the whole Cargo test suite
# (unit tests, the under-store behaviour suite against a real S3 server, and integration
# tests on real FUSE mounts), then the Python SDK's tests. Needs root and /dev/fuse.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
"$root/scripts/install-deps.sh"
export SILT_VERSITYGW="$root/.deps/bin/versitygw"
# A fresh clone gains nothing from incremental state, and it costs gigabytes of disk.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
# The Helm chart, offline: lint, template over deploy/helm/silt/ci/*.yaml, schema validation.
"$root/deploy/helm/check.sh"
# The crate graph points one way and no crate declares a dependency it does not use.
python3 "$root/scripts/check-crates.py"
# Two cores: parallel test binaries would fight over them; tests inside a binary still run
# in parallel.
cargo test --workspace --locked -- --test-threads=4
python3 -m pytest -q bench/tests
# The Python SDK: its wheel (maturin, abi3) into the project's venv, then its tests against a
# real S3 server and real `silt` daemons and workers (the debug `silt` cargo test built).
"$root/scripts/python-wheel.sh"
"$root/.deps/pyvenv/bin/python" -m pytest -q -p no:cacheprovider python/tests
