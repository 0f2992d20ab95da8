//! A point lookup's store miss on the PostgreSQL front, against a live pgline and the real
//! origin: one origin read (the core's own fill read, installed by the writer) answers the client, byte for byte as the origin
//! would, and fills the store; nothing is forwarded for it. A fill that is not known current
//! (it raced a write) is never served: the statement goes to the origin. A session answered from
//! a fill is fenced at the fill's WAL position, so it never reads older afterwards.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use pgline_controlplane::server::Pgline;
use pgline_testkit::pg::Wire;
use pgline_testkit::TestDb;
use pgline_testkit::{lab, origin};
use serde_json::Value;

const SCHEMA: &str = "
CREATE TABLE acct (id int8 PRIMARY KEY, bal int8 NOT NULL, note text, f float8, u uuid, ok bool);
INSERT INTO acct SELECT g, g * 10, CASE WHEN g % 3 = 0 THEN NULL ELSE 'note ' || g END,
  g / 7.0, md5(g::text)::uuid, g % 2 = 0 FROM generate_series(1, 200) g;
CREATE TABLE names (k text PRIMARY KEY, v int4);
INSERT INTO names VALUES ('a', 1), ('b', 2);
";

async fn get(base: &str, path: &str) -> String {
    let resp = reqwest::get(format!("{base}{path}")).await.expect("HTTP");
    assert_eq!(resp.status(), 200, "{path}");
    resp.text().await.expect("body")
}

/// The core counters this test reads, summed over cores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Counts {
    filled: u64,
    forwarded: u64,
    hits: u64,
    misses: u64,
}

/// A reply's messages, an ErrorResponse reduced to its code and message: the fields pgline
/// gives as PostgreSQL does when it raises the error itself (the others are pgline's).
fn comparable(reply: &[u8]) -> Vec<(u8, Vec<u8>)> {
    use pgline_testkit::pg::{error_field, frames};
    let error = |b: &[u8]| format!("{:?} {:?}", error_field(b, b'C'), error_field(b, b'M'));
    frames(reply)
        .into_iter()
        .map(|(t, body)| match t {
            b'E' => (t, error(&body).into_bytes()),
            _ => (t, body),
        })
        .collect()
}

/// Each batch's reply (`comparable`), on one session through pgline and on one straight at the
/// origin: `[pgline's, the origin's]`.
async fn through_both(
    p: &Pgline,
    db: &TestDb,
    batches: &[bytes::BytesMut],
) -> [Vec<Vec<(u8, Vec<u8>)>>; 2] {
    let mut replies = [Vec::new(), Vec::new()];
    for (i, addr) in [p.pg_addr().unwrap(), origin::origin_addr()]
        .into_iter()
        .enumerate()
    {
        let mut w = Wire::connect(addr, &db.name, &[]).await;
        for m in batches {
            replies[i].push(comparable(&w.exchange_bytes(m).await));
        }
    }
    replies
}

/// The same batches sent through pgline in one write, as a pipeline of several `Sync`s: each
/// batch's reply (`comparable`), in order.
async fn pipelined(
    p: &Pgline,
    db: &TestDb,
    batches: &[bytes::BytesMut],
) -> Vec<Vec<(u8, Vec<u8>)>> {
    let mut w = Wire::connect(p.pg_addr().unwrap(), &db.name, &[]).await;
    w.send(&batches.concat()).await;
    let mut replies = Vec::new();
    for _ in batches {
        let mut reply = Vec::new();
        loop {
            let (tag, body) = w.next().await;
            reply.push(tag);
            reply.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
            reply.extend_from_slice(&body);
            if tag == b'Z' {
                break;
            }
        }
        replies.push(comparable(&reply));
    }
    replies
}

fn counts(p: &Pgline) -> Counts {
    Counts {
        filled: p.shared.total(|s| &s.pg_lookup_filled),
        forwarded: p.shared.total(|s| &s.pg_lookup_fill_forwarded),
        hits: p.shared.total(|s| &s.keys_hit),
        misses: p.shared.total(|s| &s.keys_miss),
    }
}

/// `/metrics` samples by series.
fn samples(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
        .collect()
}

/// The relay's forwarded statements (`GET /v1/queries`) whose text mentions `word`.
async fn forwarded_mentioning(base: &str, word: &str) -> Vec<Value> {
    let list: Vec<Value> = serde_json::from_str(&get(base, "/v1/queries").await).unwrap();
    list.into_iter()
        .filter(|q| q["query"].as_str().unwrap_or("").contains(word))
        .collect()
}

async fn start(db: &TestDb, extra: &[String]) -> std::sync::Arc<Pgline> {
    let mut cfg = lab::config_with(&db.conn_string(), &lab::slot_name(db), 1, extra);
    cfg.api.open_reads = true;
    lab::start(cfg).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_lookup_is_one_origin_read_answered_byte_for_byte() {
    let db = TestDb::create("pgw_miss_bytes").await;
    let admin = db.client().await;
    admin.batch_execute(SCHEMA).await.unwrap();
    let p = start(&db, &[]).await;
    let base = format!("http://{}", p.api_addr().expect("the API is on"));
    let mut ours = Wire::connect(p.pg_addr().unwrap(), &db.name, &[]).await;
    let mut theirs = Wire::connect(origin::origin_addr(), &db.name, &[]).await;

    // Cold: every lookup misses; the fill answers it. The shared lab cluster's WAL moves with
    // other databases' writes, and a session whose fence (raised by each fill) is ahead of the
    // applied WAL is sent to the origin on purpose: wait for the WAL before each lookup.
    let before = counts(&p);
    let mut lookups = 0;
    for id in 1..=8 {
        lab::sync(&p, &admin).await;
        let sql = format!("SELECT * FROM acct WHERE id = {id}");
        assert_eq!(ours.simple(&sql).await, theirs.simple(&sql).await, "{sql}");
        lab::sync(&p, &admin).await;
        let (sql, key) = ("SELECT bal, note, u FROM acct WHERE id = $1", 100 + id);
        let k = key.to_string();
        assert_eq!(
            ours.extended(sql, &[&k], true).await,
            theirs.extended(sql, &[&k], true).await,
            "{sql} with {k}"
        );
        lookups += 2;
    }
    // No such row: SELECT 0 from the fill (the store records the absence).
    lab::sync(&p, &admin).await;
    let sql = "SELECT * FROM acct WHERE id = 100000";
    assert_eq!(ours.simple(sql).await, theirs.simple(sql).await);
    lookups += 1;
    let after = counts(&p);
    assert_eq!(
        (
            after.filled - before.filled,
            after.forwarded - before.forwarded
        ),
        (lookups, 0),
        "every cold lookup answered from its fill: {before:?} -> {after:?}"
    );
    assert_eq!(after.misses - before.misses, lookups);
    // Read on the core's own fill connection (kernel transport), not by the writer.
    assert_eq!(p.shared.total(|s| &s.pg_core_fills), lookups);
    // One origin statement per miss, the fill's: the relay forwarded none of them.
    let forwarded = forwarded_mentioning(&base, "acct").await;
    assert!(forwarded.is_empty(), "forwarded lookups: {forwarded:#?}");
    let m = samples(&get(&base, "/metrics").await);
    assert_eq!(
        m[r#"pgline_core_pg_lookup_filled_total{core="0"}"#],
        after.filled as f64
    );
    assert_eq!(
        m[r#"pgline_core_pg_lookup_fill_forwarded_total{core="0"}"#],
        0.0
    );

    // Warm now: the same lookups are hits, still the origin's bytes.
    for id in 1..=8 {
        lab::sync(&p, &admin).await;
        let sql = format!("SELECT * FROM acct WHERE id = {id}");
        assert_eq!(ours.simple(&sql).await, theirs.simple(&sql).await, "{sql}");
    }
    lab::sync(&p, &admin).await;
    assert_eq!(ours.simple(sql).await, theirs.simple(sql).await);
    let warm = counts(&p);
    assert_eq!(warm.hits - after.hits, 9, "{after:?} -> {warm:?}");
    assert_eq!(warm.filled, after.filled);
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_and_huge_keys_forward_or_answer_as_the_origin_does() {
    let db = TestDb::create("pgw_miss_keys").await;
    let admin = db.client().await;
    admin.batch_execute(SCHEMA).await.unwrap();
    let p = start(&db, &[]).await;
    let mut ours = Wire::connect(p.pg_addr().unwrap(), &db.name, &[]).await;
    let mut theirs = Wire::connect(origin::origin_addr(), &db.name, &[]).await;
    let huge = "x".repeat(200_000);
    let simple = [
        // Out of int8's range, not an integer: the origin's own errors.
        "SELECT * FROM acct WHERE id = 99999999999999999999".to_string(),
        "SELECT * FROM acct WHERE id = 'abc'".to_string(),
        // A non-canonical spelling of an existing key.
        "SELECT * FROM acct WHERE id = '007'".to_string(),
        // A 200 KB text key: no such row.
        format!("SELECT * FROM names WHERE k = '{huge}'"),
        "SELECT * FROM names WHERE k = 'b'".to_string(),
    ];
    for sql in &simple {
        lab::sync(&p, &admin).await;
        let (a, b) = (ours.simple(sql).await, theirs.simple(sql).await);
        assert_eq!(a, b, "{}", &sql[..sql.len().min(80)]);
    }
    let extended: [(&str, &str); 3] = [
        (
            "SELECT * FROM acct WHERE id = $1",
            "12345678901234567890123",
        ),
        ("SELECT * FROM acct WHERE id = $1", " 42"),
        ("SELECT v FROM names WHERE k = $1", &huge),
    ];
    for (sql, param) in extended {
        lab::sync(&p, &admin).await;
        let a = ours.extended(sql, &[param], true).await;
        let b = theirs.extended(sql, &[param], true).await;
        assert_eq!(a, b, "{sql} with {}", &param[..param.len().min(40)]);
    }
    // The session is still usable.
    lab::sync(&p, &admin).await;
    let sql = "SELECT * FROM acct WHERE id = 3";
    assert_eq!(ours.simple(sql).await, theirs.simple(sql).await);
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_updated_right_before_the_miss_reads_new() {
    let db = TestDb::create("pgw_miss_fresh").await;
    let admin = db.client().await;
    admin.batch_execute(SCHEMA).await.unwrap();
    let p = start(&db, &[]).await;
    let c = lab::pg_client(&p, &db).await;
    let select = c
        .prepare("SELECT bal FROM acct WHERE id = $1")
        .await
        .unwrap();
    for id in 1..=100i64 {
        let v = -id;
        admin
            .execute("UPDATE acct SET bal = $1 WHERE id = $2", &[&v, &id])
            .await
            .unwrap();
        let got: i64 = c.query_one(&select, &[&id]).await.unwrap().get(0);
        assert_eq!(got, v, "id {id}: read {got} after the origin wrote {v}");
    }
    let n = counts(&p);
    eprintln!("100 updated-then-missed lookups: {n:?}");
    assert!(n.filled > 0, "no lookup was answered from its fill: {n:?}");
    p.shutdown().await;
}

/// A core's own fill read is answered only when its snapshot sees every transaction the writer
/// applied (`crate::corefill`). An open transaction holds the snapshot's xmin back, but a write
/// applied after it is still seen (below xmax, not in progress): the read answers. Once more
/// transactions were applied than the writer keeps (`fill::RECENT_XIDS`), one of those it
/// dropped may be at or above that xmin, unseen for all the read can show: the lookup is
/// forwarded and answered by the origin. Once the open transaction ends, misses are answered
/// from the core's reads again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_core_read_not_known_current_is_forwarded() {
    let db = TestDb::create("pgw_miss_xmin").await;
    let admin = db.client().await;
    admin.batch_execute(SCHEMA).await.unwrap();
    admin
        .batch_execute("CREATE TABLE side (id int8 PRIMARY KEY)")
        .await
        .unwrap();
    let p = start(&db, &[]).await;
    let c = lab::pg_client(&p, &db).await;
    let select = c
        .prepare("SELECT bal FROM acct WHERE id = $1")
        .await
        .unwrap();
    let core_fills = |p: &Pgline| p.shared.total(|s| &s.pg_core_fills);

    // Current: a cold lookup is answered from the core's read. (A commit becomes visible to
    // new snapshots a moment after the WAL shows it, so a read can still miss an applied
    // transaction: the lookup is retried on the next cold id until one is read on the core.)
    lab::sync(&p, &admin).await;
    let (pr, cr, sr) = (&p, &c, &select);
    let core_filled = move |ids: std::ops::RangeInclusive<i64>| async move {
        for id in ids {
            let before = (counts(pr), core_fills(pr));
            let bal: i64 = cr.query_one(sr, &[&id]).await.unwrap().get(0);
            assert_eq!(bal, id * 10);
            let after = (counts(pr), core_fills(pr));
            if after.0.filled - before.0.filled == 1 {
                assert_eq!(
                    after.1 - before.1,
                    1,
                    "read on the core: {before:?} -> {after:?}"
                );
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("20 cold lookups in 2 s, none answered from the core's read");
    };
    core_filled(1..=20).await;

    // An open transaction with an xid, then a later write, committed and applied: the reads'
    // xmin is held back, yet they see the write, and answer. (Before the writer kept its
    // recent xids, the greatest applied xid had to precede xmin, and all three were forwarded.)
    let open = db.client().await;
    open.batch_execute("BEGIN; INSERT INTO side VALUES (1)")
        .await
        .unwrap();
    admin
        .execute("UPDATE acct SET bal = -150 WHERE id = 150", &[])
        .await
        .unwrap();
    lab::sync(&p, &admin).await;
    let lookups = |ids: [i64; 3]| async move {
        let before = counts(pr);
        for id in ids {
            let want = if id == 150 { -150 } else { id * 10 };
            let bal: i64 = cr.query_one(sr, &[&id]).await.unwrap().get(0);
            assert_eq!(bal, want, "id {id}");
        }
        // (A lookup can also reach the origin without a store read at all, while the
        // session's gate waits for the WAL past the fence of the one before: counted neither
        // as a miss nor as forwarded.)
        let after = counts(pr);
        let moved = (
            after.filled - before.filled,
            after.forwarded - before.forwarded,
            after.misses - before.misses,
        );
        (moved, before, after)
    };
    let ((filled, forwarded, missed), before, after) = lookups([150, 151, 152]).await;
    assert!(
        filled == missed && forwarded == 0 && filled >= 1,
        "reads that see every applied write answer, xmin held back or not: {before:?} -> {after:?}"
    );

    // More transactions applied than the writer keeps, the first transaction still open.
    let more = pgline_controlplane::fill::RECENT_XIDS + 100;
    admin
        .batch_execute(&format!(
            "DO $$ BEGIN FOR i IN 2..{} LOOP INSERT INTO side VALUES (i); COMMIT; END LOOP; END $$",
            more + 1
        ))
        .await
        .unwrap();
    lab::sync(&p, &admin).await;
    let rereads = || p.shared.total(|s| &s.pg_core_fill_rereads);
    let reads_before = (core_fills(pr), rereads());
    let ((filled, forwarded, missed), before, after) = lookups([153, 154, 155]).await;
    assert!(
        filled == 0 && forwarded == missed && forwarded >= 1,
        "reads whose xmin is older than the kept xids are forwarded: {before:?} -> {after:?}"
    );
    // Each was read twice on the core (the second read fails the same way), never a third time.
    assert_eq!(
        (core_fills(pr) - reads_before.0, rereads() - reads_before.1),
        (2 * forwarded, forwarded),
        "(core reads, second reads) of {forwarded} forwarded lookups"
    );

    // The transaction ends: reads are current again.
    open.batch_execute("COMMIT").await.unwrap();
    lab::sync(&p, &admin).await;
    core_filled(160..=179).await;
    p.shutdown().await;
}

/// A core runs at most two fill statements of its own; misses that arrive while both are in
/// flight wait on the core and share its next statement. Each read is held
/// (`origin.fill_delay_ms`) so that four staggered sessions find the core's two busy: all four
/// are read on the core, the last two together once the first statement lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misses_past_the_cores_two_reads_wait_for_the_next() {
    let db = TestDb::create("pgw_miss_overflow").await;
    let admin = db.client().await;
    admin.batch_execute(SCHEMA).await.unwrap();
    let p = start(&db, &["origin.fill_delay_ms=600".to_string()]).await;
    let statements = || p.shared.total(|s| &s.pg_core_fill_statements);
    let statements_before = statements();
    let (before, after, took) = lookups(&p, &admin, &db, 11..=14, 100).await;
    assert_eq!(
        (after.0.filled - before.0.filled, after.1 - before.1),
        (4, 4),
        "four misses answered from fills, all read on the core: {before:?} -> {after:?}"
    );
    // The first two each took a statement; the last two shared the third.
    assert_eq!(statements() - statements_before, 3, "fill statements");
    // About two rounds of the held reads: the waiting two were read as soon as a statement
    // landed, not left to a timeout.
    assert!(
        took < Duration::from_millis(2_300),
        "the four lookups took {took:?}"
    );
    p.shutdown().await;
}

/// Past the core's bound (`resp.miss_queue`: its misses queued or in flight), a miss goes to
/// the writer, whose fills answer it just the same: twenty lookups at once, the reads held
/// (`origin.fill_delay_ms`) so that none lands before all have arrived.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misses_past_the_cores_bound_go_to_the_writer() {
    let db = TestDb::create("pgw_miss_bound").await;
    let admin = db.client().await;
    admin.batch_execute(SCHEMA).await.unwrap();
    let p = start(
        &db,
        &[
            "origin.fill_delay_ms=600".to_string(),
            "resp.miss_queue=16".to_string(),
        ],
    )
    .await;
    let (before, after, _) = lookups(&p, &admin, &db, 11..=30, 0).await;
    assert_eq!(
        (after.0.filled - before.0.filled, after.1 - before.1),
        (20, 16),
        "twenty misses answered from fills, sixteen read on the core: {before:?} -> {after:?}"
    );
    p.shutdown().await;
}

/// A fill statement that cannot finish (its table locked by an open transaction's DDL lock) does
/// not hold the core's other misses: a miss of another table is read beside it by the core's
/// second statement (`corefill::FILLS_PER_CORE`). With one statement per core (measured
/// 2026-12-07, not taken: `docs/decisions.md`), that miss waited for the lock's holder or its
/// read's timeout (20 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_read_does_not_hold_the_cores_other_misses() {
    let db = TestDb::create("pgw_miss_blocked").await;
    let admin = db.client().await;
    admin.batch_execute(SCHEMA).await.unwrap();
    let p = start(&db, &["origin.query_timeout_ms=20000".to_string()]).await;
    lab::sync(&p, &admin).await;
    let blocked = lab::pg_client(&p, &db).await;
    let other = lab::pg_client(&p, &db).await;
    // Prepared before the lock: preparing a statement on a locked table waits for the lock too.
    let lookup = blocked
        .prepare("SELECT v FROM names WHERE k = $1")
        .await
        .unwrap();
    let before = p.shared.total(|s| &s.pg_core_fills);
    let locker = db.client().await;
    locker
        .batch_execute("BEGIN; LOCK TABLE names IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let waiting = tokio::spawn(async move {
        let v: i32 = blocked.query_one(&lookup, &[&"a"]).await.unwrap().get(0);
        v
    });
    // The blocked statement is in flight (the lookup is parked on the lock).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiting.is_finished(),
        "the lookup of the locked table returned"
    );
    let t = Instant::now();
    let bal: i64 = other
        .query_one("SELECT bal FROM acct WHERE id = $1", &[&5i64])
        .await
        .unwrap()
        .get(0);
    let took = t.elapsed();
    assert_eq!(bal, 50);
    assert!(
        took < Duration::from_secs(2),
        "the other table's miss waited {took:?} behind the blocked read"
    );
    assert_eq!(
        p.shared.total(|s| &s.pg_core_fills) - before,
        1,
        "the other miss was read on the core, while the blocked read is still in flight"
    );
    assert!(!waiting.is_finished(), "the lock was still held");
    locker.batch_execute("COMMIT").await.unwrap();
    assert_eq!(waiting.await.unwrap(), 1);
    p.shutdown().await;
}

/// A session per id looks its row up, `gap_ms` apart; (counts, core fills) before and after,
/// and how long the lookups took.
async fn lookups(
    p: &Pgline,
    admin: &tokio_postgres::Client,
    db: &TestDb,
    ids: std::ops::RangeInclusive<i64>,
    gap_ms: u64,
) -> ((Counts, u64), (Counts, u64), Duration) {
    lab::sync(p, admin).await;
    let before = (counts(p), p.shared.total(|s| &s.pg_core_fills));
    // Connected first (each waits for the WAL past its login fence), so that the reads start
    // `gap_ms` apart, well inside the first reads' 600 ms.
    let mut clients = Vec::new();
    for id in ids {
        clients.push((id, lab::pg_client(p, db).await));
    }
    lab::sync(p, admin).await;
    let started = Instant::now();
    let mut sessions = Vec::new();
    for (id, c) in clients {
        sessions.push(tokio::spawn(async move {
            let bal: i64 = c
                .query_one("SELECT bal FROM acct WHERE id = $1", &[&id])
                .await
                .unwrap()
                .get(0);
            assert_eq!(bal, id * 10, "id {id}");
        }));
        tokio::time::sleep(Duration::from_millis(gap_ms)).await;
    }
    for s in sessions {
        s.await.expect("a session's lookup");
    }
    let took = started.elapsed();
    let after = (counts(p), p.shared.total(|s| &s.pg_core_fills));
    (before, after, took)
}

/// The race, forced: the fill reads the row, then (`origin.fill_delay_ms`) an UPDATE of it
/// commits and is applied before the read lands. The read is not served: the core reads the
/// key again, and the session gets the new row from that second read (the store never keeps
/// the old one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fill_that_raced_an_update_is_never_served() {
    let (p, db, got, counted) = raced_lookup("pgw_miss_race", 7, 7).await;
    assert_eq!(got, 7007, "the raced read (70) was served");
    assert_eq!(counted, (1, 0, 1), "(filled, forwarded, read again)");
    // Nothing old was installed: the next lookup reads the new row.
    let admin = db.client().await;
    lab::sync(&p, &admin).await;
    let c = lab::pg_client(&p, &db).await;
    let again: i64 = c
        .query_one("SELECT bal FROM acct WHERE id = $1", &[&7i64])
        .await
        .unwrap()
        .get(0);
    assert_eq!(again, 7007);
    let stale = lab::stale_entries(&p, &admin).await;
    assert!(stale.is_empty(), "stale entries: {stale:?}");
    p.shutdown().await;
}

/// The common case under writers: an UPDATE of another row commits and is applied while the
/// read is held. The read is not known current (its snapshot missed a transaction pgline
/// applied), so the core reads the key once more and answers from that read rather than
/// forwarding the lookup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_that_missed_an_applied_write_is_read_again() {
    let (p, _db, got, counted) = raced_lookup("pgw_miss_reread", 8, 9).await;
    assert_eq!(got, 80);
    assert_eq!(counted, (1, 0, 1), "(filled, forwarded, read again)");
    p.shutdown().await;
}

/// Looks `lookup_id` up with every fill read held 1.5 s; 0.5 s in, `update_id`'s row is updated
/// (bal = id * 1001) and applied. Returns the answer and the (filled, forwarded, read again)
/// counts of the lookup.
async fn raced_lookup(
    name: &str,
    lookup_id: i64,
    update_id: i64,
) -> (std::sync::Arc<Pgline>, TestDb, i64, (u64, u64, u64)) {
    let db = TestDb::create(name).await;
    let admin = db.client().await;
    admin.batch_execute(SCHEMA).await.unwrap();
    let p = start(&db, &["origin.fill_delay_ms=1500".to_string()]).await;
    let c = lab::pg_client(&p, &db).await;
    lab::sync(&p, &admin).await;
    let before = counts(&p);
    let rereads = || p.shared.total(|s| &s.pg_core_fill_rereads);
    let reread_before = rereads();
    let lookup = tokio::spawn(async move {
        let row = c
            .query_one("SELECT bal FROM acct WHERE id = $1", &[&lookup_id])
            .await
            .unwrap();
        row.get::<_, i64>(0)
    });
    // The fill has read the row by now and holds it for the rest of the delay.
    tokio::time::sleep(Duration::from_millis(500)).await;
    admin
        .execute(
            "UPDATE acct SET bal = id * 1001 WHERE id = $1",
            &[&update_id],
        )
        .await
        .unwrap();
    let t = Instant::now();
    lab::sync(&p, &admin).await;
    assert!(
        t.elapsed() < Duration::from_millis(900),
        "the update was applied too late to race the fill ({:?})",
        t.elapsed()
    );
    let got = lookup.await.unwrap();
    let after = counts(&p);
    let counted = (
        after.filled - before.filled,
        after.forwarded - before.forwarded,
        rereads() - reread_before,
    );
    (p, db, got, counted)
}

/// Misses racing a stream of UPDATEs, many rows, no injected delay: every answer is at least
/// the value the origin had when the lookup was sent, and a session never sees a row go back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misses_racing_updates_never_serve_stale() {
    let db = TestDb::create("pgw_miss_loop").await;
    let admin = db.client().await;
    admin.batch_execute(SCHEMA).await.unwrap();
    let p = start(&db, &[]).await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // The writer bumps every row's balance, round after round, in single-row transactions.
    let writer = {
        let (stop, conn) = (stop.clone(), db.conn_string());
        tokio::spawn(async move {
            let w = origin::connect(&conn).await;
            let mut round = 0i64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                round += 1;
                for id in 1..=200i64 {
                    w.execute("UPDATE acct SET bal = bal + 1 WHERE id = $1", &[&id])
                        .await
                        .unwrap();
                }
            }
            round
        })
    };
    let c = lab::pg_client(&p, &db).await;
    let select = c
        .prepare("SELECT bal FROM acct WHERE id = $1")
        .await
        .unwrap();
    let probe = db.client().await;
    let mut seen = [i64::MIN; 201];
    let deadline = Instant::now() + Duration::from_secs(6);
    let mut reads = 0;
    while Instant::now() < deadline {
        for id in 1..=200i64 {
            let floor: i64 = probe
                .query_one("SELECT bal FROM acct WHERE id = $1", &[&id])
                .await
                .unwrap()
                .get(0);
            let got: i64 = c.query_one(&select, &[&id]).await.unwrap().get(0);
            assert!(
                got >= floor,
                "id {id}: read {got}, the origin had {floor} before"
            );
            assert!(got >= seen[id as usize], "id {id}: went back to {got}");
            seen[id as usize] = got;
            reads += 1;
        }
        // Drop the cached rows now and then so that lookups keep missing.
        p.flush_all().await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let rounds = writer.await.unwrap();
    let n = counts(&p);
    eprintln!("{reads} reads against {rounds} update rounds: 0 stale; {n:?}");
    assert!(n.filled > 0, "{n:?}");
    // What the last pass's reads installed (offered to the writer by the core) is not older
    // than the origin once the WAL is applied.
    lab::sync(&p, &admin).await;
    let stale = lab::stale_entries(&p, &admin).await;
    assert!(stale.is_empty(), "stale entries: {stale:?}");
    p.shutdown().await;
}

/// A session's lookup of `acct` row `id`, sent on a new session of `p` (started with a fill
/// delay, so that its core read is held) and left running 200 ms: the session, its prepared
/// lookup, and the task that returns the balance read.
async fn held_lookup(
    p: &Pgline,
    db: &TestDb,
    id: i64,
) -> (
    std::sync::Arc<tokio_postgres::Client>,
    tokio_postgres::Statement,
    tokio::task::JoinHandle<i64>,
) {
    let c = std::sync::Arc::new(lab::pg_client(p, db).await);
    let select = c
        .prepare("SELECT bal FROM acct WHERE id = $1")
        .await
        .unwrap();
    let reading = {
        let (c, select) = (c.clone(), select.clone());
        tokio::spawn(async move { c.query_one(&select, &[&id]).await.unwrap().get::<_, i64>(0) })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    (c, select, reading)
}

/// A core read asked before an operator's flush is not installed after it: the flush is how an
/// operator makes pgline read the origin again, and a read that was in flight (or held on the
/// core for the writer, `corefill::INSTALL_HOLD`) carries what the origin had before. The old
/// code installed it: the next lookup was a hit on the value read before the flush (this is how
/// `misses_racing_updates_never_serve_stale` once read behind the origin).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_asked_before_a_flush_is_not_installed_after_it() {
    let db = TestDb::create("pgw_miss_flush").await;
    let admin = db.client().await;
    admin.batch_execute(SCHEMA).await.unwrap();
    let p = start(&db, &["origin.fill_delay_ms=600".to_string()]).await;
    lab::sync(&p, &admin).await;
    let cached = p.dump().await.len();
    let core_fills = p.shared.total(|s| &s.pg_core_fills);
    // The read is sent, then held by the fill delay; the flush lands meanwhile.
    let (c, select, reading) = held_lookup(&p, &db, 3).await;
    assert!(!reading.is_finished(), "the read is held by the fill delay");
    p.flush_all().await;
    assert_eq!(reading.await.unwrap(), 30, "the read answers its session");
    assert_eq!(
        p.shared.total(|s| &s.pg_core_fills) - core_fills,
        1,
        "the lookup was read on the core"
    );
    // Past the core's hold and the writer's turn, nothing came back into the store.
    tokio::time::sleep(Duration::from_millis(300)).await;
    lab::sync(&p, &admin).await;
    let dumped = p.dump().await;
    assert!(
        dumped.is_empty(),
        "installed after the flush (cached before it: {cached}): {dumped:?}"
    );
    // A read asked after the flush is installed as before.
    let hits = counts(&p).hits;
    assert_eq!(
        c.query_one(&select, &[&3i64])
            .await
            .unwrap()
            .get::<_, i64>(0),
        30
    );
    lab::wait_cached(&p, 1).await;
    assert_eq!(
        c.query_one(&select, &[&3i64])
            .await
            .unwrap()
            .get::<_, i64>(0),
        30
    );
    assert_eq!(counts(&p).hits, hits + 1, "the second lookup hit");
    p.shutdown().await;
}

/// A core read asked before the slot was lost and re-created is not installed after the flush
/// that follows: the new slot streams nothing committed before it, so a row changed between the
/// read and the new slot would stay old in the store for good. The read is held by the fill
/// delay while the slot is dropped, the row updated in the gap, and the slot re-created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_asked_before_the_slot_was_recreated_is_not_installed() {
    let db = TestDb::create("pgw_miss_reset").await;
    let admin = db.client().await;
    admin.batch_execute(SCHEMA).await.unwrap();
    let p = start(
        &db,
        &[
            "origin.fill_delay_ms=4000".to_string(),
            "origin.query_timeout_ms=20000".to_string(),
            "replication.reconnect_backoff_ms=300".to_string(),
        ],
    )
    .await;
    lab::sync(&p, &admin).await;
    // The read has run (its snapshot taken) and is held by the fill delay.
    let (c, select, reading) = held_lookup(&p, &db, 4).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let slot = lab::slot_name(&db);
    lab::drop_slot(&admin, &slot).await;
    // Never streamed: no slot exists.
    admin
        .batch_execute("UPDATE acct SET bal = 4444 WHERE id = 4")
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(8);
    while p.repl.resets.load(std::sync::atomic::Ordering::Relaxed) == 0 {
        assert!(Instant::now() < deadline, "the slot was never re-created");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        !reading.is_finished(),
        "the read landed before the reset: the test proves nothing"
    );
    assert_eq!(
        reading.await.unwrap(),
        40,
        "the read answers as of its snapshot"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    lab::sync(&p, &admin).await;
    let stale = lab::stale_entries(&p, &admin).await;
    assert!(stale.is_empty(), "stale entries: {stale:?}");
    let bal: i64 = c.query_one(&select, &[&4i64]).await.unwrap().get(0);
    assert_eq!(bal, 4444);
    p.shutdown().await;
}

/// A fill reads the origin ahead of the applied WAL: a session answered from it must not then
/// read an older row from the store. The stream is cut (the walsender terminated, reconnect
/// held back) so that the store cannot apply a transaction that changed two rows; the session
/// reads the first (cold: its fill sees the change), then the second (cached, old in the store):
/// the fence sends it to the origin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_never_reads_older_than_its_fill() {
    let db = TestDb::create("pgw_miss_fence").await;
    let admin = db.client().await;
    admin.batch_execute(SCHEMA).await.unwrap();
    let p = start(&db, &["replication.reconnect_backoff_ms=4000".to_string()]).await;
    let c = lab::pg_client(&p, &db).await;
    let select = c
        .prepare("SELECT bal FROM acct WHERE id = $1")
        .await
        .unwrap();
    // Row 2 cached (a hit), row 1 never read.
    lab::sync(&p, &admin).await;
    let cached = p.dump().await.len();
    let _: i64 = c.query_one(&select, &[&2i64]).await.unwrap().get(0);
    lab::wait_cached(&p, cached + 1).await;
    lab::sync(&p, &admin).await;
    let hits = counts(&p).hits;
    assert_eq!(
        c.query_one(&select, &[&2i64])
            .await
            .unwrap()
            .get::<_, i64>(0),
        20
    );
    assert_eq!(counts(&p).hits, hits + 1, "row 2 is cached");
    let slot = lab::slot_name(&db);
    let killed: i64 = origin::admin_client()
        .await
        .query_one(
            "SELECT count(pg_terminate_backend(active_pid)) FROM pg_replication_slots \
             WHERE slot_name = $1 AND active_pid IS NOT NULL",
            &[&slot],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(killed, 1, "the walsender of {slot}");
    admin
        .batch_execute("UPDATE acct SET bal = bal + 1000 WHERE id IN (1, 2)")
        .await
        .unwrap();
    let before = counts(&p);
    let first: i64 = c.query_one(&select, &[&1i64]).await.unwrap().get(0);
    let second: i64 = c.query_one(&select, &[&2i64]).await.unwrap().get(0);
    let after = counts(&p);
    assert_eq!(first, 1010, "the fill reads the origin");
    assert_eq!(
        after.filled - before.filled,
        1,
        "row 1 came from its fill: {before:?} -> {after:?}"
    );
    assert_eq!(
        second, 1020,
        "after the fill's answer, row 2 from the store (20) would be older"
    );
    assert_eq!(after.hits, before.hits, "row 2 was not a hit");
    p.shutdown().await;
}

/// The core's miss queue (`resp.miss_queue`, 16 here) full: a point lookup that misses then is
/// forwarded to the origin without a fill, never both, and answered correctly. A RESP client
/// pipelines GETs of absent rows to keep the queue full while eight PostgreSQL sessions look up
/// 200 distinct rows; each lookup is answered once, from its fill or by the origin, so the
/// fills and the relay's calls add up to exactly the lookups (a lookup both filled and
/// forwarded would count twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_miss_queue_forwards_the_lookup_without_a_fill() {
    use pgline_testkit::resp::{encode, Raw};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    let db = TestDb::create("pgw_miss_full").await;
    let admin = db.client().await;
    admin.batch_execute(SCHEMA).await.unwrap();
    let p = start(&db, &["resp.miss_queue=16".to_string()]).await;
    let base = format!("http://{}", p.api_addr().expect("the API is on"));
    let queue_full = |p: &Pgline| p.shared.total(|s| &s.pg_queue_full);
    let before = (counts(&p), queue_full(&p));

    // The flood: pipelines of 2,000 GETs of rows that do not exist, each key once.
    let flooding = Arc::new(AtomicBool::new(true));
    let mut raw = Raw::connect(&p).await;
    let flood = {
        let flooding = flooding.clone();
        tokio::spawn(async move {
            let mut next = 1_000_000u64;
            while flooding.load(Ordering::Relaxed) {
                let mut pipeline = Vec::new();
                for _ in 0..2_000 {
                    pipeline.extend_from_slice(&encode(&["GET", &format!("acct:{next}")]));
                    next += 1;
                }
                raw.send(&pipeline).await;
                for _ in 0..2_000 {
                    raw.frame().await;
                }
            }
        })
    };
    let mut sessions = Vec::new();
    for s in 0..8i64 {
        let c = lab::pg_client(&p, &db).await;
        sessions.push(tokio::spawn(async move {
            let select = c
                .prepare("SELECT bal, note FROM acct WHERE id = $1")
                .await
                .unwrap();
            for id in (1..=200i64).filter(|id| id % 8 == s) {
                let row = c.query_one(&select, &[&id]).await.unwrap();
                let (bal, note): (i64, Option<String>) = (row.get(0), row.get(1));
                let want = (id % 3 != 0).then(|| format!("note {id}"));
                assert_eq!((bal, note), (id * 10, want), "id {id}");
            }
        }));
    }
    for s in sessions {
        s.await.expect("a session's lookups");
    }
    flooding.store(false, Ordering::Relaxed);
    flood.await.expect("the flood");

    let after = (counts(&p), queue_full(&p));
    let full = after.1 - before.1;
    assert!(
        full > 0,
        "the miss queue was never full: {before:?} -> {after:?}"
    );
    let filled = after.0.filled - before.0.filled;
    let forwarded: u64 = forwarded_mentioning(&base, "FROM acct")
        .await
        .iter()
        .map(|q| q["calls"].as_u64().unwrap_or(0))
        .sum();
    eprintln!(
        "200 lookups: {filled} from their fill, {forwarded} by the origin, queue full {full} times"
    );
    assert!(
        forwarded > 0,
        "no lookup was forwarded while the queue was full"
    );
    // Each session's prepare (Parse, Describe, Sync) is one forwarded call too.
    assert_eq!(
        filled + forwarded,
        200 + 8,
        "each lookup answered once, by its fill or the origin: {before:?} -> {after:?}"
    );
    p.shutdown().await;
}

/// A statement the core answered from cache reaches the relay first as a replayed Parse in
/// front of a forwarded batch; the client sees only its own messages' replies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_first_answered_from_cache_is_bound_at_the_origin_later() {
    use bytes::BytesMut;
    use postgres_protocol::message::frontend;
    let db = TestDb::create("pgw_miss_replay").await;
    let admin = db.client().await;
    admin.batch_execute(SCHEMA).await.unwrap();
    let p = start(&db, &[]).await;
    let mut ours = Wire::connect(p.pg_addr().unwrap(), &db.name, &[]).await;
    let mut theirs = Wire::connect(origin::origin_addr(), &db.name, &[]).await;
    // Past the login fence: the session's first lookup is a miss, not forwarded.
    lab::sync(&p, &admin).await;
    let mut first = BytesMut::new();
    frontend::parse("s1", "SELECT bal FROM acct WHERE id = $1", [], &mut first).unwrap();
    pgline_testkit::pg::bind_text(&mut first, "s1", &["5"]);
    frontend::execute("", 0, &mut first).unwrap();
    frontend::sync(&mut first);
    let mut again = BytesMut::new();
    pgline_testkit::pg::bind_text(&mut again, "s1", &["6"]);
    frontend::execute("", 0, &mut again).unwrap();
    frontend::sync(&mut again);
    // A second statement, answered from cache, then described at the origin.
    let mut second = BytesMut::new();
    frontend::parse("s2", "SELECT note FROM acct WHERE id = $1", [], &mut second).unwrap();
    pgline_testkit::pg::bind_text(&mut second, "s2", &["7"]);
    frontend::execute("", 0, &mut second).unwrap();
    frontend::sync(&mut second);
    let mut describe = BytesMut::new();
    frontend::describe(b'S', "s2", &mut describe).unwrap();
    frontend::sync(&mut describe);
    let before = counts(&p);
    let mut replies = Vec::new();
    for w in [&mut ours, &mut theirs] {
        let mut got = vec![w.exchange_bytes(&first).await];
        got.push(w.simple("BEGIN").await);
        got.push(w.exchange_bytes(&again).await);
        got.push(w.simple("COMMIT").await);
        got.push(w.exchange_bytes(&second).await);
        got.push(w.exchange_bytes(&describe).await);
        // Past the fence `second` brought (COMMIT closed the gate): `again` is a miss.
        lab::sync(&p, &admin).await;
        got.push(w.exchange_bytes(&again).await);
        replies.push(got);
    }
    let after = counts(&p);
    assert!(
        after.filled >= before.filled + 2,
        "both statements were first answered from their fills: {before:?} {after:?}"
    );
    assert_eq!(replies[0], replies[1], "the same bytes as the origin's");
    p.shutdown().await;
}

/// A Parse of a name the session holds fails with 42P05 and leaves the old statement, as on
/// PostgreSQL, also when the old one was answered from cache (the relay never saw it) and the
/// new one could be.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parse_of_a_held_name_keeps_the_old_statement() {
    use bytes::BytesMut;
    use pgline_testkit::pg::bind_text;
    use postgres_protocol::message::frontend;
    let db = TestDb::create("pgw_miss_reparse").await;
    let admin = db.client().await;
    admin.batch_execute(SCHEMA).await.unwrap();
    let p = start(&db, &[]).await;
    let mut ours = Wire::connect(p.pg_addr().unwrap(), &db.name, &[]).await;
    let mut theirs = Wire::connect(origin::origin_addr(), &db.name, &[]).await;
    // Past the login fence: the session's first lookup is a miss, not forwarded.
    lab::sync(&p, &admin).await;
    let run = |text: &str, key: &str| {
        let mut m = BytesMut::new();
        frontend::parse("s1", text, [], &mut m).unwrap();
        bind_text(&mut m, "s1", &[key]);
        frontend::execute("", 0, &mut m).unwrap();
        frontend::sync(&mut m);
        m
    };
    let first = run("SELECT bal FROM acct WHERE id = $1", "5");
    let reuse = run("SELECT note FROM acct WHERE id = $1", "4");
    let mut bind = BytesMut::new();
    bind_text(&mut bind, "s1", &["8"]);
    frontend::execute("", 0, &mut bind).unwrap();
    frontend::sync(&mut bind);
    let before = counts(&p);
    let mut replies = Vec::new();
    for w in [&mut ours, &mut theirs] {
        let first = w.exchange_bytes(&first).await;
        let reuse = w.exchange_bytes(&reuse).await;
        let reuse = comparable(&reuse);
        let again = w.exchange_bytes(&bind).await;
        replies.push((first, reuse, again));
    }
    assert!(
        counts(&p).filled > before.filled,
        "the first was answered from its fill"
    );
    assert_eq!(replies[0].1, replies[1].1, "42P05, and nothing run");
    assert_eq!(replies[0], replies[1], "the old statement stays");
    p.shutdown().await;
}

/// The unnamed statement outlives its batch, as on PostgreSQL: a session that parses it in one
/// batch and binds it in a later one gets its own, even when another session parsed its own
/// unnamed statement on the one pooled origin connection in between; once a simple Query has
/// destroyed it, a Bind fails with 26000. Compared with the same sessions straight at the
/// origin. Before the fix the later Bind ran the other session's statement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_unnamed_statement_is_the_sessions_own_across_batches() {
    use bytes::BytesMut;
    use pgline_testkit::pg::bind_text;
    use postgres_protocol::message::frontend;
    let db = TestDb::create("pgw_miss_unnamed").await;
    let p = start(&db, &["origin.pool_size=1".to_owned()]).await;
    let parse = |relname: &str, describe: bool| {
        let mut m = BytesMut::new();
        let sql = format!("SELECT relname::text FROM pg_class WHERE relname = '{relname}'");
        frontend::parse("", &sql, [], &mut m).unwrap();
        if describe {
            frontend::describe(b'S', "", &mut m).unwrap();
        }
        frontend::sync(&mut m);
        m
    };
    let mut bind = BytesMut::new();
    bind_text(&mut bind, "", &[]);
    frontend::execute("", 0, &mut bind).unwrap();
    frontend::sync(&mut bind);
    let mut query = BytesMut::new();
    frontend::query("SELECT 1", &mut query).unwrap();
    let mut replies = Vec::new();
    for addr in [p.pg_addr().unwrap(), origin::origin_addr()] {
        let mut a = Wire::connect(addr, &db.name, &[]).await;
        let mut b = Wire::connect(addr, &db.name, &[]).await;
        let described = a.exchange_bytes(&parse("pg_class", true)).await;
        b.exchange_bytes(&parse("pg_type", false)).await;
        let bound = a.exchange_bytes(&bind).await;
        let again = a.exchange_bytes(&bind).await;
        a.exchange_bytes(&query).await;
        let gone = comparable(&a.exchange_bytes(&bind).await);
        replies.push((described, bound, again, gone));
    }
    assert!(
        replies[1].1.windows(8).any(|w| w == b"pg_class"),
        "the origin binds the session's own statement"
    );
    assert_eq!(
        replies[0].1, replies[1].1,
        "the session's own statement, byte for byte"
    );
    assert_eq!(replies[0], replies[1]);
    assert_eq!(replies[0].3[0].0, b'E', "{:?}", replies[0].3);
    p.shutdown().await;
}

/// An unnamed statement answered from cache reaches the relay with the first forwarded batch
/// that uses it: a later Describe of it describes the session's statement, as on PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unnamed_statement_answered_from_cache_is_described_later() {
    use bytes::BytesMut;
    use pgline_testkit::pg::bind_text;
    use postgres_protocol::message::frontend;
    let db = TestDb::create("pgw_miss_unnamed_cached").await;
    let admin = db.client().await;
    admin.batch_execute(SCHEMA).await.unwrap();
    let p = start(&db, &[]).await;
    let mut lookup = BytesMut::new();
    frontend::parse("", "SELECT bal FROM acct WHERE id = $1", [], &mut lookup).unwrap();
    bind_text(&mut lookup, "", &["5"]);
    frontend::execute("", 0, &mut lookup).unwrap();
    frontend::sync(&mut lookup);
    let mut describe = BytesMut::new();
    frontend::describe(b'S', "", &mut describe).unwrap();
    frontend::sync(&mut describe);
    let mut replies = Vec::new();
    for addr in [p.pg_addr().unwrap(), origin::origin_addr()] {
        let mut w = Wire::connect(addr, &db.name, &[]).await;
        // Past the login fence, then past the first fill's: both lookups answered on the core.
        lab::sync(&p, &admin).await;
        w.exchange_bytes(&lookup).await;
        lab::sync(&p, &admin).await;
        let looked = w.exchange_bytes(&lookup).await;
        let described = w.exchange_bytes(&describe).await;
        replies.push((looked, described));
    }
    // Both lookups answered on the core (from the store, or from their fill when the first
    // fill's row had not landed yet): the relay never saw the Parse.
    let c = counts(&p);
    assert!(c.hits + c.filled >= 2 && c.forwarded == 0, "{c:?}");
    assert_eq!(replies[0], replies[1]);
    p.shutdown().await;
}

/// What PostgreSQL does to the unnamed statement, batch by batch, through pgline and straight
/// at the origin: an unnamed Parse skipped after an error leaves the old statement, Close
/// destroys it, and so does a simple Query, also one answered from cache. Errors are compared by
/// code and message (their other fields are pgline's when pgline raises them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_unnamed_statement_follows_skips_closes_and_cached_queries() {
    use bytes::BytesMut;
    use pgline_testkit::pg::bind_text;
    use postgres_protocol::message::frontend;
    let db = TestDb::create("pgw_miss_unnamed_life").await;
    let admin = db.client().await;
    admin.batch_execute(SCHEMA).await.unwrap();
    let p = start(&db, &[]).await;
    let lookup = "SELECT bal FROM acct WHERE id = $1";
    let batch = |f: &dyn Fn(&mut BytesMut)| {
        let mut m = BytesMut::new();
        f(&mut m);
        frontend::sync(&mut m);
        m
    };
    let bind = |m: &mut BytesMut| {
        bind_text(m, "", &["5"]);
        frontend::execute("", 0, m).unwrap();
    };
    let batches = [
        // The session's unnamed statement, not cacheable.
        batch(&|m| {
            frontend::parse("", "SELECT $1::int + 100", [], m).unwrap();
            bind(m);
        }),
        // An error first: the unnamed Parse of a cacheable lookup is skipped.
        batch(&|m| {
            frontend::parse("x", "SELEC", [], m).unwrap();
            frontend::parse("", lookup, [], m).unwrap();
        }),
        batch(&|m| bind(m)),
        batch(&|m| frontend::close(b'S', "", m).unwrap()),
        batch(&|m| bind(m)),
        // The unnamed statement again; a named lookup (its fence opens the session's gate);
        // the same row by a simple Query, answered on the core; then a Bind.
        batch(&|m| {
            frontend::parse("", "SELECT $1::int + 100", [], m).unwrap();
            bind(m);
        }),
        batch(&|m| {
            frontend::parse("y", lookup, [], m).unwrap();
            bind_text(m, "y", &["5"]);
            frontend::execute("", 0, m).unwrap();
        }),
        {
            let mut m = BytesMut::new();
            frontend::query("SELECT bal FROM acct WHERE id = 5", &mut m).unwrap();
            m
        },
        batch(&|m| bind(m)),
    ];
    let mut replies = Vec::new();
    let mut answered = 0;
    for addr in [p.pg_addr().unwrap(), origin::origin_addr()] {
        let mut w = Wire::connect(addr, &db.name, &[]).await;
        let mut each = Vec::new();
        for (i, m) in batches.iter().enumerate() {
            if i == 7 {
                // The named lookup's fence is applied: the Query is answered on the core.
                lab::sync(&p, &admin).await;
            }
            let before = counts(&p);
            let got = comparable(&w.exchange_bytes(m).await);
            each.push(got);
            let after = counts(&p);
            if i == 7 && after.hits + after.misses > before.hits + before.misses {
                answered += 1;
            }
        }
        replies.push(each);
    }
    assert_eq!(answered, 1, "pgline answered the Query on the core");
    assert_eq!(
        replies[1][2][1].1[6..],
        *b"105",
        "the origin ran the old statement"
    );
    for (i, (ours, theirs)) in replies[0].iter().zip(&replies[1]).enumerate() {
        assert_eq!(ours, theirs, "batch {i}");
    }
    p.shutdown().await;
}

/// A named Parse the origin does not take (skipped after an earlier error, or failed) leaves
/// no statement, as on PostgreSQL: a later Bind of the name fails with 26000 rather than being
/// answered from cache, and such names do not count against `pgwire.max_session_statements`.
/// Before the fix the core kept them: the Bind was answered from the store, and the fifth
/// failed prepare ended the session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parse_the_origin_did_not_take_leaves_no_statement() {
    use bytes::BytesMut;
    use pgline_testkit::pg::bind_text;
    use postgres_protocol::message::frontend;
    let db = TestDb::create("pgw_miss_unparsed").await;
    let admin = db.client().await;
    admin.batch_execute(SCHEMA).await.unwrap();
    let p = start(&db, &["pgwire.max_session_statements=4".to_owned()]).await;
    let lookup = "SELECT bal FROM acct WHERE id = $1";
    let mut batches = Vec::new();
    // The row is in the store (a lookup by the unnamed statement fills it).
    let mut m = BytesMut::new();
    frontend::parse("", lookup, [], &mut m).unwrap();
    bind_text(&mut m, "", &["5"]);
    frontend::execute("", 0, &mut m).unwrap();
    frontend::sync(&mut m);
    batches.push(m);
    for i in 0..8 {
        let mut m = BytesMut::new();
        frontend::parse("x", "SELEC", [], &mut m).unwrap();
        frontend::parse(&format!("s{i}"), lookup, [], &mut m).unwrap();
        frontend::sync(&mut m);
        batches.push(m);
        let mut m = BytesMut::new();
        bind_text(&mut m, &format!("s{i}"), &["5"]);
        frontend::execute("", 0, &mut m).unwrap();
        frontend::sync(&mut m);
        batches.push(m);
    }
    let replies = through_both(&p, &db, &batches).await;
    assert!(
        String::from_utf8_lossy(&replies[1][2][0].1).contains("26000"),
        "{:?}",
        replies[1][2]
    );
    for (i, (ours, theirs)) in replies[0].iter().zip(&replies[1]).enumerate() {
        assert_eq!(ours, theirs, "batch {i}");
    }
    p.shutdown().await;
}

/// A Close that an earlier error in its batch made PostgreSQL skip leaves the statement open,
/// whether the error was the origin's (a failed Parse) or pgline's own (42P05): a later Bind
/// runs it (here answered from the store), and a Parse of its name fails with 42P05. A Parse
/// of the same name after the skipped Close is skipped too, so the old text stays. Before the
/// fix pgline applied every Close: the Bind failed with 26000 and the Parse succeeded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_skipped_after_an_error_keeps_the_statement() {
    use bytes::BytesMut;
    use pgline_testkit::pg::bind_text;
    use postgres_protocol::message::frontend;
    let db = TestDb::create("pgw_miss_unclosed").await;
    let admin = db.client().await;
    admin.batch_execute(SCHEMA).await.unwrap();
    let p = start(&db, &[]).await;
    let lookup = "SELECT bal FROM acct WHERE id = $1";
    let run_a = || {
        let mut m = BytesMut::new();
        bind_text(&mut m, "a", &["5"]);
        frontend::execute("", 0, &mut m).unwrap();
        frontend::sync(&mut m);
        m
    };
    let mut batches = Vec::new();
    let mut m = BytesMut::new();
    frontend::parse("a", lookup, [], &mut m).unwrap();
    frontend::sync(&mut m);
    batches.push(m);
    batches.push(run_a());
    batches.push(run_a());
    // The origin's error skips the Close.
    let mut m = BytesMut::new();
    frontend::parse("x", "SELEC", [], &mut m).unwrap();
    frontend::close(b'S', "a", &mut m).unwrap();
    frontend::sync(&mut m);
    batches.push(m);
    batches.push(run_a());
    let mut m = BytesMut::new();
    frontend::parse("a", "SELECT 2", [], &mut m).unwrap();
    frontend::sync(&mut m);
    batches.push(m);
    // pgline's own 42P05 skips the Close.
    let mut m = BytesMut::new();
    frontend::parse("a", lookup, [], &mut m).unwrap();
    frontend::close(b'S', "a", &mut m).unwrap();
    frontend::sync(&mut m);
    batches.push(m);
    batches.push(run_a());
    // Still held at the core too: a Parse of another lookup under its name fails, and Binds
    // of the name, forwarded or answered from the store, run the old text.
    let mut m = BytesMut::new();
    frontend::parse("a", "SELECT note FROM acct WHERE id = $1", [], &mut m).unwrap();
    frontend::sync(&mut m);
    batches.push(m);
    batches.push(run_a());
    batches.push(run_a());
    // A skipped Close, then a skipped Parse of the same name: the old text stays.
    let mut m = BytesMut::new();
    frontend::parse("x", "SELEC", [], &mut m).unwrap();
    frontend::close(b'S', "a", &mut m).unwrap();
    frontend::parse("a", "SELECT 2", [], &mut m).unwrap();
    frontend::sync(&mut m);
    batches.push(m);
    batches.push(run_a());
    // A Close that stands still closes.
    let mut m = BytesMut::new();
    frontend::close(b'S', "a", &mut m).unwrap();
    frontend::sync(&mut m);
    batches.push(m);
    batches.push(run_a());
    // A Parse skipped after pgline's own 42P05 leaves no statement: its Bind fails (26000),
    // also once the session is served from cache again.
    for parses in [&["a"][..], &["a", "s3"][..]] {
        let mut m = BytesMut::new();
        for name in parses {
            frontend::parse(name, lookup, [], &mut m).unwrap();
        }
        frontend::sync(&mut m);
        batches.push(m);
    }
    batches.push(run_a());
    batches.push(run_a());
    let mut m = BytesMut::new();
    bind_text(&mut m, "s3", &["5"]);
    frontend::execute("", 0, &mut m).unwrap();
    frontend::sync(&mut m);
    batches.push(m);
    // A skipped Close of a statement whose own Parse in the batch failed, or was skipped,
    // brings nothing back: the name can be parsed, and the statement run.
    for first in [("s1", "SELEC 1"), ("x", "SELEC")] {
        let mut m = BytesMut::new();
        frontend::parse(first.0, first.1, [], &mut m).unwrap();
        if first.0 == "x" {
            frontend::parse("s1", lookup, [], &mut m).unwrap();
        }
        frontend::close(b'S', "s1", &mut m).unwrap();
        frontend::sync(&mut m);
        batches.push(m);
        batches.push(run_a());
        let mut m = BytesMut::new();
        frontend::parse("s1", lookup, [], &mut m).unwrap();
        bind_text(&mut m, "s1", &["5"]);
        frontend::execute("", 0, &mut m).unwrap();
        frontend::close(b'S', "s1", &mut m).unwrap();
        frontend::sync(&mut m);
        batches.push(m);
    }
    // A statement parsed, then an error: its skipped Close and the skipped Parse of its name
    // after it leave it held (the core cannot tell this from the name alone, since the
    // batch's second Parse of the name failed too).
    let mut m = BytesMut::new();
    frontend::parse("s4", lookup, [], &mut m).unwrap();
    frontend::parse("x", "SELEC", [], &mut m).unwrap();
    frontend::close(b'S', "s4", &mut m).unwrap();
    frontend::parse("s4", "SELECT 2", [], &mut m).unwrap();
    frontend::sync(&mut m);
    batches.push(m);
    let mut m = BytesMut::new();
    frontend::parse("s4", "SELECT note FROM acct WHERE id = $1", [], &mut m).unwrap();
    bind_text(&mut m, "s4", &["5"]);
    frontend::execute("", 0, &mut m).unwrap();
    frontend::sync(&mut m);
    batches.push(m);
    let mut m = BytesMut::new();
    bind_text(&mut m, "s4", &["5"]);
    frontend::execute("", 0, &mut m).unwrap();
    frontend::sync(&mut m);
    batches.push(m.clone());
    batches.push(m);
    // Parsed, closed and parsed again, then an error: the skipped second Close leaves the
    // second statement.
    let mut m = BytesMut::new();
    frontend::parse("t4", "SELECT note FROM acct WHERE id = $1", [], &mut m).unwrap();
    frontend::close(b'S', "t4", &mut m).unwrap();
    frontend::parse("t4", lookup, [], &mut m).unwrap();
    frontend::parse("x", "SELEC", [], &mut m).unwrap();
    frontend::close(b'S', "t4", &mut m).unwrap();
    frontend::parse("t4", "SELECT 3", [], &mut m).unwrap();
    frontend::sync(&mut m);
    batches.push(m);
    let mut m = BytesMut::new();
    bind_text(&mut m, "t4", &["5"]);
    frontend::execute("", 0, &mut m).unwrap();
    frontend::sync(&mut m);
    batches.push(m.clone());
    batches.push(m);
    // The unnamed statement: one answered from cache, then a batch whose own unnamed Parse is
    // skipped after an error; a Bind of the unnamed statement runs the one from cache.
    let unnamed = |text: &str, id: &str| {
        let mut m = BytesMut::new();
        frontend::parse("", text, [], &mut m).unwrap();
        bind_text(&mut m, "", &[id]);
        frontend::execute("", 0, &mut m).unwrap();
        frontend::sync(&mut m);
        m
    };
    batches.push(unnamed(lookup, "5"));
    batches.push(unnamed("SELECT note FROM acct WHERE id = $1", "7"));
    let mut m = BytesMut::new();
    frontend::parse("x", "SELEC", [], &mut m).unwrap();
    frontend::parse("", "SELECT 2", [], &mut m).unwrap();
    frontend::sync(&mut m);
    batches.push(m);
    let mut m = BytesMut::new();
    bind_text(&mut m, "", &["8"]);
    frontend::execute("", 0, &mut m).unwrap();
    frontend::sync(&mut m);
    batches.push(m);
    let replies = through_both(&p, &db, &batches).await;
    // What PostgreSQL answered: the row after the skipped Close, 42P05 for the Parse of the
    // held name, and 26000 once a Close stood.
    let has = |i: usize, tag: u8, text: &str| {
        replies[1][i]
            .iter()
            .any(|(t, b)| *t == tag && String::from_utf8_lossy(b).contains(text))
    };
    assert!(has(4, b'D', "") && has(5, b'E', "42P05") && has(8, b'E', "42P05"));
    assert!(
        has(12, b'D', "") && has(14, b'E', "26000"),
        "{:?}",
        replies[1]
    );
    assert!(
        has(16, b'E', "42P05") && has(19, b'E', "26000") && has(22, b'D', "") && has(25, b'D', ""),
        "{:?}",
        replies[1]
    );
    for (i, (ours, theirs)) in replies[0].iter().zip(&replies[1]).enumerate() {
        assert_eq!(ours, theirs, "batch {i}");
    }
    // The same batches as one pipeline of several `Sync`s, in one write: a later part that uses
    // a name an earlier part's skipped Close or Parse named answers as PostgreSQL does.
    let ours = pipelined(&p, &db, &batches).await;
    for (i, (ours, theirs)) in ours.iter().zip(&replies[1]).enumerate() {
        assert_eq!(ours, theirs, "pipelined, batch {i}");
    }
    p.shutdown().await;
}

/// A batch refused because no origin connection of its pool came free in time (SQLSTATE 53300,
/// `pgwire.pool_wait_ms`) ran nothing, as if its first message had failed: a Parse in it did
/// not make its statement, so the client's retry of that Parse succeeds, and a Close in it
/// did not close. Before the fix the core dropped the statement the refused Close named, so
/// its next Bind got 26000 "prepared statement does not exist" (and the core kept the refused
/// Parse booked: the retry still ran, through the relay, but the name was no longer served from
/// cache).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_refused_for_a_busy_pool_leaves_the_sessions_statements() {
    use bytes::BytesMut;
    use pgline_testkit::pg::{bind_text, error_field, msgs};
    use postgres_protocol::message::frontend;
    let db = TestDb::create("pgw_miss_busy").await;
    let admin = db.client().await;
    admin.batch_execute(SCHEMA).await.unwrap();
    let extra = ["pgwire.pool_size=1", "pgwire.pool_wait_ms=300"].map(str::to_owned);
    let p = start(&db, &extra).await;
    let lookup = "SELECT bal FROM acct WHERE id = $1";
    let tags = |reply: &[(u8, Vec<u8>)]| reply.iter().map(|(t, _)| *t).collect::<Vec<u8>>();
    let run = |name: &str, parse: Option<&str>| {
        let mut m = BytesMut::new();
        if let Some(text) = parse {
            frontend::parse(name, text, [], &mut m).unwrap();
        }
        bind_text(&mut m, name, &["5"]);
        frontend::execute("", 0, &mut m).unwrap();
        frontend::sync(&mut m);
        m
    };
    let mut holder = Wire::connect(p.pg_addr().unwrap(), &db.name, &[]).await;
    let mut client = Wire::connect(p.pg_addr().unwrap(), &db.name, &[]).await;
    // Past the login fences: `kept` below is a miss, not forwarded.
    lab::sync(&p, &admin).await;
    let simple = |sql: &str| msgs(|b| frontend::query(sql, b).unwrap());
    // `kept` is answered from its fill: only the core has seen it.
    let filled = p.shared.total(|s| &s.pg_lookup_filled);
    let first = client.exchange(&run("kept", Some(lookup))).await;
    assert_eq!(tags(&first), b"12DCZ", "{first:?}");
    assert!(p.shared.total(|s| &s.pg_lookup_filled) > filled);
    let code = |reply: &[(u8, Vec<u8>)]| error_field(&reply[0].1, b'C');
    let closed = || {
        let mut m = BytesMut::new();
        frontend::close(b'S', "s1", &mut m).unwrap();
        frontend::sync(&mut m);
        m
    };
    let refused_kept = {
        let mut m = BytesMut::new();
        frontend::parse("kept", "SELECT 2", [], &mut m).unwrap();
        frontend::close(b'S', "kept", &mut m).unwrap();
        frontend::parse("kept", "SELECT 3", [], &mut m).unwrap();
        frontend::sync(&mut m);
        m
    };
    let refused_s1 = {
        let mut m = BytesMut::new();
        frontend::parse("s1", lookup, [], &mut m).unwrap();
        frontend::close(b'S', "kept", &mut m).unwrap();
        bind_text(&mut m, "s1", &["5"]);
        frontend::execute("", 0, &mut m).unwrap();
        frontend::sync(&mut m);
        m
    };
    for refused in [refused_s1, refused_kept] {
        // The pool's one connection is held by another session's open transaction.
        assert_eq!(tags(&holder.exchange(&simple("BEGIN")).await), b"CZ");
        let reply = client.exchange(&refused).await;
        assert_eq!(tags(&reply), b"EZ", "{reply:?}");
        assert_eq!(code(&reply).as_deref(), Some("53300"), "{reply:?}");
        assert_eq!(tags(&holder.exchange(&simple("COMMIT")).await), b"CZ");
        // The refused Parse made nothing: a Bind of the name fails, and parsing it again,
        // here with another text, succeeds, and it runs.
        let bound = client.exchange(&run("s1", None)).await;
        assert_eq!(code(&bound).as_deref(), Some("26000"), "{bound:?}");
        for _ in 0..2 {
            let again = client
                .exchange(&run("s1", Some("SELECT note FROM acct WHERE id = $1")))
                .await;
            assert_eq!(tags(&again), b"12DCZ", "{again:?}");
            assert_eq!(tags(&client.exchange(&closed()).await), b"3Z");
        }
        // The refused Parses and Close of `kept` did nothing: the old statement still
        // runs, and its name is still taken.
        for _ in 0..3 {
            let kept = client.exchange(&run("kept", None)).await;
            assert_eq!(tags(&kept), b"2DCZ", "{kept:?}");
            assert!(
                kept[1].1.ends_with(b"50"),
                "the old statement's row: {kept:?}"
            );
        }
    }
    let mut reparse = BytesMut::new();
    frontend::parse("kept", "SELECT 2", [], &mut reparse).unwrap();
    frontend::sync(&mut reparse);
    let reply = client.exchange(&reparse).await;
    assert_eq!(code(&reply).as_deref(), Some("42P05"), "{reply:?}");
    p.shutdown().await;
}

/// A simple Query after extended-protocol messages, before their Sync: PostgreSQL skips it
/// after an error in the messages before it and waits for the Sync, which pgline would not
/// read before the batch's reply. pgline refuses the shape (0A000) and closes only that
/// connection; before, the session hung with its origin connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_inside_an_extended_batch_is_refused_not_hung() {
    use pgline_testkit::pg::{error_field, msgs};
    use postgres_protocol::message::frontend;
    let db = TestDb::create("pgw_miss_query_mid").await;
    let p = start(&db, &[]).await;
    let mut w = Wire::connect(p.pg_addr().unwrap(), &db.name, &[]).await;
    w.send(&msgs(|b| {
        frontend::parse("x", "SELEC", [], b).unwrap();
        frontend::query("SELECT 1", b).unwrap();
        frontend::sync(b);
    }))
    .await;
    let (tag, body) = w
        .message(Duration::from_secs(5))
        .await
        .expect("an answer, not a hang");
    assert_eq!(tag, b'E');
    assert_eq!(error_field(&body, b'C').as_deref(), Some("0A000"));
    assert_eq!(w.message(Duration::from_secs(5)).await, None, "closed");
    // Other sessions go on.
    let mut other = Wire::connect(p.pg_addr().unwrap(), &db.name, &[]).await;
    let reply = other
        .exchange(&msgs(|b| frontend::query("SELECT 1", b).unwrap()))
        .await;
    assert_eq!(reply.last().map(|m| m.0), Some(b'Z'));
    p.shutdown().await;
}

/// Notifications that reach a listening session's connection while pgline runs its own
/// statements there (here the fence and state read after each point lookup: a listening
/// session is pinned, so the read runs after the reply) reach the client, as they all do from
/// PostgreSQL. Before the fix pgline read them as part of its own round trip and dropped them
/// (3 to 7 of 300 in three runs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifications_during_pglines_own_statements_reach_the_client() {
    use bytes::BytesMut;
    use pgline_testkit::pg::bind_text;
    use postgres_protocol::message::frontend;
    const SENT: usize = 300;
    let db = TestDb::create("pgw_miss_notify").await;
    let admin = db.client().await;
    admin.batch_execute(SCHEMA).await.unwrap();
    let p = start(&db, &[]).await;
    let mut w = Wire::connect(p.pg_addr().unwrap(), &db.name, &[]).await;
    let mut got = w.exchange(&query("LISTEN ch")).await;
    let sender = tokio::spawn(async move {
        for i in 0..SENT {
            admin
                .batch_execute(&format!("NOTIFY ch, 'n{i}'"))
                .await
                .unwrap();
        }
    });
    let mut lookup = BytesMut::new();
    frontend::parse("", "SELECT bal FROM acct WHERE id = $1", [], &mut lookup).unwrap();
    bind_text(&mut lookup, "", &["5"]);
    frontend::execute("", 0, &mut lookup).unwrap();
    frontend::sync(&mut lookup);
    while !sender.is_finished() {
        got.extend(w.exchange(&lookup).await);
    }
    sender.await.unwrap();
    // Those that came while the session was idle are read with its next reply.
    tokio::time::sleep(Duration::from_millis(200)).await;
    got.extend(w.exchange(&query("SELECT 1")).await);
    let heard: std::collections::HashSet<_> = got
        .iter()
        .filter(|(t, _)| *t == b'A')
        .map(|(_, body)| body.clone())
        .collect();
    assert_eq!(heard.len(), SENT, "notifications heard");
    p.shutdown().await;
}

fn query(sql: &str) -> Vec<u8> {
    let mut m = bytes::BytesMut::new();
    postgres_protocol::message::frontend::query(sql, &mut m).unwrap();
    m.to_vec()
}
