//! The PostgreSQL session of a connection accepted on the pgwire listener: startup, framing of
//! batches, cached point lookups, and forwarding of everything else to the control plane.
//!
//! ```text
//!  Startup  SSLRequest               -> 'S' (pgwire.tls on, kernel transport: the transport
//!                                       starts TLS) or 'N'; wait for the real packet
//!           GSSENCRequest            -> 'N', wait for the real packet
//!           CancelRequest            -> PgRequest Cancel, close
//!           StartupMessage           -> PgRequest Startup ──▶ Auth
//!                                       (pgwire.tls = required and no TLS: FATAL 28000)
//!  Auth     replies end Auth         -> next 'p' messages -> PgRequest Auth
//!           replies end Ready(s)     ──▶ Ready
//!  Ready    one batch (up to Sync, or one Query) at a time:
//!           framed (batch.rs), then
//!           cached point lookup, hit  -> composed here (serve.rs, lookup.rs)
//!           cached point lookup, miss -> MissRequest, wait; the answer composed from the
//!                                        fill as a hit, or the batch forwarded (miss.rs)
//!           cached query result, hit  -> the origin's stored answer (serve.rs, results.rs)
//!           anything else             -> PgRequest Batch, wait for Ready(s) (forward.rs)
//! ```
//!
//! Laid out as the RESP half is: this module drives the session ([`PgEngine`], the parts of the
//! core's `Worker` a step needs, borrowed for one call, as `execute::Exec` is for a command);
//! `serve.rs` answers hits; `miss.rs` a point lookup's miss; `forward.rs` is everything that
//! goes to the origin.
//!
//! Cached answers are given only where the session's settings print the returned columns as
//! pgline's own origin sessions did (`settings.rs` states the rule), and in binary only for
//! types converted exactly from their text (`binary.rs`).
//!
//! Invariants: at most one request per session is outstanding (`waiting`); no input of the
//! session is looked at until its reply ends (`Ready`, `Auth` or `Close`), so replies are in
//! order without a queue. Chunks `More` are appended to the output as they come. A reply for
//! another `seq` (a connection that closed and whose slot was reused) is dropped by the slot
//! generation check in [`super::slots`] and by the `seq` check here. Bad input is answered with
//! a FATAL ErrorResponse (SQLSTATE 08P01) and only that connection is closed.
//!
//! Thread model: owned by the connection's core. Limitations: Flush does not end a batch (a
//! client that waits for replies after a Flush without Sync waits until it sends Sync): the
//! contract's batch ends with Sync or Query and its reply with `PgReplyEnd::Ready`, i.e. a
//! ReadyForQuery, which the origin does not send after a Flush; ending a batch at Flush needs
//! a reply end meaning "done, no ReadyForQuery" and a relay that knows when the origin's
//! answer to the flushed messages is complete. Copy and FunctionCall are refused (0A000,
//! connection closed).

mod batch;
mod binary;
mod binary_datetime;
mod forward;
mod lookup;
mod miss;
mod results;
mod serve;
mod settings;

use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::keyspace::KeySpace;
use crate::pgwire::{
    compose_error_response, compose_ssl_response, parse_frontend, parse_startup, sqlstate,
    ErrorFields, Frontend, Limits as PgLimits, Oids, ParseError, Startup, Target,
};
use crate::plane::{ConnToken, CorePort, CoreStats, PgFlow, PgReply, PgReplyEnd, PgRequestKind};

use super::conn::Conn;
use super::session::Worker;
use super::tls::PgTlsMode;
use super::EngineConfig;
use batch::{frame, Frame};
use forward::Marks;
use serve::{Serve, Served};

pub(crate) use forward::conn_closed;
pub(crate) use lookup::Statement;
pub use lookup::{serve_class, NotServed, ServeClass};
pub(crate) use miss::apply_reply as apply_fill;

/// Where a session is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Waiting for the first packet (or the one after an SSLRequest).
    Startup,
    /// The startup was forwarded; password messages go to the control plane.
    Auth,
    /// The session is open.
    Ready,
}

/// A statement a forwarded batch closed (see `PgSession::closing`).
pub(crate) struct Closing {
    /// The Close's place among the batch's Closes of named statements.
    place: u32,
    name: Box<[u8]>,
    statement: Statement,
}

/// Protocol state of one PostgreSQL connection.
pub(crate) struct PgSession {
    pub phase: Phase,
    /// The `seq` of the outstanding request (a forwarded step or a fill), if any.
    pub waiting: Option<u64>,
    /// The outstanding request is a point lookup's fill (see `miss.rs`).
    pub fill: Option<miss::FillWait>,
    /// The fill's answer for the batch at the head of the input, until that batch runs again.
    pub landed: Option<miss::Landed>,
    /// Transaction status from the last ReadyForQuery (`I`, `T`, `E`).
    pub tx_status: u8,
    /// Cached answers only once the applied LSN has reached this.
    pub fence: u64,
    /// The key space generation when the outstanding request was sent, and the one the relay's
    /// last verdict on the session's origin state was asked under: the gate opens only while
    /// that is the current generation. The writer publishes a new one when the origin's schema
    /// or role names change (`writer/ddl.rs`), which can change how a session resolves names
    /// (a schema made under its user's name) with no statement of its own: every session then
    /// asks again.
    pub asked_generation: u64,
    pub verdict_generation: u64,
    /// The outstanding batch runs nothing (Parse, Describe, Close only) or only one statement
    /// of constants (`PgRequest::state_free`): its reply leaves the cache gate as it was (it
    /// read and wrote nothing, and changed no session state).
    pub keeps_gate: bool,
    /// The control plane knows this session (it must hear `Close`).
    pub opened: bool,
    /// Classification memo by statement text, for the key space generation `memo_generation`.
    pub memo: FxHashMap<Box<[u8]>, lookup::Class>,
    pub memo_generation: u64,
    /// The client's prepared statements by name ("" = unnamed).
    pub statements: FxHashMap<Box<[u8]>, Statement>,
    /// Bytes of the named statements' Parse messages (bounded, with their number, by
    /// `ConnLimits::max_pg_statement_bytes` and `max_pg_statements`).
    pub statement_bytes: usize,
    /// A simple Query answered from cache destroyed the unnamed statement since the last
    /// forwarded batch: the relay, which may hold one, must hear it.
    pub unnamed_dropped: bool,
    /// Named statements the outstanding forwarded batch closed, with the place of their Close
    /// among the batch's named Closes and whether a Parse of the same batch made them, kept
    /// until its reply says which Closes the origin skipped after an error
    /// (`PgReply::unclosed`): those are held again, unless that Parse did not stand either.
    pub closing: Vec<Closing>,
    /// The store key of the lookup being served (reused).
    pub key_buf: Vec<u8>,
    /// The key of the cacheable statement being served (reused).
    pub result_key: Vec<u8>,
    /// What the session's settings allow to be served (see `settings.rs`).
    pub settings: settings::Settings,
    /// Finds ParameterStatus in the replies.
    pub scan: settings::ReplyScan,
    /// Flow control of relayed replies, shared with the control plane's session.
    pub flow: Arc<PgFlow>,
    /// An SSLRequest was answered (a second one is refused, as PostgreSQL does).
    pub ssl_done: bool,
    /// A GSSENCRequest was answered.
    pub gss_done: bool,
    /// The session runs over TLS (set by the transport once it started it).
    pub encrypted: bool,
    /// The client's address, for the messages that name it (`pgwire.tls = required`).
    pub peer: Option<IpAddr>,
}

impl PgSession {
    pub fn new() -> PgSession {
        PgSession {
            phase: Phase::Startup,
            waiting: None,
            fill: None,
            landed: None,
            tx_status: b'I',
            fence: 0,
            asked_generation: 0,
            verdict_generation: 0,
            keeps_gate: false,
            opened: false,
            memo: FxHashMap::default(),
            memo_generation: 0,
            statements: FxHashMap::default(),
            statement_bytes: 0,
            unnamed_dropped: false,
            closing: Vec::new(),
            key_buf: Vec::with_capacity(64),
            result_key: Vec::new(),
            settings: settings::Settings::default(),
            scan: settings::ReplyScan::default(),
            flow: Arc::default(),
            ssl_done: false,
            gss_done: false,
            encrypted: false,
            peer: None,
        }
    }

    /// Records a Parse (`raw`: the whole message) in the statement table; `relay_knows`: it
    /// is being forwarded. No allocation when the statement is already there as is.
    fn remember_parse(
        &mut self,
        name: &[u8],
        query: &[u8],
        oids: Oids<'_>,
        raw: &[u8],
        relay_knows: bool,
    ) {
        if let Some(s) = self.statements.get_mut(name) {
            if *s.text == *query && s.param_types.iter().copied().eq(oids.iter()) {
                if name.is_empty() {
                    // A new unnamed statement, with the old one's text.
                    s.relay_knows = relay_knows;
                    s.known = true;
                } else {
                    s.relay_knows |= relay_knows;
                }
                return;
            }
        }
        let old = self.statements.insert(
            name.into(),
            Statement {
                text: query.into(),
                param_types: oids.iter().collect(),
                parse: raw.into(),
                relay_knows,
                known: true,
            },
        );
        if !name.is_empty() {
            self.statement_bytes += raw.len();
            self.statement_bytes -= old.map_or(0, |s| s.parse.len());
        }
    }
}

impl PgSession {
    /// A simple Query answered from cache destroyed the unnamed statement: it is no longer
    /// answered from cache, and the relay hears it with the next forwarded batch. The entry
    /// stays (not answered, nothing to replay), so that an unnamed Parse of the same text,
    /// the usual next step, reuses it without allocating.
    pub(super) fn drop_unnamed(&mut self) {
        if let Some(s) = self.statements.get_mut(&b""[..]) {
            s.known = false;
            s.relay_knows = true;
        }
        self.unnamed_dropped = true;
    }

    /// Forgets a statement the client closed; the statement, if it was held.
    fn forget_statement(&mut self, name: &[u8]) -> Option<Statement> {
        let s = self.statements.remove(name)?;
        if !name.is_empty() {
            self.statement_bytes -= s.parse.len();
        }
        Some(s)
    }

    /// After a forwarded batch's reply: the named statements it closed are gone, except those
    /// whose Close the origin skipped and whose statement stands (`unclosed`, decided by the
    /// relay, which knows which of the batch's Parses stood), held again as they were before
    /// their Close. Runs after the failed Parses were forgotten, so that a skipped Close and a
    /// (skipped) Parse of the same name after it leave the old statement.
    fn settle_closes(&mut self, unclosed: &[u32]) {
        for c in std::mem::take(&mut self.closing) {
            if unclosed.contains(&c.place) && !self.statements.contains_key(&c.name) {
                self.statement_bytes += c.statement.parse.len();
                self.statements.insert(c.name, c.statement);
            }
        }
    }

    /// The session's named statements after `batch` ran (number, Parse bytes), at their most
    /// along the batch: a Parse of a name not held adds one, a Close of a held name takes it
    /// away. A Parse reusing a held name fails at the origin (42P05) and adds nothing.
    fn statements_after(&self, batch: &[u8], limits: &PgLimits) -> (usize, usize) {
        let (mut count, mut bytes) = (self.statements.len(), self.statement_bytes);
        if self.statements.contains_key(&b""[..]) {
            count -= 1;
        }
        let (mut peak_count, mut peak_bytes) = (count, bytes);
        // Names this batch added (with their size) or closed, in order.
        let mut added: Vec<(&[u8], usize)> = Vec::new();
        let mut closed: Vec<&[u8]> = Vec::new();
        let held = |name: &[u8], added: &[(&[u8], usize)], closed: &[&[u8]]| {
            added.iter().any(|(n, _)| *n == name)
                || (self.statements.contains_key(name) && !closed.contains(&name))
        };
        let mut at = 0;
        while let Ok((msg, n)) = parse_frontend(&batch[at..], limits) {
            match msg {
                Frontend::Parse { name, .. }
                    if !name.is_empty() && !held(name, &added, &closed) =>
                {
                    added.push((name, n));
                    count += 1;
                    bytes += n;
                    peak_count = peak_count.max(count);
                    peak_bytes = peak_bytes.max(bytes);
                }
                Frontend::Close {
                    target: Target::Statement,
                    name,
                } if !name.is_empty() && held(name, &added, &closed) => {
                    count -= 1;
                    bytes -= match added.iter().position(|(a, _)| *a == name) {
                        Some(i) => added.swap_remove(i).1,
                        None => {
                            closed.push(name);
                            self.statements.get(name).map_or(0, |s| s.parse.len())
                        }
                    };
                }
                _ => {}
            }
            at += n;
        }
        (peak_count, peak_bytes)
    }
}

impl Drop for PgSession {
    /// However the connection goes (closed, or the engine stopping), the relay stops waiting
    /// for its client to read.
    fn drop(&mut self) {
        self.flow.closed.store(true, Ordering::Release);
    }
}

/// The PostgreSQL half of a core: what a session step needs of the core's [`Worker`],
/// borrowed for one call.
pub(crate) struct PgEngine<'w> {
    port: &'w CorePort,
    cfg: &'w EngineConfig,
    limits: &'w PgLimits,
    keyspace: &'w KeySpace,
    keyspace_generation: u64,
    scratch: &'w mut Vec<u8>,
    /// `pgwire.tls` on this transport (`Off` where TLS is not served).
    tls: PgTlsMode,
}

impl<'w> PgEngine<'w> {
    /// The PostgreSQL half of `worker`.
    pub(crate) fn of(worker: &'w mut Worker) -> PgEngine<'w> {
        PgEngine {
            port: &worker.port,
            cfg: &worker.cfg,
            limits: &worker.pg_limits,
            keyspace: &worker.keyspace,
            keyspace_generation: worker.keyspace_generation,
            scratch: &mut worker.scratch,
            tls: worker.tls.as_ref().map_or(PgTlsMode::Off, |t| t.pg_mode),
        }
    }

    /// [`Worker::process_requests`] for a PostgreSQL connection: returns whether complete
    /// input is left for a later turn.
    pub(crate) fn process(&mut self, conn: &mut Conn, token: ConnToken) -> bool {
        let mut handled = 0;
        let mut more = false;
        loop {
            let Some(pg) = conn.pg.as_ref() else {
                return false;
            };
            if conn.closing || pg.waiting.is_some() || conn.input().is_empty() {
                break;
            }
            if handled >= self.cfg.requests_per_turn || conn.backlog() >= self.cfg.max_reply_backlog
            {
                more = true;
                break;
            }
            let step = match pg.phase {
                Phase::Startup => self.startup(conn, token),
                Phase::Auth => self.auth(conn, token),
                Phase::Ready => self.batch(conn, token),
            };
            match step {
                Step::Done => handled += 1,
                Step::Incomplete | Step::Waiting => break,
                Step::Retry => {
                    more = true;
                    break;
                }
            }
        }
        CoreStats::add(&self.port.stats().pg_steps, handled as u64);
        if conn.rpos > 0 && (conn.rpos == conn.rbuf.len() || conn.rpos > conn.rbuf.capacity() / 2) {
            conn.compact_input();
        }
        more
    }

    fn startup(&mut self, conn: &mut Conn, token: ConnToken) -> Step {
        let (startup, consumed) = match parse_startup(&conn.rbuf[conn.rpos..], self.limits) {
            Ok(v) => v,
            Err(ParseError::Incomplete) => return Step::Incomplete,
            Err(ParseError::Invalid(kind)) => {
                protocol_error(conn, kind.message().as_bytes(), self.port.stats());
                return Step::Done;
            }
        };
        let kind = match startup {
            Startup::SslRequest | Startup::GssEncRequest => {
                self.negotiate_encryption(conn, startup == Startup::SslRequest, consumed);
                return Step::Done;
            }
            Startup::Cancel { .. } => PgRequestKind::Cancel,
            Startup::Startup(m) => {
                let encrypted = conn.pg.as_ref().is_some_and(|pg| pg.encrypted);
                if self.tls == PgTlsMode::Required && !encrypted {
                    let peer = conn.pg.as_ref().and_then(|pg| pg.peer);
                    let message = no_encryption_message(peer, m.user(), m.database());
                    fatal(
                        conn,
                        sqlstate::INVALID_AUTHORIZATION_SPECIFICATION,
                        message.as_bytes(),
                        self.port.stats(),
                    );
                    return Step::Done;
                }
                if let Some(pg) = conn.pg.as_mut() {
                    pg.settings.note_identity(
                        m.user(),
                        m.database(),
                        &self.cfg.pg_cache_users,
                        self.cfg.pg_cache_database.as_deref(),
                    );
                }
                PgRequestKind::Startup
            }
        };
        let messages = conn.input()[..consumed].to_vec();
        if !forward::push(
            self.port,
            conn,
            token,
            kind,
            messages,
            None,
            Marks::default(),
        ) {
            return Step::Retry;
        }
        conn.rpos += consumed;
        if kind == PgRequestKind::Cancel {
            if let Some(pg) = conn.pg.as_mut() {
                pg.waiting = None;
            }
            conn.closing = true;
        } else if let Some(pg) = conn.pg.as_mut() {
            pg.opened = true;
            pg.phase = Phase::Auth;
        }
        Step::Done
    }

    /// Answers an SSLRequest (`ssl`) or a GSSENCRequest of `len` bytes as PostgreSQL does:
    /// `S` when TLS is served here (the transport starts it once the `S` is written), else
    /// `N`; a second request of the same kind, or one inside TLS, is refused as an unsupported
    /// protocol (FATAL 0A000); bytes that came after the request, before the answer, are
    /// refused (FATAL 08P01, CVE-2021-23214): they were not encrypted and may have been
    /// injected by a man in the middle.
    fn negotiate_encryption(&mut self, conn: &mut Conn, ssl: bool, len: usize) {
        let Some(pg) = conn.pg.as_mut() else { return };
        let again = if ssl { pg.ssl_done } else { pg.gss_done };
        if again || pg.encrypted {
            let message = if ssl {
                &b"unsupported frontend protocol 1234.5679: server supports 3.0 to 3.0"[..]
            } else {
                b"unsupported frontend protocol 1234.5680: server supports 3.0 to 3.0"
            };
            fatal(
                conn,
                sqlstate::FEATURE_NOT_SUPPORTED,
                message,
                self.port.stats(),
            );
            return;
        }
        let accept = ssl && self.tls != PgTlsMode::Off;
        if ssl {
            pg.ssl_done = true;
        } else {
            pg.gss_done = true;
        }
        compose_ssl_response(&mut conn.wbuf, accept);
        conn.rpos += len;
        if !conn.input().is_empty() {
            let message = if ssl {
                &b"received unencrypted data after SSL request"[..]
            } else {
                b"received unencrypted data after GSSAPI encryption request"
            };
            protocol_error(conn, message, self.port.stats());
            return;
        }
        conn.start_tls = accept;
    }

    /// Forwards the password/SASL messages buffered during authentication.
    fn auth(&mut self, conn: &mut Conn, token: ConnToken) -> Step {
        let mut end = 0;
        loop {
            match parse_frontend(&conn.input()[end..], self.limits) {
                Ok((Frontend::Password(_), n)) => end += n,
                Ok((Frontend::Terminate, _)) if end == 0 => {
                    conn.closing = true;
                    conn.rpos = conn.rbuf.len();
                    return Step::Done;
                }
                Ok(_) => {
                    if end == 0 {
                        protocol_error(
                            conn,
                            b"expected a password message during authentication",
                            self.port.stats(),
                        );
                        return Step::Done;
                    }
                    break;
                }
                Err(ParseError::Incomplete) => break,
                Err(ParseError::Invalid(kind)) => {
                    if end == 0 {
                        protocol_error(conn, kind.message().as_bytes(), self.port.stats());
                        return Step::Done;
                    }
                    break;
                }
            }
        }
        if end == 0 {
            return Step::Incomplete;
        }
        let messages = conn.input()[..end].to_vec();
        if !forward::push(
            self.port,
            conn,
            token,
            PgRequestKind::Auth,
            messages,
            None,
            Marks::default(),
        ) {
            return Step::Retry;
        }
        conn.rpos += end;
        Step::Done
    }

    /// One batch of an open session: served here (`serve.rs`) or forwarded (`forward.rs`).
    fn batch(&mut self, conn: &mut Conn, token: ConnToken) -> Step {
        let Conn {
            rbuf,
            rpos,
            wbuf,
            pg,
            ..
        } = conn;
        let input = &rbuf[*rpos..];
        let framed = match frame(input, self.limits, self.cfg.max_request_bytes) {
            Frame::Batch(f) => f,
            Frame::Incomplete => return Step::Incomplete,
            Frame::Terminate => {
                conn.closing = true;
                conn.rpos = conn.rbuf.len();
                return Step::Done;
            }
            Frame::Bad(message, code) => {
                if code == sqlstate::PROTOCOL_VIOLATION {
                    protocol_error(conn, message, self.port.stats());
                } else {
                    fatal(conn, code, message, self.port.stats());
                }
                return Step::Done;
            }
        };
        let end = framed.end;
        let runs = framed.runs;
        let Some(pg) = pg.as_deref_mut() else {
            return Step::Done;
        };
        if framed.names {
            let limits = &self.cfg.conn_limits;
            let (count, bytes) = pg.statements_after(&input[..end], self.limits);
            if count > limits.max_pg_statements || bytes > limits.max_pg_statement_bytes {
                fatal(
                    conn,
                    sqlstate::CONFIGURATION_LIMIT_EXCEEDED,
                    b"too many prepared statements in this session \
                      (pgwire.max_session_statements, pgwire.max_session_statement_bytes)",
                    self.port.stats(),
                );
                return Step::Done;
            }
        }
        let landed = pg.landed.take();
        let served = self.serve().try_serve(pg, &framed, wbuf, landed.as_ref());
        let served = match (served, &landed) {
            (Served::Hit, Some(landed)) => {
                // Read at the origin after the batch arrived: later cached answers must not
                // be older (the fence, as after a forwarded read).
                pg.fence = pg.fence.max(landed.lsn);
                CoreStats::add(&self.port.stats().pg_lookup_filled, 1);
                Served::Hit
            }
            // Not answered by the fill (its read was not current, the origin failed, or the
            // key is not the one filled): the origin answers, never a second fill; the answer
            // brings the fence and verdict, as any forwarded lookup the cache could have served
            // (without them the session's next lookup would go to the origin as well).
            (Served::Miss(_), Some(_)) => Served::Fence,
            (served, _) => served,
        };
        if let Served::Hit = served {
            conn.rpos += end;
            return Step::Done;
        }
        // A batch that runs nothing (Parse, Describe, Close: a driver preparing a statement) or
        // only one statement of constants leaves an idle session's backend state alone.
        let state_free = matches!(served, Served::No)
            && pg.tx_status == b'I'
            && (!framed.runs || serve::constant_batch(pg, &framed, self.keyspace));
        if let Served::Miss(table) = served {
            if miss::request(self.port, conn, token, table) {
                return Step::Waiting;
            }
        }
        let (messages, statements) = forward::forward_messages(conn, self.limits, end);
        // A statement the cache could have answered asks for the fence and the verdict that
        // (re)open the session's cache gate; any other batch leaves the gate closed.
        let marks = Marks {
            fence: matches!(served, Served::Miss(_) | Served::Result(_) | Served::Fence),
            state_free,
            statements,
        };
        let cache = match served {
            Served::Result(key) => Some(key),
            _ => None,
        };
        if !forward::push(
            self.port,
            conn,
            token,
            PgRequestKind::Batch,
            messages,
            cache,
            marks,
        ) {
            // Next turn runs the batch again with the same answer in hand.
            if let Some(pg) = conn.pg.as_deref_mut() {
                pg.landed = landed;
            }
            return Step::Retry;
        }
        if landed.is_some() {
            CoreStats::add(&self.port.stats().pg_lookup_fill_forwarded, 1);
        }
        forward::note_statements(conn, self.limits, end);
        if let Some(pg) = conn.pg.as_mut() {
            pg.keeps_gate = !runs || state_free;
        }
        conn.rpos += end;
        Step::Done
    }

    /// What a hit needs, borrowed from this.
    fn serve(&mut self) -> Serve<'_> {
        Serve {
            port: self.port,
            keyspace: self.keyspace,
            keyspace_generation: self.keyspace_generation,
            scratch: &mut *self.scratch,
            gate: false,
        }
    }
}

/// Appends the control plane's reply (or chunk) and moves the session on.
pub(crate) fn apply_reply(conn: &mut Conn, reply: PgReply) {
    let Some(pg) = conn.pg.as_mut() else { return };
    // Counted whether kept or not: the control plane counted it as sent. This core is the
    // only writer, so no locked add.
    let applied = pg.flow.applied.load(Ordering::Relaxed) + reply.bytes.len() as u64;
    pg.flow.applied.store(applied, Ordering::Relaxed);
    if pg.waiting != Some(reply.seq) {
        return;
    }
    if reply.fence_lsn > pg.fence {
        pg.fence = reply.fence_lsn;
    }
    let startup = pg.phase != Phase::Ready;
    let settings = &mut pg.settings;
    pg.scan.feed(&reply.bytes, |name, value| {
        settings.note_status(name, value, startup)
    });
    match reply.end {
        PgReplyEnd::More => {}
        PgReplyEnd::Auth => pg.waiting = None,
        PgReplyEnd::Ready(status) => {
            pg.waiting = None;
            if !std::mem::take(&mut pg.keeps_gate) {
                pg.settings.note_origin_state(reply.serve_cached);
                pg.verdict_generation = pg.asked_generation;
            }
            for name in &reply.unparsed {
                pg.forget_statement(name);
            }
            pg.settle_closes(&reply.unclosed);
            pg.tx_status = status;
            pg.phase = Phase::Ready;
        }
        PgReplyEnd::Close => {
            pg.waiting = None;
            conn.closing = true;
            conn.rpos = conn.rbuf.len();
        }
    }
    if conn.wbuf.len() == conn.wpos {
        conn.wbuf.clear();
        conn.wpos = 0;
    }
    if conn.wbuf.is_empty() {
        conn.wbuf = reply.bytes;
    } else {
        conn.wbuf.extend_from_slice(&reply.bytes);
    }
}

/// The outcome of one step of the session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Input was consumed (or the connection is closing).
    Done,
    /// Wait for more bytes.
    Incomplete,
    /// The batch waits for a fill (left unread until it lands): nothing more this turn.
    Waiting,
    /// The control plane's queue is full: try again next turn.
    Retry,
}

/// PostgreSQL's refusal of a plaintext session when pg_hba.conf has only `hostssl` lines for
/// it, word for word (`pgwire.tls = required`).
fn no_encryption_message(peer: Option<IpAddr>, user: &[u8], database: &[u8]) -> String {
    let host = peer.map_or_else(|| "[local]".to_string(), |ip| ip.to_string());
    format!(
        "no pg_hba.conf entry for host \"{host}\", user \"{}\", database \"{}\", no encryption",
        String::from_utf8_lossy(user),
        String::from_utf8_lossy(database)
    )
}

/// Answers bad input with a FATAL 08P01 ErrorResponse and closes the connection.
fn protocol_error(conn: &mut Conn, message: &[u8], stats: &CoreStats) {
    fatal(conn, sqlstate::PROTOCOL_VIOLATION, message, stats);
}

/// A FATAL ErrorResponse with `code`, then close.
fn fatal(conn: &mut Conn, code: &[u8; 5], message: &[u8], stats: &CoreStats) {
    CoreStats::add(&stats.protocol_errors, 1);
    compose_error_response(&mut conn.wbuf, &ErrorFields::fatal(code, message));
    conn.closing = true;
    conn.rpos = conn.rbuf.len();
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::engine::tls::{PgTlsMode, TlsAcceptor, TlsFront};

    fn worker(tls: PgTlsMode) -> Worker {
        let mut w = crate::engine::slots::tests::worker();
        // The acceptor is never used here: only the mode matters to the session.
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("ring")
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(rustls::server::ResolvesServerCertUsingSni::new()));
        let acceptor = TlsAcceptor::new(Arc::new(config));
        w.tls = Some(TlsFront {
            pg: acceptor.clone(),
            pg_mode: tls,
            resp: acceptor,
            resp_listen: None,
        });
        w
    }

    const SSL: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];
    const GSS: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x30];

    fn run(w: &mut Worker, conn: &mut Conn, input: &[u8]) -> Vec<u8> {
        conn.input_buffer().extend_from_slice(input);
        PgEngine::of(w).process(conn, ConnToken::new(0, 0));
        let out = conn.output().to_vec();
        let n = out.len();
        conn.advance_output(n);
        out
    }

    /// `serve::constant_batch` on the batch `compose` writes, for an idle session that knows
    /// statement `known` ("SELECT 1", with `known_types` declared).
    fn constant(compose: impl Fn(&mut bytes::BytesMut), known_types: &[u32]) -> bool {
        use postgres_protocol::message::frontend;
        let mut raw = bytes::BytesMut::new();
        compose(&mut raw);
        let limits = PgLimits::default();
        let Frame::Batch(framed) = frame(&raw, &limits, 1 << 20) else {
            panic!("not one batch");
        };
        let mut pg = PgSession::new();
        let mut parse = bytes::BytesMut::new();
        frontend::parse("known", "SELECT 1", known_types.iter().copied(), &mut parse).unwrap();
        let Ok((
            Frontend::Parse {
                name,
                query,
                param_types,
            },
            _,
        )) = parse_frontend(&parse, &limits)
        else {
            panic!("not a Parse");
        };
        pg.remember_parse(name, query, param_types, &parse, true);
        serve::constant_batch(&mut pg, &framed, &KeySpace::default())
    }

    /// Bind (of `statement`, with `values` text parameters), Execute, Sync.
    fn bind_execute(statement: &str, values: usize, b: &mut bytes::BytesMut) {
        use postgres_protocol::message::frontend;
        let params = (0..values).map(|_| "x");
        let encode = |v: &str, buf: &mut bytes::BytesMut| {
            buf.extend_from_slice(v.as_bytes());
            Ok(postgres_protocol::IsNull::No)
        };
        let formats = std::iter::empty::<i16>();
        if frontend::bind("", statement, formats.clone(), params, encode, formats, b).is_err() {
            panic!("bind");
        }
        frontend::execute("", 0, b).unwrap();
        frontend::sync(b);
    }

    #[test]
    fn constant_batches_have_no_parameter_and_no_table() {
        use postgres_protocol::message::frontend;
        let query =
            |sql: &'static str| move |b: &mut bytes::BytesMut| frontend::query(sql, b).unwrap();
        assert!(constant(query("SELECT 1"), &[]));
        assert!(!constant(query("SELECT now()"), &[]));
        let extended = |types: &'static [u32], values: usize| {
            move |b: &mut bytes::BytesMut| {
                frontend::parse("", "SELECT 1", types.iter().copied(), b).unwrap();
                bind_execute("", values, b);
            }
        };
        assert!(constant(extended(&[], 0), &[]));
        // A declared parameter, even unused, is converted at Bind: a domain's input runs its
        // checks, which can call any function.
        assert!(!constant(extended(&[16_400], 1), &[]));
        assert!(!constant(extended(&[16_400], 0), &[]));
        // The same through a statement parsed earlier.
        let known = |values: usize| move |b: &mut bytes::BytesMut| bind_execute("known", values, b);
        assert!(constant(known(0), &[]));
        assert!(!constant(known(1), &[16_400]));
        assert!(!constant(known(0), &[16_400]));
        // The Execute must run the portal the constant statement was bound to, not another
        // (a cursor's, say).
        let other_portal = |b: &mut bytes::BytesMut| {
            frontend::parse("", "SELECT 1", std::iter::empty(), b).unwrap();
            bind_execute("", 0, b);
            let (sync, rest) = b.split_at(b.len() - 5);
            let mut batch = sync.to_vec();
            assert_eq!(rest, [b'S', 0, 0, 0, 4]);
            // Replace the Execute of "" by one of "c": drop the last Execute and Sync.
            batch.truncate(batch.len() - 10);
            b.clear();
            b.extend_from_slice(&batch);
            frontend::execute("c", 0, b).unwrap();
            frontend::sync(b);
        };
        assert!(!constant(other_portal, &[]));
    }

    #[test]
    fn ssl_and_gss_requests_are_answered_as_postgres_does() {
        for (mode, answer) in [(PgTlsMode::Off, b'N'), (PgTlsMode::On, b'S')] {
            let mut w = worker(mode);
            let mut conn = w.new_pg_conn(0);
            assert_eq!(run(&mut w, &mut conn, &GSS), b"N");
            assert!(!conn.start_tls && !conn.closing);
            assert_eq!(run(&mut w, &mut conn, &SSL), [answer]);
            assert_eq!(conn.start_tls, mode == PgTlsMode::On);
            assert!(!conn.closing);
            // A second SSLRequest: unsupported protocol, closed.
            conn.start_tls = false;
            let out = run(&mut w, &mut conn, &SSL);
            assert!(conn.closing);
            assert!(out.windows(5).any(|x| x == b"0A000"), "{out:?}");
        }
    }

    #[test]
    fn bytes_behind_the_request_are_refused_and_tls_is_not_started() {
        let mut w = worker(PgTlsMode::On);
        let mut conn = w.new_pg_conn(0);
        let mut input = SSL.to_vec();
        input.extend_from_slice(b"\x16\x03\x01");
        let out = run(&mut w, &mut conn, &input);
        assert_eq!(out[0], b'S');
        assert!(conn.closing && !conn.start_tls);
        let text = String::from_utf8_lossy(&out);
        assert!(
            text.contains("received unencrypted data after SSL request"),
            "{text}"
        );
    }

    #[test]
    fn required_refuses_a_plaintext_startup_with_the_hostssl_text() {
        let mut w = worker(PgTlsMode::Required);
        let mut conn = w.new_pg_conn(0);
        conn.pg.as_mut().expect("pg").peer = Some("10.1.2.3".parse().expect("ip"));
        let body = b"\0\x03\0\0user\0alice\0database\0app\0\0";
        let mut startup = ((body.len() + 4) as i32).to_be_bytes().to_vec();
        startup.extend_from_slice(body);
        let out = run(&mut w, &mut conn, &startup);
        assert!(conn.closing);
        let text = String::from_utf8_lossy(&out);
        assert!(text.contains("C28000"), "{text}");
        assert!(
            text.contains(
                "no pg_hba.conf entry for host \"10.1.2.3\", user \"alice\", database \"app\", no encryption"
            ),
            "{text}"
        );
    }

    /// The session's statement count and bytes as a batch would leave them, at their peak.
    #[test]
    fn statements_after_counts_new_names_and_closes_at_the_peak() {
        use postgres_protocol::message::frontend;
        let limits = PgLimits::default();
        let mut pg = PgSession::new();
        let msg = |f: &dyn Fn(&mut bytes::BytesMut)| {
            let mut b = bytes::BytesMut::new();
            f(&mut b);
            b.to_vec()
        };
        let parse = |name: &str| msg(&|b| frontend::parse(name, "SELECT 1", [], b).unwrap());
        let close = |name: &str| msg(&|b| frontend::close(b'S', name, b).unwrap());
        let n = parse("a").len();
        for name in ["a", "b", ""] {
            let raw = parse(name);
            let Ok((
                Frontend::Parse {
                    name,
                    query,
                    param_types,
                },
                _,
            )) = parse_frontend(&raw, &limits)
            else {
                panic!("not a Parse");
            };
            pg.remember_parse(name, query, param_types, &raw, true);
        }
        assert_eq!(
            pg.statement_bytes,
            2 * n,
            "the unnamed statement is not counted"
        );
        let batch = |parts: &[Vec<u8>]| parts.concat();
        // A new name adds one; a held one (refused by the origin) and the unnamed add none.
        let b = batch(&[
            parse("c"),
            parse("a"),
            parse(""),
            msg(&|b| frontend::sync(b)),
        ]);
        assert_eq!(
            pg.statements_after(&b, &limits),
            (3, 3 * pg.statement_bytes / 2)
        );
        // Closing first makes room: the peak stays at two.
        let b = batch(&[close("a"), parse("c"), parse("d")]);
        assert_eq!(pg.statements_after(&b, &limits), (3, 3 * n));
        let b = batch(&[close("a"), close("b"), parse("c"), parse("c")]);
        assert_eq!(pg.statements_after(&b, &limits), (2, 2 * n));
        // A name added and closed in the batch, then added again.
        let b = batch(&[parse("c"), close("c"), close("c"), parse("c")]);
        assert_eq!(pg.statements_after(&b, &limits), (3, 3 * n));
        // Closing a name not held takes nothing away.
        let b = batch(&[close("zz"), close(""), parse("c")]);
        assert_eq!(pg.statements_after(&b, &limits), (3, 3 * n));
        pg.forget_statement(b"a");
        pg.forget_statement(b"");
        assert_eq!((pg.statements.len(), pg.statement_bytes), (1, n));
    }
}
