//! Rows installed from origin reads taken ahead of the applied WAL position, kept by the
//! position each was read at until the applied WAL reaches it.
//!
//! Purpose: a fill (or a core read) may see a commit pgline has not applied yet; that is safe
//! while the WAL will bring the commit. After a failover that keeps the cache (the slot was
//! synced, and nothing applied lies past the point where the new primary's timeline forks),
//! the WAL never will if the commit died with the old primary: a row read past the fork would
//! stay in the store for good, holding data the new primary never had. So a kept cache drops
//! the rows read past the fork ([`Ahead::past`]), and flushes whole if it lost track of some.
//!
//! Place on the path: the writer, at each install from a read and each applied transaction;
//! nothing when reads are not ahead (the common case once the WAL is caught up).
//!
//! Bounds: at most [`MAX_AHEAD`] rows tracked; past it the highest position of those not
//! tracked is remembered, and a failover that forks below it flushes the whole cache.

use std::collections::BTreeMap;

use super::Key;

/// Rows read ahead of the applied WAL that are tracked at most.
pub const MAX_AHEAD: usize = 65_536;

#[derive(Debug, Default)]
pub struct Ahead {
    /// Rows by the origin WAL position they were read at (above what was applied then).
    by_lsn: BTreeMap<u64, Vec<Key>>,
    len: usize,
    /// The highest read position of a row not tracked (the bound was reached); 0 if none.
    untracked: u64,
}

impl Ahead {
    /// `key` was installed from a read at origin WAL position `read_lsn`, with the WAL applied
    /// up to `applied`.
    pub fn note(&mut self, key: Key, read_lsn: u64, applied: u64) {
        if read_lsn <= applied {
            return;
        }
        if self.len >= MAX_AHEAD {
            self.untracked = self.untracked.max(read_lsn);
            return;
        }
        self.by_lsn.entry(read_lsn).or_default().push(key);
        self.len += 1;
    }

    /// The WAL is applied up to `applied`: the rows read at or below it are covered by it.
    pub fn applied(&mut self, applied: u64) {
        if self
            .by_lsn
            .first_key_value()
            .is_some_and(|(&lsn, _)| lsn <= applied)
        {
            let above = self.by_lsn.split_off(&applied.saturating_add(1));
            let covered = std::mem::replace(&mut self.by_lsn, above);
            self.len -= covered.values().map(Vec::len).sum::<usize>();
        }
        if self.untracked <= applied {
            self.untracked = 0;
        }
    }

    /// A failover keeps the cache, and the new primary's timeline forks at `fork`: the rows
    /// read past it (taken out), or `None` when a row not tracked may have been (flush all).
    pub fn past(&mut self, fork: u64) -> Option<Vec<Key>> {
        if self.untracked > fork {
            self.clear();
            return None;
        }
        let past = self.by_lsn.split_off(&fork.saturating_add(1));
        let keys: Vec<Key> = past.into_values().flatten().collect();
        self.len -= keys.len();
        Some(keys)
    }

    /// The store was flushed: nothing to track.
    pub fn clear(&mut self) {
        self.by_lsn.clear();
        self.len = 0;
        self.untracked = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> Key {
        (1, Box::from([n].as_slice()))
    }

    #[test]
    fn rows_read_past_the_fork_are_given_back_and_covered_ones_forgotten() {
        let mut a = Ahead::default();
        a.note(key(1), 100, 100); // not ahead
        a.note(key(2), 150, 100);
        a.note(key(3), 300, 100);
        a.note(key(4), 200, 100);
        a.applied(160); // covers key 2
        assert_eq!(a.len, 2);
        assert_eq!(a.past(250), Some(vec![key(3)]));
        assert_eq!(a.past(0), Some(vec![key(4)]));
        assert_eq!(a.len, 0);
    }

    #[test]
    fn past_the_bound_a_fork_below_an_untracked_read_flushes() {
        let mut a = Ahead::default();
        for i in 0..MAX_AHEAD {
            a.note((2, i.to_be_bytes().into()), 1_000, 10);
        }
        a.note(key(9), 5_000, 10);
        // A fork above every read: nothing to drop.
        assert_eq!(a.past(6_000), Some(vec![]));
        assert_eq!(a.len, MAX_AHEAD);
        // Below the untracked read: flush.
        assert_eq!(a.past(4_000), None);
        assert_eq!(a.len, 0);
        // Once the WAL passed the untracked read, the tracked ones tell again.
        for i in 0..MAX_AHEAD {
            a.note((2, i.to_be_bytes().into()), 1_000, 10);
        }
        a.note(key(9), 5_000, 10);
        a.applied(5_000);
        assert_eq!(a.past(0), Some(vec![]));
    }
}
