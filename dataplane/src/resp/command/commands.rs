//! `COMMAND [COUNT | DOCS | INFO name ...]`: the table client libraries read at connect time.

use super::{arg, Command, CommandError, CommandSub};
use crate::resp::compose::{compose_array_header, compose_bulk, compose_integer, compose_simple};
use crate::resp::{Args, Protocol};

/// (name, arity, flags, first key, last key, step)
type Entry = (&'static str, i64, &'static [&'static str], i64, i64, i64);

const TABLE: &[Entry] = &[
    ("get", 2, &["readonly", "fast"], 1, 1, 1),
    ("mget", -2, &["readonly", "fast"], 1, -1, 1),
    ("exists", -2, &["readonly", "fast"], 1, -1, 1),
    ("hget", 3, &["readonly", "fast"], 1, 1, 1),
    ("hmget", -3, &["readonly", "fast"], 1, 1, 1),
    ("hgetall", 2, &["readonly"], 1, 1, 1),
    ("ping", -1, &["fast", "stale"], 0, 0, 0),
    ("echo", 2, &["fast"], 0, 0, 0),
    (
        "hello",
        -1,
        &["noscript", "loading", "stale", "fast", "no_auth"],
        0,
        0,
        0,
    ),
    (
        "auth",
        -2,
        &["noscript", "loading", "stale", "fast", "no_auth"],
        0,
        0,
        0,
    ),
    ("select", 2, &["loading", "stale", "fast"], 0, 0, 0),
    ("dbsize", 1, &["readonly", "fast"], 0, 0, 0),
    ("info", -1, &["loading", "stale"], 0, 0, 0),
    ("command", -1, &["loading", "stale"], 0, 0, 0),
    ("client", -2, &["loading", "stale"], 0, 0, 0),
    (
        "quit",
        -1,
        &["loading", "stale", "fast", "no_auth"],
        0,
        0,
        0,
    ),
    (
        "reset",
        1,
        &["loading", "stale", "fast", "no_auth"],
        0,
        0,
        0,
    ),
];

/// Number of commands in the table (`COMMAND COUNT`).
pub const COMMAND_COUNT: usize = TABLE.len();

pub(super) fn parse(args: Args<'_>) -> Result<Command<'_>, CommandError> {
    let sub = match args.get(1) {
        None => CommandSub::List,
        Some(s) if s.eq_ignore_ascii_case(b"count") => CommandSub::Count,
        Some(s) if s.eq_ignore_ascii_case(b"docs") => CommandSub::Docs,
        Some(s) if s.eq_ignore_ascii_case(b"info") => CommandSub::Info(args.slice(2)),
        Some(_) => CommandSub::Other,
    };
    let _ = arg(args, 0);
    Ok(Command::Command { sub })
}

fn compose_entry(out: &mut Vec<u8>, e: &Entry) {
    let (name, arity, flags, first, last, step) = *e;
    compose_array_header(out, 10);
    compose_bulk(out, name.as_bytes());
    compose_integer(out, arity);
    compose_array_header(out, flags.len());
    for f in flags {
        compose_simple(out, f.as_bytes());
    }
    compose_integer(out, first);
    compose_integer(out, last);
    compose_integer(out, step);
    compose_array_header(out, 0); // ACL categories
    compose_array_header(out, 0); // tips
    compose_array_header(out, 0); // key specs
    compose_array_header(out, 0); // subcommands
}

/// The whole table (`COMMAND`).
pub fn compose_command_table(out: &mut Vec<u8>, _proto: Protocol) {
    compose_array_header(out, TABLE.len());
    for e in TABLE {
        compose_entry(out, e);
    }
}

/// `COMMAND INFO name ...`: an entry per name, nil for names pgline does not serve.
pub fn compose_command_info(out: &mut Vec<u8>, names: Args<'_>, proto: Protocol) {
    compose_array_header(out, names.len());
    for n in names.iter() {
        match TABLE
            .iter()
            .find(|e| e.0.as_bytes().eq_ignore_ascii_case(n))
        {
            Some(e) => compose_entry(out, e),
            None => crate::resp::compose::compose_null(out, proto),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::args;
    use super::*;
    use crate::resp::parse_request;

    #[test]
    fn table_is_well_formed_resp() {
        let mut out = Vec::new();
        compose_command_table(&mut out, Protocol::Resp2);
        assert!(
            out.starts_with(format!("*{}\r\n*10\r\n$3\r\nget\r\n:2\r\n", COMMAND_COUNT).as_bytes())
        );
        // Sanity: composing info for a known and an unknown name.
        let (b, r) = args(&["get", "nope"]);
        let mut info = Vec::new();
        compose_command_info(&mut info, Args::new(&b, &r), Protocol::Resp2);
        assert!(info.starts_with(b"*2\r\n*10\r\n"));
        assert!(info.ends_with(b"$-1\r\n"));
        let _ = parse_request;
    }

    #[test]
    fn parses() {
        let (b, r) = args(&["COMMAND", "COUNT"]);
        assert!(matches!(
            parse(Args::new(&b, &r)),
            Ok(Command::Command {
                sub: CommandSub::Count
            })
        ));
        let (b, r) = args(&["COMMAND"]);
        assert!(matches!(
            parse(Args::new(&b, &r)),
            Ok(Command::Command {
                sub: CommandSub::List
            })
        ));
    }
}
