//! Wall-clock time as pgline and the origin count it.
//!
//! Purpose: pgline keeps timestamps in microseconds since the Unix epoch; the replication
//! protocol carries microseconds since 2000-01-01 (the PostgreSQL epoch). Invariants: the
//! difference between the two is [`PG_EPOCH_UNIX_US`]; a clock before 1970 reads 0. Thread
//! model: pure functions over the system clock.

/// Microseconds from 1970-01-01 to 2000-01-01 (the PostgreSQL epoch).
pub const PG_EPOCH_UNIX_US: i64 = 946_684_800_000_000;

/// Now, in microseconds since the Unix epoch.
pub fn unix_now_us() -> i64 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}
