//! The engine: per-core poll loops that tie a transport, the RESP codec and the store together.
//!
//! One thread per configured core, each with its own listener (kernel path: `SO_REUSEPORT`), its
//! own connections and its own queues to the control plane; cores share nothing mutable except
//! the store's optimistic reads and their own counters. `docs/architecture.md` follows a request
//! file by file.
//!
//! One engine, two transports:
//! - [`session`] and [`slots`] are everything between "bytes arrived on a connection" and "bytes
//!   to write": parsing, execution against the store, misses to the control plane, replies held
//!   and released in request order, limits, counters, the connection table. They know nothing of
//!   sockets or packets.
//! - [`kernel`] is the core loop over kernel sockets (mio, `SO_REUSEPORT`, sleeps when idle).
//! - [`userspace`] is the core loop over a userspace TCP stack
//!   ([`crate::transport::stream::StreamStack`]; busy-polls, one stack and NIC queue per core).
//!
//! Hit path (no allocation, no lock, no system call besides the socket read/write that carry
//! it): `kernel` ingress → `session::Worker::process_requests` → `resp::parse_request` →
//! `resp::command::parse_command` → `execute::Exec::execute` → `store::StoreReader::read`
//! appends the entry's pre-encoded RESP bytes to the connection's write buffer → `kernel`
//! egress.

#![deny(unsafe_code)]

mod conn;
mod deferred;
mod execute;
pub mod info;
mod kernel;
pub mod limits;
mod pg;
mod prefetch;
mod session;
mod slots;
pub mod tls;
mod tracking;
pub mod userspace;

use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::net::{NetConfig, Stack};
use crate::plane::Shared;
use crate::resp::Limits;
use crate::transport::net::NetStream;
use crate::transport::stream::StreamStack;
use pgline_nic::Queue;

pub use limits::ConnLimits;
pub use pg::{serve_class, NotServed, ServeClass};
pub use tls::{PgTlsMode, TlsAcceptor, TlsFront};

/// Default number of dataplane cores.
pub const DEFAULT_CORES: usize = 1;
/// Default total RESP connection limit (split evenly over cores; the PostgreSQL port has its
/// own, [`ConnLimits::max_pg_connections`]).
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;
/// Default bound on buffered unparsed input per connection (one request must fit).
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 2 * 1024 * 1024;
/// Default bound on reply bytes waiting to be written per connection before reading pauses.
pub const DEFAULT_MAX_REPLY_BACKLOG: usize = 8 * 1024 * 1024;
/// Default requests executed per connection per loop turn.
pub const DEFAULT_REQUESTS_PER_TURN: usize = 128;
/// Default deferred or held replies per connection before reading pauses.
pub const DEFAULT_MAX_PENDING_PER_CONN: usize = 1024;
/// Default empty turns a core spins before it sleeps in epoll.
pub const DEFAULT_SPIN_POLLS: u32 = 2_000;

/// What a core needs to know; composed by the control plane from its config.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub listen: SocketAddr,
    /// Where PostgreSQL-protocol clients connect (`None`: the pgwire front is off).
    pub pg_listen: Option<SocketAddr>,
    /// PostgreSQL sessions of these users may be answered from cache (`origin.url`'s user and
    /// `pgwire.cache_users`); others always go to the origin.
    pub pg_cache_users: Vec<String>,
    /// The database the cache holds (`origin.url`'s); sessions on another database always go
    /// to the origin. `None`: no PostgreSQL session is answered from cache.
    pub pg_cache_database: Option<String>,
    pub cores: usize,
    /// RESP-port connections, total over cores.
    pub max_connections: usize,
    pub max_request_bytes: usize,
    pub max_reply_backlog: usize,
    pub requests_per_turn: usize,
    pub max_pending_per_conn: usize,
    pub spin_polls: u32,
    pub password: Option<String>,
    pub limits: Limits,
    /// Per-port and per-source connection limits, reply memory, timeouts, AUTH failures.
    pub conn_limits: ConnLimits,
}

impl EngineConfig {
    /// One core's share of the RESP connection limit.
    pub fn max_connections_per_core(&self) -> usize {
        self.max_connections.div_ceil(self.cores.max(1))
    }

    /// One core's share of the PostgreSQL connection limit.
    pub fn max_pg_connections_per_core(&self) -> usize {
        self.conn_limits
            .max_pg_connections
            .div_ceil(self.cores.max(1))
    }

    /// One core's share of the reply-memory cap.
    pub fn max_reply_memory_per_core(&self) -> usize {
        self.conn_limits
            .max_reply_memory
            .div_ceil(self.cores.max(1))
    }
}

/// Run first on each userspace core's thread, with the core's index.
pub type CoreStart = fn(core: usize);

/// Running cores.
pub struct Engine {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    shared: Arc<Shared>,
    local_addr: SocketAddr,
    pg_local_addr: Option<SocketAddr>,
    tls_local_addr: Option<SocketAddr>,
}

impl Engine {
    /// Binds every core's listener (so an address in use fails here), then starts the threads.
    pub fn start(cfg: EngineConfig, shared: Arc<Shared>) -> std::io::Result<Engine> {
        Engine::start_with_tls(cfg, shared, None)
    }

    /// [`Engine::start`] with TLS on the fronts: SSLRequest answered `S` per `tls.pg_mode`,
    /// and a RESP TLS listener on `tls.resp_listen` when set.
    pub fn start_with_tls(
        cfg: EngineConfig,
        shared: Arc<Shared>,
        tls: Option<TlsFront>,
    ) -> std::io::Result<Engine> {
        let cfg = Arc::new(cfg);
        let stop = Arc::new(AtomicBool::new(false));
        let mut cores = Vec::with_capacity(cfg.cores);
        let mut listen = cfg.listen;
        let mut pg_listen = cfg.pg_listen;
        let mut tls = tls;
        let sources = Arc::new(limits::Sources::default());
        for id in 0..cfg.cores {
            let ports = kernel::Ports { listen, pg_listen };
            let core = kernel::Core::new(
                id,
                ports,
                shared.clone(),
                cfg.clone(),
                sources.clone(),
                tls.clone(),
            )?;
            // With port 0 the first core picks the port; the others join it.
            listen = core.local_addr()?;
            pg_listen = core.pg_local_addr()?;
            if let Some(t) = tls.as_mut() {
                t.resp_listen = core.tls_local_addr()?;
            }
            cores.push(core);
        }
        let mut threads = Vec::with_capacity(cores.len());
        for (id, mut core) in cores.into_iter().enumerate() {
            let stop = stop.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("pgline-core-{id}"))
                    .spawn(move || core.run(&stop))?,
            );
        }
        Ok(Engine {
            stop,
            threads,
            shared,
            local_addr: listen,
            pg_local_addr: pg_listen,
            tls_local_addr: tls.and_then(|t| t.resp_listen),
        })
    }

    /// Starts one userspace core per stack: core `i` owns `stacks[i]` (and through it its NIC
    /// queue) and listens on `cfg.listen`'s port. `cfg.listen` is reported as the local address.
    pub fn start_streams<S>(
        cfg: EngineConfig,
        shared: Arc<Shared>,
        stacks: Vec<S>,
    ) -> std::io::Result<Engine>
    where
        S: StreamStack + Send + 'static,
    {
        Engine::start_streams_with(cfg, shared, stacks, |_| {})
    }

    /// [`Engine::start_streams`], calling `on_start(core)` first on each core's thread (e.g. to
    /// register the thread with the DPDK EAL, or pin it).
    pub fn start_streams_with<S>(
        cfg: EngineConfig,
        shared: Arc<Shared>,
        stacks: Vec<S>,
        on_start: CoreStart,
    ) -> std::io::Result<Engine>
    where
        S: StreamStack + Send + 'static,
    {
        if stacks.len() != cfg.cores || shared.cores() != cfg.cores {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "{} cores configured, {} stacks given, {} core queues",
                    cfg.cores,
                    stacks.len(),
                    shared.cores()
                ),
            ));
        }
        let cfg = Arc::new(cfg);
        let stop = Arc::new(AtomicBool::new(false));
        let sources = Arc::new(limits::Sources::default());
        let mut threads = Vec::with_capacity(stacks.len());
        for (id, stack) in stacks.into_iter().enumerate() {
            let (flag, shared, cfg) = (stop.clone(), shared.clone(), cfg.clone());
            let sources = sources.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("pgline-ucore-{id}"))
                .spawn(move || {
                    on_start(id);
                    userspace::UserCore::new(id, stack, shared, cfg, sources).run(&flag)
                });
            match spawned {
                Ok(t) => threads.push(t),
                Err(e) => {
                    stop.store(true, std::sync::atomic::Ordering::Relaxed);
                    threads.into_iter().for_each(|t| drop(t.join()));
                    return Err(e);
                }
            }
        }
        Ok(Engine {
            stop,
            threads,
            shared,
            local_addr: cfg.listen,
            pg_local_addr: cfg.pg_listen,
            tls_local_addr: None,
        })
    }

    /// Starts one userspace core per NIC queue: core `i` runs a `net::Stack` over `queues[i]`
    /// with the address and TCP settings of `net`, listening on `cfg.listen`'s port.
    pub fn start_userspace<Q: Queue + 'static>(
        cfg: EngineConfig,
        shared: Arc<Shared>,
        queues: Vec<Q>,
        net: NetConfig,
    ) -> std::io::Result<Engine> {
        Engine::start_userspace_with(cfg, shared, queues, net, |_| {})
    }

    /// [`Engine::start_userspace`] with a hook run first on each core's thread.
    pub fn start_userspace_with<Q: Queue + 'static>(
        cfg: EngineConfig,
        shared: Arc<Shared>,
        queues: Vec<Q>,
        net: NetConfig,
        on_start: CoreStart,
    ) -> std::io::Result<Engine> {
        let mut stacks = Vec::with_capacity(queues.len());
        for queue in queues {
            let stack = Stack::new(queue, net).map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("userspace stack: {e}"),
                )
            })?;
            stacks.push(NetStream::new(stack));
        }
        Engine::start_streams_with(cfg, shared, stacks, on_start)
    }

    /// The address clients connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The address PostgreSQL-protocol clients connect to (port 0 resolved on the kernel
    /// transport), `None` when the front is off. Userspace transports report `cfg.pg_listen`
    /// as configured: their stacks listen on its port beside the RESP one (see `userspace`).
    pub fn pg_local_addr(&self) -> Option<SocketAddr> {
        self.pg_local_addr
    }

    /// The address RESP clients connect to over TLS (port 0 resolved), `None` without a RESP
    /// TLS listener.
    pub fn tls_local_addr(&self) -> Option<SocketAddr> {
        self.tls_local_addr
    }

    /// Stops the cores and waits for them.
    pub fn stop(mut self) {
        self.stop_threads();
    }

    fn stop_threads(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for id in 0..self.shared.cores() {
            self.shared.wake_core(id);
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stop_threads();
    }
}
