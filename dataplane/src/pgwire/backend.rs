//! Backend message composition, written straight into the output buffer.
//!
//! Purpose: every `compose_*` appends one complete backend message to `out` and allocates
//! only if `out` must grow. Invariants: the length field is patched after the body is
//! written, so it always matches; C-string fields never contain a NUL (NULs in the input are
//! dropped), so a field can never end early and shift the rest of the message. Thread model:
//! pure functions over the caller's buffer. Limitations: message lengths above `i32::MAX`
//! are not guarded (the caller's output limits are far below that).

use super::bind::Format;

/// Transaction status carried by ReadyForQuery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxStatus {
    /// `I`: not in a transaction block.
    Idle,
    /// `T`: in a transaction block.
    InTransaction,
    /// `E`: in a failed transaction block (queries rejected until it ends).
    Failed,
}

impl TxStatus {
    /// The status a ReadyForQuery byte stands for (`None`: not one of `I`, `T`, `E`).
    pub fn from_byte(b: u8) -> Option<TxStatus> {
        match b {
            b'I' => Some(TxStatus::Idle),
            b'T' => Some(TxStatus::InTransaction),
            b'E' => Some(TxStatus::Failed),
            _ => None,
        }
    }
}

/// One column of a RowDescription.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FieldDescription<'a> {
    pub name: &'a [u8],
    /// The table's OID, or 0 if the column is not a plain table column.
    pub table_oid: u32,
    /// The column's attribute number, or 0.
    pub column_id: i16,
    pub type_oid: u32,
    /// `pg_type.typlen` (negative for variable width).
    pub type_size: i16,
    /// `pg_attribute.atttypmod` (-1 when there is none).
    pub type_modifier: i32,
    pub format: Format,
}

/// Severity of an ErrorResponse or NoticeResponse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    Error,
    Fatal,
    Panic,
    Warning,
    Notice,
    Debug,
    Info,
    Log,
}

impl Severity {
    /// The non-localized word PostgreSQL sends in fields `S` and `V`.
    pub fn word(self) -> &'static [u8] {
        match self {
            Severity::Error => b"ERROR",
            Severity::Fatal => b"FATAL",
            Severity::Panic => b"PANIC",
            Severity::Warning => b"WARNING",
            Severity::Notice => b"NOTICE",
            Severity::Debug => b"DEBUG",
            Severity::Info => b"INFO",
            Severity::Log => b"LOG",
        }
    }
}

/// The fields of an ErrorResponse or NoticeResponse. `S`, `V`, `C` and `M` are always sent;
/// the others only when present.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ErrorFields<'a> {
    pub severity: Severity,
    /// Five-character SQLSTATE, e.g. `b"28P01"` (see [`super::sqlstate`]).
    pub code: &'a [u8; 5],
    pub message: &'a [u8],
    pub detail: Option<&'a [u8]>,
    pub hint: Option<&'a [u8]>,
    /// 1-based character position in the query text.
    pub position: Option<u32>,
}

impl<'a> ErrorFields<'a> {
    /// An `ERROR` with just a code and a message.
    pub fn error(code: &'a [u8; 5], message: &'a [u8]) -> Self {
        ErrorFields {
            severity: Severity::Error,
            code,
            message,
            detail: None,
            hint: None,
            position: None,
        }
    }

    /// A `FATAL` with just a code and a message (the connection closes after it).
    pub fn fatal(code: &'a [u8; 5], message: &'a [u8]) -> Self {
        ErrorFields {
            severity: Severity::Fatal,
            ..Self::error(code, message)
        }
    }
}

/// Starts a message: tag and a length placeholder. Returns where the length goes.
fn begin(out: &mut Vec<u8>, tag: u8) -> usize {
    out.push(tag);
    let at = out.len();
    out.extend_from_slice(&[0; 4]);
    at
}

/// Patches the length of the message begun at `at`.
fn finish(out: &mut [u8], at: usize) {
    let len = u32::try_from(out.len() - at).unwrap_or(u32::MAX);
    if let Some(field) = out.get_mut(at..at + 4) {
        field.copy_from_slice(&len.to_be_bytes());
    }
}

/// Appends `s` and a NUL, dropping NULs inside `s`.
fn put_cstr(out: &mut Vec<u8>, s: &[u8]) {
    if memchr::memchr(0, s).is_none() {
        out.extend_from_slice(s);
    } else {
        out.extend(s.iter().copied().filter(|&b| b != 0));
    }
    out.push(0);
}

fn put_i16(out: &mut Vec<u8>, n: i16) {
    out.extend_from_slice(&n.to_be_bytes());
}

fn put_i32(out: &mut Vec<u8>, n: i32) {
    out.extend_from_slice(&n.to_be_bytes());
}

fn put_u32(out: &mut Vec<u8>, n: u32) {
    out.extend_from_slice(&n.to_be_bytes());
}

/// Counts are 16-bit on the wire; larger ones are the caller's bug and are clamped.
fn put_count(out: &mut Vec<u8>, n: usize) {
    put_i16(out, i16::try_from(n).unwrap_or(i16::MAX));
}

/// A message with an empty body.
fn compose_empty(out: &mut Vec<u8>, tag: u8) {
    out.push(tag);
    put_i32(out, 4);
}

/// Any message, from its tag and body (for relaying a message with a field rewritten).
pub fn compose_message(out: &mut Vec<u8>, tag: u8, body: &[u8]) {
    let at = begin(out, tag);
    out.extend_from_slice(body);
    finish(out, at);
}

/// The one-byte answer to SSLRequest or GSSENCRequest: `S`/`G` to accept, `N` to refuse.
pub fn compose_ssl_response(out: &mut Vec<u8>, accept: bool) {
    out.push(if accept { b'S' } else { b'N' });
}

fn compose_auth(out: &mut Vec<u8>, code: i32, data: &[u8]) {
    let at = begin(out, b'R');
    put_i32(out, code);
    out.extend_from_slice(data);
    finish(out, at);
}

/// AuthenticationOk.
pub fn compose_auth_ok(out: &mut Vec<u8>) {
    compose_auth(out, 0, b"");
}

/// AuthenticationCleartextPassword.
pub fn compose_auth_cleartext(out: &mut Vec<u8>) {
    compose_auth(out, 3, b"");
}

/// AuthenticationMD5Password with its four-byte salt.
pub fn compose_auth_md5(out: &mut Vec<u8>, salt: [u8; 4]) {
    compose_auth(out, 5, &salt);
}

/// AuthenticationSASL listing the mechanisms offered (e.g. `[b"SCRAM-SHA-256"]`).
pub fn compose_auth_sasl(out: &mut Vec<u8>, mechanisms: &[&[u8]]) {
    let at = begin(out, b'R');
    put_i32(out, 10);
    for m in mechanisms {
        put_cstr(out, m);
    }
    out.push(0);
    finish(out, at);
}

/// AuthenticationSASLContinue with the server's SASL message.
pub fn compose_auth_sasl_continue(out: &mut Vec<u8>, data: &[u8]) {
    compose_auth(out, 11, data);
}

/// AuthenticationSASLFinal with the server's last SASL message.
pub fn compose_auth_sasl_final(out: &mut Vec<u8>, data: &[u8]) {
    compose_auth(out, 12, data);
}

/// ParameterStatus `name = value`.
pub fn compose_parameter_status(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    let at = begin(out, b'S');
    put_cstr(out, name);
    put_cstr(out, value);
    finish(out, at);
}

/// BackendKeyData: the key a client sends in a CancelRequest.
pub fn compose_backend_key_data(out: &mut Vec<u8>, pid: i32, secret: i32) {
    let at = begin(out, b'K');
    put_i32(out, pid);
    put_i32(out, secret);
    finish(out, at);
}

/// NegotiateProtocolVersion: the newest minor version of 3 supported and the startup
/// options (`_pq_.*`) not recognised.
pub fn compose_negotiate_protocol_version(out: &mut Vec<u8>, minor: i32, unknown: &[&[u8]]) {
    let at = begin(out, b'v');
    put_i32(out, minor);
    put_count_i32(out, unknown.len());
    for name in unknown {
        put_cstr(out, name);
    }
    finish(out, at);
}

fn put_count_i32(out: &mut Vec<u8>, n: usize) {
    put_i32(out, i32::try_from(n).unwrap_or(i32::MAX));
}

/// ReadyForQuery with the session's transaction status.
pub fn compose_ready_for_query(out: &mut Vec<u8>, status: TxStatus) {
    let at = begin(out, b'Z');
    out.push(match status {
        TxStatus::Idle => b'I',
        TxStatus::InTransaction => b'T',
        TxStatus::Failed => b'E',
    });
    finish(out, at);
}

/// RowDescription.
pub fn compose_row_description(out: &mut Vec<u8>, fields: &[FieldDescription<'_>]) {
    let at = begin(out, b'T');
    put_count(out, fields.len());
    for f in fields {
        put_cstr(out, f.name);
        put_u32(out, f.table_oid);
        put_i16(out, f.column_id);
        put_u32(out, f.type_oid);
        put_i16(out, f.type_size);
        put_i32(out, f.type_modifier);
        put_i16(out, f.format.code());
    }
    finish(out, at);
}

/// DataRow; `None` is SQL NULL.
pub fn compose_data_row(out: &mut Vec<u8>, values: &[Option<&[u8]>]) {
    let at = begin(out, b'D');
    put_count(out, values.len());
    for v in values {
        match v {
            None => put_i32(out, -1),
            Some(v) => {
                put_count_i32(out, v.len());
                out.extend_from_slice(v);
            }
        }
    }
    finish(out, at);
}

/// CommandComplete with its tag (`SELECT 1`, `INSERT 0 1`, `BEGIN`, ...).
pub fn compose_command_complete(out: &mut Vec<u8>, tag: &[u8]) {
    let at = begin(out, b'C');
    put_cstr(out, tag);
    finish(out, at);
}

/// CommandComplete `SELECT n`, the integer written with `itoa`.
pub fn compose_select_complete(out: &mut Vec<u8>, rows: u64) {
    let at = begin(out, b'C');
    out.extend_from_slice(b"SELECT ");
    out.extend_from_slice(itoa::Buffer::new().format(rows).as_bytes());
    out.push(0);
    finish(out, at);
}

/// EmptyQueryResponse (the query string held no statement).
pub fn compose_empty_query_response(out: &mut Vec<u8>) {
    compose_empty(out, b'I');
}

fn compose_fields(out: &mut Vec<u8>, tag: u8, e: &ErrorFields<'_>) {
    let at = begin(out, tag);
    out.push(b'S');
    put_cstr(out, e.severity.word());
    out.push(b'V');
    put_cstr(out, e.severity.word());
    out.push(b'C');
    put_cstr(out, e.code);
    out.push(b'M');
    put_cstr(out, e.message);
    if let Some(d) = e.detail {
        out.push(b'D');
        put_cstr(out, d);
    }
    if let Some(h) = e.hint {
        out.push(b'H');
        put_cstr(out, h);
    }
    if let Some(p) = e.position {
        out.push(b'P');
        put_cstr(out, itoa::Buffer::new().format(p).as_bytes());
    }
    out.push(0);
    finish(out, at);
}

/// ErrorResponse.
pub fn compose_error_response(out: &mut Vec<u8>, e: &ErrorFields<'_>) {
    compose_fields(out, b'E', e);
}

/// NoticeResponse.
pub fn compose_notice_response(out: &mut Vec<u8>, e: &ErrorFields<'_>) {
    compose_fields(out, b'N', e);
}

/// ParseComplete.
pub fn compose_parse_complete(out: &mut Vec<u8>) {
    compose_empty(out, b'1');
}

/// BindComplete.
pub fn compose_bind_complete(out: &mut Vec<u8>) {
    compose_empty(out, b'2');
}

/// CloseComplete.
pub fn compose_close_complete(out: &mut Vec<u8>) {
    compose_empty(out, b'3');
}

/// NoData (the statement or portal returns no rows).
pub fn compose_no_data(out: &mut Vec<u8>) {
    compose_empty(out, b'n');
}

/// PortalSuspended (Execute hit its row limit).
pub fn compose_portal_suspended(out: &mut Vec<u8>) {
    compose_empty(out, b's');
}

/// ParameterDescription: the type OID of each parameter of a statement.
pub fn compose_parameter_description(out: &mut Vec<u8>, type_oids: &[u32]) {
    let at = begin(out, b't');
    put_count(out, type_oids.len());
    for &oid in type_oids {
        put_u32(out, oid);
    }
    finish(out, at);
}

#[cfg(test)]
#[path = "backend_tests.rs"]
mod tests;
