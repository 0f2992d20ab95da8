//! `GET key`: the row as JSON.
use super::{arg, arity, Command, CommandError};
use crate::resp::Args;

pub(super) fn parse(args: Args<'_>) -> Result<Command<'_>, CommandError> {
    arity(args, 2, 2, "get")?;
    Ok(Command::Get { key: arg(args, 1) })
}

#[cfg(test)]
mod tests {
    use super::super::testing::args;
    use super::*;

    #[test]
    fn parses() {
        let (b, r) = args(&["GET", "users:1"]);
        assert!(matches!(
            parse(Args::new(&b, &r)),
            Ok(Command::Get { key: b"users:1" })
        ));
        let (b, r) = args(&["GET"]);
        assert_eq!(
            parse(Args::new(&b, &r)).unwrap_err(),
            CommandError::WrongArity("get")
        );
        let (b, r) = args(&["GET", "a", "b"]);
        assert!(parse(Args::new(&b, &r)).is_err());
    }
}
