//! Virtual-host-style addressing: `BUCKET.DOMAIN` names a bucket when the gateway is given
//! its domain (`--domain`); any other host (the domain itself, an IP address) is path style.

use std::borrow::Cow;

use s3s::host::{S3Host, VirtualHost};
use s3s::S3Result;

/// The gateway's domain.
pub struct Domain {
    name: String,
}

impl Domain {
    /// `name` without a port, any case (`s3.example.com`).
    pub fn new(name: &str) -> Domain {
        Domain {
            name: name.trim_end_matches('.').to_ascii_lowercase(),
        }
    }

    /// The bucket `host` (a Host header, with or without a port) names, if any.
    pub fn bucket_of(&self, host: &str) -> Option<String> {
        let name = match host.rsplit_once(':') {
            Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
            _ => host,
        }
        .to_ascii_lowercase();
        let bucket = name.strip_suffix(&self.name)?.strip_suffix('.')?;
        (!bucket.is_empty()).then(|| bucket.to_string())
    }
}

impl S3Host for Domain {
    fn parse_host_header<'a>(&'a self, host: &'a str) -> S3Result<VirtualHost<'a>> {
        let vh = VirtualHost::new(Cow::Borrowed(host));
        Ok(match self.bucket_of(host) {
            Some(b) => vh.with_bucket(b),
            None => vh,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_from_hosts() {
        let d = Domain::new("S3.Local");
        assert_eq!(d.bucket_of("data.s3.local:9100").as_deref(), Some("data"));
        assert_eq!(
            d.bucket_of("my.bucket.s3.local").as_deref(),
            Some("my.bucket")
        );
        for path_style in [
            "s3.local",
            "s3.local:9100",
            "127.0.0.1:9100",
            "evil-s3.local",
            "[::1]:80",
        ] {
            assert_eq!(d.bucket_of(path_style), None, "{path_style}");
        }
    }
}
