//! The S3 gateway against a real client: `silt up` over `file://` directories, a real
//! `silt gateway` attached to it (or `silt up --gateway`), driven by boto3 from the project's
//! venv (`scripts/install-deps.sh` installs it). The Python snippets assert what the S3 API
//! specifies (status codes, error codes, Content-Range, ETag, listing order and paging),
//! listings against a plain model of S3's listing rules.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

/// The venv's Python (`$SILT_TEST_PYTHON` overrides).
fn python() -> PathBuf {
    if let Ok(p) = std::env::var("SILT_TEST_PYTHON") {
        return PathBuf::from(p);
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.deps/pyvenv/bin/python")
}

const ACCESS: &str = "AKIDSILTTEST";
const SECRET: &str = "silt-gateway-test-secret-0123456789";
const RO_ACCESS: &str = "AKIDSILTREADER";
const RO_SECRET: &str = "silt-gateway-reader-secret-987654321";

/// What every snippet starts with: clients, an error helper and the S3 listing model.
const PRELUDE: &str = r#"
import os, sys, datetime
import boto3, botocore
from botocore.config import Config
from botocore.exceptions import ClientError

EP = os.environ["GW"]

def client(ak=None, sk=None, unsigned=False):
    cfg = dict(s3={"addressing_style": "path"}, retries={"max_attempts": 1},
               connect_timeout=10, read_timeout=60)
    cfg["signature_version"] = botocore.UNSIGNED if unsigned else "s3v4"
    return boto3.client("s3", endpoint_url=EP, region_name="us-east-1",
                        aws_access_key_id=ak or "x", aws_secret_access_key=sk or "x",
                        config=Config(**cfg))

def err(fn, code, status):
    try:
        r = fn()
    except ClientError as e:
        got = (e.response["Error"]["Code"], e.response["ResponseMetadata"]["HTTPStatusCode"])
        assert got == (code, status), f"expected {(code, status)}, got {got}: {e.response}"
        return e.response
    raise AssertionError(f"expected {code} {status}, got success: {r}")

def model(keys, prefix="", delimiter=None, after=None):
    """S3's listing rules over a set of keys: byte order, prefix, keys after the marker,
    rolled up at the delimiter; a common prefix equal to the marker is where a page ended."""
    out = []
    for k in sorted(keys, key=lambda s: s.encode()):
        if not k.startswith(prefix) or (after is not None and k <= after):
            continue
        i = k.find(delimiter, len(prefix)) if delimiter else -1
        if i >= 0:
            cp = k[:i + len(delimiter)]
            if cp != after and (not out or out[-1] != ("p", cp)):
                out.append(("p", cp))
            continue
        out.append(("k", k))
    return out

def items(r):
    ks = [("k", o["Key"]) for o in r.get("Contents", [])]
    ps = [("p", p["Prefix"]) for p in r.get("CommonPrefixes", [])]
    return sorted(ks + ps, key=lambda t: t[1].encode())
"#;

/// `silt up` over two `file://` directories (`/data`, `/other`) and a gateway attached to it.
struct Fx {
    // Dropped first: the gateway, then the daemon it is attached to.
    gateway: Silt,
    _up: Silt,
    endpoint: String,
    dir: tempfile::TempDir,
}

fn write(root: &Path, files: &[(&str, Vec<u8>)]) {
    for (rel, data) in files {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, data).unwrap();
    }
}

/// The address a gateway printed (`... at http://HOST:PORT ...`).
fn endpoint_in(log: &str, marker: &str) -> String {
    let line = log
        .lines()
        .find(|l| l.starts_with(marker))
        .unwrap_or_else(|| panic!("no {marker:?} line in the log:\n{log}"));
    let at = line.find("http://").expect("an address");
    line[at..]
        .split_whitespace()
        .next()
        .unwrap()
        .trim_end_matches(['(', ')', ';', ','])
        .to_string()
}

impl Fx {
    fn start(files: &[(&str, Vec<u8>)], gateway_args: &[&str], keys: Option<&str>) -> Fx {
        Fx::start_with(files, gateway_args, keys, false)
    }

    /// `shared_secret`: `silt up` and the gateway are both given the harness's cluster secret
    /// (in the environment), so the state dir holds none; else `silt up` generates one there.
    fn start_with(
        files: &[(&str, Vec<u8>)],
        gateway_args: &[&str],
        keys: Option<&str>,
        shared_secret: bool,
    ) -> Fx {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("store-data");
        let other = dir.path().join("store-other");
        std::fs::create_dir_all(&data).unwrap();
        std::fs::create_dir_all(&other).unwrap();
        write(&data, files);
        write(&other, &[("o.txt", b"other".to_vec())]);
        let mp = dir.path().join("mnt");
        std::fs::create_dir_all(&mp).unwrap();
        let state = dir.path().join("state");
        let mut up = Command::new(SILT);
        up.args(["up", "--mountpoint"])
            .arg(&mp)
            .arg("--state-dir")
            .arg(&state)
            .arg("--mount")
            .arg(format!("/data=file://{}", data.display()))
            .arg("--mount")
            .arg(format!("/other=file://{}", other.display()));
        if !shared_secret {
            // The attached gateway proves the state dir's own secret (generated there by
            // `silt up` when none is given), as same-host Python clients do.
            up.env_remove("SILT_CLUSTER_SECRET");
        }
        let up = Silt::spawn(up, Some(&mp), &state).unwrap_or_else(|e| panic!("{e}"));

        let mut gw = Command::new(SILT);
        gw.args(["gateway", "--listen", "127.0.0.1:0", "--state-dir"])
            .arg(&state)
            .args(gateway_args)
            .env("RUST_LOG", "debug");
        if !shared_secret {
            gw.env_remove("SILT_CLUSTER_SECRET");
        }
        if let Some(text) = keys {
            let f = dir.path().join("keys");
            std::fs::write(&f, text).unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
            gw.arg("--keys").arg(&f);
        }
        // Its log beside, not inside, the daemon's state dir.
        let gateway =
            Silt::spawn(gw, None, &dir.path().join("gw")).unwrap_or_else(|e| panic!("{e}"));
        let endpoint = endpoint_in(&gateway.log_text(), "silt: serving S3 gateway");
        Fx {
            gateway,
            _up: up,
            endpoint,
            dir,
        }
    }

    fn with_keys(files: &[(&str, Vec<u8>)]) -> Fx {
        let keys = format!("# test keys\n{ACCESS} {SECRET} rw\n{RO_ACCESS} {RO_SECRET} ro data\n");
        Fx::start(files, &[], Some(&keys))
    }

    /// Runs `snippet` (after the prelude) with boto3 against the gateway; panics with its
    /// output if it fails.
    fn py(&self, snippet: &str) {
        py_at(&self.endpoint, self.dir.path(), snippet);
    }
}

fn py_at(endpoint: &str, dir: &Path, snippet: &str) {
    py_env(endpoint, dir, snippet, &[]);
}

/// `py_at` with more environment for the snippet.
fn py_env(endpoint: &str, dir: &Path, snippet: &str, env: &[(&str, &str)]) {
    let script = dir.join("check.py");
    std::fs::write(&script, format!("{PRELUDE}\n{snippet}\nprint('ok')\n")).unwrap();
    let out = Command::new(python())
        .envs(env.iter().copied())
        .arg(&script)
        .env("GW", endpoint)
        .env("AK", ACCESS)
        .env("SK", SECRET)
        .env("RO_AK", RO_ACCESS)
        .env("RO_SK", RO_SECRET)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "running {} (boto3 in the project's venv: scripts/install-deps.sh): {e}",
                python().display()
            )
        });
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).ends_with("ok\n"),
        "boto3 check failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn gateway_serves_objects_as_s3_does() {
    // Larger than the gateway's read piece (4 MiB): the body comes in several pieces.
    let big = bytes(7, 9 * 1024 * 1024 + 321);
    let fx = Fx::with_keys(&[
        ("small.txt", b"hello, gateway!".to_vec()),
        ("empty", Vec::new()),
        ("dir/big.bin", big.clone()),
    ]);
    // The expected bytes, for Python to compare with.
    let big_path = fx.dir.path().join("big.bin");
    std::fs::write(&big_path, &big).unwrap();
    fx.py(&format!(
        r#"
s3 = client(os.environ["AK"], os.environ["SK"])
names = [b["Name"] for b in s3.list_buckets()["Buckets"]]
assert names == ["data", "other"], names
assert s3.head_bucket(Bucket="data")["ResponseMetadata"]["HTTPStatusCode"] == 200
try:
    s3.head_bucket(Bucket="nosuchbucket")
    raise AssertionError("HeadBucket of a missing bucket succeeded")
except ClientError as e:
    assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 404, e.response

big = open({big_path:?}, "rb").read()
h = s3.head_object(Bucket="data", Key="dir/big.bin")
assert h["ContentLength"] == len(big), h
etag = h["ETag"]
assert etag.startswith('"') and etag.endswith('"') and len(etag) > 2, etag
lm = h["LastModified"]

r = s3.get_object(Bucket="data", Key="dir/big.bin")
assert r["ResponseMetadata"]["HTTPStatusCode"] == 200
assert r["ETag"] == etag and r["ContentLength"] == len(big)
assert r["Body"].read() == big
assert s3.get_object(Bucket="data", Key="small.txt")["Body"].read() == b"hello, gateway!"
e = s3.get_object(Bucket="data", Key="empty")
assert e["ContentLength"] == 0 and e["Body"].read() == b""

# Ranges: 206 with Content-Range "bytes FIRST-LAST/SIZE" (RFC 9110 as S3 applies it).
n = len(big)
for rng, first, last in [("bytes=10-19", 10, 19), ("bytes=-5", n - 5, n - 1),
                         ("bytes=%d-" % (n - 3), n - 3, n - 1),
                         ("bytes=%d-%d" % (n - 2, n + 100), n - 2, n - 1),
                         ("bytes=-%d" % (n + 10), 0, n - 1),
                         ("bytes=4194300-4194310", 4194300, 4194310)]:
    r = s3.get_object(Bucket="data", Key="dir/big.bin", Range=rng)
    assert r["ResponseMetadata"]["HTTPStatusCode"] == 206, (rng, r["ResponseMetadata"])
    assert r["ContentRange"] == "bytes %d-%d/%d" % (first, last, n), (rng, r["ContentRange"])
    assert r["ContentLength"] == last - first + 1
    assert r["Body"].read() == big[first:last + 1], rng
err(lambda: s3.get_object(Bucket="data", Key="dir/big.bin", Range="bytes=%d-" % n), "InvalidRange", 416)
h = s3.head_object(Bucket="data", Key="dir/big.bin", Range="bytes=-5")
assert h["ResponseMetadata"]["HTTPStatusCode"] == 206, h["ResponseMetadata"]
assert h["ContentRange"] == "bytes %d-%d/%d" % (n - 5, n - 1, n) and h["ContentLength"] == 5, h
try:
    s3.head_object(Bucket="data", Key="dir/big.bin", Range="bytes=%d-" % n)
    raise AssertionError("HeadObject of an unsatisfiable range succeeded")
except ClientError as e:
    assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 416, e.response
err(lambda: s3.get_object(Bucket="data", Key="empty", Range="bytes=0-0"), "InvalidRange", 416)

# Many clients at once, each on its own connections: every ranged read exact.
import random, concurrent.futures
clients = [client(os.environ["AK"], os.environ["SK"]) for _ in range(48)]
def reader(i):
    rnd = random.Random(i)
    for _ in range(4):
        first = rnd.randrange(0, n - 1)
        last = min(n - 1, first + rnd.randrange(1, 1 << 20))
        r = clients[i].get_object(Bucket="data", Key="dir/big.bin", Range="bytes=%d-%d" % (first, last))
        assert r["Body"].read() == big[first:last + 1], (i, first, last)
    return True
with concurrent.futures.ThreadPoolExecutor(48) as ex:
    assert all(ex.map(reader, range(48)))

# Missing things.
err(lambda: s3.get_object(Bucket="data", Key="nope"), "NoSuchKey", 404)
err(lambda: s3.get_object(Bucket="data", Key="dir"), "NoSuchKey", 404)
err(lambda: s3.get_object(Bucket="data", Key="dir/"), "NoSuchKey", 404)
err(lambda: s3.get_object(Bucket="data", Key="small.txt/x"), "NoSuchKey", 404)
err(lambda: s3.get_object(Bucket="nosuchbucket", Key="x"), "NoSuchBucket", 404)
try:
    s3.head_object(Bucket="data", Key="nope")
    raise AssertionError("HeadObject of a missing key succeeded")
except ClientError as e:
    assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 404, e.response

# Conditional requests.
ok = lambda **kw: s3.get_object(Bucket="data", Key="small.txt", **kw)
small_etag = s3.head_object(Bucket="data", Key="small.txt")["ETag"]
assert ok(IfMatch=small_etag)["Body"].read() == b"hello, gateway!"
err(lambda: ok(IfMatch='"not-the-etag"'), "PreconditionFailed", 412)
err(lambda: ok(IfNoneMatch=small_etag), "304", 304)
assert ok(IfNoneMatch='"other"')["ResponseMetadata"]["HTTPStatusCode"] == 200
slm = s3.head_object(Bucket="data", Key="small.txt")["LastModified"]
err(lambda: ok(IfModifiedSince=slm), "304", 304)
err(lambda: ok(IfModifiedSince=slm + datetime.timedelta(days=1)), "304", 304)
assert ok(IfModifiedSince=slm - datetime.timedelta(seconds=1))["Body"].read() == b"hello, gateway!"
err(lambda: ok(IfUnmodifiedSince=slm - datetime.timedelta(days=1)), "PreconditionFailed", 412)
assert ok(IfUnmodifiedSince=slm)["ResponseMetadata"]["HTTPStatusCode"] == 200
# If-None-Match decides over If-Modified-Since; If-Match over If-Unmodified-Since.
assert ok(IfNoneMatch='"other"', IfModifiedSince=slm)["ResponseMetadata"]["HTTPStatusCode"] == 200
assert ok(IfMatch=small_etag, IfUnmodifiedSince=slm - datetime.timedelta(days=1))["ResponseMetadata"]["HTTPStatusCode"] == 200
try:
    s3.head_object(Bucket="data", Key="small.txt", IfNoneMatch=small_etag)
    raise AssertionError("HeadObject If-None-Match of the ETag succeeded")
except ClientError as e:
    assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 304, e.response
"#
    ));

    let log = fx.gateway.log_text();
    assert!(!log.contains(SECRET), "a secret in the gateway's log");
}

#[test]
fn gateway_lists_as_s3_does() {
    // Names chosen so that directory order and key order differ ('-' and '.' sort before
    // '/'), with several levels, and enough keys to page.
    let names = [
        "a-b", "a.txt", "a/x", "a/y/z1", "a/y/z2", "a/yy", "a0", "b/c/d/e", "b/c/f", "b/g", "top",
        "z/1", "z/2", "z/3", "z/4", "z/5",
    ];
    let files: Vec<(&str, Vec<u8>)> = names.iter().map(|n| (*n, n.as_bytes().to_vec())).collect();
    let fx = Fx::with_keys(&files);
    let keys: Vec<String> = names.iter().map(|n| format!("{n:?}")).collect();
    fx.py(&format!(
        r#"
s3 = client(os.environ["AK"], os.environ["SK"])
KEYS = [{keys}]

def v2_all(**kw):
    got, token, pages = [], None, 0
    while True:
        args = dict(kw)
        if token:
            args["ContinuationToken"] = token
        r = s3.list_objects_v2(Bucket="data", **args)
        pages += 1
        assert r["KeyCount"] == len(r.get("Contents", [])) + len(r.get("CommonPrefixes", [])), r
        if "MaxKeys" in kw:
            assert r["KeyCount"] <= kw["MaxKeys"], r
        got += items(r)
        if not r["IsTruncated"]:
            assert "NextContinuationToken" not in r, r
            return got, pages
        token = r["NextContinuationToken"]
        assert pages < 100, "no end of pages"

cases = [dict(), dict(Prefix="a"), dict(Prefix="a/"), dict(Prefix="a/y"), dict(Prefix="b/c/"),
         dict(Delimiter="/"), dict(Prefix="a/", Delimiter="/"), dict(Prefix="a", Delimiter="/"),
         dict(Prefix="b/", Delimiter="/"), dict(Delimiter="y"), dict(Delimiter="/", StartAfter="a/x"),
         dict(StartAfter="a/y/z1"), dict(StartAfter="b"), dict(Prefix="nothing/"), dict(Prefix="top/")]
for kw in cases:
    want = model(KEYS, kw.get("Prefix", ""), kw.get("Delimiter"), kw.get("StartAfter"))
    for mk in [None, 1, 2, 3, 1000]:
        args = dict(kw) if mk is None else dict(kw, MaxKeys=mk)
        got, pages = v2_all(**args)
        assert got == want, (args, got, want)
        if mk:
            assert pages == max(1, -(-len(want) // mk)), (args, pages)

# The first page of a plain listing, field by field.
r = s3.list_objects_v2(Bucket="data", MaxKeys=3)
assert [o["Key"] for o in r["Contents"]] == ["a-b", "a.txt", "a/x"], r["Contents"]
assert r["IsTruncated"] and r["MaxKeys"] == 3 and r["KeyCount"] == 3
o = r["Contents"][0]
assert o["Size"] == 3 and o["ETag"] == s3.head_object(Bucket="data", Key="a-b")["ETag"], o
r = s3.list_objects_v2(Bucket="data", Delimiter="/")
assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["a/", "b/", "z/"], r
assert [o["Key"] for o in r["Contents"]] == ["a-b", "a.txt", "a0", "top"], r

# V1: Marker, NextMarker (only with a delimiter), and the paginator that follows them.
for kw in cases:
    kw1 = {{("Marker" if k == "StartAfter" else k): v for k, v in kw.items()}}
    want = model(KEYS, kw.get("Prefix", ""), kw.get("Delimiter"), kw.get("StartAfter"))
    got = []
    for page in s3.get_paginator("list_objects").paginate(Bucket="data", PaginationConfig={{"PageSize": 2}}, **kw1):
        got += items(page)
    assert got == want, (kw1, got, want)
r = s3.list_objects(Bucket="data", Delimiter="/", MaxKeys=2)
assert r["IsTruncated"] and r["NextMarker"] == "a.txt", r
r = s3.list_objects(Bucket="data", MaxKeys=2)
assert r["IsTruncated"] and "NextMarker" not in r, r

err(lambda: s3.list_objects_v2(Bucket="nosuchbucket"), "NoSuchBucket", 404)
err(lambda: s3.list_objects_v2(Bucket="data", ContinuationToken="!!not a token!!"), "InvalidArgument", 400)
"#,
        keys = keys.join(", ")
    ));
}

#[test]
fn gateway_checks_signatures_and_rights() {
    let fx = Fx::with_keys(&[("f", b"data".to_vec())]);
    fx.py(r#"
good = client(os.environ["AK"], os.environ["SK"])
assert good.get_object(Bucket="data", Key="f")["Body"].read() == b"data"
# The right key with the wrong secret: the signature does not match.
bad = client(os.environ["AK"], "wrong-secret")
err(lambda: bad.get_object(Bucket="data", Key="f"), "SignatureDoesNotMatch", 403)
err(lambda: bad.list_buckets(), "SignatureDoesNotMatch", 403)
# A key the gateway does not know.
unknown = client("AKIDNOBODY", "whatever")
err(lambda: unknown.get_object(Bucket="data", Key="f"), "InvalidAccessKeyId", 403)
# Unsigned, without --anonymous.
anon = client(unsigned=True)
err(lambda: anon.get_object(Bucket="data", Key="f"), "AccessDenied", 403)
err(lambda: anon.list_buckets(), "AccessDenied", 403)
# A read-only key limited to the bucket `data`.
ro = client(os.environ["RO_AK"], os.environ["RO_SK"])
assert ro.get_object(Bucket="data", Key="f")["Body"].read() == b"data"
assert [b["Name"] for b in ro.list_buckets()["Buckets"]] == ["data"]
err(lambda: ro.get_object(Bucket="other", Key="o.txt"), "AccessDenied", 403)
err(lambda: ro.list_objects_v2(Bucket="other"), "AccessDenied", 403)
err(lambda: ro.put_object(Bucket="data", Key="new", Body=b"x"), "AccessDenied", 403)
# Writes are not served yet, whoever asks.
err(lambda: good.put_object(Bucket="data", Key="new", Body=b"x"), "NotImplemented", 501)

# Presigned URLs (SigV4 in the query): valid, tampered, expired.
import re, urllib.request, urllib.error
def fetch(url):
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
url = good.generate_presigned_url("get_object", Params={"Bucket": "data", "Key": "f"}, ExpiresIn=300)
assert fetch(url) == (200, b"data"), fetch(url)
sig = re.search(r"X-Amz-Signature=([0-9a-f]{64})", url).group(1)
flipped = sig[:-1] + ("0" if sig[-1] != "0" else "1")
status, body = fetch(url.replace(sig, flipped))
assert status == 403 and b"<Code>SignatureDoesNotMatch</Code>" in body, (status, body)
real_now = botocore.auth.get_current_datetime
botocore.auth.get_current_datetime = lambda: real_now() - datetime.timedelta(hours=1)
try:
    old_url = good.generate_presigned_url("get_object", Params={"Bucket": "data", "Key": "f"}, ExpiresIn=60)
finally:
    botocore.auth.get_current_datetime = real_now
status, body = fetch(old_url)
assert status == 403 and b"<Code>AccessDenied</Code>" in body, (status, body)
"#);
    // The gateway logs at debug level here (requests included): never a secret.
    let log = fx.gateway.log_text();
    for secret in [SECRET, RO_SECRET, "wrong-secret"] {
        assert!(
            !log.contains(secret),
            "secret {secret:?} in the gateway's log"
        );
    }
}

#[test]
fn gateway_needs_keys_or_explicit_anonymous_access() {
    // No keys, no --anonymous: refused at the start, before anything is served.
    let dir = tempfile::tempdir().unwrap();
    let o = silt(&[
        "gateway",
        "--listen",
        "127.0.0.1:0",
        "--state-dir",
        dir.path().join("state").to_str().unwrap(),
    ]);
    assert!(!o.status.success(), "a gateway nobody could use started");
    assert!(stderr(&o).contains("no access keys"), "{}", stderr(&o));

    // A keys file others may read is refused.
    let keys = dir.path().join("keys");
    std::fs::write(&keys, format!("{ACCESS} {SECRET}\n")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&keys, std::fs::Permissions::from_mode(0o644)).unwrap();
    let o = silt(&[
        "gateway",
        "--listen",
        "127.0.0.1:0",
        "--keys",
        keys.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("chmod 600"), "{}", stderr(&o));
    assert!(!stderr(&o).contains(SECRET), "the secret in an error");

    // With mounts given and no Silt serving its state dir, a gateway is its own single node.
    let store = dir.path().join("store");
    write(&store, &[("own/node.txt", b"no daemon needed".to_vec())]);
    let mut gw = Command::new(SILT);
    gw.args([
        "gateway",
        "--listen",
        "127.0.0.1:0",
        "--anonymous",
        "--state-dir",
    ])
    .arg(dir.path().join("own-state"))
    .arg("--mount")
    .arg(format!("/data=file://{}", store.display()));
    let own = Silt::spawn(gw, None, &dir.path().join("own-gw")).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        own.log_text().contains("(single node client"),
        "{}",
        own.log_text()
    );
    py_at(
        &endpoint_in(&own.log_text(), "silt: serving S3 gateway"),
        dir.path(),
        r#"
assert client(unsigned=True).get_object(Bucket="data", Key="own/node.txt")["Body"].read() == b"no daemon needed"
"#,
    );
    drop(own);

    // --anonymous: unsigned reads are served. (Here `silt up` and the gateway share a secret
    // given in the environment: the gateway attaches with it.)
    let fx = Fx::start_with(&[("f", b"open".to_vec())], &["--anonymous"], None, true);
    assert!(
        !fx.dir.path().join("state/cluster-secret").exists(),
        "silt up wrote a secret it was given"
    );
    assert!(fx.gateway.log_text().contains("(attached client"));
    fx.py(r#"
anon = client(unsigned=True)
assert anon.get_object(Bucket="data", Key="f")["Body"].read() == b"open"
assert [o["Key"] for o in anon.list_objects_v2(Bucket="data")["Contents"]] == ["f"]
# Signed with a key it does not hold: still refused.
err(lambda: client("AKIDNOBODY", "x").get_object(Bucket="data", Key="f"), "InvalidAccessKeyId", 403)
"#);
}

#[test]
fn up_serves_the_gateway_beside_the_mount() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("store");
    write(&data, &[("x/y.txt", b"through the mount and S3".to_vec())]);
    let uri = format!("file://{}", data.display());
    let up = Silt::up(
        &[("/data", uri.as_str())],
        &["--gateway", "127.0.0.1:0", "--gateway-anonymous"],
        dir.path(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let endpoint = endpoint_in(&up.log_text(), "silt: S3 gateway at");
    // The same bytes through the mount and through the gateway.
    assert_eq!(
        std::fs::read(up.path("data/x/y.txt")).unwrap(),
        b"through the mount and S3"
    );
    py_at(
        &endpoint,
        dir.path(),
        r#"
anon = client(unsigned=True)
assert anon.get_object(Bucket="data", Key="x/y.txt")["Body"].read() == b"through the mount and S3"
r = anon.list_objects_v2(Bucket="data", Delimiter="/")
assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["x/"], r
err(lambda: client("AKIDNOBODY", "x").get_object(Bucket="data", Key="x/y.txt"), "InvalidAccessKeyId", 403)
err(lambda: anon.get_object(Bucket="data", Key="missing"), "NoSuchKey", 404)
"#,
    );
    // The daemon serving the gateway counts its requests (`silt report`, docs/METRICS.md).
    assert_eq!(up.metric("silt_gateway_requests_total"), 4);
    assert_eq!(up.metric("silt_gateway_errors_total"), 2);
    assert_eq!(up.metric("silt_gateway_denied_total"), 1);
    assert_eq!(
        up.metric("silt_gateway_read_bytes_total"),
        b"through the mount and S3".len() as u64
    );
    up.stop();
}

#[test]
fn gateway_etag_is_the_stores_over_s3() {
    // An S3 store (a real versitygw): the gateway's ETag is the one the store gives.
    let fx = S3Fx::start(false);
    let big = bytes(11, 3 * 1024 * 1024 + 5);
    fx.put("obj.bin", &big);
    fx.put("sub/small", b"small object");
    let dir = tempfile::tempdir().unwrap();
    let up = fx.up(
        &["--gateway", "127.0.0.1:0", "--gateway-anonymous"],
        dir.path(),
    );
    let endpoint = endpoint_in(&up.log_text(), "silt: S3 gateway at");
    let expect = dir.path().join("expect.bin");
    std::fs::write(&expect, &big).unwrap();
    py_env(
        &endpoint,
        dir.path(),
        r#"
gw = client(unsigned=True)
store = boto3.client("s3", endpoint_url=os.environ["S3_EP"], region_name="us-east-1",
                     aws_access_key_id=os.environ["S3_AK"], aws_secret_access_key=os.environ["S3_SK"],
                     config=Config(s3={"addressing_style": "path"}))
big = open(os.environ["EXPECT"], "rb").read()
for key, size in [("obj.bin", len(big)), ("sub/small", 12)]:
    want = store.head_object(Bucket=os.environ["S3_BUCKET"], Key="ds/" + key)["ETag"]
    h = gw.head_object(Bucket="data", Key=key)
    assert h["ETag"] == want and h["ContentLength"] == size, (key, h["ETag"], want)
    r = gw.get_object(Bucket="data", Key=key, IfMatch=want)
    assert r["ETag"] == want
    body = r["Body"].read()
    assert len(body) == size and (key != "obj.bin" or body == big)
    err(lambda: gw.get_object(Bucket="data", Key=key, IfNoneMatch=want), "304", 304)
listed = {o["Key"]: o["ETag"] for o in gw.list_objects_v2(Bucket="data")["Contents"]}
stored = {o["Key"][3:]: o["ETag"] for o in store.list_objects_v2(Bucket=os.environ["S3_BUCKET"], Prefix="ds/")["Contents"]}
assert listed == stored, (listed, stored)
r = gw.get_object(Bucket="data", Key="obj.bin", Range="bytes=-7")
assert r["ContentRange"] == "bytes %d-%d/%d" % (len(big) - 7, len(big) - 1, len(big)) and r["Body"].read() == big[-7:]
"#,
        &[
            ("S3_EP", fx.server.endpoint().as_str()),
            ("S3_AK", fx.server.access_key()),
            ("S3_SK", fx.server.secret_key()),
            ("S3_BUCKET", BUCKET),
            ("EXPECT", expect.to_str().unwrap()),
        ],
    );
    up.stop();
}
