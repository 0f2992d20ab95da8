//! Buffering of open transactions: streamed blocks, subtransaction aborts, the memory bound.

use bytes::Bytes;

use super::*;
use crate::wal::RelColumn;

fn ins(rel: u32, v: &str) -> Change {
    Change::Insert {
        rel,
        new: vec![TupleValue::Text(Bytes::copy_from_slice(v.as_bytes()))],
    }
}

fn relation(id: u32) -> Change {
    Change::Relation(Relation {
        id,
        namespace: "public".into(),
        name: format!("t{id}"),
        replica_identity: b'd',
        columns: vec![RelColumn {
            is_key: true,
            name: "k".into(),
            type_oid: 23,
            type_modifier: -1,
        }],
    })
}

fn values(txn: &WalTxn) -> Vec<String> {
    txn.changes
        .iter()
        .filter_map(|c| match c {
            Change::Insert { new, .. } => match &new[0] {
                TupleValue::Text(t) => Some(String::from_utf8_lossy(t).into_owned()),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

const BIG: usize = 1 << 30;

#[test]
fn begin_commit_round_trip() {
    let mut b = TxnBuffers::new(BIG);
    assert!(!b.in_txn());
    assert_eq!(b.begin(10).unwrap(), None);
    assert!(b.in_txn());
    b.push(None, relation(1), 40).unwrap();
    b.push(None, ins(1, "a"), 20).unwrap();
    assert!(b.bytes() >= 60);
    let t = b.commit(100, 120, 7).unwrap();
    assert_eq!(
        (t.xid, t.commit_lsn, t.end_lsn, t.commit_ts_us),
        (10, 100, 120, 7)
    );
    assert_eq!(t.changes.len(), 2);
    assert_eq!(b.bytes(), 0);
    assert!(matches!(b.commit(1, 2, 3), Err(WalError::Protocol(_))));
    // A Begin over an open transaction drops it and its bytes.
    b.begin(11).unwrap();
    b.push(None, ins(1, "x"), 20).unwrap();
    assert_eq!(b.begin(12).unwrap(), Some(11));
    assert_eq!(b.bytes(), 0);
}

#[test]
fn interleaved_streams_commit_separately() {
    let mut b = TxnBuffers::new(BIG);
    b.stream_start(501, true).unwrap();
    assert!(b.in_block());
    b.push(Some(501), relation(1), 40).unwrap();
    b.push(Some(501), ins(1, "a1"), 20).unwrap();
    b.stream_stop().unwrap();
    b.stream_start(502, true).unwrap();
    b.push(Some(502), ins(1, "b1"), 20).unwrap();
    b.stream_stop().unwrap();
    // A Begin…Commit transaction between blocks.
    b.begin(503).unwrap();
    b.push(None, ins(1, "c1"), 20).unwrap();
    assert_eq!(values(&b.commit(1, 2, 0).unwrap()), ["c1"]);
    b.stream_start(501, false).unwrap();
    b.push(Some(501), ins(1, "a2"), 20).unwrap();
    b.stream_stop().unwrap();
    let t = b.stream_commit(502, 10, 20, 5).unwrap();
    assert_eq!(values(&t), ["b1"]);
    assert_eq!((t.xid, t.end_lsn), (502, 20));
    let t = b.stream_commit(501, 30, 40, 6).unwrap();
    assert_eq!(values(&t), ["a1", "a2"]);
    assert!(
        matches!(t.changes[0], Change::Relation(_)),
        "the Relation stays in its txn"
    );
    assert_eq!(b.bytes(), 0);
}

#[test]
fn stream_protocol_errors() {
    let mut b = TxnBuffers::new(BIG);
    assert!(
        b.stream_start(7, false).is_err(),
        "continuation of an unknown xid"
    );
    assert!(b.stream_stop().is_err());
    assert!(b.stream_commit(7, 1, 2, 0).is_err());
    assert!(
        b.push(None, ins(1, "a"), 10).is_err(),
        "row outside a transaction"
    );
    b.stream_start(7, true).unwrap();
    assert!(b.stream_start(8, true).is_err(), "nested block");
    assert!(b.begin(9).is_err(), "Begin inside a block");
    b.stream_stop().unwrap();
    b.begin(9).unwrap();
    assert!(
        b.stream_start(8, true).is_err(),
        "block inside Begin…Commit"
    );
    // An unknown abort is ignored.
    b.stream_abort(99, 99);
    b.stream_abort(99, 100);
}

#[test]
fn subxact_abort_cuts_at_its_first_change() {
    let mut b = TxnBuffers::new(BIG);
    b.stream_start(1, true).unwrap();
    b.push(Some(1), ins(1, "top1"), 20).unwrap();
    b.push(Some(2), ins(1, "s2a"), 20).unwrap(); // SAVEPOINT a
    b.push(Some(3), ins(1, "s3"), 20).unwrap(); // SAVEPOINT b (nested)
    b.push(Some(2), ins(1, "s2b"), 20).unwrap(); // RELEASE b, back in a
    b.stream_stop().unwrap();
    let with_all = b.bytes();
    b.stream_abort(1, 3);
    b.stream_start(1, false).unwrap();
    b.push(Some(4), ins(1, "s4"), 20).unwrap(); // SAVEPOINT c
    b.push(Some(1), ins(1, "top2"), 20).unwrap();
    b.stream_stop().unwrap();
    // ROLLBACK TO a: a and everything after it.
    b.stream_abort(1, 2);
    assert!(b.bytes() < with_all);
    b.stream_start(1, false).unwrap();
    b.push(Some(1), ins(1, "top3"), 20).unwrap();
    b.stream_stop().unwrap();
    let t = b.stream_commit(1, 1, 2, 0).unwrap();
    assert_eq!(values(&t), ["top1", "top3"]);
    assert_eq!(b.bytes(), 0);
}

#[test]
fn subxact_abort_drops_only_its_own_rows() {
    let mut b = TxnBuffers::new(BIG);
    b.stream_start(1, true).unwrap();
    b.push(Some(1), ins(1, "top1"), 20).unwrap();
    b.push(Some(2), ins(1, "kept"), 20).unwrap(); // a released savepoint
    b.push(Some(3), ins(1, "gone"), 20).unwrap();
    b.stream_stop().unwrap();
    b.stream_abort(1, 3);
    b.stream_start(1, false).unwrap();
    b.push(Some(1), ins(1, "top2"), 20).unwrap();
    b.stream_stop().unwrap();
    let t = b.stream_commit(1, 1, 2, 0).unwrap();
    assert_eq!(values(&t), ["top1", "kept", "top2"]);
}

#[test]
fn top_level_abort_drops_everything() {
    let mut b = TxnBuffers::new(BIG);
    b.stream_start(1, true).unwrap();
    b.push(Some(1), ins(1, "a"), 20).unwrap();
    b.stream_stop().unwrap();
    b.stream_start(2, true).unwrap();
    b.push(Some(2), ins(1, "b"), 20).unwrap();
    b.stream_stop().unwrap();
    b.stream_abort(1, 1);
    assert!(b.stream_commit(1, 1, 2, 0).is_err());
    assert_eq!(values(&b.stream_commit(2, 3, 4, 0).unwrap()), ["b"]);
    assert_eq!(b.bytes(), 0);
}

#[test]
fn first_segment_again_restarts_the_transaction() {
    let mut b = TxnBuffers::new(BIG);
    b.stream_start(1, true).unwrap();
    b.push(Some(1), ins(1, "old"), 20).unwrap();
    b.stream_stop().unwrap();
    b.stream_start(1, true).unwrap();
    b.push(Some(1), ins(1, "new"), 20).unwrap();
    b.stream_stop().unwrap();
    assert_eq!(values(&b.stream_commit(1, 1, 2, 0).unwrap()), ["new"]);
    assert_eq!(b.bytes(), 0);
}

#[test]
fn the_largest_transaction_overflows_into_an_invalidation() {
    let limit = 10_000;
    let mut b = TxnBuffers::new(limit);
    // A small streamed transaction, then a big one on two tables with a Relation and a
    // subtransaction, and a small Begin…Commit one while it is open.
    b.stream_start(1, true).unwrap();
    b.push(Some(1), ins(5, "small"), 20).unwrap();
    b.stream_stop().unwrap();
    b.stream_start(2, true).unwrap();
    b.push(Some(2), relation(7), 40).unwrap();
    let mut overflows = Vec::new();
    for i in 0..1000 {
        let rel = if i % 2 == 0 { 7 } else { 8 };
        overflows.extend(b.push(Some(2 + (i % 3)), ins(rel, "row"), 30).unwrap());
        assert!(b.bytes() <= limit, "bound kept: {} > {limit}", b.bytes());
    }
    b.push(Some(2), Change::Truncate { rels: vec![9] }, 20)
        .unwrap();
    b.stream_abort(2, 3); // nothing to cut any more: the tables are flushed anyway
    b.stream_stop().unwrap();
    assert_eq!(overflows.len(), 1, "{overflows:?}");
    assert_eq!(overflows[0].xid, 2);
    assert!(overflows[0].bytes > limit / 2);
    b.begin(3).unwrap();
    b.push(None, ins(5, "tiny"), 20).unwrap();
    assert_eq!(values(&b.commit(1, 2, 0).unwrap()), ["tiny"]);
    let t = b.stream_commit(2, 10, 20, 0).unwrap();
    assert!(matches!(&t.changes[0], Change::Relation(r) if r.id == 7));
    assert_eq!(
        t.changes[1..],
        [Change::Invalidate {
            rels: vec![7, 8, 9]
        }]
    );
    // The small one kept its rows.
    assert_eq!(values(&b.stream_commit(1, 30, 40, 0).unwrap()), ["small"]);
    assert_eq!(b.bytes(), 0);
}

#[test]
fn a_begin_commit_transaction_overflows_too() {
    let mut b = TxnBuffers::new(5_000);
    b.begin(1).unwrap();
    let mut n = 0;
    for _ in 0..500 {
        n += b.push(None, ins(4, "r"), 30).unwrap().len();
        assert!(b.bytes() <= 5_000);
    }
    assert_eq!(n, 1);
    let t = b.commit(1, 2, 0).unwrap();
    assert_eq!(t.changes, [Change::Invalidate { rels: vec![4] }]);
    assert_eq!(b.bytes(), 0);
}
