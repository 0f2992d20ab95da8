//! `INFO [section ...]`: server information. Only the first section is kept; the engine
//! answers with a bulk string (RESP2) or a verbatim string (RESP3).

use super::{check_arity, Command, CommandError};
use crate::resp::Args;

pub(super) fn parse(args: Args<'_>) -> Result<Command<'_>, CommandError> {
    check_arity(&args, -1, "info")?;
    Ok(Command::Info {
        section: args.get(1),
    })
}

#[cfg(test)]
mod tests {
    use super::super::test_util::parse;
    use super::*;

    #[test]
    fn parses() {
        assert!(matches!(
            parse(&["INFO"]),
            Ok(Command::Info { section: None })
        ));
        assert!(matches!(
            parse(&["info", "server", "clients"]),
            Ok(Command::Info {
                section: Some(b"server")
            })
        ));
    }
}
