//! Commands: one file per command, each with its parse and tests; [`parse_command`] dispatches
//! on the case-insensitive name.

mod auth;
mod client;
pub mod commands;
mod dbsize;
mod echo;
mod exists;
mod get;
mod hello;
mod hget;
mod hgetall;
mod hmget;
mod info;
mod mget;
mod ping;
mod quit;
mod select;
mod write;

use super::compose::compose_error;
use super::Args;

/// A parsed request, borrowing from the input buffer.
#[derive(Debug)]
pub enum Command<'a> {
    Get {
        key: &'a [u8],
    },
    MGet {
        keys: Args<'a>,
    },
    Exists {
        keys: Args<'a>,
    },
    HGet {
        key: &'a [u8],
        field: &'a [u8],
    },
    HMGet {
        key: &'a [u8],
        fields: Args<'a>,
    },
    HGetAll {
        key: &'a [u8],
    },
    Ping {
        message: Option<&'a [u8]>,
    },
    Echo {
        message: &'a [u8],
    },
    Hello {
        protover: Option<u8>,
        auth: Option<(&'a [u8], &'a [u8])>,
        setname: Option<&'a [u8]>,
    },
    Auth {
        username: Option<&'a [u8]>,
        password: &'a [u8],
    },
    Select {
        db: i64,
    },
    DbSize,
    Info {
        section: Option<&'a [u8]>,
    },
    Command {
        sub: CommandSub<'a>,
    },
    Client {
        sub: ClientSub<'a>,
    },
    Quit,
    Reset,
    /// A Redis write command: refused with `-READONLY`.
    Write {
        name: &'a [u8],
    },
    Unknown {
        name: &'a [u8],
        args: Args<'a>,
    },
}

#[derive(Debug)]
pub enum CommandSub<'a> {
    List,
    Count,
    Docs,
    Info(Args<'a>),
    Other,
}

#[derive(Debug)]
pub enum ClientSub<'a> {
    SetName { name: &'a [u8] },
    GetName,
    SetInfo { attr: &'a [u8], value: &'a [u8] },
    Id,
    Info,
    Other,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommandError {
    /// Lower-case command name.
    WrongArity(&'static str),
    NotAnInteger,
    Syntax,
    ProtocolVersion,
    BadClientName,
}

impl CommandError {
    pub fn compose(self, out: &mut Vec<u8>) {
        match self {
            CommandError::WrongArity(name) => {
                let mut msg = b"ERR wrong number of arguments for '".to_vec();
                msg.extend_from_slice(name.as_bytes());
                msg.extend_from_slice(b"' command");
                compose_error(out, &msg);
            }
            CommandError::NotAnInteger => {
                compose_error(out, b"ERR value is not an integer or out of range")
            }
            CommandError::Syntax => compose_error(out, b"ERR syntax error"),
            CommandError::ProtocolVersion => {
                compose_error(out, b"NOPROTO unsupported protocol version")
            }
            CommandError::BadClientName => compose_error(
                out,
                b"ERR Client names cannot contain spaces, newlines or special characters.",
            ),
        }
    }
}

/// Checks `min <= args.len() <= max` (including the command name).
fn arity(args: Args<'_>, min: usize, max: usize, name: &'static str) -> Result<(), CommandError> {
    if args.len() < min || args.len() > max {
        Err(CommandError::WrongArity(name))
    } else {
        Ok(())
    }
}

fn arg<'a>(args: Args<'a>, i: usize) -> &'a [u8] {
    args.get(i).unwrap_or(&[])
}

fn parse_i64(bytes: &[u8]) -> Result<i64, CommandError> {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or(CommandError::NotAnInteger)
}

/// Parses `args` (at least one: the command name) into a [`Command`].
pub fn parse_command(args: Args<'_>) -> Result<Command<'_>, CommandError> {
    let name = arg(args, 0);
    let mut lower = [0u8; 16];
    if name.len() > lower.len() {
        return Ok(Command::Unknown {
            name,
            args: args.slice(1),
        });
    }
    for (d, s) in lower.iter_mut().zip(name) {
        *d = s.to_ascii_lowercase();
    }
    match &lower[..name.len()] {
        b"get" => get::parse(args),
        b"mget" => mget::parse(args),
        b"exists" => exists::parse(args),
        b"hget" => hget::parse(args),
        b"hmget" => hmget::parse(args),
        b"hgetall" => hgetall::parse(args),
        b"ping" => ping::parse(args),
        b"echo" => echo::parse(args),
        b"hello" => hello::parse(args),
        b"auth" => auth::parse(args),
        b"select" => select::parse(args),
        b"dbsize" => dbsize::parse(args),
        b"info" => info::parse(args),
        b"command" => commands::parse(args),
        b"client" => client::parse(args),
        b"quit" => Ok(Command::Quit),
        b"reset" => quit::parse_reset(args),
        n if write::is_write(n) => Ok(Command::Write { name }),
        _ => Ok(Command::Unknown {
            name,
            args: args.slice(1),
        }),
    }
}

#[cfg(test)]
pub(crate) mod testing {
    use std::ops::Range;

    /// Builds (buffer, ranges) for a list of arguments.
    pub fn args(items: &[&str]) -> (Vec<u8>, Vec<Range<usize>>) {
        let mut buf = Vec::new();
        let mut ranges = Vec::new();
        for a in items {
            let start = buf.len();
            buf.extend_from_slice(a.as_bytes());
            ranges.push(start..buf.len());
        }
        (buf, ranges)
    }
}

#[cfg(test)]
mod tests {
    use super::testing::args;
    use super::*;

    #[test]
    fn dispatch_is_case_insensitive() {
        let (b, r) = args(&["gEt", "k"]);
        assert!(matches!(
            parse_command(Args::new(&b, &r)),
            Ok(Command::Get { key: b"k" })
        ));
        let (b, r) = args(&["SET", "k", "v"]);
        assert!(matches!(
            parse_command(Args::new(&b, &r)),
            Ok(Command::Write { .. })
        ));
        let (b, r) = args(&["FROBNICATE_THE_WORLD_NOW", "x"]);
        assert!(matches!(
            parse_command(Args::new(&b, &r)),
            Ok(Command::Unknown { .. })
        ));
    }

    #[test]
    fn errors_compose_as_redis_words_them() {
        let mut o = Vec::new();
        CommandError::WrongArity("get").compose(&mut o);
        assert_eq!(o, b"-ERR wrong number of arguments for 'get' command\r\n");
    }
}
