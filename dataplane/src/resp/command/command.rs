//! `COMMAND [COUNT | DOCS [name ...] | INFO [name ...]]`: command introspection.
//!
//! Cluster-aware clients (redis-py, go-redis, ioredis, redis-rs in cluster mode) read the
//! `COMMAND` reply to learn each command's arity, flags and key positions. pgline describes
//! only the commands it serves, in Redis 7's ten-element format: name, arity, flags, first
//! key, last key, step, ACL categories, tips, key specifications, subcommands. Flags,
//! categories and tips are sets (arrays in RESP2); key specifications are maps (flat arrays
//! in RESP2). `COMMAND DOCS` answers an empty map. Limitations: the table is static and
//! must be kept in step with [`parse_command`](super::parse_command) by hand (a test checks
//! that every described command parses).

use super::{arg, check_arity, Command, CommandError};
use crate::resp::{
    compose_array_header, compose_bulk, compose_integer, compose_map_header, compose_null,
    compose_set_header, compose_simple, Args, Protocol,
};

/// A `COMMAND` subcommand.
#[derive(Clone, Copy, Debug)]
pub enum CommandSub<'a> {
    /// `COMMAND`: the whole table ([`compose_command_table`]).
    All,
    /// `COMMAND COUNT` ([`compose_command_count`]).
    Count,
    /// `COMMAND DOCS [name ...]` ([`compose_command_docs`]).
    Docs { names: Args<'a> },
    /// `COMMAND INFO [name ...]` ([`compose_command_info`]).
    Info { names: Args<'a> },
    /// Any other subcommand; `args` excludes `COMMAND` and the subcommand name.
    Other { name: &'a [u8], args: Args<'a> },
}

pub(super) fn parse(args: Args<'_>) -> Result<Command<'_>, CommandError> {
    let Some(name) = args.get(1) else {
        return Ok(Command::Command {
            sub: CommandSub::All,
        });
    };
    let sub = if name.eq_ignore_ascii_case(b"COUNT") {
        check_arity(&args, 2, "command|count")?;
        CommandSub::Count
    } else if name.eq_ignore_ascii_case(b"DOCS") {
        CommandSub::Docs {
            names: args.slice(2),
        }
    } else if name.eq_ignore_ascii_case(b"INFO") {
        CommandSub::Info {
            names: args.slice(2),
        }
    } else {
        CommandSub::Other {
            name: arg(&args, 1),
            args: args.slice(2),
        }
    };
    Ok(Command::Command { sub })
}

/// Where a command's keys are.
#[derive(Clone, Copy)]
enum Keys {
    None,
    /// One key at index 1.
    One {
        flags: &'static [&'static str],
    },
    /// Every argument from index 1 is a key.
    All {
        flags: &'static [&'static str],
    },
}

/// One row of the `COMMAND` reply.
struct Spec {
    name: &'static str,
    arity: i64,
    flags: &'static [&'static str],
    acl: &'static [&'static str],
    tips: &'static [&'static str],
    keys: Keys,
    subcommands: &'static [Spec],
}

const RO_ACCESS: &[&str] = &["RO", "access"];
const CONN_FLAGS: &[&str] = &[
    "noscript",
    "loading",
    "stale",
    "fast",
    "no_auth",
    "allow_busy",
];
const FAST_CONN: &[&str] = &["@fast", "@connection"];
const SLOW_CONN: &[&str] = &["@slow", "@connection"];
const SUB_FLAGS: &[&str] = &["noscript", "loading", "stale"];

const fn spec(name: &'static str, arity: i64, flags: &'static [&'static str]) -> Spec {
    Spec {
        name,
        arity,
        flags,
        acl: SLOW_CONN,
        tips: &[],
        keys: Keys::None,
        subcommands: &[],
    }
}

const COMMAND_SUBS: &[Spec] = &[
    spec("command|count", 2, &["loading", "stale"]),
    Spec {
        tips: &["nondeterministic_output_order"],
        ..spec("command|docs", -2, &["loading", "stale"])
    },
    Spec {
        tips: &["nondeterministic_output_order"],
        ..spec("command|info", -2, &["loading", "stale"])
    },
];

const CLIENT_SUBS: &[Spec] = &[
    spec("client|setname", 3, SUB_FLAGS),
    spec("client|getname", 2, SUB_FLAGS),
    spec("client|setinfo", 4, SUB_FLAGS),
    spec("client|id", 2, SUB_FLAGS),
    Spec {
        tips: &["nondeterministic_output"],
        ..spec("client|info", 2, SUB_FLAGS)
    },
];

const CLUSTER_SUBS: &[Spec] = &[
    spec("cluster|shards", 2, &["loading", "stale"]),
    spec("cluster|slots", 2, &["loading", "stale"]),
    spec("cluster|nodes", 2, &["loading", "stale"]),
    spec("cluster|myid", 2, &["loading", "stale"]),
    spec("cluster|myshardid", 2, &["loading", "stale"]),
    spec("cluster|info", 2, &["loading", "stale"]),
    spec("cluster|keyslot", 3, &["loading", "stale"]),
];

/// The commands pgline serves, as Redis 7 describes them.
const TABLE: &[Spec] = &[
    Spec {
        acl: &["@read", "@string", "@fast"],
        keys: Keys::One { flags: RO_ACCESS },
        ..spec("get", 2, &["readonly", "fast"])
    },
    Spec {
        acl: &["@read", "@string", "@fast"],
        tips: &["request_policy:multi_shard"],
        keys: Keys::All { flags: RO_ACCESS },
        ..spec("mget", -2, &["readonly", "fast"])
    },
    Spec {
        acl: &["@keyspace", "@read", "@fast"],
        tips: &["request_policy:multi_shard", "response_policy:agg_sum"],
        keys: Keys::All { flags: &["RO"] },
        ..spec("exists", -2, &["readonly", "fast"])
    },
    Spec {
        acl: &["@read", "@hash", "@fast"],
        keys: Keys::One { flags: RO_ACCESS },
        ..spec("hget", 3, &["readonly", "fast"])
    },
    Spec {
        acl: &["@read", "@hash", "@fast"],
        keys: Keys::One { flags: RO_ACCESS },
        ..spec("hmget", -3, &["readonly", "fast"])
    },
    Spec {
        acl: &["@read", "@hash", "@slow"],
        tips: &["nondeterministic_output_order"],
        keys: Keys::One { flags: RO_ACCESS },
        ..spec("hgetall", 2, &["readonly"])
    },
    Spec {
        acl: FAST_CONN,
        tips: &["request_policy:all_shards", "response_policy:all_succeeded"],
        ..spec("ping", -1, &["fast"])
    },
    Spec {
        acl: FAST_CONN,
        ..spec("echo", 2, &["fast"])
    },
    Spec {
        acl: FAST_CONN,
        ..spec("hello", -1, CONN_FLAGS)
    },
    Spec {
        acl: FAST_CONN,
        ..spec("auth", -2, CONN_FLAGS)
    },
    Spec {
        acl: FAST_CONN,
        ..spec("select", 2, &["loading", "stale", "fast"])
    },
    Spec {
        acl: &["@keyspace", "@read", "@fast"],
        tips: &["request_policy:all_shards", "response_policy:agg_sum"],
        ..spec("dbsize", 1, &["readonly", "fast"])
    },
    Spec {
        acl: &["@slow", "@dangerous"],
        tips: &[
            "nondeterministic_output",
            "request_policy:all_shards",
            "response_policy:special",
        ],
        ..spec("info", -1, &["loading", "stale"])
    },
    Spec {
        subcommands: COMMAND_SUBS,
        ..spec("command", -1, &["loading", "stale"])
    },
    Spec {
        acl: &["@slow"],
        subcommands: CLIENT_SUBS,
        ..spec("client", -2, &[])
    },
    Spec {
        acl: &["@slow"],
        subcommands: CLUSTER_SUBS,
        ..spec("cluster", -2, &[])
    },
    Spec {
        acl: FAST_CONN,
        ..spec("readonly", 1, &["loading", "stale", "fast"])
    },
    Spec {
        acl: FAST_CONN,
        ..spec("readwrite", 1, &["loading", "stale", "fast"])
    },
    Spec {
        acl: FAST_CONN,
        ..spec("quit", -1, CONN_FLAGS)
    },
    Spec {
        acl: FAST_CONN,
        ..spec("reset", 1, CONN_FLAGS)
    },
];

/// `COMMAND`: every command pgline serves.
pub fn compose_command_table(out: &mut Vec<u8>, proto: Protocol) {
    compose_array_header(out, TABLE.len());
    for spec in TABLE {
        compose_spec(out, spec, proto);
    }
}

/// `COMMAND COUNT`: the number of top-level commands in [`compose_command_table`].
pub fn compose_command_count(out: &mut Vec<u8>) {
    compose_integer(out, i64::try_from(TABLE.len()).unwrap_or(i64::MAX));
}

/// `COMMAND INFO [name ...]`: one row per name (null for names pgline does not serve;
/// `container|sub` names a subcommand); with no names, the whole table.
pub fn compose_command_info(out: &mut Vec<u8>, names: Args, proto: Protocol) {
    if names.is_empty() {
        compose_command_table(out, proto);
        return;
    }
    compose_array_header(out, names.len());
    for name in names.iter() {
        match find(name) {
            Some(spec) => compose_spec(out, spec, proto),
            None => compose_null(out, proto),
        }
    }
}

/// `COMMAND DOCS [name ...]`: pgline publishes no documentation, so an empty map.
pub fn compose_command_docs(out: &mut Vec<u8>, _names: Args, proto: Protocol) {
    compose_map_header(out, 0, proto);
}

fn find(name: &[u8]) -> Option<&'static Spec> {
    let matches = |spec: &&Spec| spec.name.as_bytes().eq_ignore_ascii_case(name);
    TABLE
        .iter()
        .find(matches)
        .or_else(|| TABLE.iter().flat_map(|s| s.subcommands).find(matches))
}

fn compose_statuses(out: &mut Vec<u8>, items: &[&str], proto: Protocol) {
    compose_set_header(out, items.len(), proto);
    for item in items {
        compose_simple(out, item.as_bytes());
    }
}

fn compose_spec(out: &mut Vec<u8>, spec: &Spec, proto: Protocol) {
    let (first, last, step) = match spec.keys {
        Keys::None => (0, 0, 0),
        Keys::One { .. } => (1, 1, 1),
        Keys::All { .. } => (1, -1, 1),
    };
    compose_array_header(out, 10);
    compose_bulk(out, spec.name.as_bytes());
    compose_integer(out, spec.arity);
    compose_statuses(out, spec.flags, proto);
    compose_integer(out, first);
    compose_integer(out, last);
    compose_integer(out, step);
    compose_statuses(out, spec.acl, proto);
    compose_statuses(out, spec.tips, proto);
    compose_key_specs(out, spec.keys, proto);
    compose_array_header(out, spec.subcommands.len());
    for sub in spec.subcommands {
        compose_spec(out, sub, proto);
    }
}

/// Redis 7 key specifications: `[{flags, begin_search: {type: index, spec: {index: 1}},
/// find_keys: {type: range, spec: {lastkey, keystep: 1, limit: 0}}}]`.
fn compose_key_specs(out: &mut Vec<u8>, keys: Keys, proto: Protocol) {
    let (flags, lastkey) = match keys {
        Keys::None => return compose_array_header(out, 0),
        Keys::One { flags } => (flags, 0),
        Keys::All { flags } => (flags, -1),
    };
    compose_array_header(out, 1);
    compose_map_header(out, 3, proto);
    compose_bulk(out, b"flags");
    compose_statuses(out, flags, proto);
    compose_bulk(out, b"begin_search");
    compose_map_header(out, 2, proto);
    compose_bulk(out, b"type");
    compose_bulk(out, b"index");
    compose_bulk(out, b"spec");
    compose_map_header(out, 1, proto);
    compose_bulk(out, b"index");
    compose_integer(out, 1);
    compose_bulk(out, b"find_keys");
    compose_map_header(out, 2, proto);
    compose_bulk(out, b"type");
    compose_bulk(out, b"range");
    compose_bulk(out, b"spec");
    compose_map_header(out, 3, proto);
    for (key, value) in [("lastkey", lastkey), ("keystep", 1), ("limit", 0)] {
        compose_bulk(out, key.as_bytes());
        compose_integer(out, value);
    }
}

#[cfg(test)]
#[path = "command_tests.rs"]
mod tests;
