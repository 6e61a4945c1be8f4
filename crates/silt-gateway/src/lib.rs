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

use conditions::{check_copy_conditions, precondition_failed, write_condition};
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

/// The `x-amz-checksum-*` fields of a request (PutObject, UploadPart) as one `Checksum`.
macro_rules! checksums_of {
    ($i:expr) => {
        Checksum {
            checksum_crc32: $i.checksum_crc32.clone(),
            checksum_crc32c: $i.checksum_crc32c.clone(),
            checksum_sha1: $i.checksum_sha1.clone(),
            checksum_sha256: $i.checksum_sha256.clone(),
            checksum_crc64nvme: $i.checksum_crc64nvme.clone(),
            ..Default::default()
        }
    };
}

/// The digests a request's body must match (PutObject, UploadPart): Content-MD5, the
/// `x-amz-checksum-*` headers, and a checksum trailer the request announces.
macro_rules! expected_of {
    ($req:expr) => {
        write::Expected {
            md5: $req.input.content_md5.clone(),
            checksums: checksums_of!($req.input),
            ..Default::default()
        }
        .with_trailer(&$req.headers)
    };
}

/// An answer (PutObject, UploadPart) echoing the checksums `c` computed over the body.
macro_rules! with_checksums {
    ($out:expr, $c:expr) => {{
        let mut out = $out;
        let c = $c;
        out.checksum_crc32 = c.checksum_crc32;
        out.checksum_crc32c = c.checksum_crc32c;
        out.checksum_sha1 = c.checksum_sha1;
        out.checksum_sha256 = c.checksum_sha256;
        out.checksum_crc64nvme = c.checksum_crc64nvme;
        out
    }};
}

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
        self.learn_mtime(&path).await;
        match self.client.stat(&path).await {
            Ok(e) if e.kind == EntryKind::File => Ok(e),
            Ok(_) => Err(no_such_key(key)),
            Err(e) if is_missing(e.kind()) => Err(no_such_key(key)),
            Err(e) => Err(to_s3(e)),
        }
    }

    /// The file `key` names, opened (pinned to the version it has now).
    async fn open(&self, bucket: &str, key: &str) -> S3Result<OpenFile> {
        let path = self.key_path(bucket, key).await?;
        self.learn_mtime(&path).await;
        match self.client.open(&path).await {
            Ok(f) => Ok(f),
            Err(e) if is_missing(e.kind()) => Err(no_such_key(key)),
            Err(e) => Err(to_s3(e)),
        }
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
    /// bucket-to-bucket `cp` needs it): such a file is asked about once (one HEAD).
    async fn learn_mtime(&self, path: &str) {
        if let Ok(e) = self.client.stat(path).await {
            if e.kind == EntryKind::File && e.mtime.is_none() && e.object.is_some() {
                if let Err(err) = self.client.sync(path, false).await {
                    debug!(%path, error = %err, "gateway: no modification time learned");
                }
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
        let i = &req.input;
        if i.version_id.is_some() {
            return Err(s3_error!(
                NotImplemented,
                "object versions are not supported"
            ));
        }
        let (entry, h) = self.object_and_headers(&i.bucket, &i.key).await?;
        // One header, `x-amz-object-attributes: ETag,ObjectSize`: a list in one element.
        let wants = |a: &str| {
            i.object_attributes
                .iter()
                .flat_map(|x| x.as_str().split(','))
                .any(|x| x.trim() == a)
        };
        if i.object_attributes.is_empty() {
            return Err(s3_error!(
                InvalidArgument,
                "x-amz-object-attributes must name at least one attribute"
            ));
        }
        let mut out = GetObjectAttributesOutput {
            last_modified: entry.mtime.map(Timestamp::from),
            ..Default::default()
        };
        if wants(ObjectAttributes::ETAG) {
            out.e_tag = Some(ETag::Strong(etag_of(&entry)));
        }
        if wants(ObjectAttributes::CHECKSUM) && !h.checksums.is_empty() {
            out.checksum = Some(meta::checksum_of(&h));
        }
        if wants(ObjectAttributes::STORAGE_CLASS) {
            out.storage_class = Some(StorageClass::from_static(StorageClass::STANDARD));
        }
        if wants(ObjectAttributes::OBJECT_SIZE) {
            out.object_size = Some(len_i64(entry.size));
        }
        // Only an object uploaded in parts has parts to tell of.
        if wants(ObjectAttributes::OBJECT_PARTS)
            && !h.parts.is_empty()
            && h.parts.iter().sum::<u64>() == entry.size
        {
            let max = match i.max_parts {
                None => 1000,
                Some(n) if n < 0 => {
                    return Err(s3_error!(InvalidArgument, "max-parts must not be negative"))
                }
                Some(n) => n.min(1000),
            };
            let after = i.part_number_marker.unwrap_or(0).max(0);
            let parts: Vec<ObjectPart> = h
                .parts
                .iter()
                .enumerate()
                .map(|(n, size)| (i32::try_from(n + 1).unwrap_or(i32::MAX), *size))
                .filter(|(n, _)| *n > after)
                .take(usize::try_from(max).unwrap_or(0))
                .map(|(n, size)| ObjectPart {
                    part_number: Some(n),
                    size: Some(len_i64(size)),
                    ..Default::default()
                })
                .collect();
            let total = i32::try_from(h.parts.len()).unwrap_or(i32::MAX);
            let last = parts.last().and_then(|p| p.part_number);
            let truncated = last.is_some_and(|l| l < total);
            out.object_parts = Some(GetObjectAttributesParts {
                is_truncated: Some(truncated),
                max_parts: Some(max),
                next_part_number_marker: if truncated { last } else { None },
                part_number_marker: Some(after),
                parts: Some(parts),
                total_parts_count: Some(total),
            });
        }
        Ok(S3Response::new(out))
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
        let expected = expected_of!(req)?;
        let i = req.input;
        if let Some(dir) = i.key.strip_suffix('/').filter(|d| valid_key(d)) {
            // A "folder" marker (what s3a, the S3 consoles and s3fs-fuse make): a directory.
            if i.content_length.is_some_and(|n| n > 0) {
                return Err(s3_error!(
                    InvalidArgument,
                    "a key ending in / names a directory here: its body must be empty"
                ));
            }
            let root = self.bucket_root(&i.bucket).await?;
            let path = format!("{root}/{dir}");
            write::make_dirs(&self.client, &root, &path).await?;
            return Ok(S3Response::new(PutObjectOutput {
                // The MD5 of no bytes, as S3 answers for an empty object.
                e_tag: Some(ETag::Strong("d41d8cd98f00b204e9800998ecf8427e".into())),
                size: Some(0),
                ..Default::default()
            }));
        }
        let path = self.write_path(&i.bucket, &i.key).await?;
        let mut expected = expected;
        expected.condition = write_condition(i.if_match.as_ref(), i.if_none_match.as_ref())?;
        let headers = meta::request_headers!(i);
        let (entry, got) = write::upload(
            &self.client,
            &path,
            i.body,
            i.content_length,
            &expected,
            req.trailing_headers.as_ref(),
            headers,
        )
        .await?;
        debug!(bucket = %i.bucket, key = %i.key, len = got.len, "PUT");
        Ok(S3Response::new(with_checksums!(
            PutObjectOutput {
                e_tag: Some(ETag::Strong(etag_of(&entry))),
                size: Some(len_i64(got.len)),
                ..Default::default()
            },
            got.checksums
        )))
    }

    async fn copy_object(
        &self,
        req: S3Request<CopyObjectInput>,
    ) -> S3Result<S3Response<CopyObjectOutput>> {
        let i = &req.input;
        let (src_bucket, src_key) = match &i.copy_source {
            CopySource::Bucket {
                bucket,
                key,
                version_id: None,
            } => (bucket.to_string(), key.to_string()),
            CopySource::Bucket { .. } => {
                return Err(s3_error!(
                    NotImplemented,
                    "object versions are not supported"
                ))
            }
            _ => return Err(s3_error!(NotImplemented, "access points are not supported")),
        };
        copy::check_not_copy_to_itself(&src_bucket, &src_key, i)?;
        self.may_read(req.credentials.as_ref(), &src_bucket)?;
        let dst = self.write_path(&i.bucket, &i.key).await?;
        let replace = match i.metadata_directive.as_ref().map(|d| d.as_str()) {
            None | Some("COPY") => false,
            Some("REPLACE") => true,
            Some(_) => return Err(s3_error!(InvalidArgument, "Unknown metadata directive.")),
        };
        let (file, src_headers) = self.open_and_headers(&src_bucket, &src_key).await?;
        // The copy is one object, not the source's parts; it keeps the source's whole-object
        // checksums (its bytes are the same), and with `REPLACE` the request's headers and
        // metadata instead of the source's.
        let mut headers = if replace {
            meta::request_headers!(i)
        } else {
            silt_ufs::Headers {
                parts: Vec::new(),
                ..(*src_headers).clone()
            }
        };
        if src_headers.checksum_type.as_deref() == Some(ChecksumType::FULL_OBJECT) {
            headers.checksums = src_headers.checksums.clone();
            headers.checksum_type = src_headers.checksum_type.clone();
        } else {
            headers.checksums.clear();
            headers.checksum_type = None;
        }
        let etag = etag_of(&file.entry);
        check_copy_conditions(&file.entry, &etag, i).map_err(|e| {
            // A copy's source conditions fail with 412 whichever header failed.
            if *e.code() == S3ErrorCode::NotModified {
                precondition_failed()
            } else {
                e
            }
        })?;
        let w = self
            .client
            .open_upload(&dst, Default::default())
            .await
            .map_err(write::commit_error)?;
        let mut off = 0;
        while off < file.size() {
            let pieces = self
                .client
                .read_chunks(&file, off, read::READ_PIECE.min(file.size() - off))
                .await
                .map_err(to_s3)?;
            if pieces.is_empty() {
                return Err(s3_error!(InternalError, "the source ended early"));
            }
            for p in pieces {
                self.client
                    .write_at(&w, off, &p)
                    .map_err(write::write_error)?;
                off += p.len() as u64;
            }
        }
        self.client.set_headers(&w, headers);
        let entry = write::finish(&self.client, &w).await?;
        Ok(S3Response::new(CopyObjectOutput {
            copy_object_result: Some(CopyObjectResult {
                e_tag: Some(ETag::Strong(etag_of(&entry))),
                last_modified: entry.mtime.map(Timestamp::from),
                ..Default::default()
            }),
            ..Default::default()
        }))
    }

    async fn delete_object(
        &self,
        req: S3Request<DeleteObjectInput>,
    ) -> S3Result<S3Response<DeleteObjectOutput>> {
        let i = &req.input;
        if i.version_id.is_some() {
            return Err(s3_error!(
                NotImplemented,
                "object versions are not supported"
            ));
        }
        let root = self.bucket_root(&i.bucket).await?;
        write::delete_key(&self.client, &root, &i.key).await?;
        Ok(S3Response::with_status(
            DeleteObjectOutput::default(),
            hyper::StatusCode::NO_CONTENT,
        ))
    }

    async fn delete_objects(
        &self,
        req: S3Request<DeleteObjectsInput>,
    ) -> S3Result<S3Response<DeleteObjectsOutput>> {
        let i = &req.input;
        if i.delete.objects.len() > 1000 {
            return Err(s3_error!(
                MalformedXML,
                "a DeleteObjects request names at most 1000 keys"
            ));
        }
        let root = self.bucket_root(&i.bucket).await?;
        let quiet = i.delete.quiet.unwrap_or(false);
        let mut deleted = Vec::new();
        let mut errors = Vec::new();
        for o in &i.delete.objects {
            let r = if o.version_id.is_some() {
                Err(s3_error!(
                    NotImplemented,
                    "object versions are not supported"
                ))
            } else {
                match write::delete_key(&self.client, &root, &o.key).await {
                    Ok(Some(_)) => Ok(()),
                    Ok(None) => Ok(()),
                    Err(e) => Err(e),
                }
            };
            match r {
                Ok(()) if quiet => {}
                Ok(()) => deleted.push(DeletedObject {
                    key: Some(o.key.clone()),
                    ..Default::default()
                }),
                Err(e) => errors.push(s3s::dto::Error {
                    code: Some(e.code().as_str().to_string()),
                    key: Some(o.key.clone()),
                    message: e.message().map(str::to_string),
                    version_id: o.version_id.clone(),
                }),
            }
        }
        Ok(S3Response::new(DeleteObjectsOutput {
            deleted: Some(deleted),
            errors: Some(errors),
            ..Default::default()
        }))
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        let i = &req.input;
        let path = self.write_path(&i.bucket, &i.key).await?;
        // Refused now if it could never complete (read-only, a directory there).
        self.client
            .open_upload(&path, Default::default())
            .await
            .map_err(write::commit_error)?;
        let m = meta::UploadMeta::new(
            meta::request_headers!(i),
            i.checksum_algorithm.as_ref(),
            i.checksum_type.as_ref(),
        )?;
        let id = self.uploads.create(&i.bucket, &i.key).await?;
        self.uploads.save_meta(&id, &m).await?;
        Ok(S3Response::new(CreateMultipartUploadOutput {
            checksum_algorithm: i.checksum_algorithm.clone(),
            checksum_type: m.algorithm.as_ref().map(|_| {
                ChecksumType::from(
                    if m.full_object {
                        ChecksumType::FULL_OBJECT
                    } else {
                        ChecksumType::COMPOSITE
                    }
                    .to_string(),
                )
            }),
            bucket: Some(i.bucket.clone()),
            key: Some(i.key.clone()),
            upload_id: Some(id),
            ..Default::default()
        }))
    }

    async fn upload_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        let expected = expected_of!(req)?;
        let i = req.input;
        let u = self.uploads.get(&i.upload_id, &i.bucket, &i.key).await?;
        let (etag, got) = self
            .uploads
            .put_part(
                &u,
                i.part_number,
                i.body,
                i.content_length,
                expected,
                req.trailing_headers.as_ref(),
            )
            .await?;
        Ok(S3Response::new(with_checksums!(
            UploadPartOutput {
                e_tag: Some(ETag::Strong(etag)),
                ..Default::default()
            },
            got.checksums
        )))
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
        let i = req.input;
        let u = match self.uploads.get(&i.upload_id, &i.bucket, &i.key).await {
            Ok(u) => u,
            // Completed already: S3 answers with the result again.
            Err(e) => match self
                .uploads
                .completed(&i.upload_id, &i.bucket, &i.key)
                .await
            {
                Some(etag) => {
                    return Ok(S3Response::new(CompleteMultipartUploadOutput {
                        bucket: Some(i.bucket),
                        key: Some(i.key),
                        e_tag: Some(ETag::Strong(etag)),
                        ..Default::default()
                    }))
                }
                None => return Err(e),
            },
        };
        let path = self.write_path(&i.bucket, &i.key).await?;
        let condition = write_condition(i.if_match.as_ref(), i.if_none_match.as_ref())?;
        let mut asked = Vec::new();
        for p in i.multipart_upload.and_then(|m| m.parts).unwrap_or_default() {
            let (Some(n), Some(etag)) = (p.part_number, p.e_tag) else {
                return Err(s3_error!(
                    MalformedXML,
                    "every part needs its PartNumber and ETag"
                ));
            };
            asked.push((n, etag.value().to_string()));
        }
        let m = self.uploads.meta(&u).await;
        let entry = self
            .uploads
            .complete(&self.client, &u, &path, &asked, &m, condition)
            .await?;
        let h = meta::headers_of(&self.client, &entry)
            .await?
            .unwrap_or_default();
        let c = meta::checksum_of(&h);
        Ok(S3Response::new(CompleteMultipartUploadOutput {
            bucket: Some(i.bucket),
            key: Some(i.key),
            e_tag: Some(ETag::Strong(etag_of(&entry))),
            checksum_crc32: c.checksum_crc32,
            checksum_crc32c: c.checksum_crc32c,
            checksum_sha1: c.checksum_sha1,
            checksum_sha256: c.checksum_sha256,
            checksum_crc64nvme: c.checksum_crc64nvme,
            checksum_type: c.checksum_type,
            ..Default::default()
        }))
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        let i = &req.input;
        let u = self.uploads.get(&i.upload_id, &i.bucket, &i.key).await?;
        self.uploads.abort(&u).await?;
        Ok(S3Response::with_status(
            AbortMultipartUploadOutput::default(),
            hyper::StatusCode::NO_CONTENT,
        ))
    }

    async fn list_parts(
        &self,
        req: S3Request<ListPartsInput>,
    ) -> S3Result<S3Response<ListPartsOutput>> {
        let i = &req.input;
        let u = self.uploads.get(&i.upload_id, &i.bucket, &i.key).await?;
        let max = match i.max_parts {
            None => 1000,
            Some(n) if n < 0 => {
                return Err(s3_error!(InvalidArgument, "max-parts must not be negative"))
            }
            Some(n) => n.min(1000) as usize,
        };
        let marker = i.part_number_marker.unwrap_or(0);
        let mut parts: Vec<_> = self
            .uploads
            .parts(&u.id)
            .await?
            .into_iter()
            .filter(|p| p.number > marker)
            .collect();
        let truncated = parts.len() > max;
        parts.truncate(max);
        let next = truncated.then(|| parts.last().map(|p| p.number)).flatten();
        Ok(S3Response::new(ListPartsOutput {
            bucket: Some(u.bucket),
            key: Some(u.key),
            upload_id: Some(u.id),
            max_parts: Some(max as i32),
            is_truncated: Some(truncated),
            part_number_marker: i.part_number_marker,
            next_part_number_marker: next,
            parts: Some(
                parts
                    .into_iter()
                    .map(|p| Part {
                        e_tag: Some(ETag::Strong(p.etag)),
                        last_modified: p.modified.map(Timestamp::from),
                        part_number: Some(p.number),
                        size: Some(len_i64(p.size)),
                        ..Default::default()
                    })
                    .collect(),
            ),
            storage_class: Some(StorageClass::from_static(StorageClass::STANDARD)),
            ..Default::default()
        }))
    }

    async fn list_multipart_uploads(
        &self,
        req: S3Request<ListMultipartUploadsInput>,
    ) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
        let i = &req.input;
        self.bucket_root(&i.bucket).await?;
        let prefix = i.prefix.clone().unwrap_or_default();
        let max = match i.max_uploads {
            None => 1000,
            Some(n) if n < 0 => {
                return Err(s3_error!(
                    InvalidArgument,
                    "max-uploads must not be negative"
                ))
            }
            Some(n) => n.min(1000) as usize,
        };
        let key_marker = i.key_marker.clone().unwrap_or_default();
        let id_marker = i.upload_id_marker.clone().unwrap_or_default();
        let mut all: Vec<_> = self
            .uploads
            .list(&i.bucket, &prefix)
            .await?
            .into_iter()
            .filter(|u| {
                key_marker.is_empty()
                    || u.key > key_marker
                    || (u.key == key_marker && !id_marker.is_empty() && u.id > id_marker)
            })
            .collect();
        let truncated = all.len() > max;
        all.truncate(max);
        let (next_key, next_id) = match (truncated, all.last()) {
            (true, Some(u)) => (Some(u.key.clone()), Some(u.id.clone())),
            _ => (None, None),
        };
        Ok(S3Response::new(ListMultipartUploadsOutput {
            bucket: Some(i.bucket.clone()),
            prefix: Some(prefix),
            key_marker: i.key_marker.clone(),
            upload_id_marker: i.upload_id_marker.clone(),
            max_uploads: Some(max as i32),
            is_truncated: Some(truncated),
            next_key_marker: next_key,
            next_upload_id_marker: next_id,
            uploads: Some(
                all.into_iter()
                    .map(|u| MultipartUpload {
                        initiated: Some(Timestamp::from(u.initiated)),
                        key: Some(u.key),
                        upload_id: Some(u.id),
                        storage_class: Some(StorageClass::from_static(StorageClass::STANDARD)),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }))
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
