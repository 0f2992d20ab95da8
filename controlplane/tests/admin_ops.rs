//! The admin operations behind the REST API, against a real origin: flushes, key info, tables
//! added (and warmed) and removed at run time, live config changes.

mod common;
mod support;

use std::time::Duration;

use common::TestDb;
use pgline_controlplane::admin::{AdminError, TableState};
use pgline_controlplane::server::Pgline;
use redis::AsyncCommands;
use serde_json::json;

const SCHEMA: &str = "
CREATE TABLE users (id int8 PRIMARY KEY, name text NOT NULL);
INSERT INTO users SELECT g, 'user ' || g FROM generate_series(1, 50) g;
CREATE TABLE orders (tenant int4, id int4, total numeric, PRIMARY KEY (tenant, id));
INSERT INTO orders SELECT g % 3, g, g * 10 FROM generate_series(1, 30) g;
";

/// A GET that must be served from the store: the miss counter does not move.
async fn is_hit(p: &Pgline, r: &mut redis::aio::MultiplexedConnection, key: &str) -> bool {
    let misses = p.shared.total(|s| &s.keys_miss);
    let _: Option<String> = r.get(key).await.unwrap();
    p.shared.total(|s| &s.keys_miss) == misses
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushes_and_key_info() {
    let db = TestDb::create("adm_flush").await;
    let origin = db.client().await;
    origin.batch_execute(SCHEMA).await.unwrap();
    let p = support::start(support::config(&db, 1)).await;
    let mut r = support::redis(&p).await;

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
    support::sync(&p, &origin).await;
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
