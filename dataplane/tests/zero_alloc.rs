//! The hit path allocates nothing: a counting global allocator (`stats_alloc`) watches a real engine (kernel
//! transport, real store) serve pipelined GET, MGET 16, MGET 64 of one key and HGET hits to a
//! client that reuses its buffers, and warm PostgreSQL point lookups (simple Query; Parse/Bind/Describe/Execute/Sync;
//! Bind/Execute/Sync of a named statement with binary results). Nothing else runs in this
//! process during the measured window (no control plane; the tests take turns), so any
//! allocation counted is the dataplane's.

use std::alloc::System;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use pgline_dataplane::engine::{Engine, EngineConfig};
use pgline_dataplane::keyspace::{KeySpace, KeySpaceCell, PgColumn, PgTable};
use pgline_dataplane::pgwire::{
    compose_auth_ok, compose_parameter_status, compose_ready_for_query, TxStatus,
};
use pgline_dataplane::plane::{ControlWakers, PgReply, PgReplyEnd, PgRequestKind, Shared};
use pgline_dataplane::resp::Limits;
use pgline_dataplane::row::{encode_columns, encode_resp_json};
use pgline_dataplane::store::{self, EntryData, StoreConfig};
use pgline_hugepages::PageLevel;
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// The allocator is global to the process: one measuring test at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

const TABLE: u32 = 16384;
const ROWS: u32 = 1000;

fn row_json(i: u32) -> Vec<u8> {
    // ~166 bytes, like the benchmark rows.
    format!(
        r#"{{"id":{i},"name":"User number {i}","email":"user{i}@example.com","plan":"pro","credits":{}.25,"active":true,"created":"2025-01-01T00:00:00+00:00"}}"#,
        i % 1000
    )
    .into_bytes()
}

fn start() -> (Engine, Arc<Shared>) {
    let cfg = StoreConfig {
        memory_bytes: 32 << 20,
        segment_bytes: 1 << 20,
        max_page_level: PageLevel::Base,
        prefault: true,
    };
    let (mut writer, reader) = store::open(&cfg).expect("store");
    for i in 0..ROWS {
        let pk = i.to_string();
        let mut resp = Vec::new();
        encode_resp_json(&mut resp, &row_json(i));
        let mut cols = Vec::new();
        let id = i.to_string();
        let pairs: Vec<(&[u8], Option<&[u8]>)> =
            vec![(b"id", Some(id.as_bytes())), (b"name", Some(b"x"))];
        encode_columns(&mut cols, pairs.into_iter());
        let sections: [&[u8]; 2] = [&resp, &cols];
        writer
            .insert(
                TABLE,
                pk.as_bytes(),
                &EntryData {
                    sections: &sections,
                    negative: false,
                    lsn: 1,
                },
            )
            .expect("insert");
    }
    // A negative entry: "no such row" is a hit too.
    writer
        .insert(
            TABLE,
            b"999999",
            &EntryData {
                sections: &[],
                negative: true,
                lsn: 1,
            },
        )
        .expect("insert negative");
    let mut ks = KeySpace::new();
    ks.add("kv", TABLE);
    let column = |name: &str, attnum, type_oid, typlen| PgColumn {
        name: name.into(),
        attnum,
        type_oid,
        typlen,
        typmod: -1,
    };
    ks.add_pg_table(PgTable {
        id: TABLE,
        schema: "public".into(),
        name: "users".into(),
        columns: vec![column("id", 1, 23, 4), column("name", 2, 25, -1)].into(),
        key_columns: vec![0].into(),
        key_names: vec!["id".to_string()].into(),
        row_security: false,
    });
    let shared = Arc::new(Shared::new(
        reader,
        KeySpaceCell::new(ks),
        1,
        64,
        ControlWakers::none(),
    ));
    shared.control_port().set_serve_hits(true);
    let engine = Engine::start(
        EngineConfig {
            pg_listen: Some("127.0.0.1:0".parse().unwrap()),
            pg_cache_users: vec!["postgres".into()],
            pg_cache_database: Some("postgres".into()),
            listen: "127.0.0.1:0".parse().unwrap(),
            cores: 1,
            max_connections: 16,
            max_request_bytes: 1 << 20,
            max_reply_backlog: 8 << 20,
            requests_per_turn: 128,
            max_pending_per_conn: 1024,
            spin_polls: 100,
            password: None,
            limits: Limits::default(),
            conn_limits: pgline_dataplane::engine::ConnLimits::default(),
        },
        shared.clone(),
    )
    .expect("engine");
    // The writer must outlive the test: its region backs the readers.
    std::mem::forget(writer);
    (engine, shared)
}

/// Sends `request` and reads exactly `reply_len` bytes back into `buf` (no allocation).
fn round_trip(s: &mut TcpStream, request: &[u8], buf: &mut [u8], reply_len: usize) {
    s.write_all(request).unwrap();
    let mut got = 0;
    while got < reply_len {
        let n = s.read(&mut buf[got..reply_len]).unwrap();
        assert!(n > 0, "server closed");
        got += n;
    }
}

#[test]
fn hits_allocate_nothing() {
    measure_hits(false);
}

/// With client tracking on (issue 18), a read of a key already in the core's tracking table
/// allocates nothing either: the warm-up remembers every key the measured rounds read.
#[test]
fn tracked_hits_allocate_nothing() {
    measure_hits(true);
}

fn measure_hits(tracking: bool) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (engine, shared) = start();
    let mut s = TcpStream::connect(engine.local_addr()).unwrap();
    s.set_nodelay(true).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    if tracking {
        let on = b"*3\r\n$6\r\nCLIENT\r\n$8\r\nTRACKING\r\n$2\r\nON\r\n";
        round_trip(&mut s, on, &mut buf, 5);
        assert_eq!(&buf[..5], b"+OK\r\n");
    }

    // Requests and their exact replies, built before measuring.
    let mut gets = Vec::new();
    let mut get_reply = Vec::new();
    for i in 0..64u32 {
        let key = format!("kv:{}", (i * 37) % ROWS);
        gets.extend_from_slice(
            format!("*2\r\n$3\r\nGET\r\n${}\r\n{key}\r\n", key.len()).as_bytes(),
        );
        encode_resp_json(&mut get_reply, &row_json((i * 37) % ROWS));
    }
    let mut mget = b"*17\r\n$4\r\nMGET\r\n".to_vec();
    let mut mget_reply = b"*16\r\n".to_vec();
    for i in 0..16u32 {
        let key = format!("kv:{}", i * 61);
        mget.extend_from_slice(format!("${}\r\n{key}\r\n", key.len()).as_bytes());
        encode_resp_json(&mut mget_reply, &row_json(i * 61));
    }
    // One hot key 64 times (repeats are copied from the reply composed for the first).
    let mut hot = b"*65\r\n$4\r\nMGET\r\n".to_vec();
    let mut hot_reply = b"*64\r\n".to_vec();
    for _ in 0..64 {
        hot.extend_from_slice(b"$5\r\nkv:42\r\n");
        encode_resp_json(&mut hot_reply, &row_json(42));
    }
    // HGET of a row, then HMGET and GET of a row that does not exist (negative hits).
    let hget = b"*3\r\n$4\r\nHGET\r\n$5\r\nkv:42\r\n$2\r\nid\r\n\
*4\r\n$5\r\nHMGET\r\n$9\r\nkv:999999\r\n$2\r\nid\r\n$1\r\nx\r\n\
*2\r\n$3\r\nGET\r\n$9\r\nkv:999999\r\n";
    let hget_reply = b"$2\r\n42\r\n*2\r\n$-1\r\n$-1\r\n$-1\r\n";

    // Warm up: buffers grow to their steady-state sizes.
    for _ in 0..200 {
        round_trip(&mut s, &gets, &mut buf, get_reply.len());
        round_trip(&mut s, &mget, &mut buf, mget_reply.len());
        round_trip(&mut s, &hot, &mut buf, hot_reply.len());
        round_trip(&mut s, hget, &mut buf, hget_reply.len());
    }
    assert_eq!(&buf[..hget_reply.len()], hget_reply);

    let region = Region::new(GLOBAL);
    let rounds = 2_000;
    for _ in 0..rounds {
        round_trip(&mut s, &gets, &mut buf, get_reply.len());
        round_trip(&mut s, &mget, &mut buf, mget_reply.len());
        round_trip(&mut s, &hot, &mut buf, hot_reply.len());
        round_trip(&mut s, hget, &mut buf, hget_reply.len());
    }
    let change = region.change();
    let allocs = change.allocations + change.reallocations;
    // Check the last replies were right (not just fast).
    round_trip(&mut s, &gets, &mut buf, get_reply.len());
    assert_eq!(&buf[..get_reply.len()], &get_reply[..]);
    round_trip(&mut s, &mget, &mut buf, mget_reply.len());
    assert_eq!(&buf[..mget_reply.len()], &mget_reply[..]);
    round_trip(&mut s, &hot, &mut buf, hot_reply.len());
    assert_eq!(&buf[..hot_reply.len()], &hot_reply[..]);
    round_trip(&mut s, hget, &mut buf, hget_reply.len());
    assert_eq!(&buf[..hget_reply.len()], &hget_reply[..]);
    let requests = rounds * (64 + 2 + 3);
    eprintln!(
        "{requests} hit requests ({} keys), tracking {tracking}, {allocs} heap allocations",
        rounds * (64 + 16 + 64 + 3)
    );
    if tracking {
        // Every distinct key read was remembered (kv:999999 too: an absent row is tracked).
        let mut read: std::collections::HashSet<u32> =
            (0..64u32).map(|i| (i * 37) % ROWS).collect();
        read.extend((0..16u32).map(|i| i * 61));
        read.extend([42, 999_999]);
        let keys = shared.stats(0).tracking_keys.load(Ordering::Relaxed);
        assert_eq!(keys, read.len() as u64, "the reads were remembered");
    }
    assert_eq!(
        allocs, 0,
        "the hit path allocated {allocs} times over {requests} requests"
    );
    // The service-time histogram counts one observation per request (recorded inside the
    // measured window, so with no allocation). The last turn's may land after its reply.
    let (buckets, sum_ns) = shared.stats(0).service_time.snapshot();
    let observed: u64 = buckets.iter().sum();
    let sent = ((200 + rounds + 1) * (64 + 2 + 3) + usize::from(tracking)) as u64;
    assert!(
        observed <= sent && observed + 64 >= sent,
        "{observed} observations for {sent} requests"
    );
    assert!(sum_ns > 0);
    drop(s);
    engine.stop();
}

/// Answers the one Startup request of the PostgreSQL test as an origin with server defaults
/// would (no origin needed: nothing else is forwarded), then returns.
fn answer_startup(shared: &Arc<Shared>) {
    let control = shared.control_port();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        assert!(std::time::Instant::now() < until, "no startup request");
        let Some(req) = control.recv_pg_request(0) else {
            std::thread::yield_now();
            continue;
        };
        assert_eq!(req.kind, PgRequestKind::Startup);
        let mut bytes = Vec::new();
        compose_auth_ok(&mut bytes);
        for (n, v) in [
            (&b"client_encoding"[..], &b"UTF8"[..]),
            (b"DateStyle", b"ISO, MDY"),
            (b"IntervalStyle", b"postgres"),
            (b"TimeZone", b"UTC"),
        ] {
            compose_parameter_status(&mut bytes, n, v);
        }
        compose_ready_for_query(&mut bytes, TxStatus::Idle);
        let reply = PgReply {
            conn: req.conn,
            seq: req.seq,
            bytes,
            end: PgReplyEnd::Ready(b'I'),
            fence_lsn: 0,
            serve_cached: true,
            unparsed: Vec::new(),
            unclosed: Vec::new(),
        };
        control.send_pg_reply(0, reply);
        return;
    }
}

fn pg_message(tag: u8, body: &[u8], out: &mut Vec<u8>) {
    out.push(tag);
    out.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
    out.extend_from_slice(body);
}

/// Reads one complete reply ending in ReadyForQuery into `buf`; its length.
fn pg_reply(s: &mut TcpStream, buf: &mut [u8]) -> usize {
    let mut got = 0;
    loop {
        let n = s.read(&mut buf[got..]).unwrap();
        assert!(n > 0, "server closed");
        got += n;
        if got >= 6 && buf[got - 6..got] == *b"Z\0\0\0\x05I" {
            return got;
        }
    }
}

#[test]
fn pg_hits_allocate_nothing() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (engine, shared) = start();
    let mut s = TcpStream::connect(engine.pg_local_addr().expect("pg")).unwrap();
    s.set_nodelay(true).unwrap();
    let mut startup = Vec::new();
    startup.extend_from_slice(&0u32.to_be_bytes());
    startup.extend_from_slice(&196608u32.to_be_bytes());
    startup.extend_from_slice(b"user\0postgres\0database\0postgres\0\0");
    let len = startup.len() as u32;
    startup[..4].copy_from_slice(&len.to_be_bytes());
    s.write_all(&startup).unwrap();
    answer_startup(&shared);
    let mut buf = vec![0u8; 1 << 16];
    pg_reply(&mut s, &mut buf);

    // Simple; extended with an unnamed statement (text results); a named statement parsed in
    // a served batch, then Bind/Execute/Sync with binary results.
    let mut simple = Vec::new();
    pg_message(b'Q', b"SELECT * FROM users WHERE id = 42\0", &mut simple);
    let mut extended = Vec::new();
    pg_message(
        b'P',
        b"\0SELECT name FROM users WHERE id = $1\0\0\0",
        &mut extended,
    );
    pg_message(b'B', b"\0\0\0\0\0\x01\0\0\0\x0242\0\0", &mut extended);
    pg_message(b'D', b"P\0", &mut extended);
    pg_message(b'E', b"\0\0\0\0\0", &mut extended);
    pg_message(b'S', b"", &mut extended);
    let mut named = Vec::new();
    pg_message(
        b'P',
        b"s1\0SELECT * FROM users WHERE id = $1\0\0\x01\0\0\0\x17",
        &mut named,
    );
    let bind_s1 = b"\0s1\0\0\x01\0\x01\0\x01\0\0\0\x04\0\0\0\x2a\0\x01\0\x01";
    pg_message(b'B', bind_s1, &mut named);
    pg_message(b'E', b"\0\0\0\0\0", &mut named);
    pg_message(b'S', b"", &mut named);
    s.write_all(&named).unwrap();
    pg_reply(&mut s, &mut buf);
    assert_eq!(buf[0], b'1', "the named statement's Parse was served");
    let mut bound = Vec::new();
    pg_message(b'B', bind_s1, &mut bound);
    pg_message(b'E', b"\0\0\0\0\0", &mut bound);
    pg_message(b'S', b"", &mut bound);

    let mut lens = [0usize; 3];
    for _ in 0..200 {
        for (i, req) in [&simple, &extended, &bound].into_iter().enumerate() {
            s.write_all(req).unwrap();
            lens[i] = pg_reply(&mut s, &mut buf);
        }
    }
    let hits = shared.stats(0).keys_hit.load(Ordering::Relaxed);
    let region = Region::new(GLOBAL);
    let rounds = 2_000;
    for _ in 0..rounds {
        for (i, req) in [&simple, &extended, &bound].into_iter().enumerate() {
            round_trip(&mut s, req, &mut buf, lens[i]);
        }
    }
    let change = region.change();
    let allocs = change.allocations + change.reallocations;
    assert_eq!(
        shared.stats(0).keys_hit.load(Ordering::Relaxed),
        hits + 3 * rounds as u64,
        "every lookup was a hit"
    );
    // The last reply: BindComplete, DataRow (id 42 binary, name "x"), SELECT 1, Z.
    let row = b"D\0\0\0\x13\0\x02\0\0\0\x04\0\0\0\x2a\0\0\0\x01x";
    assert_eq!(&buf[..5], b"2\0\0\0\x04");
    assert_eq!(&buf[5..5 + row.len()], row);
    eprintln!("{} PostgreSQL hits, {allocs} heap allocations", 3 * rounds);
    assert_eq!(
        allocs, 0,
        "the PostgreSQL hit path allocated {allocs} times"
    );
    drop(s);
    engine.stop();
}
