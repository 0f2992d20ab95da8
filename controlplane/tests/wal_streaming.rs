//! Streamed (in-progress) transactions against the real origin: pgoutput 2+ with
//! `streaming 'on'`, forced cheaply by `logical_decoding_work_mem = 64kB` on the test's database
//! (the walsender of a database-bound logical slot takes the database's settings; no global
//! setting changes). Checks:
//! - a large transaction past `replication.max_txn_memory` does not stall small transactions
//!   committed meanwhile, keeps the buffered bytes under the bound, and leaves no stale entry
//!   after it commits (it is applied as a flush of its tables);
//! - a large ROLLBACK leaves every cached entry as it was (and does not flush them);
//! - `ROLLBACK TO SAVEPOINT` inside a streamed transaction drops exactly the subtransaction's
//!   rows.
//!
//! The big transaction has `PGLINE_WAL_STREAMING_ROWS` rows (default 200000; the 10M
//! run sets 10000000, see deploy/lab/test.sh).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pgline_controlplane::server::Pgline;
use pgline_controlplane::wal::conn::max_proto_version;
use pgline_controlplane::wal::ReplicationConn;
use pgline_testkit::lab;
use pgline_testkit::origin::origin_lsn;
use pgline_testkit::TestDb;

/// Cached keys of the big table.
const CACHED: i64 = 2_000;
/// `replication.max_txn_memory` of the big-transaction test (the config's minimum is 1 MiB).
const CAP: u64 = 4 << 20;

fn big_rows() -> i64 {
    std::env::var("PGLINE_WAL_STREAMING_ROWS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200_000)
}

/// Big transactions one at a time: each walsender of the cluster reads all of its WAL.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A test database whose walsenders stream every transaction past 64 kB.
async fn streaming_db(tag: &str) -> TestDb {
    let db = TestDb::create(tag).await;
    let admin = pgline_testkit::origin::admin_client().await;
    admin
        .batch_execute(&format!(
            "ALTER DATABASE {} SET logical_decoding_work_mem = '64kB'",
            db.name
        ))
        .await
        .expect("set logical_decoding_work_mem on the test database");
    db
}

async fn start(db: &TestDb, max_txn_memory: u64) -> Arc<Pgline> {
    let mut cfg = lab::config(db, 1);
    cfg.replication.max_txn_memory = max_txn_memory as usize;
    lab::start(cfg).await
}

/// Transactions the origin streamed on the test's slot (pg_stat_replication_slots, PG14+).
async fn streamed_txns(client: &tokio_postgres::Client, db: &TestDb) -> i64 {
    // The statistics are reported by the walsender asynchronously: poll a little.
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let row = client
            .query_opt(
                "SELECT stream_txns FROM pg_stat_replication_slots WHERE slot_name = $1",
                &[&lab::slot_name(db)],
            )
            .await
            .expect("pg_stat_replication_slots");
        let n: i64 = row.map_or(0, |r| r.get(0));
        if n > 0 || Instant::now() > until {
            return n;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn mget(r: &mut redis::aio::MultiplexedConnection, keys: &[String]) -> Vec<Option<String>> {
    let mut out = Vec::with_capacity(keys.len());
    for chunk in keys.chunks(500) {
        let got: Vec<Option<String>> = redis::cmd("MGET")
            .arg(chunk)
            .query_async(r)
            .await
            .expect("MGET");
        out.extend(got);
    }
    out
}

fn keys(table: &str, ids: impl Iterator<Item = i64>) -> Vec<String> {
    ids.map(|i| format!("{table}:{i}")).collect()
}

/// Every cached entry of `table` compared with the origin's row, by its `id` key through the
/// index (lab::stale_entries compares `id::text`, a sequential scan per key: too slow on a
/// table of millions of rows). Returns the entries that differ.
async fn stale_of(p: &Pgline, client: &tokio_postgres::Client, table: &str) -> Vec<String> {
    let id = table_id(p, table);
    let sql = format!("SELECT row_to_json(t)::text FROM {table} t WHERE id = $1::text::int8");
    let mut stale = Vec::new();
    for e in p.dump().await.into_iter().filter(|e| e.table == id) {
        let pk = String::from_utf8(e.pk).unwrap();
        let origin: Option<String> = client
            .query_opt(&sql, &[&pk])
            .await
            .expect("probe query")
            .map(|r| r.get(0));
        let cached = e.json.map(|j| String::from_utf8(j).unwrap());
        if origin != cached {
            stale.push(format!(
                "{table}:{pk}: cached {cached:?}, origin {origin:?}"
            ));
        }
    }
    stale
}

fn table_id(p: &Pgline, table: &str) -> u32 {
    p.catalog
        .snapshot()
        .find(&format!("public.{table}"))
        .map(|t| t.id)
        .expect("table in catalog")
}

async fn entries_of(p: &Pgline, table: &str) -> usize {
    let id = table_id(p, table);
    p.dump().await.iter().filter(|e| e.table == id).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn large_streamed_transaction_overflows_without_stall_or_stale() {
    let _serial = SERIAL.lock().await;
    let n = big_rows();
    let db = streaming_db("wstream_big").await;
    let origin = db.client().await;
    origin
        .batch_execute(&format!(
            "CREATE TABLE big (id int8 PRIMARY KEY, v int4 NOT NULL);
             INSERT INTO big SELECT g, 0 FROM generate_series(1, {CACHED}) g;
             CREATE TABLE small (id int4 PRIMARY KEY, v int4 NOT NULL);
             INSERT INTO small VALUES (1, 0);"
        ))
        .await
        .unwrap();
    let p = start(&db, CAP).await;
    let max_lag = Duration::from_millis(pgline_controlplane::config::DEFAULT_MAX_LAG_MS);
    let mut r = lab::redis(&p).await;
    // Cache the big table's first keys (and some negative ones past the end) and the small row.
    let big_keys = keys("big", (1..=CACHED).chain(n + 1..n + 50));
    let before = mget(&mut r, &big_keys).await;
    assert!(before[0].is_some() && before.last().unwrap().is_none());
    let _: Option<String> = redis::cmd("GET")
        .arg("small:1")
        .query_async(&mut r)
        .await
        .unwrap();

    // The big transaction: update every cached key, then insert n rows, in one transaction.
    let big_client = db.client().await;
    let started = Instant::now();
    let big = tokio::spawn(async move {
        big_client
            .batch_execute(&format!(
                "BEGIN;
                 UPDATE big SET v = 1 WHERE id <= {CACHED};
                 INSERT INTO big SELECT g, 2 FROM generate_series({CACHED} + 1, {n}) g;
                 COMMIT;"
            ))
            .await
            .expect("big transaction");
        started.elapsed()
    });

    // Meanwhile: small transactions. Each is applied within max_lag of the origin's walsender
    // reaching it (pgline never stalls on the open transaction). The walsender decodes the
    // big transaction's WAL before the small commit's, at the origin's own rate: that part
    // (`decode`) is measured and, up to 1M rows, held to max_lag as well; at 10M rows on two
    // shared cores the single decoding process falls behind the inserting backend by more
    // than that, which no consumer can change.
    let small_commits = Arc::new(AtomicU64::new(0));
    let (mut worst_apply, mut worst_total) = (Duration::ZERO, Duration::ZERO);
    let mut i = 0;
    while !big.is_finished() {
        i += 1;
        origin
            .execute("UPDATE small SET v = $1 WHERE id = 1", &[&i])
            .await
            .unwrap();
        let lsn = origin_lsn(&origin).await;
        let t = Instant::now();
        while p.repl.server_wal_end.load(Ordering::Acquire) < lsn {
            assert!(
                t.elapsed() < Duration::from_secs(600),
                "the origin never sent {lsn}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let decode = t.elapsed();
        assert!(
            p.wait_applied(lsn, max_lag).await,
            "small transaction {i} not applied within max_lag_ms ({max_lag:?}) of being sent"
        );
        worst_apply = worst_apply.max(t.elapsed() - decode);
        worst_total = worst_total.max(t.elapsed());
        if n <= 1_000_000 {
            assert!(
                t.elapsed() <= max_lag,
                "small transaction {i} took {:?} to apply (origin decode {decode:?})",
                t.elapsed()
            );
        }
        let got: Option<String> = redis::cmd("GET")
            .arg("small:1")
            .query_async(&mut r)
            .await
            .unwrap();
        assert_eq!(got, Some(format!("{{\"id\":1,\"v\":{i}}}")));
        small_commits.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let big_time = big.await.unwrap();
    // Applying what is left of a 10M-row transaction takes longer than lab::sync allows.
    let lsn = origin_lsn(&origin).await;
    assert!(
        p.wait_applied(lsn, Duration::from_secs(600)).await,
        "the big transaction was never applied"
    );
    let applied_after = started.elapsed();

    let peak = p.repl.buffered_peak_bytes.load(Ordering::Relaxed);
    let overflows = p.repl.txn_overflows.load(Ordering::Relaxed);
    let streamed = streamed_txns(&origin, &db).await;
    eprintln!(
        "rows={n} origin_commit={big_time:?} applied={applied_after:?} small_commits={} \
         worst_small_apply_after_sent={worst_apply:?} worst_small_total={worst_total:?} buffered_peak={peak} cap={CAP} overflows={overflows} \
         streamed_txns={streamed} proto={}",
        small_commits.load(Ordering::Relaxed),
        p.repl.proto_version.load(Ordering::Relaxed)
    );
    assert!(p.repl.proto_version.load(Ordering::Relaxed) >= 2);
    assert!(
        streamed >= 1,
        "the origin never streamed the big transaction"
    );
    assert!(peak > 0 && peak <= CAP, "buffered peak {peak} vs cap {CAP}");
    assert!(overflows >= 1, "the big transaction never overflowed");
    assert!(small_commits.load(Ordering::Relaxed) >= 1);
    assert_eq!(p.repl.buffered_bytes.load(Ordering::Relaxed), 0);

    // Every cached key equals the origin; re-reading gives the committed values.
    let mut stale = stale_of(&p, &origin, "big").await;
    stale.extend(stale_of(&p, &origin, "small").await);
    assert!(
        stale.is_empty(),
        "stale after the big commit: {:?}",
        &stale[..stale.len().min(5)]
    );
    let after = mget(&mut r, &big_keys).await;
    for (i, got) in after.iter().enumerate().take(CACHED as usize) {
        assert_eq!(got.clone(), Some(format!("{{\"id\":{},\"v\":1}}", i + 1)));
    }
    assert!(after[CACHED as usize..].iter().all(Option::is_none));
    assert!(stale_of(&p, &origin, "big").await.is_empty());
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn large_streamed_rollback_leaves_no_change() {
    let _serial = SERIAL.lock().await;
    let db = streaming_db("wstream_rb").await;
    let origin = db.client().await;
    origin
        .batch_execute(&format!(
            "CREATE TABLE big (id int8 PRIMARY KEY, v int4 NOT NULL);
             INSERT INTO big SELECT g, 0 FROM generate_series(1, {CACHED}) g;"
        ))
        .await
        .unwrap();
    // A small cap: the rolled-back transaction overflows, and its abort must not flush.
    let p = start(&db, 1 << 20).await;
    let mut r = lab::redis(&p).await;
    let big_keys = keys("big", (1..=CACHED).chain(500_001..500_020));
    let before = mget(&mut r, &big_keys).await;
    let cached = entries_of(&p, "big").await;
    assert_eq!(cached, big_keys.len());
    origin
        .batch_execute(
            "BEGIN;
             UPDATE big SET v = 9;
             INSERT INTO big SELECT g, 9 FROM generate_series(100001, 400000) g;
             ROLLBACK;
             UPDATE big SET v = 5 WHERE id = 1;",
        )
        .await
        .unwrap();
    lab::sync(&p, &origin).await;
    assert!(
        streamed_txns(&origin, &db).await >= 1,
        "nothing was streamed"
    );
    assert!(p.repl.txn_overflows.load(Ordering::Relaxed) >= 1);
    assert_eq!(p.repl.buffered_bytes.load(Ordering::Relaxed), 0);
    // Nothing flushed but the one updated key; nothing changed.
    assert!(entries_of(&p, "big").await >= cached - 1);
    let stale = stale_of(&p, &origin, "big").await;
    assert!(
        stale.is_empty(),
        "stale after rollback: {:?}",
        &stale[..stale.len().min(5)]
    );
    let after = mget(&mut r, &big_keys).await;
    assert_eq!(after[0].as_deref(), Some("{\"id\":1,\"v\":5}"));
    assert_eq!(after[1..], before[1..]);
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rollback_to_savepoint_in_a_streamed_transaction_drops_only_the_subtransaction() {
    let _serial = SERIAL.lock().await;
    let db = streaming_db("wstream_sp").await;
    let origin = db.client().await;
    origin
        .batch_execute(
            "CREATE TABLE t (id int8 PRIMARY KEY, v text NOT NULL);
             INSERT INTO t SELECT g, 'orig' FROM generate_series(1, 300) g;",
        )
        .await
        .unwrap();
    // Default bound: the transaction is buffered whole (no overflow), so the cut is exercised.
    let p = start(&db, pgline_controlplane::wal::DEFAULT_MAX_TXN_MEMORY as u64).await;
    let mut r = lab::redis(&p).await;
    // Cached: the 300 rows and negative entries for ids the transaction will insert.
    let probe = keys(
        "t",
        (1..=300).chain(100_001..100_050).chain(200_001..200_050),
    );
    let before = mget(&mut r, &probe).await;
    assert!(before[0].is_some() && before[310].is_none());
    origin
        .batch_execute(
            "BEGIN;
             UPDATE t SET v = 'top' WHERE id <= 100;
             INSERT INTO t SELECT g, 'top' FROM generate_series(100001, 130000) g;
             SAVEPOINT a;
             UPDATE t SET v = 'kept' WHERE id > 100 AND id <= 150;
             RELEASE SAVEPOINT a;
             SAVEPOINT b;
             UPDATE t SET v = 'gone' WHERE id <= 200;
             INSERT INTO t SELECT g, 'gone' FROM generate_series(200001, 230000) g;
             SAVEPOINT c;
             UPDATE t SET v = 'gone2' WHERE id > 250;
             ROLLBACK TO SAVEPOINT b;
             UPDATE t SET v = 'after' WHERE id > 200 AND id <= 220;
             COMMIT;",
        )
        .await
        .unwrap();
    lab::sync(&p, &origin).await;
    assert!(
        streamed_txns(&origin, &db).await >= 1,
        "nothing was streamed"
    );
    assert_eq!(p.repl.txn_overflows.load(Ordering::Relaxed), 0);
    assert_eq!(p.repl.buffered_bytes.load(Ordering::Relaxed), 0);
    assert!(p.repl.buffered_peak_bytes.load(Ordering::Relaxed) > 0);
    // The entries were updated in place (not flushed) and equal the origin.
    assert_eq!(entries_of(&p, "t").await, probe.len());
    let stale = stale_of(&p, &origin, "t").await;
    assert!(
        stale.is_empty(),
        "stale after ROLLBACK TO: {:?}",
        &stale[..stale.len().min(5)]
    );
    let got = mget(&mut r, &probe).await;
    let v = |i: usize| got[i].clone().unwrap_or_default();
    assert!(v(0).contains("\"top\""), "{}", v(0));
    assert!(v(120).contains("\"kept\""), "{}", v(120));
    assert!(v(180).contains("\"orig\""), "{}", v(180));
    assert!(v(210).contains("\"after\""), "{}", v(210));
    assert!(v(280).contains("\"orig\""), "{}", v(280));
    assert!(got[300].as_deref().is_some_and(|s| s.contains("\"top\"")));
    assert!(
        got[350..].iter().all(Option::is_none),
        "rolled-back inserts are visible"
    );
    p.shutdown().await;
}

#[tokio::test]
async fn the_servers_highest_protocol_is_used_and_a_refused_one_is_retried_lower() {
    let _serial = SERIAL.lock().await;
    let db = TestDb::create("wstream_proto").await;
    let client = db.client().await;
    client
        .batch_execute(
            "CREATE TABLE t (id int4 PRIMARY KEY); CREATE PUBLICATION pgline FOR TABLE t;",
        )
        .await
        .unwrap();
    let config = pgline_controlplane::origin::Settings::parse(&db.conn_string()).unwrap();
    // (asked first, expected): None is start_logical's own choice.
    for (n, ask) in [None, Some(9), Some(2), Some(1)].into_iter().enumerate() {
        let slot = format!("{}_p{n}", db.name);
        client
            .execute(
                "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
                &[&slot],
            )
            .await
            .unwrap();
        let mut conn = ReplicationConn::connect(&config).await.expect("connect");
        let highest = max_proto_version(conn.server_major());
        assert!(
            conn.server_major().is_some_and(|m| m >= 15),
            "{:?}",
            conn.server_major()
        );
        let expected = ask.map_or(highest, |a| a.min(highest));
        match ask {
            None => conn.start_logical(&slot, "pgline", 0).await,
            Some(a) => conn.start_logical_with(&slot, "pgline", 0, a).await,
        }
        .unwrap_or_else(|e| panic!("start with {ask:?}: {e}"));
        assert_eq!(conn.proto_version(), expected, "asked {ask:?}");
        // The stream works at that version: a keepalive comes back.
        conn.send_status(0, 0, 0, true).await.expect("status");
        let ev = tokio::time::timeout(Duration::from_secs(10), conn.recv())
            .await
            .expect("a reply in time")
            .expect("recv");
        assert!(
            matches!(
                ev,
                pgline_controlplane::wal::ReplicationEvent::Keepalive { .. }
            ),
            "{ev:?}"
        );
    }
}
