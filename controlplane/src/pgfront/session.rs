//! One client session of the relay: startup and authentication relay, batches on pooled
//! backends, release on close.
//!
//! Startup: the client's StartupMessage goes as it is to a new origin connection; the origin's
//! authentication requests go to the client (`PgReplyEnd::Auth` while a password message is
//! due), the client's `p` messages to the origin, until ReadyForQuery. The origin's
//! BackendKeyData is replaced by pgline's own; the connection then joins the session's pool.
//!
//! Batches: the session's pinned backend, or one from its pool (its own reserved one first; see
//! `pool`). The reply streams back in chunks; the batch's last ReadyForQuery decides: `T`/`E`
//! pin the backend; `I` returns it to the pool if the state read after the batch is the login
//! state, pins it for good if the session left state behind (`plan::leaves_session_state`, or
//! a state read that differs), and reserves it for the session when its state was not read.
//! The fence and state are read only when the core asked (`PgRequest::fence`): then, when the
//! batch ends idle, `fence_lsn` is the origin's WAL position after it (`state::FENCE_SQL`; also
//! read at login, so a new session sees what committed before it); otherwise the
//! reply carries no fence and `serve_cached` false, which closes the session's cache gate in
//! the core.
//!
//! A batch the core marked cacheable that runs with the session idle takes a result lease, runs
//! behind pgline's snapshot query on the same backend, and, if its one statement succeeded and
//! its answer is at most [`RESULT_MAX_BYTES`], hands (key, answer, snapshot, lease) to the
//! writer, which installs it only if still current (`writer/results.rs`).
//!
//! A backend that fails mid-batch is dropped; the client gets an ErrorResponse (08006) and
//! ReadyForQuery `I` (its transaction, if any, is gone with the backend).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use pgline_dataplane::pgwire::{self, sqlstate};
use pgline_dataplane::plane::{
    ConnToken, PgFlow, PgReply, PgReplyEnd, PgRequest, PgRequestKind, PG_FLOW_WINDOW,
    RESULT_MAX_BYTES,
};
use tokio::sync::mpsc;

use super::admit::{self, OriginCounters};
use super::backend::{Backend, Opener, Sequences};
use super::error::{compose_ready, RelayError, Retry, Source};
use super::plan::{self, Plan, Step, Stmt, Tracker};
use super::pool::{Pool, PoolError, Taken};
use super::results;
use super::state::{self, OriginState};
use super::stats::Text;
use super::{lock, CancelState, RelayState, CHUNK};
use crate::origin;
use crate::result_plane::ResultFill;

/// How a batch went on its backend.
#[derive(Default)]
struct Outcome {
    /// The status of the client's last ReadyForQuery, once it went out.
    status: Option<u8>,
    /// The pipelined fence's LSN and the state read with it (only when the batch ended idle).
    fence: Option<(u64, Option<OriginState>)>,
    /// What the state query in front of the batch read (see [`plan::add_check`]).
    checked: Option<OriginState>,
    /// An ErrorResponse went to the client.
    failed: bool,
    /// The connection failed; it must be dropped.
    broken: Option<std::io::Error>,
    /// What the snapshot query before a cacheable statement returned: the snapshot, and how
    /// the session resolved names as the statement started.
    snapshot: Option<String>,
    snapshot_state: Option<state::Resolution>,
    /// The RowDescription of the Describe pgline added.
    described: Option<Vec<u8>>,
    /// Client statement names whose Parse failed or was skipped: not open after all.
    unparsed: Vec<String>,
    /// The batch's named Closes that did not take effect, by their place among them
    /// ([`PgReply::unclosed`]), and the statements they had taken from the session.
    unclosed: Vec<u32>,
    reopened: Vec<(String, Stmt)>,
    /// The session's unnamed statement after the batch, if the batch changed it.
    unnamed: Option<plan::Unnamed>,
}

/// The reply being streamed for one request.
struct Out<'a> {
    relay: &'a RelayState,
    core: usize,
    conn: ConnToken,
    seq: u64,
    buf: Vec<u8>,
    /// Bytes sent so far.
    sent: usize,
    /// A copy of what the client is sent, for the result cache (`None`: not kept, or too big).
    capture: Option<Vec<u8>>,
    /// The session's flow control (none for a session the relay does not know).
    flow: Option<Arc<PgFlow>>,
    /// Goes with the last reply: the session's origin state serves cached answers
    /// ([`PgReply::serve_cached`]).
    serve_cached: bool,
    /// Go with the last reply: [`PgReply::unparsed`], [`PgReply::unclosed`].
    unparsed: Vec<Box<[u8]>>,
    unclosed: Vec<u32>,
}

impl Out<'_> {
    /// Copies what was appended to `buf` since `from` into the capture, if one is kept.
    fn note(&mut self, from: usize) {
        let Some(c) = self.capture.as_mut() else {
            return;
        };
        let new = &self.buf[from.min(self.buf.len())..];
        // Room for the ParseComplete/BindComplete/ReadyForQuery around the answer.
        if c.len() + new.len() > RESULT_MAX_BYTES + 64 {
            self.capture = None;
        } else {
            c.extend_from_slice(new);
        }
    }

    /// Sends full chunks as `More`.
    async fn spill(&mut self) {
        while self.buf.len() > CHUNK {
            let rest = self.buf.split_off(CHUNK);
            let chunk = std::mem::replace(&mut self.buf, rest);
            self.send(chunk, PgReplyEnd::More, 0).await;
        }
    }

    async fn finish(mut self, end: PgReplyEnd, fence_lsn: u64) {
        self.spill().await;
        let last = std::mem::take(&mut self.buf);
        self.send(last, end, fence_lsn).await;
    }

    async fn send(&mut self, bytes: Vec<u8>, end: PgReplyEnd, fence_lsn: u64) {
        if let Some(flow) = &self.flow {
            // A client reading slowly holds the relay back rather than making its core buffer
            // the whole answer; polled (the core publishes its backlog after each egress).
            while flow.outstanding() > PG_FLOW_WINDOW
                && !flow.closed.load(Ordering::Acquire)
                && !self.relay.stopping.load(Ordering::Relaxed)
            {
                tokio::time::sleep(FLOW_POLL).await;
            }
            flow.sent.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        }
        self.sent += bytes.len();
        let reply = PgReply {
            conn: self.conn,
            seq: self.seq,
            bytes,
            end,
            fence_lsn,
            serve_cached: self.serve_cached && matches!(end, PgReplyEnd::Ready(_)),
            unparsed: match end {
                PgReplyEnd::Ready(_) => std::mem::take(&mut self.unparsed),
                _ => Vec::new(),
            },
            unclosed: match end {
                PgReplyEnd::Ready(_) => std::mem::take(&mut self.unclosed),
                _ => Vec::new(),
            },
        };
        self.relay.push_reply(self.core, reply);
    }
}

/// How often a relay held back by [`PG_FLOW_WINDOW`] looks again.
const FLOW_POLL: std::time::Duration = std::time::Duration::from_millis(1);

fn out_for<'a>(relay: &'a RelayState, req: &PgRequest, flow: Option<&Arc<PgFlow>>) -> Out<'a> {
    Out {
        relay,
        core: req.core,
        conn: req.conn,
        seq: req.seq,
        buf: Vec::new(),
        sent: 0,
        capture: None,
        flow: flow.cloned(),
        serve_cached: false,
        unparsed: Vec::new(),
        unclosed: Vec::new(),
    }
}

/// Answers a request of a session the relay does not know (it ended) with a fatal error.
pub(super) async fn refuse_unknown(relay: &RelayState, req: PgRequest) {
    let mut out = out_for(relay, &req, None);
    let e = RelayError::new(
        Source::Pgline,
        Retry::Reconnect,
        sqlstate::CONNECTION_FAILURE,
        "pgline: session closed",
    );
    e.compose_fatal(&mut out.buf);
    out.finish(PgReplyEnd::Close, 0).await;
}

/// Refuses a startup past `max_sessions`.
pub(super) async fn refuse_full(relay: &RelayState, req: PgRequest) {
    let mut out = out_for(relay, &req, None);
    RelayError::busy(Retry::Reconnect, "sorry, too many clients already")
        .compose_fatal(&mut out.buf);
    out.finish(PgReplyEnd::Close, 0).await;
}

pub(super) struct Session {
    relay: Arc<RelayState>,
    id: u64,
    key: (i32, i32),
    cancel: Arc<Mutex<CancelState>>,
    pool: Option<Arc<Pool>>,
    /// The pool key's startup settings, until login completes (the key also holds the login
    /// state, known only then).
    startup_settings: String,
    /// The origin state right after login ([`OriginState::fingerprint`]): a backend of this
    /// session's pool in another state holds session state.
    login_state: String,
    /// The origin state after the session's last batch serves cached answers.
    serve_cached: bool,
    /// The origin connection being authenticated.
    auth: Option<Backend>,
    /// The client's StartupMessage.
    startup: Vec<u8>,
    user: String,
    database: String,
    stmts: HashMap<String, Stmt>,
    unnamed: plan::Unnamed,
    pinned: Option<Backend>,
    /// Left session state behind: keeps its backend until the end.
    sticky: bool,
    /// Logged in with the server's defaults (no startup settings): its pool's connections
    /// produce the answers the query-result cache may keep.
    plain_startup: bool,
    /// Flow control of the replies, shared with the client's core (from the Startup request).
    flow: Option<Arc<PgFlow>>,
    status: u8,
    /// The backend of the client's open transaction died after its reply went out.
    lost: bool,
    /// The last batch's state verdict came from a fence statement pgline parsed on its backend
    /// since that backend last ran a batch nobody vouched for (see `settle`).
    verdict_trusted: bool,
    /// The origin refuses this session's role the fence query: it is not asked again, and the
    /// session reads nothing from cache (see [`fence_refused`]).
    no_fence: bool,
    /// The session ran a text naming `synchronous_commit`: it may have committed with the
    /// setting `off` where its setting at the next fence is not (`SET LOCAL`, `set_config(..,
    /// true)`, `SET` then `RESET`), so its fences are the origin's insert position from then on
    /// (`state::FENCE_ASYNC_SQL`; `docs/pgwire.md`, "Asynchronous commits").
    async_commits: bool,
    closed: bool,
}

impl Session {
    pub(super) fn new(
        relay: Arc<RelayState>,
        id: u64,
        key: (i32, i32),
        cancel: Arc<Mutex<CancelState>>,
    ) -> Session {
        Session {
            relay,
            id,
            key,
            cancel,
            pool: None,
            startup_settings: String::new(),
            login_state: String::new(),
            serve_cached: false,
            auth: None,
            startup: Vec::new(),
            user: String::new(),
            database: String::new(),
            stmts: HashMap::new(),
            unnamed: plan::Unnamed::default(),
            pinned: None,
            sticky: false,
            plain_startup: false,
            flow: None,
            status: b'I',
            lost: false,
            no_fence: false,
            async_commits: false,
            verdict_trusted: false,
            closed: false,
        }
    }

    pub(super) async fn run(mut self, mut rx: mpsc::UnboundedReceiver<PgRequest>) {
        while let Some(req) = self.next_request(&mut rx).await {
            match req.kind {
                PgRequestKind::Startup => self.startup(req).await,
                PgRequestKind::Auth => self.auth(req).await,
                PgRequestKind::Batch => self.batch(req).await,
                PgRequestKind::Close => self.closed = true,
                PgRequestKind::Cancel => {}
            }
            if self.closed {
                break;
            }
        }
        self.release().await;
        tracing::debug!(session = self.id, "pgwire: session ended");
    }

    /// The next request; `None` when the client left, or when its authentication ran out of
    /// time while the relay waited for its password (the origin connection closes with the
    /// session, and the client's late answer is refused as a closed session's).
    async fn next_request(
        &mut self,
        rx: &mut mpsc::UnboundedReceiver<PgRequest>,
    ) -> Option<PgRequest> {
        let Some(deadline) = self.auth.as_ref().and_then(Backend::auth_deadline) else {
            return rx.recv().await;
        };
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(req) => req,
            Err(_) => {
                let expired = self.auth.take().map(|b| b.expire_auth());
                tracing::debug!(
                    session = self.id,
                    ?expired,
                    "pgwire: authentication timed out"
                );
                None
            }
        }
    }

    async fn fatal(&mut self, req: &PgRequest, e: &RelayError) {
        let mut out = out_for(&self.relay, req, self.flow.as_ref());
        e.compose_fatal(&mut out.buf);
        out.finish(PgReplyEnd::Close, 0).await;
        self.closed = true;
    }

    async fn startup(&mut self, mut req: PgRequest) {
        if let Some(flow) = req.flow.take() {
            self.flow = Some(flow);
        }
        let Some(Startup {
            user,
            database,
            settings,
        }) = parse_startup(&req.messages)
        else {
            let e = RelayError::client(sqlstate::PROTOCOL_VIOLATION, "invalid startup packet");
            return self.fatal(&req, &e).await;
        };
        self.database = database;
        self.plain_startup = settings.is_empty();
        self.startup_settings = settings;
        self.startup.clone_from(&req.messages);
        self.user = user;
        // At most `max_pending_startups` origin connections in authentication (see `admit`).
        let Some(slot) = self.relay.admission.admit().await else {
            let e = RelayError::busy(Retry::Reconnect, admit::STARTUP_REFUSED);
            return self.fatal(&req, &e).await;
        };
        let cfg = &self.relay.cfg;
        match Backend::connect(&cfg.origin, cfg.connect_timeout).await {
            Ok(mut b) => match b.admit(slot).write(&req.messages).await {
                Ok(()) => self.relay_auth(req, b).await,
                Err(e) => self.origin_gone(&req, &e).await,
            },
            Err(e) => self.origin_gone(&req, &e).await,
        }
    }

    async fn origin_gone(&mut self, req: &PgRequest, e: &std::io::Error) {
        if admit::is_auth_timeout(e) {
            let e = RelayError::new(
                Source::Client,
                Retry::Reconnect,
                sqlstate::CONNECTION_FAILURE,
                admit::AUTH_TIMED_OUT,
            );
            return self.fatal(req, &e).await;
        }
        let msg = format!("pgline: cannot reach the origin: {e}");
        self.fatal(req, &RelayError::origin(Retry::Reconnect, msg))
            .await;
    }

    async fn auth(&mut self, req: PgRequest) {
        let Some(mut b) = self.auth.take() else {
            let e = RelayError::client(sqlstate::PROTOCOL_VIOLATION, "unexpected password message");
            return self.fatal(&req, &e).await;
        };
        if std::mem::take(&mut b.awaiting_sasl_initial)
            && b.is_tls()
            && super::backend::sasl_wants_binding(&req.messages)
        {
            tokio::spawn(async move { drop(b) });
            let e = RelayError::new(
                Source::Client,
                Retry::Never,
                sqlstate::INVALID_AUTHORIZATION_SPECIFICATION,
                super::backend::CHANNEL_BINDING_REFUSED,
            );
            return self.fatal(&req, &e).await;
        }
        match b.write(&req.messages).await {
            Ok(()) => self.relay_auth(req, b).await,
            Err(e) => self.origin_gone(&req, &e).await,
        }
    }

    /// Relays the origin's side of the exchange until the client must answer or it is over.
    async fn relay_auth(&mut self, req: PgRequest, mut b: Backend) {
        let mut out = out_for(&self.relay, &req, self.flow.as_ref());
        loop {
            let frame = match b.read_frame().await {
                Ok(f) => f,
                Err(e) => return self.origin_gone(&req, &e).await,
            };
            match frame[0] {
                b'R' => {
                    let code = origin::auth_request(&frame).map(|(code, _)| code);
                    if code == Some(10) {
                        // The client binds to pgline's certificate, never the origin's: no PLUS.
                        super::backend::compose_sasl_without_plus(&frame, &mut out.buf);
                        b.awaiting_sasl_initial = true;
                    } else {
                        out.buf.extend_from_slice(&frame);
                    }
                    match code {
                        Some(0 | 12) => {}
                        Some(3 | 5 | 10 | 11) => {
                            self.auth = Some(b);
                            return out.finish(PgReplyEnd::Auth, 0).await;
                        }
                        _ => {
                            out.buf.clear();
                            RelayError::new(
                                Source::Pgline,
                                Retry::Never,
                                sqlstate::INVALID_AUTHORIZATION_SPECIFICATION,
                                "pgline: authentication method not supported",
                            )
                            .compose_fatal(&mut out.buf);
                            self.closed = true;
                            return out.finish(PgReplyEnd::Close, 0).await;
                        }
                    }
                }
                b'E' => {
                    out.buf.extend_from_slice(&frame);
                    self.closed = true;
                    return out.finish(PgReplyEnd::Close, 0).await;
                }
                b'K' => {
                    let Some((pid, secret)) = origin::backend_key(&frame) else {
                        let e = std::io::Error::other("malformed BackendKeyData");
                        return self.origin_gone(&req, &e).await;
                    };
                    (b.pid, b.secret) = (pid, secret);
                    pgwire::compose_backend_key_data(&mut out.buf, self.key.0, self.key.1);
                }
                b'Z' => {
                    let origin = &self.relay.cfg.origin;
                    if let Err(why) = origin::session_fits(origin.attrs, &b.session_params) {
                        // A relayed login cannot be replayed on another host: the client
                        // reconnects, and starts on the next host.
                        origin.primary.forget(b.host, origin.addrs().len());
                        tokio::spawn(b.terminate());
                        out.buf.clear();
                        RelayError::origin(
                            Retry::Reconnect,
                            format!(
                                "pgline: the origin host is not what target_session_attrs asks                                  for ({why}); reconnect to reach another host"
                            ),
                        )
                        .compose_fatal(&mut out.buf);
                        self.closed = true;
                        return out.finish(PgReplyEnd::Close, 0).await;
                    }
                    if origin.attrs == origin::SessionAttrs::ReadWrite {
                        origin.primary.set(b.host);
                    }
                    out.buf.extend_from_slice(&frame);
                    // With the WAL position: a session sees every write committed before it
                    // connected, as a new PostgreSQL session does, so its cached answers wait
                    // for pgline's WAL to reach that position (the fence).
                    let asked = match ask_fence(&mut b, &self.relay.cfg.own_sql, false).await {
                        Ok(Some((lsn, s))) => Ok((Some(lsn), s)),
                        Ok(None) => {
                            fence_refused(&mut self.no_fence, self.id, &self.user);
                            state::ask_state(&mut b, &self.relay.cfg.own_sql)
                                .await
                                .map(|s| (None, s))
                        }
                        Err(e) => Err(e),
                    };
                    let (fence, login) = match asked {
                        Ok((fence, Some(s))) => (fence, s),
                        Ok((_, None)) => {
                            tokio::spawn(b.terminate());
                            out.buf.clear();
                            RelayError::origin(
                                Retry::Reconnect,
                                "pgline: the origin did not tell the session's state",
                            )
                            .compose_fatal(&mut out.buf);
                            self.closed = true;
                            return out.finish(PgReplyEnd::Close, 0).await;
                        }
                        Err(e) => return self.origin_gone(&req, &e).await,
                    };
                    self.login_state = login.fingerprint();
                    // Nothing has run on it but the login: its settings are not the session's.
                    b.clean_settings = Some(login.watched.clone());
                    // No fence, no cached answer (its next cacheable read asks for one).
                    self.serve_cached = fence.is_some() && self.serves_cache(&login).await;
                    out.serve_cached = self.serve_cached;
                    // Sessions share connections only with sessions that logged in to the
                    // same state (a role or database default changed since is another pool).
                    let key = format!("{}\0{}", self.startup_settings, self.login_state);
                    let Some(pool) = self.relay.pool(req.core, &self.user, &self.database, &key)
                    else {
                        tokio::spawn(b.terminate());
                        out.buf.clear();
                        RelayError::busy(Retry::Reconnect, admit::POOLS_FULL)
                            .compose_fatal(&mut out.buf);
                        self.closed = true;
                        return out.finish(PgReplyEnd::Close, 0).await;
                    };
                    self.pool = Some(pool.clone());
                    pool.enter(self.id);
                    if let Some(extra) = pool.join(b) {
                        tokio::spawn(extra.terminate());
                    }
                    let cfg = &self.relay.cfg;
                    if let Some((user, password)) = &cfg.credentials {
                        if *user == self.user {
                            pool.set_opener(Opener {
                                origin: cfg.origin.clone(),
                                timeout: cfg.connect_timeout,
                                user: user.clone(),
                                password: password.clone(),
                                startup: std::mem::take(&mut self.startup),
                            });
                        }
                    }
                    return out
                        .finish(PgReplyEnd::Ready(b'I'), fence.unwrap_or(0))
                        .await;
                }
                b'S' => {
                    b.note_parameter(&frame);
                    out.buf.extend_from_slice(&frame);
                }
                _ => out.buf.extend_from_slice(&frame),
            }
        }
    }

    /// Whether `s` is a state cached answers were made under, for this session's login user.
    async fn serves_cache(&self, s: &OriginState) -> bool {
        match self.relay.baseline().await {
            Some(baseline) => s.serves_cache(&self.user, baseline),
            None => false,
        }
    }

    /// The backend for the next batch: the pinned one, this session's reserved one, an idle
    /// one, or another session's reserved one whose state reads as the login state (see
    /// `pool`), and whether it is known to be in the pool's login state (an idle one, or a
    /// stolen one whose state read showed it: see `PgRequest::state_free`). With `defer` (the
    /// batch's messages) that [`plan::only_starts_transaction`], a stolen one comes unread,
    /// with the guard that keeps its owner waiting: its state is read in front of the batch.
    /// Busy (no connection free by `deadline`) is [`Retry::Later`]: the client may try again.
    ///
    /// A cancel sent at that backend must have landed first. The origin signals the backend
    /// (PostgreSQL signals its process and then its process group, so possibly twice) before it
    /// closes the cancel's connection; a batch sent before that close may be the statement the
    /// signal cancels. The pool's idle connections wait in `Pool::put`; the session's own
    /// (pinned or reserved) and a stolen one wait here. A cancel whose fate is unknown is not
    /// waited for past its own bounds (connect, then answer, each `pgwire.connect_timeout_ms`).
    async fn backend(
        &mut self,
        deadline: tokio::time::Instant,
        defer: Option<&[u8]>,
    ) -> Result<Got, RelayError> {
        let mut got = self.take_backend(deadline, defer).await?;
        if got.clean || got.unread.is_some() {
            // Another session's, or the pool's: a fence statement another session may have
            // replaced is not run for this one.
            got.b.reparse_suspect_fence();
        }
        if !got.b.cancels.clear() {
            got.b.cancels.settled().await;
        }
        Ok(got)
    }

    async fn take_backend(
        &mut self,
        deadline: tokio::time::Instant,
        defer: Option<&[u8]>,
    ) -> Result<Got, RelayError> {
        let got = |b, clean| Got {
            b,
            clean,
            unread: None,
        };
        if let Some(b) = self.pinned.take() {
            return Ok(got(b, false));
        }
        let Some(pool) = self.pool.clone() else {
            return Err(RelayError::client(
                sqlstate::PROTOCOL_VIOLATION,
                "pgline: batch before startup",
            ));
        };
        loop {
            let (b, taken) = pool.take_for(self.id, deadline).await.map_err(|e| {
                let msg = format!("pgline: {e}");
                match e {
                    PoolError::Timeout => RelayError::busy(Retry::Later, msg),
                    PoolError::Empty | PoolError::Open => RelayError::origin(Retry::Reconnect, msg),
                }
            })?;
            match taken {
                Taken::Clean => return Ok(got(b, true)),
                Taken::Own { dirty } => {
                    // Known to hold this session's state: it stays with the session.
                    self.sticky |= dirty;
                    return Ok(got(b, false));
                }
                Taken::Steal { owner } => {
                    let settling = Settling {
                        pool: Arc::clone(&pool),
                        owner,
                    };
                    if defer.is_some_and(|m| plan::only_starts_transaction(m, &self.stmts)) {
                        OriginCounters::add(&pool.counters().backend_steals_unread, 1);
                        return Ok(Got {
                            b,
                            clean: false,
                            unread: Some(settling),
                        });
                    }
                    if let Some(b) = self.check_stolen(settling, b).await {
                        return Ok(got(b, true));
                    }
                }
            }
        }
    }

    /// The local reply to a batch that only prepares statements the pool knows, for an idle
    /// session with no backend free (see [`plan::parse_only`]).
    fn parse_locally(&mut self, messages: &[u8]) -> Option<Vec<u8>> {
        if self.status != b'I' || self.pinned.is_some() {
            return None;
        }
        let pool = self.pool.clone()?;
        plan::parse_only(messages, &mut self.stmts, |name| pool.knows(name))
    }

    /// Whether `b`, whose state read `s` shows, is in this session's login state: the
    /// fingerprint it logged in with, and none of the watched settings its session's own
    /// (`state::settings_clean`, which may ask the origin). Every check of a backend's state
    /// goes through here, so that a state added to one is not missed at another.
    async fn in_login_state(
        &self,
        b: &mut Backend,
        s: &state::OriginState,
    ) -> std::io::Result<bool> {
        if s.fingerprint() != self.login_state {
            return Ok(false);
        }
        state::settings_clean(b, s).await
    }

    /// Another session's reserved backend: usable here only if the origin says it is in the
    /// pool's login state. Otherwise it holds its owner's session state: it goes back to the
    /// owner, pinned (or, if the owner has ended meanwhile, is reset as a pinned one is at a
    /// session's end, and used if that brings the login state back).
    async fn check_stolen(&self, settling: Settling, mut b: Backend) -> Option<Backend> {
        // However this ends (kept, handed back, broken, or this task dropped mid-read), the
        // owner stops waiting for its connection (`settling` dropped).
        let read = match state::ask_state(&mut b, &self.relay.cfg.own_sql).await {
            Ok(Some(s)) => self.in_login_state(&mut b, &s).await,
            Ok(None) => Ok(false),
            Err(e) => Err(e),
        };
        match read {
            Ok(true) => Some(b),
            Ok(false) => self.hand_back(&settling, b).await,
            Err(_) => {
                self.discard();
                tokio::spawn(b.terminate());
                None
            }
        }
    }

    /// Gives a stolen backend that holds another session's state back to its owner, pinned;
    /// when the owner has ended meanwhile, resets it as a pinned one is at a session's end and
    /// returns it if that brought the login state back.
    async fn hand_back(&self, settling: &Settling, b: Backend) -> Option<Backend> {
        let mut b = settling.pool.reserve(settling.owner, b, true)?;
        if reset(&mut b, &self.relay.cfg.own_sql, &self.login_state).await {
            return Some(b);
        }
        self.discard();
        tokio::spawn(b.terminate());
        None
    }

    async fn batch(&mut self, mut req: PgRequest) {
        if plan::book_statements(&req.statements, &mut self.stmts, &mut self.unnamed).is_err() {
            // The core took these from the client's own Parse messages (a named statement's
            // text must be UTF-8 here, as in any batch).
            let e = RelayError::client(sqlstate::PROTOCOL_VIOLATION, "malformed Parse message");
            return self.fatal(&req, &e).await;
        }
        let cache = req.cache.take();
        // The core asks for the fence and the state verdict only when the batch holds a
        // statement it could have answered from cache; without them its gate stays closed.
        let want_fence = req.fence && !self.no_fence;
        // The core vouches for a cacheable read (no unknown function) and for a batch that
        // runs nothing or only constants: nothing else in it can touch pgline's own statements.
        let vouched = req.fence || req.state_free;
        if std::mem::take(&mut self.lost) {
            let mut out = out_for(&self.relay, &req, self.flow.as_ref());
            RelayError::origin(
                Retry::Later,
                "pgline: the origin connection of this transaction was lost; it is rolled back",
            )
            .compose_error(&mut out.buf);
            compose_ready(&mut out.buf, b'I');
            self.not_run(&req.messages, &mut out);
            return out.finish(PgReplyEnd::Ready(b'I'), 0).await;
        }
        // A batch that only starts a transaction may run on a stolen backend behind its state
        // read, in one round trip (see `plan::add_check`).
        let defer = (self.status == b'I' && !self.sticky && !want_fence && cache.is_none())
            .then_some(&req.messages[..]);
        // A client that prepares statements the pool already knows is answered at once when
        // no backend is free (as PgBouncer does with prepared statements): a client blocked
        // in `PQprepare` may be the one that would end the transactions holding them.
        let now = tokio::time::Instant::now();
        let mut got = self.backend(now, defer).await;
        if matches!(&got, Err(e) if e.retry == Retry::Later) {
            if let Some(reply) = self.parse_locally(&req.messages) {
                let mut out = out_for(&self.relay, &req, self.flow.as_ref());
                out.buf.extend_from_slice(&reply);
                return out.finish(PgReplyEnd::Ready(b'I'), 0).await;
            }
            got = self.backend(now + self.relay.cfg.pool_wait, defer).await;
        }
        let Got {
            mut b,
            clean,
            unread,
        } = match got {
            Ok(taken) => taken,
            Err(e) if e.retry == Retry::Later => {
                // Busy, not broken: the client may try again.
                let mut out = out_for(&self.relay, &req, self.flow.as_ref());
                e.compose_error(&mut out.buf);
                compose_ready(&mut out.buf, self.status);
                self.not_run(&req.messages, &mut out);
                return out.finish(PgReplyEnd::Ready(self.status), 0).await;
            }
            Err(e) => return self.fatal(&req, &e).await,
        };
        let idle_before = self.status == b'I' && !self.sticky;
        // The core vouches that the batch cannot change session state; the backend was in the
        // login state: it still is after the batch.
        let state_free = req.state_free && idle_before && clean;
        // A cacheable statement's answer needs its RowDescription (see `results`).
        let added = cache
            .as_ref()
            .filter(|_| idle_before)
            .and_then(|_| results::with_describe(&req.messages));
        let messages = added.as_deref().unwrap_or(&req.messages);
        // Put back if the batch has to run elsewhere after all.
        let stmts_before = unread.as_ref().map(|_| self.stmts.clone());
        let mut plan =
            match plan::plan_batch(messages, &mut self.stmts, &self.unnamed, &mut b.prepared) {
                Ok(p) => p,
                Err(e) => {
                    // The session ends: a pinned backend stays pinned, so that `release` rolls
                    // back its transaction and resets its state; a pooled one is dropped, because
                    // the batch's earlier Parses were already booked as prepared on it. (Not a
                    // stolen one taken unread: `plan::only_starts_transaction` passes only batches
                    // that plan.)
                    if self.status != b'I' || self.sticky {
                        self.pinned = Some(b);
                    } else {
                        self.discard();
                        tokio::spawn(b.terminate());
                    }
                    let e =
                        RelayError::client(sqlstate::PROTOCOL_VIOLATION, format!("pgline: {e}"));
                    return self.fatal(&req, &e).await;
                }
            };
        // Behind a COPY the fence query would land in the copy stream, and behind a batch
        // that may open a transaction it would run inside it (taking a REPEATABLE READ
        // snapshot early, or failing a later SET TRANSACTION): asked afterwards then, once the
        // session is idle (`settle`).
        let sql: Vec<Arc<Text>> = std::mem::take(&mut plan.sql)
            .iter()
            .map(|s| self.relay.stats.text(s))
            .collect();
        let copy = sql.iter().any(|t| t.traits.copy);
        let may_open_tx = sql.iter().any(|t| t.traits.may_open_tx);
        self.async_commits |= sql.iter().any(|t| t.traits.synchronous_commit);
        let fence_name = state::fence_name(self.async_commits);
        let pipelined = want_fence && idle_before && !copy && !may_open_tx;
        // The answer may be stored: a cacheable statement run with the session idle, in a
        // session whose startup set nothing.
        let stores = cache.is_some() && idle_before && !copy && self.plain_startup;
        if stores {
            // A stored answer serves every cache user: its verdict comes from a fence
            // statement parsed in this very run (`Close`, `Parse`), whatever ran before on
            // this backend, vouched for or not (a batch's text cannot show all the code it
            // runs: a domain's check, say).
            b.prepared.remove(fence_name);
        }
        let fresh = pipelined && b.fence_parsed_fresh(fence_name);
        if pipelined {
            plan::add_fence(
                &mut plan,
                &mut b.prepared,
                &self.relay.cfg.own_sql,
                self.async_commits,
            );
        }
        // Sequence values another session may have left here go before the session's first
        // batch on the backend (behind the state read of a stolen backend, which must see the
        // owner's state): after it, what the backend holds is the session's own.
        if self.status == b'I' && b.sequences.foreign_to(self.id) {
            plan::add_discard_sequences(&mut plan);
            b.sequences = Sequences::Clean;
        }
        if unread.is_some() {
            plan::add_check(&mut plan, &mut b.prepared, &self.relay.cfg.own_sql);
        }
        if added.is_some() {
            plan::hide_added_describe(&mut plan);
        }
        // The lease is taken before the statement (and its snapshot) reaches the origin.
        let cache = cache.filter(|_| stores).map(|key| {
            plan::add_snapshot(&mut plan);
            let lease = self.relay.results.lease(&key.tables);
            (key, lease)
        });
        let parsed: Vec<String> = plan.named_parses.iter().map(|(_, n)| n.clone()).collect();
        let relay = self.relay.clone();
        let mut out = out_for(&relay, &req, self.flow.as_ref());
        if cache.is_some() {
            out.capture = Some(Vec::new());
        }
        if clean {
            // In the login state: it listens to nothing of this session's.
            b.notifications.clear();
        } else if unread.is_none() {
            // The session's own connection: notifications that arrived during pgline's own
            // statements since its last reply go first, as PostgreSQL sent them first. (One
            // taken from another session unread keeps them for that session.)
            out.buf.append(&mut b.notifications);
        }
        let started = std::time::Instant::now();
        let mut o = self.execute(&mut b, plan, &mut out, unread.is_some()).await;
        if !vouched {
            b.distrust_own_statements();
        }
        if !req.state_free {
            b.sequences = b.sequences.used_by(self.id);
        }
        if let Some(settling) = unread {
            let undoable = o.broken.is_none() && out.sent == 0;
            let foreign = undoable
                && match &o.checked {
                    // The settings are asked after the batch (the read went before it): one the
                    // batch set itself counts as the owner's, and the batch runs elsewhere.
                    Some(s) => !matches!(self.in_login_state(&mut b, s).await, Ok(true)),
                    None => true,
                };
            if foreign {
                if let Some(status) = o.status {
                    // The transaction started in another session's state (or one not read):
                    // taken back, the backend returned to its owner, the batch run elsewhere.
                    // The client has seen none of it (`TRANSACTION_START_MAX`).
                    if o.checked.is_none() {
                        b.prepared.remove(state::STATE_STATEMENT);
                    }
                    if let Some(stmts) = stmts_before {
                        self.stmts = stmts;
                    }
                    let undone =
                        status == b'I' || matches!(b.simple("ROLLBACK").await, Ok(Some(_)));
                    if !undone {
                        self.discard();
                        tokio::spawn(b.terminate());
                    } else if let Some(b) = self.hand_back(&settling, b).await {
                        self.put_back(b);
                    }
                    drop(settling);
                    return Box::pin(self.batch(req)).await;
                }
            }
        }
        for name in &o.unparsed {
            self.stmts.remove(name);
        }
        // The core booked them too when it forwarded the batch.
        out.unparsed = o.unparsed.iter().map(|n| n.as_bytes().into()).collect();
        // After the failed Parses: a skipped Close, and a Parse of the same name after it
        // (skipped as well), leave the statement the session held before.
        out.unclosed = std::mem::take(&mut o.unclosed);
        for (name, st) in std::mem::take(&mut o.reopened) {
            self.stmts.entry(name).or_insert(st);
        }
        if let Some(u) = o.unnamed.take() {
            self.unnamed = u;
        }
        if o.status.is_some() {
            if let Some(pool) = &self.pool {
                for st in parsed.iter().filter_map(|n| self.stmts.get(n)) {
                    pool.learn(&st.backend_name);
                }
            }
        }
        let bytes = out.sent + out.buf.len();
        let failed = o.failed || o.status.is_none();
        relay.stats.record(&sql, started.elapsed(), bytes, failed);
        if let Some(e) = &o.broken {
            tracing::warn!(session = self.id, error = %e, "pgwire: origin connection failed");
        }
        let Some(status) = o.status else {
            // The client's reply is incomplete: close it with an error (unless the origin sent
            // one before going away) and ReadyForQuery; its transaction, if any, is gone.
            self.discard();
            self.status = b'I';
            self.sticky = false;
            if !o.failed {
                RelayError::origin(
                    Retry::Later,
                    "pgline: the origin connection failed during the request",
                )
                .compose_error(&mut out.buf);
            }
            compose_ready(&mut out.buf, b'I');
            return out.finish(PgReplyEnd::Ready(b'I'), 0).await;
        };
        // An answer is kept only if the origin state read right after the statement is the
        // cache's. A cacheable statement reads only (no volatile or unknown function, so no
        // set_config, no SET): the state it ran under is the one read after it.
        let broken = o.broken.is_some();
        let fence = self
            .settle(
                b,
                &o,
                status,
                &sql,
                (want_fence, pipelined, fresh, state_free),
            )
            .await;
        // Those that arrived during the fence or the closing of statements after the reply
        // follow it; a connection that went back to the pool listens to nothing.
        if let Some(pinned) = self.pinned.as_mut() {
            out.buf.append(&mut pinned.notifications);
        }
        // The statement must have started resolving names as the store does: the state read
        // after it does not show a path that changed back while it ran (`state::SNAPSHOT_SQL`).
        let started_clean = o
            .snapshot_state
            .as_ref()
            .is_some_and(|r| r.serves_cache(&self.user));
        if let (Some((key, lease)), b'I', false, false, true, true, true) = (
            cache,
            status,
            o.failed,
            broken,
            self.serve_cached,
            self.verdict_trusted,
            started_clean,
        ) {
            let answer = out
                .capture
                .take()
                .and_then(|c| results::answer_of(&c, o.described.as_deref()));
            if let (Some(bytes), Some(snapshot)) = (answer, o.snapshot.clone()) {
                relay.results.push(ResultFill {
                    key,
                    bytes,
                    snapshot,
                    lease,
                });
            }
        }
        out.serve_cached = self.serve_cached;
        out.finish(PgReplyEnd::Ready(status), fence.unwrap_or(0))
            .await;
    }

    /// A batch answered with an error before any of it ran: the core takes back what it
    /// booked for its Parses and Closes (see [`plan::not_run`]).
    fn not_run(&self, messages: &[u8], out: &mut Out<'_>) {
        let (unparsed, unclosed) = plan::not_run(messages, &self.stmts);
        out.unparsed = unparsed.into_iter().map(Vec::into_boxed_slice).collect();
        out.unclosed = unclosed;
    }

    /// After the client's reply: where the backend goes, the session's state, the fence.
    /// `fenced`: (the core asked for the fence, it was pipelined behind the batch, that fence
    /// statement was parsed in this run, the batch left a backend taken in the login state in
    /// it: see `PgRequest::state_free`).
    ///
    /// The backend goes back to the pool only when the state read with the fence shows the
    /// login state and the fence statement is pgline's own for sure (`Backend::fence_suspect`);
    /// after a batch without that read, its state is unknown and it stays
    /// reserved for this session (see `pool`); a backend known to hold session state, or in a
    /// transaction, stays pinned to it.
    async fn settle(
        &mut self,
        mut b: Backend,
        o: &Outcome,
        status: u8,
        sql: &[Arc<Text>],
        (want_fence, pipelined, mut fresh, state_free): (bool, bool, bool, bool),
    ) -> Option<u64> {
        let fence_name = state::fence_name(self.async_commits);
        self.verdict_trusted = false;
        self.status = status;
        // Known again only from a state read after this batch.
        self.serve_cached = false;
        let mut fence = o.fence.as_ref().map(|(lsn, _)| *lsn);
        let mut after = o.fence.as_ref().and_then(|(_, s)| s.clone());
        if o.broken.is_some() {
            // Only the hidden fence was lost: the client's reply is whole.
            self.discard();
            self.sticky = false;
            if status != b'I' {
                // The transaction died with the backend: the next batch tells the client.
                self.status = b'I';
                self.lost = true;
            } else if want_fence && fence.is_none() {
                fence = Some(self.fence_elsewhere().await);
            }
            return fence;
        }
        if pipelined && fence.is_none() {
            // The prepared fence failed (a client's DEALLOCATE or PREPARE took its name):
            // parsed again, or run as a simple query, next time.
            b.prepared.remove(fence_name);
        }
        if status == b'I' && want_fence && fence.is_none() {
            let parse = b.fence_parsed_fresh(fence_name);
            match ask_fence(&mut b, &self.relay.cfg.own_sql, self.async_commits).await {
                Ok(Some((lsn, s))) => {
                    fence = Some(lsn);
                    after = s;
                    fresh = parse;
                }
                Ok(None) => self.fence_refused(),
                Err(_) => {
                    // The connection died after the reply, or a cancel sent at it went
                    // astray: drop it, and ask another one (the batch may have written).
                    self.discard();
                    self.sticky = false;
                    return Some(self.fence_elsewhere().await);
                }
            }
        }
        let clears = sql.iter().any(|t| t.traits.clears_prepared);
        if clears && !o.failed {
            b.prepared.clear();
        }
        self.sticky |= sql.iter().any(|t| t.traits.leaves_state);
        let verified = status == b'I' && fence.is_some();
        if verified && fresh {
            b.trust_fence(fence_name);
        }
        // A verdict from a fence statement a client may have replaced counts for this session
        // alone (it ran the batch that made it suspect): not for the pool, nor a stored answer.
        self.verdict_trusted = verified && !b.fence_suspect;
        if verified {
            // However the batch changed the backend's session (SET, set_config under any
            // spelling, a function), the origin's own answer shows it: a backend no longer
            // in its login state stays with this session and is reset at its end.
            match &after {
                Some(s) => {
                    if !self.sticky {
                        // A setting a function made the session's own (`statement_timeout`,
                        // `row_security`, ...) keeps the backend here too.
                        match self.in_login_state(&mut b, s).await {
                            Ok(clean) => self.sticky = !clean,
                            Err(_) => {
                                self.discard();
                                self.sticky = false;
                                tokio::spawn(b.terminate());
                                return fence;
                            }
                        }
                    }
                    self.serve_cached = self.serves_cache(s).await;
                }
                None => self.sticky = true,
            }
        }
        if status != b'E' && b.prepared.len() > self.relay.cfg.max_origin_statements {
            // Sessions that shared this connection prepared their statements on it, and a
            // client's Close is answered here: without this the origin's backend would hold
            // every statement it ever ran. Those still in use are prepared again when bound.
            // Also inside a transaction block (a client may Parse and Close new texts there
            // without end); an open portal keeps its own plan. An aborted one runs nothing.
            match b.close_statements().await {
                Ok(n) => OriginCounters::add(
                    &self.relay.admission.counters.origin_statements_closed,
                    n as u64,
                ),
                Err(e) => {
                    tracing::warn!(session = self.id, error = %e, "pgwire: closing an origin connection's statements failed");
                    self.discard();
                    self.sticky = false;
                    tokio::spawn(b.terminate());
                    return fence;
                }
            }
        }
        if status != b'I' || self.sticky {
            // Inside a transaction block DISCARD ALL fails, and an aborted transaction
            // runs nothing: with an error, nothing was cleared.
            self.pinned = Some(b);
        } else if clears && o.failed {
            // Whether the DISCARD/DEALLOCATE ran is not known: the connection's prepared
            // statements are not either, so it is not pooled again.
            self.discard();
            tokio::spawn(b.terminate());
        } else if self.verdict_trusted || state_free {
            self.put_back(b);
        } else if let Some(pool) = self.pool.clone() {
            // Not read: whatever the batch left on the backend stays this session's.
            if let Some(b) = pool.reserve(self.id, b, false) {
                self.pinned = Some(b);
            }
        }
        fence
    }

    /// See [`fence_refused`].
    fn fence_refused(&mut self) {
        fence_refused(&mut self.no_fence, self.id, &self.user);
    }

    /// The origin's WAL position read over a pooled connection, when the batch's own one
    /// died before telling it. If none answers either, `u64::MAX`: the core keeps a session's
    /// highest fence, so this session (whose origin is failing anyway) reads from the origin
    /// from then on, never older data than its last write.
    async fn fence_elsewhere(&mut self) -> u64 {
        if let Ok(Got { mut b, .. }) = self
            .backend(tokio::time::Instant::now() + self.relay.cfg.pool_wait, None)
            .await
        {
            match ask_fence(&mut b, &self.relay.cfg.own_sql, self.async_commits).await {
                Ok(Some((lsn, _))) => {
                    self.put_back(b);
                    return lsn;
                }
                Ok(None) => {
                    self.fence_refused();
                    self.put_back(b);
                    return u64::MAX;
                }
                Err(_) => {}
            }
            self.discard();
            tokio::spawn(b.terminate());
        }
        u64::MAX
    }

    /// Sends the plan and streams the replies (see [`Outcome`]).
    /// Runs `plan` on `b`; `theirs`: `b` was taken from another session before its state
    /// was read, so notifications that arrive are kept on it for that session.
    async fn execute(
        &self,
        b: &mut Backend,
        plan: Plan,
        out: &mut Out<'_>,
        theirs: bool,
    ) -> Outcome {
        let mut tracker = Tracker::new(plan.acts);
        tracker.divert_notifications = theirs;
        let mut o = Outcome::default();
        if let Err(e) = b.write(&plan.out).await {
            o.broken = Some(e);
        } else {
            self.set_running(b);
        }
        while o.broken.is_none() {
            let frame = match b.read_frame().await {
                Ok(f) => f,
                Err(e) => {
                    o.broken = Some(e);
                    break;
                }
            };
            let before = out.buf.len();
            let step = tracker.on_message(&frame, &mut out.buf, &mut b.prepared);
            out.note(before);
            match step {
                Step::Continue => {}
                Step::CopyIn { extended } => {
                    let mut buf = bytes::BytesMut::new();
                    let _ = postgres_protocol::message::frontend::copy_fail(
                        "COPY FROM STDIN is not supported through pgline",
                        &mut buf,
                    );
                    if extended {
                        postgres_protocol::message::frontend::sync(&mut buf);
                    }
                    if let Err(e) = b.write(&buf).await {
                        o.broken = Some(e);
                        break;
                    }
                }
                Step::ClientDone(s) => {
                    *lock(&self.cancel) = CancelState::Idle;
                    o.status = Some(s);
                    if !tracker.has_hidden_tail() {
                        break;
                    }
                }
                Step::HiddenDone => {
                    o.fence = tracker
                        .fence
                        .map(|lsn| (lsn, tracker.fence_state.take()))
                        .filter(|_| o.status == Some(b'I'));
                    break;
                }
            }
            if o.status.is_none() {
                out.spill().await;
            }
        }
        if o.status.is_none() {
            // The client gets an error for the whole batch: what was not answered did not
            // happen, for the core and the relay alike.
            tracker.drop_unanswered();
        }
        b.keep_notifications(&std::mem::take(&mut tracker.notifications));
        o.failed = tracker.failed;
        o.snapshot = tracker.snapshot.take();
        o.snapshot_state = tracker.snapshot_state.take();
        o.checked = tracker.checked.take();
        o.described = tracker.described.take();
        o.unnamed = tracker.unnamed(plan.unnamed);
        o.unparsed = plan
            .named_parses
            .into_iter()
            .filter(|(i, _)| tracker.dropped.contains(i))
            .map(|(_, name)| name)
            .collect();
        o.unparsed.extend(plan.skipped_parses);
        // A skipped Close leaves what the session held at that point: a statement from before
        // the batch, or one this batch's Parse made if that Parse stood. The core is told the
        // places of those Closes and gives back what each took; it cannot decide it by names,
        // since a batch may parse a name, close it and parse it again.
        for (k, close) in plan.closes.into_iter().enumerate() {
            let skipped = close.act.is_none_or(|i| tracker.dropped.contains(&i));
            if skipped
                && close
                    .parsed_at
                    .is_none_or(|p| !tracker.dropped.contains(&p))
            {
                o.unclosed.push(k as u32);
                o.reopened.extend(close.took);
            }
        }
        o
    }

    /// Marks the batch as running on `b`; sends a cancel that arrived while it was queued.
    fn set_running(&self, b: &Backend) {
        let mut state = lock(&self.cancel);
        if matches!(*state, CancelState::Queued { pending: true }) {
            self.relay.spawn_cancel(b.pid, b.secret, &b.cancels);
        }
        *state = CancelState::Running {
            pid: b.pid,
            secret: b.secret,
            gate: Arc::clone(&b.cancels),
        };
    }

    fn put_back(&self, b: Backend) {
        if let Some(pool) = &self.pool {
            pool.put(b);
        }
    }

    fn discard(&self) {
        *lock(&self.cancel) = CancelState::Idle;
        if let Some(pool) = &self.pool {
            pool.discard();
        }
    }

    /// The session is over: its backend (pinned, or reserved in the pool) goes back clean, or
    /// is dropped.
    async fn release(&mut self) {
        if let Some(b) = self.auth.take() {
            tokio::spawn(b.terminate());
        }
        if let Some((b, dirty)) = self.pool.as_ref().and_then(|p| p.leave(self.id)) {
            self.sticky |= dirty;
            self.pinned = Some(b);
        }
        let Some(mut b) = self.pinned.take() else {
            return;
        };
        let mut clean = true;
        if self.status != b'I' {
            clean &= matches!(b.simple("ROLLBACK").await, Ok(Some(_)));
        }
        if clean && !self.sticky {
            // Not known to hold session state: pooled as it is if it shows the login state,
            // read by a state statement parsed again if a batch nobody vouched for ran since
            // (so that one a client replaced does not stay on the pooled backend).
            if std::mem::take(&mut b.state_suspect) {
                b.prepared.remove(state::STATE_STATEMENT);
            }
            match state::ask_state(&mut b, &self.relay.cfg.own_sql).await {
                Ok(Some(s)) => match self.in_login_state(&mut b, &s).await {
                    Ok(true) => return self.put_back(b),
                    Ok(false) => {}
                    Err(_) => clean = false,
                },
                Ok(None) => {}
                Err(_) => clean = false,
            }
        }
        // Pooled again only in the state its pool's sessions logged in to: DISCARD ALL resets
        // what SET, SET ROLE and set_config did, but not, say, a temporary schema's objects
        // whose dropping failed, or a state the login itself did not have.
        if clean && reset(&mut b, &self.relay.cfg.own_sql, &self.login_state).await {
            self.put_back(b);
        } else {
            self.discard();
            tokio::spawn(b.terminate());
        }
    }
}

/// A backend taken for a batch (see [`Session::backend`]).
struct Got {
    b: Backend,
    /// Known to be in the pool's login state.
    clean: bool,
    /// Stolen, its state not read yet: the read goes in front of the batch.
    unread: Option<Settling>,
}

/// Ends a stolen connection's state check for its owner ([`Pool::check_done`]) when dropped.
struct Settling {
    pool: Arc<Pool>,
    owner: u64,
}

impl Drop for Settling {
    fn drop(&mut self) {
        self.pool.check_done(self.owner);
    }
}

/// `DISCARD ALL` on an idle backend, then whether its state is `login_state` again.
async fn reset(b: &mut Backend, sql: &state::OwnSql, login_state: &str) -> bool {
    if !matches!(b.simple("DISCARD ALL").await, Ok(Some(_))) {
        return false;
    }
    b.prepared.clear();
    b.sequences = Sequences::Clean;
    match state::ask_state(b, sql).await {
        Ok(Some(s)) if s.fingerprint() == login_state => {
            // RESET ALL is part of DISCARD ALL: no setting is the session's now.
            b.clean_settings = Some(s.watched);
            true
        }
        _ => false,
    }
}

/// The origin's WAL position and the state, asked over `b` (once its cancels have landed, see
/// [`Backend::simple`]: one landing on the query would lose the fence). An error answer is asked
/// again once (a client's SQL-level `DEALLOCATE` or `PREPARE` may have taken the statement's
/// name); a second one is `Ok(None)`: the origin refuses the fence to this role (an
/// administrator revoked `pg_current_wal_lsn()`), and `b` is idle and fit for use. A
/// connection error is an error: `b` is not to be reused.
async fn ask_fence(
    b: &mut Backend,
    sql: &state::OwnSql,
    async_commits: bool,
) -> std::io::Result<Option<(u64, Option<OriginState>)>> {
    let (name, sql) = sql.fence(async_commits);
    for _ in 0..2 {
        let Some(cols) = state::query_row(b, name, sql).await? else {
            continue;
        };
        let lsn = cols.first().cloned().flatten();
        if let Some(lsn) = lsn.and_then(|t| crate::lsn::parse_lsn(&t)) {
            return Ok(Some((lsn, OriginState::from_columns(&cols[1..]))));
        }
    }
    Ok(None)
}

/// The origin refused the fence query twice to session `id` (an administrator revoked
/// `pg_current_wal_lsn()` from its role; also the session's own settings, a `statement_timeout`
/// too short for it): the session goes on with the origin's answers and is no longer asked for
/// a fence its cache gate would need (each batch would pay for the refused queries), so it
/// reads nothing from cache. Errs on the safe side: a cost, never a wrong answer.
fn fence_refused(no_fence: &mut bool, id: u64, user: &str) {
    if !std::mem::replace(no_fence, true) {
        tracing::warn!(
            session = id,
            user,
            "pgwire: the origin refused pgline's fence query twice (pg_current_wal_lsn() revoked from this role, or the session's own settings, such as a short statement_timeout): this session reads nothing from cache"
        );
    }
}

/// What a StartupMessage says about the session's pool.
#[derive(Debug, PartialEq, Eq)]
struct Startup {
    user: String,
    /// Defaults to the user.
    database: String,
    /// Every other parameter that sets a session default (`name=value`, sorted, joined by
    /// NUL; `application_name`, `fallback_application_name` and a UTF-8 `client_encoding`
    /// left out). The origin connections a client logs in become pooled with those defaults
    /// (and keep them across `DISCARD ALL`), so they are shared only with clients that asked
    /// for the same; empty means the server's defaults, the only ones whose answers the
    /// query-result cache keeps.
    settings: String,
}

/// Reads a StartupMessage (protocol 3.0) with the core's own parser, so that both read the
/// same packet the same way: a parameter named twice or a user/database that is not UTF-8 gives
/// `None`, as the core refuses such packets too (PostgreSQL takes the last of two values, and
/// reading another one here would put one role's connection into another role's pool). Other
/// values may be in any encoding.
fn parse_startup(m: &[u8]) -> Option<Startup> {
    // The core has applied its own size limit already.
    let limits = pgwire::Limits {
        max_startup_bytes: usize::MAX,
        ..Default::default()
    };
    let Ok((pgwire::Startup::Startup(msg), _)) = pgwire::parse_startup(m, &limits) else {
        return None;
    };
    if msg.minor != 0 {
        return None;
    }
    let text = |v: &[u8]| {
        std::str::from_utf8(v)
            .ok()
            .filter(|s| !s.is_empty())
            .map(String::from)
    };
    let user = text(msg.user())?;
    let database = msg
        .get(b"database")
        .and_then(text)
        .unwrap_or_else(|| user.clone());
    let mut settings: Vec<String> = Vec::new();
    for (k, v) in msg.params() {
        match k {
            b"user" | b"database" | b"application_name" | b"fallback_application_name" => {}
            b"replication" => return None,
            b"client_encoding"
                if [&b"UTF8"[..], b"UTF-8", b"UNICODE"]
                    .iter()
                    .any(|e| v.eq_ignore_ascii_case(e)) => {}
            _ => settings.push(format!(
                "{}={}",
                String::from_utf8_lossy(k),
                String::from_utf8_lossy(v)
            )),
        }
    }
    settings.sort();
    Some(Startup {
        user,
        database,
        settings: settings.join("\0"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn startup_parameters() {
        let mut buf = bytes::BytesMut::new();
        postgres_protocol::message::frontend::startup_message(
            [("user", "alice"), ("application_name", "x")],
            &mut buf,
        )
        .unwrap();
        assert_eq!(
            parse_startup(&buf),
            Some(Startup {
                user: "alice".into(),
                database: "alice".into(),
                settings: String::new()
            })
        );
        let mut buf = bytes::BytesMut::new();
        postgres_protocol::message::frontend::startup_message(
            [("user", "a"), ("database", "d"), ("replication", "true")],
            &mut buf,
        )
        .unwrap();
        assert_eq!(parse_startup(&buf), None);
        assert_eq!(parse_startup(b"\0\0\0\x08\0\x04\xd2\x16"), None);
        let packet = |body: &[u8]| {
            let mut m = ((8 + body.len()) as i32).to_be_bytes().to_vec();
            m.extend_from_slice(&196_608i32.to_be_bytes());
            m.extend_from_slice(body);
            m
        };
        // A non-UTF-8 parameter elsewhere does not end the list early...
        assert_eq!(
            parse_startup(&packet(
                b"user\0app\0_pq_.\xff\0x\0database\0d\0client_encoding\0utf8\0\0"
            )),
            Some(Startup {
                user: "app".into(),
                database: "d".into(),
                settings: "_pq_.\u{fffd}=x".into()
            })
        );
        // Settings are pooled apart, in a canonical order.
        let a = parse_startup(&packet(
            b"user\0u\0TimeZone\0Asia/Tokyo\0DateStyle\0SQL\0\0",
        ));
        let b = parse_startup(&packet(
            b"user\0u\0DateStyle\0SQL\0TimeZone\0Asia/Tokyo\0\0",
        ));
        assert_eq!(a, b);
        assert_eq!(a.unwrap().settings, "DateStyle=SQL\0TimeZone=Asia/Tokyo");
        // ...and a second user (PostgreSQL would log that one in) is refused.
        assert_eq!(
            parse_startup(&packet(b"user\0app\0_pq_.\xff\0x\0user\0mallory\0\0")),
            None
        );
    }
}
