//! A network namespace with a veth pair for the DPDK tests: the namespace end has an address
//! and a kernel stack; the root end is up without an address, for a DPDK vdev to own. Removed
//! on drop (also when a test panics).

use std::net::Ipv4Addr;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use pgline_nic::{Packet, Queue};

static NEXT: AtomicU32 = AtomicU32::new(0);

pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout.trim_ascii() == b"0")
        .unwrap_or(false)
}

pub struct Veth {
    pub ns: String,
    pub root_if: String,
    pub peer_if: String,
    /// The appliance's address (answered by the test through DPDK).
    pub app_ip: Ipv4Addr,
    /// The namespace end's address.
    pub ns_ip: Ipv4Addr,
}

fn run(args: &[&str]) -> Result<Output, String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{}: {e}", args.join(" ")))?;
    if !out.status.success() {
        return Err(format!(
            "{} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(out)
}

impl Veth {
    pub fn create(tag: &str) -> Result<Veth, String> {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let net = Veth {
            ns: format!("pgline-nic-test-{pid}-{tag}"),
            root_if: format!("pgn{}x{n}a", pid % 100_000),
            peer_if: format!("pgn{}x{n}b", pid % 100_000),
            app_ip: Ipv4Addr::new(10, 213, n as u8, 1),
            ns_ip: Ipv4Addr::new(10, 213, n as u8, 2),
        };
        // From here on, Drop cleans up whatever part was made.
        net.set_up()?;
        Ok(net)
    }

    fn set_up(&self) -> Result<(), String> {
        let (ns, a, b) = (
            self.ns.as_str(),
            self.root_if.as_str(),
            self.peer_if.as_str(),
        );
        let addr = format!("{}/24", self.ns_ip);
        run(&["ip", "netns", "add", ns])?;
        run(&["ip", "link", "add", a, "type", "veth", "peer", "name", b])?;
        run(&["ip", "link", "set", b, "netns", ns])?;
        // No IPv6 chatter (router solicitations, MLD) on either end.
        let _ = run(&[
            "sysctl",
            "-qw",
            &format!("net.ipv6.conf.{a}.disable_ipv6=1"),
        ]);
        let _ = self.ns_run(&[
            "sysctl",
            "-qw",
            &format!("net.ipv6.conf.{b}.disable_ipv6=1"),
        ]);
        self.ns_run(&["ip", "addr", "add", &addr, "dev", b])?;
        // The kernel would leave TCP/UDP checksums to a device that does not exist.
        self.ns_run(&["ethtool", "-K", b, "tx", "off"])?;
        self.ns_run(&["ip", "link", "set", "lo", "up"])?;
        self.ns_run(&["ip", "link", "set", b, "up"])?;
        run(&["ip", "link", "set", a, "up"])?;
        Ok(())
    }

    pub fn ns_run(&self, args: &[&str]) -> Result<Output, String> {
        let mut full = vec!["ip", "netns", "exec", self.ns.as_str()];
        full.extend_from_slice(args);
        run(&full)
    }

    pub fn root_mac(&self) -> Result<[u8; 6], String> {
        let path = format!("/sys/class/net/{}/address", self.root_if);
        let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
        parse_mac(text.trim()).ok_or_else(|| format!("bad MAC {text:?}"))
    }
}

impl Drop for Veth {
    fn drop(&mut self) {
        // Deleting the namespace deletes the peer, and with it the root end; delete both anyway.
        let _ = run(&["ip", "netns", "del", &self.ns]);
        let _ = run(&["ip", "link", "del", &self.root_if]);
    }
}

pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = s.split(':');
    for b in &mut mac {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

pub fn format_mac(mac: [u8; 6]) -> String {
    mac.map(|b| format!("{b:02x}")).join(":")
}

const ETH_ARP: u16 = 0x0806;
const ETH_IPV4: u16 = 0x0800;

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// The ARP request for `target` in frame `f`: (sender MAC, sender IP).
fn arp_request_for(f: &[u8], target: Ipv4Addr) -> Option<([u8; 6], Ipv4Addr)> {
    if f.len() < 42 || be16(f, 12) != ETH_ARP || be16(f, 20) != 1 || f[38..42] != target.octets() {
        return None;
    }
    let sha: [u8; 6] = f[22..28].try_into().ok()?;
    let spa: [u8; 4] = f[28..32].try_into().ok()?;
    Some((sha, Ipv4Addr::from(spa)))
}

fn compose_arp_reply(mac: [u8; 6], ip: Ipv4Addr, to_mac: [u8; 6], to_ip: Ipv4Addr) -> Vec<u8> {
    let mut f = Vec::with_capacity(42);
    f.extend_from_slice(&to_mac);
    f.extend_from_slice(&mac);
    f.extend_from_slice(&ETH_ARP.to_be_bytes());
    f.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 2]); // Ethernet, IPv4, 6, 4, reply
    f.extend_from_slice(&mac);
    f.extend_from_slice(&ip.octets());
    f.extend_from_slice(&to_mac);
    f.extend_from_slice(&to_ip.octets());
    f
}

fn checksum(data: &[u8]) -> u16 {
    let mut sum = 0u32;
    for c in data.chunks(2) {
        sum += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An ICMP echo reply for the echo request to `ip` in frame `f`.
fn compose_echo_reply(f: &[u8], mac: [u8; 6], ip: Ipv4Addr) -> Option<Vec<u8>> {
    if f.len() < 34 || be16(f, 12) != ETH_IPV4 || f[23] != 1 || f[30..34] != ip.octets() {
        return None;
    }
    let ihl = usize::from(f[14] & 0x0f) * 4;
    let end = 14 + usize::from(be16(f, 16));
    if end > f.len() || f.get(14 + ihl) != Some(&8) {
        return None;
    }
    let mut r = f[..end].to_vec();
    r.copy_within(6..12, 0);
    r[6..12].copy_from_slice(&mac);
    r[26..30].copy_from_slice(&f[30..34]);
    r[30..34].copy_from_slice(&f[26..30]);
    let icmp = 14 + ihl;
    r[icmp] = 0;
    r[icmp + 2..icmp + 4].fill(0);
    let sum = checksum(&r[icmp..]);
    r[icmp + 2..icmp + 4].copy_from_slice(&sum.to_be_bytes());
    Some(r)
}

fn transmit<Q: Queue>(q: &mut Q, bytes: &[u8]) {
    let mut m = q.alloc().expect("an mbuf for the reply");
    m.set_len(bytes.len());
    m.data_mut().copy_from_slice(bytes);
    let mut tx = vec![m];
    let deadline = Instant::now() + Duration::from_secs(1);
    while !tx.is_empty() && Instant::now() < deadline {
        q.tx_burst(&mut tx);
    }
    assert!(tx.is_empty(), "the device took the reply");
}

/// Pings the appliance address from the namespace; expects the ARP request to arrive through
/// `q`, answers it and the echo request by hand, then checks that ping succeeded and that the
/// namespace's neighbour table learned the port's MAC.
pub fn arp_and_ping_exchange<Q: Queue>(mut q: Q, net: &Veth) {
    let mac = q.mac();
    let mut ping = Command::new("ip")
        .args(["netns", "exec", &net.ns, "ping", "-c1", "-W8"])
        .arg(net.app_ip.to_string())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn ping");
    let (mut arp_from, mut echoed) = (None, false);
    let mut rx = Vec::with_capacity(32);
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        q.rx_burst(&mut rx, 32);
        for m in rx.drain(..) {
            if let Some((sha, spa)) = arp_request_for(m.data(), net.app_ip) {
                arp_from = Some((sha, spa));
                transmit(&mut q, &compose_arp_reply(mac, net.app_ip, sha, spa));
            } else if let Some(reply) = compose_echo_reply(m.data(), mac, net.app_ip) {
                echoed = true;
                transmit(&mut q, &reply);
            }
        }
        if let Some(status) = ping.try_wait().expect("ping status") {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = ping.kill();
            break None;
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    let (sha, spa) =
        arp_from.expect("an ARP request for the appliance address arrived in rx_burst");
    assert_eq!(spa, net.ns_ip);
    let peer_mac = std::fs::read_to_string(format!("/sys/class/net/{}/address", net.peer_if));
    assert!(peer_mac.is_err(), "the peer lives in the namespace");
    assert!(echoed, "the echo request arrived after the ARP reply");
    assert!(
        status.is_some_and(|s| s.success()),
        "ping got the hand-built echo reply"
    );
    let neigh = net
        .ns_run(&[
            "ip",
            "neigh",
            "show",
            &net.app_ip.to_string(),
            "dev",
            &net.peer_if,
        ])
        .expect("ip neigh");
    let neigh = String::from_utf8_lossy(&neigh.stdout);
    assert!(
        neigh.contains(&format!("lladdr {}", format_mac(mac))),
        "the namespace learned the port's MAC from the ARP reply: {neigh:?} (request from {})",
        format_mac(sha)
    );
}
