//! The status page: rendered on the server from this process's client, one request at a
//! time, as plain HTML with a little inline CSS (no script: the page is complete as served
//! and works in any browser, `curl` or a headless one).

use std::fmt::Write as _;
use std::time::SystemTime;

use hyper::StatusCode;
use silt_common::config::normalize_ns_path;
use silt_common::metrics;
use silt_common::size::format_size;
use silt_common::ErrorKind;
use silt_ufs::EntryKind;

use silt_node::Node;

use crate::html::{esc, href_path, query_value};
use crate::Ops;

/// Entries shown per page of the browse view.
const BROWSE_PAGE: usize = 500;
/// Pending uploads listed on the overview (the count is always shown).
const UPLOADS_SHOWN: usize = 100;

const STYLE: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1d2733;background:#f6f7f9}\
header{background:#23303f;color:#fff;padding:10px 20px;display:flex;gap:16px;align-items:baseline}\
header h1{font-size:18px;margin:0}header a{color:#cfe3ff;margin-right:12px}\
main{padding:8px 20px}section{background:#fff;border:1px solid #dde2e8;border-radius:6px;padding:8px 14px;margin:12px 0}\
h2{font-size:15px;margin:4px 0 8px}table{border-collapse:collapse;width:100%}\
th,td{text-align:left;padding:3px 8px;border-bottom:1px solid #eef1f4;vertical-align:middle}\
th{font-weight:600;color:#556}td.n{text-align:right;font-variant-numeric:tabular-nums}\
.live{color:#137333}.down{color:#b3261e;font-weight:600}.muted{color:#778}\
meter,progress{width:120px;vertical-align:middle}footer{color:#778;padding:8px 20px 20px}\
code{background:#eef1f4;padding:0 3px;border-radius:3px}";

fn page(ops: &Ops, title: &str, body: &str) -> String {
    let now = SystemTime::now();
    let up = now
        .duration_since(ops.started)
        .map(|d| humantime::format_duration(std::time::Duration::from_secs(d.as_secs())))
        .map_or_else(|_| "?".to_string(), |d| d.to_string());
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>{title} · Silt</title><style>{STYLE}</style></head><body>\
         <header><h1>Silt</h1><span id=\"role\">{role}</span>\
         <nav><a href=\"/\">Overview</a><a href=\"/browse?path=/\">Browse</a></nav></header>\
         <main>{body}</main><footer>silt {version} · started {started} (up {up}) · \
         this page shows the moment it was rendered, {rendered}</footer></body></html>\n",
        title = esc(title),
        role = esc(&ops.role),
        version = env!("CARGO_PKG_VERSION"),
        started = humantime::format_rfc3339_seconds(ops.started),
        rendered = humantime::format_rfc3339_seconds(now),
    )
}

fn pct(f: f64) -> String {
    format!("{:.1} %", f * 100.0)
}

fn meter(f: f64) -> String {
    format!(
        "<meter min=\"0\" max=\"1\" value=\"{:.4}\"></meter>",
        f.clamp(0.0, 1.0)
    )
}

/// `n` and the noun for it: "1 file", "2 files".
fn count(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// `GET /`: members, mounts, tiers, loads, pending uploads.
pub async fn overview(ops: &Ops, node: &Node) -> String {
    let mut b = String::new();
    let client = &node.client;
    let hits = metrics::PAGE_HITS.get();
    let misses = metrics::PAGE_MISSES.get();
    let _ = write!(
        b,
        "<section id=\"summary\"><h2>This process</h2><p>Role <b>{role}</b>{mount}. \
         Hit ratio <b>{hr}</b> ({hits} page hits, {misses} misses). Bytes served from memory \
         {mem}, disk {disk}, under-stores {ufs}, resident files {res}.</p></section>",
        role = esc(&ops.role),
        mount = match &ops.mountpoint {
            Some(m) => format!(
                ", namespace mounted at <code>{}</code>",
                esc(&m.display().to_string())
            ),
            None => String::new(),
        },
        hr = pct(ratio(hits, hits + misses)),
        mem = format_size(metrics::READ_BYTES_MEMORY.get()),
        disk = format_size(metrics::READ_BYTES_DISK.get()),
        ufs = format_size(metrics::READ_BYTES_UFS.get()),
        res = format_size(metrics::READ_BYTES_RESIDENT.get()),
    );
    members(node, &mut b).await;

    b.push_str(
        "<section id=\"mounts\"><h2>Mounts</h2><table><tr><th>Path</th><th>Under-store</th></tr>",
    );
    for m in silt_node::client_mounts(client) {
        let _ = write!(
            b,
            "<tr><td><a href=\"{}\">{}</a></td><td><code>{}</code></td></tr>",
            esc(&href_path(&m.path)),
            esc(&m.path),
            esc(&m.uri)
        );
    }
    b.push_str("</table></section>");

    let stats = client.cache_stats();
    b.push_str(
        "<section id=\"tiers\"><h2>Cache tiers of this process</h2><table><tr><th>Tier</th>\
         <th>Directory</th><th>Capacity</th><th>Used</th><th></th><th>Pages</th></tr>",
    );
    for t in &stats.tiers {
        let _ = write!(
            b,
            "<tr><td>{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{} ({})</td>\
             <td>{}</td><td class=\"n\">{}</td></tr>",
            esc(&t.name),
            t.dir.as_ref().map_or_else(
                || "—".to_string(),
                |d| esc(&d.display().to_string()).to_string()
            ),
            format_size(t.capacity),
            format_size(t.used),
            pct(ratio(t.used, t.capacity)),
            meter(ratio(t.used, t.capacity)),
            t.pages
        );
    }
    let _ = write!(
        b,
        "</table><p class=\"muted\">{} pinned by users; {} pages being fetched now.</p>",
        format_size(stats.pinned_bytes),
        client.fetches_in_flight()
    );
    if let Some(w) = client.write_stats() {
        let _ = write!(
            b,
            "<p>Written data: {} in memory of {} (peak {}), {} spilled to disk; \
             {} cache-only files ({}).</p>",
            format_size(w.arena.memory_used),
            format_size(w.arena.memory_ceiling),
            format_size(w.arena.memory_peak),
            format_size(w.arena.spilled),
            w.cache_only_files,
            format_size(w.cache_only_bytes)
        );
    }
    b.push_str("</section>");

    loads(ops, &mut b);
    uploads(node, &mut b);
    page(ops, "Overview", &b)
}

/// Every member with liveness, capacity, usage and hit ratio: the cluster's workers (each
/// asked for its statistics, within `worker_timeout`), or this single node itself.
async fn members(node: &Node, b: &mut String) {
    b.push_str(
        "<section id=\"members\"><h2>Cluster members</h2><table><tr><th>Worker</th>\
         <th>Address</th><th>State</th><th>Capacity</th><th>Used</th><th></th>\
         <th>Hit ratio</th><th>Served</th></tr>",
    );
    let Some(router) = &node.cluster else {
        let st = node.client.cache_stats();
        // The process-wide counters, as in the summary and `silt report`.
        let (hits, misses) = (metrics::PAGE_HITS.get(), metrics::PAGE_MISSES.get());
        let capacity: u64 = st.tiers.iter().map(|t| t.capacity).sum();
        let used: u64 = st.tiers.iter().map(|t| t.used).sum();
        let _ = write!(
            b,
            "<tr><td>this node</td><td class=\"muted\">in process</td><td class=\"live\">live</td>\
             <td class=\"n\">{}</td><td class=\"n\">{} ({})</td><td>{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td></tr></table><p class=\"muted\">A single node: its own \
             only worker.</p></section>",
            format_size(capacity),
            format_size(used),
            pct(ratio(used, capacity)),
            meter(ratio(used, capacity)),
            pct(ratio(hits, hits + misses)),
            format_size(
                metrics::READ_BYTES_MEMORY.get()
                    + metrics::READ_BYTES_DISK.get()
                    + metrics::READ_BYTES_UFS.get()
            ),
        );
        return;
    };
    let stats = router.worker_stats().await;
    for (m, r) in &stats {
        match r {
            Ok(st) => {
                let (cap, used) = (st.capacity, st.used);
                let _ = write!(
                    b,
                    "<tr><td>{}</td><td>{}</td><td class=\"live\">live</td><td class=\"n\">{}</td>\
                     <td class=\"n\">{} ({})</td><td>{}</td><td class=\"n\">{}</td>\
                     <td class=\"n\">{}</td></tr>",
                    esc(&m.id),
                    esc(&m.addr),
                    format_size(cap),
                    format_size(used),
                    pct(ratio(used, cap)),
                    meter(ratio(used, cap)),
                    pct(st.hit_ratio),
                    format_size(st.bytes_served),
                );
            }
            Err(e) => {
                let _ = write!(
                    b,
                    "<tr><td>{}</td><td>{}</td><td class=\"down\" title=\"{}\">down</td>\
                     <td class=\"n\">{}</td><td colspan=\"4\" class=\"muted\">{}</td></tr>",
                    esc(&m.id),
                    esc(&m.addr),
                    esc(&e.to_string()),
                    format_size(m.capacity),
                    esc(&e.to_string()),
                );
            }
        }
    }
    let _ = write!(
        b,
        "</table><p class=\"muted\">Membership: {}; {} of {} failed a call lately.</p></section>",
        esc(&router.membership().describe()),
        router.suspect_count(),
        stats.len()
    );
}

fn loads(ops: &Ops, b: &mut String) {
    let list = ops.loads.list();
    b.push_str("<section id=\"loads\"><h2>Recent loads</h2>");
    if list.is_empty() {
        b.push_str(
            "<p class=\"muted\">None yet. Loads started with <code>silt load</code> against \
             this process are listed here with their progress (a cluster's loads, on the \
             page of the process that ran them).</p></section>",
        );
        return;
    }
    b.push_str(
        "<table><tr><th>Paths</th><th>Started</th><th>State</th><th>Progress</th><th></th>\
         <th>Fetched</th><th>Already cached</th><th>Throughput</th></tr>",
    );
    for l in list.iter().rev() {
        let st = l.state();
        let done = st.bytes_done + st.bytes_cached;
        let secs = l.seconds();
        let state = match &st.outcome {
            None => "<td>running</td>".to_string(),
            Some(Ok(())) => "<td class=\"live\">done</td>".to_string(),
            Some(Err(e)) => format!("<td class=\"down\">failed: {}</td>", esc(e)),
        };
        let shown: Vec<String> = l.paths.iter().take(3).map(|p| esc(p).to_string()).collect();
        let more = l.paths.len().saturating_sub(3);
        let _ = write!(
            b,
            "<tr><td>{}{}</td><td>{}</td>{state}<td class=\"n\">{} of {} ({})</td>\
             <td><progress max=\"1\" value=\"{:.4}\"></progress></td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}/s</td></tr>",
            shown.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            },
            humantime::format_rfc3339_seconds(l.started),
            format_size(done),
            format_size(st.bytes_total),
            count(st.files_total, "file", "files"),
            ratio(done, st.bytes_total).min(1.0),
            format_size(st.bytes_done),
            format_size(st.bytes_cached),
            format_size(if secs > 0.0 {
                (st.bytes_done as f64 / secs) as u64
            } else {
                0
            }),
        );
    }
    b.push_str("</table></section>");
}

fn uploads(node: &Node, b: &mut String) {
    b.push_str("<section id=\"uploads\"><h2>Pending uploads (<code>back</code> files)</h2>");
    let states: Vec<(String, silt_client::FileState)> = node
        .client
        .persist_status("/")
        .unwrap_or_default()
        .into_iter()
        .filter(|(_, s)| {
            !matches!(
                s,
                silt_client::FileState::Unknown | silt_client::FileState::Persisted
            )
        })
        .collect();
    if states.is_empty() {
        b.push_str("<p class=\"muted\">None: every file written back is in its under-store (or nothing is written with <code>back</code>).</p></section>");
        return;
    }
    let _ = write!(
        b,
        "<p>{} waiting for upload.</p><table><tr><th>Path</th><th>State</th>\
         <th>Size</th></tr>",
        count(states.len() as u64, "file", "files")
    );
    for (path, s) in states.iter().take(UPLOADS_SHOWN) {
        let (state, size) = match s {
            silt_client::FileState::Pending { bytes } => ("pending".to_string(), *bytes),
            silt_client::FileState::Uploading { bytes } => ("uploading".to_string(), *bytes),
            silt_client::FileState::Failed { reason, attempts } => {
                (format!("failed {attempts} times, retrying: {reason}"), 0)
            }
            _ => continue,
        };
        let _ = write!(
            b,
            "<tr><td>{}</td><td>{}</td><td class=\"n\">{}</td></tr>",
            esc(path),
            esc(&state),
            if size > 0 {
                format_size(size)
            } else {
                "—".into()
            }
        );
    }
    b.push_str("</table>");
    if states.len() > UPLOADS_SHOWN {
        let _ = write!(
            b,
            "<p class=\"muted\">The first {UPLOADS_SHOWN}; <code>silt fs state /</code> lists all.</p>"
        );
    }
    b.push_str("</section>");
}

fn error_page(ops: &Ops, status: StatusCode, msg: &str) -> (StatusCode, String) {
    let body = format!(
        "<section id=\"error\"><h2>{}</h2><p>{}</p></section>",
        status,
        esc(msg)
    );
    (status, page(ops, "Error", &body))
}

/// Links to `path` and each directory above it.
fn breadcrumb(path: &str) -> String {
    let mut out = format!("<a href=\"{}\">/</a>", esc(&href_path("/")));
    let mut at = String::new();
    for part in path.split('/').filter(|p| !p.is_empty()) {
        at.push('/');
        at.push_str(part);
        let _ = write!(
            out,
            " <a href=\"{}\">{}</a> /",
            esc(&href_path(&at)),
            esc(part)
        );
    }
    out
}

/// `GET /browse?path=P[&from=N]`: the entries of directory P (or file P) with the fraction
/// of each file held in cache (this process's, and for a cluster the owning workers').
pub async fn browse(ops: &Ops, node: &Node, query: &str) -> (StatusCode, String) {
    let raw = match query_value(query, "path") {
        Ok(p) => p.unwrap_or_else(|| "/".to_string()),
        Err(e) => return error_page(ops, StatusCode::BAD_REQUEST, &e),
    };
    let Some(path) = normalize_ns_path(&raw) else {
        return error_page(
            ops,
            StatusCode::BAD_REQUEST,
            &format!("{raw:?}: a path must be absolute, without . or .."),
        );
    };
    let from = match query_value(query, "from") {
        Ok(Some(f)) => f.parse::<usize>().unwrap_or(0),
        _ => 0,
    };
    let client = &node.client;
    let entry = match client.stat(&path).await {
        Ok(e) => e,
        Err(e) => {
            let status = match e.kind() {
                ErrorKind::NotFound => StatusCode::NOT_FOUND,
                ErrorKind::InvalidInput => StatusCode::BAD_REQUEST,
                _ => StatusCode::BAD_GATEWAY,
            };
            return error_page(ops, status, &e.to_string());
        }
    };
    // The cached listing itself (shared), not a copy of it: a page shows 500 of it.
    let entries: std::sync::Arc<Vec<silt_client::Entry>> = if entry.is_dir() {
        match client.list(&path).await {
            Ok(l) => l,
            Err(e) => return error_page(ops, StatusCode::BAD_GATEWAY, &e.to_string()),
        }
    } else {
        std::sync::Arc::new(vec![entry.clone()])
    };
    let total = entries.len();
    // A `from` past the end shows the last page.
    let from = from.min(total.saturating_sub(1) / BROWSE_PAGE * BROWSE_PAGE);
    let shown: Vec<&silt_client::Entry> = entries.iter().skip(from).take(BROWSE_PAGE).collect();
    let files: Vec<String> = shown
        .iter()
        .filter(|e| e.kind == EntryKind::File)
        .map(|e| e.path.clone())
        .collect();
    let mut fractions = node.residency(&files).await.into_iter();

    let mut b = format!(
        "<section id=\"browse\"><h2>{}</h2><p class=\"muted\">{}{}. Cached: the \
         fraction of a file's pages held in cache{}.</p><table><tr><th>Name</th><th>Type</th>\
         <th>Size</th><th>Cached</th><th></th><th>Modified</th></tr>",
        breadcrumb(&path),
        count(total as u64, "entry", "entries"),
        if total > BROWSE_PAGE {
            format!(", {}–{} shown", from + 1, (from + BROWSE_PAGE).min(total))
        } else {
            String::new()
        },
        if node.cluster.is_some() {
            " (here or on the workers owning it)"
        } else {
            ""
        }
    );
    for e in shown {
        let name = e.name();
        let name_cell = if e.is_dir() {
            format!(
                "<a href=\"{}\">{}/</a>",
                esc(&href_path(&e.path)),
                esc(name)
            )
        } else {
            esc(name).to_string()
        };
        let (kind, cached) = match e.kind {
            EntryKind::Dir => ("directory", None),
            EntryKind::Symlink => ("link", None),
            EntryKind::Special(_) => ("special", None),
            EntryKind::File => ("file", fractions.next().flatten()),
        };
        let cached_cells = match cached {
            Some(f) => format!(
                "<td class=\"n cached\" data-fraction=\"{f:.4}\">{}</td><td>{}</td>",
                pct(f),
                meter(f)
            ),
            None => "<td class=\"muted\">—</td><td></td>".to_string(),
        };
        let mtime = e
            .mtime
            .map(|t| humantime::format_rfc3339_seconds(t).to_string())
            .unwrap_or_default();
        let _ = write!(
            b,
            "<tr><td class=\"name\">{name_cell}</td><td>{kind}</td><td class=\"n\">{}</td>\
             {cached_cells}<td>{mtime}</td></tr>",
            if e.is_dir() {
                String::new()
            } else {
                format_size(e.size)
            },
        );
    }
    b.push_str("</table>");
    let mut links = Vec::new();
    if from > 0 {
        links.push(format!(
            "<a href=\"{}&amp;from={}\">previous {}</a>",
            esc(&href_path(&path)),
            from.saturating_sub(BROWSE_PAGE),
            BROWSE_PAGE
        ));
    }
    if from + BROWSE_PAGE < total {
        links.push(format!(
            "<a href=\"{}&amp;from={}\">next {}</a>",
            esc(&href_path(&path)),
            from + BROWSE_PAGE,
            BROWSE_PAGE
        ));
    }
    if !links.is_empty() {
        let _ = write!(b, "<p>{}</p>", links.join(" · "));
    }
    b.push_str("</section>");
    (StatusCode::OK, page(ops, &path, &b))
}
