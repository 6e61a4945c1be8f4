//! B1 cold and warm through every store kind, side by side on loopback: one object of
//! `SIZE_MIB` in versitygw (S3), fake-gcs-server (GCS), Azurite (Azure Blob) and a Hadoop
//! mini cluster (WebHDFS), each read whole with 1 MiB `read()`s through `silt mount`: cold (a
//! fresh state dir) and warm (a restart on that state: the disk tier warm, the mount's kernel
//! cache cold). Medians of `REPS` runs, and each store's ratio to S3's.
//!
//! ```text
//! cargo build --release -p silt && cargo run --example store_bench -- target/release/silt [SIZE_MIB] [REPS]
//! ```
//!
//! A benchmark, not a test: the figures go to docs/benchmarks.md. The emulators are not the
//! clouds: what this shows is that no store path of Silt is slower than S3's for the same
//! bytes, where each emulator keeps up.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use silt_testkit::{Azurite, FakeGcs, MiniHdfs, S3Server};
use silt_ufs::{open_store, S3Options};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let silt = PathBuf::from(args.get(1).map_or("target/release/silt", String::as_str));
    let size_mib: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(256);
    let reps: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(3);
    assert!(
        silt.exists(),
        "{} not found: build it first",
        silt.display()
    );

    let s3 = S3Server::start();
    s3.create_bucket("bench");
    let gcs = FakeGcs::start();
    gcs.create_bucket("bench");
    let azure = Azurite::start();
    azure.create_container("bench");
    let hdfs = MiniHdfs::start();
    hdfs.mkdirs("/bench/ds");
    let user = String::from_utf8_lossy(
        &Command::new("id")
            .arg("-un")
            .output()
            .expect("id -un")
            .stdout,
    )
    .trim()
    .to_string();
    std::env::set_var("SILT_BENCH_AZURE_KEY", azure.account_key());
    std::env::set_var("SILT_BENCH_S3_SECRET", s3.secret_key());
    let stores = [
        (
            "S3 (versitygw)",
            format!(
                "s3://bench/ds?endpoint={}&access_key_id={}&secret_access_key_env=SILT_BENCH_S3_SECRET",
                s3.endpoint(),
                s3.access_key()
            ),
        ),
        (
            "GCS (fake-gcs-server)",
            format!("gs://bench/ds?endpoint={}&anonymous=true", gcs.endpoint()),
        ),
        (
            "Azure Blob (Azurite)",
            format!(
                "azblob://bench/ds?account={}&endpoint={}&account_key_env=SILT_BENCH_AZURE_KEY",
                azure.account_name(),
                azure.endpoint()
            ),
        ),
        (
            "HDFS (WebHDFS, mini cluster)",
            format!(
                "webhdfs://{}/bench/ds?user={user}",
                hdfs.webhdfs_endpoint().trim_start_matches("http://")
            ),
        ),
    ];

    let data: Vec<u8> = (0..size_mib << 20)
        .map(|i| {
            (i as u64)
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .rotate_left(17) as u8
        })
        .collect();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    for (name, uri) in &stores {
        let store = rt
            .block_on(open_store(uri, &S3Options::default()))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        rt.block_on(store.write("data.bin", data.clone().into()))
            .unwrap_or_else(|e| panic!("{name}: writing the object: {e}"));
    }

    let work = tempfile::tempdir().expect("tempdir");
    let mut rows = Vec::new();
    for (name, uri) in &stores {
        let store = rt
            .block_on(open_store(uri, &S3Options::default()))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut direct = Vec::new();
        for _ in 0..reps {
            direct.push(rt.block_on(direct_parallel_gbps(&store, data.len() as u64)));
        }
        let (mut cold, mut warm) = (Vec::new(), Vec::new());
        for rep in 0..reps {
            let dir = work.path().join(format!("{}-{rep}", rows.len()));
            let mnt = dir.join("mnt");
            std::fs::create_dir_all(&mnt).expect("mountpoint");
            let state = dir.join("state");
            let mut m = Mount::start(&silt, uri, &mnt, &state);
            cold.push(read_gbps(&mnt.join("data.bin"), data.len()));
            m.stop();
            let mut m = Mount::start(&silt, uri, &mnt, &state);
            warm.push(read_gbps(&mnt.join("data.bin"), data.len()));
            m.stop();
        }
        let d = median(&mut direct);
        rows.push((
            name.to_string(),
            median(&mut cold),
            median(&mut warm),
            cold,
            warm,
            d,
        ));
    }
    let (s3_cold, s3_warm) = (rows[0].1, rows[0].2);
    println!(
        "B1 through each store, one {size_mib} MiB object, 1 reader, {reps} runs (median GB/s; ratio to S3)"
    );
    println!(
        "| store | direct, 8 × ranged GETs in parallel | cold | cold ÷ direct | warm | cold ÷ S3 | warm ÷ S3 | cold runs | warm runs |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (name, c, w, cs, ws, d) in &rows {
        println!(
            "| {name} | {d:.2} | {c:.2} | {:.2} | {w:.2} | {:.2} | {:.2} | {} | {} |",
            c / d,
            c / s3_cold,
            w / s3_warm,
            runs(cs),
            runs(ws)
        );
    }
}

fn runs(v: &[f64]) -> String {
    v.iter()
        .map(|x| format!("{x:.2}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// The object read straight from the store, without Silt's cache: 8 ranged reads at once
/// (the direct parallel reader of B1); GB/s.
async fn direct_parallel_gbps(store: &silt_ufs::DynStore, len: u64) -> f64 {
    let meta = store.stat("data.bin").await.expect("stat");
    let began = Instant::now();
    let part = len.div_ceil(8);
    let tasks: Vec<_> = (0..8u64)
        .map(|i| {
            let (store, meta) = (store.clone(), meta.clone());
            let range = (i * part).min(len)..((i + 1) * part).min(len);
            tokio::spawn(async move { store.read("data.bin", range, &meta).await })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.expect("join").expect("direct read").len() as u64;
    }
    assert_eq!(total, len);
    len as f64 / began.elapsed().as_secs_f64() / 1e9
}

/// Reads `path` whole with 1 MiB reads; GB/s.
fn read_gbps(path: &Path, len: usize) -> f64 {
    let mut f = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut buf = vec![0u8; 1 << 20];
    let began = Instant::now();
    let mut total = 0;
    loop {
        let n = f.read(&mut buf).expect("read");
        if n == 0 {
            break;
        }
        total += n;
    }
    assert_eq!(total, len, "{}: short read", path.display());
    len as f64 / began.elapsed().as_secs_f64() / 1e9
}

/// A `silt mount` of one store, read-only, with the default tiers under its state dir.
struct Mount {
    child: Child,
    mnt: PathBuf,
}

impl Mount {
    fn start(silt: &Path, uri: &str, mnt: &Path, state: &Path) -> Mount {
        let mut child = Command::new(silt)
            .args(["mount", "--state-dir"])
            .arg(state)
            .arg(uri)
            .arg(mnt)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("silt mount");
        // Mounted once it prints "silt: serving".
        let err = child.stderr.take().expect("stderr");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
                if line.starts_with("silt: serving") {
                    let _ = tx.send(());
                }
            }
        });
        rx.recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("silt mount {uri} did not come up"));
        Mount {
            child,
            mnt: mnt.to_path_buf(),
        }
    }

    fn stop(&mut self) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
        let _ = Command::new("fusermount3")
            .arg("-uz")
            .arg(&self.mnt)
            .stderr(Stdio::null())
            .status();
    }
}
