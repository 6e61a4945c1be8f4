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
    venv("pyvenv", "python")
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
         dict(StartAfter="a/y/z1"), dict(StartAfter="b"), dict(Prefix="nothing/"), dict(Prefix="top/"),
         # Prefixes no key can have (strings to S3: nothing matches, no error).
         dict(Prefix="../"), dict(Prefix="a/./"), dict(Prefix="a//"), dict(Prefix="/a"),
         dict(Prefix="../", Delimiter="/")]
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
# A read-write key, where the write rules allow no writes (the default, read-only): refused.
err(lambda: good.put_object(Bucket="data", Key="new", Body=b"x"), "AccessDenied", 403)
err(lambda: good.create_multipart_upload(Bucket="data", Key="new"), "AccessDenied", 403)

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
        own.log_text().contains("(single node of "),
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

/// Writes a file of `len` random bytes for Python to upload and compare with.
fn expect_file(dir: &Path, name: &str, seed: u64, len: usize) -> (PathBuf, Vec<u8>) {
    let data = bytes(seed, len);
    let p = dir.join(name);
    std::fs::write(&p, &data).unwrap();
    (p, data)
}

#[test]
fn gateway_writes_as_s3_does() {
    let keys = format!("{ACCESS} {SECRET} rw\n{RO_ACCESS} {RO_SECRET} ro data\n");
    let fx = Fx::start(
        &[("keep.txt", b"kept".to_vec()), ("f", b"a file".to_vec())],
        &["--write-type", "through"],
        Some(&keys),
    );
    let (mid, mid_bytes) = expect_file(fx.dir.path(), "mid.bin", 3, 5 * 1024 * 1024 + 17);
    // A link in the store to a directory outside it (as a dataset may hold one).
    let outside = fx.dir.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("secret"), b"not for S3").unwrap();
    std::os::unix::fs::symlink(&outside, fx.dir.path().join("store-data/out")).unwrap();
    fx.py(&format!(
        r#"
import base64, hashlib, zlib
s3 = client(os.environ["AK"], os.environ["SK"])
ro = client(os.environ["RO_AK"], os.environ["RO_SK"])
get = lambda k, b="data": s3.get_object(Bucket=b, Key=k)["Body"].read()

# A key may end in white space: its own object, never the trimmed key's (docs/SEMANTICS.md).
s3.put_object(Bucket="data", Key="sp ", Body=b"with a space")
assert get("sp ") == b"with a space"
err(lambda: get("sp"), "NoSuchKey", 404)
assert "sp " in [o["Key"] for o in s3.list_objects_v2(Bucket="data")["Contents"]]
s3.delete_object(Bucket="data", Key="sp ")
err(lambda: get("sp "), "NoSuchKey", 404)

# A link is an entry, never a way out of the store (docs/SECURITY.md): no key through it.
err(lambda: get("out/secret"), "NoSuchKey", 404)
try:
    s3.put_object(Bucket="data", Key="out/planted", Body=b"x")
    raise AssertionError("a PUT through a link succeeded")
except ClientError:
    pass

# PutObject: the ETag it answers is the one HEAD, GET and listings show.
r = s3.put_object(Bucket="data", Key="new/dir/x.txt", Body=b"hello S3 writes")
assert r["ResponseMetadata"]["HTTPStatusCode"] == 200, r
h = s3.head_object(Bucket="data", Key="new/dir/x.txt")
assert h["ETag"] == r["ETag"] and h["ContentLength"] == 15, (h, r)
assert get("new/dir/x.txt") == b"hello S3 writes"
l = s3.list_objects_v2(Bucket="data", Delimiter="/")
assert [p["Prefix"] for p in l["CommonPrefixes"]] == ["new/"], l
assert [o["Key"] for o in s3.list_objects_v2(Bucket="data", Prefix="new/")["Contents"]] == ["new/dir/x.txt"]
# A larger body (more than one read piece), replaced whole by a smaller one.
mid = open({mid:?}, "rb").read()
s3.put_object(Bucket="data", Key="mid.bin", Body=mid)
assert get("mid.bin") == mid
s3.put_object(Bucket="data", Key="mid.bin", Body=b"short")
assert get("mid.bin") == b"short"
s3.put_object(Bucket="data", Key="empty", Body=b"")
assert get("empty") == b"" and s3.head_object(Bucket="data", Key="empty")["ContentLength"] == 0

# Digests: a matching Content-MD5 or checksum is accepted, a wrong one refused (400
# BadDigest) and the key left as it was.
good_md5 = base64.b64encode(hashlib.md5(b"checked").digest()).decode()
s3.put_object(Bucket="data", Key="f", Body=b"checked", ContentMD5=good_md5)
assert get("f") == b"checked"
bad_md5 = base64.b64encode(hashlib.md5(b"other").digest()).decode()
err(lambda: s3.put_object(Bucket="data", Key="f", Body=b"changed", ContentMD5=bad_md5), "BadDigest", 400)
crc = base64.b64encode(zlib.crc32(b"changed").to_bytes(4, "big")).decode()
s3.put_object(Bucket="data", Key="g", Body=b"changed", ChecksumCRC32=crc)
assert get("g") == b"changed"
err(lambda: s3.put_object(Bucket="data", Key="f", Body=b"changed!", ChecksumCRC32=crc), "BadDigest", 400)
assert get("f") == b"checked"

# PUTs of one key racing: each is a whole-object upload, so the key ends up exactly one of
# the bodies, never a mix (docs/SEMANTICS.md, whole-object uploads).
import threading
for rnd in range(4):
    bodies = [bytes([rnd * 16 + i]) * (300000 + i * 7919) for i in range(8)]
    ts = [threading.Thread(target=s3.put_object, kwargs=dict(Bucket="data", Key="race", Body=b)) for b in bodies]
    for t in ts: t.start()
    for t in ts: t.join()
    got = get("race")
    assert got in bodies, (rnd, len(got), set(got))
s3.delete_object(Bucket="data", Key="race")

# Conditional writes.
err(lambda: s3.put_object(Bucket="data", Key="f", Body=b"x", IfNoneMatch="*"), "PreconditionFailed", 412)
s3.put_object(Bucket="data", Key="fresh", Body=b"first", IfNoneMatch="*")
assert get("fresh") == b"first" and get("f") == b"checked"

# Keys are paths: a key under a file, or a key that is a directory, conflicts (409).
err(lambda: s3.put_object(Bucket="data", Key="f/under", Body=b"x"), "KeyConflict", 409)
err(lambda: s3.put_object(Bucket="data", Key="new", Body=b"x"), "KeyConflict", 409)

# CopyObject, within a bucket and across buckets; its ETag is the new object's.
c = s3.copy_object(Bucket="data", Key="copies/f", CopySource={{"Bucket": "data", "Key": "f"}})
assert get("copies/f") == b"checked"
assert c["CopyObjectResult"]["ETag"] == s3.head_object(Bucket="data", Key="copies/f")["ETag"]
s3.copy_object(Bucket="other", Key="from-data", CopySource="data/mid.bin")
assert get("from-data", "other") == b"short"
err(lambda: s3.copy_object(Bucket="data", Key="c2", CopySource="data/missing"), "NoSuchKey", 404)
etag_f = s3.head_object(Bucket="data", Key="f")["ETag"]
err(lambda: s3.copy_object(Bucket="data", Key="c3", CopySource="data/f", CopySourceIfNoneMatch=etag_f), "PreconditionFailed", 412)
s3.copy_object(Bucket="data", Key="c3", CopySource="data/f", CopySourceIfMatch=etag_f)

# DeleteObject: 204 whether or not the key exists; the "directories" it empties go too.
assert s3.delete_object(Bucket="data", Key="new/dir/x.txt")["ResponseMetadata"]["HTTPStatusCode"] == 204
assert s3.delete_object(Bucket="data", Key="never/was")["ResponseMetadata"]["HTTPStatusCode"] == 204
err(lambda: s3.head_object(Bucket="data", Key="new/dir/x.txt"), "404", 404)
l = s3.list_objects_v2(Bucket="data", Delimiter="/")
assert "new/" not in [p["Prefix"] for p in l.get("CommonPrefixes", [])], l
# DeleteObjects: every key reported deleted, missing ones too (as S3 does).
d = s3.delete_objects(Bucket="data", Delete={{"Objects": [{{"Key": "c3"}}, {{"Key": "copies/f"}}, {{"Key": "nothing"}}]}})
assert sorted(o["Key"] for o in d["Deleted"]) == ["c3", "copies/f", "nothing"] and not d.get("Errors"), d
left = sorted(o["Key"] for o in s3.list_objects_v2(Bucket="data")["Contents"])
assert left == ["empty", "f", "fresh", "g", "keep.txt", "mid.bin"], left
d = s3.delete_objects(Bucket="data", Delete={{"Objects": [{{"Key": "g"}}], "Quiet": True}})
assert not d.get("Deleted") and not d.get("Errors"), d

# A read-only key writes nothing; a missing bucket is NoSuchBucket.
err(lambda: ro.put_object(Bucket="data", Key="ro", Body=b"x"), "AccessDenied", 403)
err(lambda: ro.delete_object(Bucket="data", Key="f"), "AccessDenied", 403)
err(lambda: ro.copy_object(Bucket="data", Key="ro", CopySource="data/f"), "AccessDenied", 403)
err(lambda: s3.put_object(Bucket="nosuchbucket", Key="x", Body=b"x"), "NoSuchBucket", 404)

# "Folder" markers (a key ending in /, empty): a directory here, listed as a common prefix;
# deleting one removes the directory when it is empty. A key no path can hold: 400.
s3.put_object(Bucket="data", Key="made/by/marker/", Body=b"")
l = s3.list_objects_v2(Bucket="data", Prefix="made/by/", Delimiter="/")
assert [p["Prefix"] for p in l["CommonPrefixes"]] == ["made/by/marker/"], l
err(lambda: s3.put_object(Bucket="data", Key="marker-with-body/", Body=b"x"), "InvalidArgument", 400)
err(lambda: s3.put_object(Bucket="data", Key="f/", Body=b""), "KeyConflict", 409)
s3.delete_object(Bucket="data", Key="made/by/marker/")
assert [p["Prefix"] for p in s3.list_objects_v2(Bucket="data", Prefix="made/by/", Delimiter="/").get("CommonPrefixes", [])] == []
err(lambda: s3.put_object(Bucket="data", Key="a/../b", Body=b"x"), "InvalidArgument", 400)
err(lambda: s3.put_object(Bucket="data", Key="a//b", Body=b"x"), "InvalidArgument", 400)

# A presigned PUT.
import urllib.request
url = s3.generate_presigned_url("put_object", Params={{"Bucket": "data", "Key": "presigned"}}, ExpiresIn=300)
rq = urllib.request.Request(url, data=b"via a presigned URL", method="PUT")
assert urllib.request.urlopen(rq).status == 200
assert get("presigned") == b"via a presigned URL"
"#
    ));
    // What S3 clients wrote is in the store, and the mount shows it.
    let store = fx.dir.path().join("store-data");
    assert_eq!(std::fs::read(store.join("f")).unwrap(), b"checked");
    assert_eq!(std::fs::read(store.join("mid.bin")).unwrap(), b"short");
    assert!(
        !store.join("new").exists(),
        "emptied directories are removed"
    );
    assert_eq!(
        std::fs::read(fx.dir.path().join("mnt/data/fresh")).unwrap(),
        b"first"
    );
    assert_eq!(
        std::fs::read(fx.dir.path().join("mnt/data/presigned")).unwrap(),
        b"via a presigned URL"
    );
    let left: Vec<_> = std::fs::read_dir(&outside)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["secret"], "written outside the store");
    let _ = mid_bytes;
}

#[test]
fn gateway_multipart_uploads_as_s3_does() {
    let keys = format!("{ACCESS} {SECRET} rw\n{RO_ACCESS} {RO_SECRET} ro data\n");
    let fx = Fx::start(&[], &["--write-type", "through"], Some(&keys));
    let (big, _) = expect_file(fx.dir.path(), "big.bin", 21, 100 * 1024 * 1024 + 7);
    let back = fx.dir.path().join("back.bin");
    fx.py(&format!(
        r#"
import hashlib
from boto3.s3.transfer import TransferConfig
s3 = client(os.environ["AK"], os.environ["SK"])
ro = client(os.environ["RO_AK"], os.environ["RO_SK"])
MiB = 1 << 20

# 100 MiB the way boto3 uploads large files: 13 parts of 8 MiB, 4 at a time.
cfg = TransferConfig(multipart_threshold=8 * MiB, multipart_chunksize=8 * MiB, max_concurrency=4)
s3.upload_file({big:?}, "data", "big/upload.bin", Config=cfg)
s3.download_file("data", "big/upload.bin", {back:?}, Config=cfg)
digest = lambda p: hashlib.sha256(open(p, "rb").read()).hexdigest()
assert digest({big:?}) == digest({back:?})
assert s3.head_object(Bucket="data", Key="big/upload.bin")["ContentLength"] == os.path.getsize({big:?})

# The API by hand: parts are ETagged with their MD5, listed, replaced, checked at completion.
p1, p2 = os.urandom(5 * MiB), b"the last part may be small"
u = s3.create_multipart_upload(Bucket="data", Key="mp/obj")["UploadId"]
e1 = s3.upload_part(Bucket="data", Key="mp/obj", UploadId=u, PartNumber=1, Body=os.urandom(5 * MiB))["ETag"]
e1 = s3.upload_part(Bucket="data", Key="mp/obj", UploadId=u, PartNumber=1, Body=p1)["ETag"]
assert e1 == '"%s"' % hashlib.md5(p1).hexdigest(), e1
e2 = s3.upload_part(Bucket="data", Key="mp/obj", UploadId=u, PartNumber=2, Body=p2)["ETag"]
parts = s3.list_parts(Bucket="data", Key="mp/obj", UploadId=u)["Parts"]
assert [(p["PartNumber"], p["ETag"], p["Size"]) for p in parts] == [(1, e1, len(p1)), (2, e2, len(p2))], parts
page = s3.list_parts(Bucket="data", Key="mp/obj", UploadId=u, MaxParts=1)
assert page["IsTruncated"] and [p["PartNumber"] for p in page["Parts"]] == [1], page
assert [p["PartNumber"] for p in s3.list_parts(Bucket="data", Key="mp/obj", UploadId=u, PartNumberMarker=page["NextPartNumberMarker"])["Parts"]] == [2]
ups = s3.list_multipart_uploads(Bucket="data")["Uploads"]
assert [(x["Key"], x["UploadId"]) for x in ups] == [("mp/obj", u)], ups
# Nothing is visible before the completion.
err(lambda: s3.head_object(Bucket="data", Key="mp/obj"), "404", 404)
done = lambda parts: s3.complete_multipart_upload(Bucket="data", Key="mp/obj", UploadId=u, MultipartUpload={{"Parts": parts}})
err(lambda: done([{{"PartNumber": 1, "ETag": e2}}, {{"PartNumber": 2, "ETag": e2}}]), "InvalidPart", 400)
err(lambda: done([{{"PartNumber": 2, "ETag": e2}}, {{"PartNumber": 1, "ETag": e1}}]), "InvalidPartOrder", 400)
err(lambda: done([{{"PartNumber": 2, "ETag": e2}}, {{"PartNumber": 3, "ETag": e2}}]), "InvalidPart", 400)
r = done([{{"PartNumber": 1, "ETag": e1}}, {{"PartNumber": 2, "ETag": e2}}])
assert r["ETag"] == s3.head_object(Bucket="data", Key="mp/obj")["ETag"], r
assert s3.get_object(Bucket="data", Key="mp/obj")["Body"].read() == p1 + p2
err(lambda: s3.list_parts(Bucket="data", Key="mp/obj", UploadId=u), "NoSuchUpload", 404)
assert not s3.list_multipart_uploads(Bucket="data").get("Uploads")

# A part too small before the last one; an abort; ids and part numbers that name nothing.
u = s3.create_multipart_upload(Bucket="data", Key="mp/small")["UploadId"]
a = s3.upload_part(Bucket="data", Key="mp/small", UploadId=u, PartNumber=1, Body=b"tiny")["ETag"]
b = s3.upload_part(Bucket="data", Key="mp/small", UploadId=u, PartNumber=2, Body=b"tiny too")["ETag"]
err(lambda: s3.complete_multipart_upload(Bucket="data", Key="mp/small", UploadId=u,
    MultipartUpload={{"Parts": [{{"PartNumber": 1, "ETag": a}}, {{"PartNumber": 2, "ETag": b}}]}}), "EntityTooSmall", 400)
err(lambda: s3.upload_part(Bucket="data", Key="mp/small", UploadId=u, PartNumber=10001, Body=b"x"), "InvalidArgument", 400)
err(lambda: s3.upload_part(Bucket="data", Key="other/key", UploadId=u, PartNumber=1, Body=b"x"), "NoSuchUpload", 404)
assert s3.abort_multipart_upload(Bucket="data", Key="mp/small", UploadId=u)["ResponseMetadata"]["HTTPStatusCode"] == 204
err(lambda: s3.upload_part(Bucket="data", Key="mp/small", UploadId=u, PartNumber=1, Body=b"x"), "NoSuchUpload", 404)
err(lambda: s3.abort_multipart_upload(Bucket="data", Key="mp/small", UploadId=u), "NoSuchUpload", 404)
err(lambda: s3.list_parts(Bucket="data", Key="mp/small", UploadId="../../etc"), "NoSuchUpload", 404)
err(lambda: s3.head_object(Bucket="data", Key="mp/small"), "404", 404)
err(lambda: ro.create_multipart_upload(Bucket="data", Key="mp/ro"), "AccessDenied", 403)
"#
    ));
    // The parts are gone once the uploads ended (a completed upload's answer stays a while,
    // `done-ID`, for a repeated Complete).
    let uploads = fx.dir.path().join("state/gateway/gateway-uploads");
    let left: Vec<_> = std::fs::read_dir(&uploads)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name())
                .filter(|n| !n.to_string_lossy().starts_with("done-"))
                .collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "uploads left behind: {left:?}");
}

/// A request answered before its body was read leaves the connection unusable: the client
/// may still send the body, or (told nothing after `Expect: 100-continue`, as boto3 sends
/// every part) never send it. Kept open, the next request was read from its second byte
/// (`UT /…`, signature mismatch) whenever boto3 reused the connection quickly, under load.
#[test]
fn gateway_closes_connections_whose_body_it_left_unread() {
    let keys = format!("{ACCESS} {SECRET} rw\n");
    let fx = Fx::start(&[], &["--write-type", "through"], Some(&keys));
    fx.py(
        r#"
import socket, urllib.parse
s3 = client(os.environ["AK"], os.environ["SK"])
ep = urllib.parse.urlsplit(EP)
host = f"{ep.hostname}:{ep.port}"

def answer(sock):
    """One response (a Content-Length body): (status, headers, body); None at end of stream."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            assert not buf, buf
            return None
        buf += chunk
    head, body = buf.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (l.split(":", 1) for l in lines[1:])}
    while len(body) < int(headers.get("content-length", "0")):
        chunk = sock.recv(65536)
        assert chunk, "cut off"
        body += chunk
    return int(lines[0].split()[1]), headers, body

def target(method, **params):
    u = urllib.parse.urlsplit(s3.generate_presigned_url(method, Params=params, ExpiresIn=300))
    return u.path + "?" + u.query

get = target("get_object", Bucket="data", Key="kept")

# A body read to its end: the connection carries the next request.
sock = socket.create_connection((ep.hostname, ep.port), timeout=60)
sock.sendall(f"PUT {target('put_object', Bucket='data', Key='kept')} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 3\r\n\r\nabc".encode())
status, headers, _ = answer(sock)
assert status == 200 and headers.get("connection") != "close", (status, headers)
sock.sendall(f"GET {get} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
status, headers, body = answer(sock)
assert (status, body) == (200, b"abc"), (status, headers, body)
sock.close()

# Refused before the body is read (a part number out of range, a request without
# credentials): the head alone, as boto3 sends it, then no body after the final answer.
u = s3.create_multipart_upload(Bucket="data", Key="mp")["UploadId"]
refused = [
    (target("upload_part", Bucket="data", Key="mp", UploadId=u, PartNumber=10001, Body=b""), 400),
    ("/data/mp?partNumber=1&uploadId=" + u, 403),
]
for path, expected in refused:
    sock = socket.create_connection((ep.hostname, ep.port), timeout=60)
    sock.sendall(f"PUT {path} HTTP/1.1\r\nHost: {host}\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n".encode())
    status, headers, _ = answer(sock)
    assert status == expected and headers.get("connection") == "close", (path, status, headers)
    # The next request on it is not answered: the server has closed it.
    try:
        sock.sendall(f"GET {get} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    except (BrokenPipeError, ConnectionResetError):
        pass
    assert answer(sock) is None, path
    sock.close()
s3.abort_multipart_upload(Bucket="data", Key="mp", UploadId=u)
"#,
    );
}

/// The venv holding the aws CLI and s3fs (`scripts/install-deps.sh`).
/// Runs the aws CLI against the gateway; returns its stdout, panics with its output on failure.
fn aws(endpoint: &str, home: &Path, args: &[&str]) -> String {
    let out = Command::new(venv("s3venv", "aws"))
        .arg("--endpoint-url")
        .arg(endpoint)
        .args(args)
        .env("AWS_ACCESS_KEY_ID", ACCESS)
        .env("AWS_SECRET_ACCESS_KEY", SECRET)
        .env("AWS_DEFAULT_REGION", "us-east-1")
        .env("AWS_CONFIG_FILE", home.join("aws-config"))
        .env("AWS_SHARED_CREDENTIALS_FILE", home.join("aws-credentials"))
        .env("HOME", home)
        .output()
        .unwrap_or_else(|e| panic!("running the aws CLI (scripts/install-deps.sh): {e}"));
    assert!(
        out.status.success(),
        "aws {args:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn gateway_serves_the_aws_cli_and_s3fs() {
    let keys = format!("{ACCESS} {SECRET} rw\n");
    let fx = Fx::start(
        &[
            ("ds/a.txt", b"alpha".to_vec()),
            ("ds/sub/b.txt", b"beta".to_vec()),
        ],
        &["--write-type", "through"],
        Some(&keys),
    );
    let ep = fx.endpoint.as_str();
    let home = fx.dir.path();
    // Listing, as `aws s3 ls` prints it.
    let ls = aws(ep, home, &["s3", "ls", "s3://data/ds/"]);
    assert!(ls.contains("PRE sub/") && ls.contains(" 5 a.txt"), "{ls}");
    let all = aws(ep, home, &["s3", "ls", "--recursive", "s3://data/"]);
    assert!(
        all.contains("ds/a.txt") && all.contains("ds/sub/b.txt"),
        "{all}"
    );
    // Up and down: a 20 MiB file goes up in parts (the CLI's threshold is 8 MiB).
    let (up, data) = expect_file(home, "up.bin", 5, 20 * 1024 * 1024 + 3);
    aws(
        ep,
        home,
        &["s3", "cp", up.to_str().unwrap(), "s3://data/up/x.bin"],
    );
    assert_eq!(
        std::fs::read(home.join("store-data/up/x.bin")).unwrap(),
        data
    );
    let down = home.join("down.bin");
    aws(
        ep,
        home,
        &["s3", "cp", "s3://data/up/x.bin", down.to_str().unwrap()],
    );
    assert_eq!(std::fs::read(&down).unwrap(), data);
    // A tree: sync up, server-side copy, recursive delete.
    let tree = home.join("tree");
    write(&tree, &[("t1", b"one".to_vec()), ("d/t2", b"two".to_vec())]);
    aws(
        ep,
        home,
        &["s3", "sync", tree.to_str().unwrap(), "s3://data/tree/"],
    );
    aws(
        ep,
        home,
        &["s3", "cp", "s3://data/tree/t1", "s3://other/t1-copy"],
    );
    assert_eq!(
        std::fs::read(home.join("store-other/t1-copy")).unwrap(),
        b"one"
    );
    let head = aws(
        ep,
        home,
        &[
            "s3api",
            "head-object",
            "--bucket",
            "data",
            "--key",
            "tree/d/t2",
        ],
    );
    assert!(head.contains("\"ContentLength\": 3"), "{head}");
    aws(ep, home, &["s3", "rm", "--recursive", "s3://data/tree/"]);
    assert!(!home.join("store-data/tree").exists());

    // The rest of the API through `aws s3api`, each answer checked as JSON.
    let api = |args: &[&str]| -> serde_json::Value {
        let mut all = vec!["s3api"];
        all.extend_from_slice(args);
        let out = aws(ep, home, &all);
        if out.trim().is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::from_str(&out).unwrap_or_else(|e| panic!("aws {args:?}: {e}: {out}"))
        }
    };
    api(&["head-bucket", "--bucket", "data"]);
    let small = home.join("small.txt");
    std::fs::write(&small, b"0123456789").unwrap();
    let put = api(&[
        "put-object",
        "--bucket",
        "data",
        "--key",
        "api/o",
        "--body",
        small.to_str().unwrap(),
    ]);
    let etag = put["ETag"].as_str().unwrap().to_string();
    let got = home.join("got.txt");
    let r = api(&[
        "get-object",
        "--bucket",
        "data",
        "--key",
        "api/o",
        "--range",
        "bytes=2-5",
        got.to_str().unwrap(),
    ]);
    assert_eq!(r["ContentRange"], "bytes 2-5/10", "{r}");
    assert_eq!(std::fs::read(&got).unwrap(), b"2345");
    assert_eq!(
        api(&["head-object", "--bucket", "data", "--key", "api/o"])["ETag"],
        etag.as_str()
    );
    api(&[
        "copy-object",
        "--bucket",
        "data",
        "--key",
        "api/copy",
        "--copy-source",
        "data/api/o",
    ]);
    let v1 = api(&[
        "list-objects",
        "--bucket",
        "data",
        "--prefix",
        "api/",
        "--delimiter",
        "/",
    ]);
    let keys: Vec<_> = v1["Contents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["Key"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(keys, ["api/copy", "api/o"], "{v1}");
    // Pages of one key: the CLI follows the continuation tokens itself; --max-items stops it.
    let page = api(&[
        "list-objects-v2",
        "--bucket",
        "data",
        "--prefix",
        "api/",
        "--page-size",
        "1",
        "--max-items",
        "1",
    ]);
    assert_eq!(page["Contents"].as_array().unwrap().len(), 1, "{page}");
    assert!(page["NextToken"].is_string(), "{page}");
    let mp = api(&[
        "create-multipart-upload",
        "--bucket",
        "data",
        "--key",
        "api/mp",
    ]);
    let id = mp["UploadId"].as_str().unwrap().to_string();
    let part = api(&[
        "upload-part",
        "--bucket",
        "data",
        "--key",
        "api/mp",
        "--upload-id",
        &id,
        "--part-number",
        "1",
        "--body",
        small.to_str().unwrap(),
    ]);
    let parts = api(&[
        "list-parts",
        "--bucket",
        "data",
        "--key",
        "api/mp",
        "--upload-id",
        &id,
    ]);
    assert_eq!(parts["Parts"][0]["ETag"], part["ETag"], "{parts}");
    let done = format!(
        r#"{{"Parts":[{{"PartNumber":1,"ETag":{}}}]}}"#,
        part["ETag"]
    );
    api(&[
        "complete-multipart-upload",
        "--bucket",
        "data",
        "--key",
        "api/mp",
        "--upload-id",
        &id,
        "--multipart-upload",
        &done,
    ]);
    assert_eq!(
        std::fs::read(home.join("store-data/api/mp")).unwrap(),
        b"0123456789"
    );
    let mp2 = api(&[
        "create-multipart-upload",
        "--bucket",
        "data",
        "--key",
        "api/mp2",
    ]);
    let id2 = mp2["UploadId"].as_str().unwrap().to_string();
    let ups = api(&["list-multipart-uploads", "--bucket", "data"]);
    assert_eq!(ups["Uploads"][0]["UploadId"], id2.as_str(), "{ups}");
    api(&[
        "abort-multipart-upload",
        "--bucket",
        "data",
        "--key",
        "api/mp2",
        "--upload-id",
        &id2,
    ]);
    let del = api(&[
        "delete-objects",
        "--bucket",
        "data",
        "--delete",
        r#"{"Objects":[{"Key":"api/o"},{"Key":"api/copy"},{"Key":"api/mp"}]}"#,
    ]);
    assert_eq!(del["Deleted"].as_array().unwrap().len(), 3, "{del}");
    api(&["delete-object", "--bucket", "data", "--key", "api/none"]);
    assert!(!home.join("store-data/api").exists());
    // A presigned URL the CLI makes, fetched without credentials.
    let url = aws(
        ep,
        home,
        &["s3", "presign", "s3://data/ds/a.txt", "--expires-in", "60"],
    );
    let out = Command::new(venv("s3venv", "python"))
        .args(["-c", "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1]).read().decode())"])
        .arg(url.trim())
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "alpha",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // s3fs, the fsspec S3 filesystem: listing, whole and ranged reads, writes.
    let script = home.join("s3fs_check.py");
    std::fs::write(
        &script,
        r#"
import os, s3fs
fs = s3fs.S3FileSystem(key=os.environ["AK"], secret=os.environ["SK"],
                       client_kwargs={"endpoint_url": os.environ["GW"], "region_name": "us-east-1"})
assert sorted(fs.ls("data/ds")) == ["data/ds/a.txt", "data/ds/sub"], fs.ls("data/ds")
assert fs.cat("data/ds/a.txt") == b"alpha"
with fs.open("data/up/x.bin", "rb", block_size=1 << 20) as f:
    f.seek(12345)
    part = f.read(100)
want = open(os.environ["EXPECT"], "rb").read()
assert part == want[12345:12445]
assert fs.info("data/up/x.bin")["size"] == len(want)
fs.pipe("data/from-s3fs/p.txt", b"piped")
assert fs.cat("data/from-s3fs/p.txt") == b"piped"
fs.rm("data/from-s3fs/p.txt")
assert not fs.exists("data/from-s3fs/p.txt")
print("ok")
"#,
    )
    .unwrap();
    let out = Command::new(venv("s3venv", "python"))
        .arg(&script)
        .env("GW", ep)
        .env("AK", ACCESS)
        .env("SK", SECRET)
        .env("EXPECT", up.to_str().unwrap())
        .output()
        .unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).ends_with("ok\n"),
        "s3fs check failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A self-signed certificate for 127.0.0.1, `s3.local` and `*.s3.local` (openssl).
fn self_signed(dir: &Path) -> (PathBuf, PathBuf) {
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let out = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
        ])
        .args(["-nodes", "-days", "2", "-subj", "/CN=s3.local"])
        .args([
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:s3.local,DNS:*.s3.local",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl (scripts/install-deps.sh)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    (cert, key)
}

#[test]
fn gateway_serves_tls_virtual_hosts_and_aws_chunked_bodies() {
    let certs = tempfile::tempdir().unwrap();
    let (cert, key) = self_signed(certs.path());
    let keys = format!("{ACCESS} {SECRET} rw\n");
    let fx = Fx::start(
        &[("a.txt", b"over TLS".to_vec())],
        &[
            "--write-type",
            "through",
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
            "--domain",
            "s3.local",
        ],
        Some(&keys),
    );
    assert!(
        fx.endpoint.starts_with("https://127.0.0.1:"),
        "{}",
        fx.endpoint
    );
    fx.py(&format!(
        r#"
import io, socket, urllib.request, ssl
# *.s3.local is this host (the test's own resolver; no DNS is involved).
real = socket.getaddrinfo
def local(host, *a, **k):
    if host == "s3.local" or host.endswith(".s3.local"):
        host = "127.0.0.1"
    return real(host, *a, **k)
socket.getaddrinfo = local
port = EP.rsplit(":", 1)[1]
CERT = {cert:?}
def tls_client(endpoint, style):
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", verify=CERT,
                        aws_access_key_id=os.environ["AK"], aws_secret_access_key=os.environ["SK"],
                        config=Config(s3={{"addressing_style": style}}, retries={{"max_attempts": 1}}))
path = tls_client(EP, "path")
assert path.get_object(Bucket="data", Key="a.txt")["Body"].read() == b"over TLS"

# Virtual-host style: the bucket in the host name.
vh = tls_client("https://s3.local:%s" % port, "virtual")
sent = []
vh.meta.events.register("before-send.s3.PutObject",
    lambda request, **kw: sent.append((request.url, request.headers.get("Content-Encoding"),
                                       request.headers.get("X-Amz-Content-SHA256"))))
body = os.urandom(300000)
# Over HTTPS boto3 streams a body aws-chunked, its CRC32 in a trailer.
vh.put_object(Bucket="data", Key="chunked.bin", Body=io.BytesIO(body))
url, enc, sha = sent[-1]
assert url.startswith("https://data.s3.local:%s/chunked.bin" % port), sent
assert enc is not None and "aws-chunked" in str(enc) and "TRAILER" in str(sha), sent
assert vh.get_object(Bucket="data", Key="chunked.bin")["Body"].read() == body
assert path.get_object(Bucket="data", Key="chunked.bin")["Body"].read() == body
assert [b["Name"] for b in vh.list_buckets()["Buckets"]] == ["data", "other"]
assert "chunked.bin" in [o["Key"] for o in vh.list_objects_v2(Bucket="data")["Contents"]]

# A client that does not trust the certificate, or speaks plain HTTP, gets nothing.
try:
    boto3.client("s3", endpoint_url=EP, region_name="us-east-1", aws_access_key_id="x",
                 aws_secret_access_key="x", config=Config(retries={{"max_attempts": 1}})).list_buckets()
    raise AssertionError("an untrusted certificate was accepted")
except botocore.exceptions.SSLError:
    pass
try:
    urllib.request.urlopen("http://127.0.0.1:%s/" % port, timeout=20)
    raise AssertionError("plain HTTP was answered")
except AssertionError:
    raise
except Exception:
    pass
"#
    ));
    assert_eq!(
        std::fs::read(fx.dir.path().join("store-data/chunked.bin"))
            .unwrap()
            .len(),
        300000
    );
}

#[test]
fn gateway_keeps_the_old_object_when_a_body_is_bad_or_cut_off() {
    let keys = format!("{ACCESS} {SECRET} rw\n");
    let fx = Fx::start(
        &[("k", b"the old object".to_vec())],
        &["--write-type", "through"],
        Some(&keys),
    );
    fx.py(
        r#"
import socket, zlib, base64, http.client
from urllib.parse import urlparse
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
u = urlparse(EP)
s3 = client(os.environ["AK"], os.environ["SK"])
old = lambda: s3.get_object(Bucket="data", Key="k")["Body"].read()

def signed(method, path, headers, trailer=False):
    """Headers of a request signed as botocore signs (the payload hash as given)."""
    r = AWSRequest(method=method, url=EP + path, headers=headers)
    if trailer:
        r.context["checksum"] = {"request_algorithm": {"in": "trailer", "algorithm": "crc32", "name": "x-amz-checksum-crc32"}}
    else:
        r.context["payload_signing_enabled"] = False
    S3SigV4Auth(Credentials(os.environ["AK"], os.environ["SK"]), "s3", "us-east-1").add_auth(r)
    return dict(r.headers.items())

def send(method, path, headers, body):
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    c.request(method, path, body=body, headers=headers)
    r = c.getresponse()
    return r.status, r.read()

def chunked(data, trailer_value):
    return b"%x\r\n" % len(data) + data + b"\r\n0\r\nx-amz-checksum-crc32:" + trailer_value + b"\r\n\r\n"

data = b"a new object, aws-chunked"
crc = base64.b64encode(zlib.crc32(data).to_bytes(4, "big"))
def put_chunked(trailer_value):
    body = chunked(data, trailer_value)
    h = signed("PUT", "/data/k", {"Content-Encoding": "aws-chunked", "X-Amz-Trailer": "x-amz-checksum-crc32",
                                  "X-Amz-Decoded-Content-Length": str(len(data)), "Content-Length": str(len(body))}, trailer=True)
    assert h["X-Amz-Content-SHA256"] == "STREAMING-UNSIGNED-PAYLOAD-TRAILER", h
    return send("PUT", "/data/k", h, body)

# A trailer checksum that does not match the bytes: 400 BadDigest, the old object stays.
wrong = base64.b64encode(zlib.crc32(b"other").to_bytes(4, "big"))
status, text = put_chunked(wrong)
assert status == 400 and b"BadDigest" in text, (status, text)
assert old() == b"the old object"

# A body shorter than its Content-Length (the client goes away): nothing changes.
h = signed("PUT", "/data/k", {"Content-Length": "1000000"})
sock = socket.create_connection((u.hostname, u.port))
head = "PUT /data/k HTTP/1.1\r\nHost: %s\r\n" % u.netloc + "".join("%s: %s\r\n" % kv for kv in h.items() if kv[0].lower() != "host") + "\r\n"
sock.sendall(head.encode() + b"x" * 400000)
sock.shutdown(socket.SHUT_WR)
sock.recv(65536)
sock.close()
assert old() == b"the old object"
# An aws-chunked body cut off before its last chunk: nothing changes either.
h = signed("PUT", "/data/k", {"Content-Encoding": "aws-chunked", "X-Amz-Trailer": "x-amz-checksum-crc32",
                              "X-Amz-Decoded-Content-Length": "500000", "Content-Length": "500100"}, trailer=True)
sock = socket.create_connection((u.hostname, u.port))
head = "PUT /data/k HTTP/1.1\r\nHost: %s\r\n" % u.netloc + "".join("%s: %s\r\n" % kv for kv in h.items() if kv[0].lower() != "host") + "\r\n"
sock.sendall(head.encode() + b"%x\r\n" % 500000 + b"y" * 1000)
sock.shutdown(socket.SHUT_WR)
sock.recv(65536)
sock.close()
assert old() == b"the old object"
# A Content-MD5 that is not an MD5: 400 InvalidDigest.
err(lambda: s3.put_object(Bucket="data", Key="k", Body=b"x", ContentMD5="bm90IGFuIG1kNQ=="), "InvalidDigest", 400)

# The same aws-chunked request with the right checksum is taken.
status, text = put_chunked(crc)
assert status == 200, (status, text)
assert old() == data

# Signed chunks (STREAMING-AWS4-HMAC-SHA256-PAYLOAD, SigV4 by hand as the spec gives it): each
# chunk's signature chains from the one before; a chunk changed after signing is refused.
import hashlib, hmac, datetime
H = lambda b: hashlib.sha256(b).hexdigest()
mac = lambda k, m: hmac.new(k, m.encode() if isinstance(m, str) else m, hashlib.sha256)
def signed_chunked(payload, tamper=False):
    amz = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    scope = amz[:8] + "/us-east-1/s3/aws4_request"
    key = ("AWS4" + os.environ["SK"]).encode()
    for part in (amz[:8], "us-east-1", "s3", "aws4_request"):
        key = mac(key, part).digest()
    chunks = [payload[i:i + 65536] for i in range(0, len(payload), 65536)] + [b""]
    length = sum(len(b"%x;chunk-signature=" % len(c)) + 64 + 2 + len(c) + 2 for c in chunks)
    hs = {"host": u.netloc, "x-amz-date": amz, "x-amz-content-sha256": "STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
          "content-encoding": "aws-chunked", "x-amz-decoded-content-length": str(len(payload)),
          "content-length": str(length)}
    names = ";".join(sorted(hs))
    canonical = "PUT\n/data/signed\n\n" + "".join("%s:%s\n" % (k, hs[k]) for k in sorted(hs)) + "\n" + names + "\nSTREAMING-AWS4-HMAC-SHA256-PAYLOAD"
    prev = mac(key, "AWS4-HMAC-SHA256\n%s\n%s\n%s" % (amz, scope, H(canonical.encode()))).hexdigest()
    hs["authorization"] = "AWS4-HMAC-SHA256 Credential=%s/%s, SignedHeaders=%s, Signature=%s" % (os.environ["AK"], scope, names, prev)
    body = b""
    for i, c in enumerate(chunks):
        prev = mac(key, "AWS4-HMAC-SHA256-PAYLOAD\n%s\n%s\n%s\n%s\n%s" % (amz, scope, prev, H(b""), H(c))).hexdigest()
        if tamper and i == 1:
            c = bytes([c[0] ^ 1]) + c[1:]
        body += b"%x;chunk-signature=%s\r\n" % (len(c), prev.encode()) + c + b"\r\n"
    del hs["host"]
    return send("PUT", "/data/signed", hs, body)
payload = os.urandom(200000)
status, text = signed_chunked(payload, tamper=True)
assert status == 403 and b"SignatureDoesNotMatch" in text, (status, text)
err(lambda: s3.head_object(Bucket="data", Key="signed"), "404", 404)
status, text = signed_chunked(payload)
assert status == 200, (status, text)
assert s3.get_object(Bucket="data", Key="signed")["Body"].read() == payload
"#,
    );
}

#[test]
fn gateway_lets_go_of_a_client_that_never_finishes_its_request() {
    let fx = Fx::start(&[("x", b"x".to_vec())], &["--anonymous"], None);
    let addr = fx.endpoint.trim_start_matches("http://").to_string();
    // Half a request head, then nothing: the gateway must close the connection (after its
    // header timeout) instead of holding it open for ever.
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    use std::io::{Read, Write};
    s.write_all(b"GET /data/x HTTP/1.1\r\nHost: ").unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(180)))
        .unwrap();
    let mut rest = Vec::new();
    match s.read_to_end(&mut rest) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("the connection was not closed: {e}"),
    }
    assert!(
        !String::from_utf8_lossy(&rest).contains(" 200 "),
        "answered a request it never received whole"
    );
    // The gateway still serves whole requests.
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    let (status, body) = raw_get(&mut s, &addr, "/data/x", |_| {}).unwrap();
    assert_eq!((status, body.as_slice()), (200, &b"x"[..]));
}

#[test]
fn gateway_serves_200_concurrent_clients() {
    let files: Vec<(String, Vec<u8>)> = (0..20)
        .map(|i| {
            (
                format!("c/{i:02}.bin"),
                bytes(500 + i, 50_000 + 4099 * i as usize),
            )
        })
        .collect();
    let refs: Vec<(&str, Vec<u8>)> = files.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    let fx = Fx::start(&refs, &["--anonymous"], None);
    let addr = fx.endpoint.trim_start_matches("http://").to_string();
    let files = std::sync::Arc::new(files);
    // 200 connections open at once, then 200 GETs on them together.
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(200));
    let clients: Vec<_> = (0..200)
        .map(|i| {
            let (addr, files, barrier) = (addr.clone(), files.clone(), barrier.clone());
            std::thread::spawn(move || {
                let mut s = std::net::TcpStream::connect(&addr).expect("connect");
                s.set_read_timeout(Some(std::time::Duration::from_secs(120)))
                    .unwrap();
                barrier.wait();
                let (key, want) = &files[i % files.len()];
                let (status, body) = raw_get(&mut s, &addr, &format!("/data/{key}"), |_| {})
                    .unwrap_or_else(|e| panic!("client {i}: {e}"));
                assert_eq!(status, 200, "client {i}");
                assert!(body == *want, "client {i}: the bytes of {key} differ");
            })
        })
        .collect();
    for c in clients {
        c.join().expect("a client failed");
    }
}

/// What S3 clients store with an object besides its bytes, checked against the S3 API
/// reference: user metadata and the standard headers (PutObject, CopyObject's `COPY` and
/// `REPLACE`, a multipart upload's initiation), checksums (a PUT's, a multipart upload's
/// composite SHA-256 and full-object CRC32, returned only with `ChecksumMode=ENABLED`),
/// GetObjectAttributes, and `partNumber` GETs and HEADs.
const METADATA_CHECK: &str = r#"
import base64, hashlib, zlib
s3 = client(os.environ["AK"], os.environ["SK"])
B = "data"
b64 = lambda b: base64.b64encode(b).decode()
when = datetime.datetime(2044, 12, 1, 16, 0, 0, tzinfo=datetime.timezone.utc)
body = b"a,b\n1,2\n"
r = s3.put_object(Bucket=B, Key="m/a.csv", Body=body, ContentType="text/csv",
                  CacheControl="max-age=60", ContentDisposition='attachment; filename="a.csv"',
                  ContentEncoding="identity", ContentLanguage="de-CH", Expires=when,
                  Metadata={"Owner": "etl", "k-2": "v 2"}, ChecksumAlgorithm="SHA256")
sha = b64(hashlib.sha256(body).digest())
assert r["ChecksumSHA256"] == sha, r
def same_headers(h, what):
    assert h["ContentType"] == "text/csv", (what, h)
    assert h["CacheControl"] == "max-age=60", (what, h)
    assert h["ContentDisposition"] == 'attachment; filename="a.csv"', (what, h)
    assert h["ContentEncoding"] == "identity", (what, h)
    assert h["ContentLanguage"] == "de-CH", (what, h)
    assert h["Expires"] == when, (what, h)
    # x-amz-meta-* names come back in lower case (HTTP headers are case-insensitive).
    assert h["Metadata"] == {"owner": "etl", "k-2": "v 2"}, (what, h)
h = s3.head_object(Bucket=B, Key="m/a.csv", ChecksumMode="ENABLED")
same_headers(h, "HEAD")
assert h["ChecksumSHA256"] == sha and h.get("ChecksumType") == "FULL_OBJECT", h
g = s3.get_object(Bucket=B, Key="m/a.csv", ChecksumMode="ENABLED")
same_headers(g, "GET")
assert g["Body"].read() == body and g["ChecksumSHA256"] == sha
# Checksums only when asked for; never for a range (not the range's checksum).
assert "ChecksumSHA256" not in s3.head_object(Bucket=B, Key="m/a.csv")
assert "ChecksumSHA256" not in s3.get_object(Bucket=B, Key="m/a.csv", Range="bytes=0-1", ChecksumMode="ENABLED")
# response-* parameters override what is stored.
g = s3.get_object(Bucket=B, Key="m/a.csv", ResponseContentType="text/plain", ResponseCacheControl="no-store")
assert g["ContentType"] == "text/plain" and g["CacheControl"] == "no-store", g
# An object written without any: application/octet-stream (or the store's own default), nothing else.
s3.put_object(Bucket=B, Key="m/plain", Body=b"x")
h = s3.head_object(Bucket=B, Key="m/plain")
assert h["ContentType"].endswith("/octet-stream") and h["Metadata"] == {} and "CacheControl" not in h, h

# CopyObject: COPY (the default) keeps them, REPLACE takes the request's.
s3.copy_object(Bucket=B, Key="m/copy.csv", CopySource={"Bucket": B, "Key": "m/a.csv"})
h = s3.head_object(Bucket=B, Key="m/copy.csv", ChecksumMode="ENABLED")
same_headers(h, "COPY")
assert h["ChecksumSHA256"] == sha, h
s3.copy_object(Bucket=B, Key="m/repl.csv", CopySource={"Bucket": B, "Key": "m/a.csv"},
               MetadataDirective="REPLACE", ContentType="text/plain", Metadata={"x": "1"})
h = s3.head_object(Bucket=B, Key="m/repl.csv")
assert h["ContentType"] == "text/plain" and h["Metadata"] == {"x": "1"}, h
assert "CacheControl" not in h and "ContentLanguage" not in h, h
# REPLACE onto itself changes the metadata of the object (how s3fs's setxattrs works).
s3.copy_object(Bucket=B, Key="m/repl.csv", CopySource={"Bucket": B, "Key": "m/repl.csv"},
               MetadataDirective="REPLACE", Metadata={"x": "2"})
assert s3.head_object(Bucket=B, Key="m/repl.csv")["Metadata"] == {"x": "2"}
assert s3.get_object(Bucket=B, Key="m/repl.csv")["Body"].read() == body

# A multipart upload: metadata given at its initiation, a composite SHA-256 of its parts.
parts = [os.urandom(5 << 20), os.urandom(5 << 20), b"tail"]
mp = s3.create_multipart_upload(Bucket=B, Key="m/big", ContentType="application/x-tar",
                                Metadata={"set": "train"}, ChecksumAlgorithm="SHA256")
done = []
for n, p in enumerate(parts, 1):
    u = s3.upload_part(Bucket=B, Key="m/big", UploadId=mp["UploadId"], PartNumber=n, Body=p,
                       ChecksumAlgorithm="SHA256")
    assert u["ChecksumSHA256"] == b64(hashlib.sha256(p).digest()), u
    done.append({"PartNumber": n, "ETag": u["ETag"], "ChecksumSHA256": u["ChecksumSHA256"]})
c = s3.complete_multipart_upload(Bucket=B, Key="m/big", UploadId=mp["UploadId"],
                                 MultipartUpload={"Parts": done})
composite = b64(hashlib.sha256(b"".join(hashlib.sha256(p).digest() for p in parts)).digest()) + "-3"
assert c["ChecksumSHA256"] == composite, (c, composite)
h = s3.head_object(Bucket=B, Key="m/big", ChecksumMode="ENABLED")
assert h["ContentType"] == "application/x-tar" and h["Metadata"] == {"set": "train"}, h
assert h["ChecksumSHA256"] == composite and h["ChecksumType"] == "COMPOSITE", h
total = sum(len(p) for p in parts)
assert h["ContentLength"] == total

# partNumber: each part of a multipart object, with the part count (206, as S3 answers).
r = s3.get_object(Bucket=B, Key="m/big", PartNumber=2)
assert r["ResponseMetadata"]["HTTPStatusCode"] == 206 and r["PartsCount"] == 3, r
assert r["ContentRange"] == "bytes %d-%d/%d" % (5 << 20, (10 << 20) - 1, total), r
assert r["Body"].read() == parts[1]
h = s3.head_object(Bucket=B, Key="m/big", PartNumber=3)
assert h["ContentLength"] == 4 and h["PartsCount"] == 3, h
err(lambda: s3.get_object(Bucket=B, Key="m/big", PartNumber=4), "InvalidPartNumber", 416)
err(lambda: s3.get_object(Bucket=B, Key="m/big", PartNumber=1, Range="bytes=0-1"), "InvalidRequest", 400)
# An object uploaded whole is its part 1.
r = s3.get_object(Bucket=B, Key="m/a.csv", PartNumber=1)
assert r["Body"].read() == body and r["ContentLength"] == len(body), r
err(lambda: s3.get_object(Bucket=B, Key="m/a.csv", PartNumber=2), "InvalidPartNumber", 416)

# A full-object CRC32 of a multipart upload: the CRC of all its bytes.
mp = s3.create_multipart_upload(Bucket=B, Key="m/crc", ChecksumAlgorithm="CRC32", ChecksumType="FULL_OBJECT")
done = []
for n, p in enumerate(parts, 1):
    u = s3.upload_part(Bucket=B, Key="m/crc", UploadId=mp["UploadId"], PartNumber=n, Body=p,
                       ChecksumAlgorithm="CRC32")
    done.append({"PartNumber": n, "ETag": u["ETag"], "ChecksumCRC32": u["ChecksumCRC32"]})
c = s3.complete_multipart_upload(Bucket=B, Key="m/crc", UploadId=mp["UploadId"],
                                 MultipartUpload={"Parts": done})
full = b64(zlib.crc32(b"".join(parts)).to_bytes(4, "big"))
assert c["ChecksumCRC32"] == full and c["ChecksumType"] == "FULL_OBJECT", (c, full)
# SHA-256 checksums of a multipart upload are composite only (400, as S3 answers).
err(lambda: s3.create_multipart_upload(Bucket=B, Key="m/bad", ChecksumAlgorithm="SHA256", ChecksumType="FULL_OBJECT"), "InvalidRequest", 400)

# GetObjectAttributes.
etag = s3.head_object(Bucket=B, Key="m/big")["ETag"].strip('"')
a = s3.get_object_attributes(Bucket=B, Key="m/big",
                             ObjectAttributes=["ETag", "Checksum", "ObjectParts", "StorageClass", "ObjectSize"])
assert a["ETag"].strip('"') == etag and a["ObjectSize"] == total and a["StorageClass"] == "STANDARD", a
assert a["Checksum"]["ChecksumSHA256"] == composite, a
op = a["ObjectParts"]
assert op["TotalPartsCount"] == 3 and [p["Size"] for p in op["Parts"]] == [len(p) for p in parts], a
assert [p["PartNumber"] for p in op["Parts"]] == [1, 2, 3] and not op["IsTruncated"], a
a = s3.get_object_attributes(Bucket=B, Key="m/big", ObjectAttributes=["ObjectParts"], MaxParts=2)
assert a["ObjectParts"]["IsTruncated"] and a["ObjectParts"]["NextPartNumberMarker"] == 2, a
a = s3.get_object_attributes(Bucket=B, Key="m/big", ObjectAttributes=["ObjectParts"], PartNumberMarker=2)
assert [p["PartNumber"] for p in a["ObjectParts"]["Parts"]] == [3], a
a = s3.get_object_attributes(Bucket=B, Key="m/a.csv", ObjectAttributes=["ObjectParts", "ObjectSize", "Checksum"])
assert "ObjectParts" not in a and a["ObjectSize"] == len(body) and a["Checksum"]["ChecksumSHA256"] == sha, a
err(lambda: s3.get_object_attributes(Bucket=B, Key="m/none", ObjectAttributes=["ETag"]), "NoSuchKey", 404)
"#;

/// The same through the aws CLI and s3fs (fsspec's S3 filesystem).
const METADATA_CLI_CHECK: &str = r#"
import os, s3fs
fs = s3fs.S3FileSystem(key=os.environ["AK"], secret=os.environ["SK"],
                       client_kwargs={"endpoint_url": os.environ["GW"], "region_name": "us-east-1"})
fs.pipe("data/m/s3fs.txt", b"from s3fs")
fs.setxattr("data/m/s3fs.txt", color="blue")
assert fs.getxattr("data/m/s3fs.txt", "color") == "blue", fs.metadata("data/m/s3fs.txt")
assert fs.cat("data/m/s3fs.txt") == b"from s3fs"
print("ok")
"#;

/// Runs the metadata checks against a `silt up --gateway` over `/data` = `uri`, then looks
/// at what the mount (`user.s3.*` extended attributes) shows; `store_check` then looks at the
/// store itself.
fn check_metadata(up: &Silt, dir: &Path, env: &[(&str, &str)]) -> String {
    let endpoint = endpoint_in(&up.log_text(), "silt: S3 gateway at");
    py_env(&endpoint, dir, METADATA_CHECK, env);
    // Under `back` (kept in the write-ahead log until uploaded) and `cache-only` (never in
    // the store) too.
    py_env(
        &endpoint,
        dir,
        r#"
s3 = client(os.environ["AK"], os.environ["SK"])
for key in ["wb/x.json", "co/x.json"]:
    s3.put_object(Bucket="data", Key=key, Body=b"{}", ContentType="application/json", Metadata={"w": key[:2]})
    h = s3.head_object(Bucket="data", Key=key)
    assert h["ContentType"] == "application/json" and h["Metadata"] == {"w": key[:2]}, (key, h)
"#,
        env,
    );
    let o = up.cli(&["fs", "persist", "/data/wb"]);
    assert!(o.status.success(), "persist: {}", stderr(&o));
    aws(
        &endpoint,
        dir,
        &[
            "s3",
            "cp",
            dir.join("check.py").to_str().unwrap(),
            "s3://data/m/cli.txt",
            "--content-type",
            "text/x-python",
            "--metadata",
            "team=ml,stage=raw",
        ],
    );
    let h = aws(
        &endpoint,
        dir,
        &[
            "s3api",
            "head-object",
            "--bucket",
            "data",
            "--key",
            "m/cli.txt",
        ],
    );
    let h: serde_json::Value = serde_json::from_str(&h).unwrap();
    assert_eq!(h["ContentType"], "text/x-python", "{h}");
    assert_eq!(h["Metadata"]["team"], "ml", "{h}");
    assert_eq!(h["Metadata"]["stage"], "raw", "{h}");
    let script = dir.join("s3fs_meta.py");
    std::fs::write(&script, METADATA_CLI_CHECK).unwrap();
    let out = Command::new(venv("s3venv", "python"))
        .arg(&script)
        .env("GW", &endpoint)
        .env("AK", ACCESS)
        .env("SK", SECRET)
        .output()
        .unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).ends_with("ok\n"),
        "s3fs check failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The mount shows them as `user.s3.*` extended attributes (`fuse_xattrs`).
    let file = up.path("data/m/a.csv");
    let xattr = |name: &str| {
        let c = std::ffi::CString::new(file.as_os_str().as_encoded_bytes()).unwrap();
        let n = std::ffi::CString::new(name).unwrap();
        let mut buf = vec![0u8; 4096];
        // SAFETY: valid NUL-terminated strings; the buffer is writable for its length.
        let got =
            unsafe { libc::getxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        (got >= 0).then(|| {
            buf.truncate(got as usize);
            String::from_utf8(buf).unwrap()
        })
    };
    assert_eq!(xattr("user.s3.content-type").as_deref(), Some("text/csv"));
    assert_eq!(xattr("user.s3.meta.owner").as_deref(), Some("etl"));
    assert_eq!(xattr("user.s3.meta.none"), None);
    let c = std::ffi::CString::new(file.as_os_str().as_encoded_bytes()).unwrap();
    let mut names = vec![0u8; 4096];
    // SAFETY: a valid NUL-terminated path; the buffer is writable for its length.
    let n = unsafe { libc::listxattr(c.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    assert!(n > 0, "listxattr: {}", std::io::Error::last_os_error());
    let names = String::from_utf8_lossy(&names[..n as usize]).into_owned();
    assert!(
        names.split('\0').any(|n| n == "user.s3.checksum.sha256"),
        "{names:?}"
    );
    endpoint
}

#[test]
fn gateway_keeps_metadata_checksums_and_parts_over_a_local_directory() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    std::fs::create_dir_all(&store).unwrap();
    let keys = dir.path().join("keys");
    std::fs::write(&keys, format!("{ACCESS} {SECRET} rw\n")).unwrap();
    std::fs::set_permissions(&keys, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let keys_arg = keys.display().to_string();
    let up = Silt::up_data(
        &format!("file://{}", store.display()),
        Vec::new(),
        &[
            "--gateway",
            "127.0.0.1:0",
            "--gateway-keys",
            &keys_arg,
            "--write-type",
            "through",
            "--write-rules",
            "/data/wb=back,/data/co=cache-only",
            "--fuse-xattrs",
            "true",
        ],
        dir.path(),
    );
    check_metadata(&up, dir.path(), &[]);
    // The `back` file's headers came with its upload; the cache-only one never reached it.
    assert!(!store.join("co/x.json").exists());
    let c = std::ffi::CString::new(store.join("wb/x.json").as_os_str().as_encoded_bytes()).unwrap();
    let n = std::ffi::CString::new("user.s3.meta.w").unwrap();
    let mut buf = vec![0u8; 16];
    // SAFETY: valid NUL-terminated strings; the buffer is writable for its length.
    let got = unsafe { libc::getxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert_eq!(got, 2, "{}", std::io::Error::last_os_error());
    assert_eq!(&buf[..2], b"wb");
    // In the local directory: extended attributes of the file itself.
    let c = std::ffi::CString::new(store.join("m/a.csv").as_os_str().as_encoded_bytes()).unwrap();
    let n = std::ffi::CString::new("user.s3.content-type").unwrap();
    let mut buf = vec![0u8; 256];
    // SAFETY: valid NUL-terminated strings; the buffer is writable for its length.
    let got = unsafe { libc::getxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert_eq!(got, 8, "{}", std::io::Error::last_os_error());
    assert_eq!(&buf[..8], b"text/csv");
    up.stop();
}

#[test]
fn gateway_keeps_metadata_checksums_and_parts_over_s3() {
    let fx = S3Fx::start(false);
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    std::fs::write(&keys, format!("{ACCESS} {SECRET} rw\n")).unwrap();
    std::fs::set_permissions(&keys, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let keys_arg = keys.display().to_string();
    let up = fx.up(
        &[
            "--gateway",
            "127.0.0.1:0",
            "--gateway-keys",
            &keys_arg,
            "--write-type",
            "through",
            "--write-rules",
            "/data/wb=back,/data/co=cache-only",
            "--fuse-xattrs",
            "true",
        ],
        dir.path(),
    );
    let endpoint = check_metadata(&up, dir.path(), &[]);
    // In the store: the object's own Content-Type and user metadata, as other S3 clients of
    // the bucket see them.
    py_env(
        &endpoint,
        dir.path(),
        r#"
store = boto3.client("s3", endpoint_url=os.environ["S3_EP"], region_name="us-east-1",
                     aws_access_key_id=os.environ["S3_AK"], aws_secret_access_key=os.environ["S3_SK"],
                     config=Config(s3={"addressing_style": "path"}))
h = store.head_object(Bucket=os.environ["S3_BUCKET"], Key="ds/m/a.csv")
assert h["ContentType"] == "text/csv" and h["CacheControl"] == "max-age=60", h
assert h["Metadata"]["owner"] == "etl" and h["Metadata"]["k-2"] == "v 2", h
# The `back` file's headers came with its upload; the cache-only one never reached it.
h = store.head_object(Bucket=os.environ["S3_BUCKET"], Key="ds/wb/x.json")
assert h["ContentType"] == "application/json" and h["Metadata"]["w"] == "wb", h
try:
    store.head_object(Bucket=os.environ["S3_BUCKET"], Key="ds/co/x.json")
    raise AssertionError("a cache-only file reached the store")
except ClientError:
    pass
"#,
        &[
            ("S3_EP", fx.server.endpoint().as_str()),
            ("S3_AK", fx.server.access_key()),
            ("S3_SK", fx.server.secret_key()),
            ("S3_BUCKET", BUCKET),
        ],
    );
    up.stop();
}
