//! Just enough gRPC for CSI: unary calls over HTTP/2 (prior knowledge, as CSI's Unix sockets
//! speak it), protobuf bodies in gRPC's 5-byte framing, status and message in the trailers.
//! Compression is not offered, so a compressed frame is refused with `Unimplemented`.

use std::convert::Infallible;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{HeaderMap, HeaderValue};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{UnixListener, UnixStream};

/// The largest request the plugin reads (CSI requests are small; secrets and contexts are
/// maps of short strings).
const MAX_REQUEST: usize = 4 << 20;

/// gRPC status codes used here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Ok = 0,
    InvalidArgument = 3,
    NotFound = 5,
    PermissionDenied = 7,
    AlreadyExists = 6,
    FailedPrecondition = 9,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
}

/// A call's failure: a code and a message for the caller (the kubelet logs it on the pod).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub code: i32,
    pub message: String,
}

impl Status {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Status {
            code: code as i32,
            message: message.into(),
        }
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(Code::InvalidArgument, message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(Code::NotFound, message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(Code::Internal, message)
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "gRPC status {}: {}", self.code, self.message)
    }
}

impl std::error::Error for Status {}

pub type Reply = Result<Vec<u8>, Status>;
pub type BoxFuture = Pin<Box<dyn Future<Output = Reply> + Send>>;

/// What serves the calls: the full method path (`/csi.v1.Node/NodeStageVolume`) and the
/// request message's bytes in, the response message's bytes or a status out.
pub trait Handler: Send + Sync + 'static {
    fn call(self: Arc<Self>, method: String, message: Bytes) -> BoxFuture;
}

/// Decodes a request message, a malformed one being the caller's error.
pub fn decode<M: prost::Message + Default>(bytes: &[u8]) -> Result<M, Status> {
    M::decode(bytes).map_err(|e| Status::invalid(format!("malformed request message: {e}")))
}

pub fn encode<M: prost::Message>(m: &M) -> Reply {
    Ok(m.encode_to_vec())
}

/// Binds the socket (owner-only: whoever can talk to it can mount anything the plugin can).
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let listener = UnixListener::bind(path)?;
    silt_common::private::restrict(path)?;
    Ok(listener)
}

pub async fn serve_on(listener: UnixListener, handler: Arc<dyn Handler>) -> std::io::Result<()> {
    loop {
        let (stream, _) = listener.accept().await?;
        let handler = handler.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| respond(handler.clone(), req));
            let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service);
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "CSI connection ended with an error");
            }
        });
    }
}

type ReplyBody =
    StreamBody<futures::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, Infallible>>>>;

async fn respond(
    handler: Arc<dyn Handler>,
    req: Request<Incoming>,
) -> Result<Response<ReplyBody>, Infallible> {
    let method = req.uri().path().to_string();
    let outcome = match Limited::new(req.into_body(), MAX_REQUEST + 5)
        .collect()
        .await
    {
        Err(e) => Err(Status::invalid(format!("reading the request: {e}"))),
        Ok(body) => match unframe(&body.to_bytes()) {
            Err(s) => Err(s),
            Ok(message) => {
                let started = std::time::Instant::now();
                let out = handler.call(method.clone(), message).await;
                match &out {
                    Ok(_) => tracing::debug!(method, took = ?started.elapsed(), "CSI call"),
                    Err(s) => {
                        tracing::info!(method, code = s.code, message = %s.message, "CSI call failed")
                    }
                }
                out
            }
        },
    };
    let mut frames = Vec::new();
    let mut trailers = HeaderMap::new();
    match outcome {
        Ok(message) => {
            frames.push(Ok(Frame::data(frame(&message))));
            trailers.insert("grpc-status", HeaderValue::from(Code::Ok as i32));
        }
        Err(status) => {
            trailers.insert("grpc-status", HeaderValue::from(status.code));
            if let Ok(v) = HeaderValue::from_str(&percent_encode(&status.message)) {
                trailers.insert("grpc-message", v);
            }
        }
    }
    frames.push(Ok(Frame::trailers(trailers)));
    let mut response = Response::new(StreamBody::new(futures::stream::iter(frames)));
    response
        .headers_mut()
        .insert("content-type", HeaderValue::from_static("application/grpc"));
    Ok(response)
}

/// One message in gRPC's framing: flag byte (0: not compressed), length, bytes.
fn frame(message: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(5 + message.len());
    b.put_u8(0);
    b.put_u32(message.len() as u32);
    b.put_slice(message);
    b.freeze()
}

/// The one message of a unary call's body.
fn unframe(body: &Bytes) -> Result<Bytes, Status> {
    if body.len() < 5 {
        return Err(Status::invalid(
            "request body shorter than a gRPC frame header",
        ));
    }
    if body[0] != 0 {
        return Err(Status::new(
            Code::Unimplemented,
            "compressed messages are not supported",
        ));
    }
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    if len > MAX_REQUEST || body.len() != 5 + len {
        return Err(Status::invalid(format!(
            "gRPC frame says {len} bytes, the body has {}",
            body.len() - 5
        )));
    }
    Ok(body.slice(5..))
}

/// grpc-message is percent-encoded (the spec's "Percent-Encoded" rule).
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 3 <= b.len() {
            let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("");
            if let Ok(v) = u8::from_str_radix(hex, 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A unary call to the plugin at `socket` (for tests and tools): the reply message's bytes,
/// or the status the plugin answered.
pub async fn call(socket: &Path, method: &str, message: &[u8]) -> Result<Bytes, Status> {
    let unavailable = |what: &str, e: &dyn std::fmt::Display| {
        Status::new(Code::Unavailable, format!("{what}: {e}"))
    };
    let stream = UnixStream::connect(socket)
        .await
        .map_err(|e| unavailable(&format!("connecting to {}", socket.display()), &e))?;
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .map_err(|e| unavailable("HTTP/2 handshake", &e))?;
    tokio::spawn(conn);
    let req = Request::post(format!("http://localhost{method}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(frame(message)))
        .map_err(|e| Status::internal(format!("building the request: {e}")))?;
    let resp = send
        .send_request(req)
        .await
        .map_err(|e| unavailable("sending the request", &e))?;
    let headers = resp.headers().clone();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| unavailable("reading the reply", &e))?;
    let trailers = body.trailers().cloned().unwrap_or(headers);
    let code: i32 = trailers
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| Status::internal("reply without grpc-status"))?;
    if code != 0 {
        let message = trailers
            .get("grpc-message")
            .and_then(|v| v.to_str().ok())
            .map(percent_decode)
            .unwrap_or_default();
        return Err(Status { code, message });
    }
    unframe(&body.to_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_bad_frames_are_refused() {
        let f = frame(b"hello");
        assert_eq!(unframe(&f).unwrap(), Bytes::from_static(b"hello"));
        assert_eq!(unframe(&frame(b"")).unwrap(), Bytes::new());
        assert_eq!(unframe(&Bytes::from_static(b"\0\0")).unwrap_err().code, 3);
        let mut long = f.to_vec();
        long.push(1);
        assert_eq!(unframe(&Bytes::from(long)).unwrap_err().code, 3);
        let mut compressed = f.to_vec();
        compressed[0] = 1;
        assert_eq!(unframe(&Bytes::from(compressed)).unwrap_err().code, 12);
    }

    #[test]
    fn messages_are_percent_encoded_both_ways() {
        let m = "volume \"a\" 100% gone\n(é)";
        let e = percent_encode(m);
        assert!(e.bytes().all(|b| (0x20..0x7f).contains(&b)));
        assert_eq!(percent_decode(&e), m);
        assert_eq!(percent_decode("50%"), "50%");
        assert_eq!(percent_decode("%é"), "%é");
    }
}
