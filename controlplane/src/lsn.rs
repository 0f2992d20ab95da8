//! PostgreSQL WAL positions (LSNs) as pgline handles them.
//!
//! Purpose: one place for the `X/Y` text form that the origin prints (`pg_current_wal_lsn()`,
//! `IDENTIFY_SYSTEM`, `pg_replication_slots`) and that pgline prints back (logs, REST, metrics).
//! Invariants: an LSN is a plain `u64`; [`format_lsn`] and [`parse_lsn`] are inverse on every
//! value. Thread model: pure functions.

/// SQL for the WAL position a session's reader must have applied to see what the session may
/// have seen at the origin (a `pg_lsn` expression; every operator and function schema-qualified,
/// as the client's `search_path` is in force when it runs): a standby's replayed position; on a
/// primary the *written* position, or the *insert* position ([`insert_lsn_sql`]) for a session
/// whose `synchronous_commit` is `off`.
///
/// A transaction committed with `synchronous_commit = off` is visible as soon as its commit
/// record is inserted, up to three `wal_writer_delay`s before it is written, and a fence below it
/// let the session read its own write as it was before. The insert position is not used for
/// every session: it also covers WAL that no commit is waiting for (the hint bits a read sets on
/// a cluster with data checksums, PostgreSQL 18's default, log full pages), which the origin
/// writes only with the next commit or up to three `wal_writer_delay`s later, and the gate of a
/// session whose read made such WAL would stay shut that long on a quiet origin.
macro_rules! visible_lsn_sql {
    () => {
        concat!(
            "(CASE WHEN pg_catalog.pg_is_in_recovery() THEN pg_catalog.pg_last_wal_replay_lsn() \
             WHEN pg_catalog.current_setting('synchronous_commit') OPERATOR(pg_catalog.<>) 'off' \
             THEN pg_catalog.pg_current_wal_lsn() ELSE ",
            crate::lsn::insert_lsn_sql!(),
            " END)"
        )
    };
}
pub(crate) use visible_lsn_sql;

/// [`visible_lsn_sql`] for a session that may have committed with `synchronous_commit = off`
/// whatever its setting is now (`SET LOCAL`, `set_config(.., true)`, a `RESET` after the commit:
/// the setting that counts is the one in force at the commit): the insert position on a
/// primary, the replayed position on a standby.
macro_rules! async_visible_lsn_sql {
    () => {
        concat!(
            "(CASE WHEN pg_catalog.pg_is_in_recovery() THEN pg_catalog.pg_last_wal_replay_lsn() \
             ELSE ",
            crate::lsn::insert_lsn_sql!(),
            " END)"
        )
    };
}
pub(crate) use async_visible_lsn_sql;

/// The origin's WAL insert position as the end of the last record inserted. When that record
/// ended at a page boundary, `pg_current_wal_insert_lsn()` points past the next page's header
/// (24 bytes, 40 at a segment's start), where no record ends and which the applied position
/// never reaches; it is moved back to the boundary there.
macro_rules! insert_lsn_sql {
    () => {
        "(SELECT CASE \
         WHEN i.o OPERATOR(pg_catalog.=) 24::pg_catalog.numeric \
         THEN i.l OPERATOR(pg_catalog.-) 24::pg_catalog.numeric \
         WHEN i.o OPERATOR(pg_catalog.<>) 40::pg_catalog.numeric THEN i.l \
         WHEN (pg_catalog.pg_walfile_name_offset(i.l)).file_offset OPERATOR(pg_catalog.=) 40 \
         THEN i.l OPERATOR(pg_catalog.-) 40::pg_catalog.numeric ELSE i.l END \
         FROM (SELECT w.l, (w.l OPERATOR(pg_catalog.-) '0/0'::pg_catalog.pg_lsn) \
         OPERATOR(pg_catalog.%) pg_catalog.current_setting('wal_block_size')::pg_catalog.numeric AS o \
         FROM (SELECT pg_catalog.pg_current_wal_insert_lsn() AS l) w) i)"
    };
}
pub(crate) use insert_lsn_sql;

/// Formats an LSN the way PostgreSQL does (`16/B374D848`).
pub fn format_lsn(lsn: u64) -> String {
    format!("{:X}/{:X}", lsn >> 32, lsn & 0xffff_ffff)
}

/// Parses PostgreSQL's `X/Y` LSN notation.
pub fn parse_lsn(s: &str) -> Option<u64> {
    let (hi, lo) = s.split_once('/')?;
    let hi = u32::from_str_radix(hi, 16).ok()?;
    let lo = u32::from_str_radix(lo, 16).ok()?;
    Some((u64::from(hi) << 32) | u64::from(lo))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lsn_round_trip() {
        assert_eq!(format_lsn(0x16_B374_D848), "16/B374D848");
        assert_eq!(parse_lsn("16/B374D848"), Some(0x16_B374_D848));
        assert_eq!(parse_lsn("0/0"), Some(0));
        assert_eq!(parse_lsn("x/1"), None);
        assert_eq!(parse_lsn("1"), None);
        for lsn in [0, 1, u64::from(u32::MAX), u64::MAX] {
            assert_eq!(parse_lsn(&format_lsn(lsn)), Some(lsn));
        }
    }
}
