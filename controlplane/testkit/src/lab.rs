//! A real pgline booted in-process against a test database, and what tests ask it.

use std::time::Duration;

use pgline_controlplane::config::Config;
use pgline_controlplane::server::Pgline;

use crate::origin::{origin_lsn, TestDb};

/// A config for `db` with a unique slot (named after the database: slot names are cluster-wide,
/// so a shared name would make parallel tests, or other users of the lab cluster, collide), an
/// ephemeral port and a small store. The publication lives in the test's database.
pub fn config(db: &TestDb, cores: usize) -> Config {
    config_with(&db.conn_string(), &slot_name(db), cores, &[])
}

/// [`config`] for origin `url` (e.g. a [`crate::pair::Pair`]'s multi-host URL) with slot
/// `slot`, and `extra` `key=value` settings applied last.
pub fn config_with(url: &str, slot: &str, cores: usize, extra: &[String]) -> Config {
    let mut sets = vec![
        format!("origin.url={}", toml_str(url)),
        format!("replication.slot={}", toml_str(slot)),
        "resp.listen=\"127.0.0.1:0\"".to_string(),
        "api.listen=\"127.0.0.1:0\"".to_string(),
        "pgwire.listen=\"127.0.0.1:0\"".to_string(),
        format!("resp.cores={cores}"),
        "resp.spin_polls=50".to_string(),
        "store.memory=\"64MiB\"".to_string(),
        "store.max_page=\"4KiB\"".to_string(),
        "replication.status_interval_ms=100".to_string(),
        "replication.reconnect_backoff_ms=100".to_string(),
        "origin.pool_size=4".to_string(),
    ];
    sets.extend_from_slice(extra);
    Config::load(None, Vec::<(String, String)>::new(), &sets).expect("test config")
}

/// The replication slot [`config`] gives the test database `db`.
pub fn slot_name(db: &TestDb) -> String {
    db.name.clone()
}

/// The lab venv's python (psycopg and redis-py; `deploy/lab/pgwire_venv.sh` makes it once), or
/// `None` when it cannot be made (no network to PyPI).
pub fn python_venv() -> Option<String> {
    std::process::Command::new("bash")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../deploy/lab/pgwire_venv.sh"
        ))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
}

/// `s` as a TOML string.
pub fn toml_str(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// Starts pgline and waits until it serves hits (replication streaming).
pub async fn start(cfg: Config) -> std::sync::Arc<Pgline> {
    let p = Pgline::start(cfg).await.expect("pgline starts");
    assert!(
        p.wait_serving(Duration::from_secs(20)).await,
        "pgline never started serving hits"
    );
    p
}

/// A tokio-postgres client of `db` through pgline's PostgreSQL front, as the lab origin's user.
/// Returns once pgline has applied the WAL up to the session's login fence, so the session
/// may be answered from cache from its first statement (the lab origin's WAL moves with every
/// other test's writes).
pub async fn pg_client(p: &Pgline, db: &TestDb) -> tokio_postgres::Client {
    let addr = p.pg_addr().expect("the pgwire front is on");
    let (_, _, user, password) = crate::origin::origin_base();
    let c = crate::origin::connect(&format!(
        "host={} port={} user={user} password={password} dbname={}",
        addr.ip(),
        addr.port(),
        db.name
    ))
    .await;
    sync(p, &db.client().await).await;
    c
}

/// Waits until pgline has applied everything the origin has written so far.
pub async fn sync(p: &Pgline, client: &tokio_postgres::Client) {
    let lsn = origin_lsn(client).await;
    let r = &p.repl;
    assert!(
        p.wait_applied(lsn, Duration::from_secs(30)).await,
        "applied LSN {} never reached origin LSN {lsn} (received {}, server end {}, streaming {}, txns {}, reconnects {})",
        p.applied_lsn(),
        r.received_lsn.load(std::sync::atomic::Ordering::Relaxed),
        r.server_wal_end.load(std::sync::atomic::Ordering::Relaxed),
        r.streaming.load(std::sync::atomic::Ordering::Relaxed),
        r.txns.load(std::sync::atomic::Ordering::Relaxed),
        r.reconnects.load(std::sync::atomic::Ordering::Relaxed),
    );
}

/// Waits (up to 10 s) until the store holds at least `n` entries. A core offers the reads it
/// made to the writer in bursts (`corefill::INSTALL_HOLD`), so a key read on a core is cached
/// shortly after its miss was answered, not at once.
pub async fn wait_cached(p: &Pgline, n: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let held = p.dump().await.len();
        if held >= n {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the store holds {held} entries, never {n}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

pub async fn redis(p: &Pgline) -> redis::aio::MultiplexedConnection {
    let addr = p.local_addr();
    let client = redis::Client::open(format!("redis://{}:{}/", addr.ip(), addr.port())).unwrap();
    client
        .get_multiplexed_async_connection()
        .await
        .expect("redis connect")
}

/// Compares every cached entry with the origin's `row_to_json`; returns the stale ones.
pub async fn stale_entries(p: &Pgline, client: &tokio_postgres::Client) -> Vec<String> {
    let mut stale = Vec::new();
    for pgline_controlplane::writer::DumpedEntry { table, pk, json } in p.dump().await {
        let t = p
            .catalog
            .get(table)
            .expect("dumped table is in the catalog")
            .clone();
        let key_col = &t.columns[t.key_columns[0]];
        let sql = format!(
            "SELECT row_to_json(t)::text FROM {} t WHERE {}::text = $1",
            t.qualified(),
            pgline_controlplane::catalog::quote_ident(&key_col.name)
        );
        let pk_text = String::from_utf8(pk.clone()).unwrap();
        let row = client
            .query_opt(&sql, &[&pk_text])
            .await
            .expect("probe query");
        let origin: Option<String> = row.map(|r| r.get(0));
        let cached = json.map(|j| String::from_utf8(j).unwrap());
        if origin != cached {
            stale.push(format!(
                "{}:{pk_text}: cached {cached:?}, origin {origin:?}",
                t.name
            ));
        }
    }
    stale
}

/// A numeric field of `INFO`.
pub async fn info_field(r: &mut redis::aio::MultiplexedConnection, field: &str) -> u64 {
    let info: String = redis::cmd("INFO").query_async(r).await.unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("INFO has no {field}: {info}"))
}

/// The sum of metric `name`'s samples (every core's, for the per-core counters) in the
/// `/metrics` of the API at `api` (`http://host:port`).
pub async fn metric(api: &str, name: &str) -> f64 {
    let text = reqwest::get(format!("{api}/metrics"))
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("the exposition");
    let values: Vec<f64> = text
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let value = match rest.strip_prefix('{') {
                Some(labelled) => labelled.split_once("} ")?.1,
                None => rest.strip_prefix(' ')?,
            };
            value.parse().ok()
        })
        .collect();
    assert!(!values.is_empty(), "no sample {name} in /metrics");
    values.iter().sum()
}

/// Drops replication slot `slot` under a running pgline: its walsender is terminated, and the
/// drop retried (for up to 5 s) until the slot is no longer active.
pub async fn drop_slot(client: &tokio_postgres::Client, slot: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        client
            .execute(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
                 WHERE slot_name = $1 AND active_pid IS NOT NULL",
                &[&slot],
            )
            .await
            .unwrap();
        match client
            .execute("SELECT pg_drop_replication_slot($1)", &[&slot])
            .await
        {
            Ok(_) => return,
            Err(e) => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "slot {slot} never dropped: {e}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}
