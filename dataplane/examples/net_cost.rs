//! Per-request cost of the userspace stack at several connection counts (not a benchmark of
//! record: `bench/` is).
//!
//! Two stacks in one thread joined by an in-memory pair; the client keeps one small request
//! outstanding on each of N connections, the server answers each with 166 bytes. The server's
//! CPU time (poll + recv/send + flush, thread CPU clock, so time the thread spends preempted on a
//! shared machine is not counted) is measured separately from the client's and divided by the
//! number of requests answered.
//!
//! `cargo run --release -p pgline-dataplane --example net_cost [conns...] [--secs S]`
#![deny(unsafe_code)]

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use pgline_dataplane::net::{ConnId, NetConfig, NetEvent, Stack};
use pgline_nic::mem::{self, MemConfig};

const REQ: &[u8] = b"*2\r\n$3\r\nGET\r\n$8\r\nusers:42\r\n";

fn main() {
    let mut counts = Vec::new();
    let mut secs = 2.0;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--secs" {
            secs = args.next().and_then(|s| s.parse().ok()).unwrap_or(secs);
        } else if let Ok(n) = a.parse() {
            counts.push(n);
        }
    }
    if counts.is_empty() {
        counts = vec![16, 256, 1024];
    }
    for n in counts {
        run(n, Duration::from_secs_f64(secs));
    }
}

fn run(conns: usize, dur: Duration) {
    let reply = vec![b'x'; 166];
    let (a, b) = mem::pair(MemConfig::default());
    let scfg = NetConfig {
        max_connections: conns + 16,
        rx_burst: 32,
        ..NetConfig::new(Ipv4Addr::new(10, 0, 0, 1), 24)
    };
    let ccfg = NetConfig {
        ip: Ipv4Addr::new(10, 0, 0, 2),
        ..scfg
    };
    let mut server = Stack::new(a, scfg).expect("server");
    let mut client = Stack::new(b, ccfg).expect("client");
    server.listen(6379);
    let dst = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), 6379);
    let ids: Vec<ConnId> = (0..conns)
        .map(|_| client.connect(dst, 0).expect("connect"))
        .collect();
    let mut sev = Vec::with_capacity(4096);
    let mut cev = Vec::with_capacity(4096);
    let mut buf = Vec::with_capacity(65536);
    let mut ready = Vec::with_capacity(conns);
    // Handshakes.
    let mut connected = 0;
    while connected < conns {
        let now = Instant::now();
        sev.clear();
        server.poll(now, &mut sev);
        server.flush(now);
        cev.clear();
        client.poll(now, &mut cev);
        connected += cev
            .iter()
            .filter(|e| matches!(e, NetEvent::Connected(_)))
            .count();
        client.flush(now);
    }
    for &id in &ids {
        client.send(id, REQ).expect("first request");
    }
    let start = Instant::now();
    let mut server_time = Duration::ZERO;
    let mut answered = 0u64;
    let stats0 = *server.stats();
    while start.elapsed() < dur {
        // Server turn (timed).
        let t0 = Instant::now();
        let c0 = thread_cpu();
        sev.clear();
        server.poll(t0, &mut sev);
        for ev in &sev {
            if let NetEvent::Readable(id) = *ev {
                buf.clear();
                if let Ok(n) = server.recv(id, &mut buf, 65536) {
                    let reqs = n / REQ.len();
                    for _ in 0..reqs {
                        let _ = server.send(id, &reply);
                    }
                    answered += reqs as u64;
                }
            }
        }
        server.flush(t0);
        server_time += thread_cpu().saturating_sub(c0);
        // Client turn: read replies, send the next request on each connection that got one.
        let now = Instant::now();
        cev.clear();
        client.poll(now, &mut cev);
        ready.clear();
        for ev in &cev {
            if let NetEvent::Readable(id) = *ev {
                ready.push(id);
            }
        }
        for &id in &ready {
            buf.clear();
            if let Ok(n) = client.recv(id, &mut buf, 65536) {
                for _ in 0..n / reply.len() {
                    let _ = client.send(id, REQ);
                }
            }
        }
        client.flush(now);
    }
    let wall = start.elapsed();
    let st = server.stats();
    let frames = (st.rx_frames - stats0.rx_frames) + (st.tx_frames - stats0.tx_frames);
    println!(
        "conns {conns:5}: {answered:9} requests in {:.2}s wall, server {:.0} ns/request ({:.0} ns/frame, {:.2} M req/s of server time), retransmits {} (handshake phase: {})",
        wall.as_secs_f64(),
        server_time.as_nanos() as f64 / answered.max(1) as f64,
        server_time.as_nanos() as f64 / frames.max(1) as f64,
        answered as f64 / server_time.as_secs_f64() / 1e6,
        st.tcp_retransmits - stats0.tcp_retransmits,
        stats0.tcp_retransmits,
    );
}

/// This thread's CPU time.
#[allow(unsafe_code)]
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_THREAD_CPUTIME_ID needs nothing else.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}
