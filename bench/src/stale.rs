//! `stale-check`: compare every key of the table held by a RESP server with the origin.
//!
//! Pass 1 reads `<table>:<id>` for every id in `0..keyspace` with MGET batches and, for the
//! same id range, `row_to_json` from the origin; a cached value that differs from the origin's
//! (or a cached row the origin no longer has) is a candidate. Candidates are re-read after
//! `--settle`; those still different are stale.
//!
//! Replication lag is not staleness: pgline may serve a row up to `replication.max_lag_ms`
//! behind the origin by design. So before pass 1 the check reads the origin's WAL position
//! (`pg_current_wal_lsn()`) and waits until the server reports (`INFO replication`,
//! `applied_lsn_int`) that it applied the WAL up to there, at most `--catchup-timeout`; the time
//! this took is reported as `catchup_ms`, apart from the stale count. Every write made before
//! the check started is then applied, so a difference left after that is staleness, not lag.
//!
//! # Limitations
//! On pgline a GET of an uncached key is a read-through fill, so pass 1 also fills every key it
//! did not hold (those are fresh by construction and counted in `cached`). Run it after the
//! writers stopped; a concurrent writer makes candidates that settle away.

#![deny(unsafe_code)]

use crate::cli::StaleArgs;
use crate::error::BenchError;
use crate::pg;
use crate::resp::{compose_get, RespConn, Value};
use serde::Serialize;
use std::collections::HashMap;

/// The check's result.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct StaleReport {
    /// Keys read.
    pub checked: u64,
    /// Keys the server returned a value for.
    pub cached: u64,
    /// Candidates after pass 1.
    pub candidates: u64,
    /// Still different after settling.
    pub stale: u64,
    /// Up to 10 stale keys, for the operator.
    pub sample: Vec<String>,
    /// How long the server took to apply the origin's WAL up to its position at the start
    /// (`None`: the server reports no applied LSN, e.g. Valkey).
    pub catchup_ms: Option<u64>,
}

/// Runs the check.
pub async fn check(args: &StaleArgs) -> Result<StaleReport, BenchError> {
    pg::check_table(&args.data.table)?;
    let table = &args.data.table;
    let origin = pg::connect(&args.data.origin).await?;
    let range = origin
        .prepare(&format!(
            "SELECT id, row_to_json(t)::text FROM {table} t WHERE id >= $1 AND id < $2"
        ))
        .await?;
    let any = origin.prepare(&pg::lookup_any_sql(table)).await?;
    let mut conn = RespConn::connect(&args.resp).await?;
    let mut rep = StaleReport {
        catchup_ms: catch_up(&origin, &mut conn, args.catchup_timeout).await?,
        ..StaleReport::default()
    };
    let prefix = format!("{table}:").into_bytes();
    let mut candidates = Vec::new();
    let batch = args.batch.max(1) as u64;
    let mut lo = 0u64;
    while lo < args.data.keyspace {
        let hi = (lo + batch).min(args.data.keyspace);
        let ids: Vec<u64> = (lo..hi).collect();
        let cached = mget(&mut conn, &prefix, &ids).await?;
        let rows = origin.query(&range, &[&(lo as i64), &(hi as i64)]).await?;
        let truth: HashMap<i64, String> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        for (&id, v) in ids.iter().zip(&cached) {
            rep.checked += 1;
            if let Some(v) = v {
                rep.cached += 1;
                if truth.get(&(id as i64)).map(String::as_bytes) != Some(v.as_slice()) {
                    candidates.push(id);
                }
            }
        }
        lo = hi;
    }
    rep.candidates = candidates.len() as u64;
    if !candidates.is_empty() {
        tokio::time::sleep(args.settle).await;
        for chunk in candidates.chunks(batch as usize) {
            let cached = mget(&mut conn, &prefix, chunk).await?;
            let v: Vec<i64> = chunk.iter().map(|&i| i as i64).collect();
            let rows = origin.query(&any, &[&v]).await?;
            let truth: HashMap<i64, String> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
            for (&id, c) in chunk.iter().zip(&cached) {
                let Some(c) = c else { continue };
                if truth.get(&(id as i64)).map(String::as_bytes) != Some(c.as_slice()) {
                    rep.stale += 1;
                    if rep.sample.len() < 10 {
                        rep.sample.push(format!("{table}:{id}"));
                    }
                }
            }
        }
    }
    Ok(rep)
}

/// Waits until the server has applied the origin's WAL up to the origin's current position;
/// returns how long that took, or `None` if the server does not report an applied LSN.
async fn catch_up(
    origin: &tokio_postgres::Client,
    conn: &mut RespConn,
    timeout: std::time::Duration,
) -> Result<Option<u64>, BenchError> {
    let row = origin
        .query_one("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::text", &[])
        .await?;
    let target: u64 = row
        .get::<_, String>(0)
        .parse()
        .map_err(|_| BenchError::Config("pg_current_wal_lsn() is not a number".into()))?;
    let start = std::time::Instant::now();
    loop {
        let Some(applied) = applied_lsn(conn).await? else {
            return Ok(None);
        };
        if applied >= target {
            return Ok(Some(start.elapsed().as_millis() as u64));
        }
        if start.elapsed() >= timeout {
            return Err(BenchError::Config(format!(
                "the server applied WAL to {applied} but the origin was at {target} when the \
                 check started, still behind after {timeout:?}"
            )));
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// The server's `applied_lsn_int` from `INFO replication`, if it reports one.
async fn applied_lsn(conn: &mut RespConn) -> Result<Option<u64>, BenchError> {
    let info = match conn.command(&[b"INFO", b"replication"]).await? {
        Value::Bulk(b) => String::from_utf8_lossy(&b).into_owned(),
        Value::Error(e) => return Err(crate::resp::RespError::Server(e).into()),
        _ => return Ok(None),
    };
    Ok(crate::resp::info_field(&info, "applied_lsn_int").and_then(|v| v.parse().ok()))
}

async fn mget(
    conn: &mut RespConn,
    prefix: &[u8],
    ids: &[u64],
) -> Result<Vec<Option<Vec<u8>>>, BenchError> {
    compose_get(&mut conn.wbuf, prefix, ids, true);
    conn.flush().await?;
    match conn.read_value().await? {
        Value::Array(items) if items.len() == ids.len() => Ok(items
            .into_iter()
            .map(|v| match v {
                Value::Bulk(b) => Some(b),
                _ => None,
            })
            .collect()),
        Value::Error(e) => Err(crate::resp::RespError::Server(e).into()),
        _ => Err(BenchError::Config(
            "MGET reply is not an array of the keys' length".into(),
        )),
    }
}
