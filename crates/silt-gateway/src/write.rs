//! Writes through the gateway: PutObject and DeleteObject(s), and what CopyObject and a
//! completed multipart upload share with them (the upload, its commit, the body's digests).
//!
//! - A PUT is a **whole-object upload** of the client (`Client::open_upload`): a session of
//!   its own that nothing reads before its commit, which replaces the file whole; the mount's
//!   write rules decide the write type (through, back, cache-only). Two PUTs of one key are two
//!   writers and the last commit wins, as on S3.
//! - The body is **checked before the commit**: its length against Content-Length, and the
//!   digests the request names (Content-MD5, `x-amz-checksum-*` as a header or as a trailer of
//!   an `aws-chunked` body). A body cut off or not matching leaves the key as it was.
//! - A DELETE removes the file, then the directories above it that it leaves empty (S3 has no
//!   directories: a key's "directory" disappears with its last key).

use bytes::Bytes;
use futures::StreamExt;
use s3s::checksum::ChecksumHasher;
use s3s::crypto::{Checksum as _, Md5};
use s3s::dto::*;
use s3s::{s3_error, S3Error, S3ErrorCode, S3Request, S3Response, S3Result};
use silt_client::{Client, Entry, FileWriter};
use silt_common::{metrics, ErrorKind};
use tracing::debug;

use crate::conditions::write_condition;
use crate::{etag_of, len_i64, meta, to_s3, valid_key, Gateway};

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
        $crate::write::Expected {
            md5: $req.input.content_md5.clone(),
            checksums: $crate::write::checksums_of!($req.input),
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
pub(crate) use {checksums_of, expected_of, with_checksums};

/// The digests a body must match, as the request gives them.
#[derive(Default, Clone)]
pub(crate) struct Expected {
    /// Content-MD5 (base64).
    pub md5: Option<String>,
    /// `x-amz-checksum-*` headers (base64).
    pub checksums: Checksum,
    /// The checksum a trailer carries (`x-amz-trailer: x-amz-checksum-crc32`), lower case.
    pub trailer: Option<String>,
    /// Compute the MD5 even if none was given (a part's ETag is its MD5).
    pub want_md5: bool,
    /// What must hold of the stored object for the upload's commit to happen (`If-Match`,
    /// `If-None-Match: *`), checked by the client at the commit.
    pub condition: Option<silt_client::Precondition>,
}

/// Reads one checksum of a `Checksum`.
type ChecksumField = fn(&Checksum) -> Option<&String>;

/// The `x-amz-checksum-*` names and where each is in a `Checksum`.
const CHECKSUMS: &[(&str, ChecksumField)] = &[
    ("x-amz-checksum-crc32", |c| c.checksum_crc32.as_ref()),
    ("x-amz-checksum-crc32c", |c| c.checksum_crc32c.as_ref()),
    ("x-amz-checksum-sha1", |c| c.checksum_sha1.as_ref()),
    ("x-amz-checksum-sha256", |c| c.checksum_sha256.as_ref()),
    ("x-amz-checksum-crc64nvme", |c| {
        c.checksum_crc64nvme.as_ref()
    }),
];

impl Expected {
    /// The trailer named by the request's `x-amz-trailer` header, if it is a checksum.
    pub fn with_trailer(mut self, headers: &hyper::HeaderMap) -> S3Result<Expected> {
        if let Some(v) = headers.get("x-amz-trailer") {
            let name = v
                .to_str()
                .map_err(|_| s3_error!(InvalidRequest, "bad x-amz-trailer header"))?
                .trim()
                .to_ascii_lowercase();
            if !CHECKSUMS.iter().any(|(n, _)| *n == name) {
                return Err(s3_error!(
                    InvalidRequest,
                    "x-amz-trailer names no supported checksum"
                ));
            }
            self.trailer = Some(name);
        }
        Ok(self)
    }

    fn hasher(&self) -> ChecksumHasher {
        let wants = |name: &str, given: bool| given || self.trailer.as_deref() == Some(name);
        let c = &self.checksums;
        ChecksumHasher {
            crc32: wants("x-amz-checksum-crc32", c.checksum_crc32.is_some()).then(Default::default),
            crc32c: wants("x-amz-checksum-crc32c", c.checksum_crc32c.is_some())
                .then(Default::default),
            sha1: wants("x-amz-checksum-sha1", c.checksum_sha1.is_some()).then(Default::default),
            sha256: wants("x-amz-checksum-sha256", c.checksum_sha256.is_some())
                .then(Default::default),
            crc64nvme: wants("x-amz-checksum-crc64nvme", c.checksum_crc64nvme.is_some())
                .then(Default::default),
        }
    }
}

/// What a received body was.
pub(crate) struct Received {
    pub len: u64,
    /// Its MD5, where one was given or wanted.
    pub md5: Option<[u8; 16]>,
    /// The checksums computed (those the request named), to echo in the answer.
    pub checksums: Checksum,
}

/// Where a received body goes: an upload's buffer, or a multipart upload's part file.
pub(crate) enum Sink<'a> {
    Upload(&'a Client, &'a FileWriter),
    File(&'a mut tokio::fs::File),
}

impl Sink<'_> {
    async fn put(&mut self, at: u64, data: &[u8]) -> S3Result<()> {
        match self {
            Sink::Upload(client, w) => client.write_at(w, at, data).map_err(write_error),
            Sink::File(f) => {
                use tokio::io::AsyncWriteExt;
                f.write_all(data).await.map_err(|e| {
                    write_error(silt_common::Error::from(e).context("writing an upload part"))
                })
            }
        }
    }
}

/// Writes `body` into `sink` from offset 0 and checks it against `expected` and
/// `content_length`; the caller keeps what it wrote only if this succeeds. `trailers`: the
/// request's trailing headers (an `aws-chunked` body), ready once the body has been read.
pub(crate) async fn receive(
    mut sink: Sink<'_>,
    body: Option<StreamingBlob>,
    content_length: Option<i64>,
    expected: &Expected,
    trailers: Option<&s3s::TrailingHeaders>,
) -> S3Result<Received> {
    let mut md5 = (expected.md5.is_some() || expected.want_md5).then(Md5::new);
    let mut hasher = expected.hasher();
    let mut len = 0u64;
    if let Some(mut body) = body {
        while let Some(chunk) = body.next().await {
            let chunk: Bytes = chunk.map_err(body_error)?;
            if let Some(m) = &mut md5 {
                m.update(&chunk);
            }
            hasher.update(&chunk);
            sink.put(len, &chunk).await?;
            len += chunk.len() as u64;
            metrics::GATEWAY_WRITE_BYTES.add(chunk.len() as u64);
        }
    }
    if let Some(n) = content_length {
        if u64::try_from(n).ok() != Some(len) {
            return Err(s3_error!(
                IncompleteBody,
                "You did not provide the number of bytes specified by the Content-Length HTTP header"
            ));
        }
    }
    let md5 = md5.map(Md5::finalize);
    if let (Some(given), Some(got)) = (&expected.md5, &md5) {
        let given = base64_decode(given)
            .filter(|b| b.len() == 16)
            .ok_or_else(|| s3_error!(InvalidDigest, "The Content-MD5 you specified was invalid"))?;
        if given != got {
            return Err(s3_error!(
                BadDigest,
                "The Content-MD5 you specified did not match what we received"
            ));
        }
    }
    let computed = hasher.finalize();
    let mut claimed = expected.checksums.clone();
    if let Some(name) = &expected.trailer {
        let value = trailers
            .and_then(|t| t.take())
            .and_then(|h| {
                h.get(name.as_str())
                    .and_then(|v| v.to_str().ok().map(str::to_string))
            })
            .ok_or_else(|| {
                s3_error!(
                    InvalidRequest,
                    "the body ended without the trailer its x-amz-trailer header announced"
                )
            })?;
        set_checksum(&mut claimed, name, value);
    }
    for (name, get) in CHECKSUMS {
        if let (Some(want), Some(got)) = (get(&claimed), get(&computed)) {
            if want != got {
                return Err(S3Error::with_message(
                    S3ErrorCode::BadDigest,
                    format!("The {name} you specified did not match the calculated checksum"),
                ));
            }
        }
    }
    Ok(Received {
        len,
        md5,
        checksums: computed,
    })
}

fn set_checksum(c: &mut Checksum, name: &str, value: String) {
    match name {
        "x-amz-checksum-crc32" => c.checksum_crc32 = Some(value),
        "x-amz-checksum-crc32c" => c.checksum_crc32c = Some(value),
        "x-amz-checksum-sha1" => c.checksum_sha1 = Some(value),
        "x-amz-checksum-sha256" => c.checksum_sha256 = Some(value),
        "x-amz-checksum-crc64nvme" => c.checksum_crc64nvme = Some(value),
        _ => {}
    }
}

fn base64_decode(s: &str) -> Option<Vec<u8>> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode(s.trim().as_bytes())
        .ok()
}

/// A request body that failed while it was read: cut off, a chunk signature that does not
/// match, a payload hash that does not.
fn body_error(e: s3s::StdError) -> S3Error {
    let text = e.to_string();
    if text.contains("SignatureMismatch") {
        s3_error!(
            SignatureDoesNotMatch,
            "The chunk signature does not match the request's"
        )
    } else if text.contains("Sha256Mismatch") {
        let mut e = S3Error::with_message(
            S3ErrorCode::Custom("XAmzContentSHA256Mismatch".into()),
            "The provided 'x-amz-content-sha256' header does not match what was computed",
        );
        e.set_status_code(hyper::StatusCode::BAD_REQUEST);
        e
    } else if text.contains("FormatError") || text.contains("TooLarge") || text.contains("TooMany")
    {
        s3_error!(InvalidRequest, "malformed aws-chunked body")
    } else {
        s3_error!(IncompleteBody, "The request body ended early")
    }
}

/// A write into the upload buffer that failed.
pub(crate) fn write_error(e: silt_common::Error) -> S3Error {
    match e.kind() {
        ErrorKind::FileTooLarge => {
            S3Error::with_message(S3ErrorCode::EntityTooLarge, e.to_string())
        }
        ErrorKind::NoSpace => {
            let mut err = S3Error::with_message(
                S3ErrorCode::ServiceUnavailable,
                format!("no room for the upload: {e}"),
            );
            err.set_status_code(hyper::StatusCode::INSUFFICIENT_STORAGE);
            err
        }
        _ => to_s3(e),
    }
}

/// An error of starting or committing a write, as S3 would say it.
pub(crate) fn commit_error(e: silt_common::Error) -> S3Error {
    match e.kind() {
        // A key under a key (`a/b` where `a` is an object), or a key that is a "directory"
        // here: the namespace is a file tree and cannot hold both.
        ErrorKind::NotADirectory | ErrorKind::IsADirectory | ErrorKind::AlreadyExists => {
            let mut err = S3Error::with_message(
                S3ErrorCode::Custom("KeyConflict".into()),
                format!("the key conflicts with another: {e} (docs/gateway.md: keys are paths)"),
            );
            err.set_status_code(hyper::StatusCode::CONFLICT);
            err
        }
        ErrorKind::PreconditionFailed => crate::conditions::precondition_failed(),
        ErrorKind::ReadOnly => S3Error::with_message(
            S3ErrorCode::AccessDenied,
            format!("Access Denied: {e} (the mount's write rules allow no writes here)"),
        ),
        _ => write_error(e),
    }
}

/// Uploads `body` to `path` as a whole object with the headers `headers`: received and
/// checked, then committed (the write type's promise kept) and closed; the checksums the body
/// was checked against are kept with it. Returns the committed entry.
pub(crate) async fn upload(
    client: &Client,
    path: &str,
    body: Option<StreamingBlob>,
    content_length: Option<i64>,
    expected: &Expected,
    trailers: Option<&s3s::TrailingHeaders>,
    mut headers: silt_ufs::Headers,
) -> S3Result<(Entry, Received)> {
    let w = client
        .open_upload(path, Default::default())
        .await
        .map_err(commit_error)?;
    // On any error below `w` is dropped unclosed: nothing is committed.
    let sink = Sink::Upload(client, &w);
    let got = receive(sink, body, content_length, expected, trailers).await?;
    crate::meta::set_checksums(&mut headers, &got.checksums);
    client.set_headers(&w, headers);
    if let Some(c) = expected.condition.clone() {
        client.set_precondition(&w, c);
    }
    let entry = finish(client, &w).await?;
    Ok((entry, got))
}

/// Commits and closes an upload.
pub(crate) async fn finish(client: &Client, w: &FileWriter) -> S3Result<Entry> {
    let entry = client.commit(w).await.map_err(commit_error)?;
    client.close(w).await.map_err(commit_error)?;
    metrics::GATEWAY_OBJECTS_WRITTEN.inc();
    Ok(entry)
}

/// Deletes `key` of the bucket at `root`: a file, or for a key ending in `/` (a "folder"
/// marker) the directory if it is empty. Returns the path changed, if any. A key that names
/// nothing is success, as on S3.
pub(crate) async fn delete_key(client: &Client, root: &str, key: &str) -> S3Result<Option<String>> {
    if let Some(dir) = key.strip_suffix('/').filter(|d| crate::valid_key(d)) {
        let path = format!("{root}/{dir}");
        return match client.rmdir(&path).await {
            Ok(()) => Ok(Some(path)),
            // Not empty, not there, a file: the marker S3 would delete is not a thing here.
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::NotEmpty | ErrorKind::NotFound | ErrorKind::NotADirectory
                ) =>
            {
                Ok(None)
            }
            Err(e) => Err(commit_error(e)),
        };
    }
    if !crate::valid_key(key) {
        return Ok(None);
    }
    let path = format!("{root}/{key}");
    delete(client, root, &path).await?;
    Ok(Some(path))
}

/// Makes the directory `path` and those missing above it, below the bucket at `root`
/// (`KeyConflict` where a file is in the way).
pub(crate) async fn make_dirs(client: &Client, root: &str, path: &str) -> S3Result<()> {
    let rel = path
        .strip_prefix(root)
        .unwrap_or(path)
        .trim_start_matches('/');
    let mut at = root.to_string();
    for part in rel.split('/') {
        at.push('/');
        at.push_str(part);
        match client.stat_live(&at).await {
            Ok((e, _)) if e.is_dir() => continue,
            Ok(_) => {
                return Err(commit_error(silt_common::Error::new(
                    ErrorKind::NotADirectory,
                    format!("{at} is a file"),
                )))
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(to_s3(e)),
        }
        match client.mkdir(&at).await {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
            Err(e) => return Err(commit_error(e)),
        }
    }
    Ok(())
}

/// Deletes the file at `path` (nothing there is success, as on S3), then the directories
/// above it it leaves empty, up to (not including) `root`.
async fn delete(client: &Client, root: &str, path: &str) -> S3Result<()> {
    match client.remove_file(path).await {
        Ok(()) => {}
        // No such key (or a "directory" key): S3 answers a delete of nothing with success.
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::NotFound | ErrorKind::IsADirectory | ErrorKind::NotADirectory
            ) =>
        {
            return Ok(())
        }
        Err(e) => return Err(commit_error(e)),
    }
    let mut dir = path;
    while let Some(i) = dir.rfind('/') {
        dir = &dir[..i];
        if dir.len() <= root.len() {
            break;
        }
        // Not empty (or not ours to remove): the directories above stay too.
        if client.rmdir(dir).await.is_err() {
            break;
        }
    }
    Ok(())
}

impl Gateway {
    pub(crate) async fn put_object_impl(
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
            make_dirs(&self.client, &root, &path).await?;
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
        let (entry, got) = upload(
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

    pub(crate) async fn delete_object_impl(
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
        delete_key(&self.client, &root, &i.key).await?;
        Ok(S3Response::new(DeleteObjectOutput::default()))
    }

    pub(crate) async fn delete_objects_impl(
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
                match delete_key(&self.client, &root, &o.key).await {
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
}
