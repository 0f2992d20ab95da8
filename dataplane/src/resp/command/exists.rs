//! `EXISTS key [key ...]`: how many of the keys exist (duplicates count each time).

use super::{check_arity, Command, CommandError};
use crate::resp::Args;

pub(super) fn parse(args: Args<'_>) -> Result<Command<'_>, CommandError> {
    check_arity(&args, -2, "exists")?;
    Ok(Command::Exists {
        keys: args.slice(1),
    })
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{parse, strings};
    use super::*;

    #[test]
    fn parses() {
        match parse(&["exists", "a", "a"]) {
            Ok(Command::Exists { keys }) => assert_eq!(strings(keys), ["a", "a"]),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn arity() {
        let err = Err(CommandError::WrongArity("exists"));
        assert_eq!(parse(&["EXISTS"]).map(|_| ()), err);
    }
}
