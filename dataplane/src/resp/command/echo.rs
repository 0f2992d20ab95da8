//! `ECHO message`: the message as a bulk string.

use super::{arg, check_arity, Command, CommandError};
use crate::resp::Args;

pub(super) fn parse(args: Args<'_>) -> Result<Command<'_>, CommandError> {
    check_arity(&args, 2, "echo")?;
    Ok(Command::Echo {
        message: arg(&args, 1),
    })
}

#[cfg(test)]
mod tests {
    use super::super::test_util::parse;
    use super::*;

    #[test]
    fn parses() {
        assert!(matches!(
            parse(&["ECHO", "hi"]),
            Ok(Command::Echo { message: b"hi" })
        ));
    }

    #[test]
    fn arity() {
        let err = Err(CommandError::WrongArity("echo"));
        assert_eq!(parse(&["ECHO"]).map(|_| ()), err);
        assert_eq!(parse(&["ECHO", "a", "b"]).map(|_| ()), err);
    }
}
