//! Opening `gs://`, `azblob://`, `webhdfs://` and `hdfs://` stores: a missing bucket, container or
//! directory, and an endpoint nobody answers on, each fail with one line naming the store and
//! the cause, in bounded time.

use std::time::{Duration, Instant};

use silt_common::ErrorKind;
use silt_ufs::{open_store, S3Options};

fn quick() -> S3Options {
    S3Options {
        timeout: Duration::from_secs(2),
        retries: 1,
        ..S3Options::default()
    }
}

/// A loopback port nothing listens on.
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    port
}

/// `open_store(uri)` fails with `kind`, in one line that says `needle`.
async fn fails(uri: &str, kind: ErrorKind, needle: &str) {
    let t = Instant::now();
    let e = match open_store(uri, &quick()).await {
        Ok(_) => panic!("{uri}: opened"),
        Err(e) => e,
    };
    let text = e.to_string();
    assert_eq!(e.kind(), kind, "{uri}: {text}");
    assert!(text.contains(needle), "{uri}: {text}");
    assert!(!text.contains('\n'), "{uri}: not one line: {text}");
    // No request headers (a signature) in the message.
    assert!(
        !text.to_ascii_lowercase().contains("authorization:") && !text.contains("headers"),
        "{uri}: {text}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "{uri}: took {:?}",
        t.elapsed()
    );
}

#[tokio::test]
async fn gcs_missing_bucket_and_unreachable_endpoint() {
    let server = silt_testkit::FakeGcs::start();
    let uri = format!(
        "gs://nobucket/p?endpoint={}&anonymous=true",
        server.endpoint()
    );
    fails(&uri, ErrorKind::NotFound, "bucket nobucket does not exist").await;
    let uri = format!(
        "gs://bkt/p?endpoint=http://127.0.0.1:{}&anonymous=true",
        closed_port()
    );
    fails(&uri, ErrorKind::Unavailable, "cannot reach GCS endpoint").await;
}

#[tokio::test]
async fn azure_missing_container_refused_key_and_unreachable_endpoint() {
    let server = silt_testkit::Azurite::start();
    server.create_container("there");
    std::env::set_var("SILT_TEST_AZURITE_KEY", server.account_key());
    // A valid base64 key that is not the account's.
    std::env::set_var("SILT_TEST_AZURITE_BAD_KEY", "d3Jvbmcta2V5LXdyb25nLWtleQ==");
    let uri = |c: &str, endpoint: &str, var: &str| {
        format!(
            "azblob://{c}/p?account={}&endpoint={endpoint}&account_key_env={var}",
            server.account_name()
        )
    };
    let good = server.endpoint();
    fails(
        &uri("nocontainer", &good, "SILT_TEST_AZURITE_KEY"),
        ErrorKind::NotFound,
        "container nocontainer does not exist",
    )
    .await;
    fails(
        &uri("there", &good, "SILT_TEST_AZURITE_BAD_KEY"),
        ErrorKind::PermissionDenied,
        "Azure Blob endpoint",
    )
    .await;
    let closed = format!("http://127.0.0.1:{}/devstoreaccount1", closed_port());
    fails(
        &uri("there", &closed, "SILT_TEST_AZURITE_KEY"),
        ErrorKind::Unavailable,
        "cannot reach Azure Blob endpoint",
    )
    .await;
    // The secret never shows: not in the URI, not in a message.
    let s = open_store(&uri("there", &good, "SILT_TEST_AZURITE_KEY"), &quick())
        .await
        .unwrap();
    assert!(!s.uri().contains(server.account_key()), "{}", s.uri());
    let e = open_store(
        &format!("azblob://there/p?account_key={}", server.account_key()),
        &quick(),
    )
    .await
    .err()
    .unwrap();
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    assert!(!e.to_string().contains(server.account_key()), "{e}");
}

#[tokio::test]
async fn webhdfs_missing_directory_and_unreachable_endpoint() {
    let hdfs = silt_testkit::MiniHdfs::shared();
    let host = hdfs.webhdfs_endpoint().replace("http://", "");
    fails(
        &format!("webhdfs://{host}/no/such/dir"),
        ErrorKind::NotFound,
        "HDFS directory /no/such/dir does not exist",
    )
    .await;
    fails(
        &format!("webhdfs://127.0.0.1:{}/data", closed_port()),
        ErrorKind::Unavailable,
        "WebHDFS endpoint",
    )
    .await;
}

/// GCS's version rule, which fake-gcs-server does not enforce (it ignores read
/// preconditions): every read of a file names the generation it was opened at
/// (`ifGenerationMatch`, which GCS answers with 412 once the object was replaced), and a 412
/// is the read of a changed object (`ContentChanged`), never bytes. Through a recording proxy
/// that answers the 412 as GCS would.
#[tokio::test]
async fn gcs_reads_name_their_generation_and_a_412_is_a_changed_object() {
    let gcs = silt_testkit::FakeGcs::start();
    gcs.create_bucket("gen");
    let proxy = silt_testkit::S3Proxy::start(gcs.addr()).unwrap();
    let uri = format!("gs://gen/ds?endpoint={}&anonymous=true", proxy.endpoint());
    let store = open_store(&uri, &S3Options::default()).await.unwrap();
    store
        .write("f", bytes::Bytes::from_static(b"first version"))
        .await
        .unwrap();
    let meta = store.stat("f").await.unwrap();
    let generation = meta.version.clone().expect("a GCS object has a generation");
    let before = proxy.requests().len();
    assert_eq!(&store.read("f", 0..5, &meta).await.unwrap()[..], b"first");
    let reads: Vec<String> = proxy.requests()[before..]
        .iter()
        .filter(|r| r.starts_with("GET ") && r.contains("alt=media"))
        .cloned()
        .collect();
    assert!(!reads.is_empty(), "{:?}", proxy.requests());
    for r in &reads {
        assert!(
            r.contains(&format!("ifGenerationMatch={generation}")),
            "a read without its generation: {r}"
        );
    }
    // The object replaced meanwhile: GCS refuses the read of the old generation.
    proxy.inject(
        silt_testkit::S3Op::Get,
        0,
        1,
        silt_testkit::FaultAction::status(412, "conditionNotMet", "Precondition Failed"),
    );
    let err = store.read("f", 0..5, &meta).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ContentChanged, "{err}");
}

/// A namenode in safe mode (starting up, or put there by an operator) refuses every change:
/// a write through the store is `Unavailable` (retryable), in one line that says so, and
/// reads go on; once it leaves safe mode, writes land again. Its own cluster: the shared one
/// must not stop taking writes under other tests.
#[tokio::test]
async fn hdfs_in_safe_mode_is_one_line_and_reads_go_on() {
    let hdfs = silt_testkit::MiniHdfs::start();
    hdfs.mkdirs("/safe");
    let uri = format!(
        "hdfs://{}/safe?http_port={}",
        hdfs.namenode(),
        hdfs.http_addr().port()
    );
    let store = open_store(&uri, &quick()).await.unwrap();
    store
        .write("before.txt", bytes::Bytes::from_static(b"written before"))
        .await
        .unwrap();
    hdfs.set_safe_mode(true).unwrap();
    let e = store
        .write("during.txt", bytes::Bytes::from_static(b"refused"))
        .await
        .unwrap_err();
    let text = e.to_string();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{text}");
    assert!(e.is_retryable(), "{text}");
    assert!(text.to_ascii_lowercase().contains("safe mode"), "{text}");
    assert!(text.contains(&uri[..uri.find('?').unwrap()]), "{text}");
    assert!(
        !text.contains('\n') && text.len() < 400,
        "one short line: {text}"
    );
    let meta = store.stat("before.txt").await.unwrap();
    let got = store.read("before.txt", 0..meta.size, &meta).await.unwrap();
    assert_eq!(&got[..], b"written before");
    hdfs.set_safe_mode(false).unwrap();
    store
        .write("after.txt", bytes::Bytes::from_static(b"landed"))
        .await
        .unwrap();
}
