//! The relay's errors, typed by who caused them and whether trying again can help, and the
//! ErrorResponse each becomes for the client.
//!
//! Purpose: every error the relay sends the client itself (as opposed to the origin's own
//! ErrorResponses, which pass through) is a [`RelayError`]; its SQLSTATE is one of
//! `pgline_dataplane::pgwire::sqlstate`'s, never free text. Invariants: the bytes are composed by
//! the codec (`pgwire::compose_error_response`), the same composer the cores use. Thread
//! model: plain values.

use std::fmt;

use pgline_dataplane::pgwire::{self, sqlstate, ErrorFields, TxStatus};

/// A five-character SQLSTATE (see `pgline_dataplane::pgwire::sqlstate`).
pub type SqlState = &'static [u8; 5];

/// Who caused an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The client sent something the relay cannot take (a malformed or unexpected message),
    /// or took too long to answer the origin's authentication.
    Client,
    /// The origin failed, closed a connection, or could not be reached.
    Origin,
    /// pgline's own bounds (sessions, pools, pending logins) or limitations.
    Pgline,
}

/// Whether trying again can help.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retry {
    /// The same request fails again.
    Never,
    /// The session goes on, and the same request may succeed later (pgline was busy, or the
    /// origin connection of the failed request was replaced).
    Later,
    /// The session ends; a new session may succeed.
    Reconnect,
}

/// An error the relay reports to the client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RelayError {
    pub source: Source,
    pub retry: Retry,
    pub code: SqlState,
    pub message: String,
}

impl RelayError {
    /// The client's fault: a protocol violation (08P01) unless `code` says otherwise.
    pub fn client(code: SqlState, message: impl Into<String>) -> RelayError {
        RelayError::new(Source::Client, Retry::Never, code, message)
    }

    /// The origin connection failed or cannot be had (08006).
    pub fn origin(retry: Retry, message: impl Into<String>) -> RelayError {
        RelayError::new(Source::Origin, retry, sqlstate::CONNECTION_FAILURE, message)
    }

    /// pgline is at one of its bounds (53300), for now.
    pub fn busy(retry: Retry, message: impl Into<String>) -> RelayError {
        RelayError::new(
            Source::Pgline,
            retry,
            sqlstate::TOO_MANY_CONNECTIONS,
            message,
        )
    }

    pub fn new(
        source: Source,
        retry: Retry,
        code: SqlState,
        message: impl Into<String>,
    ) -> RelayError {
        RelayError {
            source,
            retry,
            code,
            message: message.into(),
        }
    }

    /// Appends the FATAL ErrorResponse that ends the session.
    pub fn compose_fatal(&self, out: &mut Vec<u8>) {
        let e = ErrorFields::fatal(self.code, self.message.as_bytes());
        pgwire::compose_error_response(out, &e);
    }

    /// Appends the ERROR ErrorResponse of a failed request (the session goes on).
    pub fn compose_error(&self, out: &mut Vec<u8>) {
        let e = ErrorFields::error(self.code, self.message.as_bytes());
        pgwire::compose_error_response(out, &e);
    }
}

impl fmt::Display for RelayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let code = String::from_utf8_lossy(self.code);
        write!(
            f,
            "{code} ({:?}, {:?}): {}",
            self.source, self.retry, self.message
        )
    }
}

impl std::error::Error for RelayError {}

/// Appends ReadyForQuery with the status byte `status` as the origin sent it (`I`, `T` or
/// `E`; anything else is sent as `I`).
pub fn compose_ready(out: &mut Vec<u8>, status: u8) {
    let status = TxStatus::from_byte(status).unwrap_or(TxStatus::Idle);
    pgwire::compose_ready_for_query(out, status);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_compose_as_the_relay_always_sent_them() {
        let mut out = Vec::new();
        RelayError::origin(Retry::Reconnect, "pgline: session closed").compose_fatal(&mut out);
        let mut want = b"E\0\0\0\x32SFATAL\0VFATAL\0C08006\0Mpgline: session closed\0\0".to_vec();
        want[4] = u8::try_from(want.len() - 1).unwrap();
        assert_eq!(out, want);
        let mut out = Vec::new();
        RelayError::busy(Retry::Later, "x").compose_error(&mut out);
        compose_ready(&mut out, b'T');
        assert_eq!(
            out,
            b"E\0\0\0\x1dSERROR\0VERROR\0C53300\0Mx\0\0Z\0\0\0\x05T".to_vec()
        );
    }
}
