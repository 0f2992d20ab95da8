//! The userspace network stack of one dataplane core: Ethernet, ARP, IPv4, ICMP echo and TCP
//! over one [`pgline_nic::Queue`].
//!
//! Place on the hit path (the userspace transport calls these in this order each turn):
//!
//! ```text
//! poll(now)  : rx_burst → process_frame (eth → arp | ipv4 → icmp | tcp demux → conn ingress)
//!              → due timers mark connections dirty → events (Accepted, Readable, ...)
//! recv/send  : the engine reads requests and writes replies into the connections' buffers
//! flush(now) : each dirty connection's socket emits its segments straight into port buffers
//!              → one tx_burst
//! ```
//!
//! TCP is smoltcp's TCP socket state machine by default, or with `NetConfig::owned_tcp` our own
//! (`tcp.rs`: a compact TCP with a header-prediction fast path for established connections),
//! behind our own flow demux (see `conn.rs` for why each smoltcp connection gets its own
//! one-socket interface): a 4-tuple → slot hash table, an
//! accept path that arms a fresh socket for each SYN on a listened port (so any number of
//! connections are accepted), a dirty list and a timer heap so `flush` only visits connections
//! with something to send or a timer due. Per-packet cost does not depend on the number of open
//! connections.
//!
//! Invariants:
//! - everything is bounded: `max_connections` slots (a SYN beyond them is answered with RST),
//!   `rx_burst` frames per poll, the ARP cache and resolution list, the TX backlog;
//! - slots, their sockets and buffers are reused, so steady-state traffic and connection churn do
//!   not allocate once the peak number of connections has been reached;
//! - nothing panics on input: every frame is checked by `wire::parse_*` before use, malformed
//!   frames are dropped and counted in [`NetStats`].
//!
//! Thread model: a `Stack` is owned by one core (it owns its queue); no locks, no atomics.
//!
//! Limitations: IPv4 only, no IP fragments (dropped and counted), no IP options on what we send,
//! a peer's MAC learned from its SYN is kept for the connection's life; TIME-WAIT is not kept (a
//! closed connection's slot is freed at once, late segments get a RST); no TCP timestamps or
//! SACK (smoltcp's defaults; ours has neither, nor an out-of-order queue).

#![deny(unsafe_code)]

mod arp;
mod bufpool;
mod conn;
mod egress;
mod ingress;
mod isn;
mod tcp;
mod wire;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use pgline_nic::Queue;
use rustc_hash::FxHashMap;
use smoltcp::phy::DeviceCapabilities;
use smoltcp::socket::tcp::State;
use smoltcp::time::Instant as SInstant;

pub use bufpool::PoolStats;
use bufpool::Pools;
use conn::{Conn, FlowKey, Link, Origin};

/// Delayed ACK: an ACK waits this long for a reply to ride on.
pub const ACK_DELAY: Duration = Duration::from_millis(10);
/// A connection whose peer stays silent this long with data outstanding is aborted.
pub const CONN_TIMEOUT: Duration = Duration::from_secs(30);
/// A passive connection that does not complete its handshake within this is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Segments one connection may emit per `flush`.
pub const MAX_SEGMENTS_PER_FLUSH: usize = 64;
/// Frames kept for the next `flush` when the TX ring is full; beyond this they are dropped.
pub const MAX_TX_BACKLOG: usize = 4096;
/// Default `NetConfig::conn_buffers`: receive and send buffers per core's pools.
pub const DEFAULT_CONN_BUFFERS: usize = 4096;
/// Default `NetConfig::send_stall_timeout`.
pub const DEFAULT_SEND_STALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Settings of one core's stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NetConfig {
    /// Our MAC address (default: the queue's).
    pub mac: Option<[u8; 6]>,
    pub ip: Ipv4Addr,
    pub prefix_len: u8,
    pub gateway: Option<Ipv4Addr>,
    /// TCP maximum segment size we announce and send (capped by the port's frame size).
    pub mss: u16,
    /// Receive buffer per connection (the window we announce).
    pub rx_buffer: usize,
    /// Send buffer per connection.
    pub tx_buffer: usize,
    /// With `owned_tcp`: receive buffers, and as many send buffers, in the stack's pools
    /// (`bufpool.rs`); connections take them while they move bytes. Capped at
    /// `max_connections` (one of each per connection never runs dry). Ignored by smoltcp,
    /// whose sockets own their buffers.
    pub conn_buffers: usize,
    /// Open connections at most; a SYN beyond them gets a RST.
    pub max_connections: usize,
    /// Frames received per `poll` at most.
    pub rx_burst: usize,
    /// Our own TCP (`tcp.rs`, the default) instead of smoltcp's socket for every connection of
    /// this stack. The test and benchmark clients turn it off: smoltcp is the independent TCP
    /// ours is checked against.
    pub owned_tcp: bool,
    /// With `owned_tcp`: take in-order data segments of established connections on the header
    /// prediction fast path (off only to compare against the general path).
    pub tcp_fast_path: bool,
    /// With `owned_tcp`: a connection whose peer acknowledges none of its queued data for this
    /// long is reset, whether the peer is silent or keeps a zero window open by answering
    /// probes. It bounds how long a reader that stopped reading holds a pooled send buffer
    /// (like Linux's `TCP_USER_TIMEOUT`, which also covers zero-window probing).
    pub send_stall_timeout: Duration,
}

impl NetConfig {
    /// Defaults for everything but the address.
    pub fn new(ip: Ipv4Addr, prefix_len: u8) -> NetConfig {
        NetConfig {
            mac: None,
            ip,
            prefix_len,
            gateway: None,
            mss: 1460,
            rx_buffer: 16 * 1024,
            tx_buffer: 32 * 1024,
            conn_buffers: DEFAULT_CONN_BUFFERS,
            max_connections: 4096,
            rx_burst: 32,
            owned_tcp: true,
            tcp_fast_path: true,
            send_stall_timeout: DEFAULT_SEND_STALL_TIMEOUT,
        }
    }

    fn validate(&self) -> Result<(), NetError> {
        let ok = self.prefix_len <= 32
            && self.mss >= 64
            && self.rx_buffer >= 1024
            && self.tx_buffer >= 1024
            && self.max_connections > 0
            && self.conn_buffers > 0
            && self.max_connections < u32::MAX as usize
            && self.rx_burst > 0
            && !self.send_stall_timeout.is_zero()
            && !self.ip.is_unspecified();
        if ok {
            Ok(())
        } else {
            Err(NetError::InvalidConfig)
        }
    }
}

/// A connection handle: a slot and the slot's generation (a stale handle never reaches a newer
/// connection in the same slot).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConnId {
    slot: u32,
    gen: u32,
}

impl ConnId {
    /// The slot index, `< max_connections`: owners may index per-connection arrays with it.
    pub fn slot(&self) -> usize {
        self.slot as usize
    }
}

/// What happened during `poll` (and the `flush` before it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NetEvent {
    /// A connection on a listened port completed its handshake.
    Accepted { id: ConnId, listener: u16 },
    /// A `connect` completed its handshake.
    Connected(ConnId),
    /// Bytes arrived (or the peer closed its side: `recv` then returns `Err(Closed)`). Reported
    /// after each segment that leaves unread bytes, so an owner that reads until `Ok(0)` misses
    /// nothing; EOF is reported once.
    Readable(ConnId),
    /// A `send` that came up short can now make progress.
    Writable(ConnId),
    /// The connection is gone (peer RST, timeout, or both sides closed); the id is dead.
    Closed(ConnId),
}

/// Errors of the stack API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NetError {
    /// The connection's direction is closed (or the connection ended).
    Closed,
    /// No room: send buffer full, or no free connection slot.
    Full,
    /// No such connection (never existed, or closed since).
    Unknown,
    /// No route to the address (outside our prefix and no gateway).
    Unreachable,
    /// The 4-tuple is already in use.
    InUse,
    /// The configuration is not usable.
    InvalidConfig,
}

impl std::fmt::Display for NetError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

impl std::error::Error for NetError {}

/// Counters of one stack (plain integers; the owner publishes snapshots).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetStats {
    pub rx_frames: u64,
    pub tx_frames: u64,
    /// Truncated headers, length fields past the frame, zero ports.
    pub rx_dropped_malformed: u64,
    pub rx_dropped_checksum: u64,
    pub rx_dropped_fragment: u64,
    /// Not our MAC/IP, or an ethertype/protocol we do not speak.
    pub rx_dropped_not_ours: u64,
    /// No port buffer for a frame.
    pub tx_dropped_nobuf: u64,
    /// A segment for a connection whose next hop is unresolved.
    pub tx_dropped_no_arp: u64,
    /// TX ring full and the backlog too.
    pub tx_dropped_ring: u64,
    pub arp_requests_answered: u64,
    pub arp_requests_sent: u64,
    pub arp_replies_received: u64,
    /// Next hops that never answered (their connections were closed).
    pub arp_failed: u64,
    pub icmp_echo_replied: u64,
    pub tcp_conns_open: u64,
    pub tcp_conns_accepted: u64,
    pub tcp_conns_connected: u64,
    pub tcp_conns_closed: u64,
    /// SYNs refused (RST) because `max_connections` were open.
    pub tcp_conns_refused: u64,
    /// RSTs sent for segments of no connection.
    pub tcp_rst_sent: u64,
    pub tcp_retransmits: u64,
    /// Segments our own TCP took on its header-prediction fast path.
    pub tcp_fast_path: u64,
    /// Times a connection of our own TCP found a buffer pool dry and waited (receive: data
    /// refused under a zero window; send: `send` took nothing).
    pub tcp_buffer_waits: u64,
    /// Receive buffers granted to a waiter whose peer then sent nothing, given back after
    /// `tcp::RX_GRANT_UNUSED_US`.
    pub tcp_rx_grants_returned: u64,
    /// Connections reset because their peer acknowledged none of their data for
    /// `NetConfig::send_stall_timeout`.
    pub tcp_send_stall_aborts: u64,
}

/// One core's network stack over one queue.
pub struct Stack<Q: Queue> {
    queue: Q,
    cfg: NetConfig,
    mac: [u8; 6],
    link: Link,
    caps: DeviceCapabilities,
    verify_rx: bool,
    epoch: Instant,
    conns: Vec<Conn>,
    free: Vec<u32>,
    table: FxHashMap<FlowKey, u32>,
    listeners: Box<[u64]>,
    dirty: Vec<u32>,
    dirty_spare: Vec<u32>,
    timers: BinaryHeap<Reverse<(u64, u32, u32)>>,
    arp: arp::Arp,
    arp_waiters: Vec<ConnId>,
    /// Our own TCP's buffer pools and the connections waiting for a buffer (FIFO, each at most
    /// once: `Conn::rx_waiting` / `tx_waiting`).
    pools: Pools,
    rx_waiters: VecDeque<ConnId>,
    tx_waiters: VecDeque<ConnId>,
    rx: Vec<Q::Packet>,
    tx: Vec<Q::Packet>,
    scratch: Vec<u8>,
    events: Vec<NetEvent>,
    stats: NetStats,
    open: usize,
    seed: u64,
    isn: isn::IsnGen,
    next_ephemeral: u16,
    ip_ident: u16,
    last_t: u64,
}

impl<Q: Queue> Stack<Q> {
    pub fn new(queue: Q, cfg: NetConfig) -> Result<Self, NetError> {
        cfg.validate()?;
        let offloads = queue.offloads();
        let max_frame = queue.max_frame();
        if max_frame < wire::ETH_HDR + wire::IPV4_HDR + wire::TCP_HDR + 64 {
            return Err(NetError::InvalidConfig);
        }
        let mtu = (usize::from(cfg.mss) + 40).min(max_frame - wire::ETH_HDR);
        let mac = cfg.mac.unwrap_or_else(|| queue.mac());
        // smoltcp sockets own their buffers: its stacks get empty pools.
        let pooled = if cfg.owned_tcp {
            cfg.conn_buffers.min(cfg.max_connections)
        } else {
            0
        };
        let waiters = pooled.min(1 << 16);
        let isn = isn::IsnGen::new();
        // smoltcp's generator (its sequence numbers) is seeded from the secret too.
        let seed = isn.seed(
            u64::from(u32::from(cfg.ip))
                ^ u64::from_be_bytes([0, 0, mac[0], mac[1], mac[2], mac[3], mac[4], mac[5]]),
        );
        Ok(Stack {
            queue,
            cfg,
            mac,
            link: Link {
                src_mac: mac,
                src_ip: cfg.ip.octets(),
                tx_offload: offloads.tx_checksum,
            },
            caps: conn::capabilities(mtu, offloads.tx_checksum),
            verify_rx: !offloads.rx_checksum,
            epoch: Instant::now(),
            conns: Vec::new(),
            free: Vec::new(),
            table: FxHashMap::with_capacity_and_hasher(
                cfg.max_connections.min(1 << 20),
                Default::default(),
            ),
            listeners: vec![0u64; 1024].into_boxed_slice(),
            dirty: Vec::with_capacity(1024),
            dirty_spare: Vec::with_capacity(1024),
            timers: BinaryHeap::with_capacity(1024),
            arp: arp::Arp::new(),
            arp_waiters: Vec::new(),
            pools: Pools::new(cfg.rx_buffer, cfg.tx_buffer, pooled),
            rx_waiters: VecDeque::with_capacity(waiters),
            tx_waiters: VecDeque::with_capacity(waiters),
            rx: Vec::with_capacity(cfg.rx_burst),
            tx: Vec::with_capacity(MAX_TX_BACKLOG),
            scratch: Vec::with_capacity(max_frame),
            events: Vec::with_capacity(1024),
            stats: NetStats::default(),
            open: 0,
            seed: seed | 1,
            isn,
            next_ephemeral: 49152,
            ip_ident: 1,
            last_t: 0,
        })
    }

    /// Accepts connections on `port` (any number of them, up to `max_connections` in all).
    pub fn listen(&mut self, port: u16) {
        self.listeners[usize::from(port) / 64] |= 1 << (port % 64);
    }

    fn is_listening(&self, port: u16) -> bool {
        port != 0 && self.listeners[usize::from(port) / 64] & (1 << (port % 64)) != 0
    }

    /// Opens a connection (for test and bench clients). `local_port` 0 picks an ephemeral port.
    /// `Connected` or `Closed` follows from `poll`.
    pub fn connect(&mut self, remote: SocketAddrV4, local_port: u16) -> Result<ConnId, NetError> {
        let next_hop = self.next_hop(*remote.ip()).ok_or(NetError::Unreachable)?;
        if remote.port() == 0 {
            return Err(NetError::Unreachable);
        }
        let local_port = match local_port {
            0 => self.ephemeral_port(remote)?,
            p => p,
        };
        let key = FlowKey {
            remote_ip: u32::from(*remote.ip()),
            remote_port: remote.port(),
            local_port,
        };
        if self.table.contains_key(&key) {
            return Err(NetError::InUse);
        }
        let now = self.s_now_cached();
        let slot = self.alloc_slot(now).ok_or(NetError::Full)?;
        let mac = self.arp.lookup(next_hop);
        let ip = self.cfg.ip;
        let iss = self.next_iss(key);
        let c = &mut self.conns[slot as usize];
        c.begin(key, Origin::Active, next_hop, mac);
        if !c.connect(&mut self.pools, ip, local_port, remote, iss, now) {
            c.key = None;
            self.free.push(slot);
            return Err(NetError::Unreachable);
        }
        c.configure(CONN_TIMEOUT);
        self.table.insert(key, slot);
        self.open += 1;
        self.stats.tcp_conns_open = self.open as u64;
        let id = ConnId {
            slot,
            gen: self.conns[slot as usize].gen,
        };
        self.mark_dirty(slot);
        Ok(id)
    }

    /// RX burst, protocol processing, due timers; appends what happened to `events`. True if
    /// any work was done.
    pub fn poll(&mut self, now: Instant, events: &mut Vec<NetEvent>) -> bool {
        let t = self.micros(now);
        let mut rx = std::mem::take(&mut self.rx);
        let n = self.queue.rx_burst(&mut rx, self.cfg.rx_burst);
        self.stats.rx_frames += n as u64;
        for pkt in rx.drain(..) {
            self.process_frame(t, pgline_nic::Packet::data(&pkt));
        }
        self.rx = rx;
        let timers = self.poll_timers(t);
        let had_events = !self.events.is_empty();
        events.append(&mut self.events);
        n > 0 || timers || had_events
    }

    /// Appends up to `max` received bytes to `out`. `Ok(0)`: nothing yet; `Err(Closed)`: the peer
    /// closed its side and everything was read.
    pub fn recv(&mut self, id: ConnId, out: &mut Vec<u8>, max: usize) -> Result<usize, NetError> {
        let slot = self.live(id).ok_or(NetError::Unknown)?;
        let c = &mut self.conns[slot];
        let total = c.recv(&mut self.pools, out, max);
        if total > 0 {
            // The window opened: the TCP decides whether an update is worth sending.
            self.mark_dirty(slot as u32);
            self.serve_waiters();
            return Ok(total);
        }
        if self.conns[slot].may_recv() {
            Ok(0)
        } else {
            Err(NetError::Closed)
        }
    }

    /// Queues bytes to send; may take only part of them. `Err(Full)` when nothing fits (a
    /// `Writable` event follows when room frees up), `Err(Closed)` after `close` or a peer RST.
    pub fn send(&mut self, id: ConnId, data: &[u8]) -> Result<usize, NetError> {
        let slot = self.live(id).ok_or(NetError::Unknown)?;
        let c = &mut self.conns[slot];
        if !c.may_send() {
            return Err(NetError::Closed);
        }
        if data.is_empty() {
            return Ok(0);
        }
        let n = c
            .send(&mut self.pools, data)
            .map_err(|_| NetError::Closed)?;
        if n < data.len() {
            c.want_write = true;
        }
        if n == 0 {
            if !c.tx_waiting && c.send_starved(&self.pools) {
                // No buffer and the pool is dry: wait for one (`Writable` follows).
                c.tx_waiting = true;
                self.push_waiter(id, true);
            }
            return Err(NetError::Full);
        }
        self.mark_dirty(slot as u32);
        Ok(n)
    }

    /// Bytes `send` would take now.
    pub fn send_capacity(&self, id: ConnId) -> usize {
        match self.live(id) {
            Some(slot) => {
                let c = &self.conns[slot];
                if c.may_send() {
                    c.send_room(&self.pools)
                } else {
                    0
                }
            }
            None => 0,
        }
    }

    /// Closes our side: FIN after the queued data. `Closed` follows once both sides are done.
    pub fn close(&mut self, id: ConnId) {
        if let Some(slot) = self.live(id) {
            self.conns[slot].close();
            self.mark_dirty(slot as u32);
        }
    }

    /// Resets the connection (RST goes out with the next `flush`) and frees its state now; no
    /// `Closed` event follows.
    pub fn abort(&mut self, id: ConnId) {
        if let Some(slot) = self.live(id) {
            self.conns[slot].abort();
            let now = self.s_now_cached();
            self.egress_conn(slot as u32, now, self.last_t);
            self.release(slot as u32, false);
        }
    }

    /// Egress: only connections with data/ACK/FIN to send or a due timer, then one TX burst.
    pub fn flush(&mut self, now: Instant) {
        let t = self.micros(now);
        self.dispatch_dirty(t);
        self.dispatch_tx();
    }

    /// How long the caller may wait before the next timer (None: no timer pending).
    pub fn poll_delay(&self, now: Instant) -> Option<Duration> {
        if !self.dirty.is_empty() || !self.tx.is_empty() || !self.events.is_empty() {
            return Some(Duration::ZERO);
        }
        let t = now.saturating_duration_since(self.epoch).as_micros() as u64;
        let timer = self.timers.peek().map(|Reverse((at, _, _))| *at);
        let next = match (timer, self.arp.next_deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        next.map(|at| Duration::from_micros(at.saturating_sub(t)))
    }

    pub fn stats(&self) -> &NetStats {
        &self.stats
    }

    /// Our own TCP's receive and send buffer pools (empty with smoltcp).
    pub fn buffer_pools(&self) -> (PoolStats, PoolStats) {
        (self.pools.rx.stats(), self.pools.tx.stats())
    }

    /// Entries on the receive and send wait lists for a pooled buffer. Entries of connections
    /// that closed while waiting count until they are served or swept.
    pub fn buffer_waiters(&self) -> (usize, usize) {
        (self.rx_waiters.len(), self.tx_waiters.len())
    }

    pub fn open_connections(&self) -> usize {
        self.open
    }

    /// Our MAC address.
    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }

    /// The queue (e.g. for its counters).
    pub fn queue(&self) -> &Q {
        &self.queue
    }

    pub fn queue_mut(&mut self) -> &mut Q {
        &mut self.queue
    }

    /// The peer's address of a live connection.
    pub fn peer(&self, id: ConnId) -> Option<SocketAddrV4> {
        let key = self.conns[self.live(id)?].key?;
        Some(SocketAddrV4::new(
            Ipv4Addr::from(key.remote_ip),
            key.remote_port,
        ))
    }

    // ---- helpers shared by ingress and egress ----

    /// Microseconds since the epoch; never goes backwards.
    fn micros(&mut self, now: Instant) -> u64 {
        let t = now.saturating_duration_since(self.epoch).as_micros() as u64;
        self.last_t = self.last_t.max(t);
        self.last_t
    }

    /// The time of the last poll/flush, for API calls that take no `now`.
    fn s_now_cached(&self) -> SInstant {
        SInstant::from_micros(self.last_t as i64)
    }

    /// The slot of a live connection.
    fn live(&self, id: ConnId) -> Option<usize> {
        let c = self.conns.get(id.slot as usize)?;
        (c.gen == id.gen && c.key.is_some()).then_some(id.slot as usize)
    }

    fn id_of(&self, slot: u32) -> ConnId {
        ConnId {
            slot,
            gen: self.conns[slot as usize].gen,
        }
    }

    fn next_hop(&self, dst: Ipv4Addr) -> Option<Ipv4Addr> {
        if in_prefix(self.cfg.ip, dst, self.cfg.prefix_len) {
            Some(dst)
        } else {
            self.cfg.gateway
        }
    }

    fn ephemeral_port(&mut self, remote: SocketAddrV4) -> Result<u16, NetError> {
        for _ in 0..16384 {
            let p = self.next_ephemeral;
            self.next_ephemeral = if p == 65535 { 49152 } else { p + 1 };
            let key = FlowKey {
                remote_ip: u32::from(*remote.ip()),
                remote_port: remote.port(),
                local_port: p,
            };
            if !self.table.contains_key(&key) {
                return Ok(p);
            }
        }
        Err(NetError::Full)
    }

    /// A free slot (reused, or new below `max_connections`).
    fn alloc_slot(&mut self, now: SInstant) -> Option<u32> {
        if self.open >= self.cfg.max_connections {
            return None;
        }
        if let Some(s) = self.free.pop() {
            return Some(s);
        }
        if self.conns.len() >= self.cfg.max_connections {
            return None;
        }
        self.seed = self
            .seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let c = if self.cfg.owned_tcp {
            Conn::new_owned(
                self.cfg.rx_buffer,
                self.cfg.tx_buffer,
                self.cfg
                    .mss
                    .min(self.caps.max_transmission_unit as u16 - 40),
                self.cfg.tcp_fast_path,
                self.cfg.send_stall_timeout,
            )
        } else {
            Conn::new(
                &self.caps,
                self.cfg.ip,
                self.seed,
                self.cfg.rx_buffer,
                self.cfg.tx_buffer,
                now,
            )
        };
        self.conns.push(c);
        Some((self.conns.len() - 1) as u32)
    }

    /// Frees a slot; reports `Closed` when the owner knows the connection.
    fn release(&mut self, slot: u32, report: bool) {
        let c = &mut self.conns[slot as usize];
        let Some(key) = c.key.take() else {
            return;
        };
        let id = ConnId { slot, gen: c.gen };
        c.gen = c.gen.wrapping_add(1);
        c.timer = None;
        c.dirty = false;
        c.arp_wait = false;
        if c.state() != State::Closed {
            c.abort();
        }
        c.free_buffers(&mut self.pools);
        self.table.remove(&key);
        self.free.push(slot);
        self.open -= 1;
        self.stats.tcp_conns_open = self.open as u64;
        self.stats.tcp_conns_closed += 1;
        if report {
            self.events.push(NetEvent::Closed(id));
        }
        self.serve_waiters();
    }

    /// Puts the connection in `slot` on the receive wait list if it went without a receive
    /// buffer since the last check and is not waiting yet; true if it was put there.
    fn wait_if_rx_starved(&mut self, slot: u32) -> bool {
        let c = &mut self.conns[slot as usize];
        if !c.take_rx_starved() || c.rx_waiting {
            return false;
        }
        c.rx_waiting = true;
        let id = ConnId { slot, gen: c.gen };
        self.push_waiter(id, false);
        true
    }

    /// Puts a connection on the send (`tx`) or receive wait list. Entries of connections that
    /// closed while waiting stay until served or swept: past two per slot, the list drops them.
    fn push_waiter(&mut self, id: ConnId, tx: bool) {
        self.stats.tcp_buffer_waits += 1;
        let q = if tx {
            self.pools.tx.note_dry();
            &mut self.tx_waiters
        } else {
            self.pools.rx.note_dry();
            &mut self.rx_waiters
        };
        if q.len() >= 2 * self.conns.len() {
            let conns = &self.conns;
            q.retain(|w| {
                conns
                    .get(w.slot as usize)
                    .is_some_and(|c| c.gen == w.gen && c.key.is_some())
            });
        }
        q.push_back(id);
    }

    /// Hands buffers that came back to connections waiting for one (`serve_waiting_lists`);
    /// the common case, nobody waiting, is one check on the per-request path.
    #[inline]
    fn serve_waiters(&mut self) {
        if !self.rx_waiters.is_empty() || !self.tx_waiters.is_empty() {
            self.serve_waiting_lists();
        }
    }

    /// Hands buffers that came back to connections waiting for one, oldest first: a receive
    /// buffer opens the waiter's window (an update goes out with the next `flush`), a send
    /// buffer is reported as `Writable`. Waiters that closed meanwhile are skipped.
    #[cold]
    fn serve_waiting_lists(&mut self) {
        while self.pools.rx.available() > 0 {
            let Some(id) = self.rx_waiters.pop_front() else {
                break;
            };
            let Some(slot) = self.live(id) else { continue };
            let c = &mut self.conns[slot];
            c.rx_waiting = false;
            if c.grant_rx(&mut self.pools, self.last_t) {
                self.mark_dirty(id.slot);
            }
        }
        while self.pools.tx.available() > 0 {
            let Some(id) = self.tx_waiters.pop_front() else {
                break;
            };
            let Some(slot) = self.live(id) else { continue };
            let c = &mut self.conns[slot];
            c.tx_waiting = false;
            // Only to an owner that still wants to write: a buffer handed to one that does
            // not would sit empty until the connection closes.
            if c.want_write && c.may_send() && c.grant_tx(&mut self.pools) {
                c.want_write = false;
                self.events.push(NetEvent::Writable(id));
            }
        }
    }

    /// The initial sequence number of connection `key` (RFC 6528, `isn.rs`).
    fn next_iss(&self, key: FlowKey) -> u32 {
        self.isn.isn(self.cfg.ip, key, self.last_t)
    }

    fn mark_dirty(&mut self, slot: u32) {
        let c = &mut self.conns[slot as usize];
        if !c.dirty {
            c.dirty = true;
            self.dirty.push(slot);
        }
    }
}

fn in_prefix(a: Ipv4Addr, b: Ipv4Addr, len: u8) -> bool {
    if len == 0 {
        return true;
    }
    let mask = u32::MAX << (32 - u32::from(len.min(32)));
    u32::from(a) & mask == u32::from(b) & mask
}
