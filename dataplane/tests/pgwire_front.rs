//! The core side of the PostgreSQL front against the real lab origin: cached point lookups
//! must be byte-for-byte what the origin sends, everything else reaches the relay queue.
//! Needs PostgreSQL at 127.0.0.1:54329 (deploy/lab/pg.sh start).

mod support;

use std::io::Write;
use std::sync::atomic::Ordering;

use bytes::BytesMut;
use pgline_dataplane::plane::PgRequestKind;
use postgres_protocol::message::frontend as fe;
use postgres_protocol::IsNull;
use support::pglab::{self, client, Lab};
use support::pgorigin::{read_message, simple, until_ready};

/// A uniquely named table with rows 1 and 2 on the origin; row 1 (only) in the store.
fn lab(tag: &str) -> Lab {
    pglab::lab(
        tag,
        "id int4 PRIMARY KEY, dropped int, name text, note varchar(20), n int8",
        "ALTER TABLE {t} DROP COLUMN dropped; \
         INSERT INTO {t} VALUES (1, 'alice', NULL, 42), (2, 'bob', 'x', -7)",
        &[1],
    )
}

fn extended(sql: &str, param: &str, describe_statement: bool) -> BytesMut {
    let mut b = BytesMut::new();
    fe::parse("", sql, [0u32], &mut b).expect("parse");
    fe::bind(
        "",
        "",
        [0i16],
        [param],
        |p, buf| {
            buf.extend_from_slice(p.as_bytes());
            Ok::<_, Box<dyn std::error::Error + Sync + Send>>(IsNull::No)
        },
        [0i16],
        &mut b,
    )
    .map_err(|_| "bind")
    .expect("bind");
    if describe_statement {
        fe::describe(b'S', "", &mut b).expect("describe");
    } else {
        fe::describe(b'P', "", &mut b).expect("describe");
    }
    fe::execute("", 0, &mut b).expect("execute");
    fe::sync(&mut b);
    b
}

fn batches(lab: &Lab) -> usize {
    let seen = lab.relay.seen.lock().expect("seen");
    seen.requests
        .iter()
        .filter(|(k, _)| *k == PgRequestKind::Batch)
        .count()
}

#[test]
fn cached_point_lookups_are_byte_identical_to_the_origin() {
    let mut lab = lab("hit");
    let addr = lab.engine.pg_local_addr().expect("pg listener");
    assert_ne!(addr.port(), 0);
    let mut c = client(addr);
    let t = lab.table.clone();

    // Simple protocol, served from the store.
    let sql = format!("SELECT * FROM {t} WHERE id = 1");
    let ours = simple(&mut c, &sql);
    assert_eq!(ours, simple(&mut lab.origin, &sql), "simple query bytes");
    assert_eq!(batches(&lab), 0, "served from cache, not forwarded");
    let hits = lab.shared.stats(0).keys_hit.load(Ordering::Relaxed);
    assert_eq!(hits, 1);

    // Extended protocol, projection in another order, text parameter.
    let sql = format!("SELECT n, name, note FROM {t} WHERE id = $1");
    let msgs = extended(&sql, "1", false);
    c.write_all(&msgs).expect("write");
    let ours = until_ready(&mut c);
    lab.origin.write_all(&msgs).expect("write");
    assert_eq!(ours, until_ready(&mut lab.origin), "extended query bytes");
    assert_eq!(batches(&lab), 0);

    // Describe of the statement is forwarded, with the Parse the relay has not seen beside it
    // (booked, not sent in front: the client gets no ParseComplete it did not ask for).
    let mut b = BytesMut::new();
    fe::bind(
        "",
        "",
        [0i16],
        ["1"],
        |p: &str, buf| {
            buf.extend_from_slice(p.as_bytes());
            Ok::<_, Box<dyn std::error::Error + Sync + Send>>(IsNull::No)
        },
        [0i16],
        &mut b,
    )
    .map_err(|_| "bind")
    .expect("bind");
    fe::describe(b'S', "", &mut b).expect("describe");
    fe::execute("", 0, &mut b).expect("execute");
    fe::sync(&mut b);
    c.write_all(&b).expect("write");
    let ours = until_ready(&mut c);
    assert_eq!(batches(&lab), 1);
    {
        let seen = lab.relay.seen.lock().expect("seen");
        let (_, forwarded) = seen.requests.last().expect("forwarded");
        assert_eq!(forwarded[..], b[..], "the client's batch as sent");
        let booked = seen.statements.last().expect("forwarded");
        // The simple Query served first destroyed the unnamed statement (`Close S ""`); the
        // served Parse made a new one.
        assert_eq!(booked[..7], *b"C\0\0\0\x06S\0", "{booked:?}");
        assert_eq!(booked[7], b'P', "the served Parse beside the batch");
    }
    lab.origin.write_all(&b).expect("write");
    assert_eq!(ours, until_ready(&mut lab.origin), "the origin's bytes");

    // A store miss: a fill requested for the key; this rig's fill fails, so the batch is
    // forwarded (the origin's answer) and no second fill is asked.
    let sql = format!("SELECT * FROM {t} WHERE id = 2");
    let ours = simple(&mut c, &sql);
    assert_eq!(ours, simple(&mut lab.origin, &sql));
    assert_eq!(batches(&lab), 2);
    lab.relay
        .until_seen("the fill", |seen| !seen.misses.is_empty());
    let seen = lab.relay.seen.lock().expect("seen");
    assert_eq!(seen.misses.len(), 1);
    assert_eq!(&*seen.misses[0].keys[0].pk, b"2");
    assert!(
        seen.misses[0].current_only,
        "only a current read may answer"
    );
    let stats = lab.shared.stats(0);
    assert_eq!(stats.pg_lookup_fill_forwarded.load(Ordering::Relaxed), 1);
    assert_eq!(stats.pg_lookup_filled.load(Ordering::Relaxed), 0);
}

#[test]
fn writes_are_forwarded_and_a_bad_message_closes_only_its_connection() {
    let mut lab = lab("fwd");
    let addr = lab.engine.pg_local_addr().expect("pg listener");
    let mut good = client(addr);
    let mut bad = client(addr);
    let t = lab.table.clone();
    let sql = format!("UPDATE {t} SET n = n + 1 WHERE id = 2");
    let ours = simple(&mut good, &sql);
    assert!(ours.starts_with(b"C"), "CommandComplete from the origin");
    {
        let seen = lab.relay.seen.lock().expect("seen");
        let (kind, msgs) = seen.requests.last().expect("forwarded");
        assert_eq!(*kind, PgRequestKind::Batch);
        assert_eq!(msgs[0], b'Q');
        assert_eq!(&msgs[5..msgs.len() - 1], sql.as_bytes());
    }
    // A message type that does not exist: FATAL 08P01, then EOF, on that connection only.
    bad.write_all(b"Y\x00\x00\x00\x04").expect("write");
    let (tag, msg) = read_message(&mut bad);
    assert_eq!(tag, b'E');
    assert!(msg.windows(6).any(|w| w == b"C08P01"));
    let mut rest = Vec::new();
    let n = std::io::Read::read_to_end(&mut bad, &mut rest).expect("eof");
    assert_eq!(n, 0);
    assert_eq!(
        lab.shared.stats(0).protocol_errors.load(Ordering::Relaxed),
        1
    );
    let sql = format!("SELECT * FROM {t} WHERE id = 1");
    assert_eq!(simple(&mut good, &sql), simple(&mut lab.origin, &sql));
    // The bad connection's session was closed at the relay.
    lab.relay.until_seen("the session's Close", |seen| {
        seen.requests
            .iter()
            .any(|(k, _)| *k == PgRequestKind::Close)
    });
}

#[test]
fn tokio_postgres_through_pgline() {
    let lab = lab("tokio");
    let addr = lab.engine.pg_local_addr().expect("pg listener");
    let t = lab.table.clone();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let conf = format!(
            "host=127.0.0.1 port={} user=postgres password=pgline dbname=postgres",
            addr.port()
        );
        let (client, conn) = tokio_postgres::connect(&conf, tokio_postgres::NoTls)
            .await
            .expect("connect through pgline");
        tokio::spawn(conn);
        let rows = client
            .simple_query(&format!("SELECT name, n FROM {t} WHERE id = 1"))
            .await
            .expect("simple");
        let tokio_postgres::SimpleQueryMessage::Row(r) = &rows[1] else {
            panic!("a row")
        };
        assert_eq!(r.get(0), Some("alice"));
        assert_eq!(r.get(1), Some("42"));
        let row = client
            .query_one(&format!("SELECT name, n FROM {t} WHERE id = $1"), &[&2i32])
            .await
            .expect("prepared");
        assert_eq!(row.get::<_, &str>(0), "bob");
        assert_eq!(row.get::<_, i64>(1), -7);
    });
    drop(lab);
}
