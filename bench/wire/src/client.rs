//! The load generator: one thread running its own `net::Stack` on the far end of the in-memory
//! port, with N connections each keeping `depth` requests in flight (closed loop: a completed
//! reply is answered by the next request on the same connection).
//!
//! Keys are uniform over the rows (xorshift, seeded). Every reply is framed by its known length
//! (all rows have the same length, so a wrong reply shifts the stream and is caught); the first
//! bytes of every row reply are compared with the expected row (they carry the row id) and every
//! `sample_every`-th reply is compared in full. A mismatch, a closed connection or a stall stops
//! the run with an error.
//!
//! More connections than one client address can open to the server's port
//! ([`Load::conns_per_stack`]) are spread over several client stacks, each with its own
//! address, sharing the port ([`split`]).
//!
//! Thread model: everything here runs on the client thread; the server is only seen through the
//! wire and through the [`ServerProbe`] it publishes.

use std::collections::VecDeque;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pgline_dataplane::net::{ConnId, NetConfig, NetError, NetEvent, Stack};
use pgline_nic::mem::MemQueue;

use crate::cpu::ThreadClock;
use crate::rows::{Rows, PREFIX};
use crate::split::{self, ClientQueue};

/// Bytes of every row reply compared on every reply (the `$len\r\n{"id":N,` part and more).
const CHECK_PREFIX: usize = 24;
/// Input bytes already parsed before the buffer is compacted.
const COMPACT_AT: usize = 32 * 1024;
/// Handshakes started and not yet complete, at most: a burst of SYNs larger than the port's
/// ring would be dropped and retried until connections time out.
const HANDSHAKES_IN_FLIGHT: usize = 2_048;
/// No reply at all for this long: the run is stuck.
const STALL: Duration = Duration::from_secs(10);

/// What the server thread publishes each turn (single writer, relaxed).
#[derive(Default)]
pub struct ServerProbe {
    /// Wall nanoseconds in turns that did work.
    pub busy_ns: AtomicU64,
    /// Wall nanoseconds in all turns.
    pub total_ns: AtomicU64,
    /// Turns that did work.
    pub busy_turns: AtomicU64,
}

/// The load's shape.
#[derive(Clone, Copy, Debug)]
pub struct Load {
    pub conns: usize,
    pub depth: usize,
    /// Keys per MGET; 0 = GET.
    pub mget: usize,
    pub warmup: Duration,
    pub secs: Duration,
    pub sample_every: u64,
    pub seed: u64,
    /// Connections per client stack (address); more connections use more stacks.
    pub conns_per_stack: usize,
    /// After the window: this long without new requests, then the idle resident set is read
    /// (zero: not read).
    pub idle: Duration,
}

/// Counters at one instant.
#[derive(Clone, Copy, Debug, Default)]
pub struct Snapshot {
    pub at: Option<Instant>,
    pub requests: u64,
    pub keys: u64,
    pub server_cpu: Duration,
    pub server_busy_ns: u64,
    pub server_total_ns: u64,
    pub server_busy_turns: u64,
    pub client_cpu: Duration,
    pub client_busy_ns: u64,
    pub client_total_ns: u64,
}

/// How the run went.
#[derive(Debug, Default)]
pub struct Outcome {
    pub start: Snapshot,
    pub end: Snapshot,
    /// Replies compared in full.
    pub verified: u64,
    pub error: Option<String>,
    pub client_retransmits: u64,
    /// The process's resident set before the first connection (store, both stacks, buffers
    /// sized at start) and with every connection open at the end of the window.
    pub rss_base: Option<u64>,
    pub rss_open: Option<u64>,
    /// The same, [`Load::idle`] after the last request: every connection open and idle.
    pub rss_idle: Option<u64>,
}

struct Conn {
    /// The client stack it is on, and its id there.
    stack: usize,
    id: ConnId,
    connected: bool,
    input: Vec<u8>,
    parsed: usize,
    out: Vec<u8>,
    sent: usize,
    /// Keys of the requests in flight, in order (MGET: all its keys).
    keys: VecDeque<u32>,
    ready: bool,
    queued_tx: bool,
}

/// The client side of one run.
pub struct Client<'a> {
    stacks: Vec<Stack<ClientQueue>>,
    rows: &'a Rows,
    load: Load,
    conns: Vec<Conn>,
    /// Connection index by stack and `ConnId::slot()`.
    by_slot: Vec<Vec<u32>>,
    /// One stack's events of this turn.
    events: Vec<NetEvent>,
    ready: Vec<u32>,
    tx: Vec<u32>,
    tx_next: Vec<u32>,
    rng: u64,
    requests: u64,
    keys_done: u64,
    verified: u64,
    connected: usize,
    error: Option<String>,
    /// Wall nanoseconds in turns that did work, and in all turns.
    busy_ns: u64,
    total_ns: u64,
    /// Connections wait for every handshake before their first request (see [`Client::run`]).
    hold: bool,
    /// The window is over: replies issue no new requests.
    idle: bool,
}

impl<'a> Client<'a> {
    /// Client stacks from address `ip` up (one per `load.conns_per_stack` connections) on
    /// `queue`, ready to open `load.conns` connections.
    pub fn new(queue: MemQueue, ip: Ipv4Addr, rows: &'a Rows, load: Load) -> Result<Self, String> {
        let n = load.conns.div_ceil(load.conns_per_stack.max(1)).max(1);
        let ips: Vec<Ipv4Addr> = (0..n as u32)
            .map(|i| Ipv4Addr::from(u32::from(ip) + i))
            .collect();
        let mut stacks = Vec::with_capacity(n);
        let mut by_slot = Vec::with_capacity(n);
        for (i, q) in split::client_queues(queue, &ips).into_iter().enumerate() {
            let mut cfg = NetConfig::new(ips[i], 24);
            cfg.max_connections = load.conns.div_ceil(n) + 16;
            cfg.rx_buffer = 64 * 1024;
            cfg.rx_burst = 64;
            // smoltcp's TCP, as in every figure so far; the server's is the one measured.
            cfg.owned_tcp = false;
            by_slot.push(vec![u32::MAX; cfg.max_connections]);
            stacks.push(Stack::new(q, cfg).map_err(|e| format!("client stack {i}: {e}"))?);
        }
        Ok(Client {
            stacks,
            rows,
            load,
            conns: Vec::with_capacity(load.conns),
            by_slot,
            events: Vec::with_capacity(4096),
            ready: Vec::with_capacity(load.conns),
            tx: Vec::with_capacity(load.conns),
            tx_next: Vec::with_capacity(load.conns),
            rng: load.seed | 1,
            requests: 0,
            keys_done: 0,
            verified: 0,
            connected: 0,
            error: None,
            busy_ns: 0,
            total_ns: 0,
            hold: false,
            idle: false,
        })
    }

    /// Connects, warms up, measures; returns the counters at the window's edges.
    pub fn run(
        mut self,
        server: SocketAddrV4,
        server_clock: ThreadClock,
        probe: &ServerProbe,
    ) -> Outcome {
        let mut out = Outcome {
            rss_base: crate::cpu::rss_bytes(),
            ..Outcome::default()
        };
        if let Err(e) = self.open(server) {
            out.error = Some(e);
            return out;
        }
        let start = Instant::now();
        let (warm_end, end) = (
            start + self.load.warmup,
            start + self.load.warmup + self.load.secs,
        );
        let mut last_progress = (start, 0u64);
        let mut last = (start, false);
        loop {
            let now = Instant::now();
            let ns = (now - last.0).as_nanos() as u64;
            self.total_ns += ns;
            if last.1 {
                self.busy_ns += ns;
            }
            if out.start.at.is_none() && now >= warm_end {
                out.start = self.snapshot(now, server_clock, probe);
            }
            if now >= end || self.error.is_some() {
                out.end = self.snapshot(now, server_clock, probe);
                out.rss_open = crate::cpu::rss_bytes();
                if self.error.is_none() && !self.load.idle.is_zero() {
                    self.settle(now + self.load.idle);
                    out.rss_idle = crate::cpu::rss_bytes();
                }
                break;
            }
            let worked = self.turn(now);
            last = (now, worked);
            if self.requests != last_progress.1 {
                last_progress = (now, self.requests);
            } else if now - last_progress.0 > STALL {
                self.error = Some(format!(
                    "stalled: no reply for {STALL:?} ({} connected of {}, {} replies so far); {}",
                    self.connected,
                    self.load.conns,
                    self.requests,
                    self.describe()
                ));
            }
        }
        out.verified = self.verified;
        out.error = self.error.take();
        out.client_retransmits = self.stacks.iter().map(|s| s.stats().tcp_retransmits).sum();
        out
    }

    /// Lets the requests in flight finish without issuing new ones, until `until`.
    fn settle(&mut self, until: Instant) {
        self.idle = true;
        while Instant::now() < until && self.error.is_none() {
            if !self.turn(Instant::now()) {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    /// The state of the first connections and of the stack, for a stall report.
    fn describe(&self) -> String {
        let mut s = String::new();
        for (i, c) in self.conns.iter().take(4).enumerate() {
            s.push_str(&format!(
                "conn {i}: {} keys in flight, {} of {} request bytes sent, {} reply bytes unparsed, send capacity {}; ",
                c.keys.len(),
                c.sent,
                c.out.len(),
                c.input.len() - c.parsed,
                self.stacks[c.stack].send_capacity(c.id)
            ));
        }
        s.push_str(&self.stack_totals());
        s
    }

    /// The client stacks' counters that tell why connections fail, summed.
    fn stack_totals(&self) -> String {
        let st = self.net_stats();
        let sum = |f: fn(&pgline_dataplane::net::NetStats) -> u64| st.iter().map(f).sum::<u64>();
        format!(
            "client stacks ({}): {} frames out, {} in, {} retransmits, {} RST sent, {} closed, {} dropped (no buffer {}, ring {}, no ARP {})",
            st.len(),
            sum(|s| s.tx_frames),
            sum(|s| s.rx_frames),
            sum(|s| s.tcp_retransmits),
            sum(|s| s.tcp_rst_sent),
            sum(|s| s.tcp_conns_closed),
            sum(|s| s.tx_dropped_nobuf + s.tx_dropped_ring + s.tx_dropped_no_arp),
            sum(|s| s.tx_dropped_nobuf),
            sum(|s| s.tx_dropped_ring),
            sum(|s| s.tx_dropped_no_arp),
        )
    }

    fn snapshot(&self, now: Instant, server: ThreadClock, probe: &ServerProbe) -> Snapshot {
        Snapshot {
            at: Some(now),
            requests: self.requests,
            keys: self.keys_done,
            server_cpu: server.read(),
            server_busy_ns: probe.busy_ns.load(Ordering::Relaxed),
            server_total_ns: probe.total_ns.load(Ordering::Relaxed),
            server_busy_turns: probe.busy_turns.load(Ordering::Relaxed),
            client_cpu: ThreadClock::current().read(),
            client_busy_ns: self.busy_ns,
            client_total_ns: self.total_ns,
        }
    }

    /// Opens every connection, at most [`HANDSHAKES_IN_FLIGHT`] at a time, waits for the
    /// handshakes, then starts the requests on all of them (with 100,000 connections, requests
    /// on the first ones would delay the handshakes of the last past their timeouts).
    fn open(&mut self, server: SocketAddrV4) -> Result<(), String> {
        self.hold = true;
        let limit = Duration::from_secs(20 + self.load.conns as u64 / 5_000);
        let until = Instant::now() + limit;
        while self.connected < self.load.conns {
            let now = Instant::now();
            if now > until {
                return Err(format!(
                    "{} of {} connections established after {limit:?}; {}",
                    self.connected,
                    self.load.conns,
                    self.stack_totals()
                ));
            }
            let pending = self.conns.len() - self.connected;
            self.connect_more(server, HANDSHAKES_IN_FLIGHT.saturating_sub(pending))?;
            self.turn(now);
            if let Some(e) = self.error.take() {
                return Err(e);
            }
        }
        self.hold = false;
        for c in 0..self.conns.len() {
            self.start_requests(c);
        }
        Ok(())
    }

    /// Starts every connection; the handshakes complete as the client and server turn.
    pub fn connect_all(&mut self, server: SocketAddrV4) -> Result<(), String> {
        self.connect_more(server, usize::MAX)
    }

    /// Starts up to `n` more connections, spread over the client stacks in order.
    fn connect_more(&mut self, server: SocketAddrV4, n: usize) -> Result<(), String> {
        let per_stack = self.load.conns.div_ceil(self.stacks.len());
        let start = self.conns.len();
        for i in start..self.load.conns.min(start.saturating_add(n)) {
            let stack = i / per_stack;
            let id = self.stacks[stack]
                .connect(server, 0)
                .map_err(|e| format!("connect {i} (client stack {stack}): {e}"))?;
            self.by_slot[stack][id.slot()] = i as u32;
            self.conns.push(Conn {
                stack,
                id,
                connected: false,
                input: Vec::with_capacity(64 * 1024),
                parsed: 0,
                out: Vec::with_capacity(4096),
                sent: 0,
                keys: VecDeque::with_capacity(self.load.depth * self.load.mget.max(1)),
                ready: false,
                queued_tx: false,
            });
        }
        Ok(())
    }

    /// One turn for a driver that runs the server in the same thread (`lockstep`): whether
    /// anything arrived, or the first wrong reply.
    pub fn step(&mut self, now: Instant) -> Result<bool, String> {
        let worked = self.turn(now);
        match self.error.take() {
            Some(e) => Err(e),
            None => Ok(worked),
        }
    }

    /// Connections whose handshake completed.
    pub fn connected(&self) -> usize {
        self.connected
    }

    /// The client stacks' counters (frames sent and received, retransmissions), one per stack.
    pub fn net_stats(&self) -> Vec<pgline_dataplane::net::NetStats> {
        self.stacks.iter().map(|s| *s.stats()).collect()
    }

    /// Replies received and checked so far.
    pub fn requests(&self) -> u64 {
        self.requests
    }

    /// One client turn: RX and events, parse replies and issue the next requests, TX. Returns
    /// whether anything arrived.
    fn turn(&mut self, now: Instant) -> bool {
        let mut worked = false;
        for stack in 0..self.stacks.len() {
            self.events.clear();
            worked |= self.stacks[stack].poll(now, &mut self.events);
            self.on_events(stack);
        }
        for i in 0..self.ready.len() {
            let c = self.ready[i] as usize;
            self.conns[c].ready = false;
            self.receive(c);
        }
        self.ready.clear();
        self.transmit();
        for stack in &mut self.stacks {
            stack.flush(now);
        }
        worked
    }

    /// Handles the events one stack's poll gave.
    fn on_events(&mut self, stack: usize) {
        for i in 0..self.events.len() {
            match self.events[i] {
                NetEvent::Connected(id) => self.on_connected(stack, id),
                NetEvent::Readable(id) => {
                    if let Some(c) = self.index(stack, id) {
                        if !self.conns[c].ready {
                            self.conns[c].ready = true;
                            self.ready.push(c as u32);
                        }
                    }
                }
                NetEvent::Writable(id) => {
                    if let Some(c) = self.index(stack, id) {
                        self.queue_tx(c);
                    }
                }
                NetEvent::Closed(id) => {
                    if self.error.is_none() {
                        let c = self.index(stack, id);
                        self.error = Some(format!(
                            "connection {c:?} closed (reset by the server, or timed out) with {} of {} connected; {}",
                            self.connected,
                            self.load.conns,
                            self.stack_totals()
                        ));
                    }
                }
                NetEvent::Accepted { .. } => {}
            }
        }
    }

    fn index(&self, stack: usize, id: ConnId) -> Option<usize> {
        let c = *self.by_slot[stack].get(id.slot())? as usize;
        (c < self.conns.len() && self.conns[c].stack == stack && self.conns[c].id == id)
            .then_some(c)
    }

    fn on_connected(&mut self, stack: usize, id: ConnId) {
        let Some(c) = self.index(stack, id) else {
            return;
        };
        if self.conns[c].connected {
            return;
        }
        self.conns[c].connected = true;
        self.connected += 1;
        if !self.hold {
            self.start_requests(c);
        }
    }

    /// Puts connection `c`'s first `depth` requests in flight.
    fn start_requests(&mut self, c: usize) {
        for _ in 0..self.load.depth {
            self.push_request(c);
        }
        self.queue_tx(c);
    }

    fn queue_tx(&mut self, c: usize) {
        if !self.conns[c].queued_tx {
            self.conns[c].queued_tx = true;
            self.tx.push(c as u32);
        }
    }

    /// Appends one request with fresh random keys to connection `c`'s output.
    fn push_request(&mut self, c: usize) {
        let rows = self.rows.rows() as u64;
        let conn = &mut self.conns[c];
        let n = self.load.mget;
        let mut itoa = itoa::Buffer::new();
        if n == 0 {
            conn.out.extend_from_slice(b"*2\r\n$3\r\nGET\r\n");
        } else {
            conn.out.push(b'*');
            conn.out.extend_from_slice(itoa.format(n + 1).as_bytes());
            conn.out.extend_from_slice(b"\r\n$4\r\nMGET\r\n");
        }
        for _ in 0..n.max(1) {
            self.rng ^= self.rng << 13;
            self.rng ^= self.rng >> 7;
            self.rng ^= self.rng << 17;
            let key = (((self.rng >> 32) * rows) >> 32) as u32;
            let digits = itoa.format(key).len();
            conn.out.push(b'$');
            let klen = PREFIX.len() + 1 + digits;
            conn.out
                .extend_from_slice(itoa::Buffer::new().format(klen).as_bytes());
            conn.out.extend_from_slice(b"\r\n");
            conn.out.extend_from_slice(PREFIX.as_bytes());
            conn.out.push(b':');
            conn.out.extend_from_slice(itoa.format(key).as_bytes());
            conn.out.extend_from_slice(b"\r\n");
            conn.keys.push_back(key);
        }
    }

    /// Reads what arrived on `c`, checks complete replies and sends the next requests.
    fn receive(&mut self, c: usize) {
        loop {
            let conn = &mut self.conns[c];
            match self.stacks[conn.stack].recv(conn.id, &mut conn.input, 1 << 16) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => {
                    self.error
                        .get_or_insert_with(|| format!("recv on connection {c}: {e}"));
                    return;
                }
            }
        }
        let n = self.load.mget;
        let row_len = self.rows.reply_len();
        let header_len = if n == 0 { 0 } else { 3 + count_digits(n) };
        let need = header_len + n.max(1) * row_len;
        let mut issued = false;
        while self.conns[c].input.len() - self.conns[c].parsed >= need {
            if let Err(e) = self.check_reply(c, header_len, row_len) {
                self.error.get_or_insert(e);
                return;
            }
            self.conns[c].parsed += need;
            self.requests += 1;
            self.keys_done += n.max(1) as u64;
            if !self.idle {
                self.push_request(c);
                issued = true;
            }
        }
        let conn = &mut self.conns[c];
        if conn.parsed == conn.input.len() {
            conn.input.clear();
            conn.parsed = 0;
        } else if conn.parsed >= COMPACT_AT {
            conn.input.drain(..conn.parsed);
            conn.parsed = 0;
        }
        if issued {
            self.queue_tx(c);
        }
    }

    /// Checks the complete reply at connection `c`'s parse position against its keys.
    fn check_reply(&mut self, c: usize, header_len: usize, row_len: usize) -> Result<(), String> {
        let full = self.requests.is_multiple_of(self.load.sample_every);
        let conn = &mut self.conns[c];
        let reply = &conn.input[conn.parsed..];
        if header_len > 0 {
            let want = format!("*{}\r\n", self.load.mget);
            if &reply[..header_len] != want.as_bytes() {
                return Err(mismatch(c, self.requests, want.as_bytes(), reply));
            }
        }
        for k in 0..self.load.mget.max(1) {
            let key = conn
                .keys
                .pop_front()
                .ok_or_else(|| format!("connection {c}: a reply with no request in flight"))?;
            let at = header_len + k * row_len;
            let got = &reply[at..at + row_len];
            let want = self.rows.reply(key);
            let len = if full {
                row_len
            } else {
                CHECK_PREFIX.min(row_len)
            };
            if got[..len] != want[..len] {
                return Err(mismatch(c, self.requests, want, got));
            }
        }
        if full {
            self.verified += 1;
        }
        Ok(())
    }

    /// Hands each connection's unsent requests to the stack.
    fn transmit(&mut self) {
        std::mem::swap(&mut self.tx, &mut self.tx_next);
        for i in 0..self.tx_next.len() {
            let c = self.tx_next[i] as usize;
            let conn = &mut self.conns[c];
            conn.queued_tx = false;
            if !conn.connected || conn.sent == conn.out.len() {
                continue;
            }
            match self.stacks[conn.stack].send(conn.id, &conn.out[conn.sent..]) {
                Ok(n) => conn.sent += n,
                Err(NetError::Full) => {}
                Err(e) => {
                    self.error
                        .get_or_insert_with(|| format!("send on connection {c}: {e}"));
                }
            }
            if conn.sent == conn.out.len() {
                conn.out.clear();
                conn.sent = 0;
            } else {
                // Resumed on Writable; keep it queued too in case that already fired.
                conn.queued_tx = true;
                self.tx.push(c as u32);
            }
        }
        self.tx_next.clear();
    }
}

fn count_digits(mut n: usize) -> usize {
    let mut d = 1;
    while n >= 10 {
        n /= 10;
        d += 1;
    }
    d
}

fn mismatch(c: usize, reply_no: u64, want: &[u8], got: &[u8]) -> String {
    let got = &got[..got.len().min(want.len())];
    format!(
        "connection {c}, reply {reply_no}: expected {:?}, got {:?}",
        String::from_utf8_lossy(want),
        String::from_utf8_lossy(got)
    )
}
