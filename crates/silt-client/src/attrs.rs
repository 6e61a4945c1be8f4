//! POSIX attributes the client keeps beside what the stores report.
//!
//! Directory times: creating, removing or renaming an entry through this client moves its
//! parent directory's mtime and ctime (POSIX). A local directory's own times move with the
//! store operation too, but the metadata cache may still hold the old stat, and an object
//! store has no directory times at all; so the client remembers, per directory, when an entry
//! last changed in it and reports the later of that and the store's mtime. The record lives
//! as long as the client (a restart reports the store's time again: a local directory's
//! real one, an S3 prefix's none). An explicit `utimensat` on the directory replaces it.

use std::collections::HashMap;
use std::time::SystemTime;

use parking_lot::Mutex;

use crate::namespace::parent_and_name;
use crate::Entry;

/// When an entry last changed in each directory, through this client.
#[derive(Default)]
pub(crate) struct DirTimes {
    changed: Mutex<HashMap<String, SystemTime>>,
}

impl DirTimes {
    /// An entry of `path`'s parent directory was created, removed or renamed now.
    pub fn touch_parent_of(&self, path: &str) {
        if let Some((dir, _)) = parent_and_name(path) {
            self.changed
                .lock()
                .insert(dir.to_string(), SystemTime::now());
        }
    }

    /// Everything at or below `path` is asked of the store again (`silt fs invalidate`).
    pub fn forget_under(&self, path: &str) {
        self.changed
            .lock()
            .retain(|d, _| !silt_common::config::is_at_or_under(d, path));
    }

    /// `e` with its mtime moved to the last change through this client, if that is later.
    pub fn apply(&self, mut e: Entry) -> Entry {
        if e.is_dir() {
            if let Some(t) = self.changed.lock().get(&e.path).copied() {
                if e.mtime.is_none_or(|m| m < t) {
                    e.mtime = Some(t);
                }
            }
        }
        e
    }

    pub fn is_empty(&self) -> bool {
        self.changed.lock().is_empty()
    }
}
