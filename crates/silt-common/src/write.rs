//! Write types: where the bytes of a file written through Silt go, and when a write counts as
//! done. What each promises is written in `docs/SEMANTICS.md` ("Writes").

use std::fmt;

use crate::config::{is_at_or_under, parse_path_rules};
use crate::size::parse_size;
use crate::{Error, Result};

/// Where written bytes go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteType {
    /// No writes: every modifying operation fails with `EROFS`.
    ReadOnly,
    /// Written to the under-store when the file is closed (the close returns once the store
    /// has the object) and cached as written, so reading it back costs no store request.
    Through,
    /// Written to the under-store when the file is closed; nothing is cached.
    StoreOnly,
    /// Kept only in Silt (scratch, shuffle): memory first, spilled to disk under pressure,
    /// dropped after `cache_only_ttl`. Never written to the under-store.
    CacheOnly,
    /// Acknowledged once durable inside Silt (the local write-ahead log, fsynced), persisted
    /// to the under-store in the background.
    Back,
}

impl WriteType {
    pub const ALL: [WriteType; 5] = [
        WriteType::ReadOnly,
        WriteType::Through,
        WriteType::StoreOnly,
        WriteType::CacheOnly,
        WriteType::Back,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            WriteType::ReadOnly => "read-only",
            WriteType::Through => "through",
            WriteType::StoreOnly => "store-only",
            WriteType::CacheOnly => "cache-only",
            WriteType::Back => "back",
        }
    }

    /// Parses a write type's name.
    pub fn parse(text: &str) -> Result<WriteType> {
        let t = text.trim();
        WriteType::ALL
            .into_iter()
            .find(|w| w.as_str() == t)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "unknown write type {t:?}: expected one of {}",
                    names()
                ))
            })
    }

    pub fn writable(self) -> bool {
        self != WriteType::ReadOnly
    }

    /// Whether written bytes are kept in the cache.
    pub fn caches(self) -> bool {
        matches!(
            self,
            WriteType::Through | WriteType::CacheOnly | WriteType::Back
        )
    }
}

fn names() -> String {
    WriteType::ALL
        .into_iter()
        .map(WriteType::as_str)
        .collect::<Vec<_>>()
        .join(", ")
}

impl fmt::Display for WriteType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A write type for a namespace prefix (`/data/shuffle=cache-only`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteRule {
    /// Normalised namespace path; the rule covers it and everything below it.
    pub prefix: String,
    pub write_type: WriteType,
}

/// Parses `PREFIX=TYPE` entries, comma-separated (the `write_rules` option's syntax).
pub fn parse_write_rules(text: &str) -> Result<Vec<WriteRule>> {
    parse_path_rules(
        text,
        "write rule",
        "/data/shuffle=cache-only",
        |prefix, t| {
            Ok(WriteRule {
                prefix: prefix.to_string(),
                write_type: WriteType::parse(t)?,
            })
        },
    )
}

/// The mount's write type plus per-prefix rules; the longest matching prefix wins.
#[derive(Debug, Clone)]
pub struct WriteRules {
    default: WriteType,
    rules: Vec<WriteRule>,
}

impl WriteRules {
    pub fn new(default: WriteType, rules: Vec<WriteRule>) -> Self {
        WriteRules { default, rules }
    }

    /// The write type of `path` (normalised).
    pub fn of(&self, path: &str) -> WriteType {
        self.rules
            .iter()
            .filter(|r| is_at_or_under(path, &r.prefix))
            .max_by_key(|r| r.prefix.len())
            .map_or(self.default, |r| r.write_type)
    }

    /// Whether any path may be written (the mount is then read-write).
    pub fn any_writable(&self) -> bool {
        self.default.writable() || self.rules.iter().any(|r| r.write_type.writable())
    }

    /// Whether some path at or below `path` may be written (a directory under a read-only
    /// default can still hold a writable prefix).
    pub fn writable_at_or_below(&self, path: &str) -> bool {
        self.of(path).writable()
            || self
                .rules
                .iter()
                .any(|r| r.write_type.writable() && is_at_or_under(&r.prefix, path))
    }

    pub fn default_type(&self) -> WriteType {
        self.default
    }

    pub fn rules(&self) -> &[WriteRule] {
        &self.rules
    }
}

impl From<WriteType> for WriteRules {
    fn from(t: WriteType) -> Self {
        WriteRules::new(t, Vec::new())
    }
}

/// A job's share of write memory (seed 004: shuffle data of higher-priority jobs stays in
/// memory longer): files written under `prefix` count against `memory_quota`, and under
/// pressure the memory of lower priorities spills to disk first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobSpec {
    /// Normalised namespace path.
    pub prefix: String,
    pub memory_quota: u64,
    /// 1 (lowest) to 9 (highest).
    pub priority: u8,
}

/// Priority of writes outside every job.
pub const DEFAULT_PRIORITY: u8 = 5;

/// Parses `PREFIX=QUOTA@PRIORITY` entries, comma-separated (the `write_jobs` option's syntax).
pub fn parse_jobs(text: &str) -> Result<Vec<JobSpec>> {
    const EXAMPLE: &str = "/shuffle/etl=2GiB@7";
    parse_path_rules(text, "write job", EXAMPLE, |prefix, v| {
        let (quota, prio) = v.split_once('@').unwrap_or((v, "5"));
        let memory_quota = parse_size(quota).map_err(|e| e.context("quota"))?;
        let priority = match prio.trim().parse::<u8>() {
            Ok(p @ 1..=9) => p,
            _ => {
                return Err(Error::invalid(format!(
                    "priority must be 1 (lowest) to 9, got {prio:?} (e.g. {EXAMPLE})"
                )))
            }
        };
        Ok(JobSpec {
            prefix: prefix.to_string(),
            memory_quota,
            priority,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn names_round_trip_and_unknown_types_are_refused_clearly() {
        for w in WriteType::ALL {
            assert_eq!(WriteType::parse(w.as_str()).unwrap(), w);
        }
        let e = WriteType::parse("sometimes").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        assert!(e.to_string().contains("cache-only"), "{e}");
        assert!(!WriteType::ReadOnly.writable());
        assert!(WriteType::Through.caches() && !WriteType::StoreOnly.caches());
    }

    #[test]
    fn rules_longest_prefix_and_jobs() {
        let rules = parse_write_rules("/data=through,/data/shuffle=cache-only").unwrap();
        let r = WriteRules::new(WriteType::ReadOnly, rules);
        assert_eq!(r.of("/data/x"), WriteType::Through);
        assert_eq!(r.of("/data/shuffle/p0"), WriteType::CacheOnly);
        assert_eq!(r.of("/other"), WriteType::ReadOnly);
        assert!(
            r.any_writable() && r.writable_at_or_below("/") && !r.writable_at_or_below("/other")
        );
        assert!(parse_write_rules("/data=sometimes").is_err());
        let jobs = parse_jobs("/shuffle/a=64MiB@7, /shuffle/b=1GiB").unwrap();
        assert_eq!(jobs[0].memory_quota, 64 << 20);
        assert_eq!((jobs[0].priority, jobs[1].priority), (7, DEFAULT_PRIORITY));
        for bad in ["/a=1GiB@0", "/a=1GiB@10", "/a=lots@3", "a=1GiB@3", "/a"] {
            assert!(parse_jobs(bad).is_err(), "{bad}");
        }
    }
}
