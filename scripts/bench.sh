#!/usr/bin/env bash
# The benchmark suite in one command, on a fresh machine: installs what it needs (as the test
# command does), builds the release binaries, then runs bench/run with the given arguments
# (e.g. `--quick`, `--profile fast`, `--scenarios B1,B3`; see `bench/run --help`).
# Results land in bench/out/; everything else the run makes is removed when it ends.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
"$root/scripts/install-deps.sh"
export SILT_VERSITYGW="$root/.deps/bin/versitygw"
cargo build --release --locked -p silt --bin silt --example direct_read -p silt-bench --bin silt-bench
# The SDK scenario (and B4's sampler) import the release wheel from the project's venv.
"$root/scripts/python-wheel.sh" --release
exec python3 "$root/bench/run" "$@"
