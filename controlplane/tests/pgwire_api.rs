//! The PostgreSQL front as the management API shows it, against a live pgline and a real
//! origin: statements sent through the pg port appear in `GET /v1/queries` (calls, errors,
//! bytes, mean/p99) and `pgline queries`, and the relay's figures in `/metrics`.

use std::collections::HashMap;
use std::process::Command;
use std::time::Duration;

use pgline_testkit::TestDb;
use pgline_testkit::{lab, origin};
use serde_json::Value;

const SCHEMA: &str = "
CREATE TABLE items (id int8 PRIMARY KEY, name text NOT NULL);
INSERT INTO items SELECT g, 'item ' || g FROM generate_series(1, 20) g;
";

async fn get(base: &str, path: &str) -> String {
    let resp = reqwest::get(format!("{base}{path}")).await.expect("HTTP");
    assert_eq!(resp.status(), 200, "{path}");
    resp.text().await.expect("body")
}

/// `name{labels} value` lines of an exposition → value by series.
fn samples(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_through_the_pg_port_show_in_queries_and_metrics() {
    let db = TestDb::create("pgw_api").await;
    db.client().await.batch_execute(SCHEMA).await.unwrap();
    let mut cfg = lab::config(&db, 1);
    cfg.api.open_reads = true;
    let p = lab::start(cfg).await;
    let base = format!("http://{}", p.api_addr().expect("the API is on"));
    let c = lab::pg_client(&p, &db).await;

    // Two simple queries differing in a literal: one normalized entry, 2 calls.
    for n in [1, 2] {
        c.simple_query(&format!("SELECT count(*) FROM items WHERE id > {n}"))
            .await
            .unwrap();
    }
    // A prepared write: the Parse batch and 5 executions.
    let update = c
        .prepare("UPDATE items SET name = $1 WHERE id = $2")
        .await
        .unwrap();
    for i in 1..=5i64 {
        c.execute(&update, &[&format!("renamed {i}"), &i])
            .await
            .unwrap();
    }
    // An error at the origin.
    let err = c.simple_query("SELECT 1/0").await.unwrap_err();
    assert_eq!(err.code().map(|c| c.code()), Some("22012"));

    let list: Vec<Value> = serde_json::from_str(&get(&base, "/v1/queries").await).unwrap();
    let by_text: HashMap<&str, &Value> = list
        .iter()
        .map(|q| (q["query"].as_str().unwrap(), q))
        .collect();
    let entry = |text: &str| {
        *by_text
            .get(text)
            .unwrap_or_else(|| panic!("{text} not in {list:#?}"))
    };
    let count = entry("SELECT count(*) FROM items WHERE id > $1");
    assert_eq!(
        (count["calls"].as_u64(), count["errors"].as_u64()),
        (Some(2), Some(0))
    );
    let upd = entry("UPDATE items SET name = $1 WHERE id = $2");
    assert_eq!(
        (upd["calls"].as_u64(), upd["errors"].as_u64()),
        (Some(6), Some(0))
    );
    let div = entry("SELECT $1/$2");
    assert_eq!(
        (div["calls"].as_u64(), div["errors"].as_u64()),
        (Some(1), Some(1))
    );
    for q in [count, upd, div] {
        let (mean, p99) = (
            q["mean_us"].as_u64().unwrap(),
            q["p99_us"].as_u64().unwrap(),
        );
        assert!(mean > 0 && p99 >= mean, "{q}");
        assert!(q["bytes"].as_u64().unwrap() > 0, "{q}");
    }
    let calls: Vec<u64> = list.iter().map(|q| q["calls"].as_u64().unwrap()).collect();
    assert!(
        calls.windows(2).all(|w| w[0] >= w[1]),
        "most calls first: {calls:?}"
    );

    // /metrics: the relay's figures are the sums of the same statistics.
    let m = samples(&get(&base, "/metrics").await);
    assert_eq!(m["pgline_pgwire_sessions"], 1.0);
    let total: u64 = calls.iter().sum();
    assert_eq!(m["pgline_pgwire_batches_total"], total as f64);
    let errors: u64 = list.iter().map(|q| q["errors"].as_u64().unwrap()).sum();
    assert_eq!(m["pgline_pgwire_batch_errors_total"], errors as f64);
    assert!(m["pgline_pgwire_origin_seconds_total"] > 0.0);
    let (_, _, user, _) = origin::origin_base();
    let pool = |state: &str| {
        let k = format!(
            r#"pgline_pgwire_pool_connections{{user="{user}",database="{}",state="{state}"}}"#,
            db.name
        );
        *m.get(&k).unwrap_or_else(|| panic!("{k} missing"))
    };
    // The session is idle: its backend went back to the pool, or is reserved for it (its last
    // batch asked the origin nothing, see `docs/pgwire.md`).
    assert!(
        pool("idle") + pool("reserved") >= 1.0,
        "idle {} reserved {}",
        pool("idle"),
        pool("reserved")
    );
    assert_eq!(pool("busy"), 0.0);

    // `pgline queries`: the human table and the JSON.
    let api = base.clone();
    let run = move |json: bool| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_pgline"));
        cmd.args(["queries", "--api", &api]);
        if json {
            cmd.arg("--json");
        }
        let out = cmd.output().expect("run pgline queries");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let table = tokio::task::spawn_blocking({
        let run = run.clone();
        move || run(false)
    })
    .await
    .unwrap();
    let header = table.lines().next().unwrap_or_default();
    assert!(
        header.starts_with("CALLS") && header.ends_with("QUERY"),
        "{table}"
    );
    let row = table
        .lines()
        .find(|l| l.ends_with("UPDATE items SET name = $1 WHERE id = $2"))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(row.starts_with('6'), "{row}");
    let json = tokio::task::spawn_blocking(move || run(true))
        .await
        .unwrap();
    let parsed: Vec<Value> = serde_json::from_str(&json).unwrap();
    assert!(parsed.len() >= 3, "{json}");

    drop(c);
    let gone = async {
        while p.pg_relay().unwrap().sessions() != 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(15), gone)
        .await
        .expect("the session ends when the client leaves");
    p.shutdown().await;
}
