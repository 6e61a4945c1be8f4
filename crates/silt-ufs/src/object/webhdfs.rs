//! HDFS over WebHDFS (`webhdfs://HOST:PORT/PATH`): OpenDAL's `webhdfs` service for the bytes
//! (reads, creates, appends, deletes, mkdirs), and the namenode's REST API directly for what
//! OpenDAL does not give: file status with its id, permission and owner (`GETFILESTATUS`,
//! `LISTSTATUS`), `RENAME` with `OVERWRITE`, `SETPERMISSION`, `SETOWNER`, `SETTIMES`.
//!
//! Options: `user` (`user.name`, simple authentication; none: the namenode's default user).

use opendal::services::Webhdfs;
use opendal::HttpTransporter;
use serde::Deserialize;
use silt_common::{Error, ErrorKind, Result};

use super::{operators, ObjectUri, Pin, Service, Setup};
use crate::S3Options;

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
    let endpoint = format!("http://{}", uri.container);
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
    let lower = message.to_ascii_lowercase();
    let kind = match exception.as_str() {
        // A parent that is a file (`/a/file/x`): the namenode says so as an access error.
        _ if lower.contains("(is not a directory)") => ErrorKind::NotADirectory,
        "FileNotFoundException" => ErrorKind::NotFound,
        "FileAlreadyExistsException" => ErrorKind::AlreadyExists,
        "PathIsNotEmptyDirectoryException" => ErrorKind::NotEmpty,
        "ParentNotDirectoryException" => ErrorKind::NotADirectory,
        "PathIsNotDirectoryException" => ErrorKind::NotADirectory,
        "AccessControlException" | "SecurityException" => ErrorKind::PermissionDenied,
        "SafeModeException" | "RetriableException" | "StandbyException" => ErrorKind::Unavailable,
        _ if lower.contains("is not empty") || lower.contains("non empty") => ErrorKind::NotEmpty,
        _ if lower.contains("not a directory") => ErrorKind::NotADirectory,
        _ if lower.contains("is a directory") => ErrorKind::IsADirectory,
        _ => match status {
            401 | 403 => ErrorKind::PermissionDenied,
            404 => ErrorKind::NotFound,
            408 | 429 | 500.. => ErrorKind::Unavailable,
            400..=499 => ErrorKind::InvalidInput,
            _ => ErrorKind::Internal,
        },
    };
    // The namenode's message names paths, never credentials; one line of it.
    let line: String = message
        .lines()
        .next()
        .unwrap_or("")
        .chars()
        .take(300)
        .collect();
    let detail = match (exception.is_empty(), line.is_empty()) {
        (true, _) => format!("HTTP {status}"),
        (false, true) => exception,
        (false, false) => format!("{exception}: {line}"),
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
