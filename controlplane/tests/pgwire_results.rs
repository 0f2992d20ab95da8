//! The query-result cache end to end, against a real origin, through pgline's PostgreSQL port
//! with a raw protocol client (so answers are compared byte for byte with the origin's):
//! a join + aggregate served from cache, an UPDATE never followed by the old answer, tenant
//! scoped invalidation, volatile queries and oversized answers never cached.

use std::time::{Duration, Instant};

use pgline_controlplane::server::Pgline;
use pgline_testkit::origin::origin_addr;
use pgline_testkit::pg::Wire;
use pgline_testkit::{lab, TestDb};

fn hits(p: &Pgline) -> u64 {
    p.shared.total(|s| &s.keys_hit)
}

/// One statement as a client sends it.
#[derive(Clone, Copy)]
enum Q<'a> {
    Simple(&'a str),
    /// Text, text parameters, Describe portal or not.
    Ext(&'a str, &'a [&'a str], bool),
}

impl Q<'_> {
    /// Sends the statement on `c`; the raw reply up to ReadyForQuery.
    async fn run(self, c: &mut Wire) -> Vec<u8> {
        match self {
            Q::Simple(sql) => c.simple(sql).await,
            Q::Ext(sql, params, describe) => c.extended(sql, params, describe).await,
        }
    }
}

/// Runs `q` through pgline until an answer comes from cache (the hit counter moves while it
/// runs); every answer must equal `expected`. Returns how many runs it took.
async fn until_hit(p: &Pgline, c: &mut Wire, q: Q<'_>, expected: &[u8]) -> usize {
    let until = Instant::now() + Duration::from_secs(10);
    for i in 1.. {
        let before = hits(p);
        let got = q.run(c).await;
        assert_eq!(
            got,
            expected,
            "run {i}: {:?}",
            String::from_utf8_lossy(&got)
        );
        if hits(p) > before {
            return i;
        }
        assert!(Instant::now() < until, "never served from cache");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    unreachable!()
}

/// Runs `sql` on the origin directly and waits until pgline applied it.
async fn write(origin: &tokio_postgres::Client, p: &Pgline, sql: &str) {
    origin.batch_execute(sql).await.unwrap();
    lab::sync(p, origin).await;
}

const SCHEMA: &str = "
CREATE TABLE tenants (id int8 PRIMARY KEY, name text NOT NULL);
CREATE TABLE orders (id int8 PRIMARY KEY, tenant_id int8 NOT NULL, amount numeric(10,2),
                     status text NOT NULL);
INSERT INTO tenants VALUES (1, 'acme'), (2, 'globex'), (3, 'initech');
INSERT INTO orders SELECT g, g % 3 + 1, (g * 7 % 100)::numeric / 4, CASE WHEN g % 2 = 0
  THEN 'paid' ELSE 'open' END FROM generate_series(1, 300) g;
";

/// The origin's address, for raw connections.
/// A test database holding [`SCHEMA`], a pgline on it, and raw connections to both.
struct Lab {
    db: TestDb,
    origin_client: tokio_postgres::Client,
    p: std::sync::Arc<Pgline>,
    origin: Wire,
    c: Wire,
}

async fn lab(tag: &str) -> Lab {
    let db = TestDb::create(tag).await;
    let origin_client = db.client().await;
    origin_client.batch_execute(SCHEMA).await.unwrap();
    let p = lab::start(lab::config(&db, 1)).await;
    let origin = Wire::connect(origin_addr(), &db.name, &[]).await;
    let c = Wire::connect(p.pg_addr().unwrap(), &db.name, &[]).await;
    Lab {
        db,
        origin_client,
        p,
        origin,
        c,
    }
}

const JOIN_AGG: &str = "SELECT t.name, count(*) AS n, sum(o.amount) AS total \
    FROM orders o JOIN tenants t ON t.id = o.tenant_id \
    GROUP BY t.name ORDER BY t.name";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_aggregate_is_cached_byte_for_byte_and_never_stale() {
    let Lab {
        db: _db,
        origin_client,
        p,
        mut origin,
        mut c,
    } = lab("pgw_results_join").await;

    // Simple protocol: the cached answer is exactly the origin's bytes.
    let expected = origin.simple(JOIN_AGG).await;
    let runs = until_hit(&p, &mut c, Q::Simple(JOIN_AGG), &expected).await;
    let t = Instant::now();
    for _ in 0..200 {
        let before = hits(&p);
        assert_eq!(c.simple(JOIN_AGG).await, expected);
        assert_eq!(hits(&p), before + 1, "a warm result is a hit");
    }
    let cached = t.elapsed();
    let t = Instant::now();
    for _ in 0..200 {
        origin.simple(JOIN_AGG).await;
    }
    eprintln!(
        "join+aggregate: cached after {runs} run(s); 200 runs: {cached:?} from cache, {:?} at \
         the origin",
        t.elapsed()
    );

    // Extended protocol, with and without a Describe of the portal.
    for describe in [true, false] {
        let sql =
            "SELECT t.name, sum(o.amount) FROM orders o JOIN tenants t ON t.id = o.tenant_id \
                   WHERE o.status = $1 GROUP BY t.name ORDER BY 1";
        let expected = origin.extended(sql, &["paid"], describe).await;
        until_hit(&p, &mut c, Q::Ext(sql, &["paid"], describe), &expected).await;
        let other = origin.extended(sql, &["open"], describe).await;
        assert_ne!(other, expected);
        until_hit(&p, &mut c, Q::Ext(sql, &["open"], describe), &other).await;
    }

    // An UPDATE of a table read: the next read is the new answer, never the old one.
    for i in 0..20 {
        let sql = format!(
            "UPDATE orders SET amount = amount + 1 WHERE id = {}",
            i * 7 + 1
        );
        let reply = c.simple(&sql).await;
        assert_eq!(reply[0], b'C', "{:?}", String::from_utf8_lossy(&reply));
        let now = origin.simple(JOIN_AGG).await;
        assert_ne!(now, expected);
        let got = c.simple(JOIN_AGG).await;
        assert_eq!(got, now, "iteration {i}: stale answer after an UPDATE");
    }
    // Through another session (not fenced by the write): it may lag, never regress for good.
    origin_client
        .batch_execute("UPDATE tenants SET name = 'acme2' WHERE id = 1")
        .await
        .unwrap();
    lab::sync(&p, &origin_client).await;
    let expected = origin.simple(JOIN_AGG).await;
    assert!(String::from_utf8_lossy(&expected).contains("acme2"));
    until_hit(&p, &mut c, Q::Simple(JOIN_AGG), &expected).await;
    p.shutdown().await;
}

/// An answer computed before an operator's flush is not stored after it: the statement is
/// held at the origin by another session's lock while the flush lands. The old code voided no
/// lease on a flush: the answer was stored when it landed, and the next run was a hit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_computed_before_a_flush_is_not_stored_after_it() {
    let Lab {
        db,
        origin_client: _origin_client,
        p,
        mut origin,
        mut c,
    } = lab("pgw_results_flush").await;
    let expected = origin.simple(JOIN_AGG).await;
    until_hit(&p, &mut c, Q::Simple(JOIN_AGG), &expected).await;
    p.flush_all().await;
    let locker = db.client().await;
    locker
        .batch_execute("BEGIN; LOCK TABLE orders IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let running = tokio::spawn(async move {
        let got = c.simple(JOIN_AGG).await;
        (c, got)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!running.is_finished(), "the statement waits for the lock");
    p.flush_all().await;
    locker.batch_execute("COMMIT").await.unwrap();
    let (mut c, got) = running.await.unwrap();
    assert_eq!(got, expected);
    // Past the writer's turn for the landed answer: not stored, the next run is forwarded.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = hits(&p);
    assert_eq!(c.simple(JOIN_AGG).await, expected);
    assert_eq!(
        hits(&p),
        before,
        "the answer read before the flush was stored"
    );
    // One computed after the flush is stored as before.
    until_hit(&p, &mut c, Q::Simple(JOIN_AGG), &expected).await;
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_results_survive_other_tenants_writes() {
    let Lab {
        db: _db,
        origin_client,
        p,
        mut origin,
        mut c,
    } = lab("pgw_results_tenant").await;
    let sql = "SELECT count(*), sum(amount) FROM orders WHERE tenant_id = $1";

    let t2 = origin.extended(sql, &["2"], true).await;
    until_hit(&p, &mut c, Q::Ext(sql, &["2"], true), &t2).await;
    // An insert into tenant 1's rows through the origin: tenant 2's answer survives.
    write(
        &origin_client,
        &p,
        "INSERT INTO orders VALUES (1000, 1, 5, 'open')",
    )
    .await;
    let before = hits(&p);
    assert_eq!(c.extended(sql, &["2"], true).await, t2);
    assert_eq!(
        hits(&p),
        before + 1,
        "tenant 2's result survived tenant 1's insert"
    );

    // A write to tenant 2's rows drops it: the next read is the new answer.
    write(
        &origin_client,
        &p,
        "INSERT INTO orders VALUES (1001, 2, 100, 'open')",
    )
    .await;
    let t2_new = origin.extended(sql, &["2"], true).await;
    assert_ne!(t2_new, t2);
    let before = hits(&p);
    assert_eq!(c.extended(sql, &["2"], true).await, t2_new);
    assert_eq!(hits(&p), before, "dropped: the read went to the origin");
    until_hit(&p, &mut c, Q::Ext(sql, &["2"], true), &t2_new).await;

    // Without REPLICA IDENTITY FULL an UPDATE does not carry the old tenant_id: moving a row
    // from tenant 2 to tenant 3 must still drop tenant 2's answer.
    write(
        &origin_client,
        &p,
        "UPDATE orders SET tenant_id = 3 WHERE id = 1001",
    )
    .await;
    let moved = origin.extended(sql, &["2"], true).await;
    assert_eq!(moved, t2);
    assert_eq!(c.extended(sql, &["2"], true).await, moved);

    // With REPLICA IDENTITY FULL, updates and deletes of tenant 1's rows spare tenant 2.
    write(
        &origin_client,
        &p,
        "ALTER TABLE orders REPLICA IDENTITY FULL",
    )
    .await;
    write(
        &origin_client,
        &p,
        "UPDATE orders SET amount = 1 WHERE id = 1000",
    )
    .await;
    until_hit(&p, &mut c, Q::Ext(sql, &["2"], true), &moved).await;
    write(
        &origin_client,
        &p,
        "UPDATE orders SET amount = 9 WHERE id = 3; DELETE FROM orders WHERE id = 6",
    )
    .await;
    let before = hits(&p);
    assert_eq!(c.extended(sql, &["2"], true).await, moved);
    assert_eq!(
        hits(&p),
        before + 1,
        "tenant 2's result survived tenant 1's update/delete"
    );
    // ... and a row moving into tenant 2 drops it (the new value matches).
    write(
        &origin_client,
        &p,
        "UPDATE orders SET tenant_id = 2 WHERE id = 3",
    )
    .await;
    let now = origin.extended(sql, &["2"], true).await;
    assert_ne!(now, moved);
    assert_eq!(c.extended(sql, &["2"], true).await, now);
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volatile_and_oversized_answers_are_not_cached() {
    let db = TestDb::create("pgw_results_volatile").await;
    let origin_client = db.client().await;
    origin_client.batch_execute(SCHEMA).await.unwrap();
    origin_client
        .batch_execute(
            "CREATE TABLE blobs (id int8 PRIMARY KEY, body text NOT NULL);
             INSERT INTO blobs SELECT g, repeat('x', 1000) FROM generate_series(1, 400) g;",
        )
        .await
        .unwrap();
    let p = lab::start(lab::config(&db, 1)).await;
    let mut c = Wire::connect(p.pg_addr().unwrap(), &db.name, &[]).await;
    let before = hits(&p);
    for _ in 0..30 {
        let r = c
            .simple("SELECT count(*), now() FROM orders WHERE tenant_id = 1")
            .await;
        assert_eq!(r[0], b'T');
        // 400 KB: over the 256 KiB cap.
        let r = c.simple("SELECT * FROM blobs ORDER BY id").await;
        assert_eq!(r[0], b'T');
        assert!(r.len() > 400_000);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        hits(&p),
        before,
        "volatile or oversized answers were served from cache"
    );
    // A small answer of the same table is cached (the test above could not hit anyway).
    let small = "SELECT id FROM blobs ORDER BY id LIMIT 3";
    let expected = c.simple(small).await;
    until_hit(&p, &mut c, Q::Simple(small), &expected).await;
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_converge_after_concurrent_writes() {
    let Lab {
        db,
        origin_client,
        p,
        mut origin,
        mut c,
    } = lab("pgw_results_race").await;
    let tenant = "SELECT count(*), sum(amount) FROM orders WHERE tenant_id = $1";
    let writer = {
        let w = db.client().await;
        tokio::spawn(async move {
            for i in 0..400i64 {
                let sql = format!(
                    "UPDATE orders SET amount = amount + 1, tenant_id = {} WHERE id = {}",
                    i % 3 + 1,
                    i * 13 % 300 + 1
                );
                w.batch_execute(&sql).await.unwrap();
            }
        })
    };
    let before = hits(&p);
    let mut runs = 0;
    while !writer.is_finished() {
        c.simple(JOIN_AGG).await;
        c.extended(tenant, &["2"], true).await;
        runs += 2;
    }
    writer.await.unwrap();
    let during = hits(&p) - before;
    lab::sync(&p, &origin_client).await;
    // Whatever was installed while writes ran, every answer now is the origin's.
    for _ in 0..3 {
        assert_eq!(c.simple(JOIN_AGG).await, origin.simple(JOIN_AGG).await);
        assert_eq!(
            c.extended(tenant, &["2"], true).await,
            origin.extended(tenant, &["2"], true).await
        );
    }
    eprintln!("{runs} reads during 400 concurrent updates: {during} from cache; converged");
    p.shutdown().await;
}

/// A session that logged in with its own settings (here `TimeZone`) neither shares origin
/// connections with plain sessions nor feeds the result cache: a plain session's cacheable
/// query never gets another zone's text, from the origin or from cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_settings_never_reach_the_result_cache() {
    let db = TestDb::create("pgw_results_tz").await;
    let origin_client = db.client().await;
    origin_client
        .batch_execute(
            "CREATE TABLE events (id int8 PRIMARY KEY, at timestamptz NOT NULL);
             INSERT INTO events SELECT g, '2026-01-01 00:00:00+00'::timestamptz
               + g * interval '1 hour' FROM generate_series(1, 20) g;",
        )
        .await
        .unwrap();
    let p = lab::start(lab::config(&db, 1)).await;
    let origin_addr = origin_addr();
    let q = "SELECT id, at FROM events WHERE id < 6 ORDER BY id";
    let expected = Wire::connect(origin_addr, &db.name, &[])
        .await
        .simple(q)
        .await;
    let zoned_expected = Wire::connect(origin_addr, &db.name, &[("TimeZone", "Asia/Tokyo")])
        .await
        .simple(q)
        .await;
    assert_ne!(expected, zoned_expected);

    let pg = p.pg_addr().unwrap();
    let mut zoned = Wire::connect(pg, &db.name, &[("TimeZone", "Asia/Tokyo")]).await;
    let mut plain = Wire::connect(pg, &db.name, &[]).await;
    for _ in 0..3 {
        // The zoned session's connection is the most recently used one each time.
        assert_eq!(zoned.simple(q).await, zoned_expected);
        assert_eq!(plain.simple(q).await, expected);
    }
    until_hit(&p, &mut plain, Q::Simple(q), &expected).await;
    assert_eq!(
        zoned.simple(q).await,
        zoned_expected,
        "the zoned session got the cache"
    );
    p.shutdown().await;
}

/// How a Bind asks for its parameters and results, as drivers send them.
struct Formats<'a> {
    /// Parameter format codes as sent (0, 1 or one per parameter).
    params: &'a [i16],
    /// Result format codes as sent.
    results: &'a [i16],
}

/// `Bind` of the unnamed portal to statement `stmt` with int8 `tenant` (binary when its format
/// code says so), `Execute`, `Sync`: what tokio-postgres sends for `client.query`.
fn bind_execute(stmt: &str, tenant: i64, f: &Formats<'_>) -> Vec<u8> {
    use postgres_protocol::message::frontend;
    let binary = f.params.first() == Some(&1);
    pgline_testkit::pg::msgs(|b| {
        frontend::bind(
            "",
            stmt,
            f.params.iter().copied(),
            [tenant],
            |t, buf| {
                if binary {
                    buf.extend_from_slice(&t.to_be_bytes());
                } else {
                    buf.extend_from_slice(t.to_string().as_bytes());
                }
                Ok::<_, Box<dyn std::error::Error + Sync + Send>>(postgres_protocol::IsNull::No)
            },
            f.results.iter().copied(),
            b,
        )
        .map_err(|_| "bind")
        .unwrap();
        frontend::execute("", 0, b).unwrap();
        frontend::sync(b);
    })
}

/// `Parse` of a named statement without declared types, `Describe` of it, `Sync`: the
/// separate batch tokio-postgres sends for `client.prepare`.
async fn prepare(c: &mut Wire, name: &str, sql: &str) -> Vec<u8> {
    use postgres_protocol::message::frontend;
    let m = pgline_testkit::pg::msgs(|b| {
        frontend::parse(name, sql, std::iter::empty(), b).unwrap();
        frontend::describe(b'S', name, b).unwrap();
        frontend::sync(b);
    });
    c.exchange_bytes(&m).await
}

/// A Bind in a given form, run through pgline until it hits (every answer the origin's).
async fn until_hit_raw(p: &Pgline, c: &mut Wire, m: &[u8], expected: &[u8]) -> usize {
    let until = Instant::now() + Duration::from_secs(10);
    for i in 1.. {
        let before = hits(p);
        let got = c.exchange_bytes(m).await;
        assert_eq!(
            got,
            expected,
            "run {i}: {:?}",
            String::from_utf8_lossy(&got)
        );
        if hits(p) > before {
            return i;
        }
        assert!(Instant::now() < until, "never served from cache");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    unreachable!()
}

/// Runs `m` through pgline once: its reply and whether it was a hit.
async fn once(p: &Pgline, c: &mut Wire, m: &[u8]) -> (Vec<u8>, bool) {
    let before = hits(p);
    let got = c.exchange_bytes(m).await;
    (got, hits(p) > before)
}

/// Binary parameters and binary results, as tokio-postgres, pgx, JDBC and Npgsql send them,
/// are cached byte for byte; a text client and a binary client of the same statement each get
/// their own bytes; equivalent format forms share an entry; a bad format count gets the
/// origin's error and caches nothing; a write shows in the next binary answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_formats_are_cached_byte_for_byte_and_apart_from_text() {
    let Lab {
        db: _db,
        origin_client: _oc,
        p,
        mut origin,
        mut c,
    } = lab("pgw_results_binary").await;
    // Three columns: int8, text, numeric (binary forms differ from the text ones).
    let sql = "SELECT count(*) AS n, min(status) AS s, sum(amount) AS total FROM orders \
               WHERE tenant_id = $1";
    let ours = prepare(&mut c, "s1", sql).await;
    assert_eq!(ours, prepare(&mut origin, "s1", sql).await, "prepare");

    let binary = Formats {
        params: &[1],
        results: &[1],
    };
    let text = Formats {
        params: &[],
        results: &[],
    };
    // A bad count first (2 result codes, 3 columns): the origin's error, nothing cached.
    let bad = bind_execute(
        "s1",
        2,
        &Formats {
            params: &[1],
            results: &[1, 1],
        },
    );
    let bad_expected = origin.exchange_bytes(&bad).await;
    assert!(
        String::from_utf8_lossy(&bad_expected).contains("bind message has 2 result formats"),
        "{:?}",
        String::from_utf8_lossy(&bad_expected)
    );
    for _ in 0..5 {
        assert_eq!(once(&p, &mut c, &bad).await, (bad_expected.clone(), false));
    }
    let b2 = bind_execute("s1", 2, &binary);
    let b2_expected = origin.exchange_bytes(&b2).await;
    assert_eq!(
        once(&p, &mut c, &b2).await,
        (b2_expected.clone(), false),
        "the bad count cached nothing"
    );
    until_hit_raw(&p, &mut c, &b2, &b2_expected).await;

    // Text parameters and results of the same statement: the origin's text bytes, their own
    // entry; then both alternate, each answered from cache with its own bytes.
    let t2 = bind_execute("s1", 2, &text);
    let t2_expected = origin.exchange_bytes(&t2).await;
    assert_ne!(t2_expected, b2_expected);
    until_hit_raw(&p, &mut c, &t2, &t2_expected).await;
    // The mixed forms: binary parameter with text results, text parameter with binary results.
    let bt = bind_execute(
        "s1",
        2,
        &Formats {
            params: &[1],
            results: &[0],
        },
    );
    assert_eq!(origin.exchange_bytes(&bt).await, t2_expected);
    let (got, hit) = once(&p, &mut c, &bt).await;
    assert_eq!(got, t2_expected);
    assert!(!hit, "a binary parameter is not the text one's key");
    let tb = bind_execute(
        "s1",
        2,
        &Formats {
            params: &[0],
            results: &[1],
        },
    );
    assert_eq!(origin.exchange_bytes(&tb).await, b2_expected);
    until_hit_raw(&p, &mut c, &tb, &b2_expected).await;
    for _ in 0..5 {
        assert_eq!(once(&p, &mut c, &b2).await, (b2_expected.clone(), true));
        assert_eq!(once(&p, &mut c, &t2).await, (t2_expected.clone(), true));
    }
    // One code per column, all binary: the same entry as one code (a hit at once), and the
    // origin's bytes are the same too.
    let per_column = bind_execute(
        "s1",
        2,
        &Formats {
            params: &[1],
            results: &[1, 1, 1],
        },
    );
    assert_eq!(origin.exchange_bytes(&per_column).await, b2_expected);
    assert_eq!(
        once(&p, &mut c, &per_column).await,
        (b2_expected.clone(), true)
    );
    // Four equal codes for three columns would share that entry's key: the origin's error.
    let four = bind_execute(
        "s1",
        2,
        &Formats {
            params: &[1],
            results: &[1, 1, 1, 1],
        },
    );
    let four_expected = origin.exchange_bytes(&four).await;
    assert!(String::from_utf8_lossy(&four_expected).contains("4 result formats"));
    for _ in 0..3 {
        assert_eq!(
            once(&p, &mut c, &four).await,
            (four_expected.clone(), false)
        );
    }
    // Codes that differ per column: their own entry, the origin's bytes.
    let mixed = bind_execute(
        "s1",
        2,
        &Formats {
            params: &[1],
            results: &[1, 0, 0],
        },
    );
    let mixed_expected = origin.exchange_bytes(&mixed).await;
    assert_ne!(mixed_expected, b2_expected);
    assert_ne!(mixed_expected, t2_expected);
    until_hit_raw(&p, &mut c, &mixed, &mixed_expected).await;

    // A write through pgline: the next binary answer is the new one, never the old.
    for i in 0..10 {
        let w = c
            .simple(&format!(
                "UPDATE orders SET amount = amount + 1 WHERE id = {}",
                i * 3 + 1
            ))
            .await;
        assert_eq!(w[0], b'C', "{:?}", String::from_utf8_lossy(&w));
        let now = origin.exchange_bytes(&b2).await;
        if i == 0 {
            assert_ne!(now, b2_expected);
        }
        assert_eq!(
            c.exchange_bytes(&b2).await,
            now,
            "iteration {i}: stale binary answer"
        );
    }
    let now = origin.exchange_bytes(&b2).await;
    until_hit_raw(&p, &mut c, &b2, &now).await;
    p.shutdown().await;
}

/// tokio-postgres itself (prepare, then binary-format queries): the answers come from cache
/// and equal the origin's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokio_postgres_prepared_queries_hit_the_result_cache() {
    let Lab {
        db,
        origin_client,
        p,
        origin: _o,
        c: _c,
    } = lab("pgw_results_tokio").await;
    let (_, _, user, password) = pgline_testkit::origin::origin_base();
    let front = p.pg_addr().unwrap();
    let (client, conn) = tokio_postgres::connect(
        &format!(
            "host={} port={} user={user} password={password} dbname={}",
            front.ip(),
            front.port(),
            db.name
        ),
        tokio_postgres::NoTls,
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let sql = "SELECT status, count(*) AS n, min(id) AS first FROM orders \
               WHERE tenant_id = $1 GROUP BY status ORDER BY status";
    let ours = client.prepare(sql).await.unwrap();
    let theirs = origin_client.prepare(sql).await.unwrap();
    let rows = |r: Vec<tokio_postgres::Row>| {
        r.iter()
            .map(|r| {
                (
                    r.get::<_, String>(0),
                    r.get::<_, i64>(1),
                    r.get::<_, i64>(2),
                )
            })
            .collect::<Vec<_>>()
    };
    let before = hits(&p);
    let mut runs = 0;
    while hits(&p) < before + 20 {
        runs += 1;
        assert!(runs < 1000, "tokio-postgres queries never hit");
        for tenant in 1i64..=3 {
            let got = rows(client.query(&ours, &[&tenant]).await.unwrap());
            let want = rows(origin_client.query(&theirs, &[&tenant]).await.unwrap());
            assert_eq!(got, want);
        }
    }
    eprintln!("tokio-postgres: 20 hits after {runs} rounds of 3 queries");
    // How many rounds that took depends on how fast the writer stores answers and applies the
    // WAL (other tests load the machine and the origin). Once the applied WAL has passed the
    // origin's position, every query of a round is a hit.
    lab::sync(&p, &origin_client).await;
    let before = hits(&p);
    for tenant in 1i64..=3 {
        let got = rows(client.query(&ours, &[&tenant]).await.unwrap());
        let want = rows(origin_client.query(&theirs, &[&tenant]).await.unwrap());
        assert_eq!(got, want);
    }
    assert_eq!(hits(&p), before + 3, "a whole round after the sync hits");
    p.shutdown().await;
}

/// A binary parameter without a declared type whose type comes from elsewhere in the text
/// (`$1::float8`): its bytes are not the column's value, so the answer is dropped by any write
/// to the table, never kept past a write to its tenant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binary_parameter_typed_elsewhere_never_keeps_a_stale_answer() {
    use postgres_protocol::message::frontend;
    let Lab {
        db: _db,
        origin_client,
        p,
        mut origin,
        mut c,
    } = lab("pgw_results_bintyped").await;
    let sql = "SELECT count(*) FROM orders WHERE $1::float8 > 0 AND tenant_id = $1";
    let ours = prepare(&mut c, "f1", sql).await;
    assert_eq!(ours, prepare(&mut origin, "f1", sql).await, "prepare");
    let m = pgline_testkit::pg::msgs(|b| {
        frontend::bind(
            "",
            "f1",
            [1i16],
            [2.0f64],
            |v, buf| {
                buf.extend_from_slice(&v.to_be_bytes());
                Ok::<_, Box<dyn std::error::Error + Sync + Send>>(postgres_protocol::IsNull::No)
            },
            [1i16],
            b,
        )
        .map_err(|_| "bind")
        .unwrap();
        frontend::execute("", 0, b).unwrap();
        frontend::sync(b);
    });
    let expected = origin.exchange_bytes(&m).await;
    assert_eq!(
        expected[0],
        b'2',
        "{:?}",
        String::from_utf8_lossy(&expected)
    );
    until_hit_raw(&p, &mut c, &m, &expected).await;
    write(
        &origin_client,
        &p,
        "INSERT INTO orders VALUES (2000, 2, 1, 'open')",
    )
    .await;
    let now = origin.exchange_bytes(&m).await;
    assert_ne!(now, expected);
    assert_eq!(
        c.exchange_bytes(&m).await,
        now,
        "stale after a write to tenant 2"
    );
    p.shutdown().await;
}

/// A trigram threshold set and reset where `pg_trgm`'s library is not loaded (here: not even
/// installed) leaves an empty placeholder, which PostgreSQL reads as the default. Such a
/// session is served from cache like any other (read as `''` against the baseline's `0.3`, it
/// was refused for good and its backend closed at its end).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trigram_threshold_set_and_reset_is_the_default() {
    let Lab {
        db,
        p,
        mut origin,
        mut c,
        ..
    } = lab("pgw_results_trgm_reset").await;
    let q = "SELECT id, name FROM tenants WHERE id < 3 ORDER BY id";
    let plain = origin.simple(q).await;
    until_hit(&p, &mut c, Q::Simple(q), &plain).await;
    let mut session = Wire::connect(p.pg_addr().unwrap(), &db.name, &[]).await;
    session
        .simple("SET pg_trgm.similarity_threshold = 0.2")
        .await;
    session.simple("RESET pg_trgm.similarity_threshold").await;
    until_hit(&p, &mut session, Q::Simple(q), &plain).await;
    p.shutdown().await;
}

/// Settings the origin does not report that change what a cacheable statement answers
/// (`state::UNREPORTED`): with `quote_all_identifiers` on, `quote_ident` and `format('%I')`
/// quote every name; `text @@ text` matches under `default_text_search_config`; a zone
/// abbreviation in a literal means what `timezone_abbreviations` says (`IST` is Israel's
/// +02 by default, India's +05:30 under `India`). A session that changed one is answered by the
/// origin, never with the answer stored for sessions that did not. Before, the state read left
/// them out: the session's gate opened and it was served the stored answer (`acme` where
/// PostgreSQL answers `"acme"`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_whose_settings_change_an_answer_are_not_served_stored_answers() {
    let Lab {
        db,
        origin_client,
        p,
        mut origin,
        mut c,
    } = lab("pgw_results_settings").await;
    origin_client
        .batch_execute(
            "CREATE EXTENSION IF NOT EXISTS pg_trgm; \
             ALTER TABLE tenants ADD COLUMN motto text, ADD COLUMN founded timestamptz; \
             UPDATE tenants SET motto = 'cats are here', founded = '2026-01-01 09:00+00' WHERE id = 1; \
             UPDATE tenants SET motto = 'a cat', founded = '2026-01-01 11:00+00' WHERE id = 2; \
             UPDATE tenants SET motto = 'dogs', founded = '2026-01-01 06:00+00' WHERE id = 3;",
        )
        .await
        .unwrap();
    lab::sync(&p, &origin_client).await;
    for (set, q) in [
        (
            "SET quote_all_identifiers = on",
            "SELECT quote_ident(name), format('%I', name) FROM tenants WHERE id < 3 ORDER BY id",
        ),
        (
            "SET default_text_search_config = 'pg_catalog.simple'",
            "SELECT count(*) FROM tenants WHERE motto @@ 'cats'",
        ),
        (
            "SET timezone_abbreviations = 'India'",
            "SELECT count(*) FROM tenants WHERE founded < '2026-01-01 12:00 IST'",
        ),
        (
            "SET pg_trgm.similarity_threshold = 0.1",
            "SELECT count(*) FROM tenants WHERE name % 'acxyz'",
        ),
    ] {
        let plain = origin.simple(q).await;
        until_hit(&p, &mut c, Q::Simple(q), &plain).await;
        let mut origin_set = Wire::connect(origin_addr(), &db.name, &[]).await;
        origin_set.simple(set).await;
        let changed = origin_set.simple(q).await;
        assert_ne!(changed, plain, "{set}");
        let mut session = Wire::connect(p.pg_addr().unwrap(), &db.name, &[]).await;
        session.simple(set).await;
        for run in 0..20 {
            let before = hits(&p);
            assert_eq!(
                session.simple(q).await,
                changed,
                "{set}, run {run}: the answer stored for sessions without it"
            );
            assert_eq!(hits(&p), before, "{set}, run {run}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // The session without the setting is still served from cache.
        until_hit(&p, &mut c, Q::Simple(q), &plain).await;
    }
    p.shutdown().await;
}
