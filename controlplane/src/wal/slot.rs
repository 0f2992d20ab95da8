//! Publication and replication-slot management over a regular `tokio_postgres::Client`.
//!
//! Purpose: make sure the origin has what the WAL consumer streams from: `wal_level=logical`,
//! a publication covering the cached tables, and a permanent `pgoutput` logical slot.
//!
//! Invariants: every statement passes names as bind parameters or through
//! [`quote_ident`](super::conn::quote_ident); table names are resolved by the server
//! (`to_regclass`), so `users`, `public.users` and `"Mixed Case"` all work. Creation is
//! idempotent and tolerates a concurrent creator (`duplicate_object`).
//!
//! Thread model: async functions over a shared client; no state of their own.
//!
//! Limitations: a publication that already exists `FOR ALL TABLES` is left as it is; tables are
//! only ever added, never removed, from a table-list publication.

use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

use super::conn::{parse_lsn, quote_ident};
use super::WalError;

/// Which tables a publication covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublicationScope {
    /// `FOR ALL TABLES` (needs superuser).
    AllTables,
    /// These tables, each `table` or `schema.table` (as `to_regclass` understands it).
    Tables(Vec<String>),
}

/// Fails with [`WalError::WalLevel`] unless the origin runs with `wal_level=logical`.
pub async fn check_wal_level(client: &Client) -> Result<(), WalError> {
    let row = client.query_one("SHOW wal_level", &[]).await?;
    let level: String = row.try_get(0)?;
    if level == "logical" {
        Ok(())
    } else {
        Err(WalError::WalLevel(level))
    }
}

/// Creates publication `name` if missing; for [`PublicationScope::Tables`], adds the tables it
/// does not cover yet.
pub async fn ensure_publication(
    client: &Client,
    name: &str,
    scope: &PublicationScope,
) -> Result<(), WalError> {
    let existing = client
        .query_opt(
            "SELECT puballtables FROM pg_publication WHERE pubname = $1",
            &[&name],
        )
        .await?;
    let all_tables = match existing {
        Some(row) => row.try_get::<_, bool>(0)?,
        None => {
            let sql = match scope {
                PublicationScope::AllTables => {
                    format!("CREATE PUBLICATION {} FOR ALL TABLES", quote_ident(name))
                }
                PublicationScope::Tables(_) => format!("CREATE PUBLICATION {}", quote_ident(name)),
            };
            ignore_duplicate(client.batch_execute(&sql).await)?;
            matches!(scope, PublicationScope::AllTables)
        }
    };
    let PublicationScope::Tables(tables) = scope else {
        return Ok(());
    };
    if all_tables {
        return Ok(());
    }
    for table in tables {
        let row = client
            .query_one(
                "SELECT n.nspname::text, c.relname::text, EXISTS ( \
                   SELECT 1 FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid \
                   WHERE p.pubname = $2 AND pr.prrelid = c.oid) \
                 FROM (SELECT to_regclass($1) AS oid) r \
                 LEFT JOIN pg_class c ON c.oid = r.oid \
                 LEFT JOIN pg_namespace n ON n.oid = c.relnamespace",
                &[table, &name],
            )
            .await?;
        let (Some(schema), Some(rel)) = (
            row.try_get::<_, Option<String>>(0)?,
            row.try_get::<_, Option<String>>(1)?,
        ) else {
            return Err(WalError::Config(format!(
                "publication {name}: table {table} does not exist"
            )));
        };
        if !row.try_get::<_, bool>(2)? {
            let sql = format!(
                "ALTER PUBLICATION {} ADD TABLE {}.{}",
                quote_ident(name),
                quote_ident(&schema),
                quote_ident(&rel)
            );
            ignore_duplicate(client.batch_execute(&sql).await)?;
        }
    }
    Ok(())
}

/// Whether a replication slot called `slot` exists.
pub async fn slot_exists(client: &Client, slot: &str) -> Result<bool, WalError> {
    let row = client
        .query_opt(
            "SELECT 1 FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await?;
    Ok(row.is_some())
}

/// Creates a permanent logical slot using `pgoutput`; returns its consistent point.
pub async fn create_slot(client: &Client, slot: &str) -> Result<u64, WalError> {
    let row = client
        .query_one(
            "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')",
            &[&slot],
        )
        .await?;
    let lsn: String = row.try_get(0)?;
    parse_lsn(&lsn).ok_or_else(|| WalError::Protocol(format!("bad slot LSN {lsn}")))
}

/// Drops the slot (fails with SQLSTATE 55006 while a walsender is using it).
pub async fn drop_slot(client: &Client, slot: &str) -> Result<(), WalError> {
    client
        .execute("SELECT pg_drop_replication_slot($1)", &[&slot])
        .await?;
    Ok(())
}

/// The slot's `confirmed_flush_lsn`, or `None` if the slot does not exist.
pub async fn confirmed_flush_lsn(client: &Client, slot: &str) -> Result<Option<u64>, WalError> {
    let row = client
        .query_opt(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await?;
    let Some(row) = row else { return Ok(None) };
    let lsn: Option<String> = row.try_get(0)?;
    Ok(lsn.as_deref().and_then(parse_lsn))
}

fn ignore_duplicate(r: Result<(), tokio_postgres::Error>) -> Result<(), WalError> {
    match r {
        Err(e) if e.code() == Some(&SqlState::DUPLICATE_OBJECT) => Ok(()),
        other => Ok(other?),
    }
}
