//! The optimistic, lock-free read side of the store (the hit path).
//!
//! See the module docs of [`crate::store`] for the seqlock protocol this follows.

use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use super::layout::SLOTS_PER_BUCKET;
use super::layout::{copy_out, hash_key, pk_equals, slot_tag_matches, slot_word, Header};
use super::{Lookup, Shared, StoreStats};

/// Attempts before a reader gives up on a bucket the writer keeps changing and reports a
/// miss (the miss path then asks the control plane, which is always correct, only slower).
const MAX_ATTEMPTS: usize = 1024;

/// Cache lines of an entry [`StoreReader::prefetch_entry`] asks for (256 bytes: header, key and
/// a ~166-byte row).
const PREFETCH_LINES: usize = 4;

/// A read handle on the store: `Send + Sync`, cheap to clone (one `Arc`).
#[derive(Clone)]
pub struct StoreReader {
    pub(crate) shared: Arc<Shared>,
}

/// What one probe of one slot found.
enum Probe {
    /// Not the key (tag collision) or an inconsistent entry (torn read, checked by re-check).
    NotThis,
    /// The key, with the outcome and the entry's segment.
    Found(Lookup, u32),
}

impl StoreReader {
    /// Appends section `section` of the entry for (table, pk) to `out` on [`Lookup::Hit`]
    /// (nothing on Negative/Miss, and nothing left behind by retried attempts). No heap
    /// allocation when `out` has capacity. A positive entry without that section is a Miss.
    pub fn read(&self, table: u32, pk: &[u8], section: usize, out: &mut Vec<u8>) -> Lookup {
        let shared = &*self.shared;
        let words = shared.arena.words();
        let hash = hash_key(table, pk);
        let b = shared.layout.bucket_word(hash);
        let Some(bucket) = words.get(b..b + 1 + SLOTS_PER_BUCKET) else {
            return Lookup::Miss;
        };
        let start = out.len();
        for _ in 0..MAX_ATTEMPTS {
            let v1 = bucket[0].load(Ordering::Acquire);
            if v1 & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let mut found = None;
            for slot in &bucket[1..] {
                let s = slot.load(Ordering::Relaxed);
                if !slot_tag_matches(s, hash) {
                    continue;
                }
                if let Probe::Found(lookup, seg) = self.probe(slot_word(s), table, pk, section, out)
                {
                    found = Some((lookup, seg));
                    break;
                }
            }
            // Order every load above before the re-check; pairs with the writer's
            // fence(Release) after it made the version odd (see the module docs).
            fence(Ordering::Acquire);
            if bucket[0].load(Ordering::Relaxed) == v1 {
                return match found {
                    Some((Lookup::Hit, seg)) => {
                        shared.mark_referenced(seg);
                        Lookup::Hit
                    }
                    Some((lookup, _)) => lookup,
                    None => Lookup::Miss,
                };
            }
            out.truncate(start);
        }
        Lookup::Miss
    }

    /// Checks the entry at word `w` against the key and copies the section on a match.
    #[inline]
    fn probe(&self, w: usize, table: u32, pk: &[u8], section: usize, out: &mut Vec<u8>) -> Probe {
        let shared = &*self.shared;
        let words = shared.arena.words();
        let Some(h) = Header::parse(words, &shared.layout, w) else {
            return Probe::NotThis;
        };
        if h.table != table || h.pk_len != pk.len() {
            return Probe::NotThis;
        }
        if !pk_equals(words, w + super::layout::HEADER_WORDS, pk) {
            return Probe::NotThis;
        }
        let Some((seg, _)) = shared.layout.seg_of(w) else {
            return Probe::NotThis;
        };
        if h.flags & super::layout::FLAG_NEGATIVE != 0 {
            return Probe::Found(Lookup::Negative, seg);
        }
        if section >= h.sections {
            return Probe::Found(Lookup::Miss, seg);
        }
        let start = out.len();
        if !copy_out(
            words,
            w + h.section_word(section),
            h.section_lens[section],
            out,
        ) {
            out.truncate(start);
            return Probe::NotThis;
        }
        Probe::Found(Lookup::Hit, seg)
    }

    /// Starts loading the index bucket of (table, pk) into the cache. A batch (the keys of one
    /// `MGET`) calls this for every key, then [`StoreReader::prefetch_entry`] for every key,
    /// then [`StoreReader::read`]: the cache misses of the batch overlap instead of queueing.
    #[inline]
    pub fn prefetch_bucket(&self, table: u32, pk: &[u8]) {
        let shared = &*self.shared;
        let b = shared.layout.bucket_word(hash_key(table, pk));
        super::arena::prefetch(shared.arena.words(), b);
    }

    /// Starts loading the entry header of the first slot of (table, pk)'s bucket whose tag
    /// matches. Reads the bucket without the version check: a stale slot only wastes the hint.
    #[inline]
    pub fn prefetch_entry(&self, table: u32, pk: &[u8]) {
        let shared = &*self.shared;
        let words = shared.arena.words();
        let hash = hash_key(table, pk);
        let b = shared.layout.bucket_word(hash);
        let Some(bucket) = words.get(b + 1..b + 1 + SLOTS_PER_BUCKET) else {
            return;
        };
        for slot in bucket {
            let s = slot.load(Ordering::Relaxed);
            if slot_tag_matches(s, hash) {
                // The header and the first lines of the sections: a typical row entry.
                let w = slot_word(s);
                for line in 0..PREFETCH_LINES {
                    super::arena::prefetch(words, w + line * 8);
                }
                return;
            }
        }
    }

    /// Counters from shared atomics (cheap, each one individually up to date).
    pub fn stats(&self) -> StoreStats {
        self.shared.stats()
    }
}
