//! A throw-away PKI for the TLS tests: a CA, server and client certificates signed by it (or
//! already expired), written as PEM files into a directory the test owns.
//!
//! Keys are ECDSA P-256 (rcgen's default), as docs/operations.md recommends for the fronts.
//! Private keys are written with mode 0600, since PostgreSQL and pgline refuse key files that
//! others can read.

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// How long a leaf certificate is valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Validity {
    /// From 2020 to 2100.
    Current,
    /// From 2001 to 2002: expired.
    Expired,
}

/// A certificate and its key, as PEM files.
#[derive(Debug, Clone)]
pub struct Issued {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A certificate authority that issues certificates into `dir`.
pub struct Ca {
    dir: PathBuf,
    /// The CA certificate (PEM), the trust anchor to hand to the other side.
    pub cert: PathBuf,
    issuer: Issuer<'static, KeyPair>,
}

impl Ca {
    /// A new self-signed CA named `name`, its certificate written to `dir/<stem>.crt`.
    pub fn new(dir: &Path, stem: &str, name: &str) -> Ca {
        fs::create_dir_all(dir).expect("create the PKI directory");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().expect("CA key");
        let cert = params.self_signed(&key).expect("self-sign the CA");
        let path = dir.join(format!("{stem}.crt"));
        fs::write(&path, cert.pem()).expect("write the CA certificate");
        Ca {
            dir: dir.to_path_buf(),
            cert: path,
            issuer: Issuer::new(params, key),
        }
    }

    /// A server certificate for `names` (DNS names, or IP addresses written as such), written
    /// to `<stem>.crt` and `<stem>.key`.
    pub fn server(&self, stem: &str, names: &[&str], validity: Validity) -> Issued {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let common_name = names.first().cloned().unwrap_or_else(|| stem.to_string());
        self.leaf(
            stem,
            names,
            &common_name,
            ExtendedKeyUsagePurpose::ServerAuth,
            validity,
        )
    }

    /// A client certificate whose common name is `common_name` (PostgreSQL's
    /// `clientcert=verify-full` compares it with the user name).
    pub fn client(&self, stem: &str, common_name: &str, validity: Validity) -> Issued {
        self.leaf(
            stem,
            Vec::new(),
            common_name,
            ExtendedKeyUsagePurpose::ClientAuth,
            validity,
        )
    }

    fn leaf(
        &self,
        stem: &str,
        names: Vec<String>,
        common_name: &str,
        usage: ExtendedKeyUsagePurpose,
        validity: Validity,
    ) -> Issued {
        let mut params = CertificateParams::new(names).expect("leaf params");
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![usage];
        let (from, to) = match validity {
            Validity::Current => (2020, 2100),
            Validity::Expired => (2001, 2002),
        };
        params.not_before = rcgen::date_time_ymd(from, 1, 1);
        params.not_after = rcgen::date_time_ymd(to, 1, 1);
        let key = KeyPair::generate().expect("leaf key");
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("sign the leaf certificate");
        let issued = Issued {
            cert: self.dir.join(format!("{stem}.crt")),
            key: self.dir.join(format!("{stem}.key")),
        };
        fs::write(&issued.cert, cert.pem()).expect("write the certificate");
        write_private(&issued.key, key.serialize_pem().as_bytes());
        issued
    }
}

/// Writes `bytes` to `path` with mode 0600 (replacing what was there).
pub fn write_private(path: &Path, bytes: &[u8]) {
    let _ = fs::remove_file(path);
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .expect("create the key file");
    file.write_all(bytes).expect("write the key file");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issues_pem_files_with_private_keys() {
        let dir = std::env::temp_dir().join(format!("pgline-pki-{}", std::process::id()));
        let ca = Ca::new(&dir, "ca", "pgline test CA");
        let server = ca.server("server", &["localhost", "127.0.0.1"], Validity::Current);
        let client = ca.client("client", "alice", Validity::Expired);
        for path in [&ca.cert, &server.cert, &client.cert] {
            assert!(fs::read_to_string(path)
                .unwrap()
                .starts_with("-----BEGIN CERTIFICATE-----"));
        }
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata(&server.key).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(fs::read_to_string(&client.key)
            .unwrap()
            .contains("PRIVATE KEY"));
        fs::remove_dir_all(&dir).unwrap();
    }
}
