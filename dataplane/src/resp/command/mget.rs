//! `MGET key [key ...]`: several rows; the reply is an array with a null per missing key.

use super::{check_arity, Command, CommandError};
use crate::resp::Args;

pub(super) fn parse(args: Args<'_>) -> Result<Command<'_>, CommandError> {
    check_arity(&args, -2, "mget")?;
    Ok(Command::MGet {
        keys: args.slice(1),
    })
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{parse, strings};
    use super::*;

    #[test]
    fn parses() {
        match parse(&["MGET", "a", "b", "a"]) {
            Ok(Command::MGet { keys }) => assert_eq!(strings(keys), ["a", "b", "a"]),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn arity() {
        assert_eq!(
            parse(&["mget"]).map(|_| ()),
            Err(CommandError::WrongArity("mget"))
        );
    }
}
