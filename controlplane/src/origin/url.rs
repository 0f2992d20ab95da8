//! Reading `origin.url`: the libpq keys `tokio-postgres` does not know, taken out before it
//! parses the rest.
//!
//! Purpose: `origin.url` is a libpq connection string, in either form (`key=value ...` or a
//! `postgres://` URI). `tokio-postgres` 0.7 knows only `sslmode=disable|prefer|require` and
//! none of `sslrootcert`, `sslcert`, `sslkey`, `sslsni`, `ssl_min_protocol_version`; it knows
//! `target_session_attrs=any|read-write|read-only` only. [`split`] takes the TLS keys out (into
//! [`TlsKeys`]), maps `sslmode` to what `tokio-postgres` can do (pgline's own certificate
//! verifier does the rest, see `origin::tls`), refuses what pgline cannot honour with a message
//! naming the key, and hands back the string for `tokio-postgres` to parse.
//!
//! Invariants: the `key=value` form is tokenised with libpq's quoting (`'...'`, `\'`, `\\`),
//! and every value kept is written back quoted, so no value can change meaning; in a URI only
//! the query string is touched (the authority, with its multi-host list, IPv6 brackets and
//! password, passes through untouched), and the values taken out are percent-decoded.

use std::fmt::Write as _;

/// libpq's `sslmode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// What `tokio-postgres` is told: it negotiates, pgline's verifier checks.
    pub fn for_tokio_postgres(self) -> tokio_postgres::config::SslMode {
        use tokio_postgres::config::SslMode as T;
        match self {
            SslMode::Disable => T::Disable,
            SslMode::Prefer => T::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => T::Require,
        }
    }
}

/// libpq's `target_session_attrs`, as far as pgline honours it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SessionAttrs {
    /// The first host that accepts the connection.
    #[default]
    Any,
    /// A host that accepts writes (not in hot standby, `default_transaction_read_only` off).
    ReadWrite,
    /// A host that does not.
    ReadOnly,
}

/// The TLS keys of `origin.url` (libpq's names and defaults).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsKeys {
    /// `sslmode` (default `prefer`, as libpq's).
    pub mode: SslMode,
    /// Whether `sslmode` was given (an absent one is `prefer`).
    pub mode_given: bool,
    /// `sslrootcert`: a PEM file of trusted CAs, or `system` (the platform's store).
    pub root_cert: Option<String>,
    /// `sslcert` / `sslkey`: the client certificate and its key (PEM).
    pub cert: Option<String>,
    pub key: Option<String>,
    /// `sslsni` (default on).
    pub sni: bool,
    /// `ssl_min_protocol_version` / `ssl_max_protocol_version`: `TLSv1.2` or `TLSv1.3`.
    pub min_tls13: bool,
    pub max_tls12: bool,
    /// `sslnegotiation=direct` (PG17+: TLS from the first byte, ALPN `postgresql`).
    pub direct: bool,
}

impl Default for TlsKeys {
    fn default() -> TlsKeys {
        TlsKeys {
            mode: SslMode::Prefer,
            mode_given: false,
            root_cert: None,
            cert: None,
            key: None,
            sni: true,
            min_tls13: false,
            max_tls12: false,
            direct: false,
        }
    }
}

/// `origin.url` split: the TLS keys, the session attributes, and what `tokio-postgres` parses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Split {
    pub tls: TlsKeys,
    pub attrs: SessionAttrs,
    /// The connection string without the keys taken out (same form as the input).
    pub rest: String,
}

/// A key of `origin.url` pgline cannot honour, or a malformed string.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UrlError(pub String);

fn err(msg: impl Into<String>) -> UrlError {
    UrlError(msg.into())
}

/// Splits `url` (either form). See the module doc.
pub fn split(url: &str) -> Result<Split, UrlError> {
    let trimmed = url.trim_start();
    if trimmed.starts_with("postgres://") || trimmed.starts_with("postgresql://") {
        split_uri(trimmed)
    } else {
        split_key_value(url)
    }
}

/// What becomes of one key.
enum Keep {
    /// Passed on to `tokio-postgres` unchanged.
    Pass,
    /// Taken out.
    Drop,
}

/// Takes `key = value` into `out` when it is one of the keys pgline reads itself.
fn take(key: &str, value: &str, out: &mut Split) -> Result<Keep, UrlError> {
    let t = &mut out.tls;
    match key {
        "sslmode" => {
            t.mode = match value {
                "disable" => SslMode::Disable,
                "prefer" => SslMode::Prefer,
                "require" => SslMode::Require,
                "verify-ca" => SslMode::VerifyCa,
                "verify-full" => SslMode::VerifyFull,
                "allow" => {
                    return Err(err(
                        "sslmode=allow is not supported (it tries plaintext first): use \
                         prefer, require, verify-ca or verify-full",
                    ))
                }
                other => {
                    return Err(err(format!(
                        "invalid sslmode '{other}' (disable, prefer, require, verify-ca, \
                         verify-full)"
                    )))
                }
            };
            t.mode_given = true;
        }
        "sslrootcert" => t.root_cert = Some(value.to_owned()),
        "sslcert" => t.cert = Some(value.to_owned()),
        "sslkey" => t.key = Some(value.to_owned()),
        "sslpassword" => {
            return Err(err(
                "sslpassword is not supported: give sslkey an unencrypted key file (mode 0600)",
            ))
        }
        "sslcrl" | "sslcrldir" => {
            return Err(err(format!(
                "{key} is not supported: pgline does not check certificate revocation lists"
            )))
        }
        "sslsni" => {
            t.sni = match value {
                "1" => true,
                "0" => false,
                other => return Err(err(format!("invalid sslsni '{other}' (0 or 1)"))),
            }
        }
        "sslcompression" => {} // ignored by libpq since PostgreSQL 14, as here
        "ssl_min_protocol_version" | "ssl_max_protocol_version" => {
            let v13 = match value {
                "TLSv1" | "TLSv1.1" | "TLSv1.2" => false,
                "TLSv1.3" => true,
                other => {
                    return Err(err(format!(
                        "invalid {key} '{other}' (TLSv1.2 or TLSv1.3; pgline speaks no older TLS)"
                    )))
                }
            };
            if key == "ssl_min_protocol_version" {
                t.min_tls13 = v13;
            } else {
                t.max_tls12 = !v13;
            }
        }
        "sslnegotiation" => {
            t.direct = match value {
                "postgres" => false,
                "direct" => true,
                other => {
                    return Err(err(format!(
                        "invalid sslnegotiation '{other}' (postgres or direct)"
                    )))
                }
            };
            return Ok(Keep::Pass);
        }
        "gssencmode" => {
            if value != "disable" && value != "prefer" {
                return Err(err(format!(
                    "gssencmode={value} is not supported: pgline speaks no GSSAPI encryption"
                )));
            }
        }
        "target_session_attrs" => {
            out.attrs = match value {
                "any" => SessionAttrs::Any,
                "read-write" => SessionAttrs::ReadWrite,
                "read-only" => SessionAttrs::ReadOnly,
                "primary" | "standby" | "prefer-standby" => {
                    return Err(err(format!(
                        "target_session_attrs={value} is not supported: use read-write (the \
                         primary) or read-only"
                    )))
                }
                other => {
                    return Err(err(format!(
                        "invalid target_session_attrs '{other}' (any, read-write, read-only)"
                    )))
                }
            };
            return Ok(Keep::Pass);
        }
        _ => return Ok(Keep::Pass),
    }
    Ok(Keep::Drop)
}

fn empty_split() -> Split {
    Split {
        tls: TlsKeys::default(),
        attrs: SessionAttrs::Any,
        rest: String::new(),
    }
}

/// The `key=value` form, tokenised as libpq does.
fn split_key_value(url: &str) -> Result<Split, UrlError> {
    let mut out = empty_split();
    let mut rest = String::new();
    let mut it = url.chars().peekable();
    loop {
        while it.next_if(|c| c.is_whitespace()).is_some() {}
        if it.peek().is_none() {
            break;
        }
        let mut key = String::new();
        while let Some(c) = it.next_if(|c| *c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        while it.next_if(|c| c.is_whitespace()).is_some() {}
        if it.next() != Some('=') {
            return Err(err(format!("missing \"=\" after \"{key}\"")));
        }
        while it.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if it.next_if_eq(&'\'').is_some() {
            loop {
                match it.next() {
                    None => return Err(err(format!("unterminated quoted value of \"{key}\""))),
                    Some('\'') => break,
                    Some('\\') => value.extend(it.next()),
                    Some(c) => value.push(c),
                }
            }
        } else {
            while let Some(c) = it.next_if(|c| !c.is_whitespace()) {
                if c == '\\' {
                    value.extend(it.next());
                } else {
                    value.push(c);
                }
            }
        }
        if let Keep::Pass = take(&key, &value, &mut out)? {
            if !rest.is_empty() {
                rest.push(' ');
            }
            let _ = write!(rest, "{key}='");
            for c in value.chars() {
                if c == '\'' || c == '\\' {
                    rest.push('\\');
                }
                rest.push(c);
            }
            rest.push('\'');
        }
    }
    out.rest = rest;
    Ok(out)
}

/// The URI form: only the query string is read.
fn split_uri(url: &str) -> Result<Split, UrlError> {
    let mut out = empty_split();
    let Some((base, query)) = url.split_once('?') else {
        out.rest = url.to_owned();
        return Ok(out);
    };
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let key = percent_decode(k)?;
        let value = percent_decode(v)?;
        if let Keep::Pass = take(&key, &value, &mut out)? {
            kept.push(pair);
        }
    }
    out.rest = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok(out)
}

/// `%XX` decoding of one URI query component (`+` stays `+`, as in libpq).
fn percent_decode(s: &str) -> Result<String, UrlError> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| err(format!("invalid percent-encoded token in \"{s}\"")))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| err(format!("\"{s}\" is not UTF-8 once decoded")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pg(rest: &str) -> tokio_postgres::Config {
        rest.parse().expect("tokio-postgres parses the rest")
    }

    #[test]
    fn absent_sslmode_is_prefer_and_nothing_else_changes_meaning() {
        let s = split("host=127.0.0.1 port=5432 user=postgres dbname=app").unwrap();
        assert_eq!(s.tls.mode, SslMode::Prefer);
        assert!(!s.tls.mode_given);
        assert_eq!(s.attrs, SessionAttrs::Any);
        let c = pg(&s.rest);
        assert_eq!(c.get_user(), Some("postgres"));
        assert_eq!(c.get_dbname(), Some("app"));
        assert_eq!(c.get_ports(), &[5432]);
    }

    #[test]
    fn key_value_quoting_is_libpqs() {
        let s = split(
            r"host=localhost password='it\'s a \\ secret' sslmode = verify-full sslrootcert='/x y/ca.crt' user=a\ b",
        )
        .unwrap();
        assert_eq!(s.tls.mode, SslMode::VerifyFull);
        assert_eq!(s.tls.root_cert.as_deref(), Some("/x y/ca.crt"));
        let c = pg(&s.rest);
        assert_eq!(c.get_password(), Some(&br"it's a \ secret"[..]));
        assert_eq!(c.get_user(), Some("a b"));
        assert!(!s.rest.contains("ssl"), "{}", s.rest);
    }

    #[test]
    fn unterminated_quote_and_missing_equals_are_errors() {
        assert!(split("host='abc").unwrap_err().0.contains("unterminated"));
        assert!(split("host abc").unwrap_err().0.contains("missing \"=\""));
    }

    #[test]
    fn every_tls_key_is_taken_out() {
        let s = split(
            "host=h sslmode=require sslcert=/c.crt sslkey=/c.key sslsni=0 \
             ssl_min_protocol_version=TLSv1.3 sslcompression=0 user=u",
        )
        .unwrap();
        assert_eq!(s.tls.mode, SslMode::Require);
        assert_eq!(s.tls.cert.as_deref(), Some("/c.crt"));
        assert_eq!(s.tls.key.as_deref(), Some("/c.key"));
        assert!(!s.tls.sni);
        assert!(s.tls.min_tls13);
        assert_eq!(s.rest, "host='h' user='u'");
    }

    #[test]
    fn unsupported_keys_are_refused_by_name() {
        assert!(split("sslmode=allow")
            .unwrap_err()
            .0
            .contains("sslmode=allow"));
        assert!(split("sslmode=bogus")
            .unwrap_err()
            .0
            .contains("invalid sslmode"));
        assert!(split("sslpassword=x")
            .unwrap_err()
            .0
            .contains("sslpassword"));
        assert!(split("sslcrl=/x").unwrap_err().0.contains("sslcrl"));
        let e = split("host=a,b target_session_attrs=primary").unwrap_err();
        assert!(e.0.contains("target_session_attrs=primary"), "{e}");
        assert!(e.0.contains("read-write"), "{e}");
        assert!(split("gssencmode=require").is_err());
    }

    #[test]
    fn multi_host_and_session_attrs_pass_through() {
        let s =
            split("host=a,b port=1,2 target_session_attrs=read-write sslmode=verify-ca").unwrap();
        assert_eq!(s.attrs, SessionAttrs::ReadWrite);
        assert_eq!(s.tls.mode, SslMode::VerifyCa);
        let c = pg(&s.rest);
        assert_eq!(c.get_hosts().len(), 2);
        assert_eq!(c.get_ports(), &[1, 2]);
        assert_eq!(
            c.get_target_session_attrs(),
            tokio_postgres::config::TargetSessionAttrs::ReadWrite
        );
    }

    #[test]
    fn uri_form_touches_only_the_query() {
        let s = split(
            "postgresql://us%40er:p%3Fa%26ss@[::1]:5433,db2:5434/app?sslmode=verify-full\
             &sslrootcert=%2Ftmp%2Fmy%20ca.crt&application_name=x&target_session_attrs=read-write",
        )
        .unwrap();
        assert_eq!(s.tls.mode, SslMode::VerifyFull);
        assert_eq!(s.tls.root_cert.as_deref(), Some("/tmp/my ca.crt"));
        assert_eq!(s.attrs, SessionAttrs::ReadWrite);
        assert_eq!(
            s.rest,
            "postgresql://us%40er:p%3Fa%26ss@[::1]:5433,db2:5434/app?application_name=x\
             &target_session_attrs=read-write"
        );
        let c = pg(&s.rest);
        assert_eq!(c.get_user(), Some("us@er"));
        assert_eq!(c.get_password(), Some(&b"p?a&ss"[..]));
        assert_eq!(c.get_hosts().len(), 2);
        assert_eq!(c.get_ports(), &[5433, 5434]);
    }

    #[test]
    fn uri_without_query_or_with_only_tls_keys() {
        let s = split("postgres://u@h/db").unwrap();
        assert_eq!(s.rest, "postgres://u@h/db");
        let s = split("postgres://u@h/db?sslmode=disable").unwrap();
        assert_eq!(s.rest, "postgres://u@h/db");
        assert_eq!(s.tls.mode, SslMode::Disable);
        assert!(split("postgres://u@h/db?sslmode=%zz").is_err());
    }

    #[test]
    fn sslmode_maps_to_what_tokio_postgres_can_negotiate() {
        use tokio_postgres::config::SslMode as T;
        assert_eq!(SslMode::Disable.for_tokio_postgres(), T::Disable);
        assert_eq!(SslMode::Prefer.for_tokio_postgres(), T::Prefer);
        assert_eq!(SslMode::VerifyCa.for_tokio_postgres(), T::Require);
        assert_eq!(SslMode::VerifyFull.for_tokio_postgres(), T::Require);
    }
}
