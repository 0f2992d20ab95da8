//! One dataplane core on the kernel transport: a poll-mode loop over its own `SO_REUSEPORT`
//! listener and its connections.
//!
//! ```text
//!  poll_once(timeout)
//!    ├─ poll_readiness      epoll: new connections, readable/writable sockets, waker
//!    ├─ poll_accept         accept everything queued; over the limit: error reply, close
//!    ├─ poll_keyspace       one atomic load; a new catalog snapshot only when it moved
//!    ├─ poll_replies        control-plane answers -> deferred replies composed, released in order
//!    └─ poll_sessions       per active connection, bounded:
//!         read → parse_request → parse_command → execute (hit: copy section into wbuf)
//!                                               └ miss: MissRequest → control plane
//!         → write wbuf
//! ```
//! The loop never blocks while there is work: it spins for `spin_polls` empty turns, then sleeps
//! in epoll until a socket or the control plane's waker wakes it. Work per turn is bounded: bytes
//! read per connection, requests per connection, replies held per connection.
//!
//! Latency: a turn in which connections are active records its span once for every request it
//! executed in [`CoreStats::service_time`]: the dataplane's service time of a request batch
//! (parse, execute, compose, socket write), an upper bound for each request in it. The span
//! ends after `poll_sessions`; it starts where the previous working turn's ended when the core
//! went straight on (so it also covers this turn's `epoll` call, replies and keyspace check),
//! or just before `poll_sessions` after an idle turn or a possible sleep. It leaves out the time
//! a request waited in the socket buffer before the turn and, for misses, the origin round trip
//! (their replies leave in a later turn). Cost: one clock read per turn under sustained load,
//! two for the first working turn after an idle one, none while idle; shared by the batch.

use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::net::TcpListener;
use mio::{Events, Interest, Poll, Token};

use crate::keyspace::KeySpace;
use crate::plane::{CoreStats, MissRequest, Shared, Wake};
use crate::resp::compose_error;
use crate::resp::parse_command;
use crate::resp::{parse_request, Args, ParseError};
use crate::transport::kernel;

use super::conn::{Conn, Pending};
use super::execute::{Exec, Outcome};
use super::prefetch;
use super::EngineConfig;

const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);
const FIRST_CONN: usize = 2;
/// Bytes read from one socket per turn before other connections get their turn.
const READ_PER_TURN: usize = 256 * 1024;

struct MioWaker(mio::Waker);

impl Wake for MioWaker {
    fn wake(&self) {
        let _ = self.0.wake();
    }
}

/// State of a core other than its connections, so both can be borrowed at once.
struct Ctx {
    id: usize,
    shared: Arc<Shared>,
    cfg: Arc<EngineConfig>,
    keyspace: Arc<KeySpace>,
    keyspace_generation: u64,
    args: Vec<std::ops::Range<usize>>,
    scratch: Vec<u8>,
    read_buf: Box<[u8]>,
    misses_pushed: bool,
}

pub struct Core {
    poll: Poll,
    events: Events,
    listener: TcpListener,
    conns: Vec<Option<Conn>>,
    generations: Vec<u32>,
    free: Vec<usize>,
    active: Vec<usize>,
    active_spare: Vec<usize>,
    open: usize,
    /// When the previous turn's session pass ended, if that turn processed sessions and this
    /// turn could not sleep since: the start of this turn's service-time span (saves a clock
    /// read per turn under load).
    last_pass_end: Option<Instant>,
    ctx: Ctx,
}

impl Core {
    /// Binds this core's listener and registers its waker with `shared`.
    pub fn new(
        id: usize,
        listen: std::net::SocketAddr,
        shared: Arc<Shared>,
        cfg: Arc<EngineConfig>,
    ) -> io::Result<Core> {
        let poll = Poll::new()?;
        let mut listener = kernel::bind_listener(listen, true, 1024)?;
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        let waker = mio::Waker::new(poll.registry(), WAKER)?;
        let _ = shared.core_wakers[id].set(Arc::new(MioWaker(waker)));
        let keyspace = shared.keyspace.snapshot();
        let keyspace_generation = shared.keyspace.generation();
        Ok(Core {
            poll,
            events: Events::with_capacity(1024),
            listener,
            conns: Vec::new(),
            generations: Vec::new(),
            free: Vec::new(),
            active: Vec::with_capacity(1024),
            active_spare: Vec::with_capacity(1024),
            open: 0,
            last_pass_end: None,
            ctx: Ctx {
                id,
                shared,
                cfg,
                keyspace,
                keyspace_generation,
                args: Vec::with_capacity(64),
                scratch: Vec::with_capacity(64 * 1024),
                read_buf: vec![0u8; 64 * 1024].into_boxed_slice(),
                misses_pushed: false,
            },
        })
    }

    /// The address this core's listener is bound to.
    pub fn local_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.listener.local_addr()
    }

    /// Runs until `stop` is set.
    pub fn run(&mut self, stop: &AtomicBool) {
        let mut idle = 0u32;
        while !stop.load(Ordering::Relaxed) {
            let timeout = if idle < self.ctx.cfg.spin_polls {
                Duration::ZERO
            } else {
                Duration::from_millis(100)
            };
            if self.poll_once(timeout) {
                idle = 0;
            } else {
                idle = idle.saturating_add(1);
            }
        }
    }

    /// One turn of the loop; returns whether anything was done.
    pub fn poll_once(&mut self, timeout: Duration) -> bool {
        let stats = &self.ctx.shared.stats[self.ctx.id];
        CoreStats::add(&stats.polls, 1);
        if !timeout.is_zero() && self.active.is_empty() {
            // poll_readiness may sleep: the previous pass's end no longer marks this turn's start.
            self.last_pass_end = None;
        }
        let mut worked = self.poll_readiness(timeout);
        self.poll_keyspace();
        worked |= self.poll_replies();
        worked |= self.poll_sessions_timed();
        if std::mem::take(&mut self.ctx.misses_pushed) {
            self.ctx.shared.control_waker.wake();
        }
        worked
    }

    fn poll_readiness(&mut self, timeout: Duration) -> bool {
        let timeout = if self.active.is_empty() {
            timeout
        } else {
            Duration::ZERO
        };
        if let Err(e) = self.poll.poll(&mut self.events, Some(timeout)) {
            if e.kind() != io::ErrorKind::Interrupted {
                std::thread::sleep(Duration::from_millis(1));
            }
            return false;
        }
        let mut accept = false;
        let mut any = false;
        for event in self.events.iter() {
            any = true;
            match event.token() {
                LISTENER => accept = true,
                WAKER => {}
                Token(t) => {
                    let slot = t - FIRST_CONN;
                    if let Some(Some(conn)) = self.conns.get_mut(slot) {
                        if event.is_readable() || event.is_read_closed() || event.is_error() {
                            conn.readable = true;
                        }
                        if event.is_read_closed() || event.is_error() {
                            // Read until the 0 that reports it, even after a short read.
                            conn.peer_closed = true;
                        }
                        if event.is_writable() {
                            conn.write_blocked = false;
                        }
                        if !conn.active {
                            conn.active = true;
                            self.active.push(slot);
                        }
                    }
                }
            }
        }
        if accept {
            self.poll_accept();
        }
        any
    }

    fn poll_accept(&mut self) {
        let shared = self.ctx.shared.clone();
        let stats = &shared.stats[self.ctx.id];
        loop {
            let (mut stream, _) = match self.listener.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(_) => return,
            };
            if self.open >= self.ctx.cfg.max_connections_per_core() {
                CoreStats::add(&stats.connections_rejected, 1);
                let _ = stream.write(b"-ERR max number of clients reached\r\n");
                continue;
            }
            let _ = kernel::configure_stream(&stream);
            let slot = self.free.pop().unwrap_or_else(|| {
                self.conns.push(None);
                self.generations.push(0);
                self.conns.len() - 1
            });
            if self
                .poll
                .registry()
                .register(
                    &mut stream,
                    Token(slot + FIRST_CONN),
                    Interest::READABLE | Interest::WRITABLE,
                )
                .is_err()
            {
                self.free.push(slot);
                continue;
            }
            let client_id = shared.next_client_id.fetch_add(1, Ordering::Relaxed);
            let mut conn = Conn::new(
                stream,
                client_id,
                self.generations[slot],
                self.ctx.cfg.password.is_none(),
            );
            conn.active = true;
            self.conns[slot] = Some(conn);
            self.active.push(slot);
            self.open += 1;
            CoreStats::add(&stats.connections_accepted, 1);
            stats
                .connections_open
                .store(self.open as u64, Ordering::Relaxed);
        }
    }

    fn poll_keyspace(&mut self) {
        let generation = self.ctx.shared.keyspace.generation();
        if generation != self.ctx.keyspace_generation {
            self.ctx.keyspace = self.ctx.shared.keyspace.snapshot();
            self.ctx.keyspace_generation = generation;
        }
    }

    /// Applies the control plane's answers to the connections waiting for them.
    fn poll_replies(&mut self) -> bool {
        // Borrowed, not cloned: an Arc clone per turn is an atomic RMW on a line every core shares.
        let queue = &self.ctx.shared.queues[self.ctx.id].replies;
        let mut any = false;
        for _ in 0..queue.capacity() {
            let Some(reply) = queue.pop() else { break };
            any = true;
            let slot = (reply.conn >> 32) as usize;
            let generation = reply.conn as u32;
            let Some(Some(conn)) = self.conns.get_mut(slot) else {
                continue;
            };
            if conn.generation != generation {
                continue;
            }
            let proto = conn.session.proto;
            for pending in conn.pending.iter_mut() {
                if let Pending::Waiting { seq, deferred } = pending {
                    if *seq == reply.seq {
                        let mut bytes = Vec::new();
                        deferred.compose(&reply.results, proto, &mut bytes);
                        *pending = Pending::Ready(bytes);
                        break;
                    }
                }
            }
            conn.release_ready();
            if !conn.active {
                conn.active = true;
                self.active.push(slot);
            }
        }
        any
    }

    /// [`Self::poll_sessions`], recording the turn's span in the core's service-time histogram
    /// once per request it executed. The span starts at the previous pass's end when the turn
    /// follows a working turn without sleeping (one clock read per turn under load), else right
    /// before this pass (two reads); idle turns read no clock.
    fn poll_sessions_timed(&mut self) -> bool {
        if self.active.is_empty() {
            self.last_pass_end = None;
            return false;
        }
        let start = match self.last_pass_end {
            Some(t) => t,
            None => Instant::now(),
        };
        let stats = &self.ctx.shared.stats[self.ctx.id];
        let before = stats.commands.load(Ordering::Relaxed);
        let worked = self.poll_sessions();
        let end = Instant::now();
        self.last_pass_end = Some(end);
        let stats = &self.ctx.shared.stats[self.ctx.id];
        let executed = stats.commands.load(Ordering::Relaxed).wrapping_sub(before);
        if executed > 0 {
            let ns = u64::try_from(end.duration_since(start).as_nanos()).unwrap_or(u64::MAX);
            stats.service_time.record(ns, executed);
        }
        worked
    }

    fn poll_sessions(&mut self) -> bool {
        if self.active.is_empty() {
            return false;
        }
        // Swap with the spare list (both keep their capacity: no allocation per turn).
        let mut active = std::mem::take(&mut self.active);
        std::mem::swap(&mut self.active, &mut self.active_spare);
        for &slot in &active {
            let Some(Some(conn)) = self.conns.get_mut(slot) else {
                continue;
            };
            conn.active = false;
            let token = (slot as u64) << 32 | u64::from(conn.generation);
            match process_conn(conn, token, &mut self.ctx) {
                Next::Idle => {}
                Next::Again => {
                    conn.active = true;
                    self.active.push(slot);
                }
                Next::Close => self.close(slot),
            }
        }
        active.clear();
        self.active_spare = active;
        true
    }

    fn close(&mut self, slot: usize) {
        if let Some(mut conn) = self.conns[slot].take() {
            let _ = self.poll.registry().deregister(&mut conn.stream);
            self.generations[slot] = self.generations[slot].wrapping_add(1);
            self.free.push(slot);
            self.open -= 1;
            let stats = &self.ctx.shared.stats[self.ctx.id];
            CoreStats::add(&stats.connections_closed, 1);
            stats
                .connections_open
                .store(self.open as u64, Ordering::Relaxed);
        }
    }
}

enum Next {
    Idle,
    Again,
    Close,
}

/// Ingress, execution and egress for one connection, bounded.
fn process_conn(conn: &mut Conn, token: u64, ctx: &mut Ctx) -> Next {
    if let Some(next) = process_ingress(conn, ctx) {
        return next;
    }
    let more_input = process_requests(conn, token, ctx);
    match dispatch_egress(conn, ctx) {
        Err(_) => Next::Close,
        Ok(())
            if (conn.closing || (conn.eof && !more_input))
                && conn.wpos == conn.wbuf.len()
                && conn.pending.is_empty() =>
        {
            Next::Close
        }
        Ok(())
            if more_input
                || (conn.readable
                    && !conn.closing
                    && conn.backlog() < ctx.cfg.max_reply_backlog) =>
        {
            Next::Again
        }
        Ok(()) => Next::Idle,
    }
}

/// Reads what the socket has, up to the per-turn and per-connection bounds.
fn process_ingress(conn: &mut Conn, ctx: &mut Ctx) -> Option<Next> {
    let stats = &ctx.shared.stats[ctx.id];
    let mut read = 0;
    while conn.readable && !conn.closing && read < READ_PER_TURN {
        if conn.backlog() >= ctx.cfg.max_reply_backlog
            || conn.rbuf.len() - conn.rpos >= ctx.cfg.max_request_bytes
        {
            break;
        }
        match conn.stream.read(&mut ctx.read_buf) {
            Ok(0) => {
                // The client half-closed: answer what it sent, then close.
                conn.readable = false;
                conn.eof = true;
            }
            Ok(n) => {
                if conn.rpos == conn.rbuf.len() {
                    conn.rbuf.clear();
                    conn.rpos = 0;
                }
                conn.rbuf.extend_from_slice(&ctx.read_buf[..n]);
                read += n;
                // A short read drained the socket: skip the read that would only say EAGAIN.
                // Data arriving later raises a new edge-triggered event. Not when the peer's FIN
                // came with the same event: no new edge would report it, so read on to the 0.
                if n < ctx.read_buf.len() && !conn.peer_closed {
                    conn.readable = false;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => conn.readable = false,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return Some(Next::Close),
        }
    }
    CoreStats::add(&stats.bytes_in, read as u64);
    None
}

/// Parses and executes buffered requests; returns whether complete input is left for later.
fn process_requests(conn: &mut Conn, token: u64, ctx: &mut Ctx) -> bool {
    let serve_hits = ctx.shared.serve_hits.load(Ordering::Relaxed);
    let mut executed = 0;
    let mut more = false;
    if serve_hits && conn.input().len() >= prefetch::MIN_INPUT {
        prefetch::prefetch_pipeline(
            conn.input(),
            &ctx.cfg.limits,
            &mut ctx.args,
            &ctx.keyspace,
            &ctx.shared.store,
        );
    }
    while !conn.input().is_empty() {
        if executed >= ctx.cfg.requests_per_turn
            || conn.backlog() >= ctx.cfg.max_reply_backlog
            || conn.pending.len() >= ctx.cfg.max_pending_per_conn
        {
            more = true;
            break;
        }
        let input = &conn.rbuf[conn.rpos..];
        let consumed = match parse_request(input, &ctx.cfg.limits, &mut ctx.args) {
            Ok(n) => n,
            Err(ParseError::Incomplete) => {
                if input.len() >= ctx.cfg.max_request_bytes {
                    protocol_error(
                        conn,
                        b"ERR Protocol error: request exceeds the size limit",
                        &ctx.shared.stats[ctx.id],
                    );
                }
                break;
            }
            Err(ParseError::Invalid(kind)) => {
                let mut message = b"ERR ".to_vec();
                message.extend_from_slice(kind.message().as_bytes());
                protocol_error(conn, &message, &ctx.shared.stats[ctx.id]);
                break;
            }
        };
        executed += 1;
        if !ctx.args.is_empty() {
            execute_one(conn, consumed, token, serve_hits, ctx);
        }
        conn.rpos += consumed;
        if conn.closing {
            break;
        }
    }
    CoreStats::add(&ctx.shared.stats[ctx.id].commands, executed as u64);
    if conn.rpos > 0 && (conn.rpos == conn.rbuf.len() || conn.rpos > conn.rbuf.capacity() / 2) {
        conn.compact_input();
    }
    more
}

/// Executes the request whose argument ranges are in `ctx.args`, composing into the reply queue.
fn execute_one(conn: &mut Conn, consumed: usize, token: u64, serve_hits: bool, ctx: &mut Ctx) {
    let Conn {
        rbuf,
        rpos,
        wbuf,
        pending,
        session,
        next_seq,
        closing,
        ..
    } = conn;
    let frame = &rbuf[*rpos..*rpos + consumed];
    let args = Args::new(frame, &ctx.args);
    let mut held = Vec::new();
    let out: &mut Vec<u8> = if pending.is_empty() {
        &mut *wbuf
    } else {
        &mut held
    };
    let outcome = match parse_command(args) {
        Ok(cmd) => {
            let mut exec = Exec {
                shared: &ctx.shared,
                keyspace: &ctx.keyspace,
                serve_hits,
                stats: &ctx.shared.stats[ctx.id],
                scratch: &mut ctx.scratch,
                password: ctx.cfg.password.as_deref().map(str::as_bytes),
                max_connections: ctx.cfg.max_connections,
            };
            exec.execute(cmd, session, out)
        }
        Err(e) => {
            e.compose(out);
            Outcome::Done
        }
    };
    match outcome {
        Outcome::Done => {}
        Outcome::Close => *closing = true,
        Outcome::Deferred { keys, deferred } => {
            let seq = *next_seq;
            *next_seq += 1;
            let request = MissRequest {
                core: ctx.id,
                conn: token,
                seq,
                keys,
                bypass: !serve_hits,
            };
            if ctx.shared.queues[ctx.id].misses.push(request).is_ok() {
                ctx.misses_pushed = true;
                pending.push_back(Pending::Waiting { seq, deferred });
                return;
            }
            CoreStats::add(&ctx.shared.stats[ctx.id].miss_queue_full, 1);
            let out = if pending.is_empty() {
                &mut *wbuf
            } else {
                &mut held
            };
            compose_error(out, b"BUSY pgline: too many misses in flight, retry");
        }
    }
    if !pending.is_empty() && !held.is_empty() {
        pending.push_back(Pending::Ready(held));
    }
}

fn protocol_error(conn: &mut Conn, message: &[u8], stats: &CoreStats) {
    CoreStats::add(&stats.protocol_errors, 1);
    let mut held = Vec::new();
    let out = if conn.pending.is_empty() {
        &mut conn.wbuf
    } else {
        &mut held
    };
    compose_error(out, message);
    if !held.is_empty() {
        conn.pending.push_back(Pending::Ready(held));
    }
    conn.closing = true;
    conn.rpos = conn.rbuf.len();
}

/// Writes as much of `wbuf` as the socket takes.
fn dispatch_egress(conn: &mut Conn, ctx: &Ctx) -> io::Result<()> {
    let stats = &ctx.shared.stats[ctx.id];
    while conn.wpos < conn.wbuf.len() && !conn.write_blocked {
        match conn.stream.write(&conn.wbuf[conn.wpos..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                conn.wpos += n;
                CoreStats::add(&stats.bytes_out, n as u64);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => conn.write_blocked = true,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    if conn.wpos == conn.wbuf.len() {
        conn.wbuf.clear();
        conn.wpos = 0;
    }
    Ok(())
}
