//! The RESP codec: requests parsed in place from the connection's input buffer, replies
//! composed straight into its output buffer. It knows nothing of the store, transports or I/O.
//!
//! - [`parse_request`] reads one frame: a multibulk array of bulk strings (`*N\r\n$len\r\n...`)
//!   or an inline command (a space-separated line). It returns the argument ranges inside the
//!   buffer and the bytes consumed, or [`ParseError::Incomplete`] (wait for more bytes) or
//!   [`ParseError::Invalid`] (answer the error and close the connection). Every length claim is
//!   checked against [`Limits`] before waiting for the data it announces, so a `$1000000000`
//!   claim fails at once instead of making the server buffer a gigabyte.
//! - [`command::parse_command`] turns arguments into a [`command::Command`] borrowing from the
//!   buffer; one file per command under `command/`.
//! - [`compose`] writes replies; RESP2 and RESP3 differ only in nulls, maps and verbatim strings.
//!
//! Limitations: inline commands take quoted arguments literally (no backslash escapes, since
//! arguments are ranges of the input buffer); RESP3 request types other than arrays of bulk
//! strings are refused, as Redis does.
#![deny(unsafe_code)]

pub mod command;
pub mod compose;
mod parse;

use std::ops::Range;

pub use parse::parse_request;

/// Default most arguments per request.
pub const DEFAULT_MAX_ARGS: usize = 4096;
/// Default largest bulk string in a request.
pub const DEFAULT_MAX_BULK_BYTES: usize = 1024 * 1024;
/// Default longest inline command line.
pub const DEFAULT_MAX_INLINE_BYTES: usize = 64 * 1024;

/// Bounds on one request.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_args: usize,
    pub max_bulk_bytes: usize,
    pub max_inline_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_args: DEFAULT_MAX_ARGS,
            max_bulk_bytes: DEFAULT_MAX_BULK_BYTES,
            max_inline_bytes: DEFAULT_MAX_INLINE_BYTES,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParseError {
    /// The frame is not complete yet: read more and parse again from the frame's start.
    Incomplete,
    /// The input is not RESP: reply with the message and close the connection.
    Invalid(Invalid),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Invalid {
    BadArrayLength,
    TooManyArgs,
    ExpectedBulk,
    BadBulkLength,
    BulkTooLarge,
    MissingCrlf,
    InlineTooLong,
    UnbalancedQuotes,
}

impl Invalid {
    /// The error text, as Redis words it where Redis has the same error.
    pub fn message(self) -> &'static str {
        match self {
            Invalid::BadArrayLength => "ERR Protocol error: invalid multibulk length",
            Invalid::TooManyArgs => "ERR Protocol error: too many arguments in request",
            Invalid::ExpectedBulk => "ERR Protocol error: expected '$' for a bulk string",
            Invalid::BadBulkLength => "ERR Protocol error: invalid bulk length",
            Invalid::BulkTooLarge => "ERR Protocol error: bulk string exceeds the size limit",
            Invalid::MissingCrlf => "ERR Protocol error: expected CRLF after a bulk string",
            Invalid::InlineTooLong => "ERR Protocol error: too big inline request",
            Invalid::UnbalancedQuotes => "ERR Protocol error: unbalanced quotes in request",
        }
    }
}

/// The arguments of one request: ranges into the frame's bytes.
#[derive(Clone, Copy)]
pub struct Args<'a> {
    buf: &'a [u8],
    ranges: &'a [Range<usize>],
}

impl<'a> Args<'a> {
    /// `ranges` must lie inside `buf` (as `parse_request` produces them); ranges that do not
    /// read as empty arguments rather than panicking.
    pub fn new(buf: &'a [u8], ranges: &'a [Range<usize>]) -> Self {
        Args { buf, ranges }
    }

    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    pub fn get(&self, i: usize) -> Option<&'a [u8]> {
        let r = self.ranges.get(i)?;
        Some(self.buf.get(r.clone()).unwrap_or(&[]))
    }

    pub fn iter(&self) -> impl Iterator<Item = &'a [u8]> + 'a {
        let buf = self.buf;
        self.ranges
            .iter()
            .map(move |r| buf.get(r.clone()).unwrap_or(&[]))
    }

    /// The arguments from `from` on (empty if `from` is past the end).
    pub fn slice(&self, from: usize) -> Args<'a> {
        Args {
            buf: self.buf,
            ranges: self.ranges.get(from..).unwrap_or(&[]),
        }
    }
}

impl std::fmt::Debug for Args<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.iter().map(String::from_utf8_lossy))
            .finish()
    }
}

/// The reply protocol a connection speaks (`HELLO 3` switches to RESP3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Protocol {
    #[default]
    Resp2,
    Resp3,
}
