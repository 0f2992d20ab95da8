//! The JSONL row: one object per run with every parameter, every result and the environment.
//!
//! Rows are appended and flushed (`fsync`ed) as each run finishes, so a crash later in a
//! scenario keeps the rows already written.

#![deny(unsafe_code)]

use crate::env::Env;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

/// One run.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Row {
    /// Scenario name (report group).
    pub scenario: String,
    /// Free-text label of the cell.
    #[serde(default)]
    pub label: String,
    /// `resp`, `cache-aside`, `pg-prepared`, `pg-simple`.
    pub target: String,
    /// `get`, `mget` (RESP), `select` or `dashboard` (pg targets).
    pub op: String,
    /// Keys per request.
    pub mget: usize,
    /// Connections.
    pub clients: usize,
    /// Requests in flight per connection.
    pub pipeline: usize,
    /// `closed` or `open`.
    pub mode: String,
    /// Open loop: offered requests/s (null in closed loop).
    pub rate: Option<f64>,
    /// `hot`, `uniform`, `zipf`.
    pub keys: String,
    /// Ids in the key space.
    pub keyspace: u64,
    /// Zipf exponent (meaningful for `zipf`).
    pub zipf_s: f64,
    /// Writer rate: a number, `"unlimited"` or 0.
    pub write_rate: serde_json::Value,
    /// Writer connections (0 without writers).
    pub writers: usize,
    /// `update` or `insert`.
    pub write_op: String,
    /// `synchronous_commit` set on writer sessions, if any.
    pub synchronous_commit: Option<String>,
    /// Measured seconds.
    pub duration_s: f64,
    /// Warm-up seconds (not measured).
    pub warmup_s: f64,
    /// Client runtime threads.
    pub threads: usize,
    /// Requests completed without error in the window (`rps = requests / duration_s`;
    /// failures are in `errors`). Latencies cover the
    /// requests that started (open loop: were due) in the window, completed or not.
    pub requests: u64,
    /// Failed requests.
    pub errors: u64,
    /// Keys found.
    pub hits: u64,
    /// Keys missing (resp: nil replies; cache-aside: fills; pg: ids without a row).
    pub misses: u64,
    /// Open loop: requests due in the window and never sent (their wait is in the latencies).
    pub unsent: u64,
    /// Requests/s.
    pub rps: f64,
    /// Latency percentiles in microseconds.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Largest latency.
    pub max_us: f64,
    /// Open loop: 99th percentile of how late batches left after their due time.
    pub send_lag_p99_us: Option<f64>,
    /// Writer transactions completed in the window.
    pub writes: u64,
    /// Failed writer transactions.
    pub write_errors: u64,
    /// Writer transactions/s.
    pub write_rps: f64,
    /// Writer latency median (µs, including the cache-aside DEL).
    pub write_p50_us: f64,
    /// Writer latency 99th percentile (µs).
    pub write_p99_us: f64,
    /// CPU seconds per server process in the window, by name (or pid).
    pub server_cpu_s: BTreeMap<String, f64>,
    /// Requests (or, with no readers, writes) per second per server CPU-second summed.
    pub rps_per_server_cpu: Option<f64>,
    /// CPU seconds of this load generator in the window (all its threads): near
    /// `threads * duration_s` means the client, not the server, bounded the run.
    pub client_cpu_s: Option<f64>,
    /// RESP targets: `keyspace_hits` the server's INFO counted in the window (pgline answers a
    /// miss by filling from the origin, so its hit ratio is here, not in `hits`/`misses`).
    pub server_keyspace_hits: Option<u64>,
    /// RESP targets: `keyspace_misses` from INFO in the window.
    pub server_keyspace_misses: Option<u64>,
    /// Resident set size of each `--server-pid` at the end of the window, KiB.
    #[serde(default)]
    pub server_rss_kib: BTreeMap<String, u64>,
    /// With `--rss-every`: samples taken during the window.
    #[serde(default)]
    pub rss_samples: Vec<RssSample>,
    /// Stale entries found by the end-of-run check (null if not checked).
    pub stale: Option<u64>,
    /// How long the server took, at the end-of-run check, to apply the origin's WAL up to the
    /// origin's position (null if not checked or the server reports no applied LSN).
    #[serde(default)]
    pub stale_catchup_ms: Option<u64>,
    /// pg targets: `host:port` the load connections talked to (`--pg`, else the origin):
    /// pgline's PostgreSQL front or the origin itself.
    #[serde(default)]
    pub pg: Option<String>,
    /// pg point lookups: `json`, `columns` or `star` (`--pg-query`).
    #[serde(default)]
    pub pg_query: Option<String>,
    /// Where and when it ran.
    pub env: Env,
}

/// One RSS sample of one server.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct RssSample {
    /// Seconds since the measured window started.
    pub t_s: f64,
    /// Server name (or pid).
    pub server: String,
    /// Resident set size, KiB.
    pub rss_kib: u64,
}

/// Appends `row` as one line to `path` and syncs it to disk.
pub fn append_row(path: &Path, row: &Row) -> std::io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let mut line = serde_json::to_string(row).map_err(std::io::Error::other)?;
    line.push('\n');
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    f.write_all(line.as_bytes())?;
    f.sync_data()
}

/// Reads every row of a JSONL file (blank lines skipped).
pub fn read_rows(path: &Path) -> Result<Vec<Row>, crate::error::BenchError> {
    let text = std::fs::read_to_string(path)?;
    let mut rows = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        rows.push(serde_json::from_str(line)?);
    }
    Ok(rows)
}

/// Every key a complete row carries (the brief's schema plus the extras above).
pub const REQUIRED_KEYS: &[&str] = &[
    "scenario",
    "target",
    "op",
    "mget",
    "clients",
    "pipeline",
    "mode",
    "rate",
    "keys",
    "keyspace",
    "zipf_s",
    "write_rate",
    "duration_s",
    "requests",
    "errors",
    "hits",
    "misses",
    "rps",
    "p50_us",
    "p99_us",
    "p999_us",
    "max_us",
    "server_cpu_s",
    "rps_per_server_cpu",
    "stale",
    "env",
];

/// Every key of `env`.
pub const REQUIRED_ENV_KEYS: &[&str] = &[
    "cpu_model",
    "cores",
    "kernel",
    "pgline_version",
    "valkey_version",
    "postgres_version",
    "git_rev",
    "started_at",
];

/// The keys a JSONL line lacks (empty when complete).
pub fn missing_keys(line: &str) -> Vec<String> {
    let Ok(serde_json::Value::Object(map)) = serde_json::from_str::<serde_json::Value>(line) else {
        return vec!["<not a JSON object>".into()];
    };
    let mut missing: Vec<String> = REQUIRED_KEYS
        .iter()
        .filter(|k| !map.contains_key(**k))
        .map(|k| k.to_string())
        .collect();
    match map.get("env") {
        Some(serde_json::Value::Object(env)) => missing.extend(
            REQUIRED_ENV_KEYS
                .iter()
                .filter(|k| !env.contains_key(**k))
                .map(|k| format!("env.{k}")),
        ),
        _ => missing.push("env.*".into()),
    }
    missing
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_serializes_every_required_key_and_round_trips() {
        let row = Row {
            scenario: "s".into(),
            write_rate: 0.into(),
            ..Row::default()
        };
        let line = serde_json::to_string(&row).unwrap();
        assert_eq!(missing_keys(&line), Vec::<String>::new());
        assert_eq!(serde_json::from_str::<Row>(&line).unwrap(), row);
        assert_eq!(
            missing_keys(r#"{"scenario":"x","env":{}}"#).len(),
            REQUIRED_KEYS.len() - 2 + 8
        );
    }

    #[test]
    fn append_keeps_earlier_rows() {
        let dir = std::env::temp_dir().join(format!("pgline-bench-rec-{}", std::process::id()));
        let path = dir.join("r.jsonl");
        let _ = std::fs::remove_file(&path);
        for i in 0..3 {
            let row = Row {
                requests: i,
                write_rate: "unlimited".into(),
                ..Row::default()
            };
            append_row(&path, &row).unwrap();
        }
        let rows = read_rows(&path).unwrap();
        assert_eq!(
            rows.iter().map(|r| r.requests).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
        std::fs::remove_dir_all(dir).unwrap();
    }
}
