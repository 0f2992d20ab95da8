//! TX checksum offload through `net_tap`, whose PMD offers IPv4/TCP/UDP checksum offload (done
//! in software by the driver). The tap interface lives in the root namespace with a test address;
//! the kernel drops frames with bad checksums, so a UDP datagram arriving at a socket and a
//! SYN-ACK answering a hand-built SYN prove the offload filled both checksums in.

use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, UdpSocket};
use std::process::Command;
use std::time::{Duration, Instant};

use pgline_nic::{Packet, Queue};

const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;

/// Folded, not inverted, 16-bit one's complement sum (the form DPDK wants in the L4 checksum
/// field before offload: the pseudo-header sum).
fn sum16(data: &[u8], mut sum: u32) -> u16 {
    for c in data.chunks(2) {
        sum += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// Ethernet + IPv4 (checksum left 0) + `l4` with its checksum field holding the pseudo-header
/// sum; `csum_at` is the checksum's offset inside `l4`.
fn compose_ipv4(
    macs: ([u8; 6], [u8; 6]),
    ips: (Ipv4Addr, Ipv4Addr),
    proto: u8,
    mut l4: Vec<u8>,
    csum_at: usize,
) -> Vec<u8> {
    let (src, dst) = ips;
    let l4_len = l4.len() as u16;
    let mut pseudo = Vec::with_capacity(12);
    pseudo.extend_from_slice(&src.octets());
    pseudo.extend_from_slice(&dst.octets());
    pseudo.extend_from_slice(&[0, proto]);
    pseudo.extend_from_slice(&l4_len.to_be_bytes());
    l4[csum_at..csum_at + 2].copy_from_slice(&sum16(&pseudo, 0).to_be_bytes());
    let mut f = Vec::with_capacity(34 + l4.len());
    f.extend_from_slice(&macs.1);
    f.extend_from_slice(&macs.0);
    f.extend_from_slice(&0x0800u16.to_be_bytes());
    f.extend_from_slice(&[0x45, 0]);
    f.extend_from_slice(&(20 + l4_len).to_be_bytes());
    f.extend_from_slice(&[0x12, 0x34, 0x40, 0, 64, proto, 0, 0]);
    f.extend_from_slice(&src.octets());
    f.extend_from_slice(&dst.octets());
    f.extend_from_slice(&l4);
    f
}

fn send_with_offload<Q: Queue>(q: &mut Q, frame: &[u8]) {
    let mut m = q.alloc().expect("mbuf");
    m.set_len(frame.len());
    m.data_mut().copy_from_slice(frame);
    m.request_tx_checksum(14, 20);
    let mut tx = vec![m];
    assert_eq!(q.tx_burst(&mut tx), 1);
}

pub struct TapAddr {
    pub iface: String,
    pub kernel_ip: Ipv4Addr,
    pub app_ip: Ipv4Addr,
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Gives the kernel side of the tap an address and a static neighbour entry for the app.
pub fn set_up_kernel_side(t: &TapAddr, app_mac: [u8; 6]) {
    let mac = app_mac.map(|b| format!("{b:02x}")).join(":");
    let _ = Command::new("sysctl")
        .args(["-qw", &format!("net.ipv6.conf.{}.disable_ipv6=1", t.iface)])
        .status();
    ip(&[
        "addr",
        "add",
        &format!("{}/24", t.kernel_ip),
        "dev",
        &t.iface,
    ]);
    ip(&["link", "set", &t.iface, "up"]);
    ip(&[
        "neigh",
        "replace",
        &t.app_ip.to_string(),
        "lladdr",
        &mac,
        "dev",
        &t.iface,
    ]);
}

/// Sends a UDP datagram and a TCP SYN with checksums left to the device; checks the kernel
/// accepted both.
pub fn udp_and_tcp_checksums_offloaded<Q: Queue>(mut q: Q, t: &TapAddr, kernel_mac: [u8; 6]) {
    assert!(
        q.offloads().tx_checksum,
        "net_tap offers TX checksum offload"
    );
    let macs = (q.mac(), kernel_mac);
    let ips = (t.app_ip, t.kernel_ip);

    let sock = UdpSocket::bind(SocketAddrV4::new(t.kernel_ip, 0)).expect("udp bind");
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let port = sock.local_addr().expect("addr").port();
    let payload = b"pgline checksum offload";
    let mut udp = Vec::new();
    udp.extend_from_slice(&40000u16.to_be_bytes());
    udp.extend_from_slice(&port.to_be_bytes());
    udp.extend_from_slice(&(8 + payload.len() as u16).to_be_bytes());
    udp.extend_from_slice(&[0, 0]);
    udp.extend_from_slice(payload);
    send_with_offload(&mut q, &compose_ipv4(macs, ips, IPPROTO_UDP, udp, 6));
    let mut buf = [0u8; 64];
    let (n, from) = sock
        .recv_from(&mut buf)
        .expect("the kernel accepted the UDP datagram");
    assert_eq!(&buf[..n], payload);
    assert_eq!(from.to_string(), format!("{}:40000", t.app_ip));

    let listener = TcpListener::bind(SocketAddrV4::new(t.kernel_ip, 0)).expect("tcp bind");
    let port = listener.local_addr().expect("addr").port();
    let mut syn = Vec::new();
    syn.extend_from_slice(&40001u16.to_be_bytes());
    syn.extend_from_slice(&port.to_be_bytes());
    syn.extend_from_slice(&0x0100_0000u32.to_be_bytes()); // seq
    syn.extend_from_slice(&[0, 0, 0, 0, 0x50, 0x02]); // ack 0, 20-byte header, SYN
    syn.extend_from_slice(&[0xff, 0xff, 0, 0, 0, 0]); // window, checksum, urgent
    send_with_offload(&mut q, &compose_ipv4(macs, ips, IPPROTO_TCP, syn, 16));
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut rx = Vec::new();
    let mut syn_ack = false;
    while !syn_ack && Instant::now() < deadline {
        q.rx_burst(&mut rx, 32);
        syn_ack = rx.drain(..).any(|m| {
            let f = m.data();
            f.len() >= 54
                && f[12..14] == [8, 0]
                && f[23] == IPPROTO_TCP
                && f[36..38] == 40001u16.to_be_bytes()
                && f[47] & 0x12 == 0x12
        });
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        syn_ack,
        "the kernel answered the SYN: its TCP and IP checksums were right"
    );
}
