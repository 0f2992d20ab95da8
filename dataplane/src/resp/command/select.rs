//! `SELECT index`: pgline has one database, 0; the engine refuses the others.

use super::{arg, check_arity, parse_i64, Command, CommandError};
use crate::resp::Args;

pub(super) fn parse(args: Args<'_>) -> Result<Command<'_>, CommandError> {
    check_arity(&args, 2, "select")?;
    let db = parse_i64(arg(&args, 1)).ok_or(CommandError::NotAnInteger)?;
    Ok(Command::Select { db })
}

#[cfg(test)]
mod tests {
    use super::super::test_util::parse;
    use super::*;

    #[test]
    fn parses() {
        assert!(matches!(
            parse(&["SELECT", "0"]),
            Ok(Command::Select { db: 0 })
        ));
        assert!(matches!(
            parse(&["select", "-3"]),
            Ok(Command::Select { db: -3 })
        ));
    }

    #[test]
    fn errors() {
        let not_int = Err(CommandError::NotAnInteger);
        assert_eq!(parse(&["SELECT", "x"]).map(|_| ()), not_int);
        assert_eq!(parse(&["SELECT", "01"]).map(|_| ()), not_int);
        let arity = Err(CommandError::WrongArity("select"));
        assert_eq!(parse(&["SELECT"]).map(|_| ()), arity);
        assert_eq!(parse(&["SELECT", "0", "1"]).map(|_| ()), arity);
    }
}
