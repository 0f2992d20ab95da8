//! PostgreSQL WAL positions (LSNs) as pgline handles them.
//!
//! Purpose: one place for the `X/Y` text form that the origin prints (`pg_current_wal_lsn()`,
//! `IDENTIFY_SYSTEM`, `pg_replication_slots`) and that pgline prints back (logs, REST, metrics).
//! Invariants: an LSN is a plain `u64`; [`format_lsn`] and [`parse_lsn`] are inverse on every
//! value. Thread model: pure functions.

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
