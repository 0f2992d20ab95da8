//! The untagged first packet of a connection: StartupMessage, SSLRequest, GSSENCRequest or
//! CancelRequest.
//!
//! Purpose: tell the four apart by their request code and validate the startup parameters
//! once, so that [`StartupMessage`] accessors cannot fail. Invariants: the length is judged
//! against [`Limits::max_startup_bytes`] as soon as its four bytes are there; parameters are
//! borrowed from the input buffer. Limitations: only protocol 3.x; a 3.x request with a minor
//! version above 0 is accepted and reported in [`StartupMessage::minor`] so the caller can
//! answer with NegotiateProtocolVersion; protocol 3.2's variable-length cancel keys are not
//! parsed (a CancelRequest must be exactly 16 bytes, as in 3.0).

use super::frame::{peek_i32, Body, Invalid, Limits, ParseError};

/// The request code of an SSLRequest (1234 << 16 | 5679).
pub const SSL_REQUEST_CODE: i32 = 80_877_103;
/// The request code of a GSSENCRequest (1234 << 16 | 5680).
pub const GSSENC_REQUEST_CODE: i32 = 80_877_104;
/// The request code of a CancelRequest (1234 << 16 | 5678).
pub const CANCEL_REQUEST_CODE: i32 = 80_877_102;
/// Protocol 3.0 as a startup packet's version field.
pub const PROTOCOL_3_0: i32 = 3 << 16;

/// The first packet of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Startup<'a> {
    /// A StartupMessage for protocol 3.x.
    Startup(StartupMessage<'a>),
    /// The client asks for TLS; answer `S` or `N` (see `compose_ssl_response`) and read
    /// another startup packet.
    SslRequest,
    /// The client asks for GSSAPI encryption; answer `N` and read another startup packet.
    GssEncRequest,
    /// Cancel the query running on the backend with this key. No reply is sent.
    Cancel {
        /// The backend's process id, as sent in BackendKeyData.
        pid: i32,
        /// The backend's secret key, as sent in BackendKeyData.
        secret: i32,
    },
}

/// A validated StartupMessage: the parameters are well-formed NUL-terminated pairs and
/// `user` is among them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StartupMessage<'a> {
    /// The minor protocol version requested (0 for 3.0).
    pub minor: u16,
    /// The raw parameter pairs, without the list's final NUL.
    params: &'a [u8],
}

impl<'a> StartupMessage<'a> {
    /// The (name, value) pairs in the order the client sent them.
    pub fn params(&self) -> StartupParams<'a> {
        StartupParams {
            body: Body::new(self.params),
        }
    }

    /// The value of the parameter `name`, if sent.
    pub fn get(&self, name: &[u8]) -> Option<&'a [u8]> {
        self.params().find(|(n, _)| *n == name).map(|(_, v)| v)
    }

    /// The `user` parameter (always present in a validated message).
    pub fn user(&self) -> &'a [u8] {
        self.get(b"user").unwrap_or_default()
    }

    /// The `database` parameter, defaulting to the user name as PostgreSQL does.
    pub fn database(&self) -> &'a [u8] {
        self.get(b"database").unwrap_or_else(|| self.user())
    }
}

/// Iterator over a validated StartupMessage's parameters.
pub struct StartupParams<'a> {
    body: Body<'a>,
}

impl<'a> Iterator for StartupParams<'a> {
    type Item = (&'a [u8], &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        let name = self.body.cstr().ok()?;
        let value = self.body.cstr().ok()?;
        Some((name, value))
    }
}

/// Parses the first packet of a connection at the start of `buf`; returns it and the bytes
/// consumed.
pub fn parse_startup<'a>(
    buf: &'a [u8],
    limits: &Limits,
) -> Result<(Startup<'a>, usize), ParseError> {
    let Some(len) = peek_i32(buf, 0) else {
        return Err(ParseError::Incomplete);
    };
    let len = usize::try_from(len).map_err(|_| Invalid::BadLength)?;
    if len < 8 {
        return Err(Invalid::BadLength.into());
    }
    if len > limits.max_startup_bytes {
        return Err(Invalid::TooLarge.into());
    }
    let Some(packet) = buf.get(..len) else {
        return Err(ParseError::Incomplete);
    };
    let mut body = Body::new(&packet[4..]);
    let code = body.i32()?;
    let startup = match code {
        SSL_REQUEST_CODE | GSSENC_REQUEST_CODE if len != 8 => return Err(Invalid::BadLength.into()),
        SSL_REQUEST_CODE => Startup::SslRequest,
        GSSENC_REQUEST_CODE => Startup::GssEncRequest,
        CANCEL_REQUEST_CODE => {
            if len != 16 {
                return Err(Invalid::BadLength.into());
            }
            Startup::Cancel {
                pid: body.i32()?,
                secret: body.i32()?,
            }
        }
        _ if code >> 16 == 3 => Startup::Startup(parse_params(&mut body, code as u16)?),
        _ => return Err(Invalid::UnsupportedProtocol.into()),
    };
    Ok((startup, len))
}

/// Validates the parameter list: pairs of C strings ended by one empty name.
fn parse_params<'a>(body: &mut Body<'a>, minor: u16) -> Result<StartupMessage<'a>, Invalid> {
    let params = body.rest();
    let mut check = Body::new(params);
    let mut has_user = false;
    let mut consumed = 0;
    loop {
        let name = check.cstr()?;
        if name.is_empty() {
            break;
        }
        let value = check.cstr()?;
        if name == b"user" || name == b"database" {
            if std::str::from_utf8(value).is_err() {
                return Err(Invalid::AmbiguousStartup);
            }
            has_user |= name == b"user";
        }
        // Quadratic in the parameter count, which max_startup_bytes bounds (a handful in
        // practice).
        let mut earlier = StartupParams {
            body: Body::new(&params[..consumed]),
        };
        if earlier.any(|(n, _)| n == name) {
            return Err(Invalid::AmbiguousStartup);
        }
        consumed = params.len() - check.remaining();
    }
    check.end()?;
    if !has_user {
        return Err(Invalid::MissingUser);
    }
    Ok(StartupMessage {
        minor,
        params: &params[..consumed],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packet(code: i32, body: &[u8]) -> Vec<u8> {
        let mut out = ((8 + body.len()) as i32).to_be_bytes().to_vec();
        out.extend_from_slice(&code.to_be_bytes());
        out.extend_from_slice(body);
        out
    }

    #[test]
    fn startup_with_params() {
        let buf = packet(PROTOCOL_3_0, b"user\0alice\0database\0shop\0\0");
        let (s, n) = parse_startup(&buf, &Limits::default()).expect("valid");
        assert_eq!(n, buf.len());
        let Startup::Startup(m) = s else {
            panic!("{s:?}")
        };
        assert_eq!(
            (m.minor, m.user(), m.database()),
            (0, &b"alice"[..], &b"shop"[..])
        );
        assert_eq!(m.params().count(), 2);
        for cut in 0..buf.len() {
            assert_eq!(
                parse_startup(&buf[..cut], &Limits::default()),
                Err(ParseError::Incomplete)
            );
        }
    }

    #[test]
    fn ambiguous_startups_are_refused() {
        for body in [
            &b"user\0app\0database\0db\0user\0mallory\0\0"[..],
            b"user\0app\0database\0a\0database\0b\0\0",
            b"user\0app\0application_name\0x\0application_name\0y\0\0",
            b"user\0ap\xffp\0\0",
            b"user\0app\0database\0\xfe\0\0",
        ] {
            let buf = packet(PROTOCOL_3_0, body);
            assert_eq!(
                parse_startup(&buf, &Limits::default()),
                Err(Invalid::AmbiguousStartup.into()),
                "{body:?}"
            );
        }
        // Other values may be in any encoding.
        let buf = packet(PROTOCOL_3_0, b"user\0app\0application_name\0\xe9t\xe9\0\0");
        assert!(parse_startup(&buf, &Limits::default()).is_ok());
    }

    #[test]
    fn database_defaults_to_user_and_minor_is_kept() {
        let buf = packet(PROTOCOL_3_0 | 2, b"user\0bob\0_pq_.x\0y\0\0");
        let Ok((Startup::Startup(m), _)) = parse_startup(&buf, &Limits::default()) else {
            panic!()
        };
        assert_eq!((m.minor, m.database()), (2, &b"bob"[..]));
    }

    #[test]
    fn special_requests() {
        let l = Limits::default();
        assert_eq!(
            parse_startup(&packet(SSL_REQUEST_CODE, b""), &l),
            Ok((Startup::SslRequest, 8))
        );
        assert_eq!(
            parse_startup(&packet(GSSENC_REQUEST_CODE, b""), &l),
            Ok((Startup::GssEncRequest, 8))
        );
        let mut body = 4242i32.to_be_bytes().to_vec();
        body.extend_from_slice(&(-7i32).to_be_bytes());
        assert_eq!(
            parse_startup(&packet(CANCEL_REQUEST_CODE, &body), &l),
            Ok((
                Startup::Cancel {
                    pid: 4242,
                    secret: -7
                },
                16
            ))
        );
    }

    #[test]
    fn bad_startups() {
        let l = Limits::default();
        let bad = |buf: &[u8]| match parse_startup(buf, &l) {
            Err(ParseError::Invalid(k)) => k,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            bad(&packet(2 << 16, b"user\0a\0\0")),
            Invalid::UnsupportedProtocol
        );
        assert_eq!(
            bad(&packet(PROTOCOL_3_0, b"database\0a\0\0")),
            Invalid::MissingUser
        );
        assert_eq!(
            bad(&packet(PROTOCOL_3_0, b"user\0a\0")),
            Invalid::MissingNul
        );
        assert_eq!(
            bad(&packet(PROTOCOL_3_0, b"user\0a\0\0x")),
            Invalid::TrailingBytes
        );
        assert_eq!(
            bad(&packet(CANCEL_REQUEST_CODE, b"1234")),
            Invalid::BadLength
        );
        assert_eq!(bad(&[0, 0, 0, 4]), Invalid::BadLength);
        assert_eq!(bad(&[0xff, 0, 0, 4]), Invalid::BadLength);
        // A huge claim is refused before its bytes arrive.
        assert_eq!(bad(&[0, 1, 0, 0]), Invalid::TooLarge);
    }
}
