//! `metrics::render` over a real running pgline: the counters and the service-time histogram
//! move with real RESP traffic, and replication shows as streaming.

use pgline_controlplane::metrics::{render, MetricsSnapshot};
use pgline_dataplane::store::StoreStats;
use pgline_testkit::lab;
use pgline_testkit::TestDb;
use std::time::Duration;

/// The value of sample `series` (exact name and labels) in `text`.
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no sample {series} in\n{text}"))
}

fn scrape(p: &pgline_controlplane::server::Pgline) -> String {
    render(&MetricsSnapshot {
        shared: &p.shared,
        repl: &p.repl,
        store: StoreStats::default(),
        pool: deadpool_postgres::Status {
            max_size: 4,
            size: 1,
            available: 1,
            waiting: 0,
        },
        now_us: pgline_controlplane::clock::unix_now_us(),
        api_refusals: Default::default(),
    })
}

#[tokio::test]
async fn counters_and_latency_follow_real_traffic() {
    let db = TestDb::create("metrics").await;
    let client = db.client().await;
    client
        .batch_execute(
            "CREATE TABLE t (id int4 PRIMARY KEY, v text);
             INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 50) g;",
        )
        .await
        .unwrap();
    let p = lab::start(lab::config(&db, 2)).await;
    let before = scrape(&p);
    assert_eq!(sample(&before, "pgline_replication_streaming"), 1.0);
    assert_eq!(sample(&before, "pgline_replication_serve_hits"), 1.0);
    assert!(sample(&before, "pgline_replication_applied_lsn") > 0.0);

    let redis = redis::Client::open(format!("redis://{}", p.local_addr())).unwrap();
    let mut conn = redis.get_multiplexed_async_connection().await.unwrap();
    for round in 0..3 {
        for id in 1..=50 {
            let v: Option<String> = redis::cmd("GET")
                .arg(format!("t:{id}"))
                .query_async(&mut conn)
                .await
                .unwrap();
            assert!(v.is_some(), "round {round} id {id}");
        }
    }
    let core_sum = |text: &str, name: &str| -> f64 {
        (0..2)
            .map(|c| sample(text, &format!("{name}{{core=\"{c}\"}}")))
            .sum()
    };
    // A turn's service time is recorded after its replies are written: the last GET's may land
    // just after the client has its answer.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let after = loop {
        let text = scrape(&p);
        if core_sum(&text, "pgline_core_service_seconds_count") >= 150.0
            || std::time::Instant::now() > deadline
        {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let sum = |name: &str| core_sum(&after, name);
    assert_eq!(
        sum("pgline_core_keys_miss_total"),
        50.0,
        "first round misses"
    );
    assert_eq!(sum("pgline_core_keys_hit_total"), 100.0, "then hits");
    let commands = sum("pgline_core_resp_commands_total");
    assert!(commands >= 150.0, "{commands}");
    let observed = sum("pgline_core_service_seconds_count");
    // Every GET was executed in a timed turn; the client's connection setup may add one more.
    assert!(
        observed >= 150.0 && observed <= commands,
        "{observed} of {commands}"
    );
    assert!(sum("pgline_core_service_seconds_sum") > 0.0);
    assert_eq!(sum("pgline_core_connections_open"), 1.0);
    drop(conn);
    p.shutdown().await;
}
