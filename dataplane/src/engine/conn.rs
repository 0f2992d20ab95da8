//! One client connection on a core: its buffers, its protocol state, and its queue of replies
//! that must leave in request order.
//!
//! Replies are composed straight into `wbuf` while nothing is waiting ahead of them. Once a
//! request is deferred to the control plane, later replies are composed into their own
//! [`Pending::Ready`] buffers behind it, and `release_ready` moves them to `wbuf` in order as
//! the deferred ones complete. That is the whole ordering rule for pipelines that mix hits and
//! misses.

use std::collections::VecDeque;

use mio::net::TcpStream;

use super::deferred::Deferred;
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
    pub name: Option<Box<[u8]>>,
    pub lib_name: Option<Box<[u8]>>,
    pub lib_ver: Option<Box<[u8]>>,
}

pub(crate) struct Conn {
    pub stream: TcpStream,
    pub session: Session,
    pub generation: u32,
    pub rbuf: Vec<u8>,
    /// Bytes of `rbuf` already parsed.
    pub rpos: usize,
    pub wbuf: Vec<u8>,
    /// Bytes of `wbuf` already written to the socket.
    pub wpos: usize,
    pub pending: VecDeque<Pending>,
    pub next_seq: u64,
    /// Stop reading; close once `wbuf` is written (QUIT, protocol error).
    pub closing: bool,
    /// The client shut down its sending side: no more input will come.
    pub eof: bool,
    /// epoll reported the peer's FIN (or an error); `eof` is set once the 0-byte read is seen.
    pub peer_closed: bool,
    /// The socket may have unread bytes (edge-triggered readiness not yet drained).
    pub readable: bool,
    /// The socket refused part of `wbuf`; wait for a writable event.
    pub write_blocked: bool,
    /// Already on the core's active list.
    pub active: bool,
}

impl Conn {
    pub fn new(stream: TcpStream, client_id: u64, generation: u32, authenticated: bool) -> Conn {
        Conn {
            stream,
            session: Session {
                client_id,
                proto: Protocol::Resp2,
                authenticated,
                name: None,
                lib_name: None,
                lib_ver: None,
            },
            generation,
            rbuf: Vec::with_capacity(16 * 1024),
            rpos: 0,
            wbuf: Vec::with_capacity(16 * 1024),
            wpos: 0,
            pending: VecDeque::new(),
            next_seq: 0,
            closing: false,
            eof: false,
            peer_closed: false,
            readable: true,
            write_blocked: false,
            active: false,
        }
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
