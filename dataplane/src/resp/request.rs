//! Request framing: multibulk and inline requests into argument ranges.
//!
//! Purpose: split the bytes at the start of a connection's input buffer into one request's
//! arguments without copying them, or say that more bytes are needed, or that the input is
//! malformed. Invariants, thread model and limitations are those of the [`resp`](super)
//! module: never panics, never allocates beyond growing the caller's range vector, checks
//! length claims against [`Limits`] before waiting for the bytes they announce.

use core::ops::Range;

/// Default cap on the number of arguments in one request.
pub const DEFAULT_MAX_ARGS: usize = 4096;
/// Default cap on the length of one bulk argument (1 MiB).
pub const DEFAULT_MAX_BULK_BYTES: usize = 1 << 20;
/// Default cap on the length of one inline request line (64 KiB).
pub const DEFAULT_MAX_INLINE_BYTES: usize = 64 << 10;

/// Bounds on what one request may claim.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Most arguments in one request (the command name counts).
    pub max_args: usize,
    /// Longest bulk argument, in bytes.
    pub max_bulk_bytes: usize,
    /// Longest inline line, in bytes, excluding its `\n`.
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

/// Why no request could be taken from the buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParseError {
    /// The buffer holds a valid prefix of a request; wait for more bytes.
    Incomplete,
    /// The buffer cannot start a valid request; reply with the error and close.
    Invalid(Invalid),
}

/// The ways a request can be malformed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Invalid {
    /// `*` not followed by a canonical count (digits, or `-1`) and CRLF.
    BadArrayLength,
    /// `$` not followed by a canonical non-negative length and CRLF.
    BadBulkLength,
    /// More arguments than [`Limits::max_args`].
    TooManyArgs,
    /// A bulk claim larger than [`Limits::max_bulk_bytes`].
    BulkTooLarge,
    /// An inline line longer than [`Limits::max_inline_bytes`].
    InlineTooLong,
    /// An element of a request array that is not a bulk string.
    ExpectedBulk,
    /// A length line or bulk payload not followed by `\r\n`.
    MissingCrlf,
    /// An inline quoted word that is not closed, or closed and not followed by a space.
    UnbalancedQuotes,
    /// A backslash escape inside inline quotes (cannot be represented as an input range).
    UnsupportedEscape,
}

impl Invalid {
    /// The error text without its `ERR ` code, worded as Redis words it.
    pub fn message(self) -> &'static str {
        match self {
            Invalid::BadArrayLength | Invalid::TooManyArgs => {
                "Protocol error: invalid multibulk length"
            }
            Invalid::BadBulkLength | Invalid::BulkTooLarge => "Protocol error: invalid bulk length",
            Invalid::InlineTooLong => "Protocol error: too big inline request",
            Invalid::ExpectedBulk => "Protocol error: expected '$'",
            Invalid::MissingCrlf => "Protocol error: expected CRLF",
            Invalid::UnbalancedQuotes => "Protocol error: unbalanced quotes in request",
            Invalid::UnsupportedEscape => {
                "Protocol error: escape sequences in inline requests are not supported"
            }
        }
    }

    /// Writes the whole error reply, `-ERR <message>\r\n`.
    pub fn compose(self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"-ERR ");
        out.extend_from_slice(self.message().as_bytes());
        out.extend_from_slice(b"\r\n");
    }
}

/// Parses one request at the start of `buf`. On success fills `args` (cleared first) with the
/// byte ranges of each argument inside `buf` and returns the number of bytes consumed.
///
/// Multibulk (`*N\r\n$len\r\narg\r\n...`) and inline commands (space-separated line ending in
/// `\n` or `\r\n`, with Redis-style quoting). Empty inline lines and `*0`/`*-1` are consumed
/// and yield zero args (the caller skips them). On error the contents of `args` are
/// unspecified.
pub fn parse_request(
    buf: &[u8],
    limits: &Limits,
    args: &mut Vec<Range<usize>>,
) -> Result<usize, ParseError> {
    args.clear();
    match buf.first() {
        None => Err(ParseError::Incomplete),
        Some(b'*') => parse_multibulk(buf, limits, args),
        Some(_) => parse_inline(buf, limits, args),
    }
}

/// A parsed length line.
enum Len {
    /// `-1`
    Null,
    Count(usize),
}

/// How to judge one length line.
struct LenRule {
    max: usize,
    allow_null: bool,
    bad: Invalid,
    too_big: Invalid,
}

/// Parses `<digits>\r\n` (or `-1\r\n` if allowed) starting at `pos`, just after the type
/// byte. Returns the length and the position after the CRLF.
fn parse_len(buf: &[u8], pos: usize, rule: &LenRule) -> Result<(Len, usize), ParseError> {
    let invalid = |kind| Err(ParseError::Invalid(kind));
    if buf.get(pos) == Some(&b'-') {
        if !rule.allow_null {
            return invalid(rule.bad);
        }
        return match buf.get(pos + 1..pos + 4) {
            Some(b"1\r\n") => Ok((Len::Null, pos + 4)),
            Some([b'1', b'\r', _]) => invalid(Invalid::MissingCrlf),
            Some(_) => invalid(rule.bad),
            None => match buf.get(pos + 1..) {
                Some(b"" | b"1" | b"1\r") => Err(ParseError::Incomplete),
                _ => invalid(rule.bad),
            },
        };
    }
    let start = pos;
    let mut pos = pos;
    let mut n: usize = 0;
    loop {
        match buf.get(pos) {
            None => return Err(ParseError::Incomplete),
            Some(b'\r') => break,
            Some(&d @ b'0'..=b'9') => {
                if n == 0 && pos > start {
                    return invalid(rule.bad); // leading zero
                }
                n = match n
                    .checked_mul(10)
                    .and_then(|n| n.checked_add(usize::from(d - b'0')))
                {
                    Some(n) if n <= rule.max => n,
                    _ => return invalid(rule.too_big),
                };
                pos += 1;
            }
            Some(_) => return invalid(rule.bad),
        }
    }
    if pos == start {
        return invalid(rule.bad);
    }
    match buf.get(pos + 1) {
        None => Err(ParseError::Incomplete),
        Some(b'\n') => Ok((Len::Count(n), pos + 2)),
        Some(_) => invalid(Invalid::MissingCrlf),
    }
}

fn parse_multibulk(
    buf: &[u8],
    limits: &Limits,
    args: &mut Vec<Range<usize>>,
) -> Result<usize, ParseError> {
    let array_rule = LenRule {
        max: limits.max_args,
        allow_null: true,
        bad: Invalid::BadArrayLength,
        too_big: Invalid::TooManyArgs,
    };
    let bulk_rule = LenRule {
        max: limits.max_bulk_bytes,
        allow_null: false,
        bad: Invalid::BadBulkLength,
        too_big: Invalid::BulkTooLarge,
    };
    let (count, mut pos) = parse_len(buf, 1, &array_rule)?;
    let count = match count {
        Len::Null => return Ok(pos),
        Len::Count(n) => n,
    };
    for _ in 0..count {
        match buf.get(pos) {
            None => return Err(ParseError::Incomplete),
            Some(b'$') => {}
            Some(_) => return Err(ParseError::Invalid(Invalid::ExpectedBulk)),
        }
        let (len, data) = parse_len(buf, pos + 1, &bulk_rule)?;
        let Len::Count(len) = len else {
            return Err(ParseError::Invalid(Invalid::BadBulkLength));
        };
        let end = data
            .checked_add(len)
            .ok_or(ParseError::Invalid(Invalid::BulkTooLarge))?;
        match buf.get(end..end.saturating_add(2)) {
            Some(b"\r\n") => {}
            Some(_) => return Err(ParseError::Invalid(Invalid::MissingCrlf)),
            None if buf.get(end).is_some_and(|&b| b != b'\r') => {
                return Err(ParseError::Invalid(Invalid::MissingCrlf));
            }
            None => return Err(ParseError::Incomplete),
        }
        args.push(data..end);
        pos = end + 2;
    }
    Ok(pos)
}

/// Whitespace between inline words, as C's `isspace`.
fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r' | b'\n' | 0x0b | 0x0c)
}

fn parse_inline(
    buf: &[u8],
    limits: &Limits,
    args: &mut Vec<Range<usize>>,
) -> Result<usize, ParseError> {
    let window = buf
        .get(..limits.max_inline_bytes.saturating_add(1))
        .unwrap_or(buf);
    let Some(nl) = memchr::memchr(b'\n', window) else {
        return if buf.len() > limits.max_inline_bytes {
            Err(ParseError::Invalid(Invalid::InlineTooLong))
        } else {
            Err(ParseError::Incomplete)
        };
    };
    let line = buf.get(..nl).unwrap_or_default();
    let mut pos = 0;
    loop {
        while line.get(pos).is_some_and(|&b| is_space(b)) {
            pos += 1;
        }
        let Some(&first) = line.get(pos) else { break };
        if args.len() >= limits.max_args {
            return Err(ParseError::Invalid(Invalid::TooManyArgs));
        }
        let (word, next) = match first {
            b'"' | b'\'' => scan_quoted(line, pos, first)?,
            _ => {
                let len = line[pos..].iter().position(|&b| is_space(b));
                let end = len.map_or(line.len(), |len| pos + len);
                (pos..end, end)
            }
        };
        args.push(word);
        pos = next;
    }
    Ok(nl + 1)
}

/// Scans a word quoted with `quote` starting at `line[open]`; returns the range of its
/// contents and the position after the closing quote.
fn scan_quoted(line: &[u8], open: usize, quote: u8) -> Result<(Range<usize>, usize), ParseError> {
    let start = open + 1;
    let rest = line.get(start..).unwrap_or_default();
    let Some(len) = memchr::memchr(quote, rest) else {
        return Err(ParseError::Invalid(Invalid::UnbalancedQuotes));
    };
    let end = start + len;
    let body = &rest[..len];
    // In "..." every backslash starts an escape; in '...' only \' does, and it would end at
    // the quote memchr found.
    let escaped = if quote == b'"' {
        body.contains(&b'\\')
    } else {
        body.last() == Some(&b'\\')
    };
    if escaped {
        return Err(ParseError::Invalid(Invalid::UnsupportedEscape));
    }
    match line.get(end + 1) {
        Some(&b) if !is_space(b) => Err(ParseError::Invalid(Invalid::UnbalancedQuotes)),
        _ => Ok((start..end, end + 1)),
    }
}

#[cfg(test)]
#[path = "request_tests.rs"]
mod tests;
