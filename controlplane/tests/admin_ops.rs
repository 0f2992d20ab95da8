//! The admin operations behind the REST API, against a real origin: flushes, key info, tables
//! added (and warmed) and removed at run time, live config changes.

use std::time::Duration;

use pgline_controlplane::admin::{AdminError, TableState};
use pgline_controlplane::server::Pgline;
use pgline_testkit::TestDb;
use pgline_testkit::{lab, origin};
use redis::AsyncCommands;
use serde_json::json;

const SCHEMA: &str = "
CREATE TABLE users (id int8 PRIMARY KEY, name text NOT NULL);
INSERT INTO users SELECT g, 'user ' || g FROM generate_series(1, 50) g;
CREATE TABLE orders (tenant int4, id int4, total numeric, PRIMARY KEY (tenant, id));
INSERT INTO orders SELECT g % 3, g, g * 10 FROM generate_series(1, 30) g;
";

/// Whether a GET of a (row) key is served from the store: the hit counter moves.
async fn is_hit(p: &Pgline, r: &mut redis::aio::MultiplexedConnection, key: &str) -> bool {
    let hits = p.shared.total(|s| &s.keys_hit);
    let _: Option<String> = r.get(key).await.unwrap();
    p.shared.total(|s| &s.keys_hit) > hits
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushes_and_key_info() {
    let db = TestDb::create("adm_flush").await;
    let origin = db.client().await;
    origin.batch_execute(SCHEMA).await.unwrap();
    let p = lab::start(lab::config(&db, 1)).await;
    let mut r = lab::redis(&p).await;

    // Tables.
    let names: Vec<String> = p.tables().into_iter().map(|t| t.name).collect();
    assert_eq!(names, ["public.orders", "public.users"]);
    let orders = p.table("orders").expect("orders by prefix");
    assert_eq!(orders.key_template, "orders:{tenant}:{id}");
    assert_eq!(orders.primary_key, ["tenant", "id"]);
    assert_eq!(orders.columns, 3);
    assert_eq!(orders.state, TableState::Active);
    assert_eq!(p.table("public.users").unwrap().name, "public.users");
    assert!(p.table("nosuch").is_none());

    // Key info before and after a GET.
    let info = p.key_info("users:7").await.unwrap();
    assert!(!info.cached, "{info:?}");
    assert_eq!(info.table.as_deref(), Some("public.users"));
    assert_eq!(info.reason.as_deref(), Some("evicted or never read"));
    let _: Option<String> = r.get("users:7").await.unwrap();
    let info = p.key_info("users:7").await.unwrap();
    assert!(
        info.cached && !info.negative && info.reason.is_none(),
        "{info:?}"
    );
    let lsn1 = info.lsn.clone().expect("an LSN");
    assert!(lsn1.contains('/'), "{lsn1}");
    assert!(info.size_bytes.unwrap() > 20, "{info:?}");
    assert!(info.age_ms.unwrap() < 10_000, "{info:?}");

    // An UPDATE refreshes the entry in place: the LSN moves forward.
    origin
        .batch_execute("UPDATE users SET name = 'changed' WHERE id = 7")
        .await
        .unwrap();
    lab::sync(&p, &origin).await;
    let info = p.key_info("users:7").await.unwrap();
    assert!(info.cached, "{info:?}");
    let lsn2 = info.lsn.clone().unwrap();
    let parse = |s: &str| {
        let (hi, lo) = s.split_once('/').unwrap();
        (u64::from_str_radix(hi, 16).unwrap() << 32) | u64::from_str_radix(lo, 16).unwrap()
    };
    assert!(parse(&lsn2) > parse(&lsn1), "{lsn1} -> {lsn2}");

    // Negative entries, unknown prefixes, non-canonical and malformed keys.
    let _: Option<String> = r.get("users:999").await.unwrap();
    let info = p.key_info("users:999").await.unwrap();
    assert!(info.cached && info.negative, "{info:?}");
    let info = p.key_info("nosuch:1").await.unwrap();
    assert_eq!(
        (info.cached, info.table, info.reason.as_deref()),
        (false, None, Some("unknown table prefix"))
    );
    let info = p.key_info("users:007").await.unwrap();
    assert!(
        info.reason.as_deref().unwrap().contains("spelling"),
        "{info:?}"
    );
    assert!(matches!(
        p.key_info("users").await,
        Err(AdminError::BadRequest(_))
    ));

    // Flush one key: it misses again.
    assert!(is_hit(&p, &mut r, "users:7").await);
    assert_eq!(p.flush_key("users:7").await.unwrap(), 1);
    assert_eq!(p.flush_key("users:7").await.unwrap(), 0);
    assert!(!p.key_info("users:7").await.unwrap().cached);
    assert!(
        !is_hit(&p, &mut r, "users:7").await,
        "flushed key must miss"
    );
    assert!(matches!(
        p.flush_key("nosuch:1").await,
        Err(AdminError::NotFound(_))
    ));

    // Flush a table: its keys miss again, the other table's stay.
    let _: Option<String> = r.get("users:8").await.unwrap();
    let _: Option<String> = r.get("orders:1:4").await.unwrap();
    let n = p.flush_table("public.users").await.unwrap();
    assert_eq!(n, 3, "users 7, 8 and the negative 999");
    assert!(!is_hit(&p, &mut r, "users:8").await);
    assert!(is_hit(&p, &mut r, "orders:1:4").await);
    assert!(matches!(
        p.flush_table("nosuch").await,
        Err(AdminError::NotFound(_))
    ));
    let before = p.store_stats().entries;
    assert_eq!(before, 2, "orders:1:4 and the refilled users:8");
    assert_eq!(p.flush_all().await, before);
    assert_eq!(p.store_stats().entries, 0);

    assert!(p.pool_status().max_size >= 1);
    p.shutdown().await;
}

/// Waits (up to 10 s) until the writer has published `serve_hits == want`.
async fn wait_serve_hits(p: &Pgline, want: bool) -> bool {
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while p.shared.serve_hits() != want {
        if std::time::Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    true
}

/// Rows of table `table_id` cached as rows (not negative), from the writer's dump.
async fn cached_rows(p: &Pgline, table_id: u32) -> usize {
    p.dump()
        .await
        .iter()
        .filter(|e| e.table == table_id && e.json.is_some())
        .count()
}

async fn published(origin: &tokio_postgres::Client, table: &str) -> bool {
    origin
        .query_opt(
            "SELECT 1 FROM pg_publication_tables WHERE pubname = 'pgline' AND tablename = $1",
            &[&table],
        )
        .await
        .unwrap()
        .is_some()
}

const LATE_ROWS: i64 = 2000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_warm_and_remove_a_table_at_run_time() {
    let db = TestDb::create("adm_tables").await;
    let origin = db.client().await;
    origin.batch_execute(SCHEMA).await.unwrap();
    // A table list: the publication lists tables, so adding one must ALTER it.
    let mut cfg = lab::config(&db, 2);
    cfg.catalog.tables = vec!["users".into()];
    let p = lab::start(cfg).await;
    let mut r = lab::redis(&p).await;

    origin
        .batch_execute(&format!(
            "CREATE TABLE late (id int8 PRIMARY KEY, v int4 NOT NULL);
             INSERT INTO late SELECT g, 0 FROM generate_series(1, {LATE_ROWS}) g;
             CREATE TABLE nokey (v int4);"
        ))
        .await
        .unwrap();
    assert_eq!(
        p.key_info("late:1").await.unwrap().reason.as_deref(),
        Some("unknown table prefix")
    );
    assert!(!published(&origin, "late").await);
    assert!(matches!(
        p.add_table("nosuch", false).await,
        Err(AdminError::NotFound(_))
    ));
    assert!(matches!(
        p.add_table("nokey", false).await,
        Err(AdminError::BadRequest(_))
    ));
    assert!(matches!(
        p.add_table("users", false).await,
        Err(AdminError::Conflict(_))
    ));

    // Small batches with a held fill: warming takes a while, and writes land during it.
    p.patch_config(&json!({"origin": {"fill_batch": 50, "fill_delay_ms": 20}}))
        .unwrap();
    let writes = {
        let conn = db.conn_string();
        tokio::spawn(async move {
            let c = origin::connect(&conn).await;
            let mut n = 0i64;
            loop {
                let id = (n * 7919) % LATE_ROWS + 1;
                c.execute("UPDATE late SET v = v + 1 WHERE id = $1", &[&id])
                    .await
                    .unwrap();
                n += 1;
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
    };
    let status = p.add_table("public.late", true).await.unwrap();
    assert_eq!(status.name, "public.late");
    assert_eq!(status.key_template, "late:{id}");
    assert!(
        matches!(status.state, TableState::Warming { .. }),
        "{status:?}"
    );
    assert!(published(&origin, "late").await, "added to the publication");
    assert!(p
        .effective_config()
        .catalog
        .tables
        .contains(&"public.late".to_string()));

    let mut progress_seen = false;
    let until = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let t = p.table("late").unwrap();
        match t.state {
            TableState::Active => break,
            TableState::Warming { done, total } => {
                assert!(done <= total, "{t:?}");
                progress_seen |= done > 0 && done < total;
            }
            TableState::Failed { detail } => panic!("warming failed: {detail}"),
        }
        assert!(std::time::Instant::now() < until, "warming never ended");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(progress_seen, "progress between 0 and total was visible");
    writes.abort();
    let _ = writes.await;
    p.patch_config(&json!({"origin": {"fill_delay_ms": 0}}))
        .unwrap();
    lab::sync(&p, &origin).await;

    let late = p.catalog.snapshot().find("late").unwrap().id;
    assert_eq!(
        cached_rows(&p, late).await,
        LATE_ROWS as usize,
        "every row is cached after warming"
    );
    let stale = lab::stale_entries(&p, &origin).await;
    assert!(
        stale.is_empty(),
        "stale after warming under writes: {stale:?}"
    );
    // The writer's periodic count catches up with the warmed rows.
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while p.table("late").unwrap().entries != Some(LATE_ROWS as u64) {
        assert!(
            std::time::Instant::now() < until,
            "entries never counted: {:?}",
            p.table("late")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(is_hit(&p, &mut r, "late:1999").await);
    // The WAL stream carries the added table: an UPDATE refreshes the cached row.
    origin
        .batch_execute("UPDATE late SET v = -5 WHERE id = 1999")
        .await
        .unwrap();
    lab::sync(&p, &origin).await;
    let v: Option<String> = r.get("late:1999").await.unwrap();
    assert_eq!(v.as_deref(), Some(r#"{"id":1999,"v":-5}"#));

    // Remove: keys answer as an unknown table, the publication and config drop it.
    let flushed = p.remove_table("late").await.unwrap();
    assert_eq!(flushed, LATE_ROWS as u64);
    assert!(p.table("late").is_none());
    assert!(p.tables().iter().all(|t| t.name != "public.late"));
    let info = p.key_info("late:1").await.unwrap();
    assert_eq!(
        (info.cached, info.table, info.reason.as_deref()),
        (false, None, Some("unknown table prefix"))
    );
    let v: Option<String> = r.get("late:1").await.unwrap();
    assert_eq!(v, None, "an unknown table's key reads as absent");
    assert_eq!(cached_rows(&p, late).await, 0);
    assert!(!published(&origin, "late").await);
    assert!(!p
        .effective_config()
        .catalog
        .tables
        .contains(&"public.late".to_string()));
    assert!(matches!(
        p.remove_table("late").await,
        Err(AdminError::NotFound(_))
    ));

    // Written while removed, then added back (no warming): nothing old is served.
    origin
        .batch_execute("UPDATE late SET v = 77 WHERE id = 1999")
        .await
        .unwrap();
    let status = p.add_table("late", false).await.unwrap();
    assert_eq!(status.state, TableState::Active);
    let v: Option<String> = r.get("late:1999").await.unwrap();
    assert_eq!(v.as_deref(), Some(r#"{"id":1999,"v":77}"#));
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_patches() {
    let db = TestDb::create("adm_config").await;
    let origin = db.client().await;
    origin.batch_execute(SCHEMA).await.unwrap();
    let mut cfg = lab::config(&db, 1);
    // A lost stream stays lost for a while, so the lag bound decides whether hits flow.
    cfg.replication.reconnect_backoff_ms = 8_000;
    let p = lab::start(cfg).await;

    // Secrets never leave; sending the effective config back changes nothing.
    let eff = p.effective_config();
    assert!(
        eff.origin.url.contains("password=***"),
        "{}",
        eff.origin.url
    );
    assert!(!eff.origin.url.contains("pgline"), "{}", eff.origin.url);
    let whole = serde_json::to_value(&eff).unwrap();
    p.patch_config(&whole)
        .expect("an unchanged config is accepted");
    p.patch_config(&json!({})).unwrap();

    // Restart-only and bad values.
    match p.patch_config(&json!({"resp": {"listen": "127.0.0.1:7777"}})) {
        Err(AdminError::RestartRequired(d)) => assert!(d.contains("resp.listen"), "{d}"),
        other => panic!("{other:?}"),
    }
    match p.patch_config(&json!({"replication": {"max_lag_ms": "soon"}})) {
        Err(AdminError::BadRequest(d)) => assert!(d.contains("invalid type"), "{d}"),
        other => panic!("{other:?}"),
    }
    match p.patch_config(&json!({"origin": {"pool_size": 0}})) {
        Err(AdminError::BadRequest(d)) => assert!(d.contains("origin.pool_size"), "{d}"),
        other => panic!("{other:?}"),
    }
    match p.patch_config(&json!({"resp": {"corez": 2}})) {
        Err(AdminError::BadRequest(d)) => assert!(d.contains("corez"), "{d}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        p.patch_config(&json!({"replication": {"max_lag_ms": null}})),
        Err(AdminError::BadRequest(_))
    ));
    assert!(matches!(
        p.patch_config(&json!([1])),
        Err(AdminError::BadRequest(_))
    ));
    // Nothing of a refused patch was applied.
    assert_eq!(p.effective_config().resp.listen, eff.resp.listen);

    // log.level: live only with a reload hook; a bad filter is refused by the hook.
    assert!(matches!(
        p.patch_config(&json!({"log": {"level": "debug"}})),
        Err(AdminError::RestartRequired(_))
    ));
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let hook = seen.clone();
    p.set_log_reload(Box::new(move |level| {
        if level.contains('!') {
            return Err("bad filter".into());
        }
        hook.lock().unwrap().push(level.to_string());
        Ok(())
    }));
    let new = p.patch_config(&json!({"log": {"level": "debug"}})).unwrap();
    assert_eq!(new.log.level, "debug");
    assert_eq!(*seen.lock().unwrap(), ["debug"]);
    assert!(matches!(
        p.patch_config(&json!({"log": {"level": "!!"}})),
        Err(AdminError::BadRequest(_))
    ));
    assert_eq!(p.effective_config().log.level, "debug");

    // Pool size and key prefixes change live.
    p.patch_config(&json!({"origin": {"pool_size": 6}}))
        .unwrap();
    assert_eq!(p.pool_status().max_size, 6);
    p.patch_config(&json!({"catalog": {"prefixes": {"users": "u"}}}))
        .unwrap();
    let mut r = lab::redis(&p).await;
    let until = std::time::Instant::now() + Duration::from_secs(15);
    while p.key_info("u:1").await.unwrap().table.is_none() {
        assert!(std::time::Instant::now() < until, "prefix u never resolved");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let v: Option<String> = r.get("u:1").await.unwrap();
    assert_eq!(v.as_deref(), Some(r#"{"id":1,"name":"user 1"}"#));

    // Per-table switch: a disabled table's entries go, its reads pass through uncached.
    let _: Option<String> = r.get("users:4").await.unwrap();
    assert!(p.key_info("users:4").await.unwrap().cached);
    match p.patch_config(&json!({"catalog": {"disabled": ["nosuch"]}})) {
        Err(AdminError::BadRequest(d)) => assert!(d.contains("nosuch"), "{d}"),
        other => panic!("{other:?}"),
    }
    p.patch_config(&json!({"catalog": {"disabled": ["users"]}}))
        .unwrap();
    let until = std::time::Instant::now() + Duration::from_secs(15);
    while p.key_info("users:4").await.unwrap().cached {
        assert!(std::time::Instant::now() < until, "disabling never flushed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!p.table("users").unwrap().enabled);
    assert!(p.table("orders").unwrap().enabled);
    for _ in 0..2 {
        let v: Option<String> = r.get("users:4").await.unwrap();
        assert_eq!(v.as_deref(), Some(r#"{"id":4,"name":"user 4"}"#));
    }
    let info = p.key_info("users:4").await.unwrap();
    assert!(!info.cached, "{info:?}");
    assert!(
        info.reason.as_deref().unwrap().contains("disabled"),
        "{info:?}"
    );
    p.patch_config(&json!({"catalog": {"disabled": []}}))
        .unwrap();
    // The writer takes the change on its next turn; a GET before it still passes through.
    let until = std::time::Instant::now() + Duration::from_secs(15);
    while !p.key_info("users:4").await.unwrap().cached {
        assert!(
            std::time::Instant::now() < until,
            "enabled again, yet never cached"
        );
        let _: Option<String> = r.get("users:4").await.unwrap();
    }
    assert!(
        is_hit(&p, &mut r, "users:4").await,
        "enabled again: served from the store"
    );
    assert!(p.table("users").unwrap().enabled);

    // replication.max_lag_ms: with the stream cut, the lag grows from the last moment the cache
    // was known current, and hits flow exactly while it is under the bound (the 10 s default
    // here). The writer publishes the decision on its own turn, so the test waits for it
    // instead of sleeping.
    let _: Option<String> = r.get("users:3").await.unwrap();
    assert!(is_hit(&p, &mut r, "users:3").await);
    origin
        .execute(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
             WHERE slot_name = $1 AND active_pid IS NOT NULL",
            &[&lab::slot_name(&db)],
        )
        .await
        .unwrap();
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while p.repl.streaming.load(std::sync::atomic::Ordering::Acquire) {
        assert!(std::time::Instant::now() < until, "stream never dropped");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let lag = || p.shared.replication().lag_ms();
    assert!(
        is_hit(&p, &mut r, "users:3").await,
        "10 s bound, stream down: still a hit (lag {} ms)",
        lag()
    );
    p.patch_config(&json!({"replication": {"max_lag_ms": 100}}))
        .unwrap();
    assert!(
        wait_serve_hits(&p, false).await,
        "a 100 ms bound stops hits (lag {} ms)",
        lag()
    );
    assert!(!is_hit(&p, &mut r, "users:3").await);
    let info = p.key_info("users:3").await.unwrap();
    assert!(
        info.cached && info.reason.as_deref().unwrap().contains("paused"),
        "{info:?}"
    );
    p.patch_config(&json!({"replication": {"max_lag_ms": 60_000}}))
        .unwrap();
    assert!(wait_serve_hits(&p, true).await, "lag {} ms", lag());
    assert!(
        is_hit(&p, &mut r, "users:3").await,
        "a 60 s bound serves again"
    );
    assert_eq!(p.effective_config().replication.max_lag_ms, 60_000);
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_table_waits_for_transactions_older_than_its_publication() {
    let db = TestDb::create("adm_wait").await;
    let origin = db.client().await;
    origin.batch_execute(SCHEMA).await.unwrap();
    origin
        .batch_execute("CREATE TABLE late (id int8 PRIMARY KEY, v int4 NOT NULL); INSERT INTO late VALUES (1, 0);")
        .await
        .unwrap();
    let mut cfg = lab::config(&db, 1);
    cfg.catalog.tables = vec!["users".into()];
    let p = std::sync::Arc::new(lab::start(cfg).await);

    // A transaction open (with an xid) before the table joins the publication.
    let older = db.client().await;
    older
        .batch_execute("BEGIN; UPDATE late SET v = 1 WHERE id = 1;")
        .await
        .unwrap();
    let adding = {
        let p = p.clone();
        tokio::spawn(async move { p.add_table("late", false).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!adding.is_finished(), "add_table did not wait");
    assert!(p.table("late").is_none());
    older.batch_execute("COMMIT").await.unwrap();
    let status = tokio::time::timeout(Duration::from_secs(10), adding)
        .await
        .expect("add_table ends once the older transaction does")
        .unwrap()
        .unwrap();
    assert_eq!(status.state, TableState::Active);
    let mut r = lab::redis(&p).await;
    let v: Option<String> = r.get("late:1").await.unwrap();
    assert_eq!(v.as_deref(), Some(r#"{"id":1,"v":1}"#));
    p.shutdown().await;
}

/// The HTTP server holds `Arc<Pgline>` and awaits these futures on a multi-threaded runtime.
#[allow(dead_code)]
fn shareable_by_an_http_server(p: &Pgline) {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>(_: T) {}
    send_sync::<Pgline>();
    send(p.add_table("t", true));
    send(p.remove_table("t"));
    send(p.flush_table("t"));
    send(p.flush_key("t:1"));
    send(p.key_info("t:1"));
    send(p.flush_all());
    send(p.shutdown());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warming_that_loses_its_table_reports_failed() {
    let db = TestDb::create("adm_fail").await;
    let origin = db.client().await;
    origin.batch_execute(SCHEMA).await.unwrap();
    let mut cfg = lab::config(&db, 1);
    cfg.catalog.tables = vec!["users".into()];
    // The periodic schema check would take the dropped table out of the catalog on its own,
    // racing the warming's failure this test is about.
    cfg.catalog.check_interval_ms = 3_600_000;
    let p = lab::start(cfg).await;
    origin
        .batch_execute(
            "CREATE TABLE doomed (id int4 PRIMARY KEY);
             INSERT INTO doomed SELECT generate_series(1, 1000);",
        )
        .await
        .unwrap();
    p.patch_config(&json!({"origin": {"fill_batch": 10, "fill_delay_ms": 50}}))
        .unwrap();
    p.add_table("doomed", true).await.unwrap();
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while !matches!(p.table("doomed").map(|t| t.state), Some(TableState::Warming { done, .. }) if done > 0)
    {
        assert!(
            std::time::Instant::now() < until,
            "warming never progressed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    origin.batch_execute("DROP TABLE doomed").await.unwrap();
    let until = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match p.table("doomed").map(|t| t.state) {
            Some(TableState::Failed { detail }) => {
                assert!(detail.contains("does not exist"), "{detail}");
                break;
            }
            other => assert!(std::time::Instant::now() < until, "never failed: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Failed warming leaves the table cached (it fills on misses), and removable.
    assert!(p.remove_table("doomed").await.is_ok());
    p.shutdown().await;
}
