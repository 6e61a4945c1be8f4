//! The container image (deploy/Containerfile, deploy/image/*.sh), built FROM scratch out of
//! the `silt` binary cargo built here and this machine's own files, with no registry, and run
//! by podman:
//!
//! - as the documented `podman run --device /dev/fuse --cap-add SYS_ADMIN ... up` over a
//!   `file://` sample directory: a file is read through the FUSE mount inside the container
//!   (`podman exec ... cat`) and from the host through a shared bind mount (how the mount is
//!   handed to the host or other containers); `podman stop` then unmounts cleanly;
//! - as a cluster worker the way the Helm chart runs it (deploy/helm/silt: its environment
//!   variables, secret file, read-only root, no capabilities, no privilege escalation, its
//!   probe command), registered in a real etcd, serving a cluster client mount on the host.
//!
//! Skipped, with the reason printed, where podman cannot run: not root, no /dev/fuse, podman
//! or runc missing (scripts/install-deps.sh installs both).
//!
//! Podman is pointed at storage and run directories inside each test's temporary directory
//! (CONTAINERS_STORAGE_CONF, CONTAINERS_CONF), so the tests leave no image, container or layer
//! behind on the machine. `vfs` storage: plain directories, no kernel mounts to leak, and it
//! works on any file system the temporary directory is on. `podman build` also keeps a cache
//! of blob information in /var/lib/containers whatever the storage says: removed again when
//! the tests made it (they run one at a time, for that).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{mpsc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use common::{bytes, Silt, CLUSTER_SECRET, SILT};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Why these tests cannot run here, if they cannot.
fn cannot_run() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root (podman with /dev/fuse and CAP_SYS_ADMIN)".into());
    }
    if !Path::new("/dev/fuse").exists() {
        return Some("no /dev/fuse".into());
    }
    for tool in ["podman", "runc", "fusermount3", "objcopy"] {
        if !have(tool) {
            return Some(format!(
                "{tool} is not installed (scripts/install-deps.sh installs it)"
            ));
        }
    }
    None
}

/// The hard limit of `resource` for this process.
fn hard_limit(resource: libc::__rlimit_resource_t) -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own.
    assert_eq!(unsafe { libc::getrlimit(resource, &mut lim) }, 0);
    lim.rlim_max
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Where root's podman keeps its blob information cache, whatever the storage settings.
const PODMAN_SYSTEM_DIR: &str = "/var/lib/containers";

/// One test at a time uses podman (see the module's note on PODMAN_SYSTEM_DIR).
static SERIAL: Mutex<()> = Mutex::new(());

/// Podman confined to one temporary directory, and whatever a test made with it.
struct Engine {
    dir: tempfile::TempDir,
    /// The image and containers the test made (removed on drop, even after a failure).
    image: String,
    containers: Vec<String>,
    /// A host directory the test bind-mounted onto itself and made shared.
    shared: Option<PathBuf>,
    /// Whether PODMAN_SYSTEM_DIR is the test's to remove.
    made_system_dir: bool,
    // Declared last: released after `Drop::drop` has cleaned up.
    _serial: MutexGuard<'static, ()>,
}

impl Engine {
    fn new(name: &str) -> Engine {
        let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let made_system_dir = !Path::new(PODMAN_SYSTEM_DIR).exists();
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(
            d.join("storage.conf"),
            format!(
                "[storage]\ndriver = \"vfs\"\ngraphroot = \"{0}/graph\"\nrunroot = \"{0}/run\"\n",
                d.display()
            ),
        )
        .unwrap();
        // runc: crun 1.8 (Debian 12) refuses hybrid cgroup hierarchies, such as this VM's.
        // Events to a file (no journald here); the engine's scratch directory inside ours.
        std::fs::write(
            d.join("containers.conf"),
            format!(
                "[engine]\nruntime = \"runc\"\ncgroup_manager = \"cgroupfs\"\n\
                 events_logger = \"file\"\nevents_logfile_path = \"{0}/events.log\"\n\
                 tmp_dir = \"{0}/engine\"\n",
                d.display()
            ),
        )
        .unwrap();
        Engine {
            dir,
            image: format!("localhost/silt-test-{name}:{}", std::process::id()),
            containers: Vec::new(),
            shared: None,
            made_system_dir,
            _serial: serial,
        }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn env(&self, cmd: &mut Command) {
        cmd.env("CONTAINERS_STORAGE_CONF", self.path("storage.conf"))
            .env("CONTAINERS_CONF", self.path("containers.conf"));
    }

    fn podman(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("podman");
        cmd.args(args);
        self.env(&mut cmd);
        cmd
    }

    fn run(&self, args: &[&str]) -> Output {
        self.podman(args).output().expect("running podman")
    }

    /// Builds the image as documented: deploy/image/build.sh (rootfs.sh, then `podman build`).
    fn build_image(&self) {
        let mut build = Command::new(repo_root().join("deploy/image/build.sh"));
        build.args(["--silt", SILT, "--tag", &self.image, "--engine", "podman"]);
        self.env(&mut build);
        let o = build.output().expect("running deploy/image/build.sh");
        assert!(o.status.success(), "image build failed: {}", text(&o));
        let o = self.run(&["image", "inspect", "--format", "{{.Size}}", &self.image]);
        assert!(o.status.success(), "{}", text(&o));
        eprintln!(
            "image {} built: {} bytes (silt of the debug build, debug info stripped)",
            self.image,
            String::from_utf8_lossy(&o.stdout).trim()
        );
    }

    /// `podman run --name NAME OPTIONS IMAGE ARGS` in the foreground, once its output has a
    /// line starting with `ready`. The engine may not raise rlimits past this process's own
    /// (no CAP_SYS_RESOURCE in some sandboxes, and podman's defaults are higher), so the
    /// container gets ours, capped.
    fn start(&mut self, name: &str, options: &[&str], args: &[&str], ready: &str) -> Container {
        let nofile = hard_limit(libc::RLIMIT_NOFILE).min(1 << 20);
        let nproc = hard_limit(libc::RLIMIT_NPROC).min(4096);
        let nofile = format!("nofile={nofile}:{nofile}");
        let nproc = format!("nproc={nproc}:{nproc}");
        let name = format!("{name}-{}", std::process::id());
        let mut cmd = self.podman(&["run", "--name", &name]);
        cmd.args(["--ulimit", &nofile, "--ulimit", &nproc])
            .args(options)
            .arg(&self.image)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        self.containers.push(name.clone());
        let mut child = cmd.spawn().expect("podman run");
        // A reader keeps the container's whole output and reports the ready line.
        let err = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        let log = self.path(&format!("{name}.log"));
        let ready = ready.to_string();
        let reader = std::thread::spawn({
            let log = log.clone();
            move || {
                let mut file = std::fs::File::create(&log).unwrap();
                let mut sent = false;
                for line in BufReader::new(err).lines() {
                    let Ok(line) = line else { break };
                    let _ = writeln!(file, "{line}");
                    if !sent && line.starts_with(&ready) {
                        let _ = tx.send(true);
                        sent = true;
                    }
                }
                let _ = tx.send(false);
            }
        });
        let c = Container {
            name,
            child,
            log,
            reader: Some(reader),
        };
        match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(true) => c,
            other => {
                let mut c = c;
                let _ = c.child.kill();
                let _ = c.child.wait();
                panic!("{} did not come up ({other:?}): {}", c.name, c.log_text());
            }
        }
    }

    /// `podman stop`: SIGTERM, which silt answers by leaving (and unmounting) cleanly.
    /// Answers the container's log once it has exited 0 without a panic.
    fn stop(&self, mut c: Container) -> String {
        let o = self.run(&["stop", "--time", "60", &c.name]);
        assert!(o.status.success(), "podman stop: {}", text(&o));
        let status = c.child.wait().unwrap();
        c.reader.take().unwrap().join().unwrap();
        let log = c.log_text();
        assert!(status.success(), "{} exited with {status}: {log}", c.name);
        assert!(!log.contains("panicked"), "{log}");
        log
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        for c in &self.containers {
            let _ = self.run(&["rm", "--force", "--time", "0", c]);
        }
        let _ = self.run(&["rmi", "--force", &self.image]);
        if let Some(dir) = &self.shared {
            // Lazily: a FUSE mount left under it by a failed test goes with it.
            let _ = Command::new("umount").arg("-l").arg(dir).status();
        }
        if self.made_system_dir {
            let _ = std::fs::remove_dir_all(PODMAN_SYSTEM_DIR);
        }
    }
}

/// A container running in the foreground of `podman run`.
struct Container {
    name: String,
    child: Child,
    log: PathBuf,
    reader: Option<JoinHandle<()>>,
}

impl Container {
    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

fn fuse_mounts_under(dir: &Path) -> Vec<String> {
    let dir = dir.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| {
            l.contains(" - fuse") && l.split(' ').nth(4).is_some_and(|m| m.starts_with(&dir))
        })
        .map(str::to_string)
        .collect()
}

fn ok(cmd: &mut Command) {
    let status = cmd.status().expect("running a command");
    assert!(status.success(), "{cmd:?}: {status}");
}

#[test]
fn image_runs_silt_up_with_dev_fuse() {
    if let Some(why) = cannot_run() {
        eprintln!("skipped: {why}");
        return;
    }
    let mut engine = Engine::new("up");
    engine.build_image();

    // The sample under-store: a small file and one of several pages (1 MiB pages).
    let sample = engine.path("sample");
    std::fs::create_dir_all(sample.join("sub")).unwrap();
    let small = b"hello from the store\n".to_vec();
    let big = bytes(20, 3 * (1 << 20) + 12345);
    std::fs::write(sample.join("hello.txt"), &small).unwrap();
    std::fs::write(sample.join("sub/big.bin"), &big).unwrap();

    // A host directory bind-mounted onto itself and made shared, so a mount the container
    // makes under it (rshared) shows on the host.
    let host = engine.path("host");
    std::fs::create_dir_all(host.join("silt")).unwrap();
    ok(Command::new("mount").arg("--bind").arg(&host).arg(&host));
    engine.shared = Some(host.clone());
    ok(Command::new("mount").arg("--make-shared").arg(&host));

    let sample_vol = format!("{}:/srv/sample:ro", sample.display());
    let host_mount = format!(
        "type=bind,src={},dst=/mnt/host,bind-propagation=rshared",
        host.display()
    );
    // `cat` for `podman exec`: the image has no shell or tools; the host's cat runs on the
    // image's libc, which is the host's own.
    let c = engine.start(
        "silt-up",
        &[
            "--network",
            "none",
            "--device",
            "/dev/fuse",
            "--cap-add",
            "SYS_ADMIN",
            "--volume",
            &sample_vol,
            "--volume",
            "/usr/bin/cat:/test/cat:ro",
            "--mount",
            &host_mount,
        ],
        &[
            "up",
            "--mounts",
            "/sample=file:///srv/sample",
            "--mountpoint",
            "/mnt/host/silt",
        ],
        "silt: serving ",
    );

    // Inside the container, through the FUSE mount.
    let exec = |args: &[&str]| {
        let mut all = vec!["exec", c.name.as_str()];
        all.extend_from_slice(args);
        let o = engine.run(&all);
        assert!(o.status.success(), "podman exec {args:?}: {}", text(&o));
        o.stdout
    };
    assert_eq!(
        exec(&["/test/cat", "/mnt/host/silt/sample/hello.txt"]),
        small
    );
    let seen = exec(&["/test/cat", "/mnt/host/silt/sample/sub/big.bin"]);
    assert!(seen == big, "big.bin read inside the container differs");
    // The CLI in the image talks to the daemon.
    let listing = String::from_utf8(exec(&["silt", "fs", "ls", "/sample"])).unwrap();
    assert!(
        listing.contains("hello.txt") && listing.contains("sub"),
        "silt fs ls /sample: {listing}"
    );

    // On the host, through the propagated mount.
    let seen = std::fs::read(host.join("silt/sample/sub/big.bin")).unwrap();
    assert!(seen == big, "big.bin read on the host differs");
    assert_eq!(
        std::fs::read(host.join("silt/sample/hello.txt")).unwrap(),
        small
    );

    // SIGTERM: silt unmounts and exits 0; the mount is gone on the host too.
    let log = engine.stop(c);
    assert!(log.contains("unmounting /mnt/host/silt"), "{log}");
    assert_eq!(fuse_mounts_under(&host), Vec::<String>::new());
}

#[test]
fn image_runs_a_worker_as_the_helm_chart_does() {
    if let Some(why) = cannot_run() {
        eprintln!("skipped: {why}");
        return;
    }
    let etcd = silt_testkit::Etcd::start();
    let mut engine = Engine::new("worker");
    engine.build_image();

    // The data, at the same path on the host and in the container: the client opens the
    // cluster's mount table (file://) itself too.
    let sample = engine.path("sample");
    let files = common::dataset();
    common::write_local(&sample, &files);
    let (state, tier, secret) = (
        engine.path("state"),
        engine.path("tier"),
        engine.path("secret"),
    );
    for d in [&state, &tier, &secret] {
        std::fs::create_dir_all(d).unwrap();
    }
    // The Secret volume's file: owner-only (defaultMode 0400).
    let secret_file = secret.join("cluster-secret");
    std::fs::write(&secret_file, CLUSTER_SECRET).unwrap();
    std::fs::set_permissions(&secret_file, std::fs::Permissions::from_mode(0o400)).unwrap();
    // The worker's port: a free one on loopback (the container shares the host's network).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");

    // The chart's worker container (templates/worker.yaml): its securityContext, volumes
    // and environment; addresses on loopback instead of the pod's IP.
    let vol = |src: &Path, dst: &str, mode: &str| format!("{}:{dst}:{mode}", src.display());
    let env = [
        format!("SILT_ETCD={}", etcd.endpoint()),
        "SILT_CLUSTER_NAME=chart".to_string(),
        "SILT_CLUSTER_SECRET_FILE=/etc/silt/cluster/cluster-secret".to_string(),
        "SILT_LOG=info".to_string(),
        "SILT_S3_REGION=us-east-1".to_string(),
        "SILT_S3_PATH_STYLE=true".to_string(),
        "SILT_STATE_DIR=/var/lib/silt".to_string(),
        format!("SILT_LISTEN={addr}"),
        format!("SILT_ADVERTISE={addr}"),
        "SILT_WORKER_ID=node-a.example".to_string(),
        "SILT_CLUSTER_UNIX_SOCKET=false".to_string(),
        "SILT_MEMORY_CAPACITY=64MiB".to_string(),
        "SILT_DISK_TIERS=/silt/tiers/cache:1GiB".to_string(),
        format!("SILT_MOUNTS=/data=file://{}", sample.display()),
    ];
    let mut options: Vec<String> = [
        "--network",
        "host",
        "--read-only",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "--tmpfs",
        "/tmp",
    ]
    .map(String::from)
    .to_vec();
    for v in [
        vol(&state, "/var/lib/silt", "rw"),
        vol(&tier, "/silt/tiers/cache", "rw"),
        vol(&secret, "/etc/silt/cluster", "ro"),
        vol(&sample, &sample.display().to_string(), "ro"),
    ] {
        options.extend(["--volume".to_string(), v]);
    }
    for e in env {
        options.extend(["--env".to_string(), e]);
    }
    let options: Vec<&str> = options.iter().map(String::as_str).collect();
    let w = engine.start(
        "silt-worker",
        &options,
        &["worker"],
        "silt: serving as worker node-a.example",
    );

    // The chart's probe command.
    let o = engine.run(&["exec", &w.name, "silt", "memory"]);
    assert!(o.status.success(), "probe `silt memory`: {}", text(&o));

    // A cluster client on the host (the same secret, given its own way) reads everything
    // through the worker in the container.
    let mnt = engine.path("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let client_state = engine.path("client");
    let mut cmd = Command::new(SILT);
    cmd.arg("mount")
        .arg(&mnt)
        .args(["--etcd", &etcd.endpoint(), "--cluster-name", "chart"])
        .args(["--state-dir", client_state.to_str().unwrap()])
        .args(["--memory-capacity", "64MiB", "--passthrough", "off"]);
    let client = Silt::spawn(cmd, Some(&mnt), &client_state).expect("cluster client");
    for (path, data) in &files {
        let seen = std::fs::read(mnt.join("data").join(path)).unwrap();
        assert!(&seen == data, "{path} read through the worker differs");
    }
    let report = client.report();
    let workers = report["cluster"]["workers"].as_array().cloned().unwrap();
    let me = workers
        .iter()
        .find(|w| w["id"] == "node-a.example")
        .unwrap_or_else(|| panic!("the worker is not in the client's view: {report}"));
    assert!(
        me["bytes_served"].as_u64().unwrap_or(0) > 0,
        "the worker served nothing: {report}"
    );
    client.stop();

    let log = engine.stop(w);
    assert!(log.contains("leaving the cluster"), "{log}");
}
