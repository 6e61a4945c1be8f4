//! Optional encryption of worker TCP connections (`cluster_tls`), TLS 1.3 through rustls.
//!
//! Membership is proven by the cluster secret ([`crate::auth`]), not by certificates, so there
//! is no cluster CA to run or rotate: each worker makes an ephemeral self-signed certificate
//! when its first TLS connection arrives, and a client accepts whatever certificate a worker
//! shows. What stops a machine in the middle is channel binding: inside TLS, both proofs of
//! the cluster secret also cover 32 bytes exported from the TLS session (RFC 8446 §7.5,
//! RFC 9266's idea). A relay terminating TLS on both sides holds two sessions with two
//! different exports, so neither side's proof verifies on the other; without the secret it
//! cannot make its own. The upgrade happens after the worker's plaintext challenge
//! (`{"op": "starttls"}` instead of an answer), so plaintext clients and the raw protocol are
//! unchanged, and a client that wants TLS never sends anything else in the clear.

use std::sync::{Arc, OnceLock};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, ServerConfig, SignatureScheme};
use silt_common::{Error, ErrorKind, Result};
use tokio::net::TcpStream;

/// The name a worker's certificate carries and a client asks for (identity is the secret's).
const SERVER_NAME: &str = "silt-worker";
/// Label of the exported keying material both proofs of the secret cover.
const EXPORTER_LABEL: &[u8] = b"EXPORTER-silt-cluster-auth-v1";
/// Bytes exported from a session for the channel binding.
pub const BINDING_LEN: usize = 32;

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

fn tls_error(what: &str, e: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Unavailable, format!("{what}: {e}"))
}

/// The client side's configuration, made once per process.
fn client_config() -> Result<Arc<ClientConfig>> {
    static CONFIG: OnceLock<std::result::Result<Arc<ClientConfig>, String>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let p = provider();
            let cfg = ClientConfig::builder_with_provider(p.clone())
                .with_protocol_versions(&[&rustls::version::TLS13])
                .map_err(|e| e.to_string())?
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyWorkerCertificate(p)))
                .with_no_client_auth();
            Ok(Arc::new(cfg))
        })
        .clone()
        .map_err(|e| tls_error("setting up TLS for worker connections", e))
}

/// The worker side's configuration and its ephemeral certificate, made at the first TLS
/// connection (a worker no client asks for TLS never makes one).
fn server_config() -> Result<Arc<ServerConfig>> {
    static CONFIG: OnceLock<std::result::Result<Arc<ServerConfig>, String>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let made = rcgen::generate_simple_self_signed(vec![SERVER_NAME.to_string()])
                .map_err(|e| format!("making the worker's certificate: {e}"))?;
            let key = PrivateKeyDer::Pkcs8(made.signing_key.serialize_der().into());
            let cfg = ServerConfig::builder_with_provider(provider())
                .with_protocol_versions(&[&rustls::version::TLS13])
                .map_err(|e| e.to_string())?
                .with_no_client_auth()
                .with_single_cert(vec![made.cert.der().clone()], key)
                .map_err(|e| e.to_string())?;
            Ok(Arc::new(cfg))
        })
        .clone()
        .map_err(|e| tls_error("setting up TLS for the worker port", e))
}

/// The session's channel binding: bytes both ends export from it, and no one else can.
fn binding<D>(session: &rustls::ConnectionCommon<D>) -> Result<[u8; BINDING_LEN]> {
    let mut out = [0u8; BINDING_LEN];
    session
        .export_keying_material(&mut out, EXPORTER_LABEL, None)
        .map_err(|e| tls_error("TLS channel binding", e))?;
    Ok(out)
}

/// `handshake`, within the time the cluster handshake is allowed: a silent peer cannot hold a
/// connection (or a worker's connection slot) in it.
async fn bounded<T>(handshake: impl std::future::Future<Output = T>) -> Result<T> {
    tokio::time::timeout(crate::auth::HANDSHAKE_TIMEOUT, handshake)
        .await
        .map_err(|_| Error::new(ErrorKind::Timeout, "TLS handshake timed out"))
}

/// Client side: TLS over `s` (after the worker was asked with `starttls`) and the session's
/// channel binding.
pub async fn connect(
    s: TcpStream,
) -> Result<(
    tokio_rustls::client::TlsStream<TcpStream>,
    [u8; BINDING_LEN],
)> {
    let name = ServerName::try_from(SERVER_NAME).map_err(|e| Error::internal(e.to_string()))?;
    let tls = bounded(tokio_rustls::TlsConnector::from(client_config()?).connect(name, s))
        .await?
        .map_err(|e| tls_error("TLS handshake with the worker (is it a Silt worker?)", e))?;
    let binding = binding(tls.get_ref().1)?;
    Ok((tls, binding))
}

/// Worker side: TLS over `s` (the client asked with `starttls`) and the session's channel
/// binding.
pub async fn accept(
    s: TcpStream,
) -> Result<(
    tokio_rustls::server::TlsStream<TcpStream>,
    [u8; BINDING_LEN],
)> {
    let tls = bounded(tokio_rustls::TlsAcceptor::from(server_config()?).accept(s))
        .await?
        .map_err(|e| tls_error("TLS handshake with a client", e))?;
    let binding = binding(tls.get_ref().1)?;
    Ok((tls, binding))
}

/// Accepts any certificate a worker shows (it is ephemeral and self-signed; see the module
/// doc for what proves the worker instead) but still checks the handshake's signatures, so the
/// worker holds the key of the certificate it sent.
#[derive(Debug)]
struct AnyWorkerCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyWorkerCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        // Only TLS 1.3 is offered: a 1.2 handshake is a protocol violation.
        Err(rustls::Error::PeerIncompatible(
            rustls::PeerIncompatible::Tls12NotOffered,
        ))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
