//! An in-process byte-pipe "TCP stack" for driving the userspace core loop without packets:
//! each connection is two byte queues behind one mutex, the client side is a plain handle.
//! It keeps the `StreamStack` contract (events, EOF as `Err(Closed)`, partial sends with a
//! `Writable` once room frees up), so the loop's ordering, limits and close paths are exercised
//! exactly as over the real stack.
#![allow(dead_code)]

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pgline_dataplane::transport::stream::{StreamError, StreamEvent, StreamStack};

#[derive(Default)]
struct Pipe {
    c2s: VecDeque<u8>,
    s2c: VecDeque<u8>,
    accepted: bool,
    client_fin: bool,
    eof_seen: bool,
    server_fin: bool,
    server_abort: bool,
    client_reset: bool,
    blocked: bool,
    /// The server port the client connected to.
    port: u16,
}

/// The port [`Client::connect`] connects to (`rig::engine_config`'s listen port).
pub const RESP_PORT: u16 = 6380;

#[derive(Default)]
pub struct Net {
    pipes: Mutex<HashMap<u32, Pipe>>,
    next: Mutex<u32>,
}

/// The server side, owned by the core.
pub struct PipeStack {
    net: Arc<Net>,
    /// Bytes the server may have queued toward a client before `send` takes less.
    send_room: usize,
    /// The ports `listen` was called for.
    pub listening: Vec<u16>,
}

impl PipeStack {
    pub fn new(send_room: usize) -> (PipeStack, Arc<Net>) {
        let net = Arc::new(Net::default());
        (
            PipeStack {
                net: net.clone(),
                send_room,
                listening: Vec::new(),
            },
            net,
        )
    }
}

impl StreamStack for PipeStack {
    type Id = u32;

    fn listen(&mut self, port: u16) {
        self.listening.push(port);
    }

    fn poll(&mut self, _now: Instant, events: &mut Vec<StreamEvent<u32>>) -> bool {
        let mut pipes = self.net.pipes.lock().unwrap();
        let before = events.len();
        let mut gone = Vec::new();
        for (&id, p) in pipes.iter_mut() {
            if p.client_reset {
                events.push(StreamEvent::Closed(id));
                gone.push(id);
                continue;
            }
            if !p.accepted && self.listening.contains(&p.port) {
                p.accepted = true;
                events.push(StreamEvent::Accepted { id, port: p.port });
            } else if !p.c2s.is_empty() || (p.client_fin && !p.eof_seen) {
                events.push(StreamEvent::Readable(id));
            }
            if p.blocked && p.s2c.len() < self.send_room {
                p.blocked = false;
                events.push(StreamEvent::Writable(id));
            }
        }
        for id in gone {
            pipes.remove(&id);
        }
        events.len() > before
    }

    fn recv(&mut self, id: u32, out: &mut Vec<u8>, max: usize) -> Result<usize, StreamError> {
        let mut pipes = self.net.pipes.lock().unwrap();
        let p = pipes.get_mut(&id).ok_or(StreamError::Failed)?;
        let n = p.c2s.len().min(max);
        out.extend(p.c2s.drain(..n));
        if n == 0 && p.client_fin {
            p.eof_seen = true;
            return Err(StreamError::Closed);
        }
        Ok(n)
    }

    fn send(&mut self, id: u32, data: &[u8]) -> Result<usize, StreamError> {
        let mut pipes = self.net.pipes.lock().unwrap();
        let p = pipes.get_mut(&id).ok_or(StreamError::Failed)?;
        if p.server_fin || p.server_abort {
            return Err(StreamError::Closed);
        }
        let n = data.len().min(self.send_room.saturating_sub(p.s2c.len()));
        p.s2c.extend(&data[..n]);
        if n < data.len() {
            p.blocked = true;
        }
        Ok(n)
    }

    fn close(&mut self, id: u32) {
        if let Some(p) = self.net.pipes.lock().unwrap().get_mut(&id) {
            p.server_fin = true;
        }
    }

    fn abort(&mut self, id: u32) {
        if let Some(p) = self.net.pipes.lock().unwrap().get_mut(&id) {
            p.server_abort = true;
        }
    }

    fn flush(&mut self, _now: Instant) {}
}

/// The client end of one connection.
pub struct Client {
    net: Arc<Net>,
    pub id: u32,
}

impl Client {
    /// Connects to [`RESP_PORT`].
    pub fn connect(net: &Arc<Net>) -> Client {
        Client::connect_to(net, RESP_PORT)
    }

    /// Connects to `port` (accepted once the server listens on it).
    pub fn connect_to(net: &Arc<Net>, port: u16) -> Client {
        let id = {
            let mut next = net.next.lock().unwrap();
            *next += 1;
            *next
        };
        let pipe = Pipe {
            port,
            ..Pipe::default()
        };
        net.pipes.lock().unwrap().insert(id, pipe);
        Client {
            net: net.clone(),
            id,
        }
    }

    pub fn send(&self, bytes: &[u8]) {
        let mut pipes = self.net.pipes.lock().unwrap();
        pipes.get_mut(&self.id).unwrap().c2s.extend(bytes);
    }

    /// Half-close: no more requests.
    pub fn shutdown_write(&self) {
        let mut pipes = self.net.pipes.lock().unwrap();
        pipes.get_mut(&self.id).unwrap().client_fin = true;
    }

    /// Resets the connection.
    pub fn reset(&self) {
        let mut pipes = self.net.pipes.lock().unwrap();
        if let Some(p) = pipes.get_mut(&self.id) {
            p.client_reset = true;
        }
    }

    /// One PostgreSQL backend message: (tag, whole message).
    pub fn read_pg_message(&self) -> (u8, Vec<u8>) {
        let mut msg = self.read_exact(5, usize::MAX);
        let len = u32::from_be_bytes([msg[1], msg[2], msg[3], msg[4]]) as usize;
        msg.extend(self.read_exact(len - 4, usize::MAX));
        (msg[0], msg)
    }

    /// PostgreSQL backend messages up to ReadyForQuery, included.
    pub fn read_pg_until_ready(&self) -> Vec<u8> {
        let mut all = Vec::new();
        loop {
            let (tag, msg) = self.read_pg_message();
            all.extend(msg);
            if tag == b'Z' {
                return all;
            }
        }
    }

    /// Exactly `n` bytes, reading slowly in chunks of at most `chunk` (panics after 10 s).
    pub fn read_exact(&self, n: usize, chunk: usize) -> Vec<u8> {
        let until = Instant::now() + Duration::from_secs(10);
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            {
                let mut pipes = self.net.pipes.lock().unwrap();
                let p = pipes.get_mut(&self.id).expect("connection exists");
                let take = p.s2c.len().min(n - out.len()).min(chunk);
                out.extend(p.s2c.drain(..take));
                if take == 0 && (p.server_fin || p.server_abort) {
                    panic!(
                        "server closed after {} of {n} bytes: {:?}",
                        out.len(),
                        String::from_utf8_lossy(&out)
                    );
                }
            }
            assert!(
                Instant::now() < until,
                "timed out after {} of {n} bytes: {:?}",
                out.len(),
                String::from_utf8_lossy(&out)
            );
            std::thread::yield_now();
        }
        out
    }

    /// Everything until the server closes (FIN or abort); returns it and whether it was a FIN.
    pub fn read_to_close(&self) -> (Vec<u8>, bool) {
        let until = Instant::now() + Duration::from_secs(10);
        let mut out = Vec::new();
        loop {
            {
                let mut pipes = self.net.pipes.lock().unwrap();
                let p = pipes.get_mut(&self.id).expect("connection exists");
                out.extend(p.s2c.drain(..));
                if p.server_fin || p.server_abort {
                    return (out, p.server_fin);
                }
            }
            assert!(
                Instant::now() < until,
                "server never closed; got {:?}",
                String::from_utf8_lossy(&out)
            );
            std::thread::yield_now();
        }
    }

    /// Whether the server closed this connection.
    pub fn server_closed(&self) -> bool {
        let pipes = self.net.pipes.lock().unwrap();
        pipes
            .get(&self.id)
            .is_none_or(|p| p.server_fin || p.server_abort)
    }
}
