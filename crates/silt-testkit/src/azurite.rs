//! [`Azurite`]: a real Azure Blob Storage emulator (Azurite's blob service) on a free loopback
//! port, with the well-known development account, for tests that must talk to Azure Blob.
//!
//! Only the Blob endpoint exists: Azurite does not emulate Data Lake Storage Gen2 (the `dfs`
//! endpoint, hierarchical namespace), so an ADLS client cannot be tested against it.
//!
//! ```ignore
//! let az = silt_testkit::Azurite::start();
//! az.create_container("data");
//! // endpoint az.endpoint(), account az.account_name(), key az.account_key()
//! ```

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Child, Command};

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use hmac::{KeyInit, Mac};
use tempfile::TempDir;

use crate::gcs::{deps_dir, http_request, HttpResponse};
use crate::{kill, start_on_free_port, Launch};

/// Azurite's built-in development account, the same in every Azurite and documented by Azure.
const ACCOUNT: &str = "devstoreaccount1";
const ACCOUNT_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
/// The REST API version the set-up calls use (Azurite also runs with `--skipApiVersionCheck`,
/// so clients newer than this Azurite work too).
const API_VERSION: &str = "2021-08-06";
const LOG: &str = "azurite.log";

/// A running Azurite blob service on `127.0.0.1`, keeping its data in a fresh temporary
/// directory.
///
/// Dropping it kills the process and deletes the directory, also when a test panics.
pub struct Azurite {
    child: Child,
    port: u16,
    // Declared last: dropped after `Drop::drop` has killed the process that writes into it.
    dir: TempDir,
}

impl Azurite {
    /// Starts Azurite, panicking with the reason (and its log) if it cannot.
    pub fn start() -> Azurite {
        Azurite::try_start().unwrap_or_else(|e| panic!("cannot start Azurite: {e}"))
    }

    /// Starts Azurite's blob service and waits until it answers HTTP requests.
    pub fn try_start() -> Result<Azurite, String> {
        let binary = azurite_path()?;
        let ip = Ipv4Addr::LOCALHOST;
        let dir = tempfile::Builder::new()
            .prefix("silt-azurite-")
            .tempdir()
            .map_err(|e| format!("creating a temporary directory: {e}"))?;
        let data = dir.path().join("data");
        std::fs::create_dir(&data).map_err(|e| format!("creating {}: {e}", data.display()))?;
        let log_path = dir.path().join(LOG);
        let launch = Launch {
            name: "Azurite",
            ip,
            log_path: &log_path,
            // AZURITE_DB would move the metadata into an external database and
            // AZURITE_ACCOUNTS replace the development account.
            env_prefix: "AZURITE_",
            port_taken: "EADDRINUSE",
        };
        let command = |port: u16| {
            let mut cmd = Command::new(&binary);
            cmd.args([
                "--blobHost",
                &ip.to_string(),
                "--blobPort",
                &port.to_string(),
            ])
            .arg("--location")
            .arg(&data)
            // Without it Azurite sends usage data to an Azure host on the internet.
            .arg("--disableTelemetry")
            // The account is the first path segment, whatever the Host header says.
            .arg("--disableProductStyleUrl")
            .args(["--skipApiVersionCheck", "--loose", "--silent"])
            .current_dir(dir.path());
            cmd
        };
        let (child, port) = start_on_free_port(&launch, command, answers)?;
        Ok(Azurite { child, port, dir })
    }

    /// `http://127.0.0.1:PORT/devstoreaccount1`, the account's blob endpoint (path style).
    pub fn endpoint(&self) -> String {
        format!("http://{}/{ACCOUNT}", self.addr())
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn account_name(&self) -> &str {
        ACCOUNT
    }

    /// The development account's key (base64), for SharedKey signing.
    pub fn account_key(&self) -> &str {
        ACCOUNT_KEY
    }

    /// A connection string for Azure SDKs and tools (`AZURE_STORAGE_CONNECTION_STRING`).
    pub fn connection_string(&self) -> String {
        format!(
            "DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};\
             BlobEndpoint={};",
            self.endpoint()
        )
    }

    /// Creates an empty container (3 to 63 lowercase letters, digits and dashes), panicking
    /// with the reason if Azurite refuses.
    pub fn create_container(&self, name: &str) {
        self.try_create_container(name)
            .unwrap_or_else(|e| panic!("creating Azure container {name}: {e}\n{}", self.log()));
    }

    /// Creates an empty container (`PUT /{account}/{name}?restype=container`, SharedKey-signed).
    pub fn try_create_container(&self, name: &str) -> Result<(), String> {
        let r = self.signed_request("PUT", name, &[("restype", "container")], &[], b"")?;
        if r.status == 201 {
            Ok(())
        } else {
            Err(format!("HTTP {}: {}", r.status, r.body_text()))
        }
    }

    /// What Azurite has logged so far (for assertion messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join(LOG)).unwrap_or_default()
    }

    /// A request on `/{account}/{path}` with `query` (plain names and values, no escaping
    /// needed), signed with the account key. `headers` may add `x-ms-*` and `Content-Type`.
    fn signed_request(
        &self,
        method: &str,
        path: &str,
        query: &[(&str, &str)],
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<HttpResponse, String> {
        let date = httpdate::fmt_http_date(std::time::SystemTime::now());
        let mut all: Vec<(&str, &str)> = vec![("x-ms-date", &date), ("x-ms-version", API_VERSION)];
        all.extend_from_slice(headers);
        let resource = format!("/{ACCOUNT}/{}", path.trim_start_matches('/'));
        let auth = shared_key(
            ACCOUNT,
            ACCOUNT_KEY,
            method,
            &resource,
            query,
            &all,
            body.len(),
        )?;
        all.push(("Authorization", &auth));
        let mut target = resource.clone();
        for (i, (k, v)) in query.iter().enumerate() {
            target.push(if i == 0 { '?' } else { '&' });
            target.push_str(&format!("{k}={v}"));
        }
        http_request(self.addr(), method, &target, &all, body)
    }
}

impl Drop for Azurite {
    fn drop(&mut self) {
        kill(&mut self.child);
    }
}

/// The `Authorization` header of Azure Storage's SharedKey scheme: HMAC-SHA256, keyed with the
/// decoded account key, of the verb, the standard headers in a fixed order, the `x-ms-*`
/// headers and the resource. `path` is the request path; on the emulator it starts with the
/// account, which so appears twice in the canonical resource (as Azure documents).
fn shared_key(
    account: &str,
    key: &str,
    method: &str,
    path: &str,
    query: &[(&str, &str)],
    headers: &[(&str, &str)],
    content_length: usize,
) -> Result<String, String> {
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map_or("", |(_, v)| *v)
    };
    // Since API version 2015-02-21 a zero length is signed as an empty string.
    let length = if content_length == 0 {
        String::new()
    } else {
        content_length.to_string()
    };
    let mut to_sign = format!(
        "{method}\n{}\n{}\n{length}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n",
        header("Content-Encoding"),
        header("Content-Language"),
        header("Content-MD5"),
        header("Content-Type"),
        header("Date"),
        header("If-Modified-Since"),
        header("If-Match"),
        header("If-None-Match"),
        header("If-Unmodified-Since"),
        header("Range"),
    );
    let mut ms: Vec<(String, &str)> = headers
        .iter()
        .filter(|(k, _)| k.to_ascii_lowercase().starts_with("x-ms-"))
        .map(|(k, v)| (k.to_ascii_lowercase(), v.trim()))
        .collect();
    ms.sort();
    for (k, v) in ms {
        to_sign.push_str(&format!("{k}:{v}\n"));
    }
    to_sign.push_str(&format!("/{account}{path}"));
    let mut params: Vec<(String, &str)> = query
        .iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), *v))
        .collect();
    params.sort();
    for (k, v) in params {
        to_sign.push_str(&format!("\n{k}:{v}"));
    }
    let key = B64
        .decode(key)
        .map_err(|e| format!("account key is not base64: {e}"))?;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&key)
        .map_err(|e| format!("account key: {e}"))?;
    mac.update(to_sign.as_bytes());
    let signature = B64.encode(mac.finalize().into_bytes());
    Ok(format!("SharedKey {account}:{signature}"))
}

/// Whether Azurite answers HTTP (an unsigned request gets a 4xx, which is an answer).
fn answers(addr: SocketAddr) -> bool {
    http_request(addr, "GET", &format!("/{ACCOUNT}?comp=list"), &[], b"").is_ok()
}

/// Azurite's blob service: `$SILT_AZURITE` (an `azurite-blob` executable), then
/// `<workspace>/.deps/azurite/node_modules/.bin/azurite-blob`, then `azurite-blob` on PATH.
pub fn azurite_path() -> Result<PathBuf, String> {
    crate::find_tool(
        "SILT_AZURITE",
        &[deps_dir().join("azurite/node_modules/.bin/azurite-blob")],
        "azurite-blob",
        "./scripts/install-deps.sh installs Azurite into .deps/azurite",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_answers_and_cleans_up() {
        let az = Azurite::start();
        assert!(az.endpoint().starts_with("http://127.0.0.1:"));
        assert!(az.endpoint().ends_with("/devstoreaccount1"));
        az.create_container("box1");
        let blob = [
            ("x-ms-blob-type", "BlockBlob"),
            ("Content-Type", "text/plain"),
        ];
        let put = az
            .signed_request("PUT", "box1/dir/hello.txt", &[], &blob, b"hello azure")
            .unwrap_or_else(|e| panic!("{e}\n{}", az.log()));
        assert_eq!(put.status, 201, "{}\n{}", put.body_text(), az.log());
        let get = az
            .signed_request("GET", "box1/dir/hello.txt", &[], &[], b"")
            .unwrap_or_else(|e| panic!("{e}\n{}", az.log()));
        assert_eq!(get.status, 200, "{}\n{}", get.body_text(), az.log());
        assert_eq!(get.body, b"hello azure");
        let err = az
            .try_create_container("box1")
            .expect_err("container exists");
        assert!(err.contains("409"), "{err}");
        // An unsigned request is refused: the server really checks authorization.
        let unsigned = http_request(
            az.addr(),
            "GET",
            "/devstoreaccount1/box1/dir/hello.txt",
            &[],
            b"",
        )
        .expect("answers");
        assert_eq!(unsigned.status / 100, 4, "{}", unsigned.body_text());
        let dir = az.dir.path().to_path_buf();
        let addr = az.addr();
        drop(az);
        assert!(!dir.exists(), "temporary directory removed");
        assert!(!answers(addr), "process killed");
    }
}
