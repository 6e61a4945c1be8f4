//! Inode numbers for namespace paths, with the kernel's lookup counts.
//!
//! The kernel holds a reference per successful lookup (and per readdirplus entry) and gives
//! them back with `forget`; an inode is dropped when its count reaches zero. Readdir hands out
//! numbers without references (`peek_or_assign`); such inodes live until the next lookup
//! takes a reference or the table is rebuilt.
//!
//! A rename moves a path and everything below it to the new name with their numbers (the
//! kernel keeps its inodes across a rename). An unlinked path is detached: the kernel may
//! still hold its inode (an open file), which keeps its number until forgotten, while a new
//! file at the same path gets a new number.

use std::collections::HashMap;

use silt_common::config::is_at_or_under;

pub struct Inodes {
    by_ino: HashMap<u64, Node>,
    by_path: HashMap<String, u64>,
    next: u64,
}

struct Node {
    path: String,
    lookups: u64,
}

pub const ROOT: u64 = 1;

impl Inodes {
    pub fn new() -> Self {
        let mut t = Inodes {
            by_ino: HashMap::new(),
            by_path: HashMap::new(),
            next: ROOT + 1,
        };
        t.by_ino.insert(
            ROOT,
            Node {
                path: "/".into(),
                lookups: 1,
            },
        );
        t.by_path.insert("/".into(), ROOT);
        t
    }

    pub fn path(&self, ino: u64) -> Option<String> {
        self.by_ino.get(&ino).map(|n| n.path.clone())
    }

    /// The inode of `path`, if the kernel may know it.
    pub fn ino(&self, path: &str) -> Option<u64> {
        self.by_path.get(path).copied()
    }

    /// Every known path equal to `prefix` or below it (a policy change reaches them all).
    pub fn under(&self, prefix: &str) -> Vec<String> {
        self.by_path
            .keys()
            .filter(|p| is_at_or_under(p, prefix))
            .cloned()
            .collect()
    }

    pub fn peek_or_assign(&mut self, path: &str) -> u64 {
        if let Some(&ino) = self.by_path.get(path) {
            return ino;
        }
        let ino = self.next;
        self.next += 1;
        self.by_ino.insert(
            ino,
            Node {
                path: path.to_string(),
                lookups: 0,
            },
        );
        self.by_path.insert(path.to_string(), ino);
        ino
    }

    /// Takes one kernel reference on `path`'s inode.
    pub fn lookup(&mut self, path: &str) -> u64 {
        let ino = self.peek_or_assign(path);
        if let Some(n) = self.by_ino.get_mut(&ino) {
            n.lookups += 1;
        }
        ino
    }

    /// Gives back `n` kernel references; the inode's path if it was dropped (its number is
    /// never handed out again).
    pub fn forget(&mut self, ino: u64, n: u64) -> Option<String> {
        if ino == ROOT {
            return None;
        }
        let drop = match self.by_ino.get_mut(&ino) {
            Some(node) => {
                node.lookups = node.lookups.saturating_sub(n);
                node.lookups == 0
            }
            None => false,
        };
        if !drop {
            return None;
        }
        let node = self.by_ino.remove(&ino)?;
        // A detached inode's path may name another inode by now.
        if self.by_path.get(&node.path) == Some(&ino) {
            self.by_path.remove(&node.path);
        }
        Some(node.path)
    }

    /// Detaches `path` and every path below it (unlinked, removed, or replaced by a rename):
    /// lookups no longer find their inodes, which stay until the kernel forgets them.
    pub fn detach(&mut self, path: &str) {
        if path == "/" {
            return;
        }
        self.by_path.retain(|p, _| !is_at_or_under(p, path));
    }

    /// Moves `from` and every path below it to `to` (what was at `to` is detached); the
    /// inodes keep their numbers.
    pub fn rename(&mut self, from: &str, to: &str) {
        if from == "/" || from == to {
            return;
        }
        self.detach(to);
        let moved: Vec<(String, u64)> = self
            .by_path
            .iter()
            .filter(|(p, _)| is_at_or_under(p, from))
            .map(|(p, ino)| (p.clone(), *ino))
            .collect();
        for (old, ino) in moved {
            self.by_path.remove(&old);
            let new = format!("{to}{}", &old[from.len()..]);
            if let Some(n) = self.by_ino.get_mut(&ino) {
                n.path = new.clone();
            }
            self.by_path.insert(new, ino);
        }
    }

    pub fn len(&self) -> usize {
        self.by_ino.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_and_forgets_balance() {
        let mut t = Inodes::new();
        let a = t.lookup("/a");
        assert_eq!(t.lookup("/a"), a);
        t.forget(a, 1);
        assert_eq!(t.path(a).as_deref(), Some("/a"));
        t.forget(a, 1);
        assert_eq!(t.path(a), None);
        // A new number after the old one was forgotten: the kernel never sees a reused ino for
        // a different path while it still holds the old one.
        let b = t.lookup("/a");
        assert_ne!(a, b);
        t.forget(ROOT, 100);
        assert_eq!(t.path(ROOT).as_deref(), Some("/"));
    }

    #[test]
    fn renames_keep_numbers_and_detached_paths_get_new_ones() {
        let mut t = Inodes::new();
        let d = t.lookup("/m/d");
        let f = t.lookup("/m/d/f");
        let deep = t.lookup("/m/d/s/g");
        let other = t.lookup("/m/dd");
        let target = t.lookup("/m/e/f");
        t.rename("/m/d", "/m/e");
        assert_eq!(t.ino("/m/e"), Some(d));
        assert_eq!(
            t.ino("/m/e/f"),
            Some(f),
            "the moved file replaces the old target"
        );
        assert_eq!(t.ino("/m/e/s/g"), Some(deep));
        assert_eq!(t.path(deep).as_deref(), Some("/m/e/s/g"));
        assert_eq!(t.ino("/m/d"), None);
        assert_eq!(
            t.ino("/m/dd"),
            Some(other),
            "a sibling with the same prefix stays"
        );
        // The replaced inode lives on until forgotten, without taking its old path along.
        assert_eq!(t.path(target).as_deref(), Some("/m/e/f"));
        t.forget(target, 1);
        assert_eq!(t.ino("/m/e/f"), Some(f));

        t.detach("/m/e/f");
        assert_eq!(t.ino("/m/e/f"), None);
        let again = t.lookup("/m/e/f");
        assert_ne!(again, f, "a new file at an unlinked path gets a new number");
        t.forget(f, 1);
        assert_eq!(t.ino("/m/e/f"), Some(again));
        assert_eq!(t.path(f), None);
    }
}
