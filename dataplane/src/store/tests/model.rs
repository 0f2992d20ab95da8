//! The store against a `HashMap` oracle.
//!
//! Big budget: every read and every `meta` equals the oracle. Small budget (tiny index and 4
//! segments, so bucket overflow and segment eviction happen all the time): eviction may only
//! turn hits into misses, never produce a value the oracle does not hold.

use std::collections::HashMap;

use proptest::prelude::*;

use super::super::arena::Arena;
use super::super::layout::Layout;
use super::super::*;

#[derive(Clone, Debug)]
enum Op {
    Insert {
        table: u32,
        pk: Vec<u8>,
        sections: Vec<Vec<u8>>,
        negative: bool,
        lsn: u64,
    },
    Remove {
        table: u32,
        pk: Vec<u8>,
    },
    RemoveTable {
        table: u32,
    },
    Clear,
    Read {
        table: u32,
        pk: Vec<u8>,
        section: usize,
    },
}

#[derive(Clone, Debug, PartialEq)]
struct Value {
    sections: Vec<Vec<u8>>,
    negative: bool,
    lsn: u64,
}

type Oracle = HashMap<(u32, Vec<u8>), Value>;

fn pk_strategy() -> impl Strategy<Value = Vec<u8>> {
    // Few distinct keys so that replacements and removals hit existing entries.
    // 16 keys per table, of lengths 1..=11 (the length is a function of the key).
    (0u8..16).prop_map(|k| vec![k; 1 + usize::from(k) % 11])
}

fn op_strategy(max_value: usize) -> impl Strategy<Value = Op> {
    let sections = prop::collection::vec(prop::collection::vec(any::<u8>(), 0..max_value), 0..=4);
    prop_oneof![
        6 => (0u32..3, pk_strategy(), sections, prop::bool::weighted(0.15), any::<u64>())
            .prop_map(|(table, pk, sections, negative, lsn)| Op::Insert { table, pk, sections, negative, lsn }),
        2 => (0u32..3, pk_strategy()).prop_map(|(table, pk)| Op::Remove { table, pk }),
        1 => (0u32..3).prop_map(|table| Op::RemoveTable { table }),
        1 => Just(Op::Clear),
        8 => (0u32..3, pk_strategy(), 0usize..5).prop_map(|(table, pk, section)| Op::Read { table, pk, section }),
    ]
}

/// Applies `ops`; with `exact`, the store must behave exactly like the oracle.
fn run(ops: &[Op], w: &mut StoreWriter, r: &StoreReader, exact: bool) -> Result<(), TestCaseError> {
    let mut oracle = Oracle::new();
    let mut out = Vec::new();
    for op in ops {
        match op {
            Op::Insert {
                table,
                pk,
                sections,
                negative,
                lsn,
            } => {
                let refs: Vec<&[u8]> = sections.iter().map(Vec::as_slice).collect();
                w.insert(
                    *table,
                    pk,
                    &EntryData {
                        sections: &refs,
                        negative: *negative,
                        lsn: *lsn,
                    },
                )
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
                let v = Value {
                    sections: sections.clone(),
                    negative: *negative,
                    lsn: *lsn,
                };
                oracle.insert((*table, pk.clone()), v);
            }
            Op::Remove { table, pk } => {
                let was = oracle.remove(&(*table, pk.clone())).is_some();
                let removed = w.remove(*table, pk);
                prop_assert!(!removed || was, "removed a key the oracle lacks");
                if exact {
                    prop_assert_eq!(removed, was);
                }
            }
            Op::RemoveTable { table } => {
                let before = oracle.len();
                oracle.retain(|(t, _), _| t != table);
                let n = w.remove_table(*table);
                prop_assert!(n as usize <= before - oracle.len());
                if exact {
                    prop_assert_eq!(n as usize, before - oracle.len());
                }
            }
            Op::Clear => {
                oracle.clear();
                w.clear();
            }
            Op::Read { table, pk, section } => {
                out.clear();
                out.extend_from_slice(b"pre");
                let got = r.read(*table, pk, *section, &mut out);
                let want = match oracle.get(&(*table, pk.clone())) {
                    None => (Lookup::Miss, None),
                    Some(v) if v.negative => (Lookup::Negative, None),
                    Some(v) => match v.sections.get(*section) {
                        Some(bytes) => (Lookup::Hit, Some(bytes.as_slice())),
                        None => (Lookup::Miss, None),
                    },
                };
                if got == Lookup::Hit {
                    prop_assert_eq!(&out[..3], b"pre");
                    prop_assert_eq!(Some(&out[3..]), want.1, "hit value");
                } else {
                    prop_assert_eq!(out.as_slice(), b"pre", "nothing appended on {:?}", got);
                }
                if exact || got != Lookup::Miss {
                    prop_assert_eq!(got, want.0);
                }
            }
        }
        w.check_invariants();
    }
    check_meta(w, &oracle, exact)
}

/// Every cached key is in the oracle with the same lsn/flag; with `exact`, and vice versa.
fn check_meta(w: &StoreWriter, oracle: &Oracle, exact: bool) -> Result<(), TestCaseError> {
    let mut cached = 0usize;
    let mut bad = None;
    w.for_each_key(|t, pk, m| {
        cached += 1;
        match oracle.get(&(t, pk.to_vec())) {
            Some(v) if v.lsn == m.lsn && v.negative == m.negative => {}
            other => bad = Some(format!("({t}, {pk:?}) {m:?} vs {other:?}")),
        }
    });
    prop_assert!(bad.is_none(), "{:?}", bad);
    prop_assert_eq!(cached as u64, w.stats().entries);
    if exact {
        prop_assert_eq!(cached, oracle.len());
        for ((t, pk), v) in oracle {
            let m = w.meta(*t, pk);
            prop_assert_eq!(m.map(|m| (m.lsn, m.negative)), Some((v.lsn, v.negative)));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn big_budget_equals_oracle(ops in prop::collection::vec(op_strategy(300), 1..200)) {
        let cfg = StoreConfig { memory_bytes: 4 << 20, ..super::unit::small_cfg() };
        let (mut w, r) = open_heap(&cfg).map_err(|e| TestCaseError::fail(e.to_string()))?;
        run(&ops, &mut w, &r, true)?;
        prop_assert_eq!(w.stats().evicted_entries, 0);
    }

    #[test]
    fn small_budget_only_loses_hits(ops in prop::collection::vec(op_strategy(12_000), 1..200)) {
        // 4 buckets (28 slots) and 4 segments of 64 KiB: both eviction paths run constantly.
        let layout = Layout { buckets: 4, seg_base: 32, seg_words: 8192, segments: 4 };
        let (mut w, r) = open_arena(Arena::heap(layout.total_words()), layout, layout.total_words() * 8);
        run(&ops, &mut w, &r, false)?;
    }
}
