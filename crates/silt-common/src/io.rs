//! Positional reads of local bytes: what an upload reads its object from (a spool file, a
//! memory-first write buffer, a write-ahead log record).

use bytes::Bytes;

use crate::{Error, Result};

/// Bytes readable at any offset, by several readers at once.
pub trait ReadAt: Send + Sync {
    /// Exactly `len` bytes at `offset`; an error if fewer exist.
    fn read_at(&self, offset: u64, len: usize) -> Result<Bytes>;

    /// Whether the `len` bytes at `offset` are all a hole: never written, read as zeros,
    /// holding no storage. A copy may skip them (a sparse file stays sparse). `false` when
    /// unknown.
    fn is_hole(&self, _offset: u64, _len: u64) -> bool {
        false
    }

    /// Where the hole starting at `offset` ends: the first offset in `offset..=end` that may
    /// hold data (`offset` itself when it may, or when it is unknown). Lets a copy step over
    /// a hole of terabytes at once rather than piece by piece.
    fn hole_end(&self, offset: u64, end: u64) -> u64 {
        if offset < end && self.is_hole(offset, end - offset) {
            end
        } else {
            offset
        }
    }
}

impl ReadAt for std::fs::File {
    fn read_at(&self, offset: u64, len: usize) -> Result<Bytes> {
        let mut buf = vec![0u8; len];
        std::os::unix::fs::FileExt::read_exact_at(self, &mut buf, offset)
            .map_err(|e| Error::from(e).context(format!("reading {len} bytes at {offset}")))?;
        Ok(Bytes::from(buf))
    }

    /// The file system's own answer (`SEEK_DATA`): no data from `offset` to its end.
    fn is_hole(&self, offset: u64, len: u64) -> bool {
        use std::os::fd::AsRawFd;
        let Ok(start) = libc::off_t::try_from(offset) else {
            return false;
        };
        // SAFETY: lseek on a descriptor this File owns; it only moves the file offset, which
        // positional reads and writes do not use.
        let data = unsafe { libc::lseek(self.as_raw_fd(), start, libc::SEEK_DATA) };
        if data < 0 {
            // ENXIO: no data at or after `offset`.
            return std::io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO);
        }
        data as u64 >= offset.saturating_add(len)
    }

    fn hole_end(&self, offset: u64, end: u64) -> u64 {
        use std::os::fd::AsRawFd;
        let Ok(start) = libc::off_t::try_from(offset) else {
            return offset;
        };
        // SAFETY: as in `is_hole`.
        let data = unsafe { libc::lseek(self.as_raw_fd(), start, libc::SEEK_DATA) };
        if data < 0 {
            return if std::io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO) {
                end.max(offset)
            } else {
                offset
            };
        }
        (data as u64).clamp(offset, end.max(offset))
    }
}

/// Blocks of zeros this long inside data are skipped by [`copy_sparse`] (a file system's
/// block).
const ZERO_BLOCK: usize = 4096;

/// Copies the first `len` bytes of `src` into `dst` at the same offsets, `chunk` bytes at a
/// time, skipping holes and blocks of zeros (`dst` must read zeros where nothing is written: a new file, a new
/// buffer); `write` writes one piece. Returns the CRC-32C of all `len` bytes, holes included.
pub fn copy_sparse(
    src: &dyn ReadAt,
    len: u64,
    chunk: u64,
    mut write: impl FnMut(u64, &[u8]) -> Result<()>,
) -> Result<u32> {
    let mut crc = 0u32;
    let mut off = 0u64;
    // The checksum of a whole chunk of zeros, worked out once (each costs ~80 combines).
    let mut chunk_zeros: Option<u32> = None;
    while off < len {
        let hole_to = src.hole_end(off, len).clamp(off, len);
        if hole_to > off {
            let n = hole_to - off;
            crc = crc32c::crc32c_combine(crc, zeros_crc(n), n as usize);
            off = hole_to;
            continue;
        }
        let n = (len - off).min(chunk);
        if src.is_hole(off, n) {
            let zeros = match n == chunk {
                true => *chunk_zeros.get_or_insert_with(|| zeros_crc(chunk)),
                false => zeros_crc(n),
            };
            crc = crc32c::crc32c_combine(crc, zeros, n as usize);
        } else {
            let piece = src.read_at(off, n as usize)?;
            crc = crc32c::crc32c_append(crc, &piece);
            // Runs of non-zero blocks only: zeros inside data stay holes too.
            let mut run: Option<usize> = None;
            for (i, block) in piece.chunks(ZERO_BLOCK).enumerate() {
                let at = i * ZERO_BLOCK;
                let zero = block.iter().all(|&b| b == 0);
                match (zero, run) {
                    (false, None) => run = Some(at),
                    (true, Some(start)) => {
                        write(off + start as u64, &piece[start..at])?;
                        run = None;
                    }
                    _ => {}
                }
            }
            if let Some(start) = run {
                write(off + start as u64, &piece[start..])?;
            }
        }
        off += n;
    }
    Ok(crc)
}

/// CRC-32C of `n` zero bytes, in O(log n) steps (a hole of terabytes is not read).
pub fn zeros_crc(n: u64) -> u32 {
    // crc(zeros of 2^k) by doubling; the answer is assembled from n's bits.
    let mut crc = 0u32;
    let mut block = crc32c::crc32c(&[0u8]);
    let mut block_len = 1u64;
    let mut rest = n;
    while rest > 0 {
        if rest & 1 == 1 {
            crc = crc32c::crc32c_combine(crc, block, block_len as usize);
        }
        rest >>= 1;
        if rest > 0 {
            block = crc32c::crc32c_combine(block, block, block_len as usize);
            block_len *= 2;
        }
    }
    crc
}

impl ReadAt for Bytes {
    fn read_at(&self, offset: u64, len: usize) -> Result<Bytes> {
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        match start.checked_add(len) {
            Some(end) if end <= self.len() => Ok(self.slice(start..end)),
            _ => Err(Error::invalid(format!(
                "reading {len} bytes at {offset} of {} bytes",
                self.len()
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeros_crc_matches_the_bytes() {
        for n in [0u64, 1, 2, 3, 7, 4096, 65_537, 1 << 20, (1 << 20) + 3] {
            let direct = crc32c::crc32c(&vec![0u8; n as usize]);
            assert_eq!(zeros_crc(n), direct, "{n} zero bytes");
        }
    }

    /// A source whose every other 4 KiB piece is a hole.
    struct Striped(Bytes);

    impl ReadAt for Striped {
        fn read_at(&self, offset: u64, len: usize) -> Result<Bytes> {
            self.0.read_at(offset, len)
        }
        fn is_hole(&self, offset: u64, len: u64) -> bool {
            (offset / 4096) % 2 == 1
                && len <= 4096
                && self.0[offset as usize..][..len as usize]
                    .iter()
                    .all(|&b| b == 0)
        }
    }

    #[test]
    fn copy_sparse_skips_holes_and_checksums_everything() {
        let mut data = vec![7u8; 5 * 4096 + 100];
        data[4096..8192].fill(0);
        data[3 * 4096..4 * 4096].fill(0);
        let src = Striped(Bytes::from(data.clone()));
        let mut written = Vec::new();
        let crc = copy_sparse(&src, data.len() as u64, 4096 * 2, |off, b| {
            written.push((off, b.len()));
            Ok(())
        })
        .unwrap();
        assert_eq!(crc, crc32c::crc32c(&data));
        assert_eq!(written, [(0, 4096), (8192, 4096), (16384, 4096 + 100)]);
    }

    /// A source that counts what a copy asks of it.
    struct Counted<'a> {
        file: &'a std::fs::File,
        asks: std::sync::atomic::AtomicU64,
    }

    impl ReadAt for Counted<'_> {
        fn read_at(&self, offset: u64, len: usize) -> Result<Bytes> {
            self.asks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.file.read_at(offset, len)
        }
        fn is_hole(&self, offset: u64, len: u64) -> bool {
            self.asks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.file.is_hole(offset, len)
        }
        fn hole_end(&self, offset: u64, end: u64) -> u64 {
            self.asks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.file.hole_end(offset, end)
        }
    }

    /// `truncate -s 4T`: the hole is stepped over at once, not chunk by chunk (it took
    /// minutes of CPU in ~1 MiB steps), and its checksum is still that of all the zeros.
    #[test]
    fn a_hole_of_terabytes_is_one_step() {
        use std::os::unix::fs::FileExt;
        let file = tempfile::tempfile().unwrap();
        let len = 4u64 << 40;
        file.write_all_at(b"head", 0).unwrap();
        file.write_all_at(b"tail", len - 4).unwrap();
        let src = Counted {
            file: &file,
            asks: Default::default(),
        };
        let mut written = Vec::new();
        let crc = copy_sparse(&src, len, 1 << 20, |off, b| {
            written.push((off, b.to_vec()));
            Ok(())
        })
        .unwrap();
        // head + zeros + tail, the zeros combined as a whole.
        let mut want = crc32c::crc32c(b"head");
        let gap = len - 8;
        want = crc32c::crc32c_combine(want, zeros_crc(gap), gap as usize);
        want = crc32c::crc32c_append(want, b"tail");
        assert_eq!(crc, want);
        assert!(
            src.asks.load(std::sync::atomic::Ordering::Relaxed) < 16,
            "{} asks for 4 TiB of which two pieces hold data",
            src.asks.load(std::sync::atomic::Ordering::Relaxed)
        );
        let pieces: Vec<(u64, &[u8])> = written.iter().map(|(o, b)| (*o, &b[..])).collect();
        assert_eq!(pieces.first().map(|p| p.0), Some(0));
        assert!(pieces
            .last()
            .is_some_and(|(o, b)| o + b.len() as u64 == len && b.ends_with(b"tail")));
    }
}
