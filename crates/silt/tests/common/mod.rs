//! Harness for integration tests: runs the real `silt` binary with real FUSE mounts and
//! cleans up (unmount, kill, remove temp dirs) also when a test fails.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use silt_testkit::S3Server;

pub const SILT: &str = env!("CARGO_BIN_EXE_silt");

/// The cluster secret test processes share, given through the environment (as a deployment
/// would) unless a test sets `SILT_CLUSTER_SECRET` itself or removes it.
pub const CLUSTER_SECRET: &str = "silt-test-cluster-secret-0123456789";

/// The key of [`CLUSTER_SECRET`], for tests that talk to workers themselves.
pub fn cluster_key() -> silt_cluster::ClusterKey {
    silt_cluster::ClusterKey::new(&silt_common::secret::Secret::new(CLUSTER_SECRET)).unwrap()
}

/// Gives `cmd` the test cluster's secret unless the test chose (or removed) one.
pub fn with_cluster_secret(cmd: &mut Command) -> &mut Command {
    if !cmd.get_envs().any(|(k, _)| k == "SILT_CLUSTER_SECRET") {
        cmd.env("SILT_CLUSTER_SECRET", CLUSTER_SECRET);
    }
    cmd
}

/// Runs `silt ARGS` to completion.
pub fn silt(args: &[&str]) -> Output {
    with_cluster_secret(Command::new(SILT).args(args))
        .env("SILT_LOG", "warn")
        .output()
        .expect("running silt")
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Whether `path` is a mount point now.
pub fn is_mounted(path: &Path) -> bool {
    let canon = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .any(|l| l.split(' ').nth(4) == Some(canon.to_string_lossy().as_ref()))
}

/// A running `silt up` (or `silt mount`, or `silt worker`) process with its mount.
pub struct Silt {
    child: Option<Child>,
    /// Empty for a worker (no mount).
    pub mountpoint: PathBuf,
    pub state_dir: PathBuf,
    log: PathBuf,
}

impl Silt {
    /// Starts silt with `args` (a role and its options; `--state-dir` and the mountpoint are the
    /// caller's) and waits until it serves its control socket, which it does only once mounted.
    pub fn start(args: &[String], mountpoint: &Path, state_dir: &Path) -> Result<Silt, String> {
        let mut cmd = Command::new(SILT);
        cmd.args(args);
        Silt::spawn(cmd, Some(mountpoint), state_dir)
    }

    /// Starts `cmd` (silt, or a wrapper that execs it, such as `nsenter` from
    /// `NetLab::command`) and waits until it serves; a role without a mount passes `None`.
    pub fn spawn(
        mut cmd: Command,
        mountpoint: Option<&Path>,
        state_dir: &Path,
    ) -> Result<Silt, String> {
        std::fs::create_dir_all(state_dir).unwrap();
        let log = state_dir.with_extension("log");
        let mut child = with_cluster_secret(&mut cmd)
            .env("SILT_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawning silt");
        // silt prints "silt: serving ..." once mounted and listening; a reader thread copies
        // stderr to the log and reports that line (or end of output, if silt exits first).
        let err = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let log_path = log.clone();
        std::thread::spawn(move || {
            use std::io::{BufRead, Write};
            let mut logf = std::fs::File::create(&log_path).unwrap();
            let mut ready_sent = false;
            for line in std::io::BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                let _ = writeln!(logf, "{line}");
                if !ready_sent && line.starts_with("silt: serving ") {
                    let _ = tx.send(true);
                    ready_sent = true;
                }
            }
            let _ = tx.send(false);
        });
        let mut s = Silt {
            child: Some(child),
            mountpoint: mountpoint.map(Path::to_path_buf).unwrap_or_default(),
            state_dir: state_dir.into(),
            log,
        };
        match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(true) => {
                assert!(
                    mountpoint.is_none_or(is_mounted),
                    "silt says it serves but nothing is mounted"
                );
                Ok(s)
            }
            Ok(false) | Err(_) => {
                let mut c = s.child.take().unwrap();
                let _ = c.kill();
                let status = c.wait().unwrap();
                Err(format!("silt did not come up ({status}): {}", s.log_text()))
            }
        }
    }

    /// `silt up` over the given mounts with extra options.
    pub fn up(mounts: &[(&str, &str)], extra: &[&str], dir: &Path) -> Result<Silt, String> {
        std::fs::create_dir_all(dir.join("mnt")).unwrap();
        Silt::up_again(mounts, extra, dir)
    }

    /// `silt up` again in `dir` (after a stop, or a crash: then it takes the mount over), as
    /// `up` without touching the mountpoint first: a mount whose daemon is gone blocks
    /// whoever looks at it until a daemon serves it. Panics if it does not come up.
    pub fn restart(mounts: &[(&str, &str)], extra: &[&str], dir: &Path) -> Silt {
        Silt::up_again(mounts, extra, dir).unwrap_or_else(|e| panic!("{e}"))
    }

    fn up_again(mounts: &[(&str, &str)], extra: &[&str], dir: &Path) -> Result<Silt, String> {
        let mp = dir.join("mnt");
        let state = dir.join("state");
        let mut args: Vec<String> = vec![
            "up".into(),
            "--mountpoint".into(),
            mp.display().to_string(),
            "--state-dir".into(),
            state.display().to_string(),
        ];
        for (path, uri) in mounts {
            args.push("--mount".into());
            args.push(format!("{path}={uri}"));
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        Silt::start(&args, &mp, &state)
    }

    /// `silt up` with `/data` = `uri`, the options `args` that reach its store (as from
    /// [`s3_args`]) and `extra`; panics if it does not come up.
    pub fn up_data(uri: &str, args: Vec<String>, extra: &[&str], dir: &Path) -> Silt {
        let mut args = args;
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Silt::up(&[("/data", uri)], &args, dir).unwrap_or_else(|e| panic!("{e}"))
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn report(&self) -> serde_json::Value {
        let o = silt(&[
            "report",
            "--json",
            "--state-dir",
            self.state_dir.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "report failed: {}", stderr(&o));
        serde_json::from_slice(&o.stdout).expect("report JSON")
    }

    /// One counter of `silt report --json` (every metric is always there).
    pub fn metric(&self, name: &str) -> u64 {
        let r = self.report();
        r["metrics"][name]
            .as_u64()
            .unwrap_or_else(|| panic!("no metric {name} in the report: {r}"))
    }

    pub fn cli(&self, args: &[&str]) -> Output {
        let mut a: Vec<&str> = args.to_vec();
        a.extend(["--state-dir", self.state_dir.to_str().unwrap()]);
        silt(&a)
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.mountpoint.join(rel.trim_start_matches('/'))
    }

    /// Stops cleanly (`silt down`) and checks the exit status and that nothing stays mounted.
    pub fn stop(mut self) {
        let o = self.cli(&["down"]);
        assert!(o.status.success(), "silt down failed: {}", stderr(&o));
        let status = self.child.take().unwrap().wait().unwrap();
        let log = self.log_text();
        assert!(status.success(), "silt exited with {status}: {log}");
        assert!(!log.contains("panicked"), "silt panicked: {log}");
        assert!(
            self.mountpoint.as_os_str().is_empty() || !is_mounted(&self.mountpoint),
            "mount left behind"
        );
    }

    /// SIGKILL of the daemon (a crash), keeping this guard, so the mount is still cleaned up
    /// when the test ends.
    pub fn crash(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Waits for the daemon to exit by itself (e.g. after handing its mount over).
    pub fn wait_exit(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .take()
            .map(|mut c| c.wait().expect("waiting for silt"))
    }

    /// The daemon's process id (while it runs).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL: no clean-up by silt itself (a crash).
    pub fn kill(mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Silt {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        // The process keeping the mount's FUSE connection alive across daemons: without it
        // (and the daemon) the connection ends, so nothing waits on the mount any more.
        if let Some(pid) = std::fs::read_to_string(self.state_dir.join("fuse-holder.pid"))
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
            .filter(|p| *p > 1)
        {
            // SAFETY: plain kill(2) of the holder this test's silt started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        if !self.mountpoint.as_os_str().is_empty() && is_mounted(&self.mountpoint) {
            let _ = Command::new("fusermount3")
                .arg("-uz")
                .arg(&self.mountpoint)
                .status();
        }
    }
}

/// Deterministic pseudo-random bytes.
pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut v = vec![0u8; len];
    rng.fill(&mut v[..]);
    v
}

/// The sizes the differential tests use: empty, tiny, page boundaries and multi-page files.
pub const SIZES: &[usize] = &[
    0,
    1,
    4095,
    4096,
    (1 << 20) - 1,
    1 << 20,
    (1 << 20) + 1,
    3 * (1 << 20) + 12345,
    9 * (1 << 20),
];

/// A dataset of files (relative path, bytes).
pub fn dataset() -> Vec<(String, Vec<u8>)> {
    SIZES
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let dir = ["a", "b/c", "b"][i % 3];
            (format!("{dir}/f{i}.bin"), bytes(i as u64 + 1, n))
        })
        .collect()
}

pub fn write_local(root: &Path, files: &[(String, Vec<u8>)]) {
    for (p, b) in files {
        let path = root.join(p);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, b).unwrap();
    }
}

/// The options that let silt reach `s3` (its endpoint and credentials).
pub fn s3_args(s3: &S3Server) -> Vec<String> {
    s3_args_via(&s3.endpoint(), s3)
}

/// The options that let silt reach `s3` through `endpoint` (a proxy in front of it).
pub fn s3_args_via(endpoint: &str, s3: &S3Server) -> Vec<String> {
    [
        "--s3-endpoint",
        endpoint,
        "--s3-access-key-id",
        s3.access_key(),
        "--s3-secret-access-key",
        s3.secret_key(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Bucket and prefix of [`S3Fx`]'s store.
pub const BUCKET: &str = "silt-test";
pub const PREFIX: &str = "ds";

/// A real S3 server, optionally behind a counting / fault-injecting proxy, and a store that
/// reads and writes the server directly (behind Silt's back). Test files add their own
/// helpers in `impl S3Fx` blocks.
pub struct S3Fx {
    /// Declared first: dropped (its connections closed) before the server is killed.
    pub proxy: Option<silt_testkit::S3Proxy>,
    pub server: S3Server,
    pub rt: tokio::runtime::Runtime,
    pub store: silt_ufs::DynStore,
}

impl S3Fx {
    pub fn start(with_proxy: bool) -> S3Fx {
        let server = S3Server::start();
        server.create_bucket(BUCKET);
        let proxy = with_proxy.then(|| {
            let upstream = std::net::SocketAddr::from(([127, 0, 0, 1], server.port()));
            silt_testkit::S3Proxy::start(upstream).expect("starting the S3 proxy")
        });
        let rt = tokio::runtime::Runtime::new().unwrap();
        let store = rt
            .block_on(silt_ufs::open_store(
                &server.uri(BUCKET, PREFIX),
                &server.s3_options(),
            ))
            .unwrap();
        S3Fx {
            proxy,
            server,
            rt,
            store,
        }
    }

    pub fn uri(&self) -> String {
        self.server.uri(BUCKET, PREFIX)
    }

    /// `silt up` with `/data` = this store (through the proxy, if there is one) and `extra`
    /// options.
    pub fn up(&self, extra: &[&str], dir: &Path) -> Silt {
        let args = match &self.proxy {
            Some(p) => s3_args_via(&p.endpoint(), &self.server),
            None => s3_args(&self.server),
        };
        Silt::up_data(&self.uri(), args, extra, dir)
    }

    /// An out-of-band write of `path`.
    pub fn put(&self, path: &str, data: &[u8]) {
        self.rt
            .block_on(self.store.write(path, bytes::Bytes::copy_from_slice(data)))
            .unwrap_or_else(|e| panic!("out-of-band write {path}: {e}"));
    }
}

/// An unsigned `GET path` over HTTP/1.1 to `addr` (a gateway serving `--anonymous`): the
/// status and the body, read in pieces with `on_piece(bytes so far)` called after each.
/// Plain `std` sockets, so tests can run hundreds at once and watch a body arrive.
pub fn raw_get(
    stream: &mut std::net::TcpStream,
    host: &str,
    path: &str,
    mut on_piece: impl FnMut(u64),
) -> std::io::Result<(u16, Vec<u8>)> {
    use std::io::{BufRead, BufReader, Read, Write};
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )?;
    let mut r = BufReader::new(stream);
    let mut status_line = String::new();
    r.read_line(&mut status_line)?;
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line {status_line:?}")))?;
    let mut len = None;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line)? == 0 {
            return Err(std::io::Error::other("headers cut off"));
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                len = v.trim().parse::<usize>().ok();
            }
        }
    }
    let len = len.ok_or_else(|| std::io::Error::other("no Content-Length"))?;
    let mut body = vec![0u8; len];
    let mut got = 0;
    while got < len {
        let n = r.read(&mut body[got..(got + (256 << 10)).min(len)])?;
        if n == 0 {
            return Err(std::io::Error::other(format!(
                "body cut off at {got} of {len}"
            )));
        }
        got += n;
        on_piece(got as u64);
    }
    Ok((status, body))
}

/// `n` loopback ports free a moment ago (for a static worker list a test names up front).
pub fn free_ports(n: usize) -> Vec<u16> {
    (0..n)
        .map(|_| {
            std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .unwrap()
        })
        .collect()
}

/// A plain HTTP/1.1 request over a `std` socket: status, headers (lower-case names), body.
pub fn http(
    addr: &str,
    method: &str,
    path: &str,
) -> (u16, std::collections::HashMap<String, String>, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connecting to the endpoint");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("reading the response");
    let text = String::from_utf8(raw).expect("a UTF-8 response");
    let (head, body) = text.split_once("\r\n\r\n").expect("a response head");
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (status, headers, body.to_string())
}

/// A tmpfs mounted for the test, unmounted when dropped.
pub struct Tmpfs(pub PathBuf);

impl Tmpfs {
    /// `opts`: tmpfs mount options (`size=...`, `nr_inodes=...`).
    pub fn mount(dir: &Path, opts: &str) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("{opts},mode=0700"), "tmpfs"])
            .arg(dir)
            .status()
            .expect("running mount");
        assert!(st.success(), "mounting a tmpfs at {} failed", dir.display());
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let ok = Command::new("umount")
            .arg(&self.0)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

/// The address a gateway printed (`... at http://HOST:PORT ...`, or https).
pub fn endpoint_in(log: &str, marker: &str) -> String {
    let line = log
        .lines()
        .find(|l| l.starts_with(marker))
        .unwrap_or_else(|| panic!("no {marker:?} line in the log:\n{log}"));
    let at = line.find("http").expect("an address");
    line[at..]
        .split_whitespace()
        .next()
        .unwrap()
        .trim_end_matches(['(', ')', ';', ','])
        .to_string()
}

/// A program of one of the project's virtual environments (`.deps/pyvenv`, `.deps/s3venv`,
/// made by scripts/install-deps.sh): `venv("pyvenv", "python")`.
pub fn venv(which: &str, bin: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../.deps")
        .join(which)
        .join("bin")
        .join(bin)
}
