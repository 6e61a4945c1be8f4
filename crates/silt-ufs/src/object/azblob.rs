//! Azure Blob Storage (`azblob://CONTAINER/PREFIX`): OpenDAL's `azblob` service.
//!
//! Options: `account` (default `AZURE_STORAGE_ACCOUNT`), `endpoint` (default
//! `https://ACCOUNT.blob.core.windows.net`), and where the secret is: `account_key_env=VAR`
//! (a shared key) or `sas_token_env=VAR` (a SAS token); without either, `AZURE_STORAGE_KEY`,
//! then `AZURE_STORAGE_SAS_TOKEN`. Only these credentials are ever used: no managed
//! identity (IMDS), CLI or workload identity, which would send traffic elsewhere.

use opendal::services::Azblob;
use opendal::HttpTransporter;
use reqsign_azure_storage::StaticCredentialProvider;
use reqsign_core::ProvideCredentialChain;
use silt_common::{Error, Result};

use super::uri::Scheme;
use super::{operators, root_of, ObjectUri, Pin, Service, Setup};

/// `azblob://CONTAINER/PREFIX`.
pub(crate) const SCHEME: Scheme = Scheme {
    name: "azblob",
    aliases: &[],
    container_word: "container",
    example: "azblob://my-container/prefix?account=ACCOUNT",
    check_container: |container| {
        let ok_chars = container
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-');
        if (3..=63).contains(&container.len())
            && ok_chars
            && !container.starts_with('-')
            && !container.contains("--")
        {
            Ok(())
        } else {
            Err("3 to 63 letters, digits and single '-'")
        }
    },
    credentials_hint: "use account_key_env= or sas_token_env= in the query",
    options: &["account", "endpoint", "account_key_env", "sas_token_env"],
    secrets: &[
        (
            "account_key",
            "account_key_env=VARIABLE (or AZURE_STORAGE_KEY)",
        ),
        ("key", "account_key_env=VARIABLE (or AZURE_STORAGE_KEY)"),
        ("sas_token", "sas_token_env=VARIABLE"),
        ("sas", "sas_token_env=VARIABLE"),
    ],
    setup,
};
use crate::S3Options;

enum Secret {
    Key(String),
    Sas(String),
}

/// The value of the environment variable `var`, which the URI names for a secret.
fn env_secret(shown: &str, key: &str, var: &str) -> Result<String> {
    match std::env::var(var) {
        Ok(v) if !v.trim().is_empty() => Ok(v.trim().to_string()),
        _ => Err(Error::invalid(format!(
            "{shown}: {key}={var}, but the environment variable {var} is not set"
        ))),
    }
}

fn env_opt(var: &str) -> Option<String> {
    std::env::var(var)
        .ok()
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

pub(crate) fn setup(uri: &ObjectUri, opts: &S3Options, http: &HttpTransporter) -> Result<Setup> {
    let shown = uri.without_query();
    let account = match uri.option("account") {
        Some(a) => a.to_string(),
        None => env_opt("AZURE_STORAGE_ACCOUNT").ok_or_else(|| {
            Error::invalid(format!(
                "{shown}: no storage account: set account=NAME in the URI or \
                 AZURE_STORAGE_ACCOUNT"
            ))
        })?,
    };
    if account.is_empty()
        || !account
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-')
    {
        return Err(Error::invalid(format!(
            "{shown}: {account:?} is not a storage account name (letters and digits)"
        )));
    }
    let endpoint = match uri.option("endpoint") {
        Some(e) => e.trim_end_matches('/').to_string(),
        None => format!("https://{account}.blob.core.windows.net"),
    };
    let secret = match (uri.option("account_key_env"), uri.option("sas_token_env")) {
        (Some(_), Some(_)) => {
            return Err(Error::invalid(format!(
                "{shown}: account_key_env and sas_token_env exclude each other"
            )))
        }
        (Some(var), None) => Secret::Key(env_secret(&shown, "account_key_env", var)?),
        (None, Some(var)) => Secret::Sas(env_secret(&shown, "sas_token_env", var)?),
        (None, None) => match (
            env_opt("AZURE_STORAGE_KEY"),
            env_opt("AZURE_STORAGE_SAS_TOKEN"),
        ) {
            (Some(k), _) => Secret::Key(k),
            (None, Some(s)) => Secret::Sas(s),
            (None, None) => {
                return Err(Error::invalid(format!(
                    "{shown}: no Azure credentials: set account_key_env=VAR or \
                     sas_token_env=VAR in the URI, or AZURE_STORAGE_KEY"
                )))
            }
        },
    };
    let root = root_of(&uri.prefix);
    let make = || {
        // The chain replaces OpenDAL's default one (environment, CLI, IMDS...).
        let (b, provider) = match &secret {
            Secret::Key(k) => (
                Azblob::default().account_key(k),
                StaticCredentialProvider::new_shared_key(&account, k),
            ),
            Secret::Sas(s) => (
                Azblob::default().sas_token(s),
                StaticCredentialProvider::new_sas_token(s),
            ),
        };
        b.container(&uri.container)
            .root(&root)
            .endpoint(&endpoint)
            .account_name(&account)
            .credential_provider_chain(ProvideCredentialChain::new().push(provider))
    };
    let (op, raw) = operators(make, http, opts, &shown)?;
    Ok(Setup {
        op,
        raw: Some(raw),
        service: Service {
            scheme: uri.scheme,
            label: "Azure Blob",
            endpoint,
            container: Some(("container", uri.container.clone())),
            markers: true,
            // ETags: every write makes a new one; `If-Match` pins reads and rewrites.
            pin: Pin::Etag,
            credential_codes: &[
                "AuthenticationFailed",
                "AuthorizationFailure",
                "InvalidAuthenticationInfo",
                "NoAuthenticationInformation",
            ],
            no_credentials: "no Azure credentials: set account_key_env=VAR or \
                             sas_token_env=VAR in the URI, or AZURE_STORAGE_KEY",
            hdfs: None,
        },
    })
}
