//! The backend pool of one (user, database): idle origin connections and a bound on how many
//! exist.
//!
//! pgline never holds its clients' passwords, so it cannot open a connection for a user by
//! itself: a pool grows only by the connections clients authenticate at startup (one joins
//! while the pool has room, see [`Pool::join`]). A batch takes an idle connection or waits for
//! one; when every connection of a pool has died, batches fail until a client authenticates
//! again.
//!
//! Thread model: shared by the sessions of that (user, database); a std mutex guards the idle
//! list (held for a push or pop, never across an await), a `Notify` wakes waiters.

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;

use super::backend::Backend;

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    #[error("no origin connection left for this user and database")]
    Empty,
    #[error("no origin connection became free in time")]
    Timeout,
}

struct Inner {
    idle: Vec<Backend>,
    total: usize,
}

pub struct Pool {
    size: usize,
    inner: Mutex<Inner>,
    notify: Notify,
}

impl Pool {
    pub fn new(size: usize) -> Pool {
        Pool {
            size,
            inner: Mutex::new(Inner {
                idle: Vec::new(),
                total: 0,
            }),
            notify: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a freshly authenticated connection; hands it back when the pool is full.
    pub fn join(&self, b: Backend) -> Option<Backend> {
        let mut inner = self.lock();
        if inner.total >= self.size {
            return Some(b);
        }
        inner.total += 1;
        inner.idle.push(b);
        drop(inner);
        self.notify.notify_one();
        None
    }

    /// Takes an idle connection (the most recently used), waiting up to `wait` for one.
    pub async fn take(&self, wait: Duration) -> Result<Backend, PoolError> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut inner = self.lock();
                if let Some(b) = inner.idle.pop() {
                    return Ok(b);
                }
                if inner.total == 0 {
                    return Err(PoolError::Empty);
                }
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Err(PoolError::Timeout);
            }
        }
    }

    /// Returns a taken connection.
    pub fn put(&self, b: Backend) {
        self.lock().idle.push(b);
        self.notify.notify_one();
    }

    /// A taken connection is gone (broken or closed).
    pub fn discard(&self) {
        let mut inner = self.lock();
        inner.total = inner.total.saturating_sub(1);
        drop(inner);
        // Waiters must see an empty pool rather than wait out their timeout.
        self.notify.notify_waiters();
    }

    /// (idle, total).
    pub fn counts(&self) -> (usize, usize) {
        let inner = self.lock();
        (inner.idle.len(), inner.total)
    }
}
