//! The S3 gateway's buckets (CreateBucket, DeleteBucket, ListBuckets), server-side copies
//! into multipart uploads (UploadPartCopy) and the smaller points where it used to differ
//! from S3 (issue 43), against a real `silt up --gateway` over `file://` and over a real S3
//! server (versitygw), driven by boto3, the aws CLI and s3fs (`.deps`). The answers checked
//! are the S3 API reference's.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::*;

const ACCESS: &str = "AKIDSILTAPI";
const SECRET: &str = "silt-gateway-api-secret-0123456789";
/// Read-only, bucket `data` only.
const RO_ACCESS: &str = "AKIDSILTAPIRO";
const RO_SECRET: &str = "silt-gateway-api-reader-9876543210";
/// Read-write, bucket `other` only: may not read `data`.
const OTHER_ACCESS: &str = "AKIDSILTAPIOTHER";
const OTHER_SECRET: &str = "silt-gateway-api-other-5555555555";

const PRELUDE: &str = r#"
import os, sys, datetime, hashlib, json, urllib.request, urllib.error
import boto3, botocore
from botocore.config import Config
from botocore.exceptions import ClientError

EP = os.environ["GW"]

def client(ak=None, sk=None):
    cfg = Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1},
                 connect_timeout=10, read_timeout=60, signature_version="s3v4")
    return boto3.client("s3", endpoint_url=EP, region_name="us-east-1",
                        aws_access_key_id=ak or os.environ["AK"],
                        aws_secret_access_key=sk or os.environ["SK"], config=cfg)

def err(fn, code, status):
    try:
        r = fn()
    except ClientError as e:
        got = (e.response["Error"]["Code"], e.response["ResponseMetadata"]["HTTPStatusCode"])
        assert got == (code, status), f"expected {(code, status)}, got {got}: {e.response}"
        return e.response
    raise AssertionError(f"expected {code} {status}, got success: {r}")

s3 = client()
"#;

/// A `silt up --gateway` over a namespace, with the test's keys.
struct Gw {
    up: Silt,
    endpoint: String,
    dir: tempfile::TempDir,
    /// `file://` stores: the store directory of the mount at `/`.
    store: Option<PathBuf>,
    /// The S3 server of an S3 namespace.
    s3: Option<S3Fx>,
}

fn keys_file(dir: &Path) -> PathBuf {
    let f = dir.join("keys");
    std::fs::write(
        &f,
        format!(
            "{ACCESS} {SECRET} rw\n{RO_ACCESS} {RO_SECRET} ro data\n{OTHER_ACCESS} {OTHER_SECRET} rw other\n"
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
    f
}

impl Gw {
    /// `silt up` in `dir` over `mounts` (path, URI) with `extra` options, the gateway and
    /// its keys.
    fn up(dir: tempfile::TempDir, mounts: &[(&str, &str)], extra: &[String]) -> Gw {
        let keys = keys_file(dir.path());
        let mut args = vec![
            "--gateway".to_string(),
            "127.0.0.1:0".into(),
            "--gateway-keys".into(),
            keys.display().to_string(),
        ];
        args.extend(extra.iter().cloned());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let up = Silt::up(mounts, &args, dir.path()).unwrap_or_else(|e| panic!("{e}"));
        let endpoint = endpoint_in(&up.log_text(), "silt: S3 gateway at");
        Gw {
            up,
            endpoint,
            dir,
            store: None,
            s3: None,
        }
    }

    /// The whole namespace one `file://` directory (mounted at `/`) holding the buckets
    /// `data` and `other`, written `through`.
    fn file() -> Gw {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("store");
        std::fs::create_dir_all(store.join("data")).unwrap();
        std::fs::create_dir_all(store.join("other")).unwrap();
        let uri = format!("file://{}", store.display());
        let mut gw = Gw::up(
            dir,
            &[("/", uri.as_str())],
            &["--write-type".into(), "through".into()],
        );
        gw.store = Some(store);
        gw
    }

    /// The whole namespace a prefix of a real S3 server's bucket (mounted at `/`), holding
    /// the buckets `data` and `other` (directory markers), written `through`.
    fn s3() -> Gw {
        let fx = S3Fx::start(false);
        for b in ["data", "other"] {
            fx.rt
                .block_on(fx.store.create_dir(b))
                .unwrap_or_else(|e| panic!("making {b} in the store: {e}"));
        }
        let dir = tempfile::tempdir().unwrap();
        let mut extra = s3_args(&fx.server);
        extra.extend(["--write-type".to_string(), "through".into()]);
        let uri = fx.uri();
        let mut gw = Gw::up(dir, &[("/", uri.as_str())], &extra);
        gw.s3 = Some(fx);
        gw
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("GW", self.endpoint.clone()),
            ("AK", ACCESS.into()),
            ("SK", SECRET.into()),
            ("RO_AK", RO_ACCESS.into()),
            ("RO_SK", RO_SECRET.into()),
            ("OTHER_AK", OTHER_ACCESS.into()),
            ("OTHER_SK", OTHER_SECRET.into()),
            ("IS_S3", if self.s3.is_some() { "1" } else { "" }.into()),
        ]
    }

    /// Runs `script` with `python` (a venv's); panics with its output unless it prints `ok`.
    fn run(&self, python: &Path, script_text: &str) {
        let script = self.dir.path().join("check.py");
        std::fs::write(&script, format!("{script_text}\nprint('ok')\n")).unwrap();
        let out = Command::new(python)
            .arg(&script)
            .envs(self.env())
            .output()
            .unwrap_or_else(|e| {
                panic!(
                    "running {} (scripts/install-deps.sh): {e}",
                    python.display()
                )
            });
        check(&out, "python check");
    }

    /// Runs `snippet` after the prelude with boto3 (`.deps/pyvenv`).
    fn py(&self, snippet: &str) {
        self.run(&venv("pyvenv", "python"), &format!("{PRELUDE}\n{snippet}"));
    }

    /// The aws CLI (`.deps/s3venv`) with `args`; its output, or a panic if it failed.
    fn aws(&self, args: &[&str]) -> Output {
        let home = self.dir.path();
        // What `aws s3 cp` copies in parts: over 8 MiB, in 5 MiB parts.
        std::fs::write(
            home.join("aws-config"),
            "[default]\ns3 =\n  multipart_threshold = 8MB\n  multipart_chunksize = 5MB\n",
        )
        .unwrap();
        let out = Command::new(venv("s3venv", "aws"))
            .arg("--endpoint-url")
            .arg(&self.endpoint)
            .args(args)
            .env("AWS_ACCESS_KEY_ID", ACCESS)
            .env("AWS_SECRET_ACCESS_KEY", SECRET)
            .env("AWS_DEFAULT_REGION", "us-east-1")
            .env("AWS_CONFIG_FILE", home.join("aws-config"))
            .env("AWS_SHARED_CREDENTIALS_FILE", home.join("aws-credentials"))
            .env("HOME", home)
            .output()
            .unwrap_or_else(|e| panic!("running the aws CLI (scripts/install-deps.sh): {e}"));
        check(&out, &format!("aws {args:?}"));
        out
    }
}

fn check(out: &Output, what: &str) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && (!what.starts_with("python") || stdout.ends_with("ok\n")),
        "{what} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// CreateBucket, DeleteBucket and ListBuckets through boto3, as the S3 API reference has
/// them; `aws s3 mb` / `rb`; s3fs's mkdir / rmdir.
const BUCKETS: &str = r#"
def names(**kw):
    return [b["Name"] for b in s3.list_buckets(**kw)["Buckets"]]
assert names() == ["data", "other"], names()

r = s3.create_bucket(Bucket="new-bucket")
assert r["ResponseMetadata"]["HTTPStatusCode"] == 200, r
assert r["Location"] == "/new-bucket", r
assert s3.head_bucket(Bucket="new-bucket")["ResponseMetadata"]["HTTPStatusCode"] == 200
assert names() == ["data", "new-bucket", "other"], names()
err(lambda: s3.create_bucket(Bucket="new-bucket"), "BucketAlreadyOwnedByYou", 409)
err(lambda: s3.create_bucket(Bucket="data"), "BucketAlreadyOwnedByYou", 409)

# S3's naming rules (those botocore does not check itself).
for bad in ["ab", "a" * 64, "-abc", "abc-", "a..b", "192.168.5.4", "xn--abc", "sthree-abc",
            "amzn-s3-demo-abc", "abc-s3alias", "abc--ol-s3", "abc.mrap", "abc--x-s3",
            "abc--table-s3", "Upper-Case", "under_score"]:
    err(lambda: s3.create_bucket(Bucket=bad), "InvalidBucketName", 400)
assert names() == ["data", "new-bucket", "other"], names()

# A bucket's creation date: the store directory's time, or the gateway's own; never the epoch.
now = datetime.datetime.now(datetime.timezone.utc)
for b in s3.list_buckets()["Buckets"]:
    assert now - datetime.timedelta(days=1) < b["CreationDate"] < now + datetime.timedelta(days=1), b

# Objects in it: not empty (409); emptied: deleted (204); then missing (404).
s3.put_object(Bucket="new-bucket", Key="d/x.txt", Body=b"x")
err(lambda: s3.delete_bucket(Bucket="new-bucket"), "BucketNotEmpty", 409)
s3.delete_object(Bucket="new-bucket", Key="d/x.txt")
# A "folder" (an empty directory here, which S3 lists as no object) does not hold it back.
s3.put_object(Bucket="new-bucket", Key="empty-dir/", Body=b"")
r = s3.delete_bucket(Bucket="new-bucket")
assert r["ResponseMetadata"]["HTTPStatusCode"] == 204, r
err(lambda: s3.head_bucket(Bucket="new-bucket"), "404", 404)
err(lambda: s3.delete_bucket(Bucket="new-bucket"), "NoSuchBucket", 404)
err(lambda: s3.get_object(Bucket="new-bucket", Key="d/x.txt"), "NoSuchBucket", 404)
assert names() == ["data", "other"], names()

# Keys' rights: a read-only key creates and deletes nothing; a key limited to buckets
# creates none outside them.
ro = client(os.environ["RO_AK"], os.environ["RO_SK"])
err(lambda: ro.create_bucket(Bucket="ro-bucket"), "AccessDenied", 403)
err(lambda: ro.delete_bucket(Bucket="data"), "AccessDenied", 403)
other = client(os.environ["OTHER_AK"], os.environ["OTHER_SK"])
err(lambda: other.create_bucket(Bucket="not-mine"), "AccessDenied", 403)
assert [b["Name"] for b in ro.list_buckets()["Buckets"]] == ["data"]
assert names() == ["data", "other"], names()

# ListBuckets in pages: MaxBuckets, ContinuationToken, Prefix; the owner.
for n in ["page-a", "page-b", "page-c"]:
    s3.create_bucket(Bucket=n)
allb = names()
assert allb == ["data", "other", "page-a", "page-b", "page-c"], allb
got, token = [], None
while True:
    kw = {"MaxBuckets": 2}
    if token:
        kw["ContinuationToken"] = token
    r = s3.list_buckets(**kw)
    page = [b["Name"] for b in r["Buckets"]]
    assert 1 <= len(page) <= 2, r
    got += page
    token = r.get("ContinuationToken")
    if not token:
        break
assert got == allb, got
assert r["Owner"]["ID"], r
r = s3.list_buckets(Prefix="page-", MaxBuckets=2)
assert [b["Name"] for b in r["Buckets"]] == ["page-a", "page-b"] and r["Prefix"] == "page-", r
r = s3.list_buckets(Prefix="page-", ContinuationToken=r["ContinuationToken"])
assert [b["Name"] for b in r["Buckets"]] == ["page-c"] and "ContinuationToken" not in r, r
err(lambda: s3.list_buckets(MaxBuckets=10001), "InvalidArgument", 400)
for n in ["page-a", "page-b", "page-c"]:
    s3.delete_bucket(Bucket=n)
assert names() == ["data", "other"], names()
"#;

/// s3fs (fsspec) makes and removes buckets with mkdir and rmdir.
const S3FS_BUCKETS: &str = r#"
import os, s3fs
EP = os.environ["GW"]
fs = s3fs.S3FileSystem(key=os.environ["AK"], secret=os.environ["SK"],
                       client_kwargs={"endpoint_url": EP, "region_name": "us-east-1"})
fs.mkdir("s3fs-bucket")
assert "s3fs-bucket" in [p.rstrip("/") for p in fs.ls("")], fs.ls("")
fs.pipe("s3fs-bucket/f.txt", b"in a new bucket")
assert fs.cat("s3fs-bucket/f.txt") == b"in a new bucket"
fs.rm("s3fs-bucket/f.txt")
fs.rmdir("s3fs-bucket")
fs.invalidate_cache()
assert "s3fs-bucket" not in [p.rstrip("/") for p in fs.ls("")], fs.ls("")
"#;

fn buckets(gw: &Gw) {
    gw.py(BUCKETS);
    gw.run(&venv("s3venv", "python"), S3FS_BUCKETS);
    // `aws s3 mb` / `rb`, as a new user would make a bucket.
    let mb = gw.aws(&["s3", "mb", "s3://cli-bucket"]);
    assert!(
        String::from_utf8_lossy(&mb.stdout).contains("make_bucket: cli-bucket"),
        "{mb:?}"
    );
    let ls = gw.aws(&["s3", "ls"]);
    assert!(
        String::from_utf8_lossy(&ls.stdout).contains("cli-bucket"),
        "{ls:?}"
    );
    let rb = gw.aws(&["s3", "rb", "s3://cli-bucket"]);
    assert!(
        String::from_utf8_lossy(&rb.stdout).contains("remove_bucket: cli-bucket"),
        "{rb:?}"
    );
    let ls = gw.aws(&["s3", "ls"]);
    assert!(
        !String::from_utf8_lossy(&ls.stdout).contains("cli-bucket"),
        "{ls:?}"
    );
}

#[test]
fn gateway_makes_and_removes_buckets_over_a_local_store() {
    let gw = Gw::file();
    buckets(&gw);
    // Buckets are the store's top-level directories.
    let store = gw.store.as_ref().unwrap();
    gw.py(r#"s3.create_bucket(Bucket="seen-in-store")"#);
    assert!(store.join("seen-in-store").is_dir());
    // The FUSE mount shows it too.
    assert!(gw.up.path("seen-in-store").is_dir());
    gw.py(r#"s3.delete_bucket(Bucket="seen-in-store")"#);
    assert!(!store.join("seen-in-store").exists());
    gw.up.stop();
}

#[test]
fn gateway_makes_and_removes_buckets_over_s3() {
    let gw = Gw::s3();
    buckets(&gw);
    gw.up.stop();
}

#[test]
fn gateway_refuses_buckets_where_the_namespace_holds_none() {
    // The top level made of mount points: no new names there, and a mount is not removed.
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("store-data");
    std::fs::create_dir_all(&data).unwrap();
    let uri = format!("file://{}", data.display());
    let gw = Gw::up(
        dir,
        &[("/data", uri.as_str())],
        &["--write-type".into(), "through".into()],
    );
    gw.py(r#"
e = err(lambda: s3.create_bucket(Bucket="new-bucket"), "MethodNotAllowed", 405)
assert "mount" in e["Error"]["Message"], e
e = err(lambda: s3.delete_bucket(Bucket="data"), "MethodNotAllowed", 405)
assert "mount" in e["Error"]["Message"], e
err(lambda: s3.create_bucket(Bucket="data"), "BucketAlreadyOwnedByYou", 409)
assert [b["Name"] for b in s3.list_buckets()["Buckets"]] == ["data"]
"#);
    gw.up.stop();

    // A mount at / that the write rules keep read-only (the default).
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    std::fs::create_dir_all(store.join("data")).unwrap();
    let uri = format!("file://{}", store.display());
    let gw = Gw::up(dir, &[("/", uri.as_str())], &[]);
    gw.py(r#"
e = err(lambda: s3.create_bucket(Bucket="new-bucket"), "AccessDenied", 403)
assert "read-only" in e["Error"]["Message"], e
e = err(lambda: s3.delete_bucket(Bucket="data"), "AccessDenied", 403)
assert "read-only" in e["Error"]["Message"], e
"#);
    assert!(store.join("data").is_dir() && !store.join("new-bucket").exists());
    gw.up.stop();
}

/// UploadPartCopy through boto3, checked against the S3 API reference.
const PART_COPY: &str = r#"
import random
rnd = random.Random(43)
src = bytes(rnd.getrandbits(8) for _ in range(6 * 1024 * 1024 + 17))
small = b"the last part, copied whole"
s3.put_object(Bucket="data", Key="src/big.bin", Body=src)
s3.put_object(Bucket="data", Key="src/small.txt", Body=small)
src_etag = s3.head_object(Bucket="data", Key="src/big.bin")["ETag"]
lm = s3.head_object(Bucket="data", Key="src/big.bin")["LastModified"]
md5 = lambda b: '"%s"' % hashlib.md5(b).hexdigest()

u = s3.create_multipart_upload(Bucket="other", Key="joined.bin")["UploadId"]
cp = lambda n, source, **kw: s3.upload_part_copy(Bucket="other", Key="joined.bin", UploadId=u,
                                                  PartNumber=n, CopySource=source, **kw)
first = 5 * 1024 * 1024
r = cp(1, "data/src/big.bin", CopySourceRange="bytes=0-%d" % (first - 1))
assert r["CopyPartResult"]["ETag"] == md5(src[:first]), r
assert isinstance(r["CopyPartResult"]["LastModified"], datetime.datetime), r
r2 = cp(2, {"Bucket": "data", "Key": "src/small.txt"})
assert r2["CopyPartResult"]["ETag"] == md5(small), r2
parts = s3.list_parts(Bucket="other", Key="joined.bin", UploadId=u)["Parts"]
assert [(p["PartNumber"], p["ETag"], p["Size"]) for p in parts] == \
    [(1, md5(src[:first]), first), (2, md5(small), len(small))], parts

# Ranges S3 does not take: 400 InvalidArgument, the part left as it was.
for bad in ["bytes=5-2", "bytes=abc", "bytes=3-", "bytes=-3", "byte=0-1"]:
    e = err(lambda: cp(1, "data/src/big.bin", CopySourceRange=bad), "InvalidArgument", 400)
    assert "bytes=first-last" in e["Error"]["Message"], e
for past in ["bytes=0-%d" % len(src), "bytes=%d-%d" % (len(src) + 5, len(src) + 9)]:
    e = err(lambda: cp(1, "data/src/big.bin", CopySourceRange=past), "InvalidArgument", 400)
    assert "size: %d" % len(src) in e["Error"]["Message"], e

# The copy-source conditions: 412 when one fails, whichever.
day = datetime.timedelta(days=1)
for kw in [dict(CopySourceIfMatch='"not-it"'), dict(CopySourceIfNoneMatch=src_etag),
           dict(CopySourceIfModifiedSince=lm + day), dict(CopySourceIfUnmodifiedSince=lm - day)]:
    err(lambda: cp(1, "data/src/big.bin", CopySourceRange="bytes=0-9", **kw), "PreconditionFailed", 412)
r = cp(3, "data/src/big.bin", CopySourceRange="bytes=%d-%d" % (first, len(src) - 1),
       CopySourceIfMatch=src_etag, CopySourceIfUnmodifiedSince=lm + day)
assert r["CopyPartResult"]["ETag"] == md5(src[first:]), r

# A source or upload that is not there, and a source the key may not read.
err(lambda: cp(4, "data/src/none"), "NoSuchKey", 404)
err(lambda: cp(4, "nosuchbucket/x"), "NoSuchBucket", 404)
err(lambda: s3.upload_part_copy(Bucket="other", Key="joined.bin", UploadId="0" * 32, PartNumber=1,
                                CopySource="data/src/small.txt"), "NoSuchUpload", 404)
err(lambda: cp(0, "data/src/small.txt"), "InvalidArgument", 400)
other = client(os.environ["OTHER_AK"], os.environ["OTHER_SK"])
err(lambda: other.upload_part_copy(Bucket="other", Key="joined.bin", UploadId=u, PartNumber=4,
                                   CopySource="data/src/small.txt"), "AccessDenied", 403)

# Parts 1 and 3 make the source again.
done = s3.complete_multipart_upload(Bucket="other", Key="joined.bin", UploadId=u, MultipartUpload={
    "Parts": [{"PartNumber": 1, "ETag": md5(src[:first])}, {"PartNumber": 3, "ETag": md5(src[first:])}]})
assert s3.get_object(Bucket="other", Key="joined.bin")["Body"].read() == src
"#;

fn part_copies(gw: &Gw) {
    gw.py(PART_COPY);
    // `aws s3 cp` of an object over the CLI's multipart threshold (8 MiB) between prefixes
    // and buckets: CreateMultipartUpload, UploadPartCopy, CompleteMultipartUpload.
    let data = bytes(9, 9 * 1024 * 1024 + 3);
    let local = gw.dir.path().join("nine.bin");
    std::fs::write(&local, &data).unwrap();
    gw.aws(&["s3", "cp", local.to_str().unwrap(), "s3://data/a/nine.bin"]);
    let out = gw.aws(&[
        "s3",
        "cp",
        "s3://data/a/nine.bin",
        "s3://other/b/nine.bin",
        "--debug",
    ]);
    let debug = String::from_utf8_lossy(&out.stderr);
    assert!(
        debug.contains("UploadPartCopy"),
        "the CLI did not copy in parts"
    );
    let back = gw.dir.path().join("nine-back.bin");
    gw.aws(&["s3", "cp", "s3://other/b/nine.bin", back.to_str().unwrap()]);
    assert_eq!(std::fs::read(&back).unwrap(), data);
}

#[test]
fn gateway_copies_parts_over_a_local_store() {
    let gw = Gw::file();
    part_copies(&gw);
    let store = gw.store.as_ref().unwrap();
    assert_eq!(
        std::fs::read(store.join("other/b/nine.bin")).unwrap(),
        bytes(9, 9 * 1024 * 1024 + 3)
    );
    gw.up.stop();
}

#[test]
fn gateway_copies_parts_over_s3() {
    let gw = Gw::s3();
    part_copies(&gw);
    gw.up.stop();
}

/// The smaller points of issue 43, each as the S3 API reference has it.
const DEVIATIONS: &str = r#"
s3.put_object(Bucket="data", Key="a b/c+d.txt", Body=b"1")
s3.put_object(Bucket="data", Key="a b/e", Body=b"2")

# ListObjects V1 with encoding-type=url encodes keys, markers and the delimiter, not the
# prefix. botocore asks for url encoding and decodes every V1 field but Prefix.
r = s3.list_objects(Bucket="data", Prefix="a b/", Delimiter="/")
assert r["Prefix"] == "a b/", r["Prefix"]
assert [o["Key"] for o in r["Contents"]] == ["a b/c+d.txt", "a b/e"], r["Contents"]
# Asked by the caller, nothing is decoded: the raw answer.
r = s3.list_objects(Bucket="data", Prefix="a b/", EncodingType="url")
assert r["Prefix"] == "a b/", r["Prefix"]
assert [o["Key"] for o in r["Contents"]] == ["a%20b/c%2Bd.txt", "a%20b/e"], r["Contents"]
# V2 encodes the prefix too (botocore decodes it back).
r = s3.list_objects_v2(Bucket="data", Prefix="a b/")
assert r["Prefix"] == "a b/", r["Prefix"]
r = s3.list_objects_v2(Bucket="data", Prefix="a b/", EncodingType="url")
assert r["Prefix"] == "a%20b/", r["Prefix"]

# An empty delimiter is no delimiter, and is not echoed.
for fn in (s3.list_objects, s3.list_objects_v2):
    r = fn(Bucket="data", Delimiter="")
    assert "Delimiter" not in r, r
    assert [o["Key"] for o in r["Contents"]] == ["a b/c+d.txt", "a b/e"], r

# Owners: V2 with FetchOwner, V1 always.
r = s3.list_objects_v2(Bucket="data", FetchOwner=True)
assert all(o["Owner"]["ID"] for o in r["Contents"]), r["Contents"]
r = s3.list_objects_v2(Bucket="data")
assert all("Owner" not in o for o in r["Contents"]), r["Contents"]
r = s3.list_objects(Bucket="data")
assert all(o["Owner"]["ID"] for o in r["Contents"]), r["Contents"]

# A second CompleteMultipartUpload of a completed upload answers the same.
u = s3.create_multipart_upload(Bucket="data", Key="mp")["UploadId"]
p = s3.upload_part(Bucket="data", Key="mp", UploadId=u, PartNumber=1, Body=b"parts")
parts = {"Parts": [{"PartNumber": 1, "ETag": p["ETag"]}]}
c1 = s3.complete_multipart_upload(Bucket="data", Key="mp", UploadId=u, MultipartUpload=parts)
c2 = s3.complete_multipart_upload(Bucket="data", Key="mp", UploadId=u, MultipartUpload=parts)
assert (c2["Bucket"], c2["Key"], c2["ETag"]) == ("data", "mp", c1["ETag"]), (c1, c2)
# Completed, the upload takes no parts and cannot be aborted; another key's id is no upload.
err(lambda: s3.upload_part(Bucket="data", Key="mp", UploadId=u, PartNumber=2, Body=b"x"), "NoSuchUpload", 404)
err(lambda: s3.abort_multipart_upload(Bucket="data", Key="mp", UploadId=u), "NoSuchUpload", 404)
err(lambda: s3.complete_multipart_upload(Bucket="data", Key="other", UploadId=u, MultipartUpload=parts),
    "NoSuchUpload", 404)
assert s3.get_object(Bucket="data", Key="mp")["Body"].read() == b"parts"

# CopyObject onto itself changing nothing: 400 InvalidRequest; with REPLACE it is a copy.
e = err(lambda: s3.copy_object(Bucket="data", Key="a b/e", CopySource="data/a b/e"), "InvalidRequest", 400)
assert "copy an object to itself" in e["Error"]["Message"], e
err(lambda: s3.copy_object(Bucket="data", Key="a b/e", CopySource="data/a b/e", MetadataDirective="COPY"),
    "InvalidRequest", 400)
s3.copy_object(Bucket="data", Key="a b/e", CopySource="data/a b/e", MetadataDirective="REPLACE")
assert s3.get_object(Bucket="data", Key="a b/e")["Body"].read() == b"2"

# Presigned URLs valid for more than 7 days: 400 AuthorizationQueryParametersError.
def fetch(url):
    try:
        with urllib.request.urlopen(url) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)
week = s3.generate_presigned_url("get_object", Params={"Bucket": "data", "Key": "a b/e"}, ExpiresIn=604800)
assert fetch(week)[:2] == (200, b"2"), fetch(week)
more = s3.generate_presigned_url("get_object", Params={"Bucket": "data", "Key": "a b/e"}, ExpiresIn=604801)
status, body, _ = fetch(more)
assert status == 400 and b"<Code>AuthorizationQueryParametersError</Code>" in body, (status, body)

# Error bodies carry a RequestId and a HostId, the same as the headers.
import re
status, body, headers = fetch(EP + "/data/a%20b/e")
assert status == 403, (status, body)
rid = re.search(rb"<RequestId>([^<]+)</RequestId>", body)
hid = re.search(rb"<HostId>([^<]+)</HostId>", body)
assert rid and hid, body
assert rid.group(1).decode() == headers["x-amz-request-id"], (body, headers)
assert hid.group(1).decode() == headers["x-amz-id-2"], (body, headers)
e = err(lambda: s3.get_object(Bucket="data", Key="none"), "NoSuchKey", 404)
assert e["ResponseMetadata"]["RequestId"] and e["ResponseMetadata"]["HostId"], e
assert s3.head_bucket(Bucket="data")["ResponseMetadata"]["RequestId"]

# A browser form upload (POST Object, SigV4): its policy's expiration must be ISO 8601.
import base64, hmac
def hsign(key, msg):
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()
def post_form(key, expiration):
    now = datetime.datetime.now(datetime.timezone.utc)
    day, amz = now.strftime("%Y%m%d"), now.strftime("%Y%m%dT%H%M%SZ")
    cred = "%s/%s/us-east-1/s3/aws4_request" % (os.environ["AK"], day)
    policy = {"expiration": expiration, "conditions": [
        {"bucket": "data"}, ["starts-with", "$key", "post/"], {"x-amz-algorithm": "AWS4-HMAC-SHA256"},
        {"x-amz-credential": cred}, {"x-amz-date": amz}]}
    p64 = base64.b64encode(json.dumps(policy).encode()).decode()
    k = hsign(("AWS4" + os.environ["SK"]).encode(), day)
    for part in ["us-east-1", "s3", "aws4_request"]:
        k = hsign(k, part)
    fields = [("key", key), ("x-amz-algorithm", "AWS4-HMAC-SHA256"), ("x-amz-credential", cred),
              ("x-amz-date", amz), ("policy", p64),
              ("x-amz-signature", hmac.new(k, p64.encode(), hashlib.sha256).hexdigest())]
    b = "----silt-form-boundary"
    body = b"".join(b'--%s\r\nContent-Disposition: form-data; name="%s"\r\n\r\n%s\r\n'
                    % (b.encode(), n.encode(), v.encode()) for n, v in fields)
    body += b'--%s\r\nContent-Disposition: form-data; name="file"; filename="f.txt"\r\n' \
            b'Content-Type: text/plain\r\n\r\nposted bytes\r\n--%s--\r\n' % (b.encode(), b.encode())
    req = urllib.request.Request(EP + "/data", data=body, method="POST",
                                 headers={"Content-Type": "multipart/form-data; boundary=" + b})
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
later = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)
status, body = post_form("post/good.txt", later.strftime("%Y-%m-%dT%H:%M:%S.000Z"))
assert status == 204, (status, body)
assert s3.get_object(Bucket="data", Key="post/good.txt")["Body"].read() == b"posted bytes"
for bad in [str(later), later.strftime("%Y-%m-%d %H:%M:%SZ")]:
    status, body = post_form("post/bad.txt", bad)
    assert status == 400 and b"<Code>InvalidPolicyDocument</Code>" in body, (bad, status, body)
err(lambda: s3.head_object(Bucket="data", Key="post/bad.txt"), "404", 404)
"#;

#[test]
fn gateway_answers_the_small_points_as_s3_does() {
    let gw = Gw::file();
    gw.py(DEVIATIONS);
    gw.up.stop();
}

#[test]
fn gateway_answers_the_small_points_as_s3_does_over_s3() {
    let gw = Gw::s3();
    gw.py(DEVIATIONS);
    gw.up.stop();
}

/// `If-None-Match: *` and `If-Match` are decided at the commit, not when the request arrives:
/// of ten PUTs racing for a free key with `If-None-Match: *` exactly one lands (the others
/// 412) and the key holds its body; of ten racing over one version with `If-Match`, exactly
/// one lands. The bodies are 2 MiB, so every request is received while the others are (a
/// check at arrival let all ten through). Over a local directory and over S3.
const CONDITIONAL_RACE: &str = r#"
import concurrent.futures, botocore
def put(i, **kw):
    try:
        r = s3.put_object(Bucket="data", Key="race", Body=bytes([i]) * (2 << 20), **kw)
        return (i, r["ETag"])
    except botocore.exceptions.ClientError as e:
        return (i, e.response["Error"]["Code"])
def race(first, **kw):
    with concurrent.futures.ThreadPoolExecutor(10) as ex:
        got = list(ex.map(lambda i: put(first + i, **kw), range(10)))
    won = [(i, t) for i, t in got if t.startswith('"')]
    assert len(won) == 1, f"{kw}: {got}"
    assert sum(t == "PreconditionFailed" for _, t in got) == 9, f"{kw}: {got}"
    body = s3.get_object(Bucket="data", Key="race")["Body"].read()
    assert body == bytes([won[0][0]]) * (2 << 20), f"{kw}: the key holds another body"
    return won[0][1]
etag = race(0, IfNoneMatch="*")
race(100, IfMatch=etag)
"#;

#[test]
fn conditional_writes_are_decided_at_the_commit() {
    let gw = Gw::file();
    gw.py(CONDITIONAL_RACE);
    gw.up.stop();
}

#[test]
fn conditional_writes_are_decided_at_the_commit_over_s3() {
    let gw = Gw::s3();
    gw.py(CONDITIONAL_RACE);
    gw.up.stop();
}
