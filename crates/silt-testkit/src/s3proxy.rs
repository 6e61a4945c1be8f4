//! [`S3Proxy`]: an HTTP/1.1 forwarding proxy that sits between an S3 client and a real S3
//! server (path-style addressing), counts requests by S3 operation and injects faults into
//! chosen requests.
//!
//! ```ignore
//! let server = silt_testkit::S3Server::start();
//! let proxy = S3Proxy::start(SocketAddr::from(([127, 0, 0, 1], server.port())))?;
//! let opts = S3Options { endpoint: proxy.endpoint(), ..server.s3_options() };
//! proxy.inject(S3Op::Head, 0, 1, FaultAction::slow_down());
//! // … the first HEAD gets a 503 SlowDown, everything else reaches the server.
//! assert_eq!(proxy.counts().head, 2);
//! ```
//!
//! Each client connection serves one request: the request is forwarded on a fresh upstream
//! connection with `Connection: close`, and the response goes back with `Connection: close`
//! before both connections are closed (HTTP clients open a new connection for the next
//! request). Request and response bodies are streamed, never held whole in memory. The `Host`
//! header and everything else the client signed is forwarded unchanged, so SigV4 signatures
//! stay valid. Request bodies must come with a `Content-Length`: a chunked body or an
//! `Expect: 100-continue` gets `501 Not Implemented` (the S3 clients tested here send neither).
//!
//! Plain threads, blocking sockets: one thread accepts, one thread per client connection.
//! Dropping the proxy shuts every socket down, which ends all of them (hanging requests
//! included), and joins them.

use std::collections::HashMap;
use std::fmt;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

/// Largest request head (request line and headers) accepted; larger ones get a 431.
const MAX_REQUEST_HEAD: u64 = 64 * 1024;
/// Largest response head accepted from the upstream server (a bigger one gets a 502).
const MAX_RESPONSE_HEAD: u64 = 1024 * 1024;
const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a hanging request checks whether its client has gone away.
const HANG_POLL: Duration = Duration::from_millis(100);

/// The S3 operation a request is, as far as the proxy can tell from method and target
/// (path-style addressing: `/bucket/key?query`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum S3Op {
    /// `GET` with a `list-type=` query parameter, or of a bare bucket (`/bucket`, `/bucket/`)
    /// or of `/` (list buckets).
    List,
    /// Any `HEAD`.
    Head,
    /// `GET` of an object.
    Get,
    /// Any `PUT`.
    Put,
    /// Any `DELETE`.
    Delete,
    /// Everything else (`POST`, …, and requests too malformed to classify).
    Other,
}

impl S3Op {
    const ALL: [S3Op; 6] = [
        S3Op::List,
        S3Op::Head,
        S3Op::Get,
        S3Op::Put,
        S3Op::Delete,
        S3Op::Other,
    ];

    fn index(self) -> usize {
        match self {
            S3Op::List => 0,
            S3Op::Head => 1,
            S3Op::Get => 2,
            S3Op::Put => 3,
            S3Op::Delete => 4,
            S3Op::Other => 5,
        }
    }

    /// Classifies a request from its method and (origin-form) request target, `/b/k?q`.
    fn classify(method: &str, target: &str) -> S3Op {
        let method = method.to_ascii_uppercase();
        match method.as_str() {
            "HEAD" => S3Op::Head,
            "PUT" => S3Op::Put,
            "DELETE" => S3Op::Delete,
            "GET" => {
                let (path, query) = match target.split_once('?') {
                    Some((p, q)) => (p, q),
                    None => (target, ""),
                };
                let list_query = query
                    .split('&')
                    .any(|param| param.split('=').next() == Some("list-type"));
                let bucket_only = !path.trim_matches('/').contains('/');
                if list_query || bucket_only {
                    S3Op::List
                } else {
                    S3Op::Get
                }
            }
            _ => S3Op::Other,
        }
    }
}

/// Requests the proxy has received, by operation (faulted ones included).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProxyCounts {
    pub list: u64,
    pub head: u64,
    pub get: u64,
    pub put: u64,
    pub delete: u64,
    pub other: u64,
}

impl ProxyCounts {
    pub fn total(&self) -> u64 {
        self.list + self.head + self.get + self.put + self.delete + self.other
    }
}

impl fmt::Display for ProxyCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "list={} head={} get={} put={} delete={} other={}",
            self.list, self.head, self.get, self.put, self.delete, self.other
        )
    }
}

/// What a faulted request gets instead of (or before) the server's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaultAction {
    /// This status with an S3 `<Error>` XML body (headers only for `HEAD`).
    Status {
        status: u16,
        code: String,
        message: String,
    },
    /// The request is read and never answered; the connection is closed when the faults are
    /// cleared ([`S3Proxy::clear_faults`]) or the proxy is dropped.
    Hang,
    /// The request is forwarded after this delay.
    Delay(Duration),
}

impl FaultAction {
    /// `503 SlowDown` (S3's request-rate limiting).
    pub fn slow_down() -> FaultAction {
        FaultAction::status(503, "SlowDown", "Please reduce your request rate.")
    }

    /// `500 InternalError`.
    pub fn internal_error() -> FaultAction {
        FaultAction::status(
            500,
            "InternalError",
            "We encountered an internal error. Please try again.",
        )
    }

    /// `status` with an S3 error `code` and `message`.
    pub fn status(status: u16, code: &str, message: &str) -> FaultAction {
        FaultAction::Status {
            status,
            code: code.to_string(),
            message: message.to_string(),
        }
    }
}

/// One queued injection: of the requests of `op` that reach it, `skip` pass, then `times` get
/// `action`.
struct Injection {
    op: S3Op,
    skip: usize,
    times: usize,
    action: FaultAction,
}

struct State {
    shutdown: bool,
    /// Bumped by `clear_faults`: hanging requests of an older epoch give up.
    epoch: u64,
    faults: Vec<Injection>,
    /// Every open socket (client and upstream ends), shut down on drop to end blocked I/O.
    sockets: HashMap<u64, TcpStream>,
    next_socket: u64,
}

struct Shared {
    upstream: SocketAddr,
    state: Mutex<State>,
    /// Signalled on shutdown and on `clear_faults`.
    changed: Condvar,
    counts: [AtomicU64; 6],
    /// `METHOD TARGET` of every request, in arrival order (for tests that check what a
    /// client asked for, e.g. its preconditions).
    requests: Mutex<Vec<String>>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a socket so that drop can shut it down; `None` once the proxy is stopping.
    fn register(self: &Arc<Self>, stream: &TcpStream) -> Option<SocketGuard> {
        let clone = stream.try_clone().ok()?;
        let mut st = self.lock();
        if st.shutdown {
            return None;
        }
        let id = st.next_socket;
        st.next_socket += 1;
        st.sockets.insert(id, clone);
        Some(SocketGuard {
            shared: self.clone(),
            id,
        })
    }

    /// The action for one request of `op`: the oldest unexhausted injection of `op` decides.
    fn fault_for(&self, op: S3Op) -> Option<(FaultAction, u64)> {
        let mut st = self.lock();
        let epoch = st.epoch;
        let i = st.faults.iter().position(|f| f.op == op)?;
        let f = &mut st.faults[i];
        if f.skip > 0 {
            f.skip -= 1;
            return None;
        }
        let action = f.action.clone();
        f.times = f.times.saturating_sub(1);
        if f.times == 0 {
            st.faults.remove(i);
        }
        Some((action, epoch))
    }

    /// Waits until the proxy stops, the faults are cleared (the epoch moves past
    /// `since_epoch`) or `timeout` passes; true if it stopped or the faults were cleared.
    fn wait(&self, since_epoch: u64, timeout: Duration) -> bool {
        let st = self.lock();
        let (st, _) = self
            .changed
            .wait_timeout_while(st, timeout, |st| !st.shutdown && st.epoch == since_epoch)
            .unwrap_or_else(|e| e.into_inner());
        st.shutdown || st.epoch != since_epoch
    }

    fn stopping(&self) -> bool {
        self.lock().shutdown
    }
}

/// Removes a socket from the registry when its connection is done.
struct SocketGuard {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for SocketGuard {
    fn drop(&mut self) {
        self.shared.lock().sockets.remove(&self.id);
    }
}

/// A running proxy; see the module documentation. Dropping it stops it.
pub struct S3Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
    connections: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl S3Proxy {
    /// A proxy on a free port of `127.0.0.1` in front of the S3 server at `upstream`.
    pub fn start(upstream: SocketAddr) -> io::Result<S3Proxy> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            upstream,
            state: Mutex::new(State {
                shutdown: false,
                epoch: 0,
                faults: Vec::new(),
                sockets: HashMap::new(),
                next_socket: 0,
            }),
            changed: Condvar::new(),
            counts: Default::default(),
            requests: Mutex::new(Vec::new()),
        });
        let connections = Arc::new(Mutex::new(Vec::new()));
        let acceptor = {
            let shared = shared.clone();
            let connections = connections.clone();
            std::thread::Builder::new()
                .name(format!("s3proxy-accept-{}", addr.port()))
                .spawn(move || accept_loop(listener, shared, connections))?
        };
        Ok(S3Proxy {
            addr,
            shared,
            acceptor: Some(acceptor),
            connections,
        })
    }

    /// `http://IP:PORT`, for `S3Options::endpoint`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Requests received so far, by operation.
    pub fn counts(&self) -> ProxyCounts {
        let c = |op: S3Op| self.shared.counts[op.index()].load(Ordering::SeqCst);
        ProxyCounts {
            list: c(S3Op::List),
            head: c(S3Op::Head),
            get: c(S3Op::Get),
            put: c(S3Op::Put),
            delete: c(S3Op::Delete),
            other: c(S3Op::Other),
        }
    }

    /// `METHOD TARGET` (origin form, `/path?query`) of every request received so far.
    pub fn requests(&self) -> Vec<String> {
        self.shared
            .requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn reset_counts(&self) {
        for op in S3Op::ALL {
            self.shared.counts[op.index()].store(0, Ordering::SeqCst);
        }
    }

    /// Of the next requests of `op`, lets `skip` pass and gives the `times` after them
    /// `action`. Injections for the same operation are queued: the next one starts counting
    /// when the one before it is used up.
    pub fn inject(&self, op: S3Op, skip: usize, times: usize, action: FaultAction) {
        if times == 0 {
            return;
        }
        self.shared.lock().faults.push(Injection {
            op,
            skip,
            times,
            action,
        });
    }

    /// Drops every queued injection; requests hanging on a [`FaultAction::Hang`] get their
    /// connection closed.
    pub fn clear_faults(&self) {
        let mut st = self.shared.lock();
        st.faults.clear();
        st.epoch += 1;
        drop(st);
        self.shared.changed.notify_all();
    }
}

impl fmt::Debug for S3Proxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Proxy")
            .field("addr", &self.addr)
            .field("upstream", &self.shared.upstream)
            .finish()
    }
}

impl Drop for S3Proxy {
    fn drop(&mut self) {
        {
            let mut st = self.shared.lock();
            st.shutdown = true;
            st.faults.clear();
            for socket in st.sockets.values() {
                let _ = socket.shutdown(Shutdown::Both);
            }
        }
        self.shared.changed.notify_all();
        // Wake the blocked `accept` with a connection of our own; it sees `shutdown` and
        // returns, closing the listener.
        let woken = TcpStream::connect_timeout(&self.addr, Duration::from_secs(2)).is_ok();
        if let Some(acceptor) = self.acceptor.take() {
            // Without the wake-up connection the acceptor could stay blocked: leave it
            // detached rather than block the dropping thread.
            if woken || acceptor.is_finished() {
                let _ = acceptor.join();
            }
        }
        let handles =
            std::mem::take(&mut *self.connections.lock().unwrap_or_else(|e| e.into_inner()));
        for handle in handles {
            let _ = handle.join();
        }
    }
}

fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    connections: Arc<Mutex<Vec<JoinHandle<()>>>>,
) {
    loop {
        let accepted = listener.accept();
        if shared.stopping() {
            return;
        }
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors and the like: back off instead of spinning.
                if !matches!(
                    e.kind(),
                    io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                ) {
                    std::thread::sleep(Duration::from_millis(10));
                }
                continue;
            }
        };
        let conn_shared = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("s3proxy-conn".to_string())
            .spawn(move || serve_connection(stream, conn_shared));
        if let Ok(handle) = spawned {
            let mut handles = connections.lock().unwrap_or_else(|e| e.into_inner());
            handles.retain(|h| !h.is_finished());
            handles.push(handle);
        }
    }
}

/// A request head as read from the client.
struct RequestHead {
    method: String,
    target: String,
    /// The request line, without its line ending.
    request_line: String,
    /// Header lines, without line endings.
    headers: Vec<String>,
}

impl RequestHead {
    /// Values of the header `name` (case-insensitive).
    fn header_values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.headers.iter().filter_map(move |line| {
            let (n, v) = line.split_once(':')?;
            n.trim().eq_ignore_ascii_case(name).then_some(v.trim())
        })
    }

    /// The body's length, or why the proxy does not take the request: `(status, why)`.
    fn body_length(&self) -> Result<u64, (u16, &'static str)> {
        if self.header_values("transfer-encoding").next().is_some() {
            return Err((
                501,
                "Transfer-Encoding (a chunked body) is not supported: send a Content-Length",
            ));
        }
        if self.header_values("expect").next().is_some() {
            return Err((501, "Expect (100-continue) is not supported"));
        }
        let mut length = None;
        for value in self.header_values("content-length") {
            for part in value.split(',') {
                let n: u64 = part
                    .trim()
                    .parse()
                    .map_err(|_| (400, "a bad Content-Length"))?;
                if length.is_some_and(|l| l != n) {
                    return Err((400, "conflicting Content-Length headers"));
                }
                length = Some(n);
            }
        }
        Ok(length.unwrap_or(0))
    }

    /// The head to send upstream: `Connection: close`, no hop-by-hop connection headers.
    fn forwarded(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(self.request_line.as_bytes());
        out.extend_from_slice(b"\r\n");
        for line in &self.headers {
            let name = line.split(':').next().unwrap_or("").trim();
            if ["connection", "keep-alive", "proxy-connection"]
                .iter()
                .any(|h| name.eq_ignore_ascii_case(h))
            {
                continue;
            }
            out.extend_from_slice(line.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"Connection: close\r\n\r\n");
        out
    }
}

enum HeadError {
    /// The peer closed (or failed) before a complete head: nothing to answer.
    Closed,
    TooLarge,
    Malformed,
}

/// Reads lines up to and including the empty line that ends an HTTP head, at most `cap`
/// bytes in all; empty lines before the first line are skipped (RFC 9112 §2.2).
fn read_head_lines(reader: &mut impl BufRead, cap: u64) -> Result<Vec<String>, HeadError> {
    let mut lines = Vec::new();
    let mut used = 0u64;
    loop {
        let mut line = Vec::new();
        let n = reader
            .take(cap - used)
            .read_until(b'\n', &mut line)
            .map_err(|_| HeadError::Closed)?;
        used += n as u64;
        if line.last() != Some(&b'\n') {
            // Either the cap cut the head short, or the peer closed mid-head.
            return Err(if used >= cap {
                HeadError::TooLarge
            } else {
                HeadError::Closed
            });
        }
        line.pop();
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        if line.is_empty() {
            if lines.is_empty() {
                continue;
            }
            return Ok(lines);
        }
        let text = String::from_utf8(line).map_err(|_| HeadError::Malformed)?;
        lines.push(text);
    }
}

fn read_request_head(reader: &mut impl BufRead) -> Result<RequestHead, HeadError> {
    let mut lines = read_head_lines(reader, MAX_REQUEST_HEAD)?.into_iter();
    let request_line = lines.next().ok_or(HeadError::Malformed)?;
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(HeadError::Malformed);
    };
    if method.is_empty() || target.is_empty() || !version.starts_with("HTTP/1.") {
        return Err(HeadError::Malformed);
    }
    Ok(RequestHead {
        method: method.to_string(),
        target: target.to_string(),
        headers: lines.collect(),
        request_line: request_line.clone(),
    })
}

fn serve_connection(client: TcpStream, shared: Arc<Shared>) {
    let Some(_guard) = shared.register(&client) else {
        return;
    };
    let Ok(read_half) = client.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(read_half);
    let mut client = client;
    let head = match read_request_head(&mut reader) {
        Ok(head) => head,
        Err(HeadError::Closed) => return,
        Err(e) => {
            shared.counts[S3Op::Other.index()].fetch_add(1, Ordering::SeqCst);
            let (status, what) = match e {
                HeadError::TooLarge => (431, "request head larger than 64 KiB"),
                _ => (400, "malformed request head"),
            };
            refuse(&mut client, &mut reader, status, what);
            return;
        }
    };
    let op = S3Op::classify(&head.method, &head.target);
    shared.counts[op.index()].fetch_add(1, Ordering::SeqCst);
    shared
        .requests
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(format!("{} {}", head.method, head.target));
    let is_head = head.method.eq_ignore_ascii_case("HEAD");
    let body_len = match head.body_length() {
        Ok(n) => n,
        Err((status, what)) => {
            refuse(&mut client, &mut reader, status, what);
            return;
        }
    };
    match shared.fault_for(op) {
        None => {}
        Some((
            FaultAction::Status {
                status,
                code,
                message,
            },
            _,
        )) => {
            if copy_body(&mut reader, &mut io::sink(), body_len).is_err() {
                return;
            }
            let response = error_response(status, &code, &message, !is_head);
            let _ = client.write_all(&response);
            let _ = client.flush();
            let _ = client.shutdown(Shutdown::Write);
            return;
        }
        Some((FaultAction::Hang, epoch)) => {
            if copy_body(&mut reader, &mut io::sink(), body_len).is_err() {
                return;
            }
            hang(&shared, &client, epoch);
            let _ = client.shutdown(Shutdown::Both);
            return;
        }
        Some((FaultAction::Delay(delay), epoch)) => {
            // Only a stop ends the delay early; a `clear_faults` keeps waiting it out.
            let start = std::time::Instant::now();
            let mut epoch = epoch;
            while let Some(left) = delay.checked_sub(start.elapsed()) {
                if left.is_zero() {
                    break;
                }
                if shared.wait(epoch, left) {
                    if shared.stopping() {
                        return;
                    }
                    epoch = shared.lock().epoch;
                }
            }
        }
    }
    forward(&shared, head, body_len, reader, client);
}

/// Waits until the faults are cleared, the proxy stops or the client goes away.
fn hang(shared: &Shared, client: &TcpStream, epoch: u64) {
    let peek_ok = client.set_nonblocking(true).is_ok();
    let mut byte = [0u8; 1];
    loop {
        if shared.wait(epoch, HANG_POLL) {
            return;
        }
        if peek_ok {
            match client.peek(&mut byte) {
                Ok(0) => return,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => return,
            }
        }
    }
}

/// Answers an unusable request with `status` and closes, reading a little of what the client
/// still sends so that the close does not reset the connection under the answer.
fn refuse(client: &mut TcpStream, reader: &mut impl Read, status: u16, what: &str) {
    let code = if status == 501 {
        "NotImplemented"
    } else {
        "InvalidRequest"
    };
    let response = error_response(status, code, what, true);
    let _ = client.write_all(&response);
    let _ = client.flush();
    let _ = client.shutdown(Shutdown::Write);
    let _ = client.set_read_timeout(Some(Duration::from_millis(500)));
    let _ = io::copy(&mut reader.take(1024 * 1024), &mut io::sink());
}

fn forward(
    shared: &Arc<Shared>,
    head: RequestHead,
    body_len: u64,
    mut reader: BufReader<TcpStream>,
    mut client: TcpStream,
) {
    let upstream = match TcpStream::connect_timeout(&shared.upstream, UPSTREAM_CONNECT_TIMEOUT) {
        Ok(s) => s,
        Err(e) => {
            if copy_body(&mut reader, &mut io::sink(), body_len).is_err() {
                return;
            }
            let message = format!("proxy cannot reach {}: {e}", shared.upstream);
            let _ = client.write_all(&error_response(
                502,
                "BadGateway",
                &message,
                !head.method.eq_ignore_ascii_case("HEAD"),
            ));
            let _ = client.shutdown(Shutdown::Write);
            return;
        }
    };
    let Some(_guard) = shared.register(&upstream) else {
        return;
    };
    let Ok(upstream_read) = upstream.try_clone() else {
        return;
    };
    let _ = upstream.set_nodelay(true);
    let _ = client.set_nodelay(true);

    // Request: head, then the body.
    let mut sink = UpstreamSink {
        stream: Some(&upstream),
    };
    let _ = sink.write_all(&head.forwarded());
    if copy_body(&mut reader, &mut sink, body_len).is_err() {
        // The client broke off mid-request: nothing sensible to answer.
        return;
    }
    let _ = sink.flush();

    // Response: the head with `Connection: close`, then everything up to the upstream's EOF.
    let mut upstream_reader = BufReader::new(upstream_read);
    let Ok(lines) = read_head_lines(&mut upstream_reader, MAX_RESPONSE_HEAD) else {
        let _ = client.write_all(&error_response(
            502,
            "BadGateway",
            "the upstream S3 server sent no complete response",
            !head.method.eq_ignore_ascii_case("HEAD"),
        ));
        let _ = client.shutdown(Shutdown::Write);
        return;
    };
    let mut out = Vec::with_capacity(512);
    for (i, line) in lines.iter().enumerate() {
        let name = line.split(':').next().unwrap_or("").trim();
        if i > 0
            && ["connection", "keep-alive", "proxy-connection"]
                .iter()
                .any(|h| name.eq_ignore_ascii_case(h))
        {
            continue;
        }
        out.extend_from_slice(line.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    if client.write_all(&out).is_err() {
        return;
    }
    if io::copy(&mut upstream_reader, &mut client).is_ok() {
        let _ = client.flush();
        let _ = client.shutdown(Shutdown::Write);
    }
}

/// Writes to the upstream server; after the first failure (the server answered early and
/// closed) it discards, so that the client's body is still read to its end.
struct UpstreamSink<'a> {
    stream: Option<&'a TcpStream>,
}

impl Write for UpstreamSink<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if let Some(mut stream) = self.stream {
            match stream.write(buf) {
                Ok(n) if n > 0 || buf.is_empty() => return Ok(n),
                _ => self.stream = None,
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        if let Some(mut stream) = self.stream {
            if stream.flush().is_err() {
                self.stream = None;
            }
        }
        Ok(())
    }
}

/// Copies a request body of `n` bytes from `reader` to `out`. Errors when the client closes
/// early or `out` fails.
fn copy_body(reader: &mut impl BufRead, out: &mut impl Write, n: u64) -> io::Result<()> {
    let copied = io::copy(&mut reader.take(n), out)?;
    if copied == n {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "request body ended early",
        ))
    }
}

/// A complete `Connection: close` response with an S3 `<Error>` body (headers only when
/// `with_body` is false, as for `HEAD`).
fn error_response(status: u16, code: &str, message: &str, with_body: bool) -> Vec<u8> {
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{}</Code><Message>{}</Message>\
         </Error>",
        xml_escape(code),
        xml_escape(message)
    );
    let mut out = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: application/xml\r\nContent-Length: {}\r\n\
         x-amz-request-id: silt-s3proxy\r\nConnection: close\r\n\r\n",
        reason(status),
        body.len()
    )
    .into_bytes();
    if with_body {
        out.extend_from_slice(body.as_bytes());
    }
    out
}

fn reason(status: u16) -> &'static str {
    match status {
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        409 => "Conflict",
        412 => "Precondition Failed",
        416 => "Range Not Satisfiable",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Error",
    }
}

fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_path_style_requests() {
        for (method, target, op) in [
            ("HEAD", "/b/k", S3Op::Head),
            ("GET", "/b?list-type=2&prefix=x%2F", S3Op::List),
            ("GET", "/b/?delimiter=%2F&list-type=2", S3Op::List),
            ("GET", "/b", S3Op::List),
            ("GET", "/b/", S3Op::List),
            ("GET", "/", S3Op::List),
            ("GET", "/b/dir/k.jpg", S3Op::Get),
            ("GET", "/b/k?x-id=GetObject", S3Op::Get),
            ("GET", "/b/k?not-list-type=2", S3Op::Get),
            ("PUT", "/b/k", S3Op::Put),
            ("DELETE", "/b/k", S3Op::Delete),
            ("POST", "/b?delete", S3Op::Other),
            ("OPTIONS", "*", S3Op::Other),
        ] {
            assert_eq!(S3Op::classify(method, target), op, "{method} {target}");
        }
    }

    #[test]
    fn queued_injections_run_in_order() {
        let proxy = S3Proxy::start(refusing()).unwrap();
        proxy.inject(S3Op::Head, 1, 1, FaultAction::slow_down());
        proxy.inject(S3Op::Head, 0, 2, FaultAction::Hang);
        let s = &proxy.shared;
        assert_eq!(s.fault_for(S3Op::Get), None);
        assert_eq!(s.fault_for(S3Op::Head), None);
        assert_eq!(
            s.fault_for(S3Op::Head).map(|f| f.0),
            Some(FaultAction::slow_down())
        );
        assert_eq!(
            s.fault_for(S3Op::Head).map(|f| f.0),
            Some(FaultAction::Hang)
        );
        assert_eq!(
            s.fault_for(S3Op::Head).map(|f| f.0),
            Some(FaultAction::Hang)
        );
        assert_eq!(s.fault_for(S3Op::Head), None);
        proxy.inject(S3Op::Put, 0, usize::MAX, FaultAction::Hang);
        proxy.clear_faults();
        assert_eq!(s.fault_for(S3Op::Put), None);
    }

    /// Sends `request` raw and returns everything the proxy answers until it closes.
    fn exchange(proxy: &S3Proxy, request: &[u8]) -> String {
        let mut s = TcpStream::connect(proxy.addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(request).unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    }

    /// A one-shot upstream that records the request it got (up to and including `end`) and
    /// answers `response`.
    fn upstream(
        end: &'static [u8],
        response: &'static [u8],
    ) -> (SocketAddr, std::thread::JoinHandle<Vec<u8>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let handle = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            while !got.ends_with(end) {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
            s.write_all(response).unwrap();
            got
        });
        (addr, handle)
    }

    #[test]
    fn forwards_bodies_and_closes() {
        let (addr, server) = upstream(
            b"\r\n\r\nabcde",
            b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok",
        );
        let proxy = S3Proxy::start(addr).unwrap();
        let answer = exchange(
            &proxy,
            b"PUT /b/k HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\
              Content-Length: 5\r\n\r\nabcde",
        );
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        assert!(answer.contains("Connection: close\r\n"), "{answer}");
        assert!(!answer.contains("keep-alive"), "{answer}");
        assert!(answer.ends_with("\r\n\r\nok"), "{answer}");
        let got = String::from_utf8(server.join().unwrap()).unwrap();
        assert!(got.starts_with("PUT /b/k HTTP/1.1\r\nHost: x\r\n"), "{got}");
        assert!(got.contains("Content-Length: 5\r\n"), "{got}");
        assert!(got.contains("Connection: close\r\n"), "{got}");
        assert!(!got.contains("keep-alive"), "{got}");
        assert!(got.ends_with("\r\n\r\nabcde"), "{got}");
        assert_eq!(proxy.counts().put, 1);
    }

    #[test]
    fn chunked_bodies_and_expect_get_501() {
        // Nothing is forwarded: the upstream refuses connections.
        let proxy = S3Proxy::start(refusing()).unwrap();
        for request in [
            &b"PUT /b/k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n\
               3\r\nabc\r\n0\r\n\r\n"[..],
            b"PUT /b/k HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n",
        ] {
            let answer = exchange(&proxy, request);
            assert!(
                answer.starts_with("HTTP/1.1 501 Not Implemented\r\n"),
                "{answer}"
            );
            assert!(answer.contains("<Code>NotImplemented</Code>"), "{answer}");
            assert!(answer.contains("not supported"), "{answer}");
        }
        assert_eq!(proxy.counts().put, 2, "counted, like every request");
        assert_eq!(proxy.counts().total(), 2);
    }

    /// A loopback address nothing listens on (a port that was free a moment ago).
    fn refusing() -> SocketAddr {
        TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
    }

    #[test]
    fn faults_oversized_heads_and_drop() {
        let proxy = S3Proxy::start(refusing()).unwrap();
        proxy.inject(S3Op::Get, 0, 1, FaultAction::slow_down());
        let answer = exchange(&proxy, b"GET /b/k HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(answer.starts_with("HTTP/1.1 503 "), "{answer}");
        assert!(
            answer.ends_with(
                "<Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
            ),
            "{answer}"
        );
        proxy.inject(S3Op::Head, 0, 1, FaultAction::internal_error());
        let answer = exchange(&proxy, b"HEAD /b/k HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(answer.starts_with("HTTP/1.1 500 "), "{answer}");
        assert!(answer.ends_with("\r\n\r\n"), "HEAD: no body: {answer}");
        // The upstream refuses connections: 502 from the proxy.
        let answer = exchange(&proxy, b"GET /b/k HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(answer.starts_with("HTTP/1.1 502 "), "{answer}");
        let mut big = b"GET /b/k HTTP/1.1\r\nX: ".to_vec();
        big.resize(70 * 1024, b'a');
        let answer = exchange(&proxy, &big);
        assert!(answer.starts_with("HTTP/1.1 431 "), "{answer}");
        let answer = exchange(&proxy, b"GARBAGE\r\n\r\n");
        assert!(answer.starts_with("HTTP/1.1 400 "), "{answer}");
        assert_eq!(proxy.counts().get, 2);
        assert_eq!(proxy.counts().head, 1);
        assert_eq!(proxy.counts().other, 2);
        assert_eq!(proxy.counts().total(), 5);

        // A hanging request ends (the connection closes) when the proxy is dropped.
        proxy.inject(S3Op::Get, 0, usize::MAX, FaultAction::Hang);
        let mut s = TcpStream::connect(proxy.addr()).unwrap();
        s.write_all(b"GET /b/k HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while proxy.counts().get < 3 {
            assert!(
                std::time::Instant::now() < deadline,
                "the hanging request never reached the proxy"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(proxy);
        let mut out = Vec::new();
        let r = s.read_to_end(&mut out);
        assert!(out.is_empty(), "no answer: {out:?}");
        assert!(
            r.is_ok() || r.is_err_and(|e| e.kind() != io::ErrorKind::WouldBlock),
            "closed, not timed out"
        );
    }
}
