//! Origin protection: what a client that never finishes logging in, or a pool nobody uses,
//! may cost the origin.
//!
//! Each client startup costs the origin a backend process from the moment the relay forwards
//! the StartupMessage (the origin forks, then waits for the password). So at most
//! `pgwire.max_pending_startups` origin connections are in authentication at once: a startup
//! takes a [`StartupSlot`] before its origin connection is opened, waiting up to
//! `pgwire.startup_wait_ms` for one, and is refused with `FATAL 53300` past that. The slot
//! travels with the origin connection (`Backend::admit`) and is given back when the connection
//! logs in (it joins its pool), fails or is dropped. It also carries the authentication
//! deadline (`pgwire.auth_timeout_ms` after the slot was taken): the relay's reads from a
//! connection in authentication end there, and a session waiting for its client's password
//! past it ends (`Session::next_request`), closing the origin connection.
//!
//! The counters here ([`OriginCounters`]) also count the pool trimming of `pool`/`mod`
//! (idle connections closed, dead ones found, pools forgotten or refused); `/metrics` shows
//! them (`pgline_pgwire_startup_*`, `_auth_timeout`, `_backend_*`, `_pool*`).
//!
//! Thread model: shared by every session task (a tokio semaphore and atomics).

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// The refusal a startup gets when no slot freed in time (SQLSTATE 53300).
pub const STARTUP_REFUSED: &str =
    "pgline: too many connections are authenticating at the origin (pgwire.max_pending_startups); try again later";
/// The refusal a startup gets when it would need one pool more than `pgwire.max_pools`.
pub const POOLS_FULL: &str =
    "pgline: too many backend pools in use (pgwire.max_pools: distinct users, databases and startup settings)";
/// What a client whose authentication ran out of time is told (SQLSTATE 08006).
pub const AUTH_TIMED_OUT: &str = "pgline: authentication timed out (pgwire.auth_timeout_ms)";

/// Events counted for `/metrics`.
#[derive(Debug, Default)]
pub struct OriginCounters {
    pub startup_refused: AtomicU64,
    pub auth_timeout: AtomicU64,
    pub backend_idle_closed: AtomicU64,
    pub backend_dead: AtomicU64,
    pub pool_forgotten: AtomicU64,
    pub pool_refused: AtomicU64,
    pub backend_steals: AtomicU64,
    pub backend_steals_unread: AtomicU64,
    pub origin_statements_closed: AtomicU64,
}

impl OriginCounters {
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }
}

/// A copy of the origin-protection figures.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OriginStats {
    /// Origin connections in authentication now (slots taken).
    pub startup_pending: u64,
    /// Startups refused because no slot freed within `startup_wait_ms`.
    pub startup_refused: u64,
    /// Authentications ended by `auth_timeout_ms`.
    pub auth_timeout: u64,
    /// Pooled connections closed after `pool_idle_timeout_ms` idle.
    pub backend_idle_closed: u64,
    /// Pooled connections found closed by the origin (or with unsolicited input) and dropped.
    pub backend_dead: u64,
    /// Backend pools now.
    pub pools: u64,
    /// Pools forgotten (no connection and no session left, or evicted for room).
    pub pool_forgotten: u64,
    /// Startups refused because `max_pools` pools were in use.
    pub pool_refused: u64,
    /// Batches that took another session's reserved connection and read its state first.
    pub backend_steals: u64,
    /// Of those, transaction starts that read it in their own round trip (in front of the
    /// batch) instead.
    pub backend_steals_unread: u64,
    /// Prepared statements closed on origin connections past `pgwire.max_origin_statements`.
    pub origin_statements_closed: u64,
}

/// The bound on origin connections in authentication.
pub struct Admission {
    slots: Arc<Semaphore>,
    max: usize,
    wait: Duration,
    timeout: Duration,
    pub counters: Arc<OriginCounters>,
}

/// One origin connection's right to be in authentication, until its deadline.
#[derive(Debug)]
pub struct StartupSlot {
    _permit: OwnedSemaphorePermit,
    pub deadline: Instant,
    counters: Arc<OriginCounters>,
}

impl StartupSlot {
    /// The deadline passed: counted, and the error the relay's read returns.
    pub fn expired(&self) -> io::Error {
        OriginCounters::add(&self.counters.auth_timeout, 1);
        io::Error::new(io::ErrorKind::TimedOut, AuthTimeout)
    }
}

/// The inner error of an authentication that ran out of time (see [`is_auth_timeout`]).
#[derive(Debug, thiserror::Error)]
#[error("{AUTH_TIMED_OUT}")]
pub struct AuthTimeout;

/// Whether `e` is the relay's own authentication deadline.
pub fn is_auth_timeout(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|i| i.is::<AuthTimeout>())
}

impl Admission {
    pub fn new(max: usize, wait: Duration, timeout: Duration) -> Admission {
        Admission {
            slots: Arc::new(Semaphore::new(max)),
            max,
            wait,
            timeout,
            counters: Arc::default(),
        }
    }

    /// A slot for one startup, waiting up to `startup_wait`; `None` (counted) when none freed.
    pub async fn admit(&self) -> Option<StartupSlot> {
        let slots = Arc::clone(&self.slots);
        let permit = match tokio::time::timeout(self.wait, slots.acquire_owned()).await {
            Ok(Ok(p)) => p,
            // The semaphore is never closed; a timeout is a refusal.
            _ => {
                OriginCounters::add(&self.counters.startup_refused, 1);
                return None;
            }
        };
        Some(StartupSlot {
            _permit: permit,
            deadline: Instant::now() + self.timeout,
            counters: Arc::clone(&self.counters),
        })
    }

    /// The figures of this module (`pools` is the caller's).
    pub fn stats(&self) -> OriginStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        OriginStats {
            startup_pending: self.max.saturating_sub(self.slots.available_permits()) as u64,
            startup_refused: get(&c.startup_refused),
            auth_timeout: get(&c.auth_timeout),
            backend_idle_closed: get(&c.backend_idle_closed),
            backend_dead: get(&c.backend_dead),
            pools: 0,
            pool_forgotten: get(&c.pool_forgotten),
            pool_refused: get(&c.pool_refused),
            backend_steals: get(&c.backend_steals),
            backend_steals_unread: get(&c.backend_steals_unread),
            origin_statements_closed: get(&c.origin_statements_closed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn startups_past_the_cap_wait_then_are_refused_and_slots_come_back() {
        let a = Admission::new(2, Duration::from_millis(100), Duration::from_secs(10));
        let s1 = a.admit().await.expect("slot 1");
        let _s2 = a.admit().await.expect("slot 2");
        assert_eq!(a.stats().startup_pending, 2);
        assert!(a.admit().await.is_none(), "the cap holds");
        assert_eq!(a.stats().startup_refused, 1);
        // A waiter gets the slot a login gives back.
        let waiter = a.admit();
        drop(s1);
        let s3 = waiter.await.expect("the freed slot");
        assert!(s3.deadline > Instant::now() + Duration::from_secs(5));
        let e = s3.expired();
        assert!(is_auth_timeout(&e));
        assert!(!is_auth_timeout(&io::Error::other("x")));
        assert_eq!(a.stats().auth_timeout, 1);
    }
}
