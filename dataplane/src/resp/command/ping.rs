//! `PING [message]`.
use super::{arity, Command, CommandError};
use crate::resp::Args;

pub(super) fn parse(args: Args<'_>) -> Result<Command<'_>, CommandError> {
    arity(args, 1, 2, "ping")?;
    Ok(Command::Ping {
        message: args.get(1),
    })
}

#[cfg(test)]
mod tests {
    use super::super::testing::args;
    use super::*;

    #[test]
    fn parses() {
        let (b, r) = args(&["PING"]);
        assert!(matches!(
            parse(Args::new(&b, &r)),
            Ok(Command::Ping { message: None })
        ));
        let (b, r) = args(&["PING", "x"]);
        assert!(matches!(
            parse(Args::new(&b, &r)),
            Ok(Command::Ping {
                message: Some(b"x")
            })
        ));
        let (b, r) = args(&["PING", "x", "y"]);
        assert!(parse(Args::new(&b, &r)).is_err());
    }
}
