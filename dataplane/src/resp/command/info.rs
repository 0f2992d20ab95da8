//! `INFO [section ...]` (only the first section is honoured).
use super::{Command, CommandError};
use crate::resp::Args;

pub(super) fn parse(args: Args<'_>) -> Result<Command<'_>, CommandError> {
    Ok(Command::Info {
        section: args.get(1),
    })
}

#[cfg(test)]
mod tests {
    use super::super::testing::args;
    use super::*;

    #[test]
    fn parses() {
        let (b, r) = args(&["INFO", "stats"]);
        assert!(matches!(
            parse(Args::new(&b, &r)),
            Ok(Command::Info {
                section: Some(b"stats")
            })
        ));
    }
}
