//! Bounds on what client connections may hold: connection counts per port and per source
//! address, reply memory per core, authentication and idle timeouts, failed AUTHs.
//!
//! ```text
//!  accept        per-port limit (per core: total / cores), per-source limit (shared table
//!                [`Sources`], both transports): over -> refusal written, connection closed
//!  each visit    Worker::recharge: the connection's buffer footprint moves the core's
//!                reply-memory figure; at the cap, connections with unwritten output are not
//!                read (back-pressure) and unauthenticated ones have a small budget anyway
//!  end of turn   Slots::poll_limits: over the cap, the connections holding the most unwritten
//!                output are closed (largest first) until the core is under 3/4 of its cap;
//!                every SWEEP_EVERY: timeouts (auth/startup, idle), shrinking drained buffers,
//!                and giving freed heap back to the kernel after a large release
//! ```
//!
//! Reply memory is counted per core (cores share nothing mutable; the total cap is split
//! evenly, like the connection limit) as each connection's buffer capacity beyond its two
//! initial buffers ([`super::conn::Conn::footprint`]): capacity, not length, because capacity
//! is what stays resident. An idle connection charges nothing (its base buffers are bounded by
//! the connection limit).
//!
//! Thread model: everything but [`Sources`] is owned by one core. [`Sources`] is a mutex-held
//! map touched only at accept and close of a connection whose source is counted (never on the
//! hit path); it is empty, and never locked, when no per-source limit is set.
//!
//! Every bound applies to both transports (the userspace one learns the peer's address from
//! its stack at accept). Limitations: timeouts are checked every [`SWEEP_EVERY`], so a
//! connection may outlive its timeout by that much.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::plane::CoreStats;

use super::conn::Conn;
use super::session::Worker;

/// Default total PostgreSQL-port connection limit (split evenly over cores).
pub const DEFAULT_MAX_PG_CONNECTIONS: usize = 10_000;
/// Default total reply memory of all connections (split evenly over cores).
pub const DEFAULT_MAX_REPLY_MEMORY: usize = 256 * 1024 * 1024;
/// Default time a RESP connection has to authenticate when a password is set.
pub const DEFAULT_AUTH_TIMEOUT_MS: u64 = 10_000;
/// Default time a PostgreSQL connection has to complete its startup and authentication.
pub const DEFAULT_PG_STARTUP_TIMEOUT_MS: u64 = 10_000;
/// Default wrong passwords on one RESP connection before it is closed.
pub const DEFAULT_MAX_AUTH_FAILURES: u32 = 10;
/// Reply bytes an unauthenticated RESP connection may have unwritten before reading pauses.
pub const UNAUTH_MAX_REPLY_BACKLOG: usize = 64 * 1024;
/// Largest request an unauthenticated RESP connection may send (a longer one is refused).
pub const UNAUTH_MAX_REQUEST_BYTES: usize = 16 * 1024;
/// How often a core checks timeouts and shrinks drained buffers.
pub const SWEEP_EVERY: Duration = Duration::from_millis(100);
/// Connection buffer bytes a core must have freed before it asks the allocator to give free
/// heap back to the kernel (and at most once per [`TRIM_EVERY`]).
const TRIM_AFTER_BYTES: usize = 32 * 1024 * 1024;
const TRIM_EVERY: Duration = Duration::from_secs(1);

/// Default `pgwire.max_session_statements`: named prepared statements one PostgreSQL session
/// may hold (Rails deallocates past 1,000, pgx past 512, JDBC past 256).
pub const DEFAULT_MAX_PG_STATEMENTS: usize = 2_000;
/// Default `pgwire.max_session_statement_bytes`: the Parse messages of one session's named
/// statements, in bytes.
pub const DEFAULT_MAX_PG_STATEMENT_BYTES: usize = 8 * 1024 * 1024;

/// Default `resp.tracking_table_max_keys` (Redis's `tracking-table-max-keys` default).
pub const DEFAULT_TRACKING_TABLE_MAX_KEYS: usize = 1_000_000;
/// Key text the tracking table holds per key on average before its byte bound evicts.
pub const TRACKING_BYTES_PER_KEY: usize = 128;

/// Connection limits and timeouts; `0` turns a limit or timeout off where noted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnLimits {
    /// PostgreSQL-port connections, total over cores (RESP ones: `EngineConfig::max_connections`).
    pub max_pg_connections: usize,
    /// RESP connections from one source address (0: no limit), on both transports.
    pub max_per_source: usize,
    /// PostgreSQL connections from one source address (0: no limit), on both transports.
    pub max_pg_per_source: usize,
    /// Total buffer memory of all connections beyond their initial buffers, split over cores.
    pub max_reply_memory: usize,
    /// A RESP connection not authenticated after this long is closed (0: never; only applies
    /// when a password is set).
    pub auth_timeout_ms: u64,
    /// A RESP connection that sent nothing for this long, with nothing in flight, is closed
    /// (0: never).
    pub idle_timeout_ms: u64,
    /// A PostgreSQL connection whose startup and authentication are not done after this long
    /// is closed with FATAL 57014 (0: never).
    pub pg_startup_timeout_ms: u64,
    /// A PostgreSQL session that sent nothing for this long, with nothing in flight, is closed
    /// with FATAL 57P05 (0: never).
    pub pg_idle_timeout_ms: u64,
    /// Wrong passwords on one RESP connection before it is closed (0: no limit).
    pub max_auth_failures: u32,
    /// Keys remembered for tracking clients (client-side caching), split over cores.
    pub tracking_table_max_keys: usize,
    /// Named prepared statements one PostgreSQL session may hold; a batch that would prepare
    /// more ends the session with FATAL 53400.
    pub max_pg_statements: usize,
    /// Bytes of Parse messages one PostgreSQL session's named statements may hold (as above).
    pub max_pg_statement_bytes: usize,
}

impl Default for ConnLimits {
    fn default() -> Self {
        ConnLimits {
            max_pg_connections: DEFAULT_MAX_PG_CONNECTIONS,
            max_per_source: 0,
            max_pg_per_source: 0,
            max_reply_memory: DEFAULT_MAX_REPLY_MEMORY,
            auth_timeout_ms: DEFAULT_AUTH_TIMEOUT_MS,
            idle_timeout_ms: 0,
            pg_startup_timeout_ms: DEFAULT_PG_STARTUP_TIMEOUT_MS,
            pg_idle_timeout_ms: 0,
            max_auth_failures: DEFAULT_MAX_AUTH_FAILURES,
            tracking_table_max_keys: DEFAULT_TRACKING_TABLE_MAX_KEYS,
            max_pg_statements: DEFAULT_MAX_PG_STATEMENTS,
            max_pg_statement_bytes: DEFAULT_MAX_PG_STATEMENT_BYTES,
        }
    }
}

/// Open connections per (port, source address), shared by the cores of one engine.
#[derive(Debug, Default)]
pub struct Sources {
    open: Mutex<HashMap<(bool, IpAddr), u32>>,
}

impl Sources {
    /// Counts a new connection from `ip` on the PostgreSQL (`pg`) or RESP port; false (and
    /// nothing counted) when that source already has `limit` open.
    pub fn try_open(&self, pg: bool, ip: IpAddr, limit: usize) -> bool {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let n = open.entry((pg, ip)).or_insert(0);
        if *n as usize >= limit {
            if *n == 0 {
                open.remove(&(pg, ip));
            }
            return false;
        }
        *n += 1;
        true
    }

    /// A connection counted by [`Sources::try_open`] closed.
    pub fn close(&self, pg: bool, ip: IpAddr) {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(&(pg, ip)) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&(pg, ip));
            }
        }
    }
}

/// What the sweep does with a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Expiry {
    /// Write the timeout's error, stop reading, close once written.
    Graceful(Timeout),
    /// Close now (a timed-out connection whose peer does not read its error).
    Now,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Timeout {
    Auth,
    Idle,
}

/// Per-core reply-memory accounting and the sweep's clocks.
#[derive(Debug)]
pub(crate) struct CoreLimits {
    /// Bytes charged by this core's connections.
    pub reply_memory: usize,
    /// This core's share of `max_reply_memory`.
    pub reply_memory_cap: usize,
    /// Bytes released (connections closed, buffers shrunk) since the heap was last trimmed.
    released: usize,
    last_trim: Instant,
    next_sweep: Instant,
}

impl CoreLimits {
    pub fn new(cap: usize, now: Instant) -> Self {
        CoreLimits {
            reply_memory: 0,
            reply_memory_cap: cap,
            released: 0,
            last_trim: now,
            next_sweep: now,
        }
    }

    /// The core is at its reply-memory cap: connections with unwritten output are not read.
    #[inline]
    pub fn full(&self) -> bool {
        self.reply_memory >= self.reply_memory_cap
    }

    /// Whether the sweep is due at `now` (and, if so, when the next one is).
    pub fn sweep_due(&mut self, now: Instant) -> bool {
        if now < self.next_sweep {
            return false;
        }
        self.next_sweep = now + SWEEP_EVERY;
        true
    }

    /// Counts bytes freed outside a connection's charge (base buffers the cache did not keep).
    pub fn note_released(&mut self, bytes: usize) {
        self.released += bytes;
    }

    /// Gives freed heap back to the kernel when enough was released and the last trim is old
    /// enough.
    pub fn maybe_trim(&mut self, now: Instant) {
        if self.released >= TRIM_AFTER_BYTES && now >= self.last_trim + TRIM_EVERY {
            self.released = 0;
            self.last_trim = now;
            pgline_hugepages::release_free_heap();
        }
    }
}

/// What a client over its source address's connection limit gets (RESP, PostgreSQL) before the
/// connection is closed.
pub(crate) const RESP_REJECT_SOURCE: &[u8] =
    b"-ERR max number of clients from this address reached\r\n";
pub(crate) const PG_REJECT_SOURCE: &[u8] =
    b"E\x00\x00\x00\x42SFATAL\x00VFATAL\x00C53300\x00Mtoo many connections from this address\x00\x00";

impl Worker {
    /// Counts a new connection from `ip` against the per-source limit of the RESP or PostgreSQL
    /// (`pg`) port: `Some(Some(ip))` when counted (release it with the connection:
    /// `Conn::source`), `Some(None)` when no limit is set, `None` (refused, counted in the
    /// core's stats) when the source is at its limit. Both transports call it at accept.
    pub(crate) fn admit_source(&self, pg: bool, ip: IpAddr) -> Option<Option<IpAddr>> {
        let limits = &self.cfg.conn_limits;
        let per_source = if pg {
            limits.max_pg_per_source
        } else {
            limits.max_per_source
        };
        if per_source == 0 {
            return Some(None);
        }
        if self.sources.try_open(pg, ip, per_source) {
            Some(Some(ip))
        } else {
            let stats = self.stats();
            CoreStats::add(&stats.connections_rejected, 1);
            CoreStats::add(&stats.connections_rejected_source, 1);
            None
        }
    }

    /// Brings `conn`'s charge to its current footprint and publishes the core's figure.
    #[inline]
    pub(crate) fn recharge(&mut self, conn: &mut Conn) {
        let now = conn.footprint();
        if now == conn.charged {
            return;
        }
        let l = &mut self.limits;
        if now > conn.charged {
            l.reply_memory += now - conn.charged;
        } else {
            let freed = conn.charged - now;
            l.reply_memory = l.reply_memory.saturating_sub(freed);
            l.released += freed;
        }
        conn.charged = now;
        self.stats().reply_memory_bytes.store(
            self.limits.reply_memory as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// `conn` is closing: its charge and its per-source count are released.
    pub(crate) fn release_conn(&mut self, conn: &mut Conn) {
        let charged = std::mem::take(&mut conn.charged);
        // Its base buffers go back to the core's cache (what the cache frees is counted by the
        // sweep).
        self.limits.released += charged;
        self.limits.reply_memory = self.limits.reply_memory.saturating_sub(charged);
        self.stats().reply_memory_bytes.store(
            self.limits.reply_memory as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
        if let Some(ip) = conn.source.take() {
            self.sources.close(conn.pg.is_some(), ip);
        }
    }

    /// Reply bytes `conn` may have unwritten before it is read no more.
    #[inline]
    pub(crate) fn reply_budget(&self, conn: &Conn) -> usize {
        if conn.pg.is_none() && !conn.session.authenticated {
            UNAUTH_MAX_REPLY_BACKLOG.min(self.cfg.max_reply_backlog)
        } else {
            self.cfg.max_reply_backlog
        }
    }

    /// Largest request `conn` may send now.
    #[inline]
    pub(crate) fn request_budget(&self, conn: &Conn) -> usize {
        if conn.pg.is_none() && !conn.session.authenticated {
            UNAUTH_MAX_REQUEST_BYTES.min(self.cfg.max_request_bytes)
        } else {
            self.cfg.max_request_bytes
        }
    }

    /// Whether `conn`'s output stops its input: its own budget is used up, or it has unwritten
    /// output while the core is at its reply-memory cap.
    #[inline]
    pub(crate) fn output_blocked(&self, conn: &Conn) -> bool {
        let backlog = conn.backlog();
        backlog >= self.reply_budget(conn) || (backlog > 0 && self.limits.full())
    }

    /// What the sweep at `now` does with `conn`, if anything.
    pub(crate) fn expiry(&self, conn: &Conn, now: Instant) -> Option<Expiry> {
        if conn.doomed {
            return Some(Expiry::Now);
        }
        if conn.closing {
            return None;
        }
        let c = &self.cfg.conn_limits;
        let pg = conn.pg.is_some();
        let (startup_ms, idle_ms) = if pg {
            (c.pg_startup_timeout_ms, c.pg_idle_timeout_ms)
        } else {
            (c.auth_timeout_ms, c.idle_timeout_ms)
        };
        let past = |since: Instant, ms: u64| {
            ms > 0 && now.saturating_duration_since(since) >= Duration::from_millis(ms)
        };
        if !conn.established() {
            return past(conn.opened_at, startup_ms).then_some(Expiry::Graceful(Timeout::Auth));
        }
        (conn.quiet() && past(conn.last_input, idle_ms)).then_some(Expiry::Graceful(Timeout::Idle))
    }

    /// Writes the timeout's error to `conn` and marks it closing (closed for good at the next
    /// sweep if its peer does not read).
    pub(crate) fn expire(&self, conn: &mut Conn, timeout: Timeout) {
        let stats = self.stats();
        match (timeout, conn.pg.is_some()) {
            (Timeout::Auth, false) => {
                CoreStats::add(&stats.connections_auth_timeout, 1);
                crate::resp::compose_error(
                    &mut conn.wbuf,
                    b"ERR authentication timeout: closing the connection",
                );
            }
            (Timeout::Auth, true) => {
                CoreStats::add(&stats.connections_auth_timeout, 1);
                compose_pg_fatal(conn, b"57014", b"canceling authentication due to timeout");
            }
            (Timeout::Idle, false) => CoreStats::add(&stats.connections_idle_timeout, 1),
            (Timeout::Idle, true) => {
                CoreStats::add(&stats.connections_idle_timeout, 1);
                compose_pg_fatal(
                    conn,
                    b"57P05",
                    b"terminating connection due to idle-session timeout",
                );
            }
        }
        conn.closing = true;
        conn.doomed = true;
        conn.rpos = conn.rbuf.len();
    }
}

fn compose_pg_fatal(conn: &mut Conn, code: &[u8; 5], message: &[u8]) {
    crate::pgwire::compose_error_response(
        &mut conn.wbuf,
        &crate::pgwire::ErrorFields::fatal(code, message),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_count_per_port_and_forget_closed_ones() {
        let s = Sources::default();
        let ip: IpAddr = "10.0.0.1".parse().expect("ip");
        assert!(s.try_open(false, ip, 2));
        assert!(s.try_open(false, ip, 2));
        assert!(!s.try_open(false, ip, 2), "the third from one source");
        assert!(s.try_open(true, ip, 2), "the other port counts apart");
        s.close(false, ip);
        assert!(s.try_open(false, ip, 2));
        s.close(false, ip);
        s.close(false, ip);
        s.close(true, ip);
        assert!(s.open.lock().expect("lock").is_empty());
    }
}
