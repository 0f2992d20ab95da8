//! The commit-visibility gap (docs/consistency.md): a commit record can be decoded and applied
//! before the committing transaction is visible to new snapshots. Hammer it: many writers on a
//! few rows, and misses forced continuously (flush, then read every key) so fills keep taking
//! leases right after WAL changes were applied; afterwards no entry may be older than the origin.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use pgline_testkit::TestDb;
use pgline_testkit::{lab, origin};

const KEYS: i64 = 16;
const WRITERS: usize = 6;

/// Each round writes its own 16 rows while they are filled again and again; its last fill lands
/// while the writes go on, and the writers then move to the next round's rows, so an entry
/// installed older than the last applied write stays stale until the end (where it is checked).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fills_never_install_a_row_older_than_an_applied_change() {
    let rounds: i64 = std::env::var("PGLINE_VIS_GAP_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(150);
    let db = TestDb::create("vis_gap").await;
    let origin = db.client().await;
    origin
        .batch_execute(&format!(
            "CREATE TABLE hot (id int8 PRIMARY KEY, v int8 NOT NULL);
             INSERT INTO hot SELECT g, 0 FROM generate_series(1, {}) g;",
            rounds * KEYS
        ))
        .await
        .unwrap();
    let p = lab::start(lab::config(&db, 1)).await;
    let mut r = lab::redis(&p).await;

    let round = Arc::new(AtomicI64::new(0));
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let conn = db.conn_string();
        let round = round.clone();
        writers.push(tokio::spawn(async move {
            let c = origin::connect(&conn).await;
            let mut n = w as i64;
            loop {
                let k = round.load(Ordering::Relaxed);
                if k < 0 {
                    return;
                }
                let id = k * KEYS + n % KEYS + 1;
                c.execute("UPDATE hot SET v = v + 1 WHERE id = $1", &[&id])
                    .await
                    .unwrap();
                n += 1;
            }
        }));
    }
    for k in 0..rounds {
        round.store(k, Ordering::Relaxed);
        let keys: Vec<String> = (1..=KEYS)
            .map(|i| format!("hot:{}", k * KEYS + i))
            .collect();
        for _ in 0..4 {
            let _: Vec<Option<String>> = redis::cmd("MGET")
                .arg(&keys)
                .query_async(&mut r)
                .await
                .unwrap();
            for key in &keys {
                p.flush_key(key).await.unwrap();
            }
        }
        let _: Vec<Option<String>> = redis::cmd("MGET")
            .arg(&keys)
            .query_async(&mut r)
            .await
            .unwrap();
    }
    // Stop the writers and wait for their last UPDATE (an aborted task's statement could
    // still commit after the sync below).
    round.store(-1, Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    lab::sync(&p, &origin).await;
    let stale = lab::stale_entries(&p, &origin).await;
    assert!(stale.is_empty(), "after {rounds} rounds: stale {stale:?}");
    p.shutdown().await;
}
