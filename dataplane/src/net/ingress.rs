//! Ingress: one received frame through Ethernet, ARP, IPv4, ICMP echo and the TCP flow demux.
//!
//! Every header is checked before use (`wire::parse_*`); a bad frame is dropped and counted, it
//! never panics. A TCP segment goes to the connection its 4-tuple names; a SYN to a listened port
//! with no connection arms a fresh socket in a free slot (the accept path); anything else with no
//! connection gets a RST.

use std::net::Ipv4Addr;

use pgline_nic::{Packet, Queue};
use smoltcp::socket::tcp::State;
use smoltcp::time::Instant as SInstant;

use super::conn::{FlowKey, Origin, TxOut};
use super::wire::{
    self, Drop, Ipv4, ETH_HDR, IPV4_HDR, PROTO_ICMP, PROTO_TCP, TCP_ACK, TCP_RST, TCP_SYN,
};
use super::{NetEvent, Stack, CONN_TIMEOUT, HANDSHAKE_TIMEOUT};

impl<Q: Queue> Stack<Q> {
    /// Processes one received frame.
    pub(super) fn process_frame(&mut self, t: u64, frame: &[u8]) {
        if let Err(d) = self.process_eth(t, frame) {
            let s = &mut self.stats;
            match d {
                Drop::Malformed => s.rx_dropped_malformed += 1,
                Drop::Checksum => s.rx_dropped_checksum += 1,
                Drop::Fragment => s.rx_dropped_fragment += 1,
                Drop::NotOurs => s.rx_dropped_not_ours += 1,
            }
        }
    }

    fn process_eth(&mut self, t: u64, frame: &[u8]) -> Result<(), Drop> {
        let eth = wire::parse_eth(frame)?;
        if eth.dst != self.mac && eth.dst != wire::BROADCAST {
            return Err(Drop::NotOurs);
        }
        let payload = &frame[ETH_HDR..];
        match eth.ethertype {
            wire::ETHERTYPE_ARP => self.process_arp(payload),
            wire::ETHERTYPE_IPV4 => self.process_ipv4(t, eth.src, payload),
            _ => Err(Drop::NotOurs),
        }
    }

    fn process_arp(&mut self, payload: &[u8]) -> Result<(), Drop> {
        let arp = wire::parse_arp(payload)?;
        let for_us = arp.target_ip == self.cfg.ip;
        // Learn from any ARP message naming us, and refresh entries we already have.
        if (for_us || self.arp.lookup(arp.sender_ip).is_some())
            && self.arp.learn(arp.sender_ip, arp.sender_mac)
        {
            self.wake_arp_waiters(arp.sender_ip, arp.sender_mac);
        }
        if !for_us {
            return Err(Drop::NotOurs);
        }
        match arp.op {
            wire::ARP_REQUEST => {
                let reply = wire::Arp {
                    op: wire::ARP_REPLY,
                    sender_mac: self.mac,
                    sender_ip: self.cfg.ip,
                    target_mac: arp.sender_mac,
                    target_ip: arp.sender_ip,
                };
                if self.emit_arp(arp.sender_mac, &reply) {
                    self.stats.arp_requests_answered += 1;
                }
            }
            wire::ARP_REPLY => self.stats.arp_replies_received += 1,
            _ => return Err(Drop::NotOurs),
        }
        Ok(())
    }

    fn process_ipv4(&mut self, t: u64, src_mac: [u8; 6], p: &[u8]) -> Result<(), Drop> {
        let ip = wire::parse_ipv4(p, self.verify_rx)?;
        if ip.dst != self.cfg.ip.octets() {
            return Err(Drop::NotOurs);
        }
        let packet = &p[..ip.total_len];
        match ip.proto {
            PROTO_TCP => self.process_tcp(t, src_mac, &ip, packet),
            PROTO_ICMP => self.process_icmp(src_mac, &ip, packet),
            _ => Err(Drop::NotOurs),
        }
    }

    /// Answers an echo request; other ICMP messages are ignored.
    fn process_icmp(&mut self, src_mac: [u8; 6], ip: &Ipv4, packet: &[u8]) -> Result<(), Drop> {
        let msg = &packet[ip.header_len..];
        if msg.len() < 8 {
            return Err(Drop::Malformed);
        }
        if wire::checksum(msg) != 0 {
            return Err(Drop::Checksum);
        }
        if msg[0] != 8 || msg[1] != 0 {
            return Err(Drop::NotOurs);
        }
        let len = ETH_HDR + IPV4_HDR + msg.len();
        let Some(mut pkt) = self.queue.alloc() else {
            self.stats.tx_dropped_nobuf += 1;
            return Ok(());
        };
        if len > pkt.capacity() {
            return Err(Drop::Malformed);
        }
        pkt.set_len(len);
        let buf = pkt.data_mut();
        wire::compose_eth(buf, src_mac, self.mac, wire::ETHERTYPE_IPV4);
        let reply_ip = Ipv4 {
            header_len: IPV4_HDR,
            total_len: IPV4_HDR + msg.len(),
            proto: PROTO_ICMP,
            src: ip.dst,
            dst: ip.src,
        };
        self.ip_ident = self.ip_ident.wrapping_add(1);
        wire::compose_ipv4(&mut buf[ETH_HDR..], &reply_ip, self.ip_ident, false);
        let icmp = &mut buf[ETH_HDR + IPV4_HDR..len];
        icmp.copy_from_slice(msg);
        icmp[0] = 0;
        icmp[2] = 0;
        icmp[3] = 0;
        let c = wire::checksum(icmp);
        icmp[2..4].copy_from_slice(&c.to_be_bytes());
        self.tx.push(pkt);
        self.stats.icmp_echo_replied += 1;
        Ok(())
    }

    fn process_tcp(
        &mut self,
        t: u64,
        src_mac: [u8; 6],
        ip: &Ipv4,
        packet: &[u8],
    ) -> Result<(), Drop> {
        let seg = &packet[ip.header_len..];
        let tcp = wire::parse_tcp(seg, ip, self.verify_rx)?;
        if tcp.src_port == 0 || tcp.dst_port == 0 {
            return Err(Drop::Malformed);
        }
        let key = FlowKey {
            remote_ip: u32::from_be_bytes(ip.src),
            remote_port: tcp.src_port,
            local_port: tcp.dst_port,
        };
        let now = SInstant::from_micros(t as i64);
        let slot = match self.table.get(&key) {
            Some(&s) => s,
            None => {
                let syn_only = tcp.flags & (TCP_SYN | TCP_ACK | TCP_RST) == TCP_SYN;
                if !(syn_only && self.is_listening(tcp.dst_port)) {
                    if tcp.flags & TCP_RST == 0 {
                        self.stats.tcp_rst_sent += 1;
                        self.emit_rst(src_mac, ip, &tcp, seg.len());
                    }
                    return Ok(());
                }
                match self.accept_slot(now, key, src_mac, ip) {
                    Some(s) => s,
                    None => {
                        self.stats.tcp_conns_refused += 1;
                        self.emit_rst(src_mac, ip, &tcp, seg.len());
                        return Ok(());
                    }
                }
            }
        };
        let c = &mut self.conns[slot as usize];
        let out = TxOut {
            queue: &mut self.queue,
            tx: &mut self.tx,
            scratch: &mut self.scratch,
            stats: &mut self.stats,
            link: self.link,
            pools: &mut self.pools,
        };
        if c.ingress(now, packet, ip, &tcp, out) {
            self.stats.tcp_fast_path += 1;
        }
        self.after_ingress(slot);
        Ok(())
    }

    /// The accept path: a free slot armed to listen on the SYN's port.
    fn accept_slot(
        &mut self,
        now: SInstant,
        key: FlowKey,
        src_mac: [u8; 6],
        ip: &Ipv4,
    ) -> Option<u32> {
        let slot = self.alloc_slot(now)?;
        let iss = self.next_iss(key);
        let our_ip = self.cfg.ip;
        let peer = Ipv4Addr::from(ip.src);
        let c = &mut self.conns[slot as usize];
        c.begin(
            key,
            Origin::Passive {
                listener: key.local_port,
            },
            peer,
            Some(src_mac),
        );
        if !c.listen(&mut self.pools, our_ip, key.local_port, iss, now) {
            c.key = None;
            self.free.push(slot);
            return None;
        }
        c.configure(HANDSHAKE_TIMEOUT);
        self.table.insert(key, slot);
        self.open += 1;
        self.stats.tcp_conns_open = self.open as u64;
        if super::in_prefix(our_ip, peer, self.cfg.prefix_len) {
            self.arp.learn(peer, src_mac);
        }
        Some(slot)
    }

    /// After a segment: report state changes, free what ended, mark the connection for egress.
    fn after_ingress(&mut self, slot: u32) {
        let id = self.id_of(slot);
        let c = &mut self.conns[slot as usize];
        let state = c.state();
        match state {
            State::Closed => {
                let report = c.announced || c.origin == Origin::Active;
                self.release(slot, report);
                return;
            }
            // A passive socket back in LISTEN: the handshake was reset, or the SYN not taken.
            State::Listen => {
                self.release(slot, false);
                return;
            }
            _ => {}
        }
        let established = !matches!(state, State::SynSent | State::SynReceived);
        if !c.announced && established {
            c.announced = true;
            match c.origin {
                Origin::Passive { listener } => {
                    c.configure(CONN_TIMEOUT);
                    self.stats.tcp_conns_accepted += 1;
                    self.events.push(NetEvent::Accepted { id, listener });
                }
                Origin::Active => {
                    self.stats.tcp_conns_connected += 1;
                    self.events.push(NetEvent::Connected(id));
                }
            }
        }
        self.wait_if_rx_starved(slot);
        let c = &mut self.conns[slot as usize];
        if c.announced {
            let eof = !c.may_recv();
            let queued = c.recv_queue();
            let room = c.may_send() && c.send_room(&self.pools) > 0;
            if queued > 0 || (eof && !c.eof_reported) {
                c.eof_reported |= eof;
                self.events.push(NetEvent::Readable(id));
            }
            if c.want_write && room {
                c.want_write = false;
                self.events.push(NetEvent::Writable(id));
            }
        }
        self.mark_dirty(slot);
        // An ACK may have emptied a send ring, or a RST freed both.
        self.serve_waiters();
    }

    /// A RST for a segment of no connection (RFC 793: ACK'd segments get seq = their ack).
    fn emit_rst(&mut self, dst_mac: [u8; 6], ip: &Ipv4, tcp: &wire::Tcp, seg_len: usize) {
        let (seq, ack, flags) = if tcp.flags & TCP_ACK != 0 {
            (tcp.ack, 0, TCP_RST)
        } else {
            let used = wire::tcp_seq_len(tcp, seg_len);
            (0, tcp.seq.wrapping_add(used), TCP_RST | TCP_ACK)
        };
        let Some(mut pkt) = self.queue.alloc() else {
            self.stats.tx_dropped_nobuf += 1;
            return;
        };
        let len = ETH_HDR + IPV4_HDR + wire::TCP_HDR;
        if len > pkt.capacity() {
            return;
        }
        pkt.set_len(len);
        let offload = self.link.tx_offload;
        let buf = pkt.data_mut();
        wire::compose_eth(buf, dst_mac, self.mac, wire::ETHERTYPE_IPV4);
        let rip = Ipv4 {
            header_len: IPV4_HDR,
            total_len: IPV4_HDR + wire::TCP_HDR,
            proto: PROTO_TCP,
            src: ip.dst,
            dst: ip.src,
        };
        self.ip_ident = self.ip_ident.wrapping_add(1);
        wire::compose_ipv4(&mut buf[ETH_HDR..], &rip, self.ip_ident, offload);
        wire::compose_tcp_rst(
            &mut buf[ETH_HDR + IPV4_HDR..],
            &rip,
            tcp.dst_port,
            tcp.src_port,
            seq,
            ack,
            flags,
            offload,
        );
        if offload {
            pkt.request_tx_checksum(ETH_HDR as u16, IPV4_HDR as u16);
        }
        self.tx.push(pkt);
    }

    /// Writes an ARP frame (padded to the Ethernet minimum) to the TX burst.
    pub(super) fn emit_arp(&mut self, eth_dst: [u8; 6], arp: &wire::Arp) -> bool {
        let Some(mut pkt) = self.queue.alloc() else {
            self.stats.tx_dropped_nobuf += 1;
            return false;
        };
        if pkt.capacity() < 60 {
            return false;
        }
        pkt.set_len(60);
        let buf = pkt.data_mut();
        buf.fill(0);
        wire::compose_arp(buf, eth_dst, arp);
        self.tx.push(pkt);
        true
    }
}
