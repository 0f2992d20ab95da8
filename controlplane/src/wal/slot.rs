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
//! Scope (issue 11, O1): the publication lists exactly the tables pgline caches, never
//! `FOR ALL TABLES`: a published table without a primary key or replica identity refuses every
//! UPDATE and DELETE at the origin. It is created `WITH (publish_via_partition_root = true)`, so
//! a cached partitioned table's changes arrive under its own OID whichever partition they hit. A
//! `FOR ALL TABLES` publication left by an older pgline cannot be altered into a list: it is
//! dropped and created again in one transaction (so logical decoding never finds it missing).
//!
//! Failover (issue 14): on a PostgreSQL 17+ primary the slot is a failover slot
//! ([`create_logical_slot`], [`enable_failover`]), so a standby's slot-sync worker keeps a copy
//! that a promotion makes usable; [`slot_state`] tells whether a slot found after a reconnect
//! can be resumed (not temporary, not invalidated). With the stream on a standby
//! (`replication.url`) the slot is created there after [`log_standby_snapshot`] on the primary.
//!
//! Limitations: [`ensure_publication`] (every reconnect) only adds; [`set_publication`] (start-up)
//! also drops what is not cached; the writer's periodic check keeps the list current between.

use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

use super::conn::{quote_ident, ReplicationConn};
use super::WalError;
use crate::lsn::parse_lsn;

/// Which tables a publication covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublicationScope {
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

/// `CREATE PUBLICATION` for `tables` (already quoted `schema.name`s).
fn create_sql(name: &str, tables: &[String]) -> String {
    let list = if tables.is_empty() {
        String::new()
    } else {
        format!(" FOR TABLE {}", tables.join(", "))
    };
    format!(
        "CREATE PUBLICATION {}{list} WITH (publish_via_partition_root = true)",
        quote_ident(name)
    )
}

/// Resolves `table` (`to_regclass` spelling) to its quoted `schema.name` and whether
/// publication `name` lists it.
async fn resolve_table(
    client: &Client,
    name: &str,
    table: &str,
) -> Result<(String, bool), WalError> {
    let row = client
        .query_one(
            "SELECT n.nspname::text, c.relname::text, EXISTS ( \
               SELECT 1 FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid \
               WHERE p.pubname = $2 AND pr.prrelid = c.oid) \
             FROM (SELECT to_regclass($1) AS oid) r \
             LEFT JOIN pg_class c ON c.oid = r.oid \
             LEFT JOIN pg_namespace n ON n.oid = c.relnamespace",
            &[&table, &name],
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
    Ok((
        format!("{}.{}", quote_ident(&schema), quote_ident(&rel)),
        row.try_get::<_, bool>(2)?,
    ))
}

/// Creates publication `name` for the tables of `scope` if missing (a `FOR ALL TABLES` one is
/// replaced, see the module doc), makes it publish through partition roots, and adds the tables
/// it does not list yet.
pub async fn ensure_publication(
    client: &Client,
    name: &str,
    scope: &PublicationScope,
) -> Result<(), WalError> {
    let PublicationScope::Tables(tables) = scope;
    let mut quoted = Vec::with_capacity(tables.len());
    let mut present = Vec::with_capacity(tables.len());
    for t in tables {
        // A cached table dropped since start-up is no error: the catalog check removes it.
        match resolve_table(client, name, t).await {
            Ok((q, _)) => {
                quoted.push(q);
                present.push(t);
            }
            Err(WalError::Config(e)) => tracing::warn!(publication = name, "{e}"),
            Err(e) => return Err(e),
        }
    }
    let existing = client
        .query_opt(
            "SELECT puballtables, pubviaroot FROM pg_publication WHERE pubname = $1",
            &[&name],
        )
        .await?;
    match existing {
        None => {
            ignore_duplicate(client.batch_execute(&create_sql(name, &quoted)).await)?;
            return Ok(());
        }
        Some(row) if row.try_get::<_, bool>(0)? => {
            tracing::warn!(
                publication = name,
                "publication is FOR ALL TABLES, which makes UPDATE and DELETE fail at the origin \
                 for tables without a replica identity: replacing it with the cached tables"
            );
            let sql = format!(
                "BEGIN; DROP PUBLICATION {}; {}; COMMIT",
                quote_ident(name),
                create_sql(name, &quoted)
            );
            if let Err(e) = client.batch_execute(&sql).await {
                let _ = client.batch_execute("ROLLBACK").await;
                let detail = e
                    .as_db_error()
                    .map_or(e.to_string(), |d| d.message().to_string());
                return Err(WalError::Config(format!(
                    "publication {name} is FOR ALL TABLES, which makes UPDATE and DELETE fail at \
                     the origin for tables without a replica identity, and it could not be \
                     replaced ({detail}): as its owner or a superuser, run DROP PUBLICATION {}; \
                     pgline then creates it listing the cached tables",
                    quote_ident(name)
                )));
            }
            return Ok(());
        }
        Some(row) => {
            if !row.try_get::<_, bool>(1)? {
                client
                    .batch_execute(&format!(
                        "ALTER PUBLICATION {} SET (publish_via_partition_root = true)",
                        quote_ident(name)
                    ))
                    .await?;
            }
        }
    }
    for table in present {
        let (qualified, listed) = resolve_table(client, name, table).await?;
        if !listed {
            let sql = format!(
                "ALTER PUBLICATION {} ADD TABLE {qualified}",
                quote_ident(name)
            );
            ignore_duplicate(client.batch_execute(&sql).await)?;
        }
    }
    Ok(())
}

/// [`ensure_publication`], then drops from the publication every table not in `scope`: at
/// start-up the publication lists exactly the cached tables.
pub async fn set_publication(
    client: &Client,
    name: &str,
    scope: &PublicationScope,
) -> Result<(), WalError> {
    ensure_publication(client, name, scope).await?;
    let PublicationScope::Tables(tables) = scope;
    let wanted: Vec<String> = tables.clone();
    let extra: Vec<String> = client
        .query(
            "SELECT format('%I.%I', n.nspname, c.relname) \
             FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid \
             JOIN pg_class c ON c.oid = pr.prrelid JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE p.pubname = $1 AND pr.prrelid <> ALL (ARRAY(SELECT to_regclass(t)::oid \
               FROM unnest($2::text[]) AS t))",
            &[&name, &wanted],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    if !extra.is_empty() {
        tracing::info!(publication = name, tables = ?extra, "dropping tables pgline does not cache from its publication");
        let sql = format!(
            "ALTER PUBLICATION {} DROP TABLE {}",
            quote_ident(name),
            extra.join(", ")
        );
        client.batch_execute(&sql).await?;
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

/// `server_version_num` of the server `client` is connected to (e.g. 170004).
pub async fn server_version(client: &Client) -> Result<i32, WalError> {
    let row = client.query_one("SHOW server_version_num", &[]).await?;
    let v: String = row.try_get(0)?;
    v.trim()
        .parse()
        .map_err(|_| WalError::Protocol(format!("bad server_version_num {v:?}")))
}

/// Whether the server `client` is connected to is a standby (`pg_is_in_recovery()`).
pub async fn in_recovery(client: &Client) -> Result<bool, WalError> {
    let row = client.query_one("SELECT pg_is_in_recovery()", &[]).await?;
    Ok(row.try_get(0)?)
}

/// First PostgreSQL version with failover slots (`server_version_num`).
pub const FAILOVER_SLOTS_VERSION: i32 = 170_000;

/// What `pg_replication_slots` says about a logical slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotState {
    /// Its changes are synchronized to standbys (`failover`, 17+; false before).
    pub failover: bool,
    /// A copy kept by a standby's slot-sync worker (`synced`, 17+; false before).
    pub synced: bool,
    /// Dropped at the end of the session, or (for a synced slot) not yet sync-ready.
    pub temporary: bool,
    /// Why it can no longer be used (`invalidation_reason` on 17+, `conflicting` on 16,
    /// `wal_status = 'lost'` on every version), or `None` if it can.
    pub invalidated: Option<String>,
    pub confirmed_flush: Option<u64>,
}

impl SlotState {
    /// Whether streaming from it can resume where the cache is: neither temporary nor
    /// invalidated.
    pub fn usable(&self) -> bool {
        !self.temporary && self.invalidated.is_none()
    }
}

/// The state of slot `slot`, or `None` if there is none; `version` is the server's
/// [`server_version`] (the columns differ by version).
pub async fn slot_state(
    client: &Client,
    slot: &str,
    version: i32,
) -> Result<Option<SlotState>, WalError> {
    let extra = if version >= FAILOVER_SLOTS_VERSION {
        "failover, synced, invalidation_reason"
    } else if version >= 160_000 {
        "false, false, CASE WHEN conflicting THEN 'conflicting with recovery' END"
    } else {
        "false, false, NULL::text"
    };
    let row = client
        .query_opt(
            &format!(
                "SELECT {extra}, temporary, wal_status, confirmed_flush_lsn::text \
                 FROM pg_replication_slots WHERE slot_name = $1"
            ),
            &[&slot],
        )
        .await?;
    let Some(row) = row else { return Ok(None) };
    let wal_status: Option<String> = row.try_get(4)?;
    let invalidated = row
        .try_get::<_, Option<String>>(2)?
        .or_else(|| (wal_status.as_deref() == Some("lost")).then(|| "wal_removed".to_string()));
    let lsn: Option<String> = row.try_get(5)?;
    Ok(Some(SlotState {
        failover: row.try_get(0)?,
        synced: row.try_get(1)?,
        temporary: row.try_get(3)?,
        invalidated,
        confirmed_flush: lsn.as_deref().and_then(parse_lsn),
    }))
}

/// Creates a permanent logical slot using `pgoutput`, a failover slot (synchronized to
/// standbys, PostgreSQL 17+) if `failover`; returns its consistent point.
pub async fn create_logical_slot(
    client: &Client,
    slot: &str,
    failover: bool,
) -> Result<u64, WalError> {
    if !failover {
        return create_slot(client, slot).await;
    }
    let row = client
        .query_one(
            "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput', false, false, true)",
            &[&slot],
        )
        .await?;
    let lsn: String = row.try_get(0)?;
    parse_lsn(&lsn).ok_or_else(|| WalError::Protocol(format!("bad slot LSN {lsn}")))
}

/// Makes an existing slot a failover slot (`ALTER_REPLICATION_SLOT`, PostgreSQL 17+, a
/// replication command: hence the replication connection). The slot must not be in use.
pub async fn enable_failover(conn: &mut ReplicationConn, slot: &str) -> Result<(), WalError> {
    conn.simple_query(&format!(
        "ALTER_REPLICATION_SLOT {} ( FAILOVER true )",
        quote_ident(slot)
    ))
    .await?;
    Ok(())
}

/// `pg_log_standby_snapshot()` on the primary (PostgreSQL 16+): writes the running-xacts
/// record that creating a logical slot on a standby waits for (an idle primary may otherwise
/// take a long while to write one).
pub async fn log_standby_snapshot(primary: &Client) -> Result<(), WalError> {
    primary
        .execute("SELECT pg_log_standby_snapshot()", &[])
        .await?;
    Ok(())
}

/// The primary's `synchronized_standby_slots` (PostgreSQL 17+), empty if unset.
pub async fn synchronized_standby_slots(primary: &Client) -> Result<String, WalError> {
    let row = primary
        .query_one("SHOW synchronized_standby_slots", &[])
        .await?;
    Ok(row.try_get(0)?)
}

/// A standby's replay delay in ms: 0 when it has replayed everything it received, else the
/// time since the last replayed commit (`None` on a primary).
pub async fn standby_replay_lag_ms(standby: &Client) -> Result<Option<u64>, WalError> {
    let row = standby
        .query_one(
            "SELECT CASE WHEN NOT pg_is_in_recovery() THEN NULL \
                    WHEN pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn() THEN 0 \
                    ELSE (extract(epoch FROM now() - pg_last_xact_replay_timestamp()) * 1000)::int8 END",
            &[],
        )
        .await?;
    Ok(row
        .try_get::<_, Option<i64>>(0)?
        .map(|v| u64::try_from(v).unwrap_or(0)))
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
