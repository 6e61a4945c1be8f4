//! One error model for all of Silt: a kind (what went wrong, independent of where),
//! whether retrying can help, and the errno a POSIX front end should return.

use std::fmt;

/// What went wrong, independent of which component noticed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The path or object does not exist.
    NotFound,
    /// Credentials were refused or the caller may not do this.
    PermissionDenied,
    /// Only the owner (or root) may do this (POSIX `EPERM`: chmod, chown, utimes of another
    /// user's file).
    NotPermitted,
    /// The request itself is malformed (bad URI, bad option value, bad range).
    InvalidInput,
    /// The operation is not supported by this store or this build.
    Unsupported,
    /// The object changed under us (fingerprint no longer matches): never mix versions.
    ContentChanged,
    /// A network peer could not be reached or broke the connection.
    Unavailable,
    /// A deadline passed.
    Timeout,
    /// The store asked us to slow down (HTTP 429/503 SlowDown).
    RateLimited,
    /// No tier has room.
    NoSpace,
    /// Stored bytes failed their checksum.
    Corrupted,
    /// A resource is held by someone else (mountpoint busy, state dir locked).
    Busy,
    /// Expected a directory.
    NotADirectory,
    /// Expected a file.
    IsADirectory,
    /// The thing already exists.
    AlreadyExists,
    /// The path may not be modified (a read-only mount or write type).
    ReadOnly,
    /// A directory to remove still has entries.
    NotEmpty,
    /// A name or path is longer than the store (or POSIX) allows.
    NameTooLong,
    /// The operation would cross stores (a rename between mounts).
    CrossDevice,
    /// A file would grow past the largest size allowed (`max_file_size`).
    FileTooLarge,
    /// A conditional change found the file not as it required (S3's `If-Match`,
    /// `If-None-Match: *`); nothing changed. `EEXIST`: the one such condition POSIX callers
    /// meet is `O_EXCL`'s.
    PreconditionFailed,
    /// An inode number that names nothing any more (`ESTALE`).
    Stale,
    /// A handle number that is not open (`EBADF`).
    BadHandle,
    /// A bug or an unexpected condition.
    Internal,
}

impl ErrorKind {
    /// Whether a retry of the same request may succeed.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            ErrorKind::Unavailable | ErrorKind::Timeout | ErrorKind::RateLimited
        )
    }

    /// The errno a POSIX front end returns for this kind.
    pub fn errno(self) -> i32 {
        match self {
            ErrorKind::NotFound => libc::ENOENT,
            ErrorKind::PermissionDenied => libc::EACCES,
            ErrorKind::NotPermitted => libc::EPERM,
            ErrorKind::InvalidInput => libc::EINVAL,
            ErrorKind::Unsupported => libc::ENOTSUP,
            ErrorKind::ContentChanged => libc::ESTALE,
            ErrorKind::Unavailable => libc::EIO,
            ErrorKind::Timeout => libc::ETIMEDOUT,
            ErrorKind::RateLimited => libc::EAGAIN,
            ErrorKind::NoSpace => libc::ENOSPC,
            ErrorKind::Corrupted => libc::EIO,
            ErrorKind::Busy => libc::EBUSY,
            ErrorKind::NotADirectory => libc::ENOTDIR,
            ErrorKind::IsADirectory => libc::EISDIR,
            ErrorKind::AlreadyExists => libc::EEXIST,
            ErrorKind::ReadOnly => libc::EROFS,
            ErrorKind::NotEmpty => libc::ENOTEMPTY,
            ErrorKind::NameTooLong => libc::ENAMETOOLONG,
            ErrorKind::CrossDevice => libc::EXDEV,
            ErrorKind::FileTooLarge => libc::EFBIG,
            ErrorKind::PreconditionFailed => libc::EEXIST,
            ErrorKind::Stale => libc::ESTALE,
            ErrorKind::BadHandle => libc::EBADF,
            ErrorKind::Internal => libc::EIO,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::NotFound => "not found",
            ErrorKind::PermissionDenied => "permission denied",
            ErrorKind::NotPermitted => "operation not permitted",
            ErrorKind::InvalidInput => "invalid input",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::ContentChanged => "content changed",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Timeout => "timed out",
            ErrorKind::RateLimited => "rate limited",
            ErrorKind::NoSpace => "no space",
            ErrorKind::Corrupted => "corrupted",
            ErrorKind::Busy => "busy",
            ErrorKind::NotADirectory => "not a directory",
            ErrorKind::IsADirectory => "is a directory",
            ErrorKind::AlreadyExists => "already exists",
            ErrorKind::ReadOnly => "read-only",
            ErrorKind::NotEmpty => "directory not empty",
            ErrorKind::NameTooLong => "name too long",
            ErrorKind::CrossDevice => "cross-device",
            ErrorKind::FileTooLarge => "file too large",
            ErrorKind::PreconditionFailed => "precondition failed",
            ErrorKind::Stale => "stale",
            ErrorKind::BadHandle => "bad handle",
            ErrorKind::Internal => "internal error",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error type of every Silt library crate.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    kind: ErrorKind,
    message: String,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
            source: None,
        }
    }

    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    pub fn is_retryable(&self) -> bool {
        self.kind.is_retryable()
    }

    pub fn errno(&self) -> i32 {
        self.kind.errno()
    }

    /// Prefixes the message with context, keeping kind and source.
    pub fn context(mut self, context: impl fmt::Display) -> Self {
        self.message = format!("{context}: {}", self.message);
        self
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidInput, message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }
}

impl From<std::io::Error> for Error {
    fn from(err: std::io::Error) -> Self {
        use std::io::ErrorKind as Io;
        let kind = match err.kind() {
            Io::NotFound => ErrorKind::NotFound,
            Io::PermissionDenied => ErrorKind::PermissionDenied,
            Io::InvalidInput | Io::InvalidData => ErrorKind::InvalidInput,
            Io::TimedOut => ErrorKind::Timeout,
            Io::AlreadyExists => ErrorKind::AlreadyExists,
            Io::Unsupported => ErrorKind::Unsupported,
            Io::ConnectionRefused
            | Io::ConnectionReset
            | Io::ConnectionAborted
            | Io::BrokenPipe
            | Io::UnexpectedEof => ErrorKind::Unavailable,
            Io::StorageFull => ErrorKind::NoSpace,
            Io::NotADirectory => ErrorKind::NotADirectory,
            Io::IsADirectory => ErrorKind::IsADirectory,
            Io::ResourceBusy => ErrorKind::Busy,
            Io::DirectoryNotEmpty => ErrorKind::NotEmpty,
            _ => ErrorKind::Internal,
        };
        Error::new(kind, err.to_string()).with_source(err)
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_map_to_errnos_and_retryability() {
        assert_eq!(Error::not_found("x").errno(), libc::ENOENT);
        assert_eq!(ErrorKind::ContentChanged.errno(), libc::ESTALE);
        assert!(ErrorKind::Timeout.is_retryable());
        assert!(!ErrorKind::NotFound.is_retryable());
        let io = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let e = Error::from(io);
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        assert!(e.is_retryable());
        assert!(e
            .context("reading /a")
            .to_string()
            .starts_with("reading /a: "));
    }
}
