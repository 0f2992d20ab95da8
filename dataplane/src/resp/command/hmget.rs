//! `HMGET key column [column ...]`.
use super::{arg, arity, Command, CommandError};
use crate::resp::Args;

pub(super) fn parse(args: Args<'_>) -> Result<Command<'_>, CommandError> {
    arity(args, 3, usize::MAX, "hmget")?;
    Ok(Command::HMGet {
        key: arg(args, 1),
        fields: args.slice(2),
    })
}

#[cfg(test)]
mod tests {
    use super::super::testing::args;
    use super::*;

    #[test]
    fn parses() {
        let (b, r) = args(&["HMGET", "k", "a", "b"]);
        assert!(
            matches!(parse(Args::new(&b, &r)), Ok(Command::HMGet { key: b"k", fields }) if fields.len() == 2)
        );
        let (b, r) = args(&["HMGET", "k"]);
        assert!(parse(Args::new(&b, &r)).is_err());
    }
}
