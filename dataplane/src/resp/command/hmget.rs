//! `HMGET key field [field ...]`: several columns of a row.

use super::{arg, check_arity, Command, CommandError};
use crate::resp::Args;

pub(super) fn parse(args: Args<'_>) -> Result<Command<'_>, CommandError> {
    check_arity(&args, -3, "hmget")?;
    Ok(Command::HMGet {
        key: arg(&args, 1),
        fields: args.slice(2),
    })
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{parse, strings};
    use super::*;

    #[test]
    fn parses() {
        match parse(&["hmget", "users:1", "id", "name"]) {
            Ok(Command::HMGet { key, fields }) => {
                assert_eq!(key, b"users:1");
                assert_eq!(strings(fields), ["id", "name"]);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn arity() {
        let err = Err(CommandError::WrongArity("hmget"));
        assert_eq!(parse(&["HMGET", "k"]).map(|_| ()), err);
    }
}
