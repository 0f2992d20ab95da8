//! Logging in to the origin: the startup message, the authentication exchange, and what the
//! origin says before ReadyForQuery.
//!
//! Purpose: pgline logs its own connections in here (the replication stream, the relay's pool
//! connections opened without a client). Methods: trust, cleartext password, md5 and
//! SCRAM-SHA-256 without channel binding, with `postgres-protocol`'s client
//! (`authentication::sasl`, the one `tokio-postgres` uses). Invariants: an ErrorResponse
//! before ReadyForQuery ends the login with the origin's severity, SQLSTATE and message
//! ([`LoginError::Refused`]); a malformed or unexpected message is [`LoginError::Protocol`],
//! never a panic.

use bytes::BytesMut;
use postgres_protocol::authentication::{md5_hash, sasl};
use postgres_protocol::message::frontend;

use super::conn::{FrameError, OriginConn};
use super::message::{auth_request, backend_key, error_fields};

/// Who logs in.
#[derive(Clone, Copy, Debug)]
pub struct Credentials<'a> {
    pub user: &'a str,
    /// `None`: no password is known (a method that asks for one fails).
    pub password: Option<&'a [u8]>,
}

/// What the origin said while logging in.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoggedIn {
    /// The origin's BackendKeyData (for cancel).
    pub pid: i32,
    pub secret: i32,
    /// ParameterStatus messages, in order.
    pub params: Vec<(String, String)>,
}

/// Why a login failed.
#[derive(Debug, thiserror::Error)]
pub enum LoginError {
    /// The connection failed or closed.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// The origin answered with an ErrorResponse.
    #[error("origin refused: {severity} {code}: {message}")]
    Refused {
        severity: String,
        code: String,
        message: String,
    },
    /// The exchange could not go on on pgline's side (no password, an unsupported method, a
    /// SCRAM check that failed).
    #[error("authentication: {0}")]
    Auth(String),
    /// The origin sent something the protocol does not allow here.
    #[error("login protocol: {0}")]
    Protocol(String),
}

impl From<std::io::Error> for LoginError {
    fn from(e: std::io::Error) -> LoginError {
        LoginError::Frame(FrameError::Io(e))
    }
}

/// Sends `startup` (a whole StartupMessage) on `conn` and logs in as `who`, up to
/// ReadyForQuery.
pub async fn login(
    conn: &mut OriginConn,
    startup: &[u8],
    who: Credentials<'_>,
) -> Result<LoggedIn, LoginError> {
    conn.write_all(startup).await?;
    let need_pw = || {
        who.password
            .ok_or_else(|| LoginError::Auth("password required".into()))
    };
    let mut scram: Option<sasl::ScramSha256> = None;
    let mut out = LoggedIn::default();
    loop {
        let frame = conn.read_frame().await?;
        let mut reply = BytesMut::new();
        match frame[0] {
            b'R' => {
                let (code, data) = auth_request(&frame)
                    .ok_or_else(|| LoginError::Protocol("short authentication message".into()))?;
                match code {
                    0 => continue,
                    3 => frontend::password_message(need_pw()?, &mut reply)?,
                    5 => {
                        let salt: [u8; 4] = data
                            .get(..4)
                            .and_then(|s| s.try_into().ok())
                            .ok_or_else(|| LoginError::Protocol("short MD5 salt".into()))?;
                        let hash = md5_hash(who.user.as_bytes(), need_pw()?, salt);
                        frontend::password_message(hash.as_bytes(), &mut reply)?;
                    }
                    10 => {
                        let offers_scram = data
                            .split(|&b| b == 0)
                            .any(|m| m == sasl::SCRAM_SHA_256.as_bytes());
                        if !offers_scram {
                            return Err(LoginError::Auth("server offers no SCRAM-SHA-256".into()));
                        }
                        let s =
                            sasl::ScramSha256::new(need_pw()?, sasl::ChannelBinding::unsupported());
                        frontend::sasl_initial_response(
                            sasl::SCRAM_SHA_256,
                            s.message(),
                            &mut reply,
                        )?;
                        scram = Some(s);
                    }
                    11 | 12 => {
                        let s = scram.as_mut().ok_or_else(|| {
                            LoginError::Protocol("SASL message before SASL start".into())
                        })?;
                        if code == 11 {
                            s.update(data)
                                .map_err(|e| LoginError::Auth(e.to_string()))?;
                            frontend::sasl_response(s.message(), &mut reply)?;
                        } else {
                            s.finish(data)
                                .map_err(|e| LoginError::Auth(e.to_string()))?;
                            continue;
                        }
                    }
                    other => {
                        return Err(LoginError::Auth(format!(
                            "unsupported authentication request {other}"
                        )))
                    }
                }
            }
            b'E' => {
                let (severity, code, mut message) = error_fields(&frame[5..]);
                if !conn.is_tls() {
                    message = super::hint_refusal(&message);
                }
                return Err(LoginError::Refused {
                    severity,
                    code,
                    message,
                });
            }
            b'N' => {
                let (severity, code, message) = error_fields(&frame[5..]);
                tracing::info!(%severity, %code, "origin notice: {message}");
                continue;
            }
            b'K' => {
                (out.pid, out.secret) = backend_key(&frame)
                    .ok_or_else(|| LoginError::Protocol("short BackendKeyData".into()))?;
                continue;
            }
            b'S' => {
                let mut parts = frame[5..].split(|&b| b == 0);
                let mut text = || String::from_utf8_lossy(parts.next().unwrap_or(&[])).into_owned();
                let name = text();
                out.params.push((name, text()));
                continue;
            }
            b'Z' => return Ok(out),
            // NegotiateProtocolVersion: the origin goes on with what it supports.
            b'v' => continue,
            other => {
                return Err(LoginError::Protocol(format!(
                    "unexpected message '{}' during login",
                    char::from(other)
                )))
            }
        }
        conn.write_all(&reply).await?;
    }
}
