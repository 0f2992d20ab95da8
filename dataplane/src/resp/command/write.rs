//! Redis write commands, all refused with `-READONLY`: pgline is written through PostgreSQL.

/// Lower-case names of Redis commands that write.
const WRITE_COMMANDS: &[&[u8]] = &[
    b"set",
    b"setnx",
    b"setex",
    b"psetex",
    b"getset",
    b"getdel",
    b"getex",
    b"mset",
    b"msetnx",
    b"append",
    b"setrange",
    b"del",
    b"unlink",
    b"incr",
    b"decr",
    b"incrby",
    b"decrby",
    b"incrbyfloat",
    b"expire",
    b"pexpire",
    b"expireat",
    b"pexpireat",
    b"persist",
    b"rename",
    b"renamenx",
    b"copy",
    b"move",
    b"restore",
    b"hset",
    b"hsetnx",
    b"hmset",
    b"hdel",
    b"hincrby",
    b"hincrbyfloat",
    b"lpush",
    b"rpush",
    b"lpushx",
    b"rpushx",
    b"lpop",
    b"rpop",
    b"lset",
    b"lrem",
    b"ltrim",
    b"linsert",
    b"sadd",
    b"srem",
    b"spop",
    b"smove",
    b"zadd",
    b"zrem",
    b"zincrby",
    b"zpopmin",
    b"zpopmax",
    b"pfadd",
    b"xadd",
    b"xdel",
    b"xtrim",
    b"flushdb",
    b"flushall",
    b"swapdb",
    b"setbit",
    b"bitop",
    b"geoadd",
];

pub(super) fn is_write(lower_name: &[u8]) -> bool {
    WRITE_COMMANDS.contains(&lower_name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knows_writes() {
        assert!(is_write(b"set"));
        assert!(is_write(b"flushall"));
        assert!(!is_write(b"get"));
    }
}
