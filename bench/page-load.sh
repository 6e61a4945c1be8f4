#!/usr/bin/env bash
# Load time of the status web page (issue 20): `silt up --web-listen 127.0.0.1:0` over a file://
# sample store, then
#  (a) the server's answer time per page: curl -w %{time_total}, a new connection per request;
#  (b) the page's own load in headless Chromium: one browser, driven over --remote-debugging-pipe
#      (DevTools protocol); each navigation's PerformanceNavigationTiming (loadEventEnd, relative
#      to the navigation's start) is read from the page, so browser start-up is not in it.
# Prints a table and writes bench/out/page-load-<time>.json. Needs root, /dev/fuse, curl,
# python3, chromium, and target/release/silt (`cargo build --release -p silt`).
#
#   bench/page-load.sh [--reqs N] [--navs N] [--dump-dom-runs N]
#   bench/page-load.sh --aggregate bench/out/page-load-*.json   # medians over several runs
#   (or over a file of {"page_load_runs": [run, ...]}, as bench/results-*-page-load.json)
#
# The store: /data/tree: 100 dirs × 100 files (1–16 KiB; tree/d000/f000–f003 are 4 MiB),
# /data/flat: 10,000 files (1–4 KiB) in one directory. Read through the mount before measuring:
# d000/f004–f049 whole, f000 whole and 1 MiB in the middle of f001, all of d001, every 10th file of
# flat. Everything it starts (silt, its FUSE holder, chromium) and mounts is removed on exit.
set -euo pipefail

REQS=20 NAVS=20 DUMPS=5
if [ "${1:-}" = --aggregate ]; then
    # The median (and min–max) over several runs' medians, from their JSON files.
    shift
    exec python3 - "$@" <<'PY'
import json, statistics, sys
runs = [r for f in sys.argv[1:] for d in [json.load(open(f))] for r in d.get("page_load_runs", [d])]
keys = [("curl_total_ms", "curl total"), ("chromium_load_end_ms", "Chromium loadEventEnd"),
        ("chromium_response_end_ms", "Chromium responseEnd"), ("chromium_fcp_ms", "first contentful paint")]
print(f"medians of {len(runs)} runs' medians (min–max of those), ms; machine CPU busy "
      + ", ".join(r["machine"]["busy_pct"] + " %" for r in runs))
print("| page | bytes | " + " | ".join(k[1] for k in keys) + " |\n|---|---|" + "---|" * len(keys))
for page in runs[0]["summary"]:
    cells = []
    for k, _ in keys:
        xs = [r["summary"][page][k]["median"] for r in runs if r["summary"][page][k]]
        cells.append(f"{statistics.median(xs):.1f} ({min(xs):.1f}–{max(xs):.1f})" if xs else "—")
    print(f"| {page} | {runs[0]['summary'][page]['bytes']:,} | " + " | ".join(cells) + " |")
dumps = [statistics.median(r["dump_dom_ms"]) for r in runs]
print(f"chromium --dump-dom of the overview, start to exit: {statistics.median(dumps):.0f} ({min(dumps):.0f}–{max(dumps):.0f})")
PY
fi
while [ $# -gt 0 ]; do
    case "$1" in
        --reqs) REQS=$2; shift 2 ;;
        --navs) NAVS=$2; shift 2 ;;
        --dump-dom-runs) DUMPS=$2; shift 2 ;;
        -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done

REPO=$(cd "$(dirname "$0")/.." && pwd)
SILT=${SILT:-$REPO/target/release/silt}
[ -x "$SILT" ] || { echo "no $SILT: cargo build --release -p silt" >&2; exit 1; }
CHROMIUM=$(command -v chromium || command -v chromium-browser) || { echo "no chromium" >&2; exit 1; }
WORK=$(mktemp -d /tmp/silt-page-load.XXXXXX)
mkdir -p "$REPO/bench/out"
OUT=$REPO/bench/out/page-load-$(date -u +%Y%m%dT%H%M%SZ).json
SILT_PID= CHILD=

cleanup() {
    set +e
    [ -n "$CHILD" ] && kill "$CHILD" 2>/dev/null
    if [ -n "$SILT_PID" ] && kill -0 "$SILT_PID" 2>/dev/null; then
        timeout 60 "$SILT" down --state-dir "$WORK/state" >/dev/null 2>&1
        for _ in $(seq 100); do kill -0 "$SILT_PID" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$SILT_PID" 2>/dev/null && kill -9 "$SILT_PID"
    fi
    # The process that keeps the mount's FUSE connection across daemons, and a browser left
    # behind by a killed driver: only while their command line still names this run's $WORK.
    for f in "$WORK/state/fuse-holder.pid" "$WORK/chromium.pid"; do
        pid=$(cat "$f" 2>/dev/null) || continue
        tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF "$WORK" && kill -9 "$pid"
    done
    mountpoint -q "$WORK/mnt" 2>/dev/null && fusermount3 -uz "$WORK/mnt"
    mountpoint -q "$WORK/mnt" 2>/dev/null || rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "== sample store in $WORK/store"
python3 - "$WORK/store" <<'PY' &
import os, random, sys
root = sys.argv[1]
rng = random.Random(20)
blob = rng.randbytes(4 << 20)
def put(rel, size):
    p = os.path.join(root, rel)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, "wb") as f:
        f.write(blob[:size])
for d in range(100):
    for i in range(100):
        size = (4 << 20) if d == 0 and i < 4 else rng.randint(1 << 10, 16 << 10)
        put(f"tree/d{d:03}/f{i:03}.bin", size)
for i in range(10_000):
    put(f"flat/f{i:05}.bin", rng.randint(1 << 10, 4 << 10))
PY
CHILD=$!
wait "$CHILD"
CHILD=

echo "== silt up"
mkdir -p "$WORK/mnt" "$WORK/state"
SILT_LOG=warn "$SILT" up --mountpoint "$WORK/mnt" --state-dir "$WORK/state" \
    --mount "/data=file://$WORK/store" --web-listen 127.0.0.1:0 --metrics-listen off \
    --memory-capacity 256MiB --disk-tiers "$WORK/state/cache:2GiB" 2>"$WORK/silt.log" &
SILT_PID=$!
for _ in $(seq 1200); do
    grep -q '^silt: serving ' "$WORK/silt.log" && break
    kill -0 "$SILT_PID" 2>/dev/null || { cat "$WORK/silt.log" >&2; exit 1; }
    sleep 0.1
done
WEB=$(sed -n 's|^silt: web page at http://\([^/]*\)/$|\1|p' "$WORK/silt.log")
[ -n "$WEB" ] || { echo "silt printed no web address" >&2; cat "$WORK/silt.log" >&2; exit 1; }
echo "web page at http://$WEB/"

echo "== reading part of the store through the mount"
M=$WORK/mnt/data
cat "$M"/tree/d000/f000.bin "$M"/tree/d000/f0{0[4-9],[1-4][0-9]}.bin "$M"/tree/d001/*.bin >/dev/null
dd if="$M/tree/d000/f001.bin" of=/dev/null bs=1M skip=2 count=1 status=none  # one page of four
for i in $(seq 0 10 9999); do printf '%s/flat/f%05d.bin\0' "$M" "$i"; done | xargs -0 cat >/dev/null

# What the browse view shows of that (a check that the pages measured carry the fractions).
fractions() {
    curl -sS "http://$WEB/browse?path=$1" | grep -o 'data-fraction="[0-9.]*"' | cut -d'"' -f2 |
        awk '{n++} $1 == 1 {w++} $1 > 0 && $1 < 1 {p++} END {printf "%d files: %d whole, %d partly cached\n", n, w, p}'
}
echo "cached, /data/tree/d000: $(fractions /data/tree/d000); /data/flat, first page: $(fractions /data/flat)" |
    tee "$WORK/fractions"

PAGES=(
    "floor: /healthz (3 bytes of text)|/healthz"
    "overview|/"
    "browse /|/browse?path=/"
    "browse /data/tree (100 dirs)|/browse?path=/data/tree"
    "browse /data/tree/d000 (100 files)|/browse?path=/data/tree/d000"
    "browse /data/flat (10,000 files, entries 1-500)|/browse?path=/data/flat"
    "browse /data/flat (entries 9,501-10,000)|/browse?path=/data/flat&from=9500"
)
printf '%s\n' "${PAGES[@]}" >"$WORK/pages"

cpu() { awk '/^cpu /{print $2+$3+$4+$7+$8, $2+$3+$4+$5+$6+$7+$8}' /proc/stat; }
{
    echo "nproc $(nproc)"
    echo "cpu $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
    echo "chromium $("$CHROMIUM" --version 2>/dev/null)"
    echo "loadavg_before $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "rustc_before $(pgrep -c -x rustc || true)"
} >"$WORK/machine"
read -r BUSY0 TOTAL0 < <(cpu)

echo "== (a) curl: 1 first request, then $REQS, per page"
: >"$WORK/curl"
while IFS='|' read -r name path; do
    for i in $(seq 0 "$REQS"); do
        printf '%s|%s|' "$name" "$i" >>"$WORK/curl"
        curl -sS -o /dev/null -w '%{http_code}|%{time_starttransfer}|%{time_total}|%{size_download}\n' \
            "http://$WEB$path" >>"$WORK/curl"
    done
done <"$WORK/pages"

echo "== (b) headless Chromium over the DevTools pipe: 1 warm-up, then $NAVS navigations, per page"
# In the background with `wait`, so a signal ends the run now, not when the driver finishes.
python3 - "$CHROMIUM" "$WEB" "$WORK" "$NAVS" <<'PY' >"$WORK/chromium" &
import json, os, subprocess, sys, time
chromium, web, work, navs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
pages = [l.rstrip("\n").split("|", 1) for l in open(os.path.join(work, "pages"))]
to_browser, from_us = os.pipe()      # the browser reads commands on fd 3
from_browser, to_us = os.pipe()      # and writes replies and events on fd 4
def fds():
    a, b = os.dup(to_browser), os.dup(to_us)  # above 4, so dup2 never sees fd == fd2
    os.dup2(a, 3); os.dup2(b, 4)
p = subprocess.Popen([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                      "--no-first-run", "--hide-scrollbars", "--window-size=1280,1000",
                      f"--user-data-dir={work}/chromium-profile", "--remote-debugging-pipe", "about:blank"],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=open(os.path.join(work, "chromium.log"), "w"), preexec_fn=fds, close_fds=False)
os.close(to_browser); os.close(to_us)
open(os.path.join(work, "chromium.pid"), "w").write(str(p.pid))
rx, buf, seq = os.fdopen(from_browser, "rb", buffering=0), b"", 0
def recv():
    global buf
    while b"\0" not in buf:
        chunk = rx.read(1 << 16)
        if not chunk:
            raise SystemExit("chromium closed the pipe; see chromium.log")
        buf += chunk
    msg, buf = buf.split(b"\0", 1)
    return json.loads(msg)
def send(method, session=None, **params):
    global seq
    seq += 1
    m = {"id": seq, "method": method, "params": params}
    if session:
        m["sessionId"] = session
    os.write(from_us, json.dumps(m).encode() + b"\0")
    return seq
def call(method, session=None, **params):
    want = send(method, session, **params)
    while True:
        m = recv()
        if m.get("id") == want:
            if "error" in m:
                raise SystemExit(f"{method}: {m['error']}")
            return m["result"]
def navigate(session, url):
    """Navigates and waits for the load event; returns the wall time from the command to it."""
    t0 = time.perf_counter()
    want, loaded, answered = send("Page.navigate", session, url=url), False, False
    while not (loaded and answered):
        m = recv()
        if m.get("id") == want:
            if "error" in m or m["result"].get("errorText"):
                raise SystemExit(f"navigate {url}: {m}")
            answered = True
        elif m.get("method") == "Page.loadEventFired" and m.get("sessionId") == session:
            loaded, t1 = True, time.perf_counter()
    return t1 - t0
try:
    target = next(t for t in call("Target.getTargets")["targetInfos"] if t["type"] == "page")
    s = call("Target.attachToTarget", targetId=target["targetId"], flatten=True)["sessionId"]
    call("Page.enable", s)
    expr = ("JSON.stringify({nav: performance.getEntriesByType('navigation')[0].toJSON(),"
            " paint: performance.getEntriesByType('paint').map(e => [e.name, e.startTime])})")
    for name, path in pages:
        url = f"http://{web}{path}"
        for i in range(navs + 1):
            navigate(s, "about:blank")
            wall = navigate(s, url)
            # The entries are timestamps: polling for them (first paint comes after the load
            # event here) does not change what they say.
            for _ in range(100):
                r = json.loads(call("Runtime.evaluate", s, expression=expr, returnByValue=True)["result"]["value"])
                if r["nav"]["loadEventEnd"] > 0 and any(k == "first-contentful-paint" for k, _ in r["paint"]):
                    break
                time.sleep(0.02)
            n, paint = r["nav"], dict(r["paint"])
            print(json.dumps({"page": name, "i": i, "wall_ms": wall * 1e3, "status": n.get("responseStatus"),
                              "response_start": n["responseStart"], "response_end": n["responseEnd"],
                              "dcl_end": n["domContentLoadedEventEnd"], "load_end": n["loadEventEnd"],
                              "fcp": paint.get("first-contentful-paint"), "bytes": n["decodedBodySize"]}))
    call("Browser.close")
finally:
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    os.unlink(os.path.join(work, "chromium.pid"))
PY
CHILD=$!
wait "$CHILD"
CHILD=

echo "== context: chromium --headless --dump-dom of the overview, start to exit ($DUMPS runs)"
: >"$WORK/dumpdom"
for _ in $(seq "$DUMPS"); do
    t0=$(date +%s%N)
    timeout 120 "$CHROMIUM" --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run \
        --user-data-dir="$WORK/chromium-dump" --dump-dom "http://$WEB/" >/dev/null 2>>"$WORK/chromium.log"
    echo $(( ($(date +%s%N) - t0) / 1000 )) >>"$WORK/dumpdom"
done

read -r BUSY1 TOTAL1 < <(cpu)
{
    echo "loadavg_after $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "rustc_after $(pgrep -c -x rustc || true)"
    echo "busy_pct $(awk -v b=$((BUSY1 - BUSY0)) -v t=$((TOTAL1 - TOTAL0)) 'BEGIN{printf "%.0f", 100*b/t}')"
    echo "silt_rss_kib $(awk '/^VmRSS/{print $2}' /proc/$SILT_PID/status)"
} >>"$WORK/machine"

python3 - "$WORK" "$OUT" "$REQS" "$NAVS" "$(cd "$REPO" && git rev-parse --short HEAD)" <<'PY'
import json, os, statistics, sys, time
work, out, reqs, navs, commit = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
pages = [l.rstrip("\n").split("|", 1)[0] for l in open(os.path.join(work, "pages"))]
machine = dict(l.rstrip("\n").split(" ", 1) for l in open(os.path.join(work, "machine")))
curl, chrome = {p: [] for p in pages}, {p: [] for p in pages}
for l in open(os.path.join(work, "curl")):
    name, i, code, ttfb, total, size = l.strip().split("|")
    if code != "200":
        raise SystemExit(f"{name}: HTTP {code}")
    curl[name].append({"i": int(i), "ttfb_ms": float(ttfb) * 1e3, "total_ms": float(total) * 1e3, "bytes": int(size)})
for l in open(os.path.join(work, "chromium")):
    r = json.loads(l)
    if r["status"] not in (None, 200):
        raise SystemExit(f"{r['page']}: HTTP {r['status']} in Chromium")
    chrome[r["page"]].append(r)
dump_ms = [int(l) / 1e3 for l in open(os.path.join(work, "dumpdom"))]
machine["fractions"] = open(os.path.join(work, "fractions")).read().strip()
def stat(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)} if xs else None
def fmt(s):
    return f"{s['median']:.1f} ({s['min']:.1f}–{s['max']:.1f})" if s else "—"
summary = {}
print(f"\n{machine['nproc']} CPUs ({machine['cpu']}), {machine['chromium']}; load average before {machine['loadavg_before']}, "
      f"after {machine['loadavg_after']}; machine CPU busy {machine['busy_pct']} % during the run; "
      f"rustc processes before/after: {machine['rustc_before']}/{machine['rustc_after']}; silt RSS {machine['silt_rss_kib']} KiB\n{machine['fractions']}")
print(f"\n| page | bytes | curl first (ms) | curl total, median of {reqs} (min–max) | "
      f"Chromium loadEventEnd, median of {navs} (min–max) | Chromium responseEnd | first contentful paint |")
print("|---|---|---|---|---|---|---|")
for p in pages:
    c = [r for r in curl[p] if r["i"] > 0]
    h = [r for r in chrome[p] if r["i"] > 0]
    s = {"bytes": curl[p][0]["bytes"], "curl_first_ms": curl[p][0]["total_ms"],
         "curl_total_ms": stat([r["total_ms"] for r in c]), "curl_ttfb_ms": stat([r["ttfb_ms"] for r in c]),
         "chromium_load_end_ms": stat([r["load_end"] for r in h]),
         "chromium_response_end_ms": stat([r["response_end"] for r in h]),
         "chromium_dcl_end_ms": stat([r["dcl_end"] for r in h]),
         "chromium_fcp_ms": stat([r["fcp"] for r in h if r["fcp"] is not None]),
         "chromium_cdp_wall_ms": stat([r["wall_ms"] for r in h])}
    summary[p] = s
    print(f"| {p} | {s['bytes']:,} | {s['curl_first_ms']:.1f} | {fmt(s['curl_total_ms'])} | "
          f"{fmt(s['chromium_load_end_ms'])} | {fmt(s['chromium_response_end_ms'])} | {fmt(s['chromium_fcp_ms'])} |")
print(f"\nchromium --headless --dump-dom of the overview, process start to exit: {fmt(stat(dump_ms))} ms "
      f"(median of {len(dump_ms)}; Chromium start-up, not the page)")
json.dump({"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": commit, "machine": machine,
           "reqs": reqs, "navs": navs, "summary": summary, "dump_dom_ms": dump_ms,
           "runs": {"curl": curl, "chromium": chrome}}, open(out, "w"), indent=1)
print(f"written {out}")
PY
