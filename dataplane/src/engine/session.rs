//! The session layer: everything between "bytes arrived on a connection" and "bytes to write",
//! shared by both transports.
//!
//! ```text
//!  transport ingress ──▶ Conn::input_buffer
//!  Worker::process_requests(conn, token)       bounded per turn
//!     prefetch::prefetch_pipeline              overlap the store misses of pipelined GETs
//!     parse_request → parse_command → execute  hit: section copied into conn.wbuf
//!                                              miss: MissRequest → control plane, reply slot
//!                                                    held in conn.pending (request order)
//!  Worker::apply_reply(conn, reply)            control-plane answer composed, released in order
//!  Worker::next_step(conn, ..)                 Idle / Again / Close
//!  transport egress ◀── Conn::output
//! ```
//!
//! A [`Worker`] is one core's share of the engine apart from its connections and its transport:
//! the config, its port on the plane (which also remembers what was sent this turn: each
//! control-plane consumer is woken once per turn, not once per request), the current key-space
//! snapshot, reusable parse and scratch buffers. It knows nothing of sockets, mio or the userspace stack.
//!
//! Invariants: replies leave in request order (see [`super::conn`]); work per call is bounded by
//! `requests_per_turn`, `max_reply_backlog` and `max_pending_per_conn`; the hit path allocates
//! nothing. Thread model: a `Worker` is owned by its core's thread.

use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use crate::cluster::Topology;
use crate::keyspace::KeySpace;
use crate::plane::{ConnToken, CorePort, CoreStats, MissReply, MissRequest};
use crate::resp::{
    compose_error, parse_command, parse_request, Args, ClientSub, Command, ParseError,
};

use super::conn::{BufferCache, Conn, Pending, READ_AHEAD};
use super::execute::{Exec, Outcome};
use super::limits::{CoreLimits, Sources, TRACKING_BYTES_PER_KEY};
use super::pg::{PgEngine, PgSession};
use super::prefetch;
use super::tls::TlsFront;
use super::tracking::CoreTracking;
use super::EngineConfig;
use crate::pgwire::Limits as PgLimits;

/// What a transport does with a connection after a turn of the session layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// Nothing more until the transport or the control plane reports something.
    Idle,
    /// Work is left (input, or the transport may have more bytes): visit again next turn.
    Again,
    /// Everything is written (or the connection failed): close it.
    Close,
}

/// One core's session state other than its connections.
pub(crate) struct Worker {
    /// This core's side of the plane.
    pub port: CorePort,
    pub cfg: Arc<EngineConfig>,
    pub(crate) keyspace: Arc<KeySpace>,
    pub(crate) keyspace_generation: u64,
    /// The cluster topology (cluster mode), and the cell generation it was read at.
    pub(crate) topology: Option<Arc<Topology>>,
    pub(crate) topology_generation: u64,
    args: Vec<Range<usize>>,
    pub(crate) scratch: Vec<u8>,
    /// A tagged key's untagged form (cluster mode; `Exec::untag`).
    pub(crate) untag: Vec<u8>,
    /// Message limits of the PostgreSQL front (message size bounded by `max_request_bytes`).
    pub(crate) pg_limits: PgLimits,
    /// Reply-memory accounting and the sweep's clocks (see [`super::limits`]).
    pub(crate) limits: CoreLimits,
    /// Per-source connection counts, shared by the engine's cores.
    pub(crate) sources: Arc<Sources>,
    /// The core's clock, read once per turn by the transport loop.
    pub(crate) now: Instant,
    /// TLS on the fronts (kernel transport only; `None`: not served).
    pub(crate) tls: Option<TlsFront>,
    /// Input and output buffers lent to connections while they have work.
    pub(crate) buffers: BufferCache,
    /// Client tracking on this core (issue 18).
    pub(crate) tracking: CoreTracking,
}

impl Worker {
    pub fn new(port: CorePort, cfg: Arc<EngineConfig>) -> Worker {
        let keyspace = port.keyspace().snapshot();
        let keyspace_generation = port.keyspace().generation();
        let topology = port.shared().topology().snapshot();
        let topology_generation = port.shared().topology().generation();
        let pg_limits = PgLimits {
            max_message_bytes: cfg.max_request_bytes,
            ..PgLimits::default()
        };
        let now = Instant::now();
        let cap = cfg.max_reply_memory_per_core();
        let tracking_keys = cfg
            .conn_limits
            .tracking_table_max_keys
            .div_ceil(cfg.cores.max(1));
        let tracking = CoreTracking::new(
            tracking_keys,
            tracking_keys.saturating_mul(TRACKING_BYTES_PER_KEY),
            keyspace_generation,
        );
        Worker {
            tracking,
            limits: CoreLimits::new(cap, now),
            sources: Arc::default(),
            now,
            port,
            cfg,
            keyspace,
            keyspace_generation,
            topology,
            topology_generation,
            args: Vec::with_capacity(64),
            pg_limits,
            scratch: Vec::with_capacity(64 * 1024),
            untag: Vec::with_capacity(256),
            tls: None,
            buffers: BufferCache::default(),
        }
    }

    /// This core's counters.
    #[inline]
    pub fn stats(&self) -> &CoreStats {
        self.port.stats()
    }

    /// State for a newly accepted connection in slot generation `generation`.
    pub fn new_conn(&self, generation: u32) -> Conn {
        let client_id = self.port.next_client_id();
        Conn::new(client_id, generation, self.cfg.password.is_none(), self.now)
    }

    /// State for a connection accepted on the PostgreSQL listener.
    pub fn new_pg_conn(&self, generation: u32) -> Conn {
        let mut conn = self.new_conn(generation);
        conn.pg = Some(Box::new(PgSession::new()));
        conn
    }

    /// Two atomic loads; a new catalog or topology snapshot only when one moved.
    pub fn poll_keyspace(&mut self) {
        let generation = self.port.keyspace().generation();
        if generation != self.keyspace_generation {
            self.keyspace = self.port.keyspace().snapshot();
            self.keyspace_generation = generation;
        }
        let cell = self.port.shared().topology();
        let generation = cell.generation();
        if generation != self.topology_generation {
            self.topology = cell.snapshot();
            self.topology_generation = generation;
        }
    }

    /// Wakes, once each, the control-plane consumers this turn sent requests to.
    pub fn end_turn(&mut self) {
        self.port.end_turn();
    }

    /// Whether the transport should read more for `conn` now (bounded buffers, not closing).
    #[inline]
    pub fn wants_input(&self, conn: &Conn) -> bool {
        let unparsed = conn.rbuf.len() - conn.rpos;
        !conn.closing
            && !self.output_blocked(conn)
            && unparsed < self.request_budget(conn)
            && (unparsed < READ_AHEAD || conn.incomplete)
            // At the reply-memory cap, a connection that holds more than its base buffers
            // does not grow them.
            && !(self.limits.full() && conn.charged > 0)
    }

    /// What to do with `conn` after ingress, [`Worker::process_requests`] and egress.
    /// `more_input`: complete requests are left; `readable`: the transport may have more bytes.
    #[inline]
    pub fn next_step(&self, conn: &Conn, more_input: bool, readable: bool) -> Next {
        if let Some(pg) = &conn.pg {
            // After egress: what the client has not read yet, for the relay's flow control.
            // Stored only when it changed, so that a connection the relay is not sending to
            // leaves the shared line alone; no other data is handed over through it.
            let backlog = conn.backlog() as u64;
            if pg.flow.backlog.load(Ordering::Relaxed) != backlog {
                pg.flow.backlog.store(backlog, Ordering::Relaxed);
            }
        }
        if (conn.closing || (conn.eof && !more_input))
            && conn.output_done()
            && conn.pending.is_empty()
        {
            Next::Close
        } else if self.output_blocked(conn) {
            // Until its output moves (a writable event) or a deferred reply lands: both
            // activate it again.
            Next::Idle
        } else if more_input || (readable && !conn.closing) {
            Next::Again
        } else {
            Next::Idle
        }
    }

    /// Composes the control plane's answer into its reply slot and releases what is in order
    /// (a PostgreSQL session keeps it for the batch that waits for it: `pg/miss.rs`).
    pub fn apply_reply(conn: &mut Conn, reply: &MissReply) {
        if conn.pg.is_some() {
            super::pg::apply_fill(conn, reply);
            return;
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
    }

    /// Parses and executes buffered requests; returns whether complete input is left for later.
    /// `token` names the connection in the [`MissRequest`]s it sends (slot and generation).
    pub fn process_requests(&mut self, conn: &mut Conn, token: ConnToken) -> bool {
        if conn.pg.is_some() {
            let more = PgEngine::of(self).process(conn, token);
            conn.incomplete = !more && !conn.input().is_empty();
            return more;
        }
        conn.incomplete = false;
        let serve_hits = self.port.serve_hits();
        let mut executed = 0;
        let mut more = false;
        if serve_hits && conn.input().len() >= prefetch::MIN_INPUT {
            prefetch::prefetch_pipeline(
                conn.input(),
                &self.cfg.limits,
                &mut self.args,
                &self.keyspace,
                self.port.store(),
            );
        }
        while !conn.input().is_empty() {
            if executed >= self.cfg.requests_per_turn
                || self.output_blocked(conn)
                || conn.pending.len() >= self.cfg.max_pending_per_conn
            {
                more = true;
                break;
            }
            let input = &conn.rbuf[conn.rpos..];
            let consumed = match parse_request(input, &self.cfg.limits, &mut self.args) {
                Ok(n) if !conn.session.authenticated && n > self.request_budget(conn) => {
                    protocol_error(conn, UNAUTH_TOO_LARGE, self.stats());
                    break;
                }
                Ok(n) => n,
                Err(ParseError::Incomplete) => {
                    conn.incomplete = true;
                    if input.len() >= self.request_budget(conn) {
                        let message: &[u8] = if conn.session.authenticated {
                            b"ERR Protocol error: request exceeds the size limit"
                        } else {
                            UNAUTH_TOO_LARGE
                        };
                        protocol_error(conn, message, self.stats());
                    }
                    break;
                }
                Err(ParseError::Invalid(kind)) => {
                    let mut message = b"ERR ".to_vec();
                    message.extend_from_slice(kind.message().as_bytes());
                    protocol_error(conn, &message, self.stats());
                    break;
                }
            };
            executed += 1;
            if !self.args.is_empty() {
                self.execute_one(conn, consumed, token, serve_hits);
            }
            conn.rpos += consumed;
            if conn.closing {
                break;
            }
        }
        CoreStats::add(&self.stats().resp_commands, executed as u64);
        if conn.rpos > 0 && (conn.rpos == conn.rbuf.len() || conn.rpos > conn.rbuf.capacity() / 2) {
            conn.compact_input();
        }
        more
    }

    /// Executes the request whose argument ranges are in `self.args`, composing into the reply
    /// queue.
    fn execute_one(
        &mut self,
        conn: &mut Conn,
        consumed: usize,
        token: ConnToken,
        serve_hits: bool,
    ) {
        let Conn {
            rbuf,
            rpos,
            wbuf,
            pending,
            session,
            next_seq,
            closing,
            opened_at,
            ..
        } = conn;
        let frame = &rbuf[*rpos..*rpos + consumed];
        let args = Args::new(frame, &self.args);
        let mut held = Vec::new();
        let out: &mut Vec<u8> = if pending.is_empty() {
            &mut *wbuf
        } else {
            &mut held
        };
        let stats = self.port.stats();
        let outcome = match parse_command(args) {
            Ok(cmd) if subscribed_resp2(session) && !allowed_when_subscribed(cmd) => {
                let mut msg = b"ERR Can't execute '".to_vec();
                let name = args.get(0).unwrap_or_default();
                msg.extend(name.iter().take(32).map(u8::to_ascii_lowercase));
                msg.extend_from_slice(b"': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context");
                compose_error(out, &msg);
                Outcome::Done
            }
            Ok(Command::Ping { message }) if subscribed_resp2(session) => {
                // Redis's answer to PING on a subscribed RESP2 connection.
                out.extend_from_slice(b"*2\r\n$4\r\npong\r\n");
                crate::resp::compose_bulk(out, message.unwrap_or_default());
                Outcome::Done
            }
            Ok(cmd) => {
                let caching_cmd = matches!(
                    cmd,
                    Command::Client {
                        sub: ClientSub::Caching { .. }
                    }
                );
                let mut exec = Exec {
                    shared: self.port.shared(),
                    keyspace: &self.keyspace,
                    topology: self.topology.as_deref(),
                    untag: &mut self.untag,
                    serve_hits,
                    stats,
                    scratch: &mut self.scratch,
                    password: self.cfg.password.as_deref().map(str::as_bytes),
                    max_connections: self.cfg.max_connections,
                    max_auth_failures: self.cfg.conn_limits.max_auth_failures,
                    tracking: &mut self.tracking,
                    core: self.port.id(),
                    slot: token.slot(),
                };
                let was_authenticated = session.authenticated;
                let outcome = exec.execute(cmd, session, out);
                if !caching_cmd {
                    // `CLIENT CACHING yes|no` applies to the one command after it.
                    if let Some(t) = session.tracking.as_deref_mut() {
                        t.caching = None;
                    }
                }
                if was_authenticated && !session.authenticated {
                    // RESET: the authentication timeout runs again from now.
                    *opened_at = self.now;
                }
                outcome
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
                    core: self.port.id(),
                    conn: token,
                    seq,
                    keys,
                    bypass: !serve_hits,
                    current_only: false,
                };
                if self.port.send_miss(request).is_ok() {
                    pending.push_back(Pending::Waiting { seq, deferred });
                    return;
                }
                CoreStats::add(&stats.resp_queue_full, 1);
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
}

/// A RESP2 connection subscribed to the invalidation channel takes only pub/sub commands.
fn subscribed_resp2(session: &super::conn::Session) -> bool {
    session.proto == crate::resp::Protocol::Resp2
        && session.tracking.as_deref().is_some_and(|t| t.subscribed)
}

fn allowed_when_subscribed(cmd: Command<'_>) -> bool {
    matches!(
        cmd,
        Command::Subscribe { .. }
            | Command::Unsubscribe { .. }
            | Command::PubSubOther { .. }
            | Command::Ping { .. }
            | Command::Quit
            | Command::Reset
    )
}

const UNAUTH_TOO_LARGE: &[u8] = b"ERR Protocol error: unauthenticated request too large";

/// Answers a request that cannot be parsed, then closes: the rest of the input is dropped.
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
