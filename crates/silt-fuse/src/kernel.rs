//! What the adapter keeps of the kernel beside the core: the record of how opens were
//! served and whether passthrough was negotiated (`FuseState`, shared with the control
//! server), and the `Frontend` the core asks for passthrough backings (`Kernel`).

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use fuser::BackingId;
use parking_lot::Mutex;
use silt_client::fs::Frontend;
use silt_common::config::PassthroughMode;

use fuser::{InitFlags, KernelConfig};

use crate::inval::InvalQueue;
use crate::FuseOptions;

/// How one open was served.
#[derive(Debug, Clone, serde::Serialize)]
pub struct OpenRecord {
    pub path: String,
    pub mode: &'static str,
    pub reason: String,
}

/// What the adapter reports (shared with the control server).
#[derive(Default)]
pub struct FuseState {
    /// Whether the kernel offered passthrough in FUSE_INIT.
    pub kernel_passthrough: AtomicBool,
    /// Whether passthrough is in use (offered and not disabled).
    pub passthrough_enabled: AtomicBool,
    /// Whether first opens bypass the page cache (asked for, and the kernel lets such files
    /// be mapped shared: `FUSE_DIRECT_IO_ALLOW_MMAP`).
    pub cold_direct_io: AtomicBool,
    pub recent_opens: Mutex<VecDeque<OpenRecord>>,
    /// Kernel invalidations queued for the invalidation thread (set when mounted).
    pub(crate) invalidations: std::sync::OnceLock<Arc<InvalQueue>>,
    /// The kernel's notification channel (set when mounted), for the one invalidation a
    /// handler sends itself: attributes only, which takes no lock a request could hold.
    pub(crate) notifier: std::sync::OnceLock<fuser::Notifier>,
}

const RECENT_OPENS: usize = 32;

impl FuseState {
    /// Returns once every change Silt learned so far has been told to the kernel (so a
    /// `silt fs sync` that returns has cleared the kernel's caches too).
    pub fn wait_for_invalidations(&self) {
        if let Some(q) = self.invalidations.get() {
            q.wait();
        }
    }

    pub(crate) fn record(&self, path: &str, mode: &'static str, reason: &str) {
        let mut r = self.recent_opens.lock();
        if r.len() == RECENT_OPENS {
            r.pop_front();
        }
        r.push_back(OpenRecord {
            path: path.to_string(),
            mode,
            reason: reason.to_string(),
        });
    }
}

/// `FUSE_DEV_IOC_BACKING_CLOSE`: `_IOW(229, 2, uint32_t)` (include/uapi/linux/fuse.h).
const FUSE_DEV_IOC_BACKING_CLOSE: libc::c_ulong = 0x4004_E502;

/// What the kernel gives the core: passthrough backings on the mount's connection, and the
/// invalidation queue an open waits for.
pub(crate) struct Kernel {
    pub(crate) state: Arc<FuseState>,
    pub(crate) passthrough: PassthroughMode,
    /// The mount's FUSE device (a duplicate), to register backings whose kernel ids go into
    /// the inode log, and to close inherited ones.
    pub(crate) dev: Option<OwnedFd>,
}

impl Frontend for Kernel {
    fn reads_local_files(&self) -> bool {
        self.state.passthrough_enabled.load(Ordering::Relaxed)
    }

    fn why_no_local_files(&self) -> &'static str {
        if self.passthrough == PassthroughMode::Off {
            "passthrough disabled by configuration"
        } else {
            "kernel does not support passthrough"
        }
    }

    fn register_local_file(&self, file: &std::fs::File) -> std::io::Result<u32> {
        let dev = self
            .dev
            .as_ref()
            .ok_or_else(|| std::io::Error::other("the mount's FUSE device is not at hand"))?;
        BackingId::create_raw(dev, file)
    }

    /// Closes backing `id` on the mount's connection.
    fn close_local_file(&self, id: u32) {
        let Some(dev) = &self.dev else {
            return;
        };
        // SAFETY: an ioctl on an open descriptor with a pointer to a live u32.
        let rc = unsafe { libc::ioctl(dev.as_raw_fd(), FUSE_DEV_IOC_BACKING_CLOSE, &id) };
        if rc != 0 {
            tracing::debug!(
                id,
                error = %std::io::Error::last_os_error(),
                "closing a passthrough backing"
            );
        }
    }

    fn caught_up(&self) {
        self.state.wait_for_invalidations();
    }
}

/// `FUSE_INIT`: what the adapter asks of the kernel (readdirplus, atomic `O_TRUNC`, read-ahead,
/// shared maps of direct-I/O files, passthrough), and what it got, in `state`.
pub(crate) fn negotiate(
    state: &FuseState,
    opts: &FuseOptions,
    config: &mut KernelConfig,
) -> std::io::Result<()> {
    let _ = config.add_capabilities(InitFlags::FUSE_DO_READDIRPLUS);
    // O_TRUNC comes with the open (one empty writer) instead of a setattr after it (which
    // would first copy the whole file in to cut it).
    let _ = config.add_capabilities(InitFlags::FUSE_ATOMIC_O_TRUNC);
    // More parallel read-ahead requests in flight: the prefetcher and kernel read-ahead
    // together keep the store busy.
    let _ = config.set_max_background(64);
    let _ = config.set_congestion_threshold(48);
    let _ = config.set_max_readahead(opts.max_read as u32);
    // Lets a file opened with FOPEN_DIRECT_IO be mapped shared (through the page cache, as
    // any other); without it such an mmap fails with ENODEV.
    let direct_mmap = config
        .add_capabilities(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP)
        .is_ok();
    state
        .cold_direct_io
        .store(opts.cold_direct_io && direct_mmap, Ordering::Relaxed);
    if opts.cold_direct_io && !direct_mmap {
        tracing::warn!(
                "fuse_cold_direct_io ignored: this kernel cannot map such files shared (needs Linux >= 6.6)"
            );
    }
    let kernel_pt = config.capabilities().contains(InitFlags::FUSE_PASSTHROUGH);
    state.kernel_passthrough.store(kernel_pt, Ordering::Relaxed);
    let want = opts.passthrough != PassthroughMode::Off;
    if want && kernel_pt {
        let ok = config.set_max_stack_depth(1).is_ok()
            && config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok();
        state.passthrough_enabled.store(ok, Ordering::Relaxed);
    }
    if opts.passthrough == PassthroughMode::On && !state.passthrough_enabled.load(Ordering::Relaxed)
    {
        return Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "passthrough=on but this kernel does not offer FUSE passthrough (needs Linux >= 6.9)",
        ));
    }
    tracing::info!(
        kernel_passthrough = kernel_pt,
        passthrough = state.passthrough_enabled.load(Ordering::Relaxed),
        "FUSE session initialised"
    );
    Ok(())
}
