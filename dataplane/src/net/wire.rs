//! Header views and composers for the frames the stack handles itself: Ethernet, ARP, IPv4,
//! ICMP echo and the TCP header fields the flow demux needs (smoltcp parses TCP again inside the
//! connection's socket).
//!
//! Views are checked once by `parse_*` (lengths, version, header sizes) and then cannot panic.
//! Checksums are the Internet ones'-complement sums (RFC 1071).

use std::net::Ipv4Addr;

pub const ETH_HDR: usize = 14;
pub const ETHERTYPE_IPV4: u16 = 0x0800;
pub const ETHERTYPE_ARP: u16 = 0x0806;
pub const ARP_LEN: usize = 28;
pub const IPV4_HDR: usize = 20;
pub const TCP_HDR: usize = 20;
pub const PROTO_ICMP: u8 = 1;
pub const PROTO_TCP: u8 = 6;
pub const BROADCAST: [u8; 6] = [0xff; 6];

/// Why a frame was dropped (each has its own counter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Drop {
    /// Too short for its headers, or a length field pointing past the frame.
    Malformed,
    /// A checksum did not verify.
    Checksum,
    /// An IPv4 fragment (not supported).
    Fragment,
    /// Not for us, or a protocol we do not speak.
    NotOurs,
}

/// Ones'-complement sum of `data` added to `sum`, folded to at most 17 bits so callers may add
/// a few more words (not inverted). Reads 8 bytes at a time: the ones'-complement sum of 32-bit
/// words folds to the same 16-bit sum.
pub fn sum16(sum: u32, data: &[u8]) -> u32 {
    let mut acc = u64::from(sum);
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        let hi = u32::from_be_bytes([c[0], c[1], c[2], c[3]]);
        let lo = u32::from_be_bytes([c[4], c[5], c[6], c[7]]);
        acc += u64::from(hi) + u64::from(lo);
    }
    let mut pairs = chunks.remainder().chunks_exact(2);
    for c in &mut pairs {
        acc += u64::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = pairs.remainder() {
        acc += u64::from(*last) << 8;
    }
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u32
}

/// Folds a sum to 16 bits (not inverted).
pub fn fold(mut sum: u32) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// The final checksum of `data` (inverted fold).
pub fn checksum(data: &[u8]) -> u16 {
    !fold(sum16(0, data))
}

/// Sum of the IPv4 pseudo-header for a layer-4 segment of `len` bytes.
pub fn pseudo_sum(src: [u8; 4], dst: [u8; 4], proto: u8, len: usize) -> u32 {
    let s = sum16(0, &src);
    let s = sum16(s, &dst);
    s + u32::from(proto) + len as u32
}

/// An Ethernet frame's header fields.
#[derive(Clone, Copy, Debug)]
pub struct Eth {
    pub dst: [u8; 6],
    pub src: [u8; 6],
    pub ethertype: u16,
}

pub fn parse_eth(frame: &[u8]) -> Result<Eth, Drop> {
    if frame.len() < ETH_HDR {
        return Err(Drop::Malformed);
    }
    let mut dst = [0; 6];
    let mut src = [0; 6];
    dst.copy_from_slice(&frame[0..6]);
    src.copy_from_slice(&frame[6..12]);
    Ok(Eth {
        dst,
        src,
        ethertype: u16::from_be_bytes([frame[12], frame[13]]),
    })
}

pub fn compose_eth(buf: &mut [u8], dst: [u8; 6], src: [u8; 6], ethertype: u16) {
    buf[0..6].copy_from_slice(&dst);
    buf[6..12].copy_from_slice(&src);
    buf[12..14].copy_from_slice(&ethertype.to_be_bytes());
}

/// An Ethernet/IPv4 ARP message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arp {
    pub op: u16,
    pub sender_mac: [u8; 6],
    pub sender_ip: Ipv4Addr,
    pub target_mac: [u8; 6],
    pub target_ip: Ipv4Addr,
}

pub const ARP_REQUEST: u16 = 1;
pub const ARP_REPLY: u16 = 2;

/// Parses the ARP payload (after the Ethernet header).
pub fn parse_arp(p: &[u8]) -> Result<Arp, Drop> {
    if p.len() < ARP_LEN {
        return Err(Drop::Malformed);
    }
    // Ethernet (1), IPv4 (0x0800), 6-byte and 4-byte addresses.
    if p[0..6] != [0, 1, 8, 0, 6, 4] {
        return Err(Drop::NotOurs);
    }
    let mac = |o: usize| {
        let mut m = [0; 6];
        m.copy_from_slice(&p[o..o + 6]);
        m
    };
    let ip = |o: usize| Ipv4Addr::new(p[o], p[o + 1], p[o + 2], p[o + 3]);
    Ok(Arp {
        op: u16::from_be_bytes([p[6], p[7]]),
        sender_mac: mac(8),
        sender_ip: ip(14),
        target_mac: mac(18),
        target_ip: ip(24),
    })
}

/// Writes a whole ARP frame (Ethernet header included) into `buf` (>= 42 bytes); returns its
/// length.
pub fn compose_arp(buf: &mut [u8], eth_dst: [u8; 6], arp: &Arp) -> usize {
    compose_eth(buf, eth_dst, arp.sender_mac, ETHERTYPE_ARP);
    let p = &mut buf[ETH_HDR..ETH_HDR + ARP_LEN];
    p[0..6].copy_from_slice(&[0, 1, 8, 0, 6, 4]);
    p[6..8].copy_from_slice(&arp.op.to_be_bytes());
    p[8..14].copy_from_slice(&arp.sender_mac);
    p[14..18].copy_from_slice(&arp.sender_ip.octets());
    p[18..24].copy_from_slice(&arp.target_mac);
    p[24..28].copy_from_slice(&arp.target_ip.octets());
    ETH_HDR + ARP_LEN
}

/// A checked IPv4 header: `header_len <= total_len <= packet.len()`.
#[derive(Clone, Copy, Debug)]
pub struct Ipv4 {
    pub header_len: usize,
    pub total_len: usize,
    pub proto: u8,
    pub src: [u8; 4],
    pub dst: [u8; 4],
}

/// Parses the IPv4 header at the start of `p` (the Ethernet payload, which may carry padding).
pub fn parse_ipv4(p: &[u8], verify_checksum: bool) -> Result<Ipv4, Drop> {
    if p.len() < IPV4_HDR || p[0] >> 4 != 4 {
        return Err(Drop::Malformed);
    }
    let header_len = usize::from(p[0] & 0x0f) * 4;
    let total_len = usize::from(u16::from_be_bytes([p[2], p[3]]));
    if header_len < IPV4_HDR || total_len < header_len || total_len > p.len() {
        return Err(Drop::Malformed);
    }
    if verify_checksum && checksum(&p[..header_len]) != 0 {
        return Err(Drop::Checksum);
    }
    let frag = u16::from_be_bytes([p[6], p[7]]);
    // More-fragments set, or a non-zero offset.
    if frag & 0x3fff != 0 {
        return Err(Drop::Fragment);
    }
    let mut src = [0; 4];
    let mut dst = [0; 4];
    src.copy_from_slice(&p[12..16]);
    dst.copy_from_slice(&p[16..20]);
    Ok(Ipv4 {
        header_len,
        total_len,
        proto: p[9],
        src,
        dst,
    })
}

/// Writes a 20-byte IPv4 header; the checksum is filled unless `offload` (then left 0).
pub fn compose_ipv4(buf: &mut [u8], ip: &Ipv4, ident: u16, offload: bool) {
    buf[0] = 0x45;
    buf[1] = 0;
    buf[2..4].copy_from_slice(&(ip.total_len as u16).to_be_bytes());
    buf[4..6].copy_from_slice(&ident.to_be_bytes());
    buf[6..8].copy_from_slice(&0x4000u16.to_be_bytes()); // don't fragment
    buf[8] = 64;
    buf[9] = ip.proto;
    buf[10..12].copy_from_slice(&[0, 0]);
    buf[12..16].copy_from_slice(&ip.src);
    buf[16..20].copy_from_slice(&ip.dst);
    if !offload {
        let c = checksum(&buf[..IPV4_HDR]);
        buf[10..12].copy_from_slice(&c.to_be_bytes());
    }
}

/// The TCP header fields the demux needs, checked: `header_len <= segment.len()`.
#[derive(Clone, Copy, Debug)]
pub struct Tcp {
    pub src_port: u16,
    pub dst_port: u16,
    pub seq: u32,
    pub ack: u32,
    pub flags: u8,
    pub header_len: usize,
}

pub const TCP_FIN: u8 = 0x01;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;
pub const TCP_ACK: u8 = 0x10;

/// Parses a TCP segment header; verifies the checksum over the whole segment when asked.
pub fn parse_tcp(seg: &[u8], ip: &Ipv4, verify_checksum: bool) -> Result<Tcp, Drop> {
    if seg.len() < TCP_HDR {
        return Err(Drop::Malformed);
    }
    let header_len = usize::from(seg[12] >> 4) * 4;
    if header_len < TCP_HDR || header_len > seg.len() {
        return Err(Drop::Malformed);
    }
    if verify_checksum {
        let s = pseudo_sum(ip.src, ip.dst, PROTO_TCP, seg.len());
        if !fold(sum16(s, seg)) != 0 {
            return Err(Drop::Checksum);
        }
    }
    Ok(Tcp {
        src_port: u16::from_be_bytes([seg[0], seg[1]]),
        dst_port: u16::from_be_bytes([seg[2], seg[3]]),
        seq: u32::from_be_bytes([seg[4], seg[5], seg[6], seg[7]]),
        ack: u32::from_be_bytes([seg[8], seg[9], seg[10], seg[11]]),
        flags: seg[13],
        header_len,
    })
}

/// Sequence space a segment occupies (payload plus SYN and FIN).
pub fn tcp_seq_len(tcp: &Tcp, seg_len: usize) -> u32 {
    let payload = seg_len.saturating_sub(tcp.header_len) as u32;
    payload + u32::from(tcp.flags & TCP_SYN != 0) + u32::from(tcp.flags & TCP_FIN != 0)
}

/// Writes a 20-byte TCP header (no options, window 0) with a full checksum (or, with `offload`,
/// the pseudo-header sum the device expects).
#[allow(clippy::too_many_arguments)]
pub fn compose_tcp_rst(
    buf: &mut [u8],
    ip: &Ipv4,
    src_port: u16,
    dst_port: u16,
    seq: u32,
    ack: u32,
    flags: u8,
    offload: bool,
) {
    let seg = &mut buf[..TCP_HDR];
    seg[0..2].copy_from_slice(&src_port.to_be_bytes());
    seg[2..4].copy_from_slice(&dst_port.to_be_bytes());
    seg[4..8].copy_from_slice(&seq.to_be_bytes());
    seg[8..12].copy_from_slice(&ack.to_be_bytes());
    seg[12] = 5 << 4;
    seg[13] = flags;
    seg[14..20].copy_from_slice(&[0; 6]);
    let s = pseudo_sum(ip.src, ip.dst, PROTO_TCP, TCP_HDR);
    let c = if offload {
        fold(s)
    } else {
        !fold(sum16(s, seg))
    };
    seg[16..18].copy_from_slice(&c.to_be_bytes());
}

/// The header fields of a TCP segment we send (our own TCP).
#[derive(Clone, Copy, Debug)]
pub struct TcpOut {
    pub src_port: u16,
    pub dst_port: u16,
    pub seq: u32,
    pub ack: u32,
    pub flags: u8,
    pub window: u16,
}

/// Writes a TCP header (with MSS and window scale options when `syn_opts` is given) in front of
/// the payload already in `seg` (which is the whole segment), and its checksum: complete, or with
/// `offload` only the pseudo-header sum for the device to finish.
pub fn compose_tcp(
    seg: &mut [u8],
    ip: &Ipv4,
    h: &TcpOut,
    syn_opts: Option<(u16, Option<u8>)>,
    offload: bool,
) {
    let hdr_len = if syn_opts.is_some() {
        TCP_HDR + 8
    } else {
        TCP_HDR
    };
    seg[0..2].copy_from_slice(&h.src_port.to_be_bytes());
    seg[2..4].copy_from_slice(&h.dst_port.to_be_bytes());
    seg[4..8].copy_from_slice(&h.seq.to_be_bytes());
    seg[8..12].copy_from_slice(&h.ack.to_be_bytes());
    seg[12] = ((hdr_len / 4) as u8) << 4;
    seg[13] = h.flags;
    seg[14..16].copy_from_slice(&h.window.to_be_bytes());
    seg[16..20].copy_from_slice(&[0; 4]);
    if let Some((mss, ws)) = syn_opts {
        seg[20..24].copy_from_slice(&[2, 4, (mss >> 8) as u8, mss as u8]);
        // Window scale (or two no-ops when we do not offer it).
        match ws {
            Some(shift) => seg[24..28].copy_from_slice(&[1, 3, 3, shift]),
            None => seg[24..28].copy_from_slice(&[1, 1, 1, 1]),
        }
    }
    let s = pseudo_sum(ip.src, ip.dst, PROTO_TCP, seg.len());
    let c = if offload {
        fold(s)
    } else {
        !fold(sum16(s, seg))
    };
    seg[16..18].copy_from_slice(&c.to_be_bytes());
}

/// The MSS and window scale options of a SYN (`opts`: the bytes after the fixed header).
/// Malformed options end the walk; what was read so far counts.
pub fn tcp_syn_options(opts: &[u8]) -> (Option<u16>, Option<u8>) {
    let (mut mss, mut ws) = (None, None);
    let mut i = 0;
    while i < opts.len() {
        match opts[i] {
            0 => break,
            1 => i += 1,
            kind => {
                let Some(&len) = opts.get(i + 1) else { break };
                let len = usize::from(len);
                if len < 2 || i + len > opts.len() {
                    break;
                }
                match (kind, len) {
                    (2, 4) => mss = Some(u16::from_be_bytes([opts[i + 2], opts[i + 3]])),
                    (3, 3) => ws = Some(opts[i + 2]),
                    _ => {}
                }
                i += len;
            }
        }
    }
    (mss, ws)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_of_a_known_header() {
        // RFC 1071 style example: an IPv4 header whose checksum is 0xb861.
        let hdr = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb8, 0x61, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(checksum(&hdr), 0);
        let ip = parse_ipv4(&hdr[..], true);
        assert!(
            matches!(ip, Err(Drop::Malformed)),
            "total length 0x73 past the buffer"
        );
        let mut h = hdr;
        h[10] = 0;
        h[11] = 0;
        assert_eq!(checksum(&h), 0xb861);
    }

    #[test]
    fn wide_sum_matches_the_plain_16_bit_sum() {
        let plain = |d: &[u8]| {
            let mut s: u64 = 0;
            for c in d.chunks(2) {
                s += u64::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
            }
            while s > 0xffff {
                s = (s & 0xffff) + (s >> 16);
            }
            s as u16
        };
        let mut x = 12345u32;
        for len in 0..300 {
            let d: Vec<u8> = (0..len)
                .map(|_| {
                    x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
                    (x >> 16) as u8
                })
                .collect();
            assert_eq!(fold(sum16(0, &d)), plain(&d), "len {len}");
            assert_eq!(fold(sum16(0, &vec![0xff; len])), plain(&vec![0xff; len]));
        }
    }

    #[test]
    fn ipv4_rejects_bad_lengths_fragments_and_checksums() {
        let ip = Ipv4 {
            header_len: 20,
            total_len: 20,
            proto: PROTO_TCP,
            src: [10, 0, 0, 1],
            dst: [10, 0, 0, 2],
        };
        let mut buf = [0u8; 20];
        compose_ipv4(&mut buf, &ip, 7, false);
        assert!(parse_ipv4(&buf, true).is_ok());
        let mut bad = buf;
        bad[15] ^= 1;
        assert_eq!(parse_ipv4(&bad, true).err(), Some(Drop::Checksum));
        assert!(parse_ipv4(&bad, false).is_ok(), "offloaded: not verified");
        let mut frag = buf;
        frag[6] = 0x20; // more fragments
        frag[10..12].copy_from_slice(&[0, 0]);
        let c = checksum(&frag);
        frag[10..12].copy_from_slice(&c.to_be_bytes());
        assert_eq!(parse_ipv4(&frag, true).err(), Some(Drop::Fragment));
        let mut ihl = buf;
        ihl[0] = 0x44;
        assert_eq!(parse_ipv4(&ihl, false).err(), Some(Drop::Malformed));
        assert_eq!(parse_ipv4(&buf[..19], false).err(), Some(Drop::Malformed));
    }

    #[test]
    fn arp_round_trip() {
        let arp = Arp {
            op: ARP_REQUEST,
            sender_mac: [2, 0, 0, 0, 0, 1],
            sender_ip: Ipv4Addr::new(10, 0, 0, 1),
            target_mac: [0; 6],
            target_ip: Ipv4Addr::new(10, 0, 0, 2),
        };
        let mut buf = [0u8; 60];
        let n = compose_arp(&mut buf, BROADCAST, &arp);
        assert_eq!(n, 42);
        assert_eq!(
            parse_eth(&buf).map(|e| e.ethertype).ok(),
            Some(ETHERTYPE_ARP)
        );
        assert_eq!(parse_arp(&buf[ETH_HDR..]).ok(), Some(arp));
        assert_eq!(
            parse_arp(&buf[ETH_HDR..ETH_HDR + 27]).err(),
            Some(Drop::Malformed)
        );
    }

    #[test]
    fn tcp_rst_verifies() {
        let ip = Ipv4 {
            header_len: 20,
            total_len: 40,
            proto: PROTO_TCP,
            src: [10, 0, 0, 1],
            dst: [10, 0, 0, 2],
        };
        let mut seg = [0u8; 20];
        compose_tcp_rst(&mut seg, &ip, 80, 1234, 5, 6, TCP_RST | TCP_ACK, false);
        let t = parse_tcp(&seg, &ip, true).expect("valid");
        assert_eq!((t.src_port, t.dst_port, t.seq, t.ack), (80, 1234, 5, 6));
        seg[4] ^= 1;
        assert_eq!(parse_tcp(&seg, &ip, true).err(), Some(Drop::Checksum));
        seg[12] = 6 << 4;
        assert_eq!(parse_tcp(&seg, &ip, false).err(), Some(Drop::Malformed));
    }

    #[test]
    fn tcp_with_options_verifies_and_options_parse_back() {
        let ip = Ipv4 {
            header_len: 20,
            total_len: 20 + 28 + 3,
            proto: PROTO_TCP,
            src: [10, 0, 0, 1],
            dst: [10, 0, 0, 2],
        };
        let mut seg = [0u8; 31];
        seg[28..].copy_from_slice(b"abc");
        let h = TcpOut {
            src_port: 80,
            dst_port: 1234,
            seq: 7,
            ack: 9,
            flags: TCP_SYN | TCP_ACK,
            window: 4096,
        };
        compose_tcp(&mut seg, &ip, &h, Some((1460, Some(7))), false);
        let t = parse_tcp(&seg, &ip, true).expect("valid");
        assert_eq!(
            (t.seq, t.ack, t.flags, t.header_len),
            (7, 9, TCP_SYN | TCP_ACK, 28)
        );
        assert_eq!(tcp_syn_options(&seg[20..28]), (Some(1460), Some(7)));
        compose_tcp(&mut seg, &ip, &h, Some((536, None)), false);
        assert_eq!(tcp_syn_options(&seg[20..28]), (Some(536), None));
        // Truncated or zero-length options stop the walk without panicking.
        assert_eq!(tcp_syn_options(&[2, 4, 5]), (None, None));
        assert_eq!(tcp_syn_options(&[3, 0, 1, 1]), (None, None));
        assert_eq!(
            tcp_syn_options(&[1, 3, 3, 2, 2, 4, 1, 0]),
            (Some(256), Some(2))
        );
    }
}
