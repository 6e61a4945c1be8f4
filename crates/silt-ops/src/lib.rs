//! Operations endpoints over HTTP, served by every daemon role: the Prometheus exposition of
//! the metrics (`GET /metrics`; every name is defined in `silt_common::metrics`) and a status
//! page rendered on the server (`GET /`, `GET /browse?path=...`: plain HTML and CSS, no
//! script, nothing to build at install), plus `GET /healthz` on either listener.
//!
//! The two endpoints have their own options (`metrics_listen`, `web_listen`) so metrics can
//! be exposed to a scraper while the page stays on loopback; given the same address they
//! share one listener. The server is a few lines of hyper (already in the tree for the S3
//! gateway) with a bound on open connections and on the time to send a request head.

mod html;
mod loads;
mod prom;
mod web;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, ALLOW, CACHE_CONTROL, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use silt_common::config::{Config, DEFAULT_METRICS_LISTEN, DEFAULT_WEB_LISTEN};
use silt_common::{Error, Result};
use silt_node::Node;
use tokio::net::TcpListener;
use tracing::{debug, info, warn};

pub use loads::{Load, Loads};
pub use prom::exposition;

/// What the endpoints show of one daemon.
pub struct Ops {
    /// The client (and cluster) of this process; `None` in a role without one (the CSI
    /// plugin), which serves its metrics only.
    pub node: Option<Node>,
    /// Its role, as `silt_info` and the page name it (the node's role, or `gateway`).
    pub role: String,
    pub started: SystemTime,
    /// Loads run through this process (`silt load`), newest last.
    pub loads: Arc<Loads>,
    /// Where the namespace is mounted, if this process has a FUSE mount.
    pub mountpoint: Option<PathBuf>,
    /// Gauges this role keeps itself (unlabelled), exported beside the rest.
    pub gauges: Vec<ProcessGauge>,
}

/// A gauge's definition and the value a role keeps for it.
pub type ProcessGauge = (
    &'static silt_common::metrics::GaugeDef,
    &'static silt_common::metrics::Gauge,
);

impl Ops {
    pub fn new(node: Node, role: impl Into<String>) -> Ops {
        Ops {
            node: Some(node),
            role: role.into(),
            started: SystemTime::now(),
            loads: Arc::new(Loads::default()),
            mountpoint: None,
            gauges: Vec::new(),
        }
    }

    /// A role without a client (the CSI plugin): its counters, histograms and `gauges`.
    pub fn process(role: impl Into<String>, gauges: Vec<ProcessGauge>) -> Ops {
        Ops {
            node: None,
            role: role.into(),
            started: SystemTime::now(),
            loads: Arc::new(Loads::default()),
            mountpoint: None,
            gauges,
        }
    }

    pub fn with_mountpoint(mut self, mountpoint: PathBuf) -> Ops {
        self.mountpoint = Some(mountpoint);
        self
    }

    pub fn with_loads(mut self, loads: Arc<Loads>) -> Ops {
        self.loads = loads;
        self
    }
}

/// Which endpoints one listener serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoints {
    pub metrics: bool,
    pub web: bool,
}

/// Where the endpoints ended up listening (port 0 resolved); `None`: not served.
#[derive(Debug, Clone, Default)]
pub struct Listening {
    pub metrics: Option<SocketAddr>,
    pub web: Option<SocketAddr>,
}

impl Listening {
    /// The lines a daemon prints on stderr, as it does for its other listeners.
    pub fn announce(&self) -> Vec<String> {
        let mut lines = Vec::new();
        if let Some(a) = self.metrics {
            lines.push(format!("silt: metrics at http://{a}/metrics"));
        }
        if let Some(a) = self.web {
            lines.push(format!("silt: web page at http://{a}/"));
        }
        lines
    }
}

/// Most connections served at once per listener; more wait to be accepted.
const MAX_CONNECTIONS: usize = 64;
/// Longest a client may take to send a request head (a stalled client holds a connection).
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Binds the endpoints `cfg` asks for (`default_on`: whether `auto` means on for this role)
/// and serves them on `rt` until it stops. An address given explicitly that cannot be bound
/// fails the start; the `auto` default that cannot (its port taken: another daemon on this
/// host) is skipped with a warning, so the daemon starts without it.
pub fn start(
    cfg: &Config,
    default_on: bool,
    ops: Arc<Ops>,
    rt: &tokio::runtime::Runtime,
) -> Result<Listening> {
    let metrics = cfg
        .metrics_listen
        .resolve(default_on, DEFAULT_METRICS_LISTEN);
    let web = cfg.web_listen.resolve(default_on, DEFAULT_WEB_LISTEN);
    let mut plan: Vec<((String, bool), Endpoints)> = Vec::new();
    match (metrics, web) {
        // The same address (not "any port"): one listener for both.
        (Some(m), Some(w)) if m.0 == w.0 && !m.0.ends_with(":0") => {
            let explicit = m.1 || w.1;
            plan.push((
                (m.0, explicit),
                Endpoints {
                    metrics: true,
                    web: true,
                },
            ));
        }
        (m, w) => {
            if let Some(m) = m {
                plan.push((
                    m,
                    Endpoints {
                        metrics: true,
                        web: false,
                    },
                ));
            }
            if let Some(w) = w {
                plan.push((
                    w,
                    Endpoints {
                        metrics: false,
                        web: true,
                    },
                ));
            }
        }
    }
    let mut out = Listening::default();
    for ((addr, explicit), what) in plan {
        let listener = match rt.block_on(TcpListener::bind(&addr)) {
            Ok(l) => l,
            Err(e) if !explicit => {
                warn!(%addr, error = %e, "not serving {} (the default address is not free; give --{} to choose one)", what.describe(), what.flag());
                continue;
            }
            Err(e) => {
                return Err(Error::from(e).context(format!(
                    "{} {addr} ({})",
                    what.flag(),
                    what.describe()
                )))
            }
        };
        let bound = listener
            .local_addr()
            .map_err(|e| Error::from(e).context(format!("{} address", what.flag())))?;
        info!(addr = %bound, metrics = what.metrics, web = what.web, "operations endpoint listening");
        if what.metrics {
            out.metrics = Some(bound);
        }
        if what.web {
            out.web = Some(bound);
        }
        rt.spawn(serve(listener, ops.clone(), what));
    }
    Ok(out)
}

impl Endpoints {
    fn describe(&self) -> &'static str {
        match (self.metrics, self.web) {
            (true, true) => "metrics and the web page",
            (true, false) => "metrics",
            _ => "the web page",
        }
    }

    fn flag(&self) -> &'static str {
        if self.metrics {
            "metrics-listen"
        } else {
            "web-listen"
        }
    }
}

/// Serves `what` on `listener` until the runtime stops.
pub async fn serve(listener: TcpListener, ops: Arc<Ops>, what: Endpoints) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                // Out of descriptors and the like: back off instead of spinning.
                warn!("accept on the operations endpoint failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let ops = ops.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let ops = ops.clone();
                async move { Ok::<_, Infallible>(route(&ops, what, req).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), svc);
            if let Err(e) = conn.await {
                debug!("operations connection ended: {e}");
            }
            drop(permit);
        });
    }
}

type Body = Full<Bytes>;

fn respond(status: StatusCode, content_type: &'static str, body: String) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    // Everything here is a view of this moment.
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    r
}

const TEXT: &str = "text/plain; charset=utf-8";
const HTML: &str = "text/html; charset=utf-8";

fn html_response(status: StatusCode, body: String) -> Response<Body> {
    let mut r = respond(status, HTML, body);
    // No script and nothing from elsewhere: names from the namespace can do nothing here
    // even if escaping ever missed one.
    r.headers_mut().insert(
        "content-security-policy",
        HeaderValue::from_static("default-src 'none'; style-src 'unsafe-inline'"),
    );
    r
}

async fn route<B>(ops: &Ops, what: Endpoints, req: Request<B>) -> Response<Body> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = respond(
            StatusCode::METHOD_NOT_ALLOWED,
            TEXT,
            "only GET and HEAD\n".into(),
        );
        r.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    let query = req.uri().query().unwrap_or("");
    match req.uri().path() {
        "/metrics" if what.metrics => respond(
            StatusCode::OK,
            silt_common::metrics::EXPOSITION_CONTENT_TYPE,
            exposition(ops),
        ),
        "/healthz" => respond(StatusCode::OK, TEXT, "ok\n".into()),
        "/" if what.web => match &ops.node {
            Some(node) => html_response(StatusCode::OK, web::overview(ops, node).await),
            None => respond(
                StatusCode::NOT_FOUND,
                TEXT,
                "no status page in this role\n".into(),
            ),
        },
        "/browse" if what.web => match &ops.node {
            Some(node) => {
                let (status, body) = web::browse(ops, node, query).await;
                html_response(status, body)
            }
            None => respond(
                StatusCode::NOT_FOUND,
                TEXT,
                "no namespace in this role\n".into(),
            ),
        },
        "/" => respond(
            StatusCode::OK,
            TEXT,
            "Silt: metrics at /metrics (the web page has its own address: web_listen)\n".into(),
        ),
        _ => respond(StatusCode::NOT_FOUND, TEXT, "not found\n".into()),
    }
}
