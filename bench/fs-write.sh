#!/usr/bin/env bash
# Commit cost of writes through a mount to a file:// store (write-type through), for binaries
# side by side, alternating: N rounds of, per binary, a fresh `silt up` over an empty local
# directory, 400 small files written one after another (echo > file: each close commits one
# file), then 8 files of 64 MiB written at once. Prints files/s and GiB/s per round. Needs root,
# /dev/fuse; the 64 MiB come from /dev/urandom once, into a scratch file.
#
#   bench/fs-write.sh [--rounds N] BINARY...      # e.g. /tmp/silt-old target/release/silt
set -euo pipefail
ROUNDS=2
if [ "${1:-}" = --rounds ]; then ROUNDS=$2; shift 2; fi
[ $# -ge 1 ] || { echo "usage: bench/fs-write.sh [--rounds N] BINARY..." >&2; exit 2; }
base=$(mktemp -d /var/tmp/silt-fs-write.XXXXXX)
mp=$base/mnt pid=
cleanup() {
    [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
    fusermount3 -uz "$mp" 2>/dev/null || true
    rm -rf "$base"
}
trap cleanup EXIT
mkdir -p "$mp"
head -c 64M /dev/urandom > "$base/src"
for round in $(seq "$ROUNDS"); do
    for bin in "$@"; do
        st=$base/state store=$base/store
        rm -rf "$st" "$store"; mkdir -p "$st" "$store"
        "$bin" up --mount /d=file://"$store" --mountpoint "$mp" --state-dir "$st" \
            --write-type through > "$base/log" 2>&1 &
        pid=$!
        for _ in $(seq 300); do grep -q serving "$base/log" && break; sleep 0.1; done
        grep -q serving "$base/log" || { cat "$base/log" >&2; exit 1; }
        t0=$(date +%s.%N)
        for i in $(seq 400); do echo "hello $i" > "$mp/d/small$i"; done
        t1=$(date +%s.%N)
        pids=
        for i in $(seq 8); do cat "$base/src" > "$mp/d/big$i" & pids="$pids $!"; done
        wait $pids
        t2=$(date +%s.%N)
        n=$(ls "$store" | wc -l)
        [ "$n" = 408 ] || { echo "the store holds $n files, not 408" >&2; exit 1; }
        python3 -c "print(f'round $round $bin: {400/($t1-$t0):.0f} small files/s, 8 x 64 MiB at {8*64/1024/($t2-$t1):.2f} GiB/s')"
        kill "$pid"; wait "$pid" 2>/dev/null || true; pid=
        fusermount3 -uz "$mp" 2>/dev/null || true
    done
done
