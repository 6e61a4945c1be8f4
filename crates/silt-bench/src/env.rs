//! Set-up and tear-down of one benchmark environment (see the crate docs).

use std::fs::File;
use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::Profile;

/// Where environments record their state: `<RUN_ROOT>/<id>/state.json`.
pub const RUN_ROOT: &str = "/run/silt-bench";
/// Port of the S3 endpoint on the namespace's veth address.
pub const PORT: u16 = 9000;
/// Port of versitygw on the namespace's loopback when the proxy is in front of it.
const SERVER_PORT: u16 = 9001;
const ACCESS_KEY: &str = "silt-bench-access";
const SECRET_KEY: &str = "silt-bench-secret-do-not-use";
const READY_TIMEOUT: Duration = Duration::from_secs(30);
const POLL_INTERVAL: Duration = Duration::from_millis(20);
/// How long a process gets to exit after SIGTERM (then SIGKILL).
const TERM_TIMEOUT: Duration = Duration::from_secs(5);
const STATE_FILE: &str = "state.json";

/// How to bring an environment up; [`UpOptions::new`] has the defaults.
#[derive(Clone, Debug)]
pub struct UpOptions {
    /// Instance id, 0–255: names and addresses derive from it, so instances can coexist.
    pub id: u8,
    pub profile: Profile,
    /// Served directory (top-level directories are buckets); `None`: `<run dir>/data`,
    /// removed by tear-down. A given directory is created if missing and never removed.
    pub data_dir: Option<PathBuf>,
    /// The `silt-bench` binary, run in its hidden `proxy` mode; `None`: `$SILT_BENCH_EXE`, then
    /// the current executable (right when the caller is `silt-bench` itself).
    pub exe: Option<PathBuf>,
    /// The versitygw binary; `None`: `$SILT_VERSITYGW`, `<workspace>/.deps/bin/versitygw`,
    /// then `PATH`.
    pub versitygw: Option<PathBuf>,
}

impl UpOptions {
    pub fn new(id: u8, profile: Profile) -> UpOptions {
        UpOptions {
            id,
            profile,
            data_dir: None,
            exe: None,
            versitygw: None,
        }
    }
}

/// A process the environment started, as recorded in the state file.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct ProcRecord {
    name: String,
    pid: i32,
    /// Its command line after `ip netns exec` has exec'd it.
    argv: Vec<String>,
    /// Its command line before that (`ip netns exec NS …`).
    launcher_argv: Vec<String>,
}

/// A qdisc the environment installed (`netns: None`: on the host).
#[derive(Clone, Debug, Serialize, Deserialize)]
struct QdiscRecord {
    netns: Option<String>,
    dev: String,
}

/// Everything an environment made, written before (names) or right after (pids) it is made.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct State {
    id: u8,
    netns: String,
    host_if: String,
    ns_if: String,
    endpoint: String,
    profile: Profile,
    data_dir: PathBuf,
    owns_data_dir: bool,
    qdiscs: Vec<QdiscRecord>,
    procs: Vec<ProcRecord>,
}

/// A running environment. Dropping it tears it down unless [`Env::detach`] was called.
pub struct Env {
    state: State,
    children: Vec<Child>,
    detached: bool,
}

/// Names and addresses of instance `id`.
pub fn netns_name(id: u8) -> String {
    format!("silt-bench-{id}")
}
pub fn host_if(id: u8) -> String {
    format!("sbv{id}h")
}
pub fn ns_if(id: u8) -> String {
    format!("sbv{id}n")
}
pub fn host_addr(id: u8) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, id, 1)
}
pub fn ns_addr(id: u8) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, id, 2)
}
pub fn run_dir(id: u8) -> PathBuf {
    Path::new(RUN_ROOT).join(id.to_string())
}

impl Env {
    /// [`Env::up_with`] with default options.
    pub fn up(id: u8, profile: Profile, data_dir: Option<&Path>) -> Result<Env> {
        let mut opts = UpOptions::new(id, profile);
        opts.data_dir = data_dir.map(Path::to_path_buf);
        Env::up_with(opts)
    }

    /// Tears down any previous instance `opts.id`, then creates the namespace, veth pair,
    /// addresses, qdiscs and processes, and waits until S3 answers through the veth pair.
    /// On failure, everything made so far is removed again.
    pub fn up_with(opts: UpOptions) -> Result<Env> {
        let tools = Tools::find(&opts)?;
        Env::down(opts.id).context("removing the previous instance")?;
        let id = opts.id;
        let run = run_dir(id);
        let (data_dir, owns_data_dir) = match &opts.data_dir {
            Some(d) => (d.clone(), false),
            None => (run.join("data"), true),
        };
        let mut env = Env {
            state: State {
                id,
                netns: netns_name(id),
                host_if: host_if(id),
                ns_if: ns_if(id),
                endpoint: format!("http://{}:{PORT}", ns_addr(id)),
                profile: opts.profile.clone(),
                data_dir,
                owns_data_dir,
                qdiscs: Vec::new(),
                procs: Vec::new(),
            },
            children: Vec::new(),
            detached: false,
        };
        std::fs::create_dir_all(&run).with_context(|| format!("creating {}", run.display()))?;
        // From here on, an error return drops `env`, which tears down what exists.
        env.save()?;
        env.build(&tools)?;
        Ok(env)
    }

    fn build(&mut self, tools: &Tools) -> Result<()> {
        let s = self.state.clone();
        let id = s.id;
        std::fs::create_dir_all(&s.data_dir)
            .with_context(|| format!("creating {}", s.data_dir.display()))?;
        ip(&["netns", "add", &s.netns])?;
        ip(&[
            "link", "add", &s.host_if, "type", "veth", "peer", "name", &s.ns_if, "netns", &s.netns,
        ])?;
        // No IPv6 link-local addresses: nothing but our IPv4 traffic on the pair.
        let _ = ip(&["link", "set", &s.host_if, "addrgenmode", "none"]);
        let _ = ip(&[
            "-n",
            &s.netns,
            "link",
            "set",
            &s.ns_if,
            "addrgenmode",
            "none",
        ]);
        ip(&[
            "addr",
            "add",
            &format!("{}/30", host_addr(id)),
            "dev",
            &s.host_if,
        ])?;
        ip(&[
            "-n",
            &s.netns,
            "addr",
            "add",
            &format!("{}/30", ns_addr(id)),
            "dev",
            &s.ns_if,
        ])?;
        ip(&["-n", &s.netns, "link", "set", "lo", "up"])?;
        ip(&["-n", &s.netns, "link", "set", &s.ns_if, "up"])?;
        ip(&["link", "set", &s.host_if, "up"])?;

        if let Some(rate) = s.profile.aggregate_rate {
            let tc_path = tools
                .tc
                .as_ref()
                .ok_or_else(|| anyhow!("`tc` not found (needed for --aggregate-rate)"))?;
            for (netns, dev) in [(None, &s.host_if), (Some(&s.netns), &s.ns_if)] {
                self.state.qdiscs.push(QdiscRecord {
                    netns: netns.cloned(),
                    dev: dev.clone(),
                });
                self.save()?;
                let tbf = tbf_args(dev, rate);
                let tbf: Vec<&str> = tbf.iter().map(String::as_str).collect();
                run_tc(tc_path, netns.map(String::as_str), &tbf)?;
            }
        }

        let run = run_dir(id);
        let data = s.data_dir.to_string_lossy().into_owned();
        let vgw = tools.versitygw.to_string_lossy().into_owned();
        let shaped = s.profile.needs_proxy();
        let server_listen = if shaped {
            format!("127.0.0.1:{SERVER_PORT}")
        } else {
            format!("{}:{PORT}", ns_addr(id))
        };
        let argv = vec![
            vgw,
            "--access".into(),
            ACCESS_KEY.into(),
            "--secret".into(),
            SECRET_KEY.into(),
            "--port".into(),
            server_listen,
            "posix".into(),
            data,
        ];
        self.spawn_in_ns("versitygw", argv, &run.join("versitygw.log"))?;
        if shaped {
            let exe = tools
                .exe
                .as_ref()
                .ok_or_else(|| anyhow!("no silt-bench executable for the proxy"))?;
            let argv = vec![
                exe.to_string_lossy().into_owned(),
                "proxy".into(),
                "--listen".into(),
                format!("{}:{PORT}", ns_addr(id)),
                "--upstream".into(),
                format!("127.0.0.1:{SERVER_PORT}"),
                "--delay-us".into(),
                (s.profile.rtt.as_micros() / 2).to_string(),
                "--rate".into(),
                s.profile.per_conn_rate.unwrap_or(0).to_string(),
            ];
            self.spawn_in_ns("proxy", argv, &run.join("proxy.log"))?;
        }
        self.wait_ready()
    }

    /// Starts `argv` in the namespace (`ip netns exec`, which execs it under the same pid),
    /// in its own process group (a terminal's Ctrl-C does not reach it), logging to `log`.
    fn spawn_in_ns(&mut self, name: &str, argv: Vec<String>, log: &Path) -> Result<()> {
        let ip_path = which("ip").ok_or_else(|| anyhow!("`ip` not found"))?;
        let mut launcher_argv = vec![
            ip_path.to_string_lossy().into_owned(),
            "netns".into(),
            "exec".into(),
            self.state.netns.clone(),
        ];
        launcher_argv.extend(argv.iter().cloned());
        let out = File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone()?;
        let mut cmd = Command::new(&ip_path);
        cmd.args(&launcher_argv[1..])
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        // Flags win over VGW_* variables, but other VGW_* settings (webhooks, …) could make the
        // server talk to other hosts: start it from a clean slate.
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("VGW_") {
                cmd.env_remove(&key);
            }
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {name} ({})", argv.join(" ")))?;
        let pid = i32::try_from(child.id()).context("pid out of range")?;
        self.children.push(child);
        self.state.procs.push(ProcRecord {
            name: name.to_string(),
            pid,
            argv,
            launcher_argv,
        });
        self.save()
    }

    fn wait_ready(&mut self) -> Result<()> {
        let addr = SocketAddr::from((ns_addr(self.state.id), PORT));
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            for (child, rec) in self.children.iter_mut().zip(&self.state.procs) {
                if let Ok(Some(status)) = child.try_wait() {
                    let log = read_log(&run_dir(self.state.id).join(format!("{}.log", rec.name)));
                    bail!(
                        "{} exited during start-up ({status}); log:\n{log}",
                        rec.name
                    );
                }
            }
            if silt_testkit::versitygw_answers(addr) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!("S3 did not answer on {addr} within {READY_TIMEOUT:?}");
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }

    fn save(&self) -> Result<()> {
        let dir = run_dir(self.state.id);
        let tmp = dir.join(format!("{STATE_FILE}.tmp"));
        let json = serde_json::to_vec_pretty(&self.state)?;
        let mut f = File::create(&tmp).with_context(|| format!("writing {}", tmp.display()))?;
        f.write_all(&json)?;
        f.sync_all()?;
        std::fs::rename(&tmp, dir.join(STATE_FILE))
            .with_context(|| format!("writing {}", dir.join(STATE_FILE).display()))?;
        Ok(())
    }

    /// `http://198.18.<id>.2:9000`.
    pub fn endpoint(&self) -> &str {
        &self.state.endpoint
    }
    pub fn access_key(&self) -> &str {
        ACCESS_KEY
    }
    pub fn secret_key(&self) -> &str {
        SECRET_KEY
    }
    pub fn id(&self) -> u8 {
        self.state.id
    }
    pub fn profile(&self) -> &Profile {
        &self.state.profile
    }
    /// The served directory: each top-level directory is a bucket (a `mkdir` creates one).
    pub fn data_dir(&self) -> &Path {
        &self.state.data_dir
    }
    pub fn netns(&self) -> &str {
        &self.state.netns
    }
    pub fn host_if(&self) -> &str {
        &self.state.host_if
    }
    /// Pids of the processes started in the namespace (versitygw, then the proxy if any).
    pub fn pids(&self) -> Vec<i32> {
        self.state.procs.iter().map(|p| p.pid).collect()
    }

    /// Leaves the environment running when this value is dropped (the CLI's `env up`);
    /// [`Env::down`] removes it later.
    pub fn detach(mut self) {
        self.detached = true;
    }

    /// Tears down instance `id`: from its state file if there is one, and by name in any case.
    /// Nothing existing is fine. Errors only if something is still there afterwards.
    pub fn down(id: u8) -> Result<()> {
        let state = read_state(id);
        teardown(id, state.as_ref(), &mut [])
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if self.detached {
            return;
        }
        if let Err(e) = teardown(self.state.id, Some(&self.state), &mut self.children) {
            eprintln!(
                "silt-bench: tearing down environment {}: {e:#}",
                self.state.id
            );
        }
    }
}

fn read_state(id: u8) -> Option<State> {
    let text = std::fs::read(run_dir(id).join(STATE_FILE)).ok()?;
    match serde_json::from_slice(&text) {
        Ok(s) => Some(s),
        Err(e) => {
            eprintln!("silt-bench: ignoring unreadable state of environment {id}: {e}");
            None
        }
    }
}

fn teardown(id: u8, state: Option<&State>, children: &mut [Child]) -> Result<()> {
    let netns = netns_name(id);
    let hif = host_if(id);
    let mut problems = Vec::new();

    // 1. Recorded processes, only while their command line still matches.
    if let Some(s) = state {
        for p in &s.procs {
            if let Err(e) = stop(p) {
                problems.push(e.to_string());
            }
        }
    }
    // Reap our own children (they are dead or zombies by now).
    for c in children.iter_mut() {
        let _ = c.kill();
        let _ = c.wait();
    }
    // 2. Anything still living in our namespace (the state file may be missing or stale).
    if let Err(e) = kill_netns_members(&netns) {
        problems.push(e.to_string());
    }
    // 3. Qdiscs (a deleted link takes its qdiscs with it; this is belt and braces).
    if let Some(tc_path) = which("tc") {
        let _ = quiet(Command::new(&tc_path).args(["qdisc", "del", "dev", &hif, "root"]));
        if netns_exists(&netns) {
            if let Some(ip_path) = which("ip") {
                let _ = quiet(Command::new(ip_path).args([
                    "netns",
                    "exec",
                    &netns,
                    &tc_path.to_string_lossy(),
                    "qdisc",
                    "del",
                    "dev",
                    &ns_if(id),
                    "root",
                ]));
            }
        }
    }
    // 4. Links and namespace, by name.
    if link_exists(&hif) {
        let _ = ip(&["link", "del", &hif]);
    }
    if netns_exists(&netns) {
        let _ = ip(&["netns", "del", &netns]);
    }
    // A host-side peer named like ours (should not exist: the peer lives in the namespace).
    if link_exists(&ns_if(id)) {
        let _ = ip(&["link", "del", &ns_if(id)]);
    }
    for name in [&hif, &ns_if(id)] {
        if link_exists(name) {
            problems.push(format!("link {name} still exists"));
        }
    }
    if netns_exists(&netns) {
        problems.push(format!("namespace {netns} still exists"));
    }
    // 5. Data directory given by the user is kept; ours lives in the run dir.
    if problems.is_empty() {
        let run = run_dir(id);
        match std::fs::remove_dir_all(&run) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => problems.push(format!("removing {}: {e}", run.display())),
        }
        // The (empty) root stays: removing it could race with another instance's `up`.
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(anyhow!(
            "environment {id} not fully removed: {}",
            problems.join("; ")
        ))
    }
}

/// SIGTERM, then SIGKILL, a recorded process, as long as it is still the one we started.
fn stop(p: &ProcRecord) -> Result<()> {
    for (signal, timeout) in [(libc::SIGTERM, TERM_TIMEOUT), (libc::SIGKILL, TERM_TIMEOUT)] {
        if !is_ours(p) {
            return Ok(());
        }
        // SAFETY: plain syscall; the pid was just verified to run our command line.
        unsafe {
            libc::kill(p.pid, signal);
        }
        let deadline = Instant::now() + timeout;
        while is_ours(p) && Instant::now() < deadline {
            std::thread::sleep(POLL_INTERVAL);
        }
    }
    if is_ours(p) {
        bail!("{} (pid {}) survived SIGKILL", p.name, p.pid);
    }
    Ok(())
}

/// Whether `pid` is alive (not a zombie) and runs the recorded command line.
fn is_ours(p: &ProcRecord) -> bool {
    if p.pid <= 1 || !alive(p.pid) {
        return false;
    }
    let Ok(raw) = std::fs::read(format!("/proc/{}/cmdline", p.pid)) else {
        return false;
    };
    let argv: Vec<String> = raw
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect();
    argv == p.argv || argv == p.launcher_argv
}

/// Exists and is not a zombie.
fn alive(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the parenthesised command name, which may contain spaces.
    match stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next())
    {
        Some(state) => state != "Z" && state != "X",
        None => false,
    }
}

/// Kills every process whose network namespace is ours (by inode), waiting for each to die.
fn kill_netns_members(netns: &str) -> Result<()> {
    let Ok(meta) = std::fs::metadata(Path::new("/run/netns").join(netns)) else {
        return Ok(());
    };
    let wanted = format!("net:[{}]", meta.ino());
    let members = || -> Vec<i32> {
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        entries
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| *pid > 1 && alive(*pid))
            .filter(|pid| {
                std::fs::read_link(format!("/proc/{pid}/ns/net"))
                    .map(|l| l.to_string_lossy() == wanted)
                    .unwrap_or(false)
            })
            .collect()
    };
    let deadline = Instant::now() + TERM_TIMEOUT;
    loop {
        let pids = members();
        if pids.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("processes {pids:?} in namespace {netns} survived SIGKILL");
        }
        for pid in pids {
            // SAFETY: plain syscall; the pid was just seen inside our namespace.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

fn netns_exists(name: &str) -> bool {
    Path::new("/run/netns").join(name).exists()
}

fn link_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

/// Runs `ip ARGS`, failing with its stderr.
fn ip(args: &[&str]) -> Result<()> {
    let ip_path = which("ip").ok_or_else(|| anyhow!("`ip` (iproute2) not found"))?;
    let mut cmd = Command::new(ip_path);
    cmd.args(args);
    checked(&mut cmd, &format!("ip {}", args.join(" ")))
}

fn run_tc(tc_path: &Path, netns: Option<&str>, args: &[&str]) -> Result<()> {
    let mut cmd = match netns {
        Some(ns) => {
            let ip_path = which("ip").ok_or_else(|| anyhow!("`ip` not found"))?;
            let mut c = Command::new(ip_path);
            c.args(["netns", "exec", ns]).arg(tc_path);
            c
        }
        None => Command::new(tc_path),
    };
    cmd.args(args);
    checked(&mut cmd, &format!("tc {}", args.join(" ")))
}

fn checked(cmd: &mut Command, what: &str) -> Result<()> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {what}"))?;
    if !out.status.success() {
        bail!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn quiet(cmd: &mut Command) -> std::io::Result<std::process::ExitStatus> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
}

/// `tc` arguments for a tbf at `rate` bytes/s: a burst of 10 ms (at least 128 KiB, enough for
/// GSO packets), and at most 50 ms of queue.
fn tbf_args(dev: &str, rate: u64) -> Vec<String> {
    let burst = (rate / 100).max(128 * 1024);
    vec![
        "qdisc".into(),
        "replace".into(),
        "dev".into(),
        dev.into(),
        "root".into(),
        "tbf".into(),
        "rate".into(),
        format!("{}bit", rate.saturating_mul(8)),
        "burst".into(),
        burst.to_string(),
        "latency".into(),
        "50ms".into(),
    ]
}

fn read_log(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let start = text.len().saturating_sub(4000);
    let start = (start..text.len())
        .find(|i| text.is_char_boundary(*i))
        .unwrap_or(text.len());
    text[start..].to_string()
}

/// A program on `PATH`, or in `/usr/sbin`/`/sbin` (often missing from a non-root `PATH`).
pub fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// The versitygw binary (`silt_testkit::versitygw_path`, which the tests use too).
pub fn versitygw_path() -> Result<PathBuf> {
    silt_testkit::versitygw_path().map_err(|e| anyhow!(e))
}

/// The external programs an environment needs, checked before anything is created.
struct Tools {
    versitygw: PathBuf,
    tc: Option<PathBuf>,
    exe: Option<PathBuf>,
}

impl Tools {
    fn find(opts: &UpOptions) -> Result<Tools> {
        if !silt_testkit::is_root() {
            bail!("silt-bench environments need root (network namespaces, veth, tc)");
        }
        which("ip").ok_or_else(|| anyhow!("`ip` (iproute2) not found on PATH"))?;
        let tc = which("tc");
        if opts.profile.aggregate_rate.is_some() && tc.is_none() {
            bail!("`tc` (iproute2) not found on PATH (needed for an aggregate rate)");
        }
        let versitygw = match &opts.versitygw {
            Some(p) if p.is_file() => p.clone(),
            Some(p) => bail!("versitygw {} does not exist", p.display()),
            None => versitygw_path()?,
        };
        let exe = if opts.profile.needs_proxy() {
            let exe = match (&opts.exe, std::env::var_os("SILT_BENCH_EXE")) {
                (Some(p), _) => p.clone(),
                (None, Some(p)) if !p.is_empty() => PathBuf::from(p),
                _ => std::env::current_exe().context("locating the silt-bench executable")?,
            };
            if !exe.is_file() {
                bail!("silt-bench executable {} does not exist", exe.display());
            }
            Some(exe)
        } else {
            None
        };
        Ok(Tools { versitygw, tc, exe })
    }
}

/// One line per environment found under the run root (and stray namespaces), for `status`.
pub fn status() -> Vec<String> {
    let mut lines = Vec::new();
    let mut seen = Vec::new();
    if let Ok(entries) = std::fs::read_dir(RUN_ROOT) {
        let mut ids: Vec<u8> = entries
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect();
        ids.sort_unstable();
        for id in ids {
            seen.push(id);
            match read_state(id) {
                Some(s) => {
                    let procs: Vec<String> = s
                        .procs
                        .iter()
                        .map(|p| {
                            let st = if is_ours(p) { "running" } else { "gone" };
                            format!("{} pid {} {st}", p.name, p.pid)
                        })
                        .collect();
                    lines.push(format!(
                        "id {id}: {} ({}); namespace {}; {}",
                        s.endpoint,
                        s.profile,
                        if netns_exists(&s.netns) {
                            "present"
                        } else {
                            "missing"
                        },
                        procs.join(", ")
                    ));
                }
                None => lines.push(format!("id {id}: run dir without a readable state file")),
            }
        }
    }
    if let Ok(entries) = std::fs::read_dir("/run/netns") {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(id) = name
                .strip_prefix("silt-bench-")
                .and_then(|s| s.parse().ok())
            {
                if !seen.contains(&id) {
                    lines.push(format!(
                        "id {id}: stray namespace {name} (no state; `env down --id {id}`)"
                    ));
                }
            }
        }
    }
    lines
}
