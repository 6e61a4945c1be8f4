//! Positional reads of local bytes: what an upload reads its object from (a spool file, a
//! memory-first write buffer, a write-ahead log record).

use bytes::Bytes;

use crate::{Error, Result};

/// Bytes readable at any offset, by several readers at once.
pub trait ReadAt: Send + Sync {
    /// Exactly `len` bytes at `offset`; an error if fewer exist.
    fn read_at(&self, offset: u64, len: usize) -> Result<Bytes>;
}

impl ReadAt for std::fs::File {
    fn read_at(&self, offset: u64, len: usize) -> Result<Bytes> {
        let mut buf = vec![0u8; len];
        std::os::unix::fs::FileExt::read_exact_at(self, &mut buf, offset)
            .map_err(|e| Error::from(e).context(format!("reading {len} bytes at {offset}")))?;
        Ok(Bytes::from(buf))
    }
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
