//! `EXISTS key [key ...]`: how many of the keys name existing rows.
use super::{arity, Command, CommandError};
use crate::resp::Args;

pub(super) fn parse(args: Args<'_>) -> Result<Command<'_>, CommandError> {
    arity(args, 2, usize::MAX, "exists")?;
    Ok(Command::Exists {
        keys: args.slice(1),
    })
}

#[cfg(test)]
mod tests {
    use super::super::testing::args;
    use super::*;

    #[test]
    fn parses() {
        let (b, r) = args(&["EXISTS", "a", "b"]);
        assert!(
            matches!(parse(Args::new(&b, &r)), Ok(Command::Exists { keys }) if keys.len() == 2)
        );
        let (b, r) = args(&["EXISTS"]);
        assert!(parse(Args::new(&b, &r)).is_err());
    }
}
