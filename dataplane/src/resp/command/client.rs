//! `CLIENT SETNAME|GETNAME|SETINFO|ID|INFO`.
use super::{arg, ClientSub, Command, CommandError};
use crate::resp::Args;

pub(super) fn parse(args: Args<'_>) -> Result<Command<'_>, CommandError> {
    let sub = arg(args, 1);
    let n = args.len();
    let sub = if sub.eq_ignore_ascii_case(b"setname") && n == 3 {
        let name = arg(args, 2);
        if name.iter().any(|&b| b <= b' ' || b > b'~') {
            return Err(CommandError::BadClientName);
        }
        ClientSub::SetName { name }
    } else if sub.eq_ignore_ascii_case(b"getname") && n == 2 {
        ClientSub::GetName
    } else if sub.eq_ignore_ascii_case(b"setinfo") && n == 4 {
        ClientSub::SetInfo {
            attr: arg(args, 2),
            value: arg(args, 3),
        }
    } else if sub.eq_ignore_ascii_case(b"id") && n == 2 {
        ClientSub::Id
    } else if sub.eq_ignore_ascii_case(b"info") && n == 2 {
        ClientSub::Info
    } else if n < 2 {
        return Err(CommandError::WrongArity("client"));
    } else {
        ClientSub::Other
    };
    Ok(Command::Client { sub })
}

#[cfg(test)]
mod tests {
    use super::super::testing::args;
    use super::*;

    #[test]
    fn parses() {
        let (b, r) = args(&["CLIENT", "SETNAME", "app"]);
        assert!(matches!(
            parse(Args::new(&b, &r)),
            Ok(Command::Client {
                sub: ClientSub::SetName { name: b"app" }
            })
        ));
        let (b, r) = args(&["CLIENT", "SETNAME", "a b"]);
        assert_eq!(
            parse(Args::new(&b, &r)).unwrap_err(),
            CommandError::BadClientName
        );
        let (b, r) = args(&["client", "setinfo", "lib-name", "redis-py"]);
        assert!(matches!(
            parse(Args::new(&b, &r)),
            Ok(Command::Client {
                sub: ClientSub::SetInfo { .. }
            })
        ));
        let (b, r) = args(&["CLIENT", "ID"]);
        assert!(matches!(
            parse(Args::new(&b, &r)),
            Ok(Command::Client { sub: ClientSub::Id })
        ));
        let (b, r) = args(&["CLIENT", "KILL", "x"]);
        assert!(matches!(
            parse(Args::new(&b, &r)),
            Ok(Command::Client {
                sub: ClientSub::Other
            })
        ));
        let (b, r) = args(&["CLIENT"]);
        assert!(parse(Args::new(&b, &r)).is_err());
    }
}
