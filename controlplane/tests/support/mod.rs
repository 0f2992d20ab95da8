//! Boots a real pgline in-process against a test database.
#![allow(dead_code)]

use std::time::Duration;

use pgline_controlplane::config::Config;
use pgline_controlplane::server::Pgline;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::TestDb;

/// A config for `db` with a unique slot (named after the database: slot names are cluster-wide,
/// so a shared name would make parallel tests, or other users of the lab cluster, collide), an
/// ephemeral port and a small store. The publication lives in the test's database.
pub fn config(db: &TestDb, cores: usize) -> Config {
    let url = db.conn_string();
    let sets = vec![
        format!("origin.url={}", toml_str(&url)),
        format!("replication.slot={}", toml_str(&slot_name(db))),
        "resp.listen=\"127.0.0.1:0\"".to_string(),
        "api.listen=\"127.0.0.1:0\"".to_string(),
        "pgwire.listen=\"127.0.0.1:0\"".to_string(),
        format!("resp.cores={cores}"),
        "resp.spin_polls=50".to_string(),
        "store.memory=\"64MiB\"".to_string(),
        "store.max_page=\"4KiB\"".to_string(),
        "replication.status_interval_ms=100".to_string(),
        "replication.reconnect_backoff_ms=100".to_string(),
        "origin.pool_size=4".to_string(),
    ];
    Config::load(None, Vec::<(String, String)>::new(), &sets).expect("test config")
}

/// The replication slot [`config`] gives the test database `db`.
pub fn slot_name(db: &TestDb) -> String {
    db.name.clone()
}

fn toml_str(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// Starts pgline and waits until it serves hits (replication streaming).
pub async fn start(cfg: Config) -> std::sync::Arc<Pgline> {
    let p = Pgline::start(cfg).await.expect("pgline starts");
    assert!(
        p.wait_serving(Duration::from_secs(20)).await,
        "pgline never started serving hits"
    );
    p
}

/// The origin's current WAL insert position.
pub async fn origin_lsn(client: &tokio_postgres::Client) -> u64 {
    let row = client
        .query_one("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::int8", &[])
        .await
        .expect("pg_current_wal_lsn");
    row.get::<_, i64>(0) as u64
}

/// Waits until pgline has applied everything the origin has written so far.
pub async fn sync(p: &Pgline, client: &tokio_postgres::Client) {
    let lsn = origin_lsn(client).await;
    let r = &p.repl;
    assert!(
        p.wait_applied(lsn, Duration::from_secs(30)).await,
        "applied LSN {} never reached origin LSN {lsn} (received {}, server end {}, streaming {}, txns {}, reconnects {})",
        p.applied_lsn(),
        r.received_lsn.load(std::sync::atomic::Ordering::Relaxed),
        r.server_wal_end.load(std::sync::atomic::Ordering::Relaxed),
        r.streaming.load(std::sync::atomic::Ordering::Relaxed),
        r.txns.load(std::sync::atomic::Ordering::Relaxed),
        r.reconnects.load(std::sync::atomic::Ordering::Relaxed),
    );
}

pub async fn redis(p: &Pgline) -> redis::aio::MultiplexedConnection {
    let addr = p.local_addr();
    let client = redis::Client::open(format!("redis://{}:{}/", addr.ip(), addr.port())).unwrap();
    client
        .get_multiplexed_async_connection()
        .await
        .expect("redis connect")
}

/// Compares every cached entry with the origin's `row_to_json`; returns the stale ones.
pub async fn stale_entries(p: &Pgline, client: &tokio_postgres::Client) -> Vec<String> {
    let mut stale = Vec::new();
    for pgline_controlplane::writer::DumpedEntry { table, pk, json } in p.dump().await {
        let t = p
            .catalog
            .get(table)
            .expect("dumped table is in the catalog")
            .clone();
        let key_col = &t.columns[t.key_columns[0]];
        let sql = format!(
            "SELECT row_to_json(t)::text FROM {} t WHERE {}::text = $1",
            t.qualified(),
            pgline_controlplane::catalog::quote_ident(&key_col.name)
        );
        let pk_text = String::from_utf8(pk.clone()).unwrap();
        let row = client
            .query_opt(&sql, &[&pk_text])
            .await
            .expect("probe query");
        let origin: Option<String> = row.map(|r| r.get(0));
        let cached = json.map(|j| String::from_utf8(j).unwrap());
        if origin != cached {
            stale.push(format!(
                "{}:{pk_text}: cached {cached:?}, origin {origin:?}",
                t.name
            ));
        }
    }
    stale
}

/// How long a [`Raw`] read waits before failing the test.
const RAW_TIMEOUT: Duration = Duration::from_secs(10);

/// A plain TCP connection that sends raw bytes and reads whole RESP frames, unparsed.
pub struct Raw {
    s: TcpStream,
    buf: Vec<u8>,
}

impl Raw {
    pub async fn connect(p: &Pgline) -> Raw {
        let s = TcpStream::connect(p.local_addr()).await.expect("connect");
        s.set_nodelay(true).unwrap();
        Raw { s, buf: Vec::new() }
    }

    pub async fn send(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).await.expect("write");
    }

    /// Reads more bytes into the buffer; false on EOF (or a reset).
    async fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 16 * 1024];
        match tokio::time::timeout(RAW_TIMEOUT, self.s.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => false,
            Ok(Ok(n)) => {
                self.buf.extend_from_slice(&chunk[..n]);
                true
            }
            Err(_) => panic!(
                "no reply within {RAW_TIMEOUT:?}; buffered {:?}",
                String::from_utf8_lossy(&self.buf)
            ),
        }
    }

    /// One complete RESP2/RESP3 frame, as sent.
    pub async fn frame(&mut self) -> Vec<u8> {
        loop {
            if let Some(n) = frame_len(&self.buf) {
                return self.buf.drain(..n).collect();
            }
            assert!(
                self.fill().await,
                "connection closed mid-frame: {:?}",
                String::from_utf8_lossy(&self.buf)
            );
        }
    }

    /// Exactly `n` bytes.
    pub async fn bytes(&mut self, n: usize) -> Vec<u8> {
        while self.buf.len() < n {
            assert!(
                self.fill().await,
                "connection closed after {} of {n} bytes",
                self.buf.len()
            );
        }
        self.buf.drain(..n).collect()
    }

    /// Sends one command and returns its reply frame.
    pub async fn cmd(&mut self, args: &[&str]) -> Vec<u8> {
        self.send(&encode(args)).await;
        self.frame().await
    }

    /// Whatever arrives until the peer closes; panics if it stays open.
    pub async fn until_closed(&mut self) -> Vec<u8> {
        while self.fill().await {}
        std::mem::take(&mut self.buf)
    }
}

pub fn encode(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
    }
    out
}

/// Length of the complete frame at the start of `b`, or `None` if it is not complete yet.
pub fn frame_len(b: &[u8]) -> Option<usize> {
    let line_end = b.windows(2).position(|w| w == b"\r\n")?;
    let after = line_end + 2;
    let head = std::str::from_utf8(&b[1..line_end]).ok();
    let num = || -> i64 { head.and_then(|h| h.parse().ok()).expect("frame length") };
    match b[0] {
        b'+' | b'-' | b':' | b'_' | b',' | b'#' | b'(' => Some(after),
        b'$' | b'=' | b'!' => {
            let n = num();
            if n < 0 {
                return Some(after);
            }
            let end = after + n as usize + 2;
            (b.len() >= end).then_some(end)
        }
        b'*' | b'~' | b'>' | b'%' | b'|' => {
            let n = num();
            let items = if matches!(b[0], b'%' | b'|') {
                2 * n
            } else {
                n
            };
            let mut at = after;
            for _ in 0..items.max(0) {
                at += frame_len(&b[at..])?;
            }
            Some(at)
        }
        other => panic!("not a RESP frame type: {:?}", other as char),
    }
}

pub fn bulk(s: &str) -> Vec<u8> {
    format!("${}\r\n{s}\r\n", s.len()).into_bytes()
}

pub fn show(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A numeric field of `INFO`.
pub async fn info_field(r: &mut redis::aio::MultiplexedConnection, field: &str) -> u64 {
    let info: String = redis::cmd("INFO").query_async(r).await.unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("INFO has no {field}: {info}"))
}

/// Appends a Bind of the unnamed portal to `stmt` with text parameters and text results (no
/// format codes: all text), with postgres-protocol's encoder; shared by the raw-protocol tests.
pub fn bind_text(b: &mut bytes::BytesMut, stmt: &str, params: &[&str]) {
    postgres_protocol::message::frontend::bind(
        "",
        stmt,
        std::iter::empty::<i16>(),
        params.iter(),
        |p, buf| {
            buf.extend_from_slice(p.as_bytes());
            Ok(postgres_protocol::IsNull::No)
        },
        std::iter::empty::<i16>(),
        b,
    )
    .unwrap_or_else(|_| panic!("bind of {stmt:?}"));
}
