//! The userspace stack allocates nothing in steady state: request/response traffic on open
//! connections, and connection churn once the slots exist (a counting global allocator watches).

use std::alloc::System;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use pgline_dataplane::net::{ConnId, NetConfig, NetEvent, Stack};
use pgline_nic::mem::{self, MemConfig, MemQueue};
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const REQ: &[u8] = b"*2\r\n$3\r\nGET\r\n$8\r\nusers:42\r\n";

struct Pair {
    server: Stack<MemQueue>,
    client: Stack<MemQueue>,
    now: Instant,
    sev: Vec<NetEvent>,
    cev: Vec<NetEvent>,
    buf: Vec<u8>,
    reply: Vec<u8>,
    answered: u64,
}

impl Pair {
    /// One turn: the server answers every request it reads, the client sends the next request
    /// on each connection that got a reply, and counts connects/closes.
    fn turn(&mut self, connected: &mut usize, closed: &mut usize) {
        self.now += Duration::from_micros(200);
        self.sev.clear();
        self.server.poll(self.now, &mut self.sev);
        for i in 0..self.sev.len() {
            match self.sev[i] {
                NetEvent::Readable(id) => {
                    self.buf.clear();
                    match self.server.recv(id, &mut self.buf, 4096) {
                        Ok(n) => {
                            for _ in 0..n / REQ.len() {
                                let _ = self.server.send(id, &self.reply);
                                self.answered += 1;
                            }
                        }
                        Err(_) => self.server.close(id),
                    }
                }
                NetEvent::Closed(_) => {}
                _ => {}
            }
        }
        self.server.flush(self.now);
        self.cev.clear();
        self.client.poll(self.now, &mut self.cev);
        for i in 0..self.cev.len() {
            match self.cev[i] {
                NetEvent::Connected(id) => {
                    *connected += 1;
                    let _ = self.client.send(id, REQ);
                }
                NetEvent::Readable(id) => {
                    self.buf.clear();
                    if let Ok(n) = self.client.recv(id, &mut self.buf, 4096) {
                        for _ in 0..n / self.reply.len() {
                            let _ = self.client.send(id, REQ);
                        }
                    }
                }
                NetEvent::Closed(_) => *closed += 1,
                _ => {}
            }
        }
        self.client.flush(self.now);
    }
}

#[test]
fn steady_state_and_churn_allocate_nothing() {
    let (a, b) = mem::pair(MemConfig::default());
    let scfg = NetConfig {
        rx_buffer: 4096,
        tx_buffer: 8192,
        max_connections: 128,
        // `net_zero_alloc_owned` runs this again with our own TCP on both stacks.
        owned_tcp: env!("CARGO_CRATE_NAME") == "net_zero_alloc_owned",
        ..NetConfig::new(Ipv4Addr::new(10, 0, 0, 1), 24)
    };
    let ccfg = NetConfig {
        ip: Ipv4Addr::new(10, 0, 0, 2),
        ..scfg
    };
    let mut p = Pair {
        server: Stack::new(a, scfg).expect("server"),
        client: Stack::new(b, ccfg).expect("client"),
        now: Instant::now(),
        sev: Vec::with_capacity(4096),
        cev: Vec::with_capacity(4096),
        buf: Vec::with_capacity(8192),
        reply: vec![b'v'; 166],
        answered: 0,
    };
    p.server.listen(6379);
    let dst = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), 6379);
    let (mut connected, mut closed) = (0, 0);
    // Warm-up: 64 connections, traffic, then all closed, so every slot has existed once.
    let mut ids: Vec<ConnId> = Vec::with_capacity(64);
    ids.extend((0..64).map(|_| p.client.connect(dst, 0).expect("connect")));
    for _ in 0..2000 {
        p.turn(&mut connected, &mut closed);
    }
    assert_eq!(connected, 64);
    for &id in &ids {
        p.client.close(id);
    }
    for _ in 0..2000 {
        p.turn(&mut connected, &mut closed);
    }
    assert_eq!(p.client.open_connections(), 0);
    assert_eq!(p.server.open_connections(), 0);

    // Measured: reconnect 64, serve, close them again.
    let region = Region::new(GLOBAL);
    let answered0 = p.answered;
    ids.clear();
    for _ in 0..64 {
        ids.push(p.client.connect(dst, 0).expect("connect"));
    }
    for _ in 0..3000 {
        p.turn(&mut connected, &mut closed);
    }
    for &id in &ids {
        p.client.close(id);
    }
    for _ in 0..2000 {
        p.turn(&mut connected, &mut closed);
    }
    let stats = region.change();
    let served = p.answered - answered0;
    assert_eq!(connected, 128);
    assert_eq!(p.client.open_connections(), 0);
    assert!(served > 10_000, "served {served}");
    assert_eq!(
        stats.allocations, 0,
        "{served} requests and 64 connections opened and closed: {stats:?}"
    );
}
