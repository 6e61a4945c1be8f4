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
//! This file holds the [`Gateway`], how it finds a bucket's directory and a key's file, who
//! may call what ([`keys`] through `Access`), and the `S3` trait: one call per operation to
//! the module of its kind (`read`, `list`, `write`, `copy`, `multipart`, `bucket`, `meta`).
//! The HTTP serving around `s3s` is in `serve`.
//!
//! Supported operations and every deviation from S3: `docs/gateway.md`.

mod bucket;
mod conditions;
pub mod connect;
mod copy;
mod edge;
pub mod host;
pub mod keys;
pub mod list;
mod meta;
mod multipart;
mod post;
mod read;
mod serve;
pub mod tls;
mod write;

use std::sync::Arc;
use std::time::SystemTime;

use s3s::access::{S3Access, S3AccessContext};
use s3s::dto::*;
use s3s::service::{S3Service, S3ServiceBuilder};
use s3s::{s3_error, S3Error, S3ErrorCode, S3Request, S3Response, S3Result, S3};
use silt_client::{Client, Entry, OpenFile};
use silt_common::ErrorKind;
use silt_ufs::EntryKind;
use tracing::debug;

pub use keys::Keys;
pub use serve::{bind, serve};

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

/// The S3 operations a read-only key may call.
const READ_OPS: &[&str] = &[
    "ListBuckets",
    "HeadBucket",
    "GetBucketLocation",
    "HeadObject",
    "GetObject",
    "GetObjectAttributes",
    "ListObjects",
    "ListObjectsV2",
];

/// The gateway's S3 implementation over one client.
#[derive(Clone)]
pub struct Gateway {
    client: Arc<Client>,
    keys: Arc<Keys>,
    uploads: Arc<multipart::Uploads>,
    domain: Option<String>,
    /// When the namespace was opened: the CreationDate of a bucket whose store keeps no time.
    opened: SystemTime,
}

impl Gateway {
    /// A gateway over `client`; multipart uploads keep their parts under `uploads_dir`
    /// (created owner-only when the first upload starts).
    pub fn new(client: Arc<Client>, keys: Keys, uploads_dir: std::path::PathBuf) -> Gateway {
        Gateway {
            client,
            keys: Arc::new(keys),
            uploads: Arc::new(multipart::Uploads::new(uploads_dir)),
            domain: None,
            opened: SystemTime::now(),
        }
    }

    /// Virtual-host-style addressing under `domain` (`BUCKET.domain`), beside path style.
    pub fn with_domain(mut self, domain: Option<String>) -> Gateway {
        self.domain = domain;
        self
    }

    /// Whether the request's key may read `bucket` (a copy's source).
    fn may_read(&self, creds: Option<&s3s::auth::Credentials>, bucket: &str) -> S3Result<()> {
        let ok = match creds {
            None => self.keys.anonymous,
            Some(c) => self
                .keys
                .get(&c.access_key)
                .is_some_and(|r| r.allows_bucket(bucket)),
        };
        if ok {
            Ok(())
        } else {
            Err(s3_error!(AccessDenied, "Access Denied"))
        }
    }

    /// The HTTP service: SigV4 checked against the keys, rights checked per request, then
    /// the operation. Path-style addressing.
    pub fn into_service(self) -> S3Service {
        let keys = self.keys.clone();
        let domain = self.domain.clone();
        let mut b = S3ServiceBuilder::new(self);
        // Always set, also with no keys: a signed request with an unknown key is then
        // InvalidAccessKeyId rather than an unsigned one.
        b.set_auth(keys.as_ref().clone());
        b.set_access(Access { keys });
        if let Some(d) = domain {
            b.set_host(host::Domain::new(&d));
        }
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

    /// The namespace path a write of `key` in `bucket` goes to: 400 for a key no path can
    /// hold (an empty, `.` or `..` component).
    async fn write_path(&self, bucket: &str, key: &str) -> S3Result<String> {
        let root = self.bucket_root(bucket).await?;
        if !valid_key(key) {
            return Err(s3_error!(
                InvalidArgument,
                "this key cannot be stored as a path: an empty, . or .. component (docs/gateway.md)"
            ));
        }
        Ok(format!("{root}/{key}"))
    }

    /// The file `key` names in `bucket`.
    async fn object(&self, bucket: &str, key: &str) -> S3Result<Entry> {
        let path = self.key_path(bucket, key).await?;
        let stat = || async {
            match self.client.stat(&path).await {
                Ok(e) if e.kind == EntryKind::File => Ok(e),
                Ok(_) => Err(no_such_key(key)),
                Err(e) if is_missing(e.kind()) => Err(no_such_key(key)),
                Err(e) => Err(to_s3(e)),
            }
        };
        let e = stat().await?;
        if self.learned_mtime(&e).await {
            return stat().await;
        }
        Ok(e)
    }

    /// The file `key` names, opened (pinned to the version it has now).
    async fn open(&self, bucket: &str, key: &str) -> S3Result<OpenFile> {
        let path = self.key_path(bucket, key).await?;
        let open = || async {
            match self.client.open(&path).await {
                Ok(f) => Ok(f),
                Err(e) if is_missing(e.kind()) => Err(no_such_key(key)),
                Err(e) => Err(to_s3(e)),
            }
        };
        let f = open().await?;
        if self.learned_mtime(&f.entry).await {
            return open().await;
        }
        Ok(f)
    }

    /// The file `key` names with its headers. The headers are of a version: one replaced
    /// between the stat and their read is asked for again.
    async fn object_and_headers(
        &self,
        bucket: &str,
        key: &str,
    ) -> S3Result<(Entry, Arc<silt_ufs::Headers>)> {
        for _ in 0..4 {
            let entry = self.object(bucket, key).await?;
            if let Some(h) = meta::headers_of(&self.client, &entry).await? {
                return Ok((entry, h));
            }
        }
        Err(s3_error!(ServiceUnavailable, "the object kept changing"))
    }

    /// The file `key` names, opened, with the headers of the version it is pinned to.
    async fn open_and_headers(
        &self,
        bucket: &str,
        key: &str,
    ) -> S3Result<(OpenFile, Arc<silt_ufs::Headers>)> {
        for _ in 0..4 {
            let file = self.open(bucket, key).await?;
            if let Some(h) = meta::headers_of(&self.client, &file.entry).await? {
                return Ok((file, h));
            }
        }
        Err(s3_error!(ServiceUnavailable, "the object kept changing"))
    }

    /// An S3 store's answer to a PUT names no Last-Modified, so a file just written through
    /// Silt has no time until it is revalidated; S3 always answers one (the aws CLI's
    /// bucket-to-bucket `cp` needs it): such a file is asked about once (one HEAD), and
    /// `true` says to look it up again. Other files cost nothing more than the one lookup.
    async fn learned_mtime(&self, e: &Entry) -> bool {
        if e.kind != EntryKind::File || e.mtime.is_some() || e.object.is_none() {
            return false;
        }
        match self.client.sync(&e.path, false).await {
            Ok(_) => true,
            Err(err) => {
                debug!(path = %e.path, error = %err, "gateway: no modification time learned");
                false
            }
        }
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
        self.list_buckets_impl(req).await
    }

    async fn create_bucket(
        &self,
        req: S3Request<CreateBucketInput>,
    ) -> S3Result<S3Response<CreateBucketOutput>> {
        self.create_bucket_impl(req).await
    }

    async fn delete_bucket(
        &self,
        req: S3Request<DeleteBucketInput>,
    ) -> S3Result<S3Response<DeleteBucketOutput>> {
        self.delete_bucket_impl(req).await
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
        self.head_object_impl(req).await
    }

    async fn get_object(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        self.get_object_impl(req).await
    }

    async fn get_object_attributes(
        &self,
        req: S3Request<GetObjectAttributesInput>,
    ) -> S3Result<S3Response<GetObjectAttributesOutput>> {
        self.get_object_attributes_impl(req).await
    }

    async fn list_objects_v2(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        self.list_objects_v2_impl(req).await
    }

    async fn list_objects(
        &self,
        req: S3Request<ListObjectsInput>,
    ) -> S3Result<S3Response<ListObjectsOutput>> {
        self.list_objects_impl(req).await
    }

    async fn put_object(
        &self,
        req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        self.put_object_impl(req).await
    }

    async fn copy_object(
        &self,
        req: S3Request<CopyObjectInput>,
    ) -> S3Result<S3Response<CopyObjectOutput>> {
        self.copy_object_impl(req).await
    }

    async fn delete_object(
        &self,
        req: S3Request<DeleteObjectInput>,
    ) -> S3Result<S3Response<DeleteObjectOutput>> {
        self.delete_object_impl(req).await
    }

    async fn delete_objects(
        &self,
        req: S3Request<DeleteObjectsInput>,
    ) -> S3Result<S3Response<DeleteObjectsOutput>> {
        self.delete_objects_impl(req).await
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        self.create_multipart_upload_impl(req).await
    }

    async fn upload_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        self.upload_part_impl(req).await
    }

    async fn upload_part_copy(
        &self,
        req: S3Request<UploadPartCopyInput>,
    ) -> S3Result<S3Response<UploadPartCopyOutput>> {
        self.upload_part_copy_impl(req).await
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        self.complete_multipart_upload_impl(req).await
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        self.abort_multipart_upload_impl(req).await
    }

    async fn list_parts(
        &self,
        req: S3Request<ListPartsInput>,
    ) -> S3Result<S3Response<ListPartsOutput>> {
        self.list_parts_impl(req).await
    }

    async fn list_multipart_uploads(
        &self,
        req: S3Request<ListMultipartUploadsInput>,
    ) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
        self.list_multipart_uploads_impl(req).await
    }
}

/// Whether `key` can name a file of the namespace: relative, no empty, `.` or `..`
/// component, and not ending with `/` (directories are not objects).
pub(crate) fn valid_key(key: &str) -> bool {
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

fn len_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
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
        silt_common::warn_limited!(per: e.kind(), "gateway: request failed", error = %e);
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
}
