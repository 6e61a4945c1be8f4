//! The operations endpoints of a real `silt up`: the Prometheus exposition scraped with a
//! plain TCP GET and parsed, and the web page loaded in a real headless Chromium.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

/// The address a daemon printed for one of its listeners (`silt: metrics at http://A/...`).
fn printed_addr(silt: &Silt, what: &str) -> String {
    let log = silt.log_text();
    let prefix = format!("silt: {what} at http://");
    log.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_else(|| panic!("silt printed no {what} address: {log}"))
        .to_string()
}

/// One sample: its name and labels (sorted).
type Series = (String, BTreeMap<String, String>);

/// A parsed exposition: every sample, and the declared type of each family.
#[derive(Debug, Default)]
struct Scrape {
    samples: BTreeMap<Series, f64>,
    types: HashMap<String, String>,
}

fn is_name(s: &str, colon: bool) -> bool {
    let mut cs = s.chars();
    cs.next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || (colon && c == ':'))
        && cs.all(|c| c.is_ascii_alphanumeric() || c == '_' || (colon && c == ':'))
}

/// `{a="x",b="y\"z"}` → labels; the rest of the line after the closing brace.
fn parse_labels(s: &str) -> (BTreeMap<String, String>, &str) {
    let mut labels = BTreeMap::new();
    let mut rest = s;
    loop {
        rest = rest.trim_start_matches(',');
        if let Some(r) = rest.strip_prefix('}') {
            return (labels, r);
        }
        let (name, r) = rest.split_once("=\"").expect("label=\"value\"");
        assert!(is_name(name, false), "bad label name {name:?}");
        let mut value = String::new();
        let mut chars = r.char_indices();
        let end = loop {
            match chars.next().expect("unterminated label value") {
                (_, '\\') => match chars.next().expect("dangling escape").1 {
                    'n' => value.push('\n'),
                    c @ ('\\' | '"') => value.push(c),
                    c => panic!("bad escape \\{c}"),
                },
                (i, '"') => break i,
                (_, c) => value.push(c),
            }
        };
        assert!(
            labels.insert(name.to_string(), value).is_none(),
            "label {name} twice"
        );
        rest = &r[end + 1..];
    }
}

fn parse_value(v: &str) -> f64 {
    match v {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        _ => v
            .parse()
            .unwrap_or_else(|_| panic!("bad sample value {v:?}")),
    }
}

/// Parses Prometheus text format strictly: every family has one HELP and one TYPE before
/// its samples, names and labels are well formed, no series appears twice, and every
/// histogram's buckets are cumulative with `+Inf` equal to `_count` and a `_sum`.
fn parse_exposition(text: &str) -> Scrape {
    let mut scrape = Scrape::default();
    let mut helped = HashMap::new();
    assert!(text.ends_with('\n'), "the exposition ends with a newline");
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').expect("# HELP name text");
            assert!(is_name(name, true) && !help.is_empty(), "{line}");
            assert!(
                helped.insert(name.to_string(), ()).is_none(),
                "HELP twice: {line}"
            );
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("# TYPE name kind");
            assert!(
                ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                "{line}"
            );
            assert!(helped.contains_key(name), "TYPE before HELP: {line}");
            assert!(
                scrape
                    .types
                    .insert(name.to_string(), kind.to_string())
                    .is_none(),
                "TYPE twice: {line}"
            );
            continue;
        }
        assert!(
            !line.starts_with('#') && !line.is_empty(),
            "stray line {line:?}"
        );
        let name_end = line.find(['{', ' ']).expect("a sample");
        let name = &line[..name_end];
        assert!(is_name(name, true), "bad metric name in {line:?}");
        let (labels, rest) = match line[name_end..].strip_prefix('{') {
            Some(r) => parse_labels(r),
            None => (BTreeMap::new(), &line[name_end..]),
        };
        let value = rest.trim();
        assert!(
            !value.contains(' '),
            "a timestamp or junk after the value: {line}"
        );
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| {
                name.strip_suffix(s)
                    .filter(|base| scrape.types.get(*base).is_some_and(|t| t == "histogram"))
            })
            .unwrap_or(name);
        assert!(
            scrape.types.contains_key(family),
            "sample before its TYPE: {line}"
        );
        if scrape.types[family] == "histogram" {
            assert_ne!(name, family, "a bare sample of histogram {family}");
            assert_eq!(
                name.ends_with("_bucket"),
                labels.contains_key("le"),
                "le belongs on buckets only: {line}"
            );
        }
        let key = (name.to_string(), labels);
        assert!(
            scrape.samples.insert(key, parse_value(value)).is_none(),
            "series twice: {line}"
        );
    }
    check_histograms(&scrape);
    scrape
}

fn check_histograms(scrape: &Scrape) {
    for (family, _) in scrape.types.iter().filter(|(_, t)| *t == "histogram") {
        // Buckets grouped by their labels other than `le`.
        let mut groups: BTreeMap<BTreeMap<String, String>, Vec<(f64, f64)>> = BTreeMap::new();
        for ((name, labels), v) in &scrape.samples {
            if *name == format!("{family}_bucket") {
                let mut rest = labels.clone();
                let le = parse_value(&rest.remove("le").expect("le"));
                groups.entry(rest).or_default().push((le, *v));
            }
        }
        for (labels, mut buckets) in groups {
            buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
            assert_eq!(
                buckets.last().map(|b| b.0),
                Some(f64::INFINITY),
                "{family}{labels:?} has no +Inf bucket"
            );
            for w in buckets.windows(2) {
                assert!(
                    w[0].1 <= w[1].1,
                    "{family}{labels:?}: buckets not cumulative: {buckets:?}"
                );
            }
            let count = scrape.samples[&(format!("{family}_count"), labels.clone())];
            let sum = scrape.samples[&(format!("{family}_sum"), labels.clone())];
            assert_eq!(
                buckets.last().map(|b| b.1),
                Some(count),
                "{family}{labels:?}: +Inf bucket != _count"
            );
            assert!(
                sum >= 0.0 && (count > 0.0 || sum == 0.0),
                "{family}{labels:?}"
            );
        }
    }
}

impl Scrape {
    /// The value of one series; 0 if it is not there (a histogram label not observed yet).
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let labels = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        self.samples
            .get(&(name.to_string(), labels))
            .copied()
            .unwrap_or(0.0)
    }
}

fn scrape(addr: &str) -> Scrape {
    let (status, headers, body) = http(addr, "GET", "/metrics");
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        headers.get("content-type").map(String::as_str),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    parse_exposition(&body)
}

/// Reads through a real mount move the counters, histograms and gauges by what the reads
/// imply, in an exposition that parses strictly; the scraped counters are the report's.
#[test]
fn metrics_endpoint_counts_reads_through_the_mount() {
    let src = tempfile::tempdir().unwrap();
    let files: Vec<(String, Vec<u8>)> = [1usize, 4096, (1 << 20) + 1, 3 * (1 << 20) + 12345]
        .iter()
        .enumerate()
        .map(|(i, &n)| (format!("d{}/f{i}.bin", i % 2), bytes(i as u64 + 7, n)))
        .collect();
    write_local(src.path(), &files);
    let total: u64 = files.iter().map(|(_, b)| b.len() as u64).sum();
    let dir = tempfile::tempdir().unwrap();
    let uri = format!("file://{}", src.path().display());
    let silt = Silt::up(
        &[("/data", &uri)],
        &["--metrics-listen", "127.0.0.1:0", "--web-listen", "off"],
        dir.path(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let addr = printed_addr(&silt, "metrics");
    assert!(
        !silt.log_text().contains("silt: web page at"),
        "web_listen off serves no page"
    );

    let before = scrape(&addr);
    for (p, b) in &files {
        assert!(
            std::fs::read(silt.path(&format!("data/{p}"))).unwrap() == *b,
            "{p}"
        );
    }
    let after = scrape(&addr);
    let delta =
        |name: &str, labels: &[(&str, &str)]| after.get(name, labels) - before.get(name, labels);
    let n = files.len() as f64;

    // Counters: every byte came from the store once, and through the daemon to the reader.
    assert_eq!(after.types["silt_ufs_read_bytes_total"], "counter");
    assert_eq!(delta("silt_ufs_read_bytes_total", &[]), total as f64);
    assert_eq!(delta("silt_fuse_opens_daemon_total", &[]), n);
    assert!(delta("silt_fuse_read_bytes_total", &[]) >= total as f64);
    assert!(
        delta("silt_page_misses_total", &[]) >= 6.0,
        "one per page at least"
    );
    // The report reads the same counters.
    let report = silt.report();
    for name in [
        "silt_ufs_read_bytes_total",
        "silt_fuse_opens_daemon_total",
        "silt_fuse_read_bytes_total",
        "silt_read_bytes_ufs_total",
    ] {
        assert_eq!(
            report["metrics"][name].as_f64(),
            Some(after.get(name, &[])),
            "{name}"
        );
    }

    // Histograms: each open and read answered, timed by kind; the misses were store reads.
    assert_eq!(after.types["silt_fuse_op_seconds"], "histogram");
    assert!(delta("silt_fuse_op_seconds_count", &[("op", "open")]) >= n);
    assert!(delta("silt_fuse_op_seconds_count", &[("op", "read")]) >= n);
    assert!(delta("silt_fuse_op_seconds_count", &[("op", "lookup")]) >= 1.0);
    assert!(after.get("silt_fuse_op_seconds_sum", &[("op", "read")]) > 0.0);
    assert!(delta("silt_client_read_seconds_count", &[("source", "store")]) >= 1.0);
    assert_eq!(
        after.get("silt_client_read_seconds_count", &[("source", "worker")]),
        0.0,
        "a single node reads no worker"
    );
    let ufs_reads = &[("mount", "/data"), ("op", "read")];
    assert!(delta("silt_ufs_request_seconds_count", ufs_reads) >= n);
    assert!(
        after.get(
            "silt_ufs_request_seconds_bucket",
            &[("mount", "/data"), ("op", "read"), ("le", "+Inf")]
        ) >= n
    );

    // Gauges: the namespace, the pages now in memory, a single node.
    assert_eq!(
        after.get("silt_mount_info", &[("mount", "/data"), ("store", &uri)]),
        1.0
    );
    assert_eq!(
        after.get(
            "silt_info",
            &[
                ("version", env!("CARGO_PKG_VERSION")),
                ("role", "single node")
            ]
        ),
        1.0
    );
    assert!(after.get("silt_tier_used_bytes", &[("tier", "memory")]) >= total as f64);
    assert!(after.get("silt_tier_pages", &[("tier", "memory")]) >= 6.0);
    assert_eq!(
        after.get("silt_tier_capacity_bytes", &[("tier", "memory")]),
        (1u64 << 30) as f64
    );
    assert_eq!(after.get("silt_cluster_members", &[]), 1.0);
    assert!(after.get("silt_start_time_seconds", &[]) > 1.6e9);
    // Read-only: no write memory to show, only its HELP and TYPE.
    assert_eq!(after.types["silt_write_memory_used_bytes"], "gauge");

    // A handle counts while open (the kernel releases closed ones in the background, so
    // earlier ones may still count too).
    let held = std::fs::File::open(silt.path("data/d0/f0.bin")).unwrap();
    assert!(scrape(&addr).get("silt_fuse_open_handles", &[]) >= 1.0);
    drop(held);

    // The rest of the listener: health, nothing else, GET and HEAD only.
    assert_eq!(http(&addr, "GET", "/healthz").0, 200);
    assert_eq!(http(&addr, "GET", "/nope").0, 404);
    assert_eq!(
        http(&addr, "GET", "/browse?path=/").0,
        404,
        "no web page here"
    );
    let (status, headers, _) = http(&addr, "POST", "/metrics");
    assert_eq!(status, 405);
    assert_eq!(headers.get("allow").map(String::as_str), Some("GET, HEAD"));
    let (status, headers, body) = http(&addr, "HEAD", "/metrics");
    assert_eq!((status, body.as_str()), (200, ""));
    assert!(headers.contains_key("content-length"));
    silt.stop();
}

/// An address taken by another process: `auto` starts without the endpoint (a warning),
/// an explicit address fails the start with a message naming the option.
#[test]
fn a_taken_port_is_skipped_by_default_and_refused_when_asked_for() {
    let src = tempfile::tempdir().unwrap();
    let uri = format!("file://{}", src.path().display());
    // Hold both default ports. Another daemon on this host may hold them already: then they
    // are taken too, but it could let go before silt binds, so only the start is checked.
    let held = [
        silt_common::config::DEFAULT_METRICS_LISTEN,
        silt_common::config::DEFAULT_WEB_LISTEN,
    ]
    .map(std::net::TcpListener::bind);
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_addr = taken.local_addr().unwrap().to_string();

    let dir = tempfile::tempdir().unwrap();
    let silt = Silt::up(&[("/data", &uri)], &[], dir.path()).unwrap_or_else(|e| panic!("{e}"));
    let log = silt.log_text();
    if held.iter().all(Result::is_ok) {
        assert!(!log.contains("silt: metrics at"), "{log}");
        assert!(!log.contains("silt: web page at"), "{log}");
        assert!(log.contains("not serving metrics"), "{log}");
        assert!(log.contains("not serving the web page"), "{log}");
    }
    silt.stop();

    let dir = tempfile::tempdir().unwrap();
    let e = match Silt::up(
        &[("/data", &uri)],
        &["--metrics-listen", &taken_addr],
        dir.path(),
    ) {
        Ok(s) => {
            s.stop();
            panic!("started on a taken explicit address");
        }
        Err(e) => e,
    };
    assert!(
        e.contains("metrics-listen") && e.contains(&taken_addr),
        "{e}"
    );
}

/// The `chromium` binary (installed by scripts/install-deps.sh).
fn chromium() -> String {
    for name in ["chromium", "chromium-browser"] {
        if Command::new(name)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
        {
            return name.to_string();
        }
    }
    panic!("chromium is not installed: run scripts/install-deps.sh (apt-get install chromium)");
}

/// Runs headless Chromium on `url` with `args` (its own profile under `dir`) and returns its
/// stdout. Killed if it has not finished within a generous bound: a guard against a hang,
/// not a timing check (a killed run fails the test with its stderr).
fn headless(dir: &Path, url: &str, args: &[&str]) -> String {
    let mut child = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--hide-scrollbars",
            "--window-size=1280,1000",
        ])
        .arg(format!(
            "--user-data-dir={}",
            dir.join("chromium-profile").display()
        ))
        .args(args)
        .arg(url)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting chromium");
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let pid = child.id() as i32;
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let guard = std::thread::spawn(move || {
        if finished.recv_timeout(Duration::from_secs(180)).is_err() {
            // SAFETY: kill(2) of our own child, still unreaped: no word in 180 s means the
            // waiter below is still waiting for it.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    });
    let status = child.wait().expect("waiting for chromium");
    let _ = done.send(());
    guard.join().unwrap();
    let stdout = reader.join().unwrap();
    let stderr = err_reader.join().unwrap();
    assert!(
        status.success(),
        "chromium failed ({status}) on {url}: {stderr}"
    );
    stdout
}

/// The row of the DOM holding `needle` (from its `<tr` to its `</tr>`).
fn row_of<'a>(dom: &'a str, needle: &str) -> &'a str {
    let at = dom
        .find(needle)
        .unwrap_or_else(|| panic!("{needle:?} is not in the page: {dom}"));
    let start = dom[..at].rfind("<tr").expect("in a table row");
    let end = at + dom[at..].find("</tr>").expect("a closed row");
    &dom[start..end]
}

/// The web page in a real headless Chromium: the overview shows the mount, this node, its
/// tiers, a finished load and a pending `back` upload; the browse view lists a directory with
/// each file's cached fraction, names escaped. Screenshots land in the test's temp dir.
#[test]
fn web_page_in_headless_chromium() {
    let src = tempfile::tempdir().unwrap();
    let odd = "b <&> \"q\".bin";
    let files: Vec<(String, Vec<u8>)> = vec![
        ("imgs/a.bin".into(), bytes(1, 2 << 20)),
        (format!("imgs/{odd}"), bytes(2, 5000)),
        ("imgs/c.bin".into(), bytes(3, 3 << 20)),
        ("more/d.bin".into(), bytes(4, 700_000)),
    ];
    write_local(src.path(), &files);
    // A directory longer than one browse page (500 entries).
    let many: Vec<(String, Vec<u8>)> = (0..1001)
        .map(|i| (format!("many/f{i:04}"), vec![b'x']))
        .collect();
    write_local(src.path(), &many);
    let uri = format!("file://{}", src.path().display());
    let dir = tempfile::tempdir().unwrap();
    let silt = Silt::up(
        &[("/data", &uri)],
        &[
            "--web-listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--write-type",
            "back",
            // Uploads wait an hour: the written file stays pending while the page is read.
            "--upload-delay",
            "1h",
        ],
        dir.path(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let web = printed_addr(&silt, "web page");
    assert_ne!(
        web,
        printed_addr(&silt, "metrics"),
        "port 0 gives each its own"
    );

    // a.bin read whole (all cached), c.bin never read (none), d.bin loaded.
    assert!(std::fs::read(silt.path("data/imgs/a.bin")).unwrap() == files[0].1);
    let o = silt.cli(&["load", "/data/more"]);
    assert!(o.status.success(), "load: {}", stderr(&o));
    std::fs::write(silt.path("data/out.txt"), b"written back later").unwrap();

    // Paging: previous/next links, and a `from` past the end shows the last page.
    for (from, shown, prev, next) in [
        ("", "1–500 shown", None, Some(500)),
        ("&from=500", "501–1000 shown", Some(0), Some(1000)),
        ("&from=99999", "1001–1001 shown", Some(500), None),
    ] {
        let (status, _, body) = http(&web, "GET", &format!("/browse?path=/data/many{from}"));
        assert_eq!(status, 200, "{body}");
        assert!(
            body.contains(&format!("1001 entries, {shown}")),
            "{from}: {body}"
        );
        let link = |what: &str, n: usize| format!("from={n}\">{what} 500</a>");
        assert_eq!(
            prev.is_some_and(|n| body.contains(&link("previous", n))),
            prev.is_some(),
            "{from}: {body}"
        );
        assert_eq!(
            next.is_some_and(|n| body.contains(&link("next", n))),
            next.is_some(),
            "{from}: {body}"
        );
        assert_eq!(
            body.matches("<tr><td class=\"name\">").count(),
            if next.is_some() { 500 } else { 1 }
        );
    }

    let shots = dir.path().join("screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let overview = headless(dir.path(), &format!("http://{web}/"), &["--dump-dom"]);
    for section in ["members", "mounts", "tiers", "loads", "uploads"] {
        assert!(
            overview.contains(&format!("<section id=\"{section}\">")),
            "no {section}: {overview}"
        );
    }
    assert!(
        overview.contains("<span id=\"role\">single node</span>"),
        "{overview}"
    );
    let mount = row_of(&overview, ">/data</a>");
    assert!(
        mount.contains(">/data</a>") && mount.contains(&uri),
        "the mount row: {mount}"
    );
    assert!(row_of(&overview, "this node").contains(">live<"));
    assert!(row_of(&overview, "<td>memory</td>").contains("<meter"));
    let load = row_of(&overview, "/data/more");
    assert!(
        load.contains(">done<") && load.contains("(1 file)"),
        "{load}"
    );
    let upload = row_of(&overview, "/data/out.txt");
    assert!(upload.contains("pending"), "{upload}");

    let browse_url = format!("http://{web}/browse?path=/data/imgs");
    let dom = headless(dir.path(), &browse_url, &["--dump-dom"]);
    let a = row_of(&dom, ">a.bin<");
    assert!(
        a.contains("data-fraction=\"1.0000\"") && a.contains("100.0 %"),
        "a.bin is cached whole: {a}"
    );
    let c = row_of(&dom, ">c.bin<");
    assert!(
        c.contains("data-fraction=\"0.0000\"") && c.contains("0.0 %"),
        "c.bin is not cached: {c}"
    );
    // The odd name arrives as text, escaped (the DOM serialiser escapes < > & in text).
    assert!(
        dom.contains(">b &lt;&amp;&gt; \"q\".bin<"),
        "the odd name as text: {dom}"
    );
    assert!(!dom.contains("<&>"), "an unescaped name: {dom}");
    // Directories link to their own browse view, through the breadcrumb too.
    let root = headless(
        dir.path(),
        &format!("http://{web}/browse?path=/data"),
        &["--dump-dom"],
    );
    assert!(
        root.contains("href=\"/browse?path=/data/imgs\"") && root.contains(">imgs/</a>"),
        "{root}"
    );
    assert!(root.contains("href=\"/browse?path=/\""), "{root}");

    // Screenshots of both views, as a person would see them.
    for (name, url) in [
        ("overview", format!("http://{web}/")),
        ("browse", browse_url),
    ] {
        let png = shots.join(format!("{name}.png"));
        headless(
            dir.path(),
            &url,
            &[&format!("--screenshot={}", png.display())],
        );
        let bytes = std::fs::read(&png).unwrap_or_else(|e| panic!("no screenshot {name}: {e}"));
        assert!(
            bytes.starts_with(b"\x89PNG\r\n\x1a\n"),
            "{name}.png is a PNG"
        );
    }

    // A missing path and a bad one are answered as pages, with their status.
    assert_eq!(http(&web, "GET", "/browse?path=/data/nope").0, 404);
    assert_eq!(http(&web, "GET", "/browse?path=/data/../etc").0, 400);
    assert_eq!(http(&web, "GET", "/browse?path=%ff").0, 400);
    assert_eq!(
        http(&web, "GET", "/metrics").0,
        404,
        "metrics have their own port"
    );
    silt.stop();
}

/// Every role serves its endpoints: two static workers and a cluster client. The workers time
/// the reads they serve, the client labels its reads as from workers, both count the
/// members; the pages list the members, and one killed shows as down.
#[test]
fn workers_and_a_cluster_client_serve_metrics_and_pages() {
    let src = tempfile::tempdir().unwrap();
    let files: Vec<(String, Vec<u8>)> = (0..8)
        .map(|i| {
            (
                format!("set/f{i}.bin"),
                bytes(50 + i, 300_000 + i as usize * 1000),
            )
        })
        .collect();
    write_local(src.path(), &files);
    let uri = format!("file://{}", src.path().display());
    let dir = tempfile::tempdir().unwrap();
    let ports = free_ports(2);
    let list = format!("a=127.0.0.1:{},b=127.0.0.1:{}", ports[0], ports[1]);
    let ops_args = [
        "--metrics-listen",
        "127.0.0.1:0",
        "--web-listen",
        "127.0.0.1:0",
    ];
    let mut workers: Vec<Silt> = ["a", "b"]
        .iter()
        .zip(&ports)
        .map(|(id, port)| {
            let state = dir.path().join(id);
            let mut cmd = Command::new(SILT);
            cmd.arg("worker")
                .args(["--workers", &list, "--mount", &format!("/data={uri}")])
                .args(["--worker-id", id, "--listen", &format!("127.0.0.1:{port}")])
                .args(["--state-dir", state.to_str().unwrap()])
                .args(ops_args);
            Silt::spawn(cmd, None, &state).unwrap_or_else(|e| panic!("worker {id}: {e}"))
        })
        .collect();
    // A static cluster shares no mount table: every member is given it.
    let mut client_args = vec!["--workers", &list];
    client_args.extend(ops_args);
    let client =
        Silt::up(&[("/data", &uri)], &client_args, dir.path()).unwrap_or_else(|e| panic!("{e}"));
    for (p, b) in &files {
        assert!(
            std::fs::read(client.path(&format!("data/{p}"))).unwrap() == *b,
            "{p}"
        );
    }

    let mut served = 0.0;
    for w in &workers {
        let m = scrape(&printed_addr(w, "metrics"));
        assert_eq!(
            m.get(
                "silt_info",
                &[("version", env!("CARGO_PKG_VERSION")), ("role", "worker")]
            ),
            1.0
        );
        assert_eq!(m.get("silt_cluster_members", &[]), 2.0);
        assert!(m.types.contains_key("silt_worker_rpc_seconds"));
        served += m.get("silt_worker_rpc_seconds_count", &[("op", "read")]);
        assert_eq!(
            m.get("silt_mount_info", &[("mount", "/data"), ("store", &uri)]),
            1.0
        );
    }
    assert!(served >= 1.0, "the workers timed no read");
    let c = scrape(&printed_addr(&client, "metrics"));
    assert!(c.get("silt_client_read_seconds_count", &[("source", "worker")]) >= 1.0);
    assert_eq!(
        c.get("silt_client_read_seconds_count", &[("source", "store")]),
        0.0
    );
    assert_eq!(c.get("silt_cluster_members", &[]), 2.0);
    assert_eq!(c.get("silt_cluster_members_suspect", &[]), 0.0);
    assert_eq!(
        c.get(
            "silt_info",
            &[
                ("version", env!("CARGO_PKG_VERSION")),
                ("role", "cluster client")
            ]
        ),
        1.0
    );

    // A worker's page lists both members, live.
    let (status, _, page) = http(&printed_addr(&workers[0], "web page"), "GET", "/");
    assert_eq!(status, 200);
    for id in ["a", "b"] {
        let row = row_of(&page, &format!("<tr><td>{id}</td>"));
        assert!(row.contains(">live<"), "{row}");
    }
    // With b killed, the client's page shows it down (a static list keeps it a member).
    workers.pop().unwrap().kill();
    let (status, _, page) = http(&printed_addr(&client, "web page"), "GET", "/");
    assert_eq!(status, 200);
    assert!(row_of(&page, "<tr><td>a</td>").contains(">live<"));
    assert!(row_of(&page, "<tr><td>b</td>").contains(">down<"), "{page}");
    // The browse view asks the owners how much of each file they hold.
    let (status, _, page) = http(
        &printed_addr(&client, "web page"),
        "GET",
        "/browse?path=/data/set",
    );
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("on the workers owning it"), "{page}");
    assert!(
        row_of(&page, ">f0.bin<").contains("data-fraction="),
        "{page}"
    );
    client.stop();
    for w in workers {
        w.stop();
    }
}
