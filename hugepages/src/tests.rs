use super::*;
use std::sync::Mutex;

/// Tests that depend on the hugetlb pool size run one at a time.
static POOL_LOCK: Mutex<()> = Mutex::new(());

const NR_HUGEPAGES: &str = "/proc/sys/vm/nr_hugepages";

fn meminfo(field: &str) -> Option<usize> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|rest| rest.trim_start_matches(':').split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

fn write_all_and_check(region: &Region) {
    let ptr = region.as_ptr();
    // SAFETY: the region is mapped read-write for len bytes and owned by this test.
    let bytes = unsafe { std::slice::from_raw_parts_mut(ptr, region.len()) };
    assert!(bytes.iter().step_by(4096).all(|b| *b == 0), "zero-filled");
    for (i, b) in bytes.iter_mut().enumerate().step_by(4093) {
        *b = (i % 251) as u8 + 1;
    }
    for (i, b) in bytes.iter().enumerate().step_by(4093) {
        assert_eq!(*b, (i % 251) as u8 + 1);
    }
}

#[test]
fn display_names() {
    assert_eq!(PageLevel::Base.to_string(), "4KiB");
    assert_eq!(PageLevel::Transparent.to_string(), "THP");
    assert_eq!(PageLevel::Huge2M.to_string(), "2MiB");
    assert_eq!(PageLevel::Huge1G.to_string(), "1GiB");
    assert!(PageLevel::Base < PageLevel::Transparent);
    assert!(PageLevel::Huge2M < PageLevel::Huge1G);
}

#[test]
fn thp_enabled_parsing() {
    assert!(parse_thp_enabled("always [madvise] never\n"));
    assert!(parse_thp_enabled("[always] madvise never\n"));
    assert!(!parse_thp_enabled("always madvise [never]\n"));
    assert!(!parse_thp_enabled(""));
}

#[test]
fn smaps_parsing() {
    let smaps = "\
7f0000000000-7f0000400000 rw-p 00000000 00:00 0 
Size:               4096 kB
AnonHugePages:      2048 kB
7f0000400000-7f0000600000 rw-p 00000000 00:00 0 
AnonHugePages:      2048 kB
7f0000600000-7f0000800000 rw-p 00000000 00:00 0 
AnonHugePages:      2048 kB
";
    let start = 0x7f00_0000_0000;
    assert_eq!(parse_anon_huge_bytes(smaps, start, 6 * MIB), Some(4 * MIB));
    assert_eq!(parse_anon_huge_bytes(smaps, start, 8 * MIB), Some(6 * MIB));
    assert_eq!(parse_anon_huge_bytes(smaps, 0x1000, 4096), None);
}

#[test]
fn empty_is_an_error() {
    let err = Region::reserve(&RegionOptions {
        bytes: 0,
        max_level: PageLevel::Huge1G,
        prefault: false,
    })
    .unwrap_err();
    assert!(matches!(err, RegionError::Empty));
}

#[test]
fn base_level_rounds_up_and_is_usable() {
    let region = Region::reserve(&RegionOptions {
        bytes: 10_000,
        max_level: PageLevel::Base,
        prefault: true,
    })
    .unwrap();
    assert_eq!(region.level(), PageLevel::Base);
    assert_eq!(region.page_size(), base_page_size());
    assert_eq!(region.len(), 10_000usize.next_multiple_of(base_page_size()));
    assert_eq!(region.page_count() * region.page_size(), region.len());
    assert_eq!(region.as_ptr() as usize % region.page_size(), 0);
    write_all_and_check(&region);
}

#[test]
fn thp_level_is_aligned_when_allowed() {
    let region = Region::reserve(&RegionOptions {
        bytes: 8 * MIB,
        max_level: PageLevel::Transparent,
        prefault: true,
    })
    .unwrap();
    if thp_allows_madvise() {
        assert_eq!(region.level(), PageLevel::Transparent);
        assert_eq!(region.as_ptr() as usize % THP_PAGE_SIZE, 0);
        assert_eq!(region.len(), 8 * MIB);
        // The mapping is found in smaps; how much THP backs it is up to the kernel.
        let huge = region.anon_huge_bytes().expect("mapping listed in smaps");
        assert!(huge <= region.len());
    } else {
        assert_eq!(region.level(), PageLevel::Base);
    }
    write_all_and_check(&region);
}

/// With fewer free hugepages than asked for, reserve falls back below hugetlb.
#[test]
fn falls_back_without_enough_hugepages() {
    let _guard = POOL_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let free = meminfo("HugePages_Free").expect("meminfo");
    // More 2 MiB pages than are free (and far less than a 1 GiB page is worth if none free).
    let bytes = (free + 4) * 2 * MIB;
    let region = Region::reserve(&RegionOptions {
        bytes,
        max_level: PageLevel::Huge2M,
        prefault: false,
    })
    .unwrap();
    assert!(
        region.level() <= PageLevel::Transparent,
        "got {} with {free} free hugepages",
        region.level()
    );
    let expected = if thp_allows_madvise() {
        PageLevel::Transparent
    } else {
        PageLevel::Base
    };
    assert_eq!(region.level(), expected);
}

/// Restores `nr_hugepages` on drop.
struct PoolRestore(String);

impl Drop for PoolRestore {
    fn drop(&mut self) {
        let _ = std::fs::write(NR_HUGEPAGES, &self.0);
    }
}

/// With 2 MiB pages reserved (by this test when running as root) a 2 MiB region is obtained,
/// and `max_level` is respected.
#[test]
fn huge2m_when_pool_reserved() {
    let _guard = POOL_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("skipped: not root, cannot reserve hugepages");
        return;
    }
    let prev = std::fs::read_to_string(NR_HUGEPAGES).expect("read nr_hugepages");
    let prev_n: usize = prev.trim().parse().expect("number");
    let _restore = PoolRestore(prev.clone());
    if std::fs::write(NR_HUGEPAGES, (prev_n + 64).to_string()).is_err() {
        println!("skipped: cannot write {NR_HUGEPAGES}");
        return;
    }
    let free = meminfo("HugePages_Free").unwrap_or(0);
    if free < 16 {
        println!("skipped: kernel granted only {free} free 2 MiB pages");
        return;
    }
    {
        let region = Region::reserve(&RegionOptions {
            bytes: 30 * MIB,
            max_level: PageLevel::Huge1G,
            prefault: true,
        })
        .unwrap();
        assert_eq!(region.level(), PageLevel::Huge2M);
        assert_eq!(region.page_size(), 2 * MIB);
        assert_eq!(region.len(), 30 * MIB);
        assert_eq!(region.page_count(), 15);
        let free_after = meminfo("HugePages_Free").unwrap_or(usize::MAX);
        assert!(free_after + 15 <= free, "15 pages in use after prefault");
        write_all_and_check(&region);

        let capped = Region::reserve(&RegionOptions {
            bytes: 4 * MIB,
            max_level: PageLevel::Transparent,
            prefault: false,
        })
        .unwrap();
        assert!(capped.level() <= PageLevel::Transparent);
    }
}

#[test]
fn error_lists_every_level() {
    let err = RegionError::AllLevelsFailed {
        bytes: 123,
        max_level: PageLevel::Huge2M,
        failures: vec![
            (
                PageLevel::Huge2M,
                LevelFailure::Os(io::Error::from_raw_os_error(12)),
            ),
            (PageLevel::Transparent, LevelFailure::Skipped("disabled")),
        ],
    };
    let text = err.to_string();
    assert!(text.contains("123 bytes"), "{text}");
    assert!(text.contains("2MiB: "), "{text}");
    assert!(text.contains("THP: skipped: disabled"), "{text}");
}
