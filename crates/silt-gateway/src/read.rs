//! Reads of an object: GetObject and HeadObject. What they answer (a `Range`, or one part
//! of an object uploaded in parts, with its status, `Content-Range` and whether the
//! object's checksums go with it), and the GET body: the file streamed from the client's
//! page cache in bounded pieces, read ahead of the connection by a task of its own.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use s3s::dto::*;
use s3s::stream::{ByteStream, RemainingLength};
use s3s::{s3_error, S3Request, S3Response, S3Result};
use silt_client::{Client, OpenFile};
use silt_common::metrics;
use tracing::debug;

use crate::conditions::check_conditions;
use crate::{etag_of, len_i64, meta, Gateway};

/// Bytes asked of the client per piece of a GET body. With [`BODY_PIECES`] pieces queued,
/// one response holds at most `(BODY_PIECES + 1) × READ_PIECE` (12 MiB) however large the
/// object; 4 MiB is a few pages, so a piece is read from the cache with one batched lookup.
pub(crate) const READ_PIECE: u64 = 4 << 20;
/// Pieces read ahead of the connection.
const BODY_PIECES: usize = 2;

/// What a GET and a HEAD answer alike (S3 gives a HEAD the headers the GET would have).
struct Shape {
    etag: String,
    range: std::ops::Range<u64>,
    content_range: Option<String>,
    parts_count: Option<i32>,
    /// The object's checksums go with the answer.
    checksums: bool,
}

/// The `Shape` of the answer to `$i` (a `GetObjectInput` or `HeadObjectInput`, which name
/// their fields alike) for `$entry` of `$size` bytes with headers `$h`: its conditions
/// checked first (a failed one is the request's error).
macro_rules! shape {
    ($i:expr, $entry:expr, $h:expr, $size:expr) => {{
        let etag = etag_of($entry);
        check_conditions(
            $entry,
            &etag,
            $i.if_match.as_ref(),
            $i.if_none_match.as_ref(),
            $i.if_modified_since.as_ref(),
            $i.if_unmodified_since.as_ref(),
        )?;
        let size = $size;
        let (range, content_range, parts_count) =
            ranged($i.range.as_ref(), $i.part_number, $h, size)?;
        let checksums = wants_checksums($i.checksum_mode.as_ref(), &range, size, $i.part_number);
        Shape {
            etag,
            range,
            content_range,
            parts_count,
            checksums,
        }
    }};
}

impl Gateway {
    pub(crate) async fn head_object_impl(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        let i = &req.input;
        let (entry, h) = self.object_and_headers(&i.bucket, &i.key).await?;
        let sh = shape!(i, &entry, &h, entry.size);
        let out = HeadObjectOutput {
            accept_ranges: Some("bytes".into()),
            content_length: Some(len_i64(sh.range.end - sh.range.start)),
            content_range: sh.content_range,
            e_tag: Some(ETag::Strong(sh.etag)),
            last_modified: entry.mtime.map(Timestamp::from),
            parts_count: sh.parts_count,
            ..Default::default()
        };
        // A part (or range) is 206 by `serve.rs`'s rule for HEADs with a Content-Range.
        Ok(S3Response::new(meta::with_headers!(
            out,
            &h,
            i,
            sh.checksums
        )))
    }

    pub(crate) async fn get_object_impl(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        let i = &req.input;
        let (file, h) = self.open_and_headers(&i.bucket, &i.key).await?;
        let entry = &file.entry;
        let sh = shape!(i, entry, &h, file.size());
        let last_modified = entry.mtime.map(Timestamp::from);
        let len = sh.range.end - sh.range.start;
        debug!(bucket = %i.bucket, key = %i.key, start = sh.range.start, len, "GET");
        let body = Body::start(self.client.clone(), file, sh.range);
        let out = GetObjectOutput {
            accept_ranges: Some("bytes".into()),
            body: Some(StreamingBlob::new(body)),
            content_length: Some(len_i64(len)),
            content_range: sh.content_range,
            e_tag: Some(ETag::Strong(sh.etag)),
            last_modified,
            parts_count: sh.parts_count,
            ..Default::default()
        };
        // A part (or range) is 206: s3s answers a GET with a Content-Range so.
        Ok(S3Response::new(meta::with_headers!(
            out,
            &h,
            i,
            sh.checksums
        )))
    }
}

/// A GET body: pieces of the file read by a task ahead of the connection, at most
/// [`BODY_PIECES`] queued. Dropping it (the client went away) stops the reads.
pub(crate) struct Body {
    rx: tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>,
    remaining: u64,
    /// Counted as bytes sent (a GET's body; a server-side copy's is not).
    sent: bool,
}

impl Body {
    pub(crate) fn start(client: Arc<Client>, file: OpenFile, range: std::ops::Range<u64>) -> Body {
        Body::read(client, file, range, true)
    }

    pub(crate) fn read(
        client: Arc<Client>,
        file: OpenFile,
        range: std::ops::Range<u64>,
        sent: bool,
    ) -> Body {
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
                        silt_common::warn_limited!(
                            "gateway: read failed mid-body",
                            path = %file.entry.path,
                            error = %e
                        );
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
        Body {
            rx,
            remaining,
            sent,
        }
    }
}

impl futures::Stream for Body {
    type Item = Result<Bytes, Box<dyn std::error::Error + Send + Sync>>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(Ok(b))) => {
                self.remaining = self.remaining.saturating_sub(b.len() as u64);
                if self.sent {
                    metrics::GATEWAY_READ_BYTES.add(b.len() as u64);
                }
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

/// The bytes a GET or HEAD asks for: a `Range`, or part `partNumber` of the object (S3 takes
/// one or the other), with its `Content-Range` and, for a part, the object's part count.
fn ranged(
    range: Option<&Range>,
    part_number: Option<i32>,
    h: &silt_ufs::Headers,
    size: u64,
) -> S3Result<(std::ops::Range<u64>, Option<String>, Option<i32>)> {
    let Some(n) = part_number else {
        let (r, cr) = resolve_range(range, size)?;
        return Ok((r, cr, None));
    };
    if range.is_some() {
        return Err(s3_error!(
            InvalidRequest,
            "Cannot specify both Range header and partNumber query parameter"
        ));
    }
    let (r, count) = meta::part_range(&h.parts, size, n)?;
    // An object of one part is answered whole, without a range or a count (as S3 does).
    if h.parts.is_empty() {
        return Ok((r, None, None));
    }
    let cr = (!r.is_empty()).then(|| format!("bytes {}-{}/{size}", r.start, r.end - 1));
    Ok((r, cr, Some(count)))
}

/// Whether an answer carries the object's checksums: asked for with `ChecksumMode=ENABLED`,
/// and for the whole object (or one of its parts, whose whole-object checksum S3 gives too:
/// not a range).
fn wants_checksums(
    mode: Option<&ChecksumMode>,
    range: &std::ops::Range<u64>,
    size: u64,
    part_number: Option<i32>,
) -> bool {
    mode.is_some_and(|m| m.as_str() == ChecksumMode::ENABLED)
        && (part_number.is_some() || (range.start == 0 && range.end == size))
}

#[cfg(test)]
mod tests {
    use super::*;
    use s3s::S3ErrorCode;

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
