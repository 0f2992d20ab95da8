//! Adversarial clients against the bounds of the client-facing ports (issue 11, C1-C3): reply
//! memory, connection limits per port and per source, authentication/startup and idle
//! timeouts, readiness under saturation, AUTH failures. Real clients (raw TCP, the `redis`
//! crate, tokio-postgres) against a real pgline and origin.
//!
//! The tests take a process-wide lock and run one at a time: the C1 test reads this process's
//! RSS (pgline runs in-process), which other tests' sockets and buffers would blur.

mod common;
mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::TestDb;
use pgline_controlplane::config::Config;
use pgline_controlplane::server::Pgline;
use support::{encode, show, Raw};
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
    let mut cfg = support::config(db, 1);
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

async fn origin_json(origin: &tokio_postgres::Client, id: i32) -> String {
    origin
        .query_one("SELECT row_to_json(x)::text FROM t x WHERE id = $1", &[&id])
        .await
        .unwrap()
        .get(0)
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
    let p = support::start(config(&db, |c| c.resp.max_reply_memory = cap as usize)).await;
    let mut r = support::redis(&p).await;
    for id in 1..=200 {
        let v: String = redis::cmd("GET")
            .arg(format!("t:{id}"))
            .query_async(&mut r)
            .await
            .unwrap();
        assert!(!v.is_empty());
    }
    let row7 = origin_json(&origin, 7).await;
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
