//! Commit visibility: a fill must not install a read that misses a change already applied.
//!
//! PostgreSQL writes (and flushes) a transaction's commit record before the committing backend
//! leaves the proc array, and only then do new snapshots see the transaction. The walsender can
//! decode that commit record, and the writer apply it, in that gap. A lease taken after that
//! (by a miss, or by warming a freshly added table whose earlier changes the writer ignored) is
//! not voided by the change, yet the fill's read may run under a snapshot that does not see it:
//! without this check the fill would install the older row, and no later WAL change would fix it.
//!
//! So the writer remembers, per key, the xid of the last WAL transaction it applied to the key
//! (per table for truncates and relation changes), and a landed fill installs a key only if its
//! statement snapshot (`pg_current_snapshot()`, read in the same statement as the rows) sees
//! that xid. The last xid per key is enough: a later change of the same row waits for the
//! earlier writer's locks, which are released only after it left the proc array.
//!
//! Pruning: a landed fill's snapshot xmin M says every transaction below M had left the proc
//! array when that snapshot was taken, so every snapshot taken later sees them. Fills created
//! after the landing (id >= the writer's next id at that moment) take their snapshots later;
//! once every fill created before it has landed too, xids below M are dropped.
//!
//! A read made on a core (`crate::corefill`) registered no fill id, so pruning does not wait
//! for it: an xid it missed may already be forgotten when its install arrives. Pruning keeps
//! the greatest xmin it pruned below ([`Applied::pruned_below`]); a read whose snapshot xmin is
//! not below it sees every pruned xid (each committed below that xmin), so
//! [`Applied::covers`] plus [`Applied::read_is_current`] is the full check for such a read.
//!
//! Thread model: owned by the writer task. Limitation: pruning needs landed fills, so with no
//! misses at all the map grows with the keys written; past [`MAX_TRACKED`] every read counts as
//! not current (nothing installs; never unsound) until landed fills let it shrink.

use std::collections::{HashMap, VecDeque};

use super::Key;
use crate::fill::{xid_precedes, Snapshot};

/// Pending horizons kept; older ones are dropped (pruning only gets later, never unsound).
const MAX_HORIZONS: usize = 1024;
/// Keys tracked before reads are refused until pruning catches up.
pub const MAX_TRACKED: usize = 4_000_000;

#[derive(Default)]
pub struct Applied {
    keys: HashMap<Key, u32>,
    tables: HashMap<u32, u32>,
    /// `(xmin, next fill id)` of landed fills, oldest first.
    horizons: VecDeque<(u32, u64)>,
    /// The greatest xmin xids were pruned below (none pruned yet: `None`).
    pruned_below: Option<u32>,
}

impl Applied {
    pub fn key_changed(&mut self, key: Key, xid: u32) {
        self.keys.insert(key, xid);
    }

    pub fn table_changed(&mut self, table: u32, xid: u32) {
        self.tables.insert(table, xid);
    }

    /// Whether a read of `key` under `snap` sees every change the writer applied to it. A read
    /// without a snapshot (answered without the origin) is current unless a change is tracked.
    pub fn read_is_current(&self, key: &Key, snap: Option<&Snapshot>) -> bool {
        if self.keys.len() > MAX_TRACKED {
            return false;
        }
        let by_key = self.keys.get(key);
        let by_table = self.tables.get(&key.0);
        [by_key, by_table]
            .into_iter()
            .flatten()
            .all(|&xid| snap.is_some_and(|s| s.sees(xid)))
    }

    /// A fill landed with a snapshot of this `xmin`; fills with ids from `next_id` on start later.
    pub fn horizon(&mut self, xmin: u32, next_id: u64) {
        if self.horizons.len() == MAX_HORIZONS {
            self.horizons.pop_front();
        }
        self.horizons.push_back((xmin, next_id));
    }

    /// Drops xids every future snapshot sees, given the id of the oldest fill still in flight.
    pub fn prune(&mut self, oldest_fill: u64) {
        let mut floor = None;
        while let Some(&(xmin, next_id)) = self.horizons.front() {
            if next_id > oldest_fill {
                break;
            }
            floor = Some(xmin);
            self.horizons.pop_front();
        }
        if let Some(m) = floor {
            self.keys.retain(|_, x| !xid_precedes(*x, m));
            self.tables.retain(|_, x| !xid_precedes(*x, m));
            if self.pruned_below.is_none_or(|p| xid_precedes(p, m)) {
                self.pruned_below = Some(m);
            }
        }
    }

    /// Whether a snapshot of this `xmin` sees every xid pruning has forgotten (see the module
    /// doc): needed besides [`Applied::read_is_current`] for a read no fill id stood for.
    pub fn covers(&self, xmin: u32) -> bool {
        self.pruned_below.is_none_or(|m| !xid_precedes(xmin, m))
    }

    /// Tracked keys.
    #[cfg(test)]
    pub fn tracked(&self) -> usize {
        self.keys.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fill::tests::snap;

    fn key(pk: &str) -> Key {
        (7, pk.as_bytes().into())
    }

    #[test]
    fn a_read_missing_an_applied_change_is_not_current() {
        let mut a = Applied::default();
        assert!(a.read_is_current(&key("1"), Some(&snap(10, 20, &[]))));
        a.key_changed(key("1"), 15);
        // In progress for the snapshot (committed in the WAL, not yet visible).
        assert!(!a.read_is_current(&key("1"), Some(&snap(10, 20, &[15]))));
        // Started after the snapshot.
        assert!(!a.read_is_current(&key("1"), Some(&snap(10, 15, &[]))));
        assert!(a.read_is_current(&key("1"), Some(&snap(10, 20, &[12]))));
        assert!(!a.read_is_current(&key("1"), None));
        assert!(a.read_is_current(&key("2"), None));
        a.table_changed(7, 30);
        assert!(!a.read_is_current(&key("2"), Some(&snap(10, 20, &[]))));
        assert!(a.read_is_current(&key("2"), Some(&snap(31, 31, &[]))));
    }

    #[test]
    fn pruning_waits_for_fills_started_before_the_horizon() {
        let mut a = Applied::default();
        a.key_changed(key("1"), 15);
        a.key_changed(key("2"), 40);
        a.horizon(20, 100);
        a.prune(99);
        assert_eq!(a.tracked(), 2, "fill 99 may hold an older snapshot");
        a.prune(100);
        assert_eq!(a.tracked(), 1);
        assert!(a.read_is_current(&key("1"), Some(&snap(10, 12, &[]))));
        assert!(!a.read_is_current(&key("2"), Some(&snap(30, 40, &[]))));
    }

    #[test]
    fn a_read_older_than_the_pruned_horizon_is_not_covered() {
        let mut a = Applied::default();
        assert!(a.covers(5), "nothing pruned yet");
        a.key_changed(key("1"), 15);
        a.horizon(20, 1);
        a.prune(1);
        // xid 15 is forgotten: a snapshot that had it in progress reads as current by the key
        // alone, so only the horizon refuses it.
        let old = snap(14, 16, &[15]);
        assert!(a.read_is_current(&key("1"), Some(&old)));
        assert!(!a.covers(old.xmin));
        assert!(a.covers(20));
        assert!(a.covers(25));
        // An older horizon landing later never lowers the mark.
        a.horizon(10, 2);
        a.prune(2);
        assert!(!a.covers(19));
    }

    #[test]
    fn xids_compare_modulo_2_32() {
        let s = snap(u32::MAX - 5, 3, &[u32::MAX - 1]);
        assert!(s.sees(u32::MAX - 3));
        assert!(!s.sees(u32::MAX - 1));
        assert!(s.sees(2));
        assert!(!s.sees(3));
    }
}
