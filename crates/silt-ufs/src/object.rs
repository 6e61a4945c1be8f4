//! Under-stores for Google Cloud Storage (`gs://`), Azure Blob Storage (`azblob://`) and HDFS
//! over WebHDFS (`webhdfs://`), through OpenDAL's services.
//!
//! One [`ObjectStore`] serves all three; what differs is data ([`Service`]) set up per service
//! in `object/{gcs,azblob,webhdfs}.rs`:
//!
//! - directories: key prefixes plus `d/` marker objects (GCS, Azure: the same conventions as
//!   S3, markers keeping a directory's attributes), or the real ones (HDFS);
//! - how a read is pinned to the version asked for ([`Pin`]): the object generation (GCS
//!   `ifGenerationMatch`), the ETag (Azure `If-Match`), or the file id, size and mtime checked
//!   before and after the read (HDFS, which has no conditional requests);
//! - POSIX attributes, links and special files: in user metadata with s3fs-fuse's keys
//!   (GCS, Azure; rewritten conditionally on the version read), or HDFS's own permission,
//!   owner, group and times (no links, no special files: `Unsupported`).
//!
//! Requests are counted as every store's are (`UFS_REQUESTS`, `UFS_READ_BYTES`; times and
//! failed calls by the [`crate::Measured`] layer), under the same timeout and retry layers
//! as S3 (`S3Options::timeout`, `retries`).

mod azblob;
mod gcs;
mod uri;
mod webhdfs;

use std::ops::Range;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use opendal::layers::{RetryLayer, TimeoutLayer};
use opendal::raw::{oio, OpWrite, Service as _};
use opendal::{Buffer, HttpTransporter, Metadata, OperationContext, Operator};
use opendal_http_transport_reqwest::ReqwestTransport;
use silt_common::metrics::{UFS_READ_BYTES, UFS_REQUESTS};
use silt_common::{Error, ErrorKind, Result};
use tracing::debug;

pub use uri::{ObjectScheme, ObjectUri};

use crate::common::{
    check_timeout, debug_field, find_io_error, http_status, is_listed_dir_itself,
    is_transport_error, part_size, retry_event, root_cause, take_one, FS_WRITE_TEMP,
    PROBE_ATTEMPT_CAP, RETRY_MAX_DELAY, RETRY_MIN_DELAY, S3_ATTR_REWRITE_MAX, WRITE_PART,
};
use crate::headers::{to_user_metadata, Native};
use crate::user_meta::{
    headers_of, s3_apply_attrs, s3_meta, s3_user_metadata, secs, with_posix_metadata, S3_CTIME,
    S3_MODE, S3_MTIME, S_IFLNK,
};

/// The Azure metadata entry that holds an object's S3 headers beyond the native four (JSON).
const AZURE_HEADERS_KEY: &str = "silts3";

/// `w` (a write or writer builder) with the four headers OpenDAL sends natively.
macro_rules! native_headers {
    ($w:expr, $h:expr, $n:expr) => {{
        let mut w = $w;
        let (h, n): (&Headers, Native) = ($h, $n);
        if let (true, Some(v)) = (n.content_type, &h.content_type) {
            w = w.content_type(v);
        }
        if let (true, Some(v)) = (n.cache_control, &h.cache_control) {
            w = w.cache_control(v);
        }
        if let (true, Some(v)) = (n.content_disposition, &h.content_disposition) {
            w = w.content_disposition(v);
        }
        if let (true, Some(v)) = (n.content_encoding, &h.content_encoding) {
            w = w.content_encoding(v);
        }
        w
    }};
}
use crate::{
    normalize_path, plan_read, Capabilities, EntryKind, Headers, ObjectMeta, Posix, S3Options,
    SetAttrs, SpecialKind, UnderStore,
};
use webhdfs::{hdfs_meta, Hdfs};

/// How a service's client is set up from its URI (each service module has one).
pub(crate) type SetupFn = fn(&ObjectUri, &S3Options, &HttpTransporter) -> Result<Setup>;

/// How reads (and attribute rewrites) are tied to the version asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pin {
    /// The object's ETag, sent as `If-Match` (Azure).
    Etag,
    /// The object's generation, sent as `ifGenerationMatch` (GCS); it is the version id.
    Generation,
    /// No conditions: the version (file id, mtime) and size are checked before and after
    /// the read (HDFS).
    Checked,
}

/// What one service is, as data.
pub(crate) struct Service {
    scheme: ObjectScheme,
    /// `GCS`, `Azure Blob`, `WebHDFS`: for messages.
    label: &'static str,
    endpoint: String,
    /// `("bucket", name)` / `("container", name)`; `None` on HDFS.
    container: Option<(&'static str, String)>,
    /// Directories are key prefixes and `d/` markers (else real directories).
    markers: bool,
    pin: Pin,
    /// Error codes that say the credentials were refused.
    credential_codes: &'static [&'static str],
    /// What to say when no credentials could be found to sign with.
    no_credentials: &'static str,
    /// The namenode's REST API (HDFS only).
    hdfs: Option<Hdfs>,
}

/// What a service's set-up makes.
pub(crate) struct Setup {
    op: Operator,
    /// The service without OpenDAL's simulation layer, for what the simulation answers
    /// itself: a `d/` marker's stat (with its user metadata) and its write with metadata.
    raw: Option<Operator>,
    service: Service,
}

/// The OpenDAL root of a store under `prefix`.
fn root_of(prefix: &str) -> String {
    if prefix.is_empty() {
        "/".to_string()
    } else {
        format!("/{prefix}/")
    }
}

/// The store's operator (OpenDAL's default layers) and the same service without them (see
/// [`Setup::raw`]), each on `http`, with the timeout and retry layers of `opts`.
fn operators<B: opendal::Builder>(
    make: impl Fn() -> B,
    http: &HttpTransporter,
    opts: &S3Options,
    shown: &str,
) -> Result<(Operator, Operator)> {
    let invalid = |e: opendal::Error| Error::invalid(format!("{shown}: {}", e.message()));
    let op = Operator::new(make()).map_err(invalid)?;
    let svc = make().build().map_err(invalid)?;
    let raw = Operator::from_parts(OperationContext::default(), Arc::new(svc));
    let layered = |op: Operator| {
        op.with_context(OperationContext::new().with_http_transport(http.clone()))
            // Timeout before retry: each attempt gets its own deadline.
            .layer(
                TimeoutLayer::new()
                    .with_timeout(opts.timeout)
                    .with_io_timeout(opts.timeout),
            )
            .layer(
                RetryLayer::new()
                    .with_max_times(opts.retries)
                    .with_min_delay(RETRY_MIN_DELAY)
                    .with_max_delay(RETRY_MAX_DELAY)
                    .with_jitter()
                    .with_notify(retry_event),
            )
    };
    Ok((layered(op), layered(raw)))
}

/// A GCS, Azure Blob or WebHDFS under-store (see the module docs).
pub struct ObjectStore {
    op: Operator,
    raw: Option<Operator>,
    /// The operator's HTTP client, for the namenode requests OpenDAL does not make.
    http: HttpTransporter,
    svc: Service,
    uri: String,
    timeout: Duration,
    retries: usize,
    list_page: usize,
}

impl ObjectStore {
    /// Builds the store `uri` names, without checking that it is reachable (see
    /// [`ObjectStore::verify`] and [`crate::open_store`]). `opts` gives the request timeout,
    /// retries and listing page size (its S3 endpoint and keys are not used).
    pub fn open(uri: &ObjectUri, opts: &S3Options) -> Result<ObjectStore> {
        check_timeout(opts.timeout)?;
        normalize_path(&uri.prefix)?;
        let http = HttpTransporter::new(ReqwestTransport::default());
        let setup = (uri.scheme.info().setup)(uri, opts, &http)?;
        Ok(ObjectStore {
            op: setup.op,
            raw: setup.raw,
            http,
            svc: setup.service,
            uri: uri.to_string(),
            timeout: opts.timeout,
            retries: opts.retries,
            list_page: opts.list_page.max(1),
        })
    }

    /// The service this store talks to.
    pub fn scheme(&self) -> ObjectScheme {
        self.svc.scheme
    }

    /// The underlying operator (root = the store root).
    pub fn operator(&self) -> &Operator {
        &self.op
    }

    /// Checks that the store is usable within a bounded time: one listing of at most one key
    /// (GCS, Azure), the root directory's status (HDFS). A missing bucket, container or
    /// directory is `NotFound`, refused credentials `PermissionDenied`, an endpoint that
    /// cannot be reached `Unavailable`, no answer in time `Timeout`: one line each.
    pub async fn verify(&self) -> Result<()> {
        let attempt = self.timeout.min(PROBE_ATTEMPT_CAP);
        let deadline = attempt * (self.retries.min(100) as u32 + 1) + Duration::from_secs(1);
        let probe = async {
            if self.svc.hdfs.is_some() {
                return match self.hdfs_status("").await {
                    Ok(Some(st)) if st.kind == "DIRECTORY" => Ok(()),
                    Ok(Some(_)) => Err(Error::new(
                        ErrorKind::NotADirectory,
                        format!("{}: the root is a file, not a directory", self.uri),
                    )),
                    Ok(None) => Err(Error::not_found(format!(
                        "{}: HDFS directory {} does not exist at {}",
                        self.uri,
                        self.hdfs_abs(""),
                        self.where_()
                    ))),
                    Err(e) => Err(e),
                };
            }
            UFS_REQUESTS.inc();
            let listed = async {
                let mut lister = self.op.lister_with("/").await?;
                match lister.next().await {
                    Some(Err(e)) => Err(e),
                    _ => Ok(()),
                }
            };
            match listed.await {
                Ok(()) => Ok(()),
                // Listing a prefix never finds nothing: the bucket or container is missing.
                Err(e) if e.kind() == opendal::ErrorKind::NotFound => {
                    let (word, name) = self
                        .svc
                        .container
                        .clone()
                        .unwrap_or(("store", String::new()));
                    Err(Error::not_found(format!(
                        "{}: {word} {name} does not exist at {}",
                        self.uri,
                        self.where_()
                    ))
                    .with_source(e))
                }
                Err(e) => Err(self.map_err("open", "", e)),
            }
        };
        match tokio::time::timeout(deadline, probe).await {
            Ok(r) => r,
            Err(_) => Err(Error::new(
                ErrorKind::Timeout,
                format!(
                    "{}: {} did not answer within {deadline:?}",
                    self.uri,
                    self.where_()
                ),
            )),
        }
    }

    /// `uri/path` for messages (the URI without its options).
    fn full(&self, path: &str) -> String {
        let base = self.uri.split('?').next().unwrap_or(&self.uri);
        if path.is_empty() {
            base.to_string()
        } else {
            format!("{base}/{path}")
        }
    }

    fn where_(&self) -> String {
        format!("{} endpoint {}", self.svc.label, self.svc.endpoint)
    }

    fn map_err(&self, op: &str, path: &str, e: opendal::Error) -> Error {
        let full = self.full(path);
        let (kind, detail) = self.classify(&e);
        debug!(op, path = %full, kind = %kind, error = %e, "under-store request failed");
        Error::new(kind, format!("{op} {full}: {detail}")).with_source(e)
    }

    /// A short detail of a service's error answer: its code and message where the body has
    /// them (XML `<Code>`/`<Message>`, JSON `"message"`), else the HTTP status.
    fn detail(&self, e: &opendal::Error) -> (String, String) {
        let msg = e.message();
        let between = |open: &str, close: &str| -> Option<String> {
            let start = msg.find(open)? + open.len();
            let len = msg[start..].find(close)?;
            Some(msg[start..start + len].to_string())
        };
        let code = between("<Code>", "</Code>")
            .or_else(|| between("\"reason\":\"", "\""))
            .or_else(|| debug_field(msg, "code").map(str::to_string))
            .unwrap_or_default();
        let text = between("<Message>", "</Message>")
            .or_else(|| between("\"message\":\"", "\""))
            .map(|m| {
                m.lines()
                    .next()
                    .unwrap_or("")
                    .chars()
                    .take(200)
                    .collect::<String>()
            });
        let detail = match (code.is_empty(), text, http_status(e)) {
            (false, Some(t), _) => format!("{code}: {t}"),
            (false, None, _) => code.clone(),
            (true, Some(t), _) => t,
            (true, None, Some(s)) => format!("HTTP {s}"),
            (true, None, None) => e.kind().to_string(),
        };
        (code, detail)
    }

    fn classify(&self, e: &opendal::Error) -> (ErrorKind, String) {
        use opendal::ErrorKind as O;
        let where_ = self.where_();
        // The namenode names its exception (a safe mode's refusal is a 403, as a denial is).
        if self.svc.hdfs.is_some() {
            if let Some((kind, detail)) = webhdfs::opendal_remote_error(e) {
                let detail = match kind {
                    ErrorKind::PermissionDenied => format!("access denied by {where_}: {detail}"),
                    ErrorKind::Unavailable => format!("{where_} refused for now: {detail}"),
                    _ => detail,
                };
                return (kind, detail);
            }
        }
        let (code, detail) = self.detail(e);
        if self.svc.credential_codes.contains(&code.as_str()) || http_status(e) == Some(401) {
            return (
                ErrorKind::PermissionDenied,
                format!("credentials refused by {where_}: {detail}"),
            );
        }
        match e.kind() {
            O::NotFound => (ErrorKind::NotFound, "not found".to_string()),
            O::PermissionDenied => (
                ErrorKind::PermissionDenied,
                format!("access denied by {where_}: {detail}"),
            ),
            O::ConditionNotMatch => (
                ErrorKind::ContentChanged,
                "the object changed since its metadata was read".to_string(),
            ),
            O::RateLimited => (
                ErrorKind::RateLimited,
                format!("{where_} asked to slow down: {detail}"),
            ),
            O::IsADirectory => (ErrorKind::IsADirectory, "is a directory".to_string()),
            O::NotADirectory => (ErrorKind::NotADirectory, "not a directory".to_string()),
            O::AlreadyExists => (ErrorKind::AlreadyExists, "already exists".to_string()),
            O::Unsupported => (ErrorKind::Unsupported, e.message().to_string()),
            O::RangeNotSatisfied | O::ConfigInvalid => (ErrorKind::InvalidInput, detail),
            O::Conflict => (ErrorKind::Unavailable, detail),
            _ => {
                let msg = e.message();
                if msg.contains("timeout reached") {
                    return (
                        ErrorKind::Timeout,
                        format!("no answer from {where_} within {:?}", self.timeout),
                    );
                }
                if msg.contains("signing") || msg.contains("credential") {
                    return (
                        ErrorKind::PermissionDenied,
                        self.svc.no_credentials.to_string(),
                    );
                }
                if is_transport_error(msg) {
                    let kind = match find_io_error(e).map(|io| io.kind()) {
                        Some(std::io::ErrorKind::TimedOut) => ErrorKind::Timeout,
                        _ => ErrorKind::Unavailable,
                    };
                    return (kind, format!("cannot reach {where_}: {}", root_cause(e)));
                }
                let status = http_status(e);
                if status.is_some_and(|s| s >= 500) || e.is_temporary() {
                    return (ErrorKind::Unavailable, format!("{where_} failed: {detail}"));
                }
                if status.is_some_and(|s| (400..500).contains(&s)) {
                    return (
                        ErrorKind::InvalidInput,
                        format!("{where_} refused the request: {detail}"),
                    );
                }
                (
                    ErrorKind::Internal,
                    format!("{where_}: {}: {detail}", e.kind()),
                )
            }
        }
    }

    /// OpenDAL trims white space from both ends of every path: such a name would reach
    /// another object. Refused for writes, invisible otherwise (as on S3).
    fn unaddressable(&self, path: &str) -> bool {
        path.trim() != path
    }

    fn writable<'a>(&self, path: &'a str) -> Result<&'a str> {
        let path = normalize_path(path)?;
        if path.is_empty() {
            return Err(Error::invalid(format!(
                "write {}: cannot write the store root",
                self.full("")
            )));
        }
        if self.unaddressable(path) {
            return Err(Error::invalid(format!(
                "write {}: a name that begins or ends with white space cannot be stored \
                 through this store (docs/SEMANTICS.md)",
                self.full(path)
            )));
        }
        if !self.svc.markers
            && path
                .rsplit('/')
                .next()
                .is_some_and(|n| n.starts_with(FS_WRITE_TEMP))
        {
            return Err(Error::invalid(format!(
                "write {}: names beginning with {FS_WRITE_TEMP} are the store's own",
                self.full(path)
            )));
        }
        Ok(path)
    }

    /// An object's metadata as `stat` and `list` both report it: S3's conventions (ETag
    /// without quotes, mtime in whole seconds, attributes from user metadata), and on GCS
    /// the generation as the version id (fake and real GCS alike give every write a new
    /// one; an ETag may repeat for the same bytes).
    fn meta_of(&self, path: String, m: &Metadata) -> ObjectMeta {
        let mut meta = s3_meta(path, m);
        if self.svc.pin == Pin::Generation {
            meta.version = m.version().map(str::to_string);
        }
        meta
    }

    /// The user metadata that keeps `h` beside the four headers sent natively: as on S3 (GCS),
    /// or one JSON entry (Azure, whose metadata names must be C# identifiers).
    fn headers_metadata(&self, h: &Headers) -> Vec<(String, String)> {
        let native = Native::of(&self.op);
        if self.svc.scheme != ObjectScheme::Azblob {
            return to_user_metadata(h, native);
        }
        let rest = native.rest(h);
        match serde_json::to_string(&rest) {
            Ok(j) if !rest.is_empty() => vec![(AZURE_HEADERS_KEY.to_string(), j)],
            _ => Vec::new(),
        }
    }

    /// The inverse of [`ObjectStore::headers_metadata`], from a stat's answer.
    fn headers_from(&self, m: &Metadata) -> Headers {
        if self.svc.scheme != ObjectScheme::Azblob {
            return headers_of(m);
        }
        let rest = m
            .user_metadata()
            .and_then(|u| {
                u.into_iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case(AZURE_HEADERS_KEY))
                    .map(|(_, v)| v.to_string())
            })
            .and_then(|j| serde_json::from_str::<Headers>(&j).ok())
            .unwrap_or_default();
        let own = |v: Option<&str>| v.map(str::to_string);
        Headers {
            content_type: own(m.content_type()).or(rest.content_type.clone()),
            cache_control: own(m.cache_control()).or(rest.cache_control.clone()),
            content_disposition: own(m.content_disposition()).or(rest.content_disposition.clone()),
            content_encoding: own(m.content_encoding()).or(rest.content_encoding.clone()),
            ..rest
        }
    }

    fn entry(&self, (p, m): (String, Metadata)) -> ObjectMeta {
        if m.is_dir() {
            ObjectMeta::dir(&p)
        } else {
            self.meta_of(p, &m)
        }
    }

    async fn stat_inner(&self, path: &str) -> Result<ObjectMeta> {
        if self.svc.hdfs.is_some() {
            return match self.hdfs_status(path).await? {
                Some(st) => Ok(hdfs_meta(path, &st)),
                None => Err(Error::not_found(format!(
                    "stat {}: not found",
                    self.full(path)
                ))),
            };
        }
        if path.is_empty() {
            return Ok(ObjectMeta::dir(""));
        }
        if self.unaddressable(path) {
            return Err(Error::not_found(format!(
                "stat {}: not found (a name that begins or ends with white space cannot be \
                 reached through this store)",
                self.full(path)
            )));
        }
        UFS_REQUESTS.inc();
        match self.op.stat(path).await {
            Ok(m) if !m.is_dir() => return Ok(self.meta_of(path.to_string(), &m)),
            Ok(_) => {}
            Err(e) if e.kind() == opendal::ErrorKind::NotFound => {}
            Err(e) => return Err(self.map_err("stat", path, e)),
        }
        if let Some(dir) = self.marker(path).await? {
            return Ok(dir);
        }
        if self.prefix_exists(path).await? {
            Ok(ObjectMeta::dir(path))
        } else {
            Err(Error::not_found(format!(
                "stat {}: not found",
                self.full(path)
            )))
        }
    }

    /// The directory `path` as its `path/` marker describes it (attributes in its user
    /// metadata), or `None` without a marker. Asked of the service itself: OpenDAL's
    /// simulated stat of a directory path answers from a listing, without the metadata.
    async fn marker(&self, path: &str) -> Result<Option<ObjectMeta>> {
        let Some(raw) = &self.raw else {
            return Ok(None);
        };
        UFS_REQUESTS.inc();
        match raw.stat(&format!("{path}/")).await {
            Ok(m) => {
                let mut dir = ObjectMeta::dir(path);
                let user = m.user_metadata();
                s3_apply_attrs(&mut dir, |k| {
                    user.as_ref()?
                        .into_iter()
                        .find(|(key, _)| key.eq_ignore_ascii_case(k))
                        .map(|(_, v)| v.to_string())
                });
                Ok(Some(dir))
            }
            Err(e) if e.kind() == opendal::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.map_err("stat", path, e)),
        }
    }

    /// Writes the zero-byte marker `path/` with the user metadata `user`, through the
    /// service itself (OpenDAL's `write` takes file paths only).
    async fn put_marker(&self, path: &str, user: Vec<(String, String)>, what: &str) -> Result<()> {
        let Some(raw) = &self.raw else {
            return Err(Error::internal(format!(
                "{what} {}: no directory markers on this store",
                self.full(path)
            )));
        };
        let (ctx, srv) = raw.clone().into_parts();
        let opts = opendal::options::WriteOptions {
            user_metadata: (!user.is_empty()).then(|| user.into_iter().collect()),
            ..Default::default()
        };
        UFS_REQUESTS.inc();
        let put = async {
            let (args, _) = OpWrite::from_options(&srv.capability(), opts)?;
            let mut w = srv.write(&ctx, &format!("{path}/"), args)?;
            oio::Write::close(&mut w).await
        };
        put.await.map(drop).map_err(|e| self.map_err(what, path, e))
    }

    /// Whether at least one key starts with `path/`.
    async fn prefix_exists(&self, path: &str) -> Result<bool> {
        UFS_REQUESTS.inc();
        let mut lister = self
            .op
            .lister_with(&format!("{path}/"))
            .await
            .map_err(|e| self.map_err("stat", path, e))?;
        match lister.next().await {
            Some(Ok(_)) => Ok(true),
            Some(Err(e)) => Err(self.map_err("stat", path, e)),
            None => Ok(false),
        }
    }

    /// The entries below `dir` (listing of the `dir/` prefix), `None` past `max`.
    async fn list_entries(
        &self,
        dir: &str,
        recursive: bool,
        max: usize,
    ) -> Result<Option<Vec<(String, Metadata)>>> {
        let dir_slash = if dir.is_empty() {
            "/".to_string()
        } else {
            format!("{dir}/")
        };
        UFS_REQUESTS.inc();
        let mut lister = self
            .op
            .lister_with(&dir_slash)
            .recursive(recursive)
            .await
            .map_err(|e| self.map_err("list", dir, e))?;
        let budget = AtomicUsize::new(max);
        let mut out = Vec::new();
        let mut received = 0usize;
        while let Some(entry) = lister.next().await {
            if received > 0 && received.is_multiple_of(self.list_page) {
                UFS_REQUESTS.inc();
            }
            received += 1;
            let (p, m) = entry
                .map_err(|e| self.map_err("list", dir, e))?
                .into_parts();
            if is_listed_dir_itself(&p, &dir_slash) {
                continue;
            }
            if self.unaddressable(p.trim_end_matches('/')) {
                continue;
            }
            if !take_one(&budget) {
                return Ok(None);
            }
            out.push((p.trim_end_matches('/').to_string(), m));
        }
        Ok(Some(out))
    }

    async fn list_inner(
        &self,
        dir: &str,
        recursive: bool,
        max: usize,
    ) -> Result<Option<Vec<ObjectMeta>>> {
        if self.svc.hdfs.is_some() {
            return self.hdfs_list(dir, recursive, max).await;
        }
        let Some(entries) = self.list_entries(dir, recursive, max).await? else {
            return Ok(None);
        };
        if entries.is_empty() && !dir.is_empty() {
            // An empty listing: a file, an empty directory's marker, or nothing.
            UFS_REQUESTS.inc();
            match self.op.stat(dir).await {
                Ok(m) if !m.is_dir() => {
                    return Err(Error::new(
                        ErrorKind::NotADirectory,
                        format!("list {}: not a directory", self.full(dir)),
                    ))
                }
                Ok(_) => return Ok(Some(Vec::new())),
                Err(e) if e.kind() == opendal::ErrorKind::NotFound => {}
                Err(e) => return Err(self.map_err("list", dir, e)),
            }
            return match self.marker(dir).await? {
                Some(_) => Ok(Some(Vec::new())),
                None => Err(Error::not_found(format!(
                    "list {}: no such directory",
                    self.full(dir)
                ))),
            };
        }
        let mut all: Vec<ObjectMeta> = entries.into_iter().map(|e| self.entry(e)).collect();
        if recursive {
            // A sweep returns a directory's marker (`d/`) as the directory: once each.
            all.sort_by(|a, b| a.path.cmp(&b.path));
            all.dedup_by(|a, b| a.path == b.path && a.kind == b.kind);
        }
        Ok(Some(all))
    }

    /// The bytes `range` of the version of `path` that `expected` describes.
    async fn read_buffer(
        &self,
        path: &str,
        range: Range<u64>,
        expected: &ObjectMeta,
    ) -> Result<Buffer> {
        let Some((path, range)) = plan_read(path, &range, expected, |p| self.full(p))? else {
            return Ok(Buffer::new());
        };
        let buf = match (self.svc.pin, &expected.etag, &expected.version) {
            (Pin::Etag, Some(etag), _) => {
                UFS_REQUESTS.inc();
                self.op
                    .read_with(path)
                    .range(range)
                    .if_match(&format!("\"{etag}\""))
                    .await
                    .map_err(|e| self.map_err("read", path, e))
            }
            (Pin::Generation, _, Some(generation)) => {
                UFS_REQUESTS.inc();
                self.op
                    .read_with(path)
                    .range(range)
                    .if_version_match(generation)
                    .await
                    .map_err(|e| self.map_err("read", path, e))
            }
            _ => self.checked_read(path, range, expected).await,
        };
        // A missing object may answer a condition with 412 (Azurite does): it is gone.
        let buf = match buf {
            Err(e) if e.kind() == ErrorKind::ContentChanged && self.svc.pin != Pin::Checked => {
                match self.stat_inner(path).await {
                    Err(gone) if gone.kind() == ErrorKind::NotFound => Err(Error::not_found(
                        format!("read {}: not found", self.full(path)),
                    )),
                    _ => Err(e),
                }
            }
            r => r,
        }?;
        UFS_READ_BYTES.add(buf.len() as u64);
        Ok(buf)
    }

    /// A read guarded by the version before and after it (as `S3Store::checked_read` for an object without an ETag).
    async fn checked_read(
        &self,
        path: &str,
        range: Range<u64>,
        expected: &ObjectMeta,
    ) -> Result<Buffer> {
        let want = expected.content_fingerprint();
        let changed = || {
            Error::new(
                ErrorKind::ContentChanged,
                format!(
                    "read {}: the object changed since its metadata was read",
                    self.full(path)
                ),
            )
        };
        let before = self.stat_inner(path).await?;
        if before.kind != EntryKind::File || before.content_fingerprint() != want {
            return Err(changed());
        }
        UFS_REQUESTS.inc();
        let result = self.op.read_with(path).range(range).await;
        let after = match self.stat_inner(path).await {
            Ok(m) => m,
            Err(e) if e.kind() == ErrorKind::NotFound => return Err(changed()),
            Err(e) => return Err(e),
        };
        if after.content_fingerprint() != want {
            return Err(changed());
        }
        result.map_err(|e| self.map_err("read", path, e))
    }

    /// The metadata of the version a write just created, `size` bytes long: from the
    /// write's own answer where it names the version, else asked.
    async fn written_meta(&self, path: &str, written: &Metadata, size: u64) -> Result<ObjectMeta> {
        let named = match self.svc.pin {
            Pin::Generation => written.version().is_some(),
            Pin::Etag => written.etag().is_some(),
            Pin::Checked => false,
        };
        if named {
            Ok(ObjectMeta {
                size,
                ..self.meta_of(path.to_string(), written)
            })
        } else {
            self.stat_inner(path).await
        }
    }

    /// A whole object written from `src`, with the user metadata `user`: one request up to
    /// a part, else in parts (Azure blocks; GCS a resumable upload, conditional on the
    /// generation it replaces, retried when another writer won the race).
    async fn put_object(
        &self,
        path: &str,
        src: &dyn silt_common::io::ReadAt,
        len: u64,
        user: Option<Vec<(String, String)>>,
        headers: Option<&Headers>,
    ) -> Result<ObjectMeta> {
        let read_part = |off: u64, n: usize| {
            src.read_at(off, n).map_err(|e| {
                e.context(format!(
                    "write {}: reading the local bytes",
                    self.full(path)
                ))
            })
        };
        if len <= WRITE_PART as u64 {
            let data = read_part(0, len as usize)?;
            UFS_REQUESTS.inc();
            let mut w = self.op.write_with(path, data);
            if let Some(user) = user {
                w = w.user_metadata(user);
            }
            if let Some(h) = headers {
                w = native_headers!(w, h, Native::of(&self.op));
            }
            let written = w.await.map_err(|e| self.map_err("write", path, e))?;
            return self.written_meta(path, &written, len).await;
        }
        let part = part_size(len);
        let mut attempts = 0;
        loop {
            attempts += 1;
            let mut w = self.op.writer_with(path).chunk(part);
            if let Some(user) = &user {
                w = w.user_metadata(user.clone());
            }
            if let Some(h) = headers {
                w = native_headers!(w, h, Native::of(&self.op));
            }
            if self.svc.pin == Pin::Generation {
                // GCS's unconditional parts are XML multipart uploads, which emulators lack;
                // a resumable upload is conditional: on the generation replaced (or none).
                UFS_REQUESTS.inc();
                w = match self.op.stat(path).await {
                    Ok(m) => match m.version() {
                        Some(g) if !m.is_dir() => w.if_version_match(g),
                        _ => w,
                    },
                    Err(e) if e.kind() == opendal::ErrorKind::NotFound => w.if_not_exists(true),
                    Err(e) => return Err(self.map_err("write", path, e)),
                };
            }
            UFS_REQUESTS.add(len.div_ceil(part as u64) + 2);
            let written = async {
                let mut w = w.await?;
                let mut off = 0;
                while off < len {
                    let n = (len - off).min(part as u64) as usize;
                    let bytes = read_part(off, n).map_err(|e| {
                        opendal::Error::new(opendal::ErrorKind::Unexpected, e.to_string())
                    })?;
                    w.write(bytes).await?;
                    off += n as u64;
                }
                w.close().await
            }
            .await;
            match written {
                Ok(m) => return self.written_meta(path, &m, len).await,
                Err(e)
                    if e.kind() == opendal::ErrorKind::ConditionNotMatch
                        && self.svc.pin == Pin::Generation
                        && attempts < 5 =>
                {
                    continue
                }
                Err(e) => return Err(self.map_err("write", path, e)),
            }
        }
    }

    /// A new object `path` (a link, a special file) with `body` and the user metadata
    /// `user`, `AlreadyExists` if anything is there.
    async fn create_new(
        &self,
        path: &str,
        body: Vec<u8>,
        user: Vec<(String, String)>,
        op: &str,
    ) -> Result<ObjectMeta> {
        let exists = || {
            Error::new(
                ErrorKind::AlreadyExists,
                format!("{op} {}: already exists", self.full(path)),
            )
        };
        match self.stat_inner(path).await {
            Ok(_) => return Err(exists()),
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let size = body.len() as u64;
        UFS_REQUESTS.inc();
        let written = self
            .op
            .write_with(path, body)
            .user_metadata(user.clone())
            .if_not_exists(true)
            .await
            .map_err(|e| match self.map_err(op, path, e) {
                e if e.kind() == ErrorKind::ContentChanged => exists(),
                e => e,
            })?;
        let mut meta = self.written_meta(path, &written, size).await?;
        s3_apply_attrs(&mut meta, |k| {
            user.iter()
                .find(|(key, _)| key.eq_ignore_ascii_case(k))
                .map(|(_, v)| v.clone())
        });
        Ok(meta)
    }

    /// Attributes of an object store's file: the object rewritten (bytes unchanged) with
    /// them in its user metadata, on condition that it is still the version read; lost races
    /// retried on the new version, a few times.
    async fn obj_set_attrs(&self, path: &str, attrs: &SetAttrs) -> Result<ObjectMeta> {
        let mut attempts = 0;
        loop {
            attempts += 1;
            match self.obj_set_attrs_once(path, attrs).await {
                Err(e) if e.kind() == ErrorKind::ContentChanged && attempts < 3 => continue,
                r => return r,
            }
        }
    }

    async fn obj_set_attrs_once(&self, path: &str, attrs: &SetAttrs) -> Result<ObjectMeta> {
        let cur = self.stat_inner(path).await?;
        if cur.kind == EntryKind::Dir {
            if path.is_empty() {
                return Err(Error::new(
                    ErrorKind::Unsupported,
                    format!(
                        "set attributes of {}: the store's root keeps no attributes",
                        self.full(path)
                    ),
                ));
            }
            // A directory's marker (made for one implied by keys, as s3fs-fuse does).
            self.put_marker(path, s3_user_metadata(&cur, attrs), "set attributes")
                .await?;
            return match self.marker(path).await? {
                Some(dir) => Ok(dir),
                None => Err(Error::not_found(format!(
                    "set attributes of {}: the directory was removed meanwhile",
                    self.full(path)
                ))),
            };
        }
        if cur.size > S3_ATTR_REWRITE_MAX {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "set attributes of {}: changing them rewrites the object, and it is larger \
                     than {} MiB",
                    self.full(path),
                    S3_ATTR_REWRITE_MAX >> 20
                ),
            ));
        }
        let mut data_of = cur.clone();
        // The bytes of a link or node are read all the same.
        data_of.kind = EntryKind::File;
        // The new version keeps the object's S3 headers and user metadata (see S3Store's).
        let headers = self.headers(path, &cur).await?;
        let data = self.read_buffer(path, 0..cur.size, &data_of).await?;
        let meta = with_posix_metadata(self.headers_metadata(&headers), &cur, attrs);
        UFS_REQUESTS.inc();
        let mut w = self.op.write_with(path, data).user_metadata(meta);
        w = native_headers!(w, &headers, Native::of(&self.op));
        match (self.svc.pin, &cur.etag, &cur.version) {
            (Pin::Etag, Some(etag), _) => w = w.if_match(&format!("\"{etag}\"")),
            (Pin::Generation, _, Some(g)) => w = w.if_version_match(g),
            _ => {}
        }
        w.await
            .map_err(|e| self.map_err("set attributes", path, e))?;
        self.stat_inner(path).await
    }

    /// A server-side copy of the file `from` to `to`; the copy's metadata.
    async fn copy_file(&self, from: &str, to: &str) -> Result<ObjectMeta> {
        let src = self.stat_inner(from).await?;
        if src.kind == EntryKind::Dir {
            return Err(Error::new(
                ErrorKind::IsADirectory,
                format!(
                    "copy {}: is a directory (moved object by object by the caller)",
                    self.full(from)
                ),
            ));
        }
        if from == to {
            return Ok(src);
        }
        UFS_REQUESTS.inc();
        let copied = self
            .op
            .copy(from, to)
            .await
            .map_err(|e| self.map_err("copy", from, e))?;
        let mut meta = self.written_meta(to, &copied, src.size).await?;
        // A copy keeps the user metadata, which its answer may not repeat.
        meta.kind = src.kind;
        meta.size = src.size;
        meta.mode = meta.mode.or(src.mode);
        meta.posix = Posix {
            uid: meta.posix.uid.or(src.posix.uid),
            gid: meta.posix.gid.or(src.posix.gid),
            atime: meta.posix.atime.or(src.posix.atime),
            ctime: meta.posix.ctime.or(src.posix.ctime),
            rdev: src.posix.rdev,
            nlink: None,
        };
        meta.mtime = src.mtime.filter(|_| src.mode.is_some()).or(meta.mtime);
        Ok(meta)
    }

    async fn delete_object(&self, path: &str, what: &str) -> Result<()> {
        UFS_REQUESTS.inc();
        match self.op.delete(path).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == opendal::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(self.map_err(what, path, e)),
        }
    }
}

#[async_trait]
impl UnderStore for ObjectStore {
    fn uri(&self) -> &str {
        &self.uri
    }

    fn capabilities(&self) -> Capabilities {
        match self.svc.pin {
            // HDFS: real directories, renamed whole; no conditional reads; a write makes a
            // new file (with the attributes it is given).
            Pin::Checked => Capabilities {
                native_recursive_list: false,
                conditional_read: false,
                rename_dirs: true,
                write_replaces_attrs: true,
                list_without_attrs: false,
                long_paths: true,
            },
            // GCS, Azure: as S3 (listings carry no user metadata).
            Pin::Etag | Pin::Generation => Capabilities {
                native_recursive_list: true,
                conditional_read: true,
                rename_dirs: false,
                write_replaces_attrs: true,
                list_without_attrs: true,
                long_paths: false,
            },
        }
    }

    async fn stat(&self, path: &str) -> Result<ObjectMeta> {
        let path = normalize_path(path)?;
        self.stat_inner(path).await
    }

    async fn list(&self, dir: &str, recursive: bool) -> Result<Vec<ObjectMeta>> {
        let dir = normalize_path(dir)?;
        Ok(self
            .list_inner(dir, recursive, usize::MAX)
            .await?
            .unwrap_or_default())
    }

    async fn list_tree(&self, dir: &str, max: usize) -> Result<Option<Vec<ObjectMeta>>> {
        let dir = normalize_path(dir)?;
        self.list_inner(dir, true, max).await
    }

    async fn read(&self, path: &str, range: Range<u64>, expected: &ObjectMeta) -> Result<Bytes> {
        Ok(self.read_buffer(path, range, expected).await?.to_bytes())
    }

    async fn read_pieces(
        &self,
        path: &str,
        range: Range<u64>,
        expected: &ObjectMeta,
        piece: u64,
    ) -> Result<Vec<Bytes>> {
        // From the response's chunks straight into the pieces.
        Ok(crate::pieces(
            self.read_buffer(path, range, expected).await?,
            piece,
        ))
    }

    async fn write(&self, path: &str, data: Bytes) -> Result<ObjectMeta> {
        let len = data.len() as u64;
        self.write_from(path, &data, len).await
    }

    async fn write_from(
        &self,
        path: &str,
        src: &dyn silt_common::io::ReadAt,
        len: u64,
    ) -> Result<ObjectMeta> {
        self.write_from_attrs(path, src, len, &SetAttrs::default(), None)
            .await
    }

    async fn write_from_attrs(
        &self,
        path: &str,
        src: &dyn silt_common::io::ReadAt,
        len: u64,
        attrs: &SetAttrs,
        headers: Option<&Headers>,
    ) -> Result<ObjectMeta> {
        let path = self.writable(path)?;
        let headers = headers.filter(|h| !h.is_empty());
        if self.svc.hdfs.is_some() {
            return self.hdfs_write(path, src, len, attrs, headers).await;
        }
        if attrs.is_empty() && headers.is_none() {
            return self.put_object(path, src, len, None, None).await;
        }
        // One upload with the headers and the attributes in its user metadata (a POSIX key
        // the client also set is the attribute).
        let mut user = headers
            .map(|h| self.headers_metadata(h))
            .unwrap_or_default();
        if !attrs.is_empty() {
            user = with_posix_metadata(user, &ObjectMeta::empty_file(path), attrs);
        }
        let mut meta = self.put_object(path, src, len, Some(user), headers).await?;
        meta.mode = attrs.mode.or(meta.mode);
        meta.posix.uid = attrs.uid.or(meta.posix.uid);
        meta.posix.gid = attrs.gid.or(meta.posix.gid);
        meta.posix.atime = attrs.atime.or(meta.posix.atime);
        meta.mtime = attrs.mtime.or(meta.mtime);
        Ok(meta)
    }

    async fn headers(&self, path: &str, expected: &ObjectMeta) -> Result<Headers> {
        let path = normalize_path(path)?;
        if self.svc.hdfs.is_some() {
            return self.hdfs_headers(path, expected).await;
        }
        if self.unaddressable(path) {
            return Err(Error::not_found(format!("{}: not found", self.full(path))));
        }
        UFS_REQUESTS.inc();
        let m = self
            .op
            .stat(path)
            .await
            .map_err(|e| self.map_err("stat", path, e))?;
        if m.is_dir() {
            return Err(Error::not_found(format!("{}: not a file", self.full(path))));
        }
        if !self.meta_of(path.to_string(), &m).same_version(expected) {
            return Err(Error::new(
                ErrorKind::ContentChanged,
                format!(
                    "{}: the object changed since its metadata was read",
                    self.full(path)
                ),
            ));
        }
        Ok(self.headers_from(&m))
    }

    async fn delete(&self, path: &str) -> Result<()> {
        let path = normalize_path(path)?;
        if path.is_empty() {
            return Err(Error::invalid(format!(
                "delete {}: cannot delete the store root",
                self.full("")
            )));
        }
        if self.unaddressable(path) {
            return Ok(()); // nothing this store can see is there
        }
        self.delete_object(path, "delete").await
    }

    async fn create_dir(&self, path: &str) -> Result<ObjectMeta> {
        let path = self.writable(path)?;
        if self.svc.hdfs.is_some() {
            UFS_REQUESTS.inc();
            self.op
                .create_dir(&format!("{path}/"))
                .await
                .map_err(|e| self.map_err("mkdir", path, e))?;
            return self.stat_inner(path).await;
        }
        if self.marker(path).await?.is_none() {
            self.put_marker(path, Vec::new(), "mkdir").await?;
        }
        Ok(ObjectMeta::dir(path))
    }

    async fn remove_dir(&self, path: &str) -> Result<()> {
        let path = self.writable(path)?;
        if self.svc.hdfs.is_some() {
            match self.hdfs_status(path).await? {
                None => return Ok(()),
                Some(st) if st.kind != "DIRECTORY" => {
                    return Err(Error::new(
                        ErrorKind::NotADirectory,
                        format!("rmdir {}: not a directory", self.full(path)),
                    ))
                }
                Some(_) => {}
            }
            // Not recursive: the namenode refuses a directory with anything in it.
            return self
                .hdfs_call(
                    http::Method::DELETE,
                    path,
                    "DELETE",
                    "recursive=false",
                    "rmdir",
                )
                .await
                .map(drop)
                .map_err(|e| match e.kind() {
                    ErrorKind::NotEmpty => e,
                    _ if e.to_string().contains("non empty")
                        || e.to_string().contains("not empty") =>
                    {
                        Error::new(
                            ErrorKind::NotEmpty,
                            format!("rmdir {}: directory not empty", self.full(path)),
                        )
                    }
                    _ => e,
                });
        }
        // Empty? A listing of at most the marker and one more key.
        let dir_slash = format!("{path}/");
        UFS_REQUESTS.inc();
        let mut lister = match self.op.lister_with(&dir_slash).recursive(true).await {
            Ok(l) => Some(l),
            Err(e) if e.kind() == opendal::ErrorKind::NotFound => None,
            Err(e) => return Err(self.map_err("rmdir", path, e)),
        };
        while let Some(l) = lister.as_mut() {
            match l.next().await {
                None => break,
                Some(Err(e)) if e.kind() == opendal::ErrorKind::NotFound => break,
                Some(Err(e)) => return Err(self.map_err("rmdir", path, e)),
                Some(Ok(entry)) if is_listed_dir_itself(entry.path(), &dir_slash) => {}
                Some(Ok(_)) => {
                    return Err(Error::new(
                        ErrorKind::NotEmpty,
                        format!("rmdir {}: directory not empty", self.full(path)),
                    ))
                }
            }
        }
        drop(lister);
        UFS_REQUESTS.inc();
        let Some(raw) = &self.raw else {
            return Ok(());
        };
        // The marker, through the service (OpenDAL's delete of `d/` would recurse).
        match raw.delete(&dir_slash).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == opendal::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(self.map_err("rmdir", path, e)),
        }
    }

    async fn rename(&self, from: &str, to: &str) -> Result<ObjectMeta> {
        let from = self.writable(from)?;
        let to = self.writable(to)?;
        if from == to {
            return self.stat_inner(to).await;
        }
        if self.svc.hdfs.is_some() {
            if self.hdfs_status(from).await?.is_none() {
                return Err(Error::not_found(format!(
                    "rename {}: not found",
                    self.full(from)
                )));
            }
            // The destination's parent must exist for RENAME.
            if let Some((parent, _)) = to.rsplit_once('/') {
                UFS_REQUESTS.inc();
                self.op
                    .create_dir(&format!("{parent}/"))
                    .await
                    .map_err(|e| self.map_err("rename", to, e))?;
            }
            self.hdfs_rename(from, to, "rename").await?;
            return self.stat_inner(to).await;
        }
        // Copy, then delete the source. Not atomic: a failure in between leaves both.
        let meta = self.copy_file(from, to).await?;
        self.delete_object(from, "rename: delete").await?;
        Ok(meta)
    }

    async fn copy(&self, from: &str, to: &str) -> Result<ObjectMeta> {
        let from = self.writable(from)?;
        let to = self.writable(to)?;
        if self.svc.hdfs.is_some() {
            // No server-side copy in WebHDFS: the bytes through this host, with the
            // source's permission bits (owner and times are the new file's).
            let src = self.stat_inner(from).await?;
            if src.kind == EntryKind::Dir {
                return Err(Error::new(
                    ErrorKind::IsADirectory,
                    format!("copy {}: is a directory", self.full(from)),
                ));
            }
            let data = self.read_buffer(from, 0..src.size, &src).await?.to_bytes();
            let keep = SetAttrs {
                mode: src.mode,
                ..SetAttrs::default()
            };
            // As an object store's copy keeps the object's metadata.
            let headers = self.hdfs_headers(from, &src).await?;
            return self
                .hdfs_write(
                    to,
                    &data,
                    src.size,
                    &keep,
                    Some(&headers).filter(|h| !h.is_empty()),
                )
                .await;
        }
        self.copy_file(from, to).await
    }

    async fn symlink(&self, path: &str, target: &str) -> Result<ObjectMeta> {
        let path = self.writable(path)?;
        if self.svc.hdfs.is_some() {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "symlink {}: HDFS keeps symbolic links disabled (and WebHDFS cannot read one)",
                    self.full(path)
                ),
            ));
        }
        let now = secs(SystemTime::now());
        let user = vec![
            (S3_MODE.to_string(), (S_IFLNK | 0o777).to_string()),
            (S3_MTIME.to_string(), now.clone()),
            (S3_CTIME.to_string(), now),
        ];
        self.create_new(path, target.as_bytes().to_vec(), user, "symlink")
            .await
    }

    async fn read_link(&self, path: &str) -> Result<String> {
        let path = normalize_path(path)?;
        let m = self.stat_inner(path).await?;
        if m.kind != EntryKind::Symlink {
            return Err(Error::invalid(format!(
                "readlink {}: not a symbolic link",
                self.full(path)
            )));
        }
        if m.size > 4096 {
            return Err(Error::invalid(format!(
                "readlink {}: a {}-byte target is too long",
                self.full(path),
                m.size
            )));
        }
        let mut as_file = m.clone();
        as_file.kind = EntryKind::File;
        let target = self.read_buffer(path, 0..m.size, &as_file).await?.to_vec();
        String::from_utf8(target).map_err(|_| {
            Error::invalid(format!(
                "readlink {}: the target is not UTF-8",
                self.full(path)
            ))
        })
    }

    async fn set_attrs(&self, path: &str, attrs: &SetAttrs) -> Result<ObjectMeta> {
        let path = normalize_path(path)?;
        if self.svc.hdfs.is_some() {
            if self.hdfs_status(path).await?.is_none() {
                return Err(Error::not_found(format!(
                    "set attributes of {}: not found",
                    self.full(path)
                )));
            }
            self.hdfs_set(path, attrs, "set attributes").await?;
            return self.stat_inner(path).await;
        }
        if self.unaddressable(path) {
            return self.stat_inner(path).await;
        }
        self.obj_set_attrs(path, attrs).await
    }

    async fn mknod(
        &self,
        path: &str,
        kind: SpecialKind,
        rdev: u32,
        attrs: &SetAttrs,
    ) -> Result<ObjectMeta> {
        let path = self.writable(path)?;
        if self.svc.hdfs.is_some() {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "mknod {}: HDFS has no FIFOs, sockets or device nodes",
                    self.full(path)
                ),
            ));
        }
        let rdev = if kind.is_device() { rdev } else { 0 };
        let now = SystemTime::now();
        let mut base = ObjectMeta::empty_file(path);
        base.kind = EntryKind::Special(kind);
        base.mode = Some(0o644);
        base.mtime = Some(now);
        base.posix.rdev = rdev;
        let set = SetAttrs {
            mtime: attrs.mtime.or(Some(now)),
            ..*attrs
        };
        self.create_new(path, Vec::new(), s3_user_metadata(&base, &set), "mknod")
            .await
    }
}
