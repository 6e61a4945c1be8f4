//! The HTTP side of the gateway: the listener, one hyper connection per client, and what
//! is done around `s3s` for every request (presigned-URL and POST-policy checks, request
//! ids, closing a connection whose request body was left unread, 206 for a ranged HEAD, the
//! request metrics).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use s3s::service::S3Service;
use silt_common::metrics;
use tokio::net::TcpListener;
use tracing::debug;

use crate::{edge, post, tls, GatewayError};

/// Longest a connection may take to send a request head, or stay idle between requests.
const HEADER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Serves `service` on `listener` until `shutdown` completes (connections in flight are
/// dropped with the runtime); in TLS when given an acceptor.
pub async fn serve(
    listener: TcpListener,
    service: S3Service,
    tls: Option<tokio_rustls::TlsAcceptor>,
    shutdown: impl Future<Output = ()> + Send,
) {
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            _ = &mut shutdown => return,
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // Out of descriptors and the like: the listener stays; a short pause
                    // keeps an error that repeats from spinning.
                    silt_common::warn_limited!("gateway: accept failed", error = %e);
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let service = service.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            match tls {
                None => serve_connection(stream, service, peer).await,
                Some(acceptor) => {
                    match tokio::time::timeout(tls::HANDSHAKE_TIMEOUT, acceptor.accept(stream))
                        .await
                    {
                        Ok(Ok(s)) => serve_connection(s, service, peer).await,
                        Ok(Err(e)) => debug!(%peer, error = %e, "gateway: TLS handshake failed"),
                        Err(_) => debug!(%peer, "gateway: TLS handshake timed out"),
                    }
                }
            }
        });
    }
}

/// Answers the requests of one connection.
async fn serve_connection<S>(io: S, service: S3Service, peer: std::net::SocketAddr)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    // s3s answers every HeadObject 200; S3 answers a ranged one 206 like the GET.
    let svc = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        let svc = service.clone();
        async move {
            let head = req.method() == hyper::Method::HEAD;
            let ids = edge::Ids::new();
            let (parts, mut body) = req.into_parts();
            let mut refused = edge::check_presigned(parts.uri.query()).err();
            // A POST form: its policy's date checked before s3s reads the form.
            let mut start = None;
            if refused.is_none() && parts.method == hyper::Method::POST {
                if let Some(b) = post::form_boundary(parts.headers.get(hyper::header::CONTENT_TYPE))
                {
                    let head = post::peek(&mut body, &b)
                        .await
                        .map_err(|e| s3s::HttpError::new(Box::new(e)))?;
                    refused = post::check_policy_date(&head, &b).err();
                    start = Some(head);
                }
            }
            let (body, end_read) = WatchedBody::wrap(body, start);
            let mut resp = match refused {
                None => svc.call(hyper::Request::from_parts(parts, body)).await?,
                Some(e) => e
                    .to_http_response()
                    .map_err(|e| s3s::HttpError::new(Box::new(e)))?,
            };
            ids.apply(&mut resp);
            if end_read.is_some_and(|end| !end.load(Ordering::Acquire)) {
                // Answered before the request's body was read to its end (refused, or failed
                // part-way): the client may still send the rest, or (told nothing after an
                // `Expect: 100-continue`) never send it, and the server cannot tell which.
                // Keeping the connection would read its next request from the wrong byte
                // (RFC 9110 10.1.1: say the connection closes).
                resp.headers_mut().insert(
                    hyper::header::CONNECTION,
                    hyper::header::HeaderValue::from_static("close"),
                );
            }
            metrics::GATEWAY_REQUESTS.inc();
            let status = resp.status();
            if status.is_client_error() || status.is_server_error() {
                metrics::GATEWAY_ERRORS.inc();
            }
            if status == hyper::StatusCode::FORBIDDEN {
                metrics::GATEWAY_DENIED.inc();
            }
            // s3s answers a GET with a Content-Range 206 but a HEAD 200, whatever status the
            // handler set: a HEAD of a range or of one part of an object is 206 here, as S3
            // answers it.
            if head
                && resp.status() == hyper::StatusCode::OK
                && resp.headers().contains_key(hyper::header::CONTENT_RANGE)
            {
                *resp.status_mut() = hyper::StatusCode::PARTIAL_CONTENT;
            }
            Ok::<_, s3s::HttpError>(resp)
        }
    });
    // A client that never finishes a request head (or idles between requests) is let go
    // after HEADER_TIMEOUT: a few hundred such connections would otherwise hold their
    // descriptors forever.
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .serve_connection(hyper_util::rt::TokioIo::new(io), svc);
    if let Err(e) = conn.await {
        debug!(%peer, error = %e, "gateway connection ended");
    }
}

/// A request body that records when its end has been read; `start`: what was read of it
/// already (the fields of a POST form), sent first.
struct WatchedBody {
    start: Option<Bytes>,
    inner: hyper::body::Incoming,
    end_read: Arc<AtomicBool>,
}

impl WatchedBody {
    /// The body for s3s, and (when there is a body at all) the flag its end sets.
    fn wrap(
        inner: hyper::body::Incoming,
        start: Option<Bytes>,
    ) -> (s3s::Body, Option<Arc<AtomicBool>>) {
        use hyper::body::Body as _;
        let start = start.filter(|b| !b.is_empty());
        if inner.is_end_stream() && start.is_none() {
            return (s3s::Body::from(inner), None);
        }
        let end_read = Arc::new(AtomicBool::new(false));
        let body = WatchedBody {
            start,
            inner,
            end_read: end_read.clone(),
        };
        (s3s::Body::http_body(body), Some(end_read))
    }
}

impl hyper::body::Body for WatchedBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, hyper::Error>>> {
        if let Some(start) = self.start.take() {
            if self.inner.is_end_stream() {
                self.end_read.store(true, Ordering::Release);
            }
            return Poll::Ready(Some(Ok(hyper::body::Frame::data(start))));
        }
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) || self.inner.is_end_stream() {
            self.end_read.store(true, Ordering::Release);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.start.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        let inner = self.inner.size_hint();
        let n = self.start.as_ref().map_or(0, |b| b.len() as u64);
        let mut h = hyper::body::SizeHint::new();
        h.set_lower(inner.lower() + n);
        if let Some(u) = inner.upper() {
            h.set_upper(u + n);
        }
        h
    }
}

/// Binds the gateway's listener.
pub async fn bind(addr: &str) -> Result<TcpListener, GatewayError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| GatewayError::Bind {
            addr: addr.to_string(),
            source,
        })
}
