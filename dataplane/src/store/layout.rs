//! Geometry of the arena (index, segments), the key hash, slot encoding and the entry header.
//!
//! Everything here is pure arithmetic on words; no memory is touched except through the
//! `&[AtomicU64]` handed in, and every offset read from shared memory is checked before use.

use std::sync::atomic::{AtomicU64, Ordering};

use super::{StoreConfig, StoreError, MAX_SECTIONS};

/// Words per index bucket (64 bytes): one version word and [`SLOTS_PER_BUCKET`] slots.
pub(crate) const BUCKET_WORDS: usize = 8;
/// Slots per bucket.
pub(crate) const SLOTS_PER_BUCKET: usize = BUCKET_WORDS - 1;
/// Words of an entry header.
pub(crate) const HEADER_WORDS: usize = 5;
/// Largest budget the slot encoding can address (40-bit word offsets = 8 TiB; kept lower).
pub(crate) const MAX_MEMORY_BYTES: usize = 1 << 40;
/// Entry flag: negative ("no such row") entry.
pub(crate) const FLAG_NEGATIVE: u64 = 1;

const OFFSET_BITS: u32 = 40;
const OFFSET_MASK: u64 = (1 << OFFSET_BITS) - 1;

/// Where the index and segments live inside the arena, in words.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Layout {
    /// Number of buckets (a power of two).
    pub buckets: usize,
    /// First word of segment 0 (= index words).
    pub seg_base: usize,
    /// Words per segment.
    pub seg_words: usize,
    /// Number of segments.
    pub segments: u32,
}

impl Layout {
    /// Index of about 1/16 of the budget (a power of two of buckets), then whole segments.
    pub(crate) fn compute(cfg: &StoreConfig) -> Result<Layout, StoreError> {
        let seg = cfg.segment_bytes;
        if !seg.is_power_of_two()
            || !(super::MIN_SEGMENT_BYTES..=super::MAX_SEGMENT_BYTES).contains(&seg)
        {
            return Err(StoreError::Config(
                "segment_bytes must be a power of two in 64KiB..=64MiB",
            ));
        }
        if cfg.memory_bytes > MAX_MEMORY_BYTES {
            return Err(StoreError::Config("memory_bytes must be at most 1 TiB"));
        }
        let index_target = (cfg.memory_bytes / 16).max(BUCKET_WORDS * 8);
        let index_bytes = 1usize << (usize::BITS - 1 - index_target.leading_zeros());
        let segments = cfg.memory_bytes.saturating_sub(index_bytes) / seg;
        if segments < super::MIN_SEGMENTS {
            return Err(StoreError::Config(
                "memory_bytes must hold the index and at least 4 segments",
            ));
        }
        let segments =
            u32::try_from(segments).map_err(|_| StoreError::Config("too many segments"))?;
        Ok(Layout {
            buckets: index_bytes / (BUCKET_WORDS * 8),
            seg_base: index_bytes / 8,
            seg_words: seg / 8,
            segments,
        })
    }

    /// Words the arena must hold.
    pub(crate) fn total_words(&self) -> usize {
        self.seg_base + self.segments as usize * self.seg_words
    }

    /// Bytes of the index.
    #[cfg(test)]
    pub(crate) fn index_bytes(&self) -> usize {
        self.seg_base * 8
    }

    /// First word of bucket `b`'s version (slots follow).
    #[inline]
    pub(crate) fn bucket_word(&self, hash: u64) -> usize {
        (hash as usize & (self.buckets - 1)) * BUCKET_WORDS
    }

    /// First word of segment `s`.
    #[inline]
    pub(crate) fn seg_start(&self, s: u32) -> usize {
        self.seg_base + s as usize * self.seg_words
    }

    /// Segment containing word `w` and the end word of that segment, if `w` is in a segment.
    #[inline]
    pub(crate) fn seg_of(&self, w: usize) -> Option<(u32, usize)> {
        let rel = w.checked_sub(self.seg_base)?;
        let s = rel / self.seg_words;
        let s = u32::try_from(s).ok().filter(|s| *s < self.segments)?;
        Some((s, self.seg_start(s) + self.seg_words))
    }
}

/// 64-bit hash of (table, pk): multiply-rotate over 8-byte chunks, murmur3 finaliser.
#[inline]
pub(crate) fn hash_key(table: u32, pk: &[u8]) -> u64 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    const SEED: u64 = 0x5047_4C49_4E45_0001; // "PGLINE" + 1
    let mut h = SEED ^ (u64::from(table) << 32 | pk.len() as u64).wrapping_mul(K);
    let mut chunks = pk.chunks_exact(8);
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        h = (h ^ u64::from_le_bytes(w)).wrapping_mul(K).rotate_left(29);
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut w = [0u8; 8];
        w[..rest.len()].copy_from_slice(rest);
        h = (h ^ u64::from_le_bytes(w)).wrapping_mul(K).rotate_left(29);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xFF51_AFD7_ED55_8CCD);
    h ^= h >> 33;
    h = h.wrapping_mul(0xC4CE_B9FE_1A85_EC53);
    h ^ (h >> 33)
}

/// Slot value for an entry at word `w` with key hash `hash` (never 0: `w >= seg_base > 0`).
#[inline]
pub(crate) fn encode_slot(hash: u64, w: usize) -> u64 {
    (hash & !OFFSET_MASK) | (w as u64 & OFFSET_MASK)
}

/// True when slot `s` may belong to a key with hash `hash`.
#[inline]
pub(crate) fn slot_tag_matches(s: u64, hash: u64) -> bool {
    s != 0 && (s & !OFFSET_MASK) == (hash & !OFFSET_MASK)
}

/// Word offset stored in slot `s`.
#[inline]
pub(crate) fn slot_word(s: u64) -> usize {
    (s & OFFSET_MASK) as usize
}

/// Words needed for `bytes` bytes.
#[inline]
pub(crate) fn words_for(bytes: usize) -> usize {
    bytes.div_ceil(8)
}

/// A validated entry header: every range it yields lies inside its segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub total_words: usize,
    pub table: u32,
    pub pk_len: usize,
    pub sections: usize,
    pub flags: u64,
    pub lsn: u64,
    pub section_lens: [usize; MAX_SECTIONS],
}

impl Header {
    /// The header words as written by the writer.
    pub(crate) fn compose(&self) -> [u64; HEADER_WORDS] {
        let l = |i: usize| self.section_lens[i] as u64;
        [
            self.total_words as u64 | u64::from(self.table) << 32,
            self.pk_len as u64 | (self.sections as u64) << 32 | self.flags << 40,
            self.lsn,
            l(0) | l(1) << 32,
            l(2) | l(3) << 32,
        ]
    }

    /// Loads and validates the header at word `w`. `None` when `w` is outside a segment or
    /// the header is inconsistent (a torn read, or a stale offset): the caller retries.
    #[inline]
    pub(crate) fn parse(words: &[AtomicU64], layout: &Layout, w: usize) -> Option<Header> {
        let (_, seg_end) = layout.seg_of(w)?;
        let hw = words.get(w..w.checked_add(HEADER_WORDS)?)?;
        if w + HEADER_WORDS > seg_end {
            return None;
        }
        let w0 = hw[0].load(Ordering::Relaxed);
        let w1 = hw[1].load(Ordering::Relaxed);
        let lo = |x: u64| (x & 0xFFFF_FFFF) as usize;
        let hi = |x: u64| (x >> 32) as usize;
        let (l01, l23) = (hw[3].load(Ordering::Relaxed), hw[4].load(Ordering::Relaxed));
        let h = Header {
            total_words: lo(w0),
            table: (w0 >> 32) as u32,
            pk_len: lo(w1),
            sections: ((w1 >> 32) & 0xFF) as usize,
            flags: (w1 >> 40) & 0xFF,
            lsn: hw[2].load(Ordering::Relaxed),
            section_lens: [lo(l01), hi(l01), lo(l23), hi(l23)],
        };
        if h.sections > MAX_SECTIONS || h.section_lens[h.sections..].iter().any(|l| *l != 0) {
            return None;
        }
        let body: usize = h.section_lens.iter().map(|l| words_for(*l)).sum();
        let expect = HEADER_WORDS + words_for(h.pk_len) + body;
        if h.total_words != expect || w + h.total_words > seg_end {
            return None;
        }
        Some(h)
    }

    /// Bytes the entry occupies in its segment.
    pub(crate) fn bytes(&self) -> usize {
        self.total_words * 8
    }

    /// Word offset (relative to the entry) of section `i`'s first word.
    pub(crate) fn section_word(&self, i: usize) -> usize {
        HEADER_WORDS
            + words_for(self.pk_len)
            + self.section_lens[..i]
                .iter()
                .map(|l| words_for(*l))
                .sum::<usize>()
    }
}

/// True when the `pk.len()` bytes stored from word `w` equal `pk` (bounds were checked by
/// [`Header::parse`]; out-of-range words compare unequal).
#[inline]
pub(crate) fn pk_equals(words: &[AtomicU64], w: usize, pk: &[u8]) -> bool {
    for (i, chunk) in pk.chunks(8).enumerate() {
        let Some(word) = words.get(w + i) else {
            return false;
        };
        let stored = word.load(Ordering::Relaxed).to_le_bytes();
        if stored[..chunk.len()] != *chunk {
            return false;
        }
    }
    true
}

/// Appends `len` bytes stored from word `w` to `out`; false if out of range.
#[inline]
pub(crate) fn copy_out(words: &[AtomicU64], w: usize, len: usize, out: &mut Vec<u8>) -> bool {
    let Some(src) = words.get(w..w + words_for(len)) else {
        return false;
    };
    let mut left = len;
    for word in src {
        let bytes = word.load(Ordering::Relaxed).to_le_bytes();
        let n = left.min(8);
        out.extend_from_slice(&bytes[..n]);
        left -= n;
    }
    true
}

/// Stores `bytes` from word `w` (zero-padding the last word); the caller owns the range.
pub(crate) fn store_bytes(words: &[AtomicU64], w: usize, bytes: &[u8]) {
    for (i, chunk) in bytes.chunks(8).enumerate() {
        let mut buf = [0u8; 8];
        buf[..chunk.len()].copy_from_slice(chunk);
        if let Some(word) = words.get(w + i) {
            word.store(u64::from_le_bytes(buf), Ordering::Relaxed);
        }
    }
}

/// Loads `len` bytes stored from word `w` into `out` (writer side; `out` is cleared first).
pub(crate) fn load_bytes(words: &[AtomicU64], w: usize, len: usize, out: &mut Vec<u8>) {
    out.clear();
    copy_out(words, w, len, out);
}
