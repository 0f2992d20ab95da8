//! Tailing a standby (`replication.url`, PostgreSQL 16+; run on 18): the WAL stream and the
//! slot live on a physical standby, the publication, fills and relay on the primary. An UPDATE
//! on the primary reaches the cache through the standby; commit→cache latency is measured
//! against a second pgline tailing the primary itself.
//!
//! Uses its own pair on ports 54342/54343 (`deploy/lab/pair.sh`); skips with a message when
//! `deploy/lab/pg18.sh` cannot provide PostgreSQL 18.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use pgline_testkit::lab;
use pgline_testkit::origin::origin_json;
use pgline_testkit::pair::{pg18_bin, Pair};

const DB: &str = "tail";
const ROUNDS: usize = 40;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn standby_tail_reaches_the_cache() {
    let bin = match pg18_bin() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("SKIPPED: PostgreSQL 18 binaries unavailable ({e})");
            return;
        }
    };
    let t0 = Instant::now();
    let pair = Pair::start(&bin, "/var/tmp/pgline-pair-standby", 54342, 54343, true).await;
    let admin = pair.primary("postgres").await;
    admin
        .batch_execute(&format!("CREATE DATABASE {DB}"))
        .await
        .unwrap();
    // The pair's primary holds failover slots back for the standby (synchronized_standby_slots),
    // which would make tailing the primary wait for the standby too: without it the comparison
    // is the standby's cost alone.
    admin
        .batch_execute("ALTER SYSTEM SET synchronized_standby_slots = ''")
        .await
        .unwrap();
    admin
        .batch_execute("SELECT pg_reload_conf()")
        .await
        .unwrap();
    let primary = pair.primary(DB).await;
    primary
        .batch_execute(
            "CREATE TABLE items (id int4 PRIMARY KEY, v int8 NOT NULL);
             INSERT INTO items SELECT g, 0 FROM generate_series(1, 10) g;",
        )
        .await
        .unwrap();
    let primary_url = pair.url_at(pair.primary_port, DB);
    let standby_url = pair.url_at(pair.standby_port, DB);
    let on_standby = lab::start(lab::config_with(
        &primary_url,
        "pgline_tail_standby",
        1,
        &[format!("replication.url={}", lab::toml_str(&standby_url))],
    ))
    .await;
    let on_primary = lab::start(lab::config_with(
        &primary_url,
        "pgline_tail_primary",
        1,
        &[],
    ))
    .await;

    // The slot is on the standby (not a failover slot there), none on the primary for it.
    let standby = pair.standby("postgres").await;
    let n: i64 = standby
        .query_one(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'pgline_tail_standby' \
             AND NOT failover",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 1, "the slot is not on the standby");
    let n: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'pgline_tail_standby'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 0, "the standby's slot is on the primary too");
    assert!(!on_standby.repl.slot_failover.load(Ordering::Acquire));

    let mut r = lab::redis(&on_standby).await;
    let _: Option<String> = redis::cmd("GET")
        .arg("items:1")
        .query_async(&mut r)
        .await
        .unwrap();
    let mut via_standby = Vec::new();
    let mut via_primary = Vec::new();
    for i in 1..=ROUNDS as i64 {
        primary
            .execute("UPDATE items SET v = $1 WHERE id = 1", &[&i])
            .await
            .unwrap();
        let committed = Instant::now();
        // The insert position after the commit returned lies past the commit record. One read
        // inside the UPDATE would lie before it: a standby that has replayed the change but not
        // yet the commit reports a WAL end past that position, and rightly, since no commit
        // before it is missing from the cache.
        let lsn = primary
            .query_one(
                "SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::int8",
                &[],
            )
            .await
            .unwrap()
            .get::<_, i64>(0) as u64;
        let (mut s, mut p) = (None, None);
        while s.is_none() || p.is_none() {
            assert!(
                committed.elapsed() < Duration::from_secs(20),
                "update {i} never reached both caches"
            );
            if s.is_none() && on_standby.applied_lsn() >= lsn {
                s = Some(committed.elapsed());
            }
            if p.is_none() && on_primary.applied_lsn() >= lsn {
                p = Some(committed.elapsed());
            }
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        via_standby.push(s.unwrap().as_secs_f64() * 1e3);
        via_primary.push(p.unwrap().as_secs_f64() * 1e3);
        // The cache tailing the standby answers the new row.
        let got: Option<String> = redis::cmd("GET")
            .arg("items:1")
            .query_async(&mut r)
            .await
            .unwrap();
        assert_eq!(got, origin_json(&primary, "items", 1).await, "round {i}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (ms, mp) = (median(&mut via_standby), median(&mut via_primary));
    let (xs, xp) = (
        via_standby.last().copied().unwrap(),
        via_primary.last().copied().unwrap(),
    );
    eprintln!(
        "commit→applied over {ROUNDS} updates: tailing the standby median {ms:.2} ms (max {xs:.2}), \
         tailing the primary median {mp:.2} ms (max {xp:.2}); the standby adds {:.2} ms; \
         standby_replay_lag_ms now {}; test {:.1} s",
        ms - mp,
        on_standby.repl.standby_replay_lag_ms.load(Ordering::Acquire),
        t0.elapsed().as_secs_f64()
    );
    on_standby.shutdown().await;
    on_primary.shutdown().await;
}
