//! `GET key`: one row by key.

use super::{arg, check_arity, Command, CommandError};
use crate::resp::Args;

pub(super) fn parse(args: Args<'_>) -> Result<Command<'_>, CommandError> {
    check_arity(&args, 2, "get")?;
    Ok(Command::Get { key: arg(&args, 1) })
}

#[cfg(test)]
mod tests {
    use super::super::test_util::parse;
    use super::*;

    #[test]
    fn parses() {
        assert!(matches!(
            parse(&["GET", "users:42"]),
            Ok(Command::Get { key: b"users:42" })
        ));
        assert!(matches!(parse(&["get", ""]), Ok(Command::Get { key: b"" })));
    }

    #[test]
    fn arity() {
        let err = Err(CommandError::WrongArity("get"));
        assert_eq!(parse(&["GET"]).map(|_| ()), err);
        assert_eq!(parse(&["GET", "a", "b"]).map(|_| ()), err);
    }
}
