//! Coherence under load: writers update random rows while readers hammer MGET; after the writers
//! stop and the WAL is drained, every cached entry must equal the origin's row. Run once plainly
//! and once with the replication connection killed mid-run.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pgline_testkit::lab;
use pgline_testkit::TestDb;
use rand::Rng;

const ROWS: i64 = 2_000;

fn seconds() -> u64 {
    std::env::var("PGLINE_STALE_PROBE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20)
}

/// The two probes run one after the other: each walsender decodes the whole cluster's WAL, so
/// two write storms at once would mostly measure each other.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn probe(kill_stream: bool) {
    let _serial = SERIAL.lock().await;
    let db = TestDb::create(if kill_stream { "probe_kill" } else { "probe" }).await;
    let origin = db.client().await;
    origin
        .batch_execute(&format!(
            "CREATE TABLE items (id int4 PRIMARY KEY, v int8 NOT NULL, note text);
             INSERT INTO items SELECT g, 0, 'n' || g FROM generate_series(1, {ROWS}) g;"
        ))
        .await
        .unwrap();
    let p = Arc::new(lab::start(lab::config(&db, 2)).await);
    let stop = Arc::new(AtomicBool::new(false));
    let writes = Arc::new(AtomicU64::new(0));
    let reads = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let client = db.client().await;
        let (stop, writes) = (stop.clone(), writes.clone());
        tasks.push(tokio::spawn(async move {
            let stmt = client
                .prepare("UPDATE items SET v = v + 1, note = md5(random()::text) WHERE id = $1")
                .await
                .unwrap();
            while !stop.load(Ordering::Relaxed) {
                let id: i32 = rand::thread_rng().gen_range(1..=ROWS as i32);
                client.execute(&stmt, &[&id]).await.unwrap();
                writes.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for _ in 0..32 {
        let mut r = lab::redis(&p).await;
        let (stop, reads) = (stop.clone(), reads.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let keys: Vec<String> = (0..16)
                    .map(|_| format!("items:{}", rand::thread_rng().gen_range(1..=ROWS + 50)))
                    .collect();
                let got: Vec<Option<String>> = redis::cmd("MGET")
                    .arg(&keys)
                    .query_async(&mut r)
                    .await
                    .expect("MGET");
                assert_eq!(got.len(), 16);
                reads.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let started = Instant::now();
    let run = Duration::from_secs(seconds());
    let mut killed = false;
    while started.elapsed() < run {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if kill_stream && !killed && started.elapsed() > run / 2 {
            let n = origin
                .execute(
                    "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE database = current_database() AND active_pid IS NOT NULL",
                    &[],
                )
                .await
                .unwrap();
            assert_eq!(n, 1, "one walsender to kill");
            killed = true;
        }
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    lab::sync(&p, &origin).await;
    let entries = p.dump().await.len();
    let stale = lab::stale_entries(&p, &origin).await;
    let hits = p.shared.total(|s| &s.keys_hit) + p.shared.total(|s| &s.keys_negative_hit);
    let misses = p.shared.total(|s| &s.keys_miss);
    let bypass = p.shared.total(|s| &s.keys_bypass);
    eprintln!(
        "stale probe (kill={kill_stream}): {} writes, {} MGETs, {entries} cached entries checked, {} stale, \
         reconnects {}, key hits {hits}, misses {misses}, bypassed {bypass}",
        writes.load(Ordering::Relaxed),
        reads.load(Ordering::Relaxed),
        stale.len(),
        p.repl.reconnects.load(Ordering::Relaxed),
    );
    assert!(
        hits > misses + bypass,
        "hits must dominate under writes: {hits} hits, {misses} misses, {bypass} bypassed"
    );
    assert!(
        writes.load(Ordering::Relaxed) > 1000,
        "writers made too little progress"
    );
    assert!(
        entries > 500,
        "too few entries cached to mean anything: {entries}"
    );
    assert!(
        stale.is_empty(),
        "{} stale entries, e.g. {:?}",
        stale.len(),
        &stale[..stale.len().min(5)]
    );
    if kill_stream {
        assert!(
            p.repl.reconnects.load(Ordering::Relaxed) >= 1,
            "the consumer never reconnected"
        );
    }
    Arc::try_unwrap(p)
        .ok()
        .expect("no other owner")
        .shutdown()
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_stale_entries_after_concurrent_writes() {
    probe(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_stale_entries_after_the_replication_connection_is_killed() {
    probe(true).await;
}
