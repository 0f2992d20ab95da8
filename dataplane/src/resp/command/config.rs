//! `CONFIG GET parameter [parameter ...]`: a read-only view of the few settings Redis tools ask
//! for (redis-benchmark asks for `save` and `appendonly`). Other subcommands are recognised so
//! the engine can refuse them with a reason.

use super::{arg, check_arity, Command, CommandError};
use crate::resp::Args;

pub(super) fn parse(args: Args<'_>) -> Result<Command<'_>, CommandError> {
    check_arity(&args, -2, "config")?;
    let sub = arg(&args, 1);
    if sub.eq_ignore_ascii_case(b"get") {
        check_arity(&args, -3, "config|get")?;
        return Ok(Command::ConfigGet {
            patterns: args.slice(2),
        });
    }
    Ok(Command::ConfigOther { sub })
}

/// Redis-style glob match supporting `*` and `?`, ASCII case-insensitive (parameter names).
pub fn glob_match(pattern: &[u8], name: &[u8]) -> bool {
    match pattern.split_first() {
        None => name.is_empty(),
        Some((b'*', rest)) => (0..=name.len()).any(|i| glob_match(rest, &name[i..])),
        Some((&p, rest)) => match name.split_first() {
            Some((&n, name_rest)) if p == b'?' || p.eq_ignore_ascii_case(&n) => {
                glob_match(rest, name_rest)
            }
            _ => false,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::parse;
    use super::*;

    #[test]
    fn parses() {
        assert!(matches!(
            parse(&["CONFIG", "GET", "save", "appendonly"]),
            Ok(Command::ConfigGet { patterns }) if patterns.len() == 2
        ));
        assert!(matches!(
            parse(&["config", "set", "maxmemory", "1"]),
            Ok(Command::ConfigOther { sub: b"set" })
        ));
        assert_eq!(
            parse(&["CONFIG", "GET"]).map(|_| ()),
            Err(CommandError::WrongArity("config|get"))
        );
        assert_eq!(
            parse(&["CONFIG"]).map(|_| ()),
            Err(CommandError::WrongArity("config"))
        );
    }

    #[test]
    fn globs() {
        assert!(glob_match(b"*", b"save"));
        assert!(glob_match(b"max*", b"maxmemory"));
        assert!(glob_match(b"MAXMEMORY", b"maxmemory"));
        assert!(glob_match(b"s?ve", b"save"));
        assert!(!glob_match(b"max*y", b"maxclients"));
        assert!(!glob_match(b"save", b"saves"));
    }
}
