//! pgline's dataplane wire benchmark: how many GET (or MGET) hits of 166-byte rows one userspace
//! dataplane core answers per second, and what each costs the core in CPU time and cycles.
//!
//! ```text
//!  client thread (pinned)                         server thread (pinned)
//!  net::Stack, N conns x depth D  ◀─ mem::pair ─▶  UserCore: net::Stack → session → store
//!  random keys, checks replies       (lock-free      (the engine's userspace core loop,
//!                                      rings)          driven turn by turn by this crate)
//! ```
//!
//! Everything is in one process: the in-memory port pair stands in for the NIC, so the figure is
//! the dataplane's own cost (TCP, RESP, store, copies) without a driver or a wire. The store is
//! filled directly (rows pre-encoded as the control plane installs them), so every key is a hit
//! and no PostgreSQL is involved.
//!
//! What the figures mean:
//! - `rps`: replies the client received and checked per wall second in the measured window
//!   (after a warm-up). Bounded by whichever thread is slower; on a shared machine also by
//!   preemption.
//! - `server_ns_per_req`: the server thread's CPU time (its thread CPU clock, so time preempted
//!   is not counted) times the fraction of its wall time spent in turns that did work (the core
//!   busy-polls, so idle spinning is excluded), per reply. `1e9 / server_ns_per_req` is the
//!   core's own capacity, known even when the client is the bottleneck.
//! - `server_cycles_per_req`: that time x the nominal clock rate (see [`cpu::nominal_mhz`]).
//! - `client_cpu_s`: the client thread's CPU time in the window; `client_busy` and
//!   `client_ns_per_req` are the same split for the client. Whichever of `server_busy` and
//!   `client_busy` is near 1 is the bottleneck.
//! - `server_cpu_share`: server CPU time / window; well below 1 means the machine took the CPU
//!   away (the wall-clock `rps` then says little, the per-request CPU figures still hold).
//!
//! Thread model: the caller's thread only sets up and joins; one server thread, one client
//! thread, pinned to two different CPUs when the process may use two or more.
//!
//! Limitations: one core, one queue; the client is the same userspace stack (not kernel TCP),
//! a closed loop (no open-loop latency figures: that is `bench/`'s load generator).

#![deny(unsafe_code)]

pub mod client;
// libc calls for thread CPU clocks and affinity; each block has its SAFETY reason.
#[allow(unsafe_code)]
pub mod cpu;
pub mod lockstep;
pub mod rows;
pub mod split;

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use pgline_dataplane::engine::userspace::UserCore;
use pgline_dataplane::engine::EngineConfig;
use pgline_dataplane::net::{NetConfig, Stack};
use pgline_dataplane::plane::Shared;
use pgline_dataplane::resp::Limits;
use pgline_dataplane::transport::net::NetStream;
use pgline_nic::mem::{self, MemConfig, MemQueue};
use pgline_nic::Offloads;

use client::{Client, Load, Outcome, ServerProbe};
use cpu::{Env, ThreadClock};
use rows::Rows;

pub const SERVER_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
pub const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
pub const PORT: u16 = 6379;

/// One run's settings.
#[derive(Clone, Copy, Debug)]
pub struct WireConfig {
    pub conns: usize,
    pub depth: usize,
    /// Keys per MGET; 0 = GET.
    pub mget: usize,
    pub secs: f64,
    pub warmup: f64,
    pub rows: u32,
    pub value_bytes: usize,
    /// Every n-th reply is compared in full (all replies are framed and their heads checked).
    pub sample_every: u64,
    /// Pin the threads (when two or more CPUs are available).
    pub pin: bool,
    /// Frames the server's stack takes per poll (`None`: the stack's default).
    pub server_rx_burst: Option<usize>,
    /// Checksums in software on both stacks (as before offload), instead of the port's offload.
    pub sw_checksum: bool,
    /// Client connections per client stack and address ([`split::CONNS_PER_STACK`]).
    pub conns_per_stack: usize,
    /// The server's TCP: our own (`true`), smoltcp's (`false`), or the stack's default.
    pub server_owned_tcp: Option<bool>,
    /// After the window: seconds without new requests before the idle resident set is read
    /// (0: not read).
    pub idle_secs: f64,
}

impl Default for WireConfig {
    fn default() -> Self {
        WireConfig {
            conns: 16,
            depth: 1,
            mget: 0,
            secs: 5.0,
            warmup: 1.0,
            rows: 100_000,
            value_bytes: 166,
            sample_every: 64,
            pin: true,
            server_rx_burst: None,
            sw_checksum: false,
            conns_per_stack: split::CONNS_PER_STACK,
            server_owned_tcp: None,
            idle_secs: 0.0,
        }
    }
}

impl WireConfig {
    pub fn validate(&self) -> Result<(), String> {
        let ok = self.conns > 0
            && self.conns <= 200_000
            && self.depth > 0
            && self.depth <= 1024
            && self.mget <= 1024
            && self.secs > 0.0
            && self.warmup >= 0.0
            && self.rows > 0
            && self.value_bytes >= rows::MIN_VALUE_BYTES
            && self.value_bytes <= 1400
            && self.sample_every > 0
            && self.server_rx_burst.is_none_or(|b| (1..=4096).contains(&b))
            && (1..=split::CONNS_PER_STACK).contains(&self.conns_per_stack)
            && self.conns.div_ceil(self.conns_per_stack) <= 64;
        if ok {
            Ok(())
        } else {
            Err(format!("invalid settings: {self:?}"))
        }
    }
}

/// One run's figures.
#[derive(Clone, Debug)]
pub struct Report {
    pub cfg: WireConfig,
    pub window_s: f64,
    pub requests: u64,
    pub keys: u64,
    pub rps: f64,
    pub keys_per_s: f64,
    pub server_cpu_s: f64,
    /// Fraction of the server's wall time in turns that did work.
    pub server_busy: f64,
    /// Replies per server turn that did work (the batch the core saw).
    pub reqs_per_busy_turn: f64,
    pub server_ns_per_req: f64,
    pub server_cycles_per_req: f64,
    /// Server CPU time / window: below 1 the thread was preempted (shared machine).
    pub server_cpu_share: f64,
    pub client_cpu_s: f64,
    pub client_busy: f64,
    pub client_ns_per_req: f64,
    pub mhz: f64,
    pub mhz_source: &'static str,
    pub pinned: Option<(usize, usize)>,
    pub verified: u64,
    pub client_retransmits: u64,
    /// The process's resident set with every connection open (both ends: the client stacks
    /// and the server core), and before the first one.
    pub rss_bytes: Option<u64>,
    pub rss_base_bytes: Option<u64>,
    /// The resident set once every connection has been idle for `WireConfig::idle_secs`.
    pub rss_idle_bytes: Option<u64>,
    pub env: Env,
}

impl Report {
    /// The JSONL row.
    pub fn to_json(&self) -> serde_json::Value {
        let op = if self.cfg.mget == 0 { "get" } else { "mget" };
        serde_json::json!({
            "bench": "wire",
            "op": op,
            "conns": self.cfg.conns,
            "depth": self.cfg.depth,
            "mget": self.cfg.mget,
            "value_bytes": self.cfg.value_bytes,
            "rows": self.cfg.rows,
            "server_rx_burst": self.cfg.server_rx_burst,
            "server_tcp": self.cfg.server_owned_tcp.map(|o| if o { "owned" } else { "smoltcp" }),
            "checksum": if self.cfg.sw_checksum { "software" } else { "offload" },
            "window_s": round(self.window_s, 3),
            "requests": self.requests,
            "rps": self.rps.round(),
            "keys_per_s": self.keys_per_s.round(),
            "server_cpu_s": round(self.server_cpu_s, 4),
            "server_busy": round(self.server_busy, 4),
            "reqs_per_busy_turn": round(self.reqs_per_busy_turn, 2),
            "server_ns_per_req": round(self.server_ns_per_req, 1),
            "server_cycles_per_req": self.server_cycles_per_req.round(),
            "server_capacity_rps": (1e9 / self.server_ns_per_req.max(1e-9)).round(),
            "server_cpu_share": round(self.server_cpu_share, 3),
            "client_cpu_s": round(self.client_cpu_s, 4),
            "client_busy": round(self.client_busy, 4),
            "client_ns_per_req": round(self.client_ns_per_req, 1),
            "mhz": self.mhz,
            "mhz_source": self.mhz_source,
            "pinned": self.pinned.map(|(s, c)| serde_json::json!({"server": s, "client": c})),
            "verified_replies": self.verified,
            "client_retransmits": self.client_retransmits,
            "rss_mib": self.rss_bytes.map(|b| round(b as f64 / MIB, 1)),
            "rss_base_mib": self.rss_base_bytes.map(|b| round(b as f64 / MIB, 1)),
            "rss_per_conn_kib": self.rss_per_conn().map(|b| round(b / 1024.0, 2)),
            "rss_idle_per_conn_kib": self.rss_idle_per_conn().map(|b| round(b / 1024.0, 2)),
            "env": {
                "cpu_model": self.env.cpu_model,
                "cores": self.env.cores,
                "kernel": self.env.kernel,
            },
        })
    }
}

impl Report {
    /// Resident bytes the open connections added, per connection (both ends).
    pub fn rss_per_conn(&self) -> Option<f64> {
        let (open, base) = (self.rss_bytes?, self.rss_base_bytes?);
        Some(open.saturating_sub(base) as f64 / self.cfg.conns as f64)
    }

    /// The same once every connection has been idle for `WireConfig::idle_secs` (both ends).
    pub fn rss_idle_per_conn(&self) -> Option<f64> {
        let (idle, base) = (self.rss_idle_bytes?, self.rss_base_bytes?);
        Some(idle.saturating_sub(base) as f64 / self.cfg.conns as f64)
    }
}

const MIB: f64 = 1024.0 * 1024.0;

fn round(x: f64, digits: i32) -> f64 {
    let p = 10f64.powi(digits);
    (x * p).round() / p
}

/// Sets up the store, the port pair, the server core and the client; runs; reports.
pub fn run(cfg: &WireConfig) -> Result<Report, String> {
    cfg.validate()?;
    let rows = Rows::new(cfg.rows, cfg.value_bytes);
    run_rows(cfg, &rows, &rows)
}

/// [`run`] with the store filled from `served` and replies checked against `expected` (the
/// same rows, except in tests that prove a wrong reply is caught).
pub fn run_rows(cfg: &WireConfig, served: &Rows, expected: &Rows) -> Result<Report, String> {
    cfg.validate()?;
    let shared = served.install()?;
    let rows = expected;
    let stats = shared.clone();
    let (server_q, client_q) = port_pair(cfg);
    let cpus = cpu::allowed_cpus();
    let pinned = (cfg.pin && cpus.len() >= 2).then(|| (cpus[0], cpus[1]));
    let load = Load {
        conns: cfg.conns,
        depth: cfg.depth,
        mget: cfg.mget,
        warmup: Duration::from_secs_f64(cfg.warmup),
        secs: Duration::from_secs_f64(cfg.secs),
        sample_every: cfg.sample_every,
        seed: 0x9e37_79b9_7f4a_7c15 ^ cfg.conns as u64,
        conns_per_stack: cfg.conns_per_stack,
        idle: Duration::from_secs_f64(cfg.idle_secs),
    };
    let stop = AtomicBool::new(false);
    let probe = &ServerProbe::default();
    let outcome = std::thread::scope(|s| -> Result<Outcome, String> {
        let (clock_tx, clock_rx) = mpsc::channel();
        let server = std::thread::Builder::new()
            .name("wire-server".into())
            .spawn_scoped(s, || {
                serve(
                    server_q,
                    shared,
                    cfg,
                    pinned.map(|p| p.0),
                    &stop,
                    probe,
                    clock_tx,
                )
            })
            .map_err(|e| format!("server thread: {e}"))?;
        let server_clock = clock_rx
            .recv()
            .map_err(|_| "the server thread did not start".to_string())??;
        let client = std::thread::Builder::new()
            .name("wire-client".into())
            .spawn_scoped(s, move || {
                if let Some((_, cpu)) = pinned {
                    cpu::pin_current(cpu);
                }
                let target = SocketAddrV4::new(SERVER_IP, PORT);
                Client::new(client_q, CLIENT_IP, rows, load)
                    .map(|c| c.run(target, server_clock, probe))
            })
            .map_err(|e| format!("client thread: {e}"))?;
        let outcome = client.join().map_err(|_| "the client panicked".to_string());
        stop.store(true, Ordering::Relaxed);
        server
            .join()
            .map_err(|_| "the server core panicked".to_string())?;
        outcome?
    })?;
    if let Some(e) = outcome.error {
        let st = stats.stats(0);
        let get = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        return Err(format!(
            "{e}; server core: {} commands, {} keys missed, {} bytes in, {} bytes out, {} polls, {} connections rejected; its stack: {} frames in, {} out, {} dropped in, {} dropped out, {} retransmits",
            get(&st.resp_commands),
            get(&st.keys_miss),
            get(&st.bytes_in),
            get(&st.bytes_out),
            get(&st.polls),
            get(&st.connections_rejected),
            get(&st.net_rx_frames),
            get(&st.net_tx_frames),
            get(&st.net_rx_dropped),
            get(&st.net_tx_dropped),
            get(&st.net_tcp_retransmits),
        ));
    }
    Ok(report(cfg, &outcome, pinned))
}

/// The in-memory port pair: server end, client end.
pub(crate) fn port_pair(cfg: &WireConfig) -> (MemQueue, MemQueue) {
    // Room for every request and reply in flight at once (a port that drops makes the stacks
    // retransmit and, at 100,000 connections, time out).
    let frames = (cfg.conns * (cfg.depth + 2) * 2).clamp(8192, 1 << 20);
    mem::pair(MemConfig {
        pool_frames: frames,
        ring: frames / 2,
        // A NIC's checksum offload: the stacks neither compute nor verify checksums in
        // software, and the port passes frames with checksums partial (veth/virtio style).
        offloads: Offloads {
            tx_checksum: !cfg.sw_checksum,
            rx_checksum: !cfg.sw_checksum,
        },
        checksum_partial: true,
        ..MemConfig::default()
    })
}

/// The server thread: pins itself, sends its CPU clock, runs the core turn by turn until `stop`.
fn serve(
    queue: MemQueue,
    shared: Arc<Shared>,
    cfg: &WireConfig,
    cpu: Option<usize>,
    stop: &AtomicBool,
    probe: &ServerProbe,
    clock: mpsc::Sender<Result<ThreadClock, String>>,
) {
    if let Some(cpu) = cpu {
        cpu::pin_current(cpu);
    }
    let mut core = match server_core(queue, shared, cfg) {
        Ok(c) => c,
        Err(e) => {
            let _ = clock.send(Err(e));
            return;
        }
    };
    let _ = clock.send(ThreadClock::of_current().ok_or_else(|| "no thread CPU clock".to_string()));
    // The engine's own `UserCore::run`, plus the busy/idle split: a turn's wall time (from its
    // `now` to the next turn's) counts as busy when the turn did work.
    let (mut busy, mut total, mut turns) = (0u64, 0u64, 0u64);
    let mut now = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let worked = core.poll_once(now);
        let next = Instant::now();
        let ns = (next - now).as_nanos() as u64;
        total += ns;
        if worked {
            busy += ns;
            turns += 1;
        }
        probe.busy_ns.store(busy, Ordering::Relaxed);
        probe.total_ns.store(total, Ordering::Relaxed);
        probe.busy_turns.store(turns, Ordering::Relaxed);
        now = next;
    }
}

/// The benchmarked core: the engine's `UserCore` over `net::Stack` on `queue`.
pub(crate) fn server_core(
    queue: MemQueue,
    shared: Arc<Shared>,
    cfg: &WireConfig,
) -> Result<UserCore<NetStream<MemQueue>>, String> {
    let mut net = NetConfig::new(SERVER_IP, 24);
    net.max_connections = cfg.conns + 64;
    if let Some(burst) = cfg.server_rx_burst {
        net.rx_burst = burst;
    }
    if let Some(owned) = cfg.server_owned_tcp {
        net.owned_tcp = owned;
    }
    let stack = Stack::new(queue, net).map_err(|e| format!("server stack: {e}"))?;
    Ok(UserCore::new(
        0,
        NetStream::new(stack),
        shared,
        Arc::new(engine_config(cfg.conns)),
        Arc::default(),
    ))
}

/// The engine settings of the benchmarked core (the shipped defaults where they matter).
fn engine_config(conns: usize) -> EngineConfig {
    EngineConfig {
        pg_listen: None,
        pg_cache_users: Vec::new(),
        pg_cache_database: None,
        listen: SocketAddr::V4(SocketAddrV4::new(SERVER_IP, PORT)),
        cores: 1,
        max_connections: conns + 64,
        max_request_bytes: pgline_dataplane::engine::DEFAULT_MAX_REQUEST_BYTES,
        max_reply_backlog: pgline_dataplane::engine::DEFAULT_MAX_REPLY_BACKLOG,
        requests_per_turn: pgline_dataplane::engine::DEFAULT_REQUESTS_PER_TURN,
        max_pending_per_conn: pgline_dataplane::engine::DEFAULT_MAX_PENDING_PER_CONN,
        spin_polls: u32::MAX,
        password: None,
        limits: Limits::default(),
        conn_limits: pgline_dataplane::engine::ConnLimits::default(),
    }
}

fn report(cfg: &WireConfig, o: &Outcome, pinned: Option<(usize, usize)>) -> Report {
    let (a, b) = (&o.start, &o.end);
    let window_s = match (a.at, b.at) {
        (Some(x), Some(y)) => (y - x).as_secs_f64(),
        _ => 0.0,
    };
    let requests = b.requests - a.requests;
    let keys = b.keys - a.keys;
    let server_cpu_s = (b.server_cpu.saturating_sub(a.server_cpu)).as_secs_f64();
    let total = b.server_total_ns.saturating_sub(a.server_total_ns);
    let busy = b.server_busy_ns.saturating_sub(a.server_busy_ns);
    let frac = |busy: u64, total: u64| {
        if total > 0 {
            busy as f64 / total as f64
        } else {
            0.0
        }
    };
    let server_busy = frac(busy, total);
    let client_busy = frac(
        b.client_busy_ns - a.client_busy_ns,
        b.client_total_ns - a.client_total_ns,
    );
    let client_cpu_s = (b.client_cpu.saturating_sub(a.client_cpu)).as_secs_f64();
    let per = |s: f64| s * 1e9 / requests.max(1) as f64;
    let server_ns_per_req = per(server_cpu_s * server_busy);
    let (mhz, mhz_source) = cpu::nominal_mhz();
    Report {
        cfg: *cfg,
        window_s,
        requests,
        keys,
        rps: requests as f64 / window_s.max(1e-9),
        keys_per_s: keys as f64 / window_s.max(1e-9),
        server_cpu_s,
        server_busy,
        reqs_per_busy_turn: requests as f64
            / (b.server_busy_turns.saturating_sub(a.server_busy_turns)).max(1) as f64,
        server_ns_per_req,
        server_cycles_per_req: server_ns_per_req * mhz / 1000.0,
        server_cpu_share: server_cpu_s / window_s.max(1e-9),
        client_cpu_s,
        client_busy,
        client_ns_per_req: per(client_cpu_s * client_busy),
        mhz,
        mhz_source,
        pinned,
        verified: o.verified,
        client_retransmits: o.client_retransmits,
        rss_bytes: o.rss_open,
        rss_base_bytes: o.rss_base,
        rss_idle_bytes: o.rss_idle,
        env: Env::probe(),
    }
}
