//! Write types: where the bytes of a file written through Silt go, and when a write counts as
//! done. What each promises is written in `docs/SEMANTICS.md` ("Writes").

use std::fmt;

use crate::{Error, Result};

/// Where written bytes go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteType {
    /// No writes: every modifying operation fails with `EROFS`.
    ReadOnly,
    /// Written to the under-store when the file is closed (the close returns once the store
    /// has the object) and cached as written, so reading it back costs no store request.
    Through,
    /// Written to the under-store when the file is closed; nothing is cached.
    StoreOnly,
    /// Kept only in Silt (scratch, shuffle), with a TTL and optional replication. Not built
    /// yet.
    CacheOnly,
    /// Acknowledged once durable inside Silt, persisted in the background. Not built yet.
    Back,
}

impl WriteType {
    pub const ALL: [WriteType; 5] = [
        WriteType::ReadOnly,
        WriteType::Through,
        WriteType::StoreOnly,
        WriteType::CacheOnly,
        WriteType::Back,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            WriteType::ReadOnly => "read-only",
            WriteType::Through => "through",
            WriteType::StoreOnly => "store-only",
            WriteType::CacheOnly => "cache-only",
            WriteType::Back => "back",
        }
    }

    /// Whether this build can write this way.
    pub fn is_available(self) -> bool {
        matches!(
            self,
            WriteType::ReadOnly | WriteType::Through | WriteType::StoreOnly
        )
    }

    /// Parses a write type's name; a type this build does not offer yet is a clear error.
    pub fn parse(text: &str) -> Result<WriteType> {
        let t = text.trim();
        let Some(w) = WriteType::ALL.into_iter().find(|w| w.as_str() == t) else {
            return Err(Error::invalid(format!(
                "unknown write type {t:?}: expected one of {}",
                names(|_| true)
            )));
        };
        if !w.is_available() {
            return Err(Error::new(
                crate::ErrorKind::Unsupported,
                format!(
                    "write type {t:?} is not available yet; available: {}",
                    names(WriteType::is_available)
                ),
            ));
        }
        Ok(w)
    }

    pub fn writable(self) -> bool {
        self != WriteType::ReadOnly
    }

    /// Whether written bytes are kept in the cache.
    pub fn caches(self) -> bool {
        matches!(
            self,
            WriteType::Through | WriteType::CacheOnly | WriteType::Back
        )
    }
}

fn names(keep: impl Fn(WriteType) -> bool) -> String {
    WriteType::ALL
        .into_iter()
        .filter(|w| keep(*w))
        .map(WriteType::as_str)
        .collect::<Vec<_>>()
        .join(", ")
}

impl fmt::Display for WriteType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn names_round_trip_and_unbuilt_types_are_refused_clearly() {
        for w in WriteType::ALL.into_iter().filter(|w| w.is_available()) {
            assert_eq!(WriteType::parse(w.as_str()).unwrap(), w);
        }
        let e = WriteType::parse("back").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unsupported);
        assert!(e.to_string().contains("through"), "{e}");
        let e = WriteType::parse("sometimes").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        assert!(e.to_string().contains("cache-only"), "{e}");
        assert!(!WriteType::ReadOnly.writable());
        assert!(WriteType::Through.caches() && !WriteType::StoreOnly.caches());
    }
}
