//! Adversarial tests of what pgline caches and publishes (issue 11: F4, O1, C6, C7, C8), each
//! against a real origin and a real pgline, through its real ports (HTTP API, RESP).

use std::sync::Arc;
use std::time::{Duration, Instant};

use pgline_controlplane::server::Pgline;
use pgline_testkit::lab;
use pgline_testkit::TestDb;
use serde_json::{json, Value};

const TOKEN: &str = "adversarial-catalog-token";

/// Starts pgline on `db` with an API token and `sets` layered on the test config.
async fn start(db: &TestDb, sets: &[&str]) -> Arc<Pgline> {
    let mut cfg = lab::config(db, 1);
    let mut all: Vec<String> = vec![
        "api.listen=\"127.0.0.1:0\"".into(),
        format!("api.token=\"{TOKEN}\""),
    ];
    all.extend(sets.iter().map(|s| s.to_string()));
    let layered =
        pgline_controlplane::config::Config::load(None, Vec::<(String, String)>::new(), &all)
            .expect("test overrides");
    cfg.api = layered.api;
    cfg.catalog = layered.catalog;
    cfg.origin.query_timeout_ms = layered.origin.query_timeout_ms;
    cfg.validate().expect("valid config");
    lab::start(cfg).await
}

/// One API call: (status, body as JSON or the raw text as a JSON string).
async fn api(p: &Pgline, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
    let addr = p.api_addr().expect("the API is enabled");
    let mut req = reqwest::Client::new()
        .request(method, format!("http://{addr}{path}"))
        .bearer_auth(TOKEN)
        .timeout(Duration::from_secs(60));
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.expect("HTTP request");
    let status = resp.status().as_u16();
    let text = resp.text().await.expect("body");
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, body)
}

async fn add_table(p: &Pgline, name: &str) -> (u16, Value) {
    api(
        p,
        reqwest::Method::POST,
        "/v1/tables",
        Some(json!({ "name": name })),
    )
    .await
}

/// F4: system catalogs (`pg_catalog.pg_authid` leaked its SCRAM verifier over `HGET`),
/// `information_schema`, `pg_toast`, views, materialized views and unlogged tables are refused by
/// `POST /v1/tables` with a 4xx and a message saying why; nothing of them becomes readable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn system_catalogs_and_non_tables_are_refused_by_the_api() {
    let db = TestDb::create("adv_f4").await;
    let client = db.client().await;
    client
        .batch_execute(
            "CREATE TABLE users (id int4 PRIMARY KEY, name text);
             INSERT INTO users VALUES (1, 'a');
             CREATE VIEW v AS SELECT * FROM users;
             CREATE MATERIALIZED VIEW mv AS SELECT * FROM users;
             CREATE UNLOGGED TABLE ul (id int4 PRIMARY KEY, v text);
             INSERT INTO ul VALUES (1, 'x');",
        )
        .await
        .unwrap();
    let p = start(&db, &["catalog.tables=[\"public.users\"]"]).await;
    let toast: String = client
        .query_one(
            "SELECT n.nspname || '.' || c.relname FROM pg_class c \
             JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE c.oid = (SELECT reltoastrelid FROM pg_class WHERE relname = 'pg_authid' \
                            AND relnamespace = 'pg_catalog'::regnamespace) \
                OR (n.nspname = 'pg_toast' AND c.relkind = 't') LIMIT 1",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let cases: Vec<(String, &str)> = vec![
        ("pg_catalog.pg_authid".into(), "system catalog"),
        ("pg_authid".into(), "system catalog"),
        ("information_schema.sql_features".into(), "system catalog"),
        (toast, "system catalog"),
        ("v".into(), "view"),
        ("mv".into(), "materialized view"),
        ("ul".into(), "unlogged"),
    ];
    for (name, why) in &cases {
        let (status, body) = add_table(&p, name).await;
        assert!(
            (400..500).contains(&status),
            "POST /v1/tables {name}: {status} {body}"
        );
        let text = body.to_string();
        assert!(
            text.contains("not cacheable") && text.contains(why),
            "{name}: {text}"
        );
    }
    let mut r = lab::redis(&p).await;
    let leaked: Option<String> = redis::cmd("HGET")
        .arg("pg_authid:10")
        .arg("rolpassword")
        .query_async(&mut r)
        .await
        .unwrap_or(None);
    assert_eq!(leaked, None, "pg_authid reached the cache");
    let (_, tables) = api(&p, reqwest::Method::GET, "/v1/tables", None).await;
    let names: Vec<&str> = tables
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(names, ["public.users"]);
    // The user table still goes in and out.
    p.shutdown().await;
}

/// F4: `catalog.tables` naming a system catalog, even unqualified (`pg_authid` resolves to
/// `pg_catalog.pg_authid` on the origin), fails start-up with an error naming the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn system_catalogs_in_the_config_fail_start_up() {
    let db = TestDb::create("adv_f4cfg").await;
    let mut cfg = lab::config(&db, 1);
    cfg.catalog.tables = vec!["pg_authid".into()];
    cfg.validate()
        .expect("statically valid: only the origin knows");
    let err = match Pgline::start(cfg).await {
        Ok(p) => {
            p.shutdown().await;
            panic!("pgline started caching pg_authid");
        }
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("catalog.tables") && err.contains("system catalog"),
        "{err}"
    );
}

/// A GET over RESP: `Ok(value)` or `Err(error text)`.
async fn get(
    r: &mut redis::aio::MultiplexedConnection,
    key: &str,
) -> Result<Option<String>, String> {
    redis::cmd("GET")
        .arg(key)
        .query_async::<Option<String>>(r)
        .await
        .map_err(|e| e.to_string())
}

/// The tables publication `pub_name` publishes, as `schema.name`, sorted.
async fn published(client: &tokio_postgres::Client, pub_name: &str) -> Vec<String> {
    client
        .query(
            "SELECT schemaname || '.' || tablename FROM pg_publication_tables \
             WHERE pubname = $1 ORDER BY 1",
            &[&pub_name],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// O1: with pgline running (every-table mode, over a `FOR ALL TABLES` publication an older
/// pgline left), UPDATE and DELETE of a table without a primary key still work at the origin;
/// on old main they failed with "cannot update table ... does not have a replica identity".
/// Tables that cannot be cached answer a clear RESP error, not a nil; a table created later
/// without a key stays writable, one with a key joins the cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn origin_writes_to_tables_without_a_key_still_work() {
    let db = TestDb::create("adv_o1").await;
    let client = db.client().await;
    client
        .batch_execute(
            "CREATE TABLE users (id int4 PRIMARY KEY, name text);
             INSERT INTO users VALUES (1, 'a');
             CREATE TABLE noc (a int4, b text);
             INSERT INTO noc VALUES (1, 'x'), (2, 'y');
             CREATE UNLOGGED TABLE ul (id int4 PRIMARY KEY, v text);
             INSERT INTO ul VALUES (1, 'u');
             CREATE PUBLICATION pgline FOR ALL TABLES;",
        )
        .await
        .unwrap();
    let p = start(&db, &[]).await;
    let mut r = lab::redis(&p).await;
    assert!(get(&mut r, "users:1").await.unwrap().is_some());
    client
        .execute("UPDATE noc SET b = 'z' WHERE a = 1", &[])
        .await
        .expect("UPDATE of a table without a key works at the origin");
    client
        .execute("DELETE FROM noc WHERE a = 2", &[])
        .await
        .expect("DELETE of a table without a key works at the origin");
    assert_eq!(published(&client, "pgline").await, ["public.users"]);
    let err = get(&mut r, "noc:1")
        .await
        .expect_err("noc is not cacheable");
    assert!(
        err.contains("not cacheable") && err.contains("no primary key"),
        "{err}"
    );
    let err = get(&mut r, "ul:1").await.expect_err("ul is not cacheable");
    assert!(
        err.contains("not cacheable") && err.contains("unlogged"),
        "{err}"
    );
    let err = redis::cmd("HGET")
        .arg("public.ul:1")
        .arg("v")
        .query_async::<Option<String>>(&mut r)
        .await
        .expect_err("HGET of ul");
    assert!(err.to_string().contains("unlogged"), "{err}");
    // Tables created now: one without a key stays writable, one with a key is cached.
    client
        .batch_execute(
            "CREATE TABLE later_noc (a int4); INSERT INTO later_noc VALUES (1);
             CREATE TABLE later (id int4 PRIMARY KEY, v text); INSERT INTO later VALUES (7, 'l');",
        )
        .await
        .unwrap();
    assert!(
        eventually(Duration::from_secs(20), || {
            let mut r = r.clone();
            async move { matches!(get(&mut r, "later:7").await, Ok(Some(v)) if v.contains("\"l\"")) }
        })
        .await,
        "a new keyed table never joined the cache"
    );
    client
        .execute("UPDATE later_noc SET a = 2", &[])
        .await
        .expect("a new table without a key stays writable");
    client
        .execute("UPDATE later SET v = 'm' WHERE id = 7", &[])
        .await
        .unwrap();
    lab::sync(&p, &client).await;
    let v = get(&mut r, "later:7").await.unwrap().unwrap_or_default();
    assert!(v.contains("\"m\""), "later:7 = {v}");
    assert_eq!(
        published(&client, "pgline").await,
        ["public.later", "public.users"]
    );
    p.shutdown().await;
}

/// O1: a partitioned table is read through its parent (`GET m:pk`; on old main only the
/// partitions answered and the parent read as nil), a change to a partition reaches the
/// parent's entry, and a partition's own prefix answers an error naming the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_tables_read_through_the_parent() {
    let db = TestDb::create("adv_o1part").await;
    let client = db.client().await;
    client
        .batch_execute(
            "CREATE TABLE m (id int4 PRIMARY KEY, v text) PARTITION BY RANGE (id);
             CREATE TABLE m1 PARTITION OF m FOR VALUES FROM (0) TO (100);
             CREATE TABLE m2 PARTITION OF m FOR VALUES FROM (100) TO (200);
             INSERT INTO m VALUES (1, 'one'), (150, 'many');",
        )
        .await
        .unwrap();
    let p = start(&db, &[]).await;
    let mut r = lab::redis(&p).await;
    let one = get(&mut r, "m:1")
        .await
        .unwrap()
        .expect("m:1 through the parent");
    assert!(one.contains("\"one\""), "{one}");
    let many = get(&mut r, "m:150").await.unwrap().expect("m:150");
    assert!(many.contains("\"many\""), "{many}");
    client
        .execute("UPDATE m SET v = 'uno' WHERE id = 1", &[])
        .await
        .unwrap();
    client
        .execute("DELETE FROM m2 WHERE id = 150", &[])
        .await
        .unwrap();
    lab::sync(&p, &client).await;
    let one = get(&mut r, "m:1").await.unwrap().unwrap_or_default();
    assert!(
        one.contains("\"uno\""),
        "a change in partition m1 did not reach m:1: {one}"
    );
    assert_eq!(get(&mut r, "m:150").await.unwrap(), None);
    let err = get(&mut r, "m1:1")
        .await
        .expect_err("a partition is read through its parent");
    assert!(err.contains("partition"), "{err}");
    p.shutdown().await;
}

/// C7: `origin.fill_delay_ms` is bounded (4,000,000,000 is refused with a 400; old main took it
/// and a missed GET then hung for over 60 s), and a fill, injected delay included, never
/// outlives `origin.query_timeout_ms`: with the largest delay allowed, a missed GET answers within
/// the timeout, and the next GET after the delay is set back to 0 answers the row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fill_delay_is_bounded_and_a_fill_never_outlives_the_query_timeout() {
    let db = TestDb::create("adv_c7").await;
    let client = db.client().await;
    client
        .batch_execute(
            "CREATE TABLE users (id int4 PRIMARY KEY, name text);
             INSERT INTO users SELECT g, 'u' || g FROM generate_series(1, 10) g;",
        )
        .await
        .unwrap();
    let p = start(&db, &["origin.query_timeout_ms=1500"]).await;
    let patch = |body: Value| api(&p, reqwest::Method::PATCH, "/v1/config", Some(body));
    let (status, body) = patch(json!({"origin": {"fill_delay_ms": 4_000_000_000u64}})).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.to_string().contains("origin.fill_delay_ms"), "{body}");
    let (status, body) = patch(json!({"origin": {"fill_delay_ms": 10_000}})).await;
    assert_eq!(status, 200, "{body}");
    let mut r = lab::redis(&p).await;
    let t0 = Instant::now();
    let first = tokio::time::timeout(Duration::from_secs(8), get(&mut r, "users:1"))
        .await
        .expect("a missed GET outlived query_timeout_ms by seconds");
    let took = t0.elapsed();
    assert!(
        first.is_err(),
        "the delayed fill answered {first:?} after {took:?}"
    );
    let (status, _) = patch(json!({"origin": {"fill_delay_ms": 0}})).await;
    assert_eq!(status, 200);
    let again = tokio::time::timeout(Duration::from_secs(8), get(&mut r, "users:1"))
        .await
        .expect("GET after the delay went back to 0")
        .expect("the row");
    assert!(again.is_some_and(|v| v.contains("u1")));
    eprintln!(
        "C7: a missed GET with fill_delay_ms=10000, query_timeout_ms=1500 answered in {took:?}"
    );
    p.shutdown().await;
}

/// Polls `f` until it returns true or `deadline` passes.
async fn eventually<F, Fut>(deadline: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let until = Instant::now() + deadline;
    loop {
        if f().await {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
