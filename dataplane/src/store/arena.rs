//! The store's backing memory seen as a slice of `AtomicU64` words.
//!
//! This is the only place in `store` with `unsafe`: it turns the hugepage [`Region`] into a
//! `&[AtomicU64]`. Everything else (index, segments, readers) indexes that slice with bounds
//! checks and only ever touches the memory through atomic loads and stores, so concurrent
//! readers and the single writer never perform plain racy accesses.
//!
//! Tests can back an arena with a heap slice instead of a mapping, so the store logic can run
//! under Miri, which does not model `mmap`.
#![allow(unsafe_code)]

use std::sync::atomic::AtomicU64;

use pgline_hugepages::Region;

/// Word-addressed shared memory owned by the store.
pub(crate) struct Arena {
    len: usize,
    backing: Backing,
}

enum Backing {
    Region(Region),
    #[cfg(test)]
    Heap(Box<[AtomicU64]>),
}

impl Arena {
    /// Views the first `words` 8-byte words of `region`; `None` if the region is shorter.
    pub(crate) fn from_region(region: Region, words: usize) -> Option<Arena> {
        let bytes = words.checked_mul(8)?;
        if bytes > region.len() || !region.as_ptr().cast::<AtomicU64>().is_aligned() {
            return None;
        }
        Some(Arena {
            len: words,
            backing: Backing::Region(region),
        })
    }

    /// A zeroed heap-backed arena of `words` words (tests, Miri).
    #[cfg(test)]
    pub(crate) fn heap(words: usize) -> Arena {
        let slice: Box<[AtomicU64]> = (0..words).map(|_| AtomicU64::new(0)).collect();
        Arena {
            len: words,
            backing: Backing::Heap(slice),
        }
    }

    /// The whole arena.
    #[inline]
    pub(crate) fn words(&self) -> &[AtomicU64] {
        match &self.backing {
            Backing::Region(region) => {
                // SAFETY: the mapping starts at `region.as_ptr()`, is page aligned (so aligned
                // for `AtomicU64`), readable and writable for `region.len() >= len * 8` bytes
                // (checked in `from_region`) and lives as long as `self.backing`, to which the
                // returned borrow is tied. It was zero-filled at creation, and every bit
                // pattern is a valid `AtomicU64`. Nothing accesses the mapping except through
                // this slice, i.e. through atomics, so sharing it between threads is free of
                // data races. `Region` is `Send + Sync`, hence so is `Arena`.
                unsafe { std::slice::from_raw_parts(region.as_ptr().cast::<AtomicU64>(), self.len) }
            }
            #[cfg(test)]
            Backing::Heap(slice) => slice,
        }
    }

    /// The region behind the arena (`None` for heap arenas).
    pub(crate) fn region(&self) -> Option<&Region> {
        match &self.backing {
            Backing::Region(r) => Some(r),
            #[cfg(test)]
            Backing::Heap(_) => None,
        }
    }
}

/// Hints the CPU to start loading the cache line holding word `i` (no effect if `i` is out of
/// range or on targets without a prefetch instruction). Used to overlap the cache misses of the
/// keys of one `MGET` instead of taking them one after another.
#[inline]
pub(crate) fn prefetch(words: &[AtomicU64], i: usize) {
    #[cfg(target_arch = "x86_64")]
    if let Some(word) = words.get(i) {
        // SAFETY: `_mm_prefetch` needs SSE, which every x86_64 CPU has (it is part of the
        // baseline target). A prefetch is only a hint: it never faults and never reads or
        // writes memory architecturally, and the pointer is in bounds of a live slice anyway.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                word.as_ptr().cast::<i8>().cast_const(),
            )
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (words, i);
}
