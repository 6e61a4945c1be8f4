//! Wire framing shared by Silt's local control socket (and, with the cluster, worker RPC).
//!
//! A frame is `u32 length (big-endian) | u8 kind | payload`, where `length` counts the kind
//! byte and the payload. Control messages are JSON; payload bytes travel as raw `Data`
//! frames and are never wrapped in a serialized message. Every request carries the protocol
//! version; a peer answers an unknown version with an `Error` frame.

use bytes::Bytes;
use serde::{de::DeserializeOwned, Serialize};
use silt_common::{Error, ErrorKind, Result};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

pub const PROTOCOL_VERSION: u32 = 1;

/// Largest frame accepted; larger lengths mean a corrupt or hostile stream.
pub const MAX_FRAME: usize = 64 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// A JSON control message.
    Json = 1,
    /// Raw payload bytes.
    Data = 2,
    /// End of a response.
    End = 3,
    /// A JSON `ErrorBody`; ends the response.
    Error = 4,
}

impl FrameKind {
    fn from_u8(b: u8) -> Option<Self> {
        Some(match b {
            1 => FrameKind::Json,
            2 => FrameKind::Data,
            3 => FrameKind::End,
            4 => FrameKind::Error,
            _ => return None,
        })
    }
}

/// The body of an `Error` frame.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct ErrorBody {
    pub kind: String,
    pub errno: i32,
    pub message: String,
}

impl ErrorBody {
    pub fn from_error(e: &Error) -> Self {
        ErrorBody {
            kind: e.kind().as_str().to_string(),
            errno: e.errno(),
            message: e.to_string(),
        }
    }

    pub fn into_error(self) -> Error {
        let kind = ALL_KINDS
            .iter()
            .copied()
            .find(|k| k.as_str() == self.kind)
            .unwrap_or(ErrorKind::Internal);
        Error::new(kind, self.message)
    }
}

const ALL_KINDS: &[ErrorKind] = &[
    ErrorKind::NotFound,
    ErrorKind::PermissionDenied,
    ErrorKind::InvalidInput,
    ErrorKind::Unsupported,
    ErrorKind::ContentChanged,
    ErrorKind::Unavailable,
    ErrorKind::Timeout,
    ErrorKind::RateLimited,
    ErrorKind::NoSpace,
    ErrorKind::Corrupted,
    ErrorKind::Busy,
    ErrorKind::NotADirectory,
    ErrorKind::IsADirectory,
    ErrorKind::AlreadyExists,
    ErrorKind::Internal,
    ErrorKind::ReadOnly,
    ErrorKind::NotEmpty,
    ErrorKind::NameTooLong,
    ErrorKind::CrossDevice,
    ErrorKind::FileTooLarge,
];

pub async fn write_frame<W: AsyncWrite + Unpin>(
    w: &mut W,
    kind: FrameKind,
    payload: &[u8],
) -> Result<()> {
    if payload.len() >= MAX_FRAME {
        return Err(Error::invalid(format!(
            "frame of {} bytes exceeds the limit",
            payload.len()
        )));
    }
    let len = (payload.len() + 1) as u32;
    let mut head = [0u8; 5];
    head[..4].copy_from_slice(&len.to_be_bytes());
    head[4] = kind as u8;
    if payload.len() <= ONE_WRITE {
        // Head and payload in one write: one system call, and a peer woken once.
        let mut frame = Vec::with_capacity(head.len() + payload.len());
        frame.extend_from_slice(&head);
        frame.extend_from_slice(payload);
        w.write_all(&frame).await?;
    } else {
        w.write_all(&head).await?;
        w.write_all(payload).await?;
    }
    Ok(())
}

pub async fn write_json<W: AsyncWrite + Unpin, T: Serialize>(w: &mut W, value: &T) -> Result<()> {
    let body =
        serde_json::to_vec(value).map_err(|e| Error::internal(format!("encoding JSON: {e}")))?;
    write_frame(w, FrameKind::Json, &body).await
}

pub async fn write_error<W: AsyncWrite + Unpin>(w: &mut W, e: &Error) -> Result<()> {
    let body = serde_json::to_vec(&ErrorBody::from_error(e))
        .map_err(|e| Error::internal(e.to_string()))?;
    write_frame(w, FrameKind::Error, &body).await
}

/// Reads one frame; `None` on a clean end of stream before a frame starts.
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> Result<Option<(FrameKind, Bytes)>> {
    read_frame_max(r, MAX_FRAME).await
}

/// [`read_frame`] accepting frames of at most `max` bytes: a peer not yet authenticated must
/// not make this side allocate a large buffer.
pub async fn read_frame_max<R: AsyncRead + Unpin>(
    r: &mut R,
    max: usize,
) -> Result<Option<(FrameKind, Bytes)>> {
    // The head is read exactly (never past the frame: a descriptor passed after it rides on
    // the next byte), in one call when it has arrived whole.
    let mut head = [0u8; 5];
    let first = loop {
        match r.read(&mut head).await {
            Ok(n) => break n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        }
    };
    if first == 0 {
        return Ok(None);
    }
    r.read_exact(&mut head[first..]).await?;
    let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
    if len == 0 || len > max.min(MAX_FRAME) {
        return Err(Error::new(
            ErrorKind::Corrupted,
            format!("invalid frame length {len}"),
        ));
    }
    let kind = FrameKind::from_u8(head[4]).ok_or_else(|| {
        Error::new(
            ErrorKind::Corrupted,
            format!("unknown frame kind {}", head[4]),
        )
    })?;
    // The buffer grows with the bytes that arrive, never far ahead of them: a peer announcing
    // MAX_FRAME and sending nothing costs at most READ_CHUNK, not 64 MiB per connection.
    let want = len - 1;
    let mut payload = Vec::with_capacity(want.min(READ_CHUNK));
    let got = r.take(want as u64).read_to_end(&mut payload).await?;
    if got != want {
        return Err(Error::new(
            ErrorKind::Corrupted,
            format!("frame ended after {got} of {want} bytes"),
        ));
    }
    Ok(Some((kind, Bytes::from(payload))))
}

/// Frames up to this size are written with one call (the head copied in front of the payload).
const ONE_WRITE: usize = 64 << 10;

/// Most a frame's buffer is allocated ahead of its bytes: a page frame (1 MiB by default)
/// gets its whole buffer at once instead of growing (and copying) its way there.
const READ_CHUNK: usize = 4 << 20;

/// A request as it travels: `{"v": PROTOCOL_VERSION, "op": ..., ...}`, the request a tagged
/// enum (`#[serde(tag = "op")]`) whose fields sit beside the version.
#[derive(Serialize)]
pub struct Versioned<'a, T: Serialize> {
    v: u32,
    #[serde(flatten)]
    req: &'a T,
}

impl<'a, T: Serialize> Versioned<'a, T> {
    pub fn new(req: &'a T) -> Self {
        Versioned {
            v: PROTOCOL_VERSION,
            req,
        }
    }
}

/// Decodes a request frame, once and whole: a JSON message whose protocol version this side
/// speaks (checked before anything else), then the request it holds, a tagged enum (`op`
/// names the variant; a missing field is refused by name, fields it does not have are
/// ignored). The error is what to answer the peer with.
pub fn decode_request<T: DeserializeOwned>(kind: FrameKind, payload: &[u8]) -> Result<T> {
    if kind != FrameKind::Json {
        return Err(Error::invalid("expected a JSON request"));
    }
    let value: serde_json::Value = decode_json(payload)?;
    let Some(v) = value.get("v").and_then(serde_json::Value::as_u64) else {
        return Err(Error::invalid("malformed request: no protocol version `v`"));
    };
    if v != u64::from(PROTOCOL_VERSION) {
        return Err(Error::new(
            ErrorKind::Unsupported,
            format!("protocol version {v} not supported (this silt speaks {PROTOCOL_VERSION})"),
        ));
    }
    let op = match value.get("op") {
        Some(serde_json::Value::String(op)) => format!("{op:?} "),
        _ => String::new(),
    };
    serde_json::from_value(value).map_err(|e| Error::invalid(format!("malformed {op}request: {e}")))
}

pub fn decode_json<T: DeserializeOwned>(payload: &[u8]) -> Result<T> {
    serde_json::from_slice(payload).map_err(|e| Error::invalid(format!("malformed message: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Every frame `bytes` holds, until the end or the first error (which must come: the
    /// reader may not hang on a finite input).
    fn frames(bytes: &[u8]) -> (Vec<(FrameKind, Bytes)>, Option<Error>) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut r = bytes;
            let mut out = Vec::new();
            loop {
                match read_frame(&mut r).await {
                    Ok(Some(f)) => out.push(f),
                    Ok(None) => return (out, None),
                    Err(e) => return (out, Some(e)),
                }
            }
        })
    }

    /// Frames small and large cross a pipe that passes one byte at a time (a head that
    /// arrives in pieces is read whole), and the reader stops at each frame's end.
    #[test]
    fn frames_cross_a_byte_at_a_time() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let (mut w, mut r) = tokio::io::duplex(1);
            let big = vec![7u8; ONE_WRITE + 3];
            let sent = big.clone();
            let writer = tokio::spawn(async move {
                write_frame(&mut w, FrameKind::Json, b"{}").await.unwrap();
                write_frame(&mut w, FrameKind::Data, &sent).await.unwrap();
                write_frame(&mut w, FrameKind::End, b"").await.unwrap();
            });
            let got = |f: Option<(FrameKind, Bytes)>| f.map(|(k, p)| (k as u8, p.to_vec()));
            assert_eq!(
                got(read_frame(&mut r).await.unwrap()),
                Some((FrameKind::Json as u8, b"{}".to_vec()))
            );
            assert_eq!(
                got(read_frame(&mut r).await.unwrap()),
                Some((FrameKind::Data as u8, big))
            );
            assert_eq!(
                got(read_frame(&mut r).await.unwrap()),
                Some((FrameKind::End as u8, Vec::new()))
            );
            writer.await.unwrap();
            assert!(read_frame(&mut r).await.unwrap().is_none());
        });
    }

    /// A stream of valid frames: JSON requests like the ones peers send, and data.
    fn valid_stream() -> impl Strategy<Value = Vec<u8>> {
        let frame = prop_oneof![
            (any::<u32>(), "[a-z]{0,8}", any::<u64>(), any::<u64>()).prop_map(
                |(v, op, offset, len)| {
                    (
                        FrameKind::Json,
                        serde_json::to_vec(
                            &serde_json::json!({"v": v, "op": op, "offset": offset, "len": len}),
                        )
                        .unwrap(),
                    )
                }
            ),
            proptest::collection::vec(any::<u8>(), 0..300).prop_map(|d| (FrameKind::Data, d)),
            Just((FrameKind::End, Vec::new())),
        ];
        proptest::collection::vec(frame, 0..6).prop_map(|fs| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            rt.block_on(async {
                let mut buf = Vec::new();
                for (k, p) in fs {
                    write_frame(&mut buf, k, &p).await.unwrap();
                }
                buf
            })
        })
    }

    /// A request goes out with its version beside its fields and comes back whole; another
    /// version is refused before its operation is looked at; a missing field is named with
    /// the operation that needs it; other fields are ignored.
    #[test]
    fn versioned_requests_decode_once_or_say_why_not() {
        #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
        #[serde(tag = "op", rename_all = "kebab-case")]
        enum Ask {
            Stats,
            SyncPolicy {
                path: String,
                policy: Option<String>,
            },
        }
        let ask = Ask::SyncPolicy {
            path: "/d".into(),
            policy: Some("never".into()),
        };
        let wire = serde_json::to_value(Versioned::new(&ask)).unwrap();
        assert_eq!(
            wire,
            serde_json::json!({"v": PROTOCOL_VERSION, "op": "sync-policy", "path": "/d", "policy": "never"})
        );
        let bytes = serde_json::to_vec(&wire).unwrap();
        assert_eq!(decode_request::<Ask>(FrameKind::Json, &bytes).unwrap(), ask);
        let err = |v: serde_json::Value| {
            decode_request::<Ask>(FrameKind::Json, &serde_json::to_vec(&v).unwrap()).unwrap_err()
        };
        let e = err(serde_json::json!({"v": 9, "op": "nothing we know"}));
        assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
        let e = err(serde_json::json!({"v": 1, "op": "sync-policy"}));
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        assert!(
            e.to_string().contains("\"sync-policy\"") && e.to_string().contains("path"),
            "{e}"
        );
        let e = err(serde_json::json!({"v": 1, "op": "explode"}));
        assert!(e.to_string().contains("unknown variant"), "{e}");
        let e = err(serde_json::json!({"op": "stats"}));
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        let extra = serde_json::json!({"v": 1, "op": "stats", "path": "/x", "recursive": true});
        let bytes = serde_json::to_vec(&extra).unwrap();
        assert_eq!(
            decode_request::<Ask>(FrameKind::Json, &bytes).unwrap(),
            Ask::Stats
        );
        assert!(decode_request::<Ask>(FrameKind::Data, b"{}").is_err());
    }

    /// A request type of the shape every protocol's is: a tagged enum.
    #[derive(Debug, serde::Deserialize)]
    #[serde(tag = "op", rename_all = "lowercase")]
    #[allow(dead_code)]
    enum Req {
        Stats,
        Read { path: String, offset: u64 },
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

        /// Arbitrary bytes: frames, then a clean end or an error; each JSON frame decodes to a
        /// request or an error.
        #[test]
        fn arbitrary_bytes_give_frames_or_an_error(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let (fs, err) = frames(&bytes);
            let mut used = 0;
            for (k, p) in &fs {
                used += 5 + p.len();
                let _ = decode_request::<Req>(*k, p);
                let _ = decode_json::<ErrorBody>(p).map(ErrorBody::into_error);
            }
            prop_assert!(used <= bytes.len());
            // A clean end means every byte was a frame; anything left over is an error.
            if err.is_none() {
                prop_assert_eq!(used, bytes.len());
            }
        }

        /// Valid streams with flipped bytes, a cut, or a rewritten length field: never more
        /// bytes than were sent, never a panic.
        #[test]
        fn damaged_streams_give_frames_or_an_error(
            stream in valid_stream(),
            flips in proptest::collection::vec((any::<prop::sample::Index>(), 1..=255u8), 0..3),
            cut in proptest::option::of(any::<prop::sample::Index>()),
            new_len in proptest::option::of(any::<u32>()),
        ) {
            let mut s = stream.clone();
            if let (Some(l), true) = (new_len, s.len() >= 4) {
                s[..4].copy_from_slice(&l.to_be_bytes());
            }
            for (at, x) in flips {
                if !s.is_empty() {
                    let i = at.index(s.len());
                    s[i] ^= x;
                }
            }
            if let Some(at) = cut {
                s.truncate(at.index(s.len() + 1));
            }
            let (fs, err) = frames(&s);
            let used: usize = fs.iter().map(|(_, p)| 5 + p.len()).sum();
            prop_assert!(used <= s.len());
            if err.is_none() {
                prop_assert_eq!(used, s.len(), "a clean end only after whole frames");
            }
            for (k, p) in &fs {
                let _ = decode_request::<Req>(*k, p);
            }
            if s == stream {
                prop_assert!(err.is_none());
            }
        }
    }

    /// Largest allocation made by this test binary's threads while they watch.
    static LARGEST: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    thread_local! {
        static WATCH: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    struct Watching;
    // SAFETY: forwards to the system allocator; only records sizes.
    unsafe impl std::alloc::GlobalAlloc for Watching {
        unsafe fn alloc(&self, l: std::alloc::Layout) -> *mut u8 {
            if WATCH.try_with(|w| w.get()).unwrap_or(false) {
                LARGEST.fetch_max(l.size(), std::sync::atomic::Ordering::Relaxed);
            }
            // SAFETY: same layout contract as ours.
            unsafe { std::alloc::System.alloc(l) }
        }
        unsafe fn dealloc(&self, p: *mut u8, l: std::alloc::Layout) {
            // SAFETY: allocated by System above.
            unsafe { std::alloc::System.dealloc(p, l) }
        }
    }
    #[global_allocator]
    static ALLOC: Watching = Watching;

    /// A frame announcing the largest length and then nothing: refused as soon as the stream
    /// ends, with a buffer of at most READ_CHUNK allocated (not 64 MiB).
    #[tokio::test]
    async fn a_huge_length_with_no_bytes_is_refused() {
        let mut head = (MAX_FRAME as u32).to_be_bytes().to_vec();
        head.push(FrameKind::Data as u8);
        head.extend_from_slice(b"abc");
        let mut r = &head[..];
        WATCH.with(|w| w.set(true));
        let e = read_frame(&mut r).await.unwrap_err();
        WATCH.with(|w| w.set(false));
        let largest = LARGEST.load(std::sync::atomic::Ordering::Relaxed);
        assert!(
            largest <= READ_CHUNK,
            "allocated {largest} bytes for a 3-byte frame"
        );
        assert_eq!(e.kind(), ErrorKind::Corrupted, "{e}");
        assert!(e.to_string().contains("after 3 of"), "{e}");
        // One past the limit: refused from the header alone.
        let mut head = (MAX_FRAME as u32 + 1).to_be_bytes().to_vec();
        head.push(FrameKind::Data as u8);
        let mut r = &head[..];
        assert!(read_frame(&mut r).await.is_err());
    }

    #[tokio::test]
    async fn frames_round_trip_and_bad_input_is_rejected() {
        let mut buf = Vec::new();
        write_frame(&mut buf, FrameKind::Data, b"abc")
            .await
            .unwrap();
        write_json(&mut buf, &serde_json::json!({"op": "x"}))
            .await
            .unwrap();
        write_error(&mut buf, &Error::not_found("gone"))
            .await
            .unwrap();
        let mut r = &buf[..];
        let (k, p) = read_frame(&mut r).await.unwrap().unwrap();
        assert_eq!((k, &p[..]), (FrameKind::Data, &b"abc"[..]));
        let (k, p) = read_frame(&mut r).await.unwrap().unwrap();
        assert_eq!(k, FrameKind::Json);
        let v: serde_json::Value = decode_json(&p).unwrap();
        assert_eq!(v["op"], "x");
        let (k, p) = read_frame(&mut r).await.unwrap().unwrap();
        assert_eq!(k, FrameKind::Error);
        let e = decode_json::<ErrorBody>(&p).unwrap().into_error();
        assert_eq!(e.kind(), ErrorKind::NotFound);
        assert!(read_frame(&mut r).await.unwrap().is_none());

        // Hostile lengths and kinds, and truncation, are errors, never panics or huge allocations.
        for bad in [
            &[0u8, 0, 0, 0, 1][..],
            &[0xff, 0xff, 0xff, 0xff, 1],
            &[0, 0, 0, 2, 9, 0],
            &[0, 0, 0, 9, 2, 1],
        ] {
            let mut r = bad;
            assert!(read_frame(&mut r).await.is_err(), "{bad:?}");
        }
    }
}
