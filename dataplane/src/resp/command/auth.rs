//! `AUTH [username] password`.
use super::{arg, arity, Command, CommandError};
use crate::resp::Args;

pub(super) fn parse(args: Args<'_>) -> Result<Command<'_>, CommandError> {
    arity(args, 2, 3, "auth")?;
    Ok(if args.len() == 2 {
        Command::Auth {
            username: None,
            password: arg(args, 1),
        }
    } else {
        Command::Auth {
            username: args.get(1),
            password: arg(args, 2),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::super::testing::args;
    use super::*;

    #[test]
    fn parses() {
        let (b, r) = args(&["AUTH", "pw"]);
        assert!(matches!(
            parse(Args::new(&b, &r)),
            Ok(Command::Auth {
                username: None,
                password: b"pw"
            })
        ));
        let (b, r) = args(&["AUTH", "u", "pw"]);
        assert!(matches!(
            parse(Args::new(&b, &r)),
            Ok(Command::Auth {
                username: Some(b"u"),
                password: b"pw"
            })
        ));
        let (b, r) = args(&["AUTH"]);
        assert!(parse(Args::new(&b, &r)).is_err());
    }
}
