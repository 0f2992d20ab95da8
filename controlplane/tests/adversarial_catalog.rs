//! Adversarial tests of what pgline caches and publishes (issue 11: F4, O1, C6, C7, C8), each
//! against a real origin and a real pgline, through its real ports (HTTP API, RESP).

mod common;
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::TestDb;
use pgline_controlplane::server::Pgline;
use serde_json::{json, Value};

const TOKEN: &str = "adversarial-catalog-token";

/// Starts pgline on `db` with an API token and `sets` layered on the test config.
async fn start(db: &TestDb, sets: &[&str]) -> Arc<Pgline> {
    let mut cfg = support::config(db, 1);
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
    support::start(cfg).await
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
    let mut r = support::redis(&p).await;
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
    let mut cfg = support::config(&db, 1);
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

/// Polls `f` until it returns true or `deadline` passes.
#[allow(dead_code)]
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
