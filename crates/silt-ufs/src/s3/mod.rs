//! `s3://` (and the clouds that speak S3: `oss://`, `cos://`, `obs://`, `r2://`) through
//! OpenDAL's S3 service.
//!
//! S3 prefixes are directories (a `dir/` marker object keeps a directory's attributes, as
//! s3fs-fuse's does); reads name the ETag they expect (If-Match), so a read never mixes two
//! versions; a rename is a copy and a delete; attributes live in the object's user metadata
//! (`crate::user_meta`). Ranged GETs on plain `http://` endpoints are received straight into
//! page buffers (`receive`). A mount's own endpoint, region, addressing and keys come from
//! its URI's query (`uri`).

mod receive;
mod uri;

use std::fmt;
use std::ops::Range;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use opendal::layers::{RetryLayer, TimeoutLayer};
use opendal::{Buffer, HttpTransporter, Metadata, OperationContext, Operator};
use opendal_http_transport_reqwest::ReqwestTransport;
use reqsign_aws_v4::{EnvCredentialProvider, ProfileCredentialProvider};
use reqsign_core::ProvideCredentialChain;
use silt_common::config::Config;
use silt_common::metrics::{
    UFS_READ_BYTES, UFS_RECEIVES_DECLINED, UFS_RECEIVES_DIRECT, UFS_REQUESTS,
};
use silt_common::{Error, ErrorKind, Result};
use tracing::debug;

pub use uri::{redact_uri, S3Flavor, S3UriOptions};

use crate::common::{
    check_timeout, debug_field, find_io_error, http_status, is_listed_dir_itself,
    is_transport_error, part_size, parts, retry_event, root_cause, take_one, PROBE_ATTEMPT_CAP,
    RETRY_MAX_DELAY, RETRY_MIN_DELAY, S3_ATTR_REWRITE_MAX,
};
use crate::headers::{to_user_metadata, Native};
use crate::uri::StoreUri;
use crate::user_meta::{
    headers_of, s3_apply_attrs, s3_meta, s3_user_metadata, secs, with_posix_metadata, S3_CTIME,
    S3_MODE, S3_MTIME, S_IFLNK,
};
use crate::{
    normalize_path, plan_read, Capabilities, EntryKind, Headers, ObjectMeta, Posix, SetAttrs,
    SpecialKind, UnderStore,
};
use receive::{Received, Receiver};

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

/// An S3 bucket (or a prefix of one) as an under-store.
pub struct S3Store {
    op: Operator,
    uri: String,
    bucket: String,
    /// The endpoint as shown in messages.
    endpoint: String,
    /// Ranged GETs received into page buffers (`S3Options::direct_receive`).
    receive: Option<Arc<Receiver>>,
    /// The operator's HTTP client, for the one request OpenDAL will not make: a PUT of a
    /// directory marker with user metadata (its `write` takes file paths only).
    http: HttpTransporter,
    timeout: Duration,
    retries: usize,
    /// Keys per listing page (S3 max-keys).
    list_page: usize,
    /// HEAD each listed file for its attributes (`S3Options::list_attrs`).
    list_attrs: bool,
}

impl S3Store {
    /// The store an `s3://` (or S3-speaking cloud's) URI names: `s3` with the URI's own
    /// settings applied. Not checked for reachability (see [`S3Store::verify`]).
    pub fn open(uri: &StoreUri, s3: &S3Options) -> Result<S3Store> {
        let StoreUri::S3 {
            bucket,
            prefix,
            options,
        } = uri
        else {
            return Err(Error::invalid(format!("{uri}: not an S3 store")));
        };
        let mut store = S3Store::new(bucket, prefix, &options.apply(s3, &uri.to_string())?)?;
        store.uri = uri.to_string();
        Ok(store)
    }
}

impl S3Store {
    /// A store over `s3://bucket/prefix`.
    pub fn new(bucket: &str, prefix: &str, opts: &S3Options) -> Result<S3Store> {
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
        Ok(S3Store {
            op,
            uri,
            bucket: bucket.to_string(),
            endpoint: opts.endpoint_display(),
            receive: opts
                .direct_receive
                .then(|| Arc::new(Receiver::new(opts.timeout))),
            http: marker_http,
            timeout: opts.timeout,
            retries: opts.retries,
            list_page: opts.list_page.max(1),
            list_attrs: opts.list_attrs,
        })
    }

    /// The underlying operator (root = the store root).
    pub fn operator(&self) -> &Operator {
        &self.op
    }

    /// Checks that the store is usable: one listing of at most one key succeeds within a
    /// bounded time.
    pub async fn verify(&self) -> Result<()> {
        let attempt = self.timeout.min(PROBE_ATTEMPT_CAP);
        let deadline = attempt * (self.retries.min(100) as u32 + 1) + Duration::from_secs(1);
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
        match tokio::time::timeout(deadline, probe).await {
            Ok(r) => r,
            Err(_) => Err(Error::new(
                ErrorKind::Timeout,
                format!(
                    "{}: S3 endpoint {} did not answer within {deadline:?}",
                    self.uri, self.endpoint
                ),
            )),
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
        format!("S3 endpoint {}", self.endpoint)
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
        match code {
            "NoSuchBucket" => {
                return (
                    ErrorKind::NotFound,
                    format!(
                        "bucket {} does not exist at {}",
                        self.bucket,
                        self.endpoint_display()
                    ),
                )
            }
            "InvalidBucketName" => return (ErrorKind::InvalidInput, s3_detail()),
            // versitygw's posix backend cannot hold both `a` and `a/b`.
            "ExistingObjectIsDirectory" => return (ErrorKind::IsADirectory, s3_detail()),
            "ObjectParentIsFile" => return (ErrorKind::NotADirectory, s3_detail()),
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
        let http = &self.http;
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
        path.trim() != path
    }

    /// The metadata of the version a write just created, `size` bytes long.
    async fn written_meta(&self, path: &str, written: &Metadata, size: u64) -> Result<ObjectMeta> {
        // The PUT's own answer names the version it created (a HEAD now could see a later
        // writer's); S3 returns no Last-Modified with it, so the mtime is learned at the next
        // listing or HEAD. A store that named no version is asked once.
        if written.etag().is_some() {
            return Ok(ObjectMeta {
                size,
                ..s3_meta(path.to_string(), written)
            });
        }
        self.stat_inner(path).await
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
        UFS_REQUESTS.inc();
        let copied = self
            .op
            .copy(from, to)
            .await
            .map_err(|e| self.map_err("copy", from, e))?;
        let mut meta = self.written_meta(to, &copied, src.size).await?;
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
        // The new version keeps the object's S3 headers and user metadata: a chmod through the
        // mount must not strip what an S3 client stored with the object.
        let headers = self.headers(path, &cur).await?;
        let data = self.s3_read(path, 0..cur.size, &etag).await?;
        let native = Native::of(&self.op);
        let meta = with_posix_metadata(to_user_metadata(&headers, native), &cur, attrs);
        UFS_REQUESTS.inc();
        let mut w = self.op.write_with(path, data).user_metadata(meta);
        if let (true, Some(v)) = (native.content_type, &headers.content_type) {
            w = w.content_type(v);
        }
        if let (true, Some(v)) = (native.cache_control, &headers.cache_control) {
            w = w.cache_control(v);
        }
        if let (true, Some(v)) = (native.content_disposition, &headers.content_disposition) {
            w = w.content_disposition(v);
        }
        if let (true, Some(v)) = (native.content_encoding, &headers.content_encoding) {
            w = w.content_encoding(v);
        }
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
        headers: Option<&Headers>,
    ) -> Result<ObjectMeta> {
        let path = self.writable(path)?;
        // One PUT up to a part's size, else initiate + one request per part + complete.
        let part = part_size(len);
        let count = len.div_ceil(part as u64);
        UFS_REQUESTS.add(if count <= 1 { 1 } else { count + 2 });
        let mut w = self.op.writer_with(path).chunk(part);
        if let Some(user) = user {
            w = w.user_metadata(user);
        }
        if let Some(h) = headers {
            let n = Native::of(&self.op);
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
        }
        let mut w = w.await.map_err(|e| self.map_err("write", path, e))?;
        for part in parts(&self.full(path), src, len, part) {
            w.write(part?.1)
                .await
                .map_err(|e| self.map_err("write", path, e))?;
        }
        let written = w
            .close()
            .await
            .map_err(|e| self.map_err("write", path, e))?;
        self.written_meta(path, &written, len).await
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
        let request = receive::Request { uri: &uri, headers };
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
        let buf = match &expected.etag {
            Some(etag) => self.s3_read(path, range, etag).await?,
            None => self.checked_read(path, range, expected).await?,
        };
        UFS_READ_BYTES.add(buf.len() as u64);
        Ok(buf)
    }

    async fn stat_inner(&self, path: &str) -> Result<ObjectMeta> {
        self.s3_stat(path).await
    }
}

#[async_trait]
impl UnderStore for S3Store {
    fn uri(&self) -> &str {
        &self.uri
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            native_recursive_list: true,
            conditional_read: true,
            // No rename on S3: files move by copy and delete, directories object by object.
            rename_dirs: false,
            write_replaces_attrs: true,
            list_without_attrs: !self.list_attrs,
            long_paths: false,
        }
    }

    async fn stat(&self, path: &str) -> Result<ObjectMeta> {
        self.stat_inner(normalize_path(path)?).await
    }

    async fn list(&self, dir: &str, recursive: bool) -> Result<Vec<ObjectMeta>> {
        let dir = normalize_path(dir)?;
        let v = self
            .s3_list(dir, recursive, usize::MAX)
            .await?
            .unwrap_or_default();
        self.s3_with_attrs(v).await
    }

    async fn list_tree(&self, dir: &str, max: usize) -> Result<Option<Vec<ObjectMeta>>> {
        let dir = normalize_path(dir)?;
        match self.s3_list_tree(dir, max).await? {
            Some(v) => self.s3_with_attrs(v).await.map(Some),
            None => Ok(None),
        }
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
        if let (Some(rx), Some(etag)) = (&self.receive, &expected.etag) {
            let Some((path, range)) = plan_read(path, &range, expected, |p| self.full(p))? else {
                return Ok(Vec::new());
            };
            if let Some(pieces) = self.s3_receive(rx, path, range, etag, piece).await? {
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

    async fn write(&self, path: &str, data: Bytes) -> Result<ObjectMeta> {
        let path = self.writable(path)?;
        let size = data.len() as u64;
        UFS_REQUESTS.inc();
        let written = self
            .op
            .write(path, data)
            .await
            .map_err(|e| self.map_err("write", path, e))?;
        self.written_meta(path, &written, size).await
    }

    async fn write_from(
        &self,
        path: &str,
        src: &dyn silt_common::io::ReadAt,
        len: u64,
    ) -> Result<ObjectMeta> {
        self.write_from_meta(path, src, len, None, None).await
    }

    async fn write_from_attrs(
        &self,
        path: &str,
        src: &dyn silt_common::io::ReadAt,
        len: u64,
        attrs: &SetAttrs,
        headers: Option<&Headers>,
    ) -> Result<ObjectMeta> {
        let headers = headers.filter(|h| !h.is_empty());
        if attrs.is_empty() && headers.is_none() {
            return self.write_from(path, src, len).await;
        }
        // One upload with the headers and the attributes in its user metadata (a POSIX key
        // the client also set is the attribute).
        let native = Native::of(&self.op);
        let mut user = headers
            .map(|h| to_user_metadata(h, native))
            .unwrap_or_default();
        if !attrs.is_empty() {
            user = with_posix_metadata(user, &ObjectMeta::empty_file(path), attrs);
        }
        let mut meta = self
            .write_from_meta(path, src, len, Some(user.clone()), headers)
            .await?;
        // The PUT's answer repeats no user metadata and no Last-Modified: the attributes are
        // the ones sent, and a version given no mtime was made now (its x-amz-meta-ctime, to
        // the second, as S3's Last-Modified is), so a rewrite (a truncate) does not go on
        // showing the old version's times.
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

    async fn headers(&self, path: &str, expected: &ObjectMeta) -> Result<Headers> {
        let path = normalize_path(path)?;
        if self.s3_unaddressable(path) {
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
        let now = s3_meta(path.to_string(), &m);
        if !now.same_version(expected) {
            return Err(Error::new(
                ErrorKind::ContentChanged,
                format!(
                    "{}: the object changed since its metadata was read",
                    self.full(path)
                ),
            ));
        }
        Ok(headers_of(&m))
    }

    async fn delete(&self, path: &str) -> Result<()> {
        let path = normalize_path(path)?;
        if path.is_empty() {
            return Err(Error::invalid(format!(
                "delete {}: cannot delete the store root",
                self.uri
            )));
        }
        if self.s3_unaddressable(path) {
            return Ok(()); // nothing this store can see is there
        }
        UFS_REQUESTS.inc();
        match self.op.delete(path).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == opendal::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(self.map_err("delete", path, e)),
        }
    }

    async fn create_dir(&self, path: &str) -> Result<ObjectMeta> {
        let path = self.writable(path)?;
        // The `path/` marker carries its making's time (to the second, as S3 keeps times), so
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
    }

    async fn remove_dir(&self, path: &str) -> Result<()> {
        let path = self.writable(path)?;
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
        // The marker.
        UFS_REQUESTS.inc();
        match self.op.delete(&dir_slash).await {
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
        // Copy, then delete the source. Not atomic: a failure in between leaves both.
        let meta = self.copy_file(from, to).await?;
        UFS_REQUESTS.inc();
        match self.op.delete(from).await {
            Ok(()) => Ok(meta),
            Err(e) if e.kind() == opendal::ErrorKind::NotFound => Ok(meta),
            Err(e) => Err(self.map_err("rename: delete", from, e)),
        }
    }

    async fn copy(&self, from: &str, to: &str) -> Result<ObjectMeta> {
        let from = self.writable(from)?;
        let to = self.writable(to)?;
        self.copy_file(from, to).await
    }

    async fn symlink(&self, path: &str, target: &str) -> Result<ObjectMeta> {
        let path = self.writable(path)?;
        // s3fs-fuse's link: an object whose body is the target, typed by its mode.
        let now = secs(SystemTime::now());
        let user = vec![
            (S3_MODE.to_string(), (S_IFLNK | 0o777).to_string()),
            (S3_MTIME.to_string(), now.clone()),
            (S3_CTIME.to_string(), now),
        ];
        self.s3_create_new(path, target.as_bytes().to_vec(), user, "symlink")
            .await
    }

    async fn read_link(&self, path: &str) -> Result<String> {
        let path = normalize_path(path)?;
        let m = self.s3_stat(path).await?;
        if m.kind != EntryKind::Symlink {
            return Err(Error::invalid(format!(
                "readlink {}: not a symbolic link",
                self.full(path)
            )));
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
        let target = self.s3_read(path, 0..m.size, &etag).await?.to_vec();
        String::from_utf8(target).map_err(|_| {
            Error::invalid(format!(
                "readlink {}: the target is not UTF-8",
                self.full(path)
            ))
        })
    }

    async fn set_attrs(&self, path: &str, attrs: &SetAttrs) -> Result<ObjectMeta> {
        let path = normalize_path(path)?;
        if self.s3_unaddressable(path) {
            return self.s3_stat(path).await;
        }
        self.s3_set_attrs(path, attrs).await
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
        // s3fs-fuse's special file: an empty object typed by its mode.
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

    async fn hard_link(&self, from: &str, to: &str) -> Result<ObjectMeta> {
        Err(Error::new(
            ErrorKind::Unsupported,
            format!(
                "link {} to {}: an object store cannot give one object two names",
                self.full(normalize_path(from)?),
                self.full(normalize_path(to)?)
            ),
        ))
    }
}

/// Subdirectories a recursive listing is split into at most (see `s3_list_tree`); more are
/// left to one sweep, whose pages then hold several subtrees each.
const SPLIT_MAX_DIRS: usize = 64;
/// Subdirectory listings of one split sweep in flight at once.
const SPLIT_CONCURRENCY: usize = 8;

/// A listed S3 entry as Silt sees it.
fn s3_entry((p, m): (String, Metadata)) -> ObjectMeta {
    if m.is_dir() {
        ObjectMeta::dir(&p)
    } else {
        s3_meta(p, &m)
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

    use crate::user_meta::strip_etag;

    fn s3_store() -> S3Store {
        let opts = S3Options {
            endpoint: "http://127.0.0.1:9".into(),
            access_key_id: "a".into(),
            secret_access_key: "s".into(),
            ..S3Options::default()
        };
        S3Store::new("bkt", "p", &opts).unwrap()
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
            S3Store::new(
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
