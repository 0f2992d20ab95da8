//! One client connection on a core, independent of the transport that carries it: its buffers,
//! its protocol state, and its queue of replies that must leave in request order.
//!
//! A transport appends what it received to [`Conn::input_buffer`], the session layer
//! ([`super::session`]) parses and executes, and the transport writes [`Conn::output`] and reports
//! how much it took with [`Conn::advance_output`]. The socket or TCP handle itself lives beside
//! the `Conn` in the transport's own slot ([`super::slots::Entry`]).
//!
//! Replies are composed straight into `wbuf` while nothing is waiting ahead of them. Once a
//! request is deferred to the control plane, later replies are composed into their own
//! [`Pending::Ready`] buffers behind it, and `release_ready` moves them to `wbuf` in order as
//! the deferred ones complete. That is the whole ordering rule for pipelines that mix hits and
//! misses.
//!
//! Memory: a connection holds no buffer while it is idle. Its core lends it a [`BASE_BUFFER`]
//! input and output buffer from a small per-core cache ([`BufferCache`]) when it is visited with
//! work, and takes them back at a sweep once it has received nothing for [`RECLAIM_IDLE`] and
//! nothing is unparsed, unwritten or pending (`Slots::poll_limits`). What its buffers hold beyond the base ([`Conn::footprint`]) is
//! charged to its core's reply memory (see [`super::limits`]); buffers that grew past
//! [`SHRINK_ABOVE`] are given back once drained ([`Conn::shrink_drained`]), so a burst does not
//! stay resident for the connection's life.

use std::collections::VecDeque;
use std::net::IpAddr;
use std::time::Instant;

use super::deferred::Deferred;
use super::pg::PgSession;
use crate::resp::Protocol;

/// A reply slot in request order.
pub(crate) enum Pending {
    /// Composed, waiting only for the replies ahead of it.
    Ready(Vec<u8>),
    /// Waiting for the control plane's answer to request `seq`.
    Waiting { seq: u64, deferred: Deferred },
}

/// Protocol-level state of a connection, the part commands may change.
pub(crate) struct Session {
    /// `CLIENT ID`: unique in the process.
    pub client_id: u64,
    pub proto: Protocol,
    pub authenticated: bool,
    /// Wrong passwords given on this connection (AUTH, HELLO ... AUTH).
    pub auth_failures: u32,
    pub name: Option<Box<[u8]>>,
    pub lib_name: Option<Box<[u8]>>,
    pub lib_ver: Option<Box<[u8]>>,
    /// `READONLY` (cluster mode): this connection may read its node's slots on a replica.
    pub readonly: bool,
    /// Client tracking and the invalidation channel (issue 18); `None` until first used.
    pub tracking: Option<Box<super::tracking::ClientTracking>>,
}

pub(crate) struct Conn {
    pub session: Session,
    pub generation: u32,
    pub rbuf: Vec<u8>,
    /// Bytes of `rbuf` already parsed.
    pub rpos: usize,
    pub wbuf: Vec<u8>,
    /// Bytes of `wbuf` already handed to the transport.
    pub wpos: usize,
    pub pending: VecDeque<Pending>,
    pub next_seq: u64,
    /// Stop reading; close once `wbuf` is written (QUIT, protocol error).
    pub closing: bool,
    /// The client shut down its sending side: no more input will come.
    pub eof: bool,
    /// `Some` for a connection accepted on the PostgreSQL listener: its protocol state.
    pub pg: Option<Box<PgSession>>,
    /// When it was accepted, or when `RESET` made it unauthenticated again (authentication and
    /// startup timeouts count from here).
    pub opened_at: Instant,
    /// The core's turn clock when bytes last arrived (idle timeout).
    pub last_input: Instant,
    /// Buffer bytes this connection charges to its core's reply memory, as of its last visit.
    pub charged: usize,
    /// The peer's address, when it is counted in the per-source table.
    pub source: Option<IpAddr>,
    /// A timeout closed it gracefully (error written, `closing` set); if it is still open at
    /// the next sweep (the peer does not read), it is closed without waiting for its output.
    pub doomed: bool,
    /// The last parse stopped at an incomplete request: reading more may go past the read-ahead
    /// bound (up to the request size limit). Cleared by every read.
    pub incomplete: bool,
    /// The session asked the transport to start TLS once its output (the `S` of an SSLRequest)
    /// is written; nothing is read until then.
    pub start_tls: bool,
}

/// Initial capacity of a connection's input and output buffers.
pub(crate) const BASE_BUFFER: usize = 16 * 1024;
/// A drained buffer larger than this is replaced by a [`BASE_BUFFER`] one.
pub(crate) const SHRINK_ABOVE: usize = 64 * 1024;
/// Base buffers a core keeps for lending ([`BufferCache`]); more are freed when returned.
pub(crate) const CACHED_BUFFERS: usize = 256;
/// A drained connection that received nothing for this long gives its base buffers back at the
/// next sweep. (Taking them back from every drained connection at each sweep made a core with
/// thousands of busy connections allocate and free them over and over.)
pub(crate) const RECLAIM_IDLE: std::time::Duration = std::time::Duration::from_secs(1);
/// Unparsed complete input beyond which a connection is not read (its requests wait in the
/// socket, not in pgline's memory); an incomplete request may be read up to the size limit.
pub(crate) const READ_AHEAD: usize = 64 * 1024;

impl Conn {
    pub fn new(client_id: u64, generation: u32, authenticated: bool, now: Instant) -> Conn {
        Conn {
            session: Session {
                client_id,
                proto: Protocol::Resp2,
                authenticated,
                auth_failures: 0,
                name: None,
                lib_name: None,
                lib_ver: None,
                readonly: false,
                tracking: None,
            },
            generation,
            rbuf: Vec::new(),
            rpos: 0,
            wbuf: Vec::new(),
            wpos: 0,
            pending: VecDeque::new(),
            next_seq: 0,
            closing: false,
            eof: false,
            pg: None,
            opened_at: now,
            last_input: now,
            charged: 0,
            source: None,
            doomed: false,
            incomplete: false,
            start_tls: false,
        }
    }

    /// Buffer capacity beyond the two base buffers it may be lent: input, output and replies
    /// held behind a deferred one. What the connection costs its core's reply memory.
    pub fn footprint(&self) -> usize {
        let held: usize = self
            .pending
            .iter()
            .map(|p| match p {
                Pending::Ready(b) => b.capacity(),
                Pending::Waiting { .. } => 0,
            })
            .sum();
        self.rbuf.capacity().saturating_sub(BASE_BUFFER)
            + self.wbuf.capacity().saturating_sub(BASE_BUFFER)
            + held
    }

    /// Frees buffers that grew past [`SHRINK_ABOVE`] and are now empty (a base-sized one is
    /// lent again at the next visit). Returns whether anything was given back.
    pub fn shrink_drained(&mut self) -> bool {
        let mut shrunk = false;
        if self.wpos == self.wbuf.len() && self.wbuf.capacity() > SHRINK_ABOVE {
            self.wbuf = Vec::new();
            self.wpos = 0;
            shrunk = true;
        }
        if self.rpos == self.rbuf.len() && self.rbuf.capacity() > SHRINK_ABOVE {
            self.rbuf = Vec::new();
            self.rpos = 0;
            shrunk = true;
        }
        shrunk
    }

    /// Whether the connection has proved who it is: a RESP connection authenticated (or no
    /// password is set), a PostgreSQL one past its startup.
    pub fn established(&self) -> bool {
        match &self.pg {
            Some(pg) => pg.phase == super::pg::Phase::Ready,
            None => self.session.authenticated,
        }
    }

    /// Nothing unparsed, unwritten, in flight or pending: its buffers may go back to the core.
    pub fn drained(&self) -> bool {
        self.rpos == self.rbuf.len() && !self.incomplete && self.quiet()
    }

    /// Nothing is in flight or unwritten: the connection only waits for its client.
    pub fn quiet(&self) -> bool {
        self.output_done()
            && self.pending.is_empty()
            && self.pg.as_ref().is_none_or(|pg| pg.waiting.is_none())
    }

    /// The buffer a transport appends received bytes to (emptied first once all was parsed).
    #[inline]
    pub fn input_buffer(&mut self) -> &mut Vec<u8> {
        if self.rpos == self.rbuf.len() {
            self.rbuf.clear();
            self.rpos = 0;
        }
        &mut self.rbuf
    }

    /// Composed bytes the transport has not taken yet.
    #[inline]
    pub fn output(&self) -> &[u8] {
        &self.wbuf[self.wpos..]
    }

    /// The transport took `n` bytes of [`Conn::output`].
    #[inline]
    pub fn advance_output(&mut self, n: usize) {
        self.wpos += n;
        if self.wpos == self.wbuf.len() {
            self.wbuf.clear();
            self.wpos = 0;
        }
    }

    /// Everything composed has been handed to the transport.
    #[inline]
    pub fn output_done(&self) -> bool {
        self.wpos == self.wbuf.len()
    }

    /// Unparsed input.
    pub fn input(&self) -> &[u8] {
        &self.rbuf[self.rpos..]
    }

    /// Moves unparsed input to the front of `rbuf` so reads can append.
    pub fn compact_input(&mut self) {
        if self.rpos > 0 {
            self.rbuf.drain(..self.rpos);
            self.rpos = 0;
        }
    }

    /// Bytes composed but not yet written, including replies held behind a deferred one.
    pub fn backlog(&self) -> usize {
        let held: usize = self
            .pending
            .iter()
            .map(|p| match p {
                Pending::Ready(b) => b.len(),
                Pending::Waiting { .. } => 0,
            })
            .sum();
        self.wbuf.len() - self.wpos + held
    }

    /// Moves replies at the front of the queue that are complete into `wbuf`.
    pub fn release_ready(&mut self) {
        while let Some(Pending::Ready(_)) = self.pending.front() {
            if let Some(Pending::Ready(bytes)) = self.pending.pop_front() {
                if self.wbuf.len() == self.wpos {
                    self.wbuf.clear();
                    self.wpos = 0;
                }
                self.wbuf.extend_from_slice(&bytes);
            }
        }
    }
}

/// A core's base-sized buffers for lending to connections while they have work: an idle
/// connection holds none, so memory per idle connection is the `Conn` itself (issue 16).
///
/// Lending costs two capacity checks per visit; a connection keeps what it was lent until a
/// sweep finds it drained and idle for [`RECLAIM_IDLE`], so a busy connection does not take and
/// return buffers per request.
/// At most [`CACHED_BUFFERS`] wait here; buffers of another size are freed, not kept.
#[derive(Default)]
pub(crate) struct BufferCache {
    free: Vec<Vec<u8>>,
    /// Bytes of buffers freed rather than kept, since [`BufferCache::take_freed`].
    freed: usize,
}

impl BufferCache {
    /// Gives `conn` an input and an output buffer if it has none.
    #[inline]
    pub fn lend(&mut self, conn: &mut Conn) {
        if conn.rbuf.capacity() == 0 {
            conn.rbuf = self.take();
            conn.rpos = 0;
        }
        if conn.wbuf.capacity() == 0 {
            conn.wbuf = self.take();
            conn.wpos = 0;
        }
    }

    /// Takes back the buffers of a drained connection; true if it held any.
    pub fn reclaim(&mut self, conn: &mut Conn) -> bool {
        if !conn.drained() || conn.rbuf.capacity() + conn.wbuf.capacity() == 0 {
            return false;
        }
        self.give(std::mem::take(&mut conn.rbuf));
        self.give(std::mem::take(&mut conn.wbuf));
        conn.rpos = 0;
        conn.wpos = 0;
        true
    }

    /// Keeps a buffer for the next loan if it is base-sized and the cache has room; frees it
    /// otherwise.
    pub fn give(&mut self, mut buf: Vec<u8>) {
        if buf.capacity() == BASE_BUFFER && self.free.len() < CACHED_BUFFERS {
            buf.clear();
            self.free.push(buf);
        } else {
            self.freed += buf.capacity();
        }
    }

    /// Bytes freed since the last call (the limits sweep counts them toward a heap trim).
    pub fn take_freed(&mut self) -> usize {
        std::mem::take(&mut self.freed)
    }

    fn take(&mut self) -> Vec<u8> {
        self.free
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(BASE_BUFFER))
    }

    #[cfg(test)]
    pub fn cached(&self) -> usize {
        self.free.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn footprint_counts_capacity_beyond_the_base_and_shrinking_gives_it_back() {
        let mut c = Conn::new(1, 0, true, Instant::now());
        assert_eq!(c.footprint(), 0, "a fresh connection charges nothing");
        c.wbuf.extend_from_slice(&[b'x'; 200 * 1024]);
        let grown = c.footprint();
        assert!(grown >= 200 * 1024 - BASE_BUFFER, "{grown}");
        assert!(!c.shrink_drained(), "unwritten output is kept");
        c.advance_output(200 * 1024);
        assert!(c.output_done());
        assert!(c.shrink_drained(), "drained and large: replaced");
        assert_eq!(c.footprint(), 0);
        // Replies held behind a deferred one count too.
        c.pending
            .push_back(Pending::Ready(Vec::with_capacity(100 * 1024)));
        assert!(c.footprint() >= 100 * 1024 - 2 * BASE_BUFFER);
        // Unparsed input is kept; once parsed, a large input buffer goes.
        c.input_buffer().extend_from_slice(&[b'y'; 100 * 1024]);
        assert!(!c.shrink_drained(), "unparsed input is kept");
        assert_eq!(c.input().len(), 100 * 1024);
        c.rpos = c.rbuf.len();
        assert!(c.shrink_drained());
        assert_eq!(
            c.rbuf.capacity(),
            0,
            "freed; a base buffer is lent at the next visit"
        );
    }

    #[test]
    fn an_idle_connection_holds_no_buffer_and_a_busy_one_keeps_what_it_was_lent() {
        let mut cache = BufferCache::default();
        let mut c = Conn::new(1, 0, true, Instant::now());
        assert_eq!(
            (c.rbuf.capacity(), c.wbuf.capacity()),
            (0, 0),
            "none at accept"
        );
        cache.lend(&mut c);
        assert_eq!(
            (c.rbuf.capacity(), c.wbuf.capacity()),
            (BASE_BUFFER, BASE_BUFFER)
        );
        // Unparsed input, an incomplete request, unwritten output or a pending reply: kept.
        c.input_buffer().extend_from_slice(b"*1\r\n$4\r\nPING\r\n");
        assert!(!cache.reclaim(&mut c), "unparsed input");
        c.rpos = c.rbuf.len();
        c.incomplete = true;
        assert!(!cache.reclaim(&mut c), "incomplete request");
        c.incomplete = false;
        c.wbuf.extend_from_slice(b"+PONG\r\n");
        assert!(!cache.reclaim(&mut c), "unwritten output");
        c.advance_output(7);
        c.pending.push_back(Pending::Ready(Vec::new()));
        assert!(
            !cache.reclaim(&mut c),
            "a reply waiting behind a deferred one"
        );
        c.pending.clear();
        assert!(cache.reclaim(&mut c), "drained: both go back");
        assert_eq!((c.rbuf.capacity(), c.wbuf.capacity()), (0, 0));
        assert_eq!(cache.cached(), 2);
        assert!(!cache.reclaim(&mut c), "nothing left to take");
        // The next loan reuses them; a buffer that grew is freed rather than cached.
        cache.lend(&mut c);
        assert_eq!(cache.cached(), 0);
        c.wbuf.reserve(4 * BASE_BUFFER);
        let grown = c.wbuf.capacity();
        assert!(cache.reclaim(&mut c));
        assert_eq!(
            cache.cached(),
            1,
            "only the base-sized input buffer is kept"
        );
        assert_eq!(cache.take_freed(), grown, "the grown one was freed");
        // The cache is bounded; what does not fit is freed.
        for _ in 0..2 * CACHED_BUFFERS {
            cache.give(Vec::with_capacity(BASE_BUFFER));
        }
        assert_eq!(cache.cached(), CACHED_BUFFERS);
        // It held one: 255 of the 512 fit.
        assert_eq!(cache.take_freed(), (CACHED_BUFFERS + 1) * BASE_BUFFER);
    }
}
