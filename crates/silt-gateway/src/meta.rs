//! What an object carries besides its bytes, as S3 clients send and read it: the standard
//! headers, user metadata, checksums and the parts of a multipart upload. Stored through the
//! client's write path (`Client::set_headers`), read with `Client::headers`: the mount and
//! the SDK see what the gateway stored, and the gateway what an S3 client stored behind Silt's
//! back (`silt_ufs::Headers` says where each store keeps them). GetObjectAttributes is
//! answered here.

use std::sync::Arc;

use s3s::dto::*;
use s3s::{s3_error, S3Error, S3ErrorCode, S3Request, S3Response, S3Result};
use silt_client::{Client, Entry};
use silt_common::ErrorKind;
use silt_ufs::Headers;

use crate::{etag_of, len_i64, Gateway};

/// The headers of an upload from its request's fields (PutObject, CreateMultipartUpload,
/// CopyObject with `REPLACE`): the standard headers as given, `x-amz-meta-*` keys in lower
/// case.
macro_rules! request_headers {
    ($i:expr) => {
        $crate::meta::from_request(
            $i.content_type.clone(),
            $i.cache_control.clone(),
            $i.content_disposition.clone(),
            $i.content_encoding.clone(),
            $i.content_language.clone(),
            $i.expires.as_ref(),
            $i.metadata.as_ref(),
        )
    };
}
pub(crate) use request_headers;

/// An answer (HeadObject, GetObject) with what `$h` holds: its standard headers (a
/// `response-*` override of the request first), user metadata, and with `$checksums` its
/// checksums.
macro_rules! with_headers {
    ($out:expr, $h:expr, $i:expr, $checksums:expr) => {{
        let mut out = $out;
        let h: &silt_ufs::Headers = $h;
        out.content_type = $i
            .response_content_type
            .clone()
            .or_else(|| h.content_type.clone())
            .or_else(|| Some("application/octet-stream".to_string()));
        out.cache_control = $i
            .response_cache_control
            .clone()
            .or_else(|| h.cache_control.clone());
        out.content_disposition = $i
            .response_content_disposition
            .clone()
            .or_else(|| h.content_disposition.clone());
        out.content_encoding = $i
            .response_content_encoding
            .clone()
            .or_else(|| h.content_encoding.clone());
        out.content_language = $i
            .response_content_language
            .clone()
            .or_else(|| h.content_language.clone());
        out.expires = $i
            .response_expires
            .clone()
            .or_else(|| $crate::meta::expires_of(h));
        out.metadata = (!h.user.is_empty()).then(|| h.user.clone().into_iter().collect());
        if $checksums {
            let c = $crate::meta::checksum_of(h);
            out.checksum_crc32 = c.checksum_crc32;
            out.checksum_crc32c = c.checksum_crc32c;
            out.checksum_sha1 = c.checksum_sha1;
            out.checksum_sha256 = c.checksum_sha256;
            out.checksum_crc64nvme = c.checksum_crc64nvme;
            out.checksum_type = h.checksum_type.clone().map(ChecksumType::from);
        }
        out
    }};
}
pub(crate) use with_headers;

pub(crate) fn from_request(
    content_type: Option<String>,
    cache_control: Option<String>,
    content_disposition: Option<String>,
    content_encoding: Option<String>,
    content_language: Option<String>,
    expires: Option<&Timestamp>,
    metadata: Option<&Metadata>,
) -> Headers {
    Headers {
        content_type,
        cache_control,
        content_disposition,
        content_encoding,
        content_language,
        expires: expires.and_then(http_date),
        user: metadata
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.to_ascii_lowercase(), v.clone()))
                    .collect()
            })
            .unwrap_or_default(),
        ..Default::default()
    }
}

fn http_date(t: &Timestamp) -> Option<String> {
    let mut out = Vec::new();
    t.format(TimestampFormat::HttpDate, &mut out).ok()?;
    String::from_utf8(out).ok()
}

/// `Expires` as an answer carries it (a stored text that is no HTTP date is left out).
pub(crate) fn expires_of(h: &Headers) -> Option<Timestamp> {
    Timestamp::parse(TimestampFormat::HttpDate, h.expires.as_deref()?).ok()
}

/// The checksums `h` holds, as S3's `Checksum` fields.
pub(crate) fn checksum_of(h: &Headers) -> Checksum {
    let get = |algo: &str| h.checksums.get(algo).cloned();
    Checksum {
        checksum_crc32: get("crc32"),
        checksum_crc32c: get("crc32c"),
        checksum_sha1: get("sha1"),
        checksum_sha256: get("sha256"),
        checksum_crc64nvme: get("crc64nvme"),
        checksum_type: h.checksum_type.clone().map(ChecksumType::from),
    }
}

/// `h` with the whole-object checksums `c` (those an upload's body was computed with).
pub(crate) fn set_checksums(h: &mut Headers, c: &Checksum) {
    let mut put = |algo: &str, v: &Option<String>| {
        if let Some(v) = v {
            h.checksums.insert(algo.to_string(), v.clone());
        }
    };
    put("crc32", &c.checksum_crc32);
    put("crc32c", &c.checksum_crc32c);
    put("sha1", &c.checksum_sha1);
    put("sha256", &c.checksum_sha256);
    put("crc64nvme", &c.checksum_crc64nvme);
    if !h.checksums.is_empty() {
        h.checksum_type = Some(ChecksumType::FULL_OBJECT.to_string());
    }
}

/// The headers of the version `entry` names. A version replaced meanwhile is the caller's to
/// ask again for: `None`.
pub(crate) async fn headers_of(client: &Client, entry: &Entry) -> S3Result<Option<Arc<Headers>>> {
    match client.headers(entry).await {
        Ok(h) => Ok(Some(h)),
        Err(e) if e.kind() == ErrorKind::ContentChanged || e.kind() == ErrorKind::NotFound => {
            Ok(None)
        }
        Err(e) => Err(crate::to_s3(e)),
    }
}

/// The byte range of part `number` of an object of `size` bytes with the part sizes `parts`
/// (none: an object of one part, uploaded whole), and the part count to answer with.
pub(crate) fn part_range(
    parts: &[u64],
    size: u64,
    number: i32,
) -> S3Result<(std::ops::Range<u64>, i32)> {
    let bad = || {
        let mut e = S3Error::with_message(
            S3ErrorCode::Custom("InvalidPartNumber".into()),
            "The requested partnumber is not satisfiable",
        );
        e.set_status_code(hyper::StatusCode::RANGE_NOT_SATISFIABLE);
        e
    };
    let n = usize::try_from(number)
        .ok()
        .filter(|&n| n >= 1)
        .ok_or_else(bad)?;
    // A part list that does not add up to the object is not this version's.
    if parts.is_empty() || parts.iter().sum::<u64>() != size {
        return if n == 1 { Ok((0..size, 1)) } else { Err(bad()) };
    }
    if n > parts.len() {
        return Err(bad());
    }
    let start: u64 = parts[..n - 1].iter().sum();
    let count = i32::try_from(parts.len()).unwrap_or(i32::MAX);
    Ok((start..start + parts[n - 1], count))
}

impl Gateway {
    pub(crate) async fn get_object_attributes_impl(
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
            out.checksum = Some(checksum_of(&h));
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
            let max = crate::list::page_size(i.max_parts, "max-parts")?;
            let after = i.part_number_marker.unwrap_or(0).max(0);
            let parts: Vec<ObjectPart> = h
                .parts
                .iter()
                .enumerate()
                .map(|(n, size)| (i32::try_from(n + 1).unwrap_or(i32::MAX), *size))
                .filter(|(n, _)| *n > after)
                .take(max)
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
                max_parts: Some(max as i32),
                next_part_number_marker: if truncated { last } else { None },
                part_number_marker: Some(after),
                parts: Some(parts),
                total_parts_count: Some(total),
            });
        }
        Ok(S3Response::new(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_of_an_object() {
        let parts = [5u64, 5, 2];
        assert_eq!(part_range(&parts, 12, 1).unwrap(), (0..5, 3));
        assert_eq!(part_range(&parts, 12, 3).unwrap(), (10..12, 3));
        assert!(part_range(&parts, 12, 4).is_err());
        assert!(part_range(&parts, 12, 0).is_err());
        // One part: the whole object is part 1.
        assert_eq!(part_range(&[], 7, 1).unwrap(), (0..7, 1));
        assert!(part_range(&[], 7, 2).is_err());
        // Sizes of another version: as one part.
        assert_eq!(part_range(&parts, 99, 1).unwrap(), (0..99, 1));
    }

    #[test]
    fn expires_round_trips_as_an_http_date() {
        let t =
            Timestamp::parse(TimestampFormat::HttpDate, "Thu, 01 Dec 2044 16:00:00 GMT").unwrap();
        let h = from_request(None, None, None, None, None, Some(&t), None);
        assert_eq!(h.expires.as_deref(), Some("Thu, 01 Dec 2044 16:00:00 GMT"));
        assert_eq!(expires_of(&h), Some(t));
    }
}

/// What a multipart upload keeps from its CreateMultipartUpload until its completion: the
/// object's headers, and the checksum the object gets (S3's `x-amz-checksum-algorithm` and
/// `x-amz-checksum-type`).
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct UploadMeta {
    pub headers: Headers,
    /// `crc32`, `crc32c`, `sha1`, `sha256` or `crc64nvme`.
    pub algorithm: Option<String>,
    /// The object's checksum is of its whole bytes (`FULL_OBJECT`), not of its parts'
    /// checksums (`COMPOSITE`).
    pub full_object: bool,
}

impl UploadMeta {
    /// From a CreateMultipartUpload's checksum fields, refused as S3 refuses a type the
    /// algorithm has not (SHA checksums are composite only, CRC64NVME full-object only).
    pub(crate) fn new(
        headers: Headers,
        algorithm: Option<&ChecksumAlgorithm>,
        kind: Option<&ChecksumType>,
    ) -> S3Result<UploadMeta> {
        let algorithm = algorithm.map(|a| a.as_str().to_ascii_lowercase());
        let full_object = match (algorithm.as_deref(), kind.map(ChecksumType::as_str)) {
            (None, Some(_)) => {
                return Err(invalid(
                    "x-amz-checksum-type needs an x-amz-checksum-algorithm",
                ))
            }
            (None, None) => false,
            (Some("crc64nvme"), None | Some(ChecksumType::FULL_OBJECT)) => true,
            (Some("crc32" | "crc32c"), None | Some(ChecksumType::COMPOSITE)) => false,
            (Some("crc32" | "crc32c"), Some(ChecksumType::FULL_OBJECT)) => true,
            (Some("sha1" | "sha256"), None | Some(ChecksumType::COMPOSITE)) => false,
            (Some(a), Some(t)) if silt_ufs::CHECKSUM_ALGORITHMS.contains(&a) => {
                return Err(invalid(&format!(
                    "The {} checksum type cannot be used with the {} checksum algorithm.",
                    t.to_ascii_lowercase(),
                    a
                )))
            }
            (Some(_), _) => return Err(invalid("Checksum algorithm provided is unsupported.")),
        };
        Ok(UploadMeta {
            headers,
            algorithm,
            full_object,
        })
    }
}

fn invalid(msg: &str) -> S3Error {
    S3Error::with_message(S3ErrorCode::InvalidRequest, msg.to_string())
}

/// A hasher of one algorithm (none: of nothing).
fn hasher(algo: Option<&str>) -> s3s::checksum::ChecksumHasher {
    let on = |a: &str| algo == Some(a);
    s3s::checksum::ChecksumHasher {
        crc32: on("crc32").then(Default::default),
        crc32c: on("crc32c").then(Default::default),
        sha1: on("sha1").then(Default::default),
        sha256: on("sha256").then(Default::default),
        crc64nvme: on("crc64nvme").then(Default::default),
    }
}

/// The value of `algo` in `c`.
fn value_of(c: &Checksum, algo: &str) -> Option<String> {
    match algo {
        "crc32" => c.checksum_crc32.clone(),
        "crc32c" => c.checksum_crc32c.clone(),
        "sha1" => c.checksum_sha1.clone(),
        "sha256" => c.checksum_sha256.clone(),
        "crc64nvme" => c.checksum_crc64nvme.clone(),
        _ => None,
    }
}

/// The part sizes and the object checksum of a multipart upload, as its completion reads the
/// parts in order.
pub(crate) struct Completion {
    algorithm: Option<String>,
    full_object: bool,
    whole: s3s::checksum::ChecksumHasher,
    part: s3s::checksum::ChecksumHasher,
    /// The parts' raw digests, one after another (a composite checksum is of these).
    digests: Vec<u8>,
    sizes: Vec<u64>,
    at: u64,
}

impl Completion {
    pub(crate) fn new(m: &UploadMeta) -> Completion {
        let a = m.algorithm.as_deref();
        Completion {
            algorithm: m.algorithm.clone(),
            full_object: m.full_object,
            whole: hasher(a.filter(|_| m.full_object)),
            part: hasher(a.filter(|_| !m.full_object)),
            digests: Vec::new(),
            sizes: Vec::new(),
            at: 0,
        }
    }

    pub(crate) fn update(&mut self, data: &[u8]) {
        self.whole.update(data);
        self.part.update(data);
        self.at += data.len() as u64;
    }

    pub(crate) fn end_part(&mut self) {
        self.sizes.push(std::mem::take(&mut self.at));
        let done = std::mem::replace(&mut self.part, hasher(None));
        if let (Some(a), false) = (self.algorithm.as_deref(), self.full_object) {
            self.part = hasher(Some(a));
            let raw = value_of(&done.finalize(), a).and_then(|v| {
                use base64::Engine;
                base64::engine::general_purpose::STANDARD.decode(v).ok()
            });
            self.digests.extend(raw.unwrap_or_default());
        }
    }

    /// The object's headers: `m`'s, with its part sizes and checksum.
    pub(crate) fn finish(self, m: &UploadMeta) -> Headers {
        let mut h = Headers {
            parts: self.sizes,
            ..m.headers.clone()
        };
        let Some(a) = self.algorithm.as_deref() else {
            return h;
        };
        let value = if self.full_object {
            value_of(&self.whole.finalize(), a)
        } else {
            let mut of_digests = hasher(Some(a));
            of_digests.update(&self.digests);
            value_of(&of_digests.finalize(), a).map(|v| format!("{v}-{}", h.parts.len()))
        };
        if let Some(v) = value {
            h.checksums.insert(a.to_string(), v);
            h.checksum_type = Some(
                if self.full_object {
                    ChecksumType::FULL_OBJECT
                } else {
                    ChecksumType::COMPOSITE
                }
                .to_string(),
            );
        }
        h
    }
}
