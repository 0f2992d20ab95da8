//! The lab origin: connection settings, a database of its own per test, direct queries.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};

/// Connection settings of the lab origin, overridable with `PGLINE_TEST_PG_*`:
/// (host, port, user, password).
pub fn origin_base() -> (String, u16, String, String) {
    let host = std::env::var("PGLINE_TEST_PG_HOST").unwrap_or_else(|_| "127.0.0.1".into());
    let port = std::env::var("PGLINE_TEST_PG_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(54329);
    let user = std::env::var("PGLINE_TEST_PG_USER").unwrap_or_else(|_| "postgres".into());
    let password = std::env::var("PGLINE_TEST_PG_PASSWORD").unwrap_or_else(|_| "pgline".into());
    (host, port, user, password)
}

/// The lab origin's socket address (its host must be an IP address).
pub fn origin_addr() -> SocketAddr {
    let (host, port, _, _) = origin_base();
    format!("{host}:{port}")
        .parse()
        .unwrap_or_else(|e| panic!("PGLINE_TEST_PG_HOST {host:?} is not an IP address: {e}"))
}

/// A `key=value` connection string for database `db` on the lab origin.
pub fn conn_string(db: &str) -> String {
    let (host, port, user, password) = origin_base();
    format!("host={host} port={port} user={user} password={password} dbname={db}")
}

/// A database created for one test; dropped, together with its slots, on drop.
pub struct TestDb {
    pub name: String,
}

static SEQ: AtomicU32 = AtomicU32::new(0);

impl TestDb {
    /// Creates a fresh database named after `tag`, the process id and a counter.
    pub async fn create(tag: &str) -> TestDb {
        let name = format!(
            "t_{tag}_{}_{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        TestDb::named(name).await
    }

    /// A fresh database named `name` (dropped first if it exists): for a test that needs the
    /// same name on this origin as on another cluster. Dropped with its slots like any other.
    pub async fn named(name: String) -> TestDb {
        let admin = admin_client().await;
        // Two statements: DROP/CREATE DATABASE cannot share one implicit transaction.
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .await
            .expect("drop stale test database");
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .expect("create test database");
        TestDb { name }
    }

    pub fn conn_string(&self) -> String {
        conn_string(&self.name)
    }

    /// A plain client connected to this database.
    pub async fn client(&self) -> tokio_postgres::Client {
        connect(&self.conn_string()).await
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let name = self.name.clone();
        run_cleanup(async move {
            let admin = admin_client().await;
            // A terminated walsender releases its slot a moment later (and a pgline still
            // shutting down may reconnect once): retry until the database has no slot left, or
            // the slot and the database would outlive the test and retain WAL.
            for _ in 0..20 {
                let _ = admin
                    .batch_execute(&format!(
                        "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
                             WHERE database = '{name}' AND active_pid IS NOT NULL;"
                    ))
                    .await;
                let _ = admin
                    .batch_execute(&format!(
                        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
                             WHERE database = '{name}' AND NOT active;"
                    ))
                    .await;
                let left = admin
                    .query_one(
                        "SELECT count(*) FROM pg_replication_slots WHERE database = $1",
                        &[&name],
                    )
                    .await
                    .map(|r| r.get::<_, i64>(0))
                    .unwrap_or(0);
                if left == 0 {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            let _ = admin
                .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                .await;
        });
    }
}

/// Runs async clean-up from a `Drop`: on a thread with a small runtime of its own, since a
/// drop may run inside or outside any runtime. Waits for it to finish.
pub fn run_cleanup(work: impl std::future::Future<Output = ()> + Send + 'static) {
    let _ = std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime for test cleanup")
            .block_on(work);
    })
    .join();
}

/// A client of the lab origin's `postgres` database, as its superuser.
pub async fn admin_client() -> tokio_postgres::Client {
    connect(&conn_string("postgres")).await
}

/// A client for connection string `conn`; its connection task runs on the current runtime.
pub async fn connect(conn: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(conn, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| {
            panic!("connect to the test origin ({conn}): {e}; is deploy/lab/pg.sh running?")
        });
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// The origin's `row_to_json` of row `id` of `table` (a table with an integer column `id`),
/// or `None` if there is no such row: what pgline must answer for `table:id`.
pub async fn origin_json(
    client: &tokio_postgres::Client,
    table: &str,
    id: impl Into<i64>,
) -> Option<String> {
    client
        .query_opt(
            &format!("SELECT row_to_json(x)::text FROM {table} x WHERE id = $1::int8"),
            &[&id.into()],
        )
        .await
        .unwrap_or_else(|e| panic!("row_to_json of {table}: {e}"))
        .map(|r| r.get(0))
}

/// The origin's current WAL insert position.
pub async fn origin_lsn(client: &tokio_postgres::Client) -> u64 {
    let row = client
        .query_one("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::int8", &[])
        .await
        .expect("pg_current_wal_lsn");
    row.get::<_, i64>(0) as u64
}
