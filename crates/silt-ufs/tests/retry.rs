//! Retry behaviour of the S3 store against a scripted loopback HTTP server: retryable answers
//! (503 SlowDown, 500) are retried `retries` times and keep a retryable kind; refusals (403)
//! and conditions (412) are not retried.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use silt_common::ErrorKind;
use silt_ufs::{open_store, S3Options};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Serves `status` with an S3 `<Error>` body of `code` to every request; counts requests.
async fn scripted(status: &'static str, code: &'static str) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let count = Arc::new(AtomicUsize::new(0));
    let counter = count.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            let counter = counter.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match sock.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                counter.fetch_add(1, Ordering::SeqCst);
                let body = format!(
                    "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\
                     <Error><Code>{code}</Code><Message>scripted</Message></Error>"
                );
                let resp = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: application/xml\r\n\
                     Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = sock.write_all(resp.as_bytes()).await;
                let _ = sock.shutdown().await;
            });
        }
    });
    (endpoint, count)
}

fn opts(endpoint: &str, retries: usize) -> S3Options {
    S3Options {
        endpoint: endpoint.to_string(),
        access_key_id: "a".into(),
        secret_access_key: "s".into(),
        timeout: Duration::from_secs(5),
        retries,
        ..S3Options::default()
    }
}

#[tokio::test]
async fn slow_down_is_retried_and_stays_rate_limited() {
    let (endpoint, count) = scripted("503 Service Unavailable", "SlowDown").await;
    let e = open_store("s3://bkt", &opts(&endpoint, 2))
        .await
        .err()
        .unwrap();
    assert_eq!(e.kind(), ErrorKind::RateLimited, "{e}");
    assert!(e.is_retryable());
    assert_eq!(count.load(Ordering::SeqCst), 3, "one try and two retries");
}

#[tokio::test]
async fn server_errors_are_retried_and_unavailable() {
    let (endpoint, count) = scripted("500 Internal Server Error", "InternalError").await;
    let e = open_store("s3://bkt", &opts(&endpoint, 1))
        .await
        .err()
        .unwrap();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.is_retryable());
    assert_eq!(count.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn refusals_are_not_retried() {
    let (endpoint, count) = scripted("403 Forbidden", "AccessDenied").await;
    let e = open_store("s3://bkt", &opts(&endpoint, 3))
        .await
        .err()
        .unwrap();
    assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
    assert!(!e.is_retryable());
    assert_eq!(count.load(Ordering::SeqCst), 1);

    let (endpoint, count) = scripted("404 Not Found", "NoSuchBucket").await;
    let e = open_store("s3://bkt", &opts(&endpoint, 3))
        .await
        .err()
        .unwrap();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    assert!(e.to_string().contains("bucket bkt does not exist"), "{e}");
    assert_eq!(count.load(Ordering::SeqCst), 1);
}
