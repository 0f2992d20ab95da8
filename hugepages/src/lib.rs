//! Memory regions backed by the largest page size the machine grants.
//!
//! # Purpose
//! pgline's store lives in one anonymous mapping reserved at start-up. [`Region::reserve`]
//! tries, from the largest page size down and never above [`RegionOptions::max_level`]:
//!
//! 1. 1 GiB hugetlb pages (`MAP_HUGETLB | MAP_HUGE_1GB`),
//! 2. 2 MiB hugetlb pages (`MAP_HUGETLB | MAP_HUGE_2MB`),
//! 3. transparent huge pages: a 2 MiB-aligned anonymous map with `madvise(MADV_HUGEPAGE)`,
//!    only when `/sys/kernel/mm/transparent_hugepage/enabled` is `always` or `madvise`,
//! 4. plain base pages.
//!
//! The level obtained is returned as data ([`Region::level`]); this crate logs nothing.
//!
//! # Invariants
//! - `len()` is the requested size rounded up to the page size of the level obtained; the
//!   mapping is exactly `len()` bytes, page aligned, zero-filled, readable and writable.
//! - A hugetlb level is only tried when rounding the request up to its page size adds at most
//!   1/8 of the request (a 256 MiB store does not take a whole 1 GiB page); the error lists
//!   such levels as skipped.
//! - With `prefault`, every page is touched before `reserve` returns, so a missing hugepage
//!   shows at start-up rather than as a `SIGBUS` at the first write. hugetlb mappings are
//!   reserved by the kernel at `mmap` time (no `MAP_NORESERVE`), so a short pool fails `mmap`.
//!
//! # Thread model
//! [`Region`] is `Send + Sync`: it only hands out a raw pointer; what is stored there and how it
//! is synchronised is the user's business. The mapping is unmapped on drop.
//!
//! # Limitations
//! - Linux only. THP is a request, not a guarantee: [`Region::anon_huge_bytes`] reads
//!   `/proc/self/smaps` to tell how much of the region the kernel really backs with huge pages.
//! - The THP page size is taken as 2 MiB (x86-64 and most arm64 kernels).
#![deny(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn)]

use std::fmt;
use std::io;
use std::ptr::NonNull;

const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;
const GIB: usize = 1024 * MIB;
/// Page size assumed for transparent huge pages.
pub const THP_PAGE_SIZE: usize = 2 * MIB;
const THP_ENABLED_PATH: &str = "/sys/kernel/mm/transparent_hugepage/enabled";

/// Page size class of a [`Region`], ordered from smallest to largest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PageLevel {
    /// Base pages (4 KiB on x86-64).
    Base,
    /// Anonymous memory advised with `MADV_HUGEPAGE`.
    Transparent,
    /// 2 MiB hugetlb pages.
    Huge2M,
    /// 1 GiB hugetlb pages.
    Huge1G,
}

impl PageLevel {
    /// Every level, largest first (the order [`Region::reserve`] tries them in).
    pub const DESCENDING: [PageLevel; 4] = [
        PageLevel::Huge1G,
        PageLevel::Huge2M,
        PageLevel::Transparent,
        PageLevel::Base,
    ];
}

impl fmt::Display for PageLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PageLevel::Base => "4KiB",
            PageLevel::Transparent => "THP",
            PageLevel::Huge2M => "2MiB",
            PageLevel::Huge1G => "1GiB",
        })
    }
}

/// What to reserve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionOptions {
    /// Requested size in bytes (rounded up to the page size obtained).
    pub bytes: usize,
    /// Largest page level to try.
    pub max_level: PageLevel,
    /// Touch every page before returning.
    pub prefault: bool,
}

/// Why one level was not obtained.
#[derive(Debug)]
pub enum LevelFailure {
    /// The level was not tried (e.g. rounding would waste too much, THP disabled).
    Skipped(&'static str),
    /// The kernel refused the mapping or the advice.
    Os(io::Error),
}

impl fmt::Display for LevelFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LevelFailure::Skipped(why) => write!(f, "skipped: {why}"),
            LevelFailure::Os(e) => write!(f, "{e}"),
        }
    }
}

/// A region could not be reserved at any level.
#[derive(Debug, thiserror::Error)]
pub enum RegionError {
    /// Zero bytes were asked for.
    #[error("cannot reserve an empty region")]
    Empty,
    /// Rounding the size up overflows `usize`.
    #[error("region of {bytes} bytes is too large")]
    TooLarge {
        /// Requested size.
        bytes: usize,
    },
    /// Every level from `max_level` down failed; `failures` says why, largest level first.
    #[error("could not reserve {bytes} bytes (max level {max_level}): {}", DisplayFailures(.failures))]
    AllLevelsFailed {
        /// Requested size.
        bytes: usize,
        /// Largest level that was allowed.
        max_level: PageLevel,
        /// One entry per level tried, largest first.
        failures: Vec<(PageLevel, LevelFailure)>,
    },
}

struct DisplayFailures<'a>(&'a [(PageLevel, LevelFailure)]);

impl fmt::Display for DisplayFailures<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (level, why)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{level}: {why}")?;
        }
        Ok(())
    }
}

/// An anonymous, page-aligned, zero-filled mapping; unmapped on drop.
#[derive(Debug)]
pub struct Region {
    ptr: NonNull<u8>,
    len: usize,
    level: PageLevel,
    page_size: usize,
}

// SAFETY: `Region` owns its mapping exclusively and only exposes a raw pointer; it holds no
// thread-affine state, so moving it or sharing `&Region` between threads is sound. Accesses
// through the pointer are the caller's responsibility.
#[allow(unsafe_code)]
unsafe impl Send for Region {}
// SAFETY: see `Send`: `&Region` only allows reading the immutable fields.
#[allow(unsafe_code)]
unsafe impl Sync for Region {}

impl Region {
    /// Reserves `opts.bytes` at the largest page level available, at most `opts.max_level`.
    pub fn reserve(opts: &RegionOptions) -> Result<Region, RegionError> {
        if opts.bytes == 0 {
            return Err(RegionError::Empty);
        }
        let mut failures = Vec::new();
        for level in PageLevel::DESCENDING {
            if level > opts.max_level {
                continue;
            }
            match try_level(level, opts.bytes) {
                Ok(region) => {
                    if opts.prefault {
                        region.prefault();
                    }
                    return Ok(region);
                }
                Err(LevelError::Overflow) => {
                    return Err(RegionError::TooLarge { bytes: opts.bytes })
                }
                Err(LevelError::Failed(why)) => failures.push((level, why)),
            }
        }
        Err(RegionError::AllLevelsFailed {
            bytes: opts.bytes,
            max_level: opts.max_level,
            failures,
        })
    }

    /// Page level obtained.
    pub fn level(&self) -> PageLevel {
        self.level
    }

    /// Page size of the level obtained, in bytes.
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// Number of pages (`len() / page_size()`).
    pub fn page_count(&self) -> usize {
        self.len / self.page_size
    }

    /// Length in bytes: the requested size rounded up to the page size.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: empty regions cannot be reserved.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Start of the mapping (page aligned, valid for `len()` bytes while `self` lives).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Bytes of this region backed by transparent huge pages, from `/proc/self/smaps`
    /// (`AnonHugePages`). `None` when smaps cannot be read or the mapping is not found.
    /// hugetlb regions report 0 here: their pages are counted by the hugetlb pool instead.
    pub fn anon_huge_bytes(&self) -> Option<usize> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        parse_anon_huge_bytes(&smaps, self.ptr.as_ptr() as usize, self.len)
    }

    /// Writes one zero byte to every base page so that every page is faulted in now.
    #[allow(unsafe_code)]
    fn prefault(&self) {
        // Huge levels fault a whole huge page per touch; THP may fall back to base pages per
        // 2 MiB extent, so touch each base page there.
        let step = match self.level {
            PageLevel::Huge1G | PageLevel::Huge2M => self.page_size,
            PageLevel::Transparent | PageLevel::Base => base_page_size(),
        };
        let mut off = 0;
        while off < self.len {
            // SAFETY: `off < len`, and the mapping is readable and writable for `len` bytes
            // while `self` lives. Nothing else can hold a reference into it yet (the region
            // has not been returned to the caller), and it is zero-filled, so writing 0 does
            // not change its contents.
            unsafe { self.ptr.as_ptr().add(off).write_volatile(0) };
            off += step;
        }
    }
}

#[allow(unsafe_code)]
impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` describe exactly the mapping created in `map_anon` (or trimmed
        // to in `map_thp`), owned by `self` and unmapped only here.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

enum LevelError {
    Overflow,
    Failed(LevelFailure),
}

fn try_level(level: PageLevel, bytes: usize) -> Result<Region, LevelError> {
    let page_size = match level {
        PageLevel::Huge1G => GIB,
        PageLevel::Huge2M => 2 * MIB,
        PageLevel::Transparent => THP_PAGE_SIZE,
        PageLevel::Base => base_page_size(),
    };
    let len = bytes
        .checked_next_multiple_of(page_size)
        .ok_or(LevelError::Overflow)?;
    let skip = |why| Err(LevelError::Failed(LevelFailure::Skipped(why)));
    match level {
        PageLevel::Huge1G | PageLevel::Huge2M => {
            if len - bytes > bytes / 8 {
                return skip("rounding up to the page size would waste more than 1/8");
            }
            let flags = libc::MAP_HUGETLB
                | if level == PageLevel::Huge1G {
                    libc::MAP_HUGE_1GB
                } else {
                    libc::MAP_HUGE_2MB
                };
            let ptr = map_anon(len, flags).map_err(|e| LevelError::Failed(LevelFailure::Os(e)))?;
            Ok(Region {
                ptr,
                len,
                level,
                page_size,
            })
        }
        PageLevel::Transparent => {
            if !thp_allows_madvise() {
                return skip("transparent hugepages are disabled");
            }
            let ptr = map_thp(len).map_err(|e| LevelError::Failed(LevelFailure::Os(e)))?;
            Ok(Region {
                ptr,
                len,
                level,
                page_size,
            })
        }
        PageLevel::Base => {
            let ptr = map_anon(len, 0).map_err(|e| LevelError::Failed(LevelFailure::Os(e)))?;
            Ok(Region {
                ptr,
                len,
                level,
                page_size,
            })
        }
    }
}

#[allow(unsafe_code)]
fn base_page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size)
        .ok()
        .filter(|s| *s > 0)
        .unwrap_or(4 * KIB)
}

/// Private anonymous read-write mapping of `len` bytes with extra `flags`.
#[allow(unsafe_code)]
fn map_anon(len: usize, flags: libc::c_int) -> io::Result<NonNull<u8>> {
    // SAFETY: a fresh anonymous mapping with a null hint cannot alias any existing memory;
    // the result is checked against MAP_FAILED before use.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | flags,
            -1,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(ptr.cast()).ok_or_else(|| io::Error::other("mmap returned null"))
}

/// A `len`-byte mapping aligned to [`THP_PAGE_SIZE`] and advised `MADV_HUGEPAGE`.
#[allow(unsafe_code)]
fn map_thp(len: usize) -> io::Result<NonNull<u8>> {
    let over = len
        .checked_add(THP_PAGE_SIZE)
        .ok_or_else(|| io::Error::other("size overflow"))?;
    let raw = map_anon(over, 0)?;
    let start = raw.as_ptr() as usize;
    let aligned = start.next_multiple_of(THP_PAGE_SIZE);
    let head = aligned - start;
    let tail = over - head - len;
    // SAFETY: `[start, start + head)` and `[aligned + len, start + over)` are page-aligned
    // sub-ranges (start and THP_PAGE_SIZE are page aligned, len is a multiple of it) of the
    // mapping just created, not handed out to anyone; unmapping them leaves exactly
    // `[aligned, aligned + len)` mapped.
    unsafe {
        if head > 0 {
            libc::munmap(raw.as_ptr().cast(), head);
        }
        if tail > 0 {
            libc::munmap((aligned + len) as *mut libc::c_void, tail);
        }
    }
    let ptr = aligned as *mut libc::c_void;
    // SAFETY: `[aligned, aligned + len)` is a live anonymous mapping owned here; madvise
    // does not invalidate it.
    let rc = unsafe { libc::madvise(ptr, len, libc::MADV_HUGEPAGE) };
    if rc != 0 {
        let err = io::Error::last_os_error();
        // SAFETY: same range, still owned here and not handed out.
        unsafe { libc::munmap(ptr, len) };
        return Err(err);
    }
    NonNull::new(ptr.cast()).ok_or_else(|| io::Error::other("mmap returned null"))
}

/// True when the THP mode is `always` or `madvise` (the bracketed word in the sysfs file).
fn thp_allows_madvise() -> bool {
    std::fs::read_to_string(THP_ENABLED_PATH)
        .map(|s| parse_thp_enabled(&s))
        .unwrap_or(false)
}

fn parse_thp_enabled(s: &str) -> bool {
    s.split_whitespace()
        .any(|w| w == "[always]" || w == "[madvise]")
}

/// Sums `AnonHugePages` of the smaps entries that lie inside `[start, start + len)`.
fn parse_anon_huge_bytes(smaps: &str, start: usize, len: usize) -> Option<usize> {
    let end = start.checked_add(len)?;
    let mut inside = false;
    let mut found = false;
    let mut total = 0usize;
    for line in smaps.lines() {
        if let Some((range, _)) = line.split_once(' ') {
            if let Some((lo, hi)) = range.split_once('-') {
                if let (Ok(lo), Ok(hi)) =
                    (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
                {
                    inside = lo >= start && hi <= end;
                    found |= inside;
                    continue;
                }
            }
        }
        if inside {
            if let Some(rest) = line.strip_prefix("AnonHugePages:") {
                let kb: usize = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
                total += kb * KIB;
            }
        }
    }
    found.then_some(total)
}

/// Hands the C heap's free pages back to the kernel (glibc `malloc_trim(0)`): every arena,
/// including free chunks in the middle of a heap, not only its top. Returns whether memory was
/// released.
///
/// Why here: glibc raises its mmap threshold after a large buffer is freed, so later large
/// buffers come from the arenas and stay there (resident) after they are freed; after a burst
/// of connections with big reply buffers the process keeps that memory until trimmed. The
/// dataplane calls this after it released a lot of connection buffer memory, at most once a
/// second per core. It walks every arena under its lock: a few milliseconds for a heap of a
/// few hundred MiB; other threads' allocations wait meanwhile. On other C libraries (musl has
/// no `malloc_trim`) it does nothing and returns false.
#[allow(unsafe_code)]
pub fn release_free_heap() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim has no preconditions; it only takes the allocator's own locks and
        // releases pages of chunks that are free (no live allocation is touched).
        unsafe { libc::malloc_trim(0) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

#[cfg(test)]
#[allow(unsafe_code)]
mod tests;
