//! `HGETALL key`: a row as a map of column to value.

use super::{arg, check_arity, Command, CommandError};
use crate::resp::Args;

pub(super) fn parse(args: Args<'_>) -> Result<Command<'_>, CommandError> {
    check_arity(&args, 2, "hgetall")?;
    Ok(Command::HGetAll { key: arg(&args, 1) })
}

#[cfg(test)]
mod tests {
    use super::super::test_util::parse;
    use super::*;

    #[test]
    fn parses() {
        assert!(matches!(
            parse(&["HGETALL", "t:1"]),
            Ok(Command::HGetAll { key: b"t:1" })
        ));
    }

    #[test]
    fn arity() {
        let err = Err(CommandError::WrongArity("hgetall"));
        assert_eq!(parse(&["HGETALL"]).map(|_| ()), err);
        assert_eq!(parse(&["HGETALL", "a", "b"]).map(|_| ()), err);
    }
}
