//! Browser-based uploads (POST Object, a `multipart/form-data` form): `s3s` checks the
//! form's signature, its policy's conditions and whether the policy has expired, but reads
//! the policy's `expiration` with a parser that takes any separator between date and time
//! (`2030-01-01 12:00:00+00:00`). S3 takes only ISO 8601 (`2030-01-01T12:00:00.000Z`) and
//! refuses the rest with `400 InvalidPolicyDocument`. The form fields come before the file,
//! so the gateway reads the start of such a request's body (at most [`PEEK_LIMIT`]), checks
//! the policy's date there, and hands `s3s` the whole body, the start first.

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use s3s::{S3Error, S3ErrorCode};

/// How much of a form is read ahead for its policy: S3 limits the form fields before the
/// file to 20 KB; the rest (a file, or a form without a policy field) is left to `s3s`.
const PEEK_LIMIT: usize = 64 << 10;

/// The boundary of a `multipart/form-data` content type, if it is one.
pub(crate) fn form_boundary(content_type: Option<&hyper::header::HeaderValue>) -> Option<String> {
    let ct = content_type?.to_str().ok()?;
    let (mime, params) = ct.split_once(';')?;
    if !mime.trim().eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    params.split(';').find_map(|p| {
        let (k, v) = p.split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case("boundary")
            .then(|| v.trim().trim_matches('"').to_string())
            .filter(|b| !b.is_empty())
    })
}

/// Reads the start of `body` (up to the policy field's end, the file field's start, or
/// [`PEEK_LIMIT`]); returns what was read.
pub(crate) async fn peek(
    body: &mut hyper::body::Incoming,
    boundary: &str,
) -> Result<Bytes, hyper::Error> {
    let mut buf = BytesMut::new();
    while buf.len() < PEEK_LIMIT && !enough(&buf, boundary) {
        match body.frame().await {
            Some(Ok(f)) => {
                if let Ok(data) = f.into_data() {
                    buf.extend_from_slice(&data);
                }
            }
            Some(Err(e)) => return Err(e),
            None => break,
        }
    }
    Ok(buf.freeze())
}

/// Whether `buf` holds the policy field whole, or reached the file field (after which no
/// field counts).
fn enough(buf: &[u8], boundary: &str) -> bool {
    let Ok(text) = std::str::from_utf8(valid_prefix(buf)) else {
        return false;
    };
    let delim = format!("--{boundary}");
    let mut parts = text.split(delim.as_str()).skip(1).peekable();
    while let Some(part) = parts.next() {
        let complete = parts.peek().is_some();
        match field_name(part) {
            Some(n) if n == "file" => return true,
            Some(n) if n == "policy" && complete => return true,
            _ => {}
        }
    }
    false
}

/// The longest prefix of `buf` that is UTF-8 (a read may end inside a character).
fn valid_prefix(buf: &[u8]) -> &[u8] {
    match std::str::from_utf8(buf) {
        Ok(_) => buf,
        Err(e) => &buf[..e.valid_up_to()],
    }
}

/// The name a form part's Content-Disposition gives it.
fn field_name(part: &str) -> Option<String> {
    let head = part.split("\r\n\r\n").next()?;
    head.lines()
        .find(|l| {
            l.to_ascii_lowercase()
                .trim_start()
                .starts_with("content-disposition:")
        })
        .and_then(|l| {
            l.split(';').find_map(|p| {
                let (k, v) = p.split_once('=')?;
                k.trim()
                    .eq_ignore_ascii_case("name")
                    .then(|| v.trim().trim_matches('"').to_ascii_lowercase())
            })
        })
}

/// The policy field's value in the start of a form, if it is there whole.
fn policy_field<'a>(text: &'a str, boundary: &str) -> Option<&'a str> {
    let delim = format!("--{boundary}");
    let mut parts = text.split(delim.as_str()).skip(1).peekable();
    while let Some(part) = parts.next() {
        let complete = parts.peek().is_some();
        match field_name(part).as_deref() {
            Some("file") => return None,
            Some("policy") if complete => {
                let (_, value) = part.split_once("\r\n\r\n")?;
                return Some(value.strip_suffix("\r\n").unwrap_or(value));
            }
            _ => {}
        }
    }
    None
}

/// Checks the `expiration` of the policy in the start of a form: ISO 8601, as S3 takes it.
/// Anything else about the policy (missing, not base64 or JSON, expired, conditions) is
/// `s3s`'s to answer.
pub(crate) fn check_policy_date(start: &[u8], boundary: &str) -> Result<(), S3Error> {
    use base64::Engine;
    let Ok(text) = std::str::from_utf8(valid_prefix(start)) else {
        return Ok(());
    };
    let Some(policy) = policy_field(text, boundary) else {
        return Ok(());
    };
    let Ok(json) = base64::engine::general_purpose::STANDARD.decode(policy.trim()) else {
        return Ok(());
    };
    let Ok(doc) = serde_json::from_slice::<serde_json::Value>(&json) else {
        return Ok(());
    };
    match doc.get("expiration").and_then(|v| v.as_str()) {
        Some(exp) if !iso8601(exp) => Err(S3Error::with_message(
            S3ErrorCode::InvalidPolicyDocument,
            format!("Invalid Policy: Invalid 'expiration' value: '{exp}'"),
        )),
        _ => Ok(()),
    }
}

/// `YYYY-MM-DDThh:mm:ss[.fraction](Z|±hh:mm)`.
fn iso8601(s: &str) -> bool {
    let b = s.as_bytes();
    let digits =
        |r: std::ops::Range<usize>| b.get(r).is_some_and(|x| x.iter().all(u8::is_ascii_digit));
    let at = |i: usize, c: u8| b.get(i) == Some(&c);
    if !(digits(0..4)
        && at(4, b'-')
        && digits(5..7)
        && at(7, b'-')
        && digits(8..10)
        && at(10, b'T')
        && digits(11..13)
        && at(13, b':')
        && digits(14..16)
        && at(16, b':')
        && digits(17..19))
    {
        return false;
    }
    let mut i = 19;
    if at(i, b'.') {
        i += 1;
        let start = i;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        if i == start {
            return false;
        }
    }
    match b.get(i) {
        Some(b'Z') => i + 1 == b.len(),
        Some(b'+' | b'-') => {
            i + 6 == b.len() && digits(i + 1..i + 3) && at(i + 3, b':') && digits(i + 4..i + 6)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(expiration: &str) -> String {
        use base64::Engine;
        let policy = base64::engine::general_purpose::STANDARD.encode(format!(
            r#"{{"expiration": "{expiration}", "conditions": [{{"bucket": "data"}}]}}"#
        ));
        format!(
            "--XyZ\r\nContent-Disposition: form-data; name=\"key\"\r\n\r\nk\r\n\
             --XyZ\r\nContent-Disposition: form-data; name=\"Policy\"\r\n\r\n{policy}\r\n\
             --XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f\"\r\n\r\nbytes\r\n--XyZ--\r\n"
        )
    }

    #[test]
    fn policy_dates_as_s3_takes_them() {
        for ok in [
            "2030-01-01T12:00:00Z",
            "2030-01-01T12:00:00.000Z",
            "2030-01-01T12:00:00+02:00",
        ] {
            assert!(
                check_policy_date(form(ok).as_bytes(), "XyZ").is_ok(),
                "{ok}"
            );
        }
        for bad in [
            "2030-01-01 12:00:00.123456+00:00",
            "2030-01-01 12:00:00Z",
            "2030-01-01t12:00:00Z",
            "2030-01-01T12:00:00",
            "not-a-time",
        ] {
            let e = check_policy_date(form(bad).as_bytes(), "XyZ").unwrap_err();
            assert_eq!(*e.code(), S3ErrorCode::InvalidPolicyDocument, "{bad}");
        }
        // The file's field ends the search; a policy cut off is left to s3s.
        let f = form("2030-01-01 12:00:00Z");
        assert!(enough(f.as_bytes(), "XyZ"));
        let cut = &f[..f.find("name=\"Policy\"").unwrap() + 30];
        assert!(!enough(cut.as_bytes(), "XyZ"));
        assert!(check_policy_date(cut.as_bytes(), "XyZ").is_ok());
    }

    #[test]
    fn form_boundaries() {
        let v = |s: &'static str| hyper::header::HeaderValue::from_static(s);
        assert_eq!(
            form_boundary(Some(&v("multipart/form-data; boundary=\"ab c\""))).as_deref(),
            Some("ab c")
        );
        assert_eq!(
            form_boundary(Some(&v("Multipart/Form-Data;boundary=xyz"))).as_deref(),
            Some("xyz")
        );
        assert_eq!(form_boundary(Some(&v("application/xml"))), None);
        assert_eq!(form_boundary(None), None);
    }
}
