//! PostgreSQL's own `pgbench` (Debian's `postgresql-client`), run against the lab origin or a
//! pgline's PostgreSQL port: a real client's workload, with the connection given to pgbench
//! through the `PG*` environment variables.
//!
//! The calls block until pgbench exits: from an async test, run them in
//! `tokio::task::spawn_blocking` so that the runtime's workers keep serving pgline's tasks.

use std::net::SocketAddr;
use std::process::Command;

use crate::origin::origin_base;

/// The `PG*` variables that point pgbench at database `db` on `addr` (the lab origin's
/// [`crate::origin::origin_addr`] or a pgline's PostgreSQL port), as the lab origin's user.
pub fn env(addr: SocketAddr, db: &str) -> Vec<(&'static str, String)> {
    let (_, _, user, password) = origin_base();
    vec![
        ("PGHOST", addr.ip().to_string()),
        ("PGPORT", addr.port().to_string()),
        ("PGUSER", user),
        ("PGPASSWORD", password),
        ("PGDATABASE", db.to_string()),
    ]
}

/// Runs `pgbench args` with `env`; its stdout and stderr together. Panics if pgbench is missing
/// or fails.
pub fn run(args: &[&str], env: &[(&'static str, String)]) -> String {
    let out = Command::new("pgbench")
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .expect("pgbench is installed (postgresql-client; deploy/lab/setup.sh)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "pgbench {args:?} failed:\n{text}");
    text
}

/// pgbench's `number of transactions actually processed: N[/M]`, 0 when absent.
pub fn processed(text: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix("number of transactions actually processed: "))
        .and_then(|v| v.split(['/', ' ']).next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// pgbench's `number of failed transactions: N (...)`, 0 when absent (pgbench before 15).
pub fn failed(text: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix("number of failed transactions: "))
        .and_then(|v| v.split(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}
