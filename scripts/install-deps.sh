#!/usr/bin/env bash
# Installs what Silt's main job and tests need on a fresh Debian machine: FUSE 3 (fusermount3),
# and a real S3-compatible server (versitygw, built from the Go module proxy into .deps/bin).
# Idempotent: skips what is already there.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
deps="$root/.deps"
mkdir -p "$deps/bin"

need_apt=()
command -v fusermount3 >/dev/null 2>&1 || need_apt+=(fuse3)
command -v pkg-config >/dev/null 2>&1 || need_apt+=(pkg-config)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "install-deps: apt-get install ${need_apt[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

# Pillow lets the tests read images through the mount the way torchvision's ImageFolder does.
if ! python3 -c 'import PIL' >/dev/null 2>&1; then
  echo "install-deps: pip install pillow" >&2
  python3 -m pip install -q pillow
fi

VERSITYGW_VERSION=v1.8.0
if [ ! -x "$deps/bin/versitygw" ]; then
  command -v go >/dev/null 2>&1 || { echo "install-deps: Go is needed to build versitygw" >&2; exit 1; }
  echo "install-deps: building versitygw $VERSITYGW_VERSION (about two minutes)" >&2
  GOBIN="$deps/bin" GOFLAGS=-mod=mod go install "github.com/versity/versitygw/cmd/versitygw@$VERSITYGW_VERSION"
fi
[ -e /dev/fuse ] || { echo "install-deps: /dev/fuse is missing; FUSE mounts cannot work here" >&2; exit 1; }
echo "install-deps: ok (fusermount3: $(command -v fusermount3), versitygw: $deps/bin/versitygw)" >&2
