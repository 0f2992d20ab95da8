//! `GET /v1/status`: one snapshot of the whole appliance for operators and the CLI.
//!
//! Every figure is read from counters the parts already publish (per-core stats, the store's
//! stats snapshot, the replication state, the origin pool), one by one: the snapshot is not
//! atomic across parts, which is accepted for a status page.

use std::sync::atomic::Ordering;

use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::error::ErrorBody;
use super::Node;
use crate::admin::Admin;
use crate::lsn::format_lsn;

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Status {
    #[schema(example = "0.1.0")]
    pub version: String,
    pub uptime_s: u64,
    pub cores: Vec<CoreStatus>,
    pub memory: MemoryStatus,
    pub store: StoreStatus,
    pub replication: ReplicationStatus,
    pub origin_pool: PoolStatus,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CoreStatus {
    pub core: u32,
    /// The client transport the core runs (`nic.mode`): `kernel` (sockets), `dpdk` (the
    /// userspace TCP stack on a DPDK port's queue pair) or `mem` (the userspace stack on an
    /// in-memory port, for tests).
    #[schema(example = "kernel")]
    pub transport: String,
    pub connections_open: u64,
    pub commands: u64,
    pub keys_hit: u64,
    pub keys_miss: u64,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct MemoryStatus {
    /// `store.memory`.
    pub budget_bytes: u64,
    /// Bytes of live entries.
    pub used_bytes: u64,
    /// Bytes reserved (the budget rounded up to the page size).
    pub region_bytes: u64,
    /// Page size obtained: `1GiB`, `2MiB`, `THP` or `4KiB`.
    #[schema(example = "2MiB")]
    pub page_level: String,
    pub pages: u64,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct StoreStatus {
    pub entries: u64,
    pub negative_entries: u64,
    pub inserts: u64,
    pub evicted_entries: u64,
    pub evicted_segments: u64,
    pub segments_total: u32,
    pub segments_free: u32,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ReplicationStatus {
    pub slot: String,
    pub publication: String,
    pub streaming: bool,
    /// What pgline confirms to the slot as flushed: the consumer confirms only applied WAL, so
    /// this is the applied LSN once past the slot's start position. PostgreSQL text form.
    #[schema(example = "16/B374D848")]
    pub confirmed_lsn: String,
    /// Everything up to here is in the cache.
    #[schema(example = "16/B374D848")]
    pub applied_lsn: String,
    /// Highest WAL position received.
    #[schema(example = "16/B374D848")]
    pub received_lsn: String,
    pub lag_bytes: u64,
    pub lag_ms: u64,
    /// Replication connection attempts after the first.
    #[serde(default)]
    pub reconnects: u64,
    /// Times the stream resumed on another server (a promoted standby, or another cluster).
    #[serde(default)]
    pub failovers: u64,
    /// Failovers that flushed the cache.
    #[serde(default)]
    pub failover_flushes: u64,
    /// Last failover: stream lost until streaming from the new primary and caught up, ms.
    #[serde(default)]
    pub last_failover_gap_ms: u64,
    /// Whether the last failover flushed the cache.
    #[serde(default)]
    pub last_failover_flushed: bool,
    /// The slot is a failover slot (PostgreSQL 17+): a promoted standby has it, and pgline
    /// resumes there without a flush.
    #[serde(default)]
    pub slot_failover: bool,
    /// With `replication.url` on a standby: its replay delay behind the primary, ms (adds to
    /// the cache's lag); 0 otherwise.
    #[serde(default)]
    pub standby_replay_lag_ms: u64,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PoolStatus {
    pub max_size: u64,
    pub size: u64,
    pub available: u64,
    /// Fills waiting for a connection.
    pub waiting: u64,
}

/// Version, uptime, cores, memory, store counters, replication and the origin pool.
#[utoipa::path(get, path = "/v1/status", tag = "system", security(("bearer" = [])),
    responses(
        (status = 200, description = "A snapshot", body = Status),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 403, description = "No token configured", body = ErrorBody),
    ))]
pub async fn status(Node(node): Node) -> Json<Status> {
    Json(compose_status(&node))
}

fn compose_status(node: &Admin) -> Status {
    let shared = &node.shared;
    let cfg = node.effective_config();
    // `nic.mode` is not a live setting: the configured transport is the one the cores run.
    let transport = cfg.nic.mode.to_string();
    let cores = shared
        .all_stats()
        .iter()
        .enumerate()
        .map(|(i, s)| CoreStatus {
            core: i as u32,
            transport: transport.clone(),
            connections_open: s.connections_open.load(Ordering::Relaxed),
            commands: s.executed(),
            keys_hit: s.keys_hit.load(Ordering::Relaxed)
                + s.keys_negative_hit.load(Ordering::Relaxed),
            keys_miss: s.keys_miss.load(Ordering::Relaxed),
        })
        .collect();
    let st = node.store_stats();
    let repl = &node.repl;
    let applied = repl.applied_lsn.load(Ordering::Acquire);
    let pool = node.pool_status();
    Status {
        version: env!("CARGO_PKG_VERSION").into(),
        uptime_s: node.uptime().as_secs(),
        cores,
        memory: MemoryStatus {
            budget_bytes: st.budget_bytes,
            used_bytes: st.used_bytes,
            region_bytes: st.region_bytes,
            page_level: st.page_level.to_string(),
            pages: st.pages,
        },
        store: StoreStatus {
            entries: st.entries,
            negative_entries: st.negative_entries,
            inserts: st.inserts,
            evicted_entries: st.evicted_entries,
            evicted_segments: st.evicted_segments,
            segments_total: st.segments_total,
            segments_free: st.segments_free,
        },
        replication: ReplicationStatus {
            slot: cfg.replication.slot,
            publication: cfg.replication.publication,
            streaming: repl.streaming.load(Ordering::Acquire),
            confirmed_lsn: format_lsn(applied),
            applied_lsn: format_lsn(applied),
            received_lsn: format_lsn(repl.received_lsn.load(Ordering::Acquire)),
            lag_bytes: repl.lag_bytes(),
            lag_ms: shared.replication().lag_ms(),
            reconnects: repl.reconnects.load(Ordering::Acquire),
            failovers: repl.failovers.load(Ordering::Acquire),
            failover_flushes: repl.failover_flushes.load(Ordering::Acquire),
            last_failover_gap_ms: repl.last_failover_gap_ms.load(Ordering::Acquire),
            last_failover_flushed: repl.last_failover_flushed.load(Ordering::Acquire),
            slot_failover: repl.slot_failover.load(Ordering::Acquire),
            standby_replay_lag_ms: repl.standby_replay_lag_ms.load(Ordering::Acquire),
        },
        origin_pool: PoolStatus {
            max_size: pool.max_size as u64,
            size: pool.size as u64,
            available: pool.available as u64,
            waiting: pool.waiting as u64,
        },
    }
}
