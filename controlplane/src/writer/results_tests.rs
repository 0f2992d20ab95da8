use std::sync::Arc;

use crate::result_plane::ResultPlane;
use bytes::Bytes;
use pgline_dataplane::plane::ResultKey;
use pgline_dataplane::store::{self, StoreConfig};
use pgline_hugepages::PageLevel;

use super::*;

fn store() -> StoreWriter {
    let cfg = StoreConfig {
        memory_bytes: 8 << 20,
        segment_bytes: 256 << 10,
        max_page_level: PageLevel::Base,
        prefault: false,
    };
    store::open(&cfg).expect("store").0
}

/// A fill of a result reading table 7 (with `eq`: `tenant (column 1) = eq`) and table 8.
fn fill(plane: &Arc<ResultPlane>, hash: u64, eq: Option<&str>, snapshot: &str) -> ResultFill {
    let key = ResultKey {
        hash,
        key: format!("q{hash}").into_bytes().into(),
        tables: vec![7, 8].into(),
        equalities: eq
            .map(|v| vec![(7u32, 1u16, v.as_bytes().into())])
            .unwrap_or_default()
            .into(),
    };
    ResultFill {
        lease: plane.lease(&key.tables),
        key: Box::new(key),
        bytes: b"T...".to_vec(),
        snapshot: snapshot.into(),
    }
}

fn text(s: &str) -> TupleValue {
    TupleValue::Text(Bytes::copy_from_slice(s.as_bytes()))
}

fn row(id: &str, tenant: &str) -> Vec<TupleValue> {
    vec![text(id), text(tenant)]
}

fn cached(store: &StoreWriter, hash: u64) -> bool {
    store.meta(RESULTS_TABLE, &hash.to_be_bytes()).is_some()
}

#[test]
fn a_change_after_the_lease_or_an_invisible_one_refuses_the_answer() {
    let (mut st, plane) = (store(), Arc::new(ResultPlane::default()));
    let mut r = Results::default();
    let f = fill(&plane, 1, None, "100:100:");
    let insert = Change::Insert {
        rel: 7,
        new: row("1", "1"),
    };
    r.row_changed(&mut st, &plane, &insert, None, 150);
    assert!(!r.install(&mut st, &plane, f, 0), "changed since the lease");
    // Applied before the lease, but not visible to the snapshot (xid 150 >= xmax 100).
    let f = fill(&plane, 2, None, "100:100:");
    assert!(!r.install(&mut st, &plane, f, 0));
    let f = fill(&plane, 3, None, "100:160:150");
    assert!(!r.install(&mut st, &plane, f, 0), "150 still in progress");
    let f = fill(&plane, 4, None, "151:151:");
    assert!(r.install(&mut st, &plane, f, 0));
    assert!(cached(&st, 4));
    // Any change of table 8 (no equality) drops it.
    let delete = Change::Delete {
        rel: 8,
        old_key: row("5", "9"),
    };
    r.row_changed(&mut st, &plane, &delete, None, 152);
    assert!(!cached(&st, 4));
    assert_eq!(r.counts.installed, 1);
    assert_eq!(r.counts.refused, 3);
}

#[test]
fn equalities_spare_other_values_unless_the_old_value_is_unknown() {
    let (mut st, plane) = (store(), Arc::new(ResultPlane::default()));
    let mut r = Results::default();
    let full = Change::Relation(crate::wal::Relation {
        id: 7,
        namespace: "public".into(),
        name: "t".into(),
        replica_identity: b'f',
        columns: Vec::new(),
    });
    r.row_changed(&mut st, &plane, &full, None, 0);
    assert!(r.install(&mut st, &plane, fill(&plane, 1, Some("2"), "10:10:"), 0));
    assert!(r.install(&mut st, &plane, fill(&plane, 2, Some("1"), "10:10:"), 0));
    let update = Change::Update {
        rel: 7,
        old_key: Some(row("3", "1")),
        new: row("3", "1"),
    };
    r.row_changed(&mut st, &plane, &update, None, 0);
    assert!(cached(&st, 1), "tenant 2 spared");
    assert!(!cached(&st, 2), "tenant 1 dropped");
    // Default identity: an update of a non-key column has no old value: all of (7, 1) goes.
    r.identity.insert(7, b'd');
    assert!(r.install(&mut st, &plane, fill(&plane, 2, Some("1"), "10:10:"), 0));
    let update = Change::Update {
        rel: 7,
        old_key: None,
        new: row("3", "1"),
    };
    r.row_changed(&mut st, &plane, &update, None, 0);
    assert!(!cached(&st, 1) && !cached(&st, 2));
    // An insert carries the new value: only that value goes.
    assert!(r.install(&mut st, &plane, fill(&plane, 1, Some("2"), "10:10:"), 0));
    assert!(r.install(&mut st, &plane, fill(&plane, 2, Some("1"), "10:10:"), 0));
    let insert = Change::Insert {
        rel: 7,
        new: row("4", "2"),
    };
    r.row_changed(&mut st, &plane, &insert, None, 0);
    assert!(!cached(&st, 1) && cached(&st, 2));
    // A truncate (or relation change) drops everything reading the table.
    r.table_changed(&mut st, &plane, 7, 0);
    assert!(!cached(&st, 2));
}

#[test]
fn applied_xids_are_pruned_once_older_leases_ended() {
    let (mut st, plane) = (store(), Arc::new(ResultPlane::default()));
    let mut r = Results::default();
    let old = plane.lease(&[7]);
    let insert = Change::Insert {
        rel: 7,
        new: row("1", "1"),
    };
    r.row_changed(&mut st, &plane, &insert, None, 50);
    assert!(r.install(&mut st, &plane, fill(&plane, 1, None, "60:60:"), 0));
    r.prune(&plane);
    assert_eq!(
        r.xids.get(&7).map(Vec::len),
        Some(1),
        "an older lease is out"
    );
    drop(old);
    r.prune(&plane);
    assert!(!r.xids.contains_key(&7));
    // Overflow collapses into a watermark: still sound.
    for x in 0..=MAX_XIDS as u32 {
        r.row_changed(&mut st, &plane, &insert, None, 1000 + x);
    }
    assert!(r.xids.get(&7).is_none_or(Vec::is_empty));
    let last = 1000 + MAX_XIDS as u32;
    let f = fill(&plane, 2, None, &format!("{last}:{}:", last + 1));
    assert!(
        !r.install(&mut st, &plane, f, 0),
        "the watermark is not complete yet"
    );
    let f = fill(&plane, 3, None, &format!("{}:{}:", last + 1, last + 1));
    assert!(r.install(&mut st, &plane, f, 0));
}
