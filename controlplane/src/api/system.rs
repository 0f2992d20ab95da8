//! Liveness, readiness, the OpenAPI document, the PostgreSQL front's per-statement statistics
//! and the Prometheus exposition.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::error::{ApiError, ErrorBody};
use super::{Node, St};
use crate::admin::Admin;
use crate::metrics::{PgPoolSnapshot, PgwireSnapshot};

/// `GET /v1/health`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Health {
    #[schema(example = "ok")]
    pub status: String,
}

/// Liveness: the control plane answers. Never needs the token.
#[utoipa::path(get, path = "/v1/health", tag = "system", security(()),
    responses((status = 200, description = "The control plane runs", body = Health)))]
pub async fn health() -> Json<Health> {
    Json(Health {
        status: "ok".into(),
    })
}

/// The checks behind `GET /v1/ready`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema)]
pub struct ReadyChecks {
    /// The origin answers `SELECT 1` within a second.
    pub origin: bool,
    /// The WAL stream is in streaming mode.
    pub replication: bool,
    /// Replication lag is under `replication.max_lag_ms`, so hits are served.
    pub lag: bool,
    /// Every dataplane core is turning its loop.
    pub cores: bool,
    /// No core is at its share of a port's connection limit (`resp.max_connections`,
    /// `pgwire.max_sessions`): new connections are accepted.
    pub connections: bool,
    /// No core is at its share of `resp.max_reply_memory` (at the cap, connections with
    /// unwritten output are not read and the largest are closed).
    pub reply_memory: bool,
}

/// `GET /v1/ready`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Ready {
    pub ready: bool,
    pub checks: ReadyChecks,
    /// One line per failed check.
    pub detail: Vec<String>,
}

/// How long readiness waits for the origin's answer.
const ORIGIN_PROBE: Duration = Duration::from_secs(1);

/// How long readiness waits to see every core turn its loop (an idle core turns every 100 ms).
const CORE_PROBE: Duration = Duration::from_millis(300);

/// Readiness: origin reachable, replication streaming, lag under the bound, cores running,
/// and not saturated (connection slots left on both ports, reply memory under its cap).
/// 503 with the same body when a check fails. Never needs the token.
#[utoipa::path(get, path = "/v1/ready", tag = "system", security(()),
    responses(
        (status = 200, description = "Ready to serve hits", body = Ready),
        (status = 503, description = "A check failed (see `detail`)", body = Ready),
    ))]
pub async fn ready(Node(node): Node) -> Response {
    let (origin, cores) = tokio::join!(node.probe_origin(ORIGIN_PROBE), cores_turning(&node));
    let (connections, reply_memory) = saturation(&node);
    let checks = ReadyChecks {
        origin: origin.is_ok(),
        replication: node.repl.streaming.load(Ordering::Acquire),
        lag: node.shared.serve_hits(),
        cores,
        connections: connections.is_empty(),
        reply_memory: reply_memory.is_empty(),
    };
    let mut detail = Vec::new();
    if let Err(e) = origin {
        detail.push(format!("origin: {e}"));
    }
    if !checks.replication {
        detail.push("replication: the WAL stream is not streaming".into());
    }
    if !checks.lag {
        let lag_ms = node.shared.replication().lag_ms();
        detail.push(format!(
            "lag: hits are off (lag {lag_ms} ms over replication.max_lag_ms, or the stream is down)"
        ));
    }
    if !checks.cores {
        detail.push("cores: a dataplane core has stopped turning its loop".into());
    }
    detail.extend(connections);
    detail.extend(reply_memory);
    let body = Ready {
        ready: detail.is_empty(),
        checks,
        detail,
    };
    let status = if body.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body)).into_response()
}

/// Saturation of the client-facing bounds, one line per core and bound at its limit:
/// (connection limits, reply memory). Each core has an even share of each bound (as the
/// engine splits them), so a core at its share refuses or holds back even if others have room.
fn saturation(node: &Admin) -> (Vec<String>, Vec<String>) {
    let (engine, pg_on) = {
        let cfg = node.config_read();
        (cfg.engine(), cfg.pgwire.enabled)
    };
    let (resp_cap, pg_cap) = (
        engine.max_connections_per_core() as u64,
        engine.max_pg_connections_per_core() as u64,
    );
    let mem_cap = engine.max_reply_memory_per_core() as u64;
    let (mut connections, mut memory) = (Vec::new(), Vec::new());
    for (core, s) in node.shared.all_stats().iter().enumerate() {
        let open = s.connections_open.load(Ordering::Relaxed);
        let pg = s.connections_open_pg.load(Ordering::Relaxed);
        let resp = open.saturating_sub(pg);
        if resp >= resp_cap {
            connections.push(format!(
                "connections: core {core} has {resp} RESP connections open, its share of resp.max_connections ({}); new ones are refused",
                engine.max_connections
            ));
        }
        if pg_on && pg >= pg_cap {
            connections.push(format!(
                "connections: core {core} has {pg} PostgreSQL connections open, its share of pgwire.max_sessions ({}); new ones are refused with 53300",
                engine.conn_limits.max_pg_connections
            ));
        }
        let held = s.reply_memory_bytes.load(Ordering::Relaxed);
        if held >= mem_cap {
            memory.push(format!(
                "reply_memory: core {core} holds {held} bytes of client buffers, its share of resp.max_reply_memory ({}); clients that do not read are held back and closed",
                engine.conn_limits.max_reply_memory
            ));
        }
    }
    (connections, memory)
}

/// Whether every core's poll counter moves within [`CORE_PROBE`].
async fn cores_turning(node: &Admin) -> bool {
    let polls = |i: usize| node.shared.stats(i).polls.load(Ordering::Relaxed);
    let before: Vec<u64> = (0..node.shared.cores()).map(polls).collect();
    let until = Instant::now() + CORE_PROBE;
    loop {
        if before.iter().enumerate().all(|(i, b)| polls(i) != *b) {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// This document: OpenAPI 3.1, generated from the handlers. Never needs the token.
#[utoipa::path(get, path = "/v1/openapi.json", tag = "system", security(()),
    responses((status = 200, description = "The OpenAPI document", content_type = "application/json")))]
pub async fn openapi_json(state: St) -> Response {
    match state.openapi.get() {
        Some(doc) => ([(header::CONTENT_TYPE, "application/json")], doc.clone()).into_response(),
        None => ApiError::unavailable("the document is not built yet").into_response(),
    }
}

/// One statement's figures in `GET /v1/queries`: batches the PostgreSQL front forwarded to the
/// origin, keyed by normalized text.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct QueryStats {
    /// Normalized statement text (as `pg_stat_statements`): every constant becomes `$n`,
    /// numbered after the statement's own `$n` parameters, which stay; comments and whitespace
    /// runs become one space; an untokenizable statement is `<unparsable: N bytes>`. A batch of several statements is one entry, its distinct
    /// texts joined by `; `. `<other>` gathers new texts past 10,000 entries.
    #[schema(example = "UPDATE counters SET n = $1 WHERE id = $2")]
    pub query: String,
    /// Batches forwarded to the origin.
    pub calls: u64,
    /// Of those, batches whose reply carried an ErrorResponse.
    pub errors: u64,
    /// Reply bytes sent back to clients.
    pub bytes: u64,
    /// Mean time of a batch at the origin, from sending it to its ReadyForQuery (the fence
    /// query pipelined behind it included), microseconds.
    pub mean_us: u64,
    /// 99th percentile of the same, as the upper bound of its power-of-two bucket, microseconds.
    pub p99_us: u64,
}

/// Per-statement statistics of the PostgreSQL front's pass-through (what went to the origin),
/// busiest first. Cached point lookups answered by the cores are not per statement: they count
/// in the cores' `keys_hit` (see `GET /v1/status` and `/metrics`). Empty when `pgwire.enabled`
/// is false.
#[utoipa::path(get, path = "/v1/queries", tag = "cache", security(("bearer" = [])),
    responses(
        (status = 200, description = "Per-statement statistics, most calls first", body = [QueryStats]),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 403, description = "No token configured", body = ErrorBody),
    ))]
pub async fn queries(Node(node): Node) -> Json<Vec<QueryStats>> {
    let mut out: Vec<QueryStats> = node
        .pg_relay()
        .map(|r| r.statement_stats())
        .unwrap_or_default()
        .into_iter()
        .map(|(query, s)| QueryStats {
            calls: s.calls,
            errors: s.errors,
            bytes: s.bytes,
            mean_us: s.mean_us(),
            p99_us: s.p99_us(),
            query,
        })
        .collect();
    out.sort_by(|a, b| b.calls.cmp(&a.calls).then_with(|| a.query.cmp(&b.query)));
    Json(out)
}

/// `GET /metrics`: the Prometheus/OpenMetrics exposition (`docs/operations.md` lists every
/// family). Outside `/v1` and the OpenAPI document; a read, so it follows `api.open_reads`.
pub async fn metrics(Node(node): Node) -> Response {
    let pg = pgwire_snapshot(&node);
    let snapshot = crate::metrics::MetricsSnapshot {
        shared: &node.shared,
        repl: &node.repl,
        store: node.store_stats(),
        pool: node.pool_status(),
        now_us: crate::clock::unix_now_us(),
        api_refusals: super::auth::REFUSALS.snapshot(),
    };
    let body = crate::metrics::render_all(&snapshot, &pg, node.nic_ports());
    ([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], body).into_response()
}

/// The relay's figures for `/metrics`: sessions, the pool of `origin.url`'s user and database
/// (the only pool the relay can be asked about by name from here), and the sums of its
/// per-statement statistics.
fn pgwire_snapshot(node: &Admin) -> PgwireSnapshot {
    let Some(relay) = node.pg_relay() else {
        return PgwireSnapshot::default();
    };
    let mut pg = PgwireSnapshot {
        sessions: relay.sessions() as u64,
        origin: relay.origin_stats(),
        ..PgwireSnapshot::default()
    };
    for (_, s) in relay.statement_stats() {
        pg.batches += s.calls;
        pg.batch_errors += s.errors;
        pg.reply_bytes += s.bytes;
        pg.origin_us = pg.origin_us.saturating_add(s.total_us);
    }
    let origin = crate::origin::Settings::parse_pg(&node.config_read().origin.url);
    if let Ok(c) = origin {
        let user = c.get_user().unwrap_or("postgres").to_owned();
        let database = c.get_dbname().unwrap_or(&user).to_owned();
        let (idle, total) = relay.pool_counts(&user, &database);
        let reserved = relay.pool_reserved(&user, &database);
        pg.pools.push(PgPoolSnapshot {
            user,
            database,
            idle: idle as u64,
            reserved: reserved as u64,
            total: total as u64,
        });
    }
    pg
}
