//! The userspace core loop (`engine::userspace`) over an in-process byte-pipe stack, with a real
//! store and a stand-in control plane that answers misses: hits, misses released in request
//! order, pipelining, partial sends resumed on `Writable`, half-close, reset, a malformed request
//! that closes only its own connection, and the connection limit. And a PostgreSQL client on
//! the pg port: startup through the stand-in relay (real origin at 127.0.0.1:54329), cached
//! lookups byte-identical to the origin, a forwarded statement.

mod support;

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use pgline_dataplane::engine::Engine;
use postgres_protocol::message::frontend as fe;
use postgres_protocol::IsNull;
use std::io::Write;
use std::sync::atomic::Ordering;
use support::pglab;
use support::pgorigin::{simple, until_ready};
use support::pipe::{Client, Net, PipeStack};
use support::rig::{self, get, mget, resp_row, ControlPlane, ORIGIN_ONLY, ROWS};

struct Rig {
    engine: Option<Engine>,
    net: Arc<Net>,
    _control: ControlPlane,
}

impl Drop for Rig {
    fn drop(&mut self) {
        if let Some(e) = self.engine.take() {
            e.stop();
        }
    }
}

/// One userspace core over a pipe stack that takes `send_room` bytes per connection, a store
/// with rows `0..ROWS`, and a stand-in control plane answering misses after 5 ms.
fn rig(send_room: usize, max_connections: usize) -> Rig {
    let shared = rig::shared(1);
    let (stack, net) = PipeStack::new(send_room);
    let cfg = rig::engine_config(1, max_connections, "10.0.0.1:6380");
    let engine = Engine::start_streams(cfg, shared.clone(), vec![stack]).expect("engine");
    Rig {
        engine: Some(engine),
        net,
        _control: ControlPlane::start(shared, Duration::from_millis(5)),
    }
}

#[test]
fn hits_misses_and_pipelines_answer_in_order() {
    let rig = rig(1 << 20, 16);
    let c = Client::connect(&rig.net);
    c.send(&get("kv:7"));
    assert_eq!(c.read_exact(resp_row(7).len(), usize::MAX), resp_row(7));

    // A pipeline mixing hits, misses filled by the control plane, an absent row and admin
    // commands: 30 requests, answered byte for byte in request order.
    let mut request = Vec::new();
    let mut expect = Vec::new();
    for i in 0..10u32 {
        request.extend(get(&format!("kv:{}", ORIGIN_ONLY + i)));
        expect.extend(resp_row(ORIGIN_ONLY + i));
        request.extend(get(&format!("kv:{}", i * 3)));
        expect.extend(resp_row(i * 3));
        let keys = vec![format!("kv:{i}"), format!("kv:{}", 500 + i)];
        request.extend(mget(&keys));
        expect.extend(b"*2\r\n");
        expect.extend(resp_row(i));
        expect.extend(b"$-1\r\n");
    }
    request.extend(b"*1\r\n$4\r\nPING\r\n");
    expect.extend(b"+PONG\r\n");
    c.send(&request);
    let got = c.read_exact(expect.len(), usize::MAX);
    assert_eq!(
        String::from_utf8_lossy(&got),
        String::from_utf8_lossy(&expect)
    );
    assert!(!c.server_closed());
}

#[test]
fn partial_sends_resume_on_writable() {
    // The stack takes at most 300 bytes per connection until the client reads.
    let rig = rig(300, 16);
    let c = Client::connect(&rig.net);
    let keys: Vec<String> = (0..ROWS).map(|i| format!("kv:{i}")).collect();
    let mut expect = format!("*{ROWS}\r\n").into_bytes();
    for i in 0..ROWS {
        expect.extend(resp_row(i));
    }
    let mut request = Vec::new();
    for _ in 0..5 {
        request.extend(mget(&keys));
    }
    c.send(&request);
    for round in 0..5 {
        let got = c.read_exact(expect.len(), 97);
        assert_eq!(got, expect, "MGET reply {round}");
    }
}

#[test]
fn malformed_request_closes_only_its_connection() {
    let rig = rig(1 << 20, 16);
    let good = Client::connect(&rig.net);
    let bad = Client::connect(&rig.net);
    good.send(&get("kv:1"));
    assert_eq!(good.read_exact(resp_row(1).len(), usize::MAX), resp_row(1));
    // A good request, then garbage: the first is answered, then an error, then FIN.
    let mut request = get("kv:2");
    request.extend(b"*1\r\n$-5\r\n");
    request.extend(get("kv:3"));
    bad.send(&request);
    let (got, fin) = bad.read_to_close();
    let text = String::from_utf8_lossy(&got).into_owned();
    assert!(fin, "closed with FIN, not reset");
    assert!(
        text.starts_with(&String::from_utf8_lossy(&resp_row(2)).into_owned()),
        "{text}"
    );
    assert!(text.contains("-ERR Protocol error"), "{text}");
    assert!(
        !text.contains("row 3"),
        "nothing after the bad frame: {text}"
    );
    // The other connection is untouched.
    good.send(&get("kv:4"));
    assert_eq!(good.read_exact(resp_row(4).len(), usize::MAX), resp_row(4));
    assert!(!good.server_closed());
}

#[test]
fn half_close_is_answered_then_closed_and_reset_frees() {
    let rig = rig(1 << 20, 16);
    let c = Client::connect(&rig.net);
    let mut request = get(&format!("kv:{}", ORIGIN_ONLY + 1));
    request.extend(get("kv:5"));
    c.send(&request);
    c.shutdown_write();
    let (got, fin) = c.read_to_close();
    let mut expect = resp_row(ORIGIN_ONLY + 1);
    expect.extend(resp_row(5));
    assert_eq!(got, expect);
    assert!(fin);

    // A reset connection with a miss in flight: its late reply is dropped, others still work.
    let r = Client::connect(&rig.net);
    r.send(&get(&format!("kv:{}", ORIGIN_ONLY + 2)));
    r.reset();
    let c2 = Client::connect(&rig.net);
    c2.send(&get(&format!("kv:{}", ORIGIN_ONLY + 3)));
    let want = resp_row(ORIGIN_ONLY + 3);
    assert_eq!(c2.read_exact(want.len(), usize::MAX), want);
}

#[test]
fn connections_over_the_limit_are_refused() {
    let rig = rig(1 << 20, 2);
    let a = Client::connect(&rig.net);
    let b = Client::connect(&rig.net);
    a.send(&get("kv:1"));
    b.send(&get("kv:1"));
    a.read_exact(resp_row(1).len(), usize::MAX);
    b.read_exact(resp_row(1).len(), usize::MAX);
    let c = Client::connect(&rig.net);
    let (got, fin) = c.read_to_close();
    assert_eq!(got, b"-ERR max number of clients reached\r\n");
    assert!(fin);
}

static STARTED: std::sync::Mutex<Vec<(usize, String)>> = std::sync::Mutex::new(Vec::new());

fn note_start(core: usize) {
    let name = std::thread::current().name().unwrap_or("").to_string();
    STARTED.lock().unwrap().push((core, name));
}

#[test]
fn on_start_runs_on_each_core_thread() {
    let shared = rig::shared(2);
    let (s0, _n0) = PipeStack::new(1024);
    let (s1, _n1) = PipeStack::new(1024);
    let cfg = rig::engine_config(2, 16, "10.0.0.1:6380");
    let engine = Engine::start_streams_with(cfg, shared, vec![s0, s1], note_start).unwrap();
    let until = std::time::Instant::now() + Duration::from_secs(5);
    while STARTED.lock().unwrap().len() < 2 {
        assert!(std::time::Instant::now() < until);
        std::thread::yield_now();
    }
    engine.stop();
    let mut started = STARTED.lock().unwrap().clone();
    started.sort();
    assert_eq!(
        started,
        vec![(0, "pgline-ucore-0".into()), (1, "pgline-ucore-1".into())]
    );
}

#[test]
fn postgres_clients_on_the_pg_port_get_cached_lookups() {
    let mut net = None;
    let mut lab = pglab::lab_with(
        "upipe",
        "id int4 PRIMARY KEY, name text, score float8",
        "INSERT INTO {t} VALUES (1, 'alice', 0.1), (2, 'bob', NULL)",
        &[1],
        |shared| {
            let (stack, n) = PipeStack::new(1 << 20);
            net = Some(n);
            let mut cfg = rig::engine_config(1, 16, "10.0.0.1:6380");
            cfg.pg_listen = Some("10.0.0.1:6432".parse().unwrap());
            Engine::start_streams(cfg, shared, vec![stack]).expect("engine")
        },
    );
    let net = net.expect("net");
    assert_eq!(lab.engine.pg_local_addr().map(|a| a.port()), Some(6432));
    let c = Client::connect_to(&net, 6432);
    let mut b = BytesMut::new();
    fe::startup_message([("user", "postgres"), ("database", "postgres")], &mut b).unwrap();
    c.send(&b);
    let (tag, _) = c.read_pg_message();
    assert_eq!(tag, b'R', "AuthenticationOk through the relay");
    c.read_pg_until_ready();

    let t = lab.table.clone();
    let hits = |lab: &pglab::Lab| lab.shared.stats(0).keys_hit.load(Ordering::Relaxed);
    // Simple protocol: a hit, the origin's bytes.
    let sql = format!("SELECT * FROM {t} WHERE id = 1");
    let mut q = BytesMut::new();
    fe::query(&sql, &mut q).unwrap();
    c.send(&q);
    assert_eq!(c.read_pg_until_ready(), simple(&mut lab.origin, &sql));
    assert_eq!(hits(&lab), 1);
    // Extended, binary results: a hit, the origin's bytes.
    let mut e = BytesMut::new();
    fe::parse(
        "",
        &format!("SELECT name, score FROM {t} WHERE id = $1"),
        [23u32],
        &mut e,
    )
    .unwrap();
    fe::bind(
        "",
        "",
        [1i16],
        [1i32],
        |p, buf| {
            buf.extend_from_slice(&p.to_be_bytes());
            Ok::<_, Box<dyn std::error::Error + Sync + Send>>(IsNull::No)
        },
        [1i16],
        &mut e,
    )
    .map_err(|_| "bind")
    .unwrap();
    fe::describe(b'P', "", &mut e).unwrap();
    fe::execute("", 0, &mut e).unwrap();
    fe::sync(&mut e);
    c.send(&e);
    let ours = c.read_pg_until_ready();
    lab.origin.write_all(&e).unwrap();
    assert_eq!(ours, until_ready(&mut lab.origin));
    assert_eq!(hits(&lab), 2);
    // Not cached: forwarded to the relay, the origin's answer.
    let sql = format!("SELECT count(*) FROM {t}");
    let mut q = BytesMut::new();
    fe::query(&sql, &mut q).unwrap();
    c.send(&q);
    assert_eq!(c.read_pg_until_ready(), simple(&mut lab.origin, &sql));
    assert_eq!(hits(&lab), 2);
    // A RESP client on the other port still speaks RESP.
    let r = Client::connect(&net);
    r.send(b"PING\r\n");
    assert_eq!(r.read_exact(7, usize::MAX), b"+PONG\r\n");
}

/// A full miss queue answers `-BUSY` at once and counts it as a RESP refusal; the replies stay
/// in request order behind the misses the queue took, which are answered as usual.
#[test]
fn a_full_miss_queue_answers_busy_in_request_order() {
    use pgline_dataplane::plane::{FillResult, MissReply, RowBytes};
    let shared = rig::shared_with_queues(1, 2);
    let (stack, net) = PipeStack::new(1 << 20);
    let cfg = rig::engine_config(1, 16, "10.0.0.1:6380");
    let engine = Engine::start_streams(cfg, shared.clone(), vec![stack]).expect("engine");
    let c = Client::connect(&net);
    let request: Vec<u8> = (0..5)
        .flat_map(|i| get(&format!("kv:{}", ORIGIN_ONLY + i)))
        .collect();
    c.send(&request);
    // No control plane runs: the queue keeps the first two misses, the other three are refused.
    let refused = || shared.stats(0).resp_queue_full.load(Ordering::Relaxed);
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while refused() < 3 {
        assert!(std::time::Instant::now() < until, "{} refused", refused());
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(refused(), 3);
    assert_eq!(shared.stats(0).pg_queue_full.load(Ordering::Relaxed), 0);
    assert_eq!(shared.queue_depths(0).misses, 2);
    let control = shared.control_port();
    for i in 0..2 {
        let req = control.recv_miss(0).expect("a miss the queue took");
        let row = RowBytes {
            resp_json: resp_row(ORIGIN_ONLY + i),
            columns: Vec::new(),
        };
        let reply = MissReply {
            conn: req.conn,
            seq: req.seq,
            results: vec![FillResult::Row(Arc::new(row))],
            lsn: 0,
        };
        control.send_reply(0, reply);
    }
    let mut expect = resp_row(ORIGIN_ONLY);
    expect.extend(resp_row(ORIGIN_ONLY + 1));
    for _ in 0..3 {
        expect.extend(b"-BUSY pgline: too many misses in flight, retry\r\n");
    }
    let got = c.read_exact(expect.len(), usize::MAX);
    assert_eq!(
        String::from_utf8_lossy(&got),
        String::from_utf8_lossy(&expect)
    );
    engine.stop();
}
