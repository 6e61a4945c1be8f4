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
    while off < len {
        let n = (len - off).min(chunk);
        if src.is_hole(off, n) {
            crc = crc32c::crc32c_combine(crc, zeros_crc(n), n as usize);
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
}
