//! Escaping for HTML and URLs, and the query string of a request. Every name that reaches a
//! page (paths, URIs, worker ids, error messages) goes through [`esc`] or [`href_path`].

use std::fmt::{self, Display, Write as _};

/// Text (or an attribute value) with `& < > " '` escaped.
pub struct Esc<'a>(pub &'a str);

pub fn esc(s: &str) -> Esc<'_> {
    Esc(s)
}

impl Display for Esc<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut rest = self.0;
        while let Some(i) = rest.find(['&', '<', '>', '"', '\'']) {
            f.write_str(&rest[..i])?;
            f.write_str(match rest.as_bytes()[i] {
                b'&' => "&amp;",
                b'<' => "&lt;",
                b'>' => "&gt;",
                b'"' => "&quot;",
                _ => "&#39;",
            })?;
            rest = &rest[i + 1..];
        }
        f.write_str(rest)
    }
}

/// `s` percent-encoded for a query value: everything but unreserved characters and `/`.
pub fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// The `href` of the browse view of `path` (escaped for an attribute).
pub fn href_path(path: &str) -> String {
    format!("/browse?path={}", url_encode(path))
}

/// The value of `key` in a query string (`a=1&b=2`), decoded (`%XX`, `+` as space).
/// `Err` for a value that is not valid percent-encoded UTF-8.
pub fn query_value(query: &str, key: &str) -> Result<Option<String>, String> {
    for pair in query.split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if k == key {
            return url_decode(v).map(Some);
        }
    }
    Ok(None)
}

fn url_decode(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| format!("bad percent-encoding in {s:?}"))?;
                out.push(hex);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).map_err(|_| format!("{s:?} is not UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_round_trips_paths() {
        assert_eq!(
            esc("<a href=\"x\">'&'</a>").to_string(),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
        assert_eq!(esc("plain/ü").to_string(), "plain/ü");
        for p in ["/data/a b", "/x/ü&y=1#z", "/%41+", "/\"<>"] {
            let q = format!("from=3&path={}", url_encode(p));
            assert_eq!(query_value(&q, "path").unwrap().as_deref(), Some(p));
        }
        assert_eq!(
            query_value("path=/a+b", "path").unwrap().as_deref(),
            Some("/a b")
        );
        assert_eq!(query_value("x=1", "path").unwrap(), None);
        assert!(query_value("path=%zz", "path").is_err());
        assert!(query_value("path=%ff", "path").is_err());
        assert!(query_value("path=%4", "path").is_err());
    }
}
