//! Google Cloud Storage (`gs://BUCKET/PREFIX`): OpenDAL's `gcs` service over the JSON API.
//!
//! Options: `endpoint` (default `https://storage.googleapis.com`), `credential_path` (a
//! service account's JSON key file) or `anonymous=true` (no signing: public buckets and
//! emulators). Without either, the usual `GOOGLE_APPLICATION_CREDENTIALS` and gcloud's
//! well-known file; never the VM metadata server.

use opendal::services::Gcs;
use opendal::HttpTransporter;
use silt_common::{Error, Result};

use super::uri::Scheme;
use super::{operators, root_of, ObjectUri, Pin, Service, Setup};
use crate::S3Options;

const DEFAULT_ENDPOINT: &str = "https://storage.googleapis.com";

/// `gs://BUCKET/PREFIX`.
pub(crate) const SCHEME: Scheme = Scheme {
    name: "gs",
    aliases: &["gcs"],
    container_word: "bucket",
    example: "gs://my-bucket/prefix",
    check_container: |bucket| {
        let ok_chars = bucket
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
        if (3..=222).contains(&bucket.len()) && ok_chars {
            Ok(())
        } else {
            Err("3 to 222 letters, digits, '.', '-', '_'")
        }
    },
    credentials_hint: "use credential_path=FILE in the query",
    options: &["endpoint", "credential_path", "anonymous"],
    secrets: &[
        (
            "credential",
            "credential_path=/path/to/service-account.json",
        ),
        ("token", "credential_path=/path/to/service-account.json"),
    ],
    setup,
};

pub(crate) fn setup(uri: &ObjectUri, opts: &S3Options, http: &HttpTransporter) -> Result<Setup> {
    let shown = uri.without_query();
    let endpoint = uri
        .option("endpoint")
        .unwrap_or(DEFAULT_ENDPOINT)
        .trim_end_matches('/')
        .to_string();
    let anonymous = uri.flag("anonymous")?;
    let cred = uri.option("credential_path");
    if let Some(p) = cred {
        if anonymous {
            return Err(Error::invalid(format!(
                "{shown}: credential_path and anonymous=true exclude each other"
            )));
        }
        if !std::path::Path::new(p).is_file() {
            return Err(Error::invalid(format!(
                "{shown}: credential_path {p}: no such file"
            )));
        }
    }
    let root = root_of(&uri.prefix);
    let make = || {
        let mut b = Gcs::default()
            .bucket(&uri.container)
            .root(&root)
            .endpoint(&endpoint)
            // Never the metadata server (169.254.169.254): no traffic but to the endpoint.
            .disable_vm_metadata();
        if anonymous {
            b = b.skip_signature();
        }
        if let Some(p) = cred {
            b = b.credential_path(p);
        }
        b
    };
    let (op, raw) = operators(make, http, opts, &shown)?;
    Ok(Setup {
        op,
        raw: Some(raw),
        service: Service {
            scheme: uri.scheme,
            label: "GCS",
            endpoint,
            container: Some(("bucket", uri.container.clone())),
            markers: true,
            // Generations: every write makes a new one, and the JSON API's
            // `ifGenerationMatch` pins reads and rewrites to one.
            pin: Pin::Generation,
            credential_codes: &["authError", "invalid_grant", "UNAUTHENTICATED"],
            no_credentials: "no GCS credentials found: set credential_path=FILE (a service \
                             account key) or anonymous=true in the URI, or \
                             GOOGLE_APPLICATION_CREDENTIALS",
            hdfs: None,
        },
    })
}
