//! One dataplane core on a userspace TCP stack: a busy-polling loop that owns its stack (and
//! through it its NIC queue), its connections and its session state.
//!
//! ```text
//!  poll_once(now)
//!    ├─ stack.poll            RX burst, TCP ingress, timers → events
//!    ├─ process_events        Accepted: new session, RESP or PostgreSQL by the listening
//!    │                        port (over the limit: error reply, close)
//!    │                        Readable / Writable: mark, put on the active list
//!    │                        Closed: the stack dropped it; drop the session
//!    ├─ poll_keyspace         one atomic load
//!    ├─ poll_replies          control-plane answers -> deferred replies, released in order
//!    ├─ poll_sessions         per active connection, bounded:
//!    │    stack.recv → session::Worker::process_requests → stack.send (unsent bytes kept,
//!    │    resumed on Writable)
//!    ├─ stack.flush           TX: only connections with something to send, one burst
//!    ├─ poll_limits           every 100 ms: reply-memory cap, timeouts, buffers (`limits`)
//!    └─ end_turn              wake the control plane once if misses were pushed
//! ```
//! The session layer ([`super::session`], [`super::slots`]) is the kernel path's, unchanged: the
//! same parsing, execution, miss queues, ordering and limits. Only the byte movement differs.
//!
//! Thread model: one thread per core, spinning: the control plane's replies are found by polling
//! the core's reply queue every turn, so the core's waker is a no-op. After `spin_polls` empty
//! turns in a row the thread yields between turns (it still never sleeps: a DPDK core owns its
//! CPU, and in-process tests share theirs).
//!
//! Limitations: connections are not spread over cores by this loop; the port's RSS (or the test)
//! decides which core's queue a flow arrives on. The limits are the kernel path's: per-port and
//! per-source connection counts at accept (the source from `StreamStack::peer`, counted in a
//! table the engine's cores share), reply-memory cap, timeouts and AUTH failures in the session
//! layer.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use rustc_hash::FxHashMap;

use crate::plane::{ConnToken, CoreStats, NoWake, Shared};
use crate::transport::stream::{StreamError, StreamEvent, StreamStack};

use super::limits::{self, Sources};
use super::pg;
use super::session::{Next, Worker};
use super::slots::{Entry, Slots, Transport};
use super::EngineConfig;

/// Bytes received from one connection per turn before other connections get their turn.
const READ_PER_TURN: usize = 256 * 1024;
/// Bytes asked of the stack per `recv`.
const READ_CHUNK: usize = 64 * 1024;
/// Turns between publications of the stack's counters.
const PUBLISH_EVERY: u32 = 512;

/// A connection's stack handle and what the stack last reported about it.
pub(crate) struct Flow<Id> {
    id: Id,
    /// The stack may hold unread bytes or an unread FIN.
    readable: bool,
    /// The stack took less than it was given; wait for `Writable`.
    write_blocked: bool,
    /// Broken: abort instead of closing.
    failed: bool,
}

/// The stack and the map from its connection ids to slots.
struct Streams<S: StreamStack> {
    stack: S,
    slot_of: FxHashMap<S::Id, usize>,
}

pub struct UserCore<S: StreamStack> {
    streams: Streams<S>,
    events: Vec<StreamEvent<S::Id>>,
    slots: Slots<Flow<S::Id>>,
    worker: Worker,
    turns: u32,
    /// The PostgreSQL port (`cfg.pg_listen`'s), if the pgwire front is on.
    pg_port: Option<u16>,
}

impl<S: StreamStack> UserCore<S> {
    /// Takes `stack`, listens on `cfg.listen`'s port (and `cfg.pg_listen`'s, for PostgreSQL
    /// clients) and sets a no-op waker for core `id`.
    /// `sources` counts connections per source address across the engine's cores (the
    /// per-source limit).
    pub fn new(
        id: usize,
        mut stack: S,
        shared: Arc<Shared>,
        cfg: Arc<EngineConfig>,
        sources: Arc<Sources>,
    ) -> Self {
        stack.listen(cfg.listen.port());
        let pg_port = cfg.pg_listen.map(|a| a.port());
        if let Some(port) = pg_port {
            stack.listen(port);
        }
        let port = shared.core_port(id);
        // Poll mode needs no wake-up: the core looks at its reply queues every turn.
        port.set_waker(Arc::new(NoWake));
        let per_core = cfg.max_connections_per_core();
        let mut slot_of = FxHashMap::default();
        slot_of.reserve(per_core.min(1 << 16));
        let mut worker = Worker::new(port, cfg);
        worker.sources = sources;
        UserCore {
            streams: Streams { stack, slot_of },
            events: Vec::with_capacity(1024),
            slots: Slots::new(),
            worker,
            turns: 0,
            pg_port,
        }
    }

    /// Runs until `stop` is set.
    pub fn run(&mut self, stop: &AtomicBool) {
        let mut idle = 0u32;
        self.worker.port.set_transport("userspace");
        while !stop.load(Ordering::Relaxed) {
            if self.poll_once(Instant::now()) {
                idle = 0;
            } else {
                idle = idle.saturating_add(1);
                if idle >= self.worker.cfg.spin_polls {
                    std::thread::yield_now();
                }
            }
        }
    }

    /// One turn of the loop at time `now`; returns whether anything was done.
    pub fn poll_once(&mut self, now: Instant) -> bool {
        CoreStats::add(&self.worker.stats().polls, 1);
        self.worker.now = now;
        self.events.clear();
        let mut worked = self.streams.stack.poll(now, &mut self.events);
        self.process_events();
        self.worker.poll_keyspace();
        worked |= self.slots.poll_replies(&self.worker);
        worked |= self.slots.poll_tracking(&mut self.worker);
        worked |= self
            .slots
            .poll_sessions(&mut self.streams, &mut self.worker);
        self.slots.poll_limits(&mut self.streams, &mut self.worker);
        self.streams.stack.flush(now);
        self.worker.end_turn();
        self.turns += 1;
        if self.turns >= PUBLISH_EVERY {
            self.turns = 0;
            self.publish_counters();
        }
        worked
    }

    /// Copies the stack's counters into this core's published stats.
    fn publish_counters(&self) {
        let c = self.streams.stack.counters();
        let stats = self.worker.stats();
        stats.net_rx_frames.store(c.rx_frames, Ordering::Relaxed);
        stats.net_tx_frames.store(c.tx_frames, Ordering::Relaxed);
        stats.net_rx_dropped.store(c.rx_dropped, Ordering::Relaxed);
        stats.net_tx_dropped.store(c.tx_dropped, Ordering::Relaxed);
        stats
            .net_tcp_retransmits
            .store(c.tcp_retransmits, Ordering::Relaxed);
        stats
            .net_tcp_buffer_waits
            .store(c.tcp_buffer_waits, Ordering::Relaxed);
        stats
            .net_tcp_send_stall_aborts
            .store(c.tcp_send_stall_aborts, Ordering::Relaxed);
    }

    fn process_events(&mut self) {
        for i in 0..self.events.len() {
            match self.events[i] {
                StreamEvent::Accepted { id, port } => self.accept(id, port),
                StreamEvent::Readable(id) => self.wake(id, |io| io.readable = true),
                StreamEvent::Writable(id) => self.wake(id, |io| io.write_blocked = false),
                StreamEvent::Closed(id) => {
                    // The stack has freed it: drop the session, tell the stack nothing.
                    if let Some(slot) = self.streams.slot_of.remove(&id) {
                        if let Some(entry) = self.slots.get_mut(slot) {
                            let token = ConnToken::new(slot, entry.conn.generation);
                            pg::conn_closed(&self.worker.port, &mut entry.conn, token);
                        }
                        self.slots.remove(slot, &mut self.worker);
                    }
                }
            }
        }
    }

    /// Updates a flow's I/O state and puts its session on the active list (one table lookup).
    fn wake(&mut self, id: S::Id, update: impl FnOnce(&mut Flow<S::Id>)) {
        let Some(&slot) = self.streams.slot_of.get(&id) else {
            return;
        };
        if let Some(entry) = self.slots.get_mut(slot) {
            update(&mut entry.io);
            self.slots.activate(slot);
        }
    }

    fn accept(&mut self, id: S::Id, port: u16) {
        if self.streams.slot_of.contains_key(&id) {
            return;
        }
        let pg = self.pg_port == Some(port);
        let limit = if pg {
            self.worker.cfg.max_pg_connections_per_core()
        } else {
            self.worker.cfg.max_connections_per_core()
        };
        let peer = self.streams.stack.peer(id);
        let reject = if self.slots.open_on(pg) >= limit {
            CoreStats::add(&self.worker.stats().connections_rejected, 1);
            Some(if pg {
                super::kernel::PG_REJECT
            } else {
                super::kernel::RESP_REJECT
            })
        } else {
            None
        };
        // The per-source count is shared by the engine's cores (a source's flows may land on
        // any of them).
        let source = match (reject, peer) {
            (None, Some(ip)) => match self.worker.admit_source(pg, ip) {
                Some(source) => source,
                None => {
                    let _ = self.streams.stack.send(
                        id,
                        if pg {
                            limits::PG_REJECT_SOURCE
                        } else {
                            limits::RESP_REJECT_SOURCE
                        },
                    );
                    self.streams.stack.close(id);
                    return;
                }
            },
            _ => None,
        };
        if let Some(reject) = reject {
            let _ = self.streams.stack.send(id, reject);
            self.streams.stack.close(id);
            return;
        }
        let (slot, generation) = self.slots.vacant();
        let mut conn = if pg {
            self.worker.new_pg_conn(generation)
        } else {
            self.worker.new_conn(generation)
        };
        conn.source = source;
        if let Some(session) = conn.pg.as_mut() {
            session.peer = peer;
        }
        let flow = Flow {
            id,
            readable: true,
            write_blocked: false,
            failed: false,
        };
        self.streams.slot_of.insert(id, slot);
        self.slots.fill(slot, conn, flow, &mut self.worker);
    }

    /// Open connections on this core.
    pub fn open_connections(&self) -> usize {
        self.slots.open()
    }
}

impl<S: StreamStack> Transport for Streams<S> {
    type Io = Flow<S::Id>;

    fn process(
        &mut self,
        entry: &mut Entry<Self::Io>,
        token: ConnToken,
        worker: &mut Worker,
    ) -> Next {
        self.process_ingress(entry, worker);
        if entry.io.failed {
            return Next::Close;
        }
        let more_input = worker.process_requests(&mut entry.conn, token);
        self.dispatch_egress(entry, worker.stats());
        if entry.io.failed {
            return Next::Close;
        }
        worker.next_step(&entry.conn, more_input, entry.io.readable)
    }

    fn release(&mut self, entry: Entry<Self::Io>) {
        self.slot_of.remove(&entry.io.id);
        if entry.io.failed {
            self.stack.abort(entry.io.id);
        } else {
            self.stack.close(entry.io.id);
        }
    }
}

impl<S: StreamStack> Streams<S> {
    /// Moves what the stack received into the session's input, up to the bounds.
    fn process_ingress(&mut self, entry: &mut Entry<Flow<S::Id>>, worker: &Worker) {
        let Entry { conn, io, .. } = entry;
        let mut read = 0;
        while io.readable && read < READ_PER_TURN && worker.wants_input(conn) {
            let max = READ_CHUNK.min(READ_PER_TURN - read);
            match self.stack.recv(io.id, conn.input_buffer(), max) {
                Ok(0) => io.readable = false,
                Ok(n) => {
                    conn.last_input = worker.now;
                    conn.incomplete = false;
                    read += n;
                }
                Err(StreamError::Closed) => {
                    // The client finished sending: answer what it sent, then close.
                    io.readable = false;
                    conn.eof = true;
                }
                Err(StreamError::Failed) => {
                    io.readable = false;
                    io.failed = true;
                }
            }
        }
        CoreStats::add(&worker.stats().bytes_in, read as u64);
    }

    /// Hands the stack as much of the output as it takes; the rest waits for `Writable`.
    fn dispatch_egress(&mut self, entry: &mut Entry<Flow<S::Id>>, stats: &CoreStats) {
        let Entry { conn, io, .. } = entry;
        while !conn.output_done() && !io.write_blocked {
            match self.stack.send(io.id, conn.output()) {
                Ok(0) => io.write_blocked = true,
                Ok(n) => {
                    conn.advance_output(n);
                    CoreStats::add(&stats.bytes_out, n as u64);
                }
                Err(_) => {
                    io.failed = true;
                    return;
                }
            }
        }
    }
}
