//! Inode numbers for namespace paths, with the kernel's lookup counts.
//!
//! The kernel holds a reference per successful lookup (and per readdirplus entry) and gives
//! them back with `forget`. A path keeps its number for as long as the mount lives and the
//! path names the same file, also after the kernel forgot the inode (it evicts inodes under
//! memory pressure, and drops the entries Silt invalidates): `st_ino` is how `find`, `tar`,
//! `du` and git's index recognise a file. A number is dropped only once its path was unlinked
//! or replaced (detached) and the kernel holds no reference. The cost is a table entry per
//! path the kernel was ever given (about a hundred bytes plus the path); a file removed
//! behind Silt's back keeps its entry (and a file recreated there its number).
//!
//! A rename moves a path and everything below it to the new name with their numbers (the
//! kernel keeps its inodes across a rename). An unlinked path is detached: the kernel may
//! still hold its inode (an open file), which keeps its number until forgotten, while a new
//! file at the same path gets a new number.
//!
//! With a log (`with_log`), every change of the table is appended to a file in the state dir
//! before the kernel can learn of it (the lock is held across the reply's making), so a daemon
//! taking over the mount (`replay`) maps the numbers the kernel holds back to their paths.
//! No fsync: the kernel mount and the OS page cache outlive a crash of the daemon. Lookup
//! counts are not logged; inodes restored from the log are pinned (never dropped by a forget).

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

use silt_common::config::is_at_or_under;

pub struct Inodes {
    by_ino: HashMap<u64, Node>,
    by_path: HashMap<String, u64>,
    next: u64,
    log: Option<std::fs::File>,
    log_path: Option<std::path::PathBuf>,
    /// Bytes appended since the log was last rewritten, and that rewrite's size: past twice
    /// the larger of it and `COMPACT_FLOOR`, the log is rewritten from the live table, so it
    /// stays within a few times the table's size whatever the number of opens.
    appended: u64,
    compacted: u64,
    /// File handles open for writing (logged, so a takeover knows which of the kernel's
    /// handles lost their unwritten bytes with the dead daemon).
    writers: std::collections::HashSet<u64>,
    /// Passthrough backings registered with the kernel, by inode, and every open handle
    /// (fh -> inode, and whether it is open in passthrough or through the daemon): logged, so
    /// a daemon taking over reuses a backing the kernel still reads (it refuses a second one
    /// for the inode), keeps its pages pinned, and knows which inodes the kernel has open
    /// through its page cache (it refuses a passthrough open of those).
    backings: HashMap<u64, LoggedBacking>,
    handles: HashMap<u64, (u64, HandleMode)>,
}

/// How the kernel has a handle open (its io mode for the inode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandleMode {
    Passthrough,
    /// Through the daemon (the kernel's page cache, or direct I/O).
    Daemon,
}

/// A passthrough backing as the log keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoggedBacking {
    /// The kernel's `backing_id` (valid on the mount's connection until closed).
    pub id: u32,
    pub object: silt_common::ObjectId,
    /// A file that needs no pin (a worker's private copy, or the store's own file).
    pub leased: bool,
    /// The store's own file (`source_passthrough`).
    pub source: bool,
}

/// Log records (tag, then fields: numbers as u64 LE, paths as u32 LE length + bytes).
const REC_ASSIGN: u8 = b'A';
const REC_DETACHED: u8 = b'X';
const REC_RENAME: u8 = b'R';
const REC_DETACH: u8 = b'D';
const REC_DROP: u8 = b'F';
const REC_NEXT: u8 = b'N';
const REC_WRITER: u8 = b'W';
const REC_CLOSED: u8 = b'C';
const REC_BACKING: u8 = b'B';
const REC_BACKING_CLOSED: u8 = b'K';
const REC_HANDLE: u8 = b'P';
const REC_HANDLE_RELEASED: u8 = b'Q';

fn put_handle(out: &mut Vec<u8>, fh: u64, ino: u64, mode: HandleMode) {
    out.push(REC_HANDLE);
    put_u64(out, fh);
    put_u64(out, ino);
    put_u64(out, u64::from(mode == HandleMode::Passthrough));
}

fn put_backing(out: &mut Vec<u8>, ino: u64, b: &LoggedBacking) {
    out.push(REC_BACKING);
    put_u64(out, ino);
    put_u64(out, u64::from(b.id));
    put_u64(out, b.object.0 as u64);
    put_u64(out, (b.object.0 >> 64) as u64);
    put_u64(out, u64::from(b.leased) | (u64::from(b.source) << 1));
}

/// Appended bytes below which the log is never rewritten while running.
const COMPACT_FLOOR: u64 = 4 << 20;

/// The lookup count of an inode restored from the log (the kernel's count is unknown).
const PINNED: u64 = u64::MAX / 2;

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// Reads records from a log's bytes; stops at a torn tail.
struct Reader<'a> {
    b: &'a [u8],
}

impl Reader<'_> {
    fn u64(&mut self) -> Option<u64> {
        let (h, t) = self.b.split_at_checked(8)?;
        self.b = t;
        Some(u64::from_le_bytes(h.try_into().ok()?))
    }

    fn str(&mut self) -> Option<String> {
        let (h, t) = self.b.split_at_checked(4)?;
        let n = u32::from_le_bytes(h.try_into().ok()?) as usize;
        let (s, t) = t.split_at_checked(n)?;
        self.b = t;
        String::from_utf8(s.to_vec()).ok()
    }

    fn tag(&mut self) -> Option<u8> {
        let (&t, rest) = self.b.split_first()?;
        self.b = rest;
        Some(t)
    }
}

struct Node {
    path: String,
    lookups: u64,
    /// Opened for writing through this mount since it started (not logged: a daemon taking
    /// over starts with none). Under a writable prefix such a file is read through the
    /// daemon, so the next writer need not wait for passthrough readers (see `SiltFs::open`).
    written: bool,
}

pub const ROOT: u64 = 1;

impl Default for Inodes {
    fn default() -> Self {
        Self::new()
    }
}

impl Inodes {
    pub fn new() -> Self {
        let mut t = Inodes {
            by_ino: HashMap::new(),
            by_path: HashMap::new(),
            next: ROOT + 1,
            log: None,
            log_path: None,
            appended: 0,
            compacted: 0,
            writers: Default::default(),
            backings: HashMap::new(),
            handles: HashMap::new(),
        };
        t.by_ino.insert(
            ROOT,
            Node {
                path: "/".into(),
                lookups: 1,
                written: false,
            },
        );
        t.by_path.insert("/".into(), ROOT);
        t
    }

    pub fn path(&self, ino: u64) -> Option<String> {
        self.by_ino.get(&ino).map(|n| n.path.clone())
    }

    /// The path of `ino` while it still names that file: `None` once it was unlinked or
    /// replaced (detached), when a new file at its old path is another file.
    pub fn attached_path(&self, ino: u64) -> Option<String> {
        let node = self.by_ino.get(&ino)?;
        (self.by_path.get(&node.path) == Some(&ino)).then(|| node.path.clone())
    }

    /// Records that `ino` was opened for writing through this mount.
    pub fn mark_written(&mut self, ino: u64) {
        if let Some(n) = self.by_ino.get_mut(&ino) {
            n.written = true;
        }
    }

    /// Whether `ino` was opened for writing through this mount since it started.
    pub fn was_written(&self, ino: u64) -> bool {
        self.by_ino.get(&ino).is_some_and(|n| n.written)
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
                written: false,
            },
        );
        self.by_path.insert(path.to_string(), ino);
        self.append(|r| {
            r.push(REC_ASSIGN);
            put_u64(r, ino);
            put_str(r, path);
        });
        ino
    }

    /// Appends one record to the log, if there is one. A failed write only costs a later
    /// takeover the inodes it misses (they answer ESTALE), so it is logged, not returned.
    fn append(&mut self, rec: impl FnOnce(&mut Vec<u8>)) {
        let Some(f) = self.log.as_mut() else {
            return;
        };
        let mut r = Vec::with_capacity(64);
        rec(&mut r);
        if let Err(e) = f.write_all(&r) {
            tracing::warn!("inode log write failed: {e}; a takeover of the mount may lose inodes");
            self.log = None;
            return;
        }
        self.appended += r.len() as u64;
        if self.appended > 2 * self.compacted.max(COMPACT_FLOOR) {
            if let Err(e) = self.rewrite() {
                // The old log is intact and still appended to; tried again after as much.
                tracing::warn!("rewriting the inode log: {e}");
                self.appended = 0;
            }
        }
    }

    /// Starts logging to `path` (a fresh mount: a new log).
    pub fn with_log(mut self, path: &Path) -> std::io::Result<Self> {
        self.log = Some(silt_common::private::create(path)?);
        self.log_path = Some(path.to_path_buf());
        Ok(self)
    }

    /// The live table as log records: what a rewrite of the log holds.
    fn image(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.push(REC_NEXT);
        put_u64(&mut out, self.next);
        for (ino, n) in &self.by_ino {
            if *ino == ROOT {
                continue;
            }
            let attached = self.by_path.get(&n.path) == Some(ino);
            out.push(if attached { REC_ASSIGN } else { REC_DETACHED });
            put_u64(&mut out, *ino);
            put_str(&mut out, &n.path);
        }
        for fh in &self.writers {
            out.push(REC_WRITER);
            put_u64(&mut out, *fh);
        }
        for (ino, b) in &self.backings {
            put_backing(&mut out, *ino, b);
        }
        for (fh, (ino, mode)) in &self.handles {
            put_handle(&mut out, *fh, *ino, *mode);
        }
        out
    }

    /// Replaces the log with the live table (a new file renamed over it), then appends there.
    fn rewrite(&mut self) -> std::io::Result<()> {
        let Some(path) = self.log_path.clone() else {
            return Ok(());
        };
        let image = self.image();
        let tmp = path.with_extension("tmp");
        silt_common::private::write(&tmp, &image)?;
        std::fs::rename(&tmp, &path)?;
        self.log = Some(std::fs::OpenOptions::new().append(true).open(&path)?);
        self.compacted = image.len() as u64;
        self.appended = 0;
        Ok(())
    }

    /// The table a dead daemon left in the log at `path`, compacted into a new log there that
    /// this table then appends to. A missing log gives a new table (inodes the kernel holds
    /// then answer ESTALE).
    pub fn replay(path: &Path) -> std::io::Result<Self> {
        let mut t = Inodes::new();
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e),
        };
        let mut r = Reader { b: &bytes };
        while let Some(tag) = r.tag() {
            let ok = match tag {
                REC_ASSIGN | REC_DETACHED => match (r.u64(), r.str()) {
                    (Some(ino), Some(p)) => {
                        if tag == REC_ASSIGN {
                            t.by_path.insert(p.clone(), ino);
                        }
                        // The kernel's counts are unknown: pinned (a detach keeps it).
                        t.by_ino.insert(
                            ino,
                            Node {
                                path: p,
                                lookups: PINNED,
                                written: false,
                            },
                        );
                        t.next = t.next.max(ino + 1);
                        true
                    }
                    _ => false,
                },
                REC_RENAME => match (r.str(), r.str()) {
                    (Some(a), Some(b)) => {
                        t.rename(&a, &b);
                        true
                    }
                    _ => false,
                },
                REC_DETACH => r.str().map(|p| t.detach(&p)).is_some(),
                REC_DROP => r.u64().map(|ino| t.drop_ino(ino)).is_some(),
                REC_NEXT => r.u64().map(|n| t.next = t.next.max(n)).is_some(),
                REC_WRITER => r.u64().map(|fh| t.writers.insert(fh)).is_some(),
                REC_CLOSED => r.u64().map(|fh| t.writers.remove(&fh)).is_some(),
                REC_BACKING => match (r.u64(), r.u64(), r.u64(), r.u64(), r.u64()) {
                    (Some(ino), Some(id), Some(lo), Some(hi), Some(flags)) => {
                        let b = LoggedBacking {
                            id: id as u32,
                            object: silt_common::ObjectId(u128::from(lo) | (u128::from(hi) << 64)),
                            leased: flags & 1 != 0,
                            source: flags & 2 != 0,
                        };
                        t.backings.insert(ino, b);
                        true
                    }
                    _ => false,
                },
                REC_BACKING_CLOSED => r.u64().map(|ino| t.backings.remove(&ino)).is_some(),
                REC_HANDLE => match (r.u64(), r.u64(), r.u64()) {
                    (Some(fh), Some(ino), Some(pt)) => {
                        let mode = if pt == 1 {
                            HandleMode::Passthrough
                        } else {
                            HandleMode::Daemon
                        };
                        t.handles.insert(fh, (ino, mode));
                        true
                    }
                    _ => false,
                },
                REC_HANDLE_RELEASED => r.u64().map(|fh| t.handles.remove(&fh)).is_some(),
                _ => false,
            };
            if !ok {
                tracing::warn!(
                    "inode log {} has a damaged tail; replayed up to it",
                    path.display()
                );
                break;
            }
        }
        for (ino, n) in t.by_ino.iter_mut() {
            if *ino != ROOT {
                n.lookups = PINNED;
            }
        }
        // A passthrough handle on a backing the log does not have (a torn tail) cannot be
        // served.
        let backings = &t.backings;
        t.handles
            .retain(|_, (ino, mode)| *mode == HandleMode::Daemon || backings.contains_key(ino));
        // Compact: the live table only, then append from there.
        t.log_path = Some(path.to_path_buf());
        t.rewrite()?;
        Ok(t)
    }

    /// Records that handle `fh` was opened for writing (`open`) or released.
    pub fn write_handle(&mut self, fh: u64, open: bool) {
        let changed = if open {
            self.writers.insert(fh)
        } else {
            self.writers.remove(&fh)
        };
        if changed {
            self.append(|r| {
                r.push(if open { REC_WRITER } else { REC_CLOSED });
                put_u64(r, fh);
            });
        }
    }

    /// Records a passthrough backing registered with the kernel for `ino` (`Some`), or closed.
    pub fn backing(&mut self, ino: u64, backing: Option<LoggedBacking>) {
        match backing {
            Some(b) => {
                self.backings.insert(ino, b);
                self.append(|r| put_backing(r, ino, &b));
            }
            None => {
                if self.backings.remove(&ino).is_some() {
                    self.append(|r| {
                        r.push(REC_BACKING_CLOSED);
                        put_u64(r, ino);
                    });
                }
            }
        }
    }

    /// Records that handle `fh` was opened on inode `ino` in `mode` (`Some`), or released.
    pub fn handle(&mut self, fh: u64, opened: Option<(u64, HandleMode)>) {
        match opened {
            Some((ino, mode)) => {
                self.handles.insert(fh, (ino, mode));
                self.append(|r| put_handle(r, fh, ino, mode));
            }
            None => {
                if self.handles.remove(&fh).is_some() {
                    self.append(|r| {
                        r.push(REC_HANDLE_RELEASED);
                        put_u64(r, fh);
                    });
                }
            }
        }
    }

    /// The passthrough backings and handles an earlier daemon left (see `replay`): each
    /// backing with the passthrough handles open on it.
    pub fn passthrough_state(&self) -> Vec<(u64, LoggedBacking, Vec<u64>)> {
        self.backings
            .iter()
            .map(|(ino, b)| {
                let fhs = self
                    .handles
                    .iter()
                    .filter(|(_, (i, mode))| i == ino && *mode == HandleMode::Passthrough)
                    .map(|(fh, _)| *fh)
                    .collect();
                (*ino, *b, fhs)
            })
            .collect()
    }

    /// The handles an earlier daemon left open through the daemon: (fh, inode).
    pub fn daemon_handles(&self) -> Vec<(u64, u64)> {
        self.handles
            .iter()
            .filter(|(_, (_, mode))| *mode == HandleMode::Daemon)
            .map(|(fh, (ino, _))| (*fh, *ino))
            .collect()
    }

    /// Whether `fh` is a handle open for writing (by this daemon or one before a takeover).
    pub fn is_write_handle(&self, fh: u64) -> bool {
        self.writers.contains(&fh)
    }

    /// Drops inode `ino` (its last kernel reference went).
    fn drop_ino(&mut self, ino: u64) -> Option<String> {
        let node = self.by_ino.remove(&ino)?;
        // A detached inode's path may name another inode by now.
        if self.by_path.get(&node.path) == Some(&ino) {
            self.by_path.remove(&node.path);
        }
        Some(node.path)
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
    /// never handed out again). An inode whose path still names it stays (module docs).
    pub fn forget(&mut self, ino: u64, n: u64) -> Option<String> {
        if ino == ROOT {
            return None;
        }
        let drop = match self.by_ino.get_mut(&ino) {
            Some(node) => {
                node.lookups = node.lookups.saturating_sub(n);
                node.lookups == 0 && self.by_path.get(&node.path) != Some(&ino)
            }
            None => false,
        };
        if !drop {
            return None;
        }
        let path = self.drop_ino(ino)?;
        self.append(|r| {
            r.push(REC_DROP);
            put_u64(r, ino);
        });
        Some(path)
    }

    /// Detaches `path` and every path below it (unlinked, removed, or replaced by a rename):
    /// lookups no longer find their inodes, which stay until the kernel forgets them (those
    /// it holds no reference to go now).
    pub fn detach(&mut self, path: &str) {
        if path == "/" {
            return;
        }
        let by_ino = &mut self.by_ino;
        self.by_path.retain(|p, ino| {
            let keep = !is_at_or_under(p, path);
            if !keep && by_ino.get(ino).is_some_and(|n| n.lookups == 0) {
                by_ino.remove(ino);
            }
            keep
        });
        self.append(|r| {
            r.push(REC_DETACH);
            put_str(r, path);
        });
    }

    /// Moves `from` and every path below it to `to` (what was at `to` is detached); the
    /// inodes keep their numbers.
    pub fn rename(&mut self, from: &str, to: &str) {
        if from == "/" || from == to {
            return;
        }
        // Logged as one record (its detach of `to` included), before anything moves.
        self.append(|r| {
            r.push(REC_RENAME);
            put_str(r, from);
            put_str(r, to);
        });
        let log = self.log.take();
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
        self.log = log;
    }

    pub fn is_empty(&self) -> bool {
        self.by_ino.is_empty()
    }

    pub fn len(&self) -> usize {
        self.by_ino.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_inode_is_attached_until_its_name_goes_to_another_file() {
        let mut t = Inodes::new();
        let (x, y) = (t.lookup("/m/x"), t.lookup("/m/y"));
        assert_eq!(t.attached_path(x).as_deref(), Some("/m/x"));
        // Renamed: attached under the new name. Renamed over: detached.
        t.rename("/m/y", "/m/x");
        assert_eq!(t.attached_path(y).as_deref(), Some("/m/x"));
        assert_eq!(t.attached_path(x), None);
        assert_eq!(
            t.path(x).as_deref(),
            Some("/m/x"),
            "the old name is still known"
        );
        // Unlinked, and a new file at the name: the old inode stays detached.
        t.detach("/m/x");
        let again = t.lookup("/m/x");
        assert_ne!(again, y);
        assert_eq!(t.attached_path(y), None);
        assert_eq!(t.attached_path(again).as_deref(), Some("/m/x"));
    }

    #[test]
    fn the_log_hands_passthrough_backings_and_their_open_handles_over() {
        let dir = std::env::temp_dir().join(format!("silt-inodes-pt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("inodes");
        let mut t = Inodes::new().with_log(&log).unwrap();
        let (a, b, c) = (t.lookup("/m/a"), t.lookup("/m/b"), t.lookup("/m/c"));
        let ba = LoggedBacking {
            id: 7,
            object: silt_common::ObjectId(u128::MAX - 5),
            leased: false,
            source: false,
        };
        let bb = LoggedBacking {
            id: 9,
            object: silt_common::ObjectId(42),
            leased: true,
            source: true,
        };
        t.backing(a, Some(ba));
        t.backing(b, Some(bb));
        let pt = |ino| Some((ino, HandleMode::Passthrough));
        t.handle(10, pt(a));
        t.handle(11, pt(a));
        t.handle(12, pt(b));
        t.handle(11, None);
        // b's only handle released and its backing closed; a handle on a backing never
        // logged (c) cannot be served and is dropped. Handles through the daemon are kept
        // until released.
        t.handle(12, None);
        t.backing(b, None);
        t.handle(13, pt(c));
        t.handle(14, Some((c, HandleMode::Daemon)));
        t.handle(15, Some((a, HandleMode::Daemon)));
        t.handle(15, None);
        drop(t);
        let r = Inodes::replay(&log).unwrap();
        assert_eq!(r.passthrough_state(), vec![(a, ba, vec![10])]);
        assert_eq!(r.daemon_handles(), vec![(14, c)]);
        drop(r);
        // The compacted log gives the same; a backing logged with no handle left comes back
        // without handles (the daemon closes it).
        let mut r = Inodes::replay(&log).unwrap();
        assert_eq!(r.passthrough_state(), vec![(a, ba, vec![10])]);
        assert_eq!(r.daemon_handles(), vec![(14, c)]);
        r.backing(b, Some(bb));
        drop(r);
        let mut got = Inodes::replay(&log).unwrap().passthrough_state();
        got.sort_by_key(|(ino, _, _)| *ino);
        assert_eq!(got, vec![(a, ba, vec![10]), (b, bb, vec![])]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_log_stays_small_however_many_opens_it_records() {
        let dir = std::env::temp_dir().join(format!("silt-inodes-big-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("inodes");
        let mut t = Inodes::new().with_log(&log).unwrap();
        let inos: Vec<u64> = (0..1000).map(|i| t.lookup(&format!("/m/f{i}"))).collect();
        // A million opens and releases: 34 MB of records.
        for fh in 0..1_000_000u64 {
            t.handle(fh, Some((inos[fh as usize % 1000], HandleMode::Daemon)));
            t.handle(fh, None);
        }
        t.handle(7, Some((inos[3], HandleMode::Daemon)));
        let size = std::fs::metadata(&log).unwrap().len();
        assert!(size < 3 * COMPACT_FLOOR, "the log is {size} bytes");
        drop(t);
        let r = Inodes::replay(&log).unwrap();
        assert_eq!(r.daemon_handles(), vec![(7, inos[3])]);
        assert_eq!(r.ino("/m/f999"), Some(inos[999]));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_log_gives_a_takeover_the_same_table() {
        let dir = std::env::temp_dir().join(format!("silt-inodes-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("inodes");
        let mut t = Inodes::new().with_log(&log).unwrap();
        let d = t.lookup("/m/d");
        let f = t.lookup("/m/d/f");
        let g = t.lookup("/m/g");
        let gone = t.lookup("/m/gone");
        t.detach("/m/gone");
        t.forget(gone, 1);
        t.rename("/m/d", "/m/e");
        t.detach("/m/g"); // unlinked but still open: the kernel holds g
        let h = t.peek_or_assign("/m/h");
        t.write_handle(7, true);
        t.write_handle(8, true);
        t.write_handle(8, false);
        let mut r = Inodes::replay(&log).unwrap();
        assert!(r.is_write_handle(7));
        assert!(!r.is_write_handle(8));
        assert_eq!(r.path(d).as_deref(), Some("/m/e"));
        assert_eq!(r.path(f).as_deref(), Some("/m/e/f"));
        assert_eq!(r.ino("/m/e/f"), Some(f));
        assert_eq!(r.path(g).as_deref(), Some("/m/g"));
        assert_eq!(r.ino("/m/g"), None);
        assert_eq!(r.path(h).as_deref(), Some("/m/h"));
        assert_eq!(r.path(gone), None);
        // Numbers are never handed out twice, and restored inodes survive a forget.
        let new = r.lookup("/m/new");
        assert!(new > h && new > gone);
        assert_eq!(r.forget(f, 1), None);
        // A second takeover replays the compacted log plus what the first appended.
        r.rename("/m/e", "/m/z");
        drop(r);
        let r2 = Inodes::replay(&log).unwrap();
        assert_eq!(r2.path(f).as_deref(), Some("/m/z/f"));
        assert_eq!(r2.ino("/m/new"), Some(new));
        assert_eq!(r2.path(g).as_deref(), Some("/m/g"));
        assert!(
            r2.is_write_handle(7),
            "still unreleased after the second takeover"
        );
        // A torn tail is ignored.
        let mut b = std::fs::read(&log).unwrap();
        b.extend_from_slice(&[REC_ASSIGN, 1, 2]);
        std::fs::write(&log, b).unwrap();
        let r3 = Inodes::replay(&log).unwrap();
        assert_eq!(r3.ino("/m/new"), Some(new));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn lookups_and_forgets_balance() {
        let mut t = Inodes::new();
        let a = t.lookup("/a");
        assert_eq!(t.lookup("/a"), a);
        t.forget(a, 1);
        assert_eq!(t.path(a).as_deref(), Some("/a"));
        t.forget(a, 1);
        // Forgotten by the kernel, but still the file at "/a": the same number again.
        assert_eq!(t.path(a).as_deref(), Some("/a"));
        assert_eq!(t.lookup("/a"), a);
        t.forget(a, 1);
        // Unlinked: gone at once (no reference), and a new file there gets a new number.
        t.detach("/a");
        assert_eq!(t.path(a), None);
        let b = t.lookup("/a");
        assert_ne!(a, b);
        // Unlinked while the kernel holds it: it stays until forgotten.
        t.detach("/a");
        assert_eq!(t.path(b).as_deref(), Some("/a"));
        assert_eq!(t.forget(b, 1).as_deref(), Some("/a"));
        assert_eq!(t.path(b), None);
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
