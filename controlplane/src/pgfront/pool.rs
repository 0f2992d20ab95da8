//! The backend pool of one (user, database): idle origin connections and a bound on how many
//! exist.
//!
//! pgline never holds its clients' passwords, so it cannot open a connection for a user by
//! itself: a pool grows by the connections clients authenticate at startup (one joins while
//! the pool has room, see [`Pool::join`]). A batch takes an idle connection or waits for one;
//! when every connection of a pool has died, batches fail until a client authenticates again.
//! The exception is the user of `origin.url`, whose password pgline has: its pools open
//! connections on demand (with their first client's startup parameters), see
//! [`Pool::set_opener`].
//!
//! Trimming (see `admit` and [`Pool::sweep`]): a connection idle for longer than
//! `pgwire.pool_idle_timeout_ms` is closed (Terminate), and an idle connection the origin
//! closed (or that got input nobody asked for, such as the `FATAL 57P01` of
//! `pg_terminate_backend`) is dropped, both by the relay's sweep and by [`Pool::take`] before
//! it hands one out, so a client never gets a dead connection and no socket lingers in
//! CLOSE-WAIT in the pool.
//!
//! Thread model: shared by the sessions of that (user, database); a std mutex guards the idle
//! list (held for a push or pop, never across an await), a `Notify` wakes waiters.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::admit::OriginCounters;
use super::backend::{Backend, Opener};

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    #[error("no origin connection left for this user and database")]
    Empty,
    #[error("no origin connection became free in time")]
    Timeout,
    #[error("cannot open an origin connection")]
    Open,
}

struct Inner {
    /// Idle connections and since when, the most recently used last.
    idle: Vec<(Backend, Instant)>,
    total: usize,
    /// When a connection was last taken or returned (eviction picks the least recent).
    last_used: Instant,
}

/// What a [`Pool::sweep`] took out of the pool.
#[derive(Default)]
pub struct Swept {
    /// Idle past the timeout: to be closed with Terminate.
    pub expired: Vec<Backend>,
    /// Closed by the origin or unusable: dropped (their socket closes).
    pub dead: usize,
}

pub struct Pool {
    size: usize,
    inner: Mutex<Inner>,
    notify: Notify,
    /// Set when pgline holds this pool's password (the user of `origin.url`): the pool then
    /// also grows on demand, and refills after its connections died.
    opener: Mutex<Option<Opener>>,
    counters: Arc<OriginCounters>,
}

impl Pool {
    pub fn new(size: usize, counters: Arc<OriginCounters>) -> Pool {
        Pool {
            counters,
            size,
            inner: Mutex::new(Inner {
                idle: Vec::new(),
                total: 0,
                last_used: Instant::now(),
            }),
            notify: Notify::new(),
            opener: Mutex::new(None),
        }
    }

    /// Lets the pool open connections itself (kept: the first opener set wins).
    pub fn set_opener(&self, o: Opener) {
        let mut slot = self.opener.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(o);
        }
    }

    fn opener(&self) -> Option<Opener> {
        self.opener
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a freshly authenticated connection (its startup slot is given back); hands it back
    /// when the pool is full.
    pub fn join(&self, mut b: Backend) -> Option<Backend> {
        b.logged_in();
        let mut inner = self.lock();
        if inner.total >= self.size {
            return Some(b);
        }
        inner.total += 1;
        let now = Instant::now();
        inner.last_used = now;
        inner.idle.push((b, now));
        drop(inner);
        self.notify.notify_one();
        None
    }

    /// Takes an idle connection (the most recently used), waiting up to `wait` for one. Idle
    /// connections the origin closed are dropped on the way (`dead` counts them).
    pub async fn take(&self, wait: Duration) -> Result<Backend, PoolError> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let opener = self.opener();
            let open = {
                let mut inner = self.lock();
                while let Some((mut b, _)) = inner.idle.pop() {
                    if !b.unusable() {
                        inner.last_used = Instant::now();
                        return Ok(b);
                    }
                    inner.total = inner.total.saturating_sub(1);
                    OriginCounters::add(&self.counters.backend_dead, 1);
                    tracing::debug!("pgwire: an idle origin connection was closed by the origin");
                }
                if opener.is_some() && inner.total < self.size {
                    inner.total += 1;
                    true
                } else if inner.total == 0 {
                    return Err(PoolError::Empty);
                } else {
                    false
                }
            };
            if !open {
                if tokio::time::timeout_at(deadline, notified).await.is_err() {
                    return Err(PoolError::Timeout);
                }
                continue;
            }
            // A slot is reserved: open a connection for it.
            let Some(o) = opener else { continue };
            return match Backend::open(&o).await {
                Ok(b) => Ok(b),
                Err(e) => {
                    tracing::warn!(error = %e, "pgwire: cannot open an origin connection");
                    self.discard();
                    Err(PoolError::Open)
                }
            };
        }
    }

    /// Returns a taken connection: at once, or once the cancels sent at it have landed (see
    /// [`CancelGate`](super::backend::CancelGate)); closed when one's fate is unknown.
    pub fn put(self: &Arc<Self>, b: Backend) {
        if b.cancels.clear() {
            self.push_idle(b);
            return;
        }
        let pool = Arc::clone(self);
        tokio::spawn(async move {
            let gate = Arc::clone(&b.cancels);
            if gate.settled().await {
                pool.push_idle(b);
            } else {
                tracing::debug!("pgwire: an origin connection with a cancel astray is closed");
                pool.discard();
                b.terminate().await;
            }
        });
    }

    fn push_idle(&self, b: Backend) {
        let mut inner = self.lock();
        let now = Instant::now();
        inner.last_used = now;
        inner.idle.push((b, now));
        drop(inner);
        self.notify.notify_one();
    }

    /// Takes out the idle connections idle since before `now - idle_timeout`, and drops the
    /// ones the origin closed; both leave the pool's count.
    pub fn sweep(&self, now: Instant, idle_timeout: Duration) -> Swept {
        let mut swept = Swept::default();
        let mut inner = self.lock();
        let mut kept = Vec::with_capacity(inner.idle.len());
        for (mut b, since) in std::mem::take(&mut inner.idle) {
            if b.unusable() {
                swept.dead += 1;
            } else if now.saturating_duration_since(since) >= idle_timeout {
                swept.expired.push(b);
            } else {
                kept.push((b, since));
            }
        }
        inner.idle = kept;
        inner.total = inner.total.saturating_sub(swept.dead + swept.expired.len());
        swept
    }

    /// Takes out every idle connection (the pool is being forgotten).
    pub fn drain(&self) -> Vec<Backend> {
        let mut inner = self.lock();
        let idle: Vec<Backend> = std::mem::take(&mut inner.idle)
            .into_iter()
            .map(|(b, _)| b)
            .collect();
        inner.total = inner.total.saturating_sub(idle.len());
        idle
    }

    /// When a connection of the pool was last taken or returned.
    pub fn last_used(&self) -> Instant {
        self.lock().last_used
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
