//! Concurrency stress: one writer churning, three readers checking that every hit is an exact,
//! untorn value for the key asked; and the budget staying within bounds under churn.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::super::layout::Layout;
use super::super::*;

const TABLES: u32 = 3;
const KEYS: u32 = 3000;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// `[table u32][pk u32][section u8][gen u64][payload ...][checksum u64]`.
fn make_value(table: u32, pk: u32, section: u8, gen: u64, len: usize, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&table.to_le_bytes());
    out.extend_from_slice(&pk.to_le_bytes());
    out.push(section);
    out.extend_from_slice(&gen.to_le_bytes());
    out.extend((0..len).map(|i| (gen as usize).wrapping_add(i * 31) as u8));
    let sum = checksum(out);
    out.extend_from_slice(&sum.to_le_bytes());
}

/// Why `v` is not an intact value of (table, pk, section), if it is not.
fn verify_value(table: u32, pk: u32, section: u8, v: &[u8]) -> Result<(), String> {
    if v.len() < 25 {
        return Err(format!("short value {}", v.len()));
    }
    let (body, sum) = v.split_at(v.len() - 8);
    if checksum(body).to_le_bytes() != sum {
        return Err("checksum".into());
    }
    let want_key = [&table.to_le_bytes()[..], &pk.to_le_bytes()[..], &[section]].concat();
    if body[..9] != want_key[..] {
        return Err(format!("value of another key: {:?}", &body[..9]));
    }
    let gen = u64::from_le_bytes(body[9..17].try_into().map_err(|_| "gen")?);
    let payload = &body[17..];
    if payload
        .iter()
        .enumerate()
        .any(|(i, b)| *b != (gen as usize).wrapping_add(i * 31) as u8)
    {
        return Err("payload".into());
    }
    Ok(())
}

fn stress_cfg() -> StoreConfig {
    StoreConfig {
        memory_bytes: 2 << 20,
        segment_bytes: MIN_SEGMENT_BYTES,
        max_page_level: PageLevel::Transparent,
        prefault: true,
    }
}

/// One churn step: insert/replace (mostly), remove, negative, rarely remove_table or clear.
fn churn_step(w: &mut StoreWriter, rng: &mut Rng, gen: u64, a: &mut Vec<u8>, b: &mut Vec<u8>) {
    let table = rng.below(u64::from(TABLES)) as u32;
    let pk = rng.below(u64::from(KEYS)) as u32;
    let key = pk.to_le_bytes();
    match rng.below(1000) {
        0..=699 => {
            make_value(table, pk, 0, gen, rng.below(1500) as usize, a);
            make_value(table, pk, 1, gen, rng.below(300) as usize, b);
            let e = EntryData {
                sections: &[a, b],
                negative: false,
                lsn: gen,
            };
            w.insert(table, &key, &e).expect("fits a segment");
        }
        700..=899 => {
            w.remove(table, &key);
        }
        900..=997 => {
            let e = EntryData {
                sections: &[],
                negative: true,
                lsn: gen,
            };
            w.insert(table, &key, &e).expect("fits");
        }
        998 => {
            if rng.below(10) == 0 {
                w.remove_table(table);
            }
        }
        _ => {
            if rng.below(20) == 0 {
                w.clear();
            }
        }
    }
}

#[test]
fn readers_never_see_torn_or_foreign_values() {
    let (mut w, r) = open(&stress_cfg()).expect("open");
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..3u64)
        .map(|id| {
            let (r, stop) = (r.clone(), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut rng = Rng(0x9E37_79B9 + id * 7919);
                let mut out = Vec::with_capacity(4096);
                let (mut hits, mut negatives, mut reads) = (0u64, 0u64, 0u64);
                while !stop.load(Ordering::Relaxed) {
                    let table = rng.below(u64::from(TABLES)) as u32;
                    let pk = rng.below(u64::from(KEYS)) as u32;
                    let section = rng.below(2) as usize;
                    out.clear();
                    out.extend_from_slice(b"xy");
                    reads += 1;
                    match r.read(table, &pk.to_le_bytes(), section, &mut out) {
                        Lookup::Hit => {
                            hits += 1;
                            assert_eq!(&out[..2], b"xy");
                            if let Err(why) = verify_value(table, pk, section as u8, &out[2..]) {
                                panic!(
                                    "reader {id}: bad hit for ({table}, {pk}, {section}): {why}"
                                );
                            }
                        }
                        other => {
                            negatives += u64::from(other == Lookup::Negative);
                            assert_eq!(out, b"xy", "nothing appended on {other:?}");
                        }
                    }
                }
                (reads, hits, negatives)
            })
        })
        .collect();

    let mut rng = Rng(0xDEAD_BEEF);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut gen = 0u64;
    while Instant::now() < deadline {
        for _ in 0..256 {
            gen += 1;
            churn_step(&mut w, &mut rng, gen, &mut a, &mut b);
        }
    }
    stop.store(true, Ordering::Relaxed);
    let mut totals = (0, 0, 0);
    for h in readers {
        let (reads, hits, negatives) = h.join().expect("reader panicked");
        totals = (totals.0 + reads, totals.1 + hits, totals.2 + negatives);
    }
    let s = w.stats();
    println!("writer ops {gen}, reads/hits/negatives {totals:?}, stats {s:?}");
    assert!(
        totals.1 > 1000 && totals.2 > 100,
        "readers must see hits: {totals:?}"
    );
    assert!(s.evicted_segments > 10, "churn must reuse segments: {s:?}");
    w.check_invariants();
}

#[test]
fn budget_is_never_exceeded_under_churn() {
    let cfg = stress_cfg();
    let layout = Layout::compute(&cfg).expect("valid");
    let (mut w, r) = open(&cfg).expect("open");
    let index = layout.index_bytes() as u64;
    let seg_cap = (cfg.memory_bytes / cfg.segment_bytes) as u32;
    let mut rng = Rng(42);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    let mut max_used = 0;
    for gen in 1..=60_000u64 {
        churn_step(&mut w, &mut rng, gen, &mut a, &mut b);
        let s = r.stats();
        assert!(s.used_bytes + index <= s.budget_bytes, "{s:?}");
        assert!(
            s.segments_total <= seg_cap && s.segments_free <= s.segments_total,
            "{s:?}"
        );
        assert!(s.used_bytes <= u64::from(s.segments_total) * cfg.segment_bytes as u64);
        assert!(s.region_bytes >= s.budget_bytes && s.budget_bytes == cfg.memory_bytes as u64);
        assert!(s.negative_entries <= s.entries);
        max_used = max_used.max(s.used_bytes);
        if gen % 5000 == 0 {
            w.check_invariants();
        }
    }
    let s = r.stats();
    assert!(s.evicted_segments > 0 && s.evicted_entries > 0, "{s:?}");
    assert!(
        max_used > s.budget_bytes / 2,
        "the store filled up: {max_used}"
    );
}
