//! `HGET key field`: one column of a row.

use super::{arg, check_arity, Command, CommandError};
use crate::resp::Args;

pub(super) fn parse(args: Args<'_>) -> Result<Command<'_>, CommandError> {
    check_arity(&args, 3, "hget")?;
    Ok(Command::HGet {
        key: arg(&args, 1),
        field: arg(&args, 2),
    })
}

#[cfg(test)]
mod tests {
    use super::super::test_util::parse;
    use super::*;

    #[test]
    fn parses() {
        assert!(matches!(
            parse(&["HGET", "users:1", "name"]),
            Ok(Command::HGet {
                key: b"users:1",
                field: b"name"
            })
        ));
    }

    #[test]
    fn arity() {
        let err = Err(CommandError::WrongArity("hget"));
        assert_eq!(parse(&["HGET", "k"]).map(|_| ()), err);
        assert_eq!(parse(&["HGET", "k", "f", "g"]).map(|_| ()), err);
    }
}
