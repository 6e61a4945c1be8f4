//! OpenDAL-backed under-stores for `file://` and `s3://`.
//!
//! One [`OpendalStore`] wraps an `opendal::Operator` (timeout layer, then retry layer for S3)
//! and adapts it to the [`UnderStore`] invariants: root-relative paths without trailing `/`,
//! S3 prefixes as directories, `NotFound`/`NotADirectory` for listings, version-safe reads
//! (If-Match on S3, size+mtime checks around the read on local directories) and errors mapped
//! to [`ErrorKind`]s whose retryability is right.

use std::fmt;
use std::ops::Range;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use opendal::layers::{RetryEvent, RetryLayer, TimeoutLayer};
use opendal::{Buffer, HttpTransporter, Metadata, OperationContext, Operator};
use opendal_http_transport_reqwest::ReqwestTransport;
use reqsign_aws_v4::{EnvCredentialProvider, ProfileCredentialProvider};
use reqsign_core::ProvideCredentialChain;
use silt_common::config::Config;
use silt_common::metrics::{
    Histogram, UfsOp, UFS_ERRORS, UFS_READ_BYTES, UFS_RECEIVES_DECLINED, UFS_RECEIVES_DIRECT,
    UFS_REQUESTS, UFS_REQUEST_SECONDS,
};
use silt_common::{Error, ErrorKind, Result};
use tracing::debug;

use crate::beneath;
use crate::s3_receive::{Received, Receiver};
use crate::uri::StoreUri;
use crate::{
    normalize_path, plan_read, Capabilities, EntryKind, ObjectMeta, Posix, SetAttrs, SpecialKind,
    UnderStore, S_IFMT,
};

/// S3 connection options (see the `s3_*` and `ufs_*` options in `silt_common::config`).
/// `timeout` and `retries` apply to every OpenDAL-backed store.
#[derive(Clone)]
pub struct S3Options {
    /// Endpoint URL, e.g. `http://127.0.0.1:7070`; empty: the AWS endpoint of `region`.
    pub endpoint: String,
    pub region: String,
    /// `ENDPOINT/BUCKET` (true) or `BUCKET.ENDPOINT` (false).
    pub path_style: bool,
    /// Empty (with an empty secret): `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`, then the AWS
    /// config/credentials files. Nothing is ever fetched over the network (no IMDS, SSO, STS).
    pub access_key_id: String,
    /// Never logged, never shown by `Debug`, never put into error messages.
    pub secret_access_key: String,
    /// Deadline of one request attempt (and of each body chunk of a read).
    pub timeout: Duration,
    /// Keys asked for per listing page (S3 max-keys).
    pub list_page: usize,
    /// Retries of a retryable failure, with exponential backoff.
    pub retries: usize,
    /// HEAD every file a listing returns, for the mode, owner and times in its user metadata
    /// (a listing carries none): one request per file, as s3fs-fuse pays.
    pub list_attrs: bool,
    /// Receive ranged GETs on plain `http://` endpoints straight into page buffers
    /// (`s3_direct_receive`; see `s3_receive`).
    pub direct_receive: bool,
}

impl Default for S3Options {
    /// The same values as the built-in configuration defaults.
    fn default() -> Self {
        S3Options {
            endpoint: String::new(),
            region: "us-east-1".to_string(),
            path_style: true,
            access_key_id: String::new(),
            secret_access_key: String::new(),
            timeout: Duration::from_secs(30),
            list_page: 1000,
            retries: 3,
            list_attrs: false,
            direct_receive: true,
        }
    }
}

impl S3Options {
    pub fn from_config(cfg: &Config) -> S3Options {
        S3Options {
            endpoint: cfg.s3_endpoint.clone(),
            region: cfg.s3_region.clone(),
            path_style: cfg.s3_path_style,
            access_key_id: cfg.s3_access_key_id.clone(),
            secret_access_key: cfg.s3_secret_access_key.expose().to_string(),
            timeout: cfg.ufs_timeout,
            list_page: cfg.ufs_list_page,
            retries: cfg.ufs_retries,
            list_attrs: cfg.s3_list_attrs,
            direct_receive: cfg.s3_direct_receive,
        }
    }

    /// The endpoint as shown in messages.
    fn endpoint_display(&self) -> String {
        if self.endpoint.is_empty() {
            format!("https://s3.{}.amazonaws.com", self.region)
        } else {
            self.endpoint.trim_end_matches('/').to_string()
        }
    }
}

impl fmt::Debug for S3Options {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Options")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("path_style", &self.path_style)
            .field("access_key_id", &self.access_key_id)
            .field(
                "secret_access_key",
                &if self.secret_access_key.is_empty() {
                    ""
                } else {
                    "<redacted>"
                },
            )
            .field("timeout", &self.timeout)
            .field("retries", &self.retries)
            .field("direct_receive", &self.direct_receive)
            .finish()
    }
}

enum Backend {
    /// `root` is canonical; metadata comes from `std::fs` (ns mtime, permission bits).
    Fs { root: PathBuf },
    S3 {
        bucket: String,
        endpoint: String,
        /// Ranged GETs received into page buffers (`S3Options::direct_receive`).
        receive: Option<Arc<Receiver>>,
        /// The operator's HTTP client, for the one request OpenDAL will not make: a PUT of a
        /// directory marker with user metadata (its `write` takes file paths only).
        http: HttpTransporter,
    },
}

/// An under-store over an OpenDAL operator: local directories (`file://`) and S3 (`s3://`).
pub struct OpendalStore {
    op: Operator,
    uri: String,
    backend: Backend,
    timeout: Duration,
    retries: usize,
    /// Keys per listing page (S3 max-keys).
    list_page: usize,
    /// HEAD each listed file for its attributes (`S3Options::list_attrs`).
    list_attrs: bool,
    /// Whether the store answers (see [`Stall`]); shared by clones.
    stall: Arc<Stall>,
    /// Request times by [`UfsOp`], under its mount's name (`measured_as`; the URI until then).
    seconds: Arc<[Histogram]>,
}

/// A store that stopped answering: once a request ran out of its deadline (retries
/// included) with no other request answered since it began, requests fail at once with
/// `Timeout` for one deadline (the kernel retries a failed read at once, and each retry would
/// wait a whole deadline again); then one request at a time probes it, the others still
/// failing fast, and the first answer of any kind ends the stall.
#[derive(Default)]
pub(crate) struct Stall {
    state: parking_lot::Mutex<StallState>,
}

#[derive(Default)]
struct StallState {
    since: Option<std::time::Instant>,
    probing: bool,
    last_answer: Option<std::time::Instant>,
}

pub(crate) enum Admit {
    Go,
    Probe,
    FailFast(std::time::Instant),
}

impl Stall {
    pub(crate) fn admit(&self, quiet: Duration) -> Admit {
        let mut st = self.state.lock();
        match st.since {
            None => Admit::Go,
            Some(t) if t.elapsed() < quiet || st.probing => Admit::FailFast(t),
            Some(_) => {
                st.probing = true;
                Admit::Probe
            }
        }
    }

    /// Records how a request that began at `began` ended.
    pub(crate) fn record(&self, began: std::time::Instant, timed_out: bool, probe: bool) {
        let mut st = self.state.lock();
        if probe {
            st.probing = false;
        }
        let now = std::time::Instant::now();
        if !timed_out {
            st.since = None;
            st.last_answer = Some(now);
        } else if probe || st.last_answer.is_none_or(|a| a < began) {
            // Nothing answered while it waited: the store, not this request, is stuck.
            st.since = Some(now);
        }
    }
}

/// Floor of the retry backoff; OpenDAL's default (1s) makes a flapping connection slow to
/// recover, and S3 asks for backoff starting in the 100ms range.
pub(crate) const RETRY_MIN_DELAY: Duration = Duration::from_millis(100);
pub(crate) const RETRY_MAX_DELAY: Duration = Duration::from_secs(10);
/// Upper bound on one attempt of the [`OpendalStore::verify`] probe.
pub(crate) const PROBE_ATTEMPT_CAP: Duration = Duration::from_secs(10);

pub(crate) fn retry_event(ev: RetryEvent<'_>) {
    // Each retry is one more request to the store, and the one before it failed.
    UFS_REQUESTS.inc();
    UFS_ERRORS.inc();
    debug!(
        op = ?ev.op,
        attempt = ev.attempt,
        retry_after_ms = ev.retry_after.as_millis() as u64,
        error = %ev.err,
        "retrying under-store request"
    );
}

/// Request times of a store not (yet) exported under a name.
pub(crate) fn unmeasured() -> Arc<[Histogram]> {
    UfsOp::ALL.iter().map(|_| Histogram::new()).collect()
}

impl OpendalStore {
    /// Builds the store `uri` names, without checking that it is reachable (see
    /// [`OpendalStore::verify`] and [`crate::open_store`]).
    pub fn open(uri: &StoreUri, s3: &S3Options) -> Result<OpendalStore> {
        match uri {
            StoreUri::File { root } => OpendalStore::fs(root, s3.timeout),
            StoreUri::S3 {
                bucket,
                prefix,
                options,
            } => {
                let mut store =
                    OpendalStore::s3(bucket, prefix, &options.apply(s3, &uri.to_string())?)?;
                store.uri = uri.to_string();
                Ok(store)
            }
            // Served by `crate::object::ObjectStore` (`open_store` dispatches there).
            StoreUri::Object(o) => Err(Error::invalid(format!(
                "{}: not a file:// or S3 store (open it with open_store)",
                o.without_query()
            ))),
        }
    }

    /// A store over the local directory `root`, which must exist (OpenDAL would create it).
    ///
    /// No retry layer: local errors are not transient, and OpenDAL marks every unknown I/O
    /// error as temporary, which would retry `ENOTDIR` and friends with backoff.
    pub fn fs(root: &Path, timeout: Duration) -> Result<OpendalStore> {
        check_timeout(timeout)?;
        let shown = root.display().to_string();
        match std::fs::metadata(root) {
            Ok(md) if md.is_dir() => {}
            Ok(_) => {
                return Err(Error::new(
                    ErrorKind::NotADirectory,
                    format!("{shown} is not a directory"),
                ))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::not_found(format!(
                    "local directory {shown} does not exist"
                )))
            }
            Err(e) => return Err(Error::from(e).context(format!("local directory {shown}"))),
        }
        let root = std::fs::canonicalize(root)
            .map_err(|e| Error::from(e).context(format!("local directory {shown}")))?;
        let root_str = root.to_str().ok_or_else(|| {
            Error::invalid(format!("local directory {shown}: path is not valid UTF-8"))
        })?;
        let builder = opendal::services::Fs::default().root(root_str);
        let op = Operator::new(builder)
            .map_err(|e| {
                Error::internal(format!("local directory {shown}: {}", e.message())).with_source(e)
            })?
            .layer(
                TimeoutLayer::new()
                    .with_timeout(timeout)
                    .with_io_timeout(timeout),
            );
        Ok(OpendalStore {
            op,
            uri: StoreUri::File { root: root.clone() }.to_string(),
            backend: Backend::Fs { root },
            timeout,
            retries: 0,
            list_page: 1000,
            list_attrs: false,
            stall: Arc::default(),
            seconds: unmeasured(),
        })
    }

    /// A store over `s3://bucket/prefix`.
    pub fn s3(bucket: &str, prefix: &str, opts: &S3Options) -> Result<OpendalStore> {
        check_timeout(opts.timeout)?;
        let prefix = normalize_path(prefix)?;
        let uri = StoreUri::S3 {
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
            options: Default::default(),
        }
        .to_string();
        let root = if prefix.is_empty() {
            "/".to_string()
        } else {
            format!("/{prefix}/")
        };

        // Credentials: explicit options, then the environment, then the AWS config files. The
        // default chain would also try SSO, web identity (STS), credential_process, ECS and
        // EC2 IMDS, all of which can send traffic off this machine.
        let mut chain = ProvideCredentialChain::new();
        if let Some(keys) = StaticKeys::from_options(&opts.access_key_id, &opts.secret_access_key)?
        {
            chain = chain.push(keys);
        }
        let chain = chain
            .push(EnvCredentialProvider::new())
            .push(ProfileCredentialProvider::new());

        let mut builder = opendal::services::S3::default()
            .bucket(bucket)
            .root(&root)
            .region(&opts.region)
            // Endpoint and region come from Silt's config only (no AWS_ENDPOINT_URL surprises).
            .disable_config_load()
            .disable_ec2_metadata()
            .credential_provider_chain(chain);
        if !opts.endpoint.is_empty() {
            builder = builder.endpoint(&opts.endpoint);
        }
        if !opts.path_style {
            builder = builder.enable_virtual_host_style();
        }
        // The workspace's opendal features install no process-wide HTTP transport; give this
        // operator reqwest's (a shared, lazily built client and connection pool).
        let http = HttpTransporter::new(ReqwestTransport::default());
        let marker_http = http.clone();
        let op = Operator::new(builder)
            .map_err(|e| Error::invalid(format!("{uri}: {}", e.message())).with_source(e))?
            .with_context(OperationContext::new().with_http_transport(http))
            // Timeout before retry: each attempt gets its own deadline (see TimeoutLayer docs).
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
            );
        Ok(OpendalStore {
            op,
            uri,
            backend: Backend::S3 {
                bucket: bucket.to_string(),
                endpoint: opts.endpoint_display(),
                receive: opts
                    .direct_receive
                    .then(|| Arc::new(Receiver::new(opts.timeout))),
                http: marker_http,
            },
            timeout: opts.timeout,
            retries: opts.retries,
            list_page: opts.list_page.max(1),
            list_attrs: opts.list_attrs,
            stall: Arc::default(),
            seconds: unmeasured(),
        })
    }

    /// Times this store's requests under `mount` (the `mount` label of
    /// `silt_ufs_request_seconds`): the namespace path it serves, or its URI.
    pub fn measured_as(mut self, mount: &str) -> OpendalStore {
        self.seconds = UFS_REQUEST_SECONDS.register(mount);
        self
    }

    /// The underlying operator (root = the store root).
    pub fn operator(&self) -> &Operator {
        &self.op
    }

    /// Checks that the store is usable: the directory is readable, or one listing of at most
    /// one key succeeds within a bounded time.
    pub async fn verify(&self) -> Result<()> {
        match &self.backend {
            Backend::Fs { root } => {
                UFS_REQUESTS.inc();
                let r = tokio::fs::read_dir(root).await.map(drop);
                self.count_errors(UfsOp::List, async {
                    r.map_err(|e| {
                        Error::from(e).context(format!("local directory {}", root.display()))
                    })
                })
                .await
            }
            Backend::S3 { endpoint, .. } => {
                let attempt = self.timeout.min(PROBE_ATTEMPT_CAP);
                let deadline =
                    attempt * (self.retries.min(100) as u32 + 1) + Duration::from_secs(1);
                let probe = async {
                    UFS_REQUESTS.inc();
                    let mut lister = self
                        .op
                        .lister_with("/")
                        .limit(1)
                        .await
                        .map_err(|e| self.map_err("open", "", e))?;
                    match lister.next().await {
                        Some(Err(e)) => Err(self.map_err("open", "", e)),
                        _ => Ok(()),
                    }
                };
                self.count_errors(UfsOp::List, async {
                    match tokio::time::timeout(deadline, probe).await {
                        Ok(r) => r,
                        Err(_) => Err(Error::new(
                            ErrorKind::Timeout,
                            format!(
                                "{}: S3 endpoint {endpoint} did not answer within {deadline:?}",
                                self.uri
                            ),
                        )),
                    }
                })
                .await
            }
        }
    }

    /// `uri/path` for messages.
    fn full(&self, path: &str) -> String {
        if path.is_empty() {
            self.uri.clone()
        } else {
            format!("{}/{path}", self.uri)
        }
    }

    fn endpoint_display(&self) -> String {
        match &self.backend {
            Backend::Fs { .. } => "the local filesystem".to_string(),
            Backend::S3 { endpoint, .. } => format!("S3 endpoint {endpoint}"),
        }
    }

    /// Maps an OpenDAL error to ours: a kind with the right retryability and a short message
    /// (the full OpenDAL error, with response headers, stays available as the source).
    fn map_err(&self, op: &str, path: &str, e: opendal::Error) -> Error {
        let full = self.full(path);
        let (kind, detail) = self.classify(&e);
        debug!(op, path = %full, kind = %kind, error = %e, "under-store request failed");
        Error::new(kind, format!("{op} {full}: {detail}")).with_source(e)
    }

    fn classify(&self, e: &opendal::Error) -> (ErrorKind, String) {
        use opendal::ErrorKind as O;
        let code = debug_field(e.message(), "code").unwrap_or("");
        let s3_detail = || match debug_field(e.message(), "message") {
            Some(m) if !code.is_empty() => format!("{code}: {m}"),
            _ if !code.is_empty() => code.to_string(),
            _ => e.message().to_string(),
        };
        // Codes that say more than the HTTP status (versitygw answers 404 to an unknown key id).
        const CREDENTIAL_CODES: &[&str] = &[
            "InvalidAccessKeyId",
            "SignatureDoesNotMatch",
            "XAdminUserNotFound",
            "InvalidToken",
            "ExpiredToken",
        ];
        if CREDENTIAL_CODES.contains(&code) {
            return (
                ErrorKind::PermissionDenied,
                format!(
                    "credentials refused by {}: {}",
                    self.endpoint_display(),
                    s3_detail()
                ),
            );
        }
        match (code, &self.backend) {
            ("NoSuchBucket", Backend::S3 { bucket, .. }) => {
                return (
                    ErrorKind::NotFound,
                    format!(
                        "bucket {bucket} does not exist at {}",
                        self.endpoint_display()
                    ),
                )
            }
            ("InvalidBucketName", _) => return (ErrorKind::InvalidInput, s3_detail()),
            // versitygw's posix backend cannot hold both `a` and `a/b`.
            ("ExistingObjectIsDirectory", _) => return (ErrorKind::IsADirectory, s3_detail()),
            ("ObjectParentIsFile", _) => return (ErrorKind::NotADirectory, s3_detail()),
            _ => {}
        }
        match e.kind() {
            O::NotFound => (ErrorKind::NotFound, "not found".to_string()),
            O::PermissionDenied => (
                ErrorKind::PermissionDenied,
                format!(
                    "access denied by {}: {}",
                    self.endpoint_display(),
                    s3_detail()
                ),
            ),
            O::ConditionNotMatch => (
                ErrorKind::ContentChanged,
                "the object changed since its metadata was read".to_string(),
            ),
            O::RateLimited => (
                ErrorKind::RateLimited,
                format!(
                    "{} asked to slow down: {}",
                    self.endpoint_display(),
                    s3_detail()
                ),
            ),
            O::IsADirectory => (ErrorKind::IsADirectory, "is a directory".to_string()),
            O::NotADirectory => (ErrorKind::NotADirectory, "not a directory".to_string()),
            O::AlreadyExists => (ErrorKind::AlreadyExists, "already exists".to_string()),
            O::Unsupported => (ErrorKind::Unsupported, e.message().to_string()),
            O::RangeNotSatisfied => (ErrorKind::InvalidInput, s3_detail()),
            O::ConfigInvalid => (ErrorKind::InvalidInput, s3_detail()),
            // S3 OperationAborted: "a conflicting conditional operation is in progress, try again".
            O::Conflict => (ErrorKind::Unavailable, s3_detail()),
            _ => self.classify_unexpected(e, code, s3_detail()),
        }
    }

    fn classify_unexpected(
        &self,
        e: &opendal::Error,
        code: &str,
        s3_detail: String,
    ) -> (ErrorKind, String) {
        let msg = e.message();
        let where_ = self.endpoint_display();
        if msg.contains("timeout reached") || code == "RequestTimeout" {
            return (
                ErrorKind::Timeout,
                format!("no answer from {where_} within {:?}", self.timeout),
            );
        }
        if msg == "signing http request" {
            return (
                ErrorKind::PermissionDenied,
                "no S3 credentials found: set s3_access_key_id and s3_secret_access_key, \
                 AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or ~/.aws/credentials"
                    .to_string(),
            );
        }
        if is_transport_error(msg) {
            let kind = match find_io_error(e).map(|io| io.kind()) {
                Some(std::io::ErrorKind::TimedOut) => ErrorKind::Timeout,
                _ => ErrorKind::Unavailable,
            };
            return (kind, format!("cannot reach {where_}: {}", root_cause(e)));
        }
        if let Some(io) = find_io_error(e) {
            // Local I/O: the same mapping as everywhere else in Silt (plus ENOTEMPTY, which
            // only directory operations meet).
            let kind = match io.kind() {
                std::io::ErrorKind::DirectoryNotEmpty => ErrorKind::NotEmpty,
                k => Error::from(std::io::Error::from(k)).kind(),
            };
            return (kind, format!("{where_}: {io}"));
        }
        let status = http_status(e);
        // HEAD answers carry no body, so no S3 code: name the HTTP status instead.
        let s3_detail = match (s3_detail.trim().is_empty(), status) {
            (true, Some(503)) => "HTTP 503 (service unavailable or SlowDown)".to_string(),
            (true, Some(s)) => format!("HTTP {s}"),
            _ => s3_detail,
        };
        let server_error = matches!(code, "InternalError" | "ServiceUnavailable" | "SlowDown")
            || status.is_some_and(|s| s >= 500);
        if server_error {
            return (
                ErrorKind::Unavailable,
                format!("{where_} failed: {s3_detail}"),
            );
        }
        // OpenDAL marks undecodable listing pages temporary: a truncated response under load.
        if e.is_temporary() || msg.contains("deserialize") {
            return (
                ErrorKind::Unavailable,
                format!("{where_}: {}", root_cause(e)),
            );
        }
        if status.is_some_and(|s| (400..500).contains(&s)) {
            return (
                ErrorKind::InvalidInput,
                format!("{where_} refused the request: {s3_detail}"),
            );
        }
        // Never the full OpenDAL rendering here: it carries response headers and a backtrace.
        (
            ErrorKind::Internal,
            format!("{where_}: {}: {s3_detail}", e.kind()),
        )
    }

    /// [`fs_read_pieces`] off the async workers: the bytes `range` of the version of the local
    /// file `path` that `expected` describes, in `piece`-byte pieces.
    async fn fs_read(
        &self,
        root: &Path,
        path: &str,
        range: Range<u64>,
        expected: &ObjectMeta,
        piece: u64,
    ) -> Result<Vec<Bytes>> {
        UFS_REQUESTS.inc();
        let want = expected.content_fingerprint();
        let (root, path, shown) = (root.to_path_buf(), path.to_string(), self.full(path));
        let what = shown.clone();
        tokio::task::spawn_blocking(move || {
            fs_read_pieces(&root, &path, &shown, range, &want, piece)
        })
        .await
        .map_err(|e| Error::internal(format!("read {what}: {e}")))?
    }

    async fn fs_stat(&self, root: &Path, path: &str) -> Result<ObjectMeta> {
        UFS_REQUESTS.inc();
        // A link is reported as a link, never followed (the kernel resolves it in the mount),
        // nor one on the way (`beneath`).
        let stat = || std::fs::symlink_metadata(&*beneath::parent(root, path, false)?);
        match run_blocking(stat) {
            Ok(md) => fs_meta(path, &md).ok_or_else(|| {
                Error::new(
                    ErrorKind::Unsupported,
                    format!(
                        "stat {}: not a regular file, directory or symbolic link",
                        self.full(path)
                    ),
                )
            }),
            // `file/x`: ENOTDIR means the path does not exist.
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                ) =>
            {
                Err(Error::not_found(format!(
                    "stat {}: not found",
                    self.full(path)
                )))
            }
            Err(e) => Err(Error::from(e).context(format!("stat {}", self.full(path)))),
        }
    }

    async fn s3_stat(&self, path: &str) -> Result<ObjectMeta> {
        if path.is_empty() {
            return Ok(ObjectMeta::dir(""));
        }
        if self.s3_unaddressable(path) {
            return Err(Error::not_found(format!(
                "stat {}: not found (a name that begins or ends with white space cannot be \
                 reached on S3 through this store)",
                self.full(path)
            )));
        }
        UFS_REQUESTS.inc();
        match self.op.stat(path).await {
            Ok(m) if !m.is_dir() => return Ok(s3_meta(path.to_string(), &m)),
            Ok(_) => {}
            Err(e) if e.kind() == opendal::ErrorKind::NotFound => {}
            Err(e) => return Err(self.map_err("stat", path, e)),
        }
        // A directory marker keeps the directory's attributes (as s3fs-fuse's do).
        if let Some(dir) = self.s3_marker(path).await? {
            return Ok(dir);
        }
        // Not an object: a "directory" is a prefix with at least one key below it.
        if self.s3_prefix_exists(path).await? {
            Ok(ObjectMeta::dir(path))
        } else {
            Err(Error::not_found(format!(
                "stat {}: not found",
                self.full(path)
            )))
        }
    }

    /// The directory `path` as its `path/` marker object describes it (mode, owner, times in
    /// its user metadata), or `None` if it has no marker.
    async fn s3_marker(&self, path: &str) -> Result<Option<ObjectMeta>> {
        // OpenDAL's stat of a directory path answers from a listing, without the marker's
        // user metadata: the marker's HEAD is sent as its presigned request.
        let signed = self
            .op
            .presign_stat(&format!("{path}/"), self.presign_validity())
            .await
            .map_err(|e| self.map_err("stat", path, e))?;
        let resp = self.s3_send_signed(&signed, "stat", path).await?;
        let status = resp.status();
        if status == http::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !status.is_success() {
            return Err(s3_status_error(
                status,
                format!(
                    "stat {}: the store answered {status} to the marker's HEAD",
                    self.full(path)
                ),
            ));
        }
        let mut dir = ObjectMeta::dir(path);
        let headers = resp.headers();
        s3_apply_attrs(&mut dir, |k| {
            headers
                .get(format!("x-amz-meta-{k}"))
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        });
        Ok(Some(dir))
    }

    /// How long a presigned request stays valid: long enough to outlast its own deadlines.
    fn presign_validity(&self) -> Duration {
        self.timeout.saturating_mul(4).max(Duration::from_secs(300))
    }

    /// Sends a request the operator presigned, on its HTTP client, within the store's
    /// deadline (no retries: directory markers only).
    async fn s3_send_signed(
        &self,
        signed: &opendal::raw::PresignedRequest,
        what: &str,
        path: &str,
    ) -> Result<http::Response<Buffer>> {
        let Backend::S3 { http, .. } = &self.backend else {
            return Err(Error::internal(format!(
                "{what} {path}: a presigned request outside S3"
            )));
        };
        let mut req = http::Request::builder()
            .method(signed.method().clone())
            .uri(signed.uri().clone());
        for (name, value) in signed.header() {
            req = req.header(name, value);
        }
        if signed.method() == http::Method::PUT {
            req = req.header(http::header::CONTENT_LENGTH, 0);
        }
        let req = req
            .body(Buffer::new())
            .map_err(|e| Error::internal(format!("{what} {}: {e}", self.full(path))))?;
        UFS_REQUESTS.inc();
        match tokio::time::timeout(self.timeout, http.send(req)).await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) => Err(self.map_err(what, path, e)),
            Err(_) => Err(Error::new(
                ErrorKind::Timeout,
                format!(
                    "{what} {}: no answer within {:?}",
                    self.full(path),
                    self.timeout
                ),
            )),
        }
    }

    /// A directory's attributes changed: its `path/` marker is written (made, for a directory
    /// only implied by keys, as s3fs-fuse does) with them in its user metadata.
    async fn s3_set_dir_attrs(&self, cur: &ObjectMeta, attrs: &SetAttrs) -> Result<ObjectMeta> {
        let path = cur.path.as_str();
        self.s3_put_marker(path, s3_user_metadata(cur, attrs), "set attributes")
            .await?;
        match self.s3_marker(path).await? {
            Some(dir) => Ok(dir),
            None => Err(Error::not_found(format!(
                "set attributes of {}: the directory was removed meanwhile",
                self.full(path)
            ))),
        }
    }

    /// PUTs the marker `path/` with the user metadata `user`.
    async fn s3_put_marker(
        &self,
        path: &str,
        user: Vec<(String, String)>,
        what: &str,
    ) -> Result<()> {
        let opts = opendal::options::WriteOptions {
            user_metadata: Some(user.into_iter().collect()),
            ..Default::default()
        };
        // OpenDAL writes file paths only: the marker's PUT is its presigned request (so
        // addressing and signing stay the operator's), sent on the operator's HTTP client.
        let signed = self
            .op
            .presign_write_options(&format!("{path}/"), self.presign_validity(), opts)
            .await
            .map_err(|e| self.map_err(what, path, e))?;
        let status = self.s3_send_signed(&signed, what, path).await?.status();
        if !status.is_success() {
            return Err(s3_status_error(
                status,
                format!(
                    "{what} {}: the store answered {status} to the marker's PUT",
                    self.full(path)
                ),
            ));
        }
        Ok(())
    }

    /// Whether at least one key starts with `path/` (a one-key listing).
    async fn s3_prefix_exists(&self, path: &str) -> Result<bool> {
        UFS_REQUESTS.inc();
        let mut lister = self
            .op
            .lister_with(&format!("{path}/"))
            .limit(1)
            .await
            .map_err(|e| self.map_err("stat", path, e))?;
        match lister.next().await {
            Some(Ok(_)) => Ok(true),
            Some(Err(e)) => Err(self.map_err("stat", path, e)),
            None => Ok(false),
        }
    }

    /// The listing of `dir`, streamed page by page (`list_page` keys each); `None` as soon as
    /// it has more than `max` entries, so an oversized tree costs at most `max` entries.
    async fn list_entries_max(
        &self,
        dir: &str,
        recursive: bool,
        max: usize,
    ) -> Result<Option<Vec<(String, Metadata)>>> {
        self.list_entries_budget(dir, recursive, &AtomicUsize::new(max))
            .await
    }

    /// A store path that may be written (not the root).
    fn writable<'a>(&self, path: &'a str) -> Result<&'a str> {
        let path = normalize_path(path)?;
        if path.is_empty() {
            return Err(Error::invalid(format!(
                "write {}: cannot write the store root",
                self.uri
            )));
        }
        if self.s3_unaddressable(path) {
            return Err(Error::invalid(format!(
                "write {}: a name that begins or ends with white space cannot be stored on S3 \
                 through this store (docs/SEMANTICS.md)",
                self.full(path)
            )));
        }
        Ok(path)
    }

    /// Whether `path` is one OpenDAL cannot address on S3: it trims white space from both
    /// ends of every path (`a ` would reach the key `a`: a write there would replace another
    /// object, a delete remove it). Such names are refused for writes, invisible otherwise.
    fn s3_unaddressable(&self, path: &str) -> bool {
        matches!(self.backend, Backend::S3 { .. }) && path.trim() != path
    }

    /// The metadata of the version a write just created, `size` bytes long.
    async fn written_meta(&self, path: &str, written: &Metadata, size: u64) -> Result<ObjectMeta> {
        match &self.backend {
            // The PUT's own answer names the version it created (a HEAD now could see a
            // later writer's); S3 returns no Last-Modified with it, so the mtime is learned
            // at the next listing or HEAD.
            Backend::S3 { .. } if written.etag().is_some() => Ok(ObjectMeta {
                size,
                ..s3_meta(path.to_string(), written)
            }),
            // A local file: its mtime (part of its fingerprint) comes from a local stat; a
            // store that named no version: asked once.
            _ => self.stat_inner(path).await,
        }
    }

    /// The first `len` bytes of `src`, written to `path`, read `part` bytes at a time: each
    /// part's offset and bytes, in order.
    fn parts<'a>(
        &'a self,
        path: &'a str,
        src: &'a dyn silt_common::io::ReadAt,
        len: u64,
        part: usize,
    ) -> impl Iterator<Item = Result<(u64, Bytes)>> + 'a {
        (0..len).step_by(part.max(1)).map(move |off| {
            let n = (len - off).min(part as u64) as usize;
            let bytes = src.read_at(off, n).map_err(|e| {
                e.context(format!(
                    "write {}: reading the local bytes",
                    self.full(path)
                ))
            })?;
            Ok((off, bytes))
        })
    }

    /// A whole file written into a local directory: into a hidden file beside it
    /// ([`FS_WRITE_TEMP`], left out of listings), then renamed over it and synced. A reader
    /// or another writer of the same path never meets a half-written or mixed file: each
    /// write replaces it whole and the last rename wins, as a PUT does (a write in place, as
    /// OpenDAL's writer makes it, truncated the file under a concurrent writer: it then failed
    /// or the bytes of two writes interleaved). The file gets the permission bits, owner and
    /// group of `like` (a copy's source), else of the file it replaces (a write keeps
    /// attributes here: `write_replaces_attrs` is false); a hard link to the replaced file
    /// keeps the old bytes, as after any save by rename. Holes in `src` stay holes: only data
    /// is written, then the length is set.
    fn fs_write(
        &self,
        root: &Path,
        path: &str,
        src: &dyn silt_common::io::ReadAt,
        len: u64,
        like: Option<&std::fs::Metadata>,
    ) -> Result<ObjectMeta> {
        use std::os::unix::fs::FileExt;
        UFS_REQUESTS.inc();
        let what = |e: std::io::Error| Error::from(e).context(format!("write {}", self.full(path)));
        let md = run_blocking(|| -> Result<std::fs::Metadata> {
            // Missing parents made; none of them a link (`beneath`).
            let full = beneath::parent(root, path, true).map_err(what)?;
            let fill = |file: &std::fs::File| -> Result<()> {
                let has_holes = (0..len)
                    .step_by(WRITE_PART)
                    .any(|off| src.is_hole(off, (len - off).min(WRITE_PART as u64)));
                if has_holes {
                    silt_common::io::copy_sparse(src, len, WRITE_PART as u64, |off, piece| {
                        file.write_all_at(piece, off).map_err(what)
                    })?;
                } else {
                    for part in self.parts(path, src, len, WRITE_PART) {
                        let (off, part) = part?;
                        file.write_all_at(&part, off).map_err(what)?;
                    }
                }
                file.set_len(len).map_err(what)
            };
            // A file with other names (hard links) is written in place: a replacement would
            // be a new file under this name only, and the other names would keep the old
            // bytes. Not atomic, as any in-place write (docs/SEMANTICS.md).
            if like.is_none() {
                let linked =
                    std::fs::symlink_metadata(&*full).is_ok_and(|m| m.is_file() && m.nlink() > 1);
                if linked {
                    use std::os::unix::fs::OpenOptionsExt;
                    let file = std::fs::OpenOptions::new()
                        .write(true)
                        .custom_flags(libc::O_NOFOLLOW)
                        .open(&*full)
                        .map_err(what)?;
                    fill(&file)?;
                    file.set_modified(unique_mtime()).map_err(what)?;
                    file.sync_all().map_err(what)?;
                    return file.metadata().map_err(what);
                }
            }
            let (file, tmp) = fs_create_hidden(full.dir()).map_err(what)?;
            let replace = || -> Result<std::fs::Metadata> {
                fill(&file)?;
                let replaced = match like {
                    Some(_) => None,
                    None => std::fs::symlink_metadata(&full)
                        .ok()
                        .filter(|m| m.is_file()),
                };
                if let Some(like) = like.or(replaced.as_ref()) {
                    keep_owner_and_mode(&file, like).map_err(what)?;
                }
                file.set_modified(unique_mtime()).map_err(what)?;
                std::fs::rename(&tmp, &full).map_err(what)?;
                // Durable, under its name, when the write returns: one sync after the rename
                // commits the file and its new name together on the journaling file systems
                // (ext4, XFS, btrfs; the rename changed the file's inode), as the sync of a
                // file written in place did. Syncing before the rename as well, or the
                // directory after it, made a second commit: 15-20 % fewer small files/s.
                file.sync_all().map_err(what)?;
                // This write's own version, whatever a later writer renamed there since.
                file.metadata().map_err(what)
            };
            replace().inspect_err(|_| {
                let _ = std::fs::remove_file(&tmp);
            })
        })?;
        fs_meta(path, &md).ok_or_else(|| {
            Error::new(
                ErrorKind::Internal,
                format!("write {}: not a file after writing", self.full(path)),
            )
        })
    }

    /// A server-side copy of the file `from` to `to`; the metadata of the copy.
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
        // A local copy is a write of the source's bytes (holes kept) with its permission
        // bits and owner (as S3's copy keeps the user metadata that holds them), replacing
        // `to` whole as a write does.
        if let (Backend::Fs { root }, EntryKind::File) = (&self.backend, src.kind) {
            let what =
                |e: std::io::Error| Error::from(e).context(format!("copy {}", self.full(from)));
            let opened = run_blocking(|| {
                use std::os::unix::fs::OpenOptionsExt;
                let file = std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NOFOLLOW)
                    .open(&*beneath::parent(root, from, false)?)?;
                let md = file.metadata()?;
                Ok((file, md))
            });
            let (file, md) = opened.map_err(what)?;
            return self.fs_write(root, to, &file, md.len(), Some(&md));
        }
        if let (Backend::Fs { root }, EntryKind::Special(_)) = (&self.backend, src.kind) {
            UFS_REQUESTS.inc();
            run_blocking(|| fs_copy_special(root, from, to))
                .map_err(|e| Error::from(e).context(format!("copy {}", self.full(from))))?;
            return self.fs_stat(root, to).await;
        }
        // A local link is copied as the link (as S3 copies a link object), never its target,
        // which may lie outside the store.
        if let (Backend::Fs { root }, EntryKind::Symlink) = (&self.backend, src.kind) {
            UFS_REQUESTS.inc();
            run_blocking(|| fs_copy_link(root, from, to))
                .map_err(|e| Error::from(e).context(format!("copy {}", self.full(from))))?;
            return self.fs_stat(root, to).await;
        }
        UFS_REQUESTS.inc();
        let copied = self
            .op
            .copy(from, to)
            .await
            .map_err(|e| self.map_err("copy", from, e))?;
        let mut meta = self.written_meta(to, &copied, src.size).await?;
        if let Backend::S3 { .. } = self.backend {
            meta.kind = src.kind;
            // A copy keeps the user metadata (S3's default directive), which the copy's own
            // answer does not repeat.
            meta.mode = meta.mode.or(src.mode);
            meta.posix = Posix {
                uid: meta.posix.uid.or(src.posix.uid),
                gid: meta.posix.gid.or(src.posix.gid),
                atime: meta.posix.atime.or(src.posix.atime),
                ctime: meta.posix.ctime.or(src.posix.ctime),
                rdev: src.posix.rdev,
                nlink: None,
            };
        }
        Ok(meta)
    }

    /// S3 keeps attributes in the object's user metadata, which only a new version of the
    /// object can change; OpenDAL's copy cannot replace metadata, so the object is read and
    /// written again with it (its bytes unchanged): a GET and a PUT of the whole object, up to
    /// [`S3_ATTR_REWRITE_MAX`] bytes. Directories (prefixes) keep no attributes.
    async fn s3_set_attrs(&self, path: &str, attrs: &SetAttrs) -> Result<ObjectMeta> {
        // The object is rewritten with its new metadata, on condition that it is still the
        // version read: a writer that replaced it meanwhile must not be undone by old bytes.
        // Lost races are retried on the new version, a few times.
        let mut attempts = 0;
        loop {
            attempts += 1;
            match self.s3_set_attrs_once(path, attrs).await {
                Err(e) if e.kind() == ErrorKind::ContentChanged && attempts < 3 => continue,
                r => return r,
            }
        }
    }

    async fn s3_set_attrs_once(&self, path: &str, attrs: &SetAttrs) -> Result<ObjectMeta> {
        let cur = self.stat_inner(path).await?;
        if cur.kind == EntryKind::Dir {
            if path.is_empty() {
                return Err(Error::new(
                    ErrorKind::Unsupported,
                    format!(
                        "set attributes of {}: the bucket's root keeps no attributes",
                        self.full(path)
                    ),
                ));
            }
            return self.s3_set_dir_attrs(&cur, attrs).await;
        }
        if cur.size > S3_ATTR_REWRITE_MAX {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "set attributes of {}: changing them rewrites the object, and it is larger than {} MiB",
                    self.full(path),
                    S3_ATTR_REWRITE_MAX >> 20
                ),
            ));
        }
        let etag = cur.etag.clone().unwrap_or_default();
        let data = self.s3_read(path, 0..cur.size, &etag).await?;
        let meta = s3_user_metadata(&cur, attrs);
        UFS_REQUESTS.inc();
        let mut w = self.op.write_with(path, data).user_metadata(meta);
        if !etag.is_empty() {
            w = w.if_match(&format!("\"{etag}\""));
        }
        w.await
            .map_err(|e| self.map_err("set attributes", path, e))?;
        self.stat_inner(path).await
    }

    /// A new object `path` (a link, a special file) with `body` and the user metadata `user`
    /// (s3fs-fuse's keys), `AlreadyExists` if anything is there (an object, or a directory);
    /// its metadata as the user metadata describes it.
    async fn s3_create_new(
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
        match self.s3_stat(path).await {
            Ok(_) => return Err(exists()),
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let size = body.len() as u64;
        UFS_REQUESTS.inc();
        // Conditional too: an object created after the stat is not replaced.
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
        // The PUT's answer repeats no user metadata: the attributes are the ones sent.
        s3_apply_attrs(&mut meta, |k| {
            user.iter()
                .find(|(key, _)| key.eq_ignore_ascii_case(k))
                .map(|(_, v)| v.clone())
        });
        Ok(meta)
    }

    /// `write_from`, with S3 user metadata (`x-amz-meta-` keys without the prefix).
    async fn write_from_meta(
        &self,
        path: &str,
        src: &dyn silt_common::io::ReadAt,
        len: u64,
        user: Option<Vec<(String, String)>>,
    ) -> Result<ObjectMeta> {
        let path = self.writable(path)?;
        if let Backend::Fs { root } = &self.backend {
            return self
                .count_errors(UfsOp::Write, async {
                    self.fs_write(root, path, src, len, None)
                })
                .await;
        }
        self.count_errors(UfsOp::Write, async {
            // One PUT up to a part's size, else initiate + one request per part + complete.
            let part = part_size(len);
            let parts = len.div_ceil(part as u64);
            UFS_REQUESTS.add(if parts <= 1 { 1 } else { parts + 2 });
            let mut w = match user {
                Some(user) => {
                    self.op
                        .writer_with(path)
                        .chunk(part)
                        .user_metadata(user)
                        .await
                }
                None => self.op.writer_with(path).chunk(part).await,
            }
            .map_err(|e| self.map_err("write", path, e))?;
            for part in self.parts(path, src, len, part) {
                w.write(part?.1)
                    .await
                    .map_err(|e| self.map_err("write", path, e))?;
            }
            let written = w
                .close()
                .await
                .map_err(|e| self.map_err("write", path, e))?;
            self.written_meta(path, &written, len).await
        })
        .await
    }

    /// Starts a listing of `dir` (one request, counted); returns it with the `dir/` prefix.
    async fn lister(&self, dir: &str, recursive: bool) -> Result<(String, opendal::Lister)> {
        let dir_slash = if dir.is_empty() {
            "/".to_string()
        } else {
            format!("{dir}/")
        };
        UFS_REQUESTS.inc();
        let lister = self
            .op
            .lister_with(&dir_slash)
            .recursive(recursive)
            .limit(self.list_page)
            .await
            .map_err(|e| self.map_err("list", dir, e))?;
        Ok((dir_slash, lister))
    }

    /// `list_entries_max`, with the entry budget shared by listings running side by side.
    async fn list_entries_budget(
        &self,
        dir: &str,
        recursive: bool,
        budget: &AtomicUsize,
    ) -> Result<Option<Vec<(String, Metadata)>>> {
        let (dir_slash, mut lister) = self.lister(dir, recursive).await?;
        let mut out = Vec::new();
        // S3 returns `list_page` keys per page until the last, so every `list_page` keys
        // past the first page is one more request: counted as it is made.
        let paged = matches!(self.backend, Backend::S3 { .. });
        let mut received = 0usize;
        while let Some(entry) = lister.next().await {
            if paged && received > 0 && received.is_multiple_of(self.list_page) {
                UFS_REQUESTS.inc();
            }
            received += 1;
            let (p, m) = entry
                .map_err(|e| self.map_err("list", dir, e))?
                .into_parts();
            if is_listed_dir_itself(&p, &dir_slash) {
                continue;
            }
            if self.s3_unaddressable(p.trim_end_matches('/')) {
                debug!(key = %p, "skipping a key that begins or ends with white space");
                continue;
            }
            if !take_one(budget) {
                return Ok(None);
            }
            out.push((p.trim_end_matches('/').to_string(), m));
        }
        Ok(Some(out))
    }

    /// A recursive S3 listing of `dir`, split where it can be: one delimited request (a
    /// single page) finds `dir`'s files and subdirectories; when that page holds all of them
    /// and there are at most `SPLIT_MAX_DIRS` subdirectories, each subdirectory's prefix is
    /// listed recursively, `SPLIT_CONCURRENCY` at a time, and the files come from the page
    /// itself (without subdirectories the page is the whole listing). Every prefix listing
    /// ends exactly where its subtree does, so the split costs the delimited request plus at
    /// least one per subtree, and takes the time of its slowest share instead of the sum of
    /// all pages. Otherwise (an empty, full or very wide first page): one sweep.
    async fn s3_list_tree(&self, dir: &str, max: usize) -> Result<Option<Vec<ObjectMeta>>> {
        let (dir_slash, mut lister) = self.lister(dir, false).await?;
        let mut top = Vec::new();
        // Only the first page (`list_page` entries, the directory's own marker included):
        // dropping the lister before asking for more sends no request.
        let mut received = 0;
        while received < self.list_page {
            let Some(entry) = lister.next().await else {
                break;
            };
            received += 1;
            let (p, m) = entry
                .map_err(|e| self.map_err("list", dir, e))?
                .into_parts();
            if !is_listed_dir_itself(&p, &dir_slash)
                && !self.s3_unaddressable(p.trim_end_matches('/'))
            {
                top.push((p, m));
            }
        }
        drop(lister);
        let subdirs = top.iter().filter(|(_, m)| m.is_dir()).count();
        if top.is_empty() || received >= self.list_page || subdirs > SPLIT_MAX_DIRS {
            // Empty: `s3_list` tells a missing directory from an empty one.
            return self.s3_list(dir, true, max).await;
        }
        let budget = AtomicUsize::new(max);
        let mut files = Vec::new();
        let mut prefixes = Vec::new();
        for (p, m) in top {
            if m.is_dir() {
                prefixes.push(p.trim_end_matches('/').to_string());
            } else if !take_one(&budget) {
                return Ok(None);
            } else {
                files.push((p, m));
            }
        }
        let budget = &budget;
        let shares: Vec<Option<Vec<(String, Metadata)>>> = futures::stream::iter(prefixes.clone())
            .map(|p| async move { self.list_entries_budget(&p, true, budget).await })
            .buffered(SPLIT_CONCURRENCY)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<Result<_>>()?;
        let mut all: Vec<ObjectMeta> = files.into_iter().map(s3_entry).collect();
        for (prefix, share) in prefixes.into_iter().zip(shares) {
            let Some(share) = share else {
                return Ok(None);
            };
            // The delimited page showed the subdirectory (a marker-only one has an empty
            // share): reported as a sweep reports a `dir/` marker.
            all.push(ObjectMeta::dir(&prefix));
            all.extend(share.into_iter().map(s3_entry));
        }
        Ok(Some(all))
    }

    async fn fs_list(&self, root: &Path, dir: &str, recursive: bool) -> Result<Vec<ObjectMeta>> {
        let meta = match self.fs_stat(root, dir).await {
            Ok(m) => m,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                return Err(Error::not_found(format!(
                    "list {}: no such directory",
                    self.full(dir)
                )))
            }
            Err(e) => return Err(e),
        };
        if meta.kind != EntryKind::Dir {
            return Err(Error::new(
                ErrorKind::NotADirectory,
                format!("list {}: not a directory", self.full(dir)),
            ));
        }
        // Walked here rather than by OpenDAL's lister, which completes a link's entry with a
        // stat that follows it (a link to a directory then breaks its entry invariants).
        // One lstat per entry gives the permission bits and link types, with the same ns
        // mtime that `stat` reports.
        UFS_REQUESTS.inc();
        let (root, dir_owned) = (root.to_path_buf(), dir.to_string());
        tokio::task::spawn_blocking(move || fs_walk(&root, &dir_owned, recursive))
            .await
            .map_err(|e| Error::internal(format!("list {}: {e}", self.full(dir))))?
            .map_err(|e| Error::from(e).context(format!("list {}", self.full(dir))))
    }

    async fn s3_list(
        &self,
        dir: &str,
        recursive: bool,
        max: usize,
    ) -> Result<Option<Vec<ObjectMeta>>> {
        let Some(entries) = self.list_entries_max(dir, recursive, max).await? else {
            return Ok(None);
        };
        if entries.is_empty() && !dir.is_empty() {
            // An empty listing: a file, an empty `dir/` marker, or nothing at all.
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
            UFS_REQUESTS.inc();
            return match self.op.stat(&format!("{dir}/")).await {
                Ok(_) => Ok(Some(Vec::new())),
                Err(e) if e.kind() == opendal::ErrorKind::NotFound => Err(Error::not_found(
                    format!("list {}: no such directory", self.full(dir)),
                )),
                Err(e) => Err(self.map_err("list", dir, e)),
            };
        }
        Ok(Some(entries.into_iter().map(s3_entry).collect()))
    }

    /// The listed files and directories with the attributes of their user metadata (one
    /// HEAD each, of a directory's marker, some in flight at once) when `list_attrs` asks for
    /// them; a file gone meanwhile is left out.
    async fn s3_with_attrs(&self, v: Vec<ObjectMeta>) -> Result<Vec<ObjectMeta>> {
        if !self.list_attrs {
            return Ok(v);
        }
        let out: Vec<Result<Option<ObjectMeta>>> = futures::stream::iter(v)
            .map(|m| async move {
                if m.kind == EntryKind::Dir {
                    // A directory's attributes are its marker's, if it has one.
                    return Ok(Some(self.s3_marker(&m.path).await?.unwrap_or(m)));
                }
                UFS_REQUESTS.inc();
                match self.op.stat(&m.path).await {
                    Ok(h) if !h.is_dir() => Ok(Some(s3_meta(m.path.clone(), &h))),
                    Ok(_) => Ok(Some(m)),
                    Err(e) if e.kind() == opendal::ErrorKind::NotFound => Ok(None),
                    Err(e) => Err(self.map_err("stat", &m.path, e)),
                }
            })
            .buffered(SPLIT_CONCURRENCY * 2)
            .collect()
            .await;
        out.into_iter().filter_map(|r| r.transpose()).collect()
    }

    /// Ranged GET with If-Match on the expected ETag: the store refuses a newer version.
    async fn s3_read(&self, path: &str, range: Range<u64>, etag: &str) -> Result<Buffer> {
        UFS_REQUESTS.inc();
        self.op
            .read_with(path)
            .range(range)
            .if_match(&format!("\"{etag}\""))
            .await
            .map_err(|e| self.map_err("read", path, e))
    }

    /// [`Self::s3_read`] received into page buffers; `None` when the receiver declined the
    /// answer (the caller asks again through the operator, which maps the error or retries).
    async fn s3_receive(
        &self,
        rx: &Receiver,
        path: &str,
        range: Range<u64>,
        etag: &str,
        piece: u64,
    ) -> Result<Option<Vec<Bytes>>> {
        let opts = opendal::options::ReadOptions {
            range: range.clone().into(),
            if_match: Some(format!("\"{etag}\"")),
            ..Default::default()
        };
        // Signed in the URL for long enough to outlast the request's own deadlines.
        let valid = self.timeout.saturating_mul(4).max(Duration::from_secs(300));
        let req = self
            .op
            .presign_read_options(path, valid, opts)
            .await
            .map_err(|e| self.map_err("read", path, e))?;
        let uri = req.uri().to_string();
        let headers = req
            .header()
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_bytes()))
            .collect();
        UFS_REQUESTS.inc();
        let request = crate::s3_receive::Request { uri: &uri, headers };
        match rx.get(&request, range, piece).await {
            Ok(Received::Pieces(pieces)) => {
                UFS_RECEIVES_DIRECT.inc();
                Ok(Some(pieces))
            }
            Ok(Received::Declined(why)) => {
                UFS_RECEIVES_DECLINED.inc();
                debug!(path = %self.full(path), why, "direct receive declined; reading through the operator");
                Ok(None)
            }
            Err(e) => Err(e.context(format!("read {}", self.full(path)))),
        }
    }

    /// A read guarded by stats before and after: the bytes are returned only if the object had
    /// `expected`'s fingerprint on both sides of the read, so they cannot mix versions.
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
        // The file version asked for is gone when a parent is a file now (trait invariants).
        let before = self.stat_inner(path).await.map_err(|e| {
            if e.kind() == ErrorKind::NotADirectory {
                Error::not_found(format!("read {}: not found", self.full(path)))
            } else {
                e
            }
        })?;
        // A directory there now: not the file version asked for.
        if before.kind == EntryKind::Dir || before.content_fingerprint() != want {
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

    /// The bytes `range` of `path`, as the store's response chunks (see `read`).
    async fn read_buffer(
        &self,
        path: &str,
        range: Range<u64>,
        expected: &ObjectMeta,
    ) -> Result<Buffer> {
        let Some((path, range)) = plan_read(path, &range, expected, |p| self.full(p))? else {
            return Ok(Buffer::new());
        };
        let buf = self
            .count_errors(UfsOp::Read, async {
                match (&self.backend, &expected.etag) {
                    (Backend::S3 { .. }, Some(etag)) => self.s3_read(path, range, etag).await,
                    (Backend::Fs { root }, _) => {
                        let len = range.end - range.start;
                        let one = self.fs_read(root, path, range, expected, len).await?;
                        Ok(Buffer::from(one))
                    }
                    _ => self.checked_read(path, range, expected).await,
                }
            })
            .await?;
        UFS_READ_BYTES.add(buf.len() as u64);
        Ok(buf)
    }

    async fn stat_inner(&self, path: &str) -> Result<ObjectMeta> {
        match &self.backend {
            Backend::Fs { root } => self.fs_stat(root, path).await,
            Backend::S3 { .. } => self.s3_stat(path).await,
        }
    }

    /// Counts a failed trait call in `UFS_ERRORS` (requests are counted where they are issued)
    /// and times it, retries included, as an `op` request of this store's mount.
    async fn count_errors<T>(
        &self,
        op: UfsOp,
        fut: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        let probe = match self.stall.admit(self.timeout) {
            Admit::Go => false,
            Admit::Probe => true,
            Admit::FailFast(since) => {
                UFS_ERRORS.inc();
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!(
                        "{} has not answered for {:?} (a request ran out of its deadline); \
                         failing at once until it answers again",
                        self.endpoint_display(),
                        since.elapsed()
                    ),
                ));
            }
        };
        let began = std::time::Instant::now();
        let r = fut.await;
        self.seconds[op as usize].since(began);
        let timed_out = matches!(&r, Err(e) if e.kind() == ErrorKind::Timeout);
        self.stall.record(began, timed_out, probe);
        if r.is_err() {
            UFS_ERRORS.inc();
        }
        r
    }
}

/// `field: "value"` in a `Debug` rendering (OpenDAL puts S3's `<Error>` there).
pub(crate) fn debug_field<'a>(text: &'a str, field: &str) -> Option<&'a str> {
    let start = text.find(&format!("{field}: \""))? + field.len() + 3;
    let len = text[start..].find('"')?;
    Some(&text[start..start + len])
}

/// A zero deadline would fail every request; say so instead.
pub(crate) fn check_timeout(timeout: Duration) -> Result<()> {
    if timeout.is_zero() {
        return Err(Error::invalid(
            "ufs_timeout must be greater than zero (e.g. 30s)",
        ));
    }
    Ok(())
}

/// The HTTP status of a failed response, from OpenDAL's response context (`Parts { status: 409`).
pub(crate) fn http_status(e: &opendal::Error) -> Option<u16> {
    let text = e.to_string();
    let start = text.find("Parts { status: ")? + "Parts { status: ".len();
    text.get(start..start + 3)?.parse().ok()
}

pub(crate) fn is_transport_error(msg: &str) -> bool {
    msg.starts_with("send http request") || msg.starts_with("read data from http response")
}

fn sources(e: &opendal::Error) -> impl Iterator<Item = &(dyn std::error::Error + 'static)> {
    let mut next = std::error::Error::source(e);
    std::iter::from_fn(move || {
        let cur = next?;
        next = cur.source();
        Some(cur)
    })
}

pub(crate) fn find_io_error(e: &opendal::Error) -> Option<&std::io::Error> {
    sources(e).find_map(|s| s.downcast_ref::<std::io::Error>())
}

/// The innermost cause, e.g. "Connection refused (os error 111)".
pub(crate) fn root_cause(e: &opendal::Error) -> String {
    sources(e)
        .last()
        .map(|s| s.to_string())
        .unwrap_or_else(|| e.message().to_string())
}

/// The entries below `dir` of a local store (its direct children, or with `recursive`
/// everything below, directories included), never following links. An entry removed
/// meanwhile is left out; a name that is not UTF-8 cannot be a store path and is skipped.
fn fs_walk(root: &Path, dir: &str, recursive: bool) -> std::io::Result<Vec<ObjectMeta>> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_string()];
    while let Some(d) = todo.pop() {
        // The directory itself opened, not a link there (`beneath`): one swapped for a link
        // since it was listed is not followed out of the store.
        let pinned = match beneath::whole(root, &d) {
            Ok(p) => p,
            Err(e) if d != dir && e.kind() == std::io::ErrorKind::NotFound => continue,
            // Swapped for a link since it was seen: gone as a directory.
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => match d == dir {
                true => return Err(std::io::Error::from_raw_os_error(libc::ENOTDIR)),
                false => continue,
            },
            Err(e) => return Err(e),
        };
        let entries = match std::fs::read_dir(&*pinned) {
            Ok(e) => e,
            Err(e) if d != dir && e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = entry?;
            let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                tracing::warn!(dir = %d, "skipping a file name that is not UTF-8");
                continue;
            };
            if name.starts_with(FS_WRITE_TEMP) {
                continue; // a write in progress, not an entry yet
            }
            let rel = if d.is_empty() {
                name
            } else {
                format!("{d}/{name}")
            };
            // fstatat of the name in the directory read, never following it.
            let Ok(md) = entry.metadata() else {
                continue; // raced delete
            };
            let Some(m) = fs_meta(&rel, &md) else {
                continue; // sockets, fifos, devices: not store entries
            };
            if recursive && m.kind == EntryKind::Dir {
                todo.push(rel);
            }
            out.push(m);
        }
    }
    Ok(out)
}

/// `read_pieces` of a local file: `pread` straight into the pieces (a pooled page buffer per
/// whole piece, see [`crate::pieces`]), no intermediate buffer and no user-space copy. The
/// version is checked through the open handle before and after reading, so the bytes are
/// those of the version asked for: a file replaced meanwhile is still read whole from the
/// old one (kept open), and one changed in place is refused as changed.
fn fs_read_pieces(
    root: &Path,
    path: &str,
    shown: &str,
    range: Range<u64>,
    want: &str,
    piece: u64,
) -> Result<Vec<Bytes>> {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let changed = || {
        Error::new(
            ErrorKind::ContentChanged,
            format!("read {shown}: the object changed since its metadata was read"),
        )
    };
    let io = |e: std::io::Error| Error::from(e).context(format!("read {shown}"));
    let opened = beneath::parent(root, path, false).and_then(|file| {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&*file)
    });
    let f = match opened {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Error::not_found(format!("read {shown}: not found")))
        }
        // Now a link (ELOOP): not the file whose metadata was read.
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Err(changed()),
        // A parent is a file (or a link) now: the version asked for is gone.
        Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => {
            return Err(Error::not_found(format!("read {shown}: not found")))
        }
        Err(e) => return Err(io(e)),
    };
    let version = |f: &std::fs::File| -> Result<()> {
        let md = f.metadata().map_err(io)?;
        if fs_is_version(shown, &md, want) {
            Ok(())
        } else {
            Err(changed())
        }
    };
    version(&f)?;
    let total = usize::try_from(range.end - range.start)
        .map_err(|_| Error::invalid(format!("read {shown}: range too large")))?;
    let piece = usize::try_from(piece.max(1)).unwrap_or(usize::MAX);
    let mut out = Vec::with_capacity(total.div_ceil(piece));
    let mut at = range.start;
    for mut buf in crate::piece_bufs(total, piece) {
        let dst = buf.as_mut_slice();
        match f.read_exact_at(dst, at) {
            Ok(()) => {}
            // Shorter than the version's size: it changed.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(changed()),
            Err(e) => return Err(io(e)),
        }
        at += dst.len() as u64;
        // A whole piece is checksummed now, while hot, for the disk tier (`bufpool::known_crc`).
        out.push(buf.freeze());
    }
    version(&f)?;
    Ok(out)
}

/// The file `path` of the local store at `root` opened read-only, if it is (through its open
/// handle, not a link) a file whose content fingerprint is `want`.
fn fs_version_file(root: &Path, path: &str, want: &str) -> Option<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&*beneath::parent(root, path, false).ok()?)
        .ok()?;
    let md = f.metadata().ok()?;
    fs_is_version(path, &md, want).then_some(f)
}

/// Whether `md` is of a file (a directory there now is not the file version asked for) whose
/// content fingerprint is `want`.
fn fs_is_version(shown: &str, md: &std::fs::Metadata, want: &str) -> bool {
    fs_meta(shown, md).is_some_and(|m| m.kind == EntryKind::File && m.content_fingerprint() == want)
}

/// An entry from `lstat` (a link's size is its target's length).
fn fs_meta(path: &str, md: &std::fs::Metadata) -> Option<ObjectMeta> {
    use std::os::unix::fs::FileTypeExt;
    let ft = md.file_type();
    let kind = if ft.is_dir() {
        EntryKind::Dir
    } else if ft.is_file() {
        EntryKind::File
    } else if ft.is_symlink() {
        EntryKind::Symlink
    } else if ft.is_fifo() {
        EntryKind::Special(SpecialKind::Fifo)
    } else if ft.is_socket() {
        EntryKind::Special(SpecialKind::Socket)
    } else if ft.is_char_device() {
        EntryKind::Special(SpecialKind::CharDevice)
    } else if ft.is_block_device() {
        EntryKind::Special(SpecialKind::BlockDevice)
    } else {
        return None;
    };
    Some(ObjectMeta {
        path: path.to_string(),
        kind,
        size: match kind {
            EntryKind::File | EntryKind::Symlink => md.len(),
            EntryKind::Dir | EntryKind::Special(_) => 0,
        },
        mtime: md.modified().ok(),
        etag: None,
        version: None,
        mode: Some(md.permissions().mode() & 0o7777),
        posix: Posix {
            uid: Some(md.uid()),
            gid: Some(md.gid()),
            atime: md.accessed().ok(),
            ctime: epoch_time(md.ctime(), md.ctime_nsec()),
            // Linux's dev_t keeps major < 4096 and minor < 2^20 in its low 32 bits, the
            // encoding FUSE carries.
            rdev: if ft.is_char_device() || ft.is_block_device() {
                md.rdev() as u32
            } else {
                0
            },
            nlink: (kind != EntryKind::Dir).then(|| md.nlink().min(u32::MAX as u64) as u32),
        },
    })
}

/// The mtime a local write gives its file: now, to the nanosecond, and always at least a
/// microsecond past the last one this process gave (a file system may keep only
/// microseconds). The kernel stamps files from a coarse clock (a few ms), so two writes of
/// one size in a row got the same size and mtime, the content fingerprint of a local file,
/// and a reader kept the pages it had cached of the earlier bytes.
fn unique_mtime() -> SystemTime {
    static LAST_NS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    let mut last = LAST_NS.load(Ordering::Relaxed);
    loop {
        let next = now.max(last.saturating_add(1_000));
        match LAST_NS.compare_exchange_weak(last, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return UNIX_EPOCH + Duration::from_nanos(next),
            Err(seen) => last = seen,
        }
    }
}

/// Name prefix of the hidden file a local write fills before renaming it over its target
/// ([`OpendalStore::fs_write`]; a random number follows); listings leave such names out. One
/// left by a crash mid-write is removed by `remove_dir` of its directory once abandoned
/// ([`FS_WRITE_ABANDONED`]; docs/SEMANTICS.md).
pub(crate) const FS_WRITE_TEMP: &str = ".silt-write-";

/// A new hidden write file in `dir` ([`FS_WRITE_TEMP`] and a random number), created
/// exclusively: a name left by a crash, or taken by a daemon on another host of a shared
/// directory, is skipped for another.
fn fs_create_hidden(dir: &Path) -> std::io::Result<(std::fs::File, PathBuf)> {
    use std::os::unix::fs::OpenOptionsExt;
    fs_make_hidden(dir, |tmp| {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(tmp)
    })
}

/// `make` run on a new hidden name in `dir` (see [`fs_create_hidden`]) until it does not find
/// the name taken (`EEXIST`, a few tries); what it made, and the name.
fn fs_make_hidden<T>(
    dir: &Path,
    mut make: impl FnMut(&Path) -> std::io::Result<T>,
) -> std::io::Result<(T, PathBuf)> {
    let mut tries = 0;
    loop {
        let tmp = dir.join(format!("{FS_WRITE_TEMP}{:016x}", rand::random::<u64>()));
        match make(&tmp) {
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && tries < 8 => tries += 1,
            made => return made.map(|m| (m, tmp)),
        }
    }
}

/// How long a hidden write file ([`FS_WRITE_TEMP`]) goes unchanged before it is taken for one a
/// killed daemon left: a write in progress changes it with every part it writes (8 MiB), so
/// only a writer stalled that long loses its file (its rename then fails: an error, not a loss).
const FS_WRITE_ABANDONED: Duration = Duration::from_secs(600);

/// Removes from `dir` the hidden write files ([`FS_WRITE_TEMP`]) unchanged for `age` or more:
/// invisible in listings, they would keep an apparently empty directory from being removed.
/// Stops at the first other entry (the directory is not empty anyway), so an `rmdir` of a
/// full directory reads no more of it than before. A missing `dir` is nothing to clear.
/// `shown`: the directory's store path, for the log (`dir` may be a descriptor's path).
fn fs_clear_abandoned_writes(dir: &Path, shown: &str, age: Duration) -> std::io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        if !entry
            .file_name()
            .to_string_lossy()
            .starts_with(FS_WRITE_TEMP)
        {
            return Ok(());
        }
        let Ok(md) = entry.metadata() else {
            continue; // renamed meanwhile: its write ended
        };
        let idle = md.modified().ok().and_then(|m| m.elapsed().ok());
        if md.is_file() && idle.is_some_and(|idle| idle >= age) {
            match std::fs::remove_file(entry.path()) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => tracing::info!(
                    dir = shown,
                    file = %entry.file_name().to_string_lossy(),
                    "removed an abandoned write"
                ),
            }
        }
    }
    Ok(())
}

/// Runs blocking file work from async code: on a multi-threaded runtime the worker hands its
/// other tasks on first (`block_in_place`); elsewhere (a current-thread runtime, no runtime)
/// it runs in place.
fn run_blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

/// Gives `file` the permission bits, owner and group of `old`, the file it is about to
/// replace. An owner this process may not give (not root) stays its own, as a copy's would.
fn keep_owner_and_mode(file: &std::fs::File, old: &std::fs::Metadata) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: fchown on a descriptor this function borrows; no memory is passed.
    let chowned = unsafe { libc::fchown(file.as_raw_fd(), old.uid(), old.gid()) };
    if chowned != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EPERM) {
            return Err(e);
        }
    }
    // After chown, which clears the set-id bits.
    file.set_permissions(std::fs::Permissions::from_mode(old.mode() & 0o7777))
}

/// Largest S3 object whose attributes can be changed (each change rewrites it whole).
pub const S3_ATTR_REWRITE_MAX: u64 = 64 << 20;

/// Part size of a multipart upload (`write_from`): memory per upload in flight.
pub(crate) const WRITE_PART: usize = 8 << 20;
/// S3 allows at most this many parts per multipart upload.
const MAX_PARTS: u64 = 10_000;

/// The part size for an upload of `len` bytes: [`WRITE_PART`], or larger (whole MiB) when
/// that many parts would pass S3's limit (so a 5 TiB file uploads in 525 MiB parts).
pub(crate) fn part_size(len: u64) -> usize {
    let need = len.div_ceil(MAX_PARTS).div_ceil(1 << 20) << 20;
    usize::try_from(need).map_or(usize::MAX, |n| n.max(WRITE_PART))
}

/// Subdirectories a recursive listing is split into at most (see `s3_list_tree`); more are
/// left to one sweep, whose pages then hold several subtrees each.
const SPLIT_MAX_DIRS: usize = 64;
/// Subdirectory listings of one split sweep in flight at once.
const SPLIT_CONCURRENCY: usize = 8;

/// Listings include the directory itself (fs always, S3 when a `dir/` marker object exists).
pub(crate) fn is_listed_dir_itself(p: &str, dir_slash: &str) -> bool {
    p == dir_slash || p == "/" || p.is_empty()
}

/// A listed S3 entry as Silt sees it.
fn s3_entry((p, m): (String, Metadata)) -> ObjectMeta {
    if m.is_dir() {
        ObjectMeta::dir(&p)
    } else {
        s3_meta(p, &m)
    }
}

/// Takes one entry from a listing budget; `false` once it is spent.
pub(crate) fn take_one(budget: &AtomicUsize) -> bool {
    budget
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| b.checked_sub(1))
        .is_ok()
}

/// S3 metadata as `stat` and `list` both report it, so their fingerprints agree: the ETag
/// without quotes, the mtime in whole seconds (HEAD has second precision, listings more), and
/// no version id (only HEAD returns one, so it would make the two disagree).
pub(crate) fn s3_meta(path: String, m: &Metadata) -> ObjectMeta {
    let mtime = m.last_modified().and_then(|t| {
        let secs = SystemTime::from(t)
            .duration_since(UNIX_EPOCH)
            .ok()?
            .as_secs();
        Some(UNIX_EPOCH + Duration::from_secs(secs))
    });
    let user = m.user_metadata();
    let attr = |k: &str| -> Option<String> {
        user.as_ref()?
            .into_iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(k))
            .map(|(_, v)| v.to_string())
    };
    let mut meta = ObjectMeta {
        path,
        kind: EntryKind::File,
        size: m.content_length(),
        mtime,
        etag: m.etag().map(strip_etag),
        version: None,
        mode: None,
        posix: Posix::default(),
    };
    s3_apply_attrs(&mut meta, attr);
    meta
}

/// `meta` with the POSIX attributes of an object's user metadata (`attr` looks a key up):
/// s3fs-fuse keeps a link as an object whose body is the target, a special file as an empty
/// object, each typed by its mode, and the file's mtime in its metadata (Last-Modified is the
/// upload's time). A directory marker keeps its kind.
pub(crate) fn s3_apply_attrs(meta: &mut ObjectMeta, attr: impl Fn(&str) -> Option<String>) {
    let time = |k: &str| attr(k).and_then(|v| parse_s3_time(&v));
    let id = |k: &str| attr(k).and_then(|v| v.trim().parse::<u32>().ok());
    let raw_mode = id(S3_MODE);
    if meta.kind != EntryKind::Dir {
        meta.kind = match raw_mode {
            Some(m) if m & S_IFMT == S_IFLNK => EntryKind::Symlink,
            Some(m) => SpecialKind::from_mode(m).map_or(EntryKind::File, EntryKind::Special),
            None => EntryKind::File,
        };
    }
    if meta.kind.is_special() || meta.kind == EntryKind::Dir {
        meta.size = 0;
    }
    meta.mtime = time(S3_MTIME).or(meta.mtime);
    meta.mode = raw_mode.map(|v| v & 0o7777);
    meta.posix = Posix {
        uid: id(S3_UID),
        gid: id(S3_GID),
        atime: time(S3_ATIME),
        ctime: time(S3_CTIME),
        rdev: match meta.kind {
            EntryKind::Special(k) if k.is_device() => id(S3_RDEV).unwrap_or(0),
            _ => 0,
        },
        nlink: None,
    };
}

/// User metadata keys of POSIX attributes, as s3fs-fuse writes them (`x-amz-meta-` + key):
/// the mode in decimal with the file type bits, ids in decimal, times in seconds since the
/// epoch (a fraction accepted on reading).
pub(crate) const S3_MODE: &str = "mode";
const S3_UID: &str = "uid";
const S3_GID: &str = "gid";
pub(crate) const S3_MTIME: &str = "mtime";
const S3_ATIME: &str = "atime";
pub(crate) const S3_CTIME: &str = "ctime";
/// A device node's number, in decimal (s3fs-fuse's `x-amz-meta-rdev`).
const S3_RDEV: &str = "rdev";

/// `S_IFREG`: the type bits s3fs-fuse stores with a regular file's mode.
const S_IFREG: u32 = 0o100000;
/// `S_IFLNK`: the type bits of a symbolic link's mode (s3fs-fuse: a link object).
pub(crate) const S_IFLNK: u32 = 0o120000;
/// `S_IFDIR`: the type bits s3fs-fuse stores with a directory marker's mode.
const S_IFDIR: u32 = 0o040000;

fn parse_s3_time(v: &str) -> Option<SystemTime> {
    let v = v.trim();
    let (secs, frac) = v.split_once('.').unwrap_or((v, ""));
    let secs: u64 = secs.parse().ok()?;
    let digits: String = frac.chars().take(9).collect();
    let nanos = if digits.is_empty() {
        0
    } else {
        let n: u32 = digits.parse().ok()?;
        n * 10u32.pow(9 - digits.len() as u32)
    };
    UNIX_EPOCH.checked_add(Duration::new(secs, nanos))
}

pub(crate) fn secs(t: SystemTime) -> String {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
        .to_string()
}

/// The user metadata of an object with the attributes of `m` changed by `set`, keys without
/// the `x-amz-meta-` prefix (OpenDAL adds it).
pub(crate) fn s3_user_metadata(m: &ObjectMeta, set: &SetAttrs) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let ty = match m.kind {
        EntryKind::Symlink => S_IFLNK,
        EntryKind::Dir => S_IFDIR,
        EntryKind::Special(k) => k.type_bits(),
        EntryKind::File => S_IFREG,
    };
    if let Some(mode) = set.mode.or(m.mode) {
        out.push((S3_MODE.to_string(), (ty | (mode & 0o7777)).to_string()));
    }
    if let Some(uid) = set.uid.or(m.posix.uid) {
        out.push((S3_UID.to_string(), uid.to_string()));
    }
    if let Some(gid) = set.gid.or(m.posix.gid) {
        out.push((S3_GID.to_string(), gid.to_string()));
    }
    if let Some(t) = set
        .mtime
        .or(m.mtime.filter(|_| !set.is_empty() || m.mode.is_some()))
    {
        out.push((S3_MTIME.to_string(), secs(t)));
    }
    if let Some(t) = set.atime.or(m.posix.atime) {
        out.push((S3_ATIME.to_string(), secs(t)));
    }
    out.push((S3_CTIME.to_string(), secs(SystemTime::now())));
    if m.posix.rdev != 0 {
        out.push((S3_RDEV.to_string(), m.posix.rdev.to_string()));
    }
    out
}

/// A time from `stat`'s seconds and nanoseconds, if it is after the epoch.
fn epoch_time(secs: i64, nanos: i64) -> Option<SystemTime> {
    let secs = u64::try_from(secs).ok()?;
    let nanos = u32::try_from(nanos).ok()?;
    UNIX_EPOCH.checked_add(Duration::new(secs, nanos))
}

/// `chmod`, `lchown` and `utimensat` of the entry `path` of the local store at `root`, as
/// asked; none follows a link (`beneath`).
fn fs_set_attrs(root: &Path, path: &str, a: &SetAttrs) -> std::io::Result<()> {
    let entry = beneath::parent(root, path, false)?;
    let p = &*entry;
    // Owner first: chown clears setuid/setgid, which a mode given with it must keep.
    if a.uid.is_some() || a.gid.is_some() {
        std::os::unix::fs::lchown(p, a.uid, a.gid)?;
    }
    // chmod follows links (Linux keeps no mode on a link): it is given the entry itself,
    // opened without following, so it never changes a link's target (maybe outside the store).
    if let Some(mode) = a.mode {
        match entry.entry() {
            Ok(entry) => {
                std::fs::set_permissions(&*entry, std::fs::Permissions::from_mode(mode & 0o7777))?
            }
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {} // a link: no mode of its own
            Err(e) => return Err(e),
        }
    }
    if a.atime.is_some() || a.mtime.is_some() {
        let ts = |t: Option<SystemTime>| match t.map(|t| t.duration_since(UNIX_EPOCH)) {
            Some(Ok(d)) => libc::timespec {
                tv_sec: d.as_secs() as libc::time_t,
                tv_nsec: d.subsec_nanos() as _,
            },
            // Before the epoch: the epoch.
            Some(Err(_)) => libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            None => libc::timespec {
                tv_sec: 0,
                tv_nsec: libc::UTIME_OMIT,
            },
        };
        let times = [ts(a.atime), ts(a.mtime)];
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes())
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
        // SAFETY: a valid C string and two timespecs.
        let rc = unsafe {
            libc::utimensat(
                libc::AT_FDCWD,
                c.as_ptr(),
                times.as_ptr(),
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Whether a local operation's error says its path (or a parent) is not there.
fn fs_gone(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR))
}

/// Removes the file or link `path` of the local store at `root` (an empty directory too, as
/// OpenDAL's local delete did); a missing one, or one below a file, is nothing to remove.
fn fs_delete(root: &Path, path: &str) -> std::io::Result<()> {
    let p = match beneath::parent(root, path, false) {
        Err(e) if fs_gone(&e) => return Ok(()),
        p => p?,
    };
    let removed = match std::fs::symlink_metadata(&*p) {
        Ok(m) if m.is_dir() => std::fs::remove_dir(&*p),
        Ok(_) => std::fs::remove_file(&*p),
        Err(e) => Err(e),
    };
    match removed {
        Err(e) if fs_gone(&e) => Ok(()),
        r => r,
    }
}

/// `mkdir -p path` in the local store at `root`, each directory made beneath the last; an
/// existing directory is done, anything else there (a link included) `EEXIST`.
fn fs_create_dir(root: &Path, path: &str) -> std::io::Result<()> {
    let p = beneath::parent(root, path, true)?;
    match std::fs::create_dir(&*p) {
        Err(e)
            if e.kind() == std::io::ErrorKind::AlreadyExists
                && std::fs::symlink_metadata(&*p).is_ok_and(|m| m.is_dir()) =>
        {
            Ok(())
        }
        r => r,
    }
}

/// `rmdir path` in the local store at `root` (`ENOTEMPTY` if anything is left in it), after
/// the hidden files of writes a killed daemon left there; a missing one is nothing to remove.
fn fs_remove_dir(root: &Path, path: &str) -> std::io::Result<()> {
    let p = match beneath::parent(root, path, false) {
        Err(e) if fs_gone(&e) => return Ok(()),
        p => p?,
    };
    match p.entry() {
        Ok(dir) => fs_clear_abandoned_writes(&dir, path, FS_WRITE_ABANDONED)?,
        Err(e) if fs_gone(&e) => return Ok(()),
        // A link: not a directory (rmdir below says so).
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {}
        Err(e) => return Err(e),
    }
    match std::fs::remove_dir(&*p) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

/// The link `from` of the local store at `root` copied as a link to `to` (made under a hidden
/// name beside it, then renamed over it: `to` is replaced whole, its parents made).
fn fs_copy_link(root: &Path, from: &str, to: &str) -> std::io::Result<()> {
    let target = std::fs::read_link(&*beneath::parent(root, from, false)?)?;
    let dst = beneath::parent(root, to, true)?;
    let ((), tmp) = fs_make_hidden(dst.dir(), |tmp| std::os::unix::fs::symlink(&target, tmp))?;
    std::fs::rename(&tmp, &*dst).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// `rename(2)` of `from` to `to` in the local store at `root` (files, links and directories
/// alike, none followed), the parents of `to` made.
fn fs_rename(root: &Path, from: &str, to: &str) -> std::io::Result<()> {
    // A parent of `from` that is a file or a link: `from` is missing.
    let src = beneath::parent(root, from, false).map_err(|e| match e.raw_os_error() {
        Some(libc::ENOTDIR) => std::io::Error::from_raw_os_error(libc::ENOENT),
        _ => e,
    })?;
    let dst = beneath::parent(root, to, true)?;
    std::fs::rename(&*src, &*dst)
}

fn strip_etag(etag: &str) -> String {
    let e = etag.trim();
    let e = e.strip_prefix("W/").unwrap_or(e);
    e.trim_matches('"').to_string()
}

#[async_trait]
impl UnderStore for OpendalStore {
    fn uri(&self) -> &str {
        &self.uri
    }

    fn capabilities(&self) -> Capabilities {
        // OpenDAL's native rename (local directories) is `rename(2)`, which moves directories
        // too; stores without one get the copy-then-delete fallback, for files only.
        let rename_dirs = self.op.info().capability().rename;
        match self.backend {
            Backend::Fs { .. } => Capabilities {
                native_recursive_list: false,
                conditional_read: false,
                rename_dirs,
                write_replaces_attrs: false,
                list_without_attrs: false,
                long_paths: true,
            },
            Backend::S3 { .. } => Capabilities {
                native_recursive_list: true,
                conditional_read: true,
                rename_dirs,
                write_replaces_attrs: true,
                list_without_attrs: !self.list_attrs,
                long_paths: false,
            },
        }
    }

    async fn stat(&self, path: &str) -> Result<ObjectMeta> {
        let path = normalize_path(path)?;
        self.count_errors(UfsOp::Stat, self.stat_inner(path)).await
    }

    async fn list(&self, dir: &str, recursive: bool) -> Result<Vec<ObjectMeta>> {
        let dir = normalize_path(dir)?;
        self.count_errors(UfsOp::List, async {
            match &self.backend {
                Backend::Fs { root } => self.fs_list(root, dir, recursive).await,
                Backend::S3 { .. } => {
                    let v = self
                        .s3_list(dir, recursive, usize::MAX)
                        .await?
                        .unwrap_or_default();
                    self.s3_with_attrs(v).await
                }
            }
        })
        .await
    }

    async fn list_tree(&self, dir: &str, max: usize) -> Result<Option<Vec<ObjectMeta>>> {
        let dir = normalize_path(dir)?;
        self.count_errors(UfsOp::List, async {
            match &self.backend {
                Backend::Fs { root } => {
                    let all = self.fs_list(root, dir, true).await?;
                    Ok((all.len() <= max).then_some(all))
                }
                Backend::S3 { .. } => match self.s3_list_tree(dir, max).await? {
                    Some(v) => self.s3_with_attrs(v).await.map(Some),
                    None => Ok(None),
                },
            }
        })
        .await
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
        if let Backend::Fs { root } = &self.backend {
            let Some((path, range)) = plan_read(path, &range, expected, |p| self.full(p))? else {
                return Ok(Vec::new());
            };
            let got = self
                .count_errors(
                    UfsOp::Read,
                    self.fs_read(root, path, range, expected, piece),
                )
                .await?;
            UFS_READ_BYTES.add(got.iter().map(|p| p.len() as u64).sum());
            return Ok(got);
        }
        if let (
            Backend::S3 {
                receive: Some(rx), ..
            },
            Some(etag),
        ) = (&self.backend, &expected.etag)
        {
            let Some((path, range)) = plan_read(path, &range, expected, |p| self.full(p))? else {
                return Ok(Vec::new());
            };
            let got = self
                .count_errors(UfsOp::Read, self.s3_receive(rx, path, range, etag, piece))
                .await?;
            if let Some(pieces) = got {
                UFS_READ_BYTES.add(pieces.iter().map(|p| p.len() as u64).sum());
                return Ok(pieces);
            }
        }
        // From the response's chunks straight into the pieces: one copy, not `to_bytes`'s
        // plus a split's.
        Ok(crate::pieces(
            self.read_buffer(path, range, expected).await?,
            piece,
        ))
    }

    async fn local_file(&self, path: &str, expected: &ObjectMeta) -> Option<std::fs::File> {
        let Backend::Fs { root } = &self.backend else {
            return None;
        };
        let (root, path) = (root.clone(), normalize_path(path).ok()?.to_string());
        let want = expected.content_fingerprint();
        tokio::task::spawn_blocking(move || fs_version_file(&root, &path, &want))
            .await
            .ok()
            .flatten()
    }

    async fn write(&self, path: &str, data: Bytes) -> Result<ObjectMeta> {
        let path = self.writable(path)?;
        let size = data.len() as u64;
        if let Backend::Fs { root } = &self.backend {
            return self
                .count_errors(UfsOp::Write, async {
                    self.fs_write(root, path, &data, size, None)
                })
                .await;
        }
        self.count_errors(UfsOp::Write, async {
            UFS_REQUESTS.inc();
            let written = self
                .op
                .write(path, data)
                .await
                .map_err(|e| self.map_err("write", path, e))?;
            self.written_meta(path, &written, size).await
        })
        .await
    }

    async fn write_from(
        &self,
        path: &str,
        src: &dyn silt_common::io::ReadAt,
        len: u64,
    ) -> Result<ObjectMeta> {
        self.write_from_meta(path, src, len, None).await
    }

    async fn write_from_attrs(
        &self,
        path: &str,
        src: &dyn silt_common::io::ReadAt,
        len: u64,
        attrs: &SetAttrs,
    ) -> Result<ObjectMeta> {
        match &self.backend {
            // One upload with the attributes in its user metadata.
            Backend::S3 { .. } if !attrs.is_empty() => {
                let base = ObjectMeta::empty_file(path);
                let user = s3_user_metadata(&base, attrs);
                let mut meta = self
                    .write_from_meta(path, src, len, Some(user.clone()))
                    .await?;
                // The PUT's answer repeats no user metadata and no Last-Modified: the
                // attributes are the ones sent, and a version given no mtime was made now
                // (its x-amz-meta-ctime, to the second, as S3's Last-Modified is), so a
                // rewrite (a truncate) does not go on showing the old version's times.
                s3_apply_attrs(&mut meta, |k| {
                    user.iter()
                        .find(|(key, _)| key.eq_ignore_ascii_case(k))
                        .map(|(_, v)| v.clone())
                });
                if meta.mtime.is_none() {
                    meta.mtime = meta.posix.ctime;
                }
                Ok(meta)
            }
            _ => {
                let meta = self.write_from(path, src, len).await?;
                if attrs.is_empty() {
                    return Ok(meta);
                }
                self.set_attrs(path, attrs).await
            }
        }
    }

    async fn delete(&self, path: &str) -> Result<()> {
        let path = normalize_path(path)?;
        if path.is_empty() {
            return Err(Error::invalid(format!(
                "delete {}: cannot delete the store root",
                self.uri
            )));
        }
        self.count_errors(UfsOp::Delete, async {
            UFS_REQUESTS.inc();
            if let Backend::Fs { root } = &self.backend {
                return run_blocking(|| fs_delete(root, path))
                    .map_err(|e| Error::from(e).context(format!("delete {}", self.full(path))));
            }
            if self.s3_unaddressable(path) {
                return Ok(()); // nothing this store can see is there
            }
            match self.op.delete(path).await {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == opendal::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(self.map_err("delete", path, e)),
            }
        })
        .await
    }

    async fn create_dir(&self, path: &str) -> Result<ObjectMeta> {
        let path = self.writable(path)?;
        self.count_errors(UfsOp::Write, async {
            // Local directories: each made beneath the last (`beneath`); S3: OpenDAL writes
            // the zero-byte `path/` marker (its simulated `create_dir`).
            if let Backend::Fs { root } = &self.backend {
                UFS_REQUESTS.inc();
                run_blocking(|| fs_create_dir(root, path))
                    .map_err(|e| Error::from(e).context(format!("mkdir {}", self.full(path))))?;
                return self.fs_stat(root, path).await;
            }
            if !self.op.info().capability().create_dir {
                return Err(Error::new(
                    ErrorKind::Unsupported,
                    format!(
                        "mkdir {}: the store cannot create directories",
                        self.full(path)
                    ),
                ));
            }
            // The marker carries its making's time (to the second, as S3 keeps times), so
            // the new directory does not show the mount's start as its times.
            let now = UNIX_EPOCH
                + Duration::from_secs(
                    SystemTime::now()
                        .duration_since(UNIX_EPOCH)
                        .map_or(0, |d| d.as_secs()),
                );
            let made = SetAttrs {
                mtime: Some(now),
                atime: Some(now),
                ..Default::default()
            };
            UFS_REQUESTS.inc();
            self.s3_put_marker(
                path,
                s3_user_metadata(&ObjectMeta::dir(path), &made),
                "mkdir",
            )
            .await?;
            let mut dir = ObjectMeta::dir(path);
            dir.mtime = Some(now);
            dir.posix.atime = Some(now);
            dir.posix.ctime = Some(now);
            Ok(dir)
        })
        .await
    }

    async fn remove_dir(&self, path: &str) -> Result<()> {
        let path = self.writable(path)?;
        self.count_errors(UfsOp::Delete, async {
            if let Backend::Fs { root } = &self.backend {
                UFS_REQUESTS.inc();
                return run_blocking(|| fs_remove_dir(root, path))
                    .map_err(|e| Error::from(e).context(format!("rmdir {}", self.full(path))));
            }
            // Empty? One listing of at most two keys: the directory's own marker and one more.
            let dir_slash = format!("{path}/");
            UFS_REQUESTS.inc();
            let listed = self.op.lister_with(&dir_slash).limit(2).await;
            let mut lister = match listed {
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
            // Local: rmdir (which still refuses a directory filled meanwhile); S3: the marker.
            UFS_REQUESTS.inc();
            match self.op.delete(&dir_slash).await {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == opendal::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(self.map_err("rmdir", path, e)),
            }
        })
        .await
    }

    async fn rename(&self, from: &str, to: &str) -> Result<ObjectMeta> {
        let from = self.writable(from)?;
        let to = self.writable(to)?;
        let cap = self.op.info().capability();
        self.count_errors(UfsOp::Rename, async {
            if from == to {
                return self.stat_inner(to).await;
            }
            if let Backend::Fs { root } = &self.backend {
                // One rename(2) (files, links and directories alike), parents of `to` made.
                UFS_REQUESTS.inc();
                run_blocking(|| fs_rename(root, from, to)).map_err(|e| {
                    Error::from(e).context(format!("rename {} to {to}", self.full(from)))
                })?;
                return self.stat_inner(to).await;
            }
            if cap.rename {
                // Native (local directories): one atomic rename(2), parents of `to` created.
                UFS_REQUESTS.inc();
                self.op
                    .rename(from, to)
                    .await
                    .map_err(|e| self.map_err("rename", from, e))?;
                return self.stat_inner(to).await;
            }
            if !cap.copy {
                return Err(Error::new(
                    ErrorKind::Unsupported,
                    format!(
                        "rename {}: the store has neither rename nor copy",
                        self.full(from)
                    ),
                ));
            }
            // S3: copy, then delete the source. Not atomic: a failure in between leaves both.
            let meta = self.copy_file(from, to).await?;
            UFS_REQUESTS.inc();
            match self.op.delete(from).await {
                Ok(()) => Ok(meta),
                Err(e) if e.kind() == opendal::ErrorKind::NotFound => Ok(meta),
                Err(e) => Err(self.map_err("rename: delete", from, e)),
            }
        })
        .await
    }

    async fn copy(&self, from: &str, to: &str) -> Result<ObjectMeta> {
        let from = self.writable(from)?;
        let to = self.writable(to)?;
        self.count_errors(UfsOp::Write, async {
            if !self.op.info().capability().copy {
                return Err(Error::new(
                    ErrorKind::Unsupported,
                    format!("copy {}: the store cannot copy", self.full(from)),
                ));
            }
            self.copy_file(from, to).await
        })
        .await
    }

    async fn symlink(&self, path: &str, target: &str) -> Result<ObjectMeta> {
        let path = self.writable(path)?;
        self.count_errors(UfsOp::Write, async {
            match &self.backend {
                Backend::Fs { root } => {
                    UFS_REQUESTS.inc();
                    let made = || {
                        std::os::unix::fs::symlink(target, &*beneath::parent(root, path, false)?)
                    };
                    run_blocking(made).map_err(|e| {
                        let kind = e.kind();
                        let e = Error::from(e).context(format!("symlink {}", self.full(path)));
                        if kind == std::io::ErrorKind::NotFound {
                            Error::not_found(e.to_string())
                        } else {
                            e
                        }
                    })?;
                    self.fs_stat(root, path).await
                }
                Backend::S3 { .. } => {
                    let now = secs(SystemTime::now());
                    let user = vec![
                        (S3_MODE.to_string(), (S_IFLNK | 0o777).to_string()),
                        (S3_MTIME.to_string(), now.clone()),
                        (S3_CTIME.to_string(), now),
                    ];
                    self.s3_create_new(path, target.as_bytes().to_vec(), user, "symlink")
                        .await
                }
            }
        })
        .await
    }

    async fn read_link(&self, path: &str) -> Result<String> {
        let path = normalize_path(path)?;
        self.count_errors(UfsOp::Stat, async {
            let not_link =
                || Error::invalid(format!("readlink {}: not a symbolic link", self.full(path)));
            let target = match &self.backend {
                Backend::Fs { root } => {
                    UFS_REQUESTS.inc();
                    match run_blocking(|| std::fs::read_link(&*beneath::parent(root, path, false)?))
                    {
                        Ok(t) => t.into_os_string().into_vec(),
                        Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {
                            return Err(not_link())
                        }
                        Err(e)
                            if matches!(
                                e.kind(),
                                std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                            ) =>
                        {
                            return Err(Error::not_found(format!(
                                "readlink {}: not found",
                                self.full(path)
                            )))
                        }
                        Err(e) => {
                            return Err(
                                Error::from(e).context(format!("readlink {}", self.full(path)))
                            )
                        }
                    }
                }
                Backend::S3 { .. } => {
                    let m = self.s3_stat(path).await?;
                    if m.kind != EntryKind::Symlink {
                        return Err(not_link());
                    }
                    let etag = m.etag.clone().unwrap_or_default();
                    // A target is a path (PATH_MAX): anything larger is not a link s3fs wrote.
                    if m.size > 4096 {
                        return Err(Error::invalid(format!(
                            "readlink {}: a {}-byte target is too long",
                            self.full(path),
                            m.size
                        )));
                    }
                    self.s3_read(path, 0..m.size, &etag).await?.to_vec()
                }
            };
            String::from_utf8(target).map_err(|_| {
                Error::invalid(format!(
                    "readlink {}: the target is not UTF-8",
                    self.full(path)
                ))
            })
        })
        .await
    }

    async fn set_attrs(&self, path: &str, attrs: &SetAttrs) -> Result<ObjectMeta> {
        let path = normalize_path(path)?;
        self.count_errors(UfsOp::Write, async {
            match &self.backend {
                Backend::Fs { root } => {
                    UFS_REQUESTS.inc();
                    run_blocking(|| fs_set_attrs(root, path, attrs)).map_err(|e| {
                        let e = if e.kind() == std::io::ErrorKind::NotFound {
                            Error::not_found(e.to_string())
                        } else {
                            Error::from(e)
                        };
                        e.context(format!("set attributes of {}", self.full(path)))
                    })?;
                    self.fs_stat(root, path).await
                }
                Backend::S3 { .. } if self.s3_unaddressable(path) => self.s3_stat(path).await,
                Backend::S3 { .. } => self.s3_set_attrs(path, attrs).await,
            }
        })
        .await
    }

    async fn mknod(
        &self,
        path: &str,
        kind: SpecialKind,
        rdev: u32,
        attrs: &SetAttrs,
    ) -> Result<ObjectMeta> {
        let path = self.writable(path)?;
        let rdev = if kind.is_device() { rdev } else { 0 };
        self.count_errors(UfsOp::Write, async {
            match &self.backend {
                Backend::Fs { root } => {
                    UFS_REQUESTS.inc();
                    let mode = kind.type_bits() | attrs.mode.unwrap_or(0o644) & 0o7777;
                    run_blocking(|| fs_mknod(root, path, mode, rdev))
                        .map_err(|e| fs_error(e, format!("mknod {}", self.full(path))))?;
                    // The process's umask applied to mknod's bits: set as asked, with the owner.
                    let set = SetAttrs {
                        mode: Some(attrs.mode.unwrap_or(0o644) & 0o7777),
                        ..*attrs
                    };
                    run_blocking(|| fs_set_attrs(root, path, &set)).map_err(|e| {
                        fs_error(
                            e,
                            format!("mknod {}: setting its attributes", self.full(path)),
                        )
                    })?;
                    self.fs_stat(root, path).await
                }
                Backend::S3 { .. } => {
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
                    self.s3_create_new(path, Vec::new(), s3_user_metadata(&base, &set), "mknod")
                        .await
                }
            }
        })
        .await
    }

    async fn hard_link(&self, from: &str, to: &str) -> Result<ObjectMeta> {
        let from = normalize_path(from)?;
        let to = self.writable(to)?;
        let Backend::Fs { root } = &self.backend else {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "link {} to {}: an object store cannot give one object two names",
                    self.full(from),
                    self.full(to)
                ),
            ));
        };
        self.count_errors(UfsOp::Write, async {
            UFS_REQUESTS.inc();
            run_blocking(|| fs_hard_link(root, from, to)).map_err(|e| {
                fs_error(e, format!("link {} to {}", self.full(from), self.full(to)))
            })?;
            self.fs_stat(root, to).await
        })
        .await
    }
}

/// An S3 answer's status as an error of its kind.
fn s3_status_error(status: http::StatusCode, msg: String) -> Error {
    let kind = match status.as_u16() {
        403 => ErrorKind::PermissionDenied,
        404 => ErrorKind::NotFound,
        408 | 429 | 500.. => ErrorKind::Unavailable,
        _ => ErrorKind::Internal,
    };
    Error::new(kind, msg)
}

/// A local operation's error in the store's terms: a missing path (or parent) `NotFound`,
/// an existing target `AlreadyExists`, anything else as the system said.
fn fs_error(e: std::io::Error, what: String) -> Error {
    let kind = match e.kind() {
        _ if fs_gone(&e) => Some(ErrorKind::NotFound),
        std::io::ErrorKind::AlreadyExists => Some(ErrorKind::AlreadyExists),
        _ => None,
    };
    match kind {
        Some(kind) => Error::new(kind, format!("{what}: {e}")),
        None => Error::from(e).context(what),
    }
}

/// `mknod(2)` of `path` in the local store at `root` (its parent must exist), not following
/// a link there (`beneath`).
fn fs_mknod(root: &Path, path: &str, mode: u32, rdev: u32) -> std::io::Result<()> {
    mknod_at(&beneath::parent(root, path, false)?, mode, rdev)
}

/// `mknod(2)` of the path `p`.
fn mknod_at(p: &Path, mode: u32, rdev: u32) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(p.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: a valid C string; mknod reads nothing else.
    if unsafe { libc::mknod(c.as_ptr(), mode as libc::mode_t, libc::dev_t::from(rdev)) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The special file `from` of the local store at `root` copied as such to `to` (the node
/// made under a hidden name beside it with the same type, number, mode and owner, then
/// renamed over it): a FIFO's or device's "content" is never read.
fn fs_copy_special(root: &Path, from: &str, to: &str) -> std::io::Result<()> {
    let md = std::fs::symlink_metadata(&*beneath::parent(root, from, false)?)?;
    let dst = beneath::parent(root, to, true)?;
    let ((), tmp) = fs_make_hidden(dst.dir(), |tmp| mknod_at(tmp, md.mode(), md.rdev() as u32))?;
    let made = std::os::unix::fs::lchown(&tmp, Some(md.uid()), Some(md.gid()))
        .and_then(|()| {
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(md.mode() & 0o7777))
        })
        .and_then(|()| std::fs::rename(&tmp, &*dst));
    made.inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// `link(2)` of `from` to `to` in the local store at `root`: neither is followed if it is a
/// link (Linux's `link` gives the link itself a second name), both resolved `beneath`.
fn fs_hard_link(root: &Path, from: &str, to: &str) -> std::io::Result<()> {
    let src = beneath::parent(root, from, false).map_err(|e| match e.raw_os_error() {
        Some(libc::ENOTDIR) => std::io::Error::from_raw_os_error(libc::ENOENT),
        _ => e,
    })?;
    let dst = beneath::parent(root, to, false)?;
    std::fs::hard_link(&*src, &*dst)
}

/// Keys given as Silt options, for the signer. Its `Debug` shows no secret: the credential
/// chain logs each provider it tries with `{:?}` at debug level (reqsign's own static provider
/// printed the secret there, twice).
struct StaticKeys {
    access_key_id: String,
    secret_access_key: String,
}

impl StaticKeys {
    /// The keys from Silt's options; one of the pair missing there is taken from the AWS
    /// environment variable of the same name (both are documented sources). `None` if
    /// neither is given as an option (the environment and the AWS files are asked later).
    fn from_options(access_key_id: &str, secret_access_key: &str) -> Result<Option<StaticKeys>> {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let (id, secret) =
            match (access_key_id.is_empty(), secret_access_key.is_empty()) {
                (true, true) => return Ok(None),
                (false, false) => (access_key_id.to_string(), secret_access_key.to_string()),
                (false, true) => match env("AWS_SECRET_ACCESS_KEY") {
                    Some(s) => (access_key_id.to_string(), s),
                    None => return Err(Error::invalid(
                        "s3_access_key_id is set but no secret key is: give s3_secret_access_key \
                         (SILT_S3_SECRET_ACCESS_KEY or s3_secret_access_key_file) or \
                         AWS_SECRET_ACCESS_KEY",
                    )),
                },
                (true, false) => match env("AWS_ACCESS_KEY_ID") {
                    Some(id) => (id, secret_access_key.to_string()),
                    None => {
                        return Err(Error::invalid(
                            "a secret key is set but no access key id: give s3_access_key_id \
                         (SILT_S3_ACCESS_KEY_ID) or AWS_ACCESS_KEY_ID",
                        ))
                    }
                },
            };
        Ok(Some(StaticKeys {
            access_key_id: id,
            secret_access_key: secret,
        }))
    }
}

impl fmt::Debug for StaticKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StaticKeys")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"<redacted>")
            .finish()
    }
}

impl reqsign_core::ProvideCredential for StaticKeys {
    type Credential = reqsign_aws_v4::Credential;

    async fn provide_credential(
        &self,
        _: &reqsign_core::Context,
    ) -> reqsign_core::Result<Option<Self::Credential>> {
        Ok(Some(reqsign_aws_v4::Credential {
            access_key_id: self.access_key_id.clone(),
            secret_access_key: self.secret_access_key.clone(),
            session_token: None,
            expires_in: None,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s3_store() -> OpendalStore {
        let opts = S3Options {
            endpoint: "http://127.0.0.1:9".into(),
            access_key_id: "a".into(),
            secret_access_key: "s".into(),
            ..S3Options::default()
        };
        OpendalStore::s3("bkt", "p", &opts).unwrap()
    }

    fn s3_error(kind: opendal::ErrorKind, status: u16, code: &str) -> opendal::Error {
        opendal::Error::new(
            kind,
            format!("S3Error {{ code: \"{code}\", message: \"msg\", resource: \"\" }}"),
        )
        .with_context(
            "response",
            format!("Parts {{ status: {status}, headers: {{}} }}"),
        )
    }

    #[test]
    fn classifies_opendal_errors() {
        use opendal::ErrorKind as O;
        let s = s3_store();
        let kind = |e: opendal::Error| s.map_err("read", "x", e).kind();
        assert_eq!(
            kind(s3_error(O::RateLimited, 503, "SlowDown")),
            ErrorKind::RateLimited
        );
        assert_eq!(
            kind(s3_error(O::Unexpected, 503, "")),
            ErrorKind::Unavailable
        );
        assert_eq!(
            kind(s3_error(O::Unexpected, 500, "InternalError")),
            ErrorKind::Unavailable
        );
        assert_eq!(
            kind(s3_error(O::ConditionNotMatch, 412, "PreconditionFailed")),
            ErrorKind::ContentChanged
        );
        assert_eq!(
            kind(s3_error(O::NotFound, 404, "XAdminUserNotFound")),
            ErrorKind::PermissionDenied
        );
        assert_eq!(
            kind(s3_error(O::NotFound, 404, "NoSuchKey")),
            ErrorKind::NotFound
        );
        assert_eq!(
            kind(s3_error(O::Unexpected, 400, "InvalidArgument")),
            ErrorKind::InvalidInput
        );
        assert_eq!(
            kind(s3_error(O::Conflict, 409, "OperationAborted")),
            ErrorKind::Unavailable
        );
        assert_eq!(
            kind(opendal::Error::new(
                O::Unexpected,
                "operation timeout reached"
            )),
            ErrorKind::Timeout
        );
        assert_eq!(
            kind(opendal::Error::new(O::Unexpected, "weird")),
            ErrorKind::Internal
        );
        let e = s.map_err("open", "", s3_error(O::ConfigInvalid, 404, "NoSuchBucket"));
        assert_eq!(e.kind(), ErrorKind::NotFound);
        assert_eq!(
            e.to_string(),
            "open s3://bkt/p: bucket bkt does not exist at S3 endpoint http://127.0.0.1:9"
        );
        // Short messages: no response headers.
        let e = s.map_err("read", "x", s3_error(O::Unexpected, 400, "InvalidArgument"));
        assert!(!e.to_string().contains("Parts"), "{e}");
    }

    #[test]
    fn helpers() {
        assert_eq!(strip_etag("\"abc-2\""), "abc-2");
        assert_eq!(strip_etag("W/\"abc\""), "abc");
        assert_eq!(strip_etag("abc"), "abc");
        assert_eq!(
            debug_field("S3Error { code: \"X\", message: \"y z\" }", "message"),
            Some("y z")
        );
        assert_eq!(debug_field("nothing", "code"), None);
        assert_eq!(s3_store().uri(), "s3://bkt/p");
        assert!(!format!(
            "{:?}",
            S3Options {
                secret_access_key: "k3y".into(),
                ..S3Options::default()
            }
        )
        .contains("k3y"));
        assert_eq!(
            OpendalStore::s3(
                "bkt",
                "",
                &S3Options {
                    access_key_id: "a".into(),
                    ..S3Options::default()
                }
            )
            .err()
            .map(|e| e.kind()),
            Some(ErrorKind::InvalidInput)
        );
    }
}

#[cfg(test)]
mod part_tests {
    use super::*;

    /// The user metadata keys and encodings s3fs-fuse reads and writes: `mode` in decimal
    /// with the type bits, ids in decimal, times in seconds (a fraction accepted).
    #[test]
    fn s3fs_metadata_conventions() {
        let t = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let set = SetAttrs {
            mode: Some(0o750),
            uid: Some(1000),
            gid: Some(100),
            atime: Some(t),
            mtime: Some(t),
        };
        let meta: std::collections::HashMap<String, String> =
            s3_user_metadata(&ObjectMeta::empty_file("x"), &set)
                .into_iter()
                .collect();
        assert_eq!(meta["mode"], "33256", "0100750 in decimal");
        assert_eq!(meta["uid"], "1000");
        assert_eq!(meta["gid"], "100");
        assert_eq!(meta["mtime"], "1700000000");
        assert_eq!(meta["atime"], "1700000000");
        assert!(meta.contains_key("ctime"));
        assert_eq!(parse_s3_time("1700000000"), Some(t));
        assert_eq!(
            parse_s3_time("1700000000.5"),
            Some(t + Duration::from_millis(500))
        );
        assert_eq!(parse_s3_time("soon"), None);
        assert_eq!(parse_s3_time("-1"), None);
    }

    /// s3fs-fuse's links: the mode keeps `S_IFLNK` (0120777 = 41471 in decimal), also when
    /// the owner of a link changes.
    #[test]
    fn s3fs_link_mode() {
        let link = ObjectMeta {
            kind: EntryKind::Symlink,
            mode: Some(0o777),
            ..ObjectMeta::dir("l")
        };
        let set = SetAttrs {
            uid: Some(7),
            ..Default::default()
        };
        let meta: std::collections::HashMap<String, String> =
            s3_user_metadata(&link, &set).into_iter().collect();
        assert_eq!(meta["mode"], "41471");
    }

    #[test]
    fn parts_stay_within_s3s_limit() {
        assert_eq!(part_size(0), WRITE_PART);
        assert_eq!(part_size(MAX_PARTS * WRITE_PART as u64), WRITE_PART);
        for len in [MAX_PARTS * WRITE_PART as u64 + 1, 1 << 40, 5 << 40] {
            let p = part_size(len) as u64;
            assert!(len.div_ceil(p) <= MAX_PARTS, "{len}: {p}");
            assert_eq!(p % (1 << 20), 0);
        }
    }
}
