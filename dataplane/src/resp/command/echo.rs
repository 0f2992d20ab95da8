//! `ECHO message`.
use super::{arg, arity, Command, CommandError};
use crate::resp::Args;

pub(super) fn parse(args: Args<'_>) -> Result<Command<'_>, CommandError> {
    arity(args, 2, 2, "echo")?;
    Ok(Command::Echo {
        message: arg(args, 1),
    })
}

#[cfg(test)]
mod tests {
    use super::super::testing::args;
    use super::*;

    #[test]
    fn parses() {
        let (b, r) = args(&["ECHO", "hi"]);
        assert!(matches!(
            parse(Args::new(&b, &r)),
            Ok(Command::Echo { message: b"hi" })
        ));
        let (b, r) = args(&["ECHO"]);
        assert!(parse(Args::new(&b, &r)).is_err());
    }
}
