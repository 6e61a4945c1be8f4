//! The FUSE adapter: each kernel request mapped onto the file-system core,
//! `silt_client::fs::FileSystem` (inode numbers and their lookup counts, read and write
//! handles, the version each read handle sees, the local-file decision, the write rules,
//! name limits: see its contract), and the core's answers onto kernel replies.
//!
//! What only a kernel front end has, and so stays here:
//! - INIT: what is negotiated with the kernel (readdirplus, atomic `O_TRUNC`, read-ahead,
//!   shared maps of direct-I/O files, passthrough; `kernel.rs`); the mount is read-only when
//!   no path is writable;
//! - kernel caching: entry/attr TTLs and `FOPEN_KEEP_CACHE` / `FOPEN_DIRECT_IO` on the
//!   flags the core's `Opened` asks for; the invalidations the client's changes cause
//!   (`inval.rs`);
//! - passthrough: the backing files the kernel reads a local file through, registered and
//!   closed for the core (`kernel.rs`, the core's `Frontend`), and each open's mode recorded
//!   for `silt report`;
//! - the request's credentials: uid/gid, the process (thread group) and supplementary groups
//!   from `/proc`, read only by the calls that use them (`convert.rs`);
//! - mounting, unmounting and the takeover of a live mount (`mount.rs`, `takeover.rs`).
//!
//! Errors beside the core's: `RENAME_EXCHANGE` is `EINVAL`.

mod convert;
mod inval;
mod kernel;
mod mount;
pub mod takeover;

use std::ffi::OsStr;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fuser::{
    BsdFileFlags, Errno, FileHandle, FileType, FopenFlags, Generation, INodeNo, IoctlFlags,
    KernelConfig, OpenAccMode, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyOpen, ReplyStatfs,
    ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use silt_client::fs::{FileSystem, FsOptions, OpenedAs, SetAttr};
use silt_client::OpenOptions;
use silt_common::config::PassthroughMode;
use silt_common::metrics;
use silt_common::metrics::FuseOp;

use convert::{
    caller, errno, file_attr, file_type, owner, process_of, reply_attr, reply_empty, reply_entry,
    reply_xattr, time,
};
use kernel::Kernel;
pub use kernel::{FuseState, OpenRecord};
pub use mount::{check_mountpoint, mount, MountSetup, Mounted};

/// Mount options of the adapter (from `Config`).
#[derive(Debug, Clone)]
pub struct FuseOptions {
    pub attr_ttl: Duration,
    pub entry_ttl: Duration,
    pub threads: usize,
    pub max_read: u64,
    /// The first open of each version bypasses the kernel's page cache (`fuse_cold_direct_io`).
    pub cold_direct_io: bool,
    /// A read open of a file of at most this many bytes not yet whole on local disk fetches
    /// it whole first, then opens it in passthrough (`fuse_open_fill_max`; 0: never).
    pub open_fill_max: u64,
    /// A read open of a file not whole on local disk, from a store whose objects are files
    /// this host can open (`file://`), hands the kernel the store's own file and fills the
    /// cache behind the reader (`fuse_source_passthrough`).
    pub source_passthrough: bool,
    /// Answer getxattr and listxattr with the files' S3 headers (`fuse_xattrs`).
    pub xattrs: bool,
    pub passthrough: PassthroughMode,
    pub allow_other: bool,
}

impl FuseOptions {
    /// What the file-system core takes of them.
    fn core(&self) -> FsOptions {
        FsOptions {
            attr_ttl: self.attr_ttl,
            entry_ttl: self.entry_ttl,
            threads: self.threads,
            open_fill_max: self.open_fill_max,
            source_passthrough: self.source_passthrough,
        }
    }
}

/// The kernel's side of the mount: each request translated to the core, its answer back.
pub struct SiltFs {
    core: Arc<FileSystem>,
    opts: FuseOptions,
    state: Arc<FuseState>,
}

impl SiltFs {
    fn new(core: Arc<FileSystem>, opts: FuseOptions, state: Arc<FuseState>) -> Self {
        SiltFs { core, opts, state }
    }

    /// Has the kernel read directory `dir` again.
    fn reread(&self, dir: Option<String>) {
        if let (Some(dir), Some(queue)) = (dir, self.state.invalidations.get()) {
            queue.push_reread(dir);
        }
    }

    /// A commit (flush, fsync): a listing the kernel read while the file was being written
    /// may lack it.
    fn committed(&self, reply: ReplyEmpty, r: silt_common::Result<Option<String>>) {
        match r {
            Ok(dir) => {
                self.reread(dir);
                reply.ok()
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// The `user.s3.*` attributes of `ino`, with `fuse_xattrs` (see its help for why it is off
    /// by default).
    fn s3_xattrs(&self, ino: INodeNo) -> std::result::Result<Vec<(String, String)>, Errno> {
        if !self.opts.xattrs {
            return Err(Errno::ENOSYS);
        }
        self.core.s3_xattrs(ino.0).map_err(|e| errno(&e))
    }

    fn open_write(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let opts = OpenOptions {
            truncate: flags.0 & libc::O_TRUNC != 0,
            append: flags.0 & libc::O_APPEND != 0,
            ..Default::default()
        };
        match self.core.open_write(ino.0, process_of(req), opts) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(errno(&e)),
        }
    }
}

impl fuser::Filesystem for SiltFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        kernel::negotiate(&self.state, &self.opts, config)
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let _timer = FuseOp::Lookup.timer();
        reply_entry(reply, self.core.lookup(parent.0, name));
    }

    /// No ioctls: files here are not terminals or devices. Python's `open()` asks every file
    /// whether it is a terminal (TCGETS); answering ENOTTY ("not a terminal") is the truthful
    /// reply. The library default logs a warning per call: one per file opened from Python.
    #[allow(clippy::too_many_arguments)]
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        reply.error(Errno::ENOTTY);
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        // The parent's readdir cache still names the inode's number, which the next lookup
        // replaces: have the kernel read the parent again.
        if let Some(path) = self.core.forget(ino.0, nlookup) {
            let parent = silt_client::namespace::parent_and_name(&path).map(|(d, _)| d.into());
            self.reread(parent);
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let _timer = FuseOp::Getattr.timer();
        reply_attr(reply, self.core.getattr(ino.0, fh.map(|f| f.0)));
    }

    #[allow(clippy::too_many_arguments)]
    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let _timer = FuseOp::Setattr.timer();
        let set = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: time(atime),
            mtime: time(mtime),
        };
        reply_attr(
            reply,
            self.core
                .setattr(ino.0, fh.map(|f| f.0), || caller(req), &set),
        );
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let _timer = FuseOp::Open.timer();
        // `O_RDONLY|O_TRUNC` truncates too (the kernel sends O_TRUNC with the open).
        if flags.acc_mode() != OpenAccMode::O_RDONLY || flags.0 & libc::O_TRUNC != 0 {
            return self.open_write(req, ino, flags, reply);
        }
        let opened = match self.core.open_read(ino.0) {
            Ok(o) => o,
            Err(e) => {
                if e.kind() == silt_common::ErrorKind::Busy {
                    let path = self.core.path_of(ino.0).unwrap_or_default();
                    self.state.record(&path, "refused", &e.to_string());
                }
                return reply.error(errno(&e));
            }
        };
        let fh = FileHandle(opened.fh);
        match opened.how {
            OpenedAs::LocalFile {
                id,
                origin,
                filled,
                from_store,
            } => {
                if filled {
                    metrics::FUSE_OPENS_FILLED.inc();
                }
                if from_store {
                    metrics::FUSE_OPENS_SOURCE.inc();
                }
                metrics::FUSE_OPENS_PASSTHROUGH.inc();
                self.state.record(&opened.path, "passthrough", origin);
                // No KEEP_CACHE here: together with passthrough it makes open() fail (EIO).
                // SAFETY: `id` is open on this mount's connection (registered by this daemon
                // or one before it, logged) and is closed only by the core once no handle
                // uses it; `into_raw` keeps this wrapper from closing it.
                let id = unsafe { reply.wrap_backing(id) };
                reply.opened_passthrough(fh, FopenFlags::empty(), &id);
                let _ = id.into_raw();
            }
            OpenedAs::Core {
                keep_cache,
                new_version,
                reason,
            } => {
                metrics::FUSE_OPENS_DAEMON.inc();
                // The kernel holds no page of this version: this open's reads go straight to
                // the reader (no page-cache fill); the next open of it caches as usual.
                let direct = new_version && self.state.cold_direct_io.load(Ordering::Relaxed);
                let mode = if direct { "direct" } else { "daemon" };
                self.state.record(&opened.path, mode, reason);
                let flags = if direct {
                    FopenFlags::FOPEN_DIRECT_IO
                } else if keep_cache {
                    FopenFlags::FOPEN_KEEP_CACHE
                } else {
                    FopenFlags::empty()
                };
                reply.opened(fh, flags);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyData,
    ) {
        let _timer = FuseOp::Read.timer();
        match self.core.read(ino.0, fh.0, offset, size as u64) {
            Ok(bytes) => reply.data(&bytes),
            Err(e) => reply.error(errno(&e)),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let _timer = FuseOp::Release.timer();
        self.core.release(fh.0);
        reply.ok();
    }

    /// Every `close(2)` commits (see `FileSystem::flush` for a forked child's close).
    fn flush(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lock_owner: fuser::LockOwner,
        reply: ReplyEmpty,
    ) {
        let _timer = FuseOp::Flush.timer();
        self.committed(reply, self.core.flush(fh.0, || process_of(req)));
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let _timer = FuseOp::Fsync.timer();
        self.committed(reply, self.core.fsync(fh.0));
    }

    #[allow(clippy::too_many_arguments)]
    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyWrite,
    ) {
        let _timer = FuseOp::Write.timer();
        match self.core.write(fh.0, offset, data) {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// `open(O_CREAT)` of a name the kernel does not know: a new empty file (committed at
    /// close), or, if the store has the file after all, an open of it as `open` would.
    #[allow(clippy::too_many_arguments)]
    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let _timer = FuseOp::Create.timer();
        let opts = OpenOptions {
            exclusive: flags & libc::O_EXCL != 0,
            truncate: flags & libc::O_TRUNC != 0,
            append: flags & libc::O_APPEND != 0,
            ..Default::default()
        };
        let made = self
            .core
            .create(parent.0, name, owner(req), process_of(req), mode, opts);
        match made {
            Ok((a, fh)) => reply.created(
                &a.entry_ttl,
                &file_attr(&a.attr),
                Generation(0),
                FileHandle(fh),
                FopenFlags::empty(),
            ),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _timer = FuseOp::Unlink.timer();
        reply_empty(reply, self.core.unlink(parent.0, name));
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let _timer = FuseOp::Mkdir.timer();
        reply_entry(reply, self.core.mkdir(parent.0, name, owner(req), mode));
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let _timer = FuseOp::Symlink.timer();
        let made = self.core.symlink(parent.0, link_name, target, owner(req));
        reply_entry(reply, made);
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let _timer = FuseOp::Readlink.timer();
        match self.core.readlink(ino.0) {
            Ok(target) => reply.data(target.as_bytes()),
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// A file's S3 headers as `user.s3.*` attributes; any other name is `ENODATA`.
    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let _timer = FuseOp::Getxattr.timer();
        if !self.opts.xattrs {
            return reply.error(Errno::ENOSYS);
        }
        let Some(name) = name
            .to_str()
            .filter(|n| n.starts_with(silt_ufs::xattrs::PREFIX))
        else {
            return reply.error(Errno::ENODATA);
        };
        match self
            .s3_xattrs(ino)
            .map(|a| a.into_iter().find(|(k, _)| k == name))
        {
            Ok(Some((_, v))) => reply_xattr(reply, size, v.as_bytes()),
            Ok(None) => reply.error(Errno::ENODATA),
            Err(e) => reply.error(e),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let _timer = FuseOp::Listxattr.timer();
        match self.s3_xattrs(ino) {
            Ok(attrs) => {
                let mut names = Vec::new();
                for (k, _) in attrs {
                    names.extend_from_slice(k.as_bytes());
                    names.push(0);
                }
                reply_xattr(reply, size, &names)
            }
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _timer = FuseOp::Rmdir.timer();
        reply_empty(reply, self.core.rmdir(parent.0, name));
    }

    /// `rename(2)`/`renameat2(2)`: `RENAME_EXCHANGE` (no store can swap two names atomically)
    /// and `RENAME_WHITEOUT` are `EINVAL`.
    #[allow(clippy::too_many_arguments)]
    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let _timer = FuseOp::Rename.timer();
        if !(flags - RenameFlags::RENAME_NOREPLACE).is_empty() {
            return reply.error(Errno::EINVAL);
        }
        let noreplace = flags.contains(RenameFlags::RENAME_NOREPLACE);
        let renamed = self
            .core
            .rename(parent.0, name, newparent.0, newname, noreplace);
        reply_empty(reply, renamed);
    }

    /// `link(2)`: see `FileSystem::link`. The attributes of a file with several names are
    /// never cached by the kernel (TTL 0), so a change through one name shows through the
    /// others.
    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let _timer = FuseOp::Link.timer();
        let linked = self.core.link(ino.0, newparent.0, newname).inspect(|_| {
            // The kernel keeps the source's cached attributes, link count 1 included: drop
            // them before the reply (offset -1: attributes only, no page locks).
            if let Some(n) = self.state.notifier.get() {
                let _ = n.inval_inode(ino, -1, 0);
            }
        });
        reply_entry(reply, linked);
    }

    #[allow(clippy::too_many_arguments)]
    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let _timer = FuseOp::Mknod.timer();
        reply_entry(
            reply,
            self.core.mknod(parent.0, name, owner(req), mode, rdev),
        );
    }

    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // No directory handles: ENOSYS makes the kernel stop sending opendir/releasedir for
        // this mount and keep each directory's entries in its readdir cache (as if opened with
        // FOPEN_CACHE_DIR | FOPEN_KEEP_CACHE), so a second walk of an unchanged tree makes no
        // request at all. The cache stays true through the directory's mtime (`dir_mtime`)
        // and through notify invalidations when a listing changes.
        reply.error(Errno::ENOSYS);
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let _timer = FuseOp::Readdir.timer();
        let list = match self.core.listing(ino.0, offset) {
            Ok(l) => l,
            Err(e) => return reply.error(errno(&e)),
        };
        for i in offset..list.len() as u64 + 2 {
            let full = match i {
                0 => reply.add(ino, 1, FileType::Directory, "."),
                1 => reply.add(ino, 2, FileType::Directory, ".."),
                _ => {
                    let e = &list[(i - 2) as usize];
                    // Plain readdir is no lookup: a stable number without a reference.
                    let child = INodeNo(self.core.peek_ino(&e.path));
                    reply.add(child, i + 1, file_type(e.kind), e.name())
                }
            };
            if full {
                break;
            }
        }
        reply.ok();
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let _timer = FuseOp::Readdirplus.timer();
        let (list, dir) = match self
            .core
            .listing(ino.0, offset)
            .and_then(|l| Ok((l, self.core.getattr(ino.0, None)?)))
        {
            Ok(v) => v,
            Err(e) => return reply.error(errno(&e)),
        };
        let dir_attr = file_attr(&dir.attr);
        for i in offset..list.len() as u64 + 2 {
            let full = match i {
                // The kernel takes no lookup reference for "." and "..".
                0 => reply.add(ino, 1, ".", &dir.entry_ttl, &dir_attr, Generation(0)),
                1 => reply.add(ino, 2, "..", &dir.entry_ttl, &dir_attr, Generation(0)),
                _ => {
                    let e = &list[(i - 2) as usize];
                    let (attr, ttl, child) = self.core.listed(e);
                    let attr = file_attr(&attr);
                    let full =
                        reply.add(INodeNo(child), i + 1, e.name(), &ttl, &attr, Generation(0));
                    if full {
                        // Every entry the kernel receives counts as one lookup; not this one.
                        self.core.not_handed_on(child);
                    }
                    full
                }
            };
            if full {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let _timer = FuseOp::Statfs.timer();
        let (cap, free, files) = self.core.statfs();
        const BS: u64 = 4096;
        let name_max = silt_client::fs::NAME_MAX as u32;
        reply.statfs(
            cap / BS,
            free / BS,
            free / BS,
            files,
            0,
            BS as u32,
            name_max,
            BS as u32,
        );
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: fuser::AccessFlags, reply: ReplyEmpty) {
        let _timer = FuseOp::Access.timer();
        if mask.contains(fuser::AccessFlags::W_OK) {
            return reply_empty(reply, self.core.check_writable(ino.0));
        }
        reply.ok()
    }
}
