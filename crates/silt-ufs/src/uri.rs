//! Under-store URIs (`file:///abs/dir`, `s3://bucket/prefix`) and [`open_store`].

use std::fmt;
use std::path::{Component, Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use silt_common::{Error, Result};

use crate::fs::FsStore;
use crate::object::{ObjectScheme, ObjectStore, ObjectUri};
use crate::s3::{S3Flavor, S3Options, S3Store, S3UriOptions};
use crate::{measured, DynStore};

/// Schemes users may reasonably try that we know of but do not implement.
const KNOWN_UNSUPPORTED: &[&str] = &[
    "az", "wasb", "wasbs", "http", "https", "webdav", "sftp", "ftp", "hf",
];

const SUPPORTED: &str = "supported: s3://bucket/prefix, gs://bucket/prefix, \
     azblob://container/prefix, hdfs://namenode:port/path, webhdfs://host:port/path, \
     file:///absolute/dir";

/// A parsed under-store URI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreUri {
    /// `file:///abs/dir`: a local (or locally mounted) directory.
    File { root: PathBuf },
    /// `s3://bucket/prefix`: the objects of `bucket` under `prefix` (no leading or trailing
    /// `/`; empty for the whole bucket). `s3a://` is accepted as an alias.
    ///
    /// `oss://`, `cos://`, `obs://` and `r2://` are S3 too, with their cloud's endpoint form;
    /// a query string carries this mount's own endpoint, region, addressing and keys
    /// ([`S3UriOptions`]).
    S3 {
        bucket: String,
        prefix: String,
        options: S3UriOptions,
    },
    /// `gs://bucket/prefix` (alias `gcs://`), `azblob://container/prefix`,
    /// `webhdfs://host:port/path`, `hdfs://namenode[:port]/path`, with their options
    /// ([`ObjectUri`]).
    Object(ObjectUri),
}

impl StoreUri {
    /// Parses and normalises a URI (`file:///a//b/` → `file:///a/b`, `s3://b/p/` → `s3://b/p`).
    /// Every failure is `ErrorKind::InvalidInput` with a message that says what to write.
    pub fn parse(uri: &str) -> Result<StoreUri> {
        let text = uri.trim();
        let Some((scheme, rest)) = text.split_once("://") else {
            return Err(Error::invalid(format!(
                "invalid under-store URI {text:?}: expected SCHEME://..., {SUPPORTED}"
            )));
        };
        let scheme_lc = scheme.to_ascii_lowercase();
        let valid_scheme = !scheme.is_empty()
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
        if !valid_scheme {
            return Err(Error::invalid(format!(
                "invalid under-store URI {text:?}: bad scheme; {SUPPORTED}"
            )));
        }
        match scheme_lc.as_str() {
            "file" => parse_file(text, rest),
            s if S3Flavor::from_scheme(s).is_some() => {
                parse_s3(S3Flavor::from_scheme(s).unwrap_or_default(), rest)
            }
            s if ObjectScheme::from_scheme(s).is_some() => {
                let scheme = ObjectScheme::from_scheme(s).unwrap_or(ObjectScheme::Gcs);
                ObjectUri::parse(scheme, rest).map(StoreUri::Object)
            }
            "abfs" | "abfss" => Err(Error::invalid(
                "under-store scheme abfs:// (Azure Data Lake Storage Gen2) is not supported; \
                 the same account's blobs are reachable as azblob://container/prefix",
            )),
            s if KNOWN_UNSUPPORTED.contains(&s) => Err(Error::invalid(format!(
                "under-store scheme {s}:// is not supported yet ({SUPPORTED})"
            ))),
            s => Err(Error::invalid(format!(
                "unknown under-store scheme {s}:// ({SUPPORTED})"
            ))),
        }
    }

    /// `"file"` or `"s3"`.
    pub fn scheme(&self) -> &'static str {
        match self {
            StoreUri::File { .. } => "file",
            StoreUri::S3 { options, .. } => options.flavor.scheme(),
            StoreUri::Object(o) => o.scheme.name(),
        }
    }
}

fn parse_file(text: &str, rest: &str) -> Result<StoreUri> {
    if rest.contains(['?', '#']) {
        return Err(Error::invalid(format!(
            "invalid file URI {text:?}: query strings and fragments are not supported"
        )));
    }
    // `file:///abs` leaves "/abs"; `file://host/x` or `file://rel` leave a relative path.
    if !rest.starts_with('/') {
        return Err(Error::invalid(format!(
            "invalid file URI {text:?}: the path must be absolute, e.g. file:///srv/data \
             (three slashes; relative paths and hosts are not supported)"
        )));
    }
    let mut root = PathBuf::from("/");
    for comp in Path::new(rest).components() {
        match comp {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(c) => root.push(c),
            Component::ParentDir | Component::Prefix(_) => {
                return Err(Error::invalid(format!(
                    "invalid file URI {text:?}: '..' is not allowed in the path"
                )))
            }
        }
    }
    Ok(StoreUri::File { root })
}

fn parse_s3(flavor: S3Flavor, rest: &str) -> Result<StoreUri> {
    let scheme = flavor.scheme();
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, Some(q)),
        None => (rest, None),
    };
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    // Never echo the URI here: `user:secret@bucket` would put a secret into an error message.
    if authority.contains('@') {
        return Err(Error::invalid(
            "invalid s3 URI: credentials in the URI are not supported; \
             use s3_access_key_id / s3_secret_access_key (or the AWS environment)",
        ));
    }
    // The query's values stay out of messages (they name files and variables, but a user
    // may still paste a secret there).
    let shown = format!("{scheme}://{rest}");
    if rest.contains('#') || query.is_some_and(|q| q.contains('#')) {
        return Err(Error::invalid(format!(
            "invalid {scheme} URI {shown:?}: fragments are not supported"
        )));
    }
    if authority.is_empty() {
        return Err(Error::invalid(format!(
            "invalid {scheme} URI {shown:?}: missing bucket name, e.g. {scheme}://my-bucket/prefix"
        )));
    }
    let bucket_ok = authority.len() <= 255
        && authority
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
    if !bucket_ok {
        return Err(Error::invalid(format!(
            "invalid {scheme} URI {shown:?}: {authority:?} is not a valid bucket name \
             (letters, digits, '.', '-', '_')"
        )));
    }
    let mut parts = Vec::new();
    for comp in path.split('/').filter(|c| !c.is_empty()) {
        if comp == "." || comp == ".." {
            return Err(Error::invalid(format!(
                "invalid {scheme} URI {shown:?}: '.' and '..' are not allowed in the prefix"
            )));
        }
        parts.push(comp);
    }
    let options = S3UriOptions::parse(flavor, query, &shown)?;
    Ok(StoreUri::S3 {
        bucket: authority.to_string(),
        prefix: parts.join("/"),
        options,
    })
}

impl fmt::Display for StoreUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreUri::File { root } => write!(f, "file://{}", root.display()),
            StoreUri::S3 {
                bucket,
                prefix,
                options,
            } => {
                write!(f, "{}://{bucket}", options.flavor.scheme())?;
                if !prefix.is_empty() {
                    write!(f, "/{prefix}")?;
                }
                write!(f, "{options}")
            }
            StoreUri::Object(o) => write!(f, "{o}"),
        }
    }
}

impl FromStr for StoreUri {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        StoreUri::parse(s)
    }
}

/// Opens the under-store `uri` names and checks that it is usable before returning it:
///
/// - `file://`: the directory exists and is a directory (`NotFound` / `NotADirectory`,
///   with the path in the message);
/// - `s3://`: one cheap listing of the prefix (at most one key). A missing bucket is
///   `NotFound` ("bucket X does not exist"), refused credentials `PermissionDenied`, an
///   endpoint that cannot be reached `Unavailable` (endpoint in the message), and the whole
///   check is bounded by a deadline (`Timeout`), so it never hangs.
///
/// `s3` also carries the request timeout and retry count used for every store.
pub async fn open_store(uri: &str, s3: &S3Options) -> Result<DynStore> {
    open_store_as(uri, uri, s3).await
}

/// [`open_store`], its requests timed under `mount` (the namespace path it is mounted at).
pub async fn open_store_as(mount: &str, uri: &str, s3: &S3Options) -> Result<DynStore> {
    let store = open_checked(&StoreUri::parse(uri)?, s3).await?;
    Ok(Arc::new(measured(store, mount, s3.timeout)))
}

/// The store a URI names, checked to be usable: the table of stores. Adding a store is its
/// module, its scheme in [`StoreUri::parse`] (or an [`ObjectScheme`] for one more OpenDAL
/// service) and its line here.
async fn open_checked(uri: &StoreUri, s3: &S3Options) -> Result<DynStore> {
    Ok(match uri {
        StoreUri::File { root } => {
            let store = FsStore::new(root, s3.timeout)?;
            store.verify().await?;
            Arc::new(store)
        }
        StoreUri::S3 { .. } => {
            let store = S3Store::open(uri, s3)?;
            store.verify().await?;
            Arc::new(store)
        }
        StoreUri::Object(o) => {
            let store = ObjectStore::open(o, s3)?;
            store.verify().await?;
            Arc::new(store)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use silt_common::ErrorKind;

    fn err(uri: &str) -> Error {
        StoreUri::parse(uri).unwrap_err()
    }

    #[test]
    fn parses_and_normalises() {
        assert_eq!(
            StoreUri::parse("file:///srv//data/").unwrap(),
            StoreUri::File {
                root: "/srv/data".into()
            }
        );
        assert_eq!(
            StoreUri::parse("file:///").unwrap(),
            StoreUri::File { root: "/".into() }
        );
        assert_eq!(
            StoreUri::parse(" s3://bkt/a//b/ ").unwrap(),
            StoreUri::S3 {
                bucket: "bkt".into(),
                prefix: "a/b".into(),
                options: Default::default(),
            }
        );
        assert_eq!(
            StoreUri::parse("S3://bkt").unwrap(),
            StoreUri::S3 {
                bucket: "bkt".into(),
                prefix: String::new(),
                options: Default::default(),
            }
        );
        assert_eq!(
            StoreUri::parse("s3a://bkt/").unwrap().to_string(),
            "s3://bkt"
        );
        assert_eq!(
            StoreUri::parse("s3://bkt/x/y").unwrap().to_string(),
            "s3://bkt/x/y"
        );
        assert_eq!(
            "file:///a/./b".parse::<StoreUri>().unwrap().to_string(),
            "file:///a/b"
        );
        assert_eq!(StoreUri::parse("file:///x").unwrap().scheme(), "file");
        // A mount's own S3 settings, shown back without secrets; clouds that speak S3.
        let u = StoreUri::parse(
            "s3://bkt/p?region=eu-west-1&endpoint=http://10.0.0.5:9000&addressing=path",
        )
        .unwrap();
        assert_eq!(
            u.to_string(),
            "s3://bkt/p?endpoint=http://10.0.0.5:9000&region=eu-west-1&addressing=path"
        );
        assert_eq!(StoreUri::parse(&u.to_string()).unwrap(), u);
        let oss = StoreUri::parse("oss://bkt/p?region=cn-hangzhou").unwrap();
        assert_eq!(
            (oss.scheme(), oss.to_string().as_str()),
            ("oss", "oss://bkt/p?region=cn-hangzhou")
        );
        assert_eq!(StoreUri::parse("r2://b?account=a1").unwrap().scheme(), "r2");
    }

    #[test]
    fn rejects_with_clear_messages() {
        let e = err("wasb://bucket/x");
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        assert!(e.to_string().contains("not supported yet"), "{e}");
        let e = err("abfs://c@acct.dfs.core.windows.net/x");
        assert!(e.to_string().contains("azblob://"), "{e}");
        let e = err("ftp://host/x");
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        assert!(e.to_string().contains("ftp://"), "{e}");
        let e = err("foo://x");
        assert!(e.to_string().contains("unknown under-store scheme"), "{e}");
        let e = err("s3://");
        assert!(e.to_string().contains("missing bucket"), "{e}");
        let e = err("s3:///prefix");
        assert!(e.to_string().contains("missing bucket"), "{e}");
        let e = err("file://relative/dir");
        assert!(e.to_string().contains("absolute"), "{e}");
        let e = err("file://");
        assert!(e.to_string().contains("absolute"), "{e}");
        let e = err("not a uri");
        assert!(e.to_string().contains("SCHEME://"), "{e}");
        assert_eq!(err("/just/a/path").kind(), ErrorKind::InvalidInput);
        assert_eq!(err("://x").kind(), ErrorKind::InvalidInput);
        assert_eq!(err("s3://bad bucket/x").kind(), ErrorKind::InvalidInput);
        assert_eq!(err("s3://b/../x").kind(), ErrorKind::InvalidInput);
        assert_eq!(err("file:///a/../b").kind(), ErrorKind::InvalidInput);
        assert_eq!(err("s3://b/x?versionId=1").kind(), ErrorKind::InvalidInput);
    }

    #[test]
    fn never_echoes_credentials() {
        let e = err("s3://AKIDEXAMPLE:s3cr3t-value@bucket/x");
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        assert!(!e.to_string().contains("s3cr3t-value"), "{e}");
    }
}
