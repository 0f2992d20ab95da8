//! `CLUSTER <subcommand>`, `READONLY` and `READWRITE`: what Redis Cluster clients send to learn
//! the topology and to read from replicas (issue 17; the replies are `crate::cluster`'s).
//!
//! Recognised: `SHARDS`, `SLOTS`, `NODES`, `MYID`, `MYSHARDID`, `INFO`, `KEYSLOT key`. Anything
//! else is [`ClusterSub::Other`] for the engine to refuse as Redis does. Arity errors name the
//! subcommand (`'cluster|keyslot'`).

use super::{arg, check_arity, Command, CommandError};

/// A `CLUSTER` subcommand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClusterSub<'a> {
    Shards,
    Slots,
    Nodes,
    MyId,
    MyShardId,
    Info,
    KeySlot {
        key: &'a [u8],
    },
    /// Any other subcommand (its name as given).
    Other {
        name: &'a [u8],
    },
}

pub(super) fn parse(args: crate::resp::Args<'_>) -> Result<Command<'_>, CommandError> {
    check_arity(&args, -2, "cluster")?;
    let name = arg(&args, 1);
    let is = |s: &[u8]| name.eq_ignore_ascii_case(s);
    let fixed =
        |sub: ClusterSub<'static>, arity_name| check_arity(&args, 2, arity_name).map(|()| sub);
    let sub = if is(b"SHARDS") {
        fixed(ClusterSub::Shards, "cluster|shards")?
    } else if is(b"SLOTS") {
        fixed(ClusterSub::Slots, "cluster|slots")?
    } else if is(b"NODES") {
        fixed(ClusterSub::Nodes, "cluster|nodes")?
    } else if is(b"MYID") {
        fixed(ClusterSub::MyId, "cluster|myid")?
    } else if is(b"MYSHARDID") {
        fixed(ClusterSub::MyShardId, "cluster|myshardid")?
    } else if is(b"INFO") {
        fixed(ClusterSub::Info, "cluster|info")?
    } else if is(b"KEYSLOT") {
        check_arity(&args, 3, "cluster|keyslot")?;
        ClusterSub::KeySlot { key: arg(&args, 2) }
    } else {
        ClusterSub::Other { name }
    };
    Ok(Command::Cluster { sub })
}

pub(super) fn parse_readonly(args: crate::resp::Args<'_>) -> Result<Command<'_>, CommandError> {
    check_arity(&args, 1, "readonly")?;
    Ok(Command::ReadOnly)
}

pub(super) fn parse_readwrite(args: crate::resp::Args<'_>) -> Result<Command<'_>, CommandError> {
    check_arity(&args, 1, "readwrite")?;
    Ok(Command::ReadWrite)
}

#[cfg(test)]
mod tests {
    use super::super::test_util::parse;
    use super::*;

    fn sub(words: &[&str]) -> Result<ClusterSub<'static>, CommandError> {
        match parse(words)? {
            Command::Cluster { sub } => Ok(sub),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn subcommands_and_arity() {
        assert_eq!(sub(&["cluster", "shards"]), Ok(ClusterSub::Shards));
        assert_eq!(sub(&["CLUSTER", "Slots"]), Ok(ClusterSub::Slots));
        assert_eq!(
            sub(&["CLUSTER", "KEYSLOT", "foo"]),
            Ok(ClusterSub::KeySlot { key: b"foo" })
        );
        assert_eq!(
            sub(&["CLUSTER", "KEYSLOT"]),
            Err(CommandError::WrongArity("cluster|keyslot"))
        );
        assert_eq!(
            sub(&["CLUSTER", "NODES", "x"]),
            Err(CommandError::WrongArity("cluster|nodes"))
        );
        assert_eq!(
            sub(&["CLUSTER", "meet", "a", "1"]),
            Ok(ClusterSub::Other { name: b"meet" })
        );
        assert_eq!(sub(&["CLUSTER"]), Err(CommandError::WrongArity("cluster")));
        assert!(matches!(parse(&["readonly"]), Ok(Command::ReadOnly)));
        assert!(matches!(parse(&["READWRITE"]), Ok(Command::ReadWrite)));
        assert!(matches!(
            parse(&["READONLY", "x"]),
            Err(CommandError::WrongArity("readonly"))
        ));
    }
}
