//! The PostgreSQL front end to end, against a real origin and real clients: session
//! consistency (a session never reads older than it wrote), cancel through pgline, and
//! `pgbench` (select-only from cache, TPC-B-like through pass-through).

use std::sync::Arc;
use std::time::{Duration, Instant};

use pgline_controlplane::server::Pgline;
use pgline_testkit::TestDb;
use pgline_testkit::{lab, origin, pgbench};
use tokio_postgres::NoTls;

/// A `key=value` connection string to pgline's PostgreSQL port for the test database.
fn pgline_conn(p: &Pgline, db: &TestDb) -> String {
    let addr = p.pg_addr().expect("the pgwire front is on");
    let (_, _, user, password) = origin::origin_base();
    format!(
        "host={} port={} user={user} password={password} dbname={}",
        addr.ip(),
        addr.port(),
        db.name
    )
}

async fn connect(conn: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(conn, NoTls)
        .await
        .expect("connect through pgline");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

const SCHEMA: &str = "
CREATE TABLE counters (id int8 PRIMARY KEY, n int8 NOT NULL, note text);
INSERT INTO counters SELECT g, 0, 'row ' || g FROM generate_series(1, 100) g;
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_never_reads_older_than_it_wrote() {
    let db = TestDb::create("pgw_consistency").await;
    db.client().await.batch_execute(SCHEMA).await.unwrap();
    let p = lab::start(lab::config(&db, 1)).await;
    let c = connect(&pgline_conn(&p, &db)).await;
    let update = c
        .prepare("UPDATE counters SET n = $1 WHERE id = $2")
        .await
        .unwrap();
    let select = c
        .prepare("SELECT n FROM counters WHERE id = $1")
        .await
        .unwrap();
    let iterations: i64 = std::env::var("PGLINE_CONSISTENCY_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let hits_before = p.shared.total(|s| &s.keys_hit);
    // The last value this session wrote to each id.
    let mut written = [0i64; 8];
    for i in 1..=iterations {
        let id = i % 7 + 1;
        c.execute(&update, &[&i, &id]).await.unwrap();
        written[id as usize] = i;
        let n: i64 = c.query_one(&select, &[&id]).await.unwrap().get(0);
        assert_eq!(n, i, "iteration {i}: read {n} after writing {i}");
        // A row written in an earlier iteration may come from cache: never older than written.
        let other = (i + 3) % 7 + 1;
        let m: i64 = c.query_one(&select, &[&other]).await.unwrap().get(0);
        assert_eq!(m, written[other as usize], "iteration {i}: id {other}");
    }
    let hits = p.shared.total(|s| &s.keys_hit) - hits_before;
    eprintln!("{iterations} write-then-read iterations: 0 old values; {hits} reads from cache");

    // Two sessions: a write in one becomes visible to the other within a bounded, measured lag.
    let reader = connect(&pgline_conn(&p, &db)).await;
    let reader_select = reader
        .prepare("SELECT n FROM counters WHERE id = $1")
        .await
        .unwrap();
    let mut lags = Vec::new();
    for i in 0..200i64 {
        let v = 1_000_000 + i;
        c.execute(&update, &[&v, &50i64]).await.unwrap();
        let t = Instant::now();
        loop {
            let n: i64 = reader
                .query_one(&reader_select, &[&50i64])
                .await
                .unwrap()
                .get(0);
            if n == v {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "second session still reads {n} after 30 s"
            );
        }
        lags.push(t.elapsed());
    }
    lags.sort();
    eprintln!(
        "cross-session visibility lag over 200 writes: p50 {:?}, p99 {:?}, max {:?}",
        lags[100], lags[198], lags[199]
    );
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_reaches_the_origin_backend() {
    let db = TestDb::create("pgw_cancel").await;
    let p = lab::start(lab::config(&db, 1)).await;
    let conn = pgline_conn(&p, &db);
    let origin = db.client().await;
    let mut cancelled = 0;
    for i in 0..100 {
        let c = Arc::new(connect(&conn).await);
        let token = c.cancel_token();
        // Each query is told apart at the origin by its text, so the cancel is sent once the
        // origin runs it (a cancel that arrives before the query does nothing, with or without
        // pgline in between).
        let sql = format!("SELECT pg_sleep(10) AS q{i}");
        let q = {
            let c = Arc::clone(&c);
            let sql = sql.clone();
            tokio::spawn(async move { c.simple_query(&sql).await })
        };
        let t = Instant::now();
        loop {
            let running: i64 = origin
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE query = $1 AND state = 'active'",
                    &[&sql],
                )
                .await
                .unwrap()
                .get(0);
            if running > 0 {
                break;
            }
            if q.is_finished() {
                panic!("{sql} ended before it ran: {:?}", q.await.unwrap());
            }
            if t.elapsed() > Duration::from_secs(20) {
                let rows = origin
                    .query(
                        "SELECT datname, usename, state, query FROM pg_stat_activity",
                        &[],
                    )
                    .await
                    .unwrap();
                let seen: Vec<String> = rows
                    .iter()
                    .map(|r| {
                        let f = |i| r.get::<_, Option<String>>(i).unwrap_or_default();
                        format!("{} {} {} {}", f(0), f(1), f(2), f(3))
                    })
                    .collect();
                panic!("{sql} never ran; the origin runs:\n{}", seen.join("\n"));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        token
            .cancel_query(NoTls)
            .await
            .expect("cancel request sent");
        let r = tokio::time::timeout(Duration::from_secs(9), q)
            .await
            .expect("the query ended before its 10 s sleep did")
            .unwrap();
        match r {
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::QUERY_CANCELED) => {
                cancelled += 1
            }
            other => panic!("expected 57014, got {other:?}"),
        }
    }
    assert_eq!(cancelled, 100);
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbench_runs_through_pgline() {
    let db = TestDb::create("pgw_pgbench").await;
    pgbench::run(
        &["-i", "-s", "1", "-q"],
        &pgbench::env(origin::origin_addr(), &db.name),
    );
    let p = lab::start(lab::config(&db, 1)).await;
    let pgline_env = pgbench::env(p.pg_addr().unwrap(), &db.name);
    for mode in ["prepared", "simple"] {
        let hits = p.shared.total(|s| &s.keys_hit);
        let out = pgbench::run(&["-S", "-n", "-M", mode, "-c", "4", "-T", "3"], &pgline_env);
        assert!(out.contains("number of failed transactions: 0"), "{out}");
        eprintln!(
            "pgbench -S -M {mode}: {} reads from cache\n{}",
            p.shared.total(|s| &s.keys_hit) - hits,
            out.lines()
                .filter(|l| l.starts_with("tps"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    let out = pgbench::run(
        &["-n", "-M", "prepared", "-c", "4", "-t", "300"],
        &pgline_env,
    );
    assert!(out.contains("number of failed transactions: 0"), "{out}");

    // The balances agree with each other and with the history, on the origin...
    let origin = db.client().await;
    let sums = "SELECT (SELECT sum(abalance) FROM pgbench_accounts)::int8, \
                (SELECT sum(bbalance) FROM pgbench_branches)::int8, \
                (SELECT sum(tbalance) FROM pgbench_tellers)::int8, \
                (SELECT coalesce(sum(delta), 0) FROM pgbench_history)::int8, \
                (SELECT count(*) FROM pgbench_history)::int8";
    let o = origin.query_one(sums, &[]).await.unwrap();
    let (a, b, t, h, n): (i64, i64, i64, i64, i64) =
        (o.get(0), o.get(1), o.get(2), o.get(3), o.get(4));
    assert_eq!((a, b, t), (h, h, h), "balances disagree on the origin");
    assert_eq!(n, 4 * 300, "every transaction committed once");
    // ...and every account read through pgline (cache or not) matches the origin.
    let c = connect(&pgline_conn(&p, &db)).await;
    let read = c
        .prepare("SELECT abalance FROM pgbench_accounts WHERE aid = $1")
        .await
        .unwrap();
    let touched = origin
        .query("SELECT DISTINCT aid FROM pgbench_history", &[])
        .await
        .unwrap();
    for row in touched {
        let aid: i32 = row.get(0);
        let want: i32 = origin
            .query_one(
                "SELECT abalance FROM pgbench_accounts WHERE aid = $1",
                &[&aid],
            )
            .await
            .unwrap()
            .get(0);
        let got: i32 = c.query_one(&read, &[&aid]).await.unwrap().get(0);
        assert_eq!(got, want, "account {aid}");
    }
    p.shutdown().await;
}

/// A login role `role` (password `rpw`) that may connect to `db`.
async fn create_role(db: &TestDb, role: &str) {
    origin::admin_client()
        .await
        .batch_execute(&format!(
            "DROP ROLE IF EXISTS {role}; CREATE ROLE {role} LOGIN PASSWORD 'rpw';
             GRANT CONNECT ON DATABASE {} TO {role};",
            db.name
        ))
        .await
        .unwrap();
}

/// Drops a role of [`create_role`] that was granted `SELECT` on `counters`.
async fn drop_role(db: &TestDb, role: &str) {
    db.client()
        .await
        .batch_execute(&format!("REVOKE ALL ON counters FROM {role}"))
        .await
        .unwrap();
    origin::admin_client()
        .await
        .batch_execute(&format!(
            "REVOKE ALL ON DATABASE {} FROM {role}; DROP ROLE {role}",
            db.name
        ))
        .await
        .unwrap();
}

/// The cache holds one database's rows as `origin.url`'s role reads them: another role, or
/// the same table name in another database, must get the origin's answer, never the cache's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_cached_identity_reads_the_cache() {
    let db = TestDb::create("pgw_ident").await;
    let other_db = TestDb::create("pgw_ident_other").await;
    db.client().await.batch_execute(SCHEMA).await.unwrap();
    // Same table, different data, in another database.
    other_db
        .client()
        .await
        .batch_execute(
            "CREATE TABLE counters (id int8 PRIMARY KEY, n int8 NOT NULL, note text);
             INSERT INTO counters VALUES (1, 777, 'other database');",
        )
        .await
        .unwrap();
    let role = format!("{}_reader", db.name);
    create_role(&db, &role).await;
    db.client()
        .await
        .batch_execute(&format!("GRANT SELECT ON counters TO {role}"))
        .await
        .unwrap();

    let mut cfg = lab::config(&db, 1);
    cfg.pgwire.cache_users = Vec::new();
    let p = lab::start(cfg).await;
    let addr = p.pg_addr().unwrap();
    let (host, port) = (addr.ip(), addr.port());
    let owner = connect(&pgline_conn(&p, &db)).await;
    let q = "SELECT n, note FROM counters WHERE id = 1";
    // The cached identity reads from cache once the fill has landed and the session's fence
    // (set by its first, forwarded read) has been passed by the applied WAL.
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let hits = p.shared.total(|s| &s.keys_hit);
        owner.simple_query(q).await.unwrap();
        if p.shared.total(|s| &s.keys_hit) > hits {
            break;
        }
        assert!(Instant::now() < until, "owner reads never hit");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    // Another role: correct answers, never from cache.
    let reader = connect(&format!(
        "host={host} port={port} user={role} password=rpw dbname={}",
        db.name
    ))
    .await;
    let hits = p.shared.total(|s| &s.keys_hit);
    for _ in 0..5 {
        let row = reader.query_one(q, &[]).await.unwrap();
        assert_eq!(row.get::<_, i64>(0), 0);
    }
    assert_eq!(
        p.shared.total(|s| &s.keys_hit),
        hits,
        "another role hit the cache"
    );

    // Another database: its own row, not the cached one.
    let (_, _, user, password) = origin::origin_base();
    let elsewhere = connect(&format!(
        "host={host} port={port} user={user} password={password} dbname={}",
        other_db.name
    ))
    .await;
    for _ in 0..5 {
        let row = elsewhere.query_one(q, &[]).await.unwrap();
        assert_eq!(row.get::<_, i64>(0), 777);
        assert_eq!(row.get::<_, &str>(1), "other database");
    }
    drop((reader, elsewhere));
    p.shutdown().await;
    drop_role(&db, &role).await;
}

/// Reads a point lookup until it is answered from cache (`keys_hit` grows).
async fn until_hit(p: &Pgline, c: &tokio_postgres::Client, q: &str) {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let hits = p.shared.total(|s| &s.keys_hit);
        c.simple_query(q).await.unwrap();
        if p.shared.total(|s| &s.keys_hit) > hits {
            return;
        }
        assert!(Instant::now() < until, "{q} never hit");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A batch the cache could not have answered runs alone at the origin: no fence or state
/// query follows it, so the origin backend's last statement is the client's own (before, a
/// fence and state query followed every batch that ended idle, costing the origin more than a
/// `select 1`). Without that fence the session's cache gate closes: its next cached lookup goes
/// to the origin and brings a fence taken after everything the session did, so a write is
/// read back and nothing older is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfenced_batches_close_the_cache_gate() {
    let db = TestDb::create("pgw_gate").await;
    db.client().await.batch_execute(SCHEMA).await.unwrap();
    let p = lab::start(lab::config(&db, 1)).await;
    let c = connect(&pgline_conn(&p, &db)).await;
    let lookup = "SELECT n FROM counters WHERE id = 1";
    until_hit(&p, &c, lookup).await;

    // No fence after a plain batch: its backend's last query is the client's.
    // (A function call: a statement of constants would keep the gate open, see below.)
    let marker = "SELECT 'i15 marker', length('x')";
    c.simple_query(marker).await.unwrap();
    let seen: i64 = db
        .client()
        .await
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND query = $2",
            &[&db.name, &marker],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(seen, 1, "a fence or state query ran after the batch");

    // The plain batch closed the gate: the lookup right after it goes to the origin, and the
    // fence it brings reopens the gate.
    let hits = p.shared.total(|s| &s.keys_hit);
    c.simple_query(lookup).await.unwrap();
    assert_eq!(
        p.shared.total(|s| &s.keys_hit),
        hits,
        "served behind a closed gate"
    );
    until_hit(&p, &c, lookup).await;

    // Read-your-writes: a write (no fence) then the cached lookup reads the write, every time.
    let select = c
        .prepare("SELECT n FROM counters WHERE id = $1")
        .await
        .unwrap();
    for i in 1..=200i64 {
        c.simple_query(&format!("UPDATE counters SET n = {i} WHERE id = 1"))
            .await
            .unwrap();
        let n: i64 = c.query_one(&select, &[&1i64]).await.unwrap().get(0);
        assert_eq!(n, i, "read {n} after writing {i}");
        let n: i64 = c.query_one(&select, &[&1i64]).await.unwrap().get(0);
        assert_eq!(n, i, "second read: {n} after writing {i}");
    }

    // A driver that prepares each statement before running it (tokio-postgres with a &str:
    // `Parse Describe Sync`, then `Bind Execute Sync`) still reads from cache: a batch that
    // runs nothing leaves the gate as it was.
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let hits = p.shared.total(|s| &s.keys_hit);
        let n: i64 = c
            .query_one("SELECT n FROM counters WHERE id = $1", &[&2i64])
            .await
            .unwrap()
            .get(0);
        assert_eq!(n, 0);
        if p.shared.total(|s| &s.keys_hit) > hits {
            break;
        }
        assert!(Instant::now() < until, "prepare-then-run lookups never hit");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    // A statement of constants between lookups (a pool's health check) reads and writes
    // nothing and changes no session state: it leaves the gate open as well.
    until_hit(&p, &c, lookup).await;
    for check in ["SELECT 1", "select 1::integer AS ok", "SELECT 1"] {
        c.simple_query(check).await.unwrap();
        let hits = p.shared.total(|s| &s.keys_hit);
        c.simple_query(lookup).await.unwrap();
        assert_eq!(
            p.shared.total(|s| &s.keys_hit),
            hits + 1,
            "{check} closed the gate"
        );
    }
    p.shutdown().await;
}

/// A session that commits with `synchronous_commit = off` reads its write back, as PostgreSQL
/// does: the commit is visible at once, up to three `wal_writer_delay`s before the WAL that holds
/// it is written. The fence read `pg_current_wal_lsn()` (the written position), which could lie
/// below the commit: the cached lookup after the write's read then found the gate open and was
/// served the row as it was before the write. Now such a session's fence is the insert
/// position; a session with the setting on keeps the written one (see `lsn::visible_lsn_sql`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_asynchronous_commit_is_read_back() {
    let db = TestDb::create("pgw_async_commit").await;
    db.client().await.batch_execute(SCHEMA).await.unwrap();
    let p = lab::start(lab::config(&db, 1)).await;
    let c = connect(&pgline_conn(&p, &db)).await;
    c.batch_execute("SET synchronous_commit = off")
        .await
        .unwrap();
    let lookup = "SELECT n FROM counters WHERE id = 1";
    until_hit(&p, &c, lookup).await;
    let select = c
        .prepare("SELECT n FROM counters WHERE id = $1")
        .await
        .unwrap();
    let hits = p.shared.total(|s| &s.keys_hit);
    for i in 1..=100i64 {
        c.simple_query(&format!("UPDATE counters SET n = {i} WHERE id = 1"))
            .await
            .unwrap();
        for read in ["first", "second", "third"] {
            let n: i64 = c.query_one(&select, &[&1i64]).await.unwrap().get(0);
            assert_eq!(n, i, "{read} read: {n} after writing {i}");
        }
    }
    // The reads were not all sent to the origin: the gate opens once the WAL is applied.
    until_hit(&p, &c, lookup).await;
    assert!(p.shared.total(|s| &s.keys_hit) > hits);
    p.shutdown().await;
}

/// The setting that makes a commit asynchronous is the one in force at the commit, which the
/// session's setting at its next fence need not show: `SET LOCAL` and `set_config(.., true)` end
/// with the transaction, and a `RESET` can follow the commit. Each session below commits
/// asynchronously that way and reads its write back twice; before, its fence after the first
/// read was the written position (its setting was `on` again), below the commit, and the second
/// read was served from cache as the row was before the write. A session that names
/// `synchronous_commit` is now fenced at the insert position from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_made_asynchronous_for_one_transaction_is_read_back() {
    let db = TestDb::create("pgw_async_local").await;
    db.client().await.batch_execute(SCHEMA).await.unwrap();
    let p = lab::start(lab::config(&db, 1)).await;
    let lookup = "SELECT n FROM counters WHERE id = 1";
    type Writes<'a> = &'a dyn Fn(i64) -> Vec<String>;
    let spellings: [(&str, Writes); 3] = [
        ("SET LOCAL", &|i| {
            vec![format!(
                "BEGIN; SET LOCAL synchronous_commit = off; \
                 UPDATE counters SET n = {i} WHERE id = 1; COMMIT"
            )]
        }),
        ("set_config(.., true)", &|i| {
            vec![
                "BEGIN".into(),
                "SELECT pg_catalog.set_config('synchronous_commit', 'off', true)".into(),
                format!("UPDATE counters SET n = {i} WHERE id = 1"),
                "COMMIT".into(),
            ]
        }),
        ("SET, then RESET", &|i| {
            vec![
                "SET synchronous_commit = off".into(),
                format!("UPDATE counters SET n = {i} WHERE id = 1"),
                "RESET synchronous_commit".into(),
            ]
        }),
    ];
    let mut n = 0;
    for (spelling, writes) in spellings {
        let c = connect(&pgline_conn(&p, &db)).await;
        until_hit(&p, &c, lookup).await;
        let select = c
            .prepare("SELECT n FROM counters WHERE id = $1")
            .await
            .unwrap();
        for _ in 0..60 {
            n += 1;
            for sql in writes(n) {
                c.simple_query(&sql).await.unwrap();
            }
            for read in ["first", "second", "third"] {
                let got: i64 = c.query_one(&select, &[&1i64]).await.unwrap().get(0);
                assert_eq!(got, n, "{spelling}: {read} read: {got} after writing {n}");
            }
        }
        // The session is still served from cache once the WAL is applied.
        let hits = p.shared.total(|s| &s.keys_hit);
        until_hit(&p, &c, lookup).await;
        assert!(p.shared.total(|s| &s.keys_hit) > hits, "{spelling}");
    }
    p.shutdown().await;
}

/// The fence of a session with `synchronous_commit = off` reads the origin's insert position,
/// which points past a page's header when the last record ended at the page's start: there it
/// is moved back to the boundary (the record's end, which the applied position reaches), and
/// nowhere else. Run by the origin on positions put in place of `pg_current_wal_insert_lsn()`
/// (8 KiB pages, 16 MiB segments).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fence_position_is_moved_back_only_over_a_page_header() {
    let db = TestDb::create("pgw_fence_lsn").await;
    let c = db.client().await;
    c.batch_execute("SET synchronous_commit = off")
        .await
        .unwrap();
    let sql = pgline_controlplane::pgfront::FENCE_SQL;
    let insert = "pg_catalog.pg_current_wal_insert_lsn()";
    assert!(sql.contains(insert), "the fence reads the insert position");
    for (at, fence) in [
        ("9/3D786018", "9/3D786000"), // a page's short header
        ("9/3E000028", "9/3E000000"), // a segment's long header
        ("9/3D786028", "9/3D786028"), // a record that ended 16 bytes into a page
        ("9/3D785E68", "9/3D785E68"), // mid-page
        ("9/3D786030", "9/3D786030"),
    ] {
        let probe = sql.replace(insert, &format!("'{at}'::pg_catalog.pg_lsn"));
        let got = c.simple_query(&probe).await.unwrap();
        let row = got.iter().find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => Some(r),
            _ => None,
        });
        assert_eq!(
            row.and_then(|r| r.get(0)),
            Some(fence),
            "insert position {at}"
        );
    }
}

/// A session that connects after a write committed at the origin reads that write, as a new
/// PostgreSQL session does, even while pgline's WAL is behind it: the login brings a fence (the
/// origin's WAL position at login), so until the WAL applied reaches it the session's lookups
/// go to the origin. Before, a new session's gate opened at login with no fence: right after a
/// large transaction held the WAL back, it read the row as it was before the write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_session_reads_what_committed_before_it_connected() {
    let db = TestDb::create("pgw_login_fence").await;
    db.client()
        .await
        .batch_execute(&format!("{SCHEMA} CREATE TABLE bulk (n int8);"))
        .await
        .unwrap();
    let p = lab::start(lab::config(&db, 1)).await;
    let conn = pgline_conn(&p, &db);
    let lookup = "SELECT n FROM counters WHERE id = 1";
    until_hit(&p, &connect(&conn).await, lookup).await;
    let origin = db.client().await;
    let mut behind = 0;
    for i in 1..=6i64 {
        // A large transaction ahead of the write keeps pgline's WAL behind it for a while.
        origin
            .batch_execute(&format!(
                "INSERT INTO bulk SELECT g FROM generate_series(1, {}) g",
                100_000 * i
            ))
            .await
            .unwrap();
        origin
            .execute("UPDATE counters SET n = $1 WHERE id = 1", &[&i])
            .await
            .unwrap();
        let row = origin
            .query_one("SELECT pg_current_wal_lsn()::text", &[])
            .await
            .unwrap();
        let written = pgline_controlplane::lsn::parse_lsn(row.get(0)).unwrap();
        let c = connect(&conn).await;
        let n: i64 = c.query_one(lookup, &[]).await.unwrap().get(0);
        let lagging = p.applied_lsn() < written;
        assert_eq!(n, i, "a new session read {n} after {i} was committed");
        if lagging {
            behind += 1;
            if behind == 2 {
                break;
            }
        }
        // Caught up: the row is served from cache again before the next round.
        until_hit(&p, &c, lookup).await;
    }
    assert!(
        behind > 0,
        "the WAL was never behind a new session's read: the test proves nothing"
    );
    p.shutdown().await;
}

/// A role that may not call `pg_current_wal_lsn()` (an administrator revoked it) still logs
/// in and gets the origin's answers; without a fence it reads nothing from cache, and its
/// session is not asked for the fence again. Before the login fence, such a session was served
/// from cache from its first read with no fence at all (this test failed on "served from cache
/// without a fence"); with the first login fence its login failed; and a refused fence after a
/// batch dropped the session's backend as if it had died, which for a role whose login only the
/// client can replay closed the session at its next batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_denied_the_wal_position_logs_in_and_reads_the_origin() {
    let db = TestDb::create("pgw_no_lsn").await;
    let role = format!("{}_r", db.name);
    create_role(&db, &role).await;
    db.client()
        .await
        .batch_execute(&format!(
            "{SCHEMA} GRANT SELECT ON counters TO {role};
             REVOKE EXECUTE ON FUNCTION pg_catalog.pg_current_wal_lsn() FROM PUBLIC;"
        ))
        .await
        .unwrap();
    let mut cfg = lab::config(&db, 1);
    cfg.pgwire.cache_users = vec![role.clone()];
    let p = lab::start(cfg).await;
    let addr = p.pg_addr().unwrap();
    let reader = connect(&format!(
        "host={} port={} user={role} password=rpw dbname={}",
        addr.ip(),
        addr.port(),
        db.name
    ))
    .await;
    let hits = p.shared.total(|s| &s.keys_hit);
    for id in [1i64, 2, 1, 1] {
        let row = reader
            .query_one("SELECT n, note FROM counters WHERE id = $1", &[&id])
            .await
            .unwrap();
        assert_eq!(row.get::<_, &str>(1), format!("row {id}"));
    }
    assert_eq!(
        p.shared.total(|s| &s.keys_hit),
        hits,
        "served from cache without a fence"
    );
    drop(reader);
    p.shutdown().await;
    drop_role(&db, &role).await;
}

/// pgline's `pgline_pgwire_backend_steals_total`.
async fn steals(p: &Pgline) -> u64 {
    let api = format!("http://{}", p.api_addr().expect("the API is on"));
    lab::metric(&api, "pgline_pgwire_backend_steals_total").await as u64
}

/// More sessions than backends, each preparing and running `SELECT 1` (the health check every
/// pool sends), simple and extended: the core marks these batches state-free, so their backend
/// goes back to the pool and no session has to read another's state before using its backend.
/// Any other statement still leaves its backend reserved, and then sessions do take each
/// other's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn constant_selects_give_their_backend_back() {
    let db = TestDb::create("pgw_state_free").await;
    let mut cfg = lab::config(&db, 1);
    cfg.pgwire.pool_size = 2;
    cfg.api.open_reads = true;
    let p = lab::start(cfg).await;
    let conn = pgline_conn(&p, &db);
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(connect(&conn).await);
    }
    for round in 0..10 {
        for c in &clients {
            c.simple_query("SELECT 1").await.unwrap();
            let st = c.prepare("SELECT CAST('7' AS integer)").await.unwrap();
            let v: i32 = c.query_one(&st, &[]).await.unwrap().get(0);
            assert_eq!(v, 7, "round {round}");
        }
    }
    assert_eq!(steals(&p).await, 0);
    for c in &clients {
        c.simple_query("SELECT lower('A')").await.unwrap();
    }
    assert!(steals(&p).await > 0, "reserved backends were taken");
    p.shutdown().await;
}
