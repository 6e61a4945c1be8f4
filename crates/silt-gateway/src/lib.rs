//! The S3 gateway: Silt's namespace over the S3 API, a thin adapter over `silt-client`.
//!
//! - **Buckets** are the top-level directories of the namespace: a mount at `/data` is the
//!   bucket `data`, and the object `train/x.bin` of that bucket is the namespace path
//!   `/data/train/x.bin`.
//! - **Reads** come from the client: metadata (HEAD, listings) from its metadata cache,
//!   bytes from its page cache (the same pages the FUSE mount and the Python SDK read),
//!   streamed in bounded pieces.
//! - **Protocol** (routing, XML, SigV4) is the `s3s` crate's; this crate answers the
//!   operations and decides who may call them ([`keys`]).
//!
//! Supported operations and every deviation from S3: `docs/gateway.md`.

pub mod connect;
pub mod keys;
pub mod list;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::SystemTime;

use base64::Engine;
use bytes::Bytes;
use s3s::access::{S3Access, S3AccessContext};
use s3s::dto::*;
use s3s::service::{S3Service, S3ServiceBuilder};
use s3s::stream::{ByteStream, RemainingLength};
use s3s::{s3_error, S3Error, S3ErrorCode, S3Request, S3Response, S3Result, S3};
use silt_client::{Client, Entry, OpenFile};
use silt_common::{metrics, ErrorKind};
use silt_ufs::EntryKind;
use tokio::net::TcpListener;
use tracing::{debug, warn};

pub use keys::Keys;

/// Errors of starting a gateway (serving errors are S3 error responses).
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// A bad keys file or key setting (the message never quotes a secret).
    #[error("{0}")]
    Keys(String),
    #[error("listening on {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Config(String),
    #[error(transparent)]
    Silt(#[from] silt_common::Error),
}

/// Bytes asked of the client per piece of a GET body. With [`BODY_PIECES`] pieces queued,
/// one response holds at most `(BODY_PIECES + 1) × READ_PIECE` (12 MiB) however large the
/// object; 4 MiB is a few pages, so a piece is read from the cache with one batched lookup.
const READ_PIECE: u64 = 4 << 20;
/// Pieces read ahead of the connection.
const BODY_PIECES: usize = 2;

/// Longest page of a listing (S3's).
const MAX_KEYS: i32 = 1000;

/// The S3 operations a read-only key may call.
const READ_OPS: &[&str] = &[
    "ListBuckets",
    "HeadBucket",
    "GetBucketLocation",
    "HeadObject",
    "GetObject",
    "ListObjects",
    "ListObjectsV2",
];

/// The gateway's S3 implementation over one client.
#[derive(Clone)]
pub struct Gateway {
    client: Arc<Client>,
    keys: Arc<Keys>,
}

impl Gateway {
    pub fn new(client: Arc<Client>, keys: Keys) -> Gateway {
        Gateway {
            client,
            keys: Arc::new(keys),
        }
    }

    /// The HTTP service: SigV4 checked against the keys, rights checked per request, then
    /// the operation. Path-style addressing.
    pub fn into_service(self) -> S3Service {
        let keys = self.keys.clone();
        let mut b = S3ServiceBuilder::new(self);
        // Always set, also with no keys: a signed request with an unknown key is then
        // InvalidAccessKeyId rather than an unsigned one.
        b.set_auth(keys.as_ref().clone());
        b.set_access(Access { keys });
        b.build()
    }

    /// The namespace directory of `bucket`, if it is a bucket.
    async fn bucket_root(&self, bucket: &str) -> S3Result<String> {
        if bucket.is_empty() || bucket.contains('/') || bucket == "." || bucket == ".." {
            return Err(no_such_bucket(bucket));
        }
        let root = format!("/{bucket}");
        match self.client.stat(&root).await {
            Ok(e) if e.is_dir() => Ok(root),
            Ok(_) => Err(no_such_bucket(bucket)),
            Err(e) if e.kind() == ErrorKind::NotFound => Err(no_such_bucket(bucket)),
            Err(e) => Err(to_s3(e)),
        }
    }

    /// The namespace path `key` names in `bucket`, if it can name a file.
    async fn key_path(&self, bucket: &str, key: &str) -> S3Result<String> {
        let root = self.bucket_root(bucket).await?;
        if !valid_key(key) {
            return Err(no_such_key(key));
        }
        Ok(format!("{root}/{key}"))
    }

    /// The file `key` names in `bucket`.
    async fn object(&self, bucket: &str, key: &str) -> S3Result<Entry> {
        match self.client.stat(&self.key_path(bucket, key).await?).await {
            Ok(e) if e.kind == EntryKind::File => Ok(e),
            Ok(_) => Err(no_such_key(key)),
            Err(e) if is_missing(e.kind()) => Err(no_such_key(key)),
            Err(e) => Err(to_s3(e)),
        }
    }

    /// The file `key` names, opened (pinned to the version it has now).
    async fn open(&self, bucket: &str, key: &str) -> S3Result<OpenFile> {
        match self.client.open(&self.key_path(bucket, key).await?).await {
            Ok(f) => Ok(f),
            Err(e) if is_missing(e.kind()) => Err(no_such_key(key)),
            Err(e) => Err(to_s3(e)),
        }
    }

    /// Lists one page of `bucket` (items in key order, up to `max + 1`).
    async fn list_page(
        &self,
        bucket: &str,
        prefix: &str,
        delimiter: Option<&str>,
        after: Option<&str>,
        max: usize,
    ) -> S3Result<(Vec<list::Item>, bool)> {
        let root = self.bucket_root(bucket).await?;
        if max == 0 {
            return Ok((Vec::new(), false));
        }
        let q = list::Query {
            prefix,
            delimiter: delimiter.filter(|d| !d.is_empty()),
            after,
            max,
        };
        let mut items = list::list(&self.client, &root, &q).await.map_err(to_s3)?;
        let truncated = items.len() > max;
        items.truncate(max);
        Ok((items, truncated))
    }
}

/// Per-request rights: who may call what on which bucket.
struct Access {
    keys: Arc<Keys>,
}

#[async_trait::async_trait]
impl S3Access for Access {
    async fn check(&self, cx: &mut S3AccessContext<'_>) -> S3Result<()> {
        let read = READ_OPS.contains(&cx.s3_op().name());
        let bucket = cx.s3_path().get_bucket_name().map(str::to_string);
        let Some(cred) = cx.credentials() else {
            if self.keys.anonymous && read {
                return Ok(());
            }
            return Err(s3_error!(AccessDenied, "Access Denied"));
        };
        // Signed with a key the keys hold (s3s checked the signature with its secret).
        let Some(rights) = self.keys.get(&cred.access_key) else {
            return Err(s3_error!(InvalidAccessKeyId));
        };
        if !read && !rights.writable {
            return Err(s3_error!(AccessDenied, "Access Denied: a read-only key"));
        }
        if let Some(b) = bucket {
            if !rights.allows_bucket(&b) {
                return Err(s3_error!(AccessDenied, "Access Denied"));
            }
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl S3 for Gateway {
    async fn list_buckets(
        &self,
        req: S3Request<ListBucketsInput>,
    ) -> S3Result<S3Response<ListBucketsOutput>> {
        let rights = req
            .credentials
            .as_ref()
            .and_then(|c| self.keys.get(&c.access_key));
        let top = self.client.list("/").await.map_err(to_s3)?;
        let buckets: Vec<Bucket> = top
            .iter()
            .filter(|e| e.is_dir())
            .filter(|e| rights.is_none_or(|r| r.allows_bucket(e.name())))
            .map(|e| Bucket {
                name: Some(e.name().to_string()),
                creation_date: Some(Timestamp::from(e.mtime.unwrap_or(SystemTime::UNIX_EPOCH))),
                bucket_region: None,
            })
            .collect();
        Ok(S3Response::new(ListBucketsOutput {
            buckets: Some(buckets),
            ..Default::default()
        }))
    }

    async fn head_bucket(
        &self,
        req: S3Request<HeadBucketInput>,
    ) -> S3Result<S3Response<HeadBucketOutput>> {
        self.bucket_root(&req.input.bucket).await?;
        Ok(S3Response::new(HeadBucketOutput::default()))
    }

    async fn get_bucket_location(
        &self,
        req: S3Request<GetBucketLocationInput>,
    ) -> S3Result<S3Response<GetBucketLocationOutput>> {
        self.bucket_root(&req.input.bucket).await?;
        Ok(S3Response::new(GetBucketLocationOutput::default()))
    }

    async fn head_object(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        let i = &req.input;
        let entry = self.object(&i.bucket, &i.key).await?;
        let etag = etag_of(&entry);
        check_conditions(
            &entry,
            &etag,
            i.if_match.as_ref(),
            i.if_none_match.as_ref(),
            i.if_modified_since.as_ref(),
            i.if_unmodified_since.as_ref(),
        )?;
        let (range, content_range) = resolve_range(i.range.as_ref(), entry.size)?;
        Ok(S3Response::new(HeadObjectOutput {
            accept_ranges: Some("bytes".into()),
            content_length: Some(len_i64(range.end - range.start)),
            content_range,
            content_type: Some("application/octet-stream".into()),
            e_tag: Some(ETag::Strong(etag)),
            last_modified: entry.mtime.map(Timestamp::from),
            ..Default::default()
        }))
    }

    async fn get_object(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        let i = &req.input;
        if i.part_number.is_some() {
            return Err(s3_error!(NotImplemented, "partNumber is not supported"));
        }
        let file = self.open(&i.bucket, &i.key).await?;
        let entry = &file.entry;
        let etag = etag_of(entry);
        check_conditions(
            entry,
            &etag,
            i.if_match.as_ref(),
            i.if_none_match.as_ref(),
            i.if_modified_since.as_ref(),
            i.if_unmodified_since.as_ref(),
        )?;
        let (range, content_range) = resolve_range(i.range.as_ref(), file.size())?;
        let last_modified = entry.mtime.map(Timestamp::from);
        let len = range.end - range.start;
        debug!(bucket = %i.bucket, key = %i.key, start = range.start, len, "GET");
        let body = Body::start(self.client.clone(), file, range);
        Ok(S3Response::new(GetObjectOutput {
            accept_ranges: Some("bytes".into()),
            body: Some(StreamingBlob::new(body)),
            content_length: Some(len_i64(len)),
            content_range,
            content_type: Some("application/octet-stream".into()),
            e_tag: Some(ETag::Strong(etag)),
            last_modified,
            ..Default::default()
        }))
    }

    async fn list_objects_v2(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        let i = req.input;
        let max = max_keys(i.max_keys)?;
        let token = i
            .continuation_token
            .as_deref()
            .map(decode_token)
            .transpose()?;
        // A continuation token carries on where the last page stopped; StartAfter applies to
        // the first page only.
        let after = token.as_deref().or(i.start_after.as_deref());
        let prefix = i.prefix.clone().unwrap_or_default();
        let (items, truncated) = self
            .list_page(&i.bucket, &prefix, i.delimiter.as_deref(), after, max)
            .await?;
        let url = is_url(i.encoding_type.as_ref());
        let next = truncated
            .then(|| items.last().map(|it| encode_token(it.marker())))
            .flatten();
        let key_count = items.len() as i32;
        let (contents, common_prefixes) = split(items, url);
        Ok(S3Response::new(ListObjectsV2Output {
            name: Some(i.bucket),
            prefix: Some(enc(&prefix, url)),
            max_keys: Some(max as i32),
            key_count: Some(key_count),
            continuation_token: i.continuation_token,
            is_truncated: Some(truncated),
            next_continuation_token: next,
            contents: Some(contents),
            common_prefixes: Some(common_prefixes),
            delimiter: i.delimiter.map(|d| enc(&d, url)),
            encoding_type: i.encoding_type,
            start_after: i.start_after.map(|s| enc(&s, url)),
            ..Default::default()
        }))
    }

    async fn list_objects(
        &self,
        req: S3Request<ListObjectsInput>,
    ) -> S3Result<S3Response<ListObjectsOutput>> {
        let i = req.input;
        let max = max_keys(i.max_keys)?;
        let prefix = i.prefix.clone().unwrap_or_default();
        let (items, truncated) = self
            .list_page(
                &i.bucket,
                &prefix,
                i.delimiter.as_deref(),
                i.marker.as_deref(),
                max,
            )
            .await?;
        let url = is_url(i.encoding_type.as_ref());
        // S3 returns NextMarker only with a delimiter (without one, the last key is the
        // next marker, and clients use it).
        let next_marker = (truncated && i.delimiter.as_deref().is_some_and(|d| !d.is_empty()))
            .then(|| items.last().map(|it| enc(it.marker(), url)))
            .flatten();
        let (contents, common_prefixes) = split(items, url);
        Ok(S3Response::new(ListObjectsOutput {
            name: Some(i.bucket),
            prefix: Some(enc(&prefix, url)),
            marker: Some(i.marker.map(|m| enc(&m, url)).unwrap_or_default()),
            max_keys: Some(max as i32),
            is_truncated: Some(truncated),
            contents: Some(contents),
            common_prefixes: Some(common_prefixes),
            delimiter: i.delimiter.map(|d| enc(&d, url)),
            next_marker,
            encoding_type: i.encoding_type,
            ..Default::default()
        }))
    }
}

/// Serves `service` on `listener` until `shutdown` completes (connections in flight are
/// dropped with the runtime).
pub async fn serve(
    listener: TcpListener,
    service: S3Service,
    shutdown: impl Future<Output = ()> + Send,
) {
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            _ = &mut shutdown => return,
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // Out of descriptors and the like: the listener stays; a short pause
                    // keeps an error that repeats from spinning.
                    warn!(error = %e, "gateway: accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let svc = service.clone();
        // s3s answers every HeadObject 200; S3 answers a ranged one 206 like the GET.
        let svc = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
            let svc = svc.clone();
            async move {
                let head = req.method() == hyper::Method::HEAD;
                let mut resp = svc.call(req.map(s3s::Body::from)).await?;
                metrics::GATEWAY_REQUESTS.inc();
                let status = resp.status();
                if status.is_client_error() || status.is_server_error() {
                    metrics::GATEWAY_ERRORS.inc();
                }
                if status == hyper::StatusCode::FORBIDDEN {
                    metrics::GATEWAY_DENIED.inc();
                }
                if head
                    && resp.status() == hyper::StatusCode::OK
                    && resp.headers().contains_key(hyper::header::CONTENT_RANGE)
                {
                    *resp.status_mut() = hyper::StatusCode::PARTIAL_CONTENT;
                }
                Ok::<_, s3s::HttpError>(resp)
            }
        });
        tokio::spawn(async move {
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), svc);
            if let Err(e) = conn.await {
                debug!(%peer, error = %e, "gateway connection ended");
            }
        });
    }
}

/// Binds the gateway's listener.
pub async fn bind(addr: &str) -> Result<TcpListener, GatewayError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| GatewayError::Bind {
            addr: addr.to_string(),
            source,
        })
}

/// A GET body: pieces of the file read by a task ahead of the connection, at most
/// [`BODY_PIECES`] queued. Dropping it (the client went away) stops the reads.
struct Body {
    rx: tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>,
    remaining: u64,
}

impl Body {
    fn start(client: Arc<Client>, file: OpenFile, range: std::ops::Range<u64>) -> Body {
        let (tx, rx) = tokio::sync::mpsc::channel(BODY_PIECES);
        let remaining = range.end - range.start;
        tokio::spawn(async move {
            let mut off = range.start;
            while off < range.end {
                let want = READ_PIECE.min(range.end - off);
                let pieces = match client.read_chunks(&file, off, want).await {
                    Ok(p) if !p.is_empty() => p,
                    Ok(_) => {
                        let e = std::io::Error::new(
                            std::io::ErrorKind::UnexpectedEof,
                            format!("{}: ended at byte {off}", file.entry.path),
                        );
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                    Err(e) => {
                        warn!(path = %file.entry.path, error = %e, "gateway: read failed mid-body");
                        let _ = tx.send(Err(std::io::Error::other(e.to_string()))).await;
                        return;
                    }
                };
                for p in pieces {
                    off += p.len() as u64;
                    if tx.send(Ok(p)).await.is_err() {
                        return;
                    }
                }
            }
        });
        Body { rx, remaining }
    }
}

impl futures::Stream for Body {
    type Item = Result<Bytes, Box<dyn std::error::Error + Send + Sync>>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(Ok(b))) => {
                self.remaining = self.remaining.saturating_sub(b.len() as u64);
                metrics::GATEWAY_READ_BYTES.add(b.len() as u64);
                Poll::Ready(Some(Ok(b)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(Box::new(e)))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, None)
    }
}

impl ByteStream for Body {
    fn remaining_length(&self) -> RemainingLength {
        RemainingLength::new_exact(usize::try_from(self.remaining).unwrap_or(usize::MAX))
    }
}

/// Whether `key` can name a file of the namespace: relative, no empty, `.` or `..`
/// component, and not ending with `/` (directories are not objects).
fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 1024
        && !key.contains('\0')
        && key
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..")
}

fn is_missing(kind: ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::NotFound | ErrorKind::NotADirectory | ErrorKind::IsADirectory
    )
}

/// The object's ETag: the store's own where it has one (S3), else a digest of its content
/// fingerprint (a local directory: size and mtime), which changes whenever the bytes may have.
pub fn etag_of(e: &Entry) -> String {
    match &e.object {
        Some(o) => match &o.meta.etag {
            Some(t) => t.trim_matches('"').to_string(),
            None => format!(
                "{:016x}",
                xxhash_rust::xxh3::xxh3_64(o.meta.content_fingerprint().as_bytes())
            ),
        },
        None => String::new(),
    }
}

fn unix_secs(t: SystemTime) -> i64 {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
    }
}

fn ts_secs(t: &Timestamp) -> i64 {
    time::OffsetDateTime::from(t.clone()).unix_timestamp()
}

fn etag_matches(c: &ETagCondition, etag: &str) -> bool {
    match c {
        ETagCondition::Any => true,
        ETagCondition::ETag(t) => t.value() == etag,
    }
}

/// The conditional headers of GET and HEAD, as S3 (and RFC 9110) evaluate them: If-Match
/// (else If-Unmodified-Since) failing is 412; If-None-Match matching (else If-Modified-Since
/// not modified) is 304. Times compare at whole seconds, the resolution of HTTP dates.
fn check_conditions(
    entry: &Entry,
    etag: &str,
    if_match: Option<&ETagCondition>,
    if_none_match: Option<&ETagCondition>,
    if_modified_since: Option<&Timestamp>,
    if_unmodified_since: Option<&Timestamp>,
) -> S3Result<()> {
    let mtime = entry.mtime.map(unix_secs);
    match (if_match, if_unmodified_since) {
        (Some(c), _) if !etag_matches(c, etag) => return Err(precondition_failed()),
        (None, Some(t)) if mtime.is_some_and(|m| m > ts_secs(t)) => {
            return Err(precondition_failed())
        }
        _ => {}
    }
    let not_modified = match (if_none_match, if_modified_since) {
        (Some(c), _) => etag_matches(c, etag),
        (None, Some(t)) => mtime.is_some_and(|m| m <= ts_secs(t)),
        (None, None) => false,
    };
    if not_modified {
        let mut e = S3Error::new(S3ErrorCode::NotModified);
        let mut h = hyper::HeaderMap::new();
        if let Ok(v) = hyper::header::HeaderValue::from_str(&format!("\"{etag}\"")) {
            h.insert(hyper::header::ETAG, v);
        }
        e.set_headers(h);
        return Err(e);
    }
    Ok(())
}

fn precondition_failed() -> S3Error {
    s3_error!(
        PreconditionFailed,
        "At least one of the pre-conditions you specified did not hold"
    )
}

/// The byte range to send, and the Content-Range header for a ranged request.
fn resolve_range(
    range: Option<&Range>,
    size: u64,
) -> S3Result<(std::ops::Range<u64>, Option<String>)> {
    let Some(r) = range else {
        return Ok((0..size, None));
    };
    // `Range::check` lets a suffix range of an empty object through as 0..0; nothing of an
    // empty object can be served.
    let ok = if size == 0 { None } else { r.check(size).ok() };
    match ok {
        Some(b) => {
            let cr = format!("bytes {}-{}/{size}", b.start, b.end - 1);
            Ok((b, Some(cr)))
        }
        None => {
            let mut e = s3_error!(InvalidRange, "The requested range is not satisfiable");
            let mut h = hyper::HeaderMap::new();
            if let Ok(v) = hyper::header::HeaderValue::from_str(&format!("bytes */{size}")) {
                h.insert(hyper::header::CONTENT_RANGE, v);
            }
            e.set_headers(h);
            Err(e)
        }
    }
}

fn len_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn max_keys(asked: Option<i32>) -> S3Result<usize> {
    match asked {
        None => Ok(MAX_KEYS as usize),
        Some(n) if n < 0 => Err(s3_error!(InvalidArgument, "max-keys must not be negative")),
        Some(n) => Ok(n.min(MAX_KEYS) as usize),
    }
}

/// Continuation tokens are the last key (or common prefix) of the page, base64url-encoded:
/// opaque to clients, and the next page needs nothing else (no server-side state).
fn encode_token(marker: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(marker.as_bytes())
}

fn decode_token(t: &str) -> S3Result<String> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(t.as_bytes())
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or_else(|| {
            s3_error!(
                InvalidArgument,
                "The continuation token provided is incorrect"
            )
        })
}

fn is_url(e: Option<&EncodingType>) -> bool {
    e.is_some_and(|e| e.as_str() == EncodingType::URL)
}

/// `encoding-type=url`: keys and prefixes percent-encoded (all but unreserved characters
/// and `/`), as S3 does.
fn enc(s: &str, url: bool) -> String {
    if !url {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn split(items: Vec<list::Item>, url: bool) -> (Vec<Object>, Vec<CommonPrefix>) {
    let mut contents = Vec::new();
    let mut prefixes = Vec::new();
    for it in items {
        match it {
            list::Item::Key(k, e) => contents.push(Object {
                e_tag: Some(ETag::Strong(etag_of(&e))),
                key: Some(enc(&k, url)),
                last_modified: e.mtime.map(Timestamp::from),
                size: Some(len_i64(e.size)),
                storage_class: Some(ObjectStorageClass::from_static(
                    ObjectStorageClass::STANDARD,
                )),
                ..Default::default()
            }),
            list::Item::Prefix(p) => prefixes.push(CommonPrefix {
                prefix: Some(enc(&p, url)),
            }),
        }
    }
    (contents, prefixes)
}

fn no_such_bucket(bucket: &str) -> S3Error {
    s3_error!(
        NoSuchBucket,
        "The specified bucket does not exist: {bucket}"
    )
}

fn no_such_key(_key: &str) -> S3Error {
    s3_error!(NoSuchKey, "The specified key does not exist.")
}

/// A client error as an S3 error.
fn to_s3(e: silt_common::Error) -> S3Error {
    let code = match e.kind() {
        ErrorKind::NotFound | ErrorKind::NotADirectory | ErrorKind::IsADirectory => {
            S3ErrorCode::NoSuchKey
        }
        ErrorKind::PermissionDenied | ErrorKind::NotPermitted => S3ErrorCode::AccessDenied,
        ErrorKind::InvalidInput => S3ErrorCode::InvalidArgument,
        ErrorKind::Unavailable | ErrorKind::Timeout | ErrorKind::Busy => {
            S3ErrorCode::ServiceUnavailable
        }
        ErrorKind::RateLimited => S3ErrorCode::SlowDown,
        _ => S3ErrorCode::InternalError,
    };
    if code == S3ErrorCode::InternalError || code == S3ErrorCode::ServiceUnavailable {
        warn!(error = %e, "gateway: request failed");
    }
    S3Error::with_message(code, e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_that_name_no_file() {
        for k in ["a", "a/b", "a.b/c-d_e", "x/.hidden"] {
            assert!(valid_key(k), "{k}");
        }
        for k in ["", "/a", "a/", "a//b", "./a", "a/../b", "a/.", "a\0b"] {
            assert!(!valid_key(k), "{k:?}");
        }
    }

    #[test]
    fn url_encoding_keeps_slashes() {
        assert_eq!(enc("a b/c+d%é", true), "a%20b/c%2Bd%25%C3%A9");
        assert_eq!(enc("a b", false), "a b");
    }

    #[test]
    fn tokens_round_trip_and_reject_garbage() {
        let t = encode_token("dir/ü x");
        assert_eq!(decode_token(&t).unwrap(), "dir/ü x");
        assert!(decode_token("!!!").is_err());
    }

    #[test]
    fn ranges() {
        let r = |s: &str, size| resolve_range(Some(&Range::parse(s).unwrap()), size);
        assert_eq!(r("bytes=0-9", 100).unwrap().1.unwrap(), "bytes 0-9/100");
        assert_eq!(r("bytes=-10", 100).unwrap().0, 90..100);
        assert_eq!(r("bytes=-200", 100).unwrap().0, 0..100);
        assert_eq!(r("bytes=90-", 100).unwrap().0, 90..100);
        assert_eq!(r("bytes=95-200", 100).unwrap().0, 95..100);
        for bad in [("bytes=100-", 100), ("bytes=0-0", 0), ("bytes=-1", 0)] {
            let e = r(bad.0, bad.1).unwrap_err();
            assert_eq!(*e.code(), S3ErrorCode::InvalidRange, "{bad:?}");
        }
    }
}
