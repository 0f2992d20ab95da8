//! One TCP connection slot: either a smoltcp TCP socket driven by its own tiny `Interface` over a
//! device shim that sees only this flow's packets, or our own TCP (`tcp.rs`,
//! `NetConfig::owned_tcp`).
//!
//! Why per connection: smoltcp's `Interface::poll*` visits every socket of its `SocketSet`, and
//! the TCP socket's `process`/`dispatch` are crate-private in smoltcp 0.12. A one-socket
//! `Interface` (medium IP, so no neighbor cache or Ethernet in it) is the smallest public unit
//! that drives one socket: ingress is `poll_ingress_single` with the flow's IPv4 packet, egress is
//! `poll_egress`, and each costs O(1) in the number of open connections.
//!
//! The shim ([`Shim`]) hands smoltcp the IPv4 packet the stack already checked, and gives it
//! transmit buffers straight from the port (the IPv4 packet is written after room for the
//! Ethernet header: no copy). After smoltcp emits a segment the shim writes the Ethernet header,
//! counts retransmissions (a segment starting below the highest sequence sent), and prepares
//! checksum offload when the device does it. With our own TCP the segment fields go straight to
//! the state machine and [`emit_own`] writes the frame.
//!
//! Slots are reused: a freed slot keeps its interface, socket and buffers, so steady-state
//! accept/close does not allocate. A smoltcp slot owns its two socket buffers for its life
//! (smoltcp's socket takes them at construction); our own TCP's slot holds none while idle and
//! takes them from the stack's pools (`bufpool.rs`).

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Duration;

use pgline_nic::{Packet, Queue};
use smoltcp::iface::{Config, Interface, PollResult, SocketHandle, SocketSet};
use smoltcp::phy::{self, Checksum, ChecksumCapabilities, DeviceCapabilities, Medium};
use smoltcp::socket::tcp::{self, State};
use smoltcp::time::{Duration as SDuration, Instant as SInstant};
use smoltcp::wire::{HardwareAddress, IpAddress, IpCidr, IpEndpoint, IpListenEndpoint};

use super::bufpool::Pools;
use super::tcp::{Out, Seg, Tcb};
use super::wire::{self, ETHERTYPE_IPV4, ETH_HDR, PROTO_TCP};
use super::NetStats;

/// How the connection started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// Accepted on a listening port.
    Passive { listener: u16 },
    /// Opened by `connect`.
    Active,
}

/// The 4-tuple (our address is the stack's, so it is left out).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FlowKey {
    pub remote_ip: u32,
    pub remote_port: u16,
    pub local_port: u16,
}

/// Link facts needed to frame an IPv4 packet.
#[derive(Clone, Copy, Debug)]
pub struct Link {
    pub src_mac: [u8; 6],
    pub src_ip: [u8; 4],
    pub tx_offload: bool,
}

/// The TCP implementation behind a slot (`NetConfig::owned_tcp` picks one per stack).
pub enum Engine {
    /// smoltcp's socket driven through a one-socket interface.
    Smol {
        iface: Box<Interface>,
        sockets: SocketSet<'static>,
        handle: SocketHandle,
    },
    /// Our own TCP (`tcp.rs`).
    Own(Box<Tcb>),
}

/// One connection slot.
pub struct Conn {
    /// Bumped each time the slot is freed, so stale `ConnId`s miss.
    pub gen: u32,
    pub engine: Engine,
    /// `Some` while the slot holds a connection.
    pub key: Option<FlowKey>,
    pub origin: Origin,
    /// `Accepted`/`Connected` reported.
    pub announced: bool,
    /// End of stream reported through `Readable`.
    pub eof_reported: bool,
    /// A `send` came up short: report `Writable` when room frees up.
    pub want_write: bool,
    /// In the dirty list.
    pub dirty: bool,
    /// Waiting for ARP to resolve its next hop.
    pub arp_wait: bool,
    pub next_hop: Ipv4Addr,
    pub mac: Option<[u8; 6]>,
    /// The earliest pending timer entry (µs since the stack's epoch).
    pub timer: Option<u64>,
    /// Highest sequence number sent + 1 (for counting smoltcp's retransmissions).
    pub snd_max: Option<u32>,
    /// On the stack's wait list for a receive / send pool buffer.
    pub rx_waiting: bool,
    pub tx_waiting: bool,
}

/// A device with capabilities only (used to build interfaces).
struct CapsOnly(DeviceCapabilities);

impl phy::Device for CapsOnly {
    type RxToken<'a> = NoToken;
    type TxToken<'a> = NoToken;
    fn receive(&mut self, _: SInstant) -> Option<(NoToken, NoToken)> {
        None
    }
    fn transmit(&mut self, _: SInstant) -> Option<NoToken> {
        None
    }
    fn capabilities(&self) -> DeviceCapabilities {
        self.0.clone()
    }
}

struct NoToken;

impl phy::RxToken for NoToken {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(&[])
    }
}

impl phy::TxToken for NoToken {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut buf = vec![0u8; len];
        f(&mut buf)
    }
}

/// Device capabilities for the per-connection interfaces.
pub fn capabilities(mtu: usize, tx_offload: bool) -> DeviceCapabilities {
    let mut caps = DeviceCapabilities::default();
    caps.medium = Medium::Ip;
    caps.max_transmission_unit = mtu;
    caps.max_burst_size = None;
    // Received checksums are verified by the stack before smoltcp sees the packet.
    let tx = if tx_offload {
        Checksum::None
    } else {
        Checksum::Tx
    };
    let mut cs = ChecksumCapabilities::default();
    cs.ipv4 = tx;
    cs.tcp = tx;
    cs.udp = tx;
    cs.icmpv4 = tx;
    caps.checksum = cs;
    caps
}

impl Conn {
    /// A new, free slot with smoltcp's socket.
    pub fn new(
        caps: &DeviceCapabilities,
        ip: Ipv4Addr,
        seed: u64,
        rx_buffer: usize,
        tx_buffer: usize,
        now: SInstant,
    ) -> Conn {
        let mut cfg = Config::new(HardwareAddress::Ip);
        cfg.random_seed = seed;
        let mut iface = Interface::new(cfg, &mut CapsOnly(caps.clone()), now);
        // Prefix 0: every destination is on-link for this interface (the stack does routing).
        iface.update_ip_addrs(|addrs| {
            let _ = addrs.push(IpCidr::new(ip.into(), 0));
        });
        let socket = tcp::Socket::new(
            tcp::SocketBuffer::new(vec![0u8; rx_buffer]),
            tcp::SocketBuffer::new(vec![0u8; tx_buffer]),
        );
        let mut sockets = SocketSet::new(Vec::with_capacity(1));
        let handle = sockets.add(socket);
        Conn::with_engine(Engine::Smol {
            iface: Box::new(iface),
            sockets,
            handle,
        })
    }

    /// A new, free slot with our own TCP.
    pub fn new_owned(
        rx_buffer: usize,
        tx_buffer: usize,
        mss: u16,
        fast_path: bool,
        stall_timeout: Duration,
    ) -> Conn {
        let ack_delay = super::ACK_DELAY.as_micros() as u64;
        let mut t = Tcb::new(rx_buffer, tx_buffer, mss, ack_delay);
        t.fast_path = fast_path;
        t.set_stall_timeout(u64::try_from(stall_timeout.as_micros()).unwrap_or(u64::MAX));
        Conn::with_engine(Engine::Own(Box::new(t)))
    }

    fn with_engine(engine: Engine) -> Conn {
        Conn {
            gen: 0,
            engine,
            key: None,
            origin: Origin::Active,
            announced: false,
            eof_reported: false,
            want_write: false,
            dirty: false,
            arp_wait: false,
            next_hop: Ipv4Addr::UNSPECIFIED,
            mac: None,
            timer: None,
            snd_max: None,
            rx_waiting: false,
            tx_waiting: false,
        }
    }

    /// Resets the per-connection bookkeeping for a new connection.
    pub fn begin(
        &mut self,
        key: FlowKey,
        origin: Origin,
        next_hop: Ipv4Addr,
        mac: Option<[u8; 6]>,
    ) {
        self.key = Some(key);
        self.origin = origin;
        self.announced = false;
        self.eof_reported = false;
        self.want_write = false;
        self.dirty = false;
        self.arp_wait = false;
        self.next_hop = next_hop;
        self.mac = mac;
        self.timer = None;
        self.snd_max = None;
        self.rx_waiting = false;
        self.tx_waiting = false;
    }

    // ---- the socket operations the stack uses, for either engine ----

    fn smol(&self) -> Option<&tcp::Socket<'static>> {
        match &self.engine {
            Engine::Smol {
                sockets, handle, ..
            } => Some(sockets.get::<tcp::Socket>(*handle)),
            Engine::Own(_) => None,
        }
    }

    pub fn state(&self) -> State {
        match (&self.engine, self.smol()) {
            (Engine::Own(t), _) => t.state,
            (_, Some(s)) => s.state(),
            _ => State::Closed,
        }
    }

    pub fn may_recv(&self) -> bool {
        match (&self.engine, self.smol()) {
            (Engine::Own(t), _) => t.may_recv(),
            (_, Some(s)) => s.may_recv(),
            _ => false,
        }
    }

    pub fn may_send(&self) -> bool {
        match (&self.engine, self.smol()) {
            (Engine::Own(t), _) => t.may_send(),
            (_, Some(s)) => s.may_send(),
            _ => false,
        }
    }

    /// Bytes received and not read yet.
    pub fn recv_queue(&self) -> usize {
        match (&self.engine, self.smol()) {
            (Engine::Own(t), _) => t.rx.len(),
            (_, Some(s)) => s.recv_queue(),
            _ => 0,
        }
    }

    /// Free room in the send buffer (our TCP: 0 while it holds none and the pool is dry).
    pub fn send_room(&self, p: &Pools) -> usize {
        match (&self.engine, self.smol()) {
            (Engine::Own(t), _) => t.tx.room(&p.tx),
            (_, Some(s)) => s.send_capacity() - s.send_queue(),
            _ => 0,
        }
    }

    /// Appends up to `max` received bytes to `out`; returns how many.
    pub fn recv(&mut self, p: &mut Pools, out: &mut Vec<u8>, max: usize) -> usize {
        match &mut self.engine {
            Engine::Smol {
                sockets, handle, ..
            } => {
                let sock = sockets.get_mut::<tcp::Socket>(*handle);
                let mut total = 0;
                // The receive ring may wrap: at most two contiguous pieces.
                for _ in 0..2 {
                    if total >= max || !sock.can_recv() {
                        break;
                    }
                    let want = max - total;
                    let got = sock.recv(|buf| {
                        let n = buf.len().min(want);
                        out.extend_from_slice(&buf[..n]);
                        (n, n)
                    });
                    match got {
                        Ok(0) | Err(_) => break,
                        Ok(n) => total += n,
                    }
                }
                total
            }
            Engine::Own(t) => t.recv(p, out, max),
        }
    }

    /// Queues bytes to send; how many fit (`Err` when the direction is closed).
    pub fn send(&mut self, p: &mut Pools, data: &[u8]) -> Result<usize, ()> {
        match &mut self.engine {
            Engine::Smol {
                sockets, handle, ..
            } => sockets
                .get_mut::<tcp::Socket>(*handle)
                .send_slice(data)
                .map_err(|_| ()),
            Engine::Own(t) => Ok(t.send(p, data)),
        }
    }

    pub fn close(&mut self) {
        match &mut self.engine {
            Engine::Smol {
                sockets, handle, ..
            } => sockets.get_mut::<tcp::Socket>(*handle).close(),
            Engine::Own(t) => t.close(),
        }
    }

    pub fn abort(&mut self) {
        match &mut self.engine {
            Engine::Smol {
                sockets, handle, ..
            } => sockets.get_mut::<tcp::Socket>(*handle).abort(),
            Engine::Own(t) => t.abort(),
        }
    }

    /// Gives our own TCP's buffers back to the pools (the connection is gone).
    pub fn free_buffers(&mut self, p: &mut Pools) {
        if let Engine::Own(t) = &mut self.engine {
            t.free_buffers(p);
        }
    }

    /// Data was refused for want of a receive buffer since the last call (our own TCP).
    pub fn take_rx_starved(&mut self) -> bool {
        match &mut self.engine {
            Engine::Own(t) => std::mem::take(&mut t.rx_starved),
            Engine::Smol { .. } => false,
        }
    }

    /// Hands the connection a receive buffer (it waited for one) and has it announce the
    /// window; false if the pool is dry again or the connection holds one already.
    pub fn grant_rx(&mut self, p: &mut Pools, now: u64) -> bool {
        match &mut self.engine {
            Engine::Own(t) => t.grant_rx(p, now),
            Engine::Smol { .. } => false,
        }
    }

    /// Our own TCP holds no send buffer and the pool has none to give.
    pub fn send_starved(&self, p: &Pools) -> bool {
        match &self.engine {
            Engine::Own(t) => !t.tx.held() && p.tx.available() == 0,
            Engine::Smol { .. } => false,
        }
    }

    /// Hands the connection a send buffer (it waited for one); false if the pool is dry.
    pub fn grant_tx(&mut self, p: &mut Pools) -> bool {
        match &mut self.engine {
            Engine::Own(t) => t.tx.reserve(&mut p.tx),
            Engine::Smol { .. } => false,
        }
    }

    /// Nagle off, delayed ACK, the given inactivity timeout.
    pub fn configure(&mut self, timeout: Duration) {
        match &mut self.engine {
            Engine::Smol {
                sockets, handle, ..
            } => {
                let sock = sockets.get_mut::<tcp::Socket>(*handle);
                sock.set_nagle_enabled(false);
                sock.set_ack_delay(Some(SDuration::from_micros(
                    super::ACK_DELAY.as_micros() as u64
                )));
                sock.set_timeout(Some(SDuration::from_micros(timeout.as_micros() as u64)));
                sock.set_keep_alive(None);
            }
            Engine::Own(t) => t.set_timeout(timeout.as_micros() as u64),
        }
    }

    /// Arms the slot for the SYN that created it; false if the socket refused.
    pub fn listen(
        &mut self,
        p: &mut Pools,
        ip: Ipv4Addr,
        port: u16,
        iss: u32,
        now: SInstant,
    ) -> bool {
        match &mut self.engine {
            Engine::Smol {
                sockets, handle, ..
            } => {
                let ep = IpListenEndpoint {
                    addr: Some(IpAddress::Ipv4(ip)),
                    port,
                };
                sockets.get_mut::<tcp::Socket>(*handle).listen(ep).is_ok()
            }
            Engine::Own(t) => {
                t.listen(p, iss, micros(now));
                true
            }
        }
    }

    /// Active open; false if the socket refused.
    pub fn connect(
        &mut self,
        p: &mut Pools,
        ip: Ipv4Addr,
        local_port: u16,
        remote: SocketAddrV4,
        iss: u32,
        now: SInstant,
    ) -> bool {
        match &mut self.engine {
            Engine::Smol {
                iface,
                sockets,
                handle,
            } => {
                let remote_ep = IpEndpoint::new(IpAddress::Ipv4(*remote.ip()), remote.port());
                let local_ep = IpListenEndpoint {
                    addr: Some(IpAddress::Ipv4(ip)),
                    port: local_port,
                };
                let cx = iface.context();
                sockets
                    .get_mut::<tcp::Socket>(*handle)
                    .connect(cx, remote_ep, local_ep)
                    .is_ok()
            }
            Engine::Own(t) => {
                t.connect(p, iss, micros(now));
                true
            }
        }
    }

    /// Feeds one checked IPv4 packet of this flow (its TCP header parsed as `tcp`); replies sent
    /// right away (smoltcp's RST, challenge ACK) go through `out`. True if our own TCP took it
    /// on its fast path.
    pub fn ingress<Q: Queue>(
        &mut self,
        now: SInstant,
        packet: &[u8],
        ip: &wire::Ipv4,
        tcp: &wire::Tcp,
        out: TxOut<'_, Q>,
    ) -> bool {
        match &mut self.engine {
            Engine::Smol { iface, sockets, .. } => {
                let mut shim = Shim {
                    rx: Some(packet),
                    out,
                    mac: self.mac,
                    snd_max: &mut self.snd_max,
                };
                iface.poll_ingress_single(now, &mut shim, sockets);
                false
            }
            Engine::Own(t) => {
                let seg = &packet[ip.header_len..];
                let (hdr, payload) = seg.split_at(tcp.header_len);
                let mut s = Seg {
                    seq: tcp.seq,
                    ack: tcp.ack,
                    flags: tcp.flags,
                    window: u16::from_be_bytes([hdr[14], hdr[15]]),
                    mss: None,
                    wscale: None,
                };
                if tcp.flags & wire::TCP_SYN != 0 {
                    (s.mss, s.wscale) = wire::tcp_syn_options(&hdr[wire::TCP_HDR..]);
                }
                t.process(out.pools, micros(now), &s, payload)
            }
        }
    }

    /// Lets the connection send one segment if it has one (data, ACK, FIN, RST, retransmission);
    /// true if it did.
    pub fn egress<Q: Queue>(&mut self, now: SInstant, out: TxOut<'_, Q>) -> bool {
        match &mut self.engine {
            Engine::Smol { iface, sockets, .. } => {
                let mut shim = Shim {
                    rx: None,
                    out,
                    mac: self.mac,
                    snd_max: &mut self.snd_max,
                };
                iface.poll_egress(now, &mut shim, sockets) == PollResult::SocketStateChanged
            }
            Engine::Own(t) => {
                let Some(key) = self.key else {
                    return false;
                };
                let t_us = micros(now);
                if t.return_unused_grant(out.pools, t_us) {
                    out.stats.tcp_rx_grants_returned += 1;
                }
                let seg = t.dispatch(out.pools, t_us);
                if std::mem::take(&mut t.stalled) {
                    out.stats.tcp_send_stall_aborts += 1;
                }
                let Some(seg) = seg else {
                    return false;
                };
                emit_own(t, &seg, key, self.mac, out);
                true
            }
        }
    }

    /// When the connection next wants to run (µs since the epoch; `now` or earlier = at once).
    pub fn poll_at(&mut self, now: SInstant) -> Option<u64> {
        match &mut self.engine {
            Engine::Smol { iface, sockets, .. } => iface
                .poll_at(now, sockets)
                .map(|t| t.total_micros().max(0) as u64),
            Engine::Own(t) => t.poll_at(micros(now)),
        }
    }
}

fn micros(t: SInstant) -> u64 {
    t.total_micros().max(0) as u64
}

/// Writes one segment of our own TCP as an Ethernet frame into a port buffer (the payload is
/// copied from the send ring straight into the frame).
fn emit_own<Q: Queue>(t: &Tcb, seg: &Out, key: FlowKey, mac: Option<[u8; 6]>, out: TxOut<'_, Q>) {
    let opts = if seg.syn_opts.is_some() { 8 } else { 0 };
    let tcp_len = wire::TCP_HDR + opts + seg.data_len;
    let frame_len = ETH_HDR + wire::IPV4_HDR + tcp_len;
    let Some(mac) = mac else {
        // The segment is lost (TCP retransmits it).
        out.stats.tx_dropped_no_arp += 1;
        return;
    };
    let Some(mut pkt) = out.queue.alloc() else {
        out.stats.tx_dropped_nobuf += 1;
        return;
    };
    if frame_len > pkt.capacity() {
        out.stats.tx_dropped_nobuf += 1;
        return;
    }
    if seg.retransmit {
        out.stats.tcp_retransmits += 1;
    }
    pkt.set_len(frame_len);
    let offload = out.link.tx_offload;
    let buf = pkt.data_mut();
    wire::compose_eth(buf, mac, out.link.src_mac, ETHERTYPE_IPV4);
    let ip = wire::Ipv4 {
        header_len: wire::IPV4_HDR,
        total_len: wire::IPV4_HDR + tcp_len,
        proto: PROTO_TCP,
        src: out.link.src_ip,
        dst: key.remote_ip.to_be_bytes(),
    };
    // DF is set, so the identification field carries no meaning (RFC 6864).
    wire::compose_ipv4(&mut buf[ETH_HDR..], &ip, 0, offload);
    let l4 = &mut buf[ETH_HDR + wire::IPV4_HDR..frame_len];
    if seg.data_len > 0 {
        t.tx.read_at(&out.pools.tx, seg.data_off, &mut l4[wire::TCP_HDR + opts..]);
    }
    let hdr = wire::TcpOut {
        src_port: key.local_port,
        dst_port: key.remote_port,
        seq: seg.seq,
        ack: seg.ack,
        flags: seg.flags,
        window: seg.window,
    };
    wire::compose_tcp(l4, &ip, &hdr, seg.syn_opts, offload);
    if offload {
        pkt.request_tx_checksum(ETH_HDR as u16, wire::IPV4_HDR as u16);
    }
    out.tx.push(pkt);
}

/// Where transmitted frames go: the port (for buffers), the pending TX burst and the counters.
pub struct TxOut<'a, Q: Queue> {
    pub queue: &'a mut Q,
    pub tx: &'a mut Vec<Q::Packet>,
    pub scratch: &'a mut Vec<u8>,
    pub stats: &'a mut NetStats,
    pub link: Link,
    /// Our own TCP's buffer pools.
    pub pools: &'a mut Pools,
}

/// The one-flow device smoltcp's interface drives.
struct Shim<'a, 'p, Q: Queue> {
    rx: Option<&'p [u8]>,
    out: TxOut<'a, Q>,
    mac: Option<[u8; 6]>,
    snd_max: &'a mut Option<u32>,
}

struct Rx<'p>(&'p [u8]);

impl phy::RxToken for Rx<'_> {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(self.0)
    }
}

struct Tx<'s, 'a, Q: Queue> {
    out: &'s mut TxOut<'a, Q>,
    mac: Option<[u8; 6]>,
    snd_max: &'s mut Option<u32>,
}

impl<'a, Q: Queue> phy::Device for Shim<'a, '_, Q> {
    type RxToken<'b>
        = Rx<'b>
    where
        Self: 'b;
    type TxToken<'b>
        = Tx<'b, 'a, Q>
    where
        Self: 'b;

    fn receive(&mut self, _: SInstant) -> Option<(Rx<'_>, Tx<'_, 'a, Q>)> {
        let data = self.rx.take()?;
        Some((
            Rx(data),
            Tx {
                out: &mut self.out,
                mac: self.mac,
                snd_max: &mut *self.snd_max,
            },
        ))
    }

    fn transmit(&mut self, _: SInstant) -> Option<Tx<'_, 'a, Q>> {
        Some(Tx {
            out: &mut self.out,
            mac: self.mac,
            snd_max: &mut *self.snd_max,
        })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        // Only consulted at interface creation; the interface keeps its own copy.
        DeviceCapabilities::default()
    }
}

impl<Q: Queue> phy::TxToken for Tx<'_, '_, Q> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let out = self.out;
        let frame_len = ETH_HDR + len;
        let pkt = match (self.mac, out.queue.alloc()) {
            (Some(mac), Some(mut pkt)) if frame_len <= pkt.capacity() => {
                pkt.set_len(frame_len);
                wire::compose_eth(pkt.data_mut(), mac, out.link.src_mac, ETHERTYPE_IPV4);
                pkt
            }
            (mac, _) => {
                // No buffer or no next-hop address: the segment is lost (TCP retransmits it).
                if mac.is_none() {
                    out.stats.tx_dropped_no_arp += 1;
                } else {
                    out.stats.tx_dropped_nobuf += 1;
                }
                out.scratch.resize(len, 0);
                return f(&mut out.scratch[..len]);
            }
        };
        let mut pkt = pkt;
        let r = f(&mut pkt.data_mut()[ETH_HDR..frame_len]);
        finish_segment(&mut pkt, out.link.tx_offload, self.snd_max, out.stats);
        out.tx.push(pkt);
        r
    }
}

/// After smoltcp emitted a TCP/IPv4 packet: count a retransmission, and with checksum offload
/// leave the pseudo-header sum in the TCP checksum and ask the device for the rest.
fn finish_segment<P: Packet>(
    pkt: &mut P,
    offload: bool,
    snd_max: &mut Option<u32>,
    stats: &mut NetStats,
) {
    let data = pkt.data_mut();
    let Ok(ip) = wire::parse_ipv4(&data[ETH_HDR..], false) else {
        return;
    };
    if ip.proto != PROTO_TCP {
        return;
    }
    let l4 = ETH_HDR + ip.header_len;
    let seg_len = ip.total_len - ip.header_len;
    if let Ok(tcp) = wire::parse_tcp(&data[l4..l4 + seg_len], &ip, false) {
        let used = wire::tcp_seq_len(&tcp, seg_len);
        if used > 0 {
            let end = tcp.seq.wrapping_add(used);
            match *snd_max {
                Some(max) if (tcp.seq.wrapping_sub(max) as i32) < 0 => {
                    stats.tcp_retransmits += 1;
                    if (end.wrapping_sub(max) as i32) > 0 {
                        *snd_max = Some(end);
                    }
                }
                _ => *snd_max = Some(end),
            }
        }
    }
    if offload {
        let s = wire::pseudo_sum(ip.src, ip.dst, PROTO_TCP, seg_len);
        let c = wire::fold(s);
        if seg_len >= 18 {
            data[l4 + 16..l4 + 18].copy_from_slice(&c.to_be_bytes());
        }
        data[ETH_HDR + 10] = 0;
        data[ETH_HDR + 11] = 0;
        pkt.request_tx_checksum(ETH_HDR as u16, ip.header_len as u16);
    }
}
