//! Who may use the gateway: access keys with per-key rights, and whether unsigned
//! (anonymous) requests are served at all.
//!
//! The keys file has one key a line, `ACCESS_KEY SECRET [ro|rw] [BUCKET,...]`; blank lines and
//! lines starting with `#` are skipped. Rights default to `ro`; the bucket list defaults to
//! every bucket (`*` says so explicitly). Like every secret file of Silt it must not be
//! readable by group or others. Secrets are never logged nor printed: they are held as
//! `silt_common::secret::Secret`, whose `Debug` is redacted.

use std::collections::HashMap;
use std::path::Path;

use s3s::auth::{S3Auth, SecretKey};
use s3s::{s3_error, S3Result};
use silt_common::secret::{read_owner_file, Secret};

use crate::GatewayError;

/// Largest keys file read (a path given by mistake, say /dev/zero, is an error, not a hang).
const MAX_KEYS_FILE: u64 = 1 << 20;

/// What one access key may do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyRights {
    secret: Secret,
    /// Read-write: a read-only key is refused every operation that is not a read (the
    /// mount's write rules decide, beside this, what may be written).
    pub writable: bool,
    /// The buckets the key may use; `None`: all of them.
    pub buckets: Option<Vec<String>>,
}

impl KeyRights {
    /// Whether this key may use `bucket`.
    pub fn allows_bucket(&self, bucket: &str) -> bool {
        self.buckets
            .as_ref()
            .is_none_or(|b| b.iter().any(|x| x == bucket))
    }
}

/// The access keys the gateway accepts, and whether it serves unsigned requests.
#[derive(Clone, Debug, Default)]
pub struct Keys {
    keys: HashMap<String, KeyRights>,
    /// Unsigned requests are served (read-only, every bucket). Off unless asked for.
    pub anonymous: bool,
}

impl Keys {
    /// No keys, no anonymous access: every request is refused.
    pub fn new() -> Keys {
        Keys::default()
    }

    /// Adds (or replaces) a key.
    pub fn insert(
        &mut self,
        access_key: &str,
        secret: &str,
        writable: bool,
        buckets: Option<Vec<String>>,
    ) {
        self.keys.insert(
            access_key.to_string(),
            KeyRights {
                secret: Secret::new(secret),
                writable,
                buckets,
            },
        );
    }

    /// The rights of `access_key`, if it is known.
    pub fn get(&self, access_key: &str) -> Option<&KeyRights> {
        self.keys.get(access_key)
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Parses the text of a keys file (`what` names it in errors; no secret is ever quoted).
    pub fn parse(text: &str, what: &str) -> Result<Keys, GatewayError> {
        let mut keys = Keys::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |why: &str| GatewayError::Keys(format!("{what}: line {}: {why}", n + 1));
            let mut fields = line.split_whitespace();
            let (Some(access), Some(secret)) = (fields.next(), fields.next()) else {
                return Err(bad("expected ACCESS_KEY SECRET [ro|rw] [BUCKET,...]"));
            };
            let writable = match fields.next() {
                None | Some("ro") => false,
                Some("rw") => true,
                Some(_) => return Err(bad("the third field must be `ro` or `rw`")),
            };
            let buckets = match fields.next() {
                None | Some("*") => None,
                Some(list) => {
                    let b: Vec<String> = list
                        .split(',')
                        .filter(|s| !s.is_empty())
                        .map(str::to_string)
                        .collect();
                    if b.is_empty() {
                        return Err(bad("empty bucket list"));
                    }
                    Some(b)
                }
            };
            if fields.next().is_some() {
                return Err(bad("too many fields"));
            }
            if keys.keys.contains_key(access) {
                return Err(bad("access key given twice"));
            }
            keys.insert(access, secret, writable, buckets);
        }
        Ok(keys)
    }

    /// Reads a keys file, refusing one that group or others may read.
    pub fn from_file(path: &Path) -> Result<Keys, GatewayError> {
        let what = path.display().to_string();
        let (text, shared) = read_owner_file(path, MAX_KEYS_FILE, &what)
            .map_err(|e| GatewayError::Keys(e.to_string()))?;
        if shared {
            return Err(GatewayError::Keys(format!(
                "{what}: readable by group or others; chmod 600 it"
            )));
        }
        Keys::parse(&text, &what)
    }
}

/// SigV4 verification asks for the secret of the access key a request names.
#[async_trait::async_trait]
impl S3Auth for Keys {
    async fn get_secret_key(&self, access_key: &str) -> S3Result<SecretKey> {
        match self.keys.get(access_key) {
            Some(k) => Ok(SecretKey::from(k.secret.expose())),
            None => Err(s3_error!(
                InvalidAccessKeyId,
                "The AWS Access Key Id you provided does not exist in our records."
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_rights_and_buckets() {
        let k = Keys::parse(
            "# comment\n\nAK1 s1\nAK2 s2 rw\nAK3 s3 ro data,logs\nAK4 s4 rw *\n",
            "keys",
        )
        .unwrap();
        assert_eq!(k.len(), 4);
        let a1 = k.get("AK1").unwrap();
        assert!(!a1.writable && a1.buckets.is_none() && a1.allows_bucket("x"));
        assert!(k.get("AK2").unwrap().writable);
        let a3 = k.get("AK3").unwrap();
        assert!(a3.allows_bucket("logs") && !a3.allows_bucket("other"));
        assert!(k.get("AK4").unwrap().buckets.is_none());
    }

    #[test]
    fn refuses_bad_lines_without_quoting_secrets() {
        for bad in [
            "AK1",
            "AK1 s1 admin",
            "AK1 s1 ro a b",
            "AK1 s1 ro ,",
            "AK1 s1\nAK1 s2",
        ] {
            let e = Keys::parse(bad, "keys").unwrap_err().to_string();
            assert!(e.starts_with("keys: line "), "{e}");
            assert!(!e.contains("s1") && !e.contains("s2"), "secret in {e}");
        }
    }

    #[test]
    fn debug_hides_secrets() {
        let k = Keys::parse("AK1 topsecret rw", "keys").unwrap();
        let d = format!("{k:?}");
        assert!(d.contains("AK1") && !d.contains("topsecret"), "{d}");
    }
}
