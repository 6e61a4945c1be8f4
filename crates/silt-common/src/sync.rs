//! Metadata sync policies: how long what Silt learned about a path (a stat, a listing, a
//! "no such file") is trusted before the under-store is asked again.
//!
//! A policy applies to a namespace path prefix; the longest matching prefix wins, and paths no
//! rule covers use the default (`sync_policy`). What each policy promises is written in
//! `docs/SEMANTICS.md`.

use std::fmt;
use std::time::Duration;

use crate::config::{is_at_or_under, parse_path_rules};
use crate::{Error, Result};

/// When cached metadata is revalidated against the under-store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncPolicy {
    /// Never on its own: the data set is immutable. Only `silt fs sync` / `invalidate` (or
    /// eviction of the entry) make Silt ask again.
    Never,
    /// Metadata older than this is revalidated on the next access.
    Interval(Duration),
    /// Every open, stat and directory read asks the store (a HEAD or one listing).
    Always,
}

impl SyncPolicy {
    /// Parses `never`, `always` or `interval=D` (D a duration such as `30s`, `1h`).
    pub fn parse(text: &str) -> Result<SyncPolicy> {
        let t = text.trim();
        match t {
            "never" => return Ok(SyncPolicy::Never),
            "always" => return Ok(SyncPolicy::Always),
            _ => {}
        }
        let bad = || {
            Error::invalid(format!(
                "sync policy {t:?}: expected never, always or interval=DURATION (e.g. interval=10m)"
            ))
        };
        let d = t.strip_prefix("interval=").ok_or_else(bad)?;
        let d = humantime::parse_duration(d.trim()).map_err(|_| bad())?;
        if d.is_zero() {
            // Zero would mean "always" with extra steps; say so rather than guess.
            return Err(Error::invalid(format!(
                "sync policy {t:?}: an interval must be longer than 0 (use `always`)"
            )));
        }
        if d > crate::config::MAX_DURATION {
            // `never` is the policy for "for ever"; a longer interval overflows clock arithmetic.
            return Err(Error::invalid(format!(
                "sync policy {t:?}: an interval is at most 366 days (use `never` for no expiry)"
            )));
        }
        Ok(SyncPolicy::Interval(d))
    }

    /// How long something learned at one instant stays trusted: `None` = for ever.
    pub fn trust(self) -> Option<Duration> {
        match self {
            SyncPolicy::Never => None,
            SyncPolicy::Interval(d) => Some(d),
            SyncPolicy::Always => Some(Duration::ZERO),
        }
    }

    /// Whether something learned `age` ago is still trusted.
    pub fn trusts(self, age: Duration) -> bool {
        self.trust().is_none_or(|t| age < t)
    }

    /// The kernel cache TTL for a path under this policy, given the configured ceiling: the
    /// kernel must not hold an answer longer than Silt itself would.
    pub fn kernel_ttl(self, configured: Duration) -> Duration {
        self.trust().map_or(configured, |t| t.min(configured))
    }

    /// How long a "no such file" learned from a HEAD is trusted: its own short TTL, never
    /// longer than the policy's trust.
    pub fn negative_trust(self, negative_ttl: Duration) -> Duration {
        self.trust().map_or(negative_ttl, |t| t.min(negative_ttl))
    }
}

impl fmt::Display for SyncPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SyncPolicy::Never => f.write_str("never"),
            SyncPolicy::Always => f.write_str("always"),
            SyncPolicy::Interval(d) => write!(f, "interval={}", humantime::format_duration(*d)),
        }
    }
}

/// A policy for a namespace prefix (`/data/imagenet=never`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncRule {
    /// Normalised namespace path; the rule covers it and everything below it.
    pub prefix: String,
    pub policy: SyncPolicy,
}

/// Parses `PREFIX=POLICY` entries, comma-separated (the `sync_rules` option's syntax).
pub fn parse_sync_rules(text: &str) -> Result<Vec<SyncRule>> {
    parse_path_rules(text, "sync rule", "/data/imagenet=never", |prefix, v| {
        Ok(SyncRule {
            prefix: prefix.to_string(),
            policy: SyncPolicy::parse(v)?,
        })
    })
}

/// The default policy plus per-prefix rules; the longest matching prefix wins.
#[derive(Debug, Clone)]
pub struct SyncRules {
    default: SyncPolicy,
    rules: Vec<SyncRule>,
}

impl SyncRules {
    pub fn new(default: SyncPolicy, rules: Vec<SyncRule>) -> Self {
        let mut r = SyncRules {
            default,
            rules: Vec::new(),
        };
        for rule in rules {
            r.set(rule.prefix, rule.policy);
        }
        r
    }

    /// Sets (or replaces) the rule for `prefix` (normalised).
    pub fn set(&mut self, prefix: String, policy: SyncPolicy) {
        if prefix == "/" {
            self.default = policy;
            return;
        }
        match self.rules.iter_mut().find(|r| r.prefix == prefix) {
            Some(r) => r.policy = policy,
            None => self.rules.push(SyncRule { prefix, policy }),
        }
    }

    /// The policy of `path` (normalised) and the prefix of the rule that set it (`/` for the
    /// default).
    pub fn policy_for(&self, path: &str) -> (SyncPolicy, &str) {
        self.rules
            .iter()
            .filter(|r| is_at_or_under(path, &r.prefix))
            .max_by_key(|r| r.prefix.len())
            .map_or((self.default, "/"), |r| (r.policy, r.prefix.as_str()))
    }

    /// The per-prefix rules (not the default).
    pub fn rules(&self) -> impl Iterator<Item = &SyncRule> {
        self.rules.iter()
    }

    pub fn default_policy(&self) -> SyncPolicy {
        self.default
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_policies() {
        assert_eq!(SyncPolicy::parse("never").unwrap(), SyncPolicy::Never);
        assert_eq!(SyncPolicy::parse(" always ").unwrap(), SyncPolicy::Always);
        assert!(SyncPolicy::parse("interval=10000years").is_err());
        assert!(SyncPolicy::parse("interval=366days").is_ok());
        let p = SyncPolicy::parse("interval=90s").unwrap();
        assert_eq!(p, SyncPolicy::Interval(Duration::from_secs(90)));
        assert_eq!(p.to_string(), "interval=1m 30s");
        assert_eq!(SyncPolicy::parse(&p.to_string()).unwrap(), p);
        for bad in ["", "sometimes", "interval=", "interval=0s", "interval=x"] {
            let e = SyncPolicy::parse(bad).unwrap_err();
            assert!(e.to_string().contains("sync policy"), "{bad}: {e}");
        }
    }

    #[test]
    fn trust_and_kernel_ttls() {
        let hour = Duration::from_secs(3600);
        assert!(SyncPolicy::Never.trusts(hour * 1000));
        assert!(!SyncPolicy::Always.trusts(Duration::ZERO));
        let i = SyncPolicy::Interval(Duration::from_secs(10));
        assert!(i.trusts(Duration::from_secs(9)) && !i.trusts(Duration::from_secs(10)));
        assert_eq!(SyncPolicy::Never.kernel_ttl(hour), hour);
        assert_eq!(i.kernel_ttl(hour), Duration::from_secs(10));
        assert_eq!(SyncPolicy::Always.kernel_ttl(hour), Duration::ZERO);
        assert_eq!(
            SyncPolicy::Never.negative_trust(Duration::from_secs(5)),
            Duration::from_secs(5)
        );
        assert_eq!(
            SyncPolicy::Always.negative_trust(Duration::from_secs(5)),
            Duration::ZERO
        );
    }

    #[test]
    fn longest_prefix_wins_on_whole_components() {
        let rules = parse_sync_rules("/data=never, /data/logs=always").unwrap();
        let r = SyncRules::new(SyncPolicy::Interval(Duration::from_secs(60)), rules);
        assert_eq!(r.policy_for("/data/x").0, SyncPolicy::Never);
        assert_eq!(
            r.policy_for("/data/logs/a"),
            (SyncPolicy::Always, "/data/logs")
        );
        assert_eq!(r.policy_for("/data/logsx").0, SyncPolicy::Never);
        assert_eq!(r.policy_for("/database").1, "/");
        assert!(parse_sync_rules("data=never").is_err());
        assert!(parse_sync_rules("/data").is_err());
        assert!(parse_sync_rules("/data=soon").is_err());
    }
}
