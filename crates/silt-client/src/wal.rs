//! The write-ahead log of `back` writes: a file is acknowledged once its bytes and its record
//! are on disk, and stays in the log until the under-store has it.
//!
//! Layout: per record `SEQ.data` (the file's bytes) and `SEQ.json` (mount, path, length,
//! crc32c). Append order: data written and fsynced, then the record written to `SEQ.json.tmp`,
//! fsynced, renamed to `SEQ.json`, and the directory fsynced. So a `SEQ.json` exists only for
//! a complete, durable file, and a crash at any point leaves either a whole record or leftovers
//! recovery removes (the writer had not been acknowledged). A record whose bytes fail their
//! checksum at recovery is kept aside (`SEQ.bad`, `SEQ.bad-data`) and reported, never
//! uploaded; any other recovery error stops the start.

use std::fs::{self, File};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};
use silt_common::io::ReadAt;
use silt_common::{Error, Result};
use tracing::warn;

/// Bytes copied per step when a file is appended.
const COPY_CHUNK: usize = 1 << 20;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct LogRecord {
    pub seq: u64,
    /// Namespace path of the file (`/data/out/part-0`).
    pub path: String,
    pub len: u64,
    pub crc32c: u32,
    /// When it was acknowledged (Unix seconds).
    pub created: u64,
}

pub struct Wal {
    dir: PathBuf,
    next: AtomicU64,
}

fn io_err(e: std::io::Error, what: impl std::fmt::Display) -> Error {
    Error::from(e).context(what.to_string())
}

impl Wal {
    /// Opens (creating) the log in `dir` and returns the complete records in order, each with
    /// its data file; removes what an interrupted append left.
    pub fn open(dir: &Path) -> Result<(Wal, Vec<(LogRecord, File)>)> {
        silt_common::private::create_dir(dir)
            .map_err(|e| io_err(e, format!("creating the write-ahead log {}", dir.display())))?;
        let mut records = Vec::new();
        let mut max_seq = 0;
        let mut data_files = Vec::new();
        let entries = fs::read_dir(dir)
            .map_err(|e| io_err(e, format!("reading the write-ahead log {}", dir.display())))?;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some((stem, ext)) = name.split_once('.') else {
                continue;
            };
            let Ok(seq) = stem.parse::<u64>() else {
                continue;
            };
            max_seq = max_seq.max(seq);
            match ext {
                "json" => records.push(seq),
                "data" => data_files.push(seq),
                "json.tmp" => {
                    let _ = fs::remove_file(entry.path());
                }
                _ => {}
            }
        }
        let wal = Wal {
            dir: dir.to_path_buf(),
            next: AtomicU64::new(max_seq + 1),
        };
        records.sort_unstable();
        let mut out = Vec::new();
        for seq in &records {
            match wal.recover_one(*seq) {
                Ok(r) => out.push(r),
                // Only a record proven wrong is set aside; any other failure (no fds, I/O)
                // stops the start rather than risk dropping an acknowledged file.
                Err(e) if e.kind() == silt_common::ErrorKind::Corrupted => {
                    warn!(seq, error = %e, "write-ahead log record kept aside as .bad, not uploaded");
                    let _ = fs::rename(wal.json_path(*seq), wal.dir.join(format!("{seq}.bad")));
                    let _ =
                        fs::rename(wal.data_path(*seq), wal.dir.join(format!("{seq}.bad-data")));
                }
                Err(e) => {
                    return Err(e.context(format!(
                        "recovering write-ahead log record {seq} in {}",
                        dir.display()
                    )))
                }
            }
        }
        for seq in data_files {
            if records.binary_search(&seq).is_err() {
                // Bytes of a file never acknowledged.
                let _ = fs::remove_file(wal.data_path(seq));
            }
        }
        Ok((wal, out))
    }

    fn data_path(&self, seq: u64) -> PathBuf {
        self.dir.join(format!("{seq:020}.data"))
    }

    fn json_path(&self, seq: u64) -> PathBuf {
        self.dir.join(format!("{seq:020}.json"))
    }

    fn recover_one(&self, seq: u64) -> Result<(LogRecord, File)> {
        let text = fs::read(self.json_path(seq)).map_err(|e| io_err(e, "reading the record"))?;
        let rec: LogRecord = serde_json::from_slice(&text)
            .map_err(|e| Error::new(silt_common::ErrorKind::Corrupted, format!("record: {e}")))?;
        let file = File::open(self.data_path(seq)).map_err(|e| io_err(e, "opening its data"))?;
        let len = file
            .metadata()
            .map_err(|e| io_err(e, "stat"))
            .map(|m| m.len())?;
        if len != rec.len || rec.seq != seq || crc_of(&file, len)? != rec.crc32c {
            return Err(Error::new(
                silt_common::ErrorKind::Corrupted,
                format!("{}: {len} bytes on disk do not match the record", rec.path),
            ));
        }
        Ok((rec, file))
    }

    /// Makes the first `len` bytes of `src` durable as the new content of `path`; returns the
    /// record and its data file, open for reading.
    pub fn append(&self, path: &str, src: &dyn ReadAt, len: u64) -> Result<(LogRecord, File)> {
        let seq = self.next.fetch_add(1, Ordering::Relaxed);
        let data_path = self.data_path(seq);
        let what = |e| io_err(e, format!("{path}: writing the write-ahead log"));
        let result = (|| {
            let file = silt_common::private::options()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&data_path)
                .map_err(what)?;
            // Holes are skipped: the log's copy of a sparse file is sparse too.
            let crc = silt_common::io::copy_sparse(src, len, COPY_CHUNK as u64, |off, chunk| {
                file.write_all_at(chunk, off).map_err(what)
            })?;
            file.set_len(len).map_err(what)?;
            file.sync_data().map_err(what)?;
            let rec = LogRecord {
                seq,
                path: path.to_string(),
                len,
                crc32c: crc,
                created: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs()),
            };
            let tmp = self.dir.join(format!("{seq:020}.json.tmp"));
            let json = serde_json::to_vec(&rec)
                .map_err(|e| Error::internal(format!("encoding a log record: {e}")))?;
            let mut f = silt_common::private::create(&tmp).map_err(what)?;
            f.write_all(&json).map_err(what)?;
            f.sync_all().map_err(what)?;
            fs::rename(&tmp, self.json_path(seq)).map_err(what)?;
            File::open(&self.dir)
                .and_then(|d| d.sync_all())
                .map_err(what)?;
            Ok((rec, file))
        })();
        if result.is_err() {
            let _ = fs::remove_file(&data_path);
            let _ = fs::remove_file(self.json_path(seq));
        }
        result
    }

    /// Forgets a record (uploaded, superseded or deleted). The record goes first, so a crash
    /// in between leaves only bytes that recovery removes.
    pub fn remove(&self, seq: u64) {
        let _ = fs::remove_file(self.json_path(seq));
        // Durably gone before the caller acts on it (a delete or a newer write of the path):
        // a record back after a power loss would be uploaded again over them.
        if let Err(e) = File::open(&self.dir).and_then(|d| d.sync_all()) {
            warn!(seq, error = %e, "could not sync the write-ahead log directory");
        }
        let _ = fs::remove_file(self.data_path(seq));
    }
}

fn crc_of(file: &File, len: u64) -> Result<u32> {
    let mut crc = 0u32;
    let mut buf = vec![0u8; COPY_CHUNK];
    let mut off = 0u64;
    while off < len {
        let n = (len - off).min(COPY_CHUNK as u64) as usize;
        file.read_exact_at(&mut buf[..n], off)
            .map_err(|e| io_err(e, "reading back"))?;
        crc = crc32c::crc32c_append(crc, &buf[..n]);
        off += n as u64;
    }
    Ok(crc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn appended_records_recover_and_leftovers_go() {
        let dir = tempfile::tempdir().unwrap();
        let (wal, none) = Wal::open(dir.path()).unwrap();
        assert!(none.is_empty());
        let a = Bytes::from(vec![7u8; 3 << 20]);
        let (ra, _) = wal.append("/d/a", &a, a.len() as u64).unwrap();
        let b = Bytes::from_static(b"hello");
        let (rb, _) = wal.append("/d/b", &b, 5).unwrap();
        wal.append("/d/c", &b, 5).unwrap();
        wal.remove(rb.seq + 1);
        // An append cut short before its record: bytes only.
        fs::write(dir.path().join(format!("{:020}.data", 99)), b"partial").unwrap();
        fs::write(dir.path().join(format!("{:020}.json.tmp", 99)), b"{").unwrap();
        drop(wal);
        let (wal, recs) = Wal::open(dir.path()).unwrap();
        let got: Vec<_> = recs.iter().map(|(r, _)| r.clone()).collect();
        assert_eq!(got, vec![ra.clone(), rb.clone()]);
        let mut back = vec![0u8; 5];
        recs[1].1.read_exact_at(&mut back, 0).unwrap();
        assert_eq!(back, b"hello");
        assert!(!dir.path().join(format!("{:020}.data", 99)).exists());
        // New records never reuse a number.
        let (rn, _) = wal.append("/d/n", &b, 5).unwrap();
        assert!(rn.seq > 99);
    }

    #[test]
    fn a_record_whose_bytes_changed_is_kept_aside() {
        let dir = tempfile::tempdir().unwrap();
        let (wal, _) = Wal::open(dir.path()).unwrap();
        let (r, _) = wal.append("/d/a", &Bytes::from_static(b"abc"), 3).unwrap();
        fs::write(wal.data_path(r.seq), b"abd").unwrap();
        let (_, recs) = Wal::open(dir.path()).unwrap();
        assert!(recs.is_empty());
        assert!(dir.path().join(format!("{}.bad", r.seq)).exists());
        assert!(dir.path().join(format!("{}.bad-data", r.seq)).exists());
    }
}
