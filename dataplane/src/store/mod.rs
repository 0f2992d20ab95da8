//! The store: a fixed-budget, single-writer / many-reader cache of pre-encoded rows.
//!
//! # Place on the hit path
//! A dataplane core parses `GET users:42`, calls [`StoreReader::read`] with the table id, the
//! primary-key bytes and the section it wants (e.g. 0 = RESP bulk string, 1 = PG `DataRow`),
//! and gets the bytes appended to its TX buffer: one hash, one 64-byte bucket, one entry copy,
//! no lock, no allocation. The single [`StoreWriter`] lives in the control plane and applies
//! fills and WAL changes.
//!
//! # Layout
//! One [`pgline_hugepages::Region`] of `memory_bytes` (the budget, never exceeded) is seen as
//! `AtomicU64` words (`arena.rs`, the only `unsafe` here):
//!
//! ```text
//! [ index: 2^k buckets x 64 B (~1/16 of the budget) ][ seg 0 ][ seg 1 ] ... [ seg n-1 ][ unused ]
//! bucket = [ version u64 | 7 slots u64 ]     slot = hash tag (high 24 bits) | entry word offset (40 bits), 0 = empty
//! entry  = [ total_words u32 | table u32 ][ pk_len u32 | nsections u8 | flags u8 ][ lsn u64 ]
//!          [ len0 u32 | len1 u32 ][ len2 u32 | len3 u32 ][ pk bytes, padded to 8 ][ section i, padded to 8 ]...
//! ```
//!
//! Entries are appended to the open segment (default 1 MiB). Per-segment metadata (fill, live
//! bytes, FIFO order) is the writer's, on the heap; the per-segment *referenced* bits and the
//! stats counters are shared atomics on the heap (small, O(segments)).
//!
//! **Bucket overflow**: a key lives only in its own bucket. When all 7 slots are taken, the
//! insert evicts the bucket's oldest entry (the one in the segment filled earliest), which is
//! what CLOCK would reach first anyway. No chains: a lookup is always exactly one bucket.
//!
//! # Seqlock protocol (fences)
//! Writer, to change slots of a bucket: `version = v+1` (odd), `fence(Release)`, slot stores,
//! `version = v+2` (Release). Entry bytes are written *before* the slot that points at them is
//! published. Reader: `v1 = version.load(Acquire)` (retry if odd), load slots and copy the
//! entry through `AtomicU64` loads (Relaxed), `fence(Acquire)`, `v2 = version.load(Relaxed)`;
//! a hit counts only if `v1 == v2`, else `out` is truncated back and the read retried.
//!
//! Why a copied value is never torn: if the reader read any word written after the writer's
//! `fence(Release)` (a new slot, or bytes of an entry written later), its `fence(Acquire)`
//! synchronises with that fence, so the odd version stored before it is visible to the
//! re-check and `v2 != v1`. **Segment reuse**: before writing into an evicted (or cleared)
//! segment, the writer removes all of its live entries from the index (each removal bumps its
//! bucket's version; dead entries were removed, with a bump, when they died) and then issues
//! one `fence(Release)`. A reader holding a stale slot that copies reused bytes therefore sees
//! its bucket's version changed and retries. Every length and offset read from shared memory
//! is bounds-checked against its segment before use, so torn reads never panic or leave the
//! arena; an inconsistent entry is treated as "not this key" and the re-check decides.
//!
//! # Eviction: CLOCK over segments
//! A hit sets its segment's referenced bit (load first, store only if clear, so hot segments
//! cost no cache-line writes). When no free segment is left, the writer walks sealed segments
//! in FIFO order: referenced ones get their bit cleared and go to the back (second chance),
//! the first unreferenced one is evicted (its live entries removed from the index) and reused.
//! Why CLOCK rather than S3-FIFO or SIEVE: with a segment (1 MiB, thousands of rows) as the
//! unit, SIEVE's hand and CLOCK are nearly the same algorithm, and S3-FIFO's small/main queue
//! split needs either per-entry frequency counters (writes on the hit path) or copying live
//! entries forward (writer bandwidth, more fences). CLOCK needs one bit per segment and keeps
//! the writer's job to "append, and occasionally drop one segment". Its weakness: one hot row
//! keeps a whole segment of cold rows alive for another lap.
//!
//! # Thread model
//! [`StoreWriter`]: `Send`, not `Sync`, not `Clone`: exactly one writer. [`StoreReader`]:
//! `Send + Sync + Clone`, any number of threads.
//!
//! # Accepted races
//! - A reader may set the referenced bit of a segment that was just evicted and reopened: the
//!   new segment gets one undeserved second chance. Harmless.
//! - A reader of a bucket the writer changes continuously gives up after a bounded number of
//!   attempts and reports [`Lookup::Miss`]; the miss path is slower but correct.
//! - [`StoreStats`] fields are individually atomic, not a consistent snapshot.
//! - A reader may copy a torn section (its length bounded by the segment, so at worst one
//!   segment's worth of bytes, which can grow `out`) before the re-check discards it.
//! - The hash is a fixed-seed multiply-rotate mix (`layout::hash_key`), not keyed: keys chosen
//!   to collide can crowd one bucket, which then evicts its own oldest entries (no worse).
//!
//! # Limitations
//! - Replacing or removing an entry leaves its bytes dead in the segment until the segment is
//!   evicted (no compaction); `used_bytes` counts live bytes only.
//! - An entry must fit in one segment (`InsertError::TooLarge`).
//! - The arena logic can run on a heap arena (tests) so that Miri can check it; Miri was not
//!   available on the development toolchain, so concurrency is checked by the stress test.
//! - Bucket overflow evicts a live entry even when memory is free (index sized ~1/16 of the
//!   budget: ~7 slots per 64 bytes, i.e. plenty for rows over ~100 bytes).

mod arena;
mod layout;
mod reader;
mod writer;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use pgline_hugepages::{PageLevel, Region, RegionError, RegionOptions};

pub use reader::StoreReader;
pub use writer::StoreWriter;

use arena::Arena;
use layout::Layout;

/// Sections per entry (one per wire encoding of the row).
pub const MAX_SECTIONS: usize = 4;
/// Default budget: 256 MiB.
pub const DEFAULT_MEMORY_BYTES: usize = 256 << 20;
/// Default segment size: 1 MiB.
pub const DEFAULT_SEGMENT_BYTES: usize = 1 << 20;
/// Default largest page level to try.
pub const DEFAULT_MAX_PAGE_LEVEL: PageLevel = PageLevel::Huge1G;
/// Default: touch every page at start-up.
pub const DEFAULT_PREFAULT: bool = true;
/// Smallest segment.
pub const MIN_SEGMENT_BYTES: usize = 64 << 10;
/// Largest segment.
pub const MAX_SEGMENT_BYTES: usize = 64 << 20;
/// Fewest segments a budget must hold (after the index).
pub const MIN_SEGMENTS: usize = 4;

/// Store configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreConfig {
    /// Total budget: index + segments, never exceeded.
    pub memory_bytes: usize,
    /// Segment size: a power of two in 64 KiB..=64 MiB.
    pub segment_bytes: usize,
    /// Largest page level to ask for.
    pub max_page_level: PageLevel,
    /// Touch every page at start-up.
    pub prefault: bool,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            memory_bytes: DEFAULT_MEMORY_BYTES,
            segment_bytes: DEFAULT_SEGMENT_BYTES,
            max_page_level: DEFAULT_MAX_PAGE_LEVEL,
            prefault: DEFAULT_PREFAULT,
        }
    }
}

impl StoreConfig {
    /// Checks sizes: segment a power of two in range, budget <= 1 TiB holding the index and
    /// at least [`MIN_SEGMENTS`] segments.
    pub fn validate(&self) -> Result<(), StoreError> {
        Layout::compute(self).map(|_| ())
    }
}

/// The store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A configuration value is out of range.
    #[error("invalid store config: {0}")]
    Config(&'static str),
    /// No memory region could be reserved.
    #[error("store memory: {0}")]
    Region(#[from] RegionError),
}

/// An insert was refused; the store is unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InsertError {
    /// More than [`MAX_SECTIONS`] sections.
    #[error("{given} sections, at most {MAX_SECTIONS}")]
    TooManySections {
        /// Sections given.
        given: usize,
    },
    /// The entry does not fit in one segment.
    #[error("entry of {bytes} bytes exceeds the segment size {max}")]
    TooLarge {
        /// Encoded entry size.
        bytes: usize,
        /// Segment size.
        max: usize,
    },
}

/// Outcome of a read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// The section was appended.
    Hit,
    /// A cached "no such row".
    Negative,
    /// Not cached (or the entry lacks that section).
    Miss,
}

/// An entry to insert.
#[derive(Clone, Copy, Debug)]
pub struct EntryData<'a> {
    /// Pre-encoded sections, at most [`MAX_SECTIONS`].
    pub sections: &'a [&'a [u8]],
    /// A negative ("no such row") entry.
    pub negative: bool,
    /// LSN (or version) that installed it.
    pub lsn: u64,
}

/// What the writer knows about one cached entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryMeta {
    /// LSN given at insert.
    pub lsn: u64,
    /// Negative entry.
    pub negative: bool,
    /// Bytes the entry occupies (header, key and sections, padded).
    pub bytes: usize,
    /// Segment holding it.
    pub segment: u32,
}

/// Store counters (each field individually atomic; not one consistent snapshot).
#[derive(Clone, Copy, Debug)]
pub struct StoreStats {
    /// Live entries, negative ones included.
    pub entries: u64,
    /// Live negative entries.
    pub negative_entries: u64,
    /// The configured budget.
    pub budget_bytes: u64,
    /// Live entry bytes.
    pub used_bytes: u64,
    /// Segments carved from the budget.
    pub segments_total: u32,
    /// Segments never opened or freed by `clear`.
    pub segments_free: u32,
    /// Segments evicted by CLOCK.
    pub evicted_segments: u64,
    /// Live entries dropped by eviction (segment eviction or bucket overflow).
    pub evicted_entries: u64,
    /// Successful inserts.
    pub inserts: u64,
    /// Page level of the region.
    pub page_level: PageLevel,
    /// Pages in the region.
    pub pages: u64,
    /// Bytes of the region (budget rounded up to the page size).
    pub region_bytes: u64,
}

impl Default for StoreStats {
    fn default() -> Self {
        StoreStats {
            entries: 0,
            negative_entries: 0,
            budget_bytes: 0,
            used_bytes: 0,
            segments_total: 0,
            segments_free: 0,
            evicted_segments: 0,
            evicted_entries: 0,
            inserts: 0,
            page_level: PageLevel::Base,
            pages: 0,
            region_bytes: 0,
        }
    }
}

/// Counters published by the writer (Relaxed stores), read by anyone.
#[derive(Default)]
pub(crate) struct Counters {
    pub entries: AtomicU64,
    pub negative_entries: AtomicU64,
    pub used_bytes: AtomicU64,
    pub segments_free: AtomicU64,
    pub evicted_segments: AtomicU64,
    pub evicted_entries: AtomicU64,
    pub inserts: AtomicU64,
}

/// State shared by the writer and every reader.
pub(crate) struct Shared {
    pub arena: Arena,
    pub layout: Layout,
    /// CLOCK bits, one per segment.
    pub referenced: Box<[AtomicBool]>,
    pub counters: Counters,
    pub budget_bytes: u64,
}

impl Shared {
    #[inline]
    pub(crate) fn mark_referenced(&self, seg: u32) {
        if let Some(bit) = self.referenced.get(seg as usize) {
            if !bit.load(Ordering::Relaxed) {
                bit.store(true, Ordering::Relaxed);
            }
        }
    }

    pub(crate) fn stats(&self) -> StoreStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let region = self.arena.region();
        StoreStats {
            entries: get(&c.entries),
            negative_entries: get(&c.negative_entries),
            budget_bytes: self.budget_bytes,
            used_bytes: get(&c.used_bytes),
            segments_total: self.layout.segments,
            segments_free: u32::try_from(get(&c.segments_free)).unwrap_or(u32::MAX),
            evicted_segments: get(&c.evicted_segments),
            evicted_entries: get(&c.evicted_entries),
            inserts: get(&c.inserts),
            page_level: region.map_or(PageLevel::Base, Region::level),
            pages: region.map_or(0, |r| r.page_count() as u64),
            region_bytes: region.map_or(self.budget_bytes, |r| r.len() as u64),
        }
    }
}

/// Reserves the region and returns the single writer and a reader (clone it per core).
pub fn open(cfg: &StoreConfig) -> Result<(StoreWriter, StoreReader), StoreError> {
    let layout = Layout::compute(cfg)?;
    let region = Region::reserve(&RegionOptions {
        bytes: cfg.memory_bytes,
        max_level: cfg.max_page_level,
        prefault: cfg.prefault,
    })?;
    let arena = Arena::from_region(region, layout.total_words())
        .ok_or(StoreError::Config("region shorter than the layout"))?;
    Ok(open_arena(arena, layout, cfg.memory_bytes))
}

/// Opens a store over a heap arena (tests, Miri).
#[cfg(test)]
pub(crate) fn open_heap(cfg: &StoreConfig) -> Result<(StoreWriter, StoreReader), StoreError> {
    let layout = Layout::compute(cfg)?;
    let arena = Arena::heap(layout.total_words());
    Ok(open_arena(arena, layout, cfg.memory_bytes))
}

pub(crate) fn open_arena(
    arena: Arena,
    layout: Layout,
    budget: usize,
) -> (StoreWriter, StoreReader) {
    let shared = Arc::new(Shared {
        referenced: (0..layout.segments)
            .map(|_| AtomicBool::new(false))
            .collect(),
        arena,
        layout,
        counters: Counters::default(),
        budget_bytes: budget as u64,
    });
    let writer = StoreWriter::new(Arc::clone(&shared));
    (writer, StoreReader { shared })
}

#[cfg(test)]
mod tests;
