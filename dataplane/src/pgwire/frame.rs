//! Shared framing pieces of the pgwire codec: limits, errors, a checked body reader, and the
//! tag-agnostic message splitter the control plane frames with.
//!
//! Purpose: every frontend message is `tag:u8 len:i32 body` (the startup packet has no tag);
//! this file holds what both the startup and the regular parsers need. Invariants: a length
//! claim is judged against [`Limits`] as soon as its four bytes are seen; the body reader
//! never reads past its slice and reports a short body as [`Invalid`], never `Incomplete`
//! (the frame is already complete when a body is read). Thread model: pure functions.

/// PostgreSQL's own cap on a startup packet (`MAX_STARTUP_PACKET_LENGTH`).
pub const DEFAULT_MAX_STARTUP_BYTES: usize = 10_000;
/// Default cap on one regular frontend message, length field included (16 MiB).
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 16 << 20;
/// Default cap on the parameters of one Bind or Parse (the protocol's own bound is 65,535).
pub const DEFAULT_MAX_PARAMS: usize = u16::MAX as usize;

/// Bounds on what one frontend message may claim.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Longest startup packet, length field included.
    pub max_startup_bytes: usize,
    /// Longest regular message, length field included (the tag byte is not counted).
    pub max_message_bytes: usize,
    /// Most parameters (and parameter types, format codes) in one Parse or Bind.
    pub max_params: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_startup_bytes: DEFAULT_MAX_STARTUP_BYTES,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            max_params: DEFAULT_MAX_PARAMS,
        }
    }
}

/// Why no message could be taken from the buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParseError {
    /// The buffer holds a valid prefix of a message; wait for more bytes.
    Incomplete,
    /// The buffer cannot start a valid message; send the error and close the connection.
    Invalid(Invalid),
}

impl From<Invalid> for ParseError {
    fn from(kind: Invalid) -> Self {
        ParseError::Invalid(kind)
    }
}

/// The ways a frontend message can be malformed or unacceptable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Invalid {
    /// A length field below the minimum for its message (4, or 8 for the startup packet).
    BadLength,
    /// A length field above [`Limits::max_startup_bytes`] / [`Limits::max_message_bytes`].
    TooLarge,
    /// A message type byte the protocol does not define.
    UnknownMessage,
    /// A startup packet asking for a protocol other than 3.x.
    UnsupportedProtocol,
    /// A startup packet without the `user` parameter.
    MissingUser,
    /// A startup packet naming a parameter twice, or with a `user`/`database` that is not
    /// UTF-8. PostgreSQL takes the last of two values; a proxy that read the first would
    /// authenticate one role and route (or serve cache rows) as another, so both are refused.
    AmbiguousStartup,
    /// A string field without its terminating NUL inside the message.
    MissingNul,
    /// A body shorter than its fields claim.
    Truncated,
    /// Bytes left over after the last field.
    TrailingBytes,
    /// A negative count, a negative length other than -1, or a count above the limits.
    BadCount,
    /// A format code other than 0 (text) or 1 (binary).
    BadFormat,
    /// A Bind whose format-code count is neither 0, 1 nor the parameter count.
    FormatCountMismatch,
    /// A Describe or Close target other than `S` (statement) or `P` (portal).
    BadTarget,
}

impl Invalid {
    /// The error message, worded as PostgreSQL words it where it has one.
    pub fn message(self) -> &'static str {
        match self {
            Invalid::BadLength => "invalid message length",
            Invalid::TooLarge => "message too long",
            Invalid::UnknownMessage => "invalid frontend message type",
            Invalid::UnsupportedProtocol => "unsupported frontend protocol",
            Invalid::MissingUser => "no PostgreSQL user name specified in startup packet",
            Invalid::AmbiguousStartup => {
                "startup packet names a parameter twice or has a user/database that is not UTF-8"
            }
            Invalid::MissingNul => "invalid string in message",
            Invalid::Truncated => "insufficient data left in message",
            Invalid::TrailingBytes => "invalid message format",
            Invalid::BadCount => "invalid count or length in message",
            Invalid::BadFormat => "unsupported format code",
            Invalid::FormatCountMismatch => {
                "bind message has a format code count that matches neither 1 nor the parameter count"
            }
            Invalid::BadTarget => "invalid DESCRIBE or CLOSE message subtype",
        }
    }

    /// The SQLSTATE PostgreSQL reports for this fault.
    pub fn sqlstate(self) -> &'static [u8; 5] {
        match self {
            Invalid::UnsupportedProtocol => super::sqlstate::FEATURE_NOT_SUPPORTED,
            Invalid::MissingUser => super::sqlstate::INVALID_AUTHORIZATION_SPECIFICATION,
            _ => super::sqlstate::PROTOCOL_VIOLATION,
        }
    }
}

/// One message of either direction, split off a buffer without looking inside it: its tag and
/// its body (length word stripped).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame<'a> {
    pub tag: u8,
    pub body: &'a [u8],
}

/// The whole length (tag, length word and body) the message at the start of `buf` claims, once
/// its five header bytes are there. The claim is not checked.
pub fn frame_len(buf: &[u8]) -> Option<usize> {
    let len = u32::from_be_bytes(buf.get(1..5)?.try_into().ok()?);
    usize::try_from(len).ok()?.checked_add(1)
}

/// Splits the message at the start of `buf`, whatever its tag: `Ok(Some((frame, consumed)))`
/// when it is all there, `Ok(None)` while it is not. The length word is judged as soon as it is
/// seen: below 4 is [`Invalid::BadLength`], above `max_len` (the length word's value, the tag
/// not counted) is [`Invalid::TooLarge`]. For the tag-agnostic framing of the control plane
/// (the origin's replies, a batch of client messages already checked by the core); the core
/// itself parses with [`super::parse_frontend`].
pub fn split_frame(buf: &[u8], max_len: usize) -> Result<Option<(Frame<'_>, usize)>, Invalid> {
    let Some(total) = frame_len(buf) else {
        return Ok(None);
    };
    let len = total - 1;
    if len < 4 {
        return Err(Invalid::BadLength);
    }
    if len > max_len {
        return Err(Invalid::TooLarge);
    }
    Ok(buf.get(5..total).map(|body| {
        let frame = Frame { tag: buf[0], body };
        (frame, total)
    }))
}

/// A checked cursor over one complete message body.
pub(crate) struct Body<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Body<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Body { buf, pos: 0 }
    }

    /// A NUL-terminated string, without its NUL.
    pub(crate) fn cstr(&mut self) -> Result<&'a [u8], Invalid> {
        let rest = self.buf.get(self.pos..).unwrap_or_default();
        let len = memchr::memchr(0, rest).ok_or(Invalid::MissingNul)?;
        self.pos += len + 1;
        Ok(&rest[..len])
    }

    pub(crate) fn bytes(&mut self, n: usize) -> Result<&'a [u8], Invalid> {
        let end = self.pos.checked_add(n).ok_or(Invalid::Truncated)?;
        let out = self.buf.get(self.pos..end).ok_or(Invalid::Truncated)?;
        self.pos = end;
        Ok(out)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, Invalid> {
        Ok(self.bytes(1)?[0])
    }

    pub(crate) fn i16(&mut self) -> Result<i16, Invalid> {
        let b = self.bytes(2)?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    }

    pub(crate) fn i32(&mut self) -> Result<i32, Invalid> {
        let b = self.bytes(4)?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A 16-bit count, as PostgreSQL reads parameter counts (unsigned), bounded by `max`.
    pub(crate) fn count16(&mut self, max: usize) -> Result<usize, Invalid> {
        let n = usize::from(self.i16()? as u16);
        if n > max {
            return Err(Invalid::BadCount);
        }
        Ok(n)
    }

    /// Everything not read yet.
    pub(crate) fn rest(&mut self) -> &'a [u8] {
        let out = self.buf.get(self.pos..).unwrap_or_default();
        self.pos = self.buf.len();
        out
    }

    /// How many bytes are not read yet.
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    /// Checks that the body was read to its end.
    pub(crate) fn end(&self) -> Result<(), Invalid> {
        if self.pos == self.buf.len() {
            Ok(())
        } else {
            Err(Invalid::TrailingBytes)
        }
    }
}

/// Reads a big-endian `i32` at `pos`, if all four bytes are there.
pub(crate) fn peek_i32(buf: &[u8], pos: usize) -> Option<i32> {
    let b = buf.get(pos..pos.checked_add(4)?)?;
    Some(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_frame_takes_any_tag_and_judges_the_length_early() {
        let msg = b"Z\0\0\0\x05I";
        assert_eq!(
            split_frame(msg, 100),
            Ok(Some((
                Frame {
                    tag: b'Z',
                    body: b"I"
                },
                6
            )))
        );
        let mut two = msg.to_vec();
        two.extend_from_slice(b"\xff\0\0\0\x04");
        assert_eq!(split_frame(&two, 100).map(|f| f.map(|f| f.1)), Ok(Some(6)));
        for short in 0..msg.len() {
            assert_eq!(split_frame(&msg[..short], 100), Ok(None), "{short}");
        }
        assert_eq!(frame_len(b"Z\0\0\0"), None);
        assert_eq!(frame_len(b"Z\0\0\0\x05"), Some(6));
        assert_eq!(split_frame(b"Z\0\0\0\x03", 100), Err(Invalid::BadLength));
        // A huge claim is refused from its header alone, not waited for.
        assert_eq!(split_frame(b"D\x40\0\0\0", 1 << 20), Err(Invalid::TooLarge));
        assert_eq!(split_frame(b"D\xff\xff\xff\xff", usize::MAX), Ok(None));
    }
}
