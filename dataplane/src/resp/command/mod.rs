//! Command recognition: a request's arguments into a typed [`Command`].
//!
//! Purpose: dispatch on the case-insensitive command name (upper-cased into a stack buffer,
//! no allocation), check arity and argument syntax the way Redis does, and hand the engine
//! a value that still borrows the request bytes. One file per command, each with its parse
//! and its tests. Replies that do not depend on the store (the COMMAND table) are composed
//! here too. Invariants: parsing never panics and never allocates. Thread model: pure
//! functions. Limitations: argument *values* (client names, INFO section names) are not
//! validated here; that is the engine's job.

mod auth;
mod client;
mod cluster;
#[allow(clippy::module_inception)]
mod command;
mod config;
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
mod reset;
mod select;
mod subscribe;
mod write;

#[cfg(test)]
mod test_util;

pub use client::{ClientSub, TrackingArgs};
pub use cluster::ClusterSub;
pub use command::{
    compose_command_count, compose_command_docs, compose_command_info, compose_command_table,
    CommandSub,
};
pub use config::glob_match;
pub use write::is_write_command;

use super::Args;

/// One recognised request, borrowing its bytes from the input buffer.
#[derive(Clone, Copy, Debug)]
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
    /// `INFO [section ...]`: only the first section is kept.
    Info {
        section: Option<&'a [u8]>,
    },
    Command {
        sub: CommandSub<'a>,
    },
    Client {
        sub: ClientSub<'a>,
    },
    /// `CLUSTER <subcommand>` (cluster mode, issue 17).
    Cluster {
        sub: ClusterSub<'a>,
    },
    /// `READONLY`: this connection may read a replica's slots.
    ReadOnly,
    /// `READWRITE`: back to reading only the acting primary's.
    ReadWrite,
    Quit,
    Reset,
    /// A known Redis write command (pgline is read-only); arguments are not checked.
    Write {
        name: &'a [u8],
    },
    /// `SUBSCRIBE channel ...` (only `__redis__:invalidate` is served).
    Subscribe {
        channels: Args<'a>,
    },
    /// `UNSUBSCRIBE [channel ...]`.
    Unsubscribe {
        channels: Args<'a>,
    },
    /// `PSUBSCRIBE`, `PUNSUBSCRIBE`, `SSUBSCRIBE`, `SUNSUBSCRIBE`, `PUBSUB` (refused).
    PubSubOther {
        name: &'a [u8],
    },
    /// `CONFIG GET pattern ...`.
    ConfigGet {
        patterns: Args<'a>,
    },
    /// Any other `CONFIG` subcommand (refused: settings come from pgline's own config).
    ConfigOther {
        sub: &'a [u8],
    },
    /// Anything else; `args` excludes the name. An empty request gives an empty name.
    Unknown {
        name: &'a [u8],
        args: Args<'a>,
    },
}

/// A request that names a known command but cannot be executed as given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommandError {
    /// Lower-case command name, `container|sub` for subcommands (`"client|setname"`).
    WrongArity(&'static str),
    NotAnInteger,
    Syntax,
    /// `HELLO` with a protocol version other than 2 or 3.
    ProtocolVersion,
}

impl CommandError {
    /// Writes the error reply as Redis words it.
    pub fn compose(self, out: &mut Vec<u8>) {
        match self {
            CommandError::WrongArity(name) => {
                out.extend_from_slice(b"-ERR wrong number of arguments for '");
                out.extend_from_slice(name.as_bytes());
                out.extend_from_slice(b"' command\r\n");
            }
            CommandError::NotAnInteger => {
                out.extend_from_slice(b"-ERR value is not an integer or out of range\r\n");
            }
            CommandError::Syntax => out.extend_from_slice(b"-ERR syntax error\r\n"),
            CommandError::ProtocolVersion => {
                out.extend_from_slice(b"-NOPROTO unsupported protocol version\r\n");
            }
        }
    }
}

/// Longest command name worth upper-casing; longer names are unknown.
const MAX_NAME: usize = 24;

/// Recognises the command in `args` (name first). Names are case-insensitive.
pub fn parse_command<'a>(args: Args<'a>) -> Result<Command<'a>, CommandError> {
    let name = args.get(0).unwrap_or_default();
    let mut upper = [0u8; MAX_NAME];
    let Some(upper) = upper.get_mut(..name.len()) else {
        return Ok(Command::Unknown {
            name,
            args: args.slice(1),
        });
    };
    upper.copy_from_slice(name);
    upper.make_ascii_uppercase();
    match &*upper {
        b"GET" => get::parse(args),
        b"MGET" => mget::parse(args),
        b"EXISTS" => exists::parse(args),
        b"HGET" => hget::parse(args),
        b"HMGET" => hmget::parse(args),
        b"HGETALL" => hgetall::parse(args),
        b"PING" => ping::parse(args),
        b"ECHO" => echo::parse(args),
        b"HELLO" => hello::parse(args),
        b"AUTH" => auth::parse(args),
        b"SELECT" => select::parse(args),
        b"DBSIZE" => dbsize::parse(args),
        b"INFO" => info::parse(args),
        b"COMMAND" => command::parse(args),
        b"CLIENT" => client::parse(args),
        b"CLUSTER" => cluster::parse(args),
        b"READONLY" => cluster::parse_readonly(args),
        b"READWRITE" => cluster::parse_readwrite(args),
        b"CONFIG" => config::parse(args),
        b"QUIT" => quit::parse(args),
        b"RESET" => reset::parse(args),
        b"SUBSCRIBE" => subscribe::parse_subscribe(args),
        b"UNSUBSCRIBE" => subscribe::parse_unsubscribe(args),
        b"PSUBSCRIBE" | b"PUNSUBSCRIBE" | b"SSUBSCRIBE" | b"SUNSUBSCRIBE" | b"PUBSUB" => {
            Ok(Command::PubSubOther { name })
        }
        upper if write::is_upper_write(upper) => Ok(Command::Write { name }),
        _ => Ok(Command::Unknown {
            name,
            args: args.slice(1),
        }),
    }
}

/// Checks Redis arity: `n >= 0` means exactly `n` arguments (name included), `n < 0` at
/// least `-n`.
fn check_arity(args: &Args, arity: i32, name: &'static str) -> Result<(), CommandError> {
    let len = i64::try_from(args.len()).unwrap_or(i64::MAX);
    let arity = i64::from(arity);
    let ok = if arity >= 0 {
        len == arity
    } else {
        len >= -arity
    };
    if ok {
        Ok(())
    } else {
        Err(CommandError::WrongArity(name))
    }
}

/// The `i`-th argument of a request whose arity was already checked.
fn arg<'a>(args: &Args<'a>, i: usize) -> &'a [u8] {
    args.get(i).unwrap_or_default()
}

/// Parses a signed 64-bit integer the way Redis' `string2ll` does: optional `-`, digits, no
/// leading zeros, no `+`, no spaces.
fn parse_i64(bytes: &[u8]) -> Option<i64> {
    let (neg, digits) = match bytes {
        [b'-', rest @ ..] => (true, rest),
        _ => (false, bytes),
    };
    match digits {
        [] => return None,
        [b'0'] if !neg => return Some(0),
        [b'0', ..] => return None,
        _ => {}
    }
    let mut n: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        let d = i64::from(d - b'0');
        n = n.checked_mul(10)?;
        n = if neg {
            n.checked_sub(d)?
        } else {
            n.checked_add(d)?
        };
    }
    Some(n)
}

#[cfg(test)]
mod tests {
    use super::test_util::{error_text, parse};
    use super::*;

    #[test]
    fn names_are_case_insensitive() {
        assert!(matches!(
            parse(&["gEt", "k"]),
            Ok(Command::Get { key: b"k" })
        ));
        assert!(matches!(
            parse(&["ping"]),
            Ok(Command::Ping { message: None })
        ));
    }

    #[test]
    fn unknown_and_empty() {
        match parse(&["FOO", "a", "b"]) {
            Ok(Command::Unknown { name, args }) => {
                assert_eq!(name, b"FOO");
                assert_eq!(args.iter().collect::<Vec<_>>(), vec![&b"a"[..], b"b"]);
            }
            other => panic!("{other:?}"),
        }
        let long = "X".repeat(100);
        assert!(matches!(parse(&[&long]), Ok(Command::Unknown { .. })));
        assert!(matches!(parse(&[]), Ok(Command::Unknown { name: b"", .. })));
    }

    #[test]
    fn write_commands() {
        for name in ["set", "DEL", "hset", "Incr", "FLUSHALL", "expire"] {
            match parse(&[name, "k", "v"]) {
                Ok(Command::Write { name: n }) => assert_eq!(n, name.as_bytes()),
                other => panic!("{name}: {other:?}"),
            }
        }
    }

    #[test]
    fn error_texts() {
        assert_eq!(
            error_text(CommandError::WrongArity("get")),
            "-ERR wrong number of arguments for 'get' command\r\n"
        );
        assert_eq!(
            error_text(CommandError::NotAnInteger),
            "-ERR value is not an integer or out of range\r\n"
        );
        assert_eq!(error_text(CommandError::Syntax), "-ERR syntax error\r\n");
        assert_eq!(
            error_text(CommandError::ProtocolVersion),
            "-NOPROTO unsupported protocol version\r\n"
        );
    }

    #[test]
    fn integers_like_redis() {
        assert_eq!(parse_i64(b"0"), Some(0));
        assert_eq!(parse_i64(b"15"), Some(15));
        assert_eq!(parse_i64(b"-7"), Some(-7));
        assert_eq!(parse_i64(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_i64(b"-9223372036854775808"), Some(i64::MIN));
        for bad in [
            "",
            "-",
            "-0",
            "01",
            "+1",
            " 1",
            "1 ",
            "1x",
            "9223372036854775808",
        ] {
            assert_eq!(parse_i64(bad.as_bytes()), None, "{bad:?}");
        }
    }
}
