#!/usr/bin/env bash
# Builds Silt's container image with no base image and no registry: assembles the root file
# system (deploy/image/rootfs.sh) in a temporary build context, then builds
# deploy/Containerfile (FROM scratch) with a container engine.
#
# Usage: deploy/image/build.sh [--silt PATH] [--tag TAG] [--engine podman|docker|buildah]
#   --silt PATH   binary to ship (default: target/release/silt, built with cargo when missing)
#   --tag TAG     image name (default: localhost/silt:VERSION, the workspace version)
#   --engine CMD  podman (default), docker or buildah: anything with `build -f FILE -t TAG DIR`
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
silt=
engine=podman
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -1)
tag="localhost/silt:$version"
while [ $# -gt 0 ]; do
  case "$1" in
    --silt) silt=$2; shift 2 ;;
    --tag) tag=$2; shift 2 ;;
    --engine) engine=$2; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ -z "$silt" ]; then
  silt="$root/target/release/silt"
  if [ ! -x "$silt" ]; then
    echo "build: cargo build --release -p silt" >&2
    (cd "$root" && cargo build --release --locked -p silt)
  fi
fi
command -v "$engine" >/dev/null 2>&1 || { echo "build: $engine is not installed" >&2; exit 1; }

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
"$root/deploy/image/rootfs.sh" --silt "$silt" "$ctx/rootfs.tar"
"$engine" build -f "$root/deploy/Containerfile" --build-arg "VERSION=$version" -t "$tag" "$ctx"
echo "build: $tag" >&2
