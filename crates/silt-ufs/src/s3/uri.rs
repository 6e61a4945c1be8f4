//! Per-mount S3 settings carried in a store URI's query string, and the S3-compatible clouds
//! that speak S3 under a scheme of their own (`oss://`, `cos://`, `obs://`, `r2://`).
//!
//! `s3://bucket/prefix?endpoint=http://10.0.0.5:9000&region=eu-west-1&addressing=path&secret_access_key_env=MINIO_SECRET`
//! gives one mount its own endpoint, region, addressing style and keys, so an AWS bucket and an
//! on-premises MinIO bucket sit side by side in one namespace. A secret is never written in the
//! URI itself (URIs are logged and shown by `silt report`): only the name of an environment
//! variable or of a file that holds it.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use silt_common::{Error, Result};

use super::S3Options;
use silt_common::query::{percent_decode, percent_encode};

/// A store that speaks S3: AWS (or any endpoint given) under `s3://`, or a cloud whose
/// endpoint, region and addressing Silt derives from its scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum S3Flavor {
    #[default]
    S3,
    /// Alibaba Cloud OSS: `https://oss-REGION.aliyuncs.com`, virtual-host addressing.
    Oss,
    /// Tencent Cloud COS: `https://cos.REGION.myqcloud.com`, virtual-host addressing.
    Cos,
    /// Huawei Cloud OBS: `https://obs.REGION.myhuaweicloud.com`, virtual-host addressing.
    Obs,
    /// Cloudflare R2: `https://ACCOUNT.r2.cloudflarestorage.com`, region `auto`.
    R2,
}

impl S3Flavor {
    /// The flavor of a URI scheme (lower case), if it speaks S3.
    pub fn from_scheme(scheme: &str) -> Option<S3Flavor> {
        Some(match scheme {
            "s3" | "s3a" => S3Flavor::S3,
            "oss" => S3Flavor::Oss,
            "cos" => S3Flavor::Cos,
            "obs" => S3Flavor::Obs,
            "r2" => S3Flavor::R2,
            _ => return None,
        })
    }

    pub fn scheme(self) -> &'static str {
        match self {
            S3Flavor::S3 => "s3",
            S3Flavor::Oss => "oss",
            S3Flavor::Cos => "cos",
            S3Flavor::Obs => "obs",
            S3Flavor::R2 => "r2",
        }
    }
}

/// The query-string keys a URI of an S3 store takes.
const KEYS: &[&str] = &[
    "endpoint",
    "region",
    "addressing",
    "account",
    "access_key_id",
    "access_key_id_env",
    "secret_access_key_env",
    "secret_access_key_file",
];

/// Keys that would put a secret into the URI; refused without echoing the value.
const SECRET_KEYS: &[&str] = &["secret_access_key", "secret", "session_token", "password"];

/// One mount's S3 settings from its URI; what is not given comes from the process-wide
/// `s3_*` options.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct S3UriOptions {
    pub flavor: S3Flavor,
    pub endpoint: Option<String>,
    pub region: Option<String>,
    /// `addressing=path` (true) or `addressing=virtual` (false).
    pub path_style: Option<bool>,
    /// R2's account id (its endpoint's host name).
    pub account: Option<String>,
    /// Not a secret (an identifier, as AWS treats it), so it may stand in the URI.
    pub access_key_id: Option<String>,
    pub access_key_id_env: Option<String>,
    pub secret_access_key_env: Option<String>,
    pub secret_access_key_file: Option<PathBuf>,
}

impl S3UriOptions {
    /// Parses the query string `query` (without the `?`) of a URI of `flavor`. `shown` names
    /// the URI in errors (bucket and prefix, never the query's values).
    pub fn parse(flavor: S3Flavor, query: Option<&str>, shown: &str) -> Result<S3UriOptions> {
        let mut o = S3UriOptions {
            flavor,
            ..Default::default()
        };
        let mut seen = BTreeMap::new();
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (key, raw) = pair.split_once('=').unwrap_or((pair, ""));
            let key = key.to_ascii_lowercase();
            if SECRET_KEYS.contains(&key.as_str()) {
                return Err(Error::invalid(format!(
                    "{shown}: a secret never goes into a URI (URIs are logged and shown); \
                     give secret_access_key_env=VARIABLE or secret_access_key_file=PATH"
                )));
            }
            if !KEYS.contains(&key.as_str()) {
                return Err(Error::invalid(format!(
                    "{shown}: unknown option {key:?} (known: {})",
                    KEYS.join(", ")
                )));
            }
            let value = percent_decode(raw)
                .ok_or_else(|| Error::invalid(format!("{shown}: option {key}: bad %-escape")))?;
            if value.is_empty() {
                return Err(Error::invalid(format!("{shown}: option {key} is empty")));
            }
            if seen.insert(key.clone(), ()).is_some() {
                return Err(Error::invalid(format!("{shown}: option {key} given twice")));
            }
            match key.as_str() {
                "endpoint" => {
                    if !(value.starts_with("http://") || value.starts_with("https://")) {
                        return Err(Error::invalid(format!(
                            "{shown}: endpoint {value:?} must start with http:// or https://"
                        )));
                    }
                    o.endpoint = Some(value)
                }
                "region" => o.region = Some(value),
                "addressing" => {
                    o.path_style = Some(match value.as_str() {
                        "path" => true,
                        "virtual" => false,
                        _ => {
                            return Err(Error::invalid(format!(
                                "{shown}: addressing={value:?}: expected path or virtual"
                            )))
                        }
                    })
                }
                "account" => o.account = Some(value),
                "access_key_id" => o.access_key_id = Some(value),
                "access_key_id_env" => o.access_key_id_env = Some(value),
                "secret_access_key_env" => o.secret_access_key_env = Some(value),
                "secret_access_key_file" => o.secret_access_key_file = Some(PathBuf::from(value)),
                _ => unreachable!("every key of KEYS has an arm"),
            }
        }
        if o.account.is_some() && flavor != S3Flavor::R2 {
            return Err(Error::invalid(format!(
                "{shown}: account= is for r2:// only"
            )));
        }
        let needs_region = matches!(flavor, S3Flavor::Oss | S3Flavor::Cos | S3Flavor::Obs);
        if needs_region && o.region.is_none() && o.endpoint.is_none() {
            return Err(Error::invalid(format!(
                "{shown}: {}:// needs region= (e.g. ?region={}) or endpoint=",
                flavor.scheme(),
                match flavor {
                    S3Flavor::Oss => "cn-hangzhou",
                    S3Flavor::Cos => "ap-guangzhou",
                    _ => "cn-north-4",
                }
            )));
        }
        if flavor == S3Flavor::R2 && o.account.is_none() && o.endpoint.is_none() {
            return Err(Error::invalid(format!(
                "{shown}: r2:// needs account=ACCOUNT_ID or endpoint="
            )));
        }
        if o.access_key_id.is_some() && o.access_key_id_env.is_some() {
            return Err(Error::invalid(format!(
                "{shown}: give access_key_id or access_key_id_env, not both"
            )));
        }
        if o.secret_access_key_env.is_some() && o.secret_access_key_file.is_some() {
            return Err(Error::invalid(format!(
                "{shown}: give secret_access_key_env or secret_access_key_file, not both"
            )));
        }
        let has_id = o.access_key_id.is_some() || o.access_key_id_env.is_some();
        let has_secret = o.secret_access_key_env.is_some() || o.secret_access_key_file.is_some();
        if has_id != has_secret {
            return Err(Error::invalid(format!(
                "{shown}: a mount's access key id and secret come together \
                 (access_key_id[_env] with secret_access_key_env or secret_access_key_file)"
            )));
        }
        Ok(o)
    }

    /// Whether the URI carried no option (and is plain `s3://`).
    pub fn is_plain(&self) -> bool {
        *self == S3UriOptions::default()
    }

    /// The process-wide options `base` with this mount's own settings in force. Reads the
    /// secret's variable or file now; `shown` names the mount's store in errors.
    pub fn apply(&self, base: &S3Options, shown: &str) -> Result<S3Options> {
        let mut o = base.clone();
        let derived_region = match self.flavor {
            S3Flavor::R2 => Some("auto".to_string()),
            _ => None,
        };
        if let Some(r) = self.region.clone().or(derived_region) {
            o.region = r;
        }
        let derived_endpoint = match (self.flavor, &self.region, &self.account) {
            (S3Flavor::Oss, Some(r), _) => Some(format!("https://oss-{r}.aliyuncs.com")),
            (S3Flavor::Cos, Some(r), _) => Some(format!("https://cos.{r}.myqcloud.com")),
            (S3Flavor::Obs, Some(r), _) => Some(format!("https://obs.{r}.myhuaweicloud.com")),
            (S3Flavor::R2, _, Some(a)) => Some(format!("https://{a}.r2.cloudflarestorage.com")),
            _ => None,
        };
        if let Some(e) = self.endpoint.clone().or(derived_endpoint) {
            o.endpoint = e;
        }
        // OSS, COS and OBS answer virtual-host requests only; R2 and plain S3 keep the
        // process-wide style unless the URI says.
        let derived_style = match self.flavor {
            S3Flavor::Oss | S3Flavor::Cos | S3Flavor::Obs => Some(false),
            _ => None,
        };
        if let Some(p) = self.path_style.or(derived_style) {
            o.path_style = p;
        }
        let id = match (&self.access_key_id, &self.access_key_id_env) {
            (Some(id), _) => Some(id.clone()),
            (None, Some(var)) => Some(env_value(var, shown)?),
            (None, None) => None,
        };
        let secret = match (&self.secret_access_key_env, &self.secret_access_key_file) {
            (Some(var), _) => Some(env_value(var, shown)?),
            (None, Some(path)) => Some(file_value(path, shown)?),
            (None, None) => None,
        };
        if let (Some(id), Some(secret)) = (id, secret) {
            o.access_key_id = id;
            o.secret_access_key = secret;
        }
        Ok(o)
    }
}

/// The query string of these options (keys in a fixed order; only names of variables and
/// files, never a secret), empty when there are none.
impl fmt::Display for S3UriOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pairs: [(&str, Option<String>); 8] = [
            ("endpoint", self.endpoint.clone()),
            ("region", self.region.clone()),
            (
                "addressing",
                self.path_style
                    .map(|p| if p { "path" } else { "virtual" }.to_string()),
            ),
            ("account", self.account.clone()),
            ("access_key_id", self.access_key_id.clone()),
            ("access_key_id_env", self.access_key_id_env.clone()),
            ("secret_access_key_env", self.secret_access_key_env.clone()),
            (
                "secret_access_key_file",
                self.secret_access_key_file
                    .as_ref()
                    .map(|p| p.display().to_string()),
            ),
        ];
        let mut first = true;
        for (k, v) in pairs {
            if let Some(v) = v {
                write!(
                    f,
                    "{}{k}={}",
                    if first { "?" } else { "&" },
                    percent_encode(&v)
                )?;
                first = false;
            }
        }
        Ok(())
    }
}

/// `uri` as it may be shown in a message or a log: the values of query keys that name
/// secrets (refused anyway, see [`S3UriOptions::parse`]) and any `user:password@` in the
/// authority replaced by `<redacted>`. For every scheme (other stores' keys included).
pub fn redact_uri(uri: &str) -> String {
    let (head, query) = match uri.split_once('?') {
        Some((h, q)) => (h, Some(q)),
        None => (uri, None),
    };
    let head = match head.split_once("://") {
        Some((scheme, rest)) => {
            let (authority, path) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
            match authority.rsplit_once('@') {
                Some((_, host)) => {
                    let sep = if path.is_empty() && !rest.contains('/') {
                        ""
                    } else {
                        "/"
                    };
                    format!("{scheme}://<redacted>@{host}{sep}{path}")
                }
                None => head.to_string(),
            }
        }
        None => head.to_string(),
    };
    let Some(query) = query else { return head };
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| {
            let key = pair.split_once('=').map_or(pair, |(k, _)| k);
            let lower = key.to_ascii_lowercase();
            let secret = SECRET_KEYS.contains(&lower.as_str())
                || ["key", "token", "credential"]
                    .iter()
                    .any(|w| lower.ends_with(w) && !lower.ends_with("_id"));
            if secret && pair.contains('=') {
                format!("{key}=<redacted>")
            } else {
                pair.to_string()
            }
        })
        .collect();
    format!("{head}?{}", pairs.join("&"))
}

fn env_value(var: &str, shown: &str) -> Result<String> {
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => Ok(v),
        _ => Err(Error::invalid(format!(
            "{shown}: environment variable {var} (named by the URI) is not set"
        ))),
    }
}

fn file_value(path: &std::path::Path, shown: &str) -> Result<String> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Error::invalid(format!(
            "{shown}: reading the secret file {}: {e}",
            path.display()
        ))
    })?;
    let v = text.trim();
    if v.is_empty() {
        return Err(Error::invalid(format!(
            "{shown}: the secret file {} is empty",
            path.display()
        )));
    }
    Ok(v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(flavor: S3Flavor, q: &str) -> Result<S3UriOptions> {
        S3UriOptions::parse(flavor, Some(q), "s3://b/p")
    }

    #[test]
    fn options_parse_apply_and_show() {
        let o = parse(
            S3Flavor::S3,
            "endpoint=http://127.0.0.1:9000&region=eu-west-1&addressing=virtual",
        )
        .unwrap();
        let a = o.apply(&S3Options::default(), "s3://b/p").unwrap();
        assert_eq!(a.endpoint, "http://127.0.0.1:9000");
        assert_eq!(a.region, "eu-west-1");
        assert!(!a.path_style);
        assert_eq!(
            o.to_string(),
            "?endpoint=http://127.0.0.1:9000&region=eu-west-1&addressing=virtual"
        );
        assert_eq!(parse(S3Flavor::S3, &o.to_string()[1..]).unwrap(), o);
        assert!(parse(S3Flavor::S3, "").unwrap().is_plain());
    }

    #[test]
    fn clouds_get_their_endpoints() {
        let base = S3Options::default();
        let oss = parse(S3Flavor::Oss, "region=cn-hangzhou").unwrap();
        let a = oss.apply(&base, "x").unwrap();
        assert_eq!(
            (a.endpoint.as_str(), a.path_style),
            ("https://oss-cn-hangzhou.aliyuncs.com", false)
        );
        let cos = parse(S3Flavor::Cos, "region=ap-guangzhou").unwrap();
        assert_eq!(
            cos.apply(&base, "x").unwrap().endpoint,
            "https://cos.ap-guangzhou.myqcloud.com"
        );
        let r2 = parse(S3Flavor::R2, "account=abc123").unwrap();
        let a = r2.apply(&base, "x").unwrap();
        assert_eq!(
            (a.endpoint.as_str(), a.region.as_str()),
            ("https://abc123.r2.cloudflarestorage.com", "auto")
        );
        // An endpoint given wins (an emulator, a private endpoint).
        let oss = parse(S3Flavor::Oss, "endpoint=http://127.0.0.1:1").unwrap();
        assert_eq!(
            oss.apply(&base, "x").unwrap().endpoint,
            "http://127.0.0.1:1"
        );
        assert!(parse(S3Flavor::Oss, "").is_err(), "OSS needs a region");
        assert!(parse(S3Flavor::R2, "").is_err(), "R2 needs an account");
        assert!(parse(S3Flavor::S3, "account=x").is_err(), "account is R2's");
    }

    #[test]
    fn secrets_come_by_reference_only() {
        for q in [
            "secret_access_key=abc",
            "SECRET_ACCESS_KEY=abc",
            "session_token=abc",
        ] {
            let e = parse(S3Flavor::S3, q).unwrap_err().to_string();
            assert!(!e.contains("abc"), "the value is not echoed: {e}");
            assert!(e.contains("secret_access_key_env"), "{e}");
        }
        let var = "SILT_TEST_S3URI_SECRET";
        std::env::set_var(var, "s3cr3t");
        let o = parse(
            S3Flavor::S3,
            &format!("access_key_id=AKID&secret_access_key_env={var}"),
        )
        .unwrap();
        let a = o.apply(&S3Options::default(), "x").unwrap();
        assert_eq!(
            (a.access_key_id.as_str(), a.secret_access_key.as_str()),
            ("AKID", "s3cr3t")
        );
        assert!(!o.to_string().contains("s3cr3t"));
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("secret");
        std::fs::write(&file, "from-file\n").unwrap();
        let o = parse(
            S3Flavor::S3,
            &format!("access_key_id=A&secret_access_key_file={}", file.display()),
        )
        .unwrap();
        assert_eq!(
            o.apply(&S3Options::default(), "x")
                .unwrap()
                .secret_access_key,
            "from-file"
        );
        let missing = parse(
            S3Flavor::S3,
            "access_key_id=A&secret_access_key_env=SILT_TEST_NOT_SET_ANYWHERE",
        )
        .unwrap();
        let e = missing.apply(&S3Options::default(), "x").unwrap_err();
        assert!(e.to_string().contains("SILT_TEST_NOT_SET_ANYWHERE"), "{e}");
    }

    #[test]
    fn shown_uris_hold_no_secret() {
        assert_eq!(
            redact_uri("s3://b/p?endpoint=http://x&secret_access_key=hunter2&region=r"),
            "s3://b/p?endpoint=http://x&secret_access_key=<redacted>&region=r"
        );
        assert_eq!(
            redact_uri("azblob://c/p?account_key=abc&sas_token=def&account=a"),
            "azblob://c/p?account_key=<redacted>&sas_token=<redacted>&account=a"
        );
        assert_eq!(redact_uri("s3://id:pw@b/p"), "s3://<redacted>@b/p");
        assert_eq!(redact_uri("s3://id:pw@b"), "s3://<redacted>@b");
        assert_eq!(
            redact_uri("s3://b/p?access_key_id=A&secret_access_key_env=V"),
            "s3://b/p?access_key_id=A&secret_access_key_env=V"
        );
        assert_eq!(redact_uri("file:///srv/data"), "file:///srv/data");
    }

    #[test]
    fn bad_options_are_refused() {
        for q in [
            "nope=1",
            "endpoint=ftp://x",
            "addressing=sideways",
            "region=a&region=b",
            "region=",
            "access_key_id=A",
            "secret_access_key_env=X",
            "access_key_id=A&access_key_id_env=B&secret_access_key_env=C",
            "endpoint=%zz",
        ] {
            assert!(parse(S3Flavor::S3, q).is_err(), "{q}");
        }
    }
}
