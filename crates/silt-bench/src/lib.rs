//! Benchmark environment for Silt: a real S3-compatible server (versitygw, posix backend) in
//! its own network namespace, reached from the host over a veth pair, with the network shaped
//! like a remote object store.
//!
//! # Design
//!
//! ```text
//!  host netns                      netns silt-bench-<id>
//!  client ── sbv<id>h ═══ veth ═══ sbv<id>n ── proxy ─────────── versitygw
//!            198.18.<id>.1/30      198.18.<id>.2:9000           127.0.0.1:9001
//!            tbf (egress)          tbf (egress)   delay line +
//!                                                 per-conn pacing
//! ```
//!
//! * **Aggregate rate**: a `tbf` qdisc at the root of both veth ends (egress of each side), at
//!   the aggregate rate, so the sum of all connections in each direction is capped.
//! * **Latency and per-connection rate**: this kernel has no `netem`, `fq`, `fq_codel`, `sfq`,
//!   `cake` or `prio` (only `tbf`, `htb`, `pfifo`), so neither a delay nor a per-flow pacing
//!   can be done with `tc`. Both live in a small userspace TCP proxy ([`proxy`]) that runs in
//!   the namespace in front of the server: every connection is forwarded to versitygw on the
//!   namespace's loopback; each direction is a *delay line* (chunks are timestamped on arrival
//!   and released at arrival + RTT/2, so throughput is not bounded by the delay) followed by a
//!   per-connection token bucket. The proxy is this crate's own binary in a hidden `proxy` mode.
//!   The client's TCP handshake completes against the proxy at once, so the proxy holds a
//!   connection's first request bytes for one extra RTT, as a handshake with a remote server
//!   would cost. (Loss, jitter and TCP's own slow start over the long path are not modelled.)
//! * **`fast` profile**: no `tbf` and no proxy: versitygw listens on the namespace's veth
//!   address itself.
//!
//! # Addresses
//!
//! Only loopback and the project's own namespaces are used: the veth pair of instance `<id>`
//! (0–255) gets `198.18.<id>.1/30` (host end `sbv<id>h`) and `198.18.<id>.2/30` (namespace end
//! `sbv<id>n`), from the benchmarking range 198.18.0.0/15. Only the on-link /30 routes exist;
//! the namespace has no default route, so nothing in it can reach any other address. The S3
//! endpoint is `http://198.18.<id>.2:9000`.
//!
//! # Cleanup guarantees
//!
//! [`Env::up`] first tears down any previous instance with the same id, and records everything
//! it creates (namespace, links, qdiscs, process ids with their command lines, directories) in
//! `/run/silt-bench/<id>/state.json` *before or right after* creating it. [`Env::down`] (and
//! `Drop for Env`) reads that file, so it works after the process that ran `up` died, even by
//! `SIGKILL`: it kills the recorded processes (only when `/proc/<pid>/cmdline` still matches,
//! so a recycled pid is never killed), then any process still inside the namespace, deletes the
//! qdiscs, links and namespace (also by name, when the state file is missing), and the run dir.
//! Every step tolerates its object being already gone. A failed `up` tears down what it made.
//! Two processes must not run `up`/`down` for the *same* id at the same time. (The empty
//! `/run/silt-bench` itself is left in place.) The server and proxy run in their own process
//! group, detached from the caller's terminal, so `silt-bench env up` can exit and leave them
//! running; once that process is gone they are reaped by init (or the nearest subreaper).

pub mod env;
pub mod proxy;

use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

pub use env::{Env, UpOptions};

/// Network shaping of one environment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Profile {
    /// Round-trip time added by the proxy (half in each direction).
    pub rtt: Duration,
    /// Pacing of each connection, each direction, in bytes/s (`None`: unlimited).
    pub per_conn_rate: Option<u64>,
    /// Cap of all traffic in each direction, in bytes/s (`None`: unlimited).
    pub aggregate_rate: Option<u64>,
}

impl Profile {
    /// No shaping at all: the client talks to versitygw directly over the veth pair.
    pub fn fast() -> Profile {
        Profile {
            rtt: Duration::ZERO,
            per_conn_rate: None,
            aggregate_rate: None,
        }
    }

    /// A nearby object store: 10 ms RTT, 50 MB/s per connection, 250 MB/s in all.
    pub fn remote() -> Profile {
        Profile {
            rtt: Duration::from_millis(10),
            per_conn_rate: Some(50_000_000),
            aggregate_rate: Some(250_000_000),
        }
    }

    /// `fast` or `remote`.
    pub fn named(name: &str) -> Result<Profile> {
        match name {
            "fast" => Ok(Profile::fast()),
            "remote" => Ok(Profile::remote()),
            other => bail!("unknown profile {other:?} (known: fast, remote)"),
        }
    }

    /// Whether the proxy is needed (some latency or a per-connection rate).
    pub fn needs_proxy(&self) -> bool {
        !self.rtt.is_zero() || self.per_conn_rate.is_some()
    }

    /// Applies CLI knobs over a base profile: `rtt` like `10ms`/`0`, rates like `50MB`.
    pub fn with_knobs(
        mut self,
        rtt: Option<&str>,
        per_conn_rate: Option<&str>,
        aggregate_rate: Option<&str>,
    ) -> Result<Profile> {
        if let Some(rtt) = rtt {
            self.rtt = parse_duration(rtt).with_context(|| format!("bad --rtt {rtt:?}"))?;
        }
        if let Some(r) = per_conn_rate {
            self.per_conn_rate =
                parse_rate(r).with_context(|| format!("bad --per-conn-rate {r:?}"))?;
        }
        if let Some(r) = aggregate_rate {
            self.aggregate_rate =
                parse_rate(r).with_context(|| format!("bad --aggregate-rate {r:?}"))?;
        }
        if self.rtt > Duration::from_secs(10) {
            bail!("--rtt {:?} is above the 10 s limit", self.rtt);
        }
        Ok(self)
    }
}

impl std::fmt::Display for Profile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let rate = |r: Option<u64>| match r {
            Some(r) => format!("{r} B/s"),
            None => "unlimited".to_string(),
        };
        write!(
            f,
            "rtt {:?}, per-connection {}, aggregate {}",
            self.rtt,
            rate(self.per_conn_rate),
            rate(self.aggregate_rate)
        )
    }
}

/// `0`, `10ms`, `1.5ms`, `2s`, … (humantime syntax, plus a bare `0`).
pub fn parse_duration(s: &str) -> Result<Duration> {
    let s = s.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if let Some(ms) = s.strip_suffix("ms") {
        // humantime has no fractions; allow `1.5ms`.
        if let Ok(v) = ms.trim().parse::<f64>() {
            if v.is_finite() && v >= 0.0 {
                return Ok(Duration::from_secs_f64(v / 1000.0));
            }
            bail!("negative or non-finite duration");
        }
    }
    humantime::parse_duration(s).map_err(|e| anyhow::anyhow!("{e} (expected e.g. 10ms)"))
}

/// A rate in bytes/s: `50MB` (10^6), `50MiB` (2^20), `400Mbit` (bits), optional `/s`;
/// `none`, `unlimited` or `0` mean no limit.
pub fn parse_rate(s: &str) -> Result<Option<u64>> {
    let t = s.trim();
    let t = t.strip_suffix("/s").unwrap_or(t).trim();
    if matches!(t, "0" | "none" | "unlimited" | "off") {
        return Ok(None);
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| anyhow::anyhow!("expected a number with a unit, e.g. 50MB"))?;
    let factor: f64 = match unit.trim() {
        "" | "B" => 1.0,
        "KB" | "kB" | "K" | "k" => 1e3,
        "MB" | "M" => 1e6,
        "GB" | "G" => 1e9,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        "bit" => 1.0 / 8.0,
        "kbit" | "Kbit" => 1e3 / 8.0,
        "Mbit" | "mbit" => 1e6 / 8.0,
        "Gbit" | "gbit" => 1e9 / 8.0,
        other => bail!("unknown unit {other:?} (B, KB, MB, GB, KiB, MiB, GiB, kbit, Mbit, Gbit)"),
    };
    let bytes = value * factor;
    if !bytes.is_finite() || bytes < 1000.0 {
        bail!("rate must be at least 1000 B/s (or 0/none for no limit)");
    }
    if bytes > 1e12 {
        bail!("rate above 1 TB/s");
    }
    Ok(Some(bytes.round() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates() {
        assert_eq!(parse_rate("50MB").unwrap(), Some(50_000_000));
        assert_eq!(parse_rate("50MB/s").unwrap(), Some(50_000_000));
        assert_eq!(parse_rate("1MiB").unwrap(), Some(1 << 20));
        assert_eq!(parse_rate("400Mbit").unwrap(), Some(50_000_000));
        assert_eq!(parse_rate("250000").unwrap(), Some(250_000));
        assert_eq!(parse_rate("none").unwrap(), None);
        assert_eq!(parse_rate("0").unwrap(), None);
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("10XB").is_err());
        assert!(parse_rate("-5MB").is_err());
        assert!(parse_rate("1B").is_err());
    }

    #[test]
    fn durations_and_knobs() {
        assert_eq!(parse_duration("10ms").unwrap(), Duration::from_millis(10));
        assert_eq!(
            parse_duration("1.5ms").unwrap(),
            Duration::from_micros(1500)
        );
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert!(parse_duration("soon").is_err());
        let p = Profile::fast()
            .with_knobs(Some("20ms"), Some("1MB"), None)
            .unwrap();
        assert_eq!(p.rtt, Duration::from_millis(20));
        assert_eq!(p.per_conn_rate, Some(1_000_000));
        assert_eq!(p.aggregate_rate, None);
        assert!(p.needs_proxy());
        assert!(!Profile::fast().needs_proxy());
        assert!(Profile::remote().needs_proxy());
        assert!(Profile::named("slow").is_err());
        assert!(Profile::fast().with_knobs(Some("1h"), None, None).is_err());
    }
}
