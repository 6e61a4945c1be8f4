#!/usr/bin/env bash
# Assembles the root file system of Silt's container image from this machine's own files, so
# that the image needs no base image and no registry (deploy/Containerfile is FROM scratch):
#   /usr/bin/silt          the binary given (debug sections stripped unless --no-strip)
#   /usr/bin/fusermount3   FUSE's mount helper (used when a direct mount(2) is refused)
#   the shared libraries both load, at the paths ldd reports (the dynamic loader included)
#   /etc/passwd, /etc/group, /etc/nsswitch.conf   root and nobody, files then DNS
#   /etc/ssl/certs/ca-certificates.crt            the system's CA bundle (S3 over HTTPS)
#   /tmp, /var/lib/silt, /mnt/silt, /root         empty directories silt uses by default
# and writes them as one tarball (owner root, sorted, fixed mtime).
#
# Usage: deploy/image/rootfs.sh [--silt PATH] [--no-strip] OUT.tar
#   --silt PATH   the binary to ship (default: target/release/silt)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
silt="$root/target/release/silt"
strip=1
out=
while [ $# -gt 0 ]; do
  case "$1" in
    --silt) silt=$2; shift 2 ;;
    --no-strip) strip=0; shift ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "rootfs: unknown option $1" >&2; exit 2 ;;
    *) out=$1; shift ;;
  esac
done
[ -n "$out" ] || { echo "rootfs: usage: $0 [--silt PATH] [--no-strip] OUT.tar" >&2; exit 2; }
[ -x "$silt" ] || { echo "rootfs: $silt is not an executable (cargo build --release -p silt)" >&2; exit 1; }
fusermount=$(command -v fusermount3 || true)
[ -n "$fusermount" ] || { echo "rootfs: fusermount3 is missing (apt-get install fuse3)" >&2; exit 1; }
ca=/etc/ssl/certs/ca-certificates.crt
[ -s "$ca" ] || { echo "rootfs: $ca is missing (apt-get install ca-certificates)" >&2; exit 1; }

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fs="$dir/rootfs"
mkdir -p "$fs/usr/bin" "$fs/etc/ssl/certs" "$fs/var/lib/silt" "$fs/mnt/silt" "$fs/root"
mkdir -m 1777 "$fs/tmp"
chmod 700 "$fs/var/lib/silt" "$fs/root"

if [ "$strip" = 1 ]; then
  # Keeps the symbol table (function names in backtraces), drops DWARF.
  objcopy --strip-debug "$silt" "$fs/usr/bin/silt"
else
  cp "$silt" "$fs/usr/bin/silt"
fi
chmod 755 "$fs/usr/bin/silt"
# Not setuid: silt runs as root in the image (a FUSE mount needs CAP_SYS_ADMIN anyway).
install -m 755 "$fusermount" "$fs/usr/bin/fusermount3"

# Every library either binary loads, by the path the loader resolves (ldd's "=> PATH"), and
# the loader itself by the path written in the binaries (PT_INTERP). Links are followed: the
# image holds the files under the names that are looked up.
# A static binary has none (ldd then fails, saying so).
libs() {
  local out
  out=$(ldd "$1" 2>&1) || { echo "rootfs: $1: no shared libraries ($out)" >&2; return 0; }
  if grep -q 'not found' <<<"$out"; then
    echo "rootfs: $1 needs libraries this machine lacks:" >&2
    grep 'not found' <<<"$out" >&2
    exit 1
  fi
  awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' <<<"$out"
}
{ libs "$silt"; libs "$fusermount"; } | sort -u | while read -r lib; do
  mkdir -p "$fs$(dirname "$lib")"
  cp -L "$lib" "$fs$lib"
done

cat >"$fs/etc/passwd" <<'PASSWD'
root:x:0:0:root:/root:/usr/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
PASSWD
cat >"$fs/etc/group" <<'GROUP'
root:x:0:
nogroup:x:65534:
GROUP
cat >"$fs/etc/nsswitch.conf" <<'NSS'
passwd: files
group: files
hosts: files dns
NSS
cp -L "$ca" "$fs/etc/ssl/certs/ca-certificates.crt"
chmod 644 "$fs/etc/passwd" "$fs/etc/group" "$fs/etc/nsswitch.conf" "$fs/etc/ssl/certs/ca-certificates.crt"

mkdir -p "$(dirname "$out")"
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$fs" -cf "$out" .
echo "rootfs: $out ($(du -h "$out" | cut -f1); silt $(du -h "$fs/usr/bin/silt" | cut -f1))" >&2
