//! The PostgreSQL relay: the control-plane side of the pgwire front.
//!
//! Purpose: the cores speak the protocol with clients and hand the control plane what they do not
//! serve themselves as [`PgRequest`]s on `queues[core].pg_requests`; this module answers with
//! [`PgReply`]s on `queues[core].pg_replies` (then `wake_core`). It authenticates each client by
//! relaying its startup and password exchange to a new origin connection (trust, md5, SCRAM all
//! work: no TLS, no channel binding), pools origin connections per (user, database, startup
//! settings, login state) in transaction-pooling mode, rewrites named prepared statements per backend (`plan`), streams
//! replies in chunks of at most [`CHUNK`] bytes, forwards cancels and measures the session fence
//! (the origin's WAL position after a batch, when the core asks for it: [`PgRequest::fence`]).
//!
//! Place on the path: off the hit path. Every forwarded batch costs one origin round trip; the
//! fence and state statement (prepared, `state::FENCE_STATEMENT`) is pipelined behind the
//! client's messages only when the core asked for it; a backend whose state was not read stays
//! reserved for its session (`pool`).
//!
//! Thread model: the relay runs on the core that owns the client's connection. A kernel-transport
//! core takes [`CoreRelay`] (offered through the plane, [`RelayState::host_on_cores`]) and, after
//! each of its turns, drains its own queue into [`RelayState::dispatch`] on its own thread, whose
//! tokio current-thread runtime runs the session tasks and their origin sockets between the
//! core's turns (`engine::kernel`): a forwarded batch crosses no thread. A core that does not
//! host it (a userspace core) is served by one dispatcher task ([`run`]) on the control runtime,
//! which drains its queue when the control waker fires (and every 20 ms). Either way the
//! dispatcher feeds one task per session through an unbounded channel (spawned with
//! `tokio::spawn` on the dispatching thread's runtime: one code base for both); a session task
//! handles its requests one at a time (the core sends one batch at a time per session). Cancels
//! are handled by the dispatcher without waiting for the session; a cancel may arrive on another
//! core than its session's, and is sent from there (the session table and the cancel states are
//! shared, under locks).
//!
//! Pools are per core, as PgBouncer's processes on `SO_REUSEPORT` each have their own: a pool is
//! keyed by core too, and holds at most `pgwire.pool_size / resp.cores` (rounded up)
//! connections, so the origin sees about `pool_size` connections per (user, database, startup
//! settings) over all cores, each used by the thread that opened it.
//!
//! Invariants:
//! - Replies to a request keep their order: only its session task pushes them.
//! - A backend is owned by exactly one place: its pool's idle list, its pool's reserved list
//!   (for one session), a running batch, or a session pinned to it.
//! - pgline's own (pid, secret) per session is registered for cancel from startup to the end of
//!   the session; the origin's keys never reach the client.
//!
//! Origin protection (`admit`): at most `pgwire.max_pending_startups` origin connections are in
//! authentication at once, each for at most `pgwire.auth_timeout_ms`; pooled connections idle
//! past `pgwire.pool_idle_timeout_ms` are closed and ones the origin closed are dropped (a sweep
//! every second or less, and on take); pools with no connection and no session are forgotten,
//! and at most `pgwire.max_pools` exist.
//!
//! Limitations: a pool grows by the connections its clients authenticate, and on demand only
//! for `origin.url`'s user (see `pool`);
//! a backend whose session state (role, search path, output settings: see `state`) differs
//! from its session's login state after a batch stays pinned to that session, and goes back
//! to its pool only after ROLLBACK, DISCARD ALL and a re-read show the login state again;
//! COPY FROM STDIN is refused (CopyFail);
//! NotificationResponses reach a session only with the replies of its own batches.

mod admit;
mod backend;
mod error;
mod plan;
mod pool;
mod results;
mod session;
mod state;
mod stats;

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pgline_dataplane::plane::{
    ControlPort, MissRequest, PgHost, PgReply, PgRequest, PgRequestKind,
};

use crate::corefill::CoreFills;
use crate::result_plane::ResultPlane;
use tokio::sync::{mpsc, watch, Notify};

pub use admit::OriginStats;
pub use backend::OriginAddr;
use backend::{CancelGate, CancelSent};
pub use plan::{backend_name, leaves_session_state, PlanError, FENCE_SQL};
pub use pool::PoolError;
pub use state::{unlisted_custom_settings, CUSTOM_SETTING_NAMES_SQL};
pub use stats::{normalize, StatementStats};

use crate::config::{Config, ConfigError};

/// Largest `bytes` of one [`PgReply`].
pub const CHUNK: usize = 64 * 1024;

/// The relay's settings.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// `origin.url`: its hosts, TLS settings and session attributes.
    pub origin: crate::origin::Settings,
    pub pool_size: usize,
    pub connect_timeout: Duration,
    pub max_sessions: usize,
    /// User and password of `origin.url`: pools of that user open connections on demand.
    pub credentials: Option<(String, Vec<u8>)>,
    /// pgline's own origin session settings (`origin.url` with its session options): the
    /// output settings cached answers were made under are read over it (see `state`).
    pub own_session: Option<tokio_postgres::Config>,
    /// Origin connections in authentication at once, how long a startup waits for a slot,
    /// and how long an authentication may take (see `admit`).
    pub max_pending_startups: usize,
    pub startup_wait: Duration,
    pub auth_timeout: Duration,
    /// Pooled connections idle longer are closed.
    pub pool_idle_timeout: Duration,
    /// How long a batch waits for a free origin connection of its pool.
    pub pool_wait: Duration,
    /// Backend pools at once.
    pub max_pools: usize,
    /// pgline's prepared statements on one origin connection before they are closed.
    pub max_origin_statements: usize,
    /// The fence and state statements, with the custom settings the relay follows
    /// (`pgwire.custom_settings`).
    pub own_sql: state::OwnSql,
}

impl RelayConfig {
    /// From `[pgwire]` and `origin.url` (which must name a TCP host).
    pub fn from_config(cfg: &Config) -> Result<RelayConfig, ConfigError> {
        let origin = cfg.origin.pg_config()?;
        if origin.addrs().is_empty() {
            return Err(ConfigError::Invalid {
                key: "origin.url",
                reason: "the PostgreSQL front needs a TCP host".into(),
            });
        }
        let pg = origin.pg.clone();
        Ok(RelayConfig {
            origin,
            pool_size: cfg.pgwire.pool_size,
            connect_timeout: Duration::from_millis(cfg.pgwire.connect_timeout_ms),
            max_sessions: cfg.pgwire.max_sessions,
            credentials: pg
                .get_user()
                .zip(pg.get_password())
                .map(|(u, p)| (u.to_owned(), p.to_vec())),
            own_session: Some(pg),
            max_pending_startups: cfg.pgwire.max_pending_startups,
            startup_wait: Duration::from_millis(cfg.pgwire.startup_wait_ms),
            auth_timeout: Duration::from_millis(cfg.pgwire.auth_timeout_ms),
            pool_idle_timeout: Duration::from_millis(cfg.pgwire.pool_idle_timeout_ms),
            pool_wait: Duration::from_millis(cfg.pgwire.pool_wait_ms),
            max_pools: cfg.pgwire.max_pools,
            max_origin_statements: cfg.pgwire.max_origin_statements,
            own_sql: state::OwnSql::new(&cfg.pgwire.custom_settings),
        })
    }
}

/// Where a session's cancel goes.
#[derive(Debug, Clone)]
enum CancelState {
    Idle,
    /// A batch is on its way to a backend; `pending`: a cancel arrived meanwhile.
    Queued {
        pending: bool,
    },
    /// A batch runs on the origin backend with this key.
    Running {
        pid: i32,
        secret: i32,
        gate: Arc<CancelGate>,
    },
}

struct SessionHandle {
    tx: mpsc::UnboundedSender<PgRequest>,
    cancel: Arc<Mutex<CancelState>>,
    key: (i32, i32),
}

/// State shared by the dispatcher and the session tasks.
pub struct RelayState {
    plane: ControlPort,
    /// The query-result cache's leases; landed answers go to the writer through it.
    results: Arc<ResultPlane>,
    cfg: RelayConfig,
    /// Keyed by core, user, database and the startup settings (see `session::Startup`):
    /// clients share origin connections only with clients of the same core that logged in with
    /// the same settings.
    pools: Mutex<HashMap<PoolKey, Arc<pool::Pool>>>,
    sessions: Mutex<HashMap<u64, SessionHandle>>,
    /// pgline's (pid, secret) -> session id.
    keys: Mutex<HashMap<(i32, i32), u64>>,
    next_pid: AtomicI32,
    stats: stats::Stats,
    /// The relay is shutting down: nothing waits for slow clients any more.
    stopping: AtomicBool,
    /// The unreported output settings of pgline's own origin sessions ([`state::UNREPORTED`]),
    /// read once.
    baseline: tokio::sync::OnceCell<state::Baseline>,
    /// The bound on startups in authentication, and the origin-protection counters.
    admission: admit::Admission,
}

/// (core, user, database, startup settings and login state).
type PoolKey = (usize, String, String, String);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl RelayState {
    pub fn new(plane: ControlPort, results: Arc<ResultPlane>, cfg: RelayConfig) -> Arc<RelayState> {
        let admission =
            admit::Admission::new(cfg.max_pending_startups, cfg.startup_wait, cfg.auth_timeout);
        Arc::new(RelayState {
            admission,
            plane,
            results,
            cfg,
            pools: Mutex::default(),
            sessions: Mutex::default(),
            keys: Mutex::default(),
            next_pid: AtomicI32::new(1_000_000),
            stats: stats::Stats::default(),
            stopping: AtomicBool::new(false),
            baseline: tokio::sync::OnceCell::new(),
        })
    }

    /// The pool of a (core, user, database, startup settings), made if new; `None` (counted)
    /// when `max_pools` pools are in use by sessions.
    fn pool(
        &self,
        core: usize,
        user: &str,
        database: &str,
        settings: &str,
    ) -> Option<Arc<pool::Pool>> {
        let key = (
            core,
            user.to_owned(),
            database.to_owned(),
            settings.to_owned(),
        );
        let mut pools = lock(&self.pools);
        if let Some(p) = pools.get(&key) {
            return Some(Arc::clone(p));
        }
        if pools.len() >= self.cfg.max_pools && !self.evict_one(&mut pools) {
            admit::OriginCounters::add(&self.admission.counters.pool_refused, 1);
            return None;
        }
        let p = Arc::new(pool::Pool::new(
            self.cfg.pool_size.div_ceil(self.plane.cores().max(1)),
            Arc::clone(&self.admission.counters),
        ));
        pools.insert(key, Arc::clone(&p));
        Some(p)
    }

    /// Forgets the least recently used pool no session holds (its idle connections are
    /// closed); whether there was one.
    fn evict_one(&self, pools: &mut HashMap<PoolKey, Arc<pool::Pool>>) -> bool {
        // Under the map's lock no session can pick a pool up, so a count of one (the map's
        // own reference) means none holds it, and none will.
        let victim = pools
            .iter()
            .filter(|(_, p)| Arc::strong_count(p) == 1)
            .min_by_key(|(_, p)| p.last_used())
            .map(|(k, _)| k.clone());
        let Some(p) = victim.and_then(|k| pools.remove(&k)) else {
            return false;
        };
        admit::OriginCounters::add(&self.admission.counters.pool_forgotten, 1);
        for b in p.drain() {
            tokio::spawn(b.terminate());
        }
        true
    }

    /// One pass of pool trimming: closes connections idle past `pool_idle_timeout`, drops the
    /// ones the origin closed, and forgets pools left with no connection and no session.
    fn sweep_pools(&self) {
        let now = tokio::time::Instant::now();
        let counters = &self.admission.counters;
        let mut expired = Vec::new();
        {
            let mut pools = lock(&self.pools);
            pools.retain(|_, p| {
                let swept = p.sweep(now, self.cfg.pool_idle_timeout);
                admit::OriginCounters::add(&counters.backend_dead, swept.dead as u64);
                expired.extend(swept.expired);
                let forget = Arc::strong_count(p) == 1 && p.counts().1 == 0;
                if forget {
                    admit::OriginCounters::add(&counters.pool_forgotten, 1);
                }
                !forget
            });
        }
        admit::OriginCounters::add(&counters.backend_idle_closed, expired.len() as u64);
        for b in expired {
            tokio::spawn(b.terminate());
        }
    }

    /// The origin-protection figures (`admit`): startups in authentication, refusals,
    /// timeouts, trimmed connections and pools.
    pub fn origin_stats(&self) -> OriginStats {
        OriginStats {
            pools: lock(&self.pools).len() as u64,
            ..self.admission.stats()
        }
    }

    /// The output settings cached answers were made under: read once over a session of
    /// pgline's own (as fills and the replication stream run); `None` while the origin cannot
    /// tell (no session is then served from cache).
    async fn baseline(&self) -> Option<&state::Baseline> {
        let cfg = self.cfg.own_session.as_ref()?;
        self.baseline
            .get_or_try_init(|| async {
                let (client, conn) = cfg
                    .connect(self.cfg.origin.pg_tls())
                    .await
                    .map_err(|e| e.to_string())?;
                let task = tokio::spawn(conn);
                // The state read clients' backends get, so each setting is read alike.
                let rows = client.simple_query(state::STATE_SQL).await;
                drop(client);
                let _ = task.await;
                let cols: Vec<Option<String>> = rows
                    .map_err(|e| e.to_string())?
                    .iter()
                    .find_map(|m| match m {
                        tokio_postgres::SimpleQueryMessage::Row(r) => {
                            Some((0..r.len()).map(|i| r.get(i).map(str::to_owned)).collect())
                        }
                        _ => None,
                    })
                    .unwrap_or_default();
                let settings = state::OriginState::from_columns(&cols)
                    .map(|s| s.settings)
                    .ok_or_else(|| "the state query returned no state".to_owned())?;
                // Sessions whose values differ are not served from cache: say what they are.
                let listed: Vec<String> = state::UNREPORTED
                    .iter()
                    .zip(&settings)
                    .map(|(n, v)| format!("{n}={v}"))
                    .collect();
                tracing::info!(settings = %listed.join(" "), "pgwire: cached answers are made under");
                Ok::<_, String>(settings)
            })
            .await
            .inspect_err(|e| {
                tracing::warn!(error = %e, "pgwire: cannot read pgline's own session settings");
            })
            .ok()
    }

    /// (idle, total) origin connections of the (user, database) pools, all startup settings.
    pub fn pool_counts(&self, user: &str, database: &str) -> (usize, usize) {
        lock(&self.pools)
            .iter()
            .filter(|((_, u, d, _), _)| u == user && d == database)
            .map(|(_, p)| p.counts())
            .fold((0, 0), |(i, t), (pi, pt)| (i + pi, t + pt))
    }

    /// Origin connections of the (user, database) pools reserved for a session (see `pool`).
    pub fn pool_reserved(&self, user: &str, database: &str) -> usize {
        lock(&self.pools)
            .iter()
            .filter(|((_, u, d, _), _)| u == user && d == database)
            .map(|(_, p)| p.reserved())
            .sum()
    }

    /// Per-statement figures of forwarded batches (normalized text -> stats).
    pub fn statement_stats(&self) -> Vec<(String, StatementStats)> {
        self.stats.snapshot()
    }

    /// Open sessions.
    pub fn sessions(&self) -> usize {
        lock(&self.sessions).len()
    }

    /// Sends a reply to `core` and wakes it (never refused: the plane's full-queue policy;
    /// each session's flow-control window bounds what waits).
    fn push_reply(&self, core: usize, reply: PgReply) {
        self.plane.send_pg_reply(core, reply);
    }

    /// Forgets a session (its task ended); `key` tells it from a later session with the same id.
    fn end_session(&self, id: u64, key: (i32, i32)) {
        let mut sessions = lock(&self.sessions);
        if sessions.get(&id).is_some_and(|h| h.key == key) {
            sessions.remove(&id);
        }
        lock(&self.keys).remove(&key);
    }

    /// Sends a cancel for the batch `session` runs now, or marks it for the batch on its way.
    fn cancel_session(self: &Arc<Self>, id: u64) {
        let slot = match lock(&self.sessions).get(&id) {
            Some(h) => h.cancel.clone(),
            None => return,
        };
        let mut state = lock(&slot);
        match &*state {
            CancelState::Running { pid, secret, gate } => self.spawn_cancel(*pid, *secret, gate),
            CancelState::Queued { .. } => *state = CancelState::Queued { pending: true },
            CancelState::Idle => {}
        }
    }

    /// Sends a cancel at an origin backend; its connection is not pooled again until the
    /// cancel has landed (`gate`).
    fn spawn_cancel(&self, pid: i32, secret: i32, gate: &Arc<CancelGate>) {
        let origin = self.cfg.origin.clone();
        let timeout = self.cfg.connect_timeout;
        let gate = Arc::clone(gate);
        gate.sent();
        tokio::spawn(async move {
            let sent = backend::send_cancel(&origin, &gate.origin, timeout, pid, secret).await;
            let known = match sent {
                CancelSent::Landed => true,
                CancelSent::NotSent(e) => {
                    tracing::warn!(error = %e, "pgwire: cannot send a cancel to the origin");
                    true
                }
                CancelSent::Unknown(e) => {
                    tracing::warn!(error = %e, "pgwire: a cancel to the origin went astray");
                    false
                }
            };
            gate.done(known);
        });
    }

    /// Routes one request from a core.
    fn dispatch(self: &Arc<Self>, req: PgRequest) {
        match req.kind {
            PgRequestKind::Cancel => {
                let Some((pid, secret)) = parse_cancel(&req.messages) else {
                    return;
                };
                let session = lock(&self.keys).get(&(pid, secret)).copied();
                if let Some(id) = session {
                    self.cancel_session(id);
                }
            }
            PgRequestKind::Startup => self.start_session(req),
            kind => {
                let sessions = lock(&self.sessions);
                match sessions.get(&req.session) {
                    Some(h) => {
                        if kind == PgRequestKind::Batch {
                            *lock(&h.cancel) = CancelState::Queued { pending: false };
                        }
                        if kind == PgRequestKind::Close {
                            // Whatever still runs for a client that left is cancelled.
                            if let CancelState::Running { pid, secret, gate } = &*lock(&h.cancel) {
                                self.spawn_cancel(*pid, *secret, gate);
                            }
                        }
                        let _ = h.tx.send(req);
                    }
                    None if kind == PgRequestKind::Close => {}
                    None => {
                        let this = self.clone();
                        tokio::spawn(async move { session::refuse_unknown(&this, req).await });
                    }
                }
            }
        }
    }

    fn start_session(self: &Arc<Self>, req: PgRequest) {
        let pid = self.next_pid.fetch_add(1, Ordering::Relaxed);
        let secret = random_i32();
        let cancel = Arc::new(Mutex::new(CancelState::Idle));
        let (tx, rx) = mpsc::unbounded_channel();
        let id = req.session;
        {
            let mut sessions = lock(&self.sessions);
            if sessions.len() >= self.cfg.max_sessions {
                let this = self.clone();
                tokio::spawn(async move { session::refuse_full(&this, req).await });
                return;
            }
            sessions.insert(
                id,
                SessionHandle {
                    tx: tx.clone(),
                    cancel: cancel.clone(),
                    key: (pid, secret),
                },
            );
        }
        lock(&self.keys).insert((pid, secret), id);
        let _ = tx.send(req);
        let this = self.clone();
        tokio::spawn(async move {
            session::Session::new(this.clone(), id, (pid, secret), cancel)
                .run(rx)
                .await;
            this.end_session(id, (pid, secret));
        });
    }

    /// Dispatches what core `core` sent.
    fn drain_core(self: &Arc<Self>, core: usize) {
        while let Some(req) = self.plane.recv_pg_request(core) {
            self.dispatch(req);
        }
    }

    /// Dispatches what the cores that do not host the relay sent.
    fn drain(self: &Arc<Self>) {
        for core in 0..self.plane.cores() {
            if !self.plane.pg_hosted(core) {
                self.drain_core(core);
            }
        }
    }

    /// Offers the relay to the cores, to run on their own threads ([`CoreRelay`]), with the
    /// PostgreSQL lookups' fills when given (`crate::corefill`); call before the cores start.
    /// Cores that do not take it are served by [`run`] (and their misses by the writer).
    pub fn host_on_cores(self: &Arc<Self>, fills: Option<&Arc<CoreFills>>) {
        self.plane.set_pg_host(Arc::new(CoreRelay {
            relay: Arc::downgrade(self),
            fills: fills.map(Arc::downgrade),
        }));
    }
}

/// The relay as a core runs it on its own thread (see the module doc), with the core's fills.
/// Weak: the plane holds the host and the relay (and the fills) hold the plane, so a strong
/// reference would keep both, and every pooled origin connection, alive after pgline is
/// dropped.
pub struct CoreRelay {
    relay: std::sync::Weak<RelayState>,
    fills: Option<std::sync::Weak<CoreFills>>,
}

impl PgHost for CoreRelay {
    fn drain(&self, core: usize) {
        if let Some(relay) = self.relay.upgrade() {
            relay.drain_core(core);
        }
        if let Some(fills) = self.fills.as_ref().and_then(std::sync::Weak::upgrade) {
            fills.start(core);
        }
    }

    fn takes_fills(&self) -> bool {
        self.fills.is_some()
    }

    fn fill(&self, core: usize, request: MissRequest) -> Result<(), MissRequest> {
        match self.fills.as_ref().and_then(std::sync::Weak::upgrade) {
            Some(fills) => fills.take(core, request),
            None => Err(request),
        }
    }
}

/// How often the pools are swept: every second, or twice per idle timeout when shorter.
fn sweep_period(idle_timeout: Duration) -> Duration {
    (idle_timeout / 2).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

/// (pid, secret) of a 16-byte CancelRequest.
fn parse_cancel(m: &[u8]) -> Option<(i32, i32)> {
    if m.len() != 16 || m[4..8] != 80_877_102i32.to_be_bytes() {
        return None;
    }
    let pid = i32::from_be_bytes(m[8..12].try_into().ok()?);
    let secret = i32::from_be_bytes(m[12..16].try_into().ok()?);
    Some((pid, secret))
}

/// A cancel secret: SipHash under the process's random keys (`RandomState`) of a counter and
/// the time; not guessable from outside without those keys.
fn random_i32() -> i32 {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(N.fetch_add(1, Ordering::Relaxed));
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    h.finish() as i32
}

/// The relay's loop: drains the cores' PostgreSQL requests when `wake` fires (the control
/// waker) and every 20 ms, until `shutdown`. Open sessions end when it returns.
pub async fn run(state: Arc<RelayState>, wake: Arc<Notify>, mut shutdown: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sweep = tokio::time::interval(sweep_period(state.cfg.pool_idle_timeout));
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.changed() => break,
            _ = wake.notified() => state.drain(),
            _ = tick.tick() => state.drain(),
            _ = sweep.tick() => state.sweep_pools(),
        }
    }
    state.stopping.store(true, Ordering::Relaxed);
    lock(&state.sessions).clear();
}

/// Warns once, at start, when the origin database's policies or functions name custom settings
/// that `listed` (`pgwire.custom_settings`) lacks (what `pgline check` reports): a function that
/// sets one unseen hands it to the next session of its pool. Quiet when the origin cannot be
/// read (start-up reports that elsewhere).
pub async fn warn_unlisted_custom_settings(state: Arc<RelayState>, listed: Vec<String>) {
    let Some(cfg) = state.cfg.own_session.as_ref() else {
        return;
    };
    let Ok((client, conn)) = cfg.connect(state.cfg.origin.pg_tls()).await else {
        return;
    };
    let task = tokio::spawn(conn);
    let rows = client.query(state::CUSTOM_SETTING_NAMES_SQL, &[]).await;
    drop(client);
    let _ = task.await;
    let found: Vec<String> = match rows {
        Ok(rows) => rows.iter().filter_map(|r| r.try_get(0).ok()).collect(),
        Err(e) => {
            tracing::debug!(error = %e, "pgwire: custom settings not looked for");
            return;
        }
    };
    let missing = unlisted_custom_settings(&found, &listed);
    if !missing.is_empty() {
        tracing::warn!(
            unlisted = %missing.join(", "),
            "pgwire: policies or functions of the origin database use custom settings that \
             pgwire.custom_settings does not list; one a function sets with set_config(.., false) \
             reaches the next session of its pool (see docs/pgwire.md)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cancel_requests_parse() {
        let mut m = Vec::new();
        m.extend_from_slice(&16i32.to_be_bytes());
        m.extend_from_slice(&80_877_102i32.to_be_bytes());
        m.extend_from_slice(&7i32.to_be_bytes());
        m.extend_from_slice(&(-9i32).to_be_bytes());
        assert_eq!(parse_cancel(&m), Some((7, -9)));
        assert_eq!(parse_cancel(&m[..12]), None);
        m[7] = 0;
        assert_eq!(parse_cancel(&m), None);
        assert_ne!(random_i32(), random_i32());
    }
}
