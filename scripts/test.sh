#!/usr/bin/env bash
# Runs every test of the project: installs dependencies, then the whole Cargo test suite
# (unit tests, the under-store behaviour suite against a real S3 server, and integration
# tests on real FUSE mounts). Needs root and /dev/fuse.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
"$root/scripts/install-deps.sh"
export SILT_VERSITYGW="$root/.deps/bin/versitygw"
# Two cores: parallel test binaries would fight over them; tests inside a binary still run
# in parallel.
cargo test --workspace --locked -- --test-threads=4
python3 -m pytest -q bench/tests
