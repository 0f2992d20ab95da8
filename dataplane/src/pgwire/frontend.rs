//! Tagged frontend messages after startup: framing and the message views.
//!
//! Purpose: take one complete message from the start of a connection's input buffer and
//! return a borrowing, validated view of it. Invariants: the length claim is checked against
//! [`Limits::max_message_bytes`] as soon as the five header bytes are there; every field of a
//! message is validated before it is returned, so the views' accessors cannot fail or panic;
//! the views borrow the input (no copies, no allocation). Thread model: pure functions.
//! Limitations: the three `p` messages (PasswordMessage, SASLInitialResponse, SASLResponse)
//! share a tag and are told apart only by the authentication state, so they come out as
//! [`Frontend::Password`] and the caller decodes them with [`parse_sasl_initial_response`]
//! when it expects one. Copy-in and FunctionCall messages are recognised as
//! [`Frontend::Unsupported`] so the caller can refuse them with a clean error.

use super::bind::{parse_bind, Bind};
use super::frame::{peek_i32, Body, Invalid, Limits, ParseError};

/// What to describe or close.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// `S`: a prepared statement.
    Statement,
    /// `P`: a portal.
    Portal,
}

/// Frontend messages pgline recognises but does not serve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unsupported {
    /// `d` CopyData.
    CopyData,
    /// `c` CopyDone.
    CopyDone,
    /// `f` CopyFail.
    CopyFail,
    /// `F` FunctionCall.
    FunctionCall,
}

/// One validated frontend message, borrowing the input buffer. Names are without their NUL;
/// an empty name is the unnamed statement or portal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frontend<'a> {
    /// `Q`: a simple query (may hold several statements, or none).
    Query(&'a [u8]),
    /// `P`: prepare `query` as statement `name`, with parameter type OIDs (0 = unspecified).
    Parse {
        name: &'a [u8],
        query: &'a [u8],
        param_types: Oids<'a>,
    },
    /// `B`: bind a statement's parameters into a portal.
    Bind(Bind<'a>),
    /// `D`: describe a statement or a portal.
    Describe { target: Target, name: &'a [u8] },
    /// `E`: run a portal, returning at most `max_rows` rows (0 = all).
    Execute { portal: &'a [u8], max_rows: i32 },
    /// `S`: end of an extended-query batch.
    Sync,
    /// `H`: send what is pending.
    Flush,
    /// `C`: close a statement or a portal.
    Close { target: Target, name: &'a [u8] },
    /// `X`: the client is leaving.
    Terminate,
    /// `p`: the body of a PasswordMessage, SASLInitialResponse or SASLResponse.
    Password(&'a [u8]),
    /// A message the protocol defines and pgline refuses.
    Unsupported(Unsupported),
}

/// A validated list of big-endian 32-bit OIDs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Oids<'a> {
    raw: &'a [u8],
}

impl<'a> Oids<'a> {
    /// How many OIDs.
    pub fn len(&self) -> usize {
        self.raw.len() / 4
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.raw.is_empty()
    }

    /// The OIDs in order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + 'a {
        self.raw
            .chunks_exact(4)
            .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]))
    }
}

/// Parses one frontend message at the start of `buf`; returns it and the bytes consumed
/// (tag, length and body).
pub fn parse_frontend<'a>(
    buf: &'a [u8],
    limits: &Limits,
) -> Result<(Frontend<'a>, usize), ParseError> {
    let Some(&tag) = buf.first() else {
        return Err(ParseError::Incomplete);
    };
    if !is_frontend_tag(tag) {
        return Err(Invalid::UnknownMessage.into());
    }
    let Some(len) = peek_i32(buf, 1) else {
        return Err(ParseError::Incomplete);
    };
    let len = usize::try_from(len).map_err(|_| Invalid::BadLength)?;
    if len < 4 {
        return Err(Invalid::BadLength.into());
    }
    if len > limits.max_message_bytes {
        return Err(Invalid::TooLarge.into());
    }
    let Some(body) = buf.get(5..len + 1) else {
        return Err(ParseError::Incomplete);
    };
    let msg = parse_body(tag, body, limits)?;
    Ok((msg, len + 1))
}

fn is_frontend_tag(tag: u8) -> bool {
    matches!(
        tag,
        b'Q' | b'P'
            | b'B'
            | b'D'
            | b'E'
            | b'S'
            | b'H'
            | b'C'
            | b'X'
            | b'p'
            | b'd'
            | b'c'
            | b'f'
            | b'F'
    )
}

fn parse_body<'a>(tag: u8, body: &'a [u8], limits: &Limits) -> Result<Frontend<'a>, Invalid> {
    let mut b = Body::new(body);
    let msg = match tag {
        b'Q' => Frontend::Query(b.cstr()?),
        b'P' => {
            let name = b.cstr()?;
            let query = b.cstr()?;
            let n = b.count16(limits.max_params)?;
            let raw = b.bytes(n * 4)?;
            Frontend::Parse {
                name,
                query,
                param_types: Oids { raw },
            }
        }
        b'B' => Frontend::Bind(parse_bind(&mut b, limits)?),
        b'D' => Frontend::Describe {
            target: parse_target(&mut b)?,
            name: b.cstr()?,
        },
        b'C' => Frontend::Close {
            target: parse_target(&mut b)?,
            name: b.cstr()?,
        },
        b'E' => Frontend::Execute {
            portal: b.cstr()?,
            max_rows: b.i32()?,
        },
        b'S' => Frontend::Sync,
        b'H' => Frontend::Flush,
        b'X' => Frontend::Terminate,
        b'p' => Frontend::Password(b.rest()),
        b'd' => {
            b.rest();
            Frontend::Unsupported(Unsupported::CopyData)
        }
        b'c' => Frontend::Unsupported(Unsupported::CopyDone),
        b'f' => {
            b.cstr()?;
            Frontend::Unsupported(Unsupported::CopyFail)
        }
        b'F' => {
            b.rest();
            Frontend::Unsupported(Unsupported::FunctionCall)
        }
        _ => return Err(Invalid::UnknownMessage),
    };
    b.end()?;
    Ok(msg)
}

fn parse_target(b: &mut Body<'_>) -> Result<Target, Invalid> {
    match b.u8()? {
        b'S' => Ok(Target::Statement),
        b'P' => Ok(Target::Portal),
        _ => Err(Invalid::BadTarget),
    }
}

/// A SASLInitialResponse: the mechanism chosen and the client's first message (`None` when
/// the client sent length -1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SaslInitialResponse<'a> {
    pub mechanism: &'a [u8],
    pub data: Option<&'a [u8]>,
}

/// Decodes the body of a `p` message sent in answer to AuthenticationSASL.
pub fn parse_sasl_initial_response(body: &[u8]) -> Result<SaslInitialResponse<'_>, Invalid> {
    let mut b = Body::new(body);
    let mechanism = b.cstr()?;
    let len = b.i32()?;
    let data = match len {
        -1 => None,
        n if n >= 0 => Some(b.bytes(n as usize)?),
        _ => return Err(Invalid::BadCount),
    };
    b.end()?;
    Ok(SaslInitialResponse { mechanism, data })
}

/// Decodes the body of a PasswordMessage (a cleartext or md5 password): the string without
/// its NUL.
pub fn parse_password_message(body: &[u8]) -> Result<&[u8], Invalid> {
    let mut b = Body::new(body);
    let password = b.cstr()?;
    b.end()?;
    Ok(password)
}

#[cfg(test)]
#[path = "frontend_tests.rs"]
mod tests;
