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

use crate::inval::InvalQueue;

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
