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
use crate::origin::{self, Credentials, LoginError, OriginConn};

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
    /// Cancels sent at this connection that may not have reached it yet.
    pub cancels: Arc<CancelGate>,
    /// Held while the connection is in authentication (see `admit`).
    slot: Option<StartupSlot>,
}

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
    /// Opens a TCP connection to the origin (no startup yet).
    pub async fn connect(addr: &OriginAddr, timeout: Duration) -> io::Result<Backend> {
        let conn = OriginConn::open(addr, Some(timeout), 16 * 1024).await?;
        Ok(Backend {
            conn,
            pid: 0,
            secret: 0,
            prepared: HashSet::new(),
            cancels: Arc::default(),
            slot: None,
        })
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
    /// `MSG_PEEK` on the socket, so that input the runtime has not been told about yet is
    /// seen too.
    pub fn unusable(&self) -> bool {
        self.conn.unusable()
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
                _ => {}
            }
        }
    }

    /// Says goodbye (best effort).
    pub async fn terminate(mut self) {
        let mut buf = BytesMut::new();
        frontend::terminate(&mut buf);
        let _ = self.write(&buf).await;
    }
}

/// What pgline needs to open origin connections for a pool by itself: the startup message of
/// the pool's first client and the password of `origin.url` (only for that URL's user).
#[derive(Clone)]
pub struct Opener {
    pub origin: OriginAddr,
    pub timeout: Duration,
    pub user: String,
    pub password: Vec<u8>,
    pub startup: Vec<u8>,
}

impl Backend {
    /// Opens a connection and logs it in with `o`'s startup message and password (see
    /// [`origin::login`]), up to ReadyForQuery.
    pub async fn open(o: &Opener) -> io::Result<Backend> {
        let mut b = Backend::connect(&o.origin, o.timeout).await?;
        let who = Credentials {
            user: &o.user,
            password: Some(&o.password),
        };
        let logged = origin::login(&mut b.conn, &o.startup, who)
            .await
            .map_err(|e| match e {
                LoginError::Frame(e) => e.into(),
                LoginError::Auth(_) => io::Error::new(io::ErrorKind::PermissionDenied, e),
                e => io::Error::other(e),
            })?;
        b.pid = logged.pid;
        b.secret = logged.secret;
        Ok(b)
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

/// Sends a CancelRequest for the origin backend `(pid, secret)` on a new connection.
pub async fn send_cancel(
    addr: &OriginAddr,
    timeout: Duration,
    pid: i32,
    secret: i32,
) -> CancelSent {
    let mut conn = match OriginConn::open(addr, Some(timeout), 0).await {
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

#[cfg(test)]
mod tests {
    use super::*;

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
