//! `RESET`: back to RESP2, no name, database 0; reply `+RESET`.

use super::{check_arity, Command, CommandError};
use crate::resp::Args;

pub(super) fn parse(args: Args<'_>) -> Result<Command<'_>, CommandError> {
    check_arity(&args, 1, "reset")?;
    Ok(Command::Reset)
}

#[cfg(test)]
mod tests {
    use super::super::test_util::parse;
    use super::*;

    #[test]
    fn parses() {
        assert!(matches!(parse(&["Reset"]), Ok(Command::Reset)));
        let err = Err(CommandError::WrongArity("reset"));
        assert_eq!(parse(&["RESET", "x"]).map(|_| ()), err);
    }
}
