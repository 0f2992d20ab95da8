//! One client session of the relay: startup and authentication relay, batches on pooled
//! backends, release on close.
//!
//! Startup: the client's StartupMessage goes as it is to a new origin connection; the origin's
//! authentication requests go to the client (`PgReplyEnd::Auth` while a password message is
//! due), the client's `p` messages to the origin, until ReadyForQuery. The origin's
//! BackendKeyData is replaced by pgline's own; the connection then joins the session's pool.
//!
//! Batches: the session's pinned backend, or one from its pool. The reply streams back in
//! chunks; the batch's last ReadyForQuery decides: `I` returns the backend to the pool unless the
//! session left state behind (`plan::leaves_session_state`, pinned for good), `T`/`E` pin it.
//! When the batch ends idle, `fence_lsn` is the origin's `pg_current_wal_lsn()` after it.
//!
//! A batch the core marked cacheable that runs with the session idle takes a result lease, runs
//! behind pgline's snapshot query on the same backend, and, if its one statement succeeded and
//! its answer is at most [`RESULT_MAX_BYTES`], hands (key, answer, snapshot, lease) to the
//! writer, which installs it only if still current (`writer/results.rs`).
//!
//! A backend that fails mid-batch is dropped; the client gets an ErrorResponse (08006) and
//! ReadyForQuery `I` (its transaction, if any, is gone with the backend).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use pgline_dataplane::plane::{
    PgReply, PgReplyEnd, PgRequest, PgRequestKind, ResultFill, RESULT_MAX_BYTES,
};
use tokio::sync::mpsc;

use super::backend::{compose_error, compose_message, compose_ready, Backend, Opener};
use super::plan::{self, Plan, Step, Stmt, Tracker};
use super::pool::{Pool, PoolError};
use super::results;
use super::{lock, CancelState, RelayState, CHUNK, POOL_WAIT};

/// How a batch went on its backend.
#[derive(Default)]
struct Outcome {
    /// The status of the client's last ReadyForQuery, once it went out.
    status: Option<u8>,
    /// The pipelined fence's LSN (only when the batch ended idle).
    fence: Option<u64>,
    /// An ErrorResponse went to the client.
    failed: bool,
    /// The connection failed; it must be dropped.
    broken: Option<std::io::Error>,
    /// What the snapshot query before a cacheable statement returned.
    snapshot: Option<String>,
    /// The RowDescription of the Describe pgline added.
    described: Option<Vec<u8>>,
}

/// The reply being streamed for one request.
struct Out<'a> {
    relay: &'a RelayState,
    core: usize,
    conn: u64,
    seq: u64,
    buf: Vec<u8>,
    /// Bytes sent so far.
    sent: usize,
    /// A copy of what the client is sent, for the result cache (`None`: not kept, or too big).
    capture: Option<Vec<u8>>,
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
        self.sent += bytes.len();
        let reply = PgReply {
            conn: self.conn,
            seq: self.seq,
            bytes,
            end,
            fence_lsn,
        };
        self.relay.push_reply(self.core, reply).await;
    }
}

fn out_for<'a>(relay: &'a RelayState, req: &PgRequest) -> Out<'a> {
    Out {
        relay,
        core: req.core,
        conn: req.conn,
        seq: req.seq,
        buf: Vec::new(),
        sent: 0,
        capture: None,
    }
}

/// Answers a request of a session the relay does not know (it ended) with a fatal error.
pub(super) async fn refuse_unknown(relay: &RelayState, req: PgRequest) {
    let mut out = out_for(relay, &req);
    out.buf = compose_error("FATAL", "08006", "pgline: session closed");
    out.finish(PgReplyEnd::Close, 0).await;
}

/// Refuses a startup past `max_sessions`.
pub(super) async fn refuse_full(relay: &RelayState, req: PgRequest) {
    let mut out = out_for(relay, &req);
    out.buf = compose_error("FATAL", "53300", "sorry, too many clients already");
    out.finish(PgReplyEnd::Close, 0).await;
}

pub(super) struct Session {
    relay: Arc<RelayState>,
    id: u64,
    key: (i32, i32),
    cancel: Arc<Mutex<CancelState>>,
    pool: Option<Arc<Pool>>,
    /// The origin connection being authenticated.
    auth: Option<Backend>,
    /// The client's StartupMessage.
    startup: Vec<u8>,
    user: String,
    stmts: HashMap<String, Stmt>,
    pinned: Option<Backend>,
    /// Left session state behind: keeps its backend until the end.
    sticky: bool,
    status: u8,
    /// The backend of the client's open transaction died after its reply went out.
    lost: bool,
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
            auth: None,
            startup: Vec::new(),
            user: String::new(),
            stmts: HashMap::new(),
            pinned: None,
            sticky: false,
            status: b'I',
            lost: false,
            closed: false,
        }
    }

    pub(super) async fn run(mut self, mut rx: mpsc::UnboundedReceiver<PgRequest>) {
        while let Some(req) = rx.recv().await {
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

    async fn fatal(&mut self, req: &PgRequest, code: &str, message: &str) {
        let mut out = out_for(&self.relay, req);
        out.buf = compose_error("FATAL", code, message);
        out.finish(PgReplyEnd::Close, 0).await;
        self.closed = true;
    }

    async fn startup(&mut self, req: PgRequest) {
        let Some((user, database)) = parse_startup(&req.messages) else {
            return self.fatal(&req, "08P01", "invalid startup packet").await;
        };
        self.pool = Some(self.relay.pool(&user, &database));
        self.startup.clone_from(&req.messages);
        self.user = user;
        let cfg = &self.relay.cfg;
        match Backend::connect(&cfg.origin, cfg.connect_timeout).await {
            Ok(mut b) => match b.write(&req.messages).await {
                Ok(()) => self.relay_auth(req, b).await,
                Err(e) => self.origin_gone(&req, &e).await,
            },
            Err(e) => self.origin_gone(&req, &e).await,
        }
    }

    async fn origin_gone(&mut self, req: &PgRequest, e: &std::io::Error) {
        let msg = format!("pgline: cannot reach the origin: {e}");
        self.fatal(req, "08006", &msg).await;
    }

    async fn auth(&mut self, req: PgRequest) {
        let Some(mut b) = self.auth.take() else {
            return self
                .fatal(&req, "08P01", "unexpected password message")
                .await;
        };
        match b.write(&req.messages).await {
            Ok(()) => self.relay_auth(req, b).await,
            Err(e) => self.origin_gone(&req, &e).await,
        }
    }

    /// Relays the origin's side of the exchange until the client must answer or it is over.
    async fn relay_auth(&mut self, req: PgRequest, mut b: Backend) {
        let mut out = out_for(&self.relay, &req);
        loop {
            let frame = match b.read_frame().await {
                Ok(f) => f,
                Err(e) => return self.origin_gone(&req, &e).await,
            };
            match frame[0] {
                b'R' => {
                    out.buf.extend_from_slice(&frame);
                    let code = frame
                        .get(5..9)
                        .map(|c| i32::from_be_bytes([c[0], c[1], c[2], c[3]]));
                    match code {
                        Some(0 | 12) => {}
                        Some(3 | 5 | 10 | 11) => {
                            self.auth = Some(b);
                            return out.finish(PgReplyEnd::Auth, 0).await;
                        }
                        _ => {
                            out.buf = compose_error(
                                "FATAL",
                                "28000",
                                "pgline: authentication method not supported",
                            );
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
                    b.pid = i32::from_be_bytes([frame[5], frame[6], frame[7], frame[8]]);
                    b.secret = i32::from_be_bytes([frame[9], frame[10], frame[11], frame[12]]);
                    let mut body = self.key.0.to_be_bytes().to_vec();
                    body.extend_from_slice(&self.key.1.to_be_bytes());
                    out.buf.extend_from_slice(&compose_message(b'K', &body));
                }
                b'Z' => {
                    out.buf.extend_from_slice(&frame);
                    let pool = self.pool.as_ref().expect("set at startup");
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
                    return out.finish(PgReplyEnd::Ready(b'I'), 0).await;
                }
                _ => out.buf.extend_from_slice(&frame),
            }
        }
    }

    /// The backend for the next batch: the pinned one or one from the pool.
    async fn backend(&mut self) -> Result<Backend, (&'static str, String)> {
        if let Some(b) = self.pinned.take() {
            return Ok(b);
        }
        let Some(pool) = self.pool.clone() else {
            return Err(("08P01", "pgline: batch before startup".into()));
        };
        pool.take(POOL_WAIT).await.map_err(|e| {
            let code = match e {
                PoolError::Timeout => "53300",
                PoolError::Empty | PoolError::Open => "08006",
            };
            (code, format!("pgline: {e}"))
        })
    }

    async fn batch(&mut self, mut req: PgRequest) {
        let cache = req.cache.take();
        if std::mem::take(&mut self.lost) {
            let mut out = out_for(&self.relay, &req);
            out.buf = compose_error(
                "ERROR",
                "08006",
                "pgline: the origin connection of this transaction was lost; it is rolled back",
            );
            out.buf.extend_from_slice(&compose_ready(b'I'));
            return out.finish(PgReplyEnd::Ready(b'I'), 0).await;
        }
        let mut b = match self.backend().await {
            Ok(b) => b,
            Err(("53300", msg)) => {
                // Busy, not broken: the client may try again.
                let mut out = out_for(&self.relay, &req);
                out.buf = compose_error("ERROR", "53300", &msg);
                out.buf.extend_from_slice(&compose_ready(self.status));
                return out.finish(PgReplyEnd::Ready(self.status), 0).await;
            }
            Err((code, msg)) => return self.fatal(&req, code, &msg).await,
        };
        let idle_before = self.status == b'I' && !self.sticky;
        // A cacheable statement's answer needs its RowDescription (see `results`).
        let added = cache
            .as_ref()
            .filter(|_| idle_before)
            .and_then(|_| results::with_describe(&req.messages));
        let messages = added.as_deref().unwrap_or(&req.messages);
        let mut plan = match plan::plan_batch(messages, &mut self.stmts, &mut b.prepared) {
            Ok(p) => p,
            Err(e) => {
                self.put_back(b);
                return self.fatal(&req, "08P01", &format!("pgline: {e}")).await;
            }
        };
        // Behind a COPY the fence query would land in the copy stream: asked afterwards then.
        let copy = plan
            .sql
            .iter()
            .any(|s| s.to_ascii_lowercase().contains("copy"));
        if idle_before && !copy {
            plan::add_fence(&mut plan);
        }
        if added.is_some() {
            plan::hide_added_describe(&mut plan);
        }
        // The lease is taken before the statement (and its snapshot) reaches the origin.
        let cache = cache.filter(|_| idle_before && !copy).map(|key| {
            plan::add_snapshot(&mut plan);
            let lease = self.relay.shared.results.lease(&key.tables);
            (key, lease)
        });
        let sql = std::mem::take(&mut plan.sql);
        let relay = self.relay.clone();
        let mut out = out_for(&relay, &req);
        if cache.is_some() {
            out.capture = Some(Vec::new());
        }
        let started = std::time::Instant::now();
        let o = self.execute(&mut b, plan, &mut out).await;
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
                out.buf.extend_from_slice(&compose_error(
                    "ERROR",
                    "08006",
                    "pgline: the origin connection failed during the request",
                ));
            }
            out.buf.extend_from_slice(&compose_ready(b'I'));
            return out.finish(PgReplyEnd::Ready(b'I'), 0).await;
        };
        if let (Some((key, lease)), b'I', false, None) = (cache, status, o.failed, &o.broken) {
            let answer = out
                .capture
                .take()
                .and_then(|c| results::answer_of(&c, o.described.as_deref()));
            if let (Some(bytes), Some(snapshot)) = (answer, o.snapshot.clone()) {
                relay.shared.results.push(ResultFill {
                    key,
                    bytes,
                    snapshot,
                    lease,
                });
                relay.shared.control_waker.wake();
            }
        }
        let fence = self.settle(b, &o, status, &sql).await;
        out.finish(PgReplyEnd::Ready(status), fence.unwrap_or(0))
            .await;
    }

    /// After the client's reply: where the backend goes, the session's state, the fence.
    async fn settle(
        &mut self,
        mut b: Backend,
        o: &Outcome,
        status: u8,
        sql: &[String],
    ) -> Option<u64> {
        self.status = status;
        let mut fence = o.fence;
        if o.broken.is_some() {
            // Only the hidden fence was lost: the client's reply is whole.
            self.discard();
            self.sticky = false;
            if status != b'I' {
                // The transaction died with the backend: the next batch tells the client.
                self.status = b'I';
                self.lost = true;
            }
        } else {
            if status == b'I' && fence.is_none() {
                match b.simple(plan::FENCE_SQL).await {
                    Ok(v) => fence = v.flatten().and_then(|t| crate::wal::conn::parse_lsn(&t)),
                    Err(_) => {
                        // The connection died after the reply: drop it; no fence this time.
                        self.discard();
                        self.sticky = false;
                        return None;
                    }
                }
            }
            if sql.iter().any(|s| plan::clears_prepared(s)) {
                b.prepared.clear();
            }
            self.sticky |= sql.iter().any(|s| plan::leaves_session_state(s));
            if status == b'I' && !self.sticky {
                self.put_back(b);
            } else {
                self.pinned = Some(b);
            }
        }
        fence
    }

    /// Sends the plan and streams the replies (see [`Outcome`]).
    async fn execute(&self, b: &mut Backend, plan: Plan, out: &mut Out<'_>) -> Outcome {
        let mut tracker = Tracker::new(plan.acts);
        let mut o = Outcome::default();
        if let Err(e) = b.write(&plan.out).await {
            o.broken = Some(e);
            return o;
        }
        self.set_running(b);
        loop {
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
                Step::CopyIn => {
                    let mut buf = bytes::BytesMut::new();
                    let _ = postgres_protocol::message::frontend::copy_fail(
                        "COPY FROM STDIN is not supported through pgline",
                        &mut buf,
                    );
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
                    o.fence = tracker.fence.filter(|_| o.status == Some(b'I'));
                    break;
                }
            }
            if o.status.is_none() {
                out.spill().await;
            }
        }
        o.failed = tracker.failed;
        o.snapshot = tracker.snapshot.take();
        o.described = tracker.described.take();
        o
    }

    /// Marks the batch as running on `b`; sends a cancel that arrived while it was queued.
    fn set_running(&self, b: &Backend) {
        let mut state = lock(&self.cancel);
        if *state == (CancelState::Queued { pending: true }) {
            self.relay.spawn_cancel(b.pid, b.secret);
        }
        *state = CancelState::Running {
            pid: b.pid,
            secret: b.secret,
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

    /// The session is over: its backend goes back clean, or is dropped.
    async fn release(&mut self) {
        if let Some(b) = self.auth.take() {
            tokio::spawn(b.terminate());
        }
        let Some(mut b) = self.pinned.take() else {
            return;
        };
        let mut clean = true;
        if self.status != b'I' {
            clean &= matches!(b.simple("ROLLBACK").await, Ok(Some(_)));
        }
        if clean && self.sticky {
            clean &= matches!(b.simple("DISCARD ALL").await, Ok(Some(_)));
            b.prepared.clear();
        }
        if clean {
            self.put_back(b);
        } else {
            self.discard();
            tokio::spawn(b.terminate());
        }
    }
}

/// (user, database) of a StartupMessage (protocol 3.0); database defaults to the user.
fn parse_startup(m: &[u8]) -> Option<(String, String)> {
    if m.len() < 8 || m[4..8] != 196_608i32.to_be_bytes() {
        return None;
    }
    let mut rest = &m[8..];
    let (mut user, mut database) = (None, None);
    while let Ok((k, tail)) = plan::cstr(rest) {
        if k.is_empty() {
            break;
        }
        let (v, tail) = plan::cstr(tail).ok()?;
        match k {
            "user" => user = Some(v.to_owned()),
            "database" => database = Some(v.to_owned()),
            "replication" => return None,
            _ => {}
        }
        rest = tail;
    }
    let user = user.filter(|u| !u.is_empty())?;
    let database = database
        .filter(|d| !d.is_empty())
        .unwrap_or_else(|| user.clone());
    Some((user, database))
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
            Some(("alice".to_string(), "alice".to_string()))
        );
        let mut buf = bytes::BytesMut::new();
        postgres_protocol::message::frontend::startup_message(
            [("user", "a"), ("database", "d"), ("replication", "true")],
            &mut buf,
        )
        .unwrap();
        assert_eq!(parse_startup(&buf), None);
        assert_eq!(parse_startup(b"\0\0\0\x08\0\x04\xd2\x16"), None);
    }
}
