//! Starting and stopping a whole pgline: origin pool and catalog, store, WAL consumer, writer,
//! dataplane cores. Used by the `pgline serve` binary and, in-process, by the integration tests.
//!
//! A running [`Pgline`] is shareable (`Arc<Pgline>`): every method takes `&self`, including
//! [`Pgline::shutdown`]. Its admin operations (tables, flushes, key info, config) live in
//! `crate::admin::ops`.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use pgline_dataplane::engine::Engine;
use pgline_dataplane::keyspace::KeySpaceCell;
use pgline_dataplane::plane::{Shared, Wake};
use pgline_nic::mem::{MemConfig, MemQueue};
use tokio::sync::{mpsc, oneshot, watch, Notify};

use crate::admin::TableStates;
use crate::catalog::{Catalog, CatalogCell, CatalogError};
use crate::config::{Config, ConfigError, NicMode, Runtime};
use crate::pgfront::{RelayConfig, RelayState};
use crate::wal::{self, PublicationScope, ReplicationState, WalConfig};
use crate::writer::{AdminCmd, EntryCounts, Writer, WriterParts};

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The configured client transport (`nic.mode`) cannot start in this build or setup.
    #[error("nic: {0}")]
    Nic(String),
    #[error("origin unreachable: {0}")]
    Origin(String),
    #[error("origin has wal_level={0}; pgline needs wal_level=logical (set it in postgresql.conf and restart PostgreSQL)")]
    WalLevel(String),
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    #[error("store: {0}")]
    Store(String),
    #[error("cannot listen on {addr} (api.listen): {source}")]
    ApiListen {
        addr: String,
        source: std::io::Error,
    },
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: String,
        source: std::io::Error,
    },
}

/// The control waker: wakes the store writer (misses) and the PostgreSQL relay (pg requests).
struct NotifyWake(Vec<Arc<Notify>>);

impl Wake for NotifyWake {
    fn wake(&self) {
        for n in &self.0 {
            n.notify_one();
        }
    }
}

/// Replaces the process's log filter (installed by whoever set up `tracing`).
pub type LogReload = Box<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

/// A running pgline, shared (`Arc`) between its owner and the HTTP API.
pub struct Pgline {
    pub shared: Arc<Shared>,
    pub repl: Arc<ReplicationState>,
    /// The catalog as the store writer last published it (tables added or removed at run time
    /// included).
    pub catalog: Arc<CatalogCell>,
    pub(crate) admin: mpsc::Sender<AdminCmd>,
    pub(crate) pool: deadpool_postgres::Pool,
    /// The effective config, secrets included (redacted only on the way out).
    pub(crate) cfg: RwLock<Config>,
    pub(crate) runtime: Arc<Runtime>,
    /// States of tables added at run time (warming progress).
    pub(crate) states: Arc<TableStates>,
    /// Whether the catalog is the configured table list (not every table with a key): tables
    /// added or removed at run time are then added to or removed from `catalog.tables`.
    pub(crate) table_list: bool,
    /// Entries per table, as the writer last counted them.
    pub(crate) entry_counts: Arc<EntryCounts>,
    pub(crate) log_reload: RwLock<Option<LogReload>>,
    /// Serializes add/remove/config changes (each is a read-check-write over several parts).
    pub(crate) admin_lock: tokio::sync::Mutex<()>,
    pub(crate) shutdown: watch::Sender<bool>,
    engine: Mutex<Option<Engine>>,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    local_addr: SocketAddr,
    started_at: Instant,
    /// `nic.mode = "mem"`: the far end of each core's in-memory port.
    mem_ports: Mutex<Vec<MemQueue>>,
    api_addr: Option<SocketAddr>,
    /// The PostgreSQL listener of core 0 (`[pgwire]`), None when the front is off.
    pg_addr: Option<SocketAddr>,
    /// The PostgreSQL relay, None when the front is off.
    pg_relay: Option<Arc<RelayState>>,
}

impl Pgline {
    /// Starts everything; returns once the RESP listeners and the API listener are bound.
    pub async fn start(cfg: Config) -> Result<Arc<Pgline>, StartError> {
        check_transport(&cfg)?;
        let pg = cfg.origin.pg_config()?;
        let mgr = deadpool_postgres::Manager::from_config(
            pg.clone(),
            crate::origin::pg_tls(),
            deadpool_postgres::ManagerConfig {
                recycling_method: deadpool_postgres::RecyclingMethod::Fast,
            },
        );
        let pool = deadpool_postgres::Pool::builder(mgr)
            .max_size(cfg.origin.pool_size)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .create_timeout(Some(Duration::from_millis(cfg.origin.connect_timeout_ms)))
            .wait_timeout(Some(Duration::from_millis(cfg.origin.query_timeout_ms)))
            .build()
            .map_err(|e| StartError::Origin(e.to_string()))?;
        let client = pool
            .get()
            .await
            .map_err(|e| StartError::Origin(e.to_string()))?;
        let level: String = client
            .query_one("SHOW wal_level", &[])
            .await
            .map_err(|e| StartError::Origin(e.to_string()))?
            .get(0);
        if level != "logical" {
            return Err(StartError::WalLevel(level));
        }
        let catalog = Catalog::load(&client, &cfg.catalog).await?;
        // The publication lists exactly the cached tables (issue 11, O1; see `wal::slot`).
        let scope =
            PublicationScope::Tables(catalog.tables.values().map(|t| t.qualified()).collect());
        wal::slot::set_publication(&client, &cfg.replication.publication, &scope)
            .await
            .map_err(|e| StartError::Origin(format!("publication: {e}")))?;
        drop(client);
        tracing::info!(tables = catalog.tables.len(), "catalog loaded");

        let (store, reader) = pgline_dataplane::store::open(&cfg.store())
            .map_err(|e| StartError::Store(e.to_string()))?;
        let st = store.stats();
        tracing::info!(
            budget = st.budget_bytes,
            page_level = %st.page_level,
            pages = st.pages,
            "store region reserved"
        );
        let wake = Arc::new(Notify::new());
        let pg_wake = Arc::new(Notify::new());
        let shared = Arc::new(Shared::new(
            reader,
            KeySpaceCell::new(catalog.keyspace()),
            cfg.resp.cores,
            cfg.resp.miss_queue,
            Arc::new(NotifyWake(vec![wake.clone(), pg_wake.clone()])),
        ));
        let repl = Arc::new(ReplicationState::default());
        let (shutdown, shutdown_rx) = watch::channel(false);
        let (wal_tx, wal_rx) = mpsc::channel(1024);
        let (admin_tx, admin_rx) = mpsc::channel(64);

        let table_list = !cfg.catalog.tables.is_empty();
        let wal_cfg = WalConfig {
            slot: cfg.replication.slot.clone(),
            publication: cfg.replication.publication.clone(),
            publication_scope: scope,
            status_interval: Duration::from_millis(cfg.replication.status_interval_ms),
            keepalive_request_interval: Duration::from_millis(100),
            reconnect_backoff: Duration::from_millis(cfg.replication.reconnect_backoff_ms),
        };
        let mut tasks = Vec::new();
        tasks.push(tokio::spawn(wal::run_consumer(
            pg,
            wal_cfg,
            repl.clone(),
            wal_tx,
            shutdown_rx.clone(),
        )));
        let runtime = Arc::new(Runtime::new(&cfg));
        let catalog_cell = Arc::new(CatalogCell::new(catalog.clone()));
        let entry_counts = Arc::new(EntryCounts::default());
        let writer = Writer::new(
            store,
            catalog,
            WriterParts {
                cfg: cfg.clone(),
                shared: shared.clone(),
                pool: pool.clone(),
                repl: repl.clone(),
                runtime: runtime.clone(),
                catalog_cell: catalog_cell.clone(),
                entry_counts: entry_counts.clone(),
            },
        );
        let pg_relay = match cfg.pgwire.enabled.then(|| RelayConfig::from_config(&cfg)) {
            Some(Ok(relay_cfg)) => {
                let relay = RelayState::new(shared.clone(), relay_cfg);
                tasks.push(tokio::spawn(crate::pgfront::run(
                    relay.clone(),
                    pg_wake,
                    shutdown_rx.clone(),
                )));
                Some(relay)
            }
            Some(Err(e)) => {
                // A Unix-socket-only origin: RESP still works; PostgreSQL clients get no relay.
                tracing::warn!(error = %e, "pgwire relay not started");
                None
            }
            None => None,
        };
        tasks.push(tokio::spawn(crate::metrics::run_auth_log(
            shared.clone(),
            shutdown_rx.clone(),
        )));
        tasks.push(tokio::spawn(writer.run(
            wake,
            wal_rx,
            admin_rx,
            shutdown_rx,
        )));

        let (engine, mem_ports) = start_engine(&cfg, shared.clone())?;
        let local_addr = engine.local_addr();
        let pg_addr = engine.pg_local_addr();
        tracing::info!(%local_addr, cores = cfg.resp.cores, nic = %cfg.nic.mode, "RESP listening");
        let api_listener = if cfg.api.enabled {
            let l = crate::api::bind(&cfg.api)
                .await
                .map_err(|source| StartError::ApiListen {
                    addr: cfg.api.listen.clone(),
                    source,
                })?;
            Some(l)
        } else {
            None
        };
        let api_addr = api_listener.as_ref().and_then(|l| l.local_addr().ok());
        let api_cfg = cfg.api.clone();
        let pgline = Arc::new(Pgline {
            shared,
            repl,
            catalog: catalog_cell,
            entry_counts,
            table_list,
            admin: admin_tx,
            pool,
            cfg: RwLock::new(cfg),
            runtime,
            states: Arc::default(),
            log_reload: RwLock::new(None),
            admin_lock: tokio::sync::Mutex::new(()),
            shutdown,
            engine: Mutex::new(Some(engine)),
            tasks: Mutex::new(tasks),
            local_addr,
            started_at: Instant::now(),
            mem_ports: Mutex::new(mem_ports),
            api_addr,
            pg_addr,
            pg_relay,
        });
        if let Some(listener) = api_listener {
            tracing::info!(
                addr = ?api_addr,
                token = api_cfg.token().is_some(),
                open_reads = api_cfg.open_reads,
                "HTTP API listening"
            );
            let task = tokio::spawn(crate::api::serve(
                listener,
                Arc::downgrade(&pgline),
                api_cfg,
                pgline.shutdown.subscribe(),
            ));
            pgline.lock_tasks().push(task);
        }
        Ok(pgline)
    }

    /// `nic.mode = "mem"`: the far ends of the cores' in-memory ports (core `i`'s at `i`), for a
    /// test or bench client stack to drive; empty for other modes or once taken.
    pub fn take_mem_ports(&self) -> Vec<MemQueue> {
        std::mem::take(&mut *self.mem_ports.lock().unwrap_or_else(|e| e.into_inner()))
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Whether the origin answers `SELECT 1` on a pooled connection within `timeout` (the
    /// readiness probe); the error says what failed.
    pub async fn probe_origin(&self, timeout: Duration) -> Result<(), String> {
        let probe = async {
            let client = self.pool.get().await.map_err(|e| e.to_string())?;
            client
                .simple_query("SELECT 1")
                .await
                .map(drop)
                .map_err(|e| e.to_string())
        };
        tokio::time::timeout(timeout, probe)
            .await
            .map_err(|_| format!("no answer within {} ms", timeout.as_millis()))?
    }

    /// The bound PostgreSQL listener address of core 0; None with `pgwire.enabled = false`.
    pub fn pg_addr(&self) -> Option<SocketAddr> {
        self.pg_addr
    }

    /// The PostgreSQL relay (pool and session counts, for tests and diagnostics); None with
    /// `pgwire.enabled = false`.
    pub fn pg_relay(&self) -> Option<&Arc<RelayState>> {
        self.pg_relay.as_ref()
    }

    /// The HTTP API's address; None with `api.enabled = false`.
    pub fn api_addr(&self) -> Option<SocketAddr> {
        self.api_addr
    }

    fn lock_tasks(&self) -> std::sync::MutexGuard<'_, Vec<tokio::task::JoinHandle<()>>> {
        self.tasks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Time since [`Pgline::start`] returned.
    pub fn uptime(&self) -> Duration {
        self.started_at.elapsed()
    }

    /// The LSN up to which WAL changes are applied to the store.
    pub fn applied_lsn(&self) -> u64 {
        self.repl.applied_lsn.load(Ordering::Acquire)
    }

    /// Waits until hits are served (stream up, lag under the bound) or `timeout` passes.
    pub async fn wait_serving(&self, timeout: Duration) -> bool {
        let until = Instant::now() + timeout;
        while Instant::now() < until {
            if self.shared.serve_hits.load(Ordering::Acquire) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }

    /// Waits until the applied LSN reaches `lsn`.
    pub async fn wait_applied(&self, lsn: u64, timeout: Duration) -> bool {
        let until = Instant::now() + timeout;
        while Instant::now() < until {
            if self.applied_lsn() >= lsn {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        false
    }

    pub async fn flush_all(&self) -> u64 {
        let (tx, rx) = oneshot::channel();
        let _ = self.admin.send(AdminCmd::FlushAll(tx)).await;
        rx.await.unwrap_or(0)
    }

    /// Every cached entry.
    pub async fn dump(&self) -> Vec<crate::writer::DumpedEntry> {
        let (tx, rx) = oneshot::channel();
        let _ = self.admin.send(AdminCmd::Dump(tx)).await;
        rx.await.unwrap_or_default()
    }

    /// Stops the cores and the control-plane tasks (the API among them). A second call, or one
    /// racing the first, finds nothing left to stop.
    pub async fn shutdown(&self) {
        let engine = self.engine.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(engine) = engine {
            tokio::task::spawn_blocking(move || engine.stop())
                .await
                .ok();
        }
        let _ = self.shutdown.send(true);
        let tasks: Vec<_> = self.lock_tasks().drain(..).collect();
        for t in tasks {
            let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
        }
    }
}

/// Refuses, before anything starts, a client transport this build or setup cannot run.
fn check_transport(cfg: &Config) -> Result<(), StartError> {
    let port = cfg.engine().listen.port();
    match cfg.nic.mode {
        NicMode::Kernel => Ok(()),
        NicMode::Dpdk if !cfg!(feature = "dpdk") => Err(StartError::Nic(
            "nic.mode = \"dpdk\" but pgline was built without the dpdk feature \
             (rebuild with `cargo build --release --features dpdk`; needs libdpdk-dev >= 22.11)"
                .into(),
        )),
        NicMode::Dpdk | NicMode::Mem if port == 0 => Err(StartError::Nic(
            "the userspace stack listens on resp.listen's port, which must not be 0".into(),
        )),
        NicMode::Dpdk | NicMode::Mem => Ok(()),
    }
}

/// Starts the dataplane cores on the configured client transport. For `nic.mode = "mem"` also
/// returns the far ends of the in-memory ports, one per core, for the caller to drive.
fn start_engine(cfg: &Config, shared: Arc<Shared>) -> Result<(Engine, Vec<MemQueue>), StartError> {
    check_transport(cfg)?;
    let listen_error = |source| StartError::Listen {
        addr: cfg.resp.listen.clone(),
        source,
    };
    let mut engine_cfg = cfg.engine();
    match cfg.nic.mode {
        NicMode::Kernel => Ok((
            Engine::start(engine_cfg, shared).map_err(listen_error)?,
            Vec::new(),
        )),
        NicMode::Mem => {
            let ip = cfg
                .nic
                .ipv4()
                .expect("validated: nic.ip is set in mem mode");
            engine_cfg.listen = SocketAddr::new(ip.into(), engine_cfg.listen.port());
            let net = cfg
                .nic
                .net_config(engine_cfg.max_connections_per_core())
                .expect("validated: nic.ip is set in mem mode");
            let (ports, far_ends) = (0..cfg.resp.cores)
                .map(|_| pgline_nic::mem::pair(MemConfig::default()))
                .unzip();
            let engine =
                Engine::start_userspace(engine_cfg, shared, ports, net).map_err(listen_error)?;
            Ok((engine, far_ends))
        }
        NicMode::Dpdk => start_dpdk(cfg, engine_cfg, shared).map(|e| (e, Vec::new())),
    }
}

/// `nic.mode = "dpdk"`: the cores run the userspace stack on the DPDK port's queue pairs.
#[cfg(feature = "dpdk")]
fn start_dpdk(
    cfg: &Config,
    mut engine_cfg: pgline_dataplane::engine::EngineConfig,
    shared: Arc<Shared>,
) -> Result<Engine, StartError> {
    let ip = cfg
        .nic
        .ipv4()
        .expect("validated: nic.ip is set in dpdk mode");
    engine_cfg.listen = SocketAddr::new(ip.into(), engine_cfg.listen.port());
    let net = cfg
        .nic
        .net_config(engine_cfg.max_connections_per_core())
        .expect("validated: nic.ip is set in dpdk mode");
    let queues = crate::dpdk_port::open_queues(&cfg.nic, cfg.resp.cores)?;
    Engine::start_userspace(engine_cfg, shared, queues, net).map_err(|source| StartError::Listen {
        addr: cfg.resp.listen.clone(),
        source,
    })
}

#[cfg(not(feature = "dpdk"))]
fn start_dpdk(
    _: &Config,
    _: pgline_dataplane::engine::EngineConfig,
    _: Arc<Shared>,
) -> Result<Engine, StartError> {
    unreachable!("check_transport refuses nic.mode = dpdk without the dpdk feature")
}
