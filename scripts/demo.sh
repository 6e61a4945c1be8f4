#!/usr/bin/env bash
# The main job: on a fresh machine, build Silt, start a real S3-compatible server (versitygw)
# with a small sample dataset, run `silt up` over it, read the data through the FUSE mount
# and print throughput and hit ratio. Everything it starts is stopped on exit.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
"$root/scripts/install-deps.sh" --main
cargo build --release --locked -p silt
silt="$root/target/release/silt"

work=$(mktemp -d /tmp/silt-demo.XXXXXX)
mnt="$work/mnt"; state="$work/state"; s3root="$work/s3"
mkdir -p "$mnt" "$state" "$s3root/sample"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
gw_pid=""; silt_pid=""
cleanup() {
  set +e
  [ -n "$silt_pid" ] && { "$silt" down --state-dir "$state" >/dev/null 2>&1; wait "$silt_pid" 2>/dev/null; }
  grep -q " $mnt " /proc/mounts && fusermount3 -uz "$mnt"
  [ -n "$gw_pid" ] && { kill "$gw_pid"; wait "$gw_pid" 2>/dev/null; }
  rm -rf "$work"
}
trap cleanup EXIT

# Sample dataset, written straight into the server's bucket directory before it starts:
# two 256 MiB "shards" and 2,000 ~110 KB "images" in 20 class directories.
echo "demo: generating the sample dataset" >&2
python3 - "$s3root/sample" <<'PY'
import os, random, sys
root = sys.argv[1]
rng = random.Random(42)
os.makedirs(f"{root}/shards", exist_ok=True)
for i in range(2):
    with open(f"{root}/shards/shard-{i:03}.tar", "wb") as f:
        for _ in range(256):
            f.write(rng.randbytes(1 << 20))
for c in range(20):
    d = f"{root}/images/class{c:02}"
    os.makedirs(d, exist_ok=True)
    for j in range(100):
        with open(f"{d}/img{j:04}.jpg", "wb") as f:
            f.write(rng.randbytes(int(rng.gauss(110_000, 30_000)) % 400_000 + 4_000))
PY

export AWS_ACCESS_KEY_ID=silt-demo AWS_SECRET_ACCESS_KEY=silt-demo-secret
"$root/.deps/bin/versitygw" --access "$AWS_ACCESS_KEY_ID" --secret "$AWS_SECRET_ACCESS_KEY" \
  --port "127.0.0.1:$port" posix "$s3root" >"$work/versitygw.log" 2>&1 &
gw_pid=$!
for _ in $(seq 100); do
  curl -s -o /dev/null "http://127.0.0.1:$port/" && break
  sleep 0.1
done

"$silt" up --mount "/data=s3://sample" --s3-endpoint "http://127.0.0.1:$port" \
  --mountpoint "$mnt" --state-dir "$state" 2>"$work/silt.log" &
silt_pid=$!
# silt prints "silt: serving" once the mount is up.
for _ in $(seq 600); do
  grep -q "^silt: serving" "$work/silt.log" && break
  kill -0 "$silt_pid" 2>/dev/null || { cat "$work/silt.log" >&2; exit 1; }
  sleep 0.1
done
grep -q "^silt: serving" "$work/silt.log" || { echo "demo: silt did not come up" >&2; cat "$work/silt.log" >&2; exit 1; }

rate() { python3 -c "import sys; b,t=float(sys.argv[1]),float(sys.argv[2]); print(f'{b/t/1e6:.0f} MB/s' if t>0 else '-')" "$@"; }
timed() { local s e; s=$(date +%s.%N); "$@" >/dev/null; e=$(date +%s.%N); python3 -c "print($e-$s)"; }

echo "demo: ls $mnt/data"; ls "$mnt/data"
big=$((2 * 256 * 1024 * 1024))
t=$(timed cat "$mnt"/data/shards/*)
echo "demo: large files, cold (from the S3 server): $(rate $big "$t")"
echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
t=$(timed cat "$mnt"/data/shards/*)
echo "demo: large files, warm (from Silt's cache):  $(rate $big "$t")"
t=$(timed find "$mnt/data/images" -type f -exec cat {} +)
n=$(find "$mnt/data/images" -type f | wc -l)
echo "demo: $n small files, cold: $(python3 -c "print(f'{$n/$t:.0f} files/s')")"
echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
t=$(timed find "$mnt/data/images" -type f -exec cat {} +)
echo "demo: $n small files, warm: $(python3 -c "print(f'{$n/$t:.0f} files/s')")"
python3 - "$mnt/data/images" <<'PY'
import os, sys
root = sys.argv[1]
classes = sorted(os.listdir(root))
n = sum(len(open(os.path.join(root, c, f), "rb").read()) > 0 for c in classes for f in os.listdir(os.path.join(root, c)))
print(f"demo: Python open() read {n} files in {len(classes)} classes")
try:
    import torchvision
    ds = torchvision.datasets.ImageFolder(root, loader=lambda p: open(p, "rb").read())
    print(f"demo: torchvision ImageFolder sees {len(ds)} samples in {len(ds.classes)} classes")
except ImportError:
    print("demo: torchvision not installed; ImageFolder check skipped")
PY
"$silt" report --state-dir "$state"
