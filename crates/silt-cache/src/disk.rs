//! Disk tiers: pages in sparse per-object data files, indexed by an append-only journal.
//!
//! # Layout
//!
//! ```text
//! <dir>/silt-tier                          header: format version and page size (text)
//! <dir>/journal                            append-only page journal (56-byte records)
//! <dir>/clean-shutdown                     present only between a clean shutdown and the next open
//! <dir>/no-seals                           an unseal could not be made durable: trust no seal
//! <dir>/objects/<hex[0..2]>/<hex>.data     one sparse data file per object version
//! ```
//!
//! Each object version (an [`ObjectId`], i.e. a content fingerprint) has ONE sparse data file
//! whose length is the object's size; page `i` lives at offset `i * page_size`. A fully cached
//! object is therefore a plain local file whose bytes are exactly the object, which FUSE
//! passthrough hands to the kernel. Pages not cached are holes.
//!
//! # Journal
//!
//! The journal records page insertions (object, index, length, crc32c of the data,
//! object size, page size) and removals (one page, or a whole object). Every record is 56
//! bytes and carries a crc32c of its own bytes, so a torn or garbage tail is detected: replay
//! stops at the first record that does not check out and ignores the rest.
//!
//! Record layout (little endian): `kind u8 | 3 zero bytes | object u128 | index u64 |
//! len u32 | data crc32c u32 | object_size u64 | page_size u64 | record crc32c u32`, the
//! last field covering bytes 0..52.
//!
//! On open the tier replays the journal, drops pages whose data file is missing or too short,
//! deletes data files no live page refers to, punches holes where a data file holds bytes of
//! no live page (left by a crash between data write and journal append), and compacts: the
//! live records are written to a temporary file, fsynced and renamed over the journal. The
//! header records the page size; if it changed since the last run the tier is wiped (pages
//! of another size cannot be reused). An unknown or missing header with data present also
//! wipes, since the state cannot be trusted.
//!
//! # Crash safety
//!
//! A put writes the data first (`pwrite`), then appends the journal record. Nothing is
//! fsynced per page (too slow); instead every disk read verifies the page's crc32c, so data
//! that was torn or lost in a crash is detected, dropped and refetched by the caller. A stale
//! or torn page is never served. A record lost in a crash only forgets a page; its bytes are
//! reclaimed by the hole punching at the next open.
//!
//! Passthrough hands whole data files to the kernel, which checks nothing, so the store trusts
//! a page's bytes without reading them back only when they cannot be torn: pages written by
//! this process; pages recovered after a clean shutdown ([`DiskTier::mark_clean`]: every
//! byte synced and the journal complete, then the `clean-shutdown` marker written; opening
//! the tier removes the marker durably before anything else, so a crash is never mistaken for
//! a clean shutdown); and pages recovered after the process died within the same boot (the
//! `boot-id` file names the boot the journal was complete in: every write the dead process
//! completed is in the OS page cache, a page's bytes before its record, so nothing can be
//! torn; only a reboot can lose unsynced bytes). A failed journal append leaves the journal
//! incomplete (a lost removal would revive a punched page), so it withholds the marker and
//! removes the boot record until a compaction rewrites the journal from the index. Pages
//! recovered suspect (after a reboot) keep the boot record away until the next restart, so a
//! crash meanwhile cannot launder them.
//!
//! In the running process the index and the files are kept in step: a page's bytes are
//! written through a handle to the file that was at the object's path when the page was
//! reserved (under the store's lock), and a data file is only ever replaced by unlinking it
//! and creating a new one (never truncated), so a write that outlives its reservation lands
//! in the old, unlinked file and never in a newer one.
//!
//! # Seals
//!
//! Objects complete before a crash (even of the machine) are trusted if they were **sealed**: once all pages of an
//! object (of 4 MiB or more) are written, the store fdatasyncs its data file and appends a seal record (the page
//! count and the crc32c of the pages' crcs). Replay trusts the object only if the seal matches
//! its pages and no record of the object follows. Before a sealed file's bytes change the seal
//! is undone durably: a punch waits for the removal record to be synced; an unlinked file needs
//! nothing until a new data file is created for the object, which syncs the journal first. If
//! that sync fails, the `no-seals` marker makes the next open trust no seal. Opening after a
//! clean shutdown seals every complete object (their bytes were synced by the shutdown), and
//! the compacted journal carries the seals over.
//!
//! # Eviction
//!
//! Each tier has a quota with high/low watermarks (enforced by the store). The quota in force is
//! the smaller of the configured one and what the tier's file system can hold: its pages plus
//! the free space, less a reserve kept free for what else writes there (write spill, logs,
//! the journal): 1/16 of the file system, at most 256 MiB ([`DiskTier::refresh_quota`]). Evicting a page
//! punches a hole (`fallocate(PUNCH_HOLE | KEEP_SIZE)`) and appends a removal record; when an
//! object has no pages left its data file is deleted. Removing a whole object unlinks the file
//! without punching, so a reader that already has it open (the kernel, in passthrough) keeps
//! seeing complete bytes. Usage is accounted in page bytes (not allocated blocks).
//!
//! This module holds the tier's files and index; the decisions (which tier, what to evict,
//! when to compact) live in the store, which owns the object table the keys refer to.

use std::collections::{HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use silt_common::bufpool::{self, ALIGN};
use silt_common::{private, Error, ObjectId, Result};
use tracing::{debug, info, warn};

use crate::policy::{EvictionPolicy, Handle, PolicyKey};
use crate::{page_count, page_len};

pub(crate) const RECORD_LEN: usize = 56;
const FORMAT_VERSION: u32 = 1;
const HEADER_FILE: &str = "silt-tier";
const HEADER_TMP: &str = "silt-tier.tmp";
const HEADER_MAGIC: &str = "silt page store tier";
const JOURNAL_FILE: &str = "journal";
/// Present only between a clean shutdown (data synced) and the next open.
const CLEAN_FILE: &str = "clean-shutdown";
/// The boot (`/proc/sys/kernel/random/boot_id`) the running process opened the tier in, while
/// its journal is complete. After the process dies within the same boot, every write it
/// completed is in the OS page cache, pages before their journal records, so a recovered page
/// cannot be torn: only a reboot (or a failed journal append, which removes the file) makes
/// recovered pages suspect.
const BOOT_FILE: &str = "boot-id";

fn current_boot_id() -> Option<String> {
    fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}
const JOURNAL_TMP: &str = "journal.tmp";
const OBJECTS_DIR: &str = "objects";
const DATA_SUFFIX: &str = ".data";

/// Slots of `DiskTier::files`.
const WRITE: usize = 0;
const PUNCH: usize = 1;

/// `DiskPage::handle` of a page whose data is still being written: not readable, not
/// evictable, but its bytes are already counted against the quota.
pub(crate) const PENDING: Handle = u32::MAX;

/// Present when an unseal record could not be made durable: the next open trusts no seal.
const NO_SEALS_FILE: &str = "no-seals";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RecordKind {
    Put,
    RemovePage,
    RemoveObject,
    /// The object's data file was durably written (fdatasync) with exactly the pages before
    /// this record: `index` is the page count, `crc` the crc32c of their crcs (see
    /// [`seal_crc`]). Any later record of the object undoes it.
    Seal,
}

impl RecordKind {
    fn code(self) -> u8 {
        match self {
            RecordKind::Put => 1,
            RecordKind::RemovePage => 2,
            RecordKind::RemoveObject => 3,
            RecordKind::Seal => 4,
        }
    }

    fn from_code(c: u8) -> Option<Self> {
        match c {
            1 => Some(RecordKind::Put),
            2 => Some(RecordKind::RemovePage),
            3 => Some(RecordKind::RemoveObject),
            4 => Some(RecordKind::Seal),
            _ => None,
        }
    }
}

/// One journal record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Record {
    pub kind: RecordKind,
    pub object: ObjectId,
    pub index: u64,
    pub len: u32,
    pub crc: u32,
    pub object_size: u64,
    pub page_size: u64,
}

fn le_u32(b: &[u8]) -> Option<u32> {
    Some(u32::from_le_bytes(b.try_into().ok()?))
}

fn le_u64(b: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(b.try_into().ok()?))
}

impl Record {
    pub fn encode(&self) -> [u8; RECORD_LEN] {
        let mut b = [0u8; RECORD_LEN];
        b[0] = self.kind.code();
        b[4..20].copy_from_slice(&self.object.0.to_le_bytes());
        b[20..28].copy_from_slice(&self.index.to_le_bytes());
        b[28..32].copy_from_slice(&self.len.to_le_bytes());
        b[32..36].copy_from_slice(&self.crc.to_le_bytes());
        b[36..44].copy_from_slice(&self.object_size.to_le_bytes());
        b[44..52].copy_from_slice(&self.page_size.to_le_bytes());
        let sum = crc32c::crc32c(&b[..52]);
        b[52..56].copy_from_slice(&sum.to_le_bytes());
        b
    }

    /// `None` for anything that is not an intact record.
    pub fn decode(b: &[u8; RECORD_LEN]) -> Option<Record> {
        if crc32c::crc32c(&b[..52]) != le_u32(&b[52..56])? || b[1..4] != [0, 0, 0] {
            return None;
        }
        Some(Record {
            kind: RecordKind::from_code(b[0])?,
            object: ObjectId(u128::from_le_bytes(b[4..20].try_into().ok()?)),
            index: le_u64(&b[20..28])?,
            len: le_u32(&b[28..32])?,
            crc: le_u32(&b[32..36])?,
            object_size: le_u64(&b[36..44])?,
            page_size: le_u64(&b[44..52])?,
        })
    }
}

/// Per-page index entry of a disk tier: 8 bytes (16 with its key in the map).
#[derive(Clone, Copy, Debug)]
pub(crate) struct DiskPage {
    pub crc: u32,
    /// Policy handle, or [`PENDING`].
    pub handle: Handle,
}

/// A page found live when the tier was opened, in eviction order (oldest first).
#[derive(Clone, Copy, Debug)]
pub(crate) struct RecoveredPage {
    pub object: ObjectId,
    pub object_size: u64,
    pub index: u32,
    pub crc: u32,
    /// The object was sealed: its data file holds every page durably as journaled, so it can
    /// be trusted without reading it back even after a crash.
    pub sealed: bool,
}

struct Journal {
    file: File,
    records: u64,
    /// An append failed: the journal may have lost a record, so it may not be trusted after a
    /// clean shutdown (see [`DiskTier::mark_clean`]).
    failed: bool,
    /// The tier's [`BOOT_FILE`], removed when an append fails (nor after a crash, then).
    boot_file: Option<PathBuf>,
}

impl Journal {
    fn open_append(path: &Path) -> io::Result<Journal> {
        let file = private::options().create(true).append(true).open(path)?;
        let records = file.metadata()?.len() / RECORD_LEN as u64;
        Ok(Journal {
            file,
            records,
            failed: false,
            boot_file: None,
        })
    }

    /// The journal may have lost a record: no restart may trust it without reading pages back.
    fn distrust(&mut self) {
        self.failed = true;
        if let Some(p) = self.boot_file.take() {
            let _ = fs::remove_file(p);
        }
    }

    fn append(&mut self, rec: &Record) -> io::Result<()> {
        if let Err(e) = self.file.write_all(&rec.encode()) {
            self.distrust();
            // Cut a partial record off so later appends stay aligned and readable.
            let _ = self.file.set_len(self.records * RECORD_LEN as u64);
            return Err(e);
        }
        self.records += 1;
        Ok(())
    }
}

/// Writes a complete new journal next to the old one; `finish` makes it durable and renames
/// it into place, so a crash leaves either the old or the new journal, never a mix.
struct JournalWriter {
    dir: PathBuf,
    out: BufWriter<File>,
    records: u64,
}

impl JournalWriter {
    fn create(dir: &Path) -> io::Result<Self> {
        let file = private::create(&dir.join(JOURNAL_TMP))?;
        Ok(JournalWriter {
            dir: dir.to_path_buf(),
            out: BufWriter::with_capacity(1 << 20, file),
            records: 0,
        })
    }

    fn push(&mut self, rec: &Record) -> io::Result<()> {
        self.out.write_all(&rec.encode())?;
        self.records += 1;
        Ok(())
    }

    fn finish(self) -> io::Result<Journal> {
        let file = self.out.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        drop(file);
        let path = self.dir.join(JOURNAL_FILE);
        fs::rename(self.dir.join(JOURNAL_TMP), &path)?;
        sync_dir(&self.dir);
        let j = Journal::open_append(&path)?;
        debug_assert_eq!(j.records, self.records);
        Ok(j)
    }
}

fn sync_dir(dir: &Path) {
    // Best effort: makes the rename durable; some filesystems refuse fsync on directories.
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

/// Flushes everything of the file system holding `f` (data and metadata) to stable storage.
fn sync_fs(f: &File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: plain syscall on a file descriptor we own for the duration of the call.
    if unsafe { libc::syncfs(f.as_raw_fd()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Records `boot` as the boot the tier's journal is complete in; the file's path, or `None`
/// if it could not be written (then a crash restart reads pages back).
fn write_boot_file(dir: &Path, boot: Option<&str>) -> Option<PathBuf> {
    let boot = boot?;
    let (tmp, path) = (dir.join("boot-id.tmp"), dir.join(BOOT_FILE));
    // No fsync: the file only speaks for this boot, whose page cache holds it.
    private::write(&tmp, boot)
        .and_then(|()| fs::rename(&tmp, &path))
        .ok()?;
    Some(path)
}

/// Makes changes to `dir`'s entries durable, or fails: fsync on the directory, or where the
/// file system refuses that, a `syncfs`.
fn sync_dir_strict(dir: &Path) -> io::Result<()> {
    let d = File::open(dir)?;
    d.sync_all().or_else(|_| sync_fs(&d))
}

/// Frees the blocks of `[offset, offset + len)`, keeping the file size; afterwards the range
/// reads as zeros. An error where the file system (or platform) cannot.
pub(crate) fn punch_hole(f: &File, offset: u64, len: u64) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let (Ok(off), Ok(n)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        };
        // SAFETY: a plain syscall on a descriptor that `f` keeps open for the call.
        let rc = unsafe {
            libc::fallocate(
                f.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                off,
                n,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (f, offset, len);
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }
}

/// Reads one page's bytes; a file that is too short is an error (the caller treats it like
/// a checksum mismatch). A whole page lands in a pooled buffer (reused, not a fresh zeroed
/// allocation).
pub(crate) fn read_page(
    path: &Path,
    offset: u64,
    len: usize,
    page_size: u64,
) -> io::Result<bytes::Bytes> {
    let file = File::open(path)?;
    // Only whole pages: a pool per short length would never be reused.
    let pool = (len as u64 == page_size)
        .then(|| bufpool::BufferPool::for_size(len))
        .flatten();
    if let Some(pool) = pool {
        let mut buf = pool.take();
        file.read_exact_at(&mut buf.as_mut_slice()[..len], offset)?;
        return Ok(buf.freeze(len));
    }
    let mut buf = vec![0u8; len];
    file.read_exact_at(&mut buf, offset)?;
    Ok(buf.into())
}

/// Writes one page's bytes into a data file opened by [`DiskTier::data_file`].
///
/// While `direct` holds (the `disk_direct_io` option, per tier), a whole page in an aligned
/// buffer (a pooled fetch buffer, see `silt_common::bufpool`) is written with `O_DIRECT`
/// through a second handle on the same open file (`/proc/self/fd`, so it is the same file
/// even if its path was unlinked or replaced since): the bytes go from the buffer to the
/// device without being copied into the page cache, which on a cold read cost more CPU than
/// anything else the daemon did (docs/benchmarks.md, issue 18). Anything else is written
/// through the page cache, and so is everything after the tier's file system refused
/// `O_DIRECT` once (`direct` is cleared).
pub(crate) fn write_page(
    file: &File,
    offset: u64,
    data: &[u8],
    direct: &AtomicBool,
) -> io::Result<()> {
    if direct.load(Ordering::Relaxed)
        && offset.is_multiple_of(ALIGN as u64)
        && bufpool::is_aligned(data)
    {
        let written = OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(format!("/proc/self/fd/{}", file.as_raw_fd()))
            .and_then(|d| d.write_all_at(data, offset));
        match written {
            Ok(()) => {
                silt_common::metrics::DISK_DIRECT_WRITES.inc();
                return Ok(());
            }
            // The open refused (EINVAL: the file system has no O_DIRECT), or the write wants
            // another alignment: the page cache will do, from now on.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                debug!(error = %e, "O_DIRECT refused; cache pages written through the page cache");
                direct.store(false, Ordering::Relaxed);
            }
            Err(e) => return Err(e),
        }
    }
    file.write_all_at(data, offset)
}

/// The relative path of an object's data file.
fn data_rel_path(object: ObjectId) -> PathBuf {
    let hex = object.to_hex();
    let mut p = PathBuf::from(OBJECTS_DIR);
    p.push(&hex[..2]);
    p.push(format!("{hex}{DATA_SUFFIX}"));
    p
}

pub(crate) struct DiskTier {
    pub name: String,
    pub dir: PathBuf,
    /// The quota in force: `configured`, or less when the file system holds less.
    pub quota: u64,
    /// The quota the configuration gives.
    pub configured: u64,
    /// When the file system's free space was last asked, `used` then, and the reserve.
    space_checked: Option<(std::time::Instant, u64, u64)>,
    /// Bytes of all indexed pages, pending ones included.
    pub used: u64,
    pub pages: HashMap<PolicyKey, DiskPage>,
    pub policy: Box<dyn EvictionPolicy>,
    page_size: u64,
    journal: Journal,
    /// Data files open for writing: the one written last ([`WRITE`]) and the one punched last
    /// ([`PUNCH`]); puts and evictions each tend to come in runs of one object's pages. Always
    /// the files now at the objects' paths: dropped when such a file is removed.
    files: [Option<(ObjectId, Arc<File>)>; 2],
    /// Objects whose seal a removal record undid without a journal sync (see
    /// [`DiskTier::unsealed_lazily`]).
    unsynced_unseals: HashSet<ObjectId>,
    /// Journal length at the last failed compaction, so a failing disk is not retried on
    /// every operation.
    compact_failed_at: u64,
    /// Every page this run holds is trusted (none recovered suspect after a reboot): a
    /// complete journal may then vouch for them at a restart within this boot.
    boot_trusted: bool,
}

struct ReplayObject {
    size: u64,
    /// index → (sequence number of its put record, data crc)
    pages: HashMap<u32, (u64, u32)>,
    /// A seal record matched the pages and no record of the object followed it.
    sealed: bool,
}

impl ReplayObject {
    fn crcs_in_order(&self, page_size: u64) -> Option<Vec<u32>> {
        (0..page_count(self.size, page_size))
            .map(|i| self.pages.get(&u32::try_from(i).ok()?).map(|p| p.1))
            .collect()
    }
}

/// What a seal record's `crc` holds: the crc32c of the pages' crcs (little endian, in page
/// order), so a seal only ever matches the exact pages it was written for.
pub(crate) fn seal_crc(crcs: &[u32]) -> u32 {
    let bytes: Vec<u8> = crcs.iter().flat_map(|c| c.to_le_bytes()).collect();
    crc32c::crc32c(&bytes)
}

impl DiskTier {
    /// Opens (creating if needed) and recovers the tier in `dir`. Returns the live pages in
    /// eviction order (the caller inserts them into `pages` and the policy) and whether the
    /// last run ended with a clean shutdown ([`DiskTier::mark_clean`]): only then may the
    /// recovered pages be trusted without reading them back.
    pub fn open(
        name: String,
        dir: &Path,
        quota: u64,
        page_size: u64,
        policy: Box<dyn EvictionPolicy>,
    ) -> Result<(DiskTier, Vec<RecoveredPage>, bool)> {
        private::create_dir(dir)
            .map_err(|e| Error::from(e).context(format!("creating disk tier {}", dir.display())))?;
        let ctx =
            |e: io::Error| Error::from(e).context(format!("opening disk tier {}", dir.display()));
        // Remove the marker durably before anything is written, so a crash of this run is
        // never mistaken for a clean shutdown.
        let was_clean = fs::remove_file(dir.join(CLEAN_FILE)).is_ok();
        if was_clean {
            sync_dir_strict(dir).map_err(ctx)?;
        }
        // The last run's process died (or stopped) within this boot, its journal complete:
        // as trustworthy as a clean shutdown. The file is consumed here and written again
        // once this run's journal is rebuilt.
        let boot = current_boot_id();
        let same_boot = boot.is_some()
            && fs::read_to_string(dir.join(BOOT_FILE))
                .ok()
                .map(|s| s.trim().to_string())
                == boot;
        let _ = fs::remove_file(dir.join(BOOT_FILE));
        check_header(dir, page_size).map_err(ctx)?;
        private::create_dir(&dir.join(OBJECTS_DIR)).map_err(ctx)?;
        let mut objects = replay(&dir.join(JOURNAL_FILE), page_size).map_err(ctx)?;
        check_data_files(dir, page_size, &mut objects);
        remove_orphan_files(dir, &objects);

        // An unseal that could not be made durable: no seal in this journal can be trusted.
        // The journal is rewritten below without seals; the store records the ones it trusts
        // again after it (`journal_seal`), then removes the marker (`clear_no_seals`).
        let seals_void = dir.join(NO_SEALS_FILE).exists();
        for obj in objects.values_mut() {
            let complete = obj.pages.len() as u64 == page_count(obj.size, page_size);
            // After a clean shutdown every byte was synced before the marker was written, so
            // complete objects can be sealed now without another fdatasync.
            obj.sealed = complete && !seals_void && (obj.sealed || was_clean);
        }

        let mut live: Vec<(u64, RecoveredPage)> = Vec::new();
        for (&object, obj) in &objects {
            for (&index, &(seq, crc)) in &obj.pages {
                live.push((
                    seq,
                    RecoveredPage {
                        object,
                        object_size: obj.size,
                        index,
                        crc,
                        sealed: obj.sealed,
                    },
                ));
            }
        }
        live.sort_unstable_by_key(|p| p.0);
        let live: Vec<RecoveredPage> = live.into_iter().map(|p| p.1).collect();

        let mut w = JournalWriter::create(dir).map_err(ctx)?;
        for p in &live {
            w.push(&put_record(
                p.object,
                p.index,
                p.crc,
                p.object_size,
                page_size,
            ))
            .map_err(ctx)?;
        }
        let mut journal = w.finish().map_err(ctx)?;
        // Pages recovered after a reboot stay suspect until read back: until then a crash of
        // this run must not make them look trusted, so no boot is recorded.
        let trusted = was_clean || same_boot || live.is_empty();
        if trusted {
            journal.boot_file = write_boot_file(dir, boot.as_deref());
        }
        info!(
            tier = %name,
            dir = %dir.display(),
            pages = live.len(),
            objects = objects.len(),
            "disk tier recovered"
        );
        Ok((
            DiskTier {
                name,
                dir: dir.to_path_buf(),
                quota,
                configured: quota,
                space_checked: None,
                used: 0,
                pages: HashMap::new(),
                policy,
                unsynced_unseals: HashSet::new(),
                page_size,
                journal,
                files: [None, None],
                compact_failed_at: 0,
                boot_trusted: trusted,
            },
            live,
            was_clean || same_boot,
        ))
    }

    /// Sets `quota` to the smaller of `configured` and what the file system can hold for the
    /// tier (its pages plus the free space, less the reserve). Asks the file system at most
    /// once a second, or sooner once a quarter of the reserve was added since (so pages alone
    /// never fill it), or whenever `force`d.
    pub fn refresh_quota(&mut self, force: bool) {
        if let Some((at, used, reserve)) = self.space_checked {
            let grown = self.used.saturating_sub(used) >= reserve / 4;
            if !force && !grown && at.elapsed() < std::time::Duration::from_secs(1) {
                return;
            }
        }
        let Some((total, avail)) = fs_space(&self.dir) else {
            self.quota = self.configured;
            return;
        };
        self.space_checked = Some((std::time::Instant::now(), self.used, space_reserve(total)));
        let holds = self
            .used
            .saturating_add(avail)
            .saturating_sub(space_reserve(total));
        let quota = self.configured.min(holds);
        if quota != self.quota {
            debug!(tier = %self.name, quota, configured = self.configured, "disk tier quota follows its file system's free space");
        }
        self.quota = quota;
    }

    /// Makes every page and the journal durable (one `syncfs` for the tier's file system),
    /// then records a clean shutdown. Called when the store closes.
    /// Refused while the journal may have lost a record since it was last rewritten.
    pub fn mark_clean(&self) -> io::Result<()> {
        if self.journal.failed {
            return Err(io::Error::other("the cache journal missed records"));
        }
        self.journal.file.sync_data()?;
        sync_fs(&File::open(&self.dir)?)?;
        private::create(&self.dir.join(CLEAN_FILE))?.sync_all()?;
        sync_dir_strict(&self.dir)
    }

    pub fn data_path(&self, object: ObjectId) -> PathBuf {
        self.dir.join(data_rel_path(object))
    }

    /// Creates an empty (all-hole) data file of the object's size and returns it. A leftover
    /// file at the path is unlinked first, never truncated: a write still in flight into it
    /// must not land in the new file.
    pub fn create_data_file(&mut self, object: ObjectId, size: u64) -> io::Result<Arc<File>> {
        if self.unsynced_unseals.contains(&object) && !self.unseal_durably() {
            return Err(io::Error::other(
                "cannot make the removal of a sealed object durable",
            ));
        }
        let path = self.data_path(object);
        if let Some(parent) = path.parent() {
            private::create_dir(parent)?;
        }
        let create = || private::options().write(true).create_new(true).open(&path);
        let file = match create() {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                self.remove_data_file(object);
                create()?
            }
            r => r?,
        };
        file.set_len(size)?;
        let file = Arc::new(file);
        self.files[WRITE] = Some((object, file.clone()));
        Ok(file)
    }

    /// The object's current data file, open for writing. Called under the store's lock, so
    /// the handle is the file the index describes, even if it is unlinked later.
    pub fn data_file(&mut self, object: ObjectId) -> io::Result<Arc<File>> {
        self.cached_file(object, WRITE)
    }

    fn cached_file(&mut self, object: ObjectId, role: usize) -> io::Result<Arc<File>> {
        let cached = self.files.iter().flatten().find(|(o, _)| *o == object);
        let f = match cached {
            Some((_, f)) => f.clone(),
            None => Arc::new(
                OpenOptions::new()
                    .write(true)
                    .open(self.data_path(object))?,
            ),
        };
        self.files[role] = Some((object, f.clone()));
        Ok(f)
    }

    pub fn remove_data_file(&mut self, object: ObjectId) {
        for f in &mut self.files {
            if f.as_ref().is_some_and(|(o, _)| *o == object) {
                *f = None;
            }
        }
        let path = self.data_path(object);
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                silt_common::warn_limited!(
                    per: &self.name,
                    "cannot delete cache data file",
                    path = %path.display(),
                    error = %e
                )
            }
        }
    }

    /// Frees one page's bytes. Failure only costs space: the page is already unindexed.
    pub fn punch(&mut self, object: ObjectId, index: u32, len: u64) {
        let offset = u64::from(index) * self.page_size;
        let f = match self.cached_file(object, PUNCH) {
            Ok(f) => f,
            Err(e) => {
                debug!(object = %object, error = %e, "cannot open data file to punch a hole");
                return;
            }
        };
        if let Err(e) = punch_hole(&f, offset, len) {
            debug!(object = %object, error = %e, "cannot punch a hole; space is not reclaimed");
        }
    }

    pub fn journal_put(
        &mut self,
        object: ObjectId,
        index: u32,
        crc: u32,
        object_size: u64,
    ) -> io::Result<()> {
        let rec = put_record(object, index, crc, object_size, self.page_size);
        self.journal.append(&rec)
    }

    pub fn journal_remove_page(&mut self, object: ObjectId, index: u32, object_size: u64) {
        let rec = Record {
            kind: RecordKind::RemovePage,
            object,
            index: u64::from(index),
            len: 0,
            crc: 0,
            object_size,
            page_size: self.page_size,
        };
        self.append_removal(&rec);
    }

    pub fn journal_remove_object(&mut self, object: ObjectId, object_size: u64) {
        let rec = Record {
            kind: RecordKind::RemoveObject,
            object,
            index: 0,
            len: 0,
            crc: 0,
            object_size,
            page_size: self.page_size,
        };
        self.append_removal(&rec);
    }

    /// Records that the object's data file holds exactly the pages with `crcs`, durably. The
    /// caller fdatasynced the file after the last of those pages was written.
    pub fn journal_seal(
        &mut self,
        object: ObjectId,
        object_size: u64,
        crcs: &[u32],
    ) -> io::Result<()> {
        let rec = seal_record(object, object_size, self.page_size, crcs);
        self.journal.append(&rec)
    }

    /// Makes the records appended so far durable before a sealed object's data file is
    /// changed (a removal record that a power loss drops would leave its seal standing over
    /// punched bytes). Where that fails, a marker makes the next open trust no seal.
    /// `false` if neither could be made durable: then the file must not be changed in place.
    /// Covers the objects noted by [`DiskTier::unsealed_lazily`] too.
    pub fn unseal_durably(&mut self) -> bool {
        self.unsynced_unseals.clear();
        let r = if self.journal.failed {
            Err(io::Error::other("the cache journal missed records"))
        } else {
            self.journal.file.sync_data()
        };
        if let Err(e) = r {
            warn!(tier = %self.name, error = %e, "cannot sync the cache journal; no seal will be trusted after a restart");
            let marker = self.dir.join(NO_SEALS_FILE);
            if let Err(e) = private::create(&marker)
                .and_then(|f| f.sync_all())
                .and_then(|_| sync_dir_strict(&self.dir))
            {
                warn!(tier = %self.name, error = %e, "cannot record that seals are void");
                return false;
            }
        }
        true
    }

    /// Removes the `no-seals` marker once the journal holds no seal from before it (the open
    /// rewrote it without any; seals appended since are new).
    pub fn clear_no_seals(&self) -> io::Result<()> {
        match fs::remove_file(self.dir.join(NO_SEALS_FILE)) {
            Ok(()) => sync_dir_strict(&self.dir),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// A sealed object's removal record was appended but not synced, and its file unlinked.
    /// Harmless until a new file is created for the object: a power loss could then keep the
    /// new file and lose the record, reviving the seal over it, so that creation syncs first.
    pub fn unsealed_lazily(&mut self, object: ObjectId) {
        self.unsynced_unseals.insert(object);
    }

    fn append_removal(&mut self, rec: &Record) {
        // A lost removal record is harmless: the bytes are punched or deleted already, so
        // after a restart the page fails its checksum (or misses its file) and is dropped.
        if let Err(e) = self.journal.append(rec) {
            silt_common::warn_limited!(
                per: &self.name,
                "cannot append a removal to the cache journal",
                tier = %self.name,
                error = %e
            );
        }
    }

    /// Whether the journal has grown enough past the live set to be worth rewriting.
    pub fn wants_compaction(&self) -> bool {
        let slack = 65_536;
        self.journal.records > 2 * self.policy.len() as u64 + slack
            && self.journal.records > self.compact_failed_at + slack
    }

    /// Rewrites the journal with one put record per committed page, in eviction order.
    /// `resolve` maps a key to its object, object size and page index.
    pub fn compact(
        &mut self,
        resolve: &dyn Fn(PolicyKey) -> Option<(ObjectId, u64, u32)>,
    ) -> io::Result<()> {
        let r = self.try_compact(resolve);
        if r.is_err() {
            // The rename may have happened, leaving `journal` a handle to the replaced file.
            self.journal.distrust();
            self.compact_failed_at = self.journal.records;
            let _ = fs::remove_file(self.dir.join(JOURNAL_TMP));
        }

        // A new journal is durable and holds no seal at all.
        if r.is_ok() {
            self.unsynced_unseals.clear();
        }
        r
    }

    fn try_compact(
        &mut self,
        resolve: &dyn Fn(PolicyKey) -> Option<(ObjectId, u64, u32)>,
    ) -> io::Result<()> {
        let mut w = JournalWriter::create(&self.dir)?;
        let mut err = None;
        let (pages, page_size) = (&self.pages, self.page_size);
        self.policy.for_each(&mut |key| {
            if err.is_some() {
                return;
            }
            let (Some(page), Some((object, size, index))) = (pages.get(&key), resolve(key)) else {
                return;
            };
            if let Err(e) = w.push(&put_record(object, index, page.crc, size, page_size)) {
                err = Some(e);
            }
        });
        if let Some(e) = err {
            return Err(e);
        }
        let before = self.journal.records;
        self.journal = w.finish()?;
        // The journal is complete again.
        if self.boot_trusted {
            self.journal.boot_file = write_boot_file(&self.dir, current_boot_id().as_deref());
        }
        debug!(tier = %self.name, before, after = self.journal.records, "compacted cache journal");
        Ok(())
    }
}

fn seal_record(object: ObjectId, object_size: u64, page_size: u64, crcs: &[u32]) -> Record {
    Record {
        kind: RecordKind::Seal,
        object,
        index: crcs.len() as u64,
        len: 0,
        crc: seal_crc(crcs),
        object_size,
        page_size,
    }
}

fn put_record(object: ObjectId, index: u32, crc: u32, object_size: u64, page_size: u64) -> Record {
    let len = page_len(u64::from(index), object_size, page_size).unwrap_or(0);
    Record {
        kind: RecordKind::Put,
        object,
        index: u64::from(index),
        len: u32::try_from(len).unwrap_or(u32::MAX),
        crc,
        object_size,
        page_size,
    }
}

pub(crate) fn header_text(page_size: u64) -> String {
    format!("{HEADER_MAGIC}\nformat {FORMAT_VERSION}\npage_size {page_size}\n")
}

/// `Some((format, page_size))` if the header parses.
fn parse_header(text: &str) -> Option<(u32, u64)> {
    let mut lines = text.lines();
    if lines.next()? != HEADER_MAGIC {
        return None;
    }
    let mut format = None;
    let mut page_size = None;
    for line in lines {
        match line.split_once(' ') {
            Some(("format", v)) => format = v.trim().parse().ok(),
            Some(("page_size", v)) => page_size = v.trim().parse().ok(),
            _ => {}
        }
    }
    Some((format?, page_size?))
}

/// Wipes the tier unless its header matches this format and page size, then (re)writes it.
fn check_header(dir: &Path, page_size: u64) -> io::Result<()> {
    let path = dir.join(HEADER_FILE);
    let wipe_reason = match fs::read_to_string(&path) {
        Ok(text) => match parse_header(&text) {
            Some((FORMAT_VERSION, ps)) if ps == page_size => return Ok(()),
            Some((FORMAT_VERSION, ps)) => {
                Some(format!("page size changed from {ps} to {page_size}"))
            }
            Some((v, _)) => Some(format!("unknown tier format {v}")),
            None => Some("unreadable tier header".to_string()),
        },
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let has_data = dir.join(JOURNAL_FILE).exists() || dir.join(OBJECTS_DIR).exists();
            has_data.then(|| "tier header missing".to_string())
        }
        Err(e) => return Err(e),
    };
    if let Some(reason) = wipe_reason {
        info!(dir = %dir.display(), %reason, "wiping disk cache tier: its pages cannot be reused");
        for f in [JOURNAL_FILE, JOURNAL_TMP] {
            match fs::remove_file(dir.join(f)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        match fs::remove_dir_all(dir.join(OBJECTS_DIR)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    // Written after the wipe: a crash in between leaves the old header, so we wipe again.
    let tmp = dir.join(HEADER_TMP);
    {
        let mut f = private::create(&tmp)?;
        f.write_all(header_text(page_size).as_bytes())?;
        f.sync_all()?;
    }
    fs::rename(&tmp, &path)?;
    sync_dir(dir);
    Ok(())
}

/// Replays the journal up to its first invalid record.
fn replay(path: &Path, page_size: u64) -> io::Result<HashMap<ObjectId, ReplayObject>> {
    let mut objects: HashMap<ObjectId, ReplayObject> = HashMap::new();
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(objects),
        Err(e) => return Err(e),
    };
    let total = file.metadata()?.len();
    let mut r = BufReader::with_capacity(1 << 20, file);
    let mut buf = [0u8; RECORD_LEN];
    let mut good: u64 = 0;
    let mut skipped: u64 = 0;
    loop {
        match r.read_exact(&mut buf) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break,
            Err(e) => return Err(e),
        }
        let Some(rec) = Record::decode(&buf) else {
            break;
        };
        let seq = good;
        good += 1;
        match rec.kind {
            RecordKind::Put => {
                let expected = page_len(rec.index, rec.object_size, page_size);
                let index = u32::try_from(rec.index).ok();
                let (Some(index), true, true) = (
                    index,
                    rec.page_size == page_size,
                    expected == Some(u64::from(rec.len)),
                ) else {
                    skipped += 1;
                    continue;
                };
                let obj = objects.entry(rec.object).or_insert_with(|| ReplayObject {
                    size: rec.object_size,
                    pages: HashMap::new(),
                    sealed: false,
                });
                obj.sealed = false;
                if obj.size != rec.object_size {
                    // One content fingerprint, two sizes: trust neither.
                    obj.size = rec.object_size;
                    obj.pages.clear();
                }
                obj.pages.insert(index, (seq, rec.crc));
            }
            RecordKind::RemovePage => {
                if let (Some(obj), Ok(index)) =
                    (objects.get_mut(&rec.object), u32::try_from(rec.index))
                {
                    obj.sealed = false;
                    obj.pages.remove(&index);
                    if obj.pages.is_empty() {
                        objects.remove(&rec.object);
                    }
                }
            }
            RecordKind::RemoveObject => {
                objects.remove(&rec.object);
            }
            RecordKind::Seal => {
                if let Some(obj) = objects.get_mut(&rec.object) {
                    let matches = rec.page_size == page_size
                        && rec.object_size == obj.size
                        && rec.index == page_count(obj.size, page_size)
                        && obj
                            .crcs_in_order(page_size)
                            .is_some_and(|c| seal_crc(&c) == rec.crc);
                    obj.sealed = matches;
                }
            }
        }
    }
    let ignored = total - good * RECORD_LEN as u64;
    if ignored > 0 {
        let level_warn = ignored >= 2 * RECORD_LEN as u64;
        if level_warn {
            warn!(journal = %path.display(), bytes = ignored, "ignoring invalid cache journal tail");
        } else {
            info!(journal = %path.display(), bytes = ignored, "ignoring torn cache journal tail");
        }
    }
    if skipped > 0 {
        warn!(journal = %path.display(), records = skipped, "ignored inconsistent cache journal records");
    }
    Ok(objects)
}

/// Drops objects whose data file is missing, and pages beyond a file that is too short;
/// restores each file's length to its object size and punches holes where no live page is.
fn check_data_files(dir: &Path, page_size: u64, objects: &mut HashMap<ObjectId, ReplayObject>) {
    objects.retain(|&object, obj| {
        let path = dir.join(data_rel_path(object));
        let Ok(meta) = fs::symlink_metadata(&path) else {
            debug!(object = %object, "cache data file missing; dropping its pages");
            return false;
        };
        if !meta.is_file() {
            return false;
        }
        let file_len = meta.len();
        if file_len < obj.size {
            obj.pages.retain(|&i, _| {
                let start = u64::from(i) * page_size;
                page_len(u64::from(i), obj.size, page_size).is_some_and(|l| start + l <= file_len)
            });
        }
        if obj.pages.is_empty() {
            let _ = fs::remove_file(&path);
            return false;
        }
        let file = match OpenOptions::new().write(true).open(&path) {
            Ok(f) => f,
            Err(e) => {
                warn!(path = %path.display(), error = %e, "cannot open cache data file; dropping its pages");
                return false;
            }
        };
        if file_len != obj.size {
            if let Err(e) = file.set_len(obj.size) {
                warn!(path = %path.display(), error = %e, "cannot resize cache data file; dropping its pages");
                return false;
            }
        }
        // Reclaim bytes of pages written but never journaled (crash between the two).
        let mut indices: Vec<u32> = obj.pages.keys().copied().collect();
        indices.sort_unstable();
        let mut next: u64 = 0;
        let total = page_count(obj.size, page_size);
        for i in indices.into_iter().map(u64::from).chain(std::iter::once(total)) {
            if i > next {
                let start = next * page_size;
                let end = (i * page_size).min(obj.size);
                let _ = punch_hole(&file, start, end - start);
            }
            next = i + 1;
        }
        true
    });
}

/// Deletes data files (and temporaries) that no live page refers to.
fn remove_orphan_files(dir: &Path, objects: &HashMap<ObjectId, ReplayObject>) {
    let root = dir.join(OBJECTS_DIR);
    let Ok(subdirs) = fs::read_dir(&root) else {
        return;
    };
    for sub in subdirs.flatten() {
        let Ok(entries) = fs::read_dir(sub.path()) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let live = name
                .to_str()
                .and_then(|n| n.strip_suffix(DATA_SUFFIX))
                .and_then(ObjectId::from_hex)
                .is_some_and(|id| objects.contains_key(&id));
            if !live {
                debug!(path = %entry.path().display(), "deleting orphan cache file");
                let _ = fs::remove_file(entry.path());
            }
        }
    }
}

/// Free space a disk tier leaves on a file system of `total` bytes for other writers.
pub(crate) fn space_reserve(total: u64) -> u64 {
    (total / 16).min(256 << 20)
}

/// (size, space available to this process) of the file system holding `dir`.
pub(crate) fn fs_space(dir: &Path) -> Option<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs writes into the struct passed; the path is a valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    let unit = st.f_frsize as u64;
    Some((
        (st.f_blocks as u64).saturating_mul(unit),
        (st.f_bavail as u64).saturating_mul(unit),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trips_and_detects_damage() {
        let r = Record {
            kind: RecordKind::Put,
            object: ObjectId(0x0123_4567_89ab_cdef_0011_2233_4455_6677),
            index: 9,
            len: 4096,
            crc: 0xdead_beef,
            object_size: 100_000,
            page_size: 4096,
        };
        let b = r.encode();
        assert_eq!(Record::decode(&b), Some(r));
        for i in 0..RECORD_LEN {
            let mut c = b;
            c[i] ^= 0x40;
            assert_eq!(Record::decode(&c), None, "flip in byte {i} went unnoticed");
        }
        assert_eq!(Record::decode(&[0u8; RECORD_LEN]), None);
    }

    #[test]
    fn header_parses_and_rejects() {
        assert_eq!(
            parse_header(&header_text(4096)),
            Some((FORMAT_VERSION, 4096))
        );
        assert_eq!(parse_header("something else\n"), None);
        assert_eq!(parse_header(&format!("{HEADER_MAGIC}\nformat 1\n")), None);
    }

    #[test]
    fn clean_shutdown_is_recorded_once_and_not_after_journal_failures() {
        let dir = tempfile::TempDir::new().unwrap();
        let open = || {
            let policy = crate::policy::new_policy("lru").unwrap();
            DiskTier::open("t".into(), dir.path(), 1 << 20, 4096, policy).unwrap()
        };
        // What a reboot changes: the boot id no longer matches the tier's.
        let reboot = || fs::remove_file(dir.path().join(BOOT_FILE)).unwrap();
        let (t, _, clean) = open();
        assert!(!clean, "a new tier has nothing to trust");
        t.mark_clean().unwrap();
        drop(t);
        reboot();
        let (t, _, clean) = open();
        assert!(clean, "a clean shutdown is trusted across a reboot");
        // Dropping a tier without mark_clean is a crash of the process: within the same
        // boot every completed write survives it, so the pages are trusted...
        drop(t);
        let (t, _, clean) = open();
        assert!(clean, "a process crash within the boot");
        // ... not after a reboot (the marker was consumed by open).
        drop(t);
        reboot();
        let (mut t, _, clean) = open();
        assert!(!clean, "a crash, then a reboot");
        // A failed journal append: neither a clean shutdown nor a crash may be trusted.
        t.journal.distrust();
        assert!(t.mark_clean().is_err());
        drop(t);
        let (_, _, clean) = open();
        assert!(!clean, "the journal lost a record");
    }

    #[test]
    fn data_files_fan_out_by_hex_prefix() {
        let id = ObjectId(0xab << 120);
        let p = data_rel_path(id);
        assert_eq!(p, PathBuf::from(format!("objects/ab/{}.data", id.to_hex())));
    }
}
