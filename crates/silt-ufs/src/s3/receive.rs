//! A ranged S3 GET received straight into page buffers.
//!
//! Through the HTTP client the store's operator uses, a cold read's bytes were copied twice
//! in user space: the client reads the socket into buffers of its own and hands out chunks of
//! them, and [`crate::pieces`] copies the chunks into page buffers. Here the request is
//! written on a plain keep-alive connection and each page's bytes are read from the socket
//! into the pooled page buffer that becomes the cached page: the kernel's copy is the only
//! one, and a page-sized `read` asks the socket for a page at a time.
//!
//! Only the expected, plain case is handled: `http://`, a `200`/`206` answer whose
//! `Content-Length` (and `Content-Range`) are exactly the bytes asked for, no transfer
//! coding. Anything else is [`Received::Declined`] and the caller asks again through the
//! operator, which maps errors, retries and speaks TLS. The request itself (URL, signature,
//! `Range`, `If-Match`) is the operator's presigned one, so addressing and signing stay in one
//! place.
//!
//! Invariants: bytes are returned only when exactly `range.len()` body bytes arrived for an
//! answer that names that range; a connection goes back to the idle set only after its
//! answer was read to its last byte, with nothing beyond it, and without `Connection: close`;
//! every socket operation has the store's deadline (`Timeout` when it passes); a kept
//! connection wakes its reader for any byte (the body's larger wake-up bound is undone).

use std::collections::HashMap;
use std::ops::Range;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use silt_common::{Error, ErrorKind, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::piece_bufs;

/// Idle connections kept per endpoint.
const IDLE_PER_ENDPOINT: usize = 64;
/// A response head larger than this is not one this path handles.
const MAX_HEAD: usize = 64 << 10;
const MAX_HEADERS: usize = 64;
/// A connection idle longer is closed, not reused: servers and middleboxes drop idle
/// connections, some without a word, and a request written on one dropped silently would wait
/// a whole deadline for nothing. AWS's Java SDK stops reusing S3 connections after 5 s (users
/// of other clients report S3 closing them after 5 to 20 s); one closed with a FIN or reset is
/// caught either way (`Attempt::Stale`).
const MAX_IDLE: Duration = Duration::from_secs(5);

/// What a [`Receiver::get`] came back with.
#[derive(Debug)]
pub(crate) enum Received {
    /// The bytes asked for, cut into pieces as [`crate::pieces`] cuts them.
    Pieces(Vec<Bytes>),
    /// Not handled here (why): ask through the operator.
    Declined(String),
}

/// A request to send: method GET, the presigned URL's parts and its headers.
pub(crate) struct Request<'a> {
    pub uri: &'a str,
    pub headers: Vec<(&'a str, &'a [u8])>,
}

/// Keep-alive connections to the endpoints a store's GETs go to.
pub(crate) struct Receiver {
    /// Per endpoint, connections with the time each went idle (newest last).
    idle: Mutex<HashMap<String, Vec<(TcpStream, Instant)>>>,
    timeout: Duration,
}

/// How one exchange on a connection ended: done (with the connection, if it may be kept), or
/// stale: it broke before any byte of an answer arrived, as a kept connection the server
/// closed meanwhile does (the request is then sent once more on a new one).
enum Attempt {
    Done(Received, Option<TcpStream>),
    Stale,
}

impl Receiver {
    pub(crate) fn new(timeout: Duration) -> Receiver {
        Receiver {
            idle: Mutex::new(HashMap::new()),
            timeout,
        }
    }

    /// GETs `req`, which asks for `range` of an object, and cuts the body into `piece`-long
    /// pieces (the last shorter), whole ones in pooled page buffers.
    pub(crate) async fn get(
        &self,
        req: &Request<'_>,
        range: Range<u64>,
        piece: u64,
    ) -> Result<Received> {
        let Some(rest) = req.uri.strip_prefix("http://") else {
            return Ok(Received::Declined("not plain http".into()));
        };
        let (authority, target) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let mut head = format!("GET {target} HTTP/1.1\r\n");
        if !req
            .headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case("host"))
        {
            head.push_str(&format!("host: {authority}\r\n"));
        }
        let mut head = head.into_bytes();
        for (name, value) in &req.headers {
            if value.iter().any(|&b| b == b'\r' || b == b'\n') {
                return Ok(Received::Declined(format!("header {name} spans lines")));
            }
            head.extend_from_slice(name.as_bytes());
            head.extend_from_slice(b": ");
            head.extend_from_slice(value);
            head.extend_from_slice(b"\r\n");
        }
        head.extend_from_slice(b"\r\n");

        let reused = self.idle.lock().get_mut(authority).and_then(|list| {
            // The newest is last; older ones have been idle even longer.
            let (conn, since) = list.pop()?;
            if since.elapsed() > MAX_IDLE {
                list.clear();
                return None;
            }
            Some(conn)
        });
        let attempt = match reused {
            Some(conn) => match self.exchange(conn, authority, &head, &range, piece).await? {
                Attempt::Stale => None,
                done => Some(done),
            },
            None => None,
        };
        let attempt = match attempt {
            Some(a) => a,
            None => match self.connect(authority).await? {
                Ok(conn) => self.exchange(conn, authority, &head, &range, piece).await?,
                // Refused, unreachable: the client retries with backoff and says why.
                Err(why) => return Ok(Received::Declined(why)),
            },
        };
        match attempt {
            Attempt::Done(got, keep) => {
                if let Some(conn) = keep {
                    let mut idle = self.idle.lock();
                    let list = idle.entry(authority.to_string()).or_default();
                    if list.len() < IDLE_PER_ENDPOINT {
                        list.push((conn, Instant::now()));
                    }
                }
                Ok(got)
            }
            Attempt::Stale => Ok(Received::Declined(
                "a new connection closed before answering".into(),
            )),
        }
    }

    /// A new connection to `authority`; `Err(why)` when it cannot be made (not a deadline).
    async fn connect(&self, authority: &str) -> Result<std::result::Result<TcpStream, String>> {
        let has_port = match authority.rfind(']') {
            Some(i) => authority[i..].contains(':'),
            None => authority.contains(':'),
        };
        let addr = if has_port {
            authority.to_string()
        } else {
            format!("{authority}:80")
        };
        let conn = match self
            .deadline("connect to", authority, TcpStream::connect(addr.as_str()))
            .await?
        {
            Ok(conn) => conn,
            Err(e) => return Ok(Err(format!("connect to {authority}: {e}"))),
        };
        // Requests are one small write each; do not hold them back for an ACK.
        let _ = conn.set_nodelay(true);
        Ok(Ok(conn))
    }

    async fn deadline<T>(
        &self,
        what: &str,
        whom: &str,
        fut: impl std::future::Future<Output = T>,
    ) -> Result<T> {
        tokio::time::timeout(self.timeout, fut).await.map_err(|_| {
            Error::new(
                ErrorKind::Timeout,
                format!("{what} {whom}: no answer within {:?}", self.timeout),
            )
        })
    }

    /// One request and its answer on `conn` to `peer` (the URL's authority).
    async fn exchange(
        &self,
        mut conn: TcpStream,
        peer: &str,
        head: &[u8],
        range: &Range<u64>,
        piece: u64,
    ) -> Result<Attempt> {
        if self
            .deadline("send to", peer, conn.write_all(head))
            .await?
            .is_err()
        {
            return Ok(Attempt::Stale);
        }
        let mut buf = vec![0u8; 16 << 10];
        let mut filled = 0;
        let (status, body_at, length, content_range, close) = loop {
            if filled == buf.len() {
                if buf.len() >= MAX_HEAD {
                    return Ok(declined("a response head over 64 KiB"));
                }
                buf.resize(buf.len() * 2, 0);
            }
            let n = match self
                .deadline("read from", peer, conn.read(&mut buf[filled..]))
                .await?
            {
                Ok(0) | Err(_) if filled == 0 => return Ok(Attempt::Stale),
                Ok(0) => return Ok(declined("the connection closed in a response head")),
                Ok(n) => n,
                Err(e) => return Ok(declined(&format!("reading a response head: {e}"))),
            };
            filled += n;
            let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut resp = httparse::Response::new(&mut headers);
            match resp.parse(&buf[..filled]) {
                Ok(httparse::Status::Partial) => continue,
                Err(e) => return Ok(declined(&format!("a malformed response head: {e}"))),
                Ok(httparse::Status::Complete(at)) => {
                    let mut length = None;
                    let mut content_range = None;
                    let mut close = resp.version == Some(0);
                    for h in resp.headers.iter() {
                        let value = std::str::from_utf8(h.value).unwrap_or("").trim();
                        if h.name.eq_ignore_ascii_case("content-length") {
                            if length.is_some() {
                                return Ok(declined("two Content-Length headers"));
                            }
                            length = Some(value.parse::<u64>().ok());
                        } else if h.name.eq_ignore_ascii_case("content-range") {
                            content_range = Some(value.to_string());
                        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                            return Ok(declined("a transfer coding"));
                        } else if h.name.eq_ignore_ascii_case("connection") {
                            close |= value.eq_ignore_ascii_case("close");
                        }
                    }
                    break (resp.code.unwrap_or(0), at, length, content_range, close);
                }
            }
        };
        let want = range.end - range.start;
        let whole = format!("bytes {}-{}/", range.start, range.end.saturating_sub(1));
        match status {
            206 if content_range
                .as_deref()
                .is_some_and(|r| r.starts_with(&whole)) => {}
            206 => return Ok(declined("a 206 for another range")),
            // A 200 is the whole object: right only if that is what was asked for (a
            // server that ignores Range answers 200 with all of it).
            200 if range.start == 0 && content_range.is_none() => {}
            code => return Ok(declined(&format!("status {code}"))),
        }
        match length {
            Some(Some(n)) if n == want => {}
            _ => return Ok(declined("a Content-Length other than the range's")),
        }
        // Bytes past the body belong to no answer asked for: the connection is not kept.
        let surplus = filled - body_at > want as usize;
        let early = &buf[body_at..filled.min(body_at + want as usize)];
        let pieces = match self.body(&mut conn, peer, early, want, piece).await? {
            Ok(p) => p,
            Err(why) => return Ok(declined(&why)),
        };
        // Nothing may follow the body: the next answer on this connection would start there.
        let mut probe = [0u8; 1];
        // A head is read with the socket waking for any byte again.
        let keep = !close
            && !surplus
            && set_wake_at(&conn, 1)
            && matches!(conn.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
        Ok(Attempt::Done(
            Received::Pieces(pieces),
            keep.then_some(conn),
        ))
    }

    /// `want` body bytes (`early` of them already read) into pieces; `Err(why)` when the
    /// connection ends or fails first.
    async fn body(
        &self,
        conn: &mut TcpStream,
        peer: &str,
        mut early: &[u8],
        want: u64,
        piece: u64,
    ) -> Result<std::result::Result<Vec<Bytes>, String>> {
        let piece = usize::try_from(piece.max(1)).unwrap_or(usize::MAX);
        let want = usize::try_from(want).map_err(|_| Error::invalid("range too large"))?;
        let mut out = Vec::with_capacity(want.div_ceil(piece));
        let mut left = want;
        let mut wake_at = 1;
        for mut buf in piece_bufs(want, piece) {
            let dst = buf.as_mut_slice();
            let len = dst.len();
            left -= len;
            let n = early.len().min(len);
            dst[..n].copy_from_slice(&early[..n]);
            early = &early[n..];
            let mut at = n;
            while at < len {
                let rest = (len - at + left).min(WAKE_AT);
                if rest != wake_at {
                    wake_at = rest;
                    set_wake_at(conn, wake_at);
                }
                match self
                    .deadline("read from", peer, conn.read(&mut dst[at..]))
                    .await?
                {
                    Ok(0) => {
                        return Ok(Err(format!(
                            "the connection closed {} bytes before the body's end",
                            len - at + left
                        )))
                    }
                    Ok(n) => at += n,
                    Err(e) => return Ok(Err(format!("reading a body: {e}"))),
                }
            }
            out.push(buf.freeze());
        }
        Ok(Ok(out))
    }
}

/// Bytes a body read waits for before it wakes (`SO_RCVLOWAT`), or the rest of the body if
/// fewer: a store sending at network pace (a remote or shaped link) would otherwise wake the
/// receiver for every few segments, a context switch and a `read` each (shaped B1, both
/// O_DIRECT options: 1.38 against 2.11 daemon CPU s/GB, docs/benchmarks.md).
const WAKE_AT: usize = 256 << 10;

/// Sets the socket's wake-up bound; false if the kernel refused.
fn set_wake_at(conn: &TcpStream, bytes: usize) -> bool {
    use std::os::fd::AsRawFd;
    let value = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    // SAFETY: a valid socket descriptor, and a c_int option value of its own size.
    unsafe {
        libc::setsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        ) == 0
    }
}

fn declined(why: &str) -> Attempt {
    Attempt::Done(Received::Declined(why.to_string()), None)
}

#[cfg(test)]
mod tests {
    //! Against a scripted HTTP peer on loopback: each request head is read whole, then the
    //! next scripted answer is written (in small writes, so bodies arrive in many reads).
    use super::*;
    use std::collections::VecDeque;
    use std::net::SocketAddr;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use tokio::net::TcpListener;

    struct Answer {
        bytes: Vec<u8>,
        /// Close the connection after writing it.
        close: bool,
    }

    struct Peer {
        addr: SocketAddr,
        accepts: Arc<AtomicUsize>,
        heads: Arc<Mutex<Vec<String>>>,
    }

    /// Serves `answers` in order, one per request, whatever connection it comes on; with
    /// none left, reads requests and never answers.
    async fn peer(answers: Vec<Answer>) -> Peer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepts = Arc::new(AtomicUsize::new(0));
        let heads = Arc::new(Mutex::new(Vec::new()));
        let queue = Arc::new(Mutex::new(VecDeque::from(answers)));
        let (a, h) = (accepts.clone(), heads.clone());
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                a.fetch_add(1, Ordering::SeqCst);
                let (queue, heads) = (queue.clone(), h.clone());
                tokio::spawn(async move {
                    loop {
                        let mut head = Vec::new();
                        let mut byte = [0u8; 1];
                        while !head.ends_with(b"\r\n\r\n") {
                            match conn.read(&mut byte).await {
                                Ok(1) => head.push(byte[0]),
                                _ => return,
                            }
                        }
                        heads
                            .lock()
                            .push(String::from_utf8_lossy(&head).into_owned());
                        let Some(answer) = queue.lock().pop_front() else {
                            std::future::pending::<()>().await;
                            return;
                        };
                        for chunk in answer.bytes.chunks(7777) {
                            if conn.write_all(chunk).await.is_err() {
                                return;
                            }
                        }
                        if answer.close {
                            return;
                        }
                    }
                });
            }
        });
        Peer {
            addr,
            accepts,
            heads,
        }
    }

    fn object(len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3])
            .collect()
    }

    fn partial(obj: &[u8], range: Range<u64>) -> Answer {
        let (a, b) = (range.start as usize, range.end as usize);
        let mut bytes = format!(
            "HTTP/1.1 206 Partial Content\r\nContent-Length: {}\r\nContent-Range: bytes {a}-{}/{}\r\nETag: \"e\"\r\n\r\n",
            b - a,
            b - 1,
            obj.len()
        )
        .into_bytes();
        bytes.extend_from_slice(&obj[a..b]);
        Answer {
            bytes,
            close: false,
        }
    }

    fn raw(head: &str, body: &[u8], close: bool) -> Answer {
        let mut bytes = head.as_bytes().to_vec();
        bytes.extend_from_slice(body);
        Answer { bytes, close }
    }

    async fn get(rx: &Receiver, peer: &Peer, range: Range<u64>, piece: u64) -> Result<Received> {
        let uri = format!("http://{}/bkt/obj?X-Amz-Signature=abc", peer.addr);
        let req = Request {
            uri: &uri,
            headers: vec![("range", b"bytes=x".as_slice()), ("if-match", b"\"e\"")],
        };
        rx.get(&req, range, piece).await
    }

    fn pieces(got: Result<Received>) -> Vec<Bytes> {
        match got {
            Ok(Received::Pieces(p)) => p,
            other => panic!("expected pieces, got {other:?}"),
        }
    }

    fn declined(got: Result<Received>) -> String {
        match got {
            Ok(Received::Declined(why)) => why,
            other => panic!("expected a decline, got {other:?}"),
        }
    }

    /// The body arrives in many small writes and lands in page-sized pooled buffers; the
    /// request carries the signed URL's target and headers; the connection is kept and reused.
    #[tokio::test]
    async fn receives_a_range_into_pages_on_one_kept_connection() {
        let obj = object((3 << 20) + 123);
        let range = 10..(3 << 20) + 100;
        let p = peer(vec![partial(&obj, range.clone()), partial(&obj, 0..5)]).await;
        let rx = Receiver::new(Duration::from_secs(30));
        let got = pieces(get(&rx, &p, range.clone(), 1 << 20).await);
        assert!(got.concat() == obj[10..(3 << 20) + 100]);
        let (last, whole) = got.split_last().unwrap();
        assert_eq!(whole.len(), 3);
        assert!(whole
            .iter()
            .all(|w| w.len() == 1 << 20 && silt_common::bufpool::is_aligned(w)));
        assert_eq!(last.len(), 90);
        let got = pieces(get(&rx, &p, 0..5, 1 << 20).await);
        assert_eq!(got.concat(), obj[..5]);
        assert_eq!(
            p.accepts.load(Ordering::SeqCst),
            1,
            "the connection was not reused"
        );
        let heads = p.heads.lock().clone();
        assert!(
            heads[0].starts_with("GET /bkt/obj?X-Amz-Signature=abc HTTP/1.1\r\n"),
            "{}",
            heads[0]
        );
        assert!(
            heads[0].contains(&format!("host: {}\r\n", p.addr)),
            "{}",
            heads[0]
        );
        assert!(
            heads[0].contains("range: bytes=x\r\nif-match: \"e\"\r\n"),
            "{}",
            heads[0]
        );
    }

    /// A body read waits for many bytes at once (`SO_RCVLOWAT`); the next answer's head, a
    /// few hundred bytes, must still wake the reader on the kept connection.
    #[tokio::test]
    async fn a_small_answer_after_a_large_one_on_a_kept_connection() {
        let obj = object(600 << 10);
        let p = peer(vec![partial(&obj, 0..600 << 10), partial(&obj, 0..3)]).await;
        let rx = Receiver::new(Duration::from_secs(5));
        let got = pieces(get(&rx, &p, 0..600 << 10, 1 << 20).await);
        assert!(got.concat() == obj);
        let second = tokio::time::timeout(Duration::from_secs(60), get(&rx, &p, 0..3, 1 << 20));
        let got = pieces(second.await.expect("the receive never gave up"));
        assert_eq!(got.concat(), obj[..3]);
        assert_eq!(p.accepts.load(Ordering::SeqCst), 1);
    }

    /// An answer that is not exactly the range asked for, whole, is never returned as bytes,
    /// and its connection is never used again.
    #[tokio::test]
    async fn declines_every_answer_but_the_range_asked_for() {
        let obj = object(100);
        let bad: Vec<(&str, Range<u64>, Answer)> = vec![
            ("an error status", 0..10, raw("HTTP/1.1 412 Precondition Failed\r\nContent-Length: 5\r\n\r\n", b"<Err>", false)),
            ("a 500", 0..10, raw("HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n", b"", false)),
            ("another range", 10..20, partial(&obj, 11..21)),
            ("no Content-Range", 10..20, raw("HTTP/1.1 206 Partial Content\r\nContent-Length: 10\r\n\r\n", &obj[10..20], false)),
            ("a 200 for a range not at 0", 10..20, raw("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", &obj[10..20], false)),
            ("a 200 with the whole object", 0..10, raw("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n", &obj, false)),
            ("a transfer coding", 0..10, raw("HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 0-9/100\r\nTransfer-Encoding: chunked\r\n\r\n", b"a\r\n0123456789\r\n0\r\n\r\n", false)),
            ("no Content-Length", 0..10, raw("HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 0-9/100\r\n\r\n", &obj[..10], true)),
            ("a longer Content-Length", 0..10, raw("HTTP/1.1 206 Partial Content\r\nContent-Length: 11\r\nContent-Range: bytes 0-9/100\r\n\r\n", &obj[..11], false)),
            ("a shorter Content-Length", 0..10, raw("HTTP/1.1 206 Partial Content\r\nContent-Length: 9\r\nContent-Range: bytes 0-9/100\r\n\r\n", &obj[..9], false)),
            ("two Content-Lengths", 0..10, raw("HTTP/1.1 206 Partial Content\r\nContent-Length: 10\r\nContent-Length: 10\r\nContent-Range: bytes 0-9/100\r\n\r\n", &obj[..10], false)),
            ("a body cut short", 0..50, raw("HTTP/1.1 206 Partial Content\r\nContent-Length: 50\r\nContent-Range: bytes 0-49/100\r\n\r\n", &obj[..30], true)),
            ("not HTTP", 0..10, raw("SSH-2.0-OpenSSH\r\n\r\n", b"", false)),
            ("a head that never ends", 0..10, raw(&format!("HTTP/1.1 206 Partial Content\r\nX: {}\r\n", "y".repeat(70 << 10)), b"", false)),
        ];
        let n = bad.len();
        let (cases, answers): (Vec<_>, Vec<_>) =
            bad.into_iter().map(|(w, r, a)| ((w, r), a)).unzip();
        let p = peer(answers).await;
        let rx = Receiver::new(Duration::from_secs(30));
        for (what, range) in cases {
            let why = declined(get(&rx, &p, range, 4).await);
            println!("{what}: declined ({why})");
        }
        assert_eq!(
            p.accepts.load(Ordering::SeqCst),
            n,
            "a connection was reused after a declined answer"
        );
    }

    /// Bytes after the body belong to no answer asked for: the body is the range, but the
    /// connection is not kept. So is one the peer says it closes, or closes.
    #[tokio::test]
    async fn a_connection_is_kept_only_when_its_answer_ended_cleanly() {
        let obj = object(100);
        let mut trailing = partial(&obj, 0..10);
        trailing
            .bytes
            .extend_from_slice(b"HTTP/1.1 206 Partial Content\r\n");
        let mut close = partial(&obj, 0..10);
        let at = close
            .bytes
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .unwrap();
        close
            .bytes
            .splice(at..at, b"\r\nConnection: close".iter().copied());
        let mut closed = partial(&obj, 0..10);
        closed.close = true;
        let p = peer(vec![
            trailing,
            partial(&obj, 0..10),
            close,
            closed,
            partial(&obj, 0..10),
        ])
        .await;
        let rx = Receiver::new(Duration::from_secs(30));
        for _ in 0..5 {
            assert_eq!(pieces(get(&rx, &p, 0..10, 4).await).concat(), obj[..10]);
        }
        // 1: trailing bytes (dropped); 2: kept, used by 3 (Connection: close, dropped);
        // 4: a new one the peer closes; 5: a new one.
        assert_eq!(p.accepts.load(Ordering::SeqCst), 4);
    }

    /// A kept connection the peer closed meanwhile is not an error: the request goes out
    /// again on a new one.
    #[tokio::test]
    async fn a_kept_connection_closed_by_the_peer_is_replaced() {
        let obj = object(100);
        let p = peer(vec![partial(&obj, 0..10)]).await;
        let rx = Receiver::new(Duration::from_secs(30));
        // An idle-looking connection whose other end is gone, filed under the peer's address.
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (stale, other_end) =
            tokio::join!(TcpStream::connect(l.local_addr().unwrap()), l.accept());
        drop(other_end.unwrap());
        rx.idle
            .lock()
            .entry(p.addr.to_string())
            .or_default()
            .push((stale.unwrap(), Instant::now()));
        assert_eq!(pieces(get(&rx, &p, 0..10, 4).await).concat(), obj[..10]);
        assert_eq!(p.accepts.load(Ordering::SeqCst), 1);
        assert!(
            rx.idle.lock()[&p.addr.to_string()].len() == 1,
            "the new connection is kept"
        );
    }

    /// A connection idle too long is not written on: it may have been dropped without a word
    /// (here: its peer takes requests and never answers, as a dropped one would look).
    #[tokio::test]
    async fn a_connection_idle_too_long_is_not_reused() {
        let obj = object(100);
        let p = peer(vec![partial(&obj, 0..10)]).await;
        let silent = peer(vec![]).await;
        let rx = Receiver::new(Duration::from_secs(5));
        let old = TcpStream::connect(silent.addr).await.unwrap();
        let long_ago = Instant::now()
            .checked_sub(MAX_IDLE + Duration::from_secs(1))
            .expect("the clock is past MAX_IDLE");
        rx.idle
            .lock()
            .entry(p.addr.to_string())
            .or_default()
            .push((old, long_ago));
        let got = tokio::time::timeout(Duration::from_secs(60), get(&rx, &p, 0..10, 4));
        assert_eq!(pieces(got.await.expect("never ended")).concat(), obj[..10]);
        assert_eq!(p.accepts.load(Ordering::SeqCst), 1);
        assert!(silent.heads.lock().is_empty(), "a request went out on it");
    }

    /// A peer that takes the request and never answers costs one deadline: `Timeout`.
    #[tokio::test]
    async fn a_silent_peer_times_out() {
        let p = peer(vec![]).await;
        let rx = Receiver::new(Duration::from_millis(300));
        // The safety net of a receiver without deadlines (never reached when it has them).
        let got = tokio::time::timeout(Duration::from_secs(60), get(&rx, &p, 0..10, 4));
        match got.await.expect("the receive never gave up") {
            Err(e) => assert_eq!(e.kind(), ErrorKind::Timeout, "{e}"),
            Ok(other) => panic!("expected a timeout, got {other:?}"),
        }
    }

    /// A peer that stops in the middle of a body, its connection open, costs one deadline too.
    #[tokio::test]
    async fn a_body_that_stops_half_way_times_out() {
        let obj = object(100);
        let head = "HTTP/1.1 206 Partial Content\r\nContent-Length: 50\r\nContent-Range: bytes 0-49/100\r\n\r\n";
        let p = peer(vec![raw(head, &obj[..30], false)]).await;
        let rx = Receiver::new(Duration::from_millis(300));
        let got = tokio::time::timeout(Duration::from_secs(60), get(&rx, &p, 0..50, 1 << 20));
        match got.await.expect("the receive never gave up") {
            Err(e) => assert_eq!(e.kind(), ErrorKind::Timeout, "{e}"),
            Ok(other) => panic!("expected a timeout, got {other:?}"),
        }
    }

    /// Nobody listening: declined (the HTTP client retries with backoff and names the error).
    #[tokio::test]
    async fn a_refused_connection_is_declined() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        drop(l);
        let rx = Receiver::new(Duration::from_secs(30));
        let uri = format!("http://{addr}/b/o");
        let why = declined(
            rx.get(
                &Request {
                    uri: &uri,
                    headers: vec![],
                },
                0..10,
                4,
            )
            .await,
        );
        assert!(why.contains("connect to"), "{why}");
    }

    /// Nothing is sent for a URL this path does not speak, or a header that would inject
    /// lines into the request: the peer is listening and never sees a connection.
    #[tokio::test]
    async fn odd_urls_and_headers_are_declined_without_a_request() {
        let p = peer(vec![]).await;
        let rx = Receiver::new(Duration::from_secs(30));
        let a = p.addr;
        for uri in [
            format!("https://{a}/b/o"),
            format!("http://u:p@{a}/b/o"),
            "http:///b/o".to_string(),
        ] {
            let req = Request {
                uri: &uri,
                headers: vec![],
            };
            declined(rx.get(&req, 0..10, 4).await);
        }
        let uri = format!("http://{a}/b/o");
        let req = Request {
            uri: &uri,
            headers: vec![("x-evil", b"a\r\nHost: elsewhere".as_slice())],
        };
        declined(rx.get(&req, 0..10, 4).await);
        assert_eq!(p.accepts.load(Ordering::SeqCst), 0, "a request went out");
    }
}
