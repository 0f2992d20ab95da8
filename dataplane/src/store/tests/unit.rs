use std::sync::atomic::AtomicU64;

use super::super::arena::Arena;
use super::super::layout::{hash_key, Header, Layout};
use super::super::*;

pub(super) fn small_cfg() -> StoreConfig {
    StoreConfig {
        memory_bytes: 1 << 20,
        segment_bytes: MIN_SEGMENT_BYTES,
        max_page_level: PageLevel::Base,
        prefault: false,
    }
}

fn entry<'a>(sections: &'a [&'a [u8]], lsn: u64) -> EntryData<'a> {
    EntryData {
        sections,
        negative: false,
        lsn,
    }
}

fn read(r: &StoreReader, table: u32, pk: &[u8], section: usize) -> (Lookup, Vec<u8>) {
    let mut out = Vec::new();
    let l = r.read(table, pk, section, &mut out);
    (l, out)
}

#[test]
fn config_validation() {
    let d = StoreConfig::default();
    assert_eq!(d.memory_bytes, DEFAULT_MEMORY_BYTES);
    assert_eq!(d.segment_bytes, 1 << 20);
    assert_eq!(d.max_page_level, PageLevel::Huge1G);
    assert!(d.prefault);
    d.validate().unwrap();
    small_cfg().validate().unwrap();
    for seg in [3 << 16, 32 << 10, 128 << 20] {
        let cfg = StoreConfig {
            segment_bytes: seg,
            memory_bytes: 1 << 30,
            ..d
        };
        assert!(
            matches!(cfg.validate(), Err(StoreError::Config(_))),
            "{seg}"
        );
    }
    let tiny = StoreConfig {
        memory_bytes: 4 * MIN_SEGMENT_BYTES,
        ..small_cfg()
    };
    assert!(tiny.validate().is_err(), "the index needs room too");
    let huge = StoreConfig {
        memory_bytes: 2 << 40,
        ..d
    };
    assert!(huge.validate().is_err());
}

#[test]
fn layout_fits_budget() {
    for mb in [1usize, 3, 17, 256, 1000] {
        let cfg = StoreConfig {
            memory_bytes: mb << 20,
            ..small_cfg()
        };
        let l = Layout::compute(&cfg).unwrap();
        assert!(l.buckets.is_power_of_two());
        assert!(l.total_words() * 8 <= cfg.memory_bytes);
        assert!(l.index_bytes() <= cfg.memory_bytes / 16);
        assert!(l.index_bytes() * 2 > cfg.memory_bytes / 16);
        assert!(l.segments as usize >= MIN_SEGMENTS);
    }
}

#[test]
fn insert_read_replace_remove() {
    let (mut w, r) = open_heap(&small_cfg()).unwrap();
    assert_eq!(read(&r, 1, b"42", 0).0, Lookup::Miss);
    w.insert(1, b"42", &entry(&[b"$5\r\nhello\r\n", b"D-row"], 7))
        .unwrap();
    assert_eq!(
        read(&r, 1, b"42", 0),
        (Lookup::Hit, b"$5\r\nhello\r\n".to_vec())
    );
    assert_eq!(read(&r, 1, b"42", 1), (Lookup::Hit, b"D-row".to_vec()));
    assert_eq!(read(&r, 1, b"42", 2).0, Lookup::Miss, "missing section");
    assert_eq!(read(&r, 2, b"42", 0).0, Lookup::Miss, "other table");
    assert_eq!(read(&r, 1, b"4", 0).0, Lookup::Miss, "prefix key");
    let m = w.meta(1, b"42").unwrap();
    assert_eq!(
        (m.lsn, m.negative, m.bytes),
        (7, false, 8 * (5 + 1 + 2 + 1))
    );

    w.insert(1, b"42", &entry(&[b"v2"], 9)).unwrap();
    assert_eq!(read(&r, 1, b"42", 0), (Lookup::Hit, b"v2".to_vec()));
    assert_eq!(w.meta(1, b"42").unwrap().lsn, 9);
    let s = w.stats();
    assert_eq!(
        (s.entries, s.inserts, s.used_bytes),
        (1, 2, 8 * (5 + 1 + 1))
    );

    assert!(w.remove(1, b"42"));
    assert!(!w.remove(1, b"42"));
    assert_eq!(read(&r, 1, b"42", 0).0, Lookup::Miss);
    assert_eq!(w.stats().entries, 0);
    assert_eq!(w.stats().used_bytes, 0);
    w.check_invariants();
}

#[test]
fn negative_and_empty_keys() {
    let (mut w, r) = open_heap(&small_cfg()).unwrap();
    let neg = EntryData {
        sections: &[],
        negative: true,
        lsn: 3,
    };
    w.insert(5, b"", &neg).unwrap();
    let mut out = b"keep".to_vec();
    assert_eq!(r.read(5, b"", 0, &mut out), Lookup::Negative);
    assert_eq!(out, b"keep");
    assert_eq!(w.stats().negative_entries, 1);
    w.insert(5, b"", &entry(&[b""], 4)).unwrap();
    assert_eq!(r.read(5, b"", 0, &mut out), Lookup::Hit);
    assert_eq!(out, b"keep", "empty section appends nothing");
    assert_eq!(w.stats().negative_entries, 0);
    w.check_invariants();
}

#[test]
fn read_appends_without_allocating_when_capacity_suffices() {
    let (mut w, r) = open_heap(&small_cfg()).unwrap();
    let value = vec![0xAB; 1000];
    w.insert(1, b"k", &entry(&[&value], 1)).unwrap();
    let mut out = Vec::with_capacity(2000);
    out.extend_from_slice(b"prefix");
    let cap = out.capacity();
    let ptr = out.as_ptr();
    assert_eq!(r.read(1, b"k", 0, &mut out), Lookup::Hit);
    assert_eq!((out.capacity(), out.as_ptr()), (cap, ptr));
    assert_eq!(&out[..6], b"prefix");
    assert_eq!(&out[6..], &value[..]);
}

#[test]
fn insert_errors() {
    let (mut w, _r) = open_heap(&small_cfg()).unwrap();
    let s: &[u8] = b"x";
    let five = [s, s, s, s, s];
    assert_eq!(
        w.insert(1, b"k", &entry(&five, 0)),
        Err(InsertError::TooManySections { given: 5 })
    );
    let big = vec![0u8; MIN_SEGMENT_BYTES];
    assert!(matches!(
        w.insert(1, b"k", &entry(&[&big], 0)),
        Err(InsertError::TooLarge { max, .. }) if max == MIN_SEGMENT_BYTES
    ));
    // The largest entry that fits: header 40 + pk 8 + body.
    let fits = vec![1u8; MIN_SEGMENT_BYTES - 48];
    w.insert(1, b"k", &entry(&[&fits], 0)).unwrap();
    assert_eq!(w.stats().entries, 1);
    w.check_invariants();
}

#[test]
fn remove_table_clear_and_for_each_key() {
    let (mut w, r) = open_heap(&small_cfg()).unwrap();
    for t in 1..=3u32 {
        for k in 0..50u32 {
            w.insert(t, &k.to_be_bytes(), &entry(&[b"row"], u64::from(k)))
                .unwrap();
        }
    }
    w.insert(2, &7u32.to_be_bytes(), &entry(&[b"row2"], 100))
        .unwrap();
    let mut seen = Vec::new();
    w.for_each_key(|t, pk, m| seen.push((t, pk.to_vec(), m.lsn)));
    assert_eq!(seen.len(), 150);
    assert!(seen.contains(&(2, 7u32.to_be_bytes().to_vec(), 100)));
    assert!(!seen.contains(&(2, 7u32.to_be_bytes().to_vec(), 7)));

    assert_eq!(w.remove_table(2), 50);
    assert_eq!(w.remove_table(2), 0);
    assert_eq!(read(&r, 2, &7u32.to_be_bytes(), 0).0, Lookup::Miss);
    assert_eq!(read(&r, 3, &7u32.to_be_bytes(), 0).0, Lookup::Hit);
    assert_eq!(w.stats().entries, 100);
    w.check_invariants();

    w.clear();
    assert_eq!(read(&r, 3, &7u32.to_be_bytes(), 0).0, Lookup::Miss);
    let s = w.stats();
    assert_eq!(
        (s.entries, s.used_bytes, s.segments_free),
        (0, 0, s.segments_total)
    );
    w.check_invariants();
    w.insert(3, b"again", &entry(&[b"v"], 1)).unwrap();
    assert_eq!(read(&r, 3, b"again", 0).0, Lookup::Hit);
}

/// Inserts ~1 KiB entries with increasing keys until `pred` holds; returns the next key.
fn fill_until(w: &mut StoreWriter, mut k: u32, pred: impl Fn(&StoreWriter) -> bool) -> u32 {
    let value = [7u8; 1000];
    while !pred(w) {
        w.insert(1, &k.to_be_bytes(), &entry(&[&value], u64::from(k)))
            .unwrap();
        k += 1;
    }
    k
}

#[test]
fn clock_gives_referenced_segments_a_second_chance() {
    // A large index so bucket overflow cannot interfere.
    let layout = Layout {
        buckets: 1 << 12,
        seg_base: 8 << 12,
        seg_words: 8192,
        segments: 4,
    };
    let (mut w, r) = open_arena(
        Arena::heap(layout.total_words()),
        layout,
        layout.total_words() * 8,
    );
    let seg_of = |w: &StoreWriter, k: u32| w.meta(1, &k.to_be_bytes()).map(|m| m.segment);
    let next = fill_until(&mut w, 0, |w| w.stats().segments_free == 0);
    let first_seg = seg_of(&w, 0).unwrap();
    let second_key = (0..next)
        .find(|k| seg_of(&w, *k) != Some(first_seg))
        .unwrap();
    // Reference segment of key 0 only.
    assert_eq!(read(&r, 1, &0u32.to_be_bytes(), 0).0, Lookup::Hit);
    fill_until(&mut w, next, |w| w.stats().evicted_segments == 1);
    assert_eq!(
        read(&r, 1, &0u32.to_be_bytes(), 0).0,
        Lookup::Hit,
        "second chance"
    );
    assert_eq!(
        read(&r, 1, &second_key.to_be_bytes(), 0).0,
        Lookup::Miss,
        "evicted"
    );
    let s = w.stats();
    assert!(s.evicted_entries >= 60, "{s:?}");
    w.check_invariants();
}

#[test]
fn full_bucket_evicts_its_oldest_entry() {
    let layout = Layout {
        buckets: 4,
        seg_base: 32,
        seg_words: 8192,
        segments: 4,
    };
    let (mut w, r) = open_arena(
        Arena::heap(layout.total_words()),
        layout,
        layout.total_words() * 8,
    );
    let target = layout.bucket_word(hash_key(1, b"0"));
    let keys: Vec<Vec<u8>> = (0u32..)
        .map(|k| k.to_string().into_bytes())
        .filter(|pk| layout.bucket_word(hash_key(1, pk)) == target)
        .take(8)
        .collect();
    for (i, pk) in keys.iter().enumerate() {
        w.insert(1, pk, &entry(&[b"v"], i as u64)).unwrap();
    }
    assert_eq!(read(&r, 1, &keys[0], 0).0, Lookup::Miss, "oldest evicted");
    for pk in &keys[1..] {
        assert_eq!(read(&r, 1, pk, 0).0, Lookup::Hit);
    }
    let s = w.stats();
    assert_eq!((s.entries, s.evicted_entries), (7, 1));
    w.check_invariants();
}

#[test]
fn header_parse_never_trusts_garbage() {
    let layout = Layout {
        buckets: 4,
        seg_base: 32,
        seg_words: 64,
        segments: 4,
    };
    let words: Vec<AtomicU64> = (0..layout.total_words())
        .map(|_| AtomicU64::new(0))
        .collect();
    let mut x = 0x1234_5678_9ABC_DEF1u64;
    for round in 0..20_000 {
        for word in &words {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Mostly small numbers, so that some headers look plausible.
            let v = if round % 2 == 0 {
                x & 0x0000_00FF_0000_00FF
            } else {
                x
            };
            word.store(v, std::sync::atomic::Ordering::Relaxed);
        }
        let w = (x as usize) % (words.len() + 8);
        if let Some(h) = Header::parse(&words, &layout, w) {
            let (_, end) = layout.seg_of(w).unwrap();
            assert!(w + h.total_words <= end);
            for i in 0..h.sections {
                let mut out = Vec::new();
                assert!(super::super::layout::copy_out(
                    &words,
                    w + h.section_word(i),
                    h.section_lens[i],
                    &mut out
                ));
            }
        }
    }
    assert!(
        Header::parse(&words, &layout, 0).is_none(),
        "index words are not entries"
    );
}

#[test]
fn open_on_a_real_region_reports_it() {
    let cfg = StoreConfig {
        memory_bytes: 3 << 20,
        prefault: true,
        ..small_cfg()
    };
    let (mut w, r) = open(&cfg).unwrap();
    let s = r.stats();
    assert_eq!(s.page_level, PageLevel::Base);
    assert_eq!(s.budget_bytes, 3 << 20);
    assert!(s.region_bytes >= s.budget_bytes);
    assert_eq!(s.pages * 4096, s.region_bytes);
    assert_eq!(s.segments_free, s.segments_total);
    w.insert(9, b"a", &entry(&[b"b"], 1)).unwrap();
    let r2 = w.reader();
    assert_eq!(read(&r2, 9, b"a", 0), (Lookup::Hit, b"b".to_vec()));
    fn assert_send_sync<T: Send + Sync + Clone>() {}
    fn assert_send<T: Send>() {}
    assert_send_sync::<StoreReader>();
    assert_send::<StoreWriter>();
}
