//! The Redis write commands pgline recognises so it can refuse them clearly (pgline is a
//! read cache; writes go to PostgreSQL). The list is static, upper-case and sorted, and
//! looked up by binary search on the upper-cased name.

/// Redis commands that modify data or server state, sorted.
const WRITE_COMMANDS: &[&[u8]] = &[
    b"APPEND",
    b"BITFIELD",
    b"BITOP",
    b"BLMOVE",
    b"BLMPOP",
    b"BLPOP",
    b"BRPOP",
    b"BRPOPLPUSH",
    b"BZMPOP",
    b"BZPOPMAX",
    b"BZPOPMIN",
    b"COPY",
    b"DECR",
    b"DECRBY",
    b"DEL",
    b"EVAL",
    b"EVALSHA",
    b"EXPIRE",
    b"EXPIREAT",
    b"FCALL",
    b"FLUSHALL",
    b"FLUSHDB",
    b"GEOADD",
    b"GEORADIUS",
    b"GEORADIUSBYMEMBER",
    b"GEOSEARCHSTORE",
    b"GETDEL",
    b"GETEX",
    b"GETSET",
    b"HDEL",
    b"HINCRBY",
    b"HINCRBYFLOAT",
    b"HMSET",
    b"HSET",
    b"HSETNX",
    b"INCR",
    b"INCRBY",
    b"INCRBYFLOAT",
    b"LINSERT",
    b"LMOVE",
    b"LMPOP",
    b"LPOP",
    b"LPUSH",
    b"LPUSHX",
    b"LREM",
    b"LSET",
    b"LTRIM",
    b"MIGRATE",
    b"MOVE",
    b"MSET",
    b"MSETNX",
    b"PERSIST",
    b"PEXPIRE",
    b"PEXPIREAT",
    b"PFADD",
    b"PFMERGE",
    b"PSETEX",
    b"PUBLISH",
    b"RENAME",
    b"RENAMENX",
    b"RESTORE",
    b"RPOP",
    b"RPOPLPUSH",
    b"RPUSH",
    b"RPUSHX",
    b"SADD",
    b"SDIFFSTORE",
    b"SET",
    b"SETBIT",
    b"SETEX",
    b"SETNX",
    b"SETRANGE",
    b"SINTERSTORE",
    b"SMOVE",
    b"SORT",
    b"SPOP",
    b"SREM",
    b"SUNIONSTORE",
    b"SWAPDB",
    b"UNLINK",
    b"XADD",
    b"XAUTOCLAIM",
    b"XCLAIM",
    b"XDEL",
    b"XGROUP",
    b"XTRIM",
    b"ZADD",
    b"ZDIFFSTORE",
    b"ZINCRBY",
    b"ZINTERSTORE",
    b"ZMPOP",
    b"ZPOPMAX",
    b"ZPOPMIN",
    b"ZRANGESTORE",
    b"ZREM",
    b"ZREMRANGEBYLEX",
    b"ZREMRANGEBYRANK",
    b"ZREMRANGEBYSCORE",
    b"ZUNIONSTORE",
];

/// True if `upper` (already upper-case) names a write command.
pub(super) fn is_upper_write(upper: &[u8]) -> bool {
    WRITE_COMMANDS.binary_search(&upper).is_ok()
}

/// True if `name` (any case) names a Redis write command.
pub fn is_write_command(name: &[u8]) -> bool {
    let mut upper = [0u8; 32];
    match upper.get_mut(..name.len()) {
        Some(upper) => {
            upper.copy_from_slice(name);
            upper.make_ascii_uppercase();
            is_upper_write(upper)
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_is_sorted_upper_case_and_fits_the_name_buffer() {
        assert!(WRITE_COMMANDS.windows(2).all(|w| w[0] < w[1]));
        for name in WRITE_COMMANDS {
            assert!(name.iter().all(|b| !b.is_ascii_lowercase()));
            assert!(name.len() <= super::super::MAX_NAME);
        }
    }

    #[test]
    fn lookup() {
        assert!(is_write_command(b"set"));
        assert!(is_write_command(b"ZRemRangeByScore"));
        assert!(!is_write_command(b"GET"));
        assert!(!is_write_command(b"SETS"));
        assert!(!is_write_command(&[b'S'; 100]));
    }
}
