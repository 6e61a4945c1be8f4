//! Secrets in the configuration (the cluster secret, the S3 secret key): kept out of `Debug`,
//! logs and error messages by construction, and read from owner-only files.

use std::path::Path;

use crate::{Error, Result};

/// A secret string. `Debug` and `Display` print a placeholder; the value is reached only
/// through [`Secret::expose`], so a secret cannot end up in a log line or a report by
/// formatting a struct that holds it.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_empty() {
            "Secret(empty)"
        } else {
            "Secret(<redacted>)"
        })
    }
}

impl std::fmt::Display for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Largest secret file read.
const MAX_SECRET_FILE: u64 = 64 << 10;

/// The text of a file holding secrets (`what` names it in errors, which never quote its
/// bytes), read with one open so the mode looked at is that of the file read, and at most
/// `max` bytes (a path given by mistake, say /dev/zero, is an error, not a hang). Also answers
/// whether users other than the owner may read the file.
pub fn read_owner_file(path: &Path, max: u64, what: &str) -> Result<(String, bool)> {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    let file = std::fs::File::open(path).map_err(|e| Error::from(e).context(what))?;
    let shared = file
        .metadata()
        .map(|m| m.mode() & 0o077 != 0)
        .unwrap_or(false);
    let mut bytes = Vec::new();
    file.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::from(e).context(what))?;
    if bytes.len() as u64 > max {
        return Err(Error::invalid(format!("{what} is larger than {max} bytes")));
    }
    let text = String::from_utf8(bytes)
        .map_err(|_| Error::invalid(format!("{what} is not UTF-8 text")))?;
    Ok((text, shared))
}

/// Reads a secret from `path`: its text without surrounding whitespace (a trailing newline
/// from `echo` or an editor is not part of the secret). Errors name the file, never its bytes.
/// Also answers whether users other than the owner may read the file, for a warning.
pub fn read_secret_file(path: &Path) -> Result<(Secret, bool)> {
    let what = format!("secret file {}", path.display());
    let (text, shared) = read_owner_file(path, MAX_SECRET_FILE, &what)?;
    let text = text.trim();
    if text.is_empty() {
        return Err(Error::invalid(format!("{what} is empty")));
    }
    Ok((Secret::new(text), shared))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_and_display_redact() {
        let s = Secret::new("hunter2-hunter2");
        assert!(!format!("{s:?}").contains("hunter2"));
        assert!(!format!("{s}").contains("hunter2"));
        assert_eq!(s.expose(), "hunter2-hunter2");
    }

    #[test]
    fn file_is_trimmed_and_errors_do_not_show_contents() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s");
        std::fs::write(&p, "  abc-def\n").unwrap();
        assert_eq!(read_secret_file(&p).unwrap().0.expose(), "abc-def");
        let mut bad = b"QQzz-marker".to_vec();
        bad.push(0xff);
        std::fs::write(&p, &bad).unwrap();
        let e = read_secret_file(&p).unwrap_err().to_string();
        assert!(e.contains("not UTF-8") && !e.contains("QQzz"), "{e}");
        std::fs::write(&p, vec![b'a'; 65 << 10]).unwrap();
        let e = read_secret_file(&p).unwrap_err().to_string();
        assert!(e.contains("larger than"), "{e}");
        let e = read_secret_file(Path::new("/dev/zero"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("larger than"), "{e}");
        std::fs::write(&p, "\n").unwrap();
        assert!(read_secret_file(&p)
            .unwrap_err()
            .to_string()
            .contains("empty"));
        assert!(read_secret_file(&dir.path().join("none")).is_err());
    }
}
