//! The namespace: under-stores mounted at paths (`/data` → `s3://bucket/prefix`).
//!
//! Resolution is longest-prefix on whole path components. Directories above mount points
//! (`/` when the only mount is `/data`, or `/a` for a mount at `/a/b`) are synthetic: they list
//! the next component of the mounts below them and hold nothing else.

use silt_common::config::{is_at_or_under, normalize_ns_path};
use silt_common::{Error, Result};
use silt_ufs::DynStore;

pub struct MountPoint {
    /// Normalised namespace path (`/` or `/a/b`).
    pub path: String,
    pub store: DynStore,
}

/// Where a namespace path lands.
pub enum Resolved<'a> {
    /// Inside an under-store: the mount and the path relative to the store root.
    Store { mount: &'a MountPoint, rel: String },
    /// A synthetic directory above one or more mount points; `children` are its entry names.
    Synthetic { children: Vec<String> },
}

pub struct Namespace {
    mounts: Vec<MountPoint>,
}

impl Namespace {
    pub fn new(mut mounts: Vec<MountPoint>) -> Result<Self> {
        if mounts.is_empty() {
            return Err(Error::invalid(
                "no mounts configured: give at least one PATH=URI (e.g. --mount /data=s3://bucket/prefix)",
            ));
        }
        for m in &mounts {
            if normalize_ns_path(&m.path).as_deref() != Some(m.path.as_str()) {
                return Err(Error::invalid(format!(
                    "mount path {:?} is not normalised",
                    m.path
                )));
            }
        }
        mounts.sort_by(|a, b| a.path.cmp(&b.path));
        for pair in mounts.windows(2) {
            let (a, b) = (&pair[0].path, &pair[1].path);
            if a == b || is_under(b, a) {
                return Err(Error::invalid(format!(
                    "mounts {a} and {b} overlap: a mount may not contain another"
                )));
            }
        }
        Ok(Namespace { mounts })
    }

    pub fn mounts(&self) -> &[MountPoint] {
        &self.mounts
    }

    /// Replaces every mount's store by `f(mount)` (e.g. to put resident files in front).
    pub fn map_stores(&mut self, mut f: impl FnMut(&MountPoint) -> DynStore) {
        for m in &mut self.mounts {
            m.store = f(m);
        }
    }

    /// Resolves a namespace path. Errors: not absolute, or outside every mount.
    pub fn resolve(&self, path: &str) -> Result<Resolved<'_>> {
        let norm = normalize_ns_path(path)
            .ok_or_else(|| Error::invalid(format!("{path:?} is not an absolute path")))?;
        let mut best: Option<&MountPoint> = None;
        for m in &self.mounts {
            if (norm == m.path || is_under(&norm, &m.path))
                && best.is_none_or(|b| m.path.len() > b.path.len())
            {
                best = Some(m);
            }
        }
        if let Some(mount) = best {
            let rel = norm[mount.path.len()..].trim_start_matches('/').to_string();
            return Ok(Resolved::Store { mount, rel });
        }
        let mut children: Vec<String> = self
            .mounts
            .iter()
            .filter(|m| is_under(&m.path, &norm))
            .filter_map(|m| {
                let rest = if norm == "/" {
                    &m.path[1..]
                } else {
                    &m.path[norm.len() + 1..]
                };
                rest.split('/').next().map(str::to_string)
            })
            .collect();
        if children.is_empty() {
            let known: Vec<&str> = self.mounts.iter().map(|m| m.path.as_str()).collect();
            return Err(Error::not_found(format!(
                "{norm} is outside every mount (mounts: {})",
                known.join(", ")
            )));
        }
        children.dedup();
        Ok(Resolved::Synthetic { children })
    }
}

/// Whether `path` is strictly below `dir` (both normalised).
fn is_under(path: &str, dir: &str) -> bool {
    path != dir && is_at_or_under(path, dir)
}

/// A normalised path's parent directory and last component; `None` for `/`.
pub fn parent_and_name(path: &str) -> Option<(&str, &str)> {
    if path == "/" {
        return None;
    }
    let idx = path.rfind('/')?;
    let parent = if idx == 0 { "/" } else { &path[..idx] };
    Some((parent, &path[idx + 1..]))
}

/// Joins a normalised directory path and a child name.
pub fn join(dir: &str, name: &str) -> String {
    if dir == "/" {
        format!("/{name}")
    } else {
        format!("{dir}/{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use silt_ufs::MemStore;
    use std::sync::Arc;

    fn ns(paths: &[&str]) -> Result<Namespace> {
        Namespace::new(
            paths
                .iter()
                .map(|p| MountPoint {
                    path: p.to_string(),
                    store: Arc::new(MemStore::new(format!("mem://{p}"))),
                })
                .collect(),
        )
    }

    #[test]
    fn resolves_longest_prefix_and_synthetic_parents() {
        let n = ns(&["/data", "/a/b", "/a/c"]).unwrap();
        match n.resolve("/data/x/y.jpg").unwrap() {
            Resolved::Store { mount, rel } => {
                assert_eq!(mount.path, "/data");
                assert_eq!(rel, "x/y.jpg");
            }
            _ => panic!("expected store"),
        }
        match n.resolve("/data").unwrap() {
            Resolved::Store { rel, .. } => assert_eq!(rel, ""),
            _ => panic!(),
        }
        match n.resolve("/").unwrap() {
            Resolved::Synthetic { children } => assert_eq!(children, vec!["a", "data"]),
            _ => panic!(),
        }
        match n.resolve("/a").unwrap() {
            Resolved::Synthetic { children } => assert_eq!(children, vec!["b", "c"]),
            _ => panic!(),
        }
        let e = n.resolve("/elsewhere/x").err().unwrap();
        assert!(e.to_string().contains("outside every mount"), "{e}");
        assert!(
            n.resolve("/database").is_err(),
            "prefix must match whole components"
        );
        assert!(n.resolve("relative").is_err());
    }

    #[test]
    fn rejects_overlaps_and_empty() {
        assert!(ns(&["/a", "/a/b"]).is_err());
        assert!(ns(&["/a", "/a"]).is_err());
        assert!(ns(&[]).is_err());
        let root = ns(&["/"]).unwrap();
        match root.resolve("/x").unwrap() {
            Resolved::Store { rel, .. } => assert_eq!(rel, "x"),
            _ => panic!(),
        }
    }
}
