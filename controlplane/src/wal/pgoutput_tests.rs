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

#[test]
fn stream_start_stop() {
    let mut v = vec![b'S'];
    v.extend_from_slice(&901u32.to_be_bytes());
    v.push(1);
    assert_eq!(
        parse_message_in(&b(&v), false),
        Ok((
            None,
            Message::StreamStart {
                xid: 901,
                first_segment: true
            }
        ))
    );
    v[5] = 0;
    assert_eq!(
        parse_message(&b(&v)),
        Ok(Message::StreamStart {
            xid: 901,
            first_segment: false
        })
    );
    for n in 1..v.len() {
        assert_eq!(parse_message(&b(&v[..n])), Err(DecodeError::Truncated));
    }
    // Stream Start cannot nest.
    assert_eq!(
        parse_message_in(&b(&v), true),
        Err(DecodeError::UnknownMessage(b'S'))
    );
    // Stream Stop is one byte, in a block or not.
    assert_eq!(
        parse_message_in(&b(b"E"), true),
        Ok((None, Message::StreamStop))
    );
    assert_eq!(parse_message(&b(b"E\0")), Err(DecodeError::TrailingBytes));
}

#[test]
fn stream_commit() {
    let mut v = vec![b'c'];
    v.extend_from_slice(&901u32.to_be_bytes());
    v.push(0);
    v.extend_from_slice(&0x10u64.to_be_bytes());
    v.extend_from_slice(&0x28u64.to_be_bytes());
    v.extend_from_slice(&777i64.to_be_bytes());
    assert_eq!(
        parse_message(&b(&v)),
        Ok(Message::StreamCommit {
            xid: 901,
            flags: 0,
            commit_lsn: 0x10,
            end_lsn: 0x28,
            commit_ts: 777
        })
    );
    for n in 1..v.len() {
        assert_eq!(parse_message(&b(&v[..n])), Err(DecodeError::Truncated));
    }
    assert_eq!(
        parse_message_in(&b(&v), true),
        Err(DecodeError::UnknownMessage(b'c'))
    );
}

#[test]
fn stream_abort_with_and_without_parallel_tail() {
    // Top-level abort, as sent without `streaming 'parallel'`: no LSN/time tail.
    let mut v = vec![b'A'];
    v.extend_from_slice(&901u32.to_be_bytes());
    v.extend_from_slice(&901u32.to_be_bytes());
    assert_eq!(
        parse_message(&b(&v)),
        Ok(Message::StreamAbort {
            xid: 901,
            subxid: 901,
            lsn_ts: None
        })
    );
    // A subtransaction's abort.
    let mut sub = vec![b'A'];
    sub.extend_from_slice(&901u32.to_be_bytes());
    sub.extend_from_slice(&905u32.to_be_bytes());
    assert!(matches!(
        parse_message(&b(&sub)),
        Ok(Message::StreamAbort {
            xid: 901,
            subxid: 905,
            lsn_ts: None
        })
    ));
    // With the parallel tail (protocol 4, `streaming 'parallel'`).
    let mut par = sub.clone();
    par.extend_from_slice(&0x99u64.to_be_bytes());
    par.extend_from_slice(&5i64.to_be_bytes());
    assert_eq!(
        parse_message(&b(&par)),
        Ok(Message::StreamAbort {
            xid: 901,
            subxid: 905,
            lsn_ts: Some((0x99, 5))
        })
    );
    // A partial tail is truncated, not silently ignored.
    assert_eq!(
        parse_message(&b(&par[..par.len() - 3])),
        Err(DecodeError::Truncated)
    );
    assert_eq!(parse_message(&b(&v[..6])), Err(DecodeError::Truncated));
}

/// Prefixes `body` (a protocol-1 message) with the in-stream xid after its type byte.
fn in_stream(body: &[u8], xid: u32) -> Bytes {
    let mut v = vec![body[0]];
    v.extend_from_slice(&xid.to_be_bytes());
    v.extend_from_slice(&body[1..]);
    b(&v)
}

#[test]
fn data_messages_inside_a_stream_carry_the_subxact_xid() {
    // Insert of a subtransaction (xid 905 under top-level 901).
    let mut ins = vec![b'I'];
    ins.extend_from_slice(&7u32.to_be_bytes());
    ins.push(b'N');
    ins.extend_from_slice(&tuple_bytes());
    let (xid, msg) = parse_message_in(&in_stream(&ins, 905), true).unwrap();
    assert_eq!(xid, Some(905));
    assert_eq!(msg, parse_message(&b(&ins)).unwrap());
    // The same bytes outside a block are a different (here: malformed) message.
    assert!(parse_message(&in_stream(&ins, 905)).is_err());

    // A Relation inside a stream.
    let mut rel = vec![b'R'];
    rel.extend_from_slice(&16384u32.to_be_bytes());
    rel.extend_from_slice(b"public\0t\0d");
    rel.extend_from_slice(&1i16.to_be_bytes());
    rel.extend_from_slice(b"\x01id\0");
    rel.extend_from_slice(&23u32.to_be_bytes());
    rel.extend_from_slice(&(-1i32).to_be_bytes());
    let (xid, msg) = parse_message_in(&in_stream(&rel, 901), true).unwrap();
    assert_eq!(xid, Some(901));
    let Message::Relation(r) = msg else {
        panic!("not a relation")
    };
    assert_eq!((r.id, r.name.as_str(), r.columns.len()), (16384, "t", 1));

    // Update, Delete, Truncate, Type and Message all take the xid.
    let mut upd = vec![b'U'];
    upd.extend_from_slice(&7u32.to_be_bytes());
    upd.push(b'N');
    upd.extend_from_slice(&tuple_bytes());
    let mut del = vec![b'D'];
    del.extend_from_slice(&9u32.to_be_bytes());
    del.push(b'K');
    del.extend_from_slice(&1i16.to_be_bytes());
    del.extend_from_slice(b"t\0\0\0\x015");
    let mut tr = vec![b'T'];
    tr.extend_from_slice(&1i32.to_be_bytes());
    tr.push(0);
    tr.extend_from_slice(&3u32.to_be_bytes());
    let mut ty = vec![b'Y'];
    ty.extend_from_slice(&600u32.to_be_bytes());
    ty.extend_from_slice(b"public\0mood\0");
    let mut m = vec![b'M', 1];
    m.extend_from_slice(&8u64.to_be_bytes());
    m.extend_from_slice(b"pfx\0");
    m.extend_from_slice(&0i32.to_be_bytes());
    for body in [&upd, &del, &tr, &ty, &m] {
        let (xid, msg) = parse_message_in(&in_stream(body, 77), true).unwrap();
        assert_eq!(xid, Some(77));
        assert_eq!(msg, parse_message(&b(body)).unwrap());
        // Without its xid the message is cut short or misread, never accepted as-is.
        let cut = in_stream(body, 77).slice(..4);
        assert_eq!(parse_message_in(&cut, true), Err(DecodeError::Truncated));
    }
}

proptest! {
    #[test]
    fn random_bytes_never_panic(v in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = parse_message(&Bytes::from(v.clone()));
        let _ = parse_message_in(&Bytes::from(v), true);
    }

    #[test]
    fn random_tail_after_valid_tag_never_panics(
        tag in prop::sample::select(b"BCORYIUDTMSEcA".to_vec()),
        v in proptest::collection::vec(any::<u8>(), 0..128),
        in_stream in any::<bool>(),
    ) {
        let mut all = vec![tag];
        all.extend_from_slice(&v);
        let _ = parse_message_in(&Bytes::from(all), in_stream);
    }
}
