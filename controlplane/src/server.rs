//! The composition root: starting and stopping a whole pgline (origin pool and catalog, store,
//! plane, WAL consumer, writer, PostgreSQL relay, dataplane cores, HTTP API). Used by the
//! `pgline serve` binary and, in-process, by the integration tests.
//!
//! Only this module knows how the parts are wired; no other module of the crate imports it.
//! The node's operations (views, tables, flushes, config) are the [`Admin`] service, which the
//! API holds; a running [`Pgline`] owns the service and what must be stopped (cores, tasks).
//!
//! A running [`Pgline`] is shareable (`Arc<Pgline>`): every method takes `&self`, including
//! [`Pgline::shutdown`]. It dereferences to its [`Admin`], so `pgline.add_table(..)` and
//! `pgline.shared` read as operations and views of the node.

use std::net::SocketAddr;
use std::ops::Deref;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pgline_dataplane::engine::{Engine, EngineConfig};
use pgline_dataplane::keyspace::KeySpaceCell;
use pgline_dataplane::plane::{ControlWakers, Shared, Wake};
use pgline_dataplane::store::StoreWriter;
use pgline_nic::mem::{MemConfig, MemQueue};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch, Notify};
use tokio::task::JoinHandle;

pub use crate::admin::LogReload;
use crate::admin::{Admin, AdminParts};
use crate::catalog::{Catalog, CatalogCell, CatalogError};
use crate::config::{Config, ConfigError, FrontTls, NicMode, Runtime};
use crate::corefill::{CoreFills, FILLS_PER_CORE};
use crate::fill::AppliedXids;
use crate::metrics::NicCounters;
use crate::pgfront::{RelayConfig, RelayState};
use crate::result_plane::ResultPlane;
use crate::wal::{self, PublicationScope, ReplicationState, WalConfig};
use crate::writer::{AdminCmd, EntryCounts, Writer, WriterParts};

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The configured client transport (`nic.mode`) cannot start in this build or setup.
    #[error("nic: {0}")]
    Nic(String),
    /// The DPDK client port could not be brought up.
    #[cfg(feature = "dpdk")]
    #[error("nic: {0}")]
    Dpdk(#[from] crate::dpdk_port::DpdkError),
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

/// Wakes one control-plane consumer (the store writer, or the PostgreSQL relay).
struct NotifyWake(Arc<Notify>);

impl Wake for NotifyWake {
    fn wake(&self) {
        self.0.notify_one();
    }
}

/// A running pgline, shared (`Arc`) between its owner and the tests; the HTTP API holds only
/// its [`Admin`] service.
pub struct Pgline {
    admin: Arc<Admin>,
    shutdown: watch::Sender<bool>,
    engine: Mutex<Option<Engine>>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    local_addr: SocketAddr,
    /// The RESP TLS listener's address (`resp.tls_listen`, port 0 resolved).
    tls_addr: Option<SocketAddr>,
    /// `nic.mode = "mem"`: the far end of each core's in-memory port.
    mem_ports: Mutex<Vec<MemQueue>>,
    api_addr: Option<SocketAddr>,
    /// The cores' PostgreSQL-front fills, owned here (the relay host holds them weakly).
    _core_fills: Option<Arc<CoreFills>>,
}

impl Deref for Pgline {
    type Target = Admin;

    fn deref(&self) -> &Admin {
        &self.admin
    }
}

/// The origin as the node starts on it: the pool, the catalog and the publication's scope.
struct Origin {
    pg: crate::origin::Settings,
    pool: deadpool_postgres::Pool,
    catalog: Catalog,
    scope: PublicationScope,
}

/// The control plane's tasks and what the admin service needs of them.
struct ControlPlane {
    tasks: Vec<JoinHandle<()>>,
    writer: mpsc::Sender<AdminCmd>,
    repl: Arc<ReplicationState>,
    catalog: Arc<CatalogCell>,
    runtime: Arc<Runtime>,
    entry_counts: Arc<EntryCounts>,
    pg_relay: Option<Arc<RelayState>>,
    /// Owns the cores' fills (the relay host holds them weakly).
    core_fills: Option<Arc<CoreFills>>,
}

/// The cores, started on their transport.
struct Cores {
    engine: Engine,
    /// `nic.mode = "mem"`: the far ends of the in-memory ports.
    mem_ports: Vec<MemQueue>,
    /// `nic.mode = "dpdk"`: the port's device counters.
    nic: Vec<Arc<dyn NicCounters>>,
}

impl Pgline {
    /// Starts everything; returns once the RESP listeners and the API listener are bound.
    pub async fn start(cfg: Config) -> Result<Arc<Pgline>, StartError> {
        check_transport(&cfg)?;
        let origin = connect_origin(&cfg).await?;
        let (store, reader) = open_store(&cfg)?;
        let writer_wake = Arc::new(Notify::new());
        let relay_wake = Arc::new(Notify::new());
        let shared = Arc::new(Shared::new(
            reader,
            KeySpaceCell::new(origin.catalog.keyspace()),
            cfg.resp.cores,
            cfg.resp.miss_queue,
            ControlWakers {
                misses: Arc::new(NotifyWake(writer_wake.clone())),
                pg: Arc::new(NotifyWake(relay_wake.clone())),
            },
        ));
        // Cluster mode (issue 17): the topology of the configuration, every node taken as
        // healthy.
        let topology = cfg.cluster.topology(|_| true, 1)?;
        shared.control_port().publish_topology(topology);
        let (shutdown, shutdown_rx) = watch::channel(false);
        let pool = origin.pool.clone();
        let control = start_control_plane(
            &cfg,
            origin,
            store,
            &shared,
            (writer_wake, relay_wake),
            &shutdown_rx,
        );
        let tls = FrontTls::new(&cfg)
            .map_err(|e| ConfigError::Invalid {
                key: "tls",
                reason: e.to_string(),
            })?
            .map(Arc::new);
        let core_fills = control.core_fills.clone();
        let cores = start_cores(&cfg, shared.clone(), tls.as_deref())?;
        let local_addr = cores.engine.local_addr();
        let tls_addr = cores.engine.tls_local_addr();
        tracing::info!(%local_addr, cores = cfg.resp.cores, nic = %cfg.nic.mode, "RESP listening");
        let api_listener = bind_api(&cfg).await?;
        let api_cfg = cfg.api.clone();
        // The `[cluster]` section as the health task and the admin service share it: changed
        // by `PUT /v1/cluster`, followed by the task.
        let cluster = cfg.cluster.enabled().then(|| {
            let (tx, rx) = watch::channel(cfg.cluster.clone());
            (tx, rx, shared.control_port())
        });
        let cluster_tx = cluster.as_ref().map(|c| c.0.clone());
        let admin = Arc::new(Admin::new(AdminParts {
            shared,
            repl: control.repl,
            catalog: control.catalog,
            writer: control.writer,
            pool,
            cfg,
            runtime: control.runtime,
            entry_counts: control.entry_counts,
            shutdown: shutdown_rx,
            pg_relay: control.pg_relay,
            pg_addr: cores.engine.pg_local_addr(),
            nic: cores.nic,
            tls,
            cluster: cluster_tx,
        }));
        let pgline = Arc::new(Pgline {
            admin,
            shutdown,
            engine: Mutex::new(Some(cores.engine)),
            tasks: Mutex::new(control.tasks),
            local_addr,
            tls_addr,
            mem_ports: Mutex::new(cores.mem_ports),
            api_addr: api_listener.as_ref().and_then(|l| l.local_addr().ok()),
            _core_fills: core_fills,
        });
        if let Some(listener) = api_listener {
            tracing::info!(
                addr = ?pgline.api_addr,
                token = api_cfg.token().is_some(),
                open_reads = api_cfg.open_reads,
                "HTTP API listening"
            );
            let task = tokio::spawn(crate::api::serve(
                listener,
                Arc::downgrade(&pgline.admin),
                api_cfg,
                pgline.shutdown.subscribe(),
            ));
            pgline.lock_tasks().push(task);
        }
        if let Some((_, configs, plane)) = cluster {
            let task = tokio::spawn(crate::cluster::watch_health(
                configs,
                plane,
                pgline.shutdown.subscribe(),
            ));
            pgline.lock_tasks().push(task);
        }
        Ok(pgline)
    }

    /// The node's admin service (what the HTTP API serves).
    pub fn admin(&self) -> &Arc<Admin> {
        &self.admin
    }

    /// `nic.mode = "mem"`: the far ends of the cores' in-memory ports (core `i`'s at `i`), for a
    /// test or bench client stack to drive; empty for other modes or once taken.
    pub fn take_mem_ports(&self) -> Vec<MemQueue> {
        std::mem::take(&mut *self.mem_ports.lock().unwrap_or_else(|e| e.into_inner()))
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The RESP TLS listener's address; None without `resp.tls_listen`.
    pub fn tls_addr(&self) -> Option<SocketAddr> {
        self.tls_addr
    }

    /// The HTTP API's address; None with `api.enabled = false`.
    pub fn api_addr(&self) -> Option<SocketAddr> {
        self.api_addr
    }

    fn lock_tasks(&self) -> std::sync::MutexGuard<'_, Vec<JoinHandle<()>>> {
        self.tasks.lock().unwrap_or_else(|p| p.into_inner())
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

/// Opens the origin pool, checks `wal_level`, loads the catalog and sets the publication to
/// exactly the cached tables (issue 11, O1; see `wal::slot`).
async fn connect_origin(cfg: &Config) -> Result<Origin, StartError> {
    let pg = cfg.origin.pg_config()?;
    let mgr = deadpool_postgres::Manager::from_config(
        pg.pg.clone(),
        pg.pg_tls(),
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
        .map_err(|e| StartError::Origin(crate::origin::describe_error(&e)))?;
    let level: String = client
        .query_one("SHOW wal_level", &[])
        .await
        .map_err(|e| StartError::Origin(e.to_string()))?
        .get(0);
    if level != "logical" {
        return Err(StartError::WalLevel(level));
    }
    let catalog = Catalog::load(&client, &cfg.catalog).await?;
    let scope = PublicationScope::Tables(catalog.tables.values().map(|t| t.qualified()).collect());
    wal::slot::set_publication(&client, &cfg.replication.publication, &scope)
        .await
        .map_err(|e| StartError::Origin(format!("publication: {e}")))?;
    drop(client);
    tracing::info!(tables = catalog.tables.len(), "catalog loaded");
    Ok(Origin {
        pg,
        pool,
        catalog,
        scope,
    })
}

/// Reserves the store's region.
fn open_store(
    cfg: &Config,
) -> Result<(StoreWriter, pgline_dataplane::store::StoreReader), StartError> {
    let (store, reader) = pgline_dataplane::store::open(&cfg.store())
        .map_err(|e| StartError::Store(e.to_string()))?;
    let st = store.stats();
    tracing::info!(
        budget = st.budget_bytes,
        page_level = %st.page_level,
        pages = st.pages,
        "store region reserved"
    );
    Ok((store, reader))
}

/// Spawns the control plane's tasks: the WAL consumer, the store writer, the PostgreSQL relay
/// (when `[pgwire]` is on and the origin is reachable over TCP) and the AUTH-failure log.
fn start_control_plane(
    cfg: &Config,
    origin: Origin,
    store: StoreWriter,
    shared: &Arc<Shared>,
    (writer_wake, relay_wake): (Arc<Notify>, Arc<Notify>),
    shutdown: &watch::Receiver<bool>,
) -> ControlPlane {
    let Origin {
        pg,
        pool,
        catalog,
        scope,
    } = origin;
    let repl = Arc::new(ReplicationState::default());
    // One pool of fill connections per core for the PostgreSQL front's misses
    // (`crate::corefill`), opened lazily on the core's own runtime.
    let fill_pools: Vec<deadpool_postgres::Pool> = (0..cfg.resp.cores)
        .filter_map(|_| fill_pool(cfg, &pg))
        .collect();
    let (core_reads_tx, core_reads_rx) = mpsc::channel(crate::writer::CORE_READS_QUEUED);
    let (wal_tx, wal_rx) = mpsc::channel(1024);
    let (admin_tx, admin_rx) = mpsc::channel(64);
    let wal_cfg = WalConfig {
        slot: cfg.replication.slot.clone(),
        publication: cfg.replication.publication.clone(),
        publication_scope: scope,
        status_interval: Duration::from_millis(cfg.replication.status_interval_ms),
        keepalive_request_interval: Duration::from_millis(100),
        reconnect_backoff: Duration::from_millis(cfg.replication.reconnect_backoff_ms),
        max_txn_memory: cfg.replication.max_txn_memory,
    };
    // Validated when the config was loaded.
    let replication = cfg.replication_pg_config().ok().flatten();
    // The relay starts relayed logins on the host the replication stream last found read-write.
    let primary = pg.primary.clone();
    let mut tasks = vec![tokio::spawn(wal::run_consumer_from(
        pg,
        replication,
        wal_cfg,
        repl.clone(),
        wal_tx,
        shutdown.clone(),
    ))];
    let runtime = Arc::new(Runtime::new(cfg));
    let catalog_cell = Arc::new(CatalogCell::new(catalog.clone()));
    let entry_counts = Arc::new(EntryCounts::default());
    let leases = Arc::new(ResultPlane::new(writer_wake.clone()));
    let applied_xids = Arc::new(AppliedXids::default());
    let writer = Writer::new(
        store,
        catalog,
        WriterParts {
            cfg: cfg.clone(),
            plane: shared.control_port(),
            leases: leases.clone(),
            pool,
            repl: repl.clone(),
            runtime: runtime.clone(),
            catalog_cell: catalog_cell.clone(),
            entry_counts: entry_counts.clone(),
            core_reads: core_reads_rx,
            applied_xids: applied_xids.clone(),
        },
    );
    let mut core_fills = None;
    let pg_relay = match cfg.pgwire.enabled.then(|| RelayConfig::from_config(cfg)) {
        Some(Ok(mut relay_cfg)) => {
            relay_cfg.origin.primary = primary;
            let relay = RelayState::new(shared.control_port(), leases, relay_cfg);
            // Kernel-transport cores run it on their own threads, with their lookups' fills;
            // `run` serves the others, whose misses go to the writer.
            core_fills = (fill_pools.len() == cfg.resp.cores).then(|| {
                CoreFills::new(
                    shared.control_port(),
                    catalog_cell.clone(),
                    runtime.clone(),
                    core_reads_tx,
                    applied_xids,
                    fill_pools,
                )
            });
            relay.host_on_cores(core_fills.as_ref());
            // One read at start, not waited for at shutdown.
            tokio::spawn(tokio::time::timeout(
                Duration::from_secs(10),
                crate::pgfront::warn_unlisted_custom_settings(
                    relay.clone(),
                    cfg.pgwire.custom_settings.clone(),
                ),
            ));
            tasks.push(tokio::spawn(crate::pgfront::run(
                relay.clone(),
                relay_wake,
                shutdown.clone(),
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
        shutdown.clone(),
    )));
    tasks.push(tokio::spawn(writer.run(
        writer_wake,
        wal_rx,
        admin_rx,
        shutdown.clone(),
    )));
    ControlPlane {
        tasks,
        writer: admin_tx,
        repl,
        catalog: catalog_cell,
        runtime,
        entry_counts,
        pg_relay,
        core_fills,
    }
}

/// A core's pool of fill connections: the writer's origin settings, [`FILLS_PER_CORE`]
/// connections at most, the same connect and wait bounds. None if it cannot be built (the
/// core's misses then go to the writer).
fn fill_pool(cfg: &Config, pg: &crate::origin::Settings) -> Option<deadpool_postgres::Pool> {
    let mgr = deadpool_postgres::Manager::from_config(
        pg.pg.clone(),
        pg.pg_tls(),
        deadpool_postgres::ManagerConfig {
            recycling_method: deadpool_postgres::RecyclingMethod::Fast,
        },
    );
    deadpool_postgres::Pool::builder(mgr)
        .max_size(FILLS_PER_CORE)
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .create_timeout(Some(Duration::from_millis(cfg.origin.connect_timeout_ms)))
        .wait_timeout(Some(Duration::from_millis(cfg.origin.query_timeout_ms)))
        .build()
        .ok()
}

/// Binds the HTTP API's listener (None with `api.enabled = false`).
async fn bind_api(cfg: &Config) -> Result<Option<TcpListener>, StartError> {
    if !cfg.api.enabled {
        return Ok(None);
    }
    crate::api::bind(&cfg.api)
        .await
        .map(Some)
        .map_err(|source| StartError::ApiListen {
            addr: cfg.api.listen.clone(),
            source,
        })
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
fn start_cores(
    cfg: &Config,
    shared: Arc<Shared>,
    tls: Option<&FrontTls>,
) -> Result<Cores, StartError> {
    check_transport(cfg)?;
    let listen_error = |source| StartError::Listen {
        addr: cfg.resp.listen.clone(),
        source,
    };
    let mut engine_cfg = cfg.engine();
    match cfg.nic.mode {
        NicMode::Kernel => Ok(Cores {
            engine: Engine::start_with_tls(engine_cfg, shared, tls.map(FrontTls::front))
                .map_err(listen_error)?,
            mem_ports: Vec::new(),
            nic: Vec::new(),
        }),
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
            Ok(Cores {
                engine,
                mem_ports: far_ends,
                nic: Vec::new(),
            })
        }
        NicMode::Dpdk => start_dpdk(cfg, engine_cfg, shared),
    }
}

/// `nic.mode = "dpdk"`: the cores run the userspace stack on the DPDK port's queue pairs.
#[cfg(feature = "dpdk")]
fn start_dpdk(
    cfg: &Config,
    mut engine_cfg: EngineConfig,
    shared: Arc<Shared>,
) -> Result<Cores, StartError> {
    let ip = cfg
        .nic
        .ipv4()
        .expect("validated: nic.ip is set in dpdk mode");
    engine_cfg.listen = SocketAddr::new(ip.into(), engine_cfg.listen.port());
    let net = cfg
        .nic
        .net_config(engine_cfg.max_connections_per_core())
        .expect("validated: nic.ip is set in dpdk mode");
    let (queues, counters) = crate::dpdk_port::open_queues(&cfg.nic, cfg.resp.cores)?;
    let engine = Engine::start_userspace(engine_cfg, shared, queues, net).map_err(|source| {
        StartError::Listen {
            addr: cfg.resp.listen.clone(),
            source,
        }
    })?;
    Ok(Cores {
        engine,
        mem_ports: Vec::new(),
        nic: vec![Arc::new(counters)],
    })
}

#[cfg(not(feature = "dpdk"))]
fn start_dpdk(_: &Config, _: EngineConfig, _: Arc<Shared>) -> Result<Cores, StartError> {
    unreachable!("check_transport refuses nic.mode = dpdk without the dpdk feature")
}
