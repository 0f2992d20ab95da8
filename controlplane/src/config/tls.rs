//! The `[tls]` section: the certificate pgline shows on its own fronts (the PostgreSQL front
//! after an SSLRequest, the RESP TLS listener), and the CA its RESP clients' certificates must
//! chain to. Also the keys of the other sections that say how each front uses it
//! (`pgwire.tls`, `resp.tls_listen`, `resp.tls_auth_clients`), and [`FrontTls`], which turns
//! the files into rustls server configurations and reloads them.
//!
//! Invariants: a configuration is built whole (chain, key, their match, the client CA) before
//! it replaces the one in use, so a failed reload leaves the old certificate served. The key
//! file must not be readable by group or others (as PostgreSQL and libpq demand). Only the ring
//! provider is used. Thread model: [`FrontTls::reload`] may run from any task; the cores read
//! the shared acceptors once per new connection.

use std::fmt::Write as _;
use std::os::unix::fs::PermissionsExt;
use std::sync::{Arc, Mutex};

use pgline_dataplane::engine::{PgTlsMode, TlsAcceptor, TlsFront};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use serde::{Deserialize, Serialize};

use super::{Config, ConfigError};

#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// PEM certificate chain (leaf first) of the fronts. Empty: no TLS on the fronts.
    pub cert_file: String,
    /// PEM private key of `cert_file` (PKCS#8, PKCS#1 or SEC1); mode 0600 or stricter.
    pub key_file: String,
    /// PEM CA bundle that RESP clients' certificates must chain to
    /// (`resp.tls_auth_clients = optional | yes`).
    pub client_ca_file: String,
}

/// `pgwire.tls`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum PgwireTls {
    /// SSLRequest is answered `N`.
    #[default]
    Off,
    /// SSLRequest is answered `S`; plaintext sessions stay allowed.
    On,
    /// Plaintext StartupMessages are refused (FATAL 28000, PostgreSQL's hostssl-only text).
    Required,
}

/// `resp.tls_auth_clients` (Redis's `tls-auth-clients`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum TlsAuthClients {
    /// No client certificate is asked for (pgline's default; Redis's is `yes`).
    #[default]
    No,
    /// A certificate is asked for; one that is sent must chain to `tls.client_ca_file`.
    Optional,
    /// A certificate chaining to `tls.client_ca_file` is required.
    Yes,
}

/// Why a certificate could not be (re)loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("tls.{key}: cannot read {path}: {reason}")]
    Read {
        key: &'static str,
        path: String,
        reason: String,
    },
    #[error("tls.key_file: {path} is readable by group or others (mode {mode:o}); chmod 600 it")]
    KeyMode { path: String, mode: u32 },
    #[error("tls.{key}: {path} holds no {what}")]
    Empty {
        key: &'static str,
        path: String,
        what: &'static str,
    },
    #[error("tls: the certificate and the key do not belong together, or are not usable: {0}")]
    Mismatch(String),
    #[error("tls.client_ca_file: {0}")]
    ClientCa(String),
}

impl TlsConfig {
    /// Whether the fronts have a certificate.
    pub fn enabled(&self) -> bool {
        !self.cert_file.is_empty()
    }

    /// Shape checks; the files themselves are loaded (and checked) by [`FrontTls::new`].
    pub fn validate(&self) -> Result<(), ConfigError> {
        super::check(
            self.cert_file.is_empty() == self.key_file.is_empty(),
            "tls.key_file",
            "tls.cert_file and tls.key_file are set together",
        )?;
        super::check(
            self.client_ca_file.is_empty() || self.enabled(),
            "tls.client_ca_file",
            "needs tls.cert_file and tls.key_file",
        )
    }
}

/// Checks the TLS keys of the whole config against each other and the transport, and loads
/// the files once so that a bad one stops start-up with its reason.
pub(super) fn validate(cfg: &Config) -> Result<(), ConfigError> {
    cfg.tls.validate()?;
    let wanted = cfg.pgwire.tls != PgwireTls::Off || !cfg.resp.tls_listen.is_empty();
    if !wanted {
        return Ok(());
    }
    if !cfg.tls.enabled() {
        let key = if cfg.pgwire.tls != PgwireTls::Off {
            "pgwire.tls"
        } else {
            "resp.tls_listen"
        };
        return Err(ConfigError::Invalid {
            key,
            reason: "needs a certificate: set tls.cert_file and tls.key_file".into(),
        });
    }
    if cfg.nic.mode != super::NicMode::Kernel {
        return Err(ConfigError::Invalid {
            key: "nic.mode",
            reason: format!(
                "TLS is served on kernel sockets only (nic.mode = \"kernel\"), not with \
                 nic.mode = \"{}\": a userspace core busy-polls one NIC queue for all its flows, \
                 and TLS handshakes plus rustls's per-record allocations on it would stall every \
                 flow of that queue and break the allocation-free packet path; terminate TLS on \
                 a kernel-mode node (see docs/decisions.md)",
                cfg.nic.mode
            ),
        });
    }
    if cfg.resp.tls_auth_clients != TlsAuthClients::No && cfg.tls.client_ca_file.is_empty() {
        return Err(ConfigError::Invalid {
            key: "resp.tls_auth_clients",
            reason: "optional and yes need tls.client_ca_file (the CA client certificates \
                     chain to)"
                .into(),
        });
    }
    build(&cfg.tls, cfg.resp.tls_auth_clients).map_err(|e| ConfigError::Invalid {
        key: "tls",
        reason: e.to_string(),
    })?;
    Ok(())
}

/// What was loaded: for logs and the reload API.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CertInfo {
    pub cert_file: String,
    /// Certificates in the chain (leaf first).
    pub chain: usize,
    /// SHA-256 of the leaf certificate (DER), hex: what `openssl x509 -fingerprint -sha256`
    /// prints, without the colons.
    pub leaf_sha256: String,
}

/// The fronts' TLS: the acceptors the cores read and what reloading them needs.
pub struct FrontTls {
    cfg: TlsConfig,
    auth: TlsAuthClients,
    front: TlsFront,
    loaded: Mutex<CertInfo>,
}

impl std::fmt::Debug for FrontTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrontTls")
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

impl FrontTls {
    /// The fronts' TLS for `cfg`, `None` when neither front uses it.
    pub fn new(cfg: &Config) -> Result<Option<FrontTls>, TlsError> {
        let pg_mode = match cfg.pgwire.tls {
            PgwireTls::Off => PgTlsMode::Off,
            PgwireTls::On => PgTlsMode::On,
            PgwireTls::Required => PgTlsMode::Required,
        };
        let resp_listen = match cfg.resp.tls_listen.as_str() {
            "" => None,
            addr => addr.parse().ok(),
        };
        if !cfg.tls.enabled() || (pg_mode == PgTlsMode::Off && resp_listen.is_none()) {
            return Ok(None);
        }
        let (pg, resp, info) = build(&cfg.tls, cfg.resp.tls_auth_clients)?;
        Ok(Some(FrontTls {
            cfg: cfg.tls.clone(),
            auth: cfg.resp.tls_auth_clients,
            front: TlsFront {
                pg: TlsAcceptor::new(pg),
                pg_mode,
                resp: TlsAcceptor::new(resp),
                resp_listen,
            },
            loaded: Mutex::new(info),
        }))
    }

    /// What the engine is started with.
    pub fn front(&self) -> TlsFront {
        self.front.clone()
    }

    /// Reads the files again; on success new connections get the new certificate, on failure
    /// the old one stays and the error says why.
    pub fn reload(&self) -> Result<CertInfo, TlsError> {
        let (pg, resp, info) = build(&self.cfg, self.auth)?;
        self.front.pg.store(pg);
        self.front.resp.store(resp);
        *self.loaded.lock().unwrap_or_else(|p| p.into_inner()) = info.clone();
        Ok(info)
    }

    /// The certificate in use.
    pub fn loaded(&self) -> CertInfo {
        self.loaded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// The PostgreSQL front's and the RESP front's server configurations from the files.
fn build(
    cfg: &TlsConfig,
    auth: TlsAuthClients,
) -> Result<(Arc<ServerConfig>, Arc<ServerConfig>, CertInfo), TlsError> {
    let chain = read_certs("cert_file", &cfg.cert_file)?;
    let key = read_key(&cfg.key_file)?;
    let info = CertInfo {
        cert_file: cfg.cert_file.clone(),
        chain: chain.len(),
        leaf_sha256: sha256_hex(&chain[0]),
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = || {
        ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Mismatch(e.to_string()))
    };
    let pg = builder()?
        .with_no_client_auth()
        .with_single_cert(chain.clone(), key.clone_key())
        .map_err(|e| TlsError::Mismatch(e.to_string()))?;
    let resp_builder = builder()?;
    let resp = match auth {
        TlsAuthClients::No => resp_builder.with_no_client_auth(),
        TlsAuthClients::Optional | TlsAuthClients::Yes => {
            let mut roots = RootCertStore::empty();
            for ca in read_certs("client_ca_file", &cfg.client_ca_file)? {
                roots
                    .add(ca)
                    .map_err(|e| TlsError::ClientCa(e.to_string()))?;
            }
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone());
            let verifier = if auth == TlsAuthClients::Optional {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            let verifier = verifier
                .build()
                .map_err(|e| TlsError::ClientCa(e.to_string()))?;
            resp_builder.with_client_cert_verifier(verifier)
        }
    };
    let resp = resp
        .with_single_cert(chain, key)
        .map_err(|e| TlsError::Mismatch(e.to_string()))?;
    Ok((Arc::new(pg), Arc::new(resp), info))
}

fn read_certs(key: &'static str, path: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let read_err = |reason: String| TlsError::Read {
        key,
        path: path.into(),
        reason,
    };
    let bytes = std::fs::read(path).map_err(|e| read_err(e.to_string()))?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| read_err(format!("bad PEM: {e}")))?;
    if certs.is_empty() {
        return Err(TlsError::Empty {
            key,
            path: path.into(),
            what: "PEM certificate",
        });
    }
    Ok(certs)
}

fn read_key(path: &str) -> Result<PrivateKeyDer<'static>, TlsError> {
    let read_err = |reason: String| TlsError::Read {
        key: "key_file",
        path: path.into(),
        reason,
    };
    let meta = std::fs::metadata(path).map_err(|e| read_err(e.to_string()))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(TlsError::KeyMode {
            path: path.into(),
            mode,
        });
    }
    let bytes = std::fs::read(path).map_err(|e| read_err(e.to_string()))?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => TlsError::Empty {
            key: "key_file",
            path: path.into(),
            what: "PEM private key",
        },
        e => read_err(format!("bad PEM: {e}")),
    })
}

/// SHA-256 of `bytes` as lowercase hex, with ring's hash through rustls's provider.
fn sha256_hex(bytes: &[u8]) -> String {
    let rustls::SupportedCipherSuite::Tls13(suite) =
        rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256
    else {
        return String::new();
    };
    let digest = suite.common.hash_provider.hash(bytes);
    let mut out = String::with_capacity(64);
    for b in digest.as_ref() {
        let _ = write!(out, "{b:02x}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_of_the_empty_input() {
        assert_eq!(
            sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn missing_files_and_loose_keys_are_named() {
        let dir = std::env::temp_dir().join(format!("pgline-tls-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let key = dir.join("k.pem");
        std::fs::write(&key, "x").expect("write");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let cfg = TlsConfig {
            cert_file: dir.join("absent.crt").display().to_string(),
            key_file: key.display().to_string(),
            client_ca_file: String::new(),
        };
        let e = build(&cfg, TlsAuthClients::No).expect_err("no cert file");
        assert!(
            matches!(
                e,
                TlsError::Read {
                    key: "cert_file",
                    ..
                }
            ),
            "{e}"
        );
        assert!(matches!(
            read_key(&cfg.key_file),
            Err(TlsError::KeyMode { mode: 0o644, .. })
        ));
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        assert!(matches!(
            read_key(&cfg.key_file),
            Err(TlsError::Empty { .. })
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
