//! Several stores side by side in one namespace, through a real FUSE mount: each mount
//! reaches its own store with its own endpoint and keys (the URI's query string), reads,
//! writes and listings land in the right store, and a rename across mounts is `EXDEV`.

mod common;

use common::*;
use silt_testkit::S3Server;

/// Two S3 servers that take different keys (two clouds, or AWS beside an on-premises
/// MinIO) and a local directory, mounted side by side: `/a` through the process-wide
/// `--s3-*` options, `/b` through its URI's own endpoint and keys (the secret from a file
/// the URI names), `/local` a directory.
#[test]
fn two_s3_endpoints_with_their_own_keys_and_a_local_directory_side_by_side() {
    let a = S3Server::start_with_keys("key-of-a", "secret-of-a");
    let b = S3Server::start_with_keys("key-of-b", "secret-of-b-never-shown");
    a.create_bucket("one");
    b.create_bucket("two");
    std::fs::create_dir_all(a.root().join("one/ds")).unwrap();
    std::fs::write(a.root().join("one/ds/x.txt"), b"in a").unwrap();
    std::fs::create_dir_all(b.root().join("two/ds")).unwrap();
    std::fs::write(b.root().join("two/ds/y.txt"), b"in b").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let local = dir.path().join("local");
    std::fs::create_dir(&local).unwrap();
    std::fs::write(local.join("z.txt"), b"local").unwrap();
    let secret_file = dir.path().join("b.secret");
    std::fs::write(&secret_file, "secret-of-b-never-shown\n").unwrap();
    let b_uri = format!(
        "s3://two/ds?endpoint={}&access_key_id=key-of-b&secret_access_key_file={}",
        b.endpoint(),
        secret_file.display()
    );
    let local_uri = format!("file://{}", local.display());
    let mut extra: Vec<String> = s3_args(&a);
    extra.extend(["--write-type".to_string(), "through".to_string()]);
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let silt = Silt::up(
        &[
            ("/a", "s3://one/ds"),
            ("/b", &b_uri),
            ("/local", &local_uri),
        ],
        &extra,
        dir.path(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    // Reads from each store.
    assert_eq!(std::fs::read(silt.path("a/x.txt")).unwrap(), b"in a");
    assert_eq!(std::fs::read(silt.path("b/y.txt")).unwrap(), b"in b");
    assert_eq!(std::fs::read(silt.path("local/z.txt")).unwrap(), b"local");
    // Writes land in their own store, nowhere else.
    for (m, name) in [("a", "new-a"), ("b", "new-b"), ("local", "new-l")] {
        std::fs::write(silt.path(&format!("{m}/{name}")), name.as_bytes()).unwrap();
    }
    assert_eq!(
        std::fs::read(a.root().join("one/ds/new-a")).unwrap(),
        b"new-a"
    );
    assert_eq!(
        std::fs::read(b.root().join("two/ds/new-b")).unwrap(),
        b"new-b"
    );
    assert_eq!(std::fs::read(local.join("new-l")).unwrap(), b"new-l");
    assert!(!b.root().join("two/ds/new-a").exists() && !a.root().join("one/ds/new-b").exists());
    let names = |m: &str| {
        let mut v: Vec<String> = std::fs::read_dir(silt.path(m))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(names("a"), ["new-a", "x.txt"]);
    assert_eq!(names("b"), ["new-b", "y.txt"]);
    assert_eq!(names("local"), ["new-l", "z.txt"]);
    // A rename across two mounts is EXDEV (`mv` then copies), between S3 mounts too.
    for (from, to) in [("a/x.txt", "b/x.txt"), ("b/y.txt", "local/y.txt")] {
        let err = std::fs::rename(silt.path(from), silt.path(to)).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EXDEV), "{from} -> {to}");
    }
    // The URI is shown as given, the secret nowhere (report, log).
    let report = silt.report().to_string();
    assert!(report.contains("secret_access_key_file="), "{report}");
    assert!(!report.contains("secret-of-b-never-shown"), "{report}");
    silt.stop();
    let log = std::fs::read_to_string(dir.path().join("state.log")).unwrap_or_default();
    assert!(!log.contains("secret-of-b-never-shown"), "{log}");
}

/// A mount whose URI carries a secret itself, or names a secret file that is not there, is
/// refused before anything is mounted, with a message naming the cause (and never the
/// secret).
#[test]
fn a_mount_uri_with_a_secret_or_a_missing_secret_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mp = dir.path().join("mnt");
    std::fs::create_dir(&mp).unwrap();
    for (uri, want) in [
        (
            "s3://b/p?endpoint=http://127.0.0.1:1&secret_access_key=hunter2",
            "a secret never goes into a URI",
        ),
        (
            "s3://b/p?access_key_id=k&secret_access_key_file=/nonexistent/silt-secret",
            "/nonexistent/silt-secret",
        ),
        ("oss://b/p", "needs region="),
        ("s3://b/p?colour=blue", "unknown option"),
    ] {
        let out = silt(&[
            "mount",
            "--state-dir",
            &dir.path().join("state").display().to_string(),
            uri,
            &mp.display().to_string(),
        ]);
        let err = stderr(&out);
        assert!(!out.status.success(), "{uri}: {err}");
        assert!(err.contains(want), "{uri}: {err}");
        assert!(!err.contains("hunter2"), "{uri}: {err}");
        assert!(!is_mounted(&mp), "{uri}");
    }
}

/// A store that cannot be used stops the start with one line naming the mount and the cause
/// (a missing bucket, refused keys, an endpoint nobody answers on), not OpenDAL's dump of the
/// request and its response headers.
#[test]
fn an_unusable_store_is_one_line_naming_the_mount_and_the_cause() {
    let s3 = S3Server::start_with_keys("key", "right-secret");
    s3.create_bucket("bkt");
    let dir = tempfile::tempdir().unwrap();
    let mp = dir.path().join("mnt");
    std::fs::create_dir(&mp).unwrap();
    let secret = |name: &str, value: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, value).unwrap();
        p.display().to_string()
    };
    let right = secret("right", "right-secret");
    let wrong = secret("wrong", "wrong-secret");
    let closed = free_ports(1)[0];
    for (uri, cause) in [
        (
            format!("s3://nobucket/p?endpoint={}&access_key_id=key&secret_access_key_file={right}", s3.endpoint()),
            "bucket nobucket does not exist",
        ),
        (
            format!("s3://bkt/p?endpoint={}&access_key_id=key&secret_access_key_file={wrong}", s3.endpoint()),
            "credentials refused",
        ),
        (
            format!("s3://bkt/p?endpoint=http://127.0.0.1:{closed}&access_key_id=key&secret_access_key_file={right}"),
            "cannot reach",
        ),
    ] {
        let out = silt(&[
            "mount",
            "--state-dir",
            &dir.path().join("state").display().to_string(),
            "--ufs-retries",
            "0",
            &uri,
            &mp.display().to_string(),
        ]);
        let err = stderr(&out);
        assert!(!out.status.success(), "{uri}: {err}");
        let line = err
            .lines()
            .find(|l| l.starts_with("silt: error:"))
            .unwrap_or_else(|| panic!("no error line: {err}"));
        assert!(line.contains("mount /") && line.contains(cause), "{line}");
        assert!(!line.contains("headers") && !line.contains("x-amz-request-id"), "{line}");
        assert!(line.len() < 400, "{} characters: {line}", line.len());
        assert!(!err.contains("right-secret") && !err.contains("wrong-secret"), "{err}");
    }
}

/// Google Cloud Storage (fake-gcs-server), Azure Blob (Azurite), HDFS (WebHDFS of a mini
/// cluster) and S3 mounted side by side through one FUSE mount: each serves what its store
/// holds, takes writes into its own store only, lists, and a rename between two of them is
/// `EXDEV`.
/// The README's namespace: five kinds of store side by side in one `silt up`: two S3
/// servers that take different keys, GCS, Azure Blob, HDFS (`hdfs://`, the namenode's RPC
/// address) and a local directory. Through the mount and the gateway of the same daemon
/// each reads, writes, lists and renames in its own store, and a rename across mounts is
/// `EXDEV`.
#[test]
fn five_kinds_of_store_side_by_side_through_the_mount_and_the_gateway() {
    let gcs = silt_testkit::FakeGcs::start();
    gcs.create_bucket("gbkt");
    let azure = silt_testkit::Azurite::start();
    azure.create_container("acont");
    let hdfs = silt_testkit::MiniHdfs::shared();
    let base = format!("/stores-{}", std::process::id());
    hdfs.mkdirs(&format!("{base}/ds"));
    let s3 = S3Server::start();
    s3.create_bucket("sbkt");
    let lab = S3Server::start_with_keys("key-of-lab", "secret-of-lab-never-shown");
    lab.create_bucket("lbkt");
    let dir = tempfile::tempdir().unwrap();
    let lab_secret = dir.path().join("lab.secret");
    std::fs::write(&lab_secret, "secret-of-lab-never-shown\n").unwrap();
    let local = dir.path().join("local");
    std::fs::create_dir_all(local.join("ds")).unwrap();
    // The key reaches silt through the variable the URI names (inherited by the child).
    std::env::set_var("SILT_TEST_STORES_AZURE_KEY", azure.account_key());
    let me = std::process::Command::new("id")
        .arg("-un")
        .output()
        .unwrap();
    let user = String::from_utf8_lossy(&me.stdout).trim().to_string();
    let uris = [
        (
            "/gcs",
            format!("gs://gbkt/ds?endpoint={}&anonymous=true", gcs.endpoint()),
        ),
        (
            "/azure",
            format!(
                "azblob://acont/ds?account={}&endpoint={}&account_key_env=SILT_TEST_STORES_AZURE_KEY",
                azure.account_name(),
                azure.endpoint()
            ),
        ),
        (
            "/hdfs",
            format!(
                "hdfs://{}{base}/ds?http_port={}&user={user}",
                hdfs.namenode(),
                hdfs.http_addr().port()
            ),
        ),
        (
            "/amz",
            format!(
                "s3://sbkt/ds?endpoint={}&access_key_id={}&secret_access_key_env=SILT_TEST_STORES_S3_SECRET",
                s3.endpoint(),
                s3.access_key()
            ),
        ),
        (
            "/lab",
            format!(
                "s3://lbkt/ds?endpoint={}&access_key_id=key-of-lab&secret_access_key_file={}",
                lab.endpoint(),
                lab_secret.display()
            ),
        ),
        ("/local", format!("file://{}/ds", local.display())),
    ];
    std::env::set_var("SILT_TEST_STORES_S3_SECRET", s3.secret_key());
    // Each store holds a file written behind Silt's back, through a store of its own.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let raw: Vec<silt_ufs::DynStore> = uris
        .iter()
        .map(|(_, uri)| {
            rt.block_on(silt_ufs::open_store(uri, &silt_ufs::S3Options::default()))
                .unwrap_or_else(|e| panic!("{uri}: {e}"))
        })
        .collect();
    for (store, (path, _)) in raw.iter().zip(&uris) {
        let body = format!("before, in {path}");
        rt.block_on(store.write("pre.txt", body.into_bytes().into()))
            .unwrap_or_else(|e| panic!("{path}: {e}"));
    }
    let mounts: Vec<(&str, &str)> = uris.iter().map(|(p, u)| (*p, u.as_str())).collect();
    let keys = dir.path().join("gateway-keys");
    std::fs::write(&keys, "gwkey gwsecret rw\n").unwrap();
    std::fs::set_permissions(&keys, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let keys_arg = keys.display().to_string();
    // Below each mount, a directory per other write type (`through` elsewhere).
    let rules: Vec<String> = uris
        .iter()
        .flat_map(|(p, _)| ["back", "store-only", "cache-only"].map(|t| format!("{p}/wt-{t}={t}")))
        .collect();
    let rules = rules.join(",");
    let silt = Silt::up(
        &mounts,
        &[
            "--write-type",
            "through",
            "--write-rules",
            &rules,
            "--gateway",
            "127.0.0.1:0",
            "--gateway-keys",
            &keys_arg,
        ],
        dir.path(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    for (store, (path, _)) in raw.iter().zip(&uris) {
        let m = path.trim_start_matches('/');
        let got = std::fs::read_to_string(silt.path(&format!("{m}/pre.txt")))
            .unwrap_or_else(|e| panic!("{path}/pre.txt: {e}"));
        assert_eq!(got, format!("before, in {path}"));
        std::fs::create_dir(silt.path(&format!("{m}/sub"))).unwrap();
        let body = format!("written through the mount into {path}");
        std::fs::write(silt.path(&format!("{m}/sub/new.txt")), &body)
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        // In the store itself, whole.
        let meta = rt
            .block_on(store.stat("sub/new.txt"))
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        let bytes = rt
            .block_on(store.read("sub/new.txt", 0..meta.size, &meta))
            .unwrap();
        assert_eq!(bytes, body.as_bytes(), "{path}");
        let mut names: Vec<String> = std::fs::read_dir(silt.path(m))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["pre.txt", "sub"], "{path}");
        // A rename within the store works (HDFS natively, the object stores by copy).
        std::fs::rename(
            silt.path(&format!("{m}/sub/new.txt")),
            silt.path(&format!("{m}/moved.txt")),
        )
        .unwrap_or_else(|e| panic!("{path}: {e}"));
        assert!(rt.block_on(store.stat("sub/new.txt")).is_err(), "{path}");
        std::fs::remove_dir(silt.path(&format!("{m}/sub")))
            .unwrap_or_else(|e| panic!("rmdir {path}/sub: {e}"));
        assert_eq!(
            std::fs::read_to_string(silt.path(&format!("{m}/moved.txt"))).unwrap(),
            body
        );
    }
    // Nothing of one store leaked into another (pre.txt and moved.txt in each).
    for store in &raw {
        let listed = rt.block_on(store.list("", true)).unwrap();
        let files: Vec<&str> = listed
            .iter()
            .filter(|m| m.kind == silt_ufs::EntryKind::File)
            .map(|m| m.path.as_str())
            .collect();
        assert_eq!(files.len(), 2, "{}: {files:?}", store.uri());
    }
    // The S3 gateway of the same daemon (the same client): each mount is a bucket; boto3
    // reads what the store held and writes into that store.
    let endpoint = endpoint_in(&silt.log_text(), "silt: S3 gateway at");
    let script = dir.path().join("gateway_check.py");
    std::fs::write(
        &script,
        r#"
import os, boto3
from botocore.config import Config
s3 = boto3.client("s3", endpoint_url=os.environ["GW"], region_name="us-east-1",
                  aws_access_key_id="gwkey", aws_secret_access_key="gwsecret",
                  config=Config(retries={"max_attempts": 1}))
for b in ["gcs", "azure", "hdfs", "amz", "lab", "local"]:
    body = s3.get_object(Bucket=b, Key="pre.txt")["Body"].read()
    assert body == ("before, in /" + b).encode(), (b, body)
    s3.put_object(Bucket=b, Key="via-gateway/o.bin", Body=b"through the gateway to " + b.encode())
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=b)["Contents"])
    assert keys == ["moved.txt", "pre.txt", "via-gateway/o.bin"], (b, keys)
print("ok")
"#,
    )
    .unwrap();
    let python = venv("pyvenv", "python");
    let out = std::process::Command::new(&python)
        .arg(&script)
        .env("GW", &endpoint)
        .output()
        .unwrap_or_else(|e| panic!("{} (scripts/install-deps.sh): {e}", python.display()));
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).ends_with("ok\n"),
        "boto3 through the gateway:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for (store, (path, _)) in raw.iter().zip(&uris) {
        let meta = rt
            .block_on(store.stat("via-gateway/o.bin"))
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        let got = rt
            .block_on(store.read("via-gateway/o.bin", 0..meta.size, &meta))
            .unwrap();
        let want = format!("through the gateway to {}", path.trim_start_matches('/'));
        assert_eq!(got, want.as_bytes(), "{path}");
    }
    for (from, to) in [
        ("gcs/pre.txt", "azure/x"),
        ("azure/pre.txt", "hdfs/x"),
        ("hdfs/pre.txt", "amz/x"),
        ("amz/pre.txt", "lab/x"),
        ("lab/pre.txt", "local/x"),
        ("local/pre.txt", "gcs/x"),
    ] {
        let err = std::fs::rename(silt.path(from), silt.path(to)).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EXDEV), "{from} -> {to}");
    }
    // Every write type on every store: `back` and `store-only` files land in the store (a
    // `back` one once persisted), a `cache-only` one is read back and never reaches it.
    for (store, (path, _)) in raw.iter().zip(&uris) {
        let m = path.trim_start_matches('/');
        for t in ["back", "store-only", "cache-only"] {
            std::fs::create_dir(silt.path(&format!("{m}/wt-{t}")))
                .unwrap_or_else(|e| panic!("mkdir {path}/wt-{t}: {e}"));
            let body = format!("{t} into {path}");
            std::fs::write(silt.path(&format!("{m}/wt-{t}/f.txt")), &body)
                .unwrap_or_else(|e| panic!("{t} write in {path}: {e}"));
            assert_eq!(
                std::fs::read_to_string(silt.path(&format!("{m}/wt-{t}/f.txt"))).unwrap(),
                body,
                "{t} in {path}"
            );
        }
        let o = silt.cli(&["fs", "persist", &format!("{path}/wt-back")]);
        assert!(o.status.success(), "persist {path}: {}", stderr(&o));
        for t in ["back", "store-only"] {
            let key = format!("wt-{t}/f.txt");
            let meta = rt
                .block_on(store.stat(&key))
                .unwrap_or_else(|e| panic!("{t} in {path}: {e}"));
            let got = rt.block_on(store.read(&key, 0..meta.size, &meta)).unwrap();
            assert_eq!(got, format!("{t} into {path}").as_bytes(), "{t} in {path}");
        }
        assert!(
            rt.block_on(store.stat("wt-cache-only/f.txt")).is_err(),
            "a cache-only file reached {path}"
        );
    }
    // The secrets reached the stores and nothing else.
    for secret in [
        "secret-of-lab-never-shown",
        s3.secret_key(),
        azure.account_key(),
    ] {
        assert!(!silt.log_text().contains(secret), "a secret in the log");
    }
    silt.stop();
}
