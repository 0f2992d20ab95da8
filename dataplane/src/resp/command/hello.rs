//! `HELLO [protover [AUTH username password] [SETNAME clientname]]`.
use super::{arg, parse_i64, Command, CommandError};
use crate::resp::Args;

pub(super) fn parse(args: Args<'_>) -> Result<Command<'_>, CommandError> {
    let mut protover = None;
    let mut auth = None;
    let mut setname = None;
    if let Some(v) = args.get(1) {
        let v = parse_i64(v).map_err(|_| CommandError::ProtocolVersion)?;
        if v != 2 && v != 3 {
            return Err(CommandError::ProtocolVersion);
        }
        protover = Some(v as u8);
    }
    let mut i = 2;
    while i < args.len() {
        let opt = arg(args, i);
        if opt.eq_ignore_ascii_case(b"auth") && i + 2 < args.len() {
            auth = Some((arg(args, i + 1), arg(args, i + 2)));
            i += 3;
        } else if opt.eq_ignore_ascii_case(b"setname") && i + 1 < args.len() {
            setname = Some(arg(args, i + 1));
            i += 2;
        } else {
            return Err(CommandError::Syntax);
        }
    }
    Ok(Command::Hello {
        protover,
        auth,
        setname,
    })
}

#[cfg(test)]
mod tests {
    use super::super::testing::args;
    use super::*;

    #[test]
    fn parses() {
        let (b, r) = args(&["HELLO"]);
        assert!(matches!(
            parse(Args::new(&b, &r)),
            Ok(Command::Hello { protover: None, .. })
        ));
        let (b, r) = args(&["HELLO", "3", "AUTH", "default", "pw", "SETNAME", "app"]);
        match parse(Args::new(&b, &r)) {
            Ok(Command::Hello {
                protover: Some(3),
                auth: Some((u, p)),
                setname: Some(n),
            }) => {
                assert_eq!((u, p, n), (&b"default"[..], &b"pw"[..], &b"app"[..]))
            }
            other => panic!("{other:?}"),
        }
        let (b, r) = args(&["HELLO", "4"]);
        assert_eq!(
            parse(Args::new(&b, &r)).unwrap_err(),
            CommandError::ProtocolVersion
        );
        let (b, r) = args(&["HELLO", "3", "AUTH", "x"]);
        assert_eq!(parse(Args::new(&b, &r)).unwrap_err(), CommandError::Syntax);
    }
}
