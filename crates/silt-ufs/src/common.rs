//! What the OpenDAL-backed stores share: retries and their backoff, reading an OpenDAL error
//! (its S3 code, HTTP status, innermost cause), multipart sizes, and listing budgets.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use opendal::layers::RetryEvent;
use silt_common::metrics::{UFS_ERRORS, UFS_REQUESTS};
use silt_common::{Error, Result};
use tracing::debug;

/// Floor of the retry backoff; OpenDAL's default (1s) makes a flapping connection slow to
/// recover, and S3 asks for backoff starting in the 100ms range.
pub(crate) const RETRY_MIN_DELAY: Duration = Duration::from_millis(100);
pub(crate) const RETRY_MAX_DELAY: Duration = Duration::from_secs(10);
/// Upper bound on one attempt of the `verify` probe of a store over the network.
pub(crate) const PROBE_ATTEMPT_CAP: Duration = Duration::from_secs(10);

pub(crate) fn retry_event(ev: RetryEvent<'_>) {
    // Each retry is one more request to the store, and the one before it failed.
    UFS_REQUESTS.inc();
    UFS_ERRORS.inc();
    debug!(
        op = ?ev.op,
        attempt = ev.attempt,
        retry_after_ms = ev.retry_after.as_millis() as u64,
        error = %ev.err,
        "retrying under-store request"
    );
}

/// `field: "value"` in a `Debug` rendering (OpenDAL puts S3's `<Error>` there).
pub(crate) fn debug_field<'a>(text: &'a str, field: &str) -> Option<&'a str> {
    let start = text.find(&format!("{field}: \""))? + field.len() + 3;
    let len = text[start..].find('"')?;
    Some(&text[start..start + len])
}

/// A zero deadline would fail every request; say so instead.
pub(crate) fn check_timeout(timeout: Duration) -> Result<()> {
    if timeout.is_zero() {
        return Err(Error::invalid(
            "ufs_timeout must be greater than zero (e.g. 30s)",
        ));
    }
    Ok(())
}

/// The HTTP status of a failed response, from OpenDAL's response context (`Parts { status: 409`).
pub(crate) fn http_status(e: &opendal::Error) -> Option<u16> {
    let text = e.to_string();
    let start = text.find("Parts { status: ")? + "Parts { status: ".len();
    text.get(start..start + 3)?.parse().ok()
}

pub(crate) fn is_transport_error(msg: &str) -> bool {
    msg.starts_with("send http request") || msg.starts_with("read data from http response")
}

fn sources(e: &opendal::Error) -> impl Iterator<Item = &(dyn std::error::Error + 'static)> {
    let mut next = std::error::Error::source(e);
    std::iter::from_fn(move || {
        let cur = next?;
        next = cur.source();
        Some(cur)
    })
}

pub(crate) fn find_io_error(e: &opendal::Error) -> Option<&std::io::Error> {
    sources(e).find_map(|s| s.downcast_ref::<std::io::Error>())
}

/// The innermost cause, e.g. "Connection refused (os error 111)".
pub(crate) fn root_cause(e: &opendal::Error) -> String {
    sources(e)
        .last()
        .map(|s| s.to_string())
        .unwrap_or_else(|| e.message().to_string())
}

/// Name prefix of the hidden file a local write fills before renaming it over its target
/// (`FsStore`'s writes, and WebHDFS's; a random number follows); listings leave such names
/// out. One left by a crash mid-write is removed by `remove_dir` of its directory once
/// abandoned (docs/SEMANTICS.md).
pub(crate) const FS_WRITE_TEMP: &str = ".silt-write-";

/// Largest S3 object whose attributes can be changed (each change rewrites it whole).
pub(crate) const S3_ATTR_REWRITE_MAX: u64 = 64 << 20;

/// Part size of a multipart upload (`write_from`): memory per upload in flight.
pub(crate) const WRITE_PART: usize = 8 << 20;
/// S3 allows at most this many parts per multipart upload.
const MAX_PARTS: u64 = 10_000;

/// The part size for an upload of `len` bytes: [`WRITE_PART`], or larger (whole MiB) when
/// that many parts would pass S3's limit (so a 5 TiB file uploads in 525 MiB parts).
pub(crate) fn part_size(len: u64) -> usize {
    let need = len.div_ceil(MAX_PARTS).div_ceil(1 << 20) << 20;
    usize::try_from(need).map_or(usize::MAX, |n| n.max(WRITE_PART))
}

/// Listings include the directory itself (fs always, S3 when a `dir/` marker object exists).
pub(crate) fn is_listed_dir_itself(p: &str, dir_slash: &str) -> bool {
    p == dir_slash || p == "/" || p.is_empty()
}

/// Takes one entry from a listing budget; `false` once it is spent.
pub(crate) fn take_one(budget: &AtomicUsize) -> bool {
    budget
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| b.checked_sub(1))
        .is_ok()
}

/// The first `len` bytes of `src`, `part` bytes at a time: each part's offset and bytes, in
/// order (`shown` names the file being written, for messages).
pub(crate) fn parts<'a>(
    shown: &'a str,
    src: &'a dyn silt_common::io::ReadAt,
    len: u64,
    part: usize,
) -> impl Iterator<Item = Result<(u64, Bytes)>> + 'a {
    (0..len).step_by(part.max(1)).map(move |off| {
        let n = (len - off).min(part as u64) as usize;
        let bytes = src
            .read_at(off, n)
            .map_err(|e| e.context(format!("write {shown}: reading the local bytes")))?;
        Ok((off, bytes))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_stay_within_s3s_limit() {
        assert_eq!(part_size(0), WRITE_PART);
        assert_eq!(part_size(MAX_PARTS * WRITE_PART as u64), WRITE_PART);
        for len in [MAX_PARTS * WRITE_PART as u64 + 1, 1 << 40, 5 << 40] {
            let p = part_size(len) as u64;
            assert!(len.div_ceil(p) <= MAX_PARTS, "{len}: {p}");
            assert_eq!(p % (1 << 20), 0);
        }
    }
}
