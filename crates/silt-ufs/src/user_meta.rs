//! POSIX attributes in an object's user metadata, as s3fs-fuse keeps them (`x-amz-meta-mode`,
//! `-uid`, `-gid`, `-mtime`, `-atime`, `-ctime`, `-rdev`), so a bucket written by one shows the
//! same modes in the other. S3 and the object stores that carry user metadata (GCS, Azure)
//! share these keys.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opendal::Metadata;

use crate::headers::from_user_metadata;
use crate::{EntryKind, Headers, ObjectMeta, Posix, SetAttrs, SpecialKind, S_IFMT};

/// S3 metadata as `stat` and `list` both report it, so their fingerprints agree: the ETag
/// without quotes, the mtime in whole seconds (HEAD has second precision, listings more), and
/// no version id (only HEAD returns one, so it would make the two disagree).
pub(crate) fn s3_meta(path: String, m: &Metadata) -> ObjectMeta {
    let mtime = m.last_modified().and_then(|t| {
        let secs = SystemTime::from(t)
            .duration_since(UNIX_EPOCH)
            .ok()?
            .as_secs();
        Some(UNIX_EPOCH + Duration::from_secs(secs))
    });
    let user = m.user_metadata();
    let attr = |k: &str| -> Option<String> {
        user.as_ref()?
            .into_iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(k))
            .map(|(_, v)| v.to_string())
    };
    let mut meta = ObjectMeta {
        path,
        kind: EntryKind::File,
        size: m.content_length(),
        mtime,
        etag: m.etag().map(strip_etag),
        version: None,
        mode: None,
        posix: Posix::default(),
    };
    s3_apply_attrs(&mut meta, attr);
    meta
}

/// `meta` with the POSIX attributes of an object's user metadata (`attr` looks a key up):
/// s3fs-fuse keeps a link as an object whose body is the target, a special file as an empty
/// object, each typed by its mode, and the file's mtime in its metadata (Last-Modified is the
/// upload's time). A directory marker keeps its kind.
pub(crate) fn s3_apply_attrs(meta: &mut ObjectMeta, attr: impl Fn(&str) -> Option<String>) {
    let time = |k: &str| attr(k).and_then(|v| parse_s3_time(&v));
    let id = |k: &str| attr(k).and_then(|v| v.trim().parse::<u32>().ok());
    let raw_mode = id(S3_MODE);
    if meta.kind != EntryKind::Dir {
        meta.kind = match raw_mode {
            Some(m) if m & S_IFMT == S_IFLNK => EntryKind::Symlink,
            Some(m) => SpecialKind::from_mode(m).map_or(EntryKind::File, EntryKind::Special),
            None => EntryKind::File,
        };
    }
    if meta.kind.is_special() || meta.kind == EntryKind::Dir {
        meta.size = 0;
    }
    meta.mtime = time(S3_MTIME).or(meta.mtime);
    meta.mode = raw_mode.map(|v| v & 0o7777);
    meta.posix = Posix {
        uid: id(S3_UID),
        gid: id(S3_GID),
        atime: time(S3_ATIME),
        ctime: time(S3_CTIME),
        rdev: match meta.kind {
            EntryKind::Special(k) if k.is_device() => id(S3_RDEV).unwrap_or(0),
            _ => 0,
        },
        nlink: None,
    };
}

/// User metadata keys of POSIX attributes, as s3fs-fuse writes them (`x-amz-meta-` + key):
/// the mode in decimal with the file type bits, ids in decimal, times in seconds since the
/// epoch (a fraction accepted on reading).
pub(crate) const S3_MODE: &str = "mode";
const S3_UID: &str = "uid";
const S3_GID: &str = "gid";
pub(crate) const S3_MTIME: &str = "mtime";
const S3_ATIME: &str = "atime";
pub(crate) const S3_CTIME: &str = "ctime";
/// A device node's number, in decimal (s3fs-fuse's `x-amz-meta-rdev`).
const S3_RDEV: &str = "rdev";

/// `S_IFREG`: the type bits s3fs-fuse stores with a regular file's mode.
const S_IFREG: u32 = 0o100000;
/// `S_IFLNK`: the type bits of a symbolic link's mode (s3fs-fuse: a link object).
pub(crate) const S_IFLNK: u32 = 0o120000;
/// `S_IFDIR`: the type bits s3fs-fuse stores with a directory marker's mode.
const S_IFDIR: u32 = 0o040000;

fn parse_s3_time(v: &str) -> Option<SystemTime> {
    let v = v.trim();
    let (secs, frac) = v.split_once('.').unwrap_or((v, ""));
    let secs: u64 = secs.parse().ok()?;
    let digits: String = frac.chars().take(9).collect();
    let nanos = if digits.is_empty() {
        0
    } else {
        let n: u32 = digits.parse().ok()?;
        n * 10u32.pow(9 - digits.len() as u32)
    };
    UNIX_EPOCH.checked_add(Duration::new(secs, nanos))
}

pub(crate) fn secs(t: SystemTime) -> String {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
        .to_string()
}

/// `user` (an object's headers as user metadata) with the attributes of `m` changed by `set`
/// added; a POSIX key the S3 client also set is the attribute.
pub(crate) fn with_posix_metadata(
    mut user: Vec<(String, String)>,
    m: &ObjectMeta,
    set: &SetAttrs,
) -> Vec<(String, String)> {
    let posix = s3_user_metadata(m, set);
    user.retain(|(k, _)| !posix.iter().any(|(p, _)| p.eq_ignore_ascii_case(k)));
    user.extend(posix);
    user
}

/// The user metadata of an object with the attributes of `m` changed by `set`, keys without
/// the `x-amz-meta-` prefix (OpenDAL adds it).
pub(crate) fn s3_user_metadata(m: &ObjectMeta, set: &SetAttrs) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let ty = match m.kind {
        EntryKind::Symlink => S_IFLNK,
        EntryKind::Dir => S_IFDIR,
        EntryKind::Special(k) => k.type_bits(),
        EntryKind::File => S_IFREG,
    };
    if let Some(mode) = set.mode.or(m.mode) {
        out.push((S3_MODE.to_string(), (ty | (mode & 0o7777)).to_string()));
    }
    if let Some(uid) = set.uid.or(m.posix.uid) {
        out.push((S3_UID.to_string(), uid.to_string()));
    }
    if let Some(gid) = set.gid.or(m.posix.gid) {
        out.push((S3_GID.to_string(), gid.to_string()));
    }
    if let Some(t) = set
        .mtime
        .or(m.mtime.filter(|_| !set.is_empty() || m.mode.is_some()))
    {
        out.push((S3_MTIME.to_string(), secs(t)));
    }
    if let Some(t) = set.atime.or(m.posix.atime) {
        out.push((S3_ATIME.to_string(), secs(t)));
    }
    out.push((S3_CTIME.to_string(), secs(SystemTime::now())));
    if m.posix.rdev != 0 {
        out.push((S3_RDEV.to_string(), m.posix.rdev.to_string()));
    }
    out
}
/// The S3 headers an object store's answer (a HEAD, a stat) carries: the four OpenDAL reads
/// natively, the rest from the user metadata (`crate::headers`).
pub(crate) fn headers_of(m: &Metadata) -> Headers {
    let own = |v: Option<&str>| v.map(str::to_string);
    let native = [
        own(m.content_type()),
        own(m.cache_control()),
        own(m.content_disposition()),
        own(m.content_encoding()),
    ];
    match m.user_metadata() {
        Some(user) => from_user_metadata(native, user),
        None => from_user_metadata(native, std::iter::empty()),
    }
}

/// An ETag as Silt keeps it: without quotes or the weak marker.
pub(crate) fn strip_etag(etag: &str) -> String {
    let e = etag.trim();
    let e = e.strip_prefix("W/").unwrap_or(e);
    e.trim_matches('"').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    /// The user metadata keys and encodings s3fs-fuse reads and writes: `mode` in decimal
    /// with the type bits, ids in decimal, times in seconds (a fraction accepted).
    #[test]
    fn s3fs_metadata_conventions() {
        let t = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let set = SetAttrs {
            mode: Some(0o750),
            uid: Some(1000),
            gid: Some(100),
            atime: Some(t),
            mtime: Some(t),
        };
        let meta: std::collections::HashMap<String, String> =
            s3_user_metadata(&ObjectMeta::empty_file("x"), &set)
                .into_iter()
                .collect();
        assert_eq!(meta["mode"], "33256", "0100750 in decimal");
        assert_eq!(meta["uid"], "1000");
        assert_eq!(meta["gid"], "100");
        assert_eq!(meta["mtime"], "1700000000");
        assert_eq!(meta["atime"], "1700000000");
        assert!(meta.contains_key("ctime"));
        assert_eq!(parse_s3_time("1700000000"), Some(t));
        assert_eq!(
            parse_s3_time("1700000000.5"),
            Some(t + Duration::from_millis(500))
        );
        assert_eq!(parse_s3_time("soon"), None);
        assert_eq!(parse_s3_time("-1"), None);
    }

    /// s3fs-fuse's links: the mode keeps `S_IFLNK` (0120777 = 41471 in decimal), also when
    /// the owner of a link changes.
    #[test]
    fn s3fs_link_mode() {
        let link = ObjectMeta {
            kind: EntryKind::Symlink,
            mode: Some(0o777),
            ..ObjectMeta::dir("l")
        };
        let set = SetAttrs {
            uid: Some(7),
            ..Default::default()
        };
        let meta: std::collections::HashMap<String, String> =
            s3_user_metadata(&link, &set).into_iter().collect();
        assert_eq!(meta["mode"], "41471");
    }
}
