//! Prometheus metrics: [`render`] turns a [`MetricsSnapshot`] into the OpenMetrics text format
//! that `GET /metrics` serves (Prometheus scrapes it as is).
//!
//! Design: the counters already live where they are counted (the dataplane's per-core
//! [`CoreStats`], the WAL consumer's [`ReplicationState`], the store's [`StoreStats`], the origin
//! pool's status), as plain atomics written by one owner each. Mirroring them into
//! `prometheus-client` `Counter`s would be a second copy to keep in sync, so each scrape copies
//! the snapshot into one owned [`Collector`] registered in a fresh `Registry` and lets
//! `prometheus-client` encode it (names, HELP/TYPE lines, escaping, histogram layout, `# EOF`).
//! A scrape costs a few hundred relaxed loads and one string; nothing here touches the hit path.
//! The PostgreSQL front's families come from the relay's own counts (sessions, pools, the sums
//! of its per-statement statistics), copied by the caller into a [`PgwireSnapshot`]. With
//! `nic.mode = "dpdk"` the `pgline_nic_*` families carry the DPDK port's device counters
//! (`rte_eth_stats_get`, read at scrape time through the [`NicCounters`] handles the node was
//! given when the port opened); in the other modes they are absent.
//!
//! Names are `pgline_<layer>_<object>[_<event>]` in base units (bytes, seconds); counters get
//! the `_total` suffix from the encoder. Per-core families carry a `core` label. The full list
//! with meanings is in `docs/operations.md`.
//!
//! Thread model: [`render`] runs on whatever task handles the scrape; it only reads atomics.
//! Limitations: values are read one by one, not as one atomic snapshot; a counter read a moment
//! after another may be slightly ahead of it (e.g. hits + misses vs commands). Each value on its
//! own is monotone for counters.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use pgline_dataplane::plane::{CoreStats, Shared, LATENCY_BOUNDS_NS};
use pgline_dataplane::store::StoreStats;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::wal::ReplicationState;

/// How often [`run_auth_log`] may write its line.
pub const AUTH_LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Logs wrong RESP passwords at a bounded rate: at most one WARN line per [`AUTH_LOG_EVERY`],
/// with the count since the last line and the connections closed for them (the cores only
/// count; they never log). Ends when `shutdown` changes.
pub async fn run_auth_log(
    shared: std::sync::Arc<Shared>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(AUTH_LOG_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let totals = |s: &Shared| {
        (
            s.total(|c| &c.auth_failures),
            s.total(|c| &c.connections_auth_failures),
        )
    };
    let mut last = totals(&shared);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        let now = totals(&shared);
        if now.0 != last.0 {
            tracing::warn!(
                failures = now.0.wrapping_sub(last.0),
                connections_closed = now.1.wrapping_sub(last.1),
                total = now.0,
                "RESP: wrong passwords since the last report (pgline_resp_auth_failures_total)"
            );
        }
        last = now;
    }
}

/// The `Content-Type` of [`render`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What a scrape reads: borrowed live state plus values copied by their owners.
pub struct MetricsSnapshot<'a> {
    pub shared: &'a Shared,
    pub repl: &'a ReplicationState,
    pub store: StoreStats,
    pub pool: deadpool_postgres::Status,
    /// Current time in microseconds since the Unix epoch (for the lag in seconds).
    pub now_us: i64,
    /// The HTTP API's access-control refusals (counted by `api::auth`, copied by the caller).
    pub api_refusals: ApiRefusals,
}

/// API calls refused by access control, by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ApiRefusals {
    pub missing_token: u64,
    pub wrong_token: u64,
    pub no_token_configured: u64,
}

/// The PostgreSQL front's figures, copied from the relay (`pgfront::RelayState`) by the caller;
/// `Default` when the front is off (its families are then all zero).
#[derive(Debug, Clone, Default)]
pub struct PgwireSnapshot {
    /// Sessions the relay holds (authenticating or open).
    pub sessions: u64,
    /// Backend pools the caller can name: the relay lists pools by (user, database) only on
    /// request, so this is the pool of `origin.url`'s user and database.
    pub pools: Vec<PgPoolSnapshot>,
    /// Sums over the relay's per-statement statistics (every forwarded batch counts once).
    pub batches: u64,
    pub batch_errors: u64,
    pub reply_bytes: u64,
    pub origin_us: u64,
    /// The relay's origin protection (startups in authentication, pool trimming).
    pub origin: crate::pgfront::OriginStats,
}

/// One backend pool: origin connections of a (user, database).
#[derive(Debug, Clone, Default)]
pub struct PgPoolSnapshot {
    pub user: String,
    pub database: String,
    pub idle: u64,
    /// Kept for the session that ran the last batch on them, state not read (see
    /// `pgfront::pool`): other sessions take them after a state read.
    pub reserved: u64,
    /// Open connections: idle, reserved, running a batch, or pinned to a session.
    pub total: u64,
}

/// Renders every pgline metric in the OpenMetrics text format (ends with `# EOF`), the
/// PostgreSQL front's families as zero (see [`render_with_pgwire`]).
pub fn render(src: &MetricsSnapshot) -> String {
    render_with_pgwire(src, &PgwireSnapshot::default())
}

/// One DPDK port's device counters (`rte_eth_stats`), labelled by its device name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NicPortSnapshot {
    pub port: String,
    pub ipackets: u64,
    pub opackets: u64,
    pub ibytes: u64,
    pub obytes: u64,
    pub imissed: u64,
    pub ierrors: u64,
    pub oerrors: u64,
    pub rx_nombuf: u64,
    /// Per queue pair (the first 16), where the driver keeps them:
    /// `[ipackets, opackets, ibytes, obytes, errors]`.
    pub queues: Vec<[u64; 5]>,
    /// Link state `(up, speed in Mbit/s)`, when the driver answers.
    pub link: Option<(bool, u32)>,
}

/// Where a scrape reads one NIC port's device counters (the DPDK port's handle, see
/// `crate::dpdk_port::PortCounters`); `None` when the port is gone or its driver fails the read.
pub trait NicCounters: Send + Sync {
    fn snapshot(&self) -> Option<NicPortSnapshot>;
}

/// [`render`] with the PostgreSQL front's figures.
pub fn render_with_pgwire(src: &MetricsSnapshot, pg: &PgwireSnapshot) -> String {
    render_all(src, pg, Vec::new())
}

/// [`render_with_pgwire`] with given DPDK port counters instead of the live ports'.
pub fn render_all(src: &MetricsSnapshot, pg: &PgwireSnapshot, nic: Vec<NicPortSnapshot>) -> String {
    let mut registry = Registry::default();
    let mut sample = Sample::take(src);
    sample.pgwire = pg.clone();
    sample.nic = nic;
    registry.register_collector(Box::new(sample));
    let mut out = String::with_capacity(16 * 1024);
    // Writing into a String cannot fail; an encoder error would only come from our own values.
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &registry) {
        let _ = writeln!(out, "# pgline: encoding failed: {e}");
    }
    out
}

/// Per-core counters: (metric name without `_total`, help, field).
type CoreField = fn(&CoreStats) -> &AtomicU64;
const CORE_COUNTERS: &[(&str, &str, CoreField)] = &[
    (
        "pgline_core_resp_commands",
        "RESP commands executed by the core.",
        |s| &s.resp_commands,
    ),
    (
        "pgline_core_pg_steps",
        "PostgreSQL steps handled by the core: a startup, an authentication exchange, or a batch up to its Sync (or a simple Query), served or forwarded.",
        |s| &s.pg_steps,
    ),
    (
        "pgline_core_keys_hit",
        "Keys answered from the store with a row.",
        |s| &s.keys_hit,
    ),
    (
        "pgline_core_keys_negative_hit",
        "Keys answered from the store with a cached 'no such row'.",
        |s| &s.keys_negative_hit,
    ),
    (
        "pgline_core_keys_miss",
        "Keys not in the store, sent to the control plane for a fill.",
        |s| &s.keys_miss,
    ),
    (
        "pgline_core_keys_bypass",
        "Keys read from the origin without the store because hits were not allowed (lag, stream down).",
        |s| &s.keys_bypass,
    ),
    (
        "pgline_core_keys_unknown_table",
        "Keys whose prefix names no cached table.",
        |s| &s.keys_unknown_table,
    ),
    (
        "pgline_core_connections_accepted",
        "Client connections accepted.",
        |s| &s.connections_accepted,
    ),
    (
        "pgline_core_connections_rejected",
        "Client connections refused over a port's limit (resp.max_connections, pgwire.max_sessions) or a source's.",
        |s| &s.connections_rejected,
    ),
    (
        "pgline_core_connections_closed",
        "Client connections closed.",
        |s| &s.connections_closed,
    ),
    (
        "pgline_core_bytes_in",
        "Bytes read from clients.",
        |s| &s.bytes_in,
    ),
    (
        "pgline_core_bytes_out",
        "Bytes written to clients.",
        |s| &s.bytes_out,
    ),
    (
        "pgline_core_protocol_errors",
        "Malformed or oversized requests (each closes its connection).",
        |s| &s.protocol_errors,
    ),
    (
        "pgline_core_resp_queue_full",
        "RESP requests answered BUSY because the core's miss queue was full.",
        |s| &s.resp_queue_full,
    ),
    (
        "pgline_core_pg_queue_full",
        "PostgreSQL requests a full queue to the control plane refused: the step waits for a later turn (nothing is lost), or a point lookup's miss is forwarded without a fill.",
        |s| &s.pg_queue_full,
    ),
    (
        "pgline_core_pg_lookup_filled",
        "PostgreSQL point lookups that missed the store and were answered from their fill: one origin read, nothing forwarded.",
        |s| &s.pg_lookup_filled,
    ),
    (
        "pgline_core_pg_lookup_fill_forwarded",
        "PostgreSQL point lookups that missed the store and whose fill could not answer them (origin error, a read not known current, a timeout, not servable any more): forwarded to the origin.",
        |s| &s.pg_lookup_fill_forwarded,
    ),
    (
        "pgline_core_pg_core_fills",
        "Keys of PostgreSQL point lookups' misses read by the core's own fill connection (kernel transport) rather than the store writer's.",
        |s| &s.pg_core_fills,
    ),
    (
        "pgline_core_pg_core_fill_rereads",
        "Keys of PostgreSQL point lookups' misses read again on the core because the first read's snapshot missed a transaction pgline had applied (counted in pg_core_fills too).",
        |s| &s.pg_core_fill_rereads,
    ),
    (
        "pgline_core_pg_core_fill_statements",
        "Fill statements the core ran for those misses; pg_core_fills divided by this is the keys each statement carried.",
        |s| &s.pg_core_fill_statements,
    ),
    (
        "pgline_core_polls",
        "Turns of the core's poll loop.",
        |s| &s.polls,
    ),
    (
        "pgline_core_connections_rejected_source",
        "Client connections refused because their source address had its limit open (resp/pgwire.max_connections_per_source; also counted in connections_rejected).",
        |s| &s.connections_rejected_source,
    ),
    (
        "pgline_core_connections_auth_timeout",
        "Client connections closed because they did not authenticate (RESP) or finish their startup (PostgreSQL) in time.",
        |s| &s.connections_auth_timeout,
    ),
    (
        "pgline_core_connections_idle_timeout",
        "Client connections closed after resp/pgwire.idle_timeout_ms without input.",
        |s| &s.connections_idle_timeout,
    ),
    (
        "pgline_core_connections_evicted",
        "Client connections closed because the core was at its share of resp.max_reply_memory and they held the most unwritten output.",
        |s| &s.connections_evicted,
    ),
    (
        "pgline_core_connections_auth_failures",
        "RESP connections closed after resp.max_auth_failures wrong passwords.",
        |s| &s.connections_auth_failures,
    ),
    (
        "pgline_core_tls_handshakes",
        "TLS handshakes completed on the fronts (PostgreSQL after SSLRequest, the RESP TLS listener).",
        |s| &s.tls_handshakes,
    ),
    (
        "pgline_core_tls_handshake_failures",
        "TLS handshakes that failed on the fronts (bad ClientHello, no common cipher, client certificate refused); the connection was closed.",
        |s| &s.tls_handshake_failures,
    ),
    (
        "pgline_resp_auth_failures",
        "Wrong passwords given over RESP (AUTH, HELLO ... AUTH).",
        |s| &s.auth_failures,
    ),
    (
        "pgline_core_tracking_invalidations",
        "Client-tracking invalidation messages sent to connections (RESP3 pushes, RESP2 __redis__:invalidate messages).",
        |s| &s.tracking_invalidations,
    ),
    (
        "pgline_core_tracking_evicted_keys",
        "Keys the core's tracking table invalidated because it was full (resp.tracking_table_max_keys).",
        |s| &s.tracking_evicted,
    ),
    (
        "pgline_core_tracking_queue_overflows",
        "Times the core's invalidation queue was full: its tracking clients got a null invalidation (forget everything).",
        |s| &s.tracking_overflows,
    ),
];

/// Everything one scrape reports, owned (the registry wants a `'static` collector).
#[derive(Debug)]
struct Sample {
    api_refusals: ApiRefusals,
    cores: Vec<CoreSample>,
    store: StoreStats,
    pool: deadpool_postgres::Status,
    repl: ReplSample,
    uptime_s: f64,
    pgwire: PgwireSnapshot,
    nic: Vec<NicPortSnapshot>,
}

#[derive(Debug)]
struct CoreSample {
    counters: Vec<u64>,
    connections_open: u64,
    connections_open_pg: u64,
    reply_memory_bytes: u64,
    tracking_clients: u64,
    tracking_keys: u64,
    miss_queue_depth: usize,
    reply_queue_depth: usize,
    pg_request_queue_depth: usize,
    pg_reply_queue_depth: usize,
    queue_capacity: usize,
    buckets: [u64; LATENCY_BOUNDS_NS.len() + 1],
    sum_ns: u64,
}

#[derive(Debug)]
struct ReplSample {
    connected: bool,
    streaming: bool,
    serve_hits: bool,
    received_lsn: u64,
    server_wal_end: u64,
    applied_lsn: u64,
    lag_bytes: u64,
    lag_ms: u64,
    reconnects: u64,
    resets: u64,
    txns: u64,
    changes: u64,
    buffered_bytes: u64,
    buffered_peak_bytes: u64,
    txn_overflows: u64,
    proto_version: u64,

    failovers: u64,
    failover_flushes: u64,
    last_failover_gap_ms: u64,
    slot_failover: bool,
    standby_replay_lag_ms: u64,
}

impl Sample {
    fn take(src: &MetricsSnapshot) -> Sample {
        let shared = src.shared;
        let cores = shared
            .all_stats()
            .iter()
            .enumerate()
            .map(|(core, stats)| {
                let queues = shared.queue_depths(core);
                let (buckets, sum_ns) = stats.service_time.snapshot();
                CoreSample {
                    counters: CORE_COUNTERS
                        .iter()
                        .map(|(_, _, f)| f(stats).load(Ordering::Relaxed))
                        .collect(),
                    connections_open: stats.connections_open.load(Ordering::Relaxed),
                    connections_open_pg: stats.connections_open_pg.load(Ordering::Relaxed),
                    reply_memory_bytes: stats.reply_memory_bytes.load(Ordering::Relaxed),
                    tracking_clients: stats.tracking_clients.load(Ordering::Relaxed),
                    tracking_keys: stats.tracking_keys.load(Ordering::Relaxed),
                    miss_queue_depth: queues.misses,
                    reply_queue_depth: queues.replies,
                    pg_request_queue_depth: queues.pg_requests,
                    pg_reply_queue_depth: queues.pg_replies,
                    queue_capacity: queues.capacity,
                    buckets,
                    sum_ns,
                }
            })
            .collect();
        let r = src.repl;
        let load = |a: &AtomicU64| a.load(Ordering::Acquire);
        Sample {
            cores,
            store: src.store,
            pool: src.pool,
            repl: ReplSample {
                connected: r.connected.load(Ordering::Acquire),
                streaming: r.streaming.load(Ordering::Acquire),
                serve_hits: shared.serve_hits(),
                received_lsn: load(&r.received_lsn),
                server_wal_end: load(&r.server_wal_end),
                applied_lsn: load(&r.applied_lsn),
                lag_bytes: r.lag_bytes(),
                lag_ms: r.lag_ms(src.now_us),
                reconnects: load(&r.reconnects),
                resets: load(&r.resets),
                txns: load(&r.txns),
                changes: load(&r.changes),
                buffered_bytes: load(&r.buffered_bytes),
                buffered_peak_bytes: load(&r.buffered_peak_bytes),
                txn_overflows: load(&r.txn_overflows),
                proto_version: load(&r.proto_version),

                failovers: load(&r.failovers),
                failover_flushes: load(&r.failover_flushes),
                last_failover_gap_ms: load(&r.last_failover_gap_ms),
                slot_failover: r.slot_failover.load(Ordering::Acquire),
                standby_replay_lag_ms: load(&r.standby_replay_lag_ms),
            },
            uptime_s: shared.uptime().as_secs_f64(),
            pgwire: PgwireSnapshot::default(),
            nic: Vec::new(),
            api_refusals: src.api_refusals,
        }
    }
}

/// Writes one family with a single unlabelled sample.
fn scalar(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    v: f64,
) -> Result<(), std::fmt::Error> {
    let mut m = enc.encode_descriptor(name, help, None, kind)?;
    match kind {
        MetricType::Counter => m.encode_counter::<(), _, f64>(&v, None),
        _ => m.encode_gauge(&v),
    }
}

/// Writes one family with a sample per core.
fn per_core(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    values: impl Iterator<Item = u64>,
) -> Result<(), std::fmt::Error> {
    let mut m = enc.encode_descriptor(name, help, None, kind)?;
    for (core, v) in values.enumerate() {
        let labels = [("core", core.to_string())];
        let mut f = m.encode_family(&labels)?;
        match kind {
            MetricType::Counter => f.encode_counter::<(), _, f64>(&v, None)?,
            _ => f.encode_gauge(&(i64::try_from(v).unwrap_or(i64::MAX)))?,
        }
    }
    Ok(())
}

type CoreGauge = fn(&CoreSample) -> u64;

impl Sample {
    fn encode_cores(&self, enc: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use MetricType::{Counter, Gauge};
        for (i, (name, help, _)) in CORE_COUNTERS.iter().enumerate() {
            per_core(
                enc,
                name,
                help,
                Counter,
                self.cores.iter().map(|c| c.counters[i]),
            )?;
        }
        let gauges: [(&str, &str, CoreGauge); 10] = [
            (
                "pgline_core_connections_open",
                "Client connections open now.",
                |c| c.connections_open,
            ),
            (
                "pgline_core_connections_open_pgwire",
                "Of those, connections on the PostgreSQL port.",
                |c| c.connections_open_pg,
            ),
            (
                "pgline_core_reply_memory_bytes",
                "Buffer memory the core's client connections hold beyond their initial buffers (capped by resp.max_reply_memory over the cores).",
                |c| c.reply_memory_bytes,
            ),
            (
                "pgline_core_tracking_clients",
                "RESP connections of the core with client tracking on.",
                |c| c.tracking_clients,
            ),
            (
                "pgline_core_tracking_keys",
                "(key, client) pairs in the core's client-tracking table.",
                |c| c.tracking_keys,
            ),
            (
                "pgline_core_miss_queue_depth",
                "Miss requests waiting in the core's queue to the control plane.",
                |c| c.miss_queue_depth as u64,
            ),
            (
                "pgline_core_reply_queue_depth",
                "Fill replies waiting in the queue back to the core.",
                |c| c.reply_queue_depth as u64,
            ),
            (
                "pgline_core_pg_request_queue_depth",
                "PostgreSQL-protocol requests (startup, batches, cancels) waiting for the relay.",
                |c| c.pg_request_queue_depth as u64,
            ),
            (
                "pgline_core_pg_reply_queue_depth",
                "PostgreSQL-protocol reply chunks from the relay waiting for the core.",
                |c| c.pg_reply_queue_depth as u64,
            ),
            (
                "pgline_core_queue_capacity",
                "Capacity of each of the core's four queues (resp.miss_queue); replies and session closes a full queue refuses wait behind it, counted in the depths.",
                |c| c.queue_capacity as u64,
            ),
        ];
        for (name, help, f) in gauges {
            per_core(enc, name, help, Gauge, self.cores.iter().map(f))?;
        }
        let mut m = enc.encode_descriptor(
            "pgline_core_service_seconds",
            "Dataplane service time of the poll-loop turn that executed each request \
             (parse, execute, compose, socket write; one observation per request).",
            None,
            MetricType::Histogram,
        )?;
        for (core, c) in self.cores.iter().enumerate() {
            // Per-bucket counts: the encoder writes them cumulatively; f64::MAX is its +Inf.
            let buckets: Vec<(f64, u64)> = c
                .buckets
                .iter()
                .enumerate()
                .map(|(i, n)| {
                    let upper = LATENCY_BOUNDS_NS
                        .get(i)
                        .map_or(f64::MAX, |&b| b as f64 / 1e9);
                    (upper, *n)
                })
                .collect();
            let labels = [("core", core.to_string())];
            m.encode_family(&labels)?.encode_histogram::<()>(
                c.sum_ns as f64 / 1e9,
                c.buckets.iter().sum(),
                &buckets,
                None,
            )?;
        }
        Ok(())
    }

    fn encode_store(&self, enc: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use MetricType::{Counter, Gauge};
        let s = &self.store;
        let rows: [(&str, &str, MetricType, u64); 11] = [
            (
                "pgline_store_budget_bytes",
                "Configured store memory (store.memory).",
                Gauge,
                s.budget_bytes,
            ),
            (
                "pgline_store_used_bytes",
                "Bytes held by live entries.",
                Gauge,
                s.used_bytes,
            ),
            (
                "pgline_store_region_bytes",
                "Bytes of the memory region (budget rounded up to whole pages).",
                Gauge,
                s.region_bytes,
            ),
            (
                "pgline_store_entries",
                "Live entries, negative ones included.",
                Gauge,
                s.entries,
            ),
            (
                "pgline_store_negative_entries",
                "Live 'no such row' entries.",
                Gauge,
                s.negative_entries,
            ),
            (
                "pgline_store_segments",
                "Segments carved from the budget.",
                Gauge,
                u64::from(s.segments_total),
            ),
            (
                "pgline_store_segments_free",
                "Segments not in use.",
                Gauge,
                u64::from(s.segments_free),
            ),
            (
                "pgline_store_inserts",
                "Entries installed (fills and WAL refreshes).",
                Counter,
                s.inserts,
            ),
            (
                "pgline_store_evicted_entries",
                "Live entries dropped to make room.",
                Counter,
                s.evicted_entries,
            ),
            (
                "pgline_store_evicted_segments",
                "Segments evicted by CLOCK.",
                Counter,
                s.evicted_segments,
            ),
            (
                "pgline_store_pages",
                "Pages backing the region (see pgline_store_page_info).",
                Gauge,
                s.pages,
            ),
        ];
        for (name, help, kind, v) in rows {
            scalar(enc, name, help, kind, v as f64)?;
        }
        let mut m = enc.encode_descriptor(
            "pgline_store_page",
            "Page level the store's region obtained (hugetlb 1GiB/2MiB, THP or 4KiB).",
            None,
            MetricType::Info,
        )?;
        m.encode_info(&[("level", s.page_level.to_string())])
    }

    fn encode_replication(&self, enc: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use MetricType::{Counter, Gauge};
        let r = &self.repl;
        let b = |v: bool| if v { 1.0 } else { 0.0 };
        let rows: [(&str, &str, MetricType, f64); 21] = [
            ("pgline_replication_connected", "1 while a replication connection is open.", Gauge, b(r.connected)),
            ("pgline_replication_streaming", "1 while the WAL stream is in streaming mode.", Gauge, b(r.streaming)),
            ("pgline_replication_serve_hits", "1 while hits are served; 0 means every read goes to the origin (lag past replication.max_lag_ms or stream down).", Gauge, b(r.serve_hits)),
            ("pgline_replication_received_lsn", "Highest WAL position received (LSN as a number).", Gauge, r.received_lsn as f64),
            ("pgline_replication_server_wal_end_lsn", "Highest WAL position the origin reported (LSN as a number).", Gauge, r.server_wal_end as f64),
            ("pgline_replication_applied_lsn", "WAL position up to which changes are applied to the store.", Gauge, r.applied_lsn as f64),
            ("pgline_replication_lag_bytes", "WAL bytes sent by the origin and not yet applied.", Gauge, r.lag_bytes as f64),
            ("pgline_replication_lag_seconds", "How stale the cache may be: 0 when caught up, else time since it was last current.", Gauge, r.lag_ms as f64 / 1e3),
            ("pgline_replication_reconnects", "Replication connection attempts after the first.", Counter, r.reconnects as f64),
            ("pgline_replication_slot_resets", "Times the slot was missing and re-created (the cache was flushed).", Counter, r.resets as f64),
            ("pgline_replication_transactions", "Transactions received from the WAL.", Counter, r.txns as f64),
            ("pgline_replication_changes", "Row changes received from the WAL.", Counter, r.changes as f64),
            ("pgline_replication_proto_version", "pgoutput protocol version of the WAL stream (0 before the first).", Gauge, r.proto_version as f64),
            ("pgline_wal_buffered_bytes", "Estimated bytes of changes buffered for open (Begin…Commit and streamed) transactions; bounded by replication.max_txn_memory.", Gauge, r.buffered_bytes as f64),
            ("pgline_wal_buffered_peak_bytes", "Highest pgline_wal_buffered_bytes since start.", Gauge, r.buffered_peak_bytes as f64),
            ("pgline_wal_txn_overflows", "Transactions past replication.max_txn_memory, applied as a flush of their tables at commit.", Counter, r.txn_overflows as f64),

            ("pgline_wal_failovers", "Times the stream resumed on another server (a promoted standby or another cluster).", Counter, r.failovers as f64),
            ("pgline_wal_failover_flushes", "Failovers that flushed the cache (slot not synced to the new primary, or WAL applied past the new timeline's start).", Counter, r.failover_flushes as f64),
            ("pgline_wal_last_failover_gap_seconds", "Last failover: stream lost until streaming from the new primary and caught up.", Gauge, r.last_failover_gap_ms as f64 / 1e3),
            ("pgline_replication_slot_failover", "1 if the slot is a failover slot (PostgreSQL 17+, synchronized to standbys).", Gauge, b(r.slot_failover)),
            ("pgline_replication_standby_replay_lag_seconds", "With replication.url on a standby: its replay delay behind the primary.", Gauge, r.standby_replay_lag_ms as f64 / 1e3),
        ];
        for (name, help, kind, v) in rows {
            scalar(enc, name, help, kind, v)?;
        }
        Ok(())
    }

    fn encode_pgwire(&self, enc: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use MetricType::{Counter, Gauge};
        let p = &self.pgwire;
        let rows: [(&str, &str, MetricType, f64); 5] = [
            ("pgline_pgwire_sessions", "PostgreSQL client sessions the relay holds (authenticating or open).", Gauge, p.sessions as f64),
            ("pgline_pgwire_batches", "Batches (one Query, or messages up to Sync) forwarded to the origin.", Counter, p.batches as f64),
            ("pgline_pgwire_batch_errors", "Forwarded batches whose reply carried an ErrorResponse or was cut short.", Counter, p.batch_errors as f64),
            ("pgline_pgwire_reply_bytes", "Bytes of forwarded batches' replies sent back to clients.", Counter, p.reply_bytes as f64),
            ("pgline_pgwire_origin_seconds", "Time forwarded batches spent at the origin (send to ReadyForQuery, fence query included).", Counter, p.origin_us as f64 / 1e6),
        ];
        for (name, help, kind, v) in rows {
            scalar(enc, name, help, kind, v)?;
        }
        let o = &p.origin;
        let origin: [(&str, &str, MetricType, u64); 11] = [
            ("pgline_pgwire_startup_pending", "Origin connections in authentication now (at most pgwire.max_pending_startups).", Gauge, o.startup_pending),
            ("pgline_pgwire_startup_refused", "Startups refused (53300) because pgwire.max_pending_startups were in authentication for pgwire.startup_wait_ms.", Counter, o.startup_refused),
            ("pgline_pgwire_auth_timeout", "Relayed authentications ended by pgwire.auth_timeout_ms.", Counter, o.auth_timeout),
            ("pgline_pgwire_backend_idle_closed", "Pooled origin connections closed after pgwire.pool_idle_timeout_ms idle.", Counter, o.backend_idle_closed),
            ("pgline_pgwire_backend_dead", "Pooled origin connections found closed by the origin (or with unsolicited input) and dropped before use.", Counter, o.backend_dead),
            ("pgline_pgwire_pools", "Backend pools (user, database, startup settings) the relay holds.", Gauge, o.pools),
            ("pgline_pgwire_pool_forgotten", "Backend pools forgotten: no connection and no session left, or evicted for room.", Counter, o.pool_forgotten),
            ("pgline_pgwire_pool_refused", "Startups refused (53300) because pgwire.max_pools pools were in use.", Counter, o.pool_refused),
            ("pgline_pgwire_backend_steals", "Batches that took another session's reserved backend and read its state first: more sessions than pgwire.pool_size backends.", Counter, o.backend_steals),
            ("pgline_pgwire_backend_steals_unread", "Of pgline_pgwire_backend_steals, transaction starts whose state read went in front of the batch, in its round trip (taken back with ROLLBACK when the state was another session's).", Counter, o.backend_steals_unread),
            ("pgline_pgwire_origin_statements_closed", "Prepared statements pgline closed on origin connections that held more than pgwire.max_origin_statements (prepared again when next used).", Counter, o.origin_statements_closed),
        ];
        for (name, help, kind, v) in origin {
            scalar(enc, name, help, kind, v as f64)?;
        }
        let mut m = enc.encode_descriptor(
            "pgline_pgwire_pool_connections",
            "Origin connections of a backend pool by state: idle, reserved (kept for the session \
             of their last batch; others take them after a state read), or busy (running a \
             batch or pinned to a session).",
            None,
            Gauge,
        )?;
        for pool in &p.pools {
            let busy = pool.total.saturating_sub(pool.idle + pool.reserved);
            for (state, v) in [
                ("idle", pool.idle),
                ("reserved", pool.reserved),
                ("busy", busy),
            ] {
                let labels = [
                    ("user", pool.user.clone()),
                    ("database", pool.database.clone()),
                    ("state", state.to_string()),
                ];
                m.encode_family(&labels)?
                    .encode_gauge(&i64::try_from(v).unwrap_or(i64::MAX))?;
            }
        }
        Ok(())
    }

    fn encode_process(&self, enc: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use MetricType::Gauge;
        let p = &self.pool;
        let rows: [(&str, &str, usize); 4] = [
            (
                "pgline_origin_pool_max_size",
                "Largest number of origin connections (origin.pool_size).",
                p.max_size,
            ),
            (
                "pgline_origin_pool_size",
                "Origin connections open.",
                p.size,
            ),
            (
                "pgline_origin_pool_available",
                "Origin connections idle in the pool.",
                p.available,
            ),
            (
                "pgline_origin_pool_waiting",
                "Fills waiting for an origin connection.",
                p.waiting,
            ),
        ];
        for (name, help, v) in rows {
            scalar(enc, name, help, Gauge, v as f64)?;
        }
        scalar(
            enc,
            "pgline_uptime_seconds",
            "Seconds since the dataplane started.",
            Gauge,
            self.uptime_s,
        )?;
        let mut m =
            enc.encode_descriptor("pgline_build", "pgline version.", None, MetricType::Info)?;
        m.encode_info(&[("version", env!("CARGO_PKG_VERSION"))])
    }
}

impl Collector for Sample {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        self.encode_cores(&mut enc)?;
        self.encode_store(&mut enc)?;
        self.encode_replication(&mut enc)?;
        self.encode_pgwire(&mut enc)?;
        self.encode_nic(&mut enc)?;
        encode_api_refusals(&mut enc, self.api_refusals)?;
        self.encode_process(&mut enc)
    }
}

/// `pgline_api_request_refused_total{reason}` (the counts `api::auth` keeps).
fn encode_api_refusals(
    enc: &mut DescriptorEncoder,
    refusals: ApiRefusals,
) -> Result<(), std::fmt::Error> {
    let mut m = enc.encode_descriptor(
        "pgline_api_request_refused",
        "API calls refused by access control, by reason (missing_token, wrong_token, \
         no_token_configured); the log has one summary line per 10 s at most.",
        None,
        MetricType::Counter,
    )?;
    for (reason, n) in [
        ("missing_token", refusals.missing_token),
        ("wrong_token", refusals.wrong_token),
        ("no_token_configured", refusals.no_token_configured),
    ] {
        let labels = [("reason", reason)];
        m.encode_family(&labels)?
            .encode_counter::<(), _, f64>(&n, None)?;
    }
    Ok(())
}

type NicField = fn(&NicPortSnapshot) -> u64;
/// Per-port device counters: (name without `_total`, help, field).
const NIC_COUNTERS: [(&str, &str, NicField); 8] = [
    (
        "pgline_nic_rx_packets",
        "Frames the DPDK port received (ipackets).",
        |p| p.ipackets,
    ),
    (
        "pgline_nic_tx_packets",
        "Frames the DPDK port sent (opackets).",
        |p| p.opackets,
    ),
    (
        "pgline_nic_rx_bytes",
        "Bytes the DPDK port received (ibytes).",
        |p| p.ibytes,
    ),
    (
        "pgline_nic_tx_bytes",
        "Bytes the DPDK port sent (obytes).",
        |p| p.obytes,
    ),
    (
        "pgline_nic_rx_missed",
        "Frames the device dropped because an RX queue was full (imissed).",
        |p| p.imissed,
    ),
    (
        "pgline_nic_rx_errors",
        "Erroneous frames received (ierrors).",
        |p| p.ierrors,
    ),
    (
        "pgline_nic_tx_errors",
        "Frames the device failed to send (oerrors).",
        |p| p.oerrors,
    ),
    (
        "pgline_nic_rx_nombuf",
        "RX mbuf allocation failures: the mbuf pool was empty (rx_nombuf).",
        |p| p.rx_nombuf,
    ),
];
/// Per-queue device counters, in [`NicPortSnapshot::queues`] order.
const NIC_QUEUE_COUNTERS: [(&str, &str); 5] = [
    (
        "pgline_nic_queue_rx_packets",
        "Frames received on the queue pair.",
    ),
    (
        "pgline_nic_queue_tx_packets",
        "Frames sent on the queue pair.",
    ),
    (
        "pgline_nic_queue_rx_bytes",
        "Bytes received on the queue pair.",
    ),
    ("pgline_nic_queue_tx_bytes", "Bytes sent on the queue pair."),
    (
        "pgline_nic_queue_errors",
        "Errors on the queue pair (driver-defined).",
    ),
];

impl Sample {
    /// The DPDK port families, only when there are ports (`nic.mode = "dpdk"`).
    fn encode_nic(&self, enc: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        if self.nic.is_empty() {
            return Ok(());
        }
        for (name, help, f) in NIC_COUNTERS {
            let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
            for p in &self.nic {
                let labels = [("port", p.port.as_str())];
                m.encode_family(&labels)?
                    .encode_counter::<(), _, f64>(&f(p), None)?;
            }
        }
        let links: Vec<(&str, (bool, u32))> = self
            .nic
            .iter()
            .filter_map(|p| Some((p.port.as_str(), p.link?)))
            .collect();
        if !links.is_empty() {
            let mut up = enc.encode_descriptor(
                "pgline_nic_link_up",
                "1 when the DPDK port's link is up (rte_eth_link_get_nowait).",
                None,
                MetricType::Gauge,
            )?;
            for (port, (is_up, _)) in &links {
                up.encode_family(&[("port", *port)])?
                    .encode_gauge(&i64::from(*is_up))?;
            }
            let mut speed = enc.encode_descriptor(
                "pgline_nic_link_speed_mbps",
                "The DPDK port's link speed in Mbit/s (0: unknown).",
                None,
                MetricType::Gauge,
            )?;
            for (port, (_, mbps)) in &links {
                speed
                    .encode_family(&[("port", *port)])?
                    .encode_gauge(&i64::from(*mbps))?;
            }
        }
        for (i, (name, help)) in NIC_QUEUE_COUNTERS.iter().enumerate() {
            let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
            for p in &self.nic {
                for (q, v) in p.queues.iter().enumerate() {
                    let labels = [("port", p.port.clone()), ("queue", q.to_string())];
                    m.encode_family(&labels)?
                        .encode_counter::<(), _, f64>(&v[i], None)?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;

#[cfg(test)]
mod nic_tests {
    use super::*;

    #[test]
    fn dpdk_port_counters_are_exported_labelled_and_documented() {
        use pgline_dataplane::keyspace::{KeySpace, KeySpaceCell};
        use pgline_dataplane::store::{self, StoreConfig};
        let cfg = StoreConfig {
            memory_bytes: 8 << 20,
            segment_bytes: 256 << 10,
            max_page_level: pgline_hugepages::PageLevel::Base,
            prefault: false,
        };
        let (writer, reader) = store::open(&cfg).expect("store");
        // The reader's region must outlive the test.
        std::mem::forget(writer);
        let keys = KeySpaceCell::new(KeySpace::new());
        let wakers = pgline_dataplane::plane::ControlWakers::none();
        let shared = Shared::new(reader, keys, 1, 16, wakers);
        let repl = ReplicationState::default();
        let src = MetricsSnapshot {
            shared: &shared,
            repl: &repl,
            store: StoreStats::default(),
            pool: deadpool_postgres::Status {
                max_size: 1,
                size: 0,
                available: 0,
                waiting: 0,
            },
            now_us: 0,
            api_refusals: ApiRefusals::default(),
        };
        let pg = PgwireSnapshot::default();
        let bare = render_with_pgwire(&src, &pg);
        assert!(!bare.contains("pgline_nic_"), "no port, no nic families");
        let port = NicPortSnapshot {
            port: "net_af_xdp0".into(),
            ipackets: 11,
            opackets: 12,
            ibytes: 13,
            obytes: 14,
            imissed: 15,
            ierrors: 16,
            oerrors: 17,
            rx_nombuf: 18,
            queues: vec![[21, 22, 23, 24, 25], [31, 32, 33, 34, 35]],
            link: Some((true, 10000)),
        };
        let text = render_all(&src, &pg, vec![port]);
        let docs = include_str!("../../docs/operations.md");
        for (i, (name, _, _)) in NIC_COUNTERS.iter().enumerate() {
            let line = format!("{name}_total{{port=\"net_af_xdp0\"}} {}", 11 + i);
            assert!(text.contains(&line), "{line} in\n{text}");
            assert!(
                docs.contains(&format!("| `{name}_total")),
                "{name} undocumented"
            );
        }
        for line in [
            "pgline_nic_link_up{port=\"net_af_xdp0\"} 1",
            "pgline_nic_link_speed_mbps{port=\"net_af_xdp0\"} 10000",
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
        for name in ["pgline_nic_link_up", "pgline_nic_link_speed_mbps"] {
            assert!(docs.contains(&format!("| `{name}`")), "{name} undocumented");
        }
        for (i, (name, _)) in NIC_QUEUE_COUNTERS.iter().enumerate() {
            for (q, base) in [(0, 21), (1, 31)] {
                let line = format!(
                    "{name}_total{{port=\"net_af_xdp0\",queue=\"{q}\"}} {}",
                    base + i
                );
                assert!(text.contains(&line), "{line} in\n{text}");
            }
            assert!(
                docs.contains(&format!("| `{name}_total")),
                "{name} undocumented"
            );
        }
    }
}
