//! What the gateway adds around `s3s`, at the HTTP edge: request ids on every answer (and
//! in every error body, as S3's carry them), and the checks S3 makes of a request before it
//! looks at its signature that `s3s` does not make (how long a presigned URL may be valid).

use bytes::Bytes;
use rand::RngCore;
use s3s::{HttpResponse, S3Error, S3ErrorCode};

/// The longest a presigned URL may be valid (SigV4: 7 days).
const MAX_PRESIGNED_EXPIRES: u64 = 604_800;

/// One request's ids: `x-amz-request-id` (16 hex digits, as S3's) and `x-amz-id-2` (S3's
/// "host id", base64).
pub(crate) struct Ids {
    pub request_id: String,
    pub host_id: String,
}

impl Ids {
    pub fn new() -> Ids {
        use base64::Engine;
        let mut raw = [0u8; 8 + 24];
        rand::thread_rng().fill_bytes(&mut raw);
        let request_id = raw[..8].iter().map(|b| format!("{b:02X}")).collect();
        let host_id = base64::engine::general_purpose::STANDARD.encode(&raw[8..]);
        Ids {
            request_id,
            host_id,
        }
    }

    /// Puts the ids in `resp`: the headers, and `<RequestId>` / `<HostId>` in an error body
    /// that has none (s3s writes neither).
    pub fn apply(&self, resp: &mut HttpResponse) {
        use hyper::header::HeaderValue;
        let h = resp.headers_mut();
        if let Ok(v) = HeaderValue::from_str(&self.request_id) {
            h.insert("x-amz-request-id", v);
        }
        if let Ok(v) = HeaderValue::from_str(&self.host_id) {
            h.insert("x-amz-id-2", v);
        }
        let status = resp.status();
        if !(status.is_client_error() || status.is_server_error()) {
            return;
        }
        let Some(body) = resp.body().bytes() else {
            return;
        };
        if let Some(new) = self.error_body_with_ids(&body) {
            resp.headers_mut().remove(hyper::header::CONTENT_LENGTH);
            *resp.body_mut() = s3s::Body::from(new);
        }
    }

    /// `body` with the ids before `</Error>`, if it is an error document without them.
    fn error_body_with_ids(&self, body: &[u8]) -> Option<Bytes> {
        let text = std::str::from_utf8(body).ok()?;
        let at = text.rfind("</Error>")?;
        if text.contains("<RequestId>") {
            return None;
        }
        // Both ids are hex and base64: nothing in them needs escaping.
        let ids = format!(
            "<RequestId>{}</RequestId><HostId>{}</HostId>",
            self.request_id, self.host_id
        );
        let mut out = String::with_capacity(text.len() + ids.len());
        out.push_str(&text[..at]);
        out.push_str(&ids);
        out.push_str(&text[at..]);
        Some(Bytes::from(out))
    }
}

/// What S3 refuses of a presigned (SigV4 query) request before checking its signature and
/// `s3s` lets through: an `X-Amz-Expires` that is not a number from 0 to 604800 (7 days).
pub(crate) fn check_presigned(query: Option<&str>) -> Result<(), S3Error> {
    let Some(q) = query else {
        return Ok(());
    };
    let mut presigned = false;
    let mut expires = None;
    for pair in q.split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "X-Amz-Algorithm" => presigned = true,
            "X-Amz-Expires" => expires = Some(v),
            _ => {}
        }
    }
    let (true, Some(v)) = (presigned, expires) else {
        return Ok(());
    };
    let refuse = |msg: &'static str| {
        let mut e = S3Error::with_message(
            S3ErrorCode::Custom("AuthorizationQueryParametersError".into()),
            msg,
        );
        e.set_status_code(hyper::StatusCode::BAD_REQUEST);
        Err(e)
    };
    if let Some(digits) = v.strip_prefix('-') {
        if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
            return refuse("X-Amz-Expires must be non-negative");
        }
    }
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return refuse("X-Amz-Expires should be a number");
    }
    // All digits: too many to parse is too large too.
    if v.parse::<u64>().map_or(true, |n| n > MAX_PRESIGNED_EXPIRES) {
        return refuse("X-Amz-Expires must be less than a week (in seconds) that is; 604800");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presigned_expiry_at_most_a_week() {
        let q =
            |e: &str| format!("X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Expires={e}&X-Amz-Date=x");
        for ok in ["0", "3600", "604800"] {
            assert!(check_presigned(Some(&q(ok))).is_ok(), "{ok}");
        }
        for bad in ["604801", "99999999999999999999999", "-1", "abc", ""] {
            let e = check_presigned(Some(&q(bad))).unwrap_err();
            assert_eq!(
                e.code().as_str(),
                "AuthorizationQueryParametersError",
                "{bad}"
            );
            assert_eq!(e.status_code(), Some(hyper::StatusCode::BAD_REQUEST));
        }
        // Not presigned: none of this applies.
        assert!(check_presigned(Some("X-Amz-Expires=999999999")).is_ok());
        assert!(check_presigned(None).is_ok());
    }

    #[test]
    fn ids_go_into_error_bodies_once() {
        let ids = Ids::new();
        assert_eq!(ids.request_id.len(), 16);
        let body = b"<?xml version=\"1.0\"?><Error><Code>NoSuchKey</Code></Error>";
        let out = ids.error_body_with_ids(body).unwrap();
        let text = std::str::from_utf8(&out).unwrap();
        assert!(text.ends_with(&format!(
            "<RequestId>{}</RequestId><HostId>{}</HostId></Error>",
            ids.request_id, ids.host_id
        )));
        assert!(ids.error_body_with_ids(&out).is_none());
        assert!(ids.error_body_with_ids(b"<ListBucketResult/>").is_none());
    }
}
