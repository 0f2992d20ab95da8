//! `HGETALL key`: every non-NULL column as name/value pairs.
use super::{arg, arity, Command, CommandError};
use crate::resp::Args;

pub(super) fn parse(args: Args<'_>) -> Result<Command<'_>, CommandError> {
    arity(args, 2, 2, "hgetall")?;
    Ok(Command::HGetAll { key: arg(args, 1) })
}

#[cfg(test)]
mod tests {
    use super::super::testing::args;
    use super::*;

    #[test]
    fn parses() {
        let (b, r) = args(&["HGETALL", "k"]);
        assert!(matches!(
            parse(Args::new(&b, &r)),
            Ok(Command::HGetAll { key: b"k" })
        ));
        let (b, r) = args(&["HGETALL"]);
        assert!(parse(Args::new(&b, &r)).is_err());
    }
}
