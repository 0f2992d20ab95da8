//! Behaviour over RESP against a real origin: AUTH and HELLO 3, the connection limit, pipelined
//! order with mixed hits and misses, relation changes, unchanged TOAST, a dropped slot, an origin
//! outage and RESP3 through the `redis` crate. Replies are checked byte for byte where the raw
//! protocol matters (over a plain TCP stream), and against the origin's `row_to_json` otherwise.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use pgline_testkit::origin::origin_json;
use pgline_testkit::resp::{bulk, encode, show, Raw};
use pgline_testkit::TestDb;
use pgline_testkit::{lab, origin};
use redis::AsyncCommands;

/// `t`: 100 rows; ids above 100 are absent.
const SCHEMA: &str = "
CREATE TABLE t (id int4 PRIMARY KEY, v text, n int4);
INSERT INTO t SELECT g, 'value ' || g, g * 10 FROM generate_series(1, 100) g;
";

// ---- origin helpers ---------------------------------------------------------------------------

/// The RESP2 reply GET gives for row `id` of `t`: its JSON as a bulk string, or nil.
async fn get_reply(client: &tokio_postgres::Client, id: i32) -> Vec<u8> {
    match origin_json(client, "t", id).await {
        Some(j) => bulk(&j),
        None => b"$-1\r\n".to_vec(),
    }
}

async fn dbsize(r: &mut redis::aio::MultiplexedConnection) -> i64 {
    redis::cmd("DBSIZE").query_async(r).await.unwrap()
}

async fn setup(tag: &str) -> (TestDb, tokio_postgres::Client) {
    let db = TestDb::create(tag).await;
    let origin = db.client().await;
    origin.batch_execute(SCHEMA).await.unwrap();
    (db, origin)
}

// ---- 1. AUTH and HELLO 3 ----------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_is_required_and_hello_3_authenticates_and_switches_protocol() {
    let (db, origin) = setup("auth").await;
    let mut cfg = lab::config(&db, 1);
    cfg.resp.password = "s3cret".into();
    let p = lab::start(cfg).await;
    let row1 = get_reply(&origin, 1).await;

    let mut c = Raw::connect(&p).await;
    for args in [&["GET", "t:1"][..], &["PING"], &["DBSIZE"], &["HELLO", "3"]] {
        let reply = c.cmd(args).await;
        assert!(
            reply.starts_with(b"-NOAUTH "),
            "{args:?} before AUTH: {}",
            show(&reply)
        );
    }
    for args in [
        &["AUTH", "wrong"][..],
        &["AUTH", "default", "wrong"],
        &["AUTH", "someone", "s3cret"],
    ] {
        let reply = c.cmd(args).await;
        assert!(
            reply.starts_with(b"-WRONGPASS "),
            "{args:?}: {}",
            show(&reply)
        );
    }
    let reply = c.cmd(&["GET", "t:1"]).await;
    assert!(
        reply.starts_with(b"-NOAUTH "),
        "after failed AUTHs: {}",
        show(&reply)
    );
    assert_eq!(c.cmd(&["AUTH", "s3cret"]).await, b"+OK\r\n");
    assert_eq!(c.cmd(&["GET", "t:1"]).await, row1);
    assert_eq!(c.cmd(&["PING"]).await, b"+PONG\r\n");

    let mut c = Raw::connect(&p).await;
    assert_eq!(c.cmd(&["AUTH", "default", "s3cret"]).await, b"+OK\r\n");
    assert_eq!(c.cmd(&["GET", "t:1"]).await, row1);
    assert_eq!(c.cmd(&["GET", "t:1000"]).await, b"$-1\r\n", "RESP2 nil");

    let mut c = Raw::connect(&p).await;
    let reply = c.cmd(&["HELLO", "3", "AUTH", "default", "wrong"]).await;
    assert!(reply.starts_with(b"-WRONGPASS "), "{}", show(&reply));
    let reply = c.cmd(&["GET", "t:1"]).await;
    assert!(reply.starts_with(b"-NOAUTH "), "{}", show(&reply));
    let hello = c.cmd(&["HELLO", "3", "AUTH", "default", "s3cret"]).await;
    assert!(
        hello.starts_with(b"%"),
        "HELLO 3 answers a map: {}",
        show(&hello)
    );
    let text = show(&hello);
    assert!(
        text.contains("$5\r\nproto\r\n:3\r\n"),
        "HELLO 3 reports proto 3: {text}"
    );
    assert_eq!(c.cmd(&["GET", "t:100000"]).await, b"_\r\n", "RESP3 null");
    assert_eq!(c.cmd(&["GET", "t:2"]).await, get_reply(&origin, 2).await);
    assert_eq!(
        c.cmd(&["GET", "t:100001"]).await,
        b"_\r\n",
        "RESP3 null, miss path"
    );

    // A client library authenticating from its URL.
    let addr = p.local_addr();
    let client =
        redis::Client::open(format!("redis://:s3cret@{}:{}/", addr.ip(), addr.port())).unwrap();
    let mut r = client.get_multiplexed_async_connection().await.unwrap();
    let v: Option<String> = r.get("t:3").await.unwrap();
    assert_eq!(v, origin_json(&origin, "t", 3).await);
    p.shutdown().await;
}

// ---- 2. connection limit ----------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_limit_are_refused_and_closed() {
    let (db, origin) = setup("maxconn").await;
    let mut cfg = lab::config(&db, 1);
    cfg.resp.max_connections = 2;
    let p = lab::start(cfg).await;

    let mut a = Raw::connect(&p).await;
    assert_eq!(a.cmd(&["PING"]).await, b"+PONG\r\n");
    let mut b = Raw::connect(&p).await;
    assert_eq!(b.cmd(&["PING"]).await, b"+PONG\r\n");

    let mut c = Raw::connect(&p).await;
    c.send(&encode(&["PING"])).await;
    assert_eq!(
        c.until_closed().await,
        b"-ERR max number of clients reached\r\n",
        "third connection"
    );
    assert_eq!(a.cmd(&["GET", "t:1"]).await, get_reply(&origin, 1).await);
    assert_eq!(b.cmd(&["GET", "t:2"]).await, get_reply(&origin, 2).await);
    assert_eq!(a.cmd(&["PING"]).await, b"+PONG\r\n");

    drop(a);
    // The core notices the close on its next turn; a new client then gets the freed place.
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut d = loop {
        let mut d = Raw::connect(&p).await;
        d.send(&encode(&["PING"])).await;
        let reply = d.frame().await;
        if reply == b"+PONG\r\n" {
            break d;
        }
        assert_eq!(reply, b"-ERR max number of clients reached\r\n");
        assert!(
            Instant::now() < deadline,
            "the closed connection's place was never freed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(d.cmd(&["GET", "t:3"]).await, get_reply(&origin, 3).await);
    assert_eq!(b.cmd(&["PING"]).await, b"+PONG\r\n");
    p.shutdown().await;
}

// ---- 3. pipelined order -----------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_of_hits_misses_and_absent_rows_answers_in_request_order() {
    let (db, origin) = setup("pipeline").await;
    let p = lab::start(lab::config(&db, 1)).await;
    let mut c = Raw::connect(&p).await;
    // Rows 1..=10 cached beforehand; the rest are misses on the first pass.
    for id in 1..=10 {
        assert_eq!(
            c.cmd(&["GET", &format!("t:{id}")]).await,
            get_reply(&origin, id).await
        );
    }

    let mut request = Vec::new();
    let mut expected = Vec::new();
    let mut count = 0;
    for i in 0..12i32 {
        let cached = 1 + i % 10;
        let uncached = 20 + i * 5;
        let absent = 1000 + i;
        let cmds: Vec<Vec<String>> = vec![
            vec!["GET".into(), format!("t:{cached}")],
            vec!["GET".into(), format!("t:{uncached}")],
            vec!["PING".into()],
            vec![
                "MGET".into(),
                format!("t:{cached}"),
                format!("t:{}", uncached + 1),
                format!("t:{absent}"),
                format!("t:{}", uncached + 2),
            ],
            vec!["HGET".into(), format!("t:{}", uncached + 3), "v".into()],
            vec!["GET".into(), format!("t:{absent}")],
            vec!["ECHO".into(), format!("echo {i}")],
            vec!["HGET".into(), format!("t:{cached}"), "n".into()],
            vec![
                "EXISTS".into(),
                format!("t:{cached}"),
                format!("t:{absent}"),
            ],
        ];
        for args in cmds {
            let refs: Vec<&str> = args.iter().map(String::as_str).collect();
            request.extend(encode(&refs));
            count += 1;
            let id = |k: &str| k.strip_prefix("t:").unwrap().parse::<i32>().unwrap();
            match refs[0] {
                "GET" => expected.extend(get_reply(&origin, id(refs[1])).await),
                "PING" => expected.extend_from_slice(b"+PONG\r\n"),
                "ECHO" => expected.extend(bulk(refs[1])),
                "MGET" => {
                    expected.extend(format!("*{}\r\n", refs.len() - 1).into_bytes());
                    for k in &refs[1..] {
                        expected.extend(get_reply(&origin, id(k)).await);
                    }
                }
                "HGET" => {
                    let sql = format!("SELECT {}::text FROM t WHERE id = $1", refs[2]);
                    let row = origin.query_opt(&sql, &[&id(refs[1])]).await.unwrap();
                    match row.and_then(|r| r.get::<_, Option<String>>(0)) {
                        Some(v) => expected.extend(bulk(&v)),
                        None => expected.extend_from_slice(b"$-1\r\n"),
                    }
                }
                "EXISTS" => {
                    let n = refs[1..]
                        .iter()
                        .filter(|k| id(k) >= 1 && id(k) <= 100)
                        .count();
                    expected.extend(format!(":{n}\r\n").into_bytes());
                }
                other => unreachable!("{other}"),
            }
        }
    }
    assert!(count >= 100, "{count} commands");

    // First pass mostly misses, second pass all from the cache: the same bytes, in order.
    for pass in 0..2 {
        c.send(&request).await;
        let got = c.bytes(expected.len()).await;
        if got != expected {
            let at = got
                .iter()
                .zip(&expected)
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            panic!(
                "pass {pass}: replies differ at byte {at}:\n got {}\nwant {}",
                show(&got[at.saturating_sub(40)..(at + 80).min(got.len())]),
                show(&expected[at.saturating_sub(40)..(at + 80).min(expected.len())])
            );
        }
        // Nothing more than expected was sent.
        assert_eq!(
            c.cmd(&["PING"]).await,
            b"+PONG\r\n",
            "pass {pass}: trailing bytes"
        );
    }
    p.shutdown().await;
}

// ---- 4. relation change -----------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_added_column_reaches_cached_rows_after_the_next_write() {
    let (db, origin) = setup("addcol").await;
    let p = lab::start(lab::config(&db, 1)).await;
    let mut r = lab::redis(&p).await;
    for id in [1, 2] {
        let v: Option<String> = r.get(format!("t:{id}")).await.unwrap();
        assert_eq!(v, origin_json(&origin, "t", id).await);
    }
    origin
        .batch_execute("ALTER TABLE t ADD COLUMN extra int DEFAULT 7")
        .await
        .unwrap();
    // A write to another row carries the new relation message.
    origin
        .batch_execute("UPDATE t SET n = n + 1 WHERE id = 50")
        .await
        .unwrap();
    lab::sync(&p, &origin).await;
    for id in [1, 2, 50] {
        let v: Option<String> = r.get(format!("t:{id}")).await.unwrap();
        let want = origin_json(&origin, "t", id).await;
        assert!(want.as_deref().unwrap().contains("\"extra\":7"));
        assert_eq!(v, want, "t:{id} after ADD COLUMN");
    }
    let extra: Option<String> = r.hget("t:1", "extra").await.unwrap();
    assert_eq!(extra.as_deref(), Some("7"));
    // And the new shape is kept coherent by later WAL.
    origin
        .batch_execute("UPDATE t SET extra = 8 WHERE id = 1")
        .await
        .unwrap();
    lab::sync(&p, &origin).await;
    let v: Option<String> = r.get("t:1").await.unwrap();
    assert_eq!(v, origin_json(&origin, "t", 1).await);
    assert!(v.unwrap().contains("\"extra\":8"));
    let stale = lab::stale_entries(&p, &origin).await;
    assert!(stale.is_empty(), "stale entries: {stale:?}");
    p.shutdown().await;
}

/// A column keeps its name but changes type (text → int): the JSON of every row changes
/// (`"5"` → `5`), so cached entries must go and later rows must be encoded with the new type.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_column_type_change_reaches_cached_rows_after_the_next_write() {
    let db = TestDb::create("coltype").await;
    let origin = db.client().await;
    origin
        .batch_execute(
            "CREATE TABLE c (id int4 PRIMARY KEY, v text);
             INSERT INTO c SELECT g, g::text FROM generate_series(1, 10) g;",
        )
        .await
        .unwrap();
    let p = lab::start(lab::config(&db, 1)).await;
    let mut r = lab::redis(&p).await;
    for id in [1, 2] {
        let v: Option<String> = r.get(format!("c:{id}")).await.unwrap();
        assert_eq!(v, origin_json(&origin, "c", id).await);
    }
    origin
        .batch_execute("ALTER TABLE c ALTER COLUMN v TYPE int4 USING v::int4")
        .await
        .unwrap();
    origin
        .batch_execute("UPDATE c SET v = v + 100 WHERE id IN (2, 3)")
        .await
        .unwrap();
    lab::sync(&p, &origin).await;
    let mut wrong = Vec::new();
    for id in [1, 2, 3] {
        let v: Option<String> = r.get(format!("c:{id}")).await.unwrap();
        let want = origin_json(&origin, "c", id).await;
        if v != want {
            wrong.push(format!("c:{id}: served {v:?}, origin {want:?}"));
        }
    }
    assert!(wrong.is_empty(), "after the type change: {wrong:#?}");
    p.shutdown().await;
}

// ---- 5. unchanged TOAST -----------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_leaving_a_toasted_value_unchanged_refills_the_row() {
    let db = TestDb::create("toast").await;
    let origin = db.client().await;
    origin
        .batch_execute(
            "CREATE TABLE big (id int4 PRIMARY KEY, n int4, big text);
             ALTER TABLE big ALTER COLUMN big SET STORAGE EXTERNAL;
             INSERT INTO big SELECT g, g,
                 (SELECT string_agg(md5(random()::text || g || s), '') FROM generate_series(1, 320) s)
               FROM generate_series(1, 3) g;",
        )
        .await
        .unwrap();
    let toasted: i64 = origin
        .query_one(
            "SELECT pg_relation_size(reltoastrelid) FROM pg_class WHERE relname = 'big'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(toasted > 0, "the big values must live in the TOAST table");
    let p = lab::start(lab::config(&db, 1)).await;
    let mut r = lab::redis(&p).await;
    for id in [1, 2] {
        let v: Option<String> = r.get(format!("big:{id}")).await.unwrap();
        assert_eq!(v, origin_json(&origin, "big", id).await);
        assert!(v.unwrap().len() > 10_000);
    }
    let entries = dbsize(&mut r).await;
    assert_eq!(entries, 2);

    origin
        .batch_execute("UPDATE big SET n = n + 1000 WHERE id = 1")
        .await
        .unwrap();
    lab::sync(&p, &origin).await;
    assert_eq!(
        dbsize(&mut r).await,
        1,
        "the row with an unchanged TOAST value is evicted"
    );
    let misses = lab::info_field(&mut r, "keyspace_misses").await;
    let v: Option<String> = r.get("big:1").await.unwrap();
    let want = origin_json(&origin, "big", 1).await;
    assert!(want.as_deref().unwrap().contains("\"n\":1001"));
    assert_eq!(v, want, "refilled from the origin");
    assert_eq!(lab::info_field(&mut r, "keyspace_misses").await, misses + 1);
    let n: Option<String> = r.hget("big:1", "n").await.unwrap();
    assert_eq!(n.as_deref(), Some("1001"));
    // The untouched row is still a hit and still right.
    let v: Option<String> = r.get("big:2").await.unwrap();
    assert_eq!(v, origin_json(&origin, "big", 2).await);
    assert_eq!(lab::info_field(&mut r, "keyspace_misses").await, misses + 1);
    let stale = lab::stale_entries(&p, &origin).await;
    assert!(stale.is_empty(), "stale entries: {stale:?}");
    p.shutdown().await;
}

// ---- 6. slot dropped --------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_slot_is_recreated_and_the_cache_flushed() {
    let (db, origin) = setup("slotdrop").await;
    let mut cfg = lab::config(&db, 1);
    // A wide window between losing the stream and reconnecting, to write into the gap.
    cfg.replication.reconnect_backoff_ms = 1_000;
    let p = lab::start(cfg).await;
    let slot = lab::slot_name(&db);
    let mut r = lab::redis(&p).await;
    let keys: Vec<String> = (1..=20).map(|i| format!("t:{i}")).collect();
    let _: Vec<Option<String>> = redis::cmd("MGET")
        .arg(&keys)
        .query_async(&mut r)
        .await
        .unwrap();
    assert_eq!(dbsize(&mut r).await, 20);
    assert_eq!(p.repl.resets.load(Ordering::Relaxed), 0);

    lab::drop_slot(&origin, &slot).await;
    // Written while no slot exists: this change is never streamed.
    origin
        .batch_execute("UPDATE t SET v = 'written while the slot was gone' WHERE id = 1")
        .await
        .unwrap();

    let deadline = Instant::now() + Duration::from_secs(8);
    while p.repl.resets.load(Ordering::Relaxed) == 0 {
        assert!(Instant::now() < deadline, "the slot was never re-created");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(p.wait_serving(Duration::from_secs(8)).await);
    let deadline = Instant::now() + Duration::from_secs(10);
    while dbsize(&mut r).await != 0 {
        assert!(
            Instant::now() < deadline,
            "cache not flushed after the slot reset"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let info: String = redis::cmd("INFO")
        .arg("keyspace")
        .query_async(&mut r)
        .await
        .unwrap();
    assert!(!info.contains("db0:"), "keyspace after reset: {info}");
    let exists: bool = origin
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)",
            &[&slot],
        )
        .await
        .unwrap()
        .get(0);
    assert!(exists, "slot re-created");

    let v: Option<String> = r.get("t:1").await.unwrap();
    assert_eq!(v, origin_json(&origin, "t", 1).await);
    assert!(v.unwrap().contains("while the slot was gone"));
    // The new slot streams: a later write reaches a cached row.
    let _: Vec<Option<String>> = redis::cmd("MGET")
        .arg(&keys)
        .query_async(&mut r)
        .await
        .unwrap();
    origin
        .batch_execute("UPDATE t SET v = 'after reset' WHERE id IN (2, 3)")
        .await
        .unwrap();
    lab::sync(&p, &origin).await;
    for id in [2, 3] {
        let v: Option<String> = r.get(format!("t:{id}")).await.unwrap();
        assert_eq!(v, origin_json(&origin, "t", id).await);
    }
    let stale = lab::stale_entries(&p, &origin).await;
    assert!(stale.is_empty(), "stale entries: {stale:?}");
    p.shutdown().await;
}

// ---- 7. origin outage -------------------------------------------------------------------------

/// A LOGIN REPLICATION role for one test, dropped (best effort) when the guard drops.
struct Role {
    name: String,
}

impl Role {
    const PASSWORD: &'static str = "role_pw_1";

    async fn create(tag: &str) -> Role {
        let name = format!("r_{tag}_{}", std::process::id());
        let admin = origin::admin_client().await;
        let _ = admin
            .batch_execute(&format!("DROP ROLE IF EXISTS {name}"))
            .await;
        admin
            .batch_execute(&format!(
                "CREATE ROLE {name} LOGIN REPLICATION PASSWORD '{}'",
                Self::PASSWORD
            ))
            .await
            .expect("create role");
        Role { name }
    }

    async fn set_login(&self, login: bool) {
        let admin = origin::admin_client().await;
        let attr = if login { "LOGIN" } else { "NOLOGIN" };
        admin
            .batch_execute(&format!("ALTER ROLE {} {attr}", self.name))
            .await
            .unwrap();
    }

    /// Terminates every backend of the role (fills and the walsender); how many.
    async fn terminate_backends(&self) -> u64 {
        let admin = origin::admin_client().await;
        admin
            .execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1",
                &[&self.name],
            )
            .await
            .unwrap()
    }
}

impl Drop for Role {
    fn drop(&mut self) {
        let name = self.name.clone();
        origin::run_cleanup(async move {
            let admin = origin::admin_client().await;
            let _ = admin
                .execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1",
                    &[&name],
                )
                .await;
            let _ = admin
                .batch_execute(&format!("DROP ROLE IF EXISTS {name}"))
                .await;
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_origin_outage_keeps_hits_flowing_and_recovers() {
    // Declared first, dropped last: after the database that holds its objects.
    let role = Role::create("outage").await;
    let (db, origin) = setup("outage").await;
    origin
        .batch_execute(&format!(
            "ALTER TABLE t OWNER TO {0};
             CREATE PUBLICATION pgline FOR TABLE t WITH (publish_via_partition_root = true);",
            role.name
        ))
        .await
        .unwrap();
    let mut cfg = lab::config(&db, 1);
    let (host, port, _, _) = origin::origin_base();
    cfg.origin.url = format!(
        "host={host} port={port} user={} password={} dbname={}",
        role.name,
        Role::PASSWORD,
        db.name
    );
    cfg.origin.connect_timeout_ms = 1_000;
    cfg.replication.max_lag_ms = 60_000;
    let p = lab::start(cfg).await;
    let mut r = lab::redis(&p).await;
    let keys: Vec<String> = (1..=5).map(|i| format!("t:{i}")).collect();
    let cached: Vec<Option<String>> = redis::cmd("MGET")
        .arg(&keys)
        .query_async(&mut r)
        .await
        .unwrap();
    for (i, v) in cached.iter().enumerate() {
        assert_eq!(*v, origin_json(&origin, "t", i as i32 + 1).await);
    }

    role.set_login(false).await;
    assert!(
        role.terminate_backends().await >= 1,
        "pgline's backends run as the role"
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    while p.repl.streaming.load(Ordering::Acquire) {
        assert!(
            Instant::now() < deadline,
            "the stream never noticed the outage"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Hits keep flowing within max_lag_ms.
    let hits = lab::info_field(&mut r, "keyspace_hits").await;
    let again: Vec<Option<String>> = redis::cmd("MGET")
        .arg(&keys)
        .query_async(&mut r)
        .await
        .expect("hits while the origin is down");
    assert_eq!(again, cached);
    let v: Option<String> = r.get("t:2").await.unwrap();
    assert_eq!(v, cached[1]);
    assert_eq!(lab::info_field(&mut r, "keyspace_hits").await, hits + 6);
    // A miss needs the origin: a clear error, promptly.
    let started = Instant::now();
    let err = r
        .get::<_, Option<String>>("t:50")
        .await
        .expect_err("a miss cannot be answered while the origin refuses logins");
    assert!(err.to_string().contains("origin"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "miss error took {:?}",
        started.elapsed()
    );
    assert!(!p.repl.streaming.load(Ordering::Acquire));

    role.set_login(true).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !p.repl.streaming.load(Ordering::Acquire) {
        assert!(Instant::now() < deadline, "the stream never came back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let v: Option<String> = loop {
        match r.get::<_, Option<String>>("t:50").await {
            Ok(v) => break v,
            Err(e) => {
                assert!(Instant::now() < deadline, "misses never recovered: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert_eq!(v, origin_json(&origin, "t", 50).await);
    origin
        .batch_execute("UPDATE t SET v = 'after outage' WHERE id IN (1, 50)")
        .await
        .unwrap();
    lab::sync(&p, &origin).await;
    for id in [1, 50] {
        let v: Option<String> = r.get(format!("t:{id}")).await.unwrap();
        assert_eq!(v, origin_json(&origin, "t", id).await);
    }
    p.shutdown().await;
    drop(origin);
    drop(db);
    drop(role);
}

// ---- 8. RESP3 through the redis crate ---------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resp3_clients_read_the_same_values() {
    let (db, origin) = setup("resp3").await;
    let p = lab::start(lab::config(&db, 1)).await;
    let addr = p.local_addr();
    let client = redis::Client::open(format!(
        "redis://{}:{}/?protocol=resp3",
        addr.ip(),
        addr.port()
    ))
    .unwrap();
    let mut r3 = client.get_multiplexed_async_connection().await.unwrap();
    let mut r2 = lab::redis(&p).await;
    let keys = ["t:1", "t:2000", "t:3", "t:4"];
    // Twice: misses first, hits after.
    for _ in 0..2 {
        let v3: Option<String> = r3.get("t:1").await.unwrap();
        let v2: Option<String> = r2.get("t:1").await.unwrap();
        assert_eq!(v3, origin_json(&origin, "t", 1).await);
        assert_eq!(v3, v2);
        let absent: Option<String> = r3.get("t:2001").await.unwrap();
        assert_eq!(absent, None);
        let m3: Vec<Option<String>> = redis::cmd("MGET")
            .arg(&keys)
            .query_async(&mut r3)
            .await
            .unwrap();
        let m2: Vec<Option<String>> = redis::cmd("MGET")
            .arg(&keys)
            .query_async(&mut r2)
            .await
            .unwrap();
        assert_eq!(m3, m2);
        assert_eq!(m3[1], None);
        assert_eq!(m3[2], origin_json(&origin, "t", 3).await);
        let h3: std::collections::HashMap<String, String> = r3.hgetall("t:5").await.unwrap();
        let h2: std::collections::HashMap<String, String> = r2.hgetall("t:5").await.unwrap();
        assert_eq!(h3, h2);
        assert_eq!(h3.get("v").map(String::as_str), Some("value 5"));
        assert_eq!(h3.get("n").map(String::as_str), Some("50"));
        assert_eq!(h3.len(), 3);
        let none: std::collections::HashMap<String, String> = r3.hgetall("t:5000").await.unwrap();
        assert!(none.is_empty());
        let f: Option<String> = r3.hget("t:6", "v").await.unwrap();
        assert_eq!(f.as_deref(), Some("value 6"));
    }
    // The raw RESP3 shape of HGETALL is a map.
    let mut c = Raw::connect(&p).await;
    let hello = c.cmd(&["HELLO", "3"]).await;
    assert!(hello.starts_with(b"%7\r\n"), "{}", show(&hello));
    let all = c.cmd(&["HGETALL", "t:5"]).await;
    assert!(all.starts_with(b"%3\r\n"), "{}", show(&all));
    assert_eq!(c.cmd(&["HGETALL", "t:5000"]).await, b"%0\r\n");
    // Outside cluster mode the cluster commands are refused as Redis refuses them, and a key
    // with braces is a key like any other (no hash tag).
    for cmd in [
        &["CLUSTER", "INFO"][..],
        &["CLUSTER", "KEYSLOT", "a"],
        &["READONLY"],
    ] {
        assert_eq!(
            c.cmd(cmd).await,
            b"-ERR This instance has cluster support disabled\r\n",
            "{cmd:?}"
        );
    }
    assert_eq!(c.cmd(&["GET", "t:{5}"]).await, b"_\r\n");
    p.shutdown().await;
}
