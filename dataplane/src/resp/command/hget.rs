//! `HGET key column`: one column of the row, as PostgreSQL's text output.
use super::{arg, arity, Command, CommandError};
use crate::resp::Args;

pub(super) fn parse(args: Args<'_>) -> Result<Command<'_>, CommandError> {
    arity(args, 3, 3, "hget")?;
    Ok(Command::HGet {
        key: arg(args, 1),
        field: arg(args, 2),
    })
}

#[cfg(test)]
mod tests {
    use super::super::testing::args;
    use super::*;

    #[test]
    fn parses() {
        let (b, r) = args(&["hget", "users:1", "email"]);
        assert!(matches!(
            parse(Args::new(&b, &r)),
            Ok(Command::HGet {
                key: b"users:1",
                field: b"email"
            })
        ));
        let (b, r) = args(&["hget", "users:1"]);
        assert!(parse(Args::new(&b, &r)).is_err());
    }
}
