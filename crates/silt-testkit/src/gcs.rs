//! [`FakeGcs`]: a real Google Cloud Storage emulator (fake-gcs-server, memory backend) on a
//! free loopback port, for tests that must talk to GCS's JSON API for real.
//!
//! ```ignore
//! let gcs = silt_testkit::FakeGcs::start();
//! gcs.create_bucket("data");
//! // point the GCS client at gcs.endpoint(), with no credentials
//! ```

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use tempfile::TempDir;

use crate::{kill, start_on_free_port, Launch};

const LOG: &str = "fake-gcs-server.log";

/// A running fake-gcs-server serving a fresh temporary directory on `127.0.0.1`, over plain
/// HTTP, accepting any (or no) credentials.
///
/// Dropping it kills the process and deletes the directory, also when a test panics.
pub struct FakeGcs {
    child: Child,
    port: u16,
    // Declared last: dropped after `Drop::drop` has killed the process that writes into it.
    dir: TempDir,
}

impl FakeGcs {
    /// Starts a server, panicking with the reason (and the server's log) if it cannot.
    pub fn start() -> FakeGcs {
        FakeGcs::try_start().unwrap_or_else(|e| panic!("cannot start fake-gcs-server: {e}"))
    }

    /// Starts a server and waits until its JSON API answers.
    pub fn try_start() -> Result<FakeGcs, String> {
        let binary = fake_gcs_path()?;
        let ip = Ipv4Addr::LOCALHOST;
        let dir = tempfile::Builder::new()
            .prefix("silt-gcs-")
            .tempdir()
            .map_err(|e| format!("creating a temporary directory: {e}"))?;
        let log_path = dir.path().join(LOG);
        let launch = Launch {
            name: "fake-gcs-server",
            ip,
            log_path: &log_path,
            // Flags win over FAKE_GCS_* variables, but others (a Pub/Sub event topic, seed
            // data) would change the server or make it talk to other hosts.
            env_prefix: "FAKE_GCS_",
            port_taken: "address already in use",
        };
        let command = |port: u16| {
            let url = format!("http://{ip}:{port}");
            let mut cmd = Command::new(&binary);
            cmd.args(["-scheme", "http", "-host", &ip.to_string()])
                .args(["-port", &port.to_string()])
                // The memory backend: the filesystem one accepts an object named `d/` (a
                // directory marker) and keeps nothing, so directories could not be tested.
                .args(["-backend", "memory"])
                // Public (XML-style) URLs and upload Locations name this server, not Google's.
                .args([
                    "-public-host",
                    &format!("{ip}:{port}"),
                    "-external-url",
                    &url,
                ])
                .current_dir(dir.path());
            cmd
        };
        let (child, port) = start_on_free_port(&launch, command, answers)?;
        Ok(FakeGcs { child, port, dir })
    }

    /// `http://127.0.0.1:PORT`, the base of the JSON API (`/storage/v1/...`) and uploads.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr())
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Creates an empty bucket, panicking with the reason if the server refuses.
    pub fn create_bucket(&self, name: &str) {
        self.try_create_bucket(name)
            .unwrap_or_else(|e| panic!("creating GCS bucket {name}: {e}\n{}", self.log()));
    }

    /// Creates an empty bucket through the JSON API (`POST /storage/v1/b`).
    pub fn try_create_bucket(&self, name: &str) -> Result<(), String> {
        let body = serde_json::json!({ "name": name }).to_string();
        let r = http_request(
            self.addr(),
            "POST",
            "/storage/v1/b?project=silt-test",
            &[("Content-Type", "application/json")],
            body.as_bytes(),
        )?;
        if r.status == 200 {
            Ok(())
        } else {
            Err(format!("HTTP {}: {}", r.status, r.body_text()))
        }
    }

    /// What the server has logged so far (for assertion messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join(LOG)).unwrap_or_default()
    }
}

impl Drop for FakeGcs {
    fn drop(&mut self) {
        kill(&mut self.child);
    }
}

/// Whether the JSON API answers (listing buckets needs no bucket and no credentials).
fn answers(addr: SocketAddr) -> bool {
    http_request(addr, "GET", "/storage/v1/b?project=silt-test", &[], b"")
        .is_ok_and(|r| r.status == 200)
}

/// The fake-gcs-server binary: `$SILT_FAKE_GCS`, then `<workspace>/.deps/bin/fake-gcs-server`,
/// then `fake-gcs-server` on PATH.
pub fn fake_gcs_path() -> Result<PathBuf, String> {
    crate::find_tool(
        "SILT_FAKE_GCS",
        &[deps_dir().join("bin/fake-gcs-server")],
        "fake-gcs-server",
        "./scripts/install-deps.sh builds it into .deps/bin",
    )
}

/// `<workspace>/.deps`, where scripts/install-deps.sh puts the emulators.
pub(crate) fn deps_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.deps")
}

/// A response read by [`http_request`].
pub(crate) struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl HttpResponse {
    /// The first header called `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Bounds every step of [`http_request`], so that a wedged server fails a test, not hangs it.
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);
/// Responses to the emulators' set-up calls are small; this only bounds a runaway one.
const MAX_RESPONSE: u64 = 64 << 20;

/// One HTTP/1.1 exchange on a fresh connection (`Connection: close`, so the response ends at
/// end of stream): the emulators' set-up calls and readiness probes need no client library.
/// `target` is the request target (path and query); `Host` and `Content-Length` are added.
pub(crate) fn http_request(
    addr: SocketAddr,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<HttpResponse, String> {
    http_request_within(addr, method, target, headers, body, HTTP_TIMEOUT)
}

/// A `GET` of `target` that gives up after `timeout` (a readiness probe asks again soon).
pub(crate) fn http_probe(
    addr: SocketAddr,
    target: &str,
    timeout: Duration,
) -> Result<HttpResponse, String> {
    http_request_within(addr, "GET", target, &[], b"", timeout)
}

fn http_request_within(
    addr: SocketAddr,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    timeout: Duration,
) -> Result<HttpResponse, String> {
    let io = |e: std::io::Error| format!("{method} http://{addr}{target}: {e}");
    let mut stream = TcpStream::connect_timeout(&addr, timeout).map_err(io)?;
    stream.set_read_timeout(Some(timeout)).map_err(io)?;
    stream.set_write_timeout(Some(timeout)).map_err(io)?;
    let mut head = format!(
        "{method} {target} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).map_err(io)?;
    stream.write_all(body).map_err(io)?;
    let mut raw = Vec::new();
    stream
        .take(MAX_RESPONSE)
        .read_to_end(&mut raw)
        .map_err(io)?;
    parse_response(&raw).map_err(|e| format!("{method} http://{addr}{target}: {e}"))
}

fn parse_response(mut raw: &[u8]) -> Result<HttpResponse, String> {
    loop {
        let mut slots = [httparse::EMPTY_HEADER; 64];
        let mut parsed = httparse::Response::new(&mut slots);
        let head_len = match parsed.parse(raw) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => return Err("truncated response head".to_string()),
            Err(e) => return Err(format!("malformed response: {e}")),
        };
        let status = parsed.code.ok_or("response without a status")?;
        // Interim responses (WebHDFS's datanode sends `100 Continue` unasked) come first.
        if (100..200).contains(&status) {
            raw = &raw[head_len..];
            continue;
        }
        return parse_final(status, &parsed, &raw[head_len..]);
    }
}

fn parse_final(
    status: u16,
    parsed: &httparse::Response,
    rest: &[u8],
) -> Result<HttpResponse, String> {
    let headers: Vec<(String, String)> = parsed
        .headers
        .iter()
        .map(|h| {
            let value = String::from_utf8_lossy(h.value).into_owned();
            (h.name.to_string(), value)
        })
        .collect();
    let mut response = HttpResponse {
        status,
        headers,
        body: Vec::new(),
    };
    let chunked = response
        .header("transfer-encoding")
        .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
    response.body = if chunked {
        dechunk(rest)?
    } else {
        let len = response
            .header("content-length")
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(rest.len());
        rest[..len.min(rest.len())].to_vec()
    };
    Ok(response)
}

/// Decodes a `Transfer-Encoding: chunked` body (extensions and trailers ignored).
fn dechunk(mut rest: &[u8]) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    loop {
        let line_end = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("truncated chunk size")?;
        let size_text = String::from_utf8_lossy(&rest[..line_end]);
        let size_text = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16)
            .map_err(|e| format!("bad chunk size {size_text:?}: {e}"))?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Ok(body);
        }
        let chunk = rest.get(..size).ok_or("truncated chunk")?;
        body.extend_from_slice(chunk);
        rest = rest.get(size + 2..).ok_or("truncated chunk end")?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_answers_and_cleans_up() {
        let gcs = FakeGcs::start();
        assert!(gcs.endpoint().starts_with("http://127.0.0.1:"));
        gcs.create_bucket("b1");
        let put = http_request(
            gcs.addr(),
            "POST",
            "/upload/storage/v1/b/b1/o?uploadType=media&name=dir/hello.txt",
            &[("Content-Type", "text/plain")],
            b"hello gcs",
        )
        .unwrap_or_else(|e| panic!("{e}\n{}", gcs.log()));
        assert_eq!(put.status, 200, "{}\n{}", put.body_text(), gcs.log());
        let get = http_request(
            gcs.addr(),
            "GET",
            "/storage/v1/b/b1/o/dir%2Fhello.txt?alt=media",
            &[],
            b"",
        )
        .unwrap_or_else(|e| panic!("{e}\n{}", gcs.log()));
        assert_eq!(get.status, 200, "{}\n{}", get.body_text(), gcs.log());
        assert_eq!(get.body, b"hello gcs");
        let err = gcs.try_create_bucket("b1").expect_err("bucket exists");
        assert!(err.contains("409"), "{err}");
        let dir = gcs.dir.path().to_path_buf();
        let addr = gcs.addr();
        drop(gcs);
        assert!(!dir.exists(), "temporary directory removed");
        assert!(!answers(addr), "process killed");
    }

    #[test]
    fn skips_interim_responses_and_decodes_chunks() {
        let raw = b"HTTP/1.1 100 Continue\r\n\r\n\
            HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
            3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n";
        let r = parse_response(raw).expect("parses");
        assert_eq!((r.status, r.body.as_slice()), (200, &b"abcde"[..]));
    }
}
