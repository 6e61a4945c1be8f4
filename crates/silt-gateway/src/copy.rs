//! Server-side copies: CopyObject (a whole-object upload of the client fed from the source's
//! pages, with the source's headers or, with `REPLACE`, the request's), copies into
//! multipart uploads (UploadPartCopy), and what S3 refuses of a CopyObject onto itself.
//!
//! UploadPartCopy reads the source (a whole object or `x-amz-copy-source-range: bytes=a-b`)
//! through the client's cache, like CopyObject, and stores it as a part exactly as
//! UploadPart would (`multipart::Uploads::put_part`): its ETag is the MD5 of its bytes.

use std::time::SystemTime;

use s3s::dto::*;
use s3s::{s3_error, S3Error, S3ErrorCode, S3Request, S3Response, S3Result};

use crate::conditions::check_copy_source;
use crate::read::Body;
use crate::{etag_of, meta, multipart, read, to_s3, write, Gateway};

/// S3's largest copy source of one UploadPartCopy (5 GiB, the largest part).
const MAX_COPY_PART: u64 = 5 << 30;

/// The bytes `x-amz-copy-source-range` names of an object of `size` bytes. S3 takes only
/// `bytes=first-last` (no suffix or open range), within the object.
pub(crate) fn copy_range(range: Option<&str>, size: u64) -> S3Result<std::ops::Range<u64>> {
    let Some(r) = range else {
        return Ok(0..size);
    };
    let parsed = r
        .strip_prefix("bytes=")
        .and_then(|s| s.split_once('-'))
        .and_then(|(a, b)| {
            let digits = |x: &str| !x.is_empty() && x.bytes().all(|c| c.is_ascii_digit());
            if !digits(a) || !digits(b) {
                return None;
            }
            Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?))
        })
        .filter(|(a, b)| a <= b);
    let Some((first, last)) = parsed else {
        return Err(s3_error!(
            InvalidArgument,
            "The x-amz-copy-source-range value must be of the form bytes=first-last where first and last are the zero-based offsets of the first and last bytes to copy"
        ));
    };
    if last >= size {
        return Err(S3Error::with_message(
            S3ErrorCode::InvalidArgument,
            format!("Range specified is not valid for source object of size: {size}"),
        ));
    }
    Ok(first..last + 1)
}

/// The source a copy names: bucket and key (versions and access points are not supported).
pub(crate) fn copy_source(src: &CopySource) -> S3Result<(String, String)> {
    match src {
        CopySource::Bucket {
            bucket,
            key,
            version_id: None,
        } => Ok((bucket.to_string(), key.to_string())),
        CopySource::Bucket { .. } => Err(s3_error!(
            NotImplemented,
            "object versions are not supported"
        )),
        _ => Err(s3_error!(NotImplemented, "access points are not supported")),
    }
}

/// S3 refuses a CopyObject of an object onto itself that changes nothing of it (its
/// metadata, storage class, website redirect, encryption or checksum).
pub(crate) fn check_not_copy_to_itself(
    src_bucket: &str,
    src_key: &str,
    i: &CopyObjectInput,
) -> S3Result<()> {
    let same = src_bucket == i.bucket && src_key == i.key;
    let replaces = i
        .metadata_directive
        .as_ref()
        .is_some_and(|d| d.as_str() == MetadataDirective::REPLACE);
    let changes = replaces
        || i.storage_class.is_some()
        || i.website_redirect_location.is_some()
        || i.server_side_encryption.is_some()
        || i.ssekms_key_id.is_some()
        || i.sse_customer_algorithm.is_some()
        || i.checksum_algorithm.is_some();
    if same && !changes {
        return Err(s3_error!(
            InvalidRequest,
            "This copy request is illegal because it is trying to copy an object to itself without changing the object's metadata, storage class, website redirect location or encryption attributes."
        ));
    }
    Ok(())
}

impl Gateway {
    pub(crate) async fn copy_object_impl(
        &self,
        req: S3Request<CopyObjectInput>,
    ) -> S3Result<S3Response<CopyObjectOutput>> {
        let i = &req.input;
        let (src_bucket, src_key) = copy_source(&i.copy_source)?;
        check_not_copy_to_itself(&src_bucket, &src_key, i)?;
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
        check_copy_source!(&file.entry, &etag, i)?;
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

    pub(crate) async fn upload_part_copy_impl(
        &self,
        req: S3Request<UploadPartCopyInput>,
    ) -> S3Result<S3Response<UploadPartCopyOutput>> {
        let i = &req.input;
        let (src_bucket, src_key) = copy_source(&i.copy_source)?;
        multipart::check_part_number(i.part_number)?;
        let u = self.uploads.get(&i.upload_id, &i.bucket, &i.key).await?;
        self.may_read(req.credentials.as_ref(), &src_bucket)?;
        let file = self.open(&src_bucket, &src_key).await?;
        let etag = etag_of(&file.entry);
        check_copy_source!(&file.entry, &etag, i)?;
        let range = copy_range(i.copy_source_range.as_deref(), file.size())?;
        let len = range.end - range.start;
        if len > MAX_COPY_PART {
            return Err(S3Error::with_message(
                S3ErrorCode::InvalidRequest,
                format!("The specified copy source is larger than the maximum allowable size for a copy source: {MAX_COPY_PART}"),
            ));
        }
        // Read through the cache in pieces, ahead of the part file, as a GET body is.
        let body = Body::read(self.client.clone(), file, range, false);
        let (part_etag, _) = self
            .uploads
            .put_part(
                &u,
                i.part_number,
                Some(StreamingBlob::new(body)),
                Some(crate::len_i64(len)),
                Default::default(),
                None,
            )
            .await?;
        // The part's time as ListParts shows it.
        let modified = self
            .uploads
            .parts(&u.id)
            .await?
            .into_iter()
            .find(|p| p.number == i.part_number && p.etag == part_etag)
            .and_then(|p| p.modified)
            .unwrap_or_else(SystemTime::now);
        Ok(S3Response::new(UploadPartCopyOutput {
            copy_part_result: Some(CopyPartResult {
                e_tag: Some(ETag::Strong(part_etag)),
                last_modified: Some(Timestamp::from(modified)),
                ..Default::default()
            }),
            ..Default::default()
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_source_ranges_as_s3_takes_them() {
        assert_eq!(copy_range(None, 10).unwrap(), 0..10);
        assert_eq!(copy_range(Some("bytes=0-9"), 10).unwrap(), 0..10);
        assert_eq!(copy_range(Some("bytes=3-3"), 10).unwrap(), 3..4);
        for bad in [
            "byte=1-2",
            "bytes=invalid-range",
            "bytes=5-2",
            "bytes=-2-3",
            "bytes=aa-12",
            "bytes=12-aa",
            "bytes=3-",
            "bytes=-3",
            "bytes=+1-2",
        ] {
            let e = copy_range(Some(bad), 10).unwrap_err();
            assert_eq!(*e.code(), S3ErrorCode::InvalidArgument, "{bad}");
            assert!(
                e.message().unwrap_or("").contains("bytes=first-last"),
                "{bad}"
            );
        }
        for past in ["bytes=0-10", "bytes=12-30"] {
            let e = copy_range(Some(past), 10).unwrap_err();
            assert_eq!(*e.code(), S3ErrorCode::InvalidArgument, "{past}");
            assert!(e.message().unwrap_or("").contains("size: 10"), "{past}");
        }
        assert!(copy_range(Some("bytes=0-0"), 0).is_err());
    }
}
