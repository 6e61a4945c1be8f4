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
    w.write_all(&head).await?;
    w.write_all(payload).await?;
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
    let mut head = [0u8; 5];
    match r.read_exact(&mut head[..1]).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    r.read_exact(&mut head[1..]).await?;
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
    let mut payload = vec![0u8; len - 1];
    r.read_exact(&mut payload).await?;
    Ok(Some((kind, Bytes::from(payload))))
}

/// Decodes a request frame: a JSON message whose protocol version (`version_of`) this side
/// speaks. The error is what to answer the peer with.
pub fn decode_request<T: DeserializeOwned>(
    kind: FrameKind,
    payload: &[u8],
    version_of: impl Fn(&T) -> u32,
) -> Result<T> {
    if kind != FrameKind::Json {
        return Err(Error::invalid("expected a JSON request"));
    }
    let req: T = decode_json(payload)?;
    let v = version_of(&req);
    if v != PROTOCOL_VERSION {
        return Err(Error::new(
            ErrorKind::Unsupported,
            format!("protocol version {v} not supported (this silt speaks {PROTOCOL_VERSION})"),
        ));
    }
    Ok(req)
}

pub fn decode_json<T: DeserializeOwned>(payload: &[u8]) -> Result<T> {
    serde_json::from_slice(payload).map_err(|e| Error::invalid(format!("malformed message: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

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
