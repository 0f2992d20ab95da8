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
