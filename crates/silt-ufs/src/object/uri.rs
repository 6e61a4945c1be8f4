//! `gs://`, `azblob://` and `webhdfs://` URIs: the container (bucket, container or
//! `HOST:PORT`), the prefix, and the options of the query string.

use std::fmt;

use silt_common::{Error, Result};

/// The services an [`super::ObjectStore`] serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ObjectScheme {
    /// Google Cloud Storage, `gs://BUCKET/PREFIX` (`gcs://` is an alias).
    Gcs,
    /// Azure Blob Storage, `azblob://CONTAINER/PREFIX`.
    Azblob,
    /// HDFS over its REST API, `webhdfs://HOST:PORT/PATH`.
    Webhdfs,
}

/// Options of one scheme: the keys a query may set, and the ones that would carry a secret
/// (refused, with where the secret goes instead).
struct Keys {
    allowed: &'static [&'static str],
    secrets: &'static [(&'static str, &'static str)],
}

impl ObjectScheme {
    /// The canonical scheme name (`gs`, `azblob`, `webhdfs`).
    pub fn name(self) -> &'static str {
        match self {
            ObjectScheme::Gcs => "gs",
            ObjectScheme::Azblob => "azblob",
            ObjectScheme::Webhdfs => "webhdfs",
        }
    }

    pub(crate) fn from_scheme(s: &str) -> Option<ObjectScheme> {
        match s {
            "gs" | "gcs" => Some(ObjectScheme::Gcs),
            "azblob" => Some(ObjectScheme::Azblob),
            "webhdfs" => Some(ObjectScheme::Webhdfs),
            _ => None,
        }
    }

    fn keys(self) -> Keys {
        match self {
            ObjectScheme::Gcs => Keys {
                allowed: &["endpoint", "credential_path", "anonymous"],
                secrets: &[
                    (
                        "credential",
                        "credential_path=/path/to/service-account.json",
                    ),
                    ("token", "credential_path=/path/to/service-account.json"),
                ],
            },
            ObjectScheme::Azblob => Keys {
                allowed: &["account", "endpoint", "account_key_env", "sas_token_env"],
                secrets: &[
                    (
                        "account_key",
                        "account_key_env=VARIABLE (or AZURE_STORAGE_KEY)",
                    ),
                    ("key", "account_key_env=VARIABLE (or AZURE_STORAGE_KEY)"),
                    ("sas_token", "sas_token_env=VARIABLE"),
                    ("sas", "sas_token_env=VARIABLE"),
                ],
            },
            ObjectScheme::Webhdfs => Keys {
                allowed: &["user"],
                secrets: &[("delegation", "a delegation token is not supported")],
            },
        }
    }

    fn container_word(self) -> &'static str {
        match self {
            ObjectScheme::Gcs => "bucket",
            ObjectScheme::Azblob => "container",
            ObjectScheme::Webhdfs => "namenode HOST:PORT",
        }
    }

    fn example(self) -> &'static str {
        match self {
            ObjectScheme::Gcs => "gs://my-bucket/prefix",
            ObjectScheme::Azblob => "azblob://my-container/prefix?account=ACCOUNT",
            ObjectScheme::Webhdfs => "webhdfs://namenode:9870/data",
        }
    }
}

/// A parsed `gs://`, `azblob://` or `webhdfs://` URI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectUri {
    pub scheme: ObjectScheme,
    /// The bucket (GCS), container (Azure) or namenode `HOST:PORT` (WebHDFS).
    pub container: String,
    /// The prefix (or HDFS path) below it, without leading or trailing `/`.
    pub prefix: String,
    /// The query's options, sorted by key (keys lower case, values percent-decoded). None
    /// holds a secret: those are refused.
    pub options: Vec<(String, String)>,
}

impl ObjectUri {
    /// Parses what follows `scheme://` (`scheme` in lower case).
    pub(crate) fn parse(scheme: ObjectScheme, rest: &str) -> Result<ObjectUri> {
        let name = scheme.name();
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        // Never echo the URI here: `user:secret@host` would put a secret into a message.
        if authority.contains('@') {
            return Err(Error::invalid(format!(
                "invalid {name} URI: credentials in the URI are not supported; {}",
                match scheme {
                    ObjectScheme::Gcs => "use credential_path=FILE in the query",
                    ObjectScheme::Azblob => "use account_key_env= or sas_token_env= in the query",
                    ObjectScheme::Webhdfs => "use user=NAME in the query",
                }
            )));
        }
        let shown = format!("{name}://{rest}");
        if rest.contains('#') || query.is_some_and(|q| q.contains('#')) {
            return Err(Error::invalid(format!(
                "invalid {name} URI {shown:?}: fragments are not supported"
            )));
        }
        if authority.is_empty() {
            return Err(Error::invalid(format!(
                "invalid {name} URI {shown:?}: missing {}, e.g. {}",
                scheme.container_word(),
                scheme.example()
            )));
        }
        check_container(scheme, authority, &shown)?;
        let mut parts = Vec::new();
        for comp in path.split('/').filter(|c| !c.is_empty()) {
            if comp == "." || comp == ".." {
                return Err(Error::invalid(format!(
                    "invalid {name} URI {shown:?}: '.' and '..' are not allowed in the path"
                )));
            }
            parts.push(comp);
        }
        let options = parse_query(scheme, query, &shown)?;
        Ok(ObjectUri {
            scheme,
            container: authority.to_ascii_lowercase(),
            prefix: parts.join("/"),
            options,
        })
    }

    /// The value of option `key`, if the query set it.
    pub fn option(&self, key: &str) -> Option<&str> {
        self.options
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// A boolean option (`true`/`false`/`1`/`0`/`yes`/`no`); `false` when absent.
    pub(crate) fn flag(&self, key: &str) -> Result<bool> {
        match self.option(key).map(str::to_ascii_lowercase).as_deref() {
            None | Some("false" | "0" | "no") => Ok(false),
            Some("true" | "1" | "yes" | "") => Ok(true),
            Some(_) => Err(Error::invalid(format!(
                "{}: option {key} must be true or false",
                self.without_query()
            ))),
        }
    }

    /// `scheme://container/prefix`, without the query.
    pub fn without_query(&self) -> String {
        let name = self.scheme.name();
        if self.prefix.is_empty() {
            format!("{name}://{}", self.container)
        } else {
            format!("{name}://{}/{}", self.container, self.prefix)
        }
    }
}

impl fmt::Display for ObjectUri {
    /// The URI with its options (none is a secret), in a canonical order.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.without_query())?;
        for (i, (k, v)) in self.options.iter().enumerate() {
            let sep = if i == 0 { '?' } else { '&' };
            write!(f, "{sep}{k}={}", silt_common::query::percent_encode(v))?;
        }
        Ok(())
    }
}

fn check_container(scheme: ObjectScheme, authority: &str, shown: &str) -> Result<()> {
    let name = scheme.name();
    let bad = |why: &str| {
        Err(Error::invalid(format!(
            "invalid {name} URI {shown:?}: {authority:?} is not a valid {}: {why}",
            scheme.container_word()
        )))
    };
    match scheme {
        ObjectScheme::Gcs => {
            let ok_chars = authority
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
            if !(3..=222).contains(&authority.len()) || !ok_chars {
                return bad("3 to 222 letters, digits, '.', '-', '_'");
            }
        }
        ObjectScheme::Azblob => {
            let ok_chars = authority
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-');
            if !(3..=63).contains(&authority.len())
                || !ok_chars
                || authority.starts_with('-')
                || authority.contains("--")
            {
                return bad("3 to 63 letters, digits and single '-'");
            }
        }
        ObjectScheme::Webhdfs => {
            let Some((host, port)) = authority.rsplit_once(':') else {
                return bad("HOST:PORT, e.g. namenode:9870");
            };
            let host_ok = !host.is_empty()
                && (host
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-'))
                    || (host.starts_with('[') && host.ends_with(']')));
            if !host_ok || port.parse::<u16>().map_or(true, |p| p == 0) {
                return bad("HOST:PORT, e.g. namenode:9870");
            }
        }
    }
    Ok(())
}

fn parse_query(
    scheme: ObjectScheme,
    query: Option<&str>,
    shown: &str,
) -> Result<Vec<(String, String)>> {
    let name = scheme.name();
    let keys = scheme.keys();
    let mut out: Vec<(String, String)> = Vec::new();
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let key = silt_common::query::percent_decode(k)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "invalid {name} URI {shown:?}: bad percent-encoding in an option name"
                ))
            })?
            .to_ascii_lowercase();
        // Never the value: it is a secret.
        if let Some((_, instead)) = keys.secrets.iter().find(|(s, _)| *s == key) {
            return Err(Error::invalid(format!(
                "invalid {name} URI {shown:?}: option {key} would put a secret in the URI \
                 (URIs are logged and shown); use {instead}"
            )));
        }
        if !keys.allowed.contains(&key.as_str()) {
            return Err(Error::invalid(format!(
                "invalid {name} URI {shown:?}: unknown option {key:?} (allowed: {})",
                keys.allowed.join(", ")
            )));
        }
        let value = silt_common::query::percent_decode(v).ok_or_else(|| {
            Error::invalid(format!(
                "invalid {name} URI {shown:?}: bad percent-encoding in option {key}"
            ))
        })?;
        if out.iter().any(|(k, _)| *k == key) {
            return Err(Error::invalid(format!(
                "invalid {name} URI {shown:?}: option {key} is given twice"
            )));
        }
        out.push((key, value));
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use silt_common::ErrorKind;

    fn parse(s: &str) -> Result<ObjectUri> {
        let (scheme, rest) = s.split_once("://").unwrap();
        ObjectUri::parse(ObjectScheme::from_scheme(scheme).unwrap(), rest)
    }

    #[test]
    fn parses_options_and_round_trips() {
        let u = parse("gs://bkt/a//b/?endpoint=http://127.0.0.1:4443&anonymous=true").unwrap();
        assert_eq!((u.container.as_str(), u.prefix.as_str()), ("bkt", "a/b"));
        assert_eq!(u.option("endpoint"), Some("http://127.0.0.1:4443"));
        assert!(u.flag("anonymous").unwrap());
        let shown = u.to_string();
        assert_eq!(
            shown,
            "gs://bkt/a/b?anonymous=true&endpoint=http://127.0.0.1:4443"
        );
        assert_eq!(parse(&shown).unwrap(), u);
        assert_eq!(parse("gcs://bkt").unwrap().to_string(), "gs://bkt");
        let a = parse("azblob://cont/p?account=dev&account_key_env=MY_KEY").unwrap();
        assert_eq!(a.option("account_key_env"), Some("MY_KEY"));
        let h = parse("webhdfs://127.0.0.1:9870/data?user=hdfs").unwrap();
        assert_eq!(
            (h.container.as_str(), h.prefix.as_str()),
            ("127.0.0.1:9870", "data")
        );
        assert_eq!(h.to_string(), "webhdfs://127.0.0.1:9870/data?user=hdfs");
    }

    #[test]
    fn refuses_secrets_without_echoing_them() {
        for (uri, secret) in [
            ("azblob://cont/p?account_key=s3cr3tvalue", "s3cr3tvalue"),
            ("azblob://cont/p?sas_token=sv%3Ds3cr3tvalue", "s3cr3tvalue"),
            ("gs://bkt/p?credential=s3cr3tvalue", "s3cr3tvalue"),
            ("gs://user:s3cr3tvalue@bkt/p", "s3cr3tvalue"),
        ] {
            let e = parse(uri).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidInput, "{uri}");
            assert!(!e.to_string().contains(secret), "{e}");
        }
        let e = parse("gs://bkt/p?colour=blue").unwrap_err();
        assert!(e.to_string().contains("credential_path"), "{e}");
        assert_eq!(
            parse("webhdfs://host/data").unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
        assert_eq!(
            parse("azblob://ab/x").unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
        assert_eq!(
            parse("gs://bkt/../x").unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
        assert_eq!(
            parse("gs:///x").unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
    }
}
