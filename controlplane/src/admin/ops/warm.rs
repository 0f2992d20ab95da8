//! Warming a table: every row read into the cache, in batches, through the store writer's
//! leases.
//!
//! The task pages through the table's primary keys in key order (keyset pagination, one short
//! query per page, so no origin connection is held between pages and a pool of one still works),
//! hands each page to the writer as an `AdminCmd::Warm` (which leases the keys and fills them
//! with the miss path's batched read) and waits for that fill before reading the next page, so
//! warming never has more than one batch in flight. Progress goes to the table's
//! [`TableState::Warming`]; the end to `Active`, an origin error to `Failed`.
//!
//! A key whose lease a concurrent write voided is filled again (up to `WARM_TRIES` times).
//! Rows inserted after their place in key order was passed are not warmed (they fill on their
//! first miss); rows deleted in between are cached as absent, which is what they are.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, watch};

use super::Admin;
use crate::admin::{TableState, TableStates};
use crate::catalog::{quote_ident, CatalogCell, TableInfo};
use crate::config::Runtime;
use crate::writer::AdminCmd;

/// Fills of one batch before its still-voided keys are left to their next miss.
const WARM_TRIES: usize = 5;

struct Warmer {
    id: u32,
    epoch: u64,
    pool: deadpool_postgres::Pool,
    admin: mpsc::Sender<AdminCmd>,
    states: Arc<TableStates>,
    catalog: Arc<CatalogCell>,
    runtime: Arc<Runtime>,
    shutdown: watch::Receiver<bool>,
}

/// Starts warming table `id` in the background, as run `epoch` of its [`TableStates`].
pub(super) fn spawn(p: &Admin, id: u32, epoch: u64) {
    let w = Warmer {
        id,
        epoch,
        pool: p.pool.clone(),
        admin: p.writer.clone(),
        states: p.states.clone(),
        catalog: p.catalog.clone(),
        runtime: p.runtime.clone(),
        shutdown: p.shutdown.clone(),
    };
    tokio::spawn(async move {
        let state = match w.run().await {
            Ok(()) => TableState::Active,
            Err(detail) => {
                tracing::warn!(table = w.id, "warming stopped: {detail}");
                TableState::Failed { detail }
            }
        };
        w.states.update(w.id, w.epoch, state);
    });
}

impl Warmer {
    async fn run(&self) -> Result<(), String> {
        let table = self
            .catalog
            .get(self.id)
            .ok_or("the table is no longer cached")?;
        let total = self.count(&table).await?;
        self.progress(0, total)?;
        let mut done = 0u64;
        let mut after: Option<Vec<String>> = None;
        loop {
            if *self.shutdown.borrow() {
                return Err("pgline is shutting down".into());
            }
            let batch = self.runtime.fill_batch().max(1);
            let page = self.page(&table, after.as_deref(), batch).await?;
            let Some(last) = page.last() else {
                break;
            };
            let last = last.clone();
            let pks: Vec<Box<[u8]>> = page
                .iter()
                .map(|parts| parts.join(":").into_bytes().into_boxed_slice())
                .collect();
            let n = pks.len();
            self.fill(pks).await?;
            done += n as u64;
            self.progress(done, total.max(done))?;
            if n < batch {
                break;
            }
            after = Some(last);
        }
        Ok(())
    }

    /// Fills one batch; keys whose lease a concurrent write voided are tried again (a few
    /// times: a key written without pause is left to fill on its next miss).
    async fn fill(&self, mut pks: Vec<Box<[u8]>>) -> Result<(), String> {
        for _ in 0..WARM_TRIES {
            if pks.is_empty() {
                break;
            }
            let (tx, rx) = oneshot::channel();
            self.admin
                .send(AdminCmd::Warm(self.id, pks, tx))
                .await
                .map_err(|_| "pgline is shutting down".to_string())?;
            pks = rx
                .await
                .map_err(|_| "pgline is shutting down".to_string())??;
        }
        Ok(())
    }

    /// Records progress; an error once this run was superseded (the table removed).
    fn progress(&self, done: u64, total: u64) -> Result<(), String> {
        let state = TableState::Warming { done, total };
        if self.states.update(self.id, self.epoch, state) {
            Ok(())
        } else {
            Err("superseded: the table was removed".into())
        }
    }

    async fn client(&self) -> Result<deadpool_postgres::Client, String> {
        self.pool.get().await.map_err(|e| format!("origin: {e}"))
    }

    async fn count(&self, table: &TableInfo) -> Result<u64, String> {
        let sql = format!("SELECT count(*) FROM {}", table.qualified());
        let row = self
            .client()
            .await?
            .query_one(&sql, &[])
            .await
            .map_err(|e| origin_detail(&e))?;
        Ok(u64::try_from(row.get::<_, i64>(0)).unwrap_or(0))
    }

    /// The next `limit` primary keys after `after` (each as its columns' output texts).
    async fn page(
        &self,
        table: &TableInfo,
        after: Option<&[String]>,
        limit: usize,
    ) -> Result<Vec<Vec<String>>, String> {
        let cols: Vec<String> = table
            .key_columns
            .iter()
            .map(|&c| format!("t.{}", quote_ident(&table.columns[c].name)))
            .collect();
        let select: Vec<String> = cols.iter().map(|c| format!("format('%s', {c})")).collect();
        let mut sql = format!("SELECT {} FROM {} t", select.join(", "), table.qualified());
        if after.is_some() {
            let params: Vec<String> = table
                .key_columns
                .iter()
                .enumerate()
                .map(|(i, &c)| format!("${}::text::{}", i + 2, table.columns[c].type_name))
                .collect();
            sql.push_str(&format!(
                " WHERE ({}) > ({})",
                cols.join(", "),
                params.join(", ")
            ));
        }
        sql.push_str(&format!(" ORDER BY {} LIMIT $1", cols.join(", ")));
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![&limit];
        if let Some(after) = after {
            for a in after {
                params.push(a);
            }
        }
        let rows = self
            .client()
            .await?
            .query(&sql, &params)
            .await
            .map_err(|e| origin_detail(&e))?;
        Ok(rows
            .iter()
            .map(|r| (0..cols.len()).map(|i| r.get::<_, String>(i)).collect())
            .collect())
    }
}

/// An origin error with the server's message (tokio-postgres displays only "db error").
pub(super) fn origin_detail(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("origin: {}: {}", db.code().code(), db.message()),
        None => format!("origin: {e}"),
    }
}
