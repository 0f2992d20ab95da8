//! `CLIENT <subcommand>`: the connection-management subcommands clients send on connect.
//!
//! Recognised: `SETNAME name`, `GETNAME`, `SETINFO attr value` (redis-py and go-redis send
//! `LIB-NAME`/`LIB-VER`), `ID`, `INFO`. Anything else is [`ClientSub::Other`] for the engine
//! to refuse. Arity errors name the subcommand as Redis does (`'client|setname'`).

use super::{arg, check_arity, Command, CommandError};
use crate::resp::Args;

/// A `CLIENT` subcommand.
#[derive(Clone, Copy, Debug)]
pub enum ClientSub<'a> {
    SetName {
        name: &'a [u8],
    },
    GetName,
    SetInfo {
        attr: &'a [u8],
        value: &'a [u8],
    },
    Id,
    Info,
    /// Any other subcommand; `args` excludes `CLIENT` and the subcommand name.
    Other {
        name: &'a [u8],
        args: Args<'a>,
    },
}

pub(super) fn parse(args: Args<'_>) -> Result<Command<'_>, CommandError> {
    check_arity(&args, -2, "client")?;
    let name = arg(&args, 1);
    let is = |s: &[u8]| name.eq_ignore_ascii_case(s);
    let sub = if is(b"SETNAME") {
        check_arity(&args, 3, "client|setname")?;
        ClientSub::SetName {
            name: arg(&args, 2),
        }
    } else if is(b"GETNAME") {
        check_arity(&args, 2, "client|getname")?;
        ClientSub::GetName
    } else if is(b"SETINFO") {
        check_arity(&args, 4, "client|setinfo")?;
        ClientSub::SetInfo {
            attr: arg(&args, 2),
            value: arg(&args, 3),
        }
    } else if is(b"ID") {
        check_arity(&args, 2, "client|id")?;
        ClientSub::Id
    } else if is(b"INFO") {
        check_arity(&args, 2, "client|info")?;
        ClientSub::Info
    } else {
        ClientSub::Other {
            name,
            args: args.slice(2),
        }
    };
    Ok(Command::Client { sub })
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{parse, strings};
    use super::*;

    fn sub(words: &[&str]) -> Result<ClientSub<'static>, CommandError> {
        match parse(words)? {
            Command::Client { sub } => Ok(sub),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn subcommands() {
        assert!(matches!(
            sub(&["CLIENT", "setname", "app"]),
            Ok(ClientSub::SetName { name: b"app" })
        ));
        assert!(matches!(
            sub(&["client", "GETNAME"]),
            Ok(ClientSub::GetName)
        ));
        assert!(matches!(
            sub(&["CLIENT", "SETINFO", "LIB-NAME", "redis-py"]),
            Ok(ClientSub::SetInfo {
                attr: b"LIB-NAME",
                value: b"redis-py"
            })
        ));
        assert!(matches!(sub(&["CLIENT", "id"]), Ok(ClientSub::Id)));
        assert!(matches!(sub(&["CLIENT", "INFO"]), Ok(ClientSub::Info)));
        match sub(&["CLIENT", "KILL", "ID", "3"]) {
            Ok(ClientSub::Other { name, args }) => {
                assert_eq!(name, b"KILL");
                assert_eq!(strings(args), ["ID", "3"]);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn arity() {
        let check = |words: &[&str], name| {
            assert_eq!(
                sub(words).map(|_| ()),
                Err(CommandError::WrongArity(name)),
                "{words:?}"
            );
        };
        check(&["CLIENT"], "client");
        check(&["CLIENT", "SETNAME"], "client|setname");
        check(&["CLIENT", "GETNAME", "x"], "client|getname");
        check(&["CLIENT", "SETINFO", "LIB-NAME"], "client|setinfo");
        check(&["CLIENT", "ID", "x"], "client|id");
        check(&["CLIENT", "INFO", "x"], "client|info");
    }
}
