//! The single writer: appends entries to segments, publishes them in the index under the
//! bucket seqlock, and evicts whole segments with CLOCK.
//!
//! See the module docs of [`crate::store`] for the protocol. Invariants kept here:
//! - an entry is *live* iff its bucket holds a slot encoding exactly its word offset;
//! - every slot change goes through [`StoreWriter::set_slot`] (odd version, fence, store, even);
//! - a segment is written only while open, after `fence(Release)` following the removal of
//!   every entry it held.

use std::cell::Cell;
use std::collections::VecDeque;
use std::marker::PhantomData;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use super::layout::{
    encode_slot, hash_key, load_bytes, pk_equals, slot_tag_matches, slot_word, store_bytes,
    words_for, Header, FLAG_NEGATIVE, HEADER_WORDS, SLOTS_PER_BUCKET,
};
use super::{EntryData, EntryMeta, InsertError, Shared, StoreReader, StoreStats, MAX_SECTIONS};

/// Writer-private state of one segment.
#[derive(Clone, Copy, Debug, Default)]
struct SegMeta {
    /// Words appended since the segment was opened.
    fill: usize,
    /// Words of live entries.
    live_words: usize,
    /// Live entries.
    live_entries: u32,
    /// Opening order (older segments have smaller numbers).
    seq: u64,
}

/// Writer-side counters, published to [`super::Counters`] after every operation.
#[derive(Clone, Copy, Debug, Default)]
struct Counts {
    entries: u64,
    negative: u64,
    used_bytes: u64,
    evicted_segments: u64,
    evicted_entries: u64,
    inserts: u64,
}

/// Live entries per table id (tables without entries absent), kept beside [`Counts`] so that
/// no one has to walk the store to count them.
type TableCounts = rustc_hash::FxHashMap<u32, u64>;

/// The one writer of a store: `Send`, not `Sync`, not `Clone`.
pub struct StoreWriter {
    shared: Arc<Shared>,
    segs: Vec<SegMeta>,
    /// Free segments (a stack; segment 0 on top at start).
    free: Vec<u32>,
    /// Sealed segments, oldest first (the CLOCK ring).
    fifo: VecDeque<u32>,
    /// The segment being appended to.
    open: Option<u32>,
    next_seq: u64,
    counts: Counts,
    tables: TableCounts,
    /// Reusable key buffer for index maintenance.
    scratch: Vec<u8>,
    _not_sync: PhantomData<Cell<()>>,
}

impl StoreWriter {
    pub(crate) fn new(shared: Arc<Shared>) -> StoreWriter {
        let n = shared.layout.segments;
        let w = StoreWriter {
            segs: vec![SegMeta::default(); n as usize],
            free: (0..n).rev().collect(),
            fifo: VecDeque::with_capacity(n as usize),
            open: None,
            next_seq: 0,
            counts: Counts::default(),
            tables: TableCounts::default(),
            scratch: Vec::new(),
            shared,
            _not_sync: PhantomData,
        };
        w.publish();
        w
    }

    /// Inserts or replaces the entry for (table, pk). May evict a segment (CLOCK) or, when the
    /// key's bucket is full, the bucket's oldest entry.
    pub fn insert(
        &mut self,
        table: u32,
        pk: &[u8],
        entry: &EntryData<'_>,
    ) -> Result<(), InsertError> {
        if entry.sections.len() > MAX_SECTIONS {
            return Err(InsertError::TooManySections {
                given: entry.sections.len(),
            });
        }
        let body: usize = entry.sections.iter().map(|s| words_for(s.len())).sum();
        let total = HEADER_WORDS + words_for(pk.len()) + body;
        let seg_words = self.shared.layout.seg_words;
        if total > seg_words {
            return Err(InsertError::TooLarge {
                bytes: total * 8,
                max: seg_words * 8,
            });
        }
        let mut section_lens = [0usize; MAX_SECTIONS];
        for (len, s) in section_lens.iter_mut().zip(entry.sections) {
            *len = s.len();
        }
        let header = Header {
            total_words: total,
            table,
            pk_len: pk.len(),
            sections: entry.sections.len(),
            flags: if entry.negative { FLAG_NEGATIVE } else { 0 },
            lsn: entry.lsn,
            section_lens,
        };
        let w = self.allocate(total);
        self.write_entry(w, &header, pk, entry.sections);

        let hash = hash_key(table, pk);
        let b = self.shared.layout.bucket_word(hash);
        let new_slot = encode_slot(hash, w);
        if let Some((i, old_w, old_h)) = self.find_key(hash, table, pk) {
            self.set_slot(b, i, new_slot);
            self.kill(old_w, &old_h);
        } else if let Some(i) = self.empty_slot(b) {
            self.set_slot(b, i, new_slot);
        } else {
            let (i, old_w, old_h) = self.oldest_in_bucket(b);
            self.set_slot(b, i, new_slot);
            self.kill(old_w, &old_h);
            self.counts.evicted_entries += 1;
        }
        self.birth(w, &header);
        self.counts.inserts += 1;
        self.publish();
        Ok(())
    }

    /// Removes the entry for (table, pk); true if there was one.
    pub fn remove(&mut self, table: u32, pk: &[u8]) -> bool {
        let hash = hash_key(table, pk);
        let Some((i, w, h)) = self.find_key(hash, table, pk) else {
            return false;
        };
        self.set_slot(self.shared.layout.bucket_word(hash), i, 0);
        self.kill(w, &h);
        self.publish();
        true
    }

    /// Removes every entry of `table`; returns how many.
    pub fn remove_table(&mut self, table: u32) -> u64 {
        let mut buf = std::mem::take(&mut self.scratch);
        let mut removed = 0;
        for s in self.segments_in_use() {
            let (mut w, end) = self.seg_extent(s);
            while let Some(h) = self.header_in(w, end) {
                if h.table == table {
                    if let Some((b, i)) = self.live_slot(w, &h, &mut buf) {
                        self.set_slot(b, i, 0);
                        self.kill(w, &h);
                        removed += 1;
                    }
                }
                w += h.total_words;
            }
        }
        self.scratch = buf;
        self.publish();
        removed
    }

    /// Drops every entry and frees every segment.
    pub fn clear(&mut self) {
        let words = self.shared.arena.words();
        let layout = self.shared.layout;
        for b in (0..layout.buckets).map(|b| b * super::layout::BUCKET_WORDS) {
            let Some(bucket) = words.get(b..b + 1 + SLOTS_PER_BUCKET) else {
                continue;
            };
            if bucket[1..].iter().all(|s| s.load(Ordering::Relaxed) == 0) {
                continue;
            }
            let v = bucket[0].load(Ordering::Relaxed);
            bucket[0].store(v + 1, Ordering::Relaxed);
            fence(Ordering::Release);
            for slot in &bucket[1..] {
                slot.store(0, Ordering::Relaxed);
            }
            bucket[0].store(v + 2, Ordering::Release);
        }
        self.segs.fill(SegMeta::default());
        self.free = (0..layout.segments).rev().collect();
        self.fifo.clear();
        self.open = None;
        for bit in self.shared.referenced.iter() {
            bit.store(false, Ordering::Relaxed);
        }
        self.tables.clear();
        self.counts.entries = 0;
        self.counts.negative = 0;
        self.counts.used_bytes = 0;
        self.publish();
    }

    /// What is cached for (table, pk), if anything.
    pub fn meta(&self, table: u32, pk: &[u8]) -> Option<EntryMeta> {
        let (_, w, h) = self.find_key(hash_key(table, pk), table, pk)?;
        Some(self.entry_meta(w, &h))
    }

    /// A new read handle.
    pub fn reader(&self) -> StoreReader {
        StoreReader {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Current counters.
    pub fn stats(&self) -> StoreStats {
        self.shared.stats()
    }

    /// Live entries (negative ones included) of each table that has any, as `(table, entries)`:
    /// counted as entries come and go, so this costs one step per table, not a walk of the
    /// store.
    pub fn entries_by_table(&self) -> impl Iterator<Item = (u32, u64)> + '_ {
        self.tables.iter().map(|(&t, &n)| (t, n))
    }

    /// Calls `f(table, pk, meta)` for every live entry, oldest segment first.
    pub fn for_each_key(&self, mut f: impl FnMut(u32, &[u8], &EntryMeta)) {
        let mut buf = Vec::new();
        for s in self.segments_in_use() {
            let (mut w, end) = self.seg_extent(s);
            while let Some(h) = self.header_in(w, end) {
                if self.live_slot(w, &h, &mut buf).is_some() {
                    f(h.table, &buf, &self.entry_meta(w, &h));
                }
                w += h.total_words;
            }
        }
    }

    // ---- index -------------------------------------------------------------------------

    /// Changes slot `i` of the bucket at word `b` under the seqlock.
    fn set_slot(&self, b: usize, i: usize, value: u64) {
        let words = self.shared.arena.words();
        let (Some(version), Some(slot)) = (words.get(b), words.get(b + 1 + i)) else {
            return;
        };
        let v = version.load(Ordering::Relaxed);
        version.store(v + 1, Ordering::Relaxed);
        // Readers that see the slot store below (or any later write) also see `v + 1`.
        fence(Ordering::Release);
        slot.store(value, Ordering::Relaxed);
        version.store(v + 2, Ordering::Release);
    }

    /// Slot index, entry word and header of the live entry for the key.
    fn find_key(&self, hash: u64, table: u32, pk: &[u8]) -> Option<(usize, usize, Header)> {
        let words = self.shared.arena.words();
        let b = self.shared.layout.bucket_word(hash);
        (0..SLOTS_PER_BUCKET).find_map(|i| {
            let s = words.get(b + 1 + i)?.load(Ordering::Relaxed);
            if !slot_tag_matches(s, hash) {
                return None;
            }
            let w = slot_word(s);
            let h = Header::parse(words, &self.shared.layout, w)?;
            (h.table == table && h.pk_len == pk.len() && pk_equals(words, w + HEADER_WORDS, pk))
                .then_some((i, w, h))
        })
    }

    fn empty_slot(&self, b: usize) -> Option<usize> {
        let words = self.shared.arena.words();
        (0..SLOTS_PER_BUCKET).find(|i| {
            words
                .get(b + 1 + i)
                .is_some_and(|s| s.load(Ordering::Relaxed) == 0)
        })
    }

    /// The entry of a full bucket that sits in the oldest segment (lowest offset on ties).
    fn oldest_in_bucket(&self, b: usize) -> (usize, usize, Header) {
        let words = self.shared.arena.words();
        let layout = &self.shared.layout;
        let mut best: Option<((u64, usize), usize, usize, Header)> = None;
        for i in 0..SLOTS_PER_BUCKET {
            let w = slot_word(
                words
                    .get(b + 1 + i)
                    .map_or(0, |s| s.load(Ordering::Relaxed)),
            );
            let (Some((seg, _)), Some(h)) = (layout.seg_of(w), Header::parse(words, layout, w))
            else {
                continue;
            };
            let age = (self.segs[seg as usize].seq, w);
            match &best {
                Some((a, ..)) if *a <= age => {}
                _ => best = Some((age, i, w, h)),
            }
        }
        let (_, i, w, h) = best.expect("a full bucket holds valid entries written by this writer");
        (i, w, h)
    }

    /// Bucket word and slot index of the entry at `w` if it is live; loads its pk into `buf`.
    fn live_slot(&self, w: usize, h: &Header, buf: &mut Vec<u8>) -> Option<(usize, usize)> {
        let words = self.shared.arena.words();
        load_bytes(words, w + HEADER_WORDS, h.pk_len, buf);
        let hash = hash_key(h.table, buf);
        let b = self.shared.layout.bucket_word(hash);
        let want = encode_slot(hash, w);
        (0..SLOTS_PER_BUCKET)
            .find(|i| {
                words
                    .get(b + 1 + i)
                    .is_some_and(|s| s.load(Ordering::Relaxed) == want)
            })
            .map(|i| (b, i))
    }

    // ---- segments ----------------------------------------------------------------------

    /// Reserves `total` words in the open segment, opening (and if needed evicting) one.
    fn allocate(&mut self, total: usize) -> usize {
        let layout = self.shared.layout;
        if let Some(s) = self.open {
            let meta = &mut self.segs[s as usize];
            if meta.fill + total <= layout.seg_words {
                let w = layout.seg_start(s) + meta.fill;
                meta.fill += total;
                return w;
            }
            self.fifo.push_back(s);
            self.open = None;
        }
        let s = match self.free.pop() {
            Some(s) => s,
            None => self.evict_one(),
        };
        self.segs[s as usize] = SegMeta {
            fill: total,
            live_words: 0,
            live_entries: 0,
            seq: self.next_seq,
        };
        self.next_seq += 1;
        if let Some(bit) = self.shared.referenced.get(s as usize) {
            bit.store(false, Ordering::Relaxed);
        }
        // Every entry that lived here was removed from the index (with a version bump) before
        // this point; readers that copy bytes written after this fence see those bumps.
        fence(Ordering::Release);
        self.open = Some(s);
        layout.seg_start(s)
    }

    /// CLOCK: second chance for referenced segments, evict the first unreferenced one.
    fn evict_one(&mut self) -> u32 {
        let mut chances = self.fifo.len();
        loop {
            let s = self
                .fifo
                .pop_front()
                .expect("sealed segments exist: there are >= 4 segments and none is free");
            let bit = self.shared.referenced.get(s as usize);
            if chances > 0 && bit.is_some_and(|b| b.load(Ordering::Relaxed)) {
                if let Some(b) = bit {
                    b.store(false, Ordering::Relaxed);
                }
                self.fifo.push_back(s);
                chances -= 1;
                continue;
            }
            self.evict_segment(s);
            self.counts.evicted_segments += 1;
            return s;
        }
    }

    /// Removes every live entry of segment `s` from the index.
    fn evict_segment(&mut self, s: u32) {
        if self.segs[s as usize].live_entries > 0 {
            let mut buf = std::mem::take(&mut self.scratch);
            let (mut w, end) = self.seg_extent(s);
            while let Some(h) = self.header_in(w, end) {
                if let Some((b, i)) = self.live_slot(w, &h, &mut buf) {
                    self.set_slot(b, i, 0);
                    self.kill(w, &h);
                    self.counts.evicted_entries += 1;
                }
                w += h.total_words;
            }
            self.scratch = buf;
        }
        self.segs[s as usize] = SegMeta::default();
    }

    /// Sealed segments oldest first, then the open one.
    fn segments_in_use(&self) -> Vec<u32> {
        self.fifo.iter().copied().chain(self.open).collect()
    }

    /// First and end word of the filled part of segment `s`.
    fn seg_extent(&self, s: u32) -> (usize, usize) {
        let start = self.shared.layout.seg_start(s);
        (start, start + self.segs[s as usize].fill)
    }

    /// The header at `w` if `w` is before `end`.
    fn header_in(&self, w: usize, end: usize) -> Option<Header> {
        (w < end).then(|| Header::parse(self.shared.arena.words(), &self.shared.layout, w))?
    }

    fn write_entry(&self, w: usize, h: &Header, pk: &[u8], sections: &[&[u8]]) {
        let words = self.shared.arena.words();
        for (i, v) in h.compose().into_iter().enumerate() {
            if let Some(word) = words.get(w + i) {
                word.store(v, Ordering::Relaxed);
            }
        }
        store_bytes(words, w + HEADER_WORDS, pk);
        for (i, s) in sections.iter().enumerate() {
            store_bytes(words, w + h.section_word(i), s);
        }
    }

    fn entry_meta(&self, w: usize, h: &Header) -> EntryMeta {
        EntryMeta {
            lsn: h.lsn,
            negative: h.flags & FLAG_NEGATIVE != 0,
            bytes: h.bytes(),
            segment: self.shared.layout.seg_of(w).map_or(u32::MAX, |(s, _)| s),
        }
    }

    /// Accounts for an entry entering the index.
    fn birth(&mut self, w: usize, h: &Header) {
        if let Some((s, _)) = self.shared.layout.seg_of(w) {
            let m = &mut self.segs[s as usize];
            m.live_words += h.total_words;
            m.live_entries += 1;
        }
        *self.tables.entry(h.table).or_default() += 1;
        self.counts.entries += 1;
        self.counts.negative += u64::from(h.flags & FLAG_NEGATIVE != 0);
        self.counts.used_bytes += h.bytes() as u64;
    }

    /// Accounts for an entry leaving the index.
    fn kill(&mut self, w: usize, h: &Header) {
        if let Some((s, _)) = self.shared.layout.seg_of(w) {
            let m = &mut self.segs[s as usize];
            m.live_words -= h.total_words;
            m.live_entries -= 1;
        }
        match self.tables.get_mut(&h.table) {
            Some(n) => {
                *n -= 1;
                if *n == 0 {
                    self.tables.remove(&h.table);
                }
            }
            // Every live entry was counted at its birth: a miss here is a bookkeeping bug.
            None => debug_assert!(false, "entry of table {} was never counted", h.table),
        }
        self.counts.entries -= 1;
        self.counts.negative -= u64::from(h.flags & FLAG_NEGATIVE != 0);
        self.counts.used_bytes -= h.bytes() as u64;
    }

    fn publish(&self) {
        let c = &self.shared.counters;
        let n = &self.counts;
        c.entries.store(n.entries, Ordering::Relaxed);
        c.negative_entries.store(n.negative, Ordering::Relaxed);
        c.used_bytes.store(n.used_bytes, Ordering::Relaxed);
        c.segments_free
            .store(self.free.len() as u64, Ordering::Relaxed);
        c.evicted_segments
            .store(n.evicted_segments, Ordering::Relaxed);
        c.evicted_entries
            .store(n.evicted_entries, Ordering::Relaxed);
        c.inserts.store(n.inserts, Ordering::Relaxed);
    }
}

#[cfg(test)]
impl StoreWriter {
    /// Checks the writer's bookkeeping against the arena; panics on a violation.
    pub(crate) fn check_invariants(&self) {
        let mut live_words = 0;
        let mut live_entries = 0u64;
        let mut tables = TableCounts::default();
        let mut buf = Vec::new();
        for s in self.segments_in_use() {
            let (mut w, end) = self.seg_extent(s);
            let (mut words, mut entries) = (0, 0u32);
            while let Some(h) = self.header_in(w, end) {
                if self.live_slot(w, &h, &mut buf).is_some() {
                    words += h.total_words;
                    entries += 1;
                    *tables.entry(h.table).or_default() += 1;
                }
                w += h.total_words;
            }
            assert_eq!(w, end, "segment {s} parses to its fill");
            let m = &self.segs[s as usize];
            assert_eq!(
                (m.live_words, m.live_entries),
                (words, entries),
                "segment {s}"
            );
            live_words += words;
            live_entries += u64::from(entries);
        }
        assert_eq!(live_words as u64 * 8, self.counts.used_bytes);
        assert_eq!(live_entries, self.counts.entries);
        assert_eq!(tables, self.tables, "entries per table");
        let in_use = self.segments_in_use().len() + self.free.len();
        assert_eq!(in_use, self.shared.layout.segments as usize);
    }
}
