//! Test support for Silt: [`S3Server`], a real S3-compatible server (versitygw, posix
//! backend) on a free loopback port, for tests that must talk to S3 for real.
//!
//! ```ignore
//! let server = silt_testkit::S3Server::start();
//! server.create_bucket("data");
//! let store = silt_ufs::open_store(&server.uri("data", ""), &server.s3_options()).await?;
//! ```

pub mod azurite;
pub mod gcs;
pub mod hdfs;
pub mod netlab;
pub mod s3proxy;

pub use azurite::Azurite;
pub use gcs::FakeGcs;
pub use hdfs::MiniHdfs;
pub use s3proxy::{FaultAction, ProxyCounts, S3Op, S3Proxy};

use std::fs::File;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use silt_ufs::S3Options;
use tempfile::TempDir;

const ACCESS_KEY: &str = "silt-test-access";
const SECRET_KEY: &str = "silt-test-secret-do-not-use";
/// How long a server may take to accept requests (a cold start under load is well below).
pub(crate) const READY_TIMEOUT: Duration = Duration::from_secs(30);
const POLL_INTERVAL: Duration = Duration::from_millis(20);
/// Port races (another process binding the port we picked) are retried with a new port.
const START_ATTEMPTS: usize = 5;

/// A running versitygw serving a fresh temporary directory on `127.0.0.1`.
///
/// Top-level directories of [`S3Server::root`] are buckets (versitygw's posix backend), and
/// objects are plain files below them. Dropping the server kills the process and deletes the
/// directory, also when a test panics.
pub struct S3Server {
    child: Child,
    access_key: String,
    secret_key: String,
    ip: Ipv4Addr,
    port: u16,
    // Declared last: dropped after `Drop::drop` has killed the process that writes into it.
    dir: TempDir,
}

impl S3Server {
    /// Starts a server, panicking with the reason (and the server's log) if it cannot.
    pub fn start() -> S3Server {
        S3Server::start_on(Ipv4Addr::LOCALHOST)
    }

    /// Starts a server listening on `ip` (a lab bridge address, for workers in namespaces).
    pub fn start_on(ip: Ipv4Addr) -> S3Server {
        S3Server::try_start_on(ip)
            .unwrap_or_else(|e| panic!("cannot start the test S3 server: {e}"))
    }

    /// Starts a server and waits until it answers HTTP requests.
    pub fn try_start() -> Result<S3Server, String> {
        S3Server::try_start_on(Ipv4Addr::LOCALHOST)
    }

    pub fn try_start_on(ip: Ipv4Addr) -> Result<S3Server, String> {
        S3Server::try_start_with_keys(ip, ACCESS_KEY, SECRET_KEY)
    }

    /// A server on loopback that takes only the root keys `access`/`secret` (two servers with
    /// keys of their own stand for two clouds side by side).
    pub fn start_with_keys(access: &str, secret: &str) -> S3Server {
        S3Server::try_start_with_keys(Ipv4Addr::LOCALHOST, access, secret)
            .unwrap_or_else(|e| panic!("cannot start the test S3 server: {e}"))
    }

    fn try_start_with_keys(ip: Ipv4Addr, access: &str, secret: &str) -> Result<S3Server, String> {
        let binary = versitygw_path()?;
        let dir = tempfile::Builder::new()
            .prefix("silt-s3-")
            .tempdir()
            .map_err(|e| format!("creating a temporary directory: {e}"))?;
        let root = dir.path().join("root");
        std::fs::create_dir(&root).map_err(|e| format!("creating {}: {e}", root.display()))?;
        let log_path = dir.path().join("versitygw.log");
        let launch = Launch {
            name: "versitygw",
            ip,
            log_path: &log_path,
            // Flags win over VGW_* variables, but other VGW_* settings (event webhooks, ...)
            // could still make the server talk to other hosts.
            env_prefix: "VGW_",
            port_taken: "address already in use",
        };
        let command = |port: u16| {
            let mut cmd = Command::new(&binary);
            cmd.arg("--access")
                .arg(access)
                .arg("--secret")
                .arg(secret)
                .arg("--port")
                .arg(format!("{ip}:{port}"))
                .arg("posix")
                .arg(&root);
            cmd
        };
        let (child, port) = start_on_free_port(&launch, command, |a| probe(ip, a.port()))?;
        Ok(S3Server {
            child,
            access_key: access.to_string(),
            secret_key: secret.to_string(),
            ip,
            port,
            dir,
        })
    }

    /// `http://IP:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}:{}", self.ip, self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn access_key(&self) -> &str {
        &self.access_key
    }

    pub fn secret_key(&self) -> &str {
        &self.secret_key
    }

    /// The served directory: each top-level directory is a bucket.
    pub fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    /// Creates an empty bucket. versitygw's posix backend treats every top-level directory as
    /// a bucket, also one created while it runs, so this is a `mkdir` (no request signing).
    pub fn create_bucket(&self, name: &str) {
        let path = self.root().join(name);
        std::fs::create_dir(&path)
            .unwrap_or_else(|e| panic!("creating bucket directory {}: {e}", path.display()));
    }

    /// `s3://bucket/prefix` (or `s3://bucket` for an empty prefix).
    pub fn uri(&self, bucket: &str, prefix: &str) -> String {
        let prefix = prefix.trim_matches('/');
        if prefix.is_empty() {
            format!("s3://{bucket}")
        } else {
            format!("s3://{bucket}/{prefix}")
        }
    }

    /// Options that reach this server with its credentials (path style, short timeouts).
    pub fn s3_options(&self) -> S3Options {
        S3Options {
            endpoint: self.endpoint(),
            region: "us-east-1".to_string(),
            path_style: true,
            access_key_id: self.access_key.clone(),
            secret_access_key: self.secret_key.clone(),
            timeout: Duration::from_secs(10),
            list_page: 1000,
            retries: 2,
            list_attrs: false,
            direct_receive: true,
        }
    }

    /// What the server has logged so far (for assertion messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("versitygw.log")).unwrap_or_default()
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        kill(&mut self.child);
    }
}

pub(crate) fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// How a test server is started on a free port (see [`start_on_free_port`]).
pub(crate) struct Launch<'a> {
    /// The server's name in messages.
    pub name: &'a str,
    pub ip: Ipv4Addr,
    /// Its log file (stdout and stderr), rewritten at each attempt.
    pub log_path: &'a Path,
    /// Environment variables starting with it are removed: the server starts from a clean
    /// slate whatever the test process has set (webhooks, seed data, other accounts).
    pub env_prefix: &'a str,
    /// What its log says when another process took the port first.
    pub port_taken: &'a str,
}

/// Starts the server `command(port)` builds on a free port, its stdin closed and its output
/// in the log, and waits until `ready(addr)`; a start that lost its port to another process
/// is retried on a new one ([`START_ATTEMPTS`] in all). The child and its port.
pub(crate) fn start_on_free_port(
    l: &Launch<'_>,
    command: impl Fn(u16) -> Command,
    ready: impl Fn(SocketAddr) -> bool,
) -> Result<(Child, u16), String> {
    let mut last_error = String::new();
    for _ in 0..START_ATTEMPTS {
        let port = free_port(l.ip)?;
        let log = File::create(l.log_path)
            .map_err(|e| format!("creating {}: {e}", l.log_path.display()))?;
        let log_err = log
            .try_clone()
            .map_err(|e| format!("opening {}: {e}", l.log_path.display()))?;
        let mut cmd = command(port);
        cmd.stdin(Stdio::null()).stdout(log).stderr(log_err);
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with(l.env_prefix) {
                cmd.env_remove(&key);
            }
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("running {}: {e}", l.name))?;
        let addr = SocketAddr::from((l.ip, port));
        match wait_ready(&mut child, l.name, &format!("answer on {addr}"), || {
            ready(addr)
        }) {
            Ok(()) => return Ok((child, port)),
            Err(e) => {
                kill(&mut child);
                let log = std::fs::read_to_string(l.log_path).unwrap_or_default();
                if !log.contains(l.port_taken) {
                    return Err(format!("{e}\n{} log:\n{log}", l.name));
                }
                last_error = e;
            }
        }
    }
    Err(format!(
        "gave up after {START_ATTEMPTS} port collisions: {last_error}"
    ))
}

/// Waits until `ready` holds, polling; fails if `name`'s process exits first or `waiting_for`
/// (what `ready` checks) has not happened within [`READY_TIMEOUT`].
pub(crate) fn wait_ready(
    child: &mut Child,
    name: &str,
    waiting_for: &str,
    ready: impl Fn() -> bool,
) -> Result<(), String> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("{name} exited during start-up ({status})"));
        }
        if ready() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "{name} did not {waiting_for} within {READY_TIMEOUT:?}"
            ));
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// A port on `ip` that was free a moment ago (the kernel's choice for port 0).
pub(crate) fn free_port(ip: Ipv4Addr) -> Result<u16, String> {
    TcpListener::bind((ip, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("finding a free port on {ip}: {e}"))
}

/// Whether versitygw answers on the port.
fn probe(ip: Ipv4Addr, port: u16) -> bool {
    versitygw_answers(SocketAddr::from((ip, port)))
}

/// Whether versitygw answers an HTTP request at `addr` (any status: unsigned requests are
/// refused, which is fine; the `Server` header tells it is versitygw and not a port thief).
/// Shared with `silt-bench`, which starts versitygw for the benchmarks too.
pub fn versitygw_answers(addr: SocketAddr) -> bool {
    gcs::http_probe(addr, "/", Duration::from_secs(2)).is_ok_and(|r| {
        r.header("server")
            .is_some_and(|s| s.to_ascii_lowercase().starts_with("versitygw"))
    })
}

/// The versitygw binary: `$SILT_VERSITYGW`, `<workspace>/.deps/bin/versitygw`, then `PATH`.
pub fn versitygw_path() -> Result<PathBuf, String> {
    find_tool(
        "SILT_VERSITYGW",
        &[gcs::deps_dir().join("bin/versitygw")],
        "versitygw",
        "./scripts/install-deps.sh builds it",
    )
}

/// A program the tests start: `$env` if set (it must name a file), else the first of `local`
/// that is a file, else `name` on PATH; the error says where it looked and `hint`.
pub(crate) fn find_tool(
    env: &str,
    local: &[PathBuf],
    name: &str,
    hint: &str,
) -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os(env).filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("{env}={} is not a file ({hint})", p.display()))
        };
    }
    if let Some(p) = local.iter().find(|p| p.is_file()) {
        return Ok(p.clone());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            let places: Vec<String> = local.iter().map(|p| p.display().to_string()).collect();
            format!(
                "{name} not found: not in ${env}, {}, nor on PATH ({hint})",
                places.join(", ")
            )
        })
}

/// Whether this process is root (namespaces and qdiscs need it).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_answers_and_cleans_up() {
        let server = S3Server::start();
        assert!(
            probe(Ipv4Addr::LOCALHOST, server.port()),
            "{}",
            server.log()
        );
        server.create_bucket("b1");
        assert!(server.root().join("b1").is_dir());
        assert_eq!(server.uri("b1", "/x/"), "s3://b1/x");
        assert_eq!(server.s3_options().endpoint, server.endpoint());
        let dir = server.dir.path().to_path_buf();
        let port = server.port();
        drop(server);
        assert!(!dir.exists(), "temporary directory removed");
        assert!(!probe(Ipv4Addr::LOCALHOST, port), "process killed");
    }
}

/// A running single-member etcd (the Debian `etcd-server` binary, 3.4) on free ports of one
/// IPv4 address, with its data in a fresh temporary directory, for membership tests.
///
/// Dropping it kills the process and deletes the directory, also when a test panics.
///
/// ```ignore
/// let etcd = silt_testkit::Etcd::start();
/// let m = EtcdMembership::connect(&[etcd.endpoint()], "silt", ttl).await?;
/// ```
pub struct Etcd {
    child: Child,
    binary: PathBuf,
    ip: Ipv4Addr,
    client_port: u16,
    peer_port: u16,
    // Declared last: dropped after `Drop::drop` has killed the process that writes into it.
    dir: TempDir,
}

impl Etcd {
    /// Starts etcd on `127.0.0.1`, panicking with the reason (and etcd's log) if it cannot.
    pub fn start() -> Etcd {
        Etcd::start_on(Ipv4Addr::LOCALHOST)
    }

    /// Starts etcd listening on `ip` only (for instance the host end of a veth pair, so that
    /// processes in a network namespace reach it), panicking if it cannot.
    pub fn start_on(ip: Ipv4Addr) -> Etcd {
        Etcd::try_start_on(ip).unwrap_or_else(|e| panic!("cannot start the test etcd: {e}"))
    }

    /// Starts etcd on `ip` and waits until it reports itself healthy (it has a leader).
    pub fn try_start_on(ip: Ipv4Addr) -> Result<Etcd, String> {
        let binary = etcd_path()?;
        let dir = tempfile::Builder::new()
            .prefix("silt-etcd-")
            .tempdir()
            .map_err(|e| format!("creating a temporary directory: {e}"))?;
        let mut last_error = String::new();
        for _ in 0..START_ATTEMPTS {
            let client_port = free_port(ip)?;
            let peer_port = free_port(ip)?;
            if client_port == peer_port {
                continue;
            }
            let mut child = spawn_etcd(&binary, dir.path(), ip, client_port, peer_port)?;
            match wait_etcd_ready(&mut child, ip, client_port) {
                Ok(()) => {
                    return Ok(Etcd {
                        child,
                        binary,
                        ip,
                        client_port,
                        peer_port,
                        dir,
                    })
                }
                Err(e) => {
                    kill(&mut child);
                    let log = read_etcd_log(dir.path());
                    if !log.contains("address already in use") {
                        return Err(format!("{e}\netcd log:\n{log}"));
                    }
                    last_error = e;
                    // The next attempt uses other URLs: start from an empty data directory.
                    let _ = std::fs::remove_dir_all(dir.path().join("data"));
                }
            }
        }
        Err(format!(
            "gave up after {START_ATTEMPTS} port collisions: {last_error}"
        ))
    }

    /// `http://IP:PORT`, the client URL.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr())
    }

    /// The client address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((self.ip, self.client_port))
    }

    /// Whether etcd answers `/health` with a leader right now.
    pub fn is_healthy(&self) -> bool {
        etcd_healthy(self.ip, self.client_port)
    }

    /// Kills etcd (like a crash) and starts it again on the same ports with the same data, so
    /// clients see their connections break and must reconnect. Panics if it cannot.
    pub fn restart(&mut self) {
        kill(&mut self.child);
        let restarted = spawn_etcd(
            &self.binary,
            self.dir.path(),
            self.ip,
            self.client_port,
            self.peer_port,
        )
        .and_then(|mut child| {
            let ready = wait_etcd_ready(&mut child, self.ip, self.client_port);
            if ready.is_err() {
                kill(&mut child);
            }
            ready.map(|()| child)
        });
        match restarted {
            Ok(child) => self.child = child,
            Err(e) => panic!(
                "cannot restart the test etcd: {e}\netcd log:\n{}",
                self.log()
            ),
        }
    }

    /// What etcd has logged so far (all runs), for assertion messages.
    pub fn log(&self) -> String {
        read_etcd_log(self.dir.path())
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        kill(&mut self.child);
    }
}

fn spawn_etcd(
    binary: &PathBuf,
    dir: &std::path::Path,
    ip: Ipv4Addr,
    client_port: u16,
    peer_port: u16,
) -> Result<Child, String> {
    let log_path = dir.join("etcd.log");
    // Appended to, so that a restart keeps the log of the previous run.
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| format!("opening {}: {e}", log_path.display()))?;
    let log_err = log
        .try_clone()
        .map_err(|e| format!("opening {}: {e}", log_path.display()))?;
    let client_url = format!("http://{ip}:{client_port}");
    let peer_url = format!("http://{ip}:{peer_port}");
    let mut cmd = Command::new(binary);
    cmd.arg("--name")
        .arg("silt-test")
        .arg("--data-dir")
        .arg(dir.join("data"))
        .arg("--listen-client-urls")
        .arg(&client_url)
        .arg("--advertise-client-urls")
        .arg(&client_url)
        .arg("--listen-peer-urls")
        .arg(&peer_url)
        .arg("--initial-advertise-peer-urls")
        .arg(&peer_url)
        .arg("--initial-cluster")
        .arg(format!("silt-test={peer_url}"))
        .arg("--initial-cluster-state")
        .arg("new")
        .arg("--initial-cluster-token")
        .arg(format!("silt-test-{client_port}"))
        .arg("--logger")
        .arg("zap")
        .arg("--log-outputs")
        .arg("stderr")
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err);
    // Flags and ETCD_* variables may not both set an option (etcd refuses to start), and
    // other ETCD_* settings would change the server: start it from a clean slate.
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("ETCD_") {
            cmd.env_remove(&key);
        }
    }
    cmd.spawn()
        .map_err(|e| format!("running {}: {e}", binary.display()))
}

fn read_etcd_log(dir: &std::path::Path) -> String {
    std::fs::read_to_string(dir.join("etcd.log")).unwrap_or_default()
}

fn wait_etcd_ready(child: &mut Child, ip: Ipv4Addr, port: u16) -> Result<(), String> {
    let what = format!("report itself healthy on {ip}:{port}");
    wait_ready(child, "etcd", &what, || etcd_healthy(ip, port))
}

/// `GET /health` answers `{"health":"true"}` once the member has a leader and serves requests.
fn etcd_healthy(ip: Ipv4Addr, port: u16) -> bool {
    let addr = SocketAddr::from((ip, port));
    gcs::http_probe(addr, "/health", Duration::from_secs(2)).is_ok_and(|r| {
        r.status == 200 && String::from_utf8_lossy(&r.body).contains(r#""health":"true""#)
    })
}

/// The etcd binary: `$SILT_ETCD`, then `/usr/bin/etcd` (Debian's `etcd-server`), then `etcd`
/// on PATH.
pub fn etcd_path() -> Result<PathBuf, String> {
    find_tool(
        "SILT_ETCD",
        &[PathBuf::from("/usr/bin/etcd")],
        "etcd",
        "./scripts/install-deps.sh installs it: Debian package etcd-server",
    )
}

#[cfg(test)]
mod etcd_tests {
    use super::*;

    #[test]
    fn etcd_starts_restarts_and_cleans_up() {
        let mut etcd = Etcd::start();
        assert!(etcd.is_healthy(), "{}", etcd.log());
        assert!(etcd.endpoint().starts_with("http://127.0.0.1:"));
        let endpoint = etcd.endpoint();
        etcd.restart();
        assert_eq!(etcd.endpoint(), endpoint);
        assert!(etcd.is_healthy(), "{}", etcd.log());
        let dir = etcd.dir.path().to_path_buf();
        let (ip, port) = (etcd.ip, etcd.client_port);
        drop(etcd);
        assert!(!dir.exists(), "temporary directory removed");
        assert!(!etcd_healthy(ip, port), "process killed");
    }
}

/// Every file below `dir`, recursively (none if `dir` does not exist).
pub fn files_below(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_below(&p));
        } else {
            out.push(p);
        }
    }
    out
}
