//! Conditional requests: the `If-*` headers of a read (GET, HEAD, a copy's source) as S3
//! evaluates them, and a write's (`If-Match`, `If-None-Match: *`) as the condition the
//! client checks at the commit.

use std::sync::Arc;
use std::time::SystemTime;

use s3s::dto::*;
use s3s::{s3_error, S3Error, S3ErrorCode, S3Result};
use silt_client::{Entry, Precondition};

use crate::etag_of;

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
pub(crate) fn check_conditions(
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

/// Checks the conditions of a copy's source (`x-amz-copy-source-if-*` of `$i`, a
/// CopyObject's or UploadPartCopy's input, which name them alike) on `$entry` (ETag `$etag`),
/// as GET's, except that any failure is 412 (S3 answers no 304 to a copy).
macro_rules! check_copy_source {
    ($entry:expr, $etag:expr, $i:expr) => {
        $crate::conditions::check_conditions(
            $entry,
            $etag,
            $i.copy_source_if_match.as_ref(),
            $i.copy_source_if_none_match.as_ref(),
            $i.copy_source_if_modified_since.as_ref(),
            $i.copy_source_if_unmodified_since.as_ref(),
        )
        .map_err(|e| {
            if *e.code() == s3s::S3ErrorCode::NotModified {
                $crate::conditions::precondition_failed()
            } else {
                e
            }
        })
    };
}
pub(crate) use check_copy_source;

/// A write's conditions (`If-None-Match: *`: only if the key is free; `If-Match`: only over
/// that version) as the client checks them at the commit (`Client::set_precondition`), so a
/// write landing between the request's arrival and its commit is seen, as S3 sees it.
pub(crate) fn write_condition(
    if_match: Option<&ETagCondition>,
    if_none_match: Option<&ETagCondition>,
) -> S3Result<Option<Precondition>> {
    match if_none_match {
        Some(ETagCondition::ETag(_)) => {
            return Err(s3_error!(
                NotImplemented,
                "If-None-Match on a write takes only *"
            ))
        }
        // Both: nothing can pass (a missing key fails If-Match with 404, a present one
        // If-None-Match with 412).
        Some(ETagCondition::Any) if if_match.is_some() => {
            return Ok(Some(Precondition::Matches(Arc::new(|_: &Entry| false))))
        }
        Some(ETagCondition::Any) => return Ok(Some(Precondition::Absent)),
        None => {}
    }
    Ok(if_match
        .cloned()
        .map(|c| Precondition::Matches(Arc::new(move |e: &Entry| etag_matches(&c, &etag_of(e))))))
}

pub(crate) fn precondition_failed() -> S3Error {
    s3_error!(
        PreconditionFailed,
        "At least one of the pre-conditions you specified did not hold"
    )
}
