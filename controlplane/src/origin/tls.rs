//! TLS to the origin: the settings built once from `origin.url`, the certificate checks libpq's
//! `sslmode` asks for, and the messages that say why a handshake failed.
//!
//! Purpose: one `rustls::ClientConfig` ([`OriginTls::config`]) serves every connection pgline
//! opens to its origin: the raw connector's (replication stream, relay, cancels) and
//! `tokio-postgres`'s (fills, catalog, slots, through [`OriginTls::pg_tls`]). `tokio-postgres`
//! only negotiates (it knows `sslmode` up to `require`); what `verify-ca` and `verify-full`
//! add is this module's [`Verifier`].
//!
//! | sslmode | certificate check |
//! |---|---|
//! | `prefer`, `require` | none (handshake signatures are still checked), unless `sslrootcert` names a file: then the chain, as libpq's `require` does |
//! | `verify-ca` | the chain to `sslrootcert` (a file, or the platform store) |
//! | `verify-full` | the chain and the host name (`sslrootcert=system` forces this mode) |
//!
//! Invariants: the crypto provider is always `ring`, passed explicitly (no process-wide
//! default is needed); a client key file readable by group or others is refused, as libpq
//! refuses it; every certificate rejection names its cause (untrusted issuer, host name,
//! expiry) in the error's text, whichever client (raw or `tokio-postgres`) made the handshake.
//!
//! Thread model: built once at start; shared read-only (`Arc`).

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};

use super::url::{SslMode, TlsKeys};

/// How much of the origin's certificate is checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// Only that the handshake is signed by the key of the certificate presented.
    None,
    /// The chain to a trusted CA (and the validity dates), not the host name.
    Chain,
    /// The chain and the host name.
    Full,
}

/// The TLS settings of the origin connections (see the module doc).
#[derive(Clone)]
pub struct OriginTls {
    /// `sslmode` as given (or `prefer`).
    pub mode: SslMode,
    /// What the verifier checks.
    pub check: Check,
    /// Where the trusted CAs come from, for messages (`none`, `system`, a file name).
    pub roots: String,
    /// `sslnegotiation=direct`.
    pub direct: bool,
    /// A client certificate is presented.
    pub client_cert: bool,
    /// The client configuration every origin handshake uses.
    pub config: Arc<rustls::ClientConfig>,
}

impl fmt::Debug for OriginTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OriginTls")
            .field("mode", &self.mode)
            .field("check", &self.check)
            .field("roots", &self.roots)
            .field("direct", &self.direct)
            .field("client_cert", &self.client_cert)
            .finish()
    }
}

/// The `tokio-postgres` TLS connector of the origin connections.
pub type PgTls = tokio_postgres_rustls::MakeRustlsConnect;

/// The crypto provider of every origin handshake.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl OriginTls {
    /// Builds the settings from the TLS keys of `origin.url` (reads the files they name).
    pub fn new(keys: &TlsKeys) -> Result<OriginTls, String> {
        let mut mode = keys.mode;
        let system = keys.root_cert.as_deref() == Some("system");
        if system {
            if keys.mode_given && mode != SslMode::VerifyFull {
                return Err(format!(
                    "sslrootcert=system needs sslmode=verify-full (not {}): the platform's CAs \
                     vouch for host names, not for a chain alone",
                    mode.as_str()
                ));
            }
            mode = SslMode::VerifyFull;
        }
        if keys.direct && mode < SslMode::Require {
            return Err(format!(
                "sslnegotiation=direct needs sslmode=require or stronger (not {})",
                mode.as_str()
            ));
        }
        let provider = provider();
        let (check, roots, store) = match (&keys.root_cert, mode) {
            (_, SslMode::Disable) => (Check::None, "none".to_owned(), None),
            (Some(file), m) if !system => {
                let check = if m == SslMode::VerifyFull {
                    Check::Full
                } else {
                    Check::Chain
                };
                (check, file.clone(), Some(load_roots(file)?))
            }
            (_, SslMode::VerifyCa | SslMode::VerifyFull) => {
                let check = if mode == SslMode::VerifyFull {
                    Check::Full
                } else {
                    Check::Chain
                };
                (check, "system".to_owned(), Some(system_roots()?))
            }
            _ => (Check::None, "none".to_owned(), None),
        };
        let webpki = match store {
            Some(store) => Some(
                WebPkiServerVerifier::builder_with_provider(Arc::new(store), provider.clone())
                    .build()
                    .map_err(|e| format!("sslrootcert={roots}: {e}"))?,
            ),
            None => None,
        };
        let verifier = Arc::new(Verifier {
            check,
            roots: roots.clone(),
            webpki,
            provider: provider.clone(),
        });
        let versions: &[&rustls::SupportedProtocolVersion] = match (keys.min_tls13, keys.max_tls12)
        {
            (true, true) => {
                return Err(
                    "ssl_min_protocol_version=TLSv1.3 with ssl_max_protocol_version=TLSv1.2 \
                     leaves no version"
                        .into(),
                )
            }
            (true, false) => &[&rustls::version::TLS13],
            (false, true) => &[&rustls::version::TLS12],
            (false, false) => &[&rustls::version::TLS13, &rustls::version::TLS12],
        };
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(versions)
            .map_err(|e| format!("TLS versions: {e}"))?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let mut config = match (&keys.cert, &keys.key) {
            (Some(cert), Some(key)) => {
                let (chain, key_der) = load_client_cert(cert, key)?;
                builder
                    .with_client_auth_cert(chain, key_der)
                    .map_err(|e| format!("sslcert={cert} / sslkey={key}: {e}"))?
            }
            (None, None) => builder.with_no_client_auth(),
            _ => return Err("sslcert and sslkey go together: give both or neither".into()),
        };
        config.enable_sni = keys.sni;
        if keys.direct {
            config.alpn_protocols = vec![b"postgresql".to_vec()];
        }
        Ok(OriginTls {
            mode,
            check,
            roots,
            direct: keys.direct,
            client_cert: keys.cert.is_some(),
            config: Arc::new(config),
        })
    }

    /// Whether connections must be encrypted (`require` or stronger).
    pub fn required(&self) -> bool {
        self.mode >= SslMode::Require
    }

    /// Whether connections are encrypted when the origin agrees (anything but `disable`).
    pub fn wanted(&self) -> bool {
        self.mode != SslMode::Disable
    }

    /// The `tokio-postgres` connector on the same client configuration.
    pub fn pg_tls(&self) -> PgTls {
        tokio_postgres_rustls::MakeRustlsConnect::new((*self.config).clone())
    }
}

/// Reads a PEM file of CA certificates.
fn load_roots(file: &str) -> Result<RootCertStore, String> {
    let mut store = RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(file)
        .map_err(|e| format!("sslrootcert={file}: {e}"))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("sslrootcert={file}: {e}"))?;
    let (added, _) = store.add_parsable_certificates(certs);
    if added == 0 {
        return Err(format!("sslrootcert={file}: no CA certificate in the file"));
    }
    Ok(store)
}

/// The platform's CA store.
fn system_roots() -> Result<RootCertStore, String> {
    let found = rustls_native_certs::load_native_certs();
    let mut store = RootCertStore::empty();
    let (added, _) = store.add_parsable_certificates(found.certs);
    if added == 0 {
        return Err(format!(
            "no CA certificate in the platform's store ({} errors); give sslrootcert=<file>",
            found.errors.len()
        ));
    }
    Ok(store)
}

/// Reads the client certificate chain and its key; refuses a key others can read (libpq's
/// rule: 0600 or less, or 0640 or less when root owns it).
fn load_client_cert(
    cert: &str,
    key: &str,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(key).map_err(|e| format!("sslkey={key}: {e}"))?;
    let too_open = if meta.uid() == 0 {
        meta.mode() & 0o037 != 0
    } else {
        meta.mode() & 0o077 != 0
    };
    if too_open {
        return Err(format!(
            "sslkey={key} has group or world access (mode {:o}): it must be 0600 or less \
             (chmod 600 {key})",
            meta.mode() & 0o777
        ));
    }
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(|e| format!("sslcert={cert}: {e}"))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("sslcert={cert}: {e}"))?;
    if chain.is_empty() {
        return Err(format!("sslcert={cert}: no certificate in the file"));
    }
    let key_der = PrivateKeyDer::from_pem_file(Path::new(key))
        .map_err(|e| format!("sslkey={key}: {e} (an unencrypted PEM key is needed)"))?;
    Ok((chain, key_der))
}

/// Why pgline rejected the origin's certificate: the text of the handshake error.
#[derive(Debug)]
pub struct CertRejected(pub String);

impl fmt::Display for CertRejected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CertRejected {}

/// The origin certificate checks of one `sslmode` (see the module doc).
#[derive(Debug)]
struct Verifier {
    check: Check,
    roots: String,
    webpki: Option<Arc<WebPkiServerVerifier>>,
    provider: Arc<CryptoProvider>,
}

impl Verifier {
    /// `e` as a rejection that names its cause.
    fn explain(&self, e: rustls::Error, host: &ServerName<'_>) -> rustls::Error {
        let host = host.to_str();
        let msg = match &e {
            rustls::Error::InvalidCertificate(c) => match c {
                CertificateError::UnknownIssuer => format!(
                    "the origin's certificate is not signed by a trusted CA (sslrootcert={})",
                    self.roots
                ),
                CertificateError::Expired => "the origin's certificate has expired".to_owned(),
                CertificateError::ExpiredContext { not_after, .. } => format!(
                    "the origin's certificate expired at {}",
                    utc(not_after.as_secs())
                ),
                CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                    "the origin's certificate is not valid yet (check the clocks)".to_owned()
                }
                CertificateError::NotValidForName => {
                    format!("the origin's certificate is not valid for host '{host}'")
                }
                CertificateError::NotValidForNameContext { presented, .. } => format!(
                    "the origin's certificate is not valid for host '{host}' (it names {})",
                    if presented.is_empty() {
                        "no host".to_owned()
                    } else {
                        presented
                            .iter()
                            .map(|p| name_text(p))
                            .collect::<Vec<_>>()
                            .join(", ")
                    }
                ),
                other => format!("the origin's certificate was rejected: {other}"),
            },
            other => format!("the origin's certificate was rejected: {other}"),
        };
        rustls::Error::Other(rustls::OtherError(Arc::new(CertRejected(msg))))
    }
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(webpki) = self.webpki.as_ref().filter(|_| self.check != Check::None) else {
            return Ok(ServerCertVerified::assertion());
        };
        match webpki.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Ok(v) => Ok(v),
            // webpki checks the chain (and dates) before the name: a name error means the
            // chain is good, which is all verify-ca asks.
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if self.check == Check::Chain => Ok(ServerCertVerified::assertion()),
            Err(e) => Err(self.explain(e, server_name)),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// The text of a failed origin handshake: the cause pgline's verifier named, or rustls' own.
pub fn describe(e: &std::io::Error) -> String {
    let inner = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>());
    match inner {
        Some(rustls::Error::Other(o)) => match o.0.downcast_ref::<CertRejected>() {
            Some(r) => r.0.clone(),
            None => o.to_string(),
        },
        Some(rustls::Error::AlertReceived(a)) => format!(
            "the origin refused the handshake ({a:?}){}",
            match a {
                rustls::AlertDescription::CertificateRequired
                | rustls::AlertDescription::UnknownCA
                | rustls::AlertDescription::BadCertificate => {
                    ": it asks for a client certificate it trusts (sslcert/sslkey)"
                }
                _ => "",
            }
        ),
        Some(other) => other.to_string(),
        None => e.to_string(),
    }
}

/// A name webpki presents (`DnsName("db.example")`, `IpAddress(10.0.0.1)`) as plain text.
fn name_text(presented: &str) -> &str {
    let inner = match (presented.find('('), presented.rfind(')')) {
        (Some(a), Some(b)) if a < b => &presented[a + 1..b],
        _ => presented,
    };
    inner.trim_matches('"')
}

/// `secs` since the UNIX epoch as `YYYY-MM-DD HH:MM:SS UTC`.
pub fn utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presented_names_read_plainly() {
        assert_eq!(name_text("DnsName(\"localhost\")"), "localhost");
        assert_eq!(name_text("IpAddress(10.0.0.1)"), "10.0.0.1");
        assert_eq!(name_text("db"), "db");
    }

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(1_014_940_799), "2002-02-28 23:59:59 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00 UTC");
    }

    #[test]
    fn modes_pick_their_checks() {
        let k = |mode, root: Option<&str>| TlsKeys {
            mode,
            mode_given: true,
            root_cert: root.map(str::to_owned),
            ..TlsKeys::default()
        };
        assert_eq!(
            OriginTls::new(&k(SslMode::Prefer, None)).unwrap().check,
            Check::None
        );
        assert_eq!(
            OriginTls::new(&k(SslMode::Require, None)).unwrap().check,
            Check::None
        );
        let e = OriginTls::new(&k(SslMode::Require, Some("system"))).unwrap_err();
        assert!(e.contains("verify-full"), "{e}");
        let e = OriginTls::new(&k(SslMode::VerifyCa, Some("/nonexistent/ca.crt"))).unwrap_err();
        assert!(e.contains("/nonexistent/ca.crt"), "{e}");
        let e = OriginTls::new(&TlsKeys {
            direct: true,
            ..TlsKeys::default()
        })
        .unwrap_err();
        assert!(e.contains("sslnegotiation=direct"), "{e}");
    }

    #[test]
    fn a_readable_client_key_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("pgline-tls-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = dir.join("k.key");
        std::fs::write(&key, "not a key").unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = load_client_cert("/nonexistent", key.to_str().unwrap()).unwrap_err();
        assert!(e.contains("group or world access"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
