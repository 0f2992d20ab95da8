//! Password authentication: stored secrets, md5 and trust; SCRAM lives in [`super::scram`].
//!
//! Purpose: the pieces a connection's startup needs to check a client's credentials against
//! a configured user list (plain passwords or PostgreSQL's `pg_authid.rolpassword` forms).
//! The md5 digest comes from the RustCrypto `md-5` crate.
//!
//! Method choice follows PostgreSQL: `md5` configured with a SCRAM secret runs SCRAM
//! ([`effective_method`]); an md5 secret cannot run SCRAM. Failures are reported as
//! PostgreSQL reports them: FATAL 28P01 `password authentication failed for user "x"`
//! ([`compose_auth_failed`]). Thread model: pure functions. Not on the hit path.
//! Limitations: no mock exchange for unknown users (PostgreSQL runs a fake SCRAM exchange so
//! that probing cannot tell unknown users from wrong passwords; the caller should do the same
//! with a verifier from random bytes); no password expiry (`rolvaliduntil`).
//!
//! [`AuthExchange`] ties the pieces into the startup state machine a connection runs:
//! `start` composes the first request, `process_password` takes each `p` message body and
//! composes the next reply, until [`AuthStep::Ok`] or [`AuthStep::Failed`].

use super::backend::{compose_error_response, ErrorFields};
use super::frontend::{parse_password_message, parse_sasl_initial_response};
use super::scram::{ScramError, ScramServer, ScramVerifier, DEFAULT_ITERATIONS, MECHANISM};
use super::sqlstate;
use md5::{Digest, Md5};

/// How a user must authenticate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthMethod {
    /// No password asked.
    Trust,
    /// AuthenticationMD5Password (or SCRAM if the secret is a SCRAM verifier).
    Md5,
    /// SCRAM-SHA-256 over SASL.
    ScramSha256,
}

/// A user's stored secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Secret {
    /// A cleartext password (from pgline's configuration).
    Plain(Vec<u8>),
    /// `md5(password || user)`, PostgreSQL's `md5<32 hex>` form.
    Md5([u8; 16]),
    /// A SCRAM-SHA-256 verifier.
    Scram(ScramVerifier),
}

impl Secret {
    /// Reads a secret in PostgreSQL's `rolpassword` forms: `SCRAM-SHA-256$...`,
    /// `md5<32 lowercase hex>`, anything else a plain password.
    pub fn parse_rolpassword(s: &str) -> Secret {
        if let Some(v) = ScramVerifier::parse(s) {
            return Secret::Scram(v);
        }
        if let Some(hex) = s.strip_prefix("md5").filter(|h| h.len() == 32) {
            let mut out = [0u8; 16];
            if decode_hex(hex.as_bytes(), &mut out) {
                return Secret::Md5(out);
            }
        }
        Secret::Plain(s.as_bytes().to_vec())
    }

    /// The SCRAM verifier for this secret: itself, or derived from a plain password with
    /// `salt` and `iterations`. `None` for an md5 secret.
    pub fn scram_verifier(&self, salt: &[u8], iterations: u32) -> Option<ScramVerifier> {
        match self {
            Secret::Plain(p) => Some(ScramVerifier::from_password(p, salt, iterations)),
            Secret::Md5(_) => None,
            Secret::Scram(v) => Some(v.clone()),
        }
    }
}

/// The method actually run for a user configured with `configured` and holding `secret`.
pub fn effective_method(configured: AuthMethod, secret: &Secret) -> AuthMethod {
    match (configured, secret) {
        (AuthMethod::Md5, Secret::Scram(_)) => AuthMethod::ScramSha256,
        (m, _) => m,
    }
}

fn decode_hex(hex: &[u8], out: &mut [u8; 16]) -> bool {
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    for (o, pair) in out.iter_mut().zip(hex.chunks_exact(2)) {
        match (nibble(pair[0]), nibble(pair[1])) {
            (Some(h), Some(l)) => *o = h << 4 | l,
            _ => return false,
        }
    }
    true
}

fn encode_hex(bytes: &[u8; 16], out: &mut [u8; 32]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (pair, b) in out.chunks_exact_mut(2).zip(bytes) {
        pair[0] = DIGITS[usize::from(b >> 4)];
        pair[1] = DIGITS[usize::from(b & 15)];
    }
}

/// `md5(password || user)`: what PostgreSQL stores for an md5 password.
pub fn md5_secret(password: &[u8], user: &[u8]) -> [u8; 16] {
    Md5::new()
        .chain_update(password)
        .chain_update(user)
        .finalize()
        .into()
}

/// The PasswordMessage a client sends for md5: `"md5" + hex(md5(hex(secret) || salt))`.
pub fn compose_md5_response(secret: &[u8; 16], salt: [u8; 4]) -> [u8; 35] {
    let mut hex = [0u8; 32];
    encode_hex(secret, &mut hex);
    let outer: [u8; 16] = Md5::new()
        .chain_update(hex)
        .chain_update(salt)
        .finalize()
        .into();
    let mut out = [0u8; 35];
    out[..3].copy_from_slice(b"md5");
    let mut tail = [0u8; 32];
    encode_hex(&outer, &mut tail);
    out[3..].copy_from_slice(&tail);
    out
}

/// Checks an md5 PasswordMessage (its string, without NUL) from `user` against `secret`
/// for the salt the server sent. A SCRAM secret cannot check md5 and always fails.
pub fn check_md5_response(secret: &Secret, user: &[u8], salt: [u8; 4], response: &[u8]) -> bool {
    let inner = match secret {
        Secret::Plain(p) => md5_secret(p, user),
        Secret::Md5(h) => *h,
        Secret::Scram(_) => return false,
    };
    let want = compose_md5_response(&inner, salt);
    response.len() == want.len()
        && response
            .iter()
            .zip(want)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// Checks a cleartext PasswordMessage against `secret` (for clients answering
/// AuthenticationCleartextPassword).
pub fn check_cleartext(secret: &Secret, user: &[u8], password: &[u8]) -> bool {
    match secret {
        Secret::Plain(p) => p == password,
        Secret::Md5(h) => md5_secret(password, user) == *h,
        Secret::Scram(v) => ScramVerifier::from_password(password, &v.salt, v.iterations) == *v,
    }
}

/// FATAL 28P01 `password authentication failed for user "<user>"`, as PostgreSQL sends it.
pub fn compose_auth_failed(out: &mut Vec<u8>, user: &[u8]) {
    let mut msg = Vec::with_capacity(48 + user.len());
    msg.extend_from_slice(b"password authentication failed for user \"");
    msg.extend_from_slice(user);
    msg.push(b'"');
    compose_error_response(out, &ErrorFields::fatal(sqlstate::INVALID_PASSWORD, &msg));
}

/// Random bytes an exchange needs, drawn by the caller (the codec reads no entropy source).
#[derive(Clone, Copy, Debug)]
pub struct AuthRandom {
    /// The md5 salt.
    pub md5_salt: [u8; 4],
    /// The SCRAM server nonce; also the salt when a verifier is derived from a plain password.
    pub nonce: [u8; 18],
}

/// Where an exchange stands after a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthStep {
    /// A request was composed; wait for the client's next `p` message.
    Continue,
    /// AuthenticationOk was composed; send ParameterStatus, BackendKeyData, ReadyForQuery.
    Ok,
    /// A FATAL ErrorResponse was composed; close the connection after sending it.
    Failed(AuthFailure),
}

/// Why authentication failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthFailure {
    /// Wrong password (28P01).
    WrongPassword,
    /// A malformed or unexpected password message (08P01).
    Protocol,
    /// The client wants a SCRAM feature pgline does not offer (channel binding), 28000.
    Unsupported,
    /// The secret cannot run the method (an md5 hash under SCRAM), 28P01 as PostgreSQL.
    NoUsableSecret,
}

enum ExchangeState {
    Md5 { salt: [u8; 4] },
    ScramFirst(ScramServer),
    ScramFinal(ScramServer),
    Done,
}

/// One connection's authentication, from the first request to AuthenticationOk or FATAL.
pub struct AuthExchange {
    user: Vec<u8>,
    secret: Secret,
    state: ExchangeState,
}

impl AuthExchange {
    /// Starts authenticating `user` with `method` against `secret`; composes the first
    /// request (or AuthenticationOk for trust) into `out`.
    pub fn start(
        method: AuthMethod,
        user: &[u8],
        secret: Secret,
        random: AuthRandom,
        out: &mut Vec<u8>,
    ) -> (Self, AuthStep) {
        let mut ex = AuthExchange {
            user: user.to_vec(),
            secret,
            state: ExchangeState::Done,
        };
        let step = match effective_method(method, &ex.secret) {
            AuthMethod::Trust => {
                super::backend::compose_auth_ok(out);
                AuthStep::Ok
            }
            AuthMethod::Md5 => {
                super::backend::compose_auth_md5(out, random.md5_salt);
                ex.state = ExchangeState::Md5 {
                    salt: random.md5_salt,
                };
                AuthStep::Continue
            }
            AuthMethod::ScramSha256 => {
                match ex
                    .secret
                    .scram_verifier(&random.nonce[..16], DEFAULT_ITERATIONS)
                {
                    Some(v) => {
                        super::backend::compose_auth_sasl(out, &[MECHANISM]);
                        ex.state = ExchangeState::ScramFirst(ScramServer::new(v, &random.nonce));
                        AuthStep::Continue
                    }
                    None => ex.fail(AuthFailure::NoUsableSecret, out),
                }
            }
        };
        (ex, step)
    }

    /// Takes the body of the client's `p` message and composes the next reply.
    pub fn process_password(&mut self, body: &[u8], out: &mut Vec<u8>) -> AuthStep {
        match std::mem::replace(&mut self.state, ExchangeState::Done) {
            ExchangeState::Md5 { salt } => match parse_password_message(body) {
                Ok(pw) if check_md5_response(&self.secret, &self.user, salt, pw) => {
                    super::backend::compose_auth_ok(out);
                    AuthStep::Ok
                }
                Ok(_) => self.fail(AuthFailure::WrongPassword, out),
                Err(_) => self.fail(AuthFailure::Protocol, out),
            },
            ExchangeState::ScramFirst(mut scram) => {
                let first = parse_sasl_initial_response(body)
                    .ok()
                    .filter(|r| r.mechanism == MECHANISM)
                    .and_then(|r| r.data);
                let Some(first) = first else {
                    return self.fail(AuthFailure::Protocol, out);
                };
                match scram.process_client_first(first) {
                    Ok(reply) => {
                        super::backend::compose_auth_sasl_continue(out, &reply);
                        self.state = ExchangeState::ScramFinal(scram);
                        AuthStep::Continue
                    }
                    Err(e) => self.fail(scram_failure(e), out),
                }
            }
            ExchangeState::ScramFinal(mut scram) => match scram.process_client_final(body) {
                Ok(reply) => {
                    super::backend::compose_auth_sasl_final(out, &reply);
                    super::backend::compose_auth_ok(out);
                    AuthStep::Ok
                }
                Err(e) => self.fail(scram_failure(e), out),
            },
            ExchangeState::Done => self.fail(AuthFailure::Protocol, out),
        }
    }

    fn fail(&mut self, why: AuthFailure, out: &mut Vec<u8>) -> AuthStep {
        self.state = ExchangeState::Done;
        match why {
            AuthFailure::WrongPassword | AuthFailure::NoUsableSecret => {
                compose_auth_failed(out, &self.user)
            }
            AuthFailure::Protocol => compose_error_response(
                out,
                &ErrorFields::fatal(
                    sqlstate::PROTOCOL_VIOLATION,
                    b"malformed authentication message",
                ),
            ),
            AuthFailure::Unsupported => compose_error_response(
                out,
                &ErrorFields::fatal(
                    sqlstate::INVALID_AUTHORIZATION_SPECIFICATION,
                    b"SCRAM channel binding and authorization identities are not supported",
                ),
            ),
        }
        AuthStep::Failed(why)
    }
}

fn scram_failure(e: ScramError) -> AuthFailure {
    match e {
        ScramError::BadProof => AuthFailure::WrongPassword,
        ScramError::Unsupported => AuthFailure::Unsupported,
        ScramError::Malformed | ScramError::Mismatch | ScramError::OutOfOrder => {
            AuthFailure::Protocol
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn md5_matches_postgres_protocol() {
        // postgres-protocol's rolpassword form for md5 is "md5" + hex(md5(password || user)).
        let stored = postgres_protocol::password::md5(b"pw", "alice");
        let Secret::Md5(h) = Secret::parse_rolpassword(&stored) else {
            panic!("{stored}")
        };
        assert_eq!(h, md5_secret(b"pw", b"alice"));
        let salt = [1, 2, 3, 4];
        let resp = compose_md5_response(&h, salt);
        assert!(check_md5_response(&Secret::Md5(h), b"alice", salt, &resp));
        assert!(check_md5_response(
            &Secret::Plain(b"pw".to_vec()),
            b"alice",
            salt,
            &resp
        ));
        assert!(!check_md5_response(
            &Secret::Plain(b"pw".to_vec()),
            b"bob",
            salt,
            &resp
        ));
        assert!(!check_md5_response(
            &Secret::Md5(h),
            b"alice",
            [0; 4],
            &resp
        ));
        assert!(!check_md5_response(
            &Secret::Md5(h),
            b"alice",
            salt,
            &resp[..34]
        ));
    }

    #[test]
    fn known_md5_value() {
        // SELECT 'md5' || md5('postgres' || 'postgres') in PostgreSQL
        let stored = "md53175bce1d3201d16594cebf9d7eb3f9d";
        assert_eq!(
            Secret::parse_rolpassword(stored),
            Secret::Md5(md5_secret(b"postgres", b"postgres"))
        );
    }

    #[test]
    fn secret_forms_and_methods() {
        assert_eq!(
            Secret::parse_rolpassword("md5xyz"),
            Secret::Plain(b"md5xyz".to_vec())
        );
        let scram = Secret::parse_rolpassword(&postgres_protocol::password::scram_sha_256(b"a"));
        assert!(matches!(scram, Secret::Scram(_)));
        assert_eq!(
            effective_method(AuthMethod::Md5, &scram),
            AuthMethod::ScramSha256
        );
        assert_eq!(
            effective_method(AuthMethod::Md5, &Secret::Plain(vec![])),
            AuthMethod::Md5
        );
        assert!(check_cleartext(&scram, b"u", b"a"));
        assert!(!check_cleartext(&scram, b"u", b"b"));
        assert!(Secret::Md5([0; 16]).scram_verifier(b"s", 1).is_none());
    }

    fn random() -> AuthRandom {
        AuthRandom {
            md5_salt: [1, 2, 3, 4],
            nonce: [5; 18],
        }
    }

    #[test]
    fn exchange_md5_and_failures() {
        let secret = Secret::Plain(b"pw".to_vec());
        let mut out = Vec::new();
        let (mut ex, step) =
            AuthExchange::start(AuthMethod::Md5, b"al", secret, random(), &mut out);
        assert_eq!(
            (step, &out[..]),
            (
                AuthStep::Continue,
                &b"R\0\0\0\x0c\0\0\0\x05\x01\x02\x03\x04"[..]
            )
        );
        let mut body = compose_md5_response(&md5_secret(b"pw", b"al"), [1, 2, 3, 4]).to_vec();
        body.push(0);
        out.clear();
        assert_eq!(ex.process_password(&body, &mut out), AuthStep::Ok);
        assert_eq!(out, b"R\0\0\0\x08\0\0\0\0");
        // a second password after the end is a protocol violation
        out.clear();
        assert_eq!(
            ex.process_password(&body, &mut out),
            AuthStep::Failed(AuthFailure::Protocol)
        );
        assert!(out.windows(5).any(|w| w == b"08P01"));
        // an md5 hash cannot run SCRAM: 28P01 at once, as PostgreSQL
        out.clear();
        let (_, step) = AuthExchange::start(
            AuthMethod::ScramSha256,
            b"al",
            Secret::Md5([0; 16]),
            random(),
            &mut out,
        );
        assert_eq!(step, AuthStep::Failed(AuthFailure::NoUsableSecret));
        assert!(out.windows(5).any(|w| w == b"28P01"));
        // a wrong md5 answer
        let (mut ex, _) = AuthExchange::start(
            AuthMethod::Md5,
            b"al",
            Secret::Plain(b"x".to_vec()),
            random(),
            &mut out,
        );
        out.clear();
        assert_eq!(
            ex.process_password(&body, &mut out),
            AuthStep::Failed(AuthFailure::WrongPassword)
        );
        // a SASL initial response naming another mechanism
        let (mut ex, _) = AuthExchange::start(
            AuthMethod::ScramSha256,
            b"al",
            Secret::Plain(b"x".to_vec()),
            random(),
            &mut out,
        );
        assert_eq!(
            ex.process_password(b"SCRAM-SHA-1\0\0\0\0\x03n,,", &mut out),
            AuthStep::Failed(AuthFailure::Protocol)
        );
    }

    #[test]
    fn auth_failed_message() {
        let mut out = Vec::new();
        compose_auth_failed(&mut out, b"bob");
        let text = String::from_utf8_lossy(&out);
        assert!(
            text.contains("28P01") && text.contains("user \"bob\""),
            "{text}"
        );
    }
}
