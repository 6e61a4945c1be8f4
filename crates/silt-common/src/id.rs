//! Identities of cached objects and pages.
//!
//! A page is keyed by the *content fingerprint* of the object it belongs to, never by its
//! path alone: when an object changes in the under-store its fingerprint changes, so pages of
//! the old version can never be served for the new one, and a change of owner or mode (not
//! part of the content fingerprint) keeps every cached page.

use std::fmt;

/// 128-bit identity of one version of one object: a hash of (store URI, path, content
/// fingerprint).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectId(pub u128);

impl ObjectId {
    /// `store` is the under-store URI, `path` the object's path inside it and `content` its
    /// content fingerprint (ETag, version id, or size+mtime), as produced by the under-store.
    pub fn new(store: &str, path: &str, content: &str) -> Self {
        let mut buf = Vec::with_capacity(store.len() + path.len() + content.len() + 2);
        buf.extend_from_slice(store.as_bytes());
        buf.push(0);
        buf.extend_from_slice(path.as_bytes());
        buf.push(0);
        buf.extend_from_slice(content.as_bytes());
        ObjectId(xxhash_rust::xxh3::xxh3_128(&buf))
    }

    /// 32 lowercase hex digits; used as a file name on disk.
    pub fn to_hex(self) -> String {
        format!("{:032x}", self.0)
    }

    pub fn from_hex(s: &str) -> Option<Self> {
        if s.len() != 32 {
            return None;
        }
        u128::from_str_radix(s, 16).ok().map(ObjectId)
    }
}

impl fmt::Debug for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ObjectId({})", self.to_hex())
    }
}

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// One page of one object version: bytes `[index * page_size, (index + 1) * page_size)`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub struct PageKey {
    pub object: ObjectId,
    pub index: u64,
}

impl PageKey {
    pub fn new(object: ObjectId, index: u64) -> Self {
        PageKey { object, index }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_id_depends_on_every_part_and_round_trips() {
        let a = ObjectId::new("s3://b/p", "x/y", "etag1");
        assert_ne!(a, ObjectId::new("s3://b/p", "x/y", "etag2"));
        assert_ne!(a, ObjectId::new("s3://b/q", "x/y", "etag1"));
        // The separator keeps ("ab","c") and ("a","bc") apart.
        assert_ne!(ObjectId::new("s", "ab", "c"), ObjectId::new("s", "a", "bc"));
        assert_eq!(ObjectId::from_hex(&a.to_hex()), Some(a));
        assert_eq!(ObjectId::from_hex("zz"), None);
    }
}
