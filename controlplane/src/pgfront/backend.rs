//! One origin connection of the relay: raw protocol 3.0 over the origin connector's
//! [`OriginConn`] (connection, framing and pgline's own login live in [`crate::origin`]).
//!
//! Invariants: a frame larger than [`crate::origin::MAX_FRAME`] is a protocol error;
//! `prepared` holds the statement names (`pgl_...`) this connection has (see `plan`); a
//! connection in authentication holds a [`StartupSlot`] (see `admit`), and reads from it end
//! at the slot's deadline.
//!
//! Thread model: owned by one session task at a time (or idle in its pool).

use std::collections::HashSet;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use postgres_protocol::message::frontend;

use super::admit::StartupSlot;
pub use crate::origin::OriginAddr;
use crate::origin::{self, ConnectError, Credentials, LoginError, OriginConn, Settings};

/// One row of text columns (`None`: NULL).
pub type Row = Vec<Option<String>>;

/// An origin connection.
pub struct Backend {
    conn: OriginConn,
    /// The origin's own BackendKeyData (for cancel).
    pub pid: i32,
    pub secret: i32,
    /// Backend statement names this connection has prepared.
    pub prepared: HashSet<String>,
    /// The connection ran a batch nobody vouched for since pgline last parsed its fence
    /// statement here: the name may hold a client's statement (see `state::FENCE_STATEMENT`).
    pub fence_suspect: bool,
    /// The same for the state statement, until a session's end parses it again.
    pub state_suspect: bool,
    /// The [`WATCHED`](super::state::WATCHED) settings' values last known not to be its
    /// session's own (`state::settings_clean`); `None` until known.
    pub clean_settings: Option<String>,
    /// Whose sequence state (`currval`, `lastval`) this connection may hold: no state read
    /// can see it (see [`Sequences`]).
    pub sequences: Sequences,
    /// Cancels sent at this connection that may not have reached it yet.
    pub cancels: Arc<CancelGate>,
    /// Held while the connection is in authentication (see `admit`).
    slot: Option<StartupSlot>,
    /// The index of its host in `origin.url` (see `origin::Primary`).
    pub host: usize,
    /// `in_hot_standby` and `default_transaction_read_only` as the login reported them.
    pub session_params: Vec<(String, String)>,
    /// The origin asked for SASL: the client's next message is its SASLInitialResponse.
    pub awaiting_sasl_initial: bool,
    /// NotificationResponses (LISTEN) that arrived while pgline ran its own statements here
    /// (the fence, a state read, closing statements), at most [`NOTIFICATIONS_MAX`] bytes: the
    /// session holding the connection gets them with its reply (`session`); a connection
    /// taken in the login state listens to nothing, and they are dropped.
    pub notifications: Vec<u8>,
    /// Some were dropped past the bound (warned once).
    notifications_dropped: bool,
}

/// Whose sequence values a connection may hold. Any batch not marked state-free may have
/// called `nextval` (a column default, a trigger, a function), and nothing a query can read
/// says so; a session's first batch on a connection holding another session's runs
/// `DISCARD SEQUENCES` first (`plan::add_discard_sequences`), so it never reads another
/// session's value (PostgreSQL's answer for a session that never used the sequence is SQLSTATE
/// 55000), and the pool hands a session back the idle connection it last used when it holds
/// only that session's values (`Pool::try_take`), which needs no discard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sequences {
    /// None used since the connection's login or its last reset.
    Clean,
    /// Possibly this session's.
    Of(u64),
    /// Possibly several sessions'.
    Mixed,
}

impl Sequences {
    /// After a batch of `session` that may have used a sequence.
    pub fn used_by(self, session: u64) -> Sequences {
        match self {
            Sequences::Clean => Sequences::Of(session),
            Sequences::Of(s) if s == session => self,
            _ => Sequences::Mixed,
        }
    }

    /// Whether `session` could read another session's values here.
    pub fn foreign_to(self, session: u64) -> bool {
        match self {
            Sequences::Clean => false,
            Sequences::Of(s) => s != session,
            Sequences::Mixed => true,
        }
    }
}

/// Bytes of NotificationResponses a connection keeps for its session (a payload is at most
/// 8,000 bytes); later ones are dropped, with a warning.
pub const NOTIFICATIONS_MAX: usize = 64 * 1024;

/// The cancels sent at one origin connection that may not have landed yet.
///
/// A CancelRequest travels on a connection of its own and takes effect whenever the origin
/// gets to it: one that lands after the connection has moved on to another session's statement
/// cancels that statement instead. So a connection goes back to its pool only once every cancel
/// sent at it has landed (the origin closes the cancel connection after it has signalled the
/// backend, and a signal that finds the backend idle is ignored), and one whose cancel may
/// still be on its way is closed instead of pooled.
#[derive(Debug, Default)]
pub struct CancelGate {
    /// Where the connection's cancels go (its host).
    pub origin: OriginAddr,
    in_flight: AtomicUsize,
    /// A cancel's fate is unknown (it failed or timed out): it may still land at any time.
    unknown: AtomicBool,
    landed: tokio::sync::Notify,
}

impl CancelGate {
    /// A cancel is on its way.
    pub fn sent(&self) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
    }

    /// A cancel has landed (`known`), or its fate is unknown.
    pub fn done(&self, known: bool) {
        if !known {
            self.unknown.store(true, Ordering::Release);
        }
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.landed.notify_waiters();
    }

    /// Whether no cancel is on its way and none ever went astray.
    pub fn clear(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) == 0 && !self.unknown.load(Ordering::Acquire)
    }

    /// Waits until no cancel is on its way (each is bounded by the connect timeout); whether
    /// the connection may be reused.
    pub async fn settled(&self) -> bool {
        loop {
            let landed = self.landed.notified();
            tokio::pin!(landed);
            landed.as_mut().enable();
            if self.in_flight.load(Ordering::Acquire) == 0 {
                return !self.unknown.load(Ordering::Acquire);
            }
            landed.await;
        }
    }
}

impl Backend {
    /// Opens a connection to the origin (no startup yet), on the host that last proved
    /// read-write first (see `origin::open`).
    pub async fn connect(origin: &Settings, timeout: Duration) -> io::Result<Backend> {
        let (conn, host) = origin::open(origin, Some(timeout), 16 * 1024)
            .await
            .map_err(connect_error)?;
        Ok(Backend::new(conn, origin, host))
    }

    fn new(conn: OriginConn, origin: &Settings, host: usize) -> Backend {
        Backend {
            conn,
            pid: 0,
            secret: 0,
            prepared: HashSet::new(),
            fence_suspect: false,
            state_suspect: false,
            clean_settings: None,
            sequences: Sequences::Clean,
            cancels: Arc::new(CancelGate {
                origin: origin.addrs().get(host).cloned().unwrap_or_default(),
                ..CancelGate::default()
            }),
            slot: None,
            host,
            session_params: Vec::new(),
            awaiting_sasl_initial: false,
            notifications: Vec::new(),
            notifications_dropped: false,
        }
    }

    /// Keeps NotificationResponses (whole frames) for the session that holds the connection.
    pub fn keep_notifications(&mut self, frames: &[u8]) {
        if !keep_bounded(&mut self.notifications, frames, NOTIFICATIONS_MAX)
            && !std::mem::replace(&mut self.notifications_dropped, true)
        {
            tracing::warn!(
                pid = self.pid,
                "pgwire: notifications that arrived during pgline's own statements were dropped (more than {NOTIFICATIONS_MAX} bytes waiting; warned once per connection)"
            );
        }
    }

    /// Notes a ParameterStatus message (whole frame) of the login, for the session attribute
    /// check (`origin::session_fits`).
    pub fn note_parameter(&mut self, frame: &[u8]) {
        let mut parts = frame.get(5..).unwrap_or(&[]).split(|&b| b == 0);
        let name = parts.next().unwrap_or(&[]);
        if name == b"in_hot_standby" || name == b"default_transaction_read_only" {
            let value = parts.next().unwrap_or(&[]);
            self.session_params.push((
                String::from_utf8_lossy(name).into_owned(),
                String::from_utf8_lossy(value).into_owned(),
            ));
        }
    }

    /// The connection is in authentication under `slot`: reads end at its deadline.
    pub fn admit(&mut self, slot: StartupSlot) -> &mut Backend {
        self.slot = Some(slot);
        self
    }

    /// The authentication ran out of time while the client had to answer: counted, and the
    /// connection dropped (closed without a word: the origin waits for a password message).
    pub fn expire_auth(self) -> io::Error {
        match &self.slot {
            Some(s) => s.expired(),
            None => io::ErrorKind::TimedOut.into(),
        }
    }

    /// The connection logged in (or leaves authentication): its slot is given back.
    pub fn logged_in(&mut self) {
        self.slot = None;
    }

    /// When the authentication of this connection must be over (`None`: not in one).
    pub fn auth_deadline(&self) -> Option<tokio::time::Instant> {
        self.slot.as_ref().map(|s| s.deadline)
    }

    /// Whether this idle connection can no longer run a batch: the origin closed it (EOF,
    /// reset), or sent something nobody asked for (the `FATAL 57P01` of
    /// `pg_terminate_backend` or of a shutdown, a notice, a notification). A non-blocking
    /// look at the socket itself (see `OriginConn::unusable`, which also handles TLS), so that
    /// input the runtime has not been told about yet is seen too.
    pub fn unusable(&mut self) -> bool {
        self.conn.unusable()
    }

    /// Whether the connection to the origin is encrypted.
    pub fn is_tls(&self) -> bool {
        self.conn.is_tls()
    }

    pub async fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.conn.write_all(bytes).await
    }

    /// One whole backend message, tag and length word included; in authentication, an
    /// error once the slot's deadline passed (see `admit`).
    pub async fn read_frame(&mut self) -> io::Result<Bytes> {
        let Some(deadline) = self.auth_deadline() else {
            return self.read_frame_now().await;
        };
        match tokio::time::timeout_at(deadline, self.read_frame_now()).await {
            Ok(r) => r,
            Err(_) => Err(self
                .slot
                .as_ref()
                .map_or_else(|| io::ErrorKind::TimedOut.into(), StartupSlot::expired)),
        }
    }

    async fn read_frame_now(&mut self) -> io::Result<Bytes> {
        Ok(self.conn.read_frame().await?)
    }

    /// Runs pgline's own simple query; `Ok(Some(first column of the first row))` on success,
    /// `Ok(None)` when the origin answered with an error (the connection is still usable).
    ///
    /// First waits for the cancels sent at the connection to land, so that none lands on
    /// pgline's own query (the fence, the clean-up); a cancel gone astray is an error, the
    /// connection is not to be reused.
    pub async fn simple(&mut self, sql: &str) -> io::Result<Option<Option<String>>> {
        let row = self.query_row(sql).await?;
        Ok(row.map(|r| r.and_then(|cols| cols.into_iter().next().flatten())))
    }

    /// [`Backend::simple`] returning the whole first row (`Some(None)`: no row).
    pub async fn query_row(&mut self, sql: &str) -> io::Result<Option<Option<Row>>> {
        if !self.cancels.settled().await {
            return Err(io::Error::other(
                "a cancel sent at the connection went astray",
            ));
        }
        let mut buf = BytesMut::new();
        frontend::query(sql, &mut buf)?;
        self.write(&buf).await?;
        let mut first = None;
        let mut failed = false;
        loop {
            let f = self.read_frame().await?;
            match f[0] {
                b'D' if first.is_none() => first = Some(row_texts(&f)),
                b'E' => failed = true,
                b'G' => {
                    let mut buf = BytesMut::new();
                    frontend::copy_fail("pgline: no COPY data", &mut buf)?;
                    self.write(&buf).await?;
                }
                b'Z' => return Ok((!failed).then(|| first.flatten())),
                b'A' => self.keep_notifications(&f),
                _ => {}
            }
        }
    }

    /// After a batch that may have run any SQL (see `state::FENCE_STATEMENT`): the fence
    /// statement's answers count only for the session that ran it until it is parsed again,
    /// and the state statement is parsed again before the backend is pooled at a session's end.
    pub fn distrust_own_statements(&mut self) {
        self.fence_suspect = true;
        self.state_suspect = true;
    }

    /// Before pgline's fence statement `name` runs: whether this run parses it (`Close`, then
    /// `Parse`), which makes its answers trustworthy again.
    pub fn fence_parsed_fresh(&self, name: &str) -> bool {
        !self.prepared.contains(name)
    }

    /// Before a suspect fence statement's answer would count for more than the session whose
    /// batch made it suspect (another session's gate, a stored answer, the pool): both fence
    /// statements are parsed again at their next run.
    pub fn reparse_suspect_fence(&mut self) {
        if self.fence_suspect {
            self.forget_fences();
        }
    }

    /// After the fence statement `name` was parsed in a run that verified the backend: the
    /// fence is trusted again, and the other fence statement, which that parse did not renew,
    /// is parsed again at its next run.
    pub fn trust_fence(&mut self, name: &str) {
        self.fence_suspect = false;
        for other in super::state::FENCE_STATEMENTS {
            if other != name {
                self.prepared.remove(other);
            }
        }
    }

    /// Both fence statements are parsed again at their next run.
    pub fn forget_fences(&mut self) {
        for name in super::state::FENCE_STATEMENTS {
            self.prepared.remove(name);
        }
    }

    /// Runs pgline's own statement `name` (text `sql`, no parameters, one row) as a prepared
    /// statement: parsed on this connection the first time (booked in `prepared`), then
    /// Bind/Execute only, which costs the origin no parse and plan. As [`Backend::query_row`]
    /// otherwise. When the prepared form fails (a client's `DEALLOCATE` or `PREPARE` took the
    /// name), the name is forgotten and `sql` runs as a simple query instead.
    pub async fn query_prepared(
        &mut self,
        name: &str,
        sql: &str,
    ) -> io::Result<Option<Option<Row>>> {
        if !self.cancels.settled().await {
            return Err(io::Error::other(
                "a cancel sent at the connection went astray",
            ));
        }
        let mut buf = BytesMut::new();
        let parsed = self.prepared.insert(name.to_owned());
        compose_prepared(name, sql, parsed, &mut buf)?;
        self.write(&buf).await?;
        let mut first = None;
        let mut failed = false;
        loop {
            let f = self.read_frame().await?;
            match f[0] {
                b'D' if first.is_none() => first = Some(row_texts(&f)),
                b'E' => failed = true,
                b'Z' => break,
                b'A' => self.keep_notifications(&f),
                _ => {}
            }
        }
        if !failed {
            return Ok(Some(first.flatten()));
        }
        self.prepared.remove(name);
        self.query_row(sql).await
    }

    /// Closes the prepared statements of `prepared` that clients' Parses made (all but
    /// pgline's own fence and state statements) in one `Close ... Sync` round trip, once the
    /// cancels sent at the connection have landed. Closing a statement the backend does not
    /// have is no error, so an error answer is not expected; if one comes, the statements
    /// are not known, and the connection is not to be reused.
    pub async fn close_statements(&mut self) -> io::Result<usize> {
        if !self.cancels.settled().await {
            return Err(io::Error::other(
                "a cancel sent at the connection went astray",
            ));
        }
        let own = super::state::OWN_STATEMENTS;
        let mut buf = BytesMut::new();
        let mut closed = 0;
        for name in self.prepared.iter().filter(|n| !own.contains(&n.as_str())) {
            frontend::close(b'S', name, &mut buf)?;
            closed += 1;
        }
        frontend::sync(&mut buf);
        self.write(&buf).await?;
        let mut failed = false;
        loop {
            let f = self.read_frame().await?;
            match f[0] {
                b'E' => failed = true,
                b'Z' if failed => {
                    return Err(io::Error::other("closing prepared statements failed"))
                }
                b'Z' => break,
                b'A' => self.keep_notifications(&f),
                _ => {}
            }
        }
        self.prepared.retain(|n| own.contains(&n.as_str()));
        Ok(closed)
    }

    /// Says goodbye (best effort).
    pub async fn terminate(mut self) {
        let mut buf = BytesMut::new();
        frontend::terminate(&mut buf);
        let _ = self.write(&buf).await;
    }
}

/// `[Close(name) Parse(name, sql)] Bind(unnamed portal, name) Execute Sync`: one run of
/// pgline's own prepared statement, text results. Parsed, it first closes whatever holds the
/// name (a client's SQL-level `PREPARE`, see `state::FENCE_STATEMENT`; closing a name nothing
/// holds is no error). The unnamed portal is free: pgline runs its statements only while the
/// connection is idle, when no portal outlives the client's Sync.
pub fn compose_prepared(name: &str, sql: &str, parse: bool, buf: &mut BytesMut) -> io::Result<()> {
    if parse {
        frontend::close(b'S', name, buf)?;
        frontend::parse(name, sql, [], buf)?;
    }
    // Bind: unnamed portal, no parameter formats, no parameters, text results.
    buf.extend_from_slice(b"B");
    buf.extend_from_slice(&(4 + 1 + name.len() as u32 + 1 + 6).to_be_bytes());
    buf.extend_from_slice(b"\0");
    buf.extend_from_slice(name.as_bytes());
    buf.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0]);
    frontend::execute("", 0, buf)?;
    frontend::sync(buf);
    Ok(())
}

/// What pgline needs to open origin connections for a pool by itself: the startup message of
/// the pool's first client and the password of `origin.url` (only for that URL's user).
#[derive(Clone)]
pub struct Opener {
    pub origin: Settings,
    pub timeout: Duration,
    pub user: String,
    pub password: Vec<u8>,
    pub startup: Vec<u8>,
}

impl Backend {
    /// Opens a connection and logs it in with `o`'s startup message and password (see
    /// [`origin::login`]), up to ReadyForQuery.
    pub async fn open(o: &Opener) -> io::Result<Backend> {
        let who = Credentials {
            user: &o.user,
            password: Some(&o.password),
        };
        let (conn, logged, host) =
            origin::connect(&o.origin, Some(o.timeout), &o.startup, who, 16 * 1024)
                .await
                .map_err(connect_error)?;
        let mut b = Backend::new(conn, &o.origin, host);
        b.pid = logged.pid;
        b.secret = logged.secret;
        Ok(b)
    }
}

/// The FATAL a client gets when it asks for SCRAM channel binding through the relay while
/// the origin leg is TLS (docs/pgwire.md, "Channel binding").
pub const CHANNEL_BINDING_REFUSED: &str = "pgline: SCRAM channel binding cannot pass through \
     pgline (the client would bind to pgline's certificate, the origin checks its own): \
     connect with channel_binding=disable";

/// `SCRAM-SHA-256-PLUS`, the channel-binding SASL mechanism.
const SCRAM_PLUS: &[u8] = b"SCRAM-SHA-256-PLUS";

/// Appends the AuthenticationSASL message `frame` (whole, tag included) to `out` without the
/// `SCRAM-SHA-256-PLUS` mechanism: a relayed client cannot bind to the origin's channel.
pub fn compose_sasl_without_plus(frame: &[u8], out: &mut Vec<u8>) {
    let mechanisms = frame.get(9..).unwrap_or(&[]);
    let kept: Vec<&[u8]> = mechanisms
        .split(|&b| b == 0)
        .filter(|m| !m.is_empty() && *m != SCRAM_PLUS)
        .collect();
    let body_len = 4 + 4 + kept.iter().map(|m| m.len() + 1).sum::<usize>() + 1;
    out.extend_from_slice(b"R");
    out.extend_from_slice(&(body_len as i32).to_be_bytes());
    out.extend_from_slice(&10i32.to_be_bytes());
    for m in kept {
        out.extend_from_slice(m);
        out.extend_from_slice(&[0]);
    }
    out.extend_from_slice(&[0]);
}

/// Whether a client's SASLInitialResponse (`messages` starts with it) asks for channel
/// binding: its gs2 header starts with `p=` (binding) or `y,` (the client could bind and
/// believes the server cannot, which a TLS origin takes for a downgrade).
pub fn sasl_wants_binding(messages: &[u8]) -> bool {
    if messages.first() != Some(&b'p') {
        return false;
    }
    let body = messages.get(5..).unwrap_or(&[]);
    let Some(end) = body.iter().position(|&b| b == 0) else {
        return false;
    };
    let data = body.get(end + 1 + 4..).unwrap_or(&[]);
    data.starts_with(b"y,") || data.starts_with(b"p=")
}

/// An origin connection that could not be opened, as the relay reports it.
fn connect_error(e: ConnectError) -> io::Error {
    match e {
        ConnectError::Open { source, .. } => source,
        ConnectError::Login { source, .. } => match source {
            LoginError::Frame(e) => e.into(),
            LoginError::Auth(_) => io::Error::new(io::ErrorKind::PermissionDenied, source),
            e => io::Error::other(e),
        },
        e => io::Error::other(e),
    }
}

/// The columns of a DataRow message (whole frame, tag included) as text (lossy UTF-8; `None`
/// for NULL); `None` if the message is malformed.
pub fn row_texts(frame: &[u8]) -> Option<Row> {
    let cols = origin::data_row(frame.get(5..)?)?;
    Some(
        cols.into_iter()
            .map(|c| c.map(|t| String::from_utf8_lossy(t).into_owned()))
            .collect(),
    )
}

/// What became of a CancelRequest.
#[derive(Debug)]
pub enum CancelSent {
    /// The origin acted on it (it closes the connection after signalling the backend).
    Landed,
    /// It never left: no connection to the origin.
    NotSent(io::Error),
    /// It was written, but whether and when it lands is not known.
    Unknown(io::Error),
}

/// Sends a CancelRequest for the origin backend `(pid, secret)` on a new connection to
/// `addr`, encrypted as `origin.url`'s `sslmode` says (the origin reads a CancelRequest inside
/// TLS too).
pub async fn send_cancel(
    origin: &Settings,
    addr: &OriginAddr,
    timeout: Duration,
    pid: i32,
    secret: i32,
) -> CancelSent {
    let mut conn = match OriginConn::open(addr, Some(timeout), &origin.tls, 0).await {
        Ok(c) => c,
        Err(e) => return CancelSent::NotSent(e),
    };
    let mut buf = BytesMut::new();
    frontend::cancel_request(pid, secret, &mut buf);
    if let Err(e) = conn.write_all(&buf).await {
        return CancelSent::Unknown(e);
    }
    match conn.read_some(timeout).await {
        Ok(0) => CancelSent::Landed,
        Ok(_) => CancelSent::Unknown(io::Error::other("the origin answered a CancelRequest")),
        Err(e) => CancelSent::Unknown(e),
    }
}

/// Appends `frames` to `held` if that keeps it within `max` bytes; false when they were
/// dropped (whole: a notification is never cut).
fn keep_bounded(held: &mut Vec<u8>, frames: &[u8], max: usize) -> bool {
    if held.len() + frames.len() > max {
        return false;
    }
    held.extend_from_slice(frames);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One session's values stay readable by it; another's, or several sessions', are not.
    #[test]
    fn sequence_values_are_followed_by_session() {
        let s = Sequences::Clean;
        assert!(!s.foreign_to(1));
        let s = s.used_by(1);
        assert_eq!(s, Sequences::Of(1));
        assert!(!s.foreign_to(1) && s.foreign_to(2));
        assert_eq!(s.used_by(1), Sequences::Of(1));
        let s = s.used_by(2);
        assert_eq!(s, Sequences::Mixed);
        assert!(s.foreign_to(1) && s.foreign_to(2));
        assert_eq!(s.used_by(1), Sequences::Mixed);
    }

    #[test]
    fn notifications_kept_for_a_session_stop_at_their_bound() {
        let frame = |payload: usize| {
            let mut f = vec![b'A'];
            f.extend_from_slice(&(4 + payload as i32).to_be_bytes());
            f.resize(5 + payload, b'x');
            f
        };
        let mut held = Vec::new();
        let big = frame(1000);
        let mut kept = 0;
        while keep_bounded(&mut held, &big, NOTIFICATIONS_MAX) {
            kept += 1;
        }
        assert_eq!(kept, NOTIFICATIONS_MAX / big.len());
        assert!(held.len() <= NOTIFICATIONS_MAX);
        // Past the bound nothing is cut in half; a smaller one that still fits is kept.
        let room = NOTIFICATIONS_MAX - held.len();
        assert!(!keep_bounded(&mut held, &frame(room), NOTIFICATIONS_MAX));
        assert!(keep_bounded(&mut held, &frame(room - 5), NOTIFICATIONS_MAX));
        assert_eq!(held.len(), NOTIFICATIONS_MAX);
        assert!(!keep_bounded(&mut held, &frame(0), NOTIFICATIONS_MAX));
    }

    #[test]
    fn scram_plus_is_not_relayed() {
        let mut frame = BytesMut::new();
        let body = b"SCRAM-SHA-256-PLUS\0SCRAM-SHA-256\0\0";
        frame.extend_from_slice(b"R");
        frame.extend_from_slice(&((8 + body.len()) as i32).to_be_bytes());
        frame.extend_from_slice(&10i32.to_be_bytes());
        frame.extend_from_slice(body);
        let mut out = Vec::new();
        compose_sasl_without_plus(&frame, &mut out);
        let mut want = Vec::new();
        want.extend_from_slice(b"R");
        want.extend_from_slice(&(8 + 15i32).to_be_bytes());
        want.extend_from_slice(&10i32.to_be_bytes());
        want.extend_from_slice(b"SCRAM-SHA-256\0\0");
        assert_eq!(out, want);
        assert_eq!(pgline_dataplane::pgwire::frame_len(&out), Some(out.len()));
    }

    #[test]
    fn a_binding_gs2_header_is_seen() {
        let initial = |data: &[u8]| {
            let mut m = BytesMut::new();
            postgres_protocol::message::frontend::sasl_initial_response(
                "SCRAM-SHA-256",
                data,
                &mut m,
            )
            .unwrap();
            m
        };
        assert!(sasl_wants_binding(&initial(b"y,,n=,r=abc")));
        assert!(sasl_wants_binding(&initial(
            b"p=tls-server-end-point,,n=,r=abc"
        )));
        assert!(!sasl_wants_binding(&initial(b"n,,n=,r=abc")));
        assert!(!sasl_wants_binding(b"p\0\0\0\x08abc\0"));
    }

    #[tokio::test]
    async fn a_connection_is_reusable_only_once_its_cancels_landed() {
        let gate = Arc::new(CancelGate::default());
        assert!(gate.clear());
        gate.sent();
        gate.sent();
        assert!(!gate.clear());
        let waiter = tokio::spawn({
            let gate = Arc::clone(&gate);
            async move { gate.settled().await }
        });
        gate.done(true);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "one cancel is still on its way");
        gate.done(true);
        assert!(waiter.await.unwrap());
        assert!(gate.clear());

        // A cancel whose fate is unknown may land at any time: never reusable again.
        gate.sent();
        gate.done(false);
        assert!(!gate.clear());
        assert!(!gate.settled().await);
    }
}
