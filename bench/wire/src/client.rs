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

/// Bytes of every row reply compared on every reply (the `$len\r\n{"id":N,` part and more).
const CHECK_PREFIX: usize = 24;
/// Input bytes already parsed before the buffer is compacted.
const COMPACT_AT: usize = 32 * 1024;
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
}

struct Conn {
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
    stack: Stack<MemQueue>,
    rows: &'a Rows,
    load: Load,
    conns: Vec<Conn>,
    /// Connection index by `ConnId::slot()`.
    by_slot: Vec<u32>,
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
}

impl<'a> Client<'a> {
    /// A client stack at `ip` on `queue`, ready to open `load.conns` connections.
    pub fn new(queue: MemQueue, ip: Ipv4Addr, rows: &'a Rows, load: Load) -> Result<Self, String> {
        let mut cfg = NetConfig::new(ip, 24);
        cfg.max_connections = load.conns + 16;
        cfg.rx_buffer = 64 * 1024;
        cfg.rx_burst = 64;
        let stack = Stack::new(queue, cfg).map_err(|e| format!("client stack: {e}"))?;
        Ok(Client {
            stack,
            rows,
            load,
            conns: Vec::with_capacity(load.conns),
            by_slot: vec![u32::MAX; cfg.max_connections],
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
        })
    }

    /// Connects, warms up, measures; returns the counters at the window's edges.
    pub fn run(
        mut self,
        server: SocketAddrV4,
        server_clock: ThreadClock,
        probe: &ServerProbe,
    ) -> Outcome {
        let mut out = Outcome::default();
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
        out.client_retransmits = self.stack.stats().tcp_retransmits;
        out
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
                self.stack.send_capacity(c.id)
            ));
        }
        s.push_str(&format!("client stack {:?}", self.stack.stats()));
        s
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

    /// Opens every connection and waits for the handshakes (requests start as each completes).
    fn open(&mut self, server: SocketAddrV4) -> Result<(), String> {
        self.connect_all(server)?;
        let until = Instant::now() + Duration::from_secs(20);
        while self.connected < self.load.conns {
            let now = Instant::now();
            if now > until {
                return Err(format!(
                    "{} of {} connections established after 20 s",
                    self.connected, self.load.conns
                ));
            }
            self.turn(now);
            if let Some(e) = self.error.take() {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Starts every connection; the handshakes complete as the client and server turn.
    pub fn connect_all(&mut self, server: SocketAddrV4) -> Result<(), String> {
        for i in 0..self.load.conns {
            let id = self
                .stack
                .connect(server, 0)
                .map_err(|e| format!("connect {i}: {e}"))?;
            self.by_slot[id.slot()] = i as u32;
            self.conns.push(Conn {
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

    /// The client stack's counters (frames sent and received, retransmissions).
    pub fn net_stats(&self) -> pgline_dataplane::net::NetStats {
        *self.stack.stats()
    }

    /// Replies received and checked so far.
    pub fn requests(&self) -> u64 {
        self.requests
    }

    /// One client turn: RX and events, parse replies and issue the next requests, TX. Returns
    /// whether anything arrived.
    fn turn(&mut self, now: Instant) -> bool {
        self.events.clear();
        let worked = self.stack.poll(now, &mut self.events);
        for i in 0..self.events.len() {
            match self.events[i] {
                NetEvent::Connected(id) => self.on_connected(id),
                NetEvent::Readable(id) => {
                    if let Some(c) = self.index(id) {
                        if !self.conns[c].ready {
                            self.conns[c].ready = true;
                            self.ready.push(c as u32);
                        }
                    }
                }
                NetEvent::Writable(id) => {
                    if let Some(c) = self.index(id) {
                        self.queue_tx(c);
                    }
                }
                NetEvent::Closed(_) => {
                    self.error
                        .get_or_insert_with(|| "the server closed a connection".into());
                }
                NetEvent::Accepted { .. } => {}
            }
        }
        for i in 0..self.ready.len() {
            let c = self.ready[i] as usize;
            self.conns[c].ready = false;
            self.receive(c);
        }
        self.ready.clear();
        self.transmit();
        self.stack.flush(now);
        worked
    }

    fn index(&self, id: ConnId) -> Option<usize> {
        let c = *self.by_slot.get(id.slot())? as usize;
        (c < self.conns.len() && self.conns[c].id == id).then_some(c)
    }

    fn on_connected(&mut self, id: ConnId) {
        let Some(c) = self.index(id) else { return };
        if self.conns[c].connected {
            return;
        }
        self.conns[c].connected = true;
        self.connected += 1;
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
            match self
                .stack
                .recv(self.conns[c].id, &mut self.conns[c].input, 1 << 16)
            {
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
            self.push_request(c);
            issued = true;
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
            match self.stack.send(conn.id, &conn.out[conn.sent..]) {
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
