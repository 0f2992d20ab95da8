//! The userspace stack end to end: two `Stack`s joined by an in-memory port pair, a client that
//! connects and an echo server, on simulated time (each step advances the clock by `STEP`).

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use pgline_dataplane::net::{ConnId, NetConfig, NetError, NetEvent, Stack};
use pgline_nic::mem::{self, Faults, MemConfig, MemQueue};
use pgline_nic::{Packet, Queue};

const SERVER_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const PORT: u16 = 6379;
const STEP: Duration = Duration::from_micros(500);

fn cfg(ip: Ipv4Addr, max: usize) -> NetConfig {
    NetConfig {
        rx_buffer: 4096,
        tx_buffer: 8192,
        max_connections: max,
        rx_burst: 64,
        // `net_stack_owned` runs these tests again with our own TCP on the server.
        owned_tcp: ip == SERVER_IP && env!("CARGO_CRATE_NAME") == "net_stack_owned",
        ..NetConfig::new(ip, 24)
    }
}

struct World {
    server: Stack<MemQueue>,
    client: Stack<MemQueue>,
    now: Instant,
    echo: Echo,
    sev: Vec<NetEvent>,
    cev: Vec<NetEvent>,
}

/// Echo server: everything read is written back; EOF closes.
#[derive(Default)]
struct Echo {
    out: HashMap<ConnId, Vec<u8>>,
    eof: HashMap<ConnId, bool>,
    accepted: usize,
    closed: usize,
}

impl World {
    fn new(mem: MemConfig, server_max: usize, client_max: usize) -> World {
        World::with_configs(mem, cfg(SERVER_IP, server_max), cfg(CLIENT_IP, client_max))
    }

    fn with_configs(mem: MemConfig, scfg: NetConfig, ccfg: NetConfig) -> World {
        let (a, b) = mem::pair(mem);
        let now = Instant::now();
        let mut server = Stack::new(a, scfg).expect("server config");
        server.listen(PORT);
        let client = Stack::new(b, ccfg).expect("client config");
        World {
            server,
            client,
            now,
            echo: Echo::default(),
            sev: Vec::new(),
            cev: Vec::new(),
        }
    }

    /// One turn of both sides; returns the client's events.
    fn step(&mut self) -> Vec<NetEvent> {
        self.now += STEP;
        self.sev.clear();
        self.server.poll(self.now, &mut self.sev);
        let evs = std::mem::take(&mut self.sev);
        self.serve(&evs);
        self.sev = evs;
        self.server.flush(self.now);
        self.cev.clear();
        self.client.poll(self.now, &mut self.cev);
        self.client.flush(self.now);
        self.cev.clone()
    }

    fn serve(&mut self, evs: &[NetEvent]) {
        let mut buf = Vec::with_capacity(8192);
        for ev in evs {
            match *ev {
                NetEvent::Accepted { id, listener } => {
                    assert_eq!(listener, PORT);
                    self.echo.accepted += 1;
                    self.echo.out.insert(id, Vec::new());
                }
                NetEvent::Readable(id) => loop {
                    buf.clear();
                    match self.server.recv(id, &mut buf, 8192) {
                        Ok(0) => break,
                        Ok(_) => self.echo.out.entry(id).or_default().extend_from_slice(&buf),
                        Err(NetError::Closed) => {
                            self.echo.eof.insert(id, true);
                            break;
                        }
                        Err(e) => panic!("server recv {e:?}"),
                    }
                },
                NetEvent::Closed(id) => {
                    self.echo.closed += 1;
                    self.echo.out.remove(&id);
                    self.echo.eof.remove(&id);
                }
                _ => {}
            }
        }
        let ids: Vec<ConnId> = self.echo.out.keys().copied().collect();
        for id in ids {
            let out = self.echo.out.get_mut(&id).expect("listed");
            if !out.is_empty() {
                match self.server.send(id, out) {
                    Ok(n) => {
                        out.drain(..n);
                    }
                    Err(NetError::Full) => {}
                    Err(e) => panic!("server send {e:?}"),
                }
            }
            if out.is_empty() && self.echo.eof.get(&id) == Some(&true) {
                self.echo.eof.insert(id, false);
                self.server.close(id);
            }
        }
    }
}

/// A client connection sending `data` and expecting it back.
struct Flow {
    id: ConnId,
    data: Vec<u8>,
    sent: usize,
    got: Vec<u8>,
    connected: bool,
    closed: bool,
}

fn payload(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Opens `n` connections each echoing `len` bytes sent in pieces of `chunk`, until all bytes came
/// back or `max_steps` passed. Returns the flows.
fn run_echo(w: &mut World, n: usize, len: usize, chunk: usize, max_steps: usize) -> Vec<Flow> {
    let server = SocketAddrV4::new(SERVER_IP, PORT);
    let mut flows: Vec<Flow> = (0..n)
        .map(|i| Flow {
            id: w.client.connect(server, 0).expect("connect"),
            data: payload(i as u64, len),
            sent: 0,
            got: Vec::new(),
            connected: false,
            closed: false,
        })
        .collect();
    let index: HashMap<ConnId, usize> = flows.iter().enumerate().map(|(i, f)| (f.id, i)).collect();
    let mut buf = Vec::new();
    for _ in 0..max_steps {
        let evs = w.step();
        for ev in evs {
            match ev {
                NetEvent::Connected(id) => flows[index[&id]].connected = true,
                NetEvent::Closed(id) => flows[index[&id]].closed = true,
                _ => {}
            }
        }
        let mut done = true;
        for f in flows.iter_mut().filter(|f| f.connected && !f.closed) {
            // Request/response: the next piece goes once the previous one came back.
            if f.sent < f.data.len() && f.got.len() == f.sent {
                let end = (f.sent + chunk).min(f.data.len());
                match w.client.send(f.id, &f.data[f.sent..end]) {
                    Ok(k) => f.sent += k,
                    Err(NetError::Full) => {}
                    Err(e) => panic!("client send {e:?}"),
                }
            }
            buf.clear();
            if let Ok(k) = w.client.recv(f.id, &mut buf, 65536) {
                if k > 0 {
                    f.got.extend_from_slice(&buf);
                }
            }
        }
        for f in &flows {
            done &= f.got.len() == f.data.len();
        }
        if done {
            break;
        }
    }
    flows
}

fn assert_echoed(flows: &[Flow]) {
    for (i, f) in flows.iter().enumerate() {
        assert!(f.connected, "flow {i} connected");
        assert_eq!(f.got.len(), f.data.len(), "flow {i}: all bytes back");
        assert!(f.got == f.data, "flow {i}: bytes in order");
    }
}

/// Closes every flow with FIN and steps until both sides freed their state.
fn close_all(w: &mut World, flows: &[Flow]) {
    for f in flows {
        w.client.close(f.id);
    }
    for _ in 0..20_000 {
        w.step();
        if w.server.open_connections() == 0 && w.client.open_connections() == 0 {
            break;
        }
    }
}

#[test]
fn echo_over_1000_concurrent_connections() {
    let mut w = World::new(MemConfig::default(), 2048, 2048);
    let flows = run_echo(&mut w, 1000, 1000, 100, 20_000);
    assert_echoed(&flows);
    assert_eq!(w.server.open_connections(), 1000);
    assert_eq!(w.echo.accepted, 1000);
    for id in w.echo.out.keys() {
        let peer = w.server.peer(*id).expect("live");
        assert_eq!(*peer.ip(), CLIENT_IP);
        assert!(peer.port() >= 49152, "ephemeral port {peer}");
    }
    let st = *w.server.stats();
    assert_eq!(st.tcp_conns_accepted, 1000);
    assert_eq!(st.tcp_retransmits, 0, "no loss, no retransmission: {st:?}");
    // Our own TCP takes the echo's in-order segments on its fast path; smoltcp has none.
    let owned = env!("CARGO_CRATE_NAME") == "net_stack_owned";
    assert_eq!(st.tcp_fast_path > 0, owned, "fast path segments: {st:?}");
    assert_eq!(st.rx_dropped_checksum + st.rx_dropped_malformed, 0);
    assert_eq!(st.arp_requests_answered, 1, "the client resolved us once");
    close_all(&mut w, &flows);
    assert_eq!(w.server.open_connections(), 0);
    assert_eq!(w.client.open_connections(), 0);
    assert_eq!(w.echo.closed, 1000);
    assert_eq!(w.server.stats().tcp_conns_closed, 1000);
    // Slots are reused: a second wave allocates no new ones and works the same.
    let flows = run_echo(&mut w, 1000, 300, 100, 20_000);
    assert_echoed(&flows);
}

#[test]
fn a_dry_buffer_pool_holds_data_back_and_every_byte_still_comes_back() {
    // 64 connections send at once; the server's pools hold 4 receive and 4 send buffers.
    let scfg = NetConfig {
        conn_buffers: 4,
        ..cfg(SERVER_IP, 256)
    };
    let mut w = World::with_configs(MemConfig::default(), scfg, cfg(CLIENT_IP, 256));
    let flows = run_echo(&mut w, 64, 6000, 3000, 200_000);
    assert_echoed(&flows);
    let st = *w.server.stats();
    let (rx, tx) = w.server.buffer_pools();
    if env!("CARGO_CRATE_NAME") == "net_stack_owned" {
        assert!(st.tcp_buffer_waits > 0, "connections waited: {st:?}");
        // Receive buffers are what runs out here (the echo empties a receive ring at once, so
        // the send pool is used whole but waits only behind it).
        assert!(rx.dry > 0, "the receive pool ran dry: {rx:?}");
        assert_eq!((rx.buffers, tx.buffers), (4, 4));
        assert_eq!((rx.peak_in_use, tx.peak_in_use), (4, 4));
    } else {
        // smoltcp's sockets own their buffers: no pools.
        assert_eq!((rx.buffers, tx.buffers, st.tcp_buffer_waits), (0, 0, 0));
    }
    // Idle connections hold no buffer.
    for _ in 0..200 {
        w.step();
    }
    let (rx, tx) = w.server.buffer_pools();
    assert_eq!((rx.in_use, tx.in_use), (0, 0), "idle: every buffer back");
    close_all(&mut w, &flows);
    assert_eq!(w.server.open_connections(), 0);
}

#[test]
fn loss_duplication_and_reordering_are_recovered() {
    for (seed, per_mille) in [(1u64, 10u16), (2, 30), (3, 50)] {
        let faults = |s: u64| Faults {
            loss_per_mille: per_mille,
            duplicate_per_mille: per_mille,
            reorder_per_mille: per_mille,
            seed: s,
        };
        let mem = MemConfig {
            a_to_b: faults(seed),
            b_to_a: faults(seed + 100),
            ..MemConfig::default()
        };
        let mut w = World::new(mem, 256, 256);
        let flows = run_echo(&mut w, 50, 20_000, 2000, 400_000);
        assert_echoed(&flows);
        let (s, c) = (*w.server.stats(), *w.client.stats());
        assert!(
            s.tcp_retransmits + c.tcp_retransmits > 0,
            "{per_mille}‰: retransmissions happened"
        );
        close_all(&mut w, &flows);
        assert_eq!(
            w.server.open_connections(),
            0,
            "{per_mille}‰: server state freed"
        );
        assert_eq!(
            w.client.open_connections(),
            0,
            "{per_mille}‰: client state freed"
        );
    }
}

#[test]
fn rst_from_the_client_frees_server_state() {
    let mut w = World::new(MemConfig::default(), 64, 64);
    let flows = run_echo(&mut w, 20, 500, 100, 10_000);
    assert_echoed(&flows);
    assert_eq!(w.server.open_connections(), 20);
    for f in &flows {
        w.client.abort(f.id);
        assert_eq!(
            w.client.send(f.id, b"x"),
            Err(NetError::Unknown),
            "id is dead"
        );
    }
    assert_eq!(w.client.open_connections(), 0, "abort frees at once");
    for _ in 0..100 {
        w.step();
    }
    assert_eq!(w.server.open_connections(), 0);
    assert_eq!(w.echo.closed, 20, "the server saw Closed for each");
}

#[test]
fn syn_flood_beyond_max_connections_is_refused() {
    let mut w = World::new(MemConfig::default(), 32, 256);
    let server = SocketAddrV4::new(SERVER_IP, PORT);
    let ids: Vec<ConnId> = (0..200)
        .map(|_| w.client.connect(server, 0).expect("connect"))
        .collect();
    let mut connected = 0;
    let mut closed = 0;
    for _ in 0..200 {
        for ev in w.step() {
            match ev {
                NetEvent::Connected(_) => connected += 1,
                NetEvent::Closed(_) => closed += 1,
                _ => {}
            }
        }
    }
    assert_eq!(connected, 32, "exactly max_connections accepted");
    assert_eq!(closed, 168, "the rest were reset");
    assert_eq!(w.server.open_connections(), 32);
    assert_eq!(w.server.stats().tcp_conns_refused, 168);
    // The accepted ones still work.
    let accepted: Vec<ConnId> = ids
        .iter()
        .copied()
        .filter(|&id| w.client.send_capacity(id) > 0)
        .collect();
    assert_eq!(accepted.len(), 32);
    for &id in &accepted {
        assert_eq!(w.client.send(id, b"hello"), Ok(5));
    }
    let mut buf = Vec::new();
    for _ in 0..50 {
        w.step();
    }
    for &id in &accepted {
        buf.clear();
        assert_eq!(w.client.recv(id, &mut buf, 100), Ok(5));
        assert_eq!(&buf, b"hello");
    }
}

#[test]
fn half_open_connections_time_out() {
    // Raw SYNs from a peer that never completes the handshake.
    let (a, mut b) = mem::pair(MemConfig::default());
    let now = Instant::now();
    let mut server = Stack::new(a, cfg(SERVER_IP, 64)).expect("config");
    server.listen(PORT);
    let smac = server.mac();
    for port in 1000..1010u16 {
        let f = syn_frame(smac, b.mac(), port);
        send_raw(&mut b, &f);
    }
    let mut ev = Vec::new();
    server.poll(now, &mut ev);
    server.flush(now);
    assert_eq!(server.open_connections(), 10);
    let mut rx = Vec::new();
    assert_eq!(b.rx_burst(&mut rx, 64), 10, "ten SYN-ACKs");
    let mut t = now;
    for _ in 0..100 {
        t += Duration::from_millis(100);
        server.poll(t, &mut ev);
        server.flush(t);
    }
    assert_eq!(
        server.open_connections(),
        0,
        "half-open slots freed by the handshake timeout"
    );
    assert!(ev.is_empty(), "never announced, never reported: {ev:?}");
}

#[test]
fn arp_resolve_and_answer() {
    let mut w = World::new(MemConfig::default(), 8, 8);
    let flows = run_echo(&mut w, 1, 10, 10, 1000);
    assert_echoed(&flows);
    let (s, c) = (*w.server.stats(), *w.client.stats());
    assert_eq!(c.arp_requests_sent, 1);
    assert_eq!(s.arp_requests_answered, 1);
    assert_eq!(c.arp_replies_received, 1);
    // A request for another address is not answered.
    let (a, mut b) = mem::pair(MemConfig::default());
    let mut server = Stack::new(a, cfg(SERVER_IP, 8)).expect("config");
    let req = arp_request(b.mac(), CLIENT_IP, Ipv4Addr::new(10, 0, 0, 99));
    send_raw(&mut b, &req);
    let req = arp_request(b.mac(), CLIENT_IP, SERVER_IP);
    send_raw(&mut b, &req);
    let now = Instant::now();
    server.poll(now, &mut Vec::new());
    server.flush(now);
    let mut rx = Vec::new();
    assert_eq!(b.rx_burst(&mut rx, 8), 1);
    let r = rx[0].data();
    assert_eq!(&r[0..6], &b.mac());
    assert_eq!(&r[12..14], &[0x08, 0x06]);
    assert_eq!(&r[20..22], &[0, 2], "a reply");
    assert_eq!(&r[22..28], &server.mac(), "our MAC");
    assert_eq!(&r[28..32], &SERVER_IP.octets());
    assert_eq!(server.stats().arp_requests_answered, 1);
}

#[test]
fn connect_to_a_silent_address_fails_after_arp_retries() {
    let mut w = World::new(MemConfig::default(), 8, 8);
    let id = w
        .client
        .connect(SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 77), 80), 0)
        .expect("connect");
    let mut closed = false;
    for _ in 0..10_000 {
        closed |= w.step().contains(&NetEvent::Closed(id));
    }
    assert!(closed);
    assert_eq!(w.client.stats().arp_requests_sent, 3);
    assert_eq!(w.client.open_connections(), 0);
    let off_net = SocketAddrV4::new(Ipv4Addr::new(192, 168, 1, 1), 80);
    assert_eq!(
        w.client.connect(off_net, 0),
        Err(NetError::Unreachable),
        "no gateway"
    );
}

#[test]
fn icmp_echo_is_answered() {
    let (a, mut b) = mem::pair(MemConfig::default());
    let mut server = Stack::new(a, cfg(SERVER_IP, 8)).expect("config");
    let smac = server.mac();
    let ping = icmp_echo(smac, b.mac(), b"abcdefgh-payload");
    send_raw(&mut b, &ping);
    let now = Instant::now();
    server.poll(now, &mut Vec::new());
    server.flush(now);
    let mut rx = Vec::new();
    assert_eq!(b.rx_burst(&mut rx, 8), 1);
    let r = rx[0].data();
    assert_eq!(r.len(), ping.len());
    assert_eq!(&r[26..30], &SERVER_IP.octets(), "from the server");
    assert_eq!(&r[30..34], &CLIENT_IP.octets());
    assert_eq!(r[34], 0, "echo reply");
    assert_eq!(&r[38..], &ping[38..], "id, sequence and payload echoed");
    assert_eq!(inet_sum(&r[14..34]), 0, "IPv4 checksum");
    assert_eq!(inet_sum(&r[34..]), 0, "ICMP checksum");
    assert_eq!(server.stats().icmp_echo_replied, 1);
}

#[test]
fn malformed_frames_are_dropped_and_counted() {
    let (a, mut b) = mem::pair(MemConfig::default());
    let mut server = Stack::new(a, cfg(SERVER_IP, 8)).expect("config");
    server.listen(PORT);
    let smac = server.mac();
    let good_syn = syn_frame(smac, b.mac(), 4000);
    let ping = icmp_echo(smac, b.mac(), b"x");
    let mut frames: Vec<Vec<u8>> = Vec::new();
    // Truncated at every length below the IPv4 + TCP headers.
    for n in 0..54 {
        frames.push(good_syn[..n].to_vec());
    }
    let mut bad_ip_sum = good_syn.clone();
    bad_ip_sum[24] ^= 0x55;
    frames.push(bad_ip_sum);
    let mut bad_tcp_sum = good_syn.clone();
    bad_tcp_sum[50] ^= 0x55;
    frames.push(bad_tcp_sum);
    let mut bad_icmp_sum = ping.clone();
    bad_icmp_sum[40] ^= 1;
    frames.push(bad_icmp_sum);
    let mut long_total = good_syn.clone();
    set_ip_total(&mut long_total, 1400);
    frames.push(long_total);
    let mut short_total = good_syn.clone();
    set_ip_total(&mut short_total, 10);
    frames.push(short_total);
    let mut big_doff = good_syn.clone();
    big_doff[46] = 0xf0;
    fix_tcp_sum(&mut big_doff);
    frames.push(big_doff);
    let mut fragment = good_syn.clone();
    fragment[20] = 0x20;
    fix_ip_sum(&mut fragment);
    frames.push(fragment);
    let mut not_ours = good_syn.clone();
    not_ours[33] = 200;
    fix_ip_sum(&mut not_ours);
    frames.push(not_ours);
    let mut bad_arp = arp_request(b.mac(), CLIENT_IP, SERVER_IP);
    bad_arp.truncate(14 + 20);
    frames.push(bad_arp);
    // Random garbage behind a valid Ethernet header.
    for i in 0..200u64 {
        let mut f = good_syn.clone();
        let junk = payload(i, 40);
        f.truncate(14);
        f.extend_from_slice(&junk);
        f[14] = 0x45;
        frames.push(f);
    }
    let count = frames.len();
    let now = Instant::now();
    for f in &frames {
        send_raw(&mut b, f);
        server.poll(now, &mut Vec::new());
        server.flush(now);
    }
    let st = *server.stats();
    assert_eq!(st.rx_frames, count as u64);
    let dropped = st.rx_dropped_malformed
        + st.rx_dropped_checksum
        + st.rx_dropped_fragment
        + st.rx_dropped_not_ours;
    assert_eq!(
        dropped, count as u64,
        "every frame dropped and counted: {st:?}"
    );
    assert!(st.rx_dropped_malformed >= 54 + 4, "{st:?}");
    assert!(st.rx_dropped_checksum >= 3, "{st:?}");
    assert_eq!(st.rx_dropped_fragment, 1);
    assert_eq!(
        server.open_connections(),
        0,
        "nothing reached the TCP layer"
    );
    assert_eq!(
        st.icmp_echo_replied + st.tcp_rst_sent + st.arp_requests_answered,
        0
    );
    // The stack still works afterwards.
    send_raw(&mut b, &good_syn);
    server.poll(now, &mut Vec::new());
    assert_eq!(server.open_connections(), 1);
}

#[test]
fn tx_checksum_offload_path() {
    let mem = MemConfig {
        offloads: pgline_nic::Offloads {
            tx_checksum: true,
            rx_checksum: false,
        },
        ..MemConfig::default()
    };
    // The mem port computes checksums the stack left to the device; the peer verifies them.
    let mut w = World::new(mem, 64, 64);
    let flows = run_echo(&mut w, 10, 5000, 1000, 10_000);
    assert_echoed(&flows);
    assert_eq!(
        w.server.stats().rx_dropped_checksum + w.client.stats().rx_dropped_checksum,
        0
    );
}

// ---- raw frame helpers ----

fn send_raw(q: &mut MemQueue, frame: &[u8]) {
    let mut p = q.alloc().expect("buffer");
    p.set_len(frame.len());
    p.data_mut().copy_from_slice(frame);
    let mut v = vec![p];
    assert_eq!(q.tx_burst(&mut v), 1);
}

fn inet_sum(data: &[u8]) -> u16 {
    let mut s: u32 = 0;
    for c in data.chunks(2) {
        s += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

fn eth(dst: [u8; 6], src: [u8; 6], ethertype: u16) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&ethertype.to_be_bytes());
    f
}

fn ip_header(proto: u8, payload_len: usize) -> Vec<u8> {
    let mut h = vec![0x45, 0];
    h.extend_from_slice(&((20 + payload_len) as u16).to_be_bytes());
    h.extend_from_slice(&[0, 1, 0x40, 0, 64, proto, 0, 0]);
    h.extend_from_slice(&CLIENT_IP.octets());
    h.extend_from_slice(&SERVER_IP.octets());
    let c = inet_sum(&h);
    h[10..12].copy_from_slice(&c.to_be_bytes());
    h
}

fn fix_ip_sum(f: &mut [u8]) {
    f[24] = 0;
    f[25] = 0;
    let c = inet_sum(&f[14..34]);
    f[24..26].copy_from_slice(&c.to_be_bytes());
}

fn set_ip_total(f: &mut [u8], total: u16) {
    f[16..18].copy_from_slice(&total.to_be_bytes());
    fix_ip_sum(f);
}

fn fix_tcp_sum(f: &mut [u8]) {
    f[50] = 0;
    f[51] = 0;
    let seg = f[34..].to_vec();
    let mut pseudo = Vec::new();
    pseudo.extend_from_slice(&f[26..34]);
    pseudo.extend_from_slice(&[0, 6]);
    pseudo.extend_from_slice(&(seg.len() as u16).to_be_bytes());
    pseudo.extend_from_slice(&seg);
    let c = inet_sum(&pseudo);
    f[50..52].copy_from_slice(&c.to_be_bytes());
}

fn syn_frame(dst: [u8; 6], src: [u8; 6], src_port: u16) -> Vec<u8> {
    let mut f = eth(dst, src, 0x0800);
    f.extend_from_slice(&ip_header(6, 20));
    let mut t = Vec::new();
    t.extend_from_slice(&src_port.to_be_bytes());
    t.extend_from_slice(&PORT.to_be_bytes());
    t.extend_from_slice(&1000u32.to_be_bytes());
    t.extend_from_slice(&0u32.to_be_bytes());
    t.extend_from_slice(&[0x50, 0x02, 0x20, 0x00, 0, 0, 0, 0]);
    f.extend_from_slice(&t);
    fix_tcp_sum(&mut f);
    f
}

fn icmp_echo(dst: [u8; 6], src: [u8; 6], data: &[u8]) -> Vec<u8> {
    let mut f = eth(dst, src, 0x0800);
    f.extend_from_slice(&ip_header(1, 8 + data.len()));
    let mut m = vec![8, 0, 0, 0, 0x12, 0x34, 0, 1];
    m.extend_from_slice(data);
    let c = inet_sum(&m);
    m[2..4].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&m);
    f
}

fn arp_request(src: [u8; 6], sender: Ipv4Addr, target: Ipv4Addr) -> Vec<u8> {
    let mut f = eth([0xff; 6], src, 0x0806);
    f.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
    f.extend_from_slice(&src);
    f.extend_from_slice(&sender.octets());
    f.extend_from_slice(&[0; 6]);
    f.extend_from_slice(&target.octets());
    f.resize(60, 0);
    f
}

#[test]
fn writable_follows_a_full_send_buffer() {
    let (a, b) = mem::pair(MemConfig::default());
    let mut server = Stack::new(a, cfg(SERVER_IP, 8)).expect("server");
    let mut client = Stack::new(b, cfg(CLIENT_IP, 8)).expect("client");
    server.listen(PORT);
    let id = client
        .connect(SocketAddrV4::new(SERVER_IP, PORT), 0)
        .expect("connect");
    let mut now = Instant::now();
    let (mut sev, mut cev) = (Vec::new(), Vec::new());
    let mut pump = |server: &mut Stack<MemQueue>,
                    client: &mut Stack<MemQueue>,
                    sev: &mut Vec<NetEvent>,
                    cev: &mut Vec<NetEvent>| {
        now += STEP;
        server.poll(now, sev);
        server.flush(now);
        client.poll(now, cev);
        client.flush(now);
    };
    let mut sid = None;
    for _ in 0..50 {
        pump(&mut server, &mut client, &mut sev, &mut cev);
        for e in sev.drain(..) {
            if let NetEvent::Accepted { id, .. } = e {
                sid = Some(id);
            }
        }
    }
    let sid = sid.expect("accepted");
    assert!(cev.contains(&NetEvent::Connected(id)));
    cev.clear();
    let data = payload(9, 100_000);
    let mut sent = 0;
    // Fill the client's send buffer while the server does not read.
    loop {
        match client.send(id, &data[sent..]) {
            Ok(n) => sent += n,
            Err(NetError::Full) => break,
            Err(e) => panic!("{e:?}"),
        }
        pump(&mut server, &mut client, &mut sev, &mut cev);
    }
    assert!(
        sent < data.len(),
        "the buffers filled up ({sent} bytes taken)"
    );
    assert_eq!(client.send_capacity(id), 0);
    // The server reads; the client writes again only when told it is writable.
    let mut got = Vec::new();
    let mut writable = 0;
    for _ in 0..20_000 {
        pump(&mut server, &mut client, &mut sev, &mut cev);
        while let Ok(n) = server.recv(sid, &mut got, 1 << 20) {
            if n == 0 {
                break;
            }
        }
        for e in cev.drain(..) {
            if e == NetEvent::Writable(id) {
                writable += 1;
                while sent < data.len() {
                    match client.send(id, &data[sent..]) {
                        Ok(n) => sent += n,
                        Err(NetError::Full) => break,
                        Err(e) => panic!("{e:?}"),
                    }
                }
            }
        }
        if got.len() == data.len() {
            break;
        }
    }
    assert!(writable > 0);
    assert!(
        got == data,
        "{} of {} bytes, in order",
        got.len(),
        data.len()
    );
}

#[test]
fn connect_to_a_closed_port_is_refused() {
    let mut w = World::new(MemConfig::default(), 8, 8);
    let id = w
        .client
        .connect(SocketAddrV4::new(SERVER_IP, 9), 0)
        .expect("connect");
    let mut closed = false;
    for _ in 0..100 {
        closed |= w.step().contains(&NetEvent::Closed(id));
    }
    assert!(closed, "RST from the server closes the attempt");
    assert_eq!(w.server.stats().tcp_rst_sent, 1);
    assert_eq!(w.client.open_connections(), 0);
    assert_eq!(
        w.client.recv(id, &mut Vec::new(), 10),
        Err(NetError::Unknown)
    );
}

#[test]
fn a_dry_send_pool_makes_writers_wait_for_writable_and_every_byte_arrives() {
    // The server writes 20 KB to each of 8 clients; with our TCP its send pool holds 2 buffers,
    // so most writers find it dry. A writer retries only once told `Writable`.
    const CONNS: usize = 8;
    let scfg = NetConfig {
        conn_buffers: 2,
        ..cfg(SERVER_IP, 16)
    };
    let (a, b) = mem::pair(MemConfig::default());
    let mut server = Stack::new(a, scfg).expect("server");
    let mut client = Stack::new(b, cfg(CLIENT_IP, 16)).expect("client");
    server.listen(PORT);
    let cids: Vec<ConnId> = (0..CONNS)
        .map(|_| {
            client
                .connect(SocketAddrV4::new(SERVER_IP, PORT), 0)
                .expect("connect")
        })
        .collect();
    let mut now = Instant::now();
    let (mut sev, mut cev) = (Vec::new(), Vec::new());
    // Server side: (id, data, sent, may write).
    let mut writers: Vec<(ConnId, Vec<u8>, usize, bool)> = Vec::new();
    let mut got: HashMap<ConnId, Vec<u8>> = cids.iter().map(|&c| (c, Vec::new())).collect();
    let mut writable = 0;
    let mut buf = Vec::new();
    for _ in 0..100_000 {
        now += STEP;
        sev.clear();
        server.poll(now, &mut sev);
        for e in &sev {
            match *e {
                NetEvent::Accepted { id, .. } => {
                    let i = writers.len() as u64;
                    writers.push((id, payload(100 + i, 20_000), 0, true));
                }
                NetEvent::Writable(id) => {
                    writable += 1;
                    if let Some(w) = writers.iter_mut().find(|w| w.0 == id) {
                        w.3 = true;
                    }
                }
                _ => {}
            }
        }
        for (id, data, sent, may) in writers.iter_mut() {
            while *may && *sent < data.len() {
                match server.send(*id, &data[*sent..]) {
                    Ok(n) => *sent += n,
                    Err(NetError::Full) => *may = false,
                    Err(e) => panic!("server send {e:?}"),
                }
            }
        }
        server.flush(now);
        cev.clear();
        client.poll(now, &mut cev);
        for (id, g) in got.iter_mut() {
            buf.clear();
            if let Ok(n) = client.recv(*id, &mut buf, 1 << 20) {
                g.extend_from_slice(&buf[..n]);
            }
        }
        client.flush(now);
        if writers.len() == CONNS && got.values().all(|g| g.len() == 20_000) {
            break;
        }
    }
    assert_eq!(writers.len(), CONNS, "every connection accepted");
    // Accept order is connect order: the i-th accepted connection is the i-th client's.
    for (i, cid) in cids.iter().enumerate() {
        let g = &got[cid];
        assert_eq!(g.len(), 20_000, "client {i}: every byte");
        assert!(
            *g == payload(100 + i as u64, 20_000),
            "client {i}: in order"
        );
    }
    assert!(writable > 0, "writers were told to write again");
    let (_, tx) = server.buffer_pools();
    if env!("CARGO_CRATE_NAME") == "net_stack_owned" {
        assert!(tx.dry > 0, "the send pool ran dry: {tx:?}");
        assert_eq!(tx.buffers, 2);
        assert!(server.stats().tcp_buffer_waits > 0);
    }
}

/// Our own TCP on the server (`net_stack_owned`): the pool bounds below exist only there.
fn owned() -> bool {
    env!("CARGO_CRATE_NAME") == "net_stack_owned"
}

/// A server and a client stack on simulated time, stepped by hand.
struct Pair {
    server: Stack<MemQueue>,
    client: Stack<MemQueue>,
    now: Instant,
    sev: Vec<NetEvent>,
    cev: Vec<NetEvent>,
}

impl Pair {
    fn new(scfg: NetConfig) -> Pair {
        let (a, b) = mem::pair(MemConfig::default());
        let mut server = Stack::new(a, scfg).expect("server");
        server.listen(PORT);
        Pair {
            server,
            client: Stack::new(b, cfg(CLIENT_IP, 64)).expect("client"),
            now: Instant::now(),
            sev: Vec::new(),
            cev: Vec::new(),
        }
    }

    fn connect(&mut self) -> ConnId {
        self.client
            .connect(SocketAddrV4::new(SERVER_IP, PORT), 0)
            .expect("connect")
    }

    /// One turn of the server alone: its client is not polled (a peer that went quiet).
    fn step_server(&mut self) {
        self.now += STEP;
        self.sev.clear();
        self.server.poll(self.now, &mut self.sev);
        self.server.flush(self.now);
    }

    /// One turn of both; the events are in `sev` and `cev`.
    fn step(&mut self) {
        self.step_server();
        self.cev.clear();
        self.client.poll(self.now, &mut self.cev);
        self.client.flush(self.now);
    }

    /// The ids of the connections the server accepted in this turn.
    fn accepted(&self) -> Vec<ConnId> {
        self.sev
            .iter()
            .filter_map(|e| match *e {
                NetEvent::Accepted { id, .. } => Some(id),
                _ => None,
            })
            .collect()
    }
}

#[test]
fn a_client_that_stops_reading_is_reset_and_its_send_buffer_serves_the_next() {
    if !owned() {
        // smoltcp's sockets own their send buffers: a slow reader holds only its own.
        return;
    }
    // One pooled send buffer. Client A never reads what it asked for; client B reads slowly
    // (2,000 bytes every 1.5 s, less than the stall limit apart) and must get all of it.
    const LEN: usize = 20_000;
    let stall = Duration::from_secs(2);
    let scfg = NetConfig {
        conn_buffers: 1,
        send_stall_timeout: stall,
        ..cfg(SERVER_IP, 16)
    };
    let mut p = Pair::new(scfg);
    let a = p.connect();
    let mut sa = None;
    for _ in 0..1000 {
        p.step();
        if let Some(id) = p.accepted().first() {
            sa = Some(*id);
            break;
        }
    }
    let sa = sa.expect("A accepted");
    let reply_a = payload(7, LEN);
    let mut sent_a = p.server.send(sa, &reply_a).expect("A's reply queued");
    assert!(sent_a > 0);
    // A now holds the only send buffer; B connects after that.
    assert_eq!(p.server.buffer_pools().1.in_use, 1);
    let b = p.connect();
    let reply_b = payload(8, LEN);
    let (mut sb, mut sent_b, mut got_b) = (None, 0, Vec::new());
    let (mut a_reset, mut b_writable) = (false, 0);
    let mut buf = Vec::new();
    let read_every = (Duration::from_millis(1500).as_micros() / STEP.as_micros()) as usize;
    for i in 0..200_000 {
        p.step();
        for e in p.sev.clone() {
            match e {
                NetEvent::Accepted { id, .. } => sb = Some(id),
                NetEvent::Writable(id) if Some(id) == sb => b_writable += 1,
                _ => {}
            }
        }
        if p.cev.contains(&NetEvent::Closed(a)) {
            a_reset = true;
        }
        if !a_reset && sent_a < LEN {
            sent_a += p.server.send(sa, &reply_a[sent_a..]).unwrap_or(0);
        }
        if let Some(sb) = sb {
            while sent_b < LEN {
                match p.server.send(sb, &reply_b[sent_b..]) {
                    Ok(n) => sent_b += n,
                    Err(NetError::Full) => break,
                    // B's client gave up waiting (smoltcp's own timeout): the checks below say
                    // why.
                    Err(_) => break,
                }
            }
        }
        if i % read_every == 0 {
            buf.clear();
            if let Ok(n) = p.client.recv(b, &mut buf, 2000) {
                got_b.extend_from_slice(&buf[..n]);
            }
        }
        if got_b.len() == LEN {
            break;
        }
    }
    assert!(a_reset, "the client that stopped reading was reset");
    assert!(b_writable > 0, "B waited for the buffer A held");
    assert_eq!(got_b.len(), LEN, "B got its whole reply");
    assert!(got_b == reply_b, "B's reply in order");
    let st = *p.server.stats();
    assert_eq!(st.tcp_send_stall_aborts, 1, "only A was reset: {st:?}");
    // B's reads are 1.5 s apart, each acknowledged data: progress, so B was never stalled.
    assert!(p.server.peer(sb.expect("B")).is_some(), "B still open");
}

#[test]
fn a_receive_buffer_granted_to_a_peer_that_went_quiet_goes_back_to_the_pool() {
    if !owned() {
        return;
    }
    // One pooled receive buffer. A's data takes it; B's data is refused and B waits. The
    // client then goes quiet (it is not polled), the server reads A's data, and the buffer is
    // granted to B, whose peer does not resend. It must come back to the pool; when the
    // client wakes, B's bytes still all arrive.
    const LEN: usize = 3000;
    let scfg = NetConfig {
        conn_buffers: 1,
        ..cfg(SERVER_IP, 16)
    };
    let mut p = Pair::new(scfg);
    let a = p.connect();
    let b = p.connect();
    let (data_a, data_b) = (payload(1, LEN), payload(2, LEN));
    let (mut sent, mut ids) = ([0usize; 2], Vec::new());
    for _ in 0..20_000 {
        p.step();
        ids.extend(p.accepted());
        for (i, (c, d)) in [(a, &data_a), (b, &data_b)].into_iter().enumerate() {
            if sent[i] < LEN {
                sent[i] += p.client.send(c, &d[sent[i]..]).unwrap_or(0);
            }
        }
        if ids.len() == 2 && p.server.stats().tcp_buffer_waits > 0 {
            break;
        }
    }
    assert_eq!(ids.len(), 2, "both accepted");
    assert!(
        p.server.stats().tcp_buffer_waits > 0,
        "one waited for the buffer"
    );
    assert_eq!(p.server.buffer_pools().0.in_use, 1);
    // The client goes quiet. Drain whichever connection holds the buffer.
    let mut got: HashMap<ConnId, Vec<u8>> = ids.iter().map(|&id| (id, Vec::new())).collect();
    let mut buf = Vec::new();
    for _ in 0..10 {
        for (id, g) in got.iter_mut() {
            buf.clear();
            if let Ok(n) = p.server.recv(*id, &mut buf, 1 << 20) {
                g.extend_from_slice(&buf[..n]);
            }
        }
        p.step_server();
    }
    let granted = p.server.buffer_pools().0.in_use;
    assert_eq!(granted, 1, "the buffer went to the waiter");
    let quiet = (Duration::from_millis(1500).as_micros() / STEP.as_micros()) as usize;
    for _ in 0..quiet {
        p.step_server();
    }
    assert_eq!(
        p.server.buffer_pools().0.in_use,
        0,
        "a grant nobody used went back to the pool"
    );
    assert_eq!(p.server.stats().tcp_rx_grants_returned, 1);
    // The client wakes: every byte of both still arrives.
    for _ in 0..200_000 {
        p.step();
        for (id, g) in got.iter_mut() {
            buf.clear();
            if let Ok(n) = p.server.recv(*id, &mut buf, 1 << 20) {
                g.extend_from_slice(&buf[..n]);
            }
        }
        if got.values().all(|g| g.len() == LEN) {
            break;
        }
    }
    let mut bodies: Vec<&Vec<u8>> = got.values().collect();
    bodies.sort_by_key(|g| g.first().copied());
    let mut want = [&data_a, &data_b];
    want.sort_by_key(|d| d.first().copied());
    assert!(
        bodies[0] == want[0] && bodies[1] == want[1],
        "both in order"
    );
}

#[test]
fn wait_list_entries_of_closed_connections_are_swept() {
    if !owned() {
        return;
    }
    // One pooled send buffer, held for good by a connection whose client never reads. Round
    // after round, the server writes to three more connections, which wait for the buffer;
    // their clients then reset. Their wait-list entries stay behind (no buffer comes back to
    // serve them) until the sweep at two entries per slot drops them.
    const SLOTS: usize = 4;
    let scfg = NetConfig {
        conn_buffers: 1,
        ..cfg(SERVER_IP, SLOTS)
    };
    let mut p = Pair::new(scfg);
    p.connect();
    let mut holder = None;
    for _ in 0..2000 {
        p.step();
        holder = holder.or(p.accepted().first().copied());
        if let Some(h) = holder {
            let _ = p.server.send(h, &payload(3, 60_000));
            break;
        }
    }
    assert_eq!(
        p.server.buffer_pools().1.in_use,
        1,
        "the holder took the buffer"
    );
    let mut peak = 0;
    for round in 0..10 {
        let waits = p.server.stats().tcp_buffer_waits;
        let ids: Vec<ConnId> = (0..SLOTS - 1).map(|_| p.connect()).collect();
        let mut accepted = Vec::new();
        for _ in 0..2000 {
            p.step();
            accepted.extend(p.accepted());
            if accepted.len() == ids.len() {
                break;
            }
        }
        assert_eq!(accepted.len(), ids.len(), "round {round}: accepted");
        for &id in &accepted {
            assert_eq!(p.server.send(id, b"reply"), Err(NetError::Full));
        }
        assert_eq!(
            p.server.stats().tcp_buffer_waits,
            waits + accepted.len() as u64,
            "round {round}: each newcomer waits"
        );
        for &c in &ids {
            p.client.abort(c);
        }
        for _ in 0..1000 {
            p.step();
            if p.server.open_connections() == 1 {
                break;
            }
        }
        assert_eq!(p.server.open_connections(), 1, "round {round}: resets seen");
        peak = peak.max(p.server.buffer_waiters().1);
    }
    // 30 entries were pushed for connections that are gone; at most two per slot remain.
    assert!(peak <= 2 * SLOTS, "wait list bounded: peak {peak}");
    assert!(
        peak >= SLOTS,
        "entries of closed connections stayed until swept: {peak}"
    );
    assert_eq!(p.server.buffer_pools().1.in_use, 1);
}
