//! Page buffers reused instead of allocated per fetch.
//!
//! A cold read fills a page-sized buffer from the store and keeps it as the cached page
//! until the memory tier evicts it. Allocating each one fresh costs the kernel a zeroed page
//! per 4 KiB on first touch (and a free hands it back), so a page's buffer goes back to its
//! pool when the last `Bytes` referring to it is dropped, and the next fetch takes it again.
//!
//! Every buffer starts on a 4 KiB boundary ([`ALIGN`]), so a whole page can be written to a
//! disk tier with `O_DIRECT` straight from it.
//!
//! Buffers are anonymous memory mappings of their own, not heap allocations: one freed beyond
//! the idle bound goes back to the kernel at once. From the heap it did not: glibc serves a
//! size it has seen freed from its arenas and keeps what is freed there, so a cold scan's
//! evicted pages stayed in the process (peak RSS 1.32 GB, now 1.10 GB, for a 1 GiB memory
//! tier; docs/benchmarks.md). Mappings are capped ([`MAX_MAPPED`], well under the
//! kernel's default `vm.max_map_count`); beyond the cap, or if `mmap` fails, a buffer comes
//! from the heap as before.
//!
//! A buffer frozen with [`PageBuf::freeze_checked`] has its crc32c computed right after it was
//! filled, while its bytes are still in the CPU's cache, and remembered beside it
//! ([`known_crc`]): a disk tier checksums each page it writes, and on a cold read that came a
//! whole fetched run (8 MiB) later, from memory: 11 % of the daemon's CPU reading from S3.
//!
//! Invariants: a buffer is owned by exactly one [`PageBuf`] or frozen `Bytes` (and its clones)
//! at a time, or idle in the pool, never two of these; the pool keeps at most `max_idle` idle
//! buffers and frees the rest, so what it holds beyond the buffers in use is bounded. A
//! remembered crc belongs to a frozen buffer's exact first byte and length and is forgotten
//! before the buffer goes back to the pool, so it always describes bytes that can no longer
//! change.

use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};

use bytes::Bytes;
use parking_lot::Mutex;

use crate::metrics::{PAGE_BUFFERS_ALLOCATED, PAGE_BUFFERS_REUSED};

/// Alignment of every pooled buffer's first byte.
pub const ALIGN: usize = 4096;

/// Idle bytes each page-size pool may keep for reuse.
const IDLE_BYTES: usize = 16 << 20;

/// Buffers mapped at once, process-wide, at most (a quarter of the kernel's default limit of
/// 65,530 mappings per process; adjacent ones may merge, but unmapping one then splits them).
pub const MAX_MAPPED: usize = 16 << 10;

static MAPPED: AtomicUsize = AtomicUsize::new(0);

/// Frozen buffers' crc32c by their first byte's address: (length, crc).
static CRCS: LazyLock<Mutex<HashMap<usize, (usize, u32)>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// The crc32c of `data` if it is exactly a buffer frozen with [`PageBuf::freeze_checked`]
/// (same first byte, same length), else `None` (compute it).
pub fn known_crc(data: &[u8]) -> Option<u32> {
    match CRCS.lock().get(&(data.as_ptr() as usize)) {
        Some(&(len, crc)) if len == data.len() => Some(crc),
        _ => None,
    }
}

/// Buffers mapped now, process-wide.
pub fn mapped_buffers() -> usize {
    MAPPED.load(Ordering::Relaxed)
}

/// A buffer's memory: a mapping of its own, or (beyond [`MAX_MAPPED`]) a heap allocation
/// over-allocated by [`ALIGN`] so an aligned window fits. Owned exclusively.
#[derive(Debug)]
enum Raw {
    Mapped { ptr: NonNull<u8>, len: usize },
    Heap { vec: Vec<u8>, off: usize },
}

// SAFETY: `Mapped` owns its mapping exclusively (no other pointer to it exists outside the
// borrows handed out by `window`), like the `Vec` of `Heap`.
unsafe impl Send for Raw {}

impl Raw {
    /// `size` bytes (zeros), aligned to [`ALIGN`].
    fn new(size: usize) -> Raw {
        if let Some(raw) = Self::map(size) {
            return raw;
        }
        let vec = vec![0u8; size + ALIGN];
        let off = vec.as_ptr().align_offset(ALIGN);
        Raw::Heap { vec, off }
    }

    fn map(size: usize) -> Option<Raw> {
        let len = size.checked_next_multiple_of(ALIGN)?.max(ALIGN);
        if MAPPED.fetch_add(1, Ordering::Relaxed) >= MAX_MAPPED {
            MAPPED.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        match NonNull::new(p.cast::<u8>()).filter(|_| p != libc::MAP_FAILED) {
            Some(ptr) => Some(Raw::Mapped { ptr, len }),
            None => {
                MAPPED.fetch_sub(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// The aligned window of `size` bytes.
    fn window(&self, size: usize) -> &[u8] {
        match self {
            // SAFETY: the mapping is `len >= size` bytes, readable, and lives as long as self.
            Raw::Mapped { ptr, len } => unsafe {
                std::slice::from_raw_parts(ptr.as_ptr(), size.min(*len))
            },
            Raw::Heap { vec, off } => &vec[*off..*off + size],
        }
    }

    fn window_mut(&mut self, size: usize) -> &mut [u8] {
        match self {
            // SAFETY: as in `window`, and `&mut self` makes this the only borrow.
            Raw::Mapped { ptr, len } => unsafe {
                std::slice::from_raw_parts_mut(ptr.as_ptr(), size.min(*len))
            },
            Raw::Heap { vec, off } => &mut vec[*off..*off + size],
        }
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        if let Raw::Mapped { ptr, len } = *self {
            // SAFETY: our own mapping, unmapped once; no borrow of it outlives `self`.
            if unsafe { libc::munmap(ptr.as_ptr().cast(), len) } != 0 {
                // Only a split past the kernel's mapping limit fails; the memory stays mapped.
                tracing::warn!(
                    "munmap of a page buffer failed: {}",
                    std::io::Error::last_os_error()
                );
            }
            MAPPED.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// A pool of buffers of one size.
#[derive(Debug)]
pub struct BufferPool {
    size: usize,
    max_idle: AtomicUsize,
    /// `freeze_checked` takes a crc (someone checksums these pages: a disk tier).
    checksums: AtomicBool,
    idle: Mutex<Vec<Raw>>,
}

impl BufferPool {
    /// A pool of `size`-byte buffers keeping at most `max_idle` of them idle.
    pub fn new(size: usize, max_idle: usize) -> Arc<Self> {
        Arc::new(BufferPool {
            size,
            max_idle: AtomicUsize::new(max_idle),
            checksums: AtomicBool::new(false),
            idle: Mutex::new(Vec::new()),
        })
    }

    /// The process-wide pool of `size`-byte buffers (one per size; in practice the page
    /// size), or `None` below [`ALIGN`] bytes, where a pooled buffer would hold more memory
    /// than its bytes and gain nothing.
    pub fn for_size(size: usize) -> Option<Arc<Self>> {
        static POOLS: Mutex<Vec<Arc<BufferPool>>> = Mutex::new(Vec::new());
        if size < ALIGN {
            return None;
        }
        let mut pools = POOLS.lock();
        if let Some(p) = pools.iter().find(|p| p.size == size) {
            return Some(p.clone());
        }
        let p = BufferPool::new(size, (IDLE_BYTES / (size + ALIGN)).max(1));
        pools.push(p.clone());
        Some(p)
    }

    pub fn size(&self) -> usize {
        self.size
    }

    /// Lets the pool keep at least `bytes` of idle buffers (never lowers its bound). A cache
    /// that evicts in batches sets it to a batch, so the buffers a batch frees are the ones
    /// the next fetches take, instead of being unmapped and mapped again (a fault and a zeroed
    /// page per 4 KiB: 17 % of a cold scan's CPU here with the 16 MiB default).
    pub fn keep_idle_bytes(&self, bytes: usize) {
        self.max_idle
            .fetch_max(bytes.div_ceil(self.size), Ordering::Relaxed);
    }

    /// Makes [`PageBuf::freeze_checked`] take a crc32c from now on (never undone: the pool
    /// is shared by every store of the process). A store with a disk tier asks; without one,
    /// nobody reads the crc and no fill pays for it.
    pub fn want_checksums(&self) {
        self.checksums.store(true, Ordering::Relaxed);
    }

    /// Buffers idle in the pool now.
    pub fn idle(&self) -> usize {
        self.idle.lock().len()
    }

    /// A buffer of `size()` bytes starting at an [`ALIGN`]ed address. Its contents are
    /// whatever its last user left (zeros when new): fill what you freeze.
    pub fn take(self: &Arc<Self>) -> PageBuf {
        let raw = match self.idle.lock().pop() {
            Some(raw) => {
                PAGE_BUFFERS_REUSED.inc();
                raw
            }
            None => {
                PAGE_BUFFERS_ALLOCATED.inc();
                Raw::new(self.size)
            }
        };
        PageBuf {
            raw: Some(raw),
            pool: self.clone(),
        }
    }

    fn give_back(&self, raw: Raw) {
        let mut idle = self.idle.lock();
        if idle.len() < self.max_idle.load(Ordering::Relaxed) {
            idle.push(raw);
        }
    }
}

/// A pooled buffer being filled. Dropped unfrozen, it goes back to its pool.
#[derive(Debug)]
pub struct PageBuf {
    raw: Option<Raw>,
    pool: Arc<BufferPool>,
}

impl PageBuf {
    /// The whole buffer (`size()` bytes), aligned.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let size = self.pool.size;
        match &mut self.raw {
            Some(raw) => raw.window_mut(size),
            None => &mut [],
        }
    }

    /// Its first `len` bytes (at most `size()`) as `Bytes`; the buffer returns to the pool
    /// when the last clone is dropped.
    pub fn freeze(self, len: usize) -> Bytes {
        self.freeze_with(len, false)
    }

    /// [`freeze`](Self::freeze), computing the crc32c of those bytes now, while they are
    /// still in the CPU's cache, for [`known_crc`], if the pool was asked to
    /// ([`BufferPool::want_checksums`]).
    pub fn freeze_checked(self, len: usize) -> Bytes {
        let checked = self.pool.checksums.load(Ordering::Relaxed);
        self.freeze_with(len, checked)
    }

    fn freeze_with(mut self, len: usize, checked: bool) -> Bytes {
        let Some(raw) = self.raw.take() else {
            return Bytes::new();
        };
        let len = len.min(self.pool.size);
        if checked {
            let window = raw.window(len);
            let crc = crc32c::crc32c(window);
            CRCS.lock().insert(window.as_ptr() as usize, (len, crc));
        }
        Bytes::from_owner(Filled {
            raw: Some(raw),
            len,
            checked,
            pool: self.pool.clone(),
        })
    }
}

impl Drop for PageBuf {
    fn drop(&mut self) {
        if let Some(raw) = self.raw.take() {
            self.pool.give_back(raw);
        }
    }
}

/// The owner behind a frozen buffer's `Bytes`.
struct Filled {
    raw: Option<Raw>,
    len: usize,
    /// Its crc is in `CRCS` (forgotten before the buffer is reused).
    checked: bool,
    pool: Arc<BufferPool>,
}

impl AsRef<[u8]> for Filled {
    fn as_ref(&self) -> &[u8] {
        match &self.raw {
            Some(raw) => raw.window(self.len),
            None => &[],
        }
    }
}

impl Drop for Filled {
    fn drop(&mut self) {
        if let Some(raw) = self.raw.take() {
            if self.checked {
                CRCS.lock().remove(&(raw.window(0).as_ptr() as usize));
            }
            self.pool.give_back(raw);
        }
    }
}

/// Whether `data` can be written with `O_DIRECT` as is: its address and length are
/// multiples of [`ALIGN`].
pub fn is_aligned(data: &[u8]) -> bool {
    (data.as_ptr() as usize).is_multiple_of(ALIGN) && data.len().is_multiple_of(ALIGN)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn buffers_in_use_are_never_handed_out_twice() {
        let pool = BufferPool::new(8192, 4);
        let fill = |mark: u8| {
            let mut b = pool.take();
            b.as_mut_slice().fill(mark);
            b.freeze(8192)
        };
        let mut live: Vec<(u8, Bytes)> = (0..6).map(|m| (m, fill(m))).collect();
        // Drop three; one of them lives on in a clone, so its buffer is still in use.
        let clone = live[1].1.clone();
        live.drain(0..3);
        live.push((1, clone));
        assert_eq!(pool.idle(), 2);
        for m in 100..106 {
            live.push((m, fill(m)));
        }
        let addrs: HashSet<usize> = live.iter().map(|(_, b)| b.as_ptr() as usize).collect();
        assert_eq!(addrs.len(), live.len(), "two live pages share a buffer");
        for (mark, b) in &live {
            assert!(is_aligned(b), "every buffer starts aligned");
            assert!(b.iter().all(|x| x == mark), "buffer {mark} was overwritten");
        }
    }

    #[test]
    fn the_pool_keeps_at_most_max_idle_buffers() {
        let pool = BufferPool::new(4096, 3);
        let taken: Vec<PageBuf> = (0..10).map(|_| pool.take()).collect();
        assert_eq!(pool.idle(), 0);
        drop(taken);
        assert_eq!(pool.idle(), 3, "the rest are freed");
        let again: Vec<Bytes> = (0..5).map(|_| pool.take().freeze(100)).collect();
        assert_eq!(pool.idle(), 0);
        assert!(again.iter().all(|b| b.len() == 100));
        drop(again);
        assert_eq!(pool.idle(), 3);
    }

    #[test]
    fn the_idle_bound_only_grows() {
        let pool = BufferPool::new(4096, 2);
        pool.keep_idle_bytes(5 * 4096 - 1);
        pool.keep_idle_bytes(4096);
        drop((0..8).map(|_| pool.take()).collect::<Vec<_>>());
        assert_eq!(pool.idle(), 5);
    }

    #[test]
    fn one_shared_pool_per_size_and_none_for_tiny_pieces() {
        assert!(BufferPool::for_size(ALIGN - 1).is_none());
        let (a, b) = (
            BufferPool::for_size(3 * ALIGN),
            BufferPool::for_size(3 * ALIGN),
        );
        let (a, b) = (a.unwrap(), b.unwrap());
        assert!(Arc::ptr_eq(&a, &b));
        // Its idle buffers are bounded in bytes, not only in count.
        assert!(a.max_idle.load(Ordering::Relaxed) * (a.size + ALIGN) <= IDLE_BYTES);
    }

    #[test]
    fn past_the_mapping_cap_buffers_come_from_the_heap() {
        let pool = BufferPool::new(ALIGN, 0);
        let n = MAX_MAPPED + 16;
        let bufs: Vec<Bytes> = (0..n)
            .map(|i| {
                let mut b = pool.take();
                b.as_mut_slice()[ALIGN - 8..].copy_from_slice(&(i as u64).to_le_bytes());
                b.freeze(ALIGN)
            })
            .collect();
        assert!(mapped_buffers() <= MAX_MAPPED, "the cap holds");
        for (i, b) in bufs.iter().enumerate() {
            assert!(is_aligned(b), "buffer {i} is aligned");
            assert_eq!(
                b[ALIGN - 8..],
                (i as u64).to_le_bytes(),
                "buffer {i} kept its bytes"
            );
        }
        drop(bufs);
        assert_eq!(pool.idle(), 0);
    }

    #[test]
    fn a_checked_freeze_knows_its_crc_until_the_buffer_is_reused() {
        let pool = BufferPool::new(8192, 4);
        // Nobody asked for checksums: none is taken.
        assert_eq!(known_crc(&pool.take().freeze_checked(100)), None);
        pool.want_checksums();
        let mut b = pool.take();
        b.as_mut_slice().fill(7);
        let page = b.freeze_checked(5000);
        assert_eq!(known_crc(&page), Some(crc32c::crc32c(&[7u8; 5000])));
        // Only the exact bytes: not a part of them, not a copy.
        assert_eq!(known_crc(&page[..4999]), None);
        assert_eq!(known_crc(&page[1..]), None);
        let copy: Vec<u8> = page.iter().copied().collect();
        assert_eq!(known_crc(&copy), None);
        let clone = page.clone();
        let addr = page.as_ptr();
        drop(page);
        assert!(
            known_crc(&clone).is_some(),
            "a clone keeps the buffer frozen"
        );
        drop(clone);
        // The same buffer, refilled and frozen unchecked: no stale crc.
        let mut again = pool.take();
        again.as_mut_slice().fill(9);
        let again = again.freeze(5000);
        assert_eq!(again.as_ptr(), addr, "the pool handed the buffer out again");
        assert_eq!(known_crc(&again), None);
        // An unchecked freeze never has one.
        assert_eq!(known_crc(&pool.take().freeze(8192)), None);
    }

    #[test]
    fn a_freeze_shows_only_the_filled_bytes() {
        let pool = BufferPool::new(4096, 1);
        let mut b = pool.take();
        b.as_mut_slice()[..3].copy_from_slice(b"abc");
        let bytes = b.freeze(3);
        assert_eq!(&bytes[..], b"abc");
        assert_eq!(bytes.slice(1..).as_ref(), b"bc");
        // Longer than the buffer: capped at its size.
        assert_eq!(pool.take().freeze(1 << 20).len(), 4096);
    }
}
