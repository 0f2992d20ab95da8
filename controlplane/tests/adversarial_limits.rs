//! Adversarial clients against the bounds of the client-facing ports (issue 11, C1-C3): reply
//! memory, connection limits per port and per source, authentication/startup and idle
//! timeouts, readiness under saturation, AUTH failures. Real clients (raw TCP, the `redis`
//! crate, tokio-postgres) against a real pgline and origin.
//!
//! The tests take a process-wide lock and run one at a time: the C1 test reads this process's
//! RSS (pgline runs in-process), which other tests' sockets and buffers would blur.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pgline_controlplane::config::Config;
use pgline_controlplane::server::Pgline;
use pgline_testkit::origin::origin_json;
use pgline_testkit::resp::{encode, show, Raw};
use pgline_testkit::TestDb;
use pgline_testkit::{lab, origin};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `t`: 200 rows of about 2 KiB each.
const SCHEMA: &str = "
CREATE TABLE t (id int4 PRIMARY KEY, v text);
INSERT INTO t SELECT g, repeat(md5(g::text), 64) FROM generate_series(1, 200) g;
";

const MIB: u64 = 1 << 20;

async fn setup(tag: &str) -> (TestDb, tokio_postgres::Client) {
    let db = TestDb::create(tag).await;
    let origin = db.client().await;
    origin.batch_execute(SCHEMA).await.unwrap();
    (db, origin)
}

/// The test config for `db` (one core, the API's reads open), changed by `f`.
fn config(db: &TestDb, f: impl FnOnce(&mut Config)) -> Config {
    let mut cfg = lab::config(db, 1);
    cfg.api.open_reads = true;
    f(&mut cfg);
    cfg.validate().expect("valid test config");
    cfg
}

/// This process's resident set (pgline runs in it), bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kb * 1024
}

/// Polls `f` until it holds or `secs` pass; returns whether it held.
async fn eventually(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < until {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    f()
}

fn total(p: &Pgline, f: impl Fn(&pgline_dataplane::plane::CoreStats) -> &AtomicU64) -> u64 {
    p.shared.total(f)
}

/// `GET /v1/ready`: status code and body.
async fn ready(p: &Pgline) -> (u16, String) {
    let addr = p.api_addr().expect("the API is on");
    let r = reqwest::get(format!("http://{addr}/v1/ready"))
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// Polls `/v1/ready` until it answers `code` (20 s at most); the last answer.
async fn ready_becomes(p: &Pgline, code: u16) -> (u16, String) {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let got = ready(p).await;
        if got.0 == code || Instant::now() >= until {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Reads until the peer closes (or resets); what arrived.
async fn read_to_close(s: &mut TcpStream, secs: u64) -> Vec<u8> {
    let mut out = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    let until = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        match tokio::time::timeout_at(until, s.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return out,
            Ok(Ok(n)) => out.extend_from_slice(&chunk[..n]),
            Err(_) => panic!(
                "still open after {secs} s; read {:?}",
                show(&out[..out.len().min(300)])
            ),
        }
    }
}

/// C1. 120 connections pipeline GETs and never read. Their buffers stay under
/// `resp.max_reply_memory` (plus a margin), a well-behaved client is still answered with the
/// origin's row meanwhile, and once they are gone the process's RSS comes back near where it
/// was. On the old code each such connection held about 14 MiB (120: +1.8 GB) and most of it
/// stayed resident after they closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c1_clients_that_never_read_are_bounded_by_the_reply_memory_cap() {
    let _serial = SERIAL.lock().await;
    let (db, origin) = setup("c1mem").await;
    let cap = 64 * MIB;
    let p = lab::start(config(&db, |c| c.resp.max_reply_memory = cap as usize)).await;
    let mut r = lab::redis(&p).await;
    for id in 1..=200 {
        let v: String = redis::cmd("GET")
            .arg(format!("t:{id}"))
            .query_async(&mut r)
            .await
            .unwrap();
        assert!(!v.is_empty());
    }
    let row7 = origin_json(&origin, "t", 7).await.expect("row 7");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let baseline = rss();

    // Every client writes the same 64 KiB of pipelined GETs (~2 KiB replies each) until the
    // server stops reading it.
    let mut chunk = Vec::new();
    let mut id = 0;
    while chunk.len() < 64 * 1024 {
        id = id % 200 + 1;
        chunk.extend_from_slice(&encode(&["GET", &format!("t:{id}")]));
    }
    let chunk: Arc<[u8]> = chunk.into();
    let mut writers = Vec::new();
    for _ in 0..120 {
        let mut s = TcpStream::connect(p.local_addr()).await.unwrap();
        let chunk = chunk.clone();
        writers.push(tokio::spawn(async move {
            while s.write_all(&chunk).await.is_ok() {}
        }));
    }
    let sampling = Arc::new(AtomicBool::new(true));
    let (peak_rss, peak_mem) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let sampler = {
        let (on, peak_rss, peak_mem, shared) = (
            sampling.clone(),
            peak_rss.clone(),
            peak_mem.clone(),
            p.shared.clone(),
        );
        std::thread::spawn(move || {
            while on.load(Ordering::Relaxed) {
                peak_rss.fetch_max(rss(), Ordering::Relaxed);
                let held = shared.total(|s| &s.reply_memory_bytes);
                peak_mem.fetch_max(held, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    // The flood runs for 4 s; a well-behaved client is answered meanwhile.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let during: String = tokio::time::timeout(
        Duration::from_secs(10),
        redis::cmd("GET").arg("t:7").query_async(&mut r),
    )
    .await
    .expect("a reading client is answered during the flood")
    .unwrap();
    assert_eq!(during, row7);
    tokio::time::sleep(Duration::from_secs(2)).await;
    for w in &writers {
        w.abort();
    }
    for w in writers {
        let _ = w.await;
    }
    let closed = eventually(20, || total(&p, |s| &s.connections_open) == 1).await;
    assert!(closed, "the flood's connections are closed");
    sampling.store(false, Ordering::Relaxed);
    sampler.join().unwrap();
    let mut after = rss();
    eventually(10, || {
        after = rss();
        after <= baseline + 48 * MIB
    })
    .await;
    let (peak, held) = (
        peak_rss.load(Ordering::Relaxed),
        peak_mem.load(Ordering::Relaxed),
    );
    let evicted = total(&p, |s| &s.connections_evicted);
    eprintln!(
        "C1: RSS baseline {} MiB, peak {} MiB, after {} MiB; reply memory peak {} MiB (cap {} MiB); {evicted} connections evicted",
        baseline / MIB,
        peak / MIB,
        after / MIB,
        held / MIB,
        cap / MIB
    );
    assert!(
        held <= cap + 16 * MIB,
        "reply memory peaked at {held} bytes, cap {cap}"
    );
    assert!(
        peak <= baseline + 2 * cap + 64 * MIB,
        "RSS peaked at {} MiB from {} MiB with a {} MiB cap",
        peak / MIB,
        baseline / MIB,
        cap / MIB
    );
    assert!(
        after <= baseline + 48 * MIB,
        "RSS stayed at {} MiB after the clients left (baseline {} MiB)",
        after / MIB,
        baseline / MIB
    );
    assert_eq!(total(&p, |s| &s.reply_memory_bytes), 0);
    // Still serving, with the origin's row.
    let v: String = redis::cmd("GET")
        .arg("t:7")
        .query_async(&mut r)
        .await
        .unwrap();
    assert_eq!(v, row7);
}

/// A `key=value` connection string to pgline's PostgreSQL port for the test database.
fn pgline_conn(p: &Pgline, db: &TestDb) -> String {
    let addr = p.pg_addr().expect("the pgwire front is on");
    let (_, _, user, password) = origin::origin_base();
    format!(
        "host={} port={} user={user} password={password} dbname={} connect_timeout=10",
        addr.ip(),
        addr.port(),
        db.name
    )
}

async fn pg_connect(conn: &str) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(conn, tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

fn resp_open(p: &Pgline) -> u64 {
    total(p, |s| &s.connections_open) - total(p, |s| &s.connections_open_pg)
}

/// C1 (-NOAUTH flood). A connection that has not authenticated and pipelines GETs without
/// reading gets a small reply budget: it holds well under 1 MiB of pgline's memory (the old
/// code let it reach `resp.max_reply_backlog`, 8 MiB, about 8.4 MiB each), and an
/// unauthenticated request larger than 16 KiB is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c1_unauthenticated_connections_get_a_small_budget() {
    let _serial = SERIAL.lock().await;
    let (db, _origin) = setup("c1noauth").await;
    let p = lab::start(config(&db, |c| c.resp.password = "s3cret".into())).await;
    let mut chunk = Vec::new();
    while chunk.len() < 64 * 1024 {
        chunk.extend_from_slice(&encode(&["GET", "t:1"]));
    }
    let mut writers = Vec::new();
    for _ in 0..8 {
        let mut s = TcpStream::connect(p.local_addr()).await.unwrap();
        let chunk = chunk.clone();
        writers.push(tokio::spawn(async move {
            while s.write_all(&chunk).await.is_ok() {}
        }));
    }
    // Until the flood has filled what the kernel buffers: bytes in stop moving.
    let mut last = 0;
    let settled = eventually(20, || {
        let now = total(&p, |s| &s.bytes_in);
        let done = now > 0 && now == last;
        last = now;
        done
    })
    .await;
    assert!(settled, "the -NOAUTH flood never settled");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let held = total(&p, |s| &s.reply_memory_bytes);
    eprintln!("C1 -NOAUTH: 8 connections hold {held} bytes of buffers");
    assert!(
        held <= 8 * 512 * 1024,
        "8 unauthenticated connections hold {held} bytes"
    );
    for w in writers {
        w.abort();
    }
    // One request over 16 KiB before AUTH: refused, connection closed.
    let mut c = Raw::connect(&p).await;
    let big = "x".repeat(20 * 1024);
    c.send(&encode(&["AUTH", &big])).await;
    let reply = c.until_closed().await;
    assert!(
        reply.starts_with(b"-ERR Protocol error: unauthenticated request too large"),
        "{}",
        show(&reply)
    );
}

/// C2. RESP sockets at `resp.max_connections` do not lock PostgreSQL clients out (the old code
/// had one limit for both ports: they got 53300), the next RESP connection is refused, and
/// `/v1/ready` answers 503 naming the saturated port until the sockets go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c2_a_resp_flood_at_its_limit_leaves_postgres_clients_in_and_is_not_ready() {
    let _serial = SERIAL.lock().await;
    let (db, origin) = setup("c2flood").await;
    let p = lab::start(config(&db, |c| c.resp.max_connections = 300)).await;
    let (code, body) = ready_becomes(&p, 200).await;
    assert_eq!(code, 200, "ready before the flood: {body}");
    let mut idle = Vec::new();
    for _ in 0..300 {
        idle.push(TcpStream::connect(p.local_addr()).await.unwrap());
    }
    assert!(eventually(20, || resp_open(&p) == 300).await);
    let mut extra = TcpStream::connect(p.local_addr()).await.unwrap();
    let refused = read_to_close(&mut extra, 10).await;
    assert_eq!(refused, b"-ERR max number of clients reached\r\n");

    let pg = pg_connect(&pgline_conn(&p, &db))
        .await
        .expect("a PostgreSQL client gets in while the RESP port is full");
    let via: String = pg
        .query_one("SELECT v FROM t WHERE id = 7", &[])
        .await
        .unwrap()
        .get(0);
    let direct: String = origin
        .query_one("SELECT v FROM t WHERE id = 7", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(via, direct);

    let (code, body) = ready(&p).await;
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("\"connections\":false") && body.contains("300 RESP connections open"),
        "{body}"
    );
    drop(idle);
    assert!(eventually(20, || resp_open(&p) == 0).await);
    let (code, body) = ready_becomes(&p, 200).await;
    assert_eq!(code, 200, "{body}");
}

/// C2. `resp.max_connections_per_source` and `pgwire.max_connections_per_source`: the
/// (N+1)th connection from one address is refused on each port, and a slot freed by a close is
/// usable again. The old code had no such limit (the test's config keys did not exist).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c2_the_per_source_limit_refuses_the_next_connection() {
    let _serial = SERIAL.lock().await;
    let (db, _origin) = setup("c2source").await;
    let p = lab::start(config(&db, |c| {
        c.resp.max_connections_per_source = 5;
        c.pgwire.max_connections_per_source = 2;
    }))
    .await;
    let mut open = Vec::new();
    for _ in 0..5 {
        let mut c = Raw::connect(&p).await;
        assert_eq!(c.cmd(&["PING"]).await, b"+PONG\r\n");
        open.push(c);
    }
    let mut sixth = TcpStream::connect(p.local_addr()).await.unwrap();
    let refused = read_to_close(&mut sixth, 10).await;
    assert_eq!(
        refused,
        b"-ERR max number of clients from this address reached\r\n"
    );
    drop(open.pop());
    assert!(eventually(20, || resp_open(&p) == 4).await);
    let mut again = Raw::connect(&p).await;
    assert_eq!(again.cmd(&["PING"]).await, b"+PONG\r\n");

    let conn = pgline_conn(&p, &db);
    let a = pg_connect(&conn).await.unwrap();
    let b = pg_connect(&conn).await.unwrap();
    let Err(err) = pg_connect(&conn).await else {
        panic!("the third PostgreSQL connection from one address is refused");
    };
    assert_eq!(
        err.code(),
        Some(&tokio_postgres::error::SqlState::TOO_MANY_CONNECTIONS),
        "{err}"
    );
    a.simple_query("SELECT 1").await.unwrap();
    b.simple_query("SELECT 1").await.unwrap();
    assert!(total(&p, |s| &s.connections_rejected_source) >= 2);
}

/// C2. Timeouts: with a password, a RESP socket that does not authenticate within
/// `resp.auth_timeout_ms` gets an error and is closed, while an authenticated one stays; a
/// PostgreSQL socket that never completes its startup within `pgwire.startup_timeout_ms` gets
/// FATAL 57014 and is closed; idle sessions are closed after the idle timeouts (PostgreSQL:
/// FATAL 57P05, as `idle_session_timeout`). The old code kept all of them open for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c2_unauthenticated_and_idle_connections_are_closed_after_their_timeouts() {
    let _serial = SERIAL.lock().await;
    let (db, _origin) = setup("c2timeout").await;
    let p = lab::start(config(&db, |c| {
        c.resp.password = "s3cret".into();
        c.resp.auth_timeout_ms = 1_000;
        c.pgwire.startup_timeout_ms = 1_000;
        c.pgwire.idle_timeout_ms = 3_000;
    }))
    .await;
    let started = Instant::now();
    let mut silent = TcpStream::connect(p.local_addr()).await.unwrap();
    let mut pg_silent = TcpStream::connect(p.pg_addr().unwrap()).await.unwrap();
    let mut authed = Raw::connect(&p).await;
    assert_eq!(authed.cmd(&["AUTH", "s3cret"]).await, b"+OK\r\n");
    let pg = pg_connect(&pgline_conn(&p, &db)).await.unwrap();

    let got = read_to_close(&mut silent, 15).await;
    assert_eq!(
        got,
        b"-ERR authentication timeout: closing the connection\r\n"
    );
    assert!(started.elapsed() >= Duration::from_millis(900));
    let got = read_to_close(&mut pg_silent, 15).await;
    assert_eq!(got[0], b'E', "{}", show(&got));
    let text = show(&got);
    assert!(
        text.contains("C57014") && text.contains("canceling authentication due to timeout"),
        "{text}"
    );
    // Past the auth timeout, the authenticated ones are still served.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(authed.cmd(&["PING"]).await, b"+PONG\r\n");
    pg.simple_query("SELECT 1").await.unwrap();
    assert!(total(&p, |s| &s.connections_auth_timeout) >= 2);

    // The PostgreSQL session idles past pgwire.idle_timeout_ms: closed with 57P05.
    assert!(
        eventually(20, || total(&p, |s| &s.connections_idle_timeout) >= 1).await,
        "the idle session was not closed"
    );
    let err = pg.simple_query("SELECT 1").await.unwrap_err();
    assert!(pg.is_closed(), "{err}");
    // RESP has no idle timeout here (0: off): the authenticated connection is still served.
    assert_eq!(authed.cmd(&["PING"]).await, b"+PONG\r\n");
}

/// C3. 100,000 wrong AUTHs pipelined on one connection: after `resp.max_auth_failures` (10)
/// the connection is answered with an error and closed, and the failures are counted in
/// `pgline_resp_auth_failures_total`. The old code answered every one and counted none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c3_wrong_auth_pipelines_are_cut_off_after_n_and_counted() {
    let _serial = SERIAL.lock().await;
    let (db, _origin) = setup("c3auth").await;
    let p = lab::start(config(&db, |c| c.resp.password = "s3cret".into())).await;
    let mut s = TcpStream::connect(p.local_addr()).await.unwrap();
    let one = encode(&["AUTH", "wrong"]);
    let flood: Vec<u8> = one.repeat(100_000);
    let (mut rd, mut wr) = s.split();
    let (_, got) = tokio::join!(
        async {
            let _ = wr.write_all(&flood).await;
        },
        async {
            let mut out = Vec::new();
            let mut chunk = vec![0u8; 64 * 1024];
            loop {
                match tokio::time::timeout(Duration::from_secs(15), rd.read(&mut chunk)).await {
                    Ok(Ok(0)) | Ok(Err(_)) => return out,
                    Ok(Ok(n)) => out.extend_from_slice(&chunk[..n]),
                    Err(_) => panic!("still open: {}", show(&out[..out.len().min(300)])),
                }
            }
        }
    );
    let text = show(&got);
    assert_eq!(
        text.matches("-WRONGPASS ").count(),
        10,
        "{}",
        &text[..text.len().min(2000)]
    );
    assert!(
        text.ends_with(
            "-ERR too many failed authentication attempts on this connection: closing it\r\n"
        ),
        "{text}"
    );
    assert_eq!(total(&p, |s| &s.auth_failures), 10);
    let addr = p.api_addr().unwrap();
    let metrics = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("pgline_resp_auth_failures_total{core=\"0\"} 10"),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("auth"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // A fresh connection can still authenticate.
    let mut c = Raw::connect(&p).await;
    assert_eq!(c.cmd(&["AUTH", "s3cret"]).await, b"+OK\r\n");
}
