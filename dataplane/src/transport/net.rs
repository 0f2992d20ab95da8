//! The userspace transport: one core's [`crate::net::Stack`] over its NIC queue, seen as the
//! [`StreamStack`] the userspace core loop drives.
//!
//! A thin mapping: `NetEvent::Accepted`/`Readable`/`Writable`/`Closed` become [`StreamEvent`]s
//! (`Connected` is for clients and does not occur on a server), `NetError::Full` from `send` is
//! "took nothing" (a `Writable` follows), `NetError::Closed` from `recv` is end of input, any
//! other error is a broken connection.
//!
//! Thread model: owned by one core, like the stack.

use std::net::IpAddr;
use std::time::Instant;

use pgline_nic::Queue;

use crate::net::{ConnId, NetError, NetEvent, Stack};

use super::stream::{StreamCounters, StreamError, StreamEvent, StreamStack};

pub struct NetStream<Q: Queue> {
    stack: Stack<Q>,
    events: Vec<NetEvent>,
}

impl<Q: Queue> NetStream<Q> {
    pub fn new(stack: Stack<Q>) -> Self {
        NetStream {
            stack,
            events: Vec::with_capacity(1024),
        }
    }

    /// The stack (for its counters).
    pub fn stack(&self) -> &Stack<Q> {
        &self.stack
    }
}

impl<Q: Queue> StreamStack for NetStream<Q> {
    type Id = ConnId;

    fn listen(&mut self, port: u16) {
        self.stack.listen(port);
    }

    fn poll(&mut self, now: Instant, events: &mut Vec<StreamEvent<ConnId>>) -> bool {
        self.events.clear();
        let worked = self.stack.poll(now, &mut self.events);
        events.extend(self.events.iter().filter_map(|e| match *e {
            NetEvent::Accepted { id, listener } => {
                Some(StreamEvent::Accepted { id, port: listener })
            }
            NetEvent::Readable(id) => Some(StreamEvent::Readable(id)),
            NetEvent::Writable(id) => Some(StreamEvent::Writable(id)),
            NetEvent::Closed(id) => Some(StreamEvent::Closed(id)),
            NetEvent::Connected(_) => None,
        }));
        worked
    }

    #[inline]
    fn recv(&mut self, id: ConnId, out: &mut Vec<u8>, max: usize) -> Result<usize, StreamError> {
        match self.stack.recv(id, out, max) {
            Ok(n) => Ok(n),
            Err(NetError::Closed) => Err(StreamError::Closed),
            Err(_) => Err(StreamError::Failed),
        }
    }

    #[inline]
    fn send(&mut self, id: ConnId, data: &[u8]) -> Result<usize, StreamError> {
        match self.stack.send(id, data) {
            Ok(n) => Ok(n),
            Err(NetError::Full) => Ok(0),
            Err(NetError::Closed) => Err(StreamError::Closed),
            Err(_) => Err(StreamError::Failed),
        }
    }

    fn close(&mut self, id: ConnId) {
        self.stack.close(id);
    }

    fn abort(&mut self, id: ConnId) {
        self.stack.abort(id);
    }

    fn flush(&mut self, now: Instant) {
        self.stack.flush(now);
    }

    fn counters(&self) -> StreamCounters {
        let s = self.stack.stats();
        StreamCounters {
            rx_frames: s.rx_frames,
            tx_frames: s.tx_frames,
            rx_dropped: s.rx_dropped_malformed
                + s.rx_dropped_checksum
                + s.rx_dropped_fragment
                + s.rx_dropped_not_ours,
            tx_dropped: s.tx_dropped_nobuf + s.tx_dropped_no_arp + s.tx_dropped_ring,
            tcp_retransmits: s.tcp_retransmits,
            tcp_buffer_waits: s.tcp_buffer_waits,
            tcp_send_stall_aborts: s.tcp_send_stall_aborts,
        }
    }

    fn peer(&self, id: ConnId) -> Option<IpAddr> {
        self.stack.peer(id).map(|a| IpAddr::V4(*a.ip()))
    }
}
