//! `HELLO [protover [AUTH username password] [SETNAME clientname]]`: protocol handshake.
//!
//! The version is checked before the options, as Redis does: a non-integer version is
//! [`CommandError::NotAnInteger`] (Redis words it "Protocol version is not an integer or out
//! of range"), a version other than 2 or 3 is [`CommandError::ProtocolVersion`], an unknown
//! or incomplete option is [`CommandError::Syntax`]. Options may repeat; the last one wins.

use super::{arg, parse_i64, Command, CommandError};
use crate::resp::Args;

pub(super) fn parse(args: Args<'_>) -> Result<Command<'_>, CommandError> {
    let Some(version) = args.get(1) else {
        return Ok(Command::Hello {
            protover: None,
            auth: None,
            setname: None,
        });
    };
    let protover = match parse_i64(version).ok_or(CommandError::NotAnInteger)? {
        2 => 2,
        3 => 3,
        _ => return Err(CommandError::ProtocolVersion),
    };
    let (mut auth, mut setname) = (None, None);
    let mut i = 2;
    while let Some(option) = args.get(i) {
        let more = args.len() - i - 1;
        if option.eq_ignore_ascii_case(b"AUTH") && more >= 2 {
            auth = Some((arg(&args, i + 1), arg(&args, i + 2)));
            i += 3;
        } else if option.eq_ignore_ascii_case(b"SETNAME") && more >= 1 {
            setname = Some(arg(&args, i + 1));
            i += 2;
        } else {
            return Err(CommandError::Syntax);
        }
    }
    Ok(Command::Hello {
        protover: Some(protover),
        auth,
        setname,
    })
}

#[cfg(test)]
mod tests {
    use super::super::test_util::parse;
    use super::*;

    #[test]
    fn bare_and_versions() {
        assert!(matches!(
            parse(&["HELLO"]),
            Ok(Command::Hello {
                protover: None,
                auth: None,
                setname: None
            })
        ));
        assert!(matches!(
            parse(&["hello", "2"]),
            Ok(Command::Hello {
                protover: Some(2),
                ..
            })
        ));
        assert!(matches!(
            parse(&["HELLO", "3"]),
            Ok(Command::Hello {
                protover: Some(3),
                ..
            })
        ));
    }

    #[test]
    fn options() {
        match parse(&["HELLO", "3", "auth", "default", "pw", "SETNAME", "app"]) {
            Ok(Command::Hello {
                protover,
                auth,
                setname,
            }) => {
                assert_eq!(protover, Some(3));
                assert_eq!(auth, Some((&b"default"[..], &b"pw"[..])));
                assert_eq!(setname, Some(&b"app"[..]));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn errors() {
        let proto = Err(CommandError::ProtocolVersion);
        assert_eq!(parse(&["HELLO", "4"]).map(|_| ()), proto);
        assert_eq!(parse(&["HELLO", "1"]).map(|_| ()), proto);
        assert_eq!(parse(&["HELLO", "4", "BAD"]).map(|_| ()), proto);
        let not_int = Err(CommandError::NotAnInteger);
        assert_eq!(parse(&["HELLO", "three"]).map(|_| ()), not_int);
        let syntax = Err(CommandError::Syntax);
        assert_eq!(parse(&["HELLO", "3", "AUTH", "u"]).map(|_| ()), syntax);
        assert_eq!(parse(&["HELLO", "3", "SETNAME"]).map(|_| ()), syntax);
        assert_eq!(parse(&["HELLO", "3", "FOO", "x"]).map(|_| ()), syntax);
    }
}
