//! The baseline `net_cost` is compared with: the naive use of smoltcp on the server, one
//! `Interface` over a `SocketSet` of N listening sockets (one per expected connection, since a
//! smoltcp listening socket takes one connection), the application scanning every socket each
//! turn. The client is our `Stack`, as in `net_cost`; only the server's thread CPU time counts.
//!
//! `cargo run --release -p pgline-dataplane --example net_naive [conns...] [--secs S]`
#![deny(unsafe_code)]

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use pgline_dataplane::net::{ConnId, NetConfig, NetEvent, Stack};
use pgline_nic::mem::{self, MemConfig, MemPacket, MemQueue};
use pgline_nic::{Packet, Queue};
use smoltcp::iface::{Config, Interface, SocketSet};
use smoltcp::phy::{self, Checksum, DeviceCapabilities, Medium};
use smoltcp::socket::tcp;
use smoltcp::time::Instant as SInstant;
use smoltcp::wire::{HardwareAddress, IpCidr};

const REQ: &[u8] = b"*2\r\n$3\r\nGET\r\n$8\r\nusers:42\r\n";
const SERVER_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);

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

/// The naive server's device: Ethernet framing around smoltcp's IP packets, ARP answered here.
struct Dev {
    q: MemQueue,
    rx: Vec<MemPacket>,
    tx: Vec<MemPacket>,
    peer_mac: [u8; 6],
}

struct Rx(MemPacket);
struct Tx<'a>(&'a mut Dev);

impl phy::RxToken for Rx {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(&self.0.data()[14..])
    }
}

impl phy::TxToken for Tx<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let dev = self.0;
        let mut p = dev.q.alloc().expect("pool");
        p.set_len(14 + len);
        let mac = dev.q.mac();
        let d = p.data_mut();
        d[0..6].copy_from_slice(&dev.peer_mac);
        d[6..12].copy_from_slice(&mac);
        d[12..14].copy_from_slice(&[8, 0]);
        let r = f(&mut d[14..]);
        dev.tx.push(p);
        r
    }
}

impl phy::Device for Dev {
    type RxToken<'a> = Rx;
    type TxToken<'a> = Tx<'a>;
    fn receive(&mut self, _: SInstant) -> Option<(Rx, Tx<'_>)> {
        loop {
            let p = self.rx.pop()?;
            if p.data().len() >= 42 && p.data()[12..14] == [8, 6] {
                self.answer_arp(&p);
                continue;
            }
            return Some((Rx(p), Tx(self)));
        }
    }
    fn transmit(&mut self, _: SInstant) -> Option<Tx<'_>> {
        Some(Tx(self))
    }
    fn capabilities(&self) -> DeviceCapabilities {
        let mut c = DeviceCapabilities::default();
        c.medium = Medium::Ip;
        c.max_transmission_unit = 1500;
        c.checksum.ipv4 = Checksum::Both;
        c.checksum.tcp = Checksum::Both;
        c
    }
}

impl Dev {
    fn answer_arp(&mut self, req: &MemPacket) {
        let r = req.data();
        if r[21] != 1 || r[38..42] != SERVER_IP.octets() {
            return;
        }
        self.peer_mac.copy_from_slice(&r[22..28]);
        let mac = self.q.mac();
        let mut p = self.q.alloc().expect("pool");
        p.set_len(60);
        let d = p.data_mut();
        d.fill(0);
        d[0..6].copy_from_slice(&r[22..28]);
        d[6..12].copy_from_slice(&mac);
        d[12..14].copy_from_slice(&[8, 6]);
        d[14..20].copy_from_slice(&[0, 1, 8, 0, 6, 4]);
        d[20..22].copy_from_slice(&[0, 2]);
        d[22..28].copy_from_slice(&mac);
        d[28..32].copy_from_slice(&SERVER_IP.octets());
        d[32..42].copy_from_slice(&r[22..32]);
        self.tx.push(p);
    }
}

fn run(conns: usize, dur: Duration) {
    let reply = vec![b'x'; 166];
    let (a, b) = mem::pair(MemConfig::default());
    let epoch = Instant::now();
    let snow = |t: Instant| SInstant::from_micros(t.duration_since(epoch).as_micros() as i64);
    let mut dev = Dev {
        q: a,
        rx: Vec::with_capacity(64),
        tx: Vec::with_capacity(4096),
        peer_mac: [0; 6],
    };
    let mut iface = Interface::new(Config::new(HardwareAddress::Ip), &mut dev, snow(epoch));
    iface.update_ip_addrs(|a| {
        let _ = a.push(IpCidr::new(SERVER_IP.into(), 24));
    });
    let mut sockets = SocketSet::new(Vec::new());
    let handles: Vec<_> = (0..conns)
        .map(|_| {
            let mut s = tcp::Socket::new(
                tcp::SocketBuffer::new(vec![0; 16384]),
                tcp::SocketBuffer::new(vec![0; 32768]),
            );
            s.set_nagle_enabled(false);
            s.listen(6379).expect("listen");
            sockets.add(s)
        })
        .collect();
    let ccfg = NetConfig {
        max_connections: conns + 16,
        ..NetConfig::new(Ipv4Addr::new(10, 0, 0, 2), 24)
    };
    let mut client = Stack::new(b, ccfg).expect("client");
    let dst = SocketAddrV4::new(SERVER_IP, 6379);
    let ids: Vec<ConnId> = (0..conns)
        .map(|_| client.connect(dst, 0).expect("connect"))
        .collect();
    let mut cev = Vec::with_capacity(4096);
    let mut buf = Vec::with_capacity(65536);
    let mut scratch = vec![0u8; 16384];
    let mut server_turn =
        |dev: &mut Dev, iface: &mut Interface, sockets: &mut SocketSet, now: Instant| {
            dev.q.rx_burst(&mut dev.rx, 32);
            dev.rx.reverse();
            iface.poll(snow(now), dev, sockets);
            let mut answered = 0;
            for &h in &handles {
                let s = sockets.get_mut::<tcp::Socket>(h);
                if s.can_recv() {
                    // Whole requests only (the ring may wrap inside one).
                    let whole = s.recv_queue() / REQ.len() * REQ.len();
                    let whole = whole.min(16384);
                    let n = s.recv_slice(&mut scratch[..whole]).unwrap_or(0);
                    for _ in 0..n / REQ.len() {
                        let _ = s.send_slice(&reply);
                        answered += 1;
                    }
                }
            }
            iface.poll(snow(now), dev, sockets);
            dev.q.tx_burst(&mut dev.tx);
            answered
        };
    let mut connected = 0;
    while connected < conns {
        let now = Instant::now();
        server_turn(&mut dev, &mut iface, &mut sockets, now);
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
    let mut turns = 0u64;
    while start.elapsed() < dur {
        turns += 1;
        let c0 = thread_cpu();
        answered += server_turn(&mut dev, &mut iface, &mut sockets, Instant::now());
        server_time += thread_cpu().saturating_sub(c0);
        let now = Instant::now();
        cev.clear();
        client.poll(now, &mut cev);
        for ev in &cev {
            if let NetEvent::Readable(id) = *ev {
                buf.clear();
                if let Ok(n) = client.recv(id, &mut buf, 65536) {
                    for _ in 0..n / reply.len() {
                        let _ = client.send(id, REQ);
                    }
                }
            }
        }
        client.flush(now);
    }
    println!(
        "naive conns {conns:5}: {answered:9} requests in {turns} turns, server {:.0} ns/request ({:.2} M req/s of server time)",
        server_time.as_nanos() as f64 / answered.max(1) as f64,
        answered as f64 / server_time.as_secs_f64() / 1e6,
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
