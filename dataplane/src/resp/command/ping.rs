//! `PING [message]`: `+PONG`, or the message as a bulk string.

use super::{check_arity, Command, CommandError};
use crate::resp::Args;

pub(super) fn parse(args: Args<'_>) -> Result<Command<'_>, CommandError> {
    check_arity(&args, -1, "ping")?;
    if args.len() > 2 {
        return Err(CommandError::WrongArity("ping"));
    }
    Ok(Command::Ping {
        message: args.get(1),
    })
}

#[cfg(test)]
mod tests {
    use super::super::test_util::parse;
    use super::*;

    #[test]
    fn parses() {
        assert!(matches!(
            parse(&["PING"]),
            Ok(Command::Ping { message: None })
        ));
        assert!(matches!(
            parse(&["ping", "hi"]),
            Ok(Command::Ping {
                message: Some(b"hi")
            })
        ));
    }

    #[test]
    fn arity() {
        let err = Err(CommandError::WrongArity("ping"));
        assert_eq!(parse(&["PING", "a", "b"]).map(|_| ()), err);
    }
}
