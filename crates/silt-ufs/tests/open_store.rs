//! `open_store`: URI errors, and the usability check against local directories and a real S3
//! server (missing bucket, refused credentials, unreachable or silent endpoints).

use std::net::TcpListener;
use std::time::{Duration, Instant};

use silt_common::config::Config;
use silt_common::{Error, ErrorKind};
use silt_testkit::S3Server;
use silt_ufs::{open_store, DynStore, S3Options, StoreUri};

async fn open_err(uri: &str, opts: &S3Options) -> Error {
    match open_store(uri, opts).await {
        Ok(s) => panic!("{uri}: opened {}", s.uri()),
        Err(e) => e,
    }
}

async fn open_ok(uri: &str, opts: &S3Options) -> DynStore {
    open_store(uri, opts)
        .await
        .unwrap_or_else(|e| panic!("{uri}: {e}"))
}

#[tokio::test]
async fn bad_uris_are_invalid_input() {
    let opts = S3Options::default();
    for (uri, needle) in [
        ("wasb://bucket/x", "not supported yet"),
        ("gs://bucket/x?colour=blue", "unknown option"),
        ("ftp://host/dir", "ftp://"),
        ("s3://", "missing bucket"),
        ("s3:///prefix", "missing bucket"),
        ("file://relative/dir", "absolute"),
        ("definitely not a uri", "SCHEME://"),
    ] {
        let e = open_err(uri, &opts).await;
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{uri}: {e}");
        assert!(e.to_string().contains(needle), "{uri}: {e}");
    }
}

#[tokio::test]
async fn local_directories() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("missing");
    let e = open_err(
        &format!("file://{}", missing.display()),
        &S3Options::default(),
    )
    .await;
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    assert!(
        e.to_string().contains(&missing.display().to_string()),
        "{e}"
    );
    assert!(!missing.exists(), "opening must not create the directory");

    let file = tmp.path().join("file");
    std::fs::write(&file, b"x").unwrap();
    let e = open_err(&format!("file://{}", file.display()), &S3Options::default()).await;
    assert_eq!(e.kind(), ErrorKind::NotADirectory, "{e}");
    assert!(e.to_string().contains(&file.display().to_string()), "{e}");

    let s = open_ok(
        &format!("file://{}/", tmp.path().display()),
        &S3Options::default(),
    )
    .await;
    let canonical = std::fs::canonicalize(tmp.path()).unwrap();
    assert_eq!(s.uri(), format!("file://{}", canonical.display()));
    assert_eq!(
        StoreUri::parse(s.uri()).unwrap(),
        StoreUri::File { root: canonical }
    );
}

#[tokio::test]
async fn s3_bucket_and_prefix() {
    let server = S3Server::start();
    server.create_bucket("present");
    let opts = server.s3_options();

    let e = open_err(&server.uri("absent", ""), &opts).await;
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    assert!(
        e.to_string().contains("bucket absent does not exist"),
        "{e}"
    );

    // A prefix with nothing below it yet is a valid (empty) store.
    let s = open_ok(&server.uri("present", "not/yet/there"), &opts).await;
    assert_eq!(s.uri(), "s3://present/not/yet/there");
    assert!(s.list("", true).await.unwrap().is_empty());
    let s = open_ok(&server.uri("present", ""), &opts).await;
    assert_eq!(s.uri(), "s3://present");
}

#[tokio::test]
async fn s3_wrong_credentials_are_permission_denied() {
    let server = S3Server::start();
    server.create_bucket("bkt");
    let secret = "wrong-secret-value-0123456789";
    let wrong_secret = S3Options {
        secret_access_key: secret.into(),
        ..server.s3_options()
    };
    let e = open_err(&server.uri("bkt", ""), &wrong_secret).await;
    assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
    assert!(!e.is_retryable());
    assert!(
        !format!("{e} {e:?}").contains(secret),
        "secret leaked: {e:?}"
    );

    let wrong_key = S3Options {
        access_key_id: "nobody".into(),
        ..server.s3_options()
    };
    let e = open_err(&server.uri("bkt", ""), &wrong_key).await;
    assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
    assert!(!format!("{e} {e:?}").contains(server.secret_key()));

    let half = S3Options {
        secret_access_key: String::new(),
        ..server.s3_options()
    };
    assert_eq!(
        open_err(&server.uri("bkt", ""), &half).await.kind(),
        ErrorKind::InvalidInput
    );
}

#[tokio::test]
async fn s3_unreachable_endpoint_is_unavailable() {
    // A loopback port nobody listens on: connections are refused.
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let endpoint = format!("http://127.0.0.1:{port}");
    let opts = S3Options {
        endpoint: endpoint.clone(),
        access_key_id: "a".into(),
        secret_access_key: "s".into(),
        timeout: Duration::from_secs(5),
        retries: 2,
        ..S3Options::default()
    };
    let t = Instant::now();
    let e = open_err("s3://bucket", &opts).await;
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.is_retryable());
    assert!(e.to_string().contains(&endpoint), "{e}");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
}

#[tokio::test]
async fn s3_silent_endpoint_times_out() {
    // Accepts connections (the kernel completes the handshake) but never answers.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let opts = S3Options {
        endpoint: endpoint.clone(),
        access_key_id: "a".into(),
        secret_access_key: "s".into(),
        timeout: Duration::from_millis(300),
        retries: 1,
        ..S3Options::default()
    };
    let t = Instant::now();
    let e = open_err("s3://bucket", &opts).await;
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(e.to_string().contains(&endpoint), "{e}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    drop(listener);
}

#[tokio::test]
async fn s3_without_any_credentials() {
    let env_has_creds = std::env::var_os("AWS_ACCESS_KEY_ID").is_some()
        || std::env::var_os("AWS_SHARED_CREDENTIALS_FILE").is_some()
        || std::env::var_os("AWS_CONFIG_FILE").is_some()
        || std::env::var_os("HOME")
            .map(|h| std::path::Path::new(&h).join(".aws").exists())
            .unwrap_or(false);
    if env_has_creds {
        eprintln!("skipped: this environment provides AWS credentials");
        return;
    }
    let server = S3Server::start();
    server.create_bucket("bkt");
    let opts = S3Options {
        access_key_id: String::new(),
        secret_access_key: String::new(),
        ..server.s3_options()
    };
    let e = open_err(&server.uri("bkt", ""), &opts).await;
    assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
    assert!(e.to_string().contains("credentials"), "{e}");
}

#[test]
fn s3_options_from_config_and_redacted_debug() {
    let mut cfg = Config::default();
    cfg.set("s3_endpoint", "http://127.0.0.1:9000").unwrap();
    cfg.set("s3_region", "eu-west-3").unwrap();
    cfg.set("s3_path_style", "false").unwrap();
    cfg.set("s3_access_key_id", "AKID").unwrap();
    cfg.set("s3_secret_access_key", "very-secret").unwrap();
    cfg.set("ufs_timeout", "7s").unwrap();
    cfg.set("ufs_retries", "5").unwrap();
    let o = S3Options::from_config(&cfg);
    assert_eq!(o.endpoint, "http://127.0.0.1:9000");
    assert_eq!(o.region, "eu-west-3");
    assert!(!o.path_style);
    assert_eq!(
        (o.access_key_id.as_str(), o.secret_access_key.as_str()),
        ("AKID", "very-secret")
    );
    assert_eq!((o.timeout, o.retries), (Duration::from_secs(7), 5));
    let dbg = format!("{o:?}");
    assert!(
        dbg.contains("AKID") && !dbg.contains("very-secret"),
        "{dbg}"
    );

    let d = S3Options::from_config(&Config::default());
    let def = S3Options::default();
    assert_eq!(
        (d.region, d.path_style, d.timeout, d.retries),
        (def.region, def.path_style, def.timeout, def.retries)
    );
}
