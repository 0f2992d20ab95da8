//! [`Admin::advise`]: reads the origin's `pg_stat_statements` for the database pgline caches
//! and judges it with the cores' key space ([`crate::advise`]).
//!
//! Bounds: at most `limit` statements (the busiest by total execution time), texts over
//! [`MAX_TEXT_BYTES`] not sent in full, the whole read within [`ADVISE_TIMEOUT`].

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use tokio_postgres::error::SqlState;

use super::Admin;
use crate::admin::AdminError;
use crate::advise::{advise, Advice, Context, StatementRow, Totals, MAX_LIMIT, MAX_TEXT_BYTES};

/// Longest the origin may take to answer the advisor's reads.
pub const ADVISE_TIMEOUT: Duration = Duration::from_secs(10);

/// The top-level statements of the current database, busiest first: the `$1` read (last column
/// true), then up to [`TRANSACTION_CANDIDATES`] more whose text may be transaction control
/// (cheap, so rarely among the busiest, yet what tells that reads ran inside transaction blocks;
/// the cores' classifier decides). `$2` bounds the text sent.
const STATEMENTS_SQL: &str = "SELECT CASE WHEN octet_length(s.query) > $2 THEN left(s.query, 200) \
         ELSE s.query END, r.rolname::text, s.calls, s.total_exec_time, \
         octet_length(s.query) > $2, s.n <= $1 \
     FROM (SELECT *, row_number() OVER (ORDER BY total_exec_time DESC, calls DESC) AS n \
           FROM pg_stat_statements \
           WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) \
             AND toplevel) s \
     LEFT JOIN pg_roles r ON r.oid = s.userid \
     WHERE s.n <= $1 \
        OR s.query ~* '^\\s*(begin|start|commit|end|rollback|abort)' \
     ORDER BY s.n LIMIT $1 + $3";

/// Statements beyond the limit read as possible transaction control (see [`STATEMENTS_SQL`]).
const TRANSACTION_CANDIDATES: i64 = 1000;

/// The sums over every top-level statement of the current database.
const TOTALS_SQL: &str = "SELECT count(*), coalesce(sum(calls), 0)::int8, \
         coalesce(sum(total_exec_time), 0)::float8, current_database()::text \
     FROM pg_stat_statements \
     WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND toplevel";

/// `schema.table` of the tables among `$1` whose REPLICA IDENTITY is FULL.
const IDENTITY_FULL_SQL: &str = "SELECT n.nspname::text || '.' || c.relname::text \
     FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
     WHERE c.relreplident = 'f' AND (n.nspname::text || '.' || c.relname::text) = ANY($1)";

/// What to do when `pg_stat_statements` cannot be read.
const ENABLE_HINT: &str = "pgline advise reads the origin's pg_stat_statements: add \
     shared_preload_libraries = 'pg_stat_statements' to the origin's postgresql.conf, restart \
     it, and run CREATE EXTENSION pg_stat_statements in the database pgline caches";

impl Admin {
    /// The advice on the origin's workload at `hit_ratio`, from at most `limit` statements
    /// (clamped to 1..=[`MAX_LIMIT`]). `Conflict` when `pg_stat_statements` is not there.
    pub async fn advise(&self, hit_ratio: f64, limit: usize) -> Result<Advice, AdminError> {
        let limit = limit.clamp(1, MAX_LIMIT);
        let mut ctx = self.advise_context();
        let read = async {
            let client = self.origin_client().await?;
            let t = client
                .query_one(TOTALS_SQL, &[])
                .await
                .map_err(stat_error)?;
            ctx.all = Totals {
                statements: t.get::<_, i64>(0).max(0) as u64,
                calls: t.get::<_, i64>(1).max(0) as u64,
                exec_ms: t.get(2),
            };
            ctx.database = t.get(3);
            let rows = client
                .query(
                    STATEMENTS_SQL,
                    &[
                        &(limit as i64),
                        &(MAX_TEXT_BYTES as i32),
                        &TRANSACTION_CANDIDATES,
                    ],
                )
                .await
                .map_err(stat_error)?;
            let (top, beyond): (Vec<_>, Vec<_>) = rows.iter().partition(|r| r.get::<_, bool>(5));
            let row = |r: &tokio_postgres::Row| StatementRow {
                query: r.get::<_, Option<String>>(0).unwrap_or_default(),
                user: r.get(1),
                calls: r.get::<_, i64>(2).max(0) as u64,
                total_exec_ms: r.get(3),
                too_long: r.get(4),
            };
            let rows: Vec<StatementRow> = top.into_iter().map(row).collect();
            ctx.beyond = beyond.into_iter().map(row).collect();
            let cached: Vec<String> = self
                .catalog
                .snapshot()
                .tables
                .values()
                .map(|t| format!("{}.{}", t.schema, t.name))
                .collect();
            let full = client
                .query(IDENTITY_FULL_SQL, &[&cached])
                .await
                .map_err(|e| AdminError::Origin(e.to_string()))?;
            ctx.identity_full = full.iter().map(|r| r.get(0)).collect();
            Ok::<_, AdminError>(rows)
        };
        let rows = tokio::time::timeout(ADVISE_TIMEOUT, read)
            .await
            .map_err(|_| {
                AdminError::Origin(format!(
                    "pg_stat_statements: no answer within {} s",
                    ADVISE_TIMEOUT.as_secs()
                ))
            })??;
        let keyspace = self.shared.keyspace().snapshot();
        Ok(advise(&rows, &keyspace, &ctx, hit_ratio))
    }

    /// The runtime's conditions beside the statement texts: the users whose sessions read the
    /// cache (the cores' `pg_cache_users`), disabled and refused tables.
    fn advise_context(&self) -> Context {
        let engine = self.config_read().engine();
        let catalog = self.catalog.snapshot();
        let disabled: HashSet<String> = catalog
            .tables
            .values()
            .filter(|t| self.is_disabled(t))
            .map(|t| format!("{}.{}", t.schema, t.name))
            .collect();
        let mut refused = BTreeMap::new();
        for r in &catalog.refused {
            refused.insert(format!("{}.{}", r.schema, r.name), r.reason.clone());
            if r.schema == "public" {
                refused.insert(r.name.clone(), r.reason.clone());
            }
        }
        Context {
            database: engine.pg_cache_database.clone().unwrap_or_default(),
            cache_users: engine.pg_cache_users.clone(),
            disabled,
            refused,
            ..Context::default()
        }
    }
}

/// `pg_stat_statements` missing (no extension in this database, or not preloaded) is the
/// operator's to fix: `Conflict` with how. Anything else is the origin's failure.
fn stat_error(e: tokio_postgres::Error) -> AdminError {
    match e.code() {
        Some(c) if *c == SqlState::UNDEFINED_TABLE || *c == SqlState::UNDEFINED_COLUMN => {
            AdminError::Conflict(format!(
                "pg_stat_statements is not installed: {ENABLE_HINT}"
            ))
        }
        Some(c) if *c == SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE => {
            AdminError::Conflict(format!("pg_stat_statements is not loaded: {ENABLE_HINT}"))
        }
        _ => AdminError::Origin(crate::origin::describe_error(&e)),
    }
}
