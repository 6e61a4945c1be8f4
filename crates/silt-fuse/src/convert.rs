//! Translation between FUSE's types and the core's: a request's caller and process, an
//! error's errno, attributes, and the replies built from the core's answers.

use std::time::SystemTime;

use fuser::{
    Errno, FileAttr, FileType, Generation, INodeNo, ReplyAttr, ReplyEmpty, ReplyEntry, ReplyXattr,
    Request, TimeOrNow,
};
use silt_client::fs::{Answer, Attr};
use silt_common::Error;
use silt_ufs::{EntryKind, SpecialKind};

/// The credentials of a request: its uid and gid, and the supplementary groups of its
/// process (from `/proc`; none if it is gone).
pub(crate) fn caller(req: &Request) -> silt_client::attrs::Caller {
    let groups = proc_status(req.pid(), "Groups:")
        .map(|g| {
            g.split_whitespace()
                .filter_map(|v| v.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    silt_client::attrs::Caller {
        uid: req.uid(),
        gid: req.gid(),
        groups,
    }
}

/// Who a creating request makes the owner of the new entry (its uid and gid; no `/proc`).
pub(crate) fn owner(req: &Request) -> silt_client::fs::Owner {
    silt_client::fs::Owner {
        uid: req.uid(),
        gid: req.gid(),
    }
}

/// The process (thread group) of the request's thread, from `/proc`; `None` if unreadable.
pub(crate) fn process_of(req: &Request) -> Option<u32> {
    proc_status(req.pid(), "Tgid:").and_then(|v| v.trim().parse().ok())
}

/// The value of line `key` (e.g. `"Tgid:"`) of `/proc/PID/status`; `None` if it cannot be read.
pub(crate) fn proc_status(pid: u32, key: &str) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .map(str::to_string)
}

pub(crate) fn errno(e: &Error) -> Errno {
    Errno::from_i32(e.errno())
}

/// The kernel's file type of an entry.
pub(crate) fn file_type(kind: EntryKind) -> FileType {
    match kind {
        EntryKind::Dir => FileType::Directory,
        EntryKind::File => FileType::RegularFile,
        EntryKind::Symlink => FileType::Symlink,
        EntryKind::Special(SpecialKind::Fifo) => FileType::NamedPipe,
        EntryKind::Special(SpecialKind::Socket) => FileType::Socket,
        EntryKind::Special(SpecialKind::CharDevice) => FileType::CharDevice,
        EntryKind::Special(SpecialKind::BlockDevice) => FileType::BlockDevice,
    }
}

pub(crate) fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.blocks,
        atime: a.atime,
        mtime: a.mtime,
        ctime: a.ctime,
        crtime: a.mtime,
        kind: file_type(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: a.blksize,
        flags: 0,
    }
}

pub(crate) fn reply_entry(reply: ReplyEntry, r: silt_common::Result<Answer>) {
    match r {
        Ok(a) => reply.entry_with_ttls(
            &a.attr_ttl,
            &a.entry_ttl,
            &file_attr(&a.attr),
            Generation(0),
        ),
        Err(e) => reply.error(errno(&e)),
    }
}

pub(crate) fn reply_attr(reply: ReplyAttr, r: silt_common::Result<Answer>) {
    match r {
        Ok(a) => reply.attr(&a.attr_ttl, &file_attr(&a.attr)),
        Err(e) => reply.error(errno(&e)),
    }
}

pub(crate) fn reply_empty(reply: ReplyEmpty, r: silt_common::Result<()>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(&e)),
    }
}

/// A `setattr` time: `Some(None)` for now.
pub(crate) fn time(t: Option<TimeOrNow>) -> Option<Option<SystemTime>> {
    t.map(|t| match t {
        TimeOrNow::Now => None,
        TimeOrNow::SpecificTime(t) => Some(t),
    })
}

/// Answers a getxattr or listxattr: the size asked for (`size` 0), the bytes, or `ERANGE`.
pub(crate) fn reply_xattr(reply: ReplyXattr, size: u32, bytes: &[u8]) {
    let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
    if size == 0 {
        reply.size(len)
    } else if len <= size {
        reply.data(bytes)
    } else {
        reply.error(Errno::ERANGE)
    }
}
