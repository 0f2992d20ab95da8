//! PostgreSQL helpers: connect, the bench table's SQL, the origin pool for cache-aside fills.
//!
//! # Thread model
//! Each [`tokio_postgres::Client`] has its connection driven by a spawned task; a client can be
//! shared (`&Client` queries pipeline on one connection).

#![deny(unsafe_code)]

use crate::cli::PgQuery;
use crate::error::BenchError;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio_postgres::{Client, NoTls, Statement};

/// Connects and spawns the connection task.
pub async fn connect(conn_str: &str) -> Result<Client, BenchError> {
    let (client, conn) = tokio_postgres::connect(conn_str, NoTls).await?;
    tokio::spawn(async move {
        // The error (if any) also surfaces on the next query through the client.
        let _ = conn.await;
    });
    Ok(client)
}

/// Checks that `table` is a plain lower-case identifier (it is used in keys and SQL as is).
pub fn check_table(table: &str) -> Result<(), BenchError> {
    let ok = !table.is_empty()
        && table.len() <= 63
        && table
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b == b'_')
        && table
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(BenchError::Config(format!(
            "table {table:?} must match [a-z_][a-z0-9_]*"
        )))
    }
}

/// `SELECT ... FROM (SELECT <g>::int8 AS g) s`: the row for id `g` (~166 bytes of JSON for
/// 5-digit ids), shared by `load` (over generate_series) and the INSERT writers.
pub fn row_select(g_source: &str) -> String {
    format!(
        "SELECT g, 'Bench user number ' || g, 'user' || g || '@example.com', \
         (ARRAY['free','pro','team'])[1 + g % 3], ((g % 100000) / 100.0)::numeric(10,2), \
         g % 2 = 0, '2025-01-01 00:00:00+00'::timestamptz + g * interval '1 second', 0 \
         FROM {g_source}"
    )
}

/// The point lookup every target compares against.
pub fn lookup_sql(table: &str) -> String {
    format!("SELECT row_to_json(t)::text FROM {table} t WHERE id = $1")
}

/// The single-id lookup of the pg targets, in the `--pg-query` form (`$1` the id).
pub fn point_sql(table: &str, q: PgQuery) -> String {
    match q {
        PgQuery::Json => lookup_sql(table),
        PgQuery::Volatile => {
            format!("SELECT row_to_json(t)::text, random() FROM {table} t WHERE id = $1")
        }
        PgQuery::Columns => {
            format!("SELECT id, name, email, plan, active, rev FROM {table} WHERE id = $1")
        }
        PgQuery::Star => format!("SELECT * FROM {table} WHERE id = $1"),
    }
}

/// The multi-id lookup (pg targets with `--mget` > 1, stale re-checks).
pub fn lookup_any_sql(table: &str) -> String {
    format!("SELECT id, row_to_json(t)::text FROM {table} t WHERE id = ANY($1)")
}

/// Shared origin connections with a prepared lookup, used round-robin by cache-aside fills.
pub struct OriginPool {
    conns: Vec<(Client, Statement)>,
    next: AtomicUsize,
}

impl OriginPool {
    /// Opens `n` connections and prepares the lookup on each.
    pub async fn open(conn_str: &str, table: &str, n: usize) -> Result<Self, BenchError> {
        let mut conns = Vec::with_capacity(n.max(1));
        for _ in 0..n.max(1) {
            let c = connect(conn_str).await?;
            let s = c.prepare(&lookup_sql(table)).await?;
            conns.push((c, s));
        }
        Ok(OriginPool {
            conns,
            next: AtomicUsize::new(0),
        })
    }

    /// The row's JSON text, or None if there is no such row.
    pub async fn fetch(&self, id: u64) -> Result<Option<String>, tokio_postgres::Error> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.conns.len();
        let (c, s) = &self.conns[i];
        let row = c.query_opt(s, &[&(id as i64)]).await?;
        Ok(row.map(|r| r.get(0)))
    }
}
