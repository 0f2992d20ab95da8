//! A test client on the far end of an in-memory port: a `net::Stack` driven by the test thread,
//! with flows that send a request stream and collect the reply stream. Buffers are reused, so a
//! steady-state round allocates nothing.
#![allow(dead_code)]

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use pgline_dataplane::net::{ConnId, NetConfig, NetError, NetEvent, Stack};
use pgline_nic::mem::MemQueue;

pub const SERVER_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
pub const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
pub const PORT: u16 = 6380;

/// One client connection.
pub struct Flow {
    pub id: ConnId,
    pub connected: bool,
    pub closed: bool,
    /// Bytes to send, and how many were sent.
    pub out: Vec<u8>,
    pub sent: usize,
    /// Bytes received so far.
    pub got: Vec<u8>,
    /// The peer finished sending.
    pub eof: bool,
}

pub struct Wire {
    pub stack: Stack<MemQueue>,
    events: Vec<NetEvent>,
    pub flows: Vec<Flow>,
}

impl Wire {
    pub fn new(queue: MemQueue, max_connections: usize) -> Wire {
        let mut cfg = NetConfig::new(CLIENT_IP, 24);
        cfg.max_connections = max_connections;
        // The client runs smoltcp's TCP: an independent implementation against the server's.
        cfg.owned_tcp = false;
        Wire {
            stack: Stack::new(queue, cfg).expect("client stack"),
            events: Vec::with_capacity(1024),
            flows: Vec::new(),
        }
    }

    /// Opens `n` connections to the appliance (handshakes complete in later turns).
    pub fn open(&mut self, n: usize) {
        for _ in 0..n {
            let id = self
                .stack
                .connect(SocketAddrV4::new(SERVER_IP, PORT), 0)
                .expect("connect");
            self.flows.push(Flow {
                id,
                connected: false,
                closed: false,
                out: Vec::new(),
                sent: 0,
                got: Vec::new(),
                eof: false,
            });
        }
    }

    fn flow(&mut self, id: ConnId) -> Option<&mut Flow> {
        self.flows.iter_mut().find(|f| f.id == id)
    }

    /// One turn: receive, note events, send what is queued, read what arrived, transmit.
    pub fn turn(&mut self) {
        let now = Instant::now();
        self.events.clear();
        self.stack.poll(now, &mut self.events);
        for i in 0..self.events.len() {
            match self.events[i] {
                NetEvent::Connected(id) => {
                    if let Some(f) = self.flow(id) {
                        f.connected = true;
                    }
                }
                NetEvent::Closed(id) => {
                    if let Some(f) = self.flow(id) {
                        f.closed = true;
                    }
                }
                _ => {}
            }
        }
        for f in self.flows.iter_mut().filter(|f| f.connected && !f.closed) {
            if f.sent < f.out.len() {
                match self.stack.send(f.id, &f.out[f.sent..]) {
                    Ok(n) => f.sent += n,
                    Err(NetError::Full) => {}
                    Err(e) => panic!("client send: {e}"),
                }
            }
            loop {
                match self.stack.recv(f.id, &mut f.got, 1 << 16) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(_) => {
                        f.eof = true;
                        break;
                    }
                }
            }
        }
        self.stack.flush(now);
    }

    /// Turns until `done(self)` holds; panics after `limit`.
    pub fn run_until(&mut self, limit: Duration, what: &str, done: impl Fn(&Wire) -> bool) {
        let until = Instant::now() + limit;
        while !done(self) {
            self.turn();
            assert!(Instant::now() < until, "timed out waiting for {what}");
            std::thread::yield_now();
        }
    }

    /// Turns until every flow received at least `want(i)` bytes.
    pub fn run_until_received(&mut self, limit: Duration, want: impl Fn(usize) -> usize) {
        let until = Instant::now() + limit;
        loop {
            let pending = self
                .flows
                .iter()
                .enumerate()
                .find(|(i, f)| f.got.len() < want(*i));
            let Some((i, f)) = pending else { return };
            if Instant::now() >= until {
                panic!(
                    "flow {i}: {} of {} reply bytes after {limit:?} (sent {} of {}): {:?}",
                    f.got.len(),
                    want(i),
                    f.sent,
                    f.out.len(),
                    String::from_utf8_lossy(&f.got)
                );
            }
            self.turn();
            std::thread::yield_now();
        }
    }
}
