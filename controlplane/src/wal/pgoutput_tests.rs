//! Byte-literal fixtures for the pgoutput decoder, plus a no-panic property test.

use super::*;
use proptest::prelude::*;

fn b(v: &[u8]) -> Bytes {
    Bytes::copy_from_slice(v)
}

fn text(s: &str) -> TupleValue {
    TupleValue::Text(Bytes::copy_from_slice(s.as_bytes()))
}

#[test]
fn begin() {
    let mut v = vec![b'B'];
    v.extend_from_slice(&0x0000_0001_0000_0010u64.to_be_bytes());
    v.extend_from_slice(&123_456i64.to_be_bytes());
    v.extend_from_slice(&777u32.to_be_bytes());
    assert_eq!(
        parse_message(&b(&v)),
        Ok(Message::Begin {
            final_lsn: 0x1_0000_0010,
            commit_ts: 123_456,
            xid: 777
        })
    );
    // Every strict prefix is truncated.
    for n in 1..v.len() {
        assert_eq!(
            parse_message(&b(&v[..n])),
            Err(DecodeError::Truncated),
            "{n}"
        );
    }
    v.push(0);
    assert_eq!(parse_message(&b(&v)), Err(DecodeError::TrailingBytes));
}

#[test]
fn commit() {
    let mut v = vec![b'C', 0];
    v.extend_from_slice(&10u64.to_be_bytes());
    v.extend_from_slice(&20u64.to_be_bytes());
    v.extend_from_slice(&(-5i64).to_be_bytes());
    assert_eq!(
        parse_message(&b(&v)),
        Ok(Message::Commit {
            flags: 0,
            commit_lsn: 10,
            end_lsn: 20,
            commit_ts: -5
        })
    );
}

#[test]
fn relation() {
    let mut v = vec![b'R'];
    v.extend_from_slice(&16384u32.to_be_bytes());
    v.extend_from_slice(b"public\0users\0d");
    v.extend_from_slice(&2i16.to_be_bytes());
    v.extend_from_slice(b"\x01id\0");
    v.extend_from_slice(&23u32.to_be_bytes());
    v.extend_from_slice(&(-1i32).to_be_bytes());
    v.extend_from_slice(b"\x00name\0");
    v.extend_from_slice(&1043u32.to_be_bytes());
    v.extend_from_slice(&68i32.to_be_bytes());
    let Ok(Message::Relation(rel)) = parse_message(&b(&v)) else {
        panic!("not a relation");
    };
    assert_eq!(rel.id, 16384);
    assert_eq!(rel.namespace, "public");
    assert_eq!(rel.name, "users");
    assert_eq!(rel.replica_identity, b'd');
    assert_eq!(
        rel.columns,
        vec![
            RelColumn {
                is_key: true,
                name: "id".into(),
                type_oid: 23,
                type_modifier: -1
            },
            RelColumn {
                is_key: false,
                name: "name".into(),
                type_oid: 1043,
                type_modifier: 68
            },
        ]
    );
    // A column count larger than the data is truncated, not a huge allocation.
    let mut bad = vec![b'R'];
    bad.extend_from_slice(&1u32.to_be_bytes());
    bad.extend_from_slice(b"\0t\0d\x7f\xff");
    assert_eq!(parse_message(&b(&bad)), Err(DecodeError::Truncated));
}

fn tuple_bytes() -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&3i16.to_be_bytes());
    v.extend_from_slice(b"t\0\0\0\x0242");
    v.push(b'n');
    v.push(b'u');
    v
}

#[test]
fn insert_is_zero_copy() {
    let mut v = vec![b'I'];
    v.extend_from_slice(&7u32.to_be_bytes());
    v.push(b'N');
    v.extend_from_slice(&tuple_bytes());
    let input = b(&v);
    let Ok(Message::Insert { rel, new }) = parse_message(&input) else {
        panic!("not an insert");
    };
    assert_eq!(rel, 7);
    assert_eq!(
        new,
        vec![text("42"), TupleValue::Null, TupleValue::UnchangedToast]
    );
    let TupleValue::Text(t) = &new[0] else {
        panic!()
    };
    // The slice points into the input buffer.
    let base = input.as_ptr() as usize;
    let p = t.as_ptr() as usize;
    assert!(p >= base && p < base + input.len());
}

#[test]
fn update_variants() {
    let mut plain = vec![b'U'];
    plain.extend_from_slice(&7u32.to_be_bytes());
    plain.push(b'N');
    plain.extend_from_slice(&tuple_bytes());
    assert!(matches!(
        parse_message(&b(&plain)),
        Ok(Message::Update {
            rel: 7,
            old: None,
            ..
        })
    ));

    for (marker, is_key) in [(b'K', true), (b'O', false)] {
        let mut v = vec![b'U'];
        v.extend_from_slice(&7u32.to_be_bytes());
        v.push(marker);
        v.extend_from_slice(&1i16.to_be_bytes());
        v.extend_from_slice(b"t\0\0\0\x011");
        v.push(b'N');
        v.extend_from_slice(&tuple_bytes());
        let Ok(Message::Update { old: Some(old), .. }) = parse_message(&b(&v)) else {
            panic!("no old tuple");
        };
        assert_eq!(matches!(old, OldTuple::Key(_)), is_key);
        assert_eq!(old.into_values(), vec![text("1")]);
    }

    // An old tuple must be followed by 'N'.
    let mut bad = vec![b'U'];
    bad.extend_from_slice(&7u32.to_be_bytes());
    bad.push(b'K');
    bad.extend_from_slice(&0i16.to_be_bytes());
    bad.push(b'X');
    assert_eq!(
        parse_message(&b(&bad)),
        Err(DecodeError::UnexpectedTupleMarker(b'X'))
    );
}

#[test]
fn delete_and_truncate() {
    let mut v = vec![b'D'];
    v.extend_from_slice(&9u32.to_be_bytes());
    v.push(b'K');
    v.extend_from_slice(&1i16.to_be_bytes());
    v.extend_from_slice(b"t\0\0\0\x015");
    assert_eq!(
        parse_message(&b(&v)),
        Ok(Message::Delete {
            rel: 9,
            old: OldTuple::Key(vec![text("5")])
        })
    );

    let mut t = vec![b'T'];
    t.extend_from_slice(&2i32.to_be_bytes());
    t.push(1);
    t.extend_from_slice(&1u32.to_be_bytes());
    t.extend_from_slice(&2u32.to_be_bytes());
    assert_eq!(
        parse_message(&b(&t)),
        Ok(Message::Truncate {
            options: 1,
            rels: vec![1, 2]
        })
    );

    let mut neg = vec![b'T'];
    neg.extend_from_slice(&(-1i32).to_be_bytes());
    neg.push(0);
    assert_eq!(parse_message(&b(&neg)), Err(DecodeError::NegativeLength));
}

#[test]
fn origin_type_message() {
    let mut o = vec![b'O'];
    o.extend_from_slice(&5u64.to_be_bytes());
    o.extend_from_slice(b"node1\0");
    assert_eq!(
        parse_message(&b(&o)),
        Ok(Message::Origin {
            commit_lsn: 5,
            name: "node1".into()
        })
    );

    let mut y = vec![b'Y'];
    y.extend_from_slice(&600u32.to_be_bytes());
    y.extend_from_slice(b"public\0mood\0");
    assert!(matches!(
        parse_message(&b(&y)),
        Ok(Message::Type { id: 600, .. })
    ));

    let mut m = vec![b'M', 1];
    m.extend_from_slice(&8u64.to_be_bytes());
    m.extend_from_slice(b"pfx\0");
    m.extend_from_slice(&3i32.to_be_bytes());
    m.extend_from_slice(b"abc");
    assert_eq!(
        parse_message(&b(&m)),
        Ok(Message::Message {
            transactional: true,
            lsn: 8,
            prefix: "pfx".into(),
            content: b(b"abc")
        })
    );
}

#[test]
fn malformed() {
    assert_eq!(parse_message(&b(b"")), Err(DecodeError::Empty));
    assert_eq!(
        parse_message(&b(b"Z")),
        Err(DecodeError::UnknownMessage(b'Z'))
    );
    // Binary column kind is not protocol 1.
    let mut v = vec![b'I'];
    v.extend_from_slice(&7u32.to_be_bytes());
    v.push(b'N');
    v.extend_from_slice(&1i16.to_be_bytes());
    v.push(b'b');
    assert_eq!(
        parse_message(&b(&v)),
        Err(DecodeError::UnknownColumnKind(b'b'))
    );
    // A text length past the end.
    let mut v = vec![b'I'];
    v.extend_from_slice(&7u32.to_be_bytes());
    v.push(b'N');
    v.extend_from_slice(&1i16.to_be_bytes());
    v.extend_from_slice(b"t\x7f\xff\xff\xffab");
    assert_eq!(parse_message(&b(&v)), Err(DecodeError::Truncated));
    // Bad UTF-8 in a name.
    let mut o = vec![b'O'];
    o.extend_from_slice(&5u64.to_be_bytes());
    o.extend_from_slice(b"\xff\0");
    assert_eq!(parse_message(&b(&o)), Err(DecodeError::InvalidUtf8));
}

proptest! {
    #[test]
    fn random_bytes_never_panic(v in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = parse_message(&Bytes::from(v));
    }

    #[test]
    fn random_tail_after_valid_tag_never_panics(
        tag in prop::sample::select(b"BCORYIUDTM".to_vec()),
        v in proptest::collection::vec(any::<u8>(), 0..128),
    ) {
        let mut all = vec![tag];
        all.extend_from_slice(&v);
        let _ = parse_message(&Bytes::from(all));
    }
}
