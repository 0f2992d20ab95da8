//! The per-core counters the control plane reads (plain relaxed atomics, one writer each) and
//! the replication gauge the cores read.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Per-core counters, written only by their core with relaxed stores, read by anyone.
#[derive(Debug, Default)]
pub struct CoreStats {
    pub connections_accepted: AtomicU64,
    pub connections_rejected: AtomicU64,
    pub connections_closed: AtomicU64,
    pub connections_open: AtomicU64,
    /// RESP commands executed.
    pub resp_commands: AtomicU64,
    /// PostgreSQL steps handled: a startup, an authentication exchange, or a batch of frontend
    /// messages up to its Sync (or a simple Query), served or forwarded.
    pub pg_steps: AtomicU64,
    pub keys_hit: AtomicU64,
    pub keys_negative_hit: AtomicU64,
    pub keys_miss: AtomicU64,
    pub keys_unknown_table: AtomicU64,
    pub keys_bypass: AtomicU64,
    pub protocol_errors: AtomicU64,
    /// RESP requests answered `-BUSY` because the core's miss queue was full.
    pub resp_queue_full: AtomicU64,
    /// Client-tracking invalidation messages sent to connections (issue 18).
    pub tracking_invalidations: AtomicU64,
    /// Times the core's invalidation queue overflowed (each a null invalidation).
    pub tracking_overflows: AtomicU64,
    /// Gauge: (key, client) pairs in the core's tracking table.
    pub tracking_keys: AtomicU64,
    /// Keys the tracking table invalidated because it was full.
    pub tracking_evicted: AtomicU64,
    /// Gauge: connections of the core with tracking on.
    pub tracking_clients: AtomicU64,
    /// PostgreSQL requests a full queue to the control plane refused: the step waits for a
    /// later turn (nothing is lost), or a point lookup's background fill is skipped.
    pub pg_queue_full: AtomicU64,
    /// PostgreSQL point lookups that missed the store and were answered from their fill (one
    /// origin read, no forwarded statement).
    pub pg_lookup_filled: AtomicU64,
    /// PostgreSQL point lookups that missed the store and whose fill could not answer them
    /// (origin error, a read not known current, a timeout, not servable now): forwarded.
    pub pg_lookup_fill_forwarded: AtomicU64,
    /// Keys of PostgreSQL lookups' misses read by the core's own fill connection (the relay
    /// hosted on the core) instead of the writer's.
    pub pg_core_fills: AtomicU64,
    /// Keys read again on the core because their first read was not known current.
    pub pg_core_fill_rereads: AtomicU64,
    /// Fill statements the core ran for them (keys per statement: `pg_core_fills` / this).
    pub pg_core_fill_statements: AtomicU64,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    pub polls: AtomicU64,
    /// Service time of the turns that executed requests, one observation per request.
    pub service_time: LatencyHistogram,
    /// Userspace transport only: the core's stack counters, published every few hundred turns.
    pub net_rx_frames: AtomicU64,
    pub net_tx_frames: AtomicU64,
    pub net_rx_dropped: AtomicU64,
    pub net_tx_dropped: AtomicU64,
    pub net_tcp_retransmits: AtomicU64,
    pub net_tcp_buffer_waits: AtomicU64,
    pub net_tcp_send_stall_aborts: AtomicU64,
    /// Connection bounds (`engine::limits`): PostgreSQL-port connections open (gauge; the
    /// RESP ones are `connections_open` minus these).
    pub connections_open_pg: AtomicU64,
    /// Refused because their source address had its limit open (also in `connections_rejected`).
    pub connections_rejected_source: AtomicU64,
    /// Closed: not authenticated (RESP) or startup not done (PostgreSQL) in time.
    pub connections_auth_timeout: AtomicU64,
    /// Closed: idle past the idle timeout.
    pub connections_idle_timeout: AtomicU64,
    /// Closed: the core was at its reply-memory cap and they held the most unwritten output.
    pub connections_evicted: AtomicU64,
    /// Closed: too many wrong passwords.
    pub connections_auth_failures: AtomicU64,
    /// Wrong passwords (AUTH, HELLO ... AUTH) over RESP.
    pub auth_failures: AtomicU64,
    /// Buffer bytes the core's connections hold beyond their initial buffers (gauge).
    pub reply_memory_bytes: AtomicU64,
    /// TLS handshakes completed on the fronts (PostgreSQL after SSLRequest, RESP TLS listener).
    pub tls_handshakes: AtomicU64,
    /// TLS handshakes that failed (bad ClientHello, no common cipher, client certificate
    /// refused, ...); the connection was closed.
    pub tls_handshake_failures: AtomicU64,
}

impl CoreStats {
    /// Requests executed, both protocols (the unit of [`CoreStats::service_time`]).
    #[inline]
    pub fn executed(&self) -> u64 {
        let resp = self.resp_commands.load(Ordering::Relaxed);
        resp.wrapping_add(self.pg_steps.load(Ordering::Relaxed))
    }

    /// Adds `n` to a counter owned by this core (single writer: load + store, no RMW).
    #[inline]
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.store(
            counter.load(Ordering::Relaxed).wrapping_add(n),
            Ordering::Relaxed,
        );
    }
}

/// Upper bounds of the [`LatencyHistogram`] buckets, in nanoseconds (1-2-5 steps, 1 us to
/// 100 ms); a last, implicit bucket takes everything slower.
pub const LATENCY_BOUNDS_NS: [u64; 16] = [
    1_000,
    2_000,
    5_000,
    10_000,
    20_000,
    50_000,
    100_000,
    200_000,
    500_000,
    1_000_000,
    2_000_000,
    5_000_000,
    10_000_000,
    20_000_000,
    50_000_000,
    100_000_000,
];

/// A fixed-bucket latency histogram of plain atomics, written by one core only.
///
/// Recording is a few comparisons plus relaxed load/store pairs (no read-modify-write, no
/// allocation). Readers see each bucket atomically but not all buckets at one instant: a scrape
/// may see `sum_ns` one observation ahead of or behind the buckets, which Prometheus tolerates.
#[derive(Debug, Default)]
pub struct LatencyHistogram {
    /// Per-bucket (not cumulative) counts; index `i` counts observations `<= LATENCY_BOUNDS_NS[i]`
    /// and above the previous bound; the last index counts the rest.
    pub buckets: [AtomicU64; LATENCY_BOUNDS_NS.len() + 1],
    /// Sum of all observations, in nanoseconds.
    pub sum_ns: AtomicU64,
}

impl LatencyHistogram {
    /// Records `n` observations of `ns` nanoseconds each. Single writer only.
    #[inline]
    pub fn record(&self, ns: u64, n: u64) {
        let i = LATENCY_BOUNDS_NS
            .iter()
            .position(|&b| ns <= b)
            .unwrap_or(LATENCY_BOUNDS_NS.len());
        CoreStats::add(&self.buckets[i], n);
        CoreStats::add(&self.sum_ns, ns.saturating_mul(n));
    }

    /// A copy of the per-bucket counts and the sum.
    pub fn snapshot(&self) -> ([u64; LATENCY_BOUNDS_NS.len() + 1], u64) {
        let mut out = [0u64; LATENCY_BOUNDS_NS.len() + 1];
        for (o, b) in out.iter_mut().zip(self.buckets.iter()) {
            *o = b.load(Ordering::Relaxed);
        }
        (out, self.sum_ns.load(Ordering::Relaxed))
    }
}

/// What the control plane tells the cores (and `INFO`) about replication. Written by the control
/// side only ([`super::ControlPort::publish_replication`]).
#[derive(Debug, Default)]
pub struct ReplicationGauge {
    streaming: AtomicBool,
    applied_lsn: AtomicU64,
    lag_bytes: AtomicU64,
    lag_ms: AtomicU64,
}

/// One publication of the [`ReplicationGauge`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Replication {
    pub streaming: bool,
    /// The LSN up to which WAL changes are applied to the store.
    pub applied_lsn: u64,
    pub lag_bytes: u64,
    pub lag_ms: u64,
}

impl ReplicationGauge {
    pub fn streaming(&self) -> bool {
        self.streaming.load(Ordering::Acquire)
    }

    pub fn applied_lsn(&self) -> u64 {
        self.applied_lsn.load(Ordering::Acquire)
    }

    pub fn lag_bytes(&self) -> u64 {
        self.lag_bytes.load(Ordering::Acquire)
    }

    pub fn lag_ms(&self) -> u64 {
        self.lag_ms.load(Ordering::Acquire)
    }

    pub(super) fn publish(&self, r: Replication) {
        self.streaming.store(r.streaming, Ordering::Release);
        self.applied_lsn.store(r.applied_lsn, Ordering::Release);
        self.lag_bytes.store(r.lag_bytes, Ordering::Release);
        self.lag_ms.store(r.lag_ms, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_by_upper_bound() {
        let h = LatencyHistogram::default();
        h.record(0, 1);
        h.record(1_000, 2); // on the bound: that bucket
        h.record(1_001, 1);
        h.record(100_000_001, 3); // past the last bound
        let (b, sum) = h.snapshot();
        assert_eq!(b[0], 3);
        assert_eq!(b[1], 1);
        assert_eq!(b[LATENCY_BOUNDS_NS.len()], 3);
        assert_eq!(b.iter().sum::<u64>(), 7);
        assert_eq!(sum, 2_000 + 1_001 + 300_000_003);
    }
}
