//! The CSI plugin (`silt csi`) as the kubelet meets it: the Kubernetes CSI sanity suite
//! (`csi-sanity`, built from the Go module proxy by scripts/install-deps.sh) against a real
//! plugin whose volumes are real FUSE mounts, and pods' bind mounts that keep working while
//! the volume's mount process and the plugin itself are killed and come back.

mod common;

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::*;
use silt_csi::proto;

/// The csi-sanity binary scripts/install-deps.sh builds.
fn csi_sanity() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.deps/bin/csi-sanity");
    assert!(
        p.exists(),
        "{} is missing: run scripts/install-deps.sh (it builds csi-sanity from the Go module proxy)",
        p.display()
    );
    p
}

/// A plugin process over a temp dir (socket, state, store, pods' directories), and the
/// clean-up of everything it and its mount processes leave, also when a test fails.
struct Plugin {
    dir: tempfile::TempDir,
    child: Option<Child>,
    rt: tokio::runtime::Runtime,
}

impl Plugin {
    fn new() -> Plugin {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("store/data")).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut p = Plugin {
            dir,
            child: None,
            rt,
        };
        p.start();
        p
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn socket(&self) -> PathBuf {
        self.path("csi.sock")
    }

    /// Starts `silt csi` and waits until it answers Probe (or dies).
    fn start(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path("plugin.log"))
            .unwrap();
        let child = with_cluster_secret(Command::new(SILT).args([
            "csi",
            "--endpoint",
            &format!("unix://{}", self.socket().display()),
            "--node-id",
            "test-node",
            "--state-dir",
            &self.path("state").to_string_lossy(),
            "--metrics-listen",
            "127.0.0.1:0",
        ]))
        .env("SILT_LOG", "info")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("starting silt csi");
        self.child = Some(child);
        loop {
            if let Some(st) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("silt csi exited ({st}): {}", self.log());
            }
            let probe: Result<proto::ProbeResponse, _> =
                self.call("/csi.v1.Identity/Probe", &proto::Empty {});
            if probe.is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, as a kubelet stopping the container sends: the plugin exits cleanly.
    fn terminate(&mut self) -> std::process::ExitStatus {
        let mut c = self.child.take().unwrap();
        // SAFETY: plain kill(2) of the plugin this test started.
        assert_eq!(unsafe { libc::kill(c.id() as i32, libc::SIGTERM) }, 0);
        c.wait().unwrap()
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    /// One sample of the running plugin's `/metrics` (its address from its latest start).
    fn metric(&self, series: &str) -> f64 {
        let log = self.log();
        let addr = log
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix("silt: metrics at http://"))
            .and_then(|r| r.split('/').next())
            .unwrap_or_else(|| panic!("the plugin printed no metrics address: {log}"));
        let (status, _, text) = http(addr, "GET", "/metrics");
        assert_eq!(status, 200, "{text}");
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {series} in {text}"))
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.path("plugin.log")).unwrap_or_default()
    }

    fn call<M: prost::Message, R: prost::Message + Default>(
        &self,
        method: &str,
        m: &M,
    ) -> Result<R, silt_csi::grpc::Status> {
        let bytes = self.rt.block_on(silt_csi::grpc::call(
            &self.socket(),
            method,
            &m.encode_to_vec(),
        ))?;
        Ok(R::decode(bytes).expect("a well-formed reply"))
    }

    fn ok<M: prost::Message>(&self, method: &str, m: &M) {
        let r: Result<proto::Empty, _> = self.call(method, m);
        if let Err(e) = r {
            panic!("{method}: {e}\nplugin log:\n{}", self.log());
        }
    }

    fn code<M: prost::Message>(&self, method: &str, m: &M) -> (i32, String) {
        let r: Result<proto::Empty, _> = self.call(method, m);
        let e = r.expect_err("the call should fail");
        (e.code, e.message)
    }

    /// The pid of the one staged volume's mount process, from the plugin's record.
    fn mount_pid(&self) -> i32 {
        let vols = self.path("state/volumes");
        let dir = std::fs::read_dir(&vols).unwrap().next().unwrap().unwrap();
        let rec: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.path().join("volume.json")).unwrap())
                .unwrap();
        rec["pid"].as_i64().unwrap() as i32
    }

    /// Live processes other than the plugin whose command line names this test's directory
    /// (mount processes, FUSE holders).
    fn processes(&self) -> Vec<i32> {
        let me = self.dir.path().to_string_lossy().into_owned();
        let plugin = self.child.as_ref().map(|c| c.id() as i32);
        let mut out = Vec::new();
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
            let zombie = stat
                .rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
            if !zombie && Some(pid) != plugin && String::from_utf8_lossy(&cmd).contains(&me) {
                out.push(pid);
            }
        }
        out
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        self.kill();
        for pid in self.processes() {
            // SAFETY: plain kill(2) of this test's own processes.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        // Deepest first: bind mounts of the pods, then the staging mounts.
        let root = self.dir.path().to_string_lossy().into_owned();
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut targets: Vec<String> = info
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|t| t.starts_with(&root))
            .map(str::to_string)
            .collect();
        targets.sort_by_key(|t| std::cmp::Reverse(t.len()));
        for t in targets {
            let _ = Command::new("umount").arg("-l").arg(&t).status();
        }
    }
}

fn mount_cap(mode: i32) -> Option<proto::VolumeCapability> {
    Some(proto::VolumeCapability {
        block: None,
        mount: Some(proto::MountVolume::default()),
        access_mode: Some(proto::AccessMode { mode }),
    })
}

fn attrs(kv: &[(&str, &str)]) -> HashMap<String, String> {
    kv.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Runs `f` on a thread and gives its result, failing the test if it never returns (a
/// mount whose requests hang forever is the failure this guards against).
fn finishes<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(180)) {
        Ok(v) => v,
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{what} did not finish: the mount hangs"),
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("{what} failed (see the panic above)"),
    }
}

#[test]
fn csi_sanity_passes_against_the_plugin() {
    let p = Plugin::new();
    let params = p.path("params.yaml");
    std::fs::write(
        &params,
        format!(
            "uri: file://{}\nwrite_type: through\n",
            p.path("store").display()
        ),
    )
    .unwrap();
    let out = Command::new(csi_sanity())
        .arg(format!("--csi.endpoint=unix://{}", p.socket().display()))
        .arg(format!(
            "--csi.stagingdir={}",
            p.path("sanity-staging").display()
        ))
        .arg(format!(
            "--csi.mountdir={}",
            p.path("sanity-target").display()
        ))
        .arg(format!("--csi.testvolumeparameters={}", params.display()))
        .arg("--ginkgo.no-color")
        .output()
        .expect("running csi-sanity");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "csi-sanity failed:\n{text}\nplugin log:\n{}",
        p.log()
    );
    // Not vacuous: the node lifecycle ran against real mounts.
    let passed: u32 = text
        .split("Passed")
        .next()
        .and_then(|s| s.split_whitespace().last())
        .and_then(|n| n.parse().ok())
        .expect("a summary line");
    assert!(passed >= 30, "only {passed} specs passed:\n{text}");
    assert!(
        p.log().matches("volume staged").count() >= 2,
        "no volume was staged: {}",
        p.log()
    );
    // What the suite created it deleted, and nothing of its volumes still runs.
    assert_eq!(
        std::fs::read_dir(p.path("store/volumes")).unwrap().count(),
        0
    );
    assert_eq!(p.processes(), Vec::<i32>::new());
}

#[test]
fn pods_keep_their_mounts_while_the_mount_process_and_the_plugin_restart() {
    let mut p = Plugin::new();
    let data = bytes(7, 3 << 20);
    std::fs::write(p.path("store/data/a.bin"), &data).unwrap();
    let staging = p.path("staging");
    std::fs::create_dir_all(&staging).unwrap();
    let context = attrs(&[
        ("uri", &format!("file://{}", p.path("store").display())),
        ("path", "/data"),
        ("write_type", "through"),
    ]);
    // Four stages of one volume at once (a kubelet retrying): all succeed, one mount.
    let stage = proto::NodeStageVolumeRequest {
        volume_id: "vol-1".into(),
        staging_target_path: staging.to_string_lossy().into(),
        volume_capability: mount_cap(5),
        volume_context: context.clone(),
        ..Default::default()
    };
    let racers: Vec<_> = (0..4)
        .map(|_| {
            let (socket, body) = (p.socket(), prost::Message::encode_to_vec(&stage));
            std::thread::spawn(move || {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap()
                    .block_on(silt_csi::grpc::call(
                        &socket,
                        "/csi.v1.Node/NodeStageVolume",
                        &body,
                    ))
            })
        })
        .collect();
    for r in racers {
        if let Err(e) = r.join().unwrap() {
            panic!("a concurrent stage: {e}\nplugin log:\n{}", p.log());
        }
    }
    // One mount process and its FUSE holder.
    assert_eq!(p.processes().len(), 2, "{:?}", p.processes());
    assert_eq!(p.log().matches("volume staged").count(), 1, "{}", p.log());
    // The pods' directory is a shared mount, as the kubelet's is (it needs that for the
    // plugin's Bidirectional mounts), so containers can follow mounts made in it.
    let pods = p.path("pods");
    std::fs::create_dir_all(&pods).unwrap();
    for args in [&["--bind", ".", "."][..], &["--make-shared", "."][..]] {
        let st = Command::new("mount")
            .args(args.iter().map(|a| {
                if *a == "." {
                    pods.as_os_str()
                } else {
                    a.as_ref()
                }
            }))
            .status()
            .unwrap();
        assert!(st.success());
    }
    let (t1, t2) = (p.path("pods/p1/vol"), p.path("pods/p2/vol"));
    for (t, readonly) in [(&t1, false), (&t2, true)] {
        p.ok(
            "/csi.v1.Node/NodePublishVolume",
            &proto::NodePublishVolumeRequest {
                volume_id: "vol-1".into(),
                staging_target_path: staging.to_string_lossy().into(),
                target_path: t.to_string_lossy().into(),
                volume_capability: mount_cap(5),
                readonly,
                volume_context: context.clone(),
                ..Default::default()
            },
        );
    }
    // Both pods see the volume's directory; one writes, the other reads it; the read-only
    // one may not write; what is written reaches the store.
    assert_eq!(std::fs::read(t1.join("a.bin")).unwrap(), data);
    std::fs::write(t1.join("new.txt"), b"hello").unwrap();
    assert_eq!(std::fs::read(t2.join("new.txt")).unwrap(), b"hello");
    let e = std::fs::write(t2.join("no.txt"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    assert_eq!(
        std::fs::read(p.path("store/data/new.txt")).unwrap(),
        b"hello"
    );
    // The stats the kubelet asks for.
    let stats: proto::NodeGetVolumeStatsResponse = p
        .call(
            "/csi.v1.Node/NodeGetVolumeStats",
            &proto::NodeGetVolumeStatsRequest {
                volume_id: "vol-1".into(),
                volume_path: t1.to_string_lossy().into(),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(stats.usage.len(), 2);

    // A pod holds a file open while the mount process is killed.
    let mut held = std::fs::File::open(t2.join("a.bin")).unwrap();
    let mut first = vec![0u8; 4096];
    held.read_exact(&mut first).unwrap();
    for round in 0..2 {
        let old = p.mount_pid();
        // SAFETY: plain kill(2) of the volume's mount process.
        assert_eq!(unsafe { libc::kill(old, libc::SIGKILL) }, 0);
        let (a, b) = (t1.clone(), t2.clone());
        let (fresh, listed) = finishes("reading through the pods' mounts", move || {
            let fresh = std::fs::read(a.join("a.bin"));
            let listed = std::fs::read_dir(&b).map(|d| {
                let mut names: Vec<String> = d
                    .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .collect();
                names.sort();
                names
            });
            (fresh, listed)
        });
        assert_eq!(fresh.expect("a pod's read after the kill"), data);
        let mut want = vec!["a.bin".to_string(), "new.txt".into()];
        want.extend((0..round).map(|r| format!("after-{r}.txt")));
        want.sort();
        assert_eq!(listed.expect("a pod's listing after the kill"), want);
        held.seek(SeekFrom::Start(1 << 20)).unwrap();
        let mut mid = vec![0u8; 1 << 20];
        let mut h = held.try_clone().unwrap();
        let mid = finishes("reading a held file", move || {
            h.read_exact(&mut mid).map(|()| mid)
        })
        .expect("reading a file held open across the restart");
        assert_eq!(mid, data[1 << 20..2 << 20]);
        let new = p.mount_pid();
        assert_ne!(
            new, old,
            "round {round}: the mount process was not restarted"
        );
        std::fs::write(t1.join(format!("after-{round}.txt")), b"still here").unwrap();
        assert_eq!(
            std::fs::read(p.path(&format!("store/data/after-{round}.txt"))).unwrap(),
            b"still here"
        );
        if round == 0 {
            // Now the plugin dies and a new one adopts the running mount; the next round
            // kills the mount process under the new plugin.
            p.kill();
            assert_eq!(std::fs::read(t1.join("new.txt")).unwrap(), b"hello");
            p.start();
        }
    }
    drop(held);
    // The holder dies too (both processes crash): that connection is gone for good, and its
    // mounts answer ENOTCONN. The plugin mounts the volume anew and binds the pods'
    // directories again (what the host sees; a container sees it if its mount propagates
    // from the host).
    let holder: i32 = {
        let vols = p.path("state/volumes");
        let dir = std::fs::read_dir(&vols).unwrap().next().unwrap().unwrap();
        std::fs::read_to_string(dir.path().join("silt/fuse-holder.pid"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    // A "container": a mount namespace that receives the host's mount events (what
    // `mountPropagation: HostToContainer` gives a pod's container).
    struct Sleeper(Child);
    impl Drop for Sleeper {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let container = Sleeper(
        Command::new("unshare")
            .args(["--mount", "--propagation", "slave", "sleep", "600"])
            .spawn()
            .expect("unshare"),
    );
    let in_container = |path: &Path| {
        Command::new("nsenter")
            .arg("-t")
            .arg(container.0.id().to_string())
            .arg("-m")
            .arg("cat")
            .arg(path)
            .output()
            .expect("nsenter")
    };
    // Its namespace is made: it reads the pod's mount.
    let seen = finishes("a read in the container", {
        let f = t1.join("new.txt");
        let pid = container.0.id();
        move || loop {
            let o = Command::new("nsenter")
                .args(["-t", &pid.to_string(), "-m", "cat"])
                .arg(&f)
                .output()
                .unwrap();
            if o.status.success() {
                return o.stdout;
            }
            // Until unshare has made the namespace and started sleep.
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    assert_eq!(seen, b"hello");
    let old = p.mount_pid();
    // SAFETY: plain kill(2) of the volume's holder and mount process.
    unsafe {
        assert_eq!(libc::kill(holder, libc::SIGKILL), 0);
        assert_eq!(libc::kill(old, libc::SIGKILL), 0);
    }
    // Each pod's directory is bound again in turn: wait for each.
    let came_back = |file: PathBuf| {
        finishes("the pods' mounts coming back", move || loop {
            match std::fs::read(&file) {
                Ok(b) => return b,
                // The dead connection, or the moment between unbinding and binding again.
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::ENOTCONN) | Some(libc::ECONNABORTED) | Some(libc::ENOENT)
                    ) =>
                {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Err(e) => panic!("reading {} through the pod's mount: {e}", file.display()),
            }
        })
    };
    assert_eq!(came_back(t1.join("new.txt")), b"hello");
    assert_eq!(came_back(t2.join("a.bin")), data);
    // The container follows the new bind too.
    let o = in_container(&t1.join("new.txt"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.stdout, b"hello");
    drop(container);
    assert_ne!(p.mount_pid(), old);

    // What the plugin (the second one) counted: the restart of round 1 and this one.
    assert_eq!(p.metric("silt_csi_mount_restarts_total"), 2.0);
    assert_eq!(p.metric("silt_csi_volumes_staged"), 1.0);
    assert_eq!(p.metric("silt_csi_volumes_published"), 2.0);

    // Unstaging while published is refused; unpublish removes the pods' directories, unstage
    // the mount and its processes.
    let unstage = proto::NodeUnstageVolumeRequest {
        volume_id: "vol-1".into(),
        staging_target_path: staging.to_string_lossy().into(),
    };
    assert_eq!(p.code("/csi.v1.Node/NodeUnstageVolume", &unstage).0, 9);
    for t in [&t1, &t2] {
        for _ in 0..2 {
            p.ok(
                "/csi.v1.Node/NodeUnpublishVolume",
                &proto::NodeUnpublishVolumeRequest {
                    volume_id: "vol-1".into(),
                    target_path: t.to_string_lossy().into(),
                },
            );
        }
        assert!(!t.exists(), "{} still exists", t.display());
    }
    p.ok("/csi.v1.Node/NodeUnstageVolume", &unstage);
    p.ok("/csi.v1.Node/NodeUnstageVolume", &unstage);
    assert!(!is_mounted(&staging));
    assert_eq!(p.processes(), Vec::<i32>::new());
    assert_eq!(p.metric("silt_csi_volumes_staged"), 0.0);
    assert_eq!(p.metric("silt_csi_volumes_published"), 0.0);
    assert!(p.metric("silt_csi_call_seconds_count{call=\"unstage\"}") >= 3.0);
    assert!(p.metric("silt_csi_call_errors_total") >= 1.0);
    // The data stays in the store.
    assert_eq!(std::fs::read(p.path("store/data/a.bin")).unwrap(), data);
}

#[test]
fn bad_calls_get_clear_errors() {
    let p = Plugin::new();
    let staging = p.path("staging");
    let stage = |context: HashMap<String, String>, cap| proto::NodeStageVolumeRequest {
        volume_id: "v".into(),
        staging_target_path: staging.to_string_lossy().into(),
        volume_capability: cap,
        volume_context: context,
        ..Default::default()
    };
    let uri = format!("file://{}", p.path("store").display());
    let cases: Vec<(
        HashMap<String, String>,
        Option<proto::VolumeCapability>,
        &str,
    )> = vec![
        (
            attrs(&[("uri", &uri), ("colour", "red")]),
            mount_cap(1),
            "colour",
        ),
        (
            attrs(&[("uri", &uri), ("path", "/a/../../etc")]),
            mount_cap(1),
            "..",
        ),
        (
            attrs(&[("uri", &uri), ("memory_capacity", "lots")]),
            mount_cap(1),
            // A known option with a bad value, not an unknown key.
            "volume attribute memory_capacity:",
        ),
        (
            attrs(&[("uri", &uri), ("cluster_secret", "x")]),
            mount_cap(1),
            "secret",
        ),
        (
            attrs(&[("uri", &uri)]),
            Some(proto::VolumeCapability {
                block: Some(proto::Empty {}),
                mount: None,
                access_mode: Some(proto::AccessMode { mode: 1 }),
            }),
            "block",
        ),
    ];
    for (context, cap, word) in cases {
        let (code, msg) = p.code("/csi.v1.Node/NodeStageVolume", &stage(context, cap));
        assert_eq!(code, 3, "{msg}");
        assert!(msg.contains(word), "{word}: {msg}");
    }
    // A store that cannot be mounted: the mount process's own error comes back.
    let (code, msg) = p.code(
        "/csi.v1.Node/NodeStageVolume",
        &stage(
            attrs(&[("uri", "file:///nonexistent/silt-csi-test")]),
            mount_cap(1),
        ),
    );
    assert_eq!(code, 13, "{msg}");
    assert!(msg.contains("exited before mounting"), "{msg}");
    assert!(!is_mounted(&staging));
    // Relative paths name nothing the kubelet made.
    let (code, msg) = p.code(
        "/csi.v1.Node/NodeStageVolume",
        &proto::NodeStageVolumeRequest {
            staging_target_path: "staging".into(),
            ..stage(attrs(&[("uri", &uri)]), mount_cap(1))
        },
    );
    assert_eq!(code, 3, "{msg}");
    // Publishing what was never staged.
    let (code, msg) = p.code(
        "/csi.v1.Node/NodePublishVolume",
        &proto::NodePublishVolumeRequest {
            volume_id: "v".into(),
            target_path: p.path("t").to_string_lossy().into(),
            volume_capability: mount_cap(1),
            ..Default::default()
        },
    );
    assert_eq!(code, 9, "{msg}");
    // Bytes that are no message, and a method CSI does not have.
    let raw = p.rt.block_on(silt_csi::grpc::call(
        &p.socket(),
        "/csi.v1.Node/NodeStageVolume",
        &[0xff, 0xff, 0xff],
    ));
    assert_eq!(raw.unwrap_err().code, 3);
    let (code, _) = p.code("/csi.v1.Node/NodeExpandVolume", &proto::Empty {});
    assert_eq!(code, 12);
    // Deleting an id the plugin never made succeeds (CSI: idempotent); validating it is
    // NotFound.
    p.ok(
        "/csi.v1.Controller/DeleteVolume",
        &proto::DeleteVolumeRequest {
            volume_id: "pvc-unknown".into(),
            ..Default::default()
        },
    );
    let (code, _) = p.code(
        "/csi.v1.Controller/ValidateVolumeCapabilities",
        &proto::ValidateVolumeCapabilitiesRequest {
            volume_id: format!("silt:{uri}#/volumes/none"),
            volume_capabilities: vec![mount_cap(1).unwrap()],
            ..Default::default()
        },
    );
    assert_eq!(code, 5);
    assert_eq!(p.processes(), Vec::<i32>::new());
    // A stop (SIGTERM) ends the plugin cleanly and removes its socket.
    let mut p = p;
    let st = p.terminate();
    assert!(st.success(), "{st}: {}", p.log());
    assert!(!p.socket().exists());
    assert!(
        p.log().contains("the volumes' mounts keep running"),
        "{}",
        p.log()
    );
}
