//! End to end over RESP against a real origin: reads, misses, WAL coherence, the fill race.

use std::time::Duration;

use pgline_testkit::lab;
use pgline_testkit::origin::origin_json;
use pgline_testkit::TestDb;
use redis::AsyncCommands;

const SCHEMA: &str = "
CREATE TABLE users (id int8 PRIMARY KEY, name text NOT NULL, email varchar(80), score numeric,
                    active bool, tags text[], created timestamptz, profile jsonb);
INSERT INTO users SELECT g, 'user ' || g, 'u' || g || '@example.com', g * 1.5, g % 2 = 0,
       ARRAY['a', 'b' || g], '2024-01-01 00:00:00+00'::timestamptz + g * interval '1 hour',
       jsonb_build_object('n', g)
  FROM generate_series(1, 200) g;
CREATE TABLE orders (tenant int4, id int4, total numeric, PRIMARY KEY (tenant, id));
INSERT INTO orders SELECT g % 3, g, g * 10 FROM generate_series(1, 30) g;
";

async fn e2e(cores: usize) {
    let db = TestDb::create("e2e").await;
    let origin = db.client().await;
    origin.batch_execute(SCHEMA).await.unwrap();
    let mut cfg = lab::config(&db, cores);
    cfg.catalog.prefixes.insert("users".into(), "u".into());
    let p = lab::start(cfg).await;
    let mut r = lab::redis(&p).await;

    // GET: miss, then hit; both the origin's row_to_json text.
    for _ in 0..2 {
        let v: Option<String> = r.get("users:1").await.unwrap();
        assert_eq!(v, origin_json(&origin, "users", 1).await);
    }
    // The real redis-cli, as a user would type it.
    let addr = p.local_addr();
    let out = std::process::Command::new("redis-cli")
        .args([
            "-h",
            &addr.ip().to_string(),
            "-p",
            &addr.port().to_string(),
            "GET",
            "users:1",
        ])
        .output()
        .expect("redis-cli (Debian package redis-tools) runs");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim_end(),
        origin_json(&origin, "users", 1).await.unwrap(),
        "redis-cli GET users:1"
    );
    let v: Option<String> = r.get("public.users:2").await.unwrap();
    assert_eq!(v, origin_json(&origin, "users", 2).await);
    let v: Option<String> = r.get("u:2").await.unwrap();
    assert_eq!(
        v,
        origin_json(&origin, "users", 2).await,
        "configured prefix names the same table"
    );
    let v: Option<String> = r.get("orders:1:4").await.unwrap();
    assert_eq!(v.as_deref(), Some(r#"{"tenant":1,"id":4,"total":40}"#));
    let v: Option<String> = r.get("users:999999").await.unwrap();
    assert_eq!(v, None);
    let v: Option<String> = r.get("users:042").await.unwrap();
    assert_eq!(v, None, "non-canonical key text must not alias row 42");
    let v: Option<String> = r.get("nosuchtable:1").await.unwrap();
    assert_eq!(v, None);

    // MGET of 64 keys mixing hits, misses and absent rows, in order.
    let ids: Vec<i64> = (0..64)
        .map(|i| if i % 5 == 0 { 100_000 + i } else { i * 3 + 1 })
        .collect();
    let keys: Vec<String> = ids.iter().map(|i| format!("users:{i}")).collect();
    let _: Option<String> = r.get("users:4").await.unwrap(); // one of them already cached
    for _ in 0..2 {
        let got: Vec<Option<String>> = redis::cmd("MGET")
            .arg(&keys)
            .query_async(&mut r)
            .await
            .unwrap();
        for (i, id) in ids.iter().enumerate() {
            assert_eq!(
                got[i],
                origin_json(&origin, "users", *id).await,
                "MGET element {i} (users:{id})"
            );
        }
    }

    // Hash view of a row.
    let name: Option<String> = r.hget("users:3", "name").await.unwrap();
    assert_eq!(name.as_deref(), Some("user 3"));
    let fields: Vec<Option<String>> = redis::cmd("HMGET")
        .arg("users:3")
        .arg("id")
        .arg("nope")
        .arg("active")
        .query_async(&mut r)
        .await
        .unwrap();
    assert_eq!(fields, vec![Some("3".into()), None, Some("f".into())]);
    let all: std::collections::HashMap<String, String> = r.hgetall("users:3").await.unwrap();
    assert_eq!(all.get("email").map(String::as_str), Some("u3@example.com"));
    let n: i64 = redis::cmd("EXISTS")
        .arg("users:1")
        .arg("users:5")
        .arg("users:999999")
        .query_async(&mut r)
        .await
        .unwrap();
    assert_eq!(n, 2);

    // CONFIG GET answers what Redis tools ask for; CONFIG SET is refused with a reason.
    let cfg: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("save")
        .arg("append*")
        .query_async(&mut r)
        .await
        .unwrap();
    assert_eq!(cfg, vec!["save", "", "appendonly", "no"]);
    let err = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("1")
        .query_async::<()>(&mut r)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not supported"), "{err}");

    // Writes answer READONLY; unknown commands ERR.
    let err = redis::cmd("SET")
        .arg("users:1")
        .arg("x")
        .query_async::<()>(&mut r)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), redis::ErrorKind::ReadOnly, "{err}");
    let err = redis::cmd("FROB")
        .query_async::<()>(&mut r)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("unknown command"), "{err}");

    // UPDATE / DELETE / INSERT / TRUNCATE reach the cache once applied.
    origin
        .batch_execute("UPDATE users SET name = 'renamed' WHERE id = 1")
        .await
        .unwrap();
    lab::sync(&p, &origin).await;
    let v: Option<String> = r.get("users:1").await.unwrap();
    assert_eq!(v, origin_json(&origin, "users", 1).await);
    assert!(v.unwrap().contains("renamed"));
    let hits_before = lab::info_field(&mut r, "keyspace_hits").await;
    let _: Option<String> = r.get("users:1").await.unwrap();
    assert!(
        lab::info_field(&mut r, "keyspace_hits").await > hits_before,
        "refreshed in place: still a hit"
    );

    origin
        .batch_execute("DELETE FROM users WHERE id = 2")
        .await
        .unwrap();
    lab::sync(&p, &origin).await;
    let v: Option<String> = r.get("users:2").await.unwrap();
    assert_eq!(v, None);

    let _: Option<String> = r.get("users:5000").await.unwrap(); // negative entry
    origin
        .batch_execute("INSERT INTO users (id, name) VALUES (5000, 'new')")
        .await
        .unwrap();
    lab::sync(&p, &origin).await;
    let v: Option<String> = r.get("users:5000").await.unwrap();
    assert_eq!(v, origin_json(&origin, "users", 5000).await);

    origin
        .batch_execute("UPDATE users SET id = 6000 WHERE id = 5000")
        .await
        .unwrap();
    lab::sync(&p, &origin).await;
    let v: Option<String> = r.get("users:5000").await.unwrap();
    assert_eq!(v, None);
    let v: Option<String> = r.get("users:6000").await.unwrap();
    assert_eq!(v, origin_json(&origin, "users", 6000).await);

    origin.batch_execute("TRUNCATE orders").await.unwrap();
    lab::sync(&p, &origin).await;
    let v: Option<String> = r.get("orders:1:4").await.unwrap();
    assert_eq!(v, None);

    let stale = lab::stale_entries(&p, &origin).await;
    assert!(stale.is_empty(), "stale entries: {stale:?}");
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_core() {
    e2e(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_cores() {
    e2e(2).await;
}

/// The fill race, forced: a fill reads the old row, a write commits and is applied, then the
/// fill lands. The lease must stop it from installing the old row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fill_race_never_installs_an_older_row() {
    let db = TestDb::create("race").await;
    let origin = db.client().await;
    origin.batch_execute(SCHEMA).await.unwrap();
    let mut cfg = lab::config(&db, 1);
    cfg.origin.fill_delay_ms = 1500;
    let p = lab::start(cfg).await;
    let mut forced = 0;
    for id in 10..16i64 {
        let mut r = lab::redis(&p).await;
        let key = format!("users:{id}");
        let before = origin_json(&origin, "users", id).await;
        let get = tokio::spawn(async move {
            let v: Option<String> = r.get(key).await.unwrap();
            v
        });
        // The fill's origin read completes well inside the delay window.
        tokio::time::sleep(Duration::from_millis(500)).await;
        origin
            .execute(
                "UPDATE users SET name = name || ' v2' WHERE id = $1",
                &[&id],
            )
            .await
            .unwrap();
        lab::sync(&p, &origin).await;
        let first = get.await.unwrap();
        if first == before {
            forced += 1; // the read really happened before the write
        }
        let mut r = lab::redis(&p).await;
        let now: Option<String> = r.get(format!("users:{id}")).await.unwrap();
        assert_eq!(
            now,
            origin_json(&origin, "users", id).await,
            "stale row installed by a raced fill"
        );
    }
    assert!(
        forced >= 3,
        "the race was forced only {forced} times out of 6"
    );
    p.shutdown().await;
}

/// A fill the origin rejects answers a clear `-ERR origin ...` for that request only; hits
/// keep flowing. (Renaming a table sends no WAL message until its next write, and the periodic
/// schema check is off, so the catalog still names `orders` and the fill's query fails.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn origin_errors_are_clear_and_hits_keep_flowing() {
    let db = TestDb::create("down").await;
    let origin = db.client().await;
    origin.batch_execute(SCHEMA).await.unwrap();
    let mut cfg = lab::config(&db, 1);
    // The periodic schema check would notice the rename and drop `orders` from the catalog
    // (turning the GET into an unknown-prefix nil): only the failing fill is tested here.
    cfg.catalog.check_interval_ms = 3_600_000;
    let p = lab::start(cfg).await;
    let mut r = lab::redis(&p).await;
    let v: Option<String> = r.get("users:7").await.unwrap();
    assert!(v.is_some());
    origin
        .batch_execute("ALTER TABLE orders RENAME TO orders_gone")
        .await
        .unwrap();
    let err = r
        .get::<_, Option<String>>("orders:1:1")
        .await
        .expect_err("a fill against a renamed table must fail");
    assert!(err.to_string().contains("origin"), "{err}");
    assert!(
        err.to_string().contains("42P01"),
        "the SQLSTATE is named: {err}"
    );
    let v: Option<String> = r.get("users:7").await.unwrap();
    assert_eq!(v, origin_json(&origin, "users", 7).await);
    p.shutdown().await;
}
