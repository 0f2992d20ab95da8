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
//! Rows inserted after their place in key order was passed are not warmed (they fill on their
//! first miss); rows deleted in between are cached as absent, which is what they are.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot, watch};

use crate::admin::TableState;
use crate::catalog::{quote_ident, CatalogCell, TableInfo};
use crate::config::Runtime;
use crate::server::Pgline;
use crate::writer::AdminCmd;

struct Warmer {
    id: u32,
    pool: deadpool_postgres::Pool,
    admin: mpsc::Sender<AdminCmd>,
    states: Arc<Mutex<HashMap<u32, TableState>>>,
    catalog: Arc<CatalogCell>,
    runtime: Arc<Runtime>,
    shutdown: watch::Receiver<bool>,
}

/// Starts warming table `id` in the background.
pub(super) fn spawn(p: &Pgline, id: u32) {
    let w = Warmer {
        id,
        pool: p.pool.clone(),
        admin: p.admin.clone(),
        states: p.states.clone(),
        catalog: p.catalog.clone(),
        runtime: p.runtime.clone(),
        shutdown: p.shutdown.subscribe(),
    };
    tokio::spawn(async move {
        let outcome = w.run().await;
        let mut states = w.states.lock().unwrap_or_else(|e| e.into_inner());
        match outcome {
            Ok(()) => {
                states.remove(&w.id);
            }
            Err(detail) => {
                tracing::warn!(table = w.id, "warming stopped: {detail}");
                // A removed table has no state to report.
                if w.catalog.get(w.id).is_some() {
                    states.insert(w.id, TableState::Failed { detail });
                } else {
                    states.remove(&w.id);
                }
            }
        }
    });
}

impl Warmer {
    async fn run(&self) -> Result<(), String> {
        let table = self
            .catalog
            .get(self.id)
            .ok_or("the table is no longer cached")?;
        let total = self.count(&table).await?;
        self.progress(0, total);
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
            let (tx, rx) = oneshot::channel();
            self.admin
                .send(AdminCmd::Warm(self.id, pks, tx))
                .await
                .map_err(|_| "pgline is shutting down".to_string())?;
            rx.await
                .map_err(|_| "pgline is shutting down".to_string())??;
            done += n as u64;
            self.progress(done, total.max(done));
            if n < batch {
                break;
            }
            after = Some(last);
        }
        Ok(())
    }

    fn progress(&self, done: u64, total: u64) {
        let mut states = self.states.lock().unwrap_or_else(|e| e.into_inner());
        states.insert(self.id, TableState::Warming { done, total });
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
            .map_err(|e| format!("origin: {e}"))?;
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
            .map_err(|e| format!("origin: {e}"))?;
        Ok(rows
            .iter()
            .map(|r| (0..cols.len()).map(|i| r.get::<_, String>(i)).collect())
            .collect())
    }
}
