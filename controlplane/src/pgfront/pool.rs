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
//! Reserved connections: a connection whose session state after a batch was not read (the
//! relay reads it only after batches that ask for the fence, see `session`) may hold state that
//! batch left (a function that called `set_config`, a temporary table made by `EXECUTE`). It is
//! not idle: it stays reserved for that session ([`Pool::reserve`]), whose next batch takes it
//! back first ([`Taken::Own`]). Another session that finds no idle connection may take a
//! reserved one that is not known to hold state ([`Taken::Steal`]); it must then read its
//! state and use it only if it is the pool's login state, and otherwise hand it back marked
//! `dirty` (pinned to its owner: never stolen again). A session that ends takes its reserved
//! connection out ([`Pool::leave`]) and cleans it as a pinned one. Reserved connections count in
//! the pool's total like idle ones, and are not trimmed by idle time (they are their session's);
//! dead ones that hold no known state are dropped as idle ones are.
//!
//! Thread model: shared by the sessions of that (user, database); a std mutex guards the idle
//! and reserved lists (held for a push or pop, never across an await), a `Notify` wakes waiters.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::admit::OriginCounters;
use super::backend::{Backend, Opener, Sequences};

/// Idle connections a session's take looks through for the one it last used (a pool may hold
/// up to `pgwire.pool_size`, 10,000).
const OWN_SCAN: usize = 64;

/// The index in a non-empty idle list (oldest first) that a take by `owner` uses: the
/// connection whose sequence values are only `owner`'s, if it is among the most recent
/// [`OWN_SCAN`], else the most recent one.
fn idle_pick(
    idle: impl DoubleEndedIterator<Item = Sequences> + ExactSizeIterator,
    owner: u64,
) -> usize {
    let last = idle.len() - 1;
    idle.rev()
        .take(OWN_SCAN)
        .position(|s| s == Sequences::Of(owner))
        .map_or(last, |back| last - back)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    #[error("no origin connection left for this user and database")]
    Empty,
    #[error("no origin connection became free in time")]
    Timeout,
    #[error("cannot open an origin connection")]
    Open,
}

/// A connection reserved for the session that ran the last batch on it.
struct Reserved {
    owner: u64,
    b: Backend,
    /// Known to hold session state of its owner: only the owner takes it.
    dirty: bool,
}

/// How [`Pool::take_for`] found a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taken {
    /// Idle: in the pool's login state.
    Clean,
    /// The session's own reserved connection; `dirty`: it holds the session's state.
    Own { dirty: bool },
    /// Another session's reserved connection, state unknown: read it before use, and give it
    /// back with [`Pool::reserve`] (dirty) unless it is the login state.
    Steal { owner: u64 },
}

struct Inner {
    /// Idle connections and since when, the most recently used last.
    idle: Vec<(Backend, Instant)>,
    /// Reserved connections, the oldest first.
    reserved: Vec<Reserved>,
    /// Sessions of the pool that may hold a reservation (between [`Pool::enter`] and
    /// [`Pool::leave`]).
    live: HashSet<u64>,
    /// Owners whose reserved connection another session took to read its state
    /// ([`Taken::Steal`]): until it is settled ([`Pool::reserve`] or [`Pool::check_done`]),
    /// the owner waits for it rather than run on another connection without its state.
    checking: HashSet<u64>,
    total: usize,
    /// When a connection was last taken or returned (eviction picks the least recent).
    last_used: Instant,
    /// Backend statement names ([`super::plan::backend_name`]) some connection of this pool
    /// accepted a Parse of: at most [`KNOWN_STATEMENTS`], the first ones learnt.
    known: HashSet<String>,
}

/// Bound on [`Pool::learn`]'s statement names per pool.
pub const KNOWN_STATEMENTS: usize = 4096;

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
    /// Woken (all waiters) whenever a state read of a stolen connection is settled: the
    /// owners in `Inner::checking` wait on it, not on `notify`, whose single wake-ups are for
    /// sessions waiting for any connection.
    settled: Notify,
    /// Set when pgline holds this pool's password (the user of `origin.url`): the pool then
    /// also grows on demand, and refills after its connections died.
    opener: Mutex<Option<Arc<Opener>>>,
    counters: Arc<OriginCounters>,
}

/// What one look at the pool found (`Pool::try_take`). Returned once per take and never
/// kept, so the connection is moved in it rather than boxed.
#[allow(clippy::large_enum_variant)]
enum Step {
    Got(Backend, Taken),
    /// A slot was reserved for a new connection.
    Open,
    /// The session's own connection is out for a state read.
    Settling,
    /// Nothing free.
    Wait,
}

impl Pool {
    pub fn new(size: usize, counters: Arc<OriginCounters>) -> Pool {
        Pool {
            counters,
            size,
            inner: Mutex::new(Inner {
                idle: Vec::new(),
                reserved: Vec::new(),
                live: HashSet::new(),
                checking: HashSet::new(),
                total: 0,
                last_used: Instant::now(),
                known: HashSet::new(),
            }),
            notify: Notify::new(),
            settled: Notify::new(),
            opener: Mutex::new(None),
        }
    }

    /// The relay's origin counters this pool adds to.
    pub fn counters(&self) -> &OriginCounters {
        &self.counters
    }

    /// Notes that a connection of this pool accepted a Parse of backend statement `name`.
    pub fn learn(&self, name: &str) {
        let mut inner = self.lock();
        if inner.known.len() < KNOWN_STATEMENTS && !inner.known.contains(name) {
            inner.known.insert(name.to_owned());
        }
    }

    /// Whether a connection of this pool has accepted a Parse of backend statement `name`.
    pub fn knows(&self, name: &str) -> bool {
        self.lock().known.contains(name)
    }

    /// Lets the pool open connections itself (kept: the first opener set wins).
    pub fn set_opener(&self, o: Opener) {
        let mut slot = self.opener.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(Arc::new(o));
        }
    }

    /// Shared, not copied: it is asked for on every take (its settings hold the origin's
    /// whole configuration).
    fn opener(&self) -> Option<Arc<Opener>> {
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

    /// A session of the pool begins: it may reserve connections from now on.
    pub fn enter(&self, owner: u64) {
        self.lock().live.insert(owner);
    }

    /// A session ends: it reserves nothing any more; its reserved connection, if any, and
    /// whether it is known to hold its state, for the session to clean.
    pub fn leave(&self, owner: u64) -> Option<(Backend, bool)> {
        let mut inner = self.lock();
        inner.live.remove(&owner);
        let i = inner.reserved.iter().position(|r| r.owner == owner)?;
        let r = inner.reserved.remove(i);
        Some((r.b, r.dirty))
    }

    /// Keeps a taken connection for `owner` (see the module doc); handed back (`Some`) when
    /// the owner has left (the caller cleans or closes it).
    #[must_use]
    pub fn reserve(&self, owner: u64, b: Backend, dirty: bool) -> Option<Backend> {
        let mut inner = self.lock();
        // Its owner, if it waits for it, finds it now (see `take_for`).
        let checked = inner.checking.remove(&owner);
        if !inner.live.contains(&owner) {
            return Some(b);
        }
        inner.last_used = Instant::now();
        inner.reserved.push(Reserved { owner, b, dirty });
        drop(inner);
        if checked {
            self.settled.notify_waiters();
        }
        if !dirty {
            // A waiter may take it (after reading its state).
            self.notify.notify_one();
        }
        None
    }

    /// Takes a connection for session `owner`, waiting until `deadline` for one: its own
    /// reserved one, else an idle one (the one it last used if that holds only its sequence
    /// values, else the most recently used), else another session's reserved one not known to
    /// hold state. Idle connections (and reserved ones holding no known state)
    /// the origin closed are dropped on the way (`dead` counts them).
    pub async fn take_for(
        &self,
        owner: u64,
        deadline: Instant,
    ) -> Result<(Backend, Taken), PoolError> {
        // Most takes find a connection at once, and register no waiter for it (each
        // registration locks the `Notify`'s list twice).
        let mut first = true;
        loop {
            let (notified, settled) = (self.notify.notified(), self.settled.notified());
            tokio::pin!(notified);
            tokio::pin!(settled);
            if !first {
                // Enabled before the pool is looked at again, so no wake-up is missed.
                notified.as_mut().enable();
                settled.as_mut().enable();
            }
            let opener = self.opener();
            let step = self.try_take(owner, opener.is_some())?;
            match step {
                Step::Got(b, taken) => return Ok((b, taken)),
                Step::Open => {
                    // A slot is reserved: open a connection for it.
                    let Some(o) = opener else { continue };
                    return match Backend::open(&o).await {
                        Ok(b) => Ok((b, Taken::Clean)),
                        Err(e) => {
                            tracing::warn!(error = %e, "pgwire: cannot open an origin connection");
                            self.discard();
                            Err(PoolError::Open)
                        }
                    };
                }
                _ if first => first = false,
                Step::Settling => {
                    // Woken by `settled` once the read is over (`reserve` or `check_done`),
                    // not by `notify`: a wake-up meant for another waiter must not be spent on
                    // this one (`notified` is dropped at the end of this turn of the loop,
                    // which hands on a wake-up it received).
                    if tokio::time::timeout_at(deadline, settled).await.is_err() {
                        return Err(PoolError::Timeout);
                    }
                }
                Step::Wait => {
                    if tokio::time::timeout_at(deadline, notified).await.is_err() {
                        return Err(PoolError::Timeout);
                    }
                }
            }
        }
    }

    /// One look at the pool for `take_for`: its own reserved connection, an idle one, another
    /// session's reserved one not known to hold state, or a slot to open one in (`may_open`).
    fn try_take(&self, owner: u64, may_open: bool) -> Result<Step, PoolError> {
        let mut inner = self.lock();
        if let Some(i) = inner.reserved.iter().position(|r| r.owner == owner) {
            let mut r = inner.reserved.remove(i);
            if r.dirty || !r.b.unusable() {
                inner.last_used = Instant::now();
                return Ok(Step::Got(r.b, Taken::Own { dirty: r.dirty }));
            }
            self.dead(&mut inner);
        }
        // While its own connection is out for a state read, a session takes no other: that
        // one would lack its state. It waits for it to come back.
        if inner.checking.contains(&owner) {
            return Ok(Step::Settling);
        }
        // The idle connection this session last used first, if it holds only this session's
        // sequence values (it needs no `DISCARD SEQUENCES`) and is among the most recent
        // `OWN_SCAN` (the scan runs under the pool's lock); else the most recent one.
        while !inner.idle.is_empty() {
            let i = idle_pick(inner.idle.iter().map(|(b, _)| b.sequences), owner);
            let (mut b, _) = inner.idle.remove(i);
            if !b.unusable() {
                inner.last_used = Instant::now();
                return Ok(Step::Got(b, Taken::Clean));
            }
            self.dead(&mut inner);
        }
        while let Some(i) = inner.reserved.iter().position(|r| !r.dirty) {
            let mut r = inner.reserved.remove(i);
            if !r.b.unusable() {
                inner.last_used = Instant::now();
                inner.checking.insert(r.owner);
                OriginCounters::add(&self.counters.backend_steals, 1);
                return Ok(Step::Got(r.b, Taken::Steal { owner: r.owner }));
            }
            self.dead(&mut inner);
        }
        if may_open && inner.total < self.size {
            inner.total += 1;
            Ok(Step::Open)
        } else if inner.total == 0 {
            Err(PoolError::Empty)
        } else {
            Ok(Step::Wait)
        }
    }

    /// A stolen connection was found in the login state (the stealer keeps it) or broken: its
    /// owner no longer waits for it.
    pub fn check_done(&self, owner: u64) {
        if self.lock().checking.remove(&owner) {
            self.settled.notify_waiters();
        }
    }

    /// An idle (or reserved, state unknown) connection was found closed by the origin.
    fn dead(&self, inner: &mut Inner) {
        inner.total = inner.total.saturating_sub(1);
        OriginCounters::add(&self.counters.backend_dead, 1);
        tracing::debug!("pgwire: an idle origin connection was closed by the origin");
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
        // A reserved connection holding no known state that the origin closed goes too (its
        // owner's next batch takes another); one holding state stays for its owner to find.
        let mut reserved = Vec::with_capacity(inner.reserved.len());
        for mut r in std::mem::take(&mut inner.reserved) {
            if !r.dirty && r.b.unusable() {
                swept.dead += 1;
            } else {
                reserved.push(r);
            }
        }
        inner.reserved = reserved;
        inner.total = inner.total.saturating_sub(swept.dead + swept.expired.len());
        swept
    }

    /// Takes out every idle connection (the pool is being forgotten).
    pub fn drain(&self) -> Vec<Backend> {
        let mut inner = self.lock();
        let mut idle: Vec<Backend> = std::mem::take(&mut inner.idle)
            .into_iter()
            .map(|(b, _)| b)
            .collect();
        // No session holds a pool being forgotten, so none is reserved; for completeness.
        idle.extend(std::mem::take(&mut inner.reserved).into_iter().map(|r| r.b));
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

    /// Reserved connections.
    pub fn reserved(&self) -> usize {
        self.lock().reserved.len()
    }

    /// (idle, total).
    pub fn counts(&self) -> (usize, usize) {
        let inner = self.lock();
        (inner.idle.len(), inner.total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A take looks at most [`OWN_SCAN`] idle connections deep for the session's own (the scan
    /// runs under the pool's lock, and a pool may hold 10,000): deeper, it takes the most
    /// recent, whose sequence values the relay then discards.
    #[test]
    fn a_take_looks_for_its_own_connection_only_among_the_most_recent() {
        let n = OWN_SCAN + 10;
        let idle = |own_at: usize| -> Vec<Sequences> {
            (0..n)
                .map(|i| match i {
                    _ if i == own_at => Sequences::Of(7),
                    _ if i % 2 == 0 => Sequences::Of(8),
                    _ => Sequences::Clean,
                })
                .collect()
        };
        // The deepest one still looked at: `OWN_SCAN` from the end.
        let deepest = n - OWN_SCAN;
        assert_eq!(idle_pick(idle(deepest).into_iter(), 7), deepest);
        assert_eq!(idle_pick(idle(n - 1).into_iter(), 7), n - 1);
        // One deeper is not: the most recent is taken.
        assert_eq!(idle_pick(idle(deepest - 1).into_iter(), 7), n - 1);
        // No connection of its own: the most recent.
        assert_eq!(idle_pick(idle(deepest).into_iter(), 9), n - 1);
        assert_eq!(idle_pick([Sequences::Mixed].into_iter(), 7), 0);
    }
}
