//! `DBSIZE`: number of cached keys.

use super::{check_arity, Command, CommandError};
use crate::resp::Args;

pub(super) fn parse(args: Args<'_>) -> Result<Command<'_>, CommandError> {
    check_arity(&args, 1, "dbsize")?;
    Ok(Command::DbSize)
}

#[cfg(test)]
mod tests {
    use super::super::test_util::parse;
    use super::*;

    #[test]
    fn parses() {
        assert!(matches!(parse(&["dbsize"]), Ok(Command::DbSize)));
        let err = Err(CommandError::WrongArity("dbsize"));
        assert_eq!(parse(&["DBSIZE", "x"]).map(|_| ()), err);
    }
}
