//! Test support for Silt: [`S3Server`], a real S3-compatible server (versitygw, posix
//! backend) on a free loopback port, for tests that must talk to S3 for real.
//!
//! ```ignore
//! let server = silt_testkit::S3Server::start();
//! server.create_bucket("data");
//! let store = silt_ufs::open_store(&server.uri("data", ""), &server.s3_options()).await?;
//! ```

use std::fs::File;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use silt_ufs::S3Options;
use tempfile::TempDir;

const ACCESS_KEY: &str = "silt-test-access";
const SECRET_KEY: &str = "silt-test-secret-do-not-use";
/// How long a server may take to accept requests (a cold start under load is well below).
const READY_TIMEOUT: Duration = Duration::from_secs(30);
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
    port: u16,
    // Declared last: dropped after `Drop::drop` has killed the process that writes into it.
    dir: TempDir,
}

impl S3Server {
    /// Starts a server, panicking with the reason (and the server's log) if it cannot.
    pub fn start() -> S3Server {
        S3Server::try_start().unwrap_or_else(|e| panic!("cannot start the test S3 server: {e}"))
    }

    /// Starts a server and waits until it answers HTTP requests.
    pub fn try_start() -> Result<S3Server, String> {
        let binary = versitygw_path()?;
        let dir = tempfile::Builder::new()
            .prefix("silt-s3-")
            .tempdir()
            .map_err(|e| format!("creating a temporary directory: {e}"))?;
        let root = dir.path().join("root");
        std::fs::create_dir(&root).map_err(|e| format!("creating {}: {e}", root.display()))?;
        let mut last_error = String::new();
        for _ in 0..START_ATTEMPTS {
            let port = free_port()?;
            let log_path = dir.path().join("versitygw.log");
            let log = File::create(&log_path)
                .map_err(|e| format!("creating {}: {e}", log_path.display()))?;
            let log_err = log
                .try_clone()
                .map_err(|e| format!("opening {}: {e}", log_path.display()))?;
            let mut cmd = Command::new(&binary);
            cmd.arg("--access")
                .arg(ACCESS_KEY)
                .arg("--secret")
                .arg(SECRET_KEY)
                .arg("--port")
                .arg(format!("127.0.0.1:{port}"))
                .arg("posix")
                .arg(&root)
                .stdin(Stdio::null())
                .stdout(log)
                .stderr(log_err);
            // Flags win over VGW_* variables, but other VGW_* settings (event webhooks, …) could
            // still make the server talk to other hosts: start it from a clean slate.
            for (key, _) in std::env::vars_os() {
                if key.to_string_lossy().starts_with("VGW_") {
                    cmd.env_remove(&key);
                }
            }
            let mut child = cmd
                .spawn()
                .map_err(|e| format!("running {}: {e}", binary.display()))?;
            match wait_ready(&mut child, port) {
                Ok(()) => return Ok(S3Server { child, port, dir }),
                Err(e) => {
                    kill(&mut child);
                    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                    if !log.contains("address already in use") {
                        return Err(format!("{e}\nversitygw log:\n{log}"));
                    }
                    last_error = e;
                }
            }
        }
        Err(format!(
            "gave up after {START_ATTEMPTS} port collisions: {last_error}"
        ))
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn access_key(&self) -> &str {
        ACCESS_KEY
    }

    pub fn secret_key(&self) -> &str {
        SECRET_KEY
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
            access_key_id: ACCESS_KEY.to_string(),
            secret_access_key: SECRET_KEY.to_string(),
            timeout: Duration::from_secs(10),
            retries: 2,
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

fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

fn wait_ready(child: &mut Child, port: u16) -> Result<(), String> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("versitygw exited during start-up ({status})"));
        }
        if probe(port) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "versitygw did not answer on 127.0.0.1:{port} within {READY_TIMEOUT:?}"
            ));
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// A port that was free a moment ago (the kernel's choice for port 0).
fn free_port() -> Result<u16, String> {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("finding a free loopback port: {e}"))
}

/// Whether versitygw answers on the loopback port.
fn probe(port: u16) -> bool {
    silt_bench::env::versitygw_answers(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
}

/// The versitygw binary: `$SILT_VERSITYGW`, then `<workspace>/.deps/bin/versitygw`, then
/// `versitygw` on PATH (the lookup lives in `silt-bench`, which starts it too).
pub fn versitygw_path() -> Result<PathBuf, String> {
    silt_bench::env::versitygw_path().map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_answers_and_cleans_up() {
        let server = S3Server::start();
        assert!(probe(server.port()), "{}", server.log());
        server.create_bucket("b1");
        assert!(server.root().join("b1").is_dir());
        assert_eq!(server.uri("b1", "/x/"), "s3://b1/x");
        assert_eq!(server.s3_options().endpoint, server.endpoint());
        let dir = server.dir.path().to_path_buf();
        let port = server.port();
        drop(server);
        assert!(!dir.exists(), "temporary directory removed");
        assert!(!probe(port), "process killed");
    }
}
