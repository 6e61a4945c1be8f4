//! `gs://`, `azblob://`, `webhdfs://` and `hdfs://` URIs: the container (bucket, container or
//! `HOST:PORT`), the prefix, and the options of the query string.

use std::fmt;

use silt_common::{Error, Result};

/// The services an [`super::ObjectStore`] serves. What Silt knows of each is its
/// [`Scheme`], kept in the service's own module: adding a service is that module, a variant
/// here and its line in [`ObjectScheme::info`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ObjectScheme {
    /// Google Cloud Storage, `gs://BUCKET/PREFIX` (`gcs://` is an alias).
    Gcs,
    /// Azure Blob Storage, `azblob://CONTAINER/PREFIX`.
    Azblob,
    /// HDFS over its REST API, `webhdfs://HOST:PORT/PATH`.
    Webhdfs,
    /// HDFS as Hadoop names it, `hdfs://NAMENODE[:RPC_PORT]/PATH`, served over the same REST
    /// API at the namenode's HTTP port (`http_port`, default 9870): Silt speaks no Hadoop RPC
    /// (docs/SEMANTICS.md says why).
    Hdfs,
}

/// One service's URI form and set-up.
pub(crate) struct Scheme {
    /// The canonical scheme name, and the others accepted for it.
    pub name: &'static str,
    pub aliases: &'static [&'static str],
    /// What the URI's authority names ("bucket", "container", ...), and an example URI.
    pub container_word: &'static str,
    pub example: &'static str,
    /// Checks the authority; the error says what it must be.
    pub check_container: fn(&str) -> std::result::Result<(), &'static str>,
    /// Where credentials go instead of the URI's `user:secret@` part.
    pub credentials_hint: &'static str,
    /// The options a query may set.
    pub options: &'static [&'static str],
    /// Options that would carry a secret (refused without their value), with where the
    /// secret goes instead.
    pub secrets: &'static [(&'static str, &'static str)],
    /// Sets the store's client up.
    pub setup: super::SetupFn,
}

impl ObjectScheme {
    const ALL: [ObjectScheme; 4] = [
        ObjectScheme::Gcs,
        ObjectScheme::Azblob,
        ObjectScheme::Webhdfs,
        ObjectScheme::Hdfs,
    ];

    /// The table of services.
    pub(crate) fn info(self) -> &'static Scheme {
        match self {
            ObjectScheme::Gcs => &super::gcs::SCHEME,
            ObjectScheme::Azblob => &super::azblob::SCHEME,
            ObjectScheme::Webhdfs => &super::webhdfs::WEBHDFS,
            ObjectScheme::Hdfs => &super::webhdfs::HDFS,
        }
    }

    /// The canonical scheme name (`gs`, `azblob`, `webhdfs`, `hdfs`).
    pub fn name(self) -> &'static str {
        self.info().name
    }

    pub(crate) fn from_scheme(s: &str) -> Option<ObjectScheme> {
        ObjectScheme::ALL
            .into_iter()
            .find(|o| o.info().name == s || o.info().aliases.contains(&s))
    }
}

/// A parsed `gs://`, `azblob://`, `webhdfs://` or `hdfs://` URI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectUri {
    pub scheme: ObjectScheme,
    /// The bucket (GCS), container (Azure) or namenode `HOST:PORT` (WebHDFS; `HOST[:PORT]`
    /// with its RPC port for `hdfs://`).
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
        let info = scheme.info();
        let name = info.name;
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        // Never echo the URI here: `user:secret@host` would put a secret into a message.
        if authority.contains('@') {
            return Err(Error::invalid(format!(
                "invalid {name} URI: credentials in the URI are not supported; {}",
                info.credentials_hint
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
                info.container_word, info.example
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
    let info = scheme.info();
    (info.check_container)(authority).map_err(|why| {
        Error::invalid(format!(
            "invalid {} URI {shown:?}: {authority:?} is not a valid {}: {why}",
            info.name, info.container_word
        ))
    })
}

/// `HOST[:PORT]` as host and port (a bracketed IPv6 address keeps its colons).
pub(crate) fn split_port(authority: &str) -> (&str, Option<&str>) {
    match authority.rsplit_once(':') {
        Some((h, p)) if !authority.ends_with(']') => (h, Some(p)),
        _ => (authority, None),
    }
}

/// A host name, IPv4 address or bracketed IPv6 address.
pub(crate) fn host_ok(host: &str) -> bool {
    !host.is_empty()
        && (host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-'))
            || (host.starts_with('[') && host.ends_with(']')))
}

pub(crate) fn port_ok(port: &str) -> bool {
    port.parse::<u16>().is_ok_and(|p| p != 0)
}

fn parse_query(
    scheme: ObjectScheme,
    query: Option<&str>,
    shown: &str,
) -> Result<Vec<(String, String)>> {
    let info = scheme.info();
    let name = info.name;
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
        if let Some((_, instead)) = info.secrets.iter().find(|(s, _)| *s == key) {
            return Err(Error::invalid(format!(
                "invalid {name} URI {shown:?}: option {key} would put a secret in the URI \
                 (URIs are logged and shown); use {instead}"
            )));
        }
        if !info.options.contains(&key.as_str()) {
            return Err(Error::invalid(format!(
                "invalid {name} URI {shown:?}: unknown option {key:?} (allowed: {})",
                info.options.join(", ")
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
        assert_eq!(h.webhdfs_authority().unwrap(), "127.0.0.1:9870");
        // hdfs://: the RPC port gives way to the namenode's HTTP port.
        let n = parse("hdfs://nn.example:8020/warehouse?user=etl").unwrap();
        assert_eq!(n.webhdfs_authority().unwrap(), "nn.example:9870");
        assert_eq!(n.to_string(), "hdfs://nn.example:8020/warehouse?user=etl");
        let n = parse("hdfs://nn/w?http_port=50070").unwrap();
        assert_eq!(n.webhdfs_authority().unwrap(), "nn:50070");
        let n = parse("hdfs://[::1]:8020/w").unwrap();
        assert_eq!(n.webhdfs_authority().unwrap(), "[::1]:9870");
        let e = parse("hdfs://nn/w?http_port=0")
            .unwrap()
            .webhdfs_authority()
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        assert_eq!(
            parse("hdfs://nn:http/w").unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
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
