#![deny(unsafe_code)]
//! PostgreSQL wire protocol 3.0, server side: startup, frontend message parsing, backend
//! message composition and statement classification for the cache. Authentication is not
//! checked here: the control plane's relay hands the origin's own exchange through.
//!
//! # Purpose and place on the hit path
//! The engine hands [`parse_startup`] the first bytes of a connection, then
//! [`parse_frontend`] the start of its input buffer for every later message. Both return a
//! borrowing, validated view and the bytes consumed. Replies are written by the `compose_*`
//! functions straight into the engine's output `Vec<u8>`. [`classify`] decides
//! whether a statement can be served from cache; it parses SQL with `sqlparser` and allocates,
//! so it runs once per distinct statement text (at Parse, or at first sight of a simple query
//! text), never per request. The codec knows nothing of the store, of transports or of I/O.
//!
//! # Invariants
//! - Parsing never panics, never reads past `buf`, and on success returns `consumed <= len`.
//! - Length claims are checked against [`Limits`] as soon as their four bytes are seen, before
//!   waiting for the data: a 1 GB claim is `Invalid(TooLarge)`, never `Incomplete`.
//! - A returned message is fully validated (counts, lengths, format codes, trailing bytes), so
//!   its accessors cannot fail.
//! - Parsing and composing allocate nothing beyond growing the caller's output buffer.
//!
//! # Thread model
//! Pure functions over borrowed bytes; each dataplane core uses its own buffers.
//!
//! # Limitations
//! - Protocol 3.0 only (3.x requests are accepted; the caller negotiates down to 3.0). No
//!   TLS, no GSSAPI: SSLRequest and GSSENCRequest are answered `N` by the caller.
//! - No resumable parse state: after `Incomplete` the caller re-parses from the message start,
//!   which costs O(1) (only the five header bytes are read until the message is complete).
//! - Copy and FunctionCall messages are recognised and refused, not served.

mod backend;
mod bind;
pub mod classify;
mod frame;
mod frontend;
mod startup;

#[cfg(test)]
mod client_tests;
#[cfg(test)]
mod origin_tests;
#[cfg(test)]
mod proptests;

pub use backend::{
    compose_auth_cleartext, compose_auth_md5, compose_auth_ok, compose_auth_sasl,
    compose_auth_sasl_continue, compose_auth_sasl_final, compose_backend_key_data,
    compose_bind_complete, compose_close_complete, compose_command_complete, compose_data_row,
    compose_empty_query_response, compose_error_response, compose_message,
    compose_negotiate_protocol_version, compose_no_data, compose_notice_response,
    compose_parameter_description, compose_parameter_status, compose_parse_complete,
    compose_portal_suspended, compose_ready_for_query, compose_row_description,
    compose_select_complete, compose_ssl_response, ErrorFields, FieldDescription, Severity,
    TxStatus,
};
pub use bind::{Bind, Format, Params};
pub use frame::{
    frame_len, split_frame, Frame, Invalid, Limits, ParseError, DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_MAX_PARAMS, DEFAULT_MAX_STARTUP_BYTES,
};
pub use frontend::{
    parse_frontend, parse_password_message, parse_sasl_initial_response, Frontend, Oids,
    SaslInitialResponse, Target, Unsupported,
};
pub use startup::{
    parse_startup, Startup, StartupMessage, StartupParams, CANCEL_REQUEST_CODE,
    GSSENC_REQUEST_CODE, PROTOCOL_3_0, SSL_REQUEST_CODE,
};

/// SQLSTATE codes pgline sends itself (the core and the control plane's relay).
pub mod sqlstate {
    /// `08P01` protocol_violation.
    pub const PROTOCOL_VIOLATION: &[u8; 5] = b"08P01";
    /// `0A000` feature_not_supported.
    pub const FEATURE_NOT_SUPPORTED: &[u8; 5] = b"0A000";
    /// `28000` invalid_authorization_specification.
    pub const INVALID_AUTHORIZATION_SPECIFICATION: &[u8; 5] = b"28000";
    /// `28P01` invalid_password.
    pub const INVALID_PASSWORD: &[u8; 5] = b"28P01";
    /// `57014` query_canceled.
    pub const QUERY_CANCELED: &[u8; 5] = b"57014";
    /// `26000` invalid_sql_statement_name (unknown prepared statement).
    pub const INVALID_SQL_STATEMENT_NAME: &[u8; 5] = b"26000";
    /// `34000` invalid_cursor_name (unknown portal).
    pub const INVALID_CURSOR_NAME: &[u8; 5] = b"34000";
    /// `53300` too_many_connections.
    pub const TOO_MANY_CONNECTIONS: &[u8; 5] = b"53300";
    /// `08006` connection_failure.
    pub const CONNECTION_FAILURE: &[u8; 5] = b"08006";
    /// `53400` configuration_limit_exceeded.
    pub const CONFIGURATION_LIMIT_EXCEEDED: &[u8; 5] = b"53400";
    /// `42P05` duplicate_prepared_statement.
    pub const DUPLICATE_PREPARED_STATEMENT: &[u8; 5] = b"42P05";
    pub const UNDEFINED_PSTATEMENT: &[u8; 5] = b"26000";
}
