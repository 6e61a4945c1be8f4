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
use silt_common::{Error, ErrorKind, Result};
use silt_ufs::SetAttrs;

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

    /// The directory's times were set explicitly (`utimensat`): the store's answer holds.
    pub fn forget(&self, dir: &str) {
        self.changed.lock().remove(dir);
    }

    /// Everything at or below `path` is asked of the store again (`silt fs invalidate`).
    pub fn forget_under(&self, path: &str) {
        self.changed
            .lock()
            .retain(|d, _| !silt_common::config::is_at_or_under(d, path));
    }

    /// `from` was renamed to `to`: what is remembered below `from` now belongs below `to`,
    /// and what was remembered below the replaced `to` is gone with it.
    pub fn rename(&self, from: &str, to: &str) {
        use silt_common::config::is_at_or_under;
        let mut changed = self.changed.lock();
        changed.retain(|d, _| !is_at_or_under(d, to));
        let moved: Vec<(String, SystemTime)> = changed
            .iter()
            .filter(|(d, _)| is_at_or_under(d, from))
            .map(|(d, t)| (format!("{to}{}", &d[from.len()..]), *t))
            .collect();
        changed.retain(|d, _| !is_at_or_under(d, from));
        changed.extend(moved);
    }

    /// `e` with its mtime moved to the last change through this client, if that is later.
    pub fn apply(&self, mut e: Entry) -> Entry {
        if e.is_dir() {
            if let Some(t) = self.changed.lock().get(&e.path).copied() {
                if e.mtime.is_none_or(|m| m < t) {
                    e.mtime = Some(t);
                }
                if e.posix.ctime.is_none_or(|c| c < t) {
                    e.posix.ctime = Some(t);
                }
            }
        }
        e
    }

    pub fn is_empty(&self) -> bool {
        self.changed.lock().is_empty()
    }
}

/// Who asks for a change (the FUSE request's credentials).
#[derive(Debug, Clone, Default)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
}

impl Caller {
    pub fn is_root(&self) -> bool {
        self.uid == 0
    }

    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }
}

/// A `setattr` as asked: new attributes, and whether the times are "now" (`UTIME_NOW` for
/// both, or `utimes(NULL)`), which anyone with write access may ask.
#[derive(Debug, Clone, Copy, Default)]
pub struct AttrChange {
    pub set: SetAttrs,
    pub times_now: bool,
}

const S_ISUID: u32 = 0o4000;
const S_ISGID: u32 = 0o2000;

/// The owner reported for an entry whose store keeps none: the Silt process's.
pub fn default_owner() -> (u32, u32) {
    // SAFETY: getuid/getgid cannot fail.
    unsafe { (libc::getuid(), libc::getgid()) }
}

/// Permission bits reported for an entry whose store keeps none.
pub fn default_mode(is_dir: bool) -> u32 {
    if is_dir {
        0o755
    } else {
        0o644
    }
}

/// The entry's owner, group and permission bits as reported.
pub fn owner_and_mode(e: &Entry) -> (u32, u32, u32) {
    let (u, g) = default_owner();
    (
        e.posix.uid.unwrap_or(u),
        e.posix.gid.unwrap_or(g),
        e.mode.unwrap_or_else(|| match e.kind {
            silt_ufs::EntryKind::Symlink => 0o777,
            _ => default_mode(e.is_dir()),
        }) & 0o7777,
    )
}

/// Checks `change` of `cur` by `caller` against POSIX (as Linux applies it) and returns the
/// attributes to store:
/// - chmod: the owner or root (`EPERM`); a non-root caller outside the file's group loses
///   `S_ISGID` from the new mode. Anyone may clear `S_ISUID`/`S_ISGID` and nothing else: the
///   kernel asks that (forced, after its own checks) when a non-owner writes to such a file.
/// - chown: only root changes the owner (the owner may "change" it to itself); the owner
///   may change the group to one it belongs to; otherwise `EPERM`. A chown of a non-directory
///   clears `S_ISUID` and `S_ISGID`.
/// - times: explicit ones need the owner or root (`EPERM`); "now" also anyone with write
///   permission (`EACCES` otherwise).
pub fn check_change(caller: &Caller, cur: &Entry, change: &AttrChange) -> Result<SetAttrs> {
    let (uid, gid, mode) = owner_and_mode(cur);
    let owner = caller.is_root() || caller.uid == uid;
    let deny = |what: &str| {
        Err(Error::new(
            ErrorKind::NotPermitted,
            format!("{}: {what}", cur.path),
        ))
    };
    let mut set = change.set;
    if let Some(new_uid) = set.uid {
        if !(caller.is_root() || caller.uid == uid && new_uid == uid) {
            return deny("only root may change the owner");
        }
    }
    if let Some(new_gid) = set.gid {
        if !(caller.is_root() || owner && (new_gid == gid || caller.in_group(new_gid))) {
            return deny("only the owner may change the group, to a group it belongs to");
        }
    }
    if let Some(m) = set.mode {
        // What the kernel asks when someone else writes to a setuid or setgid file it lets
        // them write (POSIX: the write succeeds and the bits go): only those bits cleared.
        let kills_privileges = set.uid.is_none()
            && set.gid.is_none()
            && m & 0o7777 != mode
            && m & 0o7777 | S_ISUID | S_ISGID == mode | S_ISUID | S_ISGID;
        if !owner && !kills_privileges {
            return deny("only the owner may change the mode");
        }
        let group = set.gid.unwrap_or(gid);
        let mut m = m & 0o7777;
        if !caller.is_root() && !caller.in_group(group) {
            m &= !S_ISGID;
        }
        set.mode = Some(m);
    }
    let chown = set.uid.is_some_and(|u| u != uid) || set.gid.is_some_and(|g| g != gid);
    if chown && !cur.is_dir() && set.mode.is_none() && mode & (S_ISUID | S_ISGID) != 0 {
        set.mode = Some(mode & !(S_ISUID | S_ISGID));
    }
    if set.atime.is_some() || set.mtime.is_some() {
        if change.times_now {
            if !owner && !may_write(caller, uid, gid, mode) {
                return Err(Error::new(
                    ErrorKind::PermissionDenied,
                    format!(
                        "{}: setting the times to now needs write permission",
                        cur.path
                    ),
                ));
            }
        } else if !owner {
            return deny("only the owner may set the times");
        }
    }
    Ok(set)
}

/// Whether the mode bits give `caller` write permission.
fn may_write(caller: &Caller, uid: u32, gid: u32, mode: u32) -> bool {
    caller.is_root()
        || if caller.uid == uid {
            mode & 0o200 != 0
        } else if caller.in_group(gid) {
            mode & 0o020 != 0
        } else {
            mode & 0o002 != 0
        }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembered_directory_times_follow_renames_and_go_with_removed_directories() {
        let t = DirTimes::default();
        for p in ["/m/a/x", "/m/a/sub/y", "/m/ab/z", "/m/b/old/w"] {
            t.touch_parent_of(p);
        }
        let known = |t: &DirTimes| {
            let mut v: Vec<String> = t.changed.lock().keys().cloned().collect();
            v.sort();
            v
        };
        // /m/a over /m/b: /m/b's own entries are gone, /m/a's move, /m/ab is another name.
        t.rename("/m/a", "/m/b");
        assert_eq!(known(&t), ["/m/ab", "/m/b", "/m/b/sub"]);
        t.forget_under("/m/b");
        assert_eq!(known(&t), ["/m/ab"]);
    }

    fn file(uid: u32, gid: u32, mode: u32) -> Entry {
        Entry {
            path: "/m/f".into(),
            kind: silt_ufs::EntryKind::File,
            size: 0,
            mtime: None,
            mode: Some(mode),
            posix: silt_ufs::Posix {
                uid: Some(uid),
                gid: Some(gid),
                ..Default::default()
            },
            object: None,
        }
    }

    fn user(uid: u32, gid: u32) -> Caller {
        Caller {
            uid,
            gid,
            groups: vec![],
        }
    }

    fn kind(r: Result<SetAttrs>) -> Option<ErrorKind> {
        r.err().map(|e| e.kind())
    }

    fn set(f: impl FnOnce(&mut SetAttrs)) -> AttrChange {
        let mut s = SetAttrs::default();
        f(&mut s);
        AttrChange {
            set: s,
            times_now: false,
        }
    }

    #[test]
    fn posix_permission_rules() {
        let f = file(1000, 100, 0o644);
        let chmod = set(|s| s.mode = Some(0o600));
        assert_eq!(kind(check_change(&user(1000, 100), &f, &chmod)), None);
        assert_eq!(
            kind(check_change(&user(1001, 100), &f, &chmod)),
            Some(ErrorKind::NotPermitted)
        );
        assert_eq!(kind(check_change(&user(0, 0), &f, &chmod)), None);
        // chown: root only; the owner to itself is a no-op that is allowed.
        let chown = set(|s| s.uid = Some(1001));
        assert_eq!(
            kind(check_change(&user(1000, 100), &f, &chown)),
            Some(ErrorKind::NotPermitted)
        );
        assert_eq!(kind(check_change(&user(0, 0), &f, &chown)), None);
        let same = set(|s| s.uid = Some(1000));
        assert_eq!(kind(check_change(&user(1000, 100), &f, &same)), None);
        // chgrp: the owner, to a group it is in.
        let mut member = user(1000, 100);
        member.groups.push(200);
        let chgrp = set(|s| s.gid = Some(200));
        assert_eq!(kind(check_change(&member, &f, &chgrp)), None);
        let other = set(|s| s.gid = Some(300));
        assert_eq!(
            kind(check_change(&member, &f, &other)),
            Some(ErrorKind::NotPermitted)
        );
        assert_eq!(
            kind(check_change(&user(1001, 200), &f, &chgrp)),
            Some(ErrorKind::NotPermitted)
        );
        // setgid dropped for a caller outside the file's group.
        let f2 = file(1000, 300, 0o644);
        let sgid = set(|s| s.mode = Some(0o2755));
        let r = check_change(&user(1000, 100), &f2, &sgid).unwrap();
        assert_eq!(r.mode, Some(0o755));
        let r = check_change(&user(1000, 300), &f2, &sgid).unwrap();
        assert_eq!(r.mode, Some(0o2755));
        // chown of a setuid file clears setuid/setgid.
        let suid = file(1000, 100, 0o6755);
        let r = check_change(&user(0, 0), &suid, &chown).unwrap();
        assert_eq!(r.mode, Some(0o755));
        // Anyone may clear the setuid/setgid bits (a non-owner's write), nothing more.
        let kill = set(|s| s.mode = Some(0o755));
        assert_eq!(kind(check_change(&user(1001, 200), &suid, &kill)), None);
        let kill_suid = set(|s| s.mode = Some(0o2755));
        assert_eq!(
            kind(check_change(&user(1001, 200), &suid, &kill_suid)),
            None
        );
        for more in [0o754, 0o4755 & 0o755 | 0o1000, 0o6755] {
            let c = set(|s| s.mode = Some(more));
            assert_eq!(
                kind(check_change(&user(1001, 200), &suid, &c)),
                Some(ErrorKind::NotPermitted),
                "{more:o}"
            );
        }
        // Times: explicit ones owner only; "now" anyone who may write.
        let t = std::time::SystemTime::now();
        let explicit = set(|s| s.mtime = Some(t));
        let mut now = explicit;
        now.times_now = true;
        let shared = file(1000, 100, 0o666);
        assert_eq!(
            kind(check_change(&user(1001, 500), &shared, &explicit)),
            Some(ErrorKind::NotPermitted)
        );
        assert_eq!(kind(check_change(&user(1001, 500), &shared, &now)), None);
        assert_eq!(
            kind(check_change(&user(1001, 500), &f, &now)),
            Some(ErrorKind::PermissionDenied)
        );
        assert_eq!(kind(check_change(&user(1000, 100), &f, &now)), None);
    }
}
