//! [`MiniHdfs`]: a real HDFS (Hadoop's MiniDFSCluster: one namenode, one datanode, WebHDFS on)
//! bound to `127.0.0.1`, run by the launcher in scripts/hdfs-launcher/MiniHdfs.java.
//!
//! Start-up takes 10–30 s, so tests that only need some HDFS share one per test process:
//!
//! ```ignore
//! let hdfs = silt_testkit::MiniHdfs::shared();
//! hdfs.mkdirs("/my-test");
//! // WebHDFS at hdfs.webhdfs_endpoint(), native RPC at hdfs.namenode()
//! ```

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{mpsc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::gcs::{deps_dir, http_request};
use crate::kill;

/// A JVM starting a namenode and a datanode on a loaded 2-core machine is slow.
const HDFS_READY_TIMEOUT: Duration = Duration::from_secs(120);
/// The launcher's orderly shutdown takes about a second; past this it is killed.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(20);
const POLL_INTERVAL: Duration = Duration::from_millis(50);
const LOG: &str = "minihdfs.log";
/// The Hadoop release scripts/install-deps.sh fetches (its HADOOP_VERSION).
const HADOOP_VERSION: &str = "3.5.0";

/// A running single-datanode HDFS with WebHDFS, its data in a fresh temporary directory.
///
/// Ports are picked by the launcher's own kernel calls (port 0), so clusters never collide.
/// Permission checks are off: WebHDFS requests may come as any user (`dr.who` by default).
/// Dropping it closes the launcher's stdin, which shuts the cluster down and deletes the
/// directory; a launcher still alive after [`SHUTDOWN_TIMEOUT`] is killed. This happens also
/// when a test panics, and when the test process dies (its end of the pipe closes).
pub struct MiniHdfs {
    child: Child,
    /// Commands to the launcher (`safemode ...`); its end stops the cluster.
    stdin: Mutex<Option<ChildStdin>>,
    /// The launcher's answers, a line each.
    answers: Mutex<mpsc::Receiver<String>>,
    rpc_port: u16,
    http_port: u16,
    // Declared last: dropped after `Drop::drop` has stopped the process that writes into it.
    dir: TempDir,
}

impl MiniHdfs {
    /// Starts a cluster, panicking with the reason (and the end of its log) if it cannot.
    pub fn start() -> MiniHdfs {
        MiniHdfs::try_start().unwrap_or_else(|e| panic!("cannot start MiniHdfs: {e}"))
    }

    /// One cluster for the whole test process, started by the first caller. It is never
    /// dropped: it lives until the process exits, when the closing pipe stops it and the
    /// launcher deletes its directory. Tests sharing it should work below their own directory.
    /// A failed start is remembered and reported to every caller, not retried.
    pub fn shared() -> &'static MiniHdfs {
        static SHARED: OnceLock<Result<MiniHdfs, String>> = OnceLock::new();
        match SHARED.get_or_init(MiniHdfs::try_start) {
            Ok(hdfs) => hdfs,
            Err(e) => panic!("cannot start the shared MiniHdfs: {e}"),
        }
    }

    /// Starts a cluster and waits (up to two minutes) until the launcher reports it ready.
    pub fn try_start() -> Result<MiniHdfs, String> {
        let home = hdfs_home()?;
        let dir = tempfile::Builder::new()
            .prefix("silt-hdfs-")
            .tempdir()
            .map_err(|e| format!("creating a temporary directory: {e}"))?;
        let log_path = dir.path().join(LOG);
        let log =
            File::create(&log_path).map_err(|e| format!("creating {}: {e}", log_path.display()))?;
        let java = java_path();
        let classpath = format!(
            "{}:{}/*",
            home.join("classes").display(),
            home.join("lib").display()
        );
        let mut cmd = Command::new(&java);
        // Quick start over peak speed; no perf-data file in /tmp. preferIPv4Stack: `localhost`
        // in the addresses Hadoop hands around must mean 127.0.0.1, where everything listens.
        cmd.args(["-Xmx1g", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"])
            .args(["-XX:-UsePerfData", "-Djava.net.preferIPv4Stack=true"])
            .arg("-cp")
            .arg(&classpath)
            .arg("MiniHdfs")
            .arg(dir.path())
            .current_dir(dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log);
        // HADOOP_USER_NAME, HADOOP_CONF_DIR and the like would change who the cluster runs as
        // or what it loads: start it from a clean slate.
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("HADOOP_") {
                cmd.env_remove(&key);
            }
        }
        let mut child = cmd.spawn().map_err(|e| {
            format!(
                "running {}: {e} (a Java runtime is needed: ./scripts/install-deps.sh)",
                java.display()
            )
        })?;
        let stdin = Mutex::new(child.stdin.take());
        match wait_for_ready(&mut child) {
            Ok((rpc_port, http_port, answers)) => Ok(MiniHdfs {
                child,
                stdin,
                answers: Mutex::new(answers),
                rpc_port,
                http_port,
                dir,
            }),
            Err(e) => {
                kill(&mut child);
                Err(format!("{e}\nMiniHdfs log (end):\n{}", log_tail(&log_path)))
            }
        }
    }

    /// `http://127.0.0.1:PORT`, the namenode's HTTP server (WebHDFS under `/webhdfs/v1`).
    pub fn webhdfs_endpoint(&self) -> String {
        format!("http://{}", self.http_addr())
    }

    pub fn http_addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.http_port))
    }

    /// `127.0.0.1:PORT`, the namenode's RPC address (`hdfs://` + this is `fs.defaultFS`).
    pub fn namenode(&self) -> String {
        format!("{}:{}", Ipv4Addr::LOCALHOST, self.rpc_port)
    }

    /// Creates a directory and its missing parents, panicking with the reason if it cannot.
    pub fn mkdirs(&self, path: &str) {
        self.try_mkdirs(path)
            .unwrap_or_else(|e| panic!("creating HDFS directory {path}: {e}"));
    }

    /// Creates a directory and its missing parents (WebHDFS `MKDIRS`).
    pub fn try_mkdirs(&self, path: &str) -> Result<(), String> {
        let target = format!("/webhdfs/v1{}?op=MKDIRS", webhdfs_path(path));
        let r = http_request(self.http_addr(), "PUT", &target, &[], b"")?;
        if r.status == 200 && r.body_text().contains("true") {
            Ok(())
        } else {
            Err(format!("HTTP {}: {}", r.status, r.body_text()))
        }
    }

    /// Puts the namenode into safe mode (`on`: it refuses every change, as while it starts
    /// or when an operator asks) or takes it out, and returns once the launcher says so.
    pub fn set_safe_mode(&self, on: bool) -> Result<(), String> {
        let (command, want) = if on {
            ("safemode enter\n", "SAFEMODE on")
        } else {
            ("safemode leave\n", "SAFEMODE off")
        };
        {
            let mut stdin = self.stdin.lock().map_err(|_| "a poisoned lock")?;
            let pipe = stdin.as_mut().ok_or("the launcher's stdin is closed")?;
            pipe.write_all(command.as_bytes())
                .and_then(|()| pipe.flush())
                .map_err(|e| format!("writing to the launcher: {e}"))?;
        }
        let answers = self.answers.lock().map_err(|_| "a poisoned lock")?;
        match answers.recv_timeout(HDFS_READY_TIMEOUT) {
            Ok(line) if line == want => Ok(()),
            Ok(line) => Err(format!("the launcher answered {line:?}")),
            Err(e) => Err(format!("no answer from the launcher: {e}")),
        }
    }

    /// What the cluster has logged so far (for assertion messages; Hadoop logs a lot).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join(LOG)).unwrap_or_default()
    }
}

impl Drop for MiniHdfs {
    fn drop(&mut self) {
        // End of stdin is the launcher's signal to shut down and delete its directory.
        drop(self.stdin.get_mut().ok().and_then(Option::take));
        let deadline = Instant::now() + SHUTDOWN_TIMEOUT;
        while Instant::now() < deadline && matches!(self.child.try_wait(), Ok(None)) {
            std::thread::sleep(POLL_INTERVAL);
        }
        kill(&mut self.child);
    }
}

/// The namenode's RPC and HTTP ports, and the lines the launcher writes after its READY.
type Ready = (u16, u16, mpsc::Receiver<String>);

/// Reads the launcher's stdout until its `READY rpc=PORT http=PORT` line, failing if the
/// launcher exits first or takes longer than [`HDFS_READY_TIMEOUT`].
fn wait_for_ready(child: &mut Child) -> Result<Ready, String> {
    let stdout = child
        .stdout
        .take()
        .ok_or("the launcher has no stdout pipe")?;
    let (tx, rx) = mpsc::channel();
    // Reads on after READY until the launcher exits, so it never blocks on a full pipe: its
    // answers to commands, passed on.
    std::thread::Builder::new()
        .name("minihdfs-stdout".to_string())
        .spawn(move || {
            let mut lines = BufReader::new(stdout).lines().map_while(Result::ok);
            if let Some(ready) = lines.by_ref().find(|l| l.starts_with("READY ")) {
                let _ = tx.send(ready);
            }
            for line in lines {
                let _ = tx.send(line);
            }
        })
        .map_err(|e| format!("starting a thread: {e}"))?;
    let deadline = Instant::now() + HDFS_READY_TIMEOUT;
    loop {
        match rx.recv_timeout(POLL_INTERVAL) {
            Ok(line) => {
                let (rpc, http) =
                    parse_ready(&line).ok_or(format!("unexpected launcher output {line:?}"))?;
                return Ok((rpc, http, rx));
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            // Stdout closed without READY: the launcher is exiting; the checks below see it.
            Err(mpsc::RecvTimeoutError::Disconnected) => {}
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!(
                "the MiniHdfs launcher exited during start-up ({status})"
            ));
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "the MiniHdfs launcher did not report READY within {HDFS_READY_TIMEOUT:?}"
            ));
        }
    }
}

/// `READY rpc=PORT http=PORT` → the two ports.
fn parse_ready(line: &str) -> Option<(u16, u16)> {
    let mut rest = line.strip_prefix("READY ")?.split_whitespace();
    let rpc = rest.next()?.strip_prefix("rpc=")?.parse().ok()?;
    let http = rest.next()?.strip_prefix("http=")?.parse().ok()?;
    Some((rpc, http))
}

/// `path` as a WebHDFS URL path: absolute, bytes other than unreserved ones and `/`
/// percent-encoded.
fn webhdfs_path(path: &str) -> String {
    let mut out = String::from("/");
    for b in path.trim_start_matches('/').bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The last lines of the log: Hadoop logs thousands of lines, the reason for a failure last.
fn log_tail(path: &std::path::Path) -> String {
    let log = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(80)..].join("\n")
}

/// `$JAVA_HOME/bin/java` where set, else `java` on PATH.
fn java_path() -> PathBuf {
    std::env::var_os("JAVA_HOME")
        .map(|home| PathBuf::from(home).join("bin/java"))
        .filter(|java| java.is_file())
        .unwrap_or_else(|| PathBuf::from("java"))
}

/// The launcher's directory (`classes/` with MiniHdfs.class, `lib/` with Hadoop's jars):
/// `$SILT_HDFS_HOME`, else `<workspace>/.deps/hdfs`.
pub fn hdfs_home() -> Result<PathBuf, String> {
    let home = std::env::var_os("SILT_HDFS_HOME")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| deps_dir().join("hdfs"));
    let class = home.join("classes/MiniHdfs.class");
    let jar = home.join(format!(
        "lib/hadoop-client-minicluster-{HADOOP_VERSION}.jar"
    ));
    if class.is_file() && jar.is_file() {
        Ok(home)
    } else {
        Err(format!(
            "the MiniHdfs launcher is not installed ({} or {} is missing; the directory is \
             $SILT_HDFS_HOME or <workspace>/.deps/hdfs); run ./scripts/install-deps.sh to fetch \
             Hadoop and compile it",
            class.display(),
            jar.display()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gcs::HttpResponse;

    /// Follows a WebHDFS redirect (namenode → datanode), which must stay on 127.0.0.1.
    fn follow(r: &HttpResponse, method: &str, body: &[u8]) -> HttpResponse {
        assert_eq!(r.status, 307, "{}", r.body_text());
        let location = r.header("Location").expect("a redirect has a Location");
        let rest = location
            .strip_prefix("http://127.0.0.1:")
            .unwrap_or_else(|| panic!("redirect off loopback: {location}"));
        let (port, target) = rest.split_at(rest.find('/').expect("a path"));
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port.parse::<u16>().expect("a port")));
        http_request(addr, method, target, &[], body).expect("the datanode answers")
    }

    #[test]
    fn starts_answers_and_cleans_up() {
        let hdfs = MiniHdfs::start();
        assert!(hdfs.webhdfs_endpoint().starts_with("http://127.0.0.1:"));
        assert!(hdfs.namenode().starts_with("127.0.0.1:"));
        hdfs.mkdirs("/t1/sub");
        let nn = hdfs.http_addr();
        let create = http_request(
            nn,
            "PUT",
            "/webhdfs/v1/t1/sub/hello.txt?op=CREATE",
            &[],
            b"",
        )
        .expect("the namenode answers");
        let created = follow(&create, "PUT", b"hello hdfs");
        assert_eq!(created.status, 201, "{}", created.body_text());
        let open = http_request(nn, "GET", "/webhdfs/v1/t1/sub/hello.txt?op=OPEN", &[], b"")
            .expect("the namenode answers");
        let read = follow(&open, "GET", b"");
        assert_eq!(read.status, 200, "{}", read.body_text());
        assert_eq!(read.body, b"hello hdfs");
        let list = http_request(nn, "GET", "/webhdfs/v1/t1/sub?op=LISTSTATUS", &[], b"")
            .expect("the namenode answers");
        assert_eq!(list.status, 200, "{}", list.body_text());
        assert!(
            list.body_text().contains("\"hello.txt\""),
            "{}",
            list.body_text()
        );
        let dir = hdfs.dir.path().to_path_buf();
        drop(hdfs);
        assert!(!dir.exists(), "temporary directory removed");
        assert!(
            http_request(nn, "GET", "/", &[], b"").is_err(),
            "process gone"
        );
    }

    #[test]
    fn shared_is_one_cluster() {
        let hdfs = MiniHdfs::shared();
        assert!(std::ptr::eq(hdfs, MiniHdfs::shared()));
        hdfs.mkdirs("/shared-test");
        let list = http_request(
            hdfs.http_addr(),
            "GET",
            "/webhdfs/v1/?op=LISTSTATUS",
            &[],
            b"",
        )
        .expect("the namenode answers");
        assert!(
            list.body_text().contains("\"shared-test\""),
            "{}",
            list.body_text()
        );
    }

    #[test]
    fn parses_ready_and_paths() {
        assert_eq!(parse_ready("READY rpc=1 http=2"), Some((1, 2)));
        assert_eq!(parse_ready("READY rpc=1"), None);
        assert_eq!(webhdfs_path("a b/c%"), "/a%20b/c%25");
    }
}
