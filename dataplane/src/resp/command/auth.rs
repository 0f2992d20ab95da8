//! `AUTH [username] password`.

use super::{arg, check_arity, Command, CommandError};
use crate::resp::Args;

pub(super) fn parse(args: Args<'_>) -> Result<Command<'_>, CommandError> {
    check_arity(&args, -2, "auth")?;
    match args.len() {
        2 => Ok(Command::Auth {
            username: None,
            password: arg(&args, 1),
        }),
        3 => Ok(Command::Auth {
            username: Some(arg(&args, 1)),
            password: arg(&args, 2),
        }),
        _ => Err(CommandError::Syntax),
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::parse;
    use super::*;

    #[test]
    fn parses() {
        assert!(matches!(
            parse(&["AUTH", "pw"]),
            Ok(Command::Auth {
                username: None,
                password: b"pw"
            })
        ));
        assert!(matches!(
            parse(&["auth", "me", "pw"]),
            Ok(Command::Auth {
                username: Some(b"me"),
                password: b"pw"
            })
        ));
    }

    #[test]
    fn errors() {
        let arity = Err(CommandError::WrongArity("auth"));
        assert_eq!(parse(&["AUTH"]).map(|_| ()), arity);
        let syntax = Err(CommandError::Syntax);
        assert_eq!(parse(&["AUTH", "a", "b", "c"]).map(|_| ()), syntax);
    }
}
