//! `QUIT`: reply `+OK` and close once the reply is sent. Extra arguments are ignored, as in
//! Redis (arity -1).

use super::{Command, CommandError};
use crate::resp::Args;

pub(super) fn parse(_args: Args<'_>) -> Result<Command<'_>, CommandError> {
    Ok(Command::Quit)
}

#[cfg(test)]
mod tests {
    use super::super::test_util::parse;
    use super::*;

    #[test]
    fn parses() {
        assert!(matches!(parse(&["QUIT"]), Ok(Command::Quit)));
        assert!(matches!(parse(&["quit", "now"]), Ok(Command::Quit)));
    }
}
