//! `DBSIZE`: rows cached (negative entries not counted).
use super::{arity, Command, CommandError};
use crate::resp::Args;

pub(super) fn parse(args: Args<'_>) -> Result<Command<'_>, CommandError> {
    arity(args, 1, 1, "dbsize")?;
    Ok(Command::DbSize)
}

#[cfg(test)]
mod tests {
    use super::super::testing::args;
    use super::*;

    #[test]
    fn parses() {
        let (b, r) = args(&["DBSIZE"]);
        assert!(matches!(parse(Args::new(&b, &r)), Ok(Command::DbSize)));
        let (b, r) = args(&["DBSIZE", "x"]);
        assert!(parse(Args::new(&b, &r)).is_err());
    }
}
