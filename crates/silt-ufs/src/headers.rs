//! What an S3 client stores with an object besides its bytes: the standard headers
//! (`Content-Type`, `Cache-Control`, ...), its user metadata (`x-amz-meta-*`), the checksums
//! its upload was checked against, and the part sizes of a multipart upload.
//!
//! Every store keeps them in its own native form (see `UnderStore::write_from_attrs` and
//! `UnderStore::headers`):
//!
//! - S3, GCS: the headers OpenDAL sends natively for the service ([`Native`]: S3 all four of
//!   `Content-Type`, `Cache-Control`, `Content-Disposition`, `Content-Encoding`, GCS all but
//!   `Content-Disposition`) as themselves, user metadata as user metadata (`x-amz-meta-KEY`),
//!   the rest as user metadata under `silt-` keys ([`to_user_metadata`]);
//! - Azure Blob: `Content-Type` and `Cache-Control` natively, the rest as one metadata entry
//!   holding JSON (Azure's metadata names must be C# identifiers: `x-amz-meta-my-key` could
//!   not be one);
//! - a local directory: extended attributes `user.s3.*` ([`xattrs`]), or where the file
//!   system has none a hidden file beside the object;
//! - HDFS: the same `user.s3.*` extended attributes, through WebHDFS.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The S3-visible metadata of an object. `Default` is "none".
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Headers {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_control: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_disposition: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_encoding: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_language: Option<String>,
    /// `Expires`, as the client sent it (an HTTP date).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<String>,
    /// User metadata (`x-amz-meta-KEY: value`), keys in lower case without the prefix.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub user: BTreeMap<String, String>,
    /// Checksums of the object by algorithm (`crc32`, `crc32c`, `sha1`, `sha256`,
    /// `crc64nvme`), base64 as S3 gives them; a multipart upload's composite ones end in `-N`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub checksums: BTreeMap<String, String>,
    /// `FULL_OBJECT` or `COMPOSITE`, where there are checksums.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum_type: Option<String>,
    /// The part sizes of an object completed from a multipart upload, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<u64>,
}

/// The checksum algorithms S3 names, as `Headers::checksums` keys.
pub const CHECKSUM_ALGORITHMS: &[&str] = &["crc32", "crc32c", "sha1", "sha256", "crc64nvme"];

/// User-metadata keys Silt keeps its own fields under on S3 and GCS (`x-amz-meta-silt-...`).
const SILT_PREFIX: &str = "silt-";

impl Headers {
    pub fn is_empty(&self) -> bool {
        *self == Headers::default()
    }

    /// The fields as (name, value) pairs in one flat namespace: the header names in lower
    /// case (`content-type`), `meta.KEY` for user metadata, `checksum.ALGO`,
    /// `checksum-type` and `parts` (run-length coded: `SIZExCOUNT,...`). The names of the
    /// `user.s3.` extended attributes and of Silt's `silt-` user-metadata keys.
    pub fn fields(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut put = |k: &str, v: &Option<String>| {
            if let Some(v) = v {
                out.push((k.to_string(), v.clone()));
            }
        };
        put("content-type", &self.content_type);
        put("cache-control", &self.cache_control);
        put("content-disposition", &self.content_disposition);
        put("content-encoding", &self.content_encoding);
        put("content-language", &self.content_language);
        put("expires", &self.expires);
        put("checksum-type", &self.checksum_type);
        for (k, v) in &self.user {
            out.push((format!("meta.{k}"), v.clone()));
        }
        for (k, v) in &self.checksums {
            out.push((format!("checksum.{k}"), v.clone()));
        }
        if !self.parts.is_empty() {
            out.push(("parts".to_string(), encode_parts(&self.parts)));
        }
        out
    }

    /// The inverse of [`Headers::fields`]; unknown names and malformed values are skipped
    /// (written by a newer version, or by hand).
    pub fn from_fields<'a>(fields: impl IntoIterator<Item = (&'a str, String)>) -> Headers {
        let mut h = Headers::default();
        for (k, v) in fields {
            match k {
                "content-type" => h.content_type = Some(v),
                "cache-control" => h.cache_control = Some(v),
                "content-disposition" => h.content_disposition = Some(v),
                "content-encoding" => h.content_encoding = Some(v),
                "content-language" => h.content_language = Some(v),
                "expires" => h.expires = Some(v),
                "checksum-type" => h.checksum_type = Some(v),
                "parts" => h.parts = decode_parts(&v).unwrap_or_default(),
                _ => {
                    if let Some(key) = k.strip_prefix("meta.") {
                        h.user.insert(key.to_string(), v);
                    } else if let Some(algo) = k.strip_prefix("checksum.") {
                        if CHECKSUM_ALGORITHMS.contains(&algo) {
                            h.checksums.insert(algo.to_string(), v);
                        }
                    }
                }
            }
        }
        h
    }
}

/// Part sizes run-length coded: `8388608x12,1234` for twelve 8 MiB parts and a last one
/// (S3 and GCS keep at most 2 KiB of user metadata: a list of 10,000 sizes would not fit).
fn encode_parts(parts: &[u64]) -> String {
    let mut runs: Vec<(u64, usize)> = Vec::new();
    for &p in parts {
        match runs.last_mut() {
            Some((size, n)) if *size == p => *n += 1,
            _ => runs.push((p, 1)),
        }
    }
    runs.iter()
        .map(|(size, n)| match n {
            1 => size.to_string(),
            n => format!("{size}x{n}"),
        })
        .collect::<Vec<_>>()
        .join(",")
}

fn decode_parts(text: &str) -> Option<Vec<u64>> {
    let mut out = Vec::new();
    for run in text.split(',').filter(|r| !r.is_empty()) {
        let (size, n): (u64, usize) = match run.split_once('x') {
            Some((s, n)) => (s.parse().ok()?, n.parse::<usize>().ok()?),
            None => (run.parse().ok()?, 1),
        };
        // S3 allows 10,000 parts: more is not a list Silt wrote.
        if out.len() + n > 10_000 {
            return None;
        }
        out.extend(std::iter::repeat_n(size, n));
    }
    Some(out)
}

/// Which of the four standard headers a store's service sends (and reads back) as itself.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Native {
    pub content_type: bool,
    pub cache_control: bool,
    pub content_disposition: bool,
    pub content_encoding: bool,
}

impl Native {
    /// What an OpenDAL operator writes natively.
    pub(crate) fn of(op: &opendal::Operator) -> Native {
        let c = op.info().capability();
        Native {
            content_type: c.write_with_content_type,
            cache_control: c.write_with_cache_control,
            content_disposition: c.write_with_content_disposition,
            content_encoding: c.write_with_content_encoding,
        }
    }

    fn has(&self, field: &str) -> bool {
        match field {
            "content-type" => self.content_type,
            "cache-control" => self.cache_control,
            "content-disposition" => self.content_disposition,
            "content-encoding" => self.content_encoding,
            _ => false,
        }
    }

    /// `h` without the headers sent natively.
    pub(crate) fn rest(&self, h: &Headers) -> Headers {
        let keep = |on: bool, v: &Option<String>| if on { None } else { v.clone() };
        Headers {
            content_type: keep(self.content_type, &h.content_type),
            cache_control: keep(self.cache_control, &h.cache_control),
            content_disposition: keep(self.content_disposition, &h.content_disposition),
            content_encoding: keep(self.content_encoding, &h.content_encoding),
            ..h.clone()
        }
    }
}

/// The user metadata that holds `h` on S3 and GCS beside the headers sent natively: the
/// client's own keys as they are, Silt's fields under `silt-` keys.
pub(crate) fn to_user_metadata(h: &Headers, native: Native) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> =
        h.user.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    for (k, v) in h.fields() {
        if !native.has(&k) && !k.starts_with("meta.") {
            out.push((format!("{SILT_PREFIX}{}", k.replace('.', "-")), v));
        }
    }
    out
}

/// The inverse of [`to_user_metadata`], with the natively kept headers given: every user
/// metadata key but Silt's own is the client's.
pub(crate) fn from_user_metadata<'a>(
    native: [Option<String>; 4],
    user: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Headers {
    let [content_type, cache_control, content_disposition, content_encoding] = native;
    let mut fields: Vec<(String, String)> = Vec::new();
    let mut h = Headers::default();
    for (k, v) in user {
        let k = k.to_ascii_lowercase();
        match k.strip_prefix(SILT_PREFIX) {
            Some(rest) => {
                let name = match rest.strip_prefix("checksum-") {
                    Some(algo) if algo != "type" => format!("checksum.{algo}"),
                    _ => rest.to_string(),
                };
                fields.push((name, v.to_string()));
            }
            None => {
                h.user.insert(k, v.to_string());
            }
        }
    }
    let silt = Headers::from_fields(fields.iter().map(|(k, v)| (k.as_str(), v.clone())));
    Headers {
        content_type: content_type.or(silt.content_type.clone()),
        cache_control: cache_control.or(silt.cache_control.clone()),
        content_disposition: content_disposition.or(silt.content_disposition.clone()),
        content_encoding: content_encoding.or(silt.content_encoding.clone()),
        user: h.user,
        ..silt
    }
}

/// Extended attributes of a local file or an HDFS file: `user.s3.` and each field's name.
pub mod xattrs {
    use super::Headers;

    /// The prefix of every extended attribute that holds a field.
    pub const PREFIX: &str = "user.s3.";

    /// The attributes that hold `h`.
    pub fn of(h: &Headers) -> Vec<(String, String)> {
        h.fields()
            .into_iter()
            .map(|(k, v)| (format!("{PREFIX}{k}"), v))
            .collect()
    }

    /// The headers the attributes `attrs` (all of a file's, any names) hold.
    pub fn to_headers(attrs: impl IntoIterator<Item = (String, String)>) -> Headers {
        let kept: Vec<(String, String)> = attrs
            .into_iter()
            .filter_map(|(k, v)| Some((k.strip_prefix(PREFIX)?.to_string(), v)))
            .collect();
        Headers::from_fields(kept.iter().map(|(k, v)| (k.as_str(), v.clone())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Headers {
        Headers {
            content_type: Some("text/csv".into()),
            cache_control: Some("max-age=60".into()),
            content_disposition: Some("attachment; filename=\"a b.csv\"".into()),
            content_encoding: Some("gzip".into()),
            content_language: Some("de-CH".into()),
            expires: Some("Thu, 01 Dec 2044 16:00:00 GMT".into()),
            user: [
                ("owner".into(), "etl".into()),
                ("my-key".into(), "v".into()),
            ]
            .into(),
            checksums: [(
                "sha256".into(),
                "n4bQgYhMfWWaL+qgxVrQFaO/TxsrC4Is0V1sFbDwCgg=".into(),
            )]
            .into(),
            checksum_type: Some("FULL_OBJECT".into()),
            parts: vec![8 << 20, 8 << 20, 8 << 20, 1234],
        }
    }

    #[test]
    fn fields_and_xattrs_round_trip() {
        let h = sample();
        assert_eq!(
            Headers::from_fields(h.fields().iter().map(|(k, v)| (k.as_str(), v.clone()))),
            h
        );
        assert_eq!(xattrs::to_headers(xattrs::of(&h)), h);
        assert!(xattrs::of(&h)
            .iter()
            .any(|(k, v)| k == "user.s3.parts" && v == "8388608x3,1234"));
        // Other attributes of the file are not headers.
        let mut with_other = xattrs::of(&h);
        with_other.push(("user.other".into(), "x".into()));
        with_other.push(("user.s3.unknown-field".into(), "x".into()));
        assert_eq!(xattrs::to_headers(with_other), h);
        assert!(Headers::default().fields().is_empty());
    }

    #[test]
    fn user_metadata_round_trips_and_keeps_the_clients_keys_as_they_are() {
        let h = sample();
        let all = Native {
            content_type: true,
            cache_control: true,
            content_disposition: true,
            content_encoding: true,
        };
        let user = to_user_metadata(&h, all);
        assert!(user.contains(&("owner".into(), "etl".into())));
        assert!(user.contains(&("silt-checksum-sha256".into(), h.checksums["sha256"].clone())));
        assert!(user.contains(&("silt-parts".into(), "8388608x3,1234".into())));
        // The native headers are not in it.
        assert!(!user.iter().any(|(k, _)| k.contains("content-type")));
        let native = [
            h.content_type.clone(),
            h.cache_control.clone(),
            h.content_disposition.clone(),
            h.content_encoding.clone(),
        ];
        let back = from_user_metadata(native, user.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        assert_eq!(back, h);
        // A store without a header natively keeps it among Silt's keys.
        let user = to_user_metadata(&h, Native::default());
        assert!(user.contains(&("silt-content-type".into(), "text/csv".into())));
        let none = [None, None, None, None];
        let back = from_user_metadata(none, user.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        assert_eq!(back, h);
        let only_type = Native {
            content_type: true,
            ..Native::default()
        };
        let rest = only_type.rest(&h);
        assert!(rest.content_type.is_none() && rest.cache_control.is_some());
    }

    #[test]
    fn parts_runs() {
        assert_eq!(encode_parts(&[5, 5, 5]), "5x3");
        assert_eq!(decode_parts("5x3,2"), Some(vec![5, 5, 5, 2]));
        assert_eq!(decode_parts("5x20000"), None);
        assert_eq!(decode_parts("x"), None);
    }
}
