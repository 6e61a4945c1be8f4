//! HDFS over WebHDFS (`webhdfs://HOST:PORT/PATH`): OpenDAL's `webhdfs` service for the bytes
//! (reads, creates, appends, deletes, mkdirs), and the namenode's REST API directly for what
//! OpenDAL does not give: file status with its id, permission and owner (`GETFILESTATUS`,
//! `LISTSTATUS`), `RENAME` with `OVERWRITE`, `SETPERMISSION`, `SETOWNER`, `SETTIMES`.
//!
//! `hdfs://NAMENODE[:RPC_PORT]/PATH` is served the same way, at the namenode's HTTP port
//! (`http_port`, default 9870): a pure-Rust RPC client (`hdfs-native`, through OpenDAL) was
//! measured and not taken: it reports no file id (reads could no longer be tied to a
//! version), its rename can expose a missing target, a permission error is not told apart,
//! and it added 48 % to a release build's CPU (docs/SEMANTICS.md).
//!
//! Options: `user` (`user.name`, simple authentication; none: the namenode's default user);
//! `http_port` for `hdfs://`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use opendal::services::Webhdfs;
use opendal::{Buffer, HttpTransporter};
use serde::Deserialize;
use silt_common::metrics::{UFS_ERRORS, UFS_REQUESTS};
use silt_common::{Error, ErrorKind, Result};

use super::uri::{host_ok, port_ok, split_port, Scheme};
use super::{operators, ObjectScheme, ObjectStore, ObjectUri, Pin, Service, Setup};
use crate::common::{FS_WRITE_TEMP, RETRY_MAX_DELAY, RETRY_MIN_DELAY, WRITE_PART};
use base64::Engine;

use crate::{xattrs, EntryKind, Headers, ObjectMeta, Posix, S3Options, SetAttrs};

/// `webhdfs://HOST:PORT/PATH`.
pub(crate) const WEBHDFS: Scheme = Scheme {
    name: "webhdfs",
    aliases: &[],
    container_word: "namenode HOST:PORT",
    example: "webhdfs://namenode:9870/data",
    check_container: |authority| match authority.rsplit_once(':') {
        Some((host, port)) if host_ok(host) && port_ok(port) => Ok(()),
        _ => Err("HOST:PORT, e.g. namenode:9870"),
    },
    credentials_hint: "use user=NAME in the query",
    options: &["user"],
    secrets: &[("delegation", "a delegation token is not supported")],
    setup,
};

/// `hdfs://NAMENODE[:RPC_PORT]/PATH`, at the namenode's `http_port`.
pub(crate) const HDFS: Scheme = Scheme {
    name: "hdfs",
    aliases: &[],
    container_word: "namenode HOST[:RPC_PORT]",
    example: "hdfs://namenode:8020/data",
    check_container: |authority| match split_port(authority) {
        (host, port) if host_ok(host) && port.is_none_or(port_ok) => Ok(()),
        _ => Err("HOST or HOST:PORT, e.g. namenode:8020"),
    },
    credentials_hint: "use user=NAME in the query",
    options: &["user", "http_port"],
    secrets: &[("delegation", "a delegation token is not supported")],
    setup,
};

/// The namenode's HTTP port in Hadoop 3 (50070 in Hadoop 2), where WebHDFS answers.
const HDFS_HTTP_PORT: u16 = 9870;

impl ObjectUri {
    /// The namenode's WebHDFS address, `HOST:PORT`: the authority of a `webhdfs://` URI; for
    /// `hdfs://`, its host with the `http_port` option (default [`HDFS_HTTP_PORT`]) in place
    /// of the RPC port.
    pub(crate) fn webhdfs_authority(&self) -> Result<String> {
        if self.scheme != ObjectScheme::Hdfs {
            return Ok(self.container.clone());
        }
        let (host, _rpc_port) = split_port(&self.container);
        let port = match self.option("http_port") {
            None => HDFS_HTTP_PORT,
            Some(p) => p.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(|| {
                Error::invalid(format!(
                    "{}: http_port must be the namenode's HTTP port, 1 to 65535",
                    self.without_query()
                ))
            })?,
        };
        Ok(format!("{host}:{port}"))
    }
}

/// What the store needs to talk to the namenode itself.
pub(crate) struct Hdfs {
    /// `http://HOST:PORT`.
    pub endpoint: String,
    /// The store's root, absolute, without a trailing `/` (`""` for `/`).
    pub root: String,
    pub user: Option<String>,
}

pub(crate) fn setup(uri: &ObjectUri, opts: &S3Options, http: &HttpTransporter) -> Result<Setup> {
    let shown = uri.without_query();
    let endpoint = format!("http://{}", uri.webhdfs_authority()?);
    let user = uri.option("user").map(str::to_string);
    if let Some(u) = &user {
        if u.is_empty() || u.contains(['/', '&', '?', '#', ' ']) {
            return Err(Error::invalid(format!(
                "{shown}: {u:?} is not an HDFS user name"
            )));
        }
    }
    let root = if uri.prefix.is_empty() {
        String::new()
    } else {
        format!("/{}", uri.prefix)
    };
    let make = || {
        let b = Webhdfs::default()
            .endpoint(&endpoint)
            .root(&format!("{root}/"));
        match &user {
            Some(u) => b.user_name(u),
            None => b,
        }
    };
    let (op, _raw) = operators(make, http, opts, &shown)?;
    Ok(Setup {
        op,
        raw: None,
        service: Service {
            scheme: uri.scheme,
            label: "WebHDFS",
            endpoint: endpoint.clone(),
            container: None,
            markers: false,
            // No conditional requests: file id, size and mtime checked around each read.
            pin: Pin::Checked,
            credential_codes: &["AccessControlException", "SecurityException"],
            no_credentials: "the namenode asks for authentication (Kerberos/SPNEGO is not \
                             supported; set user=NAME for simple authentication)",
            hdfs: Some(Hdfs {
                endpoint,
                root,
                user,
            }),
        },
    })
}

/// A `GETXATTRS` answer.
#[derive(Debug, Deserialize)]
struct XAttrs {
    #[serde(rename = "XAttrs", default)]
    x_attrs: Vec<XAttr>,
}

#[derive(Debug, Deserialize)]
struct XAttr {
    name: String,
    value: Option<String>,
}

/// `s` for a URL's query: every byte outside the unreserved set escaped.
fn encode_query(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// One entry of `GETFILESTATUS` / `LISTSTATUS`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct FileStatus {
    #[serde(default)]
    pub access_time: u64,
    #[serde(default)]
    pub file_id: u64,
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub length: u64,
    #[serde(default)]
    pub modification_time: u64,
    #[serde(default)]
    pub owner: String,
    #[serde(default)]
    pub path_suffix: String,
    #[serde(default)]
    pub permission: String,
    #[serde(rename = "type")]
    pub kind: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct StatusWrapper {
    pub file_status: FileStatus,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct ListWrapper {
    pub file_statuses: ListInner,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct ListInner {
    #[serde(default)]
    pub file_status: Vec<FileStatus>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RemoteWrapper {
    remote_exception: Remote,
}

#[derive(Deserialize)]
struct Remote {
    #[serde(default)]
    exception: String,
    #[serde(default)]
    message: String,
}

/// The error kind and a one-line detail of a failed namenode answer (`RemoteException`).
pub(crate) fn remote_error(status: u16, body: &[u8]) -> (ErrorKind, String) {
    let remote = serde_json::from_slice::<RemoteWrapper>(body)
        .ok()
        .map(|w| w.remote_exception);
    let (exception, message) = remote.map(|r| (r.exception, r.message)).unwrap_or_default();
    exception_error(Some(status), &exception, &message)
}

/// The same for an error OpenDAL's `webhdfs` service reported (its rendering carries the
/// namenode's `WebHdfsError { exception: "...", message: "..." }`), `None` if it has none.
pub(crate) fn opendal_remote_error(e: &opendal::Error) -> Option<(ErrorKind, String)> {
    let msg = e.message();
    let exception = crate::common::debug_field(msg, "exception")?;
    // The message as `Debug` escaped it: up to its first line end or its closing quote.
    let start = msg.find("message: \"")? + "message: \"".len();
    let mut message = String::new();
    let mut chars = msg[start..].chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => break,
            '\\' => match chars.next() {
                Some('n') | None => break,
                Some(other) => message.push(other),
            },
            c => message.push(c),
        }
    }
    Some(exception_error(
        crate::common::http_status(e),
        exception,
        &message,
    ))
}

/// The kind of the namenode's `exception` (its `message` and the HTTP status when the name
/// says too little), and a one-line detail.
fn exception_error(status: Option<u16>, exception: &str, message: &str) -> (ErrorKind, String) {
    let lower = message.to_ascii_lowercase();
    let kind = match exception {
        // A parent that is a file (`/a/file/x`): the namenode says so as an access error.
        _ if lower.contains("(is not a directory)") => ErrorKind::NotADirectory,
        "FileNotFoundException" => ErrorKind::NotFound,
        "FileAlreadyExistsException" => ErrorKind::AlreadyExists,
        "PathIsNotEmptyDirectoryException" => ErrorKind::NotEmpty,
        "ParentNotDirectoryException" => ErrorKind::NotADirectory,
        "PathIsNotDirectoryException" => ErrorKind::NotADirectory,
        "AccessControlException" | "SecurityException" => ErrorKind::PermissionDenied,
        // Starting up, or put there by an operator; a standby namenode of a pair.
        "SafeModeException" | "RetriableException" | "StandbyException" => ErrorKind::Unavailable,
        _ if lower.contains("is not empty") || lower.contains("non empty") => ErrorKind::NotEmpty,
        _ if lower.contains("not a directory") => ErrorKind::NotADirectory,
        _ if lower.contains("is a directory") => ErrorKind::IsADirectory,
        _ => match status {
            Some(401 | 403) => ErrorKind::PermissionDenied,
            Some(404) => ErrorKind::NotFound,
            Some(408 | 429 | 500..) => ErrorKind::Unavailable,
            Some(400..=499) => ErrorKind::InvalidInput,
            _ => ErrorKind::Internal,
        },
    };
    // The namenode's message names paths, never credentials; one line of it, no stack trace.
    let line: String = message
        .lines()
        .next()
        .unwrap_or("")
        .chars()
        .take(300)
        .collect();
    let detail = match (exception.is_empty(), line.is_empty(), status) {
        (true, _, Some(status)) => format!("HTTP {status}"),
        (true, _, None) => "an error without details".to_string(),
        (false, true, _) => exception.to_string(),
        (false, false, _) => format!("{exception}: {line}"),
    };
    (kind, detail)
}

/// A store path as a WebHDFS URL path: each byte outside the unreserved set escaped.
pub(crate) fn encode_path(p: &str) -> String {
    let mut out = String::with_capacity(p.len());
    for b in p.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// The namenode's REST API, for what OpenDAL's `webhdfs` service does not give.
impl ObjectStore {
    pub(super) fn hdfs(&self) -> Result<&Hdfs> {
        self.svc
            .hdfs
            .as_ref()
            .ok_or_else(|| Error::internal(format!("{}: not an HDFS store", self.uri)))
    }

    /// The absolute HDFS path of the store path `path`.
    pub(super) fn hdfs_abs(&self, path: &str) -> String {
        let root = self.svc.hdfs.as_ref().map_or("", |h| h.root.as_str());
        match (root.is_empty(), path.is_empty()) {
            (true, true) => "/".to_string(),
            (true, false) => format!("/{path}"),
            (false, true) => root.to_string(),
            (false, false) => format!("{root}/{path}"),
        }
    }

    /// One namenode request `op` (with `query`, already encoded) on `path`, within the
    /// store's deadline and retried like OpenDAL's requests: its status and body. An error
    /// answer is mapped to its kind (`what` and the path in the message).
    pub(super) async fn hdfs_call(
        &self,
        method: http::Method,
        path: &str,
        op: &str,
        query: &str,
        what: &str,
    ) -> Result<Bytes> {
        let h = self.hdfs()?;
        let mut url = format!(
            "{}/webhdfs/v1{}?op={op}",
            h.endpoint,
            encode_path(&self.hdfs_abs(path))
        );
        if let Some(u) = &h.user {
            url.push_str(&format!("&user.name={}", encode_path(u)));
        }
        if !query.is_empty() {
            url.push('&');
            url.push_str(query);
        }
        let mut attempt = 0;
        loop {
            attempt += 1;
            UFS_REQUESTS.inc();
            let req = http::Request::builder()
                .method(method.clone())
                .uri(&url)
                .header(http::header::CONTENT_LENGTH, 0)
                .body(Buffer::new())
                .map_err(|e| Error::internal(format!("{what} {}: {e}", self.full(path))))?;
            let r = match tokio::time::timeout(self.timeout, self.http.send(req)).await {
                Ok(Ok(resp)) => {
                    let status = resp.status();
                    let body = resp.into_body().to_bytes();
                    if status.is_success() {
                        return Ok(body);
                    }
                    let (kind, detail) = remote_error(status.as_u16(), &body);
                    Error::new(kind, format!("{what} {}: {detail}", self.full(path)))
                }
                Ok(Err(e)) => self.map_err(what, path, e),
                Err(_) => Error::new(
                    ErrorKind::Timeout,
                    format!(
                        "{what} {}: no answer from {} within {:?}",
                        self.full(path),
                        self.where_(),
                        self.timeout
                    ),
                ),
            };
            if !r.is_retryable() || attempt > self.retries {
                return Err(r);
            }
            UFS_ERRORS.inc();
            let backoff = RETRY_MIN_DELAY * 2u32.saturating_pow(attempt as u32 - 1);
            tokio::time::sleep(backoff.min(RETRY_MAX_DELAY)).await;
        }
    }

    /// The status of `path`, `None` if it is missing (or below a file).
    pub(super) async fn hdfs_status(&self, path: &str) -> Result<Option<FileStatus>> {
        match self
            .hdfs_call(http::Method::GET, path, "GETFILESTATUS", "", "stat")
            .await
        {
            Ok(body) => serde_json::from_slice::<StatusWrapper>(&body)
                .map(|w| Some(w.file_status))
                .map_err(|e| {
                    Error::new(
                        ErrorKind::Unavailable,
                        format!("stat {}: undecodable answer: {e}", self.full(path)),
                    )
                }),
            Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// The children of the directory `path` (`LISTSTATUS`), hidden write files left out.
    pub(super) async fn hdfs_children(&self, path: &str) -> Result<Vec<ObjectMeta>> {
        let body = self
            .hdfs_call(http::Method::GET, path, "LISTSTATUS", "", "list")
            .await?;
        let list: ListWrapper = serde_json::from_slice(&body).map_err(|e| {
            Error::new(
                ErrorKind::Unavailable,
                format!("list {}: undecodable answer: {e}", self.full(path)),
            )
        })?;
        Ok(list
            .file_statuses
            .file_status
            .into_iter()
            .filter(|st| !st.path_suffix.is_empty() && !st.path_suffix.starts_with(FS_WRITE_TEMP))
            .map(|st| {
                let child = if path.is_empty() {
                    st.path_suffix.clone()
                } else {
                    format!("{path}/{}", st.path_suffix)
                };
                hdfs_meta(&child, &st)
            })
            .collect())
    }

    pub(super) async fn hdfs_list(
        &self,
        dir: &str,
        recursive: bool,
        max: usize,
    ) -> Result<Option<Vec<ObjectMeta>>> {
        match self.hdfs_status(dir).await? {
            None => {
                return Err(Error::not_found(format!(
                    "list {}: no such directory",
                    self.full(dir)
                )))
            }
            Some(st) if st.kind != "DIRECTORY" => {
                return Err(Error::new(
                    ErrorKind::NotADirectory,
                    format!("list {}: not a directory", self.full(dir)),
                ))
            }
            Some(_) => {}
        }
        let mut out = Vec::new();
        let mut todo = vec![dir.to_string()];
        while let Some(d) = todo.pop() {
            let children = match self.hdfs_children(&d).await {
                Ok(c) => c,
                // Removed meanwhile (below the listed directory).
                Err(e) if d != dir && e.kind() == ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            for m in children {
                if recursive && m.kind == EntryKind::Dir {
                    todo.push(m.path.clone());
                }
                if out.len() >= max {
                    return Ok(None);
                }
                out.push(m);
            }
        }
        Ok(Some(out))
    }

    /// `RENAME` of `from` to `to`, replacing a file (or an empty directory) at `to`.
    pub(super) async fn hdfs_rename(&self, from: &str, to: &str, what: &str) -> Result<()> {
        let dest = encode_path(&self.hdfs_abs(to));
        self.hdfs_call(
            http::Method::PUT,
            from,
            "RENAME",
            &format!("destination={dest}&renameoptions=OVERWRITE"),
            what,
        )
        .await
        .map(drop)
    }

    /// Sets the permission bits, owner and times of `path` as `a` asks.
    pub(super) async fn hdfs_set(&self, path: &str, a: &SetAttrs, what: &str) -> Result<()> {
        if a.uid.is_some() || a.gid.is_some() {
            let mut q = Vec::new();
            if let Some(u) = a.uid {
                q.push(format!("owner={u}"));
            }
            if let Some(g) = a.gid {
                q.push(format!("group={g}"));
            }
            self.hdfs_call(http::Method::PUT, path, "SETOWNER", &q.join("&"), what)
                .await?;
        }
        if let Some(mode) = a.mode {
            let q = format!("permission={:o}", mode & 0o7777);
            self.hdfs_call(http::Method::PUT, path, "SETPERMISSION", &q, what)
                .await?;
        }
        if a.atime.is_some() || a.mtime.is_some() {
            let ms = |t: SystemTime| {
                t.duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis().min(i64::MAX as u128) as i64)
            };
            // -1: unchanged.
            let q = format!(
                "modificationtime={}&accesstime={}",
                a.mtime.map_or(-1, ms),
                a.atime.map_or(-1, ms)
            );
            self.hdfs_call(http::Method::PUT, path, "SETTIMES", &q, what)
                .await?;
        }
        Ok(())
    }

    /// A whole file written as HDFS lets no reader see part of one: into a hidden file beside
    /// it (created, then appended a part at a time), given `attrs`, then renamed over the
    /// path in one step. Its metadata is the hidden file's, which the rename keeps (the
    /// file id and mtime are this write's version, whatever lands there later).
    /// The S3 headers of `path` (its `user.s3.*` extended attributes), if it is still the
    /// version `expected`.
    pub(super) async fn hdfs_headers(&self, path: &str, expected: &ObjectMeta) -> Result<Headers> {
        let st = self
            .hdfs_status(path)
            .await?
            .ok_or_else(|| Error::not_found(format!("{}: not found", self.full(path))))?;
        let changed = || {
            Error::new(
                ErrorKind::ContentChanged,
                format!(
                    "{}: the file changed since its metadata was read",
                    self.full(path)
                ),
            )
        };
        if hdfs_meta(path, &st).content_fingerprint() != expected.content_fingerprint() {
            return Err(changed());
        }
        let body = self
            .hdfs_call(
                http::Method::GET,
                path,
                "GETXATTRS",
                "encoding=base64",
                "stat",
            )
            .await?;
        let listed: XAttrs = serde_json::from_slice(&body).map_err(|e| {
            Error::new(
                ErrorKind::Unavailable,
                format!("{}: the namenode's GETXATTRS answer: {e}", self.full(path)),
            )
        })?;
        let attrs = listed.x_attrs.into_iter().filter_map(|a| {
            let v = a.value?;
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(v.strip_prefix("0s").unwrap_or(&v))
                .ok()?;
            Some((a.name, String::from_utf8(bytes).ok()?))
        });
        let h = xattrs::to_headers(attrs);
        // Read after the status: a file replaced in between is not reported with its
        // successor's headers.
        match self.hdfs_status(path).await? {
            Some(now)
                if hdfs_meta(path, &now).content_fingerprint()
                    == expected.content_fingerprint() =>
            {
                Ok(h)
            }
            _ => Err(changed()),
        }
    }

    pub(super) async fn hdfs_write(
        &self,
        path: &str,
        src: &dyn silt_common::io::ReadAt,
        len: u64,
        attrs: &SetAttrs,
        headers: Option<&Headers>,
    ) -> Result<ObjectMeta> {
        let tmp = match path.rsplit_once('/') {
            Some((dir, _)) => format!("{dir}/{FS_WRITE_TEMP}{:016x}", rand::random::<u64>()),
            None => format!("{FS_WRITE_TEMP}{:016x}", rand::random::<u64>()),
        };
        let written = async {
            let mut off = 0u64;
            loop {
                let n = (len - off).min(WRITE_PART as u64) as usize;
                let bytes = src.read_at(off, n).map_err(|e| {
                    e.context(format!(
                        "write {}: reading the local bytes",
                        self.full(path)
                    ))
                })?;
                UFS_REQUESTS.inc();
                let w = self.op.write_with(&tmp, bytes);
                let w = if off == 0 { w } else { w.append(true) };
                w.await.map_err(|e| self.map_err("write", path, e))?;
                off += n as u64;
                if off >= len {
                    break;
                }
            }
            if !attrs.is_empty() {
                self.hdfs_set(&tmp, attrs, "write").await?;
            }
            // On the hidden file, so the name shows the bytes and their headers together.
            for (name, value) in headers.map(xattrs::of).unwrap_or_default() {
                let query = format!(
                    "xattr.name={}&xattr.value=0s{}&flag=CREATE,REPLACE",
                    encode_query(&name),
                    encode_query(&base64::engine::general_purpose::STANDARD.encode(value))
                );
                self.hdfs_call(http::Method::PUT, &tmp, "SETXATTR", &query, "write")
                    .await?;
            }
            let st = self.hdfs_status(&tmp).await?.ok_or_else(|| {
                Error::new(
                    ErrorKind::Unavailable,
                    format!("write {}: the written file vanished", self.full(path)),
                )
            })?;
            match self.hdfs_rename(&tmp, path, "write").await {
                Ok(()) => {}
                // A retried RENAME whose first attempt landed (its answer lost): the file
                // is in place.
                Err(e) if e.kind() == ErrorKind::NotFound => match self.hdfs_status(path).await? {
                    Some(now) if now.file_id == st.file_id => {}
                    _ => return Err(e),
                },
                Err(e) => return Err(e),
            }
            Ok(hdfs_meta(path, &st))
        }
        .await;
        if written.is_err() {
            let _ = self.op.delete(&tmp).await;
        }
        written
    }
}

/// An HDFS file status as Silt sees it: the file id and mtime as the version (a new file
/// gets a new id; an append or truncate moves the mtime), owner and group as ids where they
/// are numbers.
pub(super) fn hdfs_meta(path: &str, st: &FileStatus) -> ObjectMeta {
    let time = |ms: u64| (ms > 0).then(|| UNIX_EPOCH + Duration::from_millis(ms));
    let kind = match st.kind.as_str() {
        "DIRECTORY" => EntryKind::Dir,
        "SYMLINK" => EntryKind::Symlink,
        _ => EntryKind::File,
    };
    ObjectMeta {
        path: path.to_string(),
        kind,
        size: if kind == EntryKind::Dir { 0 } else { st.length },
        mtime: time(st.modification_time),
        etag: None,
        version: (kind != EntryKind::Dir)
            .then(|| format!("{}.{}", st.file_id, st.modification_time)),
        mode: u32::from_str_radix(&st.permission, 8)
            .ok()
            .map(|m| m & 0o7777),
        posix: Posix {
            uid: st.owner.parse().ok(),
            gid: st.group.parse().ok(),
            atime: time(st.access_time),
            ctime: None,
            rdev: 0,
            nlink: None,
        },
    }
}
