//! SCRAM-SHA-256 server side (RFC 5802, RFC 7677) as PostgreSQL speaks it.
//!
//! Purpose: check a client's proof against a [`ScramVerifier`] (either PostgreSQL's stored
//! `SCRAM-SHA-256$<iter>:<salt>$<StoredKey>:<ServerKey>` or one derived from a configured
//! password) and produce the server signature. The primitives come from the RustCrypto
//! crates (`sha2`, `hmac`, `pbkdf2`, `base64`); nothing here reimplements them.
//!
//! Exchange: AuthenticationSASL → client-first (in SASLInitialResponse) →
//! [`ScramServer::process_client_first`] gives server-first (AuthenticationSASLContinue) →
//! client-final (SASLResponse) → [`ScramServer::process_client_final`] gives server-final
//! (AuthenticationSASLFinal), then AuthenticationOk.
//!
//! Invariants: a proof is accepted only if `H(proof XOR HMAC(StoredKey, AuthMessage))`
//! equals StoredKey (compared in constant time) and the client-final echoes the combined
//! nonce and the exact GS2 header. Thread model: one value per connection, not shared.
//! Limitations: no channel binding (`SCRAM-SHA-256-PLUS` needs TLS, which pgline does not
//! terminate): a client asking for it (`p=`) is refused; an authorization identity (`a=`)
//! is refused, as PostgreSQL does; the user name in client-first is ignored (PostgreSQL uses
//! the startup packet's). Not on the hit path: allocates freely.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

/// PostgreSQL's default `scram_iterations`.
pub const DEFAULT_ITERATIONS: u32 = 4096;
/// The mechanism name offered in AuthenticationSASL.
pub const MECHANISM: &[u8] = b"SCRAM-SHA-256";

/// What the server keeps about a password: enough to check a proof, not to recover it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScramVerifier {
    pub iterations: u32,
    pub salt: Vec<u8>,
    pub stored_key: [u8; 32],
    pub server_key: [u8; 32],
}

/// Why a SCRAM exchange failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScramError {
    /// A message that does not follow the RFC 5802 grammar.
    Malformed,
    /// The client asked for channel binding or an authorization identity.
    Unsupported,
    /// The client-final nonce is not the combined nonce, or its GS2 header differs.
    Mismatch,
    /// The proof is wrong: the password is wrong (SQLSTATE 28P01).
    BadProof,
    /// A message arrived in the wrong step of the exchange.
    OutOfOrder,
}

fn hmac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes keys of any length");
    for p in parts {
        mac.update(p);
    }
    mac.finalize().into_bytes().into()
}

/// SASLprep the password when it is valid UTF-8 and allowed, else use its bytes (what
/// PostgreSQL and libpq do).
fn prepare_password(password: &[u8]) -> Vec<u8> {
    match std::str::from_utf8(password).map(stringprep::saslprep) {
        Ok(Ok(p)) => p.into_owned().into_bytes(),
        _ => password.to_vec(),
    }
}

impl ScramVerifier {
    /// Derives the verifier for `password` with the given salt and iteration count.
    pub fn from_password(password: &[u8], salt: &[u8], iterations: u32) -> Self {
        let mut salted = [0u8; 32];
        pbkdf2::pbkdf2_hmac::<Sha256>(&prepare_password(password), salt, iterations, &mut salted);
        let client_key = hmac(&salted, &[b"Client Key"]);
        ScramVerifier {
            iterations,
            salt: salt.to_vec(),
            stored_key: Sha256::digest(client_key).into(),
            server_key: hmac(&salted, &[b"Server Key"]),
        }
    }

    /// Parses PostgreSQL's `pg_authid.rolpassword` form
    /// `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>` (base64 fields).
    pub fn parse(s: &str) -> Option<Self> {
        let rest = s.strip_prefix("SCRAM-SHA-256$")?;
        let (params, keys) = rest.split_once('$')?;
        let (iter, salt) = params.split_once(':')?;
        let (stored, server) = keys.split_once(':')?;
        let iterations = iter.parse().ok().filter(|&n| n > 0)?;
        Some(ScramVerifier {
            iterations,
            salt: B64.decode(salt).ok()?,
            stored_key: B64.decode(stored).ok()?.try_into().ok()?,
            server_key: B64.decode(server).ok()?.try_into().ok()?,
        })
    }

    /// The `pg_authid.rolpassword` form of this verifier.
    pub fn compose_rolpassword(&self) -> String {
        format!(
            "SCRAM-SHA-256${}:{}${}:{}",
            self.iterations,
            B64.encode(&self.salt),
            B64.encode(self.stored_key),
            B64.encode(self.server_key)
        )
    }
}

#[derive(Debug)]
enum Step {
    ClientFirst,
    ClientFinal {
        gs2_header: Vec<u8>,
        nonce: String,
        /// client-first-bare "," server-first
        auth_prefix: Vec<u8>,
    },
    Done,
}

/// One connection's SCRAM exchange, server side.
#[derive(Debug)]
pub struct ScramServer {
    verifier: ScramVerifier,
    server_nonce: String,
    step: Step,
}

fn printable_nonce(s: &[u8]) -> bool {
    !s.is_empty() && s.iter().all(|&b| (0x21..=0x7e).contains(&b) && b != b',')
}

impl ScramServer {
    /// Starts an exchange against `verifier`; `nonce` is fresh random bytes from the caller
    /// (18 or more, as PostgreSQL uses), sent base64-encoded.
    pub fn new(verifier: ScramVerifier, nonce: &[u8]) -> Self {
        ScramServer {
            verifier,
            server_nonce: B64.encode(nonce),
            step: Step::ClientFirst,
        }
    }

    /// Takes the client-first message; returns server-first for AuthenticationSASLContinue.
    pub fn process_client_first(&mut self, msg: &[u8]) -> Result<Vec<u8>, ScramError> {
        if !matches!(self.step, Step::ClientFirst) {
            return Err(ScramError::OutOfOrder);
        }
        self.step = Step::Done;
        let (gs2_header, bare) = split_gs2_header(msg)?;
        let mut attrs = bare.split(|&b| b == b',');
        attrs
            .next()
            .filter(|a| a.starts_with(b"n="))
            .ok_or(ScramError::Malformed)?;
        let client_nonce = attrs
            .next()
            .and_then(|a| a.strip_prefix(b"r="))
            .filter(|n| printable_nonce(n))
            .ok_or(ScramError::Malformed)?;
        if attrs.any(|a| a.starts_with(b"m=")) {
            return Err(ScramError::Unsupported);
        }
        let mut nonce =
            String::from_utf8(client_nonce.to_vec()).map_err(|_| ScramError::Malformed)?;
        nonce.push_str(&self.server_nonce);
        let server_first = format!(
            "r={nonce},s={},i={}",
            B64.encode(&self.verifier.salt),
            self.verifier.iterations
        )
        .into_bytes();
        let mut auth_prefix = bare.to_vec();
        auth_prefix.push(b',');
        auth_prefix.extend_from_slice(&server_first);
        self.step = Step::ClientFinal {
            gs2_header: gs2_header.to_vec(),
            nonce,
            auth_prefix,
        };
        Ok(server_first)
    }

    /// Takes the client-final message; checks the proof and returns server-final
    /// (`v=<ServerSignature>`) for AuthenticationSASLFinal.
    pub fn process_client_final(&mut self, msg: &[u8]) -> Result<Vec<u8>, ScramError> {
        let Step::ClientFinal {
            gs2_header,
            nonce,
            auth_prefix,
        } = std::mem::replace(&mut self.step, Step::Done)
        else {
            return Err(ScramError::OutOfOrder);
        };
        let at = find_last(msg, b",p=").ok_or(ScramError::Malformed)?;
        let (without_proof, proof) = (&msg[..at], &msg[at + 3..]);
        let mut attrs = without_proof.split(|&b| b == b',');
        let cbind = attrs
            .next()
            .and_then(|a| a.strip_prefix(b"c="))
            .ok_or(ScramError::Malformed)?;
        let r = attrs
            .next()
            .and_then(|a| a.strip_prefix(b"r="))
            .ok_or(ScramError::Malformed)?;
        if B64.decode(cbind).ok().as_deref() != Some(&gs2_header[..]) || r != nonce.as_bytes() {
            return Err(ScramError::Mismatch);
        }
        let proof: [u8; 32] = B64
            .decode(proof)
            .ok()
            .and_then(|p| p.try_into().ok())
            .ok_or(ScramError::Malformed)?;
        let auth = [&auth_prefix[..], b",", without_proof];
        let client_signature = hmac(&self.verifier.stored_key, &auth);
        let mut client_key = proof;
        for (k, s) in client_key.iter_mut().zip(client_signature) {
            *k ^= s;
        }
        let computed: [u8; 32] = Sha256::digest(client_key).into();
        if !constant_time_eq(&computed, &self.verifier.stored_key) {
            return Err(ScramError::BadProof);
        }
        let server_signature = hmac(&self.verifier.server_key, &auth);
        Ok(format!("v={}", B64.encode(server_signature)).into_bytes())
    }
}

/// Splits `gs2-header client-first-bare`; only `n,,` and `y,,` are accepted.
fn split_gs2_header(msg: &[u8]) -> Result<(&[u8], &[u8]), ScramError> {
    match msg.first() {
        Some(b'n' | b'y') if msg.get(1) == Some(&b',') => {}
        Some(b'p') => return Err(ScramError::Unsupported),
        _ => return Err(ScramError::Malformed),
    }
    match msg.get(2) {
        Some(b',') => Ok(msg.split_at(3)),
        Some(b'a') => Err(ScramError::Unsupported),
        _ => Err(ScramError::Malformed),
    }
}

fn find_last(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).rposition(|w| w == needle)
}

fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
#[path = "scram_tests.rs"]
mod tests;
