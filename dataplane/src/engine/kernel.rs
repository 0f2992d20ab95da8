//! One dataplane core on the kernel transport: a poll-mode loop over its own `SO_REUSEPORT`
//! listener and its connections.
//!
//! ```text
//!  poll_once(timeout)
//!    ├─ poll_readiness      epoll: new connections, readable/writable sockets, waker
//!    ├─ poll_accept         accept everything queued; over the limit: error reply, close
//!    ├─ poll_keyspace       one atomic load; a new catalog snapshot only when it moved
//!    ├─ poll_replies        control-plane answers -> deferred replies composed, released in order
//!    ├─ poll_sessions       per active connection, bounded:
//!    │    process_ingress (socket read) → session::Worker::process_requests → dispatch_egress
//!    └─ poll_limits         every 100 ms: reply-memory cap, timeouts, buffers (`limits`)
//! ```
//! Accepting applies the per-port connection limit (each core's share) and, when set, the
//! per-source one ([`super::limits::Sources`]).
//!
//! TLS ([`super::tls`]): a connection accepted on the RESP TLS listener gets its session at
//! accept; a PostgreSQL one after its SSLRequest was answered `S` (`Conn::start_tls`: the `S`
//! is written in plaintext, nothing is read until it is, then the session is installed).
//! Ingress then decrypts what the socket gave into the connection's input, egress seals its
//! output and writes the ciphertext. A connection whose TLS fails gets rustls's alert (best
//! effort) and is closed; the other connections of the core go on.
//! Everything between the read and the write is the transport-independent session layer
//! ([`super::session`], [`super::slots`]); this file is only what is particular to sockets.
//! The loop never blocks while there is work: it spins for `spin_polls` empty turns, yielding
//! the CPU on each (`sched_yield`: a relay or fill thread on the same CPU runs at once), then
//! sleeps in epoll until a socket or the control plane's waker wakes it. Work per turn is bounded: bytes
//! read per connection, requests per connection, replies held per connection.
//!
//! Hosting the relay ([`crate::plane::PgHost`], when the control plane offers it): the core's
//! thread runs a tokio current-thread runtime whose one driving future is this loop. After each
//! turn the core hands its PostgreSQL requests to the relay, whose tasks (sessions, their origin
//! sockets) run on the same runtime between turns (`yield_now`). When idle past the spin it
//! sleeps in tokio's epoll, which watches the origin sockets and this core's own mio epoll fd
//! (`AsyncFd`), so a client's bytes, the relay's reply (the core's waker) and an origin's answer
//! each wake the one thread. No request or reply crosses threads. Since tokio's driver already
//! polls that epoll between turns, a hosting core's turn reads its own epoll fd only when the
//! driver saw it readable (or the turn is the first, follows a sleep that the fd ended, or
//! follows a read that filled the event buffer or failed): one `epoll_wait` per spin turn, not
//! two, and none for the fd after a sleep that a relay reply ended.

use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Registry, Token};

use crate::plane::{ConnToken, CoreStats, PgHost, Shared, Wake};
use crate::transport::kernel;

use super::limits::{Sources, PG_REJECT_SOURCE, RESP_REJECT_SOURCE};
use super::session::{Next, Worker};
use super::slots::{Entry, Slots, Transport};
use super::tls::{Ingested, TlsFront, TlsSession};
use super::EngineConfig;

const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);
const PG_LISTENER: Token = Token(2);
const TLS_LISTENER: Token = Token(3);
const FIRST_CONN: usize = 4;
/// What a PostgreSQL client over the connection limit gets (it expects a startup reply;
/// PostgreSQL sends such an ErrorResponse too): FATAL 53300, then the socket is closed.
pub(crate) const PG_REJECT: &[u8] =
    b"E\x00\x00\x00\x3bSFATAL\x00VFATAL\x00C53300\x00Msorry, too many clients already\x00\x00";
/// What a RESP client over the connection limit gets before the socket is closed.
pub(crate) const RESP_REJECT: &[u8] = b"-ERR max number of clients reached\r\n";

/// The addresses a core listens on.
pub struct Ports {
    pub listen: std::net::SocketAddr,
    /// The PostgreSQL port, when the pgwire front is on.
    pub pg_listen: Option<std::net::SocketAddr>,
}
/// Bytes read from one socket per turn before other connections get their turn.
const READ_PER_TURN: usize = 256 * 1024;

/// The core's waker: an eventfd write, made only while the core sleeps or is about to.
///
/// A reply sent while the core is awake is taken by its next turn anyway; with the relay on the
/// core's own thread every reply was sent while awake, and the write (a syscall per forwarded
/// batch, and an epoll event to consume) bought nothing. No wake is lost: the core announces its
/// sleep ([`Asleep::enter`]) and then looks at its reply lanes, the sender queues its reply and
/// then looks at the announcement, each with a SeqCst fence between, so at least one of the two
/// sees the other.
///
/// A core that hosts the relay sleeps in its tokio runtime, not in its own epoll: it is woken
/// through [`Asleep::notify`] instead of the eventfd. A relay task on the core's own thread then
/// wakes it with no system call (tokio queues the core's future on its local run queue); a
/// sender on another thread costs what the eventfd did (tokio unparks its driver).
struct MioWaker {
    waker: mio::Waker,
    asleep: Arc<Asleep>,
}

/// Whether the core sleeps, or is about to (shared with its [`MioWaker`]), and how to wake it.
#[derive(Default)]
struct Asleep {
    sleeping: AtomicBool,
    /// Set once, when the core starts hosting the relay: it then sleeps on `notify`. (A sender
    /// that still reads it unset, memory order allowing, writes the eventfd, which wakes the
    /// hosting core too: its sleep also waits on the epoll fd's readiness.)
    hosted: AtomicBool,
    notify: tokio::sync::Notify,
}

impl Asleep {
    /// Announces a sleep; the caller then checks its reply lanes (`replies_waiting`) and does
    /// not sleep if one holds something.
    fn enter(&self) {
        self.sleeping.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }

    fn leave(&self) {
        self.sleeping.store(false, Ordering::Relaxed);
    }
}

/// The core's mio epoll fd as tokio sees it (borrowed: the `Poll` owns and closes it).
struct EpollFd(std::os::fd::RawFd);

impl std::os::fd::AsRawFd for EpollFd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.0
    }
}

/// Whether tokio's driver saw the core's epoll fd readable since the last call (a socket event
/// or an accept queued for the core). What it saw is cleared before the caller reads the fd, so
/// an event arriving from then on is reported again by the driver's next poll, which runs
/// between turns. No system call: an atomic load when ready, a short lock (the waker's slot)
/// when not.
fn fd_ready(fd: &tokio::io::unix::AsyncFd<EpollFd>) -> bool {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match fd.poll_read_ready(&mut cx) {
        std::task::Poll::Ready(Ok(mut guard)) => {
            guard.clear_ready();
            true
        }
        std::task::Poll::Ready(Err(_)) => true,
        std::task::Poll::Pending => false,
    }
}

impl Wake for MioWaker {
    fn wake(&self) {
        // Pairs with the fence in `Asleep::enter` (see the type's doc).
        fence(Ordering::SeqCst);
        if !self.asleep.sleeping.load(Ordering::Relaxed) {
            return;
        }
        if self.asleep.hosted.load(Ordering::Relaxed) {
            // A permit is kept if the core has not reached its `notified()` yet.
            self.asleep.notify.notify_one();
        } else {
            let _ = self.waker.wake();
        }
    }
}

/// A connection's socket and its readiness as epoll last reported it.
pub(crate) struct Socket {
    stream: TcpStream,
    /// epoll reported the peer's FIN (or an error); `eof` is set once the 0-byte read is seen.
    peer_closed: bool,
    /// The socket may have unread bytes (edge-triggered readiness not yet drained).
    readable: bool,
    /// The socket refused part of the output; wait for a writable event.
    write_blocked: bool,
    /// The connection's TLS session, once it has one.
    tls: Option<Box<TlsSession>>,
}

/// The listener a connection came in on.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Front {
    Resp,
    Pg,
    /// The RESP TLS listener (`resp.tls_listen`).
    RespTls,
}

/// The kernel transport's side of a turn: the registry and the read buffer.
struct Sockets {
    registry: Registry,
    read_buf: Box<[u8]>,
}

pub struct Core {
    poll: Poll,
    events: Events,
    listener: TcpListener,
    /// The PostgreSQL-protocol listener, when the pgwire front is on.
    pg_listener: Option<TcpListener>,
    /// The RESP TLS listener, when `resp.tls_listen` is set.
    tls_listener: Option<TcpListener>,
    slots: Slots<Socket>,
    sockets: Sockets,
    worker: Worker,
    /// Shared with the waker: set while the core sleeps.
    asleep: Arc<Asleep>,
    /// The last read of the epoll fd filled `events`: more events may be waiting.
    events_full: bool,
}

impl Core {
    /// Binds this core's listeners (RESP on `listen`, PostgreSQL on `pg_listen` if given, RESP
    /// over TLS on `tls.resp_listen` if given) and registers its waker with `shared`.
    pub fn new(
        id: usize,
        ports: Ports,
        shared: Arc<Shared>,
        cfg: Arc<EngineConfig>,
        sources: Arc<Sources>,
        tls: Option<TlsFront>,
    ) -> io::Result<Core> {
        let Ports { listen, pg_listen } = ports;
        let poll = Poll::new()?;
        let mut listener = kernel::bind_listener(listen, true, 1024)?;
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        let bind = |addr: Option<std::net::SocketAddr>, token| -> io::Result<_> {
            let Some(addr) = addr else { return Ok(None) };
            let mut l = kernel::bind_listener(addr, true, 1024)?;
            poll.registry()
                .register(&mut l, token, Interest::READABLE)?;
            Ok(Some(l))
        };
        let pg_listener = bind(pg_listen, PG_LISTENER)?;
        let tls_listener = bind(tls.as_ref().and_then(|t| t.resp_listen), TLS_LISTENER)?;
        let waker = mio::Waker::new(poll.registry(), WAKER)?;
        let port = shared.core_port(id);
        let asleep = Arc::new(Asleep::default());
        port.set_waker(Arc::new(MioWaker {
            waker,
            asleep: asleep.clone(),
        }));
        let registry = poll.registry().try_clone()?;
        let mut worker = Worker::new(port, cfg);
        worker.sources = sources;
        worker.tls = tls;
        Ok(Core {
            poll,
            events: Events::with_capacity(1024),
            listener,
            pg_listener,
            tls_listener,
            slots: Slots::new(),
            sockets: Sockets {
                registry,
                read_buf: vec![0u8; 64 * 1024].into_boxed_slice(),
            },
            worker,
            asleep,
            events_full: false,
        })
    }

    /// The address this core's listener is bound to.
    pub fn local_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.listener.local_addr()
    }

    /// The address this core's PostgreSQL listener is bound to, if it has one.
    pub fn pg_local_addr(&self) -> io::Result<Option<std::net::SocketAddr>> {
        self.pg_listener
            .as_ref()
            .map(|l| l.local_addr())
            .transpose()
    }

    /// The address this core's RESP TLS listener is bound to, if it has one.
    pub fn tls_local_addr(&self) -> io::Result<Option<std::net::SocketAddr>> {
        self.tls_listener
            .as_ref()
            .map(|l| l.local_addr())
            .transpose()
    }

    /// Runs until `stop` is set; with the relay on this thread when the control plane offers it.
    pub fn run(&mut self, stop: &AtomicBool) {
        self.worker.port.set_transport("kernel");
        if let Some(host) = self.worker.port.pg_host() {
            // Without a runtime (out of file descriptors) the relay serves this core from the
            // control plane, as for a userspace core.
            if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                self.worker.port.set_pg_hosted();
                return rt.block_on(self.run_hosting(stop, host));
            }
        }
        self.run_alone(stop);
    }

    /// The loop with the relay on the control plane.
    fn run_alone(&mut self, stop: &AtomicBool) {
        let mut idle = 0u32;
        while !stop.load(Ordering::Relaxed) {
            let timeout = if idle < self.worker.cfg.spin_polls {
                Duration::ZERO
            } else {
                Duration::from_millis(100)
            };
            if self.poll_once(timeout) {
                idle = 0;
            } else {
                idle = idle.saturating_add(1);
                if timeout.is_zero() {
                    // An empty spin turn gives the CPU away if anything else wants it. When the
                    // core shares its CPU with the control plane (pinned together, or fewer CPUs
                    // than threads), what it waits for (the relay's answer, a fill) is that other
                    // thread's work: spinning past it kept the relay off the CPU until the
                    // scheduler preempted the core. With nothing else runnable this returns at
                    // once (one syscall), so a core with its own CPU loses nothing.
                    std::thread::yield_now();
                }
            }
        }
    }

    /// The loop hosting the relay (see the module doc): the same turns and spin, with the
    /// relay's requests drained after each turn and its tasks run between turns.
    async fn run_hosting(&mut self, stop: &AtomicBool, host: Arc<dyn PgHost>) {
        let id = self.worker.port.id();
        // Readiness of the core's own epoll fd: a socket event or the waker. Its replacement
        // (`register_with_interest`) is `unsafe` only because tokio cannot know the fd outlives
        // the registration; here it does: `self.poll` owns it and outlives `epoll`, dropped at
        // the end of this function.
        #[allow(deprecated)]
        let epoll = tokio::io::unix::AsyncFd::with_interest(
            EpollFd(self.poll.as_raw_fd()),
            tokio::io::Interest::READABLE,
        );
        self.asleep.hosted.store(true, Ordering::Relaxed);
        let mut idle = 0u32;
        // Whether the next turn must read the epoll fd whatever tokio last saw of it: at the
        // start, after a sleep the fd ended (which consumed its readiness) and after a read
        // that filled `events` (more may be waiting) or failed.
        let mut read_anyway = true;
        while !stop.load(Ordering::Relaxed) {
            let read_fd = read_anyway || epoll.as_ref().map_or(true, fd_ready);
            let worked = self.turn(Duration::ZERO, read_fd);
            read_anyway = read_fd && self.events_full;
            host.drain(id);
            if worked {
                idle = 0;
            } else {
                idle = idle.saturating_add(1);
            }
            // Not asleep with events known to wait in the fd (`read_anyway` after a full read):
            // the fd's readiness edge is spent, so no wake-up would come for them.
            if idle < self.worker.cfg.spin_polls || self.slots.has_active() || read_anyway {
                if !worked {
                    // As in `run_alone`: PostgreSQL or another thread may want this CPU.
                    std::thread::yield_now();
                }
                // The relay's tasks and the origin sockets' readiness get their turn.
                tokio::task::yield_now().await;
                continue;
            }
            self.asleep.enter();
            if self.worker.port.replies_waiting() {
                self.asleep.leave();
                continue;
            }
            self.slots.may_sleep();
            let woken = self.asleep.notify.notified();
            let ready = async {
                match &epoll {
                    Ok(fd) => {
                        if let Ok(mut guard) = fd.readable().await {
                            guard.clear_ready();
                        }
                    }
                    // Not registrable: sleep a little at a time, so that the relay still runs.
                    Err(_) => tokio::time::sleep(Duration::from_millis(1)).await,
                }
            };
            let by_fd = tokio::time::timeout(Duration::from_millis(100), async {
                tokio::select! {
                    biased;
                    () = ready => true,
                    () = woken => false,
                }
            })
            .await;
            self.asleep.leave();
            // Woken by its own fd, the sleep consumed the readiness the next turn would read:
            // read the fd anyway. Woken by a reply (or the timeout), the runtime's record of
            // the fd is intact and says whether to read it: one `epoll_wait` fewer per reply
            // that ends a sleep.
            // (`read_anyway` was false: see the spin's condition.)
            read_anyway = by_fd.unwrap_or(false);
        }
    }

    /// One turn of the loop; returns whether anything was done.
    pub fn poll_once(&mut self, timeout: Duration) -> bool {
        self.turn(timeout, true)
    }

    /// A turn that reads the sockets' readiness from the epoll fd only if `read_fd`: a hosting
    /// core skips that system call when tokio's driver, which watches the fd, saw no event.
    fn turn(&mut self, timeout: Duration, read_fd: bool) -> bool {
        CoreStats::add(&self.worker.stats().polls, 1);
        if !timeout.is_zero() && !self.slots.has_active() {
            // poll_readiness may sleep: the previous pass's end no longer marks this turn's start.
            self.slots.may_sleep();
        }
        let mut worked = read_fd && self.poll_readiness(timeout);
        self.worker.now = Instant::now();
        self.worker.poll_keyspace();
        worked |= self.slots.poll_replies(&self.worker);
        worked |= self.slots.poll_tracking(&mut self.worker);
        worked |= self
            .slots
            .poll_sessions(&mut self.sockets, &mut self.worker);
        self.slots.poll_limits(&mut self.sockets, &mut self.worker);
        self.worker.end_turn();
        worked
    }

    fn poll_readiness(&mut self, timeout: Duration) -> bool {
        let mut timeout = if self.slots.has_active() {
            Duration::ZERO
        } else {
            timeout
        };
        let sleeps = !timeout.is_zero();
        if sleeps {
            self.asleep.enter();
            if self.worker.port.replies_waiting() {
                timeout = Duration::ZERO;
            }
        }
        let polled = self.poll.poll(&mut self.events, Some(timeout));
        if sleeps {
            self.asleep.leave();
        }
        if let Err(e) = polled {
            // Nothing was read: a hosting core's next turn must read the fd again, whatever
            // tokio's driver reports of it (the readiness was cleared before this read).
            self.events_full = true;
            if e.kind() != io::ErrorKind::Interrupted {
                std::thread::sleep(Duration::from_millis(1));
            }
            return false;
        }
        let mut accept = false;
        let mut accept_pg = false;
        let mut accept_tls = false;
        let mut read = 0;
        for event in self.events.iter() {
            read += 1;
            match event.token() {
                LISTENER => accept = true,
                PG_LISTENER => accept_pg = true,
                TLS_LISTENER => accept_tls = true,
                WAKER => {}
                Token(t) => {
                    let slot = t - FIRST_CONN;
                    let Some(entry) = self.slots.get_mut(slot) else {
                        continue;
                    };
                    let io = &mut entry.io;
                    if event.is_readable() || event.is_read_closed() || event.is_error() {
                        io.readable = true;
                    }
                    if event.is_read_closed() || event.is_error() {
                        // Read until the 0 that reports it, even after a short read.
                        io.peer_closed = true;
                    }
                    if event.is_writable() {
                        io.write_blocked = false;
                    }
                    self.slots.activate(slot);
                }
            }
        }
        if accept {
            self.poll_accept(Front::Resp);
        }
        if accept_pg {
            self.poll_accept(Front::Pg);
        }
        if accept_tls {
            self.poll_accept(Front::RespTls);
        }
        // A full buffer may have left events in the kernel: the next turn reads again.
        self.events_full = read >= self.events.capacity();
        read > 0
    }

    /// Accepts what is queued on the listener of `front`.
    fn poll_accept(&mut self, front: Front) {
        let pg = front == Front::Pg;
        loop {
            let listener = match front {
                Front::Resp => Some(&self.listener),
                Front::Pg => self.pg_listener.as_ref(),
                Front::RespTls => self.tls_listener.as_ref(),
            };
            let Some(listener) = listener else { return };
            let (mut stream, peer) = match listener.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(_) => return,
            };
            let Some(source) = self.admit(pg, peer.ip()) else {
                // A TLS client would read a plaintext refusal as a broken record: it is only
                // closed.
                if front != Front::RespTls {
                    let _ = stream.write(match (pg, self.slots.open_on(pg) >= self.limit(pg)) {
                        (true, true) => PG_REJECT,
                        (false, true) => RESP_REJECT,
                        (true, false) => PG_REJECT_SOURCE,
                        (false, false) => RESP_REJECT_SOURCE,
                    });
                }
                continue;
            };
            let tls = match (front, &self.worker.tls) {
                (Front::RespTls, Some(t)) => match t.resp.accept() {
                    Ok(session) => Some(session),
                    Err(_) => {
                        if let Some(ip) = source {
                            self.worker.sources.close(pg, ip);
                        }
                        continue;
                    }
                },
                _ => None,
            };
            let _ = kernel::configure_stream(&stream);
            let (slot, generation) = self.slots.vacant();
            let interest = Interest::READABLE | Interest::WRITABLE;
            let token = Token(slot + FIRST_CONN);
            if self
                .sockets
                .registry
                .register(&mut stream, token, interest)
                .is_err()
            {
                self.slots.unvacate(slot);
                if let Some(ip) = source {
                    self.worker.sources.close(pg, ip);
                }
                continue;
            }
            let socket = Socket {
                stream,
                peer_closed: false,
                readable: true,
                write_blocked: false,
                tls,
            };
            let mut conn = if pg {
                self.worker.new_pg_conn(generation)
            } else {
                self.worker.new_conn(generation)
            };
            conn.source = source;
            if let Some(session) = conn.pg.as_mut() {
                session.peer = Some(peer.ip());
            }
            self.slots.fill(slot, conn, socket, &mut self.worker);
        }
    }

    /// This core's share of the connection limit of the RESP or PostgreSQL (`pg`) port.
    fn limit(&self, pg: bool) -> usize {
        if pg {
            self.worker.cfg.max_pg_connections_per_core()
        } else {
            self.worker.cfg.max_connections_per_core()
        }
    }

    /// Whether a connection from `ip` may be accepted on the port; `Some(source)` with the
    /// address when it was counted in the per-source table (to be released at close).
    fn admit(&self, pg: bool, ip: std::net::IpAddr) -> Option<Option<std::net::IpAddr>> {
        if self.slots.open_on(pg) >= self.limit(pg) {
            CoreStats::add(&self.worker.stats().connections_rejected, 1);
            return None;
        }
        self.worker.admit_source(pg, ip)
    }
}

impl Transport for Sockets {
    type Io = Socket;

    fn process(
        &mut self,
        entry: &mut Entry<Socket>,
        token: ConnToken,
        worker: &mut Worker,
    ) -> Next {
        if let Some(next) = self.process_ingress(entry, worker) {
            return next;
        }
        let more_input = worker.process_requests(&mut entry.conn, token);
        if dispatch_egress(entry, worker.stats()).is_err() {
            return Next::Close;
        }
        if entry.conn.start_tls && entry.conn.output_done() && !start_tls(entry, worker) {
            return Next::Close;
        }
        let next = worker.next_step(&entry.conn, more_input, entry.io.readable);
        match &entry.io.tls {
            // Closing with ciphertext the socket did not take yet (the last reply, an alert):
            // wait for it to drain; the limits sweep closes a peer that never reads.
            Some(tls) if next == Next::Close && tls.wants_write() && entry.io.write_blocked => {
                Next::Idle
            }
            _ => next,
        }
    }

    fn release(&mut self, mut entry: Entry<Socket>) {
        let _ = self.registry.deregister(&mut entry.io.stream);
    }
}

impl Sockets {
    /// Reads what the socket has, up to the per-turn and per-connection bounds.
    fn process_ingress(&mut self, entry: &mut Entry<Socket>, worker: &Worker) -> Option<Next> {
        let Entry { conn, io, .. } = entry;
        let mut read = 0;
        // Waiting to start TLS: what comes now must be read by the TLS session.
        let reading = !conn.start_tls;
        while reading && io.readable && read < READ_PER_TURN && worker.wants_input(conn) {
            match io.stream.read(&mut self.read_buf) {
                Ok(0) => {
                    // The client half-closed: answer what it sent, then close.
                    io.readable = false;
                    conn.eof = true;
                }
                Ok(n) => {
                    match io.tls.as_mut() {
                        None => conn.input_buffer().extend_from_slice(&self.read_buf[..n]),
                        Some(tls) => {
                            let plain = conn.input_buffer();
                            match tls.ingest(&self.read_buf[..n], plain, worker.stats()) {
                                Ok(Ingested::Open) => {}
                                Ok(Ingested::Closed) => conn.eof = true,
                                Err(_) => {
                                    // rustls queued an alert: send it if the socket takes it.
                                    let _ = tls.write_to(&mut io.stream);
                                    return Some(Next::Close);
                                }
                            }
                        }
                    }
                    conn.last_input = worker.now;
                    conn.incomplete = false;
                    read += n;
                    // A short read drained the socket: skip the read that would only say
                    // EAGAIN. Data arriving later raises a new edge-triggered event. Not when the
                    // peer's FIN came with the same event: no new edge would report it, so read
                    // on to the 0.
                    if n < self.read_buf.len() && !io.peer_closed {
                        io.readable = false;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => io.readable = false,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Some(Next::Close),
            }
        }
        CoreStats::add(&worker.stats().bytes_in, read as u64);
        None
    }
}

/// Installs a TLS session on a PostgreSQL connection whose `S` has been written; false when
/// none can be made (the connection is closed).
fn start_tls(entry: &mut Entry<Socket>, worker: &Worker) -> bool {
    entry.conn.start_tls = false;
    let Some(front) = worker.tls.as_ref() else {
        return false;
    };
    match front.pg.accept() {
        Ok(session) => {
            entry.io.tls = Some(session);
            if let Some(pg) = entry.conn.pg.as_mut() {
                pg.encrypted = true;
            }
            // The ClientHello may already be in the socket, behind the edge that was consumed.
            entry.io.readable = true;
            true
        }
        Err(_) => false,
    }
}

/// Writes as much of the output as the socket takes (sealed first on a TLS connection).
fn dispatch_egress(entry: &mut Entry<Socket>, stats: &CoreStats) -> io::Result<()> {
    if entry.io.tls.is_some() {
        return dispatch_egress_tls(entry, stats);
    }
    let Entry { conn, io, .. } = entry;
    while !conn.output_done() && !io.write_blocked {
        match io.stream.write(conn.output()) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                conn.advance_output(n);
                CoreStats::add(&stats.bytes_out, n as u64);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => io.write_blocked = true,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// [`dispatch_egress`] over TLS: output moves into the session as far as its bounded buffer
/// takes it (the rest stays in the connection, under the reply-backlog bound), ciphertext goes
/// to the socket. A closing connection says close_notify.
fn dispatch_egress_tls(entry: &mut Entry<Socket>, stats: &CoreStats) -> io::Result<()> {
    let Entry { conn, io, .. } = entry;
    let Some(tls) = io.tls.as_mut() else {
        return Ok(());
    };
    loop {
        while !conn.output_done() {
            let n = tls.seal(conn.output());
            if n == 0 {
                break;
            }
            conn.advance_output(n);
        }
        if conn.closing && conn.output_done() && tls.established() {
            tls.close();
        }
        if !tls.wants_write() || io.write_blocked {
            return Ok(());
        }
        match tls.write_to(&mut io.stream) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => CoreStats::add(&stats.bytes_out, n as u64),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => io.write_blocked = true,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pgwire::{compose_error_response, ErrorFields};

    /// The waker writes its eventfd only while the core announced a sleep.
    #[test]
    fn the_waker_wakes_only_a_sleeping_core() {
        let mut poll = Poll::new().unwrap();
        let asleep = Arc::new(Asleep::default());
        let waker = MioWaker {
            waker: mio::Waker::new(poll.registry(), WAKER).unwrap(),
            asleep: asleep.clone(),
        };
        let mut events = Events::with_capacity(8);
        let mut woken = |poll: &mut Poll| {
            poll.poll(&mut events, Some(Duration::ZERO)).unwrap();
            events.iter().any(|e| e.token() == WAKER)
        };
        waker.wake();
        assert!(!woken(&mut poll), "an awake core was woken");
        asleep.enter();
        waker.wake();
        assert!(woken(&mut poll), "a sleeping core was not woken");
        asleep.leave();
        waker.wake();
        assert!(
            !woken(&mut poll),
            "a core woken once was woken again after it left its sleep"
        );
    }

    /// A core that hosts the relay is woken through its runtime: no eventfd write, and a wake
    /// sent before the core reaches its wait is kept for it.
    #[test]
    fn a_hosting_core_is_woken_without_its_eventfd() {
        let mut poll = Poll::new().unwrap();
        let asleep = Arc::new(Asleep::default());
        asleep.hosted.store(true, Ordering::Relaxed);
        let waker = MioWaker {
            waker: mio::Waker::new(poll.registry(), WAKER).unwrap(),
            asleep: asleep.clone(),
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let within = |ms| {
            rt.block_on(async {
                tokio::time::timeout(Duration::from_millis(ms), asleep.notify.notified())
                    .await
                    .is_ok()
            })
        };
        waker.wake();
        assert!(!within(20), "an awake core was woken");
        asleep.enter();
        waker.wake();
        assert!(within(1000), "a sleeping core was not woken");
        let mut events = Events::with_capacity(8);
        poll.poll(&mut events, Some(Duration::ZERO)).unwrap();
        assert!(
            !events.iter().any(|e| e.token() == WAKER),
            "a hosting core's eventfd was written"
        );
        asleep.leave();
        waker.wake();
        assert!(
            !within(20),
            "a core woken once was woken again after it left its sleep"
        );
    }

    /// What a hosting core's spin relies on to skip reading its epoll fd: tokio's driver reports
    /// each new event of a socket in the core's `Poll` (a second one too, after the first was
    /// seen and cleared), and reports nothing when nothing new arrived.
    #[test]
    fn a_hosting_core_learns_of_socket_events_from_its_runtime() {
        let mut poll = Poll::new().unwrap();
        let (mut ours, mut theirs) = mio::net::UnixStream::pair().unwrap();
        poll.registry()
            .register(&mut ours, Token(FIRST_CONN), Interest::READABLE)
            .unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            #[allow(deprecated)]
            let fd = tokio::io::unix::AsyncFd::with_interest(
                EpollFd(poll.as_raw_fd()),
                tokio::io::Interest::READABLE,
            )
            .unwrap();
            let mut events = Events::with_capacity(8);
            let mut read = |poll: &mut Poll| {
                poll.poll(&mut events, Some(Duration::ZERO)).unwrap();
                events.iter().count()
            };
            tokio::task::yield_now().await;
            assert!(!fd_ready(&fd), "ready with no event");
            for round in 0..3 {
                theirs.write_all(b"x").unwrap();
                tokio::task::yield_now().await;
                assert!(fd_ready(&fd), "round {round}: an event was not reported");
                assert_eq!(read(&mut poll), 1, "round {round}");
                tokio::task::yield_now().await;
                assert!(!fd_ready(&fd), "round {round}: still ready once read");
            }
        });
    }

    #[test]
    fn refusals_are_well_formed_error_responses() {
        for (bytes, message) in [
            (PG_REJECT, &b"sorry, too many clients already"[..]),
            (PG_REJECT_SOURCE, b"too many connections from this address"),
        ] {
            let mut want = Vec::new();
            compose_error_response(&mut want, &ErrorFields::fatal(b"53300", message));
            assert_eq!(bytes, &want[..]);
        }
    }
}
