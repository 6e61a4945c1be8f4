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
    /// crc32c of the fields above ([`record_check`]): a byte changed on disk in the path or a
    /// number is found, not recovered as another file. Absent in records of older versions
    /// (and where a changed byte hit this key's name, leaving the values intact).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check: Option<u32>,
    /// The file's S3 headers (a gateway upload's), uploaded with it. Absent when it has none
    /// (and in records of older versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<silt_ufs::Headers>,
}

/// The checksum a record carries of its own fields.
fn record_check(r: &LogRecord) -> u32 {
    let mut c = crc32c::crc32c(&r.seq.to_le_bytes());
    for n in [r.len, u64::from(r.crc32c), r.created] {
        c = crc32c::crc32c_append(c, &n.to_le_bytes());
    }
    let c = crc32c::crc32c_append(c, r.path.as_bytes());
    // Records without headers check as they did before headers were kept.
    match r.headers.as_ref().and_then(|h| serde_json::to_vec(h).ok()) {
        Some(h) => crc32c::crc32c_append(c, &h),
        None => c,
    }
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
        // A record number no append can follow (a damaged or planted name) is refused, not
        // an overflow.
        let next = max_seq.checked_add(1).ok_or_else(|| {
            Error::new(
                silt_common::ErrorKind::Corrupted,
                format!(
                    "write-ahead log {}: record number {max_seq} leaves no room for new ones",
                    dir.display()
                ),
            )
        })?;
        let wal = Wal {
            dir: dir.to_path_buf(),
            next: AtomicU64::new(next),
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
        if rec.check.is_some_and(|c| c != record_check(&rec)) {
            return Err(Error::new(
                silt_common::ErrorKind::Corrupted,
                format!(
                    "record of {:?}: its fields do not match their checksum",
                    rec.path
                ),
            ));
        }
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
    pub fn append(
        &self,
        path: &str,
        src: &dyn ReadAt,
        len: u64,
        headers: Option<&silt_ufs::Headers>,
    ) -> Result<(LogRecord, File)> {
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
            let mut rec = LogRecord {
                seq,
                path: path.to_string(),
                len,
                crc32c: crc,
                created: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs()),
                check: None,
                headers: headers.filter(|h| !h.is_empty()).cloned(),
            };
            rec.check = Some(record_check(&rec));
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
        let (ra, _) = wal.append("/d/a", &a, a.len() as u64, None).unwrap();
        let b = Bytes::from_static(b"hello");
        let (rb, _) = wal.append("/d/b", &b, 5, None).unwrap();
        wal.append("/d/c", &b, 5, None).unwrap();
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
        let (rn, _) = wal.append("/d/n", &b, 5, None).unwrap();
        assert!(rn.seq > 99);
    }

    #[test]
    fn a_record_number_at_the_end_of_the_range_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(format!("{}.json", u64::MAX)), b"{}").unwrap();
        let e = Wal::open(dir.path()).err().unwrap();
        assert_eq!(e.kind(), silt_common::ErrorKind::Corrupted, "{e}");
    }

    /// Writes the record `rec` (JSON `json`) and its `data` as an append would have.
    fn plant(dir: &Path, seq: u64, json: &[u8], data: &[u8]) {
        fs::write(dir.join(format!("{seq:020}.json")), json).unwrap();
        fs::write(dir.join(format!("{seq:020}.data")), data).unwrap();
    }

    /// What `open` returned must be exactly what the record says: its bytes' length and crc.
    fn check_recovered(recs: &[(LogRecord, File)]) -> std::result::Result<(), TestCaseError> {
        for (r, f) in recs {
            let len = f.metadata().unwrap().len();
            prop_assert_eq!(len, r.len);
            prop_assert_eq!(crc_of(f, len).unwrap(), r.crc32c);
        }
        Ok(())
    }

    use proptest::prelude::*;
    use proptest::test_runner::TestCaseError;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Arbitrary record and data bytes, under arbitrary numbers: a clear error or records
        /// that match their bytes; never a panic.
        #[test]
        fn arbitrary_records_never_panic(
            files in proptest::collection::vec(
                (any::<u64>(), proptest::collection::vec(any::<u8>(), 0..300), proptest::collection::vec(any::<u8>(), 0..64)),
                0..4,
            )
        ) {
            let dir = tempfile::tempdir().unwrap();
            for (seq, json, data) in &files {
                plant(dir.path(), *seq, json, data);
            }
            if let Ok((_, recs)) = Wal::open(dir.path()) {
                check_recovered(&recs)?;
            }
        }

        /// A valid record with flipped bytes, a cut, or a changed length field, in the record
        /// or its data: recovered intact (the change hit nothing that matters) or set aside.
        #[test]
        fn damaged_records_are_set_aside(
            data in proptest::collection::vec(any::<u8>(), 0..4096),
            path in "/[a-z]{1,8}/[a-z0-9._-]{1,12}",
            flip_json in proptest::option::of((any::<prop::sample::Index>(), 1..=255u8)),
            flip_data in proptest::option::of((any::<prop::sample::Index>(), 1..=255u8)),
            cut in proptest::option::of(any::<prop::sample::Index>()),
            len_delta in proptest::option::of(any::<i64>()),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let (wal, _) = Wal::open(dir.path()).unwrap();
            let (mut rec, _) = wal.append(&path, &Bytes::from(data.clone()), data.len() as u64, None).unwrap();
            drop(wal);
            if let Some(d) = len_delta {
                rec.len = rec.len.wrapping_add_signed(d);
            }
            let mut json = serde_json::to_vec(&rec).unwrap();
            if let Some((at, x)) = flip_json {
                let i = at.index(json.len());
                json[i] ^= x;
            }
            if let Some(at) = cut {
                json.truncate(at.index(json.len() + 1));
            }
            let mut bytes = data.clone();
            if let (Some((at, x)), false) = (flip_data, bytes.is_empty()) {
                let i = at.index(bytes.len());
                bytes[i] ^= x;
            }
            plant(dir.path(), rec.seq, &json, &bytes);
            let (_, recs) = Wal::open(dir.path()).unwrap();
            check_recovered(&recs)?;
            for (r, f) in &recs {
                let mut back = vec![0u8; usize::try_from(r.len).unwrap()];
                f.read_exact_at(&mut back, 0).unwrap();
                prop_assert_eq!(&back, &data, "recovered bytes that are not the file's");
                prop_assert_eq!(&r.path, &path, "recovered as another file");
            }
        }
    }

    /// Every single-bit flip of a record file: set aside, or recovered with the very fields
    /// that were written (a flip in a key's name may leave the values whole).
    #[test]
    fn a_flipped_bit_anywhere_in_a_record_never_recovers_another_file() {
        let dir = tempfile::tempdir().unwrap();
        let (wal, _) = Wal::open(dir.path()).unwrap();
        let data = Bytes::from_static(b"the bytes of the file");
        let (rec, _) = wal
            .append("/data/out/part-0", &data, data.len() as u64, None)
            .unwrap();
        drop(wal);
        let json = fs::read(dir.path().join(format!("{:020}.json", rec.seq))).unwrap();
        let mut recovered = 0;
        for i in 0..json.len() {
            for bit in 0..8 {
                let mut bad = json.clone();
                bad[i] ^= 1 << bit;
                let d = tempfile::tempdir().unwrap();
                plant(d.path(), rec.seq, &bad, &data);
                let (_, recs) = Wal::open(d.path()).unwrap();
                for (r, _) in &recs {
                    let fields =
                        |r: &LogRecord| (r.seq, r.path.clone(), r.len, r.crc32c, r.created);
                    assert_eq!(
                        fields(r),
                        fields(&rec),
                        "byte {i} bit {bit}: recovered as {r:?}"
                    );
                    recovered += 1;
                }
            }
        }
        // Some flips are harmless (whitespace-free JSON leaves few), most are set aside.
        assert!(
            recovered < json.len() * 8 / 2,
            "{recovered} of {} flips recovered",
            json.len() * 8
        );
    }

    #[test]
    fn a_record_of_an_older_version_without_its_own_check_still_recovers() {
        let dir = tempfile::tempdir().unwrap();
        let (wal, _) = Wal::open(dir.path()).unwrap();
        let (mut r, _) = wal
            .append("/d/a", &Bytes::from_static(b"abc"), 3, None)
            .unwrap();
        r.check = None;
        fs::write(wal.json_path(r.seq), serde_json::to_vec(&r).unwrap()).unwrap();
        let (_, recs) = Wal::open(dir.path()).unwrap();
        assert_eq!(recs.len(), 1);
        assert_eq!(recs[0].0, r);
    }

    #[test]
    fn a_record_whose_bytes_changed_is_kept_aside() {
        let dir = tempfile::tempdir().unwrap();
        let (wal, _) = Wal::open(dir.path()).unwrap();
        let (r, _) = wal
            .append("/d/a", &Bytes::from_static(b"abc"), 3, None)
            .unwrap();
        fs::write(wal.data_path(r.seq), b"abd").unwrap();
        let (_, recs) = Wal::open(dir.path()).unwrap();
        assert!(recs.is_empty());
        assert!(dir.path().join(format!("{}.bad", r.seq)).exists());
        assert!(dir.path().join(format!("{}.bad-data", r.seq)).exists());
    }
}
