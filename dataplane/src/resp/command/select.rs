//! `SELECT db`: only database 0 exists.
use super::{arg, arity, parse_i64, Command, CommandError};
use crate::resp::Args;

pub(super) fn parse(args: Args<'_>) -> Result<Command<'_>, CommandError> {
    arity(args, 2, 2, "select")?;
    Ok(Command::Select {
        db: parse_i64(arg(args, 1))?,
    })
}

#[cfg(test)]
mod tests {
    use super::super::testing::args;
    use super::*;

    #[test]
    fn parses() {
        let (b, r) = args(&["SELECT", "0"]);
        assert!(matches!(
            parse(Args::new(&b, &r)),
            Ok(Command::Select { db: 0 })
        ));
        let (b, r) = args(&["SELECT", "x"]);
        assert_eq!(
            parse(Args::new(&b, &r)).unwrap_err(),
            CommandError::NotAnInteger
        );
    }
}
