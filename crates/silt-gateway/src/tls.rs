//! Optional TLS for the gateway (`--tls-cert`, `--tls-key`): PEM files, TLS 1.2 and 1.3
//! through rustls (the provider the cluster's TLS uses).

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::ServerConfig;
use tokio_rustls::TlsAcceptor;

use crate::GatewayError;

/// Longest a client may take over its handshake (one that never finishes holds nothing).
pub const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// An acceptor serving the certificate chain in `cert` with the private key in `key`.
pub fn acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, GatewayError> {
    let bad = |what: &str, p: &Path, e: &dyn std::fmt::Display| {
        GatewayError::Config(format!("TLS {what} {}: {e}", p.display()))
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| bad("certificate", cert, &e))?
        .collect::<Result<_, _>>()
        .map_err(|e| bad("certificate", cert, &e))?;
    if certs.is_empty() {
        return Err(bad(
            "certificate",
            cert,
            &"no CERTIFICATE block in the file",
        ));
    }
    // The key file is read like every secret of Silt's: it must be the owner's alone.
    let what = format!("TLS key {}", key.display());
    let (key_pem, shared) = silt_common::secret::read_owner_file(key, 1 << 20, &what)
        .map_err(|e| GatewayError::Config(e.to_string()))?;
    if shared {
        return Err(GatewayError::Config(format!(
            "{what}: readable by group or others; chmod 600 it"
        )));
    }
    let key_der = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
        .map_err(|_| bad("key", key, &"no private key block in the file"))?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let cfg = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad("setup for", cert, &e))?
        .with_no_client_auth()
        .with_single_cert(certs, key_der)
        .map_err(|e| bad("certificate and key", cert, &e))?;
    let mut cfg = cfg;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(cfg)))
}
