//! Percent-escapes of values in a store URI's query string (`s3://b/p?endpoint=...`), shared
//! by the URI parsers and the config file's per-mount sections that build such URIs.

/// `%XX` escapes decoded (`+` stays `+`: URIs here are not form data); `None` for a bad escape
/// or bytes that are not UTF-8.
pub fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Escapes what would end a value in a query string or a mount table (`&`, `,`, `%`, `#`,
/// `?`, `=`, `+`, white space and controls).
pub fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            c if matches!(c, '&' | ',' | '%' | '#' | '?' | '=' | '+' | ' ') || c.is_control() => {
                let mut buf = [0u8; 4];
                for byte in c.encode_utf8(&mut buf).bytes() {
                    out.push_str(&format!("%{byte:02X}"));
                }
            }
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_bad_escapes() {
        for v in ["http://h:1/p", "a&b,c%d#e?f=g+h i", "ünï"] {
            assert_eq!(percent_decode(&percent_encode(v)).as_deref(), Some(v));
        }
        assert_eq!(percent_encode("a&b"), "a%26b");
        assert_eq!(percent_decode("%zz"), None);
        assert_eq!(percent_decode("%4"), None);
    }
}
