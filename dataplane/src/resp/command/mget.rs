//! `MGET key [key ...]`: rows in request order, nil where absent.
use super::{arity, Command, CommandError};
use crate::resp::Args;

pub(super) fn parse(args: Args<'_>) -> Result<Command<'_>, CommandError> {
    arity(args, 2, usize::MAX, "mget")?;
    Ok(Command::MGet {
        keys: args.slice(1),
    })
}

#[cfg(test)]
mod tests {
    use super::super::testing::args;
    use super::*;

    #[test]
    fn parses() {
        let (b, r) = args(&["MGET", "a", "b", "c"]);
        match parse(Args::new(&b, &r)) {
            Ok(Command::MGet { keys }) => {
                assert_eq!(keys.iter().collect::<Vec<_>>(), vec![&b"a"[..], b"b", b"c"])
            }
            other => panic!("{other:?}"),
        }
        let (b, r) = args(&["MGET"]);
        assert!(parse(Args::new(&b, &r)).is_err());
    }
}
