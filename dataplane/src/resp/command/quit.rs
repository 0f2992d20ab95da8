//! `RESET` (and `QUIT`, which takes anything).
use super::{arity, Command, CommandError};
use crate::resp::Args;

pub(super) fn parse_reset(args: Args<'_>) -> Result<Command<'_>, CommandError> {
    arity(args, 1, 1, "reset")?;
    Ok(Command::Reset)
}

#[cfg(test)]
mod tests {
    use super::super::testing::args;
    use super::*;

    #[test]
    fn parses() {
        let (b, r) = args(&["RESET"]);
        assert!(matches!(parse_reset(Args::new(&b, &r)), Ok(Command::Reset)));
    }
}
