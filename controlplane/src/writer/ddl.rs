//! DDL the WAL does not show: DROP and RENAME of cached tables, and a new table taking a cached
//! table's name.
//!
//! A table's id in the store is its OID. Logical decoding emits nothing for `DROP TABLE` or
//! `ALTER TABLE ... RENAME`, and a table re-created under the same name has a new OID (its
//! Relation message, if any, carries that new OID). So the writer checks the catalog against
//! the origin every `catalog.check_interval_ms` (one `pg_class` query, [`check_tables`]), and at
//! once when a Relation message shows a cached table under a new name or a cached table's name
//! under a new OID.
//!
//! Invariants:
//! - A table found dropped or renamed leaves the catalog (its keys answer as an unknown table),
//!   then its entries are flushed and its leases voided (`drop_table`), in one writer turn: no
//!   fill in flight for it can install afterwards, and no new miss can lease it.
//! - Its old name is resolved again: a table that now has it (re-created, or moved there by a
//!   rename) joins the catalog under its own OID, after joining a table-list publication and
//!   waiting out transactions older than that (as `POST /v1/tables` does). In table-list mode a
//!   name nothing has taken yet stays pending and is resolved again at every check; in
//!   every-table mode a renamed table rejoins under its new name, and a new table joins when the
//!   WAL first mentions it.
//!
//! The same check keeps the publication to what is cached (issue 11, O1): it drops from it any
//! table that cannot be cached (a published table without a replica identity refuses UPDATE and
//! DELETE at the origin); a cached table that stopped being cacheable (made unlogged, primary
//! key dropped, no longer published under its own name) leaves the catalog like a dropped one;
//! in every-table mode, new tables with a primary key join the publication and the catalog; and
//! it refreshes the list of user tables that cannot be cached, whose keys answer an error.
//!
//! Thread model: the check runs in a task of its own (it may wait for old transactions); the
//! writer applies its report in one turn. At most one check runs at a time.
//!
//! Limitation: between a DROP and the next check, hits of the dropped table are still served (the
//! rows were current at DROP time). Fills in that window cannot install rows of another table
//! under the old id: the fill query checks that the name it reads still is the cached OID
//! (`fill::batch_sql`). See `docs/consistency.md`, "DDL".

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::Writer;
use crate::catalog::{self, quote_ident, CatalogError, TableInfo};
use crate::wal::Relation;

/// How long a check waits for transactions older than a table's joining the publication.
const OLDER_TXN_WAIT: Duration = Duration::from_secs(5);
/// A check that takes longer than this is abandoned (and retried at the next interval).
const CHECK_TIMEOUT: Duration = Duration::from_secs(30);

/// The writer's state for the catalog check.
pub(super) struct DdlCheck {
    next_at: Instant,
    running: bool,
    tx: mpsc::UnboundedSender<DdlReport>,
    rx: mpsc::UnboundedReceiver<DdlReport>,
    /// Quoted `schema.name`s of dropped or renamed tables that nothing has taken yet.
    pending: Vec<String>,
    /// The digest of what moves name resolution (`catalog::NAMES_SQL`: the schemas, their
    /// owners and access lists, which schemas each cache user may use, the cache users' names)
    /// as last read, on a schedule of its own (one query, never held up by the table check's
    /// waits).
    names: Option<String>,
    /// The users whose sessions may read the cache (`Config::pg_cache_users`), for that digest.
    names_users: Arc<[String]>,
    names_next_at: Instant,
    names_running: bool,
    names_tx: mpsc::UnboundedSender<Option<String>>,
    names_rx: mpsc::UnboundedReceiver<Option<String>>,
}

impl DdlCheck {
    pub(super) fn new(cache_users: Vec<String>) -> DdlCheck {
        let (tx, rx) = mpsc::unbounded_channel();
        let (names_tx, names_rx) = mpsc::unbounded_channel();
        DdlCheck {
            next_at: Instant::now(),
            running: false,
            tx,
            rx,
            pending: Vec::new(),
            names: None,
            names_users: cache_users.into(),
            names_next_at: Instant::now(),
            names_running: false,
            names_tx,
            names_rx,
        }
    }
}

/// What one check found.
struct DdlReport {
    /// Cached tables dropped or renamed.
    gone: Vec<u32>,
    /// Cached tables whose row-level security changed: `(id, enabled, forced)`.
    security: Vec<(u32, bool, bool)>,
    /// The user tables that cannot be cached, when read.
    refused: Option<Vec<catalog::RefusedTable>>,
    /// Tables that took a gone table's name (or a renamed table, in every-table mode).
    added: Vec<TableInfo>,
    /// Names still to resolve at the next check.
    pending: Vec<String>,
    error: Option<String>,
    /// The check's last report. The first reports only `gone`, before any name is resolved (which
    /// may wait for old transactions), so a dropped table leaves as early as possible.
    last: bool,
}

/// What the check task needs.
struct CheckInput {
    pool: deadpool_postgres::Pool,
    publication: String,
    all_tables: bool,
    tables: Vec<catalog::CheckedTable>,
    /// Tables removed through the API in every-table mode: not to be added back.
    excluded: Vec<u32>,
    pending: Vec<String>,
}

impl Writer {
    /// Applies a finished check, and starts the next one when it is due.
    pub(super) fn poll_ddl_check(&mut self, now: Instant) {
        self.poll_names_check(now);
        while let Ok(report) = self.ddl.rx.try_recv() {
            if report.last {
                self.ddl.running = false;
                self.ddl.pending = report.pending.clone();
            }
            self.apply_ddl_report(report);
        }
        if self.ddl.running || now < self.ddl.next_at {
            return;
        }
        self.ddl.running = true;
        self.ddl.next_at = now + Duration::from_millis(self.cfg.catalog.check_interval_ms);
        let input = CheckInput {
            pool: self.pool.clone(),
            publication: self.cfg.replication.publication.clone(),
            all_tables: self.all_tables,
            tables: self
                .catalog
                .tables
                .values()
                .map(|t| {
                    let (id, s, n) = (t.id, t.schema.clone(), t.name.clone());
                    (id, s, n, t.row_security, t.force_row_security)
                })
                .collect(),
            excluded: self.excluded.iter().copied().collect(),
            pending: self.ddl.pending.clone(),
        };
        let tx = self.ddl.tx.clone();
        tokio::spawn(async move {
            let pending = input.pending.clone();
            let report = match tokio::time::timeout(CHECK_TIMEOUT, run_check(input, &tx)).await {
                Ok(report) => report,
                Err(_) => DdlReport {
                    gone: Vec::new(),
                    security: Vec::new(),
                    refused: None,
                    added: Vec::new(),
                    pending,
                    error: Some(format!("timed out after {CHECK_TIMEOUT:?}")),
                    last: true,
                },
            };
            let _ = tx.send(report);
        });
    }

    /// The digest of what moves name resolution (`catalog::NAMES_SQL`), read every
    /// `catalog.check_interval_ms`. When they change, an open session may resolve a cached
    /// table's name elsewhere with no statement of its own (a schema made under its user's
    /// name), and a stored answer may have been read under such a name while its statement
    /// ran: a new key space generation closes every session's cache gate (each reads its state
    /// again before its next cached answer), and every stored answer goes.
    fn poll_names_check(&mut self, now: Instant) {
        while let Ok(read) = self.ddl.names_rx.try_recv() {
            self.ddl.names_running = false;
            let Some(names) = read else { continue };
            // The first read is the baseline: a publish then would also flush every RESP
            // tracking listener at start-up, for DDL in the few milliseconds before it.
            let Some(before) = self.ddl.names.replace(names.clone()) else {
                continue;
            };
            if before == names {
                continue;
            }
            tracing::info!(
                "schemas, their grants or the cache users changed: sessions read their state again, stored answers dropped"
            );
            self.results
                .drop_every_answer(&mut self.store, &self.leases);
            self.publish_catalog();
        }
        if self.ddl.names_running || now < self.ddl.names_next_at {
            return;
        }
        self.ddl.names_running = true;
        self.ddl.names_next_at = now + Duration::from_millis(self.cfg.catalog.check_interval_ms);
        let pool = self.pool.clone();
        let tx = self.ddl.names_tx.clone();
        let users = self.ddl.names_users.clone();
        tokio::spawn(async move {
            let read = async {
                let client = pool.get().await.map_err(|e| e.to_string())?;
                catalog::load_names(&client, &users)
                    .await
                    .map_err(|e| e.to_string())
            };
            let names = match tokio::time::timeout(CHECK_TIMEOUT, read).await {
                Ok(Ok(n)) => Some(n),
                Ok(Err(e)) => {
                    tracing::warn!("reading what moves name resolution at the origin failed: {e}");
                    None
                }
                Err(_) => {
                    tracing::warn!("reading what moves name resolution at the origin timed out");
                    None
                }
            };
            let _ = tx.send(names);
        });
    }

    /// A Relation message that shows a cached table under a new name, or a cached table's name
    /// under a new OID (dropped and re-created, or renamed away): checks the catalog now and
    /// returns true (the check, not the Relation message, then updates the catalog).
    pub(super) fn relation_moved(&mut self, rel: &Relation) -> bool {
        let moved = match self.catalog.get(rel.id) {
            Some(t) => t.schema != rel.namespace || t.name != rel.name,
            None => self
                .catalog
                .tables
                .values()
                .any(|t| t.schema == rel.namespace && t.name == rel.name),
        };
        if moved {
            tracing::info!(
                table = rel.id,
                name = %format!("{}.{}", rel.namespace, rel.name),
                "relation renamed or replaced: checking the catalog"
            );
            self.ddl.next_at = Instant::now();
        }
        moved
    }

    fn apply_ddl_report(&mut self, report: DdlReport) {
        if let Some(e) = &report.error {
            tracing::warn!("catalog check failed: {e}");
        }
        let mut changed = false;
        if let Some(refused) = report.refused {
            if refused != self.catalog.refused {
                self.catalog.refused = refused;
                changed = true;
            }
        }
        for (id, rls, force) in report.security {
            if let Some(t) = self.catalog.get(id) {
                let mut t = (**t).clone();
                tracing::info!(table = id, name = %format!("{}.{}", t.schema, t.name),
                    enabled = rls, forced = force, "row-level security changed");
                t.row_security = rls;
                t.force_row_security = force;
                self.catalog.insert(t, &self.cfg.catalog);
                changed = true;
            }
        }
        if changed {
            self.publish_catalog();
        }
        let mut removed = Vec::new();
        for id in report.gone {
            if let Some(t) = self.catalog.get(id).cloned() {
                self.catalog.remove(id, &self.cfg.catalog);
                tracing::info!(table = id, name = %format!("{}.{}", t.schema, t.name),
                    "table dropped or renamed on the origin: its entries are flushed");
                removed.push(id);
            }
        }
        // Cores stop resolving the old table's keys first, then its entries and leases go.
        if !removed.is_empty() {
            self.publish_catalog();
        }
        for id in removed {
            self.drop_table(id);
        }
        let mut added = false;
        for t in report.added {
            let qualified = format!("{}.{}", quote_ident(&t.schema), quote_ident(&t.name));
            let clash = self
                .catalog
                .tables
                .values()
                .any(|c| c.schema == t.schema && c.name == t.name);
            if clash || self.catalog.get(t.id).is_some() || self.excluded.contains(&t.id) {
                if clash && !self.all_tables {
                    self.ddl.pending.push(qualified);
                }
                continue;
            }
            tracing::info!(table = t.id, name = %qualified, "table joined the cache");
            // Nothing of it can be in the store, but be sure (as for a table added by the API).
            self.drop_table(t.id);
            self.catalog.insert(t, &self.cfg.catalog);
            added = true;
        }
        if added {
            self.publish_catalog();
        }
    }
}

/// One check: which cached tables are gone, and which tables now have their names.
async fn run_check(input: CheckInput, tx: &mpsc::UnboundedSender<DdlReport>) -> DdlReport {
    let mut report = DdlReport {
        gone: Vec::new(),
        security: Vec::new(),
        refused: None,
        added: Vec::new(),
        pending: input.pending.clone(),
        error: None,
        last: true,
    };
    let client = match input.pool.get().await {
        Ok(c) => c,
        Err(e) => {
            report.error = Some(e.to_string());
            return report;
        }
    };
    let mut check = match catalog::check_tables(&client, &input.publication, &input.tables).await {
        Ok(c) => c,
        Err(e) => {
            report.error = Some(e.to_string());
            return report;
        }
    };
    report.security = std::mem::take(&mut check.security);
    for (id, why) in &check.uncacheable {
        tracing::info!(table = id, "cached table is not cacheable any more: {why}");
        check.dropped.push(*id);
    }
    match catalog::publication_prune(&client, &input.publication).await {
        Ok(pruned) if !pruned.is_empty() => tracing::info!(publication = %input.publication,
            tables = ?pruned, "dropped tables that cannot be cached from the publication"),
        Ok(_) => {}
        Err(e) => report.error = Some(format!("pruning the publication: {e}")),
    }
    match catalog::load_refused(&client).await {
        Ok(r) => report.refused = Some(r),
        Err(e) => report.error = Some(format!("listing tables that cannot be cached: {e}")),
    }
    let old_name = |id: u32| {
        input
            .tables
            .iter()
            .find(|t| t.0 == id)
            .map(|(_, s, n, _, _)| format!("{}.{}", quote_ident(s), quote_ident(n)))
    };
    let mut names = std::mem::take(&mut report.pending);
    for &id in &check.dropped {
        names.extend(old_name(id));
    }
    for (id, schema, name) in &check.renamed {
        names.extend(old_name(*id));
        if input.all_tables {
            names.push(format!("{}.{}", quote_ident(schema), quote_ident(name)));
        }
    }
    if input.all_tables {
        let mut known: Vec<u32> = input.tables.iter().map(|t| t.0).collect();
        known.extend(&input.excluded);
        match catalog::new_tables(&client, &known).await {
            Ok(new) => names.extend(new),
            Err(e) => report.error = Some(format!("listing new tables: {e}")),
        }
    }
    names.sort();
    names.dedup();
    let mut gone = check.dropped;
    gone.extend(check.renamed.iter().map(|r| r.0));
    if !gone.is_empty() {
        let _ = tx.send(DdlReport {
            gone: gone.clone(),
            security: Vec::new(),
            refused: None,
            added: Vec::new(),
            pending: Vec::new(),
            error: None,
            last: false,
        });
    }
    for name in names {
        match resolve(&client, &input, &name, &gone).await {
            Ok(Resolved::Table(t)) => report.added.push(t),
            Ok(Resolved::Cached) => {}
            Ok(Resolved::OlderTransactions) => {
                report.pending.push(name.clone());
                report.error = Some(format!(
                    "{name} joined the publication, but older transactions are still open \
                     after {OLDER_TXN_WAIT:?}: retrying at the next check"
                ));
            }
            Err(e) => {
                if !input.all_tables {
                    report.pending.push(name.clone());
                }
                if !matches!(
                    e,
                    CatalogError::NoSuchTable(_)
                        | CatalogError::NoPrimaryKey(_)
                        | CatalogError::NotCacheable { .. }
                ) {
                    report.error = Some(format!("resolving {name}: {e}"));
                }
            }
        }
    }
    report
}

/// What a name resolved to.
enum Resolved {
    /// A table ready to join the catalog.
    Table(TableInfo),
    /// A table that is cached already.
    Cached,
    /// A table that joined the publication while older transactions are still open: their
    /// changes to it may be decoded without it, so it cannot be cached yet.
    OlderTransactions,
}

/// The table now called `name`.
async fn resolve(
    client: &tokio_postgres::Client,
    input: &CheckInput,
    name: &str,
    gone: &[u32],
) -> Result<Resolved, CatalogError> {
    let t = catalog::load_named_table(client, name).await?;
    if input.tables.iter().any(|c| c.0 == t.id) && !gone.contains(&t.id) {
        return Ok(Resolved::Cached);
    }
    let listed = catalog::publication_add(client, &input.publication, &t).await?;
    if listed && !catalog::wait_for_older_transactions(client, OLDER_TXN_WAIT).await? {
        return Ok(Resolved::OlderTransactions);
    }
    Ok(Resolved::Table(t))
}
