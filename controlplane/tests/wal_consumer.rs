//! The WAL consumer task against the lab PostgreSQL, with a fake applier in each test.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use pgline_controlplane::lsn::parse_lsn;
use pgline_controlplane::wal::{
    run_consumer, slot, Change, PublicationScope, ReplicationState, TupleValue, WalConfig,
    WalEvent, WalTxn,
};
use pgline_testkit::origin;
use pgline_testkit::TestDb;
use tokio::sync::{mpsc, watch};

const WAIT: Duration = Duration::from_secs(20);

struct Harness {
    state: Arc<ReplicationState>,
    rx: mpsc::Receiver<WalEvent>,
    shutdown: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    slot: String,
}

impl Harness {
    async fn start(db: &TestDb, tables: &[&str], backoff: Duration) -> Harness {
        let slot = format!("{}_s", db.name);
        let mut cfg = WalConfig::new(
            &slot,
            "pgline_pub",
            PublicationScope::Tables(tables.iter().map(|t| t.to_string()).collect()),
        );
        cfg.status_interval = Duration::from_millis(200);
        cfg.keepalive_request_interval = Duration::from_millis(50);
        cfg.reconnect_backoff = backoff;
        let origin =
            pgline_controlplane::origin::Settings::parse(&db.conn_string()).expect("conn string");
        let state = Arc::new(ReplicationState::default());
        let (tx, rx) = mpsc::channel(16);
        let (shutdown, shutdown_rx) = watch::channel(false);
        let task = tokio::spawn(run_consumer(origin, cfg, state.clone(), tx, shutdown_rx));
        let h = Harness {
            state,
            rx,
            shutdown,
            task,
            slot,
        };
        h.wait_until("streaming", |s| s.streaming.load(Ordering::Acquire))
            .await;
        h
    }

    async fn wait_until(&self, what: &str, f: impl Fn(&ReplicationState) -> bool) {
        let deadline = Instant::now() + WAIT;
        while !f(&self.state) {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The fake applier, without waiting: applies whatever has arrived (Progress from other
    /// databases' WAL included, which parallel tests write).
    fn apply_arrived(&mut self) {
        while let Ok(ev) = self.rx.try_recv() {
            self.apply_event(ev);
        }
    }

    /// The fake applier's step: applies a transaction or Progress; returns the transaction.
    fn apply_event(&self, ev: WalEvent) -> Option<WalTxn> {
        match ev {
            WalEvent::Txn(t) => {
                self.apply(t.end_lsn);
                Some(t)
            }
            WalEvent::Progress { lsn } => {
                self.apply(lsn);
                None
            }
            WalEvent::Reset { reason, .. } => panic!("unexpected reset: {reason}"),
            WalEvent::Failover { fork } => panic!("unexpected failover (fork {fork})"),
        }
    }

    /// A stalled applier that still takes events off the channel: keeps them in `held`, in
    /// order, applying none.
    fn hold_arrived(&mut self, held: &mut Vec<WalEvent>) {
        while let Ok(ev) = self.rx.try_recv() {
            held.push(ev);
        }
    }

    /// The fake applier: applies Progress, returns the next transaction (applied too).
    async fn next_txn(&mut self) -> WalTxn {
        loop {
            let ev = self.next_event().await;
            if let Some(t) = self.apply_event(ev) {
                return t;
            }
        }
    }

    async fn next_event(&mut self) -> WalEvent {
        tokio::time::timeout(WAIT, self.rx.recv())
            .await
            .expect("event in time")
            .expect("consumer alive")
    }

    fn apply(&self, lsn: u64) {
        self.state.applied_lsn.fetch_max(lsn, Ordering::AcqRel);
    }

    async fn stop(self) {
        let _ = self.shutdown.send(true);
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("consumer stops")
            .expect("consumer task");
    }
}

fn text(s: &str) -> TupleValue {
    TupleValue::Text(Bytes::copy_from_slice(s.as_bytes()))
}

async fn current_lsn(client: &tokio_postgres::Client) -> u64 {
    let row = client
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .expect("lsn");
    parse_lsn(row.get(0)).expect("parse lsn")
}

#[tokio::test]
async fn decodes_row_changes() {
    let db = TestDb::create("walc_decode").await;
    let client = db.client().await;
    client
        .batch_execute(
            "CREATE TABLE items (a int, b text, c numeric, d timestamptz, e jsonb, f bool, \
             big text, PRIMARY KEY (a, b)); \
             ALTER TABLE items ALTER big SET STORAGE EXTERNAL;",
        )
        .await
        .expect("table");
    let mut h = Harness::start(&db, &["items"], Duration::from_millis(200)).await;

    client
        .batch_execute(
            "INSERT INTO items VALUES (1, 'x', 1.5, '2024-01-02 03:04:05+00', '{\"k\": 1}', \
             true, NULL)",
        )
        .await
        .expect("insert");
    let t = h.next_txn().await;
    assert!(t.end_lsn > t.commit_lsn && t.commit_lsn > 0);
    let now = pgline_controlplane::clock::unix_now_us();
    assert!(
        (now - t.commit_ts_us).abs() < 60_000_000,
        "commit ts {}",
        t.commit_ts_us
    );
    let [Change::Relation(rel), Change::Insert { rel: rid, new }] = &t.changes[..] else {
        panic!("{:?}", t.changes);
    };
    assert_eq!(
        (rel.namespace.as_str(), rel.name.as_str()),
        ("public", "items")
    );
    assert_eq!(*rid, rel.id);
    let cols: Vec<_> = rel
        .columns
        .iter()
        .map(|c| (c.name.as_str(), c.is_key, c.type_oid))
        .collect();
    assert_eq!(
        cols,
        vec![
            ("a", true, 23),
            ("b", true, 25),
            ("c", false, 1700),
            ("d", false, 1184),
            ("e", false, 3802),
            ("f", false, 16),
            ("big", false, 25)
        ]
    );
    assert_eq!(new[0], text("1"));
    assert_eq!(new[1], text("x"));
    assert_eq!(new[2], text("1.5"));
    let TupleValue::Text(ts) = &new[3] else {
        panic!("{:?}", new[3])
    };
    assert!(ts.starts_with(b"2024-"), "{ts:?}");
    assert_eq!(new[4], text("{\"k\": 1}"));
    assert_eq!(new[5], text("t"));
    assert_eq!(new[6], TupleValue::Null);
    let items = rel.id;

    // Plain update: no old key.
    client
        .batch_execute("UPDATE items SET c = 2 WHERE a = 1")
        .await
        .expect("update");
    let t = h.next_txn().await;
    assert!(
        matches!(&t.changes[..], [Change::Update { rel, old_key: None, new }]
            if *rel == items && new[2] == text("2")),
        "{:?}",
        t.changes
    );

    // Key change: the old key is present, non-key columns null.
    client
        .batch_execute("UPDATE items SET b = 'y' WHERE a = 1")
        .await
        .expect("update key");
    let t = h.next_txn().await;
    let [Change::Update {
        old_key: Some(old),
        new,
        ..
    }] = &t.changes[..]
    else {
        panic!("{:?}", t.changes);
    };
    assert_eq!(&old[..2], &[text("1"), text("x")]);
    assert!(old[2..].iter().all(|v| *v == TupleValue::Null), "{old:?}");
    assert_eq!(new[1], text("y"));

    // Unchanged TOASTed column.
    client
        .batch_execute("INSERT INTO items VALUES (2, 'z', 0, NULL, NULL, NULL, repeat('q', 20000))")
        .await
        .expect("insert toast");
    let t = h.next_txn().await;
    assert!(matches!(&t.changes[..], [Change::Insert { new, .. }]
        if matches!(&new[6], TupleValue::Text(b) if b.len() == 20000)));
    client
        .batch_execute("UPDATE items SET c = 3 WHERE a = 2")
        .await
        .expect("update toast row");
    let t = h.next_txn().await;
    let [Change::Update { new, .. }] = &t.changes[..] else {
        panic!("{:?}", t.changes);
    };
    assert_eq!(new[6], TupleValue::UnchangedToast);
    assert_eq!(new[2], text("3"));

    // Delete: key only; truncate.
    client
        .batch_execute("DELETE FROM items WHERE a = 1")
        .await
        .expect("delete");
    let t = h.next_txn().await;
    let [Change::Delete { rel, old_key }] = &t.changes[..] else {
        panic!("{:?}", t.changes);
    };
    assert_eq!(*rel, items);
    assert_eq!(&old_key[..2], &[text("1"), text("y")]);
    client
        .batch_execute("TRUNCATE items")
        .await
        .expect("truncate");
    let t = h.next_txn().await;
    let changes: Vec<_> = t
        .changes
        .into_iter()
        .filter(|c| !matches!(c, Change::Relation(r) if r.id == items))
        .collect();
    assert_eq!(changes, vec![Change::Truncate { rels: vec![items] }]);

    // Several changes in one transaction arrive as one WalTxn, in order (TRUNCATE invalidated
    // pgoutput's schema cache, so the Relation comes again first).
    client
        .batch_execute(
            "BEGIN; INSERT INTO items (a, b) VALUES (10, 'a'); \
             INSERT INTO items (a, b) VALUES (11, 'b'); DELETE FROM items WHERE a = 10; COMMIT;",
        )
        .await
        .expect("multi");
    let t = h.next_txn().await;
    assert!(
        matches!(
            &t.changes[..],
            [
                Change::Relation(_),
                Change::Insert { .. },
                Change::Insert { .. },
                Change::Delete { .. }
            ]
        ),
        "{:?}",
        t.changes
    );
    assert!(h.state.txns.load(Ordering::Relaxed) >= 8);
    h.stop().await;
}

#[tokio::test]
async fn progress_passes_unrelated_wal() {
    let db = TestDb::create("walc_progress").await;
    let client = db.client().await;
    client
        .batch_execute("CREATE TABLE pub_t (id int primary key); CREATE TABLE unpub (id int);")
        .await
        .expect("tables");
    let mut h = Harness::start(&db, &["pub_t"], Duration::from_millis(200)).await;
    client
        .batch_execute("INSERT INTO unpub SELECT generate_series(1, 1000)")
        .await
        .expect("unrelated write");
    let target = current_lsn(&client).await;
    let deadline = Instant::now() + WAIT;
    while h.state.applied_lsn.load(Ordering::Acquire) < target {
        assert!(
            Instant::now() < deadline,
            "applied never reached {target:X}"
        );
        match tokio::time::timeout(Duration::from_millis(500), h.rx.recv()).await {
            Ok(Some(WalEvent::Progress { lsn })) => h.apply(lsn),
            Ok(Some(other)) => panic!("only Progress expected, got {other:?}"),
            Ok(None) => panic!("consumer gone"),
            Err(_) => {}
        }
    }
    assert_eq!(h.state.txns.load(Ordering::Relaxed), 0);
    // Once caught up, the lag is reported as zero (while applying what keeps arriving: other
    // tests' WAL moves the server's end on).
    let deadline = Instant::now() + WAIT;
    loop {
        h.apply_arrived();
        let s = &h.state;
        if s.lag_bytes() == 0 && s.lag_ms(pgline_controlplane::clock::unix_now_us()) == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "timed out waiting for zero lag");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    h.stop().await;
}

/// The slot's confirmed position must never pass what the applier applied, even while the
/// consumer keeps receiving.
#[tokio::test]
async fn feedback_never_passes_applied() {
    let db = TestDb::create("walc_feedback").await;
    let client = db.client().await;
    client
        .batch_execute("CREATE TABLE t (id int primary key)")
        .await
        .expect("table");
    let mut h = Harness::start(&db, &["t"], Duration::from_millis(200)).await;
    for i in 0..5 {
        client
            .execute("INSERT INTO t VALUES ($1)", &[&i])
            .await
            .expect("insert");
        h.next_txn().await;
    }
    let applied = h.state.applied_lsn.load(Ordering::Acquire);
    // Stop applying: more transactions arrive and are taken off the channel, but not applied.
    // (Taken off, so that the channel, 16 events, cannot fill: the Progress events other
    // tests' WAL makes beside these ten transactions filled it once, and the consumer then
    // waited for room and received nothing more.)
    let mut held = Vec::new();
    for i in 5..15 {
        client
            .execute("INSERT INTO t VALUES ($1)", &[&i])
            .await
            .expect("insert");
        h.hold_arrived(&mut held);
    }
    let end = current_lsn(&client).await;
    let deadline = Instant::now() + WAIT;
    while h.state.received_lsn.load(Ordering::Acquire) < end - 200 {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for the new WAL"
        );
        h.hold_arrived(&mut held);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Several status intervals pass.
    for _ in 0..50 {
        h.hold_arrived(&mut held);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let confirmed = slot::confirmed_flush_lsn(&client, &h.slot)
        .await
        .expect("query slot")
        .expect("slot exists");
    assert!(
        confirmed <= applied,
        "confirmed {confirmed:X} > applied {applied:X}"
    );
    assert!(h.state.received_lsn.load(Ordering::Acquire) > applied);
    // After applying the rest, feedback catches up.
    let txns = held.into_iter().filter_map(|ev| h.apply_event(ev)).count();
    for _ in txns..10 {
        h.next_txn().await;
    }
    let applied = h.state.applied_lsn.load(Ordering::Acquire);
    let deadline = Instant::now() + WAIT;
    loop {
        h.apply_arrived();
        let c = slot::confirmed_flush_lsn(&client, &h.slot)
            .await
            .expect("query slot")
            .expect("slot exists");
        let now_applied = h.state.applied_lsn.load(Ordering::Acquire);
        assert!(
            c <= now_applied,
            "confirmed {c:X} > applied {now_applied:X}"
        );
        if c >= applied {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "feedback never reached {applied:X}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    h.stop().await;
}

async fn terminate_walsender(admin: &tokio_postgres::Client, slot: &str) -> bool {
    let rows = admin
        .query(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
             WHERE slot_name = $1 AND active_pid IS NOT NULL",
            &[&slot],
        )
        .await
        .expect("terminate");
    !rows.is_empty()
}

/// Kills the walsender a few times while a writer inserts ids in separate transactions: every
/// id must reach the applier exactly once.
#[tokio::test]
async fn reconnects_without_losing_txns() {
    let db = TestDb::create("walc_reconnect").await;
    let client = db.client().await;
    client
        .batch_execute("CREATE TABLE t (id int primary key)")
        .await
        .expect("table");
    let mut h = Harness::start(&db, &["t"], Duration::from_millis(100)).await;
    const N: i32 = 300;
    let writer_client = db.client().await;
    let writer = tokio::spawn(async move {
        for i in 0..N {
            writer_client
                .execute("INSERT INTO t VALUES ($1)", &[&i])
                .await
                .expect("insert");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    let admin = origin::admin_client().await;
    let mut seen = vec![0u32; N as usize];
    let mut kills = 0;
    let mut redelivered = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen.contains(&0) {
        assert!(
            Instant::now() < deadline,
            "ids missing: {:?}",
            seen.iter()
                .enumerate()
                .filter(|(_, c)| **c == 0)
                .map(|(i, _)| i)
                .take(10)
                .collect::<Vec<_>>()
        );
        let seen_count = seen.iter().filter(|&&c| c > 0).count();
        if kills < 3
            && seen_count > (kills + 1) * N as usize / 4
            && terminate_walsender(&admin, &h.slot).await
        {
            kills += 1;
        }
        match h.next_event().await {
            WalEvent::Txn(t) => {
                // The applier's own re-delivery guard.
                if t.end_lsn <= h.state.applied_lsn.load(Ordering::Acquire) {
                    redelivered += 1;
                    continue;
                }
                for c in &t.changes {
                    if let Change::Insert { new, .. } = c {
                        let TupleValue::Text(b) = &new[0] else {
                            panic!("{new:?}")
                        };
                        let id: usize = std::str::from_utf8(b).expect("utf8").parse().expect("id");
                        seen[id] += 1;
                    }
                }
                h.apply(t.end_lsn);
            }
            WalEvent::Progress { lsn } => h.apply(lsn),
            WalEvent::Reset { reason, .. } => panic!("unexpected reset: {reason}"),
            WalEvent::Failover { fork } => panic!("unexpected failover (fork {fork})"),
        }
    }
    writer.await.expect("writer");
    assert!(
        seen.iter().all(|&c| c == 1),
        "duplicates: {:?}",
        seen.iter()
            .enumerate()
            .filter(|(_, c)| **c > 1)
            .collect::<Vec<_>>()
    );
    assert_eq!(kills, 3);
    h.wait_until("three reconnects", |s| {
        s.reconnects.load(Ordering::Relaxed) >= 3
    })
    .await;
    eprintln!("re-deliveries skipped by the applier: {redelivered}");
    h.wait_until("streaming again", |s| s.streaming.load(Ordering::Acquire))
        .await;
    h.stop().await;
}

/// A slot dropped while we are disconnected is re-created and announced with `Reset`.
#[tokio::test]
async fn dropped_slot_resets_and_resumes() {
    let db = TestDb::create("walc_reset").await;
    let client = db.client().await;
    client
        .batch_execute("CREATE TABLE t (id int primary key)")
        .await
        .expect("table");
    let mut h = Harness::start(&db, &["t"], Duration::from_millis(500)).await;
    client
        .batch_execute("INSERT INTO t VALUES (1)")
        .await
        .expect("insert");
    h.next_txn().await;

    let admin = origin::admin_client().await;
    let deadline = Instant::now() + WAIT;
    loop {
        terminate_walsender(&admin, &h.slot).await;
        if slot::drop_slot(&admin, &h.slot).await.is_ok() {
            break;
        }
        assert!(Instant::now() < deadline, "could not drop the slot");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Changes made while the slot is gone are lost; the consumer must say so.
    loop {
        match h.next_event().await {
            WalEvent::Reset { .. } => break,
            WalEvent::Progress { lsn } => h.apply(lsn),
            WalEvent::Txn(t) => panic!("txn before reset: {t:?}"),
            WalEvent::Failover { fork } => panic!("failover before reset (fork {fork})"),
        }
    }
    assert_eq!(h.state.resets.load(Ordering::Relaxed), 1);
    h.wait_until("streaming again", |s| s.streaming.load(Ordering::Acquire))
        .await;
    client
        .batch_execute("INSERT INTO t VALUES (2)")
        .await
        .expect("insert after reset");
    let t = h.next_txn().await;
    let inserted: Vec<_> = t
        .changes
        .iter()
        .filter_map(|c| match c {
            Change::Insert { new, .. } => Some(new[0].clone()),
            _ => None,
        })
        .collect();
    assert_eq!(inserted, vec![text("2")]);
    h.stop().await;
}
