//! The query-result cache's leases and landed answers, between the PostgreSQL relay (which
//! takes a lease before it sends a cacheable statement and hands over the answer) and the store
//! writer (which bumps the leases' epochs as it applies WAL and installs or refuses answers).
//! Control plane only: the cores never see it (they know only [`ResultKey`]).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use pgline_dataplane::plane::ResultKey;
use tokio::sync::Notify;

/// A landed answer for the writer to install (or refuse).
#[derive(Debug)]
pub struct ResultFill {
    pub key: Box<ResultKey>,
    /// RowDescription, DataRow*, CommandComplete exactly as the origin sent them.
    pub bytes: Vec<u8>,
    /// `pg_current_snapshot()::text` taken on the same backend right before the statement.
    pub snapshot: String,
    pub lease: ResultLease,
}

/// Leases of the result cache: per table an epoch, bumped by the writer for every WAL change
/// it applies to the table. A relay takes a lease (the epochs of the tables read) before it
/// sends a cacheable statement; the writer installs the answer only if the epochs are
/// unchanged. Outstanding lease ids tell the writer which snapshots may still land (for
/// pruning its applied-xid records).
#[derive(Debug, Default)]
pub struct ResultPlane {
    state: Mutex<LeaseState>,
    landed: Mutex<Vec<ResultFill>>,
    /// The writer's waker: a landed answer wakes it.
    writer: Arc<Notify>,
}

#[derive(Debug, Default)]
struct LeaseState {
    epochs: HashMap<u32, u64>,
    /// Bumped by a flush of everything.
    generation: u64,
    next: u64,
    outstanding: BTreeSet<u64>,
}

/// One outstanding lease; dropping it (landed, refused or abandoned) ends it.
#[derive(Debug)]
pub struct ResultLease {
    plane: Arc<ResultPlane>,
    pub id: u64,
    /// `(table, epoch)` when the lease was taken.
    pub epochs: Vec<(u32, u64)>,
    generation: u64,
}

impl Drop for ResultLease {
    fn drop(&mut self) {
        lock(&self.plane.state).outstanding.remove(&self.id);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl ResultPlane {
    /// A plane whose landed answers wake `writer` (the store writer's waker).
    pub fn new(writer: Arc<Notify>) -> ResultPlane {
        ResultPlane {
            writer,
            ..ResultPlane::default()
        }
    }

    /// Takes a lease on `tables` (before the statement is sent to the origin).
    pub fn lease(self: &Arc<Self>, tables: &[u32]) -> ResultLease {
        let mut st = lock(&self.state);
        let id = st.next;
        st.next += 1;
        st.outstanding.insert(id);
        let epochs = tables
            .iter()
            .map(|t| (*t, st.epochs.get(t).copied().unwrap_or(0)))
            .collect();
        ResultLease {
            plane: self.clone(),
            id,
            epochs,
            generation: st.generation,
        }
    }

    /// A WAL change of `table` was applied: leases taken before are void for it.
    pub fn bump(&self, table: u32) {
        *lock(&self.state).epochs.entry(table).or_insert(0) += 1;
    }

    /// Every table changed (a cache flush): every lease taken before is void.
    pub fn bump_all(&self) {
        lock(&self.state).generation += 1;
    }

    /// Whether no WAL change of the lease's tables was applied since it was taken.
    pub fn unchanged(&self, lease: &ResultLease) -> bool {
        let st = lock(&self.state);
        lease.generation == st.generation
            && lease
                .epochs
                .iter()
                .all(|(t, e)| st.epochs.get(t).copied().unwrap_or(0) == *e)
    }

    /// The oldest outstanding lease id, or the next id when none is outstanding.
    pub fn oldest_outstanding(&self) -> u64 {
        let st = lock(&self.state);
        st.outstanding.iter().next().copied().unwrap_or(st.next)
    }

    /// The id the next lease will get.
    pub fn next_id(&self) -> u64 {
        lock(&self.state).next
    }

    /// Hands a landed answer to the writer, and wakes it.
    pub fn push(&self, fill: ResultFill) {
        lock(&self.landed).push(fill);
        self.writer.notify_one();
    }

    /// The landed answers, oldest first.
    pub fn drain(&self) -> Vec<ResultFill> {
        std::mem::take(&mut *lock(&self.landed))
    }
}
